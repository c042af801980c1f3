use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct MailError;
impl Classify for MailError {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

/// Not `Serialize`: a journaled result must be stored to be replayed.
#[derive(Debug)]
struct Receipt {
    id: String,
}

#[tool(class = "journal", key = "to", verify = "none")]
async fn send_email(ctx: &Ctx, to: String) -> Result<Receipt, MailError> {
    let _ = ctx;
    Ok(Receipt { id: to })
}

fn main() {}
