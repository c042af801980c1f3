// `dispatch = true` says the tool must be callable with JSON: what stands
// in the way is a compile error on the code at fault.
use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct E;
impl Classify for E {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

/// Not `Deserialize`.
#[derive(Clone, Debug)]
struct Card {
    number: String,
}

/// Not `Serialize`.
struct Report;

#[tool(class = "provider", key = "id", dispatch = true)]
async fn opaque_argument(ctx: &Ctx, id: u64, card: Card) -> Result<(), E> {
    let _ = (ctx, id, card.number);
    Ok(())
}

#[tool(class = "read_only", dispatch = true)]
async fn opaque_result(ctx: &Ctx) -> Result<Report, E> {
    let _ = ctx;
    Ok(Report)
}

#[tool(class = "provider", key = "name", dispatch = true)]
async fn borrowed(ctx: &Ctx, name: &str) -> Result<(), E> {
    let _ = (ctx, name);
    Ok(())
}

#[tool(class = "provider", key = "id", dispatch = true)]
async fn generic<T: Clone + serde::Serialize>(ctx: &Ctx, id: u64, extra: T) -> Result<(), E> {
    let _ = (ctx, id, extra);
    Ok(())
}

struct Shop;

impl Shop {
    // Not in a `#[tool]` impl block: nothing registers it.
    #[tool(class = "provider", key = "id", name = "Shop::charge", dispatch = true)]
    async fn charge(&self, ctx: &Ctx, id: u64) -> Result<(), E> {
        let _ = (ctx, id);
        Ok(())
    }
}

struct Generic<T>(T);

#[tool]
impl<T: Send + Sync> Generic<T> {
    #[tool(class = "provider", key = "id", dispatch = true)]
    async fn charge(&self, ctx: &Ctx, id: u64) -> Result<(), E> {
        let _ = (ctx, id, &self.0);
        Ok(())
    }
}

fn main() {}
