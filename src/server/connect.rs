//! Opening a server connection and logging in (trust, cleartext, md5, SCRAM-SHA-256).
use std::path::PathBuf;
use std::time::Duration;

use bytes::BytesMut;
use tokio::net::UnixStream;

use super::roles::{HostRole, HostState, Observed, PrimaryChange, RoleBook, SessionAttrs};
use super::{Params, Server, ServerError};
use crate::auth::{md5, scram};
use crate::lock::Locked;
use crate::net::sockopt::TcpTuning;
use crate::net::{Conn, Stream};
use crate::proto::backend::{self, AuthRequest};
use crate::proto::{frontend, startup};

/// Longest message accepted during login.
const LOGIN_MESSAGE_LIMIT: usize = 64 * 1024;

/// Where a server lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerAddr {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

impl ServerAddr {
    /// From a `[databases]` host (None → default socket dir; leading '/' → socket dir) and port.
    pub fn new(host: Option<&str>, port: u16) -> Self {
        match host {
            Some(h) if !h.starts_with('/') => ServerAddr::Tcp {
                host: h.to_string(),
                port,
            },
            Some(dir) => ServerAddr::Unix(PathBuf::from(format!("{dir}/.s.PGSQL.{port}"))),
            None => {
                let dir = if std::path::Path::new("/var/run/postgresql").is_dir() {
                    "/var/run/postgresql"
                } else {
                    "/tmp"
                };
                ServerAddr::Unix(PathBuf::from(format!("{dir}/.s.PGSQL.{port}")))
            }
        }
    }

    pub async fn connect(&self) -> std::io::Result<Stream> {
        self.connect_to(self.resolve().await?, None).await
    }

    /// The socket addresses of a TCP host (empty for a Unix socket); a failed lookup is a
    /// [`DnsFailed`] error.
    pub async fn resolve(&self) -> std::io::Result<Vec<std::net::SocketAddr>> {
        match self {
            ServerAddr::Tcp { host, port } => Ok(tokio::net::lookup_host((host.as_str(), *port))
                .await
                .map_err(|e| std::io::Error::new(e.kind(), DnsFailed(e)))?
                .collect()),
            ServerAddr::Unix(_) => Ok(Vec::new()),
        }
    }

    /// Connect to what [`ServerAddr::resolve`] found (the first address that answers, as
    /// `TcpStream::connect`), the `tcp_*` options set on a TCP socket before its handshake
    /// (see `net::sockopt` for why).
    pub async fn connect_to(
        &self,
        addrs: Vec<std::net::SocketAddr>,
        tcp: Option<&TcpTuning>,
    ) -> std::io::Result<Stream> {
        match self {
            ServerAddr::Tcp { .. } => {
                let mut last = None;
                for a in addrs {
                    let sock = if a.is_ipv4() {
                        tokio::net::TcpSocket::new_v4()?
                    } else {
                        tokio::net::TcpSocket::new_v6()?
                    };
                    if let Some(t) = tcp {
                        t.apply_or_warn(socket2::SockRef::from(&sock));
                    }
                    match sock.connect(a).await {
                        Ok(s) => {
                            s.set_nodelay(true)?;
                            return Ok(Stream::Tcp(s));
                        }
                        Err(e) => last = Some(e),
                    }
                }
                Err(last.unwrap_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        "could not resolve to any address",
                    )
                }))
            }
            ServerAddr::Unix(path) => Ok(Stream::Unix(UnixStream::connect(path).await?)),
        }
    }
}

/// The server's host name did not resolve (PgBouncer: "server DNS lookup failed").
#[derive(Debug)]
pub struct DnsFailed(std::io::Error);

impl std::fmt::Display for DnsFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for DnsFailed {}

/// Why a server connection that never got to serve is closed, in PgBouncer's words
/// (logged as `closing because: …`; operators and tests grep them).
pub fn close_reason(e: &ServerError) -> std::borrow::Cow<'static, str> {
    match e {
        ServerError::Connect(e) if e.get_ref().is_some_and(|r| r.is::<DnsFailed>()) => {
            "server DNS lookup failed".into()
        }
        ServerError::Connect(_) => "connect failed".into(),
        ServerError::Timeout => "connect timeout".into(),
        ServerError::Conn(_) => "server conn crashed?".into(),
        ServerError::Proto(_) => "server sent an invalid message".into(),
        // The server's own words ("password authentication failed for user …").
        ServerError::Rejected(f) => f.message.clone().into(),
        ServerError::Login(_) | ServerError::LoginFailing(_) => "login failed".into(),
        ServerError::NoHost(_) => "no host of the wanted role".into(),
    }
}

impl std::fmt::Display for ServerAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServerAddr::Tcp { host, port } => write!(f, "{host}:{port}"),
            ServerAddr::Unix(p) => write!(f, "{}", p.display()),
        }
    }
}

/// What we can prove our identity to a server with.
#[derive(Clone, Default)]
pub enum Credential {
    #[default]
    None,
    Plain(String),
    /// md5(password + user) hex, usable for md5 auth only.
    Md5Hash(String),
    /// SCRAM keys learned from a client's SCRAM login against the same verifier.
    ScramKeys {
        client_key: [u8; 32],
        server_key: [u8; 32],
    },
    /// Only a SCRAM verifier, and no client has logged in with it yet (or the user is
    /// forced): no server login can be made with it ("wrong password type").
    ScramVerifier,
}

/// Everything needed to open a server connection for a pool.
#[derive(Clone)]
pub struct ServerTarget {
    /// The first (or only) host of `host=`.
    pub addr: ServerAddr,
    /// Every host of `host=a,b,…` (empty: `addr` alone) and which one new connections use.
    pub hosts: HostList,
    pub dbname: String,
    pub user: String,
    pub credential: Credential,
    /// Startup parameters sent at login (application_name, client_encoding, DateStyle, TimeZone…).
    pub startup_params: Vec<(String, String)>,
    pub connect_query: Option<String>,
    /// Memo of SCRAM key derivations (PBKDF2 once per password and salt).
    pub scram_cache: Option<std::sync::Arc<crate::auth::cache::ScramCache>>,
    /// TLS towards the server (server_tls_*); None: server_tls_sslmode = disable.
    pub tls: Option<std::sync::Arc<crate::net::tls::Connect>>,
    /// Socket options of server connections (tcp_keepalive, tcp_user_timeout…).
    pub tcp: TcpTuning,
    /// How long a host name that did not resolve is not looked up again (dns_nxdomain_ttl).
    pub dns_nxdomain_ttl: Duration,
}

/// The hosts of a `host=a,b,…` list and the choice among them (`load_balance_hosts`):
/// round-robin takes the next host for every new connection; disable keeps one host until
/// a connection to it fails, then moves to the next. With `target_session_attrs` other
/// than `any`, only hosts of the wanted role serve (see [`roles`](super::roles)); the roles
/// are shared by every clone of the list (one pool's settings, its role check).
#[derive(Clone, Debug, Default)]
pub struct HostList {
    pub addrs: Vec<ServerAddr>,
    pub round_robin: bool,
    next: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Host names that did not resolve, and when: skipped for `dns_nxdomain_ttl`
    /// ([`ServerTarget::dns_nxdomain_ttl`]). Lookups of the list's hosts take turns, so connections
    /// opened together look a failing name up once.
    dns: std::sync::Arc<tokio::sync::Mutex<Vec<(usize, std::time::Instant)>>>,
    /// `target_session_attrs`.
    pub attrs: SessionAttrs,
    /// `max_standby_lag`.
    pub max_lag: crate::config::settings::StandbyLag,
    book: std::sync::Arc<std::sync::Mutex<RoleBook>>,
    /// Woken when a host's role changes: relays of servers on a host that no longer fits
    /// stop (a transaction never commits on a fenced or demoted primary).
    pub changed: std::sync::Arc<tokio::sync::Notify>,
    /// When the roles were last checked by the role check (None: check now).
    checked: std::sync::Arc<std::sync::Mutex<Option<std::time::Instant>>>,
    checking: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// A read routing sub-pool's list: new servers go to this host alone.
    only: Option<usize>,
}

impl PartialEq for HostList {
    fn eq(&self, other: &Self) -> bool {
        self.addrs == other.addrs
            && self.round_robin == other.round_robin
            && self.attrs == other.attrs
            && self.max_lag == other.max_lag
    }
}

/// One host of a list as SHOW HOSTS and /metrics show it.
#[derive(Debug, Clone)]
pub struct HostView {
    pub addr: ServerAddr,
    pub state: HostState,
    /// New servers may go there now.
    pub usable: bool,
    pub primary: bool,
    pub fenced: bool,
}

/// SQL asking a server for its role: in recovery, read-only, a primary's timeline (from
/// its current WAL file name), a standby's WAL received and not yet replayed, and while
/// there is some, the milliseconds since the primary committed the last transaction the
/// standby replayed (since it started, when it has replayed none); the WAL position a
/// standby replayed or a primary inserted.
const ROLE_QUERY: &str = "SELECT pg_is_in_recovery(), current_setting('transaction_read_only'), \
    CASE WHEN pg_is_in_recovery() THEN 0 \
    ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int END, \
    CASE WHEN pg_is_in_recovery() THEN greatest(coalesce(pg_wal_lsn_diff(\
    pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn()), 0), 0)::bigint ELSE 0 END, \
    CASE WHEN pg_is_in_recovery() AND pg_last_wal_receive_lsn() > pg_last_wal_replay_lsn() \
    THEN greatest(extract(epoch FROM now() - coalesce(pg_last_xact_replay_timestamp(), \
    pg_postmaster_start_time())) * 1000, 0)::bigint ELSE 0 END, \
    pg_wal_lsn_diff(CASE WHEN pg_is_in_recovery() THEN coalesce(pg_last_wal_replay_lsn(), \
    '0/0') ELSE pg_current_wal_insert_lsn() END, '0/0')::bigint";

impl HostList {
    pub fn new(addrs: Vec<ServerAddr>, round_robin: bool) -> HostList {
        let n = addrs.len();
        HostList {
            addrs,
            round_robin,
            book: std::sync::Arc::new(std::sync::Mutex::new(RoleBook::new(n))),
            ..Default::default()
        }
    }

    /// With `target_session_attrs` and `max_standby_lag`.
    pub fn with_roles(
        mut self,
        attrs: SessionAttrs,
        max_lag: crate::config::settings::StandbyLag,
    ) -> HostList {
        self.attrs = attrs;
        self.max_lag = max_lag;
        self
    }

    /// `new` (a reloaded entry's list), with this list's knowledge of the hosts' roles
    /// when it names the same hosts in the same order.
    pub fn carried_into(&self, new: HostList) -> HostList {
        if self.addrs != new.addrs {
            return new;
        }
        HostList {
            round_robin: new.round_robin,
            attrs: new.attrs,
            max_lag: new.max_lag,
            ..self.clone()
        }
    }

    fn book(&self) -> std::sync::MutexGuard<'_, RoleBook> {
        self.book.locked()
    }

    /// The same hosts and roles (one book), for servers of host `i` alone as `attrs`
    /// wants them: a read routing sub-pool's list.
    pub fn only(&self, i: usize, attrs: SessionAttrs) -> HostList {
        HostList {
            only: Some(i),
            attrs,
            ..self.clone()
        }
    }

    /// Host `i` is a standby within `max_standby_lag`.
    pub fn standby_ok(&self, i: usize) -> bool {
        self.book().standby_ok(i, self.max_lag)
    }

    /// The primary now, if one is known.
    pub fn primary(&self) -> Option<usize> {
        self.book().primary
    }

    /// Host `i`'s highest WAL position seen and when it was asked (see
    /// [`HostState::note_lsn`]).
    pub fn lsn(&self, i: usize) -> (u64, Option<std::time::Instant>) {
        self.book()
            .hosts
            .get(i)
            .map_or((0, None), |h| (h.lsn, h.lsn_at))
    }

    /// A WAL position of host `i` asked at `asked`.
    pub fn note_lsn(&self, i: usize, lsn: u64, asked: std::time::Instant) {
        if let Some(h) = self.book().hosts.get_mut(i) {
            h.note_lsn(lsn, asked);
        }
    }

    /// Roles are checked: `target_session_attrs` is not `any`.
    pub fn checks_roles(&self) -> bool {
        self.attrs != SessionAttrs::Any && !self.addrs.is_empty()
    }

    /// Whether a server on host `host` may serve another transaction (see
    /// [`RoleBook::keeps`]). Always true without role checks.
    pub fn keeps(&self, host: Option<usize>) -> bool {
        if !self.checks_roles() {
            return true;
        }
        match host {
            Some(i) => self.book().keeps(i, self.attrs, self.max_lag),
            None => false,
        }
    }

    /// A server on host `host` must stop at once, mid-transaction too: its host is known
    /// to be no primary any more (see [`RoleBook::demoted`]).
    pub fn demoted(&self, host: Option<usize>) -> bool {
        self.checks_roles()
            && self.attrs.wants_primary()
            && host.is_some_and(|i| self.book().demoted(i))
    }

    /// Times the primary moved from one host to another.
    pub fn switchovers(&self) -> u64 {
        self.book().switchovers
    }

    /// The last switchovers, oldest first: when, and the hosts the primary moved between.
    pub fn recent_switchovers(&self) -> Vec<(std::time::SystemTime, String, String)> {
        let b = self.book();
        let name = |i: usize| self.addrs.get(i).map(|a| a.to_string()).unwrap_or_default();
        b.recent
            .iter()
            .map(|s| (s.at, name(s.from), name(s.to)))
            .collect()
    }

    /// Every host, its state, and whether new servers may go there.
    pub fn view(&self) -> Vec<HostView> {
        let b = self.book();
        self.addrs
            .iter()
            .enumerate()
            .map(|(i, a)| HostView {
                addr: a.clone(),
                state: b.hosts.get(i).cloned().unwrap_or_default(),
                usable: b.fits(i, self.attrs, self.max_lag),
                primary: b.primary == Some(i),
                fenced: b.is_fenced(i),
            })
            .collect()
    }

    /// Record what a check of host `i` found; logs a change of primary.
    pub fn observe(&self, i: usize, o: Observed, db: &str) {
        let change = self.book().observe(i, o);
        self.after(change, db, "a check found it");
    }

    /// Host `i` is down (a login failed) or in doubt (a server of it reported an admin
    /// shutdown, a read-only transaction, or was lost): its role is unknown until checked
    /// again, which happens at once.
    pub fn forget(&self, i: usize, down: bool, why: &str, db: &str) {
        let change = {
            let mut b = self.book();
            let was = b.hosts.get(i).map(|h| h.role);
            let change = b.forget(i, down, why);
            if was
                != Some(if down {
                    HostRole::Down
                } else {
                    HostRole::Unknown
                })
            {
                tracing::info!(db, host = %self.addrs[i], "host role unknown: {why}");
            }
            change
        };
        self.check_now();
        self.after(change, db, why);
    }

    fn after(&self, change: Option<PrimaryChange>, db: &str, why: &str) {
        let Some(c) = change else { return };
        let name = |h: Option<usize>| match h {
            Some(i) => self.addrs[i].to_string(),
            None => "none".to_string(),
        };
        if self.attrs != SessionAttrs::Any {
            tracing::warn!(
                db,
                "primary changed from {} to {} ({why}); switchovers: {}",
                name(c.from),
                name(c.to),
                self.switchovers()
            );
        }
        self.changed.notify_waiters();
    }

    /// Ask for a role check at the next janitor round.
    pub fn check_now(&self) {
        *self.checked.locked() = None;
    }

    /// The role check is due (every `interval`, or asked for) and none runs: true once
    /// per round, the caller then runs [`check_roles`].
    pub fn role_check_due(&self, interval: Duration) -> bool {
        use std::sync::atomic::Ordering;
        if !self.checks_roles() || self.checking.load(Ordering::Acquire) {
            return false;
        }
        let mut at = self.checked.locked();
        let due = match *at {
            None => true,
            Some(t) => !interval.is_zero() && t.elapsed() >= interval,
        };
        if due {
            *at = Some(std::time::Instant::now());
            self.checking.store(true, Ordering::Release);
        }
        due
    }

    /// The order to try hosts in for a new server (round-robin or sticky start, then by
    /// role); `[]`: no list (use the target's one address).
    fn order(&self) -> Vec<usize> {
        use std::sync::atomic::Ordering;
        if let Some(i) = self.only {
            return vec![i];
        }
        let n = self.addrs.len();
        if n == 0 || (n == 1 && !self.checks_roles()) {
            return Vec::new();
        }
        let start = if self.round_robin {
            self.next.fetch_add(1, Ordering::Relaxed)
        } else {
            self.next.load(Ordering::Relaxed)
        } % n;
        self.book().order(start, self.attrs, self.max_lag)
    }

    /// The host for a new connection, and its index (for `failed`). None: no list.
    pub fn pick(&self) -> Option<(&ServerAddr, usize)> {
        let i = *self.order().first()?;
        Some((&self.addrs[i], i))
    }

    /// A connection to host `i` failed: with `disable`, move on to the next host (once,
    /// however many connections to it failed together).
    pub fn failed(&self, i: usize) {
        use std::sync::atomic::Ordering;
        if !self.round_robin && !self.addrs.is_empty() {
            let n = self.addrs.len();
            let _ = self
                .next
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |cur| {
                    (cur % n == i).then_some((i + 1) % n)
                });
        }
    }
}

/// Ask a logged-in server for its role ([`ROLE_QUERY`]).
pub async fn ask_role(server: &mut Server) -> Result<Observed, ServerError> {
    let asked = std::time::Instant::now();
    let sets = super::query::query_sets(server, ROLE_QUERY).await?;
    let row = sets
        .first()
        .and_then(|s| s.first())
        .ok_or_else(|| ServerError::Login("the role query returned no row".into()))?;
    let col = |k: usize| row.get(k).cloned().flatten().unwrap_or_default();
    Ok(Observed {
        standby: col(0) == "t",
        read_only: col(1) == "on",
        timeline: col(2).parse().unwrap_or(0),
        lag_bytes: col(3).parse().unwrap_or(0),
        lag_ms: col(4).parse().unwrap_or(0),
        lsn: col(5).parse().unwrap_or(0),
        asked: Some(asked),
    })
}

/// The role check: log in to every host of the list, ask its role, log out. A host that
/// cannot be reached is down.
pub async fn check_roles(target: &ServerTarget, db: &str, timeout: Duration) {
    /// Another check may start once this one ends, however it ends.
    struct Done<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for Done<'_> {
        fn drop(&mut self) {
            self.0.store(false, std::sync::atomic::Ordering::Release);
        }
    }
    let hosts = &target.hosts;
    let _done = Done(&hosts.checking);
    for (i, addr) in hosts.addrs.iter().enumerate() {
        let checked = tokio::time::timeout(timeout, async {
            let stream = addr.connect().await.map_err(ServerError::Connect)?;
            let mut s = handshake(target, stream, addr, 0).await?;
            let o = ask_role(&mut s).await;
            s.conn.queue_with(crate::proto::frontend::terminate);
            let _ = s.conn.flush().await;
            o
        })
        .await
        .unwrap_or(Err(ServerError::Timeout));
        match checked {
            Ok(o) => hosts.observe(i, o, db),
            Err(e) if e.is_unavailable() => {
                tracing::debug!(db, host = %addr, "role check failed: {e}");
                hosts.forget(i, true, &format!("role check failed: {e}"), db);
            }
            // Refused (a password, too many connections): says nothing of its role.
            Err(e) => tracing::debug!(db, host = %addr, "role check failed: {e}"),
        }
    }
}

/// Connect and log in within `timeout`.
/// `db` is the pool's database name (the client's), for the log.
pub async fn connect(
    target: &ServerTarget,
    db: &str,
    id: u64,
    timeout: Duration,
) -> Result<Server, ServerError> {
    let tried = std::sync::Mutex::new(None);
    // Whether the TCP connect finished: a timeout before that is PgBouncer's "connect
    // failed" (its socket's own connect timeout), after it "connect timeout" (the login).
    let connected = std::sync::atomic::AtomicBool::new(false);
    let r = match tokio::time::timeout(timeout, login(target, db, id, &tried, &connected)).await {
        Ok(r) => r,
        Err(_) => Err(ServerError::Timeout),
    };
    match &r {
        Ok(s) if crate::logging::connections() => {
            let from = s.conn.stream.local().unwrap_or_else(|| "unix".into());
            tracing::info!(server = id, db, user = %target.user, addr = %s.addr,
                "new connection to server (from {from})");
        }
        Ok(_) => {}
        // Failures of the connect itself are logged per host in `open_stream`.
        Err(ServerError::Connect(_)) => {}
        Err(e) if crate::logging::disconnections() => {
            let addr = tried
                .into_inner()
                .ok()
                .flatten()
                .unwrap_or_else(|| target.addr.clone());
            // As PgBouncer: a refused replication login says only "login failed" (its
            // reason is often a missing privilege of that kind of connection alone).
            let replication = target
                .startup_params
                .iter()
                .any(|(k, _)| k == "replication");
            let why = match e {
                ServerError::Rejected(_) if replication => "login failed".into(),
                ServerError::Timeout if !connected.load(std::sync::atomic::Ordering::Relaxed) => {
                    "connect failed".into()
                }
                e => close_reason(e),
            };
            tracing::info!(server = id, db, user = %target.user, %addr,
                "closing because: {why} (age=0s)");
        }
        Err(_) => {}
    }
    r
}

/// Connect to the server, or with `host=a,b,…` to the host the list picks, then to the
/// others in turn while connecting fails (each failure moves `disable` on; a name that
/// did not resolve lately is skipped). Each failed connect is logged as PgBouncer closes a
/// server: `closing because: connect failed` / `server DNS lookup failed`.
async fn open_stream(
    target: &ServerTarget,
    db: &str,
    id: u64,
    tried: &std::sync::Mutex<Option<ServerAddr>>,
) -> Result<(Stream, ServerAddr), ServerError> {
    let order = target.hosts.order();
    let candidates: Vec<Option<usize>> = if order.is_empty() {
        vec![None]
    } else {
        order.into_iter().map(Some).collect()
    };
    let mut last = None;
    for host in candidates {
        match connect_one(target, db, id, host, tried).await {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or(ServerError::Timeout))
}

/// Connect to host `host` of the list (None: the target's one address); a failure is
/// logged as PgBouncer closes a server.
async fn connect_one(
    target: &ServerTarget,
    db: &str,
    id: u64,
    host: Option<usize>,
    tried: &std::sync::Mutex<Option<ServerAddr>>,
) -> Result<(Stream, ServerAddr), ServerError> {
    let addr = match host {
        Some(i) => &target.hosts.addrs[i],
        None => &target.addr,
    };
    if let Ok(mut t) = tried.lock() {
        *t = Some(addr.clone());
    }
    let resolved = match host {
        Some(i) => {
            let mut failed = target.hosts.dns.lock().await;
            failed.retain(|(_, at)| at.elapsed() < target.dns_nxdomain_ttl);
            if failed.iter().any(|(h, _)| *h == i) {
                // Looked up and failed a moment ago (logged then).
                target.hosts.failed(i);
                return Err(ServerError::Connect(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    DnsFailed(std::io::Error::other("lookup failed lately")),
                )));
            }
            let r = addr.resolve().await;
            if r.is_err() {
                failed.push((i, std::time::Instant::now()));
            }
            r
        }
        None => addr.resolve().await,
    };
    let connected = match resolved {
        Ok(addrs) => addr.connect_to(addrs, Some(&target.tcp)).await,
        Err(e) => Err(e),
    };
    match connected {
        Ok(s) => Ok((s, addr.clone())),
        Err(e) => {
            if let Some(i) = host {
                target.hosts.failed(i);
            }
            let e = ServerError::Connect(e);
            if crate::logging::disconnections() {
                tracing::info!(server = id, db, user = %target.user, %addr,
                    "closing because: {} (age=0s)", close_reason(&e));
            }
            tracing::debug!(%addr, "connecting to the server failed: {e}");
            Err(e)
        }
    }
}

/// With `target_session_attrs`: try the hosts in turn (those known to fit first), log in,
/// ask the role, keep the first server whose host fits (libpq's rule; prefer-standby
/// keeps a primary for when no standby fits). Every host tried has its role recorded.
async fn login_by_role(
    target: &ServerTarget,
    db: &str,
    id: u64,
    tried: &std::sync::Mutex<Option<ServerAddr>>,
) -> Result<Server, ServerError> {
    let hosts = &target.hosts;
    let mut last = None;
    let mut fallback: Option<Server> = None;
    let mut seen = Vec::new();
    for i in hosts.order() {
        let found = async {
            let (stream, addr) = connect_one(target, db, id, Some(i), tried).await?;
            let mut s = handshake(target, stream, &addr, id).await?;
            let o = ask_role(&mut s).await?;
            Ok::<_, ServerError>((s, o))
        }
        .await;
        let (mut s, o) = match found {
            Ok(f) => f,
            Err(e) => {
                // Down only when it does not answer (a refused password or too many
                // connections says nothing of its role).
                if e.is_unavailable() {
                    hosts.forget(i, true, &format!("login failed: {e}"), db);
                }
                seen.push(format!("{} down", hosts.addrs[i]));
                last = Some(e);
                continue;
            }
        };
        hosts.observe(i, o, db);
        s.host = Some(i);
        let (fits, primary) = {
            let book = hosts.book();
            let fits = if hosts.attrs == SessionAttrs::PreferStandby {
                // libpq: a standby if any host is one; the primary only once every host
                // is known and none is a usable standby.
                book.fits(i, SessionAttrs::Standby, hosts.max_lag)
                    || (book.fits(i, hosts.attrs, hosts.max_lag)
                        && book.hosts.iter().all(|h| h.role != HostRole::Unknown))
            } else {
                book.fits(i, hosts.attrs, hosts.max_lag)
            };
            (fits, book.is_live_primary(i))
        };
        if fits {
            return finish_login(target, s).await;
        }
        seen.push(format!(
            "{} {}",
            hosts.addrs[i],
            if o.standby { "standby" } else { "primary" }
        ));
        if hosts.attrs == SessionAttrs::PreferStandby && primary && fallback.is_none() {
            fallback = Some(s);
            continue;
        }
        s.conn.queue_with(crate::proto::frontend::terminate);
        let _ = s.conn.flush().await;
    }
    if let Some(s) = fallback {
        return finish_login(target, s).await;
    }
    match last {
        Some(e) if seen.iter().all(|h| h.ends_with(" down")) => Err(e),
        _ => Err(ServerError::NoHost(format!(
            "no host fits target_session_attrs={} ({})",
            hosts.attrs.name(),
            seen.join(", ")
        ))),
    }
}

async fn login(
    target: &ServerTarget,
    db: &str,
    id: u64,
    tried: &std::sync::Mutex<Option<ServerAddr>>,
    connected: &std::sync::atomic::AtomicBool,
) -> Result<Server, ServerError> {
    if target.hosts.checks_roles() {
        return login_by_role(target, db, id, tried).await;
    }
    let (stream, addr) = open_stream(target, db, id, tried).await?;
    connected.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut server = handshake(target, stream, &addr, id).await?;
    server.host = target.hosts.addrs.iter().position(|a| *a == addr);
    finish_login(target, server).await
}

/// The connect_query, once the server is the one to keep.
async fn finish_login(target: &ServerTarget, mut server: Server) -> Result<Server, ServerError> {
    if let Some(q) = &target.connect_query {
        if let Some(e) = super::query::simple_query(&mut server, q).await? {
            return Err(ServerError::Rejected(e));
        }
        server.login_params = server.params.clone();
    }
    Ok(server)
}

/// TLS, the StartupMessage, authentication, up to the first ReadyForQuery.
async fn handshake(
    target: &ServerTarget,
    stream: Stream,
    addr: &ServerAddr,
    id: u64,
) -> Result<Server, ServerError> {
    let mut conn = Conn::new(stream);
    if let (Some(tls), ServerAddr::Tcp { host, .. }) = (&target.tls, addr) {
        start_tls(&mut conn, tls, host, id).await?;
    }
    let mut params: Vec<(&str, &str)> = vec![("user", &target.user), ("database", &target.dbname)];
    for (k, v) in &target.startup_params {
        params.push((k, v));
    }
    // Protocol 3.2 where the server speaks it (PostgreSQL 18: a longer cancel key; older
    // servers answer NegotiateProtocolVersion 3.0 and go on). A replication connection
    // passes the server's BackendKeyData to its client, which may speak 3.0: 3.0 there.
    let replication = target
        .startup_params
        .iter()
        .any(|(k, _)| k == "replication");
    let minor = if replication {
        0
    } else {
        startup::NEWEST_MINOR
    };
    conn.queue_with(|b| startup::startup_message_minor(b, minor, &params));
    conn.flush()
        .await
        .map_err(|e| ServerError::Conn(e.into()))?;

    let mut scram: Option<scram::ScramClient> = None;
    let mut server_params = Params::default();
    let mut key = (0, 0);
    let mut key_rest: Option<std::sync::Arc<[u8]>> = None;
    loop {
        let h = conn.read_message(LOGIN_MESSAGE_LIMIT).await?;
        let body = &conn.rbuf[5..h.total];
        match h.tag {
            backend::AUTHENTICATION => {
                let out = authenticate(target, &conn.stream, body, &mut scram, id).await?;
                if !out.is_empty() {
                    conn.queue(out.freeze());
                }
            }
            backend::PARAMETER_STATUS => {
                let (k, v) = backend::parse_parameter_status(body)?;
                server_params.set(k, v);
            }
            backend::BACKEND_KEY_DATA => {
                let (k, rest) = backend::parse_backend_key_data_long(body)?;
                key = k;
                key_rest = (!rest.is_empty()).then(|| std::sync::Arc::from(rest));
            }
            backend::NEGOTIATE_PROTOCOL_VERSION => {
                // An older server's 3.0 (nothing to change: 3.0 is what follows), or an
                // option it does not know (none is sent).
                tracing::debug!(server = id, "server negotiated the protocol down");
            }
            backend::ERROR_RESPONSE => {
                return Err(ServerError::Rejected(backend::parse_error(body)?));
            }
            backend::READY_FOR_QUERY => {
                conn.consume(h.total);
                break;
            }
            _ => {} // NoticeResponse and the like
        }
        conn.consume(h.total);
        if conn.out_len() > 0 {
            conn.flush()
                .await
                .map_err(|e| ServerError::Conn(e.into()))?;
        }
    }
    for (k, v) in &target.startup_params {
        if server_params.get(k).is_none() {
            server_params.set(k, v);
        }
    }
    let tls = conn.stream.tls_info().map(std::sync::Arc::from);
    let mut server = Server::new(id, conn, addr.clone(), key, server_params);
    server.key_rest = key_rest;
    server.tls = tls;
    Ok(server)
}

/// The answer to a server's authentication request (`body`; empty: none to send).
async fn authenticate(
    target: &ServerTarget,
    stream: &Stream,
    body: &[u8],
    scram: &mut Option<scram::ScramClient>,
    id: u64,
) -> Result<BytesMut, ServerError> {
    let mut out = BytesMut::new();
    match backend::parse_auth(body)? {
        AuthRequest::Ok => {}
        AuthRequest::Cleartext => match &target.credential {
            Credential::Plain(pw) => frontend::password(&mut out, pw.as_bytes()),
            _ => {
                return Err(ServerError::Login(
                    "server asks for a cleartext password we do not have".into(),
                ));
            }
        },
        AuthRequest::Md5(salt) => {
            let hash = md5_secret(target)?;
            frontend::password(&mut out, md5::salted_response(&hash, salt).as_bytes());
        }
        AuthRequest::Sasl(mechs) => {
            *scram = Some(sasl_first(target, stream, &mechs, id, &mut out)?)
        }
        AuthRequest::SaslContinue(data) => {
            let c = scram
                .as_mut()
                .ok_or(ServerError::Login("unexpected SASL continue".into()))?;
            let fin = match (&target.credential, &target.scram_cache) {
                (Credential::Plain(pw), Some(cache)) => {
                    let (salt, iter) = scram::server_first_params(data)
                        .map_err(|e| ServerError::Login(e.to_string()))?;
                    let (ck, sk) = cache.client_keys_async(pw, &salt, iter).await;
                    c.server_first_with_keys(data, ck, sk)
                }
                _ => c.server_first(data),
            }
            .map_err(|e| ServerError::Login(e.to_string()))?;
            frontend::sasl_response(&mut out, &fin);
        }
        AuthRequest::SaslFinal(data) => {
            let c = scram
                .as_mut()
                .ok_or(ServerError::Login("unexpected SASL final".into()))?;
            c.server_final(data)
                .map_err(|e| ServerError::Login(e.to_string()))?;
        }
        AuthRequest::Other(n) => {
            return Err(ServerError::Login(format!(
                "unsupported server auth method {n}"
            )));
        }
    }
    Ok(out)
}

/// The MD5 secret to answer a server's MD5 request with.
fn md5_secret(target: &ServerTarget) -> Result<String, ServerError> {
    Ok(match &target.credential {
        Credential::Plain(pw) => md5::password_hash(&target.user, pw),
        Credential::Md5Hash(h) => h.clone(),
        // PgBouncer's words for a secret of the wrong kind.
        Credential::ScramKeys { .. } | Credential::ScramVerifier => {
            return Err(ServerError::Login(
                "cannot do MD5 authentication: wrong password type".into(),
            ));
        }
        Credential::None => {
            return Err(ServerError::Login(
                "server asks for md5 auth and no password is known".into(),
            ));
        }
    })
}

/// The first SASL message for a server offering `mechs`: the SCRAM client it starts.
fn sasl_first(
    target: &ServerTarget,
    stream: &Stream,
    mechs: &[&str],
    id: u64,
    out: &mut BytesMut,
) -> Result<scram::ScramClient, ServerError> {
    if !mechs.contains(&scram::MECHANISM) && !mechs.contains(&scram::MECHANISM_PLUS) {
        return Err(ServerError::Login(
            "server offers no SASL mechanism we support".into(),
        ));
    }
    let cred = match &target.credential {
        Credential::Plain(pw) => scram::ClientCredential::Password(pw.clone()),
        Credential::ScramKeys {
            client_key,
            server_key,
        } => scram::ClientCredential::Keys {
            client_key: *client_key,
            server_key: *server_key,
        },
        Credential::Md5Hash(_) | Credential::ScramVerifier => {
            return Err(ServerError::Login(
                "cannot do SCRAM authentication: wrong password type".into(),
            ));
        }
        Credential::None => {
            return Err(ServerError::Login(
                "server asks for SCRAM auth and no password is known".into(),
            ));
        }
    };
    // Over TLS, bind the login to the connection when the server
    // offers SCRAM-SHA-256-PLUS (libpq's channel_binding=prefer).
    let cb = match stream.tls_end_point() {
        Some(d) if mechs.contains(&scram::MECHANISM_PLUS) => scram::ChannelBinding::EndPoint(d),
        _ if stream.is_tls() => scram::ChannelBinding::NotOffered,
        _ => scram::ChannelBinding::None,
    };
    let mut c = scram::ScramClient::new(cred).with_channel_binding(cb);
    let first = c.client_first();
    let mech = c.mechanism();
    tracing::debug!(server = id, "SASL login with {mech}");
    frontend::sasl_initial_response(out, mech, &first);
    Ok(c)
}

/// SSLRequest, and the TLS handshake if the server agrees ('S'); a server that refuses
/// ('N') gets plain TCP unless server_tls_sslmode is require or stricter.
async fn start_tls(
    conn: &mut Conn,
    tls: &crate::net::tls::Connect,
    host: &str,
    id: u64,
) -> Result<(), ServerError> {
    use crate::net::tls::SslMode;
    conn.queue(bytes::Bytes::from_static(&startup::SSL_REQUEST));
    conn.flush()
        .await
        .map_err(|e| ServerError::Conn(e.into()))?;
    conn.fill(1).await?;
    let answer = conn.rbuf[0];
    // Anything after the answer came before the handshake: unencrypted, maybe injected.
    if conn.rbuf.len() > 1 {
        return Err(ServerError::Login(
            "received unencrypted data after SSL response".into(),
        ));
    }
    conn.consume(1);
    match answer {
        b'S' => {}
        b'N' if tls.mode >= SslMode::Require => {
            return Err(ServerError::Login("server refused SSL".into()));
        }
        b'N' => return Ok(()),
        _ => return Err(ServerError::Login("bad sslreq answer".into())),
    }
    let name = crate::net::tls::server_name(host).map_err(|e| ServerError::Login(e.0))?;
    let Stream::Tcp(tcp) = std::mem::replace(&mut conn.stream, Stream::Gone) else {
        return Err(ServerError::Login("TLS over a non-TCP socket".into()));
    };
    let stream = tls.connector.connect(name, tcp).await.map_err(|e| {
        let why = match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
            // OpenSSL's words, which PgBouncer logs (and its tests look for).
            Some(rustls::Error::InvalidCertificate(c)) => {
                format!("certificate verify failed: {c:?}")
            }
            _ => e.to_string(),
        };
        tracing::warn!(server = id, %host, "TLS handshake with the server failed: {why}");
        ServerError::Login(format!("TLS handshake failed: {why}"))
    })?;
    conn.stream = Stream::TlsOut(Box::new(stream));
    if let Some(info) = conn.stream.tls_info() {
        tracing::debug!(server = id, %host, "SSL established: {info}");
    }
    Ok(())
}

/// Send a CancelRequest for `key` (and `rest`, the rest of a protocol 3.2 secret) to the
/// server at `addr`.
pub async fn send_cancel(addr: &ServerAddr, key: (i32, i32), rest: &[u8]) -> std::io::Result<()> {
    send_cancel_over(addr.connect().await?, key, rest).await
}

/// Send a CancelRequest over a connection just opened (to a server or a peer pooler);
/// `rest`: the rest of a long (protocol 3.2) secret after `key`'s 4 bytes.
pub async fn send_cancel_over(stream: Stream, key: (i32, i32), rest: &[u8]) -> std::io::Result<()> {
    let mut conn = Conn::new(stream);
    conn.queue_with(|b| startup::cancel_request_long(b, key.0, key.1, rest));
    conn.flush().await?;
    // PostgreSQL closes the connection when done; wait for that, bounded.
    let _ = tokio::time::timeout(Duration::from_secs(5), conn.fill(1)).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(round_robin: bool) -> HostList {
        let a = |h: &str| ServerAddr::new(Some(h), 5432);
        HostList::new(vec![a("a"), a("b"), a("c")], round_robin)
    }

    #[test]
    fn a_reload_naming_the_same_hosts_keeps_what_is_known_of_their_roles() {
        let old = hosts(false).with_roles(SessionAttrs::ReadWrite, Default::default());
        let o = |timeline| Observed {
            standby: false,
            read_only: false,
            timeline,
            lag_bytes: 0,
            lag_ms: 0,
            lsn: 0,
            asked: None,
        };
        old.observe(0, o(1), "db");
        old.observe(1, o(2), "db");
        assert_eq!(old.switchovers(), 1);
        let same =
            old.carried_into(hosts(true).with_roles(SessionAttrs::ReadWrite, Default::default()));
        assert!(same.round_robin);
        assert!(same.view()[0].fenced, "the former primary stays fenced");
        let other = old.carried_into(HostList::new(vec![ServerAddr::new(Some("z"), 1)], true));
        assert_eq!(other.switchovers(), 0);
    }

    #[test]
    fn round_robin_takes_the_next_host_every_time() {
        let h = hosts(true);
        let picked: Vec<usize> = (0..5).map(|_| h.pick().unwrap().1).collect();
        assert_eq!(picked, [0, 1, 2, 0, 1]);
        h.failed(2); // no effect on round-robin
        assert_eq!(h.pick().unwrap().1, 2);
    }

    #[test]
    fn disable_keeps_a_host_until_it_fails_once() {
        let h = hosts(false);
        assert_eq!(h.pick().unwrap().1, 0);
        assert_eq!(h.pick().unwrap().1, 0);
        // Two connections to host 0 fail together: one move, to host 1.
        h.failed(0);
        h.failed(0);
        assert_eq!(h.pick().unwrap().1, 1);
        h.failed(1);
        h.failed(1);
        assert_eq!(h.pick().unwrap().1, 2);
        h.failed(0);
        assert_eq!(
            h.pick().unwrap().1,
            2,
            "a stale failure of host 0 moves nothing"
        );
        h.failed(2);
        assert_eq!(h.pick().unwrap().1, 0, "wraps around");
        let one = HostList::new(vec![ServerAddr::new(Some("x"), 1)], false);
        assert!(one.pick().is_none(), "a single host is no list");
    }

    /// A round-robin list of a listening socket and a name that does not resolve.
    fn nxdomain_target(port: u16, ttl: Duration) -> ServerTarget {
        let hosts = vec![
            ServerAddr::new(Some("127.0.0.1"), port),
            ServerAddr::new(Some("nxdomain.invalid"), port),
        ];
        ServerTarget {
            addr: hosts[0].clone(),
            hosts: HostList::new(hosts, true),
            dbname: "db".into(),
            user: "user".into(),
            credential: Credential::None,
            startup_params: Vec::new(),
            connect_query: None,
            scram_cache: None,
            tls: None,
            tcp: Default::default(),
            dns_nxdomain_ttl: ttl,
        }
    }

    /// When the failed lookup of the name was recorded, after the list was gone round
    /// once (the name looked up, failing, then 127.0.0.1) and after a second round (the
    /// name picked again); None: forgotten.
    async fn failed_lookup_after_two_rounds(ttl: Duration) -> (Option<Instant>, Option<Instant>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let t = nxdomain_target(l.local_addr().unwrap().port(), ttl);
        let tried = std::sync::Mutex::new(None);
        let at = |t: &ServerTarget| t.hosts.dns.try_lock().unwrap().first().map(|e| e.1);
        for id in 0..2 {
            open_stream(&t, "db", id, &tried).await.unwrap();
        }
        let first = at(&t);
        for id in 2..4 {
            open_stream(&t, "db", id, &tried).await.unwrap();
        }
        (first, at(&t))
    }

    use std::time::Instant;

    #[tokio::test]
    async fn dns_nxdomain_ttl_skips_a_name_that_did_not_resolve() {
        let (first, now) = failed_lookup_after_two_rounds(Duration::from_secs(60)).await;
        assert!(first.is_some(), "the failure is kept");
        assert_eq!(first, now, "not looked up again within dns_nxdomain_ttl");
        // dns_nxdomain_ttl = 0: forgotten at the next lookup of any host.
        let (first, now) = failed_lookup_after_two_rounds(Duration::ZERO).await;
        assert_eq!((first, now), (None, None));
    }
}
