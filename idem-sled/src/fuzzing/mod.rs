//! Entry points for the fuzz targets in `fuzz/` (a cargo-fuzz project
//! outside the workspace) and for the regression tests that replay what
//! they found. Not an API: compiled only with the `fuzzing` feature (and in
//! this crate's own tests), hidden from the docs. `frames.rs` holds the
//! decoders of framed records and keys; `sled.rs` those of the sled
//! journal's files; `tables.rs` the readers of its immutable files (tables
//! and audit files); `seeds.rs` the seed corpus.

pub mod frames;
mod seeds;
pub mod sled;
pub mod tables;

pub use frames::{key, record, Outcome, FIX_FRAME};
pub use seeds::seeds;
pub use sled::{journal_files, sled_value, wal};
pub use tables::tables;
