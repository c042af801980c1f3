//! The check of [`PostgresOptions::synchronous_standby`](crate::PostgresOptions::synchronous_standby):
//! the server must be configured to acknowledge no commit before a
//! synchronous standby has it.
//!
//! **What is checked: the configuration, not the standby's connection.**
//! A server with a standby named in `synchronous_standby_names` and
//! `synchronous_commit` at `on`, `remote_apply` or `remote_write` holds
//! every commit until a synchronous standby confirms it; with none
//! connected, commits wait (the journal's writes do not return, so no
//! provider is called after them). That already fails closed: nothing is
//! acknowledged that only the primary has, which is what a failover would
//! lose. Refusing also when no standby is connected *right now* would add
//! nothing to that, and would turn a standby's brief reconnect (or the
//! minutes before a new one is built after a failover) into workers that
//! cannot start at all; it would also need the role to read
//! `pg_stat_replication`'s state (`pg_read_all_stats`). So a server
//! without the configuration is refused, and one with it but no
//! synchronous standby connected at connect time is only logged (a
//! warning: its commits will wait).
//!
//! **When:** at connect, and on every new connection of the pool (a
//! `post_create` hook: one round trip per connection, which lives long),
//! so that after a failover a promoted server that runs without a
//! synchronous standby is refused too. The settings are read in the
//! journal's own session, so a role's or a database's `synchronous_commit`
//! counts. (The journal's decision writes set `synchronous_commit = on` for
//! their own transaction; the session's setting is what its barrier, which
//! makes the asynchronously committed events durable, commits with.)

use deadpool_postgres::tokio_postgres::{self, SimpleQueryMessage};
use deadpool_postgres::{Hook, HookError};

/// The settings, in the journal's session: one round trip, no prepared
/// statement (behind a pooler too).
const SETTINGS: &str = "SELECT current_setting('synchronous_standby_names'), \
     current_setting('synchronous_commit')";

/// The `synchronous_commit` values under which a commit waits for the
/// synchronous standby (`on`: flushed there; `remote_apply`: applied;
/// `remote_write`: written to its operating system, which survives the
/// primary's crash but not the standby's machine's at the same time).
const WAITING: [&str; 3] = ["on", "remote_apply", "remote_write"];

/// What the server reports, when it does not make commits wait for a
/// synchronous standby: `Some("synchronous_standby_names = '' and ...")`.
pub(crate) fn refusal(names: &str, commit: &str) -> Option<String> {
    let configured = !names.trim().is_empty();
    let waits = WAITING.contains(&commit.trim());
    (!configured || !waits).then(|| {
        format!("synchronous_standby_names = '{names}' and synchronous_commit = '{commit}'")
    })
}

/// Reads the settings on `client`: `Ok(Some(reported))` if the server is
/// not configured for a synchronous standby.
pub(crate) async fn check(
    client: &tokio_postgres::Client,
) -> Result<Option<String>, tokio_postgres::Error> {
    let messages = client.simple_query(SETTINGS).await?;
    let row = messages.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(row) => Some(row),
        _ => None,
    });
    Ok(match row {
        Some(row) => refusal(row.get(0).unwrap_or(""), row.get(1).unwrap_or("")),
        None => Some("no settings (the query returned no row)".to_string()),
    })
}

/// How many standbys are connected as synchronous (`sync` or `quorum`)
/// now, as this role may see them (`None` when it may not read
/// `pg_stat_replication`'s states, or the query failed): for the warning
/// at connect only.
pub(crate) async fn connected(client: &tokio_postgres::Client) -> Option<u64> {
    let messages = client
        .simple_query(
            "SELECT count(*) FILTER (WHERE sync_state IN ('sync', 'quorum')), \
             count(*) FILTER (WHERE sync_state IS NULL) FROM pg_stat_replication",
        )
        .await
        .ok()?;
    messages.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(row) => {
            let sync: u64 = row.get(0)?.parse().ok()?;
            let hidden: u64 = row.get(1)?.parse().ok()?;
            (sync > 0 || hidden == 0).then_some(sync)
        }
        _ => None,
    })
}

/// The pool's hook: every new connection is checked before it is used;
/// a refusal is [`HookError::Message`] with what the server reported
/// (`rows::pool_failure` makes it [`Error::NoSynchronousStandby`](idem_journal::error::Error::NoSynchronousStandby)).
pub(crate) fn hook() -> Hook {
    Hook::async_fn(|client, _| {
        Box::pin(async move {
            match check(client).await {
                Ok(None) => Ok(()),
                Ok(Some(reported)) => Err(HookError::message(reported)),
                Err(e) => Err(HookError::Backend(e)),
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::refusal;

    #[test]
    fn only_a_named_standby_with_waiting_commits_is_accepted() {
        assert_eq!(refusal("idem_b", "on"), None);
        assert_eq!(refusal("FIRST 1 (a, b)", "remote_apply"), None);
        assert_eq!(refusal("ANY 1 (a, b)", "remote_write"), None);
        let none = refusal("", "on").unwrap();
        assert!(none.contains("synchronous_standby_names = ''"), "{none}");
        let local = refusal("idem_b", "local").unwrap();
        assert!(local.contains("synchronous_commit = 'local'"), "{local}");
        assert!(refusal("idem_b", "off").is_some());
    }
}
