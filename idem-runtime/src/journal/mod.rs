//! Where the engine's state lives: the journal contract (crate
//! `idem-journal`), the embedded implementation on sled, [`SledJournal`], and
//! (feature `postgres`) the shared one on PostgreSQL, `PostgresJournal`.

pub use idem_journal::journal::*;

mod apply;
mod digest;
mod events;
mod files;
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) mod fuzzing;
mod image;
#[cfg(feature = "postgres")]
mod postgres;
mod repair;
mod sled;
mod store;
mod stored;
mod wal;

#[cfg(feature = "postgres")]
pub use self::postgres::{DbClock, PostgresJournal, PostgresOptions, SCHEMA_VERSION};
pub use self::sled::{SledJournal, SledOptions};
