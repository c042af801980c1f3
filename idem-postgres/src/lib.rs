//! The shared journal of [idem](https://docs.rs/idem) on PostgreSQL:
//! [`PostgresJournal`], for several worker processes (feature `postgres`
//! of the facade).
//!
//! What each part of the [`Journal`](idem_journal::journal::Journal) contract becomes here:
//!
//! - **versions and conditions**: a write is one statement: `UPDATE ... WHERE version = $expected`
//!   or `INSERT ... ON CONFLICT DO NOTHING`, with the audit events and the
//!   notification in the same statement. Under READ COMMITTED a concurrent
//!   writer of the same row makes the update wait and re-check the
//!   condition, so of two writers with the same expectation one wins and
//!   the other gets [`Written::Conflict`](idem_journal::journal::Written::Conflict).
//! - **group commit across calls**: a write alone is its own implicit
//!   transaction (one round trip); immediate writes that arrive while
//!   several groups are being written share one transaction, their
//!   statements pipelined in key order between `BEGIN` and `COMMIT`, so
//!   that concurrent calls share commits (`group.rs` says why this changes
//!   no decision, and what a failure in a group means for the others).
//! - **claiming unread**: every read is a round trip, so the engine claims
//!   a key before reading it ([`Journal::claim_first`](idem_journal::journal::Journal::claim_first)), and
//!   [`Journal::claim`](idem_journal::journal::Journal::claim) is that same insert returning, in the same
//!   statement, the record it found instead: a call on a new key is two
//!   statements (INTENT, COMMITTED), a call on a known one still one
//!   before it decides.
//! - **claims are leases** on the database's clock: `lease_until` is set
//!   from `clock_timestamp()` (never `now()`, which is the transaction's
//!   start, and never the worker's clock), and [`Claim::live`](idem_journal::journal::Claim::live) is
//!   `lease_until > clock_timestamp()` at the time of the load. The runtime
//!   renews the leases of the calls it drives every third of a lease
//!   ([`Journal::renewal`](idem_journal::journal::Journal::renewal)); a renewal matches owner *and* epoch, so a
//!   worker that was taken over cannot extend the new owner's claim.
//! - **fencing**: a takeover is a write like any other (conditional on the
//!   version it saw, `epoch + 1`), so every later write of the stale owner
//!   fails its condition and changes nothing.
//! - **waking waiters** in other processes: a write of a record someone
//!   waits for `NOTIFY`s in its transaction; a listening connection per
//!   journal wakes this process's waiters (`listen.rs`, which also says why
//!   not every write notifies), with polling as the fallback and a wake-up
//!   at the lease's expiry (a dead driver writes nothing).
//! - **durability**: [`Durability::Immediate`](idem_journal::journal::Durability::Immediate) writes commit synchronously
//!   (PostgreSQL's own group commit shares the WAL flush between concurrent
//!   committers); [`Durability::Eventual`](idem_journal::journal::Durability::Eventual) writes commit with
//!   `synchronous_commit = off`, made durable by the WAL writer within
//!   `wal_writer_delay` (200 ms by default) or by the next synchronous
//!   commit of any session, since the WAL is flushed in order; that is the
//!   trait's "never durable out of order".
//! - **the audit stream** is commit-ordered and durable-only; see
//!   `events.rs`.
//! - **faults**: a lost connection or a restarted database makes the call
//!   in progress fail with [`Error::Storage`](idem_journal::error::Error::Storage); nothing is retried blindly
//!   (a write whose COMMIT outcome is unknown is reported as an error, and
//!   the engine reloads and re-decides, as after a crash). The pool drops
//!   closed connections and opens new ones by itself.
//!
//! - **behind a connection pooler** in transaction mode
//!   ([`PostgresOptions::pooler()`], set or detected): unnamed statements
//!   only, no session state, the worker id held by a lease row
//!   (`identity.rs`), and wake-ups by polling or on a direct
//!   [`PostgresOptions::listen_url()`] (`listen.rs`).
//!
//! - **failover** to a synchronous standby: with
//!   [`PostgresOptions::synchronous_standby()`] the journal refuses a
//!   server that would acknowledge a commit before a standby has it
//!   (`standby.rs`); a multi-host URL with
//!   `target_session_attrs=read-write` lets the pool's new connections
//!   find the promoted server, and a write cut off by the crash is an
//!   unknown outcome like any other.
//!
//! `journal.rs` holds the contract's statements; `group.rs` the writes
//! that share a transaction; `events.rs` the
//! commit-ordered audit stream; `listen.rs` the notifications that wake
//! waiters in other processes; `schema.rs` the schema and its version;
//! `clock.rs` the database's clock as this machine sees it; `standby.rs`
//! the check of a synchronous standby; `rows.rs` what
//! the statements read and write.

#![warn(missing_docs)]

mod clock;
mod events;
mod group;
mod identity;
#[doc(hidden)]
pub use identity::{lock_key as worker_lock_key, APPLICATION_NAME as WORKER_ID_APPLICATION_NAME};
mod journal;
mod listen;
mod rows;
mod schema;
mod standby;

pub use clock::DbClock;
pub use journal::{PostgresJournal, PostgresOptions};
pub use schema::SCHEMA_VERSION;
