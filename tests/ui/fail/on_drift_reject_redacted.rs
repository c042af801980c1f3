use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct BankError;
impl Classify for BankError {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

#[tool(class = "provider", key = "transfer_id", redact = "iban", on_drift(reject = "amount, iban"))]
async fn transfer(ctx: &Ctx, transfer_id: u64, amount: u64, iban: String) -> Result<(), BankError> {
    let _ = (ctx, transfer_id, amount, iban);
    Ok(())
}

#[tool(class = "provider", key = "transfer_id", on_drift(rejects = "amount"))]
async fn misspelt(ctx: &Ctx, transfer_id: u64, amount: u64) -> Result<(), BankError> {
    let _ = (ctx, transfer_id, amount);
    Ok(())
}

#[tool(class = "provider", key = "transfer_id", on_drift())]
async fn empty(ctx: &Ctx, transfer_id: u64, amount: u64) -> Result<(), BankError> {
    let _ = (ctx, transfer_id, amount);
    Ok(())
}

fn main() {}
