//! Server connections: what one PostgreSQL backend connection is and knows.
pub mod connect;
pub mod exchange;
pub mod prepared;
pub mod query;
pub mod response;
pub mod roles;
pub mod sync;

use std::time::Instant;

use crate::net::Conn;
use crate::proto::backend::ErrorFields;

pub use connect::{Credential, HostList, ServerAddr, ServerTarget};
pub use exchange::{Exchange, Reply};

/// Session parameters as an ordered list with case-insensitive names (GUC names are),
/// indexed by name once long (a client may hold thousands of custom settings), and stamped
/// with a version that names its content: every change takes a new one, a clone keeps it,
/// so two lists with the same version hold the same values (`sync::differs` skips them).
#[derive(Debug, Clone, Default)]
pub struct Params {
    items: Vec<(String, String)>,
    /// Lower-cased name → position in `items`, once `items` is longer than `INDEX_FROM`.
    /// Boxed: most lists never have one, and a bare map would make each list 48 bytes longer.
    #[allow(clippy::box_collection)]
    index: Option<Box<std::collections::HashMap<String, usize>>>,
    /// 0: empty as made; else from `next_version`.
    version: u64,
}

/// Lists shorter than this are searched in order (the usual dozen of a driver's settings).
const INDEX_FROM: usize = 32;

/// A version no list has had (process-wide, only ever increasing).
fn next_version() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl PartialEq for Params {
    fn eq(&self, other: &Self) -> bool {
        self.version == other.version || self.items == other.items
    }
}
impl Eq for Params {}

impl Params {
    fn position(&self, name: &str) -> Option<usize> {
        match &self.index {
            Some(index) => {
                // GUC names are short (NAMEDATALEN): lower-cased on the stack.
                let mut buf = [0u8; 64];
                match buf.get_mut(..name.len()) {
                    Some(folded) => {
                        folded.copy_from_slice(name.as_bytes());
                        folded.make_ascii_lowercase();
                        let folded = std::str::from_utf8(folded).ok()?;
                        index.get(folded).copied()
                    }
                    None => index.get(&name.to_ascii_lowercase()).copied(),
                }
            }
            None => self
                .items
                .iter()
                .position(|(k, _)| k.eq_ignore_ascii_case(name)),
        }
    }
    fn reindex(&mut self) {
        self.index = (self.items.len() > INDEX_FROM).then(|| {
            let items = self.items.iter().enumerate();
            Box::new(
                items
                    .map(|(i, (k, _))| (k.to_ascii_lowercase(), i))
                    .collect(),
            )
        });
    }
    pub fn get(&self, name: &str) -> Option<&str> {
        self.position(name).map(|i| self.items[i].1.as_str())
    }
    pub fn set(&mut self, name: &str, value: &str) {
        match self.position(name) {
            Some(i) => {
                let v = &mut self.items[i].1;
                if v != value {
                    v.clear();
                    v.push_str(value);
                    self.version = next_version();
                }
            }
            None => {
                self.items.push((name.to_string(), value.to_string()));
                match &mut self.index {
                    Some(index) => {
                        index.insert(name.to_ascii_lowercase(), self.items.len() - 1);
                    }
                    None => self.reindex(),
                }
                self.version = next_version();
            }
        }
    }
    pub fn remove(&mut self, name: &str) {
        self.remove_all(&[name]);
    }
    /// Remove each of `names` (one pass over the list, however many).
    pub fn remove_all<S: AsRef<str>>(&mut self, names: &[S]) {
        let len = self.items.len();
        if names.len() < 4 {
            let gone = |k: &str| names.iter().any(|n| n.as_ref().eq_ignore_ascii_case(k));
            self.items.retain(|(k, _)| !gone(k));
        } else {
            let names: std::collections::HashSet<String> = names
                .iter()
                .map(|n| n.as_ref().to_ascii_lowercase())
                .collect();
            self.items
                .retain(|(k, _)| !names.contains(&k.to_ascii_lowercase()));
        }
        if self.items.len() != len {
            self.reindex();
            self.version = next_version();
        }
    }
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.items.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
    pub fn len(&self) -> usize {
        self.items.len()
    }
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
    /// Names this content: equal versions, equal lists (see the type).
    pub fn version(&self) -> u64 {
        self.version
    }
}

/// One logged-in server connection.
pub struct Server {
    id: u64,
    conn: Conn,
    /// One per server: cancel requests in flight hold clones (the pool waits for them to
    /// finish before the server is reused, see `pool::guard`).
    addr: std::sync::Arc<ServerAddr>,
    /// BackendKeyData (pid, secret) for cancel requests.
    key: (i32, i32),
    /// The rest of a protocol 3.2 secret (PostgreSQL 18), after `key`'s 4 bytes.
    pub(crate) key_rest: Option<std::sync::Arc<[u8]>>,
    /// Current values of the session parameters we know of.
    params: Params,
    /// Values right after login (what RESET ALL/DISCARD ALL return to).
    login_params: Params,
    /// What it owes for what was sent to it, and what it holds (`exchange`).
    exchange: Exchange,
    created: Instant,
    last_used: Instant,
    /// A client has run work on it (not only a login that read its parameters):
    /// `server_lifetime = 0` closes it when it comes back.
    served: bool,
    /// Set when the server's state is unknown: it must be closed, not reused.
    broken: bool,
    /// Broken on purpose, its host not in doubt: a standby's refusal of a read (25006)
    /// kept from the client, whose request runs on the primary instead.
    discarded: bool,
    /// The worker whose runtime drives the socket (see `crate::workers`).
    home: usize,
    /// NotificationResponses that came while pgcarpool ran its own queries: they belong to
    /// the client holding the server (`take_notifications`).
    notifications: bytes::BytesMut,
    /// The TLS session as SHOW SERVERS prints it (None: plain).
    tls: Option<std::sync::Arc<str>>,
    /// Which host of the target's host list it is on (None: no list).
    host: Option<usize>,
    /// It reported what may mean its host is no longer what it was (25006 read-only
    /// transaction, 57P01/57P02 shutdown): the SQLSTATE. The server is closed and the
    /// host's role checked again.
    role_doubt: Option<[u8; 5]>,
    /// The versions of (a client's wanted params, `params`, `login_params`) last found to
    /// need nothing applied (`sync::differs`).
    fitted: Option<(u64, u64, u64)>,
    /// The client that last checked it out (0: none), which finds it again first.
    last_client: u64,
}

impl Server {
    /// A logged-in server, idle, with its login parameters and BackendKeyData.
    pub fn new(id: u64, conn: Conn, addr: ServerAddr, key: (i32, i32), params: Params) -> Self {
        let now = Instant::now();
        Server {
            id,
            conn,
            addr: std::sync::Arc::new(addr),
            key,
            key_rest: None,
            login_params: params.clone(),
            params,
            exchange: Exchange::new(),
            created: now,
            last_used: now,
            served: false,
            broken: false,
            discarded: false,
            home: crate::workers::current(),
            notifications: bytes::BytesMut::new(),
            tls: None,
            host: None,
            role_doubt: None,
            fitted: None,
            last_client: 0,
        }
    }

    /// Notifications held for the client (see `notifications`), those this server's own
    /// session sent carrying the client's `pid` as PostgreSQL's would.
    pub fn take_notifications(&mut self, pid: i32) -> Option<bytes::Bytes> {
        if self.notifications.is_empty() {
            return None;
        }
        let mut buf = std::mem::take(&mut self.notifications);
        let mut at = 0;
        while let Ok(Some(h)) = crate::proto::header(&buf[at..], crate::proto::MAX_MESSAGE_LEN) {
            if buf.len() - at < h.total {
                break;
            }
            rewrite_notification_pid(&mut buf[at..at + h.total], self.key.0, pid);
            at += h.total;
        }
        Some(buf.freeze())
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// The socket, for the relay and the pool's own I/O.
    pub fn conn(&self) -> &Conn {
        &self.conn
    }

    pub fn conn_mut(&mut self) -> &mut Conn {
        &mut self.conn
    }

    /// Its address (cancel requests in flight hold clones, see `pool::guard`).
    pub fn addr(&self) -> &std::sync::Arc<ServerAddr> {
        &self.addr
    }

    /// BackendKeyData (pid, secret) for cancel requests.
    pub fn key(&self) -> (i32, i32) {
        self.key
    }

    /// The rest of the server's protocol 3.2 secret (None: a 4-byte one).
    pub fn key_rest(&self) -> Option<&std::sync::Arc<[u8]>> {
        self.key_rest.as_ref()
    }

    pub fn created(&self) -> Instant {
        self.created
    }

    pub fn last_used(&self) -> Instant {
        self.last_used
    }

    /// It went back to the pool at `t`: notifications held for its client go (nobody
    /// listens on a server in the pool).
    pub fn checked_in(&mut self, t: Instant) {
        self.last_used = t;
        self.notifications.clear();
    }

    /// A client has run work on it (not only a login that read its parameters).
    pub fn served(&self) -> bool {
        self.served
    }

    /// Its state is unknown: it must be closed, not reused.
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// The worker whose runtime drives the socket.
    pub fn home(&self) -> usize {
        self.home
    }

    /// The TLS session as SHOW SERVERS prints it (None: plain).
    pub fn tls(&self) -> Option<&std::sync::Arc<str>> {
        self.tls.as_ref()
    }

    pub fn set_tls(&mut self, tls: Option<std::sync::Arc<str>>) {
        self.tls = tls;
    }

    /// Which host of the target's host list it is on (None: no list).
    pub fn host(&self) -> Option<usize> {
        self.host
    }

    pub fn set_host(&mut self, host: Option<usize>) {
        self.host = host;
    }

    /// The SQLSTATE of an error that may mean its host is no longer what it was.
    pub fn role_doubt(&self) -> Option<[u8; 5]> {
        self.role_doubt
    }

    /// It reported an error that may mean its host is no longer what it was (25006,
    /// 57P01, 57P02): it is closed and the host's role checked again.
    pub fn note_role_doubt(&mut self, code: [u8; 5]) {
        self.role_doubt = Some(code);
    }

    /// Its state is unknown: it must be closed, not reused.
    pub fn mark_broken(&mut self) {
        self.broken = true;
    }

    /// Closed, not reused, though nothing is wrong with its host: a standby's refusal
    /// (25006) was kept from the client and the request goes to the primary. Its host's
    /// role stays known (a lost server puts it in doubt).
    pub fn discard(&mut self) {
        self.broken = true;
        self.discarded = true;
    }

    /// See [`Server::discard`].
    pub fn is_discarded(&self) -> bool {
        self.discarded
    }

    /// A client has run work on it (`server_lifetime = 0` closes it when it comes back).
    pub fn mark_served(&mut self) {
        self.served = true;
    }

    /// Current values of the session parameters known.
    pub fn parameters(&self) -> &Params {
        &self.params
    }

    /// Values right after login (what RESET ALL/DISCARD ALL return to).
    pub fn login_params(&self) -> &Params {
        &self.login_params
    }

    /// A parameter's value as read back from the server (None: it has none).
    pub fn set_param(&mut self, name: &str, value: Option<&str>) {
        match value {
            Some(v) => self.params.set(name, v),
            None => self.params.remove(name),
        }
    }

    /// The parameters are back to their login values (DISCARD ALL, RESET ALL).
    pub fn reset_params(&mut self) {
        self.params = self.login_params.clone();
    }

    /// Whether `client` (its id, the version of its params) would find this server as it
    /// left it: 2 it was the last to use it, 1 its params were applied here and nothing
    /// changed since, 0 neither.
    pub fn affinity(&self, client: u64, params: u64) -> u8 {
        if client != 0 && self.last_client == client {
            2
        } else if self
            .fitted
            .is_some_and(|f| f == (params, self.params.version, self.login_params.version))
        {
            1
        } else {
            0
        }
    }

    /// Whether `wanted` was found to need nothing applied here, and neither list changed
    /// since (see `sync::differs`).
    pub fn fitted_to(&self, wanted: &Params) -> bool {
        self.fitted == Some(self.versions(wanted))
    }

    /// `wanted` needs nothing applied here: known by comparing, or by making the same
    /// changes to both lists since `fitted_to` was last true.
    pub fn mark_fitted(&mut self, wanted: &Params) {
        self.fitted = Some(self.versions(wanted));
    }

    fn versions(&self, wanted: &Params) -> (u64, u64, u64) {
        (
            wanted.version,
            self.params.version,
            self.login_params.version,
        )
    }

    /// Checked out by `client` (its id): see `affinity`.
    pub fn set_last_client(&mut self, client: u64) {
        self.last_client = client;
    }

    /// Make the current worker drive this server's socket; true if it moved.
    pub fn rehome(&mut self) -> std::io::Result<bool> {
        let here = crate::workers::current();
        if self.home == here {
            return Ok(false);
        }
        self.conn.stream.rehome()?;
        self.home = here;
        Ok(true)
    }
}

/// A logged-in server over one end of a socket pair (the other end is returned too), for
/// unit tests of what it queues. Call inside a tokio runtime.
#[cfg(test)]
pub fn test_server() -> (Server, tokio::net::UnixStream) {
    let (a, b) = tokio::net::UnixStream::pair().expect("socket pair");
    let conn = Conn::new(crate::net::Stream::Unix(a));
    let addr = ServerAddr::Unix("/nonexistent/.s.PGSQL.5432".into());
    (Server::new(1, conn, addr, (1, 2), Params::default()), b)
}

/// Most bytes of notifications held for a client while pgcarpool runs its own queries.
pub const MAX_HELD_NOTIFICATIONS: usize = 8 * 1024 * 1024;

/// In a whole NotificationResponse message: a notification sent by the server's own
/// session (`server_pid`) carries the pid the client was given instead.
pub fn rewrite_notification_pid(msg: &mut [u8], server_pid: i32, client_pid: i32) {
    if msg.len() >= 9 && msg[5..9] == server_pid.to_be_bytes() {
        msg[5..9].copy_from_slice(&client_pid.to_be_bytes());
    }
}

/// Errors talking to a server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("server connection failed: {0}")]
    Connect(std::io::Error),
    #[error("server connection timed out")]
    Timeout,
    #[error("server I/O error: {0}")]
    Conn(#[from] crate::net::conn::ConnError),
    #[error("server protocol error: {0}")]
    Proto(#[from] crate::proto::ProtoError),
    /// The server said no (login or query): its error, passed on to the client. Shown
    /// as PgBouncer logs it (`FATAL database "x" does not exist`).
    #[error("{} {}", .0.severity, .0.message)]
    Rejected(ErrorFields),
    #[error("server login failed: {0}")]
    Login(String),
    /// Within server_login_retry of a failed login, with no server left: refused at once.
    #[error("server login has been failing, cached error: {0} (server_login_retry)")]
    LoginFailing(String),
    /// target_session_attrs: every host answered, none has the wanted role (a switchover
    /// under way: clients wait for one, as for a server starting up).
    #[error("{0}")]
    NoHost(String),
}

impl ServerError {
    /// A login that failed this way may succeed in a moment: the server is starting up or
    /// shutting down (57P03, or 57P01/57P02 as it ends the session), nothing listens at
    /// its address (refused, reset, no Unix socket), or it did not answer within
    /// server_connect_timeout (PgBouncer keeps the client waiting and retries too, until
    /// query_timeout / query_wait_timeout). Other failures (28P01, 3D000…) would repeat.
    pub fn is_unavailable(&self) -> bool {
        use std::io::ErrorKind as K;
        let gone = |k: K| {
            matches!(
                k,
                K::ConnectionRefused | K::ConnectionReset | K::ConnectionAborted | K::NotFound
            )
        };
        match self {
            ServerError::Rejected(e) => matches!(e.code.as_str(), "57P01" | "57P02" | "57P03"),
            ServerError::Connect(e) => gone(e.kind()),
            ServerError::Conn(crate::net::conn::ConnError::Closed)
            | ServerError::Timeout
            | ServerError::NoHost(_) => true,
            ServerError::Conn(crate::net::conn::ConnError::Io(e)) => {
                gone(e.kind()) || e.kind() == K::BrokenPipe
            }
            _ => false,
        }
    }

    /// The SQLSTATE and message a client should see.
    pub fn client_error(&self) -> (String, String) {
        match self {
            ServerError::Rejected(e) => (e.code.clone(), e.message.clone()),
            other => ("08006".to_string(), other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Error, ErrorKind};

    fn rejected(code: &str) -> ServerError {
        ServerError::Rejected(ErrorFields {
            severity: "FATAL".into(),
            code: code.into(),
            message: String::new(),
        })
    }

    #[test]
    fn a_server_starting_up_shutting_down_or_not_listening_is_unavailable() {
        for code in ["57P01", "57P02", "57P03"] {
            assert!(rejected(code).is_unavailable(), "{code}");
        }
        assert!(ServerError::Connect(Error::from(ErrorKind::ConnectionRefused)).is_unavailable());
        assert!(ServerError::Connect(Error::from(ErrorKind::NotFound)).is_unavailable());
        assert!(ServerError::Conn(crate::net::conn::ConnError::Closed).is_unavailable());
        assert!(ServerError::Timeout.is_unavailable());
    }

    #[test]
    fn other_login_failures_are_not_unavailable() {
        for code in ["28P01", "3D000", "28000", "53300"] {
            assert!(!rejected(code).is_unavailable(), "{code}");
        }
        assert!(!ServerError::Login("unsupported server auth method 7".into()).is_unavailable());
        assert!(!ServerError::Connect(Error::from(ErrorKind::PermissionDenied)).is_unavailable());
    }
}
