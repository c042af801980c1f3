//! `https://` with and without a TLS feature (`rustls`, `native-tls`; the
//! facade's `http-rustls`, `http-native-tls`).

mod support;

use idem::http;
use idem::{Classify, Failure};
use support::{closed_port, runtime};

/// Never sent either way. Without TLS reqwest refuses the scheme when it
/// connects (a configuration error the engine retries as not sent, then
/// returns with this message); with TLS it is an ordinary refused
/// connection.
#[tokio::test]
async fn an_https_request_to_a_closed_port_is_not_sent() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("tls");
    let client = http::client_builder().build().unwrap();
    let url = format!("https://{}/v1/charges", closed_port());
    let err = http::send(&ctx, client.post(url)).await.unwrap_err();
    assert_eq!(err.classify(), Failure::not_sent(), "{err}");
    // (Without our features another crate of the build may still have
    // turned reqwest's TLS on: only the positive case is certain.)
    if cfg!(any(feature = "rustls", feature = "native-tls")) {
        assert!(err.to_string().contains("Connection refused"), "{err}");
    }
}
