//! idem makes side-effecting AI-agent tool calls safe to retry.
//!
//! Annotate a tool function once with [`#[tool]`](macro@tool): the attribute
//! generates a wrapper that derives a stable idempotency key, brackets the
//! call with durable journal writes (INTENT before, COMMITTED after),
//! classifies failures with [`Classify`], and retries only when the tool's
//! class says a retry cannot duplicate a real-world effect. Outcomes nobody
//! can settle automatically are parked as [`Escalation`]s for a human.
//!
//! ```
//! use idem::{tool, Classify, Ctx, Failure, Runtime, Verdict};
//!
//! #[derive(Debug)]
//! enum MailError {
//!     Refused,
//!     Timeout,
//!     Rejected(String),
//! }
//!
//! impl Classify for MailError {
//!     fn classify(&self) -> Failure {
//!         match self {
//!             MailError::Refused => Failure::not_sent(),
//!             MailError::Timeout => Failure::ambiguous(),
//!             MailError::Rejected(_) => Failure::Semantic,
//!         }
//!     }
//! }
//! # impl std::fmt::Display for MailError {
//! #     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { write!(f, "{self:?}") }
//! # }
//! # impl std::error::Error for MailError {}
//!
//! #[tool(class = "journal", timeout = "30s", key = "to, order_id", verify = email_landed, redact = "body")]
//! async fn send_email(ctx: &Ctx, to: String, order_id: u64, body: String) -> Result<String, MailError> {
//!     // A real tool passes ctx.idempotency_key() to the provider.
//!     Ok(format!("sent {order_id} to {to} as {}", ctx.idempotency_key()))
//! }
//!
//! async fn email_landed(ctx: &Ctx) -> Result<Verdict<String>, MailError> {
//!     // A real verify searches the provider's sent messages for the key.
//!     Ok(Verdict::NotLanded)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let journal_dir = dir.path();
//! let rt = Runtime::open(journal_dir)?;
//! let ctx = rt.run("order-4711");
//! let first = send_email(&ctx, "ann@example.com".into(), 4711, "Thanks!".into()).await?;
//! // The same call again (after a crash, a retry of the agent step, ...):
//! // replayed from the journal, the email is not sent twice.
//! let again = send_email(&ctx, "ann@example.com".into(), 4711, "Thanks!".into()).await?;
//! assert_eq!(first, again);
//! # Ok(())
//! # }
//! ```
//!
//! The runtime's types are re-exported here; see [`Runtime`] for the
//! journal (with the shape of a long-running server: one runtime opened at
//! start, one [`Ctx`] per workflow), [`Ctx`] for runs, scopes and memoized
//! steps, and [`Runtime::escalations`] / [`Runtime::resolve`] for the human
//! side.
//!
//! # What a call does
//!
//! Every call of a journaled tool first looks up its key, then acts on what
//! it finds:
//!
//! | record found | `read_only` | `provider` | `journal` | `at_most_once` |
//! |---|---|---|---|---|
//! | none | run, no journal | INTENT (durable), then run with the key | INTENT, then run | INTENT, then run |
//! | COMMITTED | — | replay the result, no call | replay | replay |
//! | INTENT, our own call in flight | — | wait for it (then [`ToolError::InFlight`]) | same | same |
//! | INTENT, owner dead (crash, dropped call) | — | re-run with the same key inside the dedupe window and the budget, else escalate | ask `verify`: landed → commit its result; not landed → re-run; unknown or error → escalate | escalate |
//! | REJECTED (semantic) | — | run again under the next key generation | same | same |
//! | ESCALATED | — | [`ToolError::Escalated`], no call | same | same |
//! | resolved by an operator | — | landed → replay; reissue → run; abandon → [`ToolError::Abandoned`] | same | same |
//! | AWAITING_APPROVAL (`approve = ...`) | — | wait up to `approval_wait`, then [`ToolError::AwaitingApproval`]; no call | same | same |
//! | approved by an operator | — | run it once, with the approved arguments | same | same |
//! | refused by an operator | — | [`ToolError::NotApproved`] with the operator's note, no call | same | same |
//!
//! and, inside one call, treats each failure by the tool's class
//! ([`Failure`], from the error's [`Classify`]):
//!
//! | failure | `read_only` | `provider` | `journal` | `at_most_once` |
//! |---|---|---|---|---|
//! | `NotSent` | back off, retry | back off, retry | back off, retry | back off, retry |
//! | `Ambiguous` | back off, retry | back off, retry with the same key | back off, then `verify` before re-running | escalate, never retry |
//! | `Semantic` | return it | record REJECTED, return it | same | same |
//! | budget or `max_elapsed` spent | return the last error | record it; an unresolved ambiguity escalates | same | — |
//!
//! Attempt counts and the first attempt's time are durable, so a crash loop
//! does not reset the budget. Nothing reaches a provider unless its INTENT
//! is on disk; a journal that cannot be written or read fails the call with
//! [`ToolError::Journal`] before the provider is called. A call keyed like
//! an earlier one but with other arguments is replayed with an `ArgsDrift`
//! audit event, or refused with [`ToolError::ArgsMismatch`] under
//! `on_drift = "reject"`.
//!
//! # Approval, compensation, retries: which one
//!
//! - **Retry** (every class) is for failures that did not change anything
//!   or whose effect the provider deduplicates: the same call again is
//!   safe, and the class says when.
//! - **`at_most_once`** is for effects nobody can look up or deduplicate:
//!   in doubt, idem parks the call for a person *after* the fact.
//! - **Approval** (`approve = ...`) asks a person *before* the first
//!   attempt, whatever the class: for calls a person must allow (a large
//!   wire, a message to every customer), not for calls in doubt.
//! - **Compensation** (`compensate = path` and [`Ctx::saga`]) undoes
//!   effects that did happen, when a later step of the same workflow was
//!   refused: a refund after a charge whose order cannot ship. Retry
//!   prevents doing it twice; compensation takes back what should not have
//!   been done at all.
//!
//! # Sagas
//!
//! A tool names its compensation, another `#[tool]` of a side-effecting
//! class whose parameters after the context are the original's result by
//! reference (then, optionally, every argument of the original by
//! reference, in order; a function of another shape is a compile error).
//! Calls made with a saga's [`Saga::ctx`] are recorded; when its body
//! returns a semantic failure (or [`Saga::abort`]s), the completed steps
//! are compensated, the last first, each exactly once across crashes, and
//! the saga returns [`ToolError::Compensated`]:
//!
//! ```
//! use idem::{tool, Classify, Ctx, Failure, Runtime, ToolError};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Debug)]
//! struct Declined(&'static str);
//! impl Classify for Declined {
//!     fn classify(&self) -> Failure {
//!         Failure::Semantic
//!     }
//! }
//!
//! #[derive(Debug, Clone, Serialize, Deserialize)]
//! struct Charge { id: String, cents: u64 }
//!
//! #[tool(class = "provider", key = "order_id", compensate = refund)]
//! async fn charge(ctx: &Ctx, order_id: u64, cents: u64) -> Result<Charge, Declined> {
//!     Ok(Charge { id: format!("ch_{order_id}"), cents }) // the payments API, keyed
//! }
//!
//! /// The compensation: the charge, then charge's arguments, by reference.
//! #[tool(class = "provider", key = "charge.id")]
//! async fn refund(ctx: &Ctx, charge: &Charge, order_id: &u64, cents: &u64) -> Result<(), Declined> {
//!     Ok(()) // refunds charge.id, with ctx.idempotency_key()
//! }
//!
//! #[tool(class = "provider", key = "order_id")]
//! async fn ship(ctx: &Ctx, order_id: u64) -> Result<String, Declined> {
//!     Err(Declined("no courier for this address"))
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! let rt = Runtime::open(dir.path())?;
//! let ctx = rt.run("order-4711");
//! let shipped = ctx
//!     .saga("order", |s| async move {
//!         charge(s.ctx(), 4711, 1_990).await?;
//!         ship(s.ctx(), 4711).await // refused: the charge is refunded
//!     })
//!     .await;
//! assert!(matches!(shipped, Err(ToolError::Compensated { .. })));
//! # Ok(())
//! # }
//! ```
//!
//! The decision to roll back and the saga's end are durable: a saga run
//! again after a crash replays its completed calls, goes on compensating
//! where it stopped (a compensation that already ran is replayed, not
//! repeated), and a saga that ended returns its end without running its
//! body; while it rolls back, the body runs only to replay what it
//! completed (any other call is refused before it runs, so a resumed
//! rollback has no new effect). A resumed body must take its earlier path
//! (route non-deterministic choices through [`Ctx::step`]), and one run of
//! a saga at a time runs in a process (a second concurrent one returns
//! [`ToolError::InFlight`]). An error whose outcome is in doubt (escalated,
//! in flight, journal) is returned as it is and leaves the saga open. A compensation refused
//! for good escalates the saga ([`ToolError::Escalated`] with what ran,
//! what was undone and what is left); one that cannot be settled yet (an
//! `at_most_once` compensation cut off mid-call, parked for a person)
//! escalates it until its next run. The audit stream records
//! `SagaStarted`, `Compensating`, `Compensated` and `SagaEscalated`.
//! Compensable tools take owned arguments that are `Send + 'static` (the
//! saga keeps copies), and a `read_only` tool cannot compensate (it is
//! refused before it runs: it would run again on every resume).
//!
//! # Tools for a model: JSON dispatch
//!
//! Alongside the typed wrapper, `#[tool]` generates for each tool whose
//! types allow it a JSON schema of its arguments (the parameters after the
//! context) and a dispatcher that takes them as JSON. An LLM's
//! function-calling loop needs nothing else: give the model
//! [`tool_schemas()`] (name, description from the doc comment, schema,
//! class) and run each call it makes with [`dispatch`], which goes through
//! the engine exactly like a direct call (replayed, retried, escalated).
//! Method tools need their instance: a [`Toolbox`] holds it, and is also
//! what [`mcp`](crate#mcp) serves. See `#[tool]`'s section
//! [JSON dispatch](macro@tool#json-dispatch) for which tools get a
//! dispatcher and how to opt out.
//!
//! ```
//! use idem::{tool, Classify, Ctx, DispatchError, Failure, Runtime};
//! use serde_json::json;
//!
//! #[derive(Debug)]
//! struct Declined;
//! impl Classify for Declined {
//!     fn classify(&self) -> Failure {
//!         Failure::Semantic
//!     }
//! }
//!
//! /// Refunds part of an order.
//! #[tool(class = "provider", key = "order_id", on_drift = "reject")]
//! async fn refund(ctx: &Ctx, order_id: u64, cents: u64) -> Result<u64, Declined> {
//!     Ok(cents) // a real tool calls the payments API with ctx.idempotency_key()
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! let rt = Runtime::open(dir.path())?;
//! let schema = idem::tool_schemas().into_iter().find(|t| t.name == "refund").unwrap();
//! assert_eq!(schema.description, "Refunds part of an order.");
//! assert_eq!(schema.input_schema["required"], json!(["order_id", "cents"]));
//!
//! // What the model asked for, as JSON:
//! let ctx = rt.run("support-ticket-81");
//! let done = idem::dispatch(&ctx, "refund", json!({ "order_id": 4711, "cents": 500 })).await?;
//! assert_eq!(done, json!(500));
//! // The model asks again, with another amount: refused, not refunded twice.
//! let again = idem::dispatch(&ctx, "refund", json!({ "order_id": 4711, "cents": 900 })).await;
//! let err = again.unwrap_err();
//! assert_eq!(err.kind(), "args_mismatch");
//! // Mistakes are named, and nothing runs.
//! let typo = idem::dispatch(&ctx, "refund", json!({ "order": 4711, "cents": 1 })).await;
//! assert!(matches!(typo, Err(DispatchError::InvalidArguments { .. })));
//! # Ok(())
//! # }
//! ```
//!
//! # MCP
//!
//! With the feature `mcp`, `idem::mcp::McpServer` serves a
//! [`ToolSet`] (a [`Toolbox`]) as a Model Context Protocol server, over
//! stdio or streamable HTTP, with nothing else to write: annotations from
//! each tool's class, the run identity from the request's `_meta`
//! (`{"idem/run": "order-4711"}`, optionally `"idem/scope"`) or a
//! resolver, and idem's errors as `isError` results that say what happened
//! and what the caller may do. A whole server:
//!
//! ```text
//! let rt = Runtime::open("./journal")?;
//! let tools = Toolbox::new().with_methods(Arc::new(shop))?;   // a #[tool] impl block's tools
//! idem::mcp::McpServer::new(rt, tools)?.serve_stdio().await?;
//! ```
//!
//! rmcp, the Rust MCP SDK, has a `#[tool]` attribute too, for its own tool
//! router; idem's server needs none of it. In a crate that uses both, keep
//! idem's tools in free functions or in an `impl` block of their own marked
//! `#[idem::tool]` (rmcp's `#[tool_router]` takes every tool attribute in
//! its block for its own, and fails on idem's with `E0599: no function or
//! associated item named '…_tool_attr'`), and where both names are in
//! scope, import idem's as `use idem::tool as idem_tool;`: the block
//! attribute recognizes method attributes whose path ends in `tool` or
//! `_tool`.

#![warn(missing_docs)]

// The public API, item by item: what is not listed here is not idem's API,
// whatever the crates below it export (a semver fence; the runtime's own
// root is an explicit list too, and `.ci/run` checks the surface against
// `public-api.txt`).
pub use idem_runtime::{
    dispatch, dispatch_reported, reporting, tool_schemas, tools, Approval, ApprovalView, ArgSchema,
    AuditEvent, BoxFuture, CallReport, Class, Classify, Clock, Ctx, DispatchError, Dispatched,
    Error, Escalation, EventKind, Failure, IdemKey, Journal, KeyEncoder, KeyPart, LandedCheck,
    ManualClock, OnDrift, Operation, Owner, PruneReport, Resolution, ResolutionView, RetryPolicy,
    Runtime, RuntimeBuilder, Saga, SagaState, SagaStep, SagaView, Stats, Subscription,
    SubscriptionError, SystemClock, ToolDescriptor, ToolError, ToolSchema, ToolSet, ToolStats,
    Toolbox, Verdict, KEY_VERSION, MAX_ARGS_BYTES, MAX_NOTE_BYTES,
};
#[cfg(feature = "postgres")]
pub use idem_runtime::{PostgresJournal, PostgresOptions};
#[cfg(feature = "sled")]
pub use idem_runtime::{SledJournal, SledOptions};

/// The journal interface, for those who write a backend of their own or
/// read records below the runtime: the `Journal` trait, its records,
/// writes and claims.
pub use idem_runtime::journal;

/// The admin API a running process serves to operators, with the
/// escalation inbox (feature `admin`): see `RuntimeBuilder::admin`.
#[cfg(feature = "admin")]
#[doc(inline)]
pub use idem_runtime::admin;

/// HTTP providers over reqwest: classification of statuses and errors, the
/// `Idempotency-Key` header, replay detection (feature `http`).
#[cfg(feature = "http")]
#[doc(inline)]
pub use idem_http as http;

/// Serve `#[tool]`s over the Model Context Protocol, on stdio or streamable
/// HTTP, with annotations from their class, run identities from `_meta`
/// and idem's errors as MCP error results (feature `mcp`).
#[cfg(feature = "mcp")]
#[doc(inline)]
pub use idem_mcp as mcp;

// Documented in its own file.
#[cfg(feature = "testing")]
pub mod testing;
/// OpenTelemetry export of every tool call's span, its attempts as child
/// spans, over OTLP/HTTP (feature `otel`): see [`otel::Exporter`].
#[cfg(feature = "otel")]
#[doc(inline)]
pub use idem_otel as otel;

/// Makes an async function or `&self` method a retry-safe tool.
///
/// ```text
/// #[tool(
///     class = "read_only" | "provider" | "journal" | "at_most_once",   required
///     key = "to, template, order.id",   the fields that identify one operation
///     name = "send_email",              stable tool id (default: the fn name,
///                                       `Type::method` under `#[tool] impl Type`)
///     verify = email_landed,            journal class: how to tell if it landed
///     dedupe_window = "24h",            provider class: how long it keeps keys
///     retry(max_attempts = 5, initial = "1s", backoff = 2.0,
///           max_interval = "100s", max_elapsed = "1h", jitter = true),
///     timeout = "30s",                  per attempt; an overrun is ambiguous
///     on_drift = "replay" | "reject",   same key, other arguments
///     on_drift(reject = "amount, iban"), refuse only when these changed
///     redact = "body, card",            never written to the journal
///     dispatch = true | false,          JSON dispatcher: required / none
///                                       (default: where the types allow)
///     schema = path,                    the arguments' JSON schema, by hand
///     destructive = false,              MCP hint: only adds, never destroys
///     crate = "::idem",                 where the generated code finds idem
/// )]
/// ```
///
/// # The function
///
/// - An `async fn`, free or a method taking `&self` (or `self: &Arc<Self>`).
///   A method tool is named after its type: put `#[tool]` on its `impl`
///   block, or give it a `name` (see [`name`](#name)).
/// - Its first parameter (after `&self`) is the call context, `ctx: &Ctx`
///   (any name). Inside the body it is the context *of the attempt*: it
///   carries [`Ctx::idempotency_key`] (identical on every attempt and after a
///   restart) and [`Ctx::attempt`].
/// - It returns `Result<T, E>` with `E: Classify + Debug`; for the three
///   journaled classes `T: Serialize + DeserializeOwned` (the result is
///   stored and replayed). A `read_only` tool, which stores nothing, may
///   return `Result<impl Trait, E>`.
/// - Every other parameter is a plain name and `Clone`: each attempt runs the
///   body on its own copy. Non-redacted arguments are recorded (by their
///   serde form when they have one) as evidence and to detect drift. A
///   parameter under `#[cfg(...)]` is copied and recorded only when it is
///   configured in; it cannot be a key field (the key would differ between
///   builds).
///
/// Anything that compiles without the attribute compiles with it, without
/// a new warning: parameter names may come from a `macro_rules!` or look
/// like the generated code's own (`__idem_key`), the body may be a single
/// expression or open with inner attributes (`#![allow(...)]`). The
/// wrapper's own variables are hygienic: the body cannot see them.
///
/// The generated function has the same signature, except that the error
/// type becomes [`ToolError<E>`](ToolError). Before the first attempt it
/// derives the key from the context's root run and scope, the tool's `name`
/// and the `key` fields, then lets the engine run, retry, replay or escalate
/// the call. `return` and `?` in the body work as before. Its future is
/// `Send` whenever the body's is, so tool calls can be `tokio::spawn`ed.
/// Every tool is listed, with its settings, by [`tools()`].
///
/// # Classes
///
/// | class | what a retry could do | a failure that may have landed | deduplicated by |
/// |---|---|---|---|
/// | `"read_only"` | nothing: it only reads | retried | nothing needed: no key, no journal |
/// | `"provider"` | nothing, if the same key is sent | retried with the same key, within the provider's `dedupe_window` | the provider (Stripe's `Idempotency-Key`) |
/// | `"journal"` | a duplicate effect | `verify` is asked first; re-run only if it did not land | idem's journal |
/// | `"at_most_once"` | a duplicate effect | never retried: escalated to a human | idem's journal |
///
/// A failure that provably never reached the provider (`Failure::NotSent`)
/// is retried in every class; a semantic refusal (`Failure::Semantic`) is
/// returned at once in every class.
///
/// # Arguments
///
/// The examples share this error type (hidden in the examples below):
///
/// ```
/// use idem::{Classify, Failure};
///
/// #[derive(Debug)]
/// enum ApiError {
///     Refused,  // connection refused: never sent
///     Timeout,  // may have been applied
///     Rejected, // the provider said no
/// }
///
/// impl Classify for ApiError {
///     fn classify(&self) -> Failure {
///         match self {
///             ApiError::Refused => Failure::not_sent(),
///             ApiError::Timeout => Failure::ambiguous(),
///             ApiError::Rejected => Failure::Semantic,
///         }
///     }
/// }
/// ```
///
/// ## `class` (required)
///
/// What a retry can do to the real world, and therefore how the engine
/// treats the tool (see the table above). A read-only tool is not journaled
/// and takes no `key`:
///
/// ```
/// # use idem::{tool, Classify, Ctx, Failure, Runtime};
/// # #[derive(Debug)] enum ApiError { Refused, Timeout, Rejected }
/// # impl Classify for ApiError { fn classify(&self) -> Failure { match self { ApiError::Refused => Failure::not_sent(), ApiError::Timeout => Failure::ambiguous(), ApiError::Rejected => Failure::Semantic } } }
/// # impl std::fmt::Display for ApiError { fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { write!(f, "{self:?}") } }
/// # impl std::error::Error for ApiError {}
/// #[tool(class = "read_only")]
/// async fn order_status(ctx: &Ctx, order_id: u64) -> Result<String, ApiError> {
///     Ok(format!("order {order_id}: shipped"))
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let rt = Runtime::open(dir.path())?;
/// let ctx = rt.run("order-4711");
/// assert_eq!(order_status(&ctx, 4711).await?, "order 4711: shipped");
/// # Ok(())
/// # }
/// ```
///
/// ## `key`
///
/// Required for the three journaled classes, refused on `read_only`: the
/// parameters that identify one real-world operation, in order, as a
/// comma-separated list. An entry is a parameter or a field path on one
/// (`order.id`, `pair.0`). Each field's type must implement [`KeyPart`]
/// (integers, strings, `Option`, sequences, tuples, `BTreeMap`/`BTreeSet`;
/// `&str` and `String` encode alike); floats, `HashMap`/`HashSet` and
/// clock readings are refused at compile time. The context's root run and
/// scope are always part of the key, so `ctx` is never listed.
///
/// Arguments left out of the key (here `note`) do not make a new operation:
/// a second call with the same key fields replays the first one.
///
/// ```
/// # use idem::{tool, Classify, Ctx, Failure, Runtime};
/// # use std::sync::atomic::{AtomicUsize, Ordering};
/// # #[derive(Debug)] enum ApiError { Refused, Timeout, Rejected }
/// # impl Classify for ApiError { fn classify(&self) -> Failure { match self { ApiError::Refused => Failure::not_sent(), ApiError::Timeout => Failure::ambiguous(), ApiError::Rejected => Failure::Semantic } } }
/// # impl std::fmt::Display for ApiError { fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { write!(f, "{self:?}") } }
/// # impl std::error::Error for ApiError {}
/// # static CHARGES: AtomicUsize = AtomicUsize::new(0);
/// #[derive(Clone, serde::Serialize)]
/// struct Order {
///     id: u64,
///     currency: String,
/// }
///
/// #[tool(class = "provider", key = "order.id, order.currency, amount_cents")]
/// async fn charge(ctx: &Ctx, order: Order, amount_cents: u64, note: String) -> Result<String, ApiError> {
///     CHARGES.fetch_add(1, Ordering::SeqCst);
///     // A real tool sends ctx.idempotency_key() to the provider.
///     Ok(format!("charged {amount_cents} for order {}", order.id))
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let rt = Runtime::open(dir.path())?;
/// let ctx = rt.run("order-4711");
/// let order = Order { id: 4711, currency: "EUR".into() };
/// let first = charge(&ctx, order.clone(), 1999, "first try".into()).await?;
/// let again = charge(&ctx, order.clone(), 1999, "agent retried".into()).await?;
/// assert_eq!(first, again);
/// assert_eq!(CHARGES.load(Ordering::SeqCst), 1);
/// // Another amount is another operation.
/// charge(&ctx, order, 2999, "".into()).await?;
/// assert_eq!(CHARGES.load(Ordering::SeqCst), 2);
/// # Ok(())
/// # }
/// ```
///
/// ## `name`
///
/// The stable id of the tool, part of every key. The default is the
/// function's name for a free function. Set `name` before renaming a
/// function, so that operations already in the journal keep
/// deduplicating:
///
/// ```
/// # use idem::{tool, Classify, Ctx, Failure, Runtime};
/// # #[derive(Debug)] enum ApiError { Refused, Timeout, Rejected }
/// # impl Classify for ApiError { fn classify(&self) -> Failure { match self { ApiError::Refused => Failure::not_sent(), ApiError::Timeout => Failure::ambiguous(), ApiError::Rejected => Failure::Semantic } } }
/// # impl std::fmt::Display for ApiError { fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { write!(f, "{self:?}") } }
/// # impl std::error::Error for ApiError {}
/// #[tool(class = "provider", name = "send_receipt", key = "order_id")]
/// async fn send_receipt_v2(ctx: &Ctx, order_id: u64) -> Result<String, ApiError> {
///     Ok(ctx.idempotency_key().to_string())
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let rt = Runtime::open(dir.path())?;
/// let key = send_receipt_v2(&rt.run("order-4711"), 4711).await?;
/// assert!(key.starts_with("send_receipt-"));
/// assert!(idem::tools().any(|t| t.name == "send_receipt"));
/// # Ok(())
/// # }
/// ```
///
/// Two tools must not share a name, or equal key fields would make them one
/// operation: the second would replay the first's result without running.
/// Two tools of one name in one binary therefore fail to build (the error
/// names the symbol `idem: more than one #[tool] is named "..."`), and a
/// [`Runtime`] refuses to open with [`Error::DuplicateTool`] should such a
/// binary exist anyway.
///
/// A method's name includes its type, so that `Mailer::send` and
/// `Sms::send` stay apart. An attribute on a method cannot see its type, so
/// a method tool either has a `name`, or is in an `impl` block marked
/// `#[tool]` (optionally `#[tool(crate = "...")]`), which names each of its
/// tools without a `name` `Type::method` (the last segment of the self
/// type, without generics; in a trait impl too). The block's tool methods
/// are those whose attribute path ends in `tool` or `_tool` (`#[tool]`,
/// `#[idem::tool]`, `#[idem_tool]` for `use idem::tool as idem_tool`), so
/// keep rmcp's own `#[tool]` methods in another block. A method tool with
/// neither a `name` nor such a block is a compile error.
///
/// In a generic block (`impl<T> Store<T>`), one tool stands for every
/// `Store<..>`: one name, one key space, one result type in the journal.
/// So a tool's result may not name the block's type or const parameters
/// (`Result<T, E>`, `Result<Vec<T>, E>`): under `#[tool] impl<T> ..` that is
/// refused at `T`, saying to give each result type its own tool in a block
/// that is not generic over it (`impl Store<Order> { .. get_order .. }`).
/// Without `#[tool]` on the block the method's attribute cannot see the
/// parameters, and rustc reports E0401 ("can't use generic parameters from
/// outer item") at `T`: put `#[tool]` on the block for the explanation.
/// Results that name none of them are fine in a generic block.
///
/// ```
/// # use idem::{tool, Classify, Ctx, Failure, Runtime};
/// # #[derive(Debug)] enum ApiError { Refused, Timeout, Rejected }
/// # impl Classify for ApiError { fn classify(&self) -> Failure { match self { ApiError::Refused => Failure::not_sent(), ApiError::Timeout => Failure::ambiguous(), ApiError::Rejected => Failure::Semantic } } }
/// # impl std::fmt::Display for ApiError { fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { write!(f, "{self:?}") } }
/// # impl std::error::Error for ApiError {}
/// struct Mailer;
/// struct Sms;
///
/// #[tool]
/// impl Mailer {
///     #[tool(class = "provider", key = "to, order_id")]
///     async fn send(&self, ctx: &Ctx, to: String, order_id: u64) -> Result<String, ApiError> {
///         Ok(format!("email to {to}"))
///     }
/// }
///
/// #[tool]
/// impl Sms {
///     #[tool(class = "provider", key = "to, order_id")]
///     async fn send(&self, ctx: &Ctx, to: String, order_id: u64) -> Result<String, ApiError> {
///         Ok(format!("text to {to}"))
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let rt = Runtime::open(dir.path())?;
/// let ctx = rt.run("order-4711");
/// assert_eq!(Mailer.send(&ctx, "ann".into(), 4711).await?, "email to ann");
/// // Same key fields, another tool: sent, not replayed from the email.
/// assert_eq!(Sms.send(&ctx, "ann".into(), 4711).await?, "text to ann");
/// assert!(idem::tools().any(|t| t.name == "Mailer::send"));
/// assert!(idem::tools().any(|t| t.name == "Sms::send"));
/// # Ok(())
/// # }
/// ```
///
/// ## `verify`
///
/// Journal class only, and required there: how to find out whether an
/// attempt whose outcome is unknown (a timeout, a reset after sending)
/// landed, before anything is sent again. A path to an
/// `async fn(&Ctx) -> Result<Verdict<T>, E>` that looks the effect up by
/// [`Ctx::idempotency_key`]: [`Verdict::Landed`] commits its result,
/// [`Verdict::NotLanded`] lets the engine re-run the call,
/// [`Verdict::Unknown`] (or an error) escalates. A `verify` function that
/// is not `async` is a compile error saying so. In a method tool a bare
/// name is a method of the same type (`verify = landed` calls
/// `self.landed(&ctx)`); a path with `::` is a free function.
/// `verify = "none"` escalates every unknown outcome.
///
/// ```
/// # use idem::{tool, Classify, Ctx, Failure, Runtime, Verdict};
/// # use std::collections::BTreeMap;
/// # use std::sync::Mutex;
/// # #[derive(Debug)] enum ApiError { Refused, Timeout, Rejected }
/// # impl Classify for ApiError { fn classify(&self) -> Failure { match self { ApiError::Refused => Failure::not_sent(), ApiError::Timeout => Failure::ambiguous(), ApiError::Rejected => Failure::Semantic } } }
/// # impl std::fmt::Display for ApiError { fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { write!(f, "{self:?}") } }
/// # impl std::error::Error for ApiError {}
/// /// A ticket system that does not deduplicate: tickets carry our key.
/// struct Tickets {
///     by_key: Mutex<BTreeMap<String, u64>>,
/// }
///
/// #[tool]
/// impl Tickets {
///     #[tool(class = "journal", timeout = "30s", key = "title", verify = find_ticket)]
///     async fn open(&self, ctx: &Ctx, title: String) -> Result<u64, ApiError> {
///         let mut tickets = self.by_key.lock().unwrap();
///         let id = tickets.len() as u64 + 1;
///         tickets.insert(ctx.idempotency_key().to_string(), id);
///         if ctx.attempt() == 1 {
///             return Err(ApiError::Timeout); // created, but the answer was lost
///         }
///         Ok(id)
///     }
///
///     async fn find_ticket(&self, ctx: &Ctx) -> Result<Verdict<u64>, ApiError> {
///         let tickets = self.by_key.lock().unwrap();
///         Ok(match tickets.get(ctx.idempotency_key().as_str()) {
///             Some(id) => Verdict::Landed(*id),
///             None => Verdict::NotLanded,
///         })
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let rt = Runtime::open(dir.path())?;
/// let tickets = Tickets { by_key: Mutex::default() };
/// let id = tickets.open(&rt.run("incident-7"), "disk full".into()).await?;
/// // verify found the ticket of the timed-out attempt: no second ticket.
/// assert_eq!(id, 1);
/// assert_eq!(tickets.by_key.lock().unwrap().len(), 1);
/// # Ok(())
/// # }
/// ```
///
/// ## `dedupe_window`
///
/// Provider class only: how long the provider remembers an idempotency key
/// (default `"24h"`, Stripe's retention). An operation that may have landed
/// is re-sent under its key only inside the window; after it, it escalates.
/// The retry budget must end inside the window: a `retry(max_elapsed)` that
/// is not shorter is a compile error.
///
/// ```
/// # use idem::{tool, Classify, Ctx, Failure};
/// # use std::time::Duration;
/// # #[derive(Debug)] enum ApiError { Refused, Timeout, Rejected }
/// # impl Classify for ApiError { fn classify(&self) -> Failure { match self { ApiError::Refused => Failure::not_sent(), ApiError::Timeout => Failure::ambiguous(), ApiError::Rejected => Failure::Semantic } } }
/// #[tool(class = "provider", key = "payout_id", dedupe_window = "7d", retry(max_elapsed = "2d"))]
/// async fn payout(ctx: &Ctx, payout_id: String, cents: u64) -> Result<(), ApiError> {
///     Ok(())
/// }
///
/// let t = idem::tools().find(|t| t.name == "payout").unwrap();
/// assert_eq!(t.dedupe_window, Duration::from_secs(7 * 24 * 3600));
/// assert_eq!(t.retry.max_elapsed, Some(Duration::from_secs(2 * 24 * 3600)));
/// ```
///
/// ## `retry(...)`
///
/// The retry policy, each setting optional; the defaults are
/// [`RetryPolicy::DEFAULT`] (Temporal's intervals with a finite budget):
/// `max_attempts = 5` (the first included), `initial = "1s"` (first delay),
/// `backoff = 2.0` (multiplier), `max_interval` (cap of one delay: 100 ×
/// `initial` unless given), `max_elapsed = "1h"` (from the first attempt,
/// across restarts; `"none"` for no bound), `jitter = true` (each delay
/// drawn from 50–100 % of its value). A provider's `Retry-After` is a floor.
/// Refused on `at_most_once`, which never retries a request that may have
/// been sent.
///
/// ```
/// # use idem::{tool, Classify, Ctx, Failure, Runtime};
/// # use std::time::Duration;
/// # #[derive(Debug)] enum ApiError { Refused, Timeout, Rejected }
/// # impl Classify for ApiError { fn classify(&self) -> Failure { match self { ApiError::Refused => Failure::not_sent(), ApiError::Timeout => Failure::ambiguous(), ApiError::Rejected => Failure::Semantic } } }
/// # impl std::fmt::Display for ApiError { fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { write!(f, "{self:?}") } }
/// # impl std::error::Error for ApiError {}
/// #[tool(
///     class = "provider",
///     key = "sku",
///     retry(max_attempts = 3, initial = "200ms", backoff = 3.0, max_elapsed = "1m", jitter = false)
/// )]
/// async fn reserve(ctx: &Ctx, sku: String) -> Result<u32, ApiError> {
///     if ctx.attempt() < 3 {
///         return Err(ApiError::Refused); // never sent: safe to retry
///     }
///     Ok(ctx.attempt())
/// }
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let rt = Runtime::open(dir.path())?;
/// let started = tokio::time::Instant::now();
/// assert_eq!(reserve(&rt.run("cart-1"), "sku-9".into()).await?, 3);
/// // Waited 200 ms, then 600 ms.
/// assert!(started.elapsed() >= Duration::from_millis(800));
/// let t = idem::tools().find(|t| t.name == "reserve").unwrap();
/// assert_eq!(t.retry.max_interval, Duration::from_secs(20)); // 100 × initial
/// # Ok(())
/// # }
/// ```
///
/// ## `timeout`
///
/// A limit per attempt. An attempt that overruns is dropped and counts as
/// ambiguous (it may have reached the provider), so the class decides what
/// follows: a provider tool retries with the same key, a journal tool asks
/// `verify`, an at-most-once tool escalates.
///
/// Required on a journal tool with a `verify` function. When a process
/// dies mid-call (or a call is dropped), the next call of that key must not
/// ask `verify` while the dead attempt's request may still be inside the
/// provider: "not landed" would then license a second send. So recovery
/// waits until the dead attempt would have timed out in the call itself —
/// its start, plus `timeout`, plus the backoff — before it asks. That wait
/// can be as long as `timeout`: it is recorded as an
/// [`EventKind::Settling`] audit event (and a
/// `tracing` event) with its length, so a host that gives up on slow tool
/// calls sees why. Choose the longest an attempt may really take.
///
/// ```
/// # use idem::{tool, Classify, Ctx, Failure, Runtime, ToolError};
/// # use std::time::Duration;
/// # #[derive(Debug)] enum ApiError { Refused, Timeout, Rejected }
/// # impl Classify for ApiError { fn classify(&self) -> Failure { match self { ApiError::Refused => Failure::not_sent(), ApiError::Timeout => Failure::ambiguous(), ApiError::Rejected => Failure::Semantic } } }
/// #[tool(class = "at_most_once", key = "transfer_id", timeout = "5s")]
/// async fn wire(ctx: &Ctx, transfer_id: String, cents: u64) -> Result<(), ApiError> {
///     tokio::time::sleep(Duration::from_secs(60)).await; // the bank hangs
///     Ok(())
/// }
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let rt = Runtime::open(dir.path())?;
/// let err = wire(&rt.run("payout-3"), "tr-3".into(), 10_000).await.unwrap_err();
/// assert!(matches!(err, ToolError::Escalated { .. }));
/// assert_eq!(rt.escalations().await?.len(), 1);
/// # Ok(())
/// # }
/// ```
///
/// ## `on_drift`
///
/// What to do when a key is called again with different full arguments
/// (arguments outside the key changed): `"replay"` (default) keeps the
/// first operation and records an `ArgsDrift` audit event; `"reject"`
/// refuses the call with [`ToolError::ArgsMismatch`], as Stripe does.
///
/// `on_drift(reject = "amount, iban")` refuses only a call whose listed
/// parameters changed, and replays one that changed others (a memo, a
/// note). The listed names are whole parameters after the context, not
/// redacted ones (a redacted parameter is never recorded, so its change
/// cannot be seen): anything else is a compile error. When the record does
/// not hold the arguments it was made with, every parameter counts as
/// changed: the call is refused. [`dispatch_reported`] and MCP's `_meta`
/// name the parameters that drifted.
///
/// ```
/// # use idem::{tool, Classify, Ctx, Failure, Runtime, ToolError};
/// # #[derive(Debug)] enum ApiError { Refused, Timeout, Rejected }
/// # impl Classify for ApiError { fn classify(&self) -> Failure { match self { ApiError::Refused => Failure::not_sent(), ApiError::Timeout => Failure::ambiguous(), ApiError::Rejected => Failure::Semantic } } }
/// # impl std::fmt::Display for ApiError { fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { write!(f, "{self:?}") } }
/// # impl std::error::Error for ApiError {}
/// #[tool(class = "provider", key = "order_id", on_drift = "reject")]
/// async fn refund(ctx: &Ctx, order_id: u64, cents: u64) -> Result<u64, ApiError> {
///     Ok(cents)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let rt = Runtime::open(dir.path())?;
/// let ctx = rt.run("order-4711");
/// assert_eq!(refund(&ctx, 4711, 500).await?, 500);
/// let err = refund(&ctx, 4711, 5000).await.unwrap_err();
/// assert!(matches!(err, ToolError::ArgsMismatch { .. }));
/// # Ok(())
/// # }
/// ```
///
/// ```
/// # use idem::{tool, Classify, Ctx, Failure, Runtime, ToolError};
/// # #[derive(Debug)] struct BankError;
/// # impl Classify for BankError { fn classify(&self) -> Failure { Failure::Semantic } }
/// # impl std::fmt::Display for BankError { fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("refused") } }
/// # impl std::error::Error for BankError {}
/// #[tool(class = "provider", key = "transfer_id", on_drift(reject = "amount, iban"))]
/// async fn transfer(ctx: &Ctx, transfer_id: u64, amount: u64, iban: String, memo: String) -> Result<u64, BankError> {
///     Ok(amount)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let rt = Runtime::open(dir.path())?;
/// let ctx = rt.run("payout-7");
/// assert_eq!(transfer(&ctx, 7, 500, "DE89".into(), "rent".into()).await?, 500);
/// // Another memo: the transfer is replayed.
/// assert_eq!(transfer(&ctx, 7, 500, "DE89".into(), "May rent".into()).await?, 500);
/// // Another amount: refused.
/// let err = transfer(&ctx, 7, 900, "DE89".into(), "rent".into()).await.unwrap_err();
/// assert!(matches!(err, ToolError::ArgsMismatch { .. }));
/// # Ok(())
/// # }
/// ```
///
/// ## `redact`
///
/// Parameters never written to the journal, the audit stream or escalation
/// evidence (recorded as `"<redacted>"`, left out of drift detection). Key
/// fields may be redacted: the key holds only their digest.
///
/// ```
/// # use idem::{tool, Classify, Ctx, Failure, Runtime};
/// # #[derive(Debug)] enum ApiError { Refused, Timeout, Rejected }
/// # impl Classify for ApiError { fn classify(&self) -> Failure { match self { ApiError::Refused => Failure::not_sent(), ApiError::Timeout => Failure::ambiguous(), ApiError::Rejected => Failure::Semantic } } }
/// #[tool(class = "at_most_once", key = "order_id", redact = "card_number")]
/// async fn pay(ctx: &Ctx, order_id: u64, card_number: String) -> Result<(), ApiError> {
///     Err(ApiError::Timeout)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let rt = Runtime::open(dir.path())?;
/// pay(&rt.run("order-4711"), 4711, "4242 4242 4242 4242".into()).await.unwrap_err();
/// let evidence = &rt.escalations().await?[0].args;
/// assert_eq!(evidence["order_id"], 4711);
/// assert_eq!(evidence["card_number"], "<redacted>");
/// # Ok(())
/// # }
/// ```
///
/// ## JSON dispatch
///
/// Each tool also gets, next to itself, a dispatcher that takes its
/// arguments as one JSON object and returns its result as JSON, and the
/// JSON schema of that object, for [`tool_schemas()`], [`dispatch`], a
/// [`Toolbox`] and MCP. It exists when the types allow it:
///
/// - the signature: not generic, no `impl Trait`, nothing borrowed (`&str`,
///   a lifetime: take `String`), no `Self` in a type, no `#[cfg]`
///   parameter; a method tool is registered by its `#[tool]` impl block
///   (not generic either), and is called through a [`Toolbox`] holding the
///   instance;
/// - the types: every parameter `serde::Deserialize` (owned), the result
///   `Serialize`, the call's future `Send`. These are probed without
///   bounds, so a tool whose types do not allow JSON still compiles; it
///   simply is not listed, and dispatching it says which type stands in
///   the way.
///
/// `dispatch = true` makes the dispatcher required: every condition becomes
/// a compile error on the code at fault. `dispatch = false` generates
/// nothing (for a tool no model should see, or to save its compile time).
///
/// The schema lists one property per parameter (after the context), by its
/// name, each from the type's [`ArgSchema`] (built in for the standard
/// types, implemented by hand for yours), else from `schemars::JsonSchema`
/// with the feature `schemars`, else `{}` (any value, still checked by
/// `Deserialize`). A parameter whose type accepts `null` (an `Option`) is
/// not required. `schema = path` names a `fn() -> serde_json::Value` that
/// returns the whole schema instead. The description is the tool's doc
/// comment. `destructive = false` (not on `read_only`) tells MCP clients
/// the tool only adds (sends, creates) and never destroys or overwrites:
/// by default every side-effecting tool is reported destructive.
///
/// ```
/// # use idem::{tool, Classify, Ctx, Failure, Runtime};
/// # #[derive(Debug)] enum ApiError { Refused, Timeout, Rejected }
/// # impl Classify for ApiError { fn classify(&self) -> Failure { match self { ApiError::Refused => Failure::not_sent(), ApiError::Timeout => Failure::ambiguous(), ApiError::Rejected => Failure::Semantic } } }
/// # impl std::fmt::Display for ApiError { fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { write!(f, "{self:?}") } }
/// # impl std::error::Error for ApiError {}
/// /// Emails a receipt.
/// #[tool(class = "provider", key = "to, order_id", destructive = false, dispatch = true)]
/// async fn send_receipt(ctx: &Ctx, to: String, order_id: u64, cc: Option<String>) -> Result<String, ApiError> {
///     Ok(format!("sent to {to}"))
/// }
///
/// /// Takes a borrowed name: no dispatcher, and none asked for.
/// #[tool(class = "read_only")]
/// async fn greet(ctx: &Ctx, name: &str) -> Result<String, ApiError> {
///     Ok(format!("hello {name}"))
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let schema = idem::tool_schemas().into_iter().find(|t| t.name == "send_receipt").unwrap();
/// assert_eq!(schema.input_schema["required"], serde_json::json!(["to", "order_id"]));
/// assert!(!schema.destructive);
/// assert!(idem::tool_schemas().iter().all(|t| t.name != "greet"));
///
/// let rt = Runtime::open(dir.path())?;
/// let args = serde_json::json!({ "to": "ann@example.com", "order_id": 4711 });
/// let sent = idem::dispatch(&rt.run("order-4711"), "send_receipt", args).await?;
/// assert_eq!(sent, "sent to ann@example.com");
/// # Ok(())
/// # }
/// ```
///
/// ## `crate`
///
/// The path through which the generated code reaches idem (default
/// `::idem`), for crates that use it through a re-export:
///
/// ```
/// mod framework {
///     /// idem, as this framework exposes it.
///     pub mod rt {
///         pub use idem::*;
///     }
/// }
///
/// use framework::rt::{tool, Classify, Ctx, Failure};
///
/// #[derive(Debug)]
/// struct ApiError;
///
/// impl Classify for ApiError {
///     fn classify(&self) -> Failure {
///         Failure::Semantic
///     }
/// }
///
/// #[tool(class = "read_only", crate = "crate::framework::rt")]
/// async fn ping(ctx: &Ctx) -> Result<(), ApiError> {
///     Ok(())
/// }
/// # fn main() {}
/// ```
///
/// # Compile-time checks
///
/// Mistakes are compile errors on the token at fault, all reported in one
/// build (the function is then left as written, so nothing else breaks):
/// a missing or unknown `class`; `key` missing on a journaled class or
/// given on `read_only`; a key entry that is not a parameter (or a field
/// path on one), is the context, or is a `#[cfg(...)]` parameter; a key
/// field without a stable encoding (no [`KeyPart`]); a function that is not
/// `async`, does not return `Result<T, E>`, takes no `&Ctx` first, or takes
/// `&mut self`; `E` without [`Classify`], or `impl Trait`; a journaled `T`
/// that cannot be stored, or is `impl Trait`; an argument that is not
/// `Clone`; `verify` missing on a journal tool, given on another class, or
/// not an `async fn`; `retry` on `at_most_once`; a provider's `max_elapsed`
/// not shorter than its `dedupe_window`; a method tool with no `name`
/// outside a `#[tool]` impl block; two tools of one name in one binary (at
/// link time); unknown (with the closest valid name suggested) or duplicate
/// arguments, malformed durations, and `redact` entries that are not
/// parameters; `dispatch` or `destructive` that is not `true`/`false`,
/// `destructive` on `read_only`, `schema` with `dispatch = false`, and
/// under `dispatch = true` whatever keeps the tool from a JSON dispatcher.
/// `key` and `redact` lists may end with a comma.
///
/// Durations are written as a number and a unit among `ms`, `s`, `m`, `h`,
/// `d`: `"500ms"`, `"1.5s"`, `"24h"`, `"1h 30m"`.
pub use idem_macros::tool;

/// What the code generated by `#[tool]` uses. Not a stable API.
#[doc(hidden)]
pub mod __private {
    pub use idem_runtime::__private::*;
}
