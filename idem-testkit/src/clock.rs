//! The providers' notion of time, injectable so tests can expire
//! idempotency keys without sleeping for a day.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in milliseconds since the Unix epoch.
///
/// Cheap to clone. Providers read it to timestamp ledger records and to decide
/// whether a stored idempotency key has outlived its window.
#[derive(Clone)]
pub struct Clock(Arc<dyn Fn() -> u64 + Send + Sync>);

impl Clock {
    /// The real system clock.
    pub fn system() -> Self {
        Clock(Arc::new(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                // A clock set before 1970 is a broken machine; time zero
                // still gives monotone-enough behaviour for a test double.
                .unwrap_or(0)
        }))
    }

    /// A clock driven by any function returning milliseconds.
    pub fn from_fn(now_ms: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        Clock(Arc::new(now_ms))
    }

    /// The current time in milliseconds.
    pub fn now_ms(&self) -> u64 {
        (self.0)()
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::system()
    }
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Clock").field(&self.now_ms()).finish()
    }
}

/// A clock that only moves when told to.
///
/// ```
/// use idem_testkit::ManualClock;
/// use std::time::Duration;
///
/// let manual = ManualClock::new(1_000);
/// let clock = manual.clock();
/// manual.advance(Duration::from_secs(1));
/// assert_eq!(clock.now_ms(), 2_000);
/// ```
#[derive(Clone, Debug, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock standing at `start_ms`.
    pub fn new(start_ms: u64) -> Self {
        ManualClock(Arc::new(AtomicU64::new(start_ms)))
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }

    /// Sets the clock to an absolute time.
    pub fn set(&self, ms: u64) {
        self.0.store(ms, Ordering::SeqCst);
    }

    /// The time the clock shows.
    pub fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    /// A [`Clock`] that reads this manual clock, for [`crate::ProvidersConfig`].
    pub fn clock(&self) -> Clock {
        let ms = Arc::clone(&self.0);
        Clock::from_fn(move || ms.load(Ordering::SeqCst))
    }
}
