//! [`CrashPoint`]: where in a call a process can die.

use std::fmt;

/// A moment in one journaled call at which the process may die, in the
/// order a call passes them. The first operation (the first INTENT) the
/// call writes is the one they refer to.
///
/// | point | durable when it dies | the provider |
/// |---|---|---|
/// | [`BeforeIntent`](CrashPoint::BeforeIntent) | nothing | not called |
/// | [`AfterIntent`](CrashPoint::AfterIntent) | the INTENT | not called |
/// | [`AfterProvider`](CrashPoint::AfterProvider) | the INTENT | called, answered |
/// | [`AfterCommit`](CrashPoint::AfterCommit) | the COMMIT | called, answered; the caller never saw the result |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum CrashPoint {
    /// While the INTENT is being written: the write never reaches the
    /// disk.
    BeforeIntent,
    /// Right after the INTENT is durable, before the provider is called.
    AfterIntent,
    /// After the provider answered, before the COMMIT is written: the
    /// effect may have happened, the journal does not say so.
    AfterProvider,
    /// Right after the COMMIT write returned (durable, unless the tool says
    /// `commit = "eventual"`), before the call returns to its caller.
    AfterCommit,
}

impl CrashPoint {
    /// Every crash point, in the order a call passes them.
    pub const ALL: [CrashPoint; 4] = [
        CrashPoint::BeforeIntent,
        CrashPoint::AfterIntent,
        CrashPoint::AfterProvider,
        CrashPoint::AfterCommit,
    ];

    /// `before_intent`, `after_intent`, `after_provider` or `after_commit`.
    pub fn name(self) -> &'static str {
        match self {
            CrashPoint::BeforeIntent => "before_intent",
            CrashPoint::AfterIntent => "after_intent",
            CrashPoint::AfterProvider => "after_provider",
            CrashPoint::AfterCommit => "after_commit",
        }
    }

    /// What the point means, in a few words.
    pub fn describe(self) -> &'static str {
        match self {
            CrashPoint::BeforeIntent => "the INTENT not yet durable",
            CrashPoint::AfterIntent => "the INTENT durable, the provider not called",
            CrashPoint::AfterProvider => "the provider answered, the COMMIT not written",
            CrashPoint::AfterCommit => "the COMMIT written, the result not returned",
        }
    }

    /// Whether the INTENT survives a crash at this point (the restarted
    /// call finds an operation whose owner died, or a committed one).
    pub fn intent_durable(self) -> bool {
        !matches!(self, CrashPoint::BeforeIntent)
    }
}

impl fmt::Display for CrashPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.describe())
    }
}
