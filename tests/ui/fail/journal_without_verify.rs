use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct MailError;
impl Classify for MailError {
    fn classify(&self) -> Failure {
        Failure::ambiguous()
    }
}

#[tool(class = "journal", key = "to, order_id")]
async fn send_email(ctx: &Ctx, to: String, order_id: u64) -> Result<(), MailError> {
    let _ = (ctx, to, order_id);
    Ok(())
}

fn main() {}
