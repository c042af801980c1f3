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
    keys = "order_id",
    dedup_window = "24h",
    retry(max_attempt = 3, jiter = false),
    idempotent = true
)]
async fn charge(ctx: &Ctx, order_id: u64) -> Result<(), PayError> {
    let _ = (ctx, order_id);
    Ok(())
}

fn main() {}
