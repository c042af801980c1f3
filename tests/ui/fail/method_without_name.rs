use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct SendError;
impl Classify for SendError {
    fn classify(&self) -> Failure {
        Failure::ambiguous()
    }
}

struct Mailer;
struct Sms;

// Both methods would default to the name `send`: keyed on the same `to`,
// the SMS would replay the email's result. Each needs its type in its name.
impl Mailer {
    #[tool(class = "provider", key = "to")]
    async fn send(&self, ctx: &Ctx, to: String) -> Result<(), SendError> {
        let _ = (ctx, to);
        Ok(())
    }
}

impl Sms {
    #[tool(class = "provider", key = "to")]
    async fn send(&self, ctx: &Ctx, to: String) -> Result<(), SendError> {
        let _ = (ctx, to);
        Ok(())
    }
}

fn main() {}
