use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct PayError;
impl Classify for PayError {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

#[derive(Clone, Debug)]
struct Order {
    id: u64,
}

#[tool(class = "provider", key = "order.number")]
async fn charge(ctx: &Ctx, order: Order) -> Result<(), PayError> {
    let _ = (ctx, order.id);
    Ok(())
}

fn main() {}
