use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct DbError;
impl Classify for DbError {
    fn classify(&self) -> Failure {
        Failure::not_sent()
    }
}

#[tool(class = "read_only")]
fn order_status(ctx: &Ctx, order_id: u64) -> Result<String, DbError> {
    let _ = ctx;
    Ok(order_id.to_string())
}

fn main() {}
