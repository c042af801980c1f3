//! Regression tests of the hardening review, one per finding: each failed
//! on the engine and journal before their fixes. Time is tokio's paused
//! clock unless a test says otherwise.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use idem_runtime::__private::{self, ErrorHooks};
use idem_runtime::{
    Class, Ctx, Error, EventKind, Resolution, Runtime, SledJournal, ToolDescriptor, ToolError,
};
use serde::{Deserialize, Serialize};
use tempfile::TempDir;

/// `call`, with explicit error hooks (as `#[tool]` derives them).
async fn call_hooked(
    ctx: &Ctx,
    tool: &'static ToolDescriptor,
    p: &Provider,
    hooks: ErrorHooks<TestError>,
) -> Result<String, ToolError<TestError>> {
    let p = p.clone();
    let attempt = move |c: Ctx| {
        let p = p.clone();
        async move { p.handle(&c, "a").await }
    };
    __private::call_with(
        ctx,
        tool,
        key(ctx, tool, 1),
        args(1, "a"),
        attempt,
        None::<fn(Ctx) -> std::future::Ready<_>>,
        hooks,
    )
    .await
}

// ---------------------------------------------------------------------------
// 8. Concurrent duplicates share one decision.

#[tokio::test(start_paused = true)]
async fn waiters_share_a_declined_decision_instead_of_charging_under_the_next_generation() {
    for sharing in [false, true] {
        let dir = TempDir::new().unwrap();
        let rt = open(dir.path());
        let ctx = rt.run("run");
        let t = tool("charge", Class::Provider);
        // The provider takes a second per request and declines the first.
        let p = Provider::slow(&[Step::Decline], Duration::from_secs(1));
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (ctx, p) = (ctx.clone(), p.clone());
            let hooks = if sharing {
                ErrorHooks::debug().sharing()
            } else {
                ErrorHooks::debug()
            };
            tasks.push(tokio::spawn(async move {
                call_hooked(&ctx, t, &p, hooks).await
            }));
        }
        let mut declined = 0;
        let mut shared_text = 0;
        for task in tasks {
            match task.await.unwrap() {
                Err(ToolError::Tool(TestError::Declined)) => declined += 1,
                Err(ToolError::Journal(Error::Rejected { error, .. })) => {
                    assert_eq!(error, "Declined");
                    shared_text += 1;
                }
                other => panic!("a duplicate of a declined charge got {other:?}"),
            }
        }
        assert_eq!(p.calls(), 1, "one decision: one request");
        assert_eq!(p.effects(), 0, "nothing was charged");
        assert!(
            p.requests().iter().all(|r| r.0.ends_with("-g0")),
            "{:?}",
            p.requests()
        );
        if sharing {
            assert_eq!(
                (declined, shared_text),
                (8, 0),
                "the leader's own error, cloned"
            );
        } else {
            assert_eq!((declined, shared_text), (1, 7));
        }
        // A call made after the decision is a new decision: the next key.
        let again = call_hooked(&ctx, t, &p, ErrorHooks::debug()).await;
        assert_eq!(again.unwrap(), "done:a");
        assert!(p.requests()[1].0.ends_with("-g1"));
    }
}

#[tokio::test(start_paused = true)]
async fn waiters_share_a_spent_budget_instead_of_starting_a_new_one() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let ctx = rt.run("run");
    let t = tool_with("t", Class::Provider, |d| d.retry.max_attempts = 3);
    // Every attempt is refused before reaching the provider.
    let p = Provider::slow(&[Step::Refuse; 16], Duration::from_millis(100));
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let (ctx, p) = (ctx.clone(), p.clone());
        tasks.push(tokio::spawn(async move {
            call_hooked(&ctx, t, &p, ErrorHooks::debug()).await
        }));
    }
    let mut own = 0;
    for task in tasks {
        match task.await.unwrap() {
            Err(ToolError::Tool(TestError::Refused)) => own += 1,
            Err(ToolError::Journal(Error::Failed { attempts: 3, .. })) => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(own, 1);
    assert_eq!(p.calls(), 3, "one budget of 3 attempts for 6 duplicates");
}

// ---------------------------------------------------------------------------
// 9. A record of another tool or class is an error, never a replay.

#[tokio::test(start_paused = true)]
async fn a_record_of_another_class_is_an_error_not_a_replay() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let ctx = rt.run("run");
    let email = tool("send", Class::Journal);
    let sms = tool("send", Class::AtMostOnce);
    let p = Provider::new(&[]);
    call(&ctx, email, &p, 1, "email", VerifyMode::Provider)
        .await
        .unwrap();
    let err = call(&ctx, sms, &p, 1, "sms", VerifyMode::None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            ToolError::Journal(Error::ToolMismatch {
                stored_class: Class::Journal,
                class: Class::AtMostOnce,
                ..
            })
        ),
        "{err:?}"
    );
    assert_eq!(p.calls(), 1, "the SMS was neither sent nor replayed");
}

// ---------------------------------------------------------------------------
// 10. Two runtimes on one journal.

#[tokio::test(start_paused = true)]
async fn two_runtimes_on_one_journal_never_take_each_others_live_call_for_a_crash() {
    for class in [Class::Provider, Class::Journal, Class::AtMostOnce] {
        let dir = TempDir::new().unwrap();
        let journal = Arc::new(SledJournal::open(dir.path()).unwrap());
        let a = Runtime::builder().journal(journal.clone()).open().unwrap();
        let b = Runtime::builder().journal(journal).open().unwrap();
        let t = tool("t", class);
        let verify = match class {
            Class::Journal => VerifyMode::Provider,
            _ => VerifyMode::None,
        };
        // A's call is at the provider for 10 s.
        let p = Provider::slow(&[], Duration::from_secs(10));
        let first = tokio::spawn({
            let (ctx, p, verify) = (a.run("run"), p.clone(), verify.clone());
            async move { call(&ctx, t, &p, 1, "a", verify).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        let second = call(&b.run("run"), t, &p, 1, "a", verify).await;
        assert_eq!(second.unwrap(), "done:a", "{class}");
        assert_eq!(first.await.unwrap().unwrap(), "done:a", "{class}");
        assert_eq!(p.calls(), 1, "{class}: B waited for A and replayed");
        assert!(b.escalations().await.unwrap().is_empty(), "{class}");
    }
}

// ---------------------------------------------------------------------------
// 11. Concurrent steps of one name run once.

#[tokio::test(start_paused = true)]
async fn concurrent_steps_of_one_name_run_once_and_share_the_value() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let parent = rt.run("run");
    let child = parent.child("sub-agent");
    let polled = Arc::new(Mutex::new(0u32));
    let step = |ctx: Ctx, polled: Arc<Mutex<u32>>| async move {
        ctx.step("plan", async move {
            let n = {
                let mut n = polled.lock().unwrap();
                *n += 1;
                *n
            };
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok::<_, TestError>(format!("plan #{n}"))
        })
        .await
    };
    let (a, b) = tokio::join!(
        tokio::spawn(step(parent.clone(), polled.clone())),
        tokio::spawn(step(child.clone(), polled.clone()))
    );
    let (a, b) = (a.unwrap().unwrap(), b.unwrap().unwrap());
    assert_eq!(a, b, "both see the one execution's value");
    assert_eq!(*polled.lock().unwrap(), 1);
    // ... and so does a later replay.
    assert_eq!(step(parent, polled.clone()).await.unwrap(), a);
    assert_eq!(*polled.lock().unwrap(), 1);
}

// ---------------------------------------------------------------------------
// 12. The dedupe window counts from the key's first use, reissues included.

#[tokio::test(start_paused = true)]
async fn a_reissue_keeps_the_dedupe_window_of_the_key() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let ctx = rt.run("run");
    let t = tool_with("pay", Class::Provider, |d| {
        d.dedupe_window = Duration::from_secs(24 * 3600);
        d.retry.max_attempts = 2;
        d.retry.max_elapsed = None;
        d.retry.initial = Duration::from_secs(3600);
        d.retry.max_interval = Duration::from_secs(2 * 3600);
    });
    // t = 0: the first attempt may have landed, the second too: escalated.
    let p = Provider::new(&[Step::LandThenTimeout, Step::LoseThenTimeout]);
    let err = call(&ctx, t, &p, 1, "a", VerifyMode::None)
        .await
        .unwrap_err();
    let ToolError::Escalated { key, .. } = err else {
        panic!("{err:?}")
    };
    // 22 h later an operator reissues it: a fresh budget, the same key.
    tokio::time::advance(Duration::from_secs(22 * 3600)).await;
    rt.resolve(&key, Resolution::Reissue, "let it try again")
        .await
        .unwrap();
    p.push(&[Step::LoseThenTimeout, Step::Ok]);
    let err = call(&ctx, t, &p, 1, "a", VerifyMode::None)
        .await
        .unwrap_err();
    let reason = escalation_reason(err);
    // Its retry would be sent 24 h after the key's first use, when the
    // provider no longer remembers it: escalated instead.
    assert!(reason.contains("dedupe window"), "{reason}");
    assert_eq!(p.calls(), 3);
}

// ---------------------------------------------------------------------------
// 13. A refusal after an attempt that may have landed.

#[tokio::test(start_paused = true)]
async fn a_refusal_after_an_ambiguous_attempt_escalates_instead_of_a_fresh_key() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let ctx = rt.run("run");
    let t = tool("pay", Class::Provider);
    // The first attempt lands and its answer is lost; the retry is refused.
    let p = Provider::new(&[Step::LandThenTimeout, Step::Decline]);
    let err = call(&ctx, t, &p, 1, "a", VerifyMode::None)
        .await
        .unwrap_err();
    let ToolError::Escalated { reason, .. } = &err else {
        panic!("{err:?}")
    };
    assert!(reason.contains("may have landed"), "{reason}");
    // No new decision under a fresh key: the next call is refused too.
    let again = call(&ctx, t, &p, 1, "a", VerifyMode::None).await;
    assert!(
        matches!(again, Err(ToolError::Escalated { .. })),
        "{again:?}"
    );
    assert_eq!(p.calls(), 2);
    assert!(p.requests().iter().all(|r| r.0.ends_with("-g0")));
    assert_eq!(p.effects(), 1);
}

// ---------------------------------------------------------------------------
// 14. A budget spent on attempts that provably never landed fails.

#[tokio::test(start_paused = true)]
async fn a_budget_spent_on_not_sent_attempts_fails_after_a_restart() {
    let mem = MemJournal::new();
    let t = tool_with("t", Class::AtMostOnce, |d| d.retry.max_attempts = 2);
    let p = Provider::new(&[Step::Refuse, Step::Refuse]);
    {
        // The process dies right after the last refused attempt, before it
        // recorded FAILED (the write fails), with what it had learned (the
        // attempts provably never landed) durable.
        let faulty = FaultyJournal::new(mem.clone());
        let rt = Runtime::builder().journal(faulty.clone()).open().unwrap();
        faulty.fail_write(5, StorageFault::Refused);
        let err = call1(&rt, t, &p, VerifyMode::None).await.unwrap_err();
        assert!(
            matches!(err, ToolError::Journal(Error::Storage { .. })),
            "{err:?}"
        );
        rt.sync().await.unwrap();
        assert_eq!(p.calls(), 2);
    }
    mem.crash();
    let rt = Runtime::builder().journal(mem.clone()).open().unwrap();
    let err = call1(&rt, t, &p, VerifyMode::None).await.unwrap_err();
    assert!(
        matches!(&err, ToolError::Journal(Error::Failed { attempts: 2, error, .. }) if error == "Refused"),
        "{err:?}"
    );
    assert_eq!(p.calls(), 2, "no third attempt");
    assert!(
        rt.escalations().await.unwrap().is_empty(),
        "nothing to escalate"
    );
    let op = rt
        .operation(&key(&rt.run("run"), t, 1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(op.state, "failed");
}

// ---------------------------------------------------------------------------
// 16. An operator's Landed is checked against the result type.

#[tokio::test(start_paused = true)]
async fn a_landed_result_that_does_not_fit_the_result_type_is_refused_and_nothing_changes() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let t = tool("wire", Class::AtMostOnce);
    let p = Provider::new(&[Step::LandThenTimeout]);
    let err = call1(&rt, t, &p, VerifyMode::None).await.unwrap_err();
    let ToolError::Escalated { key, .. } = err else {
        panic!("{err:?}")
    };
    let before = rt.audit(0).await.unwrap();
    let refused = rt
        .resolve(
            &key,
            Resolution::Landed(Some(serde_json::json!({"id": 7}))),
            "wrong shape",
        )
        .await
        .unwrap_err();
    let Error::ResultType { detail, .. } = &refused else {
        panic!("{refused}")
    };
    assert!(detail.contains("expected a string"), "{detail}");
    // Nothing was written: still escalated, no new event.
    assert_eq!(rt.audit(0).await.unwrap(), before);
    assert_eq!(rt.escalations().await.unwrap().len(), 1);
    // The right shape goes through, and replays.
    rt.resolve(
        &key,
        Resolution::Landed(Some(serde_json::json!("wire-9"))),
        "bank statement",
    )
    .await
    .unwrap();
    assert_eq!(call1(&rt, t, &p, VerifyMode::None).await.unwrap(), "wire-9");
}

// ---------------------------------------------------------------------------
// 18. Operators read an error's Display.

#[tokio::test(start_paused = true)]
async fn escalations_show_the_errors_display_text() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let ctx = rt.run("run");
    let t = tool("wire", Class::AtMostOnce);
    let p = Provider::new(&[Step::LoseThenTimeout]);
    let err = call_hooked(&ctx, t, &p, ErrorHooks::display())
        .await
        .unwrap_err();
    let reason = escalation_reason(err);
    assert!(
        reason.contains("the provider did not answer in time"),
        "{reason}"
    );
    let esc = &rt.escalations().await.unwrap()[0];
    assert_eq!(
        esc.last_error.as_deref(),
        Some("the provider did not answer in time")
    );
}

// ---------------------------------------------------------------------------
// 4. Records are never written that cannot be read back.

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Measurement {
    reading: f64,
    spread: Option<f64>,
    samples: Vec<u8>,
}

async fn measure(
    ctx: &Ctx,
    value: Measurement,
    payload: String,
    calls: Arc<Mutex<u32>>,
) -> Result<Measurement, ToolError<TestError>> {
    static T: ToolDescriptor = ToolDescriptor::new("measure", Class::Journal);
    let mut a = idem_runtime::__private::Args::new();
    a.serialized("payload", &payload);
    let attempt = move |_c: Ctx| {
        let (value, calls) = (value.clone(), calls.clone());
        async move {
            *calls.lock().unwrap() += 1;
            Ok(value)
        }
    };
    __private::call(
        ctx,
        &T,
        __private::key(ctx, &T).field(&1u8).finish(),
        a,
        attempt,
        None::<fn(Ctx) -> std::future::Ready<_>>,
    )
    .await
}

#[tokio::test(start_paused = true)]
async fn a_large_or_non_finite_result_replays_exactly_after_a_reopen() {
    let dir = TempDir::new().unwrap();
    let calls = Arc::new(Mutex::new(0));
    let big = Measurement {
        reading: f64::INFINITY,
        spread: Some(f64::NAN),
        samples: (0..10 << 20).map(|i| (i % 251) as u8).collect(),
    };
    let first = {
        let rt = open(dir.path());
        measure(&rt.run("run"), big.clone(), "p".into(), calls.clone())
            .await
            .unwrap()
    };
    assert_eq!(first.samples, big.samples);
    let rt = open(dir.path());
    let again = measure(&rt.run("run"), big.clone(), "p".into(), calls.clone())
        .await
        .unwrap();
    assert_eq!(*calls.lock().unwrap(), 1, "replayed, not run again");
    assert_eq!(again.samples, big.samples);
    assert_eq!(again.reading, f64::INFINITY);
    assert!(again.spread.unwrap().is_nan());
}

#[tokio::test(start_paused = true)]
async fn arguments_over_the_limit_are_refused_before_the_intent() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let calls = Arc::new(Mutex::new(0));
    let value = Measurement {
        reading: 1.0,
        spread: None,
        samples: vec![],
    };
    let huge = "x".repeat(idem_runtime::MAX_ARGS_BYTES + 1);
    let err = measure(&rt.run("run"), value, huge, calls.clone())
        .await
        .unwrap_err();
    assert!(
        matches!(err, ToolError::Journal(Error::TooLarge { .. })),
        "{err:?}"
    );
    assert_eq!(*calls.lock().unwrap(), 0, "the provider was not called");
    assert!(rt
        .journal()
        .scan(idem_runtime::journal::Space::Ops, None, 10)
        .await
        .unwrap()
        .is_empty());
}

// ---------------------------------------------------------------------------
// 17 (key parsing) has its regression test with the key module; 15 is a
// compile-time refusal (tests/ui/fail/journal_without_timeout.rs) plus the
// Settling event checked here.

#[tokio::test(start_paused = true)]
async fn a_recovery_that_waits_says_so_in_the_audit_stream() {
    let mem = MemJournal::new();
    let t = tool_with("t", Class::Journal, |d| {
        d.timeout = Some(Duration::from_secs(20))
    });
    let p = Provider::new(&[Step::LandThenHang]);
    {
        let rt = Runtime::builder().journal(mem.clone()).open().unwrap();
        let fut = call1(&rt, t, &p, VerifyMode::Provider);
        assert!(tokio::time::timeout(Duration::from_secs(1), fut)
            .await
            .is_err());
    }
    mem.crash();
    let rt = Runtime::builder().journal(mem.clone()).open().unwrap();
    assert_eq!(
        call1(&rt, t, &p, VerifyMode::Provider).await.unwrap(),
        "done:a"
    );
    let waited: Vec<u64> = events(&rt)
        .await
        .iter()
        .filter_map(|k| match k {
            EventKind::Settling { wait_ms } => Some(*wait_ms),
            _ => None,
        })
        .collect();
    // 20 s timeout + 1 s backoff from the dead attempt's start, up to 1 s
    // of which had passed (each runtime's clock starts from the system
    // time, so the paused second before the crash may not count).
    assert_eq!(waited.len(), 1, "{:?}", events(&rt).await);
    assert!((20_000..=21_000).contains(&waited[0]), "{waited:?}");
    assert_eq!(p.calls(), 1);
}
