use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct E;
impl Classify for E {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

// A build for another platform would derive other keys for the same orders.
#[tool(class = "provider", key = "order_id, tenant")]
async fn charge(
    ctx: &Ctx,
    order_id: u64,
    #[cfg(unix)] tenant: String,
) -> Result<(), E> {
    let _ = (ctx, order_id);
    #[cfg(unix)]
    let _ = tenant;
    Ok(())
}

fn main() {}
