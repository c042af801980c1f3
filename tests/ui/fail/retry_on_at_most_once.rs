use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct WireError;
impl Classify for WireError {
    fn classify(&self) -> Failure {
        Failure::ambiguous()
    }
}

#[tool(class = "at_most_once", key = "transfer_id", retry(max_attempts = 3))]
async fn wire(ctx: &Ctx, transfer_id: String, cents: u64) -> Result<(), WireError> {
    let _ = (ctx, transfer_id, cents);
    Ok(())
}

fn main() {}
