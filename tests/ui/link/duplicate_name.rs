//! Two tools of one name in one binary would share keys: `b::send(&ctx, 1)`
//! would replay `a::send`'s result without running. The build refuses it.

use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct E;
impl Classify for E {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

mod a {
    use super::*;

    #[tool(class = "provider", key = "id")]
    pub async fn send(ctx: &Ctx, id: u64) -> Result<u64, E> {
        let _ = ctx;
        Ok(id)
    }
}

mod b {
    use super::*;

    #[tool(class = "provider", key = "id")]
    pub async fn send(ctx: &Ctx, id: u64) -> Result<u64, E> {
        let _ = ctx;
        Ok(id + 1)
    }
}

fn main() {
    let _ = (a::send, b::send);
}
