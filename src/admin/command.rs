//! Console commands: `Command` parsed from SQL text (case-insensitive, trailing `;` allowed).

/// The SHOW views.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    Help,
    Config,
    Databases,
    Pools,
    Clients,
    Servers,
    Users,
    Stats,
    StatsTotals,
    StatsAverages,
    Totals,
    Lists,
    Mem,
    Fds,
    Sockets,
    ActiveSockets,
    DnsHosts,
    DnsZones,
    Version,
    State,
    Peers,
    PeerPools,
    PreparedStatements,
    /// pgcarpool's own: latency percentiles and extras per pool.
    Carpool,
    /// pgcarpool's own: clients pinned to a server, why and since when.
    Pins,
    /// pgcarpool's own: worker threads and their clients.
    Workers,
    /// pgcarpool's own: each host of each pool's host list, its role, lag and health.
    Hosts,
    /// pgcarpool's own: how each client stands in an online restart (`-R`).
    Handover,
    /// pgcarpool's own: the last switchovers and login errors of each pool.
    Events,
}

/// Every view, with the name SHOW takes.
pub const VIEWS: [(&str, View); 30] = [
    ("help", View::Help),
    ("config", View::Config),
    ("databases", View::Databases),
    ("pools", View::Pools),
    ("clients", View::Clients),
    ("servers", View::Servers),
    ("users", View::Users),
    ("stats", View::Stats),
    ("stats_totals", View::StatsTotals),
    ("stats_averages", View::StatsAverages),
    ("totals", View::Totals),
    ("lists", View::Lists),
    ("mem", View::Mem),
    ("fds", View::Fds),
    ("sockets", View::Sockets),
    ("active_sockets", View::ActiveSockets),
    ("dns_hosts", View::DnsHosts),
    ("dns_zones", View::DnsZones),
    ("version", View::Version),
    ("state", View::State),
    ("peers", View::Peers),
    ("peer_pools", View::PeerPools),
    ("prepared_statements", View::PreparedStatements),
    ("carpool", View::Carpool),
    ("pools_ext", View::Carpool),
    ("pins", View::Pins),
    ("workers", View::Workers),
    ("hosts", View::Hosts),
    ("handover", View::Handover),
    ("events", View::Events),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownMode {
    Now,
    WaitForServers,
    WaitForClients,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Nothing but whitespace and `;`.
    Empty,
    Show(View),
    Set {
        key: String,
        value: String,
    },
    Reload,
    Pause(Option<String>),
    Resume(Option<String>),
    Reconnect(Option<String>),
    Kill(Option<String>),
    KillClient(u64),
    Suspend,
    /// Online restart, sent by the new process after SHOW FDS: the console connection
    /// becomes the channel the clients move through (pgcarpool's own command).
    Handover,
    Shutdown(ShutdownMode),
    WaitClose(Option<String>),
    Enable(String),
    Disable(String),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParseError(pub String);

impl Command {
    /// SHOW only: what stats_users may run.
    pub fn is_read_only(&self) -> bool {
        matches!(self, Command::Show(_) | Command::Empty)
    }

    /// The CommandComplete tag of a command that returns no rows.
    pub fn tag(&self) -> &'static str {
        match self {
            Command::Empty => "",
            Command::Show(_) => "SHOW",
            Command::Set { .. } => "SET",
            Command::Reload => "RELOAD",
            Command::Pause(_) => "PAUSE",
            Command::Resume(_) => "RESUME",
            Command::Reconnect(_) => "RECONNECT",
            Command::Kill(_) => "KILL",
            Command::KillClient(_) => "KILL_CLIENT",
            Command::Suspend => "SUSPEND",
            Command::Handover => "HANDOVER",
            Command::Shutdown(_) => "SHUTDOWN",
            Command::WaitClose(_) => "WAIT_CLOSE",
            Command::Enable(_) => "ENABLE",
            Command::Disable(_) => "DISABLE",
        }
    }

    pub fn parse(sql: &str) -> Result<Command, ParseError> {
        let sql = sql
            .trim()
            .trim_end_matches(|c: char| c == ';' || c.is_whitespace());
        if sql.is_empty() {
            return Ok(Command::Empty);
        }
        let (word, rest) = split_word(sql);
        let word = word.to_ascii_lowercase();
        let args: Vec<&str> = rest.split_whitespace().collect();
        let bad = || ParseError(format!("invalid command: {sql}"));
        let opt_db = |args: &[&str]| -> Result<Option<String>, ParseError> {
            match args {
                [] => Ok(None),
                [db] => Ok(Some(ident(db))),
                _ => Err(bad()),
            }
        };
        let db = |args: &[&str]| -> Result<String, ParseError> {
            match args {
                [db] => Ok(ident(db)),
                _ => Err(ParseError(format!(
                    "{} needs a database name",
                    word.to_ascii_uppercase()
                ))),
            }
        };
        Ok(match word.as_str() {
            "show" => {
                let [name] = args[..] else {
                    return Err(ParseError(format!("invalid SHOW: {sql} (try SHOW HELP)")));
                };
                let name = name.to_ascii_lowercase();
                let view = VIEWS
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| *v)
                    .ok_or_else(|| {
                        ParseError(format!("unknown SHOW view: {name} (try SHOW HELP)"))
                    })?;
                Command::Show(view)
            }
            "set" => parse_set(rest).ok_or_else(|| {
                ParseError(format!("invalid SET, expected SET key = value: {sql}"))
            })?,
            "reload" if args.is_empty() => Command::Reload,
            "pause" => Command::Pause(opt_db(&args)?),
            "resume" => Command::Resume(opt_db(&args)?),
            "reconnect" => Command::Reconnect(opt_db(&args)?),
            "kill" => Command::Kill(opt_db(&args)?),
            "kill_client" => match args[..] {
                [id] => Command::KillClient(
                    id.parse()
                        // PgBouncer's words (its ids are pointers).
                        .map_err(|_| ParseError("invalid client pointer supplied".into()))?,
                ),
                _ => return Err(ParseError("KILL_CLIENT needs a client id".into())),
            },
            "suspend" if args.is_empty() => Command::Suspend,
            "handover" if args.is_empty() => Command::Handover,
            "shutdown" => match args
                .iter()
                .map(|a| a.to_ascii_lowercase())
                .collect::<Vec<_>>()[..]
            {
                [] => Command::Shutdown(ShutdownMode::Now),
                [ref m] if m == "wait_for_servers" => {
                    Command::Shutdown(ShutdownMode::WaitForServers)
                }
                [ref m] if m == "wait_for_clients" => {
                    Command::Shutdown(ShutdownMode::WaitForClients)
                }
                _ => return Err(bad()),
            },
            "wait_close" => Command::WaitClose(opt_db(&args)?),
            "enable" => Command::Enable(db(&args)?),
            "disable" => Command::Disable(db(&args)?),
            _ => return Err(bad()),
        })
    }
}

/// Split a simple Query's text into commands at `;` outside 'quotes' and "quotes";
/// empty pieces are dropped.
pub fn split_statements(sql: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut quote: Option<char> = None;
    let mut start = 0;
    for (i, ch) in sql.char_indices() {
        match (quote, ch) {
            (None, '\'' | '"') => quote = Some(ch),
            (Some(q), c) if c == q => quote = None,
            (None, ';') => {
                out.push(&sql[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&sql[start..]);
    out.retain(|s| !s.trim().is_empty());
    out
}

fn split_word(s: &str) -> (&str, &str) {
    match s.find(char::is_whitespace) {
        Some(i) => (&s[..i], s[i..].trim_start()),
        None => (s, ""),
    }
}

/// A database name as given: "quoted" keeps case, bare is kept as typed (PgBouncer does not fold).
fn ident(s: &str) -> String {
    s.strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(s)
        .to_string()
}

/// `key = value` or `key to value`; the value may be 'quoted' ('' = a quote).
fn parse_set(rest: &str) -> Option<Command> {
    let (key, value) = match rest.find('=') {
        Some(i) => (rest[..i].trim(), rest[i + 1..].trim()),
        None => {
            let (k, v) = split_word(rest);
            let (to, v) = split_word(v);
            if !to.eq_ignore_ascii_case("to") {
                return None;
            }
            (k, v.trim())
        }
    };
    if key.is_empty() || key.contains(char::is_whitespace) {
        return None;
    }
    let value = match value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')) {
        Some(inner) => inner.replace("''", "'"),
        None => value.to_string(),
    };
    Some(Command::Set {
        key: key.to_ascii_lowercase(),
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_case_insensitively_with_trailing_semicolon() {
        assert_eq!(
            Command::parse("show pools;").unwrap(),
            Command::Show(View::Pools)
        );
        assert_eq!(
            Command::parse("  SHOW Stats_Totals ;; ").unwrap(),
            Command::Show(View::StatsTotals)
        );
        assert_eq!(Command::parse("Pause").unwrap(), Command::Pause(None));
        assert_eq!(
            Command::parse("PAUSE testdb").unwrap(),
            Command::Pause(Some("testdb".into()))
        );
        assert_eq!(
            Command::parse("kill_client 42").unwrap(),
            Command::KillClient(42)
        );
        assert_eq!(
            Command::parse("shutdown wait_for_clients").unwrap(),
            Command::Shutdown(ShutdownMode::WaitForClients)
        );
        assert_eq!(Command::parse(";").unwrap(), Command::Empty);
    }

    #[test]
    fn parses_set_forms() {
        let want = Command::Set {
            key: "default_pool_size".into(),
            value: "7".into(),
        };
        assert_eq!(Command::parse("SET default_pool_size = 7").unwrap(), want);
        assert_eq!(Command::parse("set default_pool_size=7;").unwrap(), want);
        assert_eq!(
            Command::parse("SET default_pool_size TO '7'").unwrap(),
            want
        );
        assert_eq!(
            Command::parse("SET server_reset_query = 'DISCARD ALL'").unwrap(),
            Command::Set {
                key: "server_reset_query".into(),
                value: "DISCARD ALL".into()
            }
        );
        assert!(Command::parse("SET x").is_err());
    }

    #[test]
    fn statements_split_outside_quotes() {
        assert_eq!(
            split_statements("SHOW POOLS; SHOW STATS;"),
            ["SHOW POOLS", " SHOW STATS"]
        );
        assert_eq!(
            split_statements("SET server_reset_query = 'DISCARD ALL; SELECT 1'"),
            ["SET server_reset_query = 'DISCARD ALL; SELECT 1'"]
        );
        assert!(split_statements(" ; ").is_empty());
    }

    #[test]
    fn rejects_unknown_and_malformed() {
        assert!(Command::parse("SELECT 1").is_err());
        assert!(Command::parse("SHOW nothing").is_err());
        assert!(Command::parse("SHOW").is_err());
        assert!(Command::parse("ENABLE").is_err());
        assert!(Command::parse("KILL_CLIENT abc").is_err());
        assert!(Command::parse("PAUSE a b").is_err());
        assert!(Command::parse("shutdown later").is_err());
    }

    #[test]
    fn only_show_is_read_only() {
        assert!(Command::parse("SHOW POOLS").unwrap().is_read_only());
        assert!(!Command::parse("PAUSE").unwrap().is_read_only());
        assert!(!Command::parse("SET a = 1").unwrap().is_read_only());
    }
}
