//! The second workflow of a torture round, and its operator: every order
//! that finished the order workflow is also shipped, as the shop's saga
//! (`ship_order_to`: book a courier, charge the card, pay the supplier),
//! and supplier payments above a threshold wait for a person's approval.
//!
//! What each order's saga must end as is fixed by its number, so the
//! checks know it without asking the journal:
//! - even orders pay a supplier whose bank takes the wire, odd ones one
//!   whose bank refuses it (a semantic refusal: the saga rolls back);
//! - [`shop::supplier_needs_approval`] says which payments need a person;
//!   the harness's operator rejects those of orders divisible by three
//!   (the saga then rolls back) and approves the others, through the
//!   worker's admin API while workers are killed around it.
//!
//! The checks, per order: one courier and one charge; the supplier paid
//! once if the saga completes and never otherwise; a saga that rolled
//! back refunded the charge once and cancelled the courier once (a missed
//! compensation is a violation of its own); approval asked for a payment
//! that needs it and never otherwise, once per generation of its key (a
//! second generation only after the bank refused an approved payment and
//! the body ran again before the saga stored its rollback: a refusal ends
//! a decision, and the next call is a new one), each decided once, as the
//! operator decided; one commit per effect in the audit stream; and a final run of
//! every saga that ends the same way without a provider request.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idem::{Error, EventKind, ToolError};
use idem_testkit::Providers;

use crate::shop::{self, Shop, SAGA_TOOLS};
use crate::{status_line, OrderEnd, Summary, Witness};

/// Set in a worker's environment (to anything): ship every order after
/// its order workflow, and serve the admin API.
pub(crate) const SAGA_ENV: &str = "IDEM_TORTURE_SAGAS";

/// The admin API's bearer token the parent hands its workers.
pub(crate) const TOKEN: &str = "idem-torture-operator-token-0123456789";

/// A shipped order's number is the order's plus this, so that its charge,
/// courier and supplier wire never mix with the order workflow's effects
/// in the providers' ledgers (a round's orders span fewer numbers).
const SAGA_OFFSET: u64 = 50_000;

/// The order number the saga of `order` ships under.
pub(crate) fn saga_order(order: u64) -> u64 {
    order + SAGA_OFFSET
}

/// The supplier account the saga of `order` pays: one the bank refuses
/// (it starts with `XX`) for odd orders.
fn supplier_iban(order: u64) -> String {
    if order.is_multiple_of(2) {
        format!("DE02SUPPLIER{order:010}")
    } else {
        format!("{}-{order}", shop::SUPPLIER_IBAN)
    }
}

/// How the saga of an order must end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Expect {
    /// Its supplier payment needs a person's approval.
    pub(crate) needs_approval: bool,
    /// ... and the operator rejects it.
    pub(crate) rejected: bool,
    /// The supplier's bank refuses the wire.
    pub(crate) bank_refuses: bool,
}

impl Expect {
    pub(crate) fn of(order: u64) -> Expect {
        let needs_approval = shop::supplier_needs_approval(saga_order(order));
        Expect {
            needs_approval,
            rejected: needs_approval && approve_verdict(order).is_none(),
            bank_refuses: !order.is_multiple_of(2),
        }
    }

    /// The saga completes (else it rolls back).
    pub(crate) fn completes(&self) -> bool {
        !self.rejected && !self.bank_refuses
    }

    /// Effects of each of [`SAGA_TOOLS`], in its order.
    fn effects(&self) -> [usize; 5] {
        let (done, undone) = if self.completes() { (1, 0) } else { (0, 1) };
        // The supplier is paid only when the saga completes: the bank
        // refuses the others, or nobody approved them.
        [1, 1, done, undone, undone]
    }

    /// Effects the providers hold for this saga at the end.
    pub(crate) fn effect_count(&self) -> u64 {
        self.effects().iter().sum::<usize>() as u64
    }
}

/// The operator's decision for the approval of `order`'s supplier payment:
/// `Some(note)` approves it, `None` rejects it.
fn approve_verdict(order: u64) -> Option<String> {
    (!order.is_multiple_of(3)).then(|| format!("supplier of order {order} checked"))
}

/// The worker side: ships `order` to the end its number fixes. A pending
/// approval is asked about again (the deferred style: the call returns at
/// once, and the harness's operator decides meanwhile); an escalation
/// parks the order; a retry budget spent on failures that did not land is
/// tried again from the top, a few times. `witness` hears of every result
/// the saga's body is given by `book_courier` and `pay`.
pub(crate) async fn process(
    shop: &Arc<Shop>,
    ctx: &idem::Ctx,
    order: u64,
    witness: &Witness,
) -> OrderEnd {
    let expect = Expect::of(order);
    let iban = supplier_iban(order);
    let (mut tries, mut waits) = (0, 0u32);
    let mut last = String::new();
    let shipped = saga_order(order);
    let on_step = |step: shop::ShipStep<'_>| witness.returned(&step, shipped);
    while tries < 5 {
        match shop::ship_order_to(shop, ctx, shipped, &iban, &on_step).await {
            Ok(_) if expect.completes() => return OrderEnd::Done,
            Err(ToolError::Compensated { .. }) if !expect.completes() => return OrderEnd::Done,
            Ok(_) => {
                return OrderEnd::Fatal(format!(
                    "the saga of order {order} completed, though it had to roll back ({expect:?})"
                ))
            }
            Err(ToolError::Compensated { reason, .. }) => {
                return OrderEnd::Fatal(format!(
                    "the saga of order {order} rolled back ({reason}), though it had to \
                     complete ({expect:?})"
                ))
            }
            // The operator decides within a few polls of the admin API; a
            // worker left waiting 40 s is stuck, and its watchdog says so.
            Err(ToolError::AwaitingApproval { .. }) if waits < 4000 => {
                waits += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            Err(ToolError::Escalated { .. }) => return OrderEnd::Parked("ship"),
            Err(ToolError::Tool(e)) => last = format!("ship: {e}"),
            Err(ToolError::Journal(Error::TimedOut { .. })) => last = "ship: timed out".into(),
            Err(other) => return OrderEnd::Fatal(format!("ship: {other}")),
        }
        tries += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    OrderEnd::Failed(last)
}

/// The order of a root run `{prefix}-order-{n}`.
fn order_of_run(run: &str) -> Option<u64> {
    run.rsplit_once("-order-")?.1.parse().ok()
}

/// The harness's operator of approvals, across a round's incarnations:
/// what it decided through the admin API, and what it found wrong.
#[derive(Debug, Default)]
pub(crate) struct Approver {
    /// Operation key (its generation included) → its root run and whether
    /// it was approved, for every decision the admin API acknowledged.
    acknowledged: BTreeMap<String, (String, bool)>,
    /// Decisions answered `not_awaiting_approval`: decided by a request
    /// whose answer a kill cut off.
    decided_unanswered: u64,
    /// Approvals shown pending again after a decision was acknowledged.
    asked_again: Vec<String>,
    /// Approvals and rejections the admin API acknowledged.
    approved: u64,
    rejected: u64,
}

impl Approver {
    /// Decisions the journal acknowledged (a journal that forgets them
    /// after a power cut lost them).
    pub(crate) fn acknowledged(&self) -> u64 {
        self.acknowledged.len() as u64
    }
}

/// Plays the operator for the worker whose status file is `status`: once
/// the worker has said where its admin API is, polls its pending
/// approvals and decides each by [`approve_verdict`]. Never returns: the
/// caller drops it when the worker ends.
pub(crate) async fn approve_while(
    status: &Path,
    approver: &Mutex<Approver>,
) -> std::convert::Infallible {
    let mut client = None;
    loop {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let Some(api) = client.as_ref() else {
            let text = std::fs::read_to_string(status).unwrap_or_default();
            client = text
                .lines()
                .find_map(|l| l.strip_prefix("ADMIN "))
                .and_then(|url| idem_cli::Client::new(url.trim(), TOKEN).ok());
            continue;
        };
        // A worker killed under a request is no answer: try again, and
        // the next incarnation's API after that.
        let Ok(pending) = api.approvals().await else {
            continue;
        };
        for approval in pending {
            let Some(order) = order_of_run(&approval.root_run) else {
                continue;
            };
            {
                let mut a = approver.lock().unwrap_or_else(PoisonError::into_inner);
                if a.acknowledged.contains_key(approval.key.as_str()) {
                    let shown = format!(
                        "ASKED AGAIN: {} of order {order} is pending again after its decision \
                         was acknowledged ({})",
                        approval.tool, approval.key
                    );
                    if !a.asked_again.contains(&shown) {
                        a.asked_again.push(shown);
                    }
                    continue;
                }
            }
            let verdict = approve_verdict(order);
            let note = verdict
                .clone()
                .unwrap_or_else(|| format!("supplier of order {order} not on the approved list"));
            let request = idem::admin::DecisionRequest { note, via: None };
            match api
                .decide(approval.key.as_str(), verdict.is_some(), &request)
                .await
            {
                Ok(_) => {
                    let mut a = approver.lock().unwrap_or_else(PoisonError::into_inner);
                    a.acknowledged.insert(
                        approval.key.to_string(),
                        (approval.root_run.clone(), verdict.is_some()),
                    );
                    match verdict {
                        Some(_) => a.approved += 1,
                        None => a.rejected += 1,
                    }
                }
                Err(e) if e.kind == "not_awaiting_approval" => {
                    approver
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .decided_unanswered += 1;
                }
                Err(_) => {}
            }
        }
    }
}

/// A worker's line saying where its admin API is.
pub(crate) fn say_admin(status: &Path, rt: &idem::Runtime) {
    if let Some(url) = rt.admin_url() {
        status_line(status, &format!("ADMIN {url}"));
    }
}

/// The checks of a finished round's sagas (see the module's doc), from
/// the providers' ledgers and the durable audit stream; every problem is
/// pushed to `problems`.
pub(crate) fn check(
    orders: &[u64],
    prefix: &str,
    providers: &Providers,
    events: &[idem::AuditEvent],
    approver: &Approver,
    summary: &mut Summary,
    problems: &mut Vec<String>,
) {
    // Per (root run, tool): commits; per root run: approvals asked and
    // decided, and sagas compensated.
    let mut commits: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    // Approvals per run, then per operation key (a key names its
    // generation: a call refused by the provider is a new decision under
    // the next generation, and asks again).
    let mut asked: BTreeMap<&str, BTreeMap<&str, u64>> = BTreeMap::new();
    let mut decided: BTreeMap<&str, BTreeMap<&str, Vec<bool>>> = BTreeMap::new();
    let mut compensated: BTreeMap<&str, u64> = BTreeMap::new();
    for e in events {
        let run = e.root_run.as_str();
        match &e.kind {
            EventKind::Committed { .. } => *commits.entry((run, &e.tool)).or_default() += 1,
            EventKind::ApprovalRequested { .. } => {
                *asked.entry(run).or_default().entry(key_of(e)).or_default() += 1;
            }
            EventKind::Approved { .. } => {
                let keys = decided.entry(run).or_default();
                keys.entry(key_of(e)).or_default().push(true);
            }
            EventKind::NotApproved { .. } => {
                let keys = decided.entry(run).or_default();
                keys.entry(key_of(e)).or_default().push(false);
            }
            EventKind::Compensated { .. } => *compensated.entry(run).or_default() += 1,
            _ => {}
        }
    }
    problems.extend(approver.asked_again.iter().cloned());
    summary.approvals_unanswered += approver.decided_unanswered;
    summary.approved += approver.approved;
    summary.rejected += approver.rejected;
    for &order in orders {
        let expect = Expect::of(order);
        let shipped = saga_order(order);
        let run = crate::root_run(prefix, order);
        summary.sagas += 1;
        summary.saga_effects_expected += expect.effect_count();
        if expect.completes() {
            summary.sagas_completed += 1;
        } else {
            summary.sagas_compensated += 1;
        }
        for (tool, want) in SAGA_TOOLS.iter().zip(expect.effects()) {
            let n = shop::saga_effects(providers, tool, shipped);
            summary.saga_effects += n as u64;
            if n > want {
                summary.duplicates += (n - want) as u64;
                problems.push(format!(
                    "DUPLICATE: {tool} applied {n} times for the saga of order {order} \
                     ({expect:?})"
                ));
            } else if n < want {
                summary.lost += (want - n) as u64;
                if matches!(*tool, "refund" | "cancel_courier") {
                    summary.missed_compensations += 1;
                    problems.push(format!(
                        "MISSED COMPENSATION: {tool} never ran for the saga of order {order}, \
                         which rolled back ({expect:?})"
                    ));
                } else {
                    problems.push(format!(
                        "LOST: {tool} never applied for the saga of order {order} ({expect:?})"
                    ));
                }
            }
            let audited = commits.get(&(run.as_str(), *tool)).copied().unwrap_or(0);
            summary.saga_audited_commits += audited;
            if audited != want as u64 {
                if want == 1 && audited == 0 {
                    summary.audit_gaps += 1;
                }
                problems.push(format!(
                    "AUDIT: the durable audit stream shows {audited} commits of {tool} for the \
                     saga of order {order}, expected {want}"
                ));
            }
        }
        let was_compensated = compensated.get(run.as_str()).copied().unwrap_or(0);
        if was_compensated != u64::from(!expect.completes()) {
            problems.push(format!(
                "SAGA: order {order}'s saga ended compensated {was_compensated} times in the \
                 audit stream ({expect:?})"
            ));
        }
        // Approval: asked when needed and never otherwise, once per
        // generation; each request decided once, as the operator decides
        // for this order; what the operator was told it decided is what
        // the journal holds. A second generation only after the supplier's
        // bank refused an approved payment (a crash before the saga stored
        // its rollback: the body, run again, pays again).
        let asked_keys = asked.remove(run.as_str()).unwrap_or_default();
        let decided_keys = decided.remove(run.as_str()).unwrap_or_default();
        let n_asked: u64 = asked_keys.values().sum();
        summary.approvals_requested += n_asked;
        let generations = asked_keys.len();
        let allowed = match (
            expect.needs_approval,
            expect.bank_refuses && !expect.rejected,
        ) {
            (false, _) => generations == 0,
            (true, false) => generations == 1,
            (true, true) => generations >= 1,
        };
        if !allowed || asked_keys.values().any(|&n| n != 1) {
            problems.push(format!(
                "APPROVAL: order {order}'s supplier payment asked for approval {asked_keys:?} \
                 ({expect:?})"
            ));
        }
        if generations > 1 {
            summary.approvals_of_new_generations += generations as u64 - 1;
        }
        for key in asked_keys.keys() {
            let decisions = decided_keys.get(key).cloned().unwrap_or_default();
            if decisions != [!expect.rejected] {
                problems.push(format!(
                    "APPROVAL: {key} (order {order}) was decided {decisions:?} in the audit \
                     stream ({expect:?})"
                ));
            }
        }
        if let Some(extra) = decided_keys.keys().find(|k| !asked_keys.contains_key(*k)) {
            problems.push(format!(
                "APPROVAL: {extra} (order {order}) was decided but never asked for"
            ));
        }
        for (key, (_, approved)) in approver.acknowledged.iter().filter(|(_, (r, _))| *r == run) {
            let held = decided_keys.get(key.as_str()).map(Vec::as_slice);
            if held != Some(&[*approved][..]) {
                summary.lost += 1;
                problems.push(format!(
                    "LOST APPROVAL: the admin API acknowledged {} of {key} (order {order}), the \
                     audit stream holds {:?}",
                    if *approved { "approval" } else { "rejection" },
                    decided_keys.get(key.as_str())
                ));
            }
        }
    }
}

/// The operation key an audit event is about ("" if none).
fn key_of(e: &idem::AuditEvent) -> &str {
    e.key.as_deref().unwrap_or("")
}

/// The last run of every saga of a round (after the journal said every
/// one ended): each must end as before, from the journal alone. Problems
/// are pushed; the caller counts the provider requests `replay` made.
pub(crate) async fn replay(
    rt: &idem::Runtime,
    orders: &[u64],
    prefix: &str,
    replay: &Arc<Shop>,
    problems: &mut Vec<String>,
) {
    for &order in orders {
        let ctx = rt.run(&crate::root_run(prefix, order));
        let expect = Expect::of(order);
        let ended = shop::ship_order_to(
            replay,
            &ctx,
            saga_order(order),
            &supplier_iban(order),
            &|_| {},
        )
        .await;
        match ended {
            Ok(_) if expect.completes() => {}
            Err(ToolError::Compensated { .. }) if !expect.completes() => {}
            other => problems.push(format!(
                "replaying the saga of order {order} ended {:?} ({expect:?})",
                other.map(|_| "completed")
            )),
        }
    }
}
