//! One conformance suite for every journal backend: each row of the
//! engine's two decision tables, crash points, fencing of a stale owner,
//! many workers racing one key, corruption and audit ordering, written
//! once against [`Backend`] and instantiated per backend by
//! [`conformance_suite!`](crate::conformance_suite) as `#[tokio::test]`s.
//!
//! The cases run under real time (a database's I/O does not let tokio's
//! clock be paused): tools retry at millisecond intervals set in their
//! [`ToolDescriptor`], waits are on the thing itself (a provider request
//! arriving, a lease running out), and time that must pass in large steps
//! (a dedupe window, `max_elapsed` across restarts) passes on a
//! [`ManualClock`] given to the runtime.
//!
//! A *worker* is a runtime with a worker id on its own view of the journal
//! ([`Backend::open`]): its own process on a shared database, the one open
//! journal of a single-process backend. A *crash* drops a worker's runtime
//! mid-call and then [`Backend::crash`]es (what a SIGKILL leaves); the
//! restarted worker keeps its worker id.
//!
//! ```ignore
//! idem_testkit::conformance_suite!(idem_testkit::conformance::sled());
//! ```

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::journal::{BoxFuture, Journal, Space};
use idem_runtime::{
    Class, EventKind, ManualClock, Resolution, RetryPolicy, Runtime, SledJournal, ToolDescriptor,
    ToolError,
};

use crate::engine::{
    call, events as kinds, key, tool_with, ScriptedProvider, Step, TestError, VerifyMode,
};
use crate::journal::{overwrite_record, FaultyJournal, MemJournal, ProcessView};

/// A journal backend under test.
pub trait Backend: Send + Sync + 'static {
    /// For messages.
    fn name(&self) -> &'static str;

    /// Whether claims are leases on a clock (a shared database): a worker
    /// that stops renewing is taken over once its lease runs out.
    fn leases(&self) -> bool;

    /// The journal as a new worker sees it.
    fn open(&self) -> BoxFuture<'_, Arc<dyn Journal>>;

    /// The journal as a new worker whose leases last `lease` sees it (for
    /// the stale-owner case; backends whose lease is fixed ignore it).
    fn open_with_lease(&self, lease: Duration) -> BoxFuture<'_, Arc<dyn Journal>> {
        let _ = lease;
        self.open()
    }

    /// What a crash of every worker leaves (their runtimes are dropped
    /// before this is called).
    fn crash(&self) -> BoxFuture<'_, ()>;
}

/// The in-memory journal: without leases (one process, as sled), or with
/// leases on the system clock (a shared database).
pub struct Mem {
    journal: Arc<MemJournal>,
    leases: bool,
    current: Mutex<Option<Arc<dyn Journal>>>,
}

/// [`MemJournal`] without leases.
pub async fn mem() -> Box<dyn Backend> {
    Box::new(Mem {
        journal: MemJournal::new(),
        leases: false,
        current: Mutex::new(None),
    })
}

/// [`MemJournal`] with leases of 800 ms on the system clock.
pub async fn mem_with_leases() -> Box<dyn Backend> {
    Box::new(Mem {
        journal: MemJournal::with_leases(
            Arc::new(idem_runtime::SystemClock::new()),
            Duration::from_millis(800),
        ),
        leases: true,
        current: Mutex::new(None),
    })
}

impl Backend for Mem {
    fn name(&self) -> &'static str {
        if self.leases {
            "memory with leases"
        } else {
            "memory"
        }
    }

    fn leases(&self) -> bool {
        self.leases
    }

    fn open(&self) -> BoxFuture<'_, Arc<dyn Journal>> {
        let view: Arc<dyn Journal> = if self.leases {
            ProcessView::new(self.journal.clone())
        } else {
            let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
            current
                .get_or_insert_with(|| ProcessView::new(self.journal.clone()))
                .clone()
        };
        Box::pin(std::future::ready(view))
    }

    fn crash(&self) -> BoxFuture<'_, ()> {
        self.journal.crash();
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = None;
        Box::pin(std::future::ready(()))
    }
}

/// The sled journal in a temporary directory; a crash closes it and the
/// next worker reopens it.
pub struct Sled {
    dir: tempfile_dir::TempDir,
    current: Mutex<Option<Arc<SledJournal>>>,
}

/// [`SledJournal`] in a fresh temporary directory.
pub async fn sled() -> Box<dyn Backend> {
    Box::new(Sled {
        dir: tempfile_dir::TempDir::new(),
        current: Mutex::new(None),
    })
}

impl Backend for Sled {
    fn name(&self) -> &'static str {
        "sled"
    }

    fn leases(&self) -> bool {
        false
    }

    fn open(&self) -> BoxFuture<'_, Arc<dyn Journal>> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        let j = current
            .get_or_insert_with(|| {
                Arc::new(SledJournal::open(self.dir.path()).expect("open the sled journal"))
            })
            .clone();
        Box::pin(std::future::ready(j as Arc<dyn Journal>))
    }

    fn crash(&self) -> BoxFuture<'_, ()> {
        let j = self
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(j) = j {
            assert_eq!(
                Arc::strong_count(&j),
                1,
                "a crashed worker's runtime is still alive"
            );
        }
        Box::pin(std::future::ready(()))
    }
}

/// A temporary directory without a dependency on `tempfile`.
mod tempfile_dir {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicU64, Ordering};

    static N: AtomicU64 = AtomicU64::new(0);

    pub struct TempDir(PathBuf);

    impl TempDir {
        pub fn new() -> TempDir {
            let path = std::env::temp_dir().join(format!(
                "idem-conformance-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::SeqCst)
            ));
            let _ = std::fs::remove_dir_all(&path);
            TempDir(path)
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// The PostgreSQL journal in a fresh database of the process's shared
/// test server ([`crate::pg::PgServer::shared`]); every worker connects on
/// its own (its own pool, listener and table of calls in flight), as a
/// process would. Leases last 30 s unless a case asks otherwise; a crash
/// is the workers' runtimes being dropped.
#[cfg(feature = "postgres")]
pub struct Postgres {
    url: String,
}

/// [`idem_runtime::PostgresJournal`] in a fresh database.
#[cfg(feature = "postgres")]
pub async fn postgres() -> Box<dyn Backend> {
    let server = crate::pg::PgServer::shared();
    let url = server.create_database().expect("create a test database");
    Box::new(Postgres { url })
}

#[cfg(feature = "postgres")]
impl Backend for Postgres {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn leases(&self) -> bool {
        true
    }

    fn open(&self) -> BoxFuture<'_, Arc<dyn Journal>> {
        self.open_with_lease(Duration::from_secs(30))
    }

    fn open_with_lease(&self, lease: Duration) -> BoxFuture<'_, Arc<dyn Journal>> {
        Box::pin(async move {
            let options = idem_runtime::PostgresOptions {
                lease,
                pool_size: 8,
                ..idem_runtime::PostgresOptions::default()
            };
            let j = idem_runtime::PostgresJournal::connect_with(&self.url, &options)
                .await
                .expect("connect to the test database");
            Arc::new(j) as Arc<dyn Journal>
        })
    }

    fn crash(&self) -> BoxFuture<'_, ()> {
        Box::pin(std::future::ready(()))
    }
}

/// Instantiates every case of the suite as a `#[tokio::test]` for the
/// backend that `$factory` (an expression of type
/// `impl Future<Output = Box<dyn Backend>>`) makes, one fresh backend per
/// test. With `, leases` the cases that need expiring claims are added.
#[macro_export]
macro_rules! conformance_suite {
    ($factory:expr) => {
        $crate::conformance_suite!(@cases $factory;
            none_intent_is_durable_before_the_provider_hears_of_it,
            committed_is_replayed_without_a_call,
            committed_survives_a_crash,
            in_flight_here_is_waited_for_and_shared,
            in_flight_in_another_worker_is_waited_for_and_shared,
            in_flight_too_long_is_refused_as_in_flight,
            dropped_leader_releases_its_waiters_who_recover,
            crash_after_intent_before_the_effect,
            crash_after_the_effect_before_commit,
            dead_owner_provider_outside_the_dedupe_window_escalates,
            dead_owner_provider_out_of_budget_escalates,
            dead_owner_journal_verify_undecided_escalates,
            rejected_runs_again_under_the_next_generation,
            escalated_is_refused_and_resolutions_are_followed,
            not_sent_backs_off_and_retries_in_every_class,
            ambiguous_provider_retries_with_the_same_key,
            ambiguous_journal_verifies_before_rerunning,
            ambiguous_at_most_once_escalates,
            semantic_is_recorded_rejected_and_returned,
            budget_spent_escalates_or_fails,
            crash_loop_does_not_reset_the_budget,
            max_elapsed_counts_across_restarts,
            many_workers_one_key_one_provider_call,
            an_undecodable_record_is_an_error_never_absent,
            audit_sequence_is_strictly_increasing_and_followers_miss_nothing,
            sequence_numbers_never_go_back_after_a_prune_and_a_crash,
            steps_are_memoized_across_crashes,
            every_event_names_the_worker_that_acted,
            approval_is_asked_once_and_any_worker_decides,
            a_call_waiting_for_approval_is_woken_by_a_decision_elsewhere
        );
    };
    ($factory:expr, leases) => {
        $crate::conformance_suite!($factory);
        $crate::conformance_suite!(@cases $factory;
            a_stale_owner_is_fenced_and_returns_no_wrong_answer
        );
    };
    (@cases $factory:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let backend = $factory.await;
                $crate::conformance::$case(&*backend).await;
            }
        )*
    };
}

// ---------------------------------------------------------------------------
// Fixtures.
// ---------------------------------------------------------------------------

const SIDE_EFFECTING: [Class; 3] = [Class::Provider, Class::Journal, Class::AtMostOnce];

/// Millisecond retries: 2 ms, doubling, at most 20 ms; five attempts.
fn fast(name: &'static str, class: Class) -> &'static ToolDescriptor {
    fast_with(name, class, |_| {})
}

fn fast_with(
    name: &'static str,
    class: Class,
    f: impl FnOnce(&mut ToolDescriptor),
) -> &'static ToolDescriptor {
    tool_with(name, class, |d| {
        d.retry = RetryPolicy {
            max_attempts: 5,
            initial: Duration::from_millis(2),
            backoff: 2.0,
            max_interval: Duration::from_millis(20),
            max_elapsed: Some(Duration::from_secs(60)),
            jitter: false,
        };
        f(d)
    })
}

fn verify_for(class: Class) -> VerifyMode {
    match class {
        Class::Journal => VerifyMode::Provider,
        _ => VerifyMode::None,
    }
}

/// A worker on the backend.
async fn worker(b: &dyn Backend, id: &str) -> Runtime {
    worker_with(b, id, None, Duration::from_secs(20)).await
}

async fn worker_with(
    b: &dyn Backend,
    id: &str,
    clock: Option<&ManualClock>,
    in_flight_wait: Duration,
) -> Runtime {
    let j = b.open().await;
    build(j, id, clock, in_flight_wait)
}

fn build(
    j: Arc<dyn Journal>,
    id: &str,
    clock: Option<&ManualClock>,
    in_flight_wait: Duration,
) -> Runtime {
    let mut builder = Runtime::builder()
        .journal(j)
        .worker_id(id)
        .in_flight_wait(in_flight_wait);
    if let Some(c) = clock {
        builder = builder.clock(Arc::new(c.clone()));
    }
    builder.open().expect("start a runtime")
}

/// Starts a call on worker `id`, lets it reach the provider (whose next
/// request does `step`), then kills the worker there: its call is dropped,
/// its runtime goes, the backend crashes. Returns the worker restarted
/// under the same id.
async fn crash_mid_call(
    b: &dyn Backend,
    t: &'static ToolDescriptor,
    p: &ScriptedProvider,
    step: Step,
    clock: Option<&ManualClock>,
) -> Runtime {
    {
        let rt = worker_with(b, "w1", clock, Duration::from_secs(20)).await;
        p.push(&[step]);
        let before = p.calls();
        let ctx = rt.run("run");
        let call = call(&ctx, t, p, 1, "a", VerifyMode::Provider);
        tokio::select! {
            out = call => panic!("{}: the call was to be killed mid-flight, it returned {out:?}", b.name()),
            () = p.wait_requests(before + 1) => {}
        }
    }
    b.crash().await;
    worker_with(b, "w1", clock, Duration::from_secs(20)).await
}

async fn call1(
    rt: &Runtime,
    t: &'static ToolDescriptor,
    p: &ScriptedProvider,
    verify: VerifyMode,
) -> Result<String, ToolError<TestError>> {
    call(&rt.run("run"), t, p, 1, "a", verify).await
}

// ---------------------------------------------------------------------------
// Table 1: what a call finds.
// ---------------------------------------------------------------------------

/// none: INTENT, durable, then the call; COMMIT durable before the caller
/// hears of it.
pub async fn none_intent_is_durable_before_the_provider_hears_of_it(b: &dyn Backend) {
    let faulty = FaultyJournal::new(b.open().await);
    let rt = build(faulty.clone(), "w1", None, Duration::from_secs(20));
    for (i, class) in SIDE_EFFECTING.into_iter().enumerate() {
        let p = ScriptedProvider::new(&[]);
        p.log_to(faulty.log());
        let t = fast(["p", "j", "a"][i], class);
        let start = faulty.log().lock().unwrap().len();
        let out = call(&rt.run("run"), t, &p, 1, "a", verify_for(class)).await;
        assert_eq!(out.unwrap(), "done:a", "{}: {class}", b.name());
        let log = faulty.log().lock().unwrap()[start..].to_vec();
        let at = |pred: &dyn Fn(&String) -> bool| log.iter().position(pred);
        let intent = at(&|l| l.ends_with("create ops")).expect("an INTENT write");
        let synced = at(&|l| l.starts_with("sync ")).expect("a barrier");
        let called = at(&|l| l.starts_with("provider call")).expect("the call");
        assert!(
            intent < synced && synced < called,
            "{}: {class}: {log:?}",
            b.name()
        );
        assert!(
            log.last().unwrap().starts_with("sync "),
            "{}: {class}: the commit is durable before the caller sees it: {log:?}",
            b.name()
        );
    }
}

/// COMMITTED: replayed without a call; another key is another operation.
pub async fn committed_is_replayed_without_a_call(b: &dyn Backend) {
    let rt = worker(b, "w1").await;
    for (i, class) in SIDE_EFFECTING.into_iter().enumerate() {
        let t = fast(["p", "j", "a"][i], class);
        let p = ScriptedProvider::new(&[]);
        let ctx = rt.run("run");
        let first = call(&ctx, t, &p, 1, "a", verify_for(class)).await.unwrap();
        let again = call(&ctx, t, &p, 1, "a", verify_for(class)).await.unwrap();
        assert_eq!(first, again);
        assert_eq!(p.calls(), 1, "{}: {class}", b.name());
        call(&ctx, t, &p, 2, "a", verify_for(class)).await.unwrap();
        assert_eq!(p.calls(), 2, "{}: {class}", b.name());
    }
    let hits = kinds(&rt)
        .await
        .into_iter()
        .filter(|k| *k == idem_runtime::EventKind::DedupeHit)
        .count();
    assert_eq!(hits, 3, "{}", b.name());
}

/// COMMITTED survives a crash of every worker.
pub async fn committed_survives_a_crash(b: &dyn Backend) {
    let p = ScriptedProvider::new(&[]);
    let t = fast("t", Class::Journal);
    {
        let rt = worker(b, "w1").await;
        call1(&rt, t, &p, VerifyMode::Provider).await.unwrap();
    }
    b.crash().await;
    let rt = worker(b, "w1").await;
    assert_eq!(
        call1(&rt, t, &p, VerifyMode::Provider).await.unwrap(),
        "done:a"
    );
    assert_eq!(p.calls(), 1, "{}", b.name());
}

/// INTENT, our own call in flight: wait for it, share its outcome.
pub async fn in_flight_here_is_waited_for_and_shared(b: &dyn Backend) {
    for (i, class) in SIDE_EFFECTING.into_iter().enumerate() {
        let rt = worker(b, "w1").await;
        let t = fast(["p", "j", "a"][i], class);
        let p = ScriptedProvider::new(&[Step::Held]);
        let leader = tokio::spawn({
            let (rt, p) = (rt.clone(), p.clone());
            async move { call1(&rt, t, &p, verify_for(class)).await }
        });
        p.wait_requests(1).await;
        let follower = tokio::spawn({
            let (rt, p) = (rt.clone(), p.clone());
            async move { call1(&rt, t, &p, verify_for(class)).await }
        });
        p.release();
        assert_eq!(leader.await.unwrap().unwrap(), "done:a");
        assert_eq!(follower.await.unwrap().unwrap(), "done:a");
        assert_eq!(p.calls(), 1, "{}: {class}", b.name());
    }
}

/// INTENT, a call of another worker in flight: wait for it (on a shared
/// database its lease is live), share its outcome.
pub async fn in_flight_in_another_worker_is_waited_for_and_shared(b: &dyn Backend) {
    let a = worker(b, "a").await;
    let c = worker(b, "b").await;
    let t = fast("t", Class::Journal);
    let p = ScriptedProvider::new(&[Step::Held]);
    let leader = tokio::spawn({
        let p = p.clone();
        async move { call1(&a, t, &p, VerifyMode::Provider).await }
    });
    p.wait_requests(1).await;
    let follower = tokio::spawn({
        let p = p.clone();
        async move { call1(&c, t, &p, VerifyMode::Provider).await }
    });
    // The follower must be waiting, not calling: give it the time to try.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(p.calls(), 1, "{}", b.name());
    p.release();
    assert_eq!(leader.await.unwrap().unwrap(), "done:a");
    assert_eq!(follower.await.unwrap().unwrap(), "done:a");
    assert_eq!((p.calls(), p.effects()), (1, 1), "{}", b.name());
}

/// INTENT in flight longer than the caller waits: `InFlight`, no call.
pub async fn in_flight_too_long_is_refused_as_in_flight(b: &dyn Backend) {
    let a = worker(b, "a").await;
    let c = worker_with(b, "b", None, Duration::from_millis(200)).await;
    let t = fast("t", Class::Provider);
    let p = ScriptedProvider::new(&[Step::Held]);
    let leader = tokio::spawn({
        let p = p.clone();
        async move { call1(&a, t, &p, VerifyMode::None).await }
    });
    p.wait_requests(1).await;
    let err = call1(&c, t, &p, VerifyMode::None).await.unwrap_err();
    assert!(
        matches!(err, ToolError::InFlight { .. }),
        "{}: {err:?}",
        b.name()
    );
    assert_eq!(p.calls(), 1);
    p.release();
    assert_eq!(leader.await.unwrap().unwrap(), "done:a");
}

/// A leader whose future is dropped mid-call releases its waiters, who
/// recover the INTENT as after a crash.
pub async fn dropped_leader_releases_its_waiters_who_recover(b: &dyn Backend) {
    for (i, class) in SIDE_EFFECTING.into_iter().enumerate() {
        let rt = worker(b, "w1").await;
        let t = fast(["p", "j", "a"][i], class);
        let p = ScriptedProvider::deduping(&[Step::LandThenHang]);
        let leader = tokio::spawn({
            let (rt, p) = (rt.clone(), p.clone());
            async move { call1(&rt, t, &p, verify_for(class)).await }
        });
        p.wait_requests(1).await;
        let waiter = tokio::spawn({
            let (rt, p) = (rt.clone(), p.clone());
            async move { call1(&rt, t, &p, verify_for(class)).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        leader.abort();
        let out = waiter.await.unwrap();
        match class {
            Class::Provider => assert_eq!(out.unwrap(), "done:a"),
            Class::Journal => {
                assert_eq!(out.unwrap(), "done:a");
                assert_eq!(p.calls(), 1, "{}: verified, not re-sent", b.name());
            }
            _ => assert!(
                matches!(out, Err(ToolError::Escalated { .. })),
                "{}: {out:?}",
                b.name()
            ),
        }
        assert_eq!(p.effects(), 1, "{}: {class}", b.name());
    }
}

/// Crash point 1: the worker dies after its INTENT is durable and the
/// request went out, before the effect (the provider never applies it).
pub async fn crash_after_intent_before_the_effect(b: &dyn Backend) {
    for (i, class) in SIDE_EFFECTING.into_iter().enumerate() {
        let t = fast(["p", "j", "a"][i], class);
        let p = ScriptedProvider::deduping(&[]);
        let rt = crash_mid_call(b, t, &p, Step::Hang, None).await;
        let out = call1(&rt, t, &p, verify_for(class)).await;
        match class {
            // The same key again.
            Class::Provider => {
                assert_eq!(out.unwrap(), "done:a");
                let reqs = p.requests();
                assert_eq!(reqs[0].0, reqs[1].0, "{}: same key", b.name());
                assert_eq!(reqs[1].1, 2, "{}: the attempt count survived", b.name());
            }
            // verify says not landed: run it.
            Class::Journal => {
                assert_eq!(out.unwrap(), "done:a");
                assert_eq!(p.calls(), 2);
            }
            // Nothing can tell: a human decides.
            _ => {
                assert!(matches!(out, Err(ToolError::Escalated { .. })), "{out:?}");
                assert_eq!(p.calls(), 1);
            }
        }
        assert!(p.effects() <= 1, "{}: {class}", b.name());
        drop(rt);
        b.crash().await;
    }
}

/// Crash point 2: the worker dies after the effect landed, before its
/// COMMIT.
pub async fn crash_after_the_effect_before_commit(b: &dyn Backend) {
    for (i, class) in SIDE_EFFECTING.into_iter().enumerate() {
        let t = fast(["p", "j", "a"][i], class);
        let p = ScriptedProvider::deduping(&[]);
        let rt = crash_mid_call(b, t, &p, Step::LandThenHang, None).await;
        let out = call1(&rt, t, &p, verify_for(class)).await;
        match class {
            // The provider replays its answer to the same key.
            Class::Provider => {
                assert_eq!(out.unwrap(), "done:a");
                assert_eq!(p.calls(), 2);
                assert!(kinds(&rt)
                    .await
                    .iter()
                    .any(|k| matches!(k, idem_runtime::EventKind::ProviderReplay { attempt: 2 })));
            }
            // verify finds it: commit, no second call.
            Class::Journal => {
                assert_eq!(out.unwrap(), "done:a");
                assert_eq!(p.calls(), 1);
                assert!(kinds(&rt).await.iter().any(|k| matches!(
                    k,
                    idem_runtime::EventKind::Committed { via, .. } if via == "verify"
                )));
            }
            _ => {
                let Err(ToolError::Escalated { reason, .. }) = out else {
                    panic!("{}: {out:?}", b.name())
                };
                assert!(reason.contains("never re-runs"), "{reason}");
                let esc = rt.escalations().await.unwrap();
                assert_eq!(esc.len(), 1);
                assert_eq!(esc[0].attempts, 1);
                assert_eq!(esc[0].args["order"], 1);
            }
        }
        assert_eq!(p.effects(), 1, "{}: {class}", b.name());
        // Settled for good.
        let again = call1(&rt, t, &p, verify_for(class)).await;
        assert_eq!(again.is_ok(), class != Class::AtMostOnce);
        drop(rt);
        b.crash().await;
    }
}

/// INTENT, owner dead, provider class, its key older than the provider's
/// dedupe window: escalate, never re-send.
pub async fn dead_owner_provider_outside_the_dedupe_window_escalates(b: &dyn Backend) {
    let clock = ManualClock::new(1_800_000_000_000);
    let t = fast_with("t", Class::Provider, |d| {
        d.retry.max_elapsed = None;
        d.dedupe_window = Duration::from_secs(24 * 3600);
    });
    let p = ScriptedProvider::deduping(&[]);
    let rt = crash_mid_call(b, t, &p, Step::LandThenHang, Some(&clock)).await;
    clock.advance(Duration::from_secs(25 * 3600));
    let err = call1(&rt, t, &p, VerifyMode::None).await.unwrap_err();
    let ToolError::Escalated { reason, .. } = err else {
        panic!("{}: {err:?}", b.name())
    };
    assert!(reason.contains("dedupe window"), "{reason}");
    assert_eq!(p.calls(), 1);
}

/// INTENT, owner dead, provider class, budget spent: escalate.
pub async fn dead_owner_provider_out_of_budget_escalates(b: &dyn Backend) {
    let t = fast_with("t", Class::Provider, |d| d.retry.max_attempts = 1);
    let p = ScriptedProvider::deduping(&[]);
    let rt = crash_mid_call(b, t, &p, Step::LandThenHang, None).await;
    let err = call1(&rt, t, &p, VerifyMode::None).await.unwrap_err();
    let ToolError::Escalated { reason, .. } = err else {
        panic!("{}: {err:?}", b.name())
    };
    assert!(reason.contains("1 of 1 attempts"), "{reason}");
    assert_eq!(p.calls(), 1);
}

/// INTENT, owner dead, journal class, verify unknown / failing / absent:
/// escalate with its answer as evidence.
pub async fn dead_owner_journal_verify_undecided_escalates(b: &dyn Backend) {
    for (n, (mode, expect)) in [
        (VerifyMode::Unknown, "unknown"),
        (VerifyMode::Fails, "verify failed"),
        (VerifyMode::None, "verify = \"none\""),
    ]
    .into_iter()
    .enumerate()
    {
        let t = fast(["u", "f", "n"][n], Class::Journal);
        let p = ScriptedProvider::new(&[]);
        let rt = crash_mid_call(b, t, &p, Step::LandThenHang, None).await;
        let err = call1(&rt, t, &p, mode).await.unwrap_err();
        let ToolError::Escalated { reason, key } = err else {
            panic!("{}: {err:?}", b.name())
        };
        assert!(reason.contains(expect), "{reason}");
        assert_eq!(p.calls(), 1);
        let esc = rt.escalations().await.unwrap();
        let e = esc.iter().find(|e| e.key == key).expect("listed");
        assert!(e.verify_answer.is_some());
        drop(rt);
        b.crash().await;
    }
}

/// REJECTED: a new call runs under the next generation of the key.
pub async fn rejected_runs_again_under_the_next_generation(b: &dyn Backend) {
    let rt = worker(b, "w1").await;
    for (i, class) in SIDE_EFFECTING.into_iter().enumerate() {
        let t = fast(["p", "j", "a"][i], class);
        let p = ScriptedProvider::new(&[Step::Decline]);
        let err = call1(&rt, t, &p, verify_for(class)).await.unwrap_err();
        assert!(
            matches!(err, ToolError::Tool(TestError::Declined)),
            "{err:?}"
        );
        assert_eq!(
            call1(&rt, t, &p, verify_for(class)).await.unwrap(),
            "done:a"
        );
        let reqs = p.requests();
        assert!(
            reqs[0].0.ends_with("-g0") && reqs[1].0.ends_with("-g1"),
            "{reqs:?}"
        );
        assert_eq!(reqs[1].1, 1, "a fresh budget");
        call1(&rt, t, &p, verify_for(class)).await.unwrap();
        assert_eq!(p.calls(), 2, "{}: {class}", b.name());
    }
}

/// ESCALATED: refused without a call; an operator's Landed replays, Reissue
/// runs again, Abandon refuses; all visible to every worker.
pub async fn escalated_is_refused_and_resolutions_are_followed(b: &dyn Backend) {
    let rt = worker(b, "w1").await;
    let other = worker(b, "w2").await;
    let t = fast("t", Class::AtMostOnce);
    let p = ScriptedProvider::new(&[Step::LandThenTimeout, Step::LandThenTimeout]);
    let ctx = rt.run("run");
    let escalate = |order: u64| {
        let (ctx, p) = (ctx.clone(), p.clone());
        async move {
            match call(&ctx, t, &p, order, "a", VerifyMode::None).await {
                Err(ToolError::Escalated { key, .. }) => key,
                other => panic!("{other:?}"),
            }
        }
    };
    let k1 = escalate(1).await;
    let k2 = escalate(2).await;
    let again = call(&other.run("run"), t, &p, 1, "a", VerifyMode::None).await;
    assert!(
        matches!(again, Err(ToolError::Escalated { .. })),
        "{again:?}"
    );
    assert_eq!(p.calls(), 2);
    assert_eq!(other.escalations().await.unwrap().len(), 2);
    other
        .resolve(
            &k1,
            Resolution::Landed(Some(serde_json::json!("wire-77"))),
            "bank ok",
        )
        .await
        .unwrap();
    rt.resolve(&k2, Resolution::Abandon, "cancelled")
        .await
        .unwrap();
    let out = call(&rt.run("run"), t, &p, 1, "a", VerifyMode::None).await;
    assert_eq!(out.unwrap(), "wire-77");
    let out = call(&other.run("run"), t, &p, 2, "a", VerifyMode::None).await;
    assert!(matches!(out, Err(ToolError::Abandoned { .. })), "{out:?}");
    // Amended: an abandon proved wrong; reissue it.
    rt.resolve(&k2, Resolution::Reissue, "customer insists")
        .await
        .unwrap();
    let out = call(&other.run("run"), t, &p, 2, "a", VerifyMode::None).await;
    assert_eq!(out.unwrap(), "done:a");
    assert_eq!(p.calls(), 3, "{}", b.name());
    assert!(rt.escalations().await.unwrap().is_empty());
}

// ---------------------------------------------------------------------------
// Table 2: failures inside one call.
// ---------------------------------------------------------------------------

/// NotSent: back off and retry, in every class.
pub async fn not_sent_backs_off_and_retries_in_every_class(b: &dyn Backend) {
    let rt = worker(b, "w1").await;
    for (i, class) in SIDE_EFFECTING.into_iter().enumerate() {
        let t = fast(["p", "j", "a"][i], class);
        let p = ScriptedProvider::new(&[Step::Refuse, Step::Refuse, Step::Ok]);
        assert_eq!(
            call1(&rt, t, &p, verify_for(class)).await.unwrap(),
            "done:a"
        );
        assert_eq!(p.calls(), 3, "{}: {class}", b.name());
    }
    let retries = kinds(&rt)
        .await
        .into_iter()
        .filter(|k| matches!(k, idem_runtime::EventKind::Retry { .. }))
        .count();
    assert_eq!(retries, 6, "{}: {:?}", b.name(), kinds(&rt).await);
}

/// Ambiguous, provider class: retry with the same key.
pub async fn ambiguous_provider_retries_with_the_same_key(b: &dyn Backend) {
    let rt = worker(b, "w1").await;
    let p = ScriptedProvider::deduping(&[Step::LandThenTimeout]);
    let out = call1(&rt, fast("t", Class::Provider), &p, VerifyMode::None).await;
    assert_eq!(out.unwrap(), "done:a");
    let reqs = p.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].0, reqs[1].0);
    assert_eq!(p.effects(), 1, "{}", b.name());
}

/// Ambiguous, journal class: verify before re-running; landed commits,
/// not landed re-runs, unknown escalates.
pub async fn ambiguous_journal_verifies_before_rerunning(b: &dyn Backend) {
    let rt = worker(b, "w1").await;
    let p = ScriptedProvider::new(&[Step::LandThenTimeout]);
    let out = call1(
        &rt,
        fast("landed", Class::Journal),
        &p,
        VerifyMode::Provider,
    )
    .await;
    assert_eq!(out.unwrap(), "done:a");
    assert_eq!((p.calls(), p.effects()), (1, 1));

    let p = ScriptedProvider::new(&[Step::LoseThenTimeout]);
    let out = call1(&rt, fast("lost", Class::Journal), &p, VerifyMode::Provider).await;
    assert_eq!(out.unwrap(), "done:a");
    assert_eq!((p.calls(), p.effects()), (2, 1));

    let p = ScriptedProvider::new(&[Step::LoseThenTimeout]);
    let out = call1(
        &rt,
        fast("unknown", Class::Journal),
        &p,
        VerifyMode::Unknown,
    )
    .await;
    assert!(matches!(out, Err(ToolError::Escalated { .. })), "{out:?}");
    assert_eq!(p.calls(), 1, "{}", b.name());
}

/// Ambiguous, at_most_once: escalate, never retry.
pub async fn ambiguous_at_most_once_escalates(b: &dyn Backend) {
    let rt = worker(b, "w1").await;
    let p = ScriptedProvider::new(&[Step::LoseThenTimeout]);
    let err = call1(&rt, fast("t", Class::AtMostOnce), &p, VerifyMode::None)
        .await
        .unwrap_err();
    let ToolError::Escalated { reason, .. } = err else {
        panic!("{}: {err:?}", b.name())
    };
    assert!(reason.contains("never retries"), "{reason}");
    assert_eq!(p.calls(), 1);
    assert_eq!(
        rt.escalations().await.unwrap()[0].last_error.as_deref(),
        Some("Timeout")
    );
}

/// Semantic: REJECTED recorded, the error returned, no retry.
pub async fn semantic_is_recorded_rejected_and_returned(b: &dyn Backend) {
    let rt = worker(b, "w1").await;
    for (i, class) in SIDE_EFFECTING.into_iter().enumerate() {
        let p = ScriptedProvider::new(&[Step::Decline]);
        let t = fast(["p", "j", "a"][i], class);
        let err = call1(&rt, t, &p, verify_for(class)).await.unwrap_err();
        assert!(
            matches!(err, ToolError::Tool(TestError::Declined)),
            "{err:?}"
        );
        assert_eq!(p.calls(), 1);
    }
    let rejected = kinds(&rt)
        .await
        .into_iter()
        .filter(|k| matches!(k, idem_runtime::EventKind::Rejected { .. }))
        .count();
    assert_eq!(rejected, 3, "{}", b.name());
}

/// Budget spent: an unresolved ambiguity escalates; a failure that
/// provably did not land returns the last error, and the next call starts
/// a fresh budget.
pub async fn budget_spent_escalates_or_fails(b: &dyn Backend) {
    let rt = worker(b, "w1").await;
    let t = fast_with("amb", Class::Provider, |d| d.retry.max_attempts = 3);
    let p = ScriptedProvider::new(&[Step::LoseThenTimeout; 3]);
    let err = call1(&rt, t, &p, VerifyMode::None).await.unwrap_err();
    let ToolError::Escalated { reason, .. } = err else {
        panic!("{}: {err:?}", b.name())
    };
    assert!(reason.contains("budget spent"), "{reason}");
    assert_eq!(p.calls(), 3);

    let t = fast_with("refused", Class::Journal, |d| d.retry.max_attempts = 2);
    let p = ScriptedProvider::new(&[Step::Refuse, Step::Refuse, Step::Ok]);
    let err = call1(&rt, t, &p, VerifyMode::Provider).await.unwrap_err();
    assert!(
        matches!(err, ToolError::Tool(TestError::Refused)),
        "{err:?}"
    );
    assert_eq!(p.calls(), 2);
    assert_eq!(
        call1(&rt, t, &p, VerifyMode::Provider).await.unwrap(),
        "done:a"
    );
}

/// Attempt counts are durable: workers that keep dying mid-call do not
/// reset the budget.
pub async fn crash_loop_does_not_reset_the_budget(b: &dyn Backend) {
    let t = fast_with("t", Class::Provider, |d| d.retry.max_attempts = 3);
    let p = ScriptedProvider::deduping(&[]);
    let mut rt = None;
    for _ in 0..3 {
        drop(rt.take());
        rt = Some(crash_mid_call(b, t, &p, Step::Hang, None).await);
    }
    let rt = rt.unwrap();
    let err = call1(&rt, t, &p, VerifyMode::None).await.unwrap_err();
    assert!(matches!(err, ToolError::Escalated { .. }), "{err:?}");
    let attempts: Vec<u32> = p.requests().iter().map(|r| r.1).collect();
    assert_eq!(attempts, [1, 2, 3], "{}", b.name());
}

/// `max_elapsed` counts from the first attempt, across restarts.
pub async fn max_elapsed_counts_across_restarts(b: &dyn Backend) {
    let clock = ManualClock::new(1_800_000_000_000);
    let t = fast_with("t", Class::Provider, |d| {
        d.retry.max_attempts = 100;
        d.retry.max_elapsed = Some(Duration::from_secs(3600));
    });
    let p = ScriptedProvider::deduping(&[]);
    let rt = crash_mid_call(b, t, &p, Step::Hang, Some(&clock)).await;
    clock.advance(Duration::from_secs(2 * 3600));
    let err = call1(&rt, t, &p, VerifyMode::None).await.unwrap_err();
    let ToolError::Escalated { reason, .. } = err else {
        panic!("{}: {err:?}", b.name())
    };
    assert!(reason.contains("max_elapsed"), "{reason}");
    assert_eq!(p.calls(), 1);
}

// ---------------------------------------------------------------------------
// Many workers, corruption, ordering, steps.
// ---------------------------------------------------------------------------

/// N workers calling one key at once make one provider call and share its
/// outcome.
pub async fn many_workers_one_key_one_provider_call(b: &dyn Backend) {
    for (i, class) in SIDE_EFFECTING.into_iter().enumerate() {
        let t = fast(["p", "j", "a"][i], class);
        let p = ScriptedProvider::new(&[Step::Held]);
        let mut workers = Vec::new();
        for w in 0..4 {
            workers.push(worker(b, &format!("w{w}")).await);
        }
        let mut calls = Vec::new();
        for rt in &workers {
            let (rt, p) = (rt.clone(), p.clone());
            calls.push(tokio::spawn(async move {
                call1(&rt, t, &p, verify_for(class)).await
            }));
        }
        p.wait_requests(1).await;
        tokio::time::sleep(Duration::from_millis(30)).await;
        p.release();
        for c in calls {
            assert_eq!(c.await.unwrap().unwrap(), "done:a", "{}: {class}", b.name());
        }
        assert_eq!((p.calls(), p.effects()), (1, 1), "{}: {class}", b.name());
        drop(workers);
        b.crash().await;
    }
}

/// A record whose body does not decode is an error, never "absent": no
/// call, and operators see the error too.
pub async fn an_undecodable_record_is_an_error_never_absent(b: &dyn Backend) {
    let rt = worker(b, "w1").await;
    let t = fast("t", Class::Journal);
    let k = key(&rt.run("run"), t, 1);
    overwrite_record(&**rt.journal(), Space::Ops, k.digest(), b"\x00not a record").await;
    let p = ScriptedProvider::new(&[]);
    let err = call1(&rt, t, &p, VerifyMode::Provider).await.unwrap_err();
    assert!(
        matches!(err, ToolError::Journal(idem_runtime::Error::Corrupt { .. })),
        "{}: {err:?}",
        b.name()
    );
    assert_eq!(p.calls(), 0, "{}: never called", b.name());
    assert!(rt.operation(&k).await.is_err(), "{}", b.name());
    let other = worker(b, "w2").await;
    assert!(call1(&other, t, &p, VerifyMode::Provider).await.is_err());
    assert_eq!(p.calls(), 0);
}

/// A stream pruned empty goes on from where it was, in this worker and in
/// the next one after a crash: a follower resuming at the next number
/// never skips what comes after it.
pub async fn sequence_numbers_never_go_back_after_a_prune_and_a_crash(b: &dyn Backend) {
    use idem_runtime::journal::{Durability, NewEvent};
    let ev = [NewEvent {
        key: None,
        bytes: b"event",
    }];
    let j = b.open().await;
    let mut last = 0;
    for _ in 0..20 {
        last = j.append(&ev, Durability::Immediate).await.unwrap()[0];
    }
    j.truncate_events(last + 1).await.unwrap();
    assert!(j.events(0, 10).await.unwrap().is_empty(), "{}", b.name());
    let next = j.append(&ev, Durability::Immediate).await.unwrap()[0];
    assert!(next > last, "{}: {next} after {last}", b.name());
    j.truncate_events(next + 1).await.unwrap();
    drop(j);
    b.crash().await;
    let j = b.open().await;
    let after = j.append(&ev, Durability::Immediate).await.unwrap()[0];
    assert!(
        after > next,
        "{}: after a crash the stream went back to {after} (it had reached {next})",
        b.name()
    );
}

/// Sequence numbers strictly increase, and a follower paging the stream
/// while several workers write never misses an event.
pub async fn audit_sequence_is_strictly_increasing_and_followers_miss_nothing(b: &dyn Backend) {
    let workers: Vec<Runtime> = {
        let mut w = Vec::new();
        for i in 0..3 {
            w.push(worker(b, &format!("w{i}")).await);
        }
        w
    };
    let follower_rt = workers[0].clone();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let follower = tokio::spawn({
        let done = done.clone();
        async move {
            let mut seen = Vec::new();
            let mut from = 0;
            loop {
                let finished = done.load(std::sync::atomic::Ordering::SeqCst);
                let page = follower_rt.audit_page(from, 7).await.unwrap();
                if let Some(last) = page.last() {
                    from = last.seq + 1;
                }
                let empty = page.is_empty();
                seen.extend(page.into_iter().map(|e| e.seq));
                if finished && empty {
                    return seen;
                }
                if empty {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }
    });
    let mut writers = Vec::new();
    for (w, rt) in workers.iter().enumerate() {
        let rt = rt.clone();
        writers.push(tokio::spawn(async move {
            let t = fast("t", Class::Provider);
            let p = ScriptedProvider::deduping(&[]);
            for order in 0..8u64 {
                let ctx = rt.run(&format!("run-{w}"));
                call(&ctx, t, &p, order, "a", VerifyMode::None)
                    .await
                    .unwrap();
                // A replay: an event that records no state change.
                call(&ctx, t, &p, order, "a", VerifyMode::None)
                    .await
                    .unwrap();
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    for rt in &workers {
        rt.sync().await.unwrap();
    }
    // Everything written is durable now; the follower catches up, then stops.
    let all: Vec<u64> = workers[1]
        .audit(0)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(
        all.len(),
        3 * 8 * 4,
        "{}: intent, attempt, commit, dedupe hit per order",
        b.name()
    );
    assert!(all.windows(2).all(|w| w[0] < w[1]), "{}: {all:?}", b.name());
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let seen = follower.await.unwrap();
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "{}: {seen:?}",
        b.name()
    );
    let missed: BTreeSet<u64> = all
        .iter()
        .copied()
        .collect::<BTreeSet<_>>()
        .difference(&seen.iter().copied().collect())
        .copied()
        .collect();
    assert!(
        missed.is_empty(),
        "{}: the follower missed {missed:?}",
        b.name()
    );
}

/// A memoized step runs once per run, across crashes; errors are not
/// memoized.
pub async fn steps_are_memoized_across_crashes(b: &dyn Backend) {
    let polled = Arc::new(Mutex::new(0));
    for _ in 0..2 {
        let rt = worker(b, "w1").await;
        for _ in 0..2 {
            let polled = polled.clone();
            let plan: Result<Vec<String>, ToolError<TestError>> = rt
                .run("run")
                .step("plan", async move {
                    *polled.lock().unwrap() += 1;
                    Ok(vec!["charge".to_string()])
                })
                .await;
            assert_eq!(plan.unwrap(), ["charge"]);
        }
        drop(rt);
        b.crash().await;
    }
    assert_eq!(*polled.lock().unwrap(), 1, "{}", b.name());
    let rt = worker(b, "w2").await;
    let failed: Result<u8, _> = rt
        .run("run")
        .step("flaky", async { Err(TestError::Refused) })
        .await;
    assert!(matches!(failed, Err(ToolError::Tool(TestError::Refused))));
    let ok: Result<u8, ToolError<TestError>> = rt.run("run").step("flaky", async { Ok(3) }).await;
    assert_eq!(ok.unwrap(), 3);
}

/// Every audit event says which worker and incarnation acted: the caller's
/// for what a call does, the resolving worker's for an operator's
/// resolution, a new incarnation's after a restart under the same id.
pub async fn every_event_names_the_worker_that_acted(b: &dyn Backend) {
    let w1 = worker(b, "w1").await;
    let w2 = worker(b, "w2").await;
    let (one, two) = (w1.owner().to_string(), w2.owner().to_string());
    assert_ne!(one, two);
    let t = fast("t", Class::AtMostOnce);
    let p = ScriptedProvider::new(&[Step::Ok, Step::LandThenTimeout]);
    let from = w1.audit(0).await.unwrap().last().map_or(0, |e| e.seq + 1);
    // w1: a fresh call (intent, attempt, committed) and a step.
    call(&w1.run("run"), t, &p, 1, "a", VerifyMode::None)
        .await
        .unwrap();
    let _: u8 = w1
        .run("run")
        .step("plan", async { Ok::<_, TestError>(1) })
        .await
        .unwrap();
    let mine = w1.audit(from).await.unwrap();
    assert!(mine.len() >= 4, "{mine:?}");
    for e in &mine {
        assert_eq!(e.worker.as_deref(), Some(&*one), "{}: {e:?}", b.name());
    }
    // w2: a replay, an escalation, then its own resolution of it.
    let from = mine.last().unwrap().seq + 1;
    call(&w2.run("run"), t, &p, 1, "a", VerifyMode::None)
        .await
        .unwrap();
    let key = match call(&w2.run("run"), t, &p, 2, "a", VerifyMode::None).await {
        Err(ToolError::Escalated { key, .. }) => key,
        other => panic!("{}: {other:?}", b.name()),
    };
    w2.resolve(&key, Resolution::Abandon, "cancelled")
        .await
        .unwrap();
    let theirs = w2.audit(from).await.unwrap();
    let kinds: Vec<_> = theirs.iter().map(|e| &e.kind).collect();
    assert!(kinds.contains(&&EventKind::DedupeHit), "{kinds:?}");
    assert!(
        kinds
            .iter()
            .any(|k| matches!(k, EventKind::Resolved { .. })),
        "{kinds:?}"
    );
    for e in &theirs {
        assert_eq!(e.worker.as_deref(), Some(&*two), "{}: {e:?}", b.name());
    }
    // A restart under the same id is another incarnation, and says so.
    drop(w1);
    let again = worker(b, "w1").await;
    let three = again.owner().to_string();
    assert!(
        three.starts_with("w1#") && three != one,
        "{three} after {one}"
    );
    let from = theirs.last().unwrap().seq + 1;
    let _: u8 = again
        .run("run")
        .step("other", async { Ok::<_, TestError>(2) })
        .await
        .unwrap();
    let later = again.audit(from).await.unwrap();
    assert!(!later.is_empty());
    for e in &later {
        assert_eq!(e.worker.as_deref(), Some(&*three), "{}: {e:?}", b.name());
    }
    // And every event read back from the journal names one.
    assert!(again
        .audit(0)
        .await
        .unwrap()
        .iter()
        .all(|e| e.worker.is_some()));
}

/// A worker paused past its lease (its renewals stop, its request held at
/// the provider) is taken over by another worker; when it wakes, its
/// commit changes nothing, it returns what the new owner decided, and the
/// provider saw what the class allows: one effect.
pub async fn a_stale_owner_is_fenced_and_returns_no_wrong_answer(b: &dyn Backend) {
    assert!(b.leases(), "only for backends with leases");
    for (i, class) in SIDE_EFFECTING.into_iter().enumerate() {
        let t = fast(["p", "j", "a"][i], class);
        let p = ScriptedProvider::deduping(&[Step::LandThenHeld]);
        let stale_view = ProcessView::new(b.open_with_lease(Duration::from_millis(400)).await);
        let stale = build(stale_view.clone(), "stale", None, Duration::from_secs(20));
        let fresh = worker(b, "fresh").await;
        let k = key(&stale.run("run"), t, 1);
        let first = tokio::spawn({
            let (stale, p) = (stale.clone(), p.clone());
            async move { call1(&stale, t, &p, verify_for(class)).await }
        });
        p.wait_requests(1).await;
        // SIGSTOP: no more renewals; wait until the lease has run out.
        stale_view.stall_renewals();
        loop {
            let rec = fresh.journal().load(Space::Ops, k.digest()).await.unwrap();
            if rec.and_then(|r| r.claim).is_some_and(|c| !c.live) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let taken = call1(&fresh, t, &p, verify_for(class)).await;
        // SIGCONT: the stale call's answer arrives.
        p.release();
        let woke = first.await.unwrap();
        // The stale worker records the refusal with eventual durability:
        // its sync makes it visible to every reader (CI once read the
        // stream before it landed).
        stale.journal().sync().await.unwrap();
        match class {
            Class::Provider | Class::Journal => {
                assert_eq!(taken.unwrap(), "done:a", "{}: {class}", b.name());
                assert_eq!(woke.unwrap(), "done:a", "{}: {class}", b.name());
            }
            _ => {
                assert!(
                    matches!(taken, Err(ToolError::Escalated { .. })),
                    "{taken:?}"
                );
                assert!(
                    matches!(woke, Err(ToolError::Escalated { .. })),
                    "{}: the stale owner must not report success over an escalation: {woke:?}",
                    b.name()
                );
            }
        }
        assert_eq!(p.effects(), 1, "{}: {class}", b.name());
        assert!(
            kinds(&fresh)
                .await
                .iter()
                .any(|k| matches!(k, idem_runtime::EventKind::Fenced { .. })),
            "{}: {class}: the refused commit is on record",
            b.name()
        );
        let op = fresh.operation(&k).await.unwrap().unwrap();
        assert_ne!(op.state, "intent", "{}: {class}", b.name());
    }
}

// ---------------------------------------------------------------------------
// Approval before a call.
// ---------------------------------------------------------------------------

/// A call that needs approval is recorded before any INTENT and asked
/// once, whatever the retries and a crash while it waits; another worker
/// sees the request and decides it; approved, the call runs once;
/// refused, it returns the operator's note without running.
pub async fn approval_is_asked_once_and_any_worker_decides(b: &dyn Backend) {
    let t = fast_with("wire", Class::AtMostOnce, |d| {
        d.approve = Some("always");
        d.approval_wait = Duration::ZERO;
    });
    let p = ScriptedProvider::new(&[]);
    {
        let w1 = worker(b, "w1").await;
        for _ in 0..2 {
            let out = call1(&w1, t, &p, VerifyMode::None).await;
            assert!(
                matches!(out, Err(ToolError::AwaitingApproval { .. })),
                "{}: {out:?}",
                b.name()
            );
        }
    }
    b.crash().await;
    let w1 = worker(b, "w1").await;
    let out = call1(&w1, t, &p, VerifyMode::None).await;
    assert!(
        matches!(out, Err(ToolError::AwaitingApproval { .. })),
        "{out:?}"
    );
    assert_eq!(p.calls(), 0, "{}: ran without approval", b.name());

    let w2 = worker(b, "w2").await;
    let pending = w2.approvals().await.expect("list approvals");
    assert_eq!(
        pending.len(),
        1,
        "{}: asked more than once: {pending:?}",
        b.name()
    );
    w2.approve(&pending[0].key, "ok by ops")
        .await
        .expect("approve");
    for _ in 0..2 {
        assert_eq!(call1(&w1, t, &p, VerifyMode::None).await.unwrap(), "done:a");
    }
    assert_eq!(p.calls(), 1, "{}: approved, it runs once", b.name());

    let ctx = w1.run("run");
    let out = call(&ctx, t, &p, 2, "b", VerifyMode::None).await;
    assert!(
        matches!(out, Err(ToolError::AwaitingApproval { .. })),
        "{out:?}"
    );
    let pending = w2.approvals().await.expect("list approvals");
    assert_eq!(pending.len(), 1, "{pending:?}");
    w2.reject(&pending[0].key, "not this one")
        .await
        .expect("reject");
    for _ in 0..2 {
        match call(&ctx, t, &p, 2, "b", VerifyMode::None).await {
            Err(ToolError::NotApproved { note, .. }) => assert_eq!(note, "not this one"),
            other => panic!("{}: {other:?}", b.name()),
        }
    }
    assert_eq!(p.calls(), 1, "{}: refused, it does not run", b.name());
    let asked = kinds(&w1)
        .await
        .into_iter()
        .filter(|k| matches!(k, EventKind::ApprovalRequested { .. }))
        .count();
    assert_eq!(asked, 2, "{}: one request per call", b.name());
}

/// A call that waits for its approval (`approval_wait`) is woken by a
/// decision another worker makes, long before its wait runs out, and runs.
pub async fn a_call_waiting_for_approval_is_woken_by_a_decision_elsewhere(b: &dyn Backend) {
    let t = fast_with("wire_waits", Class::Provider, |d| {
        d.approve = Some("always");
        d.approval_wait = Duration::from_secs(60);
    });
    let p = ScriptedProvider::new(&[]);
    let w1 = worker(b, "w1").await;
    let w2 = worker(b, "w2").await;
    let waiting = tokio::spawn({
        let (ctx, p) = (w1.run("run"), p.clone());
        async move { call(&ctx, t, &p, 1, "a", VerifyMode::None).await }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let key = loop {
        if let Some(a) = w2.approvals().await.expect("list approvals").first() {
            break a.key.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}: the request was never recorded",
            b.name()
        );
        tokio::task::yield_now().await;
    };
    assert_eq!(p.calls(), 0);
    w2.approve(&key, "go").await.expect("approve");
    let out = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{}: the waiting call was not woken by the decision",
                b.name()
            )
        })
        .expect("the call's task");
    assert_eq!(out.unwrap(), "done:a");
    assert_eq!(p.calls(), 1);
}
