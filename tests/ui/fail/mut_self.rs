use std::sync::Arc;

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
    #[tool(class = "provider", key = "to", name = "send")]
    async fn send(&mut self, ctx: &Ctx, to: String) -> Result<(), MailError> {
        let _ = (ctx, to);
        self.sent += 1;
        Ok(())
    }

    #[tool(class = "provider", key = "to", name = "owned")]
    async fn send_owned(self, ctx: &Ctx, to: String) -> Result<(), MailError> {
        let _ = (ctx, to, self.sent);
        Ok(())
    }

    #[tool(class = "provider", key = "to", name = "shared")]
    async fn send_shared(self: Arc<Self>, ctx: &Ctx, to: String) -> Result<(), MailError> {
        let _ = (ctx, to, self.sent);
        Ok(())
    }
}

fn main() {}
