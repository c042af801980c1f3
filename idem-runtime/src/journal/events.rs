//! How the sled journal stores the audit stream: events are appended in
//! memory (and to the write-ahead log, which makes them durable), then moved
//! into sled by the flusher as one value per batch, keyed by the batch's
//! first sequence number.
//!
//! sled splits a leaf every 16 entries; one insert per event made audit
//! appends the most expensive part of a call. One insert per batch moves that
//! work off the caller's path and shares it among every event of a group
//! commit.
//!
//! Batch value: frames `[seq: u64 BE][length: u32 LE][event bytes]`.

use crate::error::Error;

/// One event: its sequence number and its bytes.
pub(super) type Event = (u64, Vec<u8>);

pub(super) fn encode_batch(events: &[Event]) -> Vec<u8> {
    let mut out = Vec::with_capacity(events.iter().map(|e| 12 + e.1.len()).sum());
    for (seq, bytes) in events {
        out.extend_from_slice(&seq.to_be_bytes());
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(bytes);
    }
    out
}

pub(super) fn decode_batch(mut bytes: &[u8]) -> Result<Vec<Event>, String> {
    let mut events = Vec::new();
    while !bytes.is_empty() {
        if bytes.len() < 12 {
            return Err(format!("{} stray bytes after the last event", bytes.len()));
        }
        let seq = u64::from_be_bytes(bytes[..8].try_into().unwrap_or_default());
        let len = u32::from_le_bytes(bytes[8..12].try_into().unwrap_or_default()) as usize;
        let body = bytes.get(12..12 + len).ok_or_else(|| {
            format!(
                "event {seq} claims {len} bytes, {} remain",
                bytes.len() - 12
            )
        })?;
        events.push((seq, body.to_vec()));
        bytes = &bytes[12 + len..];
    }
    Ok(events)
}

/// The highest sequence number stored in `tree`.
pub(super) fn last_seq(tree: &sled::Tree) -> Result<Option<u64>, String> {
    match tree.last().map_err(|e| e.to_string())? {
        None => Ok(None),
        Some((_, v)) => Ok(decode_batch(&v)?.last().map(|e| e.0)),
    }
}

/// Events from `from` on: those in sled, then the in-memory tail. Events of
/// the tail that the flusher has meanwhile copied into sled are read once.
pub(super) fn scan(
    tree: &sled::Tree,
    tail: Vec<Event>,
    from: u64,
    location: String,
) -> impl Iterator<Item = Result<(Vec<u8>, Vec<u8>), Error>> + Send {
    let tail_first = tail.first().map_or(u64::MAX, |e| e.0);
    // The batch that holds `from` starts at or before it.
    let start = tree
        .range(..=from.to_be_bytes())
        .next_back()
        .and_then(Result::ok)
        .map_or_else(|| from.to_be_bytes().to_vec(), |(k, _)| k.to_vec());
    let stored = tree.range(start..).flat_map(move |item| {
        let batch = item
            .map_err(|e| Error::storage("scan audit", &location, e))
            .and_then(|(k, v)| {
                decode_batch(&v).map_err(|detail| Error::Corrupt {
                    what: "audit batch",
                    location: location.clone(),
                    key: crate::key::hex(&k),
                    detail,
                })
            });
        let events: Vec<Result<Event, Error>> = match batch {
            Ok(events) => events.into_iter().map(Ok).collect(),
            Err(e) => vec![Err(e)],
        };
        events
    });
    stored
        .filter(move |e| {
            e.as_ref()
                .map_or(true, |(seq, _)| *seq >= from && *seq < tail_first)
        })
        .chain(
            tail.into_iter()
                .filter(move |(seq, _)| *seq >= from)
                .map(Ok),
        )
        .map(|e| e.map(|(seq, bytes)| (seq.to_be_bytes().to_vec(), bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_round_trip_and_reject_garbage() {
        let events = vec![(7, b"abc".to_vec()), (9, vec![]), (10, vec![1; 300])];
        let bytes = encode_batch(&events);
        assert_eq!(decode_batch(&bytes).unwrap(), events);
        for cut in 1..bytes.len() {
            let decoded = decode_batch(&bytes[..cut]);
            // A cut exactly at an event boundary is a shorter valid batch.
            if let Ok(prefix) = decoded {
                assert!(prefix.len() < events.len() && events.starts_with(&prefix));
            }
        }
    }

    #[test]
    fn scan_joins_stored_and_tail_without_gaps_or_repeats() {
        let dir = tempfile::TempDir::new().unwrap();
        let db = sled::open(dir.path()).unwrap();
        let tree = db.open_tree("audit").unwrap();
        let ev = |s: u64| (s, s.to_be_bytes().to_vec());
        tree.insert(1u64.to_be_bytes(), encode_batch(&[ev(1), ev(2), ev(3)]))
            .unwrap();
        tree.insert(5u64.to_be_bytes(), encode_batch(&[ev(5), ev(6)]))
            .unwrap();
        // The tail's first events were already copied into sled (5, 6).
        let tail = vec![ev(5), ev(6), ev(8)];
        let seqs = |from| -> Vec<u64> {
            scan(&tree, tail.clone(), from, "mem".into())
                .map(|e| u64::from_be_bytes(e.unwrap().0.try_into().unwrap()))
                .collect()
        };
        assert_eq!(seqs(0), [1, 2, 3, 5, 6, 8]);
        assert_eq!(seqs(2), [2, 3, 5, 6, 8]);
        assert_eq!(seqs(4), [5, 6, 8]);
        assert_eq!(seqs(7), [8]);
        assert_eq!(seqs(9), Vec::<u64>::new());
        assert_eq!(last_seq(&tree).unwrap(), Some(6));
    }
}
