//! The escalation surface: operations parked for a human, with the evidence
//! needed to decide "did it land or not", and the operator's answer.

use serde::{Deserialize, Serialize};

use crate::class::Class;
use crate::codec;
use crate::journal::{Digest, Loaded};
use crate::key::IdemKey;
use crate::record::{self, OpRecord, State};

/// An operation parked for a human, with its evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
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

/// A call waiting for a person's approval, with what was put to them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Approval {
    /// The operation's key (current generation): what `approve` and
    /// `reject` take.
    pub key: IdemKey,
    /// The tool.
    pub tool: String,
    /// The tool's class.
    pub class: Class,
    /// The root run.
    pub root_run: String,
    /// The scope path under the root run.
    pub scope: Vec<String>,
    /// Why the call needs approval (the tool's policy said so).
    pub reason: String,
    /// The call's arguments, redacted ones replaced by `"<redacted>"`:
    /// what runs if it is approved.
    pub args: serde_json::Value,
    /// When approval was asked for (ms since the epoch).
    pub requested_ms: u64,
}

/// The approval an operation needed, and its decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalView {
    /// Why it needed approval.
    pub reason: String,
    /// When approval was asked for (ms since the epoch).
    pub requested_ms: u64,
    /// The key generation it was asked for.
    pub generation: u32,
    /// `Some(true)` approved, `Some(false)` refused, `None` pending.
    pub approved: Option<bool>,
    /// The operator's note, once decided.
    pub note: Option<String>,
    /// When it was decided (ms since the epoch).
    pub decided_ms: Option<u64>,
    /// Through which surface it was decided (`runtime`, `api`, `cli`,
    /// `inbox`).
    pub via: Option<String>,
}

/// Where a saga stands ([`SagaView::state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SagaState {
    /// Started, and no rollback decided: its body runs (or ran and
    /// returned its value, or an error in doubt that leaves it open).
    Running,
    /// A rollback is decided and not finished: its compensations run, or
    /// its next run goes on with them.
    Compensating,
    /// Rolled back: every completed step was undone.
    Compensated,
    /// A person must finish it: a compensation was refused, could not be
    /// settled, or its step was not reached (see [`SagaView::escalation`]
    /// and [`SagaView::for_good`]).
    Escalated,
}

impl SagaState {
    /// `running`, `compensating`, `compensated` or `escalated`.
    pub fn label(self) -> &'static str {
        match self {
            SagaState::Running => "running",
            SagaState::Compensating => "compensating",
            SagaState::Compensated => "compensated",
            SagaState::Escalated => "escalated",
        }
    }
}

impl std::fmt::Display for SagaState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// One completed compensable call of a saga.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SagaStep {
    /// The tool that ran.
    pub tool: String,
    /// Its key (as `GET /v1/ops/{key}` and `idem show` take it).
    pub key: String,
}

/// A saga (`Ctx::saga`) as the journal has it, for operators
/// (`Runtime::sagas`, `GET /v1/sagas`, `idem sagas`, the inbox).
///
/// Read from the saga's own memoized steps (its start, its decision to
/// roll back, its end), which survive restarts and do not depend on the
/// audit stream; only an escalation *for now* (a compensation that cannot
/// be settled yet, which stores no end) is learned from the saga's latest
/// audit event, see [`SagaView::for_good`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SagaView {
    /// The saga's name, as given to `Ctx::saga`.
    pub saga: String,
    /// The saga's key, as `ToolError::Escalated` and `InFlight` give it
    /// to the saga's caller. Its audit events are about the same
    /// operation (the same digest) under the saga's tool name, so there
    /// it reads `saga_NAME-…`.
    pub key: IdemKey,
    /// The root run.
    pub root_run: String,
    /// The scope path under the root run.
    pub scope: Vec<String>,
    /// Where it stands.
    pub state: SagaState,
    /// Why it is rolled back (the decision's reason), once a rollback is
    /// decided.
    pub reason: Option<String>,
    /// For an escalated saga, the evidence: what ran, what was undone,
    /// what is left and why it stopped.
    pub escalation: Option<String>,
    /// For an escalated saga: `true` when it ended escalated (its runs
    /// return the same escalation, a person undoes what is left by hand);
    /// `false` when it escalated *for now*, because a compensation cannot
    /// be settled yet (settle the compensation's own escalation; the
    /// saga's next run resumes the rollback there). `false` in every other
    /// state.
    pub for_good: bool,
    /// The completed compensable steps the rollback undoes, in the order
    /// they ran (the decision's steps); empty before a decision.
    pub steps: Vec<SagaStep>,
    /// The steps undone, in the order their compensations ran, once the
    /// saga ended (an escalation for now names them in its evidence only).
    pub undone: Vec<SagaStep>,
    /// When it first started (ms since the epoch; 0 if that record was
    /// pruned).
    pub started_ms: u64,
    /// When the rollback was decided (ms since the epoch).
    pub decided_ms: Option<u64>,
    /// When it ended, compensated or escalated for good, or when it last
    /// escalated for now (ms since the epoch).
    pub ended_ms: Option<u64>,
}

impl SagaView {
    /// A saga that started at `started_ms` and has decided nothing yet
    /// (`running`); the runtime fills in the rest from its records.
    pub fn new(
        saga: String,
        key: IdemKey,
        root_run: String,
        scope: Vec<String>,
        started_ms: u64,
    ) -> SagaView {
        SagaView {
            saga,
            key,
            root_run,
            scope,
            state: SagaState::Running,
            reason: None,
            escalation: None,
            for_good: false,
            steps: Vec::new(),
            undone: Vec::new(),
            started_ms,
            decided_ms: None,
            ended_ms: None,
        }
    }

    /// When it last changed (ms since the epoch): its end, else its
    /// decision, else its start.
    pub fn updated_ms(&self) -> u64 {
        self.ended_ms.or(self.decided_ms).unwrap_or(self.started_ms)
    }
}

/// An operator's answer to an [`Escalation`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Resolution {
    /// It landed. The optional JSON is the result to replay to later calls:
    /// it must deserialize into the tool's result type, which is checked
    /// before anything is written (`None` stands for `null`, which suits
    /// `()` and `Option` results).
    Landed(Option<serde_json::Value>),
    /// It did not land (or must be done again): the next call runs it, with
    /// a fresh retry budget and the same key.
    Reissue,
    /// Never run it: later calls return `ToolError::Abandoned`.
    Abandon,
}

impl Resolution {
    /// `landed`, `reissue` or `abandon`.
    pub fn label(&self) -> &'static str {
        match self {
            Resolution::Landed(_) => "landed",
            Resolution::Reissue => "reissue",
            Resolution::Abandon => "abandon",
        }
    }
}

/// One operation as the journal has it (for operators: `GET /v1/ops/{key}`,
/// `idem show`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Operation {
    /// The operation's key (current generation).
    pub key: IdemKey,
    /// The tool.
    pub tool: String,
    /// The tool's class.
    pub class: Class,
    /// The root run.
    pub root_run: String,
    /// The scope path under the root run.
    pub scope: Vec<String>,
    /// `intent`, `waiting`, `committed`, `rejected`, `failed`, `escalated`,
    /// `reissue`, `abandoned`, `awaiting_approval`, `approved` or
    /// `not_approved`.
    pub state: String,
    /// The key generation (incremented after a provider refusal).
    pub generation: u32,
    /// Attempts made in the current decision.
    pub attempts: u32,
    /// Whether an attempt may have landed without anything settling it.
    pub maybe_landed: bool,
    /// The call's arguments, redacted ones replaced by `"<redacted>"`.
    pub args: serde_json::Value,
    /// The committed result, as JSON.
    pub result: Option<serde_json::Value>,
    /// How the result was learned: `call`, `verify` or `operator`.
    pub committed_via: Option<String>,
    /// The refusal or failure, for rejected and failed operations.
    pub error: Option<String>,
    /// The last attempt's error.
    pub last_error: Option<String>,
    /// What `verify` answered, if it was asked.
    pub verify_answer: Option<String>,
    /// Why it was escalated, if it was.
    pub escalation_reason: Option<String>,
    /// The operator's resolution, if any.
    pub resolution: Option<ResolutionView>,
    /// When the first attempt of this decision started (ms since the epoch).
    pub first_attempt_ms: u64,
    /// When the record last changed (ms since the epoch).
    pub updated_ms: u64,
    /// Who holds its claim (`worker#incarnation`), while it is in flight.
    pub claimed_by: Option<String>,
    /// The approval the call needed, if it needed one.
    #[serde(default)]
    pub approval: Option<ApprovalView>,
}

/// An operator's resolution of an operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResolutionView {
    /// `landed`, `reissue` or `abandon`.
    pub kind: String,
    /// The operator's note.
    pub note: String,
    /// When (ms since the epoch).
    pub at_ms: u64,
    /// How many times it was amended.
    pub amendments: u32,
}

/// What a prune of the journal did (`Runtime::prune`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PruneReport {
    /// Everything last changed before this instant (ms since the epoch) was
    /// eligible.
    pub cutoff_ms: u64,
    /// Operation records looked at.
    pub ops_scanned: u64,
    /// Finished operations removed.
    pub ops_removed: u64,
    /// Operations kept because they are not finished (in flight, waiting,
    /// escalated, reissued), whatever their age.
    pub ops_kept_open: u64,
    /// Memoized steps removed.
    pub steps_removed: u64,
    /// Audit events removed.
    pub events_removed: u64,
    /// Records left alone because they could not be decoded.
    pub undecodable: u64,
}

/// The escalation view of a stored operation.
pub fn escalation_of(digest: &Digest, rec: &OpRecord) -> Escalation {
    let esc = rec.escalation.clone().unwrap_or(record::EscalationInfo {
        reason: String::new(),
        at_ms: rec.updated_ms,
    });
    Escalation {
        key: IdemKey::from_parts(&rec.tool, *digest, rec.generation),
        tool: rec.tool.clone(),
        class: rec.class,
        root_run: rec.root_run.clone(),
        scope: rec.scope.clone(),
        reason: esc.reason,
        args: serde_json::from_str(&rec.args).unwrap_or(serde_json::Value::Null),
        attempts: rec.attempts,
        last_error: rec.last_error.clone(),
        verify_answer: rec.verify_answer.clone(),
        first_attempt_ms: rec.first_attempt_ms,
        escalated_ms: esc.at_ms,
    }
}

/// The operator's view of a stored operation.
pub fn operation_of(digest: &Digest, loaded: &Loaded, rec: &OpRecord) -> Operation {
    let (result, via) = match &rec.state {
        State::Committed { result, via } => (
            Some(codec::to_json(&result.0)),
            Some(via.label().to_string()),
        ),
        _ => (None, None),
    };
    let error = match &rec.state {
        State::Rejected { error } | State::Failed { error } => Some(error.clone()),
        State::NotApproved { note } => Some(note.clone()),
        _ => None,
    };
    Operation {
        key: IdemKey::from_parts(&rec.tool, *digest, rec.generation),
        tool: rec.tool.clone(),
        class: rec.class,
        root_run: rec.root_run.clone(),
        scope: rec.scope.clone(),
        state: rec.state.name().to_string(),
        generation: rec.generation,
        attempts: rec.attempts,
        maybe_landed: rec.maybe_landed,
        args: serde_json::from_str(&rec.args).unwrap_or(serde_json::Value::Null),
        result,
        committed_via: via,
        error,
        last_error: rec.last_error.clone(),
        verify_answer: rec.verify_answer.clone(),
        escalation_reason: rec.escalation.as_ref().map(|e| e.reason.clone()),
        resolution: rec.resolution.as_ref().map(|r| ResolutionView {
            kind: r.kind.clone(),
            note: r.note.clone(),
            at_ms: r.at_ms,
            amendments: r.amendments,
        }),
        first_attempt_ms: rec.first_attempt_ms,
        updated_ms: rec.updated_ms,
        claimed_by: loaded.claim.as_ref().map(|c| c.owner.to_string()),
        approval: rec.approval.as_ref().map(|a| ApprovalView {
            reason: a.reason.clone(),
            requested_ms: a.requested_ms,
            generation: a.generation,
            approved: a.decision.as_ref().map(|d| d.approved),
            note: a.decision.as_ref().map(|d| d.note.clone()),
            decided_ms: a.decision.as_ref().map(|d| d.at_ms),
            via: a.decision.as_ref().map(|d| d.via.clone()),
        }),
    }
}

/// The approval view of a stored operation awaiting one (`None` for any
/// other record).
pub fn approval_of(digest: &Digest, rec: &OpRecord) -> Option<Approval> {
    if rec.state != State::AwaitingApproval {
        return None;
    }
    let info = rec.approval.as_ref()?;
    Some(Approval {
        key: IdemKey::from_parts(&rec.tool, *digest, rec.generation),
        tool: rec.tool.clone(),
        class: rec.class,
        root_run: rec.root_run.clone(),
        scope: rec.scope.clone(),
        reason: info.reason.clone(),
        args: serde_json::from_str(&rec.args).unwrap_or(serde_json::Value::Null),
        requested_ms: info.requested_ms,
    })
}
