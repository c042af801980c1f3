use idem::{tool, Classify, Ctx, Failure, Verdict};

#[derive(Debug)]
struct PayError;
impl Classify for PayError {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

async fn charged(_ctx: &Ctx) -> Result<Verdict<()>, PayError> {
    Ok(Verdict::Unknown)
}

#[tool(class = "provider", key = "order_id", verify = charged)]
async fn charge(ctx: &Ctx, order_id: u64) -> Result<(), PayError> {
    let _ = (ctx, order_id);
    Ok(())
}

#[tool(class = "at_most_once", key = "order_id", verify = "none")]
async fn wire(ctx: &Ctx, order_id: u64) -> Result<(), PayError> {
    let _ = (ctx, order_id);
    Ok(())
}

#[tool(class = "provider", key = "order_id", dedupe_window = "24h")]
async fn ok_window(ctx: &Ctx, order_id: u64) -> Result<(), PayError> {
    let _ = (ctx, order_id);
    Ok(())
}

#[tool(
    class = "journal",
    key = "order_id",
    verify = "none",
    dedupe_window = "24h"
)]
async fn journal_window(ctx: &Ctx, order_id: u64) -> Result<(), PayError> {
    let _ = (ctx, order_id);
    Ok(())
}

fn main() {}
