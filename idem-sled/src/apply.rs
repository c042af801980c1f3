//! Moving logged changes into sled, and checking what sled holds.
//!
//! sled's files change only here: when the journal opens (replaying the
//! log) and at a checkpoint (applying the segments the log has rotated
//! away from). In between, changes live in the log (durable) and in the
//! store's in-memory overlay (visible). So what sled has on disk is always
//! a state the log fully describes, and a cut or a crash in the middle of
//! applying is repaired by applying the same units again: every change is
//! a whole value (a put or a remove), events land in the bucket their
//! number names, and a truncation removes what is below a number.
//!
//! After applying, [`sync_sled`] makes sled's files durable — its data
//! file, its blob files and their directory, its snapshots and the journal
//! directory (sled fsyncs none of the blobs, nor any directory) — before
//! the checkpoint file says so. That is not enough on its own: sled counts
//! its own writes stable after `sync_file_range`, so a later power cut can
//! still damage what this made durable; the journal's image and log repair
//! it (`image.rs`, `repair.rs`).

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::path::Path;

use crate::digest::{self, Digest};
use crate::events::{self, Event};
use crate::wal::{Change, Tree, Unit};

/// Why applying or scanning failed: damage in sled's files (sled reports
/// corruption, or a value of ours does not decode), or an I/O error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Failed {
    Damaged(String),
    Io(String),
}

impl Failed {
    fn text(&self) -> &str {
        match self {
            Failed::Damaged(t) | Failed::Io(t) => t,
        }
    }
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.text())
    }
}

impl From<sled::Error> for Failed {
    fn from(e: sled::Error) -> Self {
        match e {
            // A file shorter than sled's own index says (a truncated data
            // or blob file) reads as an unexpected end: that is damage,
            // not a failing disk.
            sled::Error::Io(ref io)
                if matches!(
                    io.kind(),
                    std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::InvalidData
                ) =>
            {
                Failed::Damaged(e.to_string())
            }
            sled::Error::Io(_) => Failed::Io(e.to_string()),
            // Corruption, a bug report, an unsupported layout: all say the
            // files are not what sled wrote.
            other => Failed::Damaged(other.to_string()),
        }
    }
}

/// sled's trees of one journal.
pub(super) struct Trees {
    pub db: sled::Db,
    /// Indexed by [`Tree`].
    pub trees: Vec<sled::Tree>,
    pub audit: sled::Tree,
    /// Makes the next read of the audit stream for the content check
    /// panic, as sled does on some damage.
    #[cfg(test)]
    pub panic_in_audit_scan: std::sync::atomic::AtomicBool,
}

impl Trees {
    pub(super) fn open(db: sled::Db) -> sled::Result<Trees> {
        let mut trees = Vec::new();
        for t in Tree::ALL {
            trees.push(db.open_tree(t.name())?);
        }
        let audit = db.open_tree("audit")?;
        Ok(Trees {
            db,
            trees,
            audit,
            #[cfg(test)]
            panic_in_audit_scan: Default::default(),
        })
    }

    pub(super) fn tree(&self, t: Tree) -> &sled::Tree {
        &self.trees[t as usize]
    }
}

/// What applying units found.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Applied {
    /// The units' digest changes, folded.
    pub delta: Digest,
    pub last_lsn: Option<u64>,
    pub last_seq: Option<u64>,
    pub units: usize,
}

/// Applies `units`, in order, to sled.
pub(super) fn apply<'a>(
    trees: &Trees,
    units: impl IntoIterator<Item = &'a Unit>,
) -> Result<Applied, Failed> {
    let mut applied = Applied::default();
    // Events are merged into their buckets once per bucket, after the
    // units (a truncation in between applies to the buckets as they are
    // by then, so pending bucket changes are written before it).
    let mut buckets: BTreeMap<u64, Vec<Event>> = BTreeMap::new();
    for unit in units {
        applied.delta.apply(unit.xor, unit.count);
        applied.last_lsn = Some(unit.lsn);
        applied.units += 1;
        for change in &unit.changes {
            match change {
                Change::Put { tree, key, value } => {
                    trees.tree(*tree).insert(key, value.as_slice())?;
                }
                Change::Remove { tree, key } => {
                    trees.tree(*tree).remove(key)?;
                }
                Change::Event { seq, bytes } => {
                    applied.last_seq = Some(*seq);
                    buckets
                        .entry(events::bucket_of(*seq))
                        .or_default()
                        .push((*seq, bytes.clone()));
                }
                Change::Truncate { before } => {
                    write_buckets(trees, std::mem::take(&mut buckets))?;
                    truncate(trees, *before)?;
                }
            }
        }
    }
    write_buckets(trees, buckets)?;
    Ok(applied)
}

fn write_buckets(trees: &Trees, buckets: BTreeMap<u64, Vec<Event>>) -> Result<(), Failed> {
    if buckets.is_empty() {
        return Ok(());
    }
    let mut packer = events::Packer::new();
    for (key, new) in buckets {
        let mut bucket = match trees.audit.get(key.to_be_bytes())? {
            Some(v) => events::decode_bucket(&v)
                .map_err(|e| Failed::Damaged(format!("audit bucket {key}: {e}")))?,
            None => Vec::new(),
        };
        events::merge(&mut bucket, new);
        trees
            .audit
            .insert(key.to_be_bytes(), packer.encode(&bucket))?;
    }
    Ok(())
}

/// Rewrites the audit buckets of a journal of format 2 (32 sequence
/// numbers each, uncompressed) as this build stores them ([`events::BUCKET`]
/// numbers each, compressed). Each new bucket replaces the old ones it
/// covers in one sled batch, so whatever a crash leaves, every event is in
/// exactly one bucket and the buckets are in sequence order; running it
/// again finishes the work, skipping what is already converted. Returns
/// how many buckets it wrote.
pub(super) fn regroup(trees: &Trees) -> Result<u64, Failed> {
    let mut packer = events::Packer::new();
    let mut start = 0u64;
    let mut written = 0;
    loop {
        let Some(first) = trees.audit.range(start.to_be_bytes()..).keys().next() else {
            return Ok(written);
        };
        let first = bucket_key(&first?)?;
        let group = events::bucket_of(first);
        let end = group.checked_add(events::BUCKET);
        let old: Vec<(sled::IVec, sled::IVec)> = match end {
            Some(end) => trees.audit.range(group.to_be_bytes()..end.to_be_bytes()),
            None => trees.audit.range(group.to_be_bytes()..),
        }
        .collect::<Result<_, _>>()?;
        let converted = matches!(&old[..], [(k, v)]
            if **k == group.to_be_bytes() && v.first() == Some(&events::DEFLATED));
        if !converted {
            let mut bucket = Vec::new();
            let mut batch = sled::Batch::default();
            for (k, v) in &old {
                let found = events::decode_bucket(v).map_err(|e| {
                    Failed::Damaged(format!("audit bucket {}: {e}", idem_journal::key::hex(k)))
                })?;
                if let Some((seq, _)) = found
                    .iter()
                    .find(|(seq, _)| events::bucket_of(*seq) != group)
                {
                    return Err(Failed::Damaged(format!(
                        "audit bucket {} holds event {seq}, outside it",
                        idem_journal::key::hex(k)
                    )));
                }
                events::merge(&mut bucket, found);
                if **k != group.to_be_bytes() {
                    batch.remove(k.clone());
                }
            }
            batch.insert(&group.to_be_bytes(), packer.encode(&bucket));
            trees.audit.apply_batch(batch)?;
            written += 1;
        }
        match end {
            Some(end) => start = end,
            None => return Ok(written),
        }
    }
}

/// The sequence number an audit bucket's key names.
fn bucket_key(k: &[u8]) -> Result<u64, Failed> {
    <[u8; 8]>::try_from(k).map(u64::from_be_bytes).map_err(|_| {
        Failed::Damaged(format!(
            "an audit bucket's key is {} bytes: {}",
            k.len(),
            idem_journal::key::hex(k)
        ))
    })
}

/// Removes every event below `before` from sled's buckets.
fn truncate(trees: &Trees, before: u64) -> Result<(), Failed> {
    let end = events::bucket_of(before);
    let doomed: Vec<_> = trees
        .audit
        .range(..end.to_be_bytes())
        .keys()
        .collect::<Result<_, _>>()?;
    for key in doomed {
        trees.audit.remove(key)?;
    }
    if let Some(v) = trees.audit.get(end.to_be_bytes())? {
        let mut bucket = events::decode_bucket(&v)
            .map_err(|e| Failed::Damaged(format!("audit bucket {end}: {e}")))?;
        bucket.retain(|(seq, _)| *seq >= before);
        let key = end.to_be_bytes();
        if bucket.is_empty() {
            trees.audit.remove(key)?;
        } else {
            trees.audit.insert(key, events::encode_bucket(&bucket))?;
        }
    }
    Ok(())
}

/// The digest of everything sled holds, and the last audit sequence number
/// in it. Reads every entry: this is what opening a journal costs.
pub(super) fn scan_digest(trees: &Trees) -> Result<(Digest, Option<u64>), Failed> {
    // The digest is an XOR and a count, so parts of the content can be
    // read on their own threads and folded in any order: the records on
    // one, the audit stream (most of the bytes, and all the inflating) on
    // another. A panic of sled's on one of them goes on unwinding here, as
    // it would have without the thread.
    std::thread::scope(|scope| {
        let audit = scope.spawn(|| {
            #[cfg(test)]
            if trees
                .panic_in_audit_scan
                .swap(false, std::sync::atomic::Ordering::Relaxed)
            {
                panic!("injected: cannot find pid 9 in view_for_key");
            }
            scan_audit(&trees.audit)
        });
        let records = scan_records(trees);
        let audit = audit
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        let (mut d, last) = audit?;
        let records = records?;
        d.apply(records.xor, records.count);
        Ok((d, last))
    })
}

fn scan_records(trees: &Trees) -> Result<Digest, Failed> {
    let mut d = Digest::default();
    for t in Tree::ALL {
        for item in trees.tree(t).iter() {
            let (k, v) = item?;
            d.add(digest::entry_hash(t as u8, &k, &v));
        }
    }
    Ok(d)
}

fn scan_audit(audit: &sled::Tree) -> Result<(Digest, Option<u64>), Failed> {
    let mut d = Digest::default();
    let mut last = None;
    for item in audit.iter() {
        let (k, v) = item?;
        events::visit_bucket(&v, |seq, bytes| {
            d.add(digest::entry_hash(digest::AUDIT, &seq.to_be_bytes(), bytes));
            last = Some(seq);
        })
        .map_err(|e| {
            Failed::Damaged(format!("audit bucket {}: {e}", idem_journal::key::hex(&k)))
        })?;
    }
    Ok((d, last))
}

/// Makes sled's state durable: its buffers written, then every file and
/// directory entry it needs to recover fsynced.
pub(super) fn sync_sled(dir: &Path, trees: &Trees) -> std::io::Result<()> {
    trees.db.flush().map_err(std::io::Error::other)?;
    let blobs = dir.join("blobs");
    if blobs.is_dir() {
        for entry in fs::read_dir(&blobs)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                File::open(entry.path())?.sync_all()?;
            }
        }
        crate::wal::sync_dir(&blobs)?;
    }
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if (name == "db" || name == "conf" || name.starts_with("snap."))
            && entry.file_type()?.is_file()
        {
            File::open(entry.path())?.sync_all()?;
        }
    }
    crate::wal::sync_dir(dir)
}

/// What a caught panic (of sled's, on damage in its files) said.
pub(super) fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trees() -> (tempfile::TempDir, Trees) {
        let dir = tempfile::TempDir::new().unwrap();
        let db = sled::Config::new().path(dir.path()).open().unwrap();
        let trees = Trees::open(db).unwrap();
        (dir, trees)
    }

    #[test]
    fn the_content_check_reads_on_two_threads_and_a_panic_of_sled_still_reaches_the_caller() {
        let (_dir, t) = trees();
        t.tree(Tree::Ops).insert(b"k", &b"v"[..]).unwrap();
        let events = vec![(1, b"x".to_vec()), (2, b"y".to_vec())];
        t.audit
            .insert(0u64.to_be_bytes(), events::encode_bucket(&events))
            .unwrap();
        let mut expected = Digest::default();
        expected.add(digest::entry_hash(Tree::Ops as u8, b"k", b"v"));
        for (seq, bytes) in &events {
            expected.add(digest::entry_hash(digest::AUDIT, &seq.to_be_bytes(), bytes));
        }
        assert_eq!(scan_digest(&t).unwrap(), (expected, Some(2)));
        // sled panics on some damage; the open turns that into an error
        // (`repair::catch_sled_panic`) only if the panic reaches it.
        t.panic_in_audit_scan
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scan_digest(&t)));
        let panic = caught.expect_err("the audit thread's panic went missing");
        assert!(
            panic_text(&panic).contains("injected"),
            "{}",
            panic_text(&panic)
        );
    }

    #[test]
    fn regrouping_refuses_buckets_that_are_not_what_they_claim() {
        // A bucket keyed 32 holding an event of another group.
        let (_dir, t) = trees();
        let stray = events::encode_frames(&[(40, b"a".to_vec()), (200, b"b".to_vec())]);
        t.audit.insert(32u64.to_be_bytes(), stray).unwrap();
        let err = regroup(&t).unwrap_err();
        assert!(
            matches!(&err, Failed::Damaged(d) if d.contains("holds event 200")),
            "{err}"
        );
        // Nothing was rewritten.
        assert_eq!(t.audit.len(), 1);

        // A key that is not a sequence number.
        let (_dir, t) = trees();
        t.audit.insert(b"abc", events::encode_frames(&[])).unwrap();
        let err = regroup(&t).unwrap_err();
        assert!(
            matches!(&err, Failed::Damaged(d) if d.contains("3 bytes")),
            "{err}"
        );

        // A value that is not a bucket.
        let (_dir, t) = trees();
        t.audit.insert(64u64.to_be_bytes(), &[0u8; 5][..]).unwrap();
        let err = regroup(&t).unwrap_err();
        assert!(matches!(&err, Failed::Damaged(_)), "{err}");
    }
}
