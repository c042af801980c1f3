//! `cargo run --example agent` is the first thing a newcomer runs; this
//! test runs the same story (examples/agent/story.rs) and checks its
//! verdict, so the demonstration cannot silently rot. The worker processes
//! are this test binary, re-executed to run only `demo_worker_entry`.

#[path = "../examples/agent/shop.rs"]
mod shop;
#[path = "../examples/agent/story.rs"]
mod story;

use std::process::Command;

use story::WorkerEnd;

/// The worker side: becomes a demo worker when the story's environment
/// variable is set, passes trivially otherwise.
#[test]
fn demo_worker_entry() {
    if story::is_worker() {
        std::process::exit(story::worker_main());
    }
}

fn worker() -> Command {
    let mut command = Command::new(std::env::current_exe().expect("test binary path"));
    command.args([
        "--exact",
        "demo_worker_entry",
        "--nocapture",
        "--test-threads",
        "1",
        "-q",
    ]);
    command
}

#[test]
fn the_demo_tells_its_story_and_passes() {
    let dir = tempfile::tempdir().unwrap();
    let mut out = Vec::new();
    let report = story::run(&dir.path().join("demo"), &worker, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    println!("{text}");

    assert!(report.pass, "{:?}\n{text}", report.problems);
    assert_eq!(
        report.workers,
        [
            WorkerEnd::Signal(9),
            WorkerEnd::Exited(0),
            WorkerEnd::Signal(9),
            WorkerEnd::Exited(4),
        ],
        "{text}"
    );
    // The saga's order: charged once, refunded once (though its worker died
    // right after the refund landed), the courier booked and cancelled once,
    // the supplier never paid.
    assert_eq!(report.saga, [1, 1, 1, 1, 0], "{text}");
    assert!(text.contains("saga ship rolled back"), "{text}");
    assert_eq!(
        (report.charges, report.emails, report.tickets, report.wires),
        (1, 1, 1, 1)
    );
    assert_eq!(report.duplicates, 0);
    assert_eq!(report.resolved, 1);
    assert_eq!(report.stats.tools["send_email"].verifications, 1);
    assert_eq!(report.stats.tools["charge"].provider_replays, 1);
    // The newcomer reads sections in order and ends on the verdict.
    let sections: Vec<&str> = text.lines().filter(|l| l.starts_with("== ")).collect();
    assert_eq!(sections.len(), 9, "{sections:?}");
    assert!(
        text.lines()
            .last()
            .unwrap_or("")
            .starts_with("VERDICT: PASS"),
        "{text}"
    );
    assert!(text.contains("worker 1 killed by SIGKILL"), "{text}");
    // The operator settles the escalation through the running worker's
    // admin API, and the demo shows the commands they would type.
    assert!(text.contains("$ idem --journal "), "{text}");
    assert!(text.contains(" escalations\n"), "{text}");
    assert!(text.contains("--landed '{"), "{text}");
    assert!(text.contains("resolved refund_wire-"), "{text}");
    assert!(
        text.contains("admin API for operators on http://127.0.0.1:"),
        "{text}"
    );
    // The audit log was exported next to the journal.
    let jsonl = std::fs::read_to_string(dir.path().join("demo").join("audit.jsonl")).unwrap();
    assert_eq!(jsonl.lines().count(), report.audit_events);
}
