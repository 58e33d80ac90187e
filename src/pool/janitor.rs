//! Periodic pool upkeep: idle and lifetime limits, min_pool_size, waking waiters, room
//! under limits shared by several pools.
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Pools;

/// How often the janitor runs.
pub const PERIOD: Duration = Duration::from_millis(250);

/// Run until `stop` is cancelled.
pub async fn run(pools: Arc<Pools>, stop: CancellationToken) {
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
    }
}
