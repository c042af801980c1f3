//! The token goes only to a server that proved it holds it.
//!
//! A worker killed with SIGKILL leaves its address file behind and any
//! local user may bind the port it freed. Here the impostor is as strong as
//! it gets: the address file names its port while the real worker (which
//! holds the journal) listens on another, and it relays every `/healthz`
//! request to the real worker, so whatever proof the real worker gives, the
//! impostor hands on. Every other request it answers with `[]` ("no
//! escalations"), recording the headers it was sent.

mod support;

use std::sync::{Arc, Mutex};

use serde_json::json;
use support::{idem, idem_bare, idem_env, Worker};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// A server on loopback that relays `/healthz` to `real` and answers
/// everything else itself; it keeps every request head it was sent.
struct Impostor {
    addr: std::net::SocketAddr,
    heads: Arc<Mutex<Vec<String>>>,
}

impl Impostor {
    async fn start(real: String) -> Impostor {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let seen = heads.clone();
        tokio::spawn(async move {
            let http = reqwest::Client::builder().no_proxy().build().unwrap();
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if stream.read(&mut byte).await.unwrap_or(0) == 0 {
                        break;
                    }
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).to_string();
                seen.lock().unwrap().push(head.clone());
                let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
                let body = if path.starts_with("/healthz") {
                    match http.get(format!("{real}{path}")).send().await {
                        Ok(answer) => answer.text().await.unwrap_or_default(),
                        Err(_) => String::new(),
                    }
                } else {
                    "[]".to_string()
                };
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            }
        });
        Impostor { addr, heads }
    }

    fn saw_a_token(&self) -> bool {
        self.heads
            .lock()
            .unwrap()
            .iter()
            .any(|h| h.to_ascii_lowercase().contains("authorization"))
    }

    fn requests(&self) -> usize {
        self.heads.lock().unwrap().len()
    }
}

fn write_address(dir: &std::path::Path, file: &idem::admin::AddressFile) {
    std::fs::write(
        idem::admin::address_path(dir),
        serde_json::to_vec(file).unwrap(),
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_goes_only_to_a_server_that_proved_it_holds_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("journal");
    let worker = Worker::start(&dir).await;
    let real = idem::admin::AddressFile::read(&dir).unwrap().unwrap();

    // /healthz tells an impostor nothing it could pose with.
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let health = http
        .get(format!("{}/healthz", real.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let health: serde_json::Value = serde_json::from_str(&health).unwrap();
    assert_eq!(health, json!({"status": "ok"}));

    // The CLI reaches the real worker through its file: it proves itself.
    let listed = idem(&dir, &["--json", "escalations"]).await.json();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");

    let impostor = Impostor::start(real.url.clone()).await;
    write_address(
        &dir,
        &idem::admin::AddressFile {
            url: format!("http://{}", impostor.addr),
            addr: impostor.addr,
            ..real.clone()
        },
    );
    let fooled = idem(&dir, &["escalations"]).await;
    assert!(impostor.requests() > 0, "the CLI never asked the impostor");
    assert!(
        !impostor.saw_a_token(),
        "the token went to the impostor: {:?}",
        impostor.heads.lock().unwrap()
    );
    assert_eq!(fooled.code, 4, "{fooled:?}");
    assert!(
        fooled
            .stderr
            .contains("did not prove that it holds this token"),
        "{fooled:?}"
    );
    assert!(!fooled.stdout.contains("no escalations"), "{fooled:?}");

    // --url: the server must prove it holds the given token before it
    // is sent (a wrong one here: refused, and not sent); the right one
    // is sent.
    let token = std::fs::read_to_string(idem::admin::token_path(&dir)).unwrap();
    let wrong = idem_bare(
        &["--url", &real.url, "escalations"],
        &[("IDEM_ADMIN_TOKEN", "not-the-token-0123456789")],
    )
    .await;
    assert_eq!(wrong.code, 4, "{wrong:?}");
    assert!(wrong.stderr.contains("token was not sent"), "{wrong:?}");
    let right = idem_bare(
        &["--url", &real.url, "--json", "escalations"],
        &[("IDEM_ADMIN_TOKEN", token.trim())],
    )
    .await;
    assert_eq!(right.json().as_array().unwrap().len(), 1, "{right:?}");

    // The file's own worker is back in it: a wrong token is refused
    // before it is sent, with the reason.
    write_address(&dir, &real);
    let mistaken = idem_env(
        &dir,
        &["escalations"],
        &[("IDEM_ADMIN_TOKEN", "not-the-token-0123456789")],
    )
    .await;
    assert_eq!(mistaken.code, 4, "{mistaken:?}");
    drop(worker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_file_that_is_not_loopback_or_does_not_match_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("journal");
    let worker = Worker::start(&dir).await;
    let real = idem::admin::AddressFile::read(&dir).unwrap().unwrap();
    let port = real.addr.port();
    for (url, addr, why) in [
        (
            format!("http://192.0.2.7:{port}"),
            format!("192.0.2.7:{port}"),
            "not a loopback address",
        ),
        (
            format!("https://127.0.0.1:{port}"),
            real.addr.to_string(),
            "is not http:// on loopback",
        ),
        (
            format!("http://127.0.0.1:{}", port.wrapping_add(1)),
            real.addr.to_string(),
            "does not match the address",
        ),
    ] {
        write_address(
            &dir,
            &idem::admin::AddressFile {
                url,
                addr: addr.parse().unwrap(),
                ..real.clone()
            },
        );
        let refused = idem(&dir, &["escalations"]).await;
        assert_eq!(refused.code, 3, "{refused:?}");
        assert!(refused.stderr.contains("refusing"), "{refused:?}");
        assert!(refused.stderr.contains(why), "{why}: {refused:?}");
    }
    drop(worker);
}
