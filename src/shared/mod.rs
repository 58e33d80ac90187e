//! The state the tasks of one pooler share (as mini-redis's `Db` wraps a private `Shared`):
//! fields private, one accessor per concern (config, TLS, pools, clients, statements,
//! console state, online restart, lifecycle tokens…), and the operations on the whole
//! (lifecycle.rs: reload, PAUSE/RESUME, shutdowns; settings.rs: a pool's settings from
//! the config). Below client/, admin/ and takeover/, which all read it; above the pools,
//! servers, peers and workers it holds.
pub mod console;
pub mod counts;
mod lifecycle;
pub mod logins;
pub mod registry;
pub mod restart;
mod settings;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Clients in a block whose BEGIN pgcarpool answered (`client::deferred::Begun`):
/// transactions in progress without a server, which SHUTDOWN WAIT_FOR_SERVERS lets finish.
/// Of the process (not a field of `Shared`): `Begun` then needs no room in a client.
static DEFERRED_BLOCKS: AtomicUsize = AtomicUsize::new(0);

/// See `DEFERRED_BLOCKS`.
pub fn deferred_blocks() -> &'static AtomicUsize {
    &DEFERRED_BLOCKS
}

use arc_swap::{ArcSwap, Guard};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::auth::cache::ScramCache;
use crate::auth::dynamic::DynamicUsers;
use crate::config::Config;
use crate::net::tls::Tls;
use crate::peers::Peers;
use crate::pool::Pools;
use crate::statements::StatementRegistry;
use crate::workers::Workers;
use console::AdminState;
use counts::ClientCounts;
use logins::PendingLogins;
use registry::Registry;
use restart::Restart;

pub use settings::{credential_for, pool_settings};

/// Everything the tasks of one pooler share, behind accessors (no field is public): each
/// part of the pooler takes the handle of its concern. No globals: many poolers can run in one process.
pub struct Shared {
    config: ArcSwap<Config>,
    pools: Arc<Pools>,
    clients: Arc<Registry>,
    scram: Arc<ScramCache>,
    /// The secrets auth_query found lately, per (database, user).
    dynamic_users: DynamicUsers,
    /// Prepared statements by key, shared by all pools.
    statements: Arc<StatementRegistry>,
    /// Cancelled to stop accepting new clients.
    stop_accepting: CancellationToken,
    /// Cancelled by SHUTDOWN WAIT_FOR_SERVERS: a client that needs a server for a new
    /// transaction (or waits for one) is let go ("server shutting down").
    stop_transactions: CancellationToken,
    /// `stop_transactions` was cancelled: read with one atomic load on every checkout (the
    /// token's own check takes a mutex).
    transactions_stopped: std::sync::atomic::AtomicBool,
    /// Cancelled to make every client leave (immediate shutdown); each client's kill token is a child.
    stop_clients: CancellationToken,
    /// Cancelled to stop background tasks (janitor).
    stop_background: CancellationToken,
    tracker: TaskTracker,
    /// The accept loops (also in `tracker`): empty once every listener is closed and
    /// the connections queued on it are accepted.
    listeners: TaskTracker,
    /// Connected client sockets (for max_client_conn).
    client_conns: AtomicUsize,
    /// The connections still logging in (the oldest is dropped when a new one finds the
    /// pooler full).
    pending_logins: PendingLogins,
    /// Clients per database and per user (console included).
    client_counts: Arc<ClientCounts>,
    /// Console state: DISABLE'd and PAUSE'd databases.
    admin: AdminState,
    /// This instance's peer id and its peers (cancel requests for their clients).
    peers: Peers,
    /// The worker runtimes (set once by `start`).
    workers: std::sync::OnceLock<Workers>,
    /// Online restart: SUSPEND, the listening sockets for SHOW FDS, the client handover.
    restart: Restart,
    /// TLS towards clients and servers, as built from the config in force.
    tls: ArcSwap<Tls>,
}

impl Shared {
    /// Fresh state for `config`: no pools, no clients, nothing running yet.
    pub fn new(config: Config) -> Arc<Shared> {
        let statements = StatementRegistry::with_max_bytes(config.settings.statement_registry_size);
        let clients = Arc::new(Registry::default());
        Arc::new(Shared {
            config: ArcSwap::from_pointee(config),
            pools: Arc::new(Pools::default()),
            restart: Restart::new(clients.clone()),
            clients,
            scram: Arc::new(ScramCache::new()),
            dynamic_users: Default::default(),
            statements: Arc::new(statements),
            stop_accepting: CancellationToken::new(),
            stop_transactions: CancellationToken::new(),
            transactions_stopped: std::sync::atomic::AtomicBool::new(false),
            stop_clients: CancellationToken::new(),
            stop_background: CancellationToken::new(),
            tracker: TaskTracker::new(),
            listeners: TaskTracker::new(),
            client_conns: AtomicUsize::new(0),
            pending_logins: Default::default(),
            client_counts: Default::default(),
            admin: AdminState::default(),
            peers: Default::default(),
            workers: std::sync::OnceLock::new(),
            tls: ArcSwap::from_pointee(Tls::default()),
        })
    }

    /// The config in force (a cheap guard: hold it only for a moment).
    pub fn config(&self) -> Guard<Arc<Config>> {
        self.config.load()
    }
    /// The config in force, to keep (a reload does not change what the holder sees).
    pub fn config_full(&self) -> Arc<Config> {
        self.config.load_full()
    }
    /// TLS towards clients and servers, as built from the config in force.
    pub fn tls(&self) -> Guard<Arc<Tls>> {
        self.tls.load()
    }
    /// TLS as built at start (a reload rebuilds it: `reload`).
    pub(crate) fn set_tls(&self, tls: Tls) {
        self.tls.store(Arc::new(tls));
    }
    /// The pools (one per database and server user).
    pub fn pools(&self) -> &Arc<Pools> {
        &self.pools
    }
    /// The connected clients by cancel key and id (SHOW CLIENTS, KILL, cancel requests).
    pub fn clients(&self) -> &Arc<Registry> {
        &self.clients
    }
    /// SCRAM keys derived so far (PBKDF2 off the reactor, memoised).
    pub fn scram(&self) -> &Arc<ScramCache> {
        &self.scram
    }
    /// The secrets auth_query found lately, per (database, user).
    pub fn dynamic_users(&self) -> &DynamicUsers {
        &self.dynamic_users
    }
    /// Prepared statements by key, shared by all pools.
    pub fn statements(&self) -> &Arc<StatementRegistry> {
        &self.statements
    }
    /// Cancelled to stop accepting new clients.
    pub fn stop_accepting(&self) -> &CancellationToken {
        &self.stop_accepting
    }
    /// Cancelled by SHUTDOWN WAIT_FOR_SERVERS: a client that needs a server for a new
    /// transaction (or waits for one) is let go.
    pub fn stop_transactions(&self) -> &CancellationToken {
        &self.stop_transactions
    }
    /// SHUTDOWN WAIT_FOR_SERVERS has begun: no new transactions.
    pub fn transactions_stopped(&self) -> bool {
        self.transactions_stopped.load(Ordering::Acquire)
    }
    /// Begin SHUTDOWN WAIT_FOR_SERVERS' drain: no new transactions, waiters let go.
    pub(crate) fn stop_transactions_now(&self) {
        self.transactions_stopped.store(true, Ordering::Release);
        self.stop_transactions.cancel();
    }
    /// Cancelled to make every client leave; each client's kill token is a child.
    pub fn stop_clients(&self) -> &CancellationToken {
        &self.stop_clients
    }
    /// Cancelled to stop background tasks (janitor, DNS, metrics).
    pub fn stop_background(&self) -> &CancellationToken {
        &self.stop_background
    }
    /// Every task of this pooler (a shutdown waits for them).
    pub fn tracker(&self) -> &TaskTracker {
        &self.tracker
    }
    /// The accept loops of the TCP listeners (also in `tracker`).
    pub fn listeners(&self) -> &TaskTracker {
        &self.listeners
    }
    /// Connected client sockets (max_client_conn counts them).
    pub fn client_conns(&self) -> usize {
        self.client_conns.load(Ordering::Relaxed)
    }
    /// The connections still logging in.
    pub fn pending_logins(&self) -> &PendingLogins {
        &self.pending_logins
    }
    /// Clients per database and per user (console included).
    pub fn client_counts(&self) -> &Arc<ClientCounts> {
        &self.client_counts
    }
    /// Console state: DISABLE'd and PAUSE'd databases, commands run.
    pub fn admin(&self) -> &AdminState {
        &self.admin
    }
    /// This instance's peer id and its peers.
    pub fn peers(&self) -> &Peers {
        &self.peers
    }
    /// The worker runtimes (None until `app::start_on` set them).
    pub fn workers(&self) -> Option<&Workers> {
        self.workers.get()
    }
    /// Set the worker runtimes, once (false: they were set already).
    pub(crate) fn set_workers(&self, workers: Workers) -> bool {
        self.workers.set(workers).is_ok()
    }
    /// Online restart: SUSPEND, the listening sockets for SHOW FDS, the client handover.
    pub fn restart(&self) -> &Restart {
        &self.restart
    }

    pub(crate) fn client_opened(&self) -> u64 {
        self.client_conns.fetch_add(1, Ordering::Relaxed);
        self.pools.socket_ids.next()
    }

    /// A client placed on worker `w` is gone.
    pub(crate) fn client_closed(&self, w: usize) {
        self.client_conns.fetch_sub(1, Ordering::Relaxed);
        if let Some(ws) = self.workers.get() {
            ws.left(w);
        }
    }
}
