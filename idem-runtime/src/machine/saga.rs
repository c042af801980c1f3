//! The decisions of a saga ([`Ctx::saga`](crate::Ctx::saga)), without I/O.
//!
//! A saga's durable state is two memoized values beside its steps: the
//! *decision* to roll back (why, and which completed steps there were), and
//! its *end* (compensated, or escalated). The driver (`saga.rs` in the
//! crate's root) reads them, runs the body, runs compensations, and asks
//! these functions what follows.
//!
//! | found | body ends | what happens |
//! |---|---|---|
//! | an end | (not run) | the end again: `Compensated`, or `Escalated` |
//! | nothing | `Ok`, no abort | the body's value |
//! | nothing | in doubt (escalated, in flight, journal, budget) | that error; the saga stays open |
//! | nothing | semantic failure, refusal or abort | decide (durably), then compensate |
//! | a decision | anything | compensate what the decision names (a resumed rollback) |
//!
//! Compensating walks the steps in reverse. A step whose compensation
//! returns a value is undone; one refused for good ends the saga escalated
//! (durably); one that cannot be settled yet (escalated itself, budget
//! spent, awaiting approval) escalates the saga *for now*: its next run
//! resumes there. A step the decision names that this run did not reach
//! cannot be undone by the runtime and ends the saga escalated.

use serde::{Deserialize, Serialize};

/// One completed compensable step, as the decision stores it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StepRef {
    /// The tool that ran.
    pub tool: String,
    /// Its key.
    pub key: String,
}

impl std::fmt::Display for StepRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.tool, self.key)
    }
}

/// The durable decision to roll a saga back.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Decision {
    /// Why.
    pub reason: String,
    /// The completed compensable steps when it was decided, in order.
    pub steps: Vec<StepRef>,
}

/// How a saga ended, stored once it did.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum End {
    /// Every completed step was undone.
    Compensated {
        /// Why it was rolled back.
        reason: String,
        /// The steps undone, in the order their compensations ran.
        undone: Vec<StepRef>,
    },
    /// A person must finish it; the evidence.
    Escalated {
        /// What ran, what was undone, what is left and why it stopped.
        reason: String,
        /// The steps undone before it stopped, in the order their
        /// compensations ran (for operators' views; an end stored before
        /// idem kept them reads as none).
        #[serde(default)]
        undone: Vec<StepRef>,
    },
}

/// How the body ended, as far as the saga cares.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum BodyEnd {
    /// It returned a value and did not abort.
    Done,
    /// It failed semantically, was refused by a person, or aborted: roll
    /// back, for this reason.
    Refused(String),
    /// It returned an error whose outcome is in doubt: the saga stays
    /// open, and a later run goes on.
    InDoubt,
}

/// What follows the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterBody {
    /// Return the body's result as it is.
    Return,
    /// Store this decision (the first stored wins), then compensate.
    Decide(String),
    /// Compensate under the decision found.
    Compensate,
}

/// What follows the body, given the decision a past run stored (if any).
#[must_use]
pub fn after_body(decided: Option<&Decision>, body: BodyEnd) -> AfterBody {
    match (decided, body) {
        // A rollback once decided is carried through, whatever the body
        // does on this run: its effects are the decision's steps.
        (Some(_), _) => AfterBody::Compensate,
        (None, BodyEnd::Refused(reason)) => AfterBody::Decide(reason),
        (None, BodyEnd::Done | BodyEnd::InDoubt) => AfterBody::Return,
    }
}

/// What one compensation's call came to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Undo {
    /// It returned a value: the step is undone.
    Done,
    /// It was refused for good (semantically, by a person, abandoned).
    Refused(String),
    /// It cannot be settled now (escalated, budget spent, awaiting
    /// approval); a later run of the saga tries again.
    Unsettled(String),
    /// Another call is driving it right now.
    Busy,
    /// The journal failed; nothing was decided.
    Journal,
}

/// One step of the rollback, walked from the last step back.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Slot {
    /// This run holds the step's compensation.
    Held,
    /// The decision names the step but this run did not reach it.
    Missing,
}

/// What follows one step of the rollback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Go on with the step before it (this one is undone).
    Continue,
    /// Store the end `Escalated` with this evidence and return it.
    EscalateForGood(String),
    /// Return `Escalated` with this evidence without storing an end: the
    /// next run resumes here.
    EscalateForNow(String),
    /// Return `InFlight`: another call compensates this step now.
    Busy,
    /// Return the journal's error.
    Journal,
}

/// Whether a step's compensation can run: `Err` is the evidence the
/// saga escalates with, for good.
pub fn at_step(step: &StepRef, slot: Slot) -> Result<(), String> {
    match slot {
        Slot::Held => Ok(()),
        Slot::Missing => Err(format!(
            "{step} completed, but this run of the saga did not reach it, so idem holds no \
             compensation for it; undo it by hand"
        )),
    }
}

/// What follows a compensation's call.
#[must_use]
pub fn after_undo(step: &StepRef, undo: Undo) -> Next {
    match undo {
        Undo::Done => Next::Continue,
        Undo::Refused(why) => {
            Next::EscalateForGood(format!("the compensation of {step} was refused: {why}"))
        }
        Undo::Unsettled(why) => Next::EscalateForNow(format!(
            "the compensation of {step} is not settled: {why}; the saga's next run resumes here"
        )),
        Undo::Busy => Next::Busy,
        Undo::Journal => Next::Journal,
    }
}

/// The order the rollback walks: the decision's steps, then any this run
/// completed beyond them, the last first. `held` says whether this run
/// holds a step's compensation.
#[must_use]
pub fn rollback_order(
    decided: &[StepRef],
    completed: &[StepRef],
    held: impl Fn(&StepRef) -> bool,
) -> Vec<(StepRef, Slot)> {
    let mut all: Vec<StepRef> = decided.to_vec();
    for s in completed {
        if !all.contains(s) {
            all.push(s.clone());
        }
    }
    all.into_iter()
        .rev()
        .map(|s| {
            let slot = if held(&s) { Slot::Held } else { Slot::Missing };
            (s, slot)
        })
        .collect()
}

/// The evidence of an escalated saga: what ran, what was undone, what is
/// left, and why it stopped.
#[must_use]
pub fn evidence(
    saga: &str,
    reason: &str,
    ran: &[StepRef],
    undone: &[StepRef],
    why: &str,
) -> String {
    let list = |steps: &[StepRef]| {
        if steps.is_empty() {
            "none".to_string()
        } else {
            steps
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    let left: Vec<StepRef> = ran
        .iter()
        .filter(|s| !undone.contains(s))
        .cloned()
        .collect();
    format!(
        "saga {saga} is rolled back because {reason}; ran: {}; undone: {}; left: {}; stopped: {why}",
        list(ran),
        list(undone),
        list(&left)
    )
}

/// Where a run of a saga stands.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Phase {
    Start,
    Reading,
    Starting,
    Running,
    Deciding,
    Undoing,
    Ending,
    Reporting(Outcome),
    Done,
}

/// What the saga machine is told.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Input {
    /// The run begins.
    Start,
    /// What the journal holds of the saga: its end and its decision.
    Found {
        /// How it ended, if it did.
        end: Option<End>,
        /// The decision to roll back, if one was stored.
        decision: Option<Decision>,
    },
    /// The first-run mark is stored (by this run or an earlier one).
    Started,
    /// The body returned.
    BodyEnded {
        /// How, as far as the saga cares.
        end: BodyEnd,
        /// The compensable calls it completed, in order.
        completed: Vec<StepRef>,
        /// Those of them whose compensation this run holds.
        held: Vec<StepRef>,
    },
    /// The decision stored: this run's, or one stored before it.
    Decided(Decision),
    /// An event was appended.
    Emitted,
    /// A compensation's call came to this.
    Undone(Undo),
    /// The end stored: this run's, or one stored before it.
    Stored(End),
    /// A journal read or write failed.
    JournalFailed,
}

/// What the driver does next.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[must_use]
pub enum Action {
    /// Read the saga's end and decision.
    Read,
    /// Store the first-run mark (a memoized step) and, in the same write,
    /// its `SagaStarted` event: the one is durable exactly when the other
    /// is, and a later run that finds the mark tells nothing again.
    MarkStarted,
    /// Append `SagaEscalated` with this evidence: the saga stays open and
    /// its next run resumes (nothing is stored, so nothing is lost if this
    /// event is).
    EscalateForNow(String),
    /// Run the body; `replay_only`: a rollback is decided, so the body
    /// runs only to hand over its completed calls' compensations, and any
    /// call that is not a replay of one is refused before it runs.
    RunBody {
        /// Whether only replays may run.
        replay_only: bool,
    },
    /// Store this decision with its `Compensating` event in one write; the
    /// first stored wins (and told it).
    StoreDecision(Decision),
    /// Run this step's compensation.
    Undo(StepRef),
    /// Store this end with its `Compensated` or `SagaEscalated` event in
    /// one write; the first stored wins (and told it).
    StoreEnd(End),
    /// Return.
    Return(Outcome),
}

/// How a run of a saga returns.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The body's own result.
    Body,
    /// The saga's end: `Compensated` or `Escalated`.
    End(End),
    /// `Escalated` with this evidence; the next run resumes.
    EscalatedForNow(String),
    /// `InFlight`: another call compensates a step right now.
    Busy,
    /// The journal's error.
    Journal,
}

/// One run of a saga: the whole decision procedure of `Ctx::saga`, fed
/// what the driver's actions brought back.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Run {
    saga: String,
    phase: Phase,
    decision: Option<Decision>,
    ran: Vec<StepRef>,
    order: Vec<(StepRef, Slot)>,
    next: usize,
    undone: Vec<StepRef>,
}

impl Run {
    /// A run of the saga named `saga`.
    pub fn new(saga: &str) -> Run {
        Run {
            saga: saga.to_string(),
            phase: Phase::Start,
            decision: None,
            ran: Vec::new(),
            order: Vec::new(),
            next: 0,
            undone: Vec::new(),
        }
    }

    /// The next action, given what the last one brought back.
    pub fn step(&mut self, input: Input) -> Action {
        let phase = std::mem::replace(&mut self.phase, Phase::Done);
        match (phase, input) {
            (Phase::Start, Input::Start) => self.go(Phase::Reading, Action::Read),
            (_, Input::JournalFailed) => self.ret(Outcome::Journal),
            (Phase::Reading, Input::Found { end: Some(end), .. }) => self.ret(Outcome::End(end)),
            (
                Phase::Reading,
                Input::Found {
                    end: None,
                    decision: Some(d),
                },
            ) => {
                self.decision = Some(d);
                self.go(Phase::Running, Action::RunBody { replay_only: true })
            }
            (
                Phase::Reading,
                Input::Found {
                    end: None,
                    decision: None,
                },
            ) => self.go(Phase::Starting, Action::MarkStarted),
            (Phase::Starting, Input::Started) => {
                self.go(Phase::Running, Action::RunBody { replay_only: false })
            }
            (
                Phase::Running,
                Input::BodyEnded {
                    end,
                    completed,
                    held,
                },
            ) => match after_body(self.decision.as_ref(), end) {
                AfterBody::Return => self.ret(Outcome::Body),
                AfterBody::Decide(reason) => {
                    self.plan(&completed, &held);
                    let proposed = Decision {
                        reason,
                        steps: completed,
                    };
                    self.go(Phase::Deciding, Action::StoreDecision(proposed))
                }
                AfterBody::Compensate => {
                    self.plan(&completed, &held);
                    self.undo_next()
                }
            },
            (Phase::Deciding, Input::Decided(stored)) => {
                // Another run's decision may have won: roll back what it
                // names, with what this run holds.
                let (completed, held) = self.holdings();
                self.decision = Some(stored);
                self.plan(&completed, &held);
                self.undo_next()
            }
            (Phase::Undoing, Input::Undone(undo)) => {
                let step = self.order[self.next].0.clone();
                match after_undo(&step, undo) {
                    Next::Continue => {
                        self.undone.push(step);
                        self.next += 1;
                        self.undo_next()
                    }
                    Next::EscalateForGood(why) => self.escalate(why),
                    Next::EscalateForNow(why) => {
                        let reason = self.evidence(&why);
                        self.go(
                            Phase::Reporting(Outcome::EscalatedForNow(reason.clone())),
                            Action::EscalateForNow(reason),
                        )
                    }
                    Next::Busy => self.ret(Outcome::Busy),
                    Next::Journal => self.ret(Outcome::Journal),
                }
            }
            (Phase::Ending, Input::Stored(end)) => self.ret(Outcome::End(end)),
            (Phase::Reporting(outcome), Input::Emitted) => self.ret(outcome),
            // An input the phase does not expect: a driver bug. Fail
            // closed: undo nothing more, report a journal fault.
            _ => self.ret(Outcome::Journal),
        }
    }

    fn go(&mut self, phase: Phase, action: Action) -> Action {
        self.phase = phase;
        action
    }

    fn ret(&mut self, outcome: Outcome) -> Action {
        self.phase = Phase::Done;
        Action::Return(outcome)
    }

    /// The steps this run completed and holds, from the plan made.
    fn holdings(&self) -> (Vec<StepRef>, Vec<StepRef>) {
        let completed: Vec<StepRef> = self.order.iter().rev().map(|(s, _)| s.clone()).collect();
        let held = self
            .order
            .iter()
            .filter(|(_, slot)| *slot == Slot::Held)
            .map(|(s, _)| s.clone())
            .collect();
        (completed, held)
    }

    /// The rollback's order under the decision (or the steps this run
    /// completed, before one is stored).
    fn plan(&mut self, completed: &[StepRef], held: &[StepRef]) {
        let decided: Vec<StepRef> = self
            .decision
            .as_ref()
            .map_or_else(Vec::new, |d| d.steps.clone());
        self.order = rollback_order(&decided, completed, |s| held.contains(s));
        self.ran = self.order.iter().rev().map(|(s, _)| s.clone()).collect();
        self.next = 0;
    }

    fn undo_next(&mut self) -> Action {
        let Some((step, slot)) = self.order.get(self.next).cloned() else {
            let end = End::Compensated {
                reason: self.reason(),
                undone: self.undone.clone(),
            };
            return self.go(Phase::Ending, Action::StoreEnd(end));
        };
        match at_step(&step, slot) {
            Ok(()) => self.go(Phase::Undoing, Action::Undo(step)),
            Err(why) => self.escalate(why),
        }
    }

    fn escalate(&mut self, why: String) -> Action {
        let reason = self.evidence(&why);
        let undone = self.undone.clone();
        self.go(
            Phase::Ending,
            Action::StoreEnd(End::Escalated { reason, undone }),
        )
    }

    fn reason(&self) -> String {
        self.decision
            .as_ref()
            .map_or_else(String::new, |d| d.reason.clone())
    }

    fn evidence(&self, why: &str) -> String {
        evidence(&self.saga, &self.reason(), &self.ran, &self.undone, why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(n: &str) -> StepRef {
        StepRef {
            tool: n.to_string(),
            key: format!("{n}-k"),
        }
    }

    #[test]
    fn the_body_decides_only_when_no_rollback_was_decided_before() {
        assert_eq!(after_body(None, BodyEnd::Done), AfterBody::Return);
        assert_eq!(after_body(None, BodyEnd::InDoubt), AfterBody::Return);
        assert_eq!(
            after_body(None, BodyEnd::Refused("declined".into())),
            AfterBody::Decide("declined".into())
        );
        let d = Decision {
            reason: "declined".into(),
            steps: vec![step("charge")],
        };
        for body in [
            BodyEnd::Done,
            BodyEnd::InDoubt,
            BodyEnd::Refused("other".into()),
        ] {
            assert_eq!(after_body(Some(&d), body), AfterBody::Compensate);
        }
    }

    #[test]
    fn the_rollback_walks_the_decided_steps_then_new_ones_last_first() {
        let (a, b, c) = (step("a"), step("b"), step("c"));
        let order = rollback_order(&[a.clone(), b.clone()], &[b.clone(), c.clone()], |s| {
            s != &a
        });
        assert_eq!(
            order,
            vec![(c, Slot::Held), (b, Slot::Held), (a, Slot::Missing)]
        );
    }

    #[test]
    fn each_compensation_answer_has_its_consequence() {
        let s = step("charge");
        assert_eq!(at_step(&s, Slot::Held), Ok(()));
        assert!(matches!(at_step(&s, Slot::Missing), Err(t) if t.contains("by hand")));
        assert_eq!(after_undo(&s, Undo::Done), Next::Continue);
        assert!(
            matches!(after_undo(&s, Undo::Refused("no".into())), Next::EscalateForGood(t) if t.contains("refused: no"))
        );
        assert!(
            matches!(after_undo(&s, Undo::Unsettled("later".into())), Next::EscalateForNow(t) if t.contains("later"))
        );
        assert_eq!(after_undo(&s, Undo::Busy), Next::Busy);
        assert_eq!(after_undo(&s, Undo::Journal), Next::Journal);
    }

    #[test]
    fn the_evidence_names_what_ran_what_was_undone_and_what_is_left() {
        let (a, b) = (step("a"), step("b"));
        let text = evidence(
            "order",
            "declined",
            &[a.clone(), b.clone()],
            &[b],
            "refused",
        );
        assert_eq!(
            text,
            "saga order is rolled back because declined; ran: a a-k, b b-k; undone: b b-k; \
             left: a a-k; stopped: refused"
        );
    }
}
