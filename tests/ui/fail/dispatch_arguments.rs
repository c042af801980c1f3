// The dispatch arguments' own mistakes: values of the wrong kind, and
// settings that contradict each other or the class.
use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct E;
impl Classify for E {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

#[tool(class = "provider", key = "id", dispatch = "yes")]
async fn not_a_bool(ctx: &Ctx, id: u64) -> Result<(), E> {
    let _ = (ctx, id);
    Ok(())
}

#[tool(class = "provider", key = "id", destructive = "no")]
async fn destructive_not_a_bool(ctx: &Ctx, id: u64) -> Result<(), E> {
    let _ = (ctx, id);
    Ok(())
}

#[tool(class = "read_only", destructive = false)]
async fn destructive_read_only(ctx: &Ctx, id: u64) -> Result<(), E> {
    let _ = (ctx, id);
    Ok(())
}

fn ids_schema() -> serde_json::Value {
    serde_json::json!({ "type": "object" })
}

#[tool(class = "provider", key = "id", dispatch = false, schema = ids_schema)]
async fn schema_without_dispatcher(ctx: &Ctx, id: u64) -> Result<(), E> {
    let _ = (ctx, id);
    Ok(())
}

#[tool(class = "provider", key = "id", schema = "ids_schema")]
async fn schema_not_a_path(ctx: &Ctx, id: u64) -> Result<(), E> {
    let _ = (ctx, id);
    Ok(())
}

fn main() {}
