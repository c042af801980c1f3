use idem::{tool, Classify, Ctx, Failure, Verdict};

#[derive(Debug)]
struct MailError;
impl Classify for MailError {
    fn classify(&self) -> Failure {
        Failure::ambiguous()
    }
}

// Not `async`: the verify call returns a `Result`, not a future.
fn email_landed(_ctx: &Ctx) -> Result<Verdict<u64>, MailError> {
    Ok(Verdict::Unknown)
}

#[tool(class = "journal", timeout = "30s", key = "to", verify = email_landed)]
async fn send_email(ctx: &Ctx, to: String) -> Result<u64, MailError> {
    let _ = (ctx, to);
    Ok(1)
}

fn main() {}
