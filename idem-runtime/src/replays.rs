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
    pub result: Arc<[u8]>,
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
    by_key: HashMap<Digest, Replay>,
    /// Insertion order, for eviction.
    order: VecDeque<Digest>,
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
            .get(key)
            .filter(|r| r.tool == tool && r.class == class)
            .cloned()
    }

    pub(crate) fn put(&self, key: Digest, replay: Replay) {
        if self.capacity == 0 {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
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
            result: Arc::from(&b"r"[..]),
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
}
