use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct PayError;
impl Classify for PayError {
    fn classify(&self) -> Failure {
        Failure::ambiguous()
    }
}

#[tool(
    class = "provider",
    key = "order_id",
    timeout = "30",
    dedupe_window = "1y",
    retry(
        initial = "0s",
        max_interval = "1.s",
        max_elapsed = 3600,
        backoff = 0.5,
        max_attempts = 0
    )
)]
async fn charge(ctx: &Ctx, order_id: u64) -> Result<(), PayError> {
    let _ = (ctx, order_id);
    Ok(())
}

#[tool(
    class = "provider",
    key = "order_id",
    retry(initial = "10s", max_interval = "5s")
)]
async fn refund(ctx: &Ctx, order_id: u64) -> Result<(), PayError> {
    let _ = (ctx, order_id);
    Ok(())
}

fn main() {}
