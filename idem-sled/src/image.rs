//! The journal's second copy of what sled holds: `idem-image`.
//!
//! sled 0.34 is not safe against power loss on its own: it treats data as
//! stable after `sync_file_range` (which neither flushes the disk's cache
//! nor the file's metadata) and then reuses the space of older versions, so
//! a cut while sled writes can destroy entries that an earlier checkpoint
//! had made durable. Damage that sled reports (or that the content digest
//! finds at open) is therefore repaired, not only refused: the journal
//! keeps a full copy of its content outside sled, made of files it fsyncs
//! itself, and rebuilds sled from it.
//!
//! That copy is an image plus the log after it. Checkpoints no longer
//! delete the log segments they applied; once the segments kept since the
//! last image outgrow it, the store writes a new image of sled's content
//! (on its own thread, while writes and checkpoints go on) and only then
//! deletes the segments the image covers. The image is *fuzzy*: it starts
//! from the state of checkpoint `gen` but may catch later changes as the
//! checkpointer applies them. That is sound because every change after
//! `gen` is still in the log, and replaying a change is idempotent (a put
//! or a remove is a whole value, events merge by number, a truncation
//! removes below a number), so image + replay ends at the log's last
//! state; the rebuild checks that against the checkpoint's digest.
//!
//! Format: a header of a log segment's layout with magic `IDEMIMG1` for
//! generation `gen`, then units numbered 1, 2, ... within the image, each
//! a batch of puts and events, and a closing unit with no entries whose
//! digest field is [`END`] and whose count field is the lsn the log after
//! `gen` starts at. A unit is the body of a log unit (`wal.rs`) compressed:
//! `[length: u32 LE][crc32 of what follows the crc: u32 LE][body length: u32
//! LE][the body, raw deflate]`. The image holds every record once, with
//! the same tools, keys and runs again and again; compressed it takes
//! about a third of the bytes. Journals of earlier builds have an image of
//! uncompressed units in the log's own format (header magic `IDEMWAL2`);
//! it is still read, and replaced by the next image written. A file
//! without its closing unit is damaged. It is written to
//! `idem-image.tmp`, fsynced, renamed and the directory fsynced, so a cut
//! leaves the old image or the new one.

use std::fs;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::apply::Trees;
use crate::deflate::{self, Deflater};
use crate::events;
use crate::wal::{self, Change, Tree, Unit};
use idem_journal::files as private_files;
use idem_journal::record::crc32;

/// The image's file name.
pub(super) const IMAGE: &str = "idem-image";

/// The digest field of the closing unit.
const END: u64 = u64::MAX;

/// Bytes of entries per unit.
const CHUNK: usize = 1 << 20;

/// The magic of an image of compressed units (what this build writes).
const MAGIC: &[u8; 8] = b"IDEMIMG1";

/// How hard to compress: deflate's fastest level. An image is written on
/// its own thread while the journal serves calls on the others; level 1
/// keeps it from competing with them for long.
const LEVEL: u8 = 1;

/// The largest body a unit may claim: [`CHUNK`] of entries plus the one
/// that crossed it, at most the largest record idem writes and its key.
/// Far above any real unit; it keeps a damaged length from sizing an
/// allocation.
const MAX_BODY: usize = CHUNK + idem_journal::record::LARGE_LIMIT + (1 << 20);

/// An image read back.
#[derive(Debug)]
pub(super) struct Image {
    /// The last log generation it covers.
    pub gen: u64,
    /// The lsn of the first unit after it.
    pub next_lsn: u64,
    pub units: Vec<Unit>,
}

/// Writes an image of `trees` for the log up to segment `gen` (whose next
/// lsn is `next_lsn`), durably, replacing the previous one. Returns its
/// size. Gives up (removing the partial file) once `stop` is set.
pub(super) fn write(
    dir: &Path,
    trees: &Trees,
    gen: u64,
    next_lsn: u64,
    stop: &AtomicBool,
) -> io::Result<u64> {
    let mut size = 0u64;
    private_files::replace_with(dir, IMAGE, true, |w| {
        let mut out = Writer {
            w,
            lsn: 1,
            batch: Vec::new(),
            batch_bytes: 0,
            plain: Vec::with_capacity(CHUNK + (64 << 10)),
            packed: Vec::with_capacity(CHUNK / 2),
            deflate: Deflater::new(LEVEL),
            size: wal::HEADER_LEN as u64,
            stop,
        };
        out.w.write_all(&wal::header_with(MAGIC, gen))?;
        for tree in Tree::ALL {
            for item in trees.tree(tree).iter() {
                let (key, value) = item.map_err(io::Error::other)?;
                out.push(Change::Put {
                    tree,
                    key: key.to_vec(),
                    value: value.to_vec(),
                })?;
            }
        }
        for item in trees.audit.iter() {
            let (key, value) = item.map_err(io::Error::other)?;
            let bucket = events::decode_bucket(&value).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("audit bucket {}: {e}", idem_journal::key::hex(&key)),
                )
            })?;
            for (seq, bytes) in bucket {
                out.push(Change::Event { seq, bytes })?;
            }
        }
        out.flush()?;
        out.write_unit(END, next_lsn as i64, &[])?;
        size = out.size;
        Ok(())
    })?;
    Ok(size)
}

struct Writer<'a> {
    w: &'a mut dyn io::Write,
    lsn: u64,
    batch: Vec<Change<Vec<u8>>>,
    batch_bytes: usize,
    /// A unit as the log would hold it, then compressed.
    plain: Vec<u8>,
    packed: Vec<u8>,
    deflate: Deflater,
    size: u64,
    stop: &'a AtomicBool,
}

impl Writer<'_> {
    fn push(&mut self, change: Change<Vec<u8>>) -> io::Result<()> {
        self.batch_bytes += match &change {
            Change::Put { key, value, .. } => key.len() + value.len() + 10,
            Change::Event { bytes, .. } => bytes.len() + 13,
            _ => 9,
        };
        self.batch.push(change);
        if self.batch_bytes >= CHUNK {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.stop.load(Ordering::Relaxed) {
            return Err(io::Error::other("the journal is closing"));
        }
        if self.batch.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.batch);
        let borrowed: Vec<Change<&[u8]>> = batch.iter().map(wal::borrow).collect();
        self.write_unit(0, 0, &borrowed)?;
        drop(borrowed);
        self.batch = batch;
        self.batch.clear();
        self.batch_bytes = 0;
        Ok(())
    }

    /// Writes the next unit, compressed.
    fn write_unit(&mut self, xor: u64, count: i64, changes: &[Change<&[u8]>]) -> io::Result<()> {
        self.plain.clear();
        wal::encode_unit(&mut self.plain, self.lsn, xor, count, changes);
        self.packed.clear();
        // The log's frame head (length, crc) is replaced by the image's.
        frame_unit(&mut self.deflate, &self.plain[8..], &mut self.packed)?;
        self.w.write_all(&self.packed)?;
        self.size += self.packed.len() as u64;
        self.lsn += 1;
        Ok(())
    }
}

/// Appends `body` (a log unit's body) to `out` as an image unit: its
/// length, crc and the body compressed.
pub(super) fn frame_unit(deflate: &mut Deflater, body: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
    let start = out.len();
    out.extend_from_slice(&[0; 8]);
    let body_len = u32::try_from(body.len())
        .map_err(|_| io::Error::other("an image unit's body does not fit its length field"))?;
    out.extend_from_slice(&body_len.to_le_bytes());
    deflate.compress_into(body, out);
    let len = u32::try_from(out.len() - start - 8)
        .map_err(|_| io::Error::other("an image unit does not fit its length field"))?;
    let crc = crc32(&out[start + 8..]);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// The generation the image covers, from its header alone (what a normal
/// open needs); `None` without an image.
pub(super) fn covered_gen(dir: &Path) -> io::Result<Option<u64>> {
    let mut head = [0u8; wal::HEADER_LEN];
    match fs::File::open(dir.join(IMAGE)) {
        Ok(mut f) => {
            use io::Read as _;
            f.read_exact(&mut head)?;
            let gen = u64::from_le_bytes(head[8..16].try_into().unwrap_or_default());
            if head != wal::header_with(MAGIC, gen) && head != wal::header(gen) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "bad image header",
                ));
            }
            Ok(Some(gen))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Reads the whole image, checking every unit; `Ok(None)` without one,
/// `Err` (with what is wrong) if it is damaged.
pub(super) fn read(dir: &Path) -> Result<Option<Image>, String> {
    let path = dir.join(IMAGE);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let gen = bytes
        .get(8..16)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
        .unwrap_or(0);
    let units = if bytes.get(..wal::HEADER_LEN) == Some(&wal::header_with(MAGIC, gen)[..]) {
        read_units(&bytes[wal::HEADER_LEN..])
            .map_err(|(offset, e)| format!("{} at offset {offset}: {e}", path.display()))?
    } else {
        // An image of an earlier build: the log's own format.
        wal::read_segment(&bytes, gen, false, 1)
            .map_err(|d| format!("{} at offset {}: {}", path.display(), d.offset, d.detail))?
            .units
    };
    let mut units = units;
    match units.pop() {
        Some(last) if last.xor == END && last.changes.is_empty() && last.count > 0 => {
            Ok(Some(Image {
                gen,
                next_lsn: last.count as u64,
                units,
            }))
        }
        _ => Err(format!("{}: no closing unit (cut short)", path.display())),
    }
}

/// The compressed units after the header, numbered from 1; the offset
/// (from the file's start) and what is wrong at the first that is not a
/// whole, valid unit with the next number.
pub(super) fn read_units(mut rest: &[u8]) -> Result<Vec<Unit>, (usize, String)> {
    let mut units = Vec::new();
    let mut offset = wal::HEADER_LEN;
    while !rest.is_empty() {
        let lsn = units.len() as u64 + 1;
        let unit = read_unit(rest, lsn).map_err(|e| (offset, e))?;
        let used = 8 + u32::from_le_bytes(rest[..4].try_into().unwrap_or_default()) as usize;
        units.push(unit);
        rest = &rest[used..];
        offset += used;
    }
    Ok(units)
}

/// The unit at the start of `bytes`, which must be number `lsn`.
fn read_unit(bytes: &[u8], lsn: u64) -> Result<Unit, String> {
    let head = bytes.get(..12).ok_or("a unit cut short in its head")?;
    let len = u32::from_le_bytes(head[..4].try_into().unwrap_or_default()) as usize;
    let crc = u32::from_le_bytes(head[4..8].try_into().unwrap_or_default());
    let stored = bytes
        .get(8..8 + len)
        .filter(|s| s.len() >= 4)
        .ok_or_else(|| format!("a unit claims {len} bytes, {} remain", bytes.len() - 8))?;
    if crc32(stored) != crc {
        return Err("a unit's checksum does not match".into());
    }
    let body_len = u32::from_le_bytes(stored[..4].try_into().unwrap_or_default()) as usize;
    let body = deflate::inflate_exact(&stored[4..], body_len, MAX_BODY, "a unit")?;
    let unit = wal::decode_body(&body).ok_or("a unit's entries do not decode")?;
    if unit.lsn != lsn {
        return Err(format!("unit {} where unit {lsn} belongs", unit.lsn));
    }
    Ok(unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trees(dir: &Path) -> Trees {
        let db = sled::Config::new().path(dir.join("sled")).open().unwrap();
        Trees::open(db).unwrap()
    }

    /// Trees holding records that repeat the way a journal's do, and a
    /// bucket of audit events: more than one unit's worth.
    fn filled(dir: &Path) -> Trees {
        let t = trees(dir);
        for n in 0..6_000u32 {
            let key = format!("charge/{n:08}");
            let value = format!("tool=charge run=run-7 worker=w-1 result=ch_{n:010} ").repeat(4);
            t.tree(Tree::Ops).insert(key, value.as_bytes()).unwrap();
        }
        t.tree(Tree::Escalations)
            .insert(b"e", &b"parked"[..])
            .unwrap();
        let events: Vec<events::Event> = (0..100)
            .map(|s| (s, format!("event {s}").into_bytes()))
            .collect();
        t.audit
            .insert(0u64.to_be_bytes(), events::encode_bucket(&events))
            .unwrap();
        t
    }

    fn puts(units: &[Unit]) -> Vec<Change<Vec<u8>>> {
        units.iter().flat_map(|u| u.changes.clone()).collect()
    }

    #[test]
    fn an_image_is_compressed_and_reads_back_whole() {
        let dir = tempfile::TempDir::new().unwrap();
        let t = filled(dir.path());
        let size = write(dir.path(), &t, 9, 4242, &AtomicBool::new(false)).unwrap();
        assert_eq!(size, fs::metadata(dir.path().join(IMAGE)).unwrap().len());
        assert_eq!(covered_gen(dir.path()).unwrap(), Some(9));
        let image = read(dir.path()).unwrap().unwrap();
        assert_eq!((image.gen, image.next_lsn), (9, 4242));
        assert!(image.units.len() > 1, "{} units", image.units.len());
        let lsns: Vec<u64> = image.units.iter().map(|u| u.lsn).collect();
        assert_eq!(lsns, (1..=image.units.len() as u64).collect::<Vec<_>>());
        let changes = puts(&image.units);
        assert_eq!(changes.len(), 6_000 + 1 + 100);
        assert_eq!(
            changes[0],
            Change::Put {
                tree: Tree::Ops,
                key: b"charge/00000000".to_vec(),
                value: "tool=charge run=run-7 worker=w-1 result=ch_0000000000 "
                    .repeat(4)
                    .into_bytes(),
            }
        );
        assert!(changes.contains(&Change::Event {
            seq: 99,
            bytes: b"event 99".to_vec()
        }));
        // What the same content takes in the log's format.
        let plain: usize = t
            .tree(Tree::Ops)
            .iter()
            .map(|e| e.map(|(k, v)| k.len() + v.len() + 10).unwrap())
            .sum();
        assert!(size * 3 < plain as u64, "{size} bytes for {plain}");
    }

    /// The image an earlier build wrote: the log's own unit format.
    fn write_uncompressed(dir: &Path, gen: u64, next_lsn: u64, units: &[Vec<Change<Vec<u8>>>]) {
        let mut bytes = wal::header(gen).to_vec();
        for (i, changes) in units.iter().enumerate() {
            let borrowed: Vec<Change<&[u8]>> = changes.iter().map(wal::borrow).collect();
            wal::encode_unit(&mut bytes, i as u64 + 1, 0, 0, &borrowed);
        }
        wal::encode_unit(
            &mut bytes,
            units.len() as u64 + 1,
            END,
            next_lsn as i64,
            &[],
        );
        fs::write(dir.join(IMAGE), bytes).unwrap();
    }

    #[test]
    fn an_image_of_an_earlier_build_still_reads() {
        let dir = tempfile::TempDir::new().unwrap();
        let put = Change::Put {
            tree: Tree::Steps,
            key: b"k".to_vec(),
            value: b"v".to_vec(),
        };
        let event = Change::Event {
            seq: 3,
            bytes: b"e".to_vec(),
        };
        write_uncompressed(dir.path(), 5, 77, &[vec![put.clone()], vec![event.clone()]]);
        assert_eq!(covered_gen(dir.path()).unwrap(), Some(5));
        let image = read(dir.path()).unwrap().unwrap();
        assert_eq!((image.gen, image.next_lsn), (5, 77));
        assert_eq!(puts(&image.units), vec![put, event]);
    }

    #[test]
    fn every_cut_and_every_flipped_byte_of_an_image_is_damage() {
        let dir = tempfile::TempDir::new().unwrap();
        let t = trees(dir.path());
        for n in 0..50u32 {
            t.tree(Tree::Ops)
                .insert(n.to_be_bytes(), format!("record {n}").as_bytes())
                .unwrap();
        }
        write(dir.path(), &t, 2, 10, &AtomicBool::new(false)).unwrap();
        let good = fs::read(dir.path().join(IMAGE)).unwrap();
        assert!(read(dir.path()).unwrap().is_some());
        for cut in wal::HEADER_LEN..good.len() {
            fs::write(dir.path().join(IMAGE), &good[..cut]).unwrap();
            assert!(read(dir.path()).is_err(), "cut at {cut} of {}", good.len());
        }
        for at in 0..good.len() {
            let mut bad = good.clone();
            bad[at] ^= 0x10;
            fs::write(dir.path().join(IMAGE), &bad).unwrap();
            assert!(
                read(dir.path()).is_err(),
                "byte {at} of {} flipped",
                good.len()
            );
        }
    }

    #[test]
    fn a_unit_claiming_a_huge_body_is_refused_before_inflating() {
        // Checksum right, claimed length absurd: what a bug or a crc
        // collision would leave. Refused without allocating it.
        let mut stored = u32::MAX.to_le_bytes().to_vec();
        stored.extend_from_slice(&[0x03, 0x00]);
        let mut unit = (stored.len() as u32).to_le_bytes().to_vec();
        unit.extend_from_slice(&crc32(&stored).to_le_bytes());
        unit.extend_from_slice(&stored);
        let err = read_unit(&unit, 1).unwrap_err();
        assert!(err.contains("claims 4294967295 bytes"), "{err}");
        // A length that matches a body that is not a unit's.
        let mut stored = 3u32.to_le_bytes().to_vec();
        stored.extend(miniz_oxide::deflate::compress_to_vec(b"abc", 1));
        let mut unit = (stored.len() as u32).to_le_bytes().to_vec();
        unit.extend_from_slice(&crc32(&stored).to_le_bytes());
        unit.extend_from_slice(&stored);
        let err = read_unit(&unit, 1).unwrap_err();
        assert!(err.contains("do not decode"), "{err}");
    }
}
