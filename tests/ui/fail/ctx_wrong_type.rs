use idem::{tool, Classify, Failure};

#[derive(Debug)]
struct PayError;
impl Classify for PayError {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

#[tool(class = "provider", key = "order_id")]
async fn charge(run_id: &str, order_id: u64) -> Result<(), PayError> {
    let _ = (run_id, order_id);
    Ok(())
}

fn main() {}
