use idem::{tool, Classify, Ctx, Failure};

// The engine records every failure's `Debug` text as evidence.
struct MailError;
impl Classify for MailError {
    fn classify(&self) -> Failure {
        Failure::ambiguous()
    }
}

#[tool(class = "provider", key = "to")]
async fn send_email(ctx: &Ctx, to: String) -> Result<(), MailError> {
    let _ = (ctx, to);
    Ok(())
}

fn main() {}
