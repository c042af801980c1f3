//! The exhaustive checker of the saga machine (`machine/saga.rs`): up to
//! five runs of one saga, one after the other (a run concurrent with
//! another in its process returns `InFlight` and changes nothing), with
//! every body ending (a value, a refusal, an error in doubt, after
//! completing any number of its compensable steps, reaching all of them
//! again or not on a resumed run), every answer of a compensation's call
//! (undone, refused, unsettled, busy, journal fault), every journal fault
//! of the saga's own reads and writes (before or after the write took), a
//! crash of a run after any action (a compensation cut off before or after
//! its effect) and an operator who settles an `at_most_once` compensation
//! left in doubt.
//!
//! A body resumed before any decision was stored reaches again the
//! compensable calls it completed (the determinism `Ctx::saga` asks of a
//! body, as durable-workflow engines do); one resumed on a stored decision
//! may take another path and miss a decided step.
//!
//! A compensation's call is modelled by what the call machine guarantees
//! (checked by its own checker): once it returned a value it replays; a
//! `provider` compensation cut off is re-sent under the same key, which
//! its provider deduplicates; an `at_most_once` one cut off is escalated
//! until an operator settles it. Invariants, checked on every move and
//! every end:
//!
//! - no compensation runs unless a decision to roll back is durable;
//! - once it is, a body runs only to replay what it completed: no new call
//!   takes effect;
//! - no compensation runs for a step that did not complete;
//! - no compensation's effect happens twice;
//! - a run that found a decision never returns the body's result (a
//!   rollback once decided is carried through);
//! - nothing is undone on a guess: without a refusal of the body, no
//!   decision is stored;
//! - a stored end never changes;
//! - a run reports a journal fault only when the journal failed it;
//! - a saga escalates only for a cause (a compensation refused or left
//!   unsettled, a decided step the body did not reach), and an end
//!   `Compensated` gives the decision's reason;
//! - an end `Compensated` means every completed step is undone; an end
//!   `Escalated` names every completed step not undone as left, and some
//!   step is;
//! - every run returns within a bounded number of actions (no wedge), and
//!   every end of the exploration is a row: no saga ends with a stored
//!   decision whose steps are neither undone nor escalated, unless a run
//!   is still to come.

use std::collections::{HashSet, VecDeque};
use std::fmt;

use crate::machine::saga::{Action, BodyEnd, Decision, End, Input, Outcome, Run, StepRef, Undo};

/// One configuration: how many compensable steps, which of them are
/// `at_most_once`, how many runs.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Compensable steps in the body (at most 3).
    pub steps: usize,
    /// Bit `i`: step `i`'s compensation is `at_most_once` (else
    /// `provider`).
    pub at_most_once: u8,
    /// Runs of the saga, in all.
    pub runs: u8,
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let classes: Vec<&str> = (0..self.steps)
            .map(|i| {
                if self.amo(i) {
                    "at_most_once"
                } else {
                    "provider"
                }
            })
            .collect();
        write!(
            f,
            "saga of {} step(s) [{}], {} runs",
            self.steps,
            classes.join(", "),
            self.runs
        )
    }
}

impl Config {
    fn amo(&self, i: usize) -> bool {
        self.at_most_once & (1 << i) != 0
    }
}

/// A compensation's call, as the journal holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Comp {
    /// Never called, or nothing that sticks (refused, budget spent).
    Open,
    /// Returned a value: it replays.
    Done,
    /// `at_most_once`, cut off mid-call: escalated until settled.
    InDoubt,
}

/// A live run: its machine and the action it waits on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Live {
    id: u8,
    machine: Run,
    pending: Action,
    /// Whether its read found a decision.
    found_decision: bool,
    /// Whether the journal failed it (an operation of its own, or a
    /// compensation's), the only licence to report a journal fault.
    faulted: bool,
    actions: u16,
}

/// Everything durable, and the runs alive.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct World {
    started: bool,
    decision: Option<Decision>,
    end: Option<End>,
    /// Steps the body completed (durable calls), in order.
    completed: usize,
    comps: Vec<Comp>,
    /// Compensation effects at the providers, per step.
    effects: Vec<u8>,
    /// Whether some body ever refused (a semantic failure or an abort).
    refused: bool,
    /// Whether something licenses an escalation: a compensation refused or
    /// left unsettled, or a body that did not reach a decided step.
    excuse: bool,
    live: Vec<Live>,
    runs_started: u8,
}

/// A broken invariant, with why.
#[derive(Debug)]
pub struct Violation(pub String);

fn step_ref(i: usize) -> StepRef {
    StepRef {
        tool: format!("t{i}"),
        key: format!("k{i}"),
    }
}

fn index(step: &StepRef) -> usize {
    step.key[1..].parse().unwrap_or(usize::MAX)
}

/// Longest a run may act before it counts as wedged.
const MOST_ACTIONS: u16 = 32;

impl World {
    fn new(config: &Config) -> World {
        World {
            started: false,
            decision: None,
            end: None,
            completed: 0,
            comps: vec![Comp::Open; config.steps],
            effects: vec![0; config.steps],
            refused: false,
            excuse: false,
            live: Vec::new(),
            runs_started: 0,
        }
    }

    /// Every world one move away, each with what the move was.
    fn successors(&self, config: &Config) -> Result<Vec<(String, World)>, Violation> {
        let mut out = Vec::new();
        // A run that starts while another is live returns `InFlight` at
        // once (`Ctx::saga` leads the saga's key in its process), changing
        // nothing: runs are explored one after the other, each cut off at
        // any point.
        if self.runs_started < config.runs && self.live.is_empty() {
            let mut w = self.clone();
            let id = w.runs_started;
            w.runs_started += 1;
            let mut machine = Run::new("s");
            let pending = machine.step(Input::Start);
            w.live.push(Live {
                id,
                machine,
                pending,
                found_decision: false,
                faulted: false,
                actions: 1,
            });
            out.push((format!("run {id} starts"), w));
        }
        for (i, comp) in self.comps.iter().enumerate() {
            if *comp == Comp::InDoubt {
                // The operator looks at the provider: landed, or reissue.
                let mut w = self.clone();
                w.comps[i] = if w.effects[i] > 0 {
                    Comp::Done
                } else {
                    Comp::Open
                };
                out.push((
                    format!("an operator settles the compensation of step {i}"),
                    w,
                ));
            }
        }
        for n in 0..self.live.len() {
            let live = &self.live[n];
            // A crash after any action: the run is gone.
            let mut w = self.clone();
            w.live.remove(n);
            out.push((format!("run {} crashes", live.id), w));
            for (what, input, w) in self.outcomes(config, n)? {
                let mut w = w;
                let Some(input) = input else {
                    // The run died in the action; nothing comes back.
                    out.push((what, w));
                    continue;
                };
                let live = &mut w.live[n];
                let id = live.id;
                live.faulted |=
                    matches!(input, Input::JournalFailed | Input::Undone(Undo::Journal));
                let action = live.machine.step(input.clone());
                live.actions += 1;
                if live.actions > MOST_ACTIONS {
                    return Err(Violation(format!(
                        "run {id} acted {MOST_ACTIONS} times without returning (a wedge)"
                    )));
                }
                let label = format!("run {id}: {what} -> {}", describe(&action));
                if let Action::Return(outcome) = &action {
                    w.check_return(n, outcome)?;
                    w.live.remove(n);
                } else {
                    w.check_action(n, &action)?;
                    w.live[n].pending = action;
                }
                out.push((label, w));
            }
        }
        Ok(out)
    }

    /// The ways run `n`'s pending action can come back: what it was, the
    /// input, and the world after it.
    fn outcomes(
        &self,
        config: &Config,
        n: usize,
    ) -> Result<Vec<(String, Option<Input>, World)>, Violation> {
        let live = &self.live[n];
        let mut out = Vec::new();
        let fail =
            |w: &World, what: &str| (what.to_string(), Some(Input::JournalFailed), w.clone());
        match &live.pending {
            Action::Read => {
                let mut w = self.clone();
                w.live[n].found_decision = self.end.is_none() && self.decision.is_some();
                let input = Input::Found {
                    end: self.end.clone(),
                    decision: if self.end.is_some() {
                        None
                    } else {
                        self.decision.clone()
                    },
                };
                out.push(("read".into(), Some(input), w));
                out.push(fail(self, "the read fails"));
            }
            Action::MarkStarted => {
                let mut w = self.clone();
                w.started = true;
                out.push(("mark".into(), Some(Input::Started), w.clone()));
                out.push(fail(self, "the mark fails"));
                out.push(fail(&w, "the mark is written, then reported failed"));
            }
            Action::EscalateForNow(_) => {
                out.push(("emit".into(), Some(Input::Emitted), self.clone()));
                out.push(fail(self, "the event fails"));
            }
            Action::RunBody { replay_only } => {
                // The body replays what completed and may complete more;
                // on a resumed run it may not reach the first step again.
                // Replaying only, the body completes nothing new.
                let most = if *replay_only {
                    self.completed
                } else {
                    config.steps
                };
                for k in self.completed..=most {
                    for skip in [false, true] {
                        // A body resumed on a stored decision may take
                        // another path and not reach a decided step. One
                        // resumed before any decision takes its earlier
                        // path (`Ctx::saga` requires it, as durable
                        // workflows do: choices go through `ctx.step`), so
                        // it reaches every step it completed before.
                        if skip && (self.completed == 0 || !live.found_decision) {
                            continue;
                        }
                        let reached: Vec<StepRef> = (usize::from(skip)..k).map(step_ref).collect();
                        for end in [
                            BodyEnd::Done,
                            BodyEnd::Refused("r".into()),
                            BodyEnd::InDoubt,
                        ] {
                            if k > self.completed && self.decision.is_some() {
                                return Err(Violation(format!(
                                    "run {} ran its body with new calls though a rollback \
                                     was decided: new effects while undoing",
                                    live.id
                                )));
                            }
                            let mut w = self.clone();
                            w.completed = k;
                            w.refused |= matches!(end, BodyEnd::Refused(_));
                            w.excuse |= skip;
                            let what = format!(
                                "the body completes {k} step(s){} and ends {end:?}",
                                if skip { ", missing step 0" } else { "" }
                            );
                            let input = Input::BodyEnded {
                                end,
                                completed: reached.clone(),
                                held: reached.clone(),
                            };
                            out.push((what, Some(input), w));
                        }
                    }
                }
            }
            Action::StoreDecision(d) => {
                let mut w = self.clone();
                if w.decision.is_none() {
                    w.decision = Some(d.clone());
                }
                let stored = w.decision.clone().unwrap_or_else(|| d.clone());
                out.push((
                    "store the decision".into(),
                    Some(Input::Decided(stored)),
                    w.clone(),
                ));
                out.push(fail(self, "the decision fails"));
                out.push(fail(&w, "the decision is written, then reported failed"));
            }
            Action::StoreEnd(e) => {
                let mut w = self.clone();
                if w.end.is_none() {
                    w.end = Some(e.clone());
                }
                let stored = w.end.clone().unwrap_or_else(|| e.clone());
                out.push((
                    "store the end".into(),
                    Some(Input::Stored(stored)),
                    w.clone(),
                ));
                out.push(fail(self, "the end fails"));
                out.push(fail(&w, "the end is written, then reported failed"));
            }
            Action::Undo(step) => {
                let i = index(step);
                let amo = config.amo(i);
                let busy = self.live.iter().enumerate().any(|(m, other)| {
                    m != n && matches!(&other.pending, Action::Undo(s) if s == step)
                });
                let mut excused = self.clone();
                excused.excuse = true;
                match self.comps[i] {
                    Comp::Done => out.push((
                        "replayed".into(),
                        Some(Input::Undone(Undo::Done)),
                        self.clone(),
                    )),
                    Comp::InDoubt => out.push((
                        "still in doubt".into(),
                        Some(Input::Undone(Undo::Unsettled("in doubt".into()))),
                        excused.clone(),
                    )),
                    Comp::Open => {
                        let mut done = self.clone();
                        done.comps[i] = Comp::Done;
                        if done.effects[i] == 0 || amo {
                            // A provider replays its saved answer for a key
                            // it saw; anything else is a new effect.
                            done.effects[i] += 1;
                        }
                        out.push(("undone".into(), Some(Input::Undone(Undo::Done)), done));
                        out.push((
                            "refused".into(),
                            Some(Input::Undone(Undo::Refused("no".into()))),
                            excused.clone(),
                        ));
                        out.push((
                            "unsettled".into(),
                            Some(Input::Undone(Undo::Unsettled("later".into()))),
                            excused.clone(),
                        ));
                        out.push(fail(self, "its journal fails"));
                        // Cut off mid-call, after its effect: the run dies.
                        let mut cut = self.clone();
                        if cut.effects[i] == 0 || amo {
                            cut.effects[i] += 1;
                        }
                        if amo {
                            cut.comps[i] = Comp::InDoubt;
                        }
                        cut.live.remove(n);
                        cut.check_effects()?;
                        out.push((
                            format!("run {} dies after the compensation's effect", live.id),
                            None,
                            cut,
                        ));
                    }
                }
                if busy {
                    out.push(("busy".into(), Some(Input::Undone(Undo::Busy)), self.clone()));
                }
            }
            Action::Return(_) => {}
        }
        Ok(out)
    }

    fn check_effects(&self) -> Result<(), Violation> {
        if let Some(i) = self.effects.iter().position(|e| *e > 1) {
            return Err(Violation(format!(
                "the compensation of step {i} took effect {} times",
                self.effects[i]
            )));
        }
        Ok(())
    }

    fn check_action(&self, n: usize, action: &Action) -> Result<(), Violation> {
        self.check_effects()?;
        if let Action::Undo(step) = action {
            let i = index(step);
            if self.decision.is_none() {
                return Err(Violation(format!(
                    "run {} compensates step {i} with no decision stored",
                    self.live[n].id
                )));
            }
            if i >= self.completed {
                return Err(Violation(format!(
                    "run {} compensates step {i}, which never completed",
                    self.live[n].id
                )));
            }
        }
        if self.decision.is_some() && !self.refused {
            return Err(Violation(
                "a decision was stored though no body refused".into(),
            ));
        }
        Ok(())
    }

    fn check_return(&self, n: usize, outcome: &Outcome) -> Result<(), Violation> {
        self.check_effects()?;
        let live = &self.live[n];
        if *outcome == Outcome::Body && live.found_decision {
            return Err(Violation(format!(
                "run {} found a decision to roll back and returned the body's result",
                live.id
            )));
        }
        if *outcome == Outcome::Journal && !live.faulted {
            return Err(Violation(format!(
                "run {} reports a journal fault though the journal never failed it",
                live.id
            )));
        }
        if let Outcome::End(end) = outcome {
            if Some(end) != self.end.as_ref() {
                return Err(Violation(format!(
                    "run {} returns {end:?}, but the stored end is {:?}",
                    live.id, self.end
                )));
            }
        }
        self.check_end_row()
    }

    /// An end stored is a row: compensated means all undone, escalated
    /// names what is left.
    fn check_end_row(&self) -> Result<(), Violation> {
        let left: Vec<usize> = (0..self.completed)
            .filter(|i| self.comps[*i] != Comp::Done)
            .collect();
        let decided = self.decision.as_ref().map(|d| d.reason.as_str());
        match &self.end {
            Some(End::Compensated { .. }) if !left.is_empty() => Err(Violation(format!(
                "the saga ended compensated, but step(s) {left:?} are not undone"
            ))),
            Some(End::Compensated { reason, .. }) if Some(reason.as_str()) != decided => {
                Err(Violation(format!(
                    "the saga ended compensated for {reason:?}, but the decision says {decided:?}"
                )))
            }
            Some(End::Escalated { .. }) if !self.excuse => Err(Violation(
                "the saga escalated, though every compensation could run and the body reached \
                 every decided step"
                    .into(),
            )),
            Some(End::Escalated { reason, .. }) => {
                let listed = reason.split("left: ").nth(1).unwrap_or("");
                if let Some(i) = left.iter().find(|i| !listed.contains(&format!("k{i}"))) {
                    return Err(Violation(format!(
                        "the saga escalated without naming step {i} as left: {reason}"
                    )));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// A world where nothing can happen any more.
    fn check_end(&self) -> Result<(), Violation> {
        self.check_effects()?;
        self.check_end_row()?;
        // Nothing undone without a decision (an open saga with one is a
        // row: its next run resumes).
        if self.decision.is_none() && self.effects.iter().any(|e| *e > 0) {
            return Err(Violation(
                "a compensation took effect, but no decision was ever stored".into(),
            ));
        }
        Ok(())
    }
}

fn describe(action: &Action) -> String {
    match action {
        Action::Return(o) => format!("returns {o:?}"),
        other => format!("{other:?}"),
    }
}

/// What an exploration found.
#[derive(Debug, Default)]
pub struct Report {
    /// Worlds reached (distinct).
    pub states: u64,
    /// Violations, each with its trace.
    pub violations: Vec<String>,
    /// Configurations explored.
    pub configs: usize,
}

/// Every configuration: one to three steps, each class pattern, `runs`
/// runs.
pub fn configs(runs: u8) -> Vec<Config> {
    let mut out = Vec::new();
    for steps in 1..=3usize {
        for at_most_once in 0..(1u8 << steps) {
            out.push(Config {
                steps,
                at_most_once,
                runs,
            });
        }
    }
    out
}

/// Explores `config` completely (the saga's worlds are finite).
pub fn explore(config: &Config, report: &mut Report) {
    report.configs += 1;
    let start = World::new(config);
    let mut seen: HashSet<World> = HashSet::new();
    let mut parents: Vec<(usize, String)> = vec![(usize::MAX, String::new())];
    let mut worlds: Vec<World> = vec![start.clone()];
    seen.insert(start);
    let mut queue: VecDeque<usize> = VecDeque::from([0]);
    while let Some(at) = queue.pop_front() {
        let world = worlds[at].clone();
        let successors = match world.successors(config) {
            Ok(s) => s,
            Err(Violation(why)) => {
                report.violations.push(trace(config, &parents, at, &why));
                return;
            }
        };
        if successors.is_empty() {
            if let Err(Violation(why)) = world.check_end() {
                report.violations.push(trace(config, &parents, at, &why));
                return;
            }
        }
        for (what, next) in successors {
            if seen.insert(next.clone()) {
                worlds.push(next);
                parents.push((at, what));
                queue.push_back(worlds.len() - 1);
            }
        }
    }
    report.states += worlds.len() as u64;
}

fn trace(config: &Config, parents: &[(usize, String)], mut at: usize, why: &str) -> String {
    let mut moves = Vec::new();
    while at != 0 && at != usize::MAX {
        moves.push(parents[at].1.clone());
        at = parents[at].0;
    }
    moves.reverse();
    let mut out = format!("VIOLATION: {why}\n  in: {config}\n");
    for (n, m) in moves.iter().enumerate() {
        out.push_str(&format!("  {}. {m}\n", n + 1));
    }
    out
}

/// Every configuration with `runs` runs, explored completely.
pub fn run(runs: u8) -> Report {
    let mut report = Report::default();
    for config in configs(runs) {
        explore(&config, &mut report);
        if !report.violations.is_empty() {
            break;
        }
    }
    report
}
