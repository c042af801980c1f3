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
/// no idem journal: the CLI never creates one (workers do, when they first
/// connect), so a mistyped database name is reported rather than given
/// idem's tables and shown as an empty journal.
pub async fn connect(url: &str, keep: Option<Duration>) -> Result<Runtime, CliError> {
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
    probe(&config, &location).await?;
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
            ..PostgresOptions::default()
        })
        .connect()
        .await
        .map_err(|e| match &e {
            idem_runtime::Error::Storage { detail, .. } => {
                let error = CliError::unreachable(format!(
                    "cannot open the PostgreSQL journal at {location}: {e}"
                ));
                // SQLSTATE 42501, insufficient_privilege.
                if detail.contains("(42501)") {
                    error.hint(
                        "idem connects as a worker does, which checks the journal's tables \
                         with CREATE ... IF NOT EXISTS: its role needs the workers' privileges \
                         (on the idem_* tables, and CREATE on their schema)",
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

/// Reaches the database and looks for the journal's schema table, without
/// creating anything.
async fn probe(config: &Config, location: &str) -> Result<(), CliError> {
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
        .query_one("SELECT to_regclass('idem_schema')::text", &[])
        .await
        .map_err(unreachable)
        .map(|row| row.get::<_, Option<String>>(0));
    drop(client);
    let _ = task.await;
    if found?.is_none() {
        return Err(CliError::unreachable(format!(
            "no idem journal at {location}: the database has no idem_schema table"
        ))
        .hint(
            "check the database name (and search_path) in the URL; a worker creates the \
             journal's tables when it first connects (Runtime::connect), idem never does",
        ));
    }
    Ok(())
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
