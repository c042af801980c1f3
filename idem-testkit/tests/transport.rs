//! Connection-level behaviour: real refusals, malformed input, shutdown and
//! passing addresses to worker processes.

use std::time::{Duration, Instant};

use idem_runtime::{Classify, Failure};
use idem_testkit::{
    ChargeRequest, ClientConfig, Fault, PaymentsClient, ProviderAddrs, ProviderError, Providers,
    ProvidersConfig, ServerConfig, PAYMENTS_ENV,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn req(order_id: u64) -> ChargeRequest {
    ChargeRequest {
        amount: 100,
        currency: "eur".into(),
        order_id,
        customer: "cus_bob".into(),
    }
}

/// Sends raw bytes and returns whatever the server answers before closing.
async fn raw(addr: std::net::SocketAddr, bytes: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let _ = stream.write_all(bytes).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn refused_connections_are_real_and_classified_not_sent() {
    let providers = Providers::start().await.unwrap();
    let addr = providers.addrs().payments;
    let client = PaymentsClient::new(addr);
    providers
        .payments()
        .faults()
        .refuse_connections()
        .await
        .unwrap();

    let err = client.charge("k", &req(1)).await.unwrap_err();
    match &err {
        ProviderError::Connect { reason, .. } => {
            assert!(reason.to_lowercase().contains("refused"), "{reason}")
        }
        other => panic!("expected a connect failure, got {other:?}"),
    }
    assert_eq!(err.classify(), Failure::not_sent());
    assert!(providers.payments().ledger().is_empty());

    providers
        .payments()
        .faults()
        .accept_connections()
        .await
        .unwrap();
    assert_eq!(
        providers.addrs().payments,
        addr,
        "same address after reopening"
    );
    client.charge("k", &req(1)).await.unwrap();
    assert_eq!(providers.payments().ledger().len(), 1);
}

#[tokio::test]
async fn refuse_for_reopens_on_its_own() {
    let providers = Providers::start().await.unwrap();
    let client = PaymentsClient::new(providers.addrs().payments);
    providers
        .payments()
        .faults()
        .refuse_for(Duration::from_millis(100))
        .await
        .unwrap();
    assert!(matches!(
        client.charge("k", &req(2)).await,
        Err(ProviderError::Connect { .. })
    ));
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match client.charge("k", &req(2)).await {
            Ok(_) => break,
            Err(ProviderError::Connect { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(e) => panic!("listener did not reopen: {e}"),
        }
    }
}

#[tokio::test]
async fn an_outage_serves_the_request_in_hand_then_refuses() {
    let providers = Providers::start().await.unwrap();
    let client = PaymentsClient::new(providers.addrs().payments);
    let faults = providers.payments().faults();
    faults.push(Fault::Outage(Duration::from_secs(600)));
    client.charge("a", &req(3)).await.unwrap();
    let err = client.charge("b", &req(4)).await.unwrap_err();
    assert_eq!(err.classify(), Failure::not_sent(), "{err}");
    faults.accept_connections().await.unwrap();
    client.charge("b", &req(4)).await.unwrap();
}

#[tokio::test]
async fn malformed_http_gets_an_error_status_and_the_server_keeps_serving() {
    let providers = Providers::start().await.unwrap();
    let addr = providers.addrs().payments;
    assert!(raw(addr, b"HELLO\r\n\r\n")
        .await
        .starts_with("HTTP/1.1 400"));
    assert!(raw(addr, b"GET / HTTP/9.9\r\n\r\n")
        .await
        .starts_with("HTTP/1.1 505"));
    let huge_body = b"POST /v1/charges HTTP/1.1\r\nContent-Length: 100000000\r\n\r\n";
    assert!(raw(addr, huge_body).await.starts_with("HTTP/1.1 413"));
    let mut huge_head = b"GET / HTTP/1.1\r\nX-Big: ".to_vec();
    huge_head.extend(std::iter::repeat_n(b'a', 64 * 1024));
    assert!(raw(addr, &huge_head).await.starts_with("HTTP/1.1 431"));
    let not_json = b"POST /v1/charges HTTP/1.1\r\nContent-Length: 3\r\n\r\n{{{";
    assert!(raw(addr, not_json).await.starts_with("HTTP/1.1 400"));
    assert!(raw(addr, b"GET /nope HTTP/1.1\r\n\r\n")
        .await
        .starts_with("HTTP/1.1 404"));
    // Connect and leave without a byte.
    drop(TcpStream::connect(addr).await.unwrap());

    PaymentsClient::new(addr)
        .charge("k", &req(5))
        .await
        .unwrap();
    assert_eq!(providers.payments().ledger().len(), 1);
}

#[tokio::test]
async fn a_client_too_slow_to_send_gets_408() {
    let server = ServerConfig {
        read_timeout: Duration::from_millis(50),
        ..ServerConfig::default()
    };
    let providers = Providers::start_with(ProvidersConfig::default().server(server))
        .await
        .unwrap();
    let answer = raw(providers.addrs().email, b"POST /send HTTP/1.1\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
}

#[tokio::test]
async fn shutdown_closes_listeners_and_hanging_connections() {
    let providers = Providers::start().await.unwrap();
    let addrs = providers.addrs();
    let payments = providers.payments().clone();
    payments.faults().push(Fault::timeout_after_apply());
    let client = PaymentsClient::with_config(
        addrs.payments,
        ClientConfig {
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(30),
        },
    );
    let hanging = tokio::spawn({
        let client = client.clone();
        async move { client.charge("k", &req(6)).await }
    });
    while payments.ledger().is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let started = Instant::now();
    providers.shutdown().await;
    let err = hanging.await.unwrap().unwrap_err();
    assert!(matches!(err, ProviderError::Connection { .. }), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let after = client.charge("k", &req(6)).await.unwrap_err();
    assert_eq!(after.classify(), Failure::not_sent());
    // The ledger outlives the servers.
    assert_eq!(payments.ledger().len(), 1);
}

#[tokio::test]
async fn dropping_the_handle_stops_the_providers() {
    let providers = Providers::start().await.unwrap();
    let addr = providers.addrs().wire;
    drop(providers);
    let deadline = Instant::now() + Duration::from_secs(5);
    while TcpStream::connect(addr).await.is_ok() {
        assert!(Instant::now() < deadline, "listener still open");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn header_injection_is_refused_before_sending() {
    let providers = Providers::start().await.unwrap();
    let client = PaymentsClient::new(providers.addrs().payments);
    let err = client.charge("k\r\nX-Evil: 1", &req(7)).await.unwrap_err();
    assert!(
        matches!(err, ProviderError::InvalidRequest { .. }),
        "{err:?}"
    );
    assert_eq!(err.classify(), Failure::Semantic);
    assert!(providers.payments().ledger().is_empty());
}

#[test]
fn addresses_round_trip_through_the_environment() {
    let addrs = ProviderAddrs {
        payments: "127.0.0.1:4001".parse().unwrap(),
        email: "127.0.0.1:4002".parse().unwrap(),
        tickets: "127.0.0.1:4003".parse().unwrap(),
        wire: "[::1]:4004".parse().unwrap(),
    };
    let env = addrs.to_env();
    let pairs = || env.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    assert_eq!(ProviderAddrs::from_vars(pairs()).unwrap(), addrs);

    let missing = ProviderAddrs::from_vars(pairs().filter(|(k, _)| *k != PAYMENTS_ENV));
    assert_eq!(missing.unwrap_err().var, PAYMENTS_ENV);
    let bad = ProviderAddrs::from_vars(pairs().map(|(k, v)| {
        if k == PAYMENTS_ENV {
            (k, "nope")
        } else {
            (k, v)
        }
    }))
    .unwrap_err();
    assert!(bad.to_string().contains("not an address"), "{bad}");
}

/// A real child process reads the addresses from its environment.
#[test]
fn a_child_process_sees_the_addresses() {
    let addrs = ProviderAddrs {
        payments: "127.0.0.1:1".parse().unwrap(),
        email: "127.0.0.1:2".parse().unwrap(),
        tickets: "127.0.0.1:3".parse().unwrap(),
        wire: "127.0.0.1:4".parse().unwrap(),
    };
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("echo ${PAYMENTS_ENV}"))
        .envs(addrs.to_env())
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "127.0.0.1:1");
}
