//! The journal's failure paths: locking, foreign directories, corrupt
//! records, failing writes and syncs. Whatever goes wrong, the provider is
//! not called once the engine knows, and the error says what and where.

mod common;

use std::sync::Arc;

use common::*;
use idem_runtime::journal::{Journal, Space};
use idem_runtime::{Class, Error, EventKind, Runtime, SledJournal, ToolError};
use tempfile::TempDir;

async fn plant(j: &dyn Journal, digest: &[u8; 32], body: &[u8]) {
    idem_testkit::overwrite_record(j, Space::Ops, digest, body).await;
}

#[test]
fn second_open_is_journal_in_use_naming_the_path() {
    let dir = TempDir::new().unwrap();
    let _rt = open(dir.path());
    let err = Runtime::open(dir.path()).unwrap_err();
    assert!(matches!(err, Error::InUse { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("journal in use"), "{text}");
    assert!(text.contains(&dir.path().display().to_string()), "{text}");
}

#[test]
fn dropping_the_last_handle_releases_the_journal() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let ctx = rt.run("run");
    drop(rt);
    // A Ctx keeps the journal open...
    assert!(matches!(
        Runtime::open(dir.path()),
        Err(Error::InUse { .. })
    ));
    drop(ctx);
    // ...and the last handle releases it.
    Runtime::open(dir.path()).unwrap();
}

#[test]
fn a_directory_with_other_files_is_not_a_journal() {
    let dir = TempDir::new().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "precious").unwrap();
    let err = Runtime::open(dir.path()).unwrap_err();
    assert!(matches!(err, Error::NotAJournal { .. }), "{err}");
    assert!(err.to_string().contains("notes.txt"), "{err}");
    // Nothing was written next to the user's file.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["notes.txt"]);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes.txt")).unwrap(),
        "precious"
    );
}

#[test]
fn a_file_is_not_a_journal() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("journal");
    std::fs::write(&file, "x").unwrap();
    let err = Runtime::open(&file).unwrap_err();
    assert!(matches!(err, Error::NotAJournal { .. }), "{err}");
}

#[test]
fn a_new_path_is_created_and_reopens() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("nested").join("journal");
    drop(open(&path));
    drop(open(&path));
}

#[tokio::test(start_paused = true)]
async fn a_corrupt_record_is_an_error_not_absent() {
    for class in [Class::Provider, Class::Journal, Class::AtMostOnce] {
        let dir = TempDir::new().unwrap();
        let rt = open(dir.path());
        let ctx = rt.run("run");
        let t = tool("t", class);
        let k = key(&ctx, t, 1);
        for garbage in [
            &b""[..],
            b"O",
            b"O\x01\x00\x00\x00\x00junk",
            b"\xff\xff\xff\xff\xff\xff\xff",
        ] {
            plant(&**rt.journal(), k.digest(), garbage).await;
            let p = Provider::new(&[]);
            let err = call(&ctx, t, &p, 1, "a", VerifyMode::Provider)
                .await
                .unwrap_err();
            let ToolError::Journal(Error::Corrupt { key, location, .. }) = &err else {
                panic!("{class}: {err:?}")
            };
            assert_eq!(key, &hex(k.digest()));
            assert_eq!(location, &dir.path().display().to_string());
            assert_eq!(
                p.calls(),
                0,
                "{class}: provider not called on a corrupt record"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_record_from_a_newer_idem_is_refused() {
    let dir = TempDir::new().unwrap();
    let rt = open(dir.path());
    let ctx = rt.run("run");
    let t = tool("t", Class::Journal);
    let p = Provider::new(&[]);
    call(&ctx, t, &p, 1, "a", VerifyMode::Provider)
        .await
        .unwrap();
    let k = key(&ctx, t, 1);
    let mut bytes = rt
        .journal()
        .load(Space::Ops, k.digest())
        .await
        .unwrap()
        .unwrap()
        .body;
    bytes[1] = 200;
    plant(&**rt.journal(), k.digest(), &bytes).await;
    // A fresh process (this one remembers the result it committed).
    drop((ctx, rt));
    let rt = open(dir.path());
    let err = call(&rt.run("run"), t, &p, 1, "a", VerifyMode::Provider)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ToolError::Journal(Error::RecordVersion { found: 200, .. })
        ),
        "{err:?}"
    );
    assert_eq!(p.calls(), 1);
}

fn faulty_runtime(dir: &std::path::Path) -> (Runtime, Arc<FaultyJournal>) {
    let faulty = FaultyJournal::new(Arc::new(SledJournal::open(dir).unwrap()));
    (
        Runtime::builder().journal(faulty.clone()).open().unwrap(),
        faulty,
    )
}

/// Counts the writes and syncs of one clean call of `class`.
async fn clean_call_profile(class: Class) -> (usize, usize) {
    let dir = TempDir::new().unwrap();
    let (rt, faulty) = faulty_runtime(dir.path());
    let p = Provider::new(&[]);
    call1(&rt, tool("t", class), &p, VerifyMode::Provider)
        .await
        .unwrap();
    (faulty.writes(), faulty.syncs())
}

#[tokio::test(start_paused = true)]
async fn every_failed_write_before_the_intent_sync_means_no_call() {
    // Fail each write in turn. Writes up to the INTENT sync protect the
    // call: the provider must not be called. Later writes (the COMMIT) fail
    // after the effect: the error must be reported, and the next call must
    // verify or escalate, never silently run again.
    for class in [Class::Provider, Class::Journal, Class::AtMostOnce] {
        // A clean call is two writes, each with its barrier: the INTENT
        // (with its events) and the COMMIT (with its events).
        let (writes, syncs) = clean_call_profile(class).await;
        assert_eq!((writes, syncs), (2, 2), "{class}");
        for fail_at in 1..=writes {
            let dir = TempDir::new().unwrap();
            let (rt, faulty) = faulty_runtime(dir.path());
            faulty.fail_write(fail_at, StorageFault::Refused);
            let ctx = rt.run("run");
            let t = tool("t", class);
            let p = Provider::deduping(&[]);
            p.log_to(faulty.log());
            let err = call(&ctx, t, &p, 1, "a", VerifyMode::Provider)
                .await
                .unwrap_err();
            let ToolError::Journal(e @ Error::Storage { .. }) = &err else {
                panic!("{class} write {fail_at}: {err:?}")
            };
            assert_eq!(e.io_kind(), Some(std::io::ErrorKind::StorageFull), "{e}");
            let log = faulty.log().lock().unwrap().clone();
            let failed = log.iter().position(|l| l.starts_with("FAILED")).unwrap();
            let called = log.iter().position(|l| l.starts_with("provider call"));
            match called {
                None => assert_eq!(p.calls(), 0),
                Some(c) => assert!(
                    c < failed,
                    "{class} write {fail_at}: provider called after a failed write: {log:?}"
                ),
            }
            // The journal works again: what does the next call do?
            let landed = p.effects();
            let again = call(&ctx, t, &p, 1, "a", VerifyMode::Provider).await;
            match again {
                // Replayed (the COMMIT record made it), verified, re-sent
                // under the same key to a deduplicating provider, or run
                // because nothing had been sent.
                Ok(v) => {
                    assert_eq!(v, "done:a");
                    if landed == 1 && class != Class::Provider {
                        assert_eq!(
                            p.calls(),
                            1,
                            "{class} write {fail_at}: re-run after landing"
                        );
                    }
                }
                Err(ToolError::Escalated { .. }) => {
                    assert!(
                        class == Class::AtMostOnce && landed == 1,
                        "{class} write {fail_at}"
                    )
                }
                Err(e) => panic!("{class} write {fail_at}: {e:?}"),
            }
            assert_eq!(
                p.effects(),
                1,
                "{class} write {fail_at}: exactly one effect"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_retry_intent_that_happened_but_reported_failure_puts_the_record_back() {
    // The second attempt's INTENT replaces a Waiting record and fails after
    // the fact (EIO): the revert must put the Waiting record back, not
    // remove it and not leave the INTENT, or the next call of this
    // at_most_once tool finds an INTENT nobody drives and wakes an
    // operator for an attempt that never reached the provider.
    let dir = TempDir::new().unwrap();
    let (rt, faulty) = faulty_runtime(dir.path());
    // Writes: INTENT of attempt 1, Waiting after its refusal, INTENT of
    // attempt 2.
    faulty.fail_write(3, StorageFault::AppliedThenFailed);
    let ctx = rt.run("run");
    let t = tool("t", Class::AtMostOnce);
    let p = Provider::new(&[Step::Refuse]);
    let err = call(&ctx, t, &p, 1, "a", VerifyMode::None)
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::Journal(_)), "{err:?}");
    assert_eq!(p.effects(), 0);
    let op = rt.operation(&key(&ctx, t, 1)).await.unwrap().unwrap();
    assert_eq!((op.state.as_str(), op.attempts), ("waiting", 1), "{op:?}");
    assert_eq!(
        call(&ctx, t, &p, 1, "a", VerifyMode::None).await.unwrap(),
        "done:a"
    );
    assert_eq!(p.effects(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_intent_write_that_happened_but_reported_failure_is_undone() {
    // EIO after the change: the INTENT is in the journal although the write
    // said it failed. The provider is not called, and the INTENT is taken
    // back, so an at_most_once tool does not wake an operator for nothing.
    let dir = TempDir::new().unwrap();
    let (rt, faulty) = faulty_runtime(dir.path());
    faulty.fail_write(1, StorageFault::AppliedThenFailed);
    let ctx = rt.run("run");
    let t = tool("t", Class::AtMostOnce);
    let p = Provider::new(&[]);
    let err = call(&ctx, t, &p, 1, "a", VerifyMode::None)
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::Journal(_)), "{err:?}");
    assert_eq!(p.calls(), 0);
    assert_eq!(
        call(&ctx, t, &p, 1, "a", VerifyMode::None).await.unwrap(),
        "done:a"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_intent_sync_means_no_call_and_no_false_doubt() {
    for class in [Class::Provider, Class::Journal, Class::AtMostOnce] {
        let dir = TempDir::new().unwrap();
        let (rt, faulty) = faulty_runtime(dir.path());
        faulty.fail_sync(1, StorageFault::Refused);
        let ctx = rt.run("run");
        let t = tool("t", class);
        let p = Provider::new(&[]);
        let err = call(&ctx, t, &p, 1, "a", VerifyMode::Provider)
            .await
            .unwrap_err();
        assert!(
            matches!(err, ToolError::Journal(Error::Storage { op: "sync", .. })),
            "{err:?}"
        );
        assert_eq!(p.calls(), 0);
        // The undurable INTENT was taken back: the next call just runs, even
        // for at_most_once (nothing can have been sent).
        let out = call(&ctx, t, &p, 1, "a", VerifyMode::Provider).await;
        assert_eq!(out.unwrap(), "done:a", "{class}");
        assert_eq!(p.effects(), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn a_failed_commit_sync_is_reported_then_verified_or_escalated() {
    // The COMMIT's barrier fails after the effect landed, then the process
    // dies: the COMMIT was never durable, so the restarted process finds
    // the INTENT. What it does is the class's rule for an unknown outcome,
    // against a provider that deduplicates only where the class says it
    // does, so a blind re-run would show as a second effect.
    for class in [Class::Provider, Class::Journal, Class::AtMostOnce] {
        let t = tool("t", class);
        let p = match class {
            Class::Provider => Provider::deduping(&[]),
            _ => Provider::new(&[]),
        };
        let mem = MemJournal::new();
        {
            let faulty = FaultyJournal::new(mem.clone());
            let rt = Runtime::builder().journal(faulty.clone()).open().unwrap();
            faulty.fail_sync(2, StorageFault::Refused);
            let err = call1(&rt, t, &p, VerifyMode::Provider).await.unwrap_err();
            assert!(
                matches!(&err, ToolError::Journal(Error::Storage { op: "sync", .. })),
                "{class}: {err:?}"
            );
            assert_eq!((p.calls(), p.effects()), (1, 1), "{class}");
        }
        mem.crash();
        let rt = Runtime::builder().journal(mem.clone()).open().unwrap();
        let again = call1(&rt, t, &p, VerifyMode::Provider).await;
        match class {
            // Same key again; the provider replays its first answer.
            Class::Provider => {
                assert_eq!(again.unwrap(), "done:a");
                assert_eq!(p.calls(), 2);
                let reqs = p.requests();
                assert_eq!(reqs[0].0, reqs[1].0, "the same key");
            }
            // verify finds the effect: committed without a second request.
            Class::Journal => {
                assert_eq!(again.unwrap(), "done:a");
                assert_eq!(p.calls(), 1);
                assert!(events(&rt)
                    .await
                    .iter()
                    .any(|k| matches!(k, EventKind::Verified { verdict } if verdict == "landed")));
            }
            // Never re-sent: a human decides.
            Class::AtMostOnce => {
                assert!(
                    matches!(again, Err(ToolError::Escalated { .. })),
                    "{again:?}"
                );
                assert_eq!(p.calls(), 1);
                assert_eq!(rt.escalations().await.unwrap().len(), 1);
            }
            Class::ReadOnly => unreachable!(),
        }
        assert_eq!(p.effects(), 1, "{class}: one effect");
    }
}

#[tokio::test(start_paused = true)]
async fn audit_stream_is_durable_ordered_live_and_exportable() {
    let dir = TempDir::new().unwrap();
    let p = Provider::new(&[Step::Refuse]);
    let t = tool("send", Class::Journal);
    let mut live = Vec::new();
    {
        let rt = open(dir.path());
        let mut sub = rt.subscribe();
        call1(&rt, t, &p, VerifyMode::Provider).await.unwrap();
        call1(&rt, t, &p, VerifyMode::Provider).await.unwrap();
        while let Some(e) = sub.try_recv() {
            live.push(e.unwrap());
        }
    }
    let rt = open(dir.path());
    let all: Vec<_> = rt.audit(0).await.unwrap();
    assert_eq!(all, live, "the live stream and the durable one agree");
    let kinds: Vec<_> = all.iter().map(|e| e.kind.clone()).collect();
    assert!(matches!(kinds[0], EventKind::Intent { generation: 0, .. }));
    assert_eq!(kinds[1], EventKind::Attempt { attempt: 1 });
    assert!(matches!(
        kinds[2],
        EventKind::Retry {
            attempt: 1,
            delay_ms: 1000,
            ..
        }
    ));
    assert_eq!(kinds[3], EventKind::Attempt { attempt: 2 });
    assert!(matches!(kinds[4], EventKind::Committed { attempt: 2, .. }));
    assert_eq!(kinds[5], EventKind::DedupeHit);
    assert!(all.windows(2).all(|w| w[0].seq < w[1].seq));
    assert!(all
        .iter()
        .all(|e| e.key.is_some() && e.tool == "send" && e.root_run == "run"));
    // From a sequence number.
    let tail: Vec<_> = rt.audit(all[3].seq).await.unwrap();
    assert_eq!(tail, all[3..]);
    // JSON lines.
    let mut out = Vec::new();
    assert_eq!(
        rt.export_audit(0, &mut out).await.unwrap(),
        all.len() as u64
    );
    let lines: Vec<_> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(lines.len(), all.len());
    let first: idem_runtime::AuditEvent = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(first, all[0]);
    // Stats derived from it.
    let stats = rt.stats().await.unwrap();
    let s = &stats.tools["send"];
    assert_eq!(
        (s.calls, s.attempts, s.retries, s.dedupe_hits, s.commits),
        (2, 2, 1, 1, 1)
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
