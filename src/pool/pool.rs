//! One pool: idle servers, FIFO waiters, size limits, pause. The lock is held only for
//! quick list operations, never across `.await`.
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tokio::sync::futures::Notified;
use tokio::sync::{Notify, oneshot};

use super::login::{LoginBackoff, LoginFailure};
use super::state::{ServerCounts, ServerState};
use super::{Limit, PooledServer, Slot};
use crate::config::PoolMode;
use crate::lock::Locked;
use crate::net::conn::ConnError;
use crate::server::{Params, Server, ServerError, ServerTarget, connect, query};
use crate::stats::{PoolStats, clock};

/// Settings of one pool, resolved from the config (per user > per database > global).
#[derive(Clone)]
pub struct PoolSettings {
    pub mode: PoolMode,
    pub pool_size: usize,
    pub min_pool_size: usize,
    pub reserve_pool_size: usize,
    pub reserve_pool_timeout: Duration,
    pub max_db_connections: usize,
    pub max_user_connections: usize,
    pub server_lifetime: Duration,
    pub server_idle_timeout: Duration,
    pub server_connect_timeout: Duration,
    pub server_login_retry: Duration,
    pub server_check_delay: Duration,
    /// None = no check; Some("") = an empty query.
    pub server_check_query: Option<String>,
    pub server_reset_query: String,
    pub server_reset_query_always: bool,
    pub server_round_robin: bool,
    pub cancel_wait_timeout: Duration,
    pub query_wait_timeout: Duration,
    /// Per-server LRU bound of prepared statements; 0 = pass statements through unchanged.
    pub max_prepared_statements: usize,
    /// pin_mode = error: a session feature that cannot be shared ends the client's session.
    pub pin_error: bool,
    /// Servers kept by pinned clients that do not count against pool_size (at most).
    pub pin_pool_size: usize,
    /// server_role_check_interval (target_session_attrs other than `any`).
    pub role_check_interval: Duration,
    /// read_routing in force (transaction mode, a host list, no read-only
    /// target_session_attrs): reads may go to the standbys' pools (`pool::reads`).
    pub read_routing: bool,
    /// read_your_writes: reads only on standbys that replayed what the client saw.
    pub read_your_writes: bool,
    pub target: ServerTarget,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckoutError {
    #[error("query_wait_timeout")]
    WaitTimeout,
    #[error(transparent)]
    Server(#[from] ServerError),
}

/// How a wait in line ended (other than with an error).
enum Waited {
    /// A server handed over, checked and counted active.
    Server(Box<Server>),
    /// Room for one new connection, counted: open it.
    Open,
    /// Nothing after all (the server handed over was closed): look again.
    Again,
}

/// A server login under way. Dropped before the login ends (its client left), it gives
/// the slot back and lets another try.
struct Opening<'a>(&'a Arc<Pool>, u64);

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        let mut g = self.0.lock();
        g.login.abandoned();
        g.transit.retain(|t| t.id != self.1);
        drop(g);
        self.0.release_slot(ServerState::Login);
        self.0.login_changed.notify_waiters();
    }
}

/// What a waiter is handed.
pub(crate) enum Grant {
    /// An idle server, already counted active for the receiver.
    Server(Box<Server>),
    /// Room for one new connection (counted in `total` and the limits) for the receiver.
    Slot,
}

struct Waiter {
    id: u64,
    tx: oneshot::Sender<Grant>,
    since: Instant,
    /// The worker the waiting client runs on.
    worker: usize,
}

/// How much longer than the longest waiter a waiter of the server's own worker may have
/// waited and still be served first (keeps servers on their worker: moving one costs
/// syscalls and a cross-thread wake-up).
const WORKER_AFFINITY_SLACK: Duration = Duration::from_millis(5);

/// How far down the line a waiter of the server's worker is looked for.
const WORKER_AFFINITY_SCAN: usize = 64;

/// The waiter a server of worker `home` goes to: the first in line, unless a waiter of
/// `home` came at most WORKER_AFFINITY_SLACK after it.
fn next_waiter(waiters: &mut VecDeque<Waiter>, home: usize) -> Option<Waiter> {
    let first = waiters.front()?;
    if first.worker != home {
        let limit = first.since + WORKER_AFFINITY_SLACK;
        if let Some(i) = waiters
            .iter()
            .take(WORKER_AFFINITY_SCAN)
            .position(|w| w.worker == home && w.since <= limit)
        {
            return waiters.remove(i);
        }
    }
    waiters.pop_front()
}

impl Inner {
    /// The servers that count against the pool's size: all but the pinned ones and the
    /// spares kept for pins.
    fn counted(&self) -> usize {
        self.servers
            .total()
            .saturating_sub(self.pinned + self.spare)
    }

    /// May a client take an idle server? One within the pool's size is idle, or a spare
    /// fits in the size now (a pin made room): it becomes one of the pool's.
    fn may_take_idle(&mut self) -> bool {
        if self.idle.len() > self.spare {
            return true;
        }
        if self.spare > 0 && self.counted() < self.settings.pool_size {
            self.spare -= 1;
            return true;
        }
        false
    }
}

struct Inner {
    settings: Arc<PoolSettings>,
    idle: VecDeque<Box<Server>>,
    waiters: VecDeque<Waiter>,
    next_waiter: u64,
    /// The pool's servers by state (`Pool::change_state` alone changes them).
    servers: ServerCounts,
    /// The servers being opened, tested or reset (for SHOW SERVERS).
    transit: Vec<Transit>,
    /// Of the servers, those held by pinned clients: they do not count against pool_size
    /// (up to pin_pool_size), so pins never take the servers other clients wait for.
    pinned: usize,
    /// Of the idle servers, those kept beyond the pool's size for the next pin (a server a
    /// pin took and gave back): at most pin_pool_size with the pinned ones. A pin lets one
    /// of them into the pool's size instead of a new login (`Inner::may_take_idle`).
    spare: usize,
    paused: bool,
    /// ParameterStatus values of a freshly logged-in server: what new clients are told.
    server_params: Option<Arc<Params>>,
    /// The last session parameter set given to a new client (shared when equal).
    session_template: Option<Arc<Params>>,
    /// What the last new client was given at login, given as it is to the next one with
    /// the same startup parameters (`Pool::welcome`).
    welcome: Option<Welcome>,
    /// The same for the parameters of clients' startup packets.
    startup_template: Option<Arc<Params>>,
    /// Failed logins since the last successful one: when to try again, who waits.
    login: LoginBackoff,
    last_login_error: Option<String>,
    /// The last login errors, kept after a login succeeds.
    login_errors: super::login::RecentErrors,
    /// The server refused the pool's credentials (28xxx), and when: clients already
    /// waiting then fail with the server's error at once, as PgBouncer's kill_pool_logins
    /// (retrying cannot help them). Cleared by a successful login.
    refused: Option<(Instant, crate::proto::backend::ErrorFields)>,
    /// RECONNECT: servers created before this are closed when they come back.
    close_before: Option<Instant>,
    /// Since when the pool has had no client, server or waiter (autodb_idle_timeout,
    /// pool_idle_timeout); None while it is in use.
    unused_since: Option<Instant>,
}

/// A pool of server connections for one (database, user).
pub struct Pool {
    pub db: String,
    pub user: String,
    /// `db\0user\0`: what every statement scope of the pool's clients begins with, one
    /// copy shared by them all.
    pub scope: bytes::Bytes,
    inner: Mutex<Inner>,
    /// `Inner::settings`, stored again with it under the lock: read on every transaction
    /// (`Pool::settings`) without taking the lock.
    current: ArcSwap<PoolSettings>,
    db_limit: Arc<Limit>,
    user_limit: Arc<Limit>,
    socket_ids: Arc<super::SocketIds>,
    pub stats: PoolStats,
    /// Woken when a login fails or succeeds (or is abandoned): waiters look again at when
    /// to retry, or whether to give up.
    login_changed: Notify,
    /// Woken by RECONNECT and a changed database entry (server_fast_close).
    pub fast_close: Notify,
    /// The clients listening through the pool's shared listener connection.
    pub listener: Arc<super::listener::Listener>,
    /// read_routing: the standbys' sub-pools by host, made as reads first need them
    /// (`pool::reads`), and the turn of the next read among them.
    pub(super) reads: Mutex<Vec<Option<Arc<Pool>>>>,
    pub(super) read_turn: std::sync::atomic::AtomicUsize,
    /// Read routing's counts (SHOW HOSTS, /metrics).
    pub routing: super::reads::RoutingStats,
}

enum Step {
    Idle(Box<Server>),
    Connect,
    Wait(Ticket),
}

/// A place in the waiter queue. Dropping it removes the waiter, and hands back anything it
/// was granted but never took.
struct Ticket {
    pool: Arc<Pool>,
    id: u64,
    rx: oneshot::Receiver<Grant>,
    /// `rx` completed: the waiter has left the line (no search of it on drop).
    served: bool,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.served {
            return;
        }
        self.rx.close();
        match self.rx.try_recv() {
            Ok(Grant::Server(s)) => self.pool.checkin(s, ServerState::Active),
            Ok(Grant::Slot) => self.pool.release_slot(ServerState::Login),
            Err(_) => {
                let mut g = self.pool.lock();
                if let Some(i) = g.waiters.iter().position(|w| w.id == self.id) {
                    g.waiters.remove(i);
                }
            }
        }
    }
}

impl Pool {
    pub(crate) fn new(
        db: &str,
        user: &str,
        settings: PoolSettings,
        db_limit: Arc<Limit>,
        user_limit: Arc<Limit>,
        socket_ids: Arc<super::SocketIds>,
    ) -> Arc<Pool> {
        let settings = Arc::new(settings);
        Arc::new(Pool {
            db: db.to_string(),
            user: user.to_string(),
            current: ArcSwap::new(settings.clone()),
            scope: bytes::Bytes::from([db, "\0", user, "\0"].concat()),
            inner: Mutex::new(Inner {
                settings,
                idle: VecDeque::new(),
                waiters: VecDeque::new(),
                next_waiter: 0,
                servers: ServerCounts::default(),
                transit: Vec::new(),
                pinned: 0,
                spare: 0,
                paused: false,
                server_params: None,
                session_template: None,
                welcome: None,
                startup_template: None,
                login: LoginBackoff::default(),
                last_login_error: None,
                login_errors: Default::default(),
                refused: None,
                close_before: None,
                unused_since: None,
            }),
            db_limit,
            user_limit,
            socket_ids,
            stats: PoolStats::default(),
            login_changed: Notify::new(),
            fast_close: Notify::new(),
            listener: Arc::default(),
            reads: Mutex::default(),
            read_turn: Default::default(),
            routing: Default::default(),
        })
    }

    /// A pool of the same database and user, under the same limits, with `settings`: a
    /// read routing sub-pool.
    pub(super) fn sub_pool(&self, settings: PoolSettings) -> Arc<Pool> {
        Pool::new(
            &self.db,
            &self.user,
            settings,
            self.db_limit.clone(),
            self.user_limit.clone(),
            self.socket_ids.clone(),
        )
    }

    /// The pool's mutex. Taken at once in the usual case; a wait (another worker holds it)
    /// is counted with its length (SHOW CARPOOL `lock_waits`, `lock_wait_ns`): what would
    /// stop a many-core host from scaling (docs/performance.md "N cores").
    fn lock(&self) -> MutexGuard<'_, Inner> {
        match self.inner.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                let started = Instant::now();
                let g = self.inner.locked();
                let waited = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
                PoolStats::add(&self.stats.lock_waits, 1);
                PoolStats::add(&self.stats.lock_wait_ns, waited);
                g
            }
        }
    }

    /// Where the pool's shared listener connects (now), under a new server id.
    pub fn listener_target(&self) -> super::listener::ListenerTarget {
        let settings = self.settings();
        super::listener::ListenerTarget {
            target: settings.target.clone(),
            db: self.db.clone(),
            id: self.socket_ids.next(),
            connect_timeout: settings.server_connect_timeout,
        }
    }

    pub fn settings(&self) -> Arc<PoolSettings> {
        self.current.load_full()
    }

    /// The settings in force, for a look now (not kept across a wait): no write to the
    /// settings' shared count, which every worker's transactions would otherwise take
    /// turns at.
    pub fn settings_now(&self) -> arc_swap::Guard<Arc<PoolSettings>> {
        self.current.load()
    }

    /// New settings in force, in `g` and for [`Pool::settings`].
    fn set_settings(&self, g: &mut Inner, s: PoolSettings) {
        g.settings = Arc::new(s);
        self.current.store(g.settings.clone());
    }

    /// Reload: new sizes and timeouts take effect at once; servers beyond a smaller size are
    /// closed as they come back.
    pub fn update_settings(self: &Arc<Self>, mut s: PoolSettings) {
        let mut g = self.lock();
        // The same hosts: what is known of their roles (a fenced former primary above
        // all) carries over the reload.
        s.target.hosts = g.settings.target.hosts.carried_into(s.target.hosts);
        let target_changed = {
            let old = &g.settings.target;
            old.addr != s.target.addr
                || old.hosts != s.target.hosts
                || old.dbname != s.target.dbname
                || old.user != s.target.user
                || old.tls.as_ref().map(|t| t.fingerprint)
                    != s.target.tls.as_ref().map(|t| t.fingerprint)
        };
        self.set_settings(&mut g, s);
        if target_changed {
            // Each server closed says so (`closing because: database configuration changed`).
            tracing::debug!(db = %self.db, user = %self.user, "server target changed");
            // Failed logins were to the old target: the next client tries the new one.
            g.login = LoginBackoff::default();
            g.last_login_error = None;
            g.refused = None;
            // Servers in use now were opened for the old target: closed when they come back.
            g.close_before = Some(Instant::now());
            let closing: Vec<Box<Server>> = g.idle.drain(..).collect();
            g.spare = 0;
            for _ in &closing {
                self.change_state(&mut g, Some(ServerState::Idle), None);
            }
            drop(g);
            for s in closing {
                self.log_close(&s, "database configuration changed");
                close_server(s);
            }
            self.fast_close.notify_waiters();
        } else {
            drop(g);
        }
        self.update_reads(&self.settings());
        self.grant_waiters();
    }

    /// A client's SCRAM login taught us how to log in to the server: use it if nothing else.
    pub fn set_credential_if_missing(&self, c: crate::server::Credential) {
        let mut g = self.lock();
        if matches!(
            g.settings.target.credential,
            crate::server::Credential::None | crate::server::Credential::ScramVerifier
        ) {
            let mut s = (*g.settings).clone();
            s.target.credential = c;
            self.set_settings(&mut g, s);
        }
    }

    /// A login through auth_query taught us the user's current secret (an md5 hash, SCRAM
    /// keys from the client's proof): new server logins use it from now on.
    pub fn replace_credential(&self, c: crate::server::Credential) {
        let mut g = self.lock();
        let mut s = (*g.settings).clone();
        s.target.credential = c;
        self.set_settings(&mut g, s);
    }

    /// One shared copy of a new client's session parameters: the pool keeps the last set it
    /// handed out, and a client with the same values shares it (copy on write).
    pub fn share_session_params(&self, p: Params) -> Arc<Params> {
        share(&mut self.lock().session_template, p)
    }

    /// Likewise for the parameters of a new client's startup packet (what RESET ALL returns to).
    pub fn share_startup_params(&self, p: Params) -> Arc<Params> {
        share(&mut self.lock().startup_template, p)
    }

    /// Parameters new clients of this pool are told at login, if a server has logged in yet.
    pub fn server_params(&self) -> Option<Arc<Params>> {
        self.lock().server_params.clone()
    }

    /// A new client's session parameters and the ParameterStatus messages telling it them,
    /// which depend only on the server's parameters (`server`) and the client's startup
    /// parameters (`startup`, as `share_startup_params` shares them): `make` builds both
    /// (session parameters unshared, messages encoded), once for each new pair; the next
    /// client with the same pair is given the same (one login costs no list building).
    pub fn welcome(
        &self,
        server: &Params,
        startup: &Arc<Params>,
        make: impl FnOnce() -> (Params, bytes::Bytes),
    ) -> (Arc<Params>, bytes::Bytes) {
        if let Some(w) = &self.lock().welcome
            && w.server_version == server.version()
            && Arc::ptr_eq(&w.startup, startup)
        {
            return (w.session.clone(), w.status.clone());
        }
        let (params, status) = make();
        let mut g = self.lock();
        let session = share(&mut g.session_template, params);
        g.welcome = Some(Welcome {
            server_version: server.version(),
            startup: startup.clone(),
            session: session.clone(),
            status: status.clone(),
        });
        (session, status)
    }

    /// The servers by state, waiters and pause, for SHOW POOLS and tests.
    pub fn counts(&self) -> PoolCounts {
        let g = self.lock();
        let s = &g.settings;
        let used = match s.server_check_query {
            Some(_) => g
                .idle
                .iter()
                .filter(|srv| srv.last_used().elapsed() >= s.server_check_delay)
                .count(),
            None => 0,
        };
        PoolCounts {
            servers: g.servers,
            used,
            total: g.servers.total(),
            waiting: g.waiters.len(),
            paused: g.paused,
        }
    }

    /// THE place a server changes state: the pool's counts, and the database and user
    /// limits given back when a server goes (`to` None; they were taken by `may_open`,
    /// the one place a server comes, `from` None).
    fn change_state(&self, g: &mut Inner, from: Option<ServerState>, to: Option<ServerState>) {
        g.servers.change(from, to);
        if from.is_some() && to.is_none() {
            self.db_limit.release();
            self.user_limit.release();
        }
    }

    /// Server `s` moves from `from` to `to` outside the pool's lists: tested before a
    /// client gets it, or reset after one (SHOW SERVERS lists it meanwhile).
    pub(crate) fn set_state(&self, s: &Server, from: ServerState, to: ServerState) {
        let mut g = self.lock();
        self.change_state(&mut g, Some(from), Some(to));
        g.transit.retain(|t| t.id != s.id());
        if matches!(to, ServerState::Tested | ServerState::BeingReset) {
            g.transit.push(Transit {
                id: s.id(),
                state: to,
                // A copy, not another handle on `s.addr`: a handle counts as a cancel
                // request in flight (`guard::cancels_in_flight`), and the reset would wait
                // for it until cancel_wait_timeout.
                addr: Arc::new(crate::server::ServerAddr::clone(s.addr())),
                pid: s.key().0,
                created: s.created(),
                tls: s.tls().cloned(),
            });
        }
    }

    /// Server `s`, in state `from`, leaves the servers in transit (checked in or closed).
    fn arrived(&self, g: &mut Inner, s: &Server, from: ServerState) {
        if matches!(from, ServerState::Tested | ServerState::BeingReset) {
            g.transit.retain(|t| t.id != s.id());
        }
    }

    /// How long the pool has been unused, given whether anyone holds it (`held`: a
    /// client or a task has it): no server, no waiter, not paused, not held. The janitor
    /// frees it past autodb_idle_timeout / pool_idle_timeout.
    pub fn unused_for(&self, held: bool, now: Instant) -> Option<Duration> {
        let mut g = self.lock();
        if held || g.servers.total() > 0 || !g.waiters.is_empty() || g.paused {
            g.unused_since = None;
            return None;
        }
        Some(now.duration_since(*g.unused_since.get_or_insert(now)))
    }

    /// Get a server: an idle one, a new one, or wait in line (FIFO) until `deadline`.
    pub async fn checkout(
        self: &Arc<Self>,
        deadline: Option<Instant>,
    ) -> Result<PooledServer, CheckoutError> {
        if let Some(why) = self.login_failing() {
            return Err(ServerError::LoginFailing(why).into());
        }
        let start = Instant::now();
        let mut reserve_ok = false;
        loop {
            let opened = match self.step(reserve_ok) {
                Step::Idle(s) => match self.prepare_idle(s).await {
                    Some(s) => return Ok(PooledServer::new(s, self.clone())),
                    None => continue,
                },
                Step::Connect => self.open().await,
                Step::Wait(ticket) => {
                    match self.wait(ticket, start, deadline, &mut reserve_ok).await? {
                        Waited::Server(s) => return Ok(PooledServer::new(s, self.clone())),
                        Waited::Open => self.open().await,
                        Waited::Again => continue,
                    }
                }
            };
            match opened {
                Ok(s) => return Ok(PooledServer::new(s, self.clone())),
                // The server is briefly unavailable (restarting): back in line for the
                // next try rather than an error.
                Err(CheckoutError::Server(e)) if !self.gives_up_after(&e) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Room for a replication connection's own server (PgBouncer 1.23+): it counts against
    /// the pool's size and limits as any server. With the pool full, an idle server is
    /// closed to make room ("evicted"); with none idle, the client waits in line with the
    /// pool's other clients until `deadline`.
    pub async fn checkout_slot(
        self: &Arc<Self>,
        deadline: Option<Instant>,
    ) -> Result<Slot, CheckoutError> {
        let start = Instant::now();
        let mut reserve_ok = false;
        {
            let mut g = self.lock();
            if !g.paused && g.waiters.is_empty() && self.may_open(&mut g, false) {
                // The pool's login backoff is for its own logins: this one is not one.
                g.login.abandoned();
                self.change_state(&mut g, Some(ServerState::Login), Some(ServerState::Active));
                return Ok(Slot::new(self.clone()));
            }
        }
        loop {
            let evicted = match self.step(reserve_ok) {
                Step::Idle(s) => s,
                Step::Connect => break,
                Step::Wait(ticket) => {
                    match self.wait(ticket, start, deadline, &mut reserve_ok).await? {
                        Waited::Server(s) => s,
                        Waited::Open => break,
                        Waited::Again => continue,
                    }
                }
            };
            // PgBouncer's words; tools and tests look for them. The server's place (counted
            // active) is the replication connection's now.
            tracing::info!(server = evicted.id(), db = %self.db, user = %self.user,
                "closing because: evicted (age={}s)", evicted.created().elapsed().as_secs());
            close_server(evicted);
            return Ok(Slot::new(self.clone()));
        }
        let mut g = self.lock();
        g.login.abandoned();
        self.change_state(&mut g, Some(ServerState::Login), Some(ServerState::Active));
        drop(g);
        Ok(Slot::new(self.clone()))
    }

    /// Keep a place in line until served, timed out, or allowed to open a server itself
    /// (the reserve pool, or a login retry); give up once logins have failed for
    /// server_login_retry and the pool has no server.
    async fn wait(
        self: &Arc<Self>,
        mut ticket: Ticket,
        start: Instant,
        deadline: Option<Instant>,
        reserve_ok: &mut bool,
    ) -> Result<Waited, CheckoutError> {
        loop {
            // Created before the state is read: a login ending after the read wakes it.
            let changed = self.login_changed.notified();
            let settings = self.settings();
            let reserve_at = (!*reserve_ok && settings.reserve_pool_size > 0)
                .then(|| start + settings.reserve_pool_timeout);
            let retry_at = {
                let g = self.lock();
                if g.servers.total() == 0 && g.login.fails_waiters(settings.server_login_retry) {
                    let why = g.last_login_error.clone().unwrap_or_default();
                    return Err(ServerError::LoginFailing(why).into());
                }
                if let Some((at, f)) = &g.refused
                    && *at >= start
                {
                    return Err(ServerError::Rejected(f.clone()).into());
                }
                // A retry time already past wakes nobody: waking on it would spin.
                g.login.retry_at().filter(|t| *t > Instant::now())
            };
            let wake_at = [reserve_at, retry_at].into_iter().flatten().min();
            tokio::select! {
                g = &mut ticket.rx => {
                    ticket.served = true;
                    return Ok(match g {
                        Ok(Grant::Server(s)) => match self.prepare_idle(s).await {
                            Some(s) => Waited::Server(s),
                            None => Waited::Again,
                        },
                        Ok(Grant::Slot) => Waited::Open,
                        Err(_) => Waited::Again,
                    });
                },
                _ = sleep_until_or(wake_at, changed) => {
                    if reserve_at.is_some_and(|t| Instant::now() >= t) {
                        *reserve_ok = true;
                    }
                    if self.try_slot(*reserve_ok) {
                        // Leaving the line hands back anything granted meanwhile.
                        drop(ticket);
                        return Ok(Waited::Open);
                    }
                }
                _ = sleep_until(deadline) => return Err(CheckoutError::WaitTimeout),
            }
        }
    }

    /// Fast fail (as PgBouncer): the pool has no server at all and its last login failed in
    /// a way that makes waiting pointless (see [`LoginBackoff::fails_fast`]). The error.
    fn login_failing(&self) -> Option<String> {
        let g = self.lock();
        let fails = g.servers.total() == 0
            && g.login
                .fails_fast(Instant::now(), g.settings.server_login_retry);
        fails.then(|| g.last_login_error.clone().unwrap_or_default())
    }

    /// Whether a client whose own login failed with `e` gets the error, or waits for the
    /// next try: it waits while the server is unavailable, until logins have failed for
    /// server_login_retry.
    fn gives_up_after(&self, e: &ServerError) -> bool {
        let g = self.lock();
        !e.is_unavailable() || g.login.fails_waiters(g.settings.server_login_retry)
    }

    /// Room for one new connection for a waiter, counted if granted.
    fn try_slot(&self, reserve_ok: bool) -> bool {
        let mut g = self.lock();
        !g.paused && self.may_open(&mut g, reserve_ok)
    }

    fn step(self: &Arc<Self>, reserve_ok: bool) -> Step {
        let mut g = self.lock();
        if !g.paused {
            if let Some(s) = self.pop_idle(&mut g, None) {
                return Step::Idle(s);
            }
            if g.waiters.is_empty() && self.may_open(&mut g, reserve_ok) {
                return Step::Connect;
            }
        }
        let id = g.next_waiter;
        g.next_waiter += 1;
        let (tx, rx) = oneshot::channel();
        g.waiters.push_back(Waiter {
            id,
            tx,
            since: Instant::now(),
            worker: crate::workers::current(),
        });
        Step::Wait(Ticket {
            pool: self.clone(),
            id,
            rx,
            served: false,
        })
    }

    /// Count one more server if the pool, its database and its user have room.
    fn may_open(&self, g: &mut Inner, reserve_ok: bool) -> bool {
        if !g.login.may_try(Instant::now()) {
            return false;
        }
        let cap = g.settings.pool_size
            + if reserve_ok {
                g.settings.reserve_pool_size
            } else {
                0
            };
        let in_use = g.counted();
        if in_use >= cap {
            return false;
        }
        if !self.db_limit.try_acquire() {
            return false;
        }
        if !self.user_limit.try_acquire() {
            self.db_limit.release();
            return false;
        }
        g.login.started();
        self.change_state(g, None, Some(ServerState::Login));
        if in_use >= g.settings.pool_size {
            // PgBouncer's words (a warning there too): tools and tests look for them.
            tracing::warn!(db = %self.db, user = %self.user, "taking connection from reserve_pool");
        }
        true
    }

    /// Open a server for a slot already counted. On failure, or when dropped before the
    /// login ends (its client left), the slot is given back.
    async fn open(self: &Arc<Self>) -> Result<Box<Server>, CheckoutError> {
        let settings = self.settings();
        let id = self.socket_ids.next();
        let started = Instant::now();
        self.lock().transit.push(Transit {
            id,
            state: ServerState::Login,
            addr: Arc::new(settings.target.addr.clone()),
            pid: 0,
            created: started,
            tls: None,
        });
        let opening = Opening(self, id);
        let result = connect::connect(
            &settings.target,
            &self.db,
            id,
            settings.server_connect_timeout,
        )
        .await;
        // Ended: the slot is the server's, or given back below.
        std::mem::forget(opening);
        self.lock().transit.retain(|t| t.id != id);
        match result {
            Ok(s) => {
                // `new connection to server` is logged by connect::connect.
                PoolStats::add(&self.stats.server_logins, 1);
                let failing_since = {
                    let mut g = self.lock();
                    self.change_state(&mut g, Some(ServerState::Login), Some(ServerState::Active));
                    let since = g.login.failing_since();
                    g.login.succeeded();
                    g.last_login_error = None;
                    g.refused = None;
                    if g.server_params.is_none() {
                        g.server_params = Some(Arc::new(s.login_params().clone()));
                    }
                    since
                };
                if let Some(since) = failing_since {
                    tracing::info!(db = %self.db, user = %self.user,
                        "server login succeeded after failing for {:?}", since.elapsed());
                    self.login_changed.notify_waiters();
                    // The clients that waited get room for their own servers at once.
                    self.grant_waiters();
                }
                Ok(Box::new(s))
            }
            Err(e) => {
                let kind = if matches!(e, ServerError::NoHost(_)) {
                    LoginFailure::NoRole
                } else if e.is_unavailable() {
                    LoginFailure::Unavailable
                } else {
                    LoginFailure::Rejected
                };
                let was_failing = {
                    let mut g = self.lock();
                    let was_failing = g.login.is_failing();
                    g.login
                        .failed(kind, started, Instant::now(), settings.server_login_retry);
                    let text = e.to_string();
                    g.login_errors.record(&text, std::time::SystemTime::now());
                    g.last_login_error = Some(text);
                    if let ServerError::Rejected(f) = &e
                        && f.code.starts_with("28")
                    {
                        g.refused = Some((Instant::now(), f.clone()));
                    }
                    was_failing
                };
                // Retries while the server is unavailable are frequent: one warning.
                let addr = &settings.target.addr;
                if was_failing && kind != LoginFailure::Rejected {
                    tracing::debug!(server = id, db = %self.db, user = %self.user, %addr,
                        "server login failed: {e}");
                } else {
                    tracing::warn!(server = id, db = %self.db, user = %self.user, %addr,
                        "server login failed: {e}");
                }
                self.release_slot(ServerState::Login);
                self.login_changed.notify_waiters();
                Err(e.into())
            }
        }
    }

    /// The fast path of [`Pool::checkout`]: an idle server that needs no check query, now,
    /// without waiting, timers or allocation, the one `want` left if idle (see `pop_idle`).
    /// None: take the slow path.
    pub fn checkout_now(self: &Arc<Self>, want: Option<(u64, u64)>) -> Option<PooledServer> {
        loop {
            let s = {
                let mut g = self.lock();
                if g.paused {
                    return None;
                }
                self.pop_idle(&mut g, want)?
            };
            let settings = self.settings_now();
            match self.ready_now(s, &settings) {
                Ready::Usable(s) => return Some(PooledServer::new(s, self.clone())),
                Ready::Closed => {}
                Ready::CheckDue(s) => {
                    // The slow path runs the check; hand the server back for it.
                    {
                        let mut g = self.lock();
                        self.change_state(
                            &mut g,
                            Some(ServerState::Active),
                            Some(ServerState::Idle),
                        );
                        g.idle.push_back(s);
                    }
                    self.grant_waiters();
                    return None;
                }
            }
        }
    }

    /// The checks of an idle server that need no round trip (lifetime, liveness, moving it
    /// to this worker).
    fn ready_now(self: &Arc<Self>, mut s: Box<Server>, settings: &PoolSettings) -> Ready {
        // The client's transaction's start (`clock::recent` for the relay's timers).
        let now = clock::now();
        let expired = crate::config::enabled(settings.server_lifetime)
            .is_some_and(|l| clock::passed(now, s.created(), l));
        if !settings.target.hosts.keeps(s.host()) {
            self.close_because(s, ServerState::Active, HOST_ROLE_CHANGED);
            return Ready::Closed;
        }
        if expired || !is_alive(&mut s, now) {
            let why = if expired {
                "server lifetime over"
            } else {
                "server conn crashed?"
            };
            self.close_because(s, ServerState::Active, why);
            return Ready::Closed;
        }
        match s.rehome() {
            Ok(false) => {}
            Ok(true) => PoolStats::add(&self.stats.server_moves, 1),
            Err(e) => {
                tracing::warn!(
                    server = s.id(),
                    "could not move a server to this worker: {e}"
                );
                self.close(s, ServerState::Active);
                return Ready::Closed;
            }
        }
        if settings.server_check_query.is_some()
            && clock::passed(now, s.last_used(), settings.server_check_delay)
        {
            return Ready::CheckDue(s);
        }
        Ready::Usable(s)
    }

    /// Check an idle server before handing it out; None = it was closed.
    async fn prepare_idle(self: &Arc<Self>, s: Box<Server>) -> Option<Box<Server>> {
        let settings = self.settings();
        let mut s = match self.ready_now(s, &settings) {
            Ready::Usable(s) => return Some(s),
            Ready::Closed => return None,
            Ready::CheckDue(s) => s,
        };
        if let Some(q) = &settings.server_check_query {
            self.set_state(&s, ServerState::Active, ServerState::Tested);
            let check = query::simple_query(&mut s, q);
            match tokio::time::timeout(settings.server_connect_timeout, check).await {
                Ok(Ok(None)) if s.tx_status() == b'I' => {}
                _ => {
                    self.close_because(s, ServerState::Tested, "server check query failed");
                    return None;
                }
            }
            self.set_state(&s, ServerState::Tested, ServerState::Active);
        }
        Some(s)
    }

    /// Return a clean, idle server (now in state `from`): to the first waiter, else to the
    /// idle list (or close it when it is too old or the pool is over its size).
    pub(crate) fn checkin(self: &Arc<Self>, mut s: Box<Server>, from: ServerState) {
        // (Nobody listens on a server in the pool: notifications held for a client go.)
        let now = Instant::now();
        s.checked_in(now);
        let mut g = self.lock();
        self.arrived(&mut g, &s, from);
        // server_lifetime = 0: a server serves one client (PgBouncer's meaning).
        let too_old = match crate::config::enabled(g.settings.server_lifetime) {
            Some(l) => clock::passed(now, s.created(), l),
            None => s.served(),
        } || g.close_before.is_some_and(|t| s.created() < t);
        let counted = g.counted();
        let wrong_host =
            doubts_role(&g.settings.target.hosts, &s) || !g.settings.target.hosts.keeps(s.host());
        let over = counted > g.settings.pool_size + g.settings.reserve_pool_size;
        if !(s.is_broken() || too_old || wrong_host)
            && over
            && g.spare + g.pinned < g.settings.pin_pool_size
        {
            // Beyond the size because a pin made room for another: kept for the next pin,
            // which takes it instead of a new login.
            g.spare += 1;
            self.change_state(&mut g, Some(from), Some(ServerState::Idle));
            s.conn_mut().shrink_kept();
            g.idle.push_back(s);
            return;
        }
        if s.is_broken() || too_old || wrong_host || over {
            drop(g);
            if s.is_broken() || too_old || wrong_host {
                self.close(s, from);
            } else {
                self.close_because(s, from, "too many servers in the pool");
            }
            return;
        }
        self.change_state(&mut g, Some(from), Some(ServerState::Active));
        while !g.paused
            && let Some(w) = next_waiter(&mut g.waiters, s.home())
        {
            // The waiter is woken outside the lock: waking another worker's thread is a
            // system call, which every worker taking this lock meanwhile would wait for.
            drop(g);
            match w.tx.send(Grant::Server(s)) {
                Ok(()) => return,
                Err(Grant::Server(back)) => s = back,
                Err(Grant::Slot) => unreachable!("sent a server"),
            }
            g = self.lock();
        }
        self.change_state(&mut g, Some(ServerState::Active), Some(ServerState::Idle));
        s.conn_mut().shrink_kept();
        g.idle.push_back(s);
    }

    /// Close a server of the pool (in state `from`) and give its room to a waiter.
    pub(crate) fn close(self: &Arc<Self>, s: Box<Server>, from: ServerState) {
        let settings = self.settings();
        let hosts = &settings.target.hosts;
        if let (Some(i), true) = (s.host(), hosts.checks_roles()) {
            // A lost server, or one that said its host is shutting down or read-only:
            // that host's role is in doubt until checked again.
            let why = match s.role_doubt() {
                Some(code) if doubts_role(hosts, &s) => Some(format!(
                    "a server reported SQLSTATE {}",
                    String::from_utf8_lossy(&code)
                )),
                _ if s.is_broken() && !s.is_discarded() => {
                    Some("a server connection was lost".to_string())
                }
                _ => None,
            };
            if let Some(why) = why {
                hosts.forget(i, false, &why, &self.db);
            }
        }
        let reason = if s.is_broken() && !s.is_discarded() {
            "server conn crashed?"
        } else if doubts_role(hosts, &s) || !hosts.keeps(s.host()) {
            HOST_ROLE_CHANGED
        } else if self.lock().close_before.is_some_and(|t| s.created() < t) {
            "database configuration changed"
        } else {
            "unclean server"
        };
        self.close_because(s, from, reason);
    }

    /// [`Pool::close`] with PgBouncer's words for why (logged as `closing because: …`).
    pub(crate) fn close_because(self: &Arc<Self>, s: Box<Server>, from: ServerState, reason: &str) {
        self.arrived(&mut self.lock(), &s, from);
        self.log_close(&s, reason);
        close_server(s);
        self.release_slot(from);
    }

    /// `S-0x…: db/user@addr closing because: reason (age=Ns)` (log_disconnections).
    fn log_close(&self, s: &Server, reason: &str) {
        if crate::logging::disconnections() {
            tracing::info!(server = s.id(), db = %self.db, user = %self.user, addr = %s.addr(),
                "closing because: {reason} (age={}s)", s.created().elapsed().as_secs());
        }
    }

    /// One server (in state `from`) fewer: give the room to the first waiter if the pool
    /// may open one.
    pub(crate) fn release_slot(self: &Arc<Self>, from: ServerState) {
        self.change_state(&mut self.lock(), Some(from), None);
        self.grant_waiters();
    }

    /// Hand idle servers or new-connection room to waiters, in order (after resume, reload,
    /// a close, or a limit freed elsewhere).
    pub fn grant_waiters(self: &Arc<Self>) {
        let mut g = self.lock();
        if g.paused {
            return;
        }
        while !g.waiters.is_empty() {
            let grant = if let Some(s) = g.may_take_idle().then(|| g.idle.pop_back()).flatten() {
                self.change_state(&mut g, Some(ServerState::Idle), Some(ServerState::Active));
                Grant::Server(s)
            } else if self.may_open(&mut g, false) {
                Grant::Slot
            } else {
                break;
            };
            let mut grant = Some(grant);
            while let Some(w) = g.waiters.pop_front() {
                match w.tx.send(grant.take().expect("grant")) {
                    Ok(()) => break,
                    Err(back) => grant = Some(back),
                }
            }
            // Nobody took it: undo.
            match grant {
                Some(Grant::Server(s)) => {
                    self.change_state(&mut g, Some(ServerState::Active), Some(ServerState::Idle));
                    g.idle.push_back(s);
                }
                Some(Grant::Slot) => {
                    self.change_state(&mut g, Some(ServerState::Login), None);
                }
                None => {}
            }
        }
    }

    /// PAUSE: new checkouts wait, of the pool and its read routing sub-pools (every
    /// server of the database, as PgBouncer); the caller waits for `in_use_with_reads`.
    pub fn pause(&self) {
        self.lock().paused = true;
        self.read_pools().iter().for_each(|(_, p)| p.pause());
    }

    pub fn resume(self: &Arc<Self>) {
        self.lock().paused = false;
        self.grant_waiters();
        self.read_pools().iter().for_each(|(_, p)| p.resume());
    }

    /// PAUSE is in force (a sub-pool made meanwhile starts paused).
    pub fn is_paused(&self) -> bool {
        self.lock().paused
    }

    /// Servers out of the idle lists of the pool and its read routing sub-pools.
    pub fn in_use_with_reads(&self) -> usize {
        self.counts_with_reads().in_use()
    }

    /// Janitor work: close idle servers past server_idle_timeout / server_lifetime (down to
    /// min_pool_size for the idle timeout) or beyond the pool's size after a reload; returns how many servers should be opened to reach
    /// min_pool_size.
    pub fn maintain(self: &Arc<Self>) -> usize {
        let mut closing = Vec::new();
        let open_needed;
        {
            let mut g = self.lock();
            let s = g.settings.clone();
            let now = Instant::now();
            let mut keep = VecDeque::with_capacity(g.idle.len());
            let pinned = g.pinned;
            while let Some(mut srv) = g.idle.pop_front() {
                // Spares first: any idle server may stand for one.
                let spare = g.spare > 0;
                let too_old = crate::config::enabled(s.server_lifetime)
                    .is_some_and(|l| now.duration_since(srv.created()) >= l);
                let total = g.servers.total();
                let idle_too_long = crate::config::enabled(s.server_idle_timeout)
                    .is_some_and(|l| now.duration_since(srv.last_used()) >= l)
                    && total > s.min_pool_size;
                // After a reload to a smaller size: the longest idle go first.
                let over_size = total.saturating_sub(pinned + g.spare)
                    > s.pool_size + s.reserve_pool_size
                    || (spare && g.spare + pinned > s.pin_pool_size);
                let why = if too_old {
                    Some("server lifetime over")
                } else if idle_too_long {
                    Some("server idle timeout")
                } else if over_size {
                    Some("too many servers in the pool")
                } else if !s.target.hosts.keeps(srv.host()) {
                    Some(HOST_ROLE_CHANGED)
                } else if !is_alive(&mut srv, now) {
                    Some("server conn crashed?")
                } else {
                    None
                };
                if let Some(why) = why {
                    self.change_state(&mut g, Some(ServerState::Idle), None);
                    g.spare = g.spare.saturating_sub(1);
                    closing.push((srv, why));
                } else {
                    keep.push_back(srv);
                }
            }
            g.idle = keep;
            g.spare = g.spare.min(g.idle.len());
            let login_blocked = !g.login.may_try(now);
            open_needed = if login_blocked || g.paused {
                0
            } else {
                s.min_pool_size.saturating_sub(g.servers.total())
            };
        }
        for (s, why) in closing {
            self.log_close(&s, why);
            close_server(s);
        }
        self.grant_waiters();
        open_needed
    }

    /// The role check of the pool's hosts, when due (server_role_check_interval, or at once
    /// after a server said its host may have changed): log in to each host and ask.
    pub fn spawn_role_check(self: &Arc<Self>) {
        let settings = self.settings();
        if !settings
            .target
            .hosts
            .role_check_due(settings.role_check_interval)
        {
            return;
        }
        let db = self.db.clone();
        tokio::spawn(async move {
            let t = &settings.target;
            connect::check_roles(t, &db, settings.server_connect_timeout).await;
        });
    }

    /// Open one server into the idle list (min_pool_size).
    pub async fn warm_one(self: &Arc<Self>) {
        {
            let mut g = self.lock();
            if g.paused || !self.may_open(&mut g, false) {
                return;
            }
        }
        if let Ok(s) = self.open().await {
            self.checkin(s, ServerState::Active);
        }
    }

    /// Close every idle server (RECONNECT, shutdown).
    pub fn close_idle(self: &Arc<Self>, reason: &str) {
        let closing: Vec<Box<Server>> = {
            let mut g = self.lock();
            let v: Vec<Box<Server>> = g.idle.drain(..).collect();
            g.spare = 0;
            for _ in &v {
                self.change_state(&mut g, Some(ServerState::Idle), None);
            }
            v
        };
        for s in closing {
            self.log_close(&s, reason);
            close_server(s);
        }
    }

    /// How long the oldest waiter has waited (SHOW POOLS maxwait).
    pub fn max_wait(&self) -> Duration {
        self.lock()
            .waiters
            .front()
            .map(|w| w.since.elapsed())
            .unwrap_or_default()
    }

    /// RECONNECT: close idle servers now; servers in use are closed when they come back
    /// (with server_fast_close, session clients' servers as soon as they are idle).
    pub fn reconnect(self: &Arc<Self>) {
        self.lock().close_before = Some(Instant::now());
        self.close_idle("database configuration changed");
        self.fast_close.notify_waiters();
        self.read_pools().iter().for_each(|(_, p)| p.reconnect());
    }

    /// The server was opened before a RECONNECT or a change of its database entry.
    pub fn close_needed(&self, s: &Server) -> bool {
        self.lock().close_before.is_some_and(|t| s.created() < t)
    }

    /// WAIT_CLOSE: true once no server marked by RECONNECT is left (none in use, none idle
    /// from before the mark); clears the mark then.
    pub fn reconnect_done(&self) -> bool {
        let subs = self.read_pools();
        let mut g = self.lock();
        let Some(t) = g.close_before else { return true };
        let done = g.servers.in_use() == 0 && g.idle.iter().all(|s| s.created() >= t);
        if done {
            g.close_before = None;
        }
        drop(g);
        // Each sub-pool clears its own mark (`&` would stop at the first not done).
        subs.iter()
            .fold(done, |all, (_, p)| p.reconnect_done() & all)
    }

    /// The servers no client holds, for SHOW SERVERS: idle ("used" when due their
    /// server_check_query), then those being opened ("new"), tested or reset ("tested").
    pub fn idle_servers(&self) -> Vec<IdleServerInfo> {
        let g = self.lock();
        let check_delay = g
            .settings
            .server_check_query
            .as_ref()
            .map(|_| g.settings.server_check_delay);
        let idle = g.idle.iter().map(|s| IdleServerInfo {
            state: match check_delay {
                Some(d) if s.last_used().elapsed() >= d => "used",
                _ => "idle",
            },
            id: s.id(),
            addr: s.addr().clone(),
            pid: s.key().0,
            created: s.created(),
            last_used: Some(s.last_used()),
            prepared: s.exchange().prepared_len(),
            tls: s.tls().cloned(),
        });
        let transit = g.transit.iter().map(|t| IdleServerInfo {
            state: if t.state == ServerState::Login {
                "new"
            } else {
                "tested"
            },
            id: t.id,
            addr: t.addr.clone(),
            pid: t.pid,
            created: t.created,
            last_used: None,
            prepared: 0,
            tls: t.tls.clone(),
        });
        idle.chain(transit).collect()
    }

    /// Clients wait, no server is idle, and the pool is below its size: what stops it from
    /// opening one is a limit it shares with other pools (or a failing login).
    pub(crate) fn starved(&self) -> bool {
        let g = self.lock();
        !g.paused
            && !g.waiters.is_empty()
            && g.idle.is_empty()
            && g.counted() < g.settings.pool_size
    }

    /// A client keeps its server from now on (a pin): the server stops counting against
    /// pool_size, and a waiter may get a new one. False when pin_pool_size servers are
    /// pinned already.
    pub fn pin(self: &Arc<Self>) -> bool {
        {
            let mut g = self.lock();
            if g.pinned >= g.settings.pin_pool_size {
                return false;
            }
            g.pinned += 1;
        }
        self.grant_waiters();
        true
    }

    /// A pinned client let its server go (unpinned or gone).
    pub fn unpin(&self) {
        let mut g = self.lock();
        g.pinned = g.pinned.saturating_sub(1);
    }

    /// Whether this pool counts against the same max_db_connections / max_user_connections
    /// as `other`, and that limit is reached.
    pub(crate) fn shares_full_limit_with(&self, other: &Pool) -> bool {
        (Arc::ptr_eq(&self.db_limit, &other.db_limit) && self.db_limit.is_full())
            || (Arc::ptr_eq(&self.user_limit, &other.user_limit) && self.user_limit.is_full())
    }

    /// Close the longest-idle server to make room under a shared limit; false if none is idle.
    pub(crate) fn evict_idle(self: &Arc<Self>) -> bool {
        let s = {
            let mut g = self.lock();
            let Some(s) = g.idle.pop_front() else {
                return false;
            };
            g.spare = g.spare.saturating_sub(1);
            self.change_state(&mut g, Some(ServerState::Idle), None);
            s
        };
        self.log_close(&s, "evicted to make room for another pool");
        close_server(s);
        true
    }

    pub fn last_login_error(&self) -> Option<String> {
        self.lock().last_login_error.clone()
    }

    /// The last login errors, oldest first (kept after a login succeeds).
    pub fn recent_login_errors(&self) -> Vec<super::login::RecentError> {
        self.lock().login_errors.list()
    }

    /// An idle server taken for a client, counted active: of the most recently used ones,
    /// the one `want` (a client's id and params version, `Server::affinity`) would find as
    /// it left it (`preferred`), else the most recently used one of this worker, else the
    /// most recently used one (the oldest with server_round_robin). A client that holds
    /// many settings keeps its server, and others keep theirs.
    fn pop_idle(&self, g: &mut Inner, want: Option<(u64, u64)>) -> Option<Box<Server>> {
        if !g.may_take_idle() {
            return None;
        }
        let s = if g.settings.server_round_robin {
            g.idle.pop_front()
        } else {
            let here = crate::workers::current();
            match want {
                Some(want) => preferred(&g.idle, here, want).and_then(|i| g.idle.remove(i)),
                None => match g.idle.iter().rposition(|s| s.home() == here) {
                    Some(i) => g.idle.remove(i),
                    None => g.idle.pop_back(),
                },
            }
        }?;
        self.change_state(g, Some(ServerState::Idle), Some(ServerState::Active));
        Some(s)
    }
}

/// Most idle servers `pop_idle` looks at for a client's own.
const AFFINITY_SCAN: usize = 32;

/// Which of the most recently used idle servers to give a client (`want`: its id and params
/// version): the one it left as it was, then one on this worker (`here`), then the most
/// recent.
fn preferred(idle: &VecDeque<Box<Server>>, here: usize, want: (u64, u64)) -> Option<usize> {
    let mut best: Option<(u8, usize)> = None;
    for (i, s) in idle.iter().enumerate().rev().take(AFFINITY_SCAN) {
        let score = s.affinity(want.0, want.1) * 2 + u8::from(s.home() == here);
        if best.is_none_or(|(b, _)| score > b) {
            best = Some((score, i));
        }
        if score == 5 {
            break;
        }
    }
    best.map(|(_, i)| i)
}

/// The template if it equals `p`, else `p` as the new template.
fn share(template: &mut Option<Arc<Params>>, p: Params) -> Arc<Params> {
    match template {
        Some(t) if **t == p => t.clone(),
        _ => {
            let t = Arc::new(p);
            *template = Some(t.clone());
            t
        }
    }
}

/// What a new client was given at login (`Pool::welcome`), for the server parameters of
/// version `server_version` and the startup parameters `startup` (held: the pointer
/// names them).
struct Welcome {
    server_version: u64,
    startup: Arc<Params>,
    session: Arc<Params>,
    status: bytes::Bytes,
}

/// What the checks of an idle server found.
enum Ready {
    Usable(Box<Server>),
    /// It was closed (too old, broken, or could not move).
    Closed,
    /// server_check_query is due first.
    CheckDue(Box<Server>),
}

/// A server in no list of the pool and in no client's hands.
struct Transit {
    id: u64,
    state: ServerState,
    addr: Arc<crate::server::ServerAddr>,
    pid: i32,
    created: Instant,
    /// Its TLS session ("" while it logs in).
    tls: Option<Arc<str>>,
}

/// What SHOW SERVERS shows of a server no client holds.
pub struct IdleServerInfo {
    /// PgBouncer's name of its state: idle, used, new (being opened), tested.
    pub state: &'static str,
    pub id: u64,
    pub addr: Arc<crate::server::ServerAddr>,
    pub pid: i32,
    pub created: Instant,
    pub last_used: Option<Instant>,
    /// Statements it holds.
    pub prepared: usize,
    pub tls: Option<Arc<str>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolCounts {
    /// The servers by state.
    pub servers: ServerCounts,
    /// Of the idle servers, those due their server_check_query (PgBouncer's "used").
    pub used: usize,
    pub total: usize,
    pub waiting: usize,
    pub paused: bool,
}

impl PoolCounts {
    pub fn get(&self, s: ServerState) -> usize {
        self.servers.get(s)
    }

    /// Servers out of the idle list: linked to a client, or being opened, tested or reset.
    pub fn in_use(&self) -> usize {
        self.servers.in_use()
    }
}

async fn sleep_until(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

/// Until `t` (never if None) or until `changed` fires.
async fn sleep_until_or(t: Option<Instant>, changed: Notified<'_>) {
    tokio::select! {
        _ = sleep_until(t) => {}
        _ = changed => {}
    }
}

/// Why a server of a host that no longer has the pool's target_session_attrs role is
/// closed (log: `closing because: …`).
const HOST_ROLE_CHANGED: &str = "host role changed (target_session_attrs)";

/// The server reported an error that puts its host's role in doubt for this pool (a
/// read-only refusal matters only to a pool that wants a primary).
fn doubts_role(hosts: &crate::server::HostList, s: &Server) -> bool {
    hosts.checks_roles()
        && s.role_doubt()
            .is_some_and(|c| &c != b"25006" || hosts.attrs.wants_primary())
}

/// How long a server must have been idle before a checkout asks the kernel (one
/// `recv(MSG_PEEK)`) whether it has something to say; below, the reactor's readiness alone
/// decides (issue 21: that system call was a fifth per transaction under load).
const ASK_KERNEL_AFTER: Duration = Duration::from_millis(1);

/// An idle server must have nothing to say: any byte or EOF means it is gone or broken
/// (a FATAL from `pg_terminate_backend`, a restart). The reactor's readiness is looked at
/// first (no system call unless it saw the socket readable). It learns of bytes that came
/// since this worker last polled epoll only later, so a server idle for
/// [`ASK_KERNEL_AFTER`] or longer at `now` is asked of the kernel too. One idle for less
/// was in use a moment ago: a FATAL arriving in that gap is the same race as one arriving
/// just after checkout, which `Relay::first_reply` answers for simple queries.
fn is_alive(s: &mut Server, now: Instant) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    match s.conn_mut().poll_read_more(&mut cx) {
        Poll::Pending => {
            s.conn().rbuf.is_empty()
                && (!clock::passed(now, s.last_used(), ASK_KERNEL_AFTER)
                    || !s.conn_mut().stream.input_waiting())
        }
        Poll::Ready(_) => false,
    }
}

/// Close a server politely (Terminate), without waiting.
fn close_server(mut s: Box<Server>) {
    tracing::debug!(server = s.id(), addr = %s.addr(), "closing server connection");
    s.conn_mut().queue_with(crate::proto::frontend::terminate);
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(1), s.conn_mut().flush()).await;
        });
    }
}

impl From<ConnError> for CheckoutError {
    fn from(e: ConnError) -> Self {
        CheckoutError::Server(ServerError::Conn(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(id: u64, worker: usize, since: Instant) -> Waiter {
        Waiter {
            id,
            tx: oneshot::channel().0,
            since,
            worker,
        }
    }

    /// Settings for a pool of `pool_size` whose server is at 127.0.0.1:`port`.
    fn settings(port: u16, pool_size: usize) -> PoolSettings {
        let secs = Duration::from_secs;
        PoolSettings {
            mode: PoolMode::Transaction,
            pool_size,
            min_pool_size: 0,
            reserve_pool_size: 0,
            reserve_pool_timeout: secs(5),
            max_db_connections: 0,
            max_user_connections: 0,
            server_lifetime: secs(3600),
            server_idle_timeout: secs(600),
            server_connect_timeout: secs(15),
            server_login_retry: secs(15),
            server_check_delay: secs(30),
            server_check_query: None,
            server_reset_query: String::new(),
            server_reset_query_always: false,
            server_round_robin: false,
            cancel_wait_timeout: secs(10),
            query_wait_timeout: secs(120),
            max_prepared_statements: 0,
            pin_error: false,
            pin_pool_size: 0,
            role_check_interval: Duration::ZERO,
            read_routing: false,
            read_your_writes: true,
            target: ServerTarget {
                addr: crate::server::ServerAddr::Tcp {
                    host: "127.0.0.1".into(),
                    port,
                },
                hosts: Default::default(),
                dbname: "db".into(),
                user: "user".into(),
                credential: Default::default(),
                startup_params: Vec::new(),
                connect_query: None,
                scram_cache: None,
                tls: None,
                tcp: Default::default(),
                dns_nxdomain_ttl: Duration::from_secs(15),
            },
        }
    }

    #[tokio::test]
    async fn a_client_leaving_during_a_server_login_gives_its_slot_back() {
        // Accepts connections (the kernel does) and never answers: the login hangs.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = silent.local_addr().unwrap().port();
        let db_limit = Arc::new(Limit::default());
        let pool = Pool::new(
            "db",
            "user",
            settings(port, 1),
            db_limit.clone(),
            Arc::new(Limit::default()),
            Arc::default(),
        );
        let p = pool.clone();
        let client = tokio::spawn(async move { p.checkout(None).await.map(|_| ()) });
        // The login is under way once the pool counts its server.
        let until = Instant::now() + Duration::from_secs(5);
        while pool.counts().total == 0 {
            assert!(Instant::now() < until, "no login started");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(db_limit.count(), 1);
        // Counted as a login, not as a server a client has.
        let c = pool.counts();
        assert_eq!(
            (c.get(ServerState::Login), c.get(ServerState::Active)),
            (1, 0)
        );
        client.abort();
        assert!(client.await.unwrap_err().is_cancelled());
        assert_eq!(pool.counts().total, 0);
        assert_eq!(pool.counts().in_use(), 0);
        assert_eq!(db_limit.count(), 0);
        drop(silent);
    }

    /// Issue 21: the kernel is asked (a system call) only for a server idle for
    /// `ASK_KERNEL_AFTER` or longer; a FATAL the reactor has seen is found without it.
    #[tokio::test]
    async fn an_idle_server_with_something_to_say_is_not_alive() {
        use tokio::io::AsyncWriteExt;
        let (mut s, mut peer) = crate::server::test_server();
        let used = s.last_used();
        assert!(is_alive(&mut s, used + ASK_KERNEL_AFTER));
        peer.write_all(b"E").await.unwrap();
        // Idle long enough: the byte waiting in the kernel is found whatever the reactor saw.
        assert!(!is_alive(&mut s, used + ASK_KERNEL_AFTER));
        // Once the reactor has seen the socket readable, at any age. (The byte is still
        // in the kernel: peeked at, or read already if the reactor saw it in time.)
        if s.conn().rbuf.is_empty() {
            s.conn().stream.readable().await.unwrap();
        }
        assert!(!is_alive(&mut s, used));
        // EOF too.
        let (mut s, peer) = crate::server::test_server();
        drop(peer);
        let used = s.last_used();
        assert!(!is_alive(&mut s, used + ASK_KERNEL_AFTER));
    }

    /// `Pool::settings` (read without the lock) follows a reload at once.
    #[test]
    fn the_settings_read_without_the_lock_follow_a_reload() {
        let pool = Pool::new(
            "db",
            "user",
            settings(1, 1),
            Arc::default(),
            Arc::default(),
            Arc::default(),
        );
        assert_eq!(pool.settings().pool_size, 1);
        pool.update_settings(settings(1, 7));
        assert_eq!(pool.settings().pool_size, 7);
        assert_eq!(pool.lock().settings.pool_size, 7);
    }

    /// The pool's mutex taken while another thread holds it counts as a wait (SHOW CARPOOL
    /// `lock_waits`, `lock_wait_ns`); taken free, it counts nothing.
    #[test]
    fn a_contended_pool_lock_is_counted() {
        let pool = Pool::new(
            "db",
            "user",
            settings(1, 1),
            Arc::default(),
            Arc::default(),
            Arc::default(),
        );
        drop(pool.lock());
        assert_eq!(PoolStats::get(&pool.stats.lock_waits), 0);
        let held = pool.inner.lock().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let p = pool.clone();
        let waiter = std::thread::spawn(move || {
            tx.send(nix::unistd::gettid()).unwrap();
            drop(p.lock());
        });
        // Released once the other thread sleeps (on the lock: it does nothing else).
        let stat = format!("/proc/self/task/{}/stat", rx.recv().unwrap());
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let st = std::fs::read_to_string(&stat).unwrap();
            let state = st.rsplit_once(") ").map(|(_, rest)| &rest[..1]);
            if state == Some("S") {
                break;
            }
            assert!(
                Instant::now() < until,
                "the other thread never waited: {st}"
            );
            std::thread::yield_now();
        }
        drop(held);
        waiter.join().unwrap();
        assert_eq!(PoolStats::get(&pool.stats.lock_waits), 1);
        assert!(PoolStats::get(&pool.stats.lock_wait_ns) > 0);
    }

    #[test]
    fn a_server_goes_to_a_waiter_of_its_worker_unless_that_is_unfair() {
        let t = Instant::now();
        let ms = Duration::from_millis;
        let mut line: VecDeque<Waiter> = [
            waiter(1, 0, t),
            waiter(2, 0, t + ms(1)),
            waiter(3, 1, t + ms(2)),
            waiter(4, 1, t + ms(60)),
        ]
        .into();
        // Worker 1's first waiter came 2 ms after the first in line: it goes first.
        assert_eq!(next_waiter(&mut line, 1).unwrap().id, 3);
        // Worker 1's next one came 60 ms after: the first in line is served.
        assert_eq!(next_waiter(&mut line, 1).unwrap().id, 1);
        // A server of the first in line's worker: plain FIFO.
        assert_eq!(next_waiter(&mut line, 0).unwrap().id, 2);
        assert_eq!(next_waiter(&mut line, 0).unwrap().id, 4);
        assert!(next_waiter(&mut line, 0).is_none());
    }
}
