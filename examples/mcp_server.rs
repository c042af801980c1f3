//! The demo's tools served over MCP: `cargo run --example mcp_server
//! --features mcp`.
//!
//! The five tools of `agent/shop.rs` (order lookup, payments, email,
//! tickets, refund wire), against the fake providers of `idem-testkit`,
//! served as an MCP server on stdin/stdout, so any MCP client can drive
//! them. Every call runs through idem: a repeated call is replayed from the
//! journal, a crash mid-call is recovered by the tool's class, an unknown
//! wire outcome is escalated to an operator. Calls name their run in the
//! request's `_meta`: `{"idem/run": "order-4711"}`.
//!
//! The user's side of it is the first lines of `main` below: open the
//! runtime, put the tools in a `Toolbox`, serve it (and `#[tool]` on the
//! tools' `impl` block, in `agent/shop.rs`); the rest of this file is the
//! demo's plumbing (where the providers are, how to die, which transport).
//!
//! Options:
//! - `--journal DIR` keeps the journal in DIR (default: a temporary one).
//! - `--http ADDR` serves streamable HTTP at `http://ADDR/mcp` instead of
//!   stdio (`--http 127.0.0.1:8080`).
//! - Providers: started by the server itself, unless their addresses are in
//!   the `IDEM_TESTKIT_*_ADDR` variables (so they outlive a killed server).
//! - `IDEM_MCP_LOG=FILTER` (e.g. `idem=debug,info`) turns on `tracing`'s
//!   log, written to stderr: on stdio, stdout is the protocol channel, and
//!   a single log line there breaks the client's JSON-RPC stream. MCP
//!   clients keep a server's stderr (Claude Desktop, for one, writes it to
//!   a log file per server), so that is where a stdio server's log goes.
//! - `IDEM_MCP_KILL_AT=TOOL` makes the server SIGKILL itself when TOOL's
//!   request has landed at the provider and before idem commits it, the
//!   worst moment to die (after writing the path in `IDEM_MCP_KILL_MARKER`,
//!   when set).

#[path = "agent/shop.rs"]
mod shop;

use std::path::PathBuf;
use std::sync::Arc;

use idem::mcp::McpServer;
use idem::{Runtime, Toolbox};
use idem_testkit::{ProviderAddrs, Providers};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    log_to_stderr()?;
    let (journal, _temp) = journal_dir()?;
    let (shop, _providers) = shop().await?;

    let rt = Runtime::open(&journal)?;
    let tools = Toolbox::new().with_methods(Arc::new(shop))?;
    let server = McpServer::new(rt, tools)?
        .with_server_info("idem-demo-shop", env!("CARGO_PKG_VERSION"))
        .with_instructions(
            "Order tools made safe to retry by idem. Send {\"idem/run\": \"<order id>\"} in each \
             call's _meta: the same call in the same run is done once.",
        );
    eprintln!(
        "idem mcp_server: {} tools, journal {}",
        server.tools().len(),
        journal.display()
    );
    match option("--http") {
        None => server.serve_stdio().await?,
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(&addr).await?;
            eprintln!("serving http://{}/mcp", listener.local_addr()?);
            // Until the process is stopped.
            let shutdown = idem::mcp::CancellationToken::new();
            server.serve_http(listener, shutdown).await?;
        }
    }
    Ok(())
}

/// `tracing` to stderr, filtered by `IDEM_MCP_LOG` (nothing when unset).
/// Never stdout: on stdio it carries the protocol, and nothing else may.
fn log_to_stderr() -> Result<(), Box<dyn std::error::Error>> {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let Ok(filter) = std::env::var("IDEM_MCP_LOG") else {
        return Ok(());
    };
    let targets: tracing_subscriber::filter::Targets = filter
        .parse()
        .map_err(|e| format!("IDEM_MCP_LOG={filter:?}: {e}"))?;
    let subscriber = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_max_level(tracing_subscriber::filter::LevelFilter::TRACE)
        .finish()
        .with(targets);
    subscriber.try_init()?;
    Ok(())
}

/// The value after `name` on the command line.
fn option(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1).cloned()
}

/// `--journal DIR`, or a temporary directory (kept until exit).
fn journal_dir() -> std::io::Result<(PathBuf, Option<tempfile::TempDir>)> {
    if let Some(dir) = option("--journal") {
        return Ok((PathBuf::from(dir), None));
    }
    let temp = tempfile::tempdir()?;
    Ok((temp.path().join("journal"), Some(temp)))
}

/// The tools, on the providers named by the environment or on fresh ones
/// (returned, to keep them running).
async fn shop() -> std::io::Result<(shop::Shop, Option<Providers>)> {
    let (addrs, providers) = match ProviderAddrs::from_env() {
        Ok(addrs) => (addrs, None),
        Err(_) => {
            let providers = Providers::start().await?;
            (providers.addrs(), Some(providers))
        }
    };
    let shop = match std::env::var("IDEM_MCP_KILL_AT") {
        Ok(victim) => {
            let marker = std::env::var_os("IDEM_MCP_KILL_MARKER");
            let hook: shop::Hook = Arc::new(move |moment, tool, _order| {
                if moment == shop::Moment::Landed && tool == victim {
                    if let Some(path) = &marker {
                        let _ = std::fs::write(path, tool);
                    }
                    shop::sigkill_self();
                }
            });
            shop::Shop::with_hook(addrs, hook)
        }
        Err(_) => shop::Shop::new(addrs),
    };
    Ok((shop, providers))
}
