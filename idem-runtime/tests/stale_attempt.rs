//! A worker paused mid-call (SIGSTOP, a frozen VM) must not send anything
//! after the moment another worker that took the call over asks `verify`:
//! the attempt's deadline is checked before the attempt is polled again,
//! and an attempt whose claim may have lapsed before it started is not
//! started at all. Under tokio's paused clock, "paused" is a task that is
//! not polled while time moves.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::journal::{write_then_load, BoxFuture, Claimed, Journal, Space, Write, Written};
use idem_runtime::{Class, Ctx, Runtime, ToolError, Verdict};
use idem_testkit::engine::{args, key, tool_with, TestError};
use idem_testkit::{MemJournal, ProcessView};

/// A tool whose first attempt, once polled, waits to be woken and then
/// "sends" (counts a request); later attempts send at once.
struct Gate {
    woken: tokio::sync::Notify,
    polled: AtomicBool,
    sent: AtomicUsize,
    attempts: AtomicUsize,
}

async fn gated_call(
    rt: &Runtime,
    t: &'static idem_runtime::ToolDescriptor,
    gate: &Arc<Gate>,
) -> Result<u32, ToolError<TestError>> {
    let ctx = rt.run("run");
    let g = gate.clone();
    let attempt = move |c: Ctx| {
        let g = g.clone();
        async move {
            g.attempts.fetch_add(1, Ordering::SeqCst);
            if c.attempt() == 1 {
                g.polled.store(true, Ordering::SeqCst);
                g.woken.notified().await;
            }
            g.sent.fetch_add(1, Ordering::SeqCst);
            Ok(c.attempt())
        }
    };
    let g = gate.clone();
    let verify = move |_c: Ctx| {
        let g = g.clone();
        async move {
            Ok(match g.sent.load(Ordering::SeqCst) {
                0 => Verdict::NotLanded,
                _ => Verdict::Landed(0),
            })
        }
    };
    order_1(&ctx, t, attempt, verify).await
}

/// Calls `t` for order 1 with `attempt` and `verify`.
async fn order_1<A, AF, V, VF>(
    ctx: &Ctx,
    t: &'static idem_runtime::ToolDescriptor,
    attempt: A,
    verify: V,
) -> Result<u32, ToolError<TestError>>
where
    A: FnMut(Ctx) -> AF,
    AF: std::future::Future<Output = Result<u32, TestError>>,
    V: FnMut(Ctx) -> VF,
    VF: std::future::Future<Output = Result<Verdict<u32>, TestError>>,
{
    idem_runtime::__private::call(ctx, t, key(ctx, t, 1), args(1, "a"), attempt, Some(verify)).await
}

/// Calls `t` for order 1 in run "run" of `rt`: every attempt counts in
/// `sent` and answers `answer`; verify says it did not land.
async fn counted_call(
    rt: &Runtime,
    t: &'static idem_runtime::ToolDescriptor,
    sent: &Arc<AtomicUsize>,
    answer: Result<u32, TestError>,
) -> Result<u32, ToolError<TestError>> {
    let attempt = |_c: Ctx| {
        sent.fetch_add(1, Ordering::SeqCst);
        std::future::ready(answer.clone())
    };
    let verify = |_c: Ctx| async { Ok(Verdict::<u32>::NotLanded) };
    order_1(&rt.run("run"), t, attempt, verify).await
}

#[tokio::test(start_paused = true)]
async fn an_attempt_past_its_deadline_is_dropped_before_it_is_polled_again() {
    let rt = Runtime::builder()
        .journal(MemJournal::new())
        .open()
        .unwrap();
    let t = tool_with("t", Class::Journal, |d| {
        d.timeout = Some(Duration::from_secs(5))
    });
    let gate = Arc::new(Gate {
        woken: tokio::sync::Notify::new(),
        polled: AtomicBool::new(false),
        sent: AtomicUsize::new(0),
        attempts: AtomicUsize::new(0),
    });
    let call = tokio::spawn({
        let (rt, gate) = (rt.clone(), gate.clone());
        async move { gated_call(&rt, t, &gate).await }
    });
    while !gate.polled.load(Ordering::SeqCst) {
        tokio::task::yield_now().await;
    }
    // The process "wakes" 6 s later with the attempt ready to send: the
    // deadline (5 s) passed first, so it must not be polled.
    gate.woken.notify_one();
    tokio::time::advance(Duration::from_secs(6)).await;
    let out = call.await.unwrap();
    // Timed out (ambiguous), verify said not landed, attempt 2 sent.
    assert_eq!(out.unwrap(), 2);
    assert_eq!(
        gate.sent.load(Ordering::SeqCst),
        1,
        "the first attempt sent nothing"
    );
}

/// A journal whose next INTENT write takes `slow` (a stalled database, or
/// a process paused right after it). With `blind_claims`, a claim that
/// finds the record says it could not see it (`Exists(None)`), as
/// PostgreSQL's does when the record was committed after the claim's
/// snapshot.
struct SlowOnce {
    inner: Arc<dyn Journal>,
    slow: Duration,
    armed: AtomicBool,
    blind_claims: bool,
}

impl SlowOnce {
    fn delay(&self) -> Option<Duration> {
        self.armed
            .swap(false, Ordering::SeqCst)
            .then_some(self.slow)
    }
}

macro_rules! delegate {
    ($($name:ident($($arg:ident: $ty:ty),*) -> $out:ty;)*) => {$(
        fn $name<'a>(&'a self, $($arg: $ty),*) -> BoxFuture<'a, $out> {
            self.inner.$name($($arg),*)
        }
    )*};
}

impl Journal for SlowOnce {
    fn location(&self) -> &str {
        self.inner.location()
    }
    fn renewal(&self) -> Option<Duration> {
        self.inner.renewal()
    }
    fn claim_first(&self) -> bool {
        self.inner.claim_first()
    }
    fn claim<'a>(
        &'a self,
        write: Write<'a>,
    ) -> BoxFuture<'a, Result<Claimed, idem_runtime::Error>> {
        Box::pin(async move {
            Ok(match write_then_load(self, write).await? {
                Claimed::Exists(_) if self.blind_claims => Claimed::Exists(None),
                claimed => claimed,
            })
        })
    }
    fn write<'a>(
        &'a self,
        write: Write<'a>,
    ) -> BoxFuture<'a, Result<Written, idem_runtime::Error>> {
        Box::pin(async move {
            let out = self.inner.write(write).await;
            if let Some(d) = self.delay() {
                tokio::time::sleep(d).await;
            }
            out
        })
    }
    delegate! {
        load(space: idem_runtime::journal::Space, key: &'a idem_runtime::journal::Digest)
            -> Result<Option<idem_runtime::journal::Loaded>, idem_runtime::Error>;
        renew(owner: &'a idem_runtime::Owner, held: &'a [idem_runtime::journal::Held])
            -> Result<Vec<bool>, idem_runtime::Error>;
        changed(space: idem_runtime::journal::Space, key: &'a idem_runtime::journal::Digest, version: u64) -> ();
        append(events: &'a [idem_runtime::journal::NewEvent<'a>], durability: idem_runtime::journal::Durability)
            -> Result<Vec<u64>, idem_runtime::Error>;
        events(from: u64, limit: usize) -> Result<idem_runtime::journal::EventRows, idem_runtime::Error>;
        scan(space: idem_runtime::journal::Space, after: Option<&'a idem_runtime::journal::Digest>, limit: usize)
            -> Result<Vec<(idem_runtime::journal::Digest, idem_runtime::journal::Loaded)>, idem_runtime::Error>;
        remove(space: idem_runtime::journal::Space, key: &'a idem_runtime::journal::Digest, version: u64)
            -> Result<bool, idem_runtime::Error>;
    }
    fn truncate_events(&self, before: u64) -> BoxFuture<'_, Result<u64, idem_runtime::Error>> {
        self.inner.truncate_events(before)
    }
    fn escalated(
        &self,
    ) -> BoxFuture<
        '_,
        Result<
            Vec<(idem_runtime::journal::Digest, idem_runtime::journal::Loaded)>,
            idem_runtime::Error,
        >,
    > {
        self.inner.escalated()
    }
    fn sync(&self) -> BoxFuture<'_, Result<(), idem_runtime::Error>> {
        self.inner.sync()
    }
    fn size_on_disk(&self) -> BoxFuture<'_, Result<u64, idem_runtime::Error>> {
        self.inner.size_on_disk()
    }
}

#[tokio::test(start_paused = true)]
async fn an_attempt_whose_lease_may_have_lapsed_is_not_started() {
    let clock = idem_runtime::ManualClock::new(1_800_000_000_000);
    let mem = MemJournal::with_leases(Arc::new(clock), Duration::from_secs(3));
    let journal = Arc::new(SlowOnce {
        inner: ProcessView::new(mem),
        slow: Duration::from_millis(2500),
        armed: AtomicBool::new(true),
        blind_claims: false,
    });
    let rt = Runtime::builder().journal(journal).open().unwrap();
    let t = tool_with("t", Class::Journal, |_| {});
    let gate = Arc::new(Gate {
        woken: tokio::sync::Notify::new(),
        polled: AtomicBool::new(false),
        sent: AtomicUsize::new(0),
        attempts: AtomicUsize::new(0),
    });
    gate.woken.notify_one();
    let out = gated_call(&rt, t, &gate).await;
    // The INTENT of attempt 1 took 2.5 s of a 3 s lease: not sent; the
    // call re-decided (verify: not landed) and attempt 2 went out.
    assert_eq!(out.unwrap(), 2);
    assert_eq!(
        gate.attempts.load(Ordering::SeqCst),
        1,
        "attempt 1 never started"
    );
    assert_eq!(gate.sent.load(Ordering::SeqCst), 1);
}

/// A call that claims a key without reading it first (the journal's
/// `claim_first`, as PostgreSQL's) and is then fenced by a worker that took
/// the call over re-decides from what that worker decided, as any call that
/// waited would: here it shares the provider's refusal instead of asking
/// the provider again under a new generation.
#[tokio::test(start_paused = true)]
async fn a_call_fenced_after_claiming_unread_shares_the_new_owners_decision() {
    let clock = Arc::new(idem_runtime::ManualClock::new(1_800_000_000_000));
    let mem = MemJournal::with_leases(clock.clone(), Duration::from_secs(3));
    assert!(mem.claim_first(), "the model claims first, as PostgreSQL");
    // Worker A's INTENT lands, then A stalls past its lease (4 s of 3 s).
    let slow = Arc::new(SlowOnce {
        inner: ProcessView::new(mem.clone()),
        slow: Duration::from_secs(4),
        armed: AtomicBool::new(true),
        blind_claims: false,
    });
    let a_journal: Arc<dyn Journal> = slow.clone();
    let a = Runtime::builder().journal(a_journal).open().unwrap();
    let b = Runtime::builder()
        .journal(ProcessView::new(mem.clone()))
        .open()
        .unwrap();
    let t = tool_with("t", Class::Journal, |_| {});
    let sent = Arc::new(AtomicUsize::new(0));
    let digest = *key(&a.run("run"), t, 1).digest();
    let a_call = tokio::spawn({
        let (a, sent) = (a.clone(), sent.clone());
        async move { counted_call(&a, t, &sent, Ok(1)).await }
    });
    // Until A's INTENT is in the journal (A is inside its stalled write).
    let mut waited = Duration::ZERO;
    while mem.load(Space::Ops, &digest).await.unwrap().is_none() {
        tokio::time::sleep(Duration::from_millis(10)).await;
        waited += Duration::from_millis(10);
        assert!(waited < Duration::from_secs(1), "A never wrote its INTENT");
    }
    // A's lease lapses; B takes the call over, verifies (not landed), asks
    // the provider, which refuses.
    clock.advance(Duration::from_secs(5));
    let b_out = counted_call(&b, t, &sent, Err(TestError::Declined)).await;
    assert!(
        matches!(b_out, Err(ToolError::Tool(TestError::Declined))),
        "{b_out:?}"
    );
    assert_eq!(sent.load(Ordering::SeqCst), 1);
    // A's write returns: its claim may have lapsed, so it sends nothing and
    // re-decides from the record, which holds B's refusal.
    let a_out = a_call.await.unwrap();
    assert!(
        matches!(
            &a_out,
            Err(ToolError::Journal(idem_runtime::Error::Rejected { .. }))
        ),
        "A shares B's refusal: {a_out:?}"
    );
    assert_eq!(
        sent.load(Ordering::SeqCst),
        1,
        "the provider was asked once"
    );
}

/// A claim that loses to a call which created the record after the claim
/// looked (PostgreSQL's `Exists(None)`) is a concurrent duplicate, as when
/// a record appears between a read and the first write: the call reads the
/// record and shares that call's decision, here the provider's refusal,
/// instead of asking the provider again under a new generation.
#[tokio::test(start_paused = true)]
async fn a_claim_that_lost_to_an_unseen_record_shares_its_decision() {
    let clock = Arc::new(idem_runtime::ManualClock::new(1_800_000_000_000));
    let mem = MemJournal::with_leases(clock, Duration::from_secs(3));
    let first = Runtime::builder()
        .journal(ProcessView::new(mem.clone()))
        .open()
        .unwrap();
    let blind: Arc<dyn Journal> = Arc::new(SlowOnce {
        inner: ProcessView::new(mem.clone()),
        slow: Duration::ZERO,
        armed: AtomicBool::new(false),
        blind_claims: true,
    });
    let second = Runtime::builder().journal(blind).open().unwrap();
    let t = tool_with("t", Class::Journal, |_| {});
    let sent = Arc::new(AtomicUsize::new(0));
    let out = counted_call(&first, t, &sent, Err(TestError::Declined)).await;
    assert!(
        matches!(out, Err(ToolError::Tool(TestError::Declined))),
        "{out:?}"
    );
    let out = counted_call(&second, t, &sent, Ok(1)).await;
    assert!(
        matches!(
            &out,
            Err(ToolError::Journal(idem_runtime::Error::Rejected { .. }))
        ),
        "shares the refusal: {out:?}"
    );
    assert_eq!(
        sent.load(Ordering::SeqCst),
        1,
        "the provider was asked once"
    );
}

/// The type of an absent `verify`.
type NoVerify = fn(Ctx) -> std::future::Ready<Result<Verdict<u32>, TestError>>;

/// An attempt whose INTENT's write took longer than the tool's timeout is
/// never polled (its deadline passed before it started), so the tool's
/// code never ran and nothing was sent: even an at_most_once tool backs
/// off and tries again instead of escalating a call that cannot have
/// reached the provider (a database failover's stall, say).
#[tokio::test(start_paused = true)]
async fn an_attempt_whose_intent_outlasted_its_timeout_sent_nothing_and_is_tried_again() {
    let journal = Arc::new(SlowOnce {
        inner: ProcessView::new(MemJournal::new()),
        slow: Duration::from_millis(1500),
        armed: AtomicBool::new(true),
        blind_claims: false,
    });
    let rt = Runtime::builder().journal(journal).open().unwrap();
    let t = tool_with("wire", Class::AtMostOnce, |d| {
        d.timeout = Some(Duration::from_secs(1));
        d.retry.initial = Duration::from_millis(10);
    });
    let sent = Arc::new(AtomicUsize::new(0));
    let ctx = rt.run("run");
    let s = sent.clone();
    // Counts when its code runs (polled), not when the future is made.
    let attempt = move |c: Ctx| {
        let s = s.clone();
        async move {
            s.fetch_add(1, Ordering::SeqCst);
            Ok::<u32, TestError>(c.attempt())
        }
    };
    let no_verify: Option<NoVerify> = None;
    let out =
        idem_runtime::__private::call(&ctx, t, key(&ctx, t, 1), args(1, "a"), attempt, no_verify)
            .await;
    // Attempt 1 never ran; attempt 2 did, once.
    assert_eq!(out.unwrap(), 2);
    assert_eq!(sent.load(Ordering::SeqCst), 1);
}
