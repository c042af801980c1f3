//! The running sled journal: writes, reads, the group commit, eventual
//! durability and checkpoints.
//!
//! A write is decided and logged under one lock: its condition is checked
//! against the newest value (the overlay, else sled, else the tables), its
//! unit appended to the pending log buffer, and the overlay updated, so the
//! log's order of changes is the order they were decided in. A barrier
//! takes every pending unit and every waiter, writes and fdatasyncs once,
//! and answers them all (group commit).
//!
//! Nothing else is written on a call's path: the overlay holds every
//! change since the last checkpoint, and a checkpoint (on its own thread,
//! once the current segment is large) settles the rotated-away segments
//! (`settle.rs`: settled records into a new table, events into a new audit
//! file, what can still change into sled), writes the manifest and drops
//! the overlay entries they covered. Tables are merged on another thread
//! (`merge.rs`). The segments stay: with the last image of sled they are
//! the second copy of sled's content that repairs sled after a power cut.
//! Once they outgrow that image, a new one is written (on another thread)
//! and the segments it covers are deleted. See `image.rs`.
//!
//! A read looks in the overlay, then sled, then the tables from the
//! newest. A checkpoint moves a key from the overlay to sled or a table
//! while a read may be between the two: a key written after the read
//! missed it in the overlay, and checkpointed before the read reached
//! sled, is gone from sled before its table is installed. A checkpoint
//! therefore bumps a counter before it changes sled and when it installs
//! its files; a read notes the counter when it looks at the overlay and
//! starts again if it moved before the read finished. (A write decides
//! under the state lock, and the keys a running checkpoint takes out of
//! sled are all still in the overlay until its install, so a write never
//! needs to.)
//!
//! A fresh call reads its key, finds nothing, then writes it expecting it
//! absent: two lookups that each probe every table's Bloom filter, the
//! second under the state lock, and more of them as the tables grow. A
//! read that found a key in no table notes so with the counter (and only
//! if the counter had not moved, so the tables it probed are the state's
//! tables); the next write of that key skips the tables while the counter
//! is unchanged, since no table has been installed or merged since and a
//! table never changes. The overlay and sled it reads as always.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::apply::{self, Trees};
use crate::audit::AuditFile;
use crate::digest::{self, Digest as ContentDigest};
use crate::files::{self, AuditMeta, Manifest, TableMeta};
use crate::stored;
use crate::table::{self, Found, ReadError, Table};
use crate::wal::{self, Change, Tree};
use crate::{image, memory, merge, settle};
use idem_journal::error::Error;
use idem_journal::journal::{
    ClaimChange, Digest, EventRows, Expect, Loaded, NewEvent, Write, Written,
};
use idem_journal::record::Kind;

/// How many segments' worth of log (`checkpoint_bytes` each) may pile up
/// while a checkpoint runs before writers wait for it: bounds the log since
/// the last checkpoint, and the overlay that holds it in memory, to about
/// `(BACKLOG + 1) × checkpoint_bytes` whatever the load.
pub(super) const BACKLOG: u64 = 2;

/// A new image is written once the segments kept since the last one hold
/// more than [`LOG_PER_IMAGE`] times that image's size, and at least this
/// many segments' worth (`checkpoint_bytes` each).
pub(super) const IMAGE_AFTER: u64 = 4;

/// How many times its image's size the log kept beside it may grow to. The
/// image is compressed (to about a third of the content's size in the
/// log's format): at 2, the kept log stays below the content's size, and
/// each image (a read and a compression of all of sled) is paid for by
/// logging about as much as that content again.
pub(super) const LOG_PER_IMAGE: u64 = 2;

/// Tunables of a store.
#[derive(Debug, Clone, Copy)]
pub(super) struct Tuning {
    /// Rotate the log and checkpoint once a segment holds this many bytes.
    pub checkpoint_bytes: u64,
    /// An eventual write is durable at the latest this long after it.
    pub eventual_delay: Duration,
    /// ... or as soon as this many bytes are pending.
    pub eventual_bytes: usize,
}

/// A change not yet in sled.
#[derive(Debug, Clone)]
struct Pending {
    /// `None`: removed.
    value: Option<Arc<[u8]>>,
    lsn: u64,
}

#[derive(Debug, Clone)]
struct TailEvent {
    seq: u64,
    lsn: u64,
    bytes: Arc<[u8]>,
}

/// Someone waiting for a barrier.
enum Waiter {
    Async(oneshot::Sender<Result<(), Broken>>),
    Blocking(std::sync::mpsc::Sender<Result<(), Broken>>),
}

impl Waiter {
    fn answer(self, result: Result<(), Broken>) {
        // A waiter whose call was dropped no longer listens; fine.
        match self {
            Waiter::Async(tx) => drop(tx.send(result)),
            Waiter::Blocking(tx) => drop(tx.send(result)),
        }
    }
}

/// The largest `State::scratch` kept for the next write: a record larger
/// than this gives its buffer back.
const SCRATCH_KEPT: usize = 16 << 10;

struct State {
    file: Arc<File>,
    gen: u64,
    /// Where the segment's units end (the next round writes there).
    size: u64,
    /// The segment file's length: its units and the zeros after them
    /// (`wal::write_and_sync`).
    prepared: u64,
    /// Units logged since the last barrier took them, and the last lsn in
    /// them.
    pending: Vec<u8>,
    pending_lsn: u64,
    /// `write`'s buffer for a record's stored bytes, kept between writes
    /// while it is at most [`SCRATCH_KEPT`] bytes.
    scratch: Vec<u8>,
    waiters: Vec<Waiter>,
    flushing: bool,
    /// Rounds in a row that answered one waiter while nobody else logged
    /// or waited: callers come one at a time (see `Store::lead`).
    singles: u32,
    /// Set after a failed write or fdatasync: the page cache's state is then
    /// unknown, so every later barrier fails until the journal is reopened.
    broken: Option<Broken>,
    next_lsn: u64,
    next_seq: u64,
    /// Every unit up to this lsn is durable.
    durable_lsn: u64,
    /// Ordered, so that scans and the escalation index read a range.
    overlay: BTreeMap<(Tree, Digest), Pending>,
    tail: VecDeque<TailEvent>,
    /// Events below this number were truncated (sled may still hold them
    /// until the next checkpoint).
    floor: u64,
    eventual_scheduled: bool,
    checkpointing: bool,
    /// The largest a log segment has grown (for tests of the bound).
    peak_size: u64,
    /// What the last checkpoint (or merge) recorded.
    manifest: Manifest,
    /// The tables the manifest names, open, oldest first.
    tables: Arc<Vec<Arc<Table>>>,
    /// The audit files it names, in sequence order.
    audit: Arc<Vec<AuditMeta>>,
    /// Changes of where keys live: bumped when a checkpoint starts taking
    /// keys out of sled and when a checkpoint or merge is installed (see
    /// the module docs).
    installs: u64,
    /// Keys a read found in no table, with `installs` as it was then (see
    /// the module docs). Bounded by [`ABSENT_KEPT`].
    absent: HashMap<(Tree, Digest), u64>,
    /// The next id a table or audit file gets.
    next_file: u64,
    merging: bool,
    /// Damaged files the scrub found, once it has run.
    scrub_findings: Option<u64>,
    /// The segment generation the last image covers (0: none) and its size.
    image_gen: u64,
    image_bytes: u64,
    imaging: bool,
}

/// The store; shared by the journal handle, flushers and the checkpointer.
pub(super) struct Store {
    pub dir: PathBuf,
    pub location: String,
    pub trees: Trees,
    tuning: Tuning,
    state: Mutex<State>,
    idle: Condvar,
    /// Signalled when a checkpoint ends (see [`BACKLOG`]).
    checkpointed: Condvar,
    checkpointer: Background,
    /// fdatasyncs of the log so far (what group commit saves).
    fsyncs: std::sync::atomic::AtomicU64,
    /// When checkpoints and merges give back what they freed.
    releases: memory::Releases,
    /// Set when the journal closes: an image being written gives up.
    closing: AtomicBool,
    imager: Background,
    merger: Background,
    scrubber: Background,
    /// One manifest written at a time: checkpoints and merges both move it.
    manifest_io: Mutex<()>,
    /// Tests: runs once in a read, after it missed the overlay.
    #[cfg(test)]
    pub(super) after_overlay_miss: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// Tests: the next checkpoint says (first channel) when it has changed
    /// sled, and waits (second) before it installs its files.
    #[cfg(test)]
    pub(super) pause_before_install:
        Mutex<Option<(std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>)>>,
    /// Tests: the next checkpoint panics as sled does on damage.
    #[cfg(test)]
    pub(super) panic_in_checkpoint: AtomicBool,
    /// Tests and the fuzz harness: a close leaves its log unapplied, as a
    /// crash (or a failed last checkpoint) does.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(super) no_close_checkpoint: AtomicBool,
    /// Rounds a leader wrote on its own thread (tests).
    #[cfg(test)]
    led: std::sync::atomic::AtomicU64,
}

fn digest_of(key: &[u8]) -> Option<Digest> {
    key.try_into().ok()
}

/// A range of overlay keys.
type KeyRange = (
    std::ops::Bound<(Tree, Digest)>,
    std::ops::Bound<(Tree, Digest)>,
);

/// The overlay's keys of `tree` after `after` (all if `None`).
fn tree_range(tree: Tree, after: Option<&Digest>) -> KeyRange {
    use std::ops::Bound;
    let start = match after {
        Some(a) => Bound::Excluded((tree, *a)),
        None => Bound::Included((tree, [0; 32])),
    };
    (start, Bound::Included((tree, [0xff; 32])))
}

impl Store {
    /// A store over sled `trees`, logging to a fresh segment after the
    /// one `manifest` covers (the manifest just written), with its
    /// `tables` open (oldest first); `image` is the generation the image on
    /// disk covers (0: none) and its size.
    pub(super) fn start(
        dir: PathBuf,
        location: String,
        trees: Trees,
        manifest: Manifest,
        tables: Vec<Arc<Table>>,
        image: (u64, u64),
        tuning: Tuning,
    ) -> std::io::Result<Arc<Store>> {
        let gen = manifest.gen + 1;
        let file = wal::create_segment(&dir, gen)?;
        let store = Arc::new(Store {
            dir,
            location,
            trees,
            tuning,
            state: Mutex::new(State {
                file: Arc::new(file),
                gen,
                size: wal::HEADER_LEN as u64,
                prepared: wal::HEADER_LEN as u64,
                pending: Vec::with_capacity(64 << 10),
                scratch: Vec::new(),
                pending_lsn: 0,
                waiters: Vec::new(),
                flushing: false,
                singles: 0,
                broken: None,
                next_lsn: manifest.next_lsn,
                next_seq: manifest.next_seq,
                durable_lsn: manifest.next_lsn.saturating_sub(1),
                overlay: BTreeMap::new(),
                tail: VecDeque::new(),
                floor: manifest.floor,
                eventual_scheduled: false,
                checkpointing: false,
                peak_size: 0,
                tables: Arc::new(tables),
                audit: Arc::new(manifest.audit.clone()),
                installs: 0,
                absent: HashMap::new(),
                next_file: manifest.next_file,
                merging: false,
                scrub_findings: None,
                manifest,
                image_gen: image.0,
                image_bytes: image.1,
                imaging: false,
            }),
            idle: Condvar::new(),
            checkpointed: Condvar::new(),
            checkpointer: Background::default(),
            fsyncs: std::sync::atomic::AtomicU64::new(0),
            releases: memory::Releases::default(),
            closing: AtomicBool::new(false),
            imager: Background::default(),
            merger: Background::default(),
            scrubber: Background::default(),
            manifest_io: Mutex::new(()),
            #[cfg(test)]
            after_overlay_miss: Mutex::new(None),
            #[cfg(test)]
            pause_before_install: Mutex::new(None),
            #[cfg(test)]
            panic_in_checkpoint: AtomicBool::new(false),
            #[cfg(any(test, feature = "fuzzing"))]
            no_close_checkpoint: AtomicBool::new(false),
            #[cfg(test)]
            led: std::sync::atomic::AtomicU64::new(0),
        });
        // Tables an earlier run left unmerged.
        store.maybe_merge();
        Ok(store)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn err(&self, op: &'static str, e: impl Into<idem_journal::error::Cause>) -> Error {
        Error::storage(op, &self.location, e)
    }

    fn corrupt(&self, tree: Tree, key: &[u8], detail: String) -> Error {
        Error::Corrupt {
            what: match tree {
                Tree::Ops => "operation record header",
                Tree::Steps => "step record header",
                Tree::Escalations => "escalation index entry",
            },
            location: self.location.clone(),
            key: idem_journal::key::hex(key),
            detail,
        }
    }

    /// An error for damage or a failed read in a table.
    fn table_err(&self, path: &std::path::Path, e: ReadError) -> Error {
        match e {
            ReadError::Damaged(d) => Error::Damaged {
                file: path.to_path_buf(),
                offset: Some(d.offset),
                detail: d.detail,
            },
            ReadError::Io(e) => Error::storage("read a table", &path.display().to_string(), e),
        }
    }

    /// What sled, then the tables (newest first), hold for a key: the
    /// newest bytes outside the overlay.
    fn settled_value(
        &self,
        tables: &[Arc<Table>],
        tree: Tree,
        key: &Digest,
    ) -> Result<Option<Arc<[u8]>>, Error> {
        if let Some(v) = self
            .trees
            .tree(tree)
            .get(key)
            .map_err(|e| self.err("read", e))?
        {
            return Ok(Some(Arc::from(&*v)));
        }
        if tree == Tree::Escalations {
            return Ok(None);
        }
        let k = table::key(tree as u8, key);
        for t in tables.iter().rev() {
            match t.get(&k).map_err(|e| self.table_err(&t.path, e))? {
                Found::No => continue,
                Found::Removed => return Ok(None),
                Found::Value(v) => return Ok(Some(Arc::from(v))),
            }
        }
        Ok(None)
    }

    /// The newest bytes of a key, under the state lock (which keeps a
    /// checkpoint from moving it meanwhile).
    fn current(&self, state: &State, tree: Tree, key: &Digest) -> Result<Option<Arc<[u8]>>, Error> {
        if let Some(p) = state.overlay.get(&(tree, *key)) {
            return Ok(p.value.clone());
        }
        self.settled_value(&state.tables, tree, key)
    }

    pub(super) fn load(&self, tree: Tree, key: &Digest) -> Result<Option<Loaded>, Error> {
        let bytes = loop {
            let (overlaid, tables, installs) = {
                let st = self.lock();
                (
                    st.overlay.get(&(tree, *key)).map(|p| p.value.clone()),
                    st.tables.clone(),
                    st.installs,
                )
            };
            if let Some(v) = overlaid {
                break v;
            }
            #[cfg(test)]
            if let Some(hook) = self
                .after_overlay_miss
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
            {
                hook();
            }
            // Outside the lock. A checkpoint that settled this key since
            // the overlay was read (the key written and checkpointed in
            // between) may have removed it from sled before this read got
            // there, with its table not among `tables`: then read again.
            let found = self.settled_value(&tables, tree, key)?;
            let mut st = self.lock();
            if st.installs == installs {
                if found.is_none() && tree != Tree::Escalations {
                    if st.absent.len() >= ABSENT_KEPT {
                        st.absent.clear();
                    }
                    st.absent.insert((tree, *key), installs);
                }
                break found;
            }
        };
        let Some(bytes) = bytes else { return Ok(None) };
        let (h, body) = stored::decode(&bytes).map_err(|d| self.corrupt(tree, key, d))?;
        Ok(Some(stored::loaded(h, body)))
    }

    /// Decides and logs a write (durability is the caller's next step).
    pub(super) fn write(&self, tree: Tree, w: &Write<'_>) -> Result<Written, Error> {
        let mut st = self.lock();
        if let Some(why) = &st.broken {
            return Err(self.err("write", why.clone()));
        }
        let old = match st.overlay.get(&(tree, *w.key)) {
            Some(p) => p.value.clone(),
            None => {
                // Skips the tables when a read since the last install
                // found the key in none of them (see the module docs). A
                // note left behind by a write that hit the overlay stays
                // harmless: a key leaves the overlay only at an install.
                let no_table = st.absent.remove(&(tree, *w.key)) == Some(st.installs);
                let tables: &[Arc<Table>] = if no_table { &[] } else { &st.tables };
                self.settled_value(tables, tree, w.key)?
            }
        };
        let old_header = match &old {
            Some(b) => Some(
                stored::parse(b)
                    .map_err(|d| self.corrupt(tree, w.key, d))?
                    .0,
            ),
            None => None,
        };
        let holds = match (w.expect, &old_header) {
            (Expect::Absent, None) => true,
            (Expect::Version(v), Some(h)) => h.version == v,
            _ => false,
        };
        if !holds {
            return Ok(Written::Conflict);
        }
        let lsn = st.next_lsn;
        let prev_epoch = old_header.as_ref().map_or(0, |h| h.epoch);
        let prev_owner = old_header.as_ref().and_then(|h| h.owner);
        let was_escalated = old_header.as_ref().is_some_and(|h| h.escalated);
        let (epoch, owner) = match w.claim {
            ClaimChange::Keep => (prev_epoch, prev_owner),
            ClaimChange::Take(o) => (prev_epoch + 1, Some((o.incarnation, &*o.worker))),
            ClaimChange::Release => (prev_epoch, None),
        };
        let header = stored::View {
            version: lsn,
            epoch,
            owner,
            escalated: w.escalated,
        };
        // Encoded into the store's reused buffer, then copied once into
        // the shared value.
        let mut buf = std::mem::take(&mut st.scratch);
        buf.clear();
        stored::encode_into(&header, w.body, &mut buf);
        let value: Arc<[u8]> = Arc::from(&buf[..]);
        if buf.capacity() <= SCRATCH_KEPT {
            st.scratch = buf;
        }

        // The digest covers what sled holds once the unit is applied:
        // records that can still change, and the escalation index.
        let mut delta = ContentDigest::default();
        // The headers are at hand: the old one parsed above, the new one
        // just encoded.
        if let (Some(o), Some(h)) = (&old, &old_header) {
            if h.unsettled() {
                delta.remove(digest::entry_hash(tree as u8, w.key, o));
            }
        }
        if header.unsettled() {
            delta.add(digest::entry_hash(tree as u8, w.key, &value));
        }
        let index = digest::entry_hash(Tree::Escalations as u8, w.key, &[]);
        let index_change = match (was_escalated, w.escalated) {
            (false, true) => {
                delta.add(index);
                Some(Change::Put {
                    tree: Tree::Escalations,
                    key: &w.key[..],
                    value: &[],
                })
            }
            (true, false) => {
                delta.remove(index);
                Some(Change::Remove {
                    tree: Tree::Escalations,
                    key: &w.key[..],
                })
            }
            _ => None,
        };
        let seqs: Vec<u64> = (st.next_seq..st.next_seq + w.events.len() as u64).collect();
        let changes = std::iter::once(Change::Put {
            tree,
            key: &w.key[..],
            value: &value[..],
        })
        .chain(index_change)
        .chain(seqs.iter().zip(w.events).map(|(seq, e)| Change::Event {
            seq: *seq,
            bytes: e.bytes,
        }));
        let st = &mut *st;
        wal::encode_unit_from(&mut st.pending, lsn, delta.xor, delta.count, changes);
        st.next_lsn += 1;
        st.pending_lsn = lsn;
        st.next_seq += w.events.len() as u64;
        st.overlay.insert(
            (tree, *w.key),
            Pending {
                value: Some(value),
                lsn,
            },
        );
        if was_escalated != w.escalated {
            let value = w.escalated.then(|| Arc::<[u8]>::from(&[][..]));
            st.overlay
                .insert((Tree::Escalations, *w.key), Pending { value, lsn });
        }
        for (seq, e) in seqs.iter().zip(w.events) {
            st.tail.push_back(TailEvent {
                seq: *seq,
                lsn,
                bytes: Arc::from(e.bytes),
            });
        }
        Ok(Written::Done {
            version: lsn,
            epoch,
            seqs,
        })
    }

    /// Removes a record still at `version`.
    pub(super) fn remove(&self, tree: Tree, key: &Digest, version: u64) -> Result<bool, Error> {
        let mut st = self.lock();
        if let Some(why) = &st.broken {
            return Err(self.err("remove", why.clone()));
        }
        let Some(old) = self.current(&st, tree, key)? else {
            return Ok(false);
        };
        let (h, _) = stored::decode(&old).map_err(|d| self.corrupt(tree, key, d))?;
        if h.version != version {
            return Ok(false);
        }
        let lsn = st.next_lsn;
        let mut delta = ContentDigest::default();
        if apply::unsettled(&old) {
            delta.remove(digest::entry_hash(tree as u8, key, &old));
        }
        let mut changes = vec![Change::Remove {
            tree,
            key: &key[..],
        }];
        if h.escalated {
            delta.remove(digest::entry_hash(Tree::Escalations as u8, key, &[]));
            changes.push(Change::Remove {
                tree: Tree::Escalations,
                key: &key[..],
            });
        }
        let st = &mut *st;
        wal::encode_unit(&mut st.pending, lsn, delta.xor, delta.count, &changes);
        st.next_lsn += 1;
        st.pending_lsn = lsn;
        st.overlay
            .insert((tree, *key), Pending { value: None, lsn });
        if h.escalated {
            st.overlay
                .insert((Tree::Escalations, *key), Pending { value: None, lsn });
        }
        Ok(true)
    }

    /// Logs events that go with no record.
    pub(super) fn append(&self, events: &[NewEvent<'_>]) -> Result<Vec<u64>, Error> {
        let mut st = self.lock();
        if let Some(why) = &st.broken {
            return Err(self.err("append", why.clone()));
        }
        let lsn = st.next_lsn;
        let seqs: Vec<u64> = (st.next_seq..st.next_seq + events.len() as u64).collect();
        let changes = seqs.iter().zip(events).map(|(seq, e)| Change::Event {
            seq: *seq,
            bytes: e.bytes,
        });
        let st = &mut *st;
        wal::encode_unit_from(&mut st.pending, lsn, 0, 0, changes);
        st.next_lsn += 1;
        st.pending_lsn = lsn;
        st.next_seq += events.len() as u64;
        for (seq, e) in seqs.iter().zip(events) {
            st.tail.push_back(TailEvent {
                seq: *seq,
                lsn,
                bytes: Arc::from(e.bytes),
            });
        }
        Ok(seqs)
    }

    /// Durable events from `from`, at most `limit`: the audit files', then
    /// those still in memory.
    pub(super) fn events(&self, from: u64, limit: usize) -> Result<EventRows, Error> {
        // The files and the tail are taken under one lock: a checkpoint
        // adds a file and drops the tail events it holds in one step.
        let (tail, audit, floor) = {
            let st = self.lock();
            let tail: Vec<TailEvent> = st
                .tail
                .iter()
                .filter(|e| e.seq >= from && e.lsn <= st.durable_lsn)
                .take(limit)
                .cloned()
                .collect();
            (tail, st.audit.clone(), st.floor)
        };
        let from = from.max(floor);
        let mut out: EventRows = Vec::new();
        let start = audit.partition_point(|a| a.last < from);
        for meta in &audit[start..] {
            if out.len() >= limit {
                break;
            }
            let path = crate::audit::path(&self.dir, meta.id);
            let file = match AuditFile::open(&self.dir, meta.id, Some(meta.bytes)) {
                // A truncation removed it since: what it held is below the
                // floor now, and so are the events asked for; read again.
                Err(ReadError::Io(e))
                    if e.kind() == std::io::ErrorKind::NotFound
                        && self.lock().floor > meta.last =>
                {
                    return self.events(from, limit);
                }
                other => other.map_err(|e| self.table_err(&path, e))?,
            };
            file.read(from, limit, &mut out)
                .map_err(|e| self.table_err(&path, e))?;
        }
        out.retain(|e| e.0 >= floor);
        let last = out.last().map(|e| e.0);
        for e in tail {
            if out.len() >= limit {
                break;
            }
            if last.is_none_or(|l| e.seq > l) && e.seq >= from {
                out.push((e.seq, e.bytes.to_vec()));
            }
        }
        Ok(out)
    }

    /// Keys in the escalation index.
    pub(super) fn escalated_keys(&self) -> Result<Vec<Digest>, Error> {
        let overlay: Vec<(Digest, bool)> = {
            let st = self.lock();
            st.overlay
                .range(tree_range(Tree::Escalations, None))
                .map(|((_, k), p)| (*k, p.value.is_some()))
                .collect()
        };
        let mut keys = BTreeSet::new();
        for item in self.trees.tree(Tree::Escalations).iter().keys() {
            let k = item.map_err(|e| self.err("read the escalation index", e))?;
            if let Some(d) = digest_of(&k) {
                keys.insert(d);
            }
        }
        for (k, present) in overlay {
            if present {
                keys.insert(k);
            } else {
                keys.remove(&k);
            }
        }
        Ok(keys.into_iter().collect())
    }

    /// Up to `limit` records of `tree` after `after`, in key order: the
    /// overlay's, sled's and every table's, merged (the newest source's
    /// entry wins: overlay, sled, then tables from the newest; a removal
    /// hides the older ones). A page is read again if a checkpoint or a
    /// merge was installed while it was being read.
    pub(super) fn scan(
        &self,
        tree: Tree,
        after: Option<&Digest>,
        limit: usize,
    ) -> Result<Vec<(Digest, Loaded)>, Error> {
        loop {
            let (tables, installs) = {
                let st = self.lock();
                (st.tables.clone(), st.installs)
            };
            let page = self.scan_page(tree, after, limit, &tables)?;
            if self.lock().installs == installs {
                return Ok(page);
            }
        }
    }

    fn scan_page(
        &self,
        tree: Tree,
        after: Option<&Digest>,
        limit: usize,
        tables: &[Arc<Table>],
    ) -> Result<Vec<(Digest, Loaded)>, Error> {
        const CHUNK: usize = 256;
        type Head = Option<(Digest, Option<Arc<[u8]>>)>;
        let decode = |k: Digest, v: &[u8]| -> Result<(Digest, Loaded), Error> {
            let (h, body) = stored::decode(v).map_err(|d| self.corrupt(tree, &k, d))?;
            Ok((k, stored::loaded(h, body)))
        };
        // Sources, newest first: 0 the overlay, 1 sled, 2.. the tables.
        let mut sled_iter = match after {
            Some(a) => self.trees.tree(tree).range((
                std::ops::Bound::Excluded(a.to_vec()),
                std::ops::Bound::Unbounded,
            )),
            None => self.trees.tree(tree).range::<&[u8], _>(..),
        };
        let mut next_sled = || -> Result<Head, Error> {
            for item in sled_iter.by_ref() {
                let (k, v) = item.map_err(|e| self.err("scan", e))?;
                if let Some(d) = digest_of(&k) {
                    return Ok(Some((d, Some(Arc::from(&*v)))));
                }
            }
            Ok(None)
        };
        let start = match after {
            Some(a) => (table::key(tree as u8, a), false),
            None => (table::key(tree as u8, &[0; 32]), true),
        };
        let mut table_iters: Vec<_> = tables
            .iter()
            .rev()
            .map(|t| (t, t.iter_from(&start.0, start.1)))
            .collect();
        let mut next_table = |i: usize| -> Result<Head, Error> {
            let (t, it) = &mut table_iters[i];
            match it.next() {
                None => Ok(None),
                Some(Err(e)) => Err(self.table_err(&t.path, e)),
                Some(Ok((k, v))) => {
                    // Keys of another space end this one's range.
                    if k[0] != tree as u8 {
                        return Ok(None);
                    }
                    let d = digest_of(&k[1..]).expect("33-byte keys");
                    Ok(Some((d, v.map(Arc::from))))
                }
            }
        };
        let mut chunk: VecDeque<(Digest, Option<Arc<[u8]>>)> = VecDeque::new();
        let mut cursor = after.copied();
        let mut overlay_done = false;
        let mut next_overlay = || -> Head {
            if chunk.is_empty() && !overlay_done {
                let st = self.lock();
                chunk.extend(
                    st.overlay
                        .range(tree_range(tree, cursor.as_ref()))
                        .take(CHUNK)
                        .map(|((_, k), p)| (*k, p.value.clone())),
                );
                drop(st);
                match chunk.back() {
                    Some((k, _)) => cursor = Some(*k),
                    None => overlay_done = true,
                }
            }
            chunk.pop_front()
        };
        let mut heads: Vec<Head> = vec![next_overlay(), next_sled()?];
        for i in 0..tables.len() {
            heads.push(next_table(i)?);
        }
        let mut out = Vec::new();
        while out.len() < limit {
            let Some(min) = heads.iter().flatten().map(|(k, _)| *k).min() else {
                break;
            };
            let mut winner: Option<Option<Arc<[u8]>>> = None;
            for (i, head) in heads.iter_mut().enumerate() {
                if head.as_ref().is_some_and(|(k, _)| *k == min) {
                    let (_, v) = head.take().expect("head present");
                    if winner.is_none() {
                        winner = Some(v);
                    }
                    *head = match i {
                        0 => next_overlay(),
                        1 => next_sled()?,
                        t => next_table(t - 2)?,
                    };
                }
            }
            if let Some(Some(v)) = winner {
                out.push(decode(min, &v)?);
            }
        }
        Ok(out)
    }

    /// Logs the removal of every event below `before`; returns how many
    /// that removes.
    pub(super) fn truncate_events(&self, before: u64) -> Result<u64, Error> {
        let mut st = self.lock();
        if let Some(why) = &st.broken {
            return Err(self.err("truncate the audit stream", why.clone()));
        }
        // Events appended but not yet durable are numbered after every
        // durable one, so below `before` only if the caller asked to
        // truncate what it has not seen: refuse that.
        if st
            .tail
            .iter()
            .any(|e| e.seq < before && e.lsn > st.durable_lsn)
        {
            return Err(Error::Usage(
                "truncate_events: events below the bound are not durable yet; sync first".into(),
            ));
        }
        if before <= st.floor {
            return Ok(0);
        }
        let floor = st.floor;
        // An audit file holds consecutive numbers (a checkpoint's events,
        // from the floor on).
        let in_files: u64 = st
            .audit
            .iter()
            .map(|a| {
                let lo = a.first.max(floor);
                let hi = a.last.min(before - 1);
                if lo > hi {
                    0
                } else {
                    (hi - lo + 1).min(a.events)
                }
            })
            .sum();
        let newest_in_files = st.audit.last().map(|a| a.last);
        let in_tail = st
            .tail
            .iter()
            .filter(|e| {
                e.seq >= floor && e.seq < before && newest_in_files.is_none_or(|l| e.seq > l)
            })
            .count() as u64;
        let gone = in_files + in_tail;
        if gone == 0 {
            return Ok(0);
        }
        let lsn = st.next_lsn;
        let st = &mut *st;
        wal::encode_unit(&mut st.pending, lsn, 0, 0, &[Change::Truncate { before }]);
        st.next_lsn += 1;
        st.pending_lsn = lsn;
        st.floor = before;
        st.tail.retain(|e| e.seq >= before);
        Ok(gone)
    }

    /// The log's size plus the image's, sled's, the tables' and the audit
    /// files'.
    pub(super) fn size_on_disk(&self) -> Result<u64, Error> {
        let sled = self
            .trees
            .db
            .size_on_disk()
            .map_err(|e| self.err("measure", e))?;
        let log: u64 = wal::segments(&self.dir)
            .map_err(|e| self.err("measure", e))?
            .iter()
            .filter_map(|(_, p)| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum();
        let image = std::fs::metadata(self.dir.join(image::IMAGE)).map_or(0, |m| m.len());
        let files: u64 = {
            let st = self.lock();
            st.tables.iter().map(|t| t.bytes).sum::<u64>()
                + st.audit.iter().map(|a| a.bytes).sum::<u64>()
        };
        Ok(sled + log + image + files)
    }

    // ---- durability ----

    /// Waits until everything logged so far is durable.
    pub(super) async fn barrier(self: &Arc<Self>) -> Result<(), Error> {
        let (tx, rx) = oneshot::channel();
        if let Some(singles) = self.enqueue(Waiter::Async(tx)) {
            self.lead(singles);
        }
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(self.err("sync", e)),
            Err(_) => Err(self.err("sync", "the flusher stopped")),
        }
    }

    /// [`Store::barrier`] for callers outside async code.
    /// The segment being written and one past the last durable unit's
    /// lsn (for the log end a clean close records).
    pub(super) fn durable_end(&self) -> (u64, u64) {
        let st = self.lock();
        (st.gen, st.durable_lsn + 1)
    }

    pub(super) fn barrier_blocking(self: &Arc<Self>) -> Result<(), Error> {
        let (tx, rx) = std::sync::mpsc::channel();
        if self.enqueue(Waiter::Blocking(tx)).is_some() {
            self.clone().flush_loop();
        }
        match rx.recv() {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(self.err("sync", e)),
            Err(_) => Err(self.err("sync", "the flusher stopped")),
        }
    }

    /// Makes an eventual write durable within the store's bound.
    pub(super) fn eventually(self: &Arc<Self>) {
        let now = {
            let mut st = self.lock();
            if st.eventual_scheduled {
                return;
            }
            st.eventual_scheduled = true;
            st.pending.len() >= self.tuning.eventual_bytes
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            // Outside tokio nobody can wait; make it durable now.
            let _ = self.barrier_blocking();
            return;
        };
        // A weak handle: a pending timer must not keep the journal open.
        let weak: Weak<Store> = Arc::downgrade(self);
        let delay = if now {
            Duration::ZERO
        } else {
            self.tuning.eventual_delay
        };
        handle.spawn(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if let Some(store) = weak.upgrade() {
                let _ = store.barrier().await;
            }
        });
    }

    /// Queues `waiter` for the next barrier. Returns, if the caller must
    /// start the flusher, how many quiet rounds in a row came before (see
    /// [`Store::lead`]).
    fn enqueue(&self, waiter: Waiter) -> Option<u32> {
        let mut st = self.lock();
        st.waiters.push(waiter);
        (!std::mem::replace(&mut st.flushing, true)).then_some(st.singles)
    }

    /// The first waiter while no flusher runs leads. When callers have
    /// been coming one at a time (the last rounds each answered a single
    /// waiter, and nothing else was logged while their fsync ran: a
    /// sequential agent) and the runtime has other threads to run
    /// its tasks meanwhile, it writes and fdatasyncs its round on its own
    /// thread, and pays no thread handoff there and back (two wake-ups,
    /// tens of microseconds on a VM, next to an fsync of about a hundred).
    /// Waiters that arrive meanwhile, and a due rotation (which may wait for
    /// a checkpoint), go to the flusher on the blocking pool, so a worker
    /// thread blocks for one fsync at most. Concurrent callers (groups of
    /// more than one) always go through the flusher: a worker blocked in an
    /// fsync would take half of a two-core machine from them.
    fn lead(self: &Arc<Self>, singles: u32) {
        const ALONE: u32 = 4;
        let multi_thread = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if !multi_thread || singles < ALONE {
            self.start_flusher();
            return;
        }
        #[cfg(test)]
        self.led.fetch_add(1, Ordering::Relaxed);
        let mut buf = Vec::new();
        self.flush_round(&mut buf);
        self.hand_over(true);
    }

    /// Ends a turn as the flusher (a leader's round, a rotation at close):
    /// waiters that arrived meanwhile, and a rotation that is due when
    /// `rotate` says so, go to the flusher on the blocking pool.
    fn hand_over(self: &Arc<Self>, rotate: bool) {
        let more = {
            let mut st = self.lock();
            let more =
                !st.waiters.is_empty() || (rotate && st.size >= self.tuning.checkpoint_bytes);
            if !more {
                st.flushing = false;
                self.idle.notify_all();
            }
            more
        };
        if more {
            self.start_flusher();
        }
    }

    /// Waits for the flusher to finish and takes its place, so that nothing
    /// writes to the log meanwhile; [`Store::hand_over`] ends the turn.
    fn take_flusher(&self) {
        let mut st = self.lock();
        while st.flushing {
            st = self.idle.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st.flushing = true;
    }

    /// Runs the flusher on tokio's blocking pool (which also keeps a paused
    /// test clock from jumping while an fsync is in progress). If the task
    /// never runs — the runtime is shutting down — it flushes as it is
    /// dropped, so `flushing` is always reset and no waiter is left behind.
    fn start_flusher(self: &Arc<Self>) {
        struct FlushOnDrop(Option<Arc<Store>>);
        impl Drop for FlushOnDrop {
            fn drop(&mut self) {
                if let Some(store) = self.0.take() {
                    store.flush_loop();
                }
            }
        }
        let mut task = FlushOnDrop(Some(self.clone()));
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => drop(handle.spawn_blocking(move || {
                if let Some(store) = task.0.take() {
                    store.flush_loop();
                }
            })),
            Err(_) => {
                if let Some(store) = task.0.take() {
                    store.flush_loop();
                }
            }
        }
    }

    /// The flusher: until no waiter is left, takes every waiter and every
    /// pending unit, writes and fdatasyncs them once, answers the waiters.
    fn flush_loop(self: Arc<Self>) {
        let mut buf = Vec::new();
        // A leader's round may have left a rotation due.
        self.maybe_rotate();
        loop {
            {
                let mut st = self.lock();
                if st.waiters.is_empty() {
                    st.flushing = false;
                    self.idle.notify_all();
                    return;
                }
            }
            if self.flush_round(&mut buf) {
                self.maybe_rotate();
            }
        }
    }

    /// One round of the flusher: takes every waiter and every pending unit,
    /// writes and fdatasyncs them once, answers the waiters. Returns whether
    /// the round succeeded. Only the flusher (`flushing` set) calls it.
    fn flush_round(&self, buf: &mut Vec<u8>) -> bool {
        let (file, waiters, broken, lsn, offset, prepared) = {
            let mut st = self.lock();
            std::mem::swap(buf, &mut st.pending);
            let offset = st.size;
            st.size += buf.len() as u64;
            st.peak_size = st.peak_size.max(st.size);
            st.eventual_scheduled = false;
            (
                st.file.clone(),
                std::mem::take(&mut st.waiters),
                st.broken.clone(),
                st.pending_lsn,
                offset,
                st.prepared,
            )
        };
        // The segment's length after the round.
        let result = match broken {
            Some(why) => Err(why),
            None if buf.is_empty() => Ok(prepared),
            None => wal::write_and_sync(&file, buf, offset, prepared)
                .inspect(|_| {
                    self.fsyncs.fetch_add(1, Ordering::Relaxed);
                })
                .map_err(|e| Broken {
                    kind: e.kind(),
                    why: format!("write-ahead log write failed: {e}; reopen the journal"),
                }),
        };
        buf.clear();
        {
            let mut st = self.lock();
            match &result {
                Ok(len) => {
                    st.durable_lsn = st.durable_lsn.max(lsn);
                    if Arc::ptr_eq(&st.file, &file) {
                        st.prepared = st.prepared.max(*len);
                    }
                    // Quiet: one waiter, and nobody logged or waited while
                    // its fsync ran.
                    let quiet =
                        waiters.len() == 1 && st.pending.is_empty() && st.waiters.is_empty();
                    st.singles = if quiet {
                        st.singles.saturating_add(1)
                    } else {
                        0
                    };
                }
                Err(why) => {
                    st.broken.get_or_insert_with(|| why.clone());
                }
            }
        }
        let result = result.map(drop);
        let ok = result.is_ok();
        for w in waiters {
            w.answer(result.clone());
        }
        ok
    }

    /// The largest a log segment has grown so far.
    pub(super) fn peak_segment_bytes(&self) -> u64 {
        self.lock().peak_size
    }

    /// fdatasyncs of the log so far.
    pub(super) fn fsyncs(&self) -> u64 {
        self.fsyncs.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Blocks until no flusher runs.
    pub(super) fn wait_idle(&self) {
        let mut st = self.lock();
        while st.flushing {
            st = self.idle.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    // ---- checkpoints ----

    /// After a barrier: once the segment is large, moves logging to a new
    /// one and checkpoints the old one away on its own thread. Called by the
    /// flusher, so nothing else appends to the old segment meanwhile; the
    /// units still pending go to the new segment.
    fn maybe_rotate(self: &Arc<Self>) {
        let old_gen = {
            let mut st = self.lock();
            // Backpressure. While a checkpoint runs the current segment
            // keeps growing, and the overlay with it; under a load that
            // outruns checkpoints, each would cover more than the last and
            // memory would grow without bound. Past BACKLOG segments' worth
            // the flusher waits for the checkpoint, and with it every
            // writer waiting for a barrier.
            while st.checkpointing
                && st.broken.is_none()
                && st.size >= BACKLOG * self.tuning.checkpoint_bytes
            {
                st = self
                    .checkpointed
                    .wait(st)
                    .unwrap_or_else(|p| p.into_inner());
            }
            if st.size < self.tuning.checkpoint_bytes || st.checkpointing || st.broken.is_some() {
                return;
            }
            st.gen
        };
        // A failed rotation only means the log keeps growing; the data is
        // durable in it either way.
        let Some(covered) = self.rotate(old_gen) else {
            return;
        };
        let store = self.clone();
        let spawned = std::thread::Builder::new()
            .name("idem-checkpoint".into())
            .spawn(move || store.checkpoint(old_gen, covered));
        match spawned {
            // The previous checkpointer has finished (`checkpointing` was
            // false).
            Ok(handle) => self.checkpointer.replace(handle),
            Err(_) => self.lock().checkpointing = false,
        }
    }

    /// A clean close's last checkpoint, on the closing thread, after its
    /// last barrier: the log goes to sled, so the next open has none to
    /// replay (at 300,000 operations, half a second of its time). Skipped
    /// when the store is broken or the segment holds no unit; if it fails,
    /// the next open replays the log as after a crash.
    pub(super) fn checkpoint_at_close(self: &Arc<Self>) {
        #[cfg(any(test, feature = "fuzzing"))]
        if self.no_close_checkpoint.load(Ordering::Relaxed) {
            return;
        }
        // The rotation trims the old segment: no round may write to it
        // meanwhile (an eventual commit's timer may still start one).
        self.take_flusher();
        let rotated = {
            let old_gen = {
                let st = self.lock();
                (!st.checkpointing && st.broken.is_none() && st.size > wal::HEADER_LEN as u64)
                    .then_some(st.gen)
            };
            old_gen.and_then(|g| Some((g, self.rotate(g)?)))
        };
        self.hand_over(false);
        if let Some((old_gen, covered)) = rotated {
            self.clone().checkpoint(old_gen, covered);
        }
    }

    /// Rotates the log and checkpoints it on a thread of its own (tests).
    #[cfg(test)]
    pub(super) fn checkpoint_now(self: &Arc<Self>) -> std::thread::JoinHandle<()> {
        let gen = self.lock().gen;
        let covered = self.rotate(gen).expect("rotates");
        let store = self.clone();
        std::thread::spawn(move || store.checkpoint(gen, covered))
    }

    /// Starts segment `old_gen + 1` and marks a checkpoint of `old_gen` as
    /// running; returns the lsn it covers (every unit in the old segment is
    /// durable: the flusher or the last barrier wrote it). `None` if the
    /// segment cannot be created, which includes another rotation having
    /// created it first.
    fn rotate(&self, old_gen: u64) -> Option<u64> {
        // The old segment ends at its last unit, durably, before the next
        // one exists: only the newest segment may end in zeros.
        let (old, end) = {
            let st = self.lock();
            (st.file.clone(), st.size)
        };
        wal::trim_segment(&old, end).ok()?;
        let file = wal::create_segment(&self.dir, old_gen + 1).ok()?;
        let mut st = self.lock();
        st.file = Arc::new(file);
        st.gen = old_gen + 1;
        st.size = wal::HEADER_LEN as u64;
        st.prepared = wal::HEADER_LEN as u64;
        st.checkpointing = true;
        Some(st.durable_lsn)
    }

    /// Settles segments up to `gen` (`settle.rs`), records the manifest,
    /// and drops the overlay entries (lsn up to `covered`) and tail events
    /// that sled, the new table and the new audit file now hold. Then
    /// starts an image if the kept log is large, and a merge if one is due.
    fn checkpoint(self: Arc<Self>, gen: u64, covered: u64) {
        let mark = self.log_mark();
        // sled 0.34 panics on some damage in its files. A checkpoint that
        // dies of it must not leave `checkpointing` set (writers would wait
        // for it forever): the store breaks instead, every later write
        // fails without calling anyone, and the next open repairs sled.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            #[cfg(test)]
            if self.panic_in_checkpoint.swap(false, Ordering::Relaxed) {
                panic!("injected: cannot find pid 5 in view_for_key");
            }
            self.checkpoint_inner(gen, covered)
        }));
        let outcome = outcome.unwrap_or_else(|panic| {
            let why = format!(
                "sled failed while a checkpoint wrote to it ({}); reopen the journal to repair \
                 sled from its image and log",
                apply::panic_text(&panic)
            );
            self.lock().broken = Some(Broken::other(why.clone()));
            Err(why)
        });
        let image = {
            let mut st = self.lock();
            st.checkpointing = false;
            self.checkpointed.notify_all();
            match outcome {
                Ok(kept) => {
                    let due = kept
                        > (LOG_PER_IMAGE * st.image_bytes)
                            .max(IMAGE_AFTER * self.tuning.checkpoint_bytes);
                    if due && !st.imaging && !self.closing.load(Ordering::Relaxed) {
                        st.imaging = true;
                        Some(st.manifest.clone())
                    } else {
                        None
                    }
                }
                Err(e) => {
                    tracing::warn!(
                        target: "idem::journal",
                        location = %self.location,
                        error = %e,
                        "checkpoint failed; the write-ahead log keeps everything and the next one retries"
                    );
                    None
                }
            }
        };
        if let Some(m) = image {
            self.clone().start_image(m);
        }
        self.maybe_merge();
        self.after_background_pass(mark);
    }

    /// Where the log stands: its segment and that segment's length. Taken
    /// as a checkpoint or merge starts, for [`Store::after_background_pass`].
    fn log_mark(&self) -> (u64, u64) {
        let st = self.lock();
        (st.gen, st.size)
    }

    /// A checkpoint or merge that started at `mark` has ended: what it
    /// freed goes back to the system at once if the log was quiet while it
    /// ran (the same segment, grown by less than [`QUIET_SHARE`]th of a
    /// segment), else every few passes (see [`memory::Releases`]).
    ///
    /// The pass's own span is what counts, not the segment's length: a
    /// checkpoint starts on a fresh segment and, under a steady load,
    /// ends long before that segment is full, so "little logged since the
    /// rotation" held after nearly every checkpoint, and every one of them
    /// released (64 tasks, a million operations, alternated: 43,294 /
    /// 45,357 / 38,459 against 48,075 / 48,808 / 42,093 calls a second).
    fn after_background_pass(&self, mark: (u64, u64)) {
        self.releases.after_pass(self.quiet_since(mark));
    }

    /// Whether the log stayed quiet since `mark`: the same segment, grown
    /// by less than [`QUIET_SHARE`]th of one.
    fn quiet_since(&self, mark: (u64, u64)) -> bool {
        let (gen, size) = self.log_mark();
        gen == mark.0 && size.saturating_sub(mark.1) < self.tuning.checkpoint_bytes / QUIET_SHARE
    }

    /// Writes an image of sled as of manifest `m` on, on its own thread,
    /// then deletes the log segments it covers.
    fn start_image(self: Arc<Self>, m: Manifest) {
        let store = self.clone();
        let spawned = std::thread::Builder::new()
            .name("idem-image".into())
            .spawn(move || {
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    image::write(&store.dir, &store.trees, m.gen, m.next_lsn, &store.closing)
                }))
                .unwrap_or_else(|panic| {
                    Err(std::io::Error::other(format!(
                        "sled failed while it was read ({})",
                        apply::panic_text(&panic)
                    )))
                })
                .and_then(|bytes| {
                    wal::remove_up_to(&store.dir, m.gen)?;
                    Ok(bytes)
                });
                let mut st = store.lock();
                st.imaging = false;
                match outcome {
                    Ok(bytes) => {
                        st.image_gen = m.gen;
                        st.image_bytes = bytes;
                    }
                    Err(_) if store.closing.load(Ordering::Relaxed) => {}
                    Err(e) => tracing::warn!(
                        target: "idem::journal",
                        location = %store.location,
                        error = %e,
                        "writing the journal's image failed; the log is kept and a later checkpoint retries"
                    ),
                }
            });
        match spawned {
            // `imaging` was false: the previous one has finished.
            Ok(handle) => self.imager.replace(handle),
            Err(_) => self.lock().imaging = false,
        }
    }

    /// Waits for an image being written to finish (for tests); returns the
    /// generation the image on disk covers (0: none).
    #[cfg(test)]
    pub(super) fn wait_for_image(&self) -> u64 {
        self.imager.join();
        self.lock().image_gen
    }

    /// Stops the image, the merge and the scrub (the journal closes) and
    /// waits for them.
    pub(super) fn stop_background(&self) {
        self.closing.store(true, Ordering::Relaxed);
        self.imager.join();
        self.merger.join();
        self.scrubber.join();
    }

    /// Replaces the manifest with `next(current)`, durably, under the one
    /// lock that orders manifests; `install` then updates the state to
    /// match, under the state lock, before anyone can write another.
    fn replace_manifest(
        &self,
        next: impl FnOnce(&Manifest, u64) -> Manifest,
        install: impl FnOnce(&mut State, &Manifest),
    ) -> Result<(), String> {
        let _one = self.manifest_io.lock().unwrap_or_else(|p| p.into_inner());
        let m = {
            let st = self.lock();
            next(&st.manifest, st.next_file)
        };
        files::write(&self.dir, files::MANIFEST, Kind::Checkpoint, &m)
            .map_err(|e| e.to_string())?;
        let mut st = self.lock();
        install(&mut st, &m);
        st.manifest = m;
        st.audit = Arc::new(st.manifest.audit.clone());
        st.installs += 1;
        Ok(())
    }

    /// Reserves `n` file ids.
    fn reserve_ids(&self, n: u64) -> u64 {
        let mut st = self.lock();
        let first = st.next_file;
        st.next_file += n;
        first
    }

    /// Returns the bytes of log kept since the image.
    fn checkpoint_inner(&self, gen: u64, covered: u64) -> Result<u64, String> {
        let (prev_gen, next_lsn, floor, image_gen) = {
            let st = self.lock();
            (
                st.manifest.gen,
                st.manifest.next_lsn,
                st.manifest.floor,
                st.image_gen,
            )
        };
        // One segment at a time: the fold keeps the last value of each key
        // and the events, not the log.
        let mut fold = settle::Fold::default();
        let mut min_lsn = next_lsn;
        let mut kept = 0u64;
        for (g, path) in wal::segments(&self.dir).map_err(|e| e.to_string())? {
            if g > image_gen && g <= gen {
                kept += std::fs::metadata(&path).map_or(0, |m| m.len());
            }
            if g <= prev_gen || g > gen {
                continue;
            }
            let bytes = std::fs::read(&path).map_err(|e| e.to_string())?;
            let seg = wal::read_segment_borrowed(&bytes, g, false, min_lsn)
                .map_err(|d| format!("{} at offset {}: {}", path.display(), d.offset, d.detail))?;
            if let Some(u) = seg.units.last() {
                min_lsn = u.lsn + 1;
            }
            fold.reserve(bytes.len());
            for u in &seg.units {
                fold.add(u);
            }
        }
        // sled is about to lose the keys that settled; they stay in the
        // overlay until the table holding them is installed. A read that
        // missed the overlay before a key was written and checkpointed
        // could find it in neither: it reads again (see `load`).
        let mut ids = {
            let mut st = self.lock();
            st.installs += 1;
            let first = st.next_file;
            st.next_file += 2;
            first
        };
        let settled = settle::write(&self.dir, &self.trees, fold, floor, &mut ids)
            .map_err(|f| f.to_string())?;
        #[cfg(test)]
        if let Some((applied, go)) = self
            .pause_before_install
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            let _ = applied.send(());
            let _ = go.recv();
        }
        let table = match settled.table {
            Some(t) => Some(Arc::new(
                Table::open(&self.dir, t.id, Some(t.bytes))
                    .map_err(|e| format!("the table just written does not read back: {e}"))?,
            )),
            None => None,
        };
        let mut dropped = Vec::new();
        self.replace_manifest(
            |prev, next_file| {
                let (m, d) = settle::next_manifest(prev, &settled, gen, next_file);
                dropped = d;
                m
            },
            |st, _| {
                if let Some(t) = table {
                    let mut tables = (*st.tables).clone();
                    tables.push(t);
                    st.tables = Arc::new(tables);
                }
                st.overlay.retain(|_, p| p.lsn > covered);
                st.tail.retain(|e| e.lsn > covered);
            },
        )?;
        settle::remove_files(&self.dir, &dropped, &[]);
        Ok(kept)
    }

    // ---- the scrub ----

    /// Checks every page of every table and every chunk of every audit
    /// file, on a low-priority thread of its own. An open checks what it
    /// needs to trust absence (the manifest, every file's footer, index
    /// and Bloom filter, sled's whole content); a page is checked when it
    /// is read. This finds damage in pages nobody reads, early: it is
    /// logged as an error naming the file and offset (reads of what it
    /// damaged fail, never answer "absent").
    pub(super) fn start_scrub(self: &Arc<Self>) {
        let store = self.clone();
        let spawned = std::thread::Builder::new()
            .name("idem-scrub".into())
            .spawn(move || {
                lower_priority(SCRUB_NICE);
                let found = store.scrub();
                store.lock().scrub_findings = Some(found);
            });
        if let Ok(handle) = spawned {
            self.scrubber.replace(handle);
        }
    }

    /// The scrub itself: how many damaged files it found.
    fn scrub(&self) -> u64 {
        let (tables, audit) = {
            let st = self.lock();
            (st.tables.clone(), st.audit.clone())
        };
        let mut damaged = 0;
        let report = |what: &str, path: &std::path::Path, e: ReadError| {
            tracing::error!(
                target: "idem::journal",
                location = %self.location,
                file = %path.display(),
                error = %e,
                "the scrub found damage in {what}; reads of what it damaged fail until the \
                 file is restored from a backup"
            );
        };
        for t in tables.iter() {
            if self.closing.load(Ordering::Relaxed) {
                return damaged;
            }
            if let Err(e) = t.verify() {
                report("a table", &t.path, e);
                damaged += 1;
            }
        }
        for a in audit.iter() {
            if self.closing.load(Ordering::Relaxed) {
                return damaged;
            }
            let path = crate::audit::path(&self.dir, a.id);
            match AuditFile::open(&self.dir, a.id, Some(a.bytes)).and_then(|f| f.verify()) {
                Ok(()) => {}
                // Truncated away since the list was taken.
                Err(ReadError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    report("an audit file", &path, e);
                    damaged += 1;
                }
            }
        }
        damaged
    }

    /// Waits until no merge runs (tests).
    #[cfg(test)]
    pub(super) fn wait_for_merges(&self) {
        loop {
            self.merger.join();
            if !self.lock().merging {
                return;
            }
            std::thread::yield_now();
        }
    }

    /// The entries of the open tables, and how many are removals (tests).
    #[cfg(test)]
    pub(super) fn table_entries(&self) -> (u64, u64) {
        let st = self.lock();
        st.manifest
            .tables
            .iter()
            .fold((0, 0), |(e, r), t| (e + t.entries, r + t.removals))
    }

    /// How many tables are open (tests).
    #[cfg(test)]
    pub(super) fn table_count(&self) -> usize {
        self.lock().tables.len()
    }

    /// Waits for the scrub; how many damaged files it found (tests).
    #[cfg(test)]
    pub(super) fn wait_for_scrub(&self) -> Option<u64> {
        self.scrubber.join();
        self.lock().scrub_findings
    }

    // ---- merges ----

    /// The tables to merge next (consecutive, oldest first) and whether
    /// the first is the oldest of all, if a merge is due.
    fn due_merge(&self, st: &State) -> Option<(Vec<Arc<Table>>, bool)> {
        if st.broken.is_some() || self.closing.load(Ordering::Relaxed) {
            return None;
        }
        // The manifest's list is the open tables', in the same order.
        let metas = &st.manifest.tables;
        debug_assert!(metas
            .iter()
            .map(|m| m.id)
            .eq(st.tables.iter().map(|t| t.id)));
        let range = merge::pick(metas)?;
        Some((st.tables[range.clone()].to_vec(), range.start == 0))
    }

    /// Starts merging tables on a thread of its own, if a merge is due and
    /// none runs. The thread goes on while merges are due (a merged table
    /// may complete the next size class).
    fn maybe_merge(self: &Arc<Self>) {
        {
            let mut st = self.lock();
            if st.merging || self.due_merge(&st).is_none() {
                return;
            }
            st.merging = true;
        }
        let store = self.clone();
        let spawned = std::thread::Builder::new()
            .name("idem-merge".into())
            .spawn(move || {
                lower_priority(MERGE_NICE);
                store.merge_while_due();
            });
        match spawned {
            // `merging` was false: the previous merge thread has finished
            // (or is returning).
            Ok(handle) => self.merger.replace(handle),
            Err(_) => self.lock().merging = false,
        }
    }

    /// The merge thread: merges while one is due, then clears `merging`.
    fn merge_while_due(&self) {
        loop {
            let due = {
                let mut st = self.lock();
                let due = self.due_merge(&st);
                if due.is_none() {
                    st.merging = false;
                }
                due
            };
            let Some((inputs, oldest)) = due else {
                return;
            };
            let mark = self.log_mark();
            let merged = self.merge(&inputs, oldest);
            self.after_background_pass(mark);
            if let Err(e) = merged {
                if !self.closing.load(Ordering::Relaxed) {
                    tracing::warn!(
                        target: "idem::journal",
                        location = %self.location,
                        error = %e,
                        "merging tables failed; they stay as they are, and reads go on"
                    );
                }
                self.lock().merging = false;
                return;
            }
        }
    }

    /// Merges `inputs` (consecutive, oldest first) into one table and puts
    /// it in their place.
    fn merge(&self, inputs: &[Arc<Table>], oldest: bool) -> Result<(), String> {
        let id = self.reserve_ids(1);
        let written = merge::merge(&self.dir, inputs, id, oldest, &self.closing).map_err(|e| {
            let _ = std::fs::remove_file(table::path(&self.dir, id));
            e.to_string()
        })?;
        wal::sync_dir(&self.dir).map_err(|e| e.to_string())?;
        let merged = Arc::new(
            Table::open(&self.dir, written.id, Some(written.bytes))
                .map_err(|e| format!("the merged table does not read back: {e}"))?,
        );
        let ids: Vec<u64> = inputs.iter().map(|t| t.id).collect();
        let replace = |tables: &mut Vec<TableMeta>| {
            let at = tables.iter().position(|t| t.id == ids[0]);
            match at {
                Some(at)
                    if tables[at..]
                        .iter()
                        .map(|t| t.id)
                        .take(ids.len())
                        .eq(ids.iter().copied()) =>
                {
                    tables.splice(at..at + ids.len(), [written]);
                    true
                }
                _ => false,
            }
        };
        let ok = std::cell::Cell::new(true);
        self.replace_manifest(
            |prev, next_file| {
                let mut m = prev.clone();
                ok.set(replace(&mut m.tables));
                m.next_file = m.next_file.max(next_file);
                m
            },
            |st, _| {
                if ok.get() {
                    let mut tables = (*st.tables).clone();
                    if let Some(at) = tables.iter().position(|t| t.id == ids[0]) {
                        tables.splice(at..at + ids.len(), [merged.clone()]);
                    }
                    st.tables = Arc::new(tables);
                }
            },
        )?;
        if !ok.get() {
            // Only one merge runs at a time and checkpoints only append:
            // the inputs are always where they were. Leave it all alone.
            let _ = std::fs::remove_file(table::path(&self.dir, id));
            return Err("the merged tables moved in the manifest".into());
        }
        settle::remove_files(&self.dir, &[], &ids);
        Ok(())
    }

    /// Waits for a running checkpoint to finish.
    pub(super) fn join_checkpointer(&self) {
        self.checkpointer.join();
    }
}

/// How much the merge thread lowers its priority (nice value steps). A
/// merge is not urgent, but it must keep up with checkpoints under load:
/// at +10, a merge sharing a core with a busy caller gets about a tenth of
/// it (the scheduler's weights are 110 against 1024), which is more than
/// merges need while 64 callers write (3-4 % of the CPU). At the callers'
/// priority, the merge an open resumes competed with them as an equal:
/// cached replays measured 2.5 us instead of 1.7 at 3 M operations (one
/// run each; on two vCPUs, a merge on a core of its own still slows the
/// other core somewhat, which no priority changes).
const MERGE_NICE: i32 = 10;

/// Keys the store remembers a read found in no table: more than the calls
/// in flight between a read and its write. Past it the memory is dropped
/// (writes then probe the tables, as without it).
const ABSENT_KEPT: usize = 4096;

/// A background pass during which the log grew by less than this share
/// of a segment (`1 / QUIET_SHARE`: 128 KiB of the default 8 MiB, about
/// 170 fresh calls) ran while the journal was quiet. Under load the log
/// grows by that much in milliseconds; a trickle of calls stays under it
/// for seconds.
const QUIET_SHARE: u64 = 64;

/// How much the scrub lowers its priority: all the way. It only looks for
/// damage early, and can wait for an idle moment.
const SCRUB_NICE: i32 = 19;

/// Lowers the calling thread's scheduling priority by `by` nice steps (at
/// most to 19, the lowest). Linux: a thread's own nice value; elsewhere,
/// nothing. An unprivileged thread can never raise it again, so this is
/// for threads that only do background work.
fn lower_priority(by: i32) {
    #[cfg(target_os = "linux")]
    // SAFETY: getpriority and setpriority with PRIO_PROCESS and who = 0
    // read and change the calling thread's nice value (on Linux, per
    // thread); no pointers involved. getpriority's -1 is also an error
    // value; either reading gives a valid nice value to lower from.
    unsafe {
        let now = libc::getpriority(libc::PRIO_PROCESS, 0);
        libc::setpriority(libc::PRIO_PROCESS, 0, now.saturating_add(by).min(19));
    }
    #[cfg(not(target_os = "linux"))]
    let _ = by;
}

/// A thread of the store's own (the checkpointer, the image writer): at
/// most one runs at a time, and its handle is kept to be joined.
#[derive(Default)]
struct Background(Mutex<Option<std::thread::JoinHandle<()>>>);

impl Background {
    fn slot(&self) -> MutexGuard<'_, Option<std::thread::JoinHandle<()>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `handle`, reaping the previous thread (which has finished).
    fn replace(&self, handle: std::thread::JoinHandle<()>) {
        let previous = self.slot().replace(handle);
        if let Some(h) = previous {
            let _ = h.join();
        }
    }

    /// Waits for the thread, if one was started.
    fn join(&self) {
        let handle = self.slot().take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

/// Why the store stopped taking writes (an I/O error of the log, a sled
/// failure inside a checkpoint): every later write fails with it, its I/O
/// kind kept (`StorageFull` for a full disk), until the journal reopens.
#[derive(Debug, Clone)]
pub(crate) struct Broken {
    kind: std::io::ErrorKind,
    why: String,
}

impl Broken {
    fn other(why: String) -> Broken {
        Broken {
            kind: std::io::ErrorKind::Other,
            why,
        }
    }
}

impl From<Broken> for idem_journal::error::Cause {
    fn from(b: Broken) -> Self {
        Box::new(std::io::Error::new(b.kind, b.why))
    }
}

#[cfg(test)]
mod tests {
    use crate::journal::SledJournal;
    use idem_journal::journal::{ClaimChange, Durability, Expect, Journal, Space, Write, Written};

    async fn write(j: &SledJournal, i: u8) -> bool {
        let (key, body) = ([i; 32], [i; 64]);
        let w = Write {
            space: Space::Ops,
            key: &key,
            expect: Expect::Absent,
            body: &body,
            claim: ClaimChange::Keep,
            escalated: false,
            events: &[],
            durability: Durability::Immediate,
        };
        matches!(j.write(w).await, Ok(Written::Done { .. }))
    }

    #[tokio::test]
    async fn a_background_pass_is_quiet_only_if_little_was_logged_while_it_ran() {
        let dir = tempfile::TempDir::new().unwrap();
        let options = crate::SledOptions {
            checkpoint_bytes: 64 << 10,
            ..crate::SledOptions::default()
        };
        let j = SledJournal::open_with(dir.path(), &options).unwrap();
        let store = j.store();
        let mark = store.log_mark();
        assert!(store.quiet_since(mark), "nothing logged: quiet");
        // A pass during which a sixty-fourth of a segment was logged is
        // busy, although the segment is far from full (as after every
        // checkpoint under load, which starts on a fresh segment).
        let mark = store.log_mark();
        let mut i = 0u8;
        while store.lock().size - mark.1 < (64 << 10) / super::QUIET_SHARE {
            assert!(write(&j, i).await);
            i += 1;
        }
        assert!(store.lock().size < (64 << 10) / 4);
        assert!(!store.quiet_since(mark), "busy");
        // A rotation while the pass ran: busy, whatever the new segment holds.
        let (gen, size) = store.log_mark();
        assert!(store.quiet_since((gen, size)));
        assert!(!store.quiet_since((gen - 1, size)));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn background_threads_lower_their_priority_from_where_it_is() {
        // On a thread of its own: a thread's nice value is its own.
        let seen = std::thread::spawn(|| {
            // SAFETY: reads this thread's own nice value.
            let nice = || unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
            let start = nice();
            // SAFETY: changes this thread's own nice value.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, (start + 3).min(19)) };
            let from = nice();
            super::lower_priority(super::MERGE_NICE);
            let merge = nice();
            super::lower_priority(super::MERGE_NICE);
            (from, merge, nice())
        })
        .join()
        .unwrap();
        let (from, merge, twice) = seen;
        assert_eq!(merge, (from + 10).min(19), "lowered by 10 from {from}");
        assert_eq!(twice, 19, "never past the lowest");
    }

    #[test]
    fn a_lone_caller_fsyncing_its_own_round_fails_closed_when_the_log_write_fails() {
        /// What the calls saw.
        struct Seen {
            writes: u8,
            acknowledged: u8,
            led_before: u64,
            led_after: u64,
            failed_write: bool,
            broken: bool,
            flushing: bool,
            later_write: bool,
        }
        let dir = tempfile::TempDir::new().unwrap();
        let j = SledJournal::open(dir.path()).unwrap();
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        // What the calls saw, checked outside: a failed check must not drop
        // the journal, whose close would wait for a flusher that never
        // comes (the failure this test guards against).
        let seen = tokio.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(60), async {
                // One caller at a time: after a few quiet rounds, the caller
                // writes and fsyncs its round on its own thread. Until then
                // the flusher on the blocking pool may keep the role from
                // one write to the next (the caller, woken by its answer,
                // can enqueue the next write before the flusher sees that
                // none is left: a busy machine does that often), so write
                // until a round was the caller's.
                let store = j.store();
                let led = || store.led.load(std::sync::atomic::Ordering::Relaxed);
                let (mut writes, mut acknowledged) = (0u8, 0u8);
                while writes < 100 && (writes < 8 || led() == 0) {
                    acknowledged += u8::from(write(&j, writes).await);
                    writes += 1;
                }
                let led_before = led();
                // The log can no longer be written: a read-only handle in
                // place of the segment's.
                {
                    let mut st = store.lock();
                    let path = super::wal::segment_path(&store.dir, st.gen);
                    st.file = std::sync::Arc::new(std::fs::File::open(path).unwrap());
                }
                let failed_write = write(&j, 100).await;
                let led_after = led();
                let (broken, flushing) = {
                    let st = store.lock();
                    (st.broken.is_some(), st.flushing)
                };
                let later_write = write(&j, 101).await;
                Seen {
                    writes,
                    acknowledged,
                    led_before,
                    led_after,
                    failed_write,
                    broken,
                    flushing,
                    later_write,
                }
            })
            .await
        });
        let Ok(seen) = seen else {
            std::mem::forget(j);
            panic!("a write never returned: the flusher role was not handed back");
        };
        assert_eq!(seen.acknowledged, seen.writes);
        assert!(seen.led_before > 0, "no round was written by its caller");
        assert_eq!(
            seen.led_after,
            seen.led_before + 1,
            "the failed round was the caller's"
        );
        if seen.flushing {
            std::mem::forget(j);
            panic!("the leader kept the flusher role after its round failed");
        }
        assert!(!seen.failed_write, "a write whose barrier failed");
        assert!(seen.broken, "the failed round broke the store");
        assert!(!seen.later_write, "a write after the store broke");
        // Closing returns; the reopened journal holds what was acknowledged.
        drop(j);
        let j = SledJournal::open(dir.path()).unwrap();
        for i in 0..seen.writes {
            let got = crate::fuzzing::sled::block_on(j.load(Space::Ops, &[i; 32]));
            assert_eq!(got.unwrap().unwrap().body, vec![i; 64], "record {i}");
        }
        for i in [100u8, 101] {
            let got = crate::fuzzing::sled::block_on(j.load(Space::Ops, &[i; 32]));
            assert!(got.unwrap().is_none(), "record {i} was never acknowledged");
        }
    }
}
