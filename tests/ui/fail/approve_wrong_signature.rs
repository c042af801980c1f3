use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct WireError;
impl Classify for WireError {
    fn classify(&self) -> Failure {
        Failure::ambiguous()
    }
}

/// Takes the amount by value and returns a bool: not a policy.
fn large(_ctx: &Ctx, _to: &String, cents: u64) -> bool {
    cents > 100_000
}

#[tool(class = "provider", key = "to, cents", approve = large)]
async fn wire(ctx: &Ctx, to: String, cents: u64) -> Result<(), WireError> {
    let _ = (ctx, to, cents);
    Ok(())
}

fn main() {}
