//! How a failed call is classified, and what `verify` may answer.

use std::time::Duration;

/// What a failed attempt means for the real world.
///
/// The engine's retry rules are decided by this answer alone, so classify
/// conservatively: when you cannot prove a request never reached the
/// provider, it is [`Failure::Ambiguous`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Failure {
    /// The request provably never reached the provider (connection refused,
    /// DNS failure, a 429 the provider documents as "not processed").
    /// Retrying cannot duplicate anything.
    NotSent {
        /// A delay the provider asked for (e.g. `Retry-After`); the engine
        /// never waits less than this.
        retry_after: Option<Duration>,
    },
    /// The request may have been applied (timeout, connection reset after
    /// the request was written, 5xx). A retry could duplicate the effect
    /// unless something deduplicates it.
    Ambiguous {
        /// A delay the provider asked for; the engine never waits less.
        retry_after: Option<Duration>,
    },
    /// The provider understood and refused the request (declined card,
    /// validation error). Retrying would repeat the same refusal.
    Semantic,
}

impl Failure {
    /// `NotSent` with no requested delay.
    pub const fn not_sent() -> Self {
        Failure::NotSent { retry_after: None }
    }

    /// `Ambiguous` with no requested delay.
    pub const fn ambiguous() -> Self {
        Failure::Ambiguous { retry_after: None }
    }

    /// The delay the provider asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Failure::NotSent { retry_after } | Failure::Ambiguous { retry_after } => *retry_after,
            Failure::Semantic => None,
        }
    }

    /// A short stable label, used in audit events and escalations.
    pub fn label(&self) -> &'static str {
        match self {
            Failure::NotSent { .. } => "not_sent",
            Failure::Ambiguous { .. } => "ambiguous",
            Failure::Semantic => "semantic",
        }
    }
}

/// Implemented by every tool error type: tells the engine what a failure
/// means for the real world. See [`Failure`].
///
/// ```
/// use idem_runtime::{Classify, Failure};
///
/// enum MailError { Refused, Timeout, Rejected(String) }
///
/// impl Classify for MailError {
///     fn classify(&self) -> Failure {
///         match self {
///             MailError::Refused => Failure::not_sent(),
///             MailError::Timeout => Failure::ambiguous(),
///             MailError::Rejected(_) => Failure::Semantic,
///         }
///     }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "the tool error type `{Self}` does not implement `idem::Classify`",
    label = "idem needs to know whether this error means not-sent, ambiguous or semantic",
    note = "implement `idem::Classify` for `{Self}`: `fn classify(&self) -> idem::Failure`; the retry rules of every class are decided by its answer"
)]
pub trait Classify {
    /// What this failure means: never sent, maybe applied, or refused.
    fn classify(&self) -> Failure;
}

impl<C: Classify + ?Sized> Classify for Box<C> {
    fn classify(&self) -> Failure {
        (**self).classify()
    }
}

impl<C: Classify + ?Sized> Classify for std::sync::Arc<C> {
    fn classify(&self) -> Failure {
        (**self).classify()
    }
}

/// The answer of a `verify` function: did the effect of an unknown outcome
/// land at the provider?
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict<T> {
    /// It landed; this is its result. The engine commits it and returns it.
    Landed(T),
    /// It provably did not land; the engine may run the call again.
    NotLanded,
    /// The provider cannot tell; the engine escalates to a human.
    Unknown,
}

impl<T> Verdict<T> {
    /// A short stable label, used in audit events and escalations.
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Landed(_) => "landed",
            Verdict::NotLanded => "not_landed",
            Verdict::Unknown => "unknown",
        }
    }
}
