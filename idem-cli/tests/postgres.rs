//! The `idem` binary against the shared PostgreSQL journal (`--postgres
//! URL`), beside a worker (this test process) connected to the same
//! database: a throwaway server started by the test (`idem_testkit::pg`),
//! one database per test.

#[path = "support/sagas.rs"]
mod sagas;
mod support;

use std::time::Duration;

use idem::{EventKind, IdemKey, Resolution, Runtime, ToolError};
use idem_testkit::pg::PgServer;
use idem_testkit::{ProviderError, Providers, WireClient, WireReceipt};
use serde_json::json;
use support::{idem_bare, idem_command, Bank, Run, ACCOUNT};
use tokio::io::AsyncBufReadExt;

/// A worker on the PostgreSQL journal at `url`, with one wire that went
/// through (order 1) and one parked on an escalation (order 2: the bank
/// applied it, then the connection broke before the answer).
struct PgWorker {
    rt: Runtime,
    providers: Providers,
    bank: Bank,
    /// The parked wire's key.
    key: IdemKey,
}

impl PgWorker {
    async fn start(url: &str) -> PgWorker {
        let providers = Providers::start().await.expect("providers");
        let bank = Bank {
            client: WireClient::new(providers.addrs().wire),
        };
        let rt = Runtime::builder()
            .postgres(url)
            .worker_id("worker-1")
            .connect()
            .await
            .expect("the worker connects (and creates the schema)");
        let key = support::park_a_wire(&rt, &bank, &providers).await;
        PgWorker {
            rt,
            providers,
            bank,
            key,
        }
    }

    async fn call_again(&self) -> Result<WireReceipt, ToolError<ProviderError>> {
        let ctx = self.rt.run("refunds");
        self.bank.send_wire(&ctx, 2, ACCOUNT.into(), 1999).await
    }

    /// Reissues the parked wire with `note` and runs it again; the stream's
    /// numbers after `last` (what that wrote), as the worker reads them.
    async fn reissue_and_rerun(&self, note: &str, last: u64) -> Vec<u64> {
        self.rt
            .resolve(&self.key, Resolution::Reissue, note)
            .await
            .unwrap();
        self.call_again().await.expect("the reissued wire");
        self.seqs(last + 1).await
    }

    /// The durable stream's sequence numbers, as the worker reads it.
    async fn seqs(&self, from: u64) -> Vec<u64> {
        self.rt
            .audit(from)
            .await
            .unwrap()
            .iter()
            .map(|e| e.seq)
            .collect()
    }
}

/// `idem --postgres URL ARGS`.
async fn pg(url: &str, args: &[&str]) -> Run {
    let mut all = vec!["--postgres", url];
    all.extend_from_slice(args);
    idem_bare(&all, &[]).await
}

/// An event's kind, as its JSON names it (`"intent"` or `{"resolved": ..}`).
fn kind_of(event: &serde_json::Value) -> String {
    match &event["kind"] {
        serde_json::Value::Object(o) => o.keys().next().unwrap().clone(),
        other => other.as_str().unwrap().to_string(),
    }
}

fn json_lines(run: &Run) -> Vec<serde_json::Value> {
    run.ok()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_subcommand_against_a_shared_postgres_journal() {
    let url = PgServer::shared().create_database().unwrap();
    let worker = PgWorker::start(&url).await;
    let key = worker.key.to_string();

    // escalations: the worker's parked wire, with its evidence.
    let list = pg(&url, &["--json", "escalations"]).await.json();
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0]["key"], key);
    assert_eq!(list[0]["tool"], "send_wire");
    assert_eq!(list[0]["class"], "at_most_once");
    assert_eq!(list[0]["args"]["amount"], 1999);
    let table = pg(&url, &["escalations"]).await;
    assert!(table.ok().contains(&key), "{table:?}");
    assert!(table.ok().contains("send_wire (at_most_once)"), "{table:?}");

    // tools: names from the audit stream, and why only names.
    let tools = pg(&url, &["--json", "tools"]).await.json();
    assert_eq!(tools, json!([{"name": "send_wire", "calls": 2}]));
    let table = pg(&url, &["tools"]).await;
    assert!(
        table.ok().contains("idem has no tool registry"),
        "{table:?}"
    );

    // show: the record and its history.
    let shown = pg(&url, &["--json", "show", &key]).await.json();
    assert_eq!(shown["operation"]["state"], "escalated");
    let kinds: Vec<String> = shown["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(kind_of)
        .collect();
    assert!(kinds.contains(&"intent".to_string()), "{kinds:?}");
    assert!(kinds.contains(&"escalated".to_string()), "{kinds:?}");

    // --landed: only a program that defines the tool can check the result,
    // so it is refused, with where to go instead, and nothing is written.
    let before = worker.seqs(0).await;
    let receipt = serde_json::to_string(&worker.providers.wire().ledger()[1]).unwrap();
    let refused = pg(
        &url,
        &["resolve", &key, "--landed", &receipt, "--note", "x"],
    )
    .await;
    assert_eq!(refused.code, 1, "{refused:?}");
    for needle in [
        "cannot check the result",
        "run the same command with --worker ID instead of --postgres",
        "`idem workers` lists them",
    ] {
        assert!(refused.stderr.contains(needle), "{needle:?}: {refused:?}");
    }
    let err = pg(
        &url,
        &[
            "--json", "resolve", &key, "--landed", &receipt, "--note", "x",
        ],
    )
    .await
    .json_error(1);
    assert_eq!(err["error"], "result_type");
    assert!(
        err["hint"].as_str().unwrap().contains("--worker ID"),
        "{err}"
    );
    assert_eq!(worker.seqs(0).await, before, "a refused --landed wrote");
    assert_eq!(worker.rt.escalations().await.unwrap().len(), 1);

    // --reissue: settled in the shared journal, seen by the worker.
    let resolved = pg(
        &url,
        &[
            "--json",
            "resolve",
            &key,
            "--reissue",
            "--note",
            "not on the bank statement",
        ],
    )
    .await
    .json();
    assert_eq!(resolved["resolution"], "reissue");
    assert_eq!(resolved["operation"]["state"], "reissue");
    assert!(worker.rt.escalations().await.unwrap().is_empty());
    let op = worker.rt.operation(&worker.key).await.unwrap().unwrap();
    assert_eq!(op.state, "reissue");
    let history = worker.rt.history(&worker.key).await.unwrap();
    let by_operator = history
        .iter()
        .find(|e| matches!(&e.kind, EventKind::Resolved { .. }))
        .expect("the worker's history has the resolution");
    assert_eq!(by_operator.agent, "operator");
    assert!(
        matches!(&by_operator.kind, EventKind::Resolved { resolution, note }
            if resolution == "reissue" && note == "not on the bank statement"),
        "{by_operator:?}"
    );
    // The worker's next call runs the wire again (the operator's decision).
    let again = worker.call_again().await.expect("the reissued wire");
    assert_eq!(again.reference, "refund-2");
    assert_eq!(worker.providers.wire().ledger().len(), 3);
    let shown = pg(&url, &["--json", "show", &key]).await.json();
    assert_eq!(shown["operation"]["state"], "committed");

    // audit: the whole stream, in order, exactly as the worker reads it.
    let events = json_lines(&pg(&url, &["--json", "audit"]).await);
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    assert_eq!(seqs, worker.seqs(0).await);
    let kinds: Vec<String> = events.iter().map(kind_of).collect();
    let resolved_at = kinds.iter().position(|k| k == "resolved").unwrap();
    let escalated_at = kinds.iter().position(|k| k == "escalated").unwrap();
    assert!(escalated_at < resolved_at, "{kinds:?}");
    assert_eq!(kinds.last().unwrap(), "committed", "{kinds:?}");
    let tail = json_lines(
        &pg(
            &url,
            &[
                "--json",
                "audit",
                "--from",
                &seqs[3].to_string(),
                "--limit",
                "2",
            ],
        )
        .await,
    );
    let tail: Vec<u64> = tail.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(tail, seqs[3..5]);
    assert!(pg(&url, &["audit"])
        .await
        .ok()
        .contains("resolved reissue: not on the bank statement"));
    assert_eq!(
        pg(&url, &["--json", "audit", "--from", "end"]).await.ok(),
        ""
    );

    // stats: the stream's counts, and the tables' size.
    let stats = pg(&url, &["--json", "stats"]).await.json();
    assert_eq!(stats["tools"]["send_wire"]["escalations"], 1);
    assert_eq!(stats["tools"]["send_wire"]["commits"], 2);
    assert!(stats["journal_bytes"].as_u64().unwrap() > 0);

    // prune: only with --keep, and with exactly that retention.
    let prune = pg(&url, &["prune"]).await;
    assert_eq!(prune.code, 2, "{prune:?}");
    assert!(prune.stderr.contains("--keep"), "{prune:?}");
    let kept = pg(&url, &["--json", "prune", "--keep", "7d"]).await.json();
    assert_eq!(kept["ops_removed"], 0, "{kept}");
    assert_eq!(worker.seqs(0).await, seqs);
    let pruned = pg(&url, &["--json", "prune", "--keep", "0s"]).await.json();
    assert_eq!(
        pruned["ops_removed"], 2,
        "both wires are finished: {pruned}"
    );
    assert_eq!(pruned["events_removed"], seqs.len() as u64, "{pruned}");
    assert!(worker.rt.operation(&worker.key).await.unwrap().is_none());
}

/// The follower's next line (of stdout or stderr); waits for it (bounded,
/// so that a follower that stopped or skipped fails the test instead of
/// hanging it).
async fn next_line<R: tokio::io::AsyncBufRead + Unpin>(lines: &mut tokio::io::Lines<R>) -> String {
    tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the follower printed its next line")
        .unwrap()
        .expect("the follower still runs")
}

/// The follower's next events, which must be those numbered `seqs`, in
/// that order.
async fn next_events<R: tokio::io::AsyncBufRead + Unpin>(
    lines: &mut tokio::io::Lines<R>,
    seqs: &[u64],
) -> Vec<serde_json::Value> {
    let mut events = Vec::new();
    for _ in seqs {
        events.push(next_event(lines).await);
    }
    let got: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(got, seqs, "the follower printed each event once, in order");
    events
}

/// The follower's next event.
async fn next_event<R: tokio::io::AsyncBufRead + Unpin>(
    lines: &mut tokio::io::Lines<R>,
) -> serde_json::Value {
    serde_json::from_str(&next_line(lines).await).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_follow_prints_what_a_worker_writes_while_it_runs() {
    let url = PgServer::shared().create_database().unwrap();
    let worker = PgWorker::start(&url).await;
    let mut child = idem_command(&["--postgres", &url, "--json", "audit", "--follow"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    // First what was there: all of it, in order, and the follower is still
    // running once it has printed it.
    let before = worker.seqs(0).await;
    let mut seen = Vec::new();
    for _ in &before {
        seen.push(next_event(&mut lines).await["seq"].as_u64().unwrap());
    }
    assert_eq!(seen, before);

    // Then what the worker writes after that: the resolution and the
    // reissued call, each once, in order.
    let after = worker
        .reissue_and_rerun("followed", *before.last().unwrap())
        .await;
    let events = next_events(&mut lines, &after).await;
    assert_eq!(kind_of(&events[0]), "resolved");
    assert_eq!(events[0]["kind"]["resolved"]["note"], "followed");
    assert_eq!(kind_of(events.last().unwrap()), "committed");
    let _ = child.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_follow_waits_out_a_database_restart_and_skips_nothing() {
    // A server of its own: the shared one serves the other tests.
    let server = PgServer::start().unwrap();
    let url = server.create_database().unwrap();
    let worker = PgWorker::start(&url).await;
    let mut child = idem_command(&["--postgres", &url, "--json", "audit", "--follow"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut errors = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let before = worker.seqs(0).await;
    for seq in &before {
        assert_eq!(next_event(&mut lines).await["seq"].as_u64(), Some(*seq));
    }

    // The database goes away while the follower waits for more: it says so
    // and keeps running.
    server.stop_immediate().unwrap();
    let said = next_line(&mut errors).await;
    assert!(said.starts_with("idem: cannot read the stream"), "{said}");
    server.start_again().unwrap();

    // The worker writes once the database is back (its pool drops the
    // connections the restart closed; reading once shows it is through).
    let mut tries = 0;
    while worker.rt.audit(0).await.is_err() {
        tries += 1;
        assert!(
            tries < 100,
            "the worker never reached the restarted database"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = worker
        .reissue_and_rerun("after the restart", *before.last().unwrap())
        .await;

    // The follower goes on from the next unread event: all of what came
    // after, once each, in order.
    let events = next_events(&mut lines, &after).await;
    assert_eq!(events[0]["kind"]["resolved"]["note"], "after the restart");
    let said = next_line(&mut errors).await;
    assert_eq!(
        said,
        format!(
            "idem: reading the stream again, from seq {}",
            before.last().unwrap() + 1
        )
    );
    let _ = child.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_without_the_journal_is_reported_and_left_untouched() {
    let server = PgServer::shared();
    // A database that exists but holds no journal (a mistyped name that
    // happens to exist, or a worker that never connected).
    let empty = server.create_database().unwrap();
    let db = PgServer::database_of(&empty);
    for args in [&["escalations"][..], &["--json", "stats"], &["audit"]] {
        let run = pg(&empty, args).await;
        assert_eq!(run.code, 3, "{args:?}: {run:?}");
        assert!(run.stderr.contains("no idem journal"), "{run:?}");
    }
    let err = pg(&empty, &["--json", "escalations"]).await.json_error(3);
    assert_eq!(err["error"], "unreachable");
    assert!(err["hint"].as_str().unwrap().contains("database name"));
    assert_eq!(
        server.idem_relations(db).unwrap(),
        0,
        "the CLI created tables"
    );

    // A database that does not exist: the server's own words.
    let missing = server.url("idem_no_such_database");
    let run = pg(&missing, &["escalations"]).await;
    assert_eq!(run.code, 3, "{run:?}");
    assert!(run.stderr.contains("cannot reach"), "{run:?}");
    assert!(run.stderr.contains("does not exist"), "{run:?}");
    assert_eq!(
        server
            .psql(
                "postgres",
                "SELECT count(*) FROM pg_database WHERE datname = 'idem_no_such_database'",
            )
            .unwrap()
            .trim(),
        "0"
    );

    // No server at all behind the socket directory.
    let nowhere = tempfile::tempdir().unwrap();
    let url = format!(
        "postgres://postgres@/idem?host={}",
        nowhere.path().display()
    );
    let run = pg(&url, &["escalations"]).await;
    assert_eq!(run.code, 3, "{run:?}");
    assert!(run.stderr.contains("cannot reach"), "{run:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_url_or_two_journals_are_usage_errors() {
    let url = PgServer::shared().create_database().unwrap();
    let malformed = pg(
        "postgres://idem@db.internal:port/idem",
        &["--json", "stats"],
    )
    .await
    .json_error(2);
    assert_eq!(malformed["error"], "usage");
    assert!(
        malformed["message"]
            .as_str()
            .unwrap()
            .contains("not a PostgreSQL connection string"),
        "{malformed}"
    );

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    for (args, env) in [
        (
            vec!["--postgres", &url, "--url", "http://127.0.0.1:9", "stats"],
            vec![],
        ),
        (vec!["--postgres", &url, "--journal", dir, "stats"], vec![]),
        (
            vec!["--postgres", &url, "stats"],
            vec![("IDEM_JOURNAL", dir)],
        ),
    ] {
        let run = idem_bare(&args, &env).await;
        assert_eq!(run.code, 2, "{args:?} {env:?}: {run:?}");
        assert!(run.stderr.contains("not both"), "{run:?}");
        if !env.is_empty() {
            assert!(run.stderr.contains("IDEM_JOURNAL is set"), "{run:?}");
        }
    }
    // Nothing was connected to: the database is still empty.
    let server = PgServer::shared();
    assert_eq!(
        server.idem_relations(PgServer::database_of(&url)).unwrap(),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_role_needs_the_rows_privileges_and_is_told_when_it_lacks_them() {
    let server = PgServer::shared();
    let url = server.create_database().unwrap();
    let worker = PgWorker::start(&url).await;
    let db = PgServer::database_of(&url);
    let as_role = |role: &str| url.replace("postgres://postgres@", &format!("postgres://{role}@"));

    // A role that may read and write the journal's rows but not create
    // tables (PostgreSQL 15 gives no CREATE on `public` to other roles):
    // everything works, the schema is left alone.
    let ops = format!("ops_{db}");
    server
        .psql(
            db,
            &format!(
                "CREATE ROLE {ops} LOGIN; \
                 GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {ops}; \
                 GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {ops}"
            ),
        )
        .unwrap();
    let listed = json_lines_of(&pg(&as_role(&ops), &["--json", "escalations"]).await);
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    let run = pg(
        &as_role(&ops),
        &[
            "resolve",
            worker.key.as_ref(),
            "--reissue",
            "--note",
            "by ops",
        ],
    )
    .await;
    run.ok();
    assert!(worker.rt.escalations().await.unwrap().is_empty());
    // ... but it cannot create the schema, and is told who can.
    let other = server.create_database().unwrap();
    let run = pg(
        &other.replace("postgres://postgres@", &format!("postgres://{ops}@")),
        &["migrate"],
    )
    .await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("permission denied"), "{run:?}");
    assert!(run.stderr.contains("database's owner"), "{run:?}");
    assert_eq!(
        server
            .idem_relations(PgServer::database_of(&other))
            .unwrap(),
        0
    );

    // A role with no privileges on the rows is told which it needs.
    let nobody = format!("nobody_{db}");
    server
        .psql(db, &format!("CREATE ROLE {nobody} LOGIN"))
        .unwrap();
    let run = pg(&as_role(&nobody), &["escalations"]).await;
    assert_eq!(run.code, 3, "{run:?}");
    assert!(run.stderr.contains("permission denied"), "{run:?}");
    assert!(
        run.stderr
            .contains("SELECT, INSERT, UPDATE and DELETE on the idem_* tables"),
        "{run:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_creates_the_tables_once_and_only_for_postgres() {
    let server = PgServer::shared();
    let url = server.create_database().unwrap();
    let db = PgServer::database_of(&url);
    let run = pg(&url, &["escalations"]).await;
    assert_eq!(run.code, 3, "{run:?}");
    assert!(
        run.stderr.contains("idem --postgres URL migrate"),
        "{run:?}"
    );

    let first = json_lines_of(&pg(&url, &["--json", "migrate"]).await);
    assert_eq!(first["created"], true, "{first}");
    assert_eq!(first["schema_version"], 1, "{first}");
    assert!(!first["location"].as_str().unwrap().contains("password"));
    let tables = server.idem_relations(db).unwrap();
    assert_ne!(tables, 0);
    let again = pg(&url, &["migrate"]).await;
    assert!(again.ok().contains("nothing to do"), "{again:?}");
    assert_eq!(server.idem_relations(db).unwrap(), tables);
    let listed = json_lines_of(&pg(&url, &["--json", "escalations"]).await);
    assert_eq!(listed, json!([]));
    // The journal it made is the one workers use.
    let worker = PgWorker::start(&url).await;
    assert_eq!(worker.rt.escalations().await.unwrap().len(), 1);

    // A schema newer than this build's is refused by both, untouched.
    server
        .psql(db, "UPDATE idem_schema SET version = 2")
        .unwrap();
    for args in [&["migrate"][..], &["escalations"][..]] {
        let run = pg(&url, args).await;
        assert_eq!(run.code, 1, "{args:?}: {run:?}");
        assert!(run.stderr.contains("format version 2"), "{args:?}: {run:?}");
    }
    assert_eq!(
        server
            .psql(db, "SELECT version FROM idem_schema")
            .unwrap()
            .trim(),
        "2"
    );

    // A sled journal has nothing to migrate.
    let dir = tempfile::tempdir().unwrap();
    let run = idem_bare(&["--journal", dir.path().to_str().unwrap(), "migrate"], &[]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("give --postgres URL"), "{run:?}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// The whole stdout of a `--json` run, as one JSON value.
fn json_lines_of(run: &Run) -> serde_json::Value {
    serde_json::from_str(run.ok()).unwrap_or_else(|e| panic!("{e}: {run:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sagas_of_a_shared_postgres_journal_are_listed_by_the_runtime_and_the_cli() {
    use idem::SagaState;
    let url = PgServer::shared().create_database().unwrap();
    let rt = Runtime::builder()
        .postgres(&url)
        .worker_id("worker-1")
        .connect()
        .await
        .unwrap();
    // Compensated; escalated for good; the same saga in a scope, running;
    // escalated for now (its cancellation awaits a person's approval).
    let ctx = rt.run("trip-1");
    sagas::trip(&ctx, 1, true, Some("the flight was cancelled"))
        .await
        .unwrap_err();
    sagas::trip(&ctx.scope("rebooked"), 5, true, None)
        .await
        .unwrap();
    sagas::trip(&rt.run("trip-2"), 2, false, Some("no visa"))
        .await
        .unwrap_err();
    let for_now = sagas::suite(&rt.run("trip-4"), 4).await.unwrap_err();
    assert!(
        matches!(for_now, ToolError::Escalated { .. }),
        "{for_now:?}"
    );

    let list = rt.sagas().await.unwrap();
    let of = |run: &str, scope: &[&str]| {
        list.iter()
            .find(|s| s.root_run == run && s.scope == scope)
            .unwrap_or_else(|| panic!("no saga of {run} {scope:?} in {list:#?}"))
    };
    assert_eq!(list.len(), 4, "{list:#?}");
    assert_eq!(of("trip-1", &[]).state, SagaState::Compensated);
    assert_eq!(of("trip-1", &["rebooked"]).state, SagaState::Running);
    let parked = of("trip-2", &[]);
    assert_eq!(
        (parked.state, parked.for_good),
        (SagaState::Escalated, true)
    );
    let waiting = of("trip-4", &[]);
    assert_eq!(
        (waiting.state, waiting.for_good),
        (SagaState::Escalated, false),
        "{waiting:#?}"
    );
    assert!(
        waiting
            .escalation
            .as_deref()
            .unwrap()
            .contains("awaits a person's approval"),
        "{waiting:#?}"
    );

    // The CLI, as one more client of the database: the same list.
    let listed = pg(&url, &["--json", "sagas"]).await.json();
    assert_eq!(listed, serde_json::to_value(&list).unwrap());
    let table = pg(&url, &["sagas"]).await;
    let text = table.ok();
    assert!(
        text.starts_with("4 sagas (oldest start first): 2 escalated, 0 compensating"),
        "{text}"
    );
    assert!(text.contains("ESCALATED*"), "{text}");
    assert!(
        text.contains("saga suite (escalated for now: a compensation cannot be settled yet"),
        "{text}"
    );
}
