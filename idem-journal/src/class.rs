//! Tool classes ([`Class`]) and what a tool does about drifting arguments
//! ([`OnDrift`]): both are stored in records, so they live here.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What a retry of a tool can do to the real world, and therefore how the
/// engine treats it.
///
/// | class | on an unknown outcome | dedupe |
/// |---|---|---|
/// | `ReadOnly` | retry freely | none needed |
/// | `Provider` | retry with the same key | the provider, on our key |
/// | `Journal` | `verify` with the provider, then re-run only if it did not land | idem's journal |
/// | `AtMostOnce` | never retry: escalate to a human | idem's journal |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// Reads only; a retry duplicates nothing. No journal, no key.
    ReadOnly,
    /// The provider deduplicates on our key (Stripe's `Idempotency-Key`).
    Provider,
    /// The provider does not deduplicate; idem's journal does, and `verify`
    /// reads the provider before re-running an unknown outcome.
    Journal,
    /// Never retried automatically once the request may have been sent;
    /// unknown outcomes are parked for a human.
    AtMostOnce,
}

impl Class {
    /// The name used in `#[tool(class = "...")]`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Class::ReadOnly => "read_only",
            Class::Provider => "provider",
            Class::Journal => "journal",
            Class::AtMostOnce => "at_most_once",
        }
    }

    /// Whether calls of this class are journaled.
    pub fn is_journaled(&self) -> bool {
        !matches!(self, Class::ReadOnly)
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What to do when a key is seen again with different full arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnDrift {
    /// Keep the first operation (replay or recover it) and record an
    /// `ArgsDrift` audit event.
    Replay,
    /// Refuse the call with `ToolError::ArgsMismatch` (Stripe's behaviour).
    Reject,
}
