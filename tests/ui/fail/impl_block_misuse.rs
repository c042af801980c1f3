use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct SendError;
impl Classify for SendError {
    fn classify(&self) -> Failure {
        Failure::ambiguous()
    }
}

struct Mailer;

// Tool arguments belong on the methods, not on the block.
#[tool(class = "provider", key = "to")]
impl Mailer {
    #[tool(class = "provider", key = "to")]
    async fn send(&self, ctx: &Ctx, to: String) -> Result<(), SendError> {
        let _ = (ctx, to);
        Ok(())
    }
}

struct Sms;

// A block without a single tool method: the attribute does nothing.
#[tool]
impl Sms {
    async fn send(&self, ctx: &Ctx, to: String) -> Result<(), SendError> {
        let _ = (ctx, to);
        Ok(())
    }
}

struct Pair;
trait Named {}

// No type name to give the tools.
#[tool]
impl Named for (Pair, Pair) {}

fn main() {}
