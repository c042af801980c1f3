//! [`ToolError`]: the error of a call made through `#[tool]`.

use idem_journal::error::Error;
use idem_journal::key::IdemKey;

/// The error of a call made through `#[tool]`.
#[derive(Debug, thiserror::Error)]
pub enum ToolError<E> {
    /// The tool itself failed, and the engine's rules say to return it (a
    /// semantic refusal, or a failure that provably did not land once the
    /// retry budget was spent).
    #[error("tool failed: {0}")]
    Tool(E),
    /// The outcome is unknown and a human must settle it; the provider will
    /// not be called for this key until `Runtime::resolve`.
    #[error("operation {key} escalated: {reason}")]
    Escalated {
        /// The operation's key.
        key: IdemKey,
        /// Why it was escalated.
        reason: String,
    },
    /// Another call of the same key is still being driven.
    #[error("operation {key} is in flight in another call")]
    InFlight {
        /// The operation's key.
        key: IdemKey,
    },
    /// The key was seen before with different arguments and the tool says
    /// `on_drift = "reject"`.
    #[error("operation {key} was first called with different arguments")]
    ArgsMismatch {
        /// The operation's key.
        key: IdemKey,
    },
    /// An operator abandoned this operation.
    #[error("operation {key} was abandoned by an operator")]
    Abandoned {
        /// The operation's key.
        key: IdemKey,
    },
    /// The call needs a person's approval and has none yet: nothing ran.
    /// Call again with the same arguments later (the same key): it returns
    /// the decision once it is made, and nobody is asked twice.
    #[error("operation {key} awaits a person's approval; nothing ran yet: call again later with the same arguments")]
    AwaitingApproval {
        /// The operation's key (what `Runtime::approve` takes).
        key: IdemKey,
    },
    /// A person refused the call: it never runs, and every call of its key
    /// returns this.
    #[error("operation {key} was not approved: {note}")]
    NotApproved {
        /// The operation's key.
        key: IdemKey,
        /// The operator's note (for the agent, and the model behind it).
        note: String,
    },
    /// A saga ([`Ctx::saga`](crate::Ctx::saga)) failed and every completed
    /// step of it was compensated: what it did is undone. Every later run
    /// of the saga returns this without running its body again.
    #[error("saga {saga} was rolled back: {reason}")]
    Compensated {
        /// The saga's name.
        saga: String,
        /// Why: the semantic failure of its body, or the reason it aborted
        /// with.
        reason: String,
    },
    /// The journal could not be read or written; the provider was not called
    /// after that was detected.
    #[error("journal error: {0}")]
    Journal(#[from] Error),
}

impl<E> ToolError<E> {
    /// The tool's own error, if that is what this is.
    pub fn tool_error(&self) -> Option<&E> {
        match self {
            ToolError::Tool(e) => Some(e),
            _ => None,
        }
    }

    /// The operation's key, for the variants that carry one.
    pub fn key(&self) -> Option<&IdemKey> {
        match self {
            ToolError::Escalated { key, .. }
            | ToolError::InFlight { key }
            | ToolError::ArgsMismatch { key }
            | ToolError::Abandoned { key }
            | ToolError::AwaitingApproval { key }
            | ToolError::NotApproved { key, .. } => Some(key),
            ToolError::Tool(_) | ToolError::Journal(_) | ToolError::Compensated { .. } => None,
        }
    }
}
