//! Approval before a call (`#[tool(approve = ...)]`), through the real
//! runtime (sled in a temporary directory): nothing runs before a person
//! approved it, nobody is asked twice, a refusal is final, and what runs
//! is what was approved.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use idem::{tool, Classify, Ctx, Error, EventKind, Failure, Runtime, ToolError};
use idem_testkit::engine::events;

#[derive(Debug, Clone, PartialEq)]
struct Declined;

impl Classify for Declined {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

/// Counts the effects a tool had.
#[derive(Default)]
struct Bank {
    wires: AtomicUsize,
}

impl Bank {
    fn wires(&self) -> usize {
        self.wires.load(Ordering::SeqCst)
    }
}

/// Wires above 1,000 EUR need a person.
fn large_wires(_ctx: &Ctx, _to: &String, amount_eur: &u64, _bank: &Arc<Bank>) -> Option<String> {
    (*amount_eur > 1_000).then(|| format!("a wire of {amount_eur} EUR is above 1000 EUR"))
}

#[tool(class = "provider", key = "to, amount_eur", approve = large_wires)]
async fn wire(ctx: &Ctx, to: String, amount_eur: u64, bank: Arc<Bank>) -> Result<String, Declined> {
    let _ = ctx;
    bank.wires.fetch_add(1, Ordering::SeqCst);
    Ok(format!("wired {amount_eur} to {to}"))
}

#[tool(class = "at_most_once", key = "to", approve = "always")]
async fn send_letter(ctx: &Ctx, to: String, body: String, bank: Arc<Bank>) -> Result<(), Declined> {
    let _ = (ctx, body);
    bank.wires.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[tool(
    class = "provider",
    key = "to",
    approve = "always",
    approval_wait = "10m"
)]
async fn wire_waiting(ctx: &Ctx, to: String, bank: Arc<Bank>) -> Result<String, Declined> {
    let _ = ctx;
    bank.wires.fetch_add(1, Ordering::SeqCst);
    Ok(format!("wired to {to}"))
}

/// Effects of `notify` (a tool a model calls by name: JSON arguments only).
static NOTIFIED: AtomicUsize = AtomicUsize::new(0);

#[tool(class = "at_most_once", key = "to", approve = "always")]
async fn notify(ctx: &Ctx, to: String, body: String) -> Result<String, Declined> {
    let _ = ctx;
    NOTIFIED.fetch_add(1, Ordering::SeqCst);
    Ok(format!("{to}: {body}"))
}

fn runtime() -> (tempfile::TempDir, Runtime) {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(dir.path()).unwrap();
    (dir, rt)
}

fn approvals_requested(events: &[EventKind]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, EventKind::ApprovalRequested { .. }))
        .count()
}

#[tokio::test]
async fn a_call_the_policy_gates_waits_for_a_person_then_runs_once() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("invoice-7");
    let bank = Arc::new(Bank::default());

    // Below the limit: no person, it runs.
    let small = wire(&ctx, "acme".into(), 500, bank.clone()).await.unwrap();
    assert_eq!(small, "wired 500 to acme");
    assert_eq!(bank.wires(), 1);

    // Above: recorded, nothing ran, the same key on every call.
    let err = wire(&ctx, "acme".into(), 5_000, bank.clone())
        .await
        .unwrap_err();
    let ToolError::AwaitingApproval { key } = &err else {
        panic!("expected AwaitingApproval, got {err:?}");
    };
    assert_eq!(bank.wires(), 1);
    let again = wire(&ctx, "acme".into(), 5_000, bank.clone())
        .await
        .unwrap_err();
    assert!(
        matches!(&again, ToolError::AwaitingApproval { key: k } if k == key),
        "{again:?}"
    );
    assert_eq!(bank.wires(), 1);
    let pending = rt.approvals().await.unwrap();
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(&pending[0].key, key);
    assert_eq!(pending[0].tool, "wire");
    assert_eq!(pending[0].root_run, "invoice-7");
    assert_eq!(pending[0].reason, "a wire of 5000 EUR is above 1000 EUR");
    assert_eq!(pending[0].args["amount_eur"], 5_000);
    // Not an escalation.
    assert!(rt.escalations().await.unwrap().is_empty());
    assert_eq!(approvals_requested(&events(&rt).await), 1, "asked once");

    rt.approve(key, "invoice 7 checked").await.unwrap();
    assert!(rt.approvals().await.unwrap().is_empty());
    let out = wire(&ctx, "acme".into(), 5_000, bank.clone())
        .await
        .unwrap();
    assert_eq!(out, "wired 5000 to acme");
    assert_eq!(bank.wires(), 2);
    // Then a replay, and the decision stays in the record.
    let replay = wire(&ctx, "acme".into(), 5_000, bank.clone())
        .await
        .unwrap();
    assert_eq!(replay, out);
    assert_eq!(bank.wires(), 2);
    let op = rt.operation(key).await.unwrap().unwrap();
    assert_eq!(op.state, "committed");
    let approval = op.approval.expect("the approval is in the record");
    assert_eq!(approval.approved, Some(true));
    assert_eq!(approval.note.as_deref(), Some("invoice 7 checked"));
    assert_eq!(approval.via.as_deref(), Some("runtime"));
    let all = events(&rt).await;
    assert!(all.contains(&EventKind::Approved {
        note: "invoice 7 checked".into(),
        via: "runtime".into()
    }));
    assert_eq!(approvals_requested(&all), 1, "never asked again");

    // A decision is final.
    let twice = rt.approve(key, "again").await.unwrap_err();
    assert!(
        matches!(&twice, Error::NotAwaitingApproval { state, .. } if state == "committed"),
        "{twice:?}"
    );
}

#[tokio::test]
async fn a_refusal_is_returned_to_every_call_of_the_key_and_nothing_runs() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("letters");
    let bank = Arc::new(Bank::default());
    let err = send_letter(&ctx, "bob".into(), "hello".into(), bank.clone())
        .await
        .unwrap_err();
    let ToolError::AwaitingApproval { key } = err else {
        panic!("expected AwaitingApproval, got {err:?}");
    };
    rt.reject(&key, "we do not write to bob").await.unwrap();
    for body in ["hello", "other words"] {
        let err = send_letter(&ctx, "bob".into(), body.into(), bank.clone())
            .await
            .unwrap_err();
        let ToolError::NotApproved { key: k, note } = &err else {
            panic!("expected NotApproved, got {err:?}");
        };
        assert_eq!(k, &key);
        assert_eq!(note, "we do not write to bob");
    }
    assert_eq!(bank.wires(), 0);
    assert!(events(&rt).await.contains(&EventKind::NotApproved {
        note: "we do not write to bob".into(),
        via: "runtime".into()
    }));
    // Another key is another call: it asks.
    let other = send_letter(&ctx, "carol".into(), "hello".into(), bank.clone())
        .await
        .unwrap_err();
    assert!(
        matches!(other, ToolError::AwaitingApproval { .. }),
        "{other:?}"
    );
    assert_eq!(rt.approvals().await.unwrap().len(), 1);
    assert_eq!(bank.wires(), 0);
    let refused = rt.reject(&key, "twice").await.unwrap_err();
    assert!(
        matches!(&refused, Error::NotAwaitingApproval { state, .. } if state == "not_approved"),
        "{refused:?}"
    );
}

#[tokio::test]
async fn what_runs_is_what_was_approved() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("letters-2");
    let bank = Arc::new(Bank::default());
    let err = send_letter(&ctx, "dan".into(), "approved words".into(), bank.clone())
        .await
        .unwrap_err();
    let ToolError::AwaitingApproval { key } = err else {
        panic!("{err:?}");
    };
    rt.approve(&key, "fine").await.unwrap();
    // Same key, other words: not what the person approved.
    let drifted = send_letter(&ctx, "dan".into(), "other words".into(), bank.clone())
        .await
        .unwrap_err();
    assert!(
        matches!(drifted, ToolError::ArgsMismatch { .. }),
        "{drifted:?}"
    );
    assert_eq!(bank.wires(), 0);
    send_letter(&ctx, "dan".into(), "approved words".into(), bank.clone())
        .await
        .unwrap();
    assert_eq!(bank.wires(), 1);
}

#[tokio::test]
async fn a_waiting_call_runs_as_soon_as_it_is_approved() {
    let (_dir, rt) = runtime();
    let rt = Arc::new(rt);
    let bank = Arc::new(Bank::default());
    let call = {
        let (rt, bank) = (rt.clone(), bank.clone());
        tokio::spawn(async move {
            let ctx = rt.run("waits");
            wire_waiting(&ctx, "erin".into(), bank).await
        })
    };
    // The request appears while the call waits.
    let key = loop {
        if let Some(a) = rt.approvals().await.unwrap().pop() {
            break a.key;
        }
        assert!(
            !call.is_finished(),
            "the call returned without asking for approval: {:?}",
            call.await
        );
        tokio::task::yield_now().await;
    };
    assert!(!call.is_finished());
    assert_eq!(bank.wires(), 0);
    rt.approve(&key, "go").await.unwrap();
    let out = call.await.unwrap().unwrap();
    assert_eq!(out, "wired to erin");
    assert_eq!(bank.wires(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_waiting_call_gives_up_at_its_bound_and_a_later_call_waits_again() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("waits-2");
    let bank = Arc::new(Bank::default());
    let started = tokio::time::Instant::now();
    let err = wire_waiting(&ctx, "frank".into(), bank.clone())
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::AwaitingApproval { .. }), "{err:?}");
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(590),
        "returned after {:?}, before approval_wait",
        started.elapsed()
    );
    let err = wire_waiting(&ctx, "frank".into(), bank.clone())
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::AwaitingApproval { .. }), "{err:?}");
    assert_eq!(approvals_requested(&events(&rt).await), 1);
    assert_eq!(bank.wires(), 0);
}

#[tokio::test]
async fn approval_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let bank = Arc::new(Bank::default());
    let key = {
        let rt = Runtime::open(dir.path()).unwrap();
        let ctx = rt.run("reopen");
        let err = send_letter(&ctx, "gus".into(), "hi".into(), bank.clone())
            .await
            .unwrap_err();
        let ToolError::AwaitingApproval { key } = err else {
            panic!("{err:?}");
        };
        key
    };
    let rt = Runtime::open(dir.path()).unwrap();
    assert_eq!(rt.approvals().await.unwrap().len(), 1);
    rt.approve(&key, "ok after the restart").await.unwrap();
    drop(rt);
    let rt = Runtime::open(dir.path()).unwrap();
    let ctx = rt.run("reopen");
    send_letter(&ctx, "gus".into(), "hi".into(), bank.clone())
        .await
        .unwrap();
    assert_eq!(bank.wires(), 1);
    assert_eq!(approvals_requested(&events(&rt).await), 1);
}

#[tokio::test]
async fn a_model_calling_by_name_is_told_to_call_again_unchanged_and_then_reads_the_note() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("model");
    let args = serde_json::json!({ "to": "hal", "body": "open the doors" });
    let err = idem::dispatch(&ctx, "notify", args.clone())
        .await
        .unwrap_err();
    let shown = err.to_json();
    assert_eq!(shown["error"], "awaiting_approval", "{shown}");
    assert_eq!(shown["retryable"], true, "{shown}");
    assert!(
        shown["advice"]
            .as_str()
            .unwrap()
            .contains("exactly the same arguments"),
        "{shown}"
    );
    let key = idem::IdemKey::parse(shown["key"].as_str().unwrap()).unwrap();
    rt.reject(&key, "I'm sorry, Dave").await.unwrap();
    let err = idem::dispatch(&ctx, "notify", args).await.unwrap_err();
    let shown = err.to_json();
    assert_eq!(shown["error"], "not_approved", "{shown}");
    assert_eq!(shown["note"], "I'm sorry, Dave", "{shown}");
    assert_eq!(shown["retryable"], false, "{shown}");
    assert_eq!(NOTIFIED.load(Ordering::SeqCst), 0);
}
