use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct PayError;
impl Classify for PayError {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

#[tool(class = "provider", key = "order_id")]
async fn charge(ctx: Ctx, order_id: u64) -> Result<(), PayError> {
    let _ = (ctx, order_id);
    Ok(())
}

#[tool(class = "provider", key = "order_id")]
async fn refund(ctx: &mut Ctx, order_id: u64) -> Result<(), PayError> {
    let _ = (ctx, order_id);
    Ok(())
}

fn main() {}
