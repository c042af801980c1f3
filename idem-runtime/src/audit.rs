//! The audit stream: every decision the engine takes, as a durable event
//! with a sequence number, readable from any sequence, live, as JSON lines,
//! and as `tracing` events; and the per-tool statistics derived from it.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::class::OnDrift;
use crate::error::Error;
use crate::journal::{Durability, Journal, NewEvent};
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
    /// What happened.
    pub kind: EventKind,
}

/// What an [`AuditEvent`] records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
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
}

impl AuditEvent {
    /// The event as one line of JSON (no trailing newline).
    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

/// Per-tool counts derived from the audit stream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
}

/// Statistics for every tool seen in the audit stream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
            EventKind::Failed { .. }
            | EventKind::Resolved { .. }
            | EventKind::Amended { .. }
            | EventKind::Fenced { .. }
            | EventKind::Settling { .. } => {}
        }
    }
}

/// A live view of the audit stream; see `Runtime::subscribe`.
#[derive(Debug)]
pub struct Subscription {
    rx: broadcast::Receiver<AuditEvent>,
}

/// Why [`Subscription::recv`] returned no event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubscriptionError {
    /// The subscriber fell behind and `missed` events were dropped for it;
    /// read them back with `Runtime::audit`. The subscription goes on.
    #[error("subscriber lagged: {missed} events skipped; read them with Runtime::audit")]
    Lagged {
        /// How many events were skipped.
        missed: u64,
    },
    /// The runtime is gone.
    #[error("the runtime was dropped")]
    Closed,
}

impl Subscription {
    /// The next event.
    pub async fn recv(&mut self) -> Result<AuditEvent, SubscriptionError> {
        self.rx.recv().await.map_err(|e| match e {
            broadcast::error::RecvError::Lagged(missed) => SubscriptionError::Lagged { missed },
            broadcast::error::RecvError::Closed => SubscriptionError::Closed,
        })
    }

    /// The next event if one is ready now.
    pub fn try_recv(&mut self) -> Option<Result<AuditEvent, SubscriptionError>> {
        match self.rx.try_recv() {
            Ok(e) => Some(Ok(e)),
            Err(broadcast::error::TryRecvError::Empty) => None,
            Err(broadcast::error::TryRecvError::Lagged(missed)) => {
                Some(Err(SubscriptionError::Lagged { missed }))
            }
            Err(broadcast::error::TryRecvError::Closed) => Some(Err(SubscriptionError::Closed)),
        }
    }
}

/// An event as the engine hands it over: borrowed, so that emitting one
/// allocates nothing unless someone subscribes.
pub(crate) struct Draft<'a> {
    pub at_ms: u64,
    pub tool: &'a str,
    pub key: Option<&'a IdemKey>,
    pub root_run: &'a str,
    pub agent: &'a str,
    pub kind: EventKind,
}

/// The stored form of an event: the key as its digest and generation (its
/// text is rebuilt from the tool name), the agent only when it differs from
/// the root run. Encoded from borrowed fields, decoded into owned ones;
/// bincode writes both the same way.
#[derive(Serialize)]
struct StoredRef<'a> {
    at_ms: u64,
    tool: &'a str,
    key: Option<([u8; 32], u32)>,
    root_run: &'a str,
    agent: Option<&'a str>,
    kind: &'a EventKind,
}

#[derive(Deserialize)]
struct StoredOwned {
    at_ms: u64,
    tool: String,
    key: Option<([u8; 32], u32)>,
    root_run: String,
    agent: Option<String>,
    kind: EventKind,
}

/// The runtime's side of the stream.
pub(crate) struct AuditLog {
    live: broadcast::Sender<AuditEvent>,
    /// Read-only calls are not journaled (their overhead budget is under a
    /// microsecond); this process counts them here.
    read_only: Mutex<HashMap<&'static str, u64>>,
}

impl AuditLog {
    pub(crate) fn new() -> Self {
        AuditLog {
            live: broadcast::channel(4096).0,
            read_only: Mutex::new(HashMap::new()),
        }
    }

    /// Appends an event that records no state change, publishes it to
    /// subscribers and to `tracing`.
    pub(crate) async fn emit(
        &self,
        journal: &dyn Journal,
        draft: Draft<'_>,
        durability: Durability,
    ) -> Result<u64, Error> {
        let bytes = Self::encode(&draft)?;
        let event = NewEvent {
            key: draft.key.map(IdemKey::digest),
            bytes: &bytes,
        };
        let seq = journal.append(&[event], durability).await?[0];
        self.publish(seq, draft);
        Ok(seq)
    }

    /// The stored form of an event, for a journal write that carries it.
    pub(crate) fn encode(draft: &Draft<'_>) -> Result<Vec<u8>, Error> {
        record::encode(
            Kind::Event,
            &StoredRef {
                at_ms: draft.at_ms,
                tool: draft.tool,
                key: draft.key.map(|k| (*k.digest(), k.generation())),
                root_run: draft.root_run,
                agent: (draft.agent != draft.root_run).then_some(draft.agent),
                kind: &draft.kind,
            },
        )
    }

    /// Tells subscribers and `tracing` about an event the journal holds as
    /// `seq`.
    pub(crate) fn publish(&self, seq: u64, draft: Draft<'_>) {
        tracing::info!(
            target: "idem::audit",
            seq,
            tool = draft.tool,
            key = %draft.key.map_or("", IdemKey::as_str),
            root_run = draft.root_run,
            event = ?draft.kind,
        );
        if self.live.receiver_count() > 0 {
            let _ = self.live.send(AuditEvent {
                seq,
                at_ms: draft.at_ms,
                tool: draft.tool.to_string(),
                key: draft.key.map(|k| k.to_string()),
                root_run: draft.root_run.to_string(),
                agent: draft.agent.to_string(),
                kind: draft.kind,
            });
        }
    }

    pub(crate) fn count_read_only(&self, tool: &'static str) {
        *self
            .read_only
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(tool)
            .or_insert(0) += 1;
    }

    pub(crate) fn subscribe(&self) -> Subscription {
        Subscription {
            rx: self.live.subscribe(),
        }
    }

    /// Decodes a stored event.
    pub(crate) fn decode(location: &str, seq: u64, bytes: &[u8]) -> Result<AuditEvent, Error> {
        let stored: StoredOwned = record::decode(Kind::Event, bytes, location, &seq.to_be_bytes())?;
        Ok(AuditEvent {
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

    /// Up to `limit` durable events from `from`.
    pub(crate) async fn read(
        journal: &dyn Journal,
        from: u64,
        limit: usize,
    ) -> Result<Vec<AuditEvent>, Error> {
        journal
            .events(from, limit)
            .await?
            .into_iter()
            .map(|(seq, bytes)| Self::decode(journal.location(), seq, &bytes))
            .collect()
    }

    /// Every durable event from `from`, a page at a time into `each`.
    pub(crate) async fn for_each(
        journal: &dyn Journal,
        from: u64,
        mut each: impl FnMut(AuditEvent) -> Result<(), Error>,
    ) -> Result<u64, Error> {
        let mut from = from;
        let mut n = 0;
        loop {
            let page = Self::read(journal, from, 4096).await?;
            let Some(last) = page.last().map(|e| e.seq) else {
                return Ok(n);
            };
            for e in page {
                each(e)?;
                n += 1;
            }
            from = last + 1;
        }
    }

    pub(crate) async fn stats(&self, journal: &dyn Journal) -> Result<Stats, Error> {
        let mut stats = Stats::default();
        Self::for_each(journal, 0, |e| {
            stats.record(&e);
            Ok(())
        })
        .await?;
        for (tool, n) in self
            .read_only
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            stats.tools.entry((*tool).to_string()).or_default().calls += n;
        }
        Ok(stats)
    }

    pub(crate) async fn export_jsonl(
        journal: &dyn Journal,
        from: u64,
        out: &mut (dyn Write + Send),
    ) -> Result<u64, Error> {
        let location = journal.location().to_string();
        Self::for_each(journal, from, |e| {
            writeln!(out, "{}", e.to_json_line())
                .map_err(|e| Error::storage("export audit", &location, e))
        })
        .await
    }
}
