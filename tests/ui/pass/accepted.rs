//! Tools of every class and everyday shape that must compile and run:
//! free functions, `verify = "none"`, generics and lifetimes, key fields of
//! every shape, method tools, spawnable futures, and a `crate = "..."`
//! override. One binary for all of them, one module each: trybuild builds
//! and links every pass case on its own, which is most of the suite's time.

#![deny(warnings)]

/// Free functions of every class, run against a journal in a temp dir.
mod classes {
    use idem::{tool, Classify, Ctx, Failure, Runtime, Verdict};
    use serde::{Deserialize, Serialize};

    #[derive(Debug)]
    enum MailError {
        Refused,
        Timeout,
    }

    impl Classify for MailError {
        fn classify(&self) -> Failure {
            match self {
                MailError::Refused => Failure::not_sent(),
                MailError::Timeout => Failure::ambiguous(),
            }
        }
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Receipt {
        id: String,
    }

    #[tool(class = "read_only")]
    async fn order_total(ctx: &Ctx, order_id: u64) -> Result<u64, MailError> {
        let _ = ctx;
        Ok(order_id * 100)
    }

    #[tool(
        class = "provider",
        key = "order_id",
        dedupe_window = "24h",
        timeout = "30s"
    )]
    async fn charge(ctx: &Ctx, order_id: u64, cents: u64) -> Result<String, MailError> {
        Ok(format!("{}:{order_id}:{cents}", ctx.idempotency_key()))
    }

    #[tool(class = "journal", timeout = "30s", key = "to, template, order_id", verify = email_landed, redact = "body")]
    async fn send_email(
        ctx: &Ctx,
        to: String,
        template: String,
        order_id: u64,
        body: String,
    ) -> Result<Receipt, MailError> {
        let _ = (ctx, &template, &body);
        if to.is_empty() {
            return Err(MailError::Refused);
        }
        Ok(Receipt {
            id: format!("{to}-{order_id}"),
        })
    }

    async fn email_landed(ctx: &Ctx) -> Result<Verdict<Receipt>, MailError> {
        let _ = ctx.idempotency_key();
        Err(MailError::Timeout)
    }

    #[tool(
        class = "at_most_once",
        key = "transfer_id",
        on_drift = "reject",
        name = "wire_v1"
    )]
    async fn wire(_ctx: &Ctx, transfer_id: String, cents: u64) -> Result<(), MailError> {
        let _ = (transfer_id, cents);
        Ok(())
    }

    pub fn run() {
        let dir = tempfile::tempdir().unwrap();
        let rt = Runtime::open(dir.path()).unwrap();
        let ctx = rt.run("order-4711");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            assert_eq!(order_total(&ctx, 2).await.unwrap(), 200);
            let charged = charge(&ctx, 4711, 1999).await.unwrap();
            assert!(charged.starts_with("charge-"));
            let receipt = send_email(&ctx, "a@b.c".into(), "r".into(), 4711, "hi".into()).await;
            assert_eq!(receipt.unwrap().id, "a@b.c-4711");
            wire(&ctx, "t-1".into(), 5).await.unwrap();
        });
        assert_eq!(idem::tools().filter(|t| t.name == "wire_v1").count(), 1);
    }
}

/// `verify = "none"`: every unknown outcome goes to a human.
mod verify_none {
    use idem::{tool, Classify, Ctx, Failure, ToolError};

    #[derive(Debug)]
    struct SmsError;
    impl Classify for SmsError {
        fn classify(&self) -> Failure {
            Failure::ambiguous()
        }
    }

    #[tool(class = "journal", key = "to", verify = "none", retry(initial = "1ms"))]
    async fn send_sms(ctx: &Ctx, to: String) -> Result<(), SmsError> {
        let _ = (ctx, to);
        Err(SmsError)
    }

    pub fn run() {
        let dir = tempfile::tempdir().unwrap();
        let rt = idem::Runtime::open(dir.path()).unwrap();
        let ctx = rt.run("sms");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let err = runtime.block_on(send_sms(&ctx, "+49".into())).unwrap_err();
        // Nothing can tell whether the SMS went out: a human decides.
        assert!(matches!(err, ToolError::Escalated { .. }));
        assert_eq!(runtime.block_on(rt.escalations()).unwrap().len(), 1);
    }
}

/// Type parameters, where clauses, `impl Trait` arguments, lifetimes on
/// reference parameters, `mut` parameters, and an unnamed context.
mod generics {
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

    pub fn run() {
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
}

/// Key fields of every everyday shape: references, `Vec`, `Option`,
/// tuples, arrays, `BTreeMap`, field paths (named and tuple index), smart
/// pointers, a user type implementing `KeyPart`, and a trailing comma.
mod key_shapes {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::Arc;

    use idem::{tool, Classify, Ctx, Failure, KeyEncoder, KeyPart};

    #[derive(Debug)]
    struct E;
    impl Classify for E {
        fn classify(&self) -> Failure {
            Failure::Semantic
        }
    }

    #[derive(Clone)]
    struct Customer {
        id: u64,
        address: Address,
    }

    #[derive(Clone)]
    struct Address {
        country: String,
    }

    #[derive(Clone)]
    struct Sku(String);

    impl KeyPart for Sku {
        fn encode_key(&self, enc: &mut KeyEncoder) {
            enc.record("Sku", 1);
            self.0.encode_key(enc);
        }
    }

    #[tool(
        class = "provider",
        key = "to, lines, coupon, pair, pair.0, customer.id, customer.address.country, skus, tags, sku, shared, set, bytes,"
    )]
    #[allow(clippy::too_many_arguments)]
    async fn order(
        ctx: &Ctx,
        to: &str,
        lines: Vec<(String, u32)>,
        coupon: Option<String>,
        pair: (u8, char),
        customer: Customer,
        skus: [u16; 3],
        tags: BTreeMap<String, bool>,
        sku: Sku,
        shared: Arc<str>,
        set: BTreeSet<i64>,
        bytes: &[u8],
    ) -> Result<String, E> {
        let _ = (lines, coupon, pair, skus, tags, sku.0, shared, set, bytes);
        let _ = customer.address.country;
        Ok(format!("{to}/{}/{}", customer.id, ctx.idempotency_key()))
    }

    pub fn run() {
        let dir = tempfile::tempdir().unwrap();
        let rt = idem::Runtime::open(dir.path()).unwrap();
        let ctx = rt.run("shapes");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let customer = Customer {
            id: 7,
            address: Address {
                country: "DE".into(),
            },
        };
        let out = runtime.block_on(order(
            &ctx,
            "ann",
            vec![("apple".into(), 2)],
            None,
            (1, 'x'),
            customer,
            [1, 2, 3],
            BTreeMap::from([("gift".to_string(), true)]),
            Sku("sku-1".into()),
            Arc::from("shared"),
            BTreeSet::from([-1, 1]),
            b"raw",
        ));
        assert!(out.unwrap().starts_with("ann/7/order-"));
    }
}

/// `&self` methods: a method verify (`verify = name` calls `self.name`), a
/// free-function verify path, and a method in a generic impl; named by
/// `#[tool]` on their `impl` block (`Tracker::open_ticket`), or by their own
/// `name`.
mod methods {
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
        #[tool(class = "journal", timeout = "30s", key = "title", verify = ticket_exists)]
        pub async fn open_ticket(&self, ctx: &Ctx, title: String) -> Result<u64, TicketError> {
            let _ = (ctx, title);
            Ok(self.next.fetch_add(1, Ordering::SeqCst))
        }

        async fn ticket_exists(&self, ctx: &Ctx) -> Result<Verdict<u64>, TicketError> {
            let _ = ctx.idempotency_key();
            Ok(Verdict::Landed(self.next.load(Ordering::SeqCst)))
        }

        #[tool(class = "journal", timeout = "30s", key = "id", verify = self::checks::closed)]
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

    pub fn run() {
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
        let names: Vec<&str> = idem::tools().map(|t| t.name).collect();
        for name in ["Tracker::open_ticket", "Tracker::close_ticket", "greet"] {
            assert!(names.contains(&name), "{name} in {names:?}");
        }
        assert!(!names.contains(&"open_ticket"), "{names:?}");
    }
}

/// The futures a tool returns are `Send` when its body is: they can be
/// spawned on a multi-threaded runtime.
mod spawn_send {
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

    #[tool(
        class = "provider",
        name = "spawn_send::charge",
        key = "order_id",
        retry(initial = "1ms")
    )]
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
        #[tool(class = "journal", timeout = "30s", key = "path", verify = found)]
        async fn put(&self, ctx: &Ctx, path: String) -> Result<String, E> {
            tokio::task::yield_now().await;
            let _ = ctx;
            Ok(format!("{}/{path}", self.base))
        }

        async fn found(&self, _ctx: &Ctx) -> Result<idem::Verdict<String>, E> {
            Ok(idem::Verdict::NotLanded)
        }
    }

    pub fn run() {
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
}

/// `crate = "..."` for code that reaches idem through another path, e.g. a
/// framework re-exporting it. The framework here also replaces two of the
/// generated code's entry points with counting ones: the counts prove the
/// expansion goes through the path given, not through `::idem`.
mod crate_override {
    use std::sync::atomic::{AtomicUsize, Ordering};

    mod framework {
        pub mod rt {
            pub use ::idem::*;

            /// idem's, except for two counted entry points (a local item
            /// shadows the glob import).
            pub mod __private {
                pub use ::idem::__private::*;

                use crate::crate_override::{CLASSIFY_CHECKS, KEYS};
                use std::sync::atomic::Ordering;

                pub fn key(ctx: &Ctx, tool: &'static ToolDescriptor) -> ::idem::__private::KeyBuilder {
                    KEYS.fetch_add(1, Ordering::SeqCst);
                    ::idem::__private::key(ctx, tool)
                }

                #[allow(clippy::extra_unused_type_parameters)]
                pub fn assert_classify<E: ::idem::Classify + std::fmt::Debug>() {
                    CLASSIFY_CHECKS.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    }

    static KEYS: AtomicUsize = AtomicUsize::new(0);
    static CLASSIFY_CHECKS: AtomicUsize = AtomicUsize::new(0);

    use framework::rt::{Classify, Ctx, Failure};

    #[derive(Debug)]
    struct E;
    impl Classify for E {
        fn classify(&self) -> Failure {
            Failure::Semantic
        }
    }

    #[framework::rt::tool(
        class = "provider",
        key = "id",
        crate = "crate::crate_override::framework::rt"
    )]
    async fn act(ctx: &Ctx, id: u64) -> Result<u64, E> {
        let _ = ctx;
        Ok(id)
    }

    #[framework::rt::tool(class = "read_only", crate = framework::rt)]
    async fn look(ctx: &Ctx, id: u64) -> Result<u64, E> {
        let _ = ctx;
        Ok(id)
    }

    pub fn run() {
        let dir = tempfile::tempdir().unwrap();
        let rt = framework::rt::Runtime::open(dir.path()).unwrap();
        let ctx = rt.run("override");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            assert_eq!(act(&ctx, 1).await.unwrap(), 1);
            assert_eq!(look(&ctx, 2).await.unwrap(), 2);
        });
        assert_eq!(KEYS.load(Ordering::SeqCst), 1, "the provider tool's key");
        assert_eq!(CLASSIFY_CHECKS.load(Ordering::SeqCst), 2, "both tools");
    }
}

fn main() {
    classes::run();
    verify_none::run();
    generics::run();
    key_shapes::run();
    methods::run();
    spawn_send::run();
    crate_override::run();
}
