//! The PostgreSQL journal behind pgbouncer in transaction pooling mode
//! (`PostgresOptions::pooler`): the backend conformance suite through a
//! real pgbouncer (idem_testkit::pgbouncer) in front of a throwaway server,
//! the detection of a pooler, why the option matters (a session advisory
//! lock through a pooler holds nothing), and the fence of the lease row
//! that holds a worker id there.

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::journal::{
    ClaimChange, Claimed, Durability, Expect, Journal, Owner, Space, Write,
};
use idem_runtime::{Error, PostgresJournal, PostgresOptions};
use idem_testkit::pg::PgServer;
use idem_testkit::pgbouncer::{PgBouncer, PgBouncerOptions};

mod conformance {
    idem_testkit::conformance_suite!(idem_testkit::pgbouncer::pooled(), leases);
}

fn owner(worker: &str, incarnation: u64) -> Owner {
    Owner {
        worker: Arc::from(worker),
        incarnation,
    }
}

fn lease(lease: Duration) -> PostgresOptions {
    PostgresOptions {
        lease,
        pool_size: 2,
        ..PostgresOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooler_is_detected_and_a_direct_server_is_not() {
    let direct = PgServer::shared().create_database().unwrap();
    let pooled = PgBouncer::shared().url_of(&direct);
    let through = PostgresJournal::connect(&pooled).await.unwrap();
    assert!(
        through.behind_pooler(),
        "pgbouncer in transaction mode was not detected"
    );
    assert!(
        !through.listening(),
        "behind a pooler without listen_url nothing listens"
    );
    let plain = PostgresJournal::connect(&direct).await.unwrap();
    assert!(
        !plain.behind_pooler(),
        "a direct connection was taken for a pooler"
    );
    // In session pooling mode a client keeps its server session, prepared
    // statements, locks and LISTEN included: nothing to work around.
    let session_mode = PgBouncer::start_with(
        PgServer::shared(),
        &PgBouncerOptions {
            pool_mode: "session",
            ..PgBouncerOptions::default()
        },
    )
    .unwrap();
    let kept = PostgresJournal::connect(&session_mode.url_of(&direct))
        .await
        .unwrap();
    assert!(
        !kept.behind_pooler(),
        "session pooling was taken for transaction pooling"
    );
    // The option overrides detection either way.
    let forced = PostgresJournal::connect_with(&direct, &PostgresOptions::default().pooler(true))
        .await
        .unwrap();
    assert!(forced.behind_pooler());
}

/// Through a pooler with a single server session, a session advisory lock
/// is the pooler's session's, not the journal's: without `pooler(true)`
/// a second live journal under the same worker id takes it too (the lock
/// is re-entrant in that one session). With it, the lease row refuses the
/// second one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_option_a_worker_id_is_not_exclusive_through_a_pooler() {
    let server = PgServer::shared();
    let direct = server.create_database().unwrap();
    let bouncer = PgBouncer::start_with(
        server,
        &PgBouncerOptions {
            pool_size: 1,
            ..PgBouncerOptions::default()
        },
    )
    .unwrap();
    let url = bouncer.url_of(&direct);
    let short = lease(Duration::from_millis(500));

    let session = short.clone().pooler(false);
    let a = PostgresJournal::connect_with(&url, &session).await.unwrap();
    let b = PostgresJournal::connect_with(&url, &session).await.unwrap();
    a.hold_worker_id(&owner("pod-1", 1)).await.unwrap();
    let second = b.hold_worker_id(&owner("pod-1", 2)).await;
    println!("without pooler(true), a second live journal under pod-1: {second:?}");
    assert!(
        second.is_ok(),
        "expected the session lock to fail open through a one-session pooler: {second:?}"
    );
    drop((a, b));

    let leased = short.pooler(true);
    let a = PostgresJournal::connect_with(&url, &leased).await.unwrap();
    let b = PostgresJournal::connect_with(&url, &leased).await.unwrap();
    a.hold_worker_id(&owner("pod-2", 1)).await.unwrap();
    let second = b.hold_worker_id(&owner("pod-2", 2)).await;
    assert!(
        matches!(&second, Err(Error::WorkerInUse { worker, .. }) if worker == "pod-2"),
        "with pooler(true) a second live journal under pod-2 must be refused: {second:?}"
    );
    // Dropped, the first gives the id up and the second takes it.
    drop(a);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match b.hold_worker_id(&owner("pod-2", 2)).await {
            Ok(()) => break,
            Err(Error::WorkerInUse { .. }) if tokio::time::Instant::now() < deadline => {}
            other => panic!("the id was not handed on: {other:?}"),
        }
    }
}

/// A journal whose lease on its worker id ran out (a pause past it) and
/// whose id another process took meanwhile claims nothing more: the write
/// that would take a claim is fenced in the database, then refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_worker_id_lease_fences_the_claims_of_its_old_holder() {
    let direct = PgServer::shared().create_database().unwrap();
    let url = PgBouncer::shared().url_of(&direct);
    let options = lease(Duration::from_secs(30)).pooler(true);
    let old = PostgresJournal::connect_with(&url, &options).await.unwrap();
    let new = PostgresJournal::connect_with(&url, &options).await.unwrap();
    old.hold_worker_id(&owner("pod-3", 1)).await.unwrap();
    // What a pause past the lease looks like in the database: the row has
    // expired (the old holder still believes it holds it, for up to nine
    // tenths of a lease by its own clock).
    PgServer::shared()
        .psql(
            PgServer::database_of(&direct),
            "UPDATE idem_worker_ids SET lease_until = clock_timestamp() - interval '1 second'",
        )
        .unwrap();
    new.hold_worker_id(&owner("pod-3", 2)).await.unwrap();
    let key = [7u8; 32];
    let stale = owner("pod-3", 1);
    let claimed = old
        .claim(Write {
            space: Space::Ops,
            key: &key,
            expect: Expect::Absent,
            body: b"intent",
            claim: ClaimChange::Take(&stale),
            escalated: false,
            events: &[],
            durability: Durability::Immediate,
        })
        .await;
    assert!(
        matches!(&claimed, Err(Error::WorkerInUse { worker, .. }) if worker == "pod-3"),
        "the old holder of pod-3 claimed: {claimed:?}"
    );
    assert_eq!(old.load(Space::Ops, &key).await.unwrap(), None);
    // The new holder claims as usual.
    let fresh = owner("pod-3", 2);
    let claimed = new
        .claim(Write {
            space: Space::Ops,
            key: &key,
            expect: Expect::Absent,
            body: b"intent",
            claim: ClaimChange::Take(&fresh),
            escalated: false,
            events: &[],
            durability: Durability::Immediate,
        })
        .await
        .unwrap();
    assert!(matches!(claimed, Claimed::Done { .. }), "{claimed:?}");
}

/// Behind a pooler with `listen_url`, a waiter is woken by the NOTIFY of a
/// write made through the pooler, heard on the direct connection: the
/// polling interval is a minute here, so only the notification can wake it
/// before the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_pooler_listen_url_wakes_waiters_of_other_journals() {
    let direct = PgServer::shared().create_database().unwrap();
    let url = PgBouncer::shared().url_of(&direct);
    let options = PostgresOptions {
        poll: Duration::from_secs(60),
        ..lease(Duration::from_secs(30))
    }
    .pooler(true)
    .listen_url(direct.clone());
    let waiter = PostgresJournal::connect_with(&url, &options).await.unwrap();
    let writer = PostgresJournal::connect_with(&url, &options).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !waiter.listening() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the journal never listened on listen_url"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let key = [9u8; 32];
    let me = owner("pod-4", 1);
    let write = |expect, body: &'static [u8]| Write {
        space: Space::Ops,
        key: &key,
        expect,
        body,
        claim: ClaimChange::Keep,
        escalated: false,
        events: &[],
        durability: Durability::Immediate,
    };
    let Claimed::Done { version, .. } = writer
        .claim(Write {
            claim: ClaimChange::Take(&me),
            ..write(Expect::Absent, b"intent")
        })
        .await
        .unwrap()
    else {
        panic!("the key was new")
    };
    let waiter = Arc::new(waiter);
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.changed(Space::Ops, &key, version).await }
    });
    // Written only once the waiter has marked the record watched (so the
    // write notifies, rather than the waiter seeing the new version).
    let db = PgServer::database_of(&direct);
    while PgServer::shared()
        .psql(db, "SELECT count(*) FROM idem_records WHERE watched")
        .unwrap()
        .trim()
        != "1"
    {
        assert!(tokio::time::Instant::now() < deadline, "never watched");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let written = writer
        .write(write(Expect::Version(version), b"committed"))
        .await
        .unwrap();
    assert!(matches!(
        written,
        idem_runtime::journal::Written::Done { .. }
    ));
    tokio::time::timeout_at(deadline, waiting)
        .await
        .expect("the waiter was not woken by the notification")
        .unwrap();
}
