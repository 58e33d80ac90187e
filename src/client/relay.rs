//! The forwarding loop while a client holds a server: both directions at once in one task,
//! bytes forwarded by splitting read buffers (no copy), output written in vectored batches,
//! the slower side setting the pace. Only the messages that change state are looked at.
use std::future::poll_fn;
use std::ops::ControlFlow;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::config::PoolMode;
use crate::net::Conn;
use crate::proto::{self, ProtoError, backend, frontend};
use crate::server::Server;

use super::classify::Effects;
use super::prepared::{StatementRegistry, Stmt};
use super::session::VirtualSession;
use crate::server::response::{Pending, Verdict};
use crate::sql::facts::{Facts, query_text};
use crate::sql::{selfview, signal};

/// Stop reading one side while this much waits to be written to the other.
const HIGH_WATER: usize = 256 * 1024;
/// Largest server message we look inside of (ParameterStatus, ReadyForQuery, errors…).
const MAX_INSPECTED: usize = 1024 * 1024;
/// Largest message either side may send; larger ones are refused.
const MAX_FORWARDED: usize = i32::MAX as usize;

/// What a client mid-transaction on a primary that stopped being one is told (08006).
pub const HOST_DEMOTED: &str = "the server's host is no longer the primary (switchover)";

/// Why the relay stopped.
#[derive(Debug)]
pub enum RelayEvent {
    /// The server is idle with nothing owed and the pool mode lets it go.
    Release,
    /// Statement mode and the server is inside a transaction.
    StatementModeTransaction,
    /// The client sent Terminate.
    ClientTerminate,
    /// The client's socket closed or failed.
    ClientGone,
    /// The client broke the protocol.
    ClientProtocol(ProtoError),
    /// The server ended the session with a FATAL the client caused (`client_caused`),
    /// forwarded to it: its SQLSTATE and words. The client goes as from PostgreSQL.
    ClientFatal(String),
    /// The server's socket closed, failed or broke the protocol.
    ServerGone(String),
    Timeout(TimeoutKind),
    /// KILL or shutdown.
    Killed,
    /// The client went past one of its limits (client_max_statements, the registry's size):
    /// why.
    Limit(String),
    /// server_fast_close: the server's database was reconfigured (RECONNECT, reload) and
    /// the server went idle.
    ConfigChanged,
    /// disable_pqexec: the client sent a simple Query.
    PqexecDisallowed,
    /// The server, just checked out, was terminated by an administrator before it answered
    /// any of the client's first request (`Relay::first_request`): the request as the
    /// client sent it, to go to another server.
    TerminatedBeforeReply(BytesMut),
    /// A standby refused the client's first request because it writes (25006) before
    /// anything of the reply reached the client: the request as the client sent it, to
    /// run on the primary (read routing).
    RefusedOnStandby(BytesMut),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeoutKind {
    Query,
    IdleTransaction,
    Transaction,
}

impl TimeoutKind {
    /// Why the server is closed, in PgBouncer's words (its log says "closing because:
    /// query timeout"; tools grep for them).
    pub fn server_reason(self) -> &'static str {
        match self {
            TimeoutKind::Query => "query timeout",
            TimeoutKind::IdleTransaction => "idle transaction timeout",
            TimeoutKind::Transaction => "transaction timeout",
        }
    }

    /// What the client is told: the same words (PgBouncer's, which tools match).
    pub fn message(self) -> &'static str {
        self.server_reason()
    }
}

/// Timeouts that apply while a server is held (None = off).
#[derive(Debug, Clone, Copy, Default)]
pub struct RelayTimeouts {
    pub query: Option<Duration>,
    pub idle_transaction: Option<Duration>,
    pub transaction: Option<Duration>,
}

/// Counters gathered during one relay, added to the pool's stats afterwards.
#[derive(Debug, Default, Clone, Copy)]
pub struct RelayCounts {
    pub queries: u64,
    pub transactions: u64,
    pub bytes_from_client: u64,
    pub bytes_from_server: u64,
    pub query_time_us: u64,
    /// Named statements: the client's Parses, pgcarpool's Parses on the server, the
    /// client's Binds (SHOW STATS' parse and bind counts).
    pub client_parses: u64,
    pub server_parses: u64,
    pub binds: u64,
}

pub struct Relay<'a> {
    pub client: &'a mut Conn,
    pub server: &'a mut Server,
    pub session: &'a mut VirtualSession,
    pub mode: PoolMode,
    /// Virtual prepared statements on (transaction/statement mode with max_prepared_statements > 0).
    pub(super) virt: bool,
    pub(super) max_prepared: usize,
    pub(super) registry: &'a StatementRegistry,
    /// Bytes of a server message still to stream to the client.
    server_partial: usize,
    pub counts: RelayCounts,
    query_started: Option<Instant>,
    xact_started: Option<Instant>,
    /// What the client's statements did to its session (read after the transaction).
    pub effects: Effects,
    idle_in_xact_since: Option<Instant>,
    /// The server had no extended-protocol messages pending a Sync before the client's
    /// current message (a simple query may be slipped in).
    pub(super) at_sync_point: bool,
    /// Most statement names the client may hold (client_max_statements).
    pub max_client_statements: usize,
    /// plan_once: a repeated unnamed Parse may be served by a shared statement
    /// (`Relay::parse_planned_once`).
    pub plan_once: bool,
    /// Set when the client's message went past a limit: the relay stops with it.
    pub(super) limit: Option<String>,
    /// The client's messages from a Bind of a shared statement up to its Sync, kept to be
    /// sent again if the statement turns out stale (`Verdict::Stale`).
    pub(super) replay: Option<Replay>,
    /// Replayed messages wait in the client's buffer: scan it again.
    pub(super) rescan_client: bool,
    /// What is queued for the client is pgcarpool's own answers (a skipped Parse's
    /// ParseComplete) and the server owes a ReadyForQuery: they wait to be written with the
    /// server's reply, one write and one wake-up of the client instead of two.
    hold_answers: bool,
    /// The client sent only messages an idle server ignores (CopyData, CopyDone or
    /// CopyFail after its COPY ended, Flush): the server owes nothing and goes back once
    /// they are written.
    owes_nothing: bool,
    /// server_fast_close: the server is to close at its next ReadyForQuery `I` (session
    /// mode), before another client message is relayed.
    closing: bool,
    /// The pools, to close idle servers of a database a client drops or renames.
    pub pools: Option<&'a crate::pool::Pools>,
    /// Every client of this process, and this client's user: a client's query may signal
    /// another by the pid it was given (`Relay::signal_client`).
    pub clients: Option<(&'a super::registry::Registry, &'a str)>,
    /// server_fast_close in session mode: the server's pool. When a RECONNECT or a
    /// changed database entry marks the server, the session ends as soon as the server is
    /// idle (between transactions) instead of at the client's exit.
    /// (read when the mark comes: the setting may change while a session lasts).
    pub fast_close: Option<(&'a crate::pool::Pool, &'a crate::shared::Shared)>,
    /// disable_pqexec: a simple Query ends the client (PgBouncer's "PQexec disallowed").
    pub disable_pqexec: bool,
    /// The client listens through the pool's listener: a transaction that may have sent
    /// notifications or ended with DISCARD ALL keeps its last ReadyForQuery back
    /// (`withheld_ready`), to be sent once the listener has caught up.
    pub hold_ready: bool,
    /// The ReadyForQuery kept back (its status).
    pub withheld_ready: Option<u8>,
    /// The ParameterStatus messages that came right before it, kept back with it:
    /// PostgreSQL sends the notifications first (`ProcessNotifyInterrupt` before
    /// `ReportChangedGUCOptions`), and the listener's come once it has caught up.
    pub withheld_params: Bytes,
    /// The channels the client listens on through the pool's listener: its LISTEN or
    /// UNLISTEN of one inside a transaction block goes as `notify::in_block_query`.
    pub listener_channels: Vec<String>,
    /// The operations that went so (`notify::after_block` follows the transaction).
    pub listen_in_block: Vec<String>,
    /// target_session_attrs=read-write/primary: the pool's hosts. When the server's host
    /// stops being the primary (demoted, fenced by a newer one), the relay stops at once,
    /// mid-transaction too: nothing more of it reaches that host.
    pub fence: Option<&'a crate::server::HostList>,
    /// Statement names and SQL texts renamed for the server in the rounds still running:
    /// its errors are given back the client's names and positions.
    pub(super) renamed: super::renamed::Renamed,
    /// The server name of the client's SQL-prepared statement whose PREPARE failed in a
    /// round pgcarpool added, with its ErrorResponse (`Relay::analysis_error`).
    pub(super) unprepared: Option<(Bytes, Bytes)>,
    /// The client's statements an executed `DEALLOCATE ALL` dropped, by round, until the
    /// server says whether it ran (see `Relay::executing`), each with the number of the
    /// reply owed for the message sent after its Execute (`Exchange::owed_next`).
    pub(super) session_deallocs: Vec<(u64, u64, super::session::NameMap<Arc<Stmt>>)>,
    /// Transaction pooling: a server lost under the client's transaction leaves the client
    /// connected (`aborted`), unless it is pinned or the loss came mid-message.
    pub keep_client: bool,
    /// What the client's messages in flight do to the transaction (may begin a block, may
    /// commit), since the server was last idle.
    flight: (bool, bool),
    /// The server said FATAL (withheld from the client) before it went.
    fatal_seen: bool,
    /// The client's next message is one PostgreSQL refuses on its header
    /// (`frontend::header`): nothing more is read from the client, nothing of it reaches
    /// the server, and the relay ends with `ClientProtocol` once the server has answered
    /// what came before it.
    refused: Option<ProtoError>,
    /// A Sync of pgcarpool's own follows the client's messages before the refused one
    /// (`refusal_due`); its ReadyForQuery is not the client's.
    refusal_synced: bool,
    /// The client's first request on a server just checked out, kept as sent while the
    /// server has said nothing, when it may be sent again (`first_reply`). None: not kept.
    pub first_request: Option<FirstRequest>,
    /// Read routing sent the transaction to a standby: a later request that does not only
    /// read waits for the standby to be done with the transaction and goes to the primary
    /// in the next one (in a transaction block it goes on to the standby, whose error is
    /// the client's). Off once a transaction block is seen.
    pub reads_only: bool,
    /// A Query, Parse or Bind went to the server in this relay.
    requested: bool,
    /// The number of the BEGIN pgcarpool answered and sent ahead of the client's messages
    /// (`send_begin`): its error ends the client.
    begin_seq: Option<u64>,
    /// A transaction the fast path began (`resume`): how the server's socket stood, to be
    /// looked at before anything else.
    resumed: Option<ServerSocket>,
}

/// A transaction the fast path (`client::fast`) began and hands over where it stands:
/// its one simple Query sent (a text that may not matter, `Facts::may_matter`), what the
/// server said of it up to the reply the fast path leaves alone forwarded, that reply
/// unread in the server's buffer.
pub struct Resumed {
    /// The Query as sent.
    pub query: Bytes,
    /// When it was sent.
    pub sent: Instant,
    /// Something of the server's reply was forwarded.
    pub replied: bool,
    /// The clock at the checkout: the transaction's and its query's start.
    pub started: Instant,
    /// Bytes of a server message still to stream to the client.
    pub server_partial: usize,
    /// Bytes relayed so far, each way.
    pub counts: RelayCounts,
    /// How the server's socket stood.
    pub server: ServerSocket,
}

/// The server's socket as the fast path left it.
#[derive(Debug)]
pub enum ServerSocket {
    Open,
    /// A read found its end.
    Closed,
    /// A read or a write failed.
    Failed(std::io::Error),
}

/// The client's first request on a fresh server, kept for `RelayEvent::TerminatedBeforeReply`
/// (and on a standby, `RelayEvent::RefusedOnStandby`).
#[derive(Debug, Default)]
pub struct FirstRequest {
    /// The client's messages as it sent them (whole simple Queries only).
    pub msgs: BytesMut,
    /// When the first of them was forwarded.
    pub sent: Option<Instant>,
    /// The server is a standby: nothing it runs commits anything, every simple Query is
    /// kept, and its refusal of a write is looked for past what comes before an error.
    pub standby: bool,
}

/// How soon after the client's first request a server's FATAL 57P01 must come for the
/// request to be sent again: a backend terminated while idle sends it at once, before
/// reading anything; one terminated later, while it ran the request (an administrator
/// ending a long query), is not undone by running the query again.
/// (Generous: on a busy machine a terminated backend can take a good part of a second to
/// be scheduled and say so.)
const REPLAY_WINDOW: Duration = Duration::from_secs(2);

/// What a stale statement's round needs to be sent again.
pub(super) struct Replay {
    /// The client's name for the statement, and the statement.
    pub name: Bytes,
    pub stmt: Arc<Stmt>,
    /// The client's messages as it sent them, from the Bind to the Sync.
    pub msgs: BytesMut,
    /// The Sync is in `msgs`.
    pub complete: bool,
    /// Sent again once already: not again.
    pub replayed: bool,
}

/// Most bytes of client messages kept for a replay.
const MAX_REPLAY: usize = 64 * 1024;

impl<'a> Relay<'a> {
    pub fn new(
        client: &'a mut Conn,
        server: &'a mut Server,
        session: &'a mut VirtualSession,
        mode: PoolMode,
        registry: &'a StatementRegistry,
        max_prepared: usize,
    ) -> Self {
        let virt = mode != PoolMode::Session && max_prepared > 0;
        if virt {
            server.forget_owed();
        }
        if let Some(held) = server.take_notifications(session.backend_pid) {
            client.queue(held);
        }
        Relay {
            client,
            server,
            session,
            mode,
            virt,
            max_prepared,
            registry,
            server_partial: 0,
            counts: RelayCounts::default(),
            query_started: None,
            xact_started: None,
            idle_in_xact_since: None,
            effects: Effects::default(),
            at_sync_point: true,
            max_client_statements: usize::MAX,
            plan_once: false,
            limit: None,
            replay: None,
            rescan_client: false,
            hold_answers: false,
            owes_nothing: false,
            closing: false,
            pools: None,
            clients: None,
            fast_close: None,
            disable_pqexec: false,
            hold_ready: false,
            withheld_ready: None,
            withheld_params: Bytes::new(),
            listener_channels: Vec::new(),
            listen_in_block: Vec::new(),
            fence: None,
            renamed: Default::default(),
            unprepared: None,
            session_deallocs: Vec::new(),
            keep_client: false,
            flight: (false, false),
            fatal_seen: false,
            refused: None,
            refusal_synced: false,
            first_request: None,
            reads_only: false,
            requested: false,
            begin_seq: None,
            resumed: None,
        }
    }

    /// The BEGIN pgcarpool answered for the client (`client::deferred`), sent ahead of the
    /// client's messages, in the same write; its replies are dropped.
    pub fn send_begin(&mut self, begin: crate::sql::begin::Begin) {
        // Sent in the same write as what the client sent after it, which is judged as in
        // the block at once (its error ends the client: `on_error`).
        self.server.sent_sure_begin();
        let seq = self
            .server
            .send_added_query(|b| crate::proto::frontend::query_of(b, &begin.sql()));
        self.begin_seq = Some(seq);
    }

    /// Take over a transaction the fast path began: the state as if this relay had
    /// scanned and sent its Query (`scan_client`, `on_query` for a text that may not
    /// matter, whose unnamed statements the fast path dropped already) and forwarded
    /// what the server said so far; `run` looks at the server first.
    pub fn resume(&mut self, r: Resumed) {
        self.counts = r.counts;
        self.xact_started = Some(r.started);
        self.query_started = Some(r.started);
        if let Some(k) = &mut self.first_request {
            if r.replied {
                self.first_request = None;
            } else {
                k.msgs.extend_from_slice(&r.query);
                k.sent = Some(r.sent);
            }
        }
        self.server.note_sent(frontend::QUERY, self.virt);
        self.server_partial = r.server_partial;
        self.resumed = Some(r.server);
    }

    /// A resumed transaction's server, looked at first: how its socket stood, else what
    /// it said that the fast path left unread. Some: the relay ends with it.
    fn resumed_server(&mut self, socket: ServerSocket) -> Option<RelayEvent> {
        match socket {
            ServerSocket::Closed => Some(self.server_closed()),
            ServerSocket::Failed(e) => Some(self.server_failed(&e)),
            ServerSocket::Open if self.server.conn().rbuf.is_empty() => None,
            ServerSocket::Open => match self.scan_server() {
                Ok(ev) => ev,
                Err(e) => Some(RelayEvent::ServerGone(e.to_string())),
            },
        }
    }

    /// Relay until an event, watching the timeouts.
    pub async fn run(&mut self, t: RelayTimeouts) -> RelayEvent {
        // A server of a host seen demoted meanwhile: nothing of the client's is sent to it
        // (it goes back to wait for another).
        if let Some(h) = self.fence
            && h.demoted(self.server.host())
        {
            return RelayEvent::ServerGone(HOST_DEMOTED.into());
        }
        if let Some(socket) = self.resumed.take()
            && let Some(ev) = self.resumed_server(socket)
        {
            return ev;
        }
        // What the client sent before the server was attached.
        if !self.client.rbuf.is_empty() {
            self.counts.bytes_from_client += self.client.rbuf.len() as u64;
            match self.scan_client() {
                Ok(Some(ev)) => return ev,
                Ok(None) => {}
                Err(e) => return RelayEvent::ClientProtocol(e),
            }
        }
        let fast_close = self.fast_close;
        let must_close = |server: &Server| {
            fast_close.is_some_and(|(p, shared)| {
                shared.config().settings.server_fast_close && p.close_needed(server)
            })
        };
        self.closing = must_close(self.server);
        let mut marked = std::pin::pin!(fast_close.map(|(p, _)| p.fast_close.notified()));
        let fence = self.fence;
        let mut demoted = std::pin::pin!(fence.map(|h| h.changed.notified()));
        if let Some(h) = fence
            && h.demoted(self.server.host())
        {
            return RelayEvent::ServerGone(HOST_DEMOTED.into());
        }
        loop {
            if self.closing && self.server_idle() {
                return RelayEvent::ConfigChanged;
            }
            if self.owes_nothing && self.server_idle() {
                return RelayEvent::Release;
            }
            let deadline = self.next_deadline(&t);
            let closing = self.closing;
            // A message relayed can start or stop a timer (a query sent, a transaction gone
            // idle): then come round again to wait for the new deadline (or to close).
            let relayed = poll_fn(|cx| match self.poll(cx) {
                Poll::Pending if self.next_deadline(&t) != deadline => Poll::Ready(None),
                Poll::Pending if (self.owes_nothing || self.closing) && self.server_idle() => {
                    Poll::Ready(None)
                }
                other => other.map(Some),
            });
            // The mark first: RECONNECT answers after it, so a query the client sends after
            // that answer must find its session closing, not be relayed.
            tokio::select! {
                biased;
                _ = async { marked.as_mut().as_pin_mut().expect("guarded").await },
                    if marked.is_some() && !closing =>
                {
                    self.closing = must_close(self.server);
                    marked.set(fast_close.map(|(p, _)| p.fast_close.notified()));
                }
                ev = relayed => if let Some(ev) = ev {
                    return ev;
                },
                _ = async { demoted.as_mut().as_pin_mut().expect("guarded").await },
                    if demoted.is_some() =>
                {
                    if fence.is_some_and(|h| h.demoted(self.server.host())) {
                        return RelayEvent::ServerGone(HOST_DEMOTED.into());
                    }
                    demoted.set(fence.map(|h| h.changed.notified()));
                }
                _ = sleep_until(deadline) => {
                    if let Some(kind) = self.expired(&t, Instant::now()) {
                        return RelayEvent::Timeout(kind);
                    }
                }
            }
        }
    }

    /// Between transactions with nothing owed either way.
    fn server_idle(&self) -> bool {
        self.server.exchange().is_idle()
            && self.server.conn().out_len() == 0
            && self.client.out_len() == 0
    }

    fn deadlines(&self, t: &RelayTimeouts) -> [(TimeoutKind, Option<Instant>); 3] {
        [
            (
                TimeoutKind::Query,
                t.query.zip(self.query_started).map(|(d, s)| s + d),
            ),
            (
                TimeoutKind::IdleTransaction,
                t.idle_transaction
                    .zip(self.idle_in_xact_since)
                    .map(|(d, s)| s + d),
            ),
            (
                TimeoutKind::Transaction,
                t.transaction.zip(self.xact_started).map(|(d, s)| s + d),
            ),
        ]
    }

    fn next_deadline(&self, t: &RelayTimeouts) -> Option<Instant> {
        self.deadlines(t).into_iter().filter_map(|(_, d)| d).min()
    }

    fn expired(&self, t: &RelayTimeouts, now: Instant) -> Option<TimeoutKind> {
        self.deadlines(t)
            .into_iter()
            .find(|(_, d)| d.is_some_and(|d| d <= now))
            .map(|(k, _)| k)
    }

    /// One pass over both sockets; Ready only for an event.
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<RelayEvent> {
        // A read that was Pending in this call has its waker registered and stays Pending
        // until that waker runs: the loop does not ask again (each ask is a trip through
        // tokio's readiness).
        let (mut server_waits, mut client_waits) = (false, false);
        loop {
            if let Some(e) = self.refusal_due() {
                return Poll::Ready(RelayEvent::ClientProtocol(e));
            }
            let mut progress = false;
            // Writes first: they free room for reads.
            let before = self.server.conn().out_len();
            if self.server.conn().out_pending() {
                if let Poll::Ready(Err(e)) = self.server.conn_mut().poll_write_out(cx) {
                    return Poll::Ready(self.server_failed(&e));
                }
                progress |= self.server.conn().out_len() < before;
            }
            let before = self.client.out_len();
            if self.client.out_pending() && !self.hold_answers {
                if let Poll::Ready(Err(_)) = self.client.poll_write_out(cx) {
                    return Poll::Ready(RelayEvent::ClientGone);
                }
                progress |= self.client.out_len() < before;
            }
            if self.client.out_len() < HIGH_WATER && !server_waits {
                match self.server.conn_mut().poll_read_more(cx) {
                    Poll::Ready(Ok(0)) => return Poll::Ready(self.server_closed()),
                    Poll::Ready(Ok(n)) => {
                        progress = true;
                        self.counts.bytes_from_server += n as u64;
                        match self.scan_server() {
                            Ok(Some(ev)) => return Poll::Ready(ev),
                            Ok(None) => {}
                            Err(e) => return Poll::Ready(RelayEvent::ServerGone(e.to_string())),
                        }
                        if std::mem::take(&mut self.rescan_client) {
                            match self.scan_client() {
                                Ok(Some(ev)) => return Poll::Ready(ev),
                                Ok(None) => {}
                                Err(e) => return Poll::Ready(RelayEvent::ClientProtocol(e)),
                            }
                        }
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(self.server_failed(&e)),
                    Poll::Pending => server_waits = true,
                }
            }
            // While the scan waits for a round (`awaits_round`) the client's bytes wait in
            // its socket.
            if self.server.conn().out_len() < HIGH_WATER
                && !self.rescan_client
                && self.refused.is_none()
                && !client_waits
            {
                match self.client.poll_read_more(cx) {
                    Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => {
                        return Poll::Ready(RelayEvent::ClientGone);
                    }
                    Poll::Ready(Ok(n)) => {
                        progress = true;
                        self.counts.bytes_from_client += n as u64;
                        match self.scan_client() {
                            Ok(Some(ev)) => return Poll::Ready(ev),
                            Ok(None) => {}
                            Err(e) => return Poll::Ready(RelayEvent::ClientProtocol(e)),
                        }
                    }
                    Poll::Pending => client_waits = true,
                }
            }
            if !progress {
                return Poll::Pending;
            }
        }
    }

    /// The server closed its connection (a read found its end).
    fn server_closed(&mut self) -> RelayEvent {
        // A FATAL read with the end of an earlier reply (the session sync's) is still
        // unscanned.
        if self.first_request.is_some()
            && let Some(Some(ev)) = self.first_reply()
        {
            return ev;
        }
        RelayEvent::ServerGone("server closed the connection".into())
    }

    /// A read from or a write to the server failed with `e`.
    fn server_failed(&mut self, e: &std::io::Error) -> RelayEvent {
        self.reset_before_reply(e)
            .unwrap_or_else(|| RelayEvent::ServerGone(e.to_string()))
    }

    /// The client's refused message (`refused`) is due: the server owes nothing more of
    /// what came before it, or will say nothing more without the client (a round without
    /// its Sync, COPY FROM STDIN under way).
    fn refusal_due(&mut self) -> Option<ProtoError> {
        self.refused.as_ref()?;
        let p = self.server.exchange();
        if p.unsynced() && !p.copy_in() {
            // PostgreSQL answers what it read before the bad byte, then its FATAL: a Sync of
            // pgcarpool's own gets those replies, and its ReadyForQuery ends the relay
            // (`refusal_synced`).
            self.server.conn_mut().queue_with(frontend::sync);
            self.server.note_sent(frontend::SYNC, self.virt);
            self.refusal_synced = true;
            return None;
        }
        (!self.refusal_synced && (p.ready_owed() == 0 || p.copy_in()))
            .then(|| self.refused.take())
            .flatten()
    }

    /// A whole ReadyForQuery at `at` in the server's buffer that answers pgcarpool's own
    /// Sync (`refusal_due`): settled, to be dropped (`on_status`), and the refusal is due.
    fn refusal_ready(
        &mut self,
        h: proto::Header,
        at: usize,
    ) -> Result<Option<(RelayEvent, usize)>, ProtoError> {
        if !self.refusal_synced || self.server.exchange().ready_owed() != 1 {
            return Ok(None);
        }
        self.on_reply(h, at)?;
        self.refusal_synced = false;
        let e = self
            .refused
            .take()
            .ok_or(ProtoError::Malformed("refusal"))?;
        Ok(Some((RelayEvent::ClientProtocol(e), at)))
    }

    /// The header of the client's message at `at` in its buffer, checked as PostgreSQL
    /// checks it outside COPY FROM STDIN (inside, PostgreSQL reads by its COPY rules and
    /// judges itself). None: not all here yet, or refused (`refused`: the scan stops there).
    fn client_header(&mut self, at: usize) -> Option<proto::Header> {
        if self.refused.is_some() {
            return None;
        }
        let buf = &self.client.rbuf[at..];
        let next = if self.server.exchange().copy_in() {
            proto::header(buf, MAX_FORWARDED)
        } else {
            frontend::header(buf)
        };
        next.unwrap_or_else(|e| {
            self.refused = Some(e);
            None
        })
    }

    /// Forward what the client sent, noting what the server will owe.
    pub fn scan_client(&mut self) -> Result<Option<RelayEvent>, ProtoError> {
        let mut fwd = 0;
        let mut event = None;
        loop {
            if self.server.exchange().partial() > 0 {
                fwd += self.server.send_rest(self.client.rbuf.len() - fwd);
                if self.server.exchange().partial() > 0 {
                    break;
                }
                continue;
            }
            let Some(h) = self.client_header(fwd) else {
                break;
            };
            let avail = self.client.rbuf.len() - fwd;
            if let ControlFlow::Break(ev) = self.waits(h, avail, fwd)? {
                event = ev;
                break;
            }
            let facts = self.note_client_message(h, fwd);
            match h.tag {
                frontend::TERMINATE => {
                    event = Some(RelayEvent::ClientTerminate);
                    break;
                }
                frontend::QUERY if self.disable_pqexec => {
                    event = Some(RelayEvent::PqexecDisallowed);
                    break;
                }
                frontend::PARSE | frontend::BIND | frontend::DESCRIBE | frontend::CLOSE
                    if self.virt =>
                {
                    if !whole(h, avail)? {
                        break;
                    }
                    self.at_sync_point = !self.server.exchange().unsynced();
                    self.server.note_sent(h.tag, false);
                    let body = &self.client.rbuf[fwd + 5..fwd + h.total];
                    if super::rewrite::passes_through(
                        h.tag,
                        body,
                        self.session,
                        self.server,
                        &mut self.effects,
                    )? {
                        // Forwarded as written, within the current run.
                        fwd += h.total;
                        continue;
                    }
                    self.forward_client_run(fwd);
                    fwd = 0;
                    let msg = self.client.rbuf.split_to(h.total).freeze();
                    self.on_extended(h.tag, msg)?;
                    if let Some(why) = self.limit.take() {
                        return Ok(Some(RelayEvent::Limit(why)));
                    }
                    continue;
                }
                frontend::QUERY if self.virt => {
                    if !whole(h, avail)? {
                        break;
                    }
                    self.forward_client_run(fwd);
                    fwd = 0;
                    let msg = self.client.rbuf.split_to(h.total).freeze();
                    if self.server.exchange().ready_owed() == 0 {
                        self.query_started = Some(self.query_clock());
                    }
                    self.server.note_query();
                    self.on_query(msg, facts)?;
                    if let Some(why) = self.limit.take() {
                        return Ok(Some(RelayEvent::Limit(why)));
                    }
                    continue;
                }
                frontend::QUERY | frontend::SYNC | frontend::FUNCTION_CALL => {
                    if self.server.exchange().ready_owed() == 0 {
                        self.query_started = Some(self.query_clock());
                    }
                    self.server.note_sent(h.tag, self.virt);
                }
                frontend::EXECUTE => {
                    if self.on_execute(h, fwd) {
                        fwd = 0;
                        continue;
                    }
                }
                tag => self.server.note_sent(tag, false),
            }
            if avail < h.total {
                self.server.sent_partly(h.total - avail);
                fwd = self.client.rbuf.len();
                break;
            }
            fwd += h.total;
        }
        Ok(self.client_scanned(fwd, event))
    }

    /// Does the next client message wait for the server's answer to a round already
    /// synced? A change to the client's statements that the server may still skip (an
    /// earlier message of that round failing) never happened for PostgreSQL, so what
    /// follows the round's Sync is judged once that is known, a DEALLOCATE ALL's included.
    fn awaits_round(&self) -> bool {
        self.server
            .exchange()
            .awaits_undo(!self.session_deallocs.is_empty())
    }

    /// The client's buffer was scanned up to `fwd` (to forward), ending with `event`: does
    /// the server owe nothing now, or has pgcarpool answered a whole query itself?
    fn client_scanned(&mut self, fwd: usize, mut event: Option<RelayEvent>) -> Option<RelayEvent> {
        let forwarded = fwd > 0;
        self.forward_client_run(fwd);
        if forwarded && event.is_none() && self.mode != PoolMode::Session {
            self.owes_nothing = self.server.exchange().owes_nothing();
        }
        let before = self.client.out_len();
        if self.virt && self.answer_front() && event.is_none() {
            // pgcarpool answered a whole query itself: the server may be free again.
            if self.server.exchange().owes_nothing() && self.mode != PoolMode::Session {
                self.xact_started = None;
                event = Some(RelayEvent::Release);
            }
        }
        // Only pgcarpool's answers queued, and the server's reply sure to follow (a
        // ReadyForQuery owed): written with that reply (`scan_server` ends the hold).
        self.hold_answers = before == 0
            && self.client.out_len() > 0
            && event.is_none()
            && self.server.exchange().ready_owed() > 0;
        if let Some(RelayEvent::ClientTerminate) = event {
            self.client.consume(5);
        }
        event
    }

    /// What each client message does besides its forwarding: kept for a replay, what it
    /// may do to the transaction, the first request kept, the transaction's timers.
    /// `fwd`: where it starts in the client's buffer.
    /// Returns a whole Query's facts (found once, here).
    fn note_client_message(&mut self, h: proto::Header, fwd: usize) -> Option<Facts> {
        let buf = &self.client.rbuf;
        let avail = buf.len() - fwd;
        let facts = query_facts(h, &buf[fwd..]);
        if let Some(r) = &mut self.replay
            && !r.complete
        {
            // Kept as sent, up to the Sync (the Bind itself is kept by on_extended).
            if avail < h.total
                || r.msgs.len() + h.total > MAX_REPLAY
                || matches!(
                    h.tag,
                    frontend::QUERY | frontend::PARSE | frontend::TERMINATE
                )
            {
                self.replay = None;
            } else {
                r.msgs.extend_from_slice(&buf[fwd..fwd + h.total]);
                r.complete = h.tag == frontend::SYNC;
            }
        }
        if self.hold_ready && h.tag == frontend::BIND && avail >= h.total {
            // A Bind of the unnamed statement parsed in an earlier transaction: its text
            // decides whether this one may notify (long-run seeds 14178, 14207).
            self.effects.notify |= binds_unnamed_notify(&buf[fwd + 5..fwd + h.total], self.session);
        }
        if self.keep_client && matches!(h.tag, frontend::QUERY | frontend::PARSE | frontend::BIND) {
            let (b, c) = if let Some(f) = &facts {
                f.control
            } else if avail >= h.total {
                in_flight(h.tag, &buf[fwd + 5..fwd + h.total], self.session)
            } else {
                // Seen whole later (virtual statements), or streamed unseen: may commit.
                (false, !self.virt && h.tag != frontend::BIND)
            };
            self.flight = (self.flight.0 || b, self.flight.1 || c);
        }
        if let Some(k) = &mut self.first_request {
            let whole = avail >= h.total && k.msgs.len() + h.total <= MAX_REPLAY;
            if whole
                && h.tag == frontend::QUERY
                && (k.standby || facts.is_some_and(|f| f.replay_safe))
            {
                k.msgs.extend_from_slice(&buf[fwd..fwd + h.total]);
                k.sent.get_or_insert_with(Instant::now);
            } else {
                self.first_request = None;
            }
        }
        self.idle_in_xact_since = None;
        if self.xact_started.is_none() && self.mode != PoolMode::Session {
            // The clock as read at the transaction's start (`transaction`).
            self.xact_started = Some(crate::stats::clock::recent());
        }
        facts
    }

    /// Does the client's message at `fwd` (`avail` bytes of it there) wait before it is
    /// scanned (Break, with the event that ends the relay, if any)?
    fn waits(
        &mut self,
        h: proto::Header,
        avail: usize,
        fwd: usize,
    ) -> Result<ControlFlow<Option<RelayEvent>>, ProtoError> {
        if self.virt && self.awaits_round() {
            // Scanned again once the server's replies came (`rescan_client`).
            self.rescan_client = true;
            return Ok(ControlFlow::Break(None));
        }
        if self.reads_only {
            return self.hold_write(h, avail, fwd);
        }
        Ok(ControlFlow::Continue(()))
    }

    /// Read routing, on a standby: a Query, Parse or Bind at `fwd` in the client's buffer
    /// (`avail` bytes of it there), looked at once whole (Break(None) until then). One
    /// that only reads (or the transaction's first, which routing judged) goes on
    /// (Continue); one that may write waits while the standby owes replies (Break(None):
    /// scanned again once they came), is left for the primary once the standby is idle
    /// outside a block (Break(Release)), and goes on inside a block or an unsynced
    /// extended-protocol round (the transaction is the standby's).
    fn hold_write(
        &mut self,
        h: proto::Header,
        avail: usize,
        fwd: usize,
    ) -> Result<ControlFlow<Option<RelayEvent>>, ProtoError> {
        if !matches!(h.tag, frontend::QUERY | frontend::PARSE | frontend::BIND) {
            return Ok(ControlFlow::Continue(()));
        }
        if !whole(h, avail)? {
            return Ok(ControlFlow::Break(None));
        }
        Ok(self.hold_whole(h, fwd))
    }

    /// The whole Query, Parse or Bind at `fwd`.
    fn hold_whole(&mut self, h: proto::Header, fwd: usize) -> ControlFlow<Option<RelayEvent>> {
        let body = &self.client.rbuf[fwd + 5..fwd + h.total];
        // Simple queries kept for a replay may call functions: a refusal runs them again.
        let calls = self.first_request.is_some();
        let first = !std::mem::replace(&mut self.requested, true);
        if first || reads(h.tag, body, self.session, calls) {
            return ControlFlow::Continue(());
        }
        let x = self.server.exchange();
        if x.unsynced() {
            self.reads_only = false;
            return ControlFlow::Continue(());
        }
        if !x.is_idle_but_status() {
            self.rescan_client = true;
            return ControlFlow::Break(None);
        }
        if x.tx_status() == b'I' {
            return ControlFlow::Break(Some(RelayEvent::Release));
        }
        self.reads_only = false;
        ControlFlow::Continue(())
    }

    /// An Execute at `fwd` in the client's buffer (whole or not), forwarded as written.
    /// True: it ran a DISCARD ALL, and the client's buffer up to its end was forwarded
    /// with the startup values after it (the scan goes on from the buffer's start).
    fn on_execute(&mut self, h: proto::Header, fwd: usize) -> bool {
        let buf = &self.client.rbuf;
        let avail = buf.len() - fwd;
        if self.virt && self.session.ext.tx_portal.is_some() {
            // Messages after it are judged by the status it leaves.
            let body = &buf[fwd + 5..buf.len().min(fwd + h.total)];
            if let Some(portal) = body.split(|&c| c == 0).next()
                && body.contains(&0)
                && let Some(e) = self.session.executed(portal)
            {
                self.server.sent_tx_effect(e);
            }
        }
        if self.virt && self.session.ext.retag_portal && buf.get(fwd + 5) == Some(&0) {
            // The unnamed portal runs a RESET sent as a SET.
            self.server.expect(Pending::Retag(true));
        }
        self.server.note_sent(h.tag, self.virt);
        if self.virt && !self.session.ext.deallocating_portals.is_empty() {
            let body = buf.get(fwd + 5..fwd + h.total.min(avail)).unwrap_or(&[]);
            if let Ok(portal) = proto::Reader::new(body, "Execute").cstr_bytes() {
                let portal = Bytes::copy_from_slice(portal);
                self.executing(&portal);
            }
        }
        if self.virt && self.listen_after_execute(h, fwd) {
            return true;
        }
        if self.virt
            && avail >= h.total
            && self.session.ext.discard_portal.as_deref().is_some_and(|d| {
                let body = &self.client.rbuf[fwd + 5..fwd + h.total];
                body.split(|&c| c == 0).next() == Some(d)
            })
        {
            // Its startup values follow the client's DISCARD ALL at once.
            self.session.ext.discard_portal = None;
            self.forward_client_run(fwd + h.total);
            self.startup_after_discard(true);
            return true;
        }
        false
    }

    /// A whole Execute at `fwd` of a portal bound to a LISTEN or UNLISTEN of a channel the
    /// client listens on through the pool's listener (`notify::after_execute`): forwarded
    /// with the client's buffer up to its end, followed within the round by pgcarpool's
    /// record of it (its replies dropped), true. False: nothing done.
    fn listen_after_execute(&mut self, h: proto::Header, fwd: usize) -> bool {
        let buf = &self.client.rbuf;
        if self.session.ext.listen_portal.is_none() || buf.len() - fwd < h.total {
            return false;
        }
        let body = &buf[fwd + 5..fwd + h.total];
        let Some(text) = body
            .split(|&c| c == 0)
            .next()
            .and_then(|portal| self.session.executed_listen(portal))
        else {
            return false;
        };
        let n = self.listen_in_block.len() + 1;
        let Some((stmts, op)) = super::notify::after_execute(&text, &self.listener_channels, n)
        else {
            return false;
        };
        self.forward_client_run(fwd + h.total);
        for sql in &stmts {
            self.statement_within_round(sql);
        }
        self.server.note_sent(frontend::EXECUTE, false);
        self.listen_in_block.push(op);
        true
    }

    fn forward_client_run(&mut self, n: usize) {
        if n > 0 {
            let chunk = self.client.rbuf.split_to(n).freeze();
            self.server.conn_mut().queue(chunk);
        }
    }

    fn forward_server_run(&mut self, n: usize) {
        if n > 0 {
            let chunk = self.server.conn_mut().rbuf.split_to(n).freeze();
            self.client.queue(chunk);
        }
    }

    /// Forward what the server sent, keeping its state and the client's session current.
    pub fn scan_server(&mut self) -> Result<Option<RelayEvent>, ProtoError> {
        self.hold_answers = false;
        if self.first_request.is_some()
            && let Some(ev) = self.first_reply()
        {
            return Ok(ev);
        }
        let mut fwd = 0;
        let mut withheld = 0;
        let mut event = None;
        // Where the ParameterStatus messages right before `fwd` begin, if any.
        let mut params_at = None;
        loop {
            if self.virt && self.server.exchange().answer_due() {
                self.forward_server_run(fwd);
                fwd = 0;
                params_at = None;
                self.answer_front();
            }
            let buf = &self.server.conn().rbuf;
            if self.server_partial > 0 {
                params_at = None;
                if stream_partial(&mut self.server_partial, &mut fwd, buf.len()) {
                    break;
                }
                continue;
            }
            let Some(h) = proto::header(&buf[fwd..], MAX_FORWARDED)? else {
                break;
            };
            let avail = buf.len() - fwd;
            if !matches!(h.tag, backend::PARAMETER_STATUS | backend::READY_FOR_QUERY) {
                params_at = None;
            }
            if self.virt && (self.server.exchange().swallowing(h.tag) || self.learns(h.tag)) {
                // Replies to a query or a Describe pgcarpool added: none reach the client.
                if !inspectable(h, avail)? {
                    break;
                }
                self.swallow(h, fwd)?;
                fwd = 0;
                params_at = None;
                continue;
            }
            match h.tag {
                backend::NOTIFICATION_RESPONSE => {
                    if !inspectable(h, avail)? {
                        break;
                    }
                    let (server_pid, client_pid) = (self.server.key().0, self.session.backend_pid);
                    let msg = &mut self.server.conn_mut().rbuf[fwd..fwd + h.total];
                    crate::server::rewrite_notification_pid(msg, server_pid, client_pid);
                    fwd += h.total;
                }
                backend::READY_FOR_QUERY
                | backend::PARAMETER_STATUS
                | backend::COPY_IN_RESPONSE => {
                    if !inspectable(h, avail)? {
                        break;
                    }
                    fwd += h.total;
                    if let Some((ev, kept)) = self.on_status(h, fwd - h.total, &mut params_at)? {
                        withheld = fwd - kept;
                        fwd = kept;
                        event = Some(ev);
                        break;
                    }
                }
                backend::ERROR_RESPONSE
                    if self.virt || (avail >= h.total && h.total <= MAX_INSPECTED) =>
                {
                    if !inspectable(h, avail)? {
                        break;
                    }
                    match self.on_error(h, fwd)? {
                        ControlFlow::Continue(at) => fwd = at,
                        ControlFlow::Break(ev) => return Ok(Some(ev)),
                    }
                }
                // Looked at whole: it may be a FATAL the client is not to see.
                backend::ERROR_RESPONSE if self.keep_client && h.total <= MAX_INSPECTED => break,
                _ => match self.on_other_reply(h, fwd, avail)? {
                    ControlFlow::Continue(at) => fwd = at,
                    ControlFlow::Break(at) => {
                        fwd = at;
                        break;
                    }
                },
            }
        }
        self.forward_server_run(fwd);
        self.server.conn_mut().consume(withheld);
        if self.virt && withheld == 0 && self.server.exchange().answer_due() {
            // pgcarpool's answers to what the client sent after the ReadyForQuery that
            // ended the scan (a DEALLOCATE pipelined after a Sync): due before a release.
            self.answer_front();
        }
        Ok(event)
    }

    /// A whole ReadyForQuery, ParameterStatus or CopyInResponse at `at` in the server's
    /// buffer (`params_at`: where the ParameterStatus messages right before it begin): the
    /// event that ends the relay with a ReadyForQuery, and where in the buffer what is
    /// kept back from the client starts (the ReadyForQuery and those ParameterStatus
    /// messages, `withheld_params`, or nothing: its end).
    fn on_status(
        &mut self,
        h: proto::Header,
        at: usize,
        params_at: &mut Option<usize>,
    ) -> Result<Option<(RelayEvent, usize)>, ProtoError> {
        let body = &self.server.conn().rbuf[at + 5..at + h.total];
        match h.tag {
            backend::READY_FOR_QUERY => {
                let status = *body.first().ok_or(ProtoError::Malformed("ReadyForQuery"))?;
                if let Some(refusal) = self.refusal_ready(h, at)? {
                    return Ok(Some(refusal));
                }
                let Some((ev, withhold)) = self.on_ready(h, at, status)? else {
                    return Ok(None);
                };
                if !withhold {
                    return Ok(Some((ev, at + h.total)));
                }
                let from = params_at.unwrap_or(at);
                self.withheld_params = Bytes::copy_from_slice(&self.server.conn().rbuf[from..at]);
                Ok(Some((ev, from)))
            }
            backend::PARAMETER_STATUS => {
                params_at.get_or_insert(at);
                let (k, v) = backend::parse_parameter_status(body)?;
                self.session.observe_parameter(k, v);
                self.on_reply(h, at)?;
                Ok(None)
            }
            _ => {
                self.on_reply(h, at)?;
                Ok(None)
            }
        }
    }

    /// A whole ErrorResponse at `fwd` in the server's buffer: the server's exchange
    /// settles it; the client gets it (with its own statement names), a replacement, or
    /// nothing (a stale statement's round sent again). The run's new end, or the event
    /// that ends the relay (a FATAL the client is not to see).
    fn on_error(
        &mut self,
        h: proto::Header,
        mut fwd: usize,
    ) -> Result<ControlFlow<RelayEvent, usize>, ProtoError> {
        let body = &self.server.conn().rbuf[fwd + 5..fwd + h.total];
        let code = backend::error_code(body);
        // The message it answers (`Renamed::restore`), before `on_reply` settles it.
        let front = self.server.exchange().owed_front();
        if self.begin_seq == Some(front.0) {
            // The BEGIN the client was told had run failed (a primary refuses none of
            // those pgcarpool answers; a server out of resources might): the client gets
            // the error and goes, and the server is closed.
            self.forward_server_run(fwd + h.total);
            return Ok(ControlFlow::Break(RelayEvent::ClientFatal(
                "the transaction's BEGIN failed on the server".into(),
            )));
        }
        if let Some(why) = fatal_caused_by_client(body, self.may_terminate_itself()) {
            // Forwarded as it is: the session is over, as it is straight on PostgreSQL.
            self.forward_server_run(fwd + h.total);
            return Ok(ControlFlow::Break(RelayEvent::ClientFatal(why)));
        }
        if let Some(why) = self.fatal_withheld(body) {
            return Ok(ControlFlow::Break(
                self.withhold_fatal(fwd, h.total, code, why),
            ));
        }
        note_role_doubt(self.server, code);
        if self.virt && matches!(code, Some(c) if &c == b"0A000" || &c == b"XX000") {
            // Perhaps a statement parsed before a schema change ("cached plan
            // must not change result type", "cache lookup failed"): later
            // Parses of its text are parsed anew.
            self.registry.bump_generation();
        }
        // (Without virtual statements: forwarded. It may end a COPY, and the Syncs read
        // while copying in with it.)
        match self.on_reply(h, fwd)? {
            Verdict::Replace(e) => {
                self.forward_server_run(fwd);
                fwd = 0;
                self.server.conn_mut().consume(h.total);
                self.client
                    .queue_with(|b| backend::error_response(b, "ERROR", e.0, &e.1));
            }
            Verdict::Stale if self.replay_stale() => {
                // Dropped: the client's round runs again on a fresh statement.
                self.forward_server_run(fwd);
                fwd = 0;
                self.server.conn_mut().consume(h.total);
            }
            // (An error is never swallowed outside an added query.)
            Verdict::Stale | Verdict::Forward | Verdict::Swallow | Verdict::Retag => {
                let answered = self.server.exchange().answered();
                let msg = &self.server.conn().rbuf[fwd..fwd + h.total];
                let analysed = self.analysis_error(code, msg);
                let msg = analysed.as_deref().unwrap_or(msg);
                match self.renamed.restore(answered, front, msg).or(analysed) {
                    Some(restored) => {
                        self.forward_server_run(fwd);
                        fwd = 0;
                        self.server.conn_mut().consume(h.total);
                        self.client.queue(restored);
                    }
                    None => fwd += h.total,
                }
            }
        }
        Ok(ControlFlow::Continue(fwd))
    }

    /// Is a reply with this tag one to the Describe pgcarpool added in front
    /// (`Exchange::learning`)?
    fn learns(&self, tag: u8) -> bool {
        self.server.exchange().learning()
            && matches!(
                tag,
                backend::PARAMETER_DESCRIPTION | backend::ROW_DESCRIPTION | backend::NO_DATA
            )
    }

    /// A whole reply at `fwd` in the server's buffer to a query or a Describe pgcarpool
    /// added: settled (a Describe's kept as the statement's description), never forwarded
    /// (the run before it is).
    fn swallow(&mut self, h: proto::Header, fwd: usize) -> Result<(), ProtoError> {
        if self.learns(h.tag) {
            // Kept as the statement's description.
            if let Some(d) = self.server.learned(h, fwd) {
                self.session.ext.unnamed_described = Some(d);
            }
        } else {
            self.on_reply(h, fwd)?;
        }
        self.forward_server_run(fwd);
        self.server.conn_mut().consume(h.total);
        Ok(())
    }

    /// A whole ReadyForQuery (`status`) at `at` in the server's buffer: the event that
    /// ends the relay with it, if any, and whether the client is not to get it (yet).
    fn on_ready(
        &mut self,
        h: proto::Header,
        at: usize,
        status: u8,
    ) -> Result<Option<(RelayEvent, bool)>, ProtoError> {
        self.on_reply(h, at)?;
        if self.virt && self.replay.as_ref().is_some_and(|r| r.complete) {
            // The kept round is over (a replay, or no need of one).
            self.replay = None;
        }
        let Some(ev) = self.on_ready_for_query(status) else {
            return Ok(None);
        };
        // In statement mode the client gets the error instead of a ReadyForQuery saying
        // it is inside a transaction; a listening client gets it once the listener has
        // caught up.
        // So does one that listened: its channels go to the pool's listener first.
        // So does one whose transaction may have pinned it: the pin may be refused
        // (pin_pool_size, pin_mode = error), and the client is then told so instead of
        // getting it, as PostgreSQL's FATAL comes before a ReadyForQuery; one that has its
        // ReadyForQuery already reads the FATAL as a notice while idle, then "server closed
        // the connection unexpectedly" (libpq).
        let may_pin = self.effects.pin_check && self.session.pin.is_none();
        let held = matches!(ev, RelayEvent::Release)
            && ((self.hold_ready && (self.effects.notify || self.effects.discard_all))
                || ((self.effects.listen || may_pin) && self.mode != PoolMode::Session));
        if held {
            self.withheld_ready = Some(status);
        }
        let withhold = held || matches!(ev, RelayEvent::StatementModeTransaction);
        Ok(Some((ev, withhold)))
    }

    /// Any other reply at `fwd` in the server's buffer (`avail` bytes of it there):
    /// forwarded (in part: the rest streams through), swallowed or retagged. The run's new
    /// end, to go on (Continue) or to wait for more bytes (Break).
    fn on_other_reply(
        &mut self,
        h: proto::Header,
        fwd: usize,
        avail: usize,
    ) -> Result<ControlFlow<usize, usize>, ProtoError> {
        // A row, or a RowDescription that ends no Describe, changes nothing pgcarpool
        // keeps: it goes as it is, looked at no further (`Owed::passes`).
        if self.server.exchange().passes(h.tag) {
            return Ok(self.forwarded(h, fwd, avail));
        }
        if self.virt && avail < h.total && self.server.exchange().swallows_next() {
            // Dropped once it is whole (`Pending::SwallowTo`).
            if h.total > MAX_INSPECTED {
                return Err(ProtoError::TooLong(h.total));
            }
            return Ok(ControlFlow::Break(fwd));
        }
        if h.tag == backend::NOTICE_RESPONSE && self.effects.signals && h.total <= MAX_INSPECTED {
            // Looked at whole: it may be a mark of a client to signal (`sql::signal`).
            if avail < h.total {
                return Ok(ControlFlow::Break(fwd));
            }
            if self.mark_at(fwd, h.total).is_some() {
                self.signal_marked(fwd, h.total);
                return Ok(ControlFlow::Continue(0));
            }
        }
        if self.virt && h.tag == backend::COMMAND_COMPLETE {
            if h.total > MAX_INSPECTED {
                return Err(ProtoError::TooLong(h.total));
            }
            if avail < h.total {
                return Ok(ControlFlow::Break(fwd));
            }
        }
        let verdict = self.on_reply(h, fwd)?;
        if verdict == Verdict::Retag {
            self.say_reset(fwd, h.total);
            return Ok(ControlFlow::Continue(0));
        }
        if verdict == Verdict::Swallow {
            // A response to a message we added: the client never sees it.
            self.forward_server_run(fwd);
            if self.server.conn().rbuf.len() < h.total {
                return Err(ProtoError::Malformed("swallowed response"));
            }
            self.server.conn_mut().consume(h.total);
            return Ok(ControlFlow::Continue(0));
        }
        Ok(self.forwarded(h, fwd, avail))
    }

    /// A reply at `fwd` (`avail` bytes of it read) goes to the client as it is: whole, the
    /// scan goes on after it; else the rest streams as it comes (`server_partial`).
    fn forwarded(
        &mut self,
        h: proto::Header,
        fwd: usize,
        avail: usize,
    ) -> ControlFlow<usize, usize> {
        if avail < h.total {
            self.server_partial = h.total - avail;
            return ControlFlow::Break(self.server.conn().rbuf.len());
        }
        ControlFlow::Continue(fwd + h.total)
    }

    /// The clock for a query starting now: a transaction's first query (transaction
    /// mode) starts when the transaction did (the clock read then); a later one reads it.
    fn query_clock(&self) -> Instant {
        if self.mode != PoolMode::Session && self.counts.queries == 0 {
            crate::stats::clock::recent()
        } else {
            crate::stats::clock::now()
        }
    }

    fn on_ready_for_query(&mut self, status: u8) -> Option<RelayEvent> {
        let now = crate::stats::clock::now();
        if self.virt {
            self.deallocs_over();
        }
        let owed = self.server.exchange().ready_owed();
        self.counts.queries += 1;
        if owed == 0 {
            if let Some(s) = self.query_started.take() {
                self.counts.query_time_us += now.duration_since(s).as_micros() as u64;
            }
        } else {
            self.query_started = Some(now);
        }
        if status == b'I' {
            if self.xact_started.take().is_some() || self.mode == PoolMode::Session {
                self.counts.transactions += 1;
            }
            self.idle_in_xact_since = None;
        } else {
            self.xact_started.get_or_insert(now);
            if owed == 0 {
                self.idle_in_xact_since = Some(now);
            }
        }
        if !self.server.exchange().is_idle_but_status() {
            return None;
        }
        self.flight = (false, false);
        match (self.mode, status) {
            (PoolMode::Session, b'I') if self.closing => Some(RelayEvent::ConfigChanged),
            (PoolMode::Session, _) => None,
            (_, b'I') => Some(RelayEvent::Release),
            (PoolMode::Statement, _) => Some(RelayEvent::StatementModeTransaction),
            (PoolMode::Transaction, _) => None,
        }
    }
}

impl Relay<'_> {
    /// The whole NoticeResponse at `at` in the server's buffer, when it is a mark of a
    /// client for this client's query to signal (`sql::signal::marked`): the signal and
    /// that client's pid.
    #[cold]
    fn mark_at(&self, at: usize, total: usize) -> Option<(selfview::Signal, i32)> {
        let body = &self.server.conn().rbuf[at + 5..at + total];
        let field = |t| backend::error_field(body, t).unwrap_or_default();
        let severity = backend::error_field(body, b'V').unwrap_or(field(b'S'));
        signal::marked(field(b'R'), severity, field(b'M'))
    }

    /// The mark at `at` (`mark_at`): the client it names is signalled as PostgreSQL would
    /// signal it (`rewrite::signal_client`) and the mark dropped; a client that is gone,
    /// or another user's, gets PostgreSQL's WARNING instead. What came before it goes to
    /// the client.
    #[cold]
    fn signal_marked(&mut self, at: usize, total: usize) {
        let Some((kind, pid)) = self.mark_at(at, total) else {
            return;
        };
        self.forward_server_run(at);
        self.server.conn_mut().consume(total);
        let signalled = self
            .clients
            .is_some_and(|c| super::rewrite::signal_client(c, kind, pid));
        if !signalled {
            let m = format!("PID {pid} is not a PostgreSQL backend process");
            self.client.queue_with(|b| {
                backend::error_fields(b, backend::NOTICE_RESPONSE, "WARNING", "01000", &m)
            });
        }
    }
}

/// A FATAL the client's own doing caused (a message PostgreSQL could not read, a session
/// timeout the client set, with `terminates` a termination, 57P01): its SQLSTATE and
/// words. The server is not to blame and the client is not to be kept: it ends as its own
/// PostgreSQL session would.
fn fatal_caused_by_client(body: &[u8], terminates: bool) -> Option<String> {
    let code = backend::error_code(body)?;
    let terminated = terminates && &code == b"57P01";
    if !(terminated || matches!(&code, b"08P01" | b"25P03" | b"25P04" | b"57P05")) {
        return None;
    }
    let e = backend::parse_error(body).ok()?;
    (e.severity == "FATAL").then(|| format!("{} {}", e.code, e.message))
}

impl Relay<'_> {
    /// May the transaction have terminated its own server: its text names
    /// `pg_terminate_backend` (`Effects::terminates`)? A termination (57P01) is then the
    /// client's own doing and ends it, as with PostgreSQL; a termination under a
    /// transaction that does not (another session's, a fast shutdown in a switchover, or
    /// code in a function the text calls) is a lost server the client survives (`aborted`).
    fn may_terminate_itself(&self) -> bool {
        self.effects.terminates
    }

    /// The server was lost (RelayEvent::ServerGone): what the client's transaction was
    /// doing, when the client can stay (transaction pooling, not pinned, nothing that pins
    /// under way, at a message boundary both ways, at most one ReadyForQuery owed).
    pub fn loss(&self) -> Option<super::aborted::Loss> {
        let p = self.server.exchange();
        let owed = p.ready_owed() + u32::from(p.unsynced());
        if !self.keep_client
            || self.session.pin.is_some()
            || self.effects.pin_check
            || self.server_partial > 0
            || p.partial() > 0
            || p.copy_in()
            || owed > 1
        {
            return None;
        }
        Some(super::aborted::Loss {
            in_flight: owed > 0,
            ready_owed: p.ready_owed() > 0,
            status: p.tx_status(),
            begins: self.flight.0,
            commits: self.flight.1,
            fatal: self.fatal_seen,
        })
    }

    /// A FATAL from the server the client need not see (it keeps its connection, see
    /// `loss`): its SQLSTATE and words. Session timeouts the client set are its own.
    fn fatal_withheld(&self, body: &[u8]) -> Option<String> {
        if !self.keep_client {
            return None;
        }
        let e = backend::parse_error(body).ok()?;
        (matches!(e.severity.as_str(), "FATAL" | "PANIC") && self.loss().is_some())
            .then(|| format!("{} {}", e.code, e.message))
    }

    /// Forward what came before the FATAL at `at`, drop it, and stop: the server is gone.
    fn withhold_fatal(
        &mut self,
        at: usize,
        total: usize,
        code: Option<[u8; 5]>,
        why: String,
    ) -> RelayEvent {
        note_role_doubt(self.server, code);
        self.forward_server_run(at);
        self.server.conn_mut().consume(total);
        self.fatal_seen = true;
        RelayEvent::ServerGone(why)
    }

    /// The server's first message since the client's first request was kept. A FATAL
    /// 57P01 (terminated by an administrator) before any reply, soon after the request:
    /// Some(Some(TerminatedBeforeReply)), nothing of it forwarded. Some(None): wait for the
    /// rest of the message. None: the server spoke; the request is no longer kept.
    ///
    /// Why sending the request again is safe. PostgreSQL acts on a pending termination
    /// while it waits for a command (`ProcessClientReadInterrupt` with `DoingCommandRead`),
    /// also right after reading one, before running it: a backend terminated while idle
    /// sends this FATAL first and runs nothing of what it was sent. A backend terminated
    /// while it runs the request rolls the request's transaction back with the same FATAL;
    /// that is why only requests that commit nothing before their first reply are kept
    /// (`classify::replay_safe`: queries, plain data changes, the start of a transaction
    /// block; not CALL, DO, VACUUM, CREATE INDEX CONCURRENTLY…, which commit as they go),
    /// and only when the FATAL comes within `REPLAY_WINDOW`, so an administrator ending a
    /// query that had been running is not overruled. The replies of a backend come in
    /// order: a statement that ran to its end would have put its reply before the FATAL.
    fn first_reply(&mut self) -> Option<Option<RelayEvent>> {
        let standby = self.first_request.as_ref()?.standby;
        let buf = &self.server.conn().rbuf;
        let mut at = 0;
        let h = loop {
            let h = match proto::header(&buf[at..], MAX_INSPECTED) {
                Ok(Some(h)) if at + h.total <= MAX_INSPECTED => h,
                Ok(None) => return Some(None),
                _ => {
                    self.first_request = None;
                    return None;
                }
            };
            // On a standby, a refused statement may have described its rows first.
            let before_error = matches!(
                h.tag,
                backend::ROW_DESCRIPTION | backend::NOTICE_RESPONSE | backend::PARAMETER_STATUS
            );
            if !(standby && before_error) {
                break h;
            }
            if buf.len() < at + h.total {
                return Some(None);
            }
            at += h.total;
        };
        if h.tag != backend::ERROR_RESPONSE {
            self.first_request = None;
            return None;
        }
        if buf.len() < at + h.total {
            return Some(None);
        }
        let e = backend::parse_error(&buf[at + 5..at + h.total]);
        let terminated = at == 0
            && e.as_ref()
                .is_ok_and(|e| e.severity == "FATAL" && e.code == "57P01");
        let refused = standby && e.is_ok_and(|e| e.code == "25006");
        let kept = self.first_request.take()?;
        if refused {
            return Some(Some(RelayEvent::RefusedOnStandby(kept.msgs)));
        }
        // (Nothing kept and nothing sent: the client's bytes had not all come yet.)
        let prompt = kept.sent.is_none_or(|t| t.elapsed() <= REPLAY_WINDOW);
        if terminated && prompt {
            return Some(Some(RelayEvent::TerminatedBeforeReply(kept.msgs)));
        }
        None
    }

    /// The server's connection was reset before it said anything, while one request was
    /// kept: TerminatedBeforeReply. A reset (not a close) means the backend ended with
    /// bytes of ours it had not read — a backend terminated while idle whose FATAL the
    /// reset made the kernel drop — or ended before they came: either way it never had
    /// the whole of the one message it was sent, so ran nothing of it.
    fn reset_before_reply(&mut self, e: &std::io::Error) -> Option<RelayEvent> {
        let reset = matches!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
        );
        if !reset {
            return None;
        }
        if !self.server.conn().rbuf.is_empty() {
            // What the server said before the reset, read with the end of an earlier reply
            // (the session sync's) and not scanned yet: its FATAL, perhaps.
            return self.first_request.is_some().then(|| self.first_reply())??;
        }
        let kept = self.first_request.take()?;
        let one = proto::header(&kept.msgs, MAX_REPLAY)
            .ok()
            .flatten()
            .is_some_and(|h| h.total == kept.msgs.len());
        let prompt = kept.sent.is_none_or(|t| t.elapsed() <= REPLAY_WINDOW);
        ((one || kept.msgs.is_empty()) && prompt)
            .then(|| RelayEvent::TerminatedBeforeReply(kept.msgs))
    }

    /// The whole CommandComplete after the run of `fwd` bytes answers a RESET pgcarpool
    /// sent as a SET (`Verdict::Retag`): the client gets it as RESET.
    fn say_reset(&mut self, fwd: usize, total: usize) {
        self.forward_server_run(fwd);
        self.server.conn_mut().consume(total);
        self.client
            .queue_with(|b| backend::command_complete(b, "RESET"));
    }
}

/// What the relay needs of the text of a whole Query (`msg` from its header on), found once.
fn query_facts(h: proto::Header, msg: &[u8]) -> Option<Facts> {
    (h.tag == frontend::QUERY && msg.len() >= h.total)
        .then(|| Facts::of(query_text(&msg[5..h.total])))
}

/// What a Query, Parse or Bind in flight may do to the transaction: (begins a block,
/// may commit). A Bind names a statement the virtual session knows, or the unnamed one.
fn in_flight(tag: u8, body: &[u8], session: &VirtualSession) -> (bool, bool) {
    let text = |rest: &[u8]| {
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        super::classify::transaction_control(&rest[..end])
    };
    let mut r = proto::Reader::new(body, "message");
    match tag {
        frontend::QUERY => text(body),
        frontend::PARSE => match r.cstr_bytes() {
            // The client's unnamed statement again: its text was looked at.
            Ok([]) if session.ext.unnamed.as_deref() == Some(&body[1..]) => {
                session.unnamed_facts().map_or((false, true), |f| f.control)
            }
            Ok(name) => text(&body[name.len() + 1..]),
            Err(_) => (false, true),
        },
        _ => {
            let (Ok(_portal), Ok(stmt)) = (r.cstr_bytes(), r.cstr_bytes()) else {
                return (false, true);
            };
            if stmt.is_empty() {
                return session
                    .unnamed_facts()
                    .map_or((false, false), |f| f.control);
            }
            // Not known (no virtual statements): the Parse was looked at already.
            session
                .statements
                .get(stmt)
                .map_or((false, false), |s| s.control())
        }
    }
}

/// Does a Query, Parse or Bind only read (`sql::reads::is_read`; a Bind by the text of
/// the statement it names)? `calls`: unknown functions allowed.
fn reads(tag: u8, body: &[u8], session: &VirtualSession, calls: bool) -> bool {
    let mut r = proto::Reader::new(body, "message");
    match tag {
        frontend::QUERY => crate::sql::reads::is_read(body, calls),
        frontend::PARSE => match r.cstr_bytes() {
            Ok(name) => crate::sql::reads::is_read(&body[name.len() + 1..], false),
            Err(_) => false,
        },
        _ => {
            let (Ok(_portal), Ok(stmt)) = (r.cstr_bytes(), r.cstr_bytes()) else {
                return false;
            };
            let text = if stmt.is_empty() {
                session.ext.unnamed.as_deref()
            } else {
                session.statements.get(stmt).map(|s| s.parse_rest.as_ref())
            };
            text.is_some_and(|t| crate::sql::reads::is_read(t, false))
        }
    }
}

/// A Bind (`body`) of the client's unnamed statement whose text mentions NOTIFY.
fn binds_unnamed_notify(body: &[u8], session: &VirtualSession) -> bool {
    let mut r = proto::Reader::new(body, "Bind");
    let (Ok(_portal), Ok(stmt)) = (r.cstr_bytes(), r.cstr_bytes()) else {
        return false;
    };
    stmt.is_empty()
        && session.ext.unnamed.as_deref().is_some_and(|u| {
            let end = u.iter().position(|&b| b == 0).unwrap_or(u.len());
            super::classify::mentions_notify(&u[..end])
        })
}

/// An error that may mean the server's host is no longer what the pool wants (25006: a
/// write refused on a read-only host; 57P01/57P02: it is shutting down): the server is
/// closed when it comes back and its host's role checked again.
fn note_role_doubt(server: &mut Server, code: Option<[u8; 5]>) {
    if let Some(c) = code
        && matches!(&c, b"25006" | b"57P01" | b"57P02")
    {
        server.note_role_doubt(c);
    }
}

/// A client message the relay rewrites (`proto::MAX_MESSAGE_LEN` at most, else refused):
/// is all of it buffered (`avail` bytes from its start)?
fn whole(h: proto::Header, avail: usize) -> Result<bool, ProtoError> {
    if h.total > proto::MAX_MESSAGE_LEN {
        return Err(ProtoError::TooLong(h.total));
    }
    Ok(avail >= h.total)
}

/// A message the relay looks into (`MAX_INSPECTED` at most, else refused): is all of it
/// buffered (`avail` bytes from its start)?
fn inspectable(h: proto::Header, avail: usize) -> Result<bool, ProtoError> {
    if h.total > MAX_INSPECTED {
        return Err(ProtoError::TooLong(h.total));
    }
    Ok(avail >= h.total)
}

/// Take what is buffered of a message being streamed through in parts into the run
/// (`fwd`). True while the message still lacks bytes: the scan waits for more.
#[inline]
fn stream_partial(remaining: &mut usize, fwd: &mut usize, buffered: usize) -> bool {
    let n = (*remaining).min(buffered - *fwd);
    *fwd += n;
    *remaining -= n;
    *remaining > 0
}

async fn sleep_until(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}
