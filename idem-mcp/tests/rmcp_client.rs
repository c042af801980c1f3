//! idem's MCP server against rmcp's own client: in process over a duplex
//! pipe (the stdio transport's framing), and over streamable HTTP on
//! 127.0.0.1. The Python client test (tests/mcp_python_client.rs at the
//! workspace root) covers a client nobody here wrote; this one is fast and
//! covers each rule of the server. (It names this crate `idem_mcp`; users
//! write `idem::mcp`.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use idem::{
    tool, BoxFuture, Classify, Ctx, DispatchError, Failure, Runtime, ToolSchema, ToolSet, Toolbox,
};
use idem_mcp::rmcp::model::{CallToolRequestParams, CallToolResult, RequestMetaObject};
use idem_mcp::rmcp::service::RunningService;
use idem_mcp::rmcp::{RoleClient, ServiceExt};
use idem_mcp::{Decision, McpServer, RunIdentity};
use serde_json::{json, Value};

#[derive(Debug)]
enum BankError {
    /// The bank took the request and never answered.
    Timeout,
}

impl std::fmt::Display for BankError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the bank did not answer")
    }
}

impl Classify for BankError {
    fn classify(&self) -> Failure {
        match self {
            BankError::Timeout => Failure::ambiguous(),
        }
    }
}

/// Counts the bodies that ran, per tool.
#[derive(Default)]
struct Bank {
    charges: AtomicUsize,
    wires: AtomicUsize,
    lookups: AtomicUsize,
}

#[tool]
impl Bank {
    /// The balance of an account.
    #[tool(class = "read_only")]
    async fn balance(&self, _ctx: &Ctx, account: String) -> Result<u64, BankError> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        Ok(account.len() as u64 * 100)
    }

    /// Charges a card, once per order.
    #[tool(class = "provider", key = "order_id", on_drift = "reject")]
    async fn charge(&self, ctx: &Ctx, order_id: u64, cents: u64) -> Result<Value, BankError> {
        self.charges.fetch_add(1, Ordering::SeqCst);
        Ok(json!({ "order_id": order_id, "cents": cents, "key": ctx.idempotency_key().as_str() }))
    }

    /// Wires money; the bank never answers.
    #[tool(class = "at_most_once", key = "transfer_id")]
    async fn wire(&self, _ctx: &Ctx, transfer_id: String, cents: u64) -> Result<(), BankError> {
        let _ = (transfer_id, cents);
        self.wires.fetch_add(1, Ordering::SeqCst);
        Err(BankError::Timeout)
    }
}

fn server(rt: &Runtime, bank: &Arc<Bank>) -> McpServer {
    let tools = Toolbox::new().with_methods(bank.clone()).unwrap();
    McpServer::new(rt.clone(), tools).unwrap()
}

/// A client connected to `server` over an in-process pipe.
async fn connect(server: McpServer) -> RunningService<RoleClient, ()> {
    let (client_io, server_io) = tokio::io::duplex(1 << 16);
    tokio::spawn(async move {
        let (r, w) = tokio::io::split(server_io);
        server.serve((r, w)).await.unwrap();
    });
    ().serve(client_io).await.unwrap()
}

fn call(name: &str, args: Value, meta: Option<Value>) -> CallToolRequestParams {
    let mut params = CallToolRequestParams::new(name.to_string())
        .with_arguments(args.as_object().cloned().unwrap_or_default());
    if let Some(Value::Object(m)) = meta {
        params.meta = Some(RequestMetaObject::from(m));
    }
    params
}

fn run(id: &str) -> Option<Value> {
    Some(json!({ "idem/run": id }))
}

fn structured(r: &CallToolResult) -> &Value {
    r.structured_content.as_ref().expect("structured content")
}

#[tokio::test]
async fn tools_are_listed_with_hints_from_their_class() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(dir.path()).unwrap();
    let client = connect(server(&rt, &Arc::default())).await;
    let tools = client.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(names, ["Bank.balance", "Bank.charge", "Bank.wire"]);
    let hints = |i: usize| {
        let a = tools[i].annotations.as_ref().unwrap();
        (a.read_only_hint, a.destructive_hint, a.idempotent_hint)
    };
    assert_eq!(hints(0), (Some(true), Some(false), Some(true)));
    assert_eq!(hints(1), (Some(false), Some(true), Some(true)));
    assert_eq!(hints(2), (Some(false), Some(true), Some(true)));
    assert_eq!(
        tools[1].description.as_deref(),
        Some("Charges a card, once per order.")
    );
    assert_eq!(
        tools[1].input_schema["required"],
        json!(["order_id", "cents"])
    );
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn a_repeated_call_is_replayed_and_other_runs_are_other_operations() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(dir.path()).unwrap();
    let bank = Arc::new(Bank::default());
    let client = connect(server(&rt, &bank)).await;
    let args = json!({ "order_id": 7, "cents": 500 });
    let first = client
        .call_tool(call("Bank.charge", args.clone(), run("r1")))
        .await
        .unwrap();
    assert_eq!(first.is_error, Some(false));
    let again = client
        .call_tool(call("Bank.charge", args.clone(), run("r1")))
        .await
        .unwrap();
    assert_eq!(structured(&first), structured(&again));
    assert_eq!(bank.charges.load(Ordering::SeqCst), 1);
    // A scope is a deliberate second operation; another run is another.
    let scoped = json!({ "idem/run": "r1", "idem/scope": "second" });
    client
        .call_tool(call("Bank.charge", args.clone(), Some(scoped)))
        .await
        .unwrap();
    client
        .call_tool(call("Bank.charge", args.clone(), run("r2")))
        .await
        .unwrap();
    assert_eq!(bank.charges.load(Ordering::SeqCst), 3);
    // A non-object result comes wrapped.
    let balance = client
        .call_tool(call("Bank.balance", json!({ "account": "abc" }), run("r1")))
        .await
        .unwrap();
    assert_eq!(structured(&balance), &json!({ "result": 300 }));
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn idem_errors_are_error_results_that_say_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(dir.path()).unwrap();
    let bank = Arc::new(Bank::default());
    let client = connect(server(&rt, &bank)).await;
    let wire = json!({ "transfer_id": "t-1", "cents": 900 });

    let no_run = client
        .call_tool(call("Bank.wire", wire.clone(), None))
        .await
        .unwrap();
    assert_eq!(no_run.is_error, Some(true));
    assert_eq!(structured(&no_run)["error"], "no_run_identity");
    assert_eq!(
        bank.wires.load(Ordering::SeqCst),
        0,
        "refused before running"
    );

    for _ in 0..2 {
        let escalated = client
            .call_tool(call("Bank.wire", wire.clone(), run("payout")))
            .await
            .unwrap();
        assert_eq!(escalated.is_error, Some(true));
        let s = structured(&escalated);
        assert_eq!(s["error"], "escalated");
        assert_eq!(s["tool"], "Bank::wire");
        assert!(
            s["key"].as_str().unwrap().ends_with("-g0"),
            "the provider-facing key: {s}"
        );
        assert!(s["advice"]
            .as_str()
            .unwrap()
            .starts_with("Wait for an operator"));
    }
    assert_eq!(bank.wires.load(Ordering::SeqCst), 1, "never re-sent");

    let charge = |cents: u64| {
        call(
            "Bank.charge",
            json!({ "order_id": 1, "cents": cents }),
            run("r"),
        )
    };
    client.call_tool(charge(100)).await.unwrap();
    let drift = client.call_tool(charge(999)).await.unwrap();
    assert_eq!(structured(&drift)["error"], "args_mismatch");

    let bad = client
        .call_tool(call(
            "Bank.charge",
            json!({ "order_id": -1, "cents": 1 }),
            run("r"),
        ))
        .await
        .unwrap();
    assert_eq!(structured(&bad)["error"], "invalid_arguments");
    assert_eq!(structured(&bad)["argument"], "order_id");

    client.cancel().await.unwrap();
}

fn meta(r: &CallToolResult) -> Value {
    Value::Object(r.meta.clone().expect("_meta").0)
}

#[tokio::test]
async fn an_unknown_tool_is_an_error_result_naming_the_tools_there_are() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(dir.path()).unwrap();
    let client = connect(server(&rt, &Arc::default())).await;
    let unknown = client
        .call_tool(call("Bank.refund", json!({}), run("r")))
        .await
        .expect("a result, not a protocol error");
    assert_eq!(unknown.is_error, Some(true));
    let s = structured(&unknown);
    assert_eq!(s["error"], "unknown_tool");
    assert_eq!(
        s["tools"],
        json!(["Bank.balance", "Bank.charge", "Bank.wire"])
    );
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .contains("no tool named `Bank.refund`"),
        "{s}"
    );
    client.cancel().await.unwrap();
}

/// A provider tool that replays drifted arguments (the default policy).
#[tool(class = "provider", key = "order_id")]
async fn refund(_ctx: &Ctx, order_id: u64, cents: u64, memo: String) -> Result<u64, BankError> {
    let _ = memo;
    Ok(order_id * 1000 + cents)
}

#[tokio::test]
async fn results_say_in_meta_whether_they_were_replayed_and_which_arguments_drifted() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(dir.path()).unwrap();
    let bank = Arc::new(Bank::default());
    let tools = Toolbox::new()
        .with_methods(bank.clone())
        .unwrap()
        .with_function("refund")
        .unwrap();
    let client = connect(McpServer::new(rt.clone(), tools).unwrap()).await;
    let refund = |cents: u64, memo: &str| {
        call(
            "refund",
            json!({ "order_id": 3, "cents": cents, "memo": memo }),
            run("r"),
        )
    };
    let first = client.call_tool(refund(50, "a")).await.unwrap();
    assert_eq!(meta(&first), json!({ "idem/replayed": false }));
    let again = client.call_tool(refund(50, "a")).await.unwrap();
    assert_eq!(meta(&again), json!({ "idem/replayed": true }));
    assert_eq!(structured(&again), structured(&first));
    let drifted = client.call_tool(refund(70, "b")).await.unwrap();
    assert_eq!(drifted.is_error, Some(false));
    assert_eq!(
        meta(&drifted),
        json!({ "idem/replayed": true, "idem/drift": ["cents", "memo"] })
    );
    assert_eq!(
        structured(&drifted),
        &json!({ "result": 3050 }),
        "the first result"
    );

    // A refused drift says which arguments changed too.
    let charge = |cents: u64| {
        call(
            "Bank.charge",
            json!({ "order_id": 1, "cents": cents }),
            run("r"),
        )
    };
    client.call_tool(charge(100)).await.unwrap();
    let refused = client.call_tool(charge(999)).await.unwrap();
    assert_eq!(structured(&refused)["error"], "args_mismatch");
    assert_eq!(
        meta(&refused),
        json!({ "idem/replayed": false, "idem/drift": ["cents"] })
    );
    // A read-only tool is never a replay.
    let balance = client
        .call_tool(call("Bank.balance", json!({ "account": "x" }), run("r")))
        .await
        .unwrap();
    assert_eq!(meta(&balance), json!({ "idem/replayed": false }));
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn a_resolver_gives_the_run_when_meta_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(dir.path()).unwrap();
    let bank = Arc::new(Bank::default());
    let server = server(&rt, &bank).with_resolver(|call| {
        // One run per order, from the arguments.
        let order = call.arguments.get("order_id")?.as_u64()?;
        Some(RunIdentity::new(format!("order-{order}")))
    });
    let client = connect(server).await;
    let args = json!({ "order_id": 5, "cents": 10 });
    let first = client
        .call_tool(call("Bank.charge", args.clone(), None))
        .await
        .unwrap();
    let key = structured(&first)["key"].clone();
    // Same run through _meta: the same operation, replayed.
    let again = client
        .call_tool(call("Bank.charge", args, run("order-5")))
        .await
        .unwrap();
    assert_eq!(structured(&again)["key"], key);
    assert_eq!(bank.charges.load(Ordering::SeqCst), 1);
    // The resolver declines: refused as without one.
    let none = client
        .call_tool(call("Bank.balance", json!({ "account": "a" }), None))
        .await
        .unwrap();
    assert_eq!(structured(&none)["error"], "no_run_identity");
    client.cancel().await.unwrap();
}

/// One journal, two tenants, each on its own connection (a server per
/// connection, as with stdio); each server's resolver knows its tenant and
/// keeps the runs its clients name apart. The client of tenant-b names
/// tenant-a's runs in `_meta`, as the client of tenant-a would see them
/// in its results: it neither reads tenant-a's charge nor pre-empts its
/// next one.
#[tokio::test]
async fn with_a_resolver_meta_cannot_reach_another_tenants_run() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(dir.path()).unwrap();
    let bank = Arc::new(Bank::default());
    let consulted = Arc::new(AtomicUsize::new(0));
    let tenant = |name: &'static str| {
        let consulted = consulted.clone();
        server(&rt, &bank).with_resolver(move |call| {
            consulted.fetch_add(1, Ordering::SeqCst);
            let asked = call.requested?;
            Some(RunIdentity::new(name).scope(asked.run.clone()))
        })
    };
    let a = connect(tenant("tenant-a")).await;
    let b = connect(tenant("tenant-b")).await;
    let charge = |order: u64, cents: u64, run: &str| {
        call(
            "Bank.charge",
            json!({ "order_id": order, "cents": cents }),
            Some(json!({ "idem/run": run })),
        )
    };

    let paid = a.call_tool(charge(1, 1999, "order-1")).await.unwrap();
    assert_eq!(paid.is_error, Some(false), "{paid:?}");
    let key = structured(&paid)["key"].clone();

    // The same call, the same run id, from tenant-b: its own operation.
    let probe = b.call_tool(charge(1, 1999, "order-1")).await.unwrap();
    assert_ne!(
        structured(&probe)["key"],
        key,
        "tenant-b read tenant-a's charge"
    );
    assert_eq!(bank.charges.load(Ordering::SeqCst), 2);

    // tenant-b goes first on order 2, for 1 cent; tenant-a's own call for
    // 1999 cents is still its own.
    let first = b.call_tool(charge(2, 1, "order-2")).await.unwrap();
    assert_eq!(structured(&first)["cents"], 1);
    let own = a.call_tool(charge(2, 1999, "order-2")).await.unwrap();
    assert_eq!(own.is_error, Some(false), "{own:?}");
    assert_eq!(structured(&own)["cents"], 1999, "tenant-a got {own:?}");
    assert_eq!(bank.charges.load(Ordering::SeqCst), 4);
    // Every call was decided by the resolver.
    assert_eq!(consulted.load(Ordering::SeqCst), 4);

    // A resolver that says no: an error result with its reason, nothing run.
    let strict = connect(
        server(&rt, &bank).with_resolver(|call| match call.requested {
            Some(id) if id.run.starts_with("order-") => Decision::Accept,
            _ => Decision::Refuse("runs here are order-<number>".into()),
        }),
    )
    .await;
    let refused = strict
        .call_tool(charge(3, 5, "tenant-a:order-3"))
        .await
        .unwrap();
    assert_eq!(refused.is_error, Some(true));
    let s = structured(&refused);
    assert_eq!(s["error"], "run_identity_refused");
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .ends_with("runs here are order-<number>"),
        "{s}"
    );
    assert_eq!(s["retryable"], false);
    let accepted = strict.call_tool(charge(3, 5, "order-3")).await.unwrap();
    assert_eq!(accepted.is_error, Some(false), "{accepted:?}");
    assert_eq!(bank.charges.load(Ordering::SeqCst), 5);
    for client in [a, b, strict] {
        client.cancel().await.unwrap();
    }
}

/// A malformed `_meta` is refused as such, and the resolver is not asked
/// to decide on what it cannot see.
#[tokio::test]
async fn a_malformed_meta_is_refused_before_the_resolver_is_asked() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(dir.path()).unwrap();
    let bank = Arc::new(Bank::default());
    let consulted = Arc::new(AtomicUsize::new(0));
    let counter = consulted.clone();
    let client = connect(server(&rt, &bank).with_resolver(move |_call| {
        counter.fetch_add(1, Ordering::SeqCst);
        Decision::Replace(RunIdentity::new("fixed"))
    }))
    .await;
    let args = json!({ "order_id": 1, "cents": 1 });
    for meta in [json!({ "idem/run": 7 }), json!({ "idem/scope": "s" })] {
        let r = client
            .call_tool(call("Bank.charge", args.clone(), Some(meta)))
            .await
            .unwrap();
        assert_eq!(structured(&r)["error"], "bad_run_identity", "{r:?}");
    }
    assert_eq!(consulted.load(Ordering::SeqCst), 0);
    assert_eq!(bank.charges.load(Ordering::SeqCst), 0);
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn streamable_http_serves_the_same_tools() {
    use idem_mcp::rmcp::transport::StreamableHttpClientTransport;

    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(dir.path()).unwrap();
    let bank = Arc::new(Bank::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = idem_mcp::CancellationToken::new();
    let serving = tokio::spawn(server(&rt, &bank).serve_http(listener, shutdown.clone()));

    let transport = StreamableHttpClientTransport::from_uri(format!("http://{addr}/mcp"));
    let client = ().serve(transport).await.unwrap();
    assert_eq!(client.list_all_tools().await.unwrap().len(), 3);
    let args = json!({ "order_id": 9, "cents": 1 });
    for _ in 0..2 {
        let r = client
            .call_tool(call("Bank.charge", args.clone(), run("http")))
            .await
            .unwrap();
        assert_eq!(structured(&r)["order_id"], 9);
    }
    assert_eq!(bank.charges.load(Ordering::SeqCst), 1);
    client.cancel().await.unwrap();
    shutdown.cancel();
    serving.await.unwrap().unwrap();
}

/// A free tool whose MCP name is that of the method tool `Bank::charge`.
#[tool(class = "read_only", name = "Bank.charge")]
async fn bank_dot_charge(_ctx: &Ctx, order_id: u64) -> Result<u64, BankError> {
    Ok(order_id)
}

/// Two toolboxes as one set (a custom `ToolSet`, which may list anything).
struct Both(Toolbox, Toolbox);

impl ToolSet for Both {
    fn schemas(&self) -> Vec<ToolSchema> {
        let mut all = self.0.schemas();
        all.extend(self.1.schemas());
        all
    }

    fn dispatch<'a>(
        &'a self,
        ctx: &'a Ctx,
        name: &'a str,
        args: Value,
    ) -> BoxFuture<'a, Result<Value, DispatchError>> {
        if self.0.names().any(|n| n == name) {
            self.0.dispatch(ctx, name, args)
        } else {
            self.1.dispatch(ctx, name, args)
        }
    }
}

#[tokio::test]
async fn two_tools_with_one_mcp_name_are_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(dir.path()).unwrap();
    let methods = Toolbox::new()
        .with_methods(Arc::new(Bank::default()))
        .unwrap();
    let free = Toolbox::new().with_function("Bank.charge").unwrap();
    for s in methods.schemas().iter().chain(&free.schemas()) {
        assert_eq!(idem_mcp::mcp_name(s.name), s.mcp_name());
    }
    let e = McpServer::new(rt.clone(), Both(free.clone(), methods.clone())).unwrap_err();
    let DispatchError::NameCollision {
        mcp_name,
        first,
        second,
        ..
    } = &e
    else {
        panic!("expected NameCollision, got {e:?}");
    };
    assert_eq!(
        (mcp_name.as_str(), first.as_str(), second.as_str()),
        ("Bank.charge", "Bank.charge", "Bank::charge")
    );
    let text = e.to_string();
    assert!(
        text.contains("`Bank.charge` (rmcp_client (idem-mcp/tests/rmcp_client.rs:")
            && text.contains("and `Bank::charge` (rmcp_client (idem-mcp/tests/rmcp_client.rs:"),
        "{text}"
    );
    // Without the free tool, the same methods are served.
    assert_eq!(McpServer::new(rt, methods).unwrap().tools().len(), 3);
}
