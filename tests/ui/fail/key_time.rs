use std::time::{Instant, SystemTime};

use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct CalError;
impl Classify for CalError {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

#[tool(class = "at_most_once", key = "at, deadline")]
async fn book(ctx: &Ctx, at: SystemTime, deadline: Instant) -> Result<(), CalError> {
    let _ = (ctx, at, deadline);
    Ok(())
}

fn main() {}
