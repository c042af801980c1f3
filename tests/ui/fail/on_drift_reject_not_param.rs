use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct BankError;
impl Classify for BankError {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

#[tool(class = "provider", key = "transfer_id", on_drift(reject = "amount, ibam, ctx, memo.len"))]
async fn transfer(ctx: &Ctx, transfer_id: u64, amount: u64, iban: String, memo: String) -> Result<(), BankError> {
    let _ = (ctx, transfer_id, amount, iban, memo);
    Ok(())
}

fn main() {}
