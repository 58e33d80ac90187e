//! Counters bumped on the query path (atomics, no locks) and read by SHOW commands and
//! `/metrics` (admin/metrics.rs): per-pool totals, latency histograms, and per-`stats_period`
//! averages.
pub mod clock;
pub mod histogram;

use crate::lock::Locked;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

pub use histogram::Histogram;

/// Lanes of the counters a transaction adds to: a worker adds to its own (`PoolStats::lane`,
/// by its index), on cache lines no other worker writes, and reads fold them (`totals`,
/// `PoolStats::hist`). Workers beyond `LANES` share lanes.
pub const LANES: usize = 8;

/// One lane of a pool's per-transaction counters and histograms (times in microseconds).
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct Lane {
    pub xact_count: AtomicU64,
    pub query_count: AtomicU64,
    pub server_assignment_count: AtomicU64,
    pub bytes_received: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub xact_time_us: AtomicU64,
    pub query_time_us: AtomicU64,
    pub wait_time_us: AtomicU64,
    /// Parses of named statements from clients (with max_prepared_statements > 0).
    pub client_parse_count: AtomicU64,
    /// Parses of statements pgcarpool sent to servers under its internal names.
    pub server_parse_count: AtomicU64,
    /// Binds of named statements from clients (with max_prepared_statements > 0).
    pub bind_count: AtomicU64,
    /// Transactions the fast path served whole (`client::fast`), and those it began and
    /// handed over to the full path.
    pub fast_xact_count: AtomicU64,
    pub fast_handovers: AtomicU64,
    /// Query durations (microseconds).
    pub query_hist: Histogram,
    /// Transaction durations (microseconds).
    pub xact_hist: Histogram,
    /// Waits for a server (microseconds).
    pub wait_hist: Histogram,
}

/// Per-pool totals, as PgBouncer's SHOW STATS reports them (times in microseconds).
#[derive(Debug, Default)]
pub struct PoolStats {
    /// What each transaction adds to, per worker.
    lanes: [Lane; LANES],
    /// Clients currently pinned to a server (temp tables, LISTEN, advisory locks, WITH HOLD).
    pub pinned_clients: AtomicU64,
    /// Pinned clients by reason (`server::sync::PIN_REASONS` order).
    pub pins: [AtomicU64; 5],
    /// Servers moved to another worker's runtime at checkout (see `crate::workers`).
    pub server_moves: AtomicU64,
    /// Servers of the pool logged in to (each a new PostgreSQL backend).
    pub server_logins: AtomicU64,
    /// Takings of the pool's mutex that had to wait for another thread, and how long they
    /// waited in all (nanoseconds).
    pub lock_waits: AtomicU64,
    pub lock_wait_ns: AtomicU64,
    /// The last completed `stats_period`.
    period: Mutex<Period>,
}

/// A copy of the totals at one moment.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    pub xact_count: u64,
    pub query_count: u64,
    pub server_assignment_count: u64,
    pub bytes_received: u64,
    pub bytes_sent: u64,
    pub xact_time_us: u64,
    pub query_time_us: u64,
    pub wait_time_us: u64,
    pub client_parse_count: u64,
    pub server_parse_count: u64,
    pub bind_count: u64,
}

impl Totals {
    pub fn add(&mut self, o: &Totals) {
        self.xact_count += o.xact_count;
        self.query_count += o.query_count;
        self.server_assignment_count += o.server_assignment_count;
        self.bytes_received += o.bytes_received;
        self.bytes_sent += o.bytes_sent;
        self.xact_time_us += o.xact_time_us;
        self.query_time_us += o.query_time_us;
        self.wait_time_us += o.wait_time_us;
        self.client_parse_count += o.client_parse_count;
        self.server_parse_count += o.server_parse_count;
        self.bind_count += o.bind_count;
    }

    fn minus(&self, o: &Totals) -> Totals {
        Totals {
            xact_count: self.xact_count.saturating_sub(o.xact_count),
            query_count: self.query_count.saturating_sub(o.query_count),
            server_assignment_count: self
                .server_assignment_count
                .saturating_sub(o.server_assignment_count),
            bytes_received: self.bytes_received.saturating_sub(o.bytes_received),
            bytes_sent: self.bytes_sent.saturating_sub(o.bytes_sent),
            xact_time_us: self.xact_time_us.saturating_sub(o.xact_time_us),
            query_time_us: self.query_time_us.saturating_sub(o.query_time_us),
            wait_time_us: self.wait_time_us.saturating_sub(o.wait_time_us),
            client_parse_count: self.client_parse_count.saturating_sub(o.client_parse_count),
            server_parse_count: self.server_parse_count.saturating_sub(o.server_parse_count),
            bind_count: self.bind_count.saturating_sub(o.bind_count),
        }
    }
}

/// What changed during one `stats_period` (summed over pools for a database's averages).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Period {
    /// Totals at the end of the period.
    at_end: Totals,
    pub delta: Totals,
    pub secs: f64,
}

impl Period {
    pub fn add(&mut self, o: &Period) {
        self.delta.add(&o.delta);
        self.secs = self.secs.max(o.secs);
    }

    /// PgBouncer's averages: counts (parses and binds too) and bytes per second; times per
    /// transaction, per query and per server assignment (microseconds).
    pub fn averages(&self) -> Averages {
        let d = &self.delta;
        let per_sec = |n: u64| {
            if self.secs > 0.0 {
                (n as f64 / self.secs) as u64
            } else {
                0
            }
        };
        let per = |t: u64, n: u64| t.checked_div(n).unwrap_or(0);
        Totals {
            xact_count: per_sec(d.xact_count),
            query_count: per_sec(d.query_count),
            server_assignment_count: per_sec(d.server_assignment_count),
            bytes_received: per_sec(d.bytes_received),
            bytes_sent: per_sec(d.bytes_sent),
            xact_time_us: per(d.xact_time_us, d.xact_count),
            query_time_us: per(d.query_time_us, d.query_count),
            wait_time_us: per(d.wait_time_us, d.server_assignment_count),
            client_parse_count: per_sec(d.client_parse_count),
            server_parse_count: per_sec(d.server_parse_count),
            bind_count: per_sec(d.bind_count),
        }
    }
}

/// Averages over the last `stats_period` (see [`Period::averages`]): the same fields as
/// the totals, as rates per second and mean times.
pub type Averages = Totals;

impl PoolStats {
    /// Adding 0 writes nothing: the counters are shared by every worker, and a write takes
    /// the cache line from the others (parses and binds of a simple query, say).
    #[inline]
    pub fn add(counter: &AtomicU64, n: u64) {
        if n != 0 {
            counter.fetch_add(n, Ordering::Relaxed);
        }
    }
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    /// The lane the worker of index `worker` adds to.
    #[inline]
    pub fn lane(&self, worker: usize) -> &Lane {
        &self.lanes[worker % LANES]
    }

    /// Transactions the fast path served whole, and those it handed over (all lanes).
    pub fn fast(&self) -> (u64, u64) {
        self.lanes.iter().fold((0, 0), |(x, h), l| {
            (
                x + Self::get(&l.fast_xact_count),
                h + Self::get(&l.fast_handovers),
            )
        })
    }

    /// The totals now.
    pub fn totals(&self) -> Totals {
        let mut t = Totals::default();
        for l in &self.lanes {
            t.add(&Totals {
                xact_count: Self::get(&l.xact_count),
                query_count: Self::get(&l.query_count),
                server_assignment_count: Self::get(&l.server_assignment_count),
                bytes_received: Self::get(&l.bytes_received),
                bytes_sent: Self::get(&l.bytes_sent),
                xact_time_us: Self::get(&l.xact_time_us),
                query_time_us: Self::get(&l.query_time_us),
                wait_time_us: Self::get(&l.wait_time_us),
                client_parse_count: Self::get(&l.client_parse_count),
                server_parse_count: Self::get(&l.server_parse_count),
                bind_count: Self::get(&l.bind_count),
            });
        }
        t
    }

    /// One of the histograms (`pick`), all lanes folded.
    pub fn hist(&self, pick: fn(&Lane) -> &Histogram) -> histogram::HistSnapshot {
        let mut h = histogram::HistSnapshot::default();
        for l in &self.lanes {
            h.add(&pick(l).snapshot());
        }
        h
    }

    /// The last completed period.
    pub fn period(&self) -> Period {
        *self.period.locked()
    }

    /// End a period of `secs` seconds: what changed since the last call becomes the period.
    pub fn roll_period(&self, secs: f64) {
        let now = self.totals();
        let mut p = self.period.locked();
        let delta = now.minus(&p.at_end);
        *p = Period {
            at_end: now,
            delta,
            secs,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn period_averages_are_rates_and_per_item_times() {
        let s = PoolStats::default();
        // Two workers' lanes, folded when read.
        let (a, b) = (s.lane(0), s.lane(LANES + 1));
        PoolStats::add(&a.xact_count, 4);
        PoolStats::add(&b.xact_count, 6);
        PoolStats::add(&a.query_count, 20);
        PoolStats::add(&b.xact_time_us, 1000);
        PoolStats::add(&a.query_time_us, 400);
        PoolStats::add(&b.server_assignment_count, 10);
        PoolStats::add(&a.wait_time_us, 50);
        PoolStats::add(&b.bytes_received, 500);
        a.query_hist.record_n(10, 2);
        b.query_hist.record_n(10, 3);
        assert_eq!(s.hist(|l| &l.query_hist).count, 5);
        s.roll_period(2.0);
        let a = s.period().averages();
        assert_eq!(a.xact_count, 5);
        assert_eq!(a.query_count, 10);
        assert_eq!(a.bytes_received, 250);
        assert_eq!(a.xact_time_us, 100);
        assert_eq!(a.query_time_us, 20);
        assert_eq!(a.wait_time_us, 5);
        // Nothing new: the next period is all zero.
        s.roll_period(2.0);
        assert_eq!(s.period().averages(), Averages::default());
    }
}
