//! The operator's list of sagas ([`Runtime::sagas`](crate::Runtime::sagas)),
//! read from the sagas' own memoized steps.
//!
//! A saga leaves up to three step records: its first-run mark (which holds
//! its scope, see [`super::Mark`]), its decision to roll back and its end.
//! The mark is found by its name; the decision and the end are loaded by
//! the keys the saga itself gives them, derived from the mark's run and
//! scope, so two sagas of one name in two scopes of a run are never mixed
//! up. An escalation *for now* stores no end: it is learned from the
//! saga's latest audit event, which is the one thing here the audit
//! stream (and its pruning) decides.

use std::collections::HashMap;

use idem_journal::audit::{self as stored, EventKind};
use idem_journal::error::Error;
use idem_journal::journal::{Digest, Space};
use idem_journal::key::IdemKey;
use idem_journal::record::{self, Kind, StepRecord};
use idem_journal::views::{SagaState, SagaStep, SagaView};

use super::{decision_step, end_step, saga_key, started_saga, started_step, Mark};
use crate::ctx::Ctx;
use crate::machine::saga::{Decision, End, StepRef};
use crate::shared::Runtime;
use crate::step::{step_key, value_of};

/// Steps read per page of the scan.
const PAGE: usize = 1024;

/// Every saga whose first-run mark the journal holds, oldest start first.
pub(crate) async fn sagas(rt: &Runtime) -> Result<Vec<SagaView>, Error> {
    let journal = &*rt.shared.journal;
    let mut marks: Vec<(Digest, StepRecord)> = Vec::new();
    let mut steps: HashMap<Digest, StepRecord> = HashMap::new();
    let mut after: Option<Digest> = None;
    loop {
        let page = journal.scan(Space::Steps, after.as_ref(), PAGE).await?;
        let Some(last) = page.last().map(|(k, _)| *k) else {
            break;
        };
        after = Some(last);
        for (digest, loaded) in page {
            let rec = record::decode::<StepRecord>(
                Kind::Step,
                &loaded.body,
                journal.location(),
                &digest,
            )?;
            if started_saga(&rec.name).is_some() {
                marks.push((digest, rec));
            } else if rec.name.starts_with(super::STEP_PREFIX) {
                steps.insert(digest, rec);
            }
        }
    }
    let mut out = Vec::new();
    let mut synced = false;
    for (digest, mark) in marks {
        if let Some(view) = view_of(rt, &digest, &mark, &steps, &mut synced).await? {
            out.push(view);
        }
    }
    out.sort_by(|a, b| (a.started_ms, a.key.as_str()).cmp(&(b.started_ms, b.key.as_str())));
    Ok(out)
}

/// The root runs of every saga that decided to roll back and has not
/// ended (compensating, or escalated until its next run): what
/// [`Runtime::prune`](crate::Runtime::prune) keeps whole, however old, as
/// it keeps operations that are not finished. Without its decision a
/// resumed saga would run its body afresh, and without its completed
/// calls (and the compensations that already ran) it would make them
/// again.
pub(crate) async fn open_runs(rt: &Runtime) -> Result<std::collections::HashSet<String>, Error> {
    Ok(sagas(rt)
        .await?
        .into_iter()
        .filter(|s| match s.state {
            SagaState::Compensating => true,
            SagaState::Escalated => !s.for_good,
            _ => false,
        })
        .map(|s| s.root_run)
        .collect())
}

/// The view of the saga whose first-run mark is `mark` (stored under
/// `digest`); `None` for a mark still being written, or one written before
/// marks held their scope whose saga did not run at its run's root.
async fn view_of(
    rt: &Runtime,
    digest: &Digest,
    mark: &StepRecord,
    steps: &HashMap<Digest, StepRecord>,
    synced: &mut bool,
) -> Result<Option<SagaView>, Error> {
    let Some(name) = started_saga(&mark.name) else {
        return Ok(None);
    };
    let Some(found) = value_of::<Option<Mark>>(mark)? else {
        return Ok(None);
    };
    let scope = found.map_or_else(Vec::new, |m| m.scope);
    let ctx = scope
        .iter()
        .fold(rt.run(&mark.root_run), |ctx, s| ctx.scope(s));
    // The saga's own derivation must give the record it was found under:
    // else this is not the saga the mark says (an old mark without its
    // scope, of a saga in a scope).
    if step_key(&ctx, &started_step(name)).digest() != digest {
        return Ok(None);
    }
    let stored = |step: String| steps.get(step_key(&ctx, &step).digest());
    let decision_rec = stored(decision_step(name));
    let end_rec = stored(end_step(name));
    let decision = match decision_rec {
        Some(rec) => value_of::<Decision>(rec)?,
        None => None,
    };
    let end = match end_rec {
        Some(rec) => value_of::<End>(rec)?,
        None => None,
    };
    let key = saga_key(&ctx, name);
    let mut view = SagaView::new(
        name.to_string(),
        key,
        mark.root_run.clone(),
        scope,
        mark.at_ms,
    );
    if let Some(d) = &decision {
        view.state = SagaState::Compensating;
        view.reason = Some(d.reason.clone());
        view.steps = steps_of(&d.steps);
        view.decided_ms = decision_rec.map(|r| r.at_ms);
    }
    if end.is_some() {
        view.ended_ms = end_rec.map(|r| r.at_ms);
    }
    match end {
        Some(End::Compensated { reason, undone }) => {
            view.state = SagaState::Compensated;
            view.reason = Some(reason);
            view.undone = steps_of(&undone);
        }
        Some(End::Escalated { reason, undone }) => {
            view.state = SagaState::Escalated;
            view.escalation = Some(reason);
            view.for_good = true;
            view.undone = steps_of(&undone);
        }
        None if decision.is_some() => {
            // The stream holds only durable events: make the latest ones
            // durable first (once per listing).
            if !*synced {
                rt.sync().await?;
                *synced = true;
            }
            if let Some((at_ms, evidence)) = escalated_for_now(&ctx, &view).await? {
                view.state = SagaState::Escalated;
                view.escalation = Some(evidence);
                view.ended_ms = Some(at_ms);
            }
        }
        None => {}
    }
    Ok(Some(view))
}

/// When the saga's latest event is `SagaEscalated` (its latest run stopped
/// at a compensation that cannot be settled yet), when and its evidence.
async fn escalated_for_now(ctx: &Ctx, view: &SagaView) -> Result<Option<(u64, String)>, Error> {
    let journal = &*ctx.shared().journal;
    let digest = view.key.digest();
    let mut latest = None;
    for (seq, bytes) in journal.events_for(digest).await? {
        let event = stored::decode(journal.location(), seq, &bytes)?;
        // Its events name the saga's tool (`saga:NAME`), so their key
        // reads `saga_NAME-…`: the same digest.
        let ours = event
            .key
            .as_deref()
            .and_then(|k| IdemKey::parse(k).ok())
            .is_some_and(|k| k.digest() == digest);
        if !ours {
            continue;
        }
        match event.kind {
            EventKind::SagaEscalated { reason, .. } => latest = Some((event.at_ms, reason)),
            EventKind::SagaStarted { .. }
            | EventKind::Compensating { .. }
            | EventKind::Compensated { .. } => latest = None,
            _ => {}
        }
    }
    Ok(latest)
}

fn steps_of(steps: &[StepRef]) -> Vec<SagaStep> {
    steps
        .iter()
        .map(|s| SagaStep {
            tool: s.tool.clone(),
            key: s.key.clone(),
        })
        .collect()
}
