//! The multi-worker mode ([`Config::backend`] = PostgreSQL): `workers`
//! worker processes share one database and race the same orders (every
//! worker runs every order of the round, so every key is called by all of
//! them at once), while the parent
//! - SIGKILLs workers at random instants and lets others die at the
//!   instrumented crash points (after an effect landed, before its COMMIT;
//!   before a request went out);
//! - pauses workers past their lease (SIGSTOP, then SIGCONT once the lease
//!   ran out twice over): the others take their calls over, and the paused
//!   one must be fenced off when it wakes, never committing over the new
//!   owner;
//! - restarts the database server itself mid-wave (`pg_ctl stop -m
//!   immediate`, then start): every call in flight fails closed, workers
//!   reconnect and carry on.
//!
//! A *wave* starts every worker (each under its stable worker id, so a
//! restarted worker takes over what its killed incarnation left at once)
//! and waits until all have ended; waves continue until one worker has
//! finished every order. Between waves the operator settles escalations
//! as in the sled mode, and the round ends with the same checks: each
//! effect exactly once in the providers' ledgers (found by business
//! identity), one commit per operation in the audit stream, nothing left
//! escalated, and a last run of every workflow that sends nothing.
//!
//! The *failover mode* ([`Config::failover`](super::Config::failover)):
//! the run's server is a primary with a synchronous standby
//! (`idem_testkit::pg_replica::PgPair`), the workers connect with the
//! pair's multi-host URL (`target_session_attrs=read-write`: whichever
//! slot is the primary) and `PostgresOptions::synchronous_standby(true)`
//! (told by `IDEM_TORTURE_SYNC_STANDBY`), and where the plain mode restarts
//! the server a wave fails over instead: the primary is stopped `-m
//! immediate`, the standby promoted, and a new synchronous standby made of
//! the promoted primary at once, while the workers run on (see
//! [`Database::disrupt`] for why at once). One failover in two, the
//! standby lags first: it is stopped at a random instant before the
//! failover and started again only to be promoted, so that everything the
//! primary had acknowledged alone would be lost (it acknowledges nothing
//! alone: commits wait). The operator and the final checks read the
//! journal through the same URL, so from the current primary.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use idem::Runtime;
use idem_testkit::pg::PgServer;
use idem_testkit::pg_replica::PgPair;

use super::{
    parse_done, status_line, At, CrashPoint, End, JournalAt, Plan, Round, Summary, CONCURRENCY_ENV,
    CRASH_ENV, EFFECT_TOOLS, EXIT_DONE, JOURNAL_ENV, LEASE_ENV, ORDERS_ENV, POOLER_ENV,
    POSTGRES_ENV, PREFIX_ENV, STATUS_ENV, SYNC_STANDBY_ENV, WORKER_DEADLINE, WORKER_ENV,
    WORKER_ID_ENV,
};

/// How long a worker keeps trying to connect (the database may be
/// restarting).
const CONNECT_FOR: Duration = Duration::from_secs(30);

/// A worker's runtime on the round's database, under the worker id and
/// lease its environment gives; retried while the database is down.
pub(super) async fn connect_worker(url: &str) -> Result<Runtime, idem::Error> {
    let id = std::env::var(WORKER_ID_ENV).unwrap_or_else(|_| "w0".into());
    let lease = std::env::var(LEASE_ENV)
        .ok()
        .and_then(|l| l.parse().ok())
        .map_or(Duration::from_secs(1), Duration::from_millis);
    let deadline = Instant::now() + CONNECT_FOR;
    let options = idem::PostgresOptions::default()
        .pooler(std::env::var_os(POOLER_ENV).is_some())
        .synchronous_standby(std::env::var_os(SYNC_STANDBY_ENV).is_some());
    loop {
        let opened = Runtime::builder()
            .postgres(url)
            .postgres_options(options.clone())
            .worker_id(id.as_str())
            .lease(lease)
            .in_flight_wait(Duration::from_secs(5))
            .connect()
            .await;
        match opened {
            Err(idem::Error::Storage { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return other,
        }
    }
}

/// The run's database server: one server, or (failover mode) a primary
/// with a synchronous standby.
pub(super) enum Database {
    Single(PgServer),
    Pair(Box<PgPair>),
}

impl Database {
    /// Starts one server, or a pair when `failover`.
    pub(super) fn start(failover: bool) -> std::io::Result<Database> {
        Ok(if failover {
            Database::Pair(Box::new(PgPair::start()?))
        } else {
            Database::Single(PgServer::start()?)
        })
    }

    /// A new database of the round: its URL (the pair's multi-host one,
    /// which reaches whichever slot is the primary).
    fn create_database(&self) -> std::io::Result<String> {
        match self {
            Database::Single(server) => server.create_database(),
            Database::Pair(pair) => pair.create_database(),
        }
    }

    /// Drops a passed round's database (on the current primary).
    fn drop_database(&self, url: &str) -> std::io::Result<()> {
        match self {
            Database::Single(server) => server.drop_database(url),
            Database::Pair(pair) => pair.primary().drop_database(url),
        }
    }

    /// The mid-wave event: a restart of the one server (down for
    /// `down_for`), or a failover of the pair. A failover stops the
    /// primary `-m immediate` (every connection cut, nothing more written
    /// there: the old primary cannot go on acknowledging behind the new
    /// one), leaves the pair without a primary for `down_for`, promotes
    /// the standby, and at once makes a new synchronous standby of it in
    /// the dead primary's slot. At once, not at the next failover: a
    /// promoted primary names its future standby in
    /// `synchronous_standby_names` from the start, so every commit waits
    /// until that standby is there; deferring the rebuild would leave the
    /// workers of the next waves unable to commit anything. Meanwhile the
    /// workers run on: their connections to the dead primary fail closed,
    /// new ones find the promoted server through the multi-host URL, and
    /// their commits wait through the rebuild.
    ///
    /// `lagged`: the standby was stopped earlier in the wave
    /// ([`Database::lag_standby`]); it is started again once the primary is
    /// down, and promoted with what it had.
    async fn disrupt(&mut self, down_for: Duration, lagged: bool) -> Result<(), String> {
        match self {
            Database::Single(server) => {
                tokio::task::block_in_place(|| server.stop_immediate())
                    .map_err(|e| format!("stop the database: {e}"))?;
                tokio::time::sleep(down_for).await;
                tokio::task::block_in_place(|| server.start_again())
                    .map_err(|e| format!("start the database again: {e}"))
            }
            Database::Pair(pair) => {
                tokio::task::block_in_place(|| pair.stop_immediate())
                    .map_err(|e| format!("failover: stop the primary: {e}"))?;
                tokio::time::sleep(down_for).await;
                if lagged {
                    tokio::task::block_in_place(|| pair.start_standby())
                        .map_err(|e| format!("failover: start the lagging standby: {e}"))?;
                }
                tokio::task::block_in_place(|| pair.promote())
                    .map_err(|e| format!("failover: promote the standby: {e}"))?;
                tokio::task::block_in_place(|| pair.rebuild_standby())
                    .map_err(|e| format!("failover: a new standby of the promoted primary: {e}"))
            }
        }
    }

    /// Failover mode: the standby falls behind (is stopped, `-m fast`)
    /// before a failover. Its WAL ends there; a synchronous primary
    /// acknowledges no commit from then on (they wait), so the promotion
    /// still finds every acknowledged one: what the failover costs is the
    /// commits that were waiting, which the workers never saw acknowledged.
    fn lag_standby(&mut self) -> Result<(), String> {
        match self {
            Database::Single(_) => Err("no standby to lag behind".into()),
            Database::Pair(pair) => tokio::task::block_in_place(|| pair.stop_standby())
                .map_err(|e| format!("failover: stop the standby: {e}")),
        }
    }

    fn is_pair(&self) -> bool {
        matches!(self, Database::Pair(_))
    }
}

impl Round<'_> {
    /// A plan for one worker of a wave.
    fn multi_plan(&mut self, span: Option<Duration>) -> Plan {
        let Some(span) = span else {
            return Plan::Alone;
        };
        let micros = span.as_micros() as u64;
        if self.config.pauses_only {
            return Plan::Pause(Duration::from_micros(self.rng.below(micros / 2 + 1)));
        }
        let u = self.rng.next_f64();
        if u < 0.15 {
            Plan::Alone
        } else if u < 0.35 {
            let tool = EFFECT_TOOLS[self.rng.below(EFFECT_TOOLS.len() as u64) as usize];
            let moment = if self.rng.below(4) == 0 {
                At::Sending
            } else {
                At::Landed
            };
            let most = (self.config.workflows / 2).max(1);
            Plan::Crash(CrashPoint {
                tool: tool.to_string(),
                moment,
                nth: 1 + self.rng.below(most),
            })
        } else if u < 0.43 {
            Plan::Pause(Duration::from_micros(self.rng.below(micros / 2 + 1)))
        } else {
            Plan::KillAfter(Duration::from_micros(self.rng.below(micros + 1)))
        }
    }

    /// A round of the multi-worker mode; see the module documentation.
    pub(super) async fn run_multi(
        mut self,
        server: &mut Database,
        worker: &dyn Fn() -> Command,
        span: &mut Option<Duration>,
        summary: &mut Summary,
    ) -> Result<(), String> {
        let dir = tempfile::Builder::new()
            .prefix("idem-torture-pg-")
            .tempdir()
            .map_err(|e| format!("tempdir: {e}"))?;
        let url = server
            .create_database()
            .map_err(|e| format!("create the round's database: {e}"))?;
        let failover = server.is_pair();
        let journal = JournalAt::Postgres(url.clone(), failover);
        // Behind a pooler, the workers' URL is the pooler's; a database
        // restart goes on under it.
        let bouncer = match (&*server, self.config.pooler) {
            (Database::Single(single), true) => Some(
                idem_testkit::pgbouncer::PgBouncer::start(single)
                    .map_err(|e| format!("start pgbouncer: {e}"))?,
            ),
            (Database::Pair(_), true) => return Err("no pooler in failover mode".into()),
            _ => None,
        };
        let worker_url = bouncer.as_ref().map_or(url.clone(), |b| b.url_of(&url));
        let providers = self.start_providers(summary).await?;
        let workers = self.config.workers;
        let lease = self.config.lease;
        let mut last_death: Option<Instant> = None;
        let mut finished = false;
        let mut history = Vec::new();
        let max_waves = (self.config.max_incarnations as usize).max(10);
        for wave in 0..max_waves {
            let plans: Vec<Plan> = (0..workers).map(|_| self.multi_plan(*span)).collect();
            let restart_at = span
                .filter(|_| self.rng.below(self.config.db_restart_every.max(1)) == 0)
                .map(|s| Duration::from_micros(self.rng.below(s.as_micros() as u64 + 1)));
            let down_for = Duration::from_millis(20 + self.rng.below(200));
            // Failover mode: one failover in two, the standby lags, from
            // this long before it.
            let lag_for = restart_at
                .filter(|_| failover && self.rng.below(2) == 0)
                .map(|at| Duration::from_micros(self.rng.below(at.as_micros() as u64 + 1)));
            let began = Instant::now();
            let mut tasks = tokio::task::JoinSet::new();
            for (i, plan) in plans.iter().enumerate() {
                let status = dir.path().join(format!("status-{wave}-{i}"));
                let stderr = dir.path().join(format!("stderr-{wave}-{i}"));
                status_line(&status, &format!("PLAN {plan:?}"));
                let mut command = tokio::process::Command::from(worker());
                command
                    .env(WORKER_ENV, "1")
                    .env(JOURNAL_ENV, &worker_url)
                    .env(POSTGRES_ENV, &worker_url)
                    .env(WORKER_ID_ENV, format!("w{i}"))
                    .env(LEASE_ENV, lease.as_millis().to_string())
                    .env(STATUS_ENV, &status)
                    .env(
                        ORDERS_ENV,
                        format!("{},{}", self.orders[0], self.orders.len()),
                    )
                    .env(PREFIX_ENV, &self.prefix)
                    .env(CONCURRENCY_ENV, self.config.concurrency.to_string())
                    .envs(providers.addrs().to_env())
                    .env_remove(CRASH_ENV)
                    .env_remove(POOLER_ENV)
                    .env_remove(SYNC_STANDBY_ENV)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(
                        std::fs::File::create(&stderr).map_err(|e| format!("stderr file: {e}"))?,
                    )
                    .kill_on_drop(true);
                if let Plan::Crash(point) = plan {
                    command.env(CRASH_ENV, point.to_env());
                }
                if bouncer.is_some() {
                    command.env(POOLER_ENV, "1");
                }
                if failover {
                    command.env(SYNC_STANDBY_ENV, "1");
                }
                let child = command.spawn().map_err(|e| format!("spawn worker: {e}"))?;
                let plan = plan.clone();
                tasks.spawn(async move {
                    let end = drive(child, &plan, lease).await;
                    (i, plan, end, status, stderr)
                });
            }
            let restart = async {
                let Some(at) = restart_at else {
                    return Ok(false);
                };
                if let Some(lag) = lag_for {
                    tokio::time::sleep(at - lag).await;
                    server.lag_standby()?;
                    tokio::time::sleep(lag).await;
                } else {
                    tokio::time::sleep(at).await;
                }
                server.disrupt(down_for, lag_for.is_some()).await?;
                Ok::<bool, String>(true)
            };
            let ends = async {
                let mut ends = Vec::new();
                while let Some(joined) = tasks.join_next().await {
                    ends.push(joined.map_err(|e| format!("worker task: {e}"))?);
                }
                Ok::<_, String>(ends)
            };
            let (restarted, ends) = tokio::join!(restart, ends);
            if restarted? {
                if failover {
                    summary.failovers += 1;
                    self.failovers += 1;
                    summary.lagged_failovers += u64::from(lag_for.is_some());
                } else {
                    summary.db_restarts += 1;
                }
                // Calls in flight fail closed; their recovery may park an
                // at_most_once attempt.
                self.interrupted += 1;
            }
            let mut ends = ends?;
            ends.sort_by_key(|e| e.0);
            let mut parked = false;
            let mut all_alone = true;
            for (i, plan, end, status, stderr) in ends {
                summary.incarnations += 1;
                all_alone &= matches!(plan, Plan::Alone);
                let end = end?;
                history.push(format!("wave {wave} w{i} {plan:?} -> {end:?}"));
                let text = std::fs::read_to_string(&status).unwrap_or_default();
                let err = std::fs::read_to_string(&stderr).unwrap_or_default();
                if text.lines().any(|l| l.starts_with("OPENED")) {
                    summary.journal_opens += 1;
                }
                if matches!(plan, Plan::Pause(_)) {
                    summary.pauses += 1;
                    // Its calls may have been taken over mid-flight, or
                    // time out when it wakes.
                    self.interrupted += 1;
                    self.paused += 1;
                }
                match end {
                    End::Signal(9) => {
                        summary.kills += 1;
                        self.interrupted += 1;
                        match plan {
                            Plan::Crash(_) => summary.crashpoint_kills += 1,
                            _ => summary.random_kills += 1,
                        }
                        last_death = Some(Instant::now());
                    }
                    End::Exited(EXIT_DONE) => {
                        let (done, p) = parse_done(&text).ok_or_else(|| {
                            format!("worker w{i} exited 0 without a DONE line: {text}\n{err}")
                        })?;
                        parked |= p > 0;
                        finished |= done == self.config.workflows;
                    }
                    other => {
                        return Err(format!(
                            "worker w{i} of wave {wave} ended {other:?} (plan {plan:?}):\n{text}\n{err}\nhistory: {}",
                            history.join("; ")
                        ))
                    }
                }
            }
            if span.is_none() && all_alone {
                *span = Some(began.elapsed());
            }
            if parked {
                self.resolutions += self
                    .operate(&journal, &providers, last_death, summary)
                    .await
                    .map_err(|e| format!("{e}\nhistory: {}", history.join("; ")))?;
            }
            if finished {
                break;
            }
        }
        if !finished {
            return Err(format!(
                "orders still unfinished after {max_waves} waves; history: {}",
                history.join("; ")
            ));
        }
        summary.workflows += self.config.workflows;
        summary.operations += self.config.workflows * EFFECT_TOOLS.len() as u64;
        let checked = self.check(&journal, &providers, summary).await;
        for p in [
            providers.payments().faults().stats(),
            providers.email().faults().stats(),
            providers.tickets().faults().stats(),
            providers.wire().faults().stats(),
        ] {
            summary.faults += p.values().sum::<u64>();
        }
        providers.shutdown().await;
        if checked.is_ok() {
            // A long run makes hundreds of databases; only a failed round's
            // is kept for a post-mortem.
            let _ = server.drop_database(&url);
        }
        checked.map_err(|problems| {
            format!(
                "{problems}\ndatabase {url} (kept until the run ends)\nhistory: {}",
                history.join("; ")
            )
        })
    }
}

/// Sees one worker through its plan to its end.
async fn drive(
    mut child: tokio::process::Child,
    plan: &Plan,
    lease: Duration,
) -> Result<End, String> {
    let deadline = WORKER_DEADLINE + Duration::from_secs(5);
    let status = match plan {
        Plan::KillAfter(delay) => {
            tokio::select! {
                status = child.wait() => Some(status),
                () = tokio::time::sleep(*delay) => {
                    let _ = child.start_kill();
                    Some(child.wait().await)
                }
            }
        }
        Plan::Pause(delay) => {
            tokio::select! {
                status = child.wait() => Some(status),
                () = tokio::time::sleep(*delay) => {
                    if let Some(pid) = child.id() {
                        signal(pid, "STOP");
                        tokio::time::sleep(lease * 2 + Duration::from_millis(200)).await;
                        signal(pid, "CONT");
                    }
                    tokio::time::timeout(deadline, child.wait()).await.ok()
                }
            }
        }
        _ => tokio::time::timeout(deadline, child.wait()).await.ok(),
    };
    let Some(status) = status else {
        let _ = child.kill().await;
        return Ok(End::Watchdog);
    };
    let status = status.map_err(|e| format!("wait for worker: {e}"))?;
    use std::os::unix::process::ExitStatusExt;
    if let Some(signal) = status.signal() {
        return Ok(End::Signal(signal));
    }
    Ok(End::Exited(status.code().unwrap_or(-1)))
}

/// `kill -SIG pid`.
fn signal(pid: u32, sig: &str) {
    let _ = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status();
}
