use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct MailError;
impl Classify for MailError {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

#[tool(key = "to")]
async fn send_email(ctx: &Ctx, to: String) -> Result<(), MailError> {
    let _ = (ctx, to);
    Ok(())
}

fn main() {}
