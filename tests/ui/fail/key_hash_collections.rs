use std::collections::{HashMap, HashSet};

use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct TicketError;
impl Classify for TicketError {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

#[tool(class = "journal", key = "labels, watchers", verify = "none")]
async fn open_ticket(
    ctx: &Ctx,
    labels: HashMap<String, String>,
    watchers: HashSet<u64>,
) -> Result<u64, TicketError> {
    let _ = (ctx, labels, watchers);
    Ok(1)
}

fn main() {}
