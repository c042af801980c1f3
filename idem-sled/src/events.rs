//! How the sled journal stores the audit stream: events in *buckets* of
//! [`BUCKET`] consecutive sequence numbers, one sled value per bucket keyed
//! by its first number (big-endian).
//!
//! sled splits a leaf every 16 entries; one insert per event made audit
//! appends the most expensive part of a call. A bucket is written once per
//! checkpoint instead. The bucket of an event is a function of its number
//! alone, so applying the same events twice (a checkpoint cut short, then
//! replayed) lands them in the same place: idempotent by construction.
//!
//! Bucket value: frames `[seq: u64 BE][length: u32 LE][event bytes]`, in
//! sequence order.

/// Sequence numbers per bucket: small enough that a bucket stays far below
/// sled's blob threshold (≈128 KiB per page) with typical events.
pub(super) const BUCKET: u64 = 32;

/// One event: its sequence number and its bytes.
pub(super) type Event = (u64, Vec<u8>);

/// The key of the bucket holding `seq`.
pub(super) fn bucket_of(seq: u64) -> u64 {
    seq - seq % BUCKET
}

pub(super) fn encode_bucket(events: &[Event]) -> Vec<u8> {
    let mut out = Vec::with_capacity(events.iter().map(|e| 12 + e.1.len()).sum());
    for (seq, bytes) in events {
        out.extend_from_slice(&seq.to_be_bytes());
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(bytes);
    }
    out
}

/// Decodes a bucket; anything but a whole sequence of frames is an error.
pub(super) fn decode_bucket(mut bytes: &[u8]) -> Result<Vec<Event>, String> {
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
        if events.last().is_some_and(|(prev, _): &Event| *prev >= seq) {
            return Err(format!("event {seq} out of order"));
        }
        events.push((seq, body.to_vec()));
        bytes = &bytes[12 + len..];
    }
    Ok(events)
}

/// Inserts `new` (sorted) into `bucket` (sorted), keeping one copy of each
/// sequence number.
pub(super) fn merge(bucket: &mut Vec<Event>, new: impl IntoIterator<Item = Event>) {
    for e in new {
        match bucket.binary_search_by_key(&e.0, |x| x.0) {
            Ok(_) => {}
            Err(i) => bucket.insert(i, e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_round_trip() {
        let events = vec![(7, b"abc".to_vec()), (9, vec![]), (10, vec![1; 300])];
        assert_eq!(decode_bucket(&encode_bucket(&events)).unwrap(), events);
        assert_eq!(decode_bucket(&[]).unwrap(), vec![]);
    }

    #[test]
    fn every_cut_inside_an_event_is_rejected() {
        let events = vec![(7, b"abc".to_vec()), (9, vec![]), (10, vec![1; 300])];
        let bytes = encode_bucket(&events);
        let boundaries = [0, 15, 27, bytes.len()];
        for cut in 0..bytes.len() {
            let decoded = decode_bucket(&bytes[..cut]);
            if let Some(i) = boundaries.iter().position(|&b| b == cut) {
                // A cut exactly between events is a shorter valid bucket.
                assert_eq!(decoded.unwrap(), events[..i].to_vec(), "cut at {cut}");
            } else {
                assert!(decoded.is_err(), "cut at {cut} must be rejected");
            }
        }
    }

    #[test]
    fn out_of_order_frames_are_rejected() {
        let bytes = encode_bucket(&[(9, vec![]), (7, vec![])]);
        assert!(decode_bucket(&bytes).is_err());
    }

    #[test]
    fn merging_is_idempotent() {
        let mut bucket = vec![(1, vec![1]), (3, vec![3])];
        merge(&mut bucket, vec![(2, vec![2]), (3, vec![3])]);
        merge(&mut bucket, vec![(2, vec![2])]);
        assert_eq!(bucket, vec![(1, vec![1]), (2, vec![2]), (3, vec![3])]);
        assert_eq!(bucket_of(33), 32);
        assert_eq!(bucket_of(31), 0);
    }
}
