//! The immutable configuration snapshot: `load` parses and validates a whole pgbouncer.ini.
//!
//! Types here are the interface the rest of pgcarpool uses; parsing lives in `ini`,
//! `settings`, `databases` and `auth_file`.
pub mod auth_file;
pub mod databases;
pub mod hba;
pub mod ident;
pub mod ini;
pub mod names;
pub mod settings;
pub mod settings_doc;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ini::Ini;

pub use auth_file::{AuthFile, Secret};
pub use databases::{DatabaseEntry, PeerEntry, UserEntry};
pub use settings::Settings;

/// Pooling mode, as PgBouncer's `pool_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    Session,
    Transaction,
    Statement,
}

/// Client authentication method, as PgBouncer's `auth_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthType {
    Trust,
    Any,
    Plain,
    Md5,
    ScramSha256,
    Cert,
    Hba,
}

/// A config error, always naming where it came from (`file:line: key: message`).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}:{line}: {msg}")]
    At {
        file: String,
        line: usize,
        msg: String,
    },
    #[error("{file}: {msg}")]
    File { file: String, msg: String },
}

/// One complete, validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The main ini file this was loaded from.
    pub path: PathBuf,
    /// The `[pgbouncer]` section.
    pub settings: Settings,
    /// `[databases]` entries by client-visible name, without the `*` fallback.
    pub databases: BTreeMap<String, DatabaseEntry>,
    /// The `*` entry of `[databases]`, if any.
    pub fallback: Option<DatabaseEntry>,
    /// `[users]` entries.
    pub users: BTreeMap<String, UserEntry>,
    /// The parsed `auth_file` (empty when none is set).
    pub auth: AuthFile,
    /// `[peers]` entries by peer id.
    pub peers: BTreeMap<u16, PeerEntry>,
    /// The `auth_hba_file` rules (auth_type = hba only).
    pub hba: Option<std::sync::Arc<hba::Hba>>,
    /// The `auth_ident_file` maps (auth_type = hba with auth_ident_file only).
    pub ident: Option<std::sync::Arc<ident::Ident>>,
}

impl Config {
    /// Parse and validate `path` (and its `%include`s and `auth_file`).
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let parsed = ini::parse_file(path).map_err(ConfigError::from)?;
        let base_dir = path.parent().unwrap_or(Path::new("."));
        Config::build(parsed, path.to_path_buf(), base_dir)
    }

    /// Parse from ini text (tests); `%include` and `auth_file` resolve relative to `base_dir`.
    pub fn from_str(text: &str, name: &str, base_dir: &Path) -> Result<Config, ConfigError> {
        let parsed = ini::parse_str(text, name, base_dir, &mut |p: &Path| {
            ini::read_bounded(p, ini::MAX_FILE_LEN)
        })
        .map_err(ConfigError::from)?;
        Config::build(parsed, base_dir.join(name), base_dir)
    }

    /// The [pgbouncer] settings and the [databases], [users] and [peers] entries of
    /// `parsed`, each checked, with where each setting was last set.
    fn read_items(parsed: &Ini, path: &Path) -> Result<Items, ConfigError> {
        // conffile: the file read, unless the file names another for the next reload.
        let mut settings = Settings {
            conffile: Some(path.to_path_buf()),
            ..Settings::default()
        };
        let mut databases = BTreeMap::new();
        let mut fallback = None;
        let mut users = BTreeMap::new();
        let mut peers = BTreeMap::new();
        // Where each setting was last set, for errors found after parsing.
        let mut set_at: BTreeMap<&'static str, (String, usize)> = BTreeMap::new();
        for item in &parsed.items {
            let at = |msg: String| ConfigError::At {
                file: item.file.clone(),
                line: item.line,
                msg: format!("{}: {msg}", item.key),
            };
            match item.section.as_str() {
                "pgbouncer" => {
                    let def = settings::lookup(&item.key)
                        .ok_or_else(|| at("unknown setting".to_string()))?;
                    (def.set)(&mut settings, &item.value).map_err(at)?;
                    set_at.insert(def.name, (item.file.clone(), item.line));
                }
                "databases" => {
                    let d = databases::parse_database(&item.key, &item.value)
                        .map_err(|e| at(e.to_string()))?;
                    if item.key == "*" {
                        fallback = Some(d);
                    } else {
                        databases.insert(item.key.clone(), d);
                    }
                }
                "users" => {
                    let u = databases::parse_user(&item.key, &item.value)
                        .map_err(|e| at(e.to_string()))?;
                    users.insert(item.key.clone(), u);
                }
                "peers" => {
                    let p = databases::parse_peer(&item.key, &item.value).map_err(|e| {
                        // parse_peer names the peer id itself when that is what is wrong
                        if e.key == item.key {
                            at(e.msg)
                        } else {
                            at(e.to_string())
                        }
                    })?;
                    peers.insert(p.peer_id, p);
                }
                // unknown sections were rejected above
                other => return Err(at(format!("unknown section [{other}]"))),
            }
        }
        Ok(Items {
            settings,
            databases,
            fallback,
            users,
            peers,
            set_at,
        })
    }

    /// Turn parsed ini lines into a validated config.
    fn build(parsed: Ini, path: PathBuf, base_dir: &Path) -> Result<Config, ConfigError> {
        for h in &parsed.sections {
            if !SECTIONS.contains(&h.name.as_str()) {
                return Err(ConfigError::At {
                    file: h.file.clone(),
                    line: h.line,
                    msg: format!(
                        "[{}]: unknown section (expected [databases], [users], [pgbouncer] or [peers])",
                        h.name
                    ),
                });
            }
        }
        let Items {
            mut settings,
            databases,
            fallback,
            users,
            peers,
            set_at,
        } = Config::read_items(&parsed, &path)?;
        let at_setting = |name: &str, msg: String| match set_at.get(name) {
            Some((file, line)) => ConfigError::At {
                file: file.clone(),
                line: *line,
                msg: format!("{name}: {msg}"),
            },
            None => ConfigError::File {
                file: path.display().to_string(),
                msg: format!("{name}: {msg}"),
            },
        };

        if settings.auth_type == AuthType::Hba && settings.auth_hba_file.is_none() {
            return Err(at_setting(
                "auth_type",
                "auth_type = hba needs auth_hba_file".to_string(),
            ));
        }
        // Relative: next to the config file, else (PgBouncer's reading) the working directory.
        let beside_or_cwd = |p: PathBuf| {
            let beside = base_dir.join(&p);
            if !beside.exists() && p.is_relative() && p.exists() {
                p
            } else {
                beside
            }
        };
        settings.auth_hba_file = settings.auth_hba_file.take().map(beside_or_cwd);
        settings.auth_ident_file = settings.auth_ident_file.take().map(beside_or_cwd);
        let (hba, ident) = load_hba(&settings, &at_setting)?;
        let auth = match settings.auth_file.take() {
            None => AuthFile::default(),
            Some(p) => {
                let p = base_dir.join(p);
                let auth = AuthFile::load(&p).map_err(|e| match e {
                    auth_file::AuthFileError::Line { file, line, msg } => {
                        ConfigError::At { file, line, msg }
                    }
                    auth_file::AuthFileError::File { file, msg } => {
                        at_setting("auth_file", format!("{file}: {msg}"))
                    }
                })?;
                settings.auth_file = Some(p);
                auth
            }
        };
        Ok(Config {
            path,
            settings,
            databases,
            fallback,
            users,
            auth,
            peers,
            hba,
            ident,
        })
    }

    /// Log what the auth_hba_file parse found doubtful (once per load).
    pub fn log_hba_warnings(&self) {
        for w in self.hba.iter().flat_map(|h| h.warnings.iter()) {
            tracing::warn!("{w}");
        }
    }

    /// The database entry a client asking for `dbname` gets: the named entry, or the
    /// fallback `*` entry with its name filled in, or None.
    pub fn database(&self, dbname: &str) -> Option<DatabaseEntry> {
        self.database_entry(dbname)
            .map(std::borrow::Cow::into_owned)
    }

    /// [`Config::database`], borrowed when the database has an entry of its own.
    pub fn database_entry(&self, dbname: &str) -> Option<std::borrow::Cow<'_, DatabaseEntry>> {
        if let Some(d) = self.databases.get(dbname) {
            return Some(std::borrow::Cow::Borrowed(d));
        }
        self.fallback.as_ref().map(|f| {
            let mut d = f.clone();
            d.name = dbname.to_string();
            std::borrow::Cow::Owned(d)
        })
    }

    /// The entry for `dbname` without cloning (named entry, else the `*` fallback as is).
    fn db_ref(&self, dbname: &str) -> Option<&DatabaseEntry> {
        self.databases.get(dbname).or(self.fallback.as_ref())
    }

    /// The user a pool for (`db`, client `client_user`) logs in as: the database's forced
    /// `user=` if set, else the client's user. Pass this as `user` to the `*_for` helpers
    /// (PgBouncer applies `[users]` settings to the pool's user).
    pub fn pool_user_for(&self, db: &str, client_user: &str) -> String {
        self.db_ref(db)
            .and_then(|d| d.user.clone())
            .unwrap_or_else(|| client_user.to_string())
    }

    /// Pool mode for (db, user): `[users]` > `[databases]` > global `pool_mode`.
    pub fn pool_mode_for(&self, db: &str, user: &str) -> PoolMode {
        self.users
            .get(user)
            .and_then(|u| u.pool_mode)
            .or_else(|| self.db_ref(db).and_then(|d| d.pool_mode))
            .unwrap_or(self.settings.pool_mode)
    }

    /// Pool size for (db, user): `[users]` pool_size > `[databases]` pool_size > `default_pool_size`.
    pub fn pool_size_for(&self, db: &str, user: &str) -> usize {
        self.users
            .get(user)
            .and_then(|u| u.pool_size)
            .or_else(|| self.db_ref(db).and_then(|d| d.pool_size))
            .unwrap_or(self.settings.default_pool_size)
    }

    /// Minimum pool size for `db`: `[databases]` min_pool_size > global `min_pool_size`.
    pub fn min_pool_size_for(&self, db: &str) -> usize {
        self.db_ref(db)
            .and_then(|d| d.min_pool_size)
            .unwrap_or(self.settings.min_pool_size)
    }

    /// Reserve pool for (db, user): `[users]` reserve_pool_size > `[databases]` reserve_pool >
    /// global `reserve_pool_size`.
    pub fn reserve_pool_for(&self, db: &str, user: &str) -> usize {
        self.users
            .get(user)
            .and_then(|u| u.reserve_pool_size)
            .or_else(|| self.db_ref(db).and_then(|d| d.reserve_pool))
            .unwrap_or(self.settings.reserve_pool_size)
    }

    /// Server connection limit for `db` (0 = unlimited).
    pub fn max_db_connections_for(&self, db: &str) -> usize {
        self.db_ref(db)
            .and_then(|d| d.max_db_connections)
            .unwrap_or(self.settings.max_db_connections)
    }

    /// Client connection limit for `db` (0 = unlimited).
    pub fn max_db_client_connections_for(&self, db: &str) -> usize {
        self.db_ref(db)
            .and_then(|d| d.max_db_client_connections)
            .unwrap_or(self.settings.max_db_client_connections)
    }

    /// Server connection limit for `user` (0 = unlimited).
    pub fn max_user_connections_for(&self, user: &str) -> usize {
        self.users
            .get(user)
            .and_then(|u| u.max_user_connections)
            .unwrap_or(self.settings.max_user_connections)
    }

    /// Client connection limit for `user` (0 = unlimited).
    pub fn max_user_client_connections_for(&self, user: &str) -> usize {
        self.users
            .get(user)
            .and_then(|u| u.max_user_client_connections)
            .unwrap_or(self.settings.max_user_client_connections)
    }

    /// `server_lifetime` for `db`: `[databases]` > global.
    pub fn server_lifetime_for(&self, db: &str) -> Duration {
        self.db_ref(db)
            .and_then(|d| d.server_lifetime)
            .unwrap_or(self.settings.server_lifetime)
    }

    /// `query_wait_timeout` for (db, user): `[users]` > `[databases]` > global.
    pub fn query_wait_timeout_for(&self, db: &str, user: &str) -> Duration {
        self.users
            .get(user)
            .and_then(|u| u.query_wait_timeout)
            .or_else(|| self.db_ref(db).and_then(|d| d.query_wait_timeout))
            .unwrap_or(self.settings.query_wait_timeout)
    }

    /// `query_timeout` for `user`: `[users]` > global.
    pub fn query_timeout_for(&self, user: &str) -> Duration {
        self.users
            .get(user)
            .and_then(|u| u.query_timeout)
            .unwrap_or(self.settings.query_timeout)
    }

    /// `idle_transaction_timeout` for `user`: `[users]` > global.
    pub fn idle_transaction_timeout_for(&self, user: &str) -> Duration {
        self.users
            .get(user)
            .and_then(|u| u.idle_transaction_timeout)
            .unwrap_or(self.settings.idle_transaction_timeout)
    }

    /// `transaction_timeout` for `user`: `[users]` > global.
    pub fn transaction_timeout_for(&self, user: &str) -> Duration {
        self.users
            .get(user)
            .and_then(|u| u.transaction_timeout)
            .unwrap_or(self.settings.transaction_timeout)
    }

    /// `client_idle_timeout` for `user`: `[users]` > global.
    /// How long an unused pool of `db` is kept: autodb_idle_timeout for a database made
    /// from the `*` entry, pool_idle_timeout for the others (None: kept).
    pub fn pool_idle_timeout_for(&self, db: &str) -> Option<Duration> {
        if !self.databases.contains_key(db) && self.fallback.is_some() {
            enabled(self.settings.autodb_idle_timeout)
        } else {
            enabled(self.settings.pool_idle_timeout)
        }
    }

    pub fn client_idle_timeout_for(&self, user: &str) -> Duration {
        self.users
            .get(user)
            .and_then(|u| u.client_idle_timeout)
            .unwrap_or(self.settings.client_idle_timeout)
    }
}

/// Parse and validate `path`: the same as [`Config::load`] (SIGHUP / RELOAD call this, then swap).
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    Config::load(path)
}

/// The sections pgbouncer.ini may have.
pub const SECTIONS: &[&str] = &["databases", "users", "pgbouncer", "peers"];

impl From<ini::IniError> for ConfigError {
    fn from(e: ini::IniError) -> Self {
        match e {
            ini::IniError::Syntax { file, line, msg } => ConfigError::At { file, line, msg },
            ini::IniError::File { file, msg } => ConfigError::File { file, msg },
        }
    }
}

/// `Duration::ZERO` means "disabled" for PgBouncer's timeouts.
pub fn enabled(d: Duration) -> Option<Duration> {
    if d.is_zero() { None } else { Some(d) }
}

/// The hba rules and the ident maps they use.
type HbaRules = (
    Option<std::sync::Arc<hba::Hba>>,
    Option<std::sync::Arc<ident::Ident>>,
);

/// The hba rules and ident maps, read only for auth_type = hba (as PgBouncer).
fn load_hba(
    settings: &Settings,
    at_setting: &dyn Fn(&str, String) -> ConfigError,
) -> Result<HbaRules, ConfigError> {
    let hba_error = |setting: &str, e: hba::HbaError| match e.line {
        0 => at_setting(setting, format!("{}: {}", e.file, e.msg)),
        line => ConfigError::At {
            file: e.file,
            line,
            msg: e.msg,
        },
    };
    Ok(match (&settings.auth_type, &settings.auth_hba_file) {
        (AuthType::Hba, Some(hba_path)) => {
            let ident = match &settings.auth_ident_file {
                Some(p) => {
                    Some(ident::Ident::load(p).map_err(|e| hba_error("auth_ident_file", e))?)
                }
                None => None,
            };
            let hba = hba::Hba::load(hba_path, ident.as_ref())
                .map_err(|e| hba_error("auth_hba_file", e))?;
            (
                Some(std::sync::Arc::new(hba)),
                ident.map(std::sync::Arc::new),
            )
        }
        _ => (None, None),
    })
}

/// What the ini lines of a config say, before the files they name are read.
struct Items {
    settings: Settings,
    databases: BTreeMap<String, DatabaseEntry>,
    fallback: Option<DatabaseEntry>,
    users: BTreeMap<String, UserEntry>,
    peers: BTreeMap<u16, PeerEntry>,
    /// Where each setting was last set, for errors found after parsing.
    set_at: BTreeMap<&'static str, (String, usize)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Result<Config, ConfigError> {
        Config::from_str(text, "pgbouncer.ini", Path::new("/nonexistent"))
    }

    fn err(text: &str) -> String {
        cfg(text).unwrap_err().to_string()
    }

    /// The settings lines of PgBouncer's etc/pgbouncer.ini, uncommented (values as in the sample).
    const SAMPLE: &str = r#";;;
;;; PgBouncer configuration file
;;;
[databases]
foodb =
bardb = host=localhost dbname=bazdb
forcedb = host=localhost port=300 user=baz password=foo client_encoding=UNICODE datestyle=ISO connect_query='SELECT 1'
nondefaultdb = pool_size=50 reserve_pool_size=10
authdb = auth_user=bar
authdb2 = auth_dbname=foo max_db_client_connections=10
* = host=testserver

;; User-specific configuration
[users]
user1 = pool_size=5 reserve_pool_size=2 pool_mode=transaction max_user_connections=10 max_user_client_connections=20

[pgbouncer]
logfile = /var/log/pgbouncer/pgbouncer.log
pidfile = /var/run/pgbouncer/pgbouncer.pid
listen_addr = localhost
listen_port = 6432
unix_socket_dir = /tmp
unix_socket_mode = 0777
unix_socket_group =
peer_id = 0
query_wait_notify = 5
login_notify_message =
client_tls_sslmode = disable
client_tls_key_file =
client_tls_cert_file =
client_tls_ciphers = default
client_tls13_ciphers =
client_tls_protocols = secure
client_tls_dheparams = auto
client_tls_ecdhcurve = auto
server_tls_sslmode = prefer
server_tls_key_file =
server_tls_cert_file =
server_tls_protocols = secure
server_tls_ciphers = default
server_tls13_ciphers =
auth_type = md5
auth_hba_file =
auth_ident_file =
auth_ldap_options =
auth_query = SELECT rolname, CASE WHEN rolvaliduntil < pg_catalog.now() THEN NULL ELSE rolpassword END FROM pg_authid WHERE rolname=$1 AND rolcanlogin
auth_dbname =
auth_pam_confdir =
admin_users = user2, someadmin, otheradmin
stats_users = stats, root
pool_mode = session
max_prepared_statements = 0
scram_iterations = 4096
server_reset_query = DISCARD ALL
server_reset_query_always = 0
track_extra_parameters =
ignore_startup_parameters = extra_float_digits
server_check_query = select 1
server_check_delay = 30
server_fast_close = 0
application_name_add_host = 0
stats_period = 60
max_client_conn = 100
default_pool_size = 20
min_pool_size = 0
reserve_pool_size = 0
reserve_pool_timeout = 5
max_db_connections = 0
max_user_connections = 0
server_round_robin = 0
syslog = 0
syslog_facility = daemon
syslog_ident = pgbouncer
log_connections = 1
log_disconnections = 1
log_pooler_errors = 1
log_stats = 1
verbose = 0
server_lifetime = 3600
server_idle_timeout = 600
server_connect_timeout = 15
server_login_retry = 15
query_timeout = 0
query_wait_timeout = 120
cancel_wait_timeout = 10
client_idle_timeout = 0
client_login_timeout = 60
pool_idle_timeout = 0
autodb_idle_timeout = 3600
idle_transaction_timeout = 0
pkt_buf = 4096
listen_backlog = 128
sbuf_loopcnt = 5
max_packet_size = 2147483647
so_reuseport = 0
tcp_defer_accept = 0
tcp_socket_buffer = 0
tcp_keepalive = 1
tcp_keepcnt = 0
tcp_keepidle = 0
tcp_keepintvl = 0
tcp_user_timeout = 0
dns_max_ttl = 15
dns_zone_check_period = 0
dns_nxdomain_ttl = 15
resolv_conf = /etc/pgbouncer/resolv.conf
disable_pqexec = 0
service_name = pgbouncer
job_name = pgbouncer
"#;

    #[test]
    fn pgbouncer_sample() {
        let c = cfg(SAMPLE).unwrap();
        let s = &c.settings;
        assert_eq!(s.listen_addr, "localhost");
        assert_eq!(s.admin_users, vec!["user2", "someadmin", "otheradmin"]);
        assert_eq!(s.max_prepared_statements, 0);
        assert_eq!(s.server_check(), Some("select 1"));
        assert_eq!(s.ignore_startup_parameters, vec!["extra_float_digits"]);
        assert!(s.track_extra_parameters.is_empty());
        assert_eq!(
            s.logfile,
            Some(PathBuf::from("/var/log/pgbouncer/pgbouncer.log"))
        );
        assert_eq!(c.databases.len(), 6);
        let f = &c.databases["forcedb"];
        assert_eq!((f.port, f.user.as_deref()), (300, Some("baz")));
        assert_eq!(f.connect_query.as_deref(), Some("SELECT 1"));
        assert_eq!(c.databases["nondefaultdb"].reserve_pool, Some(10));
        assert_eq!(
            c.fallback.as_ref().unwrap().host.as_deref(),
            Some("testserver")
        );
        assert_eq!(c.users["user1"].max_user_client_connections, Some(20));
        // These differ from the defaults and have no effect in pgcarpool.
        assert_eq!(s.unimplemented_in_use(), vec!["resolv_conf"]);
    }

    #[test]
    fn the_console_cannot_be_the_auth_dbname() {
        let e = err("[pgbouncer]\nauth_dbname = pgbouncer\n");
        assert!(
            e.contains("cannot use the reserved \"pgbouncer\" database as an auth_dbname"),
            "{e}"
        );
        let c = cfg("[databases]\nx = auth_dbname=pgbouncer auth_user=u\n[pgbouncer]\nauth_dbname = authdb\n")
            .unwrap();
        // Per database it is refused at login (PgBouncer's "bouncer config error").
        assert_eq!(c.databases["x"].auth_dbname.as_deref(), Some("pgbouncer"));
        assert_eq!(c.settings.auth_dbname.as_deref(), Some("authdb"));
    }

    #[test]
    fn empty_config_is_all_defaults() {
        let c = cfg("").unwrap();
        assert_eq!(c.settings.listen_port, 6432);
        assert!(c.databases.is_empty() && c.users.is_empty() && c.fallback.is_none());
        assert!(c.auth.users.is_empty());
        assert_eq!(c.path, Path::new("/nonexistent/pgbouncer.ini"));
    }

    #[test]
    fn setting_errors_name_file_line_key() {
        assert_eq!(
            err("[pgbouncer]\nlisten_port = 6432\nlisten_port = x\n"),
            "pgbouncer.ini:3: listen_port: invalid value \"x\": expected a non-negative integer"
        );
        assert_eq!(
            err("[pgbouncer]\nno_such_thing = 1\n"),
            "pgbouncer.ini:2: no_such_thing: unknown setting"
        );
        assert_eq!(
            err("[databases]\nok = port=1\napp = host=a,b port=5432,5433,5434\n"),
            "pgbouncer.ini:3: app: port: 3 ports for 2 host(s): give one port per host of host=, or one port for all"
        );
        assert_eq!(
            err("[pgbouncer]\nPOOL_MODE = sessions\n"),
            "pgbouncer.ini:2: pool_mode: invalid value \"sessions\": expected session, transaction or statement"
        );
        assert_eq!(
            err("[pgbouncer]\nauth_type = ldap\n"),
            "pgbouncer.ini:2: auth_type: invalid value \"ldap\": ldap is not supported by pgcarpool (not built with it)"
        );
        assert_eq!(
            err("[pgbouncer]\nauth_type = hba\n"),
            "pgbouncer.ini:2: auth_type: auth_type = hba needs auth_hba_file"
        );
        assert_eq!(
            err("[databases]\n\nfoo = host=x prot=1\n"),
            "pgbouncer.ini:3: foo: prot: unknown parameter in [databases] entry"
        );
        assert_eq!(
            err("[databases]\npgbouncer = host=x\n"),
            "pgbouncer.ini:2: pgbouncer: the database name \"pgbouncer\" is reserved for the admin console"
        );
        assert_eq!(
            err("[users]\nbob = pool_size=many\n"),
            "pgbouncer.ini:2: bob: pool_size: invalid value \"many\": expected a non-negative integer"
        );
        assert_eq!(
            err("[peers]\n0 = host=x\n"),
            "pgbouncer.ini:2: 0: peer id must be 1..16383"
        );
        assert_eq!(
            err("[pgbouncer]\n[pgbouncerr]\n"),
            "pgbouncer.ini:2: [pgbouncerr]: unknown section (expected [databases], [users], [pgbouncer] or [peers])"
        );
    }

    #[test]
    fn all_auth_types() {
        for (name, t) in [
            ("trust", AuthType::Trust),
            ("any", AuthType::Any),
            ("plain", AuthType::Plain),
            ("md5", AuthType::Md5),
            ("scram-sha-256", AuthType::ScramSha256),
            ("cert", AuthType::Cert),
        ] {
            let c = cfg(&format!("[pgbouncer]\nauth_type = {name}\n")).unwrap();
            assert_eq!(c.settings.auth_type, t);
            assert_eq!(c.settings.get("auth_type").unwrap(), name);
        }
        // pam and ldap are refused (not built), as by a PgBouncer built without them;
        // peer is an hba method only.
        for name in ["pam", "ldap", "peer"] {
            let e = err(&format!("[pgbouncer]\nauth_type = {name}\n"));
            assert!(
                e.starts_with("pgbouncer.ini:2: auth_type: invalid value"),
                "{e}"
            );
        }
        assert!(
            err("[pgbouncer]\nauth_type = pam\n").contains("pam is not supported by pgcarpool")
        );
        assert!(err("[pgbouncer]\nauth_type = peer\n").contains("auth_type = hba"));
    }

    #[test]
    fn hba_and_ident_files_load_with_the_config() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("ident.conf"), "m root postgres\n").unwrap();
        std::fs::write(d.path().join("hba.conf"), "local all all peer map=m\n").unwrap();
        let ini = "[pgbouncer]\nauth_type = hba\nauth_hba_file = hba.conf\nauth_ident_file = ident.conf\n";
        let c = Config::from_str(ini, "pgbouncer.ini", d.path()).unwrap();
        assert_eq!(c.settings.auth_type, AuthType::Hba);
        assert_eq!(c.settings.auth_hba_file, Some(d.path().join("hba.conf")));
        let hba = c.hba.as_ref().expect("hba rules loaded");
        assert_eq!(hba.rules.len(), 1);
        assert!(c.ident.as_ref().unwrap().allows("m", "root", "postgres"));
        // An error in either file names that file and line; the config is refused.
        std::fs::write(
            d.path().join("hba.conf"),
            "local all all peer map=m\nlocal all all md6\n",
        )
        .unwrap();
        let e = Config::from_str(ini, "pgbouncer.ini", d.path())
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            format!(
                "{}:2: unknown authentication method \"md6\"",
                d.path().join("hba.conf").display()
            )
        );
        std::fs::write(d.path().join("ident.conf"), "m root\n").unwrap();
        let e = Config::from_str(ini, "pgbouncer.ini", d.path())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!("{}:1: ", d.path().join("ident.conf").display())),
            "{e}"
        );
        // A missing file is reported at the setting naming it.
        let e = Config::from_str(
            "[pgbouncer]\nauth_type = hba\nauth_hba_file = none.conf\n",
            "pgbouncer.ini",
            d.path(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("pgbouncer.ini:3: auth_hba_file: ")
                && e.contains("none.conf: cannot read"),
            "{e}"
        );
        // A relative name not found next to the config is looked up in the working
        // directory, as PgBouncer reads it.
        let here = std::env::current_dir().unwrap();
        let in_cwd = tempfile::NamedTempFile::new_in(&here).unwrap();
        std::fs::write(in_cwd.path(), "local all all trust\n").unwrap();
        let name = in_cwd
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .to_string();
        let ini = format!("[pgbouncer]\nauth_type = hba\nauth_hba_file = {name}\n");
        let c = Config::from_str(&ini, "pgbouncer.ini", d.path()).unwrap();
        assert_eq!(c.settings.auth_hba_file, Some(PathBuf::from(&name)));
        std::fs::write(d.path().join(&name), "local all all reject\n").unwrap();
        let c = Config::from_str(&ini, "pgbouncer.ini", d.path()).unwrap();
        assert_eq!(c.settings.auth_hba_file, Some(d.path().join(&name)));
        // Without auth_type = hba the files are not read (as PgBouncer).
        let c = Config::from_str(
            "[pgbouncer]\nauth_hba_file = none.conf\n",
            "pgbouncer.ini",
            d.path(),
        )
        .unwrap();
        assert!(c.hba.is_none());
    }

    #[test]
    fn peers_section() {
        let c = cfg("[peers]\n1 = host=/tmp/pgbouncer1\n2 = host=/tmp/pgbouncer2 port=5555\n[pgbouncer]\npeer_id = 1\n").unwrap();
        assert_eq!(c.peers.len(), 2);
        assert_eq!(c.peers[&2].port, 5555);
        assert_eq!(c.settings.peer_id, 1);
    }

    #[test]
    fn load_with_include_and_auth_file() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("conf.d")).unwrap();
        std::fs::write(
            d.join("pgbouncer.ini"),
            "[pgbouncer]\nauth_file = userlist.txt\n%include conf.d/dbs.ini\n",
        )
        .unwrap();
        std::fs::write(
            d.join("conf.d/dbs.ini"),
            "[databases]\napp = host=127.0.0.1 port=5433\n",
        )
        .unwrap();
        std::fs::write(d.join("userlist.txt"), "\"alice\" \"secret\"\n").unwrap();
        let c = Config::load(&d.join("pgbouncer.ini")).unwrap();
        assert_eq!(c.databases["app"].port, 5433);
        assert_eq!(c.auth.get("alice"), Some(&Secret::Plain("secret".into())));
        assert_eq!(c.settings.auth_file, Some(d.join("userlist.txt")));

        // Errors inside the auth_file name that file and line, without the secret.
        std::fs::write(d.join("userlist.txt"), "\n\"alice\" \"secret\n").unwrap();
        let e = Config::load(&d.join("pgbouncer.ini"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            format!(
                "{}:2: user \"alice\": unterminated quoted secret",
                d.join("userlist.txt").display()
            )
        );
        // A missing auth_file is reported at the auth_file line.
        std::fs::remove_file(d.join("userlist.txt")).unwrap();
        let e = Config::load(&d.join("pgbouncer.ini"))
            .unwrap_err()
            .to_string();
        let want = format!("{}:2: auth_file: ", d.join("pgbouncer.ini").display());
        assert!(
            e.starts_with(&want) && e.contains("cannot read auth_file"),
            "{e}"
        );
        // Errors in included files name the included file.
        std::fs::write(d.join("conf.d/dbs.ini"), "[databases]\n\napp = port=x\n").unwrap();
        let e = Config::load(&d.join("pgbouncer.ini"))
            .unwrap_err()
            .to_string();
        let want = format!("{}:3: app: port: ", d.join("conf.d/dbs.ini").display());
        assert!(e.starts_with(&want), "{e}");
        // A missing main file.
        let e = Config::load(&d.join("nope.ini")).unwrap_err().to_string();
        assert!(e.contains("nope.ini: cannot read"), "{e}");
    }

    #[test]
    fn precedence_user_over_database_over_global() {
        let c = cfg(
            "[pgbouncer]\npool_mode = session\ndefault_pool_size = 20\nmin_pool_size = 1\n\
             reserve_pool_size = 2\nmax_db_connections = 50\nmax_user_connections = 60\n\
             max_db_client_connections = 70\nmax_user_client_connections = 80\n\
             query_wait_timeout = 120\nserver_lifetime = 3600\nquery_timeout = 0\n\
             [databases]\nappdb = pool_mode=transaction pool_size=10 min_pool_size=3 reserve_pool=4 \
             max_db_connections=5 max_db_client_connections=7 server_lifetime=60 query_wait_timeout=30\n\
             plaindb = host=x\n* = host=y pool_size=8\n\
             [users]\nbob = pool_mode=statement pool_size=2 reserve_pool_size=1 max_user_connections=6 \
             max_user_client_connections=9 query_wait_timeout=10 query_timeout=3\n",
        )
        .unwrap();
        assert_eq!(c.pool_mode_for("appdb", "bob"), PoolMode::Statement);
        assert_eq!(c.pool_mode_for("appdb", "amy"), PoolMode::Transaction);
        assert_eq!(c.pool_mode_for("plaindb", "amy"), PoolMode::Session);
        assert_eq!(c.pool_size_for("appdb", "bob"), 2);
        assert_eq!(c.pool_size_for("appdb", "amy"), 10);
        assert_eq!(c.pool_size_for("plaindb", "amy"), 20);
        assert_eq!(c.pool_size_for("elsewhere", "amy"), 8); // via the * entry
        assert_eq!(c.min_pool_size_for("appdb"), 3);
        assert_eq!(c.min_pool_size_for("plaindb"), 1);
        assert_eq!(c.reserve_pool_for("appdb", "bob"), 1);
        assert_eq!(c.reserve_pool_for("appdb", "amy"), 4);
        assert_eq!(c.reserve_pool_for("plaindb", "amy"), 2);
        assert_eq!(c.max_db_connections_for("appdb"), 5);
        assert_eq!(c.max_db_connections_for("plaindb"), 50);
        assert_eq!(c.max_db_client_connections_for("appdb"), 7);
        assert_eq!(c.max_db_client_connections_for("plaindb"), 70);
        assert_eq!(c.max_user_connections_for("bob"), 6);
        assert_eq!(c.max_user_connections_for("amy"), 60);
        assert_eq!(c.max_user_client_connections_for("bob"), 9);
        assert_eq!(c.max_user_client_connections_for("amy"), 80);
        assert_eq!(c.server_lifetime_for("appdb"), Duration::from_secs(60));
        assert_eq!(c.server_lifetime_for("plaindb"), Duration::from_secs(3600));
        assert_eq!(
            c.query_wait_timeout_for("appdb", "bob"),
            Duration::from_secs(10)
        );
        assert_eq!(
            c.query_wait_timeout_for("appdb", "amy"),
            Duration::from_secs(30)
        );
        assert_eq!(
            c.query_wait_timeout_for("plaindb", "amy"),
            Duration::from_secs(120)
        );
        assert_eq!(c.query_timeout_for("bob"), Duration::from_secs(3));
        assert_eq!(c.query_timeout_for("amy"), Duration::ZERO);
        let d = c.database("other").unwrap();
        assert_eq!((d.name.as_str(), d.server_dbname()), ("other", "other"));
        assert!(c.database("plaindb").is_some());
    }

    #[test]
    fn user_timeouts_override_the_global_ones() {
        let c = cfg(
            "[pgbouncer]\nidle_transaction_timeout = 11\ntransaction_timeout = 12\n\
             client_idle_timeout = 13\n\
             [users]\nbob = idle_transaction_timeout=2 transaction_timeout=3 client_idle_timeout=4\n",
        )
        .unwrap();
        let s = Duration::from_secs;
        assert_eq!(c.idle_transaction_timeout_for("bob"), s(2));
        assert_eq!(c.idle_transaction_timeout_for("amy"), s(11));
        assert_eq!(c.transaction_timeout_for("bob"), s(3));
        assert_eq!(c.transaction_timeout_for("amy"), s(12));
        assert_eq!(c.client_idle_timeout_for("bob"), s(4));
        assert_eq!(c.client_idle_timeout_for("amy"), s(13));
    }

    #[test]
    fn pool_user_is_forced_user_or_client() {
        let c = cfg("[databases]\nforced = user=svc\nfree = host=x\n").unwrap();
        assert_eq!(c.pool_user_for("forced", "bob"), "svc");
        assert_eq!(c.pool_user_for("free", "bob"), "bob");
        assert_eq!(c.pool_user_for("unknown", "bob"), "bob");
    }

    #[test]
    fn no_fallback_means_unknown_db() {
        let c = cfg("[databases]\na = host=x\n").unwrap();
        assert!(c.database("b").is_none());
        assert_eq!(c.pool_size_for("b", "u"), 20);
    }

    /// Mangled input never panics: every truncation and a few byte substitutions of the sample.
    #[test]
    fn hostile_input_does_not_panic() {
        let junk = ["'", "\"", "\\", "=", "[", "]", "%", "é", "\n", " ", "\0"];
        let mut boundaries: Vec<usize> = SAMPLE.char_indices().map(|(i, _)| i).collect();
        boundaries.push(SAMPLE.len());
        for &i in &boundaries {
            let _ = cfg(&SAMPLE[..i]);
        }
        for &i in boundaries.iter().step_by(7) {
            for j in junk {
                let text = format!("{}{j}{}", &SAMPLE[..i], &SAMPLE[i..]);
                let _ = cfg(&text);
            }
        }
        for t in ["a='", "a='\\", "a=\\'", "'", "a= 'x''", "a='\\é'", "="] {
            let _ = databases::parse_pairs(t);
        }
        for t in [
            "\"",
            "\"\"\"",
            "\"a\" \"",
            "\"a\" \"SCRAM-SHA-256$",
            "\"a\" \"SCRAM-SHA-256$1:$:\"",
        ] {
            let _ = AuthFile::parse(t, "u");
        }
    }

    #[test]
    fn enabled_helper() {
        assert_eq!(enabled(Duration::ZERO), None);
        assert_eq!(
            enabled(Duration::from_secs(1)),
            Some(Duration::from_secs(1))
        );
    }
}
