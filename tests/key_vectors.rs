//! Golden key vectors through `#[tool]` itself: the provider-facing key
//! (`ctx.idempotency_key()`) seen inside real tool calls, byte for byte.
//! idem-runtime/tests/keys.rs pins the derivation through the runtime's
//! key builder; these pin what the attribute feeds it (tool name, key
//! fields, their order and encoding), so an expansion that reorders or
//! drops a key field, or names a tool differently, fails here.
//!
//! The expected strings were computed independently, from the layout in
//! the module docs of idem-runtime/src/key.rs, by tests/key_vectors.py
//! (Python 3, standard library only). To check them again:
//!
//! ```text
//! python3 tests/key_vectors.py
//! ```
//!
//! and compare its `tool/...` lines with the literals below (and its
//! `keys.rs/...` and `bytes/...` lines with idem-runtime/tests/keys.rs).

use std::sync::Mutex;

use idem::{tool, Classify, Ctx, Failure, Runtime, ToolError};

#[derive(Debug, Clone, PartialEq)]
enum Fail {
    Declined,
}

impl Classify for Fail {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

/// Every key a tool body saw, in order.
static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn seen(ctx: &Ctx) {
    SEEN.lock()
        .unwrap()
        .push(ctx.idempotency_key().as_str().to_string());
}

fn take_seen() -> Vec<String> {
    std::mem::take(&mut *SEEN.lock().unwrap())
}

#[tool(class = "journal", key = "to, template, order_id", verify = "none")]
async fn send_email(
    ctx: &Ctx,
    to: String,
    template: String,
    order_id: u64,
    body: String,
) -> Result<(), Fail> {
    let _ = (to, template, order_id, body);
    seen(ctx);
    Ok(())
}

#[tool(class = "provider", key = "order_id, amount_cents")]
async fn charge(ctx: &Ctx, order_id: u64, amount_cents: u32, decline: bool) -> Result<(), Fail> {
    let _ = (order_id, amount_cents);
    seen(ctx);
    if decline {
        return Err(Fail::Declined);
    }
    Ok(())
}

// The key list is not in parameter order: an expansion that fed the
// fields in parameter order (or any order but the list's) fails here.
#[tool(class = "provider", key = "order_id, to, from")]
async fn transfer(
    ctx: &Ctx,
    from: String,
    to: String,
    order_id: u64,
    cents: u64,
) -> Result<(), Fail> {
    let _ = (from, to, order_id, cents);
    seen(ctx);
    Ok(())
}

struct Shop;

#[tool]
impl Shop {
    #[tool(class = "journal", key = "order_id, reason", verify = "none")]
    async fn refund(
        &self,
        ctx: &Ctx,
        order_id: u64,
        reason: Option<String>,
        cents: u64,
    ) -> Result<u64, Fail> {
        let _ = (order_id, reason);
        seen(ctx);
        Ok(cents)
    }
}

fn runtime() -> (tempfile::TempDir, Runtime) {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(dir.path()).unwrap();
    (dir, rt)
}

// The tests share SEEN, so they run as one.
#[tokio::test]
async fn keys_seen_inside_tool_calls() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("order-4711");

    // tool/send_email: the same inputs as keys.rs vector 0, in the order
    // the attribute declares them; `body` is not a key field.
    send_email(
        &ctx,
        "ada@example.com".into(),
        "receipt".into(),
        4711,
        "hello".into(),
    )
    .await
    .unwrap();
    // tool/send_email/scope: a deliberate second operation.
    send_email(
        &ctx.scope("second-reminder"),
        "ada@example.com".into(),
        "receipt".into(),
        4711,
        "again".into(),
    )
    .await
    .unwrap();
    assert_eq!(
        take_seen(),
        [
            "send_email-c495dc1229273db8ae3425a4a7e11e65e0cdc48fbb16bc3c3e25a1548ea6c1a4-g0",
            "send_email-f49924c804eaa18a49c977fb2abeb12a5b4542beb605bc3bc3dcddd8690578ce-g0",
        ]
    );

    // tool/charge/g0, then g1: declined once (REJECTED), the next call is a
    // new decision under the next generation; same digest.
    let err = charge(&ctx, 4711, 1999, true).await.unwrap_err();
    assert!(matches!(err, ToolError::Tool(Fail::Declined)), "{err:?}");
    charge(&ctx, 4711, 1999, false).await.unwrap();
    assert_eq!(
        take_seen(),
        [
            "charge-a39ad6efd8993c709586fcad74956afbe36ca8430446371f8972c011ab04c995-g0",
            "charge-a39ad6efd8993c709586fcad74956afbe36ca8430446371f8972c011ab04c995-g1",
        ]
    );

    // tool/Shop::refund: a method named by `#[tool]` on its impl block, an
    // `Option<String>` key field; `cents` is not a key field.
    assert_eq!(
        Shop.refund(&ctx, 4711, Some("late".into()), 500)
            .await
            .unwrap(),
        500
    );
    assert_eq!(
        take_seen(),
        ["shop__refund-fcaca0c134351341013fec038f05a8933f236dcca384d658ef80a3adf5c35a84-g0"]
    );

    // tool/transfer: key fields in the list's order (order_id, to, from),
    // not the parameters' (from, to, order_id); `cents` is not a key field.
    transfer(&ctx, "ada".into(), "bob".into(), 4711, 500)
        .await
        .unwrap();
    assert_eq!(
        take_seen(),
        ["transfer-cdcddbffcbb528dc811ce8c9beb7ad81092ef74c5262ace1cf06b641e1d06e95-g0"]
    );
}
