//! idem's promise through a PostgreSQL failover: a primary with a
//! synchronous standby (`idem_testkit::pg_replica::PgPair`), a runtime on
//! the multi-host URL (`target_session_attrs=read-write`), the primary
//! crashed (`pg_ctl stop -m immediate`) with calls in flight, the standby
//! promoted. Every commit acknowledged before the crash is found after it
//! (a fresh runtime replays it without calling the provider), and the
//! calls cut off between their effect and its COMMIT are recovered with no
//! duplicate effect: the provider-class one by sending the same key again
//! (the provider replays it), the journal-class one by `verify`. Then a
//! new standby is built from the promoted server and the same is done
//! back. Also: `PostgresOptions::synchronous_standby` refuses a server
//! without a synchronous standby, at connect and on a new connection.

use std::future::Future;
use std::time::Duration;

use idem_runtime::{
    Class, Error, PostgresJournal, PostgresOptions, Runtime, ToolDescriptor, ToolError,
};
use idem_testkit::engine::{call, key, tool_with, ScriptedProvider, Step, TestError, VerifyMode};
use idem_testkit::pg::PgServer;
use idem_testkit::pg_replica::PgPair;

/// How long any one step may take before the test fails instead of hanging
/// (a commit waiting for a standby that never comes, say).
const STEP: Duration = Duration::from_secs(60);

fn options() -> PostgresOptions {
    PostgresOptions {
        pool_size: 4,
        connect_timeout: Duration::from_secs(5),
        ..PostgresOptions::default()
    }
    .synchronous_standby(true)
}

async fn runtime(url: &str, worker: &str) -> Runtime {
    bounded(
        Runtime::builder()
            .postgres(url)
            .worker_id(worker)
            .postgres_options(options())
            .connect(),
    )
    .await
    .unwrap_or_else(|e| panic!("connect {worker}: {e}"))
}

async fn bounded<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(STEP, f)
        .await
        .expect("a step of the test took over a minute")
}

/// The two tools: a charge (provider class: the provider dedupes on the
/// key) and a message (journal class: the provider is asked whether it
/// landed).
struct Tools {
    charge: &'static ToolDescriptor,
    send: &'static ToolDescriptor,
    payments: ScriptedProvider,
    mail: ScriptedProvider,
}

impl Tools {
    fn new() -> Tools {
        let fast = |d: &mut ToolDescriptor| {
            d.retry.initial = Duration::from_millis(2);
            d.retry.max_interval = Duration::from_millis(10);
        };
        Tools {
            charge: tool_with("charge", Class::Provider, fast),
            send: tool_with("send", Class::Journal, fast),
            payments: ScriptedProvider::deduping(&[]),
            mail: ScriptedProvider::new(&[]),
        }
    }

    fn of(&self, class: Class) -> (&'static ToolDescriptor, &ScriptedProvider) {
        match class {
            Class::Provider => (self.charge, &self.payments),
            _ => (self.send, &self.mail),
        }
    }

    /// One call of tool `class` for `order`, as a worker makes it.
    async fn call(
        &self,
        rt: &Runtime,
        class: Class,
        order: u64,
    ) -> Result<String, ToolError<TestError>> {
        let (tool, provider) = self.of(class);
        let body = format!("{order}");
        bounded(call(
            &rt.run("run"),
            tool,
            provider,
            order,
            &body,
            VerifyMode::Provider,
        ))
        .await
    }

    /// The call, made again while it fails on the journal (the pool finding
    /// the new primary), at most 50 times: what a worker's own bounded
    /// retry of a failed tool call does.
    async fn call_until_done(&self, rt: &Runtime, class: Class, order: u64) -> (String, u32) {
        let mut failures = 0;
        loop {
            match self.call(rt, class, order).await {
                Ok(out) => return (out, failures),
                Err(ToolError::Journal(e)) if failures < 50 => {
                    failures += 1;
                    not_refused(&e);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("call {class:?} {order} after {failures} retries: {e:?}"),
            }
        }
    }

    fn key(&self, rt: &Runtime, class: Class, order: u64) -> String {
        let (tool, _) = self.of(class);
        key(&rt.run("run"), tool, order).as_str().to_string()
    }
}

/// A journal error while the pool reconnects is expected; anything saying
/// the server has no synchronous standby is not (the promoted server names
/// one).
fn not_refused(e: &Error) {
    assert!(
        !matches!(e, Error::NoSynchronousStandby { .. }),
        "the promoted server was refused: {e}"
    );
}

/// What the test knows was acknowledged: (class, order, result).
type Acked = Vec<(Class, u64, String)>;

/// Every acknowledged call replays, on a runtime that never saw it (so
/// from the journal, not a cache), without a request to its provider;
/// returns how many did reach it (lost from the journal).
async fn all_replay(url: &str, worker: &str, tools: &Tools, acked: &Acked) -> usize {
    let rt = runtime(url, worker).await;
    let before = (tools.payments.calls(), tools.mail.calls());
    for (class, order, result) in acked {
        let (out, _) = tools.call_until_done(&rt, *class, *order).await;
        assert_eq!(&out, result, "{class:?} {order} replays its result");
    }
    tools.payments.calls() + tools.mail.calls() - before.0 - before.1
}

/// A replicated pair, a runtime on its multi-host URL, the providers, and
/// what was acknowledged.
struct World {
    pair: PgPair,
    url: String,
    rt: Runtime,
    tools: Tools,
    acked: Acked,
}

impl World {
    async fn start(worker: &str) -> World {
        let pair = PgPair::start().unwrap();
        let url = pair.create_database().unwrap();
        let rt = runtime(&url, worker).await;
        World {
            pair,
            url,
            rt,
            tools: Tools::new(),
            acked: Acked::new(),
        }
    }
}

/// Where the primary's crash cuts the calls in flight off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// Their effects landed, their COMMITs are not sent yet.
    BeforeCommit,
    /// The standby is down: their COMMITs (and a new call's INTENT) are
    /// written on the primary and wait for the standby; the crash comes
    /// before it is back, so the promoted server never has them (they were
    /// never acknowledged either).
    CommitUnreplicated,
}

/// The orders of one round's calls cut off by the crash: a charge and a
/// message whose effects landed, and (with [`Cut::CommitUnreplicated`]) a
/// message whose INTENT waits for the standby.
const CUT: [(Class, u64); 3] = [
    (Class::Provider, 60_000),
    (Class::Journal, 60_001),
    (Class::Journal, 60_002),
];

/// How many of the primary's sessions wait for the synchronous standby.
fn waiting_for_standby(pair: &PgPair) -> usize {
    pair.primary()
        .psql(
            "postgres",
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'",
        )
        .map(|out| out.trim().parse().unwrap_or(0))
        .unwrap_or(0)
}

/// One failover: acknowledged calls of both classes, calls cut off by the
/// crash where `cut` says, one acknowledged right before it; then every
/// acknowledged call is found and the cut-off ones recovered once each.
/// `round` numbers the orders.
async fn failover_round(w: &mut World, round: u64, cut: Cut, calls: u64) {
    let (pair, url, rt, tools, acked) =
        (&mut w.pair, w.url.as_str(), &w.rt, &w.tools, &mut w.acked);
    let base = round * 100_000;
    // Acknowledged commits of both classes.
    for i in 0..calls {
        for class in [Class::Provider, Class::Journal] {
            let out = tools.call(rt, class, base + i).await.unwrap();
            acked.push((class, base + i, out));
        }
    }
    // Two calls whose effects land at their providers, which then hold
    // their answers: their COMMITs are not written yet.
    tools.payments.hold();
    tools.mail.hold();
    tools.payments.push(&[Step::LandThenHeld]);
    tools.mail.push(&[Step::LandThenHeld]);
    let (pay_before, mail_before) = (tools.payments.calls(), tools.mail.calls());
    let spawn = |class: Class, order: u64| {
        let rt = rt.clone();
        let (tool, provider) = tools.of(class);
        let provider = provider.clone();
        tokio::spawn(async move {
            let body = format!("{order}");
            call(
                &rt.run("run"),
                tool,
                &provider,
                order,
                &body,
                VerifyMode::Provider,
            )
            .await
        })
    };
    let mut in_flight = vec![
        (CUT[0], spawn(Class::Provider, base + CUT[0].1)),
        (CUT[1], spawn(Class::Journal, base + CUT[1].1)),
    ];
    bounded(tools.payments.wait_requests(pay_before + 1)).await;
    bounded(tools.mail.wait_requests(mail_before + 1)).await;
    // One more call whose COMMIT returns right before the crash.
    let last = tools.call(rt, Class::Journal, base + 50_000).await.unwrap();
    acked.push((Class::Journal, base + 50_000, last));

    if cut == Cut::CommitUnreplicated {
        pair.stop_standby().unwrap();
        // The held answers come: the COMMITs are written and wait for the
        // standby, and so does a new call's INTENT.
        tools.payments.release();
        tools.mail.release();
        in_flight.push((CUT[2], spawn(Class::Journal, base + CUT[2].1)));
        let deadline = tokio::time::Instant::now() + STEP;
        // (A journal that did not wait would finish them instead.) Writes
        // that arrive together share a transaction (group commit), so one
        // waiting backend may hold all three, and a write queued behind
        // the waiting groups never reaches the server: it is cut off as
        // surely as one that waits there.
        while waiting_for_standby(pair) < 1 && !in_flight.iter().all(|(_, t)| t.is_finished()) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the writes never waited for the standby"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    pair.stop_immediate().unwrap();
    if cut == Cut::BeforeCommit {
        // The answers come now; the COMMITs find no primary (one server is
        // gone, the other is a read-only standby).
        tools.payments.release();
        tools.mail.release();
    } else {
        // The standby comes back with what it had: not those writes.
        pair.start_standby().unwrap();
    }
    let mut cut_off = Vec::new();
    for ((class, order), task) in in_flight {
        match bounded(task).await.unwrap() {
            // Acknowledged: it must be found after the failover like the
            // others (a journal that acknowledged a write the standby did
            // not have would lose it here).
            Ok(out) => acked.push((class, base + order, out)),
            Err(ToolError::Journal(_)) => cut_off.push((class, base + order)),
            Err(e) => panic!("{class:?} {order} cut off by the crash: {e:?}"),
        }
    }
    pair.promote().unwrap();
    // The promoted server commits nothing before a synchronous standby of
    // its own has it.
    pair.rebuild_standby().unwrap();

    // Nothing acknowledged was lost: a fresh runtime replays it all.
    let lost = all_replay(url, &format!("auditor-{round}"), tools, acked).await;
    assert_eq!(
        lost, 0,
        "no acknowledged call reached a provider again: nothing was lost"
    );
    // The calls cut off are recovered, each with one effect: the charge by
    // sending its key again (the provider replays it), a message by
    // `verify` (nothing is sent again) or, if its INTENT was lost, sent
    // once.
    let cut_count = cut_off.len();
    let mut journal_retries = 0;
    for (class, order) in cut_off {
        let (out, retries) = tools.call_until_done(rt, class, order).await;
        assert_eq!(out, format!("done:{order}"));
        let key = tools.key(rt, class, order);
        let (_, provider) = tools.of(class);
        let expected = if class == Class::Provider { 2 } else { 1 };
        assert_eq!(
            provider.requests_for(&key),
            expected,
            "{class:?} {order}: requests after recovery ({retries} retries on the journal)"
        );
        assert_eq!(
            provider.effects_for(&key),
            1,
            "{class:?} {order}: one effect"
        );
        acked.push((class, order, out));
        journal_retries += retries;
    }
    // And the worker goes on, on the new primary.
    let out = tools
        .call(rt, Class::Provider, base + 50_001)
        .await
        .unwrap();
    acked.push((Class::Provider, base + 50_001, out));
    eprintln!(
        "round {round} ({cut:?}): {} acknowledged so far, {cut_count} cut off and recovered \
         ({journal_retries} journal errors retried), primary now in slot {}",
        acked.len(),
        pair.primary_slot()
    );
    // The crash did cut them all off: none of them could be acknowledged
    // without a standby that has it.
    let expected_cut = if cut == Cut::BeforeCommit { 2 } else { 3 };
    assert_eq!(cut_count, expected_cut, "calls cut off by the crash");
}

/// Effects beyond the first under any key the test called.
fn duplicates(rt: &Runtime, tools: &Tools, acked: &Acked) -> usize {
    acked
        .iter()
        .map(|(class, order, _)| {
            let (_, provider) = tools.of(*class);
            provider
                .effects_for(&tools.key(rt, *class, *order))
                .saturating_sub(1)
        })
        .sum()
}

/// Exactly one effect per key at each provider, for every call made.
fn one_effect_each(rt: &Runtime, tools: &Tools, acked: &Acked) {
    for (class, order, _) in acked {
        let (_, provider) = tools.of(*class);
        let key = tools.key(rt, *class, *order);
        assert_eq!(
            provider.effects_for(&key),
            1,
            "{class:?} {order}: exactly one effect"
        );
    }
    assert_eq!(
        tools.payments.effects() + tools.mail.effects(),
        acked.len(),
        "no effect under a key the test did not call"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_commits_survive_two_failovers_and_cut_off_calls_recover_once() {
    let mut w = World::start("pod-1").await;
    for (round, cut) in [(1, Cut::BeforeCommit), (2, Cut::CommitUnreplicated)] {
        let from = w.pair.primary_slot();
        failover_round(&mut w, round, cut, 5).await;
        assert_ne!(w.pair.primary_slot(), from, "round {round} failed over");
        one_effect_each(&w.rt, &w.tools, &w.acked);
    }
    assert_eq!(w.pair.primary_slot(), 0, "there and back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_a_synchronous_standby_is_refused_when_one_is_expected() {
    // A plain server: nothing names a standby.
    let server = PgServer::start().unwrap();
    let url = server.create_database().unwrap();
    let db = PgServer::database_of(&url).to_string();
    let refused = Runtime::builder()
        .postgres(&url)
        .postgres_options(options())
        .connect()
        .await;
    let Err(err) = refused else {
        panic!("a server without a synchronous standby was accepted");
    };
    assert!(
        matches!(&err, Error::NoSynchronousStandby { reported, .. }
            if reported.contains("synchronous_standby_names = ''")),
        "{err}"
    );
    assert!(
        err.to_string().contains("synchronous_standby_names"),
        "{err}"
    );
    eprintln!("refused: {err}");
    assert_eq!(
        server.idem_relations(&db).unwrap(),
        0,
        "nothing was written"
    );
    // Without the option, the same server is fine.
    drop(
        Runtime::connect(&url)
            .await
            .expect("no check without the option"),
    );

    // A standby named, but the journal's session commits without waiting
    // for it (a database's setting counts: the check reads the session's).
    server
        .psql(
            "postgres",
            &format!("ALTER DATABASE \"{db}\" SET synchronous_commit = local"),
        )
        .unwrap();
    server
        .psql(
            "postgres",
            "ALTER SYSTEM SET synchronous_standby_names = 'nobody'",
        )
        .unwrap();
    server.psql("postgres", "SELECT pg_reload_conf()").unwrap();
    let mut reported = String::new();
    for _ in 0..100 {
        match PostgresJournal::connect_with(&url, &options()).await {
            Err(Error::NoSynchronousStandby { reported: r, .. }) => reported = r,
            other => panic!("a session that does not wait for the standby was accepted: {other:?}"),
        }
        if reported.contains("'nobody'") {
            break;
        }
        // The reload reaches new sessions soon, not at once.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        reported.contains("synchronous_standby_names = 'nobody'"),
        "{reported}"
    );
    assert!(
        reported.contains("synchronous_commit = 'local'"),
        "{reported}"
    );

    // The replicated pair is accepted, and works.
    let pair = PgPair::start().unwrap();
    let url = pair.create_database().unwrap();
    let rt = runtime(&url, "pod-2").await;
    let tools = Tools::new();
    assert_eq!(tools.call(&rt, Class::Provider, 1).await.unwrap(), "done:1");
    // A new connection is checked too: the primary, restarted without its
    // standby named, is refused once the pool reconnects.
    let primary = pair.primary();
    primary
        .psql(
            "postgres",
            "ALTER SYSTEM SET synchronous_standby_names = ''",
        )
        .unwrap();
    primary.restart_immediate().unwrap();
    let mut outcome = tools.call(&rt, Class::Provider, 2).await;
    for _ in 0..50 {
        match &outcome {
            Err(ToolError::Journal(Error::NoSynchronousStandby { .. })) => break,
            Err(ToolError::Journal(_)) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                outcome = tools.call(&rt, Class::Provider, 2).await;
            }
            _ => break,
        }
    }
    let Err(ToolError::Journal(err)) = outcome else {
        panic!("a server that stopped replicating synchronously was used: {outcome:?}");
    };
    assert!(
        matches!(&err, Error::NoSynchronousStandby { reported, .. }
            if reported.contains("synchronous_standby_names = ''")),
        "{err}"
    );
    assert_eq!(tools.payments.calls(), 1, "nothing was sent on it");
}

/// Why the option exists: with asynchronous replication a failover loses
/// what the standby had not received, acknowledged or not, and an
/// `at_most_once` call whose INTENT is lost that way is made again (the
/// README's "what asynchronous replication would lose"). The option
/// refuses such a pair outright.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_synchronous_standby_a_failover_makes_an_acknowledged_call_twice() {
    let mut pair = PgPair::start_asynchronous().unwrap();
    let url = pair.create_database().unwrap();
    let Err(err) = PostgresJournal::connect_with(&url, &options()).await else {
        panic!("the option accepted a pair that replicates asynchronously");
    };
    assert!(matches!(err, Error::NoSynchronousStandby { .. }), "{err}");

    // Without the option the runtime runs on it. While the standby lags
    // (here: is down), the primary acknowledges a call's INTENT and COMMIT
    // alone.
    let plain = PostgresOptions {
        synchronous_standby: false,
        ..options()
    };
    let connect = |worker: &'static str| {
        Runtime::builder()
            .postgres(&url)
            .worker_id(worker)
            .postgres_options(plain.clone())
            .connect()
    };
    let rt = bounded(connect("pod-async")).await.unwrap();
    let wire = tool_with("wire", Class::AtMostOnce, |_| {});
    let bank = ScriptedProvider::new(&[]);
    pair.stop_standby().unwrap();
    let out = bounded(call(&rt.run("run"), wire, &bank, 1, "1", VerifyMode::None)).await;
    assert_eq!(out.unwrap(), "done:1", "acknowledged");
    pair.stop_immediate().unwrap();
    pair.start_standby().unwrap();
    pair.promote().unwrap();

    // A worker that never saw the call (its own died with the primary,
    // say) finds no INTENT, so the call is made again.
    let other = bounded(connect("pod-async-2")).await.unwrap();
    let out = bounded(call(
        &other.run("run"),
        wire,
        &bank,
        1,
        "1",
        VerifyMode::None,
    ))
    .await;
    assert_eq!(out.unwrap(), "done:1");
    let key = key(&other.run("run"), wire, 1);
    assert_eq!(
        bank.effects_for(key.as_str()),
        2,
        "the acknowledged call was lost with the primary and made again: a duplicate effect"
    );
}

/// Many failovers back and forth, alternating the cut points, with many
/// calls each: `IDEM_FAILOVERS` (default 20) rounds of
/// `IDEM_FAILOVER_CALLS` (default 50) acknowledged calls of each class.
/// Prints `failovers=N calls=M duplicates=0 lost=0`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: many failovers; cargo test --test failover -- --ignored --nocapture"]
async fn many_failovers_lose_nothing_and_duplicate_nothing() {
    let var = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (failovers, calls) = (var("IDEM_FAILOVERS", 20), var("IDEM_FAILOVER_CALLS", 50));
    let mut w = World::start("pod-long").await;
    for round in 1..=failovers {
        let cut = if round % 2 == 1 {
            Cut::BeforeCommit
        } else {
            Cut::CommitUnreplicated
        };
        failover_round(&mut w, round, cut, calls).await;
    }
    let lost = all_replay(&w.url, "auditor-last", &w.tools, &w.acked).await;
    let duplicates = duplicates(&w.rt, &w.tools, &w.acked);
    println!(
        "failovers={failovers} calls={} duplicates={duplicates} lost={lost}",
        w.acked.len()
    );
    assert_eq!((duplicates, lost), (0, 0));
    one_effect_each(&w.rt, &w.tools, &w.acked);
}
