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
//!
//! **Behind a pooler** in transaction mode there is no session to hold a
//! lock: the next statement may run in another server session, and a lock
//! taken in one stays with that session, which the pooler hands to other
//! clients. There the id is a *lease row* instead: `idem_worker_ids` holds,
//! per worker id, the journal that has it (a random holder token drawn
//! when the journal is opened) and until when, on the database's clock
//! (`clock_timestamp()`). Taking the id is one statement that inserts the
//! row, or takes it over only if it is this holder's or has expired; the
//! journal renews it every third of its lease (the claims' lease,
//! [`PostgresOptions::lease`](crate::PostgresOptions::lease)) with the same
//! statement. Why two live processes cannot share an id:
//!
//! - the row has one holder at any instant of the database's clock, and
//!   changes hands only once the lease has run out on that clock;
//! - every write that takes a claim under the id requires, in the same
//!   statement, that this holder's lease on the row is live at that
//!   statement's instant (journal.rs's `FENCE`). A process that was paused
//!   or cut off past its lease, and whose id another process took
//!   meanwhile, claims nothing more: its takeovers fail their condition,
//!   it finds the row held by another and is refused with
//!   [`Error::WorkerInUse`] from then on, as after a lost session lock;
//! - it also stops on its own clock: the lease counts as lapsed locally
//!   nine tenths of a lease after the renewal that set it was *sent*, and
//!   a lapsed lease is taken again before the next claim.
//!
//! What it costs: a process that dies holding the id leaves the row until
//! its lease runs out, so its restart under the same id waits up to one
//! lease before it starts (a journal dropped in a live process deletes its
//! rows at once). A database migrated by a build without the table gets it
//! at the next migration; connecting without migrating to one that lacks
//! it fails the first claim, closed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::tokio_postgres::{self, NoTls};
use deadpool_postgres::Pool;
use tokio::time::Instant;

use crate::rows::{failure, pool_failure, Type};
use idem_journal::error::Error;
use idem_journal::journal::Owner;

/// How long a registration retries a held lock before it refuses: the
/// session of a process that just ended (or of a journal just dropped in
/// this process) may not have been closed by the server yet.
const SETTLE: Duration = Duration::from_secs(2);
const RETRY: Duration = Duration::from_millis(50);

/// The `application_name` of the sessions that hold worker ids.
pub const APPLICATION_NAME: &str = "idem worker id";

/// Takes or renews worker id `$1` for holder `$2` for `$3` ms: a row if
/// the id is this holder's now.
const TAKE: &str = "INSERT INTO idem_worker_ids AS w (worker, holder, lease_until)
    VALUES ($1, $2, clock_timestamp() + $3::float8 * interval '1 millisecond')
    ON CONFLICT (worker) DO UPDATE SET holder = EXCLUDED.holder, lease_until = EXCLUDED.lease_until
    WHERE w.holder = EXCLUDED.holder OR w.lease_until <= clock_timestamp()
    RETURNING 1";

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
    /// This journal holds the id (or is taking it again after its
    /// connection broke), until the instant given, if any (a lease row).
    Held(Option<Instant>),
    /// Another process took the id while this one's connection was down
    /// (or its lease had run out).
    Superseded,
}

type Shared = Arc<Mutex<Hold>>;

fn get(hold: &Shared) -> Hold {
    *hold.lock().unwrap_or_else(|p| p.into_inner())
}

fn set(hold: &Shared, to: Hold) {
    *hold.lock().unwrap_or_else(|p| p.into_inner()) = to;
}

struct Entry {
    hold: Shared,
    task: tokio::task::JoinHandle<()>,
}

/// How ids are held.
enum Mode {
    /// A session advisory lock on a connection of its own.
    Session(Box<tokio_postgres::Config>),
    /// A lease row, written through the journal's pool (behind a pooler).
    Leased { pool: Pool, lease: Duration },
}

/// The worker ids this journal holds.
pub(crate) struct Identities {
    mode: Mode,
    location: String,
    /// This journal's holder token (lease rows).
    holder: String,
    held: tokio::sync::Mutex<HashMap<String, Entry>>,
}

/// A token no other journal draws: the process, the time, and the
/// standard library's random hash keys.
fn holder_token() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut parts = [0u64; 2];
    for (i, part) in parts.iter_mut().enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(i as u64);
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        *part = h.finish();
    }
    format!("{}-{:016x}{:016x}", std::process::id(), parts[0], parts[1])
}

impl Identities {
    pub(crate) fn new(mut config: tokio_postgres::Config, location: String) -> Identities {
        // Named, so that an operator looking at pg_stat_activity sees what
        // the idle session is for.
        config.application_name(APPLICATION_NAME);
        Identities {
            mode: Mode::Session(Box::new(config)),
            location,
            holder: holder_token(),
            held: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    /// Ids held with lease rows of `lease`, through `pool` (behind a
    /// pooler).
    pub(crate) fn leased(pool: Pool, location: String, lease: Duration) -> Identities {
        Identities {
            mode: Mode::Leased { pool, lease },
            location,
            holder: holder_token(),
            held: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    /// This journal's holder token, for the writes' fence.
    pub(crate) fn holder(&self) -> &str {
        &self.holder
    }

    /// Makes sure this journal holds `owner`'s worker id before it claims
    /// anything for it: taken on first use, refused when another live
    /// process holds it.
    pub(crate) async fn ensure(&self, owner: &Owner) -> Result<(), Error> {
        let mut held = self.held.lock().await;
        if let Some(entry) = held.get(&*owner.worker) {
            return match get(&entry.hold) {
                Hold::Held(until) if until.is_none_or(|u| Instant::now() < u) => Ok(()),
                Hold::Held(_) => self.take_again(&owner.worker, &entry.hold).await,
                Hold::Superseded => Err(self.in_use(&owner.worker)),
            };
        }
        let entry = match &self.mode {
            Mode::Session(config) => {
                let key = lock_key(&owner.worker);
                let client = self
                    .take(config, key)
                    .await?
                    .ok_or_else(|| self.in_use(&owner.worker))?;
                let hold = Arc::new(Mutex::new(Hold::Held(None)));
                let task = tokio::spawn(keep(
                    (**config).clone(),
                    client,
                    key,
                    hold.clone(),
                    owner.worker.to_string(),
                ));
                Entry { hold, task }
            }
            Mode::Leased { pool, lease } => {
                // A predecessor that died holding the id keeps it until its
                // lease runs out.
                let deadline = Instant::now() + *lease + SETTLE;
                let until = loop {
                    let sent = Instant::now();
                    if lease_take(pool, &owner.worker, &self.holder, *lease, &self.location).await?
                    {
                        break valid_until(sent, *lease);
                    }
                    if Instant::now() >= deadline {
                        return Err(self.in_use(&owner.worker));
                    }
                    tokio::time::sleep(RETRY).await;
                };
                let hold = Arc::new(Mutex::new(Hold::Held(Some(until))));
                let task = tokio::spawn(renew_lease(
                    pool.clone(),
                    *lease,
                    owner.worker.to_string(),
                    self.holder.clone(),
                    hold.clone(),
                    self.location.clone(),
                ));
                Entry { hold, task }
            }
        };
        held.insert(owner.worker.to_string(), entry);
        Ok(())
    }

    /// A lease row that lapsed locally, taken again if nobody else took it.
    async fn take_again(&self, worker: &str, hold: &Shared) -> Result<(), Error> {
        let Mode::Leased { pool, lease } = &self.mode else {
            return Ok(());
        };
        let sent = Instant::now();
        if lease_take(pool, worker, &self.holder, *lease, &self.location).await? {
            set(hold, Hold::Held(Some(valid_until(sent, *lease))));
            Ok(())
        } else {
            superseded(worker, hold);
            Err(self.in_use(worker))
        }
    }

    /// After a write that takes a claim under `owner` changed nothing
    /// (lease rows only): true if this journal's lease had run out on the
    /// database's clock and is now taken again (the write may be run once
    /// more), false if it is live (the write's own condition failed);
    /// [`Error::WorkerInUse`] if another process holds the id.
    pub(crate) async fn recheck(&self, owner: &Owner) -> Result<bool, Error> {
        let Mode::Leased { pool, .. } = &self.mode else {
            return Ok(false);
        };
        let client = pool
            .get()
            .await
            .map_err(|e| pool_failure("connect", &self.location, e))?;
        let live = client
            .query_typed(
                "SELECT 1 FROM idem_worker_ids
                 WHERE worker = $1 AND holder = $2 AND lease_until > clock_timestamp()",
                &[
                    (&&*owner.worker, Type::TEXT),
                    (&self.holder.as_str(), Type::TEXT),
                ],
            )
            .await
            .map_err(|e| failure("check the worker id's lease", &self.location, e))?;
        drop(client);
        if !live.is_empty() {
            return Ok(false);
        }
        let held = self.held.lock().await;
        let Some(entry) = held.get(&*owner.worker) else {
            return Ok(false);
        };
        self.take_again(&owner.worker, &entry.hold).await?;
        Ok(true)
    }

    /// A session holding lock `key`, or `None` if another session keeps it
    /// past [`SETTLE`].
    async fn take(
        &self,
        config: &tokio_postgres::Config,
        key: i64,
    ) -> Result<Option<Session>, Error> {
        let started = tokio::time::Instant::now();
        let session = connect(config)
            .await
            .map_err(|e| failure("connect for the worker id's lock", &self.location, e))?;
        loop {
            match try_lock(&session.0, key).await {
                Ok(true) => return Ok(Some(session)),
                Ok(false) if started.elapsed() < SETTLE => tokio::time::sleep(RETRY).await,
                Ok(false) => return Ok(None),
                Err(e) => return Err(failure("lock the worker id", &self.location, e)),
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
        // Lease rows are deleted, so that a successor under the same id
        // need not wait for them to run out (should this not get through,
        // they do run out).
        if let Mode::Leased { pool, .. } = &self.mode {
            if self.held.get_mut().is_empty() {
                return;
            }
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let (pool, holder) = (pool.clone(), self.holder.clone());
                runtime.spawn(async move {
                    if let Ok(client) = pool.get().await {
                        let _ = client
                            .query_typed(
                                "DELETE FROM idem_worker_ids WHERE holder = $1",
                                &[(&holder.as_str(), Type::TEXT)],
                            )
                            .await;
                    }
                });
            }
        }
    }
}

/// Until when a lease renewed by a statement sent at `sent` counts as held
/// here: the database set its end one lease after it ran the statement,
/// which was after `sent`; a tenth is left for the clocks' rates.
fn valid_until(sent: Instant, lease: Duration) -> Instant {
    sent + lease * 9 / 10
}

fn superseded(worker: &str, hold: &Shared) {
    if get(hold) != Hold::Superseded {
        tracing::error!(
            target: "idem::journal",
            worker = %worker,
            "another live process took this worker id while this one's lease on it had run \
             out: this process claims nothing more under it"
        );
    }
    set(hold, Hold::Superseded);
}

/// Takes or renews the lease row of `worker` for `holder`: whether it is
/// this holder's now.
async fn lease_take(
    pool: &Pool,
    worker: &str,
    holder: &str,
    lease: Duration,
    location: &str,
) -> Result<bool, Error> {
    let client = pool
        .get()
        .await
        .map_err(|e| pool_failure("connect", location, e))?;
    let rows = client
        .query_typed(
            TAKE,
            &[
                (&worker, Type::TEXT),
                (&holder, Type::TEXT),
                (&(lease.as_millis() as f64), Type::FLOAT8),
            ],
        )
        .await
        .map_err(|e| failure("take the worker id's lease", location, e))?;
    Ok(!rows.is_empty())
}

/// Renews a lease row every third of a lease until the journal is dropped
/// or another process holds the row. A renewal that fails (the database is
/// down) is tried again at the next tick; meanwhile the lease lapses here
/// and the next claim takes it again first.
async fn renew_lease(
    pool: Pool,
    lease: Duration,
    worker: String,
    holder: String,
    hold: Shared,
    location: String,
) {
    loop {
        tokio::time::sleep(lease / 3).await;
        if get(&hold) == Hold::Superseded {
            return;
        }
        let sent = Instant::now();
        match lease_take(&pool, &worker, &holder, lease, &location).await {
            Ok(true) => {
                if let Hold::Held(_) = get(&hold) {
                    set(&hold, Hold::Held(Some(valid_until(sent, lease))));
                }
            }
            Ok(false) => {
                superseded(&worker, &hold);
                return;
            }
            Err(_) => {}
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
    hold: Shared,
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
                    set(&hold, Hold::Superseded);
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
