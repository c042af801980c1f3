use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct MailError;
impl Classify for MailError {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

#[tool(class = "readonly")]
async fn lookup(ctx: &Ctx, id: u64) -> Result<u64, MailError> {
    let _ = ctx;
    Ok(id)
}

#[tool(class = "idempotent", key = "to")]
async fn send_email(ctx: &Ctx, to: String) -> Result<(), MailError> {
    let _ = (ctx, to);
    Ok(())
}

#[tool(class = journal, key = "to", verify = "none")]
async fn send_sms(ctx: &Ctx, to: String) -> Result<(), MailError> {
    let _ = (ctx, to);
    Ok(())
}

fn main() {}
