//! Storage faults, corrupt records and concurrent callers, through the real
//! `#[tool]` attribute (the workflow's tools in examples/agent/shop.rs) and
//! the testkit's providers over real TCP. The provider ledgers are the
//! ground truth throughout.
//!
//! - A journal wrapper fails each write (and each sync) of a call in turn,
//!   as ENOSPC (nothing written) or EIO (written, then reported failed):
//!   the provider is never called after the failure, and the next call of
//!   the same operation verifies, replays or escalates, never re-runs
//!   blindly.
//! - Random and truncated bytes in an operation's record make the call fail
//!   with `ToolError::Journal`, never run it as if the record were absent.
//! - Many tasks calling one operation at once (some as subagents) apply it
//!   once.

#[path = "../examples/agent/shop.rs"]
mod shop;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::journal::Space;
use idem::{Error, EventKind, IdemKey, Resolution, Runtime, SledJournal, ToolError};
use idem_testkit::{FaultyJournal, Providers, SplitMix64, StorageFault};
use shop::{Moment, Shop, EFFECT_TOOLS};

/// A unique order id per scenario, so that one set of providers serves a
/// whole test and each scenario's effects are told apart in the ledgers.
fn next_order() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    7_000_000 + NEXT.fetch_add(1, Ordering::SeqCst)
}

/// A shop whose hook appends `call <tool>` to `log` whenever a request is
/// about to go out.
fn logging_shop(providers: &Providers, log: Arc<Mutex<Vec<String>>>) -> Shop {
    Shop::with_hook(
        providers.addrs(),
        Arc::new(move |moment, tool, _| {
            if moment == Moment::Sending {
                lock(&log).push(format!("call {tool}"));
            }
        }),
    )
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------------------
// Storage faults

/// A runtime on a fresh failing journal, the journal, and its log.
fn failing_runtime(
    dir: &std::path::Path,
) -> (Runtime, Arc<FaultyJournal>, Arc<Mutex<Vec<String>>>) {
    let journal = FaultyJournal::new(Arc::new(SledJournal::open(dir).unwrap()));
    let rt = Runtime::builder().journal(journal.clone()).open().unwrap();
    let log = journal.log();
    (rt, journal, log)
}

/// Writes and syncs of one clean call of `tool`.
async fn clean_profile(providers: &Providers, tool: &str) -> (usize, usize) {
    let dir = tempfile::tempdir().unwrap();
    let (rt, journal, log) = failing_runtime(dir.path());
    let shop = logging_shop(providers, log);
    shop.run_step(&rt.run("profile"), tool, next_order())
        .await
        .unwrap();
    (journal.writes(), journal.syncs())
}

/// The audit events after the first `skip` (this runtime's journal holds
/// one scenario only).
async fn events_after(rt: &Runtime, skip: usize) -> Vec<EventKind> {
    rt.audit(0)
        .await
        .unwrap()
        .into_iter()
        .skip(skip)
        .map(|e| e.kind)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_journal_write_never_leads_to_a_blind_provider_call() {
    let providers = Providers::start().await.unwrap();
    let mut scenarios = 0;
    // Per tool, scenarios whose failure struck after the effect landed
    // (the COMMIT's write or sync): the ones that must verify or escalate.
    let mut after_effect = std::collections::BTreeMap::new();
    for tool in EFFECT_TOOLS {
        let (writes, syncs) = clean_profile(&providers, tool).await;
        // INTENT and COMMIT, each one write (with its events) and one
        // barrier.
        assert_eq!((writes, syncs), (2, 2), "{tool}: writes, syncs");
        let targets = (1..=writes)
            .map(|n| (n, 0))
            .chain((1..=syncs).map(|n| (0, n)));
        for (fail_write, fail_sync) in targets {
            for mode in [StorageFault::Refused, StorageFault::AppliedThenFailed] {
                scenarios += 1;
                let case = format!("{tool}, {mode:?}, write {fail_write} / sync {fail_sync}");
                let dir = tempfile::tempdir().unwrap();
                let (rt, journal, log) = failing_runtime(dir.path());
                journal.fail_write(fail_write, mode);
                journal.fail_sync(fail_sync, mode);
                let shop = logging_shop(&providers, log.clone());
                let order = next_order();
                let run = format!("storage-{order}");
                let ctx = rt.run(&run);

                let first = shop.run_step(&ctx, tool, order).await;
                let trace = lock(&log).clone();
                let failed = trace
                    .iter()
                    .position(|l| l.starts_with("FAILED"))
                    .unwrap_or_else(|| panic!("{case}: the fault never struck: {trace:?}"));
                let err = first.expect_err(&case);
                assert!(
                    matches!(err, ToolError::Journal(Error::Storage { .. })),
                    "{case}: {err:?}"
                );
                // Nothing reaches the provider once the journal failed.
                assert!(
                    !trace[failed..].iter().any(|l| l.starts_with("call")),
                    "{case}: provider called after the failure: {trace:?}"
                );
                let landed = shop::effects(&providers, tool, order);
                let called = trace.iter().any(|l| l.starts_with("call"));
                assert_eq!(landed, usize::from(called), "{case}: {trace:?}");

                // The disk works again. The next call must not repeat a
                // landed effect blindly.
                journal.heal();
                let calls_before = trace.iter().filter(|l| l.starts_with("call")).count();
                let seen = rt.audit(0).await.unwrap().len();
                let second = shop.run_step(&ctx, tool, order).await;
                let trace = lock(&log).clone();
                let calls_after = trace.iter().filter(|l| l.starts_with("call")).count();
                let second_events = events_after(&rt, seen).await;
                let mut second = second;
                if let Err(ToolError::Escalated { key, .. }) = &second {
                    // Only the tool without verify or provider dedupe may
                    // park; an operator settles it from the ledger.
                    assert_eq!(tool, "refund_wire", "{case}: {second_events:?}");
                    assert_eq!(shop::effects(&providers, tool, order), landed, "{case}");
                    let resolution = match providers
                        .wire()
                        .ledger()
                        .iter()
                        .find(|w| w.reference == shop::wire_reference(order))
                    {
                        Some(w) => Resolution::Landed(Some(serde_json::to_value(w).unwrap())),
                        None => Resolution::Reissue,
                    };
                    rt.resolve(key, resolution, "checked the bank statement")
                        .await
                        .unwrap();
                    second = shop.run_step(&ctx, tool, order).await;
                }
                second.unwrap_or_else(|e| panic!("{case}: {e:?}"));
                assert_eq!(
                    shop::effects(&providers, tool, order),
                    1,
                    "{case}: {trace:?}; {second_events:?}"
                );
                if landed == 1 {
                    *after_effect.entry(tool).or_insert(0) += 1;
                    let replayed = second_events
                        .iter()
                        .any(|k| matches!(k, EventKind::DedupeHit));
                    let verified = second_events.iter().any(
                        |k| matches!(k, EventKind::Verified { verdict } if verdict == "landed"),
                    );
                    let escalated = second_events
                        .iter()
                        .any(|k| matches!(k, EventKind::Escalated { .. }));
                    let provider_replay = second_events
                        .iter()
                        .any(|k| matches!(k, EventKind::ProviderReplay { .. }));
                    match tool {
                        // Re-sent under the same key: the provider replays.
                        "charge" => {
                            assert!(replayed || provider_replay, "{case}: {second_events:?}")
                        }
                        "refund_wire" => {
                            assert_eq!(calls_after, calls_before, "{case}: wire re-sent");
                            assert!(replayed || escalated, "{case}: {second_events:?}");
                        }
                        _ => {
                            assert_eq!(calls_after, calls_before, "{case}: re-sent: {trace:?}");
                            assert!(replayed || verified, "{case}: {second_events:?}");
                        }
                    }
                }
            }
        }
    }
    assert_eq!(scenarios, 4 * 2 * (2 + 2), "{scenarios} scenarios");
    for tool in EFFECT_TOOLS {
        assert!(
            after_effect.get(tool).copied().unwrap_or(0) >= 2,
            "{tool}: too few faults after the effect: {after_effect:?}"
        );
    }
}

// ---------------------------------------------------------------------------
// Corrupt records

/// The key of the last operation of `tool` in run `run`, from the audit.
async fn key_of(rt: &Runtime, run: &str, tool: &str) -> IdemKey {
    let text = rt
        .audit(0)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.root_run == run && e.tool == tool)
        .find_map(|e| e.key)
        .unwrap_or_else(|| panic!("no event of {tool} in {run}"));
    IdemKey::parse(&text).unwrap()
}

/// Damages a record the way disks and torn writes do.
fn damage(rng: &mut SplitMix64, good: &[u8]) -> (&'static str, Vec<u8>) {
    let mut bad = good.to_vec();
    let how = match rng.below(5) {
        0 => {
            let len = rng.below(good.len() as u64 + 16) as usize;
            bad = (0..len).map(|_| rng.next_u64() as u8).collect();
            "random bytes"
        }
        1 => {
            bad.truncate(rng.below(good.len() as u64) as usize);
            "truncated"
        }
        2 => {
            for _ in 0..1 + rng.below(4) {
                let bit = rng.below(bad.len() as u64 * 8) as usize;
                bad[bit / 8] ^= 1 << (bit % 8);
            }
            "bit flips"
        }
        3 => {
            let at = rng.below(bad.len() as u64) as usize;
            let len = (1 + rng.below(8) as usize).min(bad.len() - at);
            for b in &mut bad[at..at + len] {
                *b = rng.next_u64() as u8;
            }
            "overwritten bytes"
        }
        _ => {
            bad.extend((0..1 + rng.below(16)).map(|_| rng.next_u64() as u8));
            "trailing garbage"
        }
    };
    if bad == good {
        // The dice reproduced the record; a damaged copy it must be.
        bad.push(0);
    }
    (how, bad)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_records_are_errors_and_never_reach_the_provider() {
    let seed = 0x1de3_c0de;
    let mut rng = SplitMix64::new(seed);
    let providers = Providers::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Without the replay cache: the damaged record is what the next call
    // reads (a process that remembers the result would replay it).
    let rt = Runtime::builder()
        .path(dir.path())
        .replay_cache(0)
        .open()
        .unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let shop = logging_shop(&providers, log.clone());
    for tool in EFFECT_TOOLS {
        for i in 0..40 {
            let order = next_order();
            let run = format!("corrupt-{order}");
            let ctx = rt.run(&run);
            shop.run_step(&ctx, tool, order).await.unwrap();
            let key = key_of(&rt, &run, tool).await;
            let good = rt
                .journal()
                .load(Space::Ops, key.digest())
                .await
                .unwrap()
                .unwrap()
                .body;
            let (how, bad) = damage(&mut rng, &good);
            idem_testkit::overwrite_record(&**rt.journal(), Space::Ops, key.digest(), &bad).await;

            let calls = lock(&log).len();
            let err = shop.run_step(&ctx, tool, order).await.unwrap_err();
            let case = format!("{tool} #{i} (seed {seed:#x}): {how}, {} bytes", bad.len());
            assert!(
                matches!(
                    err,
                    ToolError::Journal(Error::Corrupt { .. } | Error::RecordVersion { .. })
                ),
                "{case}: {err:?}"
            );
            assert_eq!(lock(&log).len(), calls, "{case}: the provider was called");
            assert_eq!(shop::effects(&providers, tool, order), 1, "{case}");
        }
    }
}

// ---------------------------------------------------------------------------
// Concurrent callers

/// Wraps a call's future and reports, once, that the call has parked: its
/// first poll that did not complete. From a call's start to the in-flight
/// table (where a duplicate waits for the call already running) the
/// wrapper and the engine do not yield, so a duplicate's first `Pending` is
/// its wait for the leader, and the leader's is its request.
struct Parked<F> {
    inner: std::pin::Pin<Box<F>>,
    signal: Option<tokio::sync::mpsc::UnboundedSender<()>>,
}

impl<F: std::future::Future> std::future::Future for Parked<F> {
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let polled = self.inner.as_mut().poll(cx);
        if polled.is_pending() {
            if let Some(signal) = self.signal.take() {
                let _ = signal.send(());
            }
        }
        polled
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_calling_one_operation_apply_it_once() {
    const CALLERS: usize = 32;
    let providers = Providers::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(dir.path()).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let shop = Arc::new(logging_shop(&providers, log.clone()));
    for tool in EFFECT_TOOLS {
        let order = next_order();
        let ctx = rt.run(&format!("crowd-{order}"));
        // The first request that reaches the provider is held there, so
        // every other caller arrives while the operation is in flight.
        let faults = match tool {
            "charge" => providers.payments().faults(),
            "send_email" => providers.email().faults(),
            "open_ticket" => providers.tickets().faults(),
            _ => providers.wire().faults(),
        };
        let gate = faults.hold_next();
        let (parked_tx, mut parked) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..CALLERS {
            // Half of them as subagents: same root run, same operation.
            let ctx = if i % 2 == 0 {
                ctx.clone()
            } else {
                ctx.child(&format!("subagent-{i}"))
            };
            let shop = shop.clone();
            let signal = Some(parked_tx.clone());
            tasks.spawn(async move {
                Parked {
                    inner: Box::pin(async move { shop.run_step(&ctx, tool, order).await }),
                    signal,
                }
                .await
            });
        }
        drop(parked_tx);
        tokio::time::timeout(Duration::from_secs(10), gate.arrived())
            .await
            .expect("the first request reaches the provider");
        // Every caller is inside the call and waiting (the one at the
        // provider included) before the held request may finish: none of
        // them can have come late and replayed a finished operation.
        for n in 0..CALLERS {
            tokio::time::timeout(Duration::from_secs(10), parked.recv())
                .await
                .unwrap_or_else(|_| panic!("{tool}: only {n} of {CALLERS} callers parked"))
                .unwrap_or_else(|| {
                    panic!(
                        "{tool}: a caller returned while the first request was held \
                         ({n} of {CALLERS} parked)"
                    )
                });
        }
        assert!(
            lock(&log)
                .iter()
                .filter(|l| **l == format!("call {tool}"))
                .count()
                == 1,
            "{tool}: a second request while the first is held"
        );
        gate.release();
        let mut results = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            results.push(joined.unwrap().unwrap_or_else(|e| panic!("{tool}: {e:?}")));
        }
        assert_eq!(results.len(), CALLERS);
        assert!(
            results.windows(2).all(|w| w[0] == w[1]),
            "{tool}: callers saw different results"
        );
        assert_eq!(shop::effects(&providers, tool, order), 1, "{tool}");
        let sent = lock(&log)
            .iter()
            .filter(|l| **l == format!("call {tool}"))
            .count();
        assert_eq!(sent, 1, "{tool}: {sent} requests for one operation");
        assert_eq!(faults.pending(), 0);
    }
}

// ---------------------------------------------------------------------------
// Recovery and a request still in flight

/// A journal tool with a short per-attempt timeout, on the testkit's email
/// provider.
struct Mailer {
    email: idem_testkit::EmailClient,
}

#[idem::tool]
impl Mailer {
    #[idem::tool(
        class = "journal",
        key = "to",
        verify = sent,
        timeout = "1s",
        retry(initial = "10ms")
    )]
    async fn send(
        &self,
        ctx: &idem::Ctx,
        to: String,
    ) -> Result<String, idem_testkit::ProviderError> {
        let message = idem_testkit::EmailMessage {
            to,
            subject: "receipt".into(),
            body: "thanks".into(),
        };
        Ok(self
            .email
            .send(ctx.idempotency_key().as_str(), &message)
            .await?
            .id)
    }

    async fn sent(
        &self,
        ctx: &idem::Ctx,
    ) -> Result<idem::Verdict<String>, idem_testkit::ProviderError> {
        let found = self
            .email
            .find_by_key(ctx.idempotency_key().as_str())
            .await?;
        Ok(match found.into_iter().next() {
            Some(m) => idem::Verdict::Landed(m.id),
            None => idem::Verdict::NotLanded,
        })
    }
}

/// A call is dropped (its task aborted, as a crash would end it) while its
/// request is still being processed by the provider, which applies it
/// while the next call of the same key is deciding what to do, well inside
/// the tool's 1 s attempt timeout. The next call finds the INTENT and must
/// not conclude "not landed" while that attempt can still land: one email,
/// not two. (The torture harness hits the same race with SIGKILLed workers
/// and provider processing delays.)
///
/// The held request is released at the worst moment for a correct engine:
/// as soon as the second call says it waits for the dropped attempt to
/// settle (its `Settling` event); an engine that does not wait verifies at
/// once, hears "not landed" and sends again, and the held request is then
/// released when that second call has returned. Either way the ledger is
/// read once the provider has handled the held request, not after a guess.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_does_not_verify_before_the_dropped_attempt_settles() {
    let providers = Providers::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(dir.path()).unwrap();
    let mailer = Arc::new(Mailer {
        email: providers.addrs().clients_with(shop::CLIENT_CONFIG).email,
    });
    let ctx = rt.run("order-1");
    let gate = providers.email().faults().hold_next();
    let first = {
        let (mailer, ctx) = (mailer.clone(), ctx.clone());
        tokio::spawn(async move { mailer.send(&ctx, "ann@example.com".into()).await })
    };
    gate.arrived().await;
    first.abort();
    let _ = first.await;
    let mut live = rt.subscribe();
    let (done, returned) = tokio::sync::oneshot::channel::<()>();
    let second = {
        let (mailer, ctx) = (mailer.clone(), ctx.clone());
        tokio::spawn(async move {
            let out = mailer.send(&ctx, "ann@example.com".into()).await;
            let _ = done.send(());
            out
        })
    };
    let settling = async {
        loop {
            match live.recv().await {
                Ok(e) if matches!(e.kind, EventKind::Settling { .. }) => return true,
                Ok(_) => {}
                Err(e) => panic!("audit subscription: {e}"),
            }
        }
    };
    let waited = tokio::select! {
        waited = settling => waited,
        _ = returned => false,
    };
    gate.release();
    let second = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("the second call returns")
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), gate.handled())
        .await
        .expect("the provider handles the released request");
    let sent = providers.email().ledger();
    assert_eq!(
        sent.len(),
        1,
        "one email expected, got {}: {:?} (second call: {second:?}; it waited to settle: {waited})",
        sent.len(),
        sent.iter().map(|m| &m.id).collect::<Vec<_>>()
    );
    assert!(
        waited,
        "the recovering call never waited for the dropped attempt"
    );
}
