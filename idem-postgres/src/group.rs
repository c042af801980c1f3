//! Group commit across calls: concurrent immediate writes of one process
//! share a transaction, so that they share its commit (one WAL flush, one
//! round trip for the lot instead of one each).
//!
//! A write that finds fewer than [`LEADERS`] groups being written starts
//! one at once (a single call waits for nothing, and a group of one is the
//! lone statement it always was). Otherwise it queues; the next leader to
//! finish takes the queue (up to [`MOST`] writes) and runs it as one
//! transaction on one connection, its statements pipelined between
//! `BEGIN` and `COMMIT`. Each write is
//! the statement it would have been alone, with the same conditions
//! (versions, fencing), so sharing a transaction changes no decision:
//!
//! - The statements run in key order, so two groups (of this process or
//!   of others) lock their rows in the same order and never deadlock
//!   each other. Writes of one key keep their arrival order.
//! - The events of a group share its transaction id, which numbers them
//!   (`xid << 16 | index`): each statement is given its offset in the
//!   group, so their numbers are distinct and in statement order, and the
//!   stream's commit order holds (a group commits as one transaction).
//! - If any statement fails, the transaction is rolled back and every write
//!   of the group fails with an error (the one that failed with its own):
//!   nothing of it happened, which the engine treats as it treats any
//!   failed write (it reads back before it decides). A `COMMIT` whose
//!   answer is lost leaves every write of the group unknown, like a lone
//!   write's lost answer.
//! - Leaders run in spawned tasks: a caller that stops waiting (its future
//!   dropped) stops no one else's write. Its own write is skipped if it was
//!   still queued, and runs to its end if it was already sent.
//! - A leader dropped before it finished (its runtime shut down under it)
//!   gives up its place and wakes the writes still queued: the first to
//!   run starts a leader on its own runtime. Without that, writes queued
//!   behind leaders of a runtime that went away waited for ever.
//!
//! Only immediate writes are grouped: an asynchronously committed one
//! would make the whole transaction asynchronous, or wait for a flush it
//! did not ask for.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use deadpool_postgres::tokio_postgres::Row;
use deadpool_postgres::Pool;
use tokio::sync::{oneshot, Notify};

use crate::rows::{failure, pool_failure, Type};
use idem_journal::error::Error;

/// Groups written at once (each on its own connection). Two measured best
/// on two cores (64 concurrent calls: one 0.7 x half the server's
/// single-row ceiling, two 0.95-1.05 x, four 0.8-0.9 x): fewer, larger
/// groups spend less of the server's time on transactions.
pub(crate) const LEADERS: usize = 2;

/// Writes in one group.
pub(crate) const MOST: usize = 64;

/// Events in one group: their numbers must fit below `1 << 16`.
const EVENTS: usize = (1 << 16) - 1;

/// One write, owning what its statement is given (`$1..$16`; `$16` is the
/// offset of its events' numbers in the group).
pub(crate) struct Job {
    pub sql: Arc<str>,
    pub space: i16,
    pub key: Vec<u8>,
    pub expected: i64,
    pub body: Vec<u8>,
    pub escalated: bool,
    pub code: i32,
    pub worker: Option<String>,
    pub incarnation: Option<i64>,
    pub lease: f64,
    pub keys: Vec<Option<Vec<u8>>>,
    pub bytes: Vec<Vec<u8>>,
    pub durable: bool,
    pub payload: String,
    pub commit: &'static str,
    pub holder: String,
}

/// What a write's statement returned: its first row, if any.
pub(crate) type Outcome = Result<Option<Row>, Error>;

struct Waiting {
    job: Job,
    reply: oneshot::Sender<Outcome>,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Waiting>,
    /// Groups being written now.
    leaders: usize,
}

/// The writes of one journal waiting to share a transaction.
pub(crate) struct Group {
    queue: Mutex<Queue>,
    /// Woken when a leader is dropped before it finished (see [`Leading`]).
    vacated: Notify,
    pool: Pool,
    location: String,
    pooler: bool,
}

impl Group {
    pub(crate) fn new(pool: Pool, location: String, pooler: bool) -> Arc<Group> {
        Arc::new(Group {
            queue: Mutex::default(),
            vacated: Notify::new(),
            pool,
            location,
            pooler,
        })
    }

    /// Runs `job`, alone or in a group.
    pub(crate) async fn write(self: &Arc<Self>, job: Job) -> Outcome {
        let (reply, mut answer) = oneshot::channel();
        let mut job = Some(Waiting { job, reply });
        loop {
            // Registered before the queue is looked at: a leader dropped
            // after this wakes it, one dropped before has left its place.
            let vacated = self.vacated.notified();
            tokio::pin!(vacated);
            vacated.as_mut().enable();
            {
                let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                queue.waiting.extend(job.take());
                if !queue.waiting.is_empty() && queue.leaders < LEADERS {
                    queue.leaders += 1;
                    tokio::spawn(Arc::clone(self).lead());
                }
            }
            tokio::select! {
                biased;
                outcome = &mut answer => {
                    return outcome.unwrap_or_else(|_| {
                        Err(Error::storage(
                            "write a record",
                            &self.location,
                            "the task writing it stopped before it answered; the write may or may not have happened",
                        ))
                    });
                }
                () = &mut vacated => {}
            }
        }
    }

    /// Writes groups until none is waiting.
    async fn lead(self: Arc<Self>) {
        // Counted out however the task ends: a leader dropped mid-group (its
        // runtime shutting down) must not keep its place, or writes would
        // queue with nobody to take them. Its group's callers get the
        // "stopped before it answered" error.
        let mut leading = Leading {
            group: &self,
            counted: true,
        };
        loop {
            let group = {
                let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                let group = take(&mut queue.waiting);
                if group.is_empty() {
                    // Under the lock that saw the queue empty: a write
                    // queued after this starts a leader of its own.
                    queue.leaders -= 1;
                    leading.counted = false;
                    return;
                }
                group
            };
            leading.group.run(group).await;
        }
    }

    async fn run(&self, mut group: Vec<Waiting>) {
        // Key order (stable: one key's writes keep their order).
        group.sort_by(|a, b| (a.job.space, &a.job.key).cmp(&(b.job.space, &b.job.key)));
        let (jobs, replies): (Vec<Job>, Vec<oneshot::Sender<Outcome>>) =
            group.into_iter().map(|w| (w.job, w.reply)).unzip();
        let outcomes = self.statements(&jobs).await;
        for (reply, outcome) in replies.into_iter().zip(outcomes) {
            let _ = reply.send(outcome);
        }
    }

    /// Runs the jobs (one alone, several in one transaction); an outcome
    /// each, in order.
    async fn statements(&self, jobs: &[Job]) -> Vec<Outcome> {
        let location = &self.location;
        let client = match self.pool.get().await {
            Ok(c) => c,
            Err(e) => return for_all(jobs.len(), pool_failure("connect", location, e)),
        };
        if jobs.len() == 1 {
            let rows = statement(&client, self.pooler, &jobs[0], 0).await;
            return vec![rows
                .map(|rows| rows.into_iter().next())
                .map_err(|e| failure("write a record", location, e))];
        }
        if !self.pooler {
            // Prepared before the pipeline, so that no statement in it
            // waits for its preparation while later ones are sent ahead.
            for job in jobs {
                if let Err(e) = client.prepare_typed_cached(&job.sql, &TYPES).await {
                    return for_all(jobs.len(), failure("write a record", location, e));
                }
            }
        }
        let mut sent: Vec<Pending<'_>> = Vec::with_capacity(jobs.len() + 2);
        sent.push(Box::pin(async {
            client.batch_execute("BEGIN").await.map(|()| Vec::new())
        }));
        let mut offset = 0i64;
        for job in jobs {
            sent.push(Box::pin(statement(&client, self.pooler, job, offset)));
            offset += job.bytes.len() as i64;
        }
        sent.push(Box::pin(async {
            client.batch_execute("COMMIT").await.map(|()| Vec::new())
        }));
        let mut done = in_order(sent).await;
        let committed = done.pop().expect("COMMIT's answer");
        let began = done.remove(0);
        if let Err(e) = began {
            return for_all(jobs.len(), failure("begin a group of writes", location, e));
        }
        if let Err(e) = committed {
            // Its answer is lost: every write of the group is unknown.
            return for_all(jobs.len(), failure("commit a group of writes", location, e));
        }
        let Some(first) = done.iter().position(Result::is_err) else {
            return done
                .into_iter()
                .map(|rows| Ok(rows.unwrap_or_default().into_iter().next()))
                .collect();
        };
        // A statement failed, so `COMMIT` rolled the transaction back:
        // nothing of the group happened.
        let Err(cause) = done.swap_remove(first) else {
            unreachable!("found as an error")
        };
        let cause = Arc::new(failure("write a record", location, cause));
        (0..jobs.len())
            .map(|i| {
                if i == first {
                    Err(shared(&cause))
                } else {
                    Err(Error::storage(
                        "write a record",
                        location,
                        format!(
                            "rolled back with the group of writes it shared a transaction \
                             with, another of which failed: {cause}"
                        ),
                    ))
                }
            })
            .collect()
    }
}

/// A statement sent, its rows to come.
type Pending<'a> = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = Result<Vec<Row>, deadpool_postgres::tokio_postgres::Error>>
            + Send
            + 'a,
    >,
>;

/// Awaits every future, polling them in their order each time: a
/// statement is sent at its first poll, so the statements reach the
/// server in this order.
async fn in_order(
    mut pending: Vec<Pending<'_>>,
) -> Vec<Result<Vec<Row>, deadpool_postgres::tokio_postgres::Error>> {
    let mut out: Vec<Option<_>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut waiting = false;
        for (future, slot) in pending.iter_mut().zip(out.iter_mut()) {
            if slot.is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *slot = Some(v),
                    std::task::Poll::Pending => waiting = true,
                }
            }
        }
        if waiting {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter()
        .map(|v| v.expect("every future is done"))
        .collect()
}

/// The same failure for each of `n` writes: the first gets it, the
/// others a copy (its variant and kind, SQLSTATE included, with it as the
/// cause).
fn for_all(n: usize, e: Error) -> Vec<Outcome> {
    let e = Arc::new(e);
    let mut out: Vec<Outcome> = (1..n).map(|_| Err(shared(&e))).collect();
    let first = Arc::try_unwrap(e).unwrap_or_else(|e| shared(&e));
    out.insert(0, Err(first));
    out
}

/// A copy of a failure shared by several writes.
fn shared(e: &Arc<Error>) -> Error {
    match &**e {
        Error::Storage {
            op, location, kind, ..
        } => Error::Storage {
            op,
            location: location.clone(),
            kind: kind.clone(),
            source: Box::new(Shared(Arc::clone(e))),
        },
        Error::NoSynchronousStandby { location, reported } => Error::NoSynchronousStandby {
            location: location.clone(),
            reported: reported.clone(),
        },
        other => Error::storage("write a record", "", other.to_string()),
    }
}

/// An error shared by the writes it failed.
#[derive(Debug)]
struct Shared(Arc<Error>);

impl std::fmt::Display for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The source's own text (what failed), not this error's heading.
        match &*self.0 {
            Error::Storage { source, .. } => write!(f, "{source}"),
            other => write!(f, "{other}"),
        }
    }
}

impl std::error::Error for Shared {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &*self.0 {
            Error::Storage { source, .. } => source.source(),
            _ => None,
        }
    }
}

/// A leader, counted in [`Queue::leaders`] until it ends.
struct Leading<'a> {
    group: &'a Group,
    counted: bool,
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        if self.counted {
            {
                let mut queue = self.group.queue.lock().unwrap_or_else(|p| p.into_inner());
                queue.leaders -= 1;
            }
            // Dropped mid-group: the queued writes' callers start the next
            // leader (this task's runtime may be going away).
            self.group.vacated.notify_waiters();
        }
    }
}

/// The next group off the queue: up to [`MOST`] writes whose events fit.
fn take(waiting: &mut VecDeque<Waiting>) -> Vec<Waiting> {
    let mut group = Vec::new();
    let mut events = 0;
    while let Some(next) = waiting.front() {
        if next.reply.is_closed() {
            // Its caller stopped waiting before it was sent: it is not
            // written, as a lone write dropped before its statement went
            // out never was.
            waiting.pop_front();
            continue;
        }
        let n = next.job.bytes.len();
        if group.len() == MOST || (!group.is_empty() && events + n > EVENTS) {
            break;
        }
        events += n;
        group.extend(waiting.pop_front());
    }
    group
}

/// The parameters' types, `$1..$16`.
const TYPES: [Type; 16] = [
    Type::INT2,
    Type::BYTEA,
    Type::INT8,
    Type::BYTEA,
    Type::BOOL,
    Type::INT4,
    Type::TEXT,
    Type::INT8,
    Type::FLOAT8,
    Type::BYTEA_ARRAY,
    Type::BYTEA_ARRAY,
    Type::BOOL,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::INT8,
];

pub(crate) async fn statement(
    client: &deadpool_postgres::Object,
    pooler: bool,
    job: &Job,
    offset: i64,
) -> Result<Vec<Row>, deadpool_postgres::tokio_postgres::Error> {
    let key = &job.key[..];
    let body = &job.body[..];
    let worker = job.worker.as_deref();
    let keys: Vec<Option<&[u8]>> = job.keys.iter().map(Option::as_deref).collect();
    let bytes: Vec<&[u8]> = job.bytes.iter().map(Vec::as_slice).collect();
    let payload = job.payload.as_str();
    let holder = job.holder.as_str();
    let values: [&(dyn deadpool_postgres::tokio_postgres::types::ToSql + Sync); 16] = [
        &job.space,
        &key,
        &job.expected,
        &body,
        &job.escalated,
        &job.code,
        &worker,
        &job.incarnation,
        &job.lease,
        &keys,
        &bytes,
        &job.durable,
        &payload,
        &job.commit,
        &holder,
        &offset,
    ];
    if pooler {
        let params: Vec<_> = values.iter().copied().zip(TYPES.iter().cloned()).collect();
        return client.query_typed(&job.sql, &params).await;
    }
    let stmt = client.prepare_typed_cached(&job.sql, &TYPES).await?;
    client.query(&stmt, &values).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use deadpool_postgres::tokio_postgres::{Config, NoTls};
    use deadpool_postgres::{Manager, ManagerConfig, RecyclingMethod};

    /// A pool that is never reached: the tests here look at the queue.
    fn pool() -> Pool {
        let config: Config = "host=127.0.0.1 port=1 user=idem dbname=idem"
            .parse()
            .unwrap();
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        Pool::builder(manager)
            .max_size(1)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .unwrap()
    }

    fn job() -> Job {
        Job {
            sql: "SELECT 1".into(),
            space: 0,
            key: vec![3; 32],
            expected: 0,
            body: Vec::new(),
            escalated: false,
            code: 0,
            worker: None,
            incarnation: None,
            lease: 1.0,
            keys: Vec::new(),
            bytes: Vec::new(),
            durable: true,
            payload: String::new(),
            commit: "on",
            holder: String::new(),
        }
    }

    #[tokio::test]
    async fn a_write_queued_behind_a_dropped_leader_starts_a_leader_of_its_own() {
        let group = Group::new(pool(), "test".into(), false);
        // Every leader's place is taken, as by the leaders of another
        // runtime whose groups wait on a lock.
        group.queue.lock().unwrap().leaders = LEADERS;
        let writing = tokio::spawn({
            let group = Arc::clone(&group);
            async move { group.write(job()).await }
        });
        tokio::task::yield_now().await;
        assert_eq!(group.queue.lock().unwrap().waiting.len(), 1, "queued");
        // That runtime shuts down: one of its leaders is dropped mid-group.
        drop(Leading {
            group: &group,
            counted: true,
        });
        // The queued write is taken by a leader of this runtime.
        let mut yields = 0;
        while !group.queue.lock().unwrap().waiting.is_empty() && yields < 100 {
            tokio::task::yield_now().await;
            yields += 1;
        }
        assert!(
            group.queue.lock().unwrap().waiting.is_empty(),
            "the write still waits for a leader after {yields} turns"
        );
        writing.abort();
    }
}
