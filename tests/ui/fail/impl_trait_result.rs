use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct E;
impl Classify for E {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

// A journaled result is stored and replayed: it needs a concrete type.
#[tool(class = "provider", key = "below")]
async fn evens(ctx: &Ctx, below: u32) -> Result<impl Iterator<Item = u32>, E> {
    let _ = ctx;
    Ok((0..below).filter(|n| n % 2 == 0))
}

// The error type is classified and wrapped: it needs a name too.
#[tool(class = "read_only")]
async fn odds(ctx: &Ctx, below: u32) -> Result<Vec<u32>, impl Classify + std::fmt::Debug> {
    let _ = ctx;
    if below == 0 {
        return Err(E);
    }
    Ok((0..below).filter(|n| n % 2 == 1).collect())
}

fn main() {}
