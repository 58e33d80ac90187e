//! Composition root: makes the `Shared` state, binds and starts the listeners (accept.rs),
//! the janitor, DNS refresh and metrics; the handle a test or main holds.
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::config::settings::SettingChange;
use crate::net::listen;
use crate::pool::janitor;
use crate::shared::Shared;

/// A running pooler (in-process: tests start one per test on port 0).
pub struct AppHandle {
    /// The bound TCP address of the first listener (port 0 in the config → a free port).
    pub addr: SocketAddr,
    pub shared: Arc<Shared>,
}

/// Start a pooler with `config` on the current tokio runtime.
pub async fn start(config: Config) -> std::io::Result<AppHandle> {
    start_with(config, Start::Fresh).await
}

/// How a pooler comes up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Bind the listening sockets as configured.
    Fresh,
    /// Online restart (`-R`): share the port with a running pgcarpool (SO_REUSEPORT), draw
    /// its new connections here, and rename a new Unix socket over its one.
    Takeover,
}

/// Start a pooler with `config` on the current tokio runtime, fresh or taking over.
pub async fn start_with(config: Config, how: Start) -> std::io::Result<AppHandle> {
    let listeners = listen::bind(&config.settings, how == Start::Takeover)?;
    start_on(config, listeners).await
}

/// Start a pooler with `config` on the current tokio runtime, accepting on `listeners`
/// (bound by `listen::bind` before a fork, or passed by systemd).
pub async fn start_on(config: Config, listeners: Vec<listen::Bound>) -> std::io::Result<AppHandle> {
    for name in config.settings.unimplemented_in_use() {
        let why = crate::config::settings::no_effect_reason(name).unwrap_or("");
        tracing::warn!("setting {name} has no effect in pgcarpool: {why}");
    }
    config.log_hba_warnings();
    // As PgBouncer: a TLS configuration that cannot be used stops the start.
    let tls = crate::net::tls::Tls::build(&config.settings, None)
        .map_err(|e| std::io::Error::other(format!("TLS setup failed: {e}")))?;
    let shared = Shared::new(config);
    shared.set_tls(tls);
    shared
        .scram()
        .set_iterations(shared.config().settings.scram_iterations);
    shared.create_forced_user_pools();
    shared.apply_peers();
    // peers_dns: the first members (and this instance's id) before any client gets a key.
    let mut members = None;
    let first = shared.refresh_peers(&mut members);
    if tokio::time::timeout(Duration::from_secs(5), first)
        .await
        .is_err()
    {
        tracing::warn!("peers_dns: no answer within 5 s; trying again in the background");
    }
    let addr = listeners
        .iter()
        .find_map(|l| l.local_tcp_addr())
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
    let workers = start_workers(&shared)?;
    // A descriptor of each listening socket for SHOW FDS (an online restart takes them).
    shared.restart().keep_sockets(
        listeners
            .iter()
            .map(listen::Bound::try_clone)
            .collect::<std::io::Result<_>>()?,
    );
    shared
        .restart()
        .set_socket_buffer(shared.config().settings.tcp_socket_buffer);
    // Every worker accepts on every listening socket (its own descriptor of it).
    for l in listeners {
        tracing::info!("listening on {l}");
        // TCP listeners close when a shutdown begins (`listeners` tracks them); a Unix
        // socket stays until the last client has left, for the console (PgBouncer's
        // SHUTDOWN WAIT_FOR_*: `psql -h /socket/dir pgbouncer` still gets in).
        let tcp = matches!(l, listen::Bound::Tcp(_));
        type Accept = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;
        let track = |f: Accept| -> Accept {
            if tcp {
                Box::pin(shared.listeners().track_future(f))
            } else {
                f
            }
        };
        for w in 1..workers.len() {
            let clone = l.try_clone()?;
            let s2 = shared.clone();
            let accept = track(Box::pin(async move {
                match clone.attach() {
                    Ok(l) => crate::accept::accept_loop(l, s2).await,
                    Err(e) => tracing::warn!("worker {w} cannot listen: {e}"),
                }
            }));
            workers
                .handle(w)
                .spawn(shared.tracker().track_future(accept));
        }
        let accept = track(Box::pin(crate::accept::accept_loop(
            l.attach()?,
            shared.clone(),
        )));
        shared.tracker().spawn(accept);
    }
    shared.listeners().close();
    let weak = Arc::downgrade(&shared);
    shared.tracker().spawn(janitor::run(
        shared.pools().clone(),
        shared.stop_background().clone(),
        move |db| weak.upgrade()?.config().pool_idle_timeout_for(db),
    ));
    let weak = Arc::downgrade(&shared);
    shared.tracker().spawn(janitor::run_periods(
        shared.pools().clone(),
        shared.stop_background().clone(),
        move || {
            let s = &weak.upgrade()?.config().settings;
            Some((s.stats_period, s.log_stats))
        },
    ));
    shared.tracker().spawn(run_dns(shared.clone(), members));
    if let Some(metrics) = crate::admin::metrics::bind(&shared.config().settings).await? {
        shared
            .tracker()
            .spawn(crate::admin::metrics::serve(metrics, shared.clone()));
    }
    Ok(AppHandle { addr, shared })
}

/// Start the worker threads (`workers`) and, with more than one, the look at their load.
fn start_workers(shared: &Arc<Shared>) -> std::io::Result<&crate::workers::Workers> {
    let n = crate::workers::count(shared.config().settings.workers);
    let spread_at = shared.config().settings.worker_spread_load.min(100) * 10;
    let _ = shared.set_workers(crate::workers::Workers::start(n, spread_at)?);
    if n > 1 {
        watch_load(shared);
    }
    Ok(shared.workers().expect("just set"))
}

/// Which workers take clients, from their load: a look every `LOAD_PERIOD` until the
/// pooler is gone (workers.rs).
fn watch_load(shared: &Arc<Shared>) {
    let weak = Arc::downgrade(shared);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(crate::workers::LOAD_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut seen = None;
        loop {
            tick.tick().await;
            let Some(shared) = weak.upgrade() else { return };
            match shared.workers() {
                Some(ws) if !ws.stopped() => {
                    let spread_at = shared.config().settings.worker_spread_load.min(100);
                    ws.look(&mut seen, spread_at * 10);
                }
                _ => return,
            }
        }
    });
}

/// Keep the `peers_dns` members current: every `dns_max_ttl` (at least 1 s) after the
/// first resolution (done by `start_on` before accepting clients).
async fn run_dns(shared: Arc<Shared>, mut last: Option<Vec<SocketAddr>>) {
    let stop = shared.stop_background().clone();
    loop {
        let period = shared
            .config()
            .settings
            .dns_max_ttl
            .max(Duration::from_secs(1));
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
        shared.refresh_peers(&mut last).await;
    }
}

impl AppHandle {
    /// Apply a new config as SIGHUP would.
    pub fn reload(&self, config: Config) -> Vec<SettingChange> {
        self.shared.reload(config)
    }

    /// Immediate shutdown (SIGQUIT), waiting (bounded) for tasks to end.
    pub async fn shutdown(self) {
        self.shared.shutdown_now();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.shared.tracker().wait()).await;
    }
}

impl Drop for AppHandle {
    /// The worker threads end with the handle (after `shutdown`, or at the end of a test).
    fn drop(&mut self) {
        if let Some(ws) = self.shared.workers() {
            ws.stop();
        }
    }
}
