//! Counters bumped on the query path (atomics, no locks) and read by SHOW commands.
use std::sync::atomic::{AtomicU64, Ordering};

/// Per-pool totals, as PgBouncer's SHOW STATS reports them (times in microseconds).
#[derive(Debug, Default)]
pub struct PoolStats {
    pub xact_count: AtomicU64,
    pub query_count: AtomicU64,
    pub server_assignment_count: AtomicU64,
    pub bytes_received: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub xact_time_us: AtomicU64,
    pub query_time_us: AtomicU64,
    pub wait_time_us: AtomicU64,
    /// Clients currently pinned to a server (temp tables, LISTEN, advisory locks, WITH HOLD).
    pub pinned_clients: AtomicU64,
}

impl PoolStats {
    #[inline]
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
