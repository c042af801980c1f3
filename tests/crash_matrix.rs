//! `idem::testing` on small tools of each journaled class, with fake
//! providers of their own: the crash matrix holds for honest ones, and
//! fails, naming the crash point, for a provider that does not deduplicate
//! behind a `provider` tool and for a `verify` that does not look.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use idem::testing::{
    CrashMatrix, CrashPoint, Fault, FaultJournal, Ledger, MatrixError, PausedClock, Violation,
};
use idem::{tool, Classify, Ctx, Error, Failure, Runtime, ToolError, Verdict};

/// The providers here never refuse; a tool still needs an error type.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ApiError;

impl Classify for ApiError {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

/// A fake provider's ledger: every effect it applied, by idempotency key.
#[derive(Clone, Default)]
struct Effects(Arc<Mutex<BTreeMap<String, usize>>>);

impl Effects {
    /// Applies the effect under `key`; with `dedupe`, a key seen before is
    /// replayed instead (Stripe's idempotency keys).
    fn apply(&self, key: &str, dedupe: bool) {
        let mut m = self.0.lock().unwrap();
        let n = m.entry(key.to_string()).or_insert(0);
        if !(dedupe && *n > 0) {
            *n += 1;
        }
    }

    fn landed(&self, key: &str) -> bool {
        self.0.lock().unwrap().contains_key(key)
    }
}

impl Ledger for Effects {
    fn effects(&self) -> usize {
        self.0.lock().unwrap().values().sum()
    }
}

/// Payments: deduplicates on the key, or (a mistake) does not.
#[derive(Clone, Default)]
struct Payments {
    effects: Effects,
    dedupe: bool,
}

impl Ledger for Payments {
    fn effects(&self) -> usize {
        self.effects.effects()
    }
}

fn payments() -> Payments {
    Payments {
        dedupe: true,
        ..Payments::default()
    }
}

#[tool(class = "provider", key = "order")]
async fn charge(ctx: &Ctx, payments: Payments, order: u64) -> Result<String, ApiError> {
    payments
        .effects
        .apply(ctx.idempotency_key().as_str(), payments.dedupe);
    Ok(format!("charged {order}"))
}

/// An email service: no dedupe, but a look-up by key (the tool's verify).
#[derive(Clone, Default)]
struct Mailbox {
    effects: Effects,
    /// A broken verify: never finds anything.
    blind: bool,
}

impl Ledger for Mailbox {
    fn effects(&self) -> usize {
        self.effects.effects()
    }
}

#[tool]
impl Mailbox {
    #[tool(class = "journal", key = "to", verify = sent, timeout = "10s")]
    async fn send(&self, ctx: &Ctx, to: String) -> Result<String, ApiError> {
        self.effects.apply(ctx.idempotency_key().as_str(), false);
        Ok(format!("sent to {to}"))
    }

    async fn sent(&self, ctx: &Ctx) -> Result<Verdict<String>, ApiError> {
        let landed = !self.blind && self.effects.landed(ctx.idempotency_key().as_str());
        Ok(if landed {
            Verdict::Landed("sent (found)".into())
        } else {
            Verdict::NotLanded
        })
    }
}

/// A bank: no dedupe, no look-up.
#[derive(Clone, Default)]
struct Bank {
    effects: Effects,
}

impl Ledger for Bank {
    fn effects(&self) -> usize {
        self.effects.effects()
    }
}

#[tool(class = "at_most_once", key = "transfer")]
async fn wire(ctx: &Ctx, bank: Bank, transfer: String) -> Result<String, ApiError> {
    bank.effects.apply(ctx.idempotency_key().as_str(), false);
    Ok(format!("wired {transfer}"))
}

#[tool(class = "read_only")]
async fn balance(_ctx: &Ctx) -> Result<u64, ApiError> {
    Ok(0)
}

#[tokio::test(start_paused = true)]
async fn a_provider_tool_with_a_deduplicating_provider_holds_at_every_crash_point() {
    let report = CrashMatrix::new("charge")
        .unwrap()
        .run(payments, async |p, ctx| charge(ctx, p.clone(), 4711).await)
        .await;
    println!("{report}");
    report.assert_holds();
    assert_eq!(report.points.len(), 4);
    for p in &report.points {
        assert_eq!(p.effects, 1, "{p}");
        assert_eq!(p.outcome, r#"Ok("charged 4711")"#, "{p}");
        assert!(p.parked.is_none(), "{p}");
    }
    let after_intent = report.point(CrashPoint::AfterIntent).unwrap();
    assert_eq!(after_intent.effects_at_crash, 0, "died before the provider");
    let after_provider = report.point(CrashPoint::AfterProvider).unwrap();
    assert_eq!(after_provider.effects_at_crash, 1, "died after it");
}

#[tokio::test(start_paused = true)]
async fn a_provider_that_does_not_deduplicate_fails_the_matrix_after_the_provider() {
    let report = CrashMatrix::new("charge")
        .unwrap()
        .run(Payments::default, async |p, ctx| {
            charge(ctx, p.clone(), 4711).await
        })
        .await;
    println!("{report}");
    assert!(!report.holds());
    let broken: Vec<CrashPoint> = report.violations().map(|p| p.point).collect();
    // Before the INTENT is durable or after the COMMIT, nothing is re-sent;
    // between them, the same key is sent again and the provider applies it
    // twice.
    assert_eq!(broken, [CrashPoint::AfterProvider]);
    let p = report.point(CrashPoint::AfterProvider).unwrap();
    assert!(
        matches!(p.violation, Some(Violation::Duplicated { count: 2 })),
        "{p}"
    );
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| report.assert_holds()))
        .unwrap_err();
    let message = panic.downcast_ref::<String>().unwrap();
    assert!(message.contains("after_provider"), "{message}");
    assert!(message.contains("class provider"), "{message}");
}

#[tokio::test(start_paused = true)]
async fn a_journal_tool_with_verify_holds_at_every_crash_point() {
    let report = CrashMatrix::new("Mailbox::send")
        .unwrap()
        .run(Mailbox::default, async |m, ctx| {
            m.send(ctx, "ann@example.com".into()).await
        })
        .await;
    println!("{report}");
    report.assert_holds();
    let p = report.point(CrashPoint::AfterProvider).unwrap();
    assert_eq!(p.outcome, r#"Ok("sent (found)")"#, "verify found it: {p}");
    assert!(report.points.iter().all(|p| p.parked.is_none()));
}

#[tokio::test(start_paused = true)]
async fn a_verify_that_does_not_look_fails_the_matrix_after_the_provider() {
    let blind = || Mailbox {
        blind: true,
        ..Mailbox::default()
    };
    let report = CrashMatrix::new("Mailbox::send")
        .unwrap()
        .run(blind, async |m, ctx| {
            m.send(ctx, "ann@example.com".into()).await
        })
        .await;
    println!("{report}");
    let broken: Vec<CrashPoint> = report.violations().map(|p| p.point).collect();
    assert_eq!(broken, [CrashPoint::AfterProvider]);
    let p = report.point(CrashPoint::AfterProvider).unwrap();
    assert!(
        matches!(p.violation, Some(Violation::Duplicated { count: 2 })),
        "{p}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_at_most_once_tool_parks_what_a_crash_left_in_doubt() {
    let report = CrashMatrix::new("wire")
        .unwrap()
        .landed_result(serde_json::json!("wired (settled by a human)"))
        .run(Bank::default, async |b, ctx| {
            wire(ctx, b.clone(), "tr-9".into()).await
        })
        .await;
    println!("{report}");
    report.assert_holds();
    let parked = |point| {
        report
            .point(point)
            .unwrap()
            .parked
            .as_ref()
            .map(|p| p.resolution)
    };
    assert_eq!(parked(CrashPoint::BeforeIntent), None);
    assert_eq!(parked(CrashPoint::AfterIntent), Some("reissue"));
    assert_eq!(parked(CrashPoint::AfterProvider), Some("landed"));
    assert_eq!(parked(CrashPoint::AfterCommit), None);
    let p = report.point(CrashPoint::AfterProvider).unwrap();
    assert_eq!(p.outcome, r#"Ok("wired (settled by a human)")"#, "{p}");
}

#[test]
fn the_matrix_refuses_tools_it_cannot_crash() {
    assert!(matches!(
        CrashMatrix::new("no_such_tool"),
        Err(MatrixError::UnknownTool { .. })
    ));
    assert!(matches!(
        CrashMatrix::new("balance"),
        Err(MatrixError::ReadOnly { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn a_failed_barrier_leaves_nothing_durable_and_the_provider_uncalled() {
    let journal = FaultJournal::new();
    journal.inject(Fault::FailSync(1));
    let clock = Arc::new(PausedClock::default());
    let p = payments();
    {
        let rt = Runtime::builder()
            .journal(journal.clone())
            .clock(clock.clone())
            .open()
            .unwrap();
        let err = charge(&rt.run("r"), p.clone(), 1).await.unwrap_err();
        assert!(
            matches!(err, ToolError::Journal(Error::Storage { .. })),
            "{err:?}"
        );
        assert_eq!(p.effects(), 0, "no provider call without a durable INTENT");
    }
    assert!(journal.log().contains(&"FAILED sync 1".to_string()));
    let journal = journal.restart();
    let rt = Runtime::builder()
        .journal(journal.clone())
        .clock(clock)
        .open()
        .unwrap();
    let key = idem::tools().find(|t| t.name == "charge").unwrap();
    assert_eq!(key.class, idem::Class::Provider);
    assert!(rt.escalations().await.unwrap().is_empty());
    assert_eq!(
        charge(&rt.run("r"), p.clone(), 1).await.unwrap(),
        "charged 1"
    );
    assert_eq!(p.effects(), 1);
}

#[tool(class = "provider", key = "order")]
async fn decline(_ctx: &Ctx, order: u64) -> Result<u64, ApiError> {
    let _ = order;
    Err(ApiError)
}

#[tokio::test(start_paused = true)]
async fn a_call_that_fails_breaks_the_matrix() {
    let report = CrashMatrix::new("decline")
        .unwrap()
        .points([CrashPoint::AfterProvider])
        .run(payments, async |_, ctx| decline(ctx, 1).await)
        .await;
    println!("{report}");
    let p = report.point(CrashPoint::AfterProvider).unwrap();
    assert!(matches!(p.violation, Some(Violation::Failed { .. })), "{p}");
}

#[tokio::test(start_paused = true)]
async fn a_refused_intent_write_calls_no_provider() {
    let journal = FaultJournal::new();
    journal.inject(Fault::RefuseWrite(1));
    let rt = Runtime::builder()
        .journal(journal.clone())
        .clock(Arc::new(PausedClock::default()))
        .open()
        .unwrap();
    let p = payments();
    let err = charge(&rt.run("r"), p.clone(), 1).await.unwrap_err();
    assert!(
        matches!(err, ToolError::Journal(Error::Storage { .. })),
        "{err:?}"
    );
    assert_eq!(p.effects(), 0);
    assert_eq!(journal.log()[0], "FAILED write 1 create ops");
    // Healed, the same call goes through.
    assert_eq!(
        charge(&rt.run("r"), p.clone(), 1).await.unwrap(),
        "charged 1"
    );
    assert_eq!(p.effects(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_intent_that_landed_but_reported_an_error_calls_no_provider_until_retried() {
    let journal = FaultJournal::new();
    journal.inject(Fault::FailAfterWrite(1));
    let rt = Runtime::builder()
        .journal(journal.clone())
        .clock(Arc::new(PausedClock::default()))
        .open()
        .unwrap();
    let p = payments();
    // The INTENT is in the journal, but its write said it failed: the call
    // cannot know it is durable, so the provider is not called.
    let err = charge(&rt.run("r"), p.clone(), 1).await.unwrap_err();
    assert!(
        matches!(err, ToolError::Journal(Error::Storage { .. })),
        "{err:?}"
    );
    assert_eq!(p.effects(), 0);
    // The next call of the same key takes what is there over and charges
    // once (the provider deduplicates the key in any case).
    assert_eq!(
        charge(&rt.run("r"), p.clone(), 1).await.unwrap(),
        "charged 1"
    );
    assert_eq!(p.effects(), 1);
}
