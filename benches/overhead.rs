//! idem's overhead against the floor: what a durable call cannot avoid is two
//! fdatasyncs (INTENT before the provider, COMMITTED after). This measures,
//! in one run and on the journal's own disk, that floor and everything idem
//! adds to it, and prints the ratios DESIGN.md §8 sets targets for:
//!
//! - fdatasync p50 of a small append (the floor's unit);
//! - a fresh journaled call of a no-op provider tool (target: p50 within
//!   1.5 × two fdatasyncs);
//! - replay of a committed result (target: p50 under 20 µs);
//! - a read-only call against a plain async fn (target: under 1 µs more);
//! - 64 concurrent tasks making fresh calls (target: 10 × sequential);
//! - a journal of a million operations: lookup and replay latency as it
//!   grows, memory, size on disk, and how long retention takes to prune it.
//!
//! With `--postgres` (`cargo bench --bench overhead -- --postgres`) it
//! measures the PostgreSQL journal instead (DESIGN.md §12), on a local
//! throwaway server with fsync on: see `postgres_bench`.
//!
//! Run with `cargo bench --bench overhead`. `IDEM_BENCH_RECORDS` sets the
//! scale (default 1000000); `IDEM_BENCH_DIR` where the journal lives
//! (default: a temporary directory under `target/`).
//! Nothing here asserts: the figures are for people to read.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::{tool, Classify, Ctx, Failure, ManualClock, Runtime};

/// The no-op tools' error type; never produced.
#[derive(Debug)]
struct Never;

impl Classify for Never {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

#[tool(class = "provider", key = "n")]
async fn charge_noop(ctx: &Ctx, n: u64) -> Result<u64, Never> {
    let _ = ctx.idempotency_key();
    Ok(n)
}

#[tool(class = "read_only")]
async fn lookup_tool(ctx: &Ctx, n: u64) -> Result<u64, Never> {
    let _ = ctx;
    Ok(n)
}

#[inline(never)]
async fn lookup_plain(_ctx: &Ctx, n: u64) -> Result<u64, Never> {
    Ok(std::hint::black_box(n))
}

struct Summary {
    p50: Duration,
    p90: Duration,
    p99: Duration,
}

fn summarize(mut samples: Vec<Duration>) -> Summary {
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    Summary {
        p50: at(0.50),
        p90: at(0.90),
        p99: at(0.99),
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn line(name: &str, s: &Summary) {
    println!(
        "{name:<44} p50 {:>9.1} us   p90 {:>9.1} us   p99 {:>9.1} us",
        us(s.p50),
        us(s.p90),
        us(s.p99)
    );
}

/// fdatasync of a 128-byte append, in the journal's directory.
fn fdatasync_floor(dir: &Path, n: usize) -> Summary {
    let path = dir.join("fdatasync-probe");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .expect("probe file");
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        f.write_all(&[0xA5; 128]).expect("append");
        let t = Instant::now();
        f.sync_data().expect("fdatasync");
        samples.push(t.elapsed());
    }
    drop(f);
    let _ = std::fs::remove_file(path);
    summarize(samples)
}

fn rss_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

async fn fresh_calls(ctx: &Ctx, keys: std::ops::Range<u64>) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(keys.clone().count());
    for n in keys {
        let t = Instant::now();
        charge_noop(ctx, n).await.expect("fresh call");
        samples.push(t.elapsed());
    }
    samples
}

/// Fresh calls from `tasks` concurrent tasks; returns calls per second.
async fn concurrent(ctx: &Ctx, tasks: u64, per_task: u64, base: u64) -> f64 {
    let started = Instant::now();
    let mut handles = Vec::new();
    for t in 0..tasks {
        let ctx = ctx.clone();
        handles.push(tokio::spawn(async move {
            for i in 0..per_task {
                charge_noop(&ctx, base + t * per_task + i)
                    .await
                    .expect("concurrent call");
            }
        }));
    }
    for h in handles {
        h.await.expect("task");
    }
    (tasks * per_task) as f64 / started.elapsed().as_secs_f64()
}

/// Replays of `n` committed keys drawn from `0..population` (splitmix64).
async fn replays(ctx: &Ctx, population: u64, n: usize, seed: u64) -> Summary {
    let mut state = seed;
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        let key = (z ^ (z >> 31)) % population;
        let t = Instant::now();
        charge_noop(ctx, key).await.expect("replay");
        samples.push(t.elapsed());
    }
    summarize(samples)
}

fn bench_dir() -> PathBuf {
    let base = std::env::var_os("IDEM_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    std::fs::create_dir_all(&base).expect("bench dir");
    base
}

fn main() {
    if std::env::args().any(|a| a == "--postgres") {
        postgres_bench();
        return;
    }
    let records: u64 = std::env::var("IDEM_BENCH_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio");
    let base = bench_dir();
    let tmp = tempfile::Builder::new()
        .prefix("idem-bench-")
        .tempdir_in(&base)
        .expect("temp dir");
    let journal_dir = tmp.path().join("journal");

    println!("idem overhead benchmark");
    println!(
        "machine: {} cores, journal in {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        tmp.path().display()
    );
    println!();

    let floor = fdatasync_floor(tmp.path(), 2000);
    line("fdatasync, 128-byte append (the floor)", &floor);

    let clock = ManualClock::new(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
    );
    let rt = Runtime::builder()
        .path(&journal_dir)
        .clock(Arc::new(clock.clone()))
        .open()
        .expect("journal");
    let ctx = rt.run("bench");

    tokio.block_on(async {
        // Warm up: the log segment, sled's first pages.
        fresh_calls(&ctx, 10_000_000..10_000_200).await;

        let seq = 3000;
        let fresh_samples = fresh_calls(&ctx, 0..seq).await;
        let seq_secs: f64 = fresh_samples.iter().map(Duration::as_secs_f64).sum();
        let fresh = summarize(fresh_samples);
        line("fresh provider call (INTENT + COMMIT)", &fresh);
        let replay = replays(&ctx, seq, 20_000, 1).await;
        line("replay of a committed result", &replay);

        // read_only: the same no-op through the attribute and as a plain fn,
        // in batches, so timer resolution does not dominate.
        let batch = 2000u64;
        let mut overhead = Vec::new();
        let mut tool_per_call = Vec::new();
        for b in 0..200u64 {
            let t = Instant::now();
            for n in 0..batch {
                std::hint::black_box(lookup_plain(&ctx, b * batch + n).await.ok());
            }
            let plain = t.elapsed();
            let t = Instant::now();
            for n in 0..batch {
                std::hint::black_box(lookup_tool(&ctx, b * batch + n).await.ok());
            }
            let tooled = t.elapsed();
            tool_per_call.push(tooled / batch as u32);
            overhead.push(tooled.saturating_sub(plain) / batch as u32);
        }
        line("read_only call (whole call)", &summarize(tool_per_call));
        line(
            "read_only overhead over a plain async fn",
            &summarize(overhead.clone()),
        );

        let tasks = 64;
        let per_task = 200;
        let conc = concurrent(&ctx, tasks, per_task, 1_000_000_000).await;
        let seq_rate = seq as f64 / seq_secs;
        println!(
            "{:<44} {conc:>9.0} calls/s (sequential: {seq_rate:.0} calls/s)",
            format!("{tasks} concurrent tasks, fresh calls")
        );

        println!();
        println!("ratios (DESIGN.md §8 targets in brackets)");
        let two = 2.0 * us(floor.p50);
        println!(
            "  fresh p50 / (2 x fdatasync p50)          {:>6.2}   [<= 1.5]   ({:.1} us / {:.1} us)",
            us(fresh.p50) / two,
            us(fresh.p50),
            two
        );
        println!(
            "  replay p50                               {:>6.2} us [< 20 us]",
            us(replay.p50)
        );
        println!(
            "  read_only overhead p50                   {:>6.3} us [< 1 us]",
            us(summarize(overhead).p50)
        );
        println!(
            "  concurrent / sequential throughput       {:>6.1}   [>= 10]",
            conc / seq_rate
        );

        println!();
        println!("scale: lookup and replay as the journal grows to {records} operations");
        println!(
            "{:>10} {:>14} {:>14} {:>14} {:>12} {:>12}",
            "operations", "replay p50 us", "replay p99 us", "fresh p50 us", "RSS MiB", "disk MiB"
        );
        let mut have = seq;
        let mut next = 10_000u64;
        let populate_base = 2_000_000_000u64;
        let mut filled = 0u64;
        loop {
            let target = next.min(records);
            if target > have {
                // Fill with 64 concurrent tasks; keys in a range of their own.
                let missing = target - have;
                let per = missing.div_ceil(64);
                concurrent(&ctx, 64, per, populate_base + filled).await;
                filled += 64 * per;
                have += 64 * per;
            }
            let r = replays(&ctx, seq, 5000, have).await;
            let f = summarize(
                fresh_calls(&ctx, 3_000_000_000 + have..3_000_000_000 + have + 300).await,
            );
            have += 300;
            let (rss, _) = rss_kib();
            let disk = rt.size_on_disk().await.unwrap_or(0);
            println!(
                "{have:>10} {:>14.1} {:>14.1} {:>14.1} {:>12.1} {:>12.1}",
                us(r.p50),
                us(r.p99),
                us(f.p50),
                rss as f64 / 1024.0,
                disk as f64 / (1 << 20) as f64
            );
            if target >= records {
                break;
            }
            next *= 10;
        }
        let (_, peak) = rss_kib();
        let disk = rt.size_on_disk().await.unwrap_or(0);
        println!(
            "peak RSS {:.1} MiB; on disk {:.1} MiB for {have} operations = {:.0} MiB per million",
            peak as f64 / 1024.0,
            disk as f64 / (1 << 20) as f64,
            disk as f64 / (1 << 20) as f64 / have as f64 * 1e6
        );

        // Retention: every operation is now older than the retention.
        clock.advance(rt.retention() + Duration::from_secs(1));
        let t = Instant::now();
        let report = rt.prune().await.expect("prune");
        println!(
            "retention: pruned {} operations and {} audit events in {:.2} s ({} kept open)",
            report.ops_removed,
            report.events_removed,
            t.elapsed().as_secs_f64(),
            report.ops_kept_open
        );
    });
    drop(ctx);
    drop(rt);
}

/// The PostgreSQL journal against the server's own floor, in one run on one
/// local server (fsync on, unix socket):
///
/// - a single-row commit on a plain connection (autocommit `INSERT`): two
///   of them are what a durable call cannot avoid (INTENT, COMMIT);
/// - the server's ceiling: 64 plain connections committing single rows at
///   once (what pgbench's simple-update test measures);
/// - a fresh journaled call of a no-op provider tool (target: p50 within
///   1.5 x two single-row commits);
/// - a replay of a committed result, uncached (a round trip for the
///   record, one for its dedupe-hit event, committed asynchronously);
/// - 64 concurrent fresh calls against sequential ones, and against half
///   the server's ceiling (target: at least 80 % of it).
fn postgres_bench() {
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio");
    let server = idem_testkit::pg::PgServer::start_with(&idem_testkit::pg::PgServerOptions {
        fsync: true,
        max_connections: 200,
    })
    .expect("start a PostgreSQL server (Debian's postgresql package)");
    let url = server.create_database().expect("a database");
    println!("idem PostgreSQL benchmark");
    println!(
        "machine: {} cores; local PostgreSQL, fsync on, unix socket {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        server.socket_dir().display()
    );
    println!();
    tokio.block_on(async {
        // The floor: single-row commits on a plain connection.
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(connection);
        client
            .batch_execute("CREATE TABLE floor (id bigint PRIMARY KEY, body bytea NOT NULL)")
            .await
            .expect("floor table");
        let insert = client
            .prepare("INSERT INTO floor VALUES ($1, $2)")
            .await
            .expect("prepare");
        let body = vec![0xA5u8; 128];
        for i in 0..200i64 {
            client.execute(&insert, &[&(-i - 1), &body]).await.expect("warm-up");
        }
        let rt = Runtime::builder()
            .postgres(url.as_str())
            .worker_id("bench")
            .postgres_options(idem::PostgresOptions {
                pool_size: 64,
                ..idem::PostgresOptions::default()
            })
            .connect()
            .await
            .expect("connect the journal");
        let ctx = rt.run("bench");
        fresh_calls(&ctx, 10_000_000..10_000_200).await;
        // The floor and the fresh call, sample by sample in turn: this
        // disk's latency drifts, and both must see the same.
        let seq = 2000u64;
        let mut floor_samples = Vec::new();
        let mut fresh_samples = Vec::new();
        for i in 0..seq {
            let t = Instant::now();
            client.execute(&insert, &[&(i as i64), &body]).await.expect("commit");
            floor_samples.push(t.elapsed());
            fresh_samples.extend(fresh_calls(&ctx, i..i + 1).await);
        }
        let commit = summarize(floor_samples);
        line("single-row commit (the floor's unit)", &commit);
        let seq_secs: f64 = fresh_samples.iter().map(Duration::as_secs_f64).sum();
        let fresh = summarize(fresh_samples);
        line("fresh provider call (INTENT + COMMIT)", &fresh);
        let replay = replays(&ctx, seq, 5000, 1).await;
        line("replay of a committed result (uncached)", &replay);

        // The server's ceiling: 64 connections committing at once.
        let mut handles = Vec::new();
        let started = Instant::now();
        let per = 150i64;
        for c in 0..64i64 {
            let url = url.clone();
            let body = body.clone();
            handles.push(tokio::spawn(async move {
                let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .expect("connect");
                tokio::spawn(connection);
                let insert = client
                    .prepare("INSERT INTO floor VALUES ($1, $2)")
                    .await
                    .expect("prepare");
                for i in 0..per {
                    client
                        .execute(&insert, &[&(1_000_000 + c * per + i), &body])
                        .await
                        .expect("commit");
                }
            }));
        }
        for h in handles {
            h.await.expect("client");
        }
        let ceiling = (64 * per) as f64 / started.elapsed().as_secs_f64();
        println!(
            "{:<44} {ceiling:>9.0} commits/s",
            "64 connections, single-row commits"
        );

        let conc = concurrent(&ctx, 64, 100, 1_000_000_000).await;
        let seq_rate = seq as f64 / seq_secs;
        println!(
            "{:<44} {conc:>9.0} calls/s (sequential: {seq_rate:.0} calls/s)",
            "64 concurrent tasks, fresh calls"
        );

        println!();
        println!("ratios (DESIGN.md §12 targets in brackets)");
        let two = 2.0 * us(commit.p50);
        println!(
            "  fresh p50 / (2 x single-row commit p50)  {:>6.2}   [<= 1.5]   ({:.1} us / {:.1} us)",
            us(fresh.p50) / two,
            us(fresh.p50),
            two
        );
        println!(
            "  64 concurrent / (ceiling / 2)            {:>6.2}   [>= 0.8]   ({conc:.0} / {:.0} calls/s)",
            conc / (ceiling / 2.0),
            ceiling / 2.0
        );
        println!(
            "  64 concurrent / sequential               {:>6.1}",
            conc / seq_rate
        );
        println!(
            "  replay p50, uncached                     {:>6.1} us [the target, no round trip, needs the engine's cache of committed results]",
            us(replay.p50)
        );
        drop(ctx);
        drop(rt);
    });
}
