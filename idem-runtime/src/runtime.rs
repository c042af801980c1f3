//! `Runtime`: the open journal, the clock, the audit stream, this process's
//! identity as a claim owner, and the operator's side (escalations,
//! resolutions, retention, statistics).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::audit::{AuditLog, Subscription};
use crate::class::{self, ToolDescriptor};
use crate::ctx::Ctx;
use crate::journal::{
    ClaimChange, Digest, Durability, Expect, Journal, Loaded, NewEvent, Owner, Space,
    Write as JournalWrite, Written,
};
use crate::retry::Jitter;
use idem_journal::audit::{self as stored, AuditEvent, Draft, EventKind, Stats};
use idem_journal::clock::{Clock, SystemClock};
use idem_journal::error::Error;
use idem_journal::key::IdemKey;
use idem_journal::record::{self, Blob, Kind, OpRecord, ResolutionInfo, State, StepRecord, Via};
use idem_journal::views::{
    escalation_of, operation_of, Escalation, Operation, PruneReport, Resolution,
};

/// The idem runtime: an open journal and everything that acts on it.
///
/// Cheap to clone; every clone and every [`Ctx`] made from it share one
/// journal, which is released when the last of them is dropped.
///
/// A long-running server opens one at start and hands a [`Ctx`] per
/// workflow to its tools:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem_runtime::Error> {
/// # let dir = tempfile::tempdir().unwrap();
/// use idem_runtime::Runtime;
///
/// let rt = Runtime::open(dir.path())?;          // once, at start
/// for order in ["order-1", "order-2"] {          // per request / workflow
///     let ctx = rt.run(order);                   // durable workflow id
///     // ... call #[tool]s with &ctx ...
///     # let _ = ctx;
/// }
/// for e in rt.escalations().await? {             // the operator's side
///     println!("{}: {}", e.key, e.reason);
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Runtime {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("journal", &self.shared.journal.location())
            .field("owner", &self.shared.owner)
            .finish()
    }
}

pub(crate) struct Shared {
    pub(crate) journal: Arc<dyn Journal>,
    /// The calls being driven in this process on this journal (shared by
    /// every runtime built on it).
    pub(crate) local: Arc<crate::leaders::Local>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) audit: AuditLog,
    pub(crate) jitter: Jitter,
    /// Who this runtime's claims belong to.
    pub(crate) owner: Owner,
    pub(crate) in_flight_wait: Duration,
    pub(crate) retention: Duration,
    /// Renews the leases of the claims this process drives, for journals
    /// whose claims expire.
    renewer: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Tools called through this runtime that are not registered by
    /// `#[tool]` (hand-built descriptors), by name: what operators may need
    /// to check a resolution against.
    pub(crate) called: std::sync::Mutex<std::collections::HashMap<&'static str, Called>>,
    /// Committed results seen by this runtime (a replay without a read).
    pub(crate) replays: crate::replays::Replays,
    /// The admin API server, while this runtime serves one.
    #[cfg(feature = "admin")]
    pub(crate) admin: std::sync::Mutex<Option<idem_admin::Running>>,
}

/// A tool seen making a call, with the result check its call carried.
#[derive(Clone, Copy)]
pub(crate) struct Called {
    pub(crate) tool: &'static ToolDescriptor,
    pub(crate) check_landed: Option<crate::class::LandedCheck>,
}

impl Shared {
    /// Remembers a tool that made a call (one lookup per call; the common
    /// case is a hit).
    pub(crate) fn saw(
        &self,
        tool: &'static ToolDescriptor,
        check_landed: Option<crate::class::LandedCheck>,
    ) {
        let mut called = self.called.lock().unwrap_or_else(|p| p.into_inner());
        if !called.contains_key(tool.name) {
            called.insert(tool.name, Called { tool, check_landed });
        }
    }

    /// How to check a `Landed` result for the tool `name` of `class`: its
    /// descriptor's check, else the one its calls in this process carried.
    pub(crate) fn landed_check(
        &self,
        name: &str,
        class: idem_journal::class::Class,
    ) -> Option<crate::class::LandedCheck> {
        class::tools()
            .find(|t| t.name == name && t.class == class)
            .and_then(|t| t.check_landed)
            .or_else(|| {
                let called = self.called.lock().unwrap_or_else(|p| p.into_inner());
                called
                    .get(name)
                    .filter(|c| c.tool.class == class)
                    .and_then(|c| c.check_landed.or(c.tool.check_landed))
            })
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // First, while the journal is still held: stop serving and remove
        // the address file, so it never names a process that is gone.
        #[cfg(feature = "admin")]
        drop(self.admin.get_mut().ok().and_then(Option::take));
        if let Some(task) = self.renewer.get_mut().ok().and_then(Option::take) {
            task.abort();
        }
    }
}

/// Options for [`Runtime`]; see [`Runtime::builder`].
pub struct RuntimeBuilder {
    path: Option<PathBuf>,
    journal: Option<Arc<dyn Journal>>,
    clock: Option<Arc<dyn Clock>>,
    #[cfg(feature = "sled")]
    sled: idem_sled::SledOptions,
    in_flight_wait: Duration,
    retention: Duration,
    worker_id: Option<String>,
    replay_cache: usize,
    #[cfg(feature = "admin")]
    pub(crate) admin: Option<crate::admin::AdminOptions>,
    #[cfg(feature = "postgres")]
    postgres: Option<String>,
    #[cfg(feature = "postgres")]
    postgres_options: crate::journal::PostgresOptions,
}

impl std::fmt::Debug for RuntimeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeBuilder")
            .field("path", &self.path)
            .field("in_flight_wait", &self.in_flight_wait)
            .field("retention", &self.retention)
            .field("worker_id", &self.worker_id)
            .field("replay_cache", &self.replay_cache)
            .finish()
    }
}

impl RuntimeBuilder {
    /// The journal directory (the embedded sled journal, feature `sled`).
    /// Created if missing. With another journal, where the admin API's
    /// files go.
    pub fn path(mut self, path: impl AsRef<Path>) -> Self {
        self.path = Some(path.as_ref().to_path_buf());
        self
    }

    /// Uses an already open journal instead of opening one by path (another
    /// implementation, or a wrapper that injects faults in tests). Runtimes
    /// built on the same journal share its table of calls in flight.
    pub fn journal(mut self, journal: Arc<dyn Journal>) -> Self {
        self.journal = Some(journal);
        self
    }

    /// The clock for durable timestamps (default: the journal's, else
    /// [`SystemClock`]).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// sled's cache size in bytes (default 64 MiB): bounds memory whatever
    /// the number of records.
    #[cfg(feature = "sled")]
    pub fn cache_capacity(mut self, bytes: u64) -> Self {
        self.sled.cache_capacity = bytes;
        self
    }

    /// All of the sled journal's options.
    #[cfg(feature = "sled")]
    pub fn sled_options(mut self, options: idem_sled::SledOptions) -> Self {
        self.sled = options;
        self
    }

    /// How long a call waits for another call of the same key (in this
    /// process or, with a shared journal, another) to finish before
    /// returning `ToolError::InFlight` (default 30 s). A call whose driver
    /// was dropped releases its local waiters at once.
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

    /// This worker's stable id (default: host name and process id). Claims
    /// carry it: a worker that restarts under the same id takes over the
    /// calls its previous incarnation left in flight at once, instead of
    /// waiting for their leases to expire. Two live processes must never
    /// share an id.
    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.worker_id = Some(id.into());
        self
    }

    /// How many committed results the runtime keeps in memory to replay
    /// them without reading the journal (default 4096; 0: none). Only
    /// results committed by a call or found by `verify` are kept: they
    /// never change.
    pub fn replay_cache(mut self, results: usize) -> Self {
        self.replay_cache = results;
        self
    }

    /// The PostgreSQL journal at `url`, shared by every worker connected to
    /// it; open it with [`RuntimeBuilder::connect`] (feature `postgres`).
    #[cfg(feature = "postgres")]
    pub fn postgres(mut self, url: impl Into<String>) -> Self {
        self.postgres = Some(url.into());
        self
    }

    /// PostgreSQL: how long a claim on a call stays valid without renewal
    /// (default 30 s). A worker that dies holds its calls this long before
    /// other workers take them over; its restart under the same
    /// [`worker_id`](RuntimeBuilder::worker_id) takes them over at once.
    #[cfg(feature = "postgres")]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.postgres_options.lease = lease;
        self
    }

    /// PostgreSQL: every option of the journal (the lease included).
    #[cfg(feature = "postgres")]
    pub fn postgres_options(mut self, options: crate::journal::PostgresOptions) -> Self {
        self.postgres_options = options;
        self
    }

    /// Connects to the PostgreSQL journal given by
    /// [`postgres`](RuntimeBuilder::postgres) (creating its schema if
    /// needed) and starts the runtime; with a `path` or a `journal` instead,
    /// the same as [`open`](RuntimeBuilder::open).
    #[cfg(feature = "postgres")]
    pub async fn connect(mut self) -> Result<Runtime, Error> {
        let Some(url) = self.postgres.take() else {
            return self.open();
        };
        if self.path.is_some() || self.journal.is_some() {
            return Err(Error::Usage(
                "Runtime::builder(): .postgres(..) and .path(..)/.journal(..) name two journals"
                    .into(),
            ));
        }
        let journal =
            crate::journal::PostgresJournal::connect_with(&url, &self.postgres_options).await?;
        self.journal = Some(Arc::new(journal));
        self.open()
    }

    /// Opens the journal and starts the runtime.
    pub fn open(self) -> Result<Runtime, Error> {
        class::check_unique_names()?;
        #[cfg(feature = "postgres")]
        if self.postgres.is_some() {
            return Err(Error::Usage(
                "a PostgreSQL journal is opened with .connect().await, not .open()".into(),
            ));
        }
        // Refused before the journal is touched.
        #[cfg(feature = "admin")]
        let admin = match self.admin {
            Some(options) => {
                idem_admin::require_tokio()?;
                let dir = options.files_dir(self.path.as_deref())?;
                Some((options, dir))
            }
            None => None,
        };
        let journal: Arc<dyn Journal> = match (self.journal, self.path) {
            (Some(j), _) => j,
            #[cfg(feature = "sled")]
            (None, Some(p)) => Arc::new(idem_sled::SledJournal::open_with(p, &self.sled)?),
            #[cfg(not(feature = "sled"))]
            (None, Some(p)) => {
                return Err(Error::Usage(format!(
                    "Runtime::builder().path({}): this build has no embedded journal (feature \
                     `sled` of idem is off); give a .journal(...) or connect to PostgreSQL",
                    p.display()
                )))
            }
            (None, None) => {
                return Err(Error::Usage(
                    "Runtime::builder() needs a .path(...) or a .journal(...)".into(),
                ))
            }
        };
        let incarnation = incarnation();
        let clock = self
            .clock
            .or_else(|| journal.clock())
            .unwrap_or_else(|| Arc::new(SystemClock::new()));
        let worker = self
            .worker_id
            .unwrap_or_else(|| format!("{}-{}", host_name(), std::process::id()));
        let rt = Runtime {
            shared: Arc::new(Shared {
                local: crate::leaders::Local::of(&journal),
                journal,
                clock,
                audit: AuditLog::new(),
                jitter: Jitter::new(incarnation),
                owner: Owner {
                    worker: Arc::from(worker),
                    incarnation,
                },
                in_flight_wait: self.in_flight_wait,
                retention: self.retention,
                renewer: std::sync::Mutex::new(None),
                called: std::sync::Mutex::new(std::collections::HashMap::new()),
                replays: crate::replays::Replays::with_capacity(self.replay_cache),
                #[cfg(feature = "admin")]
                admin: std::sync::Mutex::new(None),
            }),
        };
        rt.start_renewer();
        #[cfg(feature = "admin")]
        if let Some((options, dir)) = admin {
            let running = crate::admin::start(&rt, options, &dir)?;
            *rt.shared.admin.lock().unwrap_or_else(|p| p.into_inner()) = Some(running);
        }
        Ok(rt)
    }
}

/// A process-unique id: time, pid and the standard library's random hash
/// keys; it only has to differ between incarnations of a worker.
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

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "worker".into())
}

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
        RuntimeBuilder {
            path: None,
            journal: None,
            clock: None,
            #[cfg(feature = "sled")]
            sled: idem_sled::SledOptions::default(),
            in_flight_wait: Duration::from_secs(30),
            retention: Duration::from_secs(7 * 24 * 3600),
            worker_id: None,
            replay_cache: crate::replays::CAPACITY,
            #[cfg(feature = "admin")]
            admin: None,
            #[cfg(feature = "postgres")]
            postgres: None,
            #[cfg(feature = "postgres")]
            postgres_options: crate::journal::PostgresOptions::default(),
        }
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
        let rec: OpRecord =
            record::decode(Kind::Op, &loaded.body, journal.location(), key.digest())?;
        Ok(Some((loaded, rec)))
    }

    /// Every operation currently parked for a human, oldest first.
    pub async fn escalations(&self) -> Result<Vec<Escalation>, Error> {
        let journal = &*self.shared.journal;
        let mut out = Vec::new();
        for (digest, loaded) in journal.escalated().await? {
            let rec: OpRecord =
                record::decode(Kind::Op, &loaded.body, journal.location(), &digest)?;
            if rec.state != State::Escalated {
                continue;
            }
            out.push(escalation_of(&digest, &rec));
        }
        out.sort_by_key(|e| e.escalated_ms);
        Ok(out)
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
        let journal = &*self.shared.journal;
        let (loaded, mut rec) = self
            .load_op(key)
            .await?
            .ok_or_else(|| Error::UnknownKey { key: key.clone() })?;
        let set_by_operator = rec.resolution.is_some()
            && matches!(
                rec.state,
                State::Committed {
                    via: Via::Operator,
                    ..
                } | State::Abandoned
                    | State::Reissue
            );
        let previous = match rec.state {
            State::Escalated => None,
            _ if set_by_operator => rec.resolution.as_ref().map(|r| r.kind.clone()),
            _ => {
                return Err(Error::NotEscalated {
                    key: key.clone(),
                    state: rec.state.name().to_string(),
                })
            }
        };
        let current_key = key.with_generation(rec.generation);
        rec.state = match &resolution {
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
                State::Committed {
                    result: Blob(stored),
                    via: Via::Operator,
                }
            }
            Resolution::Reissue => State::Reissue,
            Resolution::Abandon => State::Abandoned,
        };
        let now = self.shared.clock.now_ms();
        rec.maybe_landed = false;
        rec.updated_ms = now;
        let amendments = rec.resolution.as_ref().map_or(0, |r| r.amendments);
        rec.resolution = Some(ResolutionInfo {
            kind: resolution.label().to_string(),
            note: note.to_string(),
            at_ms: now,
            amendments: if previous.is_some() {
                amendments + 1
            } else {
                0
            },
        });
        let body = record::encode(Kind::Op, &rec)?;
        let draft = |kind| Draft {
            at_ms: now,
            tool: &rec.tool,
            key: Some(&current_key),
            root_run: &rec.root_run,
            agent: "operator",
            kind,
        };
        let mut drafts = vec![match previous {
            Some(previous) => draft(EventKind::Amended {
                previous,
                resolution: resolution.label().to_string(),
                note: note.to_string(),
            }),
            None => draft(EventKind::Resolved {
                resolution: resolution.label().to_string(),
                note: note.to_string(),
            }),
        }];
        if let Resolution::Landed(_) = resolution {
            // It is a commit like any other, for the stream and for stats.
            drafts.push(draft(EventKind::Committed {
                attempt: 0,
                via: "operator".into(),
            }));
        }
        let encoded = drafts
            .iter()
            .map(stored::encode)
            .collect::<Result<Vec<_>, _>>()?;
        let events: Vec<NewEvent<'_>> = encoded
            .iter()
            .map(|b| NewEvent {
                key: Some(key.digest()),
                bytes: b,
            })
            .collect();
        let written = journal
            .write(JournalWrite {
                space: Space::Ops,
                key: key.digest(),
                expect: Expect::Version(loaded.version),
                body: &body,
                claim: ClaimChange::Release,
                escalated: false,
                events: &events,
                durability: Durability::Immediate,
            })
            .await?;
        match written {
            Written::Done { seqs, .. } => {
                for (seq, d) in seqs.into_iter().zip(drafts) {
                    self.shared.audit.publish(seq, d);
                }
                Ok(())
            }
            Written::Conflict => Err(Error::Conflict { key: key.clone() }),
        }
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
    /// reissued are never removed, however old. A record that cannot be
    /// decoded is left alone and counted. Durable when this returns.
    pub async fn prune(&self) -> Result<PruneReport, Error> {
        let journal = &*self.shared.journal;
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
                            match record::decode::<OpRecord>(
                                Kind::Op,
                                &loaded.body,
                                journal.location(),
                                &key,
                            ) {
                                Ok(rec) if !rec.state.is_finished() => {
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
    /// become durable within a bounded delay on their own).
    pub async fn sync(&self) -> Result<(), Error> {
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
