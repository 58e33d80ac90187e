//! The shared listener: per pool, one server connection (outside the pool's size) that
//! LISTENs on the union of its clients' channels and fans every notification out to the
//! clients listening on its channel, in the order the server sends them (commit order).
//!
//! A client's LISTEN or UNLISTEN takes effect at a point of the listener's stream: the
//! ReadyForQuery of a query the listener sends after the client asked (`LISTEN "ch"` when
//! the channel is new, an empty query otherwise). Every notification committed before the
//! client asked reaches the listener before that ReadyForQuery (PostgreSQL sends what it
//! was signalled before it says it is ready), every one committed after the client's
//! answer comes after it: the client sees exactly what a session of its own would.
use std::collections::{HashMap, VecDeque};
use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::sync::{Notify, mpsc, oneshot};

use crate::lock::Locked;
use crate::proto::{self, backend, frontend};
use crate::server::{Server, ServerError, ServerTarget, connect};

/// Why a listening client must go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InboxEnd {
    /// More than `notify_queue_limit` bytes waited for it (the limit).
    Overflow(usize),
    /// The listener's server connection ended: the server's error (SQLSTATE, message).
    Lost(String, String),
}

/// Notifications waiting for one client until it is between transactions.
pub struct Inbox {
    state: Mutex<InboxState>,
    /// Woken when something was queued or the client must go.
    pub wake: Notify,
    limit: AtomicUsize,
}

#[derive(Default)]
struct InboxState {
    queued: BytesMut,
    end: Option<InboxEnd>,
}

impl Inbox {
    pub fn new(limit: usize) -> Arc<Inbox> {
        Arc::new(Inbox {
            state: Mutex::default(),
            wake: Notify::new(),
            limit: AtomicUsize::new(limit),
        })
    }

    fn lock(&self) -> MutexGuard<'_, InboxState> {
        self.state.locked()
    }

    /// notify_queue_limit as now configured.
    pub fn set_limit(&self, limit: usize) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// What waits for the client (None: nothing, or `room` false: it has no room now), or
    /// why it must go.
    pub fn take(&self, room: bool) -> Result<Option<Bytes>, InboxEnd> {
        let mut g = self.lock();
        if let Some(end) = &g.end {
            return Err(end.clone());
        }
        if g.queued.is_empty() || !room {
            return Ok(None);
        }
        Ok(Some(std::mem::take(&mut g.queued).freeze()))
    }

    /// Bytes waiting.
    pub fn queued(&self) -> usize {
        self.lock().queued.len()
    }

    /// Queue one NotificationResponse; `sender`: the pid the sending client was given
    /// (replaces the server's). Past the limit nothing more is kept and the client is told
    /// to go.
    fn push(&self, msg: &[u8], sender: Option<i32>) {
        let mut g = self.lock();
        if g.end.is_some() {
            return;
        }
        let limit = self.limit.load(Ordering::Relaxed);
        if g.queued.len() + msg.len() > limit {
            g.queued = BytesMut::new();
            g.end = Some(InboxEnd::Overflow(limit));
        } else {
            let at = g.queued.len();
            g.queued.extend_from_slice(msg);
            if let Some(pid) = sender {
                g.queued[at + 5..at + 9].copy_from_slice(&pid.to_be_bytes());
            }
        }
        drop(g);
        self.wake.notify_one();
    }

    /// Drop the notifications waiting whose channel `keep` refuses (the client stopped
    /// listening on it before they were delivered: PostgreSQL looks at its channels when it
    /// reads a notification, not when it was sent).
    pub fn retain_channels(&self, keep: impl Fn(&[u8]) -> bool) {
        let mut g = self.lock();
        let mut kept = BytesMut::with_capacity(g.queued.len());
        let mut rest = &g.queued[..];
        while let Ok(Some(h)) = proto::header(rest, usize::MAX) {
            let Some(msg) = rest.get(..h.total) else {
                break;
            };
            let channel = msg.get(9..).and_then(|b| b.split(|&c| c == 0).next());
            if channel.is_none_or(&keep) {
                kept.extend_from_slice(msg);
            }
            rest = &rest[h.total..];
        }
        g.queued = kept;
    }

    fn fail(&self, end: InboxEnd) {
        let mut g = self.lock();
        if g.end.is_none() {
            g.queued = BytesMut::new();
            g.end = Some(end);
        }
        drop(g);
        self.wake.notify_one();
    }
}

/// What a client asks of the listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Listen(String),
    /// None: UNLISTEN *.
    Unlisten(Option<String>),
    /// Nothing but a point in the stream: notifications committed before it are through.
    Sync,
}

struct Cmd {
    client: u64,
    inbox: Option<Arc<Inbox>>,
    op: Op,
    done: Option<oneshot::Sender<Result<(), backend::ErrorFields>>>,
}

/// How the listener reaches its server (the pool's target when it starts).
#[derive(Clone)]
pub struct ListenerTarget {
    pub target: ServerTarget,
    pub db: String,
    pub id: u64,
    pub connect_timeout: Duration,
}

/// The clients listening through one pool's listener: their channels as the listener's
/// stream has applied them, and the servers their transactions run on now.
#[derive(Default)]
pub struct Listener {
    state: Mutex<HubState>,
    /// A listener connection runs (its commands channel is open).
    running: AtomicBool,
}

#[derive(Default)]
struct HubState {
    /// The running listener's commands (None: no listener).
    tx: Option<mpsc::UnboundedSender<Cmd>>,
    subs: HashMap<u64, Sub>,
    by_channel: HashMap<String, Vec<u64>>,
    /// Server pid → the client whose transaction runs there, and the pid it was given.
    claims: HashMap<i32, (u64, i32)>,
}

struct Sub {
    inbox: Arc<Inbox>,
    channels: Vec<String>,
}

impl Listener {
    fn lock(&self) -> MutexGuard<'_, HubState> {
        self.state.locked()
    }

    /// Run `op` for `client` on the listener (started if none runs) and wait until it
    /// took effect. Err: the server's error (the listener could not start, or refused).
    pub async fn ask(
        self: &Arc<Self>,
        target: impl FnOnce() -> ListenerTarget,
        client: u64,
        inbox: Option<&Arc<Inbox>>,
        op: Op,
    ) -> Result<(), backend::ErrorFields> {
        let (done, rx) = oneshot::channel();
        let cmd = Cmd {
            client,
            inbox: inbox.cloned(),
            op,
            done: Some(done),
        };
        {
            let mut g = self.lock();
            if matches!(cmd.op, Op::Sync) && g.tx.is_none() {
                return Ok(());
            }
            let tx = g.tx.get_or_insert_with(|| {
                let (tx, rx) = mpsc::unbounded_channel();
                self.running.store(true, Ordering::Relaxed);
                tokio::spawn(serve(self.clone(), rx, target()));
                tx
            });
            if tx.send(cmd).is_err() {
                return Err(lost_fields("08006", "listener connection lost"));
            }
        }
        rx.await
            .unwrap_or_else(|_| Err(lost_fields("08006", "listener connection lost")))
    }

    /// The client is gone: nothing more is delivered to it; its channels (`listened`: it
    /// asked for some) are given up.
    pub fn forget(&self, client: u64, listened: bool) {
        let mut g = self.lock();
        if let Some(sub) = g.subs.remove(&client) {
            for ch in sub.channels {
                remove_from_channel(&mut g.by_channel, &ch, client);
            }
        }
        g.claims.retain(|_, c| c.0 != client);
        if let Some(tx) = g.tx.as_ref().filter(|_| listened) {
            let _ = tx.send(Cmd {
                client,
                inbox: None,
                op: Op::Unlisten(None),
                done: None,
            });
        }
    }

    /// A listener runs for the pool (clients' transactions claim their servers then).
    pub fn is_running(&self) -> bool {
        self.running.load(Ordering::Relaxed)
    }

    /// A client's transaction runs on the server with this pid: what that server notifies
    /// carries the pid the client was given (`client_pid`), as from its own session, until
    /// `unclaim`.
    pub fn claim(&self, server_pid: i32, client: u64, client_pid: i32) {
        self.lock().claims.insert(server_pid, (client, client_pid));
    }

    pub fn unclaim(&self, server_pid: i32, client: u64) {
        let mut g = self.lock();
        if g.claims.get(&server_pid).is_some_and(|c| c.0 == client) {
            g.claims.remove(&server_pid);
        }
    }

    /// Clients with at least one channel (SHOW LISTS-like counts, tests).
    pub fn listening_clients(&self) -> usize {
        self.lock().subs.len()
    }

    /// One NotificationResponse from the listener's server, to every client on its channel.
    fn fan_out(&self, msg: &[u8]) -> Result<(), proto::ProtoError> {
        let mut r = proto::Reader::new(&msg[5..], "NotificationResponse");
        let pid = r.i32()?;
        let channel = String::from_utf8_lossy(r.cstr_bytes()?);
        let g = self.lock();
        let sender = g.claims.get(&pid).map(|c| c.1);
        if let Some(clients) = g.by_channel.get(channel.as_ref()) {
            for c in clients {
                if let Some(sub) = g.subs.get(c) {
                    sub.inbox.push(msg, sender);
                }
            }
        }
        Ok(())
    }

    /// A command reached its point in the stream: the subscriptions change there.
    fn apply(&self, cmd: &Cmd) {
        let mut g = self.lock();
        let g = &mut *g;
        match &cmd.op {
            Op::Sync => {}
            Op::Listen(ch) => {
                let Some(inbox) = &cmd.inbox else { return };
                let sub = g.subs.entry(cmd.client).or_insert_with(|| Sub {
                    inbox: inbox.clone(),
                    channels: Vec::new(),
                });
                if !sub.channels.contains(ch) {
                    sub.channels.push(ch.clone());
                    g.by_channel.entry(ch.clone()).or_default().push(cmd.client);
                }
            }
            Op::Unlisten(which) => {
                let Some(sub) = g.subs.get_mut(&cmd.client) else {
                    return;
                };
                let gone: Vec<String> = match which {
                    Some(ch) => sub.channels.iter().filter(|c| *c == ch).cloned().collect(),
                    None => std::mem::take(&mut sub.channels),
                };
                sub.channels.retain(|c| !gone.contains(c));
                if sub.channels.is_empty() {
                    g.subs.remove(&cmd.client);
                }
                for ch in gone {
                    remove_from_channel(&mut g.by_channel, &ch, cmd.client);
                }
            }
        }
    }

    /// Nothing is listened and nothing asked: the listener may end (no command can reach
    /// it any more once this says true).
    fn retire(&self, rx: &mut mpsc::UnboundedReceiver<Cmd>) -> bool {
        let mut g = self.lock();
        if !rx.is_empty() {
            return false;
        }
        g.tx = None;
        self.running.store(false, Ordering::Relaxed);
        true
    }

    /// The listener's connection ended: every listening client and every command waiting
    /// is told the server's error; the next LISTEN starts a new listener.
    fn lost(&self, rx: &mut mpsc::UnboundedReceiver<Cmd>, pending: VecDeque<Cmd>, e: &Lost) {
        let (subs, rest) = {
            let mut g = self.lock();
            g.tx = None;
            self.running.store(false, Ordering::Relaxed);
            g.by_channel.clear();
            rx.close();
            let mut rest = Vec::new();
            while let Ok(c) = rx.try_recv() {
                rest.push(c);
            }
            (std::mem::take(&mut g.subs), rest)
        };
        for (_, sub) in subs {
            sub.inbox.fail(InboxEnd::Lost(e.0.clone(), e.1.clone()));
        }
        for cmd in pending.into_iter().chain(rest) {
            if let Some(done) = cmd.done {
                let _ = done.send(Err(lost_fields(&e.0, &e.1)));
            }
        }
    }
}

fn remove_from_channel(by_channel: &mut HashMap<String, Vec<u64>>, ch: &str, client: u64) {
    if let Some(v) = by_channel.get_mut(ch) {
        v.retain(|c| *c != client);
        if v.is_empty() {
            by_channel.remove(ch);
        }
    }
}

fn lost_fields(code: &str, message: &str) -> backend::ErrorFields {
    backend::ErrorFields {
        severity: "ERROR".into(),
        code: code.into(),
        message: message.into(),
    }
}

/// The server's words when the listener's connection ended (SQLSTATE, message).
struct Lost(String, String);

impl Lost {
    fn from_server(e: &ServerError) -> Lost {
        match e {
            ServerError::Rejected(f) => Lost(f.code.clone(), f.message.clone()),
            other => Lost("08006".into(), format!("server connection lost: {other}")),
        }
    }
}

/// What the listener's server listens on, as the commands sent so far leave it.
#[derive(Default)]
struct Plan {
    /// Channels per client, in the order listened.
    clients: HashMap<u64, Vec<String>>,
    /// Clients per channel.
    channels: HashMap<String, usize>,
}

impl Plan {
    /// The query that makes the server fit after `op` (empty: nothing to change, the
    /// query only marks the point).
    fn sql(&mut self, client: u64, op: &Op) -> String {
        let mut sql = String::new();
        match op {
            Op::Sync => {}
            Op::Listen(ch) => {
                let mine = self.clients.entry(client).or_default();
                if !mine.contains(ch) {
                    mine.push(ch.clone());
                    let n = self.channels.entry(ch.clone()).or_default();
                    *n += 1;
                    if *n == 1 {
                        sql = format!("LISTEN {}", quote_ident(ch));
                    }
                }
            }
            Op::Unlisten(which) => {
                let mine = self.clients.remove(&client).unwrap_or_default();
                let (gone, kept): (Vec<String>, Vec<String>) = mine
                    .into_iter()
                    .partition(|c| which.as_ref().is_none_or(|w| w == c));
                if !kept.is_empty() {
                    self.clients.insert(client, kept);
                }
                for ch in gone {
                    if let Some(n) = self.channels.get_mut(&ch) {
                        *n -= 1;
                        if *n == 0 {
                            self.channels.remove(&ch);
                            sql.push_str(&format!("UNLISTEN {};", quote_ident(&ch)));
                        }
                    }
                }
            }
        }
        sql
    }

    /// A LISTEN the server refused: as if it had not been asked.
    fn refused(&mut self, client: u64, op: &Op) {
        if let Op::Listen(_) = op {
            self.sql(client, &Op::Unlisten(None));
        }
    }
}

/// A channel name as a quoted identifier.
pub fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// The listener's task: connect, then send the clients' commands and read the server's
/// stream until nothing is listened (or the connection ends).
async fn serve(hub: Arc<Listener>, mut rx: mpsc::UnboundedReceiver<Cmd>, t: ListenerTarget) {
    let mut server = match connect::connect(&t.target, &t.db, t.id, t.connect_timeout).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(server = t.id, db = %t.db, "listener connection failed: {e}");
            hub.lost(&mut rx, VecDeque::new(), &Lost::from_server(&e));
            return;
        }
    };
    tracing::debug!(server = server.id(), db = %t.db, "listener connection open");
    let mut plan = Plan::default();
    let mut pending: VecDeque<Cmd> = VecDeque::new();
    let end = loop {
        if pending.is_empty() && plan.channels.is_empty() && hub.retire(&mut rx) {
            break None;
        }
        tokio::select! {
            cmd = rx.recv() => {
                let Some(cmd) = cmd else { break None };
                let sql = plan.sql(cmd.client, &cmd.op);
                server.conn_mut().queue_with(|b| frontend::query(b, &sql));
                pending.push_back(cmd);
            }
            r = poll_fn(|cx| {
                if server.conn().out_pending()
                    && let Poll::Ready(Err(e)) = server.conn_mut().poll_write_out(cx)
                {
                    return Poll::Ready(Err(e));
                }
                server.conn_mut().poll_read_more(cx)
            }) => {
                let why = match r {
                    Ok(0) => Some(Lost("08006".into(), "server closed the connection unexpectedly".into())),
                    Ok(_) => read_stream(&hub, &mut server, &mut plan, &mut pending).err(),
                    Err(e) => Some(Lost("08006".into(), format!("server connection lost: {e}"))),
                };
                if let Some(why) = why {
                    break Some(why);
                }
            }
        }
    };
    match end {
        None => tracing::debug!(
            server = server.id(),
            "listener connection closed: nothing listened"
        ),
        Some(why) => {
            tracing::warn!(server = server.id(), db = %t.db, "listener connection lost: {}", why.1);
            hub.lost(&mut rx, pending, &why);
        }
    }
}

/// Everything whole in the listener's read buffer: notifications fanned out, each
/// ReadyForQuery the point where the oldest command takes effect. Err: the connection is
/// over (a FATAL error, a broken message).
fn read_stream(
    hub: &Listener,
    server: &mut Server,
    plan: &mut Plan,
    pending: &mut VecDeque<Cmd>,
) -> Result<(), Lost> {
    let broken = |e: proto::ProtoError| Lost("08P01".into(), format!("server protocol error: {e}"));
    let mut refused: Option<backend::ErrorFields> = None;
    while let Some(h) =
        proto::header(&server.conn_mut().rbuf, proto::MAX_MESSAGE_LEN).map_err(broken)?
    {
        if server.conn().rbuf.len() < h.total {
            break;
        }
        let msg = &server.conn_mut().rbuf[..h.total];
        match h.tag {
            backend::NOTIFICATION_RESPONSE => hub.fan_out(msg).map_err(broken)?,
            backend::ERROR_RESPONSE => {
                let e = backend::parse_error(&msg[5..]).map_err(broken)?;
                if e.severity == "FATAL" || e.severity == "PANIC" {
                    return Err(Lost(e.code, e.message));
                }
                refused.get_or_insert(e);
            }
            backend::READY_FOR_QUERY => {
                let Some(cmd) = pending.pop_front() else {
                    return Err(Lost("08P01".into(), "unexpected ReadyForQuery".into()));
                };
                let outcome = match refused.take() {
                    None => {
                        hub.apply(&cmd);
                        Ok(())
                    }
                    Some(e) => {
                        plan.refused(cmd.client, &cmd.op);
                        Err(e)
                    }
                };
                if let Some(done) = cmd.done {
                    let _ = done.send(outcome);
                }
            }
            _ => {}
        }
        server.conn_mut().consume(h.total);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_listens_while_one_client_does() {
        let mut p = Plan::default();
        assert_eq!(p.sql(1, &Op::Listen("a".into())), "LISTEN \"a\"");
        assert_eq!(p.sql(2, &Op::Listen("a".into())), "");
        assert_eq!(p.sql(1, &Op::Listen("a".into())), "");
        assert_eq!(p.sql(1, &Op::Unlisten(Some("a".into()))), "");
        assert_eq!(p.sql(1, &Op::Unlisten(Some("a".into()))), "");
        assert_eq!(p.sql(2, &Op::Listen("b\"c".into())), "LISTEN \"b\"\"c\"");
        assert_eq!(
            p.sql(2, &Op::Unlisten(None)),
            "UNLISTEN \"a\";UNLISTEN \"b\"\"c\";"
        );
        assert!(p.channels.is_empty() && p.clients.is_empty());
    }

    #[test]
    fn an_inbox_past_its_limit_ends_the_client() {
        let inbox = Inbox::new(40);
        let mut msg = BytesMut::new();
        msg.extend_from_slice(&[b'A', 0, 0, 0, 17, 0, 0, 0, 5]);
        msg.extend_from_slice(b"ch\0pl\0");
        assert_eq!(msg.len(), 15);
        inbox.push(&msg, Some(77));
        let got = inbox.take(true).unwrap().unwrap();
        assert_eq!(&got[5..9], &77i32.to_be_bytes());
        inbox.push(&msg, None);
        inbox.push(&msg, None);
        assert_eq!(inbox.queued(), 30);
        inbox.push(&msg, None);
        assert_eq!(inbox.take(false), Err(InboxEnd::Overflow(40)));
    }
}
