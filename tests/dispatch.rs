//! Tools called by name with JSON arguments (`idem::dispatch`,
//! `idem::tool_schemas`, `Toolbox`): generated dispatchers and schemas,
//! through the real runtime.

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

#[tokio::test]
async fn free_functions_are_listed_and_called() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(dir.path()).unwrap();
    let ctx = rt.run("r1");
    let schemas = idem::tool_schemas();
    let s = schemas.iter().find(|s| s.name == "charge").unwrap();
    assert_eq!(s.description, "Charges a card.\n\nOnce per order.");
    println!("{}", s.input_schema);
    let out = idem::dispatch(&ctx, "charge", json!({"order_id": 1, "cents": 5}))
        .await
        .unwrap();
    assert_eq!(out, "1:5:");
    let err = idem::dispatch(&ctx, "charge", json!({"order_id": "x", "cents": 5}))
        .await
        .unwrap_err();
    println!("{err}");
    let err = idem::dispatch(&ctx, "charge", json!({"order_id": 2, "cents": 0}))
        .await
        .unwrap_err();
    println!("{err} {}", err.to_json());
}

struct Shop {
    n: AtomicUsize,
}

#[tool]
impl Shop {
    /// Opens a ticket.
    #[tool(class = "journal", key = "title", verify = "none", destructive = false)]
    async fn open(&self, ctx: &Ctx, title: String) -> Result<usize, ApiError> {
        let _ = ctx;
        Ok(self.n.fetch_add(1, Ordering::SeqCst) + title.len())
    }
}

#[tokio::test]
async fn methods_go_through_a_toolbox() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(dir.path()).unwrap();
    let ctx = rt.run("r1");
    let tools = Toolbox::new()
        .with_methods(Arc::new(Shop {
            n: AtomicUsize::new(0),
        }))
        .unwrap();
    let s = tools.schemas();
    println!("{:?}", s.iter().map(|s| s.to_json()).collect::<Vec<_>>());
    let out = tools
        .dispatch(&ctx, "Shop::open", json!({"title": "abc"}))
        .await
        .unwrap();
    assert_eq!(out, 3);
    let _ = DispatchError::UnknownTool {
        name: String::new(),
        known: vec![],
    };
}
