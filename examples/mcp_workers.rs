//! The newcomer's scenario: three HTTP tools served over MCP by workers that
//! share one PostgreSQL journal, with the admin API on for the operator.
//! `cargo run --example mcp_workers --features mcp,http,postgres,admin`.
//!
//! Every line of this file is what an idem user writes (the README counts
//! them): three tools on HTTP APIs, one per idem class that changes the
//! world, and a `main` that connects to the journal and serves MCP.
//! tests/mcp_workers.rs runs two of these workers against the fake
//! providers of `idem-testkit`, calls the tools through both, parks a wire
//! whose outcome nobody knows, and settles it with the `idem` CLI while the
//! workers run.
//!
//! Configuration, from the environment: `DATABASE_URL` (the shared
//! journal), `WORKER_ID` (stable per worker: `idem --worker ID` finds it by
//! this id), `MCP_ADDR` (where to serve `http://ADDR/mcp`), and the
//! providers' base URLs `PAYMENTS_URL`, `EMAIL_URL`, `BANK_URL`.

use std::sync::Arc;

use idem::http::{self, reqwest, HttpError};
use idem::{mcp::McpServer, tool, Ctx, Runtime, Toolbox, Verdict};
use serde_json::{json, Value};

struct Shop {
    http: reqwest::Client,
    payments: String,
    email: String,
    bank: String,
}

#[tool]
impl Shop {
    /// Charges the customer for an order, once: the payments API
    /// deduplicates on the Idempotency-Key idem sends.
    #[tool(class = "provider", key = "order_id", on_drift = "reject")]
    async fn charge(
        &self,
        ctx: &Ctx,
        order_id: u64,
        customer: String,
        cents: u64,
    ) -> Result<Value, HttpError> {
        let body = json!({ "order_id": order_id, "customer": customer, "amount": cents, "currency": "eur" });
        let request = self.http.post(format!("{}/v1/charges", self.payments));
        Ok(http::send(ctx, request.json(&body)).await?.json().await?)
    }

    /// Emails the receipt of an order, once: a lost answer is settled by
    /// looking the message up by its key before sending again.
    #[tool(class = "journal", key = "to, order_id", verify = receipt_sent, timeout = "10s")]
    async fn send_receipt(&self, ctx: &Ctx, to: String, order_id: u64) -> Result<Value, HttpError> {
        let body = json!({ "to": to, "subject": format!("receipt for order {order_id}"), "body": "Thank you." });
        let request = self.http.post(format!("{}/send", self.email)).json(&body);
        let request = request.header("X-Idem-Key", ctx.idempotency_key().as_str());
        Ok(http::send_unkeyed(ctx, request).await?.json().await?)
    }

    async fn receipt_sent(&self, ctx: &Ctx) -> Result<Verdict<Value>, HttpError> {
        let url = format!("{}/sent?key={}", self.email, ctx.idempotency_key());
        let found: Vec<Value> = http::send_unkeyed(ctx, self.http.get(url))
            .await?
            .json()
            .await?;
        Ok(found
            .into_iter()
            .next()
            .map_or(Verdict::NotLanded, Verdict::Landed))
    }

    /// Wires a refund, never twice: when the bank's answer is lost, a
    /// person checks the statement and settles it.
    #[tool(class = "at_most_once", key = "order_id")]
    async fn refund(
        &self,
        ctx: &Ctx,
        order_id: u64,
        iban: String,
        cents: u64,
    ) -> Result<Value, HttpError> {
        let body = json!({ "to_account": iban, "amount": cents, "reference": format!("refund-{order_id}") });
        let request = self.http.post(format!("{}/wires", self.bank)).json(&body);
        Ok(http::send_unkeyed(ctx, request).await?.json().await?)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let env = |name: &str| std::env::var(name).map_err(|_| format!("{name} is not set"));
    let (journal, worker) = (env("DATABASE_URL")?, env("WORKER_ID")?);
    let rt = Runtime::builder().postgres(journal).worker_id(worker);
    let rt = rt.admin("127.0.0.1:0").connect().await?;
    let (payments, email, bank) = (env("PAYMENTS_URL")?, env("EMAIL_URL")?, env("BANK_URL")?);
    let http = http::client_builder().build()?;
    let shop = Shop {
        http,
        payments,
        email,
        bank,
    };
    let server = McpServer::new(rt, Toolbox::new().with_methods(Arc::new(shop))?)?;
    let listener = tokio::net::TcpListener::bind(env("MCP_ADDR")?).await?;
    println!("serving http://{}/mcp", listener.local_addr()?);
    let forever = idem::mcp::CancellationToken::new();
    Ok(server.serve_http(listener, forever).await?)
}
