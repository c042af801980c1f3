//! Sagas ([`Ctx::saga`]): the completed steps of a body that failed are
//! compensated, in reverse order, each exactly once across crashes. This is
//! the driver; what happens when is decided in `machine/saga.rs`.
//!
//! Nothing here needs a record type of its own: a saga's decision to roll
//! back and its end are memoized steps ([`Ctx::step`]) of the saga's run
//! and scope, and each compensation is a journaled call of its own tool,
//! under a scope named after the original call's key. A saga run again
//! after a crash replays its completed calls from the journal (recording
//! their compensations again), finds the stored decision and goes on
//! compensating; compensations that already ran are replayed, not repeated.

use std::fmt::Debug;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::class::ToolDescriptor;
use crate::ctx::Ctx;
use crate::dispatch::BoxFuture;
use crate::error::ToolError;
use crate::failure::{Classify, Failure};
use crate::key::KeyBuilder;
use crate::machine::saga::{Action, BodyEnd, Decision, End, Input, Outcome, Run, StepRef, Undo};

pub(crate) mod list;
pub(crate) mod log;

use log::Done;
pub use log::Undone;

/// What a saga's body recorded (see [`log::Log`]).
pub(crate) type Log = log::Log<Ctx>;
use idem_journal::audit::{Draft, EventKind};
use idem_journal::codec;
use idem_journal::error::Error;
use idem_journal::journal::{Durability, Space};
use idem_journal::key::IdemKey;
use idem_journal::record::{OpRecord, State};

/// The handle a saga's body gets: its context, and a way to abort.
///
/// Calls made with [`Saga::ctx`] (or a `child`/`scope` of it) are part of
/// the saga: every completed call of a tool with `compensate = path` is
/// recorded, in order, with what its compensation needs.
#[derive(Clone)]
pub struct Saga {
    ctx: Ctx,
    log: Arc<Log>,
}

impl Debug for Saga {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Saga")
            .field("name", &self.log.name)
            .field("ctx", &self.ctx)
            .finish()
    }
}

impl Saga {
    /// The context to make the saga's calls with.
    pub fn ctx(&self) -> &Ctx {
        &self.ctx
    }

    /// The saga's name.
    pub fn name(&self) -> &str {
        &self.log.name
    }

    /// Rolls the saga back once its body returns, whatever it returns:
    /// return the error this gives from the body (`return
    /// Err(s.abort("out of stock"))`). The reason is what operators and
    /// [`ToolError::Compensated`] show.
    pub fn abort<E>(&self, reason: impl Into<String>) -> ToolError<E> {
        let reason = reason.into();
        let mut aborted = self
            .log
            .aborted
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if aborted.is_none() {
            *aborted = Some(reason.clone());
        }
        ToolError::Compensated {
            saga: self.log.name.clone(),
            reason,
        }
    }
}

/// Inside a saga that is rolling back, a journaled call runs only if it
/// is a replay of a call the saga completed before (its record is
/// committed); any other is refused before its INTENT, so a body run to
/// collect compensations has no new effect. `None`: go on.
pub(crate) async fn replay_only<E>(
    ctx: &Ctx,
    tool: &'static ToolDescriptor,
    key: &IdemKey,
) -> Option<ToolError<E>> {
    let log = ctx.scope.saga.as_ref()?;
    if ctx.call.is_some() || !log.replay_only.load(Ordering::SeqCst) {
        return None;
    }
    let journal = &*ctx.shared().journal;
    let committed = match journal.load(Space::Ops, key.digest()).await {
        Ok(Some(loaded)) => {
            match OpRecord::decode(&loaded.body, journal.location(), key.digest()) {
                Ok(rec) => matches!(rec.state, State::Committed { .. }),
                Err(e) => return Some(ToolError::Journal(e)),
            }
        }
        Ok(None) => false,
        Err(e) => return Some(ToolError::Journal(e)),
    };
    (!committed).then(|| {
        ToolError::Journal(Error::Usage(format!(
            "`{}` was not run: saga {} is rolling back, and while it does, only calls it \
             completed before are replayed",
            tool.name, log.name
        )))
    })
}

/// Records a completed call of a compensable tool, when `ctx` is a saga's
/// (the attribute's wrapper calls this after the call returned a value).
pub fn record<T, F>(ctx: &Ctx, key: &IdemKey, tool: &'static ToolDescriptor, result: &T, undo: F)
where
    T: Serialize + DeserializeOwned + Send + 'static,
    F: FnOnce(Ctx, T) -> BoxFuture<'static, Undone> + Send + 'static,
{
    let Some(log) = &ctx.scope.saga else { return };
    let step = StepRef {
        tool: tool.name.to_string(),
        key: key.to_string(),
    };
    let mut steps = log.steps.lock().unwrap_or_else(PoisonError::into_inner);
    if steps.iter().any(|d| d.step == step) {
        return; // the same call again: a replay of the one recorded
    }
    // A copy of the result for the compensation, through the journal's own
    // encoding (which every journaled result round-trips, replays rely on
    // it). One that does not come back cannot be compensated: the rollback
    // escalates at that step instead of guessing.
    let copy = codec::encode(result).and_then(|bytes| codec::decode::<T>(&bytes));
    let undo: Option<log::UndoFn<Ctx>> = match copy {
        Ok(copy) => Some(Box::new(move |c| undo(c, copy))),
        Err(_) => None,
    };
    steps.push(Done { step, undo });
}

/// What a compensation's result means for the saga.
pub fn undone<U, E: Classify + Debug>(result: Result<U, ToolError<E>>) -> Undone {
    let (undo, fault) = match result {
        Ok(_) => (Undo::Done, None),
        Err(ToolError::Tool(e)) => match e.classify() {
            Failure::Semantic => (Undo::Refused(format!("{e:?}")), None),
            _ => (
                Undo::Unsettled(format!("it failed and its retries are spent: {e:?}")),
                None,
            ),
        },
        Err(ToolError::NotApproved { note, .. }) => (
            Undo::Refused(format!("a person did not approve it: {note}")),
            None,
        ),
        Err(ToolError::Abandoned { key }) => (
            Undo::Refused(format!("an operator abandoned it ({key})")),
            None,
        ),
        Err(ToolError::Compensated { saga, reason }) => (
            Undo::Refused(format!("saga {saga} was rolled back: {reason}")),
            None,
        ),
        Err(ToolError::ArgsMismatch { key }) => (
            Undo::Refused(format!(
                "{key} was first called with other arguments (on_drift = \"reject\")"
            )),
            None,
        ),
        Err(ToolError::Escalated { key, reason }) => {
            (Undo::Unsettled(format!("{key} escalated: {reason}")), None)
        }
        Err(ToolError::AwaitingApproval { key }) => (
            Undo::Unsettled(format!("{key} awaits a person's approval")),
            None,
        ),
        Err(ToolError::InFlight { .. }) => (Undo::Busy, None),
        Err(ToolError::Journal(e)) => (Undo::Journal, Some(e)),
    };
    Undone { undo, fault }
}

/// Names of the saga's memoized values.
fn decision_step(name: &str) -> String {
    format!("{STEP_PREFIX}{name}/decision")
}

fn end_step(name: &str) -> String {
    format!("{STEP_PREFIX}{name}/end")
}

fn started_step(name: &str) -> String {
    format!("{STEP_PREFIX}{name}/started")
}

/// What every saga's memoized values are named after.
const STEP_PREFIX: &str = "idem.saga/";

/// The saga's name, if `step` is the name of a saga's first-run mark.
fn started_saga(step: &str) -> Option<&str> {
    step.strip_prefix(STEP_PREFIX)?.strip_suffix("/started")
}

/// The key of saga `name` under `ctx`'s run and scope (its audit events
/// carry it).
fn saga_key(ctx: &Ctx, name: &str) -> IdemKey {
    KeyBuilder::new(ctx.prefix(), "idem.saga")
        .field(name)
        .finish()
}

/// What a saga's first-run mark stores: where it runs, so that an operator's
/// listing ([`list`]) finds its decision and end (whose keys derive from the
/// scope, which no step record holds). Stored as `Option<Mark>`: a mark
/// written before it carried one (`()`) reads as `None`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
struct Mark {
    /// The scope path under the root run.
    scope: Vec<String>,
}

impl Ctx {
    /// Runs `body` as a saga named `name` (unique within this run and
    /// scope) and returns its result.
    ///
    /// Inside, make calls with the saga's [`Saga::ctx`]. When the body
    /// returns a [`Failure::Semantic`] tool error, a person's refusal
    /// (`NotApproved`), or anything after [`Saga::abort`], the
    /// compensations of its completed compensable calls run in reverse
    /// order, each a journaled call keyed from the original's key, so each
    /// runs once across crashes and retries; then the saga returns
    /// [`ToolError::Compensated`]. The decision is durable: a saga run
    /// again after a crash goes on compensating (its body runs again so its
    /// completed calls, replayed from the journal, hand over their
    /// compensations), and a saga that ended returns its end without
    /// running its body. While it rolls back, the body runs only to replay
    /// the calls it completed: a call that is not such a replay is refused
    /// before it runs. The body must take the same path when it runs again
    /// (route non-deterministic choices through [`Ctx::step`]); a second run
    /// of the saga concurrent with one in this process returns
    /// [`ToolError::InFlight`]. Errors whose outcome is in doubt (escalated, in
    /// flight, journal) are returned as they are and leave the saga open.
    /// A compensation refused for good, or one this run cannot reach,
    /// escalates the saga ([`ToolError::Escalated`] with what ran, what was
    /// undone and what is left) for good; one that cannot be settled yet
    /// escalates it until its next run.
    pub async fn saga<T, E, F, Fut>(&self, name: &str, body: F) -> Result<T, ToolError<E>>
    where
        E: Classify + Debug,
        F: FnOnce(Saga) -> Fut,
        Fut: Future<Output = Result<T, ToolError<E>>>,
    {
        let key = saga_key(self, name);
        let run = SagaRun {
            ctx: self,
            name,
            key: &key,
            tool: format!("saga:{name}"),
        };
        let log = Arc::new(Log {
            name: name.to_string(),
            steps: Mutex::new(Vec::new()),
            aborted: Mutex::new(None),
            replay_only: AtomicBool::new(false),
        });
        // One run of a saga at a time in this process: a second one
        // concurrent with it returns `InFlight`.
        let _leading = match self.shared().local.enter(key.digest()) {
            crate::leaders::Entry::Leader(slot) => slot,
            crate::leaders::Entry::Busy(_) => return Err(ToolError::InFlight { key }),
        };
        let mut body = Some(body);
        let mut result: Option<Result<T, ToolError<E>>> = None;
        let mut fault: Option<ToolError<E>> = None;
        let mut held: Vec<Done<Ctx>> = Vec::new();
        let mut machine = Run::new(name);
        let mut input = Input::Start;
        loop {
            input = match machine.step(input) {
                Action::Read => {
                    let found = async {
                        let end = crate::step::peek::<End>(self, &end_step(name)).await?;
                        let decision = match end {
                            Some(_) => None,
                            None => {
                                crate::step::peek::<Decision>(self, &decision_step(name)).await?
                            }
                        };
                        Ok::<_, Error>(Input::Found { end, decision })
                    };
                    run.or_fault(found.await, &mut fault)
                }
                Action::MarkStarted => {
                    let mark = Mark {
                        scope: self.scope_path().map(str::to_string).collect(),
                    };
                    let marked = crate::step::step_telling(
                        self,
                        &started_step(name),
                        async { Ok::<_, std::convert::Infallible>(Some(mark)) },
                        run.told(EventKind::SagaStarted {
                            saga: name.to_string(),
                        }),
                    )
                    .await;
                    match marked {
                        Ok(_) => Input::Started,
                        Err(e) => {
                            fault = Some(journal_only(e));
                            Input::JournalFailed
                        }
                    }
                }
                Action::EscalateForNow(reason) => {
                    let saga = name.to_string();
                    let emitted = run
                        .emit(EventKind::SagaEscalated { saga, reason })
                        .await
                        .map(|()| Input::Emitted);
                    run.or_fault(emitted, &mut fault)
                }
                Action::RunBody { replay_only } => {
                    log.replay_only.store(replay_only, Ordering::SeqCst);
                    let Some(body) = body.take() else {
                        return Err(ToolError::Journal(Error::Usage(
                            "idem saga: the body was asked to run twice (a bug)".into(),
                        )));
                    };
                    let saga = Saga {
                        ctx: self.with_saga(Some(log.clone()), false),
                        log: log.clone(),
                    };
                    let returned = body(saga).await;
                    let end = body_end(&log, &returned);
                    result = Some(returned);
                    held = std::mem::take(
                        &mut *log.steps.lock().unwrap_or_else(PoisonError::into_inner),
                    );
                    Input::BodyEnded {
                        end,
                        completed: held.iter().map(|d| d.step.clone()).collect(),
                        held: held.iter().map(|d| d.step.clone()).collect(),
                    }
                }
                Action::StoreDecision(proposed) => {
                    let told = run.told(run.decision_event(&proposed));
                    let stored = crate::step::step_telling(
                        self,
                        &decision_step(name),
                        async { Ok::<_, std::convert::Infallible>(proposed) },
                        told,
                    )
                    .await;
                    match stored {
                        Ok(d) => Input::Decided(d),
                        Err(e) => {
                            fault = Some(journal_only(e));
                            Input::JournalFailed
                        }
                    }
                }
                Action::Undo(step) => {
                    let undo = held
                        .iter_mut()
                        .find(|d| d.step == step)
                        .and_then(|d| d.undo.take());
                    match undo {
                        Some(undo) => {
                            let cctx = self
                                .scope(&format!("idem.compensate/{}", step.key))
                                .with_saga(None, true);
                            let done = undo(cctx).await;
                            if let Some(e) = done.fault {
                                fault = Some(ToolError::Journal(e));
                            }
                            Input::Undone(done.undo)
                        }
                        // Its result did not survive the copy: nothing can
                        // undo it but a person.
                        None => Input::Undone(Undo::Refused(
                            "its result could not be copied for its compensation".into(),
                        )),
                    }
                }
                Action::StoreEnd(end) => {
                    let told = run.told(run.end_event(&end));
                    let stored = crate::step::step_telling(
                        self,
                        &end_step(name),
                        async { Ok::<_, std::convert::Infallible>(end) },
                        told,
                    )
                    .await;
                    match stored {
                        Ok(end) => Input::Stored(end),
                        Err(e) => {
                            fault = Some(journal_only(e));
                            Input::JournalFailed
                        }
                    }
                }
                Action::Return(outcome) => {
                    return match outcome {
                        Outcome::Body => result.unwrap_or_else(|| {
                            Err(ToolError::Journal(Error::Usage(
                                "idem saga: no result of the body (a bug)".into(),
                            )))
                        }),
                        Outcome::End(end) => Err(run.ended(end)),
                        Outcome::EscalatedForNow(reason) => Err(ToolError::Escalated {
                            key: key.clone(),
                            reason,
                        }),
                        Outcome::Busy => Err(ToolError::InFlight { key: key.clone() }),
                        Outcome::Journal => Err(fault.unwrap_or_else(|| {
                            ToolError::Journal(Error::Usage(
                                "idem saga: a journal error went missing (a bug)".into(),
                            ))
                        })),
                    };
                }
            };
        }
    }
}

/// How the body ended, as far as the saga cares.
fn body_end<T, E: Classify + Debug>(log: &Log, result: &Result<T, ToolError<E>>) -> BodyEnd {
    let aborted = log
        .aborted
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    match (aborted, result) {
        (Some(reason), _) => BodyEnd::Refused(reason),
        (None, Ok(_)) => BodyEnd::Done,
        (None, Err(ToolError::Tool(e))) if matches!(e.classify(), Failure::Semantic) => {
            BodyEnd::Refused(format!("{e:?}"))
        }
        (None, Err(ToolError::NotApproved { key, note })) => {
            BodyEnd::Refused(format!("{key} was not approved: {note}"))
        }
        (None, Err(ToolError::Compensated { saga, reason })) => {
            BodyEnd::Refused(format!("saga {saga} was rolled back: {reason}"))
        }
        (None, Err(_)) => BodyEnd::InDoubt,
    }
}

/// A journal error of a step whose future cannot fail.
fn journal_only<E>(e: ToolError<std::convert::Infallible>) -> ToolError<E> {
    match e {
        ToolError::Journal(e) => ToolError::Journal(e),
        ToolError::InFlight { key } => ToolError::InFlight { key },
        other => ToolError::Journal(Error::Usage(format!("idem saga: {other}"))),
    }
}

/// One run of one saga.
struct SagaRun<'a> {
    ctx: &'a Ctx,
    name: &'a str,
    key: &'a IdemKey,
    /// The tool of its audit events, `saga:NAME`.
    tool: String,
}

impl SagaRun<'_> {
    fn ended<E>(&self, end: End) -> ToolError<E> {
        match end {
            End::Compensated { reason, .. } => ToolError::Compensated {
                saga: self.name.to_string(),
                reason,
            },
            End::Escalated { reason, .. } => ToolError::Escalated {
                key: self.key.clone(),
                reason,
            },
        }
    }

    async fn emit(&self, kind: EventKind) -> Result<(), Error> {
        let shared = self.ctx.shared();
        let draft = Draft {
            at_ms: shared.clock.now_ms(),
            tool: &self.tool,
            key: Some(self.key),
            root_run: self.ctx.root_run(),
            agent: self.ctx.agent(),
            worker: &shared.owner,
            kind,
        };
        shared
            .audit
            .emit(&*shared.journal, draft, Durability::Eventual)
            .await
            .map(|_| ())
    }

    /// `kind`, as the event written with one of the saga's records.
    fn told(&self, kind: EventKind) -> crate::step::Told<'_> {
        crate::step::Told {
            tool: &self.tool,
            key: self.key,
            kind,
        }
    }

    /// The `Compensating` event of a decision.
    fn decision_event(&self, d: &Decision) -> EventKind {
        EventKind::Compensating {
            saga: self.name.to_string(),
            reason: d.reason.clone(),
            steps: d.steps.iter().map(ToString::to_string).collect(),
        }
    }

    /// The `Compensated` or `SagaEscalated` event of an end.
    fn end_event(&self, end: &End) -> EventKind {
        let saga = self.name.to_string();
        match end {
            End::Compensated { reason, undone } => EventKind::Compensated {
                saga,
                reason: reason.clone(),
                undone: undone.iter().map(ToString::to_string).collect(),
            },
            End::Escalated { reason, .. } => EventKind::SagaEscalated {
                saga,
                reason: reason.clone(),
            },
        }
    }

    /// The input of a journal operation's result, keeping its error.
    fn or_fault<E>(&self, r: Result<Input, Error>, fault: &mut Option<ToolError<E>>) -> Input {
        r.unwrap_or_else(|e| {
            *fault = Some(ToolError::Journal(e));
            Input::JournalFailed
        })
    }
}

/// Whether calls made with `ctx` are part of a saga (whose compensable
/// calls are recorded).
pub fn in_saga(ctx: &Ctx) -> bool {
    ctx.scope.saga.is_some()
}

/// A compensation that takes only the original call's result.
#[doc(hidden)]
pub struct ResultOnly;

/// A compensation that takes the original call's result and then all of
/// its arguments.
#[doc(hidden)]
pub struct WithArgs;

/// A function that can compensate a call whose result is `T` and whose
/// arguments (by reference) are `A`: an async fn of `(&Ctx, &T)` or of
/// `(&Ctx, &T, &A0, &A1, ..)`, chosen by its arity (`M`).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot compensate this tool",
    label = "not a compensation of this tool",
    note = "a compensation is a #[tool] of a side-effecting class whose parameters after `ctx: &Ctx` are the original call's result by reference (`&{T}`), then optionally every argument of the original, by reference and in order"
)]
pub trait Compensation<'a, T, A, M> {
    /// The call's future.
    type Future: Future;
    /// Starts the compensation.
    fn start(self, ctx: &'a Ctx, result: &'a T, args: A) -> Self::Future;
}

impl<'a, F, Fut, T: 'a, A> Compensation<'a, T, A, ResultOnly> for F
where
    F: FnOnce(&'a Ctx, &'a T) -> Fut,
    Fut: Future,
{
    type Future = Fut;
    fn start(self, ctx: &'a Ctx, result: &'a T, _args: A) -> Fut {
        self(ctx, result)
    }
}

macro_rules! with_args {
    ($($a:ident),+) => {
        impl<'a, F, Fut, T: 'a, $($a: 'a),+> Compensation<'a, T, ($(&'a $a,)+), WithArgs> for F
        where
            F: FnOnce(&'a Ctx, &'a T, $(&'a $a),+) -> Fut,
            Fut: Future,
        {
            type Future = Fut;
            #[allow(non_snake_case)]
            fn start(self, ctx: &'a Ctx, result: &'a T, ($($a,)+): ($(&'a $a,)+)) -> Fut {
                self(ctx, result, $($a),+)
            }
        }
    };
}

with_args!(A0);
with_args!(A0, A1);
with_args!(A0, A1, A2);
with_args!(A0, A1, A2, A3);
with_args!(A0, A1, A2, A3, A4);
with_args!(A0, A1, A2, A3, A4, A5);
with_args!(A0, A1, A2, A3, A4, A5, A6);
with_args!(A0, A1, A2, A3, A4, A5, A6, A7);
