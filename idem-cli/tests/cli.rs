//! The `idem` binary against a running worker (this test process, serving
//! the admin API) and against an idle journal (no process holds it).

mod support;

use std::time::Duration;

use idem::Runtime;
use serde_json::json;
use support::{idem, idem_env, Worker};
use tokio::io::AsyncBufReadExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_subcommand_against_a_running_worker() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("journal");
    let worker = Worker::start(&dir).await;
    let key = worker.key.to_string();

    // escalations: the evidence an operator decides on.
    let list = idem(&dir, &["--json", "escalations"]).await.json();
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 1);
    let e = &list[0];
    assert_eq!(e["key"], key);
    assert_eq!(e["tool"], "send_wire");
    assert_eq!(e["class"], "at_most_once");
    assert_eq!(e["args"]["amount"], 1999);
    assert_eq!(e["attempts"], 1);
    assert!(
        e["last_error"].as_str().unwrap().contains("connection"),
        "{e}"
    );
    assert!(e["escalated_ms"].as_u64().unwrap() >= e["first_attempt_ms"].as_u64().unwrap());
    let table = idem(&dir, &["escalations"]).await;
    for needle in [
        key.as_str(),
        "send_wire (at_most_once)",
        "amount",
        "1999",
        "last error",
        "verify said",
        "escalated",
        "reason",
    ] {
        assert!(
            table.ok().contains(needle),
            "{needle:?} missing:\n{}",
            table.stdout
        );
    }

    // tools: the descriptor, and the latest committed result as the shape
    // of a Landed answer.
    let tools = idem(&dir, &["--json", "tools"]).await.json();
    let wire = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "send_wire")
        .expect("send_wire listed");
    assert_eq!(wire["class"], "at_most_once");
    assert_eq!(wire["key_fields"], json!(["order_id"]));
    assert_eq!(wire["checks_landed"], true);
    assert_eq!(wire["example_result"]["result"]["reference"], "refund-1");
    assert!(idem(&dir, &["tools"]).await.ok().contains("at_most_once"));

    // show: the record and its history.
    let shown = idem(&dir, &["--json", "show", &key]).await.json();
    assert_eq!(shown["operation"]["state"], "escalated");
    let kinds: Vec<String> = shown["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            e["kind"].as_object().map_or_else(
                || e["kind"].to_string(),
                |o| o.keys().next().unwrap().clone(),
            )
        })
        .collect();
    assert!(kinds.contains(&"intent".to_string()), "{kinds:?}");
    assert!(kinds.contains(&"escalated".to_string()), "{kinds:?}");
    assert!(idem(&dir, &["show", &key]).await.ok().contains("history ("));

    let before = worker.events().await;

    // A wrong token: the worker cannot prove it holds it, so it is not
    // sent; exit 4, nothing written.
    let refused = idem_env(
        &dir,
        &["--json", "resolve", &key, "--reissue", "--note", "x"],
        &[("IDEM_ADMIN_TOKEN", "not-the-token")],
    )
    .await;
    let err = refused.json_error(4);
    assert_eq!(err["error"], "unproven");
    assert_eq!(worker.events().await, before);
    assert_eq!(worker.rt.escalations().await.unwrap().len(), 1);

    // A malformed resolution: a result that is not a WireReceipt.
    let refused = idem(
        &dir,
        &[
            "--json",
            "resolve",
            &key,
            "--landed",
            r#"{"id": 5}"#,
            "--note",
            "seen",
        ],
    )
    .await;
    let err = refused.json_error(1);
    assert_eq!(err["error"], "result_type");
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("nothing was written"),
        "{err}"
    );
    // Not JSON at all: refused before anything is sent.
    let refused = idem(
        &dir,
        &["resolve", &key, "--landed", "{id: 5", "--note", "seen"],
    )
    .await;
    assert_eq!(refused.code, 2, "{refused:?}");
    assert!(refused.stderr.contains("is not JSON"), "{refused:?}");
    // No note, a blank note, two resolutions at once.
    assert_eq!(idem(&dir, &["resolve", &key, "--reissue"]).await.code, 2);
    assert_eq!(
        idem(&dir, &["resolve", &key, "--reissue", "--note", "  "])
            .await
            .code,
        2
    );
    assert_eq!(
        idem(
            &dir,
            &["resolve", &key, "--reissue", "--abandon", "--note", "x"]
        )
        .await
        .code,
        2
    );
    // A key that names nothing, a key that is not one.
    let unknown = format!("send_wire-{}-g0", "0".repeat(64));
    let err = idem(&dir, &["--json", "show", &unknown])
        .await
        .json_error(1);
    assert_eq!(err["error"], "unknown_key");
    let err = idem(&dir, &["--json", "show", "nonsense"])
        .await
        .json_error(1);
    assert_eq!(err["error"], "bad_key");
    assert_eq!(
        worker.events().await,
        before,
        "a refused request wrote something"
    );
    assert_eq!(worker.operator_events().await, 0);

    // The right answer, from a file: the bank statement's wire.
    let receipt = worker.real_receipt();
    let file = tmp.path().join("receipt.json");
    std::fs::write(&file, serde_json::to_string(&receipt).unwrap()).unwrap();
    let resolved = idem(
        &dir,
        &[
            "--json",
            "resolve",
            &key,
            "--landed-file",
            file.to_str().unwrap(),
            "--note",
            "on the bank statement",
        ],
    )
    .await
    .json();
    assert_eq!(resolved["resolution"], "landed");
    assert_eq!(resolved["operation"]["state"], "committed");
    assert_eq!(resolved["operation"]["committed_via"], "operator");
    // The worker's next call completes with it, without a second wire.
    assert_eq!(worker.call_again().await.unwrap(), receipt);
    assert_eq!(worker.providers.wire().ledger().len(), 2);

    // Settled once: resolving an operation the engine committed is refused.
    let committed_by_call = worker
        .rt
        .audit(0)
        .await
        .unwrap()
        .into_iter()
        .find(|e| e.key.as_deref().is_some_and(|k| k != key))
        .and_then(|e| e.key)
        .unwrap();
    let err = idem(
        &dir,
        &[
            "--json",
            "resolve",
            &committed_by_call,
            "--abandon",
            "--note",
            "x",
        ],
    )
    .await
    .json_error(1);
    assert_eq!(err["error"], "not_escalated");

    // audit: JSON lines, the operator's events among them.
    let audit = idem(&dir, &["--json", "audit", "--from", "0"]).await;
    let events: Vec<serde_json::Value> = audit
        .ok()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), worker.events().await);
    assert!(events
        .iter()
        .any(|e| e["agent"] == "operator"
            && e["kind"]["resolved"]["note"] == "on the bank statement"));
    let from = events[3]["seq"].as_u64().unwrap().to_string();
    let tail = idem(&dir, &["--json", "audit", "--from", &from, "--limit", "2"]).await;
    assert_eq!(tail.ok().lines().count(), 2);
    assert!(idem(&dir, &["audit"])
        .await
        .ok()
        .contains("resolved landed: on the bank statement"));
    assert_eq!(idem(&dir, &["audit", "--from", "soon"]).await.code, 2);

    // stats and prune.
    let stats = idem(&dir, &["--json", "stats"]).await.json();
    assert_eq!(stats["tools"]["send_wire"]["escalations"], 1);
    assert_eq!(stats["tools"]["send_wire"]["commits"], 2);
    assert!(stats["journal_bytes"].as_u64().unwrap() > 0);
    assert!(idem(&dir, &["stats"]).await.ok().contains("ESCALATED"));
    let pruned = idem(&dir, &["--json", "prune"]).await.json();
    assert_eq!(
        pruned["ops_removed"], 0,
        "nothing is older than the retention"
    );
    assert_eq!(idem(&dir, &["prune", "--keep", "1d"]).await.code, 2);

    // Two journals named at once: which is meant would be a guess.
    let pg = idem(&dir, &["--postgres", "postgres://x", "stats"]).await;
    assert_eq!(pg.code, 2, "{pg:?}");
    assert!(
        pg.stderr
            .contains("give --postgres URL or --journal, not both"),
        "{pg:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_follow_streams_what_happens_while_it_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("journal");
    let worker = Worker::start(&dir).await;
    // Follow from the next sequence number: whatever happens once the
    // follower runs, and whatever happened between its start and its
    // subscription, arrives.
    let next = worker.rt.audit(0).await.unwrap().last().unwrap().seq + 1;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .arg("--journal")
        .arg(&dir)
        .args(["--json", "audit", "--from", &next.to_string(), "--follow"])
        .env_remove("IDEM_ADMIN_TOKEN")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let receipt = worker.real_receipt();
    let resolved = idem(
        &dir,
        &[
            "resolve",
            worker.key.as_str(),
            "--landed",
            &serde_json::to_string(&receipt).unwrap(),
            "--note",
            "followed",
        ],
    )
    .await;
    assert_eq!(resolved.code, 0, "{resolved:?}");
    assert_eq!(worker.call_again().await.unwrap(), receipt);
    let mut kinds = Vec::new();
    let mut seqs = Vec::new();
    while kinds.len() < 3 {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the follower printed the next event")
            .unwrap()
            .expect("the follower runs");
        let event: serde_json::Value = serde_json::from_str(&line).unwrap();
        seqs.push(event["seq"].as_u64().unwrap());
        kinds.push(match &event["kind"] {
            serde_json::Value::Object(o) => o.keys().next().unwrap().clone(),
            other => other.as_str().unwrap().to_string(),
        });
    }
    // The operator's resolution, its commit, then the worker's replay: in
    // order, each once, all durable.
    assert_eq!(kinds, ["resolved", "committed", "dedupe_hit"]);
    assert!(
        seqs[0] >= next && seqs.windows(2).all(|w| w[0] < w[1]),
        "{seqs:?}"
    );
    let durable: Vec<u64> = worker
        .rt
        .audit(next)
        .await
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(durable, seqs);
    let _ = child.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_subcommand_against_an_idle_journal() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("journal");
    let (key, second) = {
        let worker = Worker::start(&dir).await;
        // A second parked wire, for a resolution made without the process.
        worker
            .providers
            .wire()
            .faults()
            .push(idem_testkit::Fault::disconnect_after_apply());
        let ctx = worker.rt.run("refunds");
        let second = match worker.bank.send_wire(&ctx, 3, "DE00".into(), 7).await {
            Err(idem::ToolError::Escalated { key, .. }) => key,
            other => panic!("expected an escalation, got {other:?}"),
        };
        (worker.key.to_string(), second.to_string())
        // The worker stops: its server goes, the journal is free.
    };
    assert!(
        !idem::admin::address_path(&dir).exists(),
        "the address file was left behind"
    );

    let list = idem(&dir, &["--json", "escalations"]).await.json();
    assert_eq!(list.as_array().unwrap().len(), 2);
    let tools = idem(&dir, &["--json", "tools"]).await.json();
    assert_eq!(tools, json!([{"name": "send_wire", "calls": 3}]));
    assert!(idem(&dir, &["tools"])
        .await
        .ok()
        .contains("no running process"));
    assert_eq!(
        idem(&dir, &["--json", "show", &key]).await.json()["operation"]["state"],
        "escalated"
    );

    // A Landed answer cannot be checked without the program that defines
    // the tool: refused, with what to do.
    let refused = idem(&dir, &["resolve", &key, "--landed", "{}", "--note", "x"]).await;
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(
        refused.stderr.contains("cannot check the result"),
        "{refused:?}"
    );
    assert!(
        refused.stderr.contains(".admin(\\\"127.0.0.1:0\\\")")
            || refused.stderr.contains(".admin(\"127.0.0.1:0\")"),
        "{refused:?}"
    );
    assert!(
        refused
            .stderr
            .contains("--reissue and --abandon need no type check"),
        "{refused:?}"
    );
    // Reissue and Abandon need no check.
    let abandoned = idem(
        &dir,
        &[
            "--json",
            "resolve",
            &second,
            "--abandon",
            "--note",
            "cancelled",
        ],
    )
    .await
    .json();
    assert_eq!(abandoned["operation"]["state"], "abandoned");

    let audit = idem(&dir, &["--json", "audit"]).await;
    assert!(audit.ok().lines().count() > 5);
    let follow = idem(&dir, &["audit", "--follow"]).await;
    assert_eq!(follow.code, 3, "{follow:?}");
    assert!(
        follow.stderr.contains("needs a running process"),
        "{follow:?}"
    );

    let stats = idem(&dir, &["--json", "stats"]).await.json();
    assert_eq!(stats["tools"]["send_wire"]["escalations"], 2);
    let prune = idem(&dir, &["prune"]).await;
    assert_eq!(prune.code, 2, "{prune:?}");
    assert!(prune.stderr.contains("--keep"), "{prune:?}");
    let pruned = idem(&dir, &["--json", "prune", "--keep", "7d"])
        .await
        .json();
    assert_eq!(
        pruned["ops_kept_open"], 1,
        "the escalated wire is kept: {pruned}"
    );

    // The CLI let go of the journal: a worker opens it again.
    drop(Runtime::open(&dir).expect("the CLI released the journal"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_held_without_the_admin_api_or_absent_is_unreachable() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("journal");
    let rt = Runtime::open(&dir).unwrap();
    let held = idem(&dir, &["escalations"]).await;
    assert_eq!(held.code, 3, "{held:?}");
    assert!(
        held.stderr.contains("does not serve the admin API"),
        "{held:?}"
    );
    assert!(held.stderr.contains(".admin("), "{held:?}");
    drop(rt);

    // A stale address file (the process died): the journal is free, the
    // CLI opens it and removes the file.
    let stale = idem::admin::AddressFile {
        url: "http://127.0.0.1:9".into(),
        addr: "127.0.0.1:9".parse().unwrap(),
        pid: 1,
        instance: "gone".into(),
    };
    std::fs::write(
        idem::admin::address_path(&dir),
        serde_json::to_vec(&stale).unwrap(),
    )
    .unwrap();
    let ok = idem(&dir, &["--json", "escalations"]).await.json();
    assert_eq!(ok, json!([]));
    assert!(!idem::admin::address_path(&dir).exists());

    let missing = idem(&tmp.path().join("nope"), &["escalations"]).await;
    assert_eq!(missing.code, 3, "{missing:?}");
    assert!(
        !tmp.path().join("nope").exists(),
        "the CLI must not create a journal"
    );
    let none = tokio::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .arg("stats")
        .env_remove("IDEM_JOURNAL")
        .env_remove("IDEM_ADMIN_URL")
        .output()
        .await
        .unwrap();
    assert_eq!(none.status.code(), Some(2));
}
