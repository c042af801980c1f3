//! The engine: the state machine of one journaled call, in one place.
//!
//! The decision tables are public documentation (see the `behaviour`
//! section of the crate docs); this module implements them. A call first
//! becomes its key's leader in this process ([`Local`]) or waits for the
//! leader; the leader loads the record and decides:
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
//! Read-only tools skip all of it: no key, no journal, plain retries.
//!
//! Ownership: every write is conditional on the version last seen, and the
//! first write of a drive *takes* the claim (a new epoch). So of two
//! drivers that both found a dead claim, one wins and the other re-decides
//! from the winner's record; a driver whose claim was taken over (a worker
//! paused past its lease) has every later write refused, and re-decides
//! too: it never returns a wrong answer, and the provider never sees more
//! than the class allows.
//!
//! Durability: the INTENT of every attempt (with its attempt count) is
//! durable before the provider is called, and every terminal state before
//! the caller sees it ([`Durability::Immediate`]). Writes that decide
//! nothing a crash could contradict are [`Durability::Eventual`]: moving to
//! `Waiting` after a failure (if it is lost, the durable `Intent` is the
//! more cautious truth), taking over a dead claim (the next INTENT is
//! immediate), and audit events that record no decision (dedupe hits,
//! retries, verify verdicts, drift): they become durable within the
//! journal's bound.

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::class::ToolDescriptor;
use crate::ctx::Ctx;
use crate::error::ToolError;
use crate::failure::{Classify, Failure, Verdict};
use crate::journal::{
    Claim, ClaimChange, Claimed, Durability, Expect, Held, Journal, Loaded, NewEvent, Space, Write,
    Written,
};
use crate::key::{Args, KeyBuilder};
use crate::leaders::{Entry, Local, Slot};
use crate::runtime::Shared;
use idem_journal::audit::{self as stored, Draft, EventKind};
use idem_journal::class::{Class, OnDrift};
use idem_journal::codec;
use idem_journal::error::Error;
use idem_journal::key::{hex, IdemKey};
use idem_journal::record::{
    self, Blob, EscalationInfo, Kind, OpRecord, State, StepRecord, StepState, Via,
};

/// The largest arguments (canonical JSON) a call may record. Checked before
/// the INTENT: a call over it fails without calling the provider.
pub const MAX_ARGS_BYTES: usize = 16 << 20;

/// How the engine treats a tool's error type beyond [`Classify`]: how to
/// show it to people, and whether concurrent duplicates of a call can be
/// handed the leader's error. `#[tool]` fills these in from what the type
/// implements.
pub struct ErrorHooks<E> {
    /// The error as operators and models read it (its `Display` when it
    /// has one).
    pub describe: fn(&E) -> String,
    /// Packs a copy of the error for the calls that waited on this one.
    pub share: Option<fn(&E) -> crate::leaders::LeaderOutcome>,
    /// Unpacks what a leader shared.
    pub unshare: Option<fn(&crate::leaders::LeaderOutcome) -> Option<E>>,
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
    let called = Called::from(&args);
    if called.json.len() > MAX_ARGS_BYTES {
        return Err(ToolError::Journal(Error::TooLarge {
            what: "the call's recorded arguments",
            size: called.json.len() as u64,
            limit: MAX_ARGS_BYTES as u64,
        }));
    }
    let mut body = Fns { attempt, verify };
    let shared = ctx.shared();
    shared.saw(tool, hooks.check_landed);
    let local: &Local = &shared.local;
    let digest = *key.digest();
    // A result this runtime has seen committed is final: replay it
    // without reading the journal. (Other arguments take the journal's
    // path, which records the drift and applies the tool's policy.)
    if let Some(hit) = shared.replays.get(&digest, tool.name, tool.class) {
        if hit.fingerprint == called.fingerprint {
            if let Ok(value) = codec::decode(&hit.result) {
                let key = key.with_generation(hit.generation);
                shared
                    .audit
                    .emit(
                        &*shared.journal,
                        draft(ctx, tool.name, Some(&key), EventKind::DedupeHit),
                        Durability::Eventual,
                    )
                    .await?;
                return Ok(value);
            }
        }
    }
    let deadline = tokio::time::Instant::now() + shared.in_flight_wait;
    let mut waited = false;
    // Only the first pass may skip the read; after a conflict, read.
    let mut claim_first = shared.journal.claim_first();
    // The record a refused claim found, for the next pass.
    let mut found: Option<Loaded> = None;
    loop {
        let slot = match local.enter(&digest) {
            Entry::Leader(slot) => slot,
            Entry::Busy(mut rx) => {
                // Wakes when the leader's slot goes: it finished, or its
                // future was dropped.
                waited = true;
                // What a claim found is older than what that call did.
                found = None;
                if tokio::time::timeout_at(deadline, rx.changed())
                    .await
                    .is_err()
                {
                    return refuse_in_flight(ctx, tool, &key, &called).await;
                }
                let left = rx.borrow().clone();
                if let (Some(left), Some(unshare)) = (left, hooks.unshare) {
                    if let Some(e) = unshare(&left) {
                        return Err(ToolError::Tool(e));
                    }
                }
                continue;
            }
        };
        let unread = std::mem::take(&mut claim_first);
        let mut op = Op::blank(ctx, tool, &key, &called, &slot);
        match found.take() {
            Some(loaded) => op.take_in(Some(loaded))?,
            None if unread => op.unread = true,
            None => op.read().await?,
        }
        match op.drive(&called, &mut body, &hooks, waited).await {
            Ok(v) => return Ok(v),
            Err(Halt::Tool(e)) => return Err(e),
            Err(Halt::Conflict) if unread && op.version.is_none() => match op.found.take() {
                // Claimed without reading, and the record exists: nothing
                // was written and nothing waited; decide from it.
                Some(loaded) => found = Some(loaded),
                // The claim lost to a call that created the record after
                // the claim looked: a concurrent duplicate, as when a
                // record appears between a read and the first write.
                None => waited = true,
            },
            Err(Halt::Conflict) => {
                // The record changed under us (another driver took it): re-
                // decide from what it is now, as a call that waited would.
                waited = true;
            }
            Err(Halt::Elsewhere(version)) => {
                drop(slot);
                waited = true;
                tracing::debug!(target: "idem::engine", key = %key, "waiting for a call driven by another worker");
                let wait = shared.journal.changed(Space::Ops, &digest, version);
                if tokio::time::timeout_at(deadline, wait).await.is_err() {
                    return refuse_in_flight(ctx, tool, &key, &called).await;
                }
            }
        }
    }
}

async fn refuse_in_flight<T, E>(
    ctx: &Ctx,
    tool: &'static ToolDescriptor,
    key: &IdemKey,
    _called: &Called,
) -> Result<T, ToolError<E>> {
    let shared = ctx.shared();
    shared
        .audit
        .emit(
            &*shared.journal,
            draft(
                ctx,
                tool.name,
                Some(key),
                EventKind::Refused {
                    reason: "in flight in another call".into(),
                },
            ),
            Durability::Eventual,
        )
        .await?;
    Err(ToolError::InFlight { key: key.clone() })
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
        if !tool
            .retry
            .allows(attempts, started.elapsed().saturating_add(delay))
        {
            return Err(err.map_or_else(|| timed_out(tool, attempts), ToolError::Tool));
        }
        shared
            .audit
            .emit(
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
                Durability::Eventual,
            )
            .await?;
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
    run_attempt_from(tool, tokio::time::Instant::now(), fut).await
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
) -> Result<R, String> {
    let Some(limit) = tool.timeout else {
        return Ok(fut.await);
    };
    let deadline = began + limit;
    let timer = tokio::time::sleep_until(deadline);
    let mut fut = std::pin::pin!(fut);
    let mut timer = std::pin::pin!(timer);
    std::future::poll_fn(|cx| {
        if tokio::time::Instant::now() >= deadline {
            return std::task::Poll::Ready(Err(()));
        }
        if let std::task::Poll::Ready(v) = fut.as_mut().poll(cx) {
            return std::task::Poll::Ready(Ok(v));
        }
        timer.as_mut().poll(cx).map(Err)
    })
    .await
    .map_err(|()| format!("attempt timed out after {limit:?}"))
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

/// Why a drive stopped without a result.
enum Halt<E> {
    /// The call's answer.
    Tool(ToolError<E>),
    /// A write was refused because the record changed: re-decide.
    Conflict,
    /// A live driver elsewhere holds the record (at this version): wait.
    Elsewhere(u64),
}

impl<E> From<Error> for Halt<E> {
    fn from(e: Error) -> Self {
        Halt::Tool(ToolError::Journal(e))
    }
}

impl<E> From<ToolError<E>> for Halt<E> {
    fn from(e: ToolError<E>) -> Self {
        Halt::Tool(e)
    }
}

/// One operation being driven: its record as last written, and where the
/// journal has it.
struct Op<'a> {
    ctx: &'a Ctx,
    shared: &'a Shared,
    tool: &'static ToolDescriptor,
    slot: &'a Slot<'a>,
    /// The key of the current generation.
    key: IdemKey,
    rec: OpRecord,
    /// The version the journal holds (`None`: no record yet).
    version: Option<u64>,
    /// The claim as loaded.
    claim: Option<Claim>,
    /// Whether this drive holds the claim (took it, not yet released), and
    /// under which epoch.
    held: Option<u64>,
    /// When the record was last written before this drive found it (the
    /// dead driver's last sign of life).
    found_ms: u64,
    /// The bytes of the record before the last write, and of that write
    /// (for [`Op::revert`]).
    previous: Option<Vec<u8>>,
    tried: Option<Vec<u8>>,
    /// Driven without reading the journal first: the first write is a
    /// [`Journal::claim`], and what it found when the record exists.
    unread: bool,
    found: Option<Loaded>,
}

impl<'a> Op<'a> {
    /// The operation as if the journal had no record of it, until
    /// [`read`](Op::read) or [`take_in`](Op::take_in) says otherwise; a
    /// call on a journal that claims first ([`Journal::claim_first`])
    /// drives it as is: its first write expects the record to be absent,
    /// so a record that exists turns it into [`Halt::Conflict`] with
    /// nothing written.
    fn blank(
        ctx: &'a Ctx,
        tool: &'static ToolDescriptor,
        key: &IdemKey,
        called: &Called,
        slot: &'a Slot<'a>,
    ) -> Op<'a> {
        let shared = ctx.shared();
        let now = shared.clock.now_ms();
        Op {
            ctx,
            shared,
            tool,
            slot,
            key: key.clone(),
            rec: OpRecord {
                tool: tool.name.to_string(),
                class: tool.class,
                root_run: ctx.root_run().to_string(),
                scope: ctx.scope_path().map(str::to_string).collect(),
                generation: 0,
                state: State::Intent,
                attempts: 0,
                first_attempt_ms: now,
                key_first_sent_ms: None,
                updated_ms: now,
                maybe_landed: false,
                fingerprint: called.fingerprint,
                args: called.json.clone(),
                last_error: None,
                verify_answer: None,
                escalation: None,
                resolution: None,
            },
            version: None,
            claim: None,
            held: None,
            found_ms: now,
            previous: None,
            tried: None,
            unread: false,
            found: None,
        }
    }

    /// Takes in the journal's record of the operation, if it has one.
    async fn read(&mut self) -> Result<(), Error> {
        let loaded = self
            .shared
            .journal
            .load(Space::Ops, self.key.digest())
            .await?;
        self.take_in(loaded)
    }

    /// Takes in what the journal returned for the operation. A record that
    /// cannot be decoded is an error, never "absent"; a record of another
    /// tool or class is an error, never a replay.
    fn take_in(&mut self, loaded: Option<Loaded>) -> Result<(), Error> {
        let journal = &*self.shared.journal;
        let digest = self.key.digest();
        if let Some(loaded) = loaded {
            let rec: OpRecord = record::decode(Kind::Op, &loaded.body, journal.location(), digest)?;
            if rec.tool != self.tool.name || rec.class != self.tool.class {
                return Err(Error::ToolMismatch {
                    key: self.key.clone(),
                    stored_tool: rec.tool,
                    stored_class: rec.class,
                    tool: self.tool.name.to_string(),
                    class: self.tool.class,
                });
            }
            if rec.generation != self.key.generation() {
                self.key = self.key.with_generation(rec.generation);
            }
            self.found_ms = rec.updated_ms;
            self.rec = rec;
            self.version = Some(loaded.version);
            self.previous = Some(loaded.body);
            self.claim = loaded.claim;
        }
        Ok(())
    }

    /// Whether the record's claim belongs to a driver that may be running
    /// outside this process. Our own claims are never: we lead the key
    /// here, so whoever took it in this process is gone (its call was
    /// dropped); an earlier incarnation of our worker is gone too.
    fn driven_elsewhere(&self) -> bool {
        let me = &self.shared.owner;
        self.claim.as_ref().is_some_and(|c| {
            c.live && c.owner != *me && !me.is_other_incarnation_of_same_worker(&c.owner)
        })
    }

    /// The decision table for a call that found this record.
    async fn drive<T, E, B>(
        &mut self,
        called: &Called,
        body: &mut B,
        hooks: &ErrorHooks<E>,
        waited: bool,
    ) -> Result<T, Halt<E>>
    where
        T: Serialize + DeserializeOwned,
        E: Classify + Debug,
        B: Body<T, E>,
    {
        if self.version.is_none() {
            return self.run(body, hooks).await;
        }
        match &self.rec.state {
            State::Committed { result, via } => {
                self.check_drift(called).await?;
                let value = codec::decode(&result.0).map_err(|detail| Error::Result {
                    key: self.key.to_string(),
                    op: "decoded",
                    detail,
                })?;
                if *via != Via::Operator {
                    self.remember(&result.0);
                }
                self.emit(EventKind::DedupeHit).await?;
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
                })
                .await?;
                Err(Halt::Tool(ToolError::Escalated {
                    key: self.key.clone(),
                    reason,
                }))
            }
            State::Abandoned => {
                self.emit(EventKind::Refused {
                    reason: "abandoned".into(),
                })
                .await?;
                Err(Halt::Tool(ToolError::Abandoned {
                    key: self.key.clone(),
                }))
            }
            // A call that waited for a concurrent duplicate shares its
            // decision: the same operation, decided once.
            State::Rejected { error } | State::Failed { error } if waited => {
                let (key, error) = (self.key.clone(), error.clone());
                let refused = matches!(self.rec.state, State::Rejected { .. });
                let (reason, shared) = if refused {
                    ("refusal", Error::Rejected { key, error })
                } else {
                    let attempts = self.rec.attempts;
                    (
                        "failure",
                        Error::Failed {
                            key,
                            attempts,
                            error,
                        },
                    )
                };
                self.emit(EventKind::Refused {
                    reason: format!("shares the {reason} of the concurrent call it waited for"),
                })
                .await?;
                Err(Halt::Tool(ToolError::Journal(shared)))
            }
            State::Rejected { .. } => {
                // The provider said no; a new call is a new decision, under
                // a key the provider has not cached a refusal for.
                let generation = self.rec.generation + 1;
                self.restart(called, generation);
                self.run(body, hooks).await
            }
            State::Failed { .. } | State::Reissue => {
                self.restart(called, self.rec.generation);
                self.run(body, hooks).await
            }
            State::Intent | State::Waiting => {
                if self.driven_elsewhere() {
                    return Err(Halt::Elsewhere(self.version.unwrap_or_default()));
                }
                self.check_drift(called).await?;
                // Nobody drives it: its owner died, dropped the call, or was
                // fenced off. Take it over before deciding anything, so that
                // of two workers that found it so, one goes on.
                let found = self.rec.state.name().to_string();
                let maybe = self.rec.state == State::Intent || self.rec.maybe_landed;
                self.rec.maybe_landed = maybe;
                let attempts = self.rec.attempts;
                self.put(
                    vec![EventKind::Recovered {
                        state: found,
                        attempts,
                    }],
                    Durability::Eventual,
                    false,
                )
                .await?;
                if maybe {
                    self.recover(body, hooks).await
                } else {
                    self.run(body, hooks).await
                }
            }
        }
    }

    /// An operation whose last attempt may have landed, found with nobody
    /// driving it (and now claimed by this drive).
    async fn recover<T, E, B>(&mut self, body: &mut B, hooks: &ErrorHooks<E>) -> Result<T, Halt<E>>
    where
        T: Serialize + DeserializeOwned,
        E: Classify + Debug,
        B: Body<T, E>,
    {
        match self.tool.class {
            // The provider deduplicates on the same key: re-running is safe
            // while it still remembers the key; `run` checks the window and
            // the budget and escalates once either is spent.
            Class::Provider | Class::ReadOnly => self.run(body, hooks).await,
            Class::Journal => match self.settle_then_verify(body, hooks).await? {
                Checked::Landed(v) => self.commit(v, Via::Verify, 0, false).await,
                Checked::NotLanded => {
                    self.rec.maybe_landed = false;
                    self.run(body, hooks).await
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
    async fn run<T, E, B>(&mut self, body: &mut B, hooks: &ErrorHooks<E>) -> Result<T, Halt<E>>
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
                return Err(self.out_of_budget(last, why, hooks).await);
            }

            // INTENT: on disk before the provider hears of it.
            let first = self.rec.attempts == 0;
            self.rec.attempts += 1;
            if first {
                self.rec.first_attempt_ms = now;
            }
            self.rec.key_first_sent_ms.get_or_insert(now);
            self.rec.state = State::Intent;
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
            let before = (self.held, self.previous.take());
            let began = tokio::time::Instant::now();
            if let Err(halt) = self.put(events, Durability::Immediate, false).await {
                if let Halt::Tool(ToolError::Journal(_)) = &halt {
                    self.revert(before).await;
                }
                return Err(halt);
            }
            if let Some(every) = self.shared.journal.renewal() {
                // The claim is a lease of three renewal periods from the
                // write. A process paused since before it (or a write that
                // took that long) may have been taken over: sending now
                // could duplicate what the new owner does. Re-decide from
                // the record instead; nothing was sent.
                if began.elapsed() >= every * 2 {
                    return Err(Halt::Conflict);
                }
            }

            let n = self.rec.attempts;
            let call_ctx = self.ctx.for_call(Some(&self.key), n);
            let outcome = run_attempt_from(self.tool, began, body.attempt(call_ctx.clone())).await;
            let (failure, err, text) = match outcome {
                Ok(Ok(v)) => {
                    return self
                        .commit(v, Via::Call, n, call_ctx.provider_replayed())
                        .await;
                }
                Ok(Err(e)) => {
                    let text = (hooks.describe)(&e);
                    (e.classify(), Some(e), text)
                }
                Err(elapsed) => (Failure::ambiguous(), None, elapsed),
            };
            self.rec.last_error = Some(text.clone());

            match failure {
                Failure::Semantic if self.rec.maybe_landed => {
                    // A refusal now does not say an earlier attempt did not
                    // land: settle that before anything licenses a new
                    // decision under a fresh key.
                    return self.refused_after_doubt(body, hooks, n, text, err).await;
                }
                Failure::Semantic => {
                    return Err(self.reject(text, err, hooks).await);
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
            self.rec.state = State::Waiting;
            let events = if spent.is_none() {
                vec![EventKind::Retry {
                    attempt: n,
                    delay_ms: delay.as_millis() as u64,
                    failure: failure.label().into(),
                    error: last.text.clone(),
                }]
            } else {
                Vec::new()
            };
            // Eventual: if this is lost in a crash, the durable INTENT is the
            // more cautious truth.
            self.put(events, Durability::Eventual, false).await?;
            if spent.is_some() && !verifying {
                return Err(self
                    .out_of_budget(last, spent.unwrap_or_default(), hooks)
                    .await);
            }
            // Before verifying too: give the provider time to settle what
            // it may still be applying. Without a verify function there is
            // nothing to wait for: the escalation is certain.
            if !verifying || body.has_verify() {
                tokio::time::sleep(delay).await;
            }

            if verifying {
                match self.verify(body, hooks).await? {
                    Checked::Landed(v) => return self.commit(v, Via::Verify, 0, false).await,
                    Checked::NotLanded => {
                        self.rec.maybe_landed = false;
                        self.put(Vec::new(), Durability::Eventual, false).await?;
                        if let Some(why) = spent {
                            return Err(self.out_of_budget(last, why, hooks).await);
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

    /// A semantic refusal after an attempt that may have landed.
    async fn refused_after_doubt<T, E, B>(
        &mut self,
        body: &mut B,
        hooks: &ErrorHooks<E>,
        n: u32,
        text: String,
        err: Option<E>,
    ) -> Result<T, Halt<E>>
    where
        T: Serialize + DeserializeOwned,
        E: Classify + Debug,
        B: Body<T, E>,
    {
        if self.tool.class == Class::Journal {
            match self.verify(body, hooks).await? {
                Checked::Landed(v) => return self.commit(v, Via::Verify, 0, false).await,
                Checked::NotLanded => {
                    self.rec.maybe_landed = false;
                    return Err(self.reject(text, err, hooks).await);
                }
                Checked::Undecided(why) => {
                    return Err(self
                        .escalate(format!(
                            "attempt {n} was refused ({text}) after an earlier attempt that may \
                             have landed, and verify could not tell: {why}"
                        ))
                        .await)
                }
            }
        }
        Err(self
            .escalate(format!(
                "attempt {n} was refused ({text}) after an earlier attempt that may have landed; \
                 nothing can tell whether that one did"
            ))
            .await)
    }

    /// Records a semantic refusal and returns it.
    async fn reject<E>(&mut self, text: String, err: Option<E>, hooks: &ErrorHooks<E>) -> Halt<E> {
        self.rec.state = State::Rejected {
            error: text.clone(),
        };
        self.rec.maybe_landed = false;
        if let Err(h) = self
            .put(
                vec![EventKind::Rejected { error: text }],
                Durability::Immediate,
                true,
            )
            .await
        {
            return h;
        }
        Halt::Tool(match err {
            Some(e) => {
                if let Some(share) = hooks.share {
                    self.slot.share(share(&e));
                }
                ToolError::Tool(e)
            }
            None => timed_out(self.tool, self.rec.attempts),
        })
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
        let since = |t: u64| Duration::from_millis(now.saturating_sub(t)).saturating_add(after);
        if attempts >= policy.max_attempts {
            return Some(format!(
                "{attempts} of {} attempts made",
                policy.max_attempts
            ));
        }
        if let Some(max) = policy.max_elapsed {
            if since(self.rec.first_attempt_ms) > max {
                return Some(format!(
                    "max_elapsed {max:?} passed since the first attempt"
                ));
            }
        }
        // A key the provider no longer remembers deduplicates nothing. Its
        // memory starts with the key's first use, reissues included.
        let key_age = since(
            self.rec
                .key_first_sent_ms
                .unwrap_or(self.rec.first_attempt_ms),
        );
        if self.tool.class == Class::Provider
            && self.rec.maybe_landed
            && key_age >= self.tool.dedupe_window
        {
            return Some(format!(
                "the provider's dedupe window ({:?}) has passed since the key was first sent",
                self.tool.dedupe_window
            ));
        }
        None
    }

    async fn out_of_budget<E>(
        &mut self,
        last: Last<E>,
        why: String,
        hooks: &ErrorHooks<E>,
    ) -> Halt<E> {
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
        // Nothing landed: the operation failed. Its last error is the
        // tool's own if this call made the attempt, else known as text.
        let text = if last.text.is_empty() {
            self.rec
                .last_error
                .clone()
                .unwrap_or_else(|| format!("retry budget spent ({why})"))
        } else {
            last.text.clone()
        };
        self.rec.state = State::Failed {
            error: text.clone(),
        };
        if let Err(h) = self
            .put(
                vec![EventKind::Failed {
                    error: text.clone(),
                }],
                Durability::Immediate,
                true,
            )
            .await
        {
            return h;
        }
        Halt::Tool(match last.err {
            Some(e) => {
                if let Some(share) = hooks.share {
                    self.slot.share(share(&e));
                }
                ToolError::Tool(e)
            }
            // The last attempt timed out (and verify said it did not land).
            None if !last.text.is_empty() => timed_out(self.tool, self.rec.attempts),
            // The attempts were made by an earlier process or call.
            None => ToolError::Journal(Error::Failed {
                key: self.key.clone(),
                attempts: self.rec.attempts,
                error: text,
            }),
        })
    }

    /// `verify` for an attempt nobody is driving any more. Its request may
    /// still be inside the provider (the process that sent it died a moment
    /// ago, or the call was dropped): asking now could hear "not landed"
    /// just before it lands. So wait until it would have counted as over in
    /// the call itself: its start, plus the per-attempt timeout, plus the
    /// backoff the call would have slept before verifying.
    async fn settle_then_verify<T, E, B>(
        &mut self,
        body: &mut B,
        hooks: &ErrorHooks<E>,
    ) -> Result<Checked<T>, Halt<E>>
    where
        T: Serialize + DeserializeOwned,
        E: Classify + Debug,
        B: Body<T, E>,
    {
        if body.has_verify() {
            let settle = self
                .tool
                .timeout
                .unwrap_or_default()
                .saturating_add(self.tool.retry.base_delay(self.rec.attempts.max(1)));
            let ready_ms = self.found_ms.saturating_add(settle.as_millis() as u64);
            let now = self.shared.clock.now_ms();
            if ready_ms > now {
                let wait_ms = ready_ms - now;
                self.emit(EventKind::Settling { wait_ms }).await?;
                tokio::time::sleep(Duration::from_millis(wait_ms)).await;
            }
        }
        self.verify(body, hooks).await
    }

    /// Asks `verify`, records its answer, and reduces it to what the engine
    /// acts on.
    async fn verify<T, E, B>(
        &mut self,
        body: &mut B,
        hooks: &ErrorHooks<E>,
    ) -> Result<Checked<T>, Halt<E>>
    where
        T: Serialize + DeserializeOwned,
        E: Classify + Debug,
        B: Body<T, E>,
    {
        let call_ctx = self.ctx.for_call(Some(&self.key), self.rec.attempts);
        let Some(asked) = body.verify(call_ctx) else {
            self.record_verdict("none".into()).await?;
            return Ok(Checked::Undecided("the tool has verify = \"none\"".into()));
        };
        let checked = match run_attempt(self.tool, asked).await {
            Ok(Ok(Verdict::Landed(v))) => {
                self.record_verdict("landed".into()).await?;
                Checked::Landed(v)
            }
            Ok(Ok(Verdict::NotLanded)) => {
                self.record_verdict("not_landed".into()).await?;
                Checked::NotLanded
            }
            Ok(Ok(Verdict::Unknown)) => {
                self.record_verdict("unknown".into()).await?;
                Checked::Undecided("verify answered unknown".into())
            }
            Ok(Err(e)) => {
                let text = (hooks.describe)(&e);
                self.record_verdict(format!("error: {text}")).await?;
                Checked::Undecided(format!("verify failed: {text}"))
            }
            Err(elapsed) => {
                self.record_verdict(format!("error: {elapsed}")).await?;
                Checked::Undecided(format!("verify {elapsed}"))
            }
        };
        Ok(checked)
    }

    async fn record_verdict<E>(&mut self, verdict: String) -> Result<(), Halt<E>> {
        self.rec.verify_answer = Some(verdict.clone());
        self.emit(EventKind::Verified { verdict }).await?;
        Ok(())
    }

    /// Records the result durably, then hands it back.
    async fn commit<T, E>(
        &mut self,
        value: T,
        via: Via,
        attempt: u32,
        provider_replay: bool,
    ) -> Result<T, Halt<E>>
    where
        T: Serialize,
    {
        let result = match codec::encode(&value) {
            Ok(r) if r.len() + self.rec.args.len() < record::LARGE_LIMIT - (1 << 20) => r,
            Ok(r) => {
                return Err(self
                    .escalate(format!(
                        "the call succeeded, but its result ({} bytes) is larger than the journal \
                         stores ({} bytes); it cannot be replayed, so a human must settle it",
                        r.len(),
                        record::LARGE_LIMIT
                    ))
                    .await)
            }
            Err(e) => {
                return Err(self
                    .escalate(format!(
                        "the call succeeded, but its result could not be stored ({e}); it cannot \
                         be replayed, so a human must settle it"
                    ))
                    .await)
            }
        };
        self.rec.state = State::Committed {
            result: Blob(result),
            via,
        };
        self.rec.maybe_landed = false;
        let mut events = Vec::with_capacity(2);
        if provider_replay {
            events.push(EventKind::ProviderReplay { attempt });
        }
        events.push(EventKind::Committed {
            attempt,
            via: via.label().into(),
        });
        match self.put(events, Durability::Immediate, true).await {
            Ok(()) => {
                if let (State::Committed { result, .. }, false) =
                    (&self.rec.state, via == Via::Operator)
                {
                    let bytes = result.0.clone();
                    self.remember(&bytes);
                }
                Ok(value)
            }
            Err(Halt::Conflict) => {
                // We were fenced off after the effect landed: say so, and let
                // the call re-decide from the record the new owner wrote.
                self.fenced(attempt, "landed").await;
                Err(Halt::Conflict)
            }
            Err(h) => Err(h),
        }
    }

    /// Keeps a final result (committed by a call or learned by verify) for
    /// replays without a journal read.
    fn remember(&self, result: &[u8]) {
        self.shared.replays.put(
            *self.key.digest(),
            crate::replays::Replay {
                tool: self.tool.name,
                class: self.tool.class,
                generation: self.rec.generation,
                fingerprint: self.rec.fingerprint,
                result: std::sync::Arc::from(result),
            },
        );
    }

    /// Records that a write of this (stale) drive was refused.
    async fn fenced(&self, attempt: u32, outcome: &str) {
        let _ = self
            .emit(EventKind::Fenced {
                attempt,
                outcome: outcome.into(),
            })
            .await;
    }

    /// Parks the operation for a human, with its evidence; durable before
    /// the caller hears of it.
    async fn escalate<E>(&mut self, reason: String) -> Halt<E> {
        let now = self.shared.clock.now_ms();
        self.rec.state = State::Escalated;
        self.rec.escalation = Some(EscalationInfo {
            reason: reason.clone(),
            at_ms: now,
        });
        match self
            .put(
                vec![EventKind::Escalated {
                    reason: reason.clone(),
                }],
                Durability::Immediate,
                true,
            )
            .await
        {
            Ok(()) => Halt::Tool(ToolError::Escalated {
                key: self.key.clone(),
                reason,
            }),
            Err(h) => h,
        }
    }

    /// Starts a new decision for this key: fresh budget and arguments. A
    /// new generation also starts the key's dedupe window afresh.
    fn restart(&mut self, called: &Called, generation: u32) {
        if generation != self.rec.generation {
            self.rec.key_first_sent_ms = None;
        }
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

    async fn check_drift<E>(&self, called: &Called) -> Result<(), Halt<E>> {
        if self.rec.fingerprint == called.fingerprint {
            return Ok(());
        }
        self.emit(EventKind::ArgsDrift {
            policy: self.tool.on_drift,
        })
        .await?;
        match self.tool.on_drift {
            OnDrift::Replay => Ok(()),
            OnDrift::Reject => Err(Halt::Tool(ToolError::ArgsMismatch {
                key: self.key.clone(),
            })),
        }
    }

    /// Writes the record, with the audit events that record the change, as
    /// one unit: a crash cannot keep the state and lose its event (the
    /// stream would miss a commit) or keep the event and lose the state.
    /// The first write of a drive takes the claim; `release` gives it up
    /// (a terminal state). A refused condition is [`Halt::Conflict`].
    async fn put<E>(
        &mut self,
        events: Vec<EventKind>,
        durability: Durability,
        release: bool,
    ) -> Result<(), Halt<E>> {
        self.rec.updated_ms = self.shared.clock.now_ms();
        let bytes = record::encode(Kind::Op, &self.rec)?;
        self.tried = Some(bytes.clone());
        let drafts: Vec<Draft<'_>> = events
            .into_iter()
            .map(|kind| draft(self.ctx, self.tool.name, Some(&self.key), kind))
            .collect();
        let encoded = drafts
            .iter()
            .map(stored::encode)
            .collect::<Result<Vec<_>, _>>()?;
        let digest = self.key.digest();
        let new_events: Vec<NewEvent<'_>> = encoded
            .iter()
            .map(|b| NewEvent {
                key: Some(digest),
                bytes: b,
            })
            .collect();
        let owner = &self.shared.owner;
        let claim = match (release, self.held.is_some()) {
            (true, _) => ClaimChange::Release,
            (false, true) => ClaimChange::Keep,
            (false, false) => ClaimChange::Take(owner),
        };
        let write = Write {
            space: Space::Ops,
            key: digest,
            expect: self.version.map_or(Expect::Absent, Expect::Version),
            body: &bytes,
            claim,
            escalated: self.rec.state == State::Escalated,
            events: &new_events,
            durability,
        };
        let written = if std::mem::take(&mut self.unread) {
            match self.shared.journal.claim(write).await? {
                Claimed::Done {
                    version,
                    epoch,
                    seqs,
                } => Written::Done {
                    version,
                    epoch,
                    seqs,
                },
                Claimed::Exists(found) => {
                    self.found = found;
                    Written::Conflict
                }
            }
        } else {
            self.shared.journal.write(write).await?
        };
        match written {
            Written::Done {
                version,
                epoch,
                seqs,
            } => {
                self.version = Some(version);
                self.previous = self.tried.take();
                self.held = (!release).then_some(epoch);
                self.slot.hold(self.held.map(|epoch| Held {
                    space: Space::Ops,
                    key: *digest,
                    epoch,
                }));
                for (seq, d) in seqs.into_iter().zip(drafts) {
                    self.shared.audit.publish(seq, d);
                }
                Ok(())
            }
            Written::Conflict => Err(Halt::Conflict),
        }
    }

    /// Best effort, after an INTENT could not be made durable: put back what
    /// was there, so this process does not later mistake a call that never
    /// happened for one that may have landed. The failed write may have
    /// happened all the same (an I/O error after the change), so it is
    /// undone only if the journal holds exactly it. If this fails too, the
    /// cautious INTENT stays.
    async fn revert(&mut self, before: (Option<u64>, Option<Vec<u8>>)) {
        let (held, body) = before;
        let journal = &*self.shared.journal;
        let digest = self.key.digest();
        let Ok(Some(now)) = journal.load(Space::Ops, digest).await else {
            return;
        };
        if Some(&now.body) != self.tried.as_ref() {
            return;
        }
        let undone = match body {
            None => journal
                .remove(Space::Ops, digest, now.version)
                .await
                .unwrap_or(false),
            Some(body) => matches!(
                journal
                    .write(Write {
                        space: Space::Ops,
                        key: digest,
                        expect: Expect::Version(now.version),
                        body: &body,
                        claim: if held.is_some() {
                            ClaimChange::Keep
                        } else {
                            ClaimChange::Release
                        },
                        escalated: false,
                        events: &[],
                        durability: Durability::Immediate,
                    })
                    .await,
                Ok(Written::Done { .. })
            ),
        };
        if undone {
            // Whatever follows re-reads the record.
            self.version = None;
        }
    }

    async fn emit(&self, kind: EventKind) -> Result<u64, Error> {
        self.shared
            .audit
            .emit(
                &*self.shared.journal,
                draft(self.ctx, self.tool.name, Some(&self.key), kind),
                Durability::Eventual,
            )
            .await
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

/// A memoized step: run once per run and scope; concurrent calls of the
/// same step (in this process or another) wait for the one running and
/// share its value.
pub(crate) async fn step<T, E, F>(ctx: &Ctx, name: &str, fut: F) -> Result<T, ToolError<E>>
where
    T: Serialize + DeserializeOwned,
    F: Future<Output = Result<T, E>>,
{
    let shared = ctx.shared();
    let journal: &dyn Journal = &*shared.journal;
    let key = KeyBuilder::new(ctx.prefix(), "idem.step")
        .field(name)
        .finish();
    let digest = *key.digest();
    let tool = step_tool(name);
    let decode_err = |detail: String| Error::Result {
        key: step_tool(name),
        op: "decoded",
        detail,
    };
    let deadline = tokio::time::Instant::now() + shared.in_flight_wait;
    let mut fut = Some(fut);
    loop {
        let slot = match shared.local.enter(&digest) {
            Entry::Leader(slot) => slot,
            Entry::Busy(mut rx) => {
                if tokio::time::timeout_at(deadline, rx.changed())
                    .await
                    .is_err()
                {
                    return Err(ToolError::InFlight { key });
                }
                continue;
            }
        };
        let loaded = journal.load(Space::Steps, &digest).await?;
        let mut expect = Expect::Absent;
        if let Some(l) = &loaded {
            let rec: StepRecord = record::decode(Kind::Step, &l.body, journal.location(), &digest)?;
            match rec.state {
                StepState::Done { value } => {
                    let value = codec::decode(&value.0).map_err(decode_err)?;
                    shared
                        .audit
                        .emit(
                            journal,
                            draft(ctx, &tool, None, EventKind::StepReplayed),
                            Durability::Eventual,
                        )
                        .await?;
                    return Ok(value);
                }
                StepState::Running => {
                    let me = &shared.owner;
                    let elsewhere = l.claim.as_ref().is_some_and(|c| {
                        c.live
                            && c.owner != *me
                            && !me.is_other_incarnation_of_same_worker(&c.owner)
                    });
                    if elsewhere {
                        drop(slot);
                        if tokio::time::timeout_at(
                            deadline,
                            journal.changed(Space::Steps, &digest, l.version),
                        )
                        .await
                        .is_err()
                        {
                            return Err(ToolError::InFlight { key });
                        }
                        continue;
                    }
                }
            }
            expect = Expect::Version(l.version);
        }
        // Claim it, run it, record its value.
        let mut rec = StepRecord {
            name: name.to_string(),
            root_run: ctx.root_run().to_string(),
            state: StepState::Running,
            at_ms: shared.clock.now_ms(),
        };
        let bytes = record::encode(Kind::Step, &rec)?;
        let claimed = journal
            .write(Write {
                space: Space::Steps,
                key: &digest,
                expect,
                body: &bytes,
                claim: ClaimChange::Take(&shared.owner),
                escalated: false,
                events: &[],
                durability: Durability::Eventual,
            })
            .await?;
        let Written::Done { version, epoch, .. } = claimed else {
            continue;
        };
        slot.hold(Some(Held {
            space: Space::Steps,
            key: digest,
            epoch,
        }));
        let Some(running) = fut.take() else {
            // A second round after a conflict: the future is spent.
            return Err(ToolError::InFlight { key });
        };
        let value = running.await.map_err(ToolError::Tool)?;
        rec.state = StepState::Done {
            value: Blob(codec::encode(&value).map_err(|detail| Error::Result {
                key: step_tool(name),
                op: "encoded",
                detail,
            })?),
        };
        rec.at_ms = shared.clock.now_ms();
        let bytes = record::encode(Kind::Step, &rec)?;
        let event = stored::encode(&draft(ctx, &tool, None, EventKind::StepRecorded))?;
        let done = journal
            .write(Write {
                space: Space::Steps,
                key: &digest,
                expect: Expect::Version(version),
                body: &bytes,
                claim: ClaimChange::Release,
                escalated: false,
                events: &[NewEvent {
                    key: None,
                    bytes: &event,
                }],
                durability: Durability::Immediate,
            })
            .await?;
        slot.hold(None);
        match done {
            Written::Done { seqs, .. } => {
                if let Some(seq) = seqs.first() {
                    shared
                        .audit
                        .publish(*seq, draft(ctx, &tool, None, EventKind::StepRecorded));
                }
                return Ok(value);
            }
            // Another driver took the step over meanwhile (this one was
            // paused past its lease): its value is the step's.
            Written::Conflict => continue,
        }
    }
}
