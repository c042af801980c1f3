//! [`PostgresJournal`]: the contract's statements and the journal that
//! runs them (the crate documentation says what each part becomes).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::tokio_postgres::{NoTls, Row};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};

use crate::clock::DbClock;
use crate::rows::{
    check_events, claim_code, digest_of, loaded, location_of, parse_config, pg, pool_failure, run,
    space_id, Type,
};
use crate::{group, listen, schema, standby};
use idem_journal::clock::Clock;
use idem_journal::error::Error;
use idem_journal::journal::{
    BoxFuture, ClaimChange, Claimed, Digest, Durability, EventRows, Expect, Held, Journal, Loaded,
    NewEvent, Owner, Space, Write, Written,
};

/// Options of [`PostgresJournal::connect_with`].
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// How long a claim stays live without renewal (default 30 s): how long
    /// other workers wait before taking over the calls of a worker that
    /// died. Renewed every third of it.
    pub lease: Duration,
    /// Connections in the pool (default 16), besides the listening one.
    pub pool_size: usize,
    /// How often a waiter re-reads a record it waits for while
    /// notifications are not being received (default 100 ms).
    pub poll: Duration,
    /// How long opening a connection may take (default 10 s).
    pub connect_timeout: Duration,
    /// Whether connecting creates the schema when the database has none
    /// (default true: the first worker to connect creates it). With false,
    /// connecting only checks that the schema is there in the version this
    /// build reads (none: [`Error::NotAJournal`]; another version:
    /// [`Error::UnsupportedFormat`]) and changes nothing, so the role needs
    /// no `CREATE` privilege, only the rows' (`SELECT`, `INSERT`, `UPDATE`,
    /// `DELETE` on the `idem_*` tables, `USAGE` on their sequence): for an
    /// operator's tool, or a deployment that creates the schema as a step
    /// of its own ([`PostgresJournal::migrate`], `idem migrate`).
    pub migrate: bool,
    /// Whether the URL leads to a connection pooler in transaction pooling
    /// mode (pgbouncer's `pool_mode = transaction`), where each transaction
    /// may run in another server session: `Some(true)`, `Some(false)`, or
    /// `None` (the default), detected when connecting. Behind a pooler the
    /// journal prepares no named statements, keeps no session state, holds
    /// worker ids with a lease row instead of a session advisory lock, and
    /// listens for notifications only on [`listen_url`](Self::listen_url())
    /// (else waiters poll every [`poll`](Self::poll)). See
    /// [`PostgresOptions::pooler()`].
    pub pooler: Option<bool>,
    /// A direct connection to the database (not through the pooler) on
    /// which to `LISTEN` for other processes' writes when
    /// [`pooler`](Self::pooler()) is on (default none: waiters poll). Unused
    /// without a pooler, where the journal's own URL listens.
    pub listen_url: Option<String>,
    /// Whether the database is expected to have a synchronous standby
    /// (default false): a primary that acknowledges no commit before a
    /// standby has it, for a deployment with automatic failover. With
    /// true, the journal refuses to run on a server that is not configured
    /// that way, with [`Error::NoSynchronousStandby`] naming what it
    /// reported, at connect and on each new connection of its pool (so a
    /// server promoted without a synchronous standby of its own is refused
    /// after a failover too). See
    /// [`PostgresOptions::synchronous_standby()`] for what is checked.
    pub synchronous_standby: bool,
}

impl PostgresOptions {
    /// The journal's URL leads to a connection pooler in transaction
    /// pooling mode (`true`), or certainly not (`false`: no detection).
    /// Left unset, connecting detects one: two sessions of the URL are
    /// asked for their server process while one of them holds a
    /// transaction open; a server process that changes under one session,
    /// or is shared by both, is a pooler moving transactions between
    /// server sessions. A direct connection can never show either, so
    /// detection never turns pooler mode on for one (its cost there: two
    /// rounds of two short-lived connections at connect); it can miss a
    /// pooler that happens to hand the probe's statements to the sessions
    /// they had, so a deployment behind one says so.
    ///
    /// ```
    /// let options = idem_postgres::PostgresOptions::default()
    ///     .pooler(true)
    ///     .listen_url("postgres://idem@db.internal:5432/idem");
    /// assert_eq!(options.pooler, Some(true));
    /// ```
    pub fn pooler(mut self, pooler: bool) -> Self {
        self.pooler = Some(pooler);
        self
    }

    /// Listens for notifications on a direct connection to `url` (see the
    /// field `listen_url`).
    pub fn listen_url(mut self, url: impl Into<String>) -> Self {
        self.listen_url = Some(url.into());
        self
    }

    /// The database has a synchronous standby, and the journal must not
    /// run without one (`true`), or no check (`false`, the default).
    ///
    /// Through a failover (the primary crashes, a standby is promoted) a
    /// journal keeps its promise only if the promoted server has every
    /// commit the old one acknowledged: an INTENT or a COMMIT lost there
    /// means a call made again, a duplicate effect. Asynchronous
    /// replication can lose the last ones; synchronous replication
    /// cannot. With this option the journal asks the server, in its own
    /// session, for `synchronous_standby_names` and `synchronous_commit`,
    /// and refuses ([`Error::NoSynchronousStandby`], with both values) a
    /// server where the first is empty or the second is not `on`,
    /// `remote_apply` or `remote_write`. It checks at connect and on every
    /// new connection of its pool (one round trip per connection).
    ///
    /// What it checks is the *configuration*, not that a standby is
    /// connected now: a configured primary with no synchronous standby
    /// connected makes every commit wait until one is back, so nothing is
    /// acknowledged that a failover could lose; the server fails closed by
    /// itself. Refusing then too would only stop workers from starting
    /// while a standby reconnects (or while a new one is being built after
    /// a failover). A connect that finds none connected logs a warning
    /// (its commits will wait). Pair it with a multi-host URL and
    /// `target_session_attrs=read-write`, so that the pool's new
    /// connections find the promoted server:
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), idem_journal::error::Error> {
    /// use idem_postgres::{PostgresJournal, PostgresOptions};
    /// let journal = PostgresJournal::connect_with(
    ///     "postgres://idem@db-a:5432,db-b:5432/idem?target_session_attrs=read-write",
    ///     &PostgresOptions::default().synchronous_standby(true),
    /// )
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub fn synchronous_standby(mut self, expected: bool) -> Self {
        self.synchronous_standby = expected;
        self
    }
}

impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions {
            lease: Duration::from_secs(30),
            pool_size: 16,
            poll: Duration::from_millis(100),
            connect_timeout: Duration::from_secs(10),
            migrate: true,
            pooler: None,
            listen_url: None,
            synchronous_standby: false,
        }
    }
}

/// A journal in a PostgreSQL database, shared by every worker connected to
/// it. See the crate documentation for what it
/// guarantees, and [`PostgresJournal::connect`] for the URL.
pub struct PostgresJournal {
    pub(crate) pool: Pool,
    pub(crate) location: String,
    pub(crate) options: PostgresOptions,
    pub(crate) clock: Arc<DbClock>,
    pub(crate) listener: Arc<listen::Listener>,
    /// The listening connection's task, stopped with the journal.
    pub(crate) listening: tokio::task::JoinHandle<()>,
    /// This process's row of `idem_barrier`.
    pub(crate) barrier_slot: i32,
    /// An asynchronously committed write returned since the last barrier.
    pub(crate) async_pending: AtomicBool,
    /// Every visible event below this sequence number is known durable.
    pub(crate) durable_floor: AtomicU64,
    /// The highest sequence number this process's writes were given.
    pub(crate) last_seq: AtomicU64,
    /// The worker ids this journal claims for, one live process each.
    pub(crate) identities: crate::identity::Identities,
    /// Behind a pooler in transaction mode: unnamed statements only.
    pub(crate) pooler: bool,
    /// Immediate writes waiting to share a transaction.
    pub(crate) group: Arc<group::Group>,
}

impl std::fmt::Debug for PostgresJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresJournal")
            .field("location", &self.location)
            .field("lease", &self.options.lease)
            .finish()
    }
}

/// The columns every record query selects, in this order (a macro, so
/// that constant statements can include them).
macro_rules! record_columns {
    () => {
        "version, epoch, owner_worker, owner_incarnation, \
         coalesce(lease_until > clock_timestamp(), false), body"
    };
}
const RECORD_COLUMNS: &str = record_columns!();

/// A read of one record.
const LOAD: &str = concat!(
    "SELECT ",
    record_columns!(),
    " FROM idem_records WHERE space = $1 AND key = $2"
);

/// What every write does after the record's own change (`rec`): its
/// events, its notification, and the result's first five columns (the new
/// version and epoch, the events' numbers, and the commit mode set).
/// Parameters `$10..$14` and `$16` (where this statement's events start
/// among those of its transaction: see `group.rs`). A macro, so that the statements below are
/// constants.
macro_rules! write_tail {
    () => {
        "
, ev AS (
    INSERT INTO idem_events (seq, op_key, durable, bytes)
    SELECT (pg_current_xact_id()::text::bigint << 16) + $16::bigint + e.ord, e.k, $12::boolean, e.b
    FROM rec, unnest($10::bytea[], $11::bytea[]) WITH ORDINALITY AS e(k, b, ord)
    RETURNING seq
), n AS (
    SELECT pg_notify('idem_changed', $13::text) FROM rec WHERE rec.watched
)
SELECT rec.version, rec.epoch, ARRAY(SELECT seq FROM ev ORDER BY seq),
       (SELECT count(*) FROM n), set_config('synchronous_commit', $14::text, true)"
    };
}

/// Behind a pooler, what a write that takes a claim also requires: that
/// this journal (holder `$15`) holds the worker id's lease row at the
/// statement's instant, on the database's clock (see `identity.rs`).
const FENCE: &str = " AND ($6::int <> 1 OR EXISTS (SELECT 1 FROM idem_worker_ids w \
     WHERE w.worker = $7::text AND w.holder = $15::text AND w.lease_until > clock_timestamp()))";

/// A write statement with [`FENCE`] added to its condition.
fn fenced(sql: &str) -> String {
    const UPDATE_CONDITION: &str = "AND version = $3::bigint";
    const INSERT_CONDITION: &str = "AND NOT EXISTS (SELECT 1 FROM cur)";
    let anchor = if sql.contains(UPDATE_CONDITION) {
        UPDATE_CONDITION
    } else {
        INSERT_CONDITION
    };
    debug_assert!(sql.contains(anchor));
    sql.replacen(anchor, &[anchor, FENCE].concat(), 1)
}

/// The write statements.
#[derive(Clone, Copy)]
enum Statement {
    /// [`INSERT`] and [`WRITE_TAIL`].
    Insert,
    /// [`UPDATE`] and [`WRITE_TAIL`].
    Update,
    /// [`INSERT`] and [`CLAIM_TAIL`].
    Claim,
}

/// A write statement's text, [`fenced`] behind a pooler (built once).
fn sql_of(statement: Statement, pooler: bool) -> Arc<str> {
    static ALL: std::sync::OnceLock<[Arc<str>; 6]> = std::sync::OnceLock::new();
    let all = ALL.get_or_init(|| {
        let plain = [
            [INSERT, WRITE_TAIL].concat(),
            [UPDATE, WRITE_TAIL].concat(),
            [INSERT, CLAIM_TAIL].concat(),
        ];
        let fenced = plain.clone().map(|s| fenced(&s));
        let [a, b, c] = plain.map(Arc::from);
        let [d, e, f] = fenced.map(Arc::from);
        [a, b, c, d, e, f]
    });
    all[statement as usize + if pooler { 3 } else { 0 }].clone()
}

/// The end of a write: a row if it happened, none if its condition failed.
const WRITE_TAIL: &str = concat!(write_tail!(), "\nFROM rec");

/// The end of a claim: always one row, with [`INSERT`]'s `cur` (the record
/// as [`RECORD_COLUMNS`]) from column 5 on when nothing was inserted
/// (`version`, the first column, is then NULL).
const CLAIM_TAIL: &str = concat!(
    write_tail!(),
    ", cur.*
FROM (VALUES (1)) AS one (x)
LEFT JOIN rec ON true
LEFT JOIN cur ON rec.version IS NULL"
);

/// A write conditional on the record's version.
const UPDATE: &str = "
WITH rec AS (
    UPDATE idem_records SET
        version = nextval('idem_versions'),
        body = $4::bytea,
        escalated = $5::boolean,
        epoch = epoch + CASE WHEN $6::int = 1 THEN 1 ELSE 0 END,
        owner_worker = CASE $6::int WHEN 0 THEN owner_worker WHEN 1 THEN $7::text END,
        owner_incarnation = CASE $6::int WHEN 0 THEN owner_incarnation WHEN 1 THEN $8::bigint END,
        lease_until = CASE $6::int
            WHEN 0 THEN CASE WHEN owner_worker IS NOT NULL
                THEN greatest(lease_until, clock_timestamp() + $9::float8 * interval '1 millisecond') END
            WHEN 1 THEN clock_timestamp() + $9::float8 * interval '1 millisecond' END
    WHERE space = $1::smallint AND key = $2::bytea AND version = $3::bigint
    RETURNING version, epoch, watched
)";

/// A write of a record that must not exist (`$3` is 0). `cur` is the
/// record if it does: then nothing is inserted (and no version drawn), and
/// a claim returns it. (A record committed by another transaction after
/// the statement began is not in `cur`; the insert then waits for it and
/// does nothing.)
const INSERT: &str = concat!(
    "
WITH cur AS (
    SELECT ",
    record_columns!(),
    " FROM idem_records WHERE space = $1::smallint AND key = $2::bytea
), rec AS (
    INSERT INTO idem_records
        (space, key, version, epoch, owner_worker, owner_incarnation, lease_until, escalated, body)
    SELECT $1::smallint, $2::bytea, nextval('idem_versions'),
        CASE WHEN $6::int = 1 THEN 1 ELSE 0 END,
        CASE WHEN $6::int = 1 THEN $7::text END,
        CASE WHEN $6::int = 1 THEN $8::bigint END,
        CASE WHEN $6::int = 1 THEN clock_timestamp() + $9::float8 * interval '1 millisecond' END,
        $5::boolean, $4::bytea
    WHERE $3::bigint = 0 AND NOT EXISTS (SELECT 1 FROM cur)
    ON CONFLICT (space, key) DO NOTHING
    RETURNING version, epoch, watched
)"
);

impl PostgresJournal {
    /// Where `url` points, without its password:
    /// `postgres://user@host:port/db` (a unix socket directory as the
    /// host). What the journal's own errors name; for tools that report
    /// on a URL before connecting to it.
    ///
    /// ```
    /// use idem_postgres::PostgresJournal;
    /// let at = PostgresJournal::redacted_url("postgres://ops:s3cret@db.internal:6432/idem");
    /// assert_eq!(at.unwrap(), "postgres://ops@db.internal:6432/idem");
    /// ```
    pub fn redacted_url(url: &str) -> Result<String, Error> {
        parse_config(url).map(|config| location_of(&config))
    }

    /// Connects to the database at `url` (a `postgres://` URL or a
    /// `key=value` connection string; `host=/path` is a unix socket
    /// directory), creating or checking the schema, with default options.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), idem_journal::error::Error> {
    /// let journal = idem_postgres::PostgresJournal::connect(
    ///     "postgres://idem@/idem?host=/run/idem-pg",
    /// )
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<PostgresJournal, Error> {
        PostgresJournal::connect_with(url, &PostgresOptions::default()).await
    }

    /// Connects with options. Must be called inside a tokio runtime (the
    /// journal keeps a listening connection in a task).
    pub async fn connect_with(
        url: &str,
        options: &PostgresOptions,
    ) -> Result<PostgresJournal, Error> {
        if options.lease < Duration::from_millis(30) {
            return Err(Error::Usage(format!(
                "a lease of {:?} is too short to be renewed in time (at least 30 ms)",
                options.lease
            )));
        }
        let mut config = parse_config(url)?;
        if config.get_application_name().is_none() {
            config.application_name("idem");
        }
        config.connect_timeout(options.connect_timeout);
        let location = location_of(&config);
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                // A closed connection (the server restarted) is noticed by
                // its connection task; the check costs no round trip.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let mut builder = Pool::builder(manager)
            .max_size(options.pool_size.max(1))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .create_timeout(Some(options.connect_timeout));
        if options.synchronous_standby {
            builder = builder.post_create(standby::hook());
        }
        let pool = builder
            .build()
            .map_err(|e| Error::storage("build the connection pool", &location, e))?;
        let pooler = match options.pooler {
            Some(p) => p,
            None => detect_pooler(&config)
                .await
                .map_err(pg("detect a connection pooler", &location))?,
        };
        let clock = Arc::new(DbClock::new());
        {
            let mut client = pool
                .get()
                .await
                .map_err(|e| pool_failure("connect", &location, e))?;
            if options.migrate {
                schema::migrate(&mut client, &location).await?;
            } else {
                schema::check(&**client, &location).await?;
            }
            listen::measure_offset(&client, &clock)
                .await
                .map_err(pg("read the database's clock", &location))?;
            if options.synchronous_standby && standby::connected(&client).await == Some(0) {
                tracing::warn!(target: "idem::journal", location = %location, "a synchronous standby is configured but none is connected: commits wait until one is");
            }
        }
        let identities = if pooler {
            crate::identity::Identities::leased(pool.clone(), location.clone(), options.lease)
        } else {
            crate::identity::Identities::new(config.clone(), location.clone())
        };
        let listen = match (pooler, &options.listen_url) {
            (false, _) => listen::Source::Direct(Box::new(config)),
            (true, Some(url)) => {
                let mut direct = parse_config(url)?;
                if direct.get_application_name().is_none() {
                    direct.application_name("idem");
                }
                direct.connect_timeout(options.connect_timeout);
                listen::Source::Direct(Box::new(direct))
            }
            (true, None) => listen::Source::Poll(pool.clone()),
        };
        let (listener, listening) = listen::Listener::start(listen, clock.clone());
        if pooler {
            tracing::debug!(target: "idem::journal", location = %location, listen = options.listen_url.is_some(), "behind a connection pooler: unnamed statements, a leased worker id");
        }
        let group = group::Group::new(pool.clone(), location.clone(), pooler);
        Ok(PostgresJournal {
            group,
            pool,
            location,
            options: options.clone(),
            clock,
            listener,
            listening,
            barrier_slot: std::process::id() as i32,
            async_pending: AtomicBool::new(false),
            durable_floor: AtomicU64::new(0),
            last_seq: AtomicU64::new(0),
            identities,
            pooler,
        })
    }

    /// Creates the schema, or checks that it is one this build reads, and
    /// returns its version; what `idem migrate` runs. Refuses a database
    /// whose schema is newer ([`Error::UnsupportedFormat`]), changing
    /// nothing.
    pub async fn migrate(url: &str) -> Result<i32, Error> {
        let config = parse_config(url)?;
        let location = location_of(&config);
        let (mut client, connection) = config
            .connect(NoTls)
            .await
            .map_err(pg("connect", &location))?;
        let task = tokio::spawn(connection);
        let out = schema::migrate(&mut client, &location).await;
        drop(client);
        let _ = task.await;
        out
    }

    /// Takes `owner`'s worker id for this process, as its first claim
    /// would: refused with [`Error::WorkerInUse`] while another live
    /// process holds it (`Runtime::builder().postgres(..).connect()` calls
    /// this, so that a second process under one id fails at start).
    pub async fn hold_worker_id(&self, owner: &Owner) -> Result<(), Error> {
        self.identities.ensure(owner).await
    }

    /// The options it was opened with.
    pub fn options(&self) -> &PostgresOptions {
        &self.options
    }

    /// Whether notifications from other processes are being received now
    /// (the listening connection is up); waiters poll while it is not.
    pub fn listening(&self) -> bool {
        self.listener.connected()
    }

    /// Whether it runs as behind a connection pooler in transaction
    /// pooling mode ([`PostgresOptions::pooler()`], set or detected).
    pub fn behind_pooler(&self) -> bool {
        self.pooler
    }

    /// The database's clock as this process sees it.
    pub fn db_clock(&self) -> &Arc<DbClock> {
        &self.clock
    }

    /// Claims whose lease has expired (their drivers are dead or cut off),
    /// up to `limit`, oldest expiry first: what a sweeper hands to calls
    /// that recover them. Rows being written at this moment are skipped
    /// (`FOR UPDATE SKIP LOCKED`) rather than waited for: whoever writes
    /// them is alive.
    pub async fn expired_claims(
        &self,
        space: Space,
        limit: usize,
    ) -> Result<Vec<(Digest, Loaded)>, Error> {
        let client = self.client().await?;
        let sql = format!(
            "SELECT key, {RECORD_COLUMNS} FROM idem_records
             WHERE space = $1 AND owner_worker IS NOT NULL AND lease_until <= clock_timestamp()
             ORDER BY lease_until LIMIT $2 FOR UPDATE SKIP LOCKED"
        );
        let rows = run(
            &client,
            self.pooler,
            &sql,
            &[
                (&space_id(space), Type::INT2),
                (&(limit as i64), Type::INT8),
            ],
        )
        .await
        .map_err(pg("scan for expired claims", &self.location))?;
        rows.iter()
            .map(|r| Ok((digest_of(r.get(0), &self.location)?, loaded(r, 1))))
            .collect()
    }

    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Object, Error> {
        self.pool
            .get()
            .await
            .map_err(|e| pool_failure("connect", &self.location, e))
    }

    async fn write_now(&self, w: &Write<'_>) -> Result<Written, Error> {
        if let ClaimChange::Take(owner) = &w.claim {
            self.identities.ensure(owner).await?;
        }
        let sql = sql_of(
            match w.expect {
                Expect::Absent => Statement::Insert,
                Expect::Version(_) => Statement::Update,
            },
            self.pooler,
        );
        let mut row = self.execute(w, &sql).await?;
        if row.is_none() && self.rechecked(w).await? {
            row = self.execute(w, &sql).await?;
        }
        Ok(match row {
            Some(row) => {
                let (version, epoch, seqs) = self.done(w, &row);
                Written::Done {
                    version,
                    epoch,
                    seqs,
                }
            }
            None => Written::Conflict,
        })
    }

    /// [`Journal::claim`] in one statement: the insert, or the record that
    /// is there (read in the statement's snapshot: a record committed by
    /// another transaction after that is not in it, and comes back as
    /// `Exists(None)`, which the engine reads again).
    async fn claim_now(&self, w: &Write<'_>) -> Result<Claimed, Error> {
        if let ClaimChange::Take(owner) = &w.claim {
            self.identities.ensure(owner).await?;
        }
        let sql = sql_of(Statement::Claim, self.pooler);
        let no_row = || {
            Error::storage(
                "claim a record",
                &self.location,
                "the statement returned no row (it always returns one)",
            )
        };
        let mut row = self.execute(w, &sql).await?.ok_or_else(no_row)?;
        let neither = |row: &Row| {
            row.get::<_, Option<i64>>(0).is_none() && row.get::<_, Option<i64>>(5).is_none()
        };
        if neither(&row) && self.rechecked(w).await? {
            row = self.execute(w, &sql).await?.ok_or_else(no_row)?;
        }
        if row.get::<_, Option<i64>>(0).is_some() {
            let (version, epoch, seqs) = self.done(w, &row);
            return Ok(Claimed::Done {
                version,
                epoch,
                seqs,
            });
        }
        let found = row
            .get::<_, Option<i64>>(5)
            .is_some()
            .then(|| loaded(&row, 5));
        Ok(Claimed::Exists(found))
    }

    /// Behind a pooler, after a write that takes a claim changed nothing:
    /// whether that was because this journal's lease on the worker id had
    /// lapsed (then it is taken again, and the write is worth running once
    /// more); [`Error::WorkerInUse`] if another process holds the id now.
    async fn rechecked(&self, w: &Write<'_>) -> Result<bool, Error> {
        match &w.claim {
            ClaimChange::Take(owner) if self.pooler => self.identities.recheck(owner).await,
            _ => Ok(false),
        }
    }

    /// What a write that happened returned: version, epoch, event numbers.
    fn done(&self, w: &Write<'_>, row: &Row) -> (u64, u64, Vec<u64>) {
        if w.durability == Durability::Eventual {
            self.async_pending.store(true, Ordering::SeqCst);
        }
        let seqs: Vec<i64> = row.get(2);
        self.wrote(&seqs);
        (
            row.get::<_, i64>(0) as u64,
            row.get::<_, i64>(1) as u64,
            seqs.into_iter().map(|s| s as u64).collect(),
        )
    }

    /// Runs a write statement (`$1..$16` as [`INSERT`]/[`UPDATE`] and
    /// [`WRITE_TAIL`] take them); its first row, if any. Immediate writes
    /// may share a transaction with other calls' (`group.rs`).
    async fn execute(&self, w: &Write<'_>, sql: &Arc<str>) -> Result<Option<Row>, Error> {
        let eventual = w.durability == Durability::Eventual;
        let (worker, incarnation) = match w.claim {
            ClaimChange::Take(o) => (Some(o.worker.to_string()), Some(o.incarnation as i64)),
            _ => (None, None),
        };
        let job = group::Job {
            sql: Arc::clone(sql),
            space: space_id(w.space),
            key: w.key.to_vec(),
            expected: match w.expect {
                Expect::Absent => 0,
                Expect::Version(v) => v as i64,
            },
            body: w.body.to_vec(),
            escalated: w.escalated,
            code: claim_code(w.claim),
            worker,
            incarnation,
            lease: self.options.lease.as_millis() as f64,
            keys: w.events.iter().map(|e| e.key.map(|k| k.to_vec())).collect(),
            bytes: w.events.iter().map(|e| e.bytes.to_vec()).collect(),
            durable: !eventual,
            payload: listen::payload(w.space, w.key),
            commit: if eventual { "off" } else { "on" },
            holder: self.identities.holder().to_string(),
        };
        if !eventual {
            return self.group.write(job).await;
        }
        let client = self.client().await?;
        let rows = group::statement(&client, self.pooler, &job, 0)
            .await
            .map_err(pg("write a record", &self.location))?;
        Ok(rows.into_iter().next())
    }

    /// Remembers the sequence numbers a write was given.
    pub(crate) fn wrote(&self, seqs: &[i64]) {
        if let Some(max) = seqs.iter().max() {
            self.last_seq.fetch_max(*max as u64, Ordering::SeqCst);
        }
    }

    /// Waits until this process's events are all below the readers'
    /// horizon: every transaction that started before its last write has
    /// ended (they may be other sessions', in other databases too: the
    /// horizon is the cluster's oldest running transaction). Bounded: a
    /// transaction that stays open for long delays the stream's readers,
    /// never its order; `sync` then returns and its events show up later.
    pub(crate) async fn wait_readable(&self, mut horizon: u64) -> Result<(), Error> {
        let last = self.last_seq.load(Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut pause = Duration::from_millis(1);
        while horizon <= last {
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(target: "idem::journal", location = %self.location, "a long-running transaction holds back the audit stream's readers");
                return Ok(());
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(50));
            let client = self.client().await?;
            horizon = client
                .query_typed_one(
                    "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint << 16",
                    &[],
                )
                .await
                .map_err(pg("read the transaction horizon", &self.location))?
                .get::<_, i64>(0) as u64;
        }
        Ok(())
    }

    /// Makes every asynchronously committed transaction so far durable: a
    /// synchronous commit flushes the WAL up to its own commit record, which
    /// follows theirs. Returns the sequence number below which every event
    /// visible before the barrier is now durable.
    pub(crate) async fn barrier(&self) -> Result<u64, Error> {
        let client = self.client().await?;
        let rows = run(
            &client,
            self.pooler,
            "INSERT INTO idem_barrier (slot, at) VALUES ($1, clock_timestamp())
             ON CONFLICT (slot) DO UPDATE SET at = EXCLUDED.at
             RETURNING pg_snapshot_xmin(pg_current_snapshot())::text::bigint << 16",
            &[(&self.barrier_slot, Type::INT4)],
        )
        .await
        .map_err(pg("flush the write-ahead log", &self.location))?;
        let row = rows.first().ok_or_else(|| {
            Error::storage(
                "flush the write-ahead log",
                &self.location,
                "no row returned",
            )
        })?;
        let horizon = row.get::<_, i64>(0) as u64;
        self.durable_floor.fetch_max(horizon, Ordering::SeqCst);
        Ok(horizon)
    }

    /// Waits for a change of the record, its lease's expiry or the polling
    /// interval, whichever comes first.
    async fn wait_for_change(&self, space: Space, key: &Digest, version: u64) {
        let mut changes = self.listener.subscribe();
        let poll = if self.listener.connected() {
            // Notifications arrive; polling only covers a lost one.
            (self.options.lease / 3)
                .min(Duration::from_secs(2))
                .max(self.options.poll)
        } else {
            self.options.poll
        };
        // Read after subscribing, so that no change between the caller's
        // load and now goes unnoticed.
        let mut wait = poll;
        if let Ok(client) = self.client().await {
            // Marks the record watched (so its next write notifies) unless
            // it is, and reads its version: the update's when it made one
            // (it waited for any concurrent writer and saw its version),
            // else the snapshot's (the mark was there before it: a writer
            // since then notifies).
            let (space, key) = (space_id(space), &key[..]);
            let row = run(
                    &client,
                    self.pooler,
                    "WITH cur AS (
                        SELECT version, CASE WHEN lease_until IS NOT NULL THEN
                            greatest(0, extract(epoch FROM (lease_until - clock_timestamp())) * 1000)::float8
                            END AS ms
                        FROM idem_records WHERE space = $1 AND key = $2
                     ), upd AS (
                        UPDATE idem_records SET watched = true
                        WHERE space = $1 AND key = $2 AND NOT watched
                        RETURNING version
                     )
                     SELECT coalesce((SELECT version FROM upd), cur.version), cur.ms,
                            set_config('synchronous_commit', 'off', true)
                     FROM cur",
                    &[(&space, Type::INT2), (&key, Type::BYTEA)],
                )
                .await
                .map(|rows| rows.into_iter().next());
            match row {
                Ok(Some(row)) if row.get::<_, i64>(0) as u64 == version => {
                    if let Some(ms) = row.get::<_, Option<f64>>(1) {
                        // A dead driver writes nothing: wake when its lease
                        // runs out.
                        wait = wait.min(Duration::from_millis(ms as u64 + 2));
                    }
                }
                Ok(_) => return,
                Err(_) => {}
            }
        }
        let heard = async {
            loop {
                match changes.recv().await {
                    Ok(Some((s, k))) if s == space && k == *key => return,
                    Ok(Some(_)) => continue,
                    Ok(None) | Err(_) => return,
                }
            }
        };
        let _ = tokio::time::timeout(wait, heard).await;
    }
}

impl Drop for PostgresJournal {
    fn drop(&mut self) {
        self.listening.abort();
    }
}

impl Journal for PostgresJournal {
    fn location(&self) -> &str {
        &self.location
    }

    fn clock(&self) -> Option<Arc<dyn Clock>> {
        Some(self.clock.clone())
    }

    fn renewal(&self) -> Option<Duration> {
        Some(self.options.lease / 3)
    }

    /// Every read is a round trip, and most calls are on new keys.
    fn remote(&self) -> bool {
        true
    }

    fn claim_first(&self) -> bool {
        true
    }

    fn load<'a>(
        &'a self,
        space: Space,
        key: &'a Digest,
    ) -> BoxFuture<'a, Result<Option<Loaded>, Error>> {
        Box::pin(async move {
            let client = self.client().await?;
            let rows = run(
                &client,
                self.pooler,
                LOAD,
                &[(&space_id(space), Type::INT2), (&&key[..], Type::BYTEA)],
            )
            .await
            .map_err(pg("read a record", &self.location))?;
            Ok(rows.first().map(|r| loaded(r, 0)))
        })
    }

    fn write<'a>(&'a self, write: Write<'a>) -> BoxFuture<'a, Result<Written, Error>> {
        Box::pin(async move {
            check_events(&write)?;
            self.write_now(&write).await
        })
    }

    fn claim<'a>(&'a self, write: Write<'a>) -> BoxFuture<'a, Result<Claimed, Error>> {
        Box::pin(async move {
            check_events(&write)?;
            self.claim_now(&write).await
        })
    }

    fn renew<'a>(
        &'a self,
        owner: &'a Owner,
        held: &'a [Held],
    ) -> BoxFuture<'a, Result<Vec<bool>, Error>> {
        Box::pin(async move {
            if held.is_empty() {
                return Ok(Vec::new());
            }
            let client = self.client().await?;
            // The rows are locked in key order, as a group of writes locks
            // them (`group.rs`), so that a renewal and a group never wait
            // for each other in a cycle.
            let sql = "WITH h AS (
                        SELECT * FROM unnest($1::smallint[], $2::bytea[], $3::bigint[])
                            AS h(space, key, epoch)
                     ), locked AS (
                        SELECT r.space, r.key FROM idem_records r
                        JOIN h ON r.space = h.space AND r.key = h.key AND r.epoch = h.epoch
                        WHERE r.owner_worker = $4 AND r.owner_incarnation = $5
                        ORDER BY r.space, r.key
                        FOR UPDATE OF r
                     ), renewed AS (
                        UPDATE idem_records r
                        SET lease_until = clock_timestamp() + $6::float8 * interval '1 millisecond'
                        FROM locked l
                        WHERE r.space = l.space AND r.key = l.key
                        RETURNING r.space, r.key
                     )
                     SELECT space, key, set_config('synchronous_commit', 'off', true) FROM renewed";
            let spaces: Vec<i16> = held.iter().map(|h| space_id(h.space)).collect();
            let keys: Vec<&[u8]> = held.iter().map(|h| &h.key[..]).collect();
            let epochs: Vec<i64> = held.iter().map(|h| h.epoch as i64).collect();
            let rows = run(
                &client,
                self.pooler,
                sql,
                &[
                    (&spaces, Type::INT2_ARRAY),
                    (&keys, Type::BYTEA_ARRAY),
                    (&epochs, Type::INT8_ARRAY),
                    (&&*owner.worker, Type::TEXT),
                    (&(owner.incarnation as i64), Type::INT8),
                    (&(self.options.lease.as_millis() as f64), Type::FLOAT8),
                ],
            )
            .await
            .map_err(pg("renew leases", &self.location))?;
            let renewed: Vec<(i16, Vec<u8>)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
            Ok(held
                .iter()
                .map(|h| {
                    renewed
                        .iter()
                        .any(|(s, k)| *s == space_id(h.space) && k[..] == h.key[..])
                })
                .collect())
        })
    }

    fn changed<'a>(&'a self, space: Space, key: &'a Digest, version: u64) -> BoxFuture<'a, ()> {
        Box::pin(self.wait_for_change(space, key, version))
    }

    fn append<'a>(
        &'a self,
        events: &'a [NewEvent<'a>],
        durability: Durability,
    ) -> BoxFuture<'a, Result<Vec<u64>, Error>> {
        Box::pin(self.append_events(events, durability))
    }

    fn events<'a>(&'a self, from: u64, limit: usize) -> BoxFuture<'a, Result<EventRows, Error>> {
        Box::pin(self.read_events(from, limit))
    }

    fn events_for<'a>(&'a self, key: &'a Digest) -> BoxFuture<'a, Result<EventRows, Error>> {
        Box::pin(self.read_events_for(key))
    }

    fn truncate_events(&self, before: u64) -> BoxFuture<'_, Result<u64, Error>> {
        Box::pin(async move {
            let client = self.client().await?;
            let rows = run(
                &client,
                self.pooler,
                "WITH d AS (DELETE FROM idem_events WHERE seq < $1 RETURNING 1)
                 SELECT count(*) FROM d",
                &[(&(before.min(i64::MAX as u64) as i64), Type::INT8)],
            )
            .await
            .map_err(pg("truncate the audit stream", &self.location))?;
            Ok(rows.first().map_or(0, |r| r.get::<_, i64>(0) as u64))
        })
    }

    fn escalated(&self) -> BoxFuture<'_, Result<Vec<(Digest, Loaded)>, Error>> {
        Box::pin(async move {
            let client = self.client().await?;
            let rows = run(
                &client,
                self.pooler,
                &format!(
                    "SELECT key, {RECORD_COLUMNS} FROM idem_records
                     WHERE space = 0 AND escalated ORDER BY key"
                ),
                &[],
            )
            .await
            .map_err(pg("read the escalations", &self.location))?;
            rows.iter()
                .map(|r| Ok((digest_of(r.get(0), &self.location)?, loaded(r, 1))))
                .collect()
        })
    }

    fn scan<'a>(
        &'a self,
        space: Space,
        after: Option<&'a Digest>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<(Digest, Loaded)>, Error>> {
        Box::pin(async move {
            let client = self.client().await?;
            let after: &[u8] = after.map_or(&[], |a| &a[..]);
            let rows = run(
                &client,
                self.pooler,
                &format!(
                    "SELECT key, {RECORD_COLUMNS} FROM idem_records
                     WHERE space = $1 AND key > $2 ORDER BY key LIMIT $3"
                ),
                &[
                    (&space_id(space), Type::INT2),
                    (&after, Type::BYTEA),
                    (&(limit.min(i64::MAX as usize) as i64), Type::INT8),
                ],
            )
            .await
            .map_err(pg("scan records", &self.location))?;
            rows.iter()
                .map(|r| Ok((digest_of(r.get(0), &self.location)?, loaded(r, 1))))
                .collect()
        })
    }

    fn remove<'a>(
        &'a self,
        space: Space,
        key: &'a Digest,
        version: u64,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let client = self.client().await?;
            let rows = run(
                &client,
                self.pooler,
                "DELETE FROM idem_records WHERE space = $1 AND key = $2 AND version = $3
                 RETURNING 1",
                &[
                    (&space_id(space), Type::INT2),
                    (&&key[..], Type::BYTEA),
                    (&(version as i64), Type::INT8),
                ],
            )
            .await
            .map_err(pg("remove a record", &self.location))?;
            Ok(rows.len() == 1)
        })
    }

    fn sync(&self) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(async move {
            let mut horizon = 0;
            if self.async_pending.swap(false, Ordering::SeqCst) {
                match self.barrier().await {
                    Ok(h) => horizon = h,
                    Err(e) => {
                        self.async_pending.store(true, Ordering::SeqCst);
                        return Err(e);
                    }
                }
            }
            // What this process wrote is durable; make it readable too, so
            // that `Runtime::audit` after a call sees the call's events.
            self.wait_readable(horizon).await
        })
    }

    fn size_on_disk(&self) -> BoxFuture<'_, Result<u64, Error>> {
        Box::pin(async move {
            let client = self.client().await?;
            let row = client
                .query_typed_one(
                    "SELECT (pg_total_relation_size('idem_records')
                           + pg_total_relation_size('idem_events'))::bigint",
                    &[],
                )
                .await
                .map_err(pg("measure the journal", &self.location))?;
            Ok(row.get::<_, i64>(0) as u64)
        })
    }
}

/// Whether `config` leads to a pooler that moves transactions between
/// server sessions (see [`PostgresOptions::pooler()`]): two sessions ask
/// for their server process, the first again while the second holds a
/// transaction open. Directly connected, each session is one server
/// process of its own for its whole life, so neither a change under the
/// first nor a process shared by both can be seen.
async fn detect_pooler(
    config: &deadpool_postgres::tokio_postgres::Config,
) -> Result<bool, deadpool_postgres::tokio_postgres::Error> {
    use deadpool_postgres::tokio_postgres::{Client, Config, Error as PgError};
    async fn open(config: &Config) -> Result<(Client, tokio::task::JoinHandle<()>), PgError> {
        let (client, connection) = config.connect(NoTls).await?;
        let task = tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok((client, task))
    }
    async fn pid(client: &Client) -> Result<i32, PgError> {
        Ok(client
            .query_typed_one("SELECT pg_backend_pid()", &[])
            .await?
            .get(0))
    }
    for _ in 0..2 {
        let ((first, first_task), (second, second_task)) =
            tokio::try_join!(open(config), open(config))?;
        let found = async {
            let before = pid(&first).await?;
            second.batch_execute("BEGIN").await?;
            let other = pid(&second).await?;
            let after = pid(&first).await?;
            second.batch_execute("COMMIT").await?;
            Ok::<_, PgError>(after != before || other == before)
        }
        .await;
        drop((first, second));
        let _ = first_task.await;
        let _ = second_task.await;
        if found? {
            return Ok(true);
        }
    }
    Ok(false)
}
