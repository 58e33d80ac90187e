//! Pools of server connections, one per (database, user); reconciled on reload.
pub mod guard;
pub mod janitor;
pub mod listener;
pub mod login;
#[allow(clippy::module_inception)]
pub mod pool;
pub mod reads;
pub mod state;

use crate::lock::Locked;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub use guard::{PooledServer, Slot};
pub use pool::{CheckoutError, Pool, PoolSettings};
pub use state::{ServerCounts, ServerState};

/// A shared count of server connections against a limit (max_db_connections per database,
/// max_user_connections per user). 0 = unlimited.
#[derive(Debug, Default)]
pub struct Limit {
    inner: Mutex<LimitInner>,
}

#[derive(Debug, Default)]
struct LimitInner {
    max: usize,
    count: usize,
}

impl Limit {
    pub fn set_max(&self, max: usize) {
        self.inner.locked().max = max;
    }
    /// Take one unit if under the limit.
    pub fn try_acquire(&self) -> bool {
        let mut g = self.inner.locked();
        if g.max == 0 || g.count < g.max {
            g.count += 1;
            true
        } else {
            false
        }
    }
    pub fn release(&self) {
        let mut g = self.inner.locked();
        g.count = g.count.saturating_sub(1);
    }
    pub fn count(&self) -> usize {
        self.inner.locked().count
    }
    /// The limit is set and reached.
    pub fn is_full(&self) -> bool {
        let g = self.inner.locked();
        g.max != 0 && g.count >= g.max
    }
}

/// PgBouncer's socket ids: clients and servers draw from one sequence, from 1 (the `id`
/// column of SHOW CLIENTS, SERVERS and SOCKETS).
#[derive(Debug, Default)]
pub struct SocketIds(AtomicU64);

impl SocketIds {
    pub fn next(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// All pools, and the limits they share.
#[derive(Default)]
pub struct Pools {
    pools: Mutex<HashMap<(String, String), Arc<Pool>>>,
    /// Ids of clients and servers alike.
    pub socket_ids: Arc<SocketIds>,
    db_limits: Mutex<HashMap<String, Arc<Limit>>>,
    user_limits: Mutex<HashMap<String, Arc<Limit>>>,
}

impl Pools {
    /// The pool for (db, user), created with `settings` if new.
    pub fn get_or_create(
        &self,
        db: &str,
        user: &str,
        settings: impl FnOnce() -> PoolSettings,
    ) -> Arc<Pool> {
        let key = (db.to_string(), user.to_string());
        if let Some(p) = self.pools.locked().get(&key) {
            return p.clone();
        }
        let settings = settings();
        let db_limit = self.limit(&self.db_limits, db, settings.max_db_connections);
        let user_limit = self.limit(&self.user_limits, user, settings.max_user_connections);
        let mut pools = self.pools.locked();
        pools
            .entry(key)
            .or_insert_with(|| {
                Pool::new(
                    db,
                    user,
                    settings,
                    db_limit,
                    user_limit,
                    self.socket_ids.clone(),
                )
            })
            .clone()
    }

    fn limit(
        &self,
        map: &Mutex<HashMap<String, Arc<Limit>>>,
        name: &str,
        max: usize,
    ) -> Arc<Limit> {
        let mut m = map.locked();
        let l = m.entry(name.to_string()).or_default().clone();
        l.set_max(max);
        l
    }

    /// Every pool, for the janitor, SHOW commands and reload.
    pub fn all(&self) -> Vec<Arc<Pool>> {
        let mut v: Vec<_> = self.pools.locked().values().cloned().collect();
        v.sort_by(|a, b| (&a.db, &a.user).cmp(&(&b.db, &b.user)));
        v
    }

    /// Every pool and every read routing sub-pool: what the janitor keeps.
    pub fn every(&self) -> Vec<Arc<Pool>> {
        let mut v = self.all();
        let subs: Vec<Arc<Pool>> = v
            .iter()
            .flat_map(|p| p.read_pools().into_iter().map(|(_, s)| s))
            .collect();
        v.extend(subs);
        v
    }

    /// Pools of database `db` sharing its max_db_connections, and of user `user`.
    pub fn siblings(&self, db: &str, user: &str) -> Vec<Arc<Pool>> {
        self.pools
            .lock()
            .unwrap()
            .values()
            .filter(|p| p.db == db || p.user == user)
            .cloned()
            .collect()
    }

    /// Janitor work across pools: a pool whose clients wait because a shared
    /// max_db_connections / max_user_connections is reached gets the room freed elsewhere,
    /// closing an idle server of another pool under the same limit if need be.
    pub fn balance_limits(&self) {
        let all = self.all();
        for p in all.iter().filter(|p| p.starved()) {
            p.grant_waiters();
            if !p.starved() {
                continue;
            }
            let donor = all
                .iter()
                .find(|o| !Arc::ptr_eq(o, p) && p.shares_full_limit_with(o) && o.evict_idle());
            if donor.is_some() {
                p.grant_waiters();
            }
        }
    }

    /// Forget the pools nobody has used for their idle timeout (`idle_for(db)`: None =
    /// kept however long): no client holds them (the map's reference is the only one, and
    /// it is taken under the map's lock), no server, no waiter. Their statistics go with
    /// them, as PgBouncer's dropped auto-databases'. Returns the pools freed.
    pub fn free_unused(
        &self,
        idle_for: impl Fn(&str) -> Option<std::time::Duration>,
    ) -> Vec<(String, String)> {
        let now = std::time::Instant::now();
        let mut freed = Vec::new();
        let mut pools = self.pools.locked();
        pools.retain(|key, p| {
            let held = Arc::strong_count(p) > 1;
            let keep = match (p.unused_for(held, now), idle_for(&key.0)) {
                (Some(unused), Some(limit)) => unused < limit,
                _ => true,
            };
            if !keep {
                freed.push(key.clone());
            }
            keep
        });
        freed
    }

    /// Apply new settings (reload): `f` gives the settings for a pool, None = keep.
    pub fn reconcile(&self, f: impl Fn(&Pool) -> Option<PoolSettings>) {
        for p in self.all() {
            if let Some(s) = f(&p) {
                self.limit(&self.db_limits, &p.db, s.max_db_connections);
                self.limit(&self.user_limits, &p.user, s.max_user_connections);
                p.update_settings(s);
            }
        }
    }
}
