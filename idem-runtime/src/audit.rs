//! The audit stream: every decision the engine takes, as a durable event
//! with a sequence number, readable from any sequence, live, as JSON lines,
//! and as `tracing` events; and the per-tool statistics derived from it.

use std::io::Write;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use idem_journal::audit::{self as stored, AuditEvent, Draft, Stats};
use idem_journal::error::Error;
use idem_journal::journal::{Digest, Durability, Journal, NewEvent};
use idem_journal::key::IdemKey;
use tokio::sync::{broadcast, Notify};

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
    /// Events held back to be written together (journals whose every
    /// write is a round trip).
    held: Arc<Held>,
    /// This runtime's metrics: counted from the events published, and by
    /// the calls themselves. Read-only calls are not journaled (their
    /// overhead budget is under a microsecond); this process counts them
    /// there.
    pub(crate) metrics: Metrics,
}

impl AuditLog {
    pub(crate) fn new() -> Self {
        let live = broadcast::channel(4096).0;
        AuditLog {
            held: Arc::new(Held {
                events: Mutex::default(),
                flushing: tokio::sync::Mutex::new(()),
                wake: Notify::new(),
                full: Notify::new(),
                task: Mutex::default(),
                live: live.clone(),
            }),
            live,
            metrics: Metrics::default(),
        }
    }

    /// Holds an event that records no decision, to be written with others
    /// within [`HOLD_FOR`] (or at the next [`flush`](Self::flush)); counted
    /// at once, published to subscribers once written. `Ok(false)`: not
    /// held (too many are waiting, or there is no tokio runtime to write
    /// them later); append it as usual.
    pub(crate) fn hold(&self, journal: &Arc<dyn Journal>, draft: Draft<'_>) -> Result<bool, Error> {
        let bytes = stored::encode(&draft)?;
        let mut events = self.held.events.lock().unwrap_or_else(|p| p.into_inner());
        if events.len() >= HOLD_AT_MOST || !self.held.started(journal) {
            return Ok(false);
        }
        self.metrics.event(draft.tool, &draft.kind);
        events.push(HeldEvent {
            digest: draft.key.map(|k| *k.digest()),
            bytes,
            event: owned(0, draft),
        });
        match events.len() {
            1 => self.held.wake.notify_one(),
            WRITE_AT => self.held.full.notify_one(),
            _ => {}
        }
        Ok(true)
    }

    /// Writes every held event now (and waits for a write already under
    /// way): what `Runtime::sync` and the stream's readers do first.
    pub(crate) async fn flush(&self, journal: &dyn Journal) -> Result<(), Error> {
        self.held.flush(journal).await
    }

    /// Stops the writer of held events and writes what it still held, in
    /// the background (a runtime that is being dropped cannot wait).
    pub(crate) fn close(&self, journal: &Arc<dyn Journal>) {
        if let Some(task) = self.held.task.lock().ok().and_then(|mut t| t.take()) {
            task.abort();
        }
        let empty = self
            .held
            .events
            .lock()
            .map_or(true, |events| events.is_empty());
        if empty {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let (held, journal) = (Arc::clone(&self.held), Arc::clone(journal));
                handle.spawn(async move {
                    if let Err(e) = held.flush(&*journal).await {
                        tracing::warn!(target: "idem::audit", error = %e, "held audit events (replays) could not be written at close");
                    }
                });
            }
            Err(_) => {
                tracing::warn!(target: "idem::audit", "held audit events (replays) dropped: the runtime was dropped outside tokio before they were written");
            }
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
            let _ = self.live.send(owned(seq, draft));
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

/// How long an event that records no decision may be held before it is
/// written: well inside PostgreSQL's own bound for asynchronous commits
/// (three times `wal_writer_delay`, 600 ms by default), so holding adds
/// little to what such an event could already lose.
pub(crate) const HOLD_FOR: Duration = Duration::from_millis(20);

/// Held events that start a write before [`HOLD_FOR`] is up.
const WRITE_AT: usize = 1024;

/// Beyond this many held events (the journal is not taking them), events
/// are appended one by one again, each reporting its own failure.
const HOLD_AT_MOST: usize = 64 * 1024;

/// Events per statement (the journal takes fewer than 65,536 at once).
const PER_WRITE: usize = 4096;

/// Events that record no decision, waiting to be written in one statement.
struct Held {
    events: Mutex<Vec<HeldEvent>>,
    /// One write at a time, so held events keep their order, and a flush
    /// waits for the write under way.
    flushing: tokio::sync::Mutex<()>,
    /// The first event held since the last write.
    wake: Notify,
    /// [`WRITE_AT`] events held.
    full: Notify,
    /// The writer, started with the first held event.
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    live: broadcast::Sender<AuditEvent>,
}

struct HeldEvent {
    digest: Option<Digest>,
    bytes: Vec<u8>,
    /// What subscribers get, numbered once written.
    event: AuditEvent,
}

impl Held {
    /// Whether the writer runs (started now if need be; never without a
    /// tokio runtime to run it).
    fn started(self: &Arc<Self>, journal: &Arc<dyn Journal>) -> bool {
        let mut task = self.task.lock().unwrap_or_else(|p| p.into_inner());
        if task.is_some() {
            return true;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let weak: Weak<Held> = Arc::downgrade(self);
        let journal: Weak<dyn Journal> = Arc::downgrade(journal);
        *task = Some(handle.spawn(async move {
            loop {
                let Some(waiting) = weak.upgrade() else { return };
                waiting.wake.notified().await;
                // Until the bound, or until enough are held to write.
                let _ = tokio::time::timeout(HOLD_FOR, waiting.full.notified()).await;
                drop(waiting);
                let (Some(held), Some(journal)) = (weak.upgrade(), journal.upgrade()) else {
                    return;
                };
                let wrote = held.flush(&*journal).await;
                drop((held, journal));
                if let Err(e) = wrote {
                    tracing::warn!(target: "idem::audit", error = %e, "held audit events (replays) could not be written; trying again in a second");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    let Some(held) = weak.upgrade() else { return };
                    held.wake.notify_one();
                }
            }
        }));
        true
    }

    async fn flush(&self, journal: &dyn Journal) -> Result<(), Error> {
        let _one = self.flushing.lock().await;
        let mut batch = std::mem::take(&mut *self.events.lock().unwrap_or_else(|p| p.into_inner()));
        while !batch.is_empty() {
            let rest = batch.split_off(batch.len().min(PER_WRITE));
            let events: Vec<NewEvent<'_>> = batch
                .iter()
                .map(|e| NewEvent {
                    key: e.digest.as_ref(),
                    bytes: &e.bytes,
                })
                .collect();
            let written = journal.append(&events, Durability::Eventual).await;
            drop(events);
            let seqs = match written {
                Ok(seqs) => seqs,
                Err(e) => {
                    // Back in front, in order, for the next try.
                    let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
                    let later = std::mem::take(&mut *events);
                    batch.extend(rest);
                    batch.extend(later);
                    *events = batch;
                    return Err(e);
                }
            };
            for (held, seq) in batch.into_iter().zip(seqs) {
                let mut event = held.event;
                event.seq = seq;
                tracing::info!(
                    target: "idem::audit",
                    seq,
                    tool = %event.tool,
                    key = %event.key.as_deref().unwrap_or(""),
                    root_run = %event.root_run,
                    worker = %event.worker.as_deref().unwrap_or(""),
                    event = ?event.kind,
                );
                if self.live.receiver_count() > 0 {
                    let _ = self.live.send(event);
                }
            }
            batch = rest;
        }
        Ok(())
    }
}

/// The event subscribers get.
fn owned(seq: u64, draft: Draft<'_>) -> AuditEvent {
    AuditEvent {
        seq,
        at_ms: draft.at_ms,
        tool: draft.tool.to_string(),
        key: draft.key.map(|k| k.to_string()),
        root_run: draft.root_run.to_string(),
        agent: draft.agent.to_string(),
        worker: Some(draft.worker.to_string()),
        kind: draft.kind,
    }
}
