//! A cheap lock-free latency histogram: fixed bucket bounds in microseconds, one atomic
//! counter per bucket, plus sum and count. Percentiles are read from the buckets.
use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds (inclusive, microseconds) of the finite buckets; one more bucket is +Inf.
pub const BOUNDS_US: [u64; 18] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000, 30_000_000, 60_000_000,
];

#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; BOUNDS_US.len() + 1],
    sum_us: AtomicU64,
    count: AtomicU64,
}

/// A copy of a histogram at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistSnapshot {
    /// Per-bucket (not cumulative) counts; the last is +Inf.
    pub buckets: Vec<u64>,
    pub sum_us: u64,
    pub count: u64,
}

impl Histogram {
    #[inline]
    pub fn record(&self, us: u64) {
        self.record_n(us, 1);
    }

    /// Record `n` observations of `us` microseconds each.
    #[inline]
    pub fn record_n(&self, us: u64, n: u64) {
        if n == 0 {
            return;
        }
        let i = BOUNDS_US.partition_point(|&b| b < us);
        self.buckets[i].fetch_add(n, Ordering::Relaxed);
        self.sum_us
            .fetch_add(us.saturating_mul(n), Ordering::Relaxed);
        self.count.fetch_add(n, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> HistSnapshot {
        HistSnapshot {
            buckets: self
                .buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
            sum_us: self.sum_us.load(Ordering::Relaxed),
            count: self.count.load(Ordering::Relaxed),
        }
    }
}

impl HistSnapshot {
    pub fn add(&mut self, o: &HistSnapshot) {
        if self.buckets.len() < o.buckets.len() {
            self.buckets.resize(o.buckets.len(), 0);
        }
        for (a, b) in self.buckets.iter_mut().zip(&o.buckets) {
            *a += b;
        }
        self.sum_us += o.sum_us;
        self.count += o.count;
    }

    /// The `q` quantile (0..=1) in microseconds, interpolated inside its bucket; None when
    /// empty. A value in the +Inf bucket reads as the largest finite bound.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        let total: u64 = self.buckets.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = (q.clamp(0.0, 1.0) * total as f64).max(1.0);
        let mut seen = 0u64;
        for (i, &n) in self.buckets.iter().enumerate() {
            if n == 0 {
                continue;
            }
            if (seen + n) as f64 >= rank {
                let Some(&hi) = BOUNDS_US.get(i) else {
                    return BOUNDS_US.last().copied();
                };
                let lo = if i == 0 { 0 } else { BOUNDS_US[i - 1] };
                let frac = (rank - seen as f64) / n as f64;
                return Some(lo + ((hi - lo) as f64 * frac) as u64);
            }
            seen += n;
        }
        BOUNDS_US.last().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_land_in_their_bucket() {
        let h = Histogram::default();
        h.record(100);
        h.record(101);
        h.record(u64::MAX / 4);
        let s = h.snapshot();
        assert_eq!(s.buckets[0], 1);
        assert_eq!(s.buckets[1], 1);
        assert_eq!(*s.buckets.last().unwrap(), 1);
        assert_eq!(s.count, 3);
    }

    #[test]
    fn quantiles_interpolate_within_buckets() {
        let h = Histogram::default();
        assert_eq!(h.snapshot().quantile(0.5), None);
        h.record_n(700, 90); // 500..1000 bucket
        h.record_n(20_000, 10); // 10_000..25_000 bucket
        let s = h.snapshot();
        let p50 = s.quantile(0.5).unwrap();
        assert!((500..=1000).contains(&p50), "{p50}");
        let p99 = s.quantile(0.99).unwrap();
        assert!((10_000..=25_000).contains(&p99), "{p99}");
        assert_eq!(s.sum_us, 700 * 90 + 20_000 * 10);
    }
}
