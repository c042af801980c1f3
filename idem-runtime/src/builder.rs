//! [`RuntimeBuilder`]: the options of a runtime, and opening one.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::audit::AuditLog;
use crate::class;
use crate::leaders::Local;
use crate::machine::policy::Setup;
use crate::replays::Replays;
use crate::retry::Jitter;
use crate::shared::{Runtime, Shared};
use idem_journal::clock::{Clock, SystemClock};
use idem_journal::error::Error;
use idem_journal::journal::{Journal, Owner};

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
    admin: Option<idem_admin::AdminOptions>,
    #[cfg(feature = "postgres")]
    postgres: Option<String>,
    #[cfg(feature = "postgres")]
    postgres_options: crate::journal::PostgresOptions,
    seed: Option<u64>,
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
    /// Serves the admin API on `addr` once the runtime is open (feature
    /// `admin`; see [the module](crate::admin)). `open()` must then be
    /// called inside a tokio runtime, which serves it; it fails with
    /// [`Error::Usage`](crate::Error::Usage) otherwise, before touching the
    /// journal.
    ///
    /// The token and address files go to the journal directory
    /// ([`path`](RuntimeBuilder::path)); a worker without one (PostgreSQL,
    /// or a [`journal`](RuntimeBuilder::journal) given as is) keeps them in
    /// a directory of its own, named after its
    /// [`worker_id`](RuntimeBuilder::worker_id), in the [workers
    /// directory](crate::admin::workers) (`$IDEM_WORKERS_DIR`, else
    /// `$XDG_RUNTIME_DIR/idem/workers`, else
    /// `$HOME/.local/state/idem/workers`; made with mode 0700), where
    /// `idem --worker ID` finds it. [`AdminOptions::dir`](crate::admin::AdminOptions::dir)
    /// chooses another place.
    #[cfg(feature = "admin")]
    pub fn admin(self, addr: impl Into<String>) -> RuntimeBuilder {
        self.admin_with(idem_admin::AdminOptions::new(addr))
    }

    /// [`RuntimeBuilder::admin`] with options.
    #[cfg(feature = "admin")]
    pub fn admin_with(mut self, options: idem_admin::AdminOptions) -> RuntimeBuilder {
        self.admin = Some(options);
        self
    }

    /// Seeds every random choice the runtime makes for its calls (retry
    /// jitter), so that a run's decisions replay exactly from the seed (a
    /// failing torture run, a test). Default: a seed of its own per
    /// runtime, so that processes do not retry in lock-step.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

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
        let journal = Arc::new(
            crate::journal::PostgresJournal::connect_with(&url, &self.postgres_options).await?,
        );
        self.journal = Some(journal.clone());
        let rt = self.open()?;
        // One live process per worker id: a second one is refused here,
        // before it claims anything.
        journal.hold_worker_id(&rt.shared.owner).await?;
        Ok(rt)
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
        let worker = self
            .worker_id
            .unwrap_or_else(|| format!("{}-{}", host_name(), std::process::id()));
        // Refused before the journal is touched.
        #[cfg(feature = "admin")]
        let admin = match self.admin {
            Some(options) => {
                idem_admin::require_tokio()?;
                let dir = options.files_dir(self.path.as_deref(), &worker)?;
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
        let owner = Owner {
            worker: Arc::from(worker),
            incarnation,
        };
        let setup = Setup {
            owner: owner.clone(),
            claim_first: journal.claim_first(),
            renewal_ms: journal.renewal().map(|d| d.as_millis() as u64),
            in_flight_wait_ms: self.in_flight_wait.as_millis() as u64,
        };
        let rt = Runtime {
            shared: Arc::new(Shared {
                local: Local::of(&journal),
                setup,
                journal,
                clock,
                audit: AuditLog::new(),
                jitter: Jitter::new(self.seed.unwrap_or(incarnation)),
                owner,
                retention: self.retention,
                renewer: std::sync::Mutex::new(None),
                called: std::sync::Mutex::new(std::collections::HashMap::new()),
                replays: Replays::with_capacity(self.replay_cache),
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

impl RuntimeBuilder {
    /// The defaults (see [`Runtime::builder`]).
    pub(crate) fn new() -> RuntimeBuilder {
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
            seed: None,
        }
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
