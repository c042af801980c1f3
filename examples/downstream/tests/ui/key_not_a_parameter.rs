// A refund keyed on a field that is not a parameter.
use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct RefundError;
impl Classify for RefundError {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

#[tool(class = "provider", key = "order")]
async fn refund(ctx: &Ctx, order_id: u64, cents: u64) -> Result<u64, RefundError> {
    let _ = (ctx, order_id);
    Ok(cents)
}

fn main() {}
