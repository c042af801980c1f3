//! Errors of the runtime ([`Error`]) and of a tool call ([`ToolError`]).

use std::path::PathBuf;

use crate::key::IdemKey;

/// Why the runtime could not do its job. Whenever one of these is returned
/// from a call, the provider was not called after the failure was detected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Another process (or another `Runtime` in this one) holds the journal.
    #[error(
        "journal in use: {path} is held by another process (sled allows one process per journal)"
    )]
    InUse {
        /// The journal directory.
        path: PathBuf,
    },
    /// The directory exists but is not an idem journal; nothing was written.
    #[error("{path} is not an idem journal ({detail}); refusing to touch it")]
    NotAJournal {
        /// The directory.
        path: PathBuf,
        /// What was found there.
        detail: String,
    },
    /// The journal was written by a newer (or unknown) format version.
    #[error("journal {path} has format version {found}, this build of idem reads version {supported}; nothing was changed")]
    UnsupportedFormat {
        /// The journal directory.
        path: PathBuf,
        /// The version found.
        found: u32,
        /// The version this build reads and writes.
        supported: u32,
    },
    /// A storage operation failed (I/O error, full disk, ...).
    #[error("journal {op} failed at {location}: {detail}")]
    Storage {
        /// What was being done.
        op: &'static str,
        /// The journal's location.
        location: String,
        /// The underlying error.
        detail: String,
    },
    /// The journal's files are damaged in a way that is not a torn tail:
    /// it refuses to open, and nothing was deleted.
    #[error("journal damaged: {}{}: {detail}; refusing to open (nothing was deleted)", file.display(), offset.map(|o| format!(" at offset {o}")).unwrap_or_default())]
    Damaged {
        /// The damaged file.
        file: PathBuf,
        /// Where in it, when known.
        offset: Option<u64>,
        /// What is wrong.
        detail: String,
    },
    /// A value is larger than the journal stores; nothing was written and
    /// the provider was not called.
    #[error("{what} of {size} bytes exceeds the journal's limit of {limit} bytes; the provider was not called")]
    TooLarge {
        /// What was too large.
        what: &'static str,
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The journal's record for this key belongs to another tool or class:
    /// never replayed.
    #[error("record {key} belongs to tool `{stored_tool}` ({stored_class}), not to `{tool}` ({class}); two tools share a name, or a tool's class changed while it had operations in the journal")]
    ToolMismatch {
        /// The operation's key.
        key: String,
        /// The tool (and class) that wrote the record.
        stored_tool: String,
        /// Its class.
        stored_class: crate::Class,
        /// The tool calling now.
        tool: String,
        /// Its class.
        class: crate::Class,
    },
    /// A concurrent call of the same operation, which this call waited for,
    /// was refused by the provider. (The refusal itself is the tool's
    /// error, returned to the call that made the attempt; this call shares
    /// its outcome and does not start a new decision.)
    #[error("operation {key} was refused by the provider in the concurrent call this one waited for: {error}")]
    Rejected {
        /// The operation's key.
        key: String,
        /// The provider's refusal, as text.
        error: String,
    },
    /// The operation's retry budget is spent and nothing landed; the error
    /// of its last attempt is known only as text (it was made by another
    /// call or an earlier process).
    #[error("operation {key} failed after {attempts} attempts; last error: {error}")]
    Failed {
        /// The operation's key.
        key: String,
        /// Attempts made.
        attempts: u32,
        /// The last error, as text.
        error: String,
    },
    /// An operator's `Landed` result does not fit the tool's result type;
    /// nothing was written.
    #[error("the result given for {key} does not fit the result type of tool `{tool}`: {detail}; nothing was written")]
    ResultType {
        /// The operation's key.
        key: String,
        /// The tool.
        tool: String,
        /// The decode error.
        detail: String,
    },
    /// A stored record could not be decoded. It is never treated as absent.
    #[error("corrupt {what} in journal {location} at key {key}: {detail}")]
    Corrupt {
        /// Which kind of record.
        what: &'static str,
        /// The journal's location.
        location: String,
        /// The record's key (hex).
        key: String,
        /// Why it could not be decoded.
        detail: String,
    },
    /// A record was written by a newer format version than this build reads.
    #[error("{what} at key {key} has format version {found}; this build reads up to {supported}")]
    RecordVersion {
        /// Which kind of record.
        what: &'static str,
        /// The record's key (hex).
        key: String,
        /// The version found.
        found: u8,
        /// The newest version this build reads.
        supported: u8,
    },
    /// Another writer changed the record between our read and our write.
    #[error("record {key} was changed concurrently by another writer; not calling the provider")]
    Conflict {
        /// The operation's key.
        key: String,
    },
    /// A result could not be encoded for, or decoded from, the journal.
    #[error("result of {key} could not be {op}: {detail}")]
    Result {
        /// The operation's key.
        key: String,
        /// "encoded" or "decoded".
        op: &'static str,
        /// Why.
        detail: String,
    },
    /// Every attempt timed out; no error value exists to return.
    #[error("{tool}: all {attempts} attempts timed out")]
    TimedOut {
        /// The tool.
        tool: String,
        /// Attempts made.
        attempts: u32,
    },
    /// `resolve` was given a key that has no record.
    #[error("no operation with key {key} in the journal")]
    UnknownKey {
        /// The key.
        key: String,
    },
    /// `resolve` was given a key whose operation is not escalated.
    #[error("operation {key} is not escalated (it is {state}); nothing to resolve")]
    NotEscalated {
        /// The key.
        key: String,
        /// Its current state.
        state: String,
    },
    /// A key's text could not be parsed.
    #[error("not an idem key: {key:?}: {reason}")]
    BadKey {
        /// The text.
        key: String,
        /// Why.
        reason: String,
    },
    /// Two tools in this binary have one name, so they would share keys
    /// (the second would replay the first's results); no runtime opens
    /// until one of them is renamed.
    #[error(
        "two tools are named \"{name}\": {first} and {second}; a tool's name is part of every \
         key, so they would share keys and one would replay the other's results; give one of \
         them another `name` (a method tool: `#[idem::tool]` on its `impl` block names it \
         `Type::method`)"
    )]
    DuplicateTool {
        /// The name both tools have.
        name: String,
        /// One tool, as `module_path (file:line)`.
        first: String,
        /// The other, the same way.
        second: String,
    },
    /// `Ctx::idempotency_key` or a journaled call was used without a runtime
    /// able to serve it.
    #[error("{0}")]
    Usage(String),
}

impl Error {
    pub(crate) fn storage(
        op: &'static str,
        location: &str,
        detail: impl std::fmt::Display,
    ) -> Self {
        Error::Storage {
            op,
            location: location.to_string(),
            detail: detail.to_string(),
        }
    }
}

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
            | ToolError::Abandoned { key } => Some(key),
            ToolError::Tool(_) | ToolError::Journal(_) => None,
        }
    }
}
