//! Bytes on disk per operation of agent-effects 0.2 with its SQLite store
//! (agent-effects-sqlite), at N operations: the figure to set beside the
//! "bytes on disk per operation" of idem's own `benches/scale.rs` at the
//! same N.
//!
//! The workload is the one idem's bench writes: N fresh calls from T
//! concurrent tokio tasks (64 by default, on a 2-thread runtime), each with
//! a fresh key (`n`) and a short string result (`ch_0000000042`). Here a
//! call is one agent-effects effect, `EffectKind::IrreversibleWrite` with
//! `remote_idempotency(true)` (the promise of idem's `provider` class, as
//! in `../side_by_side`), its input `n`, its action returning
//! `format!("ch_{n:010}")`.
//!
//! The store is opened with `SqliteStore::open`, the crate's durable
//! defaults (WAL, `synchronous = FULL`, a pool of 8 connections), in a fresh
//! directory. After the calls the bench prints the directory's files, then
//! runs `PRAGMA wal_checkpoint(TRUNCATE)` and prints them again (a WAL file
//! still holding pages that are also in the main file would count them
//! twice), reads where the bytes went (row counts, SQLite's `dbstat` per
//! table and index, one operation's rows in full), closes the pool (SQLite
//! checkpoints and deletes the WAL on the last close) and prints the files
//! a third time. Bytes per operation are the directory's total / N,
//! apparent (file lengths, what idem's bench reports) and allocated (disk
//! blocks).
//!
//! Run: `cargo run --release --locked -- --ops 1000000` (or `./run --ops
//! 1000000`). Options: `--ops N` (20000), `--tasks T` (64), `--dir PATH`
//! (where to make the fresh directory; default `$IDEM_BENCH_DIR`, as idem's
//! bench, or else this bench's `target/`), `--keep` (leave the database
//! behind). Nothing here asserts: the figures are for people to read.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use agent_effects::{EffectFailure, EffectKind, EffectOutcome, Runtime};
use agent_effects_sqlite::SqliteStore;
use sqlx::{AssertSqlSafe, Row, SqlitePool};

/// The effect's name; idem's bench calls its tool `charge`.
const NAME: &str = "bench.charge";

struct Options {
    ops: u64,
    tasks: u64,
    dir: Option<PathBuf>,
    keep: bool,
}

fn options() -> Options {
    let mut o = Options {
        ops: 20_000,
        tasks: 64,
        dir: None,
        keep: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .unwrap_or_else(|| panic!("{name} takes a value"))
        };
        let mut num = |name: &str| -> u64 {
            value(name)
                .replace('_', "")
                .parse()
                .unwrap_or_else(|_| panic!("{name} takes a number"))
        };
        match a.as_str() {
            "--ops" => o.ops = num("--ops").max(1),
            "--tasks" => o.tasks = num("--tasks").max(1),
            "--dir" => o.dir = Some(PathBuf::from(value("--dir"))),
            "--keep" => o.keep = true,
            other => panic!("unknown argument {other:?} (--ops N, --tasks T, --dir PATH, --keep)"),
        }
    }
    o
}

/// The versions `Cargo.lock` pinned, read from it at build time.
fn locked_version(name: &str) -> &'static str {
    let lock = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock"));
    let needle = format!("name = \"{name}\"\nversion = \"");
    lock.find(&needle)
        .map(|at| {
            let rest = &lock[at + needle.len()..];
            &rest[..rest.find('"').unwrap_or(0)]
        })
        .unwrap_or("?")
}

// ---------------------------------------------------------------- the disk

/// Every file of `dir` (not recursive: SQLite keeps `db`, `db-wal` and
/// `db-shm` side by side) with its apparent and allocated bytes.
fn files(dir: &Path) -> Vec<(String, u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .expect("read the directory")
        .flatten()
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            Some((
                e.file_name().to_string_lossy().into_owned(),
                meta.len(),
                meta.blocks() * 512,
            ))
        })
        .collect();
    out.sort();
    out
}

fn print_files(when: &str, dir: &Path, n: u64) -> u64 {
    let f = files(dir);
    println!("files {when}:");
    for (name, apparent, allocated) in &f {
        println!("  {name:<16} {apparent:>14} B apparent {allocated:>14} B allocated");
    }
    let apparent: u64 = f.iter().map(|e| e.1).sum();
    let allocated: u64 = f.iter().map(|e| e.2).sum();
    println!(
        "  total            {apparent:>14} B apparent {allocated:>14} B allocated \
         ({:.1} MiB apparent)",
        apparent as f64 / (1u64 << 20) as f64
    );
    println!(
        "  bytes per operation: {:.1} B/op apparent, {:.1} B/op allocated (N = {n})",
        apparent as f64 / n as f64,
        allocated as f64 / n as f64
    );
    apparent
}

// ---------------------------------------------------------------- the database

async fn pragma(pool: &SqlitePool, sql: &'static str) -> String {
    let row = sqlx::query(sql).fetch_one(pool).await.expect(sql);
    row.try_get::<String, _>(0)
        .or_else(|_| row.try_get::<i64, _>(0).map(|v| v.to_string()))
        .unwrap_or_else(|e| format!("? ({e})"))
}

/// Settings of one of the store's connections, as SQLite reports them.
async fn print_settings(pool: &SqlitePool) {
    let synchronous = pragma(pool, "PRAGMA synchronous").await;
    let synchronous = match synchronous.as_str() {
        "0" => "0 (OFF)",
        "1" => "1 (NORMAL)",
        "2" => "2 (FULL)",
        "3" => "3 (EXTRA)",
        other => other,
    }
    .to_string();
    println!(
        "SQLite {} (bundled by libsqlite3-sys {}): journal_mode = {}, synchronous = {synchronous}, \
         page_size = {}, wal_autocheckpoint = {} pages, busy_timeout = {} ms, \
         pool of {} connections",
        pragma(pool, "SELECT sqlite_version()").await,
        locked_version("libsqlite3-sys"),
        pragma(pool, "PRAGMA journal_mode").await,
        pragma(pool, "PRAGMA page_size").await,
        pragma(pool, "PRAGMA wal_autocheckpoint").await,
        pragma(pool, "PRAGMA busy_timeout").await,
        pool.options().get_max_connections(),
    );
}

/// Row counts, where the pages go (SQLite's `dbstat`), and the rows of one
/// operation in full.
async fn print_contents(pool: &SqlitePool, n: u64) {
    let tables: Vec<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")
            .fetch_all(pool)
            .await
            .expect("list the tables");
    println!("rows:");
    for t in &tables {
        let count: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM \"{t}\"")))
            .fetch_one(pool)
            .await
            .expect("count rows");
        println!(
            "  {t:<20} {count:>10} rows ({:.3} per operation)",
            count as f64 / n as f64
        );
    }

    let freelist = pragma(pool, "PRAGMA freelist_count").await;
    let pages = pragma(pool, "PRAGMA page_count").await;
    println!("pages of the main file: {pages} in all, {freelist} on the free list");
    match sqlx::query(
        "SELECT name, count(*), sum(pgsize), sum(payload), sum(unused) \
         FROM dbstat GROUP BY name ORDER BY sum(pgsize) DESC",
    )
    .fetch_all(pool)
    .await
    {
        Err(e) => println!("dbstat unavailable: {e}"),
        Ok(rows) => {
            println!(
                "where the main file's bytes go (dbstat; payload = the stored records' bytes, \
                 unused = free space inside pages):"
            );
            println!(
                "  {:<36} {:>9} {:>14} {:>9} {:>14} {:>14}",
                "table or index", "pages", "bytes", "B/op", "payload", "unused"
            );
            for r in rows {
                let name: String = r.get(0);
                let (pages, bytes, payload, unused): (i64, i64, i64, i64) =
                    (r.get(1), r.get(2), r.get(3), r.get(4));
                println!(
                    "  {name:<36} {pages:>9} {bytes:>14} {:>9.1} {payload:>14} {unused:>14}",
                    bytes as f64 / n as f64
                );
            }
        }
    }

    // The first operation's rows, every column as SQL would quote it.
    for (table, filter) in [
        ("effects", "effect_name = ? AND logical_key = ?"),
        (
            "effect_events",
            "effect_id = (SELECT id FROM effects WHERE effect_name = ? AND logical_key = ?) \
             ORDER BY sequence",
        ),
    ] {
        let columns: Vec<String> =
            sqlx::query_scalar("SELECT name FROM pragma_table_info(?) ORDER BY cid")
                .bind(table)
                .fetch_all(pool)
                .await
                .expect("columns");
        let select = columns
            .iter()
            .map(|c| format!("quote(\"{c}\")"))
            .collect::<Vec<_>>()
            .join(", ");
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {select} FROM {table} WHERE {filter}"
        )))
        .bind(NAME)
        .bind("0")
        .fetch_all(pool)
        .await
        .expect("one operation's rows");
        for (i, r) in rows.iter().enumerate() {
            println!("{table} row {} of key 0:", i + 1);
            for (c, name) in columns.iter().enumerate() {
                println!("  {name:<22} {}", r.get::<String, _>(c));
            }
        }
    }
}

// ---------------------------------------------------------------- main

fn main() {
    let o = options();
    let n = o.ops;
    let parent = o
        .dir
        .clone()
        .or_else(|| std::env::var_os("IDEM_BENCH_DIR").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    let stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = parent.join(format!("ae-sqlite-{}-{stamp}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("make the bench directory");
    let db = dir.join("effects.db");

    println!("agent-effects with its SQLite store: bytes on disk per operation");
    println!(
        "versions: agent-effects {}, agent-effects-sqlite {}, agent-effects-store {}, sqlx {}, tokio {}",
        locked_version("agent-effects"),
        locked_version("agent-effects-sqlite"),
        locked_version("agent-effects-store"),
        locked_version("sqlx"),
        locked_version("tokio"),
    );
    println!(
        "machine: {} cores; database {}; {n} operations from {} tasks",
        std::thread::available_parallelism().map_or(0, |c| c.get()),
        db.display(),
        o.tasks
    );

    // As idem's bench: two worker threads. (sqlx runs each SQLite
    // connection on a thread of its own besides.)
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio");
    tokio.block_on(async {
        let store = SqliteStore::open(&db).await.expect("open the SQLite store");
        let pool = store.pool().clone();
        print_settings(&pool).await;
        let rt = Runtime::new(store);
        print_files("after opening (migrations applied)", &dir, n);

        let next = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let handles: Vec<_> = (0..o.tasks)
            .map(|_| {
                let (rt, next, failed) = (rt.clone(), next.clone(), failed.clone());
                tokio::spawn(async move {
                    let mut latencies = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            return latencies;
                        }
                        let t = Instant::now();
                        let out = rt
                            .effect(NAME, i)
                            .kind(EffectKind::IrreversibleWrite)
                            .remote_idempotency(true)
                            .input(&i)
                            .run(move |_ctx| async move {
                                Ok::<String, EffectFailure>(format!("ch_{i:010}"))
                            })
                            .await;
                        latencies.push(t.elapsed());
                        match out {
                            Ok(EffectOutcome::Committed(v)) if v == format!("ch_{i:010}") => {}
                            other => {
                                if failed.fetch_add(1, Ordering::Relaxed) < 5 {
                                    eprintln!("operation {i}: {other:?}");
                                }
                            }
                        }
                    }
                })
            })
            .collect();
        let mut latencies: Vec<Duration> = Vec::with_capacity(n as usize);
        for h in handles {
            latencies.extend(h.await.expect("a task"));
        }
        let elapsed = started.elapsed();
        latencies.sort_unstable();
        let at = |q: f64| {
            latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)]
                .as_secs_f64()
                * 1e3
        };
        println!();
        println!(
            "wrote {n} operations in {:.2} s: {:.0} ops/s; latency p50 {:.2} ms, p99 {:.2} ms; \
             {} not committed",
            elapsed.as_secs_f64(),
            n as f64 / elapsed.as_secs_f64(),
            at(0.50),
            at(0.99),
            failed.load(Ordering::Relaxed)
        );
        println!();
        print_files("after writing (store open, before the checkpoint)", &dir, n);

        let row = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .fetch_one(&pool)
            .await
            .expect("checkpoint");
        let (busy, log, done): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
        println!();
        // After TRUNCATE the counts describe the emptied WAL (0 and 0).
        println!(
            "PRAGMA wal_checkpoint(TRUNCATE): busy = {busy}, WAL frames = {log}, \
             checkpointed = {done} (busy = 0: complete)"
        );
        print_files("after the checkpoint (store open)", &dir, n);
        println!();
        print_contents(&pool, n).await;

        // agent-effects-sqlite has no close of its own; closing its pool
        // closes every connection (the last one checkpoints and removes the
        // WAL and shared-memory files).
        drop(rt);
        pool.close().await;
    });
    drop(tokio);
    println!();
    let total = print_files("after closing the store", &dir, n);
    println!();
    println!(
        "result: {:.1} bytes on disk per operation at N = {n} ({total} B / {n})",
        total as f64 / n as f64
    );

    if o.keep {
        println!("kept {}", dir.display());
    } else {
        std::fs::remove_dir_all(&dir).expect("remove the bench directory");
    }
}
