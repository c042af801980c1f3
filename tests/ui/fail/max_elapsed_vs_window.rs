use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct PayError;
impl Classify for PayError {
    fn classify(&self) -> Failure {
        Failure::ambiguous()
    }
}

// 48 h of retries against Stripe's 24 h key retention.
#[tool(class = "provider", key = "order_id", retry(max_elapsed = "48h"))]
async fn charge(ctx: &Ctx, order_id: u64) -> Result<(), PayError> {
    let _ = (ctx, order_id);
    Ok(())
}

// A 30 min window against the default 1 h of retries.
#[tool(class = "provider", key = "order_id", dedupe_window = "30m")]
async fn refund(ctx: &Ctx, order_id: u64) -> Result<(), PayError> {
    let _ = (ctx, order_id);
    Ok(())
}

// Equal is not shorter.
#[tool(
    class = "provider",
    key = "order_id",
    dedupe_window = "2h",
    retry(max_elapsed = "120m")
)]
async fn capture(ctx: &Ctx, order_id: u64) -> Result<(), PayError> {
    let _ = (ctx, order_id);
    Ok(())
}

// Unbounded retries outlive any window.
#[tool(class = "provider", key = "order_id", retry(max_elapsed = "none"))]
async fn payout(ctx: &Ctx, order_id: u64) -> Result<(), PayError> {
    let _ = (ctx, order_id);
    Ok(())
}

fn main() {}
