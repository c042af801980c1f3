//! Audit files: the audit stream as a checkpoint leaves it, compressed,
//! written once and never changed.
//!
//! The events a checkpoint covers (consecutive sequence numbers) go into
//! one new file, fsynced before the manifest names it. The stream is the
//! files in sequence order, then the events still in memory; truncating it
//! moves a floor in the manifest, and a file wholly below the floor is
//! deleted once the manifest that drops it is durable. Nothing here is
//! ever rewritten: the stream is the largest part of the journal, and
//! compressing it once is all it costs.
//!
//! File `idem-audit.<16 hex digits: id>`:
//!
//! - header, 20 bytes: `IDEMAUD1`, the id (u64 LE), crc32 of those 16;
//! - chunks: `[packed length: u32][plain length: u32][first seq: u64]
//!   [events: u32][crc32 of the 20 bytes before it and the packed bytes:
//!   u32][packed]`, packed = the plain bytes as raw deflate, plain =
//!   frames `[seq: u64][length: u32][event bytes]` in sequence order;
//! - the directory, per chunk `[first seq: u64][last seq: u64][offset:
//!   u64][length: u32]`;
//! - footer, [`FOOTER_LEN`] bytes: first seq (u64), last seq (u64), events
//!   (u64), chunks (u32), directory offset (u64), length (u32), crc32 (u32),
//!   the id (u64), `IDEMAUDE`, crc32 of the footer before it.
//!
//! All integers little-endian. A chunk holds about 64 KiB of events: the
//! events of a run repeat its tool, worker, run and keys, and a chunk that
//! size compresses them to about 40 % of their bytes.

use std::fs::{self, File};
use std::io::{self, Write as _};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};

use crate::deflate::{self, Deflater};
use crate::table::{Damage, ReadError};
use idem_journal::journal::EventRows;
use idem_journal::record::crc32;

const MAGIC: &[u8; 8] = b"IDEMAUD1";
const FOOTER_MAGIC: &[u8; 8] = b"IDEMAUDE";
pub(super) const HEADER_LEN: usize = 20;
/// Bytes of the footer.
pub(super) const FOOTER_LEN: usize = 8 + 8 + 8 + 4 + 8 + 4 + 4 + 8 + 8 + 4;
pub(super) const CHUNK_HEAD: usize = 24;
pub(super) const DIR_ENTRY: usize = 8 + 8 + 8 + 4;
/// A chunk is closed once its frames reach this many bytes.
const CHUNK_BYTES: usize = 64 << 10;
/// The largest plain chunk a file may claim: one event of the largest
/// size the journal writes, framed. Checked before anything is allocated.
const MAX_PLAIN: usize = idem_journal::record::LARGE_LIMIT + (1 << 20);
/// Deflate's fastest level: written on the checkpointer's thread.
const LEVEL: u8 = 1;

/// The file of audit file `id`.
pub(super) fn path(dir: &Path, id: u64) -> PathBuf {
    crate::files::numbered_path(dir, crate::files::AUDIT_PREFIX, id)
}

/// The id an audit file name names.
pub(super) fn id_of(name: &str) -> Option<u64> {
    crate::files::numbered(name, crate::files::AUDIT_PREFIX)
}

fn damaged<T>(offset: u64, detail: impl Into<String>) -> Result<T, ReadError> {
    Err(ReadError::Damaged(Damage {
        offset,
        detail: detail.into(),
    }))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default())
}

fn header(id: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(MAGIC);
    h[8..16].copy_from_slice(&id.to_le_bytes());
    let crc = crc32(&h[..16]);
    h[16..].copy_from_slice(&crc.to_le_bytes());
    h
}

fn chunk_crc(head: &[u8], packed: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(head);
    h.update(packed);
    h.finalize()
}

/// What a written audit file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Written {
    pub id: u64,
    pub first: u64,
    pub last: u64,
    pub events: u64,
    pub bytes: u64,
}

/// Writes audit file `id` of `events` (strictly increasing sequence
/// numbers, at least one), durably (not its directory entry: the caller
/// syncs the directory once for every file it wrote). A failure removes
/// the partial file.
pub(super) fn write<B: AsRef<[u8]>>(
    dir: &Path,
    id: u64,
    events: impl IntoIterator<Item = (u64, B)>,
) -> io::Result<Written> {
    let path = path(dir, id);
    let written = write_inner(&path, id, events);
    if written.is_err() {
        let _ = fs::remove_file(&path);
    }
    written
}

fn write_inner<B: AsRef<[u8]>>(
    path: &Path,
    id: u64,
    events: impl IntoIterator<Item = (u64, B)>,
) -> io::Result<Written> {
    let file = idem_journal::files::options().create_new(true).open(path)?;
    let mut out = io::BufWriter::with_capacity(256 << 10, file);
    out.write_all(&header(id))?;
    let mut at = HEADER_LEN as u64;
    let mut deflater = Deflater::new(LEVEL);
    let mut plain = Vec::with_capacity(CHUNK_BYTES + 4096);
    let mut packed = Vec::new();
    let mut dir_bytes = Vec::new();
    let mut chunks = 0u32;
    let (mut first, mut last, mut count) = (None::<u64>, None::<u64>, 0u64);
    let mut chunk_first = 0u64;
    let mut chunk_events = 0u32;
    let mut flush = |plain: &mut Vec<u8>,
                     chunk_first: u64,
                     chunk_last: u64,
                     chunk_events: u32,
                     out: &mut io::BufWriter<File>|
     -> io::Result<()> {
        packed.clear();
        packed.resize(CHUNK_HEAD, 0);
        deflater.compress_into(plain, &mut packed);
        let n = packed.len() - CHUNK_HEAD;
        packed[..4].copy_from_slice(&(n as u32).to_le_bytes());
        packed[4..8].copy_from_slice(&(plain.len() as u32).to_le_bytes());
        packed[8..16].copy_from_slice(&chunk_first.to_le_bytes());
        packed[16..20].copy_from_slice(&chunk_events.to_le_bytes());
        let crc = chunk_crc(&packed[..20], &packed[CHUNK_HEAD..]);
        packed[20..24].copy_from_slice(&crc.to_le_bytes());
        out.write_all(&packed)?;
        dir_bytes.extend_from_slice(&chunk_first.to_le_bytes());
        dir_bytes.extend_from_slice(&chunk_last.to_le_bytes());
        dir_bytes.extend_from_slice(&at.to_le_bytes());
        dir_bytes.extend_from_slice(&(packed.len() as u32).to_le_bytes());
        at += packed.len() as u64;
        chunks += 1;
        plain.clear();
        Ok(())
    };
    for (seq, bytes) in events {
        let bytes = bytes.as_ref();
        if last.is_some_and(|l| seq <= l) {
            return Err(io::Error::other(
                "audit events must come in strictly increasing sequence order",
            ));
        }
        if bytes.len() > MAX_PLAIN - 1024 {
            return Err(io::Error::other(format!(
                "an audit event of {} bytes is larger than the journal stores",
                bytes.len()
            )));
        }
        if plain.is_empty() {
            chunk_first = seq;
            chunk_events = 0;
        }
        plain.extend_from_slice(&seq.to_le_bytes());
        plain.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        plain.extend_from_slice(bytes);
        chunk_events += 1;
        first.get_or_insert(seq);
        last = Some(seq);
        count += 1;
        if plain.len() >= CHUNK_BYTES {
            flush(&mut plain, chunk_first, seq, chunk_events, &mut out)?;
        }
    }
    let (Some(first), Some(last)) = (first, last) else {
        return Err(io::Error::other("an audit file holds at least one event"));
    };
    if !plain.is_empty() {
        flush(&mut plain, chunk_first, last, chunk_events, &mut out)?;
    }
    let dir_at = at;
    out.write_all(&dir_bytes)?;
    at += dir_bytes.len() as u64;
    let mut f = Vec::with_capacity(FOOTER_LEN);
    f.extend_from_slice(&first.to_le_bytes());
    f.extend_from_slice(&last.to_le_bytes());
    f.extend_from_slice(&count.to_le_bytes());
    f.extend_from_slice(&chunks.to_le_bytes());
    f.extend_from_slice(&dir_at.to_le_bytes());
    f.extend_from_slice(&(dir_bytes.len() as u32).to_le_bytes());
    f.extend_from_slice(&crc32(&dir_bytes).to_le_bytes());
    f.extend_from_slice(&id.to_le_bytes());
    f.extend_from_slice(FOOTER_MAGIC);
    let crc = crc32(&f);
    f.extend_from_slice(&crc.to_le_bytes());
    debug_assert_eq!(f.len(), FOOTER_LEN);
    out.write_all(&f)?;
    at += f.len() as u64;
    out.flush()?;
    out.get_ref().sync_all()?;
    Ok(Written {
        id,
        first,
        last,
        events: count,
        bytes: at,
    })
}

/// Where a chunk is and what it holds.
#[derive(Debug, Clone, Copy)]
struct ChunkRef {
    first: u64,
    last: u64,
    offset: u64,
    len: u32,
}

/// An open audit file, its footer and directory checked.
#[derive(Debug)]
pub(super) struct AuditFile {
    pub first: u64,
    pub last: u64,
    pub events: u64,
    file: File,
    chunks: Vec<ChunkRef>,
}

impl AuditFile {
    /// Opens audit file `id` of `dir`: a regular file of ours, of the size
    /// the manifest recorded (`bytes`, when known).
    pub(super) fn open(dir: &Path, id: u64, bytes: Option<u64>) -> Result<AuditFile, ReadError> {
        let path = path(dir, id);
        let file = crate::files::open_own(&path)?;
        let len = file.metadata()?.len();
        if let Some(expected) = bytes {
            if len != expected {
                return damaged(
                    len.min(expected),
                    format!("the audit file is {len} bytes long, the manifest says {expected}"),
                );
            }
        }
        if len < (HEADER_LEN + FOOTER_LEN) as u64 {
            return damaged(0, format!("{len} bytes is too short for an audit file"));
        }
        let mut h = [0u8; HEADER_LEN];
        file.read_exact_at(&mut h, 0)?;
        if h != header(id) {
            return damaged(0, "bad audit file header (not the audit file of this id)");
        }
        let foot_at = len - FOOTER_LEN as u64;
        let mut f = vec![0u8; FOOTER_LEN];
        file.read_exact_at(&mut f, foot_at)?;
        if crc32(&f[..FOOTER_LEN - 4]) != u32_at(&f, FOOTER_LEN - 4)
            || &f[FOOTER_LEN - 12..FOOTER_LEN - 4] != FOOTER_MAGIC
            || u64_at(&f, FOOTER_LEN - 20) != id
        {
            return damaged(foot_at, "bad audit file footer");
        }
        let first = u64_at(&f, 0);
        let last = u64_at(&f, 8);
        let events = u64_at(&f, 16);
        let chunks = u32_at(&f, 24) as u64;
        let dir_at = u64_at(&f, 28);
        let dir_len = u32_at(&f, 36) as u64;
        let dir_crc = u32_at(&f, 40);
        if dir_at.checked_add(dir_len) != Some(foot_at)
            || dir_len != chunks * DIR_ENTRY as u64
            || chunks == 0
            || first > last
            || events == 0
            // Not `last - first + 1`: it overflows for 0..=u64::MAX.
            || events - 1 > last - first
        {
            return damaged(foot_at, "the footer's sections do not fit the file");
        }
        let mut raw = vec![0u8; dir_len as usize];
        file.read_exact_at(&mut raw, dir_at)?;
        if crc32(&raw) != dir_crc {
            return damaged(dir_at, "the chunk directory's checksum does not match");
        }
        let mut dir = Vec::with_capacity(chunks as usize);
        let mut next_at = HEADER_LEN as u64;
        let mut next_seq = first;
        for (i, e) in raw.chunks_exact(DIR_ENTRY).enumerate() {
            let c = ChunkRef {
                first: u64_at(e, 0),
                last: u64_at(e, 8),
                offset: u64_at(e, 16),
                len: u32_at(e, 24),
            };
            if c.offset != next_at
                || (c.len as usize) < CHUNK_HEAD
                || c.first < next_seq
                || c.first > c.last
                || (i == 0 && c.first != first)
            {
                return damaged(
                    dir_at + (i * DIR_ENTRY) as u64,
                    format!("chunk directory entry {i} is out of place"),
                );
            }
            next_at = c.offset + u64::from(c.len);
            next_seq = c.last.saturating_add(1);
            dir.push(c);
        }
        if next_at != dir_at || dir.last().map(|c| c.last) != Some(last) {
            return damaged(dir_at, "the chunks do not end where the directory starts");
        }
        Ok(AuditFile {
            first,
            last,
            events,
            file,
            chunks: dir,
        })
    }

    /// Reads and checks chunk `i`: its frames.
    fn chunk(&self, i: usize) -> Result<Vec<u8>, ReadError> {
        let c = self.chunks[i];
        let mut buf = vec![0u8; c.len as usize];
        self.file.read_exact_at(&mut buf, c.offset)?;
        if u32_at(&buf, 0) as usize + CHUNK_HEAD != buf.len()
            || chunk_crc(&buf[..20], &buf[CHUNK_HEAD..]) != u32_at(&buf, 20)
            || u64_at(&buf, 8) != c.first
        {
            return damaged(c.offset, format!("chunk {i}'s checksum does not match"));
        }
        let plain_len = u32_at(&buf, 4) as usize;
        deflate::inflate_exact(&buf[CHUNK_HEAD..], plain_len, MAX_PLAIN, "an audit chunk")
            .or_else(|d| damaged(c.offset, d))
    }

    /// Appends to `out` the events from `from` on, up to `limit` in all
    /// (`out` counted), in order.
    pub(super) fn read(
        &self,
        from: u64,
        limit: usize,
        out: &mut EventRows,
    ) -> Result<(), ReadError> {
        let start = self.chunks.partition_point(|c| c.last < from);
        for i in start..self.chunks.len() {
            if out.len() >= limit {
                return Ok(());
            }
            self.frames(i, |seq, bytes| {
                if seq >= from && out.len() < limit {
                    out.push((seq, bytes.to_vec()));
                }
            })?;
        }
        Ok(())
    }

    /// Reads and checks chunk `i` and hands `each` its events in order:
    /// every frame whole, the sequence numbers rising from the chunk's
    /// first to its last.
    fn frames(&self, i: usize, mut each: impl FnMut(u64, &[u8])) -> Result<(), ReadError> {
        let c = self.chunks[i];
        let plain = self.chunk(i)?;
        let mut at = 0;
        let mut expected_last = None;
        while at < plain.len() {
            let bad = || damaged::<()>(c.offset, format!("chunk {i} holds a cut frame"));
            let Some(head) = plain.get(at..at + 12) else {
                return bad();
            };
            let seq = u64_at(head, 0);
            let len = u32_at(head, 8) as usize;
            let Some(bytes) = plain.get(at + 12..at + 12 + len) else {
                return bad();
            };
            at += 12 + len;
            let in_order = match expected_last {
                None => seq == c.first,
                Some(prev) => seq > prev,
            };
            if !in_order || seq > c.last {
                return damaged(
                    c.offset,
                    format!("chunk {i} holds event {seq} out of place"),
                );
            }
            expected_last = Some(seq);
            each(seq, bytes);
        }
        if expected_last != Some(c.last) {
            return damaged(c.offset, format!("chunk {i} ends before event {}", c.last));
        }
        Ok(())
    }

    /// Checks every chunk (the background scrub, and tests), copying
    /// nothing out.
    pub(super) fn verify(&self) -> Result<(), ReadError> {
        let mut n = 0u64;
        for i in 0..self.chunks.len() {
            self.frames(i, |_, _| n += 1)?;
        }
        if n != self.events {
            return damaged(0, format!("{n} events, the footer says {}", self.events));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(seq: u64) -> Vec<u8> {
        format!("event {seq} of charge-{:064x} by worker-7", seq * 7919).into_bytes()
    }

    fn events(from: u64, to: u64) -> Vec<(u64, Vec<u8>)> {
        (from..=to).map(|s| (s, event(s))).collect()
    }

    fn write_events(dir: &Path, id: u64, ev: &[(u64, Vec<u8>)]) -> Written {
        write(dir, id, ev.iter().map(|(s, b)| (*s, &b[..]))).unwrap()
    }

    #[test]
    fn an_audit_file_reads_back_from_any_sequence_number() {
        let dir = tempfile::tempdir().unwrap();
        let ev = events(100, 5099);
        let w = write_events(dir.path(), 4, &ev);
        assert_eq!((w.first, w.last, w.events), (100, 5099, 5000));
        // Compressed: the events repeat themselves.
        let plain: usize = ev.iter().map(|e| e.1.len() + 12).sum();
        assert!((w.bytes as usize) < plain / 2, "{} of {plain}", w.bytes);
        let f = AuditFile::open(dir.path(), 4, Some(w.bytes)).unwrap();
        assert!(f.chunks.len() > 2, "{} chunks", f.chunks.len());
        f.verify().unwrap();
        for from in [0, 100, 101, 2000, 5099, 5100] {
            let mut out = Vec::new();
            f.read(from, usize::MAX, &mut out).unwrap();
            let want: Vec<_> = ev.iter().filter(|e| e.0 >= from).cloned().collect();
            assert_eq!(out, want, "from {from}");
        }
        let mut out = vec![(1, b"before".to_vec())];
        f.read(3000, 11, &mut out).unwrap();
        assert_eq!(out.len(), 11);
        assert_eq!(out[1].0, 3000);
        assert_eq!(out[10].0, 3009);
    }

    #[test]
    fn out_of_order_or_no_events_are_refused_and_leave_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let bad = [(5u64, &b"a"[..]), (5, &b"b"[..])];
        assert!(write(dir.path(), 1, bad).is_err());
        assert!(!path(dir.path(), 1).exists());
        assert!(write(dir.path(), 2, std::iter::empty::<(u64, &[u8])>()).is_err());
        assert!(!path(dir.path(), 2).exists());
    }

    #[test]
    fn a_file_of_every_sequence_number_from_zero_to_the_last_opens() {
        // Found by the `tables` fuzz target
        // (fuzz/regressions/tables/audit-from-seq-0-to-u64-max): the
        // footer check counted the sequence numbers a file spans as
        // `last - first + 1`, which overflows for 0..=u64::MAX (a panic
        // with overflow checks, else 0, and the valid file refused).
        let dir = tempfile::tempdir().unwrap();
        let ev = vec![(0, b"first".to_vec()), (u64::MAX, b"last".to_vec())];
        let w = write_events(dir.path(), 5, &ev);
        let f = AuditFile::open(dir.path(), 5, Some(w.bytes)).unwrap();
        assert_eq!((f.first, f.last, f.events), (0, u64::MAX, 2));
        f.verify().unwrap();
        let mut out = Vec::new();
        f.read(0, usize::MAX, &mut out).unwrap();
        assert_eq!(out, ev);
    }

    #[test]
    fn every_flipped_byte_and_every_cut_is_damage_never_a_wrong_answer() {
        let dir = tempfile::tempdir().unwrap();
        // Two chunks, so that damage in one leaves the other readable.
        let ev: Vec<(u64, Vec<u8>)> = (1..=40)
            .map(|s| (s, vec![(s * 37 % 251) as u8; 4000]))
            .collect();
        let w = write_events(dir.path(), 9, &ev);
        let good = fs::read(path(dir.path(), 9)).unwrap();
        let check = |bytes: &[u8], what: &str| {
            fs::write(path(dir.path(), 9), bytes).unwrap();
            let f = match AuditFile::open(dir.path(), 9, None) {
                Ok(f) => f,
                Err(ReadError::Damaged(_)) => return,
                Err(e) => panic!("{what}: {e}"),
            };
            let mut out = Vec::new();
            let scrubbed = f.verify();
            match f.read(0, usize::MAX, &mut out) {
                Ok(()) => {
                    assert_eq!(out, ev, "{what}");
                    assert!(scrubbed.is_ok(), "{what}: the scrub refused a good read");
                }
                Err(ReadError::Damaged(_)) => {
                    // What was read before the damage is right.
                    assert_eq!(out[..], ev[..out.len()], "{what}");
                    assert!(
                        matches!(scrubbed, Err(ReadError::Damaged(_))),
                        "{what}: the scrub missed damage a read finds"
                    );
                }
                Err(e) => panic!("{what}: {e}"),
            }
        };
        for at in 0..good.len() {
            let mut bad = good.clone();
            bad[at] ^= 0x04;
            check(&bad, &format!("byte {at} of {} flipped", good.len()));
        }
        for cut in 0..good.len() {
            check(&good[..cut], &format!("cut at {cut}"));
        }
        fs::write(path(dir.path(), 9), &good).unwrap();
        assert!(matches!(
            AuditFile::open(dir.path(), 9, Some(w.bytes - 1)),
            Err(ReadError::Damaged(_))
        ));
    }
}
