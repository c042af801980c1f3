//! Where the engine's state lives: the journal contract (crate
//! `idem-journal`), the embedded implementation on sled, [`SledJournal`], and
//! (feature `postgres`) the shared one on PostgreSQL, `PostgresJournal`.

pub use idem_journal::journal::*;

#[cfg(feature = "postgres")]
pub use idem_postgres::{DbClock, PostgresJournal, PostgresOptions, SCHEMA_VERSION};
#[cfg(feature = "sled")]
pub use idem_sled::{SledJournal, SledOptions};
