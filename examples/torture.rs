//! The long torture run:
//!
//! ```text
//! cargo run --release --example torture -- --kills 2000
//! ```
//!
//! Worker processes (this binary, re-executed) run the order workflow of
//! `agent/shop.rs` against the testkit providers and are SIGKILLed at
//! random instants and at the worst instrumented moments, with and without
//! provider faults, until the requested number of kills is reached. After
//! every round the providers' own ledgers must show every operation applied
//! exactly once; see the `idem-torture` crate (idem-torture/src/lib.rs) for everything that is checked.
//!
//! Power-cut mode:
//!
//! ```text
//! cargo run --release --example torture -- --power-cuts 1000 --seed S
//! ```
//!
//! puts the journal on idem-testkit's power-cut file system (FUSE; needs
//! `/dev/fuse` and root or `fusermount3`): every kill is also a power cut
//! that loses whatever was not fsynced, and the last worker of each round
//! is followed by one more cut before the checks. The summary line then
//! reads `power-cut summary: ... power_cuts=N duplicates=D lost=L
//! lost_commits=C (...) recovered=C (...) ... reopen_failures=R
//! refused_opens=F ...`.
//!
//! In both single-worker modes, `lost_commits` counts results of the
//! saga's eventual-commit tools (`commit = "eventual"`) that a worker had
//! been given and whose COMMITTED record the kill or cut then lost, and
//! `recovered` those found unfinished later and committed with the same
//! result and one effect at the provider (anything less is a violation).
//!
//! Options: `--power-cuts N` (power-cut mode, N cuts), `--sync-new-journal`
//! (power-cut mode, diagnostic: the harness makes each new journal durable
//! before the first worker, so only the failures of a running journal
//! remain), `--kills N` (default 1000), `--seed S` (decimal or 0x-hex;
//! default `IDEM_TORTURE_SEED` or the clock), `--workflows N` orders per
//! round (default 6), `--concurrency N` orders at once per worker
//! (default 3), `--chaos never|alternate|always` (default alternate),
//! `--keep-going` to count violations and go on instead of stopping at the
//! first one. In power-cut mode, `IDEM_TORTURE_KEEP_DAMAGED=DIR` keeps the
//! durable state of every journal that did not reopen (and its violation)
//! under DIR, for a post-mortem.
//! Exits 1 if anything was duplicated, lost or otherwise wrong.
//!
//! Multi-worker mode, on PostgreSQL:
//!
//! ```text
//! cargo run --release --example torture -- --backend postgres --workers 4 --kills 2000
//! ```
//!
//! starts a throwaway PostgreSQL server (Debian's `postgresql` binaries)
//! and, per round, a fresh database that `--workers` worker processes
//! share, racing the same orders; workers are SIGKILLed, killed at crash
//! points and paused past their lease (SIGSTOP/SIGCONT), and the database
//! server is restarted mid-wave (`pg_ctl stop -m immediate`) about once
//! every `--db-restart-every N` waves (default 6). See
//! `torture/multi.rs`. The summary line adds `backend=postgres workers=N
//! db_restarts=R failovers=F (lagging standby=L) pauses=P`.
//!
//! `--failover` (with `--backend postgres`): the database lives on a
//! primary with a synchronous standby, the workers connect with its
//! multi-host URL and `synchronous_standby(true)`, and where a wave would
//! restart the server it fails over instead (the primary stopped `-m
//! immediate`, the standby promoted, a new synchronous standby made of it;
//! one failover in two after the standby lagged).
//!
//! `--dump DIR` prints the audit stream and open escalations of a journal a
//! failed round left behind (its path is in the violation message).

use idem_torture as harness;
use idem_torture::{Backend, ChaosMode, Config};

fn main() {
    if harness::is_worker() {
        std::process::exit(harness::worker_main());
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, dir] = args.as_slice() {
        if flag == "--dump" {
            std::process::exit(dump(std::path::Path::new(dir)));
        }
    }
    let config = match parse(args.into_iter()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}\nusage: torture [--kills N | --power-cuts N] [--backend sled|postgres] [--workers N] [--db-restart-every N] [--failover] [--seed S] [--workflows N] [--concurrency N] [--chaos never|alternate|always] [--keep-going] [--sync-new-journal]");
            std::process::exit(2);
        }
    };
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("cannot find this program to start workers: {e}");
            std::process::exit(2);
        }
    };
    let worker = move || std::process::Command::new(&exe);
    let summary = harness::run(&config, &worker, &mut |line| println!("{line}"));
    for v in &summary.violations {
        println!("VIOLATION: {v}");
    }
    println!("{summary}");
    std::process::exit(if summary.ok() { 0 } else { 1 });
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<Config, String> {
    let mut config = Config::new(1000);
    config.progress_every = 25;
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        let number =
            |name: &str, v: String| v.parse::<u64>().map_err(|e| format!("{name} {v}: {e}"));
        match arg.as_str() {
            "--kills" => config.kills = number("--kills", value("--kills")?)?,
            "--power-cuts" => {
                config.power_cuts = number("--power-cuts", value("--power-cuts")?)?.max(1)
            }
            "--seed" => {
                let v = value("--seed")?;
                config.seed = harness::parse_seed(&v).ok_or(format!("--seed {v}: not a number"))?;
            }
            "--workflows" => {
                config.workflows = number("--workflows", value("--workflows")?)?.max(1)
            }
            "--concurrency" => {
                config.concurrency =
                    number("--concurrency", value("--concurrency")?)?.max(1) as usize
            }
            "--chaos" => {
                config.chaos = match value("--chaos")?.as_str() {
                    "never" => ChaosMode::Never,
                    "alternate" => ChaosMode::Alternate,
                    "always" => ChaosMode::Always,
                    other => return Err(format!("--chaos {other}: never, alternate or always")),
                }
            }
            "--backend" => {
                config.backend = match value("--backend")?.as_str() {
                    "sled" => Backend::Sled,
                    "postgres" => Backend::Postgres,
                    other => return Err(format!("--backend {other}: sled or postgres")),
                };
                if config.backend == Backend::Postgres && config.workers < 2 {
                    config.workers = 4;
                }
            }
            "--workers" => {
                config.workers = number("--workers", value("--workers")?)?.max(1) as usize
            }
            "--db-restart-every" => {
                config.db_restart_every =
                    number("--db-restart-every", value("--db-restart-every")?)?.max(1)
            }
            "--failover" => config.failover = true,
            "--keep-going" => config.stop_on_violation = false,
            "--sync-new-journal" => config.sync_new_journal = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if config.workers > 1 && config.backend != Backend::Postgres {
        return Err("--workers N needs --backend postgres (sled is one process's)".into());
    }
    if config.failover && config.backend != Backend::Postgres {
        return Err("--failover needs --backend postgres".into());
    }
    if config.backend == Backend::Postgres && config.power_cuts > 0 {
        return Err("--power-cuts is a sled mode".into());
    }
    Ok(config)
}

/// Prints a journal's audit stream (JSON lines) and open escalations.
fn dump(dir: &std::path::Path) -> i32 {
    let tokio = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{e}");
            return 1;
        }
    };
    tokio.block_on(dump_async(dir))
}

async fn dump_async(dir: &std::path::Path) -> i32 {
    let rt = match idem::Runtime::open(dir) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{e}");
            return 1;
        }
    };
    if let Err(e) = rt.export_audit(0, &mut std::io::stdout()).await {
        eprintln!("{e}");
        return 1;
    }
    match rt.escalations().await {
        Ok(open) => {
            for e in open {
                println!("open escalation: {e:?}");
            }
            0
        }
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}
