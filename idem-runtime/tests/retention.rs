//! Retention: what `Runtime::prune` may forget, and what it never does.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use idem_runtime::__private::{inventory, RegisteredTool};
use idem_runtime::journal::{ClaimChange, Durability, Expect, Space, Write};
use idem_runtime::{Class, ManualClock, Runtime, ToolDescriptor, ToolError};
use tempfile::TempDir;

const DAY: Duration = Duration::from_secs(24 * 3600);

static LONG_WINDOW: ToolDescriptor = {
    let mut d = ToolDescriptor::new("long_window", Class::Provider);
    d.dedupe_window = Duration::from_secs(3 * 24 * 3600);
    d
};
inventory::submit! { RegisteredTool(&LONG_WINDOW) }

fn runtime(dir: &std::path::Path, clock: &ManualClock, keep: Duration) -> Runtime {
    Runtime::builder()
        .path(dir)
        .clock(Arc::new(clock.clone()))
        .retention(keep)
        .open()
        .unwrap()
}

#[test]
fn retention_is_never_shorter_than_the_longest_dedupe_window() {
    let dir = TempDir::new().unwrap();
    let clock = ManualClock::new(1_800_000_000_000);
    assert_eq!(
        runtime(dir.path(), &clock, Duration::from_secs(60)).retention(),
        3 * DAY
    );
    let dir = TempDir::new().unwrap();
    assert_eq!(runtime(dir.path(), &clock, 10 * DAY).retention(), 10 * DAY);
}

#[tokio::test(start_paused = true)]
async fn prune_forgets_old_finished_work_and_keeps_everything_unsettled() {
    let dir = TempDir::new().unwrap();
    let clock = ManualClock::new(1_800_000_000_000);
    let p = Provider::new(&[]);
    let t = tool("t", Class::Journal);
    let wire = tool("wire", Class::AtMostOnce);
    let provider = tool("pay", Class::Provider);
    {
        let rt = runtime(dir.path(), &clock, 7 * DAY);
        let ctx = rt.run("run");
        for order in 0..10 {
            call(&ctx, t, &p, order, "a", VerifyMode::Provider)
                .await
                .unwrap();
        }
        // Escalated: an ambiguous wire transfer.
        p.push(&[Step::LandThenTimeout]);
        let err = call(&ctx, wire, &p, 1, "w", VerifyMode::None)
            .await
            .unwrap_err();
        assert!(matches!(err, ToolError::Escalated { .. }));
        let step: Result<u8, ToolError<TestError>> = ctx.step("plan", async { Ok(1) }).await;
        step.unwrap();
        // In doubt: the process dies with a provider call outstanding.
        p.push(&[Step::Hang]);
        let fut = call(&ctx, provider, &p, 1, "x", VerifyMode::None);
        assert!(tokio::time::timeout(Duration::from_secs(1), fut)
            .await
            .is_err());
    }
    let rt = runtime(dir.path(), &clock, 7 * DAY);
    let before = rt.audit(0).await.unwrap();
    let events_before = before.len() as u64;
    let last_seq = before.last().unwrap().seq;

    // Too young: nothing goes.
    clock.advance(6 * DAY);
    let report = rt.prune().await.unwrap();
    assert_eq!(
        (
            report.ops_removed,
            report.steps_removed,
            report.events_removed
        ),
        (0, 0, 0)
    );
    assert_eq!(report.ops_scanned, 12);

    // Eight days on: the ten committed operations, the step and their events
    // go; the escalation and the operation in doubt stay.
    clock.advance(2 * DAY);
    let report = rt.prune().await.unwrap();
    assert_eq!(report.ops_removed, 10, "{report:?}");
    assert_eq!(report.ops_kept_open, 2, "{report:?}");
    assert_eq!(report.steps_removed, 1);
    // Every event was written eight days ago: all of them go (the stream
    // is kept by time; the records that still matter are kept by state).
    assert_eq!(report.events_removed, events_before, "{report:?}");
    assert!(rt.audit(0).await.unwrap().is_empty());
    let left = rt.journal().scan(Space::Ops, None, 100).await.unwrap();
    assert_eq!(left.len(), 2);
    assert_eq!(rt.escalations().await.unwrap().len(), 1);
    // The operation in doubt was kept: called again it is recovered, not
    // run afresh, and eight days exceed its retry horizon, so it escalates.
    let calls = p.calls();
    let err = call(&rt.run("run"), provider, &p, 1, "x", VerifyMode::None)
        .await
        .unwrap_err();
    let reason = escalation_reason(err);
    assert!(
        reason.contains("max_elapsed") && reason.contains("dropped"),
        "{reason}"
    );
    assert_eq!(p.calls(), calls);
    // A pruned operation is forgotten: called again, it is a new one.
    let calls = p.calls();
    call(&rt.run("run"), t, &p, 0, "a", VerifyMode::Provider)
        .await
        .unwrap();
    assert_eq!(p.calls(), calls + 1);
    // Sequence numbers are never handed out twice, pruning or not, and
    // across a reopen.
    drop(rt);
    let rt = runtime(dir.path(), &clock, 7 * DAY);
    call(&rt.run("run"), t, &p, 1, "a", VerifyMode::Provider)
        .await
        .unwrap();
    let after = rt.audit(0).await.unwrap();
    assert!(after.first().unwrap().seq > last_seq, "{after:?}");
    assert!(after.windows(2).all(|w| w[0].seq < w[1].seq));
}

#[tokio::test(start_paused = true)]
async fn prune_leaves_undecodable_records_alone() {
    let dir = TempDir::new().unwrap();
    let clock = ManualClock::new(1_800_000_000_000);
    let rt = runtime(dir.path(), &clock, DAY);
    rt.journal()
        .write(Write {
            space: Space::Ops,
            key: &[7; 32],
            expect: Expect::Absent,
            body: b"garbage",
            claim: ClaimChange::Release,
            escalated: false,
            events: &[],
            durability: Durability::Immediate,
        })
        .await
        .unwrap();
    clock.advance(30 * DAY);
    let report = rt.prune().await.unwrap();
    assert_eq!((report.undecodable, report.ops_removed), (1, 0));
    assert!(rt
        .journal()
        .load(Space::Ops, &[7; 32])
        .await
        .unwrap()
        .is_some());
}
