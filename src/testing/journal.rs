//! [`FaultJournal`]: an in-memory journal that loses what a crash loses,
//! with faults injected on command.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use idem_runtime::journal::{
    BoxFuture, Claim, ClaimChange, Digest, Durability, EventRows, Expect, Journal, Loaded,
    NewEvent, Owner, Space, Write, Written,
};
use idem_runtime::Error;
use tokio::sync::{watch, Notify};

use super::point::CrashPoint;

/// A fault for a [`FaultJournal`] to inject (see [`FaultJournal::inject`]).
///
/// Writes are counted from 1 per process view (every [`FaultJournal`]
/// returned by [`FaultJournal::restart`] counts anew): record writes, audit
/// appends, removals and truncations. Barriers (the fsyncs behind
/// immediately durable writes, and [`Journal::sync`]) are counted apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// The n-th write is refused before anything changes, with an I/O error
    /// (a full disk).
    RefuseWrite(usize),
    /// The n-th write happens, then reports an I/O error: the worst case for
    /// code that trusts error codes.
    FailAfterWrite(usize),
    /// The n-th barrier fails with an I/O error: the writes it should have
    /// made durable stay volatile, and a restart loses them.
    FailSync(usize),
    /// The process dies at this point of the first operation it journals:
    /// the journal stops answering there (the call in progress never
    /// resumes), with durable exactly what a crash at that moment leaves.
    /// [`FaultJournal::halted`] resolves; drop the runtime and
    /// [`restart`](FaultJournal::restart).
    CrashAt(CrashPoint),
}

/// One record.
#[derive(Debug, Clone)]
struct Rec {
    version: u64,
    epoch: u64,
    owner: Option<Owner>,
    escalated: bool,
    body: Vec<u8>,
}

/// The records and the audit stream.
#[derive(Debug, Clone, Default)]
struct Data {
    records: BTreeMap<(Space, Digest), Rec>,
    events: Vec<(u64, Vec<u8>, Option<Digest>)>,
    next_seq: u64,
}

/// The "disk": what every process view shares.
#[derive(Debug, Default)]
struct Disk {
    /// What readers see.
    live: Data,
    /// What survives a crash: the state as of the last barrier.
    durable: Data,
    /// Versions are never reused, not even after a crash.
    next_version: u64,
    crashes: u64,
}

#[derive(Debug, Default)]
struct Store {
    disk: Mutex<Disk>,
    changed: Notify,
}

/// One process's side: its faults, its counters, its log.
#[derive(Debug, Default)]
struct Process {
    faults: Vec<Fault>,
    writes: usize,
    syncs: usize,
    log: Vec<String>,
    /// The first operation this process created (the one crash points
    /// refer to).
    intent: Option<Digest>,
    /// Set by [`FaultJournal::restart`]: this process is gone.
    dead: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An in-memory journal for tests, as one process sees it: writes are
/// visible at once and durable at the next barrier, and
/// [`restart`](FaultJournal::restart) does what a SIGKILL and a restart do
/// (everything no barrier covered is gone; the new process has a table of
/// calls in flight of its own). Faults ([`Fault`]) fail chosen writes or
/// barriers, or halt the process at a [`CrashPoint`].
///
/// Give it to a runtime with [`RuntimeBuilder::journal`](crate::RuntimeBuilder::journal):
///
/// ```
/// use idem::testing::{CrashPoint, Fault, FaultJournal};
/// use idem::Runtime;
///
/// let journal = FaultJournal::new();
/// journal.inject(Fault::CrashAt(CrashPoint::AfterIntent));
/// let rt = Runtime::builder().journal(journal.clone()).open()?;
/// // ... a call that halts at its INTENT; then the process "dies":
/// drop(rt);
/// let journal = journal.restart();
/// let rt = Runtime::builder().journal(journal.clone()).open()?;
/// # Ok::<(), idem::Error>(())
/// ```
///
/// The log ([`FaultJournal::log`]) says what happened, in order:
/// `write <n> <op> <space>` for each write (`create`, `claim`, `update`,
/// `settle`, `append`, `remove`, `truncate`), `sync <n>` for each barrier
/// that completed, `FAILED ...` for injected failures and `CRASH <point>`
/// where the process halted.
#[derive(Debug)]
pub struct FaultJournal {
    store: Arc<Store>,
    process: Mutex<Process>,
    halted: watch::Sender<Option<CrashPoint>>,
}

impl FaultJournal {
    /// An empty journal, no fault injected.
    pub fn new() -> Arc<FaultJournal> {
        Arc::new(FaultJournal::on(Arc::default()))
    }

    fn on(store: Arc<Store>) -> FaultJournal {
        FaultJournal {
            store,
            process: Mutex::default(),
            halted: watch::channel(None).0,
        }
    }

    /// Injects `fault` (several may be pending at once).
    pub fn inject(&self, fault: Fault) {
        lock(&self.process).faults.push(fault);
    }

    /// Removes every fault not yet struck.
    pub fn heal(&self) {
        lock(&self.process).faults.clear();
    }

    /// The process dies and a new one starts on the same disk: everything
    /// written since the last barrier is lost, and the journal returned is
    /// the new process's view (no faults, counters at zero, its own table
    /// of calls in flight). This view answers every later call with an
    /// error. Drop the old process's runtime and calls first.
    pub fn restart(&self) -> Arc<FaultJournal> {
        lock(&self.process).dead = true;
        {
            let mut disk = lock(&self.store.disk);
            disk.live = disk.durable.clone();
            disk.crashes += 1;
        }
        Arc::new(FaultJournal::on(self.store.clone()))
    }

    /// Resolves when this process halted at a crash point
    /// ([`Fault::CrashAt`]), with the point.
    pub fn halted(&self) -> impl Future<Output = CrashPoint> + Send + 'static {
        let mut rx = self.halted.subscribe();
        async move {
            loop {
                if let Some(point) = *rx.borrow_and_update() {
                    return point;
                }
                if rx.changed().await.is_err() {
                    // The journal is gone: it will never halt.
                    std::future::pending::<()>().await;
                }
            }
        }
    }

    /// Where this process halted, if it did.
    pub fn crashed_at(&self) -> Option<CrashPoint> {
        *self.halted.borrow()
    }

    /// How many restarts the disk has seen.
    pub fn crashes(&self) -> u64 {
        lock(&self.store.disk).crashes
    }

    /// Writes this process attempted.
    pub fn writes(&self) -> usize {
        lock(&self.process).writes
    }

    /// Barriers this process attempted.
    pub fn syncs(&self) -> usize {
        lock(&self.process).syncs
    }

    /// What this process did to the journal, in order (see the type's
    /// documentation).
    pub fn log(&self) -> Vec<String> {
        lock(&self.process).log.clone()
    }

    fn error(&self, op: &'static str, why: &'static str) -> Error {
        Error::storage(op, self.location(), std::io::Error::other(why))
    }

    fn alive(&self, op: &'static str) -> Result<(), Error> {
        if lock(&self.process).dead {
            return Err(self.error(op, "this process crashed (FaultJournal::restart)"));
        }
        Ok(())
    }

    /// Counts a write; the fault that strikes it, if any.
    fn next_write(&self, what: &str) -> Option<Fault> {
        let mut p = lock(&self.process);
        p.writes += 1;
        let n = p.writes;
        let fault = p
            .faults
            .iter()
            .position(|f| matches!(f, Fault::RefuseWrite(m) | Fault::FailAfterWrite(m) if *m == n));
        let fault = fault.map(|i| p.faults.remove(i));
        let prefix = if fault.is_some() { "FAILED " } else { "" };
        p.log.push(format!("{prefix}write {n} {what}"));
        fault
    }

    /// A barrier: makes everything written so far durable, unless a fault
    /// strikes it.
    fn barrier(&self) -> Result<(), Error> {
        let mut p = lock(&self.process);
        p.syncs += 1;
        let n = p.syncs;
        if let Some(i) = p.faults.iter().position(|f| *f == Fault::FailSync(n)) {
            p.faults.remove(i);
            p.log.push(format!("FAILED sync {n}"));
            return Err(Error::storage(
                "sync",
                self.location(),
                std::io::Error::from_raw_os_error(5),
            ));
        }
        {
            let mut disk = lock(&self.store.disk);
            disk.durable = disk.live.clone();
        }
        p.log.push(format!("sync {n}"));
        Ok(())
    }

    fn then_barrier(&self, durability: Durability) -> Result<(), Error> {
        match durability {
            Durability::Immediate => self.barrier(),
            Durability::Eventual => Ok(()),
        }
    }

    /// Whether `w` meets an armed crash point: `Some((point, before))`,
    /// `before` when the process dies before the write is applied.
    fn crash_point(&self, w: &Write<'_>) -> Option<(CrashPoint, bool)> {
        if w.space != Space::Ops {
            return None;
        }
        let p = lock(&self.process);
        let armed = |point| p.faults.contains(&Fault::CrashAt(point));
        match p.intent {
            None if matches!(w.expect, Expect::Absent) => {
                if armed(CrashPoint::BeforeIntent) {
                    Some((CrashPoint::BeforeIntent, true))
                } else if armed(CrashPoint::AfterIntent) {
                    Some((CrashPoint::AfterIntent, false))
                } else {
                    None
                }
            }
            // Settling the operation (releasing its claim) after it ran:
            // for a call that succeeds, its COMMIT.
            Some(intent) if intent == *w.key && matches!(w.claim, ClaimChange::Release) => {
                if armed(CrashPoint::AfterProvider) {
                    Some((CrashPoint::AfterProvider, true))
                } else if armed(CrashPoint::AfterCommit) {
                    Some((CrashPoint::AfterCommit, false))
                } else {
                    None
                }
            }
            _ => None,
        }
    }

    /// The process dies here: nothing after this happens.
    async fn halt(&self, point: CrashPoint) {
        {
            let mut p = lock(&self.process);
            p.faults.retain(|f| *f != Fault::CrashAt(point));
            p.log.push(format!("CRASH {}", point.name()));
        }
        self.halted.send_replace(Some(point));
        std::future::pending::<()>().await;
    }

    fn apply(&self, w: &Write<'_>) -> Written {
        let mut disk = lock(&self.store.disk);
        let current = disk.live.records.get(&(w.space, *w.key)).cloned();
        let holds = match (w.expect, &current) {
            (Expect::Absent, None) => true,
            (Expect::Version(v), Some(r)) => r.version == v,
            _ => false,
        };
        if !holds {
            return Written::Conflict;
        }
        disk.next_version += 1;
        let version = disk.next_version;
        let prev_epoch = current.as_ref().map_or(0, |r| r.epoch);
        let (epoch, owner) = match w.claim {
            ClaimChange::Keep => (prev_epoch, current.and_then(|r| r.owner)),
            ClaimChange::Take(o) => (prev_epoch + 1, Some(o.clone())),
            ClaimChange::Release => (prev_epoch, None),
        };
        disk.live.records.insert(
            (w.space, *w.key),
            Rec {
                version,
                epoch,
                owner,
                escalated: w.escalated,
                body: w.body.to_vec(),
            },
        );
        let seqs = w
            .events
            .iter()
            .map(|e| push_event(&mut disk.live, e))
            .collect();
        Written::Done {
            version,
            epoch,
            seqs,
        }
    }

    fn loaded(r: &Rec) -> Loaded {
        Loaded {
            version: r.version,
            epoch: r.epoch,
            body: r.body.clone(),
            // One process per journal: a claim's driver is alive only if
            // this process's table of calls says so.
            claim: r.owner.clone().map(|owner| Claim { owner, live: false }),
        }
    }

    /// The common frame of a counted write: faults, the change, its
    /// barrier.
    fn counted<T>(
        &self,
        op: &'static str,
        what: &str,
        durability: Durability,
        change: impl FnOnce() -> T,
    ) -> Result<T, Error> {
        self.alive(op)?;
        match self.next_write(what) {
            Some(Fault::RefuseWrite(_)) => {
                return Err(Error::storage(
                    op,
                    self.location(),
                    std::io::Error::from_raw_os_error(28),
                ))
            }
            Some(_) => {
                let _ = change();
                return Err(Error::storage(
                    op,
                    self.location(),
                    std::io::Error::from_raw_os_error(5),
                ));
            }
            None => {}
        }
        let out = change();
        self.then_barrier(durability)?;
        self.store.changed.notify_waiters();
        Ok(out)
    }
}

fn push_event(data: &mut Data, e: &NewEvent<'_>) -> u64 {
    let seq = data.next_seq;
    data.next_seq += 1;
    data.events.push((seq, e.bytes.to_vec(), e.key.copied()));
    seq
}

fn op_name(w: &Write<'_>) -> &'static str {
    match (w.expect, w.claim) {
        (Expect::Absent, _) => "create",
        (_, ClaimChange::Take(_)) => "claim",
        (_, ClaimChange::Release) => "settle",
        (_, ClaimChange::Keep) => "update",
    }
}

impl Journal for FaultJournal {
    fn location(&self) -> &str {
        "memory (idem::testing::FaultJournal)"
    }

    fn load<'a>(
        &'a self,
        space: Space,
        key: &'a Digest,
    ) -> BoxFuture<'a, Result<Option<Loaded>, Error>> {
        let out = self.alive("load").map(|()| {
            lock(&self.store.disk)
                .live
                .records
                .get(&(space, *key))
                .map(FaultJournal::loaded)
        });
        Box::pin(std::future::ready(out))
    }

    fn write<'a>(&'a self, w: Write<'a>) -> BoxFuture<'a, Result<Written, Error>> {
        Box::pin(async move {
            self.alive("write")?;
            let point = self.crash_point(&w);
            if let Some((point, true)) = point {
                // Counted and logged as attempted, never applied.
                let _ = self.next_write(&format!("{} {}", op_name(&w), w.space.name()));
                self.halt(point).await;
            }
            let what = format!("{} {}", op_name(&w), w.space.name());
            let written = self.counted("write", &what, Durability::Eventual, || self.apply(&w))?;
            if !matches!(written, Written::Done { .. }) {
                return Ok(written);
            }
            self.then_barrier(w.durability)?;
            if w.space == Space::Ops && matches!(w.expect, Expect::Absent) {
                lock(&self.process).intent.get_or_insert(*w.key);
            }
            if let Some((point, false)) = point {
                self.halt(point).await;
            }
            Ok(written)
        })
    }

    fn changed<'a>(&'a self, _space: Space, _key: &'a Digest, _version: u64) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let _ = tokio::time::timeout(Duration::from_millis(50), self.store.changed.notified())
                .await;
        })
    }

    fn append<'a>(
        &'a self,
        events: &'a [NewEvent<'a>],
        durability: Durability,
    ) -> BoxFuture<'a, Result<Vec<u64>, Error>> {
        let out = self.counted("append", "append audit", durability, || {
            let mut disk = lock(&self.store.disk);
            events
                .iter()
                .map(|e| push_event(&mut disk.live, e))
                .collect()
        });
        Box::pin(std::future::ready(out))
    }

    fn events<'a>(&'a self, from: u64, limit: usize) -> BoxFuture<'a, Result<EventRows, Error>> {
        // Only what is durable: commit-ordered, as a real journal.
        let out = self.alive("events").map(|()| {
            lock(&self.store.disk)
                .durable
                .events
                .iter()
                .filter(|e| e.0 >= from)
                .take(limit)
                .map(|e| (e.0, e.1.clone()))
                .collect()
        });
        Box::pin(std::future::ready(out))
    }

    fn events_for<'a>(&'a self, key: &'a Digest) -> BoxFuture<'a, Result<EventRows, Error>> {
        let out = self.alive("events").map(|()| {
            lock(&self.store.disk)
                .durable
                .events
                .iter()
                .filter(|e| e.2.as_ref() == Some(key))
                .map(|e| (e.0, e.1.clone()))
                .collect()
        });
        Box::pin(std::future::ready(out))
    }

    fn truncate_events(&self, before: u64) -> BoxFuture<'_, Result<u64, Error>> {
        let out = self.counted("truncate", "truncate audit", Durability::Immediate, || {
            let mut disk = lock(&self.store.disk);
            let len = disk.live.events.len();
            disk.live.events.retain(|e| e.0 >= before);
            (len - disk.live.events.len()) as u64
        });
        Box::pin(std::future::ready(out))
    }

    fn escalated(&self) -> BoxFuture<'_, Result<Vec<(Digest, Loaded)>, Error>> {
        let out = self.alive("escalated").map(|()| {
            lock(&self.store.disk)
                .live
                .records
                .iter()
                .filter(|((s, _), r)| *s == Space::Ops && r.escalated)
                .map(|((_, k), r)| (*k, FaultJournal::loaded(r)))
                .collect()
        });
        Box::pin(std::future::ready(out))
    }

    fn scan<'a>(
        &'a self,
        space: Space,
        after: Option<&'a Digest>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<(Digest, Loaded)>, Error>> {
        let out = self.alive("scan").map(|()| {
            lock(&self.store.disk)
                .live
                .records
                .iter()
                .filter(|((s, k), _)| *s == space && after.is_none_or(|a| k > a))
                .take(limit)
                .map(|((_, k), r)| (*k, FaultJournal::loaded(r)))
                .collect()
        });
        Box::pin(std::future::ready(out))
    }

    fn remove<'a>(
        &'a self,
        space: Space,
        key: &'a Digest,
        version: u64,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        let what = format!("remove {}", space.name());
        let out = self.counted("remove", &what, Durability::Eventual, || {
            let mut disk = lock(&self.store.disk);
            match disk.live.records.get(&(space, *key)) {
                Some(r) if r.version == version => {
                    disk.live.records.remove(&(space, *key));
                    true
                }
                _ => false,
            }
        });
        Box::pin(std::future::ready(out))
    }

    fn sync(&self) -> BoxFuture<'_, Result<(), Error>> {
        let out = self.alive("sync").and_then(|()| self.barrier());
        Box::pin(std::future::ready(out))
    }

    fn size_on_disk(&self) -> BoxFuture<'_, Result<u64, Error>> {
        let out = self.alive("size").map(|()| {
            let disk = lock(&self.store.disk);
            let records: u64 = disk
                .durable
                .records
                .values()
                .map(|r| r.body.len() as u64)
                .sum();
            let events: u64 = disk.durable.events.iter().map(|e| e.1.len() as u64).sum();
            records + events
        });
        Box::pin(std::future::ready(out))
    }
}
