//! What the machine is told about a tool and about the journal it runs on:
//! constants for the length of a call.

use std::time::Duration;

use idem_journal::class::{Class, OnDrift};
use idem_journal::journal::{Durability, Owner};

use crate::retry::RetryPolicy;

/// A tool's rules, as the machine applies them.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// The tool's class.
    pub class: Class,
    /// Its retry budget and backoff.
    pub retry: RetryPolicy,
    /// How long the provider remembers a key (provider class).
    pub dedupe_window: Duration,
    /// Per-attempt timeout, if any.
    pub timeout: Option<Duration>,
    /// Same key, other arguments.
    pub on_drift: OnDrift,
    /// Under [`OnDrift::Replay`], the arguments whose change refuses the
    /// call all the same (`on_drift(reject = "a, b")`).
    pub drift_reject: &'static [&'static str],
    /// Whether the tool has a `verify` function.
    pub verify: bool,
    /// How durable the COMMITTED record is when the caller gets the result
    /// (`commit = "eventual"`: [`Durability::Eventual`]).
    pub commit: Durability,
    /// How long a call that needs approval waits for the decision before
    /// it returns `AwaitingApproval`, in ms (`approval_wait`; 0: at once).
    pub approval_wait_ms: u64,
}

/// What the machine is told about the journal and the runtime.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Setup {
    /// Who this runtime's claims belong to.
    pub owner: Owner,
    /// Whether a key is claimed before it is read
    /// (`Journal::claim_first`).
    pub claim_first: bool,
    /// How often claims are renewed, in ms, for journals whose claims are
    /// leases (`Journal::renewal`).
    pub renewal_ms: Option<u64>,
    /// How long a call waits for another call of its key, in ms.
    pub in_flight_wait_ms: u64,
}

/// The largest arguments (canonical JSON) a call may record. Checked before
/// the INTENT: a call over it fails without calling the provider.
pub const MAX_ARGS_BYTES: usize = 16 << 20;

/// The largest result plus arguments a record holds (a margin below the
/// largest record the journal writes).
pub(crate) const MAX_RECORD_PAYLOAD: usize = idem_journal::record::LARGE_LIMIT - (1 << 20);
