//! Approvals from the operator's side: `idem approvals`, `idem approve`
//! and `idem reject` against a running worker's admin API, the record
//! keeping the surface, and hostile text in a reason shown escaped.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use idem::{tool, Classify, Ctx, Failure, ToolError};
use support::{idem, open_with_admin};

#[derive(Debug)]
struct Refused;

impl Classify for Refused {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

/// Every refund needs a person; the reason carries the (hostile) memo.
fn needs_a_person(
    _ctx: &Ctx,
    order_id: &u64,
    memo: &String,
    _sent: &Arc<AtomicUsize>,
) -> Option<String> {
    Some(format!("refund {order_id}: {memo}"))
}

#[tool(class = "provider", key = "order_id", approve = needs_a_person)]
async fn refund(
    ctx: &Ctx,
    order_id: u64,
    memo: String,
    sent: Arc<AtomicUsize>,
) -> Result<u64, Refused> {
    let _ = (ctx, memo);
    sent.fetch_add(1, Ordering::SeqCst);
    Ok(order_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_list_approve_and_refuse_calls_through_the_cli() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("j");
    let rt = open_with_admin(&dir);
    let ctx = rt.run("refunds");
    let sent = Arc::new(AtomicUsize::new(0));
    let hostile = "\u{1b}[2J<b>wipe</b>";
    let mut keys = Vec::new();
    for order in [1, 2] {
        match refund(&ctx, order, hostile.into(), sent.clone()).await {
            Err(ToolError::AwaitingApproval { key }) => keys.push(key.to_string()),
            other => panic!("expected AwaitingApproval, got {other:?}"),
        }
    }
    let listed = idem(&dir, &["--json", "approvals"]).await.json();
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert_eq!(listed[0]["key"], keys[0].as_str());
    assert_eq!(listed[0]["reason"], format!("refund 1: {hostile}"));
    let table = idem(&dir, &["approvals"]).await;
    let text = table.ok();
    assert!(
        text.contains("2 calls wait for a person's approval"),
        "{text}"
    );
    assert!(
        !text.contains('\u{1b}'),
        "the reason is shown escaped: {text:?}"
    );

    let approved = idem(&dir, &["approve", &keys[0], "--note", "ticket 9 checked"]).await;
    assert!(approved.ok().starts_with("approved "), "{approved:?}");
    let refused = idem(
        &dir,
        &["--json", "reject", &keys[1], "--note", "duplicate refund"],
    )
    .await
    .json();
    assert_eq!(refused["decision"], "not_approved");
    assert_eq!(refused["operation"]["state"], "not_approved");
    assert_eq!(refused["operation"]["approval"]["via"], "cli");

    assert_eq!(
        refund(&ctx, 1, hostile.into(), sent.clone()).await.unwrap(),
        1
    );
    match refund(&ctx, 2, hostile.into(), sent.clone()).await {
        Err(ToolError::NotApproved { note, .. }) => assert_eq!(note, "duplicate refund"),
        other => panic!("expected NotApproved, got {other:?}"),
    }
    assert_eq!(sent.load(Ordering::SeqCst), 1);
    // Decided: nothing more to decide, and the CLI says so.
    let again = idem(&dir, &["--json", "approve", &keys[1], "--note", "oops"]).await;
    assert_ne!(again.code, 0, "{again:?}");
    assert!(again.stderr.contains("not_awaiting_approval"), "{again:?}");
    let blank = idem(&dir, &["reject", &keys[0], "--note", "  "]).await;
    assert_ne!(blank.code, 0, "{blank:?}");
    assert!(idem(&dir, &["approvals"])
        .await
        .ok()
        .starts_with("no approvals"));
    let op = rt
        .operation(&idem::IdemKey::parse(&keys[0]).unwrap())
        .await
        .unwrap()
        .unwrap();
    let approval = op.approval.unwrap();
    assert_eq!(approval.via.as_deref(), Some("cli"));
    assert_eq!(approval.note.as_deref(), Some("ticket 9 checked"));
}
