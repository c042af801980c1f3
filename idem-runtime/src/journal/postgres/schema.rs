//! The journal's tables, created and versioned by the runtime.
//!
//! Creation is idempotent (`CREATE ... IF NOT EXISTS`) and runs under a
//! transaction-scoped advisory lock, so workers that start together do not
//! race each other's DDL. The version row says which schema the tables
//! have; a database whose version is newer than this build's is refused
//! untouched, as the sled journal refuses a newer format.

use deadpool_postgres::tokio_postgres::Client;

use crate::error::Error;

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
";

/// Creates or checks the schema; returns its version.
pub async fn migrate(client: &mut Client, location: &str) -> Result<i32, Error> {
    let storage = |op: &'static str| {
        let location = location.to_string();
        // With the server's words: tokio-postgres's own Display is only
        // "db error" (a role without CREATE on the schema, say).
        move |e: deadpool_postgres::tokio_postgres::Error| {
            Error::storage(op, &location, super::describe(&e))
        }
    };
    let tx = client
        .transaction()
        .await
        .map_err(storage("start the schema migration"))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(storage("lock the schema"))?;
    let exists: Option<String> = tx
        .query_one("SELECT to_regclass('idem_schema')::text", &[])
        .await
        .map_err(storage("look for the schema"))?
        .get(0);
    if exists.is_some() {
        let found: Option<i32> = tx
            .query_opt("SELECT version FROM idem_schema", &[])
            .await
            .map_err(storage("read the schema version"))?
            .map(|r| r.get(0));
        if let Some(found) = found {
            if found > SCHEMA_VERSION {
                return Err(Error::UnsupportedFormat {
                    path: location.into(),
                    found: found as u32,
                    supported: SCHEMA_VERSION as u32,
                });
            }
        }
    }
    tx.batch_execute(V1)
        .await
        .map_err(storage("create the schema"))?;
    tx.execute(
        "INSERT INTO idem_schema (version) VALUES ($1) ON CONFLICT (id) DO NOTHING",
        &[&SCHEMA_VERSION],
    )
    .await
    .map_err(storage("record the schema version"))?;
    tx.commit()
        .await
        .map_err(storage("commit the schema migration"))?;
    Ok(SCHEMA_VERSION)
}
