//! The storage contract of [idem](https://docs.rs/idem): what a journal
//! backend needs, and nothing else.
//!
//! - [`journal`]: the [`Journal`](journal::Journal) trait every backend
//!   implements (records under versions and claims, units of a record and
//!   its audit events, named durability levels, a commit-ordered audit
//!   stream);
//! - [`record`]: the engine's records and their framing (kind, format
//!   version, CRC, bincode body), which a backend stores as opaque bytes;
//! - [`audit`]: audit events as they are stored and read back;
//! - [`error`]: idem's [`Error`](error::Error), whose storage failures keep
//!   their cause and a typed kind;
//! - [`key`], [`class`], [`clock`], [`codec`], [`views`], [`files`]: the
//!   operation key's text, tool classes, the clock, result encoding, the
//!   operator's views of records and private files.
//!
//! Users depend on the `idem` crate, which re-exports what they need.

#![warn(missing_docs)]

pub mod audit;
pub mod class;
pub mod clock;
pub mod codec;
pub mod error;
pub mod files;
pub mod journal;
pub mod key;
pub mod record;
pub mod views;
