//! The fuzz targets that need the sled journal's private formats (the
//! write-ahead log, audit buckets, record headers, its own files). See
//! `crate::fuzzing` for how targets are written and run.

use std::sync::Arc;

use super::frames::Outcome;
use crate::deflate::Deflater;
use crate::events;
use crate::image;
use crate::stored::{self, Header};
use crate::wal::{self, Change, Segment, Tree, Unit, HEADER_LEN};
use idem_journal::journal::Owner;
use idem_journal::record::{self, Kind};

/// Flag of [`wal()`]'s first byte: read the segment as the newest one.
pub(crate) const NEWEST: u8 = 1;
/// Flag of [`wal()`]'s first byte: the rest is chunks the harness frames.
pub(crate) const CHUNKS: u8 = 2;
/// Flag of [`wal()`]'s first byte (raw mode): put a valid header first.
pub(crate) const HEADER: u8 = 4;
/// Flag of [`wal()`]'s first byte: the rest is chunks of an image's units.
pub(crate) const IMAGE: u8 = 8;

/// The write-ahead-log reader (`wal::read_segment`) on arbitrary bytes.
///
/// Input: `[flags][generation][first lsn][garbage length][rest]`; flag
/// `NEWEST` (1) reads the segment as the newest one. The last `garbage
/// length` bytes of `rest` are *garbage* for the torn-tail checks, the
/// others make the segment. In raw mode the segment is those bytes (after a
/// valid header with flag `HEADER`, 4). With flag `CHUNKS` (2) it is a
/// valid header and then chunks `[tag][length: u16 LE][bytes]`: with an even tag
/// the harness frames the bytes as a unit body with the right length and
/// checksum (and with `tag & 2` first sets its lsn to follow the previous
/// chunk's), with an odd tag it writes the bytes as they are.
///
/// Properties, besides never panicking:
/// - a segment that reads is cut into its valid prefix and its torn tail
///   (`valid_len + torn` is its length; no tail unless newest), its units
///   are numbered consecutively from `first lsn`, and the header plus the units,
///   encoded again with `encode_unit`, are exactly the valid prefix;
/// - the valid prefix alone reads to the same units, as newest or not;
/// - zeros or `0xff` appended to the valid prefix are a torn tail: the same
///   units; anything appended never changes or drops a unit of the prefix,
///   nor is damage reported inside it;
/// - a cut inside the valid prefix keeps exactly the units that end before
///   it, or (when a valid unit appears inside the cut one) is damage at the
///   cut unit.
///
/// With flag `IMAGE` (8) the chunks are an image's units instead (after
/// the header, `image::read_units`): with an even tag the harness
/// compresses the bytes as a unit body and frames them (lsn set to follow
/// the previous chunk's with `tag & 2`). Properties: no panic; units that
/// read are numbered from 1, and framed again they read back the same.
pub fn wal(data: &[u8]) -> Outcome {
    let Some((&[flags, gen, first_lsn, garbage_len], rest)) = data.split_first_chunk::<4>() else {
        return Outcome::Rejected;
    };
    if flags & IMAGE != 0 {
        return image_units(rest);
    }
    let (gen, first_lsn) = (u64::from(gen), u64::from(first_lsn));
    let newest = flags & NEWEST != 0;
    let (body, garbage) = rest.split_at(rest.len() - usize::from(garbage_len).min(rest.len()));
    let bytes = if flags & CHUNKS != 0 {
        chunked_segment(gen, first_lsn, body)
    } else if flags & HEADER != 0 {
        [&wal::header(gen)[..], body].concat()
    } else {
        body.to_vec()
    };
    let Ok(seg) = wal::read_segment(&bytes, gen, newest, first_lsn) else {
        return Outcome::Rejected;
    };
    // The valid units, then a torn tail or (newest segment only) the zeros
    // it was prepared with.
    let rest = bytes
        .len()
        .checked_sub(seg.valid_len + seg.torn)
        .expect("prefix + tail longer than the segment");
    assert!(
        rest == 0 || (newest && seg.torn == 0 && bytes[seg.valid_len..].iter().all(|&b| b == 0)),
        "prefix + tail != segment, and what is left is not the newest segment's zeros"
    );
    assert!(
        newest || seg.torn == 0,
        "a torn tail dropped from an older segment"
    );
    let ends = reencoded_ends(&bytes, gen, first_lsn, &seg);
    if seg.valid_len < HEADER_LEN {
        // Only a segment whose creation was cut short has no header.
        assert!(newest && seg.valid_len == 0 && seg.units.is_empty() && bytes.len() < HEADER_LEN);
        return Outcome::Decoded;
    }
    let prefix = &bytes[..seg.valid_len];
    for as_newest in [true, false] {
        let again = wal::read_segment(prefix, gen, as_newest, first_lsn).unwrap_or_else(|d| {
            panic!("the valid prefix is damaged at {}: {}", d.offset, d.detail)
        });
        assert_eq!(again.units, seg.units, "the valid prefix reads differently");
        assert_eq!((again.valid_len, again.torn), (prefix.len(), 0));
    }
    let fill = 1 + usize::from(garbage_len);
    for byte in [0u8, 0xff] {
        let longer = [prefix, &vec![byte; fill]].concat();
        let again = wal::read_segment(&longer, gen, true, first_lsn)
            .unwrap_or_else(|d| panic!("{byte:#x} fill is damage at {}: {}", d.offset, d.detail));
        assert_eq!(again.units, seg.units, "{byte:#x} fill changed the units");
        // Zeros are where a segment was prepared, not a torn tail.
        let torn = if byte == 0 { 0 } else { fill };
        assert_eq!((again.valid_len, again.torn), (prefix.len(), torn));
        if byte == 0 {
            assert!(
                wal::read_segment(&longer, gen, false, first_lsn).is_err(),
                "zeros after an older segment's last unit must be damage"
            );
        }
    }
    let longer = [prefix, garbage].concat();
    match wal::read_segment(&longer, gen, true, first_lsn) {
        Ok(again) => assert!(
            again.units.starts_with(&seg.units),
            "appended bytes changed the units of the valid prefix"
        ),
        Err(d) => assert!(
            d.offset >= prefix.len(),
            "appended bytes made damage at {} inside the valid prefix of {} bytes",
            d.offset,
            prefix.len()
        ),
    }
    for cut in cuts(data, prefix.len()) {
        let whole = ends.iter().filter(|&&end| end <= cut).count();
        match wal::read_segment(&prefix[..cut], gen, true, first_lsn) {
            Ok(s) => assert_eq!(s.units, seg.units[..whole], "cut at {cut}"),
            Err(d) => {
                let start = if whole == 0 {
                    HEADER_LEN
                } else {
                    ends[whole - 1]
                };
                assert!(
                    cut >= HEADER_LEN && d.offset == start,
                    "cut at {cut}: damage at {} ({}), the cut unit starts at {start}",
                    d.offset,
                    d.detail
                );
            }
        }
    }
    Outcome::Decoded
}

/// Checks that the header and the units, encoded again, are the valid
/// prefix; returns where each unit ends.
fn reencoded_ends(bytes: &[u8], gen: u64, first_lsn: u64, seg: &Segment) -> Vec<usize> {
    let mut out = Vec::new();
    let mut ends = Vec::new();
    if !seg.units.is_empty() || seg.valid_len >= HEADER_LEN {
        out.extend_from_slice(&wal::header(gen));
    }
    let mut next_lsn = first_lsn;
    for unit in &seg.units {
        assert!(
            unit.lsn == next_lsn,
            "lsn {} where {next_lsn} was due",
            unit.lsn
        );
        next_lsn = unit.lsn + 1;
        encode(&mut out, unit);
        ends.push(out.len());
    }
    assert!(
        out == bytes[..seg.valid_len],
        "the units re-encode to {} bytes, not the {}-byte valid prefix",
        out.len(),
        seg.valid_len
    );
    ends
}

fn encode(out: &mut Vec<u8>, unit: &Unit) {
    let changes: Vec<Change<&[u8]>> = unit
        .changes
        .iter()
        .map(|c| match c {
            Change::Put { tree, key, value } => Change::Put {
                tree: *tree,
                key: &key[..],
                value: &value[..],
            },
            Change::Remove { tree, key } => Change::Remove {
                tree: *tree,
                key: &key[..],
            },
            Change::Event { seq, bytes } => Change::Event {
                seq: *seq,
                bytes: &bytes[..],
            },
            Change::Truncate { before } => Change::Truncate { before: *before },
        })
        .collect();
    wal::encode_unit(out, unit.lsn, unit.xor, unit.count, &changes);
}

/// A few cut points in `0..len`, derived from the input.
fn cuts(data: &[u8], len: usize) -> Vec<usize> {
    let mut h = record::crc32(data) as usize;
    (0..3)
        .map(|_| {
            h = h.wrapping_mul(0x9e37_79b9).wrapping_add(12345);
            h % len.max(1)
        })
        .collect()
}

/// A valid header, then the chunks of `body` (see [`wal()`]).
fn chunked_segment(gen: u64, first_lsn: u64, mut body: &[u8]) -> Vec<u8> {
    let mut out = wal::header(gen).to_vec();
    let mut lsn = first_lsn;
    while let Some((&[tag, lo, hi], rest)) = body.split_first_chunk::<3>() {
        let n = usize::from(u16::from_le_bytes([lo, hi])).min(rest.len());
        let (chunk, rest) = rest.split_at(n);
        body = rest;
        if tag & 1 == 1 {
            out.extend_from_slice(chunk);
            continue;
        }
        let mut chunk = chunk.to_vec();
        if tag & 2 != 0 && chunk.len() >= 8 {
            chunk[..8].copy_from_slice(&lsn.to_le_bytes());
        }
        if let Some(l) = chunk.get(..8) {
            lsn = u64::from_le_bytes(l.try_into().unwrap_or_default()).wrapping_add(1);
        }
        out.extend_from_slice(&(chunk.len() as u32).to_le_bytes());
        out.extend_from_slice(&record::crc32(&chunk).to_le_bytes());
        out.extend_from_slice(&chunk);
    }
    out
}

/// [`wal()`] in `IMAGE` mode.
fn image_units(mut body: &[u8]) -> Outcome {
    let mut deflate = Deflater::new(1);
    let mut bytes = Vec::new();
    let mut lsn = 1u64;
    while let Some((&[tag, lo, hi], rest)) = body.split_first_chunk::<3>() {
        let n = usize::from(u16::from_le_bytes([lo, hi])).min(rest.len());
        let (chunk, rest) = rest.split_at(n);
        body = rest;
        if tag & 1 == 1 {
            bytes.extend_from_slice(chunk);
            continue;
        }
        let mut chunk = chunk.to_vec();
        if tag & 2 != 0 && chunk.len() >= 8 {
            chunk[..8].copy_from_slice(&lsn.to_le_bytes());
        }
        lsn = lsn.wrapping_add(1);
        image::frame_unit(&mut deflate, &chunk, &mut bytes).expect("a small unit frames");
    }
    let Ok(units) = image::read_units(&bytes) else {
        return Outcome::Rejected;
    };
    let mut again = Vec::new();
    for (i, unit) in units.iter().enumerate() {
        assert_eq!(unit.lsn, i as u64 + 1, "image units out of sequence");
        let changes: Vec<Change<&[u8]>> = unit.changes.iter().map(wal::borrow).collect();
        let mut plain = Vec::new();
        wal::encode_unit(&mut plain, unit.lsn, unit.xor, unit.count, &changes);
        image::frame_unit(&mut deflate, &plain[8..], &mut again).expect("a read unit frames");
    }
    assert_eq!(
        image::read_units(&again).as_ref().ok(),
        Some(&units),
        "image units framed again read differently"
    );
    Outcome::Decoded
}

/// The sled journal's value decoders: audit buckets (`events::decode_bucket`)
/// and record headers (`stored::decode`).
///
/// Input: `[selector][value]`; an even selector decodes a bucket, an odd one
/// a record header. Properties: no panic; a record header that decodes
/// encodes again to exactly the same bytes; a bucket that decodes (either
/// form: frames, or compressed) encodes again to a bucket that decodes to
/// the same events (a deflate stream has many encodings, so not byte for
/// byte), and its frames re-encode byte for byte; a bucket's events are in
/// increasing order and merging it into itself changes nothing.
pub fn sled_value(data: &[u8]) -> Outcome {
    let Some((&selector, value)) = data.split_first() else {
        return Outcome::Rejected;
    };
    if selector & 1 == 0 {
        let Ok(bucket) = events::decode_bucket(value) else {
            return Outcome::Rejected;
        };
        assert!(bucket.windows(2).all(|w| w[0].0 < w[1].0), "out of order");
        assert!(
            events::decode_bucket(&events::encode_bucket(&bucket)).as_ref() == Ok(&bucket),
            "a bucket re-encodes to different events"
        );
        if value.first() != Some(&events::DEFLATED) {
            assert!(
                events::encode_frames(&bucket) == value,
                "bucket frames re-encode differently"
            );
        }
        let mut merged = bucket.clone();
        events::merge(&mut merged, bucket.clone());
        assert_eq!(merged, bucket, "merging a bucket into itself changed it");
    } else {
        let Ok((header, body)) = stored::decode(value) else {
            return Outcome::Rejected;
        };
        assert!(
            stored::encode(&header, body) == value,
            "record header re-encodes differently"
        );
        let loaded = stored::loaded(header, body);
        assert_eq!(loaded.body, body);
    }
    Outcome::Decoded
}

/// Units as the store writes them: a record with its escalation entry and
/// events, a removal, a truncation of the audit stream.
fn sample_units() -> Vec<Vec<u8>> {
    let mut units = Vec::new();
    let record = stored::encode(
        &Header {
            version: 5,
            epoch: 1,
            owner: Some(Owner {
                worker: Arc::from("pod-1"),
                incarnation: 2,
            }),
            escalated: true,
        },
        b"\x4f\x02body",
    );
    let changes: [&[Change<&[u8]>]; 3] = [
        &[
            Change::Put {
                tree: Tree::Ops,
                key: &[1; 32],
                value: &record,
            },
            Change::Put {
                tree: Tree::Escalations,
                key: &[1; 32],
                value: b"",
            },
            Change::Event {
                seq: 9,
                bytes: b"\x45\x02event",
            },
        ],
        &[Change::Remove {
            tree: Tree::Steps,
            key: &[2; 32],
        }],
        &[Change::Truncate { before: 4 }],
    ];
    for (i, c) in changes.iter().enumerate() {
        let mut out = Vec::new();
        wal::encode_unit(&mut out, 10 + i as u64, 0x1234 * i as u64, 1 - i as i64, c);
        units.push(out);
    }
    units
}

pub(crate) fn wal_seeds() -> Vec<(String, Vec<u8>)> {
    let (gen, first_lsn) = (3u8, 10u8);
    let units = sample_units();
    let mut segment = wal::header(u64::from(gen)).to_vec();
    for u in &units {
        segment.extend_from_slice(u);
    }
    let raw = |flags: u8, garbage: &[u8]| {
        let mut input = vec![flags, gen, first_lsn, garbage.len() as u8];
        input.extend_from_slice(&segment);
        input.extend_from_slice(garbage);
        input
    };
    let mut chunks = vec![NEWEST | CHUNKS, gen, first_lsn, 0];
    for u in &units {
        let body = &u[8..];
        chunks.push(2);
        chunks.extend_from_slice(&(body.len() as u16).to_le_bytes());
        chunks.extend_from_slice(body);
    }
    let mut image = vec![IMAGE, 0, 0, 0];
    for u in &units {
        let body = &u[8..];
        image.push(2);
        image.extend_from_slice(&(body.len() as u16).to_le_bytes());
        image.extend_from_slice(body);
    }
    // The second unit cut short: a torn tail.
    let torn = &units[1][..units[1].len() / 2];
    vec![
        ("segment-newest".into(), raw(NEWEST, &[])),
        ("segment-older".into(), raw(0, &[])),
        ("segment-torn-garbage".into(), raw(NEWEST, torn)),
        ("chunks".into(), chunks),
        ("image-units".into(), image),
    ]
}

pub(crate) fn sled_value_seeds() -> Vec<(String, Vec<u8>)> {
    let events = [
        (32, b"\x45\x02first".to_vec()),
        (33, Vec::new()),
        (40, vec![7; 100]),
    ];
    let mut bucket = vec![0];
    bucket.extend(events::encode_bucket(&events));
    let mut frames = vec![0];
    frames.extend(events::encode_frames(&events));
    let header = |owner: Option<Owner>| {
        let mut input = vec![1];
        input.extend(stored::encode(
            &Header {
                version: 9,
                epoch: 3,
                owner,
                escalated: false,
            },
            b"\x4f\x02record",
        ));
        input
    };
    vec![
        ("bucket".into(), bucket),
        ("bucket-format-2".into(), frames),
        ("record-header".into(), header(None)),
        (
            "record-header-claimed".into(),
            header(Some(Owner {
                worker: Arc::from("worker-é"),
                incarnation: 7,
            })),
        ),
    ]
}

/// A small real journal, made once per process: its files, what an
/// undamaged open reads from it, and where each record's last write sits
/// in the newest log segment.
struct Snapshot {
    files: Vec<(String, Vec<u8>)>,
    records: Vec<Truth>,
    /// The newest log segment's file name.
    newest: String,
    /// Where its units end (zeros follow).
    units_end: usize,
}

/// One record of the snapshot.
struct Truth {
    space: idem_journal::journal::Space,
    key: idem_journal::journal::Digest,
    body: Vec<u8>,
    /// Where the unit that last wrote it ends in the newest segment, if it
    /// is there (else it is in sled, or an older segment).
    unit_end: Option<usize>,
}

/// A directory of its own under the system's temporary directory.
pub(super) fn scratch_dir(what: &str) -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!(
        "idem-fuzz-{what}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Runs `f` to its end on a runtime of its own (also the journal's unit
/// tests' way to drive it from a plain `#[test]`).
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime")
        .block_on(f)
}

fn read_files(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("readable journal directory") {
            let path = e.expect("readable entry").path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let name = path
                    .strip_prefix(dir)
                    .expect("inside")
                    .display()
                    .to_string();
                out.push((name, std::fs::read(&path).expect("readable journal file")));
            }
        }
    }
    out.sort();
    out
}

fn write_files(dir: &std::path::Path, files: &[(String, Vec<u8>)]) {
    for (name, bytes) in files {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("scratch directory");
        }
        std::fs::write(&path, bytes).expect("scratch file");
    }
}

fn snapshot() -> &'static Snapshot {
    static SNAPSHOT: std::sync::OnceLock<Snapshot> = std::sync::OnceLock::new();
    SNAPSHOT.get_or_init(make_snapshot)
}

fn make_snapshot() -> Snapshot {
    use idem_journal::journal::{ClaimChange, Durability, Expect, Journal, NewEvent, Space, Write};
    let dir = scratch_dir("journal");
    let owner = Owner {
        worker: Arc::from("fuzz"),
        incarnation: 1,
    };
    let body =
        |i: u8| record::encode(Kind::Step, &format!("record {i}")).expect("a record encodes");
    let put = |j: &crate::journal::SledJournal, space, i: u8, claimed: bool| {
        let key = [i; 32];
        let body = body(i);
        let event = [0x45, 2, i];
        let events = [NewEvent {
            key: Some(&key),
            bytes: &event,
        }];
        let w = Write {
            space,
            key: &key,
            expect: Expect::Absent,
            body: &body,
            claim: if claimed {
                ClaimChange::Take(&owner)
            } else {
                ClaimChange::Keep
            },
            escalated: i.is_multiple_of(3),
            events: &events,
            durability: Durability::Immediate,
        };
        block_on(j.write(w)).expect("a fresh journal writes");
    };
    // Written before a reopen: in sled after the reopen's checkpoint.
    let j = crate::journal::SledJournal::open(&dir).expect("a fresh journal opens");
    for i in 1..=4 {
        put(
            &j,
            if i == 4 { Space::Steps } else { Space::Ops },
            i,
            i == 2,
        );
    }
    drop(j);
    // What that clean close recorded of the log's end.
    let first_end =
        std::fs::read(dir.join(crate::files::LOG_END)).expect("a clean close records the log end");
    // Written after it: in the log only.
    let j = crate::journal::SledJournal::open(&dir).expect("the journal reopens");
    for i in 5..=7 {
        put(
            &j,
            if i == 7 { Space::Steps } else { Space::Ops },
            i,
            i == 5,
        );
    }
    // A clean close applies its log to sled; this one leaves it as a
    // crash does.
    j.store()
        .no_close_checkpoint
        .store(true, std::sync::atomic::Ordering::Relaxed);
    drop(j);
    // The second process died instead (its writes durable, its close not
    // recorded): the log end is still the first close's, so a cut of the
    // newest segment is a torn tail, as a crash leaves it.
    std::fs::write(dir.join(crate::files::LOG_END), &first_end).expect("restore the log end");
    let mut files = read_files(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    let newest_at = (0..files.len())
        .filter(|&i| wal::is_segment(&files[i].0))
        .max_by(|&a, &b| files[a].0.cmp(&files[b].0))
        .expect("the journal has a log segment");
    let (newest, segment) = &files[newest_at];
    let gen = u64::from_str_radix(&newest["idem-wal.".len()..], 16).expect("a segment name");
    // Its first unit's lsn, read from the frame (length, crc, then the lsn).
    let first_lsn = segment
        .get(HEADER_LEN + 8..HEADER_LEN + 16)
        .map_or(1, |l| u64::from_le_bytes(l.try_into().expect("8 bytes")));
    let seg = wal::read_segment(segment, gen, true, first_lsn).expect("the log reads");
    // The segment ends in the zeros it was prepared with (a mebibyte): 64
    // of them keep the case, and damage lands in the units.
    let units_end = seg.valid_len;
    files[newest_at].1.truncate(units_end + 64);
    let newest = files[newest_at].0.clone();
    let mut unit_of = std::collections::HashMap::new();
    let mut at = HEADER_LEN;
    for unit in &seg.units {
        let mut encoded = Vec::new();
        encode(&mut encoded, unit);
        at += encoded.len();
        for c in &unit.changes {
            if let Change::Put { tree, key, .. } = c {
                unit_of.insert((*tree, key.clone()), at);
            }
        }
    }
    let records = (1..=7u8)
        .map(|i| {
            let space = if i == 4 || i == 7 {
                Space::Steps
            } else {
                Space::Ops
            };
            let tree = if space == Space::Ops {
                Tree::Ops
            } else {
                Tree::Steps
            };
            Truth {
                space,
                key: [i; 32],
                body: body(i),
                unit_end: unit_of.get(&(tree, vec![i; 32])).copied(),
            }
        })
        .collect();
    Snapshot {
        files,
        records,
        newest,
        units_end,
    }
}

/// Opening a real journal whose files were damaged.
///
/// Input: damage operations of 4 bytes, `[file][op][offset: u16 LE]`,
/// applied in order to a small real journal's files (`file` modulo their
/// number; a file of sled's, the metadata, the checkpoint or the log):
/// `op` even flips the bits `op | 1` of the byte at `offset` (modulo the
/// file's length), odd truncates the file there.
///
/// Properties: no panic; the open either fails with an error that says
/// what is wrong with the directory, or succeeds, and then every record the
/// undamaged journal held loads as it was, or fails with an error, or
/// loads bytes that the record decoder refuses — never absent, unless the
/// damage reaches the newest log segment at or before the unit that last
/// wrote it (the torn-tail rule: such a unit may never have been
/// acknowledged).
pub fn journal_files(data: &[u8]) -> Outcome {
    use idem_journal::journal::Journal;
    let snap = snapshot();
    let mut files = snap.files.clone();
    // The first offset of the newest segment that the damage reaches.
    let mut newest_damage = usize::MAX;
    for op in data.chunks_exact(4) {
        let (name, bytes) = &mut files[usize::from(op[0]) % snap.files.len()];
        let offset = usize::from(u16::from_le_bytes([op[2], op[3]]));
        let at = if op[1] & 1 == 0 {
            if bytes.is_empty() {
                continue;
            }
            let at = offset % bytes.len();
            bytes[at] ^= op[1] | 1;
            at
        } else {
            let at = offset % (bytes.len() + 1);
            bytes.truncate(at);
            at
        };
        if *name == snap.newest {
            newest_damage = newest_damage.min(at);
        }
    }
    let dir = scratch_dir("damaged");
    write_files(&dir, &files);
    let outcome = match crate::journal::SledJournal::open(&dir) {
        Ok(j) => {
            for t in &snap.records {
                match block_on(j.load(t.space, &t.key)) {
                    Ok(Some(l)) => assert!(
                        l.body == t.body
                            || record::decode::<String>(Kind::Step, &l.body, "fuzz", &t.key)
                                .is_err(),
                        "record {} reads as other bytes that decode",
                        t.key[0]
                    ),
                    Ok(None) => assert!(
                        t.unit_end.is_some_and(|end| newest_damage < end),
                        "record {} is absent after damage that spared its unit",
                        t.key[0]
                    ),
                    Err(_) => {}
                }
            }
            let _ = block_on(j.events(0, 100));
            Outcome::Decoded
        }
        Err(e) => {
            assert!(
                matches!(
                    e,
                    idem_journal::error::Error::Damaged { .. }
                        | idem_journal::error::Error::NotAJournal { .. }
                        | idem_journal::error::Error::UnsupportedFormat { .. }
                        | idem_journal::error::Error::Corrupt { .. }
                        | idem_journal::error::Error::RecordVersion { .. }
                ),
                "a damaged journal must be refused as damaged, got: {e}"
            );
            Outcome::Rejected
        }
    };
    let _ = std::fs::remove_dir_all(&dir);
    outcome
}

pub(crate) fn journal_files_seeds() -> Vec<(String, Vec<u8>)> {
    let snap = snapshot();
    let index = |name: &str| {
        snap.files
            .iter()
            .position(|(n, _)| n == name)
            .expect("the journal has the file") as u8
    };
    // The last byte of the log's last unit: a torn tail.
    let newest = index(&snap.newest);
    let len = snap.units_end as u16;
    let mut torn = vec![newest, 1];
    torn.extend((len - 1).to_le_bytes());
    vec![("undamaged".into(), Vec::new()), ("torn-log".into(), torn)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn damaged_sled_settings_are_repaired_from_the_log_or_refused_as_damage() {
        // Found by the `journal_files` harness: one flipped bit in sled's
        // `conf` made sled refuse it as written by "a sled version earlier
        // than 0.29", which the journal reported as a storage error. It is
        // damage: repaired from the journal's own copy (here the whole log,
        // no image yet) when that copy is whole, refused naming `conf` when
        // it is not.
        use idem_journal::journal::Journal;
        let snap = snapshot();
        let conf = snap
            .files
            .iter()
            .position(|(name, _)| name == "conf")
            .expect("sled has a settings file");
        assert_eq!(journal_files(&[conf as u8, 0x80, 0, 0]), Outcome::Decoded);
        let mut files = snap.files.clone();
        files[conf].1[0] ^= 0x81;

        let dir = scratch_dir("conf");
        write_files(&dir, &files);
        let j = crate::SledJournal::open(&dir).expect("repaired");
        for t in &snap.records {
            let loaded = block_on(j.load(t.space, &t.key)).unwrap();
            assert_eq!(
                loaded.map(|l| l.body),
                Some(t.body.clone()),
                "record {}",
                t.key[0]
            );
        }
        drop(j);
        let aside: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("sled-damaged."))
            .collect();
        assert_eq!(aside.len(), 1, "the damaged files are kept aside");
        let kept = std::fs::read(aside[0].path().join("conf")).unwrap();
        assert_eq!(kept, files[conf].1, "as they were found");
        let _ = std::fs::remove_dir_all(&dir);

        // Without the log's first segment there is no whole copy.
        let first = files
            .iter()
            .position(|(name, _)| name == "idem-wal.0000000000000001")
            .expect("the log's first segment is kept");
        files.remove(first);
        let dir = scratch_dir("conf");
        write_files(&dir, &files);
        let err = crate::SledJournal::open(&dir).map(drop).unwrap_err();
        let names = read_files(&dir).len();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            matches!(&err, idem_journal::error::Error::Damaged { file, detail, .. }
                if file.ends_with("conf") && detail.contains("not repaired")),
            "{err}"
        );
        assert_eq!(names, files.len(), "nothing was deleted or moved");
    }
}
