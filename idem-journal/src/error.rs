//! idem's [`Error`]: why the runtime, or a journal, could not do its job.
//! Storage failures keep their cause and a typed [`StorageKind`], so
//! callers match on kinds, never on messages.

use std::path::PathBuf;

use crate::key::{BadKey, IdemKey};

/// The cause of a storage failure, kept as the error's source.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What kind of storage failure an [`Error::Storage`] is.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StorageKind {
    /// An I/O error of this kind (`StorageFull` for a full disk).
    Io(std::io::ErrorKind),
    /// A database refused or failed: its SQLSTATE when it sent one (none
    /// when the connection itself failed).
    Database {
        /// The five-character SQLSTATE (`42501`: insufficient privilege).
        sqlstate: Option<String>,
    },
    /// Anything else (a library's own error).
    Other,
}

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
    /// Another live process works under this worker id on the shared
    /// journal. Two would take each other's calls over forever (each takes
    /// the other for its own dead predecessor), so the second is refused
    /// before it claims anything.
    #[error(
        "worker id `{worker}` is in use: another live process holds it on {location}; give \
         each process its own id (RuntimeBuilder::worker_id), or stop the other one first"
    )]
    WorkerInUse {
        /// The worker id.
        worker: String,
        /// The journal's location.
        location: String,
    },
    /// The journal was told that its database has a synchronous standby
    /// (idem-postgres's `PostgresOptions::synchronous_standby`) and the
    /// server says it has none configured: a commit it acknowledges could
    /// be missing from the standby that a failover promotes, and idem's
    /// promise (no duplicate effect, nothing lost) would not hold through
    /// that failover. Refused before anything was written (at connect), or
    /// before the statement ran (on a new connection, e.g. to a server
    /// promoted without a standby of its own).
    #[error(
        "no synchronous standby at {location}: the server reports {reported}; the journal was \
         told to expect one (PostgresOptions::synchronous_standby), so it refuses to run: a \
         commit the server acknowledges could be lost at a failover. Name the standby in \
         synchronous_standby_names with synchronous_commit = on (or remote_apply, \
         remote_write) on the primary, or drop the option if the database is not replicated"
    )]
    NoSynchronousStandby {
        /// The journal's location.
        location: String,
        /// What the server reported, as `setting = 'value'` pairs.
        reported: String,
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
    /// A storage operation failed (I/O error, full disk, a database's
    /// refusal, ...). Its cause is kept ([`std::error::Error::source`]) and
    /// typed ([`Error::storage_kind`]): ask [`Error::io_kind`] or
    /// [`Error::sqlstate`], never the text.
    #[error("journal {op} failed at {location}: {source}")]
    Storage {
        /// What was being done.
        op: &'static str,
        /// The journal's location.
        location: String,
        /// What kind of failure it is.
        kind: StorageKind,
        /// The underlying error.
        #[source]
        source: Cause,
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
        key: IdemKey,
        /// The tool (and class) that wrote the record.
        stored_tool: String,
        /// Its class.
        stored_class: crate::class::Class,
        /// The tool calling now.
        tool: String,
        /// Its class.
        class: crate::class::Class,
    },
    /// A concurrent call of the same operation, which this call waited for,
    /// was refused by the provider. (The refusal itself is the tool's
    /// error, returned to the call that made the attempt; this call shares
    /// its outcome and does not start a new decision.)
    #[error("operation {key} was refused by the provider in the concurrent call this one waited for: {error}")]
    Rejected {
        /// The operation's key.
        key: IdemKey,
        /// The provider's refusal, as text.
        error: String,
    },
    /// The operation's retry budget is spent and nothing landed; the error
    /// of its last attempt is known only as text (it was made by another
    /// call or an earlier process).
    #[error("operation {key} failed after {attempts} attempts; last error: {error}")]
    Failed {
        /// The operation's key.
        key: IdemKey,
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
        key: IdemKey,
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
        key: IdemKey,
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
        key: IdemKey,
    },
    /// `approve` or `reject` was given a key whose operation does not
    /// await approval (it was decided already, or never asked).
    #[error("operation {key} does not await approval (it is {state}); nothing to decide")]
    NotAwaitingApproval {
        /// The key.
        key: IdemKey,
        /// Its current state.
        state: String,
    },
    /// `resolve` was given a key whose operation is not escalated.
    #[error("operation {key} is not escalated (it is {state}); nothing to resolve")]
    NotEscalated {
        /// The key.
        key: IdemKey,
        /// Its current state.
        state: String,
    },
    /// A file or directory in the journal directory is not ours (a
    /// symlink, another user's, writable by others): refused, untouched.
    #[error(transparent)]
    Untrusted(#[from] crate::files::Untrusted),
    /// A key's text could not be parsed.
    #[error(transparent)]
    BadKey(#[from] BadKey),
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
    /// A storage failure of `op` at `location`, caused by `source`; its
    /// kind is the I/O error's kind when the cause is an I/O error.
    pub fn storage(op: &'static str, location: &str, source: impl Into<Cause>) -> Self {
        let source = source.into();
        let kind = match source.downcast_ref::<std::io::Error>() {
            Some(e) => StorageKind::Io(e.kind()),
            None => StorageKind::Other,
        };
        Error::Storage {
            op,
            location: location.to_string(),
            kind,
            source,
        }
    }

    /// A database's failure of `op` at `location`, with its SQLSTATE when
    /// the server sent one.
    pub fn database(
        op: &'static str,
        location: &str,
        sqlstate: Option<String>,
        source: impl Into<Cause>,
    ) -> Self {
        Error::Storage {
            op,
            location: location.to_string(),
            kind: StorageKind::Database { sqlstate },
            source: source.into(),
        }
    }

    /// The kind of a storage failure; `None` for every other error.
    pub fn storage_kind(&self) -> Option<&StorageKind> {
        match self {
            Error::Storage { kind, .. } => Some(kind),
            _ => None,
        }
    }

    /// The I/O error kind of a storage failure caused by I/O.
    pub fn io_kind(&self) -> Option<std::io::ErrorKind> {
        match self.storage_kind() {
            Some(StorageKind::Io(kind)) => Some(*kind),
            _ => None,
        }
    }

    /// The SQLSTATE of a database's failure, when the server sent one.
    pub fn sqlstate(&self) -> Option<&str> {
        match self.storage_kind() {
            Some(StorageKind::Database { sqlstate }) => sqlstate.as_deref(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_io_cause_gives_its_kind_and_stays_the_source() {
        let e = Error::storage(
            "write",
            "/j",
            std::io::Error::new(std::io::ErrorKind::StorageFull, "disk full"),
        );
        assert_eq!(e.io_kind(), Some(std::io::ErrorKind::StorageFull));
        assert_eq!(e.sqlstate(), None);
        let source = std::error::Error::source(&e).expect("the cause is kept");
        assert_eq!(source.to_string(), "disk full");
        let text = Error::storage("read", "/j", "plain text");
        assert_eq!(text.storage_kind(), Some(&StorageKind::Other));
    }

    #[test]
    fn a_database_failure_carries_its_sqlstate() {
        let e = Error::database("claim", "postgres://x", Some("42501".into()), "denied");
        assert_eq!(e.sqlstate(), Some("42501"));
        assert_eq!(e.io_kind(), None);
    }
}
