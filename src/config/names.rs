//! Names whose spelling the configuration checks and the floors above use: the console's
//! database, syslog facilities, the `peers_dns` target.

/// The console's database (PgBouncer's `pgbouncer`, and pgcarpool's own name).
pub fn is_admin_db(db: &str) -> bool {
    db == "pgbouncer" || db == "pgcarpool"
}

/// The numeric syslog facility for a `syslog_facility` name.
pub fn facility_code(name: &str) -> Option<u8> {
    Some(match name {
        "kern" => 0,
        "user" => 1,
        "mail" => 2,
        "daemon" => 3,
        "auth" => 4,
        "syslog" => 5,
        "lpr" => 6,
        "news" => 7,
        "uucp" => 8,
        "cron" => 9,
        "authpriv" => 10,
        "ftp" => 11,
        "local0" => 16,
        "local1" => 17,
        "local2" => 18,
        "local3" => 19,
        "local4" => 20,
        "local5" => 21,
        "local6" => 22,
        "local7" => 23,
        _ => return None,
    })
}

/// `peers_dns` parsed: the name and the port (None: `listen_port`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub name: String,
    pub port: Option<u16>,
}

/// Parse `name`, `name:port`, `[v6]:port`.
pub fn parse_target(v: &str) -> Result<Target, String> {
    let v = v.trim();
    let bad = || format!("invalid peers_dns {v:?}: expected name or name:port");
    if v.is_empty() {
        return Err(bad());
    }
    let (name, port) = if let Some(rest) = v.strip_prefix('[') {
        let (n, tail) = rest.split_once(']').ok_or_else(bad)?;
        match tail {
            "" => (n, None),
            t => (n, Some(t.strip_prefix(':').ok_or_else(bad)?)),
        }
    } else if v.matches(':').count() == 1 {
        let (n, p) = v.split_once(':').ok_or_else(bad)?;
        (n, Some(p))
    } else {
        (v, None)
    };
    if name.is_empty() || name.contains(char::is_whitespace) {
        return Err(bad());
    }
    let port = match port {
        None => None,
        Some(p) => Some(p.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(bad)?),
    };
    Ok(Target {
        name: name.to_string(),
        port,
    })
}
