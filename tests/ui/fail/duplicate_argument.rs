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
    key = "order_id",
    class = "journal",
    retry(initial = "1s", initial = "2s")
)]
async fn charge(ctx: &Ctx, order_id: u64) -> Result<(), PayError> {
    let _ = (ctx, order_id);
    Ok(())
}

fn main() {}
