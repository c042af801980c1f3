//! The embedded journal of [idem](https://docs.rs/idem), on sled 0.34:
//! [`SledJournal`]. One process per journal directory.
//!
//! `journal.rs` opens and serves the journal; `store.rs` is its state (the
//! write-ahead log since the last checkpoint, `wal.rs`, with group commit,
//! over sled, the tables and the audit files); `settle.rs` is a
//! checkpoint: settled records into a table (`table.rs`), events into an
//! audit file (`audit.rs`), what can still change into sled; `merge.rs`
//! merges tables; `image.rs` and the kept log are a second copy of sled's
//! content, from which `repair.rs` rebuilds sled when a power cut damaged
//! it; `legacy.rs` opens and converts journals of formats 2 and 3;
//! `files.rs`, `stored.rs`, `events.rs`, `deflate.rs`, `digest.rs` and
//! `apply.rs` are what those share.

#![warn(missing_docs)]

mod apply;
mod audit;
mod deflate;
mod digest;
mod events;
mod files;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
mod image;
mod journal;
mod legacy;
mod memory;
mod merge;
mod repair;
mod settle;
mod store;
mod stored;
mod table;
mod wal;

pub use journal::{SledJournal, SledOptions};
