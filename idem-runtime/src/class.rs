//! Tool classes and the descriptor every `#[tool]` registers.

use std::time::Duration;

use crate::retry::RetryPolicy;
use idem_journal::class::{Class, OnDrift};
use idem_journal::error::Error;
use idem_journal::journal::Durability;

/// Checks an operator's `Landed` result (JSON) against a tool's result type
/// and encodes it as the journal stores results.
pub type LandedCheck = fn(&serde_json::Value) -> Result<Vec<u8>, String>;

/// Everything idem knows about one tool, fixed at compile time by
/// `#[tool]`. Every tool in a binary is listed by [`tools`].
///
/// It grows with idem (`#[non_exhaustive]`): build one with
/// [`ToolDescriptor::new`] and the `with_*` methods (all `const`, so the
/// result can be a `static`), as `#[tool]` does.
#[derive(Debug)]
#[non_exhaustive]
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
    /// `on_drift(reject = "a, b")`: the arguments whose change refuses a
    /// drifted call (`ArgsMismatch`) under [`OnDrift::Replay`]; a change
    /// of any other argument replays. Empty: as `on_drift` says.
    pub drift_reject: &'static [&'static str],
    /// Arguments never written to the journal.
    pub redact: &'static [&'static str],
    /// The `verify` function's path as written, if any.
    pub verify: Option<&'static str>,
    /// Checks an operator's `Landed` result against the tool's result type
    /// and encodes it as the journal stores results; `None` for read-only
    /// tools (and hand-built descriptors that do not set it).
    pub check_landed: Option<LandedCheck>,
    /// How durable the COMMITTED record of an attempt is when the caller
    /// gets the result (`commit = "eventual"`: [`Durability::Eventual`],
    /// for provider and journal tools).
    pub commit: Durability,
    /// `approve = ...`: `"always"`, or the policy function's path as
    /// written; `None`: no call of the tool needs a person's approval.
    pub approve: Option<&'static str>,
    /// `approval_wait = ...`: how long a call that needs approval waits
    /// for the decision before it returns `ToolError::AwaitingApproval`
    /// (zero: at once, the deferred style).
    pub approval_wait: Duration,
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
            drift_reject: &[],
            redact: &[],
            verify: None,
            check_landed: None,
            commit: Durability::Immediate,
            approve: None,
            approval_wait: Duration::ZERO,
            module_path: "",
            file: "",
            line: 0,
        }
    }

    /// With these key fields, in key order.
    pub const fn with_key_fields(mut self, key_fields: &'static [&'static str]) -> Self {
        self.key_fields = key_fields;
        self
    }

    /// With this dedupe window (provider class).
    pub const fn with_dedupe_window(mut self, window: Duration) -> Self {
        self.dedupe_window = window;
        self
    }

    /// With this retry policy.
    pub const fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// With this per-attempt timeout.
    pub const fn with_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.timeout = timeout;
        self
    }

    /// With this drift policy.
    pub const fn with_on_drift(mut self, on_drift: OnDrift) -> Self {
        self.on_drift = on_drift;
        self
    }

    /// With these arguments whose change refuses a drifted call (see
    /// [`drift_reject`](Self::drift_reject)).
    pub const fn with_drift_reject(mut self, fields: &'static [&'static str]) -> Self {
        self.drift_reject = fields;
        self
    }

    /// With these arguments never written to the journal.
    pub const fn with_redact(mut self, redact: &'static [&'static str]) -> Self {
        self.redact = redact;
        self
    }

    /// With the `verify` function's path as written.
    pub const fn with_verify(mut self, verify: Option<&'static str>) -> Self {
        self.verify = verify;
        self
    }

    /// With this check of an operator's `Landed` result.
    pub const fn with_check_landed(mut self, check: Option<LandedCheck>) -> Self {
        self.check_landed = check;
        self
    }

    /// With this durability of the COMMITTED record.
    pub const fn with_commit(mut self, commit: Durability) -> Self {
        self.commit = commit;
        self
    }

    /// With this approval policy (`"always"` or the policy's path) and
    /// wait for the decision.
    pub const fn with_approval(mut self, approve: Option<&'static str>, wait: Duration) -> Self {
        self.approve = approve;
        self.approval_wait = wait;
        self
    }

    /// Defined at this module, file and line.
    pub const fn defined_at(
        mut self,
        module_path: &'static str,
        file: &'static str,
        line: u32,
    ) -> Self {
        self.module_path = module_path;
        self.file = file;
        self.line = line;
        self
    }
}

#[doc(hidden)]
pub struct RegisteredTool(pub &'static ToolDescriptor);

inventory::collect!(RegisteredTool);

/// Every tool compiled into this binary, in no particular order.
pub fn tools() -> impl Iterator<Item = &'static ToolDescriptor> {
    inventory::iter::<RegisteredTool>.into_iter().map(|r| r.0)
}

/// Refuses two tools of one name in this binary. A tool's name is part of
/// every key, so two tools sharing one (`a::send` and `b::send`, both keyed
/// on `id`) would share keys: the second would replay the first's result
/// without running. `#[tool]` makes such a binary fail to link; this check
/// catches what gets past that (hand-registered descriptors, exotic
/// builds) before any call is made.
pub(crate) fn check_unique_names() -> Result<(), Error> {
    unique_names(tools())
}

fn unique_names<'a>(tools: impl Iterator<Item = &'a ToolDescriptor>) -> Result<(), Error> {
    let mut all: Vec<&ToolDescriptor> = tools.collect();
    // Sorted by name, then by place: the error names the same pair, in the
    // same order, on every run.
    all.sort_by_key(|t| (t.name, t.module_path, t.file, t.line));
    let place = |t: &ToolDescriptor| format!("{} ({}:{})", t.module_path, t.file, t.line);
    for pair in all.windows(2) {
        let (first, second) = (pair[0], pair[1]);
        if first.name == second.name && !std::ptr::eq(first, second) {
            return Err(Error::DuplicateTool {
                name: first.name.to_string(),
                first: place(first),
                second: place(second),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(name: &'static str, module_path: &'static str, line: u32) -> ToolDescriptor {
        ToolDescriptor {
            module_path,
            file: "src/lib.rs",
            line,
            ..ToolDescriptor::new(name, Class::Provider)
        }
    }

    #[test]
    fn two_tools_of_one_name_are_refused_naming_both() {
        let tools = [
            at("b::send", "app::b", 9),
            at("send", "app::sms", 30),
            at("charge", "app", 1),
            at("send", "app::mail", 12),
        ];
        let err = unique_names(tools.iter()).unwrap_err();
        let Error::DuplicateTool {
            name,
            first,
            second,
        } = &err
        else {
            panic!("{err:?}");
        };
        assert_eq!(name, "send");
        assert_eq!(first, "app::mail (src/lib.rs:12)");
        assert_eq!(second, "app::sms (src/lib.rs:30)");
        let text = err.to_string();
        assert!(text.contains("\"send\""), "{text}");
        assert!(text.contains("app::mail (src/lib.rs:12)"), "{text}");
        assert!(text.contains("app::sms (src/lib.rs:30)"), "{text}");
    }

    #[test]
    fn distinct_names_pass() {
        let tools = [at("Mailer::send", "app", 1), at("Sms::send", "app", 2)];
        unique_names(tools.iter()).unwrap();
        unique_names(std::iter::empty()).unwrap();
    }
}
