use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct MailError;
impl Classify for MailError {
    fn classify(&self) -> Failure {
        Failure::ambiguous()
    }
}

struct Mailer {
    sent: u64,
}

impl Mailer {
    #[tool(class = "provider", key = "to")]
    async fn send(&mut self, ctx: &Ctx, to: String) -> Result<(), MailError> {
        let _ = (ctx, to);
        self.sent += 1;
        Ok(())
    }

    #[tool(class = "provider", key = "to")]
    async fn send_owned(self, ctx: &Ctx, to: String) -> Result<(), MailError> {
        let _ = (ctx, to, self.sent);
        Ok(())
    }
}

fn main() {}
