//! Free functions of every class, run against a journal in a temp dir.

use idem::{tool, Classify, Ctx, Failure, Runtime, Verdict};
use serde::{Deserialize, Serialize};

#[derive(Debug)]
enum MailError {
    Refused,
    Timeout,
}

impl Classify for MailError {
    fn classify(&self) -> Failure {
        match self {
            MailError::Refused => Failure::not_sent(),
            MailError::Timeout => Failure::ambiguous(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    id: String,
}

#[tool(class = "read_only")]
async fn order_total(ctx: &Ctx, order_id: u64) -> Result<u64, MailError> {
    let _ = ctx;
    Ok(order_id * 100)
}

#[tool(
    class = "provider",
    key = "order_id",
    dedupe_window = "24h",
    timeout = "30s"
)]
async fn charge(ctx: &Ctx, order_id: u64, cents: u64) -> Result<String, MailError> {
    Ok(format!("{}:{order_id}:{cents}", ctx.idempotency_key()))
}

#[tool(class = "journal", key = "to, template, order_id", verify = email_landed, redact = "body")]
async fn send_email(
    ctx: &Ctx,
    to: String,
    template: String,
    order_id: u64,
    body: String,
) -> Result<Receipt, MailError> {
    let _ = (ctx, &template, &body);
    if to.is_empty() {
        return Err(MailError::Refused);
    }
    Ok(Receipt {
        id: format!("{to}-{order_id}"),
    })
}

async fn email_landed(ctx: &Ctx) -> Result<Verdict<Receipt>, MailError> {
    let _ = ctx.idempotency_key();
    Err(MailError::Timeout)
}

#[tool(
    class = "at_most_once",
    key = "transfer_id",
    on_drift = "reject",
    name = "wire_v1"
)]
async fn wire(_ctx: &Ctx, transfer_id: String, cents: u64) -> Result<(), MailError> {
    let _ = (transfer_id, cents);
    Ok(())
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(dir.path()).unwrap();
    let ctx = rt.run("order-4711");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        assert_eq!(order_total(&ctx, 2).await.unwrap(), 200);
        let charged = charge(&ctx, 4711, 1999).await.unwrap();
        assert!(charged.starts_with("charge-"));
        let receipt = send_email(&ctx, "a@b.c".into(), "r".into(), 4711, "hi".into()).await;
        assert_eq!(receipt.unwrap().id, "a@b.c-4711");
        wire(&ctx, "t-1".into(), 5).await.unwrap();
    });
    assert_eq!(idem::tools().filter(|t| t.name == "wire_v1").count(), 1);
}
