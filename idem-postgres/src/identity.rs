//! One live process per worker id.
//!
//! The engine takes over a claim held by another incarnation of its own
//! worker id at once: that incarnation is its own predecessor, dead. Two
//! *live* processes under one id would each take the other's claims over
//! forever (no duplicate, since every write is fenced, but no progress
//! either). So the first claim of a worker id takes a session-level
//! advisory lock on the id's hash, on a connection of its own that lives
//! as long as the journal: a second live process finds the lock held and
//! is refused with [`Error::WorkerInUse`]. A process that dies (SIGKILL
//! included) loses its session and with it the lock, as soon as the server
//! sees the connection close; a machine that dies is noticed by the TCP
//! keepalives this session sets (about 10 s). After the connection breaks
//! (a database restart), the lock is taken again; if another process got
//! it meanwhile, this one is superseded and every later claim is refused.

use std::collections::HashMap;
use std::time::Duration;

use deadpool_postgres::tokio_postgres::{self, NoTls};

use idem_journal::error::Error;
use idem_journal::journal::Owner;

/// How long a registration retries a held lock before it refuses: the
/// session of a process that just ended (or of a journal just dropped in
/// this process) may not have been closed by the server yet.
const SETTLE: Duration = Duration::from_secs(2);
const RETRY: Duration = Duration::from_millis(50);

/// The `application_name` of the sessions that hold worker ids.
pub const APPLICATION_NAME: &str = "idem worker id";

/// The lock key of worker id `worker`: FNV-1a over a prefix and the id.
pub fn lock_key(worker: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in b"idem-worker\0".iter().chain(worker.as_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h as i64
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    /// This journal's session holds the lock (or is taking it again after
    /// its connection broke).
    Held,
    /// Another process took the id while this one's connection was down.
    Superseded,
}

struct Entry {
    hold: std::sync::Arc<std::sync::Mutex<Hold>>,
    task: tokio::task::JoinHandle<()>,
}

/// The worker ids this journal holds.
pub(crate) struct Identities {
    config: tokio_postgres::Config,
    location: String,
    held: tokio::sync::Mutex<HashMap<String, Entry>>,
}

impl Identities {
    pub(crate) fn new(mut config: tokio_postgres::Config, location: String) -> Identities {
        // Named, so that an operator looking at pg_stat_activity sees what
        // the idle session is for.
        config.application_name(APPLICATION_NAME);
        Identities {
            config,
            location,
            held: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    /// Makes sure this journal holds `owner`'s worker id before it claims
    /// anything for it: taken on first use, refused when another live
    /// process holds it.
    pub(crate) async fn ensure(&self, owner: &Owner) -> Result<(), Error> {
        let mut held = self.held.lock().await;
        if let Some(entry) = held.get(&*owner.worker) {
            return match *entry.hold.lock().unwrap_or_else(|p| p.into_inner()) {
                Hold::Held => Ok(()),
                Hold::Superseded => Err(self.in_use(&owner.worker)),
            };
        }
        let key = lock_key(&owner.worker);
        let client = self
            .take(key)
            .await?
            .ok_or_else(|| self.in_use(&owner.worker))?;
        let hold = std::sync::Arc::new(std::sync::Mutex::new(Hold::Held));
        let task = tokio::spawn(keep(
            self.config.clone(),
            client,
            key,
            hold.clone(),
            owner.worker.to_string(),
        ));
        held.insert(owner.worker.to_string(), Entry { hold, task });
        Ok(())
    }

    /// A session holding lock `key`, or `None` if another session keeps it
    /// past [`SETTLE`].
    async fn take(&self, key: i64) -> Result<Option<Session>, Error> {
        let started = tokio::time::Instant::now();
        let session = connect(&self.config).await.map_err(|e| {
            crate::rows::failure("connect for the worker id's lock", &self.location, e)
        })?;
        loop {
            match try_lock(&session.0, key).await {
                Ok(true) => return Ok(Some(session)),
                Ok(false) if started.elapsed() < SETTLE => tokio::time::sleep(RETRY).await,
                Ok(false) => return Ok(None),
                Err(e) => {
                    return Err(crate::rows::failure(
                        "lock the worker id",
                        &self.location,
                        e,
                    ))
                }
            }
        }
    }

    fn in_use(&self, worker: &str) -> Error {
        Error::WorkerInUse {
            worker: worker.to_string(),
            location: self.location.clone(),
        }
    }
}

impl Drop for Identities {
    fn drop(&mut self) {
        // The sessions close with their tasks, which releases the locks.
        for entry in self.held.get_mut().values() {
            entry.task.abort();
        }
    }
}

/// A client and the task driving its connection.
struct Session(tokio_postgres::Client, tokio::task::JoinHandle<()>);

impl Drop for Session {
    fn drop(&mut self) {
        self.1.abort();
    }
}

async fn connect(config: &tokio_postgres::Config) -> Result<Session, tokio_postgres::Error> {
    let (client, connection) = config.connect(NoTls).await?;
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    // A dead machine's session must not hold the id for hours: the server
    // probes an idle connection after 5 s, then every 2 s, 3 times. (Ignored
    // on a unix socket, where the kernel reports a dead peer at once.)
    let _ = client
        .batch_execute(
            "SET tcp_keepalives_idle = 5; SET tcp_keepalives_interval = 2; \
             SET tcp_keepalives_count = 3",
        )
        .await;
    Ok(Session(client, driver))
}

async fn try_lock(
    client: &tokio_postgres::Client,
    key: i64,
) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .query_one("SELECT pg_try_advisory_lock($1)", &[&key])
        .await?
        .get(0))
}

/// Keeps the lock: waits for the session to end (the database restarted,
/// the connection broke), then takes the lock again on a new one; if another
/// session holds it by then, this journal is superseded for that id.
async fn keep(
    config: tokio_postgres::Config,
    mut session: Session,
    key: i64,
    hold: std::sync::Arc<std::sync::Mutex<Hold>>,
    worker: String,
) {
    let mut backoff = Duration::from_millis(20);
    loop {
        // The driver ends when the connection does.
        let _ = (&mut session.1).await;
        loop {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
            let Ok(next) = connect(&config).await else {
                continue;
            };
            match try_lock(&next.0, key).await {
                Ok(true) => {
                    session = next;
                    backoff = Duration::from_millis(20);
                    break;
                }
                Ok(false) => {
                    tracing::error!(
                        target: "idem::journal",
                        worker = %worker,
                        "another live process took this worker id while the connection to the \
                         database was down: this process claims nothing more under it"
                    );
                    *hold.lock().unwrap_or_else(|p| p.into_inner()) = Hold::Superseded;
                    return;
                }
                Err(_) => continue,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_keys_are_stable_and_differ_by_worker() {
        assert_eq!(lock_key("pod-7"), lock_key("pod-7"));
        assert_ne!(lock_key("pod-7"), lock_key("pod-8"));
        assert_ne!(lock_key(""), 0x6964_656d, "the schema migration's lock");
    }
}
