// A `verify` belongs to journal tools; a provider deduplicates by itself.
use idem::{tool, Classify, Ctx, Failure, Verdict};

#[derive(Debug)]
struct RefundError;
impl Classify for RefundError {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

#[tool(class = "provider", key = "order_id", verify = refunded)]
async fn refund(ctx: &Ctx, order_id: u64) -> Result<u64, RefundError> {
    let _ = ctx;
    Ok(order_id)
}

async fn refunded(_ctx: &Ctx) -> Result<Verdict<u64>, RefundError> {
    Ok(Verdict::NotLanded)
}

fn main() {}
