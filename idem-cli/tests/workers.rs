//! A PostgreSQL worker serving the admin API without options keeps its
//! token and address in its own 0700 directory of the workers directory,
//! and the `idem` binary finds it there by its id (`idem workers`, `idem
//! --worker ID`): the way an escalation of a tool only the workers define
//! is settled with `--landed` while they run.
//!
//! One test in this binary: it points `IDEM_WORKERS_DIR` at a temporary
//! directory for the whole process before anything else runs.

mod support;

use std::os::unix::fs::PermissionsExt;

use idem::Runtime;
use idem_testkit::pg::PgServer;
use idem_testkit::{Providers, WireClient};
use support::{idem_bare, Bank, ACCOUNT};

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_worker_is_found_by_its_id_and_settles_a_landed_resolution() {
    let tmp = tempfile::tempdir().unwrap();
    let workers = tmp.path().join("state/workers");
    // SAFETY (edition 2021: a safe call): the only test of this binary,
    // before any thread of its own reads the environment.
    std::env::set_var("IDEM_WORKERS_DIR", &workers);
    let env = [("IDEM_WORKERS_DIR", workers.to_str().unwrap())];

    let url = PgServer::shared().create_database().unwrap();
    let providers = Providers::start().await.expect("providers");
    let bank = Bank {
        client: WireClient::new(providers.addrs().wire),
    };
    let rt = Runtime::builder()
        .postgres(&url)
        .worker_id("pod-7")
        .admin("127.0.0.1:0")
        .connect()
        .await
        .expect("a PostgreSQL worker serves the admin API without AdminOptions::dir");
    let dir = workers.join("pod-7");
    assert_eq!(mode(&workers), 0o700);
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join("idem-admin-token")), 0o600);
    assert!(dir.join("idem-admin-addr").exists());
    let key = support::park_a_wire(&rt, &bank, &providers)
        .await
        .to_string();

    // `idem workers` lists it, running, at the address it serves.
    let listed = idem_bare(&["--json", "workers"], &env).await.json();
    assert_eq!(listed[0]["worker"], "pod-7", "{listed}");
    assert_eq!(listed[0]["state"], "running", "{listed}");
    assert_eq!(listed[0]["url"], rt.admin_url().unwrap(), "{listed}");
    let table = idem_bare(&["workers"], &env).await;
    assert!(table.ok().contains("pod-7"), "{table:?}");

    // --postgres cannot check a result: its message says where to go.
    let receipt = serde_json::to_string(&providers.wire().ledger()[1]).unwrap();
    let landed = [
        "resolve",
        &key,
        "--landed",
        &receipt,
        "--note",
        "bank statement",
    ];
    let mut refused = vec!["--postgres", &url];
    refused.extend_from_slice(&landed);
    let refused = idem_bare(&refused, &env).await;
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(refused.stderr.contains("--worker ID"), "{refused:?}");

    // --worker pod-7: the worker checks the result and settles it.
    let mut through = vec!["--worker", "pod-7"];
    through.extend_from_slice(&landed);
    let resolved = idem_bare(&through, &env).await;
    assert!(resolved.ok().contains("landed"), "{resolved:?}");
    let ctx = rt.run("refunds");
    let replayed = bank
        .send_wire(&ctx, 2, ACCOUNT.into(), 1999)
        .await
        .expect("the settled wire replays");
    assert_eq!(replayed, providers.wire().ledger()[1]);
    assert_eq!(providers.wire().ledger().len(), 2, "nothing was sent again");
    let shown = idem_bare(&["--worker", "pod-7", "--json", "show", &key], &env)
        .await
        .json();
    // Settled by the worker itself: its audit event names it.
    let resolved = shown["history"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"].get("resolved").is_some())
        .unwrap_or_else(|| panic!("no resolution in {shown}"));
    assert_eq!(resolved["kind"]["resolved"]["resolution"], "landed");
    assert!(
        resolved["worker"].as_str().unwrap().starts_with("pod-7#"),
        "{resolved}"
    );

    // So does a journal given as is (no directory of its own).
    let sled = Runtime::builder()
        .journal(std::sync::Arc::new(
            idem::SledJournal::open(tmp.path().join("sled")).unwrap(),
        ))
        .worker_id("sled-1")
        .admin("127.0.0.1:0")
        .open()
        .expect("a journal without a directory serves the admin API");
    assert!(workers.join("sled-1").join("idem-admin-addr").exists());
    drop(sled);
    assert!(!workers.join("sled-1").join("idem-admin-addr").exists());

    // An id nobody serves, and a worker that stopped, are told apart.
    let nobody = idem_bare(&["--worker", "pod-9", "escalations"], &env).await;
    assert_eq!(nobody.code, 3, "{nobody:?}");
    assert!(nobody.stderr.contains("no worker \"pod-9\""), "{nobody:?}");
    drop(ctx);
    drop(rt);
    let stopped = idem_bare(&["--worker", "pod-7", "escalations"], &env).await;
    assert_eq!(stopped.code, 3, "{stopped:?}");
    assert!(stopped.stderr.contains("is not running"), "{stopped:?}");
    let listed = idem_bare(&["--json", "workers"], &env).await.json();
    assert_eq!(listed[0]["state"], "stopped", "{listed}");

    // A worker directory others can enter is not trusted with the token.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let open = idem_bare(&["--worker", "pod-7", "escalations"], &env).await;
    assert_eq!(open.code, 3, "{open:?}");
    assert!(open.stderr.contains("mode 755"), "{open:?}");
}
