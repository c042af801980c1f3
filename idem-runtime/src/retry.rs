//! Retry policy: Temporal's exponential backoff (1 s initial, ×2.0, capped at
//! 100 × initial), bounded by a number of attempts and a total elapsed time
//! that both survive restarts (the journal stores them).

use std::time::Duration;

/// How a tool retries. The defaults follow Temporal (1 s initial interval,
/// backoff ×2.0, interval capped at 100 × initial), with a finite budget:
/// 5 attempts and 1 hour, so that a provider's 24 h dedupe window always
/// outlives the retries.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included. `1` means never retry.
    pub max_attempts: u32,
    /// Delay before the first retry.
    pub initial: Duration,
    /// Multiplier applied to the delay after each retry.
    pub backoff: f64,
    /// Upper bound of one delay.
    pub max_interval: Duration,
    /// Upper bound of the time from the first attempt to the start of the
    /// last one, across restarts. `None`: no bound.
    pub max_elapsed: Option<Duration>,
    /// Spread each delay randomly over [50 %, 100 %] of its value, so that
    /// many callers failing together do not retry together.
    pub jitter: bool,
}

impl RetryPolicy {
    /// Temporal's intervals with idem's finite budget; see the type docs.
    pub const DEFAULT: RetryPolicy = RetryPolicy {
        max_attempts: 5,
        initial: Duration::from_secs(1),
        backoff: 2.0,
        max_interval: Duration::from_secs(100),
        max_elapsed: Some(Duration::from_secs(3600)),
        jitter: true,
    };

    /// A single attempt: no retry at all.
    pub const NEVER: RetryPolicy = RetryPolicy {
        max_attempts: 1,
        ..RetryPolicy::DEFAULT
    };

    /// The delay after failed attempt number `attempt` (1-based), before
    /// jitter and before any `retry_after` the provider asked for.
    pub fn base_delay(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(1023) as i32;
        let secs = self.initial.as_secs_f64() * self.backoff.max(1.0).powi(exp);
        let cap = self.max_interval.as_secs_f64();
        if !secs.is_finite() || secs >= cap {
            self.max_interval
        } else {
            Duration::from_secs_f64(secs)
        }
    }

    /// The delay after failed attempt `attempt`: the base delay, jittered
    /// with `unit` (a uniform sample in [0, 1)) when jitter is on, and never
    /// shorter than `retry_after`.
    pub fn delay(&self, attempt: u32, unit: f64, retry_after: Option<Duration>) -> Duration {
        let base = self.base_delay(attempt);
        let d = if self.jitter {
            base.mul_f64(0.5 + 0.5 * unit.clamp(0.0, 1.0))
        } else {
            base
        };
        match retry_after {
            Some(r) if r > d => r,
            _ => d,
        }
    }

    /// Whether another attempt may start, given the attempts already made
    /// and the time from the first attempt to when the next one would start.
    pub fn allows(&self, attempts_made: u32, elapsed_at_next: Duration) -> bool {
        attempts_made < self.max_attempts
            && self.max_elapsed.is_none_or(|max| elapsed_at_next <= max)
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy::DEFAULT
    }
}

/// A small, fast, non-cryptographic generator for jitter (splitmix64),
/// seeded per runtime so that processes do not jitter in lock-step.
#[derive(Debug)]
pub(crate) struct Jitter(std::sync::atomic::AtomicU64);

impl Jitter {
    pub(crate) fn new(seed: u64) -> Self {
        Jitter(std::sync::atomic::AtomicU64::new(seed))
    }

    /// A uniform sample in [0, 1).
    pub(crate) fn unit(&self) -> f64 {
        use std::sync::atomic::Ordering;
        let mut z = self
            .0
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_jitter() -> RetryPolicy {
        RetryPolicy {
            jitter: false,
            ..RetryPolicy::DEFAULT
        }
    }

    #[test]
    fn temporal_defaults_double_and_cap_at_100x() {
        let p = no_jitter();
        let secs: Vec<f64> = (1..=10).map(|a| p.base_delay(a).as_secs_f64()).collect();
        assert_eq!(
            secs,
            [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 100.0, 100.0, 100.0]
        );
        assert_eq!(p.base_delay(u32::MAX), Duration::from_secs(100));
    }

    #[test]
    fn custom_backoff() {
        let p = RetryPolicy {
            initial: Duration::from_millis(200),
            backoff: 3.0,
            max_interval: Duration::from_secs(5),
            ..no_jitter()
        };
        assert_eq!(p.base_delay(1), Duration::from_millis(200));
        assert_eq!(p.base_delay(2), Duration::from_millis(600));
        assert_eq!(p.base_delay(3), Duration::from_millis(1800));
        assert_eq!(p.base_delay(4), Duration::from_secs(5));
    }

    #[test]
    fn backoff_below_one_never_shrinks() {
        let p = RetryPolicy {
            backoff: 0.5,
            ..no_jitter()
        };
        assert_eq!(p.base_delay(5), Duration::from_secs(1));
    }

    #[test]
    fn jitter_stays_within_half_to_full() {
        let p = RetryPolicy::DEFAULT;
        assert_eq!(p.delay(3, 0.0, None), Duration::from_secs(2));
        assert_eq!(p.delay(3, 0.999_999_999, None).as_millis(), 3999);
        let j = Jitter::new(42);
        for _ in 0..10_000 {
            let u = j.unit();
            assert!((0.0..1.0).contains(&u));
            let d = p.delay(2, u, None);
            assert!(d >= Duration::from_secs(1) && d <= Duration::from_secs(2));
        }
    }

    #[test]
    fn retry_after_is_a_floor() {
        let p = no_jitter();
        assert_eq!(
            p.delay(1, 0.0, Some(Duration::from_secs(30))),
            Duration::from_secs(30)
        );
        assert_eq!(
            p.delay(4, 0.0, Some(Duration::from_secs(3))),
            Duration::from_secs(8)
        );
    }

    #[test]
    fn budget_counts_attempts_and_elapsed() {
        let p = no_jitter();
        assert!(p.allows(4, Duration::from_secs(10)));
        assert!(!p.allows(5, Duration::from_secs(10)));
        assert!(p.allows(1, Duration::from_secs(3600)));
        assert!(!p.allows(1, Duration::from_secs(3601)));
        let unbounded = RetryPolicy {
            max_elapsed: None,
            ..p
        };
        assert!(unbounded.allows(1, Duration::from_secs(1 << 40)));
        assert!(!RetryPolicy::NEVER.allows(1, Duration::ZERO));
    }
}
