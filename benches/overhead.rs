//! idem's overhead against the floor: what a durable call cannot avoid is two
//! fdatasyncs (INTENT before the provider, COMMITTED after). This measures,
//! in one run and on the journal's own disk, that floor and everything idem
//! adds to it, and prints the ratios against the targets idem sets itself:
//!
//! - fdatasync p50 of a small append (the floor's unit), measured in blocks
//!   interleaved with blocks of fresh calls, so that the disk's drift over
//!   the run weighs on both alike; and of a small write inside a file
//!   written with zeros first (no size change: the fdatasync writes data
//!   only, as the journal's log segments are written), for reference;
//! - a fresh journaled call of a no-op provider tool (target: p50 within
//!   1.5 × two fdatasyncs), and the same tool with `commit = "eventual"`
//!   (target: p50 within 1.2 × one fdatasync: its COMMITTED record rides
//!   the next group commit);
//! - replay of a committed result, keys drawn uniformly from every
//!   operation in the journal (target: p50 under 20 µs);
//! - a read-only call against a plain async fn (target: under 1 µs more);
//! - 64 concurrent tasks making fresh calls, against the sequential rate
//!   measured the same way (wall clock, fresh keys) in blocks interleaved
//!   with the concurrent ones (target: 10 × sequential);
//! - a journal of a million operations: lookup and replay latency as it
//!   grows, memory, size on disk, how long a reopen takes at each size (the
//!   open checks all of sled's content against the recorded digest), and
//!   how long retention takes to prune it.
//!
//! With `--postgres` (`cargo bench --bench overhead -- --postgres`) it
//! measures the PostgreSQL journal instead, on a local throwaway server
//! with fsync on: see `postgres_bench`.
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

/// [`charge_noop`] with `commit = "eventual"`: the caller gets the result
/// after the INTENT's fdatasync.
#[tool(class = "provider", key = "n", commit = "eventual")]
async fn charge_noop_eventual(ctx: &Ctx, n: u64) -> Result<u64, Never> {
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

/// fdatasyncs of 128-byte appends to a probe file in the journal's
/// directory: the floor, sampled a block at a time between the calls.
/// With `in_place`, the writes go inside a file written with zeros first
/// (the file's size does not change, so the fdatasync writes data only: the
/// journal's log segments are written that way).
struct Floor {
    file: std::fs::File,
    path: PathBuf,
    samples: Vec<Duration>,
    in_place: Option<u64>,
}

impl Floor {
    const IN_PLACE_BYTES: u64 = 8 << 20;

    fn new(dir: &Path) -> Floor {
        let path = dir.join("fdatasync-probe");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .expect("probe file");
        Floor {
            file,
            path,
            samples: Vec::new(),
            in_place: None,
        }
    }

    fn in_place(dir: &Path) -> Floor {
        let path = dir.join("fdatasync-probe-in-place");
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&path)
            .expect("probe file");
        file.write_all(&vec![0; Self::IN_PLACE_BYTES as usize])
            .expect("zeros");
        file.sync_all().expect("fsync");
        Floor {
            file,
            path,
            samples: Vec::new(),
            in_place: Some(0),
        }
    }

    fn block(&mut self, n: usize) {
        use std::os::unix::fs::FileExt as _;
        for _ in 0..n {
            match &mut self.in_place {
                Some(at) => {
                    self.file.write_all_at(&[0xA5; 128], *at).expect("write");
                    *at = (*at + 128) % Self::IN_PLACE_BYTES;
                }
                None => self.file.write_all(&[0xA5; 128]).expect("append"),
            }
            let t = Instant::now();
            self.file.sync_data().expect("fdatasync");
            self.samples.push(t.elapsed());
        }
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The operations committed so far, as key ranges: what replays draw from.
#[derive(Default)]
struct Committed(Vec<std::ops::Range<u64>>);

impl Committed {
    fn add(&mut self, keys: std::ops::Range<u64>) {
        self.0.push(keys);
    }

    fn len(&self) -> u64 {
        self.0.iter().map(|r| r.end - r.start).sum()
    }

    /// The `i`-th committed key, `i < len()`.
    fn nth(&self, mut i: u64) -> u64 {
        for r in &self.0 {
            let n = r.end - r.start;
            if i < n {
                return r.start + i;
            }
            i -= n;
        }
        unreachable!("index past the committed keys")
    }
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

/// [`fresh_calls`] of the eventual-commit tool.
async fn fresh_eventual_calls(ctx: &Ctx, keys: std::ops::Range<u64>) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(keys.clone().count());
    for n in keys {
        let t = Instant::now();
        charge_noop_eventual(ctx, n).await.expect("fresh call");
        samples.push(t.elapsed());
    }
    samples
}

/// `n` fresh calls one after the other; calls per second, wall clock.
async fn sequential(ctx: &Ctx, keys: std::ops::Range<u64>) -> f64 {
    let n = keys.end - keys.start;
    let started = Instant::now();
    for k in keys {
        charge_noop(ctx, k).await.expect("sequential call");
    }
    n as f64 / started.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
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

/// Replays of `n` keys drawn uniformly (splitmix64) from every operation
/// committed so far.
async fn replays(ctx: &Ctx, committed: &Committed, n: usize, seed: u64) -> Summary {
    let population = committed.len();
    let mut state = seed;
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        let key = committed.nth((z ^ (z >> 31)) % population);
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

    let mut floor = Floor::new(tmp.path());
    let mut in_place = Floor::in_place(tmp.path());
    let clock = ManualClock::new(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
    );
    let open = || {
        Runtime::builder()
            .path(&journal_dir)
            .clock(Arc::new(clock.clone()))
            .open()
            .expect("journal")
    };
    let mut rt = open();
    let mut ctx = rt.run("bench");
    let mut committed = Committed::default();

    tokio.block_on(async {
        // Warm up: the log segment, sled's first pages.
        fresh_calls(&ctx, 10_000_000..10_000_200).await;
        committed.add(10_000_000..10_000_200);

        // The floor and fresh calls in alternating blocks: 20 x (100
        // fdatasyncs, 150 calls, 150 calls of the eventual-commit tool).
        let seq = 3000;
        let mut fresh_samples = Vec::with_capacity(seq as usize);
        let mut eventual_samples = Vec::with_capacity(seq as usize);
        for b in 0..20u64 {
            floor.block(100);
            in_place.block(50);
            let keys = b * 150..(b + 1) * 150;
            fresh_samples.extend(fresh_calls(&ctx, keys.clone()).await);
            committed.add(keys);
            let keys = 20_000_000 + b * 150..20_000_000 + (b + 1) * 150;
            eventual_samples.extend(fresh_eventual_calls(&ctx, keys).await);
        }
        let floor_summary = summarize(std::mem::take(&mut floor.samples));
        line("fdatasync, 128-byte append (the floor)", &floor_summary);
        let in_place_summary = summarize(std::mem::take(&mut in_place.samples));
        line("fdatasync, 128-byte write in place", &in_place_summary);
        let fresh = summarize(fresh_samples);
        line("fresh provider call (INTENT + COMMIT)", &fresh);
        let eventual = summarize(eventual_samples);
        line("fresh call, commit = \"eventual\"", &eventual);
        let replay = replays(&ctx, &committed, 20_000, 1).await;
        line(
            &format!("replay of a committed result (of {})", committed.len()),
            &replay,
        );

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

        // 64 concurrent tasks against one sequential caller, alternating
        // blocks (each block: fresh keys of its own, wall-clock rate).
        let tasks = 64;
        let per_task = 40;
        let seq_block = 300u64;
        let (mut conc_rates, mut seq_rates) = (Vec::new(), Vec::new());
        for b in 0..5u64 {
            let base = 1_000_000_000 + b * 10_000;
            seq_rates.push(sequential(&ctx, base..base + seq_block).await);
            committed.add(base..base + seq_block);
            let base = 1_500_000_000 + b * tasks * per_task;
            conc_rates.push(concurrent(&ctx, tasks, per_task, base).await);
            committed.add(base..base + tasks * per_task);
        }
        let (conc, seq_rate) = (median(conc_rates.clone()), median(seq_rates.clone()));
        let rates = |v: &[f64]| {
            v.iter()
                .map(|r| format!("{r:.0}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        println!(
            "{:<44} {conc:>9.0} calls/s median (blocks: {})",
            format!("{tasks} concurrent tasks, fresh calls"),
            rates(&conc_rates)
        );
        println!(
            "{:<44} {seq_rate:>9.0} calls/s median (blocks: {})",
            "one task, fresh calls (the baseline)",
            rates(&seq_rates)
        );

        println!();
        println!("ratios (targets in brackets)");
        let two = 2.0 * us(floor_summary.p50);
        println!(
            "  fresh p50 / (2 x fdatasync p50)          {:>6.2}   [<= 1.3]   ({:.1} us / {:.1} us)",
            us(fresh.p50) / two,
            us(fresh.p50),
            two
        );
        println!(
            "  fresh eventual p50 / fdatasync p50       {:>6.2}   [<= 1.2]   ({:.1} us / {:.1} us)",
            us(eventual.p50) / us(floor_summary.p50),
            us(eventual.p50),
            us(floor_summary.p50)
        );
        // The log's own fsyncs are of writes in place: against those, what
        // idem adds to one (and to two) is plain.
        println!(
            "  fresh eventual p50 / in-place fdatasync  {:>6.2}   []         ({:.1} us / {:.1} us)",
            us(eventual.p50) / us(in_place_summary.p50),
            us(eventual.p50),
            us(in_place_summary.p50)
        );
        println!(
            "  fresh p50 / (2 x in-place fdatasync)     {:>6.2}   []         ({:.1} us / {:.1} us)",
            us(fresh.p50) / (2.0 * us(in_place_summary.p50)),
            us(fresh.p50),
            2.0 * us(in_place_summary.p50)
        );
        println!(
            "  replay p50                               {:>6.2} us [<= 2 us]",
            us(replay.p50)
        );
        println!(
            "  read_only overhead p50                   {:>6.3} us [<= 0.15 us]",
            us(summarize(overhead).p50)
        );
        println!(
            "  concurrent / sequential throughput       {:>6.1}   [>= 20]   ({conc:.0} / {seq_rate:.0} calls/s)",
            conc / seq_rate
        );

        println!();
        println!("scale: lookup and replay as the journal grows to {records} operations");
        println!(
            "{:>10} {:>14} {:>14} {:>14} {:>12} {:>12} {:>10}",
            "operations",
            "replay p50 us",
            "replay p99 us",
            "fresh p50 us",
            "RSS MiB",
            "disk MiB",
            "reopen s"
        );
        let mut have = committed.len();
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
                committed.add(populate_base + filled..populate_base + filled + 64 * per);
                filled += 64 * per;
            }
            let r = replays(&ctx, &committed, 5000, have).await;
            let keys = 3_000_000_000 + have..3_000_000_000 + have + 300;
            let f = summarize(fresh_calls(&ctx, keys.clone()).await);
            committed.add(keys);
            have = committed.len();
            let (rss, _) = rss_kib();
            let disk = rt.size_on_disk().await.unwrap_or(0);
            // Close and open again: what a restart costs at this size,
            // including the open's check of sled's whole content against
            // the recorded digest (a full scan) and its checkpoint.
            drop(ctx);
            drop(rt);
            let t = Instant::now();
            rt = open();
            let reopen = t.elapsed();
            ctx = rt.run("bench");
            println!(
                "{have:>10} {:>14.1} {:>14.1} {:>14.1} {:>12.1} {:>12.1} {:>10.2}",
                us(r.p50),
                us(r.p99),
                us(f.p50),
                rss as f64 / 1024.0,
                disk as f64 / (1 << 20) as f64,
                reopen.as_secs_f64()
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
        drop(ctx);
        drop(rt);
    });
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
///   record, one for its dedupe-hit event, committed asynchronously), and
///   cached (the engine's memory of committed results: no round trip);
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
            // Replays measured against the database, not the in-memory
            // cache of recent results (the sled benchmark shows that).
            .replay_cache(0)
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
        let mut committed = Committed::default();
        committed.add(0..seq);
        let replay = replays(&ctx, &committed, 5000, 1).await;
        line("replay of a committed result (uncached)", &replay);
        // The same replays through a runtime with the default cache of
        // committed results, warmed by one replay of each: what a worker
        // pays for a retry of a call it has seen settle.
        let cached_rt = Runtime::builder()
            .postgres(url.as_str())
            .worker_id("bench-cached")
            .connect()
            .await
            .expect("connect the journal");
        let cached_ctx = cached_rt.run("bench");
        for key in 0..seq {
            charge_noop(&cached_ctx, key).await.expect("warm-up replay");
        }
        let cached = replays(&cached_ctx, &committed, 5000, 2).await;
        line("replay of a committed result (cached)", &cached);

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
        println!("ratios (targets in brackets)");
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
            "  replay p50, cached                       {:>6.1} us [no round trip]   (uncached: {:.1} us)",
            us(cached.p50),
            us(replay.p50)
        );
        drop(ctx);
        drop(rt);
    });
}
