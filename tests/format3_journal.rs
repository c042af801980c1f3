//! A journal written by the last release of format 3 (everything in
//! sled) opens with this build: converted on open, durably, with every
//! operation, step, escalation and audit event it held.
//!
//! `tests/fixtures/format3-journal/` was written by idem at commit
//! 15c5ab1 (journal format 3) with the program kept beside it
//! (`make_fixture.rs`, the same tools as `support/old_journal.rs`): fifty
//! `charge` calls (every tenth declined), three `wire` calls escalated
//! after an ambiguous failure, one memoized step, a clean close; then ten
//! more `charge` calls made durable and the process ended without
//! closing, so the last ones are in its log only.

use std::path::Path;
use std::sync::atomic::Ordering;

use idem::Runtime;

#[path = "support/old_journal.rs"]
mod old_journal;
use old_journal::{charge, copy_dir, wire, CALLS, E};

async fn check(rt: &Runtime) {
    let ctx = rt.run("fixture");
    for n in (0..60).filter(|n| n % 10 != 9) {
        let got = charge(&ctx, n).await.unwrap();
        assert_eq!(got, format!("ch_{n:06}"), "operation {n}");
    }
    assert_eq!(CALLS.load(Ordering::SeqCst), 0, "a replay called the tool");
    let escalated = rt.escalations().await.unwrap();
    assert_eq!(escalated.len(), 3, "{escalated:?}");
    for n in 0..3 {
        let e = wire(&ctx, n).await.unwrap_err();
        assert!(matches!(e, idem::ToolError::Escalated { .. }), "{e:?}");
    }
    assert_eq!(CALLS.load(Ordering::SeqCst), 0, "an escalated call ran");
    let v: u64 = ctx.step("pick", async { Ok::<u64, E>(7) }).await.unwrap();
    assert_eq!(v, 4242, "the memoized step's value");
    let events = rt.audit(0).await.unwrap();
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert!(seqs.len() > 200, "{} events", seqs.len());
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "the stream has gaps: {seqs:?}"
    );
}

#[tokio::test]
async fn a_journal_of_the_previous_format_opens_converted_with_everything_it_held() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format3-journal");
    let dir = tempfile::TempDir::new().unwrap();
    let journal = dir.path().join("journal");
    copy_dir(&fixture, &journal);
    let meta_before = std::fs::read(journal.join("idem-meta")).unwrap();
    {
        let rt = Runtime::open(&journal).unwrap();
        check(&rt).await;
    }
    // Converted: format 4's manifest, no checkpoint file of format 3, and
    // the same answers after a reopen.
    assert!(journal.join("idem-manifest").exists());
    assert!(!journal.join("idem-checkpoint").exists());
    assert_ne!(
        std::fs::read(journal.join("idem-meta")).unwrap(),
        meta_before
    );
    let rt = Runtime::open(&journal).unwrap();
    check(&rt).await;
}
