//! The engine's decision tables (per class), row by row, driven through
//! `__private::call`, the entry point `#[tool]` expands to. Time is tokio's
//! paused clock: backoff sleeps cost nothing and their lengths are exact.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use idem_runtime::journal::Space;
use idem_runtime::{
    Class, Ctx, EventKind, ManualClock, OnDrift, Resolution, RetryPolicy, Runtime, ToolError,
};
use tempfile::TempDir;
use tokio::time::Instant;

const SIDE_EFFECTING: [Class; 3] = [Class::Provider, Class::Journal, Class::AtMostOnce];

fn verify_for(class: Class) -> VerifyMode {
    match class {
        Class::Journal => VerifyMode::Provider,
        _ => VerifyMode::None,
    }
}

async fn count(rt: &Runtime, pred: impl Fn(&EventKind) -> bool) -> usize {
    events(rt).await.iter().filter(|k| pred(k)).count()
}

async fn ops(rt: &Runtime) -> Vec<idem_runtime::journal::Loaded> {
    rt.journal()
        .scan(Space::Ops, None, 10_000)
        .await
        .unwrap()
        .into_iter()
        .map(|(_, l)| l)
        .collect()
}

// ---------------------------------------------------------------------------
// Table 1: what a call finds in the journal.
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn none_read_only_runs_without_journal() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let ctx = rt.run("run");
    let t = tool("lookup", Class::ReadOnly);
    // read_only has no key (the fake provider needs one): count in the body.
    let calls = Arc::new(Mutex::new(0));
    let c2 = calls.clone();
    let out: Result<u32, ToolError<TestError>> =
        idem_runtime::__private::call_read_only(&ctx, t, move |c: Ctx| {
            let c2 = c2.clone();
            async move {
                assert!(c.try_idempotency_key().is_none());
                *c2.lock().unwrap() += 1;
                Ok(7)
            }
        })
        .await;
    assert_eq!(out.unwrap(), 7);
    assert_eq!(*calls.lock().unwrap(), 1);
    assert_eq!(ops(&rt).await.len(), 0, "no record");
    assert_eq!(
        rt.audit(0).await.unwrap().len(),
        0,
        "no durable event for a plain read"
    );
    assert_eq!(rt.stats().await.unwrap().tools["lookup"].calls, 1);
}

#[tokio::test(start_paused = true)]
async fn none_intent_is_durable_before_the_provider_is_called() {
    for class in SIDE_EFFECTING {
        let dir = TempDir::new().unwrap();
        let faulty = FaultyJournal::new(Arc::new(
            idem_runtime::SledJournal::open(dir.path()).unwrap(),
        ));
        let rt = Runtime::builder().journal(faulty.clone()).open().unwrap();
        let ctx = rt.run("run");
        let p = Provider::new(&[]);
        p.log_to(faulty.log());
        let out = call(&ctx, tool("t", class), &p, 1, "a", verify_for(class)).await;
        assert_eq!(out.unwrap(), "done:a");
        let log = faulty.log().lock().unwrap().clone();
        let call_at = log
            .iter()
            .position(|l| l.starts_with("provider call"))
            .unwrap();
        let intent_at = log.iter().position(|l| l.ends_with("create ops")).unwrap();
        let synced = |l: &&String| l.starts_with("sync ");
        let sync_at = log.iter().position(|l| synced(&l)).unwrap();
        // The INTENT's sync has completed (it is logged on completion)
        // before the provider hears of the call.
        assert!(intent_at < sync_at && sync_at < call_at, "{class}: {log:?}");
        // ... and the commit is synced before the caller sees the result.
        assert!(synced(&log.last().unwrap()), "{class}: {log:?}");
        assert_eq!(
            log.iter().filter(synced).count(),
            2,
            "{class}: two syncs per call"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn committed_is_replayed_without_calling() {
    for class in SIDE_EFFECTING {
        let dir = TempDir::new().unwrap();
        let rt = open(dir.path());
        let ctx = rt.run("run");
        let t = tool("t", class);
        let p = Provider::new(&[]);
        let first = call(&ctx, t, &p, 1, "a", verify_for(class)).await.unwrap();
        let again = call(&ctx, t, &p, 1, "a", verify_for(class)).await.unwrap();
        assert_eq!(first, again);
        assert_eq!(p.calls(), 1, "{class}");
        assert_eq!(count(&rt, |k| *k == EventKind::DedupeHit).await, 1);
        // A different key field is a different operation.
        call(&ctx, t, &p, 2, "a", verify_for(class)).await.unwrap();
        assert_eq!(p.calls(), 2);
    }
}

#[tokio::test(start_paused = true)]
async fn committed_survives_reopen() {
    let dir = TempDir::new().unwrap();
    let p = Provider::new(&[]);
    let t = tool("t", Class::Journal);
    {
        let rt = open(dir.path());
        call1(&rt, t, &p, VerifyMode::Provider).await.unwrap();
    }
    let rt = open(dir.path());
    let out = call1(&rt, t, &p, VerifyMode::Provider).await.unwrap();
    assert_eq!(out, "done:a");
    assert_eq!(p.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn intent_in_flight_here_is_waited_for_then_replayed() {
    for class in SIDE_EFFECTING {
        let dir = TempDir::new().unwrap();
        let rt = open(dir.path());
        let ctx = rt.run("run");
        let t = tool("t", class);
        // The leader's provider call takes 10 s.
        let p = Provider::new(&[]);
        let gate = p.clone();
        let key = key(&ctx, t, 1);
        let leader_ctx = ctx.clone();
        let leader = tokio::spawn(async move {
            idem_runtime::__private::call(
                &leader_ctx,
                t,
                key,
                args(1, "a"),
                move |c: Ctx| {
                    let gate = gate.clone();
                    async move {
                        tokio::time::sleep(Duration::from_secs(10)).await;
                        gate.handle(&c, "a").await
                    }
                },
                None::<fn(Ctx) -> std::future::Ready<_>>,
            )
            .await
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        let started = Instant::now();
        let follower = call(&ctx, t, &p, 1, "a", verify_for(class)).await;
        assert_eq!(follower.unwrap(), "done:a", "{class}");
        assert!(
            started.elapsed() >= Duration::from_secs(9),
            "waited for the leader"
        );
        assert_eq!(leader.await.unwrap().unwrap(), "done:a");
        assert_eq!(p.calls(), 1, "{class}: one provider call for two callers");
    }
}

#[tokio::test(start_paused = true)]
async fn intent_in_flight_too_long_is_in_flight() {
    let dir = TempDir::new().unwrap();
    let rt = Runtime::builder()
        .path(dir.path())
        .in_flight_wait(Duration::from_secs(5))
        .open()
        .unwrap();
    let ctx = rt.run("run");
    let t = tool("t", Class::Provider);
    let p = Provider::new(&[Step::LandThenHang]);
    let leader = tokio::spawn({
        let (ctx, p) = (ctx.clone(), p.clone());
        async move { call(&ctx, t, &p, 1, "a", VerifyMode::None).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let err = call(&ctx, t, &p, 1, "a", VerifyMode::None)
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::InFlight { .. }), "{err:?}");
    assert_eq!(p.calls(), 1);
    leader.abort();
}

#[tokio::test(start_paused = true)]
async fn dropped_leader_releases_waiters_who_recover() {
    // The leader lands the effect and hangs; its task is aborted (cancelled,
    // as a caller timeout would). The waiter must not hang: it recovers the
    // INTENT exactly as after a crash.
    for class in SIDE_EFFECTING {
        let dir = TempDir::new().unwrap();
        let rt = open(dir.path());
        let ctx = rt.run("run");
        let t = tool("t", class);
        let p = Provider::deduping(&[Step::LandThenHang]);
        let leader = tokio::spawn({
            let (ctx, p) = (ctx.clone(), p.clone());
            async move { call(&ctx, t, &p, 1, "a", verify_for(class)).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        let waiter = tokio::spawn({
            let (ctx, p) = (ctx.clone(), p.clone());
            async move { call(&ctx, t, &p, 1, "a", verify_for(class)).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        leader.abort();
        let out = waiter.await.unwrap();
        match class {
            // Same key again: the provider replays its first answer.
            Class::Provider => {
                assert_eq!(out.unwrap(), "done:a");
                assert_eq!(p.calls(), 2);
            }
            // verify finds the effect: commit it, no second call.
            Class::Journal => {
                assert_eq!(out.unwrap(), "done:a");
                assert_eq!(p.calls(), 1);
            }
            Class::AtMostOnce => {
                assert!(matches!(out, Err(ToolError::Escalated { .. })), "{out:?}");
                assert_eq!(p.calls(), 1);
            }
            Class::ReadOnly => unreachable!(),
        }
        assert_eq!(p.effects(), 1, "{class}: one effect");
    }
}

/// Leaves the operation as a crashed process would: INTENT durable, effect
/// maybe applied, nobody driving it, and everything no barrier covered (the
/// move to `Waiting`, eventual audit events) forgotten. Returns a runtime of
/// the "next process" on what survived.
async fn crash_mid_call(class: Class, p: &Provider, step: Step) -> Runtime {
    crash_mid_call_with(tool("t", class), p, step, None).await.0
}

async fn crash_mid_call_with(
    t: &'static idem_runtime::ToolDescriptor,
    p: &Provider,
    step: Step,
    clock: Option<ManualClock>,
) -> (Runtime, Arc<MemJournal>) {
    let mem = MemJournal::new();
    let builder = |clock: &Option<ManualClock>| {
        let b = Runtime::builder().journal(mem.clone());
        match clock {
            Some(c) => b.clock(Arc::new(c.clone())),
            None => b,
        }
    };
    {
        let rt = builder(&clock).open().unwrap();
        let ctx = rt.run("run");
        p.push(&[step]);
        let fut = call(&ctx, t, p, 1, "a", VerifyMode::Provider);
        // Drive it until the provider has been called, then drop it.
        let _ = tokio::time::timeout(Duration::from_secs(1), fut).await;
    }
    mem.crash();
    (builder(&clock).open().unwrap(), mem)
}

#[tokio::test(start_paused = true)]
async fn dead_owner_provider_reruns_with_the_same_key() {
    let p = Provider::deduping(&[]);
    let rt = crash_mid_call(Class::Provider, &p, Step::LandThenHang).await;
    let out = call1(&rt, tool("t", Class::Provider), &p, VerifyMode::None).await;
    assert_eq!(out.unwrap(), "done:a");
    let reqs = p.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].0, reqs[1].0, "same key on the re-run");
    assert_eq!(reqs[1].1, 2, "the attempt count survived the crash");
    assert_eq!(p.effects(), 1);
    let evs = events(&rt).await;
    assert!(evs
        .iter()
        .any(|k| matches!(k, EventKind::Recovered { state, attempts: 1 } if state == "intent")));
    assert!(evs
        .iter()
        .any(|k| matches!(k, EventKind::ProviderReplay { attempt: 2 })));
}

#[tokio::test(start_paused = true)]
async fn dead_owner_provider_outside_dedupe_window_escalates() {
    let clock = ManualClock::new(1_800_000_000_000);
    let t = tool_with("t", Class::Provider, |d| {
        d.retry.max_elapsed = None;
        d.dedupe_window = Duration::from_secs(24 * 3600);
    });
    let p = Provider::deduping(&[]);
    let (rt, _) = crash_mid_call_with(t, &p, Step::LandThenHang, Some(clock.clone())).await;
    clock.advance(Duration::from_secs(25 * 3600));
    let err = call1(&rt, t, &p, VerifyMode::None).await.unwrap_err();
    let reason = escalation_reason(err);
    assert!(reason.contains("dedupe window"), "{reason}");
    assert_eq!(p.calls(), 1, "a key the provider forgot is never re-sent");
}

#[tokio::test(start_paused = true)]
async fn dead_owner_provider_out_of_budget_escalates() {
    let t = tool_with("t", Class::Provider, |d| d.retry.max_attempts = 1);
    let p = Provider::deduping(&[]);
    let (rt, _) = crash_mid_call_with(t, &p, Step::LandThenHang, None).await;
    let err = call1(&rt, t, &p, VerifyMode::None).await.unwrap_err();
    let reason = escalation_reason(err);
    assert!(reason.contains("1 of 1 attempts"), "{reason}");
    assert_eq!(p.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn dead_owner_journal_verify_landed_commits_without_rerun() {
    let p = Provider::new(&[]);
    let rt = crash_mid_call(Class::Journal, &p, Step::LandThenHang).await;
    let t = tool("t", Class::Journal);
    let out = call1(&rt, t, &p, VerifyMode::Provider).await;
    assert_eq!(out.unwrap(), "done:a");
    assert_eq!(p.calls(), 1);
    assert_eq!(p.effects(), 1);
    // Committed for good: later calls replay.
    call1(&rt, t, &p, VerifyMode::Provider).await.unwrap();
    assert_eq!(p.calls(), 1);
    let evs = events(&rt).await;
    assert!(evs
        .iter()
        .any(|k| matches!(k, EventKind::Verified { verdict } if verdict == "landed")));
    assert!(evs
        .iter()
        .any(|k| matches!(k, EventKind::Committed { via, .. } if via == "verify")));
}

#[tokio::test(start_paused = true)]
async fn recovery_lets_the_dead_attempt_settle_before_verifying() {
    // The provider is still processing the dropped attempt's request and
    // applies it 3 s later. A recovery that verified at once would hear
    // "not landed" and send it again; it waits out the attempt's timeout
    // and the backoff first, then finds it.
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let ctx = rt.run("run");
    let t = tool_with("t", Class::Journal, |d| {
        d.timeout = Some(Duration::from_secs(5))
    });
    let p = Provider::new(&[Step::LandAfter(3)]);
    let first = call(&ctx, t, &p, 1, "a", VerifyMode::Provider);
    assert!(tokio::time::timeout(Duration::from_secs(1), first)
        .await
        .is_err());
    let started = Instant::now();
    let out = call(&ctx, t, &p, 1, "a", VerifyMode::Provider).await;
    assert_eq!(out.unwrap(), "done:a");
    assert_eq!(p.calls(), 1, "verified, not sent again");
    assert_eq!(p.effects(), 1);
    // 5 s timeout + 1 s backoff from the attempt's start, 1 s of which had passed.
    assert_eq!(started.elapsed().as_secs(), 5);
}

#[tokio::test(start_paused = true)]
async fn dead_owner_journal_verify_not_landed_reruns() {
    let p = Provider::new(&[]);
    let rt = crash_mid_call(Class::Journal, &p, Step::Hang).await;
    let out = call1(&rt, tool("t", Class::Journal), &p, VerifyMode::Provider).await;
    assert_eq!(out.unwrap(), "done:a");
    assert_eq!(p.calls(), 2);
    assert_eq!(p.effects(), 1);
}

#[tokio::test(start_paused = true)]
async fn dead_owner_journal_verify_unknown_error_or_none_escalates() {
    for (mode, expect, answer) in [
        (VerifyMode::Unknown, "unknown", "unknown"),
        (VerifyMode::Fails, "verify failed", "error: Refused"),
        (VerifyMode::None, "verify = \"none\"", "none"),
    ] {
        let p = Provider::new(&[]);
        let rt = crash_mid_call(Class::Journal, &p, Step::LandThenHang).await;
        let err = call(&rt.run("run"), tool("t", Class::Journal), &p, 1, "a", mode)
            .await
            .unwrap_err();
        let reason = escalation_reason(err);
        assert!(reason.contains(expect), "{reason}");
        assert_eq!(p.calls(), 1);
        let esc = rt.escalations().await.unwrap();
        assert_eq!(esc.len(), 1);
        assert_eq!(esc[0].verify_answer.as_deref(), Some(answer), "{reason}");
    }
}

#[tokio::test(start_paused = true)]
async fn dead_owner_at_most_once_escalates_with_evidence() {
    let p = Provider::new(&[]);
    let rt = crash_mid_call(Class::AtMostOnce, &p, Step::LandThenHang).await;
    let ctx = rt.run("run");
    let t = tool("t", Class::AtMostOnce);
    let err = call(&ctx, t, &p, 1, "a", VerifyMode::None)
        .await
        .unwrap_err();
    let ToolError::Escalated { key, reason } = err else {
        panic!("{err:?}")
    };
    assert!(reason.contains("never re-runs"), "{reason}");
    assert_eq!(p.calls(), 1);
    let esc = rt.escalations().await.unwrap();
    assert_eq!(esc.len(), 1);
    let e = &esc[0];
    assert_eq!(e.key, key);
    assert_eq!(e.tool, "t");
    assert_eq!(e.class, Class::AtMostOnce);
    assert_eq!(e.root_run, "run");
    assert_eq!(e.attempts, 1);
    assert_eq!(e.args["order"], 1);
    assert_eq!(e.args["body"], "a");
    assert!(e.escalated_ms >= e.first_attempt_ms);
}

#[tokio::test(start_paused = true)]
async fn rejected_runs_again_under_the_next_generation() {
    for class in SIDE_EFFECTING {
        let dir = TempDir::new().unwrap();
        let rt = open(dir.path());
        let ctx = rt.run("run");
        let t = tool("t", class);
        let p = Provider::new(&[Step::Decline]);
        let err = call(&ctx, t, &p, 1, "a", verify_for(class))
            .await
            .unwrap_err();
        assert!(
            matches!(err, ToolError::Tool(TestError::Declined)),
            "{err:?}"
        );
        assert_eq!(p.calls(), 1, "{class}: a semantic failure is not retried");
        let out = call(&ctx, t, &p, 1, "a", verify_for(class)).await.unwrap();
        assert_eq!(out, "done:a");
        let reqs = p.requests();
        assert!(
            reqs[0].0.ends_with("-g0") && reqs[1].0.ends_with("-g1"),
            "{reqs:?}"
        );
        assert_eq!(
            reqs[0].0.trim_end_matches("-g0"),
            reqs[1].0.trim_end_matches("-g1")
        );
        assert_eq!(reqs[1].1, 1, "a new generation has a fresh budget");
        // The new generation is committed: replay.
        call(&ctx, t, &p, 1, "a", verify_for(class)).await.unwrap();
        assert_eq!(p.calls(), 2);
    }
}

#[tokio::test(start_paused = true)]
async fn escalated_is_refused_without_calling() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let ctx = rt.run("run");
    let t = tool("t", Class::AtMostOnce);
    let p = Provider::new(&[Step::LandThenTimeout]);
    let first = call(&ctx, t, &p, 1, "a", VerifyMode::None)
        .await
        .unwrap_err();
    assert!(matches!(first, ToolError::Escalated { .. }));
    for _ in 0..3 {
        let again = call(&ctx, t, &p, 1, "a", VerifyMode::None)
            .await
            .unwrap_err();
        assert!(matches!(again, ToolError::Escalated { .. }), "{again:?}");
    }
    assert_eq!(p.calls(), 1);
}

async fn escalated_op(rt: &Runtime, p: &Provider) -> idem_runtime::IdemKey {
    let t = tool("t", Class::AtMostOnce);
    p.push(&[Step::LandThenTimeout]);
    match call(&rt.run("run"), t, p, 1, "a", VerifyMode::None).await {
        Err(ToolError::Escalated { key, .. }) => key,
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn resolved_landed_replays_the_operators_result() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let p = Provider::new(&[]);
    let key = escalated_op(&rt, &p).await;
    rt.resolve(
        &key,
        Resolution::Landed(Some(serde_json::json!("wire-77"))),
        "bank confirmed",
    )
    .await
    .unwrap();
    assert!(rt.escalations().await.unwrap().is_empty());
    let out = call1(&rt, tool("t", Class::AtMostOnce), &p, VerifyMode::None).await;
    assert_eq!(out.unwrap(), "wire-77");
    assert_eq!(p.calls(), 1);
    assert!(events(&rt).await.iter().any(|k| matches!(k,
        EventKind::Resolved { resolution, note } if resolution == "landed" && note == "bank confirmed")));
    // A resolution that proves wrong is amended, with its own event, and
    // later calls follow the amended one.
    rt.resolve(
        &key,
        Resolution::Landed(Some(serde_json::json!("wire-78"))),
        "wrong statement line; it was 78",
    )
    .await
    .unwrap();
    let out = call1(&rt, tool("t", Class::AtMostOnce), &p, VerifyMode::None).await;
    assert_eq!(out.unwrap(), "wire-78");
    assert!(events(&rt).await.iter().any(|k| matches!(k,
        EventKind::Amended { previous, resolution, .. } if previous == "landed" && resolution == "landed")));
    let op = rt.operation(&key).await.unwrap().unwrap();
    assert_eq!(op.resolution.unwrap().amendments, 1);
    assert_eq!(p.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_note_over_the_limit_is_refused_and_nothing_is_written() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let p = Provider::new(&[]);
    let key = escalated_op(&rt, &p).await;
    let huge = "n".repeat(idem_runtime::MAX_NOTE_BYTES + 1);
    let err = rt
        .resolve(&key, Resolution::Abandon, &huge)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, idem_runtime::Error::TooLarge { size, .. } if *size == huge.len() as u64),
        "{err}"
    );
    // Still parked, and a note of the limit's length is taken.
    assert_eq!(rt.escalations().await.unwrap().len(), 1);
    let most = "n".repeat(idem_runtime::MAX_NOTE_BYTES);
    rt.resolve(&key, Resolution::Abandon, &most).await.unwrap();
    assert!(rt.escalations().await.unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn resolve_refuses_what_no_operator_decided() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let p = Provider::new(&[]);
    let t = tool("t", Class::Journal);
    call1(&rt, t, &p, VerifyMode::Provider).await.unwrap();
    let k = key(&rt.run("run"), t, 1);
    for resolution in [
        Resolution::Landed(Some(serde_json::json!("other"))),
        Resolution::Reissue,
        Resolution::Abandon,
    ] {
        let err = rt.resolve(&k, resolution, "no").await.unwrap_err();
        assert!(
            matches!(&err, idem_runtime::Error::NotEscalated { state, .. } if state == "committed"),
            "{err}"
        );
    }
    assert_eq!(
        call1(&rt, t, &p, VerifyMode::Provider).await.unwrap(),
        "done:a"
    );
    assert_eq!(p.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn resolved_reissue_runs_again() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let p = Provider::new(&[]);
    let key = escalated_op(&rt, &p).await;
    rt.resolve(&key, Resolution::Reissue, "bank says nothing arrived")
        .await
        .unwrap();
    let out = call1(&rt, tool("t", Class::AtMostOnce), &p, VerifyMode::None).await;
    assert_eq!(out.unwrap(), "done:a");
    assert_eq!(p.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn resolved_abandon_is_abandoned() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let p = Provider::new(&[]);
    let key = escalated_op(&rt, &p).await;
    rt.resolve(&key, Resolution::Abandon, "customer cancelled")
        .await
        .unwrap();
    let err = call1(&rt, tool("t", Class::AtMostOnce), &p, VerifyMode::None)
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::Abandoned { .. }), "{err:?}");
    assert_eq!(p.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn resolve_unknown_key_is_an_error() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let ctx = rt.run("run");
    let k = key(&ctx, tool("t", Class::Journal), 1);
    let err = rt.resolve(&k, Resolution::Reissue, "").await.unwrap_err();
    assert!(
        matches!(err, idem_runtime::Error::UnknownKey { .. }),
        "{err}"
    );
}

// ---------------------------------------------------------------------------
// Table 2: failures inside one call.
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn not_sent_backs_off_and_retries_in_every_class() {
    for class in [
        Class::ReadOnly,
        Class::Provider,
        Class::Journal,
        Class::AtMostOnce,
    ] {
        let dir = TempDir::new().unwrap();
        let rt = open(dir.path());
        let ctx = rt.run("run");
        let t = tool("t", class);
        let p = Provider::new(&[Step::Refuse, Step::Refuse, Step::Ok]);
        let started = Instant::now();
        let out = if class == Class::ReadOnly {
            read_only(&ctx, t, &p).await
        } else {
            call(&ctx, t, &p, 1, "a", verify_for(class)).await
        };
        assert_eq!(out.unwrap(), "done:a", "{class}");
        assert_eq!(p.calls(), 3);
        // Temporal's defaults without jitter: 1 s, then 2 s.
        assert_eq!(started.elapsed().as_secs(), 3, "{class}");
        assert_eq!(
            count(&rt, |k| matches!(k, EventKind::Retry { .. })).await,
            2
        );
    }
}

/// A read-only call against the fake provider (which needs some key).
async fn read_only(
    ctx: &Ctx,
    t: &'static idem_runtime::ToolDescriptor,
    p: &Provider,
) -> Result<String, ToolError<TestError>> {
    let p = p.clone();
    idem_runtime::__private::call_read_only(ctx, t, move |_c: Ctx| {
        let p = p.clone();
        async move { p.handle_raw("read-only".into(), 0, "a").await.0 }
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn ambiguous_read_only_retries() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let ctx = rt.run("run");
    let t = tool("t", Class::ReadOnly);
    let n = Arc::new(Mutex::new(0));
    let n2 = n.clone();
    let out: Result<u8, ToolError<TestError>> =
        idem_runtime::__private::call_read_only(&ctx, t, move |_c: Ctx| {
            let n2 = n2.clone();
            async move {
                let mut n = n2.lock().unwrap();
                *n += 1;
                if *n < 3 {
                    Err(TestError::Timeout)
                } else {
                    Ok(1)
                }
            }
        })
        .await;
    assert_eq!(out.unwrap(), 1);
    assert_eq!(*n.lock().unwrap(), 3);
}

#[tokio::test(start_paused = true)]
async fn read_only_attempts_are_numbered_and_keyless() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let out: Result<u32, ToolError<TestError>> = idem_runtime::__private::call_read_only(
        &rt.run("run"),
        tool("t", Class::ReadOnly),
        move |c: Ctx| {
            s2.lock()
                .unwrap()
                .push((c.attempt(), c.try_idempotency_key().is_some()));
            let n = c.attempt();
            async move {
                if n < 3 {
                    Err(TestError::Refused)
                } else {
                    Ok(n)
                }
            }
        },
    )
    .await;
    assert_eq!(out.unwrap(), 3);
    assert_eq!(*seen.lock().unwrap(), [(1, false), (2, false), (3, false)]);
}

#[tokio::test(start_paused = true)]
async fn verify_none_escalates_without_waiting() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let p = Provider::new(&[Step::LoseThenTimeout]);
    let started = Instant::now();
    let err = call1(&rt, tool("t", Class::Journal), &p, VerifyMode::None)
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::Escalated { .. }), "{err:?}");
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "no backoff before a certain escalation"
    );
}

#[tokio::test(start_paused = true)]
async fn ambiguous_provider_retries_with_the_same_key() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let p = Provider::deduping(&[Step::LandThenTimeout]);
    let out = call1(&rt, tool("t", Class::Provider), &p, VerifyMode::None).await;
    assert_eq!(out.unwrap(), "done:a");
    let reqs = p.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].0, reqs[1].0);
    assert_eq!((reqs[0].1, reqs[1].1), (1, 2));
    assert_eq!(p.effects(), 1, "the provider deduplicated the retry");
}

#[tokio::test(start_paused = true)]
async fn ambiguous_journal_verifies_before_rerunning() {
    // Landed: verify finds it; no second call.
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let p = Provider::new(&[Step::LandThenTimeout]);
    let out = call1(&rt, tool("t", Class::Journal), &p, VerifyMode::Provider).await;
    assert_eq!(out.unwrap(), "done:a");
    assert_eq!(p.calls(), 1);
    assert_eq!(p.effects(), 1);

    // Not landed: verify says so; then, and only then, a second call.
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let p = Provider::new(&[Step::LoseThenTimeout]);
    let out = call1(&rt, tool("t", Class::Journal), &p, VerifyMode::Provider).await;
    assert_eq!(out.unwrap(), "done:a");
    assert_eq!(p.calls(), 2);
    assert_eq!(p.effects(), 1);
    let evs = events(&rt).await;
    let verified = evs
        .iter()
        .position(|k| matches!(k, EventKind::Verified { .. }))
        .unwrap();
    let second = evs
        .iter()
        .position(|k| *k == EventKind::Attempt { attempt: 2 })
        .unwrap();
    assert!(verified < second, "{evs:?}");

    // Unknown: escalate, no second call.
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let p = Provider::new(&[Step::LoseThenTimeout]);
    let err = call1(&rt, tool("t", Class::Journal), &p, VerifyMode::Unknown)
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::Escalated { .. }), "{err:?}");
    assert_eq!(p.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn ambiguous_at_most_once_escalates_and_never_retries() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let p = Provider::new(&[Step::LoseThenTimeout]);
    let err = call1(&rt, tool("t", Class::AtMostOnce), &p, VerifyMode::None)
        .await
        .unwrap_err();
    let reason = escalation_reason(err);
    assert!(reason.contains("never retries"), "{reason}");
    assert_eq!(p.calls(), 1);
    assert_eq!(
        rt.escalations().await.unwrap()[0].last_error.as_deref(),
        Some("Timeout")
    );
}

#[tokio::test(start_paused = true)]
async fn semantic_read_only_is_returned_without_journal() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let n = Arc::new(Mutex::new(0));
    let n2 = n.clone();
    let out: Result<u8, ToolError<TestError>> = idem_runtime::__private::call_read_only(
        &rt.run("run"),
        tool("t", Class::ReadOnly),
        move |_c: Ctx| {
            *n2.lock().unwrap() += 1;
            async { Err(TestError::Declined) }
        },
    )
    .await;
    assert!(matches!(out, Err(ToolError::Tool(TestError::Declined))));
    assert_eq!(*n.lock().unwrap(), 1);
    assert_eq!(ops(&rt).await.len(), 0);
}

#[tokio::test(start_paused = true)]
async fn semantic_records_rejected_and_returns_it() {
    for class in SIDE_EFFECTING {
        let dir = TempDir::new().unwrap();
        let rt = open(dir.path());
        let p = Provider::new(&[Step::Decline]);
        let err = call1(&rt, tool("t", class), &p, verify_for(class))
            .await
            .unwrap_err();
        assert!(
            matches!(err, ToolError::Tool(TestError::Declined)),
            "{class}: {err:?}"
        );
        assert_eq!(p.calls(), 1);
        assert_eq!(
            count(&rt, |k| matches!(k, EventKind::Rejected { .. })).await,
            1
        );
    }
}

#[tokio::test(start_paused = true)]
async fn budget_spent_read_only_returns_the_last_error() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let t = tool_with("t", Class::ReadOnly, |d| d.retry.max_attempts = 3);
    let n = Arc::new(Mutex::new(0));
    let n2 = n.clone();
    let out: Result<u8, ToolError<TestError>> =
        idem_runtime::__private::call_read_only(&rt.run("run"), t, move |_c: Ctx| {
            *n2.lock().unwrap() += 1;
            async { Err(TestError::Timeout) }
        })
        .await;
    assert!(
        matches!(out, Err(ToolError::Tool(TestError::Timeout))),
        "{out:?}"
    );
    assert_eq!(*n.lock().unwrap(), 3);
}

#[tokio::test(start_paused = true)]
async fn budget_spent_with_ambiguity_escalates() {
    for class in [Class::Provider, Class::Journal] {
        let dir = TempDir::new().unwrap();
        let rt = open(dir.path());
        let t = tool_with("t", class, |d| d.retry.max_attempts = 3);
        let p = Provider::new(&[
            Step::LoseThenTimeout,
            Step::LoseThenTimeout,
            Step::LoseThenTimeout,
        ]);
        let err = call1(&rt, t, &p, VerifyMode::Unknown).await.unwrap_err();
        match class {
            // The provider tool retried the same key three times; the
            // outcome is still unknown.
            Class::Provider => {
                let reason = escalation_reason(err);
                assert!(reason.contains("budget spent"), "{reason}");
                assert_eq!(p.calls(), 3);
            }
            // The journal tool asked verify, which could not tell.
            _ => {
                assert!(matches!(err, ToolError::Escalated { .. }), "{err:?}");
                assert_eq!(p.calls(), 1);
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn budget_spent_provably_not_landed_fails_with_the_last_error() {
    for class in SIDE_EFFECTING {
        let dir = TempDir::new().unwrap();
        let rt = open(dir.path());
        let t = tool_with("t", class, |d| d.retry.max_attempts = 2);
        let p = Provider::new(&[Step::Refuse, Step::Refuse, Step::Ok]);
        let err = call1(&rt, t, &p, verify_for(class)).await.unwrap_err();
        assert!(
            matches!(err, ToolError::Tool(TestError::Refused)),
            "{class}: {err:?}"
        );
        assert_eq!(p.calls(), 2);
        assert_eq!(
            count(&rt, |k| matches!(k, EventKind::Failed { .. })).await,
            1
        );
        // Failed means nothing landed: the next call starts a fresh budget.
        let out = call1(&rt, t, &p, verify_for(class)).await;
        assert_eq!(out.unwrap(), "done:a");
    }
    // Journal: ambiguous, verify says not landed, budget spent: the last
    // error comes back.
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let t = tool_with("t", Class::Journal, |d| d.retry.max_attempts = 2);
    let p = Provider::new(&[Step::LoseThenTimeout, Step::LoseThenTimeout]);
    let err = call1(&rt, t, &p, VerifyMode::Provider).await.unwrap_err();
    assert!(
        matches!(err, ToolError::Tool(TestError::Timeout)),
        "{err:?}"
    );
    assert_eq!(p.calls(), 2);
    assert_eq!(p.effects(), 0);
}

#[tokio::test(start_paused = true)]
async fn max_elapsed_bounds_the_retries() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let t = tool_with("t", Class::Provider, |d| {
        d.retry = RetryPolicy {
            max_attempts: 100,
            initial: Duration::from_secs(10),
            max_elapsed: Some(Duration::from_secs(60)),
            jitter: false,
            ..RetryPolicy::DEFAULT
        }
    });
    let p = Provider::new(&[Step::Refuse; 100]);
    let started = Instant::now();
    let err = call1(&rt, t, &p, VerifyMode::None).await.unwrap_err();
    assert!(matches!(err, ToolError::Tool(TestError::Refused)));
    // Attempts at 0, 10, 30 s; the next would start at 70 s > 60 s.
    assert_eq!(p.calls(), 3);
    assert_eq!(started.elapsed().as_secs(), 30);
}

#[tokio::test(start_paused = true)]
async fn crash_loop_does_not_reset_the_budget() {
    // Each "process" dies while the provider hangs. The attempt counter is
    // durable, so after max_attempts the operation escalates instead of
    // retrying forever.
    let mem = MemJournal::new();
    let t = tool_with("t", Class::Provider, |d| d.retry.max_attempts = 3);
    let p = Provider::deduping(&[]);
    let open_mem = || Runtime::builder().journal(mem.clone()).open().unwrap();
    for _ in 0..3 {
        let rt = open_mem();
        p.push(&[Step::Hang]);
        let ctx = rt.run("run");
        let fut = call(&ctx, t, &p, 1, "a", VerifyMode::None);
        assert!(tokio::time::timeout(Duration::from_secs(5), fut)
            .await
            .is_err());
        drop((ctx, rt));
        mem.crash();
    }
    assert_eq!(mem.crashes(), 3);
    let rt = open_mem();
    let err = call1(&rt, t, &p, VerifyMode::None).await.unwrap_err();
    assert!(matches!(err, ToolError::Escalated { .. }), "{err:?}");
    assert_eq!(p.calls(), 3);
    let attempts: Vec<u32> = p.requests().iter().map(|r| r.1).collect();
    assert_eq!(attempts, [1, 2, 3]);
}

#[tokio::test(start_paused = true)]
async fn max_elapsed_counts_across_restarts() {
    let clock = ManualClock::new(1_800_000_000_000);
    let t = tool_with("t", Class::Provider, |d| {
        d.retry.max_attempts = 100;
        d.retry.max_elapsed = Some(Duration::from_secs(3600));
    });
    let p = Provider::deduping(&[]);
    let (rt, _) = crash_mid_call_with(t, &p, Step::Hang, Some(clock.clone())).await;
    clock.advance(Duration::from_secs(2 * 3600));
    let err = call1(&rt, t, &p, VerifyMode::None).await.unwrap_err();
    let reason = escalation_reason(err);
    assert!(reason.contains("max_elapsed"), "{reason}");
    assert_eq!(p.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn retry_after_is_honoured() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let t = tool("t", Class::Provider);
    let n = Arc::new(Mutex::new(0));
    let n2 = n.clone();
    #[derive(Debug)]
    struct RateLimited;
    impl idem_runtime::Classify for RateLimited {
        fn classify(&self) -> idem_runtime::Failure {
            idem_runtime::Failure::NotSent {
                retry_after: Some(Duration::from_secs(42)),
            }
        }
    }
    let ctx = rt.run("run");
    let started = Instant::now();
    let out: Result<u8, ToolError<RateLimited>> = idem_runtime::__private::call(
        &ctx,
        t,
        key(&ctx, t, 1),
        args(1, "a"),
        move |_c: Ctx| {
            let n2 = n2.clone();
            async move {
                let mut n = n2.lock().unwrap();
                *n += 1;
                if *n == 1 {
                    Err(RateLimited)
                } else {
                    Ok(5)
                }
            }
        },
        None::<fn(Ctx) -> std::future::Ready<_>>,
    )
    .await;
    assert_eq!(out.unwrap(), 5);
    assert_eq!(started.elapsed().as_secs(), 42);
}

#[tokio::test(start_paused = true)]
async fn timeout_makes_an_attempt_ambiguous() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    // at_most_once: an overrun is ambiguous, so it escalates.
    let t = tool_with("t", Class::AtMostOnce, |d| {
        d.timeout = Some(Duration::from_secs(5))
    });
    let p = Provider::new(&[Step::LandThenHang]);
    let err = call1(&rt, t, &p, VerifyMode::None).await.unwrap_err();
    let reason = escalation_reason(err);
    assert!(reason.contains("timed out"), "{reason}");
    // journal: an overrun is verified, found, committed.
    let t = tool_with("t2", Class::Journal, |d| {
        d.timeout = Some(Duration::from_secs(5))
    });
    let p = Provider::new(&[Step::LandThenHang]);
    let out = call1(&rt, t, &p, VerifyMode::Provider).await;
    assert_eq!(out.unwrap(), "done:a");
    assert_eq!(p.calls(), 1);
}

// ---------------------------------------------------------------------------
// Drift, redaction, scopes, steps, provider replays.
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn drift_replays_with_an_event_or_is_rejected() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let ctx = rt.run("run");
    let p = Provider::new(&[]);
    let t = tool("t", Class::Journal);
    call(&ctx, t, &p, 1, "first wording", VerifyMode::Provider)
        .await
        .unwrap();
    // The model re-planned and reworded the body: same key, replayed.
    let out = call(&ctx, t, &p, 1, "second wording", VerifyMode::Provider)
        .await
        .unwrap();
    assert_eq!(out, "done:first wording");
    assert_eq!(p.calls(), 1);
    assert_eq!(
        count(&rt, |k| matches!(
            k,
            EventKind::ArgsDrift {
                policy: OnDrift::Replay
            }
        ))
        .await,
        1
    );

    let strict = tool_with("strict", Class::Journal, |d| d.on_drift = OnDrift::Reject);
    call(&ctx, strict, &p, 1, "first", VerifyMode::Provider)
        .await
        .unwrap();
    let err = call(&ctx, strict, &p, 1, "second", VerifyMode::Provider)
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::ArgsMismatch { .. }), "{err:?}");
    assert_eq!(p.calls(), 2);
    // The same arguments still replay.
    call(&ctx, strict, &p, 1, "first", VerifyMode::Provider)
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn redacted_arguments_never_reach_the_journal() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let ctx = rt.run("run");
    let t = tool("t", Class::AtMostOnce);
    let p = Provider::new(&[Step::LandThenTimeout]);
    let mut a = idem_runtime::__private::Args::new();
    a.serialized("order", &1u64);
    a.redacted("card");
    let secret = "4242424242424242";
    let pc = p.clone();
    let err = idem_runtime::__private::call(
        &ctx,
        t,
        key(&ctx, t, 1),
        a,
        move |c: Ctx| {
            let pc = pc.clone();
            async move { pc.handle(&c, secret).await }
        },
        None::<fn(Ctx) -> std::future::Ready<_>>,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ToolError::Escalated { .. }));
    let esc = &rt.escalations().await.unwrap()[0];
    assert_eq!(esc.args["card"], "<redacted>");
    for rec in ops(&rt).await {
        assert!(!String::from_utf8_lossy(&rec.body).contains(secret));
    }
}

#[tokio::test(start_paused = true)]
async fn children_share_the_root_scope_and_scopes_do_not() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let root = rt.run("order-4711");
    let sub = root.child("refund-agent");
    assert_eq!(sub.agent(), "order-4711/refund-agent");
    let p = Provider::new(&[]);
    let t = tool("t", Class::Journal);
    call(&sub, t, &p, 1, "a", VerifyMode::Provider)
        .await
        .unwrap();
    // The parent retrying the subtask replays the subagent's effect.
    call(&root, t, &p, 1, "a", VerifyMode::Provider)
        .await
        .unwrap();
    call(
        &sub.child("grandchild"),
        t,
        &p,
        1,
        "a",
        VerifyMode::Provider,
    )
    .await
    .unwrap();
    assert_eq!(p.calls(), 1);
    // A deliberate second operation.
    let second = root.scope("second-reminder");
    call(&second, t, &p, 1, "a", VerifyMode::Provider)
        .await
        .unwrap();
    assert_eq!(p.calls(), 2);
    assert_ne!(key(&root, t, 1), key(&second, t, 1));
    assert_eq!(key(&root, t, 1), key(&sub, t, 1));
    // Another root run is another dedupe scope.
    call(&rt.run("order-4712"), t, &p, 1, "a", VerifyMode::Provider)
        .await
        .unwrap();
    assert_eq!(p.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn steps_are_memoized_durably() {
    let dir = TempDir::new().unwrap();
    let polled = Arc::new(Mutex::new(0));
    for _ in 0..2 {
        let rt = open(dir.path());
        let ctx = rt.run("run");
        for _ in 0..2 {
            let polled = polled.clone();
            let plan: Result<Vec<String>, ToolError<TestError>> = ctx
                .step("plan", async move {
                    *polled.lock().unwrap() += 1;
                    Ok(vec!["charge".to_string(), "email".to_string()])
                })
                .await;
            assert_eq!(plan.unwrap(), ["charge", "email"]);
        }
    }
    assert_eq!(*polled.lock().unwrap(), 1);
    // Errors are not memoized.
    let rt = open(dir.path());
    let ctx = rt.run("run");
    let failed: Result<u8, _> = ctx.step("flaky", async { Err(TestError::Refused) }).await;
    assert!(matches!(failed, Err(ToolError::Tool(TestError::Refused))));
    let ok: Result<u8, ToolError<TestError>> = ctx.step("flaky", async { Ok(3) }).await;
    assert_eq!(ok.unwrap(), 3);
    // Scoped steps are distinct.
    let other: Result<u8, ToolError<TestError>> =
        ctx.scope("again").step("flaky", async { Ok(4) }).await;
    assert_eq!(other.unwrap(), 4);
}

#[tokio::test(start_paused = true)]
async fn key_is_stable_across_attempts_and_exposed_to_the_body() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let ctx = rt.run("run");
    let t = tool("t", Class::Provider);
    let p = Provider::deduping(&[Step::Refuse, Step::LoseThenTimeout, Step::Ok]);
    call(&ctx, t, &p, 1, "a", VerifyMode::None).await.unwrap();
    let reqs = p.requests();
    assert_eq!(reqs.len(), 3);
    assert!(reqs.iter().all(|r| r.0 == key(&ctx, t, 1).as_str()));
    assert_eq!(reqs.iter().map(|r| r.1).collect::<Vec<_>>(), [1, 2, 3]);
    assert!(reqs[0].0.len() <= 255);
}

#[test]
#[should_panic(expected = "outside a tool call")]
fn idempotency_key_outside_a_call_panics_clearly() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let _ = rt.run("run").idempotency_key();
}

#[tokio::test(start_paused = true)]
async fn many_tasks_same_key_execute_once() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let ctx = rt.run("run");
    let p = Provider::new(&[]);
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (ctx, p) = (ctx.clone(), p.clone());
        tasks.push(tokio::spawn(async move {
            call(
                &ctx,
                tool("t", Class::Journal),
                &p,
                1,
                "a",
                VerifyMode::Provider,
            )
            .await
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap(), "done:a");
    }
    assert_eq!(p.calls(), 1);
}

#[test]
fn futures_are_send() {
    fn assert_send<F: std::future::Future + Send>(_: F) {}
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let ctx = rt.run("run");
    let p = Provider::new(&[]);
    assert_send(call(
        &ctx,
        tool("t", Class::Journal),
        &p,
        1,
        "a",
        VerifyMode::Provider,
    ));
    assert_send(read_only(&ctx, tool("r", Class::ReadOnly), &p));
}

#[tokio::test(start_paused = true)]
async fn a_committed_result_replays_without_reading_the_journal_again() {
    for cache in [4096, 0] {
        let faulty = FaultyJournal::new(MemJournal::new());
        let rt = Runtime::builder()
            .journal(faulty.clone())
            .replay_cache(cache)
            .open()
            .unwrap();
        let t = tool("t", Class::Journal);
        let p = Provider::new(&[]);
        call1(&rt, t, &p, VerifyMode::Provider).await.unwrap();
        let loads = faulty.loads();
        for _ in 0..10 {
            assert_eq!(
                call1(&rt, t, &p, VerifyMode::Provider).await.unwrap(),
                "done:a"
            );
        }
        let reads = faulty.loads() - loads;
        assert_eq!(reads, if cache > 0 { 0 } else { 10 }, "cache {cache}");
        assert_eq!(p.calls(), 1);
        // Each replay is still in the audit stream.
        assert_eq!(count(&rt, |k| *k == EventKind::DedupeHit).await, 10);
    }
}
