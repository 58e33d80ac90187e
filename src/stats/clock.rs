//! The transaction clock: the monotonic clock is read when a transaction takes its server
//! (the checkout's checks, or the end of its wait) and at each ReadyForQuery (`now`), and
//! what happens at the same moment on the same worker thread uses that reading again
//! (`recent`: the transaction's and its first query's start, the statistics at its end)
//! instead of a clock read each (docs/performance.md).
use std::cell::Cell;
use std::time::Instant;

thread_local! {
    static LAST: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// The clock, read now; `recent` gives this reading until the next `now` on this thread.
pub fn now() -> Instant {
    let t = Instant::now();
    LAST.with(|l| l.set(Some(t)));
    t
}

/// The latest `now` on this thread (read now when there was none). Only for a moment
/// just after a `now` of the same task with no wait between: on a worker another task's
/// reading may be newer, never older than the caller's own.
pub fn recent() -> Instant {
    LAST.with(|l| l.get()).unwrap_or_else(now)
}

/// Whether `d` has passed from `since` to `now` (`now - since >= d`): one addition and a
/// comparison, for the checks a checkout makes, where `duration_since` would compute and
/// normalise a `Duration` each time.
pub fn passed(now: Instant, since: Instant, d: std::time::Duration) -> bool {
    d.is_zero() || since.checked_add(d).is_some_and(|t| now >= t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passed_is_duration_since_at_least() {
        use std::time::Duration;
        let a = Instant::now();
        let b = a + Duration::from_millis(1500);
        for d in [0, 1, 1499, 1500, 1501, 10_000] {
            let d = Duration::from_millis(d);
            assert_eq!(
                passed(b, a, d),
                b.saturating_duration_since(a) >= d,
                "{d:?}"
            );
            assert_eq!(
                passed(a, b, d),
                a.saturating_duration_since(b) >= d,
                "{d:?}"
            );
        }
        assert!(!passed(b, a, Duration::MAX));
    }

    #[test]
    fn recent_is_the_latest_reading() {
        let a = now();
        assert_eq!(recent(), a);
        let b = now();
        assert!(b >= a);
        assert_eq!(recent(), b);
    }
}
