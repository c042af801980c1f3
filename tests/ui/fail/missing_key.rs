use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct PayError;
impl Classify for PayError {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

#[tool(class = "provider")]
async fn charge(ctx: &Ctx, order_id: u64, cents: u64) -> Result<(), PayError> {
    let _ = (ctx, order_id, cents);
    Ok(())
}

fn main() {}
