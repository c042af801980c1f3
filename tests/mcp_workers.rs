//! The newcomer's scenario, from outside: two worker processes of
//! examples/mcp_workers.rs (three HTTP tools served over MCP, one shared
//! PostgreSQL journal), driven by rmcp's own client over streamable HTTP;
//! a refund wire whose answer is lost parks for a person, who lists it
//! across the workers with `idem --postgres` and settles it with `idem
//! --worker` while both workers keep serving. The providers' ledgers (the
//! fake payments, email and bank of `idem-testkit`, in this process) say
//! that every effect happened once.
//!
//! Run by `.ci/run`'s feature step: `cargo build -p idem-cli --bin idem`,
//! then `cargo test --features mcp,http,postgres,admin --test mcp_workers`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use idem::mcp::rmcp::model::{CallToolRequestParams, CallToolResult, RequestMetaObject};
use idem::mcp::rmcp::service::RunningService;
use idem::mcp::rmcp::transport::StreamableHttpClientTransport;
use idem::mcp::rmcp::{RoleClient, ServiceExt};
use idem_testkit::pg::PgServer;
use idem_testkit::{Fault, Providers};
use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;

/// target/debug (or wherever this test binary was built).
fn build_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent()
        .and_then(Path::parent)
        .expect("the test binary is in target/<profile>/deps")
        .to_path_buf()
}

fn built(path: PathBuf, how: &str) -> PathBuf {
    assert!(path.exists(), "{} is missing: {how}", path.display());
    path
}

/// One worker process, killed when dropped.
struct Worker {
    _child: tokio::process::Child,
    client: RunningService<RoleClient, ()>,
}

impl Worker {
    async fn start(id: &str, env: &[(String, String)]) -> Worker {
        let exe = built(
            build_dir().join("examples").join("mcp_workers"),
            "cargo test --features mcp,http,postgres,admin builds it",
        );
        let mut child = tokio::process::Command::new(exe)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("WORKER_ID", id)
            .env("MCP_ADDR", "127.0.0.1:0")
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the worker starts");
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("the worker says where it serves")
            .unwrap()
            .unwrap_or_else(|| panic!("worker {id} exited before serving"));
        let url = line.strip_prefix("serving ").expect(&line).to_string();
        let client = ().serve(StreamableHttpClientTransport::from_uri(url)).await.unwrap();
        Worker {
            _child: child,
            client,
        }
    }

    async fn call(&self, tool: &str, args: Value) -> CallToolResult {
        let mut params = CallToolRequestParams::new(tool.to_string())
            .with_arguments(args.as_object().cloned().unwrap());
        let meta = json!({ "idem/run": "order-4711" });
        params.meta = Some(RequestMetaObject::from(meta.as_object().cloned().unwrap()));
        self.client.call_tool(params).await.unwrap()
    }
}

fn replayed(r: &CallToolResult) -> bool {
    let meta = serde_json::to_value(r).unwrap()["_meta"].clone();
    meta["idem/replayed"]
        .as_bool()
        .unwrap_or_else(|| panic!("no idem/replayed in {meta}"))
}

/// `idem ARGS` (the CLI binary), with the workers directory.
async fn idem(workers: &Path, args: &[&str]) -> (i32, String, String) {
    let exe = built(
        build_dir().join("idem"),
        "build it first with `cargo build -p idem-cli --bin idem` (.ci/run does)",
    );
    let out = tokio::process::Command::new(exe)
        .args(args)
        .env("IDEM_WORKERS_DIR", workers)
        .env_remove("IDEM_ADMIN_TOKEN")
        .env_remove("IDEM_JOURNAL")
        .env_remove("IDEM_ADMIN_URL")
        .env_remove("IDEM_WORKER")
        .output()
        .await
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_serve_http_tools_over_mcp_and_an_operator_settles_a_wire_from_the_cli() {
    let tmp = tempfile::tempdir().unwrap();
    let workers_dir = tmp.path().join("workers");
    let url = PgServer::shared().create_database().unwrap();
    let providers = Providers::start().await.expect("providers");
    let addrs = providers.addrs();
    let env = vec![
        ("DATABASE_URL".to_string(), url.clone()),
        (
            "PAYMENTS_URL".to_string(),
            format!("http://{}", addrs.payments),
        ),
        ("EMAIL_URL".to_string(), format!("http://{}", addrs.email)),
        ("BANK_URL".to_string(), format!("http://{}", addrs.wire)),
        (
            "IDEM_WORKERS_DIR".to_string(),
            workers_dir.display().to_string(),
        ),
    ];
    let w1 = Worker::start("w1", &env).await;
    let w2 = Worker::start("w2", &env).await;

    // The charge, through w1 and again through w2: charged once, the second
    // answer replayed from the shared journal (and the agent is told so).
    let charge = json!({ "order_id": 4711, "customer": "cus_ann", "cents": 4999 });
    let first = w1.call("Shop.charge", charge.clone()).await;
    assert_ne!(first.is_error, Some(true), "{first:?}");
    assert!(!replayed(&first));
    let again = w2.call("Shop.charge", charge).await;
    assert!(replayed(&again), "{again:?}");
    assert_eq!(again.structured_content, first.structured_content);
    assert_eq!(providers.payments().ledger().len(), 1);

    // The receipt: its answer is lost once; verify finds it sent, so the
    // retry does not send it again.
    providers
        .email()
        .faults()
        .push(Fault::disconnect_after_apply());
    let receipt = json!({ "to": "ann@example.com", "order_id": 4711 });
    let sent = w2.call("Shop.send_receipt", receipt).await;
    assert_ne!(sent.is_error, Some(true), "{sent:?}");
    assert_eq!(providers.email().ledger().len(), 1);

    // The refund: the bank applies it and the connection breaks. Nobody
    // knows whether it went out, so it parks for a person.
    providers
        .wire()
        .faults()
        .push(Fault::disconnect_after_apply());
    let refund = json!({ "order_id": 4711, "iban": "DE89370400440532013000", "cents": 4999 });
    let parked = w1.call("Shop.refund", refund.clone()).await;
    assert_eq!(parked.is_error, Some(true), "{parked:?}");
    let still = w2.call("Shop.refund", refund.clone()).await;
    assert_eq!(still.is_error, Some(true), "{still:?}");
    assert_eq!(providers.wire().ledger().len(), 1, "never sent twice");

    // The operator, while both workers run: the escalation across workers,
    // then the bank statement's receipt settled through a worker (which
    // checks it against the tool's result type).
    let (code, out, err) = idem(&workers_dir, &["--postgres", &url, "--json", "escalations"]).await;
    assert_eq!(code, 0, "{err}");
    let list: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list[0]["tool"], "Shop::refund");
    let key = list[0]["key"].as_str().unwrap().to_string();
    let (code, out, err) = idem(&workers_dir, &["--json", "workers"]).await;
    assert_eq!(code, 0, "{err}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    let states: Vec<(&str, &str)> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|w| (w["worker"].as_str().unwrap(), w["state"].as_str().unwrap()))
        .collect();
    assert_eq!(states, [("w1", "running"), ("w2", "running")]);
    let statement = serde_json::to_string(&providers.wire().ledger()[0]).unwrap();
    let (code, out, err) = idem(
        &workers_dir,
        &[
            "--worker",
            "w2",
            "resolve",
            &key,
            "--landed",
            &statement,
            "--note",
            "on the bank statement of Dec 2",
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");

    // The agent calls again (through the other worker): the settled
    // receipt, replayed; the bank saw one wire.
    let settled = w1.call("Shop.refund", refund).await;
    assert_ne!(settled.is_error, Some(true), "{settled:?}");
    assert!(replayed(&settled));
    assert_eq!(
        settled.structured_content.unwrap()["reference"],
        "refund-4711"
    );
    assert_eq!(providers.wire().ledger().len(), 1);
    assert!(
        providers.duplicates().is_empty(),
        "{:?}",
        providers.duplicates()
    );
}
