//! Type parameters, where clauses, `impl Trait` arguments, lifetimes on
//! reference parameters, `mut` parameters, and an unnamed context.

use std::fmt::Display;

use idem::{tool, Classify, Ctx, Failure, KeyPart};
use serde::de::DeserializeOwned;
use serde::Serialize;

#[derive(Debug)]
struct E;
impl Classify for E {
    fn classify(&self) -> Failure {
        Failure::not_sent()
    }
}

#[tool(class = "journal", key = "id", verify = "none")]
async fn store<K, V>(ctx: &Ctx, id: K, value: V) -> Result<V, E>
where
    K: KeyPart + Serialize + Clone + Send + Sync,
    V: Serialize + DeserializeOwned + Clone + Send,
{
    let _ = (ctx, id);
    Ok(value)
}

#[tool(class = "provider", key = "tenant, name")]
async fn label<'a, 'b: 'a>(
    ctx: &'a Ctx,
    tenant: &'a str,
    name: &'b str,
    mut suffix: String,
) -> Result<String, E> {
    let _ = ctx;
    suffix.push('!');
    Ok(format!("{tenant}/{name}{suffix}"))
}

#[tool(class = "read_only")]
async fn describe(_: &Ctx, what: impl Display + Clone + Send) -> Result<String, E> {
    Ok(what.to_string())
}

#[tool(class = "provider", key = "n")]
async fn count<const N: usize>(ctx: &Ctx, n: [u8; N]) -> Result<usize, E> {
    let _ = ctx;
    Ok(n.len())
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let rt = idem::Runtime::open(dir.path()).unwrap();
    let ctx = rt.run("generic");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        assert_eq!(store(&ctx, 1u32, vec![1u8]).await.unwrap(), [1]);
        assert_eq!(store(&ctx, "k", "v".to_string()).await.unwrap(), "v");
        let tenant = String::from("acme");
        assert_eq!(
            label(&ctx, &tenant, "inbox", "x".into()).await.unwrap(),
            "acme/inboxx!"
        );
        assert_eq!(describe(&ctx, 42).await.unwrap(), "42");
        assert_eq!(count(&ctx, [1, 2, 3]).await.unwrap(), 3);
    });
}
