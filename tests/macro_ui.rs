//! Compile-time behaviour of `#[tool]`: the shapes it accepts, and every
//! refusal with its message (snapshots in tests/ui/fail/*.stderr, tied to
//! the pinned toolchain; regenerate with `TRYBUILD=overwrite`).

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
