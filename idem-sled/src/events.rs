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
//! Frames: `[seq: u64 BE][length: u32 LE][event bytes]`, in sequence order.
//! A bucket value is [`DEFLATED`], the frames' length (u32 LE) and the
//! frames compressed with raw deflate. The events of a bucket repeat their
//! tool, worker, run and agent, and each key two or three times;
//! compressed, they take about a third of the bytes, in sled and in every
//! later read of it. Format 2 of the journal stored buckets of 32 numbers
//! as plain frames (whose first byte is the top byte of a sequence number,
//! 0 below 2^56); they still decode, and opening such a journal rewrites
//! them (`apply::regroup`). Only sled holds buckets: the log and the image
//! hold events one by one, and the content digest covers each event's own
//! bytes, so it does not depend on how a bucket is stored.

use crate::deflate::{self, Deflater};

/// The first byte of a compressed bucket. A frame-format bucket starts with
/// the top byte of its first sequence number, which never reaches this.
pub(super) const DEFLATED: u8 = 0xdf;

/// How hard to compress: deflate's fastest level. Buckets are small (a
/// hundred events or so) and the last one is rewritten at each checkpoint
/// until full, on the checkpointer's thread, which also serves the log.
const LEVEL: u8 = 1;

/// The largest a bucket's frames may claim to be: far above any real one
/// (sled's values stay below its blob threshold), low enough that a
/// damaged length cannot make a read allocate without bound.
const MAX_FRAMES: usize = 64 << 20;

/// Sequence numbers per bucket: small enough that a bucket stays far below
/// sled's blob threshold (≈128 KiB per page) with typical events, large
/// enough that inflating one is mostly inflating, not building its code
/// tables (at 32, opening spent a third of its time in those).
pub(super) const BUCKET: u64 = 128;

/// One event: its sequence number and its bytes.
pub(super) type Event = (u64, Vec<u8>);

/// The key of the bucket holding `seq`.
pub(super) fn bucket_of(seq: u64) -> u64 {
    seq - seq % BUCKET
}

/// Encodes a bucket as this build stores it: compressed.
pub(super) fn encode_bucket(events: &[Event]) -> Vec<u8> {
    Packer::new().encode(events)
}

/// Compresses buckets one after another with one compressor (see
/// [`Deflater`]).
pub(super) struct Packer {
    deflate: Deflater,
    frames: Vec<u8>,
}

impl Packer {
    pub(super) fn new() -> Packer {
        Packer {
            deflate: Deflater::new(LEVEL),
            frames: Vec::new(),
        }
    }

    /// The stored form of `events`: [`DEFLATED`], the frames' length, the
    /// frames compressed.
    pub(super) fn encode(&mut self, events: &[Event]) -> Vec<u8> {
        self.frames.clear();
        write_frames(&mut self.frames, events);
        let mut out = Vec::with_capacity(64 + self.frames.len() / 2);
        out.push(DEFLATED);
        out.extend_from_slice(&(self.frames.len() as u32).to_le_bytes());
        self.deflate.compress_into(&self.frames, &mut out);
        out
    }
}

/// The frames of a bucket, uncompressed (format 2's bucket value).
#[cfg(any(test, feature = "fuzzing"))]
pub(super) fn encode_frames(events: &[Event]) -> Vec<u8> {
    let mut out = Vec::with_capacity(events.iter().map(|e| 12 + e.1.len()).sum());
    write_frames(&mut out, events);
    out
}

fn write_frames(out: &mut Vec<u8>, events: &[Event]) {
    for (seq, bytes) in events {
        out.extend_from_slice(&seq.to_be_bytes());
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(bytes);
    }
}

/// Decodes a bucket in either form; anything but a whole sequence of
/// frames (after inflating, of exactly the length it claims) is an error.
pub(super) fn decode_bucket(bytes: &[u8]) -> Result<Vec<Event>, String> {
    let mut events = Vec::new();
    visit_bucket(bytes, |seq, body| events.push((seq, body.to_vec())))?;
    Ok(events)
}

/// Calls `f` with each event of a bucket in either form, in order, without
/// copying them (the content check reads every event of the journal); the
/// same checks as [`decode_bucket`], which may fail after some calls.
pub(super) fn visit_bucket(bytes: &[u8], f: impl FnMut(u64, &[u8])) -> Result<(), String> {
    match bytes.split_first() {
        Some((&DEFLATED, rest)) => {
            let (len, packed) = rest
                .split_first_chunk::<4>()
                .ok_or("a compressed bucket cut short in its length")?;
            let len = u32::from_le_bytes(*len) as usize;
            let frames = deflate::inflate_exact(packed, len, MAX_FRAMES, "a compressed bucket")?;
            visit_frames(&frames, f)
        }
        _ => visit_frames(bytes, f),
    }
}

fn visit_frames(mut bytes: &[u8], mut f: impl FnMut(u64, &[u8])) -> Result<(), String> {
    let mut prev: Option<u64> = None;
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
        if prev.is_some_and(|p| p >= seq) {
            return Err(format!("event {seq} out of order"));
        }
        prev = Some(seq);
        f(seq, body);
        bytes = &bytes[12 + len..];
    }
    Ok(())
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
        let bytes = encode_frames(&events);
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
        let events = [(9, vec![]), (7, vec![])];
        assert!(decode_bucket(&encode_frames(&events)).is_err());
        assert!(decode_bucket(&encode_bucket(&events)).is_err());
    }

    #[test]
    fn both_forms_decode_and_compression_pays() {
        // Events as a bucket holds them: the same tool, run and key again
        // and again, as the audit trail's events are.
        let events: Vec<Event> = (32..64)
            .map(|seq| {
                let body = format!("intent send_email run-7 key-{:04} worker-a", seq / 3);
                (seq, body.into_bytes())
            })
            .collect();
        let frames = encode_frames(&events);
        let packed = encode_bucket(&events);
        assert_eq!(packed[0], DEFLATED);
        assert_eq!(decode_bucket(&frames).unwrap(), events);
        assert_eq!(decode_bucket(&packed).unwrap(), events);
        // One packer for bucket after bucket writes what a fresh one does.
        let mut packer = Packer::new();
        let other = [(1, vec![9; 5000]), (2, b"x".to_vec())];
        assert_eq!(packer.encode(&other), encode_bucket(&other));
        assert_eq!(packer.encode(&events), packed);
        assert_eq!(packer.encode(&[]), encode_bucket(&[]));
        assert_eq!(decode_bucket(&packer.encode(&[])).unwrap(), vec![]);
        assert!(
            packed.len() * 2 < frames.len(),
            "{} compressed bytes of {}",
            packed.len(),
            frames.len()
        );
    }

    #[test]
    fn every_cut_of_a_compressed_bucket_is_rejected() {
        let events = vec![(7, b"abc".to_vec()), (9, vec![]), (10, vec![1; 300])];
        let bytes = encode_bucket(&events);
        // Cut at zero is the empty bucket, valid in either form.
        for cut in 1..bytes.len() {
            assert!(
                decode_bucket(&bytes[..cut]).is_err(),
                "cut at {cut} of {} must be rejected",
                bytes.len()
            );
        }
    }

    #[test]
    fn hostile_compressed_buckets_are_rejected() {
        let events = vec![(7, b"abc".to_vec()), (10, vec![1; 300])];
        let good = encode_bucket(&events);
        let with_len = |len: u32| {
            let mut b = good.clone();
            b[1..5].copy_from_slice(&len.to_le_bytes());
            b
        };
        let real = u32::from_le_bytes(good[1..5].try_into().unwrap());
        // A length past the bound is refused before anything is allocated.
        let err = decode_bucket(&with_len(u32::MAX)).unwrap_err();
        assert!(err.contains("claims"), "{err}");
        // One byte short: the stream holds more than it claims.
        assert!(decode_bucket(&with_len(real - 1)).is_err());
        // One byte long: the stream ends before the length it claims.
        assert!(decode_bucket(&with_len(real + 1)).is_err());
        // A stream that is not deflate at all.
        let mut junk = good[..5].to_vec();
        junk.extend_from_slice(&[0xff; 40]);
        assert!(decode_bucket(&junk).is_err());
        // A stream that inflates well to bytes that are not frames.
        let mut not_frames = vec![DEFLATED];
        let inner = vec![0xab; 11];
        not_frames.extend_from_slice(&(inner.len() as u32).to_le_bytes());
        not_frames.extend(miniz_oxide::deflate::compress_to_vec(&inner, LEVEL));
        let err = decode_bucket(&not_frames).unwrap_err();
        assert!(err.contains("stray"), "{err}");
    }

    #[test]
    fn merging_is_idempotent() {
        let mut bucket = vec![(1, vec![1]), (3, vec![3])];
        merge(&mut bucket, vec![(2, vec![2]), (3, vec![3])]);
        merge(&mut bucket, vec![(2, vec![2])]);
        assert_eq!(bucket, vec![(1, vec![1]), (2, vec![2]), (3, vec![3])]);
        assert_eq!(bucket_of(129), 128);
        assert_eq!(bucket_of(127), 0);
    }
}
