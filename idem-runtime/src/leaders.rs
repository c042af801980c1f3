//! The calls being driven in this process, by key digest: the fast path by
//! which a duplicate call waits for the one already running instead of
//! asking the journal.
//!
//! The first call of a key becomes its leader and holds a [`Slot`]; later
//! calls get a receiver that wakes when the slot is dropped, which happens
//! when the leader finishes *or* when its future is dropped, so no waiter
//! outlives its leader. Before it goes, a leader may leave its outcome for
//! the waiters ([`Slot::share`]): concurrent duplicates of one call share
//! one decision.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::watch;

use idem_journal::journal::{Digest, Held, Journal};

/// What a leader leaves for its waiters.
pub type LeaderOutcome = Arc<dyn Any + Send + Sync>;

/// The claim a leader holds, if it took one (for lease renewal).
type HeldCell = Arc<Mutex<Option<Held>>>;

struct Entry_ {
    rx: watch::Receiver<Option<LeaderOutcome>>,
    held: HeldCell,
}

/// The table; one per journal, shared by every runtime built on it
/// ([`Local::of`]).
#[derive(Default)]
pub struct Local {
    slots: Mutex<HashMap<Digest, Entry_>>,
}

impl std::fmt::Debug for Local {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Local")
            .field("in_flight", &self.lock().len())
            .finish()
    }
}

/// The answer of [`Local::enter`].
pub enum Entry<'a> {
    /// Nobody in this process drives the key: the caller does now.
    Leader(Slot<'a>),
    /// Someone does; wait on the receiver.
    Busy(watch::Receiver<Option<LeaderOutcome>>),
}

/// A leader's hold on a key.
pub struct Slot<'a> {
    table: &'a Local,
    digest: Digest,
    tx: watch::Sender<Option<LeaderOutcome>>,
    held: HeldCell,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The tables of the journals runtimes are built on, by journal object:
/// two runtimes on one journal must share one table, or each would take
/// the other's calls for dead ones (a journal used by one process answers
/// [`Claim::live`](idem_journal::journal::Claim::live) false and leaves
/// liveness to this table).
type Tables = Vec<(Weak<dyn Journal>, Weak<Local>)>;

static TABLES: Mutex<Tables> = Mutex::new(Vec::new());

impl Local {
    /// The table of `journal`: the one every other runtime on this journal
    /// object uses, else a new one.
    pub fn of(journal: &Arc<dyn Journal>) -> Arc<Local> {
        let mut tables = lock(&TABLES);
        tables.retain(|(j, t)| j.strong_count() > 0 && t.strong_count() > 0);
        let found = tables
            .iter()
            .find(|(j, _)| std::ptr::addr_eq(j.as_ptr(), Arc::as_ptr(journal)))
            .and_then(|(_, t)| t.upgrade());
        found.unwrap_or_else(|| {
            let table = Arc::new(Local::default());
            tables.push((Arc::downgrade(journal), Arc::downgrade(&table)));
            table
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Digest, Entry_>> {
        lock(&self.slots)
    }

    /// Becomes the key's leader, or learns who is.
    pub fn enter(&self, digest: &Digest) -> Entry<'_> {
        let mut slots = self.lock();
        if let Some(e) = slots.get(digest) {
            return Entry::Busy(e.rx.clone());
        }
        let (tx, rx) = watch::channel(None);
        let held = HeldCell::default();
        slots.insert(
            *digest,
            Entry_ {
                rx,
                held: held.clone(),
            },
        );
        Entry::Leader(Slot {
            table: self,
            digest: *digest,
            tx,
            held,
        })
    }

    /// The claims the leaders of this process hold (to renew their leases).
    pub fn held(&self) -> Vec<Held> {
        self.lock()
            .values()
            .filter_map(|e| *lock(&e.held))
            .collect()
    }
}

impl Slot<'_> {
    /// Leaves `outcome` for the waiters, who see it when the slot goes.
    pub fn share(&self, outcome: LeaderOutcome) {
        self.tx.send_replace(Some(outcome));
    }

    /// Records the claim this leader holds now (`None`: released).
    pub fn hold(&self, held: Option<Held>) {
        *lock(&self.held) = held;
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        // Leave the table before the sender drops, so a woken waiter finds
        // the slot free.
        self.table.lock().remove(&self.digest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_waiter_wakes_when_the_leader_goes_and_sees_what_it_shared() {
        let table = Local::default();
        let key = [1; 32];
        let Entry::Leader(slot) = table.enter(&key) else {
            panic!("first entry must lead")
        };
        let Entry::Busy(mut rx) = table.enter(&key) else {
            panic!("second entry must wait")
        };
        assert_eq!(table.lock().len(), 1);
        slot.share(Arc::new(7u32));
        drop(slot);
        // The sender is gone: changed() returns at once, value or not.
        let _ = rx.changed().await;
        let shared = rx.borrow().clone().expect("the leader shared its outcome");
        assert_eq!(shared.downcast_ref::<u32>(), Some(&7));
        assert!(table.lock().is_empty());
        assert!(matches!(table.enter(&key), Entry::Leader(_)));
    }

    #[tokio::test]
    async fn a_dropped_leader_wakes_waiters_with_nothing_shared() {
        let table = Local::default();
        let key = [2; 32];
        let slot = table.enter(&key);
        let Entry::Busy(mut rx) = table.enter(&key) else {
            panic!("second entry must wait")
        };
        drop(slot);
        assert!(rx.changed().await.is_err(), "sender dropped");
        assert!(rx.borrow().is_none());
    }
}
