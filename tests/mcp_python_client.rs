//! The demo's tools over MCP, driven by a client nobody here wrote: the
//! official Python `mcp` package from PyPI (tests/mcp_client.py) runs
//! `examples/mcp_server.rs` as its stdio server. This test starts the fake
//! providers (they must outlive the server, which is killed), makes the bank
//! time out after applying the first wire, runs the script, then checks its
//! report, the providers' ledgers and the journal's audit log.
//!
//! Python's `mcp` lives in a virtual environment under the target directory,
//! created here when missing (`python3 -m venv`, `pip install`: PyPI must be
//! reachable once); `IDEM_MCP_PYTHON` names another interpreter that has it.
//! The test fails when neither works: it never skips.

#[path = "../examples/agent/shop.rs"]
mod shop;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use idem::{EventKind, Runtime};
use idem_testkit::{Fault, Providers};
use serde_json::Value;

/// target/debug (or wherever this test binary was built).
fn build_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // target/debug/deps/mcp_python_client-HASH
    exe.parent()
        .and_then(Path::parent)
        .expect("the test binary is in target/<profile>/deps")
        .to_path_buf()
}

/// A Python with the `mcp` package: `IDEM_MCP_PYTHON`, else the venv under
/// the target directory, created when missing.
fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("IDEM_MCP_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = build_dir()
        .parent()
        .expect("target directory")
        .join("mcp-venv");
    let python = venv.join("bin").join("python");
    let has_mcp = |python: &Path| {
        Command::new(python)
            .args(["-c", "import mcp"])
            .status()
            .is_ok_and(|s| s.success())
    };
    if has_mcp(&python) {
        return python;
    }
    let run = |cmd: &mut Command, what: &str| {
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("{what}: cannot run it: {e}"));
        assert!(
            out.status.success(),
            "{what} failed ({}):\n{}\n{}\nThe Python MCP client is required: .ci/run installs \
             it, or set IDEM_MCP_PYTHON to a python that has `mcp` (pip install 'mcp>=2,<3').",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(
        Command::new("python3").arg("-m").arg("venv").arg(&venv),
        "python3 -m venv",
    );
    run(
        Command::new(&python).args(["-m", "pip", "install", "-q", "mcp>=2,<3"]),
        "pip install mcp",
    );
    assert!(has_mcp(&python), "`import mcp` fails after installing it");
    python
}

fn server_binary() -> PathBuf {
    let path = build_dir().join("examples").join("mcp_server");
    assert!(
        path.exists(),
        "{} is missing: it is built by `cargo test --features mcp` (or `cargo build --example \
         mcp_server --features mcp`)",
        path.display()
    );
    path
}

fn field<'a>(report: &'a Value, path: &[&str]) -> &'a Value {
    path.iter().fold(report, |v, k| &v[*k])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_mcp_client_drives_the_demo_tools_exactly_once() {
    let python = python();
    let server = server_binary();
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal");
    let marker = dir.path().join("killed");

    let providers = Providers::start().await.unwrap();
    // The bank applies the first wire and then never answers: an unknown
    // outcome, which an at_most_once tool escalates.
    providers.wire().faults().push(Fault::timeout_after_apply());

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_client.py");
    let mut command = tokio::process::Command::new(&python);
    command
        .arg(&script)
        .arg(&server)
        .arg(&journal)
        .arg(&marker)
        .envs(providers.addrs().to_env())
        // The server logs everything to stderr while it serves on stdio:
        // the protocol on stdout must not notice.
        .env("IDEM_MCP_LOG", "trace")
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(300), command.output())
        .await
        .expect("the Python client finished within 5 minutes")
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "mcp_client.py failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let report: Value = serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("no report ({e}):\n{stdout}\n{stderr}"));
    // The log went to stderr: the engine's audit events and the MCP
    // server's own, from both server processes.
    for line in ["idem::audit", "idem mcp call"] {
        assert!(
            stderr.contains(line),
            "no {line:?} in the server's stderr:\n{stderr}"
        );
    }
    println!("{report:#}");
    let at = |path: &[&str]| field(&report, path).clone();

    // tools/list: the five tools, hints from their class.
    let tools = report["tools"].as_object().expect("tools");
    let names: Vec<&str> = tools.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "charge",
            "lookup_order",
            "open_ticket",
            "refund_wire",
            "send_email"
        ]
    );
    let hints = |tool: &str| {
        let t = &tools[tool];
        (
            t["read_only"].as_bool(),
            t["destructive"].as_bool(),
            t["idempotent"].as_bool(),
        )
    };
    assert_eq!(hints("lookup_order"), (Some(true), Some(false), Some(true)));
    assert_eq!(hints("charge"), (Some(false), Some(true), Some(true)));
    assert_eq!(hints("send_email"), (Some(false), Some(false), Some(true)));
    assert_eq!(hints("open_ticket"), (Some(false), Some(false), Some(true)));
    assert_eq!(hints("refund_wire"), (Some(false), Some(true), Some(true)));
    assert_eq!(
        tools["send_email"]["required"],
        serde_json::json!(["to", "template", "order_id", "body"])
    );
    assert!(tools.values().all(|t| t["has_description"] == true));

    // No run identity: refused, saying how to send one.
    assert_eq!(at(&["no_identity", "is_error"]), true);
    assert_eq!(
        at(&["no_identity", "structured", "error"]),
        "no_run_identity"
    );
    let how = at(&["no_identity", "text"]);
    assert!(how.as_str().unwrap().contains("{\"idem/run\": "), "{how}");
    // An argument of the wrong type: named, with serde's words.
    assert_eq!(
        at(&["bad_arguments", "structured", "error"]),
        "invalid_arguments"
    );
    assert_eq!(at(&["bad_arguments", "structured", "argument"]), "order_id");

    // Repeated calls are replayed.
    for (first, again) in [("charge", "charge_again"), ("ticket", "ticket_again")] {
        assert_eq!(at(&[first, "is_error"]), false, "{report}");
        assert_eq!(at(&[first, "structured"]), at(&[again, "structured"]));
    }
    assert_eq!(
        at(&["charge", "structured"]),
        at(&["charge_after_restart", "structured"])
    );

    // The wire's unknown outcome is escalated, and stays so.
    for call in ["wire", "wire_again"] {
        assert_eq!(at(&[call, "is_error"]), true, "{report}");
        assert_eq!(at(&[call, "structured", "error"]), "escalated", "{report}");
        let advice = at(&[call, "structured", "advice"]);
        assert!(advice.as_str().unwrap().contains("operator"), "{advice}");
    }

    // The server died with the email landed and not committed; after the
    // restart the same call returns the landed email.
    assert!(
        report["email_before_crash"].get("raised").is_some(),
        "the first email call should have lost its server: {report}"
    );
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "send_email");
    assert_eq!(at(&["email_after_restart", "is_error"]), false, "{report}");
    assert_eq!(
        at(&["email_after_restart", "structured"]),
        at(&["email_again", "structured"])
    );

    // One effect per tool at the providers, by their own ledgers.
    for tool in shop::EFFECT_TOOLS {
        assert_eq!(shop::effects(&providers, tool, 4711), 1, "{tool}: {report}");
    }
    assert!(providers.duplicates().is_empty());

    // And the journal says why: the email was recovered by verify.
    let rt = Runtime::open(&journal).unwrap();
    let events = rt.audit(0).await.unwrap();
    let of = |tool: &'static str| events.iter().filter(move |e| e.tool == tool);
    assert!(of("send_email").any(|e| matches!(e.kind, EventKind::Recovered { .. })));
    assert!(of("send_email")
        .any(|e| matches!(&e.kind, EventKind::Verified { verdict } if verdict == "landed")));
    assert!(
        of("charge")
            .filter(|e| e.kind == EventKind::DedupeHit)
            .count()
            >= 2
    );
    assert_eq!(rt.escalations().await.unwrap().len(), 1);
}
