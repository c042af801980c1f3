//! Text the `idem` binary did not write (a provider's error, verify's
//! answer, a run id and scope an MCP client chose, the arguments, an
//! operator's note, the admin API's error messages) reaches a terminal
//! escaped: no control character, no line it did not print itself.
//! (`render.rs` checks every rendering on its own; this checks that the
//! binary prints through them, on stdout and stderr, end to end.)

mod support;

use idem::{tool, Classify, Ctx, Failure, ToolError, Verdict};
use support::{idem, open_with_admin};

/// ESC [ 31m, a carriage return, newlines that start a forged line, BEL,
/// RIGHT-TO-LEFT OVERRIDE, the C1 CSI (U+009B) and NEL (U+0085).
const HOSTILE: &str =
    "ok\u{1b}[31m red\r\n  verify said  landed: forged\n\u{7}\u{202e}evil\u{9b}2J\u{85}end";
const FORGED: &str = "verify said  landed: forged";

/// An error whose text is whatever the provider said.
#[derive(Debug)]
struct ProviderSaid(String);

impl std::fmt::Display for ProviderSaid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Classify for ProviderSaid {
    fn classify(&self) -> Failure {
        Failure::ambiguous()
    }
}

/// Posts a note; the provider's answer is lost and its search fails, both
/// with hostile text, so the call is escalated with it as evidence.
#[tool(
    class = "journal",
    key = "order_id",
    verify = note_landed,
    timeout = "30s",
    retry(initial = "1ms")
)]
async fn post_note(_ctx: &Ctx, order_id: u64, text: String) -> Result<String, ProviderSaid> {
    let _ = (order_id, text);
    Err(ProviderSaid(format!("answer lost: {HOSTILE}")))
}

async fn note_landed(_ctx: &Ctx) -> Result<Verdict<String>, ProviderSaid> {
    Err(ProviderSaid(format!("search failed: {HOSTILE}")))
}

/// What a terminal would act on: any control character but the line ends
/// `idem` writes, and the bidi and line-separator characters.
fn raw_controls(text: &str) -> Vec<char> {
    text.chars()
        .filter(|&c| {
            (c.is_control() && c != '\n')
                || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{2028}' | '\u{2029}')
        })
        .collect()
}

fn assert_safe(what: &str, text: &str) {
    let raw = raw_controls(text);
    assert!(
        raw.is_empty(),
        "{what}: raw {raw:?} in:\n{}",
        text.escape_debug()
    );
    for line in text.lines() {
        assert!(
            !line.trim_start().starts_with(FORGED),
            "{what}: forged line {line:?} in:\n{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_text_reaches_the_terminal_escaped() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("journal");
    let rt = open_with_admin(&dir);
    let ctx = rt.run(HOSTILE).scope(HOSTILE);
    let key = match post_note(&ctx, 7, HOSTILE.into()).await {
        Err(ToolError::Escalated { key, .. }) => key.to_string(),
        other => panic!("expected an escalation, got {other:?}"),
    };

    // The evidence is there, escaped.
    let table = idem(&dir, &["escalations"]).await;
    let out = table.ok();
    assert_safe("escalations", out);
    assert!(
        out.contains("verify said  error: search failed: ok\\u{1b}[31m red\\r\\n  verify said"),
        "{out}"
    );

    // The operator's note is outside text too, once written.
    let resolved = idem(&dir, &["resolve", &key, "--reissue", "--note", HOSTILE]).await;
    assert_safe("resolve", resolved.ok());

    for args in [
        &["show", key.as_str()][..],
        &["audit"],
        &["stats"],
        &["tools"],
    ] {
        let run = idem(&dir, args).await;
        assert_safe(&format!("{args:?}"), run.ok());
    }
    let shown = idem(&dir, &["show", &key]).await;
    assert!(
        shown.ok().contains("resolution   reissue at"),
        "{}",
        shown.stdout
    );
    assert!(shown.ok().contains("\\u{202e}evil"), "{}", shown.stdout);

    drop(rt);
}

/// An admin API that refuses everything with `message` (a compromised or
/// confused server, or one quoting a provider), after proving that it holds
/// the token `t` (so the CLI goes on to send its requests).
async fn refusing_admin_api(message: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let body = serde_json::json!({ "error": "unknown_key", "message": message }).to_string();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let body = body.clone();
            tokio::spawn(async move {
                // The request's head (no route here takes a body that
                // matters); then the refusal.
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head).to_string();
                let path = head.split_whitespace().nth(1).unwrap_or("");
                let (status, body) = match path
                    .strip_prefix("/healthz?challenge=")
                    .and_then(|rest| rest.strip_suffix("&bind=any"))
                {
                    Some(challenge) => {
                        let proof = idem::admin::proof::prove(
                            "t",
                            challenge,
                            idem::admin::proof::Binding::Any,
                        );
                        (
                            "200 OK",
                            serde_json::json!({"status": "ok", "proof": proof}).to_string(),
                        )
                    }
                    None => ("404 Not Found", body),
                };
                let answer = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_quoting_the_server_reaches_stderr_escaped() {
    let url = refusing_admin_api(HOSTILE).await;
    let env = [("IDEM_ADMIN_TOKEN", "t")];
    for args in [
        &["--url", url.as_str(), "show", "k"][..],
        &[
            "--url",
            url.as_str(),
            "resolve",
            "k",
            "--reissue",
            "--note",
            "n",
        ],
        &["--url", url.as_str(), "escalations"],
    ] {
        let refused = support::idem_bare(args, &env).await;
        assert_eq!(refused.code, 1, "{refused:?}");
        assert!(refused.stderr.starts_with("idem: error: "), "{refused:?}");
        assert!(
            refused
                .stderr
                .contains("\\u{1b}[31m red\\r\\n  verify said"),
            "{refused:?}"
        );
        assert_safe(&format!("stderr of {args:?}"), &refused.stderr);
        assert_eq!(refused.stderr.lines().count(), 1, "{refused:?}");
    }
}
