//! The write-ahead log of the sled journal: its on-disk format, how a
//! segment is read back (and what damage is allowed to be dropped), and the
//! segment files.
//!
//! Every change is appended to the log as part of a *unit*: all the entries
//! of one journal write (a record, its escalation-index entry, its audit
//! events) under one checksum, so that a unit is replayed entirely or not at
//! all. A durability barrier is one `write` of every pending unit plus one
//! `fdatasync` (see `store.rs`).
//!
//! Segment `idem-wal.<16 hex digits>`: a 20-byte header (`IDEMWAL2`, the
//! generation as u64 LE, crc32 of those 16 bytes as u32 LE), then units
//! `[body length: u32 LE][crc32(body): u32 LE][body]`, body =
//! `[lsn: u64][digest delta: u64][count delta: i64][entries: u32][entries]`,
//! all little-endian; in the newest segment, zero bytes after the last unit
//! (the segment is extended ahead of its units, so that an fdatasync writes
//! data only: see `write_and_sync`). An entry is `[op: u8]` then
//! - put: `[tree: u8][key len: u32][key][value len: u32][value]`
//! - remove: `[tree: u8][key len: u32][key]`
//! - event: `[seq: u64][len: u32][bytes]`
//! - truncate the audit stream: `[before: u64]`.
//!
//! # Damage
//! A barrier acknowledges only after everything before it is on disk, so
//! the one thing a crash may legitimately leave is a torn *tail* of the
//! newest segment: a unit cut short, or a half-written one whose checksum
//! fails, with no valid unit after it. That tail was never acknowledged and
//! is dropped. Anything else — a bad checksum with valid units after it, a
//! bad header, a damaged or short older segment, a gap between generations
//! — is damage: reading fails with the file and offset, and nothing is
//! deleted.

use std::fs::{self, File};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use idem_journal::files::options as private_file;
pub(super) use idem_journal::files::sync_dir;
use idem_journal::record::crc32;

const MAGIC: &[u8; 8] = b"IDEMWAL2";
/// Bytes of a segment header.
pub(super) const HEADER_LEN: usize = 20;
const PREFIX: &str = "idem-wal.";
/// Bytes of a unit's body before its entries.
const BODY_HEAD: usize = 28;

const OP_PUT: u8 = 1;
const OP_REMOVE: u8 = 2;
const OP_EVENT: u8 = 3;
const OP_TRUNCATE: u8 = 4;

/// The sled trees a log entry can address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Tree {
    Ops = 0,
    Steps = 1,
    Escalations = 2,
}

impl Tree {
    pub(super) const ALL: [Tree; 3] = [Tree::Ops, Tree::Steps, Tree::Escalations];

    fn from_u8(b: u8) -> Option<Tree> {
        Tree::ALL.into_iter().find(|t| *t as u8 == b)
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Tree::Ops => "ops",
            Tree::Steps => "steps",
            Tree::Escalations => "escalations",
        }
    }
}

/// One change, borrowed (for encoding) or owned (after decoding).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Change<B> {
    Put { tree: Tree, key: B, value: B },
    Remove { tree: Tree, key: B },
    Event { seq: u64, bytes: B },
    Truncate { before: u64 },
}

/// A unit read back from a segment: its byte strings owned (`Vec<u8>`) or
/// borrowed from the segment's bytes (`&[u8]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Unit<B = Vec<u8>> {
    pub lsn: u64,
    /// XOR of the content hashes this unit adds and removes (see
    /// `digest.rs`).
    pub xor: u64,
    /// Entries this unit adds (negative: removes).
    pub count: i64,
    pub changes: Vec<Change<B>>,
}

/// A borrowed view of an owned change (for re-encoding what was read).
pub(super) fn borrow(c: &Change<Vec<u8>>) -> Change<&[u8]> {
    match c {
        Change::Put { tree, key, value } => Change::Put {
            tree: *tree,
            key: key.as_slice(),
            value: value.as_slice(),
        },
        Change::Remove { tree, key } => Change::Remove {
            tree: *tree,
            key: key.as_slice(),
        },
        Change::Event { seq, bytes } => Change::Event {
            seq: *seq,
            bytes: bytes.as_slice(),
        },
        Change::Truncate { before } => Change::Truncate { before: *before },
    }
}

/// Appends one unit to `out`.
pub(super) fn encode_unit(
    out: &mut Vec<u8>,
    lsn: u64,
    xor: u64,
    count: i64,
    changes: &[Change<&[u8]>],
) {
    encode_unit_from(out, lsn, xor, count, changes.iter().cloned());
}

/// Appends one unit of the changes `changes` yields to `out`: what
/// [`encode_unit`] writes, for callers that have no list of them (a write
/// and an append on the hot path build none).
pub(super) fn encode_unit_from<'a>(
    out: &mut Vec<u8>,
    lsn: u64,
    xor: u64,
    count: i64,
    changes: impl IntoIterator<Item = Change<&'a [u8]>>,
) {
    let start = out.len();
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(&lsn.to_le_bytes());
    out.extend_from_slice(&xor.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    // The number of changes, filled in once they are written.
    let n_at = out.len();
    out.extend_from_slice(&0u32.to_le_bytes());
    let bytes = |out: &mut Vec<u8>, b: &[u8]| {
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        out.extend_from_slice(b);
    };
    let mut n = 0u32;
    for change in changes {
        n += 1;
        match change {
            Change::Put { tree, key, value } => {
                out.extend_from_slice(&[OP_PUT, tree as u8]);
                bytes(out, key);
                bytes(out, value);
            }
            Change::Remove { tree, key } => {
                out.extend_from_slice(&[OP_REMOVE, tree as u8]);
                bytes(out, key);
            }
            Change::Event { seq, bytes: b } => {
                out.push(OP_EVENT);
                out.extend_from_slice(&seq.to_le_bytes());
                bytes(out, b);
            }
            Change::Truncate { before } => {
                out.push(OP_TRUNCATE);
                out.extend_from_slice(&before.to_le_bytes());
            }
        }
    }
    out[n_at..n_at + 4].copy_from_slice(&n.to_le_bytes());
    let body_len = (out.len() - start - 8) as u32;
    let crc = crc32(&out[start + 8..]);
    out[start..start + 4].copy_from_slice(&body_len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// A segment's header for generation `gen`.
pub(super) fn header(gen: u64) -> [u8; HEADER_LEN] {
    header_with(MAGIC, gen)
}

/// A header of the segment's layout with another file's magic (the
/// image's).
pub(super) fn header_with(magic: &[u8; 8], gen: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(magic);
    h[8..16].copy_from_slice(&gen.to_le_bytes());
    let crc = crc32(&h[..16]);
    h[16..].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Why a segment cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Damage {
    pub offset: usize,
    pub detail: String,
}

/// What reading a segment found.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Segment<B = Vec<u8>> {
    pub units: Vec<Unit<B>>,
    /// Where the valid units end.
    pub valid_len: usize,
    /// A torn tail was dropped (newest segment only): its length. Zeros
    /// after the last unit are not a torn tail: the valid units end where
    /// they begin.
    pub torn: usize,
}

// Not derived: that would ask `B: Default`.
impl<B> Default for Segment<B> {
    fn default() -> Self {
        Segment {
            units: Vec::new(),
            valid_len: 0,
            torn: 0,
        }
    }
}

/// A cursor over a unit body.
struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = (self.b.get(..n)?, self.b.get(n..)?);
        self.b = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap_or_default()))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
}

/// Decodes a unit body whose checksum matched.
pub(super) fn decode_body(body: &[u8]) -> Option<Unit> {
    decode_body_as(body, <[u8]>::to_vec)
}

/// [`decode_body`], each byte string made a `B` by `own`.
fn decode_body_as<'a, B>(body: &'a [u8], own: fn(&'a [u8]) -> B) -> Option<Unit<B>> {
    let mut r = Reader { b: body };
    let lsn = r.u64()?;
    let xor = r.u64()?;
    let count = r.u64()? as i64;
    let n = r.u32()? as usize;
    // Each entry takes at least 9 bytes: a count beyond that is garbage,
    // and must not size an allocation.
    if n > body.len() / 9 + 1 {
        return None;
    }
    let mut changes = Vec::with_capacity(n);
    for _ in 0..n {
        let change = match r.u8()? {
            OP_PUT => Change::Put {
                tree: Tree::from_u8(r.u8()?)?,
                key: own(r.bytes()?),
                value: own(r.bytes()?),
            },
            OP_REMOVE => Change::Remove {
                tree: Tree::from_u8(r.u8()?)?,
                key: own(r.bytes()?),
            },
            OP_EVENT => Change::Event {
                seq: r.u64()?,
                bytes: own(r.bytes()?),
            },
            OP_TRUNCATE => Change::Truncate { before: r.u64()? },
            _ => return None,
        };
        changes.push(change);
    }
    if !r.b.is_empty() {
        return None;
    }
    Some(Unit {
        lsn,
        xor,
        count,
        changes,
    })
}

/// The smallest unit on disk: its frame head and a body without entries.
const MIN_UNIT: usize = 8 + BODY_HEAD;

/// The unit starting at `at`, if a whole valid one does with an lsn in
/// `lsns`, with its length. The cheap checks (length, lsn) come before the
/// checksum, so probing an offset that holds no unit costs almost nothing.
fn unit_at<'a, B>(
    bytes: &'a [u8],
    at: usize,
    lsns: std::ops::RangeInclusive<u64>,
    own: fn(&'a [u8]) -> B,
) -> Option<(Unit<B>, usize)> {
    let head = bytes.get(at..at + 8)?;
    let len = u32::from_le_bytes(head[..4].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(head[4..].try_into().ok()?);
    if len < BODY_HEAD {
        return None;
    }
    let body = bytes.get(at + 8..at.checked_add(8)?.checked_add(len)?)?;
    let lsn = u64::from_le_bytes(body[..8].try_into().ok()?);
    if !lsns.contains(&lsn) {
        return None;
    }
    if crc32(body) != crc {
        return None;
    }
    decode_body_as(body, own).map(|u| (u, 8 + len))
}

/// Reads segment `gen` (its bytes), applying the damage rules: `newest`
/// says whether a torn tail may be dropped; `first_lsn` is the lsn its
/// first unit must have. Units are numbered consecutively (across segments
/// too), so every unit's lsn is known before it is read: a valid unit out
/// of sequence is damage as well.
pub(super) fn read_segment(
    bytes: &[u8],
    gen: u64,
    newest: bool,
    first_lsn: u64,
) -> Result<Segment, Damage> {
    read_segment_as(bytes, gen, newest, first_lsn, <[u8]>::to_vec)
}

/// [`read_segment`], the units borrowing their byte strings from `bytes`:
/// for a reader that keeps little of what it reads (a checkpoint's fold),
/// and need not allocate for each key, value and event.
pub(super) fn read_segment_borrowed(
    bytes: &[u8],
    gen: u64,
    newest: bool,
    first_lsn: u64,
) -> Result<Segment<&[u8]>, Damage> {
    read_segment_as(bytes, gen, newest, first_lsn, |b| b)
}

fn read_segment_as<'a, B>(
    bytes: &'a [u8],
    gen: u64,
    newest: bool,
    first_lsn: u64,
    own: fn(&'a [u8]) -> B,
) -> Result<Segment<B>, Damage> {
    let expected = header(gen);
    if bytes.len() < HEADER_LEN {
        // A segment whose creation was cut short: only the newest may be,
        // and only if what is there is the start of its header.
        if newest && expected.starts_with(bytes) {
            return Ok(Segment {
                torn: bytes.len(),
                ..Segment::default()
            });
        }
        return Err(Damage {
            offset: 0,
            detail: format!("{} bytes is shorter than a segment header", bytes.len()),
        });
    }
    if bytes[..HEADER_LEN] != expected {
        return Err(Damage {
            offset: 0,
            detail: "bad segment header (not a log segment of this generation)".into(),
        });
    }
    let mut seg = Segment::default();
    let mut at = HEADER_LEN;
    let mut next_lsn = first_lsn;
    while at < bytes.len() {
        if let Some((unit, len)) = unit_at(bytes, at, next_lsn..=next_lsn, own) {
            next_lsn = unit.lsn + 1;
            seg.units.push(unit);
            at += len;
            continue;
        }
        // Zeros to the end: the segment's preparation (`write_and_sync`),
        // never written over, in the newest segment only (a rotation trims
        // them, and so does an open).
        if newest && bytes[at..].iter().all(|&b| b == 0) {
            break;
        }
        // Not the next unit here. If a later valid unit follows, this is
        // damage in the middle of the log; if none does, it is a torn tail.
        // A unit at offset `o` would follow at most (o - at) / MIN_UNIT
        // lost ones, which bounds its lsn: every other offset is refused
        // before any checksum, so the search is linear in the tail.
        let valid_after = (at + 1..bytes.len()).find(|&o| {
            let skipped = ((o - at) / MIN_UNIT) as u64;
            unit_at(bytes, o, next_lsn..=next_lsn + skipped + 1, |b| b).is_some()
        });
        if let Some(later) = valid_after {
            return Err(Damage {
                offset: at,
                detail: format!("unreadable unit, with a valid unit after it at offset {later}"),
            });
        }
        if !newest {
            return Err(Damage {
                offset: at,
                detail: "unreadable unit at the end of a segment that is not the newest".into(),
            });
        }
        seg.torn = bytes.len() - at;
        break;
    }
    seg.valid_len = at;
    Ok(seg)
}

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

pub(super) fn segment_path(dir: &Path, gen: u64) -> PathBuf {
    dir.join(format!("{PREFIX}{gen:016x}"))
}

/// The segments of `dir`, in generation order.
pub(super) fn segments(dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
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

/// Creates segment `gen` with its header, durably (file and directory
/// entry), before anything is logged to it.
pub(super) fn create_segment(dir: &Path, gen: u64) -> io::Result<File> {
    // Not in append mode: units are written at their offset, inside the
    // zeros the segment is extended by (see `write_and_sync`).
    let mut file = private_file()
        .create_new(true)
        .write(true)
        .open(segment_path(dir, gen))?;
    file.write_all(&header(gen))?;
    file.sync_all()?;
    sync_dir(dir)?;
    Ok(file)
}

/// Removes every segment up to `gen`, durably.
pub(super) fn remove_up_to(dir: &Path, gen: u64) -> io::Result<()> {
    let mut removed = false;
    for (g, path) in segments(dir)? {
        if g <= gen {
            fs::remove_file(path)?;
            removed = true;
        }
    }
    if removed {
        sync_dir(dir)?;
    }
    Ok(())
}

/// Zero bytes a segment is extended by ahead of its units.
pub(super) const PREPARE: u64 = 1 << 20;

/// Writes `buf` at `offset` of a segment `prepared` bytes long and makes it
/// durable; returns the segment's length after.
///
/// An fdatasync of an append must also write the inode (the file's size
/// changed), a second device write after the data's: on ext4 about half as
/// long again as one of data alone. So a segment is extended with real zero
/// bytes, [`PREPARE`] at a time, in the same write as the units that reach
/// its end (one fdatasync covers both), and every other round writes inside
/// the file: data only. The zeros after the last unit read as the end of
/// the log (see [`read_segment`]); a rotation trims them ([`trim_segment`]).
pub(super) fn write_and_sync(
    file: &File,
    buf: &[u8],
    offset: u64,
    prepared: u64,
) -> io::Result<u64> {
    use std::os::unix::fs::FileExt as _;
    static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
    file.write_all_at(buf, offset)?;
    let end = offset + buf.len() as u64;
    let mut len = prepared.max(end);
    if end > prepared {
        let target = end + PREPARE;
        while len < target {
            let n = (target - len).min(ZEROS.len() as u64) as usize;
            // Preparing only saves time: on a disk too full for the zeros,
            // the units go on as appends until they no longer fit either.
            if file.write_all_at(&ZEROS[..n], len).is_err() {
                break;
            }
            len += n as u64;
        }
    }
    file.sync_data()?;
    Ok(len)
}

/// Cuts a segment's zeros after its last unit (at `end`), durably: a
/// segment that is not the newest ends at its last unit.
pub(super) fn trim_segment(file: &File, end: u64) -> io::Result<()> {
    file.set_len(end)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(lsn: u64, key: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_unit(
            &mut out,
            lsn,
            lsn * 7,
            1,
            &[
                Change::Put {
                    tree: Tree::Ops,
                    key,
                    value: b"value",
                },
                Change::Event {
                    seq: lsn,
                    bytes: b"event",
                },
            ],
        );
        out
    }

    fn segment(gen: u64, lsns: &[u64]) -> (Vec<u8>, Vec<usize>) {
        let mut bytes = header(gen).to_vec();
        let mut starts = Vec::new();
        for &l in lsns {
            starts.push(bytes.len());
            bytes.extend(unit(l, format!("k{l}").as_bytes()));
        }
        (bytes, starts)
    }

    #[test]
    fn units_round_trip() {
        let mut out = Vec::new();
        let changes: Vec<Change<&[u8]>> = vec![
            Change::Put {
                tree: Tree::Steps,
                key: b"k",
                value: b"",
            },
            Change::Remove {
                tree: Tree::Escalations,
                key: b"k2",
            },
            Change::Event {
                seq: 9,
                bytes: b"e",
            },
            Change::Truncate { before: 4 },
        ];
        encode_unit(&mut out, 3, 0xabc, -2, &changes);
        let (borrowed, _) = unit_at(&out, 0, 3..=3, |b| b).expect("valid unit");
        assert_eq!(borrowed.changes, changes, "borrowed from the bytes read");
        let (unit, len) = unit_at(&out, 0, 3..=3, <[u8]>::to_vec).expect("valid unit");
        assert_eq!(len, out.len());
        assert_eq!((unit.lsn, unit.xor, unit.count), (3, 0xabc, -2));
        let owned: Vec<Change<Vec<u8>>> = vec![
            Change::Put {
                tree: Tree::Steps,
                key: b"k".to_vec(),
                value: vec![],
            },
            Change::Remove {
                tree: Tree::Escalations,
                key: b"k2".to_vec(),
            },
            Change::Event {
                seq: 9,
                bytes: b"e".to_vec(),
            },
            Change::Truncate { before: 4 },
        ];
        assert_eq!(unit.changes, owned);
    }

    #[test]
    fn every_cut_of_the_newest_segment_keeps_the_whole_units_before_it() {
        let (bytes, starts) = segment(5, &[1, 2, 3]);
        for cut in 0..=bytes.len() {
            let seg = read_segment(&bytes[..cut], 5, true, 1).expect("a cut is a torn tail");
            let whole = starts
                .iter()
                .skip(1)
                .chain(std::iter::once(&bytes.len()))
                .filter(|&&end| end <= cut)
                .count();
            assert_eq!(seg.units.len(), whole, "cut at {cut}");
        }
    }

    #[test]
    fn a_cut_of_an_older_segment_is_damage() {
        let (bytes, starts) = segment(5, &[1, 2]);
        let cut = starts[1] + 3;
        let err = read_segment(&bytes[..cut], 5, false, 1).unwrap_err();
        assert_eq!(err.offset, starts[1]);
        // A whole older segment is fine.
        assert_eq!(read_segment(&bytes, 5, false, 1).unwrap().units.len(), 2);
    }

    #[test]
    fn a_flipped_byte_before_a_valid_unit_is_damage_not_a_tail() {
        let (bytes, starts) = segment(1, &[1, 2, 3]);
        for i in starts[0]..starts[2] {
            let mut b = bytes.clone();
            b[i] ^= 0x10;
            let err =
                read_segment(&b, 1, true, 1).expect_err(&format!("flip at {i} must be damage"));
            assert!(
                err.offset == starts[0] || err.offset == starts[1],
                "{err:?}"
            );
            assert!(err.detail.contains("valid unit after"), "{err:?}");
        }
        // In the last unit, nothing valid follows: a torn tail.
        for i in starts[2]..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x10;
            let seg = read_segment(&b, 1, true, 1).expect("torn tail");
            assert_eq!(seg.units.len(), 2, "flip at {i}");
            assert_eq!(seg.valid_len, starts[2]);
        }
    }

    #[test]
    fn bad_headers_are_damage_but_a_torn_creation_is_not() {
        let (bytes, _) = segment(2, &[1]);
        assert!(
            read_segment(&bytes, 3, true, 1).is_err(),
            "wrong generation"
        );
        let mut b = bytes.clone();
        b[3] ^= 1;
        assert_eq!(read_segment(&b, 2, true, 1).unwrap_err().offset, 0);
        for cut in 0..HEADER_LEN {
            assert_eq!(
                read_segment(&bytes[..cut], 2, true, 1).unwrap().units.len(),
                0
            );
            assert!(read_segment(&bytes[..cut], 2, false, 1).is_err());
        }
        assert!(
            read_segment(b"IDEMWAX", 2, true, 1).is_err(),
            "not a prefix"
        );
    }

    #[test]
    fn zeros_after_the_last_unit_end_the_newest_segment_only() {
        let (mut bytes, _) = segment(1, &[1, 2]);
        let end = bytes.len();
        bytes.extend([0u8; 300]);
        let seg = read_segment(&bytes, 1, true, 1).unwrap();
        assert_eq!((seg.units.len(), seg.valid_len, seg.torn), (2, end, 0));
        // An older segment was trimmed when the next one began.
        assert_eq!(read_segment(&bytes, 1, false, 1).unwrap_err().offset, end);
        // A unit cut short before the zeros is a torn tail.
        let (cut, _) = segment(1, &[1, 2, 3]);
        let mut bytes = cut[..cut.len() - 3].to_vec();
        bytes.extend([0u8; 300]);
        let seg = read_segment(&bytes, 1, true, 1).unwrap();
        assert_eq!((seg.units.len(), seg.valid_len), (2, end));
        assert_eq!(seg.torn, bytes.len() - end);
    }

    #[test]
    fn a_prepared_segment_is_written_in_place() {
        let dir = tempfile::TempDir::new().unwrap();
        let file = create_segment(dir.path(), 1).unwrap();
        let (bytes, _) = segment(1, &[1, 2]);
        let units = &bytes[HEADER_LEN..];
        let mut at = HEADER_LEN as u64;
        let mut len = at;
        // Past the end: extended by PREPARE zeros in the same write.
        len = write_and_sync(&file, &units[..40], at, len).unwrap();
        at += 40;
        assert_eq!(len, at + PREPARE);
        // Inside: the length stays.
        assert_eq!(write_and_sync(&file, &units[40..], at, len).unwrap(), len);
        let on_disk = fs::read(segment_path(dir.path(), 1)).unwrap();
        assert_eq!(on_disk.len() as u64, len);
        let seg = read_segment(&on_disk, 1, true, 1).unwrap();
        assert_eq!(
            (seg.units.len(), seg.valid_len, seg.torn),
            (2, bytes.len(), 0)
        );
        trim_segment(&file, bytes.len() as u64).unwrap();
        let on_disk = fs::read(segment_path(dir.path(), 1)).unwrap();
        assert_eq!(on_disk, bytes);
        assert_eq!(read_segment(&on_disk, 1, false, 1).unwrap().units.len(), 2);
    }

    #[test]
    fn lsns_are_consecutive() {
        let (bytes, _) = segment(1, &[4, 5, 6]);
        assert_eq!(read_segment(&bytes, 1, true, 4).unwrap().units.len(), 3);
        // Expecting another first lsn: the first unit is out of sequence,
        // and so, by their lsns, are the valid units after it.
        assert!(read_segment(&bytes, 1, true, 9).unwrap().units.is_empty());
        assert!(
            read_segment(&bytes, 1, true, 3).is_err(),
            "unit 4 after a lost 3"
        );
        // A repeated lsn is not the next unit.
        let (bytes, _) = segment(1, &[4, 4]);
        assert_eq!(read_segment(&bytes, 1, true, 4).unwrap().units.len(), 1);
    }

    #[test]
    fn a_large_torn_tail_is_read_in_linear_time() {
        // 4 MiB of random bytes after one unit: each offset is refused by
        // its length or lsn before any checksum (this took minutes when the
        // rest of the file was checksummed at every offset).
        let (mut bytes, _) = segment(1, &[1]);
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        bytes.extend((0..4 << 20).map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        }));
        let started = std::time::Instant::now();
        let seg = read_segment(&bytes, 1, true, 1).unwrap();
        assert_eq!((seg.units.len(), seg.torn), (1, 4 << 20));
        // A generous bound for a debug build on a loaded machine; the
        // quadratic search needed hundreds of seconds.
        assert!(started.elapsed() < std::time::Duration::from_secs(30));
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let (good, _) = segment(1, &[1, 2, 3]);
        for _ in 0..2000 {
            let mut b = good.clone();
            for _ in 0..(next() % 8) {
                let i = (next() as usize) % b.len();
                b[i] = next() as u8;
            }
            b.truncate((next() as usize) % (b.len() + 1));
            let _ = read_segment(&b, 1, next() % 2 == 0, 1);
        }
    }
}
