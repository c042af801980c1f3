//! `--postgres URL`: the shared PostgreSQL journal, which the CLI opens as
//! one more client of the database. Workers share that journal by design,
//! so there is no process to ask and nothing to wait for: the CLI reads and
//! writes it as a worker would, under a worker id of its own.

use std::time::Duration;

use idem_runtime::{PostgresJournal, PostgresOptions, Runtime};
use tokio_postgres::{Config, NoTls};

use crate::error::CliError;

/// How long opening a connection may take: an operator at a terminal wants
/// to hear about an unreachable database soon (the HTTP client's connect
/// timeout is the same).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How often `audit --follow` reads the shared stream for new events. The
/// events come from other processes, whose writes this process is not told
/// about (the journal notifies only waiters on records), so it polls: one
/// indexed range read per interval.
pub const FOLLOW_POLL: Duration = Duration::from_millis(250);

/// How often `audit --follow` tries again while the database cannot be
/// reached (each try waits up to the connect timeout).
pub const FOLLOW_RETRY: Duration = Duration::from_secs(1);

/// The CLI's worker id: says it is the CLI, and which one. Claims carry a
/// worker id, and a worker that starts under an id takes over at once the
/// calls held under that id, so the CLI must never use a real worker's.
pub fn worker_id() -> String {
    format!("idem-cli@{}-{}", host_name(), std::process::id())
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "localhost".into())
}

/// Connects to the journal at `url`. `keep`: the retention
/// `prune` uses (the CLI defines no tools, so no dedupe_window raises it).
///
/// Fails with a usage error (exit 2) when `url` is not a connection string,
/// and as unreachable (exit 3) when the database cannot be reached or holds
/// no idem journal: only [`migrate`] creates one (and workers, when they
/// first connect), so a mistyped database name is reported rather than
/// given idem's tables and shown as an empty journal. It changes no schema,
/// so the role needs only the rows' privileges.
pub async fn connect(url: &str, keep: Option<Duration>) -> Result<Runtime, CliError> {
    let (config, location) = parse(url)?;
    if !schema_exists(&config, &location).await? {
        return Err(no_journal(&location));
    }
    let mut builder = Runtime::builder();
    if let Some(keep) = keep {
        builder = builder.retention(keep);
    }
    let rt = builder
        .postgres(url)
        .worker_id(worker_id())
        .postgres_options(PostgresOptions {
            // One command at a time: two connections are plenty (besides
            // the journal's listening one).
            pool_size: 2,
            connect_timeout: CONNECT_TIMEOUT,
            // The CLI reads and writes rows; creating the schema is
            // `idem migrate`'s (or a worker's) business, so the operator's
            // role needs no CREATE privilege.
            migrate: false,
            ..PostgresOptions::default()
        })
        .connect()
        .await
        .map_err(|e| match &e {
            idem_runtime::Error::Storage { .. } => {
                let error = CliError::unreachable(format!(
                    "cannot open the PostgreSQL journal at {location}: {e}"
                ));
                if is_insufficient_privilege(&e) {
                    error.hint(
                        "idem reads and writes the journal's rows as a worker does: its role \
                         needs SELECT, INSERT, UPDATE and DELETE on the idem_* tables and \
                         USAGE on the idem_versions sequence",
                    )
                } else {
                    error
                }
            }
            idem_runtime::Error::Usage(message) => {
                CliError::usage(format!("--postgres: {message}"))
            }
            e => CliError::runtime(e),
        })?;
    Ok(rt)
}

/// What `idem migrate` found and did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Migrated {
    /// The database, without the password.
    pub location: String,
    /// The schema's version, now.
    pub schema_version: i32,
    /// Whether this run created it (false: it was there already).
    pub created: bool,
}

/// `idem --postgres URL migrate`: creates the journal's schema, or checks
/// that the one there is a version this build reads. The one command that
/// creates tables, and idempotent: workers that connect at the same time
/// are not disturbed (creation runs under an advisory lock).
pub async fn migrate(url: &str) -> Result<Migrated, CliError> {
    let (config, location) = parse(url)?;
    let existed = schema_exists(&config, &location).await?;
    let schema_version = PostgresJournal::migrate(url).await.map_err(|e| {
        let error = CliError::runtime(&e);
        match &e {
            e if is_insufficient_privilege(e) => error.hint(
                "creating the schema needs CREATE on the database's schema (public, or \
                     the first of the URL's search_path): run idem migrate as the database's \
                     owner, and let the workers and operators use a role with the rows' \
                     privileges",
            ),
            _ => error,
        }
    })?;
    Ok(Migrated {
        location,
        schema_version,
        created: !existed,
    })
}

/// Whether the database refused for want of a privilege (SQLSTATE 42501,
/// insufficient_privilege).
fn is_insufficient_privilege(e: &idem_runtime::Error) -> bool {
    e.sqlstate() == Some("42501")
}

/// The URL parsed, with the CLI's connect timeout and application name, and
/// the location to name in messages.
fn parse(url: &str) -> Result<(Config, String), CliError> {
    let mut config: Config = url.parse().map_err(|e| {
        CliError::usage(format!(
            "--postgres: not a PostgreSQL connection string: {}",
            with_causes(&e)
        ))
        .hint(
            "e.g. postgres://idem@/idem?host=/run/idem-pg (a unix socket directory) or \
             postgres://idem:PASSWORD@db.internal:5432/idem",
        )
    })?;
    config.connect_timeout(CONNECT_TIMEOUT);
    if config.get_application_name().is_none() {
        config.application_name("idem-cli");
    }
    // Parsed above, so this cannot fail; never the password.
    let location = PostgresJournal::redacted_url(url).unwrap_or_default();
    Ok((config, location))
}

/// Reaches the database and looks for the journal's schema table, without
/// creating anything.
async fn schema_exists(config: &Config, location: &str) -> Result<bool, CliError> {
    let unreachable = |e: tokio_postgres::Error| {
        CliError::unreachable(format!(
            "cannot reach the PostgreSQL journal at {location}: {}",
            describe(&e)
        ))
        .hint(
            "check that the server runs and that the URL's host (for a unix socket: \
             ?host=/socket/dir), port, user and database are right",
        )
    };
    let (client, connection) = config.connect(NoTls).await.map_err(unreachable)?;
    let task = tokio::spawn(connection);
    let found = client
        .query_typed_one("SELECT to_regclass('idem_schema')::text", &[])
        .await
        .map_err(unreachable)
        .map(|row| row.get::<_, Option<String>>(0));
    drop(client);
    let _ = task.await;
    Ok(found?.is_some())
}

fn no_journal(location: &str) -> CliError {
    CliError::unreachable(format!(
        "no idem journal at {location}: the database has no idem_schema table"
    ))
    .hint(
        "check the database name (and search_path) in the URL; the journal's tables are \
         created by `idem --postgres URL migrate` or by a worker when it first connects \
         (Runtime::connect), never by the other commands",
    )
}

/// The error with the server's message, when the server said something,
/// else with its causes (tokio-postgres's own message alone is "error
/// connecting to server", without the why).
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => with_causes(e),
    }
}

/// `error: cause: its cause`.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_location_leaves_the_password_out() {
        let at = |url| PostgresJournal::redacted_url(url).unwrap();
        assert_eq!(
            at("postgres://ops:s3cret@db.internal:6432/idem"),
            "postgres://ops@db.internal:6432/idem"
        );
        assert_eq!(
            at("postgres://postgres@/idem?host=/run/idem-pg"),
            "postgres://postgres@/run/idem-pg/idem"
        );
    }

    #[test]
    fn the_worker_id_says_it_is_the_cli() {
        let id = worker_id();
        assert!(id.starts_with("idem-cli@"), "{id}");
        assert!(id.ends_with(&format!("-{}", std::process::id())), "{id}");
    }
}
