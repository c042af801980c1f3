//! Audit events: what the engine records of every decision ([`AuditEvent`],
//! [`EventKind`]), how an event is stored ([`encode`], [`decode`]) and the
//! per-tool statistics derived from the stream ([`Stats`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::class::OnDrift;
use crate::error::Error;
use crate::journal::Owner;
use crate::key::IdemKey;
use crate::record::{self, Kind};

/// One audit event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEvent {
    /// Position in the stream; increasing, possibly with gaps.
    pub seq: u64,
    /// When it happened (ms since the epoch, runtime clock).
    pub at_ms: u64,
    /// The tool (or `step:<name>` for memoized steps).
    pub tool: String,
    /// The provider-facing key, for journaled operations.
    pub key: Option<String>,
    /// The root run the operation belongs to.
    pub root_run: String,
    /// The agent path that made the call (root, then `child` names).
    pub agent: String,
    /// The worker and incarnation that acted, as `worker#incarnation`
    /// (the incarnation in 16 hex digits): for an operator's resolution,
    /// the worker whose admin API or journal took it. `None` only for
    /// events written before journals recorded it (record format 2).
    pub worker: Option<String>,
    /// What happened.
    pub kind: EventKind,
}

/// What an [`AuditEvent`] records.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EventKind {
    /// A new operation (or a new generation of one) was journaled.
    Intent {
        /// The key generation.
        generation: u32,
        /// Hex SHA-256 of the non-redacted arguments.
        fingerprint: String,
    },
    /// An attempt is about to call the provider; its INTENT is durable.
    Attempt {
        /// 1-based attempt number within the generation.
        attempt: u32,
    },
    /// An attempt failed and another will follow after `delay_ms`.
    Retry {
        /// The attempt that failed.
        attempt: u32,
        /// How long the engine waits.
        delay_ms: u64,
        /// `not_sent` or `ambiguous`.
        failure: String,
        /// The error, as text.
        error: String,
    },
    /// The operation's result is committed.
    Committed {
        /// The attempt that produced it (0: learned by verify or operator).
        attempt: u32,
        /// `call`, `verify` or `operator`.
        via: String,
    },
    /// The provider refused the operation; the next call starts a new
    /// generation.
    Rejected {
        /// The error, as text.
        error: String,
    },
    /// Every attempt provably failed to land and the budget is spent.
    Failed {
        /// The last error, as text.
        error: String,
    },
    /// A committed result was replayed; the provider was not called.
    DedupeHit,
    /// The provider reported that it replayed a response for our key.
    ProviderReplay {
        /// The attempt that saw it.
        attempt: u32,
    },
    /// An operation left unfinished by a dead process or a dropped call was
    /// picked up.
    Recovered {
        /// The state it was found in.
        state: String,
        /// Attempts it had made.
        attempts: u32,
    },
    /// `verify` was asked whether an unknown outcome landed.
    Verified {
        /// `landed`, `not_landed`, `unknown` or `error: ...`.
        verdict: String,
    },
    /// Same key, different arguments.
    ArgsDrift {
        /// What the tool does about it.
        policy: OnDrift,
    },
    /// Parked for a human.
    Escalated {
        /// Why.
        reason: String,
    },
    /// An operator changed an earlier resolution of this operation.
    Amended {
        /// The resolution it replaced: `landed`, `reissue` or `abandon`.
        previous: String,
        /// The new one.
        resolution: String,
        /// The operator's note.
        note: String,
    },
    /// A write of a call that lost its claim (another worker took the
    /// operation over, e.g. after this one was paused past its lease) was
    /// refused; the call re-decided from the fresh record.
    Fenced {
        /// The attempt the stale call was in.
        attempt: u32,
        /// What the stale call had learned: `landed`, `failed` or `none`.
        outcome: String,
    },
    /// A call waits before asking `verify` about an attempt nobody drives
    /// any more, so that a request the provider may still be applying has
    /// settled.
    Settling {
        /// How long it waits.
        wait_ms: u64,
    },
    /// An operator settled an escalation.
    Resolved {
        /// `landed`, `reissue` or `abandon`.
        resolution: String,
        /// The operator's note.
        note: String,
    },
    /// A call was answered without running: escalated, abandoned, in flight
    /// elsewhere or refused for drift.
    Refused {
        /// Why.
        reason: String,
    },
    /// A memoized step ran and its result was stored.
    StepRecorded,
    /// A memoized step's stored result was returned without running it.
    StepReplayed,
    /// A call needs a person's approval before it runs; nothing ran.
    ApprovalRequested {
        /// Why (the tool's approval policy said so).
        reason: String,
    },
    /// An operator approved a call: the next call of its key runs it.
    Approved {
        /// The operator's note.
        note: String,
        /// Through which surface (`runtime`, `api`, `cli`, `inbox`).
        via: String,
    },
    /// An operator refused a call: it never runs.
    NotApproved {
        /// The operator's note.
        note: String,
        /// Through which surface (`runtime`, `api`, `cli`, `inbox`).
        via: String,
    },
    /// A saga ran its body for the first time (`Ctx::saga`).
    SagaStarted {
        /// The saga's name.
        saga: String,
    },
    /// A saga's body failed semantically (or aborted): the compensations
    /// of its completed steps run now, in reverse order. Decided once and
    /// durably; a resumed saga goes on compensating.
    Compensating {
        /// The saga's name.
        saga: String,
        /// Why the saga is rolled back.
        reason: String,
        /// The completed compensable steps, in the order they ran, as
        /// `tool key`.
        steps: Vec<String>,
    },
    /// Every completed step of a saga was compensated.
    Compensated {
        /// The saga's name.
        saga: String,
        /// Why it was rolled back.
        reason: String,
        /// The steps undone, in the order their compensations ran.
        undone: Vec<String>,
    },
    /// A saga could not finish compensating: a person must look at what
    /// ran, what was undone and what is left (all in `reason`).
    SagaEscalated {
        /// The saga's name.
        saga: String,
        /// The evidence.
        reason: String,
    },
}

impl AuditEvent {
    /// The event as one line of JSON (no trailing newline).
    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

/// Per-tool counts derived from the audit stream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ToolStats {
    /// Calls made: new operations, replays, recoveries, refusals, and
    /// read-only calls of this process.
    pub calls: u64,
    /// Attempts that called the provider.
    pub attempts: u64,
    /// Retries after a failed attempt.
    pub retries: u64,
    /// Calls answered from the journal without calling the provider.
    pub dedupe_hits: u64,
    /// Responses the provider reported as replays of our key.
    pub provider_replays: u64,
    /// Operations recovered after a crash or a dropped call.
    pub recoveries: u64,
    /// `verify` calls.
    pub verifications: u64,
    /// Committed results.
    pub commits: u64,
    /// Semantic refusals by the provider.
    pub rejections: u64,
    /// Escalations to a human.
    pub escalations: u64,
    /// Calls whose arguments drifted from the first call of their key.
    pub drifts: u64,
    /// Calls that asked a person for approval.
    pub approvals_requested: u64,
    /// Approvals refused by a person.
    pub approvals_refused: u64,
}

/// Statistics for every tool seen in the audit stream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Stats {
    /// Per tool name.
    pub tools: BTreeMap<String, ToolStats>,
}

impl Stats {
    /// Folds one event into the counts.
    pub fn record(&mut self, event: &AuditEvent) {
        let t = self.tools.entry(event.tool.clone()).or_default();
        match &event.kind {
            EventKind::Intent { .. } => t.calls += 1,
            EventKind::Attempt { .. } => t.attempts += 1,
            EventKind::Retry { .. } => t.retries += 1,
            EventKind::Committed { .. } => t.commits += 1,
            EventKind::Rejected { .. } => t.rejections += 1,
            EventKind::DedupeHit => {
                t.calls += 1;
                t.dedupe_hits += 1;
            }
            EventKind::ProviderReplay { .. } => t.provider_replays += 1,
            EventKind::Recovered { .. } => {
                t.calls += 1;
                t.recoveries += 1;
            }
            EventKind::Verified { .. } => t.verifications += 1,
            EventKind::ArgsDrift { .. } => t.drifts += 1,
            EventKind::Escalated { .. } => t.escalations += 1,
            EventKind::Refused { .. } => t.calls += 1,
            EventKind::StepRecorded => t.calls += 1,
            EventKind::StepReplayed => {
                t.calls += 1;
                t.dedupe_hits += 1;
            }
            EventKind::ApprovalRequested { .. } => t.approvals_requested += 1,
            EventKind::NotApproved { .. } => t.approvals_refused += 1,
            EventKind::Failed { .. }
            | EventKind::Approved { .. }
            | EventKind::Resolved { .. }
            | EventKind::Amended { .. }
            | EventKind::Fenced { .. }
            | EventKind::Settling { .. }
            | EventKind::SagaStarted { .. }
            | EventKind::Compensating { .. }
            | EventKind::Compensated { .. }
            | EventKind::SagaEscalated { .. } => {}
        }
    }
}

/// An event as the engine hands it over: borrowed, so that emitting one
/// allocates nothing unless someone subscribes.
#[derive(Debug, Clone)]
pub struct Draft<'a> {
    /// When it happened (ms since the epoch, runtime clock).
    pub at_ms: u64,
    /// The tool (or `step:<name>`).
    pub tool: &'a str,
    /// The operation's key, for journaled operations.
    pub key: Option<&'a IdemKey>,
    /// The root run.
    pub root_run: &'a str,
    /// The agent path that made the call.
    pub agent: &'a str,
    /// The worker and incarnation that acted.
    pub worker: &'a Owner,
    /// What happened.
    pub kind: EventKind,
}

/// The stored form of an event: the key as its digest and generation (its
/// text is rebuilt from the tool name), the agent only when it differs from
/// the root run, the worker as its id and incarnation. Encoded from
/// borrowed fields, decoded into owned ones; bincode writes both the same
/// way.
#[derive(Serialize)]
struct StoredRef<'a> {
    at_ms: u64,
    tool: &'a str,
    key: Option<([u8; 32], u32)>,
    root_run: &'a str,
    agent: Option<&'a str>,
    worker: (&'a str, u64),
    kind: &'a EventKind,
}

#[derive(Deserialize)]
struct StoredOwned {
    at_ms: u64,
    tool: String,
    key: Option<([u8; 32], u32)>,
    root_run: String,
    agent: Option<String>,
    worker: (String, u64),
    kind: EventKind,
}

/// An event as record format 2 stored it, before events named their
/// worker: still read, never written.
#[derive(Deserialize)]
struct StoredV2 {
    at_ms: u64,
    tool: String,
    key: Option<([u8; 32], u32)>,
    root_run: String,
    agent: Option<String>,
    kind: EventKind,
}

/// How an event names its worker: `worker#incarnation` (as
/// [`Owner`]'s `Display` writes it).
pub fn worker_name(worker: &str, incarnation: u64) -> String {
    format!("{worker}#{incarnation:016x}")
}

/// The stored form of an event, for a journal write that carries it.
pub fn encode(draft: &Draft<'_>) -> Result<Vec<u8>, Error> {
    record::encode(
        Kind::Event,
        &StoredRef {
            at_ms: draft.at_ms,
            tool: draft.tool,
            key: draft.key.map(|k| (*k.digest(), k.generation())),
            root_run: draft.root_run,
            agent: (draft.agent != draft.root_run).then_some(draft.agent),
            worker: (&draft.worker.worker, draft.worker.incarnation),
            kind: &draft.kind,
        },
    )
}

/// Decodes a stored event (`location` and `seq` name it in errors).
///
/// Events of record format 2 (written before events named their worker)
/// decode with `worker: None`.
pub fn decode(location: &str, seq: u64, bytes: &[u8]) -> Result<AuditEvent, Error> {
    let id = seq.to_be_bytes();
    let (stored, worker) = if record::version_of(bytes) == Some(2) {
        let old: StoredV2 = record::decode(Kind::Event, bytes, location, &id)?;
        let stored = StoredOwned {
            at_ms: old.at_ms,
            tool: old.tool,
            key: old.key,
            root_run: old.root_run,
            agent: old.agent,
            worker: (String::new(), 0),
            kind: old.kind,
        };
        (stored, None)
    } else {
        let stored: StoredOwned = record::decode(Kind::Event, bytes, location, &id)?;
        let worker = worker_name(&stored.worker.0, stored.worker.1);
        (stored, Some(worker))
    };
    Ok(AuditEvent {
        worker,
        seq,
        at_ms: stored.at_ms,
        key: stored
            .key
            .map(|(digest, gen)| IdemKey::from_parts(&stored.tool, digest, gen).to_string()),
        agent: stored.agent.unwrap_or_else(|| stored.root_run.clone()),
        tool: stored.tool,
        root_run: stored.root_run,
        kind: stored.kind,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::RECORD_VERSION;

    fn owner() -> Owner {
        Owner {
            worker: "pod-7".into(),
            incarnation: 0x5eed,
        }
    }

    fn key() -> IdemKey {
        IdemKey::from_parts("send_email", [7; 32], 0)
    }

    #[test]
    fn an_event_names_the_worker_and_incarnation_that_wrote_it() {
        let key = key();
        let owner = owner();
        let bytes = encode(&Draft {
            at_ms: 5,
            tool: "send_email",
            key: Some(&key),
            root_run: "order-1",
            agent: "order-1",
            worker: &owner,
            kind: EventKind::Attempt { attempt: 1 },
        })
        .unwrap();
        assert_eq!(record::version_of(&bytes), Some(RECORD_VERSION));
        let ev = decode("test", 3, &bytes).unwrap();
        assert_eq!(ev.worker.as_deref(), Some("pod-7#0000000000005eed"));
        assert_eq!(ev.worker.as_deref(), Some(&*owner.to_string()));
        assert!(ev
            .to_json_line()
            .contains(r#""worker":"pod-7#0000000000005eed""#));
    }

    /// The bytes of events as this format writes them (keyed, with an
    /// agent of its own, and neither): whatever writes them, journals on
    /// disk hold these.
    #[test]
    fn events_keep_their_bytes() {
        let key = IdemKey::from_parts("send_email", [7; 32], 1);
        let owner = owner();
        let event = |agent, kind| {
            let bytes = encode(&Draft {
                at_ms: 1_700_000_000_123,
                tool: "send_email",
                key: Some(&key),
                root_run: "order-1",
                agent,
                worker: &owner,
                kind,
            })
            .unwrap();
            crate::key::hex(&bytes)
        };
        let head = "fd7b68e5cf8b0100000a73656e645f656d61696c010707070707070707070707070707070707\
                    07070707070707070707070707070701076f726465722d31";
        let intent = event(
            "order-1",
            EventKind::Intent {
                generation: 1,
                fingerprint: crate::key::hex(&[9; 32]),
            },
        );
        // The fingerprint's 64 hex digits, "0909...", as a string.
        let digits = "3039".repeat(32);
        assert_eq!(
            intent,
            format!("4504cabe6afc{head}0005706f642d37fbed5e000140{digits}")
        );
        let attempt = event("order-1/sub", EventKind::Attempt { attempt: 3 });
        assert_eq!(
            attempt,
            format!("4504f7e3bdcb{head}010b6f726465722d312f73756205706f642d37fbed5e0103")
        );
        let committed = event(
            "order-1",
            EventKind::Committed {
                attempt: 3,
                via: "call".into(),
            },
        );
        assert_eq!(
            committed,
            format!("45048cf4daa8{head}0005706f642d37fbed5e03030463616c6c")
        );
        let unkeyed = encode(&Draft {
            at_ms: 5,
            tool: "lookup",
            key: None,
            root_run: "r",
            agent: "r",
            worker: &owner,
            kind: EventKind::DedupeHit,
        })
        .unwrap();
        assert_eq!(
            crate::key::hex(&unkeyed),
            "4504004cbb8f05066c6f6f6b75700001720005706f642d37fbed5e06"
        );
    }

    /// What format 2 wrote: the same fields without the worker.
    #[derive(Serialize)]
    struct Format2<'a> {
        at_ms: u64,
        tool: &'a str,
        key: Option<([u8; 32], u32)>,
        root_run: &'a str,
        agent: Option<&'a str>,
        kind: &'a EventKind,
    }

    #[test]
    fn events_of_format_2_still_decode_without_a_worker() {
        let key = key();
        let kind = EventKind::Committed {
            attempt: 1,
            via: "call".into(),
        };
        let mut bytes = record::encode(
            Kind::Event,
            &Format2 {
                at_ms: 5,
                tool: "send_email",
                key: Some((*key.digest(), key.generation())),
                root_run: "order-1",
                agent: None,
                kind: &kind,
            },
        )
        .unwrap();
        // Format 2's checksum covered the body alone.
        bytes[1] = 2;
        let crc = record::frame_checksum(2, &bytes[6..]);
        bytes[2..6].copy_from_slice(&crc.to_le_bytes());
        let ev = decode("test", 3, &bytes).unwrap();
        assert_eq!(ev.worker, None);
        assert_eq!(ev.kind, kind);
        assert_eq!(ev.key.as_deref(), Some(key.as_str()));
        assert_eq!(ev.agent, "order-1");
        // The same body claiming the current format (with a checksum that
        // matches) is refused, not misread.
        bytes[1] = RECORD_VERSION;
        let crc = record::frame_checksum(RECORD_VERSION, &bytes[6..]);
        bytes[2..6].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            decode("test", 3, &bytes),
            Err(Error::Corrupt { .. })
        ));
    }
}
