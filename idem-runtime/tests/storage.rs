//! The storage findings of the hardening review, against real processes
//! and real files: log damage is not a torn tail, damage in sled's files is
//! never absence, events that record no decision become durable on their
//! own, and closing never hangs (a tokio runtime shut down mid-call, a full
//! disk).
//!
//! The test binary plays every role: with `IDEM_STORAGE_ROLE` set it is a
//! worker process that the parent kills with SIGKILL.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use idem_runtime::journal::Space;
use idem_runtime::{Class, Error, EventKind, Runtime, SledOptions};

const WORKER: &str = "storage_worker_entry";
const OPS: u64 = 20;

fn tokio() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The entry point of every child process of this file.
#[test]
fn storage_worker_entry() {
    let Ok(role) = std::env::var("IDEM_STORAGE_ROLE") else {
        return;
    };
    let journal = PathBuf::from(std::env::var("IDEM_STORAGE_JOURNAL").unwrap());
    tokio().block_on(async move {
        let rt = Runtime::open(&journal).unwrap();
        let ctx = rt.run("run");
        let t = tool("send", Class::Journal);
        let p = Provider::new(&[]);
        match role.as_str() {
            // Commits OPS operations, then waits to be killed: the
            // write-ahead log is their only copy (sled receives changes at
            // checkpoints only).
            "commit" => {
                for order in 0..OPS {
                    call(&ctx, t, &p, order, "a", VerifyMode::Provider)
                        .await
                        .unwrap();
                }
                println!("DONE");
            }
            // Replays one operation many times, then watches the durable
            // audit stream (which holds only durable events) until the
            // dedupe hits are in it, without making any other write.
            "replay" => {
                call(&ctx, t, &p, 0, "a", VerifyMode::Provider)
                    .await
                    .unwrap();
                for _ in 0..50 {
                    call(&ctx, t, &p, 0, "a", VerifyMode::Provider)
                        .await
                        .unwrap();
                }
                let started = std::time::Instant::now();
                loop {
                    let hits = rt
                        .audit_page(0, 10_000)
                        .await
                        .unwrap()
                        .iter()
                        .filter(|e| e.kind == EventKind::DedupeHit)
                        .count();
                    if hits == 50 {
                        println!("DURABLE after {} ms", started.elapsed().as_millis());
                        break;
                    }
                    if started.elapsed() > Duration::from_secs(10) {
                        println!("NEVER DURABLE ({hits} of 50)");
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            other => panic!("role {other}"),
        }
        use std::io::Write;
        std::io::stdout().flush().unwrap();
        std::future::pending::<()>().await;
    });
}

/// Runs a worker in `role` until it prints a line starting with `until`,
/// then kills it with SIGKILL; returns that line.
fn run_then_kill(role: &str, journal: &Path, until: &str) -> String {
    let mut child: Child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", WORKER, "--nocapture", "--test-threads", "1"])
        .env("IDEM_STORAGE_ROLE", role)
        .env("IDEM_STORAGE_JOURNAL", journal)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The child's test harness prints on the same line before our words.
    let line = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .find_map(|l| {
            [until, "NEVER"]
                .iter()
                .find_map(|w| l.find(w).map(|at| l[at..].to_string()))
        })
        .unwrap_or_default();
    child.kill().unwrap(); // SIGKILL
    assert!(!child.wait().unwrap().success(), "the worker was killed");
    line
}

fn segments(journal: &Path) -> Vec<PathBuf> {
    let mut s: Vec<PathBuf> = std::fs::read_dir(journal)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("idem-wal.")
        })
        .collect();
    s.sort();
    s
}

/// Every file of a directory with its bytes.
fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                out.push((e.path(), std::fs::read(e.path()).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// Calls every committed operation again: each must replay (the provider
/// is not called) — or fail as corrupt; never run as if absent.
async fn every_op_replays(rt: &Runtime, ops: u64) -> Result<(), String> {
    let p = Provider::new(&[]);
    let t = tool("send", Class::Journal);
    for order in 0..ops {
        match call(&rt.run("run"), t, &p, order, "a", VerifyMode::Provider).await {
            Ok(v) if v == "done:a" => {}
            Err(idem_runtime::ToolError::Journal(Error::Corrupt { .. })) => {}
            other => return Err(format!("order {order}: {other:?}")),
        }
        if p.calls() > 0 {
            return Err(format!("order {order} was run again: it read as absent"));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// 1. Log damage before the tail.

#[test]
fn log_damage_before_the_tail_refuses_to_open_names_the_file_and_deletes_nothing() {
    let dir = tempfile::TempDir::new().unwrap();
    let journal = dir.path().join("journal");
    assert_eq!(run_then_kill("commit", &journal, "DONE"), "DONE");
    let segs = segments(&journal);
    assert_eq!(segs.len(), 1, "{segs:?}");
    let seg = &segs[0];
    let pristine = std::fs::read(seg).unwrap();
    assert!(pristine.len() > 20 * 100, "{} bytes", pristine.len());

    // A flipped byte inside the first unit (offset 20, after the header):
    // valid units follow it, so it is not a torn tail.
    let mut damaged = pristine.clone();
    damaged[20 + 12] ^= 0x04;
    std::fs::write(seg, &damaged).unwrap();
    let before = files(&journal);
    let err = Runtime::open(&journal).unwrap_err();
    let Error::Damaged { file, offset, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(file, seg);
    assert_eq!(*offset, Some(20));
    assert!(err.to_string().contains("nothing was deleted"), "{err}");
    assert_eq!(files(&journal), before, "the failed open changed nothing");

    // Repaired (say, from a backup), the journal opens with every operation.
    std::fs::write(seg, &pristine).unwrap();
    let rt = Runtime::open(&journal).unwrap();
    tokio().block_on(every_op_replays(&rt, OPS)).unwrap();
}

// ---------------------------------------------------------------------------
// 2. Damage in sled's own files.

#[test]
fn damage_in_sleds_data_file_is_repaired_from_the_kept_log_or_refused_without_it() {
    let dir = tempfile::TempDir::new().unwrap();
    let pristine = dir.path().join("pristine");
    tokio().block_on(async {
        let rt = Runtime::open(&pristine).unwrap();
        let p = Provider::new(&[]);
        for order in 0..OPS {
            call(
                &rt.run("run"),
                tool("send", Class::Journal),
                &p,
                order,
                "a",
                VerifyMode::Provider,
            )
            .await
            .unwrap();
        }
        // sled holds what can still change: escalated operations (settled
        // ones live in tables).
        let lost = Provider::new(&[Step::LandThenTimeout; OPS as usize]);
        for order in 0..OPS {
            let out = call(
                &rt.run("run"),
                tool("wire", Class::AtMostOnce),
                &lost,
                order,
                "a",
                VerifyMode::None,
            )
            .await;
            assert!(
                matches!(out, Err(idem_runtime::ToolError::Escalated { .. })),
                "{out:?}"
            );
        }
    });
    // Reopening checkpoints the log. Its segments stay: with sled's image
    // (none yet, in a journal this small) they are the second copy a
    // damaged sled is rebuilt from.
    drop(Runtime::open(&pristine).unwrap());
    let segs = segments(&pristine);
    assert!(
        std::fs::metadata(&segs[0]).unwrap().len() > 20 * 100,
        "{segs:?}"
    );
    let db = std::fs::read(pristine.join("db")).unwrap();
    let trials = 64;
    let (mut refused, mut intact, mut repaired) = (0, 0, 0);
    for whole_copy in [true, false] {
        for i in 0..trials {
            let copy = dir.path().join(format!("copy{whole_copy}{i}"));
            copy_dir(&pristine, &copy);
            if !whole_copy {
                std::fs::remove_file(copy.join(segs[0].file_name().unwrap())).unwrap();
            }
            let offset = (i * 7919 + 13) % db.len();
            let mut bytes = db.clone();
            bytes[offset] ^= 0xff;
            std::fs::write(copy.join("db"), &bytes).unwrap();
            let opened_rt = std::panic::catch_unwind(|| Runtime::open(&copy));
            let rt = match opened_rt {
                Err(_) => panic!("offset {offset}: opening panicked"),
                Ok(Err(e)) => {
                    assert!(!whole_copy, "offset {offset}: not repaired: {e}");
                    assert!(
                        matches!(
                            e,
                            Error::Damaged { .. }
                                | Error::NotAJournal { .. }
                                | Error::Storage { .. }
                        ),
                        "offset {offset}: {e}"
                    );
                    refused += 1;
                    continue;
                }
                Ok(Ok(rt)) => rt,
            };
            let set_aside = std::fs::read_dir(&copy)
                .unwrap()
                .flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("sled-damaged."));
            if set_aside {
                repaired += 1;
            } else {
                intact += 1;
            }
            tokio()
                .block_on(every_op_replays(&rt, OPS))
                .unwrap_or_else(|e| panic!("offset {offset}: {e}"));
            let escalated = tokio().block_on(rt.escalations()).unwrap();
            assert_eq!(escalated.len() as u64, OPS, "offset {offset}");
        }
    }
    println!(
        "{trials} flipped bytes in sled's data file, twice: {repaired} repaired, {intact} opened \
         intact, {refused} refused (only without the log's first segment)"
    );
    assert_eq!(refused + intact + repaired, 2 * trials);
    assert!(repaired > 0, "no flip needed a repair");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

// ---------------------------------------------------------------------------
// 6. Events that record no decision become durable on their own.

#[test]
fn replay_only_events_become_durable_within_the_bound_and_survive_sigkill() {
    let dir = tempfile::TempDir::new().unwrap();
    let journal = dir.path().join("journal");
    let line = run_then_kill("replay", &journal, "DURABLE");
    assert!(line.starts_with("DURABLE"), "{line}");
    let rt = Runtime::open(&journal).unwrap();
    let events = tokio().block_on(rt.audit(0)).unwrap();
    let hits = events
        .iter()
        .filter(|e| e.kind == EventKind::DedupeHit)
        .count();
    assert_eq!(hits, 50, "every dedupe hit survived the kill");
    // And the stream says nothing the state does not: its one commit is a
    // committed record.
    let op = tokio()
        .block_on(rt.operation(&key(&rt.run("run"), tool("send", Class::Journal), 0)))
        .unwrap()
        .unwrap();
    assert_eq!(op.state, "committed");
    // Sequence numbers go on after the kill: none is handed out again
    // (sled's generate_id, which audit appends once used, was reused).
    let after = tokio().block_on(async {
        let p = Provider::new(&[]);
        let t = tool("send", Class::Journal);
        call(&rt.run("run"), t, &p, 1, "b", VerifyMode::Provider)
            .await
            .unwrap();
        rt.audit(0).await.unwrap()
    });
    let seqs = |v: &[idem_runtime::AuditEvent]| v.iter().map(|e| e.seq).collect::<Vec<_>>();
    assert_eq!(seqs(&after[..events.len()]), seqs(&events));
    assert!(
        after.len() > events.len(),
        "the new call's events are there"
    );
    assert!(
        after.windows(2).all(|w| w[0].seq < w[1].seq),
        "sequence numbers repeat after the kill: {:?}",
        seqs(&after)
    );
}

// ---------------------------------------------------------------------------
// 5. Closing never hangs.

/// Runs `f` on its own thread; fails the test if it does not return in
/// `limit` (rather than hanging the suite).
fn returns_within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("did not return within {limit:?}: the journal wedged")
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the closure panicked (see above)"),
    }
}

#[test]
fn a_tokio_runtime_shut_down_mid_call_leaves_a_journal_that_closes_and_reopens() {
    let dir = tempfile::TempDir::new().unwrap();
    let journal = dir.path().join("journal");
    for round in 0..30u64 {
        let path = journal.clone();
        returns_within(Duration::from_secs(20), move || {
            let tokio = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            let rt = Runtime::open(&path).unwrap();
            for i in 0..4 {
                let ctx = rt.run("run");
                tokio.spawn(async move {
                    let p = Provider::new(&[]);
                    let _ = call(
                        &ctx,
                        tool("send", Class::Journal),
                        &p,
                        round * 10 + i,
                        "a",
                        VerifyMode::Provider,
                    )
                    .await;
                });
            }
            // Shut down while the calls wait for their barriers: their
            // futures are dropped, and flush tasks not yet started on the
            // blocking pool are cancelled. (The wait lets the runtime's
            // threads drop what they hold, the calls' contexts included,
            // before the next round opens the journal again.)
            tokio.shutdown_timeout(Duration::from_secs(5));
            drop(rt);
        });
    }
    let rt = Runtime::open(&journal).unwrap();
    tokio().block_on(async {
        let p = Provider::new(&[]);
        call(
            &rt.run("run"),
            tool("send", Class::Journal),
            &p,
            9999,
            "a",
            VerifyMode::Provider,
        )
        .await
        .unwrap();
    });
}

#[test]
fn a_full_disk_fails_calls_closed_closing_returns_and_the_journal_reopens() {
    let dir = tempfile::TempDir::new().unwrap();
    let mount = dir.path().join("small");
    std::fs::create_dir_all(&mount).unwrap();
    let status = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=6m", "tmpfs"])
        .arg(&mount)
        .status()
        .expect("mount(8) is needed to build a small disk");
    assert!(
        status.success(),
        "mounting a 6 MiB tmpfs failed: this test needs root (CI runs as root)"
    );
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(mount.clone());
    let journal = mount.join("journal");
    let filler = mount.join("filler");
    let options = SledOptions {
        checkpoint_bytes: 256 << 10,
        ..SledOptions::default()
    };

    let (committed, failed) = {
        let (journal, filler, options) = (journal.clone(), filler.clone(), options.clone());
        returns_within(Duration::from_secs(60), move || {
            let rt = Runtime::builder()
                .path(&journal)
                .sled_options(options)
                .open()
                .unwrap();
            // Leave the journal a few hundred KiB.
            let free = free_bytes(journal.parent().unwrap());
            std::fs::write(&filler, vec![0u8; free.saturating_sub(400 << 10) as usize]).unwrap();
            let p = Provider::new(&[]);
            let t = tool("send", Class::Journal);
            let mut committed = Vec::new();
            let mut failed = None;
            tokio().block_on(async {
                for order in 0..100_000u64 {
                    let body = "x".repeat(2000);
                    match call(&rt.run("run"), t, &p, order, &body, VerifyMode::Provider).await {
                        Ok(_) => committed.push(order),
                        Err(e) => {
                            failed = Some((order, format!("{e}")));
                            break;
                        }
                    }
                }
                // The disk is still full and the journal takes no write:
                // what it acknowledged is still answered (from the replay
                // cache or a read; the replay's audit event, which records
                // no decision, is what cannot be written), and the
                // provider is not called.
                let before = p.calls();
                for &o in &committed {
                    let body = "x".repeat(2000);
                    call(&rt.run("run"), t, &p, o, &body, VerifyMode::Provider)
                        .await
                        .unwrap_or_else(|e| {
                            panic!("order {o} did not replay on the full disk: {e}")
                        });
                }
                assert_eq!(
                    p.calls(),
                    before,
                    "a replay on the full disk called the provider"
                );
            });
            // Dropping the runtime after the disk filled must return.
            drop(rt);
            (committed, failed)
        })
    };
    let (order, why) = failed.expect("the disk never filled");
    assert!(
        why.contains("No space left") || why.contains("journal"),
        "{why}"
    );
    assert!(!committed.is_empty());
    // Room again: the journal reopens and replays what was committed.
    std::fs::remove_file(&filler).unwrap();
    let rt = Runtime::builder()
        .path(&journal)
        .sled_options(options)
        .open()
        .unwrap();
    tokio().block_on(async {
        let p = Provider::new(&[]);
        let t = tool("send", Class::Journal);
        for &o in &committed {
            let body = "x".repeat(2000);
            call(&rt.run("run"), t, &p, o, &body, VerifyMode::Provider)
                .await
                .unwrap();
        }
        assert_eq!(p.calls(), 0, "every committed call replays");
        // The call that failed on the full disk is settled now, one way or
        // the other, and never twice.
        let body = "x".repeat(2000);
        call(&rt.run("run"), t, &p, order, &body, VerifyMode::Provider)
            .await
            .unwrap();
        assert!(p.calls() <= 1);
    });
    let _ = Space::Ops;
}

fn free_bytes(path: &Path) -> u64 {
    let out = Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(0)
}
