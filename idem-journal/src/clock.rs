//! Wall-clock time for durable timestamps (first attempt, escalation time),
//! injectable so that tests can move it without sleeping.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    /// Now, in ms since the epoch.
    fn now_ms(&self) -> u64;
}

/// The default clock: the system time read once when the runtime opens,
/// advanced by tokio's monotonic clock. It never jumps backwards with the
/// system clock, and under a paused tokio clock (`tokio::time::pause`) it
/// advances exactly as tokio's timers do, so retry budgets measured in it
/// match the backoff sleeps.
#[derive(Debug)]
pub struct SystemClock {
    base_ms: u64,
    base: tokio::time::Instant,
}

impl SystemClock {
    /// A clock anchored at the current system time.
    pub fn new() -> Self {
        SystemClock {
            base_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            base: tokio::time::Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        let elapsed = tokio::time::Instant::now().saturating_duration_since(self.base);
        self.base_ms + elapsed.as_millis() as u64
    }
}

/// A clock that moves only when told to; for tests that need time to pass
/// between two runtimes (e.g. a restart two hours later).
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock showing `now_ms`.
    pub fn new(now_ms: u64) -> Self {
        ManualClock(Arc::new(AtomicU64::new(now_ms)))
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }

    /// Sets the clock.
    pub fn set(&self, now_ms: u64) {
        self.0.store(now_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}
