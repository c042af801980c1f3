//! The machine of a memoized step (`Ctx::step`): run once per run and
//! scope; concurrent calls of the same step (in this process or another)
//! wait for the one running and share its value; a step whose driver died
//! runs again.

use idem_journal::journal::Claim;
use idem_journal::record::{Blob, StepRecord, StepState};

use super::policy::Setup;

/// What the last action of a step brought back.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Input {
    /// The step begins.
    Start,
    /// This call leads the step's key in this process.
    Led,
    /// Another call of this process leads it.
    Busy,
    /// The leader went.
    LeaderLeft,
    /// The record may have changed.
    Changed,
    /// A wait ran out.
    TimedOut,
    /// The step's record, if any (decoded).
    Found(Option<(StepRecord, u64, Option<Claim>)>),
    /// The read failed or found bytes that do not decode.
    ReadFailed,
    /// A write happened, at this version.
    Written(u64),
    /// A write's condition failed.
    Conflict,
    /// A write failed.
    WriteFailed,
    /// The step's future returned: its value encoded (`Err`: why it cannot
    /// be), or `None`: its error, which the driver holds.
    Ran(Option<Result<Blob, String>>),
    /// The stored value decodes (false: not into the step's type).
    Decoded(bool),
    /// An event was appended.
    Appended,
    /// An event could not be appended.
    AppendFailed,
}

/// What the driver is to do next.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[must_use = "an action is the machine's decision: execute it and feed back its input"]
pub enum Action {
    /// Leave any lead, then lead the step's key or learn who does.
    Lead,
    /// Wait for this process's leader to go, until `until`.
    AwaitLeader {
        /// The deadline (ms).
        until: u64,
    },
    /// Leave the lead; wait for the record to move past `version`.
    AwaitChange {
        /// The version seen.
        version: u64,
        /// The deadline (ms).
        until: u64,
    },
    /// Read the step's record.
    Read,
    /// Claim the step as running (eventual; a lost claim only means the
    /// step runs again).
    Claim {
        /// The record (`Running`).
        rec: StepRecord,
        /// The version it expects (`None`: absent).
        expect: Option<u64>,
    },
    /// Run the step's future.
    Run,
    /// Record its value, durably, releasing the claim, with a
    /// `StepRecorded` event.
    Record {
        /// The record (`Done`).
        rec: StepRecord,
        /// The claim's version.
        expect: u64,
    },
    /// Decode the stored value.
    Decode(Blob),
    /// Append `StepReplayed`.
    EmitReplayed,
    /// Return.
    Return(Outcome),
}

/// What the step returns.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Its value (the run's, or the stored one).
    Value,
    /// The future's error.
    Error,
    /// Another call of the step still runs it (or this call's future was
    /// spent in a first round that lost its claim).
    InFlight,
    /// A journal error (the driver holds it).
    Journal,
    /// The value cannot be stored.
    Unstorable(String),
    /// The stored value does not decode.
    Undecodable,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Phase {
    Start,
    Leading,
    AwaitingLeader,
    AwaitingChange,
    Reading,
    Claiming,
    Running { version: u64 },
    Recording,
    Decoding,
    Replaying,
    Returned,
}

/// One `Ctx::step` call.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Step {
    name: String,
    root_run: String,
    phase: Phase,
    deadline: u64,
    /// The future was polled (a later round cannot run it again).
    ran: bool,
}

impl Step {
    /// The step `name` of `root_run`; feed it [`Input::Start`] first.
    pub fn new(name: &str, root_run: &str) -> Step {
        Step {
            name: name.to_string(),
            root_run: root_run.to_string(),
            phase: Phase::Start,
            deadline: 0,
            ran: false,
        }
    }

    /// The next action, given what the last one brought back.
    pub fn step(&mut self, setup: &Setup, now: u64, input: Input) -> Action {
        let phase = std::mem::replace(&mut self.phase, Phase::Returned);
        let (phase, action) = self.advance(phase, setup, now, input);
        self.phase = phase;
        action
    }

    fn advance(&mut self, phase: Phase, setup: &Setup, now: u64, input: Input) -> (Phase, Action) {
        let done = |o| (Phase::Returned, Action::Return(o));
        match (phase, input) {
            (Phase::Start, Input::Start) => {
                self.deadline = now.saturating_add(setup.in_flight_wait_ms);
                (Phase::Leading, Action::Lead)
            }
            (Phase::Leading, Input::Led) => (Phase::Reading, Action::Read),
            (Phase::Leading, Input::Busy) => (
                Phase::AwaitingLeader,
                Action::AwaitLeader {
                    until: self.deadline,
                },
            ),
            (Phase::AwaitingLeader, Input::LeaderLeft)
            | (Phase::AwaitingChange, Input::Changed) => (Phase::Leading, Action::Lead),
            (Phase::AwaitingLeader | Phase::AwaitingChange, Input::TimedOut) => {
                done(Outcome::InFlight)
            }
            (Phase::Reading, Input::ReadFailed) => done(Outcome::Journal),
            (Phase::Reading, Input::Found(None)) => self.claim(now, None),
            (Phase::Reading, Input::Found(Some((rec, version, claim)))) => match rec.state {
                StepState::Done { value } => (Phase::Decoding, Action::Decode(value)),
                StepState::Running => {
                    let me = &setup.owner;
                    let elsewhere = claim.as_ref().is_some_and(|c| {
                        c.live
                            && c.owner != *me
                            && !me.is_other_incarnation_of_same_worker(&c.owner)
                    });
                    if elsewhere {
                        return (
                            Phase::AwaitingChange,
                            Action::AwaitChange {
                                version,
                                until: self.deadline,
                            },
                        );
                    }
                    // Its driver is gone: it runs again.
                    self.claim(now, Some(version))
                }
            },
            (Phase::Claiming, Input::Written(version)) => {
                if self.ran {
                    // A second round after a conflict: the future is spent.
                    return done(Outcome::InFlight);
                }
                self.ran = true;
                (Phase::Running { version }, Action::Run)
            }
            (Phase::Claiming, Input::Conflict) => (Phase::Leading, Action::Lead),
            (Phase::Claiming | Phase::Recording, Input::WriteFailed) => done(Outcome::Journal),
            (Phase::Running { version }, Input::Ran(ran)) => match ran {
                None => done(Outcome::Error),
                Some(Err(why)) => done(Outcome::Unstorable(why)),
                Some(Ok(value)) => (
                    Phase::Recording,
                    Action::Record {
                        rec: StepRecord {
                            name: self.name.clone(),
                            root_run: self.root_run.clone(),
                            state: StepState::Done { value },
                            at_ms: now,
                        },
                        expect: version,
                    },
                ),
            },
            (Phase::Recording, Input::Written(_)) => done(Outcome::Value),
            // Another driver took the step over meanwhile (this one was
            // paused past its lease): its value is the step's.
            (Phase::Recording, Input::Conflict) => (Phase::Leading, Action::Lead),
            (Phase::Decoding, Input::Decoded(false)) => done(Outcome::Undecodable),
            (Phase::Decoding, Input::Decoded(true)) => (Phase::Replaying, Action::EmitReplayed),
            (Phase::Replaying, Input::Appended) => done(Outcome::Value),
            (Phase::Replaying, Input::AppendFailed) => done(Outcome::Journal),
            (phase, input) => panic!("the step machine got {input:?} in phase {phase:?}"),
        }
    }

    fn claim(&self, now: u64, expect: Option<u64>) -> (Phase, Action) {
        (
            Phase::Claiming,
            Action::Claim {
                rec: StepRecord {
                    name: self.name.clone(),
                    root_run: self.root_run.clone(),
                    state: StepState::Running,
                    at_ms: now,
                },
                expect,
            },
        )
    }
}

/// `Ctx::step`'s promises as pure vectors: the machine driven through
/// scripted inputs (no journal, no clock), each test one row.
#[cfg(test)]
mod vectors {
    use idem_journal::journal::Claim;
    use idem_journal::record::{Blob, StepRecord, StepState};

    use super::{Action, Input, Outcome, Step};
    use crate::machine::vectors::{owner, setup};

    const NOW: u64 = 50_000;
    /// The setup's wait for a call in flight.
    const WAIT: u64 = 5_000;

    fn record(state: StepState) -> StepRecord {
        StepRecord {
            name: "fetch".into(),
            root_run: "run".into(),
            state,
            at_ms: 1,
        }
    }

    fn running(version: u64, claim: Option<Claim>) -> Input {
        Input::Found(Some((record(StepState::Running), version, claim)))
    }

    /// Feeds `inputs` in order and returns every action.
    fn drive(inputs: Vec<Input>) -> Vec<Action> {
        let setup = setup();
        let mut step = Step::new("fetch", "run");
        inputs
            .into_iter()
            .map(|input| step.step(&setup, NOW, input))
            .collect()
    }

    fn claim_running(expect: Option<u64>) -> Action {
        Action::Claim {
            rec: StepRecord {
                at_ms: NOW,
                ..record(StepState::Running)
            },
            expect,
        }
    }

    #[test]
    fn a_first_run_claims_runs_and_records_its_value_durably() {
        let value = Blob(vec![7]);
        let actions = drive(vec![
            Input::Start,
            Input::Led,
            Input::Found(None),
            Input::Written(3),
            Input::Ran(Some(Ok(value.clone()))),
            Input::Written(4),
        ]);
        assert_eq!(
            actions,
            vec![
                Action::Lead,
                Action::Read,
                claim_running(None),
                Action::Run,
                Action::Record {
                    rec: StepRecord {
                        at_ms: NOW,
                        ..record(StepState::Done { value })
                    },
                    expect: 3,
                },
                Action::Return(Outcome::Value),
            ]
        );
    }

    #[test]
    fn a_recorded_value_is_replayed_without_running() {
        let value = Blob(vec![9]);
        let done = Input::Found(Some((
            record(StepState::Done {
                value: value.clone(),
            }),
            5,
            None,
        )));
        let actions = drive(vec![
            Input::Start,
            Input::Led,
            done.clone(),
            Input::Decoded(true),
            Input::Appended,
        ]);
        assert_eq!(
            actions,
            vec![
                Action::Lead,
                Action::Read,
                Action::Decode(value),
                Action::EmitReplayed,
                Action::Return(Outcome::Value),
            ]
        );
        assert!(!actions.contains(&Action::Run));
        // A stored value of another type is refused, never re-run.
        let actions = drive(vec![Input::Start, Input::Led, done, Input::Decoded(false)]);
        assert_eq!(actions.last(), Some(&Action::Return(Outcome::Undecodable)));
        assert!(!actions.contains(&Action::Run));
    }

    #[test]
    fn a_step_running_elsewhere_is_waited_for_and_never_run_twice() {
        let live_other = Some(Claim {
            owner: owner("there", 1),
            live: true,
        });
        let actions = drive(vec![
            Input::Start,
            Input::Led,
            running(6, live_other.clone()),
            Input::TimedOut,
        ]);
        assert_eq!(
            actions[2],
            Action::AwaitChange {
                version: 6,
                until: NOW + WAIT
            }
        );
        assert_eq!(actions[3], Action::Return(Outcome::InFlight));
        // A change: read again (and replay what the other recorded).
        let actions = drive(vec![
            Input::Start,
            Input::Led,
            running(6, live_other),
            Input::Changed,
        ]);
        assert_eq!(actions[3], Action::Lead);
    }

    #[test]
    fn a_step_whose_driver_is_gone_runs_again() {
        for claim in [
            // A lease that expired.
            Some(Claim {
                owner: owner("there", 1),
                live: false,
            }),
            // An earlier incarnation of this worker: dead.
            Some(Claim {
                owner: owner("here", 1),
                live: true,
            }),
            None,
        ] {
            let actions = drive(vec![
                Input::Start,
                Input::Led,
                running(6, claim.clone()),
                Input::Written(7),
            ]);
            assert_eq!(actions[2], claim_running(Some(6)), "{claim:?}");
            assert_eq!(actions[3], Action::Run, "{claim:?}");
        }
    }

    #[test]
    fn another_call_of_this_process_is_waited_for() {
        let actions = drive(vec![Input::Start, Input::Busy, Input::LeaderLeft]);
        assert_eq!(
            actions[1..],
            [Action::AwaitLeader { until: NOW + WAIT }, Action::Lead]
        );
        let actions = drive(vec![Input::Start, Input::Busy, Input::TimedOut]);
        assert_eq!(actions[2], Action::Return(Outcome::InFlight));
    }

    #[test]
    fn a_future_is_polled_at_most_once() {
        // The claim lost a race: start over; the other's record is Running,
        // its driver gone, so this call claims again; the future it would
        // run was not polled, so it runs now.
        let actions = drive(vec![
            Input::Start,
            Input::Led,
            Input::Found(None),
            Input::Conflict,
            Input::Led,
            running(2, None),
            Input::Written(3),
        ]);
        assert_eq!(actions[3], Action::Lead);
        assert_eq!(actions[6], Action::Run);
        // Once polled, a second claim never polls it again: in flight.
        let actions = drive(vec![
            Input::Start,
            Input::Led,
            Input::Found(None),
            Input::Written(3),
            Input::Ran(Some(Ok(Blob(vec![1])))),
            Input::Conflict,
            Input::Led,
            running(5, None),
            Input::Written(6),
        ]);
        assert_eq!(
            actions.iter().filter(|a| **a == Action::Run).count(),
            1,
            "{actions:?}"
        );
        assert_eq!(actions.last(), Some(&Action::Return(Outcome::InFlight)));
    }

    #[test]
    fn errors_end_the_step_with_what_went_wrong() {
        let head = || {
            vec![
                Input::Start,
                Input::Led,
                Input::Found(None),
                Input::Written(3),
            ]
        };
        let end = |tail: Vec<Input>| {
            let mut inputs = head();
            inputs.extend(tail);
            drive(inputs).pop().unwrap()
        };
        assert_eq!(end(vec![Input::Ran(None)]), Action::Return(Outcome::Error));
        assert_eq!(
            end(vec![Input::Ran(Some(Err("no serde".into())))]),
            Action::Return(Outcome::Unstorable("no serde".into()))
        );
        assert_eq!(
            end(vec![
                Input::Ran(Some(Ok(Blob(vec![1])))),
                Input::WriteFailed
            ]),
            Action::Return(Outcome::Journal)
        );
        assert_eq!(
            drive(vec![Input::Start, Input::Led, Input::ReadFailed]).pop(),
            Some(Action::Return(Outcome::Journal))
        );
        assert_eq!(
            drive(vec![
                Input::Start,
                Input::Led,
                Input::Found(None),
                Input::WriteFailed
            ])
            .pop(),
            Some(Action::Return(Outcome::Journal))
        );
        let done = Input::Found(Some((
            record(StepState::Done {
                value: Blob(vec![1]),
            }),
            5,
            None,
        )));
        assert_eq!(
            drive(vec![
                Input::Start,
                Input::Led,
                done,
                Input::Decoded(true),
                Input::AppendFailed
            ])
            .pop(),
            Some(Action::Return(Outcome::Journal))
        );
    }
}
