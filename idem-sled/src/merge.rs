//! Merging tables, so that a read consults few of them.
//!
//! Each checkpoint adds a table; left alone, a read of an old record (or
//! of a new key, which must be found absent) would consult them all. The
//! store merges tables in the background, newest first, tiered by size:
//! once [`FANOUT`] of the newest tables share a size class, they become
//! one table of the next class. A record is rewritten once per class it
//! climbs (about log4 of the journal's size in checkpoints), a read
//! consults at most about `(FANOUT - 1)` tables per class, and tables
//! always cover consecutive stretches of time, so "newest table wins"
//! stays true after a merge. A merge that includes the oldest table drops
//! removals (nothing older is left for them to hide), and every merge
//! drops entries a newer input replaced.
//!
//! The merged table is written and fsynced like a checkpoint's, then a
//! manifest naming it instead of its inputs replaces the old one; the
//! inputs are deleted after that (readers holding them keep reading the
//! open files). A crash before the manifest leaves the inputs in force
//! and the merged file as a leftover the next open removes.

use std::path::Path;
use std::sync::Arc;

use crate::files::TableMeta;
use crate::table::{self, Key, ReadError, Table};

/// How many tables of one size class are merged into one.
pub(super) const FANOUT: usize = 4;

/// Entries below which a table is of the smallest class.
const BASE: u64 = 16 << 10;

fn class(entries: u64) -> u32 {
    let mut class = 0;
    let mut cap = BASE;
    while entries >= cap && cap < u64::MAX / 4 {
        class += 1;
        cap *= FANOUT as u64;
    }
    class
}

/// Which tables (of `tables`, oldest first) to merge next, if any: all of
/// them once a quarter of their entries are removals (retention removed
/// that much: a merge of everything drops the removals and what they
/// hide); else the newest ones of the newest table's size class or below,
/// once there are [`FANOUT`] of them.
pub(super) fn pick(tables: &[TableMeta]) -> Option<std::ops::Range<usize>> {
    let entries: u64 = tables.iter().map(|t| t.entries).sum();
    let removals: u64 = tables.iter().map(|t| t.removals).sum();
    if tables.len() >= 2 && removals > 0 && removals * 4 >= entries {
        return Some(0..tables.len());
    }
    let newest = class(tables.last()?.entries);
    let run = tables
        .iter()
        .rev()
        .take_while(|t| class(t.entries) <= newest)
        .count();
    (run >= FANOUT).then(|| tables.len() - run..tables.len())
}

/// Merges `inputs` (consecutive tables, oldest first) into table `id`;
/// `oldest` says the first input is the journal's oldest table (removals
/// are then dropped). Returns what it wrote, fsynced (not its directory
/// entry).
pub(super) fn merge(
    dir: &Path,
    inputs: &[Arc<Table>],
    id: u64,
    oldest: bool,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<TableMeta, MergeError> {
    let expected: u64 = inputs.iter().map(|t| t.entries).sum();
    let mut w = table::Writer::create(dir, id, expected).map_err(MergeError::Io)?;
    let mut iters: Vec<_> = inputs.iter().map(|t| t.iter_after(None)).collect();
    let mut heads: Vec<Option<Entry>> = Vec::with_capacity(iters.len());
    for (i, it) in iters.iter_mut().enumerate() {
        heads.push(next(it, &inputs[i])?);
    }
    let mut n = 0u64;
    // The smallest key among the heads; of equal keys, the newest input's
    // entry wins.
    while let Some(min) = heads.iter().flatten().map(|(k, _)| *k).min() {
        let mut winner = None;
        for i in 0..heads.len() {
            if heads[i].as_ref().is_some_and(|(k, _)| *k == min) {
                let (_, v) = heads[i].take().expect("head present");
                winner = Some(v);
                heads[i] = next(&mut iters[i], &inputs[i])?;
            }
        }
        match winner.flatten() {
            Some(v) => w.add(&min, Some(&v)).map_err(MergeError::Io)?,
            None if oldest => {}
            None => w.add(&min, None).map_err(MergeError::Io)?,
        }
        n += 1;
        if n.is_multiple_of(4096) && stop.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(MergeError::Stopped);
        }
    }
    let written = w.finish().map_err(MergeError::Io)?;
    Ok(TableMeta {
        id: written.id,
        entries: written.entries,
        removals: written.removals,
        bytes: written.bytes,
    })
}

/// An entry of a table: a key and its value (`None`: a removal).
type Entry = (Key, Option<Vec<u8>>);

fn next(it: &mut table::Iter<'_>, t: &Table) -> Result<Option<Entry>, MergeError> {
    match it.next() {
        None => Ok(None),
        Some(Ok(e)) => Ok(Some(e)),
        Some(Err(e)) => Err(MergeError::Read(t.path.clone(), e)),
    }
}

/// Why a merge did not finish.
#[derive(Debug)]
pub(super) enum MergeError {
    /// An input is damaged or unreadable.
    Read(std::path::PathBuf, ReadError),
    /// Writing the merged table failed.
    Io(std::io::Error),
    /// The journal is closing.
    Stopped,
}

impl std::fmt::Display for MergeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MergeError::Read(p, e) => write!(f, "{}: {e}", p.display()),
            MergeError::Io(e) => write!(f, "writing the merged table: {e}"),
            MergeError::Stopped => f.write_str("the journal is closing"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{Found, Writer};
    use std::sync::atomic::AtomicBool;

    fn meta(entries: u64) -> TableMeta {
        TableMeta {
            id: 0,
            entries,
            removals: 0,
            bytes: 0,
        }
    }

    #[test]
    fn tables_merge_four_at_a_time_by_size_class() {
        let small = meta(10_000);
        assert_eq!(pick(&[small; 3]), None);
        assert_eq!(pick(&[small; 4]), Some(0..4));
        // A large table behind four small ones stays out of their merge.
        let big = meta(4_000_000);
        assert_eq!(pick(&[big, small, small, small, small]), Some(1..5));
        assert_eq!(pick(&[big, small, small, small]), None);
        // Classes climb: four of the next class merge too.
        let mid = meta(40_000);
        assert_eq!(pick(&[big, mid, mid, mid, mid]), Some(1..5));
        assert_eq!(pick(&[mid, mid, mid, small]), None);
        assert_eq!(pick(&[]), None);
        // Retention removed a quarter of everything: all of it merges.
        let pruned = TableMeta {
            removals: 2_500,
            ..small
        };
        assert_eq!(pick(&[big, mid, pruned]), None);
        let pruned = TableMeta {
            removals: 1_500_000,
            entries: 1_500_000,
            ..small
        };
        assert_eq!(pick(&[big, mid, pruned]), Some(0..3));
    }

    fn key(n: u8) -> Key {
        table::key(0, &[n; 32])
    }

    fn write(dir: &Path, id: u64, entries: &[(u8, Option<&[u8]>)]) -> Arc<Table> {
        let mut w = Writer::create(dir, id, entries.len() as u64).unwrap();
        for (k, v) in entries {
            w.add(&key(*k), *v).unwrap();
        }
        let written = w.finish().unwrap();
        Arc::new(Table::open(dir, id, Some(written.bytes)).unwrap())
    }

    #[test]
    fn the_newest_entry_wins_and_removals_go_only_with_the_oldest_table() {
        let dir = tempfile::tempdir().unwrap();
        let old = write(
            dir.path(),
            1,
            &[(1, Some(b"a1")), (2, Some(b"b1")), (3, Some(b"c1"))],
        );
        let mid = write(dir.path(), 2, &[(2, None), (4, Some(b"d2"))]);
        let new = write(dir.path(), 3, &[(3, Some(b"c3")), (5, None)]);
        let stop = AtomicBool::new(false);
        let inputs = [old.clone(), mid.clone(), new.clone()];
        let m = merge(dir.path(), &inputs, 10, false, &stop).unwrap();
        let t = Table::open(dir.path(), 10, Some(m.bytes)).unwrap();
        let all: Vec<_> = t.iter_after(None).map(|e| e.unwrap()).collect();
        assert_eq!(
            all,
            vec![
                (key(1), Some(b"a1".to_vec())),
                (key(2), None),
                (key(3), Some(b"c3".to_vec())),
                (key(4), Some(b"d2".to_vec())),
                (key(5), None),
            ]
        );
        // With the oldest table in the merge, removals have nothing left
        // to hide.
        let m = merge(dir.path(), &inputs, 11, true, &stop).unwrap();
        let t = Table::open(dir.path(), 11, Some(m.bytes)).unwrap();
        assert_eq!(t.entries, 3);
        assert_eq!(t.get(&key(2)).unwrap(), Found::No);
        assert_eq!(t.get(&key(3)).unwrap(), Found::Value(b"c3".to_vec()));
    }
}
