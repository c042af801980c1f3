//! What the operator tests share: a bank whose wires are `at_most_once`, a
//! worker (this test process) that parks one on an escalation and serves
//! the admin API, and the `idem` binary.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use idem::admin::AdminOptions;
use idem::{tool, Ctx, EventKind, IdemKey, Runtime, ToolError};
use idem_testkit::{Fault, ProviderError, Providers, WireClient, WireReceipt, WireRequest};

/// The token the tests' workers serve with (the CLI reads it from the
/// token file, or from IDEM_ADMIN_TOKEN).
pub const TOKEN: &str = "test-token-0123456789abcdef";

/// A bank client: a wire can neither be deduplicated nor looked up.
#[derive(Clone)]
pub struct Bank {
    pub client: WireClient,
}

impl Bank {
    /// Wires `amount` to `to_account` for `order_id`, at most once.
    #[tool(
        class = "at_most_once",
        name = "send_wire",
        key = "order_id",
        timeout = "5s"
    )]
    pub async fn send_wire(
        &self,
        ctx: &Ctx,
        order_id: u64,
        to_account: String,
        amount: u64,
    ) -> Result<WireReceipt, ProviderError> {
        let _ = ctx;
        self.client
            .send(&WireRequest {
                to_account,
                amount,
                reference: format!("refund-{order_id}"),
            })
            .await
    }
}

/// A worker with the admin API, its bank, and one wire parked on an
/// escalation (order 2), after one that went through (order 1: the tool's
/// example result).
pub struct Worker {
    pub rt: Runtime,
    pub providers: Providers,
    pub bank: Bank,
    pub dir: PathBuf,
    /// The parked wire's key.
    pub key: IdemKey,
}

pub const ACCOUNT: &str = "DE89370400440532013000";

/// Run "refunds" on `rt`: order 1's wire goes through, order 2's is cut
/// off after the bank applied it, so the at_most_once wire is escalated.
/// Returns order 2's key.
pub async fn park_a_wire(rt: &Runtime, bank: &Bank, providers: &Providers) -> IdemKey {
    let ctx = rt.run("refunds");
    bank.send_wire(&ctx, 1, ACCOUNT.into(), 500)
        .await
        .expect("order 1 goes through");
    providers
        .wire()
        .faults()
        .push(Fault::disconnect_after_apply());
    match bank.send_wire(&ctx, 2, ACCOUNT.into(), 1999).await {
        Err(ToolError::Escalated { key, .. }) => key,
        other => panic!("expected an escalation, got {other:?}"),
    }
}

impl Worker {
    /// Starts providers, opens `dir` with the admin API (token file
    /// written) and parks order 2's wire.
    pub async fn start(dir: &Path) -> Worker {
        let providers = Providers::start().await.expect("providers");
        let bank = Bank {
            client: WireClient::new(providers.addrs().wire),
        };
        let rt = open_with_admin(dir);
        let key = park_a_wire(&rt, &bank, &providers).await;
        Worker {
            rt,
            providers,
            bank,
            dir: dir.to_path_buf(),
            key,
        }
    }

    /// The wire the bank really made for order 2 (its ledger).
    pub fn real_receipt(&self) -> WireReceipt {
        self.providers
            .wire()
            .ledger()
            .into_iter()
            .find(|w| w.reference == "refund-2")
            .expect("the bank made the wire")
    }

    /// How many durable audit events there are.
    pub async fn events(&self) -> usize {
        self.rt.audit(0).await.unwrap().len()
    }

    /// Whether any operator event was written.
    pub async fn operator_events(&self) -> usize {
        self.rt
            .audit(0)
            .await
            .unwrap()
            .iter()
            .filter(|e| {
                matches!(
                    e.kind,
                    EventKind::Resolved { .. } | EventKind::Amended { .. }
                )
            })
            .count()
    }

    /// The worker's next call of order 2.
    pub async fn call_again(&self) -> Result<WireReceipt, ToolError<ProviderError>> {
        let ctx = self.rt.run("refunds");
        self.bank.send_wire(&ctx, 2, ACCOUNT.into(), 1999).await
    }
}

/// Opens `dir` with the admin API on a free loopback port, with the token
/// file (generated).
pub fn open_with_admin(dir: &Path) -> Runtime {
    Runtime::builder()
        .path(dir)
        .admin_with(AdminOptions::new("127.0.0.1:0"))
        .open()
        .expect("open with the admin API")
}

/// Opens with a given token (no token file).
pub fn open_with_token(dir: &Path, token: &str) -> Runtime {
    Runtime::builder()
        .path(dir)
        .admin_with(AdminOptions::new("127.0.0.1:0").token(token))
        .open()
        .expect("open with the admin API")
}

/// `idem ARGS` with `--journal dir`, run to its end without blocking the
/// test's runtime (which serves the admin API).
pub async fn idem(dir: &Path, args: &[&str]) -> Run {
    idem_env(dir, args, &[]).await
}

/// [`idem`] with extra environment.
pub async fn idem_env(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut all = vec!["--journal", dir.to_str().expect("a UTF-8 path")];
    all.extend_from_slice(args);
    idem_bare(&all, env).await
}

/// `idem ARGS` exactly as given (no `--journal`), with extra environment
/// and none of the variables that name a journal.
pub async fn idem_bare(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut command = idem_command(args);
    command.stdin(std::process::Stdio::null());
    for (k, v) in env {
        command.env(k, v);
    }
    let output = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("idem finished")
        .expect("idem ran");
    Run::from(output)
}

/// The `idem` binary with `args`, without the environment variables that
/// name a journal or a token; killed when dropped.
pub fn idem_command(args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_idem"));
    command
        .args(args)
        .env_remove("IDEM_ADMIN_TOKEN")
        .env_remove("IDEM_JOURNAL")
        .env_remove("IDEM_ADMIN_URL")
        .env_remove("IDEM_WORKER")
        .kill_on_drop(true);
    command
}

/// What a run of `idem` did.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(o: Output) -> Run {
        Run {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

impl Run {
    /// Asserts exit code 0 and parses stdout as JSON.
    pub fn json(&self) -> serde_json::Value {
        assert_eq!(self.code, 0, "{self:?}");
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }

    /// Asserts exit code `code` and parses stderr as the JSON error.
    pub fn json_error(&self, code: i32) -> serde_json::Value {
        assert_eq!(self.code, code, "{self:?}");
        serde_json::from_str(self.stderr.trim()).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }

    /// Asserts exit code 0 and returns stdout.
    pub fn ok(&self) -> &str {
        assert_eq!(self.code, 0, "{self:?}");
        &self.stdout
    }
}
