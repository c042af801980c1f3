//! A journal written by the last build of format 4 (tables whose Bloom
//! filters are classic) opens with this build: its tables are read as
//! they are, the journal is marked format 5 before a table of the new
//! layout is written, and old and new tables answer together, across
//! checkpoints, merges and reopens.
//!
//! `tests/fixtures/format4-journal/` was written by idem at commit fd730a0
//! (journal format 4) with the program kept beside it (`make_fixture4.rs`,
//! the same tools as `support/old_journal.rs`), with checkpoints every
//! 8 KiB of log so that settled records are in tables: 400 `charge` calls
//! (every tenth declined), three `wire` calls escalated after an
//! ambiguous failure, one memoized step, a clean close; then ten more
//! `charge` calls made durable and the process ended without closing, so
//! those are in its log only.

use std::path::Path;
use std::sync::atomic::Ordering;

use idem::{Runtime, SledOptions};

#[path = "support/old_journal.rs"]
mod old_journal;
use old_journal::{charge, copy_dir, wire, CALLS, E};

/// Taken by each test for its whole run: they count the tools' calls in
/// one counter, [`CALLS`], and one test's calls would be seen by the
/// other's check that a replay makes none.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Checkpoints every 8 KiB of log, as the fixture was written: new
/// tables, and merges of old ones with new ones.
fn open(journal: &Path) -> Runtime {
    Runtime::builder()
        .path(journal)
        .sled_options(SledOptions {
            checkpoint_bytes: 8 << 10,
            ..SledOptions::default()
        })
        .open()
        .unwrap()
}

/// The magic each table file of `journal` starts with.
fn table_magics(journal: &Path) -> Vec<String> {
    let mut magics: Vec<String> = std::fs::read_dir(journal)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("idem-table."))
        })
        .map(|p| String::from_utf8_lossy(&std::fs::read(p).unwrap()[..8]).into_owned())
        .collect();
    magics.sort();
    magics
}

/// Whether `journal`'s `idem-meta` says `format`.
fn marked(journal: &Path, format: u8) -> bool {
    let meta = std::fs::read(journal.join("idem-meta")).unwrap();
    meta.windows(13)
        .any(|w| w == [b"idem-journal" as &[u8], &[format]].concat())
}

/// Everything the fixture held, and the calls of this test after it
/// (`charge` of `extra`), answered from the journal: no tool runs.
async fn check(rt: &Runtime, extra: std::ops::Range<u64>) {
    let before = CALLS.load(Ordering::SeqCst);
    let ctx = rt.run("fixture");
    for n in (0..410).filter(|n| n % 10 != 9) {
        let got = charge(&ctx, n).await.unwrap();
        assert_eq!(got, format!("ch_{n:06}"), "operation {n}");
    }
    for n in extra {
        let got = charge(&ctx, n).await.unwrap();
        assert_eq!(got, format!("ch_{n:06} again"), "operation {n}");
    }
    assert_eq!(
        CALLS.load(Ordering::SeqCst),
        before,
        "a replay called the tool"
    );
    let escalated = rt.escalations().await.unwrap();
    assert_eq!(escalated.len(), 3, "{escalated:?}");
    for n in 0..3 {
        let e = wire(&ctx, n).await.unwrap_err();
        assert!(matches!(e, idem::ToolError::Escalated { .. }), "{e:?}");
    }
    assert_eq!(
        CALLS.load(Ordering::SeqCst),
        before,
        "an escalated call ran"
    );
    let v: u64 = ctx.step("pick", async { Ok::<u64, E>(7) }).await.unwrap();
    assert_eq!(v, 4242, "the memoized step's value");
    let events = rt.audit(0).await.unwrap();
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert!(seqs.len() > 1_000, "{} events", seqs.len());
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "the stream has gaps"
    );
}

#[tokio::test]
async fn a_journal_of_format_4_opens_with_its_tables_and_grows_tables_of_the_new_layout() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format4-journal");
    let dir = tempfile::TempDir::new().unwrap();
    let journal = dir.path().join("journal");
    copy_dir(&fixture, &journal);
    assert!(marked(&journal, 4), "the fixture is of format 4");
    let old = table_magics(&journal);
    assert!(
        old.len() >= 2 && old.iter().all(|m| m == "IDEMTBL1"),
        "{old:?}"
    );
    let before = CALLS.load(Ordering::SeqCst);
    {
        let rt = open(&journal);
        assert!(marked(&journal, 5), "marked format 5 at open");
        check(&rt, 0..0).await;
        // New calls: checkpoints write tables of the new layout beside
        // the old ones.
        let ctx = rt.run("fixture");
        for n in 1000..1400 {
            charge(&ctx, n).await.unwrap();
        }
        assert_eq!(CALLS.load(Ordering::SeqCst), before + 400);
        rt.sync().await.unwrap();
    }
    let mixed = table_magics(&journal);
    assert!(mixed.iter().any(|m| m == "IDEMTBL2"), "{mixed:?}");
    // Merges took old tables in: their records now answer from tables of
    // the new layout.
    let classic = mixed.iter().filter(|m| *m == "IDEMTBL1").count();
    assert!(classic < old.len(), "{mixed:?}");
    let rt = open(&journal);
    check(&rt, 1000..1400).await;
}

#[tokio::test]
async fn a_journal_marked_format_5_before_its_first_new_table_opens_all_the_same() {
    let _alone = ONE_AT_A_TIME.lock().await;
    // What a crash between the marking and the first table of the new
    // layout leaves: `idem-meta` says 5, every table is classic, and the
    // log still holds the unclosed tail. The marked metadata is taken from
    // another copy of the fixture that one open marked.
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format4-journal");
    let dir = tempfile::TempDir::new().unwrap();
    let (opened, crashed) = (dir.path().join("opened"), dir.path().join("crashed"));
    copy_dir(&fixture, &opened);
    copy_dir(&fixture, &crashed);
    drop(open(&opened));
    std::fs::copy(opened.join("idem-meta"), crashed.join("idem-meta")).unwrap();
    assert!(marked(&crashed, 5));
    let tables = table_magics(&crashed);
    assert!(tables.iter().all(|m| m == "IDEMTBL1"), "{tables:?}");
    let rt = open(&crashed);
    check(&rt, 0..0).await;
}
