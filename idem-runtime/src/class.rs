//! Tool classes and the descriptor every `#[tool]` registers.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::retry::RetryPolicy;

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

/// Checks an operator's `Landed` result (JSON) against a tool's result type
/// and encodes it as the journal stores results.
pub type LandedCheck = fn(&serde_json::Value) -> Result<Vec<u8>, String>;

/// Everything idem knows about one tool, fixed at compile time by
/// `#[tool]`. Every tool in a binary is listed by [`tools`].
#[derive(Debug)]
pub struct ToolDescriptor {
    /// Stable tool id; part of every key.
    pub name: &'static str,
    /// The tool's class.
    pub class: Class,
    /// The declared key fields, in key order.
    pub key_fields: &'static [&'static str],
    /// How long the provider keeps idempotency keys (provider class).
    pub dedupe_window: Duration,
    /// The retry policy.
    pub retry: RetryPolicy,
    /// Per-attempt timeout; an attempt that overruns is ambiguous.
    pub timeout: Option<Duration>,
    /// Same key, different arguments.
    pub on_drift: OnDrift,
    /// Arguments never written to the journal.
    pub redact: &'static [&'static str],
    /// The `verify` function's path as written, if any.
    pub verify: Option<&'static str>,
    /// Checks an operator's `Landed` result against the tool's result type
    /// and encodes it as the journal stores results; `None` for read-only
    /// tools (and hand-built descriptors that do not set it).
    pub check_landed: Option<LandedCheck>,
    /// Where the tool is defined.
    pub module_path: &'static str,
    /// Source file of the definition.
    pub file: &'static str,
    /// Source line of the definition.
    pub line: u32,
}

impl ToolDescriptor {
    /// Stripe's v1 retention of idempotency keys: the default dedupe window.
    pub const DEFAULT_DEDUPE_WINDOW: Duration = Duration::from_secs(24 * 3600);

    /// A descriptor with the defaults, for runtime-level tests and hand-built
    /// tools; `#[tool]` fills every field itself.
    pub const fn new(name: &'static str, class: Class) -> Self {
        ToolDescriptor {
            name,
            class,
            key_fields: &[],
            dedupe_window: Self::DEFAULT_DEDUPE_WINDOW,
            retry: RetryPolicy::DEFAULT,
            timeout: None,
            on_drift: OnDrift::Replay,
            redact: &[],
            verify: None,
            check_landed: None,
            module_path: "",
            file: "",
            line: 0,
        }
    }
}

#[doc(hidden)]
pub struct RegisteredTool(pub &'static ToolDescriptor);

inventory::collect!(RegisteredTool);

/// Every tool compiled into this binary, in no particular order.
pub fn tools() -> impl Iterator<Item = &'static ToolDescriptor> {
    inventory::iter::<RegisteredTool>.into_iter().map(|r| r.0)
}

/// Refuses two tools of one name in this binary: they would share keys, and
/// one would replay the other's results.
pub(crate) fn check_unique_names() -> Result<(), crate::Error> {
    let mut seen: std::collections::HashMap<&'static str, &'static ToolDescriptor> =
        std::collections::HashMap::new();
    let site = |t: &ToolDescriptor| format!("{} ({}:{})", t.module_path, t.file, t.line);
    for t in tools() {
        if let Some(first) = seen.insert(t.name, t) {
            if !std::ptr::eq(first, t) {
                let (mut a, mut b) = (site(first), site(t));
                if b < a {
                    std::mem::swap(&mut a, &mut b);
                }
                return Err(crate::Error::DuplicateTool {
                    name: t.name.to_string(),
                    first: a,
                    second: b,
                });
            }
        }
    }
    Ok(())
}
