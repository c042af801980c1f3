//! The journal's tables, created and versioned by the runtime.
//!
//! Creation is idempotent (`CREATE ... IF NOT EXISTS`) and runs under a
//! transaction-scoped advisory lock, so workers that start together do not
//! race each other's DDL. The version row says which schema the tables
//! have; a database whose version is newer than this build's is refused
//! untouched, as the sled journal refuses a newer format.

use deadpool_postgres::tokio_postgres::types::Type;
use deadpool_postgres::tokio_postgres::{Client, GenericClient};

use idem_journal::error::Error;

/// The schema this build creates and reads.
pub const SCHEMA_VERSION: i32 = 1;

/// The advisory lock key under which the schema is created ("idem" in
/// ASCII).
const MIGRATION_LOCK: i64 = 0x6964_656d;

/// Version 1.
///
/// - `idem_records`: one row per record. `version` comes from a sequence,
///   so a removed and re-created record never reuses one (no ABA for a
///   writer holding an old version); `epoch` counts takeovers (the fencing
///   token); the claim is `owner_worker`/`owner_incarnation` with its lease
///   `lease_until`, on the database's clock; `watched` says that a worker
///   once waited for the record, so its writes notify (see `listen.rs`).
/// - `idem_events`: the audit stream. `seq` is the inserting transaction's
///   id shifted left 16 bits plus the event's index in it, which makes
///   sequence order transaction-id order: see `events.rs` for why that
///   makes the stream commit-ordered. `durable` is false for events of an
///   asynchronously committed transaction.
/// - `idem_barrier`: one row per process, rewritten by a synchronous
///   commit to make earlier asynchronous commits durable (WAL is flushed in
///   order).
/// - `idem_worker_ids`: the worker ids held by journals behind a
///   connection pooler, as leases (see `identity.rs`); added to version 1
///   later (every migration creates what is missing, and older builds
///   ignore it).
///
/// Every statement here is the unnamed one (`query_typed`), so that the
/// migration also runs through a pooler in transaction mode.
const V1: &str = "
CREATE TABLE IF NOT EXISTS idem_schema (
    id boolean PRIMARY KEY DEFAULT true CHECK (id),
    version integer NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE SEQUENCE IF NOT EXISTS idem_versions;
CREATE TABLE IF NOT EXISTS idem_records (
    space smallint NOT NULL,
    key bytea NOT NULL,
    version bigint NOT NULL,
    epoch bigint NOT NULL,
    owner_worker text,
    owner_incarnation bigint,
    lease_until timestamptz,
    escalated boolean NOT NULL,
    watched boolean NOT NULL DEFAULT false,
    body bytea NOT NULL,
    PRIMARY KEY (space, key)
);
CREATE INDEX IF NOT EXISTS idem_records_escalated ON idem_records (key) WHERE escalated;
CREATE INDEX IF NOT EXISTS idem_records_claimed ON idem_records (lease_until)
    WHERE owner_worker IS NOT NULL;
CREATE TABLE IF NOT EXISTS idem_events (
    seq bigint PRIMARY KEY,
    op_key bytea,
    durable boolean NOT NULL,
    bytes bytea NOT NULL
);
CREATE INDEX IF NOT EXISTS idem_events_op ON idem_events (op_key, seq) WHERE op_key IS NOT NULL;
CREATE TABLE IF NOT EXISTS idem_barrier (
    slot integer PRIMARY KEY,
    at timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS idem_worker_ids (
    worker text PRIMARY KEY,
    holder text NOT NULL,
    lease_until timestamptz NOT NULL
);
";

/// An error of step `op`, with the server's words: tokio-postgres's own
/// Display is only "db error" (a role without CREATE on the schema, say).
fn storage(
    op: &'static str,
    location: &str,
) -> impl FnOnce(deadpool_postgres::tokio_postgres::Error) -> Error {
    let location = location.to_string();
    move |e| crate::rows::failure(op, &location, e)
}

/// The version row of the schema, if the database has the schema table
/// (`None` inside: the table without its row, a creation in progress).
async fn found_version(
    client: &impl GenericClient,
    location: &str,
) -> Result<Option<Option<i32>>, Error> {
    let exists: Option<String> = client
        .query_typed_one("SELECT to_regclass('idem_schema')::text", &[])
        .await
        .map_err(storage("look for the schema", location))?
        .get(0);
    if exists.is_none() {
        return Ok(None);
    }
    let found = client
        .query_typed_opt("SELECT version FROM idem_schema", &[])
        .await
        .map_err(storage("read the schema version", location))?
        .map(|r| r.get(0));
    Ok(Some(found))
}

fn unsupported(location: &str, found: i32) -> Error {
    Error::UnsupportedFormat {
        path: location.into(),
        found: found as u32,
        supported: SCHEMA_VERSION as u32,
    }
}

/// Checks, changing nothing, that the database holds the schema in the
/// version this build reads.
pub async fn check(client: &impl GenericClient, location: &str) -> Result<(), Error> {
    match found_version(client, location).await? {
        Some(Some(SCHEMA_VERSION)) => Ok(()),
        Some(Some(found)) => Err(unsupported(location, found)),
        found => Err(Error::NotAJournal {
            path: location.into(),
            detail: match found {
                None => "the database has no idem_schema table".into(),
                Some(_) => "idem_schema holds no version".into(),
            },
        }),
    }
}

/// Creates or checks the schema; returns its version.
pub async fn migrate(client: &mut Client, location: &str) -> Result<i32, Error> {
    let tx = client
        .transaction()
        .await
        .map_err(storage("start the schema migration", location))?;
    tx.query_typed(
        "SELECT pg_advisory_xact_lock($1)",
        &[(&MIGRATION_LOCK, Type::INT8)],
    )
    .await
    .map_err(storage("lock the schema", location))?;
    if let Some(Some(found)) = found_version(&tx, location).await? {
        if found > SCHEMA_VERSION {
            return Err(unsupported(location, found));
        }
    }
    tx.batch_execute(V1)
        .await
        .map_err(storage("create the schema", location))?;
    tx.query_typed(
        "INSERT INTO idem_schema (version) VALUES ($1) ON CONFLICT (id) DO NOTHING",
        &[(&SCHEMA_VERSION, Type::INT4)],
    )
    .await
    .map_err(storage("record the schema version", location))?;
    tx.commit()
        .await
        .map_err(storage("commit the schema migration", location))?;
    Ok(SCHEMA_VERSION)
}
