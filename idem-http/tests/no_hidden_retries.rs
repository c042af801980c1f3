//! Each attempt the engine makes is exactly one request: reqwest's own
//! retries stay off underneath.
//!
//! reqwest 0.13 retries, by default, an HTTP/2 stream the server refused
//! (REFUSED_STREAM) or a graceful GOAWAY. A server here refuses every
//! stream: the client from `idem::http::client_builder` sends once, while
//! reqwest's default client, against the same server, sends three times.
//! (Over HTTP/1.1 reqwest has no retry policy to turn off; `wire.rs` checks
//! there that a failing request is sent once.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use idem::http::{self, HttpError};
use idem::{Classify, Failure};

/// An HTTP/2 (prior knowledge) server on 127.0.0.1 that resets every
/// stream with REFUSED_STREAM and counts them.
async fn refusing_server() -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1/charges", listener.local_addr().unwrap());
    let streams = Arc::new(AtomicUsize::new(0));
    let count = streams.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let count = count.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(socket).await else {
                    return;
                };
                while let Some(Ok((_request, mut respond))) = conn.accept().await {
                    // Counted before the reset goes out: once the client has
                    // its error, every stream it opened is counted.
                    count.fetch_add(1, Ordering::SeqCst);
                    respond.send_reset(h2::Reason::REFUSED_STREAM);
                }
            });
        }
    });
    (url, streams)
}

async fn post(client: &reqwest::Client, url: &str) -> Result<reqwest::Response, HttpError> {
    let dir = tempfile::tempdir().unwrap();
    let ctx = idem::Runtime::open(dir.path()).unwrap().run("h2");
    http::send(&ctx, client.post(url).body("amount=1999")).await
}

#[tokio::test]
async fn client_builder_sends_a_refused_stream_once() {
    let (url, streams) = refusing_server().await;
    let client = http::client_builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let err = post(&client, &url).await.unwrap_err();
    assert_eq!(streams.load(Ordering::SeqCst), 1, "{err}");
    // Not proven unprocessed by anything idem reads: the cautious answer.
    assert_eq!(err.classify(), Failure::ambiguous(), "{err}");
}

#[tokio::test]
async fn reqwests_default_client_would_have_sent_it_three_times() {
    let (url, streams) = refusing_server().await;
    let client = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    post(&client, &url).await.unwrap_err();
    assert_eq!(streams.load(Ordering::SeqCst), 3);
}
