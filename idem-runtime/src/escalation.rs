//! The escalation surface: operations parked for a human, with the evidence
//! needed to decide "did it land or not", and the operator's answer.

use serde::{Deserialize, Serialize};

use crate::class::Class;
use crate::key::IdemKey;

/// An operation parked for a human, with its evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Escalation {
    /// The operation's key (current generation), as the provider saw it.
    pub key: IdemKey,
    /// The tool.
    pub tool: String,
    /// The tool's class.
    pub class: Class,
    /// The root run.
    pub root_run: String,
    /// The scope path under the root run.
    pub scope: Vec<String>,
    /// Why it was escalated.
    pub reason: String,
    /// The call's arguments, redacted ones replaced by `"<redacted>"`.
    pub args: serde_json::Value,
    /// Attempts made in this generation.
    pub attempts: u32,
    /// The last error, as text.
    pub last_error: Option<String>,
    /// What `verify` answered, if it was asked.
    pub verify_answer: Option<String>,
    /// When the first attempt started (ms since the epoch).
    pub first_attempt_ms: u64,
    /// When it was escalated (ms since the epoch).
    pub escalated_ms: u64,
}

/// An operator's answer to an [`Escalation`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Resolution {
    /// It landed. The optional JSON is the result to replay to later calls
    /// (it must deserialize into the tool's success type; `None` replays
    /// `null`, which suits `()` and `Option` results).
    Landed(Option<serde_json::Value>),
    /// It did not land (or must be done again): the next call runs it, with
    /// a fresh retry budget and the same key.
    Reissue,
    /// Never run it: later calls return `ToolError::Abandoned`.
    Abandon,
}

impl Resolution {
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Resolution::Landed(_) => "landed",
            Resolution::Reissue => "reissue",
            Resolution::Abandon => "abandon",
        }
    }
}
