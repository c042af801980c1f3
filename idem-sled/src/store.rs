//! The running sled journal: writes, reads, the group commit, eventual
//! durability and checkpoints.
//!
//! A write is decided and logged under one lock: its condition is checked
//! against the newest value (the overlay, else sled), its unit appended to
//! the pending log buffer, and the overlay updated, so the log's order of
//! changes is the order they were decided in. A barrier takes every
//! pending unit and every waiter, writes and fdatasyncs once, and answers
//! them all (group commit).
//!
//! sled is not written here: the overlay holds every change since the last
//! checkpoint, and a checkpoint (on its own thread, once the current
//! segment is large) applies the rotated-away segments to sled, makes sled
//! durable, records the checkpoint and drops the overlay entries they
//! covered. See `apply.rs`. The segments stay: with the last image they are
//! the second copy of sled's content that repairs sled after a power cut.
//! Once they outgrow that image, a new one is written (on another thread)
//! and the segments it covers are deleted. See `image.rs`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::apply::{self, Trees};
use crate::digest::{self, Digest as ContentDigest};
use crate::events;
use crate::files::{self, Checkpoint};
use crate::image;
use crate::stored::{self, Header};
use crate::wal::{self, Change, Tree};
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

struct State {
    file: Arc<File>,
    gen: u64,
    size: u64,
    /// Units logged since the last barrier took them, and the last lsn in
    /// them.
    pending: Vec<u8>,
    pending_lsn: u64,
    waiters: Vec<Waiter>,
    flushing: bool,
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
    /// What the last checkpoint recorded.
    checkpoint: Checkpoint,
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
    /// One truncation at a time (it reads outside the state lock).
    truncating: Mutex<()>,
    /// fdatasyncs of the log so far (what group commit saves).
    fsyncs: std::sync::atomic::AtomicU64,
    /// Set when the journal closes: an image being written gives up.
    closing: AtomicBool,
    imager: Background,
    /// Tests: the next checkpoint panics as sled does on damage.
    #[cfg(test)]
    pub(super) panic_in_checkpoint: AtomicBool,
    /// Tests and the fuzz harness: a close leaves its log unapplied, as a
    /// crash (or a failed last checkpoint) does.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(super) no_close_checkpoint: AtomicBool,
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
    /// A store over sled `trees`, logging to a fresh segment after `last`
    /// (the checkpoint just written); `image` is the generation the image
    /// on disk covers (0: none) and its size.
    pub(super) fn start(
        dir: PathBuf,
        location: String,
        trees: Trees,
        checkpoint: Checkpoint,
        image: (u64, u64),
        tuning: Tuning,
    ) -> std::io::Result<Arc<Store>> {
        let gen = checkpoint.gen + 1;
        let file = wal::create_segment(&dir, gen)?;
        Ok(Arc::new(Store {
            dir,
            location,
            trees,
            tuning,
            state: Mutex::new(State {
                file: Arc::new(file),
                gen,
                size: wal::HEADER_LEN as u64,
                pending: Vec::with_capacity(64 << 10),
                pending_lsn: 0,
                waiters: Vec::new(),
                flushing: false,
                broken: None,
                next_lsn: checkpoint.next_lsn,
                next_seq: checkpoint.next_seq,
                durable_lsn: checkpoint.next_lsn.saturating_sub(1),
                overlay: BTreeMap::new(),
                tail: VecDeque::new(),
                floor: 0,
                eventual_scheduled: false,
                checkpointing: false,
                peak_size: 0,
                checkpoint,
                image_gen: image.0,
                image_bytes: image.1,
                imaging: false,
            }),
            idle: Condvar::new(),
            checkpointed: Condvar::new(),
            checkpointer: Background::default(),
            truncating: Mutex::new(()),
            fsyncs: std::sync::atomic::AtomicU64::new(0),
            closing: AtomicBool::new(false),
            imager: Background::default(),
            #[cfg(test)]
            panic_in_checkpoint: AtomicBool::new(false),
            #[cfg(any(test, feature = "fuzzing"))]
            no_close_checkpoint: AtomicBool::new(false),
        }))
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

    /// The newest bytes of a key: the overlay's, else sled's.
    fn current(&self, state: &State, tree: Tree, key: &Digest) -> Result<Option<Arc<[u8]>>, Error> {
        if let Some(p) = state.overlay.get(&(tree, *key)) {
            return Ok(p.value.clone());
        }
        self.trees
            .tree(tree)
            .get(key)
            .map(|v| v.map(|v| Arc::from(&*v)))
            .map_err(|e| self.err("read", e))
    }

    pub(super) fn load(&self, tree: Tree, key: &Digest) -> Result<Option<Loaded>, Error> {
        let overlaid = self.lock().overlay.get(&(tree, *key)).cloned();
        // Outside the lock: a checkpoint drops an overlay entry only after
        // sled holds its value, so missing it here means sled has it.
        let bytes = match overlaid {
            Some(p) => p.value,
            None => self
                .trees
                .tree(tree)
                .get(key)
                .map_err(|e| self.err("read", e))?
                .map(|v| Arc::from(&*v)),
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
        let old = self.current(&st, tree, w.key)?;
        let old_header = match &old {
            Some(b) => Some(
                stored::decode(b)
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
        let prev_owner = old_header.as_ref().and_then(|h| h.owner.clone());
        let was_escalated = old_header.as_ref().is_some_and(|h| h.escalated);
        let (epoch, owner) = match w.claim {
            ClaimChange::Keep => (prev_epoch, prev_owner),
            ClaimChange::Take(o) => (prev_epoch + 1, Some(o.clone())),
            ClaimChange::Release => (prev_epoch, None),
        };
        let header = Header {
            version: lsn,
            epoch,
            owner,
            escalated: w.escalated,
        };
        let value: Arc<[u8]> = Arc::from(stored::encode(&header, w.body));

        let mut delta = ContentDigest::default();
        if let Some(o) = &old {
            delta.remove(digest::entry_hash(tree as u8, w.key, o));
        }
        delta.add(digest::entry_hash(tree as u8, w.key, &value));
        let mut changes = vec![Change::Put {
            tree,
            key: &w.key[..],
            value: &value[..],
        }];
        let index = digest::entry_hash(Tree::Escalations as u8, w.key, &[]);
        match (was_escalated, w.escalated) {
            (false, true) => {
                delta.add(index);
                changes.push(Change::Put {
                    tree: Tree::Escalations,
                    key: &w.key[..],
                    value: &[],
                });
            }
            (true, false) => {
                delta.remove(index);
                changes.push(Change::Remove {
                    tree: Tree::Escalations,
                    key: &w.key[..],
                });
            }
            _ => {}
        }
        let seqs: Vec<u64> = (st.next_seq..st.next_seq + w.events.len() as u64).collect();
        for (seq, e) in seqs.iter().zip(w.events) {
            delta.add(digest::entry_hash(
                digest::AUDIT,
                &seq.to_be_bytes(),
                e.bytes,
            ));
            changes.push(Change::Event {
                seq: *seq,
                bytes: e.bytes,
            });
        }
        let st = &mut *st;
        wal::encode_unit(&mut st.pending, lsn, delta.xor, delta.count, &changes);
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
        delta.remove(digest::entry_hash(tree as u8, key, &old));
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
        let mut delta = ContentDigest::default();
        let changes: Vec<Change<&[u8]>> = seqs
            .iter()
            .zip(events)
            .map(|(seq, e)| {
                delta.add(digest::entry_hash(
                    digest::AUDIT,
                    &seq.to_be_bytes(),
                    e.bytes,
                ));
                Change::Event {
                    seq: *seq,
                    bytes: e.bytes,
                }
            })
            .collect();
        let st = &mut *st;
        wal::encode_unit(&mut st.pending, lsn, delta.xor, delta.count, &changes);
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

    /// Durable events from `from`, at most `limit`.
    pub(super) fn events(&self, from: u64, limit: usize) -> Result<EventRows, Error> {
        let (tail, floor) = {
            let st = self.lock();
            let tail: Vec<TailEvent> = st
                .tail
                .iter()
                .filter(|e| e.seq >= from && e.lsn <= st.durable_lsn)
                .take(limit)
                .cloned()
                .collect();
            (tail, st.floor)
        };
        let from = from.max(floor);
        let mut out: EventRows = Vec::new();
        let start = events::bucket_of(from).to_be_bytes();
        'buckets: for item in self.trees.audit.range(start..) {
            let (k, v) = item.map_err(|e| self.err("read the audit stream", e))?;
            let bucket = events::decode_bucket(&v).map_err(|detail| Error::Corrupt {
                what: "audit bucket",
                location: self.location.clone(),
                key: idem_journal::key::hex(&k),
                detail,
            })?;
            for (seq, bytes) in bucket {
                if seq < from {
                    continue;
                }
                if out.len() >= limit {
                    break 'buckets;
                }
                out.push((seq, bytes));
            }
        }
        // The tail holds what sled does not yet, and possibly (during a
        // checkpoint) some of what it just received: one copy of each.
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

    /// Up to `limit` records of `tree` after `after`, in key order: sled's
    /// range and the overlay's, merged (the overlay's entry wins; its
    /// removals hide sled's). The overlay is read a chunk at a time, so a
    /// page costs its length plus the removals it skips, however large the
    /// overlay is.
    pub(super) fn scan(
        &self,
        tree: Tree,
        after: Option<&Digest>,
        limit: usize,
    ) -> Result<Vec<(Digest, Loaded)>, Error> {
        const CHUNK: usize = 256;
        let decode = |k: Digest, v: &[u8]| -> Result<(Digest, Loaded), Error> {
            let (h, body) = stored::decode(v).map_err(|d| self.corrupt(tree, &k, d))?;
            Ok((k, stored::loaded(h, body)))
        };
        let mut sled_iter = match after {
            Some(a) => self.trees.tree(tree).range((
                std::ops::Bound::Excluded(a.to_vec()),
                std::ops::Bound::Unbounded,
            )),
            None => self.trees.tree(tree).range::<&[u8], _>(..),
        };
        let mut next_sled = || -> Result<Option<(Digest, sled::IVec)>, Error> {
            for item in sled_iter.by_ref() {
                let (k, v) = item.map_err(|e| self.err("scan", e))?;
                if let Some(d) = digest_of(&k) {
                    return Ok(Some((d, v)));
                }
            }
            Ok(None)
        };
        let mut chunk: VecDeque<(Digest, Option<Arc<[u8]>>)> = VecDeque::new();
        let mut cursor = after.copied();
        let mut overlay_done = false;
        let refill = |chunk: &mut VecDeque<_>, cursor: &mut Option<Digest>, done: &mut bool| {
            if !chunk.is_empty() || *done {
                return;
            }
            let st = self.lock();
            chunk.extend(
                st.overlay
                    .range(tree_range(tree, cursor.as_ref()))
                    .take(CHUNK)
                    .map(|((_, k), p)| (*k, p.value.clone())),
            );
            drop(st);
            match chunk.back() {
                Some((k, _)) => *cursor = Some(*k),
                None => *done = true,
            }
        };
        let mut out = Vec::new();
        let mut sled_head = next_sled()?;
        while out.len() < limit {
            refill(&mut chunk, &mut cursor, &mut overlay_done);
            match (chunk.front(), &sled_head) {
                (None, None) => break,
                (Some((o, _)), s) if s.as_ref().is_none_or(|(sk, _)| o <= sk) => {
                    let (o, value) = chunk.pop_front().expect("front exists");
                    if sled_head.as_ref().is_some_and(|(sk, _)| *sk == o) {
                        sled_head = next_sled()?;
                    }
                    if let Some(v) = value {
                        out.push(decode(o, &v)?);
                    }
                }
                (_, Some(_)) => {
                    let (k, v) = sled_head.take().expect("head exists");
                    out.push(decode(k, &v)?);
                    sled_head = next_sled()?;
                }
                (Some(_), None) => unreachable!("covered by the first arm"),
            }
        }
        Ok(out)
    }

    /// Logs the removal of every event below `before`.
    pub(super) fn truncate_events(&self, before: u64) -> Result<u64, Error> {
        let _one = self.truncating.lock().unwrap_or_else(|p| p.into_inner());
        // Events below `before` no longer change (new ones are numbered
        // higher), so they can be read without the state lock; the same
        // number seen in sled and in the tail counts once.
        let floor = self.lock().floor;
        let mut doomed = ContentDigest::default();
        let mut seen = BTreeSet::new();
        let mut from = floor;
        loop {
            let page = self.events(from, 4096)?;
            let Some(last) = page.last().map(|e| e.0) else {
                break;
            };
            for (seq, bytes) in &page {
                if *seq < before && seen.insert(*seq) {
                    doomed.remove(digest::entry_hash(digest::AUDIT, &seq.to_be_bytes(), bytes));
                }
            }
            if last >= before {
                break;
            }
            from = last + 1;
        }
        // Events appended but not yet durable are not in `events`; they are
        // numbered after every durable one, so below `before` only if the
        // caller asked to truncate what it has not seen: refuse that.
        let mut st = self.lock();
        if let Some(why) = &st.broken {
            return Err(self.err("truncate the audit stream", why.clone()));
        }
        if st
            .tail
            .iter()
            .any(|e| e.seq < before && e.lsn > st.durable_lsn)
        {
            return Err(Error::Usage(
                "truncate_events: events below the bound are not durable yet; sync first".into(),
            ));
        }
        if before <= st.floor || seen.is_empty() {
            return Ok(0);
        }
        let lsn = st.next_lsn;
        let st = &mut *st;
        wal::encode_unit(
            &mut st.pending,
            lsn,
            doomed.xor,
            doomed.count,
            &[Change::Truncate { before }],
        );
        st.next_lsn += 1;
        st.pending_lsn = lsn;
        st.floor = before;
        st.tail.retain(|e| e.seq >= before);
        Ok(seen.len() as u64)
    }

    /// The log's size plus the image's and sled's.
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
        Ok(sled + log + image)
    }

    // ---- durability ----

    /// Waits until everything logged so far is durable.
    pub(super) async fn barrier(self: &Arc<Self>) -> Result<(), Error> {
        let (tx, rx) = oneshot::channel();
        if self.enqueue(Waiter::Async(tx)) {
            self.start_flusher();
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
        if self.enqueue(Waiter::Blocking(tx)) {
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

    /// Queues `waiter` for the next barrier. Returns true if the caller must
    /// start the flusher.
    fn enqueue(&self, waiter: Waiter) -> bool {
        let mut st = self.lock();
        st.waiters.push(waiter);
        !std::mem::replace(&mut st.flushing, true)
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
        loop {
            let (file, waiters, broken, lsn) = {
                let mut st = self.lock();
                if st.waiters.is_empty() {
                    st.flushing = false;
                    self.idle.notify_all();
                    return;
                }
                std::mem::swap(&mut buf, &mut st.pending);
                st.size += buf.len() as u64;
                st.peak_size = st.peak_size.max(st.size);
                st.eventual_scheduled = false;
                (
                    st.file.clone(),
                    std::mem::take(&mut st.waiters),
                    st.broken.clone(),
                    st.pending_lsn,
                )
            };
            let result = match broken {
                Some(why) => Err(why),
                None if buf.is_empty() => Ok(()),
                None => wal::write_and_sync(&file, &buf)
                    .inspect(|()| {
                        self.fsyncs
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    })
                    .map_err(|e| {
                        let why = Broken {
                            kind: e.kind(),
                            why: format!("write-ahead log write failed: {e}; reopen the journal"),
                        };
                        self.lock().broken = Some(why.clone());
                        why
                    }),
            };
            buf.clear();
            if result.is_ok() {
                let mut st = self.lock();
                st.durable_lsn = st.durable_lsn.max(lsn);
            }
            let ok = result.is_ok();
            for w in waiters {
                w.answer(result.clone());
            }
            if ok {
                self.maybe_rotate();
            }
        }
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
        let old_gen = {
            let st = self.lock();
            if st.checkpointing || st.broken.is_some() || st.size <= wal::HEADER_LEN as u64 {
                return;
            }
            st.gen
        };
        if let Some(covered) = self.rotate(old_gen) {
            self.clone().checkpoint(old_gen, covered);
        }
    }

    /// Starts segment `old_gen + 1` and marks a checkpoint of `old_gen` as
    /// running; returns the lsn it covers (every unit in the old segment is
    /// durable: the flusher or the last barrier wrote it). `None` if the
    /// segment cannot be created, which includes another rotation having
    /// created it first.
    fn rotate(&self, old_gen: u64) -> Option<u64> {
        let file = wal::create_segment(&self.dir, old_gen + 1).ok()?;
        let mut st = self.lock();
        st.file = Arc::new(file);
        st.gen = old_gen + 1;
        st.size = wal::HEADER_LEN as u64;
        st.checkpointing = true;
        Some(st.durable_lsn)
    }

    /// Applies segments up to `gen` to sled, makes sled durable, records
    /// the checkpoint, and drops the overlay entries (lsn up to `covered`)
    /// that sled now holds. Then starts an image if the kept log is large.
    fn checkpoint(self: Arc<Self>, gen: u64, covered: u64) {
        // sled 0.34 panics on some damage in its files. A checkpoint that
        // dies of it must not leave `checkpointing` set (writers would wait
        // for it forever): the store breaks instead, every later write
        // fails without calling anyone, and the next open repairs sled.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            #[cfg(test)]
            if self.panic_in_checkpoint.swap(false, Ordering::Relaxed) {
                panic!("injected: cannot find pid 5 in view_for_key");
            }
            self.checkpoint_inner(gen)
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
                Ok((cp, kept)) => {
                    st.checkpoint = cp;
                    st.overlay.retain(|_, p| p.lsn > covered);
                    st.tail.retain(|e| e.lsn > covered);
                    let due = kept
                        > (LOG_PER_IMAGE * st.image_bytes)
                            .max(IMAGE_AFTER * self.tuning.checkpoint_bytes);
                    if due && !st.imaging && !self.closing.load(Ordering::Relaxed) {
                        st.imaging = true;
                        Some(cp)
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
        if let Some(cp) = image {
            self.start_image(cp);
        }
    }

    /// Writes an image of sled from checkpoint `cp` on, on its own thread,
    /// then deletes the log segments it covers.
    fn start_image(self: Arc<Self>, cp: Checkpoint) {
        let store = self.clone();
        let spawned = std::thread::Builder::new()
            .name("idem-image".into())
            .spawn(move || {
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    image::write(&store.dir, &store.trees, cp.gen, cp.next_lsn, &store.closing)
                }))
                .unwrap_or_else(|panic| {
                    Err(std::io::Error::other(format!(
                        "sled failed while it was read ({})",
                        apply::panic_text(&panic)
                    )))
                })
                .and_then(|bytes| {
                    wal::remove_up_to(&store.dir, cp.gen)?;
                    Ok(bytes)
                });
                let mut st = store.lock();
                st.imaging = false;
                match outcome {
                    Ok(bytes) => {
                        st.image_gen = cp.gen;
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
                drop(st);
                // The image read all of sled through its cache.
                crate::memory::release();
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

    /// Stops an image being written (the journal closes) and waits for it.
    pub(super) fn stop_imaging(&self) {
        self.closing.store(true, Ordering::Relaxed);
        self.imager.join();
    }

    /// Returns the checkpoint and the bytes of log kept since the image.
    fn checkpoint_inner(&self, gen: u64) -> Result<(Checkpoint, u64), String> {
        let (prev, image_gen) = {
            let st = self.lock();
            (st.checkpoint, st.image_gen)
        };
        let mut units = Vec::new();
        let mut min_lsn = prev.next_lsn;
        let mut kept = 0u64;
        for (g, path) in wal::segments(&self.dir).map_err(|e| e.to_string())? {
            if g > image_gen && g <= gen {
                kept += std::fs::metadata(&path).map_or(0, |m| m.len());
            }
            if g <= prev.gen || g > gen {
                continue;
            }
            let bytes = std::fs::read(&path).map_err(|e| e.to_string())?;
            let seg = wal::read_segment(&bytes, g, false, min_lsn)
                .map_err(|d| format!("{} at offset {}: {}", path.display(), d.offset, d.detail))?;
            if let Some(u) = seg.units.last() {
                min_lsn = u.lsn + 1;
            }
            units.extend(seg.units);
        }
        let applied = apply::apply(&self.trees, &units).map_err(|f| f.to_string())?;
        apply::sync_sled(&self.dir, &self.trees).map_err(|e| e.to_string())?;
        let mut digest = prev.digest();
        digest.apply(applied.delta.xor, applied.delta.count);
        let cp = Checkpoint {
            gen,
            xor: digest.xor,
            count: digest.count,
            next_seq: applied
                .last_seq
                .map_or(prev.next_seq, |s| (s + 1).max(prev.next_seq)),
            next_lsn: applied
                .last_lsn
                .map_or(prev.next_lsn, |l| (l + 1).max(prev.next_lsn)),
        };
        files::write(&self.dir, files::CHECKPOINT, Kind::Checkpoint, &cp)
            .map_err(|e| e.to_string())?;
        Ok((cp, kept))
    }

    /// Waits for a running checkpoint to finish.
    pub(super) fn join_checkpointer(&self) {
        self.checkpointer.join();
    }
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
