//! Each classification row against a real server on 127.0.0.1: what the
//! server did, and what `idem::http::send` made of it.

mod support;

use std::time::{Duration, SystemTime};

use idem::http::{self, HttpError};
use idem::{Classify, Ctx, Failure};
use support::{closed_port, runtime, Answer, Server};

/// Short, but a real socket timeout is the thing under test.
const TIMEOUT: Duration = Duration::from_millis(300);

fn client() -> reqwest::Client {
    http::client_builder().build().unwrap()
}

/// A context outside any tool call: no key, so requests are unkeyed
/// unless the test sets the header itself.
fn ctx() -> (tempfile::TempDir, Ctx) {
    let (dir, rt) = runtime();
    (dir, rt.run("wire"))
}

async fn post(
    ctx: &Ctx,
    client: &reqwest::Client,
    url: &str,
) -> Result<reqwest::Response, HttpError> {
    http::send(ctx, client.post(url).body("amount=1999")).await
}

/// A POST carrying an `Idempotency-Key`, as a provider tool's would.
async fn keyed_post(ctx: &Ctx, url: &str) -> Result<reqwest::Response, HttpError> {
    let request = client()
        .post(url)
        .header("idempotency-key", "charge-test-g0")
        .body("amount=1999");
    http::send(ctx, request).await
}

#[tokio::test]
async fn connect_refused_is_not_sent() {
    let (_dir, ctx) = ctx();
    let url = format!("http://{}/v1/charges", closed_port());
    let err = post(&ctx, &client(), &url).await.unwrap_err();
    assert_eq!(err.classify(), Failure::not_sent(), "{err}");
    assert!(err.to_string().contains("connect error"), "{err}");
    assert_eq!(err.status(), None);
}

/// A listener whose accept queue is full: the kernel drops further SYNs,
/// so a connection attempt hangs until the client's connect timeout.
async fn unanswered_listener() -> (tokio::net::TcpListener, Vec<std::net::TcpStream>) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(0).unwrap();
    let addr = listener.local_addr().unwrap();
    // A backlog of 0 still queues one connection; fill it (never accepted).
    let fillers = vec![std::net::TcpStream::connect(addr).unwrap()];
    (listener, fillers)
}

#[tokio::test]
async fn connect_timeout_is_not_sent() {
    let (_dir, ctx) = ctx();
    let (listener, _fillers) = unanswered_listener().await;
    let url = format!("http://{}/v1/charges", listener.local_addr().unwrap());
    let client = http::client_builder()
        .connect_timeout(TIMEOUT)
        .build()
        .unwrap();
    let err = post(&ctx, &client, &url).await.unwrap_err();
    let source = err.reqwest_error().unwrap();
    assert!(source.is_timeout() && source.is_connect(), "{err:?}");
    // A timeout, but while connecting: checked before the timeout rule.
    assert_eq!(err.classify(), Failure::not_sent(), "{err}");
    assert!(err.to_string().contains("connect timeout"), "{err}");
}

#[tokio::test]
async fn request_timeout_while_connecting_is_ambiguous() {
    // Without a connect timeout, reqwest's request timeout cannot say
    // whether it fired before or after the request left: fail closed.
    let (_dir, ctx) = ctx();
    let (listener, _fillers) = unanswered_listener().await;
    let url = format!("http://{}/v1/charges", listener.local_addr().unwrap());
    let client = http::client_builder().timeout(TIMEOUT).build().unwrap();
    let err = post(&ctx, &client, &url).await.unwrap_err();
    assert!(err.reqwest_error().unwrap().is_timeout(), "{err:?}");
    assert_eq!(err.classify(), Failure::ambiguous(), "{err}");
}

#[tokio::test]
async fn timeout_before_the_server_read_the_body_is_ambiguous() {
    let (_dir, ctx) = ctx();
    let mut server = Server::always(Answer::StallAfterHead).await;
    let client = http::client_builder().timeout(TIMEOUT).build().unwrap();
    // More than the socket buffers hold: the client is still writing the
    // body when its timeout fires.
    let body = vec![b'x'; 16 << 20];
    let err = http::send(&ctx, client.post(server.url("/v1/charges")).body(body))
        .await
        .unwrap_err();
    let seen = server.next().await;
    assert!(seen.body.is_none(), "the server read the head only");
    assert!(err.reqwest_error().unwrap().is_timeout(), "{err:?}");
    // The head reached the provider: it may act on what it has.
    assert_eq!(err.classify(), Failure::ambiguous(), "{err}");
    assert!(err.to_string().contains("timeout"), "{err}");
}

#[tokio::test]
async fn timeout_after_the_server_read_the_body_is_ambiguous() {
    let (_dir, ctx) = ctx();
    let mut server = Server::always(Answer::StallAfterBody).await;
    let client = http::client_builder().timeout(TIMEOUT).build().unwrap();
    let err = post(&ctx, &client, &server.url("/v1/charges"))
        .await
        .unwrap_err();
    assert_eq!(
        server.next().await.body.as_deref(),
        Some(&b"amount=1999"[..])
    );
    assert!(err.reqwest_error().unwrap().is_timeout(), "{err:?}");
    assert_eq!(err.classify(), Failure::ambiguous(), "{err}");
}

#[tokio::test]
async fn close_after_the_request_was_written_is_ambiguous() {
    let (_dir, ctx) = ctx();
    for answer in [Answer::CloseAfterBody, Answer::ResetAfterBody] {
        let mut server = Server::always(answer.clone()).await;
        let err = post(&ctx, &client(), &server.url("/v1/charges"))
            .await
            .unwrap_err();
        assert!(server.next().await.body.is_some());
        assert_eq!(err.classify(), Failure::ambiguous(), "{answer:?}: {err}");
        assert!(
            err.to_string().contains("request error"),
            "{answer:?}: {err}"
        );
    }
}

#[tokio::test]
async fn a_body_cut_short_is_ambiguous() {
    let (_dir, ctx) = ctx();
    let server = Server::always(Answer::TruncatedBody).await;
    let response = post(&ctx, &client(), &server.url("/v1/charges"))
        .await
        .unwrap();
    // The 200 arrived: the charge landed, its result did not.
    let err: HttpError = response.text().await.unwrap_err().into();
    assert_eq!(err.classify(), Failure::ambiguous(), "{err}");
    assert!(
        err.to_string().contains("body error") || err.to_string().contains("decode"),
        "{err}"
    );
}

#[tokio::test]
async fn an_error_body_that_stalls_keeps_the_status_and_what_arrived() {
    let (_dir, ctx) = ctx();
    let start = "{\"error\":\"overloaded\"";
    let server = Server::always(Answer::StallInBody {
        status: 503,
        start: start.into(),
    })
    .await;
    let client = http::client_builder().timeout(TIMEOUT).build().unwrap();
    let err = post(&ctx, &client, &server.url("/v1/charges"))
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(reqwest::StatusCode::SERVICE_UNAVAILABLE));
    assert_eq!(err.body_excerpt(), Some(format!("{start}…").as_str()));
    assert_eq!(err.classify(), Failure::ambiguous(), "{err}");
}

/// The server's `Date` and a `Retry-After` 17 s after it, in both forms.
fn retry_after_forms() -> [Vec<(String, String)>; 2] {
    let date = SystemTime::now();
    let later = date + Duration::from_secs(17);
    [
        vec![("retry-after".into(), "17".into())],
        vec![
            ("date".into(), httpdate::fmt_http_date(date)),
            ("retry-after".into(), httpdate::fmt_http_date(later)),
        ],
    ]
}

async fn answered(status: u16, headers: Vec<(String, String)>, keyed: bool) -> HttpError {
    let (_dir, ctx) = ctx();
    let mut server = Server::always(Answer::Respond {
        status,
        headers,
        body: "{\"error\":\"nope\"}".into(),
    })
    .await;
    let url = server.url("/v1/charges");
    let err = if keyed {
        keyed_post(&ctx, &url).await
    } else {
        post(&ctx, &client(), &url).await
    }
    .unwrap_err();
    assert_eq!(
        server.next().await.header("idempotency-key").is_some(),
        keyed
    );
    assert_eq!(err.status().map(|s| s.as_u16()), Some(status));
    err
}

const FLOOR: Option<Duration> = Some(Duration::from_secs(17));

#[tokio::test]
async fn not_processed_statuses_are_not_sent_with_the_retry_after_floor() {
    for status in [408, 425, 429] {
        for headers in retry_after_forms() {
            let err = answered(status, headers.clone(), true).await;
            assert_eq!(
                err.classify(),
                Failure::NotSent { retry_after: FLOOR },
                "{status} {headers:?}"
            );
        }
        let err = answered(status, vec![], false).await;
        assert_eq!(err.classify(), Failure::not_sent(), "{status}");
    }
}

#[tokio::test]
async fn a_retry_after_in_the_past_or_malformed_is_no_floor() {
    let past = httpdate::fmt_http_date(SystemTime::now() - Duration::from_secs(60));
    for value in [past.as_str(), "in a minute", "-5"] {
        let err = answered(429, vec![("retry-after".into(), value.into())], true).await;
        assert_eq!(err.classify(), Failure::not_sent(), "{value}");
    }
}

#[tokio::test]
async fn conflict_on_a_keyed_request_is_ambiguous_and_semantic_without_a_key() {
    for headers in retry_after_forms() {
        let err = answered(409, headers, true).await;
        assert_eq!(
            err.classify(),
            Failure::Ambiguous { retry_after: FLOOR },
            "{err}"
        );
    }
    assert_eq!(
        answered(409, vec![], false).await.classify(),
        Failure::Semantic
    );
}

#[tokio::test]
async fn server_errors_are_ambiguous_with_the_retry_after_floor() {
    for status in [500, 502, 503] {
        assert_eq!(
            answered(status, vec![], true).await.classify(),
            Failure::ambiguous()
        );
        for headers in retry_after_forms() {
            let err = answered(status, headers, false).await;
            assert_eq!(
                err.classify(),
                Failure::Ambiguous { retry_after: FLOOR },
                "{err}"
            );
        }
    }
}

#[tokio::test]
async fn other_client_errors_are_semantic() {
    for status in [400, 402, 404, 422] {
        let err = answered(status, retry_after_forms()[0].clone(), true).await;
        assert_eq!(err.classify(), Failure::Semantic, "{status}");
    }
}

#[tokio::test]
async fn the_error_tells_an_operator_what_happened_and_keeps_secrets_out() {
    let (_dir, ctx) = ctx();
    let long = format!(
        "{{\"error\":\"card_declined\",\"detail\":\"{}\"}}",
        "x".repeat(2000)
    );
    let server = Server::always(Answer::with(402, &[("request-id", "req_77")], &long)).await;
    let addr = server.addr;
    let url =
        format!("http://user:hunter2@{addr}/v1/charges?api_key=sk_live_secret&customer=cus_9#frag");
    let err = http::send(&ctx, client().post(&url)).await.unwrap_err();

    assert_eq!(err.method(), Some(&reqwest::Method::POST));
    let shown = format!("http://{addr}/v1/charges?api_key=…&customer=…");
    assert_eq!(err.url(), Some(shown.as_str()));
    assert_eq!(err.status(), Some(reqwest::StatusCode::PAYMENT_REQUIRED));
    assert_eq!(err.headers().unwrap()["request-id"], "req_77");
    let excerpt = err.body_excerpt().unwrap();
    assert!(
        excerpt.starts_with("{\"error\":\"card_declined\""),
        "{excerpt}"
    );
    assert!(
        excerpt.ends_with('…') && excerpt.len() <= http::BODY_EXCERPT_LIMIT + 3,
        "{excerpt}"
    );
    let text = err.to_string();
    assert!(
        text.starts_with(&format!("POST {shown}: 402 Payment Required: {{\"error\"")),
        "{text}"
    );
    let debug = format!("{err:?}");
    for secret in ["hunter2", "sk_live_secret", "cus_9", "frag"] {
        assert!(!text.contains(secret), "{text}");
        assert!(!debug.contains(secret), "{debug}");
    }

    // A transport error keeps the query values out too (reqwest's own
    // message would show the URL whole).
    let url = format!("http://{}/v1/charges?api_key=sk_live_secret", closed_port());
    let err = http::send(&ctx, client().post(&url)).await.unwrap_err();
    let (text, debug) = (err.to_string(), format!("{err:?}"));
    assert!(
        text.contains("/v1/charges?api_key=…: connect error"),
        "{text}"
    );
    assert!(
        !text.contains("sk_live_secret") && !debug.contains("sk_live_secret"),
        "{debug}"
    );
}

#[tokio::test]
async fn an_invalid_request_is_semantic_and_never_sent() {
    let (_dir, ctx) = ctx();
    let err = http::send(
        &ctx,
        client()
            .post("http://127.0.0.1:1/x")
            .header("bad\nname", "v"),
    )
    .await
    .unwrap_err();
    assert_eq!(err.classify(), Failure::Semantic, "{err}");
}

#[tokio::test]
async fn a_failed_request_is_sent_exactly_once() {
    let (_dir, ctx) = ctx();
    for answer in [
        Answer::CloseAfterBody,
        Answer::ResetAfterBody,
        Answer::status(503),
    ] {
        let server = Server::always(answer.clone()).await;
        post(&ctx, &client(), &server.url("/v1/charges"))
            .await
            .unwrap_err();
        assert_eq!(server.requests(), 1, "{answer:?}");
    }
}
