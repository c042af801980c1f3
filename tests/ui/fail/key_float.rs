use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct PayError;
impl Classify for PayError {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

#[tool(class = "provider", key = "order_id, amount")]
async fn charge(ctx: &Ctx, order_id: u64, amount: f64) -> Result<(), PayError> {
    let _ = (ctx, order_id, amount);
    Ok(())
}

#[derive(Clone)]
struct Quote {
    rate: f32,
}

#[tool(class = "provider", key = "quote.rate")]
async fn convert(ctx: &Ctx, quote: Quote) -> Result<(), PayError> {
    let _ = (ctx, quote.rate);
    Ok(())
}

fn main() {}
