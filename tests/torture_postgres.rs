//! Multi-worker torture on PostgreSQL (the harness's multi-worker mode,
//! idem-torture/src/multi.rs): four worker processes race the same orders
//! on one database while they are SIGKILLed, paused past their lease and
//! the database server is restarted under them, or (failover mode) fails
//! over to its synchronous standby.
//!
//! - `multi_worker_torture_quick`: 40 kills; part of `cargo test`.
//!   `IDEM_TORTURE_KILLS` / `IDEM_TORTURE_SEED` override.
//! - `multi_worker_torture_quick_behind_pgbouncer`: the same with 12 kills,
//!   the workers connecting through a pgbouncer in transaction pooling
//!   mode (`PostgresOptions::pooler(true)`) while the server restarts
//!   behind it.
//! - `stale_owners_are_fenced`: every worker after the first wave is
//!   paused (SIGSTOP) until its lease ran out twice over, then continued
//!   (SIGCONT): the others take its calls over, and whatever it does when
//!   it wakes must not duplicate an effect or add a second commit.
//! - `multi_worker_torture_quick_with_failovers`: 16 kills, the database
//!   on a primary with a synchronous standby (`PgPair`) and a failover in
//!   every wave but the measuring one instead of a restart (the primary
//!   stopped `-m immediate`, the standby promoted, a new standby made of
//!   it; one in two after the standby lagged), the workers on the pair's
//!   multi-host URL with `PostgresOptions::synchronous_standby(true)`; at
//!   least 2 failovers. About 20 s.
//! - `multi_worker_torture_long` (ignored): 2000 kills;
//!   `cargo test --release --test torture_postgres -- --ignored --nocapture`.
//! - `multi_worker_torture_failover_long` (ignored): 1000 kills, a
//!   failover about every third wave (at least 20);
//!   `cargo test --release --features http,admin,mcp,schemars,postgres,testing,otel
//!   --test torture_postgres multi_worker_torture_failover_long -- --ignored --nocapture`.
//!
//! Workers are this test binary, re-executed to run only
//! `worker_process_entry`.

use idem_torture as harness;
#[allow(unused_imports)]
use idem_torture::shop;

use std::process::Command;
use std::time::Duration;

const WORKER_TEST: &str = "worker_process_entry";

/// The entry point of every child process of this file.
#[test]
fn worker_process_entry() {
    if harness::is_worker() {
        std::process::exit(harness::worker_main());
    }
}

fn worker_command() -> Command {
    harness::test_binary_worker(WORKER_TEST)
}

fn kills_from_env(default: u64) -> u64 {
    harness::count_from_env("IDEM_TORTURE_KILLS", default)
}

/// Panics unless the run was clean.
fn torture(config: harness::Config) -> harness::Summary {
    let summary = harness::run_in_test(config, &worker_command);
    assert_eq!(summary.operations, summary.workflows * 4);
    summary
}

#[test]
fn multi_worker_torture_quick() {
    let kills = kills_from_env(40);
    let mut config = harness::Config::multi_worker(kills, 4);
    config.db_restart_every = 3;
    config.max_elapsed = Duration::from_secs(240);
    let summary = torture(config);
    assert!(summary.kills >= kills, "{summary}");
    assert!(
        summary.random_kills > 0 && summary.crashpoint_kills > 0,
        "{summary}"
    );
    assert!(summary.db_restarts > 0, "{summary}");
    assert!(summary.recoveries > 0, "{summary}");
}

/// The quick mode with the workers behind pgbouncer in transaction
/// pooling mode (`PostgresOptions::pooler(true)`): fewer kills, the same
/// checks.
#[test]
fn multi_worker_torture_quick_behind_pgbouncer() {
    let kills = kills_from_env(12);
    let mut config = harness::Config::multi_worker(kills, 4);
    config.pooler = true;
    config.db_restart_every = 3;
    config.max_elapsed = Duration::from_secs(240);
    let summary = torture(config);
    assert!(summary.kills >= kills, "{summary}");
    assert!(summary.recoveries > 0, "{summary}");
}

#[test]
fn stale_owners_are_fenced() {
    let mut config = harness::Config::multi_worker(0, 4);
    config.pauses_only = true;
    // No kills: rounds are counted instead; the first wave of each round
    // measures, the later ones pause.
    config.max_rounds = 3;
    config.kills = u64::MAX;
    config.db_restart_every = u64::MAX;
    config.max_elapsed = Duration::from_secs(240);
    let summary = torture(config);
    assert!(summary.pauses >= 4, "{summary}");
}

/// The failover mode (`Config::failover`): the round's database lives on
/// a primary with a synchronous standby, the workers connect with the
/// pair's multi-host URL and `synchronous_standby(true)`, and every wave
/// (after the first, which measures) fails over mid-wave instead of
/// restarting the server: the primary is stopped `-m immediate`, the
/// standby promoted, a new synchronous standby made of it, while workers
/// are killed and paused as ever.
#[test]
fn multi_worker_torture_quick_with_failovers() {
    let kills = kills_from_env(16);
    let mut config = harness::Config::multi_worker_failover(kills, 4);
    config.db_restart_every = 1;
    config.max_elapsed = Duration::from_secs(240);
    let summary = torture(config);
    assert!(summary.kills >= kills, "{summary}");
    assert!(summary.failovers >= 2, "{summary}");
    assert_eq!(summary.db_restarts, 0, "{summary}");
    assert!(summary.recoveries > 0, "{summary}");
}

#[test]
#[ignore = "long: 1000 kills and dozens of failovers; run with --ignored (in --release)"]
fn multi_worker_torture_failover_long() {
    let kills = kills_from_env(1000);
    let mut config = harness::Config::multi_worker_failover(kills, 4);
    config.db_restart_every = 3;
    config.progress_every = 25;
    config.max_elapsed = Duration::from_secs(4 * 3600);
    let summary = torture(config);
    assert!(summary.kills >= kills, "{summary}");
    assert!(summary.failovers >= 20, "{summary}");
}

#[test]
#[ignore = "long: 2000 kills and a dozen database restarts; run with --ignored (in --release)"]
fn multi_worker_torture_long() {
    let kills = kills_from_env(2000);
    let mut config = harness::Config::multi_worker(kills, 4);
    config.progress_every = 25;
    config.max_elapsed = Duration::from_secs(4 * 3600);
    let summary = torture(config);
    assert!(summary.kills >= kills, "{summary}");
    assert!(summary.db_restarts >= 10, "{summary}");
}
