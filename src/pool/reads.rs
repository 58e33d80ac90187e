//! Read routing's standby sub-pools: one per host of a `read_routing` entry's list, made
//! when a read first needs it. Its servers are of that host alone and serve while the host
//! is a standby within `max_standby_lag` (`target_session_attrs=standby` for one host); its
//! settings follow the entry's on reload, its limits are the entry's.
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Pool, PoolSettings};
use crate::lock::Locked;
use crate::server::roles::SessionAttrs;

/// Read routing's counts of one pool (the entry's): SHOW HOSTS, /metrics.
#[derive(Debug, Default)]
pub struct RoutingStats {
    /// Transactions judged reads that ran on the primary because no standby had replayed
    /// what the client had seen (or none was usable).
    pub reads_on_primary: AtomicU64,
    /// Reads a standby refused (25006) that ran again on the primary.
    pub refused_replays: AtomicU64,
    /// Per host: transactions judged reads that ran on it (grown on demand).
    reads: std::sync::Mutex<Vec<u64>>,
}

impl RoutingStats {
    pub fn add(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    /// A read ran on host `i`.
    pub fn read_on(&self, i: usize) {
        let mut r = self.reads.locked();
        if r.len() <= i {
            r.resize(i + 1, 0);
        }
        r[i] += 1;
    }

    /// Reads that ran on host `i`.
    pub fn reads_on(&self, i: usize) -> u64 {
        self.reads.locked().get(i).copied().unwrap_or(0)
    }
}

/// The settings of host `i`'s sub-pool, from the entry's.
fn read_settings(s: &PoolSettings, i: usize) -> PoolSettings {
    let mut r = s.clone();
    r.read_routing = false;
    // Servers are opened as reads need them: a host that is no standby now has none.
    r.min_pool_size = 0;
    r.target.hosts = s.target.hosts.only(i, SessionAttrs::Standby);
    r
}

impl Pool {
    /// Host `i`'s sub-pool, made now if it is not yet.
    pub fn read_pool(&self, i: usize) -> Arc<Pool> {
        let mut reads = self.reads.locked();
        if reads.len() <= i {
            reads.resize(i + 1, None);
        }
        reads[i]
            .get_or_insert_with(|| {
                let sub = self.sub_pool(read_settings(&self.settings(), i));
                if self.is_paused() {
                    sub.pause();
                }
                sub
            })
            .clone()
    }

    /// The sub-pools made so far, by host.
    pub fn read_pools(&self) -> Vec<(usize, Arc<Pool>)> {
        self.reads
            .locked()
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.clone().map(|p| (i, p)))
            .collect()
    }

    /// The servers by state, waiters and pause of the pool and its sub-pools together
    /// (SHOW POOLS: one row per entry and user, PgBouncer's columns).
    pub fn counts_with_reads(&self) -> super::pool::PoolCounts {
        let mut c = self.counts();
        for (_, p) in self.read_pools() {
            let r = p.counts();
            c.servers.add(&r.servers);
            c.used += r.used;
            c.total += r.total;
            c.waiting += r.waiting;
        }
        c
    }

    /// A number that grows with every read: the turn among standbys.
    pub fn read_turn(&self) -> usize {
        self.read_turn.fetch_add(1, Ordering::Relaxed)
    }

    /// The entry's settings changed (reload): its sub-pools follow; hosts the list no
    /// longer has lose theirs (their servers close as they come back).
    pub(super) fn update_reads(&self, s: &PoolSettings) {
        let subs = self.read_pools();
        if subs.is_empty() {
            return;
        }
        let n = s.target.hosts.addrs.len();
        for (i, p) in &subs {
            if *i < n && s.read_routing {
                p.update_settings(read_settings(s, *i));
            } else {
                p.reconnect();
            }
        }
        if !s.read_routing {
            self.reads.locked().clear();
        } else {
            self.reads.locked().truncate(n);
        }
    }
}
