//! Connected clients by cancel key and id: cancel requests, SHOW CLIENTS, KILL.
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::SystemTime;

use atomic_waker::AtomicWaker;
use tokio_util::sync::CancellationToken;

use crate::lock::Locked;
pub use crate::peers::key::KeyRest;
use crate::server::ServerAddr;

/// Where a client's cancel requests go: the server's address and BackendKeyData (the rest
/// of a protocol 3.2 secret apart).
pub type CancelTarget = (Arc<ServerAddr>, (i32, i32), Option<Arc<[u8]>>);

/// The server a client is linked to (SHOW SERVERS, SOCKETS; cancel requests).
#[derive(Clone)]
pub struct ServerLink {
    /// The server's socket id.
    pub id: u64,
    pub addr: Arc<ServerAddr>,
    /// BackendKeyData (pid, secret); the rest of a protocol 3.2 secret is kept apart
    /// (`ClientHandle::set_server_key_rest`).
    pub key: (i32, i32),
    pub created: std::time::Instant,
    /// Statements the server held when it was linked.
    pub prepared: usize,
}

/// PgBouncer's client states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ClientState {
    Login = 0,
    Idle = 1,
    Waiting = 2,
    Active = 3,
}

/// Log an event about a logged-in client, named as PgBouncer names it
/// (`C-0x…: db/user@addr`): `client_event!(info, handle, fields…, "message", args…)`.
/// Every line about a client goes through here, whichever task writes it (the client's
/// own, on whatever worker it runs now, or another's: a cancel request): the names come
/// from the client's handle, never from the line's author.
macro_rules! client_event {
    ($level:ident, $handle:expr, $($rest:tt)+) => {{
        let h: &$crate::shared::registry::ClientHandle = &$handle;
        tracing::$level!(client = h.id, db = %h.db, user = %h.user, addr = %h.addr, $($rest)+)
    }};
}
pub(crate) use client_event;

/// What others may see of, and do to, one client. Kept small (every idle client has
/// one): the user and database names are shared with every client of the same ones
/// (`counts::Counted`), and what few clients have lives in `Rare`, made when first set.
pub struct ClientHandle {
    pub id: u64,
    pub key: (i32, i32),
    pub addr: Box<str>,
    pub user: Arc<str>,
    pub db: Arc<str>,
    /// When it connected, in microseconds since the epoch (`connect_time`).
    connect_us: u64,
    /// Set to make the client leave (KILL, shutdown); its task sees it at its next wake.
    killed: AtomicBool,
    /// The client's task, as it last waited: woken by `kill` and by `wake` (an
    /// online-restart phase change). A flag and a waker instead of a cancellation token:
    /// no tree node and no registered future per client, and a poll is two atomic loads.
    waker: AtomicWaker,
    state: AtomicU8,
    /// Named statements in the client's virtual session, after its last transaction.
    prepared: std::sync::atomic::AtomicU32,
    /// The server running this client's work, for cancel requests.
    server: Mutex<Option<ServerLink>>,
    rare: Mutex<Option<Box<Rare>>>,
}

/// The kill reason of a client another one terminated (`pg_terminate_backend` of its pid):
/// PostgreSQL's words, told with its SQLSTATE 57P01.
pub const TERMINATED: &str = "terminating connection due to administrator command";

/// What only some clients have (TLS, a pin, a handover note, a kill reason, a long key).
#[derive(Default)]
struct Rare {
    /// The rest of a protocol 3.2 client's cancel secret, after `key`'s 4 bytes (None:
    /// a 4-byte secret). Here, not in the handle: a field there costs every idle client.
    key_rest: Option<KeyRest>,
    /// Why it was told to leave (KILL_CLIENT: "admin forced disconnect"); None: the
    /// database went (KILL db, shutdown).
    kill_reason: Option<&'static str>,
    /// Why the client is pinned to its server, and since when.
    pin: Option<(String, SystemTime)>,
    /// Online restart: whether it moved in, will move, or stays (SHOW CLIENTS).
    handover: Option<String>,
    /// The TLS session as SHOW CLIENTS prints it (None: plain).
    tls: Option<String>,
    /// The TLS session of the server running this client's work (SHOW SERVERS); only
    /// touched for TLS servers.
    server_tls: Option<Arc<str>>,
    /// The rest of the protocol 3.2 secret of the server running this client's work
    /// (PostgreSQL 18), for cancel requests; only touched for such servers.
    server_key_rest: Option<Arc<[u8]>>,
}

impl ClientHandle {
    fn new(
        id: u64,
        (key, key_rest): ((i32, i32), Option<KeyRest>),
        addr: String,
        (user, db): (Arc<str>, Arc<str>),
        connect_time: SystemTime,
        stop: &CancellationToken,
    ) -> Arc<ClientHandle> {
        // Registered after the shutdown began (`Registry::kill_all` walks only the clients
        // it finds): killed at once.
        let rare = key_rest.map(|key_rest| {
            Box::new(Rare {
                key_rest: Some(key_rest),
                ..Rare::default()
            })
        });
        Arc::new(ClientHandle {
            id,
            key,
            addr: addr.into_boxed_str(),
            user,
            db,
            connect_us: connect_time
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64),
            killed: AtomicBool::new(stop.is_cancelled()),
            waker: AtomicWaker::new(),
            state: AtomicU8::new(ClientState::Login as u8),
            server: Mutex::new(None),
            prepared: Default::default(),
            rare: Mutex::new(rare),
        })
    }

    /// The server the client is linked to has a long cancel secret (`rest`) or none.
    pub fn set_server_key_rest(&self, rest: Option<Arc<[u8]>>) {
        self.set_rare(rest.is_some(), |r| r.server_key_rest = rest);
    }

    /// The rest of the client's cancel secret after `key`'s 4 bytes (None: a 4-byte one).
    pub fn key_rest(&self) -> Option<KeyRest> {
        self.rare(|r| r.key_rest)
    }

    /// Whether a CancelRequest's secret, after `key`'s 4 bytes, is this client's (compared
    /// in constant time).
    pub fn is_key_rest(&self, rest: &[u8]) -> bool {
        let own = self.key_rest();
        let own = own.as_ref().map_or(&[][..], |r| &r[..]);
        own.len() == rest.len() && bool::from(subtle::ConstantTimeEq::ct_eq(own, rest))
    }

    /// Read what few clients have (None when nothing was ever set).
    fn rare<T>(&self, f: impl FnOnce(&Rare) -> Option<T>) -> Option<T> {
        self.rare.locked().as_deref().and_then(f)
    }

    /// Change what few clients have; `set` false: only if it exists (clearing needs no
    /// allocation).
    fn set_rare(&self, set: bool, f: impl FnOnce(&mut Rare)) {
        let mut g = self.rare.locked();
        match g.as_deref_mut() {
            Some(r) => f(r),
            None if set => f(g.insert(Box::default())),
            None => {}
        }
    }

    /// Make the client leave, telling it `reason` (PgBouncer's words).
    pub fn kill_with(&self, reason: &'static str) {
        self.set_rare(true, |r| r.kill_reason = Some(reason));
        self.kill();
    }

    /// Make the client leave (told `kill_reason`).
    pub fn kill(&self) {
        self.killed.store(true, Ordering::Release);
        self.waker.wake();
    }

    pub fn is_killed(&self) -> bool {
        self.killed.load(Ordering::Acquire)
    }

    /// Ready once the client is to leave; otherwise the task polling is woken when it is,
    /// or when `wake` is called. Only the client's own task polls this.
    pub fn poll_killed(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.is_killed() {
            return Poll::Ready(());
        }
        self.waker.register(cx.waker());
        // Killed between the first look and the registration: its wake may have missed.
        if self.is_killed() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// Resolves once the client is to leave.
    pub fn killed(&self) -> impl std::future::Future<Output = ()> + '_ {
        std::future::poll_fn(|cx| self.poll_killed(cx))
    }

    /// Wake the client's task so that it looks again at what it waits for (an
    /// online-restart phase change).
    pub fn wake(&self) {
        self.waker.wake();
    }

    /// What a client made to leave is told: PgBouncer's words, "database removed" for
    /// KILL of its database and for a shutdown.
    pub fn kill_reason(&self) -> &'static str {
        self.rare(|r| r.kill_reason).unwrap_or("database removed")
    }

    pub fn state(&self) -> ClientState {
        match self.state.load(Ordering::Relaxed) {
            0 => ClientState::Login,
            1 => ClientState::Idle,
            2 => ClientState::Waiting,
            _ => ClientState::Active,
        }
    }
    pub fn set_state(&self, s: ClientState) {
        self.state.store(s as u8, Ordering::Relaxed);
    }
    /// The TLS session of the server it holds, for SHOW SERVERS (None: released).
    pub fn set_server_tls(&self, tls: Option<Arc<str>>) {
        self.set_rare(tls.is_some(), |r| r.server_tls = tls);
    }
    pub fn server_tls(&self) -> Option<Arc<str>> {
        self.rare(|r| r.server_tls.clone())
    }
    /// Record the client's TLS session (once, at login).
    pub fn set_tls(&self, info: String) {
        self.set_rare(true, |r| {
            r.tls.get_or_insert(info);
        });
    }
    /// The client's TLS session, "" without TLS (SHOW CLIENTS).
    pub fn tls(&self) -> String {
        self.rare(|r| r.tls.clone()).unwrap_or_default()
    }
    pub fn set_prepared(&self, n: usize) {
        self.prepared
            .store(n.try_into().unwrap_or(u32::MAX), Ordering::Relaxed);
    }
    pub fn prepared(&self) -> usize {
        self.prepared.load(Ordering::Relaxed) as usize
    }
    /// When the client connected (SHOW CLIENTS; kept across an online restart).
    pub fn connect_time(&self) -> SystemTime {
        std::time::UNIX_EPOCH + std::time::Duration::from_micros(self.connect_us)
    }
    pub fn set_server(&self, s: Option<ServerLink>) {
        *self.server.locked() = s;
    }
    /// The server the client is linked to.
    pub fn server(&self) -> Option<ServerLink> {
        self.server.locked().clone()
    }
    pub fn set_pin(&self, reasons: Option<String>) {
        self.set_rare(reasons.is_some(), |g| match reasons {
            None => g.pin = None,
            Some(r) => {
                let since = g.pin.as_ref().map_or_else(SystemTime::now, |(_, t)| *t);
                g.pin = Some((r, since));
            }
        });
    }
    /// (reasons, since) when pinned.
    pub fn pin(&self) -> Option<(String, SystemTime)> {
        self.rare(|r| r.pin.clone())
    }
    pub fn set_handover(&self, note: Option<String>) {
        self.set_rare(note.is_some(), |r| r.handover = note);
    }
    pub fn handover(&self) -> Option<String> {
        self.rare(|r| r.handover.clone())
    }
    pub fn cancel_target(&self) -> Option<CancelTarget> {
        let rest = self.rare(|r| r.server_key_rest.clone());
        self.server().map(|s| (s.addr, s.key, rest))
    }
}

#[derive(Default)]
pub struct Registry {
    by_key: Mutex<HashMap<(i32, i32), Arc<ClientHandle>>>,
    /// The peer id new cancel keys carry (0: peering off).
    peer_id: AtomicU16,
}

/// Removes the client from the registry when dropped.
pub struct Registration {
    registry: Arc<Registry>,
    pub handle: Arc<ClientHandle>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.handle.key);
    }
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(i32, i32), Arc<ClientHandle>>> {
        self.by_key.locked()
    }

    /// The peer id new cancel keys carry (0: none).
    pub fn set_peer_id(&self, id: u16) {
        self.peer_id.store(id, Ordering::Relaxed);
    }

    /// Register a client under a fresh random cancel key (naming this instance when peered);
    /// `long`: a protocol 3.2 client, whose secret gets KEY_REST_LEN more random bytes.
    /// `stop`: the shutdown's token (`Shared::stop_clients`); a client registered after it
    /// was cancelled is killed at once (`kill_all` walks only the clients it finds).
    pub fn register(
        self: &Arc<Self>,
        id: u64,
        addr: String,
        names: (Arc<str>, Arc<str>),
        stop: &CancellationToken,
        long: bool,
    ) -> Registration {
        let rest = long.then(rand::random::<KeyRest>);
        let mut map = self.lock();
        let key = loop {
            let k = crate::peers::key::make(rand::random(), self.peer_id.load(Ordering::Relaxed));
            if !map.contains_key(&k) {
                break k;
            }
        };
        let handle = ClientHandle::new(id, (key, rest), addr, names, SystemTime::now(), stop);
        map.insert(key, handle.clone());
        Registration {
            registry: self.clone(),
            handle,
        }
    }

    /// Register a client that moved in from the process this one took over from, under
    /// the cancel key it was given there. None: a client here has that key.
    #[allow(clippy::too_many_arguments)]
    pub fn register_moved(
        self: &Arc<Self>,
        id: u64,
        (key, rest): ((i32, i32), Option<KeyRest>),
        addr: String,
        names: (Arc<str>, Arc<str>),
        stop: &CancellationToken,
        connect_time: SystemTime,
    ) -> Option<Registration> {
        let mut map = self.lock();
        if map.contains_key(&key) {
            return None;
        }
        let handle = ClientHandle::new(id, (key, rest), addr, names, connect_time, stop);
        map.insert(key, handle.clone());
        Some(Registration {
            registry: self.clone(),
            handle,
        })
    }

    /// Shutdown: every client leaves (after `Shared::stop_clients` is cancelled, so that a
    /// client registering meanwhile kills itself, see `register`).
    pub fn kill_all(&self) {
        for c in self.lock().values() {
            c.kill();
        }
    }

    /// An online-restart phase changed: every client looks again.
    pub fn wake_all(&self) {
        for c in self.lock().values() {
            c.wake();
        }
    }

    /// The client given process id `pid` in its BackendKeyData (a walk of every client:
    /// for the rare query that signals one, `pg_terminate_backend(pid)`).
    pub fn find_pid(&self, pid: i32) -> Option<Arc<ClientHandle>> {
        self.lock()
            .iter()
            .find(|(k, _)| k.0 == pid)
            .map(|(_, c)| c.clone())
    }

    /// The pids of the clients of user `user` but the one given pid `but` (a walk of every
    /// client, for the rare query that signals pids it computes).
    pub fn pids_of(&self, user: &str, but: i32) -> Vec<i32> {
        self.lock()
            .iter()
            .filter(|(k, c)| k.0 != but && *c.user == *user)
            .map(|(k, _)| k.0)
            .collect()
    }

    /// The servers at `addr` running the work of clients other than the one given pid
    /// `but`, each with the pid its client was given: (server pid, client pid). A walk of
    /// every client, for the rare query that reads a per-backend view (`pg_stat_activity`).
    pub fn server_pids(&self, addr: &ServerAddr, but: i32) -> Vec<(i32, i32)> {
        self.lock()
            .iter()
            .filter(|(k, _)| k.0 != but)
            .filter_map(|(k, c)| {
                let s = c.server.locked();
                let s = s.as_ref().filter(|s| *s.addr == *addr)?;
                Some((s.key.0, k.0))
            })
            .collect()
    }

    pub fn find(&self, key: (i32, i32)) -> Option<Arc<ClientHandle>> {
        self.lock().get(&key).cloned()
    }

    pub fn all(&self) -> Vec<Arc<ClientHandle>> {
        let mut v: Vec<_> = self.lock().values().cloned().collect();
        v.sort_by_key(|c| c.id);
        v
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
