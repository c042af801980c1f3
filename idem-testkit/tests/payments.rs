//! Stripe's idempotency contract, as served over real TCP.

use std::time::Duration;

use idem_runtime::{Classify, Failure};
use idem_testkit::{
    ChargeOutcome, ChargeRequest, ClientConfig, Fault, ManualClock, OrderId, PaymentsClient,
    PaymentsConfig, ProviderError, Providers, ProvidersConfig,
};

fn charge(order_id: u64, amount: u64) -> ChargeRequest {
    ChargeRequest {
        amount,
        currency: "eur".into(),
        order_id,
        customer: "cus_alice".into(),
    }
}

async fn start() -> (Providers, PaymentsClient) {
    let providers = Providers::start().await.expect("providers start");
    let client = PaymentsClient::new(providers.addrs().payments);
    (providers, client)
}

fn status_of(e: &ProviderError) -> u16 {
    e.status()
        .unwrap_or_else(|| panic!("expected an HTTP status, got {e}"))
}

#[tokio::test]
async fn a_repeat_replays_the_saved_status_and_body_with_the_replay_header() {
    let (providers, client) = start().await;
    let body = serde_json::to_vec(&charge(1, 1999)).unwrap();
    let headers = [("Idempotency-Key", "order-1")];
    let first = client
        .http()
        .request("POST", "/v1/charges", &headers, &body)
        .await
        .unwrap();
    let second = client
        .http()
        .request("POST", "/v1/charges", &headers, &body)
        .await
        .unwrap();
    assert_eq!(first.status, 200);
    assert_eq!(first.header("idempotent-replayed"), None);
    assert_eq!(second.status, first.status);
    assert_eq!(second.body, first.body);
    assert_eq!(second.header("idempotent-replayed"), Some("true"));
    assert_eq!(providers.payments().ledger().len(), 1);

    // The typed client surfaces the header.
    let replay = client.charge("order-1", &charge(1, 1999)).await.unwrap();
    assert!(replay.replayed);
    let original: serde_json::Value = serde_json::from_slice(&first.body).unwrap();
    assert_eq!(replay.id, original["id"]);
    assert!(providers.duplicates().is_empty());
}

#[tokio::test]
async fn a_repeat_while_the_first_is_in_flight_gets_409_and_applies_nothing() {
    let (providers, client) = start().await;
    let gate = providers.payments().faults().hold_next();
    let first = {
        let client = client.clone();
        tokio::spawn(async move { client.charge("k", &charge(2, 500)).await })
    };
    gate.arrived().await;

    let err = client.charge("k", &charge(2, 500)).await.unwrap_err();
    assert_eq!(status_of(&err), 409);
    assert_eq!(err.classify(), Failure::not_sent());
    assert!(providers.payments().ledger().is_empty());

    gate.release();
    let first = first.await.unwrap().unwrap();
    assert!(!first.replayed);
    assert_eq!(providers.payments().ledger().len(), 1);
    let again = client.charge("k", &charge(2, 500)).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.id, first.id);
}

#[tokio::test]
async fn the_same_key_with_other_parameters_is_a_400_idempotency_error() {
    let (providers, client) = start().await;
    let first = client.charge("k", &charge(3, 100)).await.unwrap();
    let err = client.charge("k", &charge(3, 200)).await.unwrap_err();
    assert_eq!(status_of(&err), 400);
    assert_eq!(err.api_error().unwrap().kind, "idempotency_error");
    assert_eq!(err.classify(), Failure::Semantic);
    assert_eq!(providers.payments().ledger().len(), 1);
    // The saved result is untouched by the refused request.
    assert_eq!(
        client.charge("k", &charge(3, 100)).await.unwrap().id,
        first.id
    );
}

#[tokio::test]
async fn keys_expire_after_the_window_on_the_injected_clock() {
    let manual = ManualClock::new(1_700_000_000_000);
    let config = ProvidersConfig::default().clock(manual.clock());
    let providers = Providers::start_with(config).await.unwrap();
    let client = PaymentsClient::new(providers.addrs().payments);

    let first = client.charge("k", &charge(4, 700)).await.unwrap();
    assert_eq!(first.created_ms, 1_700_000_000_000);
    manual.advance(Duration::from_secs(24 * 3600) - Duration::from_millis(1));
    let replay = client.charge("k", &charge(4, 700)).await.unwrap();
    assert!(replay.replayed);
    assert_eq!(replay.id, first.id);

    manual.advance(Duration::from_millis(1));
    let fresh = client.charge("k", &charge(4, 700)).await.unwrap();
    assert!(!fresh.replayed);
    assert_ne!(fresh.id, first.id);
    assert_eq!(providers.payments().count(&OrderId(4)), 2);
    assert_eq!(providers.payments().duplicates(), vec![(OrderId(4), 2)]);
    // After expiry, other parameters are a new request too, not a mismatch.
    manual.advance(Duration::from_secs(24 * 3600));
    assert!(client.charge("k", &charge(4, 701)).await.is_ok());
}

#[tokio::test]
async fn the_key_window_is_configurable() {
    let manual = ManualClock::new(0);
    let payments = PaymentsConfig {
        key_window: Duration::from_secs(60),
        ..PaymentsConfig::default()
    };
    let config = ProvidersConfig::default()
        .clock(manual.clock())
        .payments(payments);
    let providers = Providers::start_with(config).await.unwrap();
    let client = PaymentsClient::new(providers.addrs().payments);
    client.charge("k", &charge(5, 1)).await.unwrap();
    manual.advance(Duration::from_secs(60));
    assert!(!client.charge("k", &charge(5, 1)).await.unwrap().replayed);
}

#[tokio::test]
async fn a_429_is_not_saved_under_the_key() {
    let (providers, client) = start().await;
    providers.payments().faults().push(Fault::rate_limit(7));
    let err = client.charge("k", &charge(6, 100)).await.unwrap_err();
    assert_eq!(status_of(&err), 429);
    assert_eq!(
        err.classify(),
        Failure::NotSent {
            retry_after: Some(Duration::from_secs(7))
        }
    );
    assert!(providers.payments().ledger().is_empty());
    let ok = client.charge("k", &charge(6, 100)).await.unwrap();
    assert!(!ok.replayed, "a 429 must not be replayed");
    assert_eq!(providers.payments().ledger().len(), 1);
}

#[tokio::test]
async fn a_5xx_before_applying_is_not_saved() {
    let (providers, client) = start().await;
    providers
        .payments()
        .faults()
        .push(Fault::error_before_apply(503));
    let err = client.charge("k", &charge(7, 100)).await.unwrap_err();
    assert_eq!(status_of(&err), 503);
    assert_eq!(err.classify(), Failure::ambiguous());
    assert!(providers.payments().ledger().is_empty());
    assert!(!client.charge("k", &charge(7, 100)).await.unwrap().replayed);
}

#[tokio::test]
async fn a_5xx_after_applying_is_saved_and_applied_once() {
    let (providers, client) = start().await;
    providers
        .payments()
        .faults()
        .push(Fault::error_after_apply(500));
    let err = client.charge("k", &charge(8, 100)).await.unwrap_err();
    assert_eq!(status_of(&err), 500);
    assert!(!err.is_replayed());
    assert_eq!(err.classify(), Failure::ambiguous());
    assert_eq!(providers.payments().ledger().len(), 1);

    let again = client.charge("k", &charge(8, 100)).await.unwrap_err();
    assert_eq!(status_of(&again), 500);
    assert!(again.is_replayed(), "Stripe replays an executed 500");
    assert_eq!(providers.payments().count(&OrderId(8)), 1);
}

#[tokio::test]
async fn a_timeout_after_applying_is_ambiguous_and_the_retry_replays() {
    let (providers, _) = start().await;
    let client = PaymentsClient::with_config(
        providers.addrs().payments,
        ClientConfig {
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_millis(100),
        },
    );
    providers
        .payments()
        .faults()
        .push(Fault::timeout_after_apply());
    let err = client.charge("k", &charge(9, 100)).await.unwrap_err();
    assert!(matches!(err, ProviderError::Timeout { .. }), "{err:?}");
    assert_eq!(err.classify(), Failure::ambiguous());
    let ledger = providers.payments().ledger();
    assert_eq!(ledger.len(), 1, "the effect landed although nobody heard");

    let patient = PaymentsClient::new(providers.addrs().payments);
    let retry = patient.charge("k", &charge(9, 100)).await.unwrap();
    assert!(retry.replayed);
    assert_eq!(retry.id, ledger[0].charge_id);
    assert_eq!(providers.payments().ledger().len(), 1);
}

#[tokio::test]
async fn a_decline_is_a_saved_402() {
    let (providers, client) = start().await;
    let mut req = charge(10, 100);
    req.customer = "cus_declined".into();
    let err = client.charge("k", &req).await.unwrap_err();
    assert_eq!(status_of(&err), 402);
    assert_eq!(err.classify(), Failure::Semantic);
    let api = err.api_error().unwrap();
    assert_eq!(api.code.as_deref(), Some("card_declined"));
    let ledger = providers.payments().ledger();
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0].outcome, ChargeOutcome::Declined);
    assert_eq!(api.charge.as_deref(), Some(ledger[0].charge_id.as_str()));

    let again = client.charge("k", &req).await.unwrap_err();
    assert_eq!(status_of(&again), 402);
    assert!(again.is_replayed());
    assert_eq!(providers.payments().ledger().len(), 1);
    assert!(
        providers.payments().counts().is_empty(),
        "a decline moves no money"
    );
}

#[tokio::test]
async fn declined_amounts_are_configurable() {
    let payments = PaymentsConfig {
        declined_amounts: vec![402],
        ..PaymentsConfig::default()
    };
    let providers = Providers::start_with(ProvidersConfig::default().payments(payments))
        .await
        .unwrap();
    let client = PaymentsClient::new(providers.addrs().payments);
    let err = client.charge("a", &charge(11, 402)).await.unwrap_err();
    assert_eq!(status_of(&err), 402);
    assert!(client.charge("b", &charge(11, 403)).await.is_ok());
}

#[tokio::test]
async fn keys_longer_than_255_characters_are_refused() {
    let (providers, client) = start().await;
    let long = "k".repeat(256);
    let err = client.charge(&long, &charge(12, 100)).await.unwrap_err();
    assert_eq!(status_of(&err), 400);
    assert_eq!(err.classify(), Failure::Semantic);
    assert!(providers.payments().ledger().is_empty());
    assert!(client
        .charge(&"k".repeat(255), &charge(12, 100))
        .await
        .is_ok());
}

#[tokio::test]
async fn invalid_parameters_are_refused_and_not_saved() {
    let (providers, client) = start().await;
    let mut bad = charge(13, 100);
    bad.currency = "EURO".into();
    let err = client.charge("k", &bad).await.unwrap_err();
    assert_eq!(status_of(&err), 400);
    assert_eq!(err.api_error().unwrap().kind, "invalid_request_error");
    let unknown_field = br#"{"amount":1,"currency":"eur","order_id":1,"customer":"c","x":1}"#;
    let resp = client
        .http()
        .request(
            "POST",
            "/v1/charges",
            &[("Idempotency-Key", "k")],
            unknown_field,
        )
        .await
        .unwrap();
    assert_eq!(resp.status, 400);
    assert!(providers.payments().ledger().is_empty());
    // Nothing was saved, so the same key with valid parameters executes.
    assert!(!client.charge("k", &charge(13, 100)).await.unwrap().replayed);
}

#[tokio::test]
async fn without_a_key_every_request_charges_and_duplicates_show() {
    let (providers, client) = start().await;
    let a = client.charge_without_key(&charge(14, 100)).await.unwrap();
    let b = client.charge_without_key(&charge(14, 100)).await.unwrap();
    assert_ne!(a.id, b.id);
    assert_eq!(providers.payments().duplicates(), vec![(OrderId(14), 2)]);
    let all = providers.duplicates();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].provider, "payments");
    assert_eq!(all[0].operation, "order_id=14");
    assert_eq!(all[0].count, 2);
}

/// Under a seeded fault mix, retrying with the same key charges every order
/// exactly once, while the undeduplicated wire provider under the same mix
/// sends duplicates: the ledgers tell the two apart.
#[tokio::test]
async fn chaos_with_keys_never_double_charges() {
    let providers = Providers::start().await.unwrap();
    let mut chaos = idem_testkit::Chaos::new(2024);
    chaos.rate_limit = 0.1;
    chaos.error_before_apply = 0.1;
    chaos.timeout_after_apply = 0.15;
    chaos.disconnect_after_apply = 0.1;
    chaos.delay = 0.1;
    chaos.max_delay = Duration::from_millis(5);
    providers.payments().faults().set_chaos(Some(chaos.clone()));
    providers.wire().faults().set_chaos(Some(chaos));
    let config = ClientConfig {
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_millis(200),
    };
    let clients = providers.addrs().clients_with(config);

    for order in 0..25u64 {
        let key = format!("order-{order}");
        let mut done = false;
        for _ in 0..50 {
            match clients.payments.charge(&key, &charge(order, 100)).await {
                Ok(_) => {
                    done = true;
                    break;
                }
                Err(e) => assert_ne!(e.classify(), Failure::Semantic, "{e}"),
            }
        }
        assert!(done, "order {order} never got through");
        let wire = idem_testkit::WireRequest {
            to_account: "DE00".into(),
            amount: 100,
            reference: key.clone(),
        };
        for _ in 0..50 {
            if clients.wire.send(&wire).await.is_ok() {
                break;
            }
        }
    }
    let charged = providers.payments().counts();
    assert_eq!(charged.len(), 25);
    assert!(charged.values().all(|n| *n == 1), "{charged:?}");
    assert!(providers.payments().duplicates().is_empty());
    assert!(
        !providers.wire().duplicates().is_empty(),
        "retrying ambiguous wires without dedupe duplicates some"
    );
    assert!(providers.payments().faults().stats().values().sum::<u64>() > 0);
}

fn refund_of(charge: &str, amount: u64) -> idem_testkit::RefundRequest {
    idem_testkit::RefundRequest {
        charge: charge.into(),
        amount,
    }
}

#[tokio::test]
async fn a_refund_is_deduplicated_on_its_key_and_every_refund_executed_is_counted() {
    let (providers, client) = start().await;
    let charged = client.charge("order-7", &charge(7, 1999)).await.unwrap();
    let first = client
        .refund("refund-7", &refund_of(&charged.id, 1999))
        .await
        .unwrap();
    assert!(!first.replayed);
    let again = client
        .refund("refund-7", &refund_of(&charged.id, 1999))
        .await
        .unwrap();
    assert!(again.replayed, "the saved answer, not a second refund");
    assert_eq!(again.id, first.id);
    assert_eq!(providers.refunds().len(), 1);
    assert_eq!(providers.refunds()[0].order_id, 7);
    assert!(providers.duplicates().is_empty());
    // The same key with other parameters is refused and refunds nothing.
    let other = client
        .refund("refund-7", &refund_of(&charged.id, 1))
        .await
        .unwrap_err();
    assert_eq!(status_of(&other), 400);
    // Another key is another refund: the provider counts it as a double
    // refund of the charge.
    client
        .refund("refund-7-bis", &refund_of(&charged.id, 1999))
        .await
        .unwrap();
    let duplicates = providers.duplicates();
    assert_eq!(duplicates.len(), 1, "{duplicates:?}");
    assert_eq!(duplicates[0].operation, format!("refund of {}", charged.id));
}

#[tokio::test]
async fn a_refund_of_an_unknown_charge_or_of_more_than_was_charged_is_refused() {
    let (providers, client) = start().await;
    let charged = client.charge("order-8", &charge(8, 500)).await.unwrap();
    for (key, request) in [
        ("r-1", refund_of("ch_nope", 500)),
        ("r-2", refund_of(&charged.id, 501)),
        ("r-3", refund_of(&charged.id, 0)),
    ] {
        let refused = client.refund(key, &request).await.unwrap_err();
        assert_eq!(status_of(&refused), 400, "{request:?}");
        assert_eq!(refused.classify(), Failure::Semantic);
    }
    assert!(providers.refunds().is_empty());
}

#[tokio::test]
async fn a_refund_that_lost_its_answer_is_replayed_on_a_repeat() {
    let (providers, client) = start().await;
    let charged = client.charge("order-9", &charge(9, 700)).await.unwrap();
    providers
        .payments()
        .faults()
        .push(Fault::disconnect_after_apply());
    let lost = client
        .refund("refund-9", &refund_of(&charged.id, 700))
        .await
        .unwrap_err();
    assert!(
        matches!(lost.classify(), Failure::Ambiguous { .. }),
        "{lost}"
    );
    let again = client
        .refund("refund-9", &refund_of(&charged.id, 700))
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(providers.refunds().len(), 1);
}

#[tokio::test]
async fn a_refund_repeated_while_the_first_is_in_flight_gets_409_and_refunds_nothing() {
    let (providers, client) = start().await;
    let charged = client.charge("order-10", &charge(10, 300)).await.unwrap();
    let gate = providers.payments().faults().hold_next();
    let first = {
        let client = client.clone();
        let request = refund_of(&charged.id, 300);
        tokio::spawn(async move { client.refund("refund-10", &request).await })
    };
    gate.arrived().await;
    let busy = client
        .refund("refund-10", &refund_of(&charged.id, 300))
        .await
        .unwrap_err();
    assert_eq!(status_of(&busy), 409);
    assert!(providers.refunds().is_empty());
    gate.release();
    assert!(!first.await.unwrap().unwrap().replayed);
    assert_eq!(providers.refunds().len(), 1);
}
