//! Email, tickets and wire: no deduplication, so the ledgers and the
//! look-ups are what tell a landed effect from a lost one.

use std::time::Duration;

use idem_runtime::{Classify, Failure};
use idem_testkit::{
    ClientConfig, EmailMessage, EmailOp, Fault, NewTicket, ProviderError, Providers, WireRequest,
};

fn quick() -> ClientConfig {
    ClientConfig {
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_millis(100),
    }
}

fn receipt(to: &str) -> EmailMessage {
    EmailMessage {
        to: to.into(),
        subject: "receipt".into(),
        body: "thanks".into(),
    }
}

#[tokio::test]
async fn sent_email_is_found_by_its_key() {
    let providers = Providers::start().await.unwrap();
    let email = providers.addrs().clients().email;
    // Characters that need encoding in a query string.
    let key = "run/4711 a&b=c+é";
    let sent = email.send(key, &receipt("a@example.com")).await.unwrap();
    assert_eq!(sent.key.as_deref(), Some(key));
    email
        .send("other", &receipt("b@example.com"))
        .await
        .unwrap();

    assert_eq!(email.find_by_key(key).await.unwrap(), vec![sent.clone()]);
    assert!(email.find_by_key("missing").await.unwrap().is_empty());
    assert_eq!(providers.email().ledger().len(), 2);
    assert!(providers.email().duplicates().is_empty());
}

#[tokio::test]
async fn a_timed_out_send_landed_and_verify_can_see_it() {
    let providers = Providers::start().await.unwrap();
    let impatient = providers.addrs().clients_with(quick()).email;
    let email = providers.addrs().clients().email;
    providers
        .email()
        .faults()
        .push(Fault::timeout_after_apply());
    let err = impatient
        .send("k1", &receipt("a@example.com"))
        .await
        .unwrap_err();
    assert!(matches!(err, ProviderError::Timeout { .. }), "{err:?}");
    assert_eq!(err.classify(), Failure::ambiguous());
    assert_eq!(providers.email().ledger().len(), 1);
    // Read-before-retry finds it; the queued fault hit the write, not this read.
    let found = email.find_by_key("k1").await.unwrap();
    assert_eq!(found, providers.email().ledger());
}

#[tokio::test]
async fn blind_resend_duplicates_email() {
    let providers = Providers::start().await.unwrap();
    let email = providers.addrs().clients().email;
    email.send("k", &receipt("a@example.com")).await.unwrap();
    email.send("k", &receipt("a@example.com")).await.unwrap();
    let op = EmailOp {
        to: "a@example.com".into(),
        key: Some("k".into()),
    };
    assert_eq!(providers.email().duplicates(), vec![(op.clone(), 2)]);
    assert_eq!(providers.email().count(&op), 2);
    assert_eq!(
        providers.duplicates()[0].operation,
        "to=a@example.com key=k"
    );
}

#[tokio::test]
async fn read_faults_are_scripted_separately() {
    let providers = Providers::start().await.unwrap();
    let email = providers.addrs().clients().email;
    providers
        .email()
        .faults()
        .push_read(Fault::error_before_apply(503));
    email.send("k", &receipt("a@example.com")).await.unwrap();
    let err = email.find_by_key("k").await.unwrap_err();
    assert_eq!(err.status(), Some(503));
    assert_eq!(err.classify(), Failure::ambiguous());
    assert_eq!(email.find_by_key("k").await.unwrap().len(), 1);
}

#[tokio::test]
async fn tickets_are_found_by_external_ref() {
    let providers = Providers::start().await.unwrap();
    let tickets = providers.addrs().clients().tickets;
    let new = NewTicket {
        external_ref: "ref-1".into(),
        title: "refund".into(),
        body: "order 4711".into(),
    };
    let created = tickets.create(&new).await.unwrap();
    assert_eq!(created.external_ref, "ref-1");
    assert_eq!(tickets.find_by_ref("ref-1").await.unwrap(), vec![created]);
    assert!(tickets.find_by_ref("ref-2").await.unwrap().is_empty());

    // No dedupe: a second create is a second ticket.
    tickets.create(&new).await.unwrap();
    assert_eq!(tickets.find_by_ref("ref-1").await.unwrap().len(), 2);
    assert_eq!(
        providers.tickets().duplicates(),
        vec![("ref-1".to_string(), 2)]
    );
}

#[tokio::test]
async fn wires_disconnected_after_applying_are_ambiguous_and_a_retry_duplicates() {
    let providers = Providers::start().await.unwrap();
    let wire = providers.addrs().clients().wire;
    let req = WireRequest {
        to_account: "DE89370400440532013000".into(),
        amount: 250_000,
        reference: "payout-7".into(),
    };
    providers
        .wire()
        .faults()
        .push(Fault::disconnect_after_apply());
    let err = wire.send(&req).await.unwrap_err();
    assert!(matches!(err, ProviderError::Connection { .. }), "{err:?}");
    assert_eq!(err.classify(), Failure::ambiguous());
    assert_eq!(providers.wire().ledger().len(), 1);

    wire.send(&req).await.unwrap();
    assert_eq!(
        providers.wire().duplicates(),
        vec![("payout-7".to_string(), 2)]
    );
    let dump = providers.ledgers_json();
    assert_eq!(dump["wire"].as_array().unwrap().len(), 2);
    assert_eq!(dump["wire"][0]["reference"], "payout-7");
    assert!(dump["payments"].as_array().unwrap().is_empty());
}

#[tokio::test]
async fn faults_before_applying_leave_no_effect() {
    let providers = Providers::start().await.unwrap();
    let clients = providers.addrs().clients_with(quick());
    let faults = providers.tickets().faults();
    faults.push(Fault::timeout_before_apply());
    faults.push(Fault::Disconnect {
        stage: idem_testkit::Stage::BeforeApply,
    });
    faults.push(Fault::rate_limit(0));
    let new = NewTicket {
        external_ref: "r".into(),
        title: "t".into(),
        body: "b".into(),
    };
    let timeout = clients.tickets.create(&new).await.unwrap_err();
    assert_eq!(timeout.classify(), Failure::ambiguous());
    let closed = clients.tickets.create(&new).await.unwrap_err();
    assert!(
        matches!(closed, ProviderError::Connection { .. }),
        "{closed:?}"
    );
    let patient = providers.addrs().clients().tickets;
    let limited = patient.create(&new).await.unwrap_err();
    assert_eq!(
        limited.classify(),
        Failure::NotSent {
            retry_after: Some(Duration::ZERO)
        }
    );
    assert!(providers.tickets().ledger().is_empty());
    assert_eq!(faults.pending(), 0);
    let stats = faults.stats();
    assert_eq!(stats["timeout_before_apply"], 1);
    assert_eq!(stats["rate_limit"], 1);
}

#[tokio::test]
async fn a_delay_still_applies_even_if_the_client_gave_up() {
    let providers = Providers::start().await.unwrap();
    let wire = providers.addrs().clients_with(quick()).wire;
    providers
        .wire()
        .faults()
        .push(Fault::Delay(Duration::from_millis(300)));
    let req = WireRequest {
        to_account: "x".into(),
        amount: 1,
        reference: "late".into(),
    };
    let err = wire.send(&req).await.unwrap_err();
    assert!(matches!(err, ProviderError::Timeout { .. }), "{err:?}");
    // The server keeps processing after the client left, as real ones do:
    // once it has handled every request it got, the wire is in the ledger.
    tokio::time::timeout(Duration::from_secs(10), providers.wire().settled())
        .await
        .expect("the provider settles");
    assert_eq!(
        providers.wire().ledger().len(),
        1,
        "the delayed wire was applied"
    );
}

#[tokio::test]
async fn a_cancellation_is_found_by_its_reference_and_every_one_is_counted() {
    use idem_testkit::{CancelTicket, NewTicket, TicketsClient};
    let providers = Providers::start().await.unwrap();
    let tickets = TicketsClient::with_config(providers.addrs().tickets, quick());
    let opened = tickets
        .create(&NewTicket {
            external_ref: "book-1".into(),
            title: "courier".into(),
            body: String::new(),
        })
        .await
        .unwrap();
    let cancel = CancelTicket {
        ticket_id: opened.id.clone(),
        reference: "cancel-1".into(),
    };
    assert!(tickets
        .find_cancellations("cancel-1")
        .await
        .unwrap()
        .is_empty());
    let done = tickets.cancel(&cancel).await.unwrap();
    assert_eq!(done.ticket_id, opened.id);
    assert_eq!(
        tickets.find_cancellations("cancel-1").await.unwrap(),
        [done]
    );
    assert!(providers.duplicates().is_empty());
    // Not deduplicated: a blind resend cancels (and notifies) again.
    tickets.cancel(&cancel).await.unwrap();
    assert_eq!(providers.cancellations().len(), 2);
    assert_eq!(providers.duplicates().len(), 1);
    // A ticket the provider does not know is refused.
    let unknown = tickets
        .cancel(&CancelTicket {
            ticket_id: "T-99".into(),
            reference: "cancel-2".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.status(), Some(400));
    assert_eq!(providers.cancellations().len(), 2);
}

#[tokio::test]
async fn the_bank_refuses_an_account_no_country_has() {
    use idem_testkit::{WireClient, WireRequest};
    let providers = Providers::start().await.unwrap();
    let wire = WireClient::with_config(providers.addrs().wire, quick());
    let refused = wire
        .send(&WireRequest {
            to_account: "XX00CLOSED".into(),
            amount: 100,
            reference: "supplier".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.status(), Some(400));
    assert!(providers.wire().ledger().is_empty());
}
