//! `Runtime`: the open journal, the clock, the audit stream, this process's
//! identity as a claim owner, and the operator's side (escalations,
//! resolutions, retention, statistics).

use std::io::Write;
#[cfg(feature = "sled")]
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::audit::{AuditLog, Subscription};
use crate::builder::RuntimeBuilder;
use crate::class::{self};
use crate::ctx::Ctx;
use crate::journal::{ClaimChange, Digest, Durability, Expect, Journal, Loaded, Owner, Space};
use crate::machine::resolve::{self, Decision};
use crate::shared::Runtime;
use crate::unit::{self, Unit, Wrote};
use idem_journal::audit::{self as stored, AuditEvent, Draft, Stats};
use idem_journal::error::Error;
use idem_journal::key::IdemKey;
use idem_journal::record::{self, Blob, Kind, OpRecord, State, StepRecord};
use idem_journal::views::{
    approval_of, escalation_of, operation_of, Approval, Escalation, Operation, PruneReport,
    Resolution, SagaView,
};

/// The longest note an operator's resolution may carry (bytes of UTF-8):
/// [`Runtime::resolve`] refuses a longer one with `Error::TooLarge`, and
/// writes nothing.
pub const MAX_NOTE_BYTES: usize = 64 << 10;

impl Runtime {
    /// Opens (or creates) the embedded sled journal in directory `path`.
    ///
    /// Fails with [`Error::InUse`] if another process holds it, with
    /// [`Error::NotAJournal`] if the directory holds something else, with
    /// [`Error::UnsupportedFormat`] if a newer idem wrote it, and with
    /// [`Error::Damaged`] if its files are damaged beyond what it repairs;
    /// in every case nothing is deleted. Damage in sled's own files (what a
    /// power cut can leave) is repaired from the journal's second copy, an
    /// image of sled plus the log after it: sled's files are moved aside
    /// into `sled-damaged.<unix ms>/` in the journal directory, rebuilt and
    /// checked, and a warning is logged.
    #[cfg(feature = "sled")]
    pub fn open(path: impl AsRef<Path>) -> Result<Runtime, Error> {
        Runtime::builder().path(path).open()
    }

    /// A builder for the less common options.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::new()
    }

    /// Connects to the PostgreSQL journal at `url` (feature `postgres`),
    /// creating its schema if needed: the journal of several workers.
    /// `Runtime::builder().postgres(url)` for the options (worker id,
    /// lease).
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), idem_runtime::Error> {
    /// let rt = idem_runtime::Runtime::connect("postgres://idem@/idem?host=/run/idem-pg").await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "postgres")]
    pub async fn connect(url: &str) -> Result<Runtime, Error> {
        Runtime::builder().postgres(url).connect().await
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

    /// Who this runtime's claims belong to.
    pub fn owner(&self) -> &Owner {
        &self.shared.owner
    }

    /// For journals whose claims expire: a task that renews the leases of
    /// the calls this process drives, a third of a lease apart. Started
    /// when the runtime opens inside tokio, else by the first call.
    pub(crate) fn start_renewer(&self) {
        let Some(every) = self.shared.journal.renewal() else {
            return;
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut slot = self
            .shared
            .renewer
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if slot.is_some() {
            return;
        }
        let weak = Arc::downgrade(&self.shared);
        *slot = Some(handle.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(shared) = weak.upgrade() else { return };
                let held = shared.local.held();
                if held.is_empty() {
                    continue;
                }
                if let Err(e) = shared.journal.renew(&shared.owner, &held).await {
                    tracing::warn!(target: "idem::runtime", error = %e, "renewing leases failed; calls may be taken over by other workers, which fences this one off");
                }
            }
        }));
    }

    async fn load_op(&self, key: &IdemKey) -> Result<Option<(Loaded, OpRecord)>, Error> {
        let journal = &*self.shared.journal;
        let Some(loaded) = journal.load(Space::Ops, key.digest()).await? else {
            return Ok(None);
        };
        let rec = OpRecord::decode(&loaded.body, journal.location(), key.digest())?;
        Ok(Some((loaded, rec)))
    }

    /// Every operation currently parked for a human, oldest first.
    pub async fn escalations(&self) -> Result<Vec<Escalation>, Error> {
        let journal = &*self.shared.journal;
        let mut out = Vec::new();
        for (digest, loaded) in journal.escalated().await? {
            let rec = OpRecord::decode(&loaded.body, journal.location(), &digest)?;
            if rec.state != State::Escalated {
                continue;
            }
            out.push(escalation_of(&digest, &rec));
        }
        out.sort_by_key(|e| e.escalated_ms);
        Ok(out)
    }

    /// Every call awaiting a person's approval, oldest request first.
    pub async fn approvals(&self) -> Result<Vec<Approval>, Error> {
        let journal = &*self.shared.journal;
        let mut out = Vec::new();
        for (digest, loaded) in journal.escalated().await? {
            let rec = OpRecord::decode(&loaded.body, journal.location(), &digest)?;
            out.extend(approval_of(&digest, &rec));
        }
        out.sort_by_key(|a| a.requested_ms);
        Ok(out)
    }

    /// Every saga ([`Ctx::saga`]) the journal holds a record of, oldest
    /// start first: running, compensating (a rollback decided and not
    /// finished), compensated, or escalated, with why it rolls back, the
    /// steps it undoes, what was undone and when.
    ///
    /// Read from the sagas' own memoized steps (their start, decision and
    /// end), so the list survives restarts and does not depend on the
    /// audit stream, on every journal (sled and PostgreSQL alike), with
    /// one exception: a saga escalated *for now* (a compensation that
    /// cannot be settled yet stores no end) is told by its latest audit
    /// event; once that event is pruned, it lists as `compensating`. Its
    /// records are pruned with other memoized steps once older than the
    /// retention ([`Runtime::prune`]), and it is no longer listed, unless
    /// it is rolling back: then it is kept whole. The
    /// listing reads every memoized step of the journal, as a prune does:
    /// an operator's page, not something to poll in a loop. A saga started
    /// by a build of idem that did not record its scope is listed only if
    /// it ran at its run's root scope.
    pub async fn sagas(&self) -> Result<Vec<SagaView>, Error> {
        crate::saga::list::sagas(self).await
    }

    /// Approves a call awaiting approval: the next call of its key (or the
    /// one waiting for the decision) runs it, once, with the arguments
    /// that were approved. Durable when this returns. A key that does not
    /// await approval (never asked, or decided already: a decision is
    /// final) is [`Error::NotAwaitingApproval`].
    pub async fn approve(&self, key: &IdemKey, note: &str) -> Result<(), Error> {
        self.decide_approval(key, true, note, "runtime").await
    }

    /// Refuses a call awaiting approval: it never runs, and every call of
    /// its key returns `ToolError::NotApproved` with `note` (the agent and
    /// its model read it). Durable when this returns; errors as
    /// [`Runtime::approve`].
    pub async fn reject(&self, key: &IdemKey, note: &str) -> Result<(), Error> {
        self.decide_approval(key, false, note, "runtime").await
    }

    /// [`Runtime::approve`] or [`Runtime::reject`], recording the surface
    /// the decision came through (`api`, `cli`, `inbox`).
    #[doc(hidden)]
    pub async fn decide_approval(
        &self,
        key: &IdemKey,
        approved: bool,
        note: &str,
        via: &str,
    ) -> Result<(), Error> {
        if note.len() > MAX_NOTE_BYTES {
            return Err(Error::TooLarge {
                what: "the operator's note",
                size: note.len() as u64,
                limit: MAX_NOTE_BYTES as u64,
            });
        }
        let (loaded, rec) = self
            .load_op(key)
            .await?
            .ok_or_else(|| Error::UnknownKey { key: key.clone() })?;
        let current_key = key.with_generation(rec.generation);
        let now = self.shared.clock.now_ms();
        let (rec, events) = resolve::decide(rec, approved, note, via, now).map_err(|state| {
            Error::NotAwaitingApproval {
                key: current_key.clone(),
                state: state.to_string(),
            }
        })?;
        self.operator_write(key, &current_key, &loaded, &rec, events, now)
            .await
    }

    /// Writes an operator's change of a record (a resolution, a decision
    /// on an approval) with its events, durably, if the record is still
    /// the one read.
    async fn operator_write(
        &self,
        key: &IdemKey,
        current_key: &IdemKey,
        loaded: &Loaded,
        rec: &OpRecord,
        events: Vec<stored::EventKind>,
        now: u64,
    ) -> Result<(), Error> {
        let body = record::encode(Kind::Op, rec)?;
        let drafts = events
            .into_iter()
            .map(|kind| Draft {
                at_ms: now,
                tool: &rec.tool,
                key: Some(current_key),
                root_run: &rec.root_run,
                agent: "operator",
                worker: &self.shared.owner,
                kind,
            })
            .collect();
        let written = unit::write(
            &self.shared,
            Unit {
                space: Space::Ops,
                key: key.digest(),
                expect: Expect::Version(loaded.version),
                body: &body,
                claim: ClaimChange::Release,
                escalated: rec.state.needs_a_person(),
                durability: Durability::Immediate,
                unread: false,
            },
            drafts,
            true,
        )
        .await?;
        match written {
            Wrote::Done { .. } => Ok(()),
            Wrote::Conflict(_) => Err(Error::Conflict { key: key.clone() }),
        }
    }

    /// One operation as the journal has it, with its result if committed.
    pub async fn operation(&self, key: &IdemKey) -> Result<Option<Operation>, Error> {
        let Some((loaded, rec)) = self.load_op(key).await? else {
            return Ok(None);
        };
        Ok(Some(operation_of(key.digest(), &loaded, &rec)))
    }

    /// Settles an escalated operation. `Landed` commits the given result
    /// (replayed to later calls), `Reissue` lets the next call run it again
    /// (a fresh retry budget, the same key), `Abandon` refuses every later
    /// call. Durable when this returns.
    ///
    /// A `Landed` result must decode into the tool's result type: it is
    /// checked (through the tool's descriptor, so the tool must be compiled
    /// into this program) before anything is written, and refused with
    /// [`Error::ResultType`] otherwise.
    ///
    /// An operator's resolution can be *amended* the same way while it
    /// stands (a `Landed` that proves wrong, an `Abandon` to reissue after
    /// all, a `Reissue` no call has picked up yet): the change is recorded
    /// with its own audit event. Anything else is [`Error::NotEscalated`].
    pub async fn resolve(
        &self,
        key: &IdemKey,
        resolution: Resolution,
        note: &str,
    ) -> Result<(), Error> {
        // A note is evidence for people; one of megabytes is an attack on
        // every later read of the record (the inbox, `idem show`).
        if note.len() > MAX_NOTE_BYTES {
            return Err(Error::TooLarge {
                what: "the operator's note",
                size: note.len() as u64,
                limit: MAX_NOTE_BYTES as u64,
            });
        }
        let (loaded, rec) = self
            .load_op(key)
            .await?
            .ok_or_else(|| Error::UnknownKey { key: key.clone() })?;
        let previous = resolve::admissible(&rec).map_err(|state| Error::NotEscalated {
            key: key.clone(),
            state: state.to_string(),
        })?;
        let current_key = key.with_generation(rec.generation);
        let decision = match &resolution {
            Resolution::Landed(result) => {
                let json = result.clone().unwrap_or(serde_json::Value::Null);
                let check = self
                    .shared
                    .landed_check(&rec.tool, rec.class)
                    .ok_or_else(|| Error::ResultType {
                        key: current_key.clone(),
                        tool: rec.tool.clone(),
                        detail: "this program cannot check the result against the tool's type \
                                 (the tool is not in it, or its result type is generic and it was \
                                 not called here yet); resolve it through the process that runs \
                                 the tool (its admin API)"
                            .into(),
                    })?;
                let stored = check(&json).map_err(|detail| Error::ResultType {
                    key: current_key.clone(),
                    tool: rec.tool.clone(),
                    detail,
                })?;
                Decision::Landed(Blob(stored))
            }
            Resolution::Reissue => Decision::Reissue,
            Resolution::Abandon => Decision::Abandon,
        };
        let now = self.shared.clock.now_ms();
        let (rec, events) = resolve::apply(rec, previous, decision, note, now);
        self.operator_write(key, &current_key, &loaded, &rec, events, now)
            .await
    }

    /// The retention in effect: the configured one, raised to the longest
    /// dedupe window of any tool in this binary.
    pub fn retention(&self) -> Duration {
        class::tools()
            .map(|t| t.dedupe_window)
            .fold(self.shared.retention, Duration::max)
    }

    /// Removes what is older than [`Runtime::retention`]: finished
    /// operations (committed, rejected, failed, abandoned), memoized steps
    /// and audit events. Operations in flight, waiting, escalated or
    /// reissued are never removed, however old; nor is anything of the run
    /// of a saga still rolling back (decided, not ended: its records and
    /// every operation and step of its run, counted as kept open), so that
    /// its next run resumes the rollback instead of starting over. A record
    /// that cannot be decoded is left alone and counted. Durable when this
    /// returns.
    pub async fn prune(&self) -> Result<PruneReport, Error> {
        let journal = &*self.shared.journal;
        let open_sagas = crate::saga::list::open_runs(self).await?;
        let now = self.shared.clock.now_ms();
        let cutoff = now.saturating_sub(self.retention().as_millis() as u64);
        let mut report = PruneReport {
            cutoff_ms: cutoff,
            ..PruneReport::default()
        };
        for space in Space::ALL {
            let mut after: Option<Digest> = None;
            loop {
                let page = journal.scan(space, after.as_ref(), 1024).await?;
                let Some(last) = page.last().map(|(k, _)| *k) else {
                    break;
                };
                after = Some(last);
                for (key, loaded) in page {
                    let doomed = match space {
                        Space::Ops => {
                            report.ops_scanned += 1;
                            match OpRecord::decode(&loaded.body, journal.location(), &key) {
                                Ok(rec)
                                    if !rec.state.is_finished()
                                        || open_sagas.contains(&rec.root_run) =>
                                {
                                    report.ops_kept_open += 1;
                                    false
                                }
                                Ok(rec) => rec.updated_ms < cutoff,
                                Err(_) => {
                                    report.undecodable += 1;
                                    false
                                }
                            }
                        }
                        Space::Steps => match record::decode::<StepRecord>(
                            Kind::Step,
                            &loaded.body,
                            journal.location(),
                            &key,
                        ) {
                            Ok(step) => {
                                step.at_ms < cutoff
                                    && matches!(step.state, record::StepState::Done { .. })
                                    && !open_sagas.contains(&step.root_run)
                            }
                            Err(_) => {
                                report.undecodable += 1;
                                false
                            }
                        },
                    };
                    // A call that changed the record since we read it wins.
                    if doomed && journal.remove(space, &key, loaded.version).await? {
                        match space {
                            Space::Ops => report.ops_removed += 1,
                            Space::Steps => report.steps_removed += 1,
                        }
                    }
                }
            }
        }
        // Events are in sequence order, which is time order.
        journal.sync().await?;
        let mut first_kept = None;
        let mut from = 0;
        'pages: loop {
            let page = AuditLog::read(journal, from, 4096).await?;
            let Some(last) = page.last().map(|e| e.seq) else {
                break;
            };
            for event in page {
                if event.at_ms >= cutoff {
                    first_kept = Some(event.seq);
                    break 'pages;
                }
            }
            from = last + 1;
        }
        let before = match first_kept {
            Some(seq) => seq,
            None => from,
        };
        report.events_removed = journal.truncate_events(before).await?;
        journal.sync().await?;
        Ok(report)
    }

    /// Bytes the journal uses on disk.
    pub async fn size_on_disk(&self) -> Result<u64, Error> {
        self.shared.journal.size_on_disk().await
    }

    /// Makes every write so far durable (events that record no decision
    /// become durable within a bounded delay on their own), replays' events
    /// held in memory included.
    pub async fn sync(&self) -> Result<(), Error> {
        self.shared.audit.flush(&*self.shared.journal).await?;
        self.shared.journal.sync().await
    }

    /// The audit stream from sequence number `from` (0: all), after making
    /// everything written so far durable: the stream holds only durable
    /// events.
    pub async fn audit(&self, from: u64) -> Result<Vec<AuditEvent>, Error> {
        self.sync().await?;
        let mut out = Vec::new();
        AuditLog::for_each(&*self.shared.journal, from, |e| {
            out.push(e);
            Ok(())
        })
        .await?;
        Ok(out)
    }

    /// Up to `limit` durable events from `from`, for readers that follow
    /// the stream page by page (no sync: events appear as they become
    /// durable).
    pub async fn audit_page(&self, from: u64, limit: usize) -> Result<Vec<AuditEvent>, Error> {
        AuditLog::read(&*self.shared.journal, from, limit).await
    }

    /// Every event about one operation (all its generations), in order.
    pub async fn history(&self, key: &IdemKey) -> Result<Vec<AuditEvent>, Error> {
        self.sync().await?;
        let journal = &*self.shared.journal;
        let digest = key.digest();
        journal
            .events_for(digest)
            .await?
            .into_iter()
            .map(|(seq, bytes)| stored::decode(journal.location(), seq, &bytes))
            .filter(|e| {
                e.as_ref().map_or(true, |e| {
                    e.key
                        .as_deref()
                        .and_then(|k| IdemKey::parse(k).ok())
                        .is_some_and(|k| k.digest() == digest)
                })
            })
            .collect()
    }

    /// Writes the audit stream from `from` as JSON lines; returns how many.
    pub async fn export_audit(
        &self,
        from: u64,
        out: &mut (dyn Write + Send),
    ) -> Result<u64, Error> {
        self.sync().await?;
        AuditLog::export_jsonl(&*self.shared.journal, from, out).await
    }

    /// Live audit events from now on.
    pub fn subscribe(&self) -> Subscription {
        self.shared.audit.subscribe()
    }

    /// Per-tool counts derived from the whole audit stream (plus read-only
    /// calls made by this process, which are not journaled).
    pub async fn stats(&self) -> Result<Stats, Error> {
        self.sync().await?;
        self.shared.audit.stats(&*self.shared.journal).await
    }
}
