//! `#[tool]` tools of every class run through the real runtime (sled in a
//! temporary directory): what the generated wrapper must guarantee.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::{
    tool, Class, Classify, Ctx, EventKind, Failure, KeyPart, OnDrift, Runtime, ToolError, Verdict,
};
use idem_testkit::engine::events;
use serde::{Deserialize, Serialize};

/// A provider failure the test scripts.
#[derive(Debug, Clone, PartialEq)]
enum Fail {
    NotSent,
    Ambiguous,
    Declined(String),
}

impl Classify for Fail {
    fn classify(&self) -> Failure {
        match self {
            Fail::NotSent => Failure::not_sent(),
            Fail::Ambiguous => Failure::ambiguous(),
            Fail::Declined(_) => Failure::Semantic,
        }
    }
}

/// What each attempt saw, shared with the test through an `Arc` argument
/// (recorded by type name only, so it takes no part in drift).
#[derive(Default)]
struct Probe {
    calls: AtomicUsize,
    seen: Mutex<Vec<(String, u32)>>,
    /// Failures to return, first attempt first; then success.
    script: Mutex<Vec<Fail>>,
}

impl Probe {
    fn scripted(failures: &[Fail]) -> Arc<Probe> {
        Arc::new(Probe {
            script: Mutex::new(failures.iter().rev().cloned().collect()),
            ..Probe::default()
        })
    }

    /// Records the attempt; fails as scripted.
    fn attempt(&self, ctx: &Ctx) -> Result<(), Fail> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let key = ctx
            .try_idempotency_key()
            .map_or_else(String::new, |k| k.to_string());
        self.seen.lock().unwrap().push((key, ctx.attempt()));
        match self.script.lock().unwrap().pop() {
            Some(f) => Err(f),
            None => Ok(()),
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn attempts(&self) -> Vec<u32> {
        self.seen.lock().unwrap().iter().map(|(_, n)| *n).collect()
    }

    fn keys(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|(k, _)| k.clone())
            .collect()
    }
}

fn runtime() -> (tempfile::TempDir, Runtime) {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(dir.path()).unwrap();
    (dir, rt)
}

#[tool(
    class = "provider",
    key = "order_id, amount_cents",
    retry(max_attempts = 4, initial = "10ms", jitter = false)
)]
async fn charge(
    ctx: &Ctx,
    order_id: u64,
    amount_cents: i64,
    note: String,
    probe: Arc<Probe>,
) -> Result<String, Fail> {
    probe.attempt(ctx)?;
    Ok(format!("ch_{order_id}_{amount_cents}_{note}"))
}

#[tokio::test(start_paused = true)]
async fn key_is_identical_on_every_attempt() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("order-4711");
    let probe = Probe::scripted(&[Fail::NotSent, Fail::Ambiguous]);
    let out = charge(&ctx, 4711, 1999, "a".into(), probe.clone())
        .await
        .unwrap();
    assert_eq!(out, "ch_4711_1999_a");
    let seen = probe.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen.iter().map(|s| s.1).collect::<Vec<_>>(), [1, 2, 3]);
    assert!(seen[0].0.starts_with("charge-"), "{}", seen[0].0);
    assert!(seen.iter().all(|s| s.0 == seen[0].0), "{seen:?}");
}

#[tokio::test]
async fn committed_call_replays_without_running_the_body() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("order-1");
    let probe = Probe::scripted(&[]);
    let first = charge(&ctx, 1, 500, "x".into(), probe.clone())
        .await
        .unwrap();
    let again = charge(&ctx, 1, 500, "x".into(), probe.clone())
        .await
        .unwrap();
    assert_eq!(first, again);
    assert_eq!(probe.calls(), 1);
    assert!(events(&rt).await.contains(&EventKind::DedupeHit));

    // A subagent shares the root run's dedupe scope; a scope does not.
    let sub = ctx.child("refund-agent");
    charge(&sub, 1, 500, "x".into(), probe.clone())
        .await
        .unwrap();
    assert_eq!(probe.calls(), 1);
    charge(&ctx.scope("second"), 1, 500, "x".into(), probe.clone())
        .await
        .unwrap();
    assert_eq!(probe.calls(), 2);
    let keys = probe.keys();
    assert_ne!(keys[0], keys[1]);
}

#[tokio::test]
async fn the_key_depends_only_on_declared_fields() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("order-2");
    let probe = Probe::scripted(&[]);
    let first = charge(&ctx, 2, 700, "first".into(), probe.clone())
        .await
        .unwrap();
    // Same key fields, different `note`: the first operation is replayed
    // and the drift is audited.
    let drifted = charge(&ctx, 2, 700, "second".into(), probe.clone())
        .await
        .unwrap();
    assert_eq!(drifted, first);
    assert_eq!(probe.calls(), 1);
    assert!(events(&rt).await.iter().any(|e| matches!(
        e,
        EventKind::ArgsDrift {
            policy: OnDrift::Replay
        }
    )));
    // A different key field is a different operation.
    charge(&ctx, 2, 701, "first".into(), probe.clone())
        .await
        .unwrap();
    charge(&ctx, 3, 700, "first".into(), probe.clone())
        .await
        .unwrap();
    assert_eq!(probe.calls(), 3);
    let keys = probe.keys();
    assert_ne!(keys[0], keys[1]);
    assert_ne!(keys[0], keys[2]);
    assert_ne!(keys[1], keys[2]);
}

#[tool(
    class = "journal",
    key = "order_id",
    verify = "none",
    on_drift = "reject"
)]
async fn refund(ctx: &Ctx, order_id: u64, reason: String, probe: Arc<Probe>) -> Result<u64, Fail> {
    probe.attempt(ctx)?;
    let _ = reason;
    Ok(order_id)
}

#[tokio::test]
async fn on_drift_reject_refuses_other_arguments_under_the_same_key() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("order-3");
    let probe = Probe::scripted(&[]);
    assert_eq!(
        refund(&ctx, 3, "damaged".into(), probe.clone())
            .await
            .unwrap(),
        3
    );
    assert_eq!(
        refund(&ctx, 3, "damaged".into(), probe.clone())
            .await
            .unwrap(),
        3
    );
    let err = refund(&ctx, 3, "late".into(), probe.clone())
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::ArgsMismatch { .. }), "{err:?}");
    assert_eq!(
        err.key().map(|k| k.to_string()),
        Some(probe.keys()[0].clone())
    );
    assert_eq!(probe.calls(), 1);
}

#[tool(
    class = "at_most_once",
    key = "account",
    redact = "card, pin",
    timeout = "50ms"
)]
async fn wire(
    ctx: &Ctx,
    account: String,
    card: String,
    pin: u32,
    cents: u64,
    probe: Arc<Probe>,
) -> Result<(), Fail> {
    let _ = (card, pin, cents);
    probe.attempt(ctx)?;
    if account == "slow" {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
    Ok(())
}

#[tokio::test]
async fn redacted_arguments_never_reach_the_evidence() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("wire-1");
    let probe = Probe::scripted(&[Fail::Ambiguous]);
    let err = wire(
        &ctx,
        "DE89".into(),
        "4242424242424242".into(),
        987_654,
        12_345,
        probe.clone(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ToolError::Escalated { .. }), "{err:?}");
    assert_eq!(
        probe.calls(),
        1,
        "at_most_once never retries an ambiguous failure"
    );

    let escalations = rt.escalations().await.unwrap();
    assert_eq!(escalations.len(), 1);
    let e = &escalations[0];
    assert_eq!(e.class, Class::AtMostOnce);
    assert_eq!(e.args["account"], "DE89");
    assert_eq!(e.args["cents"], 12_345);
    assert_eq!(e.args["card"], "<redacted>");
    assert_eq!(e.args["pin"], "<redacted>");
    let evidence = serde_json::to_string(&escalations).unwrap();
    assert!(!evidence.contains("4242"), "{evidence}");
    assert!(!evidence.contains("987654"), "{evidence}");
    let mut audit = Vec::new();
    rt.export_audit(0, &mut audit).await.unwrap();
    let audit = String::from_utf8(audit).unwrap();
    assert!(
        !audit.contains("4242") && !audit.contains("987654"),
        "{audit}"
    );
}

#[tokio::test(start_paused = true)]
async fn timeout_makes_an_overrunning_attempt_ambiguous() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("wire-2");
    let probe = Probe::scripted(&[]);
    let started = tokio::time::Instant::now();
    let err = wire(&ctx, "slow".into(), "4242".into(), 1, 1, probe.clone())
        .await
        .unwrap_err();
    let ToolError::Escalated { reason, .. } = &err else {
        panic!("expected an escalation, got {err:?}");
    };
    assert!(reason.contains("timed out"), "{reason}");
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(probe.calls(), 1);
}

/// A provider tool whose first attempt hangs: the timeout makes it
/// ambiguous, and the provider class re-runs it under the same key.
#[tool(
    class = "provider",
    key = "id",
    timeout = "100ms",
    retry(initial = "10ms")
)]
async fn flaky_upload(ctx: &Ctx, id: u32, probe: Arc<Probe>) -> Result<u32, Fail> {
    probe.attempt(ctx)?;
    if ctx.attempt() == 1 {
        tokio::time::sleep(Duration::from_secs(60)).await;
    }
    Ok(id)
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_provider_attempt_is_retried_with_the_same_key() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("upload");
    let probe = Probe::scripted(&[]);
    assert_eq!(flaky_upload(&ctx, 9, probe.clone()).await.unwrap(), 9);
    assert_eq!(probe.calls(), 2);
    let keys = probe.keys();
    assert_eq!(keys[0], keys[1]);
    assert!(events(&rt).await.iter().any(
        |e| matches!(e, EventKind::Retry { failure, error, .. } if failure == "ambiguous" && error.contains("timed out"))
    ));
}

/// A mail provider that does not deduplicate: the journal does, and asks
/// `landed` before re-running an ambiguous send.
struct Mailer {
    sent: Mutex<BTreeMap<String, String>>,
    sends: AtomicUsize,
    verifies: AtomicUsize,
    /// The first send lands but its answer is lost.
    lose_first_answer: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    id: String,
    to: String,
}

#[tool]
impl Mailer {
    #[tool(class = "journal", timeout = "30s", key = "to, template, order_id", verify = landed, retry(initial = "5ms"))]
    async fn send_email(
        &self,
        ctx: &Ctx,
        to: &str,
        template: String,
        order_id: u64,
        body: String,
    ) -> Result<Receipt, Fail> {
        let _ = body;
        let n = self.sends.fetch_add(1, Ordering::SeqCst);
        let key = ctx.idempotency_key().to_string();
        let receipt = Receipt {
            id: format!("msg-{template}-{order_id}-{n}"),
            to: to.to_string(),
        };
        self.sent.lock().unwrap().insert(key, receipt.id.clone());
        if self.lose_first_answer && n == 0 {
            return Err(Fail::Ambiguous);
        }
        Ok(receipt)
    }

    async fn landed(&self, ctx: &Ctx) -> Result<Verdict<Receipt>, Fail> {
        self.verifies.fetch_add(1, Ordering::SeqCst);
        let key = ctx.idempotency_key().to_string();
        Ok(match self.sent.lock().unwrap().get(&key) {
            Some(id) => Verdict::Landed(Receipt {
                id: id.clone(),
                to: "found-by-verify".into(),
            }),
            None => Verdict::NotLanded,
        })
    }
}

#[tokio::test(start_paused = true)]
async fn method_tool_asks_its_method_verify_before_re_running() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("order-5");
    let mailer = Mailer {
        sent: Mutex::default(),
        sends: AtomicUsize::new(0),
        verifies: AtomicUsize::new(0),
        lose_first_answer: true,
    };
    let receipt = mailer
        .send_email(&ctx, "a@example.com", "receipt".into(), 5, "hi".into())
        .await
        .unwrap();
    // The lost answer is recovered by verify, under the attempt's key; the
    // email is not sent twice.
    assert_eq!(receipt.id, "msg-receipt-5-0");
    assert_eq!(receipt.to, "found-by-verify");
    assert_eq!(mailer.sends.load(Ordering::SeqCst), 1);
    assert_eq!(mailer.verifies.load(Ordering::SeqCst), 1);
    // Committed: replayed without sending or verifying.
    let again = mailer
        .send_email(
            &ctx,
            "a@example.com",
            "receipt".into(),
            5,
            "other body".into(),
        )
        .await
        .unwrap();
    assert_eq!(again, receipt);
    assert_eq!(mailer.sends.load(Ordering::SeqCst), 1);
    assert_eq!(mailer.verifies.load(Ordering::SeqCst), 1);
}

#[tool(class = "journal", key = "id", verify = "none", retry(initial = "1ms"))]
async fn unverifiable(ctx: &Ctx, id: u8, probe: Arc<Probe>) -> Result<u8, Fail> {
    probe.attempt(ctx)?;
    Ok(id)
}

#[tokio::test]
async fn verify_none_escalates_an_unknown_outcome() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("nv");
    let probe = Probe::scripted(&[Fail::Ambiguous]);
    let err = unverifiable(&ctx, 1, probe.clone()).await.unwrap_err();
    assert!(matches!(err, ToolError::Escalated { .. }), "{err:?}");
    assert_eq!(probe.calls(), 1);
    // NotSent is safe to retry even without verify.
    let probe = Probe::scripted(&[Fail::NotSent]);
    assert_eq!(unverifiable(&ctx, 2, probe.clone()).await.unwrap(), 2);
    assert_eq!(probe.calls(), 2);
}

/// Field paths and composite key fields.
#[derive(Debug, Clone, Serialize)]
struct Order {
    shop: String,
    number: u64,
    lines: Vec<(String, u32)>,
    comment: Option<String>,
}

#[tool(
    class = "provider",
    key = "order.shop, order.number, tags, pair.1",
    retry(max_attempts = 1)
)]
async fn place(
    ctx: &Ctx,
    order: Order,
    tags: Option<Vec<String>>,
    pair: (u8, char),
    probe: Arc<Probe>,
) -> Result<usize, Fail> {
    probe.attempt(ctx)?;
    Ok(order.lines.len() + usize::from(pair.0))
}

#[tokio::test]
async fn field_path_keys_ignore_the_other_fields() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("shop");
    let probe = Probe::scripted(&[]);
    let order = Order {
        shop: "berlin".into(),
        number: 7,
        lines: vec![("apple".into(), 2)],
        comment: None,
    };
    let tags = Some(vec!["gift".to_string()]);
    assert_eq!(
        place(&ctx, order.clone(), tags.clone(), (1, 'x'), probe.clone())
            .await
            .unwrap(),
        2
    );
    // Other lines, another comment, another pair.0: same operation.
    let edited = Order {
        lines: vec![],
        comment: Some("ring twice".into()),
        ..order.clone()
    };
    assert_eq!(
        place(&ctx, edited, tags.clone(), (9, 'x'), probe.clone())
            .await
            .unwrap(),
        2
    );
    assert_eq!(probe.calls(), 1);
    // Each key field counts.
    place(
        &ctx,
        Order {
            number: 8,
            ..order.clone()
        },
        tags.clone(),
        (1, 'x'),
        probe.clone(),
    )
    .await
    .unwrap();
    place(
        &ctx,
        Order {
            shop: "paris".into(),
            ..order.clone()
        },
        tags.clone(),
        (1, 'x'),
        probe.clone(),
    )
    .await
    .unwrap();
    place(&ctx, order.clone(), None, (1, 'x'), probe.clone())
        .await
        .unwrap();
    place(&ctx, order.clone(), tags.clone(), (1, 'y'), probe.clone())
        .await
        .unwrap();
    assert_eq!(probe.calls(), 5);
    let mut keys = probe.keys();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 5);
}

/// A renamed function keeping its stable `name`, with its key parameter
/// changed from `&str` to `String`: the key is the one the old build
/// (`async fn notify(ctx, user: &str)`) derived, so operations already in
/// the journal keep deduplicating.
#[tool(class = "provider", name = "notify", key = "user")]
async fn notify_v2(ctx: &Ctx, user: String, probe: Arc<Probe>) -> Result<String, Fail> {
    probe.attempt(ctx)?;
    Ok(format!("v2:{user}"))
}

#[tokio::test]
async fn the_name_argument_is_the_stable_tool_id() {
    /// The old build's tool, as the key derivation saw it.
    static OLD_NOTIFY: idem::ToolDescriptor = idem::ToolDescriptor::new("notify", Class::Provider);
    let (_dir, rt) = runtime();
    let ctx = rt.run("n");
    let probe = Probe::scripted(&[]);
    assert_eq!(
        notify_v2(&ctx, "ann".into(), probe.clone()).await.unwrap(),
        "v2:ann"
    );
    let old_key = idem::__private::key(&ctx, &OLD_NOTIFY)
        .field("ann")
        .finish();
    assert_eq!(probe.keys(), [old_key.as_str()]);
    assert!(idem::tools().all(|t| t.name != "notify_v2"));
}

/// Generic over the key type and the result.
#[tool(class = "journal", key = "id", verify = "none")]
async fn remember<K, V>(ctx: &Ctx, id: K, value: V, probe: Arc<Probe>) -> Result<V, Fail>
where
    K: KeyPart + Serialize + Clone + Send + Sync,
    V: Serialize + serde::de::DeserializeOwned + Clone + Send,
{
    probe.attempt(ctx)?;
    let _ = id;
    Ok(value)
}

#[tokio::test]
async fn generic_tools_key_each_instantiation_by_its_fields() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("g");
    let probe = Probe::scripted(&[]);
    assert_eq!(
        remember(&ctx, 1u64, "one".to_string(), probe.clone())
            .await
            .unwrap(),
        "one"
    );
    assert_eq!(
        remember(&ctx, 1u64, "uno".to_string(), probe.clone())
            .await
            .unwrap(),
        "one"
    );
    assert_eq!(
        remember(&ctx, "k".to_string(), vec![1u8, 2], probe.clone())
            .await
            .unwrap(),
        [1, 2]
    );
    assert_eq!(remember(&ctx, 1u32, 5i64, probe.clone()).await.unwrap(), 5);
    assert_eq!(probe.calls(), 3, "u64 1 and u32 1 encode differently");
}

#[tool(class = "read_only", retry(max_attempts = 3, initial = "1ms"))]
async fn lookup(ctx: &Ctx, sku: String, probe: Arc<Probe>) -> Result<usize, Fail> {
    probe.attempt(ctx)?;
    Ok(sku.len())
}

#[tokio::test]
async fn read_only_tools_retry_without_a_key_or_journal() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("ro");
    let probe = Probe::scripted(&[Fail::Ambiguous, Fail::NotSent]);
    assert_eq!(lookup(&ctx, "abc".into(), probe.clone()).await.unwrap(), 3);
    assert_eq!(probe.calls(), 3);
    assert!(
        probe.keys().iter().all(String::is_empty),
        "read_only calls carry no key"
    );
    assert_eq!(probe.attempts(), [1, 2, 3], "each attempt knows its number");
    // Not journaled: runs again.
    lookup(&ctx, "abc".into(), probe.clone()).await.unwrap();
    assert_eq!(probe.calls(), 4);
    assert!(rt.audit(0).await.unwrap().iter().all(|e| e.key.is_none()));
    // Semantic failures are returned at once.
    let probe = Probe::scripted(&[Fail::Declined("no such sku".into())]);
    let err = lookup(&ctx, "zzz".into(), probe.clone()).await.unwrap_err();
    assert_eq!(
        err.tool_error(),
        Some(&Fail::Declined("no such sku".into()))
    );
    assert_eq!(probe.calls(), 1);
}

/// `return` and `?` in the body keep the body's own `Result<T, E>`.
#[tool(class = "provider", key = "n", retry(max_attempts = 1))]
async fn parse_amount(ctx: &Ctx, n: u32, text: String) -> Result<u64, Fail> {
    let _ = ctx;
    if text.is_empty() {
        return Err(Fail::Declined("empty".into()));
    }
    let cents: u64 = text
        .parse()
        .map_err(|_| Fail::Declined(format!("not a number: {text}")))?;
    let checked = check(cents)?;
    Ok(checked + u64::from(n))
}

fn check(cents: u64) -> Result<u64, Fail> {
    if cents == 0 {
        Err(Fail::Declined("zero".into()))
    } else {
        Ok(cents)
    }
}

#[tokio::test]
async fn return_and_question_mark_work_in_the_body() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("p");
    assert_eq!(parse_amount(&ctx, 1, "41".into()).await.unwrap(), 42);
    let e = parse_amount(&ctx, 2, String::new()).await.unwrap_err();
    assert_eq!(e.tool_error(), Some(&Fail::Declined("empty".into())));
    let e = parse_amount(&ctx, 3, "x".into()).await.unwrap_err();
    assert_eq!(
        e.tool_error(),
        Some(&Fail::Declined("not a number: x".into()))
    );
    let e = parse_amount(&ctx, 4, "0".into()).await.unwrap_err();
    assert_eq!(e.tool_error(), Some(&Fail::Declined("zero".into())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_futures_can_be_spawned() {
    let (_dir, rt) = runtime();
    let probe = Probe::scripted(&[]);
    let mut tasks = Vec::new();
    for i in 0..8u64 {
        let ctx = rt.run("spawned");
        let probe = probe.clone();
        tasks.push(tokio::spawn(async move {
            charge(&ctx, i % 4, 100, "s".into(), probe).await
        }));
    }
    for t in tasks {
        let r = t.await.unwrap();
        // Concurrent calls of one key either share the result or are told
        // it is in flight.
        assert!(
            matches!(r, Ok(_) | Err(ToolError::InFlight { .. })),
            "{r:?}"
        );
    }
    assert_eq!(probe.calls(), 4);
}

#[test]
fn descriptors_are_registered_with_their_settings() {
    let find = |name: &str| {
        idem::tools()
            .find(|t| t.name == name && t.file.ends_with("macro_tools.rs"))
            .unwrap_or_else(|| panic!("tool {name} not registered"))
    };
    let c = find("charge");
    assert_eq!(c.class, Class::Provider);
    assert_eq!(c.key_fields, ["order_id", "amount_cents"]);
    assert_eq!(c.dedupe_window, Duration::from_secs(24 * 3600));
    assert_eq!(c.retry.max_attempts, 4);
    assert_eq!(c.retry.initial, Duration::from_millis(10));
    // Temporal: the cap follows a given initial interval, ×100.
    assert_eq!(c.retry.max_interval, Duration::from_secs(1));
    assert_eq!(c.retry.max_elapsed, Some(Duration::from_secs(3600)));
    assert!(!c.retry.jitter);
    assert_eq!(c.retry.backoff, 2.0);
    assert_eq!(c.timeout, None);
    assert_eq!(c.on_drift, OnDrift::Replay);
    assert_eq!(c.verify, None);
    assert!(c.module_path.ends_with("macro_tools"), "{}", c.module_path);
    assert!(c.line > 0);

    let w = find("wire");
    assert_eq!(w.class, Class::AtMostOnce);
    assert_eq!(w.redact, ["card", "pin"]);
    assert_eq!(w.timeout, Some(Duration::from_millis(50)));
    assert_eq!(w.retry, idem::RetryPolicy::DEFAULT);

    // Named by `#[tool]` on its `impl` block.
    let m = find("Mailer::send_email");
    assert_eq!(m.class, Class::Journal);
    assert_eq!(m.key_fields, ["to", "template", "order_id"]);
    assert_eq!(m.verify, Some("landed"));

    let r = find("refund");
    assert_eq!(r.on_drift, OnDrift::Reject);
    assert_eq!(r.verify, Some("none"));

    assert_eq!(
        find("place").key_fields,
        ["order.shop", "order.number", "tags", "pair.1"]
    );
    assert_eq!(find("lookup").class, Class::ReadOnly);
    assert!(find("lookup").key_fields.is_empty());
    assert_eq!(find("notify").key_fields, ["user"]);
    assert_eq!(find("shapes::Svc::describe").class, Class::Journal);
}

#[tool(
    class = "provider",
    key = "id",
    dedupe_window = "7d",
    retry(
        max_attempts = 10,
        initial = "250ms",
        backoff = 1.5,
        max_interval = "30s",
        max_elapsed = "2h"
    )
)]
async fn every_setting(ctx: &Ctx, id: u64) -> Result<(), Fail> {
    let _ = (ctx, id);
    Ok(())
}

#[test]
fn explicit_settings_reach_the_descriptor() {
    let t = idem::tools().find(|t| t.name == "every_setting").unwrap();
    assert_eq!(t.dedupe_window, Duration::from_secs(7 * 86_400));
    assert_eq!(
        t.retry,
        idem::RetryPolicy {
            max_attempts: 10,
            initial: Duration::from_millis(250),
            backoff: 1.5,
            max_interval: Duration::from_secs(30),
            max_elapsed: Some(Duration::from_secs(7200)),
            jitter: true,
        }
    );
}

/// Signature shapes that must expand without warnings (this file is built
/// with `cargo clippy --all-targets -- -D warnings`).
mod shapes {
    use std::fmt::Display;

    use idem::{tool, Ctx};

    use super::Fail;

    /// `order_id` is only a key field and `ctx` is unused: neither warns.
    #[tool(class = "provider", key = "order_id")]
    pub async fn key_only(ctx: &Ctx, order_id: u64) -> Result<(), Fail> {
        Ok(())
    }

    #[tool(class = "read_only")]
    pub async fn unnamed_ctx(_: &Ctx, mut words: Vec<String>) -> Result<String, Fail> {
        words.sort();
        Ok(words.join(" "))
    }

    #[tool(class = "provider", key = "tenant, name")]
    pub async fn lifetimes<'a, 'b: 'a>(
        ctx: &'a Ctx,
        tenant: &'a str,
        name: &'b str,
    ) -> Result<String, Fail> {
        Ok(format!("{}:{tenant}/{name}", ctx.attempt()))
    }

    #[tool(class = "read_only")]
    pub async fn impl_trait(
        _ctx: &Ctx,
        what: impl Display + Clone + Send + Sync,
    ) -> Result<String, Fail> {
        Ok(what.to_string())
    }

    #[tool(class = "provider", key = "bytes")]
    pub async fn const_generic<const N: usize>(_ctx: &Ctx, bytes: [u8; N]) -> Result<usize, Fail> {
        Ok(bytes.len())
    }

    pub struct Svc<T> {
        pub inner: T,
    }

    impl<T: Display + Send + Sync> Svc<T> {
        #[tool(
            class = "journal",
            name = "shapes::Svc::describe",
            key = "id",
            verify = self::found,
            timeout = "30s"
        )]
        pub async fn describe(&self, ctx: &Ctx, id: u32) -> Result<String, Fail> {
            let _ = ctx;
            Ok(format!("{}#{id}", self.inner))
        }
    }

    pub async fn found(_ctx: &Ctx) -> Result<idem::Verdict<String>, Fail> {
        Ok(idem::Verdict::NotLanded)
    }
}

#[tokio::test]
async fn signature_shapes_run() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("shapes");
    shapes::key_only(&ctx, 1).await.unwrap();
    assert_eq!(
        shapes::unnamed_ctx(&ctx, vec!["b".into(), "a".into()])
            .await
            .unwrap(),
        "a b"
    );
    let tenant = String::from("acme");
    assert_eq!(
        shapes::lifetimes(&ctx, &tenant, "inbox").await.unwrap(),
        "1:acme/inbox"
    );
    assert_eq!(shapes::impl_trait(&ctx, 7).await.unwrap(), "7");
    assert_eq!(shapes::const_generic(&ctx, [0u8; 4]).await.unwrap(), 4);
    let svc = shapes::Svc { inner: "svc" };
    assert_eq!(svc.describe(&ctx, 3).await.unwrap(), "svc#3");
}

/// Hangs on its first attempt until the caller gives up on it.
#[tool(class = "provider", key = "id", retry(initial = "1ms"))]
async fn hang_first_provider(ctx: &Ctx, id: u32, probe: Arc<Probe>) -> Result<u32, Fail> {
    probe.attempt(ctx)?;
    if probe.calls() == 1 {
        std::future::pending::<()>().await;
    }
    Ok(id)
}

#[tool(class = "at_most_once", key = "id")]
async fn hang_first_once(ctx: &Ctx, id: u32, probe: Arc<Probe>) -> Result<u32, Fail> {
    probe.attempt(ctx)?;
    if probe.calls() == 1 {
        std::future::pending::<()>().await;
    }
    Ok(id)
}

#[tokio::test(start_paused = true)]
async fn a_dropped_call_is_recovered_by_the_next_one() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("dropped");

    // Provider class: the caller gives up, the next call re-sends under the
    // same key (the provider deduplicates it).
    let probe = Probe::scripted(&[]);
    let gave_up = tokio::time::timeout(
        Duration::from_secs(1),
        hang_first_provider(&ctx, 1, probe.clone()),
    )
    .await;
    assert!(gave_up.is_err());
    assert_eq!(
        hang_first_provider(&ctx, 1, probe.clone()).await.unwrap(),
        1
    );
    let keys = probe.keys();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1]);

    // At-most-once: the dropped attempt may have landed; never re-run.
    let probe = Probe::scripted(&[]);
    let gave_up = tokio::time::timeout(
        Duration::from_secs(1),
        hang_first_once(&ctx, 2, probe.clone()),
    )
    .await;
    assert!(gave_up.is_err());
    let err = hang_first_once(&ctx, 2, probe.clone()).await.unwrap_err();
    assert!(matches!(err, ToolError::Escalated { .. }), "{err:?}");
    assert_eq!(probe.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_concurrent_call_of_the_same_key_waits_and_replays() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("concurrent");
    let probe = Probe::scripted(&[Fail::NotSent]);
    // The first call backs off (10 ms) after a NotSent failure while the
    // second arrives: one execution, one result.
    let (a, b) = tokio::join!(
        charge(&ctx, 77, 1, "a".into(), probe.clone()),
        charge(&ctx, 77, 1, "a".into(), probe.clone()),
    );
    assert_eq!(a.unwrap(), b.unwrap());
    assert_eq!(probe.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_key_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let probe = Probe::scripted(&[]);
    {
        let rt = Runtime::open(dir.path()).unwrap();
        let ctx = rt.run("restart");
        // The process "dies" with the first attempt in flight.
        let gave_up = tokio::time::timeout(
            Duration::from_secs(1),
            hang_first_provider(&ctx, 5, probe.clone()),
        )
        .await;
        assert!(gave_up.is_err());
    }
    let rt = Runtime::open(dir.path()).unwrap();
    let ctx = rt.run("restart");
    assert_eq!(
        hang_first_provider(&ctx, 5, probe.clone()).await.unwrap(),
        5
    );
    let seen = probe.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].0, seen[1].0, "same key after the restart");
    assert_eq!(seen[1].1, 2, "the attempt count is durable");
    // Committed: a third process replays it.
    drop((ctx, rt));
    let rt = Runtime::open(dir.path()).unwrap();
    assert_eq!(
        hang_first_provider(&rt.run("restart"), 5, probe.clone())
            .await
            .unwrap(),
        5
    );
    assert_eq!(probe.calls(), 2);
}
