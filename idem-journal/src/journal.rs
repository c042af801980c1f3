//! The [`Journal`] trait: where the engine's state lives, and what every
//! backend (the embedded one on sled, the shared one on PostgreSQL, a
//! third of your own) must guarantee.
//!
//! A journal stores *records* (one per operation or memoized step, opaque
//! bytes whose format the engine owns, see `record.rs`) and the *audit
//! stream*. What it adds to a key-value store is what the engine needs to
//! be correct with one process or many:
//!
//! - **versions**: every write of a record is conditional on the version
//!   the writer last saw ([`Expect`]) and produces a new one, so a writer
//!   that lost a race (or a claim) changes nothing and re-decides from the
//!   fresh record;
//! - **claims**: an INTENT is claimed by an [`Owner`] (worker id +
//!   incarnation) with an *epoch*, incremented on every takeover: the
//!   fencing token. Whether a claim's driver may still be alive is the
//!   journal's call ([`Claim::live`]): a journal used by one process only
//!   (sled) answers false, and the engine's own table of the calls it
//!   drives tells which of them live; a shared database judges by a lease
//!   on its own clock;
//! - **units**: a record, the audit events that record its change and its
//!   membership of the escalation index are written together or not at all
//!   ([`Write`]): the audit stream never says what the state does not;
//! - **durability levels** named in the API ([`Durability`]) instead of
//!   special cases per kind of write;
//! - a **commit-ordered** audit stream: a reader of [`Journal::events`]
//!   never skips an event that becomes visible later with a lower number.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::error::Error;

/// A boxed future, as the journal's methods return (the trait is used as
/// `dyn Journal`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Audit events as a journal stores them: (sequence number, bytes).
pub type EventRows = Vec<(u64, Vec<u8>)>;

/// A record's key: the SHA-256 digest of its operation key.
pub type Digest = [u8; 32];

/// The kinds of record a journal holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Space {
    /// One record per logical operation.
    Ops,
    /// One record per memoized step.
    Steps,
}

impl Space {
    /// Both spaces.
    pub const ALL: [Space; 2] = [Space::Ops, Space::Steps];

    /// The space's name in storage.
    pub fn name(self) -> &'static str {
        match self {
            Space::Ops => "ops",
            Space::Steps => "steps",
        }
    }
}

/// Who drives a claimed record: a worker and one incarnation of it (a
/// process lifetime, or one `Runtime`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Owner {
    /// The worker's stable id (e.g. a pod name); the same after a restart.
    pub worker: Arc<str>,
    /// Differs between incarnations of the same worker.
    pub incarnation: u64,
}

impl Owner {
    /// Whether `other` is an earlier (or later) incarnation of this worker:
    /// then it is not running, whatever its lease says, because a worker id
    /// names one live process at a time.
    pub fn is_other_incarnation_of_same_worker(&self, other: &Owner) -> bool {
        self.worker == other.worker && self.incarnation != other.incarnation
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}#{:016x}", self.worker, self.incarnation)
    }
}

/// The claim on a record, as loaded.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Claim {
    /// Who claimed it.
    pub owner: Owner,
    /// Whether its driver may still be running *outside this process*
    /// (the engine knows the calls it drives itself): false for the sled
    /// journal (one process), the lease's validity on the database's clock
    /// for a shared journal.
    pub live: bool,
}

/// A record as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded {
    /// Changes on every write of the record.
    pub version: u64,
    /// Incremented by every [`ClaimChange::Take`]: the fencing token.
    pub epoch: u64,
    /// The record's bytes.
    pub body: Vec<u8>,
    /// The current claim, if the record is claimed.
    pub claim: Option<Claim>,
}

/// The condition of a [`Write`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// The record must not exist.
    Absent,
    /// The record must be at this version.
    Version(u64),
}

/// What a [`Write`] does to the record's claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimChange<'a> {
    /// Leave it as it is.
    Keep,
    /// Claim it for this owner under a new epoch (the previous one + 1).
    Take(&'a Owner),
    /// No claim any more (the epoch is kept for the next take).
    Release,
}

/// How durable a write is when it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Durability {
    /// Durable (fsynced, or committed to a database that fsyncs) before
    /// the write returns. Concurrent immediate writes share the barrier.
    Immediate,
    /// Visible at once, durable within a bounded time (the journal's
    /// documented delay) or at the next immediate write, whichever comes
    /// first. A crash may lose it; it never becomes durable out of order
    /// with immediate writes made after it.
    Eventual,
}

/// An audit event to append: its bytes, and the digest of the operation it
/// is about (for [`Journal::events_for`]).
#[derive(Debug, Clone, Copy)]
pub struct NewEvent<'a> {
    /// The operation's digest, if the event is about one.
    pub key: Option<&'a Digest>,
    /// The encoded event.
    pub bytes: &'a [u8],
}

/// One conditional write of a record, with everything that must change
/// with it.
#[derive(Debug, Clone, Copy)]
pub struct Write<'a> {
    /// Which space.
    pub space: Space,
    /// The record's key.
    pub key: &'a Digest,
    /// The condition; nothing is written unless it holds.
    pub expect: Expect,
    /// The new bytes.
    pub body: &'a [u8],
    /// What happens to the claim.
    pub claim: ClaimChange<'a>,
    /// Whether the record is in the escalation index afterwards.
    pub escalated: bool,
    /// Audit events recording the change, appended in the same unit.
    pub events: &'a [NewEvent<'a>],
    /// When the write (events included) must be durable.
    pub durability: Durability,
}

/// The outcome of a [`Write`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// The write happened.
    Done {
        /// The record's new version.
        version: u64,
        /// Its epoch after the write.
        epoch: u64,
        /// The sequence numbers of the events, in order.
        seqs: Vec<u64>,
    },
    /// The condition did not hold; nothing was written.
    Conflict,
}

/// The outcome of a [`Journal::claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    /// The record was absent and is now written, as [`Written::Done`].
    Done {
        /// The record's version.
        version: u64,
        /// Its epoch.
        epoch: u64,
        /// The sequence numbers of the events, in order.
        seqs: Vec<u64>,
    },
    /// The record exists; nothing was written. What a
    /// [`load`](Journal::load) returns for it; `None` if it was gone again
    /// by the time the journal looked (read it again).
    Exists(Option<Loaded>),
}

/// [`Journal::claim`] in two steps, a write and, after a conflict, a load:
/// the trait's default, for journals (and wrappers) to build on.
pub async fn write_then_load<J: Journal + ?Sized>(
    journal: &J,
    write: Write<'_>,
) -> Result<Claimed, Error> {
    let (space, key) = (write.space, write.key);
    debug_assert!(matches!(write.expect, Expect::Absent));
    Ok(match journal.write(write).await? {
        Written::Done {
            version,
            epoch,
            seqs,
        } => Claimed::Done {
            version,
            epoch,
            seqs,
        },
        Written::Conflict => Claimed::Exists(journal.load(space, key).await?),
    })
}

/// A claim this process holds, for [`Journal::renew`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// Which space.
    pub space: Space,
    /// The record's key.
    pub key: Digest,
    /// The epoch of the claim.
    pub epoch: u64,
}

/// Durable storage for the engine. See the module documentation for what
/// each operation guarantees.
///
/// Writes become visible at once. The engine never calls a provider before
/// the [`Durability::Immediate`] write of its INTENT has returned `Ok`; a
/// write that returns an error may or may not have happened (the engine
/// reloads and re-decides).
pub trait Journal: Send + Sync + 'static {
    /// Where the journal lives, for error messages.
    fn location(&self) -> &str;

    /// The journal's clock, if it has one the engine should use for durable
    /// timestamps (a shared database's, corrected for this machine's skew);
    /// `None`: the runtime's clock.
    fn clock(&self) -> Option<Arc<dyn Clock>> {
        None
    }

    /// Whether the engine should claim a key before reading it (default
    /// false). For a journal whose every read is a round trip to a server,
    /// a call on a new key then costs its INTENT and its commit, not a
    /// read besides: the INTENT is written with [`Journal::claim`], as for
    /// an absent record, and if the record exists the claim changes
    /// nothing and returns it, and the engine decides from it as it would
    /// have from a read.
    fn claim_first(&self) -> bool {
        false
    }

    /// Whether every write is a round trip to a server (PostgreSQL). The
    /// runtime then holds the audit events that record no decision (a
    /// replay's dedupe hit) for up to 20 ms and appends them together, at
    /// [`Durability::Eventual`], so that a replay answered from memory
    /// waits for no server; a process that dies loses what it held.
    fn remote(&self) -> bool {
        false
    }

    /// How often an owner must [`renew`](Journal::renew) the claims it
    /// drives; `None` if claims do not expire (the journal knows its
    /// drivers without leases).
    fn renewal(&self) -> Option<Duration> {
        None
    }

    /// Reads a record. Bytes that cannot be read are an error, never
    /// "absent".
    fn load<'a>(
        &'a self,
        space: Space,
        key: &'a Digest,
    ) -> BoxFuture<'a, Result<Option<Loaded>, Error>>;

    /// Writes a record, its events and its escalation-index membership as
    /// one unit, if `write.expect` holds.
    fn write<'a>(&'a self, write: Write<'a>) -> BoxFuture<'a, Result<Written, Error>>;

    /// A [`write`](Journal::write) that expects the record absent
    /// ([`Expect::Absent`]) and, when it exists, returns what
    /// [`load`](Journal::load) would: how the engine claims a key without
    /// reading it first ([`Journal::claim_first`]). The default writes,
    /// then reads after a conflict; a journal on a server answers both in
    /// one round trip.
    fn claim<'a>(&'a self, write: Write<'a>) -> BoxFuture<'a, Result<Claimed, Error>> {
        Box::pin(write_then_load(self, write))
    }

    /// Extends the leases of claims `owner` holds; answers, per claim,
    /// whether it is still held (false: fenced off by a takeover).
    fn renew<'a>(
        &'a self,
        owner: &'a Owner,
        held: &'a [Held],
    ) -> BoxFuture<'a, Result<Vec<bool>, Error>> {
        let _ = owner;
        Box::pin(async move { Ok(vec![true; held.len()]) })
    }

    /// Resolves when the record may have moved past `version` (written by
    /// another process), or after the journal's polling interval, whichever
    /// comes first; the caller reloads either way.
    fn changed<'a>(&'a self, space: Space, key: &'a Digest, version: u64) -> BoxFuture<'a, ()>;

    /// Appends events that record no state change (a dedupe hit, a verify
    /// verdict, a refusal) and returns their sequence numbers.
    fn append<'a>(
        &'a self,
        events: &'a [NewEvent<'a>],
        durability: Durability,
    ) -> BoxFuture<'a, Result<Vec<u64>, Error>>;

    /// Up to `limit` events from sequence number `from` (inclusive), in
    /// order. Commit-ordered: no event with a sequence number below the
    /// last one returned becomes visible later.
    fn events<'a>(&'a self, from: u64, limit: usize) -> BoxFuture<'a, Result<EventRows, Error>>;

    /// Every event about the operation with digest `key`, in order. The
    /// default reads the whole stream.
    fn events_for<'a>(&'a self, key: &'a Digest) -> BoxFuture<'a, Result<EventRows, Error>> {
        let _ = key;
        Box::pin(async move {
            let mut out = Vec::new();
            let mut from = 0;
            loop {
                let page = self.events(from, 4096).await?;
                let Some(last) = page.last().map(|e| e.0) else {
                    return Ok(out);
                };
                out.extend(page);
                from = last + 1;
            }
        })
    }

    /// Removes every event with a sequence number below `before` (possibly
    /// keeping a few that share storage with later ones); returns how many
    /// went.
    fn truncate_events(&self, before: u64) -> BoxFuture<'_, Result<u64, Error>>;

    /// The records in the escalation index.
    fn escalated(&self) -> BoxFuture<'_, Result<Vec<(Digest, Loaded)>, Error>>;

    /// Up to `limit` records of `space` with keys after `after` (all if
    /// `None`), in key order.
    fn scan<'a>(
        &'a self,
        space: Space,
        after: Option<&'a Digest>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<(Digest, Loaded)>, Error>>;

    /// Removes a record if it is still at `version` (retention); false if
    /// it changed meanwhile.
    fn remove<'a>(
        &'a self,
        space: Space,
        key: &'a Digest,
        version: u64,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    /// Makes every write that returned before this call durable.
    fn sync(&self) -> BoxFuture<'_, Result<(), Error>>;

    /// Bytes used on disk.
    fn size_on_disk(&self) -> BoxFuture<'_, Result<u64, Error>>;
}
