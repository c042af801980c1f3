use idem::tool;

#[tool(class = "read_only")]
struct Mailer {
    host: String,
}

fn main() {}
