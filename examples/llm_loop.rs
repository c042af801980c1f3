//! An LLM function-calling loop on idem: `cargo run --example llm_loop`.
//!
//! The loop gives the model `idem::tool_schemas()` (name, description,
//! JSON schema of the arguments, class of every tool) and executes each
//! function call the model makes with `idem::dispatch`. The "model" here is
//! a script, a fixed list of calls such as a real model makes: some
//! repeated (a retried step, a model that forgot it already did it), one
//! with drifted arguments (another amount for the same charge), one for a
//! tool that does not exist. idem runs each real operation once; the loop
//! prints what was run, what was replayed from the journal, and what was
//! refused, from the journal's audit log. The tools are free functions
//! against the fake providers of `idem-testkit`; no model or network is
//! needed.

use std::sync::OnceLock;

use idem::{tool, Classify, Ctx, EventKind, Failure, Runtime, Verdict};
use idem_testkit::{
    Charge, ChargeRequest, Clients, EmailMessage, ProviderError, Providers, SentMessage,
};
use serde_json::{json, Value};

/// The provider clients the tools use (a loop serves one set of tools).
static CLIENTS: OnceLock<Clients> = OnceLock::new();

fn clients() -> &'static Clients {
    CLIENTS
        .get()
        .expect("clients are set before the loop starts")
}

/// Why a tool failed; the testkit's errors already classify themselves.
#[derive(Debug)]
struct ShopError(ProviderError);

impl std::fmt::Display for ShopError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl Classify for ShopError {
    fn classify(&self) -> Failure {
        self.0.classify()
    }
}

impl From<ProviderError> for ShopError {
    fn from(e: ProviderError) -> Self {
        ShopError(e)
    }
}

/// Looks up what an order costs and who placed it.
#[tool(class = "read_only")]
async fn lookup_order(_ctx: &Ctx, order_id: u64) -> Result<Value, ShopError> {
    Ok(json!({
        "order_id": order_id,
        "customer": "cus_ann",
        "email": "ann@example.com",
        "amount_cents": 4999,
        "currency": "eur",
    }))
}

/// Charges the customer for an order. Once per order; a second call with
/// another amount is refused, not charged.
#[tool(
    class = "provider",
    key = "order_id",
    on_drift = "reject",
    timeout = "2s"
)]
async fn charge(
    ctx: &Ctx,
    order_id: u64,
    customer: String,
    amount_cents: u64,
    currency: String,
) -> Result<Charge, ShopError> {
    let request = ChargeRequest {
        amount: amount_cents,
        currency,
        order_id,
        customer,
    };
    let key = ctx.idempotency_key().as_str();
    Ok(clients().payments.charge(key, &request).await?)
}

/// Emails the receipt of an order.
#[tool(
    class = "journal",
    key = "to, order_id",
    verify = receipt_sent,
    timeout = "2s",
    destructive = false
)]
async fn send_receipt(
    ctx: &Ctx,
    to: String,
    order_id: u64,
    body: String,
) -> Result<SentMessage, ShopError> {
    let message = EmailMessage {
        to,
        subject: format!("receipt for order {order_id}"),
        body,
    };
    let key = ctx.idempotency_key().as_str();
    Ok(clients().email.send(key, &message).await?)
}

async fn receipt_sent(ctx: &Ctx) -> Result<Verdict<SentMessage>, ShopError> {
    let found = clients()
        .email
        .find_by_key(ctx.idempotency_key().as_str())
        .await?;
    Ok(found
        .into_iter()
        .next()
        .map_or(Verdict::NotLanded, Verdict::Landed))
}

/// One function call of the model.
struct ToolCall {
    name: &'static str,
    arguments: Value,
}

/// The scripted model: the calls it makes, given the tools it was shown.
fn model(tools: &[Value]) -> Vec<ToolCall> {
    let offered = |name: &str| tools.iter().any(|t| t["name"] == name);
    assert!(
        ["lookup_order", "charge", "send_receipt"]
            .iter()
            .all(|t| offered(t)),
        "the model plans with the tools it was given"
    );
    let charge = json!({
        "order_id": 4711, "customer": "cus_ann", "amount_cents": 4999, "currency": "eur",
    });
    let receipt = json!({
        "to": "ann@example.com", "order_id": 4711,
        "body": "We received 49.99 EUR for order 4711. Thank you!",
    });
    let call = |name, arguments: &Value| ToolCall {
        name,
        arguments: arguments.clone(),
    };
    let mut drifted = charge.clone();
    drifted["amount_cents"] = json!(5999);
    let mut reworded = receipt.clone();
    reworded["body"] = json!("Thanks for your order 4711!");
    vec![
        call("lookup_order", &json!({ "order_id": 4711 })),
        call("charge", &charge),
        call("send_receipt", &receipt),
        // The agent step is retried from the top.
        call("charge", &charge),
        call("send_receipt", &receipt),
        // The model rewrites the receipt and charges another amount.
        call("send_receipt", &reworded),
        call("charge", &drifted),
        // And calls a tool it made up.
        call("refund", &json!({ "order_id": 4711 })),
    ]
}

/// What the loop did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Calls that reached the provider.
    pub ran: usize,
    /// Calls answered from the journal.
    pub replayed: usize,
    /// Calls refused, by error kind.
    pub refused: Vec<&'static str>,
    /// Charges and emails at the providers, by their own ledgers.
    pub charges: usize,
    /// Emails sent.
    pub emails: usize,
}

/// Runs the loop against fresh providers, writing what happens to `out`.
pub async fn run(
    journal: &std::path::Path,
    out: &mut dyn std::io::Write,
) -> std::io::Result<Summary> {
    let providers = Providers::start().await?;
    let _ = CLIENTS.set(providers.addrs().clients());
    let rt = Runtime::open(journal).map_err(std::io::Error::other)?;
    let ctx = rt.run("order-4711");

    let tools: Vec<Value> = idem::tool_schemas().iter().map(|s| s.to_json()).collect();
    writeln!(out, "tools given to the model:")?;
    for t in &tools {
        writeln!(
            out,
            "  {} ({}): {}",
            t["name"], t["class"], t["input_schema"]
        )?;
    }

    let mut summary = Summary::default();
    let mut seen = 0;
    for call in model(&tools) {
        writeln!(out, "model calls {} {}", call.name, call.arguments)?;
        let result = idem::dispatch(&ctx, call.name, call.arguments).await;
        // What the journal recorded for this call.
        let events = rt.audit(seen).await.map_err(std::io::Error::other)?;
        seen = events.last().map_or(seen, |e| e.seq + 1);
        let replayed = events.iter().any(|e| e.kind == EventKind::DedupeHit);
        let drift = events
            .iter()
            .any(|e| matches!(e.kind, EventKind::ArgsDrift { .. }));
        let note = if drift { " (arguments drifted)" } else { "" };
        match result {
            Ok(value) if replayed => {
                summary.replayed += 1;
                writeln!(out, "  replayed from the journal{note}: {value}")?;
            }
            Ok(value) => {
                summary.ran += 1;
                writeln!(out, "  ran: {value}")?;
            }
            Err(e) => {
                summary.refused.push(e.kind());
                // What the model is shown: the error and what it may do.
                writeln!(out, "  refused{note}: {}", e.to_json())?;
            }
        }
    }
    summary.charges = providers.payments().ledger().len();
    summary.emails = providers.email().ledger().len();
    writeln!(
        out,
        "{} calls: {} ran, {} replayed, {} refused ({}); at the providers: {} charge, {} email",
        summary.ran + summary.replayed + summary.refused.len(),
        summary.ran,
        summary.replayed,
        summary.refused.len(),
        summary.refused.join(", "),
        summary.charges,
        summary.emails
    )?;
    providers.shutdown().await;
    Ok(summary)
}

#[allow(dead_code)] // a module of the test that runs this example
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    run(&dir.path().join("journal"), &mut std::io::stdout()).await?;
    Ok(())
}
