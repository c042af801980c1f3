//! The embedded journal of [idem](https://docs.rs/idem), on sled 0.34:
//! [`SledJournal`]. One process per journal directory.
//!
//! `journal.rs` opens and serves the journal; `store.rs` is its state
//! (sled as of the last checkpoint plus the write-ahead log since,
//! `wal.rs`, with group commit); `image.rs` and the kept log are a second
//! copy of sled's content, from which `repair.rs` rebuilds sled when a
//! power cut damaged it; `files.rs`, `stored.rs`, `events.rs`,
//! `deflate.rs`, `digest.rs` and `apply.rs` are what those share.

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
