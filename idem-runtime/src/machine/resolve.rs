//! An operator's resolution of an operation: which records it may settle
//! (an escalation, or amending what an operator decided before), and what
//! the record and its events become; and an operator's decision on a call
//! awaiting approval ([`decide`]).

use idem_journal::audit::EventKind;
use idem_journal::record::{ApprovalDecision, Blob, OpRecord, ResolutionInfo, State, Via};

/// An operator's decision, with a `Landed` result already checked against
/// the tool's type and encoded.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Decision {
    /// It landed with this result: commit it.
    Landed(Blob),
    /// Run it again, same key, fresh budget.
    Reissue,
    /// Never run it.
    Abandon,
}

impl Decision {
    /// `landed`, `reissue` or `abandon`.
    pub fn label(&self) -> &'static str {
        match self {
            Decision::Landed(_) => "landed",
            Decision::Reissue => "reissue",
            Decision::Abandon => "abandon",
        }
    }
}

/// Whether an operator may resolve `rec`: `Ok(None)` for an escalation,
/// `Ok(Some(previous))` to amend an operator's earlier resolution
/// (`previous` is its kind), `Err(state)` otherwise.
pub fn admissible(rec: &OpRecord) -> Result<Option<String>, &'static str> {
    let set_by_operator = rec.resolution.is_some()
        && matches!(
            rec.state,
            State::Committed {
                via: Via::Operator,
                ..
            } | State::Abandoned
                | State::Reissue
        );
    match rec.state {
        State::Escalated => Ok(None),
        _ if set_by_operator => Ok(rec.resolution.as_ref().map(|r| r.kind.clone())),
        _ => Err(rec.state.name()),
    }
}

/// The record after the decision, and the events that record it.
pub fn apply(
    mut rec: OpRecord,
    previous: Option<String>,
    decision: Decision,
    note: &str,
    now: u64,
) -> (OpRecord, Vec<EventKind>) {
    let label = decision.label();
    let landed = matches!(decision, Decision::Landed(_));
    rec.state = match decision {
        Decision::Landed(result) => State::Committed {
            result,
            via: Via::Operator,
        },
        Decision::Reissue => State::Reissue,
        Decision::Abandon => State::Abandoned,
    };
    rec.maybe_landed = false;
    rec.updated_ms = now;
    let amendments = rec.resolution.as_ref().map_or(0, |r| r.amendments);
    rec.resolution = Some(ResolutionInfo {
        kind: label.to_string(),
        note: note.to_string(),
        at_ms: now,
        amendments: if previous.is_some() {
            amendments + 1
        } else {
            0
        },
    });
    let mut events = vec![match previous {
        Some(previous) => EventKind::Amended {
            previous,
            resolution: label.to_string(),
            note: note.to_string(),
        },
        None => EventKind::Resolved {
            resolution: label.to_string(),
            note: note.to_string(),
        },
    }];
    if landed {
        // It is a commit like any other, for the stream and for stats.
        events.push(EventKind::Committed {
            attempt: 0,
            via: "operator".into(),
        });
    }
    (rec, events)
}

/// What an operator's decision on an approval makes of the record: `Err`
/// with the record's state when it does not await one (a decision is
/// final: nobody is asked twice, and nobody changes an answer a call may
/// already have acted on).
pub fn decide(
    mut rec: OpRecord,
    approved: bool,
    note: &str,
    via: &str,
    now: u64,
) -> Result<(OpRecord, Vec<EventKind>), &'static str> {
    if rec.state != State::AwaitingApproval {
        return Err(rec.state.name());
    }
    let Some(approval) = rec.approval.as_mut() else {
        return Err(rec.state.name());
    };
    approval.decision = Some(ApprovalDecision {
        approved,
        note: note.to_string(),
        at_ms: now,
        via: via.to_string(),
    });
    rec.updated_ms = now;
    let (note, via) = (note.to_string(), via.to_string());
    let event = if approved {
        rec.state = State::Approved;
        EventKind::Approved { note, via }
    } else {
        rec.state = State::NotApproved { note: note.clone() };
        EventKind::NotApproved { note, via }
    };
    Ok((rec, vec![event]))
}
