//! Server connections: what one PostgreSQL backend connection is and knows.
pub mod connect;
pub mod prepared;
pub mod query;
pub mod response;
pub mod roles;
pub mod sync;

use std::time::Instant;

use crate::net::Conn;
use crate::proto::backend::ErrorFields;

pub use connect::{Credential, HostList, ServerAddr, ServerTarget};

/// Session parameters as an ordered list with case-insensitive names (GUC names are).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Params {
    items: Vec<(String, String)>,
}

impl Params {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.items
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn set(&mut self, name: &str, value: &str) {
        match self
            .items
            .iter_mut()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
        {
            Some((_, v)) => {
                if v != value {
                    v.clear();
                    v.push_str(value);
                }
            }
            None => self.items.push((name.to_string(), value.to_string())),
        }
    }
    pub fn remove(&mut self, name: &str) {
        self.items.retain(|(k, _)| !k.eq_ignore_ascii_case(name));
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
}

/// Protocol position of a server connection, kept by the relay: what is still owed.
#[derive(Debug, Clone, Default)]
pub struct ProtoState {
    /// ReadyForQuery messages still to come (one per Query, Sync and FunctionCall sent,
    /// but for a Sync the server reads while it copies in, which it ignores).
    pub expected_rfq: u32,
    /// Extended-protocol messages sent since the last Sync.
    pub unsynced: bool,
    /// Bytes of a client message still to be forwarded (a message was sent in part).
    pub partial: usize,
    /// In COPY FROM STDIN as the server's replies tell: CopyInResponse came, and the
    /// CommandComplete or ErrorResponse that ends the copy has not (the client may have
    /// sent its CopyDone already: it may stream a whole COPY without waiting).
    pub copy_in: bool,
    /// Transaction status from the last ReadyForQuery: b'I', b'T' or b'E'.
    pub tx_status: u8,
    /// Messages owing a ReadyForQuery answered (or found to owe none) since login: the
    /// next message sent that owes one is number `answered + expected_rfq`.
    pub answered: u64,
    /// The messages sent that start a COPY, end one or owe a ReadyForQuery, oldest first,
    /// while the server has not finished with them: where a COPY starts and ends in what
    /// was sent (the Syncs between are ignored by the server).
    marks: std::collections::VecDeque<Mark>,
    /// Transaction-control statements sent whose round is not answered yet, oldest first:
    /// the round and what they do to the status (`sent_tx_effect`).
    tx_sent: std::collections::VecDeque<(u64, [u8; 3])>,
}

/// At most this many transaction-control statements in flight are followed
/// (`ProtoState::status_sent`); beyond, a client's messages are judged by fewer of them.
const MAX_TX_SENT: usize = 64;

/// A message sent, as far as COPY FROM STDIN and ReadyForQuery are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    /// A simple Query: owes a ReadyForQuery, may copy.
    Query,
    /// An Execute: may copy.
    Execute,
    /// Sync or FunctionCall: owes a ReadyForQuery.
    Sync,
    /// CopyDone or CopyFail.
    CopyEnd,
}

impl ProtoState {
    /// Nothing owed, not in a transaction: safe to hand to another client.
    pub fn is_idle(&self) -> bool {
        self.is_idle_but_status() && self.tx_status == b'I'
    }

    /// Nothing owed (the transaction status aside).
    pub fn is_idle_but_status(&self) -> bool {
        self.expected_rfq == 0 && !self.unsynced && self.partial == 0 && !self.copy_in
    }

    /// The round (number of the message owing a ReadyForQuery) a message sent now is part
    /// of: a Query's own, or the next Sync's.
    pub fn round(&self) -> u64 {
        self.answered + u64::from(self.expected_rfq)
    }

    /// A message that owes a ReadyForQuery was sent: a simple Query (`query`), or a Sync
    /// or FunctionCall.
    pub fn owe_ready(&mut self, query: bool) {
        self.expected_rfq += 1;
        self.marks
            .push_back(if query { Mark::Query } else { Mark::Sync });
    }

    /// A Query or an Execute whose statements do this to the transaction status was sent
    /// (the status after them for `I`, `T` and `E` before, as `client::classify::tx_effect`
    /// gives it): before a Query's own `owe_ready`.
    pub fn sent_tx_effect(&mut self, effect: [u8; 3]) {
        if self.tx_sent.len() < MAX_TX_SENT {
            let round = self.round();
            self.tx_sent.push_back((round, effect));
        }
    }

    /// The transaction status the server will be in once it has run everything sent, if
    /// none of it fails: what a client's next message is judged by (the messages of a
    /// pipeline take effect in order, before their ReadyForQuery says so).
    pub fn status_sent(&self) -> u8 {
        let index = |s| match s {
            b'I' => 0,
            b'T' => 1,
            _ => 2,
        };
        self.tx_sent
            .iter()
            .fold(self.tx_status, |s, (_, e)| e[index(s)])
    }

    /// An Execute was sent.
    pub fn sent_execute(&mut self) {
        self.marks.push_back(Mark::Execute);
    }

    /// A CopyDone or CopyFail was sent.
    pub fn sent_copy_end(&mut self) {
        // With nothing sent that could start a COPY, the server ignores it.
        if self.copy_in
            || self
                .marks
                .iter()
                .any(|m| matches!(m, Mark::Query | Mark::Execute))
        {
            self.marks.push_back(Mark::CopyEnd);
        }
    }

    /// A ReadyForQuery came with this transaction status: the oldest message owing one
    /// is answered, and everything sent before it is done with.
    pub fn on_ready(&mut self, status: u8) {
        self.tx_status = status;
        self.expected_rfq = self.expected_rfq.saturating_sub(1);
        self.answered += 1;
        let answered = self.answered;
        self.tx_sent.retain(|&(round, _)| round >= answered);
        if self.expected_rfq == 0 {
            // Nothing more owed: the status is the server's own.
            self.tx_sent.clear();
        }
        // The server never reports ReadyForQuery while it copies in.
        self.copy_in = false;
        while let Some(m) = self.marks.pop_front() {
            if matches!(m, Mark::Query | Mark::Sync) {
                break;
            }
        }
    }

    /// Another reply came (its tag): returns how many Syncs sent turn out to owe nothing
    /// (the server read them while copying in), which the caller's own ledger drops too.
    pub fn on_reply(&mut self, tag: u8) -> u32 {
        use crate::proto::backend;
        match tag {
            backend::COPY_IN_RESPONSE => {
                self.drop_stale_copy_ends();
                self.copy_in = true;
                0
            }
            backend::COMMAND_COMPLETE
            | backend::EMPTY_QUERY_RESPONSE
            | backend::PORTAL_SUSPENDED
            | backend::ERROR_RESPONSE => {
                let error = tag == backend::ERROR_RESPONSE;
                let voided = if std::mem::take(&mut self.copy_in) {
                    self.end_copy()
                } else {
                    0
                };
                self.drop_stale_copy_ends();
                if self.marks.front() == Some(&Mark::Execute) {
                    self.marks.pop_front();
                    if error {
                        // The server skips to the next Sync: no later Execute runs.
                        while let Some(Mark::Execute | Mark::CopyEnd) = self.marks.front() {
                            self.marks.pop_front();
                        }
                    }
                }
                voided
            }
            _ => 0,
        }
    }

    /// The COPY the first mark started is over: the Syncs sent after it up to the
    /// client's CopyDone or CopyFail (all sent so far if none came yet) were read by the
    /// server while copying in, and ignored. An Execute's copy left with no Sync sent
    /// after it: the server still wants one.
    fn end_copy(&mut self) -> u32 {
        let mut voided = 0;
        let mut i = 1;
        while i < self.marks.len() {
            match self.marks[i] {
                Mark::CopyEnd => {
                    self.marks.remove(i);
                    break;
                }
                Mark::Sync => {
                    self.marks.remove(i);
                    voided += 1;
                }
                Mark::Query | Mark::Execute => i += 1,
            }
        }
        self.expected_rfq = self.expected_rfq.saturating_sub(voided);
        self.answered += u64::from(voided);
        if self.marks.front() == Some(&Mark::Execute)
            && !self
                .marks
                .iter()
                .any(|m| matches!(m, Mark::Query | Mark::Sync))
        {
            self.unsynced = true;
        }
        voided
    }

    /// A CopyDone or CopyFail sent before every message that could still start a COPY
    /// reached a server that was not copying: it ignored it.
    fn drop_stale_copy_ends(&mut self) {
        while self.marks.front() == Some(&Mark::CopyEnd) {
            self.marks.pop_front();
        }
    }
}

/// One logged-in server connection.
pub struct Server {
    pub id: u64,
    pub conn: Conn,
    /// One per server: cancel requests in flight hold clones (the pool waits for them to
    /// finish before the server is reused, see `pool::guard`).
    pub addr: std::sync::Arc<ServerAddr>,
    /// BackendKeyData (pid, secret) for cancel requests.
    pub key: (i32, i32),
    /// Current values of the session parameters we know of.
    pub params: Params,
    /// Values right after login (what RESET ALL/DISCARD ALL return to).
    pub login_params: Params,
    pub proto: ProtoState,
    pub created: Instant,
    pub last_used: Instant,
    /// A client has run work on it (not only a login that read its parameters):
    /// `server_lifetime = 0` closes it when it comes back.
    pub served: bool,
    /// Set when the server's state is unknown: it must be closed, not reused.
    pub broken: bool,
    /// Prepared statements this server holds (transaction/statement mode).
    pub prepared: prepared::PreparedSet,
    /// Responses owed, in order, while a relay with virtual statements runs.
    pub owed: response::Owed,
    /// The worker whose runtime drives the socket (see `crate::workers`).
    pub home: usize,
    /// Whose unnamed statement the server holds (`VirtualSession::unnamed_id`; 0: none or
    /// unknown). A simple Query drops it.
    pub unnamed: u64,
    /// NotificationResponses that came while pgcarpool ran its own queries: they belong to
    /// the client holding the server (`take_notifications`).
    pub notifications: bytes::BytesMut,
    /// The TLS session as SHOW SERVERS prints it (None: plain).
    pub tls: Option<std::sync::Arc<str>>,
    /// Which host of the target's host list it is on (None: no list).
    pub host: Option<usize>,
    /// It reported what may mean its host is no longer what it was (25006 read-only
    /// transaction, 57P01/57P02 shutdown): the SQLSTATE. The server is closed and the
    /// host's role checked again.
    pub role_doubt: Option<[u8; 5]>,
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
            login_params: params.clone(),
            params,
            proto: ProtoState {
                tx_status: b'I',
                ..Default::default()
            },
            created: now,
            last_used: now,
            served: false,
            broken: false,
            prepared: Default::default(),
            owed: Default::default(),
            home: crate::workers::current(),
            unnamed: 0,
            notifications: bytes::BytesMut::new(),
            tls: None,
            host: None,
            role_doubt: None,
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

    use crate::proto::backend::{
        COMMAND_COMPLETE, COPY_IN_RESPONSE, ERROR_RESPONSE as ERROR, READY_FOR_QUERY,
    };

    fn idle() -> ProtoState {
        ProtoState {
            tx_status: b'I',
            ..Default::default()
        }
    }

    /// Feed server replies; returns the Syncs voided.
    fn replies(p: &mut ProtoState, tags: &[u8]) -> u32 {
        let mut voided = 0;
        for &t in tags {
            if t == READY_FOR_QUERY {
                p.on_ready(b'I');
            } else {
                voided += p.on_reply(t);
            }
        }
        voided
    }

    #[test]
    fn a_copy_streamed_before_its_copy_in_response_ends_idle() {
        let mut p = idle();
        p.owe_ready(true);
        p.sent_copy_end();
        assert!(!p.is_idle());
        assert_eq!(replies(&mut p, &[COPY_IN_RESPONSE]), 0);
        assert!(p.copy_in);
        replies(&mut p, &[COMMAND_COMPLETE, READY_FOR_QUERY]);
        assert!(p.is_idle(), "{p:?}");
        assert!(p.marks.is_empty());
    }

    #[test]
    fn syncs_read_while_copying_in_owe_nothing() {
        // libpq: Execute, Sync, CopyData…, CopyDone, Sync; one ReadyForQuery comes.
        let mut p = idle();
        p.sent_execute();
        p.owe_ready(false);
        p.sent_copy_end();
        p.owe_ready(false);
        assert_eq!(p.expected_rfq, 2);
        assert_eq!(replies(&mut p, &[COPY_IN_RESPONSE, COMMAND_COMPLETE]), 1);
        assert_eq!(p.expected_rfq, 1);
        replies(&mut p, &[READY_FOR_QUERY]);
        assert!(p.is_idle(), "{p:?}");
        // The copy fails before the client's end: the Sync it read is void, the server
        // skips to the next Sync, which the client has not sent yet.
        p.sent_execute();
        p.owe_ready(false);
        assert_eq!(replies(&mut p, &[COPY_IN_RESPONSE, ERROR]), 1);
        assert!(p.unsynced && p.expected_rfq == 0);
        p.sent_copy_end();
        p.owe_ready(false);
        p.unsynced = false;
        replies(&mut p, &[READY_FOR_QUERY]);
        assert!(p.is_idle(), "{p:?}");
        assert!(p.marks.is_empty());
    }

    #[test]
    fn copy_ends_a_server_ignored_do_not_end_a_later_copy() {
        // A COPY that failed before it started, its CopyDone sent after it anyway.
        let mut p = idle();
        p.owe_ready(true);
        replies(&mut p, &[ERROR, READY_FOR_QUERY]);
        p.sent_copy_end();
        assert!(p.marks.is_empty(), "nothing can copy: ignored");
        p.owe_ready(true);
        p.sent_copy_end();
        p.sent_execute();
        p.owe_ready(false);
        p.sent_copy_end();
        p.owe_ready(false);
        // The query fails before copying: the CopyDone after it is ignored too.
        replies(&mut p, &[ERROR, READY_FOR_QUERY]);
        assert_eq!(replies(&mut p, &[COPY_IN_RESPONSE, COMMAND_COMPLETE]), 1);
        replies(&mut p, &[READY_FOR_QUERY]);
        assert!(p.is_idle(), "{p:?}");
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
