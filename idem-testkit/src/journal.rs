//! Storage faults: a journal that fails its n-th write or sync on command,
//! as a full disk or an I/O error would, and logs every write and sync so
//! that a test can check what happened before and after the fault.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use idem_runtime::journal::{Cas, Journal, ScanIter, Space, SyncFuture};
use idem_runtime::Error;

/// How a failing write or sync fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageFault {
    /// Refused before anything changed (ENOSPC).
    Refused,
    /// The change happened, then the call reported an error (EIO after the
    /// fact): the worst case for an engine that trusts error codes.
    AppliedThenFailed,
}

impl StorageFault {
    fn detail(self) -> &'static str {
        match self {
            StorageFault::Refused => "No space left on device (os error 28)",
            StorageFault::AppliedThenFailed => "Input/output error (os error 5)",
        }
    }
}

/// Wraps a journal; fails the write (compare-and-swap, insert, remove,
/// append, truncate) or the sync with a chosen 1-based index.
///
/// The log holds, in order, `write <n> <op> <space>` (or `FAILED write ...`)
/// for each write, `sync <n>` when a sync *completed* (or `FAILED sync <n>`),
/// and whatever the test adds (e.g. the provider's calls), so a test can
/// assert that nothing reached a provider after a fault, or that a sync
/// finished before a call.
pub struct FaultyJournal {
    inner: Arc<dyn Journal>,
    log: Arc<Mutex<Vec<String>>>,
    fail_write: AtomicUsize,
    fail_sync: AtomicUsize,
    applied_then_failed: AtomicBool,
    writes: AtomicUsize,
    syncs: AtomicUsize,
}

fn lock(log: &Mutex<Vec<String>>) -> MutexGuard<'_, Vec<String>> {
    log.lock().unwrap_or_else(|p| p.into_inner())
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
        })
    }

    /// Fails the `n`-th write from the start (1-based; 0: none) with `fault`.
    pub fn fail_write(&self, n: usize, fault: StorageFault) {
        self.set_fault(fault);
        self.fail_write.store(n, Ordering::SeqCst);
    }

    /// Fails the `n`-th sync from the start (1-based; 0: none) with `fault`.
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

    /// Syncs attempted so far.
    pub fn syncs(&self) -> usize {
        self.syncs.load(Ordering::SeqCst)
    }

    /// The log (shared: tests add their own lines to it).
    pub fn log(&self) -> Arc<Mutex<Vec<String>>> {
        self.log.clone()
    }

    fn error(&self, op: &'static str) -> Error {
        Error::Storage {
            op,
            location: self.inner.location().to_string(),
            detail: self.fault().detail().into(),
        }
    }

    /// Runs one write, failing it if it is the chosen one.
    fn write<R>(
        &self,
        op: &'static str,
        space: Space,
        apply: impl FnOnce() -> Result<R, Error>,
    ) -> Result<R, Error> {
        let n = self.writes.fetch_add(1, Ordering::SeqCst) + 1;
        if n != self.fail_write.load(Ordering::SeqCst) {
            lock(&self.log).push(format!("write {n} {op} {}", space.name()));
            return apply();
        }
        lock(&self.log).push(format!("FAILED write {n} {op} {}", space.name()));
        if self.fault() == StorageFault::AppliedThenFailed {
            let _ = apply();
        }
        Err(self.error(op))
    }

    /// The number of this sync if it is the one to fail.
    fn failing_sync(&self) -> Option<usize> {
        let n = self.syncs.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.fail_sync.load(Ordering::SeqCst) {
            lock(&self.log).push(format!("FAILED sync {n}"));
            None
        } else {
            Some(n)
        }
    }
}

impl Journal for FaultyJournal {
    fn location(&self) -> &str {
        self.inner.location()
    }

    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        self.inner.get(space, key)
    }

    fn compare_and_swap(
        &self,
        space: Space,
        key: &[u8],
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<Cas, Error> {
        self.write("compare_and_swap", space, || {
            self.inner.compare_and_swap(space, key, expected, new)
        })
    }

    fn insert(&self, space: Space, key: &[u8], value: &[u8]) -> Result<(), Error> {
        self.write("insert", space, || self.inner.insert(space, key, value))
    }

    fn remove(&self, space: Space, key: &[u8]) -> Result<(), Error> {
        self.write("remove", space, || self.inner.remove(space, key))
    }

    fn append(&self, space: Space, value: &[u8]) -> Result<u64, Error> {
        self.write("append", space, || self.inner.append(space, value))
    }

    fn truncate(&self, space: Space, before: &[u8]) -> Result<u64, Error> {
        self.write("truncate", space, || self.inner.truncate(space, before))
    }

    fn scan(&self, space: Space, from: &[u8]) -> ScanIter<'_> {
        self.inner.scan(space, from)
    }

    fn sync(&self) -> SyncFuture {
        match self.failing_sync() {
            Some(n) => {
                let (inner, log) = (self.inner.sync(), self.log.clone());
                Box::pin(async move {
                    let result = inner.await;
                    lock(&log).push(format!("sync {n}"));
                    result
                })
            }
            None => {
                let err = self.error("sync");
                let applied =
                    (self.fault() == StorageFault::AppliedThenFailed).then(|| self.inner.sync());
                Box::pin(async move {
                    if let Some(sync) = applied {
                        let _ = sync.await;
                    }
                    Err(err)
                })
            }
        }
    }

    fn sync_blocking(&self) -> Result<(), Error> {
        match self.failing_sync() {
            Some(n) => {
                let result = self.inner.sync_blocking();
                lock(&self.log).push(format!("sync {n}"));
                result
            }
            None => {
                if self.fault() == StorageFault::AppliedThenFailed {
                    let _ = self.inner.sync_blocking();
                }
                Err(self.error("sync"))
            }
        }
    }

    fn size_on_disk(&self) -> Result<u64, Error> {
        self.inner.size_on_disk()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_runtime::SledJournal;

    fn journal() -> (tempfile::TempDir, Arc<FaultyJournal>) {
        let dir = tempfile::TempDir::new().unwrap();
        let j = FaultyJournal::new(Arc::new(SledJournal::open(dir.path()).unwrap()));
        (dir, j)
    }

    #[tokio::test]
    async fn refused_writes_change_nothing_and_applied_ones_do() {
        let (_dir, j) = journal();
        j.fail_write(1, StorageFault::Refused);
        assert!(j.insert(Space::Steps, b"a", b"1").is_err());
        assert_eq!(j.get(Space::Steps, b"a").unwrap(), None);
        j.fail_write(2, StorageFault::AppliedThenFailed);
        assert!(j.insert(Space::Steps, b"b", b"2").is_err());
        assert_eq!(
            j.get(Space::Steps, b"b").unwrap().as_deref(),
            Some(&b"2"[..])
        );
        j.fail_sync(1, StorageFault::Refused);
        assert!(j.sync().await.is_err());
        assert!(j.sync().await.is_ok());
        j.heal();
        j.insert(Space::Steps, b"c", b"3").unwrap();
        let log = j.log().lock().unwrap().clone();
        assert_eq!(
            log,
            [
                "FAILED write 1 insert steps",
                "FAILED write 2 insert steps",
                "FAILED sync 1",
                "sync 2",
                "write 3 insert steps",
            ]
        );
        assert_eq!((j.writes(), j.syncs()), (3, 2));
    }
}
