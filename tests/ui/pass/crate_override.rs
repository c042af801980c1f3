//! `crate = "..."` for code that reaches idem through another path, e.g. a
//! framework re-exporting it.

mod framework {
    pub use ::idem as rt;
}

use framework::rt::{Classify, Ctx, Failure};

#[derive(Debug)]
struct E;
impl Classify for E {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

#[framework::rt::tool(class = "provider", key = "id", crate = "crate::framework::rt")]
async fn act(ctx: &Ctx, id: u64) -> Result<u64, E> {
    let _ = ctx;
    Ok(id)
}

#[framework::rt::tool(class = "read_only", crate = framework::rt)]
async fn look(ctx: &Ctx, id: u64) -> Result<u64, E> {
    let _ = ctx;
    Ok(id)
}

fn main() {
    let _ = (act, look);
}
