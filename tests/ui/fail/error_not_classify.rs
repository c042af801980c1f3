use idem::{tool, Ctx};

#[derive(Debug)]
enum MailError {
    Timeout,
}

#[tool(class = "journal", key = "to", verify = "none")]
async fn send_email(ctx: &Ctx, to: String) -> Result<(), MailError> {
    let _ = (ctx, to);
    Err(MailError::Timeout)
}

fn main() {}
