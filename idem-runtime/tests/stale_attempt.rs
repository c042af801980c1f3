//! A worker paused mid-call (SIGSTOP, a frozen VM) must not send anything
//! after the moment another worker that took the call over asks `verify`:
//! the attempt's deadline is checked before the attempt is polled again,
//! and an attempt whose claim may have lapsed before it started is not
//! started at all. Under tokio's paused clock, "paused" is a task that is
//! not polled while time moves.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::journal::{BoxFuture, Journal, Write, Written};
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
    idem_runtime::__private::call(
        &ctx,
        t,
        key(&ctx, t, 1),
        args(1, "a"),
        attempt,
        Some(verify),
    )
    .await
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
/// a process paused right after it).
struct SlowOnce {
    inner: Arc<dyn Journal>,
    slow: Duration,
    armed: AtomicBool,
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
    fn local(&self) -> &idem_runtime::journal::Local {
        self.inner.local()
    }
    fn renewal(&self) -> Option<Duration> {
        self.inner.renewal()
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
