//! The JSON the admin API speaks, as types: the server writes them, the
//! `idem` CLI (and any other client) reads them.

use serde::{Deserialize, Serialize};

use idem_journal::audit::{AuditEvent, Stats};
use idem_journal::class::{Class, OnDrift};
use idem_journal::views::{Operation, PruneReport, Resolution};

/// One tool of the running program (`GET /v1/tools`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolInfo {
    /// Stable tool id; part of every key.
    pub name: String,
    /// The tool's class.
    pub class: Class,
    /// The declared key fields, in key order.
    pub key_fields: Vec<String>,
    /// The `verify` function as written, if any.
    pub verify: Option<String>,
    /// How long the provider keeps keys (provider class), in ms.
    pub dedupe_window_ms: u64,
    /// Per-attempt timeout, in ms.
    pub timeout_ms: Option<u64>,
    /// The retry policy.
    pub retry: RetryInfo,
    /// Same key, different arguments: `replay` or `reject`.
    pub on_drift: OnDrift,
    /// Arguments never written to the journal.
    pub redact: Vec<String>,
    /// Whether this process can check a `Landed` result against the tool's
    /// result type (only then does it accept one).
    pub checks_landed: bool,
    /// Where the tool is defined: `module (file:line)`.
    pub defined_at: String,
    /// The latest committed result of this tool in the journal, as an
    /// example of its result's shape (what a `Landed` resolution must look
    /// like); `None` until one committed.
    pub example_result: Option<ExampleResult>,
}

/// A committed result, as an example of a tool's result shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExampleResult {
    /// The operation it belongs to.
    pub key: String,
    /// The result, as JSON.
    pub result: serde_json::Value,
}

/// A tool's retry policy, in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetryInfo {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    /// Delay before the first retry.
    pub initial_ms: u64,
    /// Multiplier applied to the delay after each retry.
    pub backoff: f64,
    /// Upper bound of one delay.
    pub max_interval_ms: u64,
    /// Upper bound of the time from the first attempt to the last.
    pub max_elapsed_ms: Option<u64>,
    /// Whether delays are jittered.
    pub jitter: bool,
}

/// The body of `POST /v1/ops/{key}/resolve`.
///
/// ```json
/// {"resolution": "landed", "result": {"id": "wire_42"}, "note": "on the bank statement"}
/// {"resolution": "reissue", "note": "not on the statement after two days"}
/// {"resolution": "abandon", "note": "customer cancelled"}
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResolveRequest {
    /// `landed`, `reissue` or `abandon`.
    pub resolution: String,
    /// For `landed`: the result to replay to later calls, which must fit
    /// the tool's result type. Required for `landed` (`null` included, for
    /// tools whose result is `()` or an `Option`), refused otherwise.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub result: Option<serde_json::Value>,
    /// Why: what the operator saw. Required, not blank.
    pub note: String,
}

/// `"result": null` is `Some(Null)`, an absent `result` is `None`.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<serde_json::Value>, D::Error> {
    serde_json::Value::deserialize(d).map(Some)
}

impl ResolveRequest {
    /// The request for `resolution` with `note`.
    pub fn new(resolution: &Resolution, note: impl Into<String>) -> ResolveRequest {
        let (label, result) = match resolution {
            Resolution::Landed(r) => ("landed", Some(r.clone().unwrap_or(serde_json::Value::Null))),
            Resolution::Reissue => ("reissue", None),
            Resolution::Abandon => ("abandon", None),
        };
        ResolveRequest {
            resolution: label.to_string(),
            result,
            note: note.into(),
        }
    }

    /// The resolution it asks for, or why it is malformed.
    pub fn to_resolution(&self) -> Result<Resolution, String> {
        if self.note.trim().is_empty() {
            return Err("\"note\" is required and must not be blank: say what the \
                        decision rests on (e.g. what the provider's records show)"
                .into());
        }
        match (self.resolution.as_str(), &self.result) {
            ("landed", Some(result)) => Ok(Resolution::Landed(Some(result.clone()))),
            ("landed", None) => Err("\"resolution\": \"landed\" needs \"result\": the \
                 provider's answer, to replay to later calls (null for tools that return \
                 nothing)"
                .into()),
            ("reissue" | "abandon", Some(_)) => Err(format!(
                "\"result\" is only for \"landed\", not for \"{}\"",
                self.resolution
            )),
            ("reissue", None) => Ok(Resolution::Reissue),
            ("abandon", None) => Ok(Resolution::Abandon),
            (other, _) => Err(format!(
                "unknown \"resolution\" {other:?}: use \"landed\", \"reissue\" or \"abandon\""
            )),
        }
    }
}

/// The body of `POST /v1/ops/{key}/approve` and `POST /v1/ops/{key}/reject`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionRequest {
    /// Why: what the operator checked. Required, not blank. For a refusal
    /// it is what the agent (and the model behind it) reads.
    pub note: String,
    /// The surface the decision came through, as the record keeps it:
    /// `cli` or `inbox` (absent: `api`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
}

/// The surfaces a [`DecisionRequest`] may name.
pub const DECISION_SURFACES: [&str; 3] = ["api", "cli", "inbox"];

impl DecisionRequest {
    /// The note and the surface, or why the request is malformed.
    pub fn checked(&self) -> Result<(&str, &str), String> {
        if self.note.trim().is_empty() {
            return Err(
                "\"note\" is required and must not be blank: say what the decision \
                        rests on (for a refusal, the agent reads it)"
                    .into(),
            );
        }
        let via = self.via.as_deref().unwrap_or("api");
        if !DECISION_SURFACES.contains(&via) {
            return Err(format!(
                "\"via\" is one of {}, or absent",
                DECISION_SURFACES.join(", ")
            ));
        }
        Ok((&self.note, via))
    }
}

/// What `POST /v1/ops/{key}/approve` and `/reject` answer on success.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decided {
    /// The operation's key.
    pub key: String,
    /// `approved` or `not_approved`.
    pub decision: String,
    /// The operation as it is now.
    pub operation: Operation,
}

/// What `POST /v1/ops/{key}/resolve` answers on success.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Resolved {
    /// The operation's key.
    pub key: String,
    /// `landed`, `reissue` or `abandon`.
    pub resolution: String,
    /// The operation as it is now.
    pub operation: Operation,
}

/// What `GET /v1/ops/{key}` answers: the record and its whole history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationView {
    /// The operation as the journal has it.
    pub operation: Operation,
    /// Every audit event about it (all generations), in order.
    pub history: Vec<AuditEvent>,
}

/// What `GET /v1/stats` answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatsView {
    /// Per-tool counts from the audit stream.
    #[serde(flatten)]
    pub stats: Stats,
    /// Bytes the journal uses on disk.
    pub journal_bytes: u64,
}

/// What `POST /v1/prune` answers: [`PruneReport`].
pub type PruneView = PruneReport;

/// Every error the admin API returns: a 4xx or 5xx status with this body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    /// A stable code: `unauthorized`, `bad_request`, `not_found`,
    /// `unknown_key`, `not_escalated`, `result_type`, `conflict`,
    /// `method_not_allowed`, `too_large`, `unavailable`, `journal`.
    pub error: String,
    /// What was wrong, for a human.
    pub message: String,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.error)
    }
}
