use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct PayError;
impl Classify for PayError {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

#[tool(class = "provider", key = "order_id", redact = "card_number, ctx")]
async fn charge(ctx: &Ctx, order_id: u64, card: String) -> Result<(), PayError> {
    let _ = (ctx, order_id, card);
    Ok(())
}

fn main() {}
