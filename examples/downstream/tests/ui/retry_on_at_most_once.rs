// An at-most-once wire transfer is never retried: `retry` is refused.
use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct BankError;
impl Classify for BankError {
    fn classify(&self) -> Failure {
        Failure::ambiguous()
    }
}

#[tool(class = "at_most_once", key = "transfer_id", retry(max_attempts = 3))]
async fn wire(ctx: &Ctx, transfer_id: String) -> Result<(), BankError> {
    let _ = (ctx, transfer_id);
    Ok(())
}

fn main() {}
