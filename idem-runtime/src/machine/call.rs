//! The machine of one journaled call: every decision of the engine's
//! tables, as a pure function of the machine's state, the tool's
//! [`Policy`], the runtime's [`Setup`], the time and a jitter draw
//! ([`Env`]) and what the last action brought back ([`Input`]); the answer
//! is the next [`Action`].
//!
//! | record found | provider | journal | at_most_once |
//! |---|---|---|---|
//! | none | INTENT (claimed), run | same | same |
//! | `Committed` | replay | replay | replay |
//! | `Intent`/`Waiting`, claimed by a live driver elsewhere | wait for it | same | same |
//! | `Intent`, its driver dead (crash, dropped call, expired lease) | take over; re-run, same key, inside window and budget; else escalate | take over; `verify` first | take over; escalate |
//! | `Waiting` (between retries), driver dead | take over, resume; if an earlier attempt may have landed, as `Intent` | same | same |
//! | `Rejected` | found first: run under the next generation; found after waiting for a concurrent call: that call's refusal | same | same |
//! | `Failed` | found first: run with a fresh budget; after waiting: that call's failure | same | same |
//! | `Reissue` | run with a fresh budget, same key | same | same |
//! | `Escalated` | `Escalated`, no call | same | same |
//! | `Abandoned` | `Abandoned`, no call | same | same |
//! | `AwaitingApproval` | wait up to `approval_wait`, then `AwaitingApproval`; other arguments: `on_drift` | same | same |
//! | `Approved` | run it, once; other arguments than approved: `ArgsMismatch` | same | same |
//! | `NotApproved` | `NotApproved` with the operator's note, no call | same | same |
//!
//! A tool with an approval policy asks for approval where a new decision
//! starts (no record, a new generation after a refusal, a fresh budget
//! after a failure or a reissue) unless the record holds an approval of
//! this generation and these arguments: the request (`AwaitingApproval`,
//! with the reason) is durable before the caller hears of it, and no
//! INTENT is written until an operator approved it.
//!
//! and inside a run, after each failed attempt:
//!
//! | failure | provider | journal | at_most_once |
//! |---|---|---|---|
//! | NotSent | back off, retry | back off, retry | back off, retry |
//! | Ambiguous | back off, retry, same key | back off, `verify`, then retry only if not landed | escalate |
//! | Semantic | REJECTED, return it; but if an earlier attempt may have landed, escalate | same, but `verify` first | same as provider |
//! | budget spent | an unresolved ambiguity escalates; else FAILED, return it | same | — |
//!
//! The driver (`engine.rs`) executes each action and feeds its result
//! back; it holds what the machine cannot (the tool's typed values and
//! errors, the journal's errors) and decides nothing.
//!
//! Durability: the INTENT of every attempt (with its attempt count) is
//! written [`Durability::Immediate`] before [`Action::Attempt`], and every
//! terminal state before [`Action::Return`]. Writes that decide nothing a
//! crash could contradict are [`Durability::Eventual`]: moving to
//! `Waiting` after a failure (if it is lost, the durable `Intent` is the
//! more cautious truth), taking over a dead claim (the next INTENT is
//! immediate), the COMMITTED record of a tool with `commit = "eventual"`
//! (a lost one is recovered as a crash after the call: the provider
//! deduplicates the key, `verify` finds the effect), and audit events that
//! record no decision.

use std::sync::Arc;
use std::time::Duration;

use idem_journal::audit::EventKind;
use idem_journal::class::{Class, OnDrift};
use idem_journal::journal::{Claim, Durability};
use idem_journal::key::hex;
use idem_journal::record::{ApprovalInfo, Blob, EscalationInfo, OpRecord, State, Via};

use super::policy::{Policy, Setup, MAX_ARGS_BYTES, MAX_RECORD_PAYLOAD};
use crate::failure::Failure;

/// The time and a jitter draw, given with every input: the machine reads
/// no clock and draws no random number of its own.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Env {
    /// Now, in ms since the epoch, on the runtime's clock.
    pub now: u64,
    /// A uniform draw in [0, 1), used only when a retry delay is computed.
    pub jitter: f64,
}

/// What the call is: fixed when it starts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Called {
    /// The tool's name.
    pub tool: String,
    /// The tool's class.
    pub class: Class,
    /// The root run.
    pub root_run: String,
    /// The scope path.
    pub scope: Vec<String>,
    /// SHA-256 of the non-redacted arguments.
    pub fingerprint: [u8; 32],
    /// The non-redacted arguments as canonical JSON.
    pub args: String,
    /// Why this call needs a person's approval before it runs (the tool's
    /// approval policy answered so); `None`: it needs none.
    pub approval: Option<String>,
}

/// An operation record as the journal returned it, decoded.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Found {
    /// The record.
    pub rec: OpRecord,
    /// Its version.
    pub version: u64,
    /// Its claim, if claimed.
    pub claim: Option<Claim>,
}

/// A result as the journal would store it, or why it cannot be.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Stored {
    /// The encoded result.
    Bytes(Blob),
    /// It could not be encoded: why.
    Unstorable(String),
}

/// What an attempt came back with.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Attempted {
    /// The tool returned a value.
    Ok {
        /// The value, encoded.
        stored: Stored,
        /// The provider said it replayed an earlier response for the key.
        provider_replay: bool,
    },
    /// It failed.
    Failed {
        /// How the failure classifies (a timed-out attempt is ambiguous).
        failure: Failure,
        /// The failure as text.
        text: String,
        /// Whether there is a typed error to return (false: it timed out).
        typed: bool,
    },
}

/// What `verify` answered.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Answer {
    /// It landed, with this result.
    Landed(Stored),
    /// It did not land.
    NotLanded,
    /// It cannot tell.
    Unknown,
    /// `verify` itself failed (its error as text).
    Failed(String),
    /// `verify` timed out (the timeout as text).
    TimedOut(String),
}

/// What the last action brought back.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Input {
    /// The call begins. `cached`: a result this runtime saw committed for
    /// the key (under this generation), with the same arguments, is in
    /// memory and decodes.
    Start {
        /// See above.
        cached: Option<u32>,
        /// The length of the arguments' canonical JSON.
        args_len: usize,
    },
    /// [`Action::Lead`]: this call leads its key in this process.
    Led,
    /// [`Action::Lead`]: another call of this process leads it.
    Busy,
    /// [`Action::AwaitLeader`]: the leader went; `shared_error`: it left its
    /// error for this call, which returns it.
    LeaderLeft {
        /// See above.
        shared_error: bool,
    },
    /// [`Action::AwaitChange`]: the record may have changed.
    Changed,
    /// A wait ran out.
    TimedOut,
    /// [`Action::Read`] (or a revert's read): the record, if any. Boxed:
    /// every input is moved several times on its way into the machine,
    /// and a record would make each of them half a kilobyte.
    Found(Option<Box<Found>>),
    /// A read failed, or found bytes that do not decode.
    ReadFailed,
    /// A write happened.
    Written {
        /// The record's new version.
        version: u64,
        /// Its epoch.
        epoch: u64,
        /// How long the write took (ms), for the lease check.
        took_ms: u64,
    },
    /// A write's condition failed; nothing was written. For a claim of an
    /// unread key: the record it found (`None`: gone again).
    Conflict(Option<Box<Found>>),
    /// A write failed (it may have happened all the same).
    WriteFailed,
    /// [`Action::Revert`] removal: whether it removed the record.
    Removed(bool),
    /// An [`Action::Emit`] was appended.
    Appended,
    /// An [`Action::Emit`] failed.
    AppendFailed,
    /// [`Action::Attempt`] came back.
    Attempted(Attempted),
    /// [`Action::Verify`] came back.
    Verified(Answer),
    /// [`Action::Decode`]: the committed result decodes (false: it does
    /// not fit the tool's type).
    Decoded(bool),
    /// [`Action::Sleep`] is over.
    Slept,
}

/// A write the machine asks for: the record, the events that record its
/// change, at a durability.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WriteOp {
    /// The new record. Shared: the machine keeps the same record as what
    /// it tried to write (see `Op::tried`) without a second copy.
    pub rec: Arc<OpRecord>,
    /// Its audit events.
    pub events: Vec<EventKind>,
    /// How durable it must be when the write returns.
    pub durability: Durability,
    /// The version it expects (`None`: absent).
    pub expect: Option<u64>,
    /// What happens to the claim.
    pub claim: ClaimOp,
    /// Whether the record is in the escalation index afterwards.
    pub escalated: bool,
    /// Written as a claim of a key never read (`Journal::claim`).
    pub unread: bool,
}

/// What a write does to the claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClaimOp {
    /// Leave it.
    Keep,
    /// Take it for this runtime's owner, under a new epoch.
    Take,
    /// Release it.
    Release,
}

/// A best-effort step of undoing an INTENT that could not be made durable.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Revert {
    /// Read the record.
    Read,
    /// Remove it, if it is still at `version`.
    Remove {
        /// See above.
        version: u64,
    },
    /// Put `rec` back.
    Write(Box<WriteOp>),
}

/// Where a value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueFrom {
    /// The attempt that just returned it.
    Attempt,
    /// The `verify` that just found it.
    Verify,
    /// The committed record (decoded by [`Action::Decode`]).
    Record,
    /// The runtime's cache of committed results.
    Cache,
}

/// Why a call fails with `ToolError::Journal`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Fault {
    /// The journal's own error, which the driver holds.
    Journal,
    /// The record belongs to another tool or class.
    ToolMismatch {
        /// The stored tool.
        stored_tool: String,
        /// The stored class.
        stored_class: Class,
    },
    /// The concurrent call this one waited for was refused.
    Rejected {
        /// Its refusal.
        error: String,
    },
    /// The concurrent call this one waited for (or an earlier process)
    /// failed.
    Failed {
        /// Attempts made.
        attempts: u32,
        /// The last error.
        error: String,
    },
    /// The arguments are larger than the journal records.
    TooLarge {
        /// Their size.
        size: u64,
    },
    /// The committed result does not decode into the tool's type.
    Undecodable,
}

/// What the call returns.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// A value.
    Value(ValueFrom),
    /// The tool's error from the last attempt.
    Tool,
    /// Every attempt of this call timed out: no error value exists.
    TimedOut {
        /// Attempts made.
        attempts: u32,
    },
    /// Parked for a human.
    Escalated {
        /// Why.
        reason: String,
    },
    /// Another call of the key is still being driven.
    InFlight,
    /// Other arguments under `on_drift = "reject"`.
    ArgsMismatch,
    /// An operator abandoned it.
    Abandoned,
    /// It awaits a person's approval; nothing ran.
    AwaitingApproval,
    /// A person refused it.
    NotApproved {
        /// The operator's note.
        note: String,
    },
    /// A journal error.
    Journal(Fault),
}

/// What the driver is to do next.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[must_use = "an action is the machine's decision: execute it and feed back its input"]
pub enum Action {
    /// Leave any lead this call holds, then lead the key in this process
    /// or learn who does.
    Lead,
    /// Wait for this process's leader of the key to go, until `until`.
    AwaitLeader {
        /// The deadline (ms).
        until: u64,
    },
    /// Leave the lead, and wait for the record to move past `version`
    /// (written by another process), until `until`.
    AwaitChange {
        /// The version seen.
        version: u64,
        /// The deadline (ms).
        until: u64,
    },
    /// Read the record.
    Read,
    /// Write the record.
    Write(Box<WriteOp>),
    /// Best effort: undo a failed INTENT (its failures are not the call's).
    Revert(Revert),
    /// Append an audit event that records no decision, eventually durable.
    Emit(EventKind),
    /// Best effort: append an audit event whose failure changes nothing.
    EmitBestEffort(EventKind),
    /// Run attempt `attempt` of generation `generation` (its timeout counts
    /// from the start of the INTENT write that preceded it).
    Attempt {
        /// 1-based.
        attempt: u32,
        /// The key generation.
        generation: u32,
    },
    /// Ask `verify` (the context's attempt is `attempt`).
    Verify {
        /// See above.
        attempt: u32,
        /// The key generation.
        generation: u32,
    },
    /// Decode the committed result for the caller.
    Decode(Blob),
    /// Wait until `until` (ms).
    Sleep {
        /// See above.
        until: u64,
    },
    /// Return. `remember`: keep the committed result for replays without a
    /// read; `share`: leave the returned error for this process's waiters.
    Return {
        /// What to return.
        outcome: Outcome,
        /// See above.
        remember: bool,
        /// See above.
        share: bool,
    },
}

impl Action {
    fn ret(outcome: Outcome) -> Action {
        Action::Return {
            outcome,
            remember: false,
            share: false,
        }
    }
}

/// The operation as this pass knows it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Op {
    rec: OpRecord,
    /// The version the journal holds (`None`: no record yet).
    version: Option<u64>,
    claim: Option<Claim>,
    /// The epoch of the claim this pass holds.
    held: Option<u64>,
    /// When the record was last written before this pass found it.
    found_ms: u64,
    /// The record before the last write, and the last write (the very
    /// record the write carried).
    previous: Option<Arc<OpRecord>>,
    tried: Option<Arc<OpRecord>>,
    /// The next write is a claim of a key never read.
    unread: bool,
    /// What that claim found.
    claim_found: Option<Box<Found>>,
}

/// The last failure of a run.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
struct Last {
    /// The driver holds a typed error for it.
    typed: bool,
    text: String,
}

/// What follows a write.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum AfterWrite {
    /// A dead claim was taken over: recover (`maybe`) or run.
    Recovered { maybe: bool },
    /// The INTENT of attempt `n` (`before`: what to put back if it fails).
    Intent {
        n: u32,
        before_held: Option<u64>,
        before: Option<Arc<OpRecord>>,
    },
    /// Waiting after failed attempt `n`.
    Waiting {
        n: u32,
        delay_ms: u64,
        spent: Option<String>,
        verifying: bool,
    },
    /// `verify` said not landed after an ambiguous attempt.
    NotLanded { spent: Option<String> },
    /// Rejected: return the refusal.
    Rejected,
    /// Failed: return the last failure.
    Failed { text: String },
    /// Escalated: return it.
    Escalated { reason: String },
    /// The request for approval is durable.
    ApprovalRequested,
    /// Committed: return the value.
    Committed {
        from: ValueFrom,
        attempt: u32,
        via: Via,
    },
}

/// What follows an emitted event.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum AfterEmit {
    /// A cached replay.
    Cached,
    /// Refused while in flight elsewhere.
    InFlight,
    /// The drift event; then the record's row, or the refusal, as the
    /// policy applied says.
    Drift(Drifted, OnDrift),
    /// A replay of the committed record.
    Recorded { remember: bool },
    /// Refused: escalated, abandoned, or the shared outcome of a waited-for
    /// call.
    Refused(Outcome),
    /// Settling before `verify`: sleep until `until`.
    Settling { until: u64 },
    /// `verify`'s verdict recorded; act on it.
    Verdict { checked: Checked, why: Why },
}

/// Which row a replayed drift was found in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Drifted {
    Committed,
    Unfinished,
    /// Awaiting approval: wait for it like a call with the recorded
    /// arguments.
    Pending,
}

/// What `verify` was asked for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Why {
    /// A dead driver's attempt.
    Recover,
    /// After ambiguous attempt `n`.
    Ambiguous { n: u32, spent: Option<String> },
    /// A semantic refusal of attempt `n` after an earlier attempt that may
    /// have landed.
    Doubt { n: u32, text: String, typed: bool },
}

/// `verify`'s answer, reduced.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Checked {
    Landed(Stored),
    NotLanded,
    Undecided(String),
}

/// What follows a sleep.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum AfterSleep {
    /// The backoff after attempt `n`.
    Backoff {
        n: u32,
        spent: Option<String>,
        verifying: bool,
    },
    /// Settled: ask `verify` about a dead driver's attempt.
    Settled,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Phase {
    Start,
    Leading,
    AwaitingLeader,
    AwaitingChange,
    /// Waiting for an operator's decision on the approval.
    AwaitingApproval,
    Reading,
    Writing {
        then: AfterWrite,
        release: bool,
    },
    Reverting,
    Emitting(AfterEmit),
    Fencing,
    Attempting {
        n: u32,
    },
    Verifying(Why),
    Decoding {
        remember: bool,
    },
    Sleeping(AfterSleep),
    Returned,
}

/// One journaled call.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Call {
    called: Called,
    phase: Phase,
    /// This call waited for a concurrent one (locally or elsewhere): a
    /// refusal or failure it finds is that call's, shared, not a reason
    /// for a new decision.
    waited: bool,
    /// The next pass may claim the key without reading it.
    claim_first: bool,
    /// This pass claims without reading.
    pass_unread: bool,
    /// A record an unread claim found, for the next pass.
    found: Option<Box<Found>>,
    /// When waiting for another call of the key gives up (ms).
    deadline: u64,
    /// When this call stops waiting for an approval (ms), once it waits.
    approval_until: Option<u64>,
    op: Op,
    last: Last,
}

impl Call {
    /// A call of `called`; feed it [`Input::Start`] first.
    pub fn new(called: Called) -> Call {
        let op = Op::unstarted(&called);
        Call {
            called,
            phase: Phase::Start,
            waited: false,
            claim_first: false,
            pass_unread: false,
            found: None,
            deadline: 0,
            approval_until: None,
            op,
            last: Last::default(),
        }
    }

    /// The key generation the call is at (for the key the driver shows).
    pub fn generation(&self) -> u32 {
        self.op.rec.generation
    }

    /// The record as last written or read (for the committed result to
    /// remember).
    pub fn record(&self) -> &OpRecord {
        &self.op.rec
    }

    /// The arguments of this call that differ from those the operation
    /// was recorded with (see [`drifted_fields`](super::drift::drifted_fields));
    /// empty when the fingerprints agree.
    pub fn drift(&self) -> Vec<String> {
        if self.op.rec.fingerprint == self.called.fingerprint {
            return Vec::new();
        }
        super::drift::drifted_fields(&self.op.rec.args, &self.called.args)
    }

    /// Whether the call has returned.
    pub fn is_done(&self) -> bool {
        self.phase == Phase::Returned
    }

    /// The next action, given what the last one brought back.
    pub fn step(&mut self, policy: &Policy, setup: &Setup, env: Env, input: Input) -> Action {
        let phase = std::mem::replace(&mut self.phase, Phase::Returned);
        let action = self.advance(phase, policy, setup, env, input);
        if let Action::Return { .. } = action {
            self.phase = Phase::Returned;
        }
        action
    }

    fn advance(
        &mut self,
        phase: Phase,
        policy: &Policy,
        setup: &Setup,
        env: Env,
        input: Input,
    ) -> Action {
        match (phase, input) {
            (Phase::Start, Input::Start { cached, args_len }) => {
                if args_len > MAX_ARGS_BYTES {
                    return Action::ret(Outcome::Journal(Fault::TooLarge {
                        size: args_len as u64,
                    }));
                }
                self.deadline = env.now.saturating_add(setup.in_flight_wait_ms);
                self.claim_first = setup.claim_first;
                if let Some(generation) = cached {
                    self.op.rec.generation = generation;
                    return self.emit(EventKind::DedupeHit, AfterEmit::Cached);
                }
                self.lead()
            }
            (Phase::Leading, Input::Led) => self.pass(policy, setup, env),
            (Phase::Leading, Input::Busy) => {
                // Wakes when the leader's slot goes: it finished, or its
                // future was dropped.
                self.waited = true;
                // What a claim found is older than what that call did.
                self.found = None;
                self.phase = Phase::AwaitingLeader;
                Action::AwaitLeader {
                    until: self.deadline,
                }
            }
            (Phase::AwaitingLeader, Input::LeaderLeft { shared_error }) => {
                if shared_error {
                    return Action::ret(Outcome::Tool);
                }
                self.lead()
            }
            (Phase::AwaitingLeader | Phase::AwaitingChange, Input::TimedOut) => {
                self.refuse_in_flight()
            }
            (Phase::AwaitingChange, Input::Changed) => self.lead(),
            (Phase::AwaitingApproval, Input::Changed) => {
                // The wait for an approval may have outlasted the wait for
                // a concurrent call: a fresh one for what follows.
                self.deadline = env.now.saturating_add(setup.in_flight_wait_ms);
                self.lead()
            }
            (Phase::AwaitingApproval, Input::TimedOut) => Action::ret(Outcome::AwaitingApproval),
            (Phase::Reading, Input::Found(found)) => match found {
                None => self.drive(policy, setup, env),
                Some(found) => match self.take_in(found) {
                    Some(refused) => refused,
                    None => self.drive(policy, setup, env),
                },
            },
            (Phase::Reading, Input::ReadFailed) => Action::ret(Outcome::Journal(Fault::Journal)),
            (
                Phase::Writing { then, release },
                Input::Written {
                    version,
                    epoch,
                    took_ms,
                },
            ) => {
                self.op.version = Some(version);
                self.op.previous = self.op.tried.take();
                self.op.held = (!release).then_some(epoch);
                self.written(then, policy, setup, env, took_ms)
            }
            (Phase::Writing { then, .. }, Input::Conflict(found)) => {
                // Only a claim of an unread key brings a record back.
                self.op.claim_found = found;
                match then {
                    // We were fenced off after the effect landed: say so,
                    // and re-decide from the record the new owner wrote.
                    AfterWrite::Committed { attempt, .. } => {
                        self.phase = Phase::Fencing;
                        Action::EmitBestEffort(EventKind::Fenced {
                            attempt,
                            outcome: "landed".into(),
                        })
                    }
                    _ => self.conflict(),
                }
            }
            (Phase::Writing { then, .. }, Input::WriteFailed) => match then {
                AfterWrite::Intent {
                    before_held,
                    before,
                    ..
                } => self.revert_read(before_held, before),
                _ => Action::ret(Outcome::Journal(Fault::Journal)),
            },
            (Phase::Reverting, input) => self.reverting(input, setup),
            (Phase::Fencing, Input::Appended | Input::AppendFailed) => self.conflict(),
            (Phase::Emitting(then), Input::Appended) => self.emitted(then, policy, setup, env),
            (Phase::Emitting(then), Input::AppendFailed) => match then {
                // A replay of what is durable is answered even when its
                // event cannot be written (a broken journal still serves
                // what it holds); the event records no decision.
                AfterEmit::Cached => Action::ret(Outcome::Value(ValueFrom::Cache)),
                AfterEmit::Recorded { remember } => Action::Return {
                    outcome: Outcome::Value(ValueFrom::Record),
                    remember,
                    share: false,
                },
                _ => Action::ret(Outcome::Journal(Fault::Journal)),
            },
            (Phase::Attempting { n }, Input::Attempted(outcome)) => {
                self.attempted(n, outcome, policy, setup, env)
            }
            (Phase::Verifying(why), Input::Verified(answer)) => self.verified(why, answer),
            (Phase::Decoding { remember }, Input::Decoded(ok)) => {
                if !ok {
                    return Action::ret(Outcome::Journal(Fault::Undecodable));
                }
                self.emit(EventKind::DedupeHit, AfterEmit::Recorded { remember })
            }
            (Phase::Sleeping(then), Input::Slept) => self.slept(then, policy, setup, env),
            (phase, input) => panic!("the call machine got {input:?} in phase {phase:?}"),
        }
    }

    fn lead(&mut self) -> Action {
        self.phase = Phase::Leading;
        Action::Lead
    }

    fn emit(&mut self, event: EventKind, then: AfterEmit) -> Action {
        self.phase = Phase::Emitting(then);
        Action::Emit(event)
    }

    fn refuse_in_flight(&mut self) -> Action {
        self.emit(
            EventKind::Refused {
                reason: "in flight in another call".into(),
            },
            AfterEmit::InFlight,
        )
    }

    /// A new pass, leading the key: the record from a refused claim, a
    /// claim without a read, or a read.
    fn pass(&mut self, policy: &Policy, setup: &Setup, env: Env) -> Action {
        self.pass_unread = std::mem::take(&mut self.claim_first);
        self.op = Op::blank(&self.called, env.now);
        match self.found.take() {
            Some(found) => match self.take_in(found) {
                Some(refused) => refused,
                None => self.drive(policy, setup, env),
            },
            None if self.pass_unread => {
                self.op.unread = true;
                self.drive(policy, setup, env)
            }
            None => {
                self.phase = Phase::Reading;
                Action::Read
            }
        }
    }

    /// Takes in the record; a record of another tool or class is an error,
    /// never a replay.
    fn take_in(&mut self, found: Box<Found>) -> Option<Action> {
        let Found {
            rec,
            version,
            claim,
        } = *found;
        if rec.tool != self.called.tool || rec.class != self.called.class {
            return Some(Action::ret(Outcome::Journal(Fault::ToolMismatch {
                stored_tool: rec.tool,
                stored_class: rec.class,
            })));
        }
        self.op.found_ms = rec.updated_ms;
        self.op.previous = Some(Arc::new(rec.clone()));
        self.op.rec = rec;
        self.op.version = Some(version);
        self.op.claim = claim;
        None
    }

    /// A write was refused because the record changed (another driver took
    /// it), or this drive may have been taken over: re-decide from what
    /// the record is now, as a call that waited would.
    fn conflict(&mut self) -> Action {
        if self.pass_unread && self.op.version.is_none() {
            match self.op.claim_found.take() {
                // Claimed without reading, and the record exists: nothing
                // was written and nothing waited; decide from it.
                Some(found) => self.found = Some(found),
                // The claim lost to a call that created the record after
                // the claim looked: a concurrent duplicate.
                None => self.waited = true,
            }
        } else {
            self.waited = true;
        }
        self.lead()
    }

    /// Whether the record's claim belongs to a driver that may be running
    /// outside this process. Our own claims are never: we lead the key
    /// here, so whoever took it in this process is gone (its call was
    /// dropped); an earlier incarnation of our worker is gone too.
    fn driven_elsewhere(&self, setup: &Setup) -> bool {
        let me = &setup.owner;
        self.op.claim.as_ref().is_some_and(|c| {
            c.live && c.owner != *me && !me.is_other_incarnation_of_same_worker(&c.owner)
        })
    }

    /// The decision table for a call that found this record.
    fn drive(&mut self, policy: &Policy, setup: &Setup, env: Env) -> Action {
        let Some(version) = self.op.version else {
            return self.begin(policy, setup, env);
        };
        match self.op.rec.state.clone() {
            State::Committed { .. } => self.check_drift(policy, Drifted::Committed, env),
            State::Escalated => {
                let reason = self
                    .op
                    .rec
                    .escalation
                    .as_ref()
                    .map_or_else(String::new, |e| e.reason.clone());
                self.emit(
                    EventKind::Refused {
                        reason: "escalated".into(),
                    },
                    AfterEmit::Refused(Outcome::Escalated { reason }),
                )
            }
            State::Abandoned => self.emit(
                EventKind::Refused {
                    reason: "abandoned".into(),
                },
                AfterEmit::Refused(Outcome::Abandoned),
            ),
            // A call that waited for a concurrent duplicate shares its
            // decision: the same operation, decided once.
            State::Rejected { error } | State::Failed { error } if self.waited => {
                let refused = matches!(self.op.rec.state, State::Rejected { .. });
                let (reason, fault) = if refused {
                    ("refusal", Fault::Rejected { error })
                } else {
                    (
                        "failure",
                        Fault::Failed {
                            attempts: self.op.rec.attempts,
                            error,
                        },
                    )
                };
                self.emit(
                    EventKind::Refused {
                        reason: format!("shares the {reason} of the concurrent call it waited for"),
                    },
                    AfterEmit::Refused(Outcome::Journal(fault)),
                )
            }
            State::Rejected { .. } => {
                // The provider said no; a new call is a new decision, under
                // a key the provider has not cached a refusal for.
                let generation = self.op.rec.generation + 1;
                self.restart(generation);
                self.begin(policy, setup, env)
            }
            State::Failed { .. } | State::Reissue => {
                self.restart(self.op.rec.generation);
                self.begin(policy, setup, env)
            }
            State::AwaitingApproval => self.check_drift(policy, Drifted::Pending, env),
            State::Approved => {
                let approved =
                    self.op.rec.approval.as_ref().is_some_and(|a| {
                        a.approves(self.op.rec.generation, &self.called.fingerprint)
                    });
                if !approved {
                    // What runs is what the person approved, never other
                    // arguments under its key.
                    return self.emit(
                        EventKind::ArgsDrift {
                            policy: OnDrift::Reject,
                        },
                        AfterEmit::Refused(Outcome::ArgsMismatch),
                    );
                }
                self.run(policy, setup, env)
            }
            State::NotApproved { note } => self.emit(
                EventKind::Refused {
                    reason: "not approved".into(),
                },
                AfterEmit::Refused(Outcome::NotApproved { note }),
            ),
            State::Intent | State::Waiting => {
                if self.driven_elsewhere(setup) {
                    self.phase = Phase::AwaitingChange;
                    self.waited = true;
                    return Action::AwaitChange {
                        version,
                        until: self.deadline,
                    };
                }
                self.check_drift(policy, Drifted::Unfinished, env)
            }
        }
    }

    /// Same key, other arguments: an event, then the tool's policy. The
    /// event records the policy applied: `Reject` also when a field of
    /// `drift_reject` changed (or may have: arguments the record does not
    /// hold count as all changed).
    fn check_drift(&mut self, policy: &Policy, then: Drifted, env: Env) -> Action {
        if self.op.rec.fingerprint == self.called.fingerprint {
            return self.drifted(then, policy, env);
        }
        let applied = match policy.on_drift {
            OnDrift::Replay if !policy.drift_reject.is_empty() => {
                let drift = self.drift();
                let listed = drift
                    .iter()
                    .any(|f| f == "*" || policy.drift_reject.contains(&f.as_str()));
                if listed {
                    OnDrift::Reject
                } else {
                    OnDrift::Replay
                }
            }
            other => other,
        };
        self.emit(
            EventKind::ArgsDrift { policy: applied },
            AfterEmit::Drift(then, applied),
        )
    }

    fn drifted(&mut self, then: Drifted, policy: &Policy, env: Env) -> Action {
        match then {
            Drifted::Pending => self.await_approval(policy, env),
            Drifted::Committed => {
                let State::Committed { result, via } = &self.op.rec.state else {
                    unreachable!("only a committed record replays")
                };
                let remember = *via != Via::Operator;
                let result = result.clone();
                self.phase = Phase::Decoding { remember };
                Action::Decode(result)
            }
            Drifted::Unfinished => {
                // Nobody drives it: its owner died, dropped the call, or
                // was fenced off. Take it over before deciding anything, so
                // that of two workers that found it so, one goes on.
                let found = self.op.rec.state.name().to_string();
                let maybe = self.op.rec.state == State::Intent || self.op.rec.maybe_landed;
                self.op.rec.maybe_landed = maybe;
                let attempts = self.op.rec.attempts;
                self.put(
                    vec![EventKind::Recovered {
                        state: found,
                        attempts,
                    }],
                    Durability::Eventual,
                    false,
                    AfterWrite::Recovered { maybe },
                    env.now,
                )
            }
        }
    }

    /// An operation whose last attempt may have landed, found with nobody
    /// driving it (and now claimed by this drive).
    fn recover(&mut self, policy: &Policy, setup: &Setup, env: Env) -> Action {
        match policy.class {
            // The provider deduplicates on the same key: re-running is safe
            // while it still remembers the key; `run` checks the window and
            // the budget and escalates once either is spent.
            Class::Provider | Class::ReadOnly => self.run(policy, setup, env),
            Class::Journal => self.settle_then_verify(policy, env),
            Class::AtMostOnce => self.escalate(
                "a previous attempt may have reached the provider (its process died or the call \
                 was dropped mid-flight); at_most_once never re-runs"
                    .into(),
                env,
            ),
        }
    }

    /// Starts a new decision for this key: fresh budget and arguments. A
    /// new generation also starts the key's dedupe window afresh.
    fn restart(&mut self, generation: u32) {
        let rec = &mut self.op.rec;
        if generation != rec.generation {
            rec.key_first_sent_ms = None;
        }
        rec.generation = generation;
        rec.attempts = 0;
        rec.maybe_landed = false;
        rec.fingerprint = self.called.fingerprint;
        rec.args.clone_from(&self.called.args);
        rec.last_error = None;
        rec.verify_answer = None;
        rec.escalation = None;
    }

    /// Where a new decision starts: a person's approval first, if this
    /// call needs one and the record holds none for this generation and
    /// these arguments; then the run.
    fn begin(&mut self, policy: &Policy, setup: &Setup, env: Env) -> Action {
        let Some(reason) = &self.called.approval else {
            return self.run(policy, setup, env);
        };
        let rec = &self.op.rec;
        if rec
            .approval
            .as_ref()
            .is_some_and(|a| a.approves(rec.generation, &self.called.fingerprint))
        {
            return self.run(policy, setup, env);
        }
        let reason = reason.clone();
        let rec = &mut self.op.rec;
        rec.state = State::AwaitingApproval;
        rec.approval = Some(ApprovalInfo {
            reason: reason.clone(),
            requested_ms: env.now,
            generation: rec.generation,
            fingerprint: self.called.fingerprint,
            decision: None,
        });
        // Durable before the caller hears of it: a crash after this must
        // find the request, never ask again and never run without it.
        self.put(
            vec![EventKind::ApprovalRequested { reason }],
            Durability::Immediate,
            true,
            AfterWrite::ApprovalRequested,
            env.now,
        )
    }

    /// Waits for the operator's decision on the approval the record asks
    /// for, until this call's bound (`approval_wait`, counted from the
    /// first wait of this call), then says it awaits approval.
    fn await_approval(&mut self, policy: &Policy, env: Env) -> Action {
        let until = *self
            .approval_until
            .get_or_insert(env.now.saturating_add(policy.approval_wait_ms));
        let Some(version) = self.op.version.filter(|_| until > env.now) else {
            return Action::ret(Outcome::AwaitingApproval);
        };
        self.phase = Phase::AwaitingApproval;
        Action::AwaitChange { version, until }
    }

    /// The top of the run loop: the budget, then the next attempt's INTENT.
    fn run(&mut self, policy: &Policy, _setup: &Setup, env: Env) -> Action {
        self.last = Last::default();
        self.next_attempt(policy, env)
    }

    fn next_attempt(&mut self, policy: &Policy, env: Env) -> Action {
        let now = env.now;
        if let Some(why) = budget_spent(policy, &self.op.rec, now, Duration::ZERO) {
            return self.out_of_budget(why, env);
        }
        // INTENT: on disk before the provider hears of it.
        let rec = &mut self.op.rec;
        let first = rec.attempts == 0;
        rec.attempts += 1;
        if first {
            rec.first_attempt_ms = now;
        }
        rec.key_first_sent_ms.get_or_insert(now);
        rec.state = State::Intent;
        let mut events = Vec::with_capacity(2);
        if first {
            events.push(EventKind::Intent {
                generation: rec.generation,
                fingerprint: hex(&rec.fingerprint),
            });
        }
        events.push(EventKind::Attempt {
            attempt: rec.attempts,
        });
        let n = rec.attempts;
        let then = AfterWrite::Intent {
            n,
            before_held: self.op.held,
            before: self.op.previous.take(),
        };
        self.put(events, Durability::Immediate, false, then, now)
    }

    /// Writes the record with the events that record its change, as one
    /// unit. The first write of a drive takes the claim; `release` gives it
    /// up (a terminal state).
    fn put(
        &mut self,
        events: Vec<EventKind>,
        durability: Durability,
        release: bool,
        then: AfterWrite,
        now: u64,
    ) -> Action {
        self.op.rec.updated_ms = now;
        let rec = Arc::new(self.op.rec.clone());
        self.op.tried = Some(Arc::clone(&rec));
        let claim = match (release, self.op.held.is_some()) {
            (true, _) => ClaimOp::Release,
            (false, true) => ClaimOp::Keep,
            (false, false) => ClaimOp::Take,
        };
        let unread = std::mem::take(&mut self.op.unread);
        self.op.claim_found = None;
        let write = WriteOp {
            rec,
            events,
            durability,
            expect: self.op.version,
            claim,
            escalated: self.op.rec.state.needs_a_person(),
            unread,
        };
        self.phase = Phase::Writing { then, release };
        Action::Write(Box::new(write))
    }

    /// After a write that happened.
    fn written(
        &mut self,
        then: AfterWrite,
        policy: &Policy,
        setup: &Setup,
        env: Env,
        took_ms: u64,
    ) -> Action {
        match then {
            AfterWrite::Recovered { maybe } => {
                if maybe {
                    self.recover(policy, setup, env)
                } else {
                    self.run(policy, setup, env)
                }
            }
            AfterWrite::Intent { n, .. } => {
                if let Some(every) = setup.renewal_ms {
                    // The claim is a lease of three renewal periods from
                    // the write. A process paused since before it (or a
                    // write that took that long) may have been taken over:
                    // sending now could duplicate what the new owner does.
                    // Re-decide from the record instead; nothing was sent.
                    if took_ms >= every.saturating_mul(2) {
                        return self.conflict();
                    }
                }
                self.phase = Phase::Attempting { n };
                Action::Attempt {
                    attempt: n,
                    generation: self.op.rec.generation,
                }
            }
            AfterWrite::Waiting {
                n,
                delay_ms,
                spent,
                verifying,
            } => {
                if let (Some(why), false) = (&spent, verifying) {
                    return self.out_of_budget(why.clone(), env);
                }
                // Before verifying too: give the provider time to settle
                // what it may still be applying. Without a verify function
                // there is nothing to wait for: the escalation is certain.
                if !verifying || policy.verify {
                    self.phase = Phase::Sleeping(AfterSleep::Backoff {
                        n,
                        spent,
                        verifying,
                    });
                    return Action::Sleep {
                        until: env.now.saturating_add(delay_ms),
                    };
                }
                self.after_backoff(n, spent, verifying, policy, env)
            }
            AfterWrite::NotLanded { spent } => match spent {
                Some(why) => self.out_of_budget(why, env),
                None => self.next_attempt(policy, env),
            },
            AfterWrite::Rejected => {
                if self.last.typed {
                    Action::Return {
                        outcome: Outcome::Tool,
                        remember: false,
                        share: true,
                    }
                } else {
                    Action::ret(Outcome::TimedOut {
                        attempts: self.op.rec.attempts,
                    })
                }
            }
            AfterWrite::Failed { text } => {
                if self.last.typed {
                    Action::Return {
                        outcome: Outcome::Tool,
                        remember: false,
                        share: true,
                    }
                } else if !self.last.text.is_empty() {
                    // The last attempt timed out (and verify said it did not
                    // land).
                    Action::ret(Outcome::TimedOut {
                        attempts: self.op.rec.attempts,
                    })
                } else {
                    // The attempts were made by an earlier process or call.
                    Action::ret(Outcome::Journal(Fault::Failed {
                        attempts: self.op.rec.attempts,
                        error: text,
                    }))
                }
            }
            AfterWrite::Escalated { reason } => Action::ret(Outcome::Escalated { reason }),
            AfterWrite::ApprovalRequested => self.await_approval(policy, env),
            AfterWrite::Committed { from, via, .. } => Action::Return {
                outcome: Outcome::Value(from),
                remember: via != Via::Operator,
                share: false,
            },
        }
    }

    /// An INTENT could not be made durable: best effort, put back what was
    /// there, so this process does not later mistake a call that never
    /// happened for one that may have landed. The failed write may have
    /// happened all the same, so it is undone only if the journal holds
    /// exactly it. If this fails too, the cautious INTENT stays.
    fn revert_read(&mut self, before_held: Option<u64>, before: Option<Arc<OpRecord>>) -> Action {
        self.op.previous = before;
        self.op.held = before_held;
        self.phase = Phase::Reverting;
        Action::Revert(Revert::Read)
    }

    fn reverting(&mut self, input: Input, setup: &Setup) -> Action {
        match input {
            // Exactly what this drive tried, and claimed by this runtime:
            // another worker may have written the same bytes in the same
            // millisecond (its claim is its own).
            Input::Found(Some(now))
                if self.op.tried.as_deref() == Some(&now.rec)
                    && now.claim.as_ref().is_some_and(|c| c.owner == setup.owner) =>
            {
                self.phase = Phase::Reverting;
                match self.op.previous.take() {
                    None => Action::Revert(Revert::Remove {
                        version: now.version,
                    }),
                    Some(rec) => Action::Revert(Revert::Write(Box::new(WriteOp {
                        rec,
                        events: Vec::new(),
                        durability: Durability::Immediate,
                        expect: Some(now.version),
                        claim: if self.op.held.is_some() {
                            ClaimOp::Keep
                        } else {
                            ClaimOp::Release
                        },
                        escalated: false,
                        unread: false,
                    }))),
                }
            }
            // Done, or nothing to undo, or the undoing failed: the call
            // fails with the INTENT's error either way.
            _ => Action::ret(Outcome::Journal(Fault::Journal)),
        }
    }

    /// After an event was appended.
    fn emitted(&mut self, then: AfterEmit, policy: &Policy, setup: &Setup, env: Env) -> Action {
        match then {
            AfterEmit::Cached => Action::ret(Outcome::Value(ValueFrom::Cache)),
            AfterEmit::InFlight => Action::ret(Outcome::InFlight),
            AfterEmit::Drift(then, applied) => match applied {
                OnDrift::Replay => self.drifted(then, policy, env),
                OnDrift::Reject => Action::ret(Outcome::ArgsMismatch),
            },
            AfterEmit::Recorded { remember } => Action::Return {
                outcome: Outcome::Value(ValueFrom::Record),
                remember,
                share: false,
            },
            AfterEmit::Refused(outcome) => Action::ret(outcome),
            AfterEmit::Settling { until } => {
                self.phase = Phase::Sleeping(AfterSleep::Settled);
                Action::Sleep { until }
            }
            AfterEmit::Verdict { checked, why } => self.checked(why, checked, policy, setup, env),
        }
    }

    /// After attempt `n`.
    fn attempted(
        &mut self,
        n: u32,
        outcome: Attempted,
        policy: &Policy,
        _setup: &Setup,
        env: Env,
    ) -> Action {
        let (failure, text, typed) = match outcome {
            Attempted::Ok {
                stored,
                provider_replay,
            } => {
                return self.commit(
                    policy,
                    stored,
                    (Via::Call, n, provider_replay),
                    ValueFrom::Attempt,
                    env,
                )
            }
            Attempted::Failed {
                failure,
                text,
                typed,
            } => (failure, text, typed),
        };
        self.op.rec.last_error = Some(text.clone());
        match failure {
            Failure::Semantic if self.op.rec.maybe_landed => {
                // A refusal now does not say an earlier attempt did not
                // land: settle that before anything licenses a new
                // decision under a fresh key.
                return self.refused_after_doubt(n, text, typed, policy, env);
            }
            Failure::Semantic => {
                self.last = Last { typed, text };
                return self.reject(env);
            }
            Failure::Ambiguous { .. } if policy.class == Class::AtMostOnce => {
                return self.escalate(
                    format!(
                        "attempt {n} may have reached the provider ({text}); at_most_once never \
                         retries"
                    ),
                    env,
                );
            }
            Failure::Ambiguous { .. } => self.op.rec.maybe_landed = true,
            Failure::NotSent { .. } => {}
        }
        self.last = Last { typed, text };
        let delay = policy.retry.delay(n, env.jitter, failure.retry_after());
        let spent = budget_spent(policy, &self.op.rec, env.now, delay);
        let verifying =
            policy.class == Class::Journal && matches!(failure, Failure::Ambiguous { .. });
        self.op.rec.state = State::Waiting;
        let events = if spent.is_none() {
            vec![EventKind::Retry {
                attempt: n,
                delay_ms: delay.as_millis() as u64,
                failure: failure.label().into(),
                error: self.last.text.clone(),
            }]
        } else {
            Vec::new()
        };
        // Eventual: if this is lost in a crash, the durable INTENT is the
        // more cautious truth.
        self.put(
            events,
            Durability::Eventual,
            false,
            AfterWrite::Waiting {
                n,
                delay_ms: delay.as_millis() as u64,
                spent,
                verifying,
            },
            env.now,
        )
    }

    /// After the backoff following attempt `n`.
    fn after_backoff(
        &mut self,
        n: u32,
        spent: Option<String>,
        verifying: bool,
        policy: &Policy,
        env: Env,
    ) -> Action {
        if verifying {
            return self.verify(policy, Why::Ambiguous { n, spent });
        }
        let _ = spent;
        self.next_attempt(policy, env)
    }

    fn slept(&mut self, then: AfterSleep, policy: &Policy, _setup: &Setup, env: Env) -> Action {
        match then {
            AfterSleep::Backoff {
                n,
                spent,
                verifying,
            } => self.after_backoff(n, spent, verifying, policy, env),
            AfterSleep::Settled => self.verify(policy, Why::Recover),
        }
    }

    /// A semantic refusal after an attempt that may have landed.
    fn refused_after_doubt(
        &mut self,
        n: u32,
        text: String,
        typed: bool,
        policy: &Policy,
        env: Env,
    ) -> Action {
        if policy.class == Class::Journal {
            return self.verify(policy, Why::Doubt { n, text, typed });
        }
        self.escalate(
            format!(
                "attempt {n} was refused ({text}) after an earlier attempt that may have landed; \
                 nothing can tell whether that one did"
            ),
            env,
        )
    }

    /// Records a semantic refusal (the last failure) and returns it.
    fn reject(&mut self, env: Env) -> Action {
        let error = self.last.text.clone();
        self.op.rec.state = State::Rejected {
            error: error.clone(),
        };
        self.op.rec.maybe_landed = false;
        self.put(
            vec![EventKind::Rejected { error }],
            Durability::Immediate,
            true,
            AfterWrite::Rejected,
            env.now,
        )
    }

    /// The budget is spent (`why`).
    fn out_of_budget(&mut self, why: String, env: Env) -> Action {
        let rec = &self.op.rec;
        if rec.maybe_landed {
            let detail = if self.last.text.is_empty() {
                rec.last_error.clone().unwrap_or_else(|| {
                    "none recorded (the attempt's process died or its call was dropped)".into()
                })
            } else {
                self.last.text.clone()
            };
            return self.escalate(
                format!(
                    "retry budget spent ({why}) with an outcome that may have landed; last \
                     error: {detail}"
                ),
                env,
            );
        }
        // Nothing landed: the operation failed. Its last error is the
        // tool's own if this call made the attempt, else known as text.
        let text = if self.last.text.is_empty() {
            rec.last_error
                .clone()
                .unwrap_or_else(|| format!("retry budget spent ({why})"))
        } else {
            self.last.text.clone()
        };
        self.op.rec.state = State::Failed {
            error: text.clone(),
        };
        self.put(
            vec![EventKind::Failed {
                error: text.clone(),
            }],
            Durability::Immediate,
            true,
            AfterWrite::Failed { text },
            env.now,
        )
    }

    /// `verify` for an attempt nobody is driving any more. Its request may
    /// still be inside the provider (the process that sent it died a
    /// moment ago, or the call was dropped): asking now could hear "not
    /// landed" just before it lands. So wait until it would have counted
    /// as over in the call itself: its start, plus the per-attempt
    /// timeout, plus the backoff the call would have slept before
    /// verifying.
    fn settle_then_verify(&mut self, policy: &Policy, env: Env) -> Action {
        if policy.verify {
            let settle = policy
                .timeout
                .unwrap_or_default()
                .saturating_add(policy.retry.base_delay(self.op.rec.attempts.max(1)));
            let ready = self.op.found_ms.saturating_add(settle.as_millis() as u64);
            if ready > env.now {
                let wait_ms = ready - env.now;
                return self.emit(
                    EventKind::Settling { wait_ms },
                    AfterEmit::Settling { until: ready },
                );
            }
        }
        self.verify(policy, Why::Recover)
    }

    /// Asks `verify`, or, without a verify function, records that there is
    /// nothing to ask.
    fn verify(&mut self, policy: &Policy, why: Why) -> Action {
        if !policy.verify {
            return self.record_verdict(
                "none".into(),
                Checked::Undecided("the tool has verify = \"none\"".into()),
                why,
            );
        }
        self.phase = Phase::Verifying(why);
        Action::Verify {
            attempt: self.op.rec.attempts,
            generation: self.op.rec.generation,
        }
    }

    fn verified(&mut self, why: Why, answer: Answer) -> Action {
        let (verdict, checked) = match answer {
            Answer::Landed(stored) => ("landed".to_string(), Checked::Landed(stored)),
            Answer::NotLanded => ("not_landed".into(), Checked::NotLanded),
            Answer::Unknown => (
                "unknown".into(),
                Checked::Undecided("verify answered unknown".into()),
            ),
            Answer::Failed(text) => (
                format!("error: {text}"),
                Checked::Undecided(format!("verify failed: {text}")),
            ),
            Answer::TimedOut(text) => (
                format!("error: {text}"),
                Checked::Undecided(format!("verify {text}")),
            ),
        };
        self.record_verdict(verdict, checked, why)
    }

    fn record_verdict(&mut self, verdict: String, checked: Checked, why: Why) -> Action {
        self.op.rec.verify_answer = Some(verdict.clone());
        self.emit(
            EventKind::Verified { verdict },
            AfterEmit::Verdict { checked, why },
        )
    }

    /// Acts on `verify`'s answer.
    fn checked(
        &mut self,
        why: Why,
        checked: Checked,
        policy: &Policy,
        setup: &Setup,
        env: Env,
    ) -> Action {
        match (why, checked) {
            (_, Checked::Landed(stored)) => self.commit(
                policy,
                stored,
                (Via::Verify, 0, false),
                ValueFrom::Verify,
                env,
            ),
            (Why::Recover, Checked::NotLanded) => {
                self.op.rec.maybe_landed = false;
                self.run(policy, setup, env)
            }
            (Why::Recover, Checked::Undecided(why)) => self.escalate(
                format!("a previous attempt may have landed and verify could not tell: {why}"),
                env,
            ),
            (Why::Ambiguous { spent, .. }, Checked::NotLanded) => {
                self.op.rec.maybe_landed = false;
                self.put(
                    Vec::new(),
                    Durability::Eventual,
                    false,
                    AfterWrite::NotLanded { spent },
                    env.now,
                )
            }
            (Why::Ambiguous { n, .. }, Checked::Undecided(why)) => {
                let text = self.last.text.clone();
                self.escalate(
                    format!(
                        "attempt {n} failed ambiguously ({text}) and verify could not tell: {why}"
                    ),
                    env,
                )
            }
            (Why::Doubt { text, typed, .. }, Checked::NotLanded) => {
                self.op.rec.maybe_landed = false;
                self.last = Last { typed, text };
                self.reject(env)
            }
            (Why::Doubt { n, text, .. }, Checked::Undecided(why)) => self.escalate(
                format!(
                    "attempt {n} was refused ({text}) after an earlier attempt that may have \
                     landed, and verify could not tell: {why}"
                ),
                env,
            ),
        }
    }

    /// Records the result, then hands it back.
    /// `how`: learned how, by which attempt (0: not an attempt), and
    /// whether the provider said it replayed.
    fn commit(
        &mut self,
        policy: &Policy,
        stored: Stored,
        how: (Via, u32, bool),
        from: ValueFrom,
        env: Env,
    ) -> Action {
        let (via, attempt, provider_replay) = how;
        let result = match stored {
            Stored::Bytes(r) if storable(r.0.len(), self.op.rec.args.len()) => r,
            Stored::Bytes(r) => {
                return self.escalate(
                    format!(
                        "the call succeeded, but its result ({} bytes) is larger than the journal \
                         stores ({} bytes); it cannot be replayed, so a human must settle it",
                        r.0.len(),
                        idem_journal::record::LARGE_LIMIT
                    ),
                    env,
                )
            }
            Stored::Unstorable(e) => {
                return self.escalate(
                    format!(
                        "the call succeeded, but its result could not be stored ({e}); it cannot \
                         be replayed, so a human must settle it"
                    ),
                    env,
                )
            }
        };
        self.op.rec.state = State::Committed { result, via };
        self.op.rec.maybe_landed = false;
        let mut events = Vec::with_capacity(2);
        if provider_replay {
            events.push(EventKind::ProviderReplay { attempt });
        }
        events.push(EventKind::Committed {
            attempt,
            via: via.label().into(),
        });
        self.put(
            events,
            commit_durability(policy, from),
            true,
            AfterWrite::Committed { from, attempt, via },
            env.now,
        )
    }

    /// Parks the operation for a human, with its evidence; durable before
    /// the caller hears of it.
    fn escalate(&mut self, reason: String, env: Env) -> Action {
        self.op.rec.state = State::Escalated;
        self.op.rec.escalation = Some(EscalationInfo {
            reason: reason.clone(),
            at_ms: env.now,
        });
        self.put(
            vec![EventKind::Escalated {
                reason: reason.clone(),
            }],
            Durability::Immediate,
            true,
            AfterWrite::Escalated { reason },
            env.now,
        )
    }
}

impl Op {
    /// The operation before the call's first pass, which starts from a
    /// blank (or read) record: only its generation and attempts (0) are
    /// read before that, so it holds no copies of the call's strings (a
    /// call answered from the replay cache never makes a pass).
    fn unstarted(called: &Called) -> Op {
        let nothing = Called {
            tool: String::new(),
            class: called.class,
            root_run: String::new(),
            scope: Vec::new(),
            fingerprint: called.fingerprint,
            args: String::new(),
            approval: None,
        };
        Op::blank(&nothing, 0)
    }

    /// The operation as if the journal had no record of it.
    fn blank(called: &Called, now: u64) -> Op {
        Op {
            rec: OpRecord {
                tool: called.tool.clone(),
                class: called.class,
                root_run: called.root_run.clone(),
                scope: called.scope.clone(),
                generation: 0,
                state: State::Intent,
                attempts: 0,
                first_attempt_ms: now,
                key_first_sent_ms: None,
                updated_ms: now,
                maybe_landed: false,
                fingerprint: called.fingerprint,
                args: called.args.clone(),
                last_error: None,
                verify_answer: None,
                escalation: None,
                resolution: None,
                approval: None,
            },
            version: None,
            claim: None,
            held: None,
            found_ms: now,
            previous: None,
            tried: None,
            unread: false,
            claim_found: None,
        }
    }
}

/// The record a call of `called` starts from when the journal has none
/// (for the test vectors' records left by earlier calls).
#[cfg(test)]
pub(crate) fn blank_record(called: &Called) -> OpRecord {
    Op::blank(called, 0).rec
}

/// Whether a record holding a result of `result` bytes and arguments of
/// `args` bytes fits what the journal writes, with room for the rest of
/// the record.
pub(crate) fn storable(result: usize, args: usize) -> bool {
    result + args < MAX_RECORD_PAYLOAD
}

/// Why no further attempt may start `after` from `now`, if so.
pub fn budget_spent(policy: &Policy, rec: &OpRecord, now: u64, after: Duration) -> Option<String> {
    let retry = &policy.retry;
    let attempts = rec.attempts;
    if attempts == 0 {
        return None;
    }
    let since = |t: u64| Duration::from_millis(now.saturating_sub(t)).saturating_add(after);
    if attempts >= retry.max_attempts {
        return Some(format!(
            "{attempts} of {} attempts made",
            retry.max_attempts
        ));
    }
    if let Some(max) = retry.max_elapsed {
        if since(rec.first_attempt_ms) > max {
            return Some(format!(
                "max_elapsed {max:?} passed since the first attempt"
            ));
        }
    }
    // A key the provider no longer remembers deduplicates nothing. Its
    // memory starts with the key's first use, reissues included.
    let key_age = since(rec.key_first_sent_ms.unwrap_or(rec.first_attempt_ms));
    if policy.class == Class::Provider && rec.maybe_landed && key_age >= policy.dedupe_window {
        return Some(format!(
            "the provider's dedupe window ({:?}) has passed since the key was first sent",
            policy.dedupe_window
        ));
    }
    None
}

/// The COMMITTED record of an attempt may be eventual when the tool says
/// so (its loss is recovered as a crash after the call: the provider
/// deduplicates the key, `verify` finds the effect); everything else is
/// immediate, and never eventual for `at_most_once`.
fn commit_durability(policy: &Policy, from: ValueFrom) -> Durability {
    match (from, policy.class) {
        (ValueFrom::Attempt, Class::Provider | Class::Journal) => policy.commit,
        _ => Durability::Immediate,
    }
}
