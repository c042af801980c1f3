//! `Runtime`: the open journal, the clock, the audit stream and the table of
//! calls in flight in this process.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::audit::{AuditEvent, AuditLog, Draft, EventKind, Stats, Subscription};
use crate::clock::{Clock, SystemClock};
use crate::ctx::Ctx;
use crate::error::Error;
use crate::escalation::{Escalation, Resolution};
use crate::journal::{Cas, Journal, SledJournal, SledOptions, Space};
use crate::key::IdemKey;
use crate::record::{self, Kind, OpRecord, ResolutionInfo, State, Via};
use crate::retry::Jitter;

/// The idem runtime: an open journal and everything that acts on it.
///
/// Cheap to clone; every clone and every [`Ctx`] made from it share one
/// journal, which is released when the last of them is dropped.
#[derive(Clone)]
pub struct Runtime {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("journal", &self.shared.journal.location())
            .finish()
    }
}

pub(crate) struct Shared {
    pub(crate) journal: Arc<dyn Journal>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) audit: AuditLog,
    pub(crate) inflight: InFlight,
    pub(crate) jitter: Jitter,
    /// Identifies this process's writes in records.
    pub(crate) incarnation: u64,
    pub(crate) in_flight_wait: Duration,
    pub(crate) retention: Duration,
}

/// Options for [`Runtime`]; see [`Runtime::builder`].
pub struct RuntimeBuilder {
    path: Option<PathBuf>,
    journal: Option<Arc<dyn Journal>>,
    clock: Option<Arc<dyn Clock>>,
    sled: SledOptions,
    in_flight_wait: Duration,
    retention: Duration,
}

impl std::fmt::Debug for RuntimeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeBuilder")
            .field("path", &self.path)
            .field("sled", &self.sled)
            .field("in_flight_wait", &self.in_flight_wait)
            .field("retention", &self.retention)
            .finish()
    }
}

impl RuntimeBuilder {
    /// The journal directory (sled). Created if missing.
    pub fn path(mut self, path: impl AsRef<Path>) -> Self {
        self.path = Some(path.as_ref().to_path_buf());
        self
    }

    /// Uses an already open journal instead of opening one by path (another
    /// implementation, or a wrapper that injects faults in tests).
    pub fn journal(mut self, journal: Arc<dyn Journal>) -> Self {
        self.journal = Some(journal);
        self
    }

    /// The clock for durable timestamps (default: [`SystemClock`]).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// sled's cache size in bytes (default 64 MiB): bounds memory whatever
    /// the number of records.
    pub fn cache_capacity(mut self, bytes: u64) -> Self {
        self.sled.cache_capacity = bytes;
        self
    }

    /// How long a call waits for another call of the same key in this
    /// process to finish before returning `ToolError::InFlight` (default
    /// 30 s). A call whose driver was dropped releases its waiters at once.
    pub fn in_flight_wait(mut self, wait: Duration) -> Self {
        self.in_flight_wait = wait;
        self
    }

    /// How long finished operations, memoized steps and audit events are
    /// kept before [`Runtime::prune`] may remove them (default 7 days). Never
    /// shorter, in effect, than the longest `dedupe_window` of the tools in
    /// the binary: a key forgotten by idem but remembered by the provider
    /// would turn a replay into a provider-side conflict.
    pub fn retention(mut self, keep: Duration) -> Self {
        self.retention = keep;
        self
    }

    /// Opens the journal and starts the runtime.
    pub fn open(self) -> Result<Runtime, Error> {
        crate::class::check_unique_names()?;
        let journal: Arc<dyn Journal> = match (self.journal, self.path) {
            (Some(j), _) => j,
            (None, Some(p)) => Arc::new(SledJournal::open_with(p, &self.sled)?),
            (None, None) => {
                return Err(Error::Usage(
                    "Runtime::builder() needs a .path(...) or a .journal(...)".into(),
                ))
            }
        };
        let incarnation = incarnation();
        Ok(Runtime {
            shared: Arc::new(Shared {
                journal,
                clock: self.clock.unwrap_or_else(|| Arc::new(SystemClock::new())),
                audit: AuditLog::new(),
                inflight: InFlight::default(),
                jitter: Jitter::new(incarnation),
                incarnation,
                in_flight_wait: self.in_flight_wait,
                retention: self.retention,
            }),
        })
    }
}

/// A process-unique id: time, pid and the standard library's random hash
/// keys; it only has to differ between incarnations of a journal's owner.
fn incarnation() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

impl Runtime {
    /// Opens (or creates) the embedded sled journal in directory `path`.
    ///
    /// Fails with [`Error::InUse`] if another process holds it, with
    /// [`Error::NotAJournal`] if the directory holds something else, and
    /// with [`Error::UnsupportedFormat`] if a newer idem wrote it; in every
    /// case nothing is changed.
    pub fn open(path: impl AsRef<Path>) -> Result<Runtime, Error> {
        Runtime::builder().path(path).open()
    }

    /// A builder for the less common options.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder {
            path: None,
            journal: None,
            clock: None,
            sled: SledOptions::default(),
            in_flight_wait: Duration::from_secs(30),
            retention: Duration::from_secs(7 * 24 * 3600),
        }
    }

    /// The context of root run `root_id` (a durable workflow id: the same
    /// id after a restart means the same operations).
    pub fn run(&self, root_id: &str) -> Ctx {
        Ctx::root(self.shared.clone(), root_id)
    }

    /// The journal.
    pub fn journal(&self) -> &Arc<dyn Journal> {
        &self.shared.journal
    }

    /// Every operation currently parked for a human, oldest first.
    pub fn escalations(&self) -> Result<Vec<Escalation>, Error> {
        let journal = &*self.shared.journal;
        let mut out = Vec::new();
        for item in journal.scan(Space::Escalations, &[]) {
            let (digest, _) = item?;
            let Some(bytes) = journal.get(Space::Ops, &digest)? else {
                continue;
            };
            let rec: OpRecord = record::decode(Kind::Op, &bytes, journal.location(), &digest)?;
            if rec.state != State::Escalated {
                continue;
            }
            out.push(escalation_of(&digest, &rec)?);
        }
        out.sort_by_key(|e| e.escalated_ms);
        Ok(out)
    }

    /// Settles an escalated operation. `Landed` commits the given result
    /// (replayed to later calls), `Reissue` lets the next call run it again,
    /// `Abandon` refuses every later call. Durable when this returns.
    pub fn resolve(&self, key: &IdemKey, resolution: Resolution, note: &str) -> Result<(), Error> {
        let journal = &*self.shared.journal;
        let digest = key.digest();
        let bytes = journal
            .get(Space::Ops, digest)?
            .ok_or_else(|| Error::UnknownKey {
                key: key.to_string(),
            })?;
        let mut rec: OpRecord = record::decode(Kind::Op, &bytes, journal.location(), digest)?;
        if rec.state != State::Escalated {
            return Err(Error::NotEscalated {
                key: key.to_string(),
                state: rec.state.name().to_string(),
            });
        }
        let now = self.shared.clock.now_ms();
        rec.state = match &resolution {
            Resolution::Landed(result) => State::Committed {
                result: result
                    .as_ref()
                    .map_or_else(|| "null".to_string(), |v| v.to_string()),
                via: Via::Operator,
            },
            Resolution::Reissue => State::Reissue,
            Resolution::Abandon => State::Abandoned,
        };
        rec.maybe_landed = false;
        rec.updated_ms = now;
        rec.resolution = Some(ResolutionInfo {
            kind: resolution.label().to_string(),
            note: note.to_string(),
            at_ms: now,
        });
        let new = record::encode(Kind::Op, &rec)?;
        let current_key = key.with_generation(rec.generation);
        let draft = |kind| Draft {
            at_ms: now,
            tool: &rec.tool,
            key: Some(&current_key),
            root_run: &rec.root_run,
            agent: "operator",
            kind,
        };
        let mut drafts = vec![draft(EventKind::Resolved {
            resolution: resolution.label().to_string(),
            note: note.to_string(),
        })];
        if let Resolution::Landed(_) = resolution {
            // It is a commit like any other, for the stream and for stats.
            drafts.push(draft(EventKind::Committed {
                attempt: 0,
                via: "operator".into(),
            }));
        }
        let events = drafts
            .iter()
            .map(AuditLog::encode)
            .collect::<Result<Vec<_>, _>>()?;
        let (cas, seqs) = journal.compare_and_swap_with_events(
            Space::Ops,
            digest,
            Some(&bytes),
            Some(&new),
            &events,
        )?;
        if cas != Cas::Swapped {
            return Err(Error::Conflict {
                key: key.to_string(),
            });
        }
        for (seq, d) in seqs.into_iter().zip(drafts) {
            self.shared.audit.publish(seq, d);
        }
        journal.remove(Space::Escalations, digest)?;
        journal.sync_blocking()
    }

    /// The retention in effect: the configured one, raised to the longest
    /// dedupe window of any tool in this binary.
    pub fn retention(&self) -> Duration {
        crate::class::tools()
            .map(|t| t.dedupe_window)
            .fold(self.shared.retention, Duration::max)
    }

    /// Removes what is older than [`Runtime::retention`]: finished
    /// operations (committed, rejected, failed, abandoned), memoized steps
    /// and audit events. Operations in flight, waiting, escalated or
    /// reissued are never removed, however old. A record that cannot be
    /// decoded is left alone and counted. Durable when this returns.
    pub fn prune(&self) -> Result<PruneReport, Error> {
        let journal = &*self.shared.journal;
        let now = self.shared.clock.now_ms();
        let cutoff = now.saturating_sub(self.retention().as_millis() as u64);
        let mut report = PruneReport {
            cutoff_ms: cutoff,
            ..PruneReport::default()
        };
        let mut doomed = Vec::new();
        for item in journal.scan(Space::Ops, &[]) {
            let (key, bytes) = item?;
            report.ops_scanned += 1;
            match record::decode::<OpRecord>(Kind::Op, &bytes, journal.location(), &key) {
                Ok(rec) if rec.updated_ms < cutoff && rec.state.is_finished() => {
                    doomed.push((key, bytes));
                }
                Ok(rec) if !rec.state.is_finished() => report.ops_kept_open += 1,
                Ok(_) => {}
                Err(_) => report.undecodable += 1,
            }
        }
        for (key, bytes) in doomed {
            // A call that changed the record since we read it wins.
            if journal.compare_and_swap(Space::Ops, &key, Some(&bytes), None)? == Cas::Swapped {
                report.ops_removed += 1;
            }
        }
        let mut old_steps = Vec::new();
        for item in journal.scan(Space::Steps, &[]) {
            let (key, bytes) = item?;
            match record::decode::<record::StepRecord>(Kind::Step, &bytes, journal.location(), &key)
            {
                Ok(step) if step.at_ms < cutoff => old_steps.push(key),
                Ok(_) => {}
                Err(_) => report.undecodable += 1,
            }
        }
        for key in old_steps {
            journal.remove(Space::Steps, &key)?;
            report.steps_removed += 1;
        }
        // Events are in sequence order, which is time order.
        let mut first_kept = None;
        for event in AuditLog::read(journal, 0) {
            let event = event?;
            if event.at_ms >= cutoff {
                first_kept = Some(event.seq);
                break;
            }
        }
        let before = first_kept.unwrap_or(u64::MAX);
        report.events_removed = journal.truncate(Space::Audit, &before.to_be_bytes())?;
        journal.sync_blocking()?;
        Ok(report)
    }

    /// Bytes the journal uses on disk.
    pub fn size_on_disk(&self) -> Result<u64, Error> {
        self.shared.journal.size_on_disk()
    }

    /// The durable audit stream from sequence number `from` (0: all).
    pub fn audit(&self, from: u64) -> impl Iterator<Item = Result<AuditEvent, Error>> + '_ {
        AuditLog::read(&*self.shared.journal, from)
    }

    /// Writes the audit stream from `from` as JSON lines; returns how many.
    pub fn export_audit(&self, from: u64, out: &mut dyn Write) -> Result<u64, Error> {
        AuditLog::export_jsonl(&*self.shared.journal, from, out)
    }

    /// Live audit events from now on.
    pub fn subscribe(&self) -> Subscription {
        self.shared.audit.subscribe()
    }

    /// Per-tool counts derived from the whole audit stream (plus read-only
    /// calls made by this process, which are not journaled).
    pub fn stats(&self) -> Result<Stats, Error> {
        self.shared.audit.stats(&*self.shared.journal)
    }
}

/// What [`Runtime::prune`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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

pub(crate) fn escalation_of(digest: &[u8], rec: &OpRecord) -> Result<Escalation, Error> {
    let digest: [u8; 32] = digest.try_into().map_err(|_| Error::Corrupt {
        what: "escalation index",
        location: String::new(),
        key: crate::key::hex(digest),
        detail: "key is not a 32-byte digest".into(),
    })?;
    let esc = rec.escalation.clone().unwrap_or(record::EscalationInfo {
        reason: String::new(),
        at_ms: rec.updated_ms,
    });
    Ok(Escalation {
        key: IdemKey::from_parts(&rec.tool, digest, rec.generation),
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
    })
}

/// Calls in flight in this process, by key digest. The leader holds a
/// [`Slot`]; others wait for it to be dropped, which happens when the call
/// ends *or* when its future is dropped, so no waiter outlives its leader.
#[derive(Default)]
pub(crate) struct InFlight {
    slots: Mutex<HashMap<[u8; 32], watch::Receiver<()>>>,
}

pub(crate) enum Entry<'a> {
    Leader(Slot<'a>),
    Busy(watch::Receiver<()>),
}

pub(crate) struct Slot<'a> {
    table: &'a InFlight,
    digest: [u8; 32],
    _tx: watch::Sender<()>,
}

impl InFlight {
    pub(crate) fn enter(&self, digest: &[u8; 32]) -> Entry<'_> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(rx) = slots.get(digest) {
            return Entry::Busy(rx.clone());
        }
        let (tx, rx) = watch::channel(());
        slots.insert(*digest, rx);
        Entry::Leader(Slot {
            table: self,
            digest: *digest,
            _tx: tx,
        })
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        // Leave the table before the sender drops, so a woken waiter finds
        // the slot free.
        self.table
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.digest);
    }
}
