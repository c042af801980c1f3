use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct UploadError;
impl Classify for UploadError {
    fn classify(&self) -> Failure {
        Failure::not_sent()
    }
}

/// A one-shot stream: cannot be replayed for a second attempt.
struct Body {
    bytes: Vec<u8>,
}

#[tool(class = "provider", key = "name")]
async fn upload(ctx: &Ctx, name: String, body: Body) -> Result<usize, UploadError> {
    let _ = (ctx, name);
    Ok(body.bytes.len())
}

fn main() {}
