//! Sagas from the operator's side: `GET /v1/sagas` (behind the token like
//! every `/v1/` route) and `idem sagas` through a running worker's admin
//! API and on a journal no process holds, hostile text in a saga's reason
//! shown escaped.

#[path = "support/sagas.rs"]
mod sagas;
mod support;

use sagas::trip;
use serde_json::Value;
use support::{idem, idem_env, open_with_token, TOKEN};

/// Markup and a terminal escape in an abort's reason.
const HOSTILE: &str = "<img src=x onerror=alert(1)> \u{1b}[2J\nverify said  landed: forged";

async fn get(url: &str, token: Option<&str>) -> (u16, Value, String) {
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut req = http.get(url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let answer = req.send().await.unwrap();
    let status = answer.status().as_u16();
    let allow = answer
        .headers()
        .get("allow")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let text = answer.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap(), allow)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_list_sagas_through_the_api_and_the_cli() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("j");
    let rt = open_with_token(&dir, TOKEN);
    // Compensated, escalated for good (the hotel keeps the deposit), running.
    let err = trip(&rt.run("trip-1"), 1, true, Some("the flight was cancelled"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, idem::ToolError::Compensated { .. }),
        "{err:?}"
    );
    let err = trip(&rt.run("trip-2"), 2, false, Some(HOSTILE))
        .await
        .unwrap_err();
    assert!(matches!(err, idem::ToolError::Escalated { .. }), "{err:?}");
    trip(&rt.run("trip-3"), 3, true, None).await.unwrap();

    // The API: behind the token.
    let url = format!("{}/v1/sagas", rt.admin_url().unwrap());
    for token in [None, Some("wrong")] {
        let (status, answer, _) = get(&url, token).await;
        assert_eq!(status, 401, "{token:?}: {answer}");
        assert_eq!(answer["error"], "unauthorized");
    }
    let (status, listed, _) = get(&url, Some(TOKEN)).await;
    assert_eq!(status, 200, "{listed}");
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 3, "{listed:?}");
    let of = |run: &str| {
        listed
            .iter()
            .find(|s| s["root_run"] == run)
            .unwrap_or_else(|| panic!("no {run} in {listed:?}"))
    };
    assert_eq!(of("trip-1")["state"], "compensated");
    assert_eq!(of("trip-1")["reason"], "the flight was cancelled");
    assert_eq!(of("trip-1")["undone"][0]["tool"], "book_room");
    let parked = of("trip-2");
    assert_eq!(parked["state"], "escalated");
    assert_eq!(parked["for_good"], true);
    assert_eq!(parked["saga"], "trip");
    assert_eq!(parked["reason"], HOSTILE, "the reason as it was given");
    assert!(
        parked["escalation"]
            .as_str()
            .unwrap()
            .contains("the hotel keeps the deposit"),
        "{parked}"
    );
    assert_eq!(parked["steps"][0]["tool"], "book_room");
    assert_eq!(of("trip-3")["state"], "running");
    // Only GET; an unknown route names this one among the routes.
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let post = http.post(&url).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(post.status().as_u16(), 405);
    assert_eq!(post.headers()["allow"], "GET");
    let (status, missing, _) =
        get(&format!("{}/v1/saga", rt.admin_url().unwrap()), Some(TOKEN)).await;
    assert_eq!(status, 404);
    assert!(
        missing["message"].as_str().unwrap().contains("/v1/sagas"),
        "{missing}"
    );

    // The CLI, through the worker: JSON as the API says, and a table.
    let env = [("IDEM_ADMIN_TOKEN", TOKEN)];
    let json = idem_env(&dir, &["--json", "sagas"], &env).await.json();
    assert_eq!(json.as_array().unwrap(), listed);
    let table = idem_env(&dir, &["sagas"], &env).await;
    let text = table.ok();
    assert!(
        text.starts_with(
            "3 sagas (oldest start first): 1 escalated, 0 compensating, 1 compensated, 1 running"
        ),
        "{text}"
    );
    for needle in [
        "STATE",
        "ESCALATED ",
        "compensated ",
        "running ",
        "trip-1",
        "trip-2",
        "saga trip (escalated for good: a person must finish it)",
        "the hotel keeps the deposit",
        "undone       -",
        "steps        book_room book_room-",
    ] {
        assert!(text.contains(needle), "{needle:?} not shown:\n{text}");
    }
    assert!(
        !text.contains('\u{1b}'),
        "a raw escape reached the terminal: {text:?}"
    );
    assert!(
        !text
            .lines()
            .any(|l| l.trim_start().starts_with("verify said")),
        "a forged line: {text}"
    );
    assert!(text.contains("\\u{1b}[2J\\nverify said"), "{text}");

    // With no process holding the journal, the CLI opens it itself: the
    // same sagas.
    drop(rt);
    let direct = idem(&dir, &["--json", "sagas"]).await.json();
    assert_eq!(direct.as_array().unwrap(), listed);
}
