//! The write-ahead log that makes the sled journal durable at the cost of
//! one fdatasync per group commit.
//!
//! sled 0.34's own `flush` writes its buffer, waits for it with
//! `sync_file_range` (which neither flushes the device's write cache nor the
//! file's size), and would need an fdatasync on top: two device round trips
//! per durability barrier. Instead, every change applied to sled is also
//! appended to this log, and a barrier is one `write` plus one `fdatasync`
//! of the log, shared by every caller waiting at that moment (group commit).
//! sled writes its own files in the background; a checkpoint (sled flush +
//! fdatasync of its data file) lets old log segments go.
//!
//! On open, every segment is replayed into sled in order: entries are whole
//! values (put or remove), so replaying one sled already has is harmless.
//! Replay of a segment stops at the first entry that is torn or fails its
//! checksum: nothing after it was ever acknowledged, because a barrier
//! acknowledges only after everything before it is on disk.
//!
//! Segment `idem-wal.<16 hex digits>`: an 8-byte header `IDEMWAL1`, then
//! frames `[body length: u32 LE][crc32(body): u32 LE][body]`, body =
//! `[space: u8][op: u8][key length: u32 LE][key][value]`.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

use tokio::sync::oneshot;

use super::events::{self, Event};
use super::Space;
use crate::record::crc32;

const HEADER: &[u8; 8] = b"IDEMWAL1";
const PREFIX: &str = "idem-wal.";
const OP_PUT: u8 = 1;
const OP_REMOVE: u8 = 2;
/// A log segment larger than this is checkpointed away.
const CHECKPOINT_BYTES: u64 = 32 << 20;

/// Whether a file name is one of the log's segments.
pub(super) fn is_segment(name: &str) -> bool {
    segment_gen(name).is_some()
}

fn segment_gen(name: &str) -> Option<u64> {
    let hex = name.strip_prefix(PREFIX)?;
    if hex.len() != 16 {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

fn segment_path(dir: &Path, gen: u64) -> PathBuf {
    dir.join(format!("{PREFIX}{gen:016x}"))
}

fn segments(dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if let Some(gen) = segment_gen(&entry.file_name().to_string_lossy()) {
            found.push((gen, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// One logged change.
pub(super) struct Entry<'a> {
    pub space: Space,
    pub key: &'a [u8],
    /// `None`: removed.
    pub value: Option<&'a [u8]>,
}

fn encode(entry: &Entry<'_>, out: &mut Vec<u8>) {
    let value = entry.value.unwrap_or(&[]);
    let body_len = 2 + 4 + entry.key.len() + value.len();
    out.reserve(8 + body_len);
    let start = out.len();
    out.extend_from_slice(&(body_len as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.push(entry.space as u8);
    out.push(if entry.value.is_some() {
        OP_PUT
    } else {
        OP_REMOVE
    });
    out.extend_from_slice(&(entry.key.len() as u32).to_le_bytes());
    out.extend_from_slice(entry.key);
    out.extend_from_slice(value);
    let crc = crc32(&out[start + 8..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// Decodes the valid prefix of a segment's frames (after the header).
fn decode(mut bytes: &[u8], mut apply: impl FnMut(Entry<'_>)) -> usize {
    let mut applied = 0;
    while bytes.len() >= 8 {
        let len = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
        let crc = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
        let Some(body) = bytes.get(8..8 + len) else {
            break; // torn tail
        };
        if len < 6 || crc32(body) != crc {
            break;
        }
        let space = Space::ALL.iter().copied().find(|s| *s as u8 == body[0]);
        let key_len = u32::from_le_bytes([body[2], body[3], body[4], body[5]]) as usize;
        let (Some(space), Some(key)) = (space, body.get(6..6 + key_len)) else {
            break;
        };
        let value = match body[1] {
            OP_PUT => Some(&body[6 + key_len..]),
            OP_REMOVE => None,
            _ => break,
        };
        apply(Entry { space, key, value });
        applied += 1;
        bytes = &bytes[8 + len..];
    }
    applied
}

/// Replays every segment of `dir` through `apply`, in order; returns the
/// highest generation found (0 if none) and the entries applied.
pub(super) fn replay(dir: &Path, mut apply: impl FnMut(Entry<'_>)) -> io::Result<(u64, usize)> {
    let mut last = 0;
    let mut applied = 0;
    for (gen, path) in segments(dir)? {
        let mut bytes = Vec::new();
        File::open(&path)?.read_to_end(&mut bytes)?;
        if bytes.len() >= HEADER.len() && &bytes[..HEADER.len()] == HEADER {
            applied += decode(&bytes[HEADER.len()..], &mut apply);
        }
        last = gen;
    }
    Ok((last, applied))
}

/// Someone waiting for a barrier.
pub(super) enum Waiter {
    Async(oneshot::Sender<Result<(), String>>),
    Blocking(std::sync::mpsc::Sender<Result<(), String>>),
}

impl Waiter {
    fn answer(self, result: Result<(), String>) {
        // A waiter whose call was dropped no longer listens; fine.
        match self {
            Waiter::Async(tx) => {
                let _ = tx.send(result);
            }
            Waiter::Blocking(tx) => {
                let _ = tx.send(result);
            }
        }
    }
}

struct State {
    file: Arc<File>,
    gen: u64,
    size: u64,
    /// Frames logged since the last barrier took them.
    pending: Vec<u8>,
    waiters: Vec<Waiter>,
    flushing: bool,
    /// Set after a failed write or fdatasync: the page cache's state is then
    /// unknown, so every later barrier fails until the journal is reopened.
    broken: Option<String>,
    /// Audit events appended but not yet stored in sled (see `events.rs`).
    audit_tail: Vec<Event>,
    /// The next audit sequence number. Kept here rather than taken from
    /// sled's `generate_id`, whose counter is only persisted by a sled flush:
    /// after a kill, a restarted process was handed numbers already used by
    /// the dead one, and its batches overwrote the dead one's events.
    next_seq: u64,
}

/// The log, its group commit, and what a checkpoint needs.
pub(super) struct Wal {
    dir: PathBuf,
    state: Mutex<State>,
    idle: Condvar,
    db: sled::Db,
    db_file: File,
    audit: sled::Tree,
}

impl Wal {
    /// Starts a fresh segment after `last_gen`, once replay is done and sled
    /// holds everything the old segments said.
    /// `next_seq` must exceed every audit sequence number stored or
    /// replayed.
    pub(super) fn start(
        dir: &Path,
        last_gen: u64,
        db: sled::Db,
        db_file: File,
        audit: sled::Tree,
        next_seq: u64,
    ) -> io::Result<Wal> {
        let gen = last_gen + 1;
        let file = create_segment(dir, gen)?;
        Ok(Wal {
            dir: dir.to_path_buf(),
            state: Mutex::new(State {
                file: Arc::new(file),
                gen,
                size: HEADER.len() as u64,
                pending: Vec::with_capacity(64 << 10),
                waiters: Vec::new(),
                flushing: false,
                broken: None,
                audit_tail: Vec::new(),
                next_seq,
            }),
            idle: Condvar::new(),
            db,
            db_file,
            audit,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `change` (a sled operation) and logs what it reports it changed,
    /// under one lock, so the log's order of changes to a key is sled's.
    pub(super) fn logged<'e, R>(
        &self,
        change: impl FnOnce() -> R,
        entry: impl FnOnce(&R) -> Option<Entry<'e>>,
    ) -> R {
        self.logged_with_events(change, entry, &[]).0
    }

    /// Appends an audit event: logged for durability and kept in memory
    /// until the flusher stores it in sled. The sequence number is taken
    /// under the log's lock, so the tail is in sequence order.
    pub(super) fn append_audit(&self, value: &[u8]) -> u64 {
        push_audit(&mut self.lock(), value)
    }

    /// [`Wal::logged`], plus, if the change is logged, `events` appended
    /// to the audit stream under the same lock: the flusher takes either
    /// all of it or none of it.
    pub(super) fn logged_with_events<'e, R>(
        &self,
        change: impl FnOnce() -> R,
        entry: impl FnOnce(&R) -> Option<Entry<'e>>,
        events: &[Vec<u8>],
    ) -> (R, Vec<u64>) {
        let mut state = self.lock();
        let result = change();
        let mut seqs = Vec::new();
        if let Some(e) = entry(&result) {
            encode(&e, &mut state.pending);
            seqs = events.iter().map(|ev| push_audit(&mut state, ev)).collect();
        }
        (result, seqs)
    }

    /// The audit events not yet in sled, oldest first.
    pub(super) fn audit_tail(&self) -> Vec<Event> {
        self.lock().audit_tail.clone()
    }

    /// Stores the audit tail in sled as one batch. The events stay in the
    /// tail until the insert is done, so a reader never misses one.
    fn store_audit_tail(&self) -> bool {
        let batch = self.lock().audit_tail.clone();
        let Some(first) = batch.first() else {
            return true;
        };
        if self
            .audit
            .insert(first.0.to_be_bytes(), events::encode_batch(&batch))
            .is_err()
        {
            // Still durable in the log; the next round tries again.
            return false;
        }
        self.lock().audit_tail.drain(..batch.len());
        true
    }

    /// Queues `waiter` for the next barrier. Returns true if the caller must
    /// start the flusher.
    pub(super) fn enqueue(&self, waiter: Waiter) -> bool {
        let mut state = self.lock();
        state.waiters.push(waiter);
        !std::mem::replace(&mut state.flushing, true)
    }

    /// The flusher: until no waiter is left, takes every waiter and every
    /// logged frame, writes and fdatasyncs them once, answers the waiters.
    pub(super) fn flush_loop(self: Arc<Self>) {
        let mut buf = Vec::new();
        loop {
            let (file, waiters, broken) = {
                let mut state = self.lock();
                if state.waiters.is_empty() {
                    state.flushing = false;
                    self.idle.notify_all();
                    return;
                }
                std::mem::swap(&mut buf, &mut state.pending);
                state.size += buf.len() as u64;
                (
                    state.file.clone(),
                    std::mem::take(&mut state.waiters),
                    state.broken.clone(),
                )
            };
            let result = match broken {
                Some(why) => Err(why),
                None => write_and_sync(&file, &buf).map_err(|e| {
                    let why = format!("write-ahead log write failed: {e}; reopen the journal");
                    self.lock().broken = Some(why.clone());
                    why
                }),
            };
            buf.clear();
            let ok = result.is_ok();
            for w in waiters {
                w.answer(result.clone());
            }
            if self.store_audit_tail() && ok {
                self.maybe_checkpoint();
            }
        }
    }

    /// Blocks until no flusher runs (so that dropping the journal releases
    /// everything it holds).
    pub(super) fn wait_idle(&self) {
        let mut state = self.lock();
        while state.flushing {
            state = self.idle.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }

    pub(super) fn size(&self) -> u64 {
        self.lock().size
    }

    /// Moves to a new segment once the current one is large: after sled's
    /// own files are durable, the old segments say nothing sled does not.
    fn maybe_checkpoint(&self) {
        let (old_gen, next) = {
            let state = self.lock();
            if state.size < CHECKPOINT_BYTES || state.broken.is_some() {
                return;
            }
            // Events whose log entries are in the old segment are in sled
            // by now (`store_audit_tail` ran first); later ones are logged in
            // the pending buffer, which goes to the new segment.
            (state.gen, state.gen + 1)
        };
        // A failed checkpoint only means the log keeps growing; the data is
        // durable in it either way.
        let Ok(file) = create_segment(&self.dir, next) else {
            return;
        };
        {
            // Changes logged from now on go to the new segment; every change
            // before the swap is in sled already, and the flush below makes
            // it durable there.
            let mut state = self.lock();
            state.file = Arc::new(file);
            state.gen = next;
            state.size = HEADER.len() as u64 + state.pending.len() as u64;
        }
        if self.db.flush().is_err() || self.db_file.sync_data().is_err() {
            return;
        }
        if let Ok(all) = segments(&self.dir) {
            for (gen, path) in all {
                if gen <= old_gen {
                    let _ = fs::remove_file(path);
                }
            }
            let _ = sync_dir(&self.dir);
        }
    }
}

/// Logs an audit event and keeps it in the tail; the caller holds the lock.
fn push_audit(state: &mut State, value: &[u8]) -> u64 {
    let seq = state.next_seq;
    state.next_seq += 1;
    let key = seq.to_be_bytes();
    encode(
        &Entry {
            space: Space::Audit,
            key: &key,
            value: Some(value),
        },
        &mut state.pending,
    );
    state.audit_tail.push((seq, value.to_vec()));
    seq
}

fn write_and_sync(file: &File, buf: &[u8]) -> io::Result<()> {
    let mut f = file;
    f.write_all(buf)?;
    file.sync_data()
}

fn create_segment(dir: &Path, gen: u64) -> io::Result<File> {
    let mut file = OpenOptions::new()
        .create_new(true)
        .append(true)
        .open(segment_path(dir, gen))?;
    file.write_all(HEADER)?;
    file.sync_all()?;
    sync_dir(dir)?;
    Ok(file)
}

/// Removes every segment up to `gen` (after replay made them redundant).
pub(super) fn remove_up_to(dir: &Path, gen: u64) -> io::Result<()> {
    for (g, path) in segments(dir)? {
        if g <= gen {
            fs::remove_file(path)?;
        }
    }
    sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    type Change<'a> = (Space, &'a [u8], Option<&'a [u8]>);

    fn frames(entries: &[Change<'_>]) -> Vec<u8> {
        let mut out = Vec::new();
        for (space, key, value) in entries {
            encode(
                &Entry {
                    space: *space,
                    key,
                    value: *value,
                },
                &mut out,
            );
        }
        out
    }

    fn read(bytes: &[u8]) -> Vec<(Space, Vec<u8>, Option<Vec<u8>>)> {
        let mut got = Vec::new();
        decode(bytes, |e| {
            got.push((e.space, e.key.to_vec(), e.value.map(<[u8]>::to_vec)))
        });
        got
    }

    #[test]
    fn round_trip() {
        let bytes = frames(&[
            (Space::Ops, b"k1", Some(b"v1")),
            (Space::Audit, b"", Some(b"")),
            (Space::Ops, b"k1", None),
        ]);
        assert_eq!(
            read(&bytes),
            vec![
                (Space::Ops, b"k1".to_vec(), Some(b"v1".to_vec())),
                (Space::Audit, vec![], Some(vec![])),
                (Space::Ops, b"k1".to_vec(), None),
            ]
        );
    }

    #[test]
    fn a_torn_or_corrupt_tail_ends_replay_at_the_last_good_frame() {
        let bytes = frames(&[
            (Space::Ops, b"a", Some(b"1")),
            (Space::Ops, b"b", Some(b"2")),
        ]);
        let first_len = bytes.len() / 2;
        for cut in 0..bytes.len() {
            let got = read(&bytes[..cut]);
            assert_eq!(got.len(), usize::from(cut >= first_len), "cut at {cut}");
        }
        for i in first_len..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert_eq!(read(&b).len(), 1, "flip at {i}");
        }
    }

    #[test]
    fn replay_reads_segments_in_order_and_skips_foreign_files() {
        let dir = tempfile::TempDir::new().unwrap();
        for (gen, value) in [(2u64, b"second"), (1, b"first_")] {
            let mut bytes = HEADER.to_vec();
            bytes.extend(frames(&[(Space::Ops, b"k", Some(value))]));
            fs::write(segment_path(dir.path(), gen), bytes).unwrap();
        }
        fs::write(dir.path().join("idem-wal.notes"), b"x").unwrap();
        let mut seen = Vec::new();
        let (last, applied) = replay(dir.path(), |e| seen.push(e.value.unwrap().to_vec())).unwrap();
        assert_eq!((last, applied), (2, 2));
        assert_eq!(seen, [b"first_".to_vec(), b"second".to_vec()]);
    }
}
