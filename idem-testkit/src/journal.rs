//! Storage for tests: a journal that fails its n-th write or barrier on
//! command ([`FaultyJournal`], over any journal), and an in-memory journal
//! that forgets, at a simulated crash, everything no barrier covered
//! ([`MemJournal`]) — what a SIGKILL does to the page cache of a process,
//! without killing the test.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use idem_runtime::journal::{
    BoxFuture, Claim, ClaimChange, Digest, Durability, EventRows, Expect, Held, Journal, Loaded,
    NewEvent, Owner, Space, Write, Written,
};
use idem_runtime::{Clock, Error};

/// How a failing write or barrier fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageFault {
    /// Refused before anything changed (ENOSPC).
    Refused,
    /// The change happened, then the call reported an error (EIO after the
    /// fact): the worst case for an engine that trusts error codes.
    AppliedThenFailed,
}

impl StorageFault {
    /// The I/O error a real disk gives for it.
    fn io_error(self) -> std::io::Error {
        match self {
            StorageFault::Refused => std::io::Error::from_raw_os_error(28),
            StorageFault::AppliedThenFailed => std::io::Error::from_raw_os_error(5),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Wraps a journal; fails the write (record write, event append, removal,
/// truncation) or the barrier with a chosen 1-based index.
///
/// An immediate write is passed on as an eventual one followed by a
/// barrier (`sync`), so that the write and its barrier can fail apart: a
/// write that happened but whose barrier failed is exactly a crash before
/// the fsync.
///
/// The log holds, in order, `write <n> <op> <space>` (or `FAILED write
/// ...`) for each write, `sync <n>` when a barrier *completed* (or `FAILED
/// sync <n>`), and whatever the test adds (e.g. the provider's calls), so a
/// test can assert that nothing reached a provider after a fault, or that a
/// barrier finished before a call.
pub struct FaultyJournal {
    inner: Arc<dyn Journal>,
    log: Arc<Mutex<Vec<String>>>,
    fail_write: AtomicUsize,
    fail_sync: AtomicUsize,
    applied_then_failed: AtomicBool,
    writes: AtomicUsize,
    syncs: AtomicUsize,
    loads: AtomicUsize,
}

impl FaultyJournal {
    /// Wraps `inner`; no fault until one is set.
    pub fn new(inner: Arc<dyn Journal>) -> Arc<Self> {
        Arc::new(FaultyJournal {
            inner,
            log: Arc::default(),
            fail_write: AtomicUsize::new(0),
            fail_sync: AtomicUsize::new(0),
            applied_then_failed: AtomicBool::new(false),
            writes: AtomicUsize::new(0),
            syncs: AtomicUsize::new(0),
            loads: AtomicUsize::new(0),
        })
    }

    /// The wrapped journal.
    pub fn inner(&self) -> &Arc<dyn Journal> {
        &self.inner
    }

    /// Fails the `n`-th write from the start (1-based; 0: none) with `fault`.
    pub fn fail_write(&self, n: usize, fault: StorageFault) {
        self.set_fault(fault);
        self.fail_write.store(n, Ordering::SeqCst);
    }

    /// Fails the `n`-th barrier from the start (1-based; 0: none) with
    /// `fault`.
    pub fn fail_sync(&self, n: usize, fault: StorageFault) {
        self.set_fault(fault);
        self.fail_sync.store(n, Ordering::SeqCst);
    }

    /// No more faults.
    pub fn heal(&self) {
        self.fail_write.store(0, Ordering::SeqCst);
        self.fail_sync.store(0, Ordering::SeqCst);
    }

    fn set_fault(&self, fault: StorageFault) {
        self.applied_then_failed
            .store(fault == StorageFault::AppliedThenFailed, Ordering::SeqCst);
    }

    fn fault(&self) -> StorageFault {
        if self.applied_then_failed.load(Ordering::SeqCst) {
            StorageFault::AppliedThenFailed
        } else {
            StorageFault::Refused
        }
    }

    /// Writes attempted so far.
    pub fn writes(&self) -> usize {
        self.writes.load(Ordering::SeqCst)
    }

    /// Barriers attempted so far.
    pub fn syncs(&self) -> usize {
        self.syncs.load(Ordering::SeqCst)
    }

    /// Records read so far.
    pub fn loads(&self) -> usize {
        self.loads.load(Ordering::SeqCst)
    }

    /// The log (shared: tests add their own lines to it).
    pub fn log(&self) -> Arc<Mutex<Vec<String>>> {
        self.log.clone()
    }

    fn error(&self, op: &'static str) -> Error {
        Error::storage(op, self.inner.location(), self.fault().io_error())
    }

    /// The number of this write, or `Err` with whether to apply it anyway.
    fn next_write(&self, op: &str, space: &str) -> Result<(), bool> {
        let n = self.writes.fetch_add(1, Ordering::SeqCst) + 1;
        if n != self.fail_write.load(Ordering::SeqCst) {
            lock(&self.log).push(format!("write {n} {op} {space}"));
            return Ok(());
        }
        lock(&self.log).push(format!("FAILED write {n} {op} {space}"));
        Err(self.fault() == StorageFault::AppliedThenFailed)
    }

    /// A barrier, failing it if it is the chosen one.
    async fn barrier(&self) -> Result<(), Error> {
        let n = self.syncs.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.fail_sync.load(Ordering::SeqCst) {
            lock(&self.log).push(format!("FAILED sync {n}"));
            if self.fault() == StorageFault::AppliedThenFailed {
                let _ = self.inner.sync().await;
            }
            return Err(self.error("sync"));
        }
        let result = self.inner.sync().await;
        lock(&self.log).push(format!("sync {n}"));
        result
    }

    async fn then_barrier(&self, durability: Durability) -> Result<(), Error> {
        match durability {
            Durability::Immediate => self.barrier().await,
            Durability::Eventual => Ok(()),
        }
    }
}

fn op_name(w: &Write<'_>) -> &'static str {
    match (w.expect, w.claim) {
        (Expect::Absent, _) => "create",
        (_, ClaimChange::Take(_)) => "claim",
        (_, ClaimChange::Release) => "settle",
        (_, ClaimChange::Keep) => "update",
    }
}

impl Journal for FaultyJournal {
    fn location(&self) -> &str {
        self.inner.location()
    }

    fn clock(&self) -> Option<Arc<dyn Clock>> {
        self.inner.clock()
    }

    fn renewal(&self) -> Option<Duration> {
        self.inner.renewal()
    }

    fn claim_first(&self) -> bool {
        self.inner.claim_first()
    }

    fn remote(&self) -> bool {
        self.inner.remote()
    }

    fn load<'a>(
        &'a self,
        space: Space,
        key: &'a Digest,
    ) -> BoxFuture<'a, Result<Option<Loaded>, Error>> {
        self.loads.fetch_add(1, Ordering::SeqCst);
        self.inner.load(space, key)
    }

    fn write<'a>(&'a self, write: Write<'a>) -> BoxFuture<'a, Result<Written, Error>> {
        Box::pin(async move {
            let deferred = Write {
                durability: Durability::Eventual,
                ..write
            };
            if let Err(apply) = self.next_write(op_name(&write), write.space.name()) {
                if apply {
                    let _ = self.inner.write(deferred).await;
                }
                return Err(self.error("write"));
            }
            let written = self.inner.write(deferred).await?;
            if matches!(written, Written::Done { .. }) {
                self.then_barrier(write.durability).await?;
            }
            Ok(written)
        })
    }

    fn renew<'a>(
        &'a self,
        owner: &'a Owner,
        held: &'a [Held],
    ) -> BoxFuture<'a, Result<Vec<bool>, Error>> {
        self.inner.renew(owner, held)
    }

    fn changed<'a>(&'a self, space: Space, key: &'a Digest, version: u64) -> BoxFuture<'a, ()> {
        self.inner.changed(space, key, version)
    }

    fn append<'a>(
        &'a self,
        events: &'a [NewEvent<'a>],
        durability: Durability,
    ) -> BoxFuture<'a, Result<Vec<u64>, Error>> {
        Box::pin(async move {
            if let Err(apply) = self.next_write("append", "audit") {
                if apply {
                    let _ = self.inner.append(events, Durability::Eventual).await;
                }
                return Err(self.error("append"));
            }
            let seqs = self.inner.append(events, Durability::Eventual).await?;
            self.then_barrier(durability).await?;
            Ok(seqs)
        })
    }

    fn events<'a>(&'a self, from: u64, limit: usize) -> BoxFuture<'a, Result<EventRows, Error>> {
        self.inner.events(from, limit)
    }

    fn events_for<'a>(&'a self, key: &'a Digest) -> BoxFuture<'a, Result<EventRows, Error>> {
        self.inner.events_for(key)
    }

    fn truncate_events(&self, before: u64) -> BoxFuture<'_, Result<u64, Error>> {
        Box::pin(async move {
            if let Err(apply) = self.next_write("truncate", "audit") {
                if apply {
                    let _ = self.inner.truncate_events(before).await;
                }
                return Err(self.error("truncate"));
            }
            self.inner.truncate_events(before).await
        })
    }

    fn escalated(&self) -> BoxFuture<'_, Result<Vec<(Digest, Loaded)>, Error>> {
        self.inner.escalated()
    }

    fn scan<'a>(
        &'a self,
        space: Space,
        after: Option<&'a Digest>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<(Digest, Loaded)>, Error>> {
        self.inner.scan(space, after, limit)
    }

    fn remove<'a>(
        &'a self,
        space: Space,
        key: &'a Digest,
        version: u64,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            if let Err(apply) = self.next_write("remove", space.name()) {
                if apply {
                    let _ = self.inner.remove(space, key, version).await;
                }
                return Err(self.error("remove"));
            }
            self.inner.remove(space, key, version).await
        })
    }

    fn sync(&self) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(self.barrier())
    }

    fn size_on_disk(&self) -> BoxFuture<'_, Result<u64, Error>> {
        self.inner.size_on_disk()
    }
}

/// Another process's view of a journal: everything is the wrapped
/// journal's except the table of calls in flight, which is this view's own
/// (as each process has its own). With a journal whose claims are leases
/// ([`MemJournal::with_leases`]), views behave as workers on one shared
/// database; optionally their renewals can be stopped
/// ([`ProcessView::stall_renewals`]), as a process paused by SIGSTOP stops
/// renewing.
pub struct ProcessView {
    inner: Arc<dyn Journal>,
    stalled: AtomicBool,
}

impl ProcessView {
    /// A new process's view of `inner`.
    pub fn new(inner: Arc<dyn Journal>) -> Arc<Self> {
        Arc::new(ProcessView {
            inner,
            stalled: AtomicBool::new(false),
        })
    }

    /// From now on, renewals change nothing (and report the claims held, as
    /// a paused process would believe).
    pub fn stall_renewals(&self) {
        self.stalled.store(true, Ordering::SeqCst);
    }
}

impl Journal for ProcessView {
    fn location(&self) -> &str {
        self.inner.location()
    }

    fn clock(&self) -> Option<Arc<dyn Clock>> {
        self.inner.clock()
    }

    fn renewal(&self) -> Option<Duration> {
        self.inner.renewal()
    }

    fn claim_first(&self) -> bool {
        self.inner.claim_first()
    }

    fn remote(&self) -> bool {
        self.inner.remote()
    }

    fn load<'a>(
        &'a self,
        space: Space,
        key: &'a Digest,
    ) -> BoxFuture<'a, Result<Option<Loaded>, Error>> {
        self.inner.load(space, key)
    }

    fn write<'a>(&'a self, write: Write<'a>) -> BoxFuture<'a, Result<Written, Error>> {
        self.inner.write(write)
    }

    fn renew<'a>(
        &'a self,
        owner: &'a Owner,
        held: &'a [Held],
    ) -> BoxFuture<'a, Result<Vec<bool>, Error>> {
        if self.stalled.load(Ordering::SeqCst) {
            return Box::pin(std::future::ready(Ok(vec![true; held.len()])));
        }
        self.inner.renew(owner, held)
    }

    fn changed<'a>(&'a self, space: Space, key: &'a Digest, version: u64) -> BoxFuture<'a, ()> {
        self.inner.changed(space, key, version)
    }

    fn append<'a>(
        &'a self,
        events: &'a [NewEvent<'a>],
        durability: Durability,
    ) -> BoxFuture<'a, Result<Vec<u64>, Error>> {
        self.inner.append(events, durability)
    }

    fn events<'a>(&'a self, from: u64, limit: usize) -> BoxFuture<'a, Result<EventRows, Error>> {
        self.inner.events(from, limit)
    }

    fn events_for<'a>(&'a self, key: &'a Digest) -> BoxFuture<'a, Result<EventRows, Error>> {
        self.inner.events_for(key)
    }

    fn truncate_events(&self, before: u64) -> BoxFuture<'_, Result<u64, Error>> {
        self.inner.truncate_events(before)
    }

    fn escalated(&self) -> BoxFuture<'_, Result<Vec<(Digest, Loaded)>, Error>> {
        self.inner.escalated()
    }

    fn scan<'a>(
        &'a self,
        space: Space,
        after: Option<&'a Digest>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<(Digest, Loaded)>, Error>> {
        self.inner.scan(space, after, limit)
    }

    fn remove<'a>(
        &'a self,
        space: Space,
        key: &'a Digest,
        version: u64,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        self.inner.remove(space, key, version)
    }

    fn sync(&self) -> BoxFuture<'_, Result<(), Error>> {
        self.inner.sync()
    }

    fn size_on_disk(&self) -> BoxFuture<'_, Result<u64, Error>> {
        self.inner.size_on_disk()
    }
}

/// Puts `body` as the record `digest` of `space`, whatever is there: how a
/// test plants a damaged record.
pub async fn overwrite_record(j: &dyn Journal, space: Space, digest: &Digest, body: &[u8]) {
    let expect = match j.load(space, digest).await {
        Ok(Some(l)) => Expect::Version(l.version),
        _ => Expect::Absent,
    };
    let written = j
        .write(Write {
            space,
            key: digest,
            expect,
            body,
            claim: ClaimChange::Release,
            escalated: false,
            events: &[],
            durability: Durability::Immediate,
        })
        .await;
    assert!(
        matches!(written, Ok(Written::Done { .. })),
        "overwrite_record: {written:?}"
    );
}

/// One record of a [`MemJournal`].
#[derive(Debug, Clone)]
struct Rec {
    version: u64,
    epoch: u64,
    owner: Option<Owner>,
    /// For leases: when the claim expires (ms on the journal's clock).
    expires_ms: u64,
    escalated: bool,
    body: Vec<u8>,
}

#[derive(Debug, Clone, Default)]
struct Data {
    records: BTreeMap<(Space, Digest), Rec>,
    events: Vec<(u64, Vec<u8>, Option<Digest>)>,
    next_seq: u64,
}

struct MemState {
    /// What readers see.
    live: Data,
    /// What survives a crash: the state as of the last barrier.
    durable: Data,
    /// Versions stay unique across crashes (a restarted process never
    /// reuses one a dead one handed out).
    next_version: u64,
    crashes: u64,
}

/// An in-memory journal with the durability of a real one: a write is
/// visible at once and survives [`MemJournal::crash`] only once a barrier
/// (an immediate write, or `sync`) covered it.
///
/// Claims can behave as in a shared database ([`MemJournal::with_leases`]):
/// each has a lease on a given clock, live until it expires, and a claim's
/// driver must renew it. Without leases claims are never live, as in the
/// sled journal (the process's table of calls in flight knows its
/// drivers).
pub struct MemJournal {
    state: Mutex<MemState>,
    leases: Option<(Arc<dyn Clock>, Duration)>,
    changed: tokio::sync::Notify,
}

impl Default for MemJournal {
    fn default() -> Self {
        MemJournal {
            state: Mutex::new(MemState {
                live: Data::default(),
                durable: Data::default(),
                next_version: 1,
                crashes: 0,
            }),
            leases: None,
            changed: tokio::sync::Notify::new(),
        }
    }
}

impl MemJournal {
    /// A journal without leases.
    pub fn new() -> Arc<Self> {
        Arc::new(MemJournal::default())
    }

    /// A journal whose claims are leases of `lease` on `clock`.
    pub fn with_leases(clock: Arc<dyn Clock>, lease: Duration) -> Arc<Self> {
        Arc::new(MemJournal {
            leases: Some((clock, lease)),
            ..MemJournal::default()
        })
    }

    fn lock(&self) -> MutexGuard<'_, MemState> {
        lock(&self.state)
    }

    /// What a SIGKILL leaves: everything since the last barrier is gone.
    /// (Drop the crashed process's runtime and futures first: the table of
    /// calls in flight is the process's, not the disk's.)
    pub fn crash(&self) {
        let mut st = self.lock();
        st.live = st.durable.clone();
        st.crashes += 1;
    }

    /// How many crashes were simulated.
    pub fn crashes(&self) -> u64 {
        self.lock().crashes
    }

    fn now_ms(&self) -> u64 {
        self.leases.as_ref().map_or(0, |(c, _)| c.now_ms())
    }

    fn loaded(&self, r: &Rec) -> Loaded {
        Loaded {
            version: r.version,
            epoch: r.epoch,
            body: r.body.clone(),
            claim: r.owner.clone().map(|owner| Claim {
                owner,
                live: self.leases.is_some() && r.expires_ms > self.now_ms(),
            }),
        }
    }

    fn barrier(st: &mut MemState) {
        st.durable = st.live.clone();
    }

    fn settle(&self, durability: Durability) {
        if durability == Durability::Immediate {
            Self::barrier(&mut self.lock());
        }
        self.changed.notify_waiters();
    }
}

impl Journal for MemJournal {
    fn location(&self) -> &str {
        "memory"
    }

    fn renewal(&self) -> Option<Duration> {
        self.leases.as_ref().map(|(_, lease)| *lease / 3)
    }

    /// With leases, as the shared database it models (PostgreSQL's
    /// journal claims first too).
    fn claim_first(&self) -> bool {
        self.leases.is_some()
    }

    fn load<'a>(
        &'a self,
        space: Space,
        key: &'a Digest,
    ) -> BoxFuture<'a, Result<Option<Loaded>, Error>> {
        let out = self
            .lock()
            .live
            .records
            .get(&(space, *key))
            .map(|r| self.loaded(r));
        Box::pin(std::future::ready(Ok(out)))
    }

    fn write<'a>(&'a self, w: Write<'a>) -> BoxFuture<'a, Result<Written, Error>> {
        let outcome = {
            let now = self.now_ms();
            let lease = self.leases.as_ref().map_or(Duration::ZERO, |(_, l)| *l);
            let mut st = self.lock();
            let current = st.live.records.get(&(w.space, *w.key)).cloned();
            let holds = match (w.expect, &current) {
                (Expect::Absent, None) => true,
                (Expect::Version(v), Some(r)) => r.version == v,
                _ => false,
            };
            if !holds {
                return Box::pin(std::future::ready(Ok(Written::Conflict)));
            }
            let version = st.next_version;
            st.next_version += 1;
            let prev_epoch = current.as_ref().map_or(0, |r| r.epoch);
            let (epoch, owner, expires_ms) = match w.claim {
                ClaimChange::Keep => (
                    prev_epoch,
                    current.as_ref().and_then(|r| r.owner.clone()),
                    current.as_ref().map_or(0, |r| r.expires_ms),
                ),
                ClaimChange::Take(o) => (
                    prev_epoch + 1,
                    Some(o.clone()),
                    now + lease.as_millis() as u64,
                ),
                ClaimChange::Release => (prev_epoch, None, 0),
            };
            st.live.records.insert(
                (w.space, *w.key),
                Rec {
                    version,
                    epoch,
                    owner,
                    expires_ms,
                    escalated: w.escalated,
                    body: w.body.to_vec(),
                },
            );
            let mut seqs = Vec::new();
            for e in w.events {
                let seq = st.live.next_seq;
                st.live.next_seq += 1;
                st.live.events.push((seq, e.bytes.to_vec(), e.key.copied()));
                seqs.push(seq);
            }
            Written::Done {
                version,
                epoch,
                seqs,
            }
        };
        self.settle(w.durability);
        Box::pin(std::future::ready(Ok(outcome)))
    }

    fn renew<'a>(
        &'a self,
        owner: &'a Owner,
        held: &'a [Held],
    ) -> BoxFuture<'a, Result<Vec<bool>, Error>> {
        let now = self.now_ms();
        let lease = self.leases.as_ref().map_or(Duration::ZERO, |(_, l)| *l);
        let mut st = self.lock();
        let out = held
            .iter()
            .map(|h| match st.live.records.get_mut(&(h.space, h.key)) {
                Some(r) if r.epoch == h.epoch && r.owner.as_ref() == Some(owner) => {
                    r.expires_ms = now + lease.as_millis() as u64;
                    true
                }
                _ => false,
            })
            .collect();
        Box::pin(std::future::ready(Ok(out)))
    }

    fn changed<'a>(&'a self, _space: Space, _key: &'a Digest, _version: u64) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let _ = tokio::time::timeout(Duration::from_millis(50), self.changed.notified()).await;
        })
    }

    fn append<'a>(
        &'a self,
        events: &'a [NewEvent<'a>],
        durability: Durability,
    ) -> BoxFuture<'a, Result<Vec<u64>, Error>> {
        let seqs = {
            let mut st = self.lock();
            events
                .iter()
                .map(|e| {
                    let seq = st.live.next_seq;
                    st.live.next_seq += 1;
                    st.live.events.push((seq, e.bytes.to_vec(), e.key.copied()));
                    seq
                })
                .collect()
        };
        self.settle(durability);
        Box::pin(std::future::ready(Ok(seqs)))
    }

    fn events<'a>(&'a self, from: u64, limit: usize) -> BoxFuture<'a, Result<EventRows, Error>> {
        // Only what is durable, as a real journal.
        let st = self.lock();
        let out = st
            .durable
            .events
            .iter()
            .filter(|e| e.0 >= from)
            .take(limit)
            .map(|e| (e.0, e.1.clone()))
            .collect();
        Box::pin(std::future::ready(Ok(out)))
    }

    fn events_for<'a>(&'a self, key: &'a Digest) -> BoxFuture<'a, Result<EventRows, Error>> {
        let st = self.lock();
        let out = st
            .durable
            .events
            .iter()
            .filter(|e| e.2.as_ref() == Some(key))
            .map(|e| (e.0, e.1.clone()))
            .collect();
        Box::pin(std::future::ready(Ok(out)))
    }

    fn truncate_events(&self, before: u64) -> BoxFuture<'_, Result<u64, Error>> {
        let n = {
            let mut st = self.lock();
            let len = st.live.events.len();
            st.live.events.retain(|e| e.0 >= before);
            let n = (len - st.live.events.len()) as u64;
            Self::barrier(&mut st);
            n
        };
        Box::pin(std::future::ready(Ok(n)))
    }

    fn escalated(&self) -> BoxFuture<'_, Result<Vec<(Digest, Loaded)>, Error>> {
        let st = self.lock();
        let out = st
            .live
            .records
            .iter()
            .filter(|((s, _), r)| *s == Space::Ops && r.escalated)
            .map(|((_, k), r)| (*k, self.loaded(r)))
            .collect();
        Box::pin(std::future::ready(Ok(out)))
    }

    fn scan<'a>(
        &'a self,
        space: Space,
        after: Option<&'a Digest>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<(Digest, Loaded)>, Error>> {
        let st = self.lock();
        let out = st
            .live
            .records
            .iter()
            .filter(|((s, k), _)| *s == space && after.is_none_or(|a| k > a))
            .take(limit)
            .map(|((_, k), r)| (*k, self.loaded(r)))
            .collect();
        Box::pin(std::future::ready(Ok(out)))
    }

    fn remove<'a>(
        &'a self,
        space: Space,
        key: &'a Digest,
        version: u64,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        let mut st = self.lock();
        let removed = match st.live.records.get(&(space, *key)) {
            Some(r) if r.version == version => {
                st.live.records.remove(&(space, *key));
                true
            }
            _ => false,
        };
        Box::pin(std::future::ready(Ok(removed)))
    }

    fn sync(&self) -> BoxFuture<'_, Result<(), Error>> {
        Self::barrier(&mut self.lock());
        Box::pin(std::future::ready(Ok(())))
    }

    fn size_on_disk(&self) -> BoxFuture<'_, Result<u64, Error>> {
        let st = self.lock();
        let n = st
            .durable
            .records
            .values()
            .map(|r| r.body.len() as u64)
            .sum::<u64>()
            + st.durable
                .events
                .iter()
                .map(|e| e.1.len() as u64)
                .sum::<u64>();
        Box::pin(std::future::ready(Ok(n)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: Digest = [7; 32];

    fn put<'a>(expect: Expect, body: &'a [u8], durability: Durability) -> Write<'a> {
        Write {
            space: Space::Ops,
            key: &K,
            expect,
            body,
            claim: ClaimChange::Keep,
            escalated: false,
            events: &[],
            durability,
        }
    }

    #[tokio::test]
    async fn refused_writes_change_nothing_and_applied_ones_do() {
        let mem = MemJournal::new();
        let j = FaultyJournal::new(mem.clone());
        j.fail_write(1, StorageFault::Refused);
        assert!(j
            .write(put(Expect::Absent, b"1", Durability::Eventual))
            .await
            .is_err());
        assert_eq!(j.load(Space::Ops, &K).await.unwrap(), None);
        j.fail_write(2, StorageFault::AppliedThenFailed);
        assert!(j
            .write(put(Expect::Absent, b"2", Durability::Eventual))
            .await
            .is_err());
        let v = j
            .load(Space::Ops, &K)
            .await
            .unwrap()
            .expect("applied")
            .version;
        j.fail_sync(1, StorageFault::Refused);
        assert!(j
            .write(put(Expect::Version(v), b"3", Durability::Immediate))
            .await
            .is_err());
        // The write happened; the failed barrier left it volatile.
        mem.crash();
        assert_eq!(
            j.load(Space::Ops, &K).await.unwrap(),
            None,
            "nothing was durable"
        );
        j.heal();
        assert!(matches!(
            j.write(put(Expect::Absent, b"4", Durability::Immediate))
                .await
                .unwrap(),
            Written::Done { .. }
        ));
        let log = j.log().lock().unwrap().clone();
        assert_eq!(
            log,
            [
                "FAILED write 1 create ops",
                "FAILED write 2 create ops",
                "write 3 update ops",
                "FAILED sync 1",
                "write 4 create ops",
                "sync 2",
            ]
        );
        assert_eq!((j.writes(), j.syncs()), (4, 2));
    }

    #[tokio::test]
    async fn a_crash_forgets_what_no_barrier_covered() {
        let j = MemJournal::new();
        let ev = NewEvent {
            key: None,
            bytes: b"e",
        };
        let Written::Done { version, .. } = j
            .write(put(Expect::Absent, b"a", Durability::Immediate))
            .await
            .unwrap()
        else {
            panic!()
        };
        j.write(put(Expect::Version(version), b"b", Durability::Eventual))
            .await
            .unwrap();
        j.append(&[ev], Durability::Eventual).await.unwrap();
        assert_eq!(j.load(Space::Ops, &K).await.unwrap().unwrap().body, b"b");
        assert!(
            j.events(0, 10).await.unwrap().is_empty(),
            "events are read once durable"
        );
        j.crash();
        let after = j.load(Space::Ops, &K).await.unwrap().unwrap();
        assert_eq!((after.body.as_slice(), after.version), (&b"a"[..], version));
        // Versions are never reused after a crash.
        let Written::Done { version: next, .. } = j
            .write(put(Expect::Version(version), b"c", Durability::Immediate))
            .await
            .unwrap()
        else {
            panic!()
        };
        assert!(next > version + 1);
        assert!(j.events(0, 10).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn leases_expire_on_the_clock_and_renewal_extends_them() {
        let clock = idem_runtime::ManualClock::new(1_000);
        let j = MemJournal::with_leases(Arc::new(clock.clone()), Duration::from_secs(3));
        let me = Owner {
            worker: Arc::from("w1"),
            incarnation: 1,
        };
        let w = Write {
            claim: ClaimChange::Take(&me),
            ..put(Expect::Absent, b"a", Durability::Immediate)
        };
        let Written::Done { epoch, .. } = j.write(w).await.unwrap() else {
            panic!()
        };
        assert_eq!(epoch, 1);
        let live = |j: &MemJournal| {
            let l = futures_lite_block(j.load(Space::Ops, &K)).unwrap().unwrap();
            l.claim.unwrap().live
        };
        assert!(live(&j));
        clock.advance(Duration::from_secs(2));
        let held = [Held {
            space: Space::Ops,
            key: K,
            epoch,
        }];
        assert_eq!(j.renew(&me, &held).await.unwrap(), [true]);
        clock.advance(Duration::from_secs(2));
        assert!(live(&j), "renewed");
        clock.advance(Duration::from_secs(2));
        assert!(!live(&j), "expired");
        let other = Owner {
            worker: Arc::from("w2"),
            incarnation: 9,
        };
        assert_eq!(
            j.renew(&other, &held).await.unwrap(),
            [false],
            "not its claim"
        );
    }

    fn futures_lite_block<T>(f: BoxFuture<'_, T>) -> T {
        // The memory journal's futures are ready at once.
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut f = f;
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(v) => v,
            std::task::Poll::Pending => panic!("not ready"),
        }
    }
}
