use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct WireError;
impl Classify for WireError {
    fn classify(&self) -> Failure {
        Failure::ambiguous()
    }
}

#[tool(class = "read_only", approve = "always")]
async fn balance(ctx: &Ctx, account: String) -> Result<u64, WireError> {
    let _ = (ctx, account);
    Ok(0)
}

fn main() {}
