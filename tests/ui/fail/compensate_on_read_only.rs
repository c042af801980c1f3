use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct ShopError;
impl Classify for ShopError {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

#[tool(class = "provider", key = "seen")]
async fn undo_lookup(ctx: &Ctx, seen: &String) -> Result<(), ShopError> {
    let _ = (ctx, seen);
    Ok(())
}

#[tool(class = "read_only", compensate = undo_lookup)]
async fn lookup(ctx: &Ctx, order: u64) -> Result<String, ShopError> {
    let _ = ctx;
    Ok(order.to_string())
}

#[tool(class = "provider", key = "order", compensate = "refund")]
async fn charge(ctx: &Ctx, order: u64) -> Result<String, ShopError> {
    let _ = ctx;
    Ok(order.to_string())
}

fn main() {}
