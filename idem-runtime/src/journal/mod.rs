//! Where the engine's state lives: the [`Journal`] trait and its embedded
//! implementation on sled, [`SledJournal`].
//!
//! The trait is a small ordered key-value store with compare-and-swap and a
//! durability barrier. The engine owns the record format (see `record.rs`),
//! so every implementation stores opaque bytes and corruption is detected in
//! one place.

use std::future::Future;
use std::pin::Pin;

use crate::error::Error;

mod events;
mod sled;
mod wal;

pub use self::sled::{SledJournal, SledOptions};

/// The key spaces of a journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Space {
    /// One record per logical operation, keyed by its key digest.
    Ops,
    /// The audit stream, keyed by big-endian sequence number.
    Audit,
    /// Memoized step results.
    Steps,
    /// Index of escalated operations (key digest → empty).
    Escalations,
    /// Journal metadata (format version).
    Meta,
}

impl Space {
    /// Every space, in a fixed order.
    pub const ALL: [Space; 5] = [
        Space::Ops,
        Space::Audit,
        Space::Steps,
        Space::Escalations,
        Space::Meta,
    ];

    /// The space's name in storage.
    pub fn name(self) -> &'static str {
        match self {
            Space::Ops => "ops",
            Space::Audit => "audit",
            Space::Steps => "steps",
            Space::Escalations => "escalations",
            Space::Meta => "meta",
        }
    }
}

/// Outcome of [`Journal::compare_and_swap`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cas {
    /// The value was replaced.
    Swapped,
    /// The stored value was not the expected one; nothing was written.
    Conflict {
        /// What is stored now.
        current: Option<Vec<u8>>,
    },
}

/// A pending durability barrier; see [`Journal::sync`].
pub type SyncFuture = Pin<Box<dyn Future<Output = Result<(), Error>> + Send + 'static>>;

/// An iterator over a key space, in key order.
pub type ScanIter<'a> = Box<dyn Iterator<Item = Result<(Vec<u8>, Vec<u8>), Error>> + Send + 'a>;

/// Durable storage for the engine.
///
/// Writes become visible at once and durable at the next completed
/// [`sync`](Journal::sync). The engine never calls a provider before the
/// `sync` that covers the operation's INTENT has completed successfully.
pub trait Journal: Send + Sync + 'static {
    /// Where the journal lives, for error messages.
    fn location(&self) -> &str;

    /// Reads a value.
    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>, Error>;

    /// Atomically replaces the value at `key` if it is `expected` (`None`:
    /// absent). `new: None` removes it.
    fn compare_and_swap(
        &self,
        space: Space,
        key: &[u8],
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<Cas, Error>;

    /// [`compare_and_swap`](Journal::compare_and_swap), then, if it
    /// swapped, [`append`](Journal::append) each of `events` to the audit
    /// space, as one unit of durability: no completed `sync` may cover part
    /// of it. (A state change and the event that records it must not be
    /// split by a crash.) Returns the events' sequence numbers.
    ///
    /// The default does the steps in turn, which is a unit only if nothing
    /// syncs in between; implementations with concurrent syncs override it.
    fn compare_and_swap_with_events(
        &self,
        space: Space,
        key: &[u8],
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
        events: &[Vec<u8>],
    ) -> Result<(Cas, Vec<u64>), Error> {
        let cas = self.compare_and_swap(space, key, expected, new)?;
        let mut seqs = Vec::with_capacity(events.len());
        if cas == Cas::Swapped {
            for event in events {
                seqs.push(self.append(Space::Audit, event)?);
            }
        }
        Ok((cas, seqs))
    }

    /// Writes a value unconditionally.
    fn insert(&self, space: Space, key: &[u8], value: &[u8]) -> Result<(), Error>;

    /// Removes a value (absent is fine).
    fn remove(&self, space: Space, key: &[u8]) -> Result<(), Error>;

    /// Appends a value under a fresh, increasing sequence number (stored as
    /// its big-endian bytes) and returns the number.
    fn append(&self, space: Space, value: &[u8]) -> Result<u64, Error>;

    /// Removes every entry of `space` whose key sorts before `before`
    /// (for the audit space: every event with a smaller sequence number,
    /// possibly keeping a few that share storage with later ones). Returns
    /// how many entries went.
    fn truncate(&self, space: Space, before: &[u8]) -> Result<u64, Error>;

    /// Iterates a space from `from` (inclusive) in key order.
    fn scan(&self, space: Space, from: &[u8]) -> ScanIter<'_>;

    /// Makes every write that completed before this call durable (fsync).
    /// Concurrent callers share physical flushes (group commit).
    fn sync(&self) -> SyncFuture;

    /// [`sync`](Journal::sync) for callers outside async code.
    fn sync_blocking(&self) -> Result<(), Error>;

    /// Bytes used on disk.
    fn size_on_disk(&self) -> Result<u64, Error>;
}
