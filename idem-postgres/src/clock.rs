//! The database's clock, as seen from this machine: the local clock plus
//! the measured offset to `clock_timestamp()`. Durable timestamps written by
//! different workers (first attempt, escalation time) then agree however
//! far apart the machines' clocks are, and retry budgets measured across
//! workers (`max_elapsed`, the dedupe window) are measured on one clock.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use idem_journal::clock::{Clock, SystemClock};

/// The database's clock, corrected for this machine's skew.
#[derive(Debug)]
pub struct DbClock {
    local: SystemClock,
    /// Database minus local, in ms.
    offset_ms: AtomicI64,
    /// The last value handed out: a new offset never moves time backwards.
    last_ms: AtomicU64,
}

impl Default for DbClock {
    fn default() -> Self {
        DbClock::new()
    }
}

impl DbClock {
    /// A clock with no offset yet (the local clock until measured).
    pub fn new() -> Self {
        DbClock {
            local: SystemClock::new(),
            offset_ms: AtomicI64::new(0),
            last_ms: AtomicU64::new(0),
        }
    }

    /// The local clock, for a measurement.
    pub fn local_ms(&self) -> u64 {
        self.local.now_ms()
    }

    /// Takes a measurement: the database said `db_ms` between local times
    /// `before` and `after`; it is taken as said half-way (the error is at
    /// most half the round trip).
    pub fn measured(&self, before: u64, db_ms: f64, after: u64) {
        let mid = before as f64 + (after.saturating_sub(before)) as f64 / 2.0;
        self.offset_ms
            .store((db_ms - mid).round() as i64, Ordering::SeqCst);
    }

    /// The offset in ms (database minus local).
    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::SeqCst)
    }
}

impl Clock for DbClock {
    fn now_ms(&self) -> u64 {
        let now = (self.local.now_ms() as i64).saturating_add(self.offset_ms()) as u64;
        let last = self.last_ms.fetch_max(now, Ordering::SeqCst);
        now.max(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offset_is_taken_half_way_and_time_never_goes_back() {
        let c = DbClock::new();
        let local = c.local_ms();
        c.measured(local, (local + 10_000) as f64 + 5.0, local + 10);
        assert_eq!(c.offset_ms(), 10_000);
        let ahead = c.now_ms();
        assert!(ahead >= local + 10_000);
        // A later measurement with a smaller offset does not move time back.
        c.measured(local, local as f64, local);
        assert!(c.now_ms() >= ahead);
    }
}
