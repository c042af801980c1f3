use idem::{tool, Ctx};

#[tool(class = "read_only")]
async fn order_status(ctx: &Ctx, order_id: u64) -> String {
    let _ = ctx;
    order_id.to_string()
}

#[tool(class = "read_only")]
async fn ping(ctx: &Ctx) {
    let _ = ctx;
}

#[tool(class = "read_only")]
async fn read_file(ctx: &Ctx, path: String) -> std::io::Result<String> {
    let _ = ctx;
    std::fs::read_to_string(path)
}

fn main() {}
