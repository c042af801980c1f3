//! A real process is killed with SIGKILL after its effect landed at the
//! provider and before the COMMIT reached the journal; a fresh process then
//! recovers the operation. The provider's own ledger (a file outside the
//! journal) must show exactly one effect.
//!
//! The test binary plays every role: run without `IDEM_CRASH_ROLE` it is the
//! parent; the parent re-executes it with the variable set to be a worker.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::TestError;
use idem_runtime::{Class, Ctx, EventKind, Runtime, ToolError, Verdict};

const TEST_NAME: &str = "sigkill_after_the_effect_before_the_commit";

/// The provider: a ledger file with one line per effect, fsynced.
fn ledger_lines(ledger: &Path) -> Vec<String> {
    std::fs::read_to_string(ledger)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn apply(ledger: &Path, key: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(ledger)
        .unwrap();
    writeln!(f, "{key}").unwrap();
    f.sync_all().unwrap();
}

fn worker(role: &str, class: Class, journal: PathBuf, ledger: PathBuf) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // A worker that gets stuck exits on its own, so the parent's read ends.
    let work = async move {
        let runtime = Runtime::open(&journal).unwrap();
        let ctx = runtime.run("order-4711");
        let t = common::tool("charge", class);
        let key = common::key(&ctx, t, 4711);
        let hang = role == "work";
        let l1 = ledger.clone();
        let attempt = move |c: Ctx| {
            let ledger = l1.clone();
            async move {
                let key = c.idempotency_key().to_string();
                let seen = ledger_lines(&ledger).contains(&key);
                // A provider-class provider deduplicates on the key.
                if !(class == Class::Provider && seen) {
                    apply(&ledger, &key);
                }
                if hang {
                    println!("LANDED");
                    std::io::stdout().flush().unwrap();
                    std::future::pending::<()>().await;
                }
                Ok::<_, TestError>(format!("charged:{key}"))
            }
        };
        let l2 = ledger.clone();
        let verify = move |c: Ctx| {
            let ledger = l2.clone();
            async move {
                let key = c.idempotency_key().to_string();
                Ok::<_, TestError>(if ledger_lines(&ledger).contains(&key) {
                    Verdict::Landed(format!("charged:{key}"))
                } else {
                    Verdict::NotLanded
                })
            }
        };
        let verify = (class == Class::Journal).then_some(verify);
        let out =
            idem_runtime::__private::call(&ctx, t, key, common::args(4711, "x"), attempt, verify)
                .await;
        match out {
            Ok(v) => println!("RESULT ok {v}"),
            Err(ToolError::Escalated { .. }) => println!("RESULT escalated"),
            Err(e) => println!("RESULT error {e:?}"),
        }
        let verified =
            runtime.audit(0).await.unwrap_or_default().into_iter().any(
                |e| matches!(e.kind, EventKind::Verified { ref verdict } if verdict == "landed"),
            );
        println!("VERIFIED {verified}");
    };
    rt.block_on(async move {
        if tokio::time::timeout(std::time::Duration::from_secs(60), work)
            .await
            .is_err()
        {
            println!("STUCK");
        }
    });
}

fn spawn(role: &str, class: Class, journal: &Path, ledger: &Path) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", TEST_NAME, "--nocapture", "--test-threads", "1"])
        .env("IDEM_CRASH_ROLE", role)
        .env("IDEM_CRASH_CLASS", class.as_str())
        .env("IDEM_CRASH_JOURNAL", journal)
        .env("IDEM_CRASH_LEDGER", ledger)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn class_of(name: &str) -> Class {
    match name {
        "provider" => Class::Provider,
        "journal" => Class::Journal,
        "at_most_once" => Class::AtMostOnce,
        other => panic!("class {other}"),
    }
}

#[test]
fn sigkill_after_the_effect_before_the_commit() {
    if let Ok(role) = std::env::var("IDEM_CRASH_ROLE") {
        let class = class_of(&std::env::var("IDEM_CRASH_CLASS").unwrap());
        let journal = std::env::var("IDEM_CRASH_JOURNAL").unwrap().into();
        let ledger = std::env::var("IDEM_CRASH_LEDGER").unwrap().into();
        worker(&role, class, journal, ledger);
        return;
    }
    for class in [Class::Provider, Class::Journal, Class::AtMostOnce] {
        let dir = tempfile::TempDir::new().unwrap();
        let journal = dir.path().join("journal");
        let ledger = dir.path().join("ledger");

        // A worker lands the effect, then is killed before it can commit.
        let mut child = spawn("work", class, &journal, &ledger);
        // The test harness prints its own lines first.
        let landed = BufReader::new(child.stdout.take().unwrap())
            .lines()
            .map_while(Result::ok)
            .any(|l| l.ends_with("LANDED"));
        assert!(landed, "{class}: the worker never reached the provider");
        child.kill().unwrap(); // SIGKILL
        let status = child.wait().unwrap();
        assert!(!status.success(), "{class}: the worker was killed");
        assert_eq!(ledger_lines(&ledger).len(), 1);

        // A fresh process picks the operation up.
        let out = spawn("recover", class, &journal, &ledger)
            .wait_with_output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let effects = ledger_lines(&ledger);
        assert_eq!(
            effects.len(),
            1,
            "{class}: duplicate effect: {effects:?}\n{stdout}"
        );
        match class {
            Class::Provider => assert!(stdout.contains("RESULT ok charged:"), "{stdout}"),
            Class::Journal => {
                assert!(stdout.contains("RESULT ok charged:"), "{stdout}");
                assert!(stdout.contains("VERIFIED true"), "{stdout}");
            }
            _ => assert!(stdout.contains("RESULT escalated"), "{stdout}"),
        }
        // The journal still opens, and the audit stream holds both
        // processes' events: the dead worker's INTENT and attempt (durable
        // before its provider call) and the recovery after them, each under
        // its own sequence number.
        let rt = Runtime::open(&journal).unwrap();
        let events: Vec<_> = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(rt.audit(0))
            .unwrap();
        let kinds: Vec<_> = events.iter().map(|e| &e.kind).collect();
        assert!(
            matches!(kinds[0], EventKind::Intent { .. }),
            "{class}: {kinds:?}"
        );
        assert_eq!(kinds[1], &EventKind::Attempt { attempt: 1 }, "{class}");
        assert!(
            kinds[2..]
                .iter()
                .any(|k| matches!(k, EventKind::Recovered { .. })),
            "{class}: {kinds:?}"
        );
        assert!(
            events.windows(2).all(|w| w[0].seq < w[1].seq),
            "{class}: {events:?}"
        );
    }
}
