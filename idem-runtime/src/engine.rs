//! The engine: the state machine of one journaled call, in one place.
//!
//! A call looks its key up, then (DESIGN.md §5):
//!
//! | record found | provider | journal | at_most_once |
//! |---|---|---|---|
//! | none | INTENT, run | INTENT, run | INTENT, run |
//! | `Committed` | replay | replay | replay |
//! | `Intent`, our call in flight | wait for it | wait | wait |
//! | `Intent`, owner dead | re-run, same key, inside window and budget; else escalate | `verify` first | escalate |
//! | `Waiting` (between retries) | resume; if an earlier attempt may have landed, as owner dead | same | same |
//! | `Rejected` | run under the next generation | same | same |
//! | `Failed`, `Reissue` | run with a fresh budget | same | same |
//! | `Escalated` | `Escalated`, no call | same | same |
//! | `Abandoned` | `Abandoned`, no call | same | same |
//!
//! and inside a run, after each failed attempt:
//!
//! | failure | provider | journal | at_most_once |
//! |---|---|---|---|
//! | NotSent | back off, retry | back off, retry | back off, retry |
//! | Ambiguous | back off, retry, same key | back off, `verify`, then retry only if not landed | escalate |
//! | Semantic | REJECTED, return it | same | same |
//! | budget spent | an unresolved ambiguity escalates; else FAILED, return it | same | — |
//!
//! Read-only tools skip all of it: no key, no journal, plain retries.
//!
//! Durability: the INTENT of every attempt (with its attempt count) is
//! synced before the provider is called, and every terminal state is synced
//! before the caller sees it. Two writes are deliberately *not* synced:
//! moving to `Waiting` after a failure (if it is lost in a crash, the
//! durable `Intent` is the more cautious truth) and audit events that carry
//! no decision (dedupe hits, retries, drift); they ride the next sync or
//! sled's background flush.

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::audit::{AuditLog, Draft, EventKind};
use crate::class::{Class, OnDrift, ToolDescriptor};
use crate::ctx::Ctx;
use crate::error::{Error, ToolError};
use crate::failure::{Classify, Failure, Verdict};
use crate::journal::{Cas, Space};
use crate::key::{hex, Args, IdemKey, KeyBuilder};
use crate::record::{self, EscalationInfo, Kind, OpRecord, State, StepRecord, Via};
use crate::runtime::{Entry, Shared};

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
    if !tool.class.is_journaled() {
        return call_read_only(ctx, tool, attempt).await;
    }
    let mut body = Fns { attempt, verify };
    let called = Called::from(&args);
    let shared = ctx.shared();
    let digest = *key.digest();
    loop {
        let _slot = match shared.inflight.enter(&digest) {
            Entry::Leader(slot) => slot,
            Entry::Busy(mut rx) => {
                // Wakes when the leader's slot is dropped: it finished, or
                // its future was dropped mid-flight.
                match tokio::time::timeout(shared.in_flight_wait, rx.changed()).await {
                    Ok(_) => continue,
                    Err(_) => {
                        let op = Op::blank(ctx, tool, &key, &called);
                        op.emit(EventKind::Refused {
                            reason: "in flight in another call".into(),
                        })?;
                        return Err(ToolError::InFlight { key });
                    }
                }
            }
        };
        let mut op = Op::load(ctx, tool, &key, &called)?;
        return op.drive(&called, &mut body).await;
    }
}

/// Runs a read-only tool call: no key, no journal; every failure but a
/// semantic one is retried within the budget.
pub async fn call_read_only<T, E, F, Fut>(
    ctx: &Ctx,
    tool: &'static ToolDescriptor,
    mut attempt: F,
) -> Result<T, ToolError<E>>
where
    E: Classify + Debug,
    F: FnMut(Ctx) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let shared = ctx.shared();
    shared.audit.count_read_only(tool.name);
    let started = tokio::time::Instant::now();
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let call_ctx = ctx.for_call(None, attempts);
        let (failure, err, text) = match run_attempt(tool, attempt(call_ctx)).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => {
                let f = e.classify();
                let text = format!("{e:?}");
                (f, Some(e), text)
            }
            Err(elapsed) => (Failure::ambiguous(), None, elapsed),
        };
        if failure == Failure::Semantic {
            return Err(err.map_or_else(|| timed_out(tool, attempts), ToolError::Tool));
        }
        let delay = tool
            .retry
            .delay(attempts, shared.jitter.unit(), failure.retry_after());
        if !tool.retry.allows(attempts, started.elapsed() + delay) {
            return Err(err.map_or_else(|| timed_out(tool, attempts), ToolError::Tool));
        }
        shared.audit.emit(
            &*shared.journal,
            draft(
                ctx,
                tool.name,
                None,
                EventKind::Retry {
                    attempt: attempts,
                    delay_ms: delay.as_millis() as u64,
                    failure: failure.label().into(),
                    error: text,
                },
            ),
        )?;
        tokio::time::sleep(delay).await;
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
    match tool.timeout {
        None => Ok(fut.await),
        Some(limit) => tokio::time::timeout(limit, fut)
            .await
            .map_err(|_| format!("attempt timed out after {limit:?}")),
    }
}

fn draft<'a>(ctx: &'a Ctx, tool: &'a str, key: Option<&'a IdemKey>, kind: EventKind) -> Draft<'a> {
    Draft {
        at_ms: ctx.shared().clock.now_ms(),
        tool,
        key,
        root_run: ctx.root_run(),
        agent: ctx.agent(),
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
    fn has_verify(&self) -> bool;
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

    fn has_verify(&self) -> bool {
        self.verify.is_some()
    }
}

/// The call's arguments, reduced once: canonical JSON (written only with a
/// new record) and its fingerprint (compared on every call).
struct Called {
    json: String,
    fingerprint: [u8; 32],
}

impl From<&Args> for Called {
    fn from(args: &Args) -> Self {
        let (json, fingerprint) = args.canonical();
        Called { json, fingerprint }
    }
}

/// The last failure of a run, kept to be returned if the budget runs out.
struct Last<E> {
    err: Option<E>,
    text: String,
}

/// One operation being driven: its record as last written, and the bytes
/// the journal holds for it (for compare-and-swap).
struct Op<'a> {
    ctx: &'a Ctx,
    shared: &'a Shared,
    tool: &'static ToolDescriptor,
    /// The key of the current generation.
    key: IdemKey,
    rec: OpRecord,
    stored: Option<Vec<u8>>,
    /// The bytes of a write that reported failure: it may have happened all
    /// the same (an I/O error after the change), so undoing it must try them.
    failed_write: Option<Vec<u8>>,
}

impl<'a> Op<'a> {
    /// A fresh record for this call (not yet written).
    fn blank(ctx: &'a Ctx, tool: &'static ToolDescriptor, key: &IdemKey, called: &Called) -> Self {
        let shared = ctx.shared();
        let now = shared.clock.now_ms();
        Op {
            ctx,
            shared,
            tool,
            key: key.clone(),
            rec: OpRecord {
                tool: tool.name.to_string(),
                class: tool.class,
                root_run: ctx.root_run().to_string(),
                scope: ctx.scope_path().map(str::to_string).collect(),
                generation: 0,
                state: State::Waiting,
                attempts: 0,
                first_attempt_ms: now,
                updated_ms: now,
                maybe_landed: false,
                fingerprint: called.fingerprint,
                // Filled in only when this record is the one written.
                args: String::new(),
                last_error: None,
                verify_answer: None,
                owner: shared.incarnation,
                escalation: None,
                resolution: None,
            },
            stored: None,
            failed_write: None,
        }
    }

    /// The operation as the journal has it, or a blank one. A record that
    /// cannot be decoded is an error, never "absent".
    fn load(
        ctx: &'a Ctx,
        tool: &'static ToolDescriptor,
        key: &IdemKey,
        called: &Called,
    ) -> Result<Self, Error> {
        let mut op = Op::blank(ctx, tool, key, called);
        let journal = &*op.shared.journal;
        match journal.get(Space::Ops, key.digest())? {
            Some(bytes) => {
                op.rec = record::decode(Kind::Op, &bytes, journal.location(), key.digest())?;
                if op.rec.generation != key.generation() {
                    op.key = key.with_generation(op.rec.generation);
                }
                op.stored = Some(bytes);
            }
            None => op.rec.args.clone_from(&called.json),
        }
        Ok(op)
    }

    /// The decision table for a call that found this record.
    async fn drive<T, E, B>(&mut self, called: &Called, body: &mut B) -> Result<T, ToolError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: Classify + Debug,
        B: Body<T, E>,
    {
        if self.stored.is_none() {
            return self.run(body).await;
        }
        match &self.rec.state {
            State::Committed { result, .. } => {
                self.check_drift(called)?;
                let value = serde_json::from_str(result).map_err(|e| Error::Result {
                    key: self.key.to_string(),
                    op: "decoded",
                    detail: e.to_string(),
                })?;
                self.emit(EventKind::DedupeHit)?;
                Ok(value)
            }
            State::Escalated => {
                let reason = self
                    .rec
                    .escalation
                    .as_ref()
                    .map_or_else(String::new, |e| e.reason.clone());
                self.emit(EventKind::Refused {
                    reason: "escalated".into(),
                })?;
                Err(ToolError::Escalated {
                    key: self.key.clone(),
                    reason,
                })
            }
            State::Abandoned => {
                self.emit(EventKind::Refused {
                    reason: "abandoned".into(),
                })?;
                Err(ToolError::Abandoned {
                    key: self.key.clone(),
                })
            }
            State::Rejected { .. } => {
                // The provider said no; a new call is a new decision, under
                // a key the provider has not cached a refusal for.
                let generation = self.rec.generation + 1;
                self.restart(called, generation);
                self.run(body).await
            }
            State::Failed { .. } | State::Reissue => {
                self.restart(called, self.rec.generation);
                self.run(body).await
            }
            State::Waiting if !self.rec.maybe_landed => {
                self.check_drift(called)?;
                self.emit(EventKind::Recovered {
                    state: "waiting".into(),
                    attempts: self.rec.attempts,
                })?;
                self.run(body).await
            }
            State::Intent | State::Waiting => {
                // Nobody in this process drives it (we hold its slot), so
                // its owner died or dropped the call: the last attempt may
                // have landed.
                self.check_drift(called)?;
                let found = self.rec.state.name().to_string();
                self.emit(EventKind::Recovered {
                    state: found,
                    attempts: self.rec.attempts,
                })?;
                self.rec.maybe_landed = true;
                self.recover(body).await
            }
        }
    }

    /// An operation whose last attempt may have landed, found with nobody
    /// driving it.
    async fn recover<T, E, B>(&mut self, body: &mut B) -> Result<T, ToolError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: Classify + Debug,
        B: Body<T, E>,
    {
        match self.tool.class {
            // The provider deduplicates on the same key: re-running is safe
            // while it still remembers the key; `run` checks the window and
            // the budget and escalates once either is spent.
            Class::Provider | Class::ReadOnly => self.run(body).await,
            Class::Journal => match self.settle_then_verify(body).await? {
                Checked::Landed(v) => self.commit(v, Via::Verify, 0, false).await,
                Checked::NotLanded => {
                    self.rec.maybe_landed = false;
                    self.run(body).await
                }
                Checked::Undecided(why) => Err(self
                    .escalate(format!(
                        "a previous attempt may have landed and verify could not tell: {why}"
                    ))
                    .await),
            },
            Class::AtMostOnce => Err(self
                .escalate(
                    "a previous attempt may have reached the provider (its process died or the \
                     call was dropped mid-flight); at_most_once never re-runs"
                        .into(),
                )
                .await),
        }
    }

    /// Attempts until a result, a refusal, an escalation or a spent budget.
    async fn run<T, E, B>(&mut self, body: &mut B) -> Result<T, ToolError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: Classify + Debug,
        B: Body<T, E>,
    {
        let mut last: Last<E> = Last {
            err: None,
            text: String::new(),
        };
        loop {
            let now = self.shared.clock.now_ms();
            if let Some(why) = self.budget_spent(now, Duration::ZERO) {
                return Err(self.out_of_budget(last, why).await);
            }

            // INTENT: on disk before the provider hears of it.
            let before = self.stored.clone();
            let first = self.rec.attempts == 0;
            self.rec.attempts += 1;
            if first {
                self.rec.first_attempt_ms = now;
            }
            self.rec.state = State::Intent;
            self.rec.owner = self.shared.incarnation;
            self.rec.updated_ms = now;
            if let Err(e) = self.persist_intent(first).await {
                self.revert(before);
                return Err(e.into());
            }

            let n = self.rec.attempts;
            let call_ctx = self.ctx.for_call(Some(&self.key), n);
            let outcome = run_attempt(self.tool, body.attempt(call_ctx.clone())).await;
            let (failure, err, text) = match outcome {
                Ok(Ok(v)) => {
                    return self
                        .commit(v, Via::Call, n, call_ctx.provider_replayed())
                        .await;
                }
                Ok(Err(e)) => {
                    let text = format!("{e:?}");
                    (e.classify(), Some(e), text)
                }
                Err(elapsed) => (Failure::ambiguous(), None, elapsed),
            };
            self.rec.last_error = Some(text.clone());

            match failure {
                Failure::Semantic => {
                    self.rec.state = State::Rejected {
                        error: text.clone(),
                    };
                    self.rec.maybe_landed = false;
                    self.finish(vec![EventKind::Rejected { error: text }])
                        .await?;
                    return Err(err.map_or_else(|| timed_out(self.tool, n), ToolError::Tool));
                }
                Failure::Ambiguous { .. } if self.tool.class == Class::AtMostOnce => {
                    return Err(self
                        .escalate(format!(
                            "attempt {n} may have reached the provider ({text}); at_most_once \
                             never retries"
                        ))
                        .await);
                }
                Failure::Ambiguous { .. } => self.rec.maybe_landed = true,
                Failure::NotSent { .. } => {}
            }
            last = Last { err, text };

            let now = self.shared.clock.now_ms();
            let delay = self
                .tool
                .retry
                .delay(n, self.shared.jitter.unit(), failure.retry_after());
            let spent = self.budget_spent(now, delay);
            let verifying = self.needs_verify(failure);
            // Not synced: if this is lost in a crash, the durable INTENT is
            // the more cautious truth.
            self.rec.state = State::Waiting;
            if spent.is_none() {
                self.write_with(vec![EventKind::Retry {
                    attempt: n,
                    delay_ms: delay.as_millis() as u64,
                    failure: failure.label().into(),
                    error: last.text.clone(),
                }])?;
            } else {
                self.write()?;
            }
            if spent.is_some() && !verifying {
                return Err(self.out_of_budget(last, spent.unwrap_or_default()).await);
            }
            // Before verifying too: give the provider time to settle what
            // it may still be applying. Without a verify function there is
            // nothing to wait for: the escalation is certain.
            if !verifying || body.has_verify() {
                tokio::time::sleep(delay).await;
            }

            if verifying {
                match self.verify(body).await? {
                    Checked::Landed(v) => return self.commit(v, Via::Verify, 0, false).await,
                    Checked::NotLanded => {
                        self.rec.maybe_landed = false;
                        self.write()?;
                        if let Some(why) = spent {
                            return Err(self.out_of_budget(last, why).await);
                        }
                    }
                    Checked::Undecided(why) => {
                        return Err(self
                            .escalate(format!(
                                "attempt {n} failed ambiguously ({}) and verify could not tell: {why}",
                                last.text
                            ))
                            .await);
                    }
                }
            }
        }
    }

    fn needs_verify(&self, failure: Failure) -> bool {
        self.tool.class == Class::Journal && matches!(failure, Failure::Ambiguous { .. })
    }

    /// Why no further attempt may start `after` from `now`, if so.
    fn budget_spent(&self, now: u64, after: Duration) -> Option<String> {
        let policy = &self.tool.retry;
        let attempts = self.rec.attempts;
        if attempts == 0 {
            return None;
        }
        let elapsed = Duration::from_millis(now.saturating_sub(self.rec.first_attempt_ms)) + after;
        if attempts >= policy.max_attempts {
            return Some(format!(
                "{attempts} of {} attempts made",
                policy.max_attempts
            ));
        }
        if let Some(max) = policy.max_elapsed {
            if elapsed > max {
                return Some(format!(
                    "max_elapsed {max:?} passed since the first attempt"
                ));
            }
        }
        // A key the provider no longer remembers deduplicates nothing.
        if self.tool.class == Class::Provider
            && self.rec.maybe_landed
            && elapsed >= self.tool.dedupe_window
        {
            return Some(format!(
                "the provider's dedupe window ({:?}) has passed since the first attempt",
                self.tool.dedupe_window
            ));
        }
        None
    }

    async fn out_of_budget<E>(&mut self, last: Last<E>, why: String) -> ToolError<E> {
        if self.rec.maybe_landed {
            let detail = if last.text.is_empty() {
                self.rec.last_error.clone().unwrap_or_else(|| {
                    "none recorded (the attempt's process died or its call was dropped)".into()
                })
            } else {
                last.text.clone()
            };
            return self
                .escalate(format!(
                    "retry budget spent ({why}) with an outcome that may have landed; last error: {detail}"
                ))
                .await;
        }
        match last.err {
            Some(e) => {
                self.rec.state = State::Failed {
                    error: last.text.clone(),
                };
                if let Err(j) = self
                    .finish(vec![EventKind::Failed { error: last.text }])
                    .await
                {
                    return j.into();
                }
                ToolError::Tool(e)
            }
            // Nothing to hand back: the last attempt timed out (and verify
            // said it did not land), or the budget ran out while no process
            // drove the operation.
            None if !last.text.is_empty() => {
                self.rec.state = State::Failed {
                    error: last.text.clone(),
                };
                if let Err(j) = self
                    .finish(vec![EventKind::Failed { error: last.text }])
                    .await
                {
                    return j.into();
                }
                timed_out(self.tool, self.rec.attempts)
            }
            None => {
                self.escalate(format!(
                    "retry budget spent ({why}) before the operation could complete; nothing is \
                     known to have landed"
                ))
                .await
            }
        }
    }

    /// `verify` for an attempt nobody is driving any more. Its request may
    /// still be inside the provider (the process that sent it died a moment
    /// ago, or the call was dropped): asking now could hear "not landed"
    /// just before it lands. So wait until it would have counted as over in
    /// the call itself: its start, plus the per-attempt timeout, plus the
    /// backoff the call would have slept before verifying.
    async fn settle_then_verify<T, E, B>(&mut self, body: &mut B) -> Result<Checked<T>, Error>
    where
        T: Serialize + DeserializeOwned,
        E: Classify + Debug,
        B: Body<T, E>,
    {
        if body.has_verify() {
            let settle = self.tool.timeout.unwrap_or_default()
                + self.tool.retry.base_delay(self.rec.attempts.max(1));
            let ready_ms = self
                .rec
                .updated_ms
                .saturating_add(settle.as_millis() as u64);
            let now = self.shared.clock.now_ms();
            if ready_ms > now {
                tokio::time::sleep(Duration::from_millis(ready_ms - now)).await;
            }
        }
        self.verify(body).await
    }

    /// Asks `verify`, records its answer, and reduces it to what the engine
    /// acts on.
    async fn verify<T, E, B>(&mut self, body: &mut B) -> Result<Checked<T>, Error>
    where
        T: Serialize + DeserializeOwned,
        E: Classify + Debug,
        B: Body<T, E>,
    {
        let call_ctx = self.ctx.for_call(Some(&self.key), self.rec.attempts);
        let Some(asked) = body.verify(call_ctx) else {
            self.record_verdict("none".into())?;
            return Ok(Checked::Undecided("the tool has verify = \"none\"".into()));
        };
        let checked = match run_attempt(self.tool, asked).await {
            Ok(Ok(Verdict::Landed(v))) => {
                self.record_verdict("landed".into())?;
                Checked::Landed(v)
            }
            Ok(Ok(Verdict::NotLanded)) => {
                self.record_verdict("not_landed".into())?;
                Checked::NotLanded
            }
            Ok(Ok(Verdict::Unknown)) => {
                self.record_verdict("unknown".into())?;
                Checked::Undecided("verify answered unknown".into())
            }
            Ok(Err(e)) => {
                let text = format!("verify failed: {e:?}");
                self.record_verdict(format!("error: {e:?}"))?;
                Checked::Undecided(text)
            }
            Err(elapsed) => {
                self.record_verdict(format!("error: {elapsed}"))?;
                Checked::Undecided(format!("verify {elapsed}"))
            }
        };
        Ok(checked)
    }

    fn record_verdict(&mut self, verdict: String) -> Result<(), Error> {
        self.rec.verify_answer = Some(verdict.clone());
        self.emit(EventKind::Verified { verdict })
    }

    /// Records the result durably, then hands it back.
    async fn commit<T, E>(
        &mut self,
        value: T,
        via: Via,
        attempt: u32,
        provider_replay: bool,
    ) -> Result<T, ToolError<E>>
    where
        T: Serialize,
    {
        let result = serde_json::to_string(&value).map_err(|e| Error::Result {
            key: self.key.to_string(),
            op: "encoded",
            detail: e.to_string(),
        })?;
        self.rec.state = State::Committed { result, via };
        self.rec.maybe_landed = false;
        let mut events = Vec::with_capacity(2);
        if provider_replay {
            events.push(EventKind::ProviderReplay { attempt });
        }
        let via = match via {
            Via::Call => "call",
            Via::Verify => "verify",
            Via::Operator => "operator",
        };
        events.push(EventKind::Committed {
            attempt,
            via: via.into(),
        });
        self.finish(events).await?;
        Ok(value)
    }

    /// Parks the operation for a human, with its evidence; durable before
    /// the caller hears of it.
    async fn escalate<E>(&mut self, reason: String) -> ToolError<E> {
        let now = self.shared.clock.now_ms();
        self.rec.state = State::Escalated;
        self.rec.escalation = Some(EscalationInfo {
            reason: reason.clone(),
            at_ms: now,
        });
        let index = self
            .shared
            .journal
            .insert(Space::Escalations, self.key.digest(), &[]);
        if let Err(e) = index {
            return e.into();
        }
        match self
            .finish(vec![EventKind::Escalated {
                reason: reason.clone(),
            }])
            .await
        {
            Ok(()) => ToolError::Escalated {
                key: self.key.clone(),
                reason,
            },
            Err(e) => e.into(),
        }
    }

    /// Starts a new decision for this key: fresh budget and arguments.
    fn restart(&mut self, called: &Called, generation: u32) {
        self.rec.generation = generation;
        self.rec.attempts = 0;
        self.rec.maybe_landed = false;
        self.rec.fingerprint = called.fingerprint;
        self.rec.args.clone_from(&called.json);
        self.rec.last_error = None;
        self.rec.verify_answer = None;
        self.rec.escalation = None;
        self.key = self.key.with_generation(generation);
    }

    fn check_drift<E>(&self, called: &Called) -> Result<(), ToolError<E>> {
        if self.rec.fingerprint == called.fingerprint {
            return Ok(());
        }
        self.emit(EventKind::ArgsDrift {
            policy: self.tool.on_drift,
        })?;
        match self.tool.on_drift {
            OnDrift::Replay => Ok(()),
            OnDrift::Reject => Err(ToolError::ArgsMismatch {
                key: self.key.clone(),
            }),
        }
    }

    /// Writes the record with compare-and-swap against what we last read or
    /// wrote: a record changed behind our back stops the call.
    fn write(&mut self) -> Result<(), Error> {
        self.write_with(Vec::new())
    }

    /// [`Op::write`], with the audit events that record the change, as one
    /// unit: a crash cannot keep the state and lose its event (the stream
    /// would miss a commit) or keep the event and lose the state.
    fn write_with(&mut self, events: Vec<EventKind>) -> Result<(), Error> {
        self.rec.updated_ms = self.shared.clock.now_ms();
        let bytes = record::encode(Kind::Op, &self.rec)?;
        let drafts: Vec<Draft<'_>> = events
            .into_iter()
            .map(|kind| draft(self.ctx, self.tool.name, Some(&self.key), kind))
            .collect();
        let encoded = drafts
            .iter()
            .map(AuditLog::encode)
            .collect::<Result<Vec<_>, _>>()?;
        let outcome = self.shared.journal.compare_and_swap_with_events(
            Space::Ops,
            self.key.digest(),
            self.stored.as_deref(),
            Some(&bytes),
            &encoded,
        );
        match outcome.inspect_err(|_| self.failed_write = Some(bytes.clone()))? {
            (Cas::Swapped, seqs) => {
                self.stored = Some(bytes);
                for (seq, d) in seqs.into_iter().zip(drafts) {
                    self.shared.audit.publish(seq, d);
                }
                Ok(())
            }
            (Cas::Conflict { .. }, _) => Err(Error::Conflict {
                key: self.key.to_string(),
            }),
        }
    }

    async fn persist_intent(&mut self, first: bool) -> Result<(), Error> {
        let mut events = Vec::with_capacity(2);
        if first {
            events.push(EventKind::Intent {
                generation: self.rec.generation,
                fingerprint: hex(&self.rec.fingerprint),
            });
        }
        events.push(EventKind::Attempt {
            attempt: self.rec.attempts,
        });
        self.write_with(events)?;
        self.shared.journal.sync().await
    }

    /// Best effort, after an INTENT could not be made durable: put back what
    /// was there, so this process does not later mistake a call that never
    /// happened for one that may have landed. If this fails too, the
    /// cautious INTENT stays.
    fn revert(&mut self, before: Option<Vec<u8>>) {
        // What the journal may hold now: our last write, or the write that
        // reported failure (which may have happened anyway).
        let candidates = [self.failed_write.take(), self.stored.take()];
        for current in candidates.into_iter().flatten() {
            if Some(current.as_slice()) == before.as_deref() {
                continue;
            }
            let undone = self.shared.journal.compare_and_swap(
                Space::Ops,
                self.key.digest(),
                Some(&current),
                before.as_deref(),
            );
            if matches!(undone, Ok(Cas::Swapped)) {
                return;
            }
        }
    }

    /// Writes a terminal (or escalated) state and its events, durably.
    async fn finish(&mut self, events: Vec<EventKind>) -> Result<(), Error> {
        self.write_with(events)?;
        self.shared.journal.sync().await
    }

    fn emit(&self, kind: EventKind) -> Result<(), Error> {
        self.shared
            .audit
            .emit(
                &*self.shared.journal,
                draft(self.ctx, self.tool.name, Some(&self.key), kind),
            )
            .map(|_| ())
    }
}

/// What the engine does with `verify`'s answer.
enum Checked<T> {
    Landed(T),
    NotLanded,
    Undecided(String),
}

/// Tool name under which memoized steps appear in audit events.
fn step_tool(name: &str) -> String {
    format!("step:{name}")
}

pub(crate) async fn step<T, E, F>(ctx: &Ctx, name: &str, fut: F) -> Result<T, ToolError<E>>
where
    T: Serialize + DeserializeOwned,
    F: Future<Output = Result<T, E>>,
{
    let shared = ctx.shared();
    let journal = &*shared.journal;
    let key = KeyBuilder::new(ctx.prefix(), "idem.step")
        .field(name)
        .finish();
    let digest = key.digest();
    let tool = step_tool(name);
    let emit = |kind: EventKind| shared.audit.emit(journal, draft(ctx, &tool, None, kind));
    if let Some(bytes) = journal.get(Space::Steps, digest)? {
        let rec: StepRecord = record::decode(Kind::Step, &bytes, journal.location(), digest)?;
        let value = serde_json::from_str(&rec.value).map_err(|e| Error::Result {
            key: step_tool(name),
            op: "decoded",
            detail: e.to_string(),
        })?;
        emit(EventKind::StepReplayed)?;
        return Ok(value);
    }
    let value = fut.await.map_err(ToolError::Tool)?;
    let rec = StepRecord {
        name: name.to_string(),
        root_run: ctx.root_run().to_string(),
        value: serde_json::to_string(&value).map_err(|e| Error::Result {
            key: step_tool(name),
            op: "encoded",
            detail: e.to_string(),
        })?,
        at_ms: shared.clock.now_ms(),
    };
    journal.insert(Space::Steps, digest, &record::encode(Kind::Step, &rec)?)?;
    emit(EventKind::StepRecorded)?;
    journal.sync().await?;
    Ok(value)
}
