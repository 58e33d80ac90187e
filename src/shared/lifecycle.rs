//! Operations on the whole pooler, for the console and the signals alike: RELOAD,
//! PAUSE/RESUME, the shutdowns, the peer table.
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::{Shared, credential_for, pool_settings};
use crate::config::Config;
use crate::config::settings::SettingChange;

impl Shared {
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
            let cred = credential_for(&new, &entry, &p.user, learned);
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
                let cred = credential_for(&cfg, entry, user, None);
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
        self.clients.kill_all();
        self.stop_background.cancel();
        for p in self.pools.all() {
            p.close_idle("pooler is shutting down");
        }
        self.tracker.close();
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
            if self.pools.all().iter().all(|p| p.in_use_with_reads() == 0) {
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
        while self.client_conns() > 0 {
            tick.tick().await;
        }
        self.shutdown_now();
    }

    /// SHUTDOWN WAIT_FOR_SERVERS (SIGINT): stop accepting, let running transactions finish
    /// (a block whose BEGIN pgcarpool answered too); a client that starts a new one, or
    /// waits for a server, is let go ("server shutting down", as PgBouncer); then close
    /// everything.
    pub async fn shutdown_wait_for_servers(&self) {
        crate::service::stopping("shutting down once every server is released");
        // Before the listeners close: a client that finds them closed finds new
        // transactions refused too.
        self.stop_transactions_now();
        self.stop_listening().await;
        // Blocks pgcarpool began hold no server yet: they may finish too.
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        loop {
            self.wait_servers_released().await;
            if super::deferred_blocks().load(std::sync::atomic::Ordering::Acquire) == 0 {
                break;
            }
            tick.tick().await;
        }
        self.shutdown_now();
    }
}
