//! This crate's own compile-time refusals of `#[tool]`, with the messages
//! it expects (tests/ui/*.stderr, written by `TRYBUILD=overwrite` and
//! checked since).

#[test]
fn refusals() {
    trybuild::TestCases::new().compile_fail("tests/ui/*.rs");
}
