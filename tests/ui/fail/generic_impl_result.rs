use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct LookupError;
impl Classify for LookupError {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

struct Store<T, const N: usize> {
    items: Vec<T>,
}

// A result that is (or holds) the block's parameter is refused: one tool
// name would stand for every `Store<T, N>`, with one key space. A result
// that names none of them is fine, as is `T` behind a path (`a::T`).
#[tool]
impl<T: serde::Serialize + serde::de::DeserializeOwned + Clone + Send + Sync + 'static, const N: usize>
    Store<T, N>
{
    #[tool(class = "provider", key = "id")]
    async fn get(&self, ctx: &Ctx, id: u64) -> Result<T, LookupError> {
        let _ = (ctx, id);
        self.items.first().cloned().ok_or(LookupError)
    }

    #[tool(class = "provider", key = "id")]
    async fn page(&self, ctx: &Ctx, id: u64) -> Result<Vec<[u8; N]>, LookupError> {
        let _ = (ctx, id);
        Err(LookupError)
    }

    #[tool(class = "provider", key = "id")]
    async fn count(&self, ctx: &Ctx, id: u64) -> Result<u64, LookupError> {
        let _ = (ctx, id);
        Ok(self.items.len() as u64)
    }
}

fn main() {}
