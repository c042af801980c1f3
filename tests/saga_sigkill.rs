//! A saga survives real process death in the middle of compensating: the
//! worker (this test binary, re-executed to run only `saga_worker_entry`)
//! SIGKILLs itself right after a compensation's effect reached its
//! provider and before idem wrote its COMMIT; the next worker resumes the
//! rollback, and the providers' ledger ends with one charge, one booking,
//! one refund and one cancellation.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use idem::{tool, Classify, Ctx, Failure, Resolution, Runtime, ToolError};
use serde::{Deserialize, Serialize};

const DIR_ENV: &str = "IDEM_SAGA_WORKER_DIR";
const KILL_ENV: &str = "IDEM_SAGA_KILL";

/// Worker exit codes.
const COMPENSATED: i32 = 0;
const FAILED: i32 = 1;
const ESCALATED: i32 = 3;

#[derive(Debug, Clone, PartialEq)]
struct Declined(String);

impl Classify for Declined {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

/// The providers' ledger: one line per effect, `tool key`, durable before
/// the provider answers.
fn ledger() -> PathBuf {
    PathBuf::from(std::env::var_os(DIR_ENV).expect("the worker's directory")).join("ledger")
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Applies an effect at a provider. `dedupe`: the provider keeps keys (a
/// second request with one replays the first answer and does nothing).
/// Then, when this worker was told to die after this tool's effect, it
/// dies: SIGKILL, no destructor, no flush.
fn effect(tool: &str, key: &str, dedupe: bool) {
    let path = ledger();
    let line = format!("{tool} {key}");
    if !(dedupe && lines(&path).contains(&line)) {
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .expect("open the ledger");
        writeln!(f, "{line}").expect("write the ledger");
        f.sync_all().expect("sync the ledger");
    }
    if std::env::var(KILL_ENV).as_deref() == Ok(tool) {
        let pid = std::process::id().to_string();
        let _ = Command::new("kill").args(["-KILL", &pid]).status();
        std::process::abort();
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Charge {
    id: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Booking {
    seat: String,
}

#[tool(class = "provider", key = "order", compensate = refund)]
async fn charge(ctx: &Ctx, order: u64) -> Result<Charge, Declined> {
    effect("charge", ctx.idempotency_key().as_str(), true);
    Ok(Charge {
        id: format!("ch_{order}"),
    })
}

#[tool(class = "provider", key = "charge.id")]
async fn refund(ctx: &Ctx, charge: &Charge, order: &u64) -> Result<(), Declined> {
    let _ = (charge, order);
    effect("refund", ctx.idempotency_key().as_str(), true);
    Ok(())
}

#[tool(class = "at_most_once", key = "order", compensate = cancel)]
async fn book(ctx: &Ctx, order: u64) -> Result<Booking, Declined> {
    effect("book", ctx.idempotency_key().as_str(), false);
    Ok(Booking {
        seat: format!("seat-{order}"),
    })
}

#[tool(class = "at_most_once", key = "booking.seat")]
async fn cancel(ctx: &Ctx, booking: &Booking) -> Result<(), Declined> {
    effect("cancel", ctx.idempotency_key().as_str(), false);
    Ok(())
}

#[tool(class = "provider", key = "order")]
async fn ship(ctx: &Ctx, order: u64) -> Result<(), Declined> {
    let _ = (ctx, order);
    Err(Declined("no courier for this address".into()))
}

async fn order(ctx: &Ctx) -> Result<(), ToolError<Declined>> {
    ctx.saga("order", |s| async move {
        charge(s.ctx(), 7).await?;
        book(s.ctx(), 7).await?;
        ship(s.ctx(), 7).await?;
        Ok(())
    })
    .await
}

/// The worker side: runs the saga once when the environment says so,
/// passes trivially otherwise.
#[test]
fn saga_worker_entry() {
    let Some(dir) = std::env::var_os(DIR_ENV) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio");
    let code = rt.block_on(async {
        let journal = Runtime::open(Path::new(&dir).join("journal")).expect("open the journal");
        let ctx = journal.run("order-7");
        let code = match order(&ctx).await {
            Err(ToolError::Compensated { .. }) => COMPENSATED,
            Err(ToolError::Escalated { reason, .. }) => {
                eprintln!("escalated: {reason}");
                ESCALATED
            }
            other => {
                eprintln!("unexpected: {other:?}");
                FAILED
            }
        };
        journal.sync().await.expect("sync");
        code
    });
    std::process::exit(code);
}

/// How a worker ended: its exit code, or the signal that killed it.
fn worker(dir: &Path, kill: Option<&str>) -> Result<i32, i32> {
    let mut command = Command::new(std::env::current_exe().expect("test binary path"));
    command
        .args([
            "--exact",
            "saga_worker_entry",
            "--nocapture",
            "--test-threads",
            "1",
            "-q",
        ])
        .env(DIR_ENV, dir)
        .env_remove(KILL_ENV);
    if let Some(tool) = kill {
        command.env(KILL_ENV, tool);
    }
    let status = command.status().expect("run a worker");
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => Ok(code),
        (None, Some(signal)) => Err(signal),
        (None, None) => Err(-1),
    }
}

fn count(dir: &Path, tool: &str) -> usize {
    lines(&dir.join("ledger"))
        .iter()
        .filter(|l| l.starts_with(&format!("{tool} ")))
        .count()
}

/// An operator settles the saga's escalated compensation from the ledger:
/// landed if its effect is there, not landed otherwise.
fn settle(dir: &Path) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let journal = Runtime::open(dir.join("journal")).unwrap();
        let open = journal.escalations().await.unwrap();
        assert_eq!(open.len(), 1, "{open:?}");
        let key = &open[0].key;
        let landed = lines(&dir.join("ledger"))
            .iter()
            .any(|l| l.ends_with(&format!(" {key}")));
        let resolution = if landed {
            Resolution::Landed(None)
        } else {
            Resolution::Reissue
        };
        journal
            .resolve(key, resolution, "checked the ledger")
            .await
            .unwrap();
        journal.sync().await.unwrap();
    });
}

#[test]
fn a_worker_killed_after_a_refund_landed_is_resumed_with_one_refund() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(
        worker(dir.path(), Some("refund")),
        Err(9),
        "killed by SIGKILL"
    );
    assert_eq!(count(dir.path(), "refund"), 1);
    assert_eq!(worker(dir.path(), None), Ok(COMPENSATED));
    assert_eq!(
        worker(dir.path(), None),
        Ok(COMPENSATED),
        "ended: the same end"
    );
    let effects: Vec<usize> = ["charge", "book", "cancel", "refund"]
        .iter()
        .map(|t| count(dir.path(), t))
        .collect();
    assert_eq!(
        effects,
        [1, 1, 1, 1],
        "{:?}",
        lines(&dir.path().join("ledger"))
    );
}

#[test]
fn a_worker_killed_after_a_cancellation_landed_escalates_once_and_is_settled_without_a_second() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(
        worker(dir.path(), Some("cancel")),
        Err(9),
        "killed by SIGKILL"
    );
    assert_eq!(count(dir.path(), "cancel"), 1);
    // The cancellation is at_most_once and may have landed: the saga
    // escalates rather than cancel again.
    assert_eq!(worker(dir.path(), None), Ok(ESCALATED));
    assert_eq!(count(dir.path(), "cancel"), 1);
    settle(dir.path());
    assert_eq!(worker(dir.path(), None), Ok(COMPENSATED));
    let effects: Vec<usize> = ["charge", "book", "cancel", "refund"]
        .iter()
        .map(|t| count(dir.path(), t))
        .collect();
    assert_eq!(
        effects,
        [1, 1, 1, 1],
        "{:?}",
        lines(&dir.path().join("ledger"))
    );
}
