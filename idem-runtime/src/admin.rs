//! The admin API (feature `admin`): a running process serves its journal to
//! operators over HTTP, so that nobody has to stop the agent to settle an
//! escalation.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), idem_runtime::Error> {
//! use idem_runtime::Runtime;
//!
//! // Inside a tokio runtime: the server runs on it.
//! let rt = Runtime::builder()
//!     .path("./idem-journal")
//!     .admin("127.0.0.1:0") // any free port on loopback
//!     .open()?;
//! println!("operators: {}", rt.admin_url().unwrap_or_default());
//! # Ok(())
//! # }
//! ```
//!
//! # Routes
//!
//! | route | answer |
//! |---|---|
//! | `GET /v1/tools` | the program's tools ([`ToolInfo`]), each with its latest committed result as an example of its result's shape |
//! | `GET /v1/escalations` | every parked operation, oldest first ([`Escalation`]) |
//! | `GET /v1/ops/{key}` | one operation and its whole audit history ([`OperationView`]) |
//! | `POST /v1/ops/{key}/resolve` | settles it through [`Runtime::resolve`](crate::Runtime::resolve) ([`ResolveRequest`] in, [`Resolved`] out) |
//! | `GET /v1/approvals` | every call awaiting a person's approval, oldest first ([`Approval`](crate::Approval)) |
//! | `POST /v1/ops/{key}/approve` | approves it through [`Runtime::approve`](crate::Runtime::approve) ([`DecisionRequest`] in, [`Decided`] out) |
//! | `POST /v1/ops/{key}/reject` | refuses it through [`Runtime::reject`](crate::Runtime::reject) (same shapes; the note is what the agent reads) |
//! | `GET /v1/sagas` | every saga the journal holds, oldest start first ([`SagaView`](crate::SagaView)): running, compensating, compensated or escalated, with why, the steps undone and what is left (see [`Runtime::sagas`](crate::Runtime::sagas)) |
//! | `GET /v1/audit?from=N` | the durable audit stream from `N` (or `end`) as JSON lines; `&limit=M` stops after `M`; `&follow=true` keeps streaming events as they become durable |
//! | `POST /v1/prune` | [`Runtime::prune`](crate::Runtime::prune) ([`PruneView`]) |
//! | `GET /v1/stats` | per-tool counts and the journal's size ([`StatsView`]) |
//! | `GET /metrics` | this worker's metrics in Prometheus' text format (see below); needs the token unless [`AdminOptions::public_metrics`] |
//! | `GET /healthz` | `{"status":"ok"}`, without a token; with `?challenge=HEX`, also the proof that the server holds the token (see [`proof`]) |
//! | `GET /` | the escalation inbox, a page for people (it asks for the token) |
//!
//! Every `/v1/` route needs `Authorization: Bearer TOKEN`. The token is
//! [`TOKEN_ENV`] when set (or [`AdminOptions::token`]), else the contents of
//! [`TOKEN_FILE`] in the journal directory, generated on first start (32
//! random bytes as hex, mode 0600; a token file others can read is refused).
//! A worker without a journal directory (PostgreSQL) keeps its files in a
//! directory of its own named after its worker id, in the [`workers`]
//! directory (made with mode 0700), where `idem --worker ID` finds them.
//! Errors are a 4xx or 5xx status with an [`ApiError`] body that says what
//! was wrong; a refused request writes nothing.
//!
//! The server writes [`ADDRESS_FILE`] ([`AddressFile`]) beside the token once
//! it listens, so that tools that know the journal directory (the `idem`
//! CLI) find the process; it removes the file when it stops. It stops when
//! the last `Runtime` handle (and every `Ctx`) is dropped: it holds no
//! reference that would keep the journal open.
//!
//! It listens on loopback unless [`AdminOptions::allow_remote`] says
//! otherwise: plain HTTP, no TLS.
//!
//! # Metrics
//!
//! `GET /metrics` answers in Prometheus' text exposition format (version
//! 0.0.4). The counters and histograms are this worker's: the calls made
//! through this `Runtime` (its clones and `Ctx`s included) since it was
//! opened, which for a worker process is since it started; they start
//! from zero in every process and are not read back from the journal, so
//! the workers of one PostgreSQL journal each count their own calls
//! (`sum()` them in Prometheus). Label values are escaped as the format
//! says (backslash, double quote, line feed).
//!
//! | series | type | labels | what |
//! |---|---|---|---|
//! | `idem_calls_total` | counter | `tool`, `class`, `outcome` | calls that returned (or were dropped), by how: `ok`, `tool_error` (the tool's own error), `escalated`, `in_flight`, `args_mismatch`, `abandoned`, `timed_out` (the retry budget ran out), `rejected` / `failed` (a replay of an operation the provider refused / that never landed), `error` (any other journal error), `cancelled` (the call's future was dropped before it returned); a series appears once it is non-zero |
//! | `idem_attempts_total` | counter | `tool`, `class` | attempts that called the tool's body |
//! | `idem_dedupe_hits_total` | counter | `tool` | calls answered from the journal without calling the provider |
//! | `idem_provider_replays_total` | counter | `tool` | responses the provider reported as replays of our key (`Ctx::mark_provider_replay`) |
//! | `idem_verify_total` | counter | `tool`, `verdict` | `verify`'s answers: `landed`, `not_landed`, `unknown`, `error` (it failed or timed out) |
//! | `idem_escalations_opened_total` | counter | `tool` | operations this worker parked for a human |
//! | `idem_escalations_settled_total` | counter | `tool` | escalations an operator settled (or amended) through this worker |
//! | `idem_escalations_open` | gauge | | operations parked in the journal at the scrape (the journal's count, the same from every worker: `max()` them) |
//! | `idem_approvals_pending` | gauge | | calls waiting for a person's approval in the journal at the scrape (the same from every worker) |
//! | `idem_calls_in_flight` | gauge | | calls being made through this worker now |
//! | `idem_call_duration_seconds` | histogram | `tool`, `class` | from the call to its return, replays included; buckets 10 µs, 50 µs, 100 µs, 500 µs, 1 ms, 2.5 ms, 5 ms, 10 ms, 25 ms, 50 ms, 100 ms, 250 ms, 500 ms, 1 s, 2.5 s, 5 s, 10 s, 30 s, 60 s |
//! | `idem_journal_commit_seconds` | histogram | `durability` (`immediate`, `eventual`) | one write of a record with its audit events (a call's INTENT, its commit, an escalation, a step, a resolution); buckets 10 µs, 50 µs, 100 µs, 250 µs, 500 µs, 1 ms, 2.5 ms, 5 ms, 10 ms, 25 ms, 50 ms, 100 ms, 250 ms, 500 ms, 1 s |
//!
//! Counts of events (attempts of journaled tools, dedupe hits, replays,
//! verdicts, escalations) are taken when their audit event is written. The
//! durations are real time (`std::time::Instant`), also under a paused
//! test clock.

pub use idem_admin::files::{
    address_path, token_path, AddressFile, ADDRESS_FILE, TOKEN_ENV, TOKEN_FILE,
};
pub use idem_admin::proof;
pub use idem_admin::wire::{
    ApiError, Decided, DecisionRequest, ExampleResult, OperationView, PruneView, ResolveRequest,
    Resolved, RetryInfo, StatsView, ToolInfo, DECISION_SURFACES,
};
pub use idem_admin::workers;
pub use idem_admin::AdminOptions;

use std::sync::{Arc, Weak};

use idem_admin::{BoxFuture, Live, Missed, Operator, Running};
use idem_journal::audit::{AuditEvent, Stats};
use idem_journal::error::Error;
use idem_journal::key::IdemKey;
use idem_journal::views::{Escalation, Operation, PruneReport, Resolution};

use crate::audit::{Subscription, SubscriptionError};
use crate::class::{self, ToolDescriptor};
use crate::shared::{Runtime, Shared};

impl Runtime {
    /// The admin API's base URL (`http://127.0.0.1:PORT`), if this runtime
    /// serves it.
    pub fn admin_url(&self) -> Option<String> {
        self.admin_running(|r| r.url.clone())
    }

    /// The address the admin API is bound to, if this runtime serves it.
    pub fn admin_addr(&self) -> Option<std::net::SocketAddr> {
        self.admin_running(|r| r.addr)
    }

    fn admin_running<T>(&self, f: impl FnOnce(&Running) -> T) -> Option<T> {
        let running = self.shared.admin.lock().unwrap_or_else(|p| p.into_inner());
        running.as_ref().map(f)
    }
}

/// Starts the server of `rt` (called by `RuntimeBuilder::open`).
pub(crate) fn start(
    rt: &Runtime,
    options: AdminOptions,
    dir: &std::path::Path,
) -> Result<Running, Error> {
    let served: Arc<dyn Operator> = Arc::new(Served(Arc::downgrade(&rt.shared)));
    idem_admin::serve(served, options, dir)
}

/// The runtime as the server reaches it: without keeping it alive.
struct Served(Weak<Shared>);

impl Served {
    fn rt(&self) -> Result<Runtime, Error> {
        self.0
            .upgrade()
            .map(|shared| Runtime { shared })
            .ok_or_else(|| Error::Usage("the runtime was dropped while serving the request".into()))
    }
}

impl Operator for Served {
    fn alive(&self) -> bool {
        self.0.strong_count() > 0
    }

    fn tools(&self) -> Vec<ToolInfo> {
        let Some(shared) = self.0.upgrade() else {
            return Vec::new();
        };
        let mut tools: Vec<ToolInfo> = class::tools()
            .map(|t| tool_info(t, shared.landed_check(t.name, t.class).is_some()))
            .collect();
        // Hand-built descriptors that made calls here.
        let called = shared.called.lock().unwrap_or_else(|p| p.into_inner());
        for c in called.values() {
            if !tools.iter().any(|t| t.name == c.tool.name) {
                let checks = c.check_landed.or(c.tool.check_landed).is_some();
                tools.push(tool_info(c.tool, checks));
            }
        }
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        tools
    }

    fn escalations(&self) -> BoxFuture<'_, Result<Vec<Escalation>, Error>> {
        Box::pin(async move { self.rt()?.escalations().await })
    }

    fn operation<'a>(
        &'a self,
        key: &'a IdemKey,
    ) -> BoxFuture<'a, Result<Option<Operation>, Error>> {
        Box::pin(async move { self.rt()?.operation(key).await })
    }

    fn history<'a>(&'a self, key: &'a IdemKey) -> BoxFuture<'a, Result<Vec<AuditEvent>, Error>> {
        Box::pin(async move { self.rt()?.history(key).await })
    }

    fn resolve<'a>(
        &'a self,
        key: &'a IdemKey,
        resolution: Resolution,
        note: &'a str,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move { self.rt()?.resolve(key, resolution, note).await })
    }

    fn approvals(&self) -> BoxFuture<'_, Result<Vec<idem_journal::views::Approval>, Error>> {
        Box::pin(async move { self.rt()?.approvals().await })
    }

    fn sagas(&self) -> BoxFuture<'_, Result<Vec<idem_journal::views::SagaView>, Error>> {
        Box::pin(async move { self.rt()?.sagas().await })
    }

    fn decide<'a>(
        &'a self,
        key: &'a IdemKey,
        approved: bool,
        note: &'a str,
        via: &'a str,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move { self.rt()?.decide_approval(key, approved, note, via).await })
    }

    fn audit_page(&self, from: u64, limit: usize) -> BoxFuture<'_, Result<Vec<AuditEvent>, Error>> {
        Box::pin(async move { self.rt()?.audit_page(from, limit).await })
    }

    fn sync(&self) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(async move { self.rt()?.sync().await })
    }

    fn subscribe(&self) -> Option<Box<dyn Live>> {
        let rt = self.rt().ok()?;
        Some(Box::new(Following(rt.subscribe())))
    }

    fn stats(&self) -> BoxFuture<'_, Result<Stats, Error>> {
        Box::pin(async move { self.rt()?.stats().await })
    }

    fn size_on_disk(&self) -> BoxFuture<'_, Result<u64, Error>> {
        Box::pin(async move { self.rt()?.size_on_disk().await })
    }

    fn prune(&self) -> BoxFuture<'_, Result<PruneReport, Error>> {
        Box::pin(async move { self.rt()?.prune().await })
    }

    fn metrics(&self) -> BoxFuture<'_, Result<String, Error>> {
        Box::pin(async move {
            let rt = self.rt()?;
            let open = rt.escalations().await?.len() as u64;
            let pending = rt.approvals().await?.len() as u64;
            Ok(rt.shared.audit.metrics.render(open, pending))
        })
    }
}

/// A subscription, as the server's followers read it.
struct Following(Subscription);

impl Live for Following {
    fn recv(&mut self) -> BoxFuture<'_, Result<AuditEvent, Missed>> {
        Box::pin(async move {
            self.0.recv().await.map_err(|e| match e {
                SubscriptionError::Lagged { .. } => Missed::Lagged,
                SubscriptionError::Closed => Missed::Closed,
            })
        })
    }
}

/// What the admin API says of a tool.
fn tool_info(tool: &ToolDescriptor, checks_landed: bool) -> ToolInfo {
    let ms = |d: std::time::Duration| d.as_millis().min(u64::MAX as u128) as u64;
    ToolInfo {
        name: tool.name.to_string(),
        class: tool.class,
        key_fields: tool.key_fields.iter().map(|s| s.to_string()).collect(),
        verify: tool.verify.map(str::to_string),
        dedupe_window_ms: ms(tool.dedupe_window),
        timeout_ms: tool.timeout.map(ms),
        retry: RetryInfo {
            max_attempts: tool.retry.max_attempts,
            initial_ms: ms(tool.retry.initial),
            backoff: tool.retry.backoff,
            max_interval_ms: ms(tool.retry.max_interval),
            max_elapsed_ms: tool.retry.max_elapsed.map(ms),
            jitter: tool.retry.jitter,
        },
        on_drift: tool.on_drift,
        redact: tool.redact.iter().map(|s| s.to_string()).collect(),
        checks_landed,
        defined_at: if tool.file.is_empty() {
            tool.module_path.to_string()
        } else {
            format!("{} ({}:{})", tool.module_path, tool.file, tool.line)
        },
        example_result: None,
    }
}
