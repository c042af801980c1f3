//! The admin API over plain HTTP: authentication on every route, the
//! errors of refused requests (and that they write nothing), the followed
//! stream, and the server's life with the runtime's.

mod support;

use std::time::Duration;

use idem::admin::AdminOptions;
use idem::{Error, Runtime};
use serde_json::{json, Value};
use support::{open_with_token, Worker, TOKEN};

struct Api {
    http: reqwest::Client,
    url: String,
}

impl Api {
    fn of(rt: &Runtime) -> Api {
        Api {
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
            url: rt.admin_url().expect("serving"),
        }
    }

    async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method.parse().unwrap(), format!("{}{path}", self.url));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.body(b.to_string());
        }
        let answer = req.send().await.unwrap();
        let status = answer.status().as_u16();
        let text = answer.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }
}

async fn worker_with_token(dir: &std::path::Path) -> Worker {
    // The support worker generates a token file; these tests use a given
    // token instead, so start it on a fresh runtime of the same journal.
    let w = Worker::start(dir).await;
    let Worker {
        rt,
        providers,
        bank,
        dir,
        key,
    } = w;
    drop(rt);
    Worker {
        rt: open_with_token(&dir, TOKEN),
        providers,
        bank,
        dir,
        key,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_addressed_to_another_host_is_refused_dns_rebinding() {
    let tmp = tempfile::tempdir().unwrap();
    let worker = worker_with_token(&tmp.path().join("j")).await;
    let api = Api::of(&worker.rt);
    let port = api.url.rsplit(':').next().unwrap().to_string();
    for (host, expected) in [
        ("evil.example".to_string(), 421),
        (format!("evil.example:{port}"), 421),
        (format!("127.0.0.1:{port}"), 200),
        (format!("localhost:{port}"), 200),
    ] {
        for path in ["/v1/escalations", "/healthz", "/"] {
            let answer = api
                .http
                .get(format!("{}{path}", api.url))
                .bearer_auth(TOKEN)
                .header("host", &host)
                .send()
                .await
                .unwrap();
            assert_eq!(answer.status().as_u16(), expected, "{host} {path}");
            if expected == 421 {
                let body: Value = serde_json::from_str(&answer.text().await.unwrap()).unwrap();
                assert_eq!(body["error"], "bad_host", "{host} {path}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_but_healthz_and_the_page_needs_the_token() {
    let tmp = tempfile::tempdir().unwrap();
    let worker = worker_with_token(&tmp.path().join("j")).await;
    let api = Api::of(&worker.rt);
    let key = worker.key.to_string();
    let before = worker.events().await;
    let routes = [
        ("GET", "/v1/tools".to_string()),
        ("GET", "/v1/escalations".to_string()),
        ("GET", "/v1/sagas".to_string()),
        ("GET", format!("/v1/ops/{key}")),
        ("POST", format!("/v1/ops/{key}/resolve")),
        ("GET", "/v1/audit?from=0".to_string()),
        ("GET", "/v1/stats".to_string()),
        ("POST", "/v1/prune".to_string()),
    ];
    let body = r#"{"resolution":"reissue","note":"x"}"#;
    for (method, path) in &routes {
        for token in [None, Some("wrong"), Some("test-token-0123456789abcdeF")] {
            let (status, answer) = api.call(method, path, token, Some(body)).await;
            assert_eq!(status, 401, "{method} {path} with {token:?}: {answer}");
            assert_eq!(answer["error"], "unauthorized");
        }
        let (status, _) = api.call(method, path, Some(TOKEN), None).await;
        assert_ne!(status, 401, "{method} {path} refused the right token");
    }
    assert_eq!(
        worker.events().await,
        before,
        "a refused request wrote something"
    );
    assert_eq!(worker.rt.escalations().await.unwrap().len(), 1);

    let (status, health) = api.call("GET", "/healthz", None, None).await;
    assert_eq!((status, &health["status"]), (200, &json!("ok")));
    let page = api.http.get(format!("{}/", api.url)).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let csp = page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(csp.contains("script-src 'self'"), "{csp}");
    assert!(page.text().await.unwrap().contains("inbox.js"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_resolutions_say_why_and_write_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let worker = worker_with_token(&tmp.path().join("j")).await;
    let api = Api::of(&worker.rt);
    let key = worker.key.to_string();
    let resolve = format!("/v1/ops/{key}/resolve");
    let before = worker.events().await;
    let cases: [(&str, u16, &str, &str); 9] = [
        ("{not json", 400, "bad_request", "not a resolution"),
        (
            r#"{"resolution":"maybe","note":"x"}"#,
            400,
            "bad_request",
            "unknown \"resolution\"",
        ),
        (
            r#"{"resolution":"landed","note":"x"}"#,
            400,
            "bad_request",
            "needs \"result\"",
        ),
        (
            r#"{"resolution":"reissue","result":1,"note":"x"}"#,
            400,
            "bad_request",
            "only for \"landed\"",
        ),
        (
            r#"{"resolution":"abandon","note":"   "}"#,
            400,
            "bad_request",
            "\"note\" is required",
        ),
        (
            r#"{"resolution":"abandon"}"#,
            400,
            "bad_request",
            "missing field `note`",
        ),
        (
            r#"{"resolution":"abandon","note":"x","extra":1}"#,
            400,
            "bad_request",
            "unknown field",
        ),
        (
            r#"{"resolution":"landed","result":{"id":5},"note":"x"}"#,
            422,
            "result_type",
            "does not fit the result type",
        ),
        (
            r#"{"resolution":"landed","result":null,"note":"x"}"#,
            422,
            "result_type",
            "nothing was written",
        ),
    ];
    for (body, status, code, says) in cases {
        let (got, answer) = api.call("POST", &resolve, Some(TOKEN), Some(body)).await;
        assert_eq!(
            (got, answer["error"].as_str().unwrap()),
            (status, code),
            "{body}: {answer}"
        );
        assert!(
            answer["message"].as_str().unwrap().contains(says),
            "{body}: {answer}"
        );
    }
    let unknown = format!("/v1/ops/send_wire-{}-g0", "0".repeat(64));
    let (status, answer) = api.call("GET", &unknown, Some(TOKEN), None).await;
    assert_eq!(
        (status, answer["error"].as_str().unwrap()),
        (404, "unknown_key")
    );
    let (status, answer) = api
        .call(
            "POST",
            &format!("{unknown}/resolve"),
            Some(TOKEN),
            Some(r#"{"resolution":"abandon","note":"x"}"#),
        )
        .await;
    assert_eq!(
        (status, answer["error"].as_str().unwrap()),
        (404, "unknown_key")
    );
    let (status, answer) = api
        .call("GET", "/v1/ops/not-a-key", Some(TOKEN), None)
        .await;
    assert_eq!(
        (status, answer["error"].as_str().unwrap()),
        (400, "bad_key")
    );
    let (status, answer) = api.call("GET", &resolve, Some(TOKEN), None).await;
    assert_eq!(
        (status, answer["error"].as_str().unwrap()),
        (405, "method_not_allowed")
    );
    let (status, answer) = api.call("GET", "/v1/nothing", Some(TOKEN), None).await;
    assert_eq!(
        (status, answer["error"].as_str().unwrap()),
        (404, "not_found")
    );
    let (status, answer) = api.call("GET", "/v1/audit?form=3", Some(TOKEN), None).await;
    assert_eq!(
        (status, answer["error"].as_str().unwrap()),
        (400, "bad_request")
    );
    assert_eq!(
        worker.events().await,
        before,
        "a refused request wrote something"
    );
    assert_eq!(worker.operator_events().await, 0);
    assert_eq!(worker.rt.escalations().await.unwrap().len(), 1);

    // Then the right answer, and an operator's amendment of it.
    let receipt = serde_json::to_value(worker.real_receipt()).unwrap();
    let body = json!({"resolution": "landed", "result": receipt, "note": "statement"}).to_string();
    let (status, answer) = api.call("POST", &resolve, Some(TOKEN), Some(&body)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["operation"]["state"], "committed");
    let (status, answer) = api
        .call(
            "POST",
            &resolve,
            Some(TOKEN),
            Some(r#"{"resolution":"abandon","note":"it bounced"}"#),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["operation"]["resolution"]["amendments"], 1);
    let (_, view) = api
        .call("GET", &format!("/v1/ops/{key}"), Some(TOKEN), None)
        .await;
    assert!(
        view["history"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"]["amended"]["previous"] == "landed"),
        "{view}"
    );
    assert!(matches!(
        worker.call_again().await,
        Err(idem::ToolError::Abandoned { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn following_from_the_end_streams_only_what_comes_next() {
    let tmp = tempfile::tempdir().unwrap();
    let worker = worker_with_token(&tmp.path().join("j")).await;
    let api = Api::of(&worker.rt);
    let mut stream = api
        .http
        .get(format!("{}/v1/audit?from=end&follow=true", api.url))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    // The answer's headers arrive once the follower is subscribed and has
    // fixed its start: everything from here on is streamed.
    let from: u64 = stream.headers()["idem-audit-from"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let last = worker.rt.audit(0).await.unwrap().last().unwrap().seq;
    assert_eq!(from, last + 1);
    let receipt = serde_json::to_value(worker.real_receipt()).unwrap();
    worker
        .rt
        .resolve(
            &worker.key,
            idem::Resolution::Landed(Some(receipt)),
            "from the API test",
        )
        .await
        .unwrap();
    let mut text = String::new();
    while text.lines().count() < 2 {
        let chunk = tokio::time::timeout(Duration::from_secs(30), stream.chunk())
            .await
            .expect("streamed in time")
            .unwrap()
            .expect("still streaming");
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    let events: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events[0]["seq"].as_u64().unwrap(), from);
    assert_eq!(events[0]["kind"]["resolved"]["note"], "from the API test");
    assert_eq!(events[1]["kind"]["committed"]["via"], "operator");

    // The runtime goes: the stream ends, the server stops, the address
    // file goes, and the journal opens again.
    let url = api.url.clone();
    let dir = worker.dir.clone();
    drop(worker);
    let end = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match stream.chunk().await {
                Ok(Some(_)) => continue,
                other => return other.map(|_| ()),
            }
        }
    })
    .await
    .expect("the stream ended when the runtime was dropped");
    let _ = end;
    assert!(!idem::admin::address_path(&dir).exists());
    let gone = reqwest::Client::new()
        .get(format!("{url}/v1/stats"))
        .bearer_auth(TOKEN)
        .send()
        .await;
    assert!(
        gone.as_ref().map_or(true, |a| a.status() != 200),
        "the server still answered: {gone:?}"
    );
    drop(Runtime::open(&dir).expect("the server kept the journal open"));
}

#[test]
fn open_outside_tokio_and_remote_addresses_are_refused_before_the_journal_is_touched() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("j");
    let err = Runtime::builder()
        .path(&dir)
        .admin("127.0.0.1:0")
        .open()
        .unwrap_err();
    assert!(matches!(err, Error::Usage(_)), "{err}");
    assert!(err.to_string().contains("outside one"), "{err}");
    assert!(!dir.exists(), "the journal was created anyway");

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _inside = rt.enter();
    let err = Runtime::builder()
        .path(&dir)
        .admin_with(AdminOptions::new("0.0.0.0:0"))
        .open()
        .unwrap_err();
    assert!(err.to_string().contains("not a loopback address"), "{err}");
    // (A journal given as is has no directory: its worker's own directory
    // holds the files; see tests/workers.rs.)
    // Allowed when asked for, with the address file naming loopback.
    let served = Runtime::builder()
        .path(tmp.path().join("k"))
        .admin_with(
            AdminOptions::new("0.0.0.0:0")
                .allow_remote(true)
                .token(TOKEN),
        )
        .open()
        .unwrap();
    assert!(served.admin_url().unwrap().starts_with("http://127.0.0.1:"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_replaces_the_address_and_keeps_the_generated_token() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("j");
    let first = support::open_with_admin(&dir);
    let token = std::fs::read_to_string(idem::admin::token_path(&dir)).unwrap();
    let a = idem::admin::AddressFile::read(&dir).unwrap().unwrap();
    assert_eq!(a.url, first.admin_url().unwrap());
    drop(first);
    assert!(idem::admin::AddressFile::read(&dir).unwrap().is_none());
    let second = support::open_with_admin(&dir);
    let b = idem::admin::AddressFile::read(&dir).unwrap().unwrap();
    assert_ne!(a.instance, b.instance);
    assert_eq!(
        std::fs::read_to_string(idem::admin::token_path(&dir)).unwrap(),
        token
    );
    let api = Api::of(&second);
    let (status, _) = api.call("GET", "/v1/stats", Some(token.trim()), None).await;
    assert_eq!(status, 200);
}

/// Sends one request with the token on `stream` (kept alive) and reads the
/// answer's status line and head.
async fn request_on(stream: &mut tokio::net::TcpStream, host: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let request =
        format!("GET /v1/stats HTTP/1.1\r\nhost: {host}\r\nauthorization: Bearer {TOKEN}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 8192];
    // The head, then as much of the body as content-length says.
    loop {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(
            n > 0,
            "the connection was closed: {:?}",
            String::from_utf8_lossy(&answer)
        );
        answer.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&answer).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let length: usize = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(|v| v.trim().parse().unwrap())
                })
                .unwrap_or(0);
            if answer.len() >= end + 4 + length {
                return text[..end].to_string();
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_never_keep_an_operator_waiting() {
    use tokio::io::AsyncReadExt as _;
    let tmp = tempfile::tempdir().unwrap();
    let rt = open_with_token(&tmp.path().join("j"), TOKEN);
    let addr = rt.admin_addr().unwrap();
    let host = addr.to_string();
    // An operator's connection that has sent the token, kept alive.
    let mut operator = tokio::net::TcpStream::connect(addr).await.unwrap();
    assert!(request_on(&mut operator, &host)
        .await
        .starts_with("HTTP/1.1 200"));

    // 300 connections that send nothing (more than the 256 served slots
    // and the 128 places for connections without the token).
    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    // A new operator connection is read and answered at once, not after the
    // 5 s the idle ones may take to send a head (the guard below is shorter).
    let api = Api::of(&rt);
    let answer = tokio::time::timeout(
        Duration::from_secs(3),
        api.call("GET", "/v1/stats", Some(TOKEN), None),
    )
    .await
    .expect("an operator waited behind idle connections");
    assert_eq!(answer.0, 200, "{answer:?}");
    // The oldest idle connections were closed to make room: EOF at once.
    let mut byte = [0u8; 1];
    let first = tokio::time::timeout(Duration::from_secs(3), idle[0].read(&mut byte))
        .await
        .expect("the oldest idle connection is still open");
    assert_eq!(first.unwrap(), 0);
    // The connection that sent the token is never closed for room.
    assert!(request_on(&mut operator, &host)
        .await
        .starts_with("HTTP/1.1 200"));
    drop(idle);
    drop(rt);
}
