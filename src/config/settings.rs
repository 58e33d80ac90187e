//! The `[pgbouncer]` section: ONE declarative table of settings (name, default, reloadable, parser).
//!
//! Every documented PgBouncer setting has a row in [`TABLE`]. Settings pgcarpool acts on are
//! typed fields of [`Settings`]; the others are checked for their type and kept as text in
//! [`Settings::other`]. Rows with `implemented: false` have no effect in pgcarpool's
//! design; [`NO_EFFECT`] says why and what plays their part.
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::{AuthType, PoolMode};

/// Typed `[pgbouncer]` settings. Field names are PgBouncer's setting names.
/// Time settings are `Duration`; `Duration::ZERO` means disabled where PgBouncer says 0 disables.
#[derive(Debug, Clone)]
pub struct Settings {
    pub listen_addr: String,
    pub listen_port: u16,
    pub unix_socket_dir: String,
    pub unix_socket_mode: u32,
    pub auth_type: AuthType,
    pub auth_file: Option<PathBuf>,
    pub auth_hba_file: Option<PathBuf>,
    pub auth_ident_file: Option<PathBuf>,
    pub auth_user: Option<String>,
    pub auth_query: String,
    /// The database the auth_query runs in (None: the client's database).
    pub auth_dbname: Option<String>,
    pub admin_users: Vec<String>,
    pub stats_users: Vec<String>,
    pub pool_mode: PoolMode,
    pub max_client_conn: usize,
    pub default_pool_size: usize,
    pub min_pool_size: usize,
    pub reserve_pool_size: usize,
    pub reserve_pool_timeout: Duration,
    pub max_db_connections: usize,
    pub max_user_connections: usize,
    pub max_db_client_connections: usize,
    pub max_user_client_connections: usize,
    pub server_reset_query: String,
    pub server_reset_query_always: bool,
    /// `<empty>` (the default) means "send an empty query"; an empty string disables checks.
    /// See [`Settings::server_check`].
    pub server_check_query: String,
    pub server_check_delay: Duration,
    pub server_lifetime: Duration,
    pub server_idle_timeout: Duration,
    pub server_connect_timeout: Duration,
    pub server_login_retry: Duration,
    pub server_round_robin: bool,
    pub client_login_timeout: Duration,
    pub query_timeout: Duration,
    pub query_wait_timeout: Duration,
    pub query_wait_notify: Duration,
    pub client_idle_timeout: Duration,
    pub idle_transaction_timeout: Duration,
    pub transaction_timeout: Duration,
    pub cancel_wait_timeout: Duration,
    pub suspend_timeout: Duration,
    pub ignore_startup_parameters: Vec<String>,
    pub application_name_add_host: bool,
    pub max_prepared_statements: usize,
    pub logfile: Option<PathBuf>,
    pub pidfile: Option<PathBuf>,
    pub log_connections: bool,
    pub log_disconnections: bool,
    pub log_pooler_errors: bool,
    pub log_stats: bool,
    pub stats_period: Duration,
    pub verbose: u8,
    /// Log to syslog too (the local socket, `/dev/log`).
    pub syslog: bool,
    /// The program name in syslog lines.
    pub syslog_ident: String,
    /// The syslog facility: auth, authpriv, daemon, user, local0 … local7.
    pub syslog_facility: String,
    pub tcp_keepalive: bool,
    pub tcp_keepidle: Duration,
    pub tcp_keepintvl: Duration,
    pub tcp_keepcnt: u32,
    /// Milliseconds in the ini file, as PgBouncer.
    pub tcp_user_timeout: Duration,
    pub so_reuseport: bool,
    /// The backlog of TCP and Unix listening sockets (`listen()`).
    pub listen_backlog: u32,
    /// `TCP_DEFER_ACCEPT` on TCP listeners (0: off; any other value: on, as PgBouncer).
    pub tcp_defer_accept: u32,
    /// `SO_SNDBUF` and `SO_RCVBUF` of TCP sockets (0: the system's).
    pub tcp_socket_buffer: usize,
    pub pkt_buf: usize,
    pub max_packet_size: usize,
    pub sbuf_loopcnt: usize,
    pub disable_pqexec: bool,
    pub track_extra_parameters: Vec<String>,
    pub server_fast_close: bool,
    pub autodb_idle_timeout: Duration,
    /// How long a pool of a `[databases]` entry with no client and no server is kept (0: for ever).
    pub pool_idle_timeout: Duration,
    pub dns_max_ttl: Duration,
    /// How long a server host name that did not resolve is not looked up again.
    pub dns_nxdomain_ttl: Duration,
    pub user: Option<String>,
    pub job_name: String,
    /// pgcarpool extension: Prometheus endpoint (0 = off).
    pub prometheus_port: u16,
    pub prometheus_addr: String,
    /// pgcarpool extension: worker threads (0 = one per core).
    pub workers: usize,
    /// pgcarpool extension: percent of a core a worker may be busy before clients spread to
    /// one more worker (0: clients are spread over every worker at all times).
    pub worker_spread_load: u32,
    /// pgcarpool extension: what a session feature that cannot be shared does in transaction
    /// mode: `pin` (keep the client on its server while it lives) or `error`.
    pub pin_mode: String,
    /// pgcarpool extension: how log lines look: `pgbouncer` (PgBouncer's own format, what
    /// pgbadger and operators' greps read) or `pgcarpool` (tracing's structured text).
    pub log_format: String,
    /// Servers a pool may keep for pinned clients on top of its size (0: none; a client
    /// that would pin beyond it is told so and let go).
    pub pin_pool_size: usize,
    /// After a transaction that called a function pgcarpool does not know, read back the
    /// session's settings and pins (what the function may have changed out of sight).
    pub check_function_calls: bool,
    /// pgcarpool extension: a client's unnamed Parse of a plain SELECT/INSERT/UPDATE/DELETE
    /// text it parsed just before is served by a statement the server prepared once
    /// (planned once per server, as with named statements) instead of a new parse.
    pub plan_once: bool,
    /// pgcarpool extension: a bare `BEGIN`/`START TRANSACTION` of an idle client is
    /// answered by pgcarpool and sent to a server with the block's first statement.
    pub deferred_begin: bool,
    /// Most prepared statement names one client may hold (beyond: 53400, client let go).
    pub client_max_statements: usize,
    /// Most session settings one client may have changed (beyond: 53400, client let go).
    pub client_max_settings: usize,
    /// Most bytes the statements of all clients may take (0: no bound).
    pub statement_registry_size: usize,
    /// Most bytes of notifications queued for one client listening through the pool's
    /// shared listener (beyond: 54000, client let go).
    pub notify_queue_limit: usize,
    /// pgcarpool extension: how often the role (primary, standby, lag) of each host of a
    /// `host=a,b,…` entry with `target_session_attrs` is checked (0: only at server login
    /// and when a server reports that its host changed role).
    pub server_role_check_interval: Duration,
    /// pgcarpool extension: how far a standby may lag and still serve
    /// `read-only`/`standby`/`prefer-standby` clients: bytes of WAL received and not
    /// replayed, or a time (`5s`, `500ms`, `1min`) since the last transaction it replayed
    /// while it has WAL left to replay (0: no bound).
    pub max_standby_lag: StandbyLag,
    /// pgcarpool extension: in transaction mode, a transaction whose first statement only
    /// reads goes to a standby of the entry's host list (database option `read_routing`).
    pub read_routing: bool,
    /// pgcarpool extension: with read_routing, a client never reads older data than it
    /// wrote or read before (LSN tracking; database option `read_your_writes`).
    pub read_your_writes: bool,
    /// This instance's peer id (0: none; see `peers_dns`).
    pub peer_id: u16,
    /// pgcarpool extension: `name[:port]` whose A/AAAA records are all the peers.
    pub peers_dns: String,
    /// pgcarpool extension: read `peers_dns`'s addresses from this hosts(5) file instead
    /// of the system resolver (tests; a member list written by a sidecar).
    pub peers_hosts_file: String,
    /// How long a user's secret found by auth_query is reused before it is asked again
    /// (0: asked at every login, as PgBouncer). A failed login forgets it at once.
    pub auth_query_cache_ttl: Duration,
    /// PBKDF2 iterations of the SCRAM secrets pgcarpool makes from plain-text passwords.
    pub scram_iterations: u32,
    /// A NOTICE sent to every client at login (None: none).
    pub login_notify_message: Option<String>,
    /// The file RELOAD and SIGHUP read (the one given on the command line unless the
    /// file or `SET conffile` names another).
    pub conffile: Option<PathBuf>,
    /// Documented PgBouncer settings pgcarpool parses but does not act on yet
    /// (TLS, syslog, peering, DNS tuning…), by name, as given (type-checked).
    pub other: BTreeMap<String, String>,
}

/// One row of the settings table.
#[derive(Clone, Copy)]
pub struct SettingDef {
    /// PgBouncer's name (lower case).
    pub name: &'static str,
    /// The default, as text, as SHOW CONFIG prints it.
    pub default: &'static str,
    /// Can change on RELOAD / admin `SET` (PgBouncer's "changeable").
    pub reloadable: bool,
    /// pgcarpool acts on it (false: accepted, no effect in pgcarpool's design; the reason
    /// is in [`NO_EFFECT`]; what each setting means is in `super::settings_doc`).
    pub implemented: bool,
    /// Parse `value` and store it.
    pub set: fn(&mut Settings, &str) -> Result<(), String>,
    /// The current value as text.
    pub show: fn(&Settings) -> String,
}

impl std::fmt::Debug for SettingDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SettingDef")
            .field("name", &self.name)
            .field("default", &self.default)
            .field("reloadable", &self.reloadable)
            .field("implemented", &self.implemented)
            .finish()
    }
}

/// A setting that differs between two configurations (RELOAD reports these).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingChange {
    pub name: &'static str,
    pub old: String,
    pub new: String,
    /// false: the running value stays until a restart.
    pub reloadable: bool,
}

impl std::fmt::Display for SettingChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {:?} -> {:?}", self.name, self.old, self.new)?;
        if !self.reloadable {
            write!(f, " (needs a restart: keeping {:?})", self.old)?;
        }
        Ok(())
    }
}

/// One SHOW CONFIG row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigRow {
    pub key: &'static str,
    pub value: String,
    pub default: &'static str,
    pub changeable: bool,
}

/// A value type of a typed setting: how it is parsed and shown.
trait Value: Sized {
    fn parse(v: &str) -> Result<Self, String>;
    fn show(&self) -> String;
}

fn parse_uint<T: std::str::FromStr>(v: &str) -> Result<T, String> {
    let t = v.trim();
    let t = t.strip_prefix('+').unwrap_or(t);
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "invalid value \"{v}\": expected a non-negative integer"
        ));
    }
    t.parse::<T>()
        .map_err(|_| format!("invalid value \"{v}\": integer out of range"))
}

macro_rules! uint_value {
    ($($t:ty),*) => {$(
        impl Value for $t {
            fn parse(v: &str) -> Result<Self, String> { parse_uint(v) }
            fn show(&self) -> String { self.to_string() }
        }
    )*};
}
uint_value!(u8, u16, u32, usize);

/// PgBouncer booleans: 0/1, and also on/off, yes/no, true/false.
pub fn parse_bool(v: &str) -> Result<bool, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "on" | "yes" | "true" => Ok(true),
        "0" | "off" | "no" | "false" => Ok(false),
        _ => Err(format!(
            "invalid value \"{v}\": expected a boolean (0/1, on/off, yes/no, true/false)"
        )),
    }
}

impl Value for bool {
    fn parse(v: &str) -> Result<Self, String> {
        parse_bool(v)
    }
    fn show(&self) -> String {
        if *self { "1" } else { "0" }.to_string()
    }
}

/// Seconds, fractions allowed ("0.5"), as PgBouncer's time settings.
pub fn parse_seconds(v: &str) -> Result<Duration, String> {
    let t = v.trim();
    let ok_chars = !t.is_empty()
        && t.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && t.bytes().any(|b| b.is_ascii_digit());
    if !ok_chars {
        return Err(format!(
            "invalid value \"{v}\": expected seconds (e.g. 30 or 0.5)"
        ));
    }
    let secs: f64 = t
        .parse()
        .map_err(|_| format!("invalid value \"{v}\": expected seconds (e.g. 30 or 0.5)"))?;
    Duration::try_from_secs_f64(secs).map_err(|_| format!("invalid value \"{v}\": out of range"))
}

/// A duration in seconds as text: "30", "0.5".
pub fn show_seconds(d: &Duration) -> String {
    if d.subsec_nanos() == 0 {
        d.as_secs().to_string()
    } else {
        let s = format!("{:.6}", d.as_secs_f64());
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

impl Value for Duration {
    fn parse(v: &str) -> Result<Self, String> {
        parse_seconds(v)
    }
    fn show(&self) -> String {
        show_seconds(self)
    }
}

/// `max_standby_lag`: a bound in bytes of WAL, or in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StandbyLag {
    /// Bytes received and not replayed (0: no bound).
    Bytes(u64),
    /// Time since the last transaction replayed, while WAL is left to replay.
    Time(Duration),
}

impl Default for StandbyLag {
    fn default() -> Self {
        StandbyLag::Bytes(0)
    }
}

impl StandbyLag {
    /// `16777216` (bytes), or a number with `ms`, `s`, `min` or `h` (a time).
    pub fn parse(v: &str) -> Result<StandbyLag, String> {
        let t = v.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = (&t[..split], t[split..].trim());
        if unit.is_empty() {
            return parse_uint::<u64>(t).map(StandbyLag::Bytes);
        }
        let scale = match unit {
            "ms" => 0.001,
            "s" => 1.0,
            "min" => 60.0,
            "h" => 3600.0,
            _ => {
                return Err(format!(
                    "invalid value \"{v}\": expected bytes, or a time with ms, s, min or h"
                ));
            }
        };
        let n: f64 = num
            .parse()
            .map_err(|_| format!("invalid value \"{v}\": expected a number before {unit}"))?;
        Duration::try_from_secs_f64(n * scale)
            .map(StandbyLag::Time)
            .map_err(|_| format!("invalid value \"{v}\": out of range"))
    }

    pub fn show(&self) -> String {
        match self {
            StandbyLag::Bytes(n) => n.to_string(),
            StandbyLag::Time(d) if d.subsec_millis() == 0 && d.subsec_nanos() == 0 => {
                format!("{}s", d.as_secs())
            }
            StandbyLag::Time(d) => format!("{}ms", d.as_millis()),
        }
    }
}

fn parse_millis(v: &str) -> Result<Duration, String> {
    parse_uint::<u64>(v).map(Duration::from_millis)
}

fn show_millis(d: &Duration) -> String {
    d.as_millis().to_string()
}

fn parse_octal(v: &str) -> Result<u32, String> {
    let t = v.trim();
    if t.is_empty() || !t.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return Err(format!(
            "invalid value \"{v}\": expected an octal mode like 0777"
        ));
    }
    match u32::from_str_radix(t, 8) {
        Ok(m) if m <= 0o7777 => Ok(m),
        _ => Err(format!("invalid value \"{v}\": mode out of range")),
    }
}

fn show_octal(m: &u32) -> String {
    format!("0{m:o}")
}

impl Value for String {
    fn parse(v: &str) -> Result<Self, String> {
        Ok(v.to_string())
    }
    fn show(&self) -> String {
        self.clone()
    }
}

impl Value for Option<String> {
    fn parse(v: &str) -> Result<Self, String> {
        Ok(if v.is_empty() {
            None
        } else {
            Some(v.to_string())
        })
    }
    fn show(&self) -> String {
        self.clone().unwrap_or_default()
    }
}

impl Value for Option<PathBuf> {
    fn parse(v: &str) -> Result<Self, String> {
        Ok(if v.is_empty() {
            None
        } else {
            Some(PathBuf::from(v))
        })
    }
    fn show(&self) -> String {
        self.as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    }
}

/// Comma-separated list, items trimmed, empty items dropped.
pub fn parse_list(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

impl Value for Vec<String> {
    fn parse(v: &str) -> Result<Self, String> {
        Ok(parse_list(v))
    }
    fn show(&self) -> String {
        self.join(",")
    }
}

impl PoolMode {
    /// PgBouncer's name for the mode.
    pub fn as_str(self) -> &'static str {
        match self {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
            PoolMode::Statement => "statement",
        }
    }
}

impl std::str::FromStr for PoolMode {
    type Err = String;
    fn from_str(v: &str) -> Result<Self, String> {
        match v.trim().to_ascii_lowercase().as_str() {
            "session" => Ok(PoolMode::Session),
            "transaction" => Ok(PoolMode::Transaction),
            "statement" => Ok(PoolMode::Statement),
            _ => Err(format!(
                "invalid value \"{v}\": expected session, transaction or statement"
            )),
        }
    }
}

impl Value for PoolMode {
    fn parse(v: &str) -> Result<Self, String> {
        v.parse()
    }
    fn show(&self) -> String {
        self.as_str().to_string()
    }
}

impl AuthType {
    /// PgBouncer's name for the method.
    pub fn as_str(self) -> &'static str {
        match self {
            AuthType::Trust => "trust",
            AuthType::Any => "any",
            AuthType::Plain => "plain",
            AuthType::Md5 => "md5",
            AuthType::ScramSha256 => "scram-sha-256",
            AuthType::Cert => "cert",
            AuthType::Hba => "hba",
        }
    }
}

impl std::str::FromStr for AuthType {
    type Err = String;
    fn from_str(v: &str) -> Result<Self, String> {
        match v.trim().to_ascii_lowercase().as_str() {
            "trust" => Ok(AuthType::Trust),
            "any" => Ok(AuthType::Any),
            "plain" => Ok(AuthType::Plain),
            "md5" => Ok(AuthType::Md5),
            "scram-sha-256" => Ok(AuthType::ScramSha256),
            "cert" => Ok(AuthType::Cert),
            "hba" => Ok(AuthType::Hba),
            // As a PgBouncer built without PAM or LDAP: refused, config not loaded.
            "pam" | "ldap" => Err(format!(
                "invalid value \"{v}\": {v} is not supported by pgcarpool (not built with it)"
            )),
            "peer" => Err(format!(
                "invalid value \"{v}\": peer is a method of auth_hba_file lines (auth_type = hba), as in PgBouncer"
            )),
            _ => Err(format!(
                "invalid value \"{v}\": expected trust, any, plain, md5, scram-sha-256, cert or hba"
            )),
        }
    }
}

impl Value for AuthType {
    fn parse(v: &str) -> Result<Self, String> {
        v.parse()
    }
    fn show(&self) -> String {
        self.as_str().to_string()
    }
}

// Checks for settings kept as text in `other`.
/// A syslog facility name, as PgBouncer accepts them (`syslog_facility`).
fn parse_facility(v: &str) -> Result<String, String> {
    let v = v.trim().to_ascii_lowercase();
    if super::names::facility_code(&v).is_some() {
        Ok(v)
    } else {
        Err(format!(
            "unknown syslog facility {v:?} (auth, authpriv, daemon, user, local0 … local7)"
        ))
    }
}
fn check_str(_: &str) -> Result<(), String> {
    Ok(())
}
fn check_time(v: &str) -> Result<(), String> {
    parse_seconds(v).map(|_| ())
}
fn check_enum(v: &str, allowed: &[&str]) -> Result<(), String> {
    if allowed.iter().any(|a| a.eq_ignore_ascii_case(v.trim())) {
        Ok(())
    } else {
        Err(format!(
            "invalid value \"{v}\": expected one of {}",
            allowed.join(", ")
        ))
    }
}
fn check_sslmode(v: &str) -> Result<(), String> {
    check_enum(
        v,
        &[
            "disable",
            "allow",
            "prefer",
            "require",
            "verify-ca",
            "verify-full",
        ],
    )
}
fn parse_peer_id(v: &str) -> Result<u16, String> {
    match parse_uint::<u32>(v)? {
        id @ 0..=16383 => Ok(id as u16),
        _ => Err(format!(
            "invalid value \"{v}\": peer_id must be at most 16383"
        )),
    }
}

/// A typed setting stored in the field of the same name.
macro_rules! typed {
    ($name:ident, $default:expr, reload: $r:expr, implemented: $i:expr) => {
        typed!($name, $default, reload: $r, implemented: $i, Value::parse, Value::show)
    };
    ($name:ident, $default:expr, reload: $r:expr, implemented: $i:expr, $parse:expr, $show:expr) => {
        SettingDef {
            name: stringify!($name),
            default: $default,
            reloadable: $r,
            implemented: $i,
            set: |s: &mut Settings, v: &str| {
                s.$name = $parse(v)?;
                Ok(())
            },
            show: |s: &Settings| $show(&s.$name),
        }
    };
}

/// A documented setting pgcarpool does not act on: checked, kept as text in `other`.
macro_rules! other {
    ($name:ident, $default:expr, reload: $r:expr, $check:expr) => {
        other!($name, $default, reload: $r, $check, implemented: false)
    };
    ($name:ident, $default:expr, reload: $r:expr, $check:expr, implemented: $i:expr) => {
        SettingDef {
            name: stringify!($name),
            default: $default,
            reloadable: $r,
            implemented: $i,
            set: |s: &mut Settings, v: &str| {
                let check: fn(&str) -> Result<(), String> = $check;
                check(v)?;
                s.other.insert(stringify!($name).to_string(), v.to_string());
                Ok(())
            },
            show: |s: &Settings| {
                s.other
                    .get(stringify!($name))
                    .cloned()
                    .unwrap_or_else(|| $default.to_string())
            },
        }
    };
}

const DEFAULT_AUTH_QUERY: &str = "SELECT rolname, CASE WHEN rolvaliduntil < now() THEN NULL ELSE rolpassword END FROM pg_authid WHERE rolname=$1 AND rolcanlogin";

/// Every `[pgbouncer]` setting, in alphabetical order (SHOW CONFIG order), then pgcarpool's own.
/// Defaults and reloadability are PgBouncer's (doc/config.md, `CF_NO_RELOAD` in main.c).
pub static TABLE: &[SettingDef] = &[
    typed!(admin_users, "", reload: true, implemented: true),
    typed!(application_name_add_host, "0", reload: true, implemented: true),
    typed!(auth_dbname, "", reload: true, implemented: true, parse_auth_dbname, Value::show),
    typed!(auth_file, "", reload: true, implemented: true),
    typed!(auth_hba_file, "", reload: true, implemented: true),
    typed!(auth_ident_file, "", reload: true, implemented: true),
    other!(auth_ldap_options, "", reload: true, check_str),
    other!(auth_pam_confdir, "", reload: true, check_str),
    typed!(auth_query, DEFAULT_AUTH_QUERY, reload: true, implemented: true),
    typed!(auth_type, "md5", reload: true, implemented: true),
    typed!(auth_user, "", reload: true, implemented: true),
    typed!(autodb_idle_timeout, "3600", reload: true, implemented: true),
    typed!(cancel_wait_timeout, "10", reload: true, implemented: true),
    typed!(client_idle_timeout, "0", reload: true, implemented: true),
    typed!(client_login_timeout, "60", reload: true, implemented: true),
    other!(client_tls13_ciphers, "", reload: true, check_str, implemented: true),
    other!(client_tls_ca_file, "", reload: true, check_str, implemented: true),
    other!(client_tls_cert_file, "", reload: true, check_str, implemented: true),
    other!(client_tls_ciphers, "default", reload: true, check_str, implemented: true),
    other!(client_tls_dheparams, "auto", reload: true, check_str, implemented: true),
    other!(client_tls_ecdhcurve, "auto", reload: true, check_str, implemented: true),
    other!(client_tls_key_file, "", reload: true, check_str, implemented: true),
    other!(client_tls_protocols, "secure", reload: true, check_str, implemented: true),
    other!(client_tls_sslmode, "disable", reload: true, check_sslmode, implemented: true),
    typed!(conffile, "", reload: true, implemented: true),
    typed!(default_pool_size, "20", reload: true, implemented: true),
    typed!(disable_pqexec, "0", reload: false, implemented: true),
    typed!(dns_max_ttl, "15", reload: true, implemented: true),
    typed!(dns_nxdomain_ttl, "15", reload: true, implemented: true),
    other!(dns_zone_check_period, "0", reload: true, check_time),
    typed!(idle_transaction_timeout, "0", reload: true, implemented: true),
    typed!(ignore_startup_parameters, "", reload: true, implemented: true),
    typed!(job_name, "pgbouncer", reload: false, implemented: true),
    typed!(listen_addr, "", reload: false, implemented: true),
    typed!(listen_backlog, "128", reload: false, implemented: true),
    typed!(listen_port, "6432", reload: false, implemented: true),
    typed!(log_connections, "1", reload: true, implemented: true),
    typed!(log_disconnections, "1", reload: true, implemented: true),
    typed!(log_pooler_errors, "1", reload: true, implemented: true),
    typed!(log_stats, "1", reload: true, implemented: true),
    typed!(logfile, "", reload: true, implemented: true),
    typed!(login_notify_message, "", reload: true, implemented: true),
    typed!(max_client_conn, "100", reload: true, implemented: true),
    typed!(max_db_client_connections, "0", reload: true, implemented: true),
    typed!(max_db_connections, "0", reload: true, implemented: true),
    typed!(max_packet_size, "2147483647", reload: true, implemented: true),
    typed!(max_prepared_statements, "200", reload: true, implemented: true),
    typed!(max_user_client_connections, "0", reload: true, implemented: true),
    typed!(max_user_connections, "0", reload: true, implemented: true),
    typed!(min_pool_size, "0", reload: true, implemented: true),
    typed!(peer_id, "0", reload: true, implemented: true, parse_peer_id, Value::show),
    typed!(pidfile, "", reload: false, implemented: true),
    typed!(pkt_buf, "4096", reload: false, implemented: false),
    typed!(pool_idle_timeout, "0", reload: true, implemented: true),
    typed!(pool_mode, "session", reload: true, implemented: true),
    typed!(query_timeout, "0", reload: true, implemented: true),
    typed!(query_wait_notify, "5", reload: true, implemented: true),
    typed!(query_wait_timeout, "120", reload: true, implemented: true),
    typed!(reserve_pool_size, "0", reload: true, implemented: true),
    typed!(reserve_pool_timeout, "5", reload: true, implemented: true),
    other!(resolv_conf, "", reload: false, check_str),
    typed!(sbuf_loopcnt, "5", reload: true, implemented: false),
    typed!(scram_iterations, "4096", reload: true, implemented: true, parse_iterations, Value::show),
    typed!(server_check_delay, "30", reload: true, implemented: true),
    typed!(server_check_query, "<empty>", reload: true, implemented: true),
    typed!(server_connect_timeout, "15", reload: true, implemented: true),
    typed!(server_fast_close, "0", reload: true, implemented: true),
    typed!(server_idle_timeout, "600", reload: true, implemented: true),
    typed!(server_lifetime, "3600", reload: true, implemented: true),
    typed!(server_login_retry, "15", reload: true, implemented: true),
    typed!(server_reset_query, "DISCARD ALL", reload: true, implemented: true),
    typed!(server_reset_query_always, "0", reload: true, implemented: true),
    typed!(server_round_robin, "0", reload: true, implemented: true),
    other!(server_tls13_ciphers, "", reload: true, check_str, implemented: true),
    other!(server_tls_ca_file, "", reload: true, check_str, implemented: true),
    other!(server_tls_cert_file, "", reload: true, check_str, implemented: true),
    other!(server_tls_ciphers, "default", reload: true, check_str, implemented: true),
    other!(server_tls_key_file, "", reload: true, check_str, implemented: true),
    other!(server_tls_protocols, "secure", reload: true, check_str, implemented: true),
    other!(server_tls_sslmode, "prefer", reload: true, check_sslmode, implemented: true),
    SettingDef {
        // Alias of job_name (win32 service name in PgBouncer).
        name: "service_name",
        default: "pgbouncer",
        reloadable: false,
        implemented: true,
        set: |s: &mut Settings, v: &str| {
            s.job_name = v.to_string();
            Ok(())
        },
        show: |s: &Settings| s.job_name.clone(),
    },
    typed!(so_reuseport, "0", reload: false, implemented: true),
    typed!(stats_period, "60", reload: true, implemented: true),
    typed!(stats_users, "", reload: true, implemented: true),
    typed!(suspend_timeout, "10", reload: true, implemented: true),
    typed!(syslog, "0", reload: true, implemented: true),
    typed!(syslog_facility, "daemon", reload: true, implemented: true, parse_facility, Value::show),
    typed!(syslog_ident, "pgbouncer", reload: true, implemented: true),
    typed!(tcp_defer_accept, "1", reload: true, implemented: true),
    typed!(tcp_keepalive, "1", reload: true, implemented: true),
    typed!(tcp_keepcnt, "0", reload: true, implemented: true),
    typed!(tcp_keepidle, "0", reload: true, implemented: true),
    typed!(tcp_keepintvl, "0", reload: true, implemented: true),
    typed!(tcp_socket_buffer, "0", reload: true, implemented: true),
    typed!(tcp_user_timeout, "0", reload: true, implemented: true, parse_millis, show_millis),
    typed!(track_extra_parameters, "IntervalStyle", reload: false, implemented: true),
    typed!(transaction_timeout, "0", reload: true, implemented: true),
    typed!(unix_socket_dir, "/tmp", reload: false, implemented: true),
    other!(unix_socket_group, "", reload: false, check_str, implemented: true),
    typed!(unix_socket_mode, "0777", reload: false, implemented: true, parse_octal, show_octal),
    typed!(user, "", reload: false, implemented: true),
    typed!(verbose, "0", reload: true, implemented: true),
    // pgcarpool's own settings.
    typed!(prometheus_addr, "127.0.0.1", reload: false, implemented: true),
    typed!(prometheus_port, "0", reload: false, implemented: true),
    typed!(workers, "0", reload: false, implemented: true),
    typed!(worker_spread_load, "75", reload: true, implemented: true),
    typed!(pin_mode, "pin", reload: true, implemented: true, parse_pin_mode, Value::show),
    typed!(log_format, "pgbouncer", reload: true, implemented: true, parse_log_format, Value::show),
    typed!(pin_pool_size, "20", reload: true, implemented: true),
    typed!(check_function_calls, "1", reload: true, implemented: true),
    typed!(plan_once, "1", reload: true, implemented: true),
    typed!(deferred_begin, "0", reload: true, implemented: true),
    typed!(client_max_statements, "10000", reload: true, implemented: true),
    typed!(client_max_settings, "10000", reload: true, implemented: true),
    typed!(statement_registry_size, "67108864", reload: true, implemented: true),
    typed!(notify_queue_limit, "67108864", reload: true, implemented: true),
    typed!(peers_dns, "", reload: true, implemented: true, parse_peers_dns, Value::show),
    typed!(peers_hosts_file, "", reload: true, implemented: true),
    typed!(auth_query_cache_ttl, "5", reload: true, implemented: true),
    typed!(server_role_check_interval, "1", reload: true, implemented: true),
    typed!(
        max_standby_lag,
        "0",
        reload: true,
        implemented: true,
        StandbyLag::parse,
        StandbyLag::show
    ),
    typed!(read_routing, "0", reload: true, implemented: true),
    typed!(read_your_writes, "1", reload: true, implemented: true),
];

/// PgBouncer refuses its own console as the database auth_query runs in.
fn parse_auth_dbname(v: &str) -> Result<Option<String>, String> {
    if super::names::is_admin_db(v.trim()) {
        return Err(format!(
            "cannot use the reserved \"{}\" database as an auth_dbname",
            v.trim()
        ));
    }
    Value::parse(v)
}

fn parse_peers_dns(v: &str) -> Result<String, String> {
    if !v.trim().is_empty() {
        super::names::parse_target(v)?;
    }
    Ok(v.trim().to_string())
}

/// At least one iteration (PostgreSQL's scram_iterations has the same floor).
fn parse_iterations(v: &str) -> Result<u32, String> {
    match parse_uint::<u32>(v)? {
        0 => Err(format!(
            "invalid value \"{v}\": scram_iterations must be at least 1"
        )),
        n => Ok(n),
    }
}

fn parse_pin_mode(v: &str) -> Result<String, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        m @ ("pin" | "error") => Ok(m.to_string()),
        other => Err(format!("invalid pin_mode {other:?}: expected pin or error")),
    }
}

fn parse_log_format(v: &str) -> Result<String, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        f @ ("pgbouncer" | "pgcarpool") => Ok(f.to_string()),
        other => Err(format!(
            "invalid log_format {other:?}: expected pgbouncer or pgcarpool"
        )),
    }
}

/// The row for `name` (case-insensitive).
pub fn lookup(name: &str) -> Option<&'static SettingDef> {
    let name = name.trim();
    TABLE.iter().find(|d| d.name.eq_ignore_ascii_case(name))
}

/// Whether `name` may change on RELOAD / admin `SET`; false for unknown names.
pub fn is_reloadable(name: &str) -> bool {
    lookup(name).is_some_and(|d| d.reloadable)
}

impl Default for Settings {
    /// PgBouncer's defaults: every row's default applied through the table.
    fn default() -> Self {
        let mut s = Settings::blank();
        for def in TABLE {
            // The defaults are constants checked by `defaults_parse`; a failure leaves the blank value.
            let _ = (def.set)(&mut s, def.default);
        }
        s
    }
}

impl Settings {
    /// Zero values, before the table's defaults are applied.
    fn blank() -> Self {
        Settings {
            listen_addr: String::new(),
            listen_port: 0,
            unix_socket_dir: String::new(),
            unix_socket_mode: 0,
            auth_type: AuthType::Md5,
            auth_file: None,
            auth_hba_file: None,
            auth_ident_file: None,
            auth_user: None,
            auth_query: String::new(),
            auth_dbname: None,
            admin_users: Vec::new(),
            stats_users: Vec::new(),
            pool_mode: PoolMode::Session,
            max_client_conn: 0,
            default_pool_size: 0,
            min_pool_size: 0,
            reserve_pool_size: 0,
            reserve_pool_timeout: Duration::ZERO,
            max_db_connections: 0,
            max_user_connections: 0,
            max_db_client_connections: 0,
            max_user_client_connections: 0,
            server_reset_query: String::new(),
            server_reset_query_always: false,
            server_check_query: String::new(),
            server_check_delay: Duration::ZERO,
            server_lifetime: Duration::ZERO,
            server_idle_timeout: Duration::ZERO,
            server_connect_timeout: Duration::ZERO,
            server_login_retry: Duration::ZERO,
            server_round_robin: false,
            client_login_timeout: Duration::ZERO,
            query_timeout: Duration::ZERO,
            query_wait_timeout: Duration::ZERO,
            query_wait_notify: Duration::ZERO,
            client_idle_timeout: Duration::ZERO,
            idle_transaction_timeout: Duration::ZERO,
            transaction_timeout: Duration::ZERO,
            cancel_wait_timeout: Duration::ZERO,
            suspend_timeout: Duration::ZERO,
            ignore_startup_parameters: Vec::new(),
            application_name_add_host: false,
            max_prepared_statements: 0,
            logfile: None,
            pidfile: None,
            log_connections: false,
            log_disconnections: false,
            log_pooler_errors: false,
            log_stats: false,
            stats_period: Duration::ZERO,
            verbose: 0,
            syslog: false,
            syslog_ident: String::new(),
            syslog_facility: String::new(),
            tcp_keepalive: false,
            tcp_keepidle: Duration::ZERO,
            tcp_keepintvl: Duration::ZERO,
            tcp_keepcnt: 0,
            tcp_user_timeout: Duration::ZERO,
            so_reuseport: false,
            listen_backlog: 0,
            tcp_defer_accept: 0,
            tcp_socket_buffer: 0,
            pkt_buf: 0,
            max_packet_size: 0,
            sbuf_loopcnt: 0,
            disable_pqexec: false,
            track_extra_parameters: Vec::new(),
            server_fast_close: false,
            autodb_idle_timeout: Duration::ZERO,
            pool_idle_timeout: Duration::ZERO,
            dns_max_ttl: Duration::ZERO,
            dns_nxdomain_ttl: Duration::ZERO,
            user: None,
            job_name: String::new(),
            prometheus_port: 0,
            prometheus_addr: String::new(),
            workers: 0,
            worker_spread_load: 75,
            pin_mode: "pin".into(),
            log_format: "pgbouncer".into(),
            pin_pool_size: 20,
            check_function_calls: true,
            plan_once: true,
            deferred_begin: false,
            client_max_statements: 10000,
            client_max_settings: 10000,
            statement_registry_size: 64 * 1024 * 1024,
            notify_queue_limit: 64 * 1024 * 1024,
            server_role_check_interval: Duration::from_secs(1),
            max_standby_lag: StandbyLag::Bytes(0),
            read_routing: false,
            read_your_writes: true,
            peer_id: 0,
            peers_dns: String::new(),
            peers_hosts_file: String::new(),
            auth_query_cache_ttl: Duration::ZERO,
            scram_iterations: 0,
            login_notify_message: None,
            conffile: None,
            other: BTreeMap::new(),
        }
    }

    /// Set `name` (case-insensitive) from text, as the ini file does: any setting, reloadable or not.
    pub fn load_value(&mut self, name: &str, value: &str) -> Result<(), String> {
        let def = lookup(name).ok_or_else(|| format!("unknown setting \"{}\"", name.trim()))?;
        (def.set)(self, value.trim())
    }

    /// `SET name = value` from the admin console: like the ini file, but settings that
    /// cannot change while running are refused. On error `self` is unchanged.
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), String> {
        let def = lookup(name).ok_or_else(|| format!("unknown setting \"{}\"", name.trim()))?;
        if !def.reloadable {
            return Err(format!("{} cannot be changed online", def.name));
        }
        (def.set)(self, value.trim())
    }

    /// The value of `name` (case-insensitive) as SHOW CONFIG prints it.
    pub fn get(&self, name: &str) -> Option<String> {
        lookup(name).map(|d| (d.show)(self))
    }

    /// SHOW CONFIG: (key, value, default, changeable) for every setting, in table order.
    pub fn show_config(&self) -> impl Iterator<Item = ConfigRow> + '_ {
        TABLE.iter().map(|d| ConfigRow {
            key: d.name,
            value: (d.show)(self),
            default: d.default,
            changeable: d.reloadable,
        })
    }

    /// Settings that have no effect in pgcarpool set to a non-default value (the app logs
    /// a warning for each, with [`no_effect_reason`]).
    pub fn unimplemented_in_use(&self) -> Vec<&'static str> {
        let defaults = Settings::default();
        TABLE
            .iter()
            .filter(|d| !d.implemented && (d.show)(self) != (d.show)(&defaults))
            .map(|d| d.name)
            .collect()
    }

    /// The server check: None = disabled (empty setting), Some("") = send an empty query
    /// (`<empty>`, the default), Some(query) otherwise.
    pub fn server_check(&self) -> Option<&str> {
        match self.server_check_query.trim() {
            "" => None,
            q if q.eq_ignore_ascii_case("<empty>") => Some(""),
            q => Some(q),
        }
    }

    /// `listen_addr` as a list (`*` = all addresses; empty = unix socket only).
    pub fn listen_addrs(&self) -> Vec<String> {
        parse_list(&self.listen_addr)
    }

    /// Settings that differ between `self` (running) and `new` but cannot change without a
    /// restart (PgBouncer keeps the old value and warns).
    pub fn restart_needed(&self, new: &Settings) -> Vec<&'static str> {
        TABLE
            .iter()
            .filter(|d| !d.reloadable && (d.show)(self) != (d.show)(new))
            .map(|d| d.name)
            .collect()
    }

    /// Every setting whose value differs between `self` (running) and `new`, as
    /// (name, old value, new value, reloadable), in table order.
    pub fn changes(&self, new: &Settings) -> Vec<SettingChange> {
        TABLE
            .iter()
            .filter_map(|d| {
                let (old, new) = ((d.show)(self), (d.show)(new));
                (old != new).then_some(SettingChange {
                    name: d.name,
                    old,
                    new,
                    reloadable: d.reloadable,
                })
            })
            .collect()
    }

    /// A setting kept as text in `other` (or its default), e.g. `client_tls_sslmode`.
    pub fn other_value(&self, name: &str) -> Option<String> {
        lookup(name).map(|d| (d.show)(self))
    }
}

/// Settings accepted with no effect, and why (what plays their part in pgcarpool).
pub const NO_EFFECT: &[(&str, &str)] = &[
    (
        "auth_ldap_options",
        "auth_type = ldap is refused at load (pgcarpool is not built with LDAP), as by a \
         PgBouncer built without it",
    ),
    (
        "auth_pam_confdir",
        "auth_type = pam is refused at load (pgcarpool is not built with PAM)",
    ),
    (
        "dns_zone_check_period",
        "as in a PgBouncer built without c-ares (where it is always 0): server host names \
         are looked up at every new connection, so a changed address is used by the next \
         one; server_lifetime bounds how long a connection to an old address lives",
    ),
    (
        "pkt_buf",
        "no fixed packet buffer: each connection's buffers grow to the message at hand \
         (bounded by max_packet_size) and are released while the connection is idle; large \
         results stream through without being buffered whole",
    ),
    (
        "resolv_conf",
        "server host names are resolved by the system's resolver (getaddrinfo, with \
         /etc/hosts and nsswitch), which reads /etc/resolv.conf only: put the DNS servers \
         there (or in the service's own mount namespace)",
    ),
    (
        "sbuf_loopcnt",
        "each connection is its own task on a worker thread, and tokio's cooperative \
         budget makes a busy one yield to the others; workers sets how many threads share \
         the connections",
    ),
];

/// Why setting `name` has no effect in pgcarpool (None: it has one).
pub fn no_effect_reason(name: &str) -> Option<&'static str> {
    NO_EFFECT
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, why)| *why)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_standby_lag_is_bytes_or_a_time() {
        let ok = [
            ("0", StandbyLag::Bytes(0), "0"),
            ("16777216", StandbyLag::Bytes(16777216), "16777216"),
            ("5s", StandbyLag::Time(Duration::from_secs(5)), "5s"),
            (
                " 500ms",
                StandbyLag::Time(Duration::from_millis(500)),
                "500ms",
            ),
            (
                "1.5 s",
                StandbyLag::Time(Duration::from_millis(1500)),
                "1500ms",
            ),
            ("2min", StandbyLag::Time(Duration::from_secs(120)), "120s"),
            ("1h", StandbyLag::Time(Duration::from_secs(3600)), "3600s"),
        ];
        for (v, want, shown) in ok {
            let got = StandbyLag::parse(v).unwrap_or_else(|e| panic!("{v}: {e}"));
            assert_eq!(got, want, "{v}");
            assert_eq!(got.show(), shown, "{v}");
            assert_eq!(StandbyLag::parse(&got.show()), Ok(got));
        }
        for v in ["5 days", "x", "-1", "5sec", "s", "1e400s"] {
            assert!(StandbyLag::parse(v).is_err(), "{v}");
        }
    }

    #[test]
    fn defaults_parse() {
        let mut s = Settings::blank();
        for d in TABLE {
            (d.set)(&mut s, d.default).unwrap_or_else(|e| panic!("{}: {e}", d.name));
            assert_eq!(
                (d.show)(&s),
                d.default,
                "{} shows its default as given",
                d.name
            );
        }
    }

    /// Set `name` to `value` in blank settings and show it back.
    fn set_show(name: &str, value: &str) -> Result<String, String> {
        let d = lookup(name).unwrap();
        let mut s = Settings::blank();
        (d.set)(&mut s, value)?;
        Ok((d.show)(&s))
    }

    #[test]
    fn optional_strings_and_paths_show_what_was_set() {
        assert_eq!(set_show("auth_user", "pgb").unwrap(), "pgb");
        let mut s = Settings::blank();
        (lookup("auth_user").unwrap().set)(&mut s, "pgb").unwrap();
        assert_eq!(s.auth_user.as_deref(), Some("pgb"));
        (lookup("auth_user").unwrap().set)(&mut s, "").unwrap();
        assert_eq!(s.auth_user, None);
        assert_eq!(
            set_show("auth_file", "/etc/pgb/users.txt").unwrap(),
            "/etc/pgb/users.txt"
        );
        assert_eq!(set_show("auth_file", "").unwrap(), "");
    }

    #[test]
    fn seconds_are_plain_decimals() {
        assert_eq!(parse_seconds(" 1.5 "), Ok(Duration::from_millis(1500)));
        for bad in ["1e3", "inf", "NaN", "-1", ".", "", "1s"] {
            assert_eq!(
                parse_seconds(bad),
                Err(format!(
                    "invalid value \"{bad}\": expected seconds (e.g. 30 or 0.5)"
                )),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn modes_are_octal_up_to_7777() {
        assert_eq!(parse_octal("0777"), Ok(0o777));
        assert_eq!(parse_octal("7777"), Ok(0o7777));
        for bad in ["", "89", "0x1ff", "rw"] {
            assert_eq!(
                parse_octal(bad),
                Err(format!(
                    "invalid value \"{bad}\": expected an octal mode like 0777"
                )),
                "{bad:?}"
            );
        }
        assert_eq!(
            parse_octal("17777"),
            Err("invalid value \"17777\": mode out of range".to_string())
        );
    }

    #[test]
    fn settings_kept_as_text_are_checked_by_type() {
        assert_eq!(set_show("listen_backlog", "64").unwrap(), "64");
        assert!(set_show("listen_backlog", "-1").is_err());
        assert_eq!(set_show("dns_nxdomain_ttl", "0.5").unwrap(), "0.5");
        assert!(set_show("dns_nxdomain_ttl", "soon").is_err());
    }

    #[test]
    fn a_setting_definition_debugs_without_its_functions() {
        assert_eq!(
            format!("{:?}", lookup("listen_port").unwrap()),
            "SettingDef { name: \"listen_port\", default: \"6432\", reloadable: false, \
             implemented: true }"
        );
    }

    #[test]
    fn table_is_sorted_and_unique() {
        let names: Vec<_> = TABLE.iter().map(|d| d.name).collect();
        let pg: Vec<_> = names
            .iter()
            .copied()
            .filter(|n| {
                ![
                    "prometheus_addr",
                    "prometheus_port",
                    "workers",
                    "worker_spread_load",
                    "pin_mode",
                    "log_format",
                    "pin_pool_size",
                    "check_function_calls",
                    "plan_once",
                    "deferred_begin",
                    "client_max_statements",
                    "client_max_settings",
                    "statement_registry_size",
                    "notify_queue_limit",
                    "peers_dns",
                    "peers_hosts_file",
                    "auth_query_cache_ttl",
                    "server_role_check_interval",
                    "max_standby_lag",
                    "read_routing",
                    "read_your_writes",
                ]
                .contains(n)
            })
            .collect();
        let mut sorted = pg.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(pg, sorted);
    }

    #[test]
    fn pgbouncer_defaults() {
        let s = Settings::default();
        assert_eq!(s.listen_port, 6432);
        assert_eq!(s.listen_addr, "");
        assert_eq!(s.pool_mode, PoolMode::Session);
        assert_eq!(s.max_client_conn, 100);
        assert_eq!(s.default_pool_size, 20);
        assert_eq!(s.server_reset_query, "DISCARD ALL");
        assert_eq!(s.server_check_query, "<empty>");
        assert_eq!(s.server_check(), Some(""));
        assert_eq!(s.server_check_delay, Duration::from_secs(30));
        assert_eq!(s.server_lifetime, Duration::from_secs(3600));
        assert_eq!(s.server_idle_timeout, Duration::from_secs(600));
        assert_eq!(s.server_connect_timeout, Duration::from_secs(15));
        assert_eq!(s.server_login_retry, Duration::from_secs(15));
        assert_eq!(s.client_login_timeout, Duration::from_secs(60));
        assert_eq!(s.query_wait_timeout, Duration::from_secs(120));
        assert_eq!(s.reserve_pool_timeout, Duration::from_secs(5));
        assert_eq!(s.cancel_wait_timeout, Duration::from_secs(10));
        assert_eq!(s.query_wait_notify, Duration::from_secs(5));
        assert_eq!(s.suspend_timeout, Duration::from_secs(10));
        assert_eq!(s.stats_period, Duration::from_secs(60));
        assert_eq!(s.auth_type, AuthType::Md5);
        assert_eq!(s.auth_file, None);
        assert_eq!(s.unix_socket_dir, "/tmp");
        assert_eq!(s.unix_socket_mode, 0o777);
        assert!(s.tcp_keepalive);
        assert_eq!(s.max_prepared_statements, 200);
        assert!(s.log_connections && s.log_disconnections && s.log_pooler_errors);
        assert_eq!(s.pkt_buf, 4096);
        assert_eq!(s.max_packet_size, 2147483647);
        assert_eq!(s.job_name, "pgbouncer");
        assert_eq!(s.track_extra_parameters, vec!["IntervalStyle".to_string()]);
        assert!(s.unimplemented_in_use().is_empty());
    }

    #[test]
    fn value_forms() {
        let mut s = Settings::default();
        s.load_value("SERVER_LIFETIME", "0.5").unwrap();
        assert_eq!(s.server_lifetime, Duration::from_millis(500));
        assert_eq!(s.get("server_lifetime").unwrap(), "0.5");
        for (v, b) in [
            ("on", true),
            ("off", false),
            ("yes", true),
            ("No", false),
            ("true", true),
            ("0", false),
            ("1", true),
        ] {
            s.load_value("server_round_robin", v).unwrap();
            assert_eq!(s.server_round_robin, b, "{v}");
        }
        s.load_value("admin_users", " a , b,,c ").unwrap();
        assert_eq!(s.admin_users, vec!["a", "b", "c"]);
        assert_eq!(s.get("admin_users").unwrap(), "a,b,c");
        s.load_value("unix_socket_mode", "0700").unwrap();
        assert_eq!(s.unix_socket_mode, 0o700);
        assert_eq!(s.get("unix_socket_mode").unwrap(), "0700");
        s.load_value("tcp_user_timeout", "1500").unwrap();
        assert_eq!(s.tcp_user_timeout, Duration::from_millis(1500));
        s.load_value("auth_type", "scram-sha-256").unwrap();
        assert_eq!(s.auth_type, AuthType::ScramSha256);
        s.load_value("pool_mode", "Transaction").unwrap();
        assert_eq!(s.pool_mode, PoolMode::Transaction);
        s.load_value("auth_file", "users.txt").unwrap();
        assert_eq!(s.auth_file, Some(PathBuf::from("users.txt")));
        s.load_value("client_tls_sslmode", "require").unwrap();
        assert_eq!(s.other_value("client_tls_sslmode").unwrap(), "require");
        s.load_value("service_name", "x").unwrap();
        assert_eq!(s.job_name, "x");
    }

    #[test]
    fn bad_values() {
        let mut s = Settings::default();
        for (k, v) in [
            ("listen_port", "65536"),
            ("listen_port", "-1"),
            ("listen_port", "abc"),
            ("max_client_conn", ""),
            ("server_lifetime", "-1"),
            ("server_lifetime", "1s"),
            ("server_lifetime", "."),
            ("server_round_robin", "maybe"),
            ("pool_mode", "sessions"),
            ("auth_type", "ldap"),
            ("auth_type", "password"),
            ("unix_socket_mode", "0789"),
            ("client_tls_sslmode", "sometimes"),
            ("peer_id", "16384"),
            ("syslog", "2"),
        ] {
            assert!(s.load_value(k, v).is_err(), "{k} = {v}");
        }
        assert_eq!(
            s.load_value("nope", "1").unwrap_err(),
            "unknown setting \"nope\""
        );
        assert!(s.get("nope").is_none());
    }

    #[test]
    fn changes_name_each_differing_setting_once() {
        let old = Settings::default();
        let mut new = Settings::default();
        new.load_value("default_pool_size", "9").unwrap();
        new.load_value("listen_port", "7000").unwrap();
        let changes = old.changes(&new);
        let names: Vec<&str> = changes.iter().map(|c| c.name).collect();
        assert_eq!(names.len(), 2, "{changes:?}");
        let pool = changes
            .iter()
            .find(|c| c.name == "default_pool_size")
            .unwrap();
        assert_eq!((pool.old.as_str(), pool.new.as_str()), ("20", "9"));
        assert!(pool.reloadable);
        let port = changes.iter().find(|c| c.name == "listen_port").unwrap();
        assert!(!port.reloadable);
        assert_eq!(
            port.to_string(),
            "listen_port: \"6432\" -> \"7000\" (needs a restart: keeping \"6432\")"
        );
        assert!(old.changes(&old.clone()).is_empty());
    }

    #[test]
    fn set_from_console() {
        let mut s = Settings::default();
        s.set("Default_Pool_Size", "7").unwrap();
        assert_eq!(s.default_pool_size, 7);
        assert_eq!(
            s.set("listen_port", "1").unwrap_err(),
            "listen_port cannot be changed online"
        );
        assert_eq!(s.listen_port, 6432);
        assert!(s.set("default_pool_size", "x").is_err());
        assert_eq!(s.default_pool_size, 7);
        assert!(is_reloadable("query_timeout"));
        assert!(!is_reloadable("unix_socket_dir"));
        assert!(!is_reloadable("nope"));
    }

    #[test]
    fn reload_helpers() {
        let old = Settings::default();
        let mut new = Settings::default();
        new.load_value("listen_port", "7000").unwrap();
        new.load_value("unix_socket_group", "pg").unwrap();
        new.load_value("default_pool_size", "1").unwrap();
        assert_eq!(
            old.restart_needed(&new),
            vec!["listen_port", "unix_socket_group"]
        );
        new.load_value("listen_addr", "127.0.0.1, ::1").unwrap();
        assert_eq!(new.listen_addrs(), vec!["127.0.0.1", "::1"]);
        assert!(old.listen_addrs().is_empty());
    }

    #[test]
    fn show_config_rows() {
        let s = Settings::default();
        let rows: Vec<_> = s.show_config().collect();
        assert_eq!(rows.len(), TABLE.len());
        let port = rows.iter().find(|r| r.key == "listen_port").unwrap();
        assert_eq!(port.value, "6432");
        assert_eq!(port.default, "6432");
        assert!(!port.changeable);
    }

    #[test]
    fn every_setting_with_no_effect_says_why() {
        for d in TABLE {
            assert_eq!(
                !d.implemented,
                no_effect_reason(d.name).is_some(),
                "{}: implemented = {}, reason given = {:?}",
                d.name,
                d.implemented,
                no_effect_reason(d.name)
            );
        }
    }

    #[test]
    fn unimplemented_listed_when_changed() {
        let mut s = Settings::default();
        s.load_value("pkt_buf", "8192").unwrap();
        s.load_value("client_tls_sslmode", "require").unwrap();
        s.load_value("default_pool_size", "3").unwrap();
        // client TLS is implemented now.
        assert_eq!(s.unimplemented_in_use(), vec!["pkt_buf"]);
        s.load_value("auth_type", "cert").unwrap();
        assert_eq!(s.unimplemented_in_use(), vec!["pkt_buf"]);
    }
}
