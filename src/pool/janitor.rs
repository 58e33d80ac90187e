//! Periodic pool upkeep: idle and lifetime limits, min_pool_size, waking waiters, room
//! under limits shared by several pools.
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Pools;

/// How often the janitor runs.
pub const PERIOD: Duration = Duration::from_millis(250);

/// Run until `stop` is cancelled. `idle_for(db)`: how long an unused pool of `db` is
/// kept (autodb_idle_timeout for databases of the `*` entry, pool_idle_timeout for the
/// others; None: kept).
pub async fn run(
    pools: Arc<Pools>,
    stop: CancellationToken,
    idle_for: impl Fn(&str) -> Option<Duration> + Send + 'static,
) {
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        for pool in pools.all() {
            pool.spawn_role_check();
            let missing = pool.maintain();
            for _ in 0..missing {
                let p = pool.clone();
                tokio::spawn(async move { p.warm_one().await });
            }
        }
        pools.balance_limits();
        free_unused(&pools, &idle_for);
    }
}

/// Free the pools unused past their idle timeout, and say so.
fn free_unused(pools: &Pools, idle_for: &impl Fn(&str) -> Option<Duration>) {
    let freed = pools.free_unused(idle_for);
    let mut dbs: Vec<&str> = Vec::new();
    for (db, user) in &freed {
        tracing::info!(db = %db, user = %user, "pool freed: unused for its idle timeout");
        if !dbs.contains(&db.as_str()) && pools.all().iter().all(|p| &p.db != db) {
            dbs.push(db);
        }
    }
    for db in dbs {
        // PgBouncer's words when an auto-database goes.
        tracing::warn!(
            "dropping database '{db}' as it does not exist anymore or inactive auto-database"
        );
    }
}
