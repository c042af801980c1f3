//! The providers' own record of every effect: the ground truth a harness
//! compares against to find duplicated or lost operations.

use std::collections::BTreeMap;
use std::fmt::{Debug, Display};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

/// A ledger record: one effect a provider applied.
pub trait Effect: Clone + Debug + Serialize + Send + Sync + 'static {
    /// The logical operation the effect belongs to; an operation applied
    /// more than once is a duplicate.
    type Operation: Ord + Clone + Debug + Display;

    /// The operation of this record, or `None` when the record is not a
    /// real effect (a declined charge moves no money).
    fn operation(&self) -> Option<Self::Operation>;
}

/// A logical operation applied more than once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Duplicate {
    /// Which provider applied it (`payments`, `email`, `tickets`, `wire`).
    pub provider: String,
    /// The operation, e.g. `order_id=4711`.
    pub operation: String,
    /// How many times it was applied.
    pub count: usize,
}

/// An append-only list of records, shared between a provider's server and
/// its handle.
#[derive(Debug)]
pub(crate) struct Ledger<E>(Arc<Mutex<Vec<E>>>);

impl<E> Clone for Ledger<E> {
    fn clone(&self) -> Self {
        Ledger(Arc::clone(&self.0))
    }
}

impl<E> Default for Ledger<E> {
    fn default() -> Self {
        Ledger(Arc::default())
    }
}

impl<E: Effect> Ledger<E> {
    fn lock(&self) -> MutexGuard<'_, Vec<E>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends the record built from the current length (for sequential ids)
    /// under one lock, so ids never repeat under concurrency.
    pub fn push_with(&self, make: impl FnOnce(usize) -> E) -> E {
        let mut records = self.lock();
        let record = make(records.len());
        records.push(record.clone());
        record
    }

    pub fn snapshot(&self) -> Vec<E> {
        self.lock().clone()
    }

    pub fn filter(&self, keep: impl Fn(&E) -> bool) -> Vec<E> {
        self.lock().iter().filter(|r| keep(r)).cloned().collect()
    }

    pub fn counts(&self) -> BTreeMap<E::Operation, usize> {
        let mut counts = BTreeMap::new();
        for op in self.lock().iter().filter_map(Effect::operation) {
            *counts.entry(op).or_insert(0) += 1;
        }
        counts
    }

    pub fn duplicates(&self) -> Vec<(E::Operation, usize)> {
        self.counts().into_iter().filter(|(_, n)| *n > 1).collect()
    }
}
