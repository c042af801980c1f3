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
