//! The escalation inbox in a real browser (headless Chromium through
//! chromedriver): a worker parks an at_most_once wire; the operator opens
//! the inbox, sees the evidence, tries a malformed Landed (sees the error,
//! nothing changes), answers correctly, and the worker's next call
//! completes. The page also picks up a new escalation from the audit
//! stream without a reload.
//!
//! A second test shows the sagas section: a compensated saga and one
//! escalated for good (highlighted, first), a hostile reason shown as
//! text, and a saga that ends later appearing without a reload.
//!
//! `IDEM_INBOX_SCREENSHOT=docs/inbox.png` saves a screenshot of the inbox
//! (the README's).

#[path = "support/sagas.rs"]
mod sagas;
mod support;
#[path = "support/webdriver.rs"]
mod webdriver;

use idem::ToolError;
use idem_testkit::Fault;
use support::{Worker, ACCOUNT};
use webdriver::Browser;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_settles_a_parked_wire_in_the_inbox() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("journal");
    let worker = Worker::start(&dir).await;
    let key = worker.key.to_string();
    let token = std::fs::read_to_string(idem::admin::token_path(&dir)).unwrap();
    let url = worker.rt.admin_url().unwrap();
    let browser = Browser::start().await;

    browser
        .goto(&format!("{url}/#token={}", token.trim()))
        .await;
    let card = format!("li.card[data-key=\"{key}\"]");
    // The evidence, as the operator needs it to decide.
    let shown = browser
        .wait_for(&card, "the parked wire's card", |t| t.contains("send_wire"))
        .await;
    let text = browser.text(&shown).await;
    for needle in [
        "at_most_once",
        &key,
        "refunds",
        "order_id",
        "1999",
        ACCOUNT,
        "Last error",
        "connection",
        "Verify said",
        "Escalated",
    ] {
        assert!(text.contains(needle), "{needle:?} not shown:\n{text}");
    }
    let status = browser
        .wait_for("#status", "following", |t| t.starts_with("live"))
        .await;
    let _ = status;

    // Landed: the editor starts from the tool's latest committed result.
    let landed = browser
        .find(&format!("{card} input[value=landed]"))
        .await
        .unwrap();
    browser.click(&landed).await;
    let editor = browser
        .find(&format!("{card} textarea.result"))
        .await
        .unwrap();
    assert!(browser.displayed(&editor).await);
    let example = browser.value(&editor).await;
    assert!(
        example.contains("refund-1"),
        "not pre-filled with an example: {example}"
    );
    let note = browser
        .find(&format!("{card} textarea.note"))
        .await
        .unwrap();
    browser
        .type_into(&note, "bank statement of 2 June shows the wire")
        .await;
    if let Some(path) = std::env::var_os("IDEM_INBOX_SCREENSHOT") {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(path);
        browser.execute("window.scrollTo(0, 0)").await;
        std::fs::write(&path, browser.screenshot().await).unwrap();
    }

    let submit = browser
        .find(&format!("{card} button[type=submit]"))
        .await
        .unwrap();
    let events = worker.events().await;
    // Not JSON: refused in the page, nothing sent.
    browser.type_into(&editor, "{\"id\": ").await;
    browser.click(&submit).await;
    browser
        .wait_for(&format!("{card} .error"), "the JSON error", |t| {
            t.contains("not valid JSON")
        })
        .await;
    // JSON of the wrong shape: refused by the process, with its reason.
    browser.type_into(&editor, "{\"id\": 5}").await;
    browser.click(&submit).await;
    browser
        .wait_for(&format!("{card} .error"), "the API's refusal", |t| {
            t.contains("does not fit the result type") && t.contains("result_type")
        })
        .await;
    assert_eq!(
        worker.events().await,
        events,
        "a refused answer wrote something"
    );
    assert_eq!(worker.operator_events().await, 0);
    assert_eq!(worker.rt.escalations().await.unwrap().len(), 1);

    // The bank's real receipt: accepted.
    let receipt = worker.real_receipt();
    browser
        .type_into(&editor, &serde_json::to_string(&receipt).unwrap())
        .await;
    browser.click(&submit).await;
    browser
        .wait_for(&format!("{card} .done"), "the resolution", |t| {
            t.contains("Resolved as landed")
        })
        .await;
    assert!(worker.rt.escalations().await.unwrap().is_empty());
    // The worker's next call completes with it; the bank made one wire.
    assert_eq!(worker.call_again().await.unwrap(), receipt);
    assert_eq!(
        worker
            .providers
            .wire()
            .ledger()
            .iter()
            .filter(|w| w.reference == "refund-2")
            .count(),
        1
    );

    // A new escalation appears by itself: the page follows the stream.
    worker
        .providers
        .wire()
        .faults()
        .push(Fault::disconnect_after_apply());
    let ctx = worker.rt.run("refunds");
    let parked = match worker.bank.send_wire(&ctx, 3, ACCOUNT.into(), 42).await {
        Err(ToolError::Escalated { key, .. }) => key,
        other => panic!("expected an escalation, got {other:?}"),
    };
    browser
        .wait_for(
            &format!("li.card[data-key=\"{parked}\"]"),
            "the new escalation, without a reload",
            |t| t.contains("42"),
        )
        .await;
    browser.close().await;
}

/// Markup in a saga's reason: it must stay text.
const HOSTILE: &str = "<img src=x onerror=alert(1)>";

fn saga_card(key: &idem::IdemKey) -> String {
    format!("li.saga[data-key=\"{key}\"]")
}

async fn saga_key(rt: &idem::Runtime, run: &str) -> idem::IdemKey {
    rt.sagas()
        .await
        .unwrap()
        .into_iter()
        .find(|s| s.root_run == run)
        .unwrap_or_else(|| panic!("no saga of {run}"))
        .key
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_sees_compensated_and_escalated_sagas_in_the_inbox() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("journal");
    let rt = support::open_with_admin(&dir);
    sagas::trip(&rt.run("trip-1"), 1, true, Some("the flight was cancelled"))
        .await
        .unwrap_err();
    let reason = format!("the customer wrote {HOSTILE}");
    sagas::trip(&rt.run("trip-2"), 2, false, Some(&reason))
        .await
        .unwrap_err();
    let compensated = saga_key(&rt, "trip-1").await;
    let escalated = saga_key(&rt, "trip-2").await;

    let token = std::fs::read_to_string(idem::admin::token_path(&dir)).unwrap();
    let url = rt.admin_url().unwrap();
    let browser = Browser::start().await;
    browser
        .goto(&format!("{url}/#token={}", token.trim()))
        .await;

    let shown = browser
        .wait_for(&saga_card(&compensated), "the compensated saga", |t| {
            t.contains("trip")
        })
        .await;
    let text = browser.text(&shown).await;
    for needle in [
        "compensated",
        compensated.as_str(),
        "trip-1",
        "the flight was cancelled",
        "book_room book_room-",
        "every completed step was undone",
        "Started",
        " UTC",
    ] {
        assert!(text.contains(needle), "{needle:?} not shown:\n{text}");
    }

    // The escalated one: first, highlighted, its evidence, and the hostile
    // reason as text (no element made of it).
    let shown = browser
        .wait_for(&saga_card(&escalated), "the escalated saga", |t| {
            t.contains("trip-2")
        })
        .await;
    let text = browser.text(&shown).await;
    for needle in [
        "escalated",
        "Escalated for good",
        "the hotel keeps the deposit",
        "left: book_room",
    ] {
        assert!(text.contains(needle), "{needle:?} not shown:\n{text}");
    }
    assert!(
        text.contains(&format!("the customer wrote {HOSTILE}")),
        "the hostile reason is not shown as text:\n{text}"
    );
    let images = browser
        .execute("return document.querySelectorAll('img').length")
        .await;
    assert_eq!(images, 0, "hostile text became markup:\n{text}");
    let first = browser
        .execute("return document.querySelector('#sagas > li').dataset.key")
        .await;
    assert_eq!(
        first,
        escalated.to_string(),
        "the escalated saga is not first"
    );
    let highlight = browser
        .execute(&format!(
            "const c = document.querySelector('{}'); \
             return [c.classList.contains('escalated'), getComputedStyle(c).borderLeftColor, \
             getComputedStyle(document.querySelector('{}')).borderLeftColor]",
            saga_card(&escalated),
            saga_card(&compensated)
        ))
        .await;
    assert_eq!(highlight[0], true, "{highlight}");
    assert_eq!(
        highlight[1], "rgb(220, 38, 38)",
        "not highlighted: {highlight}"
    );
    assert_ne!(highlight[1], highlight[2], "{highlight}");
    browser
        .wait_for("#sagas-summary", "the count", |t| {
            t.starts_with("2 sagas: 1 escalated, 0 compensating, 1 compensated")
        })
        .await;
    browser
        .wait_for("#status", "following", |t| t.starts_with("live"))
        .await;
    if let Some(path) = std::env::var_os("IDEM_INBOX_SAGAS_SCREENSHOT") {
        browser
            .execute("document.querySelector('#sagas-section').scrollIntoView()")
            .await;
        std::fs::write(path, browser.screenshot().await).unwrap();
    }

    // A saga that starts now appears by itself (its start is the only
    // event it writes while its body waits), then its end: the page follows
    // the stream.
    browser.execute("window.idemSamePage = 1").await;
    let (go, wait) = tokio::sync::oneshot::channel::<()>();
    let ctx = rt.run("trip-3");
    let held = tokio::spawn(async move {
        ctx.saga("trip", |s| async move {
            let _ = wait.await;
            sagas::book_room(s.ctx(), 3, true).await?;
            Err::<(), idem::ToolError<sagas::Refused>>(s.abort("a storm"))
        })
        .await
    });
    browser
        .wait_for("#sagas", "the new saga, without a reload", |t| {
            t.contains("trip-3") && t.contains("no rollback decided")
        })
        .await;
    go.send(()).unwrap();
    held.await.unwrap().unwrap_err();
    let later = saga_key(&rt, "trip-3").await;
    browser
        .wait_for(&saga_card(&later), "its end, without a reload", |t| {
            t.contains("a storm") && t.contains("every completed step was undone")
        })
        .await;
    assert_eq!(browser.execute("return window.idemSamePage").await, 1);
    browser.close().await;
}
