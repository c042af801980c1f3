//! The demonstration to run first: `cargo run --example agent`.
//!
//! A scripted agent (no model needed) processes order 4711 with five tools,
//! one per idem class (see `agent/shop.rs`, the code an idem user writes).
//! The agent runs in a worker process that SIGKILLs itself at the worst
//! moment (an email has landed, its COMMIT is not yet written); the demo
//! restarts it, an operator settles the one thing only a human can (did the
//! refund wire go out?), and the providers' own ledgers prove that every
//! effect happened exactly once. Then a second order runs as a saga: its
//! last step is refused, idem refunds the charge and cancels the courier,
//! and the worker SIGKILLed mid-rollback is resumed by the next one. The
//! choreography is in `agent/story.rs`.
//!
//! Options: `-- --journal DIR` keeps the journal and the audit log in DIR.

#[path = "agent/shop.rs"]
mod shop;
#[path = "agent/story.rs"]
mod story;

fn main() {
    if story::is_worker() {
        std::process::exit(story::worker_main());
    }
    // The worker is this very binary, re-executed.
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("cannot find this program to start workers: {e}");
            std::process::exit(2);
        }
    };
    let worker = move || std::process::Command::new(&exe);
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(story::parent_main(&args, &worker));
}
