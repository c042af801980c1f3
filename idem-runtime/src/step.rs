//! The driver of a memoized step ([`Ctx::step`]): executes what the step
//! machine (`machine/step.rs`) asks for.

use std::future::Future;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::ctx::Ctx;
use crate::error::ToolError;
use crate::key::KeyBuilder;
use crate::leaders::{Entry, Slot};
use crate::machine::step::{Action, Input, Outcome, Step};
use crate::unit::{self, Unit, Wrote};
use idem_journal::audit::{Draft, EventKind};
use idem_journal::codec;
use idem_journal::error::Error;
use idem_journal::journal::{ClaimChange, Durability, Expect, Held, Space};
use idem_journal::record::{self, Blob, Kind, StepRecord};

impl Ctx {
    /// Runs `fut` once per run and scope: its `Ok` value is stored durably
    /// under `name`, and every later call of the same step (after a retry or
    /// a restart) returns the stored value without polling `fut`. Errors are
    /// not stored. Use it for expensive or non-deterministic work between
    /// tool calls, such as a model call, so a resumed agent takes the same
    /// path. A step in flight when the process dies runs again.
    pub async fn step<T, E, F>(&self, name: &str, fut: F) -> Result<T, ToolError<E>>
    where
        T: Serialize + DeserializeOwned,
        F: Future<Output = Result<T, E>>,
    {
        run(self, name, fut, None).await
    }
}

/// An audit event written in the same unit as a step's record (a saga's
/// start, decision and end): durable exactly when the record is, so that
/// a crash can neither lose it nor, because a later run finds the record
/// and stores nothing, have it told twice.
#[derive(Debug, Clone)]
pub(crate) struct Told<'a> {
    /// The event's tool (`saga:NAME`).
    pub(crate) tool: &'a str,
    /// The key it is about.
    pub(crate) key: &'a idem_journal::key::IdemKey,
    /// What it tells.
    pub(crate) kind: EventKind,
}

/// [`Ctx::step`], writing `told` with the record when this call stores
/// it (a call that finds the step stored replays it and tells nothing).
pub(crate) async fn step_telling<T, E, F>(
    ctx: &Ctx,
    name: &str,
    fut: F,
    told: Told<'_>,
) -> Result<T, ToolError<E>>
where
    T: Serialize + DeserializeOwned,
    F: Future<Output = Result<T, E>>,
{
    run(ctx, name, fut, Some(told)).await
}

/// Tool name under which memoized steps appear in audit events.
fn step_tool(name: &str) -> String {
    format!("step:{name}")
}

/// The key of step `name` under `ctx`'s run and scope.
pub(crate) fn step_key(ctx: &Ctx, name: &str) -> idem_journal::key::IdemKey {
    KeyBuilder::new(ctx.prefix(), "idem.step")
        .field(name)
        .finish()
}

/// The stored value of step `name`, if one is stored, without running or
/// claiming anything (a saga reads its decision and its end this way).
pub(crate) async fn peek<T: DeserializeOwned>(ctx: &Ctx, name: &str) -> Result<Option<T>, Error> {
    let journal = &*ctx.shared().journal;
    let key = step_key(ctx, name);
    let digest = key.digest();
    let Some(loaded) = journal.load(Space::Steps, digest).await? else {
        return Ok(None);
    };
    let rec = record::decode::<StepRecord>(Kind::Step, &loaded.body, journal.location(), digest)?;
    value_of(&rec)
}

/// The value a step record holds, decoded (`None` while the step runs).
pub(crate) fn value_of<T: DeserializeOwned>(rec: &StepRecord) -> Result<Option<T>, Error> {
    match &rec.state {
        idem_journal::record::StepState::Done { value } => codec::decode(&value.0)
            .map(Some)
            .map_err(|detail| Error::Result {
                key: step_tool(&rec.name),
                op: "decoded",
                detail,
            }),
        idem_journal::record::StepState::Running => Ok(None),
    }
}

async fn run<T, E, F>(
    ctx: &Ctx,
    name: &str,
    fut: F,
    told: Option<Told<'_>>,
) -> Result<T, ToolError<E>>
where
    T: Serialize + DeserializeOwned,
    F: Future<Output = Result<T, E>>,
{
    let shared = ctx.shared();
    let journal = &*shared.journal;
    let key = step_key(ctx, name);
    let digest = *key.digest();
    let tool = step_tool(name);
    let draft = |kind| Draft {
        at_ms: shared.clock.now_ms(),
        tool: &tool,
        key: None,
        root_run: ctx.root_run(),
        agent: ctx.agent(),
        worker: &shared.owner,
        kind,
    };
    let mut machine = Step::new(name, ctx.root_run());
    let mut fut = Some(fut);
    let mut slot: Option<Slot<'_>> = None;
    let mut leader = None;
    let mut value: Option<T> = None;
    let mut error: Option<E> = None;
    let mut fault: Option<Error> = None;
    let mut undecodable = String::new();
    let mut input = Input::Start;
    let until = |at: u64| Duration::from_millis(at.saturating_sub(shared.clock.now_ms()));
    loop {
        let action = machine.step(&shared.setup, shared.clock.now_ms(), input);
        input = match action {
            Action::Lead => {
                slot = None;
                leader = None;
                match shared.local.enter(&digest) {
                    Entry::Leader(s) => {
                        slot = Some(s);
                        Input::Led
                    }
                    Entry::Busy(rx) => {
                        leader = Some(rx);
                        Input::Busy
                    }
                }
            }
            Action::AwaitLeader { until: at } => match leader.take() {
                Some(mut rx) => match tokio::time::timeout(until(at), rx.changed()).await {
                    Ok(_) => Input::LeaderLeft,
                    Err(_) => Input::TimedOut,
                },
                None => Input::LeaderLeft,
            },
            Action::AwaitChange { version, until: at } => {
                slot = None;
                let wait = journal.changed(Space::Steps, &digest, version);
                match tokio::time::timeout(until(at), wait).await {
                    Ok(()) => Input::Changed,
                    Err(_) => Input::TimedOut,
                }
            }
            Action::Read => {
                let found = journal.load(Space::Steps, &digest).await.and_then(|l| {
                    l.map(|l| {
                        record::decode::<StepRecord>(
                            Kind::Step,
                            &l.body,
                            journal.location(),
                            &digest,
                        )
                        .map(|rec| (rec, l.version, l.claim))
                    })
                    .transpose()
                });
                match found {
                    Ok(found) => Input::Found(found),
                    Err(e) => {
                        fault = Some(e);
                        Input::ReadFailed
                    }
                }
            }
            Action::Claim { rec, expect } => {
                let written = write(
                    ctx,
                    &digest,
                    &rec,
                    expect.map_or(Expect::Absent, Expect::Version),
                    ClaimChange::Take(&shared.owner),
                    Durability::Eventual,
                    Vec::new(),
                )
                .await;
                match written {
                    Ok(Wrote::Done { version, epoch }) => {
                        if let Some(s) = &slot {
                            s.hold(Some(Held {
                                space: Space::Steps,
                                key: digest,
                                epoch,
                            }));
                        }
                        Input::Written(version)
                    }
                    Ok(Wrote::Conflict(_)) => Input::Conflict,
                    Err(e) => {
                        fault = Some(e);
                        Input::WriteFailed
                    }
                }
            }
            Action::Run => match fut.take() {
                Some(running) => match running.await {
                    Ok(v) => {
                        let stored = codec::encode(&v).map(Blob);
                        value = Some(v);
                        Input::Ran(Some(stored))
                    }
                    Err(e) => {
                        error = Some(e);
                        Input::Ran(None)
                    }
                },
                None => Input::Ran(Some(Err("the step's future was spent".into()))),
            },
            Action::Record { rec, expect } => {
                let mut drafts = vec![draft(EventKind::StepRecorded)];
                if let Some(t) = &told {
                    drafts.push(Draft {
                        tool: t.tool,
                        key: Some(t.key),
                        ..draft(t.kind.clone())
                    });
                }
                let written = write(
                    ctx,
                    &digest,
                    &rec,
                    Expect::Version(expect),
                    ClaimChange::Release,
                    Durability::Immediate,
                    drafts,
                )
                .await;
                if let Some(s) = &slot {
                    s.hold(None);
                }
                match written {
                    Ok(Wrote::Done { version, .. }) => Input::Written(version),
                    Ok(Wrote::Conflict(_)) => Input::Conflict,
                    Err(e) => {
                        fault = Some(e);
                        Input::WriteFailed
                    }
                }
            }
            Action::Decode(stored) => match codec::decode(&stored.0) {
                Ok(v) => {
                    value = Some(v);
                    Input::Decoded(true)
                }
                Err(detail) => {
                    undecodable = detail;
                    Input::Decoded(false)
                }
            },
            Action::EmitReplayed => {
                match shared
                    .audit
                    .emit(
                        journal,
                        draft(EventKind::StepReplayed),
                        Durability::Eventual,
                    )
                    .await
                {
                    Ok(_) => Input::Appended,
                    Err(e) => {
                        fault = Some(e);
                        Input::AppendFailed
                    }
                }
            }
            Action::Return(outcome) => {
                return match outcome {
                    Outcome::Value => value.ok_or_else(|| {
                        ToolError::Journal(Error::Usage("idem step: no value (a bug)".into()))
                    }),
                    Outcome::Error => match error {
                        Some(e) => Err(ToolError::Tool(e)),
                        None => Err(ToolError::InFlight { key }),
                    },
                    Outcome::InFlight => Err(ToolError::InFlight { key }),
                    Outcome::Journal => Err(ToolError::Journal(fault.unwrap_or_else(|| {
                        Error::Usage("idem step: a journal error went missing (a bug)".into())
                    }))),
                    Outcome::Unstorable(detail) => Err(ToolError::Journal(Error::Result {
                        key: tool.clone(),
                        op: "encoded",
                        detail,
                    })),
                    Outcome::Undecodable => Err(ToolError::Journal(Error::Result {
                        key: tool.clone(),
                        op: "decoded",
                        detail: undecodable,
                    })),
                };
            }
        };
    }
}

/// A step record's write, through the one write path.
async fn write(
    ctx: &Ctx,
    digest: &[u8; 32],
    rec: &StepRecord,
    expect: Expect,
    claim: ClaimChange<'_>,
    durability: Durability,
    drafts: Vec<Draft<'_>>,
) -> Result<Wrote, Error> {
    let body = record::encode(Kind::Step, rec)?;
    unit::write(
        ctx.shared(),
        Unit {
            space: Space::Steps,
            key: digest,
            expect,
            body: &body,
            claim,
            escalated: false,
            durability,
            unread: false,
        },
        drafts,
        false,
    )
    .await
}
