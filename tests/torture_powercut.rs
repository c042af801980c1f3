//! Power-cut torture: the harness of idem-torture/src/lib.rs with the
//! journal on idem-testkit's power-cut file system (FUSE). Every kill, at a
//! random instant or at an instrumented crash point, is also a power cut
//! that loses what was not fsynced; each round ends with one more cut after
//! its last worker exited. Ground truth is the providers' ledgers, which
//! live outside the cut file system.
//!
//! - `power_cut_torture_quick`: about 40 cuts, part of `cargo test`; fails
//!   on any duplicate, loss, reopen failure or other violation, and fails
//!   (never skips) where FUSE is unusable. `IDEM_TORTURE_CUTS` and
//!   `IDEM_TORTURE_SEED` override the cut count and the seed.
//! - `power_cut_torture_long` (ignored): a thousand cuts;
//!   `cargo test --release --test torture_powercut -- --ignored --nocapture`,
//!   or `cargo run --release --example torture -- --power-cuts 1000`.

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

fn cuts_from_env(default: u64) -> u64 {
    harness::count_from_env("IDEM_TORTURE_CUTS", default)
}

/// Panics unless the run was clean.
fn torture(cuts: u64, progress_every: u64, max_elapsed: Duration) -> harness::Summary {
    let mut config = harness::Config::power_cuts(cuts);
    config.max_elapsed = max_elapsed;
    config.progress_every = progress_every;
    harness::run_in_test(config, &worker_command)
}

/// What a clean run must also show: that it tested what it claims.
fn assert_clean(summary: &harness::Summary, cuts: u64) {
    assert_eq!(
        (summary.duplicates, summary.lost, summary.reopen_failures),
        (0, 0, 0),
        "{summary}"
    );
    assert!(summary.power_cuts >= cuts, "{summary}");
    // Cuts of every kind happened, some keeping a torn prefix of what was
    // unsynced. (How much unsynced state a cut finds is the journal's
    // business: a journal that syncs before it acknowledges leaves little,
    // so it is reported, not required; the file system's own tests show
    // that unsynced writes are lost.)
    assert!(
        summary.random_cuts > 0 && summary.crashpoint_cuts > 0 && summary.exit_cuts > 0,
        "{summary}"
    );
    assert!(summary.prefix_cuts > 0, "{summary}");
    // Every tool cut at each of its instrumented points; the ledgers and
    // the journal after each round's last cut count one effect and one
    // durable commit per tool and order; each eventual-commit tool lost a
    // COMMIT to a cut, and every lost one was recovered with the result
    // its caller had been given. (That every large result replayed intact
    // is part of `ok()`: a failed one counts as lost.)
    harness::assert_covered_and_counted(summary);
}

#[test]
fn power_cut_torture_quick() {
    // The coverage chain alone takes twenty cuts (every point of the
    // order workflow and the saga); past it, random cuts come too.
    let cuts = cuts_from_env(40);
    // Some 20 s in a debug build on 2 cores; the bound only stops a run
    // that has stopped making progress.
    let summary = torture(cuts, 0, Duration::from_secs(120));
    assert_clean(&summary, cuts);
}

#[test]
#[ignore = "long: a thousand power cuts; run with --ignored (in --release)"]
fn power_cut_torture_long() {
    let cuts = cuts_from_env(1000);
    let summary = torture(cuts, 25, Duration::from_secs(3600));
    assert_clean(&summary, cuts);
    assert!(summary.escalation_total() > 0, "{summary}");
}
