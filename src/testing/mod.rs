//! Prove your own tools the way idem's torture proves its own (feature
//! `testing`): a crash matrix that runs one call of your `#[tool]` against
//! your fake provider with the process killed at every [`CrashPoint`],
//! restarts it and checks the class's promise against your provider's
//! [`Ledger`]; the journal it runs on, which loses what a crash loses and
//! fails writes on command ([`FaultJournal`]); and a clock that stands
//! still ([`PausedClock`]).
//!
//! ```toml
//! [dev-dependencies]
//! idem = { version = "0.1", features = ["testing"] }
//! tokio = { version = "1", features = ["macros", "rt", "test-util"] }
//! ```
//!
//! Then, for a tool `charge` and a fake provider `FakePayments` that
//! implements [`Ledger`] (see [`CrashMatrix`] for a whole example):
//!
//! ```text
//! #[tokio::test(start_paused = true)]
//! async fn charge_survives_every_crash() {
//!     CrashMatrix::new("charge")
//!         .unwrap()
//!         .run(FakePayments::default, async |payments, ctx| {
//!             charge(ctx, payments.clone(), 4711).await
//!         })
//!         .await
//!         .assert_holds();
//! }
//! ```
//!
//! A provider that does not deduplicate behind a `class = "provider"`
//! tool, or a `verify` that does not find what landed, fails it, naming
//! the point:
//!
//! ```text
//! crash matrix of `charge` (class provider, promise: exactly once, without a human: ...): BROKEN at 1 of 4 crash points
//!   crash point after_provider (the provider answered, the COMMIT not written), class provider (tool `charge`): BROKEN: the effect happened 2 times (ledger) ...
//! ```
//!
//! Nothing here sleeps for real: run the tests under
//! `#[tokio::test(start_paused = true)]` (tokio's `test-util`), so that the
//! runtime's backoff and its wait before asking `verify` take no time.

mod clock;
mod journal;
mod matrix;
mod point;

pub use clock::PausedClock;
pub use journal::{Fault, FaultJournal};
pub use matrix::{CrashMatrix, Ledger, MatrixError, MatrixReport, Parked, PointReport, Violation};
pub use point::CrashPoint;
