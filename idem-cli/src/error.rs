//! Why a command failed, and the exit code that says so.

use std::fmt;

/// The exit codes of `idem` (also in `idem --help`).
pub mod exit {
    /// Done.
    pub const OK: u8 = 0;
    /// The request was understood and refused or failed: unknown key, not
    /// escalated, a result that does not fit the tool's type, a journal
    /// error.
    pub const REFUSED: u8 = 1;
    /// Bad command line (also clap's own code for usage errors).
    pub const USAGE: u8 = 2;
    /// The journal cannot be reached: no journal there, held by a process
    /// without the admin API, the process unreachable.
    pub const UNREACHABLE: u8 = 3;
    /// The admin API refused the token.
    pub const UNAUTHORIZED: u8 = 4;
}

/// A failed command: what went wrong, and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CliError {
    /// The exit code (see [`exit`]).
    pub code: u8,
    /// A stable identifier: the admin API's error code (`result_type`,
    /// `unknown_key`, ...) or the CLI's own (`usage`, `unreachable`, ...).
    pub kind: String,
    /// What went wrong.
    pub message: String,
    /// What to do about it, when there is something to say.
    pub hint: Option<String>,
}

impl CliError {
    /// An error with code, kind and message.
    pub fn new(code: u8, kind: &str, message: impl Into<String>) -> CliError {
        CliError {
            code,
            kind: kind.to_string(),
            message: message.into(),
            hint: None,
        }
    }

    /// A usage error.
    pub fn usage(message: impl Into<String>) -> CliError {
        CliError::new(exit::USAGE, "usage", message)
    }

    /// The journal or its process cannot be reached.
    pub fn unreachable(message: impl Into<String>) -> CliError {
        CliError::new(exit::UNREACHABLE, "unreachable", message)
    }

    /// Adds what to do about it.
    pub fn hint(mut self, hint: impl Into<String>) -> CliError {
        self.hint = Some(hint.into());
        self
    }

    /// A runtime error of a journal this process opened itself.
    pub fn runtime(e: &idem_runtime::Error) -> CliError {
        use idem_runtime::Error as E;
        let kind = match e {
            E::UnknownKey { .. } => "unknown_key",
            E::NotEscalated { .. } => "not_escalated",
            E::Conflict { .. } => "conflict",
            E::ResultType { .. } => "result_type",
            E::BadKey { .. } => "bad_key",
            E::InUse { .. } => "in_use",
            E::Untrusted(_) => "untrusted",
            _ => "journal",
        };
        let code = match e {
            E::InUse { .. } | E::NotAJournal { .. } | E::Untrusted(_) => exit::UNREACHABLE,
            _ => exit::REFUSED,
        };
        CliError::new(code, kind, e.to_string())
    }

    /// The error as JSON, for `--json`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "error": self.kind,
            "message": self.message,
            "hint": self.hint,
            "exit_code": self.code,
        })
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)?;
        if let Some(hint) = &self.hint {
            write!(f, "\nhint: {hint}")?;
        }
        Ok(())
    }
}

impl std::error::Error for CliError {}
