use idem::{tool, Classify, Failure};

#[derive(Debug)]
struct PayError;
impl Classify for PayError {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

#[tool(class = "read_only")]
async fn health() -> Result<(), PayError> {
    Ok(())
}

#[tool(class = "provider", key = "order_id")]
async fn charge(order_id: u64, cents: u64) -> Result<(), PayError> {
    let _ = (order_id, cents);
    Ok(())
}

fn main() {}
