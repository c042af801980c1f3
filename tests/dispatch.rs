//! Tools called by name with JSON arguments (`idem::dispatch`,
//! `idem::tool_schemas`, `Toolbox`): the dispatchers and schemas `#[tool]`
//! generates, through the real runtime. The same operation is one
//! operation whether it is called directly or through JSON.

use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use idem::{tool, Classify, Ctx, DispatchError, Failure, Runtime, ToolSet, Toolbox};
use serde_json::json;

#[derive(Debug, Clone)]
enum ApiError {
    Declined(String),
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiError::Declined(why) => write!(f, "declined: {why}"),
        }
    }
}

impl Classify for ApiError {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

fn runtime() -> (tempfile::TempDir, Runtime) {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(dir.path()).unwrap();
    (dir, rt)
}

static CHARGES: AtomicUsize = AtomicUsize::new(0);

/// Charges a card.
///
/// Once per order.
#[tool(class = "provider", key = "order_id")]
async fn charge(
    ctx: &Ctx,
    order_id: u64,
    cents: u32,
    note: Option<String>,
) -> Result<String, ApiError> {
    let _ = ctx.idempotency_key();
    CHARGES.fetch_add(1, Ordering::SeqCst);
    if cents == 0 {
        return Err(ApiError::Declined("zero amount".into()));
    }
    Ok(format!("{order_id}:{cents}:{}", note.unwrap_or_default()))
}

/// Not dispatchable: its parameter is not `Deserialize`.
#[derive(Clone, Debug)]
struct Opaque;

#[tool(class = "read_only")]
async fn opaque(_ctx: &Ctx, value: Opaque) -> Result<u8, ApiError> {
    let _ = value;
    Ok(1)
}

/// Not dispatchable: its future holds an `Rc` across an await.
#[tool(class = "read_only")]
async fn local_only(_ctx: &Ctx, n: u32) -> Result<u32, ApiError> {
    let rc = Rc::new(n);
    tokio::task::yield_now().await;
    Ok(*rc)
}

/// Left out on purpose.
#[tool(class = "read_only", dispatch = false)]
async fn hidden(_ctx: &Ctx, n: u32) -> Result<u32, ApiError> {
    Ok(n)
}

#[tokio::test]
async fn schemas_describe_the_arguments_from_the_signature_and_docs() {
    let schemas = idem::tool_schemas();
    let names: Vec<&str> = schemas.iter().map(|s| s.name).collect();
    assert!(names.contains(&"charge"), "{names:?}");
    for absent in ["opaque", "local_only", "hidden", "Shop::open"] {
        assert!(!names.contains(&absent), "{absent} in {names:?}");
    }
    let s = schemas.iter().find(|s| s.name == "charge").unwrap();
    assert_eq!(s.description, "Charges a card.\n\nOnce per order.");
    assert_eq!(s.class, idem::Class::Provider);
    assert!(s.destructive);
    assert_eq!(
        s.input_schema,
        json!({
            "type": "object",
            "properties": {
                "order_id": { "type": "integer", "minimum": 0 },
                "cents": { "type": "integer", "minimum": 0, "maximum": u32::MAX },
                "note": { "type": ["string", "null"] },
            },
            "required": ["order_id", "cents"],
            "additionalProperties": false,
        })
    );
}

#[tokio::test]
async fn a_dispatched_call_is_the_same_operation_as_a_direct_one() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("same-op");
    let before = CHARGES.load(Ordering::SeqCst);
    let direct = charge(&ctx, 41, 5, None).await.unwrap();
    let json = idem::dispatch(&ctx, "charge", json!({ "order_id": 41, "cents": 5 }))
        .await
        .unwrap();
    assert_eq!(json, json!(direct));
    let again = idem::dispatch(&ctx, "charge", json!({ "order_id": 41, "cents": 5 }))
        .await
        .unwrap();
    assert_eq!(again, json);
    assert_eq!(CHARGES.load(Ordering::SeqCst) - before, 1, "one body run");
}

#[tokio::test]
async fn bad_calls_are_errors_that_name_the_problem_and_run_nothing() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("bad-calls");
    let before = CHARGES.load(Ordering::SeqCst);
    let err = |args| idem::dispatch(&ctx, "charge", args);

    let e = err(json!({ "order_id": "x", "cents": 5 }))
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid arguments for `charge`: argument `order_id`: invalid type: string \"x\", \
         expected u64"
    );
    let e = err(json!({ "order_id": 1 })).await.unwrap_err();
    assert!(
        matches!(&e, DispatchError::InvalidArguments { argument: Some(a), .. } if a == "cents")
    );
    assert!(e.to_string().ends_with("missing (it is required)"), "{e}");
    let e = err(json!({ "order_id": 1, "cents": 2, "tip": 3 }))
        .await
        .unwrap_err();
    assert_eq!(e.to_json()["argument"], "tip");
    assert!(
        e.to_string().contains("which takes: order_id, cents, note"),
        "{e}"
    );
    let e = err(json!([1, 2])).await.unwrap_err();
    assert_eq!(e.kind(), "invalid_arguments");
    let e = err(json!({ "order_id": 1, "cents": -3 }))
        .await
        .unwrap_err();
    assert_eq!(e.to_json()["argument"], "cents");
    assert_eq!(CHARGES.load(Ordering::SeqCst), before, "nothing ran");

    let e = idem::dispatch(&ctx, "chrage", json!({})).await.unwrap_err();
    let DispatchError::UnknownTool { name, known } = &e else {
        panic!("{e:?}");
    };
    assert_eq!(name, "chrage");
    assert!(known.contains(&"charge".to_string()), "{known:?}");

    let e = idem::dispatch(&ctx, "opaque", json!({ "value": 1 }))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "unavailable");
    assert!(
        e.to_string().contains("parameter `value`") && e.to_string().contains("Opaque"),
        "{e}"
    );
    let e = idem::dispatch(&ctx, "local_only", json!({ "n": 1 }))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("not `Send`"), "{e}");
    let e = idem::dispatch(&ctx, "Shop::open", json!({ "title": "t" }))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("through a Toolbox"), "{e}");
    let e = idem::dispatch(&ctx, "hidden", json!({ "n": 1 }))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "unknown_tool");
}

#[tokio::test]
async fn tool_errors_keep_their_class_and_text() {
    let (_dir, rt) = runtime();
    let e = idem::dispatch(
        &rt.run("declined"),
        "charge",
        json!({ "order_id": 2, "cents": 0 }),
    )
    .await
    .unwrap_err();
    let DispatchError::Tool {
        tool,
        failure,
        message,
    } = &e
    else {
        panic!("{e:?}");
    };
    assert_eq!(
        (tool.as_str(), *failure, message.as_str()),
        ("charge", Failure::Semantic, "declined: zero amount")
    );
    let j = e.to_json();
    assert_eq!(j["error"], "tool_error");
    assert_eq!(j["failure"], "semantic");
    assert_eq!(j["retryable"], false);
    assert!(j["advice"]
        .as_str()
        .unwrap()
        .starts_with("The provider refused"));
}

struct Shop {
    opened: AtomicUsize,
}

#[tool]
impl Shop {
    /// Opens a ticket.
    #[tool(class = "journal", key = "title", verify = "none", destructive = false)]
    async fn open(&self, ctx: &Ctx, title: String) -> Result<usize, ApiError> {
        let _ = ctx;
        Ok(self.opened.fetch_add(1, Ordering::SeqCst) + title.len())
    }

    /// Counts what was opened; takes the `Arc` it lives in.
    #[tool(class = "read_only")]
    async fn count(self: &Arc<Self>, _ctx: &Ctx) -> Result<usize, ApiError> {
        Ok(self.opened.load(Ordering::SeqCst))
    }
}

struct NoTools;

#[tokio::test]
async fn method_tools_are_called_on_the_toolboxs_instance() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("methods");
    let shop = Arc::new(Shop {
        opened: AtomicUsize::new(0),
    });
    let tools = Toolbox::new()
        .with_methods(shop.clone())
        .unwrap()
        .with_function("charge")
        .unwrap();
    let names: Vec<&str> = tools.names().collect();
    assert_eq!(names, ["Shop::count", "Shop::open", "charge"]);
    let open = &tools.schemas()[1];
    assert_eq!(
        (open.description.as_str(), open.destructive),
        ("Opens a ticket.", false)
    );

    let first = tools
        .dispatch(&ctx, "Shop::open", json!({ "title": "abc" }))
        .await
        .unwrap();
    let again = tools
        .dispatch(&ctx, "Shop::open", json!({ "title": "abc" }))
        .await
        .unwrap();
    assert_eq!((first, again), (json!(3), json!(3)));
    assert_eq!(
        tools
            .dispatch(&ctx, "Shop::count", json!(null))
            .await
            .unwrap(),
        1
    );
    assert_eq!(shop.opened.load(Ordering::SeqCst), 1);

    let e = Toolbox::new().with_methods(Arc::new(NoTools)).unwrap_err();
    assert!(e.to_string().contains("NoTools"), "{e}");
    let e = Toolbox::new().with_function("opaque").unwrap_err();
    assert_eq!(e.kind(), "unavailable");
    let fewer = tools.without("charge");
    let e = fewer.dispatch(&ctx, "charge", json!({})).await.unwrap_err();
    assert_eq!(e.kind(), "unknown_tool");
}

/// A free tool whose name reads like `Shop::open` to an MCP client.
#[tool(class = "read_only", name = "Shop.open")]
async fn shop_dot_open(_ctx: &Ctx, title: String) -> Result<usize, ApiError> {
    Ok(title.len())
}

#[tokio::test]
async fn two_tools_with_one_mcp_name_are_refused_naming_both() {
    let shop = || {
        Arc::new(Shop {
            opened: AtomicUsize::new(0),
        })
    };
    // Either order: the one already there is `first`.
    let e = Toolbox::new()
        .with_methods(shop())
        .unwrap()
        .with_function("Shop.open")
        .unwrap_err();
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
        ("Shop.open", "Shop::open", "Shop.open")
    );
    assert_eq!(e.kind(), "name_collision");
    let text = e.to_string();
    assert!(
        text.contains("`Shop::open` (dispatch (tests/dispatch.rs:")
            && text.contains("and `Shop.open` (dispatch (tests/dispatch.rs:"),
        "{text}"
    );
    let e = Toolbox::new()
        .with_function("Shop.open")
        .unwrap()
        .with_methods(shop())
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("`Shop.open` (dispatch (tests/dispatch.rs:"),
        "{e}"
    );
    assert_eq!(e.to_json()["tools"], json!(["Shop.open", "Shop::open"]));
    // The same tool again is no collision.
    let tools = Toolbox::new()
        .with_function("charge")
        .unwrap()
        .with_function("charge")
        .unwrap()
        .with_methods(shop())
        .unwrap()
        .with_methods(shop())
        .unwrap();
    assert_eq!(tools.names().count(), 3);
}

/// With the feature `schemars`, a parameter type that derives
/// `JsonSchema` (and has no `ArgSchema`) is described by it, inlined.
#[cfg(feature = "schemars")]
mod with_schemars {
    use super::*;

    #[derive(Clone, serde::Deserialize, schemars::JsonSchema)]
    pub struct Address {
        pub street: String,
        pub city: String,
        pub zip: Option<u32>,
    }

    #[tool(class = "provider", key = "order_id")]
    async fn ship(ctx: &Ctx, order_id: u64, to: Address) -> Result<String, ApiError> {
        let _ = ctx;
        Ok(format!(
            "{order_id} to {}, {}{}",
            to.street,
            to.city,
            to.zip.map(|z| format!(" {z}")).unwrap_or_default()
        ))
    }

    #[tokio::test]
    async fn a_json_schema_type_is_described_by_schemars() {
        let s = idem::tool_schemas()
            .into_iter()
            .find(|s| s.name == "ship")
            .unwrap();
        let to = &s.input_schema["properties"]["to"];
        assert_eq!(to["type"], "object", "{to}");
        assert_eq!(to["properties"]["city"]["type"], "string", "{to}");
        assert_eq!(to["required"], json!(["street", "city"]), "{to}");
        assert!(to.get("$schema").is_none());
        let dir = tempfile::tempdir().unwrap();
        let rt = Runtime::open(dir.path()).unwrap();
        let args = json!({ "order_id": 3, "to": { "street": "Main St 1", "city": "Kiel" } });
        let shipped = idem::dispatch(&rt.run("s"), "ship", args).await.unwrap();
        assert_eq!(shipped, "3 to Main St 1, Kiel");
    }
}

/// Looks an order up, charging it first if need be: a read-only tool whose
/// body calls a journaled one.
#[tool(class = "read_only")]
async fn order_status(ctx: &Ctx, order_id: u64) -> Result<String, ApiError> {
    let charged = charge(ctx, order_id, 10, None)
        .await
        .map_err(|e| ApiError::Declined(format!("{e:?}")))?;
    Ok(format!("charged {charged}"))
}

#[tokio::test]
async fn dispatch_reported_says_whether_a_result_was_replayed_and_what_drifted() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("reported");
    let args = |cents: u32, note: &str| json!({ "order_id": 880, "cents": cents, "note": note });
    let first = idem::dispatch_reported(&ctx, "charge", args(10, "a"))
        .await
        .unwrap();
    assert_eq!(first.value, "880:10:a");
    assert!(!first.replayed, "the first call ran");
    assert!(first.drift.is_empty());
    let again = idem::dispatch_reported(&ctx, "charge", args(10, "a"))
        .await
        .unwrap();
    assert_eq!(
        (again.value.clone(), again.replayed),
        (first.value.clone(), true)
    );
    assert!(again.drift.is_empty(), "{:?}", again.drift);
    let drifted = idem::dispatch_reported(&ctx, "charge", args(10, "b"))
        .await
        .unwrap();
    assert_eq!(drifted.value, "880:10:a", "the recorded result");
    assert!(drifted.replayed);
    assert_eq!(drifted.drift, ["note"]);
    // The plain dispatch returns the same value as before.
    let plain = idem::dispatch(&ctx, "charge", args(11, "c")).await.unwrap();
    assert_eq!(plain, "880:10:a");

    // The report is the outermost call's: a read-only tool whose body
    // replays a journaled call is not itself a replay.
    let status = Toolbox::functions()
        .dispatch_reported(&ctx, "order_status", json!({ "order_id": 880 }))
        .await
        .unwrap();
    assert_eq!(status.value, "charged 880:10:a");
    assert!(!status.replayed, "{status:?}");
    assert!(status.drift.is_empty(), "{status:?}");
}

/// Moves money: a changed amount or account is another transfer, a
/// changed memo is not.
#[tool(
    class = "provider",
    key = "transfer_id",
    on_drift(reject = "amount, iban")
)]
async fn transfer(
    _ctx: &Ctx,
    transfer_id: u64,
    amount: u64,
    iban: String,
    memo: String,
) -> Result<String, ApiError> {
    Ok(format!("{transfer_id}:{amount}:{iban}:{memo}"))
}

#[tokio::test]
async fn a_drift_in_an_unlisted_field_replays_and_in_a_listed_one_is_refused() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("payout");
    let args = |amount: u64, iban: &str, memo: &str| json!({ "transfer_id": 1, "amount": amount, "iban": iban, "memo": memo });
    let first = idem::dispatch_reported(&ctx, "transfer", args(500, "DE1", "rent"))
        .await
        .unwrap();
    assert_eq!(first.value, "1:500:DE1:rent");
    let memo = idem::dispatch_reported(&ctx, "transfer", args(500, "DE1", "May"))
        .await
        .unwrap();
    assert_eq!(memo.value, "1:500:DE1:rent", "replayed");
    assert_eq!(
        (memo.replayed, memo.drift),
        (true, vec!["memo".to_string()])
    );
    for (changed, call) in [
        ("amount", args(900, "DE1", "rent")),
        ("iban", args(500, "FR7", "rent")),
    ] {
        let (out, report) = idem::reporting(idem::dispatch(&ctx, "transfer", call)).await;
        let err = out.unwrap_err();
        assert!(
            matches!(err, DispatchError::ArgsMismatch { .. }),
            "{changed}: {err:?}"
        );
        assert_eq!(report.drift, [changed], "{changed}");
        assert!(!report.replayed);
    }
    // The direct call obeys the same rule.
    let direct = transfer(&ctx, 1, 500, "DE1".into(), "other".into()).await;
    assert_eq!(direct.unwrap(), "1:500:DE1:rent");
}
