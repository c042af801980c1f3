//! MCP for [idem](https://docs.rs/idem): serve `#[tool]`s as Model Context
//! Protocol tools, without glue. Use it as `idem::mcp` (feature `mcp`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! # use idem_mcp as mcp; // as `idem::mcp` is to users of the facade
//! use mcp::McpServer; // idem::mcp::McpServer
//! use idem::{Runtime, Toolbox};
//!
//! let rt = Runtime::open("./journal")?;
//! // Free-function tools; `.with_methods(Arc::new(shop))?` adds a type's.
//! let tools = Toolbox::functions();
//! McpServer::new(rt, tools)?.serve_stdio().await?;
//! # Ok(())
//! # }
//! ```
//!
//! What the server does:
//!
//! - `tools/list`: every tool of the [`ToolSet`](idem_runtime::ToolSet),
//!   with its doc comment as description, the JSON schema `#[tool]`
//!   generated for its arguments, and hints from its class: `read_only` →
//!   `readOnlyHint`; `provider`, `journal`, `at_most_once` →
//!   `idempotentHint`, and `destructiveHint` unless the tool says
//!   `destructive = false`. A method tool `Type::method` is listed as
//!   `Type.method` (MCP names have no `::`); [`McpServer::new`] refuses a
//!   set in which two tools would be listed under one name.
//! - `tools/call`: the call runs through idem's engine, exactly as a direct
//!   call: replayed when it was made before in the same run, retried or
//!   escalated by its class's rules. The run comes from the request's
//!   `_meta` — `{"idem/run": "order-4711"}`, optionally
//!   `"idem/scope": "second-reminder"` (or an array, for a nested scope);
//!   a call without one is refused with an error result that says how to
//!   send one. `_meta` is the client's word and no tenant boundary: a
//!   server with a resolver ([`McpServer::with_resolver`]) lets it decide
//!   every call, accepting, replacing or refusing the identity `_meta`
//!   asked for (see [`Decision`]).
//! - A tool's result is the call's structured content (an object as is,
//!   any other value as `{"result": value}`) and its text. Every failure is
//!   an `isError` result whose structured content says what happened and
//!   what the caller may do: `error` (`escalated`: wait for an operator;
//!   `in_flight`: retry later with the same arguments; `args_mismatch`;
//!   `abandoned`; `tool_error` with the tool's `failure` class;
//!   `invalid_arguments`; `no_run_identity`, ...), `message`, `advice`,
//!   `retryable`, and the `tool` and operation `key`. A call of a tool
//!   the server does not have is such a result too (`unknown_tool`, with
//!   the names of the tools there are in `tools`), not a protocol error.
//! - Every result of a dispatched call carries, in its `_meta`,
//!   `"idem/replayed": true` when its result was recorded before (the tool
//!   did not run for this call) and `false` otherwise, and, when the
//!   arguments differ from those the operation was first recorded with,
//!   `"idem/drift": ["amount", ...]` (the names of the arguments that
//!   changed; all of them when the record does not hold its arguments).
//!
//! Transports: [`McpServer::serve_stdio`], [`McpServer::serve`] (any byte
//! stream) and [`McpServer::serve_http`] (streamable HTTP at `/mcp`), or
//! [`McpServer::http_service`] to mount rmcp's service in your own router.
//!
//! # Logging on stdio
//!
//! On stdio, stdout is the protocol channel: one line of anything else
//! there (a log line, a `println!` in a tool) breaks the client's JSON-RPC
//! stream. Send `tracing` to stderr, which MCP clients keep (most write a
//! server's stderr to a log file of their own), or to a file:
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! # use idem_mcp as mcp;
//! use tracing_subscriber::util::SubscriberInitExt as _;
//!
//! tracing_subscriber::fmt()
//!     .with_writer(std::io::stderr) // never stdout
//!     .with_ansi(false)             // a log file, not a terminal
//!     .with_max_level(tracing_subscriber::filter::LevelFilter::INFO)
//!     .finish()
//!     .try_init()?;
//! let rt = idem::Runtime::open("./journal")?;
//! mcp::McpServer::new(rt, idem::Toolbox::functions())?
//!     .serve_stdio()
//!     .await?;
//! # Ok(())
//! # }
//! ```
//!
//! At `info`, every audit event is one line (target `idem::audit`: tool,
//! key, run, worker, what happened); `debug` adds one line per MCP call.
//! The demo server (`examples/mcp_server.rs`) does this under
//! `IDEM_MCP_LOG=FILTER`.
//!
//! # `#[tool]` and rmcp's `#[tool]`
//!
//! rmcp has an attribute of the same name for its own tool router. This
//! crate needs none of it (idem's attribute generates the schema and the
//! dispatcher), but a crate that uses both must keep them apart:
//!
//! - Put idem's tools in free functions, or in an `impl` block of their
//!   own marked `#[idem::tool]`, and rmcp's `#[tool]` methods in another
//!   block under `#[tool_router]`. rmcp's `#[tool_router]` takes every
//!   `#[tool]`-like attribute in its block for its own, and fails with
//!   `E0599: no function or associated item named '…_tool_attr'` on an
//!   idem tool.
//! - Where both attributes are imported, rename idem's:
//!   `use idem::tool as idem_tool;` and write `#[idem_tool(class = ...)]`
//!   (on the block too: `#[idem_tool] impl Shop`). idem's block attribute
//!   recognizes method attributes whose path ends in `tool` or `_tool`.

#![warn(missing_docs)]

mod http;
mod identity;
mod server;
mod stdio;

pub use http::PATH;
pub use identity::{
    CallInfo, Decision, IdentityError, Resolver, RunIdentity, META_RUN, META_SCOPE,
};
pub use server::{annotations, mcp_name, McpServer};
pub use stdio::MAX_MESSAGE_BYTES;

/// The parts of rmcp this crate's API uses, for code that needs to name
/// them (a custom HTTP config, a tool listing).
pub use rmcp;
/// Stops [`McpServer::serve_http`] when cancelled.
pub use tokio_util::sync::CancellationToken;

/// Why serving stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The client's MCP handshake failed.
    #[error("MCP handshake failed: {0}")]
    Handshake(String),
    /// The transport failed (I/O, a listener that stopped accepting).
    #[error("MCP transport failed: {0}")]
    Transport(String),
}
