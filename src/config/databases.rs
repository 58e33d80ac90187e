//! `[databases]` and `[users]` entries (libpq-style `key=value` lists).
//!
//! Pure parsing of one entry's value; `mod.rs` adds the file and line to errors.
use std::time::Duration;

use super::PoolMode;
use super::settings::parse_seconds;

/// One `[databases]` entry. `Debug` redacts the password.
#[derive(Clone, Default, PartialEq)]
pub struct DatabaseEntry {
    /// Name clients use.
    pub name: String,
    /// Server host; None = unix socket in the default location; a value starting with '/' is a socket dir.
    pub host: Option<String>,
    /// Server port (default 5432); with `port=a,b,…` the first.
    pub port: u16,
    /// `port=a,b,…` (libpq's per-host ports): one per host of `host=`; empty when one port
    /// is given (it serves every host).
    pub ports: Vec<u16>,
    /// Server database name (default: `name`).
    pub dbname: Option<String>,
    /// Forced server user.
    pub user: Option<String>,
    /// Password for the forced user.
    pub password: Option<String>,
    /// Per-database `auth_user`: users missing from auth_file are looked up with auth_query as it.
    pub auth_user: Option<String>,
    pub pool_size: Option<usize>,
    pub min_pool_size: Option<usize>,
    /// `reserve_pool_size` (or its old alias `reserve_pool`).
    pub reserve_pool: Option<usize>,
    pub pool_mode: Option<PoolMode>,
    pub max_db_connections: Option<usize>,
    pub max_db_client_connections: Option<usize>,
    pub connect_query: Option<String>,
    /// pgcarpool extension: `pin` or `error` for this database's pools.
    pub pin_mode: Option<String>,
    pub client_encoding: Option<String>,
    pub datestyle: Option<String>,
    pub timezone: Option<String>,
    pub application_name: Option<String>,
    /// Per-database `auth_query` override.
    pub auth_query: Option<String>,
    /// Per-database `auth_dbname` override (the database auth_query runs in).
    pub auth_dbname: Option<String>,
    /// Per-database `server_lifetime`.
    pub server_lifetime: Option<Duration>,
    /// Per-database `query_wait_timeout` (-1 in the file = not set).
    pub query_wait_timeout: Option<Duration>,
    /// `round-robin` or `disable` (parsed; not implemented yet).
    pub load_balance_hosts: Option<String>,
    /// libpq's `any`, `read-write`, `read-only`, `primary`, `standby`, `prefer-standby`:
    /// the role a server's host must have (checked at login and by the host role check).
    pub target_session_attrs: Option<String>,
    /// pgcarpool extension: reads to standbys (`read_routing`, `read_your_writes`).
    pub read_routing: Option<bool>,
    pub read_your_writes: Option<bool>,
}

impl std::fmt::Debug for DatabaseEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseEntry")
            .field("name", &self.name)
            .field("host", &self.host)
            .field("port", &self.port)
            .field("ports", &self.ports)
            .field("dbname", &self.dbname)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("auth_user", &self.auth_user)
            .field("pool_size", &self.pool_size)
            .field("min_pool_size", &self.min_pool_size)
            .field("reserve_pool", &self.reserve_pool)
            .field("pool_mode", &self.pool_mode)
            .field("max_db_connections", &self.max_db_connections)
            .field("max_db_client_connections", &self.max_db_client_connections)
            .field("connect_query", &self.connect_query)
            .field("client_encoding", &self.client_encoding)
            .field("datestyle", &self.datestyle)
            .field("timezone", &self.timezone)
            .field("application_name", &self.application_name)
            .field("auth_query", &self.auth_query)
            .field("auth_dbname", &self.auth_dbname)
            .field("server_lifetime", &self.server_lifetime)
            .field("query_wait_timeout", &self.query_wait_timeout)
            .field("load_balance_hosts", &self.load_balance_hosts)
            .field("target_session_attrs", &self.target_session_attrs)
            .field("read_routing", &self.read_routing)
            .field("read_your_writes", &self.read_your_writes)
            .finish()
    }
}

impl DatabaseEntry {
    /// The server database name: `dbname`, else the client-visible name.
    pub fn server_dbname(&self) -> &str {
        self.dbname.as_deref().unwrap_or(&self.name)
    }

    /// The hosts of `host=a,b,…` (None: the default Unix socket directory), in order.
    pub fn hosts(&self) -> Vec<Option<&str>> {
        match self.host.as_deref() {
            Some(list) => list
                .split(',')
                .map(str::trim)
                .filter(|h| !h.is_empty())
                .map(Some)
                .collect(),
            None => vec![None],
        }
    }

    /// Each host with its port (libpq: one port per host, or one port for all).
    pub fn host_ports(&self) -> Vec<(Option<&str>, u16)> {
        let port = if self.port == 0 { 5432 } else { self.port };
        self.hosts()
            .into_iter()
            .enumerate()
            .map(|(i, h)| (h, self.ports.get(i).copied().unwrap_or(port)))
            .collect()
    }
}

/// One `[users]` entry.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UserEntry {
    pub name: String,
    pub pool_mode: Option<PoolMode>,
    pub pool_size: Option<usize>,
    pub reserve_pool_size: Option<usize>,
    pub max_user_connections: Option<usize>,
    pub max_user_client_connections: Option<usize>,
    pub query_timeout: Option<Duration>,
    /// -1 in the file = not set.
    pub query_wait_timeout: Option<Duration>,
    pub idle_transaction_timeout: Option<Duration>,
    pub transaction_timeout: Option<Duration>,
    pub client_idle_timeout: Option<Duration>,
}

/// One `[peers]` entry: where peer `peer_id` takes the cancel requests meant for it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PeerEntry {
    pub peer_id: u16,
    pub host: Option<String>,
    /// Default 6432.
    pub port: u16,
    pub pool_size: Option<usize>,
}

/// An error in one entry's value: which key (if any) and what is wrong. Never contains a password.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{}{msg}", if key.is_empty() { String::new() } else { format!("{key}: ") })]
pub struct EntryError {
    /// The parameter at fault; empty when the text is not a `key=value`.
    pub key: String,
    pub msg: String,
}

fn entry_err(key: &str, msg: impl Into<String>) -> EntryError {
    EntryError {
        key: key.to_string(),
        msg: msg.into(),
    }
}

/// Split a libpq-style connection string into `(key, value)` pairs: `key=value` separated by
/// spaces, spaces around `=` allowed, values optionally single-quoted with `\'` or `''` for a quote
/// (and `\\` for a backslash).
pub fn parse_pairs(text: &str) -> Result<Vec<(String, String)>, EntryError> {
    let b = text.as_bytes();
    let mut i = 0;
    let mut out: Vec<(String, String)> = Vec::new();
    // Text that does not parse right after a password may be part of it: never echo it.
    let after_password =
        |out: &Vec<(String, String)>| out.last().is_some_and(|(k, _)| k == "password");
    let skip_ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    loop {
        skip_ws(&mut i);
        if i >= b.len() {
            break;
        }
        let start = i;
        while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
            i += 1;
        }
        let key = text[start..i].to_ascii_lowercase();
        let missing_eq = {
            let mut j = i;
            skip_ws(&mut j);
            j >= b.len() || b[j] != b'='
        };
        if key.is_empty() || missing_eq {
            if after_password(&out) {
                return Err(entry_err(
                    "password",
                    "unexpected text after the value (quote values containing spaces)",
                ));
            }
            if key.is_empty() {
                return Err(entry_err("", "expected key=value"));
            }
            return Err(entry_err(&key, "expected '=' after the key"));
        }
        skip_ws(&mut i);
        i += 1;
        skip_ws(&mut i);
        let mut val = String::new();
        if i < b.len() && b[i] == b'\'' {
            i += 1;
            let mut closed = false;
            let mut seg = i;
            while i < b.len() {
                match b[i] {
                    b'\\' if i + 1 < b.len() => {
                        val.push_str(&text[seg..i]);
                        // the escaped char is ASCII or the start of a UTF-8 sequence: copy whole char
                        let ch_len = text[i + 1..].chars().next().map_or(1, char::len_utf8);
                        val.push_str(&text[i + 1..i + 1 + ch_len]);
                        i += 1 + ch_len;
                        seg = i;
                    }
                    b'\'' if i + 1 < b.len() && b[i + 1] == b'\'' => {
                        val.push_str(&text[seg..i]);
                        val.push('\'');
                        i += 2;
                        seg = i;
                    }
                    b'\'' => {
                        val.push_str(&text[seg..i]);
                        i += 1;
                        closed = true;
                        break;
                    }
                    _ => i += 1,
                }
            }
            if !closed {
                return Err(entry_err(&key, "unterminated quoted value"));
            }
            if i < b.len() && !b[i].is_ascii_whitespace() {
                return Err(entry_err(&key, "expected a space after the quoted value"));
            }
        } else {
            let start = i;
            while i < b.len() && !b[i].is_ascii_whitespace() {
                i += 1;
            }
            val.push_str(&text[start..i]);
        }
        out.push((key, val));
    }
    Ok(out)
}

fn uint<T: std::str::FromStr>(key: &str, v: &str) -> Result<T, EntryError> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(entry_err(
            key,
            format!("invalid value \"{v}\": expected a non-negative integer"),
        ));
    }
    v.parse()
        .map_err(|_| entry_err(key, format!("invalid value \"{v}\": out of range")))
}

fn secs(key: &str, v: &str) -> Result<Duration, EntryError> {
    parse_seconds(v).map_err(|m| entry_err(key, m))
}

/// Seconds, where -1 means "not set".
fn opt_secs(key: &str, v: &str) -> Result<Option<Duration>, EntryError> {
    if v.trim() == "-1" {
        Ok(None)
    } else {
        secs(key, v).map(Some)
    }
}

fn pool_mode(key: &str, v: &str) -> Result<PoolMode, EntryError> {
    v.parse().map_err(|m: String| entry_err(key, m))
}

fn one_of(key: &str, v: &str, allowed: &[&str]) -> Result<String, EntryError> {
    if allowed.contains(&v) {
        Ok(v.to_string())
    } else {
        Err(entry_err(
            key,
            format!(
                "invalid value \"{v}\": expected one of {}",
                allowed.join(", ")
            ),
        ))
    }
}

fn boolean(key: &str, v: &str) -> Result<bool, EntryError> {
    super::settings::parse_bool(v).map_err(|e| entry_err(key, e))
}

fn non_empty(key: &str, v: &str) -> Result<String, EntryError> {
    if v.is_empty() {
        Err(entry_err(key, "empty value"))
    } else {
        Ok(v.to_string())
    }
}

/// Parse a `[databases]` value for the entry `name`.
pub fn parse_database(name: &str, text: &str) -> Result<DatabaseEntry, EntryError> {
    if name.eq_ignore_ascii_case("pgbouncer") {
        return Err(entry_err(
            "",
            "the database name \"pgbouncer\" is reserved for the admin console",
        ));
    }
    let mut d = DatabaseEntry {
        name: name.to_string(),
        port: 5432,
        ..Default::default()
    };
    for (k, v) in parse_pairs(text)? {
        let k = k.as_str();
        let v = v.as_str();
        match k {
            "host" => d.host = Some(non_empty(k, v)?),
            "port" => {
                let mut ports = Vec::new();
                for p in v.split(',') {
                    let p: u16 = uint(k, p.trim())?;
                    if p == 0 {
                        return Err(entry_err(k, "port must be 1..65535"));
                    }
                    ports.push(p);
                }
                d.port = ports[0];
                d.ports = if ports.len() > 1 { ports } else { Vec::new() };
            }
            "dbname" => d.dbname = Some(non_empty(k, v)?),
            "user" => d.user = Some(non_empty(k, v)?),
            // Never echo the password back.
            "password" => d.password = Some(v.to_string()),
            "auth_user" => d.auth_user = Some(non_empty(k, v)?),
            "auth_query" => d.auth_query = Some(non_empty(k, v)?),
            "auth_dbname" => d.auth_dbname = Some(non_empty(k, v)?),
            "pool_size" => d.pool_size = Some(uint(k, v)?),
            "min_pool_size" => d.min_pool_size = Some(uint(k, v)?),
            "reserve_pool" | "reserve_pool_size" => d.reserve_pool = Some(uint(k, v)?),
            "pool_mode" => d.pool_mode = Some(pool_mode(k, v)?),
            "max_db_connections" => d.max_db_connections = Some(uint(k, v)?),
            "max_db_client_connections" => d.max_db_client_connections = Some(uint(k, v)?),
            "server_lifetime" => d.server_lifetime = Some(secs(k, v)?),
            "query_wait_timeout" => d.query_wait_timeout = opt_secs(k, v)?,
            "connect_query" => d.connect_query = Some(v.to_string()),
            "pin_mode" => d.pin_mode = Some(one_of(k, v, &["pin", "error"])?),
            "client_encoding" => d.client_encoding = Some(v.to_string()),
            "datestyle" => d.datestyle = Some(v.to_string()),
            "timezone" => d.timezone = Some(v.to_string()),
            "application_name" => d.application_name = Some(v.to_string()),
            "load_balance_hosts" => {
                d.load_balance_hosts = Some(one_of(k, v, &["round-robin", "disable"])?)
            }
            "target_session_attrs" => {
                d.target_session_attrs = Some(one_of(
                    k,
                    v,
                    &[
                        "any",
                        "read-write",
                        "read-only",
                        "primary",
                        "standby",
                        "prefer-standby",
                    ],
                )?)
            }
            "read_routing" => d.read_routing = Some(boolean(k, v)?),
            "read_your_writes" => d.read_your_writes = Some(boolean(k, v)?),
            _ => return Err(entry_err(k, "unknown parameter in [databases] entry")),
        }
    }
    if !d.ports.is_empty() {
        let hosts = d.hosts().len();
        if hosts != d.ports.len() {
            return Err(entry_err(
                "port",
                format!(
                    "{} ports for {hosts} host(s): give one port per host of host=, or one port for all",
                    d.ports.len()
                ),
            ));
        }
    }
    Ok(d)
}

/// Parse a `[users]` value for the user `name`.
pub fn parse_user(name: &str, text: &str) -> Result<UserEntry, EntryError> {
    let mut u = UserEntry {
        name: name.to_string(),
        ..Default::default()
    };
    for (k, v) in parse_pairs(text)? {
        let k = k.as_str();
        let v = v.as_str();
        match k {
            "pool_mode" => u.pool_mode = Some(pool_mode(k, v)?),
            "pool_size" => u.pool_size = Some(uint(k, v)?),
            "reserve_pool_size" => u.reserve_pool_size = Some(uint(k, v)?),
            "max_user_connections" => u.max_user_connections = Some(uint(k, v)?),
            "max_user_client_connections" => u.max_user_client_connections = Some(uint(k, v)?),
            "query_timeout" => u.query_timeout = Some(secs(k, v)?),
            "query_wait_timeout" => u.query_wait_timeout = opt_secs(k, v)?,
            "idle_transaction_timeout" => u.idle_transaction_timeout = Some(secs(k, v)?),
            "transaction_timeout" => u.transaction_timeout = Some(secs(k, v)?),
            "client_idle_timeout" => u.client_idle_timeout = Some(secs(k, v)?),
            _ => return Err(entry_err(k, "unknown parameter in [users] entry")),
        }
    }
    Ok(u)
}

/// Parse a `[peers]` value; `name` is the peer id (1..16383).
pub fn parse_peer(name: &str, text: &str) -> Result<PeerEntry, EntryError> {
    let peer_id: u16 = uint(name, name)?;
    if !(1..=16383).contains(&peer_id) {
        return Err(entry_err(name, "peer id must be 1..16383"));
    }
    let mut p = PeerEntry {
        peer_id,
        port: 6432,
        ..Default::default()
    };
    for (k, v) in parse_pairs(text)? {
        let k = k.as_str();
        let v = v.as_str();
        match k {
            "host" => p.host = Some(non_empty(k, v)?),
            "port" => p.port = uint(k, v)?,
            "pool_size" => p.pool_size = Some(uint(k, v)?),
            _ => return Err(entry_err(k, "unknown parameter in [peers] entry")),
        }
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(t: &str) -> Vec<(String, String)> {
        parse_pairs(t).unwrap()
    }

    #[test]
    fn pin_mode_and_peer_pool_size_are_read() {
        assert_eq!(
            parse_database("d", "pin_mode=error")
                .unwrap()
                .pin_mode
                .as_deref(),
            Some("error")
        );
        assert!(parse_database("d", "pin_mode=maybe").is_err());
        let p = parse_peer("1", "host=h pool_size=3").unwrap();
        assert_eq!((p.host.as_deref(), p.pool_size), (Some("h"), Some(3)));
    }

    #[test]
    fn pair_forms() {
        let s = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(pairs(""), vec![]);
        assert_eq!(
            pairs("  host=a  port = 5433 "),
            vec![s("host", "a"), s("port", "5433")]
        );
        assert_eq!(
            pairs(r"connect_query='SELECT ''x'', \'y\', \\z' user=u"),
            vec![s("connect_query", r"SELECT 'x', 'y', \z"), s("user", "u")]
        );
        assert_eq!(
            pairs("application_name='é app'"),
            vec![s("application_name", "é app")]
        );
        assert_eq!(pairs("password=''"), vec![s("password", "")]);
        assert_eq!(pairs("HOST=x"), vec![s("host", "x")]);
    }

    #[test]
    fn pair_errors() {
        assert_eq!(
            parse_pairs("host").unwrap_err().to_string(),
            "host: expected '=' after the key"
        );
        assert_eq!(
            parse_pairs("connect_query='abc").unwrap_err().to_string(),
            "connect_query: unterminated quoted value"
        );
        assert_eq!(
            parse_pairs("user='a'b").unwrap_err().to_string(),
            "user: expected a space after the quoted value"
        );
        assert_eq!(
            parse_pairs("=x").unwrap_err().to_string(),
            "expected key=value"
        );
    }

    #[test]
    fn database_all_keys() {
        let d = parse_database(
            "app",
            "host=db1,db2 port=6000 dbname=real user=u password='p w' auth_user=au pool_size=5 \
             min_pool_size=1 reserve_pool=2 pool_mode=transaction max_db_connections=9 \
             max_db_client_connections=90 connect_query='SET x = 1' client_encoding=UTF8 \
             datestyle=ISO timezone=UTC application_name=a auth_query='SELECT 1' auth_dbname=d \
             server_lifetime=1.5 query_wait_timeout=-1 load_balance_hosts=disable \
             target_session_attrs=read-write",
        )
        .unwrap();
        assert_eq!(d.name, "app");
        assert_eq!(d.host.as_deref(), Some("db1,db2"));
        assert_eq!(d.port, 6000);
        assert_eq!(d.server_dbname(), "real");
        assert_eq!(d.user.as_deref(), Some("u"));
        assert_eq!(d.password.as_deref(), Some("p w"));
        assert_eq!(d.auth_user.as_deref(), Some("au"));
        assert_eq!(d.pool_size, Some(5));
        assert_eq!(d.min_pool_size, Some(1));
        assert_eq!(d.reserve_pool, Some(2));
        assert_eq!(d.pool_mode, Some(PoolMode::Transaction));
        assert_eq!(d.max_db_connections, Some(9));
        assert_eq!(d.max_db_client_connections, Some(90));
        assert_eq!(d.connect_query.as_deref(), Some("SET x = 1"));
        assert_eq!(d.client_encoding.as_deref(), Some("UTF8"));
        assert_eq!(d.datestyle.as_deref(), Some("ISO"));
        assert_eq!(d.timezone.as_deref(), Some("UTC"));
        assert_eq!(d.application_name.as_deref(), Some("a"));
        assert_eq!(d.auth_query.as_deref(), Some("SELECT 1"));
        assert_eq!(d.auth_dbname.as_deref(), Some("d"));
        assert_eq!(d.server_lifetime, Some(Duration::from_millis(1500)));
        assert_eq!(d.query_wait_timeout, None);
        assert_eq!(d.load_balance_hosts.as_deref(), Some("disable"));
        assert_eq!(d.target_session_attrs.as_deref(), Some("read-write"));

        let d = parse_database("foodb", "").unwrap();
        assert_eq!(
            (d.port, d.server_dbname(), d.host.clone()),
            (5432, "foodb", None)
        );
        assert_eq!(
            parse_database("x", "reserve_pool_size=3")
                .unwrap()
                .reserve_pool,
            Some(3)
        );
    }

    #[test]
    fn database_errors() {
        let e = |t: &str| parse_database("x", t).unwrap_err().to_string();
        assert_eq!(
            e("port=abc"),
            "port: invalid value \"abc\": expected a non-negative integer"
        );
        assert_eq!(
            e("port=70000"),
            "port: invalid value \"70000\": out of range"
        );
        assert_eq!(e("port=0"), "port: port must be 1..65535");
        assert_eq!(
            e("pool_size=-1"),
            "pool_size: invalid value \"-1\": expected a non-negative integer"
        );
        assert!(e("pool_mode=sometimes").starts_with("pool_mode: invalid value \"sometimes\""));
        assert_eq!(
            e("sslmode=require"),
            "sslmode: unknown parameter in [databases] entry"
        );
        assert_eq!(e("host="), "host: empty value");
        assert!(
            e("target_session_attrs=prefer-primary")
                .starts_with("target_session_attrs: invalid value")
        );
        assert_eq!(
            e("host=a,b port=1,2,3"),
            "port: 3 ports for 2 host(s): give one port per host of host=, or one port for all"
        );
        assert_eq!(e("port=5432,0"), "port: port must be 1..65535");
        assert!(e("port=5432,x").starts_with("port: invalid value \"x\""));
        assert_eq!(
            parse_database("pgbouncer", "").unwrap_err().to_string(),
            "the database name \"pgbouncer\" is reserved for the admin console"
        );
    }

    #[test]
    fn per_host_ports_as_libpq() {
        let d = parse_database(
            "x",
            "host=127.0.0.1,127.0.0.1 port=5433,5434 target_session_attrs=prefer-standby",
        )
        .unwrap();
        assert_eq!(
            d.host_ports(),
            vec![(Some("127.0.0.1"), 5433), (Some("127.0.0.1"), 5434)]
        );
        assert_eq!(d.target_session_attrs.as_deref(), Some("prefer-standby"));
        let one = parse_database("x", "host=a,b port=6000").unwrap();
        assert_eq!(one.host_ports(), vec![(Some("a"), 6000), (Some("b"), 6000)]);
        assert!(one.ports.is_empty());
        let sock = parse_database("x", "port=7000").unwrap();
        assert_eq!(sock.host_ports(), vec![(None, 7000)]);
    }

    #[test]
    fn read_routing_options_are_booleans() {
        let d = parse_database("x", "host=a,b read_routing=on read_your_writes=off").unwrap();
        assert_eq!(
            (d.read_routing, d.read_your_writes),
            (Some(true), Some(false))
        );
        let d = parse_database("x", "host=a").unwrap();
        assert_eq!((d.read_routing, d.read_your_writes), (None, None));
        assert!(
            parse_database("x", "read_routing=maybe")
                .unwrap_err()
                .to_string()
                .starts_with("read_routing: invalid value")
        );
    }

    #[test]
    fn password_never_in_errors() {
        for t in [
            "password='secret",
            "password=my secret",
            "password=my s=cret",
            "password=a !secret",
        ] {
            let e = parse_database("x", t).unwrap_err().to_string();
            assert!(!e.contains("secret") && !e.contains("cret"), "{e}");
        }
    }

    #[test]
    fn debug_redacts_password() {
        let d = parse_database("x", "user=u password=hunter2").unwrap();
        let dbg = format!("{d:?}");
        assert!(
            !dbg.contains("hunter2") && dbg.contains("<redacted>"),
            "{dbg}"
        );
    }

    #[test]
    fn users() {
        let u = parse_user(
            "bob",
            "pool_mode=statement pool_size=3 reserve_pool_size=1 max_user_connections=4 \
             max_user_client_connections=40 query_timeout=10 query_wait_timeout=-1 \
             idle_transaction_timeout=2 transaction_timeout=3 client_idle_timeout=4",
        )
        .unwrap();
        assert_eq!(u.name, "bob");
        assert_eq!(u.pool_mode, Some(PoolMode::Statement));
        assert_eq!(u.pool_size, Some(3));
        assert_eq!(u.reserve_pool_size, Some(1));
        assert_eq!(u.max_user_connections, Some(4));
        assert_eq!(u.max_user_client_connections, Some(40));
        assert_eq!(u.query_timeout, Some(Duration::from_secs(10)));
        assert_eq!(u.query_wait_timeout, None);
        assert_eq!(u.idle_transaction_timeout, Some(Duration::from_secs(2)));
        assert_eq!(u.transaction_timeout, Some(Duration::from_secs(3)));
        assert_eq!(u.client_idle_timeout, Some(Duration::from_secs(4)));
        assert_eq!(
            parse_user("bob", "host=x").unwrap_err().to_string(),
            "host: unknown parameter in [users] entry"
        );
    }

    #[test]
    fn peers() {
        let p = parse_peer("2", "host=/tmp/pgbouncer-2  port=5555").unwrap();
        assert_eq!(
            (p.peer_id, p.host.as_deref(), p.port),
            (2, Some("/tmp/pgbouncer-2"), 5555)
        );
        assert_eq!(parse_peer("1", "host=h").unwrap().port, 6432);
        assert!(parse_peer("0", "host=h").is_err());
        assert!(parse_peer("abc", "host=h").is_err());
        assert!(parse_peer("1", "user=h").is_err());
    }
}
