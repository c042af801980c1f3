//! Sagas (`Ctx::saga`, `#[tool(compensate = path)]`) through the real
//! runtime (sled in a temporary directory): a body that fails semantically
//! has its completed steps compensated in reverse order, each exactly once
//! across re-runs and an interrupted rollback; a rollback once decided is
//! carried through; what cannot be undone escalates with the evidence.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::{tool, Classify, Ctx, EventKind, Failure, Runtime, ToolError};
use idem_testkit::engine::events;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq)]
enum ShopError {
    Declined(String),
    Down,
}

impl Classify for ShopError {
    fn classify(&self) -> Failure {
        match self {
            ShopError::Declined(_) => Failure::Semantic,
            ShopError::Down => Failure::not_sent(),
        }
    }
}

/// What the providers did, in order.
#[derive(Default)]
struct Shop {
    log: Mutex<Vec<String>>,
    /// The shipper declines every order.
    decline_shipping: AtomicBool,
    /// The refund desk refuses refunds.
    refuse_refunds: AtomicBool,
    /// Cancellations hang before they reach the provider (a process that
    /// dies there).
    hang_cancel: AtomicBool,
    /// So do refunds.
    hang_refund: AtomicBool,
    body_runs: AtomicUsize,
}

impl Shop {
    fn did(&self, what: String) {
        self.log.lock().unwrap().push(what);
    }

    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    fn count(&self, prefix: &str) -> usize {
        self.log().iter().filter(|e| e.starts_with(prefix)).count()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Charge {
    id: String,
    amount: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Ticket {
    seat: String,
}

#[tool(class = "provider", key = "order", compensate = refund)]
async fn charge(ctx: &Ctx, order: u64, amount: u64, shop: Arc<Shop>) -> Result<Charge, ShopError> {
    let _ = ctx;
    shop.did(format!("charge {order} {amount}"));
    Ok(Charge {
        id: format!("ch_{order}"),
        amount,
    })
}

/// Takes the charge and then every argument of `charge`.
#[tool(class = "provider", key = "charge.id")]
async fn refund(
    ctx: &Ctx,
    charge: &Charge,
    order: &u64,
    amount: &u64,
    shop: &Arc<Shop>,
) -> Result<String, ShopError> {
    let _ = ctx;
    if shop.refuse_refunds.load(Ordering::SeqCst) {
        return Err(ShopError::Declined("refunds are closed".into()));
    }
    if shop.hang_refund.load(Ordering::SeqCst) {
        std::future::pending::<()>().await;
    }
    shop.did(format!("refund {order} {} of {amount}", charge.id));
    Ok(format!("re_{}", charge.id))
}

#[tool(class = "at_most_once", key = "order", compensate = cancel)]
async fn book(ctx: &Ctx, order: u64, shop: Arc<Shop>) -> Result<Ticket, ShopError> {
    let _ = ctx;
    shop.did(format!("book {order}"));
    Ok(Ticket {
        seat: format!("seat-{order}"),
    })
}

/// The shops of the running tests, by order: `cancel` takes only the
/// ticket, so it finds its shop here.
static SHOPS: Mutex<Vec<(String, Arc<Shop>)>> = Mutex::new(Vec::new());

fn shop_of(seat: &str) -> Arc<Shop> {
    SHOPS
        .lock()
        .unwrap()
        .iter()
        .find(|(s, _)| s == seat)
        .map(|(_, shop)| shop.clone())
        .expect("a shop for this seat")
}

/// Takes only the ticket.
#[tool(class = "at_most_once", key = "ticket.seat")]
async fn cancel(ctx: &Ctx, ticket: &Ticket) -> Result<(), ShopError> {
    let _ = ctx;
    let shop = shop_of(&ticket.seat);
    if shop.hang_cancel.load(Ordering::SeqCst) {
        std::future::pending::<()>().await;
    }
    shop.did(format!("cancel {}", ticket.seat));
    Ok(())
}

#[tool(class = "provider", key = "order")]
async fn ship(ctx: &Ctx, order: u64, shop: Arc<Shop>) -> Result<String, ShopError> {
    let _ = ctx;
    if shop.decline_shipping.load(Ordering::SeqCst) {
        return Err(ShopError::Declined("no courier for this address".into()));
    }
    shop.did(format!("ship {order}"));
    Ok(format!("parcel-{order}"))
}

fn runtime() -> (tempfile::TempDir, Runtime) {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(dir.path()).unwrap();
    (dir, rt)
}

fn shop(order: u64) -> Arc<Shop> {
    let shop = Arc::new(Shop::default());
    SHOPS
        .lock()
        .unwrap()
        .push((format!("seat-{order}"), shop.clone()));
    shop
}

/// The order saga: charge, book, ship.
async fn order(ctx: &Ctx, order: u64, shop: &Arc<Shop>) -> Result<String, ToolError<ShopError>> {
    ctx.saga("order", |s| async move {
        shop.body_runs.fetch_add(1, Ordering::SeqCst);
        let c = charge(s.ctx(), order, 120, shop.clone()).await?;
        let t = book(s.ctx(), order, shop.clone()).await?;
        let parcel = ship(s.ctx(), order, shop.clone()).await?;
        Ok(format!("{} {} {parcel}", c.id, t.seat))
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn a_saga_that_succeeds_returns_its_value_and_undoes_nothing() {
    let (_dir, rt) = runtime();
    let shop = shop(1);
    let ctx = rt.run("order-1");
    let running = order(&ctx, 1, &shop);
    fn spawnable<F: std::future::Future + Send>(f: F) -> F {
        f
    }
    let done = spawnable(running).await.unwrap();
    assert_eq!(done, "ch_1 seat-1 parcel-1");
    assert_eq!(shop.log(), ["charge 1 120", "book 1", "ship 1"]);
    let events = events(&rt).await;
    assert!(events.contains(&EventKind::SagaStarted {
        saga: "order".into()
    }));
    assert!(!events
        .iter()
        .any(|e| matches!(e, EventKind::Compensating { .. })));
}

#[tokio::test(start_paused = true)]
async fn a_semantic_failure_undoes_the_completed_steps_last_first_once() {
    let (_dir, rt) = runtime();
    let shop = shop(2);
    shop.decline_shipping.store(true, Ordering::SeqCst);
    let ctx = rt.run("order-2");
    let err = order(&ctx, 2, &shop).await.unwrap_err();
    let ToolError::Compensated { saga, reason } = &err else {
        panic!("expected Compensated, got {err:?}");
    };
    assert_eq!(saga, "order");
    assert!(reason.contains("no courier"), "{reason}");
    assert_eq!(
        shop.log(),
        [
            "charge 2 120",
            "book 2",
            "cancel seat-2",
            "refund 2 ch_2 of 120"
        ]
    );
    // Every later run returns the same end without running the body.
    for _ in 0..2 {
        let again = order(&ctx, 2, &shop).await.unwrap_err();
        assert!(matches!(again, ToolError::Compensated { .. }), "{again:?}");
    }
    assert_eq!(shop.body_runs.load(Ordering::SeqCst), 1);
    assert_eq!(shop.log().len(), 4);
    let events = events(&rt).await;
    let compensating: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            EventKind::Compensating { steps, .. } => Some(steps.len()),
            _ => None,
        })
        .collect();
    assert_eq!(compensating, [2], "one decision, naming both steps");
    assert!(events.iter().any(|e| matches!(
        e,
        EventKind::Compensated { undone, .. } if undone.len() == 2
    )));
}

#[tokio::test(start_paused = true)]
async fn an_abort_rolls_back_whatever_the_body_returns() {
    let (_dir, rt) = runtime();
    let shop = shop(3);
    let ctx = rt.run("order-3");
    let err = ctx
        .saga("order", |s| {
            let shop = shop.clone();
            async move {
                charge(s.ctx(), 3, 50, shop.clone()).await?;
                Err::<(), _>(s.abort("out of stock"))
            }
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ToolError::Compensated { reason, .. } if reason == "out of stock"),
        "{err:?}"
    );
    assert_eq!(shop.log(), ["charge 3 50", "refund 3 ch_3 of 50"]);
}

#[tokio::test(start_paused = true)]
async fn an_interrupted_rollback_resumes_and_is_carried_through_even_if_the_body_now_succeeds() {
    let (_dir, rt) = runtime();
    let shop = shop(4);
    shop.decline_shipping.store(true, Ordering::SeqCst);
    shop.hang_refund.store(true, Ordering::SeqCst);
    let ctx = rt.run("order-4");
    // The rollback stops inside the refund (its call is dropped there, as
    // a dying process would leave it): the cancellation ran, the refund's
    // INTENT is journaled and its provider was not reached.
    let cut = tokio::time::timeout(Duration::from_secs(5), order(&ctx, 4, &shop)).await;
    assert!(cut.is_err(), "the rollback hung in refund: {cut:?}");
    assert_eq!(shop.log(), ["charge 4 120", "book 4", "cancel seat-4"]);

    // Run again: shipping would work now, but the rollback was decided.
    shop.decline_shipping.store(false, Ordering::SeqCst);
    shop.hang_refund.store(false, Ordering::SeqCst);
    let err = order(&ctx, 4, &shop).await.unwrap_err();
    assert!(
        matches!(&err, ToolError::Compensated { reason, .. } if reason.contains("no courier")),
        "{err:?}"
    );
    assert_eq!(
        shop.log(),
        [
            "charge 4 120",
            "book 4",
            "cancel seat-4",
            "refund 4 ch_4 of 120"
        ],
        "one of each effect; the body ran again only to replay: shipping (which would work \
         now) was not called again, and the decided rollback went on"
    );
}

#[tokio::test(start_paused = true)]
async fn a_second_run_of_a_saga_in_flight_in_this_process_is_refused() {
    let (_dir, rt) = runtime();
    let shop = shop(10);
    shop.decline_shipping.store(true, Ordering::SeqCst);
    shop.hang_refund.store(true, Ordering::SeqCst);
    let ctx = rt.run("order-10");
    let first = order(&ctx, 10, &shop);
    tokio::pin!(first);
    let cut = tokio::time::timeout(Duration::from_secs(5), &mut first).await;
    assert!(cut.is_err(), "the first run hangs in its refund: {cut:?}");
    // The first run is alive (not dropped): a second one does nothing.
    let second = order(&ctx, 10, &shop).await.unwrap_err();
    assert!(matches!(second, ToolError::InFlight { .. }), "{second:?}");
    assert_eq!(shop.body_runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn an_at_most_once_compensation_cut_off_escalates_until_an_operator_settles_it() {
    let (_dir, rt) = runtime();
    let shop = shop(9);
    shop.decline_shipping.store(true, Ordering::SeqCst);
    shop.hang_cancel.store(true, Ordering::SeqCst);
    let ctx = rt.run("order-9");
    let cut = tokio::time::timeout(Duration::from_secs(5), order(&ctx, 9, &shop)).await;
    assert!(cut.is_err());
    shop.hang_cancel.store(false, Ordering::SeqCst);
    // The cancellation may have reached its provider: at_most_once never
    // re-runs it, so the saga escalates, for now.
    let err = order(&ctx, 9, &shop).await.unwrap_err();
    let ToolError::Escalated { reason, .. } = &err else {
        panic!("expected Escalated, got {err:?}");
    };
    assert!(reason.contains("resumes here"), "{reason}");
    assert!(reason.contains("left: charge "), "{reason}");
    assert_eq!(shop.count("cancel"), 0);
    assert_eq!(shop.count("refund"), 0);
    // The operator sees the cancellation's own escalation and says it did
    // not happen; the saga's next run goes on from there.
    let open = rt.escalations().await.unwrap();
    assert_eq!(open.len(), 1, "{open:?}");
    rt.resolve(
        &open[0].key,
        idem::Resolution::Reissue,
        "the seat is still booked",
    )
    .await
    .unwrap();
    let err = order(&ctx, 9, &shop).await.unwrap_err();
    assert!(matches!(err, ToolError::Compensated { .. }), "{err:?}");
    assert_eq!(shop.count("cancel"), 1, "{:?}", shop.log());
    assert_eq!(shop.count("refund"), 1, "{:?}", shop.log());
}

#[tokio::test(start_paused = true)]
async fn a_refused_compensation_escalates_for_good_with_the_evidence() {
    let (_dir, rt) = runtime();
    let shop = shop(5);
    shop.decline_shipping.store(true, Ordering::SeqCst);
    shop.refuse_refunds.store(true, Ordering::SeqCst);
    let ctx = rt.run("order-5");
    let err = order(&ctx, 5, &shop).await.unwrap_err();
    let ToolError::Escalated { reason, .. } = &err else {
        panic!("expected Escalated, got {err:?}");
    };
    assert!(reason.contains("refunds are closed"), "{reason}");
    assert!(reason.contains("undone: book "), "{reason}");
    assert!(reason.contains("left: charge "), "{reason}");
    assert_eq!(
        shop.log(),
        ["charge 5 120", "book 5", "cancel seat-5"],
        "the cancellation ran before the refund was refused"
    );
    // Parked: the next run runs nothing and says the same.
    shop.refuse_refunds.store(false, Ordering::SeqCst);
    let again = order(&ctx, 5, &shop).await.unwrap_err();
    assert!(
        matches!(&again, ToolError::Escalated { reason: r, .. } if r == reason),
        "{again:?}"
    );
    assert_eq!(shop.log().len(), 3);
    assert_eq!(shop.body_runs.load(Ordering::SeqCst), 1);
    assert!(events(&rt)
        .await
        .iter()
        .any(|e| matches!(e, EventKind::SagaEscalated { .. })));
}

#[tokio::test(start_paused = true)]
async fn an_error_in_doubt_leaves_the_saga_open_and_undoes_nothing() {
    let (_dir, rt) = runtime();
    let shop = shop(6);
    let ctx = rt.run("order-6");
    let err = ctx
        .saga("order", |s| {
            let shop = shop.clone();
            async move {
                charge(s.ctx(), 6, 10, shop.clone()).await?;
                Err::<(), _>(ToolError::Tool(ShopError::Down))
            }
        })
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::Tool(ShopError::Down)), "{err:?}");
    assert_eq!(shop.log(), ["charge 6 10"]);
}

#[tokio::test(start_paused = true)]
async fn a_decided_step_this_run_does_not_reach_escalates_for_good() {
    let (_dir, rt) = runtime();
    let shop = shop(7);
    shop.decline_shipping.store(true, Ordering::SeqCst);
    shop.hang_refund.store(true, Ordering::SeqCst);
    let ctx = rt.run("order-7");
    let cut = tokio::time::timeout(Duration::from_secs(5), order(&ctx, 7, &shop)).await;
    assert!(cut.is_err());
    // This run books but never charges: the decided charge is out of
    // reach.
    shop.hang_refund.store(false, Ordering::SeqCst);
    let err = ctx
        .saga("order", |s| {
            let shop = shop.clone();
            async move {
                book(s.ctx(), 7, shop.clone()).await?;
                Ok::<_, ToolError<ShopError>>(())
            }
        })
        .await
        .unwrap_err();
    let ToolError::Escalated { reason, .. } = &err else {
        panic!("expected Escalated, got {err:?}");
    };
    assert!(reason.contains("did not reach it"), "{reason}");
    assert_eq!(shop.count("cancel"), 1, "{:?}", shop.log());
    assert_eq!(shop.count("refund"), 0, "{:?}", shop.log());
}

/// A read-only tool cannot compensate: it is not journaled, so it would
/// run again on every resume.
#[tool(class = "read_only")]
async fn look(ctx: &Ctx, charge: &Charge) -> Result<String, ShopError> {
    let _ = ctx;
    Ok(charge.id.clone())
}

#[tool(class = "provider", key = "order", compensate = look)]
async fn charge_looked(ctx: &Ctx, order: u64) -> Result<Charge, ShopError> {
    let _ = ctx;
    Ok(Charge {
        id: format!("ch_{order}"),
        amount: 1,
    })
}

#[tokio::test(start_paused = true)]
async fn a_read_only_compensation_is_refused_before_it_runs() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("order-8");
    let err = ctx
        .saga("order", |s| async move {
            charge_looked(s.ctx(), 8).await?;
            Err::<(), _>(ToolError::Tool(ShopError::Declined("no".into())))
        })
        .await
        .unwrap_err();
    let ToolError::Journal(e) = &err else {
        panic!("expected a usage error, got {err:?}");
    };
    assert!(
        e.to_string()
            .contains("read_only tool and cannot compensate"),
        "{e}"
    );
}

/// The saga of `view`'s list with this run (and scope), or a panic that
/// shows the list.
fn listed<'a>(list: &'a [idem::SagaView], run: &str, scope: &[&str]) -> &'a idem::SagaView {
    list.iter()
        .find(|s| s.root_run == run && s.scope == scope)
        .unwrap_or_else(|| panic!("no saga of run {run} scope {scope:?} in {list:#?}"))
}

fn tools(steps: &[idem::SagaStep]) -> Vec<&str> {
    steps.iter().map(|s| s.tool.as_str()).collect()
}

#[tokio::test(start_paused = true)]
async fn operators_list_every_saga_with_where_it_stands_across_a_restart() {
    use idem::SagaState;
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(dir.path()).unwrap();
    // Succeeded: nothing decided, so it lists as running.
    let ok = shop(20);
    order(&rt.run("order-20"), 20, &ok).await.unwrap();
    // Rolled back.
    let declined = shop(21);
    declined.decline_shipping.store(true, Ordering::SeqCst);
    let ctx21 = rt.run("order-21");
    order(&ctx21, 21, &declined).await.unwrap_err();
    // The same saga name in a scope of the same run: a saga of its own.
    let scoped = shop(25);
    order(&ctx21.scope("retry"), 25, &scoped).await.unwrap();
    // A refund refused: escalated for good.
    let refused = shop(22);
    refused.decline_shipping.store(true, Ordering::SeqCst);
    refused.refuse_refunds.store(true, Ordering::SeqCst);
    order(&rt.run("order-22"), 22, &refused).await.unwrap_err();
    // An at_most_once cancellation cut off: escalated for now.
    let cut = shop(23);
    cut.decline_shipping.store(true, Ordering::SeqCst);
    cut.hang_cancel.store(true, Ordering::SeqCst);
    let ctx23 = rt.run("order-23");
    let hung = tokio::time::timeout(Duration::from_secs(5), order(&ctx23, 23, &cut)).await;
    assert!(hung.is_err());
    cut.hang_cancel.store(false, Ordering::SeqCst);
    let for_now = order(&ctx23, 23, &cut).await.unwrap_err();
    assert!(
        matches!(for_now, ToolError::Escalated { .. }),
        "{for_now:?}"
    );

    let check = |list: &[idem::SagaView]| {
        assert_eq!(list.len(), 5, "{list:#?}");
        let running = listed(list, "order-20", &[]);
        assert_eq!(running.saga, "order");
        assert_eq!(running.state, SagaState::Running, "{running:#?}");
        assert!(running.reason.is_none() && running.steps.is_empty());
        assert!(running.started_ms > 0 && running.decided_ms.is_none());

        let done = listed(list, "order-21", &[]);
        assert_eq!(done.state, SagaState::Compensated, "{done:#?}");
        assert!(
            done.reason.as_deref().unwrap().contains("no courier"),
            "{done:#?}"
        );
        assert_eq!(tools(&done.steps), ["charge", "book"]);
        assert_eq!(tools(&done.undone), ["book", "charge"], "last first");
        assert!(done.escalation.is_none() && !done.for_good);
        assert!(done.decided_ms.is_some() && done.ended_ms.is_some());
        let other = listed(list, "order-21", &["retry"]);
        assert_eq!(other.state, SagaState::Running, "{other:#?}");
        assert_ne!(other.key, done.key, "two sagas, two keys");

        let parked = listed(list, "order-22", &[]);
        assert_eq!(parked.state, SagaState::Escalated, "{parked:#?}");
        assert!(parked.for_good);
        assert_eq!(tools(&parked.undone), ["book"]);
        let evidence = parked.escalation.as_deref().unwrap();
        assert!(evidence.contains("refunds are closed"), "{evidence}");
        assert!(evidence.contains("left: charge "), "{evidence}");

        let waiting = listed(list, "order-23", &[]);
        assert_eq!(waiting.state, SagaState::Escalated, "{waiting:#?}");
        assert!(!waiting.for_good, "escalated for now: {waiting:#?}");
        assert!(
            waiting
                .escalation
                .as_deref()
                .unwrap()
                .contains("resumes here"),
            "{waiting:#?}"
        );
        assert_eq!(tools(&waiting.steps), ["charge", "book"]);
    };
    let list = rt.sagas().await.unwrap();
    check(&list);
    // The saga's key names the operation its audit events are about.
    let events = rt.audit(0).await.unwrap();
    let done = listed(&list, "order-21", &[]);
    assert!(events.iter().any(|e| {
        let about = e.key.as_deref().map(|k| idem::IdemKey::parse(k).unwrap());
        about.is_some_and(|k| k.digest() == done.key.digest())
            && matches!(e.kind, EventKind::Compensated { .. })
    }));

    // The records are the saga's own: the same list after a restart.
    drop((ctx21, ctx23, rt));
    let rt = Runtime::open(dir.path()).unwrap();
    assert_eq!(rt.sagas().await.unwrap(), list);

    // Settled, the escalation for now goes on to an end.
    let open = rt.escalations().await.unwrap();
    rt.resolve(&open[0].key, idem::Resolution::Reissue, "still booked")
        .await
        .unwrap();
    order(&rt.run("order-23"), 23, &cut).await.unwrap_err();
    let list = rt.sagas().await.unwrap();
    let ended = listed(&list, "order-23", &[]);
    assert_eq!(ended.state, SagaState::Compensated, "{ended:#?}");
    assert_eq!(tools(&ended.undone), ["book", "charge"]);
}

#[tokio::test(start_paused = true)]
async fn a_first_run_mark_written_without_a_scope_still_reads() {
    // What an idem that stored `()` as a saga's first-run mark left.
    let (_dir, rt) = runtime();
    let shop = shop(24);
    let ctx = rt.run("order-24");
    ctx.step("idem.saga/order/started", async {
        Ok::<_, std::convert::Infallible>(())
    })
    .await
    .unwrap();
    let list = rt.sagas().await.unwrap();
    assert_eq!(list.len(), 1, "{list:#?}");
    assert_eq!(list[0].state, idem::SagaState::Running);
    // The saga runs on over it.
    shop.decline_shipping.store(true, Ordering::SeqCst);
    order(&ctx, 24, &shop).await.unwrap_err();
    let list = rt.sagas().await.unwrap();
    assert_eq!(list[0].state, idem::SagaState::Compensated, "{list:#?}");
}

/// How many events of each saga kind the journal holds.
fn saga_events(events: &[EventKind]) -> [usize; 3] {
    let mut n = [0; 3];
    for e in events {
        match e {
            EventKind::SagaStarted { .. } => n[0] += 1,
            EventKind::Compensating { .. } => n[1] += 1,
            EventKind::Compensated { .. } => n[2] += 1,
            _ => {}
        }
    }
    n
}

#[tokio::test(start_paused = true)]
async fn a_saga_s_events_survive_a_crash_right_after_it_ends_and_are_never_doubled() {
    // The saga's start, decision and end are written with their events in
    // one unit: a crash right after the end (nothing written since to
    // cover an event appended on its own) keeps all three, once each.
    let mem = idem_testkit::MemJournal::new();
    let shop = shop(26);
    shop.decline_shipping.store(true, Ordering::SeqCst);
    {
        let rt = Runtime::builder().journal(mem.clone()).open().unwrap();
        let err = order(&rt.run("order-26"), 26, &shop).await.unwrap_err();
        assert!(matches!(err, ToolError::Compensated { .. }), "{err:?}");
    }
    mem.crash();
    let rt = Runtime::builder().journal(mem.clone()).open().unwrap();
    assert_eq!(saga_events(&events(&rt).await), [1, 1, 1]);
    // The saga's end replays; nothing runs again and nothing is told twice.
    let again = order(&rt.run("order-26"), 26, &shop).await.unwrap_err();
    assert!(matches!(again, ToolError::Compensated { .. }), "{again:?}");
    assert_eq!(shop.log().len(), 4, "{:?}", shop.log());
    assert_eq!(saga_events(&events(&rt).await), [1, 1, 1]);
}

#[tokio::test(start_paused = true)]
async fn prune_keeps_an_open_saga_whole_however_old() {
    // A rollback escalated for now waits for a person, maybe past the
    // retention. Pruning its decision and its completed calls would let the
    // next run start the body afresh: a second charge.
    let dir = tempfile::tempdir().unwrap();
    let clock = idem::ManualClock::new(1_000_000);
    let rt = Runtime::builder()
        .path(dir.path())
        .clock(Arc::new(clock.clone()))
        .retention(Duration::from_secs(3600))
        .open()
        .unwrap();
    let shop = shop(27);
    shop.decline_shipping.store(true, Ordering::SeqCst);
    shop.hang_cancel.store(true, Ordering::SeqCst);
    let ctx = rt.run("order-27");
    let cut = tokio::time::timeout(Duration::from_secs(5), order(&ctx, 27, &shop)).await;
    assert!(cut.is_err());
    shop.hang_cancel.store(false, Ordering::SeqCst);
    let err = order(&ctx, 27, &shop).await.unwrap_err();
    assert!(matches!(err, ToolError::Escalated { .. }), "{err:?}");

    clock.advance(rt.retention() * 2);
    let report = rt.prune().await.unwrap();
    assert_eq!(report.ops_removed, 0, "{report:?}");
    assert_eq!(report.steps_removed, 0, "{report:?}");
    let listed = rt.sagas().await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");

    let open = rt.escalations().await.unwrap();
    rt.resolve(&open[0].key, idem::Resolution::Reissue, "still booked")
        .await
        .unwrap();
    let err = order(&ctx, 27, &shop).await.unwrap_err();
    assert!(matches!(err, ToolError::Compensated { .. }), "{err:?}");
    assert_eq!(
        shop.log(),
        [
            "charge 27 120",
            "book 27",
            "cancel seat-27",
            "refund 27 ch_27 of 120"
        ]
    );
}
