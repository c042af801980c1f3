use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct WireError;
impl Classify for WireError {
    fn classify(&self) -> Failure {
        Failure::ambiguous()
    }
}

#[tool(class = "provider", key = "to", approval_wait = "10m", commit = "later")]
async fn wire(ctx: &Ctx, to: String) -> Result<(), WireError> {
    let _ = (ctx, to);
    Ok(())
}

fn main() {}
