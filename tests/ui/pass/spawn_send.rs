//! The futures a tool returns are `Send` when its body is: they can be
//! spawned on a multi-threaded runtime.

use std::future::Future;
use std::sync::Arc;

use idem::{tool, Classify, Ctx, Failure};

#[derive(Debug)]
struct E;
impl Classify for E {
    fn classify(&self) -> Failure {
        Failure::ambiguous()
    }
}

fn assert_send<F: Future + Send>(f: F) -> F {
    f
}

#[tool(class = "provider", key = "order_id", retry(initial = "1ms"))]
async fn charge(ctx: &Ctx, order_id: u64, note: Arc<String>) -> Result<u64, E> {
    tokio::task::yield_now().await;
    let _ = (ctx.idempotency_key(), note);
    Ok(order_id)
}

struct Client {
    base: String,
}

#[idem::tool]
impl Client {
    #[tool(class = "journal", key = "path", verify = found)]
    async fn put(&self, ctx: &Ctx, path: String) -> Result<String, E> {
        tokio::task::yield_now().await;
        let _ = ctx;
        Ok(format!("{}/{path}", self.base))
    }

    async fn found(&self, _ctx: &Ctx) -> Result<idem::Verdict<String>, E> {
        Ok(idem::Verdict::NotLanded)
    }
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let rt = idem::Runtime::open(dir.path()).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client = Arc::new(Client {
        base: "https://x".into(),
    });
    runtime.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..4 {
            let ctx = rt.run("spawned");
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                let a = assert_send(charge(&ctx, i, Arc::new("n".into())))
                    .await
                    .unwrap();
                let b = assert_send(client.put(&ctx, format!("p{i}")))
                    .await
                    .unwrap();
                (a, b)
            }));
        }
        for (i, t) in tasks.into_iter().enumerate() {
            assert_eq!(t.await.unwrap(), (i as u64, format!("https://x/p{i}")));
        }
    });
}
