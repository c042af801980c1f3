//! The machine of a read-only call: no journal record, no key; a retry
//! duplicates nothing, so every failure but a semantic refusal is retried
//! while the budget allows, each retry recorded as an audit event first.
//! Times are ms since the call began (the driver's clock), so the budget's
//! `max_elapsed` counts from the first attempt.

use std::time::Duration;

use idem_journal::audit::EventKind;

use super::call::Env;
use crate::failure::Failure;
use crate::retry::RetryPolicy;

/// What the last action brought back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// The call begins.
    Start,
    /// [`Action::Attempt`] returned the tool's value.
    Succeeded,
    /// [`Action::Attempt`] failed: how it classifies, its text, and
    /// whether there is a typed error to return (false: it timed out).
    Failed {
        /// See above.
        failure: Failure,
        /// See above.
        text: String,
        /// See above.
        typed: bool,
    },
    /// [`Action::Emit`] was appended.
    Appended,
    /// [`Action::Emit`] failed (the driver holds the journal's error).
    AppendFailed,
    /// [`Action::Sleep`] is over.
    Slept,
}

/// What the call returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The last attempt's value.
    Value,
    /// The last attempt's error.
    Tool,
    /// Every attempt timed out: there is no error value.
    TimedOut {
        /// Attempts made.
        attempts: u32,
    },
    /// The retry's audit event could not be written.
    Journal,
}

/// What the driver is to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "an action is the machine's decision: execute it and feed back its input"]
pub enum Action {
    /// Run attempt `attempt` (1-based).
    Attempt {
        /// See above.
        attempt: u32,
    },
    /// Append this event (eventually durable).
    Emit(EventKind),
    /// Wait until `until` (ms since the call began).
    Sleep {
        /// See above.
        until: u64,
    },
    /// Return.
    Return(Outcome),
}

/// One read-only call.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReadOnly {
    attempts: u32,
    /// When the pending sleep ends.
    until: u64,
}

impl ReadOnly {
    /// A call; feed it [`Input::Start`] first.
    pub fn new() -> ReadOnly {
        ReadOnly::default()
    }

    /// The next action, given what the last one brought back.
    pub fn step(&mut self, retry: &RetryPolicy, env: Env, input: Input) -> Action {
        match input {
            Input::Start | Input::Slept => {
                self.attempts += 1;
                Action::Attempt {
                    attempt: self.attempts,
                }
            }
            Input::Succeeded => Action::Return(Outcome::Value),
            Input::Failed {
                failure,
                text,
                typed,
            } => {
                let give_up = if typed {
                    Outcome::Tool
                } else {
                    Outcome::TimedOut {
                        attempts: self.attempts,
                    }
                };
                if failure == Failure::Semantic {
                    return Action::Return(give_up);
                }
                let delay = retry.delay(self.attempts, env.jitter, failure.retry_after());
                let elapsed = Duration::from_millis(env.now).saturating_add(delay);
                if !retry.allows(self.attempts, elapsed) {
                    return Action::Return(give_up);
                }
                // Rounded up: the wait is never shorter than the delay (a
                // provider's Retry-After is a floor).
                self.until = env.now.saturating_add(ceil_ms(delay));
                Action::Emit(EventKind::Retry {
                    attempt: self.attempts,
                    delay_ms: delay.as_millis() as u64,
                    failure: failure.label().into(),
                    error: text,
                })
            }
            Input::Appended => Action::Sleep { until: self.until },
            Input::AppendFailed => Action::Return(Outcome::Journal),
        }
    }
}

/// `d` in whole ms, rounded up.
pub fn ceil_ms(d: Duration) -> u64 {
    d.as_millis() as u64 + u64::from(!d.subsec_nanos().is_multiple_of(1_000_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(max_attempts: u32) -> RetryPolicy {
        RetryPolicy {
            max_attempts,
            initial: Duration::from_millis(100),
            backoff: 2.0,
            max_interval: Duration::from_secs(10),
            max_elapsed: Some(Duration::from_millis(1_000)),
            jitter: false,
        }
    }

    fn env(now: u64) -> Env {
        Env { now, jitter: 0.5 }
    }

    fn failed(failure: Failure) -> Input {
        Input::Failed {
            failure,
            text: "boom".into(),
            typed: true,
        }
    }

    /// Drives a call whose attempts fail with `failures` in turn and then
    /// succeed; returns the attempts made and how it ended.
    fn drive(retry: &RetryPolicy, failures: &[Failure]) -> (u32, Outcome) {
        let mut m = ReadOnly::new();
        let mut now = 0;
        let mut next = failures.iter();
        let mut input = Input::Start;
        let mut attempts = 0;
        for _ in 0..100 {
            match m.step(retry, env(now), input) {
                Action::Attempt { attempt } => {
                    attempts = attempt;
                    input = next.next().map_or(Input::Succeeded, |f| failed(*f));
                }
                Action::Emit(EventKind::Retry { attempt, .. }) => {
                    assert_eq!(attempt, attempts);
                    input = Input::Appended;
                }
                Action::Emit(other) => panic!("{other:?}"),
                Action::Sleep { until } => {
                    assert!(until > now, "a retry without a backoff");
                    now = until;
                    input = Input::Slept;
                }
                Action::Return(outcome) => return (attempts, outcome),
            }
        }
        panic!("no return");
    }

    #[test]
    fn not_sent_and_ambiguous_are_retried_after_a_backoff() {
        let (n, out) = drive(&policy(5), &[Failure::not_sent(), Failure::ambiguous()]);
        assert_eq!((n, out), (3, Outcome::Value));
    }

    #[test]
    fn waits_round_up_to_whole_ms_so_retry_after_stays_a_floor() {
        assert_eq!(ceil_ms(Duration::ZERO), 0);
        assert_eq!(ceil_ms(Duration::from_millis(2)), 2);
        assert_eq!(ceil_ms(Duration::from_micros(1_500)), 2);
        assert_eq!(ceil_ms(Duration::from_nanos(1)), 1);
        // A delay with a fraction of a ms (jitter) sleeps past its end.
        let mut m = ReadOnly::new();
        let mut r = policy(3);
        r.initial = Duration::from_micros(100_400);
        let _ = m.step(&r, env(7), Input::Start);
        let _ = m.step(&r, env(7), failed(Failure::not_sent()));
        assert_eq!(
            m.step(&r, env(7), Input::Appended),
            Action::Sleep { until: 7 + 101 }
        );
    }

    #[test]
    fn a_semantic_refusal_is_returned_at_once() {
        let (n, out) = drive(&policy(5), &[Failure::Semantic]);
        assert_eq!((n, out), (1, Outcome::Tool));
    }

    #[test]
    fn the_budget_bounds_attempts_and_elapsed_time() {
        let (n, out) = drive(&policy(2), &[Failure::ambiguous(); 5]);
        assert_eq!((n, out), (2, Outcome::Tool));
        // 100 + 200 + 400 ms of backoff fit in 1 s; the next 800 do not.
        let (n, out) = drive(&policy(50), &[Failure::not_sent(); 10]);
        assert_eq!((n, out), (4, Outcome::Tool));
    }

    #[test]
    fn a_timed_out_last_attempt_has_no_error_value() {
        let mut m = ReadOnly::new();
        let r = policy(1);
        assert_eq!(
            m.step(&r, env(0), Input::Start),
            Action::Attempt { attempt: 1 }
        );
        let a = m.step(
            &r,
            env(0),
            Input::Failed {
                failure: Failure::ambiguous(),
                text: "timed out".into(),
                typed: false,
            },
        );
        assert_eq!(a, Action::Return(Outcome::TimedOut { attempts: 1 }));
    }

    #[test]
    fn a_retry_event_that_cannot_be_written_fails_the_call() {
        let mut m = ReadOnly::new();
        let r = policy(3);
        let _ = m.step(&r, env(0), Input::Start);
        assert!(matches!(
            m.step(&r, env(0), failed(Failure::not_sent())),
            Action::Emit(_)
        ));
        assert_eq!(
            m.step(&r, env(0), Input::AppendFailed),
            Action::Return(Outcome::Journal)
        );
    }
}
