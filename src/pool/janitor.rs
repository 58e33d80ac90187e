//! Periodic pool upkeep: idle and lifetime limits, min_pool_size, waking waiters, room
//! under limits shared by several pools; each `stats_period`, the pools' averages.
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::Pools;
use crate::stats::Period;

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
        for pool in pools.every() {
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

/// Every `stats_period`, roll every pool's period (and log the averages with `log_stats`)
/// until `stop` is cancelled. `settings()`: (stats_period, log_stats), read each time.
pub async fn run_periods(
    pools: Arc<Pools>,
    stop: CancellationToken,
    settings: impl Fn() -> Option<(Duration, bool)> + Send + 'static,
) {
    let mut last = Instant::now();
    loop {
        let Some((period, _)) = settings() else {
            return;
        };
        tokio::select! {
            _ = tokio::time::sleep(period.max(Duration::from_secs(1))) => {}
            _ = stop.cancelled() => return,
        }
        let secs = last.elapsed().as_secs_f64();
        last = Instant::now();
        let pools = pools.all();
        for p in &pools {
            p.stats.roll_period(secs);
        }
        if settings().is_some_and(|(_, log)| log) {
            let mut p = Period::default();
            pools.iter().for_each(|pool| p.add(&pool.stats.period()));
            let a = p.averages();
            tracing::info!(
                "stats: {} xacts/s, {} queries/s, in {} B/s, out {} B/s, xact {} us, query {} us, wait {} us",
                a.xact_count,
                a.query_count,
                a.bytes_received,
                a.bytes_sent,
                a.xact_time_us,
                a.query_time_us,
                a.wait_time_us
            );
        }
    }
}
