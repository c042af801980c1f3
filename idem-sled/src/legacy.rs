//! Journals of formats 2 and 3, and their conversion to tables (format 4's
//! layout, marked as the current format).
//!
//! Before format 4 sled held everything: every record, and the audit
//! stream in buckets (`events.rs`), with a content digest over all of it
//! checked at every open. Such a journal is opened as it always was
//! (`repair.rs` with these functions: its log applied the old way, its
//! whole content checked, its damage repaired from its image), then
//! converted once ([`convert`]): its settled records written into one
//! table and its events into one audit file, both fsynced, a manifest
//! naming them written (marked `legacy_sled`: sled still holds copies),
//! `idem-meta` marked the current format, and the copies removed from
//! sled. A crash anywhere in between leaves either the old journal (no
//! manifest yet, or a manifest nobody reads because the metadata still
//! says 3: the conversion starts over) or the new one (a manifest marked
//! `legacy_sled`, whose next open removes the copies before it checks
//! sled against the manifest's digest).

use std::collections::BTreeMap;
use std::path::Path;

use crate::apply::{unsettled, Applied, Failed, Trees};
use crate::digest::{self, Digest};
use crate::events::{self, Event};
use crate::files::{AuditMeta, Checkpoint, Manifest, TableMeta};
use crate::wal::{Change, Tree, Unit};
use crate::{audit, table};

/// Applies `units`, in order, to sled, as formats 2 and 3 did: every
/// record and every event into sled.
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

/// The digest of everything sled holds in a journal of format 2 or 3, and
/// the last audit sequence number in it.
pub(super) fn scan_digest(trees: &Trees) -> Result<(Digest, Option<u64>), Failed> {
    // The digest is an XOR and a count, so parts of the content can be
    // read on their own threads and folded in any order: the records on
    // one, the audit stream (most of the bytes, and all the inflating) on
    // another. A panic of sled's on one of them goes on unwinding here, as
    // it would have without the thread.
    std::thread::scope(|scope| {
        let audit = scope.spawn(|| scan_audit(&trees.audit));
        let records = crate::apply::scan_digest(trees);
        let audit = audit
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        let (mut d, last) = audit?;
        let records = records?;
        d.apply(records.xor, records.count);
        Ok((d, last))
    })
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

/// Writes what a checked journal of format 2 or 3 holds in sled (as of
/// checkpoint `cp`, with nothing logged after it) into a table and an
/// audit file, fsynced with the directory, and returns the manifest that
/// names them (not yet written), marked `legacy_sled`.
pub(super) fn convert(dir: &Path, trees: &Trees, cp: &Checkpoint) -> Result<Manifest, Failed> {
    let io = |e: std::io::Error| Failed::Io(e.to_string());
    // Ids start past any file a cut-short conversion left behind (the
    // open removed them, but never reuse a name).
    let mut next_file = 1;
    let mut remainder = Digest::default();
    let mut settled = 0u64;
    for tree in [Tree::Ops, Tree::Steps, Tree::Escalations] {
        for item in trees.tree(tree).iter() {
            let (k, v) = item?;
            if tree == Tree::Escalations || unsettled(&v) {
                remainder.add(digest::entry_hash(tree as u8, &k, &v));
            } else {
                settled += 1;
            }
        }
    }
    let mut tables = Vec::new();
    if settled > 0 {
        let id = next_file;
        next_file += 1;
        let mut w = table::Writer::create(dir, id, settled).map_err(io)?;
        for tree in [Tree::Ops, Tree::Steps] {
            for item in trees.tree(tree).iter() {
                let (k, v) = item?;
                if unsettled(&v) {
                    continue;
                }
                let digest: [u8; 32] = k.as_ref().try_into().map_err(|_| {
                    Failed::Damaged(format!(
                        "a key of sled's {} tree is {} bytes: {}",
                        tree.name(),
                        k.len(),
                        idem_journal::key::hex(&k)
                    ))
                })?;
                w.add(&table::key(tree as u8, &digest), Some(&v))
                    .map_err(io)?;
            }
        }
        let written = w.finish().map_err(io)?;
        tables.push(TableMeta {
            id: written.id,
            entries: written.entries,
            removals: written.removals,
            bytes: written.bytes,
        });
    }
    let mut audit_files = Vec::new();
    let mut buckets = trees.audit.iter();
    let mut pending: std::collections::VecDeque<Event> = Default::default();
    let mut failure = None;
    let events = std::iter::from_fn(|| loop {
        if let Some(e) = pending.pop_front() {
            return Some(e);
        }
        let (k, v) = match buckets.next()? {
            Ok(kv) => kv,
            Err(e) => {
                failure = Some(Failed::from(e));
                return None;
            }
        };
        match events::decode_bucket(&v) {
            Ok(b) => pending.extend(b),
            Err(e) => {
                failure = Some(Failed::Damaged(format!(
                    "audit bucket {}: {e}",
                    idem_journal::key::hex(&k)
                )));
                return None;
            }
        }
    });
    let mut events = events.peekable();
    if events.peek().is_some() {
        let id = next_file;
        next_file += 1;
        let written = audit::write(dir, id, events);
        if let Some(f) = failure.take() {
            return Err(f);
        }
        let written = written.map_err(io)?;
        audit_files.push(AuditMeta {
            id: written.id,
            first: written.first,
            last: written.last,
            events: written.events,
            bytes: written.bytes,
        });
    }
    if let Some(f) = failure {
        return Err(f);
    }
    crate::wal::sync_dir(dir).map_err(io)?;
    Ok(Manifest {
        gen: cp.gen,
        xor: remainder.xor,
        count: remainder.count,
        next_seq: cp.next_seq,
        next_lsn: cp.next_lsn,
        floor: 0,
        next_file,
        tables,
        audit: audit_files,
        legacy_sled: true,
    })
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
