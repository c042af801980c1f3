use idem::{tool, Classify, Ctx, Failure, Verdict};

#[derive(Debug)]
struct MailError;
impl Classify for MailError {
    fn classify(&self) -> Failure {
        Failure::ambiguous()
    }
}

// Answers about a `String` receipt; the tool returns a `u64` id.
async fn email_landed(_ctx: &Ctx) -> Result<Verdict<String>, MailError> {
    Ok(Verdict::Unknown)
}

#[tool(class = "journal", timeout = "30s", key = "to", verify = email_landed)]
async fn send_email(ctx: &Ctx, to: String) -> Result<u64, MailError> {
    let _ = (ctx, to);
    Ok(1)
}

fn main() {}
