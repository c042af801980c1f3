//! A checkpoint: what the log since the last one holds, moved to where it
//! lives from then on.
//!
//! The units of the segments a checkpoint covers are folded into the last
//! value of each key and the events they logged, then:
//!
//! 1. records that settled (no claim, no escalation) and removals go into
//!    a new table, sorted by key; events at or above the floor into a new
//!    audit file; both fsynced, then the directory;
//! 2. sled receives what can still change (puts of unsettled records, the
//!    escalation index) and loses what settled or was removed, and is made
//!    durable (`apply::sync_sled`);
//! 3. a new manifest names the new files (and no longer names audit files
//!    wholly below the floor), with sled's digest moved by the units'
//!    changes, and replaces the old one atomically and durably.
//!
//! Until 3 the old manifest is in force: it names neither new file (they
//! are removed at the next open as leftovers), and the log it points after
//! still holds every unit, so the next open (or checkpoint) settles them
//! again. Step 2 is idempotent (`apply.rs`), so sled having received some
//! of it before a crash changes nothing. The files the new manifest drops
//! are deleted by the caller once it is written.

use std::path::Path;

use crate::apply::{self, Failed, Trees};
use crate::digest::Digest;
use crate::files::{AuditMeta, Manifest, TableMeta};
use crate::wal::{Change, Tree, Unit};
use crate::{audit, table};

/// What a checkpoint wrote.
#[derive(Debug)]
pub(super) struct Settled {
    /// The new table, if any record settled or was removed.
    pub table: Option<TableMeta>,
    /// The new audit file, if any event was logged.
    pub audit: Option<AuditMeta>,
    /// The units' changes to sled's digest, folded.
    pub delta: Digest,
    pub last_lsn: Option<u64>,
    pub last_seq: Option<u64>,
    /// The highest truncation bound the units logged.
    pub truncated: Option<u64>,
}

/// The units a checkpoint covers, gathered as they are read: their puts,
/// removals and events, and what they say of the log. Units are added one
/// segment at a time, so a checkpoint holds this and one segment, not its
/// whole log: this is at most the segments' bytes without their framing
/// (every put is kept, not only the last of each key).
///
/// The byte strings are copied into one arena rather than each into an
/// allocation of its own (a checkpoint of one 8 MiB segment gathers some
/// 50,000 of them), and the last value of each key is found once, by a
/// sort, in [`write()`].
#[derive(Debug, Default)]
pub(super) struct Fold {
    /// Every key, value and event's bytes, one after the other.
    arena: Vec<u8>,
    /// Every put (`Some` value) and removal (`None`), in log order.
    changes: Vec<(Tree, Span, Option<Span>)>,
    events: Vec<(u64, Span)>,
    delta: Digest,
    last_lsn: Option<u64>,
    last_seq: Option<u64>,
    truncated: Option<u64>,
}

/// Where a byte string lies in a fold's arena.
#[derive(Debug, Clone, Copy)]
struct Span {
    at: usize,
    len: usize,
}

impl Span {
    fn of(self, arena: &[u8]) -> &[u8] {
        &arena[self.at..self.at + self.len]
    }
}

impl Fold {
    /// Makes room for what a segment of `bytes` bytes can add (at most
    /// that much), so the arena grows once per segment, not by doubling.
    pub(super) fn reserve(&mut self, bytes: usize) {
        self.arena.reserve(bytes);
    }

    fn keep(&mut self, bytes: &[u8]) -> Span {
        let at = self.arena.len();
        self.arena.extend_from_slice(bytes);
        Span {
            at,
            len: bytes.len(),
        }
    }

    /// Adds the next unit, in log order.
    pub(super) fn add<B: AsRef<[u8]>>(&mut self, unit: &Unit<B>) {
        self.delta.apply(unit.xor, unit.count);
        self.last_lsn = Some(unit.lsn);
        for change in &unit.changes {
            match change {
                Change::Put { tree, key, value } => {
                    let key = self.keep(key.as_ref());
                    let value = self.keep(value.as_ref());
                    self.changes.push((*tree, key, Some(value)));
                }
                Change::Remove { tree, key } => {
                    let key = self.keep(key.as_ref());
                    self.changes.push((*tree, key, None));
                }
                Change::Event { seq, bytes } => {
                    self.last_seq = Some(*seq);
                    let bytes = self.keep(bytes.as_ref());
                    self.events.push((*seq, bytes));
                }
                Change::Truncate { before } => {
                    self.truncated = self.truncated.max(Some(*before));
                }
            }
        }
    }

    /// Every unit of `units`, in order.
    pub(super) fn of(units: impl IntoIterator<Item = Unit>) -> Fold {
        let mut f = Fold::default();
        for u in units {
            f.add(&u);
        }
        f
    }
}

/// The last change of each key among `changes` (in log order), sorted by
/// tree and key: its value, or `None` if that change removed it.
fn finals(arena: &[u8], mut changes: Vec<(Tree, Span, Option<Span>)>) -> Vec<Final<'_>> {
    // Stable: a key's changes stay in log order, its last one last.
    changes.sort_by(|a, b| (a.0, a.1.of(arena)).cmp(&(b.0, b.1.of(arena))));
    let same = |a: &(Tree, Span, Option<Span>), b: &(Tree, Span, Option<Span>)| {
        a.0 == b.0 && a.1.of(arena) == b.1.of(arena)
    };
    let mut out = Vec::with_capacity(changes.len());
    for (i, c) in changes.iter().enumerate() {
        if changes.get(i + 1).is_none_or(|next| !same(c, next)) {
            out.push((c.0, c.1.of(arena), c.2.map(|v| v.of(arena))));
        }
    }
    out
}

/// A key's last change: tree, key, value (`None`: removed).
type Final<'a> = (Tree, &'a [u8], Option<&'a [u8]>);

/// Steps 1 and 2 of the module docs for the folded units: the files get
/// ids from `next_file` on (advanced past those used); events below
/// `floor` (or below a truncation among the units) are left out.
pub(super) fn write(
    dir: &Path,
    trees: &Trees,
    fold: Fold,
    floor: u64,
    next_file: &mut u64,
) -> Result<Settled, Failed> {
    let io = |e: std::io::Error| Failed::Io(e.to_string());
    let Fold {
        arena,
        changes,
        events,
        delta,
        last_lsn,
        last_seq,
        truncated,
    } = fold;
    let mut settled = Settled {
        table: None,
        audit: None,
        delta,
        last_lsn,
        last_seq,
        truncated,
    };
    let floor = settled.truncated.map_or(floor, |t| t.max(floor));
    let finals = finals(&arena, changes);

    // 1. The files.
    let entries: Vec<(table::Key, Option<&[u8]>)> = finals
        .iter()
        .filter(|(tree, _, _)| *tree != Tree::Escalations)
        .filter_map(|&(tree, key, value)| {
            let digest: [u8; 32] = key.try_into().ok()?;
            match value {
                Some(v) if apply::unsettled(v) => None,
                _ => Some((table::key(tree as u8, &digest), value)),
            }
        })
        .collect();
    if !entries.is_empty() {
        let id = *next_file;
        *next_file += 1;
        let mut w = table::Writer::create(dir, id, entries.len() as u64).map_err(io)?;
        for (k, v) in &entries {
            w.add(k, *v).map_err(io)?;
        }
        let written = w.finish().map_err(io)?;
        settled.table = Some(TableMeta {
            id: written.id,
            entries: written.entries,
            removals: written.removals,
            bytes: written.bytes,
        });
    }
    // Sequence numbers grow with the log (and a number reused after a
    // crash replaced a unit that never became durable), so the events are
    // in order; only a truncation can leave some out.
    let events: Vec<(u64, &[u8])> = events
        .iter()
        .filter(|(seq, _)| *seq >= floor)
        .map(|&(seq, bytes)| (seq, bytes.of(&arena)))
        .collect();
    if !events.is_empty() {
        let id = *next_file;
        *next_file += 1;
        let written = audit::write(dir, id, events.iter().copied()).map_err(io)?;
        settled.audit = Some(AuditMeta {
            id: written.id,
            first: written.first,
            last: written.last,
            events: written.events,
            bytes: written.bytes,
        });
    }
    if settled.table.is_some() || settled.audit.is_some() {
        crate::wal::sync_dir(dir).map_err(io)?;
    }

    // 2. sled.
    drop(entries);
    drop(events);
    for (tree, key, value) in finals {
        let t = trees.tree(tree);
        match value {
            Some(v) if apply::in_sled(tree, v) => {
                t.insert(key, v)?;
            }
            _ => {
                t.remove(key)?;
            }
        }
    }
    apply::sync_sled(dir, trees).map_err(io)?;
    Ok(settled)
}

/// Step 3's manifest: `prev` moved past `settled`, covering the log up to
/// segment `gen`. Returns it and the audit files it no longer names
/// (wholly below the floor), to delete once it is durable.
pub(super) fn next_manifest(
    prev: &Manifest,
    settled: &Settled,
    gen: u64,
    next_file: u64,
) -> (Manifest, Vec<u64>) {
    let mut m = prev.clone();
    m.gen = gen;
    let mut digest = prev.digest();
    digest.apply(settled.delta.xor, settled.delta.count);
    m.xor = digest.xor;
    m.count = digest.count;
    if let Some(s) = settled.last_seq {
        m.next_seq = m.next_seq.max(s + 1);
    }
    if let Some(l) = settled.last_lsn {
        m.next_lsn = m.next_lsn.max(l + 1);
    }
    if let Some(t) = settled.truncated {
        m.floor = m.floor.max(t);
    }
    m.next_file = m.next_file.max(next_file);
    m.tables.extend(settled.table);
    m.audit.extend(settled.audit);
    let floor = m.floor;
    let dropped = m
        .audit
        .iter()
        .filter(|a| a.last < floor)
        .map(|a| a.id)
        .collect();
    m.audit.retain(|a| a.last >= floor);
    (m, dropped)
}

/// Removes files the manifest no longer names (after it is durable).
/// Failing leaves garbage the next open removes.
pub(super) fn remove_files(dir: &Path, audit_ids: &[u64], table_ids: &[u64]) {
    let mut removed = false;
    for id in audit_ids {
        removed |= std::fs::remove_file(audit::path(dir, *id)).is_ok();
    }
    for id in table_ids {
        removed |= std::fs::remove_file(table::path(dir, *id)).is_ok();
    }
    if removed {
        let _ = crate::wal::sync_dir(dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(lsn: u64, changes: Vec<Change<&[u8]>>) -> Unit<&[u8]> {
        Unit {
            lsn,
            xor: lsn,
            count: 1,
            changes,
        }
    }

    fn put<'a>(tree: Tree, key: &'a [u8], value: &'a [u8]) -> Change<&'a [u8]> {
        Change::Put { tree, key, value }
    }

    #[test]
    fn a_fold_keeps_the_last_change_of_each_key_sorted_and_every_event_in_order() {
        let mut fold = Fold::default();
        fold.add(&unit(
            1,
            vec![
                put(Tree::Steps, b"b", b"intent"),
                put(Tree::Ops, b"z", b"1"),
                Change::Event {
                    seq: 7,
                    bytes: b"e7",
                },
            ],
        ));
        // Owned units (the open's) fold the same way.
        fold.add(&Unit {
            lsn: 2,
            xor: 2,
            count: 1,
            changes: vec![
                Change::Put {
                    tree: Tree::Steps,
                    key: b"b".to_vec(),
                    value: b"committed".to_vec(),
                },
                Change::Remove {
                    tree: Tree::Ops,
                    key: b"z".to_vec(),
                },
            ],
        });
        fold.add(&unit(
            3,
            vec![
                put(Tree::Ops, b"a", b"only"),
                // The same key in another tree is another key.
                put(Tree::Escalations, b"b", b""),
                put(Tree::Ops, b"z", b"again"),
                Change::Event {
                    seq: 8,
                    bytes: b"e8",
                },
                Change::Truncate { before: 5 },
            ],
        ));
        let Fold {
            arena,
            changes,
            events,
            last_lsn,
            last_seq,
            truncated,
            ..
        } = fold;
        assert_eq!(
            finals(&arena, changes),
            [
                (Tree::Ops, &b"a"[..], Some(&b"only"[..])),
                (Tree::Ops, &b"z"[..], Some(&b"again"[..])),
                (Tree::Steps, &b"b"[..], Some(&b"committed"[..])),
                (Tree::Escalations, &b"b"[..], Some(&b""[..])),
            ]
        );
        let events: Vec<(u64, &[u8])> = events.iter().map(|&(s, b)| (s, b.of(&arena))).collect();
        assert_eq!(events, [(7, &b"e7"[..]), (8, &b"e8"[..])]);
        assert_eq!((last_lsn, last_seq, truncated), (Some(3), Some(8), Some(5)));

        // A removal that comes last wins as well.
        let mut fold = Fold::default();
        fold.add(&unit(1, vec![put(Tree::Ops, b"k", b"v")]));
        fold.add(&unit(
            2,
            vec![Change::Remove {
                tree: Tree::Ops,
                key: b"k",
            }],
        ));
        assert_eq!(
            finals(&fold.arena, fold.changes),
            [(Tree::Ops, &b"k"[..], None)]
        );
    }
}
