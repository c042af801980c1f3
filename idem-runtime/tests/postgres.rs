//! What only the PostgreSQL journal has to show (the conformance suite in
//! tests/conformance.rs covers what every backend does): its schema, its
//! notifications across processes, its commit-ordered audit stream, the
//! durability of what readers see, fencing at the journal's level, and a
//! database crash in the middle of a call.

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::journal::{
    ClaimChange, Claimed, Durability, Expect, Held, Journal, NewEvent, Owner, Space, Write, Written,
};
use idem_runtime::{Class, Error, PostgresJournal, PostgresOptions, Runtime, ToolError};
use idem_testkit::engine::{call, tool_with, ScriptedProvider, Step, VerifyMode};
use idem_testkit::pg::PgServer;

const K: [u8; 32] = [7; 32];

fn options(lease: Duration, poll: Duration) -> PostgresOptions {
    PostgresOptions {
        lease,
        poll,
        pool_size: 4,
        ..PostgresOptions::default()
    }
}

fn put<'a>(expect: Expect, body: &'a [u8], claim: ClaimChange<'a>) -> Write<'a> {
    Write {
        space: Space::Ops,
        key: &K,
        expect,
        body,
        claim,
        escalated: false,
        events: &[],
        durability: Durability::Immediate,
    }
}

async fn raw(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_is_created_once_and_a_newer_one_is_refused_untouched() {
    let server = PgServer::shared();
    let url = server.create_database().unwrap();
    let (a, b) = tokio::join!(
        PostgresJournal::migrate(&url),
        PostgresJournal::migrate(&url)
    );
    assert_eq!((a.unwrap(), b.unwrap()), (1, 1), "idempotent, even at once");
    let db = PgServer::database_of(&url);
    server
        .psql(db, "UPDATE idem_schema SET version = 99")
        .unwrap();
    let err = PostgresJournal::connect(&url).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::UnsupportedFormat {
                found: 99,
                supported: 1,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        server
            .psql(db, "SELECT version FROM idem_schema")
            .unwrap()
            .trim(),
        "99",
        "nothing was changed"
    );
    let err = Runtime::connect("postgres://nobody@/x?host=/nonexistent-idem-socket")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Storage { .. }), "{err}");
    assert!(!err.to_string().contains("password"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_migrate_connecting_only_checks_the_schema_and_creates_nothing() {
    let server = PgServer::shared();
    let url = server.create_database().unwrap();
    let db = PgServer::database_of(&url);
    let tables = || server.idem_relations(db).unwrap();
    let check_only = PostgresOptions {
        migrate: false,
        ..PostgresOptions::default()
    };
    let Err(err) = PostgresJournal::connect_with(&url, &check_only).await else {
        panic!("no schema must be refused, but it connected");
    };
    assert!(matches!(err, Error::NotAJournal { .. }), "{err}");
    assert!(err.to_string().contains("no idem_schema table"), "{err}");
    assert_eq!(tables(), 0, "nothing was created");

    // Once created, it connects and works; a version it does not read is
    // refused as with migrating, untouched.
    assert_eq!(PostgresJournal::migrate(&url).await.unwrap(), 1);
    let created = tables();
    let journal = PostgresJournal::connect_with(&url, &check_only)
        .await
        .expect("the schema is there");
    assert!(journal.load(Space::Ops, &K).await.unwrap().is_none());
    drop(journal);
    server
        .psql(db, "UPDATE idem_schema SET version = 2")
        .unwrap();
    let Err(err) = PostgresJournal::connect_with(&url, &check_only).await else {
        panic!("another version must be refused, but it connected");
    };
    assert!(
        matches!(err, Error::UnsupportedFormat { found: 2, .. }),
        "{err}"
    );
    assert_eq!(tables(), created);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_in_another_process_is_woken_by_the_writers_notification() {
    let url = PgServer::shared().create_database().unwrap();
    // Polling once an hour: only a notification can wake the waiter in time.
    let hour = Duration::from_secs(3600);
    let waiter = PostgresJournal::connect_with(&url, &options(hour, hour))
        .await
        .unwrap();
    let writer = PostgresJournal::connect_with(&url, &options(hour, hour))
        .await
        .unwrap();
    let Written::Done { version, .. } = writer
        .write(put(Expect::Absent, b"1", ClaimChange::Keep))
        .await
        .unwrap()
    else {
        panic!("created")
    };
    while !waiter.listening() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The creation's own notification may still be on its way.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let waiter = Arc::new(waiter);
    let woken = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.changed(Space::Ops, &K, version).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!woken.is_finished(), "nothing changed yet");
    writer
        .write(put(Expect::Version(version), b"2", ClaimChange::Keep))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(20), woken)
        .await
        .expect("the notification woke the waiter")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_stream_is_commit_ordered_across_writers() {
    let url = PgServer::shared().create_database().unwrap();
    let journal = PostgresJournal::connect(&url).await.unwrap();
    // A slow writer: its transaction has its id (and so its numbers) before
    // a faster one commits.
    let mut slow = raw(&url).await;
    let tx = slow.transaction().await.unwrap();
    tx.execute(
        "INSERT INTO idem_events (seq, op_key, durable, bytes)
         VALUES ((pg_current_xact_id()::text::bigint << 16) + 1, NULL, true, 'slow')",
        &[],
    )
    .await
    .unwrap();
    let fast = journal
        .append(
            &[NewEvent {
                key: None,
                bytes: b"fast",
            }],
            Durability::Immediate,
        )
        .await
        .unwrap()[0];
    // The fast event is committed, but the slow one may still commit with
    // a lower number: a reader must not get past it yet.
    let seen = journal.events(0, 100).await.unwrap();
    assert!(seen.is_empty(), "handed out past an open writer: {seen:?}");
    tx.commit().await.unwrap();
    let mut seen = journal.events(0, 100).await.unwrap();
    for _ in 0..1000 {
        if seen.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
        seen = journal.events(0, 100).await.unwrap();
    }
    let bytes: Vec<&[u8]> = seen.iter().map(|(_, b)| b.as_slice()).collect();
    assert_eq!(bytes, [&b"slow"[..], &b"fast"[..]]);
    assert!(seen[0].0 < seen[1].0 && seen[1].0 == fast);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventual_events_are_made_durable_before_a_reader_sees_them() {
    // A server whose WAL writer waits 10 s: an asynchronous commit stays
    // volatile until something flushes the WAL.
    let server = PgServer::start().unwrap();
    server
        .psql("postgres", "ALTER SYSTEM SET wal_writer_delay = '10s'")
        .unwrap();
    server.psql("postgres", "SELECT pg_reload_conf()").unwrap();
    let url = server.create_database().unwrap();
    let writer = PostgresJournal::connect(&url).await.unwrap();
    let reader = PostgresJournal::connect(&url).await.unwrap();
    let seq = writer
        .append(
            &[NewEvent {
                key: None,
                bytes: b"dedupe hit",
            }],
            Durability::Eventual,
        )
        .await
        .unwrap()[0];
    let mut seen = reader.events(0, 10).await.unwrap();
    while seen.is_empty() {
        tokio::time::sleep(Duration::from_millis(2)).await;
        seen = reader.events(0, 10).await.unwrap();
    }
    assert_eq!(seen[0].0, seq);
    // What the reader saw survives a crash of the database.
    drop((writer, reader));
    server.restart_immediate().unwrap();
    let after = PostgresJournal::connect(&url).await.unwrap();
    let events = after.events(0, 10).await.unwrap();
    assert_eq!(events, [(seq, b"dedupe hit".to_vec())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_writes_an_absent_record_or_returns_the_one_there_unchanged() {
    let url = PgServer::shared().create_database().unwrap();
    let j = PostgresJournal::connect(&url).await.unwrap();
    assert!(
        j.claim_first(),
        "a read is a round trip: the engine claims first"
    );
    let owner = Owner {
        worker: Arc::from("a"),
        incarnation: 1,
    };
    let event = [NewEvent {
        key: Some(&K),
        bytes: b"intent event",
    }];
    let claim = |body: &'static [u8]| Write {
        events: &event,
        ..put(Expect::Absent, body, ClaimChange::Take(&owner))
    };
    let Claimed::Done { version, seqs, .. } = j.claim(claim(b"first")).await.unwrap() else {
        panic!("the record was absent");
    };
    assert_eq!(seqs.len(), 1);
    let stored = j.load(Space::Ops, &K).await.unwrap().expect("written");
    assert_eq!((stored.version, &stored.body[..]), (version, &b"first"[..]));

    // Again: nothing written (not the body, not the claim, no event), and
    // what comes back is what a read returns, in the same round trip.
    let Claimed::Exists(Some(found)) = j.claim(claim(b"second")).await.unwrap() else {
        panic!("the record exists");
    };
    assert_eq!(found, stored);
    assert_eq!(j.load(Space::Ops, &K).await.unwrap(), Some(stored));
    j.sync().await.unwrap();
    assert_eq!(j.events(0, 100).await.unwrap().len(), 1, "no second event");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_over_claim_is_fenced_off() {
    let url = PgServer::shared().create_database().unwrap();
    let short = options(Duration::from_millis(60), Duration::from_millis(10));
    let a = PostgresJournal::connect_with(&url, &short).await.unwrap();
    let b = PostgresJournal::connect_with(&url, &short).await.unwrap();
    let (wa, wb) = (
        Owner {
            worker: Arc::from("a"),
            incarnation: 1,
        },
        Owner {
            worker: Arc::from("b"),
            incarnation: 1,
        },
    );
    let Written::Done { version, epoch, .. } = a
        .write(put(Expect::Absent, b"intent", ClaimChange::Take(&wa)))
        .await
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(epoch, 1);
    let held = [Held {
        space: Space::Ops,
        key: K,
        epoch,
    }];
    assert_eq!(a.renew(&wa, &held).await.unwrap(), [true]);
    assert_eq!(b.renew(&wb, &held).await.unwrap(), [false], "not b's claim");
    let loaded = b.load(Space::Ops, &K).await.unwrap().unwrap();
    assert!(loaded.claim.as_ref().unwrap().live, "leased");
    // a stops renewing; its lease runs out on the database's clock.
    let mut loaded = loaded;
    while loaded.claim.as_ref().unwrap().live {
        tokio::time::sleep(Duration::from_millis(10)).await;
        loaded = b.load(Space::Ops, &K).await.unwrap().unwrap();
    }
    assert_eq!(loaded.version, version, "a renewal is not a write");
    let Written::Done { epoch: taken, .. } = b
        .write(put(
            Expect::Version(version),
            b"taken",
            ClaimChange::Take(&wb),
        ))
        .await
        .unwrap()
    else {
        panic!("the takeover")
    };
    assert_eq!(taken, 2, "a new epoch");
    // a wakes: its renewal and its commit change nothing.
    assert_eq!(a.renew(&wa, &held).await.unwrap(), [false]);
    assert_eq!(
        a.write(put(
            Expect::Version(version),
            b"committed",
            ClaimChange::Release
        ))
        .await
        .unwrap(),
        Written::Conflict
    );
    let now = a.load(Space::Ops, &K).await.unwrap().unwrap();
    assert_eq!((now.body.as_slice(), now.epoch), (&b"taken"[..], 2));
    assert_eq!(now.claim.unwrap().owner, wb);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_crash_mid_call_fails_closed_and_the_next_call_recovers() {
    let server = PgServer::start().unwrap();
    let url = server.create_database().unwrap();
    let rt = Runtime::builder()
        .postgres(&url)
        .worker_id("pod-7")
        .lease(Duration::from_secs(30))
        .connect()
        .await
        .unwrap();
    let t = tool_with("send", Class::Journal, |d| {
        d.retry.initial = Duration::from_millis(2);
        d.retry.max_interval = Duration::from_millis(10);
    });
    let p = ScriptedProvider::new(&[Step::LandThenHeld]);
    let first = tokio::spawn({
        let (ctx, p) = (rt.run("run"), p.clone());
        async move { call(&ctx, t, &p, 1, "a", VerifyMode::Provider).await }
    });
    p.wait_requests(1).await;
    // The effect landed; the database dies before the COMMIT.
    server.stop_immediate().unwrap();
    p.release();
    let out = first.await.unwrap();
    assert!(
        matches!(out, Err(ToolError::Journal(Error::Storage { .. }))),
        "{out:?}"
    );
    // While it is down: no INTENT, so no call.
    let down = call(&rt.run("run"), t, &p, 2, "b", VerifyMode::Provider).await;
    assert!(matches!(down, Err(ToolError::Journal(_))), "{down:?}");
    assert_eq!(p.calls(), 1, "fail closed");
    // Back up: the pool reconnects, the unknown commit is recovered like a
    // crash (verify finds the effect), nothing is sent twice.
    server.start_again().unwrap();
    let out = call(&rt.run("run"), t, &p, 1, "a", VerifyMode::Provider).await;
    assert_eq!(out.unwrap(), "done:a");
    assert_eq!((p.calls(), p.effects()), (1, 1));
    let out = call(&rt.run("run"), t, &p, 2, "b", VerifyMode::Provider).await;
    assert_eq!(out.unwrap(), "done:b");
    let kinds: Vec<_> = rt
        .audit(0)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert!(kinds.iter().any(|k| matches!(
        k,
        idem_runtime::EventKind::Committed { via, .. } if via == "verify"
    )));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_claims_are_listed_and_rows_being_written_are_skipped() {
    let url = PgServer::shared().create_database().unwrap();
    let short = options(Duration::from_millis(50), Duration::from_millis(10));
    let j = PostgresJournal::connect_with(&url, &short).await.unwrap();
    let dead = Owner {
        worker: Arc::from("dead"),
        incarnation: 1,
    };
    j.write(put(Expect::Absent, b"intent", ClaimChange::Take(&dead)))
        .await
        .unwrap();
    let other = [8u8; 32];
    j.write(Write {
        key: &other,
        ..put(Expect::Absent, b"done", ClaimChange::Release)
    })
    .await
    .unwrap();
    while j
        .load(Space::Ops, &K)
        .await
        .unwrap()
        .unwrap()
        .claim
        .unwrap()
        .live
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let expired = j.expired_claims(Space::Ops, 10).await.unwrap();
    assert_eq!(expired.len(), 1, "only the claimed record");
    assert_eq!(expired[0].0, K);
    assert_eq!(expired[0].1.claim.as_ref().unwrap().owner, dead);
    // A writer holds the row: the sweep skips it instead of waiting.
    let mut raw = raw(&url).await;
    let tx = raw.transaction().await.unwrap();
    tx.execute(
        "SELECT 1 FROM idem_records WHERE key = $1 FOR UPDATE",
        &[&&K[..]],
    )
    .await
    .unwrap();
    let expired = tokio::time::timeout(Duration::from_secs(20), j.expired_claims(Space::Ops, 10))
        .await
        .expect("not blocked by the writer")
        .unwrap();
    assert!(expired.is_empty(), "{expired:?}");
    tx.rollback().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_live_process_under_one_worker_id_is_refused() {
    let server = PgServer::shared();
    let url = server.create_database().unwrap();
    let connect = |id: &'static str| {
        let url = url.clone();
        async move {
            Runtime::builder()
                .postgres(url)
                .worker_id(id)
                .connect()
                .await
        }
    };
    let first = connect("pod-7").await.expect("the first pod-7");
    // Another process (its own connections) under the same id: refused at
    // connect, before it claims anything.
    match connect("pod-7").await {
        Err(Error::WorkerInUse { worker, location }) => {
            assert_eq!(worker, "pod-7");
            assert!(location.starts_with("postgres://"), "{location}");
        }
        other => panic!("a second live pod-7 was accepted: {other:?}"),
    }
    // A journal handed to a runtime by hand is held at its first claim.
    let journal = Arc::new(PostgresJournal::connect(&url).await.unwrap());
    let owner = Owner {
        worker: Arc::from("pod-7"),
        incarnation: 99,
    };
    let err = journal
        .claim(put(Expect::Absent, b"c", ClaimChange::Take(&owner)))
        .await
        .unwrap_err();
    assert!(matches!(&err, Error::WorkerInUse { .. }), "{err}");
    assert!(
        journal.load(Space::Ops, &K).await.unwrap().is_none(),
        "the refused claim wrote"
    );
    // Other ids are free.
    let other = connect("pod-8").await.expect("pod-8");
    // Once the first process is gone, its id is free (at once: its
    // session's end releases it).
    drop(first);
    let again = connect("pod-7").await.expect("pod-7 after the first ended");
    drop((again, other));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_whose_worker_id_was_taken_while_it_was_cut_off_claims_nothing_more() {
    let server = PgServer::shared();
    let url = server.create_database().unwrap();
    let journal = PostgresJournal::connect(&url).await.unwrap();
    let owner = Owner {
        worker: Arc::from("pod-9"),
        incarnation: 1,
    };
    journal.hold_worker_id(&owner).await.unwrap();
    // Another process queues for the id; the session holding it is cut off
    // (as a database restart or a network fault does): the queued one gets
    // the id before this journal's session can take it back.
    let other = raw(&url).await;
    let key = idem_postgres::worker_lock_key("pod-9");
    let queued = tokio::spawn(async move {
        other
            .query_one("SELECT pg_advisory_lock($1)", &[&key])
            .await
            .unwrap();
        other
    });
    let admin = raw(&url).await;
    // Wait (bounded) until the other session waits for the lock, then cut
    // this journal's holder off.
    for _ in 0..1000 {
        let waiting: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting > 0 {
            break;
        }
        tokio::task::yield_now().await;
    }
    let cut: i64 = admin
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = $1",
            &[&idem_postgres::WORKER_ID_APPLICATION_NAME],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(cut, 1);
    let _holder = queued.await.unwrap();
    // This journal reconnects, finds the id taken and refuses every claim
    // from then on (bounded wait for its reconnect; claims meanwhile are
    // on keys of their own).
    let mut refused = None;
    for i in 0..2000u32 {
        let mut key = [0u8; 32];
        key[..4].copy_from_slice(&i.to_le_bytes());
        let w = Write {
            key: &key,
            ..put(Expect::Absent, b"c", ClaimChange::Take(&owner))
        };
        match journal.claim(w).await {
            Ok(_) => tokio::task::yield_now().await,
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let refused = refused.expect("the superseded journal went on claiming");
    assert!(
        matches!(&refused, Error::WorkerInUse { worker, .. } if worker == "pod-9"),
        "{refused}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_replay_needs_no_server_and_its_event_is_written_once_it_is_back() {
    let server = PgServer::start().unwrap();
    let url = server.create_database().unwrap();
    let rt = Runtime::builder()
        .postgres(&url)
        .worker_id("pod-8")
        .connect()
        .await
        .unwrap();
    let t = tool_with("charge", Class::Provider, |_| {});
    let p = ScriptedProvider::new(&[]);
    let ctx = rt.run("run");
    assert_eq!(
        call(&ctx, t, &p, 1, "a", VerifyMode::Provider)
            .await
            .unwrap(),
        "done:a"
    );
    // Its event is written on its own, within the bound, without a sync.
    let mut live = rt.subscribe();
    assert_eq!(
        call(&ctx, t, &p, 1, "a", VerifyMode::Provider)
            .await
            .unwrap(),
        "done:a"
    );
    let seen = tokio::time::timeout(Duration::from_secs(30), live.recv())
        .await
        .expect("the held event is written within its bound")
        .unwrap();
    assert_eq!(seen.kind, idem_runtime::EventKind::DedupeHit);
    assert!(seen.seq > 0, "published with the number it was given");
    // (Written asynchronously committed, as every event that records no
    // decision: a database crash could lose it until this.)
    rt.sync().await.unwrap();

    // With the database down, the worker still answers what it saw commit.
    server.stop_immediate().unwrap();
    for _ in 0..2 {
        let out = call(&ctx, t, &p, 1, "a", VerifyMode::Provider).await;
        assert_eq!(out.unwrap(), "done:a");
    }
    assert_eq!(p.calls(), 1);
    // Back up: what was held is written, nothing is lost (the pool may need
    // a try or two to reconnect; a failed write keeps the events).
    server.start_again().unwrap();
    let mut synced = rt.sync().await;
    for _ in 0..20 {
        if synced.is_ok() {
            break;
        }
        synced = rt.sync().await;
    }
    synced.unwrap();
    let hits = rt
        .audit(0)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == idem_runtime::EventKind::DedupeHit)
        .count();
    assert_eq!(
        hits, 3,
        "every replay's event, the two made while down included"
    );
}

/// Concurrent claims of fresh keys `[i; 32]` for each `i` of `of` (two
/// events each); what each returned, by key.
async fn concurrent_claims(
    j: &Arc<PostgresJournal>,
    of: impl IntoIterator<Item = u8>,
    body: impl Fn(u8) -> Vec<u8>,
) -> Vec<([u8; 32], Result<Written, Error>)> {
    let owner = Owner {
        worker: Arc::from("grouped"),
        incarnation: 1,
    };
    let tasks: Vec<_> = of
        .into_iter()
        .map(|i| {
            let (j, owner, body) = (Arc::clone(j), owner.clone(), body(i));
            tokio::spawn(async move {
                let key = [i; 32];
                let events = [
                    NewEvent {
                        key: Some(&key),
                        bytes: b"first",
                    },
                    NewEvent {
                        key: Some(&key),
                        bytes: b"second",
                    },
                ];
                let w = Write {
                    space: Space::Ops,
                    key: &key,
                    expect: Expect::Absent,
                    body: &body,
                    claim: ClaimChange::Take(&owner),
                    escalated: false,
                    events: &events,
                    durability: Durability::Immediate,
                };
                (key, j.write(w).await)
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_share_transactions_and_keep_their_own_events_in_order() {
    let url = PgServer::shared().create_database().unwrap();
    let j = Arc::new(
        PostgresJournal::connect_with(
            &url,
            &options(Duration::from_secs(30), Duration::from_millis(50)),
        )
        .await
        .unwrap(),
    );
    let wrote = concurrent_claims(&j, 0..48, |i| vec![i]).await;
    let mut seqs = Vec::new();
    for (key, w) in &wrote {
        match w {
            Ok(Written::Done { seqs: s, .. }) => {
                assert_eq!(s.len(), 2);
                assert!(s[0] < s[1], "a write's events in its order: {s:?}");
                seqs.extend(s.iter().copied());
            }
            other => panic!("{key:?}: {other:?}"),
        }
        let held = j.load(Space::Ops, key).await.unwrap().unwrap();
        assert_eq!(held.body, vec![key[0]]);
    }
    // Some writes shared a transaction (its id is the number's high part),
    // and no two events share a number.
    let transactions: std::collections::BTreeSet<u64> = seqs.iter().map(|s| s >> 16).collect();
    assert!(
        transactions.len() < wrote.len(),
        "{} transactions for {} writes: none shared",
        transactions.len(),
        wrote.len()
    );
    let distinct: std::collections::BTreeSet<u64> = seqs.iter().copied().collect();
    assert_eq!(distinct.len(), seqs.len());
    // The stream holds each event once, in number order.
    let stream: Vec<u64> = j
        .events(0, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    let mut expected = seqs.clone();
    expected.sort_unstable();
    assert_eq!(stream, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_fails_fails_its_group_and_nothing_of_the_group_is_written() {
    let server = PgServer::shared();
    let url = server.create_database().unwrap();
    let j = Arc::new(
        PostgresJournal::connect_with(
            &url,
            &options(Duration::from_secs(30), Duration::from_millis(50)),
        )
        .await
        .unwrap(),
    );
    // A record the database refuses (as a failing disk or a constraint
    // would): the statement that writes it fails.
    server
        .psql(
            PgServer::database_of(&url),
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN IF NEW.body = '\\x706f69736f6e'::bytea THEN RAISE EXCEPTION 'refused'; END IF;
             RETURN NEW; END $$;
             CREATE TRIGGER refuse BEFORE INSERT ON idem_records FOR EACH ROW EXECUTE FUNCTION refuse();",
        )
        .unwrap();
    let poison = 30u8;
    let wrote = concurrent_claims(&j, 0..48, |i| {
        if i == poison {
            b"poison".to_vec()
        } else {
            vec![i]
        }
    })
    .await;
    let mut rolled_back = Vec::new();
    for (key, w) in &wrote {
        let held = j.load(Space::Ops, key).await.unwrap();
        match w {
            Ok(Written::Done { .. }) => {
                assert_eq!(held.map(|h| h.body), Some(vec![key[0]]), "{key:?}")
            }
            Ok(other) => panic!("{key:?}: {other:?}"),
            Err(e) => {
                assert!(held.is_none(), "{key:?} failed ({e}) but is there");
                if key[0] != poison {
                    rolled_back.push(key[0]);
                }
            }
        }
    }
    assert!(wrote[poison as usize].1.is_err());
    assert!(
        !rolled_back.is_empty(),
        "the refused write shared no transaction"
    );
    // The writes that failed with it take when tried again.
    for i in rolled_back {
        let again = concurrent_claims(&j, [i], |i| vec![i]).await;
        assert!(matches!(again[0].1, Ok(Written::Done { .. })), "{again:?}");
    }
}

/// A write of `body` to `[k; 32]`, expecting `expect`.
async fn write_key(
    j: &PostgresJournal,
    k: u8,
    expect: Expect,
    body: &[u8],
) -> Result<Written, Error> {
    let key = [k; 32];
    j.write(Write {
        space: Space::Ops,
        key: &key,
        expect,
        body,
        claim: ClaimChange::Keep,
        escalated: false,
        events: &[],
        durability: Durability::Immediate,
    })
    .await
}

/// Backends of `db` waiting for a row lock.
async fn waiting_for_locks(raw: &tokio_postgres::Client) -> i64 {
    raw.query_one(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event_type = 'Lock'",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// A journal on `url` with records `[1; 32]` and `[2; 32]` (their
/// versions), a session holding both rows in an open transaction, and a
/// session to watch from (inside a transaction the activity view is a
/// snapshot taken at its first read).
async fn two_locked_records(
    url: &str,
) -> (
    Arc<PostgresJournal>,
    Vec<u64>,
    tokio_postgres::Client,
    tokio_postgres::Client,
) {
    let j = Arc::new(
        PostgresJournal::connect_with(
            url,
            &options(Duration::from_secs(30), Duration::from_millis(50)),
        )
        .await
        .unwrap(),
    );
    let mut versions = Vec::new();
    for k in [1u8, 2] {
        match write_key(&j, k, Expect::Absent, b"v1").await.unwrap() {
            Written::Done { version, .. } => versions.push(version),
            other => panic!("{other:?}"),
        }
    }
    let holder = raw(url).await;
    holder
        .batch_execute("BEGIN; SELECT 1 FROM idem_records FOR UPDATE")
        .await
        .unwrap();
    (j, versions, holder, raw(url).await)
}

/// Waits (bounded) until `n` backends wait for a row lock.
async fn until_waiting(watcher: &tokio_postgres::Client, n: i64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while waiting_for_locks(watcher).await < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the writes never waited"
        );
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_write_whose_caller_stopped_waiting_is_not_written() {
    // Its own server: the transaction held open here would hold back the
    // audit stream's readers of every database on a shared one.
    let server = PgServer::start().unwrap();
    let url = server.create_database().unwrap();
    // The next two writes, started one after the other so that each is a
    // group of its own (as many as are written at once), wait for `raw`.
    let (j, versions, raw, watcher) = two_locked_records(&url).await;
    let mut blocked = Vec::new();
    for (n, (k, v)) in [1u8, 2].into_iter().zip(versions).enumerate() {
        let j = Arc::clone(&j);
        blocked.push(tokio::spawn(async move {
            write_key(&j, k, Expect::Version(v), b"v2").await
        }));
        until_waiting(&watcher, n as i64 + 1).await;
    }
    // A third write queues behind them (polled once: it is queued, and
    // waits); its caller gives up.
    {
        let mut queued = Box::pin(write_key(&j, 3, Expect::Absent, b"never"));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(std::future::Future::poll(queued.as_mut(), &mut cx).is_pending());
    }
    raw.batch_execute("COMMIT").await.unwrap();
    for b in blocked {
        assert!(matches!(b.await.unwrap(), Ok(Written::Done { .. })));
    }
    // The writers go on (nothing wedged), and the abandoned write is not
    // there.
    assert!(matches!(
        write_key(&j, 4, Expect::Absent, b"after").await,
        Ok(Written::Done { .. })
    ));
    assert!(j.load(Space::Ops, &[3; 32]).await.unwrap().is_none());
}

/// A runtime that was writing (its groups waiting on a lock) is shut down
/// under them: its leaders are gone, and another runtime's writes on the
/// same journal still find someone to write them.
#[test]
fn writes_go_on_after_the_runtime_of_their_leaders_is_gone() {
    let server = PgServer::start().unwrap();
    let url = server.create_database().unwrap();
    let main = tokio::runtime::Runtime::new().unwrap();
    let (j, versions, raw, watcher) = main.block_on(two_locked_records(&url));
    let doomed = tokio::runtime::Runtime::new().unwrap();
    for (n, (k, v)) in [1u8, 2].into_iter().zip(versions).enumerate() {
        let j = Arc::clone(&j);
        doomed.spawn(async move { write_key(&j, k, Expect::Version(v), b"v2").await });
        main.block_on(until_waiting(&watcher, n as i64 + 1));
    }
    doomed.shutdown_background();
    main.block_on(async {
        raw.batch_execute("COMMIT").await.unwrap();
        let after = tokio::time::timeout(
            Duration::from_secs(20),
            write_key(&j, 3, Expect::Absent, b"after"),
        )
        .await
        .expect("a write after the leaders' runtime went found no one to write it");
        assert!(matches!(after, Ok(Written::Done { .. })), "{after:?}");
    });
}
