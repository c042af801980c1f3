//! A journal tool whose `verify` could be asked while the dead attempt's
//! request is still being applied: refused without a `timeout`.

use idem::{tool, Classify, Ctx, Failure, Verdict};

#[derive(Debug)]
struct MailError;

impl Classify for MailError {
    fn classify(&self) -> Failure {
        Failure::ambiguous()
    }
}

#[tool(class = "journal", key = "to", verify = email_landed)]
async fn send_email(ctx: &Ctx, to: String) -> Result<(), MailError> {
    let _ = (ctx, to);
    Ok(())
}

async fn email_landed(ctx: &Ctx) -> Result<Verdict<()>, MailError> {
    let _ = ctx;
    Ok(Verdict::NotLanded)
}

fn main() {}
