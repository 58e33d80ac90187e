//! What each setting of [`TABLE`] means: its topic, unit, meaning and difference from
//! PgBouncer. The book's Configuration chapter (docs/settings.md) is generated from these
//! rows with [`markdown`]; a test fails when a setting of the table has no row here (or a
//! row names no setting) and when the page is stale.
//!
//! A new setting: add its row to [`TABLE`], then a [`Description`] here (same name), then
//! `PGCARPOOL_BLESS=1 cargo test --lib config::settings_doc` rewrites docs/settings.md.
use super::settings::{TABLE, no_effect_reason};

/// Where the book files a setting (its section of the Configuration chapter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topic {
    /// Listening sockets, the process, instances.
    Process,
    /// Who may log in and how.
    Auth,
    /// Pool sizes, connection limits, pooling mode.
    Pooling,
    /// What a client keeps in transaction mode (virtual sessions, pins).
    Sessions,
    /// Servers: lifetime, checks, roles (primary/standby).
    Servers,
    /// Client-side timeouts.
    Timeouts,
    /// Logs, statistics, admin console, metrics.
    Observability,
    /// TLS towards clients and servers.
    Tls,
    /// Sockets, DNS, packet sizes.
    Network,
}

impl Topic {
    /// Every topic, in the chapter's order.
    pub const ALL: [Topic; 9] = [
        Topic::Process,
        Topic::Auth,
        Topic::Pooling,
        Topic::Sessions,
        Topic::Servers,
        Topic::Timeouts,
        Topic::Observability,
        Topic::Tls,
        Topic::Network,
    ];

    /// The section's title.
    pub fn title(self) -> &'static str {
        match self {
            Topic::Process => "Process and listening",
            Topic::Auth => "Authentication",
            Topic::Pooling => "Pools and limits",
            Topic::Sessions => "Virtual sessions and pins",
            Topic::Servers => "Server connections and roles",
            Topic::Timeouts => "Client timeouts",
            Topic::Observability => "Logs, statistics, console and metrics",
            Topic::Tls => "TLS",
            Topic::Network => "Sockets, DNS and packets",
        }
    }
}

/// One setting's entry in the book.
#[derive(Debug, Clone, Copy)]
pub struct Description {
    /// The setting's name in [`TABLE`].
    pub name: &'static str,
    pub topic: Topic,
    /// The unit or form of its value: `seconds`, `bytes`, `boolean`, the values allowed…
    pub unit: &'static str,
    /// What it does (Markdown).
    pub meaning: &'static str,
    /// How pgcarpool differs from PgBouncer here ("" = as PgBouncer documents it).
    pub pgbouncer: &'static str,
}

macro_rules! d {
    ($name:ident, $topic:ident, $unit:expr, $meaning:expr) => {
        d!($name, $topic, $unit, $meaning, "")
    };
    ($name:ident, $topic:ident, $unit:expr, $meaning:expr, $pgb:expr) => {
        Description {
            name: stringify!($name),
            topic: Topic::$topic,
            unit: $unit,
            meaning: $meaning,
            pgbouncer: $pgb,
        }
    };
}

const OWN: &str = "Not in PgBouncer: pgcarpool's own setting.";
const SECS: &str = "seconds (fractions allowed)";
const SECS0: &str = "seconds (fractions allowed); 0 disables";
const BOOL: &str = "boolean (0/1, on/off, yes/no, true/false)";
const COUNT: &str = "count";
const COUNT0: &str = "count; 0: no limit";

/// The description of every setting (any order; the chapter sorts by topic, then name).
pub static DESCRIPTIONS: &[Description] = &[
    // Process and listening.
    d!(
        listen_addr,
        Process,
        "comma-separated addresses; `*` all; empty: Unix socket only",
        "Addresses to listen on for TCP connections. `*` listens on every IPv4 and IPv6 \
         address. Empty: no TCP listener, only the Unix socket in `unix_socket_dir`."
    ),
    d!(
        listen_port,
        Process,
        "TCP port",
        "The port of the TCP listeners, and the number in the Unix socket's name \
         (`.s.PGSQL.6432`)."
    ),
    d!(
        unix_socket_dir,
        Process,
        "directory; empty: no Unix socket",
        "Where the Unix socket `.s.PGSQL.<listen_port>` is made (and its lock file). \
         Online restart with `-R` (`so_reuseport = 0`) needs it."
    ),
    d!(
        unix_socket_mode,
        Process,
        "octal file mode",
        "The file mode of the Unix socket."
    ),
    d!(
        unix_socket_group,
        Process,
        "group name or number; empty: the process's group",
        "The group given to the Unix socket file. A group that does not exist stops the \
         start (`could not find group '…'`)."
    ),
    d!(
        user,
        Process,
        "OS user name",
        "Switch to this OS user at start. pgcarpool refuses to run as root unless this (or \
         `-u USER`) names the user to switch to."
    ),
    d!(
        pidfile,
        Process,
        "path; empty: none",
        "Write the process id here. `-d` requires it. A pidfile naming a running process \
         stops the start (`pidfile … exists, another instance running?`); one naming no \
         process is stale and replaced. Removed at exit. A relative path resolves against \
         the working directory."
    ),
    d!(
        conffile,
        Process,
        "path",
        "Shows the file the configuration was read from. Set (in the file, or with the \
         console's `SET conffile = '…'`), it names the file the next RELOAD or SIGHUP reads."
    ),
    d!(
        job_name,
        Process,
        "text",
        "The instance's name, shown by SHOW CONFIG (PgBouncer uses it as the Windows service \
         name). `service_name` is its other name.",
        "Accepted and shown; pgcarpool has no Windows service."
    ),
    d!(
        service_name,
        Process,
        "text",
        "Another name of `job_name`: setting either sets both.",
        "Accepted and shown; pgcarpool has no Windows service."
    ),
    d!(
        so_reuseport,
        Process,
        BOOL,
        "How an online restart (`-R`) takes the listening sockets. 0: the new process asks \
         the old one for its sockets over the Unix socket (`SHOW FDS`), PgBouncer's way. 1: \
         the new process binds the port too and steers every new connection to itself with \
         a small BPF program (Linux); see the Scale-out and upgrades chapter.",
        "PgBouncer uses it to run several processes on one port; pgcarpool is one process \
         with a thread per core (`workers`) and uses it for `-R` instead."
    ),
    d!(
        workers,
        Process,
        "count; 0: one per core",
        "Worker threads. Each runs its own single-threaded event loop and accepts on the \
         listening sockets; clients gather on the fewest workers the load needs \
         (`worker_spread_load`).",
        OWN
    ),
    d!(
        worker_spread_load,
        Process,
        "percent of a core; 0: spread over every worker",
        "How busy a worker thread may be (its CPU time over the last quarter second) \
         before clients spread to one more worker. The first *active* workers take new \
         connections; one more becomes active when one of them is busier than this, one \
         fewer when their load would fit on one fewer at under 80 % of it each. The other \
         workers hand their clients to the active ones between transactions. `SHOW WORKERS` \
         says which workers are active and how busy each is. 0: every worker takes \
         clients, spread by their number.",
        OWN
    ),
    d!(
        peer_id,
        Process,
        "number 0–16383; 0: none",
        "This instance's id among its peers (`[peers]`): cancel keys it hands out carry it, \
         and a cancel request carrying another peer's id is passed to that peer. With \
         `peers_dns` the id is derived from the instance's address unless set."
    ),
    d!(
        peers_dns,
        Process,
        "`name[:port]`; empty: off",
        "Every A/AAAA record of `name` is a peer (port: `listen_port` when not given), \
         resolved before the first client is accepted and again every `dns_max_ttl` \
         seconds (at least 1). Each instance's id is its address mod 16383 + 1 unless \
         `peer_id` is set, so N instances can run one identical file.",
        OWN
    ),
    d!(
        peers_hosts_file,
        Process,
        "path; empty: the system resolver",
        "Read `peers_dns`'s addresses from this hosts(5) file instead of the system \
         resolver (a member list written by a sidecar; tests).",
        OWN
    ),
    // Authentication.
    d!(
        auth_type,
        Auth,
        "`trust`, `any`, `plain`, `md5`, `scram-sha-256`, `cert`, `hba`",
        "How clients prove who they are. `md5` also accepts SCRAM when the stored secret is \
         SCRAM (as PostgreSQL). `trust` still wants the user in `auth_file` or found by \
         `auth_query`; `any` takes any user name. `hba` picks the method per connection \
         from `auth_hba_file`; `cert` wants a TLS client certificate naming the user.",
        "`pam` and `ldap` are refused when the file is loaded (pgcarpool is not built \
         with them), as by a PgBouncer built without them; `peer` is a method of hba lines \
         only, as in PgBouncer."
    ),
    d!(
        auth_file,
        Auth,
        "path",
        "The users and their secrets (`\"user\" \"secret\"`: plain text, md5 hash or SCRAM \
         verifier). Reloaded with the configuration. A user missing from it goes through \
         the same exchange as a wrong password and gets the same error.",
        "A relative path resolves against the config file's directory (PgBouncer: against \
         its working directory)."
    ),
    d!(
        auth_hba_file,
        Auth,
        "path",
        "pg_hba.conf lines for `auth_type = hba` (PgBouncer's subset: `local`, `host`, \
         `hostssl`, `hostnossl`; methods `trust`, `reject`, `md5`, `password`, \
         `scram-sha-256`, `cert`, `peer`; `map=` with `auth_ident_file`). The first \
         matching line picks the method.",
        "A line outside the subset refuses the whole file, naming file and line (PgBouncer \
         skips the line). A relative path resolves against the config file's directory."
    ),
    d!(
        auth_ident_file,
        Auth,
        "path",
        "pg_ident.conf maps for hba lines with `map=` (`peer` and `cert`)."
    ),
    d!(
        auth_user,
        Auth,
        "user name; empty: none",
        "The user `auth_query` runs as, for users missing from `auth_file` (its password \
         from `auth_file`). A database's `auth_user=` takes precedence."
    ),
    d!(
        auth_query,
        Auth,
        "SQL with `$1` for the user name",
        "The query that finds a user's secret in PostgreSQL (two columns: name, secret; the \
         first row counts). It runs as `auth_user` over a pooled server, in `auth_dbname` \
         (else the client's database). A user in `auth_file` is never looked up. Clients \
         see PgBouncer's words: `no such user`, `bouncer config error`."
    ),
    d!(
        auth_dbname,
        Auth,
        "database name; empty: the client's",
        "The database `auth_query` runs in (a database's `auth_dbname=` first). The admin \
         console's name is refused."
    ),
    d!(
        auth_query_cache_ttl,
        Auth,
        "seconds; 0: ask at every login",
        "How long a secret found by `auth_query` is reused. A user created in PostgreSQL \
         logs in at once (only users found are kept); a dropped one, or one past `VALID \
         UNTIL` or made `NOLOGIN`, is refused once its entry is older than this. A failed \
         login forgets the entry at once; a reload forgets them all.",
        "Not in PgBouncer, which asks at every login (set 0 for that)."
    ),
    d!(
        scram_iterations,
        Auth,
        "count, at least 1",
        "PBKDF2 iterations of the SCRAM secrets pgcarpool makes: for a client logging in \
         with SCRAM whose `auth_file` secret is plain text, and for a user that does not \
         exist (so that its exchange looks the same). Stored SCRAM secrets keep their own \
         count. A reload applies to the secrets made after it."
    ),
    d!(
        auth_ldap_options,
        Auth,
        "text",
        "LDAP options for `auth_type = ldap`."
    ),
    d!(
        auth_pam_confdir,
        Auth,
        "directory",
        "PAM's configuration directory for `auth_type = pam`."
    ),
    // Pools and limits.
    d!(
        pool_mode,
        Pooling,
        "`session`, `transaction`, `statement`",
        "When a server goes back to the pool: when the client leaves (session), after each \
         transaction (transaction) or each statement (statement). Also per database and per \
         user. In transaction and statement mode each client keeps a virtual session (see \
         the Virtual sessions chapter).",
        "Transaction mode keeps prepared statements, SQL PREPARE, settings, LISTEN and \
         DISCARD per client, which PgBouncer does only in part."
    ),
    d!(
        default_pool_size,
        Pooling,
        "server connections per pool",
        "Servers a pool (database, user) may open. A database's `pool_size=` or a user's \
         `pool_size=` overrides it. Pinned servers stop counting against it (see \
         `pin_pool_size`)."
    ),
    d!(
        min_pool_size,
        Pooling,
        "server connections per pool",
        "Keep at least this many servers open in each pool (opened by the janitor when \
         the pool has fewer)."
    ),
    d!(
        reserve_pool_size,
        Pooling,
        "server connections per pool",
        "Extra servers a pool may open when a client has waited `reserve_pool_timeout` \
         (`taking connection from reserve_pool` in the log)."
    ),
    d!(
        reserve_pool_timeout,
        Pooling,
        SECS,
        "How long a client waits before the reserve pool is used."
    ),
    d!(
        max_client_conn,
        Pooling,
        COUNT,
        "Most client connections (console included). When reached, a connection still \
         logging in may make room: when such connections hold more than half of the limit, \
         the oldest that has not sent its startup packet within 250 ms is dropped; \
         otherwise the oldest that has been logging in for over 2 s. Logged-in clients are \
         never dropped; with no such login the newcomer is refused (`no more connections \
         allowed (max_client_conn)`). At start pgcarpool raises its open files limit to the \
         hard limit and warns when that is below what this needs.",
        "PgBouncer refuses the newcomer only; pgcarpool first drops a login that stalls, so \
         sockets that never finish a login cannot lock users out."
    ),
    d!(
        max_db_connections,
        Pooling,
        COUNT0,
        "Most servers per database, over all its pools. Also per database (`max_db_connections=`)."
    ),
    d!(
        max_user_connections,
        Pooling,
        COUNT0,
        "Most servers per user, over all its pools. Also per user."
    ),
    d!(
        max_db_client_connections,
        Pooling,
        COUNT0,
        "Most clients per database. Also per database."
    ),
    d!(
        max_user_client_connections,
        Pooling,
        COUNT0,
        "Most clients per user. Also per user."
    ),
    d!(
        server_round_robin,
        Pooling,
        BOOL,
        "0: a checkout takes the most recently used idle server (LIFO, so few servers stay \
         warm); 1: the least recently used (spreads load over servers, e.g. behind a TCP \
         load balancer)."
    ),
    d!(
        autodb_idle_timeout,
        Pooling,
        SECS,
        "A pool of a database made from the `*` entry (an auto-database) with no client, \
         no server and no waiting client for this long is freed, with its statistics \
         (`dropping database '…' as it does not exist anymore or inactive auto-database`)."
    ),
    d!(
        pool_idle_timeout,
        Pooling,
        SECS0,
        "As `autodb_idle_timeout`, for the pools of `[databases]` entries. Servers close \
         first by `server_idle_timeout`; a pool a connected client belongs to is never freed.",
        "Not a PgBouncer 1.25 setting."
    ),
    // Virtual sessions and pins.
    d!(
        max_prepared_statements,
        Sessions,
        "statements per server; 0: pass through",
        "In transaction and statement mode, clients' named prepared statements (protocol \
         and SQL PREPARE) are kept per client and prepared on each server under internal \
         names (`PGCARPOOL_<n>`), at most this many per server (least recently used are \
         closed). 0: statements pass through unchanged, as PgBouncer's 0."
    ),
    d!(
        plan_once,
        Sessions,
        BOOL,
        "A client's unnamed Parse of the same text as its previous unnamed Parse is served \
         by a statement a server prepared once, as named statements are: PostgreSQL parses \
         and plans the text once per server, not once per transaction. Only where a client \
         cannot tell: a plain SELECT, VALUES, TABLE, WITH, INSERT, UPDATE or DELETE that \
         changes no session state, of a client that is not pinned, first in a round \
         outside a transaction block, with `max_prepared_statements` above 0. 0: every \
         unnamed Parse goes to the server.",
        OWN
    ),
    d!(
        deferred_begin,
        Sessions,
        BOOL,
        "1: in transaction mode, a query that is only `BEGIN` or `START TRANSACTION` (with \
         `ISOLATION LEVEL READ COMMITTED`, `REPEATABLE READ` or `READ UNCOMMITTED`, `READ \
         ONLY`, `[NOT] DEFERRABLE`), from a client that holds no server, is answered by \
         pgcarpool; the BEGIN goes to a server in the same write as the block's first \
         statement, and a bare `COMMIT`/`ROLLBACK` before any statement is answered too. One \
         round trip fewer per explicit transaction, and no server held by a client that \
         says BEGIN and thinks. The client can tell one thing: `now()` is the time of the \
         block's first statement, not of its BEGIN. Not with `read_routing`, nor for a \
         client listening through the pool's listener, nor with `max_prepared_statements` \
         0. 0 (the default): every BEGIN goes to a server when it comes, as with PgBouncer.",
        OWN
    ),
    d!(
        pin_mode,
        Sessions,
        "`pin` or `error`",
        "What a session feature that cannot move between servers (temporary table, session \
         advisory lock, `WITH HOLD` cursor, a server-side statement name of the \
         client's own; not `LISTEN`, which the pool's shared listener takes) does in \
         transaction mode: `pin` keeps the \
         client on its server while it lives; `error` ends the client's session with a \
         clear error. Also per database.",
        OWN
    ),
    d!(
        pin_pool_size,
        Sessions,
        "servers per pool; 0: none",
        "Servers a pool may keep for pinned clients on top of its size: a pinned server \
         stops counting against the pool's size. A client that would pin beyond it gets \
         `53300 too many pinned clients …` and is let go; the others never wait for it. \
         A server a pin gave back while the pool had opened another in its place is kept \
         idle for the next pin (up to this many with the pinned ones), which takes it \
         instead of a new login.",
        OWN
    ),
    d!(
        check_function_calls,
        Sessions,
        BOOL,
        "After a transaction that ran `DO`, `CALL` or a function pgcarpool does not know, \
         read back the session's settings, role and prepared statements (what such code \
         may have changed out of sight), so they stay with their client.",
        OWN
    ),
    d!(
        client_max_statements,
        Sessions,
        "statement names per client",
        "Most prepared statement names one client may hold. Beyond: that client alone gets \
         `53400` naming the limit and is let go.",
        OWN
    ),
    d!(
        client_max_settings,
        Sessions,
        "settings per client",
        "Most session settings one client may have changed. Beyond: that client alone gets \
         `53400` naming the limit and is let go.",
        OWN
    ),
    d!(
        statement_registry_size,
        Sessions,
        "bytes; 0: no bound",
        "Most bytes the shared statements of all clients may take. A client whose Parse \
         would exceed it gets `53400` naming the limit.",
        OWN
    ),
    d!(
        notify_queue_limit,
        Sessions,
        "bytes",
        "In transaction mode notifications for a client listening through its pool's \
         shared listener wait in pgcarpool's memory until the client is between \
         transactions and reads them. This bounds what may wait for one client. Past it \
         that client alone gets `FATAL 54000 too many notifications queued for this \
         client` and is let go. The default (64 MiB) is PostgreSQL's 8 GB notification \
         queue shared by 128 sessions. Session mode does not use it.",
        OWN
    ),
    d!(
        track_extra_parameters,
        Sessions,
        "comma-separated parameter names",
        "Startup parameters tracked per client and restored on each server it gets.",
        "pgcarpool tracks every parameter a client sets (startup packet, `options`, `SET`) \
         whether listed or not; PgBouncer refuses an unlisted one. Not reloadable, as in \
         PgBouncer."
    ),
    d!(
        ignore_startup_parameters,
        Sessions,
        "comma-separated parameter names",
        "Startup parameters accepted from clients and not passed to servers (e.g. \
         `extra_float_digits` for JDBC).",
        "Parameters not listed are not refused: they are tracked (see \
         `track_extra_parameters`)."
    ),
    d!(
        application_name_add_host,
        Sessions,
        BOOL,
        "Append ` - host:port` of the client to the `application_name` it logs in with."
    ),
    d!(
        disable_pqexec,
        Sessions,
        BOOL,
        "Refuse the simple Query protocol: a `Query` message ends the client with `FATAL: \
         PQexec disallowed` (08P01) and the log says `client used \"Query\" packet type`. The \
         extended protocol is served; the admin console is not affected.",
        "Any Query message is refused, not only one with several statements."
    ),
    d!(
        server_reset_query,
        Sessions,
        "SQL",
        "Sent to a server before it goes back to the pool in session mode (and, in \
         transaction mode, when a pinned client leaves; `DISCARD ALL` when this is empty)."
    ),
    d!(
        server_reset_query_always,
        Sessions,
        BOOL,
        "Send `server_reset_query` in transaction mode too."
    ),
    // Server connections and roles.
    d!(
        server_lifetime,
        Servers,
        SECS0,
        "A server older than this is closed when it goes back to the pool. Also per \
         database. Bounds how long a connection to an old address (DNS change) lives."
    ),
    d!(
        server_idle_timeout,
        Servers,
        SECS0,
        "An idle server unused for this long is closed."
    ),
    d!(
        server_connect_timeout,
        Servers,
        SECS,
        "Bounds the TCP connect and the login together. A client waiting for a login that \
         times out is told `08006 could not connect to server: server connection timed out` \
         at once, not at its `query_wait_timeout`. A server check that gets no answer within \
         it closes the server."
    ),
    d!(
        server_login_retry,
        Servers,
        SECS,
        "How long a failed server login is remembered: clients arriving at a pool with no \
         server get the cached error at once. A login that fails because PostgreSQL is \
         starting or stopping (57P03, 57P01/57P02) or nothing listens is not cached: the \
         pool tries again after 50 ms, doubling up to 0.5 s, and clients wait in line (up to \
         `query_wait_timeout`) instead of getting an error, so a restart of PostgreSQL costs \
         latency, not errors. Once logins have failed for `server_login_retry` in a row, \
         clients waiting at a pool with no server get the last error. While logins fail one \
         is tried at a time. `SHOW POOLS` shows the last error in `last_login_error`.",
        "PgBouncer caches every failure; pgcarpool retries at once while PostgreSQL is \
         starting or stopping."
    ),
    d!(
        server_check_query,
        Servers,
        "SQL; `<empty>`: an empty query; empty: no check",
        "Sent to a server idle for more than `server_check_delay` before it is handed out; \
         a server that fails it is closed."
    ),
    d!(
        server_check_delay,
        Servers,
        SECS,
        "How long a released server may be reused without `server_check_query`."
    ),
    d!(
        server_fast_close,
        Servers,
        BOOL,
        "In session mode, close a server whose database was reconfigured (RECONNECT, a \
         reload that changes its entry) as soon as it is idle between transactions, rather \
         than when its client leaves."
    ),
    d!(
        server_role_check_interval,
        Servers,
        SECS0,
        "For `[databases]` entries with a host list and `target_session_attrs`: how often \
         every host is asked its role (primary or standby, timeline, replay lag). A server \
         reporting 25006, 57P01, 57P02 or lost puts its host's role in doubt and has it \
         checked at once. 0: only at server login and on such reports.",
        OWN
    ),
    d!(
        max_standby_lag,
        Servers,
        "bytes of WAL, or a time (`5s`, `500ms`, `1min`, `1h`); 0: no bound",
        "A standby lagging more is left out of `read-only`, `standby` and \
         `prefer-standby` pools. A number is bytes of WAL received and not replayed; a time \
         is how long ago the primary committed the last transaction the standby replayed \
         (`now() - pg_last_xact_replay_timestamp()`), counted only while the standby has \
         WAL it has not replayed (a standby up to date with an idle primary does not lag).",
        OWN
    ),
    d!(
        read_routing,
        Servers,
        "boolean; also a database option (`read_routing=on`)",
        "In transaction mode, an entry with a host list sends a transaction whose request \
         only reads (the classifier's judgement, conservative) to a standby within \
         `max_standby_lag`, everything else to the primary; a read a standby refuses \
         (25006) before anything reached the client runs again on the primary. See \
         docs/scale-out.md (Reads on standbys).",
        OWN
    ),
    d!(
        read_your_writes,
        Servers,
        "boolean; also a database option (`read_your_writes=off`)",
        "With `read_routing`, a read goes only to a standby that has replayed everything \
         the client wrote or read before (tracked by WAL position), else to the primary. \
         Off: reads may be stale by up to `max_standby_lag`.",
        OWN
    ),
    // Client timeouts.
    d!(
        client_login_timeout,
        Timeouts,
        SECS0,
        "A client that has not finished logging in within this is disconnected."
    ),
    d!(
        client_idle_timeout,
        Timeouts,
        SECS0,
        "A client idle (between transactions) for this long is disconnected. Also per user."
    ),
    d!(
        query_timeout,
        Timeouts,
        SECS0,
        "A query running longer is cancelled and its client disconnected. Also per user."
    ),
    d!(
        query_wait_timeout,
        Timeouts,
        "seconds (fractions allowed); 0: wait for ever",
        "How long a client may wait for a server before it gets `query_wait_timeout` and \
         is disconnected. Also per database and per user."
    ),
    d!(
        query_wait_notify,
        Timeouts,
        SECS0,
        "After waiting this long for a server, a client gets a NOTICE that it is waiting."
    ),
    d!(
        idle_transaction_timeout,
        Timeouts,
        SECS0,
        "A client idle inside a transaction for this long is disconnected (its server rolled \
         back). Also per user."
    ),
    d!(
        transaction_timeout,
        Timeouts,
        SECS0,
        "A transaction lasting longer is ended and its client disconnected. Also per user."
    ),
    d!(
        cancel_wait_timeout,
        Timeouts,
        SECS0,
        "How long a cancel request may wait to be sent to its server; past it, the cancel \
         request's connection is closed."
    ),
    d!(
        suspend_timeout,
        Timeouts,
        SECS0,
        "How long SUSPEND (and an online restart, `-R`) waits for clients' buffers to be \
         flushed; a client that does not flush in time is disconnected."
    ),
    // Logs, statistics, console and metrics.
    d!(
        logfile,
        Observability,
        "path; empty: none",
        "Log file (also stderr unless `-q`, and syslog with `syslog = 1`). Reopened on every \
         SIGHUP and RELOAD (logrotate: move the file, then `kill -HUP`), also when the new \
         configuration fails to load; a changed `logfile` applies at once. A relative path \
         resolves against the working directory."
    ),
    d!(
        log_format,
        Observability,
        "`pgbouncer` or `pgcarpool`",
        "How log lines look: `pgbouncer` is PgBouncer's format (what pgbadger and \
         operators' greps read: `LOG C-0x…: db/user@addr login attempt: …`); `pgcarpool` is \
         tracing's structured lines (RFC 3339 time, level, `key=value` fields).",
        OWN
    ),
    d!(
        syslog,
        Observability,
        BOOL,
        "Log to syslog too (the local socket `/dev/log`, or the `PGCARPOOL_SYSLOG_SOCKET` \
         environment variable)."
    ),
    d!(
        syslog_ident,
        Observability,
        "text",
        "The program name in syslog lines."
    ),
    d!(
        syslog_facility,
        Observability,
        "`auth`, `authpriv`, `daemon`, `user`, `local0`…`local7`",
        "The syslog facility."
    ),
    d!(
        log_connections,
        Observability,
        BOOL,
        "Log each client login (`login attempt: …`)."
    ),
    d!(
        log_disconnections,
        Observability,
        BOOL,
        "Log each client disconnection with its reason (`closing because: …`)."
    ),
    d!(
        log_pooler_errors,
        Observability,
        BOOL,
        "Log the errors pgcarpool sends to clients."
    ),
    d!(
        log_stats,
        Observability,
        BOOL,
        "Log a `stats: …` line every `stats_period` (transactions, queries, bytes, times)."
    ),
    d!(
        stats_period,
        Observability,
        "seconds",
        "How often the averages of SHOW STATS are computed and the `stats:` line is logged."
    ),
    d!(
        verbose,
        Observability,
        "0, 1 or 2",
        "More log output, as `-v`: 1 adds each client and server connection, 2 everything."
    ),
    d!(
        admin_users,
        Observability,
        "comma-separated user names",
        "Users that may run every command of the admin console (database `pgbouncer` or \
         `pgcarpool`). Over TCP they need an `auth_file` entry; over the Unix socket the \
         pooler's own OS user logs in as `pgbouncer` without a password."
    ),
    d!(
        stats_users,
        Observability,
        "comma-separated user names",
        "Users that may run the console's read-only SHOW commands."
    ),
    d!(
        login_notify_message,
        Observability,
        "text; empty: none",
        "Sent to every client (not the admin console) as a NOTICE (SQLSTATE 00000) at \
         login, before its first ReadyForQuery.",
        "Not a PgBouncer 1.25 setting."
    ),
    d!(
        prometheus_port,
        Observability,
        "TCP port; 0: off",
        "Serve Prometheus metrics at `/metrics` on this port, and the status page at `/` \
         (live pools, clients, servers, hosts, latency, last switchovers and errors; \
         `/status.json` for scripts).",
        OWN
    ),
    d!(
        prometheus_addr,
        Observability,
        "address",
        "The address the metrics listener (`/metrics` and the status page) binds; anyone \
         who can reach it can read both. Empty: 127.0.0.1.",
        OWN
    ),
    // TLS.
    d!(
        client_tls_sslmode,
        Tls,
        "`disable`, `allow`, `prefer`, `require`, `verify-ca`, `verify-full`",
        "TLS from clients. From `allow` up an SSLRequest over TCP is answered and the \
         handshake follows; PostgreSQL 17's direct TLS (ALPN `postgresql`) is accepted too. \
         `require` and stricter refuse a plain TCP client with `SSL required` (08P01). \
         `verify-ca` and `verify-full` want a client certificate signed by \
         `client_tls_ca_file`. Unix sockets never use TLS and are never refused for it. Over \
         TLS clients are offered SCRAM-SHA-256-PLUS (channel binding)."
    ),
    d!(
        client_tls_cert_file,
        Tls,
        "path (PEM)",
        "The certificate shown to clients."
    ),
    d!(
        client_tls_key_file,
        Tls,
        "path (PEM)",
        "The private key of `client_tls_cert_file`."
    ),
    d!(
        client_tls_ca_file,
        Tls,
        "path (PEM)",
        "CA certificates that sign client certificates (`verify-ca`, `verify-full`, \
         `auth_type = cert`)."
    ),
    d!(
        client_tls_protocols,
        Tls,
        "`secure`, `all`, `legacy`, `tlsv1.0`…`tlsv1.3`",
        "TLS versions offered to clients.",
        "rustls speaks TLS 1.2 and 1.3 only: 1.0 and 1.1 are logged and left out (a list of \
         only those gives TLS 1.2)."
    ),
    d!(
        client_tls_ciphers,
        Tls,
        "OpenSSL cipher list",
        "TLS 1.2 cipher suites offered to clients.",
        "OpenSSL names of suites rustls has are honoured; OpenSSL keywords (`HIGH:!aNULL`) \
         are logged as not honoured and rustls's strong suites are used."
    ),
    d!(
        client_tls13_ciphers,
        Tls,
        "TLS 1.3 suite names",
        "TLS 1.3 cipher suites offered to clients.",
        "The two CCM suites are logged as not available; an unknown name is an error."
    ),
    d!(
        client_tls_ecdhcurve,
        Tls,
        "`auto`, `X25519`, `prime256v1`, `secp384r1`",
        "Key exchange groups offered to clients."
    ),
    d!(
        client_tls_dheparams,
        Tls,
        "text",
        "Finite-field DHE parameters.",
        "Accepted and logged: rustls has no finite-field DHE."
    ),
    d!(
        server_tls_sslmode,
        Tls,
        "`disable`, `allow`, `prefer`, `require`, `verify-ca`, `verify-full`",
        "TLS towards servers. `disable` sends no SSLRequest; `allow`/`prefer` go on in plain \
         text when the server says no; `require` and stricter fail the login. `verify-ca` \
         checks the chain against `server_tls_ca_file` (or the system bundle), \
         `verify-full` also the host name. pgcarpool logs in with SCRAM-SHA-256-PLUS when a \
         TLS server offers it. A change closes and reopens server connections."
    ),
    d!(
        server_tls_cert_file,
        Tls,
        "path (PEM)",
        "A client certificate shown to servers."
    ),
    d!(
        server_tls_key_file,
        Tls,
        "path (PEM)",
        "The private key of `server_tls_cert_file`."
    ),
    d!(
        server_tls_ca_file,
        Tls,
        "path (PEM)",
        "CA certificates that sign servers' certificates (`verify-ca`, `verify-full`)."
    ),
    d!(
        server_tls_protocols,
        Tls,
        "`secure`, `all`, `legacy`, `tlsv1.0`…`tlsv1.3`",
        "TLS versions offered to servers.",
        "As `client_tls_protocols`."
    ),
    d!(
        server_tls_ciphers,
        Tls,
        "OpenSSL cipher list",
        "TLS 1.2 cipher suites offered to servers.",
        "As `client_tls_ciphers`."
    ),
    d!(
        server_tls13_ciphers,
        Tls,
        "TLS 1.3 suite names",
        "TLS 1.3 cipher suites offered to servers.",
        "As `client_tls13_ciphers`."
    ),
    // Sockets, DNS and packets.
    d!(
        listen_backlog,
        Network,
        COUNT,
        "The backlog of every listening socket, TCP and Unix (`listen()`)."
    ),
    d!(
        tcp_defer_accept,
        Network,
        "0: off; any other value: on",
        "`TCP_DEFER_ACCEPT` (1 s) on TCP listeners: a connection is accepted once it has \
         data. A reload that turns it on or off changes the listening sockets at once."
    ),
    d!(
        tcp_keepalive,
        Network,
        BOOL,
        "TCP keepalive on every client socket accepted over TCP and every TCP socket to a \
         server (Unix sockets get none), set as PgBouncer's `tune_socket` sets it, with \
         `TCP_NODELAY`. The `tcp_*` settings apply to sockets opened after a reload; a \
         failure to set one is logged (`setsockopt/TCP_USER_TIMEOUT(fd) failed: …`) and the \
         connection goes on. On servers they decide how a cut network ends: an idle server \
         whose probes go unanswered is closed (`server conn crashed?`)."
    ),
    d!(
        tcp_keepidle,
        Network,
        "seconds; 0: the system's",
        "Idle time before the first keepalive probe (`TCP_KEEPIDLE`)."
    ),
    d!(
        tcp_keepintvl,
        Network,
        "seconds; 0: the system's",
        "Time between keepalive probes (`TCP_KEEPINTVL`)."
    ),
    d!(
        tcp_keepcnt,
        Network,
        "count; 0: the system's",
        "Unanswered probes before the connection is dropped (`TCP_KEEPCNT`)."
    ),
    d!(
        tcp_user_timeout,
        Network,
        "milliseconds; 0: the system's",
        "`TCP_USER_TIMEOUT`: how long sent data may stay unacknowledged. A query sent into a \
         cut network ends after it: its client gets `08007 transaction resolution unknown` \
         (`40001` inside a transaction block) and keeps its connection."
    ),
    d!(
        tcp_socket_buffer,
        Network,
        "bytes; 0: the system's",
        "`SO_SNDBUF` and `SO_RCVBUF` of TCP sockets, set before the handshake (on the \
         listening socket, and on a server socket before `connect`)."
    ),
    d!(
        max_packet_size,
        Network,
        "bytes",
        "The largest protocol message accepted from a client or server; a larger one ends \
         the connection with a protocol error."
    ),
    d!(
        pkt_buf,
        Network,
        "bytes",
        "The size of PgBouncer's fixed packet buffer."
    ),
    d!(
        sbuf_loopcnt,
        Network,
        COUNT,
        "How many times PgBouncer processes one connection \
         before moving to the next."
    ),
    d!(
        dns_max_ttl,
        Network,
        SECS,
        "How often `peers_dns` is resolved again.",
        "Server host names are resolved at each new connection (the system's resolver), so \
         this has no other use."
    ),
    d!(
        dns_nxdomain_ttl,
        Network,
        SECS,
        "A host of a host list (`host=a,b,…`) whose name did not resolve is skipped for \
         this long. A single host that does not resolve fails the server login, tried again \
         after `server_login_retry`."
    ),
    d!(
        dns_zone_check_period,
        Network,
        SECS,
        "How often PgBouncer checks DNS zone serials."
    ),
    d!(
        resolv_conf,
        Network,
        "path",
        "An alternative resolv.conf for PgBouncer's c-ares resolver."
    ),
];

/// The description of setting `name` (exact, lower case).
pub fn description(name: &str) -> Option<&'static Description> {
    DESCRIPTIONS.iter().find(|d| d.name == name)
}

const INTRO: &str = "# Configuration

The `[pgbouncer]` section of `pgbouncer.ini` as pgcarpool reads it: every setting, what it
does, in what unit, its default, whether a reload applies it, and where pgcarpool differs
from PgBouncer. (`[databases]`, `[users]` and `[peers]` are in
[Databases, users and peers](databases.md).)

This page is generated from the settings table (`src/config/settings.rs`) and its
descriptions (`src/config/settings_doc.rs`); do not edit it by hand, regenerate it with
`PGCARPOOL_BLESS=1 cargo test --lib config::settings_doc`.

- Time values are seconds, fractions allowed (`0.5`), except where the unit says otherwise.
- Booleans accept 0/1, on/off, yes/no, true/false. Lists are comma-separated.
- **Reload: yes** means SIGHUP, the console's `RELOAD` or `SET name = value` applies it to
  the running process (each change is logged as `name: old -> new`). **Reload: no** means
  the running value stays until a restart (an online restart with `-R` will do); the
  reload logs the setting as needing a restart, and the console's `SET` refuses it.
- An unknown setting or a value of the wrong type refuses the file (`file:line: key:
  message`); at a reload the running configuration stays.
";

/// The Configuration chapter (docs/settings.md).
pub fn markdown() -> String {
    let mut out = String::from(INTRO);
    out.push_str(
        "\n## All settings\n\n| setting | default | reload | topic |\n|---|---|---|---|\n",
    );
    let mut rows: Vec<_> = TABLE.iter().collect();
    rows.sort_by_key(|d| d.name);
    for d in &rows {
        let topic = description(d.name).map_or("", |x| x.topic.title());
        out.push_str(&format!(
            "| [`{0}`](#{0}) | {1} | {2} | {3} |\n",
            d.name,
            default_text(d.default),
            if d.reloadable { "yes" } else { "no" },
            topic
        ));
    }
    for topic in Topic::ALL {
        out.push_str(&format!("\n## {}\n", topic.title()));
        for d in rows
            .iter()
            .filter(|d| description(d.name).map(|x| x.topic) == Some(topic))
        {
            section(&mut out, d.name, d.default, d.reloadable);
        }
    }
    out
}

fn default_text(default: &str) -> String {
    if default.is_empty() {
        "(empty)".to_string()
    } else {
        format!("`{}`", default.replace('|', "\\|"))
    }
}

/// One setting's section: heading, facts line, meaning, PgBouncer's difference.
fn section(out: &mut String, name: &str, default: &str, reloadable: bool) {
    let Some(d) = description(name) else { return };
    out.push_str(&format!(
        "\n### {name}\n\nDefault: {} · Unit: {} · Reload: {}\n\n{}\n",
        default_text(default),
        d.unit,
        if reloadable { "yes" } else { "no (restart)" },
        d.meaning
    ));
    if let Some(why) = no_effect_reason(name) {
        out.push_str(&format!(
            "\n**No effect in pgcarpool** (accepted, type-checked, and logged at startup \
             when set): {why}.\n"
        ));
    }
    let pgb = if d.pgbouncer.is_empty() {
        "As in PgBouncer."
    } else {
        d.pgbouncer
    };
    out.push_str(&format!("\n*PgBouncer:* {pgb}\n"));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::settings::NO_EFFECT;

    #[test]
    fn every_setting_has_a_description() {
        let missing: Vec<_> = TABLE
            .iter()
            .filter(|d| description(d.name).is_none_or(|x| x.meaning.trim().is_empty()))
            .map(|d| d.name)
            .collect();
        assert!(
            missing.is_empty(),
            "settings without a description: {missing:?}. Add a `d!(name, Topic, \"unit\", \
             \"meaning\", \"how it differs from PgBouncer\")` row for each to DESCRIPTIONS in \
             src/config/settings_doc.rs, then regenerate docs/settings.md with \
             `PGCARPOOL_BLESS=1 cargo test --lib config::settings_doc`"
        );
    }

    #[test]
    fn every_description_names_one_setting() {
        for (i, d) in DESCRIPTIONS.iter().enumerate() {
            assert!(
                TABLE.iter().any(|s| s.name == d.name),
                "DESCRIPTIONS has `{}`, which is not a setting of TABLE",
                d.name
            );
            assert!(
                DESCRIPTIONS[..i].iter().all(|o| o.name != d.name),
                "DESCRIPTIONS has `{}` twice",
                d.name
            );
            assert!(!d.unit.trim().is_empty(), "`{}` has no unit", d.name);
        }
        for (name, _) in NO_EFFECT {
            assert!(description(name).is_some(), "{name}");
        }
    }

    #[test]
    fn docs_settings_md_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/settings.md");
        let want = markdown();
        if std::env::var_os("PGCARPOOL_BLESS").is_some() {
            std::fs::write(&path, &want).unwrap();
            return;
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "docs/settings.md is out of date with the settings table and its descriptions; \
             regenerate it with `PGCARPOOL_BLESS=1 cargo test --lib config::settings_doc`"
        );
    }
}
