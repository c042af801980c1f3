use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct PayError;
impl Classify for PayError {
    fn classify(&self) -> Failure {
        Failure::ambiguous()
    }
}

// Six independent mistakes, reported together in one build; the function
// itself is left as written, so no secondary error about its body appears.
#[tool(
    class = "journal",
    key = "order_id, amount",
    redact = "cvc",
    timeout = "soon",
    on_drift = "ignore"
)]
fn charge(ctx: &Ctx, order_id: u64, card: String) -> Result<(), PayError> {
    let _ = (ctx, order_id, card);
    Ok(())
}

fn main() {}
