//! [`PausedClock`]: durable timestamps that move only with tokio's paused
//! clock or by hand.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::Clock;

/// A clock for the runtime's durable timestamps (first attempt, escalation
/// time, dedupe windows) that stands still unless time is made to pass:
/// it starts at a fixed instant, follows tokio's clock (which, paused,
/// moves only when every task waits on a timer and tokio jumps to the
/// next one, or on `tokio::time::advance`), and jumps forward on
/// [`advance`](PausedClock::advance) without moving tokio's clock (a
/// restart a day later).
///
/// The runtime's waits (backoff, settling before `verify`) sleep on
/// tokio's clock: run tests under `#[tokio::test(start_paused = true)]`
/// (tokio's feature `test-util`) so that they take no real time, and this
/// clock agrees with them. Cheap to clone; clones share the offset.
///
/// ```
/// use idem::testing::PausedClock;
/// use idem::Clock;
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let clock = PausedClock::new(1_000);
/// assert_eq!(clock.now_ms(), 1_000);
/// tokio::time::sleep(Duration::from_secs(2)).await; // no real time passes
/// assert_eq!(clock.now_ms(), 3_000);
/// clock.advance(Duration::from_secs(3600));
/// assert_eq!(clock.now_ms(), 3_603_000);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct PausedClock {
    start_ms: u64,
    base: tokio::time::Instant,
    offset_ms: Arc<AtomicU64>,
}

impl PausedClock {
    /// Where [`PausedClock::default`] starts: 2027-01-15T08:00:00Z, in ms
    /// since the epoch.
    pub const START_MS: u64 = 1_800_000_000_000;

    /// A clock showing `start_ms` (ms since the Unix epoch) now.
    pub fn new(start_ms: u64) -> PausedClock {
        PausedClock {
            start_ms,
            base: tokio::time::Instant::now(),
            offset_ms: Arc::default(),
        }
    }

    /// Moves this clock (and its clones) forward by `by`; tokio's clock
    /// does not move.
    pub fn advance(&self, by: Duration) {
        let ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.offset_ms.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Default for PausedClock {
    fn default() -> PausedClock {
        PausedClock::new(PausedClock::START_MS)
    }
}

impl Clock for PausedClock {
    fn now_ms(&self) -> u64 {
        let elapsed = tokio::time::Instant::now().saturating_duration_since(self.base);
        let elapsed = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        self.start_ms
            .saturating_add(self.offset_ms.load(Ordering::SeqCst))
            .saturating_add(elapsed)
    }
}
