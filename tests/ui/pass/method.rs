//! `&self` methods: a method verify (`verify = name` calls `self.name`), a
//! free-function verify path, and a method in a generic impl; named by
//! `#[tool]` on their `impl` block (`Tracker::open_ticket`), or by their own
//! `name`.

use std::sync::atomic::{AtomicU64, Ordering};

use idem::{tool, Classify, Ctx, Failure, Verdict};

#[derive(Debug)]
struct TicketError;

impl Classify for TicketError {
    fn classify(&self) -> Failure {
        Failure::ambiguous()
    }
}

struct Tracker {
    next: AtomicU64,
}

#[tool]
impl Tracker {
    #[tool(class = "journal", key = "title", verify = ticket_exists)]
    pub async fn open_ticket(&self, ctx: &Ctx, title: String) -> Result<u64, TicketError> {
        let _ = (ctx, title);
        Ok(self.next.fetch_add(1, Ordering::SeqCst))
    }

    async fn ticket_exists(&self, ctx: &Ctx) -> Result<Verdict<u64>, TicketError> {
        let _ = ctx.idempotency_key();
        Ok(Verdict::Landed(self.next.load(Ordering::SeqCst)))
    }

    #[tool(class = "journal", key = "id", verify = self::checks::closed)]
    async fn close_ticket(&self, ctx: &Ctx, id: u64) -> Result<(), TicketError> {
        let _ = (ctx, id);
        Ok(())
    }
}

mod checks {
    use idem::{Ctx, Verdict};

    pub async fn closed(_ctx: &Ctx) -> Result<Verdict<()>, super::TicketError> {
        Ok(Verdict::NotLanded)
    }
}

trait Backend: Send + Sync {
    fn name(&self) -> String;
}

struct Service<B> {
    backend: B,
}

impl<B: Backend> Service<B> {
    #[tool(class = "provider", key = "user", name = "greet")]
    async fn greet(&self, ctx: &Ctx, user: &str) -> Result<String, TicketError> {
        let _ = ctx;
        Ok(format!("{} greets {user}", self.backend.name()))
    }
}

struct Fake;
impl Backend for Fake {
    fn name(&self) -> String {
        "fake".into()
    }
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let rt = idem::Runtime::open(dir.path()).unwrap();
    let ctx = rt.run("m");
    let tracker = Tracker {
        next: AtomicU64::new(7),
    };
    let service = Service { backend: Fake };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        assert_eq!(tracker.open_ticket(&ctx, "broken".into()).await.unwrap(), 7);
        tracker.close_ticket(&ctx, 7).await.unwrap();
        assert_eq!(service.greet(&ctx, "ann").await.unwrap(), "fake greets ann");
    });
    let mut names: Vec<&str> = idem::tools().map(|t| t.name).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        ["Tracker::close_ticket", "Tracker::open_ticket", "greet"]
    );
}
