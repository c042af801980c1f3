//! What the journal's statements read and write, beside the statements
//! themselves: connection strings, rows, codes, and errors.

use std::sync::Arc;

use deadpool_postgres::tokio_postgres::{self, Row};

use idem_journal::error::Error;
use idem_journal::journal::{Claim, ClaimChange, Digest, Loaded, Owner, Space, Write};

pub(crate) fn parse_config(url: &str) -> Result<tokio_postgres::Config, Error> {
    url.parse::<tokio_postgres::Config>()
        .map_err(|e| Error::Usage(format!("not a PostgreSQL connection string: {e}")))
}

/// The connection's target without its password, for error messages.
pub(crate) fn location_of(config: &tokio_postgres::Config) -> String {
    let user = config.get_user().unwrap_or("");
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            #[cfg(unix)]
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .collect();
    let port = config
        .get_ports()
        .first()
        .map(|p| format!(":{p}"))
        .unwrap_or_default();
    format!(
        "postgres://{user}@{}{port}/{}",
        hosts.join(","),
        config.get_dbname().unwrap_or("")
    )
}

pub(crate) fn pg<'a>(
    op: &'static str,
    location: &'a str,
) -> impl Fn(tokio_postgres::Error) -> Error + 'a {
    move |e| failure(op, location, e)
}

/// A database error as idem's [`Error`]: its SQLSTATE typed, the client's
/// error as the cause, the server's message in the text.
pub(crate) fn failure(op: &'static str, location: &str, e: tokio_postgres::Error) -> Error {
    let sqlstate = e.as_db_error().map(|db| db.code().code().to_string());
    Error::database(
        op,
        location,
        sqlstate,
        Failure {
            text: describe(&e),
            source: e,
        },
    )
}

/// The client's error, shown with the server's message and code.
#[derive(Debug)]
struct Failure {
    text: String,
    source: tokio_postgres::Error,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for Failure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// The error with its server-side detail, when there is one.
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{e}: {} ({})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

pub(crate) fn space_id(space: Space) -> i16 {
    match space {
        Space::Ops => 0,
        Space::Steps => 1,
    }
}

pub(crate) fn digest_of(bytes: &[u8], location: &str) -> Result<Digest, Error> {
    bytes.try_into().map_err(|_| Error::Corrupt {
        what: "record key",
        location: location.to_string(),
        key: format!("{bytes:02x?}"),
        detail: format!("{} bytes, not 32", bytes.len()),
    })
}

pub(crate) fn loaded(row: &Row, at: usize) -> Loaded {
    let worker: Option<String> = row.get(at + 2);
    let incarnation: Option<i64> = row.get(at + 3);
    Loaded {
        version: row.get::<_, i64>(at) as u64,
        epoch: row.get::<_, i64>(at + 1) as u64,
        claim: worker.map(|w| Claim {
            owner: Owner {
                worker: Arc::from(w),
                incarnation: incarnation.unwrap_or(0) as u64,
            },
            live: row.get(at + 4),
        }),
        body: row.get(at + 5),
    }
}

/// A write's events are numbered within its transaction in 16 bits.
pub(crate) fn check_events(write: &Write<'_>) -> Result<(), Error> {
    if write.events.len() >= 1 << 16 {
        return Err(Error::TooLarge {
            what: "a write's audit events",
            size: write.events.len() as u64,
            limit: (1 << 16) - 1,
        });
    }
    Ok(())
}

/// What a write does to the claim, as the statements' `$6`.
pub(crate) fn claim_code(claim: ClaimChange<'_>) -> i32 {
    match claim {
        ClaimChange::Keep => 0,
        ClaimChange::Take(_) => 1,
        ClaimChange::Release => 2,
    }
}

/// A pool's failure to hand out a connection: the database's own error
/// when it refused one, else the pool's.
pub(crate) fn pool_failure(
    op: &'static str,
    location: &str,
    e: deadpool_postgres::PoolError,
) -> Error {
    match e {
        deadpool_postgres::PoolError::Backend(e) => failure(op, location, e),
        // The only hook is the synchronous standby's check (standby.rs).
        deadpool_postgres::PoolError::PostCreateHook(deadpool_postgres::HookError::Message(
            reported,
        )) => Error::NoSynchronousStandby {
            location: location.to_string(),
            reported: reported.into_owned(),
        },
        deadpool_postgres::PoolError::PostCreateHook(deadpool_postgres::HookError::Backend(e)) => {
            failure(op, location, e)
        }
        other => Error::database(op, location, None, other),
    }
}

/// A statement's parameter with its type, as [`run`] takes them.
pub(crate) type Param<'a> = (&'a (dyn tokio_postgres::types::ToSql + Sync), Type);

pub(crate) use tokio_postgres::types::Type;

/// Runs `sql` and returns its rows. Directly connected, through a named
/// statement prepared once per connection (one round trip a call after
/// the first). Behind a pooler (`pooler`), as the unnamed statement, in
/// one round trip of its own (parse, bind, execute, sync): a named
/// statement would be prepared in one server session and, under
/// transaction pooling, executed in another, which does not have it.
pub(crate) async fn run(
    client: &deadpool_postgres::Object,
    pooler: bool,
    sql: &str,
    params: &[Param<'_>],
) -> Result<Vec<Row>, tokio_postgres::Error> {
    if pooler {
        return client.query_typed(sql, params).await;
    }
    let types: Vec<Type> = params.iter().map(|(_, t)| t.clone()).collect();
    let stmt = client.prepare_typed_cached(sql, &types).await?;
    let values: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
        params.iter().map(|(v, _)| *v).collect();
    client.query(&stmt, &values).await
}
