//! SIGKILL torture through the real `#[tool]` attribute and the testkit's
//! TCP providers (the harness is idem-torture/src/lib.rs, the tools
//! examples/agent/shop.rs).
//!
//! - `sigkill_torture_quick`: 60 kills, with and without provider
//!   faults, every tool killed at its instrumented points (the saga's
//!   eventual-commit tools also right after a call returned, which loses
//!   its COMMIT: each loss must be recovered with the result the caller
//!   had) and one charge key outliving its dedupe window, every escalation
//!   justified by the faults and kills; part of `cargo test`. `IDEM_TORTURE_KILLS` and
//!   `IDEM_TORTURE_SEED` override the kill count and the seed;
//!   `IDEM_TORTURE_KEEP_GOING=1` counts every violation instead of
//!   stopping at the first.
//! - `sigkill_torture_long` (ignored): a thousand kills by default;
//!   `cargo test --release --test torture -- --ignored --nocapture`.
//! - `audit_events_of_killed_processes_survive_restarts`: the audit stream
//!   keeps every commit of processes killed after a seeded number of
//!   acknowledged commits (none: before the journal is open).
//!
//! Workers are this test binary, re-executed to run only
//! `worker_process_entry`, which becomes the worker when the harness's
//! environment variable is set (and passes trivially otherwise).

use idem_torture as harness;
#[allow(unused_imports)]
use idem_torture::shop;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use idem::{tool, Classify, Ctx, EventKind, Failure, Runtime};

const WORKER_TEST: &str = "worker_process_entry";

/// The entry point of every child process of this file.
#[test]
fn worker_process_entry() {
    if harness::is_worker() {
        std::process::exit(harness::worker_main());
    }
    if let Ok(journal) = std::env::var(AUDIT_CHILD_ENV) {
        std::process::exit(audit_child(Path::new(&journal)));
    }
}

/// This binary, told to run only [`worker_process_entry`].
fn worker_command() -> Command {
    harness::test_binary_worker(WORKER_TEST)
}

fn kills_from_env(default: u64) -> u64 {
    harness::count_from_env("IDEM_TORTURE_KILLS", default)
}

/// Panics unless the run was clean.
fn torture(kills: u64, progress_every: u64, max_elapsed: Duration) -> harness::Summary {
    let mut config = harness::Config::new(kills);
    config.max_elapsed = max_elapsed;
    config.progress_every = progress_every;
    harness::run_in_test(config, &worker_command)
}

/// What a clean run must also show: that it tested what it claims.
fn assert_clean(summary: &harness::Summary, kills: u64) {
    assert!(summary.kills >= kills, "{summary}");
    // Both kinds of kill happened, with and without faults, and at least
    // one kill hit an operation that was then recovered from the journal.
    assert!(
        summary.random_kills > 0 && summary.crashpoint_kills > 0,
        "{summary}"
    );
    assert!(summary.chaos_rounds > 0 && summary.faults > 0, "{summary}");
    assert!(summary.recoveries > 0, "{summary}");
    harness::assert_covered_and_counted(summary);
    // The charge's key outlived the provider's dedupe window, and idem
    // escalated instead of charging again (a second charge would be a
    // DUPLICATE above).
    assert!(summary.window_jumps > 0, "{summary}");
    assert!(
        summary
            .justified
            .keys()
            .any(|k| k.starts_with("charge:") && !k.ends_with("attempts spent")),
        "no charge escalated on its window or max_elapsed: {summary}"
    );
}

#[test]
fn sigkill_torture_quick() {
    let kills = kills_from_env(60);
    // About 7 s in a debug build on 2 cores; the bound only stops a run
    // that has stopped making progress.
    let summary = torture(kills, 0, Duration::from_secs(120));
    assert_clean(&summary, kills);
}

#[test]
#[ignore = "long: a thousand kills; run with --ignored (in --release)"]
fn sigkill_torture_long() {
    let kills = kills_from_env(1000);
    let summary = torture(kills, 25, Duration::from_secs(3600));
    assert_clean(&summary, kills);
    assert!(summary.escalation_total() > 0, "{summary}");
}

// ---------------------------------------------------------------------------
// The audit stream across crashes, without providers or the harness.

const AUDIT_CHILD_ENV: &str = "IDEM_TEST_AUDIT_CHILD";
const AUDIT_FROM_ENV: &str = "IDEM_TEST_AUDIT_FROM";
/// What a child prints after each commit returned: `COMMITTED <n>`.
const COMMITTED: &str = "COMMITTED ";

#[derive(Debug)]
struct NeverFails;

impl Classify for NeverFails {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

#[tool(class = "provider", key = "n")]
async fn note(ctx: &Ctx, n: u64) -> Result<u64, NeverFails> {
    let _ = ctx;
    Ok(n)
}

/// A child: commits `note(n)` under run `n-{n}` for n = from, from+1, ...
/// (20 of them), printing `COMMITTED n` on stdout after each commit
/// returned, until it is killed.
fn audit_child(journal: &Path) -> i32 {
    let from: u64 = std::env::var(AUDIT_FROM_ENV)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio");
    runtime.block_on(async {
        let rt = Runtime::open(journal).expect("open journal");
        let mut out = std::io::stdout().lock();
        for n in from..from + 20 {
            note(&rt.run(&format!("n-{n}")), n).await.expect("commit");
            // Unbuffered as far as the parent is concerned: it reads this
            // line to decide when to kill.
            writeln!(out, "{COMMITTED}{n}").expect("stdout");
            out.flush().expect("stdout");
        }
    });
    0
}

/// Processes commit operations one after the other and are SIGKILLed, each
/// right after it acknowledged a seeded number of commits (0 to 5: before
/// the journal is even open, or in the middle of the next operation). An
/// operation whose call returned is committed, and its commit is a durable
/// audit event: the audit stream read at the end must hold a
/// `Committed` event for every acknowledged one, and each process must have
/// reopened the journal its predecessor was killed on and committed what it
/// was waited for.
#[test]
fn audit_events_of_killed_processes_survive_restarts() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal");
    let mut rng = idem_testkit::SplitMix64::new(7);
    let mut committed: Vec<u64> = Vec::new();
    let mut awaited = 0;
    for round in 0..30u64 {
        let mut child = worker_command();
        child
            .env(AUDIT_CHILD_ENV, &journal)
            .env(AUDIT_FROM_ENV, (round * 100).to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = child.spawn().unwrap();
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let wait_for = rng.below(6);
        awaited += wait_for;
        let mut seen = 0;
        while seen < wait_for {
            match lines.next() {
                Some(line) => {
                    let line = line.unwrap();
                    if let Some(n) = line.strip_prefix(COMMITTED) {
                        committed.push(n.parse().unwrap());
                        seen += 1;
                    }
                }
                None => {
                    let _ = child.wait();
                    let mut stderr = String::new();
                    let _ = std::io::Read::read_to_string(
                        &mut child.stderr.take().unwrap(),
                        &mut stderr,
                    );
                    panic!(
                        "round {round}: the child stopped after {seen} of {wait_for} commits:\n{stderr}"
                    );
                }
            }
        }
        let _ = child.kill();
        child.wait().unwrap();
        // What it printed between our decision and its death was
        // acknowledged too.
        for line in lines {
            if let Some(n) = line.unwrap().strip_prefix(COMMITTED) {
                committed.push(n.parse().unwrap());
            }
        }
    }
    assert!(
        committed.len() as u64 >= awaited && awaited > 0,
        "{} commits acknowledged, {awaited} awaited",
        committed.len()
    );
    let rt = Runtime::open(&journal).unwrap();
    let events: Vec<_> = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(rt.audit(0))
        .unwrap();
    let audited: std::collections::BTreeSet<&str> = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Committed { .. }))
        .map(|e| e.root_run.as_str())
        .collect();
    let missing: Vec<u64> = committed
        .iter()
        .copied()
        .filter(|n| !audited.contains(format!("n-{n}").as_str()))
        .collect();
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert!(
        missing.is_empty(),
        "{} of {} committed operations have no Committed event in the audit stream: {missing:?}\n\
         sequence numbers in the stream: {seqs:?}",
        missing.len(),
        committed.len()
    );
}
