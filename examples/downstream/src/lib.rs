//! A downstream crate's tool: a refund through a payments API that
//! deduplicates on the idempotency key (`class = "provider"`), and a fake
//! of that API for tests, with its ledger.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use idem::{tool, Classify, Ctx, Failure};

/// The payments API's refusals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefundError {
    /// The API refused the refund.
    Declined,
}

impl Classify for RefundError {
    fn classify(&self) -> Failure {
        match self {
            RefundError::Declined => Failure::Semantic,
        }
    }
}

/// A fake payments API: refunds by idempotency key, deduplicated (or, to
/// show what the crash matrix catches, not).
#[derive(Clone, Debug)]
pub struct FakePayments {
    refunds: Arc<Mutex<BTreeMap<String, u64>>>,
    applied: Arc<Mutex<usize>>,
    dedupe: bool,
}

impl FakePayments {
    /// An API that replays a key it has seen, as Stripe does.
    pub fn new() -> FakePayments {
        FakePayments {
            refunds: Arc::default(),
            applied: Arc::default(),
            dedupe: true,
        }
    }

    /// An API that refunds again on every request (a bug for a
    /// `provider` tool).
    pub fn without_dedupe() -> FakePayments {
        FakePayments {
            dedupe: false,
            ..FakePayments::new()
        }
    }

    /// Refunds `cents` under `key`; the refund's id.
    pub fn refund(&self, key: &str, cents: u64) -> u64 {
        let mut refunds = self.refunds.lock().unwrap();
        if self.dedupe && refunds.contains_key(key) {
            return refunds[key];
        }
        let mut applied = self.applied.lock().unwrap();
        *applied += 1;
        let id = *applied as u64;
        refunds.insert(key.to_string(), id);
        let _ = cents;
        id
    }

    /// How many refunds really happened.
    pub fn refunds_made(&self) -> usize {
        *self.applied.lock().unwrap()
    }
}

impl Default for FakePayments {
    fn default() -> FakePayments {
        FakePayments::new()
    }
}

/// Refunds part of an order, once whatever the retries.
#[tool(class = "provider", key = "order_id")]
pub async fn refund(
    ctx: &Ctx,
    payments: FakePayments,
    order_id: u64,
    cents: u64,
) -> Result<u64, RefundError> {
    Ok(payments.refund(ctx.idempotency_key().as_str(), cents))
}
