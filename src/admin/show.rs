//! One function per SHOW view, each returning a [`Table`] built from snapshots of the
//! shared state (no sockets). Column names and order are PgBouncer's.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::command::View;
use super::table::{Cell, ColType, Table};
use crate::client::registry::{ClientHandle, ClientState};
use crate::config::{Config, PoolMode};
use crate::pool::{Pool, ServerState};
use crate::shared::Shared;
use crate::stats::PoolStats;
use crate::stats::histogram::HistSnapshot;
use crate::stats::{Histogram, Lane, Period, Totals};

use ColType::{Int, Text};

/// The table of a view (HELP has none: it answers with a notice).
pub fn table(shared: &Shared, view: View) -> Option<Table> {
    Some(match view {
        View::Help => return None,
        View::Config => config(&shared.config()),
        View::Databases => databases(shared),
        View::Pools => pools(shared),
        View::Clients => clients(shared),
        View::Servers => servers(shared),
        View::Users => users(shared),
        View::Stats => stats(shared),
        View::StatsTotals => stats_totals(shared),
        View::StatsAverages => stats_averages(shared),
        View::Totals => totals(shared),
        View::Lists => lists(shared),
        View::Mem => mem(),
        View::Fds => show_fds(shared, false).0,
        View::Sockets => sockets(shared, false),
        View::ActiveSockets => sockets(shared, true),
        View::DnsHosts => Table::new(&[("hostname", Text), ("ttl", Int), ("addrs", Text)]),
        View::DnsZones => Table::new(&[("zonename", Text), ("serial", Int), ("count", Int)]),
        View::Version => version(),
        View::State => state(shared),
        View::Peers => peers(shared.peers()),
        View::PeerPools => peer_pools(shared.peers()),
        View::PreparedStatements => prepared_statements(),
        View::Carpool => carpool(shared),
        View::Handover => handover(shared),
        View::Pins => pins(shared),
        View::Workers => workers(shared),
        View::Hosts => hosts(shared),
        View::Events => events(shared),
    })
}

/// SHOW HELP's notice text.
pub fn help() -> String {
    let mut s = String::from("Console usage\n");
    for line in [
        "SHOW HELP|CONFIG|DATABASES|POOLS|CLIENTS|SERVERS|USERS|VERSION",
        "SHOW PEERS|PEER_POOLS",
        "SHOW FDS|SOCKETS|ACTIVE_SOCKETS|LISTS|MEM|STATE",
        "SHOW DNS_HOSTS|DNS_ZONES",
        "SHOW STATS|STATS_TOTALS|STATS_AVERAGES|TOTALS",
        "SHOW PREPARED_STATEMENTS",
        "SHOW CARPOOL (pgcarpool: latency percentiles and pins per pool)",
        "SHOW PINS (pgcarpool: clients pinned to their server)",
        "SHOW HOSTS (pgcarpool: role, lag and health of each host of a pool)",
        "SHOW HANDOVER (pgcarpool: each client in an online restart)",
        "SHOW EVENTS (pgcarpool: the last switchovers and login errors of each pool)",
        "SET key = arg",
        "RELOAD",
        "PAUSE [<db>]",
        "RESUME [<db>]",
        "DISABLE <db>",
        "ENABLE <db>",
        "RECONNECT [<db>]",
        "KILL [<db>]",
        "KILL_CLIENT <client_id>",
        "SUSPEND",
        "SHUTDOWN",
        "SHUTDOWN WAIT_FOR_SERVERS|WAIT_FOR_CLIENTS",
        "WAIT_CLOSE [<db>]",
    ] {
        s.push('\t');
        s.push_str(line);
        s.push('\n');
    }
    s
}

pub fn config(cfg: &Config) -> Table {
    let mut t = Table::text(&["key", "value", "default", "changeable"]);
    for r in cfg.settings.show_config() {
        let yn = if r.changeable { "yes" } else { "no" };
        t.push(vec![
            r.key.into(),
            r.value.into(),
            r.default.into(),
            yn.into(),
        ]);
    }
    t
}

fn mode_name(m: PoolMode) -> &'static str {
    match m {
        PoolMode::Session => "session",
        PoolMode::Transaction => "transaction",
        PoolMode::Statement => "statement",
    }
}

/// Configured databases, then databases only known through pools (the `*` fallback).
fn database_names(shared: &Shared, cfg: &Config) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = cfg.databases.keys().cloned().collect();
    names.extend(shared.pools().all().iter().map(|p| p.db.clone()));
    names
}

pub fn databases(shared: &Shared) -> Table {
    let cfg = shared.config();
    let mut t = Table::new(&[
        ("name", Text),
        ("host", Text),
        ("port", Int),
        ("database", Text),
        ("force_user", Text),
        ("pool_size", Int),
        ("min_pool_size", Int),
        ("reserve_pool_size", Int),
        ("server_lifetime", Int),
        ("pool_mode", Text),
        ("load_balance_hosts", Text),
        ("max_connections", Int),
        ("current_connections", Int),
        ("max_client_connections", Int),
        ("current_client_connections", Int),
        ("paused", Int),
        ("disabled", Int),
    ]);
    let pools = shared.pools().all();
    for name in database_names(shared, &cfg) {
        let Some(e) = cfg.database(&name) else {
            continue;
        };
        let db_pools: Vec<_> = pools.iter().filter(|p| p.db == name).collect();
        let current: usize = db_pools.iter().map(|p| p.counts().total).sum();
        let paused = shared.admin().is_paused(&name)
            || (!db_pools.is_empty() && db_pools.iter().all(|p| p.counts().paused));
        t.push(vec![
            name.clone().into(),
            e.host.clone().into(),
            (if e.port == 0 { 5432 } else { e.port }).into(),
            e.dbname.clone().unwrap_or_else(|| name.clone()).into(),
            e.user.clone().into(),
            e.pool_size.unwrap_or(cfg.settings.default_pool_size).into(),
            cfg.min_pool_size_for(&name).into(),
            e.reserve_pool
                .unwrap_or(cfg.settings.reserve_pool_size)
                .into(),
            (cfg.server_lifetime_for(&name).as_secs()).into(),
            e.pool_mode.map(mode_name).into(),
            e.load_balance_hosts.clone().into(),
            cfg.max_db_connections_for(&name).into(),
            current.into(),
            cfg.max_db_client_connections_for(&name).into(),
            shared.client_counts().db(&name).into(),
            paused.into(),
            shared.admin().is_disabled(&name).into(),
        ]);
    }
    // The console itself, as PgBouncer lists it.
    t.push(vec![
        "pgbouncer".into(),
        Cell::Null,
        cfg.settings.listen_port.into(),
        "pgbouncer".into(),
        "pgbouncer".into(),
        2i64.into(),
        0i64.into(),
        0i64.into(),
        0i64.into(),
        "statement".into(),
        Cell::Null,
        0i64.into(),
        0i64.into(),
        cfg.settings.max_db_client_connections.into(),
        shared.client_counts().db("pgbouncer").into(),
        0i64.into(),
        0i64.into(),
    ]);
    t
}

/// The clients of pool `p` (clients are registered by client user; the pool by server user).
fn clients_of<'a>(
    cfg: &Config,
    p: &Pool,
    clients: &'a [Arc<ClientHandle>],
) -> Vec<&'a Arc<ClientHandle>> {
    clients
        .iter()
        .filter(|c| *c.db == *p.db && cfg.pool_user_for(&c.db, &c.user) == p.user)
        .collect()
}

pub fn pools(shared: &Shared) -> Table {
    let cfg = shared.config();
    let mut t = Table::new(&[
        ("database", Text),
        ("user", Text),
        ("cl_active", Int),
        ("cl_waiting", Int),
        ("cl_active_cancel_req", Int),
        ("cl_waiting_cancel_req", Int),
        ("sv_active", Int),
        ("sv_active_cancel", Int),
        ("sv_being_canceled", Int),
        ("sv_idle", Int),
        ("sv_used", Int),
        ("sv_tested", Int),
        ("sv_login", Int),
        ("maxwait", Int),
        ("maxwait_us", Int),
        ("pool_mode", Text),
        ("load_balance_hosts", Text),
    ]);
    let clients = shared.clients().all();
    for p in shared.pools().all() {
        let c = p.counts_with_reads();
        let mine = clients_of(&cfg, &p, &clients);
        let waiting = mine
            .iter()
            .filter(|c| c.state() == ClientState::Waiting)
            .count();
        let active = mine
            .iter()
            .filter(|c| matches!(c.state(), ClientState::Idle | ClientState::Active))
            .count();
        let wait = p.max_wait();
        let s = p.settings();
        t.push(vec![
            p.db.clone().into(),
            p.user.clone().into(),
            active.into(),
            waiting.into(),
            0i64.into(),
            0i64.into(),
            c.get(ServerState::Active).into(),
            0i64.into(),
            0i64.into(),
            c.get(ServerState::Idle).saturating_sub(c.used).into(),
            c.used.into(),
            (c.get(ServerState::Tested) + c.get(ServerState::BeingReset)).into(),
            c.get(ServerState::Login).into(),
            wait.as_secs().into(),
            u64::from(wait.subsec_micros()).into(),
            mode_name(s.mode).into(),
            cfg.database(&p.db)
                .and_then(|e| e.load_balance_hosts)
                .into(),
        ]);
    }
    t
}

/// The columns SHOW CLIENTS and SHOW SERVERS share.
const CONN_COLUMNS: [(&str, ColType); 21] = [
    ("type", Text),
    ("user", Text),
    ("database", Text),
    ("replication", Text),
    ("state", Text),
    ("addr", Text),
    ("port", Int),
    ("local_addr", Text),
    ("local_port", Int),
    ("connect_time", Text),
    ("request_time", Text),
    ("wait", Int),
    ("wait_us", Int),
    ("close_needed", Int),
    ("ptr", Text),
    ("link", Text),
    ("remote_pid", Int),
    ("tls", Text),
    ("application_name", Text),
    ("prepared_statements", Int),
    ("id", Int),
];

fn client_state_name(s: ClientState) -> &'static str {
    match s {
        ClientState::Login => "login",
        ClientState::Idle => "idle",
        ClientState::Waiting => "waiting",
        ClientState::Active => "active",
    }
}

/// "ip:port" → (ip, port); anything else (unix) → (text, None).
fn split_addr(a: &str) -> (String, Option<u16>) {
    match a
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
    {
        Some((h, p)) => (
            h.trim_start_matches('[').trim_end_matches(']').to_string(),
            Some(p),
        ),
        None => (a.to_string(), None),
    }
}

fn client_row(c: &ClientHandle) -> Vec<Cell> {
    let (addr, port) = split_addr(&c.addr);
    let t = fmt_time(c.connect_time());
    let link = c.server().map(|s| server_ptr(s.id));
    vec![
        "C".into(),
        c.user.to_string().into(),
        c.db.to_string().into(),
        "none".into(),
        client_state_name(c.state()).into(),
        addr.into(),
        port.into(),
        Cell::Null,
        Cell::Null,
        t.clone().into(),
        t.into(),
        0i64.into(),
        0i64.into(),
        0i64.into(),
        client_ptr(c).into(),
        link.map_or(Cell::Null, Cell::from),
        0i64.into(),
        c.tls().to_string().into(),
        "".into(),
        c.prepared().into(),
        c.id.into(),
    ]
}

fn client_ptr(c: &ClientHandle) -> String {
    format!("{:#x}", c as *const ClientHandle as usize)
}

/// A server's `ptr`: its id (a server has no address others may hold).
fn server_ptr(id: u64) -> String {
    format!("{id:#x}")
}

/// What a SHOW SERVERS row says of one server.
struct ServerRow<'a> {
    user: &'a str,
    db: &'a str,
    state: &'static str,
    id: u64,
    addr: &'a crate::server::ServerAddr,
    pid: i32,
    created: Instant,
    last_used: Option<Instant>,
    /// The linked client's `ptr`.
    link: Option<String>,
    prepared: usize,
    /// The TLS session as PgBouncer prints it ("" for plain).
    tls: String,
}

fn server_row(s: ServerRow<'_>) -> Vec<Cell> {
    let (addr, port) = split_addr(&s.addr.to_string());
    vec![
        "S".into(),
        s.user.into(),
        s.db.into(),
        "none".into(),
        s.state.into(),
        addr.into(),
        port.into(),
        Cell::Null,
        Cell::Null,
        fmt_instant(s.created).into(),
        s.last_used.map_or(Cell::Null, |t| fmt_instant(t).into()),
        0i64.into(),
        0i64.into(),
        0i64.into(),
        server_ptr(s.id).into(),
        s.link.map_or(Cell::Null, Cell::from),
        i64::from(s.pid).into(),
        s.tls.into(),
        "".into(),
        s.prepared.into(),
        s.id.into(),
    ]
}

/// SHOW CLIENTS: PgBouncer's columns (after an online restart, the new process also lists
/// the clients still with the old one; SHOW HANDOVER says how each client stands).
pub fn clients(shared: &Shared) -> Table {
    let mut t = Table::new(&CONN_COLUMNS);
    for (row, _) in client_rows(shared) {
        t.push(row);
    }
    t
}

/// The columns of SHOW CLIENTS that SHOW HANDOVER repeats to name a client.
const HANDOVER_NAMES: [&str; 6] = ["type", "user", "database", "addr", "port", "id"];

/// SHOW HANDOVER, pgcarpool's own: the online restart (`-R`) as each client of SHOW
/// CLIENTS lives it: "moved in" on the new process; on the old one whether a client moves
/// when idle or stays, and why; NULL otherwise.
pub fn handover(shared: &Shared) -> Table {
    let keep: Vec<usize> = HANDOVER_NAMES
        .iter()
        .map(|n| {
            CONN_COLUMNS
                .iter()
                .position(|(c, _)| c == n)
                .expect("a SHOW CLIENTS column")
        })
        .collect();
    let mut columns: Vec<(&str, ColType)> = keep.iter().map(|&i| CONN_COLUMNS[i]).collect();
    columns.push(("handover", Text));
    let mut t = Table::new(&columns);
    for (row, note) in client_rows(shared) {
        let mut out: Vec<Cell> = keep.iter().map(|&i| row[i].clone()).collect();
        out.push(note.map_or(Cell::Null, Cell::from));
        t.push(out);
    }
    t
}

/// The rows of SHOW CLIENTS, each with its client's handover note.
fn client_rows(shared: &Shared) -> Vec<(Vec<Cell>, Option<String>)> {
    let mut rows = Vec::new();
    for c in shared.clients().all() {
        rows.push((client_row(&c), c.handover()));
    }
    // After -R: the clients still with the old process (pinned, session mode…).
    for c in shared.restart().staying() {
        let (addr, port) = split_addr(&c.addr);
        let t0 = fmt_time(UNIX_EPOCH + std::time::Duration::from_micros(c.connect_time_us));
        let mut row: Vec<Cell> = vec![
            "C".into(),
            c.user.into(),
            c.db.into(),
            "none".into(),
            "active".into(),
            addr.into(),
            port.into(),
            Cell::Null,
            Cell::Null,
            t0.clone().into(),
            t0.into(),
        ];
        row.resize(CONN_COLUMNS.len(), Cell::Null);
        rows.push((row, Some(format!("with the old process: {}", c.note))));
    }
    rows
}

/// Rows of the servers linked to a client (active), then of idle servers. A server being
/// opened or reset is in neither.
fn server_rows(shared: &Shared) -> Vec<Vec<Cell>> {
    let cfg = shared.config();
    let mut rows = Vec::new();
    for c in shared.clients().all() {
        let Some(s) = c.server() else {
            continue;
        };
        rows.push(server_row(ServerRow {
            user: &cfg.pool_user_for(&c.db, &c.user),
            db: &c.db,
            state: "active",
            id: s.id,
            addr: &s.addr,
            pid: s.key.0,
            created: s.created,
            last_used: None,
            link: Some(client_ptr(&c)),
            prepared: s.prepared,
            tls: c.server_tls().as_deref().unwrap_or("").to_string(),
        }));
    }
    for p in shared.pools().all() {
        for s in p.idle_servers() {
            rows.push(server_row(ServerRow {
                user: &p.user,
                db: &p.db,
                state: s.state,
                id: s.id,
                addr: &s.addr,
                pid: s.pid,
                created: s.created,
                last_used: s.last_used,
                link: None,
                prepared: s.prepared,
                tls: s.tls.as_deref().unwrap_or("").to_string(),
            }));
        }
    }
    rows
}

pub fn servers(shared: &Shared) -> Table {
    let mut t = Table::new(&CONN_COLUMNS);
    for row in server_rows(shared) {
        t.push(row);
    }
    t
}

pub fn users(shared: &Shared) -> Table {
    let cfg = shared.config();
    let mut t = Table::new(&[
        ("name", Text),
        ("pool_size", Int),
        ("reserve_pool_size", Int),
        ("pool_mode", Text),
        ("max_user_connections", Int),
        ("current_connections", Int),
        ("max_user_client_connections", Int),
        ("current_client_connections", Int),
    ]);
    let pools = shared.pools().all();
    let mut names: BTreeSet<String> = cfg.auth.users.keys().cloned().collect();
    names.extend(cfg.users.keys().cloned());
    names.extend(pools.iter().map(|p| p.user.clone()));
    for name in names {
        let u = cfg.users.get(&name);
        t.push(vec![
            name.clone().into(),
            u.and_then(|u| u.pool_size).into(),
            u.and_then(|u| u.reserve_pool_size).into(),
            u.and_then(|u| u.pool_mode).map(mode_name).into(),
            cfg.max_user_connections_for(&name).into(),
            pools
                .iter()
                .filter(|p| p.user == name)
                .map(|p| p.counts().total)
                .sum::<usize>()
                .into(),
            cfg.max_user_client_connections_for(&name).into(),
            shared.client_counts().user(&name).into(),
        ]);
    }
    t
}

/// Per-database totals and last-period deltas (pools summed).
fn per_database(shared: &Shared) -> BTreeMap<String, (Totals, Period)> {
    let mut m: BTreeMap<String, (Totals, Period)> = BTreeMap::new();
    for p in shared.pools().all() {
        let e = m.entry(p.db.clone()).or_default();
        e.0.add(&p.stats.totals());
        e.1.add(&p.stats.period());
    }
    // The console's own commands, as PgBouncer counts them (each a transaction and a
    // query of database pgbouncer).
    let commands = shared.admin().commands();
    if commands > 0 {
        let e = m.entry("pgbouncer".to_string()).or_default();
        e.0.xact_count += commands;
        e.0.query_count += commands;
    }
    m
}

/// The counters of a SHOW STATS row, in the order PgBouncer 1.25.2 sends them (its
/// stats.c, which differs from its docs): assignments first, the parse and bind counts
/// of prepared statements last.
fn stat_values(x: &Totals) -> [u64; 11] {
    [
        x.server_assignment_count,
        x.xact_count,
        x.query_count,
        x.bytes_received,
        x.bytes_sent,
        x.xact_time_us,
        x.query_time_us,
        x.wait_time_us,
        x.client_parse_count,
        x.server_parse_count,
        x.bind_count,
    ]
}

pub fn stats(shared: &Shared) -> Table {
    let mut t = Table::new(&[
        ("database", Text),
        ("total_server_assignment_count", Int),
        ("total_xact_count", Int),
        ("total_query_count", Int),
        ("total_received", Int),
        ("total_sent", Int),
        ("total_xact_time", Int),
        ("total_query_time", Int),
        ("total_wait_time", Int),
        ("total_client_parse_count", Int),
        ("total_server_parse_count", Int),
        ("total_bind_count", Int),
        ("avg_server_assignment_count", Int),
        ("avg_xact_count", Int),
        ("avg_query_count", Int),
        ("avg_recv", Int),
        ("avg_sent", Int),
        ("avg_xact_time", Int),
        ("avg_query_time", Int),
        ("avg_wait_time", Int),
        ("avg_client_parse_count", Int),
        ("avg_server_parse_count", Int),
        ("avg_bind_count", Int),
    ]);
    for (db, (tot, period)) in per_database(shared) {
        let mut row: Vec<Cell> = vec![db.into()];
        row.extend(stat_values(&tot).map(Cell::from));
        row.extend(stat_values(&period.averages()).map(Cell::from));
        t.push(row);
    }
    t
}

/// STATS_TOTALS / STATS_AVERAGES: one row per database, PgBouncer 1.25.2's columns (the
/// averages name their last three `avg_*`).
fn stats_subset(shared: &Shared, averages: bool) -> Table {
    let parse = if averages {
        [
            "avg_client_parse_count",
            "avg_server_parse_count",
            "avg_bind_count",
        ]
    } else {
        ["client_parse_count", "server_parse_count", "bind_count"]
    };
    let mut t = Table::new(&[
        ("database", Text),
        ("server_assignment_count", Int),
        ("xact_count", Int),
        ("query_count", Int),
        ("bytes_received", Int),
        ("bytes_sent", Int),
        ("xact_time", Int),
        ("query_time", Int),
        ("wait_time", Int),
        (parse[0], Int),
        (parse[1], Int),
        (parse[2], Int),
    ]);
    for (db, (x, period)) in per_database(shared) {
        let values = if averages {
            stat_values(&period.averages())
        } else {
            stat_values(&x)
        };
        let mut row: Vec<Cell> = vec![db.into()];
        row.extend(values.map(Cell::from));
        t.push(row);
    }
    t
}

pub fn stats_totals(shared: &Shared) -> Table {
    stats_subset(shared, false)
}

pub fn stats_averages(shared: &Shared) -> Table {
    stats_subset(shared, true)
}

pub fn totals(shared: &Shared) -> Table {
    let mut tot = Totals::default();
    let mut period = Period::default();
    for (_, (x, p)) in per_database(shared) {
        tot.add(&x);
        period.add(&p);
    }
    // PgBouncer 1.25.2's names (its stats.c).
    const NAMES: [&str; 11] = [
        "server_assignment_count",
        "xact_count",
        "query_count",
        "client_bytes",
        "server_bytes",
        "xact_time",
        "query_time",
        "wait_time",
        "ps_client_parse_count",
        "ps_server_parse_count",
        "ps_bind_count",
    ];
    let mut t = Table::new(&[("name", Text), ("value", Int)]);
    for (prefix, values) in [
        ("total", stat_values(&tot)),
        ("avg", stat_values(&period.averages())),
    ] {
        for (name, v) in NAMES.iter().zip(values) {
            t.push(vec![format!("{prefix}_{name}").into(), v.into()]);
        }
    }
    t
}

pub fn lists(shared: &Shared) -> Table {
    let cfg = shared.config();
    let pools = shared.pools().all();
    let clients = shared.clients().all();
    let used_servers: usize = pools.iter().map(|p| p.counts().total).sum();
    let mut users: BTreeSet<&str> = cfg.auth.users.keys().map(String::as_str).collect();
    users.extend(cfg.users.keys().map(String::as_str));
    let mut t = Table::new(&[("list", Text), ("items", Int)]);
    for (name, n) in [
        ("databases", database_names(shared, &cfg).len()),
        ("users", users.len()),
        ("peers", shared.peers().all().len()),
        ("pools", pools.len()),
        ("peer_pools", shared.peers().all().len()),
        ("free_clients", 0),
        ("used_clients", clients.len()),
        (
            "login_clients",
            clients
                .iter()
                .filter(|c| c.state() == ClientState::Login)
                .count(),
        ),
        ("free_servers", 0),
        ("used_servers", used_servers),
        ("dns_names", 0),
        ("dns_zones", 0),
        ("dns_queries", 0),
        ("dns_pending", 0),
    ] {
        t.push(vec![name.into(), n.into()]);
    }
    t
}

/// SHOW MEM: PgBouncer's slab caches; pgcarpool has none to report.
pub fn mem() -> Table {
    Table::new(&[
        ("name", Text),
        ("size", Int),
        ("used", Int),
        ("free", Int),
        ("memtotal", Int),
    ])
}

/// SHOW FDS's columns (PgBouncer's); the rows are the listening sockets
/// (`show_fds`).
pub fn fds() -> Table {
    Table::new(&[
        ("fd", Int),
        ("task", Text),
        ("user", Text),
        ("database", Text),
        ("addr", Text),
        ("port", Int),
        ("cancel", Int),
        ("link", Int),
        ("client_encoding", Text),
        ("std_strings", Text),
        ("datestyle", Text),
        ("timezone", Text),
        ("password", Text),
        ("scram_client_key", Text),
        ("scram_server_key", Text),
    ])
}

/// SHOW FDS: one row per listening socket (task `pooler`), with PgBouncer's columns; the
/// descriptors to pass with the rows when the caller may have them (and the pooler is
/// suspended), else none.
pub fn show_fds(shared: &Shared, pass: bool) -> (Table, Vec<std::os::fd::OwnedFd>) {
    use std::os::fd::AsRawFd;
    let mut t = fds();
    let mut fds = Vec::new();
    let pass = pass && shared.restart().phase() == crate::shared::restart::Phase::Suspended;
    for (fd, addr, port) in shared.restart().listening() {
        let mut row: Vec<Cell> = vec![
            i64::from(fd.as_raw_fd()).into(),
            "pooler".into(),
            Cell::Null,
            Cell::Null,
            addr.into(),
            port.into(),
            0i64.into(),
            0i64.into(),
        ];
        row.resize(t.columns.len(), Cell::Null);
        t.push(row);
        if pass {
            fds.push(fd);
        }
    }
    (t, fds)
}

/// SHOW SOCKETS / ACTIVE_SOCKETS: the rows of SHOW CLIENTS and SHOW SERVERS with
/// PgBouncer's buffer columns (zero: pgcarpool's buffers are not fixed-size packets).
pub fn sockets(shared: &Shared, active_only: bool) -> Table {
    let mut cols: Vec<(&'static str, ColType)> = CONN_COLUMNS.to_vec();
    for c in [
        "recv_pos",
        "pkt_pos",
        "pkt_remain",
        "send_pos",
        "send_remain",
        "pkt_avail",
        "send_avail",
    ] {
        cols.push((c, Int));
    }
    let mut t = Table::new(&cols);
    let clients = shared
        .clients()
        .all()
        .into_iter()
        .filter(|c| !active_only || c.state() == ClientState::Active)
        .map(|c| client_row(&c));
    let servers = server_rows(shared)
        .into_iter()
        .filter(|r| !active_only || matches!(&r[4], Cell::Text(s) if s == "active"));
    for mut row in clients.chain(servers) {
        row.extend(std::iter::repeat_n(Cell::Int(0), 7));
        t.push(row);
    }
    t
}

pub fn version() -> Table {
    let mut t = Table::text(&["version"]);
    t.push(vec![crate::cli::version_line().into()]);
    t
}

pub fn state(shared: &Shared) -> Table {
    let mut t = Table::text(&["key", "value"]);
    let yn = |b: bool| if b { "yes" } else { "no" };
    let paused = shared.admin().is_paused_all();
    t.push(vec!["active".into(), yn(!paused).into()]);
    t.push(vec!["paused".into(), yn(paused).into()]);
    let suspended = shared.restart().phase() == crate::shared::restart::Phase::Suspended;
    t.push(vec!["suspended".into(), yn(suspended).into()]);
    t
}

/// SHOW HOSTS (pgcarpool's own): per pool, each host of its `host=` list, the role last
/// seen (primary, standby, down, unknown), whether it is the primary chosen, fenced (a
/// primary on an older timeline), usable by the pool's target_session_attrs, its
/// timeline, replay lag, when last checked, why it is down, and the pool's switchovers.
pub fn hosts(shared: &Shared) -> Table {
    let mut t = Table::new(&[
        ("database", Text),
        ("user", Text),
        ("host", Text),
        ("target_session_attrs", Text),
        ("role", Text),
        ("primary", Int),
        ("fenced", Int),
        ("usable", Int),
        ("read_only", Int),
        ("timeline", Int),
        ("lag_bytes", Int),
        ("lag_ms", Int),
        ("checked_ms_ago", Int),
        ("switchovers", Int),
        ("error", Text),
        ("reads", Int),
        ("reads_on_primary", Int),
        ("read_replays", Int),
    ]);
    use crate::pool::reads::RoutingStats;
    for p in shared.pools().all() {
        let s = p.settings();
        let list = &s.target.hosts;
        let switchovers = list.switchovers();
        let on_primary = RoutingStats::get(&p.routing.reads_on_primary);
        let replays = RoutingStats::get(&p.routing.refused_replays);
        for (i, h) in list.view().into_iter().enumerate() {
            t.push(vec![
                p.db.clone().into(),
                p.user.clone().into(),
                h.addr.to_string().into(),
                list.attrs.name().into(),
                h.state.role.name().into(),
                h.primary.into(),
                h.fenced.into(),
                h.usable.into(),
                h.state.read_only.into(),
                u64::from(h.state.timeline).into(),
                h.state.lag_bytes.into(),
                h.state.lag_ms.into(),
                h.state
                    .checked
                    .map(|c| c.elapsed().as_millis() as u64)
                    .into(),
                switchovers.into(),
                h.state.why.clone().into(),
                p.routing.reads_on(i).into(),
                on_primary.into(),
                replays.into(),
            ]);
        }
    }
    t
}

/// SHOW EVENTS (pgcarpool's own): newest first, the last switchovers of each pool's host
/// list and the last login errors of each pool (kept after its logins succeed again), with
/// how many times in a row each error came and when it came last.
pub fn events(shared: &Shared) -> Table {
    let mut t = Table::new(&[
        ("time", Text),
        ("database", Text),
        ("user", Text),
        ("event", Text),
        ("count", Int),
        ("detail", Text),
    ]);
    let mut events: Vec<(SystemTime, Vec<Cell>)> = Vec::new();
    for p in shared.pools().all() {
        let pool = |event: &str, count: u64, detail: String| -> Vec<Cell> {
            vec![
                p.db.clone().into(),
                p.user.clone().into(),
                event.into(),
                count.into(),
                detail.into(),
            ]
        };
        for (at, from, to) in p.settings().target.hosts.recent_switchovers() {
            let detail = format!("primary moved from {from} to {to}");
            events.push((at, pool("switchover", 1, detail)));
        }
        for e in p.recent_login_errors() {
            events.push((e.last, pool("login error", e.count, e.text)));
        }
    }
    events.sort_by_key(|e| std::cmp::Reverse(e.0));
    for (at, mut row) in events {
        row.insert(0, fmt_time(at).into());
        t.push(row);
    }
    t
}

pub fn peers(peers: &crate::peers::Peers) -> Table {
    let mut t = Table::new(&[
        ("peer_id", Int),
        ("host", Text),
        ("port", Int),
        ("pool_size", Int),
    ]);
    for p in peers.all() {
        t.push(vec![
            p.peer_id.into(),
            p.host.clone().into(),
            p.port.into(),
            p.pool_size.into(),
        ]);
    }
    t
}

pub fn peer_pools(peers: &crate::peers::Peers) -> Table {
    let mut t = Table::new(&[
        ("peer_id", Int),
        ("cl_active_cancel_req", Int),
        ("cl_waiting_cancel_req", Int),
        ("sv_active_cancel", Int),
        ("sv_login", Int),
    ]);
    for p in peers.all() {
        let mut row = vec![p.peer_id.into()];
        row.extend(p.counts().map(Into::into));
        t.push(row);
    }
    t
}

/// Prepared statements tracked per pool (pgcarpool does not share a registry yet: no rows).
pub fn prepared_statements() -> Table {
    Table::new(&[
        ("database", Text),
        ("user", Text),
        ("name", Text),
        ("query", Text),
        ("count", Int),
    ])
}

/// pgcarpool's extras per pool: latency percentiles (microseconds) and console flags.
pub fn carpool(shared: &Shared) -> Table {
    let mut t = Table::new(&[
        ("database", Text),
        ("user", Text),
        ("query_count", Int),
        ("query_p50_us", Int),
        ("query_p95_us", Int),
        ("query_p99_us", Int),
        ("xact_count", Int),
        ("xact_p50_us", Int),
        ("xact_p95_us", Int),
        ("xact_p99_us", Int),
        ("wait_count", Int),
        ("wait_p50_us", Int),
        ("wait_p95_us", Int),
        ("wait_p99_us", Int),
        ("paused", Int),
        ("disabled", Int),
        ("last_login_error", Text),
        ("pinned_clients", Int),
        ("pinned_temp_table", Int),
        ("pinned_advisory_lock", Int),
        ("pinned_listen", Int),
        ("pinned_with_hold_cursor", Int),
        ("pinned_prepared_statement", Int),
        ("server_moves", Int),
        ("server_logins", Int),
        ("lock_waits", Int),
        ("lock_wait_ns", Int),
    ]);
    for p in shared.pools().all() {
        let mut row: Vec<Cell> = vec![p.db.clone().into(), p.user.clone().into()];
        let hists: [fn(&Lane) -> &Histogram; 3] =
            [|l| &l.query_hist, |l| &l.xact_hist, |l| &l.wait_hist];
        for pick in hists {
            let s: HistSnapshot = p.stats.hist(pick);
            row.push(s.count.into());
            for q in [0.5, 0.95, 0.99] {
                row.push(s.quantile(q).into());
            }
        }
        row.push(p.counts().paused.into());
        row.push(shared.admin().is_disabled(&p.db).into());
        row.push(p.last_login_error().into());
        row.push(PoolStats::get(&p.stats.pinned_clients).into());
        for c in &p.stats.pins {
            row.push(PoolStats::get(c).into());
        }
        row.push(PoolStats::get(&p.stats.server_moves).into());
        row.push(PoolStats::get(&p.stats.server_logins).into());
        row.push(PoolStats::get(&p.stats.lock_waits).into());
        row.push(PoolStats::get(&p.stats.lock_wait_ns).into());
        t.push(row);
    }
    t
}

/// pgcarpool's own: the worker threads, the clients each one serves, whether it takes
/// clients (`active`) and how busy it was lately (percent of a core).
pub fn workers(shared: &Shared) -> Table {
    let mut t = Table::new(&[
        ("worker", Int),
        ("clients", Int),
        ("active", Int),
        ("busy", Int),
    ]);
    if let Some(ws) = shared.workers() {
        let busy = ws.busy();
        for (w, n) in ws.clients().into_iter().enumerate() {
            let active = usize::from(w < ws.active());
            t.push(vec![
                w.into(),
                n.into(),
                active.into(),
                u64::from(busy[w] / 10).into(),
            ]);
        }
    }
    t
}

/// Clients pinned to their server (temp tables, LISTEN, advisory locks, WITH HOLD cursors).
pub fn pins(shared: &Shared) -> Table {
    let mut t = Table::new(&[
        ("id", Int),
        ("user", Text),
        ("database", Text),
        ("addr", Text),
        ("reasons", Text),
        ("pinned_since", Text),
    ]);
    for c in shared.clients().all() {
        if let Some((reasons, since)) = c.pin() {
            t.push(vec![
                c.id.into(),
                c.user.to_string().into(),
                c.db.to_string().into(),
                c.addr.to_string().into(),
                reasons.into(),
                fmt_time(since).into(),
            ]);
        }
    }
    t
}

/// An `Instant` in the past as wall-clock time.
fn fmt_instant(i: Instant) -> String {
    fmt_time(SystemTime::now() - i.elapsed())
}

/// `YYYY-MM-DD HH:MM:SS UTC`, as PgBouncer prints times.
pub fn fmt_time(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::PoolStats;
    use std::time::Duration;

    /// A `Shared` with no listeners: SHOW views are read from it directly.
    fn shared(ini: &str) -> Arc<Shared> {
        let dir = std::env::temp_dir();
        let cfg = Config::from_str(ini, "pgbouncer.ini", &dir).expect("config");
        Shared::new(cfg)
    }

    fn pool(shared: &Arc<Shared>, db: &str, user: &str) -> Arc<Pool> {
        let cfg = shared.config_full();
        let entry = cfg.database(db).expect("db entry");
        shared.pools().get_or_create(db, user, || {
            crate::shared::pool_settings(
                &cfg,
                &entry,
                user,
                crate::server::Credential::None,
                shared,
            )
        })
    }

    fn cell<'a>(t: &'a Table, row: usize, col: &str) -> &'a Cell {
        &t.rows[row][t.col(col).unwrap_or_else(|| panic!("no column {col}"))]
    }

    const INI: &str = "[databases]\napp = host=127.0.0.1 port=5999 pool_size=4\n[pgbouncer]\nlisten_port = 0\npool_mode = transaction\n";

    #[test]
    fn pools_and_databases_show_pool_state() {
        let sh = shared(INI);
        let p = pool(&sh, "app", "alice");
        p.pause();
        let t = pools(&sh);
        assert_eq!(t.rows.len(), 1);
        assert_eq!(cell(&t, 0, "database"), &Cell::from("app"));
        assert_eq!(cell(&t, 0, "user"), &Cell::from("alice"));
        assert_eq!(cell(&t, 0, "sv_active"), &Cell::Int(0));
        assert_eq!(cell(&t, 0, "pool_mode"), &Cell::from("transaction"));
        let d = databases(&sh);
        assert_eq!(cell(&d, 0, "name"), &Cell::from("app"));
        assert_eq!(cell(&d, 0, "pool_size"), &Cell::Int(4));
        assert_eq!(cell(&d, 0, "port"), &Cell::Int(5999));
        assert_eq!(cell(&d, 0, "paused"), &Cell::Int(1));
        assert_eq!(cell(&d, 0, "disabled"), &Cell::Int(0));
        sh.admin().set_disabled("app", true);
        assert_eq!(cell(&databases(&sh), 0, "disabled"), &Cell::Int(1));
        // The console's own row comes last.
        assert_eq!(cell(&d, d.rows.len() - 1, "name"), &Cell::from("pgbouncer"));
    }

    #[test]
    fn stats_sum_pools_per_database() {
        let sh = shared(INI);
        for user in ["alice", "bob"] {
            let p = pool(&sh, "app", user);
            let lane = p.stats.lane(0);
            PoolStats::add(&lane.xact_count, 3);
            PoolStats::add(&lane.query_count, 5);
            PoolStats::add(&lane.wait_time_us, 30);
            PoolStats::add(&lane.server_assignment_count, 3);
            p.stats.roll_period(1.0);
        }
        let t = stats(&sh);
        assert_eq!(t.rows.len(), 1);
        assert_eq!(cell(&t, 0, "total_xact_count"), &Cell::Int(6));
        assert_eq!(cell(&t, 0, "total_query_count"), &Cell::Int(10));
        assert_eq!(cell(&t, 0, "avg_xact_count"), &Cell::Int(6));
        assert_eq!(cell(&t, 0, "avg_wait_time"), &Cell::Int(10));
        let tt = stats_totals(&sh);
        assert_eq!(cell(&tt, 0, "xact_count"), &Cell::Int(6));
        let tot = totals(&sh);
        let row = tot
            .rows
            .iter()
            .find(|r| r[0] == Cell::from("total_query_count"))
            .unwrap();
        assert_eq!(row[1], Cell::Int(10));
    }

    #[test]
    fn every_view_has_rows_as_wide_as_its_columns() {
        let sh = shared(INI);
        pool(&sh, "app", "alice");
        for (name, v) in super::super::command::VIEWS {
            if let Some(t) = table(&sh, v) {
                assert!(!t.columns.is_empty(), "{name}");
                for r in &t.rows {
                    assert_eq!(r.len(), t.columns.len(), "{name}");
                }
            }
        }
        assert_eq!(
            config(&sh.config()).column_names(),
            ["key", "value", "default", "changeable"]
        );
    }

    #[test]
    fn times_print_as_utc() {
        assert_eq!(fmt_time(UNIX_EPOCH), "1970-01-01 00:00:00 UTC");
        let t = UNIX_EPOCH + Duration::from_secs(1_709_210_096); // 2024-02-29 12:34:56
        assert_eq!(fmt_time(t), "2024-02-29 12:34:56 UTC");
    }

    #[test]
    fn addresses_split_into_host_and_port() {
        assert_eq!(
            split_addr("127.0.0.1:5432"),
            ("127.0.0.1".to_string(), Some(5432))
        );
        assert_eq!(split_addr("[::1]:6432"), ("::1".to_string(), Some(6432)));
        assert_eq!(split_addr("unix"), ("unix".to_string(), None));
    }
}
