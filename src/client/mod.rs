//! One task per client: startup and auth, then the transaction loop.
pub mod aborted;
pub mod auth_query;
pub mod cancel;
pub mod deferred;
pub mod fast;
pub mod notify;
pub mod relay;
pub mod renamed;
pub mod replication;
pub mod rewrite;
pub mod route;
pub mod session;
pub mod startup;
pub mod transaction;

// Below client/ and server/ now; the old paths stay for the relay files (issue 20, item 1).
pub use crate::sql::classify;
pub use crate::statements as prepared;
// The shared bookkeeping of clients lives below client/ (admin/ and takeover/ read it too).
pub use crate::shared::{counts, logins, registry};

use std::sync::Arc;
use std::time::Instant;

use crate::config::{self, Config, DatabaseEntry};
use crate::net::conn::ConnError;
use crate::net::{Conn, Stream};
use crate::pool::Pool;
use crate::proto::{ProtoError, backend, startup::parse_options};
use crate::server::{Credential, Params};
use crate::shared::Shared;
use crate::shared::console::Role;
use crate::shared::credential_for;
use crate::shared::registry::client_event;
use registry::{ClientState, Registration};
use session::VirtualSession;

/// Why a client is being let go.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Tell the client (FATAL with this SQLSTATE), then close.
    #[error("{message}")]
    Fatal { code: &'static str, message: String },
    /// It was told already (a FATAL from its server that it caused, forwarded): close.
    #[error("{0}")]
    Told(String),
    #[error(transparent)]
    Conn(#[from] ConnError),
}

impl ClientError {
    pub fn fatal(code: &'static str, message: String) -> Self {
        ClientError::Fatal { code, message }
    }
}

impl From<ProtoError> for ClientError {
    fn from(e: ProtoError) -> Self {
        let message = match e {
            // PostgreSQL's own words for it.
            ProtoError::UnknownType(_) => e.to_string(),
            e => format!("protocol violation: {e}"),
        };
        ClientError::fatal("08P01", message)
    }
}

impl From<std::io::Error> for ClientError {
    fn from(e: std::io::Error) -> Self {
        ClientError::Conn(ConnError::Io(e))
    }
}

/// A logged-in client.
pub struct Client {
    pub shared: Arc<Shared>,
    pub conn: Conn,
    pub pool: Arc<Pool>,
    pub session: VirtualSession,
    pub reg: Registration,
    /// Counted in its database and user (client connection limits) while it lives.
    pub counted: counts::Counted,
    /// Online restart: this client stays with this process (false: it moves when idle);
    /// why is in its handle (SHOW CLIENTS).
    pub stays: bool,
    /// The channels it listens on through the pool's shared listener.
    pub listening: notify::Listening,
    /// Read routing: what it has seen of the database (read_your_writes), from its first
    /// routed transaction on.
    pub seen: Option<Box<route::Seen>>,
    /// The BEGIN pgcarpool answered for it, not sent to a server yet (`deferred`).
    pub begun: Option<deferred::Begun>,
}

impl Client {
    /// A logged-in client (or one moved in from the process this one took over from): it
    /// moves on when idle, and listens to nothing yet.
    pub fn new(
        shared: Arc<Shared>,
        conn: Conn,
        pool: Arc<Pool>,
        session: VirtualSession,
        reg: Registration,
        counted: counts::Counted,
    ) -> Client {
        Client {
            shared,
            conn,
            pool,
            session,
            reg,
            counted,
            stays: false,
            listening: Default::default(),
            seen: Default::default(),
            begun: None,
        }
    }
}

/// Where an accepted connection's login led. Boxed: what a client task keeps for its
/// whole life is the session that serves it, not room for this too.
pub enum Arrival {
    /// A client of a pool, logged in: `takeover::serve` serves it.
    Client(Box<Client>),
    /// A console user, logged in, listed and counted: `admin::serve` runs the session.
    Console(Box<Console>),
}

/// A console session about to run. Listed in SHOW CLIENTS as PgBouncer lists console
/// connections (database pgbouncer, active); KILL_CLIENT and shutdowns end it (`kill`).
pub struct Console {
    pub shared: Arc<Shared>,
    pub conn: Conn,
    pub user: String,
    pub role: Role,
    /// Its own handle: `killed` resolves on KILL_CLIENT and shutdowns.
    pub kill: Arc<registry::ClientHandle>,
    reg: Registration,
    counted: counts::Counted,
    id: u64,
    peer: String,
    born: Instant,
    /// log_connections when it logged in.
    log: bool,
}

impl Console {
    /// The session is over: gone from the lists and counts; an error is reported as a
    /// failed login is.
    pub async fn end(self, result: Result<(), ClientError>) {
        let Console {
            mut conn,
            reg,
            counted,
            id,
            peer,
            born,
            log,
            ..
        } = self;
        drop((reg, counted));
        if let Err(e) = result
            && report(&mut conn, &e, (id, &peer, None), log, born.elapsed())
        {
            conn.close().await;
        }
    }
}

/// Log one accepted connection in: the client or console session it became, or None (a
/// cancel request, a replication connection served to its end, or a login that failed
/// and was told why).
/// The caller boxes it: the login's state is gone once the client is in, and is not part
/// of the task every idle client keeps.
pub async fn arrive(shared: Arc<Shared>, stream: Stream, id: u64) -> Option<Arrival> {
    let cfg = shared.config_full();
    enter(shared, stream, id, &cfg).await
}

/// Why a client cannot move to the new process now (None: it can).
pub fn stays_because(c: &Client) -> Option<&'static str> {
    if c.pool.settings().mode == config::PoolMode::Session {
        return Some("session pooling mode");
    }
    if c.session.pin.is_some() {
        return Some("pinned to its server");
    }
    if c.listening.is_listening() {
        return Some("listening");
    }
    if c.session.statements.values().any(|s| s.depends.is_some()) {
        return Some("a prepared statement runs another");
    }
    // Exhaustive on purpose: a new transport (TLS) must say whether it can move. A TLS
    // client's session keys cannot be carried yet: it stays (README, "Online restart").
    match &c.conn.stream {
        Stream::Tcp(_) | Stream::Unix(_) => None,
        Stream::TlsIn(_) | Stream::TlsOut(_) => Some("TLS"),
        Stream::Gone => Some("no socket"),
    }
}

impl Client {
    /// A handover failed: the client stays with this process (why: in SHOW CLIENTS too).
    pub fn stay(&mut self, why: String) {
        client_event!(info, self.reg.handle, "client stays: {why}");
        self.reg.handle.set_handover(Some(format!("stays: {why}")));
        self.stays = true;
    }
}

/// A client left (Ok) or is let go (Err): logged, told why, its place given back.
pub async fn finish(mut client: Client, result: Result<(), ClientError>) {
    let cfg = client.shared.config_full();
    let id = client.reg.handle.id;
    client
        .session
        .set_pin(&client.pool, &client.reg.handle, Vec::new());
    // PgBouncer's age: since the connection came.
    let age = client
        .reg
        .handle
        .connect_time()
        .elapsed()
        .unwrap_or_default();
    // Logged before the client is told (tools read the log once the client has its error).
    if cfg.settings.log_disconnections {
        let reason = match &result {
            Ok(()) => "client close request".to_string(),
            Err(e) => e.to_string(),
        };
        client_event!(
            info,
            client.reg.handle,
            "closing because: {reason} (age={}s)",
            age.as_secs()
        );
    }
    if let Err(e) = &result {
        let h = client.reg.handle.clone();
        let told = report(
            &mut client.conn,
            e,
            (id, &h.addr, Some(&h)),
            !cfg.settings.log_disconnections,
            age,
        );
        if told {
            // Gone from the lists and counts, its statements freed, before its last words
            // are delivered (the rest of a partly moved struct would live to the end of
            // the scope).
            let Client {
                conn,
                shared,
                pool,
                session,
                reg,
                counted,
                stays,
                listening,
                seen: _,
                begun: _,
            } = client;
            drop((listening, shared, pool, session, reg, counted, stays));
            conn.close().await;
        }
    }
}

/// Startup, authentication and pool lookup: the client, its user and database, or None
/// (a cancel request, or a login that failed and was told why).
async fn enter(shared: Arc<Shared>, stream: Stream, id: u64, cfg: &Config) -> Option<Arrival> {
    let born = Instant::now();
    let peer = &stream.peer();
    tracing::debug!(client = id, addr = %peer, "new client connection");
    let mut conn = Conn::new(stream);
    let ticket = shared.pending_logins().enter(id);
    let login = async {
        let login = async {
            match config::enabled(cfg.settings.client_login_timeout) {
                Some(d) => tokio::time::timeout(d, login(&shared, &mut conn, peer, id, cfg))
                    .await
                    .unwrap_or_else(|_| {
                        Err(ClientError::fatal("08P01", "client_login_timeout".into()))
                    }),
                None => login(&shared, &mut conn, peer, id, cfg).await,
            }
        };
        tokio::select! {
            r = login => r,
            _ = ticket.dropped() => Err(ClientError::fatal(
                "53300",
                "no more connections allowed (max_client_conn): dropped while logging in, to make room".into(),
            )),
        }
    };
    let entered = login.await;
    drop(ticket);
    if let Ok(Entered::Admin(user, role, counted)) = entered {
        let reg = shared.clients().register(
            id,
            peer.to_string(),
            counted.names(),
            shared.stop_clients(),
            false,
        );
        let kill = reg.handle.clone();
        if let Some(tls) = conn.stream.tls_info() {
            reg.handle.set_tls(tls);
        }
        reg.handle.set_state(ClientState::Active);
        return Some(Arrival::Console(Box::new(Console {
            shared,
            conn,
            user,
            role,
            kill,
            reg,
            counted,
            id,
            peer: peer.to_string(),
            born,
            log: cfg.settings.log_connections,
        })));
    }
    let (user, db, pool, session, reg, counted) = match entered {
        Ok(Entered::Client(l)) => *l,
        Ok(Entered::Replication(server, _slot, _counted)) => {
            if cfg.settings.log_connections {
                tracing::info!(client = id, addr = %peer, "login (replication)");
            }
            // An immediate shutdown (SIGQUIT) ends it too: nothing else would.
            tokio::select! {
                r = replication::run(&mut conn, server) => if let Err(e) = r {
                    tracing::debug!(client = id, addr = %peer, "replication connection ended: {e}");
                },
                _ = shared.stop_clients().cancelled() => {
                    tracing::debug!(client = id, addr = %peer,
                        "replication connection closed: shutting down");
                }
            }
            return None;
        }
        Ok(Entered::Done | Entered::Admin(..)) => return None,
        Err(e) => {
            if report(
                &mut conn,
                &e,
                (id, peer, None),
                cfg.settings.log_connections,
                born.elapsed(),
            ) {
                conn.close().await;
            }
            return None;
        }
    };
    if cfg.settings.log_connections {
        // PgBouncer's words and `tls=` field; pgbadger counts sessions by them.
        let tls = conn.stream.tls_info();
        let tls = tls.as_deref().unwrap_or("no");
        tracing::info!(client = id, %db, %user, addr = %peer,
            "login attempt: db={db} user={user} tls={tls} replication=no");
    }
    Some(Arrival::Client(Box::new(Client::new(
        shared, conn, pool, session, reg, counted,
    ))))
}

/// Queue a FATAL error and log it with the connection's age; true when there is an error
/// to deliver (the caller then ends the connection with [`Conn::close`], which delivers it).
/// `handle`: the client's, once it is logged in (the line names its database and user).
fn report(
    conn: &mut Conn,
    e: &ClientError,
    (id, peer, handle): (u64, &str, Option<&registry::ClientHandle>),
    log: bool,
    age: std::time::Duration,
) -> bool {
    if let ClientError::Fatal { message, .. } | ClientError::Told(message) = e {
        if log {
            // PgBouncer's words ("closing because: no such database: x (age=0s)"); tools
            // grep them.
            let age = age.as_secs();
            match handle {
                Some(h) => client_event!(info, h, "closing because: {message} (age={age}s)"),
                None => tracing::info!(client = id, addr = %peer,
                    "closing because: {message} (age={age}s)"),
            }
        }
        if let ClientError::Fatal { code, message } = e {
            conn.queue_with(|b| backend::error_response(b, "FATAL", code, message));
        }
        true
    } else {
        match handle {
            Some(h) => client_event!(debug, h, "client connection lost: {e}"),
            None => tracing::debug!(client = id, addr = %peer, "client connection lost: {e}"),
        }
        false
    }
}

type Login = (
    String,
    String,
    Arc<Pool>,
    VirtualSession,
    Registration,
    counts::Counted,
);

/// Count a logged-in client in its database and user, or refuse it past
/// `max_db_client_connections` / `max_user_client_connections` (PgBouncer's checks and
/// messages; an admin user on the console is never refused by the database limit).
fn count_client(
    shared: &Shared,
    cfg: &Config,
    db: &str,
    user: &str,
) -> Result<counts::Counted, ClientError> {
    // Console connections count on `pgbouncer`, whichever of its names they used.
    let db = if crate::config::names::is_admin_db(db) {
        "pgbouncer"
    } else {
        db
    };
    let counts::Admitted {
        counted,
        db_count,
        user_count,
    } = shared.client_counts().enter(db, user);
    let max_db = cfg.max_db_client_connections_for(db);
    let console_admin =
        crate::config::names::is_admin_db(db) && cfg.settings.admin_users.iter().any(|u| u == user);
    if max_db > 0 && db_count > max_db && !console_admin {
        return Err(ClientError::fatal(
            "08P01",
            "client connections exceeded (max_db_client_connections)".into(),
        ));
    }
    let max_user = cfg.max_user_client_connections_for(user);
    if max_user > 0 && user_count > max_user && !console_admin {
        return Err(ClientError::fatal(
            "08P01",
            "client connections exceeded (max_user_client_connections)".into(),
        ));
    }
    Ok(counted)
}

/// Where a login led.
enum Entered {
    /// A client of a pool.
    Client(Box<Login>),
    /// A console user, logged in (and counted on database `pgbouncer`).
    Admin(String, Role, counts::Counted),
    /// A replication connection with its own server.
    Replication(
        Box<crate::server::Server>,
        crate::pool::Slot,
        counts::Counted,
    ),
    /// Nothing more to do (a cancel request).
    Done,
}

async fn login(
    shared: &Arc<Shared>,
    conn: &mut Conn,
    peer: &str,
    id: u64,
    cfg: &Config,
) -> Result<Entered, ClientError> {
    let tls = shared.tls().accept.clone();
    let (params, minor) = match startup::hello(conn, tls.as_deref()).await? {
        startup::Hello::Cancel(key, rest) => {
            // Online restart: a client still with the old process is cancelled there.
            if shared.clients().find(key).is_none() && shared.restart().forward_cancel(key, &rest) {
                return Ok(Entered::Done);
            }
            cancel::handle(shared, (key, &rest), (id, peer)).await;
            return Ok(Entered::Done);
        }
        startup::Hello::Startup(p, minor) => (p, minor),
    };
    shared.pending_logins().started(id);
    let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let user =
        get("user").ok_or_else(|| ClientError::fatal("08P01", "no user name given".into()))?;
    let db = get("database").unwrap_or_else(|| user.clone());
    let replication = get("replication").filter(|r| {
        !matches!(
            r.to_ascii_lowercase().as_str(),
            "false" | "0" | "off" | "no"
        )
    });
    if crate::config::names::is_admin_db(&db) {
        return console_login(shared, conn, cfg, &db, user).await;
    }
    // During a waiting shutdown the Unix socket stays open for the console only. (TCP
    // connections accepted now were queued before the shutdown: they are served.)
    if shared.shutting_down() && matches!(conn.stream, crate::net::Stream::Unix(_)) {
        return Err(ClientError::fatal(
            "08P01",
            "pooler is shutting down".into(),
        ));
    }
    let client_params = session_params(&params, cfg, peer)?;
    // The password first, as PostgreSQL and PgBouncer: whether a database exists is
    // nobody's business before they have logged in.
    // A physical replication connection meets only hba rules for `replication`.
    let physical = replication
        .as_deref()
        .is_some_and(|r| !r.eq_ignore_ascii_case("database"));
    let learned = startup::authenticate(shared, conn, cfg, &db, &user, physical).await?;
    let entry = cfg
        .database_entry(&db)
        .ok_or_else(|| ClientError::fatal("3D000", format!("no such database: {db}")))?;
    if shared.admin().is_disabled(&db) {
        return Err(ClientError::fatal(
            "08P01",
            format!("database \"{db}\" is disabled"),
        ));
    }
    let counted = count_client(shared, cfg, &db, &user)?;

    let server_user = entry.user.clone().unwrap_or_else(|| user.clone());
    let who = Who {
        db: &db,
        server_user: &server_user,
        entry: &entry,
    };
    let pool = pool_for(shared, cfg, who, &user, learned.clone());
    if let Some(mode) = replication {
        let (server, slot) =
            replication_server(shared, cfg, who, &params, mode, learned, &pool).await?;
        return Ok(Entered::Replication(server, slot, counted));
    }
    let server_params = first_server_params(&pool, cfg, &user).await?;
    let (session, reg, status) = open_session(
        shared,
        &pool,
        (id, peer, minor),
        counted.names(),
        client_params,
        &server_params,
    );
    welcome(conn, cfg, &status, &reg).await?;
    Ok(Entered::Client(Box::new((
        user, db, pool, session, reg, counted,
    ))))
}

/// A console login: user `pgbouncer` over the Unix socket from the OS user running
/// pgcarpool (an admin without a password, as PgBouncer), or a user of admin_users or
/// stats_users who authenticates.
async fn console_login(
    shared: &Arc<Shared>,
    conn: &mut Conn,
    cfg: &Config,
    db: &str,
    user: String,
) -> Result<Entered, ClientError> {
    if user == "pgbouncer" && conn.stream.peer_is_same_os_user() {
        let counted = count_client(shared, cfg, db, &user)?;
        return Ok(Entered::Admin(user, Role::Admin, counted));
    }
    let role = crate::shared::console::role_of(cfg, &user).ok_or_else(|| {
        ClientError::fatal(
            "28000",
            format!("not allowed to connect to the admin console: {user}"),
        )
    })?;
    startup::authenticate(shared, conn, cfg, db, &user, false).await?;
    let counted = count_client(shared, cfg, db, &user)?;
    Ok(Entered::Admin(user, role, counted))
}

/// The pool of the client's database and server user (made from the `*` entry when
/// needed), paused if its database is, and told the secret this login taught.
fn pool_for(
    shared: &Arc<Shared>,
    cfg: &Config,
    who: Who<'_>,
    user: &str,
    learned: Option<Credential>,
) -> Arc<Pool> {
    let Who {
        db,
        server_user,
        entry,
    } = who;
    let pool = shared.pools().get_or_create(db, server_user, || {
        if !cfg.databases.contains_key(db) {
            // PgBouncer's words for a database made from the `*` entry.
            tracing::info!("registered new auto-database: {db}");
        }
        crate::shared::pool_settings(
            cfg,
            entry,
            server_user,
            credential_for(cfg, entry, server_user, learned.clone()),
            shared,
        )
    });
    if shared.admin().is_paused(db) && !pool.counts().paused {
        pool.pause();
    }
    if let Some(c) = learned
        && entry.user.is_none()
    {
        if cfg.auth.users.contains_key(user) {
            pool.set_credential_if_missing(c);
        } else {
            // Found by auth_query: this login's secret is the newest PostgreSQL has.
            pool.replace_credential(c);
        }
    }
    pool
}

/// The database a client logs in to: its name, its entry, and the user its servers log
/// in as.
#[derive(Clone, Copy)]
struct Who<'a> {
    db: &'a str,
    server_user: &'a str,
    entry: &'a DatabaseEntry,
}

/// A replication connection's server of its own, logged in with the client's parameters
/// (replication, application_name, options…); not pooled, but counted in the pool's size.
async fn replication_server(
    shared: &Arc<Shared>,
    cfg: &Config,
    who: Who<'_>,
    params: &[(String, String)],
    mode: String,
    learned: Option<crate::server::Credential>,
    pool: &Arc<Pool>,
) -> Result<(Box<crate::server::Server>, crate::pool::Slot), ClientError> {
    let Who {
        db,
        server_user,
        entry,
    } = who;
    {
        let cred = credential_for(cfg, entry, server_user, learned);
        let settings = crate::shared::pool_settings(cfg, entry, server_user, cred, shared);
        let mut target = settings.target;
        target
            .startup_params
            .retain(|(k, _)| !params.iter().any(|(c, _)| c == k));
        target.startup_params.extend(
            params
                .iter()
                .filter(|(k, _)| !matches!(k.as_str(), "user" | "database" | "replication"))
                .cloned(),
        );
        target.startup_params.push(("replication".into(), mode));
        let deadline = config::enabled(settings.query_wait_timeout).map(|d| Instant::now() + d);
        let slot = pool
            .checkout_slot(deadline)
            .await
            .map_err(|e| ClientError::fatal("08P01", e.to_string()))?;
        let server_id = shared.pools().socket_ids.next();
        let connect = crate::server::connect::connect(
            &target,
            db,
            server_id,
            settings.server_connect_timeout,
        );
        let server = connect.await.map_err(|e| {
            let (code, msg) = e.client_error();
            tracing::warn!(%db, user = %server_user, "replication server login failed: {e}");
            if matches!(e, crate::server::ServerError::Rejected(_)) {
                // PgBouncer's words: the client is not told why (the log says, with the
                // server's `closing because: login failed`).
                return ClientError::fatal("08P01", "login failed".into());
            }
            ClientError::Fatal {
                code: static_code(&code),
                message: msg,
            }
        })?;
        Ok((Box::new(server), slot))
    }
}

/// New clients are told the parameters of a real server: log one in if none did yet.
async fn first_server_params(
    pool: &Arc<Pool>,
    cfg: &Config,
    user: &str,
) -> Result<Arc<Params>, ClientError> {
    Ok(match pool.server_params() {
        Some(p) => p,
        None => {
            let (deadline, timeout_text) = transaction::wait_deadline(
                Instant::now(),
                pool.settings().query_wait_timeout,
                cfg.query_timeout_for(user),
            );
            let s = pool.checkout(deadline).await.map_err(|e| match e {
                crate::pool::CheckoutError::WaitTimeout => {
                    ClientError::fatal("08P01", timeout_text.into())
                }
                crate::pool::CheckoutError::Server(se) => {
                    let (code, msg) = se.client_error();
                    ClientError::Fatal {
                        code: static_code(&code),
                        message: msg,
                    }
                }
            })?;
            let p = Arc::new(s.login_params().clone());
            drop(s);
            p
        }
    })
}

/// The client's virtual session (the server's parameters as the client asked to change
/// them), its place in the client registry (its cancel key), and the ParameterStatus
/// messages that tell it its parameters.
fn open_session(
    shared: &Arc<Shared>,
    pool: &Arc<Pool>,
    (id, peer, minor): (u64, &str, u16),
    names: (Arc<str>, Arc<str>),
    client_params: Params,
    server_params: &Params,
) -> (VirtualSession, Registration, bytes::Bytes) {
    let mut session = VirtualSession {
        startup: pool.share_startup_params(client_params),
        ..Default::default()
    };
    let (params, status) = pool.welcome(server_params, &session.startup, || {
        let mut wanted = Params::default();
        for (k, v) in server_params.iter() {
            if !crate::server::sync::is_read_only(k) && !crate::server::sync::is_server_role(k) {
                wanted.set(k, v);
            }
        }
        for (k, v) in session.startup.iter() {
            wanted.set(k, v);
        }
        let mut status = bytes::BytesMut::new();
        for (k, v) in server_params.iter() {
            backend::parameter_status(&mut status, k, wanted.get(k).unwrap_or(v));
        }
        (wanted, status.freeze())
    });
    session.params = params;
    session.pool_scope = session::pool_scope(pool);
    let reg = shared.clients().register(
        id,
        peer.to_string(),
        names,
        shared.stop_clients(),
        minor >= 2,
    );
    session.backend_pid = reg.handle.key.0;
    (session, reg, status)
}

/// AuthenticationOk, the parameters (`status`: their ParameterStatus messages), the
/// cancel key, login_notify_message and ReadyForQuery: the client is in.
async fn welcome(
    conn: &mut Conn,
    cfg: &Config,
    status: &[u8],
    reg: &Registration,
) -> Result<(), ClientError> {
    conn.queue_with(|b| {
        backend::authentication_ok(b);
        b.extend_from_slice(status);
        let (pid, secret) = reg.handle.key;
        let rest = reg.handle.key_rest();
        backend::backend_key_data_long(b, pid, secret, rest.as_ref().map_or(&[], |r| &r[..]));
        // login_notify_message: a NOTICE every client gets at login.
        if let Some(text) = &cfg.settings.login_notify_message {
            backend::error_fields(b, backend::NOTICE_RESPONSE, "NOTICE", "00000", text);
        }
        backend::ready_for_query(b, b'I');
    });
    conn.flush().await?;
    if let Some(tls) = conn.stream.tls_info() {
        reg.handle.set_tls(tls);
    }
    reg.handle.set_state(ClientState::Idle);
    Ok(())
}

/// The client's own session parameters from its startup packet.
fn session_params(
    params: &[(String, String)],
    cfg: &Config,
    peer: &str,
) -> Result<Params, ClientError> {
    let mut out = Params::default();
    let ignored = |k: &str| {
        cfg.settings
            .ignore_startup_parameters
            .iter()
            .any(|i| i.eq_ignore_ascii_case(k))
    };
    for (k, v) in params {
        match k.as_str() {
            "user" | "database" | "replication" => {}
            "options" => {
                // PgBouncer's words whatever the fault (drivers and tests match them).
                let parsed = parse_options(v).map_err(|_| {
                    ClientError::fatal(
                        "08P01",
                        "unsupported options startup parameter: only '-c config=val' and \
                         '--config=val' are allowed"
                            .into(),
                    )
                })?;
                for (k, v) in parsed {
                    if !ignored(&k) {
                        out.set(&k, &v);
                    }
                }
            }
            k if ignored(k) => {}
            k => out.set(k, v),
        }
    }
    // PostgreSQL reports the encoding by its canonical name (utf8, UTF-8, unicode: UTF8).
    if let Some(enc) = out.get("client_encoding").map(session::canonical_encoding) {
        out.set("client_encoding", &enc);
    }
    if cfg.settings.application_name_add_host {
        let app = out.get("application_name").unwrap_or("").to_string();
        out.set("application_name", &format!("{app} - {peer}"));
    }
    Ok(out)
}

/// SQLSTATEs are 5 ASCII chars; keep well-known ones static, others as generic failure.
pub(crate) fn static_code(code: &str) -> &'static str {
    const KNOWN: [&str; 8] = [
        "28P01", "28000", "3D000", "53300", "57P03", "08006", "08001", "42501",
    ];
    KNOWN
        .iter()
        .find(|k| **k == code)
        .copied()
        .unwrap_or("08006")
}

/// What every idle client keeps is kept small (issue 21: memory per idle client). These
/// budgets are the sizes at which the allocator's next size class down is reached; a
/// field added beyond them costs every idle client a size class.
#[cfg(test)]
mod idle_budget {
    use std::mem::size_of;

    #[test]
    fn a_client_and_its_handle_fit_their_size_classes() {
        // 384: `Client` was 632 bytes before the extended protocol's
        // state went into a box made on first use (`session::Extended`).
        assert!(
            size_of::<super::Client>() <= 384,
            "{}",
            size_of::<super::Client>()
        );
        assert!(size_of::<super::session::VirtualSession>() <= 136);
        // 176 + Arc's two counts = 192.
        let handle = size_of::<super::registry::ClientHandle>();
        assert!(handle <= 176, "{handle}");
    }
}
