//! The audit stream: every decision the engine takes, as a durable event
//! with a sequence number, readable from any sequence, live, as JSON lines,
//! and as `tracing` events; and the per-tool statistics derived from it.

use std::io::Write;

use idem_journal::audit::{self as stored, AuditEvent, Draft, Stats};
use idem_journal::error::Error;
use idem_journal::journal::{Durability, Journal, NewEvent};
use idem_journal::key::IdemKey;
use tokio::sync::broadcast;

use crate::metrics::Metrics;

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

/// The runtime's side of the stream.
pub(crate) struct AuditLog {
    live: broadcast::Sender<AuditEvent>,
    /// This runtime's metrics: counted from the events published, and by
    /// the calls themselves. Read-only calls are not journaled (their
    /// overhead budget is under a microsecond); this process counts them
    /// there.
    pub(crate) metrics: Metrics,
}

impl AuditLog {
    pub(crate) fn new() -> Self {
        AuditLog {
            live: broadcast::channel(4096).0,
            metrics: Metrics::default(),
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
        let bytes = stored::encode(&draft)?;
        let event = NewEvent {
            key: draft.key.map(IdemKey::digest),
            bytes: &bytes,
        };
        let seq = journal.append(&[event], durability).await?[0];
        self.publish(seq, draft);
        Ok(seq)
    }

    /// Tells subscribers and `tracing` about an event the journal holds as
    /// `seq`.
    pub(crate) fn publish(&self, seq: u64, draft: Draft<'_>) {
        self.metrics.event(draft.tool, &draft.kind);
        tracing::info!(
            target: "idem::audit",
            seq,
            tool = draft.tool,
            key = %draft.key.map_or("", IdemKey::as_str),
            root_run = draft.root_run,
            worker = %draft.worker,
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
                worker: Some(draft.worker.to_string()),
                kind: draft.kind,
            });
        }
    }

    pub(crate) fn subscribe(&self) -> Subscription {
        Subscription {
            rx: self.live.subscribe(),
        }
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
            .map(|(seq, bytes)| stored::decode(journal.location(), seq, &bytes))
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
        for m in self.metrics.tools() {
            if m.class() == Some(idem_journal::class::Class::ReadOnly) {
                stats.tools.entry(m.name().to_string()).or_default().calls += m.calls();
            }
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
