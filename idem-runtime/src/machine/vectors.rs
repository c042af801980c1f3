//! DESIGN's decision tables, row by row, as pure vectors: each test drives
//! the call machine through a scripted journal (a record that holds what
//! the last write put there), scripted attempt outcomes and `verify`
//! answers, and checks the actions and the outcome the row promises. No
//! journal, no clock, no tokio.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use idem_journal::class::{Class, OnDrift};
use idem_journal::journal::{Claim, Durability, Owner};
use idem_journal::record::{Blob, OpRecord, State, Via};

use super::call::{
    Action, Answer, Attempted, Call, Called, ClaimOp, Env, Found, Input, Outcome, Revert, Stored,
    ValueFrom,
};
use super::policy::{Policy, Setup};
use crate::failure::Failure;
use crate::retry::RetryPolicy;

const NOW: u64 = 1_000_000_000;

fn policy(class: Class, max_attempts: u32, verify: bool) -> Policy {
    Policy {
        class,
        retry: RetryPolicy {
            max_attempts,
            initial: Duration::from_millis(100),
            backoff: 2.0,
            max_interval: Duration::from_secs(10),
            max_elapsed: None,
            jitter: false,
        },
        dedupe_window: Duration::from_secs(24 * 3600),
        timeout: None,
        on_drift: OnDrift::Replay,
        drift_reject: &[],
        verify,
        commit: Durability::Immediate,
        approval_wait_ms: 0,
    }
}

pub(super) fn owner(worker: &str, incarnation: u64) -> Owner {
    Owner {
        worker: Arc::from(worker),
        incarnation,
    }
}

/// The machine's setup in every vector: worker `here`, incarnation 2, a
/// 5 s wait for a call in flight.
pub(super) fn setup() -> Setup {
    Setup {
        owner: owner("here", 2),
        claim_first: false,
        renewal_ms: None,
        in_flight_wait_ms: 5_000,
    }
}

fn called(class: Class) -> Called {
    Called {
        tool: "send".into(),
        class,
        root_run: "run".into(),
        scope: vec![],
        fingerprint: [7; 32],
        args: "{\"to\":\"a\"}".into(),
        approval: None,
    }
}

fn ok() -> Attempted {
    Attempted::Ok {
        stored: Stored::Bytes(Blob(vec![1, 2, 3])),
        provider_replay: false,
    }
}

fn failed(failure: Failure) -> Attempted {
    Attempted::Failed {
        failure,
        text: "boom".into(),
        typed: true,
    }
}

/// A record of this call's operation, as an earlier process left it.
fn left(class: Class, state: State, attempts: u32, maybe_landed: bool) -> OpRecord {
    let mut rec = super::call::blank_record(&called(class));
    rec.state = state;
    rec.attempts = attempts;
    rec.maybe_landed = maybe_landed;
    rec.first_attempt_ms = NOW - 1_000;
    rec.key_first_sent_ms = (attempts > 0).then_some(NOW - 1_000);
    rec.updated_ms = NOW - 1_000;
    rec
}

/// Claimed by an earlier incarnation of another worker that is gone.
fn dead() -> Option<Claim> {
    Some(Claim {
        owner: owner("gone", 1),
        live: false,
    })
}

/// What a run did: every action, and how it ended.
struct Run {
    actions: Vec<Action>,
    outcome: Outcome,
    /// The record the scripted journal holds at the end.
    stored: Option<OpRecord>,
    /// The key generation the call said it was at when it returned (what
    /// the driver shows in the key).
    generation: u32,
}

impl Run {
    fn attempts(&self) -> Vec<(u32, u32)> {
        self.actions
            .iter()
            .filter_map(|a| match a {
                Action::Attempt {
                    attempt,
                    generation,
                } => Some((*attempt, *generation)),
                _ => None,
            })
            .collect()
    }

    fn verifies(&self) -> usize {
        self.actions
            .iter()
            .filter(|a| matches!(a, Action::Verify { .. }))
            .count()
    }

    fn state(&self) -> &'static str {
        self.stored.as_ref().map_or("none", |r| r.state.name())
    }
}

/// Drives a call of `class` against a journal holding `found`, answering
/// attempts and `verify` from the scripts.
fn drive(
    policy: &Policy,
    found: Option<(OpRecord, Option<Claim>)>,
    attempts: Vec<Attempted>,
    answers: Vec<Answer>,
) -> Run {
    drive_with(policy, found, attempts, answers, Faults::default())
}

/// What the scripted journal does other than succeed.
#[derive(Default)]
struct Faults {
    /// The call's start (default: nothing cached, 10 bytes of arguments).
    start: Option<Input>,
    /// The `n`th write (from 0) is answered with this instead.
    write: Option<(usize, Input)>,
    /// Every event append fails.
    appends_fail: bool,
    /// The call needs a person's approval, for this reason.
    approval: Option<&'static str>,
    /// The call's arguments' fingerprint, when not the recorded one.
    fingerprint: Option<[u8; 32]>,
    /// The call's arguments as the record would hold them, when not
    /// `{"to":"a"}`.
    args: Option<&'static str>,
    /// The faulted write (`write`) happened all the same.
    write_lands: bool,
    /// The runtime claims a key before reading it (`Setup::claim_first`).
    claim_first: bool,
}

/// [`drive`], with `faults`.
fn drive_with(
    policy: &Policy,
    found: Option<(OpRecord, Option<Claim>)>,
    attempts: Vec<Attempted>,
    answers: Vec<Answer>,
    mut faults: Faults,
) -> Run {
    let setup = Setup {
        claim_first: faults.claim_first,
        ..setup()
    };
    let mut writes = 0usize;
    let mut attempts: VecDeque<_> = attempts.into();
    let mut answers: VecDeque<_> = answers.into();
    let mut record: Option<Found> = found.map(|(rec, claim)| Found {
        rec,
        version: 1,
        claim,
    });
    let mut call = Call::new(Called {
        approval: faults.approval.map(str::to_string),
        fingerprint: faults.fingerprint.unwrap_or([7; 32]),
        args: faults
            .args
            .map_or_else(|| called(policy.class).args, str::to_string),
        ..called(policy.class)
    });
    let mut now = NOW;
    let mut actions = Vec::new();
    let mut input = faults.start.take().unwrap_or(Input::Start {
        cached: None,
        args_len: 10,
    });
    for _ in 0..200 {
        let env = Env { now, jitter: 0.5 };
        assert!(
            !call.is_done(),
            "the call says it is done before it returned"
        );
        let action = call.step(policy, &setup, env, input);
        actions.push(action.clone());
        let is_write = matches!(action, Action::Write(_));
        input = match action {
            Action::Lead => Input::Led,
            Action::AwaitLeader { .. } => Input::TimedOut,
            Action::AwaitChange { .. } => Input::TimedOut,
            Action::Read | Action::Revert(Revert::Read) => {
                Input::Found(record.clone().map(Box::new))
            }
            Action::Write(op) if faults.write.as_ref().is_some_and(|(n, _)| *n == writes) => {
                writes += 1;
                if faults.write_lands {
                    let version = record.as_ref().map_or(1, |f| f.version + 1);
                    record = Some(Found {
                        rec: OpRecord::clone(&op.rec),
                        version,
                        claim: Some(Claim {
                            owner: setup.owner.clone(),
                            live: false,
                        }),
                    });
                }
                faults.write.take().expect("checked").1
            }
            Action::Write(op) | Action::Revert(Revert::Write(op)) => {
                if is_write {
                    writes += 1;
                }
                let version = record.as_ref().map_or(1, |f| f.version + 1);
                let claim = match op.claim {
                    ClaimOp::Take => Some(Claim {
                        owner: setup.owner.clone(),
                        live: false,
                    }),
                    ClaimOp::Release => None,
                    ClaimOp::Keep => record.as_ref().and_then(|f| f.claim.clone()),
                };
                record = Some(Found {
                    rec: OpRecord::clone(&op.rec),
                    version,
                    claim,
                });
                Input::Written {
                    version,
                    epoch: 1,
                    took_ms: 0,
                }
            }
            Action::Revert(Revert::Remove { .. }) => {
                record = None;
                Input::Removed(true)
            }
            Action::Emit(_) | Action::EmitBestEffort(_) if faults.appends_fail => {
                Input::AppendFailed
            }
            Action::Emit(_) | Action::EmitBestEffort(_) => Input::Appended,
            Action::Attempt { .. } => {
                Input::Attempted(attempts.pop_front().expect("an attempt nobody scripted"))
            }
            Action::Verify { .. } => {
                Input::Verified(answers.pop_front().expect("a verify nobody scripted"))
            }
            Action::Decode(_) => Input::Decoded(true),
            Action::Sleep { until } => {
                now = now.max(until);
                Input::Slept
            }
            Action::Return { outcome, .. } => {
                assert!(call.is_done());
                return Run {
                    actions,
                    outcome,
                    stored: record.map(|f| f.rec),
                    generation: call.generation(),
                };
            }
        };
    }
    panic!("no return after 200 actions: {actions:#?}");
}

/// Every attempt is preceded by an INTENT written at Immediate durability
/// that counts it.
fn intents_precede_attempts(run: &Run) {
    // (attempts counted, durability) of the last write, if an INTENT.
    let mut last_intent: Option<(u32, Durability)> = None;
    for a in &run.actions {
        match a {
            Action::Write(op) if op.rec.state == State::Intent => {
                last_intent = Some((op.rec.attempts, op.durability));
            }
            Action::Write(_) => last_intent = None,
            Action::Attempt { attempt, .. } => {
                assert_eq!(
                    last_intent,
                    Some((*attempt, Durability::Immediate)),
                    "attempt {attempt} without its immediate INTENT"
                );
                last_intent = None;
            }
            _ => {}
        }
    }
}

// The first table: what a call does with the record it finds.

#[test]
fn no_record_writes_an_intent_then_runs_and_commits_for_every_class() {
    for class in [Class::Provider, Class::Journal, Class::AtMostOnce] {
        let run = drive(&policy(class, 3, false), None, vec![ok()], vec![]);
        assert_eq!(run.attempts(), vec![(1, 0)], "{class}");
        assert_eq!(run.outcome, Outcome::Value(ValueFrom::Attempt), "{class}");
        assert_eq!(run.state(), "committed", "{class}");
        assert_eq!(run.generation, 0, "{class}");
        intents_precede_attempts(&run);
    }
}

#[test]
fn committed_replays_without_calling_for_every_class() {
    for class in [Class::Provider, Class::Journal, Class::AtMostOnce] {
        let rec = left(
            class,
            State::Committed {
                result: Blob(vec![9]),
                via: Via::Call,
            },
            1,
            false,
        );
        let run = drive(&policy(class, 3, false), Some((rec, None)), vec![], vec![]);
        assert!(run.attempts().is_empty(), "{class}");
        assert_eq!(run.outcome, Outcome::Value(ValueFrom::Record), "{class}");
    }
}

#[test]
fn an_intent_claimed_by_a_live_driver_elsewhere_is_waited_for_never_run() {
    for class in [Class::Provider, Class::Journal, Class::AtMostOnce] {
        let rec = left(class, State::Intent, 1, true);
        let live = Some(Claim {
            owner: owner("other", 1),
            live: true,
        });
        let run = drive(&policy(class, 3, true), Some((rec, live)), vec![], vec![]);
        assert!(run.attempts().is_empty(), "{class}");
        assert!(
            run.actions
                .iter()
                .any(|a| matches!(a, Action::AwaitChange { .. })),
            "{class}: {:?}",
            run.actions
        );
        assert_eq!(run.outcome, Outcome::InFlight, "{class}");
    }
}

#[test]
fn a_dead_provider_intent_is_re_run_under_the_same_key() {
    let rec = left(Class::Provider, State::Intent, 1, true);
    let run = drive(
        &policy(Class::Provider, 3, false),
        Some((rec, dead())),
        vec![ok()],
        vec![],
    );
    assert_eq!(run.attempts(), vec![(2, 0)]);
    assert_eq!(run.state(), "committed");
    intents_precede_attempts(&run);
}

#[test]
fn a_dead_provider_intent_past_the_dedupe_window_escalates() {
    let mut rec = left(Class::Provider, State::Intent, 1, true);
    rec.key_first_sent_ms = Some(NOW - 25 * 3600 * 1000);
    let run = drive(
        &policy(Class::Provider, 3, false),
        Some((rec, dead())),
        vec![],
        vec![],
    );
    assert!(run.attempts().is_empty());
    assert!(
        matches!(run.outcome, Outcome::Escalated { .. }),
        "{:?}",
        run.outcome
    );
    assert_eq!(run.state(), "escalated");
}

#[test]
fn a_dead_provider_intent_with_its_budget_spent_escalates() {
    let rec = left(Class::Provider, State::Intent, 3, true);
    let run = drive(
        &policy(Class::Provider, 3, false),
        Some((rec, dead())),
        vec![],
        vec![],
    );
    assert!(run.attempts().is_empty());
    assert!(
        matches!(run.outcome, Outcome::Escalated { .. }),
        "{:?}",
        run.outcome
    );
}

#[test]
fn a_dead_journal_intent_asks_verify_first_and_re_runs_only_if_it_did_not_land() {
    let p = policy(Class::Journal, 3, true);
    let landed = drive(
        &p,
        Some((left(Class::Journal, State::Intent, 1, true), dead())),
        vec![],
        vec![Answer::Landed(Stored::Bytes(Blob(vec![5])))],
    );
    assert!(landed.attempts().is_empty());
    assert_eq!(landed.outcome, Outcome::Value(ValueFrom::Verify));
    assert_eq!(landed.state(), "committed");

    let not = drive(
        &p,
        Some((left(Class::Journal, State::Intent, 1, true), dead())),
        vec![ok()],
        vec![Answer::NotLanded],
    );
    assert_eq!(not.verifies(), 1);
    assert_eq!(not.attempts(), vec![(2, 0)]);
    intents_precede_attempts(&not);

    for answer in [
        Answer::Unknown,
        Answer::Failed("verify broke".into()),
        Answer::TimedOut("verify timed out".into()),
    ] {
        let run = drive(
            &p,
            Some((left(Class::Journal, State::Intent, 1, true), dead())),
            vec![],
            vec![answer.clone()],
        );
        assert!(run.attempts().is_empty(), "{answer:?}");
        assert!(
            matches!(run.outcome, Outcome::Escalated { .. }),
            "{answer:?}"
        );
    }
}

#[test]
fn a_dead_journal_intent_without_verify_escalates() {
    let run = drive(
        &policy(Class::Journal, 3, false),
        Some((left(Class::Journal, State::Intent, 1, true), dead())),
        vec![],
        vec![],
    );
    assert!(run.attempts().is_empty());
    assert!(matches!(run.outcome, Outcome::Escalated { .. }));
}

#[test]
fn a_dead_at_most_once_intent_escalates_without_calling() {
    let run = drive(
        &policy(Class::AtMostOnce, 3, false),
        Some((left(Class::AtMostOnce, State::Intent, 1, true), dead())),
        vec![],
        vec![],
    );
    assert!(run.attempts().is_empty());
    assert!(matches!(run.outcome, Outcome::Escalated { .. }));
    assert_eq!(run.state(), "escalated");
}

#[test]
fn a_dead_waiting_record_resumes_its_budget() {
    for class in [Class::Provider, Class::Journal, Class::AtMostOnce] {
        let rec = left(class, State::Waiting, 1, false);
        let run = drive(
            &policy(class, 3, false),
            Some((rec, dead())),
            vec![ok()],
            vec![],
        );
        assert_eq!(run.attempts(), vec![(2, 0)], "{class}");
        assert_eq!(run.state(), "committed", "{class}");
    }
}

#[test]
fn rejected_found_first_runs_under_the_next_generation() {
    for class in [Class::Provider, Class::Journal, Class::AtMostOnce] {
        let rec = left(
            class,
            State::Rejected {
                error: "declined".into(),
            },
            1,
            false,
        );
        let run = drive(
            &policy(class, 3, false),
            Some((rec, None)),
            vec![ok()],
            vec![],
        );
        assert_eq!(run.attempts(), vec![(1, 1)], "{class}");
        assert_eq!(run.stored.as_ref().unwrap().generation, 1);
        assert_eq!(run.generation, 1, "the key the driver shows: {class}");
    }
}

#[test]
fn failed_found_first_runs_with_a_fresh_budget_under_the_same_key() {
    for class in [Class::Provider, Class::Journal, Class::AtMostOnce] {
        let rec = left(
            class,
            State::Failed {
                error: "down".into(),
            },
            3,
            false,
        );
        let run = drive(
            &policy(class, 3, false),
            Some((rec, None)),
            vec![ok()],
            vec![],
        );
        assert_eq!(run.attempts(), vec![(1, 0)], "{class}");
    }
}

#[test]
fn reissue_runs_with_a_fresh_budget_under_the_same_key() {
    for class in [Class::Provider, Class::Journal, Class::AtMostOnce] {
        let rec = left(class, State::Reissue, 1, true);
        let run = drive(
            &policy(class, 3, false),
            Some((rec, None)),
            vec![ok()],
            vec![],
        );
        assert_eq!(run.attempts(), vec![(1, 0)], "{class}");
        intents_precede_attempts(&run);
    }
}

#[test]
fn escalated_and_abandoned_answer_without_calling() {
    for class in [Class::Provider, Class::Journal, Class::AtMostOnce] {
        let esc = drive(
            &policy(class, 3, false),
            Some((left(class, State::Escalated, 1, true), None)),
            vec![],
            vec![],
        );
        assert!(matches!(esc.outcome, Outcome::Escalated { .. }), "{class}");
        assert!(esc.attempts().is_empty());
        let ab = drive(
            &policy(class, 3, false),
            Some((left(class, State::Abandoned, 1, true), None)),
            vec![],
            vec![],
        );
        assert_eq!(ab.outcome, Outcome::Abandoned, "{class}");
        assert!(ab.attempts().is_empty());
    }
}

// The second table: after each failed attempt.

#[test]
fn not_sent_backs_off_and_retries_for_every_class() {
    for class in [Class::Provider, Class::Journal, Class::AtMostOnce] {
        let run = drive(
            &policy(class, 3, false),
            None,
            vec![failed(Failure::not_sent()), ok()],
            vec![],
        );
        assert_eq!(run.attempts(), vec![(1, 0), (2, 0)], "{class}");
        assert!(
            run.actions
                .iter()
                .any(|a| matches!(a, Action::Sleep { .. })),
            "{class}: no backoff"
        );
        intents_precede_attempts(&run);
    }
}

#[test]
fn ambiguous_provider_retries_under_the_same_key() {
    let run = drive(
        &policy(Class::Provider, 3, false),
        None,
        vec![failed(Failure::ambiguous()), ok()],
        vec![],
    );
    assert_eq!(run.attempts(), vec![(1, 0), (2, 0)]);
    assert_eq!(run.verifies(), 0);
}

#[test]
fn ambiguous_journal_asks_verify_and_retries_only_if_not_landed() {
    let p = policy(Class::Journal, 3, true);
    let not = drive(
        &p,
        None,
        vec![failed(Failure::ambiguous()), ok()],
        vec![Answer::NotLanded],
    );
    assert_eq!(not.attempts(), vec![(1, 0), (2, 0)]);
    assert_eq!(not.verifies(), 1);
    let landed = drive(
        &p,
        None,
        vec![failed(Failure::ambiguous())],
        vec![Answer::Landed(Stored::Bytes(Blob(vec![4])))],
    );
    assert_eq!(landed.attempts(), vec![(1, 0)]);
    assert_eq!(landed.outcome, Outcome::Value(ValueFrom::Verify));
    let unknown = drive(
        &p,
        None,
        vec![failed(Failure::ambiguous())],
        vec![Answer::Unknown],
    );
    assert_eq!(unknown.attempts(), vec![(1, 0)]);
    assert!(matches!(unknown.outcome, Outcome::Escalated { .. }));
}

#[test]
fn ambiguous_at_most_once_escalates_at_once() {
    let run = drive(
        &policy(Class::AtMostOnce, 3, false),
        None,
        vec![failed(Failure::ambiguous())],
        vec![],
    );
    assert_eq!(run.attempts(), vec![(1, 0)]);
    assert!(matches!(run.outcome, Outcome::Escalated { .. }));
    assert_eq!(run.state(), "escalated");
}

#[test]
fn semantic_is_rejected_and_returned() {
    for class in [Class::Provider, Class::Journal, Class::AtMostOnce] {
        let run = drive(
            &policy(class, 3, false),
            None,
            vec![failed(Failure::Semantic)],
            vec![],
        );
        assert_eq!(run.attempts(), vec![(1, 0)], "{class}");
        assert_eq!(run.outcome, Outcome::Tool, "{class}");
        assert_eq!(run.state(), "rejected", "{class}");
    }
}

#[test]
fn semantic_after_an_attempt_that_may_have_landed_escalates() {
    let run = drive(
        &policy(Class::Provider, 3, false),
        None,
        vec![failed(Failure::ambiguous()), failed(Failure::Semantic)],
        vec![],
    );
    assert_eq!(run.attempts(), vec![(1, 0), (2, 0)]);
    assert!(
        matches!(run.outcome, Outcome::Escalated { .. }),
        "{:?}",
        run.outcome
    );
}

#[test]
fn a_spent_budget_fails_when_nothing_may_have_landed_and_escalates_otherwise() {
    let p = policy(Class::Provider, 2, false);
    let failed_run = drive(
        &p,
        None,
        vec![failed(Failure::not_sent()), failed(Failure::not_sent())],
        vec![],
    );
    assert_eq!(failed_run.attempts().len(), 2);
    assert_eq!(failed_run.outcome, Outcome::Tool);
    assert_eq!(failed_run.state(), "failed");
    let doubt = drive(
        &p,
        None,
        vec![failed(Failure::ambiguous()), failed(Failure::ambiguous())],
        vec![],
    );
    assert_eq!(doubt.attempts().len(), 2);
    assert!(matches!(doubt.outcome, Outcome::Escalated { .. }));
}

#[test]
fn arguments_over_the_limit_fail_before_any_write() {
    let mut call = Call::new(called(Class::Provider));
    let action = call.step(
        &policy(Class::Provider, 3, false),
        &setup(),
        Env {
            now: NOW,
            jitter: 0.5,
        },
        Input::Start {
            cached: None,
            args_len: super::policy::MAX_ARGS_BYTES + 1,
        },
    );
    assert!(
        matches!(
            action,
            Action::Return {
                outcome: Outcome::Journal(super::call::Fault::TooLarge { .. }),
                ..
            }
        ),
        "{action:?}"
    );
}

/// An operator's resolution (DESIGN §10): which records it may settle and
/// what they become, as pure vectors of `machine::resolve`.
mod resolutions {
    use idem_journal::audit::EventKind;
    use idem_journal::class::Class;
    use idem_journal::record::{Blob, ResolutionInfo, State, Via};

    use super::{left, NOW};
    use crate::machine::resolve::{admissible, apply, Decision};

    fn decided(kind: &str, state: State) -> idem_journal::record::OpRecord {
        let mut rec = left(Class::AtMostOnce, state, 1, false);
        rec.resolution = Some(ResolutionInfo {
            kind: kind.into(),
            note: "first".into(),
            at_ms: NOW - 10,
            amendments: 0,
        });
        rec
    }

    #[test]
    fn only_escalations_and_operators_own_decisions_can_be_resolved() {
        let escalated = left(Class::AtMostOnce, State::Escalated, 1, true);
        assert_eq!(admissible(&escalated), Ok(None));
        let landed = decided(
            "landed",
            State::Committed {
                result: Blob(vec![1]),
                via: Via::Operator,
            },
        );
        assert_eq!(admissible(&landed), Ok(Some("landed".into())));
        assert_eq!(
            admissible(&decided("reissue", State::Reissue)),
            Ok(Some("reissue".into()))
        );
        assert_eq!(
            admissible(&decided("abandon", State::Abandoned)),
            Ok(Some("abandon".into()))
        );
        // What the engine settled itself is never an operator's to change.
        let committed = left(
            Class::AtMostOnce,
            State::Committed {
                result: Blob(vec![1]),
                via: Via::Call,
            },
            1,
            false,
        );
        assert!(admissible(&committed).is_err());
        assert!(admissible(&left(Class::AtMostOnce, State::Intent, 1, true)).is_err());
        // Even with a resolution on it (an operator's reissue the engine
        // then ran and committed).
        let mut rerun = committed.clone();
        rerun.resolution = decided("reissue", State::Reissue).resolution;
        assert!(admissible(&rerun).is_err());
    }

    #[test]
    fn landed_commits_the_operators_result_with_both_events() {
        let escalated = left(Class::AtMostOnce, State::Escalated, 1, true);
        let (rec, events) = apply(
            escalated,
            None,
            Decision::Landed(Blob(vec![4, 2])),
            "bank says sent",
            NOW,
        );
        assert_eq!(
            rec.state,
            State::Committed {
                result: Blob(vec![4, 2]),
                via: Via::Operator
            }
        );
        assert!(!rec.maybe_landed);
        assert_eq!(rec.updated_ms, NOW);
        let info = rec.resolution.unwrap();
        assert_eq!(
            (
                info.kind.as_str(),
                info.note.as_str(),
                info.at_ms,
                info.amendments
            ),
            ("landed", "bank says sent", NOW, 0)
        );
        assert_eq!(
            events,
            vec![
                EventKind::Resolved {
                    resolution: "landed".into(),
                    note: "bank says sent".into()
                },
                EventKind::Committed {
                    attempt: 0,
                    via: "operator".into()
                },
            ]
        );
    }

    #[test]
    fn an_amendment_says_what_it_replaced_and_counts() {
        let first = decided(
            "landed",
            State::Committed {
                result: Blob(vec![1]),
                via: Via::Operator,
            },
        );
        let (rec, events) = apply(
            first,
            Some("landed".into()),
            Decision::Reissue,
            "wrong",
            NOW,
        );
        assert_eq!(rec.state, State::Reissue);
        assert_eq!(rec.resolution.as_ref().unwrap().amendments, 1);
        assert_eq!(
            events,
            vec![EventKind::Amended {
                previous: "landed".into(),
                resolution: "reissue".into(),
                note: "wrong".into()
            }]
        );
        let (rec, events) = apply(
            rec,
            Some("reissue".into()),
            Decision::Abandon,
            "never",
            NOW + 1,
        );
        assert_eq!(rec.state, State::Abandoned);
        assert_eq!(rec.resolution.as_ref().unwrap().amendments, 2);
        assert_eq!(
            events.len(),
            1,
            "no commit event without a result: {events:?}"
        );
    }
}

/// What the driver is told when the journal fails around a call (cargo
/// mutants found these rows checked only by the engine's own tests).
mod journal_faults {
    use idem_journal::audit::EventKind;
    use idem_journal::class::Class;
    use idem_journal::record::{Blob, State, Via};

    use super::super::call::{Action, Input, Outcome, Revert, ValueFrom};
    use super::super::policy::MAX_ARGS_BYTES;
    use super::{drive_with, left, ok, policy, Faults};

    #[test]
    fn arguments_up_to_the_limit_are_taken() {
        let run = drive_with(
            &policy(Class::Provider, 3, false),
            None,
            vec![ok()],
            vec![],
            Faults {
                start: Some(Input::Start {
                    cached: None,
                    args_len: MAX_ARGS_BYTES,
                }),
                ..Faults::default()
            },
        );
        assert_eq!(run.outcome, Outcome::Value(ValueFrom::Attempt));
    }

    #[test]
    fn a_replay_is_answered_even_when_its_event_cannot_be_written() {
        // From the record (a broken journal still serves what it holds).
        let committed = left(
            Class::Provider,
            State::Committed {
                result: Blob(vec![9]),
                via: Via::Call,
            },
            1,
            false,
        );
        let run = drive_with(
            &policy(Class::Provider, 3, false),
            Some((committed, None)),
            vec![],
            vec![],
            Faults {
                appends_fail: true,
                ..Faults::default()
            },
        );
        assert_eq!(run.outcome, Outcome::Value(ValueFrom::Record));
        assert!(run.attempts().is_empty());
        // From the cache of committed results.
        let run = drive_with(
            &policy(Class::Provider, 3, false),
            None,
            vec![],
            vec![],
            Faults {
                start: Some(Input::Start {
                    cached: Some(0),
                    args_len: 10,
                }),
                appends_fail: true,
                ..Faults::default()
            },
        );
        assert_eq!(run.outcome, Outcome::Value(ValueFrom::Cache));
    }

    #[test]
    fn a_commit_that_lost_to_a_new_owner_says_it_was_fenced_off() {
        // The INTENT is write 0; the COMMIT, write 1, finds the record
        // taken over. (What it re-decides from then is the scripted
        // journal's: its own INTENT, so a provider retries, same key.)
        let run = drive_with(
            &policy(Class::Provider, 3, false),
            None,
            vec![ok(), ok()],
            vec![],
            Faults {
                write: Some((1, Input::Conflict(None))),
                ..Faults::default()
            },
        );
        assert!(
            run.actions.iter().any(|a| matches!(
                a,
                Action::EmitBestEffort(EventKind::Fenced { outcome, .. }) if outcome == "landed"
            )),
            "{:#?}",
            run.actions
        );
    }

    #[test]
    fn an_intent_reported_failed_is_read_back_before_anything_else() {
        // The write may have reached the disk: the machine reads what is
        // there (and puts back what it replaced) instead of returning.
        let run = drive_with(
            &policy(Class::Provider, 3, false),
            None,
            vec![ok()],
            vec![],
            Faults {
                write: Some((0, Input::WriteFailed)),
                ..Faults::default()
            },
        );
        let failed_at = 1 + run
            .actions
            .iter()
            .position(|a| matches!(a, Action::Write(_)))
            .expect("an intent write");
        assert!(
            matches!(run.actions[failed_at], Action::Revert(Revert::Read)),
            "{:#?}",
            run.actions
        );
        assert!(
            run.attempts().is_empty(),
            "no attempt after a failed INTENT"
        );
    }
}

// Drift: the same key with other arguments.

/// A committed record of this key made with other arguments: `{"to":"b"}`
/// (or none recorded, when `args` is empty).
fn committed_with(class: Class, args: &str) -> OpRecord {
    let mut rec = left(
        class,
        State::Committed {
            result: Blob(vec![9]),
            via: Via::Call,
        },
        1,
        false,
    );
    rec.fingerprint = [8; 32];
    rec.args = args.into();
    rec
}

/// The policy of the drift events a run emitted.
fn drift_events(run: &Run) -> Vec<OnDrift> {
    run.actions
        .iter()
        .filter_map(|a| match a {
            Action::Emit(idem_journal::audit::EventKind::ArgsDrift { policy }) => Some(*policy),
            _ => None,
        })
        .collect()
}

#[test]
fn a_drifted_call_replays_unless_the_policy_or_a_listed_field_rejects_it() {
    for class in [Class::Provider, Class::Journal, Class::AtMostOnce] {
        let rec = committed_with(class, "{\"to\":\"b\"}");
        // (on_drift, drift_reject) → outcome, the policy the event records.
        let rows: [(OnDrift, &'static [&'static str], Outcome, OnDrift); 4] = [
            (
                OnDrift::Replay,
                &[],
                Outcome::Value(ValueFrom::Record),
                OnDrift::Replay,
            ),
            (OnDrift::Reject, &[], Outcome::ArgsMismatch, OnDrift::Reject),
            // `to` changed and is listed: refused.
            (
                OnDrift::Replay,
                &["amount", "to"],
                Outcome::ArgsMismatch,
                OnDrift::Reject,
            ),
            // Only unlisted fields changed: replayed.
            (
                OnDrift::Replay,
                &["amount"],
                Outcome::Value(ValueFrom::Record),
                OnDrift::Replay,
            ),
        ];
        for (on_drift, fields, outcome, recorded) in rows {
            let mut p = policy(class, 3, false);
            p.on_drift = on_drift;
            p.drift_reject = fields;
            let run = drive(&p, Some((rec.clone(), None)), vec![], vec![]);
            let row = format!("{class} {on_drift:?} {fields:?}");
            assert!(run.attempts().is_empty(), "{row}");
            assert_eq!(run.outcome, outcome, "{row}");
            assert_eq!(drift_events(&run), [recorded], "{row}");
        }
    }
}

#[test]
fn a_listed_field_refuses_when_the_record_does_not_hold_its_arguments() {
    let mut p = policy(Class::Provider, 3, false);
    p.drift_reject = &["to"];
    let rec = committed_with(Class::Provider, "");
    let run = drive(&p, Some((rec, None)), vec![], vec![]);
    assert_eq!(run.outcome, Outcome::ArgsMismatch, "fails closed");
    assert_eq!(drift_events(&run), [OnDrift::Reject]);
}

#[test]
fn a_listed_field_refuses_to_recover_an_unfinished_operation_it_changed() {
    let mut p = policy(Class::Provider, 3, false);
    p.drift_reject = &["to"];
    let mut rec = left(Class::Provider, State::Intent, 1, true);
    rec.fingerprint = [8; 32];
    rec.args = "{\"to\":\"b\"}".into();
    let run = drive(&p, Some((rec.clone(), dead())), vec![], vec![]);
    assert!(run.attempts().is_empty());
    assert_eq!(run.outcome, Outcome::ArgsMismatch);
    // Unlisted: the operation is recovered (re-run under its key).
    p.drift_reject = &["amount"];
    let run = drive(&p, Some((rec, dead())), vec![ok()], vec![]);
    assert_eq!(run.attempts(), vec![(2, 0)]);
    assert_eq!(run.outcome, Outcome::Value(ValueFrom::Attempt));
}

// Approval before the call (`approve = ...`).

/// A record left awaiting (or decided on) an approval of generation 0 with
/// the call's arguments.
fn asked(class: Class, state: State, approved: Option<bool>) -> OpRecord {
    let mut rec = left(class, state, 0, false);
    rec.approval = Some(idem_journal::record::ApprovalInfo {
        reason: "always".into(),
        requested_ms: NOW - 1_000,
        generation: 0,
        fingerprint: [7; 32],
        decision: approved.map(|approved| idem_journal::record::ApprovalDecision {
            approved,
            note: "checked".into(),
            at_ms: NOW - 500,
            via: "cli".into(),
        }),
    });
    rec
}

fn gated() -> Faults {
    Faults {
        approval: Some("above 1000 EUR"),
        ..Faults::default()
    }
}

#[test]
fn a_call_that_needs_approval_records_the_request_durably_and_runs_nothing() {
    for class in [Class::Provider, Class::Journal, Class::AtMostOnce] {
        let run = drive_with(&policy(class, 3, false), None, vec![], vec![], gated());
        assert_eq!(run.outcome, Outcome::AwaitingApproval, "{class}");
        assert!(run.attempts().is_empty(), "{class}");
        let writes: Vec<_> = run
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Write(op) => Some(op),
                _ => None,
            })
            .collect();
        assert_eq!(writes.len(), 1, "{class}");
        let op = writes[0];
        assert_eq!(op.rec.state, State::AwaitingApproval, "{class}");
        assert_eq!(op.durability, Durability::Immediate, "{class}");
        // Listed for people, and claimed by nobody.
        assert!(op.escalated, "{class}");
        assert_eq!(op.claim, ClaimOp::Release, "{class}");
        let approval = op.rec.approval.as_ref().expect("the request");
        assert_eq!(approval.reason, "above 1000 EUR");
        assert_eq!(approval.generation, 0);
        assert_eq!(approval.decision, None);
        assert_eq!(
            op.events,
            vec![idem_journal::audit::EventKind::ApprovalRequested {
                reason: "above 1000 EUR".into()
            }]
        );
    }
}

#[test]
fn a_call_that_needs_none_never_asks() {
    let run = drive(&policy(Class::Provider, 3, false), None, vec![ok()], vec![]);
    assert_eq!(run.outcome, Outcome::Value(ValueFrom::Attempt));
    assert!(run.stored.unwrap().approval.is_none());
}

#[test]
fn approval_wait_waits_for_the_record_to_change_then_says_it_awaits() {
    let mut p = policy(Class::Provider, 3, false);
    p.approval_wait_ms = 600_000;
    let run = drive_with(&p, None, vec![], vec![], gated());
    assert_eq!(run.outcome, Outcome::AwaitingApproval);
    let waits: Vec<_> = run
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::AwaitChange { until, .. } => Some(*until),
            _ => None,
        })
        .collect();
    assert_eq!(waits, vec![NOW + 600_000]);
}

#[test]
fn a_pending_approval_is_awaited_never_asked_again() {
    for approval in [Some("above 1000 EUR"), None] {
        let found = asked(Class::Provider, State::AwaitingApproval, None);
        let run = drive_with(
            &policy(Class::Provider, 3, false),
            Some((found, None)),
            vec![],
            vec![],
            Faults {
                approval,
                ..Faults::default()
            },
        );
        assert_eq!(run.outcome, Outcome::AwaitingApproval, "{approval:?}");
        assert!(!run.actions.iter().any(|a| matches!(a, Action::Write(_))));
    }
}

#[test]
fn a_pending_approval_with_other_arguments_follows_on_drift() {
    let found = asked(Class::Provider, State::AwaitingApproval, None);
    let mut p = policy(Class::Provider, 3, false);
    p.on_drift = OnDrift::Reject;
    let run = drive_with(
        &p,
        Some((found.clone(), None)),
        vec![],
        vec![],
        Faults {
            fingerprint: Some([8; 32]),
            ..gated()
        },
    );
    assert_eq!(run.outcome, Outcome::ArgsMismatch);
    let run = drive_with(
        &policy(Class::Provider, 3, false),
        Some((found, None)),
        vec![],
        vec![],
        Faults {
            fingerprint: Some([8; 32]),
            ..gated()
        },
    );
    assert_eq!(run.outcome, Outcome::AwaitingApproval);
}

#[test]
fn an_approved_call_runs_once_and_keeps_its_approval() {
    for class in [Class::Provider, Class::Journal, Class::AtMostOnce] {
        let found = asked(class, State::Approved, Some(true));
        let run = drive_with(
            &policy(class, 3, false),
            Some((found, None)),
            vec![ok()],
            vec![],
            gated(),
        );
        assert_eq!(run.outcome, Outcome::Value(ValueFrom::Attempt), "{class}");
        assert_eq!(run.attempts(), vec![(1, 0)], "{class}");
        intents_precede_attempts(&run);
        let stored = run.stored.unwrap();
        assert_eq!(stored.state.name(), "committed");
        let decision = stored.approval.unwrap().decision.unwrap();
        assert!(decision.approved);
        assert_eq!(decision.via, "cli");
    }
}

#[test]
fn what_runs_is_what_was_approved_never_other_arguments() {
    // Even under on_drift = "replay": nothing of the approved call has run.
    let found = asked(Class::Provider, State::Approved, Some(true));
    let run = drive_with(
        &policy(Class::Provider, 3, false),
        Some((found, None)),
        vec![],
        vec![],
        Faults {
            fingerprint: Some([8; 32]),
            ..gated()
        },
    );
    assert_eq!(run.outcome, Outcome::ArgsMismatch);
    assert!(run.attempts().is_empty());
}

#[test]
fn a_refused_call_returns_the_note_and_never_runs() {
    let found = asked(
        Class::Provider,
        State::NotApproved {
            note: "not this vendor".into(),
        },
        Some(false),
    );
    for fingerprint in [[7; 32], [8; 32]] {
        let run = drive_with(
            &policy(Class::Provider, 3, false),
            Some((found.clone(), None)),
            vec![],
            vec![],
            Faults {
                fingerprint: Some(fingerprint),
                ..gated()
            },
        );
        assert_eq!(
            run.outcome,
            Outcome::NotApproved {
                note: "not this vendor".into()
            }
        );
        assert!(!run.actions.iter().any(|a| matches!(a, Action::Write(_))));
    }
}

#[test]
fn a_fresh_budget_runs_on_the_approval_a_new_generation_asks_again() {
    let p = policy(Class::Provider, 3, false);
    // Failed (its attempts spent, nothing landed): the same decision's
    // approval stands for the fresh budget.
    let mut failed = asked(
        Class::Provider,
        State::Failed {
            error: "down".into(),
        },
        Some(true),
    );
    failed.attempts = 3;
    let run = drive_with(&p, Some((failed, None)), vec![ok()], vec![], gated());
    assert_eq!(run.outcome, Outcome::Value(ValueFrom::Attempt));
    // Refused by the provider: a new generation is a new decision.
    let rejected = asked(
        Class::Provider,
        State::Rejected {
            error: "card declined".into(),
        },
        Some(true),
    );
    let run = drive_with(&p, Some((rejected, None)), vec![], vec![], gated());
    assert_eq!(run.outcome, Outcome::AwaitingApproval);
    let stored = run.stored.unwrap();
    assert_eq!(stored.generation, 1);
    assert_eq!(stored.approval.unwrap().generation, 1);
}

// Rows cargo mutants found unchecked by the vectors and the checker
// (call.rs, this session's run).

#[test]
fn a_record_of_another_tool_of_the_same_class_is_refused() {
    let mut rec = left(Class::Provider, State::Waiting, 1, false);
    rec.tool = "another".into();
    let run = drive(
        &policy(Class::Provider, 3, false),
        Some((rec, None)),
        vec![],
        vec![],
    );
    assert!(
        matches!(
            &run.outcome,
            Outcome::Journal(super::call::Fault::ToolMismatch { stored_tool, .. }) if stored_tool == "another"
        ),
        "{:?}",
        run.outcome
    );
    assert!(run.attempts().is_empty());
}

#[test]
fn max_elapsed_is_spent_only_past_it() {
    let mut p = policy(Class::Provider, 5, false);
    p.retry.max_elapsed = Some(Duration::from_secs(1));
    let at = |ago: u64| {
        let mut rec = left(Class::Provider, State::Waiting, 1, false);
        rec.first_attempt_ms = NOW - ago;
        super::call::budget_spent(&p, &rec, NOW, Duration::ZERO)
    };
    assert_eq!(at(500), None, "half of it");
    assert_eq!(at(1_000), None, "exactly it: not past it");
    assert!(at(1_001).is_some(), "past it");
}

#[test]
fn commit_eventual_writes_the_committed_record_eventually_but_never_for_at_most_once() {
    for (class, want) in [
        (Class::Provider, Durability::Eventual),
        (Class::Journal, Durability::Eventual),
        (Class::AtMostOnce, Durability::Immediate),
    ] {
        let mut p = policy(class, 3, false);
        p.commit = Durability::Eventual;
        let run = drive(&p, None, vec![ok()], vec![]);
        let committed: Vec<Durability> = run
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Write(op) if matches!(op.rec.state, State::Committed { .. }) => {
                    Some(op.durability)
                }
                _ => None,
            })
            .collect();
        assert_eq!(committed, vec![want], "{class}");
    }
}

/// The `remember` of the call's return: whether the result is kept for
/// replays without a read.
fn remembered(run: &Run) -> bool {
    match run.actions.last() {
        Some(Action::Return { remember, .. }) => *remember,
        other => panic!("no return: {other:?}"),
    }
}

#[test]
fn a_result_an_operator_gave_is_not_kept_for_replays_without_a_read() {
    for (via, keep) in [
        (Via::Call, true),
        (Via::Verify, true),
        (Via::Operator, false),
    ] {
        let rec = left(
            Class::Journal,
            State::Committed {
                result: Blob(vec![9]),
                via,
            },
            1,
            false,
        );
        let run = drive(
            &policy(Class::Journal, 3, true),
            Some((rec, None)),
            vec![],
            vec![],
        );
        assert_eq!(run.outcome, Outcome::Value(ValueFrom::Record), "{via:?}");
        assert_eq!(remembered(&run), keep, "{via:?}");
    }
    // A fresh call's own result is kept.
    let run = drive(&policy(Class::Provider, 3, false), None, vec![ok()], vec![]);
    assert!(remembered(&run));
}

#[test]
fn approval_wait_zero_answers_at_once_without_waiting() {
    let run = drive_with(
        &policy(Class::Provider, 3, false),
        None,
        vec![],
        vec![],
        gated(),
    );
    assert_eq!(run.outcome, Outcome::AwaitingApproval);
    assert!(
        !run.actions
            .iter()
            .any(|a| matches!(a, Action::AwaitChange { .. })),
        "{:#?}",
        run.actions
    );
}

/// A journal tool's INTENT left by a dead process, `ago` ms before the
/// call found it; the tool's timeout is 5 s and its first backoff 100 ms.
fn settling(ago: u64) -> Run {
    let mut p = policy(Class::Journal, 3, true);
    p.timeout = Some(Duration::from_secs(5));
    let mut rec = left(Class::Journal, State::Intent, 1, true);
    rec.updated_ms = NOW - ago;
    drive(
        &p,
        Some((rec, dead())),
        vec![],
        vec![Answer::Landed(Stored::Bytes(Blob(vec![4])))],
    )
}

fn settling_waits(run: &Run) -> Vec<u64> {
    run.actions
        .iter()
        .filter_map(|a| match a {
            Action::Emit(idem_journal::audit::EventKind::Settling { wait_ms }) => Some(*wait_ms),
            _ => None,
        })
        .collect()
}

#[test]
fn verify_of_a_dead_attempt_waits_out_what_is_left_of_its_timeout_and_backoff() {
    // Ready 5.1 s after it was last written: 900 ms ago leaves 4 200 ms.
    let run = settling(900);
    assert_eq!(settling_waits(&run), vec![4_200]);
    assert_eq!(run.verifies(), 1);
    // Exactly ready: no wait.
    let run = settling(5_100);
    assert_eq!(settling_waits(&run), Vec::<u64>::new());
    assert_eq!(run.verifies(), 1);
}

#[test]
fn only_the_first_attempt_announces_the_operation_and_dates_its_budget() {
    let p = policy(Class::Provider, 3, false);
    let run = drive(&p, None, vec![failed(Failure::not_sent()), ok()], vec![]);
    assert_eq!(run.attempts(), vec![(1, 0), (2, 0)]);
    let intents: Vec<(u32, bool, u64)> = run
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Write(op) if op.rec.state == State::Intent => Some((
                op.rec.attempts,
                op.events
                    .iter()
                    .any(|e| matches!(e, idem_journal::audit::EventKind::Intent { .. })),
                op.rec.first_attempt_ms,
            )),
            _ => None,
        })
        .collect();
    assert_eq!(intents.len(), 2, "{intents:?}");
    assert_eq!((intents[0].0, intents[0].1), (1, true));
    assert_eq!((intents[1].0, intents[1].1), (2, false));
    assert_eq!(intents[0].2, NOW, "dated by the first attempt");
    assert_eq!(intents[1].2, NOW, "and not moved by the second");
}

#[test]
fn a_refusal_after_an_attempt_in_doubt_asks_verify_for_journal_and_escalates_otherwise() {
    let attempts = || vec![failed(Failure::ambiguous()), failed(Failure::Semantic)];
    let journal = drive(
        &policy(Class::Journal, 3, true),
        None,
        attempts(),
        vec![Answer::NotLanded],
    );
    assert_eq!(journal.verifies(), 1, "{:?}", journal.outcome);
    let provider = drive(&policy(Class::Provider, 3, false), None, attempts(), vec![]);
    assert_eq!(provider.verifies(), 0);
    // Escalated as a refusal in doubt, with no verdict asked of a verify
    // the class does not have.
    assert!(
        matches!(&provider.outcome, Outcome::Escalated { reason }
            if reason.contains("nothing can tell whether that one did")),
        "{:?}",
        provider.outcome
    );
    assert!(!provider.actions.iter().any(|a| matches!(
        a,
        Action::Emit(idem_journal::audit::EventKind::Verified { .. })
    )));
}

/// The key's first send as the next INTENT writes it.
fn first_sent(run: &Run) -> Option<u64> {
    run.actions.iter().find_map(|a| match a {
        Action::Write(op) if op.rec.state == State::Intent => Some(op.rec.key_first_sent_ms),
        _ => None,
    })?
}

#[test]
fn a_fresh_budget_keeps_the_keys_first_send_and_a_new_generation_starts_it_again() {
    let p = policy(Class::Provider, 3, false);
    let mut spent = left(
        Class::Provider,
        State::Failed {
            error: "down".into(),
        },
        3,
        false,
    );
    spent.key_first_sent_ms = Some(NOW - 5_000);
    let run = drive(&p, Some((spent, None)), vec![ok()], vec![]);
    assert_eq!(run.generation, 0);
    assert_eq!(first_sent(&run), Some(NOW - 5_000), "same key: same window");
    let mut refused = left(
        Class::Provider,
        State::Rejected {
            error: "declined".into(),
        },
        1,
        false,
    );
    refused.key_first_sent_ms = Some(NOW - 5_000);
    let run = drive(&p, Some((refused, None)), vec![ok()], vec![]);
    assert_eq!(run.generation, 1);
    assert_eq!(first_sent(&run), Some(NOW), "a new key: a new window");
}

#[test]
fn drift_of_arguments_the_record_does_not_hold_is_replayed_when_nothing_is_listed() {
    // The record holds no arguments (too large to keep): every field may
    // have changed. Without `on_drift(reject = ..)` that is still a
    // replay.
    let mut rec = left(
        Class::Provider,
        State::Committed {
            result: Blob(vec![9]),
            via: Via::Call,
        },
        1,
        false,
    );
    rec.args = String::new();
    let faults = Faults {
        fingerprint: Some([8; 32]),
        // Nor does the call hold them: nothing tells which field changed.
        args: Some(""),
        ..Faults::default()
    };
    let run = drive_with(
        &policy(Class::Provider, 3, false),
        Some((rec, None)),
        vec![],
        vec![],
        faults,
    );
    assert_eq!(run.outcome, Outcome::Value(ValueFrom::Record));
    assert!(run.actions.iter().any(|a| matches!(
        a,
        Action::Emit(idem_journal::audit::EventKind::ArgsDrift {
            policy: OnDrift::Replay
        })
    )));
}

/// The claim operation of every write of a run, in order.
fn claims(run: &Run) -> Vec<ClaimOp> {
    run.actions
        .iter()
        .filter_map(|a| match a {
            Action::Write(op) => Some(op.claim),
            _ => None,
        })
        .collect()
}

#[test]
fn a_drive_takes_the_claim_once_keeps_it_while_it_retries_and_releases_it_at_the_end() {
    let run = drive(
        &policy(Class::Provider, 3, false),
        None,
        vec![failed(Failure::not_sent()), ok()],
        vec![],
    );
    assert_eq!(
        claims(&run),
        vec![
            ClaimOp::Take,    // INTENT 1
            ClaimOp::Keep,    // waiting to retry
            ClaimOp::Keep,    // INTENT 2
            ClaimOp::Release, // committed
        ]
    );
}

#[test]
fn a_runtime_that_claims_first_writes_before_it_reads() {
    let run = drive_with(
        &policy(Class::Provider, 3, false),
        None,
        vec![ok()],
        vec![],
        Faults {
            claim_first: true,
            ..Faults::default()
        },
    );
    assert!(
        !run.actions.iter().any(|a| matches!(a, Action::Read)),
        "{:#?}",
        run.actions
    );
    assert_eq!(run.outcome, Outcome::Value(ValueFrom::Attempt));
}

#[test]
fn a_recovered_intent_counts_as_maybe_landed_so_a_refusal_after_it_escalates() {
    // The process died between its INTENT and the attempt's answer: the
    // record does not say the attempt may have landed, the INTENT does.
    let rec = left(Class::Provider, State::Intent, 1, false);
    let run = drive(
        &policy(Class::Provider, 3, false),
        Some((rec, dead())),
        vec![failed(Failure::Semantic)],
        vec![],
    );
    assert!(
        matches!(run.outcome, Outcome::Escalated { .. }),
        "{:?}",
        run.outcome
    );
    assert_eq!(run.state(), "escalated");
}

#[test]
fn spent_attempts_that_timed_out_return_timed_out_and_an_earlier_processs_return_its_error() {
    // This call's only attempt timed out (no error value), and verify
    // said it did not land.
    let timed_out = Attempted::Failed {
        failure: Failure::ambiguous(),
        text: "timed out after 1s".into(),
        typed: false,
    };
    let run = drive(
        &policy(Class::Journal, 1, true),
        None,
        vec![timed_out],
        vec![Answer::NotLanded],
    );
    assert_eq!(run.outcome, Outcome::TimedOut { attempts: 1 });
    // The attempts were all made before this call, by a process that
    // recorded the last error as text.
    let mut rec = left(Class::Provider, State::Waiting, 3, false);
    rec.last_error = Some("provider down".into());
    let run = drive(
        &policy(Class::Provider, 3, false),
        Some((rec, dead())),
        vec![],
        vec![],
    );
    assert!(
        matches!(&run.outcome, Outcome::Journal(super::call::Fault::Failed { attempts: 3, error })
            if error == "provider down"),
        "{:?}",
        run.outcome
    );
}

#[test]
fn an_intent_reported_failed_that_landed_all_the_same_is_taken_back() {
    let run = drive_with(
        &policy(Class::Provider, 3, false),
        None,
        vec![],
        vec![],
        Faults {
            write: Some((0, Input::WriteFailed)),
            write_lands: true,
            ..Faults::default()
        },
    );
    assert!(
        run.actions
            .iter()
            .any(|a| matches!(a, Action::Revert(Revert::Remove { .. }))),
        "{:#?}",
        run.actions
    );
    assert_eq!(run.state(), "none", "the INTENT nobody acted on is gone");
    assert!(run.attempts().is_empty());
}

#[test]
fn a_result_is_stored_only_while_it_and_the_arguments_fit_the_largest_record() {
    use super::call::storable;
    use super::policy::MAX_RECORD_PAYLOAD;
    assert!(storable(MAX_RECORD_PAYLOAD - 11, 10));
    assert!(!storable(MAX_RECORD_PAYLOAD - 10, 10), "at the bound");
    assert!(
        storable(MAX_RECORD_PAYLOAD / 2, 3),
        "the sum counts, not more"
    );
    assert!(!storable(MAX_RECORD_PAYLOAD, 0));
}

#[test]
fn an_approval_is_decided_once_and_only_while_it_is_awaited() {
    use crate::machine::resolve::decide;
    let pending = asked(Class::Provider, State::AwaitingApproval, None);
    let (rec, events) = decide(pending, false, "too much", "cli", NOW).expect("awaited");
    assert_eq!(
        rec.state,
        State::NotApproved {
            note: "too much".into()
        }
    );
    assert_eq!(events.len(), 1, "{events:?}");
    // A decision is final: the approved record (its decision made) and
    // the rejected one refuse a second answer, whatever it says.
    let approved = asked(Class::Provider, State::Approved, Some(true));
    assert_eq!(
        decide(approved, false, "changed my mind", "api", NOW).map(|_| ()),
        Err("approved")
    );
    assert_eq!(
        decide(rec, true, "sure", "api", NOW).map(|_| ()),
        Err("not_approved")
    );
}

#[test]
// Checked when the test runs, not when it builds: a changed bound fails
// this test, named, instead of the build.
#[allow(clippy::assertions_on_constants)]
fn the_largest_stored_payload_leaves_the_record_room_and_is_most_of_it() {
    use super::policy::MAX_RECORD_PAYLOAD;
    use idem_journal::record::LARGE_LIMIT;
    // The rest of a record (key, tool, run, scope, events' text) fits in
    // what is left; the margin is not most of the record either.
    let margin = LARGE_LIMIT.checked_sub(MAX_RECORD_PAYLOAD);
    assert!(margin.is_some_and(|m| m >= 64 << 10), "{margin:?}");
    assert!(MAX_RECORD_PAYLOAD >= LARGE_LIMIT / 2);
}
