use idem::{tool, Classify, Ctx, Failure};
use serde::{Deserialize, Serialize};

#[derive(Debug)]
struct ShopError;
impl Classify for ShopError {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Charge {
    id: String,
}

// Takes the charge's id, not the charge.
#[tool(class = "provider", key = "id")]
async fn refund(ctx: &Ctx, id: &String) -> Result<(), ShopError> {
    let _ = (ctx, id);
    Ok(())
}

#[tool(class = "provider", key = "order", compensate = refund)]
async fn charge(ctx: &Ctx, order: u64) -> Result<Charge, ShopError> {
    let _ = ctx;
    Ok(Charge { id: order.to_string() })
}

// Takes the charge and only some of the arguments.
#[tool(class = "provider", key = "charge.id")]
async fn refund_part(ctx: &Ctx, charge: &Charge, order: &u64) -> Result<(), ShopError> {
    let _ = (ctx, charge, order);
    Ok(())
}

#[tool(class = "provider", key = "order", compensate = refund_part)]
async fn charge_twice(ctx: &Ctx, order: u64, amount: u64) -> Result<Charge, ShopError> {
    let _ = (ctx, amount);
    Ok(Charge { id: order.to_string() })
}

fn main() {}
