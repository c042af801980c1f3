//! Moving logged changes into sled, and checking what sled holds.
//!
//! From format 4 on, sled holds what can still change: records claimed by
//! a call in flight or escalated to a person, and the escalation index.
//! A record that settles (no claim, no escalation) moves to a table at the
//! next checkpoint and leaves sled (`settle.rs`); the audit stream goes to
//! audit files and never enters sled. So applying a change to sled is a
//! function of the change alone ([`apply`]): a put of a record that can
//! still change is inserted, a put of a settled record or a removal
//! removes the key, events are not sled's. A cut or a crash in the middle
//! of applying is repaired by applying the same units again.
//!
//! sled's files change only here: when the journal opens (replaying the
//! log) and at a checkpoint. In between, changes live in the log (durable)
//! and in the store's in-memory overlay (visible). After applying,
//! [`sync_sled`] makes sled's files durable — its data file, its blob
//! files and their directory, its snapshots and the journal directory
//! (sled fsyncs none of the blobs, nor any directory) — before the
//! manifest says so. That is not enough on its own: sled counts its own
//! writes stable after `sync_file_range`, so a later power cut can still
//! damage what this made durable; the journal's image and log repair it
//! (`image.rs`, `repair.rs`). Journals of formats 2 and 3 kept everything
//! in sled; `legacy.rs` opens and converts them.

use std::fs::{self, File};
use std::path::Path;

use crate::digest::{self, Digest};
use crate::stored;
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
    /// Makes the next content check panic, as sled does on some damage.
    #[cfg(test)]
    pub panic_in_scan: std::sync::atomic::AtomicBool,
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
            panic_in_scan: Default::default(),
        })
    }

    pub(super) fn tree(&self, t: Tree) -> &sled::Tree {
        &self.trees[t as usize]
    }
}

/// Whether a record's stored bytes (`stored.rs`) say it can still change:
/// claimed by a call, or escalated. Such records live in sled; the others
/// are settled and live in tables. Bytes whose header does not decode stay
/// in sled, where a read reports them, rather than in a table.
pub(super) fn unsettled(value: &[u8]) -> bool {
    stored::parse(value).map_or(true, |(h, _)| h.unsettled())
}

/// Whether `tree`'s entry with this value belongs in sled.
pub(super) fn in_sled(tree: Tree, value: &[u8]) -> bool {
    tree == Tree::Escalations || unsettled(value)
}

/// What applying units found.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Applied {
    /// The units' digest changes, folded.
    pub delta: Digest,
    pub last_lsn: Option<u64>,
    pub last_seq: Option<u64>,
    /// The highest truncation bound among them.
    pub truncated: Option<u64>,
    pub units: usize,
}

/// Applies what `units` change in sled, in order (see the module docs).
pub(super) fn apply<'a>(
    trees: &Trees,
    units: impl IntoIterator<Item = &'a Unit>,
) -> Result<Applied, Failed> {
    let mut applied = Applied::default();
    for unit in units {
        applied.delta.apply(unit.xor, unit.count);
        applied.last_lsn = Some(unit.lsn);
        applied.units += 1;
        for change in &unit.changes {
            match change {
                Change::Put { tree, key, value } => {
                    if in_sled(*tree, value) {
                        trees.tree(*tree).insert(key, value.as_slice())?;
                    } else {
                        trees.tree(*tree).remove(key)?;
                    }
                }
                Change::Remove { tree, key } => {
                    trees.tree(*tree).remove(key)?;
                }
                Change::Event { seq, .. } => applied.last_seq = Some(*seq),
                Change::Truncate { before } => {
                    applied.truncated = applied.truncated.max(Some(*before));
                }
            }
        }
    }
    Ok(applied)
}

/// Removes from sled what a journal of format 3 kept there and format 4
/// keeps elsewhere (settled records, audit buckets), after its conversion
/// put all of it into tables and audit files. Idempotent.
pub(super) fn purge_legacy(trees: &Trees) -> Result<u64, Failed> {
    let mut removed = 0;
    for tree in [Tree::Ops, Tree::Steps] {
        let mut doomed = Vec::new();
        for item in trees.tree(tree).iter() {
            let (k, v) = item?;
            if !unsettled(&v) {
                doomed.push(k);
            }
        }
        for k in doomed {
            trees.tree(tree).remove(k)?;
            removed += 1;
        }
    }
    let buckets: Vec<_> = trees.audit.iter().keys().collect::<Result<_, _>>()?;
    for k in buckets {
        trees.audit.remove(k)?;
        removed += 1;
    }
    Ok(removed)
}

/// The digest of everything sled holds. Reads every entry: sled holds
/// only what can still change, so this is small whatever the journal's
/// history.
pub(super) fn scan_digest(trees: &Trees) -> Result<Digest, Failed> {
    #[cfg(test)]
    if trees
        .panic_in_scan
        .swap(false, std::sync::atomic::Ordering::Relaxed)
    {
        panic!("injected: cannot find pid 9 in view_for_key");
    }
    let mut d = Digest::default();
    for t in Tree::ALL {
        for item in trees.tree(t).iter() {
            let (k, v) = item?;
            d.add(digest::entry_hash(t as u8, &k, &v));
        }
    }
    Ok(d)
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

    fn record(owner: bool, escalated: bool) -> Vec<u8> {
        let h = stored::Header {
            version: 1,
            epoch: 1,
            owner: owner.then(|| idem_journal::journal::Owner {
                worker: "w".into(),
                incarnation: 1,
            }),
            escalated,
        };
        stored::encode(&h, b"body")
    }

    #[test]
    fn sled_keeps_what_can_still_change_and_lets_settled_records_go() {
        let (_dir, t) = trees();
        let unit = |lsn, changes| Unit {
            lsn,
            xor: 0,
            count: 0,
            changes,
        };
        let put = |key: &[u8], value: Vec<u8>| Change::Put {
            tree: Tree::Ops,
            key: key.to_vec(),
            value,
        };
        let units = vec![
            unit(
                1,
                vec![
                    put(b"a", record(true, false)),
                    put(b"b", record(false, true)),
                ],
            ),
            unit(
                2,
                vec![
                    put(b"c", record(false, false)),
                    Change::Event {
                        seq: 7,
                        bytes: b"e".to_vec(),
                    },
                    Change::Truncate { before: 3 },
                ],
            ),
            // a settles: it leaves sled.
            unit(3, vec![put(b"a", record(false, false))]),
        ];
        let applied = apply(&t, &units).unwrap();
        assert_eq!((applied.last_seq, applied.truncated), (Some(7), Some(3)));
        let ops = t.tree(Tree::Ops);
        assert_eq!(ops.get(b"a").unwrap(), None);
        assert!(ops.get(b"b").unwrap().is_some());
        assert_eq!(ops.get(b"c").unwrap(), None);
        assert!(t.audit.is_empty());
        // Applying the same units again changes nothing.
        apply(&t, &units).unwrap();
        assert_eq!(ops.len(), 1);
    }

    #[test]
    fn a_panic_of_sled_while_the_content_is_checked_reaches_the_caller() {
        let (_dir, t) = trees();
        t.tree(Tree::Ops).insert(b"k", &b"v"[..]).unwrap();
        let mut expected = Digest::default();
        expected.add(digest::entry_hash(Tree::Ops as u8, b"k", b"v"));
        assert_eq!(scan_digest(&t).unwrap(), expected);
        // sled panics on some damage; the open turns that into an error
        // (`repair::catch_sled_panic`) only if the panic reaches it.
        t.panic_in_scan
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scan_digest(&t)));
        let panic = caught.expect_err("the panic went missing");
        assert!(
            panic_text(&panic).contains("injected"),
            "{}",
            panic_text(&panic)
        );
    }
}
