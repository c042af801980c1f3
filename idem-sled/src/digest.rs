//! A running content digest of the sled journal, so that damage in sled's
//! own files cannot read as absence.
//!
//! sled 0.34 treats a corrupt entry of its log as the log's end: a flipped
//! byte can silently drop committed records. So the journal keeps, beside
//! sled, the XOR of a 64-bit hash of every entry (tree, key, value; every
//! audit event) and their count: each log unit carries the change it makes
//! to both, each checkpoint writes their value at that point, and opening
//! recomputes them from what sled holds after the log is replayed. Any
//! difference — an entry lost, changed or resurrected — refuses the open.
//!
//! The hash is not cryptographic (nobody forges damage); it only has to
//! make an accidental cancellation in the XOR vanishingly unlikely (2^-64).

/// Hash of one entry: a domain byte (the tree, or the audit stream), the
/// key and the value, length-delimited.
pub(super) fn entry_hash(domain: u8, key: &[u8], value: &[u8]) -> u64 {
    let mut h = Hasher::new(domain);
    h.bytes(key);
    h.bytes(value);
    h.finish()
}

/// The domain of audit events.
pub(super) const AUDIT: u8 = 0xa0;

/// A small multiply-rotate hash over 8-byte words (in the spirit of
/// wyhash/rapidhash), finished with the splitmix64 mixer. Stable across
/// platforms and releases: it is stored.
struct Hasher {
    state: u64,
}

const K0: u64 = 0x9e37_79b9_7f4a_7c15;
const K1: u64 = 0xbf58_476d_1ce4_e5b9;
const K2: u64 = 0x94d0_49bb_1331_11eb;

fn mix(a: u64, b: u64) -> u64 {
    let m = (a as u128).wrapping_mul(b as u128);
    (m as u64) ^ ((m >> 64) as u64)
}

impl Hasher {
    fn new(domain: u8) -> Self {
        Hasher {
            state: K0 ^ u64::from(domain).wrapping_mul(K1),
        }
    }

    fn word(&mut self, w: u64) {
        self.state = mix(self.state ^ w, K1).wrapping_add(K2);
    }

    fn bytes(&mut self, b: &[u8]) {
        self.word(b.len() as u64);
        let mut chunks = b.chunks_exact(8);
        for c in &mut chunks {
            self.word(u64::from_le_bytes(c.try_into().unwrap_or_default()));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            self.word(u64::from_le_bytes(last));
        }
    }

    fn finish(self) -> u64 {
        mix64(self.state)
    }
}

/// The splitmix64 finisher: a bijection of u64 that spreads every input
/// bit over the output (also the tables' Bloom filter hash).
pub(super) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(K1);
    z = (z ^ (z >> 27)).wrapping_mul(K2);
    z ^ (z >> 31)
}

/// The digest of a set of entries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Digest {
    pub xor: u64,
    pub count: i64,
}

impl Digest {
    /// Adds or removes one entry (XOR is its own inverse; the count says
    /// which).
    pub(super) fn add(&mut self, hash: u64) {
        self.xor ^= hash;
        self.count += 1;
    }

    pub(super) fn remove(&mut self, hash: u64) {
        self.xor ^= hash;
        self.count -= 1;
    }

    /// Folds in a unit's recorded change.
    pub(super) fn apply(&mut self, xor: u64, count: i64) {
        self.xor ^= xor;
        self.count += count;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PINNED_EMPTY: u64 = 17348942358112051039;
    const PINNED_AUDIT: u64 = 10295132204325586594;

    #[test]
    fn the_hash_is_pinned() {
        // Stored in checkpoints and log units: a change here makes every
        // existing journal refuse to open.
        assert_eq!(entry_hash(0, b"", b""), PINNED_EMPTY);
        assert_eq!(entry_hash(AUDIT, b"k", b"0123456789"), PINNED_AUDIT);
        let a = entry_hash(0, b"key", b"value");
        assert_ne!(a, entry_hash(1, b"key", b"value"), "domain matters");
        assert_ne!(a, entry_hash(0, b"keyv", b"alue"), "boundaries matter");
        assert_ne!(a, entry_hash(0, b"key", b"valuf"));
        assert_ne!(entry_hash(0, &[0; 8], b""), entry_hash(0, &[0; 7], b""));
    }

    #[test]
    fn add_and_remove_cancel() {
        let mut d = Digest::default();
        d.add(entry_hash(0, b"a", b"1"));
        d.add(entry_hash(0, b"b", b"2"));
        d.remove(entry_hash(0, b"a", b"1"));
        let mut only_b = Digest::default();
        only_b.add(entry_hash(0, b"b", b"2"));
        assert_eq!(d, only_b);
    }
}
