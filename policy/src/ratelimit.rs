//! Per-tool rate limits: `"<N>/<period>"` parsed once, enforced by a governor
//! token bucket (burst N, refilled evenly over the period, as the AIP
//! reference does).

use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

use crate::limits;

/// A parsed rate limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    pub count: NonZeroU32,
    pub period: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid rate_limit {input:?}: {problem}")]
pub struct RateLimitError {
    input: String,
    problem: &'static str,
}

impl RateLimit {
    pub fn parse(input: &str) -> Result<RateLimit, RateLimitError> {
        let fail = |problem| RateLimitError {
            input: input.to_owned(),
            problem,
        };
        let (count, unit) = input
            .trim()
            .split_once('/')
            .ok_or_else(|| fail("expected \"<N>/<period>\", e.g. \"10/minute\""))?;
        let count: u32 = count
            .trim()
            .parse()
            .map_err(|_| fail("the count must be a positive whole number"))?;
        if count > limits::MAX_RATE_COUNT {
            return Err(fail("the count must be at most 1000000000"));
        }
        let count = NonZeroU32::new(count).ok_or_else(|| fail("the count must be at least 1"))?;
        let period = match unit.trim().to_ascii_lowercase().as_str() {
            "second" | "sec" | "s" => Duration::from_secs(1),
            "minute" | "min" | "m" => Duration::from_secs(60),
            "hour" | "hr" | "h" => Duration::from_secs(3600),
            _ => {
                return Err(fail(
                    "the period must be second|sec|s, minute|min|m or hour|hr|h",
                ));
            }
        };
        Ok(RateLimit { count, period })
    }
}

impl fmt::Display for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = match self.period.as_secs() {
            1 => "second",
            60 => "minute",
            _ => "hour",
        };
        write!(f, "{}/{unit}", self.count)
    }
}

/// The time source for rate limits. Production uses the monotonic clock;
/// tests and simulations use a manual clock they advance themselves, so no
/// test has to sleep to see a bucket refill.
#[derive(Debug, Clone)]
pub enum RateClock {
    Monotonic(Instant),
    Manual(ManualClock),
}

impl Default for RateClock {
    fn default() -> Self {
        RateClock::Monotonic(Instant::now())
    }
}

impl Clock for RateClock {
    type Instant = Duration;

    fn now(&self) -> Duration {
        match self {
            RateClock::Monotonic(start) => start.elapsed(),
            RateClock::Manual(clock) => clock.elapsed(),
        }
    }
}

/// A clock that moves only when told to.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    pub fn advance(&self, by: Duration) {
        let nanos = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.0.fetch_add(nanos, Ordering::Relaxed);
    }

    fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::Relaxed))
    }
}

/// One tool's live bucket.
#[derive(Debug)]
pub struct Limiter {
    pub limit: RateLimit,
    bucket: RateLimiter<NotKeyed, InMemoryState, RateClock, NoOpMiddleware<Duration>>,
}

impl Limiter {
    pub fn new(limit: RateLimit, clock: RateClock) -> Limiter {
        // The period divided by a count of at most 1e9 is at least 1 ns for
        // every period we accept, so with_period cannot fail here.
        let replenish = limit.period / limit.count.get();
        let quota = Quota::with_period(replenish)
            .unwrap_or_else(|| Quota::per_second(limit.count))
            .allow_burst(limit.count);
        Limiter {
            limit,
            bucket: RateLimiter::direct_with_clock(quota, clock),
        }
    }

    /// Takes one token; false when the bucket is empty.
    pub fn try_acquire(&self) -> bool {
        self.bucket.check().is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit_spelling() {
        for (text, secs) in [
            ("5/second", 1),
            ("5/sec", 1),
            ("5/s", 1),
            ("10/minute", 60),
            ("10/min", 60),
            ("10/m", 60),
            ("100/hour", 3600),
            ("100/hr", 3600),
            (" 100 / H ", 3600),
        ] {
            let r = RateLimit::parse(text).unwrap();
            assert_eq!(r.period.as_secs(), secs, "{text}");
        }
    }

    #[test]
    fn refuses_malformed_limits_with_the_reason() {
        for (text, reason) in [
            ("10", "expected"),
            ("0/minute", "at least 1"),
            ("-1/minute", "positive whole number"),
            ("ten/minute", "positive whole number"),
            ("10/fortnight", "period"),
            ("2000000000/s", "at most"),
        ] {
            let e = RateLimit::parse(text).unwrap_err().to_string();
            assert!(e.contains(reason), "{text}: {e}");
        }
    }

    #[test]
    fn bucket_refills_over_the_period() {
        let clock = ManualClock::default();
        let limiter = Limiter::new(
            RateLimit::parse("2/minute").unwrap(),
            RateClock::Manual(clock.clone()),
        );
        assert!(limiter.try_acquire());
        assert!(limiter.try_acquire());
        assert!(!limiter.try_acquire());
        clock.advance(Duration::from_secs(30));
        assert!(limiter.try_acquire());
        assert!(!limiter.try_acquire());
    }
}
