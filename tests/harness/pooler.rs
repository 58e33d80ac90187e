//! `TestPooler`: pgcarpool running in-process on 127.0.0.1 port 0, configured by a
//! pgbouncer.ini and userlist.txt the builder writes into a temp dir.
use std::fs;
use std::net::SocketAddr;
use std::path::Path;

use pgcarpool::app::{self, AppHandle};
use pgcarpool::config::Config;

use super::{TEST_ROLES, TempPostgres, dsn_for, free_port, try_connect};

/// The `[pgbouncer]` settings every test pooler starts from (`setting()` overrides).
/// Two workers whatever the machine: every test runs clients on two threads, with servers
/// moving between them (`crate::workers`).
const DEFAULT_SETTINGS: [(&str, &str); 7] = [
    ("workers", "2"),
    ("listen_addr", "127.0.0.1"),
    ("listen_port", "0"),
    ("unix_socket_dir", ""),
    ("auth_type", "md5"),
    ("auth_file", "userlist.txt"),
    ("admin_users", "postgres"),
];

/// What a test pooler's pgbouncer.ini and userlist.txt say. Made by
/// `TestPooler::builder(&pg)`; also what `TestPooler::reload_with` edits.
#[derive(Debug, Clone)]
pub struct TestPoolerBuilder {
    pg_port: u16,
    settings: Vec<(String, String)>,
    databases: Vec<(String, String)>,
    users: Vec<(String, String)>,
    auth_lines: Vec<String>,
    /// `[peers]` entries (peer id, connection string).
    peers: Vec<(String, String)>,
}

impl TestPoolerBuilder {
    /// Set a `[pgbouncer]` key (replaces the default or an earlier value).
    pub fn setting(mut self, key: &str, value: &str) -> Self {
        set(&mut self.settings, key, value);
        self
    }

    /// Add or replace a `[databases]` entry, e.g.
    /// `.database("app", &pg.db_entry("testdb"))`. With no entries at all, the ini has
    /// `* = host=127.0.0.1 port=<pg port>`.
    pub fn database(mut self, name: &str, entry: &str) -> Self {
        set(&mut self.databases, name, entry);
        self
    }

    /// Add or replace a `[users]` entry, e.g. `.user_entry("md5user", "pool_mode=session")`.
    pub fn user_entry(mut self, name: &str, entry: &str) -> Self {
        set(&mut self.users, name, entry);
        self
    }

    /// Add or replace a `[peers]` entry, e.g. `.peer(2, "host=127.0.0.3 port=6432")`.
    pub fn peer(mut self, id: u16, entry: &str) -> Self {
        set(&mut self.peers, &id.to_string(), entry);
        self
    }

    /// Append a line to userlist.txt, e.g. `.auth_file_line("\"alice\" \"secret\"")`.
    pub fn auth_file_line(mut self, line: &str) -> Self {
        self.auth_lines.push(line.to_string());
        self
    }

    /// The pgbouncer.ini text this builder writes.
    pub fn ini_text(&self) -> String {
        let mut ini = String::from("[databases]\n");
        if self.databases.is_empty() {
            ini.push_str(&format!("* = host=127.0.0.1 port={}\n", self.pg_port));
        }
        for (name, entry) in &self.databases {
            ini.push_str(&format!("{name} = {entry}\n"));
        }
        ini.push_str("\n[users]\n");
        for (name, entry) in &self.users {
            ini.push_str(&format!("{name} = {entry}\n"));
        }
        if !self.peers.is_empty() {
            ini.push_str("\n[peers]\n");
            for (id, entry) in &self.peers {
                ini.push_str(&format!("{id} = {entry}\n"));
            }
        }
        ini.push_str("\n[pgbouncer]\n");
        for (key, value) in &self.settings {
            if value.is_empty() {
                ini.push_str(&format!("{key} =\n"));
            } else {
                ini.push_str(&format!("{key} = {value}\n"));
            }
        }
        ini
    }

    /// The userlist.txt text this builder writes.
    pub fn auth_file_text(&self) -> String {
        let mut text = String::new();
        for line in &self.auth_lines {
            text.push_str(line);
            text.push('\n');
        }
        text
    }

    /// Write both files into `dir` and parse them as pgcarpool does.
    fn write_and_parse(&self, dir: &Path) -> Config {
        let ini = self.ini_text();
        let ini_path = dir.join("pgbouncer.ini");
        fs::write(&ini_path, &ini).expect("write pgbouncer.ini");
        fs::write(dir.join("userlist.txt"), self.auth_file_text()).expect("write userlist.txt");
        Config::from_str(&ini, &ini_path.to_string_lossy(), dir).unwrap_or_else(|e| {
            panic!("test pooler config rejected: {e}\n--- pgbouncer.ini\n{ini}")
        })
    }

    /// Set several `[pgbouncer]` keys, e.g. `.settings(&[("pool_mode", "session")])`.
    pub fn settings(self, pairs: &[(&str, &str)]) -> Self {
        pairs.iter().fold(self, |b, (k, v)| b.setting(k, v))
    }

    /// Start pgcarpool in-process with this configuration (on the current runtime).
    pub async fn start(self) -> TestPooler {
        let ini = self.ini_text();
        self.try_start()
            .await
            .unwrap_or_else(|e| panic!("start pgcarpool: {e}\n--- pgbouncer.ini\n{ini}"))
    }

    /// Start pgcarpool in-process; the error of `app::start` if it fails.
    pub async fn try_start(self) -> std::io::Result<TestPooler> {
        let dir = tempfile::Builder::new()
            .prefix("pgcarpool-pooler-")
            .tempdir()
            .expect("make pooler temp dir");
        let config = self.write_and_parse(dir.path());
        let handle = app::start(config).await?;
        Ok(TestPooler {
            spec: self,
            dir,
            handle: Some(handle),
        })
    }

    /// Start with setting `key` (a port with no port-0 form, e.g. `prometheus_port`) on a
    /// free port, picking another when something took it before pgcarpool bound it.
    /// Returns the pooler and the port.
    pub async fn start_with_free_port(self, key: &str) -> (TestPooler, u16) {
        let mut last = None;
        for _ in 0..10 {
            let port = free_port();
            match self
                .clone()
                .setting(key, &port.to_string())
                .try_start()
                .await
            {
                Ok(p) => return (p, port),
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => last = Some(e),
                Err(e) => panic!("start pgcarpool with {key} = {port}: {e}"),
            }
        }
        panic!("start pgcarpool: no free port for {key}: {last:?}");
    }
}

/// Set `key` in an ordered key/value list, keeping its first position.
fn set(list: &mut Vec<(String, String)>, key: &str, value: &str) {
    match list.iter_mut().find(|(k, _)| k == key) {
        Some(entry) => entry.1 = value.to_string(),
        None => list.push((key.to_string(), value.to_string())),
    }
}

/// A running in-process pgcarpool. Call `shutdown().await` at the end of a test.
pub struct TestPooler {
    spec: TestPoolerBuilder,
    /// Holds pgbouncer.ini and userlist.txt.
    dir: tempfile::TempDir,
    /// None only after `shutdown`.
    handle: Option<AppHandle>,
}

impl TestPooler {
    /// A builder with the defaults: every database of `pg` through the `*` entry,
    /// md5 auth against a userlist holding the test roles, admin_users = postgres.
    pub fn builder(pg: &TempPostgres) -> TestPoolerBuilder {
        TestPoolerBuilder {
            pg_port: pg.port(),
            settings: DEFAULT_SETTINGS
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            databases: Vec::new(),
            users: Vec::new(),
            peers: Vec::new(),
            auth_lines: TEST_ROLES
                .iter()
                .map(|(user, password)| format!("\"{user}\" \"{password}\""))
                .collect(),
        }
    }

    fn handle(&self) -> &AppHandle {
        self.handle.as_ref().expect("pooler already shut down")
    }

    /// Client connections the pooler counts against max_client_conn (accepted, not yet
    /// gone), and how many of them are still logging in.
    #[allow(dead_code)]
    pub fn client_conns(&self) -> (usize, usize) {
        let shared = &self.handle().shared;
        (shared.client_conns(), shared.pending_logins().len())
    }

    /// The address pgcarpool listens on.
    pub fn addr(&self) -> SocketAddr {
        self.handle().addr
    }

    /// The port pgcarpool listens on.
    pub fn port(&self) -> u16 {
        self.addr().port()
    }

    /// libpq `key=value` connection string to the pooler, with the test role's password.
    pub fn dsn(&self, user: &str, db: &str) -> String {
        dsn_for(self.port(), user, db)
    }

    /// Connect through the pooler as a test role; panics on failure.
    pub async fn connect(&self, user: &str, db: &str) -> tokio_postgres::Client {
        try_connect(&self.dsn(user, db))
            .await
            .unwrap_or_else(|e| panic!("connect to pgcarpool as {user} to {db}: {e}"))
    }

    /// The pgbouncer.ini text in force.
    pub fn config_text(&self) -> String {
        self.spec.ini_text()
    }

    /// The directory holding pgbouncer.ini and userlist.txt.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Change the configuration, rewrite the files and reload (as SIGHUP would), e.g.
    /// `pooler.reload_with(|c| c.setting("default_pool_size", "5")).await`.
    pub async fn reload_with(
        &mut self,
        change: impl FnOnce(TestPoolerBuilder) -> TestPoolerBuilder,
    ) {
        self.spec = change(self.spec.clone());
        let config = self.spec.write_and_parse(self.dir.path());
        let _ = self.handle().reload(config);
    }

    /// Change the configuration and rewrite the files WITHOUT reloading (a test then sends
    /// RELOAD through the admin console or a SIGHUP-equivalent itself).
    pub fn rewrite_config(&mut self, change: impl FnOnce(TestPoolerBuilder) -> TestPoolerBuilder) {
        self.spec = change(self.spec.clone());
        self.spec.write_and_parse(self.dir.path());
    }

    /// Shut the pooler down and wait for its tasks to end.
    pub async fn shutdown(mut self) {
        if let Some(handle) = self.handle.take() {
            handle.shutdown().await;
        }
    }
}
