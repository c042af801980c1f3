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
//! Format: a log segment's header for generation `gen`, then units in the
//! log's own frame format (numbered 1, 2, ... within the image), each a
//! batch of puts and events, and a closing unit with no entries whose
//! digest field is [`END`] and whose count field is the lsn the log after
//! `gen` starts at. A file without its closing unit is damaged. It is
//! written to `idem-image.tmp`, fsynced, renamed and the directory fsynced,
//! so a cut leaves the old image or the new one.

use std::fs;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::apply::Trees;
use crate::events;
use crate::wal::{self, Change, Tree, Unit};
use idem_journal::files as private_files;

/// The image's file name.
pub(super) const IMAGE: &str = "idem-image";

/// The digest field of the closing unit.
const END: u64 = u64::MAX;

/// Bytes of entries per unit.
const CHUNK: usize = 1 << 20;

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
            encoded: Vec::with_capacity(CHUNK + (64 << 10)),
            size: wal::HEADER_LEN as u64,
            stop,
        };
        out.w.write_all(&wal::header(gen))?;
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
        out.encoded.clear();
        wal::encode_unit(&mut out.encoded, out.lsn, END, next_lsn as i64, &[]);
        out.w.write_all(&out.encoded)?;
        size = out.size + out.encoded.len() as u64;
        Ok(())
    })?;
    Ok(size)
}

struct Writer<'a> {
    w: &'a mut dyn io::Write,
    lsn: u64,
    batch: Vec<Change<Vec<u8>>>,
    batch_bytes: usize,
    encoded: Vec<u8>,
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
        let borrowed: Vec<Change<&[u8]>> = self.batch.iter().map(wal::borrow).collect();
        self.encoded.clear();
        wal::encode_unit(&mut self.encoded, self.lsn, 0, 0, &borrowed);
        self.w.write_all(&self.encoded)?;
        self.size += self.encoded.len() as u64;
        self.lsn += 1;
        self.batch.clear();
        self.batch_bytes = 0;
        Ok(())
    }
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
            if head != wal::header(gen) {
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
    let seg = wal::read_segment(&bytes, gen, false, 1)
        .map_err(|d| format!("{} at offset {}: {}", path.display(), d.offset, d.detail))?;
    let mut units = seg.units;
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
