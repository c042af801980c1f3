//! Approvals in the inbox, in a real browser (headless Chromium through
//! chromedriver): a worker's payouts above 1,000 EUR wait for a person.
//! The operator sees each call as the record holds it (the redacted PIN
//! never reaches the page, hostile text stays text), is refused in the page
//! without a note and shown the API's own refusals, approves one (its next
//! call runs it once, and the record says it came through the inbox) and
//! rejects another (its next call returns the note). The page follows the
//! audit stream: a new request appears and a decision made elsewhere
//! removes its card, without a reload.
//!
//! `IDEM_INBOX_APPROVALS_SCREENSHOT=PATH` saves a screenshot of the two
//! cards as first shown.

mod support;
#[path = "support/webdriver.rs"]
mod webdriver;

use std::sync::atomic::{AtomicUsize, Ordering};

use idem::{tool, Classify, Ctx, Failure, IdemKey, Runtime, ToolError};
use support::{open_with_admin, ACCOUNT};
use webdriver::Browser;

#[derive(Debug)]
struct Declined;

impl Classify for Declined {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

/// How many payouts ran.
static PAID: AtomicUsize = AtomicUsize::new(0);

/// The PIN each payout carries: redacted, so it is never written.
const PIN: &str = "pin-7731-never-shown";

/// Markup in a memo: it must stay text.
const HOSTILE: &str = "<img src=x onerror=alert(1)>";

/// Payouts above 1,000 EUR need a person; the reason quotes the memo.
fn above_1000(
    _ctx: &Ctx,
    _order_id: &u64,
    _to_account: &String,
    amount_eur: &u64,
    memo: &String,
    _pin: &String,
) -> Option<String> {
    (*amount_eur > 1_000).then(|| format!("a payout of {amount_eur} EUR is above 1000 EUR: {memo}"))
}

#[tool(
    class = "provider",
    key = "order_id",
    approve = above_1000,
    redact = "pin"
)]
async fn payout(
    ctx: &Ctx,
    order_id: u64,
    to_account: String,
    amount_eur: u64,
    memo: String,
    pin: String,
) -> Result<String, Declined> {
    let _ = (ctx, memo, pin);
    PAID.fetch_add(1, Ordering::SeqCst);
    Ok(format!(
        "paid {amount_eur} EUR to {to_account} for order {order_id}"
    ))
}

fn paid() -> usize {
    PAID.load(Ordering::SeqCst)
}

/// Order `order_id`'s payout, as the worker calls it (every call of an
/// order has the same arguments).
async fn pay(ctx: &Ctx, order_id: u64) -> Result<String, ToolError<Declined>> {
    let (amount, memo) = match order_id {
        1 => (5_000, "invoice 7, June".to_string()),
        2 => (2_500, format!("refund {HOSTILE}")),
        _ => (3_000, "invoice 9".to_string()),
    };
    payout(ctx, order_id, ACCOUNT.into(), amount, memo, PIN.into()).await
}

async fn awaiting(ctx: &Ctx, order_id: u64) -> IdemKey {
    match pay(ctx, order_id).await {
        Err(ToolError::AwaitingApproval { key }) => key,
        other => panic!("order {order_id}: expected AwaitingApproval, got {other:?}"),
    }
}

async fn events(rt: &Runtime) -> usize {
    rt.audit(0).await.unwrap().len()
}

async fn pending(rt: &Runtime) -> Vec<String> {
    rt.approvals()
        .await
        .unwrap()
        .iter()
        .map(|a| a.key.to_string())
        .collect()
}

fn card(key: &IdemKey) -> String {
    format!("li.approval[data-key=\"{key}\"]")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_approves_and_rejects_calls_in_the_inbox() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("journal");
    let rt = open_with_admin(&dir);
    let ctx = rt.run("payouts-june").scope("treasury");
    let first = awaiting(&ctx, 1).await;
    let second = awaiting(&ctx, 2).await;
    assert_eq!(paid(), 0, "a payout ran before anyone approved it");

    let token = std::fs::read_to_string(idem::admin::token_path(&dir)).unwrap();
    let url = rt.admin_url().unwrap();
    let browser = Browser::start().await;
    browser
        .goto(&format!("{url}/#token={}", token.trim()))
        .await;

    // Each call as the record holds it: what runs if it is approved.
    let shown = browser
        .wait_for(&card(&first), "the first payout's card", |t| {
            t.contains("payout")
        })
        .await;
    let text = browser.text(&shown).await;
    // The redacted PIN was never written: nowhere in the page.
    let page = browser
        .execute("return document.documentElement.outerHTML")
        .await;
    assert!(
        !page.as_str().unwrap().contains(PIN),
        "the redacted PIN is on the page; the card shows:\n{text}"
    );
    for needle in [
        "payout",
        "provider",
        first.to_string().as_str(),
        "payouts-june / treasury",
        "a payout of 5000 EUR is above 1000 EUR: invoice 7, June",
        "order_id",
        "5000",
        ACCOUNT,
        "\"invoice 7, June\"",
        "pin",
        "<redacted>",
        "Asked",
        " UTC",
        "ago",
        "Approve",
        "Reject",
    ] {
        assert!(text.contains(needle), "{needle:?} not shown:\n{text}");
    }
    browser
        .wait_for("#approvals-summary", "the count", |t| {
            t.starts_with("2 calls wait")
        })
        .await;
    browser
        .wait_for("#status", "following", |t| t.starts_with("live"))
        .await;

    // Hostile text in the reason and an argument: shown as text, and no
    // element made of it.
    let hostile = browser
        .wait_for(&card(&second), "the second payout's card", |t| {
            t.contains("2500")
        })
        .await;
    let text = browser.text(&hostile).await;
    let images = browser
        .execute("return document.querySelectorAll('img').length")
        .await;
    assert_eq!(
        images, 0,
        "hostile text became markup; the card shows:\n{text}"
    );
    assert!(
        text.contains(&format!(
            "a payout of 2500 EUR is above 1000 EUR: refund {HOSTILE}"
        )),
        "the hostile reason is not shown as text:\n{text}"
    );
    assert!(
        text.contains(&format!("\"refund {HOSTILE}\"")),
        "the hostile memo is not shown as text:\n{text}"
    );
    if let Some(path) = std::env::var_os("IDEM_INBOX_APPROVALS_SCREENSHOT") {
        browser.execute("window.scrollTo(0, 0)").await;
        std::fs::write(path, browser.screenshot().await).unwrap();
    }
    // A reload would lose this: the rest happens on the same page.
    browser.execute("window.idemSamePage = 1").await;

    // Reject without a note: refused in the page, nothing sent.
    let before = events(&rt).await;
    let reject = browser
        .find(&format!("{} button.reject", card(&second)))
        .await
        .unwrap();
    browser.click(&reject).await;
    browser
        .wait_for(
            &format!("{} .error", card(&second)),
            "the missing note",
            |t| t.contains("A note is required to reject"),
        )
        .await;
    assert_eq!(events(&rt).await, before, "a refused rejection wrote");
    assert_eq!(pending(&rt).await.len(), 2);

    // The API's refusal (a note above the journal's limit) is shown on the
    // card as the API words it; the card stays and nothing is written.
    browser
        .execute(&format!(
            "document.querySelector('{} textarea.note').value = 'x'.repeat(70000)",
            card(&first)
        ))
        .await;
    let approve = browser
        .find(&format!("{} button.approve", card(&first)))
        .await
        .unwrap();
    browser.click(&approve).await;
    browser
        .wait_for(
            &format!("{} .error", card(&first)),
            "the API's refusal",
            |t| t.contains("exceeds the journal's limit") && t.contains("[too_large]"),
        )
        .await;
    assert_eq!(events(&rt).await, before, "a refused approval wrote");
    assert_eq!(pending(&rt).await.len(), 2);

    // Approve with a note: the card leaves; the record says so, through
    // the inbox; the next call runs the payout once and returns its result.
    let note = browser
        .find(&format!("{} textarea.note", card(&first)))
        .await
        .unwrap();
    browser
        .type_into(&note, "called the customer back: the invoice is real")
        .await;
    browser.click(&approve).await;
    browser
        .wait_gone(&card(&first), "approved: the card leaves")
        .await;
    let op = rt.operation(&first).await.unwrap().unwrap();
    let approval = op.approval.expect("the record keeps the approval");
    assert_eq!(approval.approved, Some(true), "{approval:?}");
    assert_eq!(approval.via.as_deref(), Some("inbox"), "{approval:?}");
    assert_eq!(
        approval.note.as_deref(),
        Some("called the customer back: the invoice is real")
    );
    let receipt = format!("paid 5000 EUR to {ACCOUNT} for order 1");
    assert_eq!(pay(&ctx, 1).await.unwrap(), receipt);
    assert_eq!(paid(), 1, "the approved payout ran other than once");
    assert_eq!(pay(&ctx, 1).await.unwrap(), receipt, "not replayed");
    assert_eq!(paid(), 1, "the approved payout ran again");
    browser
        .wait_for("#approvals-done", "the confirmation", |t| {
            t.contains("Approved payout")
        })
        .await;

    // Reject with a note: the card leaves; the next call returns the note.
    let note = browser
        .find(&format!("{} textarea.note", card(&second)))
        .await
        .unwrap();
    browser
        .type_into(&note, "duplicate of order 1: do not pay")
        .await;
    browser.click(&reject).await;
    browser
        .wait_gone(&card(&second), "rejected: the card leaves")
        .await;
    match pay(&ctx, 2).await {
        Err(ToolError::NotApproved { note, .. }) => {
            assert_eq!(note, "duplicate of order 1: do not pay")
        }
        other => panic!("expected NotApproved, got {other:?}"),
    }
    assert_eq!(paid(), 1, "a rejected payout ran");
    let op = rt.operation(&second).await.unwrap().unwrap();
    let approval = op.approval.expect("the record keeps the refusal");
    assert_eq!(approval.approved, Some(false), "{approval:?}");
    assert_eq!(approval.via.as_deref(), Some("inbox"), "{approval:?}");
    browser
        .wait_for("#approvals-summary", "the empty state", |t| {
            t == "No approvals waiting."
        })
        .await;

    // A new request appears by itself: the page follows the stream.
    let third = awaiting(&ctx, 3).await;
    browser
        .wait_for(&card(&third), "the new request, without a reload", |t| {
            t.contains("3000")
        })
        .await;
    browser
        .wait_for("#approvals-summary", "the count", |t| {
            t.starts_with("1 call waits")
        })
        .await;
    // Decided elsewhere (the runtime itself): its card leaves by itself.
    rt.approve(&third, "approved from the worker's own console")
        .await
        .unwrap();
    browser
        .wait_gone(&card(&third), "decided elsewhere, without a reload")
        .await;
    browser
        .wait_for("#approvals-summary", "the empty state again", |t| {
            t == "No approvals waiting."
        })
        .await;
    assert_eq!(
        browser.execute("return window.idemSamePage").await,
        1,
        "the page reloaded"
    );
    assert_eq!(
        pay(&ctx, 3).await.unwrap(),
        format!("paid 3000 EUR to {ACCOUNT} for order 3")
    );
    assert_eq!(paid(), 2);
    browser.close().await;
}
