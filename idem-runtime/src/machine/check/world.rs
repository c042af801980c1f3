//! The world the checker runs call machines in: one key's record in a
//! journal that knows what is durable, the processes and their leader
//! tables and caches, the drivers, a provider that counts effects, an
//! operator, and a clock that moves only when someone sleeps or waits.
//! Every value here is plain data, so that a world can be cloned, hashed
//! and compared: exploring means trying every successor of every world.

use std::time::Duration;

use idem_journal::class::{Class, OnDrift};
use idem_journal::journal::{Claim, Durability, Owner};
use idem_journal::record::{Blob, OpRecord, State, Via};

use crate::failure::Failure;
use crate::machine::call::{
    Action, Answer, Attempted, Call, Called, ClaimOp, Env, Found, Input, Outcome, Revert, Stored,
    ValueFrom, WriteOp,
};
use crate::machine::policy::{Policy, Setup};
use crate::machine::resolve::{self, Decision};
use crate::retry::RetryPolicy;

/// How the journal is shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sharing {
    /// One process (sled): claims are never live, the leader table says
    /// who drives; a crash loses what was not durable.
    Local,
    /// A database shared by two processes (PostgreSQL): claims are leases,
    /// live while their process is; a process crash loses nothing written,
    /// a lease may expire while its owner is paused in a write.
    Shared,
}

/// One configuration to explore.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The tool's rules.
    pub policy: Policy,
    /// How the journal is shared.
    pub sharing: Sharing,
    /// Calls that may start (two may run at once).
    pub calls: u8,
    /// Crashes that may happen.
    pub crashes: u8,
    /// Journal faults (a failed read, write or append) that may happen.
    pub faults: u8,
    /// Operator resolutions that may happen (and decisions on approvals).
    pub resolutions: u8,
    /// Every call needs a person's approval (`approve = "always"`).
    pub approval: bool,
}

impl std::fmt::Display for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} {:?}, {} attempts, verify {}, commit {:?}, approval {} (wait {} ms); {} calls, {} crashes, {} faults, {} resolutions",
            self.policy.class,
            self.sharing,
            self.policy.retry.max_attempts,
            self.policy.verify,
            self.policy.commit,
            self.approval,
            self.policy.approval_wait_ms,
            self.calls,
            self.crashes,
            self.faults,
            self.resolutions
        )
    }
}

impl Config {
    /// A tool of `class` with at most `max_attempts` attempts.
    pub fn tool(class: Class, max_attempts: u32, verify: bool, commit: Durability) -> Policy {
        Policy {
            class,
            retry: RetryPolicy {
                max_attempts,
                initial: Duration::from_millis(10),
                backoff: 2.0,
                max_interval: Duration::from_millis(40),
                max_elapsed: Some(Duration::from_millis(60)),
                jitter: false,
            },
            // The second attempt after a backoff (10 ms) is already past it:
            // a shallow bound reaches an expired window.
            dedupe_window: Duration::from_millis(10),
            timeout: Some(Duration::from_millis(5)),
            on_drift: OnDrift::Replay,
            drift_reject: &[],
            verify,
            commit,
            approval_wait_ms: 0,
        }
    }
}

/// The one key's record as the journal holds it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Stored_ {
    pub rec: OpRecord,
    pub version: u64,
    pub epoch: u64,
    /// The process that claims it, and its incarnation.
    pub owner: Option<(u8, u64)>,
}

/// A process: its incarnation, whether it runs, its leader and cache.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Process {
    pub incarnation: u64,
    pub alive: bool,
    /// The driver leading the key here.
    pub leader: Option<u8>,
    /// Whether the leader that last left shared its error.
    pub left_shared: bool,
    /// A committed result in the process's replay cache: (generation,
    /// bytes).
    pub cached: Option<(u32, Blob)>,
}

/// A driver: a call machine and its pending action.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Driver {
    pub id: u8,
    pub process: u8,
    pub machine: Call,
    /// The action it executes next (`None`: returned or died).
    pub pending: Option<Action>,
    pub done: Option<Outcome>,
    pub dead: bool,
    /// The value it holds (bytes), for the return check.
    pub value: Option<Blob>,
    /// It was told an INTENT of (generation, attempts) is durable.
    pub acked_intent: Option<(u32, u32)>,
    /// The kind of the last write it sent: (durability, state name,
    /// generation, attempts).
    pub writing: Option<(Durability, &'static str, u32, u32)>,
    /// The lease of its claim ran out while its write was in flight.
    pub slow: bool,
    /// Whether it holds a journal error.
    pub faulted: bool,
    /// Whether its last attempt's error was shared by its leader.
    pub shared_error: bool,
    /// The record's state as it last read or wrote it: what it decides
    /// from.
    pub seen: Option<State>,
    /// It waited for a concurrent call of its key (in its process or
    /// elsewhere): what that call decided is its outcome too.
    pub waited: bool,
}

/// What the world remembers for the invariants.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Facts {
    /// Attempts that reached the provider, per generation, in the current
    /// decision (reset by a new decision: a reissue, a restart after a
    /// failure).
    pub attempts: Vec<u32>,
    /// Effects that landed, per generation.
    pub effects: Vec<u32>,
    /// When the current decision's first attempt was made, per generation.
    pub first_ms: Vec<Option<u64>>,
    /// When the generation's key was first sent.
    pub key_sent_ms: Vec<Option<u64>>,
    /// An attempt of the generation may have landed.
    pub maybe_landed: Vec<bool>,
    /// `verify` said landed or could not tell, for the generation's
    /// current decision.
    pub verify_stopped: Vec<bool>,
    /// The result the generation committed (durably), if any.
    pub committed: Vec<Option<Blob>>,
    /// An operator resolved the generation.
    pub operated: Vec<bool>,
    /// An operator decided the generation's approval.
    pub decided: Vec<bool>,
    /// An operator approved the generation.
    pub approved: Vec<bool>,
}

impl Facts {
    fn grow(&mut self, g: u32) {
        let n = g as usize + 1;
        if self.attempts.len() < n {
            self.attempts.resize(n, 0);
            self.effects.resize(n, 0);
            self.first_ms.resize(n, None);
            self.key_sent_ms.resize(n, None);
            self.maybe_landed.resize(n, false);
            self.verify_stopped.resize(n, false);
            self.committed.resize(n, None);
            self.operated.resize(n, false);
            self.decided.resize(n, false);
            self.approved.resize(n, false);
        }
    }
}

/// A world.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct World {
    pub now: u64,
    pub visible: Option<Stored_>,
    pub durable: Option<Stored_>,
    pub next_version: u64,
    pub processes: Vec<Process>,
    pub drivers: Vec<Driver>,
    pub calls_left: u8,
    pub crashes_left: u8,
    pub faults_left: u8,
    pub resolutions_left: u8,
    pub facts: Facts,
}

/// One step from a world to a successor, as the trace shows it.
#[derive(Debug, Clone)]
pub enum Move {
    /// A driver executed its action and got this input.
    Ran {
        driver: u8,
        action: String,
        input: String,
    },
    /// A call started in a process.
    Started { driver: u8, process: u8 },
    /// A process crashed.
    Crashed { process: u8, landed: bool },
    /// An operator resolved the record.
    Resolved(String),
}

impl std::fmt::Display for Move {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Move::Ran {
                driver,
                action,
                input,
            } => write!(f, "driver {driver}: {action}  =>  {input}"),
            Move::Started { driver, process } => {
                write!(f, "call {driver} starts in process {process}")
            }
            Move::Crashed { process, landed } => write!(
                f,
                "process {process} crashes{}",
                if *landed {
                    " (its attempt in flight lands)"
                } else {
                    ""
                }
            ),
            Move::Resolved(how) => write!(f, "operator resolves: {how}"),
        }
    }
}

/// A broken invariant.
#[derive(Debug, Clone)]
pub struct Violation(pub String);

pub(crate) const TOOL: &str = "tool";

fn called() -> Called {
    Called {
        tool: TOOL.into(),
        class: Class::Provider,
        root_run: "run".into(),
        scope: Vec::new(),
        fingerprint: [7; 32],
        args: "{}".into(),
        approval: None,
    }
}

impl World {
    /// The world before anything happens.
    pub fn new(config: &Config) -> World {
        let processes = match config.sharing {
            Sharing::Local => 1,
            Sharing::Shared => 2,
        };
        World {
            now: 1_000,
            visible: None,
            durable: None,
            next_version: 1,
            processes: (0..processes)
                .map(|p| Process {
                    incarnation: 1 + p as u64 * 100,
                    alive: true,
                    leader: None,
                    left_shared: false,
                    cached: None,
                })
                .collect(),
            drivers: Vec::new(),
            calls_left: config.calls,
            crashes_left: config.crashes,
            faults_left: config.faults,
            resolutions_left: config.resolutions,
            facts: Facts::default(),
        }
    }

    fn setup(&self, process: u8, config: &Config) -> Setup {
        let p = &self.processes[process as usize];
        Setup {
            owner: owner(process, p.incarnation),
            claim_first: config.sharing == Sharing::Shared,
            renewal_ms: (config.sharing == Sharing::Shared).then_some(10),
            in_flight_wait_ms: 100,
        }
    }

    fn running(&self) -> usize {
        self.drivers
            .iter()
            .filter(|d| d.done.is_none() && !d.dead)
            .count()
    }

    /// Every successor of this world.
    pub fn successors(&self, config: &Config) -> Result<Vec<(Move, World)>, Violation> {
        let mut out = Vec::new();
        for i in 0..self.drivers.len() {
            if self.drivers[i].pending.is_some() {
                self.run_driver(i, config, &mut out)?;
            }
        }
        if self.calls_left > 0 && self.running() < 2 {
            for p in 0..self.processes.len() {
                // Two calls of one process lead in turn; in a shared
                // journal, one call per process.
                let busy = self
                    .drivers
                    .iter()
                    .any(|d| d.process as usize == p && d.done.is_none() && !d.dead);
                if config.sharing == Sharing::Shared && busy {
                    continue;
                }
                let mut w = self.clone();
                let id = w.drivers.len() as u8;
                w.calls_left -= 1;
                w.processes[p].alive = true;
                let mut machine = Call::new(Called {
                    class: config.policy.class,
                    approval: config.approval.then(|| "always".into()),
                    ..called()
                });
                let cached = w.processes[p].cached.clone();
                let setup = w.setup(p as u8, config);
                let action = machine.step(
                    &config.policy,
                    &setup,
                    Env {
                        now: w.now,
                        jitter: 0.0,
                    },
                    Input::Start {
                        cached: cached.as_ref().map(|c| c.0),
                        args_len: 2,
                    },
                );
                w.drivers.push(Driver {
                    id,
                    process: p as u8,
                    machine,
                    pending: Some(action),
                    done: None,
                    dead: false,
                    value: cached.map(|c| c.1),
                    acked_intent: None,
                    writing: None,
                    slow: false,
                    waited: false,
                    faulted: false,
                    shared_error: false,
                    seen: None,
                });
                out.push((
                    Move::Started {
                        driver: id,
                        process: p as u8,
                    },
                    w,
                ));
                if config.sharing == Sharing::Local {
                    break;
                }
            }
        }
        if self.crashes_left > 0 {
            for p in 0..self.processes.len() {
                let has = self
                    .drivers
                    .iter()
                    .any(|d| d.process as usize == p && d.done.is_none() && !d.dead);
                if !has {
                    continue;
                }
                let attempting = self.drivers.iter().any(|d| {
                    d.process as usize == p
                        && !d.dead
                        && matches!(d.pending, Some(Action::Attempt { .. }))
                });
                for landed in [false, true] {
                    if landed && !attempting {
                        continue;
                    }
                    let mut w = self.clone();
                    w.crash(p as u8, landed, config);
                    out.push((
                        Move::Crashed {
                            process: p as u8,
                            landed,
                        },
                        w,
                    ));
                }
            }
        }
        if self.resolutions_left > 0 {
            if let Some(s) = &self.visible {
                if let Ok(previous) = resolve::admissible(&s.rec) {
                    let g = s.rec.generation;
                    for (label, decision) in [
                        ("landed", Decision::Landed(result_of(g, 9))),
                        ("reissue", Decision::Reissue),
                        ("abandon", Decision::Abandon),
                    ] {
                        let mut w = self.clone();
                        w.resolutions_left -= 1;
                        let (rec, _events) = resolve::apply(
                            s.rec.clone(),
                            previous.clone(),
                            decision,
                            "note",
                            w.now,
                        );
                        w.facts.grow(g);
                        w.facts.operated[g as usize] = true;
                        if label == "reissue" {
                            // A new decision: its budget and verify's
                            // answers start afresh.
                            w.facts.attempts[g as usize] = 0;
                            w.facts.verify_stopped[g as usize] = false;
                            w.facts.first_ms[g as usize] = None;
                            w.facts.maybe_landed[g as usize] = false;
                        }
                        w.apply_write(rec, None, true, Some(s.version))
                            .expect("the operator's write is at the version it read");
                        out.push((Move::Resolved(label.into()), w));
                    }
                }
                for (label, approved) in [("approve", true), ("reject", false)] {
                    let Ok((rec, _events)) =
                        resolve::decide(s.rec.clone(), approved, "note", "runtime", self.now)
                    else {
                        continue;
                    };
                    let mut w = self.clone();
                    w.resolutions_left -= 1;
                    let g = rec.generation as usize;
                    w.facts.grow(rec.generation);
                    w.facts.decided[g] = true;
                    w.facts.approved[g] = approved;
                    w.apply_write(rec, None, true, Some(s.version))
                        .expect("the operator's write is at the version it read");
                    out.push((Move::Resolved(label.into()), w));
                }
            }
        }
        Ok(out)
    }

    fn crash(&mut self, p: u8, landed: bool, config: &Config) {
        self.crashes_left -= 1;
        for d in self.drivers.iter_mut() {
            if d.process == p && d.done.is_none() && !d.dead {
                if landed {
                    if let Some(Action::Attempt { generation, .. }) = d.pending {
                        self.facts.grow(generation);
                        self.facts.effects[generation as usize] += 1;
                        self.facts.maybe_landed[generation as usize] = true;
                    }
                }
                d.dead = true;
                d.pending = None;
            }
        }
        let proc = &mut self.processes[p as usize];
        proc.leader = None;
        proc.cached = None;
        proc.incarnation += 1;
        proc.alive = true;
        if config.sharing == Sharing::Local {
            // The journal lives in the process: what was not durable is
            // gone.
            self.visible = self.durable.clone();
        }
    }

    /// The claim as a driver of `process` loads it.
    fn claim_of(&self, s: &Stored_, config: &Config) -> Option<Claim> {
        s.owner.map(|(p, incarnation)| {
            let proc = &self.processes[p as usize];
            let live = config.sharing == Sharing::Shared
                && proc.incarnation == incarnation
                && self
                    .drivers
                    .iter()
                    .any(|d| d.process == p && !d.dead && !d.slow);
            Claim {
                owner: owner(p, incarnation),
                live,
            }
        })
    }

    fn found(&self, config: &Config) -> Option<Box<Found>> {
        self.visible.as_ref().map(|s| {
            Box::new(Found {
                rec: s.rec.clone(),
                version: s.version,
                claim: self.claim_of(s, config),
            })
        })
    }

    /// Applies a write whose condition holds; `Err` if it does not.
    fn apply_write(
        &mut self,
        rec: OpRecord,
        claim: Option<(ClaimOp, u8)>,
        immediate: bool,
        expect: Option<u64>,
    ) -> Result<(u64, u64), ()> {
        let current = self.visible.as_ref().map(|s| s.version);
        if current != expect {
            return Err(());
        }
        let (epoch, owner) = match (&self.visible, claim) {
            (old, Some((ClaimOp::Take, p))) => (
                old.as_ref().map_or(0, |s| s.epoch) + 1,
                Some((p, self.processes[p as usize].incarnation)),
            ),
            (Some(old), Some((ClaimOp::Keep, _))) => (old.epoch, old.owner),
            (None, Some((ClaimOp::Keep, _))) => (0, None),
            (old, _) => (old.as_ref().map_or(0, |s| s.epoch), None),
        };
        let version = self.next_version;
        self.next_version += 1;
        let g = rec.generation;
        self.facts.grow(g);
        self.visible = Some(Stored_ {
            rec,
            version,
            epoch,
            owner,
        });
        if immediate {
            // Never durable out of order: everything before is, too.
            self.durable = self.visible.clone();
        }
        Ok((version, epoch))
    }

    fn run_driver(
        &self,
        i: usize,
        config: &Config,
        out: &mut Vec<(Move, World)>,
    ) -> Result<(), Violation> {
        let d = &self.drivers[i];
        let action = d.pending.clone().expect("a pending action");
        let p = d.process;
        let text = describe_action(&action);
        let mut branch = |w: World, input: Input| -> Result<(), Violation> {
            let mut w = w;
            let shown = describe_input(&input);
            w.feed(i, input, config)?;
            out.push((
                Move::Ran {
                    driver: d.id,
                    action: text.clone(),
                    input: shown,
                },
                w,
            ));
            Ok(())
        };
        match action {
            Action::Lead => {
                let mut w = self.clone();
                w.leave(i);
                let proc = &mut w.processes[p as usize];
                if proc.leader.is_none() {
                    proc.leader = Some(d.id);
                    branch(w, Input::Led)?;
                } else {
                    w.drivers[i].waited = true;
                    branch(w, Input::Busy)?;
                }
            }
            Action::AwaitLeader { until } => {
                let proc = &self.processes[p as usize];
                if proc.leader.is_none() {
                    let shared = proc.left_shared;
                    branch(
                        self.clone(),
                        Input::LeaderLeft {
                            shared_error: shared,
                        },
                    )?;
                }
                let mut w = self.clone();
                w.now = w.now.max(until);
                branch(w, Input::TimedOut)?;
            }
            Action::AwaitChange { version, until } => {
                let mut w = self.clone();
                w.leave(i);
                w.drivers[i].waited = true;
                let moved = w.visible.as_ref().map(|s| s.version) != Some(version)
                    || w.visible
                        .as_ref()
                        .and_then(|s| w.claim_of(s, config))
                        .is_some_and(|c| !c.live);
                if moved {
                    branch(w.clone(), Input::Changed)?;
                }
                w.now = w.now.max(until);
                branch(w, Input::TimedOut)?;
            }
            Action::Read | Action::Revert(Revert::Read) => {
                let found = self.found(config);
                branch(self.clone(), Input::Found(found))?;
                if self.faults_left > 0 && matches!(action, Action::Read) {
                    let mut w = self.clone();
                    w.faults_left -= 1;
                    w.drivers[i].faulted = true;
                    branch(w, Input::ReadFailed)?;
                }
            }
            Action::Write(op) => self.write(i, *op, config, &mut branch)?,
            Action::Revert(Revert::Remove { version }) => {
                let mut w = self.clone();
                let removed = w.visible.as_ref().map(|s| s.version) == Some(version);
                if removed {
                    w.visible = None;
                    w.durable = None;
                }
                branch(w, Input::Removed(removed))?;
            }
            Action::Revert(Revert::Write(op)) => {
                let mut w = self.clone();
                let claim = match op.claim {
                    ClaimOp::Keep => Some((ClaimOp::Keep, p)),
                    _ => None,
                };
                let ok = w
                    .apply_write(OpRecord::clone(&op.rec), claim, true, op.expect)
                    .is_ok();
                branch(w, Input::Removed(ok))?;
            }
            Action::Emit(_) => {
                branch(self.clone(), Input::Appended)?;
                if self.faults_left > 0 {
                    let mut w = self.clone();
                    w.faults_left -= 1;
                    w.drivers[i].faulted = true;
                    branch(w, Input::AppendFailed)?;
                }
            }
            Action::EmitBestEffort(_) => branch(self.clone(), Input::Appended)?,
            Action::Attempt {
                attempt,
                generation,
            } => {
                self.check_attempt(i, attempt, generation, config)?;
                let g = generation as usize;
                let mut w = self.clone();
                w.facts.grow(generation);
                w.facts.attempts[g] += 1;
                w.facts.first_ms[g].get_or_insert(w.now);
                w.facts.key_sent_ms[g].get_or_insert(w.now);
                let outcomes: &[(&str, bool)] = &[
                    ("ok", true),
                    ("not_sent", false),
                    ("ambiguous", true),
                    ("ambiguous", false),
                    ("semantic", false),
                    ("timeout", true),
                    ("timeout", false),
                ];
                for &(kind, lands) in outcomes {
                    let mut w = w.clone();
                    if lands {
                        w.facts.effects[g] += 1;
                        // With a truthful verify, a tool the provider does
                        // not deduplicate never lands twice, unless an
                        // operator said to run it again.
                        if config.policy.class != Class::Provider
                            && w.facts.effects[g] > 1
                            && !w.facts.operated[g]
                        {
                            return Err(Violation(format!(
                                "a second effect of generation {g} at the provider (a duplicate)"
                            )));
                        }
                    }
                    if lands || kind != "not_sent" && kind != "semantic" {
                        w.facts.maybe_landed[g] = w.facts.maybe_landed[g] || kind != "ok";
                    }
                    let input = match kind {
                        "ok" => {
                            let value = provider_result(config, generation, w.facts.effects[g]);
                            w.drivers[i].value = Some(value.clone());
                            Input::Attempted(Attempted::Ok {
                                stored: Stored::Bytes(value),
                                provider_replay: false,
                            })
                        }
                        "not_sent" => failed(Failure::not_sent(), true),
                        "ambiguous" => failed(Failure::ambiguous(), true),
                        "semantic" => failed(Failure::Semantic, true),
                        _ => failed(Failure::ambiguous(), false),
                    };
                    branch(w, input)?;
                }
            }
            Action::Verify { generation, .. } => {
                let g = generation as usize;
                let effects = self.facts.effects.get(g).copied().unwrap_or(0);
                let mut answers = vec![
                    Answer::Unknown,
                    Answer::Failed("down".into()),
                    Answer::TimedOut("timed out".into()),
                ];
                // A truthful provider: landed when an effect did.
                if effects > 0 {
                    answers.push(Answer::Landed(Stored::Bytes(provider_result(
                        config, generation, 1,
                    ))));
                } else {
                    answers.push(Answer::NotLanded);
                }
                for answer in answers {
                    let mut w = self.clone();
                    w.facts.grow(generation);
                    match &answer {
                        Answer::Landed(Stored::Bytes(v)) => {
                            w.drivers[i].value = Some(v.clone());
                            w.facts.verify_stopped[g] = true;
                        }
                        Answer::NotLanded => {}
                        _ => w.facts.verify_stopped[g] = true,
                    }
                    branch(w, Input::Verified(answer))?;
                }
            }
            Action::Decode(result) => {
                let mut w = self.clone();
                w.drivers[i].value = Some(result);
                branch(w, Input::Decoded(true))?;
            }
            Action::Sleep { until } => {
                let mut w = self.clone();
                w.now = w.now.max(until);
                branch(w, Input::Slept)?;
            }
            Action::Return { .. } => unreachable!("returns are taken when fed"),
        }
        Ok(())
    }

    fn write(
        &self,
        i: usize,
        op: WriteOp,
        config: &Config,
        branch: &mut dyn FnMut(World, Input) -> Result<(), Violation>,
    ) -> Result<(), Violation> {
        let d = &self.drivers[i];
        let p = d.process;
        let immediate = op.durability == Durability::Immediate;
        let current = self.visible.as_ref().map(|s| s.version);
        let mut base = self.clone();
        base.drivers[i].writing = Some((
            op.durability,
            op.rec.state.name(),
            op.rec.generation,
            op.rec.attempts,
        ));
        if current != op.expect {
            let found = if op.unread { self.found(config) } else { None };
            branch(base.clone(), Input::Conflict(found))?;
        } else {
            // A call that waited for a concurrent one shares its refusal or
            // failure: it never starts a decision of its own from it.
            let replaced = self.visible.as_ref().map(|s| &s.rec.state);
            if d.waited
                && op.rec.state == State::Intent
                && matches!(
                    replaced,
                    Some(State::Rejected { .. } | State::Failed { .. })
                )
            {
                return Err(Violation(format!(
                    "driver {}, which waited for a concurrent call, started a decision of its own \
                     (generation {}) after that call ended {}",
                    d.id,
                    op.rec.generation,
                    replaced.map_or("", State::name)
                )));
            }
            // A request that is written (a claim of a key that exists
            // conflicts instead) must not follow a decision.
            if op.rec.state == State::AwaitingApproval {
                let g = op.rec.generation as usize;
                if self.facts.decided.get(g).copied().unwrap_or(false) {
                    return Err(Violation(format!(
                        "driver {} asks for approval of generation {g} again, after a person \
                         decided it",
                        d.id
                    )));
                }
            }
            let mut w = base.clone();
            w.new_decision(&op.rec);
            let (version, epoch) = w
                .apply_write(
                    OpRecord::clone(&op.rec),
                    Some((op.claim, p)),
                    immediate,
                    op.expect,
                )
                .expect("the condition holds");
            w.note_commit(&op.rec, immediate);
            // A write of a claim renews its lease.
            w.drivers[i].slow = false;
            branch(
                w.clone(),
                Input::Written {
                    version,
                    epoch,
                    took_ms: 0,
                },
            )?;
            // The lease ran out while the write was in flight (its owner
            // was paused): the write happened, and the owner learns it was
            // slow.
            if config.sharing == Sharing::Shared
                && op.claim != ClaimOp::Release
                && self.faults_left > 0
            {
                let mut w = w;
                w.faults_left -= 1;
                w.drivers[i].slow = true;
                branch(
                    w,
                    Input::Written {
                        version,
                        epoch,
                        took_ms: 1_000,
                    },
                )?;
            }
        }
        if self.faults_left > 0 {
            // Refused: nothing written.
            let mut w = base.clone();
            w.faults_left -= 1;
            w.drivers[i].faulted = true;
            branch(w, Input::WriteFailed)?;
            // Written, then reported failed (not durable, not acknowledged).
            if current == op.expect {
                let mut w = base;
                w.faults_left -= 1;
                w.drivers[i].faulted = true;
                w.apply_write(
                    OpRecord::clone(&op.rec),
                    Some((op.claim, p)),
                    false,
                    op.expect,
                )
                .expect("the condition holds");
                branch(w, Input::WriteFailed)?;
            }
        }
        Ok(())
    }

    /// The first INTENT after a failed or reissued operation starts a new
    /// decision: a fresh budget (the key's age still counts from its first
    /// use).
    fn new_decision(&mut self, rec: &OpRecord) {
        let restarted = matches!(
            self.visible.as_ref().map(|s| &s.rec.state),
            Some(State::Failed { .. } | State::Reissue)
        );
        if rec.state == State::Intent && rec.attempts == 1 && restarted {
            let g = rec.generation as usize;
            self.facts.grow(rec.generation);
            self.facts.attempts[g] = 0;
            self.facts.first_ms[g] = None;
            self.facts.verify_stopped[g] = false;
            self.facts.maybe_landed[g] = false;
        }
    }

    /// A committed record that is durable fixes the generation's result.
    fn note_commit(&mut self, rec: &OpRecord, immediate: bool) {
        if let (State::Committed { result, via }, true) = (&rec.state, immediate) {
            if *via != Via::Operator {
                let g = rec.generation as usize;
                self.facts.committed[g].get_or_insert_with(|| result.clone());
            }
        }
    }

    /// The driver leaves its lead.
    fn leave(&mut self, i: usize) {
        let d = &self.drivers[i];
        let proc = &mut self.processes[d.process as usize];
        if proc.leader == Some(d.id) {
            proc.leader = None;
            proc.left_shared = false;
        }
    }

    /// Feeds `input` to driver `i` and takes its next action.
    fn feed(&mut self, i: usize, input: Input, config: &Config) -> Result<(), Violation> {
        let p = self.drivers[i].process;
        let setup = self.setup(p, config);
        if let Input::Written { .. } = &input {
            if let Some((Durability::Immediate, "intent", g, n)) = self.drivers[i].writing {
                self.drivers[i].acked_intent = Some((g, n));
            }
        }
        if let Input::LeaderLeft { shared_error: true } = &input {
            self.drivers[i].shared_error = true;
        }
        match &input {
            Input::Found(Some(f)) | Input::Conflict(Some(f)) => {
                self.drivers[i].seen = Some(f.rec.state.clone())
            }
            Input::Written { .. } => {
                self.drivers[i].seen = self.visible.as_ref().map(|s| s.rec.state.clone())
            }
            _ => {}
        }
        let env = Env {
            now: self.now,
            jitter: 0.0,
        };
        let d = &mut self.drivers[i];
        let action = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            d.machine.step(&config.policy, &setup, env, input)
        }))
        .map_err(|e| {
            Violation(format!(
                "the machine panicked: {}",
                e.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            ))
        })?;
        match action {
            Action::Return {
                outcome,
                remember,
                share,
            } => {
                self.check_return(i, &outcome, config)?;
                let d = &mut self.drivers[i];
                d.pending = None;
                d.done = Some(outcome.clone());
                let id = d.id;
                let value = d.value.clone();
                let generation = d.machine.generation();
                let proc = &mut self.processes[p as usize];
                if proc.leader == Some(id) {
                    proc.leader = None;
                    proc.left_shared = share && outcome == Outcome::Tool;
                }
                if remember {
                    proc.cached = value.map(|v| (generation, v));
                }
            }
            action => self.drivers[i].pending = Some(action),
        }
        Ok(())
    }

    /// Checks what attempt `n` of generation `g` may do.
    fn check_attempt(&self, i: usize, n: u32, g: u32, config: &Config) -> Result<(), Violation> {
        let d = &self.drivers[i];
        let policy = &config.policy;
        // No attempt without an acknowledged, immediate INTENT covering it.
        if d.acked_intent != Some((g, n)) {
            return Err(Violation(format!(
                "attempt {n} of generation {g} started without its INTENT acknowledged at \
                 Immediate durability (acknowledged: {:?})",
                d.acked_intent
            )));
        }
        match &self.durable {
            Some(s)
                if s.rec.generation == g
                    && s.rec.state == State::Intent
                    && s.rec.attempts >= n
                    && s.owner.map(|o| o.0) == Some(d.process) => {}
            other => {
                return Err(Violation(format!(
                    "attempt {n} of generation {g} started, but the durable record is {:?}",
                    other.as_ref().map(|s| (
                        s.rec.state.name(),
                        s.rec.generation,
                        s.rec.attempts,
                        s.owner
                    ))
                )))
            }
        }
        let gi = g as usize;
        if config.approval && !self.facts.approved.get(gi).copied().unwrap_or(false) {
            return Err(Violation(format!(
                "attempt {n} of generation {g} started without a person's approval"
            )));
        }
        let made = self.facts.attempts.get(gi).copied().unwrap_or(0);
        // Time is judged when the attempt was decided: its INTENT's write.
        let decided = self.durable.as_ref().map_or(self.now, |s| s.rec.updated_ms);
        if policy.class == Class::AtMostOnce
            && self.facts.maybe_landed.get(gi).copied().unwrap_or(false)
        {
            return Err(Violation(format!(
                "at_most_once: another attempt of generation {g} after one that may have reached \
                 the provider, without an operator's reissue"
            )));
        }
        if made >= policy.retry.max_attempts {
            return Err(Violation(format!(
                "attempt {} of generation {g} is past the budget of {} attempts",
                made + 1,
                policy.retry.max_attempts
            )));
        }
        if let (Some(first), Some(max)) = (
            self.facts.first_ms.get(gi).copied().flatten(),
            policy.retry.max_elapsed,
        ) {
            if decided.saturating_sub(first) > max.as_millis() as u64 {
                return Err(Violation(format!(
                    "attempt of generation {g} past max_elapsed ({} ms since the first)",
                    decided - first
                )));
            }
        }
        if policy.class == Class::Provider
            && self.facts.maybe_landed.get(gi).copied().unwrap_or(false)
        {
            if let Some(sent) = self.facts.key_sent_ms.get(gi).copied().flatten() {
                if decided.saturating_sub(sent) >= policy.dedupe_window.as_millis() as u64 {
                    return Err(Violation(format!(
                        "provider: a re-run of generation {g} after the dedupe window"
                    )));
                }
            }
        }
        if policy.class == Class::Journal
            && self.facts.verify_stopped.get(gi).copied().unwrap_or(false)
        {
            return Err(Violation(format!(
                "journal: generation {g} re-run after verify said landed or could not tell"
            )));
        }
        Ok(())
    }

    /// What a call returns must be what the journal says.
    fn check_return(&self, i: usize, outcome: &Outcome, _config: &Config) -> Result<(), Violation> {
        let d = &self.drivers[i];
        // What the call decided from, or what the record is now.
        let now = self.visible.as_ref().map(|s| &s.rec.state);
        let state = match (&d.seen, now) {
            (Some(seen), Some(now))
                if std::mem::discriminant(seen) != std::mem::discriminant(now) =>
            {
                if self.consistent(i, outcome, Some(seen)) {
                    Some(seen)
                } else {
                    Some(now)
                }
            }
            _ => now,
        };
        let bad = |why: &str| {
            Err(Violation(format!(
                "driver {} returns {outcome:?}, but the record is {:?}: {why}",
                d.id,
                state.map(State::name)
            )))
        };
        match outcome {
            Outcome::Value(from) => {
                let value = d.value.clone();
                match (state, from) {
                    (_, ValueFrom::Cache) => {
                        let committed = self
                            .facts
                            .committed
                            .iter()
                            .flatten()
                            .any(|c| Some(c) == value.as_ref());
                        let visible = matches!(state, Some(State::Committed { result, .. }) if Some(result) == value.as_ref());
                        if !committed && !visible {
                            return bad("a cached value nobody committed");
                        }
                    }
                    (Some(State::Committed { result, .. }), _)
                        if Some(result) == value.as_ref() => {}
                    _ => return bad("a value the record does not hold"),
                }
                // A result once durable never changes.
                if let (Some(State::Committed { result, via }), Some(s)) = (state, &self.visible) {
                    let g = s.rec.generation as usize;
                    if let Some(Some(first)) = self.facts.committed.get(g) {
                        if first != result && *via != Via::Operator {
                            return bad("the committed result changed");
                        }
                    }
                }
            }
            Outcome::Tool if d.shared_error => {}
            Outcome::Tool | Outcome::TimedOut { .. } => {
                if !matches!(state, Some(State::Rejected { .. } | State::Failed { .. })) {
                    return bad("a refusal or failure the record does not hold");
                }
            }
            Outcome::Escalated { .. } => {
                if !matches!(state, Some(State::Escalated)) {
                    return bad("an escalation the record does not hold");
                }
            }
            Outcome::Abandoned => {
                if !matches!(state, Some(State::Abandoned)) {
                    return bad("an abandonment the record does not hold");
                }
            }
            Outcome::Journal(crate::machine::call::Fault::Rejected { .. })
            | Outcome::Journal(crate::machine::call::Fault::Failed { .. }) => {
                if !matches!(state, Some(State::Rejected { .. } | State::Failed { .. })) {
                    return bad("a shared refusal the record does not hold");
                }
            }
            Outcome::Journal(crate::machine::call::Fault::Journal) => {
                if !d.faulted {
                    return bad("a journal error without a journal fault");
                }
            }
            Outcome::AwaitingApproval => {
                if !matches!(state, Some(State::AwaitingApproval)) {
                    return bad("an approval the record does not await");
                }
            }
            Outcome::NotApproved { .. } => {
                if !matches!(state, Some(State::NotApproved { .. })) {
                    return bad("a refusal of approval the record does not hold");
                }
            }
            Outcome::Journal(_) => return bad("an error the model never causes"),
            Outcome::InFlight | Outcome::ArgsMismatch => {}
        }
        Ok(())
    }

    /// Whether `outcome` is what a record in `state` says.
    fn consistent(&self, i: usize, outcome: &Outcome, state: Option<&State>) -> bool {
        let d = &self.drivers[i];
        match outcome {
            Outcome::Value(_) => {
                matches!(state, Some(State::Committed { result, .. }) if Some(result) == d.value.as_ref())
            }
            Outcome::Tool | Outcome::TimedOut { .. } => {
                matches!(state, Some(State::Rejected { .. } | State::Failed { .. }))
            }
            Outcome::Escalated { .. } => matches!(state, Some(State::Escalated)),
            Outcome::Abandoned => matches!(state, Some(State::Abandoned)),
            Outcome::AwaitingApproval => matches!(state, Some(State::AwaitingApproval)),
            Outcome::NotApproved { .. } => matches!(state, Some(State::NotApproved { .. })),
            _ => false,
        }
    }

    /// Whether nothing can happen any more, and if so whether the end is
    /// one of the tables' rows.
    pub fn check_end(&self) -> Result<(), Violation> {
        if self.drivers.iter().any(|d| d.pending.is_some()) {
            return Err(Violation(
                "a driver has an action nobody can execute (a wedge)".into(),
            ));
        }
        let Some(s) = &self.visible else {
            return Ok(());
        };
        let unfinished = matches!(s.rec.state, State::Intent | State::Waiting);
        // An unfinished record is left only by a call that crashed or
        // failed on the journal; a new call would take it over.
        let excused = self.drivers.iter().any(|d| d.dead || d.faulted)
            || self
                .drivers
                .iter()
                .any(|d| matches!(d.done, Some(Outcome::InFlight)));
        if unfinished && !excused {
            return Err(Violation(format!(
                "every call returned normally, but the record is left {}",
                s.rec.state.name()
            )));
        }
        Ok(())
    }
}

fn owner(process: u8, incarnation: u64) -> Owner {
    Owner {
        worker: std::sync::Arc::from(format!("worker-{process}")),
        incarnation,
    }
}

fn failed(failure: Failure, typed: bool) -> Input {
    Input::Attempted(Attempted::Failed {
        failure,
        text: if typed {
            failure.label().to_string()
        } else {
            "attempt timed out".into()
        },
        typed,
    })
}

/// The result the provider gives generation `g`: a provider that
/// deduplicates gives every attempt of a key its first answer; one that
/// does not gives each effect its own.
fn provider_result(config: &Config, g: u32, effect: u32) -> Blob {
    match config.policy.class {
        Class::Provider => result_of(g, 1),
        _ => result_of(g, effect.max(1) as u8),
    }
}

fn result_of(g: u32, n: u8) -> Blob {
    Blob(vec![g as u8, n])
}

fn rec_text(rec: &OpRecord) -> String {
    format!(
        "{} g{} a{}{}",
        rec.state.name(),
        rec.generation,
        rec.attempts,
        if rec.maybe_landed {
            " maybe-landed"
        } else {
            ""
        }
    )
}

/// An action, short.
pub fn describe_action(action: &Action) -> String {
    match action {
        Action::Write(op) => format!(
            "Write({}, {:?}, expect {:?}, claim {:?}{}, events {:?})",
            rec_text(&op.rec),
            op.durability,
            op.expect,
            op.claim,
            if op.unread { ", unread" } else { "" },
            op.events
                .iter()
                .map(|e| format!("{e:?}")
                    .split([' ', '{'])
                    .next()
                    .unwrap_or("")
                    .to_string())
                .collect::<Vec<_>>()
        ),
        Action::Revert(Revert::Write(op)) => format!("Revert(Write({}))", rec_text(&op.rec)),
        Action::Decode(_) => "Decode".into(),
        other => format!("{other:?}"),
    }
}

/// An input, short.
pub fn describe_input(input: &Input) -> String {
    match input {
        Input::Found(Some(f)) | Input::Conflict(Some(f)) => format!(
            "{}({}, v{}, claim {:?})",
            if matches!(input, Input::Found(_)) {
                "Found"
            } else {
                "Conflict"
            },
            rec_text(&f.rec),
            f.version,
            f.claim.as_ref().map(|c| (c.owner.to_string(), c.live))
        ),
        Input::Attempted(Attempted::Ok { .. }) => "Attempted(Ok)".into(),
        Input::Attempted(Attempted::Failed { failure, typed, .. }) => {
            format!(
                "Attempted(Failed {}{})",
                failure.label(),
                if *typed { "" } else { ", timed out" }
            )
        }
        Input::Verified(Answer::Landed(_)) => "Verified(Landed)".into(),
        other => format!("{other:?}"),
    }
}
