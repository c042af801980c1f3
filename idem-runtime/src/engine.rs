//! The driver of the engine: it executes what the call machine
//! (`machine/call.rs`, where the decision tables are) asks for, against
//! the journal, the leader table, the tool's body and the clock, and feeds
//! back what came of it. It decides nothing: every `match` here is on an
//! action or a result, never on a record's state.
//!
//! What the machine cannot hold, the driver does: the tool's typed value
//! and error (the machine only learns whether there is one, and its text),
//! the journal's error (the machine learns that there was one), and the
//! lead of the key in this process.

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tracing::Instrument;

use crate::class::ToolDescriptor;
use crate::ctx::Ctx;
use crate::error::ToolError;
use crate::failure::{Classify, Failure, Verdict};
use crate::key::Args;
use crate::leaders::{Entry, LeaderOutcome, Slot};
use crate::machine::call::{
    Action, Answer, Attempted, Call, Called, ClaimOp, Env, Fault, Found, Input, Outcome, Revert,
    Stored, ValueFrom, WriteOp,
};
use crate::machine::policy::{Policy, MAX_ARGS_BYTES};
use crate::replays::Replay;
use crate::shared::Shared;
use crate::trace::{self, Traced};
use crate::unit::{self, Unit, Wrote};
use idem_journal::audit::{Draft, EventKind};
use idem_journal::codec;
use idem_journal::error::Error;
use idem_journal::journal::{ClaimChange, Digest, Durability, Expect, Held, Loaded, Space};
use idem_journal::key::IdemKey;
use idem_journal::record::{self, Kind, OpRecord, State};

/// How the engine treats a tool's error type beyond [`Classify`]: how to
/// show it to people, and whether concurrent duplicates of a call can be
/// handed the leader's error. `#[tool]` fills these in from what the type
/// implements.
pub struct ErrorHooks<E> {
    /// The error as operators and models read it (its `Display` when it
    /// has one).
    pub describe: fn(&E) -> String,
    /// Packs a copy of the error for the calls that waited on this one.
    pub share: Option<fn(&E) -> LeaderOutcome>,
    /// Unpacks what a leader shared.
    pub unshare: Option<fn(&LeaderOutcome) -> Option<E>>,
    /// The tool's result check for an operator's `Landed` (see
    /// `ToolDescriptor::check_landed`), for tools whose descriptor cannot
    /// carry it (generic results): the runtime remembers it once called.
    pub check_landed: Option<crate::class::LandedCheck>,
}

impl<E: Debug> ErrorHooks<E> {
    /// `Debug` for text, nothing shared.
    pub fn debug() -> Self {
        ErrorHooks {
            describe: |e| format!("{e:?}"),
            share: None,
            unshare: None,
            check_landed: None,
        }
    }
}

impl<E: Debug> Default for ErrorHooks<E> {
    fn default() -> Self {
        Self::debug()
    }
}

impl<E: std::fmt::Display + Debug> ErrorHooks<E> {
    /// `Display` for text, nothing shared.
    pub fn display() -> Self {
        ErrorHooks {
            describe: |e| e.to_string(),
            share: None,
            unshare: None,
            check_landed: None,
        }
    }
}

impl<E: Clone + Send + Sync + 'static> ErrorHooks<E> {
    /// Also hands waiters a clone of the leader's error.
    pub fn sharing(mut self) -> Self {
        self.share = Some(|e| std::sync::Arc::new(e.clone()));
        self.unshare = Some(|s| s.downcast_ref::<E>().cloned());
        self
    }
}

/// Runs a journaled tool call (provider, journal or at_most_once class).
///
/// `key` is the operation's key (generation 0), derived by the caller before
/// this is called; `attempt` runs the tool body once per attempt; `verify`
/// answers whether an unknown outcome landed.
pub async fn call<T, E, F, Fut, V, VFut>(
    ctx: &Ctx,
    tool: &'static ToolDescriptor,
    key: IdemKey,
    args: Args,
    attempt: F,
    verify: Option<V>,
) -> Result<T, ToolError<E>>
where
    T: Serialize + DeserializeOwned,
    E: Classify + Debug,
    F: FnMut(Ctx) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    V: FnMut(Ctx) -> VFut,
    VFut: Future<Output = Result<Verdict<T>, E>>,
{
    call_with(ctx, tool, key, args, attempt, verify, ErrorHooks::debug()).await
}

/// [`call`], with the error hooks `#[tool]` derives for `E`.
pub async fn call_with<T, E, F, Fut, V, VFut>(
    ctx: &Ctx,
    tool: &'static ToolDescriptor,
    key: IdemKey,
    args: Args,
    attempt: F,
    verify: Option<V>,
    hooks: ErrorHooks<E>,
) -> Result<T, ToolError<E>>
where
    T: Serialize + DeserializeOwned,
    E: Classify + Debug,
    F: FnMut(Ctx) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    V: FnMut(Ctx) -> VFut,
    VFut: Future<Output = Result<Verdict<T>, E>>,
{
    if !tool.class.is_journaled() {
        return call_read_only(ctx, tool, attempt).await;
    }
    let shared = ctx.shared();
    if let Some(refused) = crate::saga::replay_only(ctx, tool, &key).await {
        return Err(refused);
    }
    let metered = shared.audit.metrics.call(tool);
    let traced = Traced::call(ctx, tool, Some(&key));
    let (json, fingerprint) = args.canonical();
    shared.saw(metered.slot(), tool, hooks.check_landed);
    let policy = policy_of(tool, verify.is_some());
    let args_len = json.len();
    let machine = Call::new(Called {
        tool: tool.name.to_string(),
        class: tool.class,
        root_run: ctx.root_run().to_string(),
        scope: ctx.scope_path().map(str::to_string).collect(),
        fingerprint,
        args: if args_len > MAX_ARGS_BYTES {
            String::new()
        } else {
            json
        },
        approval: args.approval().map(str::to_string),
    });
    let mut driver = Driver {
        ctx,
        shared,
        tool,
        key,
        policy,
        machine,
        body: Fns { attempt, verify },
        hooks,
        slot: None,
        leader: None,
        began: None,
        now_ms: 0,
        value: None,
        error: None,
        fault: None,
        undecodable: None,
        report: crate::dispatch::report::claim(),
        traced: &traced,
    };
    // A result this runtime has seen committed is final: replay it
    // without reading the journal. (Other arguments take the journal's
    // path, which records the drift and applies the tool's policy.)
    let cached = driver.cached(fingerprint);
    // The driver stays in this future's state and the drive borrows it: a
    // future that owned it would copy its kilobytes when made and again
    // when first polled.
    let drive = driver.drive(Input::Start { cached, args_len });
    // Without a subscriber, no wrapper (a replay costs a few microseconds).
    let result = if traced.span().is_disabled() {
        drive.await
    } else {
        drive.instrument(traced.span().clone()).await
    };
    drop(driver);
    metered.finish(traced.finish(result))
}

/// A tool's rules, as the machine applies them.
fn policy_of(tool: &ToolDescriptor, verify: bool) -> Policy {
    Policy {
        approval_wait_ms: tool.approval_wait.as_millis() as u64,
        class: tool.class,
        retry: tool.retry,
        dedupe_window: tool.dedupe_window,
        timeout: tool.timeout,
        on_drift: tool.on_drift,
        drift_reject: tool.drift_reject,
        verify,
        commit: tool.commit,
    }
}

/// Executes one call's actions.
struct Driver<'a, T, E, B> {
    ctx: &'a Ctx,
    shared: &'a Shared,
    tool: &'static ToolDescriptor,
    /// The key, generation 0.
    key: IdemKey,
    policy: Policy,
    machine: Call,
    body: B,
    hooks: ErrorHooks<E>,
    /// The lead of the key in this process, while held.
    slot: Option<Slot<'a>>,
    /// Waiting for this process's leader.
    leader: Option<tokio::sync::watch::Receiver<Option<LeaderOutcome>>>,
    /// When the last write began: an attempt's timeout counts from the
    /// start of its INTENT's write.
    began: Option<tokio::time::Instant>,
    /// The time the step being carried out was decided at: what the
    /// events it writes are stamped with (read once for both).
    now_ms: u64,
    /// The value to return (from an attempt, `verify`, the record or the
    /// cache).
    value: Option<T>,
    /// The tool's error from the last attempt.
    error: Option<E>,
    /// The journal's error the call fails with.
    fault: Option<Error>,
    /// Why the committed result did not decode.
    undecodable: Option<String>,
    /// This call reports to a dispatcher (`dispatch::report`).
    report: bool,
    /// The call's span and what it records.
    traced: &'a Traced,
}

impl<'a, T, E, B> Driver<'a, T, E, B>
where
    T: Serialize + DeserializeOwned,
    E: Classify + Debug,
    B: Body<T, E>,
{
    /// A cached result for these arguments, decoded into `value`: its
    /// generation.
    fn cached(&mut self, fingerprint: [u8; 32]) -> Option<u32> {
        let hit = self
            .shared
            .replays
            .get(self.key.digest(), self.tool.name, self.tool.class)?;
        if hit.fingerprint != fingerprint {
            return None;
        }
        let value = codec::decode(&hit.result).ok()?;
        self.value = Some(value);
        Some(hit.generation)
    }

    /// The key at the machine's generation.
    fn key(&self) -> IdemKey {
        self.key.with_generation(self.machine.generation())
    }

    /// The step's time and draw; `now` when the clock was read for the
    /// step just before, whose action took no time (it did not wait).
    fn env(&self, input: &Input, now: Option<u64>) -> Env {
        // A retry delay is the only thing a draw is for.
        let jitter = match input {
            Input::Attempted(Attempted::Failed { .. }) => self.shared.jitter.unit(),
            _ => 0.0,
        };
        Env {
            now: now.unwrap_or_else(|| self.shared.clock.now_ms()),
            jitter,
        }
    }

    async fn drive(&mut self, first: Input) -> Result<T, ToolError<E>> {
        let mut input = first;
        // The last step's time, while it is still now.
        let mut still_now = None;
        loop {
            let env = self.env(&input, still_now.take());
            self.now_ms = env.now;
            let action = self
                .machine
                .step(&self.policy, &self.shared.setup, env, input);
            input = match action {
                Action::Return {
                    outcome,
                    remember,
                    share,
                } => {
                    let result = self.finish(outcome, remember, share);
                    // The lead goes with the answer, as it did when the
                    // driver was consumed here.
                    self.slot = None;
                    return result;
                }
                // Actions that do not wait: the next step is decided at the
                // same time.
                Action::Lead => {
                    still_now = Some(env.now);
                    self.lead()
                }
                Action::Decode(result) => {
                    still_now = Some(env.now);
                    self.decode(&result.0)
                }
                // Timed here, not in a function of its own: every async
                // layer is a copy of the futures under it.
                action => {
                    let timer = if touches_journal(&action) {
                        self.traced.journal_timer()
                    } else {
                        None
                    };
                    let input = self.act(action).await;
                    self.traced.journal_done(timer);
                    input
                }
            };
        }
    }

    async fn act(&mut self, action: Action) -> Input {
        match action {
            Action::AwaitLeader { until } => self.await_leader(until).await,
            Action::AwaitChange { version, until } => {
                self.slot = None;
                tracing::debug!(target: "idem::engine", key = %self.key(), "waiting for a call driven by another worker");
                let digest = *self.key.digest();
                let wait = self.shared.journal.changed(Space::Ops, &digest, version);
                match tokio::time::timeout(self.until(until), wait).await {
                    Ok(()) => Input::Changed,
                    Err(_) => Input::TimedOut,
                }
            }
            Action::Read => match self.read().await {
                Ok(found) => Input::Found(found),
                Err(e) => {
                    self.fault = Some(e);
                    Input::ReadFailed
                }
            },
            Action::Write(op) => self.write(op).await,
            Action::Revert(step) => self.revert(step).await,
            Action::Emit(kind) => {
                let replay = kind == EventKind::DedupeHit;
                if replay && self.held(&kind) {
                    return Input::Appended;
                }
                match self.emit(kind).await {
                    Ok(()) => Input::Appended,
                    Err(e) => {
                        if replay {
                            // The replay is answered all the same (the
                            // event records no decision).
                            tracing::warn!(target: "idem::engine", key = %self.key(), error = %e, "a replay's audit event could not be written");
                        }
                        self.fault = Some(e);
                        Input::AppendFailed
                    }
                }
            }
            Action::EmitBestEffort(kind) => {
                let _ = self.emit(kind).await;
                Input::Appended
            }
            Action::Attempt {
                attempt,
                generation,
            } => self.attempt(attempt, generation).await,
            Action::Verify {
                attempt,
                generation,
            } => self.verify(attempt, generation).await,
            Action::Sleep { until } => {
                tokio::time::sleep(self.until(until)).await;
                Input::Slept
            }
            Action::Lead | Action::Decode(_) | Action::Return { .. } => {
                unreachable!("carried out by drive, without waiting")
            }
        }
    }

    /// Decodes the committed result for the caller.
    fn decode(&mut self, result: &[u8]) -> Input {
        match codec::decode(result) {
            Ok(v) => {
                self.value = Some(v);
                Input::Decoded(true)
            }
            Err(detail) => {
                self.undecodable = Some(detail);
                Input::Decoded(false)
            }
        }
    }

    /// How long from now until `until` on the runtime's clock.
    fn until(&self, until: u64) -> Duration {
        Duration::from_millis(until.saturating_sub(self.shared.clock.now_ms()))
    }

    fn lead(&mut self) -> Input {
        // Leave the lead first: a waiter woken by it must find it free.
        self.slot = None;
        self.leader = None;
        match self.shared.local.enter(self.key.digest()) {
            Entry::Leader(slot) => {
                self.slot = Some(slot);
                Input::Led
            }
            Entry::Busy(rx) => {
                self.leader = Some(rx);
                Input::Busy
            }
        }
    }

    /// Waits for this process's leader of the key to go (it finished, or
    /// its future was dropped), and takes the error it left, if any.
    async fn await_leader(&mut self, until: u64) -> Input {
        let Some(mut rx) = self.leader.take() else {
            return Input::LeaderLeft {
                shared_error: false,
            };
        };
        if tokio::time::timeout(self.until(until), rx.changed())
            .await
            .is_err()
        {
            return Input::TimedOut;
        }
        let left = rx.borrow().clone();
        if let (Some(left), Some(unshare)) = (left, self.hooks.unshare) {
            if let Some(e) = unshare(&left) {
                self.error = Some(e);
                return Input::LeaderLeft { shared_error: true };
            }
        }
        Input::LeaderLeft {
            shared_error: false,
        }
    }

    async fn read(&self) -> Result<Option<Box<Found>>, Error> {
        let loaded = self
            .shared
            .journal
            .load(Space::Ops, self.key.digest())
            .await?;
        loaded.map(|l| self.decoded(l)).transpose()
    }

    /// A record as the machine takes it in. A record that cannot be
    /// decoded is an error, never "absent".
    fn decoded(&self, loaded: Loaded) -> Result<Box<Found>, Error> {
        let rec = OpRecord::decode(
            &loaded.body,
            self.shared.journal.location(),
            self.key.digest(),
        )?;
        Ok(Box::new(Found {
            rec,
            version: loaded.version,
            claim: loaded.claim,
        }))
    }

    /// The events of one unit, stamped with the time of the step that
    /// decided them.
    fn drafts<'k>(&'k self, key: &'k IdemKey, events: Vec<EventKind>) -> Vec<Draft<'k>> {
        let at_ms = self.now_ms;
        events
            .into_iter()
            .map(|kind| draft_at(self.ctx, self.tool.name, Some(key), kind, at_ms))
            .collect()
    }

    /// The unit that carries out `op` on this call's record.
    fn unit<'u>(&'u self, op: &WriteOp, digest: &'u Digest, body: &'u [u8]) -> Unit<'u> {
        Unit {
            space: Space::Ops,
            key: digest,
            expect: op.expect.map_or(Expect::Absent, Expect::Version),
            body,
            claim: match op.claim {
                ClaimOp::Keep => ClaimChange::Keep,
                ClaimOp::Take => ClaimChange::Take(&self.shared.owner),
                ClaimOp::Release => ClaimChange::Release,
            },
            escalated: op.escalated,
            durability: op.durability,
            unread: op.unread,
        }
    }

    /// Takes the op boxed, as the machine gave it: the future holds a
    /// pointer, not the record.
    async fn write(&mut self, mut op: Box<WriteOp>) -> Input {
        let began = tokio::time::Instant::now();
        self.began = Some(began);
        // The events go to the drafts; the op is not read for them again.
        let events = std::mem::take(&mut op.events);
        match self.write_op(&op, events, began).await {
            Ok(input) => input,
            Err(e) => {
                self.fault = Some(e);
                Input::WriteFailed
            }
        }
    }

    async fn write_op(
        &self,
        op: &WriteOp,
        events: Vec<EventKind>,
        began: tokio::time::Instant,
    ) -> Result<Input, Error> {
        let body = record::encode(Kind::Op, &*op.rec)?;
        // The events' key: the record's generation.
        let key = self.key.with_generation(op.rec.generation);
        let drafts = self.drafts(&key, events);
        let digest = *self.key.digest();
        let wrote = unit::write(self.shared, self.unit(op, &digest, &body), drafts, true).await?;
        Ok(match wrote {
            Wrote::Done { version, epoch } => {
                if let Some(slot) = &self.slot {
                    slot.hold((op.claim != ClaimOp::Release).then_some(Held {
                        space: Space::Ops,
                        key: digest,
                        epoch,
                    }));
                }
                Input::Written {
                    version,
                    epoch,
                    took_ms: began.elapsed().as_millis() as u64,
                }
            }
            Wrote::Conflict(found) => Input::Conflict(found.map(|l| self.decoded(l)).transpose()?),
        })
    }

    /// A best-effort step of undoing a failed INTENT: its failures are not
    /// the call's (the call fails with the INTENT's error).
    async fn revert(&mut self, step: Revert) -> Input {
        let journal = &*self.shared.journal;
        let digest = *self.key.digest();
        match step {
            Revert::Read => match self.read().await {
                Ok(found) => Input::Found(found),
                Err(_) => Input::ReadFailed,
            },
            Revert::Remove { version } => Input::Removed(
                journal
                    .remove(Space::Ops, &digest, version)
                    .await
                    .unwrap_or(false),
            ),
            Revert::Write(op) => {
                let Ok(body) = record::encode(Kind::Op, &*op.rec) else {
                    return Input::Removed(false);
                };
                // Its events are none: a revert records no decision.
                let wrote = unit::write(
                    self.shared,
                    self.unit(&op, &digest, &body),
                    Vec::new(),
                    true,
                )
                .await;
                Input::Removed(matches!(wrote, Ok(Wrote::Done { .. })))
            }
        }
    }

    /// Whether the event was held to be written with others (a replay's,
    /// on a journal where each write is a round trip): it records no
    /// decision, and a replay answered from memory should wait for nothing.
    fn held(&self, kind: &EventKind) -> bool {
        if !self.shared.journal.remote() {
            return false;
        }
        let key = self.key();
        let draft = draft_at(
            self.ctx,
            self.tool.name,
            Some(&key),
            kind.clone(),
            self.now_ms,
        );
        match self.shared.audit.hold(&self.shared.journal, draft) {
            Ok(held) => held,
            Err(e) => {
                tracing::warn!(target: "idem::engine", key = %key, error = %e, "a replay's audit event could not be encoded");
                false
            }
        }
    }

    async fn emit(&self, kind: EventKind) -> Result<(), Error> {
        let key = self.key();
        self.shared
            .audit
            .emit(
                &*self.shared.journal,
                draft_at(self.ctx, self.tool.name, Some(&key), kind, self.now_ms),
                Durability::Eventual,
            )
            .await
            .map(|_| ())
    }

    async fn attempt(&mut self, attempt: u32, generation: u32) -> Input {
        let key = self.key.with_generation(generation);
        let call_ctx = self.ctx.for_call(&key, attempt);
        let span = self.traced.attempt(attempt);
        // An attempt follows its INTENT's write, so `began` is set.
        let began = self.began.unwrap_or_else(tokio::time::Instant::now);
        let fut = run_attempt_from(self.tool, began, self.body.attempt(call_ctx.clone()));
        let outcome = if span.is_disabled() {
            fut.await
        } else {
            fut.instrument(span.clone()).await
        };
        trace::attempt_outcome(&span, &outcome);
        self.error = None;
        Input::Attempted(match outcome {
            Ok(Ok(v)) => {
                let stored = stored(&v);
                self.value = Some(v);
                Attempted::Ok {
                    stored,
                    provider_replay: call_ctx.provider_replayed(),
                }
            }
            Ok(Err(e)) => {
                let text = (self.hooks.describe)(&e);
                let failure = e.classify();
                self.error = Some(e);
                Attempted::Failed {
                    failure,
                    text,
                    typed: true,
                }
            }
            // Never polled: the tool's code did not run, nothing was sent
            // (the INTENT's write outlasted the timeout, a database
            // failover say). Anything else may have reached the provider.
            Err(TimedOut {
                started: false,
                text,
            }) => Attempted::Failed {
                failure: Failure::not_sent(),
                text,
                typed: false,
            },
            Err(TimedOut { text, .. }) => Attempted::Failed {
                failure: Failure::ambiguous(),
                text,
                typed: false,
            },
        })
    }

    async fn verify(&mut self, attempt: u32, generation: u32) -> Input {
        let key = self.key.with_generation(generation);
        let call_ctx = self.ctx.for_call(&key, attempt);
        let Some(asked) = self.body.verify(call_ctx) else {
            return Input::Verified(Answer::Unknown);
        };
        let span = self.traced.verify(attempt);
        let answer = run_attempt(self.tool, asked).instrument(span.clone()).await;
        trace::verify_outcome(&span, &answer);
        Input::Verified(match answer {
            Ok(Ok(Verdict::Landed(v))) => {
                let stored = stored(&v);
                self.value = Some(v);
                Answer::Landed(stored)
            }
            Ok(Ok(Verdict::NotLanded)) => Answer::NotLanded,
            Ok(Ok(Verdict::Unknown)) => Answer::Unknown,
            Ok(Err(e)) => Answer::Failed((self.hooks.describe)(&e)),
            Err(elapsed) => Answer::TimedOut(elapsed),
        })
    }

    /// Hands the machine's outcome to the caller.
    fn finish(&mut self, outcome: Outcome, remember: bool, share: bool) -> Result<T, ToolError<E>> {
        if remember {
            self.remember();
        }
        let replayed = matches!(
            outcome,
            Outcome::Value(ValueFrom::Record | ValueFrom::Cache)
        );
        if replayed {
            self.traced.replayed();
        }
        if self.report {
            crate::dispatch::report::fill(crate::dispatch::CallReport {
                replayed,
                drift: self.machine.drift(),
            });
        }
        if share {
            if let (Some(e), Some(share), Some(slot)) = (&self.error, self.hooks.share, &self.slot)
            {
                slot.share(share(e));
            }
        }
        let key = self.key();
        let tool = self.tool;
        match outcome {
            Outcome::Value(from) => self.value.take().ok_or_else(|| {
                ToolError::Journal(Error::Usage(format!(
                    "idem engine: no value to return from {from:?} (a bug)"
                )))
            }),
            Outcome::Tool => Err(match self.error.take() {
                Some(e) => ToolError::Tool(e),
                None => timed_out(tool, self.machine.record().attempts),
            }),
            Outcome::TimedOut { attempts } => Err(timed_out(tool, attempts)),
            Outcome::Escalated { reason } => Err(ToolError::Escalated { key, reason }),
            Outcome::InFlight => Err(ToolError::InFlight { key }),
            Outcome::ArgsMismatch => Err(ToolError::ArgsMismatch { key }),
            Outcome::Abandoned => Err(ToolError::Abandoned { key }),
            Outcome::AwaitingApproval => Err(ToolError::AwaitingApproval { key }),
            Outcome::NotApproved { note } => Err(ToolError::NotApproved { key, note }),
            Outcome::Journal(fault) => Err(ToolError::Journal(match fault {
                Fault::Journal => self.fault.take().unwrap_or_else(|| {
                    Error::Usage("idem engine: a journal error went missing (a bug)".into())
                }),
                Fault::ToolMismatch {
                    stored_tool,
                    stored_class,
                } => Error::ToolMismatch {
                    key,
                    stored_tool,
                    stored_class,
                    tool: tool.name.to_string(),
                    class: tool.class,
                },
                Fault::Rejected { error } => Error::Rejected { key, error },
                Fault::Failed { attempts, error } => Error::Failed {
                    key,
                    attempts,
                    error,
                },
                Fault::TooLarge { size } => Error::TooLarge {
                    what: "the call's recorded arguments",
                    size,
                    limit: MAX_ARGS_BYTES as u64,
                },
                Fault::Undecodable => Error::Result {
                    key: key.to_string(),
                    op: "decoded",
                    detail: self.undecodable.take().unwrap_or_default(),
                },
            })),
        }
    }

    /// Keeps a final result (committed by a call or learned by verify) for
    /// replays without a journal read.
    fn remember(&self) {
        let rec = self.machine.record();
        if let State::Committed { result, .. } = &rec.state {
            self.shared.replays.put(
                *self.key.digest(),
                Replay {
                    tool: self.tool.name,
                    class: self.tool.class,
                    generation: rec.generation,
                    fingerprint: rec.fingerprint,
                    result: crate::replays::Bytes::new(&result.0),
                },
            );
        }
    }
}

/// A value as the journal stores results, or why it cannot be.
fn stored<T: Serialize>(value: &T) -> Stored {
    match codec::encode(value) {
        Ok(bytes) => Stored::Bytes(idem_journal::record::Blob(bytes)),
        Err(e) => Stored::Unstorable(e),
    }
}

/// Runs a read-only tool call: no key, no journal; every failure but a
/// semantic one is retried within the budget.
pub async fn call_read_only<T, E, F, Fut>(
    ctx: &Ctx,
    tool: &'static ToolDescriptor,
    attempt: F,
) -> Result<T, ToolError<E>>
where
    E: Classify + Debug,
    F: FnMut(Ctx) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    if matches!(ctx.call, crate::ctx::InCall::No) && ctx.scope.compensation {
        // A saga's compensation must run once across crashes; a read-only
        // call is not journaled, so it would run again on every resume.
        return Err(ToolError::Journal(Error::Usage(format!(
            "`{}` is a read_only tool and cannot compensate a saga's step: a compensation \
             runs exactly once only as a journaled call (provider, journal or at_most_once); \
             it did not run",
            tool.name
        ))));
    }
    let metered = ctx.shared().audit.metrics.call(tool);
    let traced = Traced::call(ctx, tool, None);
    // Without a subscriber, no wrapper at all (the read-only path is the
    // cheapest call there is, and measured so).
    let result = if traced.span().is_disabled() {
        read_only(ctx, tool, attempt, &metered, &traced).await
    } else {
        let span = traced.span().clone();
        read_only(ctx, tool, attempt, &metered, &traced)
            .instrument(span)
            .await
    };
    metered.finish(traced.finish(result))
}

/// Whether carrying out `action` waits on the journal (the time the call's
/// span reports as `idem.journal_us`).
fn touches_journal(action: &Action) -> bool {
    matches!(
        action,
        Action::Read
            | Action::Write(_)
            | Action::Revert(_)
            | Action::Emit(_)
            | Action::EmitBestEffort(_)
    )
}

async fn read_only<T, E, F, Fut>(
    ctx: &Ctx,
    tool: &'static ToolDescriptor,
    mut attempt: F,
    metered: &crate::metrics::Metered<'_>,
    traced: &Traced,
) -> Result<T, ToolError<E>>
where
    E: Classify + Debug,
    F: FnMut(Ctx) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    use crate::machine::read_only::{Action as Ro, Input as RoIn, Outcome as RoOut, ReadOnly};
    // A read-only call reports the default (not replayed, no drift), and
    // keeps the report from the tools its body calls.
    crate::dispatch::report::claim();
    let shared = ctx.shared();
    // The machine decides; this executes. Its times are ms since the call
    // began, on tokio's clock (a paused test clock drives it).
    let started = metered.started();
    let metrics = metered.slot();
    // Rounded up, so that a sleep until `now + delay` waits the whole delay.
    let elapsed_ms = || crate::machine::read_only::ceil_ms(started.elapsed());
    let mut machine = ReadOnly::new();
    let mut input = RoIn::Start;
    let mut error: Option<E> = None;
    let mut fault: Option<crate::Error> = None;
    let mut attempts = 0;
    loop {
        // The machine reads the time and jitter only where it computes a
        // delay (a failure): a call whose first attempt succeeds reads no
        // clock here (a clock read is tens of nanoseconds on a VM, a good
        // part of the whole read-only call).
        let env = match input {
            RoIn::Failed { .. } => Env {
                now: elapsed_ms(),
                jitter: shared.jitter.unit(),
            },
            _ => Env {
                now: 0,
                jitter: 0.0,
            },
        };
        input = match machine.step(&tool.retry, env, input) {
            Ro::Attempt { attempt: n } => {
                attempts = n;
                if n > 1 {
                    metrics.retried();
                }
                let span = traced.attempt(n);
                let fut = run_attempt(tool, attempt(ctx.for_read_only(n)));
                let result = if span.is_disabled() {
                    fut.await
                } else {
                    fut.instrument(span.clone()).await
                };
                trace::attempt_outcome(&span, &result);
                match result {
                    Ok(Ok(v)) => return Ok(v),
                    Ok(Err(e)) => {
                        let failure = e.classify();
                        let text = format!("{e:?}");
                        error = Some(e);
                        RoIn::Failed {
                            failure,
                            text,
                            typed: true,
                        }
                    }
                    Err(elapsed) => {
                        error = None;
                        RoIn::Failed {
                            failure: Failure::ambiguous(),
                            text: elapsed,
                            typed: false,
                        }
                    }
                }
            }
            Ro::Emit(kind) => {
                let timer = traced.journal_timer();
                let emitted = shared
                    .audit
                    .emit(
                        &*shared.journal,
                        draft(ctx, tool.name, None, kind),
                        Durability::Eventual,
                    )
                    .await;
                traced.journal_done(timer);
                match emitted {
                    Ok(_) => RoIn::Appended,
                    Err(e) => {
                        fault = Some(e);
                        RoIn::AppendFailed
                    }
                }
            }
            Ro::Sleep { until } => {
                tokio::time::sleep_until(started + Duration::from_millis(until)).await;
                RoIn::Slept
            }
            Ro::Return(outcome) => {
                return Err(match outcome {
                    RoOut::Value => unreachable!("a value is returned when its attempt ends"),
                    RoOut::Tool => error.map_or_else(|| timed_out(tool, attempts), ToolError::Tool),
                    RoOut::TimedOut { attempts } => timed_out(tool, attempts),
                    RoOut::Journal => ToolError::Journal(fault.take().unwrap_or_else(|| {
                        crate::Error::Usage(
                            "idem engine: a journal error went missing (a bug)".into(),
                        )
                    })),
                })
            }
        };
    }
}

fn timed_out<E>(tool: &ToolDescriptor, attempts: u32) -> ToolError<E> {
    ToolError::Journal(Error::TimedOut {
        tool: tool.name.to_string(),
        attempts,
    })
}

/// Runs one attempt under the tool's timeout; `Err` is the timeout's text.
async fn run_attempt<R>(tool: &ToolDescriptor, fut: impl Future<Output = R>) -> Result<R, String> {
    // Without a timeout, no clock read.
    if tool.timeout.is_none() {
        return Ok(fut.await);
    }
    run_attempt_from(tool, tokio::time::Instant::now(), fut)
        .await
        .map_err(|t| t.text)
}

/// [`run_attempt`], its timeout counted from `began`. The deadline is
/// checked *before* each poll of the attempt (tokio's `timeout` polls the
/// future first): a process that was paused past it (SIGSTOP, a frozen
/// VM) wakes to an attempt that is dropped without being polled again, so
/// it sends nothing more after the moment a worker that took the call over
/// waits for before asking `verify` (see `settle_then_verify`).
async fn run_attempt_from<R>(
    tool: &ToolDescriptor,
    began: tokio::time::Instant,
    fut: impl Future<Output = R>,
) -> Result<R, TimedOut> {
    let Some(limit) = tool.timeout else {
        return Ok(fut.await);
    };
    let deadline = began + limit;
    let timer = tokio::time::sleep_until(deadline);
    let mut fut = std::pin::pin!(fut);
    let mut timer = std::pin::pin!(timer);
    let mut started = false;
    std::future::poll_fn(|cx| {
        if tokio::time::Instant::now() >= deadline {
            return std::task::Poll::Ready(Err(()));
        }
        started = true;
        if let std::task::Poll::Ready(v) = fut.as_mut().poll(cx) {
            return std::task::Poll::Ready(Ok(v));
        }
        timer.as_mut().poll(cx).map(Err)
    })
    .await
    .map_err(|()| TimedOut {
        started,
        text: if started {
            format!("attempt timed out after {limit:?}")
        } else {
            format!(
                "attempt not started: its INTENT's write took longer than the tool's timeout \
                 ({limit:?}), so the tool was never run"
            )
        },
    })
}

/// An attempt the tool's timeout ended.
struct TimedOut {
    /// Whether the attempt was polled at all: if not, the tool's code never
    /// ran, so nothing was sent.
    started: bool,
    text: String,
}

fn draft<'a>(ctx: &'a Ctx, tool: &'a str, key: Option<&'a IdemKey>, kind: EventKind) -> Draft<'a> {
    draft_at(ctx, tool, key, kind, ctx.shared().clock.now_ms())
}

fn draft_at<'a>(
    ctx: &'a Ctx,
    tool: &'a str,
    key: Option<&'a IdemKey>,
    kind: EventKind,
    at_ms: u64,
) -> Draft<'a> {
    Draft {
        at_ms,
        tool,
        key,
        root_run: ctx.root_run(),
        agent: ctx.agent(),
        worker: &ctx.shared().owner,
        kind,
    }
}

/// What the engine needs of a tool: its body, once per attempt, and its
/// `verify` function, if it has one. One bound instead of six on every step
/// of the state machine.
trait Body<T, E> {
    type Attempt: Future<Output = Result<T, E>>;
    type Verify: Future<Output = Result<Verdict<T>, E>>;
    fn attempt(&mut self, ctx: Ctx) -> Self::Attempt;
    /// `None` when the tool has no verify function.
    fn verify(&mut self, ctx: Ctx) -> Option<Self::Verify>;
}

/// The two closures `#[tool]` generates.
struct Fns<F, V> {
    attempt: F,
    verify: Option<V>,
}

impl<T, E, F, Fut, V, VFut> Body<T, E> for Fns<F, V>
where
    F: FnMut(Ctx) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    V: FnMut(Ctx) -> VFut,
    VFut: Future<Output = Result<Verdict<T>, E>>,
{
    type Attempt = Fut;
    type Verify = VFut;

    fn attempt(&mut self, ctx: Ctx) -> Fut {
        (self.attempt)(ctx)
    }

    fn verify(&mut self, ctx: Ctx) -> Option<VFut> {
        self.verify.as_mut().map(|v| v(ctx))
    }
}
