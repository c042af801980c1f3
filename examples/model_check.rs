//! The exhaustive checker of the engine's call machine, by hand:
//!
//! ```text
//! cargo run --release --example model_check [-- --depth N] [--attempts M] [--saga-runs R]
//! ```
//!
//! Explores every interleaving of up to three calls of one key (two at a
//! time, in one process or two processes sharing a journal), for each
//! class (journal with and without `verify`, both commit durabilities
//! where allowed), every attempt outcome, `verify` answer, journal fault,
//! crash and operator resolution, `max_attempts` from 1 to M (default 3),
//! to N moves (default 14, what `cargo test` runs). Every reached world is
//! checked against the invariants listed in the checker's documentation
//! (`idem_runtime::machine::check`); a violation prints its trace as a
//! numbered list of inputs and actions. The last line is
//! `states=N violations=V` (the call machine's and the saga machine's
//! states together; the saga machine is explored completely, with R runs,
//! default 5); the exit status is 1 when V > 0.

use std::time::Instant;

use idem_runtime::machine::check::{explore, saga};

fn main() {
    let mut depth = 14usize;
    let mut attempts = 3u32;
    let mut saga_runs = 5u8;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| -> u64 {
            let v = args
                .next()
                .unwrap_or_else(|| usage(&format!("{name} needs a value")));
            v.parse()
                .unwrap_or_else(|_| usage(&format!("{name}: not a number: {v:?}")))
        };
        match arg.as_str() {
            "--depth" => depth = value("--depth") as usize,
            "--attempts" => attempts = value("--attempts").clamp(1, 3) as u32,
            "--saga-runs" => saga_runs = value("--saga-runs").clamp(1, 20) as u8,
            "-h" | "--help" => usage(""),
            other => usage(&format!("unknown argument {other:?}")),
        }
    }
    let started = Instant::now();
    let mut report = explore::Report::default();
    // Every configuration to `depth`, and the lean ones (two calls,
    // nothing else going wrong) deeper: what the test runs, at any depth.
    let configs: Vec<_> = explore::configs(attempts)
        .into_iter()
        .map(|c| (c, depth))
        .chain(
            explore::lean_configs(attempts)
                .into_iter()
                .map(|c| (c, depth + explore::LEAN_EXTRA)),
        )
        .collect();
    let total = configs.len();
    for (n, (config, depth)) in configs.iter().enumerate() {
        let before = report.states;
        let t = Instant::now();
        explore::explore(config, *depth, &mut report);
        println!(
            "config {:>2}/{total}: {config}; depth {depth}: {} states in {:.1?}",
            n + 1,
            report.states - before,
            t.elapsed()
        );
        if !report.violations.is_empty() {
            break;
        }
    }
    for v in &report.violations {
        println!("{v}");
    }
    println!(
        "depth={depth} configs={} bounded={} elapsed={:.1?}",
        report.configs,
        report.bounded,
        started.elapsed()
    );
    // The saga machine, completely (its worlds are finite).
    let t = Instant::now();
    let sagas = saga::run(saga_runs);
    for v in &sagas.violations {
        println!("{v}");
    }
    println!(
        "saga: runs={saga_runs} configs={} states={} violations={} elapsed={:.1?}",
        sagas.configs,
        sagas.states,
        sagas.violations.len(),
        t.elapsed()
    );
    report.states += sagas.states;
    report.violations.extend(sagas.violations);
    println!(
        "states={} violations={}",
        report.states,
        report.violations.len()
    );
    if !report.violations.is_empty() {
        std::process::exit(1);
    }
}

fn usage(why: &str) -> ! {
    if !why.is_empty() {
        eprintln!("model_check: {why}");
    }
    eprintln!(
        "usage: cargo run --release --example model_check [-- --depth N] [--attempts M] \
         [--saga-runs R]"
    );
    std::process::exit(2);
}
