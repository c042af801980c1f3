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

/// The channel waiters of a key wait on: made by the first waiter, so a
/// call nobody waits for (nearly every call) makes none. The receiver is
/// the channel's first, which every waiter clones: a waiter that comes
/// after the leader shared its outcome sees the change at once, as it
/// would had the channel been there from the start.
type Waiters = (
    watch::Sender<Option<LeaderOutcome>>,
    watch::Receiver<Option<LeaderOutcome>>,
);

struct Entry_ {
    waiters: Option<Waiters>,
    /// What the leader shared, for a channel made after it did.
    shared: Option<LeaderOutcome>,
    held: HeldCell,
}

/// A key digest as the table's key: SHA-256 output is uniform already, so
/// its first eight bytes are what is hashed (under the map's random key,
/// as all 32 bytes and their length were: collisions still cannot be aimed
/// at); equality compares all of it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct DigestKey(pub(crate) Digest);

impl std::hash::Hash for DigestKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let mut head = [0u8; 8];
        head.copy_from_slice(&self.0[..8]);
        state.write_u64(u64::from_le_bytes(head));
    }
}

/// The table; one per journal, shared by every runtime built on it
/// ([`Local::of`]).
#[derive(Default)]
pub struct Local {
    slots: Mutex<HashMap<DigestKey, Entry_>>,
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

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<DigestKey, Entry_>> {
        lock(&self.slots)
    }

    /// Becomes the key's leader, or learns who is.
    pub fn enter(&self, digest: &Digest) -> Entry<'_> {
        let mut slots = self.lock();
        if let Some(e) = slots.get_mut(&DigestKey(*digest)) {
            let (_, rx) = e.waiters.get_or_insert_with(|| {
                let (tx, rx) = watch::channel(None);
                if let Some(shared) = &e.shared {
                    tx.send_replace(Some(shared.clone()));
                }
                (tx, rx)
            });
            return Entry::Busy(rx.clone());
        }
        let held = HeldCell::default();
        slots.insert(
            DigestKey(*digest),
            Entry_ {
                waiters: None,
                shared: None,
                held: held.clone(),
            },
        );
        Entry::Leader(Slot {
            table: self,
            digest: *digest,
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
        let mut slots = self.table.lock();
        if let Some(e) = slots.get_mut(&DigestKey(self.digest)) {
            if let Some((tx, _)) = &e.waiters {
                tx.send_replace(Some(outcome.clone()));
            }
            e.shared = Some(outcome);
        }
    }

    /// Records the claim this leader holds now (`None`: released).
    pub fn hold(&self, held: Option<Held>) {
        *lock(&self.held) = held;
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        // Leave the table before the sender drops (with the entry, after
        // the table's lock), so a woken waiter finds the slot free.
        let entry = self.table.lock().remove(&DigestKey(self.digest));
        drop(entry);
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

    /// The channel is made by the first waiter; one that comes after the
    /// leader shared sees the outcome at once (before the leader goes), as
    /// every waiter did when each leader made its channel up front.
    #[tokio::test]
    async fn waiters_after_a_share_see_it_at_once_and_share_one_channel() {
        let table = Local::default();
        let key = [3; 32];
        let Entry::Leader(slot) = table.enter(&key) else {
            panic!("first entry must lead")
        };
        slot.share(Arc::new(9u32));
        assert!(
            table.lock()[&DigestKey(key)].waiters.is_none(),
            "nobody waits: no channel"
        );
        let Entry::Busy(mut first) = table.enter(&key) else {
            panic!("second entry must wait")
        };
        let Entry::Busy(mut second) = table.enter(&key) else {
            panic!("third entry must wait")
        };
        for rx in [&mut first, &mut second] {
            assert!(rx.has_changed().unwrap(), "the share is news to a waiter");
            rx.changed().await.expect("the leader is still there");
            let seen = rx.borrow_and_update().clone().expect("shared");
            assert_eq!(seen.downcast_ref::<u32>(), Some(&9));
        }
        drop(slot);
        for rx in [&mut first, &mut second] {
            assert!(
                rx.changed().await.is_err(),
                "both woken by the leader leaving"
            );
        }
        assert!(table.lock().is_empty());
    }
}
