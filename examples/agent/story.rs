//! The demo's choreography: providers in this (parent) process, the agent in
//! worker processes that die and restart, an operator in between, and the
//! evidence printed at the end.
//!
//! The parent re-executes its own binary as a worker (see
//! [`WORKER_ENV`]); the worker narrates on stderr, which the parent reads
//! and prints with a `worker N |` prefix.

// Shared by the example and by tests/demo_workflow.rs.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem::{AuditEvent, EventKind, Resolution, Runtime, Stats, Subscription, ToolError};
use idem_testkit::{Fault, ProviderAddrs, Providers};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::shop::{self, Moment, Shop, Step};

/// Set (to the worker's number) in a worker's environment.
pub const WORKER_ENV: &str = "IDEM_DEMO_WORKER";
const JOURNAL_ENV: &str = "IDEM_DEMO_JOURNAL";
const CRASH_ENV: &str = "IDEM_DEMO_CRASH";
/// Set in a worker that runs the second order, the saga.
const SAGA_ENV: &str = "IDEM_DEMO_SAGA";

/// The demo's one order and its durable workflow id.
pub const ORDER: u64 = 4711;
const RUN_ID: &str = "order-4711";

/// The second order, shipped as a saga, and its run.
pub const SAGA_ORDER: u64 = 4712;
const SAGA_RUN_ID: &str = "order-4712";

/// Worker exit codes.
const DONE: i32 = 0;
const FAILED: i32 = 1;
const PARKED: i32 = 3;
const ROLLED_BACK: i32 = 4;

/// Longest a worker may take before the parent kills it (it needs well under
/// a second; this only keeps a broken build from hanging).
const WATCHDOG: Duration = Duration::from_secs(30);

/// Whether this process was started as a worker.
pub fn is_worker() -> bool {
    std::env::var_os(WORKER_ENV).is_some()
}

// ---------------------------------------------------------------------------
// The worker: runs the workflow once, narrating every step.

/// Runs the workflow for order 4711 and returns the exit code: 0 done,
/// 3 parked on an escalation, 1 failed. With `IDEM_DEMO_CRASH` set it
/// SIGKILLs itself right after the receipt email landed, before idem could
/// write the COMMIT.
pub fn worker_main() -> i32 {
    shop::run_worker(WATCHDOG, FAILED, worker())
}

async fn worker() -> i32 {
    let (Some(journal), Ok(addrs)) = (std::env::var_os(JOURNAL_ENV), ProviderAddrs::from_env())
    else {
        eprintln!("started without {JOURNAL_ENV} and the provider addresses");
        return FAILED;
    };
    let crash = std::env::var_os(CRASH_ENV).is_some();
    // Every worker serves the admin API, so an operator can settle an
    // escalation while it runs (a SIGKILLed one leaves its address file
    // behind; the next one replaces it).
    let rt = match Runtime::builder()
        .path(&journal)
        .admin("127.0.0.1:0")
        .open()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot open the journal: {e}");
            return FAILED;
        }
    };
    let earlier = rt.audit(0).await.map_or(0, |e| e.len());
    if earlier == 0 {
        eprintln!("opened a new journal");
    } else {
        eprintln!("reopened the journal: {earlier} audit events from earlier workers");
    }
    if let Some(url) = rt.admin_url() {
        eprintln!("admin API for operators on {url} (journal/idem-admin-addr says so)");
    }

    // The live audit stream: after each step, what idem decided for it.
    let events = Arc::new(Mutex::new(rt.subscribe()));
    if std::env::var_os(SAGA_ENV).is_some() {
        return saga_worker(&rt, addrs, crash, events).await;
    }
    let hook: shop::Hook = {
        let events = events.clone();
        Arc::new(move |moment, tool, _order| {
            if crash && moment == Moment::Landed && tool == "send_email" {
                say_step(tool, "the email provider accepted the receipt...");
                say_events(&mut lock(&events));
                eprintln!(
                    "  !! the effect has landed and idem has not written COMMIT yet:\n  \
                     !! the worst moment to die. SIGKILL (no cleanup, no flush)."
                );
                shop::sigkill_self();
            }
        })
    };
    let shop = Shop::with_hook(addrs, hook);
    let ctx = rt.run(RUN_ID);
    let mut narrate = |step: Step<'_>| {
        let (tool, line) = describe(&step);
        say_step(tool, &line);
        say_events(&mut lock(&events));
    };
    // Subscribed before the workflow runs: an operator's answer cannot
    // slip between the escalation and the wait for it.
    let mut answers = rt.subscribe();
    loop {
        match shop.process_order(&ctx, ORDER, &mut narrate).await {
            Ok(_) => {
                eprintln!("order {ORDER} processed: all five steps done");
                return DONE;
            }
            Err(stopped) => match &stopped.error {
                ToolError::Escalated { key, .. } => {
                    say_step(stopped.tool, "parked: waiting for a human");
                    say_events(&mut lock(&events));
                    eprintln!("{WAITING}; the worker keeps running");
                    if !wait_for_operator(&mut answers, key).await {
                        eprintln!("no operator answered; exiting");
                        return PARKED;
                    }
                    say_events(&mut lock(&events));
                    eprintln!("an operator answered: running the workflow again from the top");
                }
                other => {
                    say_events(&mut lock(&events));
                    eprintln!("{} failed: {other}", stopped.tool);
                    return FAILED;
                }
            },
        }
    }
}

/// The second order as a saga: the courier is booked and the card charged,
/// then the supplier's bank refuses the payment and idem rolls back. With
/// `crash`, the worker SIGKILLs itself right after the refund landed,
/// before idem wrote its COMMIT.
async fn saga_worker(
    rt: &Runtime,
    addrs: ProviderAddrs,
    crash: bool,
    events: Arc<Mutex<Subscription>>,
) -> i32 {
    let hook: shop::Hook = {
        let events = events.clone();
        Arc::new(move |moment, tool, _order| {
            if moment == Moment::Landed {
                let what = match tool {
                    "book_courier" => "the courier is booked",
                    "pay" => "the card is charged",
                    "refund" => "the charge is refunded",
                    "cancel_courier" => "the courier is cancelled",
                    _ => "done",
                };
                say_step(tool, what);
                say_events(&mut lock(&events));
            }
            if crash && moment == Moment::Landed && tool == "refund" {
                eprintln!(
                    "  !! mid-rollback: the refund has landed and idem has not written its \
                     COMMIT.\n  !! SIGKILL (no cleanup, no flush)."
                );
                shop::sigkill_self();
            }
        })
    };
    let shop = Arc::new(Shop::with_hook(addrs, hook));
    let ctx = rt.run(SAGA_RUN_ID);
    let result = shop::ship_order(&shop, &ctx, SAGA_ORDER).await;
    say_events(&mut lock(&events));
    match result {
        Ok(shipped) => {
            eprintln!(
                "order {SAGA_ORDER} shipped: {} {}",
                shipped.charge.id, shipped.supplier.id
            );
            DONE
        }
        Err(ToolError::Compensated { saga, reason }) => {
            eprintln!("saga {saga} rolled back: {}", short(&reason));
            eprintln!("every completed step was undone, each exactly once");
            ROLLED_BACK
        }
        Err(other) => {
            eprintln!("the saga stopped: {other}");
            FAILED
        }
    }
}

/// What a worker says when it waits for an operator (the parent watches
/// for it).
const WAITING: &str = "waiting for an operator (idem escalations, or the inbox)";

/// Waits until an operator resolves `key` (through the admin API, here).
async fn wait_for_operator(answers: &mut Subscription, key: &idem::IdemKey) -> bool {
    loop {
        match answers.recv().await {
            Ok(e) if e.key.as_deref() == Some(key.as_str()) => {
                if matches!(
                    e.kind,
                    EventKind::Resolved { .. } | EventKind::Amended { .. }
                ) {
                    return true;
                }
            }
            Ok(_) | Err(idem::SubscriptionError::Lagged { .. }) => {}
            Err(idem::SubscriptionError::Closed) => return false,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn class_of(tool: &str) -> &'static str {
    match tool {
        "lookup_order" => "read_only",
        "charge" => "provider",
        "send_email" | "open_ticket" => "journal",
        "refund_wire" | "pay_supplier" => "at_most_once",
        "pay" | "refund" => "provider",
        "book_courier" | "cancel_courier" => "journal",
        _ => "",
    }
}

fn say_step(tool: &str, what: &str) {
    eprintln!("{tool:<13} {:<13} {what}", class_of(tool));
}

fn money(cents: u64) -> String {
    format!("{}.{:02} EUR", cents / 100, cents % 100)
}

fn describe(step: &Step<'_>) -> (&'static str, String) {
    match step {
        Step::Order(o) => (
            "lookup_order",
            format!(
                "order {}: {} from {} <{}>",
                o.id,
                money(o.amount_cents),
                o.customer,
                o.email
            ),
        ),
        Step::Charge(c) => ("charge", format!("charged {} as {}", money(c.amount), c.id)),
        Step::Email(m) => ("send_email", format!("receipt to {} is {}", m.to, m.id)),
        Step::Ticket(t) => ("open_ticket", format!("ticket {} \"{}\"", t.id, t.title)),
        Step::Wire(w) => (
            "refund_wire",
            format!("wired {} to {} as {}", money(w.amount), w.to_account, w.id),
        ),
    }
}

/// Prints the audit events that arrived since the last call, as one chain.
fn say_events(events: &mut Subscription) {
    let mut chain = Vec::new();
    while let Some(Ok(event)) = events.try_recv() {
        chain.push(phrase(&event.kind));
    }
    if chain.is_empty() {
        return;
    }
    // Wrapped so that a line stays readable in an 100-column terminal.
    let mut line = String::from("   idem:");
    for (i, part) in chain.iter().enumerate() {
        let sep = if i == 0 { " " } else { " -> " };
        if line.len() + sep.len() + part.len() > 96 && line.trim() != "idem:" {
            eprintln!("{line}");
            line = String::from("        ");
            line.push_str(sep.trim_start());
        } else {
            line.push_str(sep);
        }
        line.push_str(part);
    }
    eprintln!("{line}");
}

/// A short phrase for an audit event.
pub fn phrase(kind: &EventKind) -> String {
    match kind {
        EventKind::Intent { .. } => "INTENT".into(),
        EventKind::Attempt { attempt } => format!("attempt {attempt}"),
        EventKind::Retry {
            delay_ms,
            failure,
            error,
            ..
        } => format!(
            "{failure} failure ({}), retry in {delay_ms} ms",
            short(error)
        ),
        EventKind::Committed { via, .. } => match via.as_str() {
            "verify" => "COMMIT (result found by verify)".into(),
            "operator" => "COMMIT (the operator's answer)".into(),
            _ => "COMMIT".into(),
        },
        EventKind::Rejected { error } => format!("rejected ({})", short(error)),
        EventKind::Failed { error } => format!("failed ({})", short(error)),
        EventKind::DedupeHit => "already committed: replayed, provider not called".into(),
        EventKind::ProviderReplay { .. } => {
            "the provider replayed its saved answer (Idempotent-Replayed)".into()
        }
        EventKind::Recovered { state, attempts } => {
            format!("found an unfinished call ({state}, {attempts} attempt(s)) of a dead worker")
        }
        EventKind::Verified { verdict } => format!("verify says {}", verdict.replace('_', " ")),
        EventKind::ArgsDrift { .. } => "arguments drifted from the first call".into(),
        EventKind::Escalated { .. } => "ESCALATED to a human".into(),
        EventKind::Resolved { resolution, .. } => format!("resolved by an operator: {resolution}"),
        EventKind::Amended { resolution, .. } => {
            format!("an operator amended the resolution: {resolution}")
        }
        EventKind::Fenced { .. } => "a stale worker's write was refused (another took over)".into(),
        EventKind::Settling { wait_ms } => {
            format!("waits {wait_ms} ms for the provider to settle before verify")
        }
        EventKind::Refused { reason } => format!("refused: {reason}"),
        EventKind::StepRecorded => "step recorded".into(),
        EventKind::StepReplayed => "step replayed".into(),
        EventKind::SagaStarted { saga } => format!("saga {saga} started"),
        EventKind::Compensating { steps, .. } => {
            format!("ROLLING BACK {} step(s), last first", steps.len())
        }
        EventKind::Compensated { undone, .. } => {
            format!("rolled back: {} step(s) undone", undone.len())
        }
        EventKind::SagaEscalated { .. } => "saga ESCALATED to a human".into(),
        // Kinds a later idem adds.
        other => format!("{other:?}"),
    }
}

/// The gist of a provider error's debug text.
fn short(error: &str) -> String {
    let gist = if error.starts_with("Connection") {
        "connection lost after sending".to_string()
    } else if let Some(rest) = error.strip_prefix("Status { status: ") {
        format!("HTTP {}", rest.split(',').next().unwrap_or("?"))
    } else if error.starts_with("Timeout") {
        "no answer in time".to_string()
    } else {
        error.chars().take(40).collect()
    };
    gist
}

// ---------------------------------------------------------------------------
// The parent: providers, workers, operator, evidence.

/// What the demo observed; the verdict is `pass`.
#[derive(Debug, Default)]
pub struct Report {
    /// How each worker ended, in order.
    pub workers: Vec<WorkerEnd>,
    /// Effects applied by each provider for order 4711.
    pub charges: usize,
    pub emails: usize,
    pub tickets: usize,
    pub wires: usize,
    /// For the saga's order 4712: charges, refunds, couriers booked,
    /// cancellations, supplier payments.
    pub saga: [usize; 5],
    /// Operations applied more than once, by the providers' own count.
    pub duplicates: usize,
    /// Escalations an operator resolved.
    pub resolved: usize,
    /// Durable audit events at the end.
    pub audit_events: usize,
    pub stats: Stats,
    /// Every expectation held.
    pub pass: bool,
    /// Expectations that did not hold.
    pub problems: Vec<String>,
}

/// How a worker process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerEnd {
    Exited(i32),
    Signal(i32),
    Watchdog,
}

impl std::fmt::Display for WorkerEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkerEnd::Exited(DONE) => write!(f, "exited: workflow done"),
            WorkerEnd::Exited(PARKED) => write!(f, "exited: workflow parked on an escalation"),
            WorkerEnd::Exited(ROLLED_BACK) => write!(f, "exited: saga rolled back"),
            WorkerEnd::Exited(code) => write!(f, "exited with code {code} (failure)"),
            WorkerEnd::Signal(9) => write!(f, "killed by SIGKILL (signal 9)"),
            WorkerEnd::Signal(s) => write!(f, "killed by signal {s}"),
            WorkerEnd::Watchdog => write!(f, "stuck; killed by the parent's watchdog"),
        }
    }
}

/// The demo's entry point: parses `--journal DIR`, runs the story, prints
/// it to stdout, returns the process exit code.
pub fn parent_main(args: &[String], worker: &dyn Fn() -> std::process::Command) -> i32 {
    let mut keep: Option<PathBuf> = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--journal" => keep = it.next().map(PathBuf::from),
            "-h" | "--help" => {
                println!(
                    "cargo run --example agent [-- --journal DIR]\n\n\
                     Runs an order workflow in worker processes that crash and restart.\n\
                     --journal DIR  keep the journal (DIR/journal) and the audit log\n\
                     \x20              (DIR/audit.jsonl) in DIR, which must not exist yet"
                );
                return 0;
            }
            other => {
                eprintln!("unknown argument {other:?}; try --help");
                return 2;
            }
        }
    }
    let _temp;
    let dir = match keep {
        Some(dir) => {
            if dir.exists() {
                eprintln!(
                    "{} exists; the demo needs a fresh directory (its story starts from an empty journal)",
                    dir.display()
                );
                return 2;
            }
            dir
        }
        None => match tempfile::Builder::new().prefix("idem-demo-").tempdir() {
            Ok(t) => {
                let p = t.path().to_path_buf();
                _temp = t;
                p
            }
            Err(e) => {
                eprintln!("cannot create a temporary directory: {e}");
                return 2;
            }
        },
    };
    let mut stdout = std::io::stdout();
    match run(&dir, worker, &mut stdout) {
        Ok(report) if report.pass => 0,
        Ok(_) => 1,
        Err(e) => {
            eprintln!("demo failed: {e}");
            1
        }
    }
}

/// Runs the story in `dir` (journal in `dir/journal`), printing to `out`.
pub fn run(
    dir: &Path,
    worker: &dyn Fn() -> std::process::Command,
    out: &mut dyn Write,
) -> Result<Report, Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(story(dir, worker, out))
}

struct Out<'a>(&'a mut dyn Write);

impl Out<'_> {
    fn line(&mut self, text: impl AsRef<str>) {
        let _ = writeln!(self.0, "{}", text.as_ref());
        let _ = self.0.flush();
    }

    fn section(&mut self, title: &str) {
        self.line("");
        self.line(format!(
            "== {title} {}",
            "=".repeat(76usize.saturating_sub(title.len()))
        ));
    }
}

async fn story(
    dir: &Path,
    worker: &dyn Fn() -> std::process::Command,
    out: &mut dyn Write,
) -> Result<Report, Box<dyn std::error::Error>> {
    let started = Instant::now();
    let mut out = Out(out);
    let mut report = Report::default();
    let journal = dir.join("journal");

    out.line("idem demo: an agent processes order 4711, crashes at the worst moment, and");
    out.line(
        "restarts. Nothing is charged, emailed, ticketed or wired twice, and nothing is lost.",
    );

    out.section("1. Setup");
    let providers = Providers::start().await?;
    let addrs = providers.addrs();
    out.line(format!(
        "  providers (fake, real HTTP, in this process): payments {}, email {},",
        addrs.payments, addrs.email
    ));
    out.line(format!(
        "    tickets {}, wire {}; each keeps its own ledger of effects",
        addrs.tickets, addrs.wire
    ));
    out.line(format!(
        "  journal (embedded sled, nothing to install): {}",
        journal.display()
    ));
    out.line("  every journaled call: INTENT fsynced before the provider is called, COMMIT after");
    out.line(
        "    (the saga's book_courier and pay: commit = \"eventual\", COMMIT on the next fsync)",
    );
    out.line("  the agent runs in worker processes (this binary, re-executed); faults scripted:");
    providers
        .payments()
        .faults()
        .push(Fault::disconnect_after_apply());
    out.line("    - payments charges the card, then the connection drops before the answer");
    out.line("    - worker 1 SIGKILLs itself right after the receipt email landed");
    providers
        .tickets()
        .faults()
        .push(Fault::error_before_apply(503));
    out.line("    - tickets answers 503 once (nothing created, but the agent cannot know that)");
    providers
        .wire()
        .faults()
        .push(Fault::disconnect_after_apply());
    out.line("    - the bank executes the wire, then the connection drops before the answer");

    out.section("2. Worker 1 runs the workflow and dies at the worst moment");
    let end = run_worker(1, CRASHING, &journal, &addrs, worker, &mut out).await?;
    report.workers.push(end);
    out.line(format!("  worker 1 {end}"));
    out.line(format!(
        "  providers so far: {}; the journal still says INTENT for the email",
        tally(&providers)
    ));

    out.section("3. Worker 2 restarts from the journal; the wire waits for a human");
    let mut worker2 = start_worker(2, STEADY, &journal, &addrs, worker, &mut out)?;
    let waiting = worker2.narrate_until(&mut out, WAITING).await;

    out.section("4. An operator settles it through the admin API while worker 2 waits");
    if waiting {
        operate(&journal, &providers, &mut report, &mut out).await?;
    } else {
        out.line("  worker 2 never waited for an operator");
    }

    out.section("5. Worker 2 goes on with the operator's answer");
    let end = worker2.finish(&mut out).await?;
    report.workers.push(end);
    out.line(format!("  worker 2 {end}"));

    out.section("6. A second order as a saga: refused at its last step, rolled back");
    out.line(format!(
        "  order {SAGA_ORDER} books a courier (journal), charges the card (provider), then pays"
    ));
    out.line(
        "  the supplier (at_most_once), whose bank refuses: the account is closed. idem undoes",
    );
    out.line("  the completed steps last first: refund the charge, cancel the courier. Worker 3");
    out.line("  SIGKILLs itself right after the refund landed; worker 4 resumes the rollback.");
    let saga_mode = |crash| Mode { crash, saga: true };
    let end = run_worker(3, saga_mode(true), &journal, &addrs, worker, &mut out).await?;
    report.workers.push(end);
    out.line(format!("  worker 3 {end}"));
    let end = run_worker(4, saga_mode(false), &journal, &addrs, worker, &mut out).await?;
    report.workers.push(end);
    out.line(format!("  worker 4 {end}"));

    out.section("7. Ground truth: the providers' own ledgers");
    report.charges = shop::effects(&providers, "charge", ORDER);
    report.emails = shop::effects(&providers, "send_email", ORDER);
    report.tickets = shop::effects(&providers, "open_ticket", ORDER);
    report.wires = shop::effects(&providers, "refund_wire", ORDER);
    report.duplicates = providers.duplicates().len();
    for c in providers.payments().ledger() {
        out.line(format!(
            "  payments  {}  order {}  {:>10}  {:?}  key {}",
            c.charge_id,
            c.order_id,
            money(c.amount),
            c.outcome,
            abbreviate(c.idempotency_key.as_deref().unwrap_or("-"))
        ));
    }
    for m in providers.email().ledger() {
        out.line(format!(
            "  email     {}  to {}  \"{}\"  X-Idem-Key {}",
            m.id,
            m.to,
            m.subject,
            abbreviate(m.key.as_deref().unwrap_or("-"))
        ));
    }
    for t in providers.tickets().ledger() {
        out.line(format!(
            "  tickets   {}  \"{}\"  external_ref {}",
            t.id,
            t.title,
            abbreviate(&t.external_ref)
        ));
    }
    for w in providers.wire().ledger() {
        out.line(format!(
            "  wire      {}  {}  to {}  reference {}",
            w.id,
            money(w.amount),
            w.to_account,
            w.reference
        ));
    }
    for r in providers.refunds() {
        out.line(format!(
            "  refunds   {}  of {}  order {}  {:>10}  key {}",
            r.refund_id,
            r.charge_id,
            r.order_id,
            money(r.amount),
            abbreviate(r.idempotency_key.as_deref().unwrap_or("-"))
        ));
    }
    for c in providers.cancellations() {
        out.line(format!(
            "  tickets   {} cancels {}  reference {}",
            c.id,
            c.ticket_id,
            abbreviate(&c.reference)
        ));
    }
    out.line(format!(
        "  per operation: {} charge, {} email, {} ticket, {} wire; providers.duplicates(): {}",
        report.charges, report.emails, report.tickets, report.wires, report.duplicates
    ));
    report.saga = saga_effects(&providers);
    let [charged, refunded, booked, cancelled, paid] = report.saga;
    out.line(format!(
        "  order {SAGA_ORDER}: {charged} charge, {refunded} refund, {booked} courier, \
         {cancelled} cancellation, {paid} supplier payment"
    ));

    out.section("8. The audit stream: every decision, durable (rt.audit(0))");
    let rt = Runtime::open(&journal)?;
    let events: Vec<AuditEvent> = rt.audit(0).await?;
    report.audit_events = events.len();
    out.line("  (one stream across every worker process: sequence numbers keep increasing)");
    out.line(format!("  {:>8}  {:<13} {:<9} event", "seq", "tool", "by"));
    for e in &events {
        out.line(format!(
            "  {:>8}  {:<13} {:<9} {}",
            e.seq,
            e.tool,
            if e.agent == "operator" {
                "operator"
            } else {
                "agent"
            },
            phrase(&e.kind)
        ));
    }
    let jsonl = dir.join("audit.jsonl");
    let mut file = std::fs::File::create(&jsonl)?;
    let exported = rt.export_audit(0, &mut file).await?;
    out.line(format!(
        "  rt.export_audit(0, ..) wrote {exported} JSON lines to {}; the first:",
        jsonl.display()
    ));
    if let Some(first) = events.first() {
        out.line(format!("  {}", first.to_json_line()));
    }

    out.section("9. Per-tool counts (rt.stats())");
    report.stats = rt.stats().await?;
    // The table `idem stats` prints.
    let view = idem::admin::StatsView {
        stats: report.stats.clone(),
        journal_bytes: rt.size_on_disk().await?,
    };
    for line in idem_cli::render::stats(&view).lines() {
        out.line(format!("  {line}").trim_end());
    }
    out.line(
        "  (read_only calls are counted per process and not journaled: this process made none)",
    );
    out.line("");
    out.line("  the tools: examples/agent/shop.rs; this story: examples/agent/story.rs");

    check(&mut report, &events);
    out.line("");
    let verdict = format!(
        "{} charge, {} email, {} ticket, {} wire for order {ORDER}; order {SAGA_ORDER} rolled \
         back with {} refund and {} cancellation; {} duplicate(s); survived {} SIGKILL; {} \
         escalation(s) resolved by an operator; {:.1} s",
        report.charges,
        report.emails,
        report.tickets,
        report.wires,
        report.saga[1],
        report.saga[3],
        report.duplicates,
        report
            .workers
            .iter()
            .filter(|w| **w == WorkerEnd::Signal(9))
            .count(),
        report.resolved,
        started.elapsed().as_secs_f64()
    );
    if report.pass {
        out.line(format!("VERDICT: PASS. {verdict}"));
    } else {
        out.line(format!("VERDICT: FAIL. {verdict}"));
        for p in &report.problems {
            out.line(format!("  - {p}"));
        }
    }
    Ok(report)
}

/// Every expectation of the story, from the workers' ends, the ledgers and
/// the audit stream.
fn check(report: &mut Report, events: &[AuditEvent]) {
    let mut problems = Vec::new();
    let expected = [
        WorkerEnd::Signal(9),
        WorkerEnd::Exited(DONE),
        WorkerEnd::Signal(9),
        WorkerEnd::Exited(ROLLED_BACK),
    ];
    if report.workers != expected {
        problems.push(format!(
            "workers ended {:?}, expected {expected:?}",
            report.workers
        ));
    }
    for (what, n) in [
        ("charges", report.charges),
        ("emails", report.emails),
        ("tickets", report.tickets),
        ("wires", report.wires),
    ] {
        if n != 1 {
            problems.push(format!("{n} {what} for order {ORDER}, expected exactly 1"));
        }
    }
    if report.saga != [1, 1, 1, 1, 0] {
        problems.push(format!(
            "order {SAGA_ORDER}: [charges, refunds, couriers, cancellations, supplier payments] \
             = {:?}, expected [1, 1, 1, 1, 0]",
            report.saga
        ));
    }
    if report.duplicates != 0 {
        problems.push(format!("{} duplicated operations", report.duplicates));
    }
    if report.resolved != 1 {
        problems.push(format!(
            "{} escalations resolved, expected 1",
            report.resolved
        ));
    }
    let mut seen: BTreeMap<(&str, String), usize> = BTreeMap::new();
    for e in events {
        let label = match &e.kind {
            EventKind::Verified { verdict } => format!("verified:{verdict}"),
            EventKind::Committed { via, .. } => format!("committed:{via}"),
            EventKind::ProviderReplay { .. } => "provider_replay".into(),
            EventKind::DedupeHit => "dedupe_hit".into(),
            EventKind::Escalated { .. } => "escalated".into(),
            EventKind::Resolved { resolution, .. } => format!("resolved:{resolution}"),
            EventKind::Compensating { .. } => "compensating".into(),
            EventKind::Compensated { .. } => "compensated".into(),
            EventKind::Rejected { .. } => "rejected".into(),
            _ => continue,
        };
        *seen.entry((e.tool.as_str(), label)).or_default() += 1;
    }
    for (tool, label, why) in [
        (
            "charge",
            "provider_replay",
            "the lost charge answer was replayed by payments",
        ),
        (
            "charge",
            "dedupe_hit",
            "the restarted worker replayed the charge from the journal",
        ),
        (
            "send_email",
            "verified:landed",
            "verify found the email of the killed worker",
        ),
        (
            "send_email",
            "committed:verify",
            "the email was committed from verify's answer",
        ),
        (
            "open_ticket",
            "verified:not_landed",
            "verify saw that the 503 created no ticket",
        ),
        (
            "refund_wire",
            "escalated",
            "the ambiguous wire was escalated, not re-sent",
        ),
        (
            "refund_wire",
            "resolved:landed",
            "the operator answered from the bank statement",
        ),
        (
            "pay_supplier",
            "rejected",
            "the supplier's bank refused the payment",
        ),
        (
            "saga:ship",
            "compensating",
            "the refusal decided a rollback",
        ),
        (
            "refund",
            "provider_replay",
            "the refund of the killed worker was replayed by payments",
        ),
        (
            "cancel_courier",
            "committed:call",
            "the resumed rollback cancelled the courier",
        ),
        (
            "saga:ship",
            "compensated",
            "every completed step of the saga was undone",
        ),
    ] {
        if !seen.contains_key(&(tool, label.to_string())) {
            problems.push(format!(
                "no {label} event for {tool}: expected because {why}"
            ));
        }
    }
    // An operator's `Landed` is a commit too (`Committed { via: operator }`).
    for tool in shop::EFFECT_TOOLS {
        let commits = seen
            .iter()
            .filter(|((t, l), _)| *t == tool && l.starts_with("committed:"))
            .map(|(_, n)| n)
            .sum::<usize>();
        if commits != 1 {
            problems.push(format!("{tool} committed {commits} times, expected once"));
        }
    }
    report.pass = problems.is_empty();
    report.problems = problems;
}

/// The operator's side of section 4: what `idem` shows and does, through
/// the same client library the CLI is made of.
async fn operate(
    journal: &Path,
    providers: &Providers,
    report: &mut Report,
    out: &mut Out<'_>,
) -> Result<(), Box<dyn std::error::Error>> {
    let dir = journal.display();
    let backend = idem_cli::Backend::discover(journal, None).await?;
    if let idem_cli::Backend::Remote(client) = &backend {
        out.line(format!(
            "  the journal is held by worker 2, whose admin API is on {} (found through",
            client.url()
        ));
        out.line("  journal/idem-admin-addr; the bearer token is journal/idem-admin-token)");
    }
    out.line("");
    out.line(format!("  $ idem --journal {dir} escalations"));
    let escalations = backend.escalations().await?;
    for line in idem_cli::render::escalations(&escalations, idem_cli::render::now_ms()).lines() {
        out.line(format!("  {line}"));
    }
    for esc in &escalations {
        // The operator's evidence: the bank statement (the provider's
        // ledger), searched by the payment reference.
        let reference = shop::wire_reference(ORDER);
        let statement: Vec<_> = providers
            .wire()
            .ledger()
            .into_iter()
            .filter(|w| w.reference == reference)
            .collect();
        out.line("");
        out.line(format!(
            "  the operator checks the bank statement: {} wire(s) with reference {reference}",
            statement.len()
        ));
        let (request, flag) = match statement.first() {
            Some(wire) => {
                let json = serde_json::to_string(wire)?;
                (
                    idem::admin::ResolveRequest::new(
                        &Resolution::Landed(Some(serde_json::to_value(wire)?)),
                        format!("bank statement shows {} for {reference}", wire.id),
                    ),
                    format!("--landed '{json}'"),
                )
            }
            None => (
                idem::admin::ResolveRequest::new(
                    &Resolution::Reissue,
                    format!("no wire with reference {reference} on the bank statement"),
                ),
                "--reissue".to_string(),
            ),
        };
        out.line(format!("  $ idem --journal {dir} resolve {} \\", esc.key));
        out.line(format!("      {flag} \\"));
        out.line(format!("      --note \"{}\"", request.note));
        let resolved = backend.resolve(esc.key.as_str(), &request).await?;
        for line in idem_cli::render::resolved(&resolved).lines() {
            out.line(format!("  {line}"));
        }
        report.resolved += 1;
    }
    out.line("");
    out.line("  the worker heard the resolution on its audit stream and goes on by itself; the");
    out.line(
        "  same can be done in a browser (the inbox at the admin API's address) and watched with",
    );
    out.line(format!(
        "  $ idem --journal {dir} audit --from end --follow"
    ));
    Ok(())
}

/// The saga's order at the providers: charges, refunds, couriers booked,
/// cancellations, supplier payments.
fn saga_effects(providers: &Providers) -> [usize; 5] {
    let courier = format!("courier, order {SAGA_ORDER}");
    let supplier = format!("supplier, order {SAGA_ORDER}");
    [
        shop::effects(providers, "charge", SAGA_ORDER),
        providers
            .refunds()
            .iter()
            .filter(|r| r.order_id == SAGA_ORDER)
            .count(),
        providers
            .tickets()
            .ledger()
            .iter()
            .filter(|t| t.title == courier)
            .count(),
        providers.cancellations().len(),
        providers
            .wire()
            .ledger()
            .iter()
            .filter(|w| w.reference == supplier)
            .count(),
    ]
}

fn tally(providers: &Providers) -> String {
    format!(
        "{} charge(s), {} email(s), {} ticket(s), {} wire(s)",
        providers.payments().ledger().len(),
        providers.email().ledger().len(),
        providers.tickets().ledger().len(),
        providers.wire().ledger().len()
    )
}

/// `charge-1a2b3c4d…-g0`: enough of a key to tell keys apart by eye.
fn abbreviate(key: &str) -> String {
    match key.rsplit_once("-g") {
        Some((head, generation)) if head.len() > 64 => {
            format!("{}…-g{generation}", &head[..head.len() - 56])
        }
        _ => key.to_string(),
    }
}

/// Starts worker `n`, prints its narration as it comes, and reports how it
/// ended. The parent kills it if it outlives [`WATCHDOG`].
async fn run_worker(
    n: u32,
    mode: Mode,
    journal: &Path,
    addrs: &ProviderAddrs,
    worker: &dyn Fn() -> std::process::Command,
    out: &mut Out<'_>,
) -> Result<WorkerEnd, Box<dyn std::error::Error>> {
    start_worker(n, mode, journal, addrs, worker, out)?
        .finish(out)
        .await
}

const CRASHING: Mode = Mode {
    crash: true,
    saga: false,
};
const STEADY: Mode = Mode {
    crash: false,
    saga: false,
};

/// A running worker and its narration.
struct Running {
    n: u32,
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStderr>>,
    deadline: tokio::time::Instant,
}

/// What a worker runs, and whether it dies at the worst moment.
#[derive(Debug, Clone, Copy)]
struct Mode {
    crash: bool,
    saga: bool,
}

fn start_worker(
    n: u32,
    mode: Mode,
    journal: &Path,
    addrs: &ProviderAddrs,
    worker: &dyn Fn() -> std::process::Command,
    out: &mut Out<'_>,
) -> Result<Running, Box<dyn std::error::Error>> {
    let mut command = tokio::process::Command::from(worker());
    command
        .env(WORKER_ENV, n.to_string())
        .env(JOURNAL_ENV, journal)
        .envs(addrs.to_env())
        .env_remove(idem::admin::TOKEN_ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (set, var) in [(mode.crash, CRASH_ENV), (mode.saga, SAGA_ENV)] {
        if set {
            command.env(var, "1");
        } else {
            command.env_remove(var);
        }
    }
    let mut child = command.spawn()?;
    out.line(format!(
        "  worker {n} started (pid {})",
        child.id().unwrap_or_default()
    ));
    let Some(stderr) = child.stderr.take() else {
        return Err("no pipe to the worker".into());
    };
    Ok(Running {
        n,
        child,
        lines: BufReader::new(stderr).lines(),
        deadline: tokio::time::Instant::now() + WATCHDOG,
    })
}

impl Running {
    /// Prints the narration until a line containing `marker` (true) or the
    /// worker's end (false).
    async fn narrate_until(&mut self, out: &mut Out<'_>, marker: &str) -> bool {
        while let Ok(Ok(Some(line))) =
            tokio::time::timeout_at(self.deadline, self.lines.next_line()).await
        {
            out.line(format!("  worker {} | {line}", self.n));
            if line.contains(marker) {
                return true;
            }
        }
        false
    }

    /// Prints the rest of the narration and reports how the worker ended.
    async fn finish(mut self, out: &mut Out<'_>) -> Result<WorkerEnd, Box<dyn std::error::Error>> {
        let n = self.n;
        let lines = &mut self.lines;
        let child = &mut self.child;
        let finished = tokio::time::timeout_at(self.deadline, async {
            while let Ok(Some(line)) = lines.next_line().await {
                out.line(format!("  worker {n} | {line}"));
            }
            child.wait().await
        })
        .await;
        Ok(match finished {
            Ok(status) => end_of(status?),
            Err(_) => {
                let _ = self.child.kill().await;
                WorkerEnd::Watchdog
            }
        })
    }
}

fn end_of(status: std::process::ExitStatus) -> WorkerEnd {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return WorkerEnd::Signal(signal);
        }
    }
    WorkerEnd::Exited(status.code().unwrap_or(-1))
}
