//! Fuzz target `journal_files`: the input format and the properties checked are
//! documented on `idem_sled::fuzzing::journal_files`, which regression tests
//! replay in `cargo test --workspace`. Allocations are not metered here:
//! sled's page cache is sized by configuration, not by the input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    idem_sled::fuzzing::journal_files(data);
});
