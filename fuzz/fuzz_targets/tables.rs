//! Fuzz target `tables`: the input format and the properties checked are
//! documented on `idem_sled::fuzzing::tables`, which regression tests
//! replay in `cargo test --workspace`; here the allocations are also
//! metered (see `idem_fuzz::bounded`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    idem_fuzz::bounded(data, idem_sled::fuzzing::tables);
});
