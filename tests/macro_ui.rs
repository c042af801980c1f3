//! Compile-time behaviour of `#[tool]`: the shapes it accepts, and every
//! refusal with its message (snapshots in tests/ui/**/*.stderr, tied to
//! the pinned toolchain; regenerate with `TRYBUILD=overwrite`).
//!
//! trybuild builds the cases as binaries of one scratch crate under
//! target/tests/trybuild, which takes a while and prints nothing until the
//! first case is done; each test says what it is doing first. The two
//! groups differ in how they are built:
//! - `refusals`: only compile-fail cases, so trybuild checks them all in
//!   one `cargo check --keep-going` (each keeps its own .stderr);
//! - `accepted_shapes`: the pass cases are built and run one by one (so
//!   they are few files of many cases each), and with them the refusals
//!   that only code generation can see (a symbol defined twice), which a
//!   check alone would miss.

use std::io::Write;

/// Says what is about to happen, past the test harness's output capture.
fn progress(what: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "macro_ui: {what}");
}

fn cases(dir: &str) -> usize {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "rs"))
        })
        .count()
}

#[test]
fn refusals() {
    progress(&format!(
        "checking the {} compile-fail cases of tests/ui/fail in one cargo check (tens of seconds \
         on a cold build)",
        cases("tests/ui/fail")
    ));
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
}

#[test]
fn accepted_shapes() {
    progress(&format!(
        "building and running the {} files of tests/ui/pass, then building the {} of \
         tests/ui/link that must not link, one at a time (a minute or two on a cold build)",
        cases("tests/ui/pass"),
        cases("tests/ui/link")
    ));
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/link/*.rs");
}
