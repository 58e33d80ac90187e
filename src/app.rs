//! Composition root: `Shared` state, listeners, janitor, reload and shutdown.
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::auth::cache::ScramCache;
use crate::client::registry::Registry;
use crate::config::settings::SettingChange;
use crate::config::{Config, DatabaseEntry};
use crate::net::listen;
use crate::pool::{PoolSettings, Pools, janitor};
use crate::server::roles::SessionAttrs;
use crate::server::{Credential, HostList, ServerAddr, ServerTarget};

/// Everything the tasks of one pooler share. No globals: many poolers can run in one process.
pub struct Shared {
    pub config: ArcSwap<Config>,
    pub pools: Arc<Pools>,
    pub clients: Arc<Registry>,
    pub scram: Arc<ScramCache>,
    /// The secrets auth_query found lately, per (database, user).
    pub dynamic_users: crate::auth::dynamic::DynamicUsers,
    /// Prepared statements by key, shared by all pools.
    pub statements: Arc<crate::statements::StatementRegistry>,
    /// Cancelled to stop accepting new clients.
    pub stop_accepting: CancellationToken,
    /// Cancelled by SHUTDOWN WAIT_FOR_SERVERS: a client that needs a server for a new
    /// transaction (or waits for one) is let go ("server shutting down").
    pub stop_transactions: CancellationToken,
    /// Cancelled to make every client leave (immediate shutdown); each client's kill token is a child.
    pub stop_clients: CancellationToken,
    /// Cancelled to stop background tasks (janitor).
    pub stop_background: CancellationToken,
    pub tracker: TaskTracker,
    /// The accept loops (also in `tracker`): empty once every listener is closed and
    /// the connections queued on it are accepted.
    pub listeners: TaskTracker,
    /// Connected client sockets (for max_client_conn).
    pub client_conns: AtomicUsize,
    /// The connections still logging in (the oldest is dropped when a new one finds the
    /// pooler full).
    pub pending_logins: crate::client::logins::PendingLogins,
    /// Clients per database and per user (console included).
    pub client_counts: Arc<crate::client::counts::ClientCounts>,
    /// Console state: DISABLE'd and PAUSE'd databases.
    pub admin: crate::admin::AdminState,
    /// This instance's peer id and its peers (cancel requests for their clients).
    pub peers: crate::peers::Peers,
    /// The worker runtimes (set once by `start`).
    pub workers: std::sync::OnceLock<crate::workers::Workers>,
    /// Online restart: SUSPEND, the listening sockets for SHOW FDS, the client handover.
    pub restart: crate::takeover::Restart,
    /// TLS towards clients and servers, as built from the config in force.
    pub tls: ArcSwap<crate::net::tls::Tls>,
}

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
    shared.tls.store(Arc::new(tls));
    shared
        .scram
        .set_iterations(shared.config.load().settings.scram_iterations);
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
    let n = crate::workers::count(shared.config.load().settings.workers);
    let _ = shared.workers.set(crate::workers::Workers::start(n)?);
    let workers = shared.workers.get().expect("just set");
    // A descriptor of each listening socket for SHOW FDS (an online restart takes them).
    shared.restart.keep_sockets(
        listeners
            .iter()
            .map(listen::Bound::try_clone)
            .collect::<std::io::Result<_>>()?,
    );
    shared
        .restart
        .set_socket_buffer(shared.config.load().settings.tcp_socket_buffer);
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
                Box::pin(shared.listeners.track_future(f))
            } else {
                f
            }
        };
        for w in 1..workers.len() {
            let clone = l.try_clone()?;
            let s2 = shared.clone();
            let accept = track(Box::pin(async move {
                match clone.attach() {
                    Ok(l) => crate::client::accept::accept_loop(l, s2).await,
                    Err(e) => tracing::warn!("worker {w} cannot listen: {e}"),
                }
            }));
            workers.handle(w).spawn(shared.tracker.track_future(accept));
        }
        let accept = track(Box::pin(crate::client::accept::accept_loop(
            l.attach()?,
            shared.clone(),
        )));
        shared.tracker.spawn(accept);
    }
    shared.listeners.close();
    let weak = Arc::downgrade(&shared);
    shared.tracker.spawn(janitor::run(
        shared.pools.clone(),
        shared.stop_background.clone(),
        move |db| weak.upgrade()?.config.load().pool_idle_timeout_for(db),
    ));
    let weak = Arc::downgrade(&shared);
    shared.tracker.spawn(janitor::run_periods(
        shared.pools.clone(),
        shared.stop_background.clone(),
        move || {
            let s = &weak.upgrade()?.config.load().settings;
            Some((s.stats_period, s.log_stats))
        },
    ));
    shared.tracker.spawn(run_dns(shared.clone(), members));
    if let Some(metrics) = crate::admin::metrics::bind(&shared.config.load().settings).await? {
        shared
            .tracker
            .spawn(crate::admin::metrics::serve(metrics, shared.clone()));
    }
    Ok(AppHandle { addr, shared })
}

/// Keep the `peers_dns` members current: every `dns_max_ttl` (at least 1 s) after the
/// first resolution (done by `start_on` before accepting clients).
async fn run_dns(shared: Arc<Shared>, mut last: Option<Vec<SocketAddr>>) {
    let stop = shared.stop_background.clone();
    loop {
        let period = shared
            .config
            .load()
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

/// Resolve the settings of the pool of `server_user` (the user its servers log in as: the
/// database's forced `user=`, the client's user, or the auth_user) from the config
/// (per user > per database > global).
pub fn pool_settings(
    cfg: &Config,
    entry: &DatabaseEntry,
    server_user: &str,
    credential: Credential,
    shared: &Shared,
) -> PoolSettings {
    let s = &cfg.settings;
    let db = entry.name.as_str();
    let user = server_user.to_string();
    let mut startup_params = Vec::new();
    for (k, v) in [
        ("client_encoding", &entry.client_encoding),
        ("DateStyle", &entry.datestyle),
        ("TimeZone", &entry.timezone),
        ("application_name", &entry.application_name),
    ] {
        if let Some(v) = v {
            startup_params.push((k.to_string(), v.clone()));
        }
    }
    let port = if entry.port == 0 { 5432 } else { entry.port };
    // host=a,b,… port=p,q,…: a list of hosts (load_balance_hosts chooses among them,
    // target_session_attrs by role).
    let hosts: Vec<ServerAddr> = entry
        .host_ports()
        .into_iter()
        .map(|(h, p)| ServerAddr::new(h, p))
        .collect();
    PoolSettings {
        mode: cfg.pool_mode_for(db, &user),
        pool_size: cfg.pool_size_for(db, &user),
        min_pool_size: cfg.min_pool_size_for(db),
        reserve_pool_size: cfg.reserve_pool_for(db, &user),
        reserve_pool_timeout: s.reserve_pool_timeout,
        max_db_connections: cfg.max_db_connections_for(db),
        max_user_connections: cfg.max_user_connections_for(&user),
        server_lifetime: cfg.server_lifetime_for(db),
        server_idle_timeout: s.server_idle_timeout,
        server_connect_timeout: s.server_connect_timeout,
        server_login_retry: s.server_login_retry,
        server_check_delay: s.server_check_delay,
        server_check_query: s.server_check().map(str::to_string),
        server_reset_query: s.server_reset_query.clone(),
        server_reset_query_always: s.server_reset_query_always,
        server_round_robin: s.server_round_robin,
        cancel_wait_timeout: s.cancel_wait_timeout,
        query_wait_timeout: cfg.query_wait_timeout_for(db, &user),
        max_prepared_statements: s.max_prepared_statements,
        pin_error: entry.pin_mode.as_deref().unwrap_or(&s.pin_mode) == "error",
        pin_pool_size: s.pin_pool_size,
        role_check_interval: s.server_role_check_interval,
        target: ServerTarget {
            addr: hosts
                .first()
                .cloned()
                .unwrap_or_else(|| ServerAddr::new(None, port)),
            hosts: HostList::new(
                hosts,
                entry.load_balance_hosts.as_deref() != Some("disable"),
            )
            .with_roles(
                SessionAttrs::parse(entry.target_session_attrs.as_deref()),
                s.max_standby_lag,
            ),
            dbname: entry.dbname.clone().unwrap_or_else(|| db.to_string()),
            user,
            credential,
            startup_params,
            connect_query: entry.connect_query.clone(),
            scram_cache: Some(shared.scram.clone()),
            tls: shared.tls.load().connect.clone(),
            tcp: crate::net::sockopt::TcpTuning::from_settings(s),
            dns_nxdomain_ttl: s.dns_nxdomain_ttl,
        },
    }
}

impl Shared {
    /// Fresh state for `config`: no pools, no clients, nothing running yet.
    pub fn new(config: Config) -> Arc<Shared> {
        let statements = crate::statements::StatementRegistry::with_max_bytes(
            config.settings.statement_registry_size,
        );
        Arc::new(Shared {
            config: ArcSwap::from_pointee(config),
            pools: Arc::new(Pools::default()),
            clients: Arc::new(Registry::default()),
            scram: Arc::new(ScramCache::new()),
            dynamic_users: Default::default(),
            statements: Arc::new(statements),
            stop_accepting: CancellationToken::new(),
            stop_transactions: CancellationToken::new(),
            stop_clients: CancellationToken::new(),
            stop_background: CancellationToken::new(),
            tracker: TaskTracker::new(),
            listeners: TaskTracker::new(),
            client_conns: AtomicUsize::new(0),
            pending_logins: Default::default(),
            client_counts: Default::default(),
            admin: crate::admin::AdminState::default(),
            peers: Default::default(),
            workers: std::sync::OnceLock::new(),
            restart: Default::default(),
            tls: ArcSwap::from_pointee(crate::net::tls::Tls::default()),
        })
    }

    /// RELOAD / SIGHUP: read the config file again and apply it. A file that does not
    /// load changes nothing (the error is returned), nor does one that defines no database
    /// at all while the running config has some (an empty or half-written file caught
    /// mid-write must not turn a running pooler into an outage). The logfile is reopened
    /// either way (log rotation), as PgBouncer does.
    pub fn reload_from_file(&self) -> Result<Vec<SettingChange>, String> {
        crate::service::reloading();
        let old = self.config.load_full();
        // conffile: another file for this reload when the running config names one.
        let path = old
            .settings
            .conffile
            .clone()
            .unwrap_or_else(|| old.path.clone());
        let result = match crate::config::load(&path) {
            Ok(c)
                if c.databases.is_empty()
                    && c.fallback.is_none()
                    && (!old.databases.is_empty() || old.fallback.is_some()) =>
            {
                Err(format!(
                    "{} defines no databases (empty or half-written?)",
                    path.display()
                ))
            }
            Ok(c) => Ok(self.reload(c)),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = &result {
            tracing::error!("reload failed, keeping the old configuration: {e}");
            crate::logging::reopen(&old.settings);
        }
        crate::service::ready(match &result {
            Ok(_) => "configuration reloaded",
            Err(_) => "reload failed, old configuration kept",
        });
        result
    }

    /// Apply a new config (RELOAD / SIGHUP): pools get new sizes and timeouts at once;
    /// settings that need a restart keep their old values. Each changed setting is logged
    /// (name, old -> new) and returned, so the console can tell its user.
    pub fn reload(&self, new: Config) -> Vec<SettingChange> {
        let old = self.config.load_full();
        let mut new = new;
        let changes = old.settings.changes(&new.settings);
        for c in &changes {
            if c.reloadable {
                tracing::info!("reload: {c}");
            } else {
                tracing::warn!("reload: {c}");
                let _ = new.settings.load_value(c.name, &c.old);
            }
        }
        new.log_hba_warnings();
        let new = Arc::new(new);
        self.config.store(new.clone());
        // auth_query, auth_user or auth_dbname may have changed: ask again.
        self.dynamic_users.clear();
        crate::logging::reopen(&new.settings);
        // TLS is rebuilt when a setting or a file it names changed; a side that fails to
        // build keeps its old configuration (PgBouncer's words).
        match crate::net::tls::Tls::build(&new.settings, Some(&self.tls.load())) {
            Ok(tls) => self.tls.store(Arc::new(tls)),
            Err(e) => tracing::error!(
                "TLS configuration could not be reloaded, keeping old configuration: {e}"
            ),
        }
        if old.settings.tcp_socket_buffer != new.settings.tcp_socket_buffer {
            self.restart
                .set_socket_buffer(new.settings.tcp_socket_buffer);
        }
        if (old.settings.tcp_defer_accept != 0) != (new.settings.tcp_defer_accept != 0) {
            self.restart
                .set_defer_accept(new.settings.tcp_defer_accept != 0);
        }
        self.scram.set_iterations(new.settings.scram_iterations);
        self.statements
            .set_max_bytes(new.settings.statement_registry_size);
        self.pools.reconcile(|p| {
            let entry = new.database(&p.db)?;
            let old_settings = p.settings();
            // The password may have changed in auth_file; a SCRAM secret keeps what was learned.
            let learned = Some(old_settings.target.credential.clone());
            let cred = crate::client::credential_for(&new, &entry, &p.user, learned);
            Some(pool_settings(&new, &entry, &p.user, cred, self))
        });
        self.create_forced_user_pools();
        self.apply_peers();
        tracing::info!(
            "configuration reloaded ({} settings changed, {} need a restart)",
            changes.len(),
            changes.iter().filter(|c| !c.reloadable).count()
        );
        changes
    }

    /// As PgBouncer, a database with a forced `user=` has its pool from the start (not
    /// from its first client), so its `min_pool_size` servers are opened at once.
    pub fn create_forced_user_pools(&self) {
        let cfg = self.config.load();
        for entry in cfg.databases.values() {
            let Some(user) = &entry.user else { continue };
            self.pools.get_or_create(&entry.name, user, || {
                let cred = crate::client::credential_for(&cfg, entry, user, None);
                pool_settings(&cfg, entry, user, cred, self)
            });
        }
    }

    /// Peer table and own peer id from the config (and the DNS members last found).
    pub fn apply_peers(&self) {
        self.peers.apply(&self.config.load());
        self.clients.set_peer_id(self.peers.own_id());
    }

    /// Resolve `peers_dns` once and apply what changed since `last` (`peers::refresh`);
    /// new client keys name this instance's id.
    pub async fn refresh_peers(&self, last: &mut Option<Vec<SocketAddr>>) {
        let cfg = self.config.load_full();
        if crate::peers::refresh(&self.peers, &cfg, last).await {
            self.clients.set_peer_id(self.peers.own_id());
        }
    }

    /// A shutdown (signal or console SHUTDOWN) has begun.
    pub fn shutting_down(&self) -> bool {
        self.stop_accepting.is_cancelled()
    }

    /// Stop accepting and make every client leave now; close idle servers.
    pub fn shutdown_now(&self) {
        if !self.stop_clients.is_cancelled() {
            crate::service::stopping("shutting down");
        }
        self.stop_accepting.cancel();
        self.stop_clients.cancel();
        self.stop_background.cancel();
        for p in self.pools.all() {
            p.close_idle("pooler is shutting down");
        }
        self.tracker.close();
    }

    pub(crate) fn client_opened(&self) -> u64 {
        self.client_conns.fetch_add(1, Ordering::Relaxed);
        self.pools.socket_ids.next()
    }

    /// A client placed on worker `w` is gone.
    pub(crate) fn client_closed(&self, w: usize) {
        self.client_conns.fetch_sub(1, Ordering::Relaxed);
        if let Some(ws) = self.workers.get() {
            ws.left(w);
        }
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
        let _ = tokio::time::timeout(Duration::from_secs(5), self.shared.tracker.wait()).await;
    }
}

impl Drop for AppHandle {
    /// The worker threads end with the handle (after `shutdown`, or at the end of a test).
    fn drop(&mut self) {
        if let Some(ws) = self.shared.workers.get() {
            ws.stop();
        }
    }
}

impl Shared {
    /// PAUSE for every pool (console PAUSE and SIGUSR1 alike; pools made later start
    /// paused): new work waits; returns once no server is in use.
    pub async fn pause_all(&self) {
        self.admin.set_paused(None, true);
        for p in self.pools.all() {
            p.pause();
        }
        self.wait_servers_released().await;
    }

    /// RESUME every pool (console RESUME and SIGUSR2 alike), whichever way it was paused.
    pub fn resume_all(&self) {
        self.admin.set_paused(None, false);
        for p in self.pools.all() {
            p.resume();
        }
    }

    /// Wait until no pool has a server checked out.
    pub async fn wait_servers_released(&self) {
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        loop {
            tick.tick().await;
            if self.pools.all().iter().all(|p| p.counts().in_use() == 0) {
                return;
            }
        }
    }

    /// Stop accepting; return once every listener is closed and the connections that
    /// were queued on it are clients (counted in `client_conns`).
    pub async fn stop_listening(&self) {
        self.stop_accepting.cancel();
        self.listeners.wait().await;
    }

    /// SHUTDOWN WAIT_FOR_CLIENTS (SIGTERM): stop accepting, wait for every client to leave.
    pub async fn shutdown_wait_for_clients(&self) {
        crate::service::stopping("shutting down once every client has left");
        self.stop_listening().await;
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        while self.client_conns.load(Ordering::Relaxed) > 0 {
            tick.tick().await;
        }
        self.shutdown_now();
    }

    /// SHUTDOWN WAIT_FOR_SERVERS (SIGINT): stop accepting, let running transactions finish;
    /// a client that starts a new one, or waits for a server, is let go ("server shutting
    /// down", as PgBouncer); then close everything.
    pub async fn shutdown_wait_for_servers(&self) {
        crate::service::stopping("shutting down once every server is released");
        self.stop_listening().await;
        self.stop_transactions.cancel();
        self.wait_servers_released().await;
        self.shutdown_now();
    }
}
