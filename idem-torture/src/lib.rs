//! The torture harness: worker processes run the order workflow of
//! `agent/shop.rs` against the testkit providers and are SIGKILLed at random
//! instants and at the worst instrumented moments, over and over, with and
//! without provider faults; after every round the providers' own ledgers,
//! the journal's escalations and its audit stream must agree that every
//! effect happened exactly once.
//!
//! Shared by `cargo run --release --example torture` and tests/torture.rs.
//! The caller supplies the command that starts a worker (its own binary,
//! re-executed); the worker side is [`worker_main`].
//!
//! One *round* = fresh providers, a fresh journal, `workflows` orders each
//! with its own root run id. Worker incarnations run all unfinished orders
//! (finished steps replay from the journal) until one finishes them all.
//! Each incarnation gets a plan, drawn from the seeded generator:
//! - killed by the parent (SIGKILL) after a uniform random delay in
//!   `[0, span]`, `span` being how long a clean first incarnation took, so
//!   kills fall anywhere, including before the journal is open;
//! - killed by itself at an instrumented point: right after the n-th effect
//!   of a tool landed (COMMIT not written: the worst moment), right before
//!   the n-th request went out (INTENT durable, nothing sent), or, for a
//!   tool with `commit = "eventual"`, right after the n-th call whose effect
//!   landed in this process returned its result (COMMIT written, not yet
//!   durable; see "Eventual commits" below);
//! - left alone, so rounds end.
//!
//! In the single-worker modes every order is first shipped as the shop's
//! saga (`sagas.rs`): a courier, a charge and a supplier payment that
//! needs a person's approval above 30 EUR; the supplier's bank refuses odd
//! orders and the harness's operator rejects some approvals, through the
//! worker's admin API while workers die, so that about half of the sagas
//! roll back (refund, cancellation).
//!
//! Coverage is planned, not left to chance: the first fault-free round
//! after the span is measured starts with a chain of twenty incarnations,
//! each running one order at a time and dying at the first occurrence of
//! the next instrumented point in workflow order (`book_courier:sending`,
//! `book_courier:returned`, `book_courier:landed`, `pay:sending`, ...,
//! `cancel_courier:landed`, `charge:sending`, `charge:landed`, ...,
//! `refund_wire:landed`; the multi-worker mode has no chain and no saga). Each is certain to be
//! reached, since the incarnation before died at the previous point,
//! before any order got past this one; a point not reached all the same (a violation stopped
//! the round) is planned again, and rounds go on past the kill target
//! until every point was hit ([`Summary::crashpoint_hits`]). At
//! `charge:landed` the charge's key is also made to outlive the provider's
//! dedupe window: the clock (the providers' and the later workers', not
//! the harness's) jumps past the window, so the payments provider has
//! forgotten the key and a re-sent charge would charge twice; idem must
//! escalate instead.
//!
//! Between incarnations the harness plays the operator: it waits until the
//! providers have handled every request a dead worker had sent, opens the
//! journal, reads `escalations()`, checks the provider's ledger for each
//! one and answers `resolve(key, Landed(result) | Reissue, note)`. Before
//! answering, it checks that the faults and kills of the round justify the
//! escalation (`Round::justify`): an at_most_once tool after a kill
//! mid-call or an ambiguous outcome (no more of those than the provider
//! injected faults), a provider-class tool only once its retry budget or
//! the provider's dedupe window is spent, a journal tool only when verify
//! could not tell (no more than its provider injected faults). Any other
//! escalation is a violation: settling it from the ledger would hide an
//! engine that escalates instead of deciding.
//!
//! After a round: per order and tool, the provider ledger must hold exactly
//! one effect (more is a duplicate, none is lost), found by business
//! identity (order, recipient, reference), not by idempotency key, so that
//! a key that changed across restarts would show up as a duplicate; the
//! journal must reopen, hold no open escalation, and its audit stream must
//! show exactly one commit (or operator `landed`) per operation and one
//! resolution per escalation; and running every workflow once more must
//! replay everything without a single provider request.
//!
//! Power-cut mode ([`Config::power_cuts`]): the journal lives on
//! idem-testkit's `PowerCutFs`; every kill is also a power cut (the parent's
//! kill powers the disk off first; a worker that killed itself at a crash
//! point is followed by a cut), and each round ends with one more cut after
//! its last worker exited. Each order also ends with [`archive_order`], a
//! result large enough for sled to store as a blob file, which must replay
//! intact. A journal that does not open after a cut is acceptable only if
//! it refused with a clear error and had acknowledged nothing (workers log
//! each acknowledged INTENT to their status files, outside the cut disk);
//! one that opens empty after acknowledging something is `forgotten`; both
//! otherwise count as lost.
//!
//! **Eventual commits.** The saga's `book_courier` (journal class) and
//! `pay` (provider class) say `commit = "eventual"`: their COMMITTED record
//! is written at `Durability::Eventual` and becomes durable with the next
//! barrier (the next step's INTENT, another order's, or the journal's
//! timer), so a kill or a cut right after such a call returned may lose it.
//! Both run for every order of every single-worker round. Besides
//! `sending` and `landed`, each has a third point, `returned`: right after
//! a call whose effect landed in this process (so this process wrote its
//! COMMITTED record) returned its result to the saga's body. It is in the
//! coverage chain, where a death there loses the COMMIT for certain (one
//! order at a time, and the worker's journal told to leave eventual writes
//! to the next barrier rather than a timer, so nothing makes the record
//! durable before the kill), and in the random plans.
//!
//! A lost COMMIT is told from evidence, not from timing:
//! - every worker logs, unbuffered and outside the killed or cut disk, who
//!   it is in the audit stream (`OPENED ... owner=worker#incarnation`) and
//!   each result a step of the saga returned to the saga's body, before
//!   the body goes on (`RETURNED tool order fresh json`, `fresh` when the
//!   effect landed in this process);
//! - a COMMITTED record and its `Committed` audit event are one log unit of
//!   the journal, durable together or not at all; a round's audit stream
//!   must end with exactly one commit per operation (checked above), and
//!   the event's `worker` names the process that wrote it;
//! - the harness knows in which order processes opened the round's
//!   journal (its workers, and itself as the operator).
//!
//! So a process that was given a result lost that result's commit exactly
//! when the surviving commit was written by a process after it. If the
//! process was `fresh` (it wrote the record, at Eventual), that is a lost
//! COMMIT (`lost_commits`); if the result was replayed from the journal or
//! committed from verify's answer (at Immediate), it is a violation: a
//! durable commit was lost. A lost COMMIT is `recovered` when a `Recovered`
//! event of a later process shows that it found the operation unfinished
//! (the INTENT), the journal holds the result the caller had been given
//! (`Runtime::operation`), and the provider's ledger one effect (by
//! business identity); anything else is a violation, and [`Summary::ok`]
//! needs `recovered == lost_commits`. Every other result a saga's body was
//! given must also be the one the journal holds after the round
//! (`results_changed`).
//!
//! The seed fixes every plan: which incarnation of which round is killed
//! how (the random kill instants as fractions of the measured span), the
//! planned crash points and the fault mixes; rerun with
//! `IDEM_TORTURE_SEED`. Process timing is not reproducible, so a failing
//! seed replays the plan, not every interleaving.

#![warn(missing_docs)]

use std::collections::BTreeMap;
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::{Class, Error, Escalation, EventKind, Resolution, Runtime, ToolError};
use idem_testkit::powercut::{PowerCutFs, Survival};
use idem_testkit::{
    Chaos, Charge, ChargeOutcome, Clock, ProviderAddrs, Providers, ProvidersConfig, SplitMix64,
};

use crate::shop::{Moment, Shop, EFFECT_TOOLS, SAGA_TOOLS};

/// The demo's shop (examples/agent/shop.rs): the tools the harness runs.
/// Compiled here once; the torture example and tests use it from here
/// (a binary that also compiled its own copy would define every tool twice).
#[path = "../../examples/agent/shop.rs"]
pub mod shop;

// The multi-worker mode on PostgreSQL: [`Config::backend`].
mod multi;

// The saga workflow and the approvals of the single-worker modes.
mod sagas;

/// Set in a worker's environment (to anything).
pub const WORKER_ENV: &str = "IDEM_TORTURE_WORKER";
const JOURNAL_ENV: &str = "IDEM_TORTURE_JOURNAL";
const STATUS_ENV: &str = "IDEM_TORTURE_STATUS";
const ORDERS_ENV: &str = "IDEM_TORTURE_ORDERS";
const PREFIX_ENV: &str = "IDEM_TORTURE_PREFIX";
const CONCURRENCY_ENV: &str = "IDEM_TORTURE_CONCURRENCY";
const CRASH_ENV: &str = "IDEM_TORTURE_CRASH";
/// Multi-worker mode: the PostgreSQL journal's URL, this worker's id and
/// its lease in ms.
const POSTGRES_ENV: &str = "IDEM_TORTURE_POSTGRES";
const WORKER_ID_ENV: &str = "IDEM_TORTURE_WORKER_ID";
const LEASE_ENV: &str = "IDEM_TORTURE_LEASE_MS";
/// Multi-worker mode: set when the URL leads to a pooler.
const POOLER_ENV: &str = "IDEM_TORTURE_POOLER";
/// Multi-worker failover mode: set when the worker must expect a
/// synchronous standby (`PostgresOptions::synchronous_standby(true)`).
const SYNC_STANDBY_ENV: &str = "IDEM_TORTURE_SYNC_STANDBY";
/// Set (power-cut mode): each order ends with [`archive_order`].
const ARCHIVE_ENV: &str = "IDEM_TORTURE_ARCHIVE";
/// Power-cut mode: a directory where the durable state of every journal
/// that did not reopen is kept, with its violation, for a post-mortem.
pub const KEEP_DAMAGED_ENV: &str = "IDEM_TORTURE_KEEP_DAMAGED";
/// How far (ms) the worker's clock runs ahead of the system clock: the
/// dedupe-window round's jump (see [`ShiftedClock`]).
const CLOCK_SHIFT_ENV: &str = "IDEM_TORTURE_CLOCK_SHIFT_MS";

/// Set (to anything) in a worker planned to die at an [`At::Returned`]
/// point of the coverage chain: its journal makes eventual writes durable
/// only at the next barrier of an immediate write, never on the timer
/// ([`LATE_EVENTUAL_DELAY`]), so that the COMMITTED record written just
/// before the planned death is certainly lost. (Otherwise a timer that
/// fired a few microseconds earlier could still flush it, once in
/// thousands of runs.) The random plans keep the journal's default.
const LATE_EVENTUAL_ENV: &str = "IDEM_TORTURE_LATE_EVENTUAL";

/// The eventual delay under [`LATE_EVENTUAL_ENV`]: longer than a worker
/// may live.
const LATE_EVENTUAL_DELAY: Duration = Duration::from_secs(600);

/// Power-cut mode: the workers' checkpoint interval (see
/// [`open_worker_journal`]).
const POWER_CUT_CHECKPOINT_BYTES: u64 = 64 << 10;

/// The size of [`archive_order`]'s result: over sled 0.34's 128 KiB
/// threshold, so the journal stores it in one of sled's blob files (a file
/// and a directory entry of their own, which a power cut may take).
const ARCHIVE_BYTES: usize = 160 << 10;

/// Times [`archive_order`]'s body ran in this process.
static ARCHIVE_RUNS: AtomicU64 = AtomicU64::new(0);

/// An archive that cannot fail (the error type a tool needs).
#[derive(Debug)]
pub struct NeverFails;

impl std::fmt::Display for NeverFails {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("never")
    }
}

impl idem::Classify for NeverFails {
    fn classify(&self) -> idem::Failure {
        idem::Failure::Semantic
    }
}

/// Power-cut mode's last step of an order: a large, deterministic result,
/// journaled like any other. Running it again is harmless (`provider`
/// class, no effect), but once a call returned, the result must come back
/// from the journal, byte for byte, without the body running again.
#[idem::tool(class = "provider", key = "order_id")]
pub async fn archive_order(ctx: &idem::Ctx, order_id: u64) -> Result<String, NeverFails> {
    let _ = ctx;
    ARCHIVE_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(archive_body(order_id))
}

/// What [`archive_order`] returns for an order: hex digits of a seeded
/// sequence (incompressible enough that sled cannot make it small).
fn archive_body(order_id: u64) -> String {
    let mut rng = SplitMix64::new(order_id);
    let mut out = String::with_capacity(ARCHIVE_BYTES);
    while out.len() < ARCHIVE_BYTES {
        out.push_str(&format!("{:016x}", rng.next_u64()));
    }
    out
}

/// Worker exit codes.
const EXIT_DONE: i32 = 0;
const EXIT_FATAL: i32 = 2;
const EXIT_OPEN_FAILED: i32 = 3;

/// Longest a worker may live. A healthy one needs well under a second per
/// order even with faults; this only turns a hang into a reported failure.
const WORKER_DEADLINE: Duration = Duration::from_secs(60);

/// Longest chaos processing delay.
const CHAOS_MAX_DELAY: Duration = Duration::from_millis(30);

/// Failing rounds whose directory is kept for a post-mortem.
const KEEP_AT_MOST: usize = 3;

/// Whether this process was started as a torture worker.
pub fn is_worker() -> bool {
    std::env::var_os(WORKER_ENV).is_some()
}

// ===========================================================================
// Configuration and results

/// When providers inject random faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChaosMode {
    /// Never: the providers answer every request.
    Never,
    /// Every other round (odd rounds), half of those with faults on
    /// look-ups (verify) too.
    Alternate,
    /// Every round.
    Always,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Config {
    /// Seed of every random choice (kill instants, crash points, faults).
    pub seed: u64,
    /// Rounds continue until at least this many workers were killed.
    pub kills: u64,
    /// Orders (workflow runs) per round.
    pub workflows: u64,
    /// Orders a worker processes at once.
    pub concurrency: usize,
    /// Hard bound on rounds, whatever the kill count.
    pub max_rounds: u64,
    /// Hard bound on worker incarnations per round.
    pub max_incarnations: u32,
    /// Hard bound on the whole run: reaching it before the kill target is
    /// a violation (something made progress too slow to trust).
    pub max_elapsed: Duration,
    /// When the providers inject random faults.
    pub chaos: ChaosMode,
    /// Print a progress line every this many rounds (0: never).
    pub progress_every: u64,
    /// Stop at the first round with a violation (its journal is kept for
    /// inspection); otherwise count and go on.
    pub stop_on_violation: bool,
    /// Power-cut mode when above zero: the journal lives on a
    /// [`PowerCutFs`], every kill is also a power cut, and rounds continue
    /// until this many cuts happened (`kills` is then ignored).
    pub power_cuts: u64,
    /// Power-cut mode, diagnostic: before a round's first worker, the
    /// harness creates the journal (opens and closes it) and fsyncs every
    /// file and directory it consists of, and their parent, as a journal
    /// whose creation is power-safe would itself. Off by default (the
    /// journal is tested as users create it); on, the failures that remain
    /// are those of a running journal.
    pub sync_new_journal: bool,
    /// Where the journal lives: sled (one worker at a time), or one
    /// PostgreSQL database that `workers` worker processes share at once
    /// (the multi-worker mode, see `multi.rs`).
    pub backend: Backend,
    /// Multi-worker mode: worker processes racing the same orders.
    pub workers: usize,
    /// Multi-worker mode: on average one wave in this many restarts the
    /// database server mid-wave (`pg_ctl stop -m immediate`, then start).
    pub db_restart_every: u64,
    /// Multi-worker mode: the workers' lease.
    pub lease: Duration,
    /// Multi-worker mode: after the first wave, every worker is paused past
    /// its lease (the stale-owner test) instead of a random plan.
    pub pauses_only: bool,
    /// Multi-worker mode: the workers reach the database through a
    /// pgbouncer in transaction pooling mode (`idem_testkit::pgbouncer`,
    /// one per round), with `PostgresOptions::pooler(true)`; the parent's
    /// checks read the database directly.
    pub pooler: bool,
    /// Multi-worker mode: the round's database lives on a primary with a
    /// synchronous standby (`idem_testkit::pg_replica::PgPair`), the
    /// workers connect with the pair's multi-host URL and
    /// `PostgresOptions::synchronous_standby(true)`, and where the plain
    /// mode restarts the server a wave *fails over* instead: the primary
    /// is stopped (`-m immediate`), the standby promoted, and a new
    /// synchronous standby made of it while the workers run on (see
    /// `multi.rs`). Not with [`Config::pooler`].
    pub failover: bool,
}

/// The journal backend of a torture run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// One worker process at a time, on the embedded journal.
    Sled,
    /// Several worker processes sharing a PostgreSQL journal.
    Postgres,
}

impl Config {
    /// Settings for `kills` kills; the seed from `IDEM_TORTURE_SEED` if set
    /// (decimal or 0x-hex), else from the clock.
    pub fn new(kills: u64) -> Config {
        Config {
            seed: seed_from_env().unwrap_or_else(clock_seed),
            kills,
            workflows: 6,
            concurrency: 3,
            max_rounds: 10_000,
            max_incarnations: 200,
            max_elapsed: Duration::from_secs(3600),
            chaos: ChaosMode::Alternate,
            progress_every: 0,
            stop_on_violation: true,
            power_cuts: 0,
            sync_new_journal: false,
            backend: Backend::Sled,
            workers: 1,
            db_restart_every: 6,
            lease: Duration::from_millis(1000),
            pauses_only: false,
            pooler: false,
            failover: false,
        }
    }

    /// Settings for a multi-worker run on PostgreSQL: `workers` processes,
    /// `kills` kills.
    pub fn multi_worker(kills: u64, workers: usize) -> Config {
        Config {
            backend: Backend::Postgres,
            workers: workers.max(1),
            ..Config::new(kills)
        }
    }

    /// [`Config::multi_worker`] in failover mode ([`Config::failover`]):
    /// failovers of a primary with a synchronous standby where the plain
    /// mode restarts the database server.
    pub fn multi_worker_failover(kills: u64, workers: usize) -> Config {
        Config {
            failover: true,
            ..Config::multi_worker(kills, workers)
        }
    }

    fn multi_worker_mode(&self) -> bool {
        self.backend == Backend::Postgres
    }

    /// Settings for a power-cut run of `cuts` cuts.
    pub fn power_cuts(cuts: u64) -> Config {
        Config {
            power_cuts: cuts,
            ..Config::new(0)
        }
    }

    fn power_cut_mode(&self) -> bool {
        self.power_cuts > 0
    }
}

/// Parses a seed written in decimal or as `0x…` hex.
pub fn parse_seed(text: &str) -> Option<u64> {
    let t = text.trim();
    match t.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => t.parse().ok(),
    }
}

fn seed_from_env() -> Option<u64> {
    std::env::var("IDEM_TORTURE_SEED")
        .ok()
        .and_then(|s| parse_seed(&s))
}

fn clock_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    SplitMix64::new(nanos ^ u64::from(std::process::id())).next_u64()
}

/// What a harness run did and found.
#[derive(Debug, Default, Clone)]
pub struct Summary {
    /// The seed the run was planned from.
    pub seed: u64,
    /// Rounds finished.
    pub rounds: u64,
    /// Rounds with provider faults on.
    pub chaos_rounds: u64,
    /// Orders processed, over every round.
    pub workflows: u64,
    /// Effects the providers' ledgers hold at the end of the finished
    /// rounds, every record counted (four per workflow, plus
    /// `saga_effects_expected`, if nothing was duplicated or lost): counted
    /// by the providers, not by the harness.
    pub operations: u64,
    /// `Committed` events (or operator `landed`s) of the effect tools in the
    /// finished rounds' audit streams (four per workflow).
    pub audited_commits: u64,
    /// Worker processes started.
    pub incarnations: u64,
    /// Workers that died by SIGKILL: `random_kills + crashpoint_kills`.
    pub kills: u64,
    /// SIGKILLs at a random instant.
    pub random_kills: u64,
    /// Workers that killed themselves at an instrumented point.
    pub crashpoint_kills: u64,
    /// Workers that died at each instrumented point, `tool:moment`
    /// (`sending`, `landed`, or `returned` for the eventual-commit tools);
    /// every one of the twenty is planned.
    pub crashpoint_hits: BTreeMap<String, u64>,
    /// Rounds whose clock jumped past the charge's dedupe window after a
    /// charge landed unacknowledged.
    pub window_jumps: u64,
    /// Workers that opened the journal (all of them after the first of a
    /// round opened it after a kill or an exit).
    pub journal_opens: u64,
    /// Logical operations applied more than once (extra applications).
    pub duplicates: u64,
    /// Logical operations applied zero times although their workflow
    /// completed, or that the journal did not know as committed.
    pub lost: u64,
    /// Committed operations whose commit (a `Committed` event or an
    /// operator's `landed`) is missing from the durable audit stream.
    pub audit_gaps: u64,
    /// Escalations raised, per tool, and how the operator answered.
    pub escalations: BTreeMap<String, u64>,
    /// What justified them, `tool: why` (see `Round::justify`); an
    /// escalation nothing justifies is a violation instead.
    pub justified: BTreeMap<String, u64>,
    /// Escalations the operator answered `landed`.
    pub resolved_landed: u64,
    /// Escalations the operator answered `reissue`.
    pub resolved_reissue: u64,
    /// Faults the providers injected.
    pub faults: u64,
    /// From the audit streams.
    pub recoveries: u64,
    /// Verify answers, from the audit streams.
    pub verifications: u64,
    /// Answers the providers replayed, from the audit streams.
    pub provider_replays: u64,
    /// Calls answered from the journal, from the audit streams.
    pub dedupe_hits: u64,
    /// Retries, from the audit streams.
    pub retries: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Everything that went wrong, with the evidence.
    pub violations: Vec<String>,
    /// The incarnations of the last single-worker round (plan, end, and
    /// what its worker reported), for post-mortems; not printed.
    pub last_round: Vec<String>,
    /// Power-cut mode: the run cut the power (the counts below are zero
    /// otherwise).
    pub power_cut_mode: bool,
    /// Cuts: `random_cuts + crashpoint_cuts + exit_cuts`.
    pub power_cuts: u64,
    /// At a random instant (the parent's SIGKILL).
    pub random_cuts: u64,
    /// Right after a worker killed itself at an instrumented point.
    pub crashpoint_cuts: u64,
    /// After the last worker of a round exited cleanly, before the checks:
    /// what it was told is done must survive.
    pub exit_cuts: u64,
    /// Cuts that kept a seeded prefix of the unsynced writes (the others
    /// kept nothing unsynced).
    pub prefix_cuts: u64,
    /// Unsynced file writes and truncations the cuts dropped or tore.
    pub writes_dropped: u64,
    /// Unsynced writes the cuts kept only part of.
    pub writes_torn: u64,
    /// Unsynced directory changes the cuts undid.
    pub entries_undone: u64,
    /// Opens after a cut that refused with a clear error while nothing
    /// acknowledged was in the journal: acceptable (the round starts over
    /// on a fresh journal).
    pub refused_opens: u64,
    /// Opens after a cut that failed otherwise: refused although the journal
    /// had acknowledged operations (each also counted in `lost`), or died
    /// without a clear error.
    pub reopen_failures: u64,
    /// Journals that opened after a cut as if new although they had
    /// acknowledged operations (each also counted in `lost`).
    pub forgotten: u64,
    /// Large results (sled blobs) that replayed intact after the round's
    /// last cut.
    pub large_results: u64,
    /// Opens after a cut that found sled's files damaged and rebuilt them
    /// from the journal's image and log (each leaves a `sled-damaged.*`
    /// directory, counted at the round's end).
    pub repairs: u64,
    /// Multi-worker mode: the number of worker processes (0: one at a
    /// time, on sled).
    pub workers: usize,
    /// Multi-worker mode: restarts of the database server mid-wave.
    pub db_restarts: u64,
    /// Multi-worker failover mode: failovers mid-wave (the primary
    /// stopped `-m immediate`, its synchronous standby promoted, a new
    /// standby made of it).
    pub failovers: u64,
    /// Multi-worker failover mode: failovers whose standby had been
    /// stopped (was lagging) since a random instant before them.
    pub lagged_failovers: u64,
    /// Multi-worker mode: workers paused (SIGSTOP) past their lease, then
    /// continued (SIGCONT) after others could take their calls over.
    pub pauses: u64,
    /// Single-worker modes: orders shipped as the shop's saga after their
    /// order workflow (one per workflow).
    pub sagas: u64,
    /// Sagas that completed (the supplier was paid).
    pub sagas_completed: u64,
    /// Sagas that rolled back: the supplier's bank refused, or the
    /// operator rejected the payment.
    pub sagas_compensated: u64,
    /// Effects of the sagas' tools in the providers' ledgers (couriers,
    /// charges, supplier wires, refunds, cancellations).
    pub saga_effects: u64,
    /// What the sagas' ends call for, per order fixed by its number.
    pub saga_effects_expected: u64,
    /// `Committed` events of the sagas' tools in the audit streams.
    pub saga_audited_commits: u64,
    /// Compensations a rolled-back saga never ran (each also counted in
    /// `lost`).
    pub missed_compensations: u64,
    /// `ApprovalRequested` events in the audit streams.
    pub approvals_requested: u64,
    /// Approvals the harness's operator gave through the admin API (and
    /// the API acknowledged).
    pub approved: u64,
    /// Rejections it gave.
    pub rejected: u64,
    /// Decisions the API answered "not awaiting approval": an earlier
    /// request of the operator had decided it, its answer cut off by a kill.
    pub approvals_unanswered: u64,
    /// Single-worker modes: results of calls of a tool with `commit =
    /// "eventual"` (the saga's `book_courier` and `pay`) given to the
    /// saga's body by the process whose COMMITTED record it was (the effect
    /// landed there), counted once per process and operation.
    pub eventual_returns: u64,
    /// Of those, the ones whose COMMITTED record did not survive the kill
    /// or power cut: a later process wrote the operation's commit (see the
    /// module's documentation for how this is told).
    pub lost_commits: u64,
    /// `lost_commits` per tool.
    pub lost_commits_by_tool: BTreeMap<String, u64>,
    /// Lost commits that were recovered: a later process found the
    /// operation unfinished, the journal holds the result the caller had
    /// been given, and the provider's ledger one effect. Anything else is a
    /// violation, and `ok()` needs `recovered_commits == lost_commits`.
    pub recovered_commits: u64,
    /// `recovered_commits` per `tool:via` (how the commit was recovered:
    /// `call` when re-sent, `verify`, or `operator`).
    pub recovered_via: BTreeMap<String, u64>,
    /// Results given to a saga's body that differ from what the journal
    /// holds after the round (each also a violation).
    pub changed_results: u64,
    /// Approvals asked again under a new generation of the key: an approved
    /// supplier payment the bank refused, paid again by a saga body run
    /// again before the saga had stored its rollback (a refusal ends a
    /// decision; the next call is a new one, and a person decides it).
    pub approvals_of_new_generations: u64,
}

impl Summary {
    /// Escalations raised, over every tool.
    pub fn escalation_total(&self) -> u64 {
        self.escalations.values().sum()
    }

    /// True when every check held.
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
            && self.duplicates == 0
            && self.lost == 0
            && self.audit_gaps == 0
            && self.reopen_failures == 0
            && self.missed_compensations == 0
            && self.lost_commits == self.recovered_commits
            && self.changed_results == 0
    }

    /// The progress the run is measured by: cuts or kills.
    fn progress(&self) -> u64 {
        if self.power_cut_mode {
            self.power_cuts
        } else {
            self.kills
        }
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.power_cut_mode {
            return self.fmt_power_cuts(f);
        }
        let per_tool: Vec<String> = self
            .escalations
            .iter()
            .map(|(t, n)| format!("{t}={n}"))
            .collect();
        write!(
            f,
            "torture summary: seed={:#x} kills={} (random={} crashpoint={}) operations={} \
             audited_commits={} duplicates={} lost={}{} escalations={} ({}; landed={} \
             reissued={}; justified: {}) crashpoints hit: {} window_jumps={} \
             audit_gaps={} violations={} workflows={} rounds={} (chaos={}) incarnations={} \
             journal_reopens={} faults={} recoveries={} verifications={} provider_replays={} \
             elapsed={:.1}s",
            self.seed,
            self.kills,
            self.random_kills,
            self.crashpoint_kills,
            self.operations,
            self.audited_commits,
            self.duplicates,
            self.lost,
            self.eventual_text(),
            self.escalation_total(),
            if per_tool.is_empty() {
                "none".to_string()
            } else {
                per_tool.join(" ")
            },
            self.resolved_landed,
            self.resolved_reissue,
            counts_text(&self.justified),
            counts_text(&self.crashpoint_hits),
            self.window_jumps,
            self.audit_gaps,
            self.violations.len(),
            self.workflows,
            self.rounds,
            self.chaos_rounds,
            self.incarnations,
            self.journal_opens,
            self.faults,
            self.recoveries,
            self.verifications,
            self.provider_replays,
            self.elapsed.as_secs_f64()
        )?;
        self.fmt_sagas(f)?;
        if self.workers > 0 {
            write!(
                f,
                " backend=postgres workers={} db_restarts={} failovers={} (lagging standby={}) \
                 pauses={}",
                self.workers, self.db_restarts, self.failovers, self.lagged_failovers, self.pauses
            )?;
        }
        Ok(())
    }
}

/// `a=1 b=2`, or `none`.
fn counts_text(counts: &BTreeMap<String, u64>) -> String {
    if counts.is_empty() {
        return "none".into();
    }
    let parts: Vec<String> = counts.iter().map(|(k, n)| format!("{k}={n}")).collect();
    parts.join(" ")
}

impl Summary {
    /// ` lost_commits=N (per tool) recovered=M (per tool:via)
    /// eventual_returns=R results_changed=C`, in the single-worker modes
    /// (whose sagas call the eventual-commit tools); empty otherwise.
    fn eventual_text(&self) -> String {
        if self.workers > 0 {
            return String::new();
        }
        format!(
            " lost_commits={} ({}) recovered={} ({}) eventual_returns={} results_changed={}",
            self.lost_commits,
            counts_text(&self.lost_commits_by_tool),
            self.recovered_commits,
            counts_text(&self.recovered_via),
            self.eventual_returns,
            self.changed_results
        )
    }

    /// Instrumented points (`tool:moment`) no worker has died at yet.
    pub fn crashpoints_missed(&self) -> Vec<String> {
        all_crash_points()
            .into_iter()
            .map(|p| p.label())
            .filter(|l| !self.crashpoint_hits.contains_key(l))
            .collect()
    }

    fn per_tool(&self) -> String {
        let per_tool: Vec<String> = self
            .escalations
            .iter()
            .map(|(t, n)| format!("{t}={n}"))
            .collect();
        if per_tool.is_empty() {
            "none".to_string()
        } else {
            per_tool.join(" ")
        }
    }

    fn fmt_power_cuts(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "power-cut summary: seed={:#x} power_cuts={} duplicates={} lost={}{} \
             reopen_failures={} refused_opens={} repairs={} forgotten={} audit_gaps={} \
             large_results={} violations={} \
             (cuts: random={} crashpoint={} after_exit={} prefix_kept={}; \
             writes_dropped={} writes_torn={} entries_undone={}) operations={} audited_commits={} \
             escalations={} ({}; landed={} reissued={}; justified: {}) crashpoints hit: {} \
             window_jumps={} workflows={} rounds={} (chaos={}) \
             incarnations={} journal_reopens={} faults={} recoveries={} verifications={} \
             provider_replays={} elapsed={:.1}s",
            self.seed,
            self.power_cuts,
            self.duplicates,
            self.lost,
            self.eventual_text(),
            self.reopen_failures,
            self.refused_opens,
            self.repairs,
            self.forgotten,
            self.audit_gaps,
            self.large_results,
            self.violations.len(),
            self.random_cuts,
            self.crashpoint_cuts,
            self.exit_cuts,
            self.prefix_cuts,
            self.writes_dropped,
            self.writes_torn,
            self.entries_undone,
            self.operations,
            self.audited_commits,
            self.escalation_total(),
            self.per_tool(),
            self.resolved_landed,
            self.resolved_reissue,
            counts_text(&self.justified),
            counts_text(&self.crashpoint_hits),
            self.window_jumps,
            self.workflows,
            self.rounds,
            self.chaos_rounds,
            self.incarnations,
            self.journal_opens,
            self.faults,
            self.recoveries,
            self.verifications,
            self.provider_replays,
            self.elapsed.as_secs_f64()
        )?;
        self.fmt_sagas(f)
    }

    /// The sagas and approvals, when the run had them.
    fn fmt_sagas(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.sagas == 0 {
            return Ok(());
        }
        write!(
            f,
            " sagas={} (completed={} compensated={}) saga_effects={} (expected {}) \
             saga_audited_commits={} missed_compensations={} approvals: requested={} \
             approved={} rejected={} answer_lost_to_kill={} new_generations={}",
            self.sagas,
            self.sagas_completed,
            self.sagas_compensated,
            self.saga_effects,
            self.saga_effects_expected,
            self.saga_audited_commits,
            self.missed_compensations,
            self.approvals_requested,
            self.approved,
            self.rejected,
            self.approvals_unanswered,
            self.approvals_of_new_generations
        )
    }
}

// ===========================================================================
// The worker

/// Which instrumented point a worker dies at.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CrashPoint {
    tool: String,
    moment: At,
    /// Die at the n-th time this process reaches the point (1-based).
    nth: u64,
}

/// Where in a call a worker can die: at the shop's [`Moment`]s, or, for a
/// tool with `commit = "eventual"`, right after a call whose effect landed
/// in this process returned its result to the saga's body (its COMMITTED
/// record written at `Eventual`, not yet made durable).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    Sending,
    Landed,
    Returned,
}

impl From<Moment> for At {
    fn from(moment: Moment) -> At {
        match moment {
            Moment::Sending => At::Sending,
            Moment::Landed => At::Landed,
        }
    }
}

fn moment_name(moment: At) -> &'static str {
    match moment {
        At::Sending => "sending",
        At::Landed => "landed",
        At::Returned => "returned",
    }
}

/// Whether `tool`'s COMMITTED record is written at `Durability::Eventual`
/// (`commit = "eventual"`): then a worker's death right after the call
/// returned can lose it, and [`At::Returned`] is one of its points.
fn eventual_commit(tool: &str) -> bool {
    descriptor(tool).is_some_and(|t| t.commit == idem::journal::Durability::Eventual)
}

/// Every instrumented point, each at its first occurrence, in the order a
/// worker reaches them: the saga's (its steps, then its compensations),
/// then the order workflow's.
///
/// The saga comes first because the coverage chain ([`coverage_plan`])
/// parks an order at each kill of an at_most_once tool mid-call and at the
/// dedupe-window jump: after the order workflow's chain only two of a
/// round's six orders would be left, and whether one of them lands its
/// supplier payment (`pay_supplier:landed`) would depend on the round's
/// numbers. Shipping first, a kill at `pay_supplier:sending` parks one
/// order, and of the three even orders (their supplier's bank takes the
/// wire) at most one is rejected by the operator (orders divisible by
/// three), so one of the others lands it; the order workflow's points
/// then need three of the five orders not parked.
///
/// A tool with `commit = "eventual"` has `returned` between `sending` and
/// `landed`: after a death at `sending` nothing was sent, so in the chain
/// the call that returns next is the one whose request reaches the
/// provider first, and the result lost with its COMMIT is the provider's
/// first answer (at `landed` first, it would be the answer the provider
/// replays to the call sent again). Both are reachable either way: no
/// death at these points parks an order.
fn all_crash_points() -> Vec<CrashPoint> {
    SAGA_TOOLS
        .iter()
        .chain(EFFECT_TOOLS.iter())
        .flat_map(|tool| {
            let points: &[At] = match eventual_commit(tool) {
                true => &[At::Sending, At::Returned, At::Landed],
                false => &[At::Sending, At::Landed],
            };
            points.iter().map(|&moment| CrashPoint {
                tool: tool.to_string(),
                moment,
                nth: 1,
            })
        })
        .collect()
}

impl CrashPoint {
    fn to_env(&self) -> String {
        format!("{}:{}", self.label(), self.nth)
    }

    /// `tool:moment`, the key of [`Summary::crashpoint_hits`].
    fn label(&self) -> String {
        format!("{}:{}", self.tool, moment_name(self.moment))
    }

    fn from_env(text: &str) -> Option<CrashPoint> {
        let mut parts = text.split(':');
        let tool = parts.next()?.to_string();
        let moment = match parts.next()? {
            "sending" => At::Sending,
            "landed" => At::Landed,
            "returned" => At::Returned,
            _ => return None,
        };
        let nth = parts.next()?.parse().ok()?;
        Some(CrashPoint { tool, moment, nth })
    }
}

/// A worker process: runs every order of its range to completion or to an
/// escalation, writes its status file, exits 0. Exits 2 on anything the
/// harness must treat as a failure (a journal error, an impossible answer),
/// 3 if the journal does not open.
pub fn worker_main() -> i32 {
    shop::run_worker(WORKER_DEADLINE, EXIT_FATAL, worker())
}

fn env(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("{name} is not set"))
}

/// Appends one line to the status file, unbuffered: what was written before
/// a SIGKILL is there.
fn status_line(path: &Path, line: &str) {
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "{line}");
    }
}

/// A worker's instruments: the lines of its status file (outside the
/// journal's disk) that the parent judges it by, and the point it dies at.
struct Witness {
    status: PathBuf,
    crash: Option<CrashPoint>,
    /// Times this process reached its crash point.
    seen: AtomicU64,
    /// Calls of an eventual-commit tool, `(tool, order)`, whose effect
    /// landed in this process and whose result has not returned yet.
    landed: std::sync::Mutex<std::collections::BTreeSet<(&'static str, u64)>>,
}

impl Witness {
    /// The shop's hook: a request is about to go out, or its effect landed.
    fn at(&self, moment: Moment, tool: &'static str, order: u64) {
        match moment {
            // The INTENT of this operation is durable (acknowledged):
            // evidence, outside the journal, for judging an open that
            // fails after a power cut.
            Moment::Sending => status_line(&self.status, &format!("SENDING {tool} {order}")),
            Moment::Landed if eventual_commit(tool) => {
                self.landed
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert((tool, order));
            }
            Moment::Landed => {}
        }
        self.reached(moment.into(), tool);
    }

    /// A saga step's call returned its result to the saga's body (`order`:
    /// the shipped order's number, as the tools and [`Witness::at`] see
    /// it). Logged as `RETURNED <tool> <order> <fresh> <result as JSON>`
    /// before anything else: what the caller was given. `fresh` (1) when
    /// the effect landed in this process, so that this process wrote the
    /// COMMITTED record, at `Eventual` for an eventual-commit tool: only
    /// then is this [`At::Returned`], the moment its loss is certain.
    fn returned(&self, step: &shop::ShipStep<'_>, order: u64) {
        let tool = step.tool();
        let fresh = self
            .landed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&(tool, order));
        let result = step
            .result()
            .map_or_else(|e| format!("\"unencodable: {e}\""), |v| v.to_string());
        status_line(
            &self.status,
            &format!("RETURNED {tool} {order} {} {result}", u8::from(fresh)),
        );
        if fresh {
            self.reached(At::Returned, tool);
        }
    }

    /// Dies here if this is the planned point's n-th occurrence.
    fn reached(&self, at: At, tool: &str) {
        if let Some(point) = &self.crash {
            if point.moment == at
                && point.tool == tool
                && self.seen.fetch_add(1, Ordering::SeqCst) + 1 == point.nth
            {
                shop::sigkill_self();
            }
        }
    }
}

enum OrderEnd {
    Done,
    Parked(&'static str),
    Failed(String),
    Fatal(String),
}

/// What a worker is told through its environment.
struct WorkerEnv {
    journal: PathBuf,
    status: PathBuf,
    /// The orders `first..first + count`.
    first: u64,
    count: u64,
    /// Root run ids are `{prefix}-order-{id}`.
    prefix: String,
    concurrency: usize,
    crash: Option<CrashPoint>,
    addrs: ProviderAddrs,
}

impl WorkerEnv {
    fn read() -> Result<WorkerEnv, String> {
        let orders = env(ORDERS_ENV)?;
        let (first, count) = orders
            .split_once(',')
            .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
            .ok_or_else(|| format!("bad {ORDERS_ENV}: {orders}"))?;
        let concurrency: usize = env(CONCURRENCY_ENV)?
            .parse()
            .map_err(|e| format!("{CONCURRENCY_ENV}: {e}"))?;
        let crash = match std::env::var(CRASH_ENV) {
            Ok(text) => Some(CrashPoint::from_env(&text).ok_or(format!("bad crash point {text}"))?),
            Err(_) => None,
        };
        Ok(WorkerEnv {
            journal: PathBuf::from(env(JOURNAL_ENV)?),
            status: PathBuf::from(env(STATUS_ENV)?),
            first,
            count,
            prefix: env(PREFIX_ENV)?,
            concurrency: concurrency.max(1),
            crash,
            addrs: ProviderAddrs::from_env().map_err(|e| e.to_string())?,
        })
    }
}

async fn worker() -> i32 {
    let WorkerEnv {
        journal,
        status,
        first,
        count,
        prefix,
        concurrency,
        crash,
        addrs,
    } = match WorkerEnv::read() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("bad worker environment: {e}");
            return EXIT_FATAL;
        }
    };

    let opened = match std::env::var(POSTGRES_ENV) {
        Ok(url) => multi::connect_worker(&url).await,
        Err(_) => open_worker_journal(&journal),
    };
    let rt = match opened {
        Ok(rt) => rt,
        Err(e) => {
            status_line(&status, &format!("OPEN-FAILED {e}"));
            return EXIT_OPEN_FAILED;
        }
    };
    // What the durable audit stream holds at this point, for post-mortems.
    let seqs: Vec<u64> = rt
        .audit(0)
        .await
        .map(|events| events.iter().map(|e| e.seq).collect())
        .unwrap_or_default();
    // Also who this process is in the audit stream (`worker#incarnation`):
    // the parent tells by it which process wrote a surviving commit.
    status_line(
        &status,
        &format!(
            "OPENED audit events={} first={:?} last={:?} owner={}",
            seqs.len(),
            seqs.first(),
            seqs.last(),
            rt.owner()
        ),
    );
    let ship = std::env::var_os(sagas::SAGA_ENV).is_some();
    if ship {
        sagas::say_admin(&status, &rt);
    }

    let witness = Arc::new(Witness {
        status: status.clone(),
        crash,
        seen: AtomicU64::new(0),
        landed: std::sync::Mutex::new(std::collections::BTreeSet::new()),
    });
    let hook: shop::Hook = {
        let witness = witness.clone();
        Arc::new(move |moment, tool, order| witness.at(moment, tool, order))
    };
    let shop = Arc::new(Shop::with_hook(addrs, hook));
    let archive = std::env::var_os(ARCHIVE_ENV).is_some();

    // `concurrency` tasks, each taking every `concurrency`-th order.
    let mut tasks = tokio::task::JoinSet::new();
    for lane in 0..concurrency as u64 {
        let shop = shop.clone();
        let rt = rt.clone();
        let prefix = prefix.clone();
        let witness = witness.clone();
        tasks.spawn(async move {
            let mut ends = Vec::new();
            let mut order = first + lane;
            while order < first + count {
                let ctx = rt.run(&root_run(&prefix, order));
                // The order is shipped (the saga) before it is processed:
                // see `all_crash_points` for why in this order.
                let mut end = match ship {
                    true => sagas::process(&shop, &ctx, order, &witness).await,
                    false => OrderEnd::Done,
                };
                if matches!(end, OrderEnd::Done) {
                    end = process(&shop, &ctx, order).await;
                }
                if archive && matches!(end, OrderEnd::Done) {
                    end = match archive_order(&ctx, order).await {
                        Ok(body) if body == archive_body(order) => OrderEnd::Done,
                        Ok(_) => OrderEnd::Fatal("archive_order returned other bytes".into()),
                        Err(e) => OrderEnd::Fatal(format!("archive_order: {e}")),
                    };
                }
                let fatal = matches!(end, OrderEnd::Fatal(_));
                ends.push((order, end));
                if fatal {
                    break;
                }
                order += concurrency as u64;
            }
            ends
        });
    }
    let mut ends = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(lane) => ends.extend(lane),
            Err(e) => ends.push((0, OrderEnd::Fatal(format!("task panicked: {e}")))),
        }
    }
    let (mut done, mut parked, mut failed, mut fatal) = (0, 0, 0, 0);
    for (order, end) in &ends {
        match end {
            OrderEnd::Done => done += 1,
            OrderEnd::Parked(tool) => {
                parked += 1;
                status_line(&status, &format!("PARKED {order} {tool}"));
            }
            OrderEnd::Failed(why) => {
                failed += 1;
                status_line(&status, &format!("FAILED {order} {why}"));
            }
            OrderEnd::Fatal(why) => {
                fatal += 1;
                status_line(&status, &format!("FATAL {order} {why}"));
            }
        }
    }
    status_line(&status, &format!("DONE {done} {parked} {failed}"));
    if fatal > 0 {
        EXIT_FATAL
    } else {
        EXIT_DONE
    }
}

/// The worker's journal, on a clock shifted by [`CLOCK_SHIFT_ENV`] if set.
/// In power-cut mode its checkpoints come every [`POWER_CUT_CHECKPOINT_BYTES`]
/// of log, so that a round's cuts land in checkpoints and in the writing of
/// sled's image (with the default 8 MiB, a round's few MiB of log would
/// reach sled only at each open, and the image never be written).
fn open_worker_journal(journal: &Path) -> Result<Runtime, Error> {
    let shift_ms: u64 = std::env::var(CLOCK_SHIFT_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut builder = Runtime::builder().path(journal);
    if std::env::var_os(sagas::SAGA_ENV).is_some() {
        // The harness's operator decides approvals through it.
        builder =
            builder.admin_with(idem::admin::AdminOptions::new("127.0.0.1:0").token(sagas::TOKEN));
    }
    let mut sled = idem::SledOptions::default();
    if std::env::var_os(ARCHIVE_ENV).is_some() {
        sled.checkpoint_bytes = POWER_CUT_CHECKPOINT_BYTES;
    }
    if std::env::var_os(LATE_EVENTUAL_ENV).is_some() {
        sled.eventual_delay = LATE_EVENTUAL_DELAY;
    }
    if std::env::var_os(ARCHIVE_ENV).is_some() || std::env::var_os(LATE_EVENTUAL_ENV).is_some() {
        builder = builder.sled_options(sled);
    }
    if shift_ms > 0 {
        builder = builder.clock(Arc::new(ShiftedClock {
            base: idem::SystemClock::new(),
            shift_ms,
        }));
    }
    builder.open()
}

/// The system clock, `shift_ms` ahead: how the dedupe-window round makes
/// a day pass between two incarnations without waiting for it. The
/// providers' clock jumps by the same amount at the same moment (no worker
/// is alive then), so idem and the payments provider agree on how old a
/// key is.
struct ShiftedClock {
    base: idem::SystemClock,
    shift_ms: u64,
}

impl idem::Clock for ShiftedClock {
    fn now_ms(&self) -> u64 {
        self.base.now_ms() + self.shift_ms
    }
}

/// One order: the workflow from the top, a few times if a step ran out of
/// retry budget on failures that provably did not land (each new call
/// starts a fresh budget).
async fn process(shop: &Shop, ctx: &idem::Ctx, order: u64) -> OrderEnd {
    // Multi-worker mode: the database may be restarting (a journal error:
    // the call failed closed) and another worker may hold the operation
    // (in flight): both pass; try the order again.
    let multi = std::env::var_os(POSTGRES_ENV).is_some();
    let mut last = String::new();
    let mut tries = 0;
    let mut transient = 0;
    while tries < 5 {
        match shop.process_order(ctx, order, &mut |_| {}).await {
            Ok(_) => return OrderEnd::Done,
            Err(stopped) => match stopped.error {
                ToolError::Escalated { .. } => return OrderEnd::Parked(stopped.tool),
                ToolError::Tool(e) => last = format!("{}: {e}", stopped.tool),
                ToolError::Journal(Error::TimedOut { .. }) => {
                    last = format!("{}: timed out", stopped.tool);
                }
                // The shared outcome of a concurrent call of another worker.
                ToolError::Journal(e @ (Error::Failed { .. } | Error::Rejected { .. }))
                    if multi =>
                {
                    last = format!("{}: {e}", stopped.tool);
                }
                ToolError::Journal(Error::Storage { .. }) | ToolError::InFlight { .. }
                    if multi && transient < 2000 =>
                {
                    transient += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                other => return OrderEnd::Fatal(format!("{}: {other}", stopped.tool)),
            },
        }
        tries += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    OrderEnd::Failed(last)
}

/// The root run id of an order in a round: the workflow's durable identity.
fn root_run(prefix: &str, order: u64) -> String {
    format!("{prefix}-order-{order}")
}

// ===========================================================================
// The parent

/// What one incarnation is told to do.
#[derive(Debug, Clone)]
enum Plan {
    Alone,
    KillAfter(Duration),
    Crash(CrashPoint),
    /// Multi-worker mode: SIGSTOP after this long, SIGCONT once the lease
    /// ran out twice over.
    Pause(Duration),
}

/// What one of a round's first incarnations is planned to do, until done.
#[derive(Debug, Clone, PartialEq)]
enum Planned {
    /// Die at this point.
    Point(CrashPoint),
    /// Die right after the first charge landed (`charge:landed`), then move
    /// the clock past the charge's dedupe window.
    WindowExpiry,
}

impl Planned {
    fn point(&self) -> CrashPoint {
        match self {
            Planned::Point(p) => p.clone(),
            Planned::WindowExpiry => CrashPoint {
                tool: "charge".into(),
                moment: At::Landed,
                nth: 1,
            },
        }
    }
}

/// The coverage plan of a run: every instrumented point at its first
/// occurrence, in workflow order, `charge:landed` being the dedupe-window
/// jump. Run as a chain by the first incarnations of a fault-free round,
/// each with one order at a time, each point is certain to be reached: the
/// incarnation before died at the previous point, so no order has got past
/// this one yet, and at most the one order that died there is parked.
fn coverage_plan() -> Vec<Planned> {
    all_crash_points()
        .into_iter()
        .map(|p| {
            if p.tool == "charge" && p.moment == At::Landed {
                Planned::WindowExpiry
            } else {
                Planned::Point(p)
            }
        })
        .collect()
}

/// With [`KEEP_DAMAGED_ENV`] set, copies the durable state of the cut disk
/// (the journal that did not reopen) to a directory of its own under it,
/// with the violation, for a post-mortem.
fn keep_damaged(disk: &PowerCutFs, seed: u64, round: u64, violation: &str) {
    let Some(root) = std::env::var_os(KEEP_DAMAGED_ENV) else {
        return;
    };
    let to = Path::new(&root).join(format!("seed{seed:#x}-round{round}"));
    let kept = std::fs::create_dir_all(&root)
        .and_then(|()| disk.save_durable(&to))
        .and_then(|()| std::fs::write(to.join("VIOLATION.txt"), violation));
    match kept {
        Ok(()) => eprintln!("the damaged journal is kept in {}", to.display()),
        Err(e) => eprintln!(
            "could not keep the damaged journal in {}: {e}",
            to.display()
        ),
    }
}

/// A tool of this binary, by name.
fn descriptor(name: &str) -> Option<&'static idem::ToolDescriptor> {
    idem::tools().find(|t| t.name == name)
}

/// How an incarnation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Exited(i32),
    Signal(i32),
    Watchdog,
}

/// For a test binary that re-executes itself as the workers: the command
/// that runs only its test `entry` (which calls [`worker_main`] when
/// [`is_worker`]). Children report through files and exit codes, so
/// libtest's own output is moot.
pub fn test_binary_worker(entry: &str) -> std::process::Command {
    let mut command =
        std::process::Command::new(std::env::current_exe().expect("test binary path"));
    command.args(["--exact", entry, "--nocapture", "--test-threads", "1", "-q"]);
    command
}

/// A count from the environment variable `var` (e.g. `IDEM_TORTURE_KILLS`),
/// else `default`: lets a test's quick mode be run longer by hand.
pub fn count_from_env(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|k| k.parse().ok())
        .unwrap_or(default)
}

/// What a clean single-worker run must also show: every planned crash
/// point hit (planned, so a miss is a harness or engine defect, never bad
/// luck), and, counted by the providers and by the journal independently
/// of the harness's own bookkeeping, one effect per tool and order in the
/// ledgers and one commit for each in the audit stream; and eventual
/// commits tested: a provider-class and a journal-class tool of the saga
/// commit at `Eventual`, each lost a COMMIT (at least at its planned
/// `returned` point, where the loss is certain), and every lost one was
/// recovered with the result its caller had been given.
pub fn assert_covered_and_counted(summary: &Summary) {
    let eventual: Vec<&str> = SAGA_TOOLS
        .iter()
        .copied()
        .filter(|t| eventual_commit(t))
        .collect();
    for class in [Class::Provider, Class::Journal] {
        assert!(
            eventual
                .iter()
                .any(|t| descriptor(t).is_some_and(|d| d.class == class)),
            "no {class:?}-class tool of the saga has commit = \"eventual\" ({eventual:?})"
        );
    }
    for tool in &eventual {
        assert!(
            summary
                .lost_commits_by_tool
                .get(*tool)
                .copied()
                .unwrap_or(0)
                > 0,
            "no lost COMMIT of {tool} was found, though the coverage chain kills a worker right \
             after one was returned: {summary}"
        );
    }
    assert!(
        summary.eventual_returns >= summary.lost_commits,
        "lost commits: {summary}"
    );
    assert_eq!(
        (summary.recovered_commits, summary.changed_results),
        (summary.lost_commits, 0),
        "lost commits recovered, results changed: {summary}"
    );
    assert!(
        summary.crashpoints_missed().is_empty(),
        "crash points never hit: {:?}\n{summary}",
        summary.crashpoints_missed()
    );
    let expected = summary.workflows * EFFECT_TOOLS.len() as u64;
    assert!(summary.workflows > 0, "{summary}");
    assert_eq!(
        summary.operations,
        expected + summary.saga_effects_expected,
        "ledger effects: {summary}"
    );
    assert_eq!(
        summary.audited_commits, expected,
        "audited commits: {summary}"
    );
    assert_eq!(summary.sagas, summary.workflows, "sagas: {summary}");
    assert_eq!(
        summary.saga_audited_commits, summary.saga_effects_expected,
        "audited commits of the sagas: {summary}"
    );
    assert!(
        summary.sagas_completed > 0 && summary.sagas_compensated > 0,
        "sagas of both ends: {summary}"
    );
    assert!(
        summary.approved > 0 && summary.rejected > 0,
        "approvals of both kinds: {summary}"
    );
}

/// [`run`] for a test: progress and the summary on stdout, every
/// violation counted instead of stopping at the first one when
/// `IDEM_TORTURE_KEEP_GOING` is set, and a panic naming the seed to rerun
/// with unless the summary is clean.
pub fn run_in_test(mut config: Config, worker: &dyn Fn() -> std::process::Command) -> Summary {
    if std::env::var_os("IDEM_TORTURE_KEEP_GOING").is_some() {
        config.stop_on_violation = false;
    }
    let summary = run(&config, worker, &mut |line| println!("{line}"));
    println!("{summary}");
    assert!(
        summary.ok(),
        "torture found problems (rerun with IDEM_TORTURE_SEED={:#x}):\n{}\n{summary}",
        summary.seed,
        summary.violations.join("\n")
    );
    summary
}

/// Runs the harness; `worker` makes the command that starts a worker
/// process; `log` receives progress lines.
pub fn run(
    config: &Config,
    worker: &dyn Fn() -> std::process::Command,
    log: &mut dyn FnMut(&str),
) -> Summary {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            return Summary {
                violations: vec![format!("cannot start tokio: {e}")],
                ..Summary::default()
            }
        }
    };
    runtime.block_on(run_rounds(config, worker, log))
}

async fn run_rounds(
    config: &Config,
    worker: &dyn Fn() -> std::process::Command,
    log: &mut dyn FnMut(&str),
) -> Summary {
    let started = Instant::now();
    let mut rng = SplitMix64::new(config.seed);
    let mut summary = Summary {
        seed: config.seed,
        power_cut_mode: config.power_cut_mode(),
        ..Summary::default()
    };
    let mut span: Option<Duration> = None;
    let (target, unit) = if config.power_cut_mode() {
        (config.power_cuts, "power cuts")
    } else {
        (config.kills, "kills")
    };
    log(&format!(
        "torture: seed={:#x} (IDEM_TORTURE_SEED={:#x} to rerun the same plan), target {target} \
         {unit}, {} orders per round, {} at once",
        config.seed, config.seed, config.workflows, config.concurrency
    ));
    // Multi-worker mode: one database server for the run, a database per
    // round.
    // In failover mode, a primary with a synchronous standby.
    if config.failover && config.pooler {
        summary
            .violations
            .push("the failover mode does not go through a pooler".into());
        return summary;
    }
    let mut server = match config.multi_worker_mode() {
        true => match multi::Database::start(config.failover) {
            Ok(s) => {
                summary.workers = config.workers;
                Some(s)
            }
            Err(e) => {
                summary
                    .violations
                    .push(format!("multi-worker mode needs PostgreSQL: {e}"));
                return summary;
            }
        },
        false => None,
    };
    if config.power_cut_mode() {
        if let Err(e) = idem_testkit::powercut::check_fuse() {
            summary
                .violations
                .push(format!("power-cut mode needs FUSE: {e}"));
            return summary;
        }
    }
    // The coverage plan is the single-worker modes' (SIGKILL, power cuts):
    // multi-worker rounds choose their crash points and pauses at random.
    let mut coverage = match server {
        Some(_) => Vec::new(),
        None => coverage_plan(),
    };
    while (summary.progress() < target || !coverage.is_empty())
        && summary.rounds < config.max_rounds
    {
        if started.elapsed() > config.max_elapsed {
            summary.violations.push(format!(
                "only {} of {target} {unit} after {:?} (max_elapsed); not yet planned: {coverage:?}",
                summary.progress(),
                config.max_elapsed
            ));
            break;
        }
        let r = summary.rounds;
        let mut round = Round::new(config, r, &mut rng);
        // Without a span the round's first incarnation measures one; with
        // faults a planned point may not be reached (unless every round
        // has faults: then it is tried anyway, and again until reached).
        let fault_free = round.chaos.is_none() || config.chaos == ChaosMode::Always;
        let planned = if span.is_some() && fault_free {
            std::mem::take(&mut coverage)
        } else {
            Vec::new()
        };
        round.planned = planned.iter().cloned().collect();
        let no_faults = round.chaos.is_none();
        summary.last_round.clear();
        let hits_before = summary.crashpoint_hits.clone();
        let jumps_before = summary.window_jumps;
        let mut outcome = match &mut server {
            Some(server) => {
                round
                    .run_multi(server, worker, &mut span, &mut summary)
                    .await
            }
            None => round.run(worker, &mut span, &mut summary).await,
        };
        let mut unreached = Vec::new();
        for item in planned {
            let label = item.point().label();
            let done = match item {
                Planned::Point(_) => summary.crashpoint_hits.get(&label) > hits_before.get(&label),
                Planned::WindowExpiry => summary.window_jumps > jumps_before,
            };
            if !done {
                if no_faults {
                    unreached.push(label);
                }
                // Not reached (a fault or a violation stopped it): again.
                coverage.push(item);
            }
        }
        if !unreached.is_empty() && outcome.is_ok() {
            // Without faults the chain reaches every point by construction
            // (see `coverage_plan`): a miss is a defect, not bad luck, and
            // retrying it round after round would only end at max_elapsed.
            outcome = Err(format!(
                "PLANNED CRASH POINTS NOT REACHED in a fault-free round: {unreached:?} (an \
                 instrumented point no worker reaches, or a harness defect); incarnations: {}",
                summary.last_round.join("; ")
            ));
        }
        summary.rounds += 1;
        if let Err(violation) = outcome {
            summary
                .violations
                .push(format!("round {r} (seed {:#x}): {violation}", config.seed));
            log(&format!("round {r}: VIOLATION: {violation}"));
            if config.stop_on_violation {
                // Evidence first: stop rather than bury it under more rounds.
                break;
            }
        }
        if config.progress_every > 0 && summary.rounds.is_multiple_of(config.progress_every) {
            log(&format!(
                "  after {} rounds: {} {unit}, {} operations, {} duplicates, {} lost, {} escalations, \
                 {} audit gaps, {} violations, {:.0}s",
                summary.rounds,
                summary.progress(),
                summary.operations,
                summary.duplicates,
                summary.lost,
                summary.escalation_total(),
                summary.audit_gaps,
                summary.violations.len(),
                started.elapsed().as_secs_f64()
            ));
        }
    }
    summary.elapsed = started.elapsed();
    summary
}

struct Round<'c> {
    config: &'c Config,
    index: u64,
    orders: Vec<u64>,
    prefix: String,
    chaos: Option<(u64, bool)>,
    /// This round's own generator, split off the harness's.
    rng: SplitMix64,
    /// Power-cut mode: operations whose INTENT the current journal
    /// acknowledged as durable (a worker reached the moment of sending),
    /// and resolutions it acknowledged; what it must never forget.
    acknowledged: std::collections::BTreeSet<(String, u64)>,
    resolutions: u64,
    /// What the next incarnations do, one planned item each, before the
    /// seeded random plans take over.
    planned: std::collections::VecDeque<Planned>,
    /// The item the current incarnation carries.
    carrying: Option<Planned>,
    /// How far the providers' and the workers' clocks run ahead (ms).
    shift: Arc<AtomicU64>,
    /// Workers of this round that lost their calls in flight so far: died
    /// by SIGKILL, or (multi-worker) were paused past their lease or had
    /// the database restarted under them. Each lets a recovery find an
    /// at_most_once attempt whose outcome nobody knows.
    interrupted: u64,
    /// Workers of this round paused past their lease (multi-worker).
    paused: u64,
    /// Failovers in this round (failover mode): while the standby lagged
    /// or was being rebuilt, every commit waited for it, an INTENT's write
    /// too, and an attempt's timeout counts from the start of that write.
    failovers: u64,
    /// Per provider, escalations already accounted to its injected faults.
    charged_to_faults: BTreeMap<&'static str, u64>,
    /// Single-worker modes: every order is also shipped as a saga, and
    /// the harness decides its approvals through the admin API.
    sagas: bool,
    approver: std::sync::Mutex<sagas::Approver>,
    /// The processes that opened the round's journal, in order
    /// (`worker#incarnation`, as audit events name who wrote them): the
    /// workers and the harness's operator.
    writers: Vec<String>,
    /// What the workers' saga bodies were given (`RETURNED` lines).
    returns: Vec<Returned>,
}

/// A result a worker's saga body was given by a saga step's call (a
/// `RETURNED` line of its status file, see [`Witness::returned`]).
#[derive(Debug, Clone)]
struct Returned {
    /// The process (`worker#incarnation`).
    owner: String,
    /// Its incarnation in the round, for the evidence.
    incarnation: u32,
    tool: String,
    /// The order the tool was called for (the shipped order's number).
    order: u64,
    /// The effect landed in that process: it wrote the COMMITTED record.
    fresh: bool,
    result: serde_json::Value,
}

/// `RETURNED <tool> <order> <fresh> <json>` of a process `owner`.
fn parse_returned(line: &str, owner: &str, incarnation: u32) -> Option<Returned> {
    let rest = line.strip_prefix("RETURNED ")?;
    let mut parts = rest.splitn(4, ' ');
    let tool = parts.next()?.to_string();
    let order = parts.next()?.parse().ok()?;
    let fresh = match parts.next()? {
        "1" => true,
        "0" => false,
        _ => return None,
    };
    let result = serde_json::from_str(parts.next()?).ok()?;
    Some(Returned {
        owner: owner.to_string(),
        incarnation,
        tool,
        order,
        fresh,
        result,
    })
}

/// `OPENED ... owner=W` → W.
fn owner_of(opened: &str) -> Option<&str> {
    opened
        .split_whitespace()
        .find_map(|w| w.strip_prefix("owner="))
}

impl<'c> Round<'c> {
    fn new(config: &'c Config, index: u64, rng: &mut SplitMix64) -> Round<'c> {
        let first = (index + 1) * 100_000;
        let orders = (first..first + config.workflows).collect();
        let mut rng = SplitMix64::new(rng.next_u64());
        let chaos_on = match config.chaos {
            ChaosMode::Never => false,
            ChaosMode::Always => true,
            ChaosMode::Alternate => index % 2 == 1,
        };
        let chaos = chaos_on.then(|| {
            let reads = config.chaos == ChaosMode::Always || index % 4 == 3;
            (rng.next_u64(), reads)
        });
        Round {
            config,
            index,
            orders,
            prefix: format!("t{:x}-r{index}", config.seed),
            chaos,
            rng,
            acknowledged: std::collections::BTreeSet::new(),
            resolutions: 0,
            planned: std::collections::VecDeque::new(),
            carrying: None,
            shift: Arc::new(AtomicU64::new(0)),
            interrupted: 0,
            paused: 0,
            failovers: 0,
            charged_to_faults: BTreeMap::new(),
            sagas: !config.multi_worker_mode(),
            approver: std::sync::Mutex::new(sagas::Approver::default()),
            writers: Vec::new(),
            returns: Vec::new(),
        }
    }

    /// What the journal acknowledged and must never forget besides the
    /// INTENTs: the operator's resolutions and approval decisions.
    fn decisions(&self) -> u64 {
        self.resolutions
            + self
                .approver
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .acknowledged()
    }

    /// Books a worker's death by SIGKILL: per instrumented point, and for
    /// the dedupe-window round the jump of the clock past the window.
    fn died(&mut self, plan: &Plan, summary: &mut Summary) {
        self.interrupted += 1;
        let Plan::Crash(point) = plan else { return };
        *summary.crashpoint_hits.entry(point.label()).or_default() += 1;
        if self.carrying == Some(Planned::WindowExpiry) {
            let window = descriptor("charge")
                .map_or(idem::ToolDescriptor::DEFAULT_DEDUPE_WINDOW, |t| {
                    t.dedupe_window
                });
            let jump = window + Duration::from_secs(60);
            self.shift
                .fetch_add(jump.as_millis() as u64, Ordering::SeqCst);
            summary.window_jumps += 1;
        }
    }

    /// Power-cut mode: cuts the power of `disk` (already off if the
    /// parent's kill did it) and boots it again, keeping nothing unsynced or
    /// a seeded prefix of it, half the time each.
    /// Returns what the cut lost, for the round's history.
    fn power_cut(
        &mut self,
        disk: &mut PowerCutFs,
        summary: &mut Summary,
    ) -> Result<String, String> {
        let survival = if self.rng.below(2) == 0 {
            Survival::SyncedOnly
        } else {
            summary.prefix_cuts += 1;
            Survival::SeededPrefix(self.rng.next_u64())
        };
        let report = disk
            .restart(survival)
            .map_err(|e| format!("the power-cut file system did not come back: {e}"))?;
        summary.power_cuts += 1;
        summary.writes_dropped += report.changes_lost;
        summary.writes_torn += report.torn_writes;
        summary.entries_undone += report.entries_lost;
        Ok(format!(
            "CUT {survival:?} lost [{}]",
            if report.lost.is_empty() {
                "nothing".to_string()
            } else {
                report.lost.join(", ")
            }
        ))
    }

    /// What a journal that cannot be used after a cut costs: nothing if it
    /// never acknowledged anything (a refusal with a clear error is then
    /// fine, and the operator starts it over), else every operation it
    /// acknowledged is lost.
    fn judge_unopenable(
        &self,
        clear_error: bool,
        what: &str,
        summary: &mut Summary,
    ) -> Result<(), String> {
        let acked = self.acknowledged.len() as u64 + self.decisions();
        if clear_error && acked == 0 {
            summary.refused_opens += 1;
            return Ok(());
        }
        summary.reopen_failures += 1;
        summary.lost += acked;
        Err(format!(
            "REOPEN FAILURE after a power cut: {what}; the journal had acknowledged {} \
             operations ({:?}) and {} resolutions and approval decisions",
            self.acknowledged.len(),
            self.acknowledged,
            self.decisions()
        ))
    }

    fn plan(&mut self, span: Option<Duration>) -> Plan {
        self.carrying = None;
        let Some(span) = span else {
            // The very first incarnation measures how long a clean run takes.
            return Plan::Alone;
        };
        if let Some(item) = self.planned.pop_front() {
            let point = item.point();
            self.carrying = Some(item);
            return Plan::Crash(point);
        }
        let u = self.rng.next_f64();
        if u < 0.12 {
            Plan::Alone
        } else if u < 0.42 {
            // Any instrumented tool the round runs: the sagas' too.
            let tools: Vec<&str> = match self.sagas {
                true => SAGA_TOOLS
                    .iter()
                    .chain(EFFECT_TOOLS.iter())
                    .copied()
                    .collect(),
                false => EFFECT_TOOLS.to_vec(),
            };
            let tool = tools[self.rng.below(tools.len() as u64) as usize];
            // One draw, as before there were eventual commits: the plans
            // of the other tools stay what a seed made them.
            let moment = match self.rng.below(4) {
                0 => At::Sending,
                1 if eventual_commit(tool) => At::Returned,
                _ => At::Landed,
            };
            let most = (self.config.workflows / 2).max(1);
            Plan::Crash(CrashPoint {
                tool: tool.to_string(),
                moment,
                nth: 1 + self.rng.below(most),
            })
        } else {
            let micros = span.as_micros() as u64;
            Plan::KillAfter(Duration::from_micros(self.rng.below(micros + 1)))
        }
    }

    /// The round's providers, on the round's clock (it jumps in the
    /// dedupe-window round), with its faults if it is a chaos round.
    async fn start_providers(&self, summary: &mut Summary) -> Result<Providers, String> {
        let clock = {
            let (system, shift) = (Clock::system(), self.shift.clone());
            Clock::from_fn(move || system.now_ms() + shift.load(Ordering::SeqCst))
        };
        let providers = Providers::start_with(ProvidersConfig::default().clock(clock))
            .await
            .map_err(|e| format!("providers: {e}"))?;
        if let Some((seed, reads)) = self.chaos {
            summary.chaos_rounds += 1;
            let mut s = SplitMix64::new(seed);
            providers
                .payments()
                .faults()
                .set_chaos(Some(chaos(s.next_u64(), reads, false)));
            providers
                .email()
                .faults()
                .set_chaos(Some(chaos(s.next_u64(), reads, false)));
            providers
                .tickets()
                .faults()
                .set_chaos(Some(chaos(s.next_u64(), reads, false)));
            providers
                .wire()
                .faults()
                .set_chaos(Some(chaos(s.next_u64(), reads, true)));
        }

        Ok(providers)
    }

    async fn run(
        mut self,
        worker: &dyn Fn() -> std::process::Command,
        span: &mut Option<Duration>,
        summary: &mut Summary,
    ) -> Result<(), String> {
        let dir = tempfile::Builder::new()
            .prefix("idem-torture-")
            .tempdir()
            .map_err(|e| format!("tempdir: {e}"))?;
        // Power-cut mode: the journal on a disk that loses what a power cut
        // loses; status files, stderr and the providers stay outside it.
        let mut disk = if self.config.power_cut_mode() {
            let at = dir.path().join("disk");
            std::fs::create_dir(&at).map_err(|e| format!("mount point: {e}"))?;
            Some(PowerCutFs::mount(&at).map_err(|e| e.to_string())?)
        } else {
            None
        };
        let journal = match &disk {
            Some(d) => d.mountpoint().join("journal"),
            None => dir.path().join("journal"),
        };
        let providers = self.start_providers(summary).await?;

        if let (Some(disk), true) = (disk.as_ref(), self.config.sync_new_journal) {
            create_synced(disk, &journal)?;
        }
        let mut last_death: Option<Instant> = None;
        let mut finished = false;
        let mut last_stderr = String::new();
        let mut history = Vec::new();
        for incarnation in 0..self.config.max_incarnations {
            let plan = self.plan(*span);
            let status = dir.path().join(format!("status-{incarnation}"));
            let stderr = dir.path().join(format!("stderr-{incarnation}"));
            let began = Instant::now();
            // What the journal had acknowledged when this worker opened it
            // (it acknowledges approval decisions while it runs).
            let acked_before = self.acknowledged.len() as u64 + self.decisions();
            let (end, cut_now) = self
                .incarnation(
                    worker,
                    &plan,
                    &journal,
                    (&status, &stderr),
                    &providers,
                    disk.as_ref(),
                )
                .await?;
            summary.incarnations += 1;
            let text = std::fs::read_to_string(&status).unwrap_or_default();
            // What the worker said of its orders, beside its plan and end.
            let said: Vec<&str> = text
                .lines()
                .filter(|l| {
                    ["DONE", "PARKED", "FAILED", "FATAL"]
                        .iter()
                        .any(|w| l.starts_with(w))
                })
                .collect();
            history.push(format!("#{incarnation} {plan:?} -> {end:?} {said:?}"));
            summary.last_round.clone_from(&history);
            last_stderr = std::fs::read_to_string(&stderr).unwrap_or_default();
            let opened = text.lines().find(|l| l.starts_with("OPENED"));
            if opened.is_some() {
                summary.journal_opens += 1;
            }
            // Who this worker was, and what its saga bodies were given
            // (judged against the journal after the round).
            if let Some(owner) = opened.and_then(owner_of) {
                self.writers.push(owner.to_string());
                for line in text.lines().filter(|l| l.starts_with("RETURNED ")) {
                    let returned = parse_returned(line, owner, incarnation)
                        .ok_or_else(|| format!("unreadable status line: {line}"))?;
                    self.returns.push(returned);
                }
            }
            if let Some(disk) = disk.as_mut() {
                // A journal that opens empty although it acknowledged
                // operations before the cut forgot them: the silent re-run
                // power loss must never cause.
                let acked = acked_before;
                if opened.and_then(audit_events) == Some(0) && acked > 0 {
                    summary.forgotten += 1;
                    summary.lost += acked;
                    return Err(format!(
                        "FORGOTTEN: after a power cut the journal opened with no audit event \
                         although it had acknowledged {:?} and {} resolutions and approval \
                         decisions (incarnation {incarnation}); incarnations: {}",
                        self.acknowledged,
                        self.decisions(),
                        history.join("; ")
                    ));
                }
                for line in text.lines() {
                    let mut words = line.split_whitespace();
                    if let (Some("SENDING"), Some(tool), Some(order)) =
                        (words.next(), words.next(), words.next())
                    {
                        if let Ok(order) = order.parse() {
                            self.acknowledged.insert((tool.to_string(), order));
                        }
                    }
                }
                let died = matches!(end, End::Signal(9));
                if cut_now || died {
                    summary.kills += 1;
                    self.died(&plan, summary);
                    if matches!(plan, Plan::Crash(_)) && !cut_now {
                        summary.crashpoint_kills += 1;
                        summary.crashpoint_cuts += 1;
                    } else {
                        summary.random_kills += 1;
                        summary.random_cuts += 1;
                    }
                    history.push(self.power_cut(disk, summary)?);
                    last_death = Some(Instant::now());
                }
                if let Some(l) = text.lines().find(|l| l.starts_with("OPEN-FAILED")) {
                    let what = format!(
                        "incarnation {incarnation} (plan {plan:?}): {l}\nincarnations: {}",
                        history.join("; ")
                    );
                    if let Err(violation) = self.judge_unopenable(true, &what, summary) {
                        keep_damaged(disk, self.config.seed, self.index, &violation);
                        return Err(violation);
                    }
                    // Refused, and nothing acknowledged: the operator
                    // starts the journal over.
                    history.push("refused to open; started over".into());
                    remove_journal(disk, &journal)?;
                    if self.config.sync_new_journal {
                        create_synced(disk, &journal)?;
                    }
                    continue;
                }
                if opened.is_none() && !cut_now && !died {
                    let what = format!(
                        "incarnation {incarnation} (plan {plan:?}) ended {end:?} without \
                         opening the journal:\n{text}\n{last_stderr}\nincarnations: {}",
                        history.join("; ")
                    );
                    // Never fine (an open must fail with a clear error):
                    // returns the violation.
                    if let Err(violation) = self.judge_unopenable(false, &what, summary) {
                        keep_damaged(disk, self.config.seed, self.index, &violation);
                        return Err(violation);
                    }
                }
                if cut_now || died {
                    continue;
                }
            }
            if let Some(l) = text.lines().find(|l| l.starts_with("OPEN-FAILED")) {
                return Err(format!(
                    "the journal did not reopen (incarnation {incarnation}, plan {plan:?}): {l}"
                ));
            }
            match end {
                End::Signal(9) => {
                    summary.kills += 1;
                    match plan {
                        Plan::Crash(_) => summary.crashpoint_kills += 1,
                        _ => summary.random_kills += 1,
                    }
                    self.died(&plan, summary);
                    last_death = Some(Instant::now());
                }
                End::Exited(EXIT_DONE) => {
                    if span.is_none() {
                        *span = Some(began.elapsed());
                    }
                    let (done, parked) = parse_done(&text).ok_or_else(|| {
                        format!("worker exited 0 without a DONE line: {text}\n{last_stderr}")
                    })?;
                    if parked > 0 {
                        let operated = CatchPanic(Box::pin(self.operate(
                            &JournalAt::Dir(journal.clone()),
                            &providers,
                            last_death,
                            summary,
                        )))
                        .await;
                        self.resolutions += operated
                            .unwrap_or_else(|panic| {
                                Err(format!("the operator's journal panicked: {panic}"))
                            })
                            .map_err(|e| format!("{e}\nincarnations: {}", history.join("; ")))?;
                    }
                    if done == self.config.workflows {
                        finished = true;
                        break;
                    }
                }
                End::Exited(code) => {
                    return Err(format!(
                        "worker exited with {code} (plan {plan:?}):\n{text}\n{last_stderr}"
                    ))
                }
                End::Signal(s) => {
                    return Err(format!(
                        "worker died of signal {s} (plan {plan:?}):\n{text}\n{last_stderr}"
                    ))
                }
                End::Watchdog => {
                    return Err(format!(
                    "worker stuck past {WORKER_DEADLINE:?} (plan {plan:?}):\n{text}\n{last_stderr}"
                ))
                }
            }
        }
        if !finished {
            return Err(format!(
                "orders still unfinished after {} incarnations; last stderr:\n{last_stderr}",
                self.config.max_incarnations
            ));
        }
        summary.workflows += self.config.workflows;
        if let Some(disk) = disk.as_mut() {
            // Every order is done, as the worker was told: that must
            // survive the power going now.
            history.push(self.power_cut(disk, summary)?);
            summary.exit_cuts += 1;
        }
        let checked = CatchPanic(Box::pin(self.check(
            &JournalAt::Dir(journal.clone()),
            &providers,
            summary,
        )))
        .await
        .unwrap_or_else(|panic| Err(format!("the journal panicked: {panic}")));
        if let Err(why) = &checked {
            if self.config.power_cut_mode() && why.starts_with("the journal panicked") {
                // Damage read as a panic, not a clear error.
                let _ = self.judge_unopenable(false, why, summary);
            }
        }
        // What the providers hold, counted by them: four per order (and
        // the sagas' effects) unless something was duplicated, lost or sent
        // for no order.
        summary.operations += ledger_sizes(&providers).iter().sum::<usize>() as u64;
        for p in [
            providers.payments().faults().stats(),
            providers.email().faults().stats(),
            providers.tickets().faults().stats(),
            providers.wire().faults().stats(),
        ] {
            summary.faults += p.values().sum::<u64>();
        }
        providers.shutdown().await;
        if let Err(problems) = checked {
            let history = history.join("; ");
            // Keep the evidence on disk, for the first few failing rounds.
            if summary.violations.len() < KEEP_AT_MOST {
                if let Some(disk) = &disk {
                    // After the last cut the durable image is the state:
                    // a plain copy that `--dump DIR/image/journal` reads.
                    let _ = disk.save_durable(dir.path().join("image"));
                }
                let kept = dir.keep();
                return Err(format!(
                    "{problems}\nincarnations: {history}\n(journal and worker status files kept in {})",
                    kept.display()
                ));
            }
            return Err(format!("{problems}\nincarnations: {history}"));
        }
        Ok(())
    }

    /// Starts one worker and sees it end: by itself, by our SIGKILL, or by
    /// the watchdog.
    ///
    /// Power-cut mode (`disk`): a kill by the parent powers the disk off
    /// first; the returned flag says it did.
    async fn incarnation(
        &self,
        worker: &dyn Fn() -> std::process::Command,
        plan: &Plan,
        journal: &Path,
        (status, stderr): (&Path, &Path),
        providers: &Providers,
        disk: Option<&PowerCutFs>,
    ) -> Result<(End, bool), String> {
        let mut cut = false;
        // A planned crash point runs its orders one at a time: with several
        // lanes, the others' INTENTs can become durable in the same group
        // commit as the one whose hook kills the worker, so several orders
        // get past the point at once, and an at_most_once tool parks them
        // all where the chain needs one to go on (`coverage_plan`).
        let concurrency = if self.carrying.is_some() {
            1
        } else {
            self.config.concurrency
        };
        let mut command = tokio::process::Command::from(worker());
        command
            .env(WORKER_ENV, "1")
            .env(JOURNAL_ENV, journal)
            .env(STATUS_ENV, status)
            .env(
                ORDERS_ENV,
                format!("{},{}", self.orders[0], self.orders.len()),
            )
            .env(PREFIX_ENV, &self.prefix)
            .env(CONCURRENCY_ENV, concurrency.to_string())
            .envs(providers.addrs().to_env())
            .env_remove(CRASH_ENV)
            .env_remove(ARCHIVE_ENV)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(stderr).map_err(|e| format!("stderr file: {e}"))?)
            .kill_on_drop(true);
        if let Plan::Crash(point) = plan {
            command.env(CRASH_ENV, point.to_env());
        }
        if disk.is_some() {
            command.env(ARCHIVE_ENV, "1");
        }
        match &self.carrying {
            Some(Planned::Point(p)) if p.moment == At::Returned => {
                command.env(LATE_EVENTUAL_ENV, "1");
            }
            _ => {
                command.env_remove(LATE_EVENTUAL_ENV);
            }
        }
        if self.sagas {
            command.env(sagas::SAGA_ENV, "1");
        } else {
            command.env_remove(sagas::SAGA_ENV);
        }
        match self.shift.load(Ordering::SeqCst) {
            0 => command.env_remove(CLOCK_SHIFT_ENV),
            ms => command.env(CLOCK_SHIFT_ENV, ms.to_string()),
        };
        // The plan heads the status file, for post-mortems.
        status_line(status, &format!("PLAN {plan:?}"));
        let mut child = command.spawn().map_err(|e| format!("spawn worker: {e}"))?;
        let deadline = WORKER_DEADLINE + Duration::from_secs(5);
        let ended = async {
            match plan {
                Plan::KillAfter(delay) => {
                    tokio::select! {
                        status = child.wait() => Some(status),
                        () = tokio::time::sleep(*delay) => {
                            // Power-cut mode: the power goes first, so nothing
                            // the worker does from this instant reaches the disk.
                            if let Some(disk) = disk {
                                disk.power_off();
                                cut = true;
                            }
                            // SIGKILL. If it exited meanwhile, its status says so.
                            let _ = child.start_kill();
                            Some(child.wait().await)
                        }
                    }
                }
                _ => tokio::time::timeout(deadline, child.wait()).await.ok(),
            }
        };
        // Meanwhile the operator decides the worker's pending approvals
        // through its admin API.
        let approving = async {
            match self.sagas {
                true => sagas::approve_while(status, &self.approver).await,
                false => std::future::pending().await,
            }
        };
        let status = tokio::select! {
            ended = ended => ended,
            never = approving => match never {},
        };
        let Some(status) = status else {
            let _ = child.kill().await;
            return Ok((End::Watchdog, cut));
        };
        let status = status.map_err(|e| format!("wait for worker: {e}"))?;
        #[cfg(unix)]
        {
            use std::os::unix::process::ExitStatusExt;
            if let Some(signal) = status.signal() {
                return Ok((End::Signal(signal), cut));
            }
        }
        Ok((End::Exited(status.code().unwrap_or(-1)), cut))
    }

    /// The operator: settles every open escalation from the provider's
    /// ledger, as a human with the provider's dashboard would, once it has
    /// checked that the round's faults and kills justify it.
    async fn operate(
        &mut self,
        journal: &JournalAt,
        providers: &Providers,
        last_death: Option<Instant>,
        summary: &mut Summary,
    ) -> Result<u64, String> {
        if last_death.is_some() {
            // A request the dead worker had sent may still be in a
            // provider: read the ledgers once it has been handled.
            providers.settled().await;
        }
        let rt = match journal.open().await {
            Ok(rt) => rt,
            Err((clear, e)) => {
                let what = format!("operator cannot open the journal: {e}");
                if self.config.power_cut_mode() {
                    self.judge_unopenable(clear, &what, summary)?;
                }
                return Err(what);
            }
        };
        // What it writes (resolutions) is written after every worker so far.
        self.writers.push(rt.owner().to_string());
        let mut resolved = 0;
        let open = rt
            .escalations()
            .await
            .map_err(|e| format!("escalations(): {e}"))?;
        if open.is_empty() {
            return Err("a worker parked an order but escalations() is empty".into());
        }
        let mut unjustified = Vec::new();
        for esc in open {
            *summary.escalations.entry(esc.tool.clone()).or_default() += 1;
            let history = rt
                .history(&esc.key)
                .await
                .map_err(|e| format!("history of {}: {e}", esc.key))?;
            match self.justify(&esc, &history, providers) {
                Ok(why) => {
                    *summary
                        .justified
                        .entry(format!("{}: {why}", esc.tool))
                        .or_default() += 1
                }
                Err(why) => unjustified.push(format!(
                    "UNJUSTIFIED ESCALATION of {} ({}, order {}): {why}; its reason: {}; \
                     attempts={} verify_answer={:?}; history: {:?}",
                    esc.tool,
                    esc.key,
                    esc.args["order_id"],
                    esc.reason,
                    esc.attempts,
                    esc.verify_answer,
                    history.iter().map(|e| &e.kind).collect::<Vec<_>>()
                )),
            }
            let (resolution, note) = decide(&esc, providers)?;
            match resolution {
                Resolution::Landed(_) => summary.resolved_landed += 1,
                _ => summary.resolved_reissue += 1,
            }
            rt.resolve(&esc.key, resolution, &note)
                .await
                .map_err(|e| format!("resolve {}: {e}", esc.key))?;
            resolved += 1;
        }
        if !unjustified.is_empty() {
            return Err(unjustified.join("\n"));
        }
        Ok(resolved)
    }

    /// What in this round justifies an escalation, or why nothing does.
    ///
    /// - at_most_once: a kill while the call was in flight (the operation
    ///   was recovered from the journal, and a worker of this round died),
    ///   or an ambiguous outcome of the call itself, of which there are no
    ///   more than the provider injected faults that make one.
    /// - provider: the retry budget (attempts or max_elapsed) or the
    ///   provider's dedupe window, measured from the operation's own
    ///   journal record (a provider that deduplicates is otherwise always
    ///   safe to retry).
    /// - journal: verify could not tell (its recorded answer was neither
    ///   landed nor not landed), no more often than the provider injected
    ///   faults (on a look-up, or an outage that a look-up ran into).
    fn justify(
        &mut self,
        esc: &Escalation,
        history: &[idem::AuditEvent],
        providers: &Providers,
    ) -> Result<&'static str, String> {
        let tool = descriptor(&esc.tool).ok_or_else(|| format!("unknown tool {}", esc.tool))?;
        // This episode: what happened since the last operator answer.
        let since = history
            .iter()
            .rposition(|e| {
                matches!(
                    e.kind,
                    EventKind::Resolved { .. } | EventKind::Amended { .. }
                )
            })
            .map_or(0, |i| i + 1);
        // ... up to the escalation itself: what a stale worker did after it
        // (a verify of its own, fenced off) did not lead to it.
        let until = history[since..]
            .iter()
            .position(|e| matches!(e.kind, EventKind::Escalated { .. }))
            .map_or(history.len(), |i| since + i + 1);
        let episode = &history[since..until];
        let (provider, stats) = match esc.tool.as_str() {
            "charge" | "pay" | "refund" => ("payments", providers.payments().faults().stats()),
            "send_email" => ("email", providers.email().faults().stats()),
            "open_ticket" | "book_courier" | "cancel_courier" => {
                ("tickets", providers.tickets().faults().stats())
            }
            _ => ("wire", providers.wire().faults().stats()),
        };
        let mut charge_to_faults = |kinds: &[&str]| -> Result<(), String> {
            let injected: u64 = stats
                .iter()
                .filter(|(label, _)| kinds.is_empty() || kinds.contains(label))
                .map(|(_, n)| n)
                .sum();
            let used = self.charged_to_faults.entry(provider).or_default();
            if *used >= injected {
                return Err(format!(
                    "{used} escalations already account for the {injected} faults the {provider} \
                     provider injected this round ({stats:?})"
                ));
            }
            *used += 1;
            Ok(())
        };
        match tool.class {
            Class::AtMostOnce => {
                let recovered = episode.iter().any(
                    |e| matches!(e.kind, EventKind::Recovered { attempts, .. } if attempts > 0),
                );
                if recovered && self.interrupted > 0 {
                    return Ok("kill mid-call");
                }
                // A worker paused mid-attempt wakes past the attempt's
                // deadline: its request may have gone out.
                let timed_out = episode.iter().any(|e| {
                    matches!(&e.kind, EventKind::Escalated { reason } if reason.contains("timed out"))
                });
                if timed_out && self.paused > 0 {
                    return Ok("paused mid-call");
                }
                // (An attempt whose INTENT's commit waited past the timeout
                // for a standby is never polled: the engine reports it not
                // sent and tries again, so a failover justifies nothing
                // here.)
                // A fault that leaves the outcome unknown to the caller.
                charge_to_faults(&[
                    "error_before_apply",
                    "error_after_apply",
                    "timeout_after_apply",
                    "timeout_before_apply",
                    "disconnect_after_apply",
                    "disconnect_before_apply",
                ])
                .map(|()| "ambiguous outcome")
            }
            Class::Provider => {
                let first_sent = history
                    .iter()
                    .find(|e| matches!(e.kind, EventKind::Attempt { .. }))
                    .map(|e| e.at_ms)
                    .unwrap_or(esc.first_attempt_ms);
                let age = Duration::from_millis(esc.escalated_ms.saturating_sub(first_sent));
                let elapsed =
                    Duration::from_millis(esc.escalated_ms.saturating_sub(esc.first_attempt_ms));
                let policy = &tool.retry;
                if age >= tool.dedupe_window {
                    Ok("dedupe window passed")
                } else if esc.attempts >= policy.max_attempts {
                    Ok("attempts spent")
                } else if policy
                    .max_elapsed
                    // The engine stops when the next backoff would overrun.
                    .is_some_and(|max| elapsed + policy.max_interval >= max)
                {
                    Ok("max_elapsed spent")
                } else {
                    Err(format!(
                        "a provider-class tool escalated with its budget ({} of {} attempts, \
                         {elapsed:?} of {:?}) and the dedupe window ({age:?} of {:?}) left",
                        esc.attempts, policy.max_attempts, policy.max_elapsed, tool.dedupe_window
                    ))
                }
            }
            Class::Journal => {
                let verdict = episode.iter().rev().find_map(|e| match &e.kind {
                    EventKind::Verified { verdict } => Some(verdict.as_str()),
                    _ => None,
                });
                let verified = verdict.is_some();
                let told = matches!(verdict, Some("landed") | Some("not_landed"));
                if told || !verified {
                    return Err(format!(
                        "a journal tool escalated although verify {}",
                        if verified {
                            "could tell"
                        } else {
                            "was not asked"
                        }
                    ));
                }
                charge_to_faults(&[]).map(|()| "verify could not tell")
            }
            Class::ReadOnly => Err("a read_only tool has nothing to escalate".into()),
        }
    }

    /// The results the workers' saga bodies were given by the tools with
    /// `commit = "eventual"`, against the journal after the round: counts
    /// the lost COMMITs (see the module's documentation) and checks that
    /// each was recovered. `writers`: who opened the journal, in order.
    async fn check_returns(
        &self,
        rt: &Runtime,
        events: &[idem::AuditEvent],
        writers: &[String],
        providers: &Providers,
        summary: &mut Summary,
        problems: &mut Vec<String>,
    ) {
        let position =
            |owner: Option<&str>| owner.and_then(|o| writers.iter().position(|w| w == o));
        for &order in &self.orders {
            let run = root_run(&self.prefix, order);
            let shipped = sagas::saga_order(order);
            for tool in SAGA_TOOLS.iter().filter(|t| eventual_commit(t)) {
                let returns: Vec<&Returned> = self
                    .returns
                    .iter()
                    .filter(|r| r.tool == *tool && r.order == shipped)
                    .collect();
                if returns.is_empty() {
                    continue;
                }
                let history: Vec<&idem::AuditEvent> = events
                    .iter()
                    .filter(|e| e.root_run == run && e.tool == *tool)
                    .collect();
                let commits: Vec<&&idem::AuditEvent> = history
                    .iter()
                    .filter(|e| matches!(e.kind, EventKind::Committed { .. }))
                    .collect();
                // Per process that was given a result: whether the effect
                // landed there (it wrote the COMMITTED record).
                let mut given: Vec<(&str, u32, bool)> = Vec::new();
                for r in &returns {
                    match given.iter_mut().find(|(o, ..)| *o == r.owner) {
                        Some(g) => g.2 |= r.fresh,
                        None => given.push((&r.owner, r.incarnation, r.fresh)),
                    }
                }
                summary.eventual_returns += given.iter().filter(|g| g.2).count() as u64;
                let evidence = || {
                    format!(
                        "given {:?}; writers {writers:?}; history {:?}",
                        returns
                            .iter()
                            .map(|r| (r.incarnation, r.fresh, r.result.to_string()))
                            .collect::<Vec<_>>(),
                        history
                            .iter()
                            .map(|e| (e.seq, e.worker.clone(), &e.kind))
                            .collect::<Vec<_>>()
                    )
                };
                let [commit] = commits[..] else {
                    // Counted by the audit check; whoever was given a
                    // result was given one the journal does not keep.
                    for (_, incarnation, fresh) in &given {
                        if *fresh {
                            summary.lost_commits += 1;
                            *summary
                                .lost_commits_by_tool
                                .entry(tool.to_string())
                                .or_default() += 1;
                        }
                        problems.push(format!(
                            "LOST COMMIT NOT RECOVERED: {tool} of order {order} returned a result \
                             to incarnation {incarnation}, and the audit stream holds {} commits \
                             of it; {}",
                            commits.len(),
                            evidence()
                        ));
                    }
                    continue;
                };
                let via = match &commit.kind {
                    EventKind::Committed { via, .. } => via.clone(),
                    _ => String::new(),
                };
                let journaled = match commit.key.as_deref().map(str::parse::<idem::IdemKey>) {
                    Some(Ok(key)) => match rt.operation(&key).await {
                        Ok(op) => op.and_then(|op| op.result),
                        Err(e) => {
                            problems.push(format!("operation({key}): {e}"));
                            continue;
                        }
                    },
                    _ => {
                        problems.push(format!(
                            "the commit of {tool} of order {order} names no key: {commit:?}"
                        ));
                        continue;
                    }
                };
                // Every result a caller was given is the one the journal
                // keeps (and replays).
                for r in &returns {
                    if journaled.as_ref() != Some(&r.result) {
                        summary.changed_results += 1;
                        problems.push(format!(
                            "RESULT CHANGED: {tool} of order {order} returned {} to incarnation \
                             {}; the journal holds {}",
                            r.result,
                            r.incarnation,
                            journaled
                                .as_ref()
                                .map_or("nothing".into(), |v| v.to_string())
                        ));
                    }
                }
                let written_at = position(commit.worker.as_deref());
                for (owner, incarnation, fresh) in &given {
                    let (Some(written_at), Some(given_at)) = (written_at, position(Some(owner)))
                    else {
                        problems.push(format!(
                            "the commit of {tool} of order {order} was written by {:?}, which \
                             did not open the journal in this round as far as the workers \
                             said; {}",
                            commit.worker,
                            evidence()
                        ));
                        continue;
                    };
                    // Written by this process or one before it: the
                    // commit the result came from survived.
                    if written_at <= given_at {
                        continue;
                    }
                    if !fresh {
                        // Replayed from the journal, or committed from
                        // verify's answer (at Immediate): durable before
                        // the caller saw it, so never lost.
                        problems.push(format!(
                            "LOST DURABLE COMMIT: {tool} of order {order} returned a result to \
                             incarnation {incarnation} that it did not commit itself at \
                             Eventual, and a later process committed it again; {}",
                            evidence()
                        ));
                        continue;
                    }
                    summary.lost_commits += 1;
                    *summary
                        .lost_commits_by_tool
                        .entry(tool.to_string())
                        .or_default() += 1;
                    // Recovered: a later process found the operation
                    // unfinished (INTENT), and committed it with the
                    // result the caller had, one effect in the ledger.
                    let found = history.iter().any(|e| {
                        matches!(e.kind, EventKind::Recovered { .. })
                            && e.seq < commit.seq
                            && position(e.worker.as_deref()).is_some_and(|p| p > given_at)
                    });
                    let same = returns
                        .iter()
                        .filter(|r| r.owner == *owner)
                        .all(|r| journaled.as_ref() == Some(&r.result));
                    let effects = shop::saga_effects(providers, tool, shipped);
                    if found && same && effects == 1 {
                        summary.recovered_commits += 1;
                        *summary
                            .recovered_via
                            .entry(format!("{tool}:{via}"))
                            .or_default() += 1;
                    } else {
                        problems.push(format!(
                            "LOST COMMIT NOT RECOVERED: {tool} of order {order} returned a \
                             result to incarnation {incarnation}, whose COMMITTED record did not \
                             survive; found unfinished later: {found}, the same result \
                             journaled: {same}, effects in the provider's ledger: {effects} \
                             (committed via {via}); {}",
                            evidence()
                        ));
                    }
                }
            }
        }
    }

    /// Every check of a finished round. Counts duplicates and lost
    /// operations into the summary; `Err` describes every violation.
    async fn check(
        &self,
        journal: &JournalAt,
        providers: &Providers,
        summary: &mut Summary,
    ) -> Result<(), String> {
        let mut problems = Vec::new();
        // A request a killed worker sent may still be in a provider.
        providers.settled().await;

        // 1. The providers' ledgers, by business identity.
        let charges = providers.payments().ledger();
        let emails = providers.email().ledger();
        let tickets = providers.tickets().ledger();
        let wires = providers.wire().ledger();
        for &order in &self.orders {
            for tool in EFFECT_TOOLS {
                let n = shop::effects(providers, tool, order);
                if n > 1 {
                    summary.duplicates += n as u64 - 1;
                    problems.push(format!(
                        "DUPLICATE: {tool} applied {n} times for order {order}: {}",
                        ledger_evidence(providers, tool, order)
                    ));
                } else if n == 0 {
                    summary.lost += 1;
                    problems.push(format!(
                        "LOST: {tool} never applied for order {order} although its workflow completed"
                    ));
                }
            }
        }
        let shipped: Vec<u64> = match self.sagas {
            true => self.orders.iter().map(|&o| sagas::saga_order(o)).collect(),
            false => Vec::new(),
        };
        let ours = |order: u64| self.orders.contains(&order) || shipped.contains(&order);
        // The sagas' couriers and supplier wires, found by identity.
        let of_sagas = |tool: &str| -> usize {
            shipped
                .iter()
                .map(|&o| shop::saga_effects(providers, tool, o))
                .sum()
        };
        let strays = charges.iter().filter(|c| !ours(c.order_id)).count()
            + emails.len().saturating_sub(self.orders.len())
            + tickets
                .len()
                .saturating_sub(self.orders.len() + of_sagas("book_courier"))
            + wires
                .len()
                .saturating_sub(self.orders.len() + of_sagas("pay_supplier"));
        if strays > 0 && problems.is_empty() {
            problems.push(format!("{strays} effects that belong to no order"));
        }
        for d in providers.duplicates() {
            problems.push(format!(
                "DUPLICATE (provider's own count): {} {} x{}",
                d.provider, d.operation, d.count
            ));
        }

        // 2. The journal: reopens, nothing parked, one commit per operation.
        let rt = match journal.open().await {
            Ok(rt) => {
                summary.repairs += journal.repairs();
                rt
            }
            Err((clear, e)) => {
                let what = format!("the journal did not reopen: {e}");
                if self.config.power_cut_mode() {
                    self.judge_unopenable(clear, &what, summary)?;
                }
                return Err(what);
            }
        };
        match rt.escalations().await {
            Ok(open) if open.is_empty() => {}
            Ok(open) => problems.push(format!(
                "{} escalations left open: {:?}",
                open.len(),
                open.iter().map(|e| e.key.to_string()).collect::<Vec<_>>()
            )),
            Err(e) => problems.push(format!("escalations(): {e}")),
        }
        let mut commits: BTreeMap<(String, String), u32> = BTreeMap::new();
        let (mut escalated, mut resolved) = (0u64, 0u64);
        let events = match rt.audit(0).await {
            Ok(events) => events,
            Err(e) => {
                problems.push(format!("unreadable audit stream: {e}"));
                Vec::new()
            }
        };
        for event in &events {
            match &event.kind {
                EventKind::Committed { .. } => {
                    *commits
                        .entry((event.root_run.clone(), event.tool.clone()))
                        .or_default() += 1;
                }
                EventKind::Resolved { .. } => resolved += 1,
                EventKind::Escalated { .. } => escalated += 1,
                _ => {}
            }
        }
        for &order in &self.orders {
            let run = root_run(&self.prefix, order);
            for tool in EFFECT_TOOLS {
                let n = commits
                    .get(&(run.clone(), tool.to_string()))
                    .copied()
                    .unwrap_or(0);
                summary.audited_commits += u64::from(n);
                if n == 0 {
                    summary.audit_gaps += 1;
                }
                if n != 1 {
                    problems.push(format!(
                        "AUDIT: the durable audit stream shows {n} commits of {tool} for order \
                         {order}, expected 1"
                    ));
                }
            }
        }
        if escalated != resolved {
            problems.push(format!(
                "{escalated} escalations in the audit stream but {resolved} resolutions"
            ));
        }
        if self.sagas {
            sagas::check(
                &self.orders,
                &self.prefix,
                providers,
                &events,
                &self
                    .approver
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
                summary,
                &mut problems,
            );
            let mut writers = self.writers.clone();
            writers.push(rt.owner().to_string());
            self.check_returns(&rt, &events, &writers, providers, summary, &mut problems)
                .await;
        }
        match rt.stats().await {
            Ok(stats) => {
                for s in stats.tools.values() {
                    summary.recoveries += s.recoveries;
                    summary.verifications += s.verifications;
                    summary.provider_replays += s.provider_replays;
                    summary.dedupe_hits += s.dedupe_hits;
                    summary.retries += s.retries;
                }
            }
            Err(e) => problems.push(format!("stats(): {e}")),
        }

        // 3. The journal says committed: a last run of every workflow
        // replays everything and sends nothing.
        providers.payments().faults().clear();
        providers.email().faults().clear();
        providers.tickets().faults().clear();
        providers.wire().faults().clear();
        let sent = Arc::new(AtomicU64::new(0));
        let hook: shop::Hook = {
            let sent = sent.clone();
            Arc::new(move |moment, _, _| {
                if moment == Moment::Sending {
                    sent.fetch_add(1, Ordering::SeqCst);
                }
            })
        };
        // Each request here is an operation the journal did not know as
        // committed: counted as lost (and as duplicated if it lands twice).
        let replay = Arc::new(Shop::with_hook(providers.addrs(), hook));
        let before = ledger_sizes(providers);
        for &order in &self.orders {
            let ctx = rt.run(&root_run(&self.prefix, order));
            if let Err(stopped) = replay.process_order(&ctx, order, &mut |_| {}).await {
                problems.push(format!("replaying order {order} failed: {stopped}"));
            }
        }
        if self.sagas {
            sagas::replay(&rt, &self.orders, &self.prefix, &replay, &mut problems).await;
        }
        if self.config.power_cut_mode() {
            // The archives (large results, sled blob files): each call
            // returned in a worker, so each must replay from the journal.
            for &order in &self.orders {
                let ctx = rt.run(&root_run(&self.prefix, order));
                let runs = ARCHIVE_RUNS.load(Ordering::SeqCst);
                let outcome = archive_order(&ctx, order).await;
                let reran = ARCHIVE_RUNS.load(Ordering::SeqCst) != runs;
                match outcome {
                    Ok(body) if body == archive_body(order) && !reran => {
                        summary.large_results += 1;
                    }
                    Ok(body) => {
                        summary.lost += 1;
                        problems.push(format!(
                            "LOST: the archive of order {order} ({} bytes) {}",
                            body.len(),
                            if reran {
                                "was not in the journal although its call had returned"
                            } else {
                                "replayed other bytes"
                            }
                        ));
                    }
                    Err(e) => {
                        summary.lost += 1;
                        problems.push(format!(
                            "LOST: the committed archive of order {order} does not replay: {e}"
                        ));
                    }
                }
            }
        }
        if sent.load(Ordering::SeqCst) != 0 || ledger_sizes(providers) != before {
            summary.lost += sent.load(Ordering::SeqCst).max(1);
            problems.push(format!(
                "replaying finished workflows called providers {} times (ledgers {before:?} -> {:?})",
                sent.load(Ordering::SeqCst),
                ledger_sizes(providers)
            ));
        }

        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("\n"))
        }
    }
}

/// Runs a future, turning a panic inside it into `Err(message)`: sled
/// 0.34 panics on some damage a power cut leaves, and the parent must live
/// to count it.
struct CatchPanic<'a, T>(std::pin::Pin<Box<dyn std::future::Future<Output = T> + 'a>>);

impl<T> std::future::Future for CatchPanic<'_, T> {
    type Output = Result<T, String>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let inner = &mut self.0;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inner.as_mut().poll(cx))) {
            Ok(std::task::Poll::Ready(v)) => std::task::Poll::Ready(Ok(v)),
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Err(panic) => std::task::Poll::Ready(Err(panic_text(&panic))),
        }
    }
}

fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// Opens the journal in the parent. After a power cut the storage under it
/// may be damaged in ways that make sled 0.34 panic instead of failing; a
/// panic is caught here (and reported as no clear error: `false`) so that
/// the harness lives to count it.
fn open_journal(journal: &Path) -> Result<Runtime, (bool, String)> {
    match std::panic::catch_unwind(|| Runtime::open(journal)) {
        Ok(Ok(rt)) => Ok(rt),
        Ok(Err(e)) => Err((true, e.to_string())),
        Err(panic) => Err((
            false,
            format!("opening the journal panicked: {}", panic_text(&panic)),
        )),
    }
}

/// Where the parent finds a round's journal (as the operator, and for the
/// checks).
enum JournalAt {
    Dir(PathBuf),
    /// A database's URL, and whether its server must have a synchronous
    /// standby (`PostgresOptions::synchronous_standby`).
    Postgres(String, bool),
}

impl JournalAt {
    /// Opens it; `Err((clear, why))` as [`open_journal`].
    /// How many times sled's files were set aside and rebuilt (sled
    /// journals only).
    fn repairs(&self) -> u64 {
        match self {
            JournalAt::Dir(dir) => std::fs::read_dir(dir).map_or(0, |entries| {
                entries
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("sled-damaged."))
                    .count() as u64
            }),
            JournalAt::Postgres(..) => 0,
        }
    }

    async fn open(&self) -> Result<Runtime, (bool, String)> {
        match self {
            JournalAt::Dir(dir) => open_journal(dir),
            JournalAt::Postgres(url, synchronous) => {
                let mut builder = Runtime::builder()
                    .postgres(url.as_str())
                    .worker_id("operator");
                if *synchronous {
                    builder = builder.postgres_options(
                        idem::PostgresOptions::default().synchronous_standby(true),
                    );
                }
                builder.connect().await.map_err(|e| (true, e.to_string()))
            }
        }
    }
}

/// `OPENED audit events=N ...` → N.
fn audit_events(opened: &str) -> Option<u64> {
    opened
        .split_whitespace()
        .find_map(|w| w.strip_prefix("events="))
        .and_then(|n| n.parse().ok())
}

/// The operator's answer to a journal that refused to open and never
/// acknowledged anything: remove it (durably) so the next worker creates
/// it anew.
fn remove_journal(disk: &PowerCutFs, journal: &Path) -> Result<(), String> {
    match std::fs::remove_dir_all(journal) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("remove the refused journal: {e}")),
    }
    std::fs::File::open(disk.mountpoint())
        .and_then(|d| d.sync_all())
        .map_err(|e| format!("sync the disk's root: {e}"))
}

/// Creates the journal and makes every file and directory of it durable,
/// its entry in the disk's root included (see
/// [`Config::sync_new_journal`]).
fn create_synced(disk: &PowerCutFs, journal: &Path) -> Result<(), String> {
    drop(open_journal(journal).map_err(|(_, e)| format!("create the journal: {e}"))?);
    fn sync_tree(path: &Path) -> std::io::Result<()> {
        if path.is_dir() {
            for entry in std::fs::read_dir(path)? {
                sync_tree(&entry?.path())?;
            }
        }
        std::fs::File::open(path)?.sync_all()
    }
    sync_tree(journal)
        .and_then(|()| std::fs::File::open(disk.mountpoint())?.sync_all())
        .map_err(|e| format!("sync the new journal: {e}"))
}

/// Every record of every provider's ledger, counted by kind: charges,
/// emails, tickets, wires, refunds, cancellations.
fn ledger_sizes(p: &Providers) -> [usize; 6] {
    [
        p.payments().ledger().len(),
        p.email().ledger().len(),
        p.tickets().ledger().len(),
        p.wire().ledger().len(),
        p.refunds().len(),
        p.cancellations().len(),
    ]
}

fn ledger_evidence(providers: &Providers, tool: &str, order: u64) -> String {
    let book = shop::order_book(order);
    let json = match tool {
        "charge" => serde_json::to_string(
            &providers
                .payments()
                .ledger()
                .into_iter()
                .filter(|c| c.order_id == order)
                .collect::<Vec<_>>(),
        ),
        "send_email" => serde_json::to_string(
            &providers
                .email()
                .ledger()
                .into_iter()
                .filter(|m| m.to == book.email)
                .collect::<Vec<_>>(),
        ),
        "open_ticket" => serde_json::to_string(
            &providers
                .tickets()
                .ledger()
                .into_iter()
                .filter(|t| t.title == shop::ticket_title(order))
                .collect::<Vec<_>>(),
        ),
        _ => serde_json::to_string(
            &providers
                .wire()
                .ledger()
                .into_iter()
                .filter(|w| w.reference == shop::wire_reference(order))
                .collect::<Vec<_>>(),
        ),
    };
    json.unwrap_or_default()
}

/// `DONE <done> <parked> <failed>` → (done, parked).
fn parse_done(status: &str) -> Option<(u64, u64)> {
    let line = status.lines().rev().find(|l| l.starts_with("DONE "))?;
    let mut it = line.split_whitespace().skip(1);
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// The operator's decision for one escalation: look the effect up at the
/// provider (by the key it carried, or for the wire by its payment
/// reference); `Landed` with the provider's record if it is there,
/// `Reissue` if it is not.
fn decide(esc: &Escalation, providers: &Providers) -> Result<(Resolution, String), String> {
    let key = esc.key.to_string();
    let landed: Option<serde_json::Value> = match esc.tool.as_str() {
        // The order workflow's charge and the saga's: both under our key.
        "charge" | "pay" => providers
            .payments()
            .ledger()
            .into_iter()
            .find(|c| {
                c.idempotency_key.as_deref() == Some(&key) && c.outcome == ChargeOutcome::Succeeded
            })
            .map(|c| serde_json::to_value(charge_of(c)))
            .transpose()
            .map_err(|e| e.to_string())?,
        "send_email" => providers
            .email()
            .ledger()
            .into_iter()
            .find(|m| m.key.as_deref() == Some(&key))
            .map(serde_json::to_value)
            .transpose()
            .map_err(|e| e.to_string())?,
        // The support ticket and the saga's courier: our key as reference.
        "open_ticket" | "book_courier" => providers
            .tickets()
            .ledger()
            .into_iter()
            .find(|t| t.external_ref == key)
            .map(serde_json::to_value)
            .transpose()
            .map_err(|e| e.to_string())?,
        "refund_wire" | "pay_supplier" => {
            let order = esc.args["order_id"]
                .as_u64()
                .ok_or_else(|| format!("escalation without order_id: {}", esc.args))?;
            let reference = match esc.tool.as_str() {
                "refund_wire" => shop::wire_reference(order),
                _ => shop::supplier_reference(order),
            };
            providers
                .wire()
                .ledger()
                .into_iter()
                .find(|w| w.reference == reference)
                .map(serde_json::to_value)
                .transpose()
                .map_err(|e| e.to_string())?
        }
        "refund" => providers
            .refunds()
            .into_iter()
            .find(|r| r.idempotency_key.as_deref() == Some(&key))
            .map(|r| {
                serde_json::to_value(idem_testkit::Refund {
                    id: r.refund_id,
                    charge: r.charge_id,
                    amount: r.amount,
                    created_ms: r.at_ms,
                    replayed: false,
                })
            })
            .transpose()
            .map_err(|e| e.to_string())?,
        "cancel_courier" => providers
            .cancellations()
            .into_iter()
            .find(|c| c.reference == key)
            .map(serde_json::to_value)
            .transpose()
            .map_err(|e| e.to_string())?,
        other => return Err(format!("escalation of an unknown tool {other}")),
    };
    Ok(match landed {
        Some(result) => (
            Resolution::Landed(Some(result)),
            format!("{} found it in the provider's ledger", esc.tool),
        ),
        None => (
            Resolution::Reissue,
            format!("{}: not in the provider's ledger after settling", esc.tool),
        ),
    })
}

/// The charge the payments provider answered for a record of its ledger.
fn charge_of(c: idem_testkit::ChargeRecord) -> Charge {
    Charge {
        id: c.charge_id,
        amount: c.amount,
        currency: c.currency,
        order_id: c.order_id,
        customer: c.customer,
        status: "succeeded".into(),
        created_ms: c.at_ms,
        replayed: false,
    }
}

/// The fault mix of a chaos round. The wire gets no 429s or outages: an
/// at_most_once tool retries those with the default policy (1 s initial
/// backoff, not tunable there), which only slows the harness down.
fn chaos(seed: u64, reads: bool, wire: bool) -> Chaos {
    let mut c = Chaos::new(seed);
    c.rate_limit = if wire { 0.0 } else { 0.03 };
    c.retry_after_secs = 0;
    c.error_before_apply = 0.04;
    c.error_after_apply = 0.04;
    c.timeout_after_apply = 0.02;
    c.disconnect_after_apply = 0.04;
    c.delay = 0.08;
    c.max_delay = CHAOS_MAX_DELAY;
    c.outage = if wire { 0.0 } else { 0.01 };
    c.outage_duration = Duration::from_millis(60);
    c.reads = reads;
    c
}
