//! Tools written in everyday shapes that `#[tool]` once broke (issue 13)
//! run through the real runtime: the wrapper shares no name or scope with
//! the user's code, and each shape behaves as written. The same shapes are
//! the trybuild pass case tests/ui/pass/everyday_shapes.rs; this file is
//! also built by `cargo clippy --all-targets -- -D warnings`, so a warning
//! the expansion adds to user code fails CI.

#![deny(warnings)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use idem::{tool, Classify, Ctx, Failure, Runtime, ToolError, Verdict};

#[derive(Debug, Clone, PartialEq)]
enum Fail {
    Ambiguous,
}

impl Classify for Fail {
    fn classify(&self) -> Failure {
        match self {
            Fail::Ambiguous => Failure::ambiguous(),
        }
    }
}

fn runtime() -> (tempfile::TempDir, Runtime) {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(dir.path()).unwrap();
    (dir, rt)
}

/// Counts the runs of a body.
static RUNS: Runs = Runs::new();

struct Runs(Mutex<Vec<String>>);

impl Runs {
    const fn new() -> Self {
        Runs(Mutex::new(Vec::new()))
    }

    fn ran(&self, what: String) {
        self.0.lock().unwrap().push(what);
    }

    fn count(&self, prefix: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.starts_with(prefix))
            .count()
    }
}

// Shape 1: parameter names supplied by a `macro_rules!`.
macro_rules! keyed_tool {
    ($name:ident, $cx:ident, $p:ident: $t:ty) => {
        #[tool(class = "provider", key = "order_id")]
        async fn $name($cx: &Ctx, $p: $t) -> Result<String, Fail> {
            RUNS.ran(format!("macro_charge {}", $p));
            Ok(format!("{}:{}", $p, $cx.idempotency_key()))
        }
    };
}

keyed_tool!(macro_charge, ctx, order_id: u64);

#[tokio::test]
async fn macro_rules_parameters_key_and_replay() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("macro");
    let first = macro_charge(&ctx, 7).await.unwrap();
    assert!(first.starts_with("7:macro_charge-"), "{first}");
    // Replayed from the journal: same result, the body did not run again.
    assert_eq!(macro_charge(&ctx, 7).await.unwrap(), first);
    assert_eq!(RUNS.count("macro_charge 7"), 1);
    // The macro's `order_id` is the key: another order is another call.
    let other = macro_charge(&ctx, 8).await.unwrap();
    assert_ne!(other.split(':').nth(1), first.split(':').nth(1));
    assert_eq!(RUNS.count("macro_charge 8"), 1);
}

// Shape 2: a verify function named like a parameter.
static TICKETS: Mutex<Vec<String>> = Mutex::new(Vec::new());

#[tool(class = "journal", timeout = "30s", key = "ticket", verify = ticket, retry(initial = "1ms"))]
async fn open_ticket(ctx: &Ctx, ticket: String) -> Result<usize, Fail> {
    TICKETS
        .lock()
        .unwrap()
        .push(ctx.idempotency_key().to_string());
    // The ticket is created, but the answer is lost.
    let _ = ticket;
    Err(Fail::Ambiguous)
}

/// Finds the ticket the lost attempt created; "ticket" is also the tool's
/// parameter, which must not shadow this function.
async fn ticket(ctx: &Ctx) -> Result<Verdict<usize>, Fail> {
    let found = TICKETS
        .lock()
        .unwrap()
        .iter()
        .any(|k| k == ctx.idempotency_key().as_str());
    Ok(if found {
        Verdict::Landed(99)
    } else {
        Verdict::NotLanded
    })
}

#[tokio::test(start_paused = true)]
async fn a_verify_named_like_a_parameter_is_the_function() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("verify");
    assert_eq!(open_ticket(&ctx, "disk full".into()).await.unwrap(), 99);
    assert_eq!(TICKETS.lock().unwrap().len(), 1, "verify, not a re-run");
}

// Shape 3: parameters named like the wrapper's own variables (those it
// has and has had).
#[tool(class = "provider", key = "__idem_key, __idem_root")]
#[allow(clippy::too_many_arguments)]
async fn clash(
    __idem_ctx: &Ctx,
    __idem_key: String,
    __idem_root: String,
    __idem_args: Vec<u8>,
    __idem_attempt: u32,
    __idem_arg0: String,
    __idem_ctx_param: String,
    __idem_tool: u8,
) -> Result<String, Fail> {
    RUNS.ran(format!("clash {__idem_key}"));
    Ok(format!(
        "{__idem_key}/{__idem_root}/{}/{__idem_attempt}/{}/{__idem_arg0}/{__idem_ctx_param}/{__idem_tool}",
        __idem_args.len(),
        __idem_ctx.attempt()
    ))
}

#[tokio::test]
async fn parameters_named_like_the_wrappers_variables_are_the_users() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("clash");
    let call = |root: &str, args: Vec<u8>, attempt: u32| {
        clash(
            &ctx,
            "k1".into(),
            root.into(),
            args,
            attempt,
            "a0".into(),
            "cp".into(),
            7,
        )
    };
    // `__idem_root` is the caller's string, not the context, and so on.
    let out = call("root", vec![1, 2, 3], 9).await;
    assert_eq!(out.unwrap(), "k1/root/3/9/1/a0/cp/7");
    // And the key is made of them: same values replay, another value runs.
    let again = call("root", vec![], 0).await;
    assert_eq!(again.unwrap(), "k1/root/3/9/1/a0/cp/7");
    assert_eq!(RUNS.count("clash k1"), 1);
    let other = call("other root", vec![], 0).await;
    assert_eq!(other.unwrap(), "k1/other root/0/0/1/a0/cp/7");
    assert_eq!(RUNS.count("clash k1"), 2);
}

// Shapes 4 and 5: a one-expression body on one line (where rustc would
// call its braces unnecessary, were they the wrapper's tail), and an inner
// attribute that must keep applying to the function (this file denies
// warnings).
#[rustfmt::skip]
#[tool(class = "provider", key = "a")]
async fn one_expression(_ctx: &Ctx, a: u32) -> Result<u32, Fail> { Ok(a * 2) }

#[rustfmt::skip]
#[tool(class = "read_only")]
async fn one_expression_unnamed_ctx(_: &Ctx, a: u32) -> Result<u32, Fail> { Ok(a * 3) }

#[tool(class = "provider", key = "a")]
async fn inner_attribute(_ctx: &Ctx, a: u32) -> Result<u32, Fail> {
    #![allow(unused_variables)]
    let unused = a;
    Ok(a + 1)
}

#[tokio::test]
async fn one_expression_bodies_and_inner_attributes_run_as_written() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("bodies");
    assert_eq!(one_expression(&ctx, 21).await.unwrap(), 42);
    assert_eq!(one_expression_unnamed_ctx(&ctx, 2).await.unwrap(), 6);
    assert_eq!(inner_attribute(&ctx, 1).await.unwrap(), 2);
}

// Shape 6: parameters configured in and out.
#[tool(class = "at_most_once", key = "order_id", redact = "secret")]
async fn configured(
    _ctx: &Ctx,
    order_id: u64,
    #[cfg(any())] debug_note: NotEvenAType,
    #[cfg(not(any()))] note: String,
    #[cfg(any())] secret: NotEvenAType,
) -> Result<String, Fail> {
    let _ = (order_id, note);
    Err(Fail::Ambiguous)
}

#[tokio::test]
async fn a_configured_out_parameter_is_not_recorded() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("cfg");
    let err = configured(&ctx, 8, "kept".into()).await.unwrap_err();
    assert!(matches!(err, ToolError::Escalated { .. }), "{err:?}");
    let escalations = rt.escalations().await.unwrap();
    let args = escalations[0].args.as_object().unwrap();
    let mut names: Vec<&str> = args.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(names, ["note", "order_id"]);
    assert_eq!(args["note"], "kept");
    assert_eq!(args["order_id"], 8);
}

// Item 7: methods of two types with one method name are two tools.
struct Mailer {
    sent: AtomicUsize,
}

struct Sms {
    sent: AtomicUsize,
}

#[tool]
impl Mailer {
    #[tool(class = "provider", key = "to")]
    async fn send(&self, _ctx: &Ctx, to: String) -> Result<String, Fail> {
        self.sent.fetch_add(1, Ordering::SeqCst);
        Ok(format!("email to {to}"))
    }
}

#[idem::tool]
impl Sms {
    #[tool(class = "provider", key = "to")]
    async fn send(&self, _ctx: &Ctx, to: String) -> Result<String, Fail> {
        self.sent.fetch_add(1, Ordering::SeqCst);
        Ok(format!("sms to {to}"))
    }

    /// A receiver by `&Arc<Self>`, for bodies that clone the `Arc`.
    #[tool(class = "provider", key = "to", name = "sms_shared")]
    async fn send_shared(self: &Arc<Self>, _ctx: &Ctx, to: String) -> Result<String, Fail> {
        let me = Arc::clone(self);
        me.sent.fetch_add(1, Ordering::SeqCst);
        Ok(format!("shared sms to {to}"))
    }
}

#[tokio::test]
async fn same_method_names_on_two_types_are_two_tools() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("order-1");
    let mailer = Mailer {
        sent: AtomicUsize::new(0),
    };
    let sms = Arc::new(Sms {
        sent: AtomicUsize::new(0),
    });
    let to = String::from("ann");
    assert_eq!(mailer.send(&ctx, to.clone()).await.unwrap(), "email to ann");
    // Same key fields, another tool: runs, does not replay the email.
    assert_eq!(sms.send(&ctx, to.clone()).await.unwrap(), "sms to ann");
    assert_eq!(
        sms.send_shared(&ctx, to.clone()).await.unwrap(),
        "shared sms to ann"
    );
    assert_eq!(mailer.sent.load(Ordering::SeqCst), 1);
    assert_eq!(sms.sent.load(Ordering::SeqCst), 2);
    // Each replays its own.
    assert_eq!(mailer.send(&ctx, to.clone()).await.unwrap(), "email to ann");
    assert_eq!(sms.send(&ctx, to).await.unwrap(), "sms to ann");
    assert_eq!(sms.sent.load(Ordering::SeqCst), 2);

    let names: Vec<&str> = idem::tools().map(|t| t.name).collect();
    for name in ["Mailer::send", "Sms::send", "sms_shared"] {
        assert!(names.contains(&name), "{name} in {names:?}");
    }
}

// A read-only tool may return `impl Trait`.
#[tool(class = "read_only")]
async fn evens(_ctx: &Ctx, below: u32) -> Result<impl Iterator<Item = u32>, Fail> {
    Ok((0..below).filter(|n| n % 2 == 0))
}

#[tokio::test]
async fn a_read_only_tool_returns_impl_trait() {
    let (_dir, rt) = runtime();
    let ctx = rt.run("iter");
    let evens: Vec<u32> = evens(&ctx, 7).await.unwrap().collect();
    assert_eq!(evens, [0, 2, 4, 6]);
}
