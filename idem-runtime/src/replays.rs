//! Committed results this runtime has seen, so that a replay needs no
//! journal read (with a shared database, no round trip).
//!
//! A result committed by the call itself or learned by `verify` is final:
//! nothing changes it afterwards (an operator amends only what an operator
//! decided, and those are not kept here). So a cached entry can only be
//! stale by being *older* than retention — a pruned operation that would
//! otherwise run afresh replays instead, which is the cautious side. The
//! cache is small and bounded; it holds the stored bytes, not the value.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use crate::journal::Digest;
use crate::leaders::DigestKey;
use idem_journal::class::Class;

/// How many results are kept by default.
pub(crate) const CAPACITY: usize = 4096;

/// One committed operation.
#[derive(Clone)]
pub(crate) struct Replay {
    pub tool: &'static str,
    pub class: Class,
    pub generation: u32,
    pub fingerprint: [u8; 32],
    pub result: Bytes,
}

/// The longest result kept in the entry itself.
const INLINE: usize = 22;

/// A committed result's stored bytes. Most results are small (an id, a
/// number, a short receipt) and live in the entry; a larger one is shared.
/// An evicted entry then frees nothing: with a result of its own on the
/// heap, evicting it reached for memory untouched since 4096 calls ago (a
/// cache miss on every fresh call) and freed it.
#[derive(Clone)]
pub(crate) enum Bytes {
    Inline { len: u8, bytes: [u8; INLINE] },
    Shared(Arc<[u8]>),
}

impl Bytes {
    pub(crate) fn new(bytes: &[u8]) -> Bytes {
        if bytes.len() <= INLINE {
            let mut inline = [0; INLINE];
            inline[..bytes.len()].copy_from_slice(bytes);
            Bytes::Inline {
                len: bytes.len() as u8,
                bytes: inline,
            }
        } else {
            Bytes::Shared(Arc::from(bytes))
        }
    }
}

impl std::ops::Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Bytes::Shared(bytes) => bytes,
        }
    }
}

pub(crate) struct Replays {
    inner: Mutex<Inner>,
    capacity: usize,
}

impl Default for Replays {
    fn default() -> Self {
        Replays::with_capacity(CAPACITY)
    }
}

#[derive(Default)]
struct Inner {
    by_key: HashMap<DigestKey, Replay>,
    /// Insertion order, for eviction.
    order: VecDeque<DigestKey>,
}

impl Replays {
    /// A cache of at most `capacity` results (0: none).
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Replays {
            inner: Mutex::default(),
            capacity,
        }
    }

    /// The committed result of `key`, if known, for this exact tool and
    /// class (anything else takes the journal's path, which reports it).
    pub(crate) fn get(&self, key: &Digest, tool: &str, class: Class) -> Option<Replay> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner
            .by_key
            .get(&DigestKey(*key))
            .filter(|r| r.tool == tool && r.class == class)
            .cloned()
    }

    pub(crate) fn put(&self, key: Digest, replay: Replay) {
        if self.capacity == 0 {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let key = DigestKey(key);
        if inner.by_key.insert(key, replay).is_none() {
            inner.order.push_back(key);
            if inner.order.len() > self.capacity {
                if let Some(old) = inner.order.pop_front() {
                    inner.by_key.remove(&old);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replay(tool: &'static str) -> Replay {
        Replay {
            tool,
            class: Class::Journal,
            generation: 0,
            fingerprint: [0; 32],
            result: Bytes::new(b"r"),
        }
    }

    #[test]
    fn bounded_and_exact_about_the_tool() {
        let r = Replays::default();
        r.put([1; 32], replay("a"));
        assert!(r.get(&[1; 32], "a", Class::Journal).is_some());
        assert!(r.get(&[1; 32], "b", Class::Journal).is_none());
        assert!(r.get(&[1; 32], "a", Class::Provider).is_none());
        for i in 0..CAPACITY as u32 + 1 {
            let mut k = [0; 32];
            k[..4].copy_from_slice(&i.to_be_bytes());
            k[31] = 9;
            r.put(k, replay("a"));
        }
        assert!(
            r.get(&[1; 32], "a", Class::Journal).is_none(),
            "the oldest went"
        );
        assert_eq!(r.inner.lock().unwrap().by_key.len(), CAPACITY);
    }

    #[test]
    fn results_are_kept_whole_inline_or_shared() {
        for len in [0, 1, INLINE - 1, INLINE, INLINE + 1, 1000] {
            let stored: Vec<u8> = (0..len).map(|i| (i * 7 + 1) as u8).collect();
            let bytes = Bytes::new(&stored);
            assert_eq!(&*bytes, &stored[..], "{len}");
            assert_eq!(&*bytes.clone(), &stored[..], "{len}");
            assert_eq!(
                matches!(bytes, Bytes::Inline { .. }),
                len <= INLINE,
                "{len}"
            );
        }
    }
}
