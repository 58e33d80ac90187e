//! Online restart without SO_REUSEPORT, as PgBouncer's `-R`, and sessions that move.
//!
//! The new process (`-R`) logs in to the running one's console over its Unix socket as user
//! `pgbouncer` (same OS user: no password), sends `SUSPEND` (the old one stops accepting
//! and stops reading idle clients), then `SHOW FDS`: the rows name the listening sockets
//! and the descriptors come with them (SCM_RIGHTS). It starts on those sockets, then sends
//! `HANDOVER`: the old process closes its copies of the listeners (without accepting what
//! is queued: that is the new one's now), resumes its clients, and from then on sends every
//! client that is idle between transactions down the same connection: one frame per
//! client, `M` + length + the serialized session (`session.rs`), the client's socket
//! attached; the new process answers `Y` (it runs the client now) or `N` (the client stays).
//! Clients in a transaction move when it ends; pinned clients (temp tables, LISTEN…),
//! session-mode clients and clients the new process refused stay until they leave. The old
//! process exits once no client of its own is left.
pub mod session;

use std::collections::VecDeque;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Buf, Bytes};
use tokio::sync::{mpsc, oneshot, watch};

use crate::app::Shared;
use crate::client::Client;
use crate::config::{PoolMode, Settings};
use crate::net::fdpass;
use crate::net::listen::{Bound, SocketFile};
use crate::net::{Conn, Stream};
use crate::server::{Credential, Params};
use session::{MovedSession, StayingClient, Transport};

/// Where a pooler is in an online restart (the old process's side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Running,
    /// SUSPEND: nothing is accepted, idle clients are not read.
    Suspended,
    /// HANDOVER: the listeners are the new process's; idle clients move to it.
    HandingOver,
}

/// The online-restart phase as an idle client sees it: one receiver for the client's whole
/// life, read only when it changed (an atomic load per wait, no lock).
pub struct PhaseWatch {
    rx: watch::Receiver<Phase>,
    now: Phase,
}

impl PhaseWatch {
    pub fn current(&mut self) -> Phase {
        if self.rx.has_changed().unwrap_or(false) {
            self.now = *self.rx.borrow_and_update();
        }
        self.now
    }

    /// Resolves when the phase changes (never once the sender is gone).
    pub async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        // `changed` marked the value seen: `current` would not see it change.
        self.now = *self.rx.borrow_and_update();
    }
}

/// A client on its way to the new process: its session, its socket, and where to say
/// whether the new process took it.
struct Outgoing {
    session: Vec<u8>,
    fd: OwnedFd,
    taken: oneshot::Sender<bool>,
}

/// Online-restart state in `Shared`.
pub struct Restart {
    phase: watch::Sender<Phase>,
    /// Descriptors of the listening sockets, for SHOW FDS.
    sockets: Mutex<Vec<Bound>>,
    /// Set at HANDOVER: the connection to the new process takes clients from here.
    outbox: OnceLock<mpsc::Sender<Outgoing>>,
    /// Set at HANDOVER: the new process has these very listening sockets (SHOW FDS), so
    /// they close here without accepting what is queued; otherwise (SO_REUSEPORT) this
    /// process's own sockets accept their queue first, as on SIGTERM.
    sockets_passed: std::sync::atomic::AtomicBool,
    /// New process: the clients still with the old one (SHOW CLIENTS lists them).
    staying: Mutex<Vec<StayingClient>>,
    /// New process: cancel requests for those clients go to the old one through here.
    cancels: Mutex<Option<mpsc::UnboundedSender<(i32, i32)>>>,
}

impl Default for Restart {
    fn default() -> Self {
        Restart {
            phase: watch::Sender::new(Phase::Running),
            sockets: Mutex::new(Vec::new()),
            outbox: OnceLock::new(),
            sockets_passed: Default::default(),
            staying: Mutex::new(Vec::new()),
            cancels: Mutex::new(None),
        }
    }
}

impl Restart {
    pub fn phase(&self) -> Phase {
        *self.phase.borrow()
    }
    pub fn subscribe(&self) -> watch::Receiver<Phase> {
        self.phase.subscribe()
    }
    pub fn watch(&self) -> PhaseWatch {
        let mut rx = self.phase.subscribe();
        let now = *rx.borrow_and_update();
        PhaseWatch { rx, now }
    }
    /// SUSPEND: false when a handover has begun (nothing to suspend any more).
    pub fn suspend(&self) -> bool {
        self.phase.send_if_modified(|p| match p {
            Phase::Running => {
                *p = Phase::Suspended;
                true
            }
            _ => false,
        });
        self.phase() == Phase::Suspended
    }
    /// RESUME after SUSPEND.
    pub fn resume(&self) {
        self.phase.send_if_modified(|p| match p {
            Phase::Suspended => {
                *p = Phase::Running;
                true
            }
            _ => false,
        });
    }
    /// HANDOVER came after SHOW FDS: the listening sockets are the new process's too.
    pub fn sockets_passed(&self) -> bool {
        self.sockets_passed.load(Ordering::Relaxed)
    }

    /// New process: the clients still with the old process.
    pub fn staying(&self) -> Vec<StayingClient> {
        self.staying
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// New process: a cancel request for a client still with the old process goes there.
    /// False: no such client.
    pub fn forward_cancel(&self, key: (i32, i32)) -> bool {
        if !self
            .staying
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|c| c.key == key)
        {
            return false;
        }
        let g = self.cancels.lock().unwrap_or_else(|e| e.into_inner());
        g.as_ref().is_some_and(|tx| tx.send(key).is_ok())
    }

    /// Keep a descriptor of each listening socket (SHOW FDS passes them).
    pub fn keep_sockets(&self, socks: Vec<Bound>) {
        *self.sockets.lock().unwrap_or_else(|e| e.into_inner()) = socks;
    }
    /// The listening sockets: (duplicate descriptor, addr text, port).
    fn listening(&self) -> Vec<(OwnedFd, String, Option<u16>)> {
        let g = self.sockets.lock().unwrap_or_else(|e| e.into_inner());
        g.iter()
            .filter_map(|b| {
                let (fd, addr, port) = match b {
                    Bound::Tcp(l) => {
                        let a = l.local_addr().ok()?;
                        (
                            OwnedFd::from(l.try_clone().ok()?),
                            a.ip().to_string(),
                            Some(a.port()),
                        )
                    }
                    Bound::Unix(l, _) => {
                        (OwnedFd::from(l.try_clone().ok()?), "unix".to_string(), None)
                    }
                };
                Some((fd, addr, port))
            })
            .collect()
    }
}

/// SHOW FDS: one row per listening socket (task `pooler`), with PgBouncer's columns; the
/// descriptors to pass with the rows when the caller may have them (and the pooler is
/// suspended), else none.
pub fn show_fds(shared: &Shared, pass: bool) -> (crate::admin::Table, Vec<OwnedFd>) {
    use crate::admin::table::Cell;
    let mut t = crate::admin::show::fds();
    let mut fds = Vec::new();
    let pass = pass && shared.restart.phase() == Phase::Suspended;
    for (fd, addr, port) in shared.restart.listening() {
        let mut row: Vec<Cell> = vec![
            i64::from(fd.as_raw_fd()).into(),
            "pooler".into(),
            Cell::Null,
            Cell::Null,
            addr.into(),
            port.into(),
            0i64.into(),
            0i64.into(),
        ];
        row.resize(t.columns.len(), Cell::Null);
        t.push(row);
        if pass {
            fds.push(fd);
        }
    }
    (t, fds)
}

/// Why a client cannot move to the new process now (None: it can).
pub fn stays_because(c: &Client) -> Option<&'static str> {
    if c.pool.settings().mode == PoolMode::Session {
        return Some("session pooling mode");
    }
    if c.session.pin.is_some() {
        return Some("pinned to its server");
    }
    if c.session.statements.values().any(|s| s.depends.is_some()) {
        return Some("a prepared statement runs another");
    }
    // Exhaustive on purpose: a new transport (TLS) must say whether it can move. A TLS
    // client's session keys cannot be carried yet: it stays (README, "Online restart").
    match &c.conn.stream {
        Stream::Tcp(_) | Stream::Unix(_) => {}
    }
    None
}

/// Move an idle client to the new process. Ok: it runs there now (this task ends without a
/// word to the client); Err: it stays here (the reason).
pub async fn hand_over(c: &mut Client) -> Result<(), String> {
    let outbox = c
        .shared
        .restart
        .outbox
        .get()
        .ok_or("no handover under way")?
        .clone();
    if c.conn.out_len() > 0 {
        c.conn.flush().await.map_err(|e| e.to_string())?;
    }
    let (fd, transport) = match &c.conn.stream {
        Stream::Tcp(s) => (
            socket2::SockRef::from(s).try_clone().map(OwnedFd::from),
            Transport::Tcp,
        ),
        Stream::Unix(s) => (
            socket2::SockRef::from(s).try_clone().map(OwnedFd::from),
            Transport::Unix,
        ),
    };
    let fd = fd.map_err(|e| format!("could not duplicate the socket: {e}"))?;
    let session = describe(c, transport).encode();
    let (taken, answer) = oneshot::channel();
    outbox
        .send(Outgoing { session, fd, taken })
        .await
        .map_err(|_| "the connection to the new process is gone".to_string())?;
    match answer.await {
        Ok(true) => Ok(()),
        Ok(false) => Err("refused by the new process".into()),
        Err(_) => Err("the connection to the new process is gone".into()),
    }
}

/// The client's session as it moves.
fn describe(c: &Client, transport: Transport) -> MovedSession {
    let h = &c.reg.handle;
    let pairs = |p: &Params| {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let scram_keys = match &c.pool.settings().target.credential {
        Credential::ScramKeys {
            client_key,
            server_key,
        } => Some((*client_key, *server_key)),
        _ => None,
    };
    MovedSession {
        transport,
        user: h.user.clone(),
        db: h.db.clone(),
        addr: h.addr.clone(),
        connect_time_us: h
            .connect_time
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0),
        key: h.key,
        params: pairs(&c.session.params),
        startup: pairs(&c.session.startup),
        statements: c
            .session
            .statements
            .iter()
            .map(|(name, s)| (name.clone(), s.parse_rest.clone()))
            .collect(),
        unnamed: c.session.unnamed.clone(),
        scram_keys,
        pending_input: Bytes::copy_from_slice(&c.conn.rbuf),
    }
}

/// HANDOVER on the console (old process): the listeners are the new process's; send it
/// every client that becomes idle, until no client of this process is left; then stop.
pub async fn serve_handover(shared: &Arc<Shared>, conn: &mut Conn) -> io::Result<()> {
    let Stream::Unix(sock) = &conn.stream else {
        return Err(io::Error::other("HANDOVER needs the Unix socket"));
    };
    let (tx, mut rx) = mpsc::channel::<Outgoing>(64);
    if shared.restart.outbox.set(tx).is_err() {
        return Err(io::Error::other("a handover is under way already"));
    }
    tracing::info!("online restart: the new process listens; handing over idle clients");
    crate::service::stopping("handing clients over to the new process");
    annotate_staying(shared);
    let passed = shared.restart.phase() == Phase::Suspended;
    shared
        .restart
        .sockets_passed
        .store(passed, Ordering::Relaxed);
    shared.restart.phase.send_replace(Phase::HandingOver);
    // Closes the TCP listeners (without accepting what is queued: see accept_loop).
    shared.stop_accepting.cancel();
    shared.restart.keep_sockets(Vec::new());
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let (mut moved, mut refused) = (0u64, 0u64);
    let mut connected = true;
    let mut inbox = Inbox::default();
    let mut last_status: Option<Vec<u8>> = None;
    loop {
        tokio::select! {
            Some(out) = rx.recv(), if connected => {
                let sent = async {
                    send_frame(sock, b'M', &out.session, Some(&out.fd)).await?;
                    // Cancel requests the new process forwards may come before the answer.
                    loop {
                        match inbox.next(sock).await? {
                            Answer::Taken(t) => return Ok::<bool, io::Error>(t),
                            Answer::Cancel(key) => cancel(shared, key),
                        }
                    }
                };
                match tokio::time::timeout(Duration::from_secs(10), sent).await {
                    Ok(Ok(taken)) => {
                        if taken { moved += 1 } else { refused += 1 }
                        let _ = out.taken.send(taken);
                    }
                    Ok(Err(e)) => {
                        tracing::warn!("online restart: lost the connection to the new process ({e}): the remaining clients stay here");
                        connected = false;
                        let _ = out.taken.send(false);
                    }
                    Err(_) => {
                        tracing::warn!("online restart: the new process did not answer: the remaining clients stay here");
                        connected = false;
                        let _ = out.taken.send(false);
                    }
                }
            }
            r = inbox.next(sock), if connected => match r {
                Ok(Answer::Cancel(key)) => cancel(shared, key),
                Ok(Answer::Taken(_)) | Err(_) => {
                    tracing::warn!("online restart: the connection to the new process ended: the remaining clients stay here");
                    connected = false;
                }
            },
            _ = tick.tick() => {
                // Console sessions (this one among them) do not keep the process: clients do.
                let clients = shared.clients.all();
                let consoles = clients.iter().filter(|c| c.db == "pgbouncer").count();
                if shared.client_conns.load(Ordering::Relaxed) <= consoles {
                    break;
                }
                if !connected {
                    // Clients waiting to move are told no.
                    while let Ok(out) = rx.try_recv() {
                        let _ = out.taken.send(false);
                    }
                    continue;
                }
                // The new process lists the clients that are still here.
                let status = session::encode_staying(&staying(&clients));
                if last_status.as_ref() != Some(&status) {
                    if let Err(e) = send_frame(sock, b'S', &status, None).await {
                        tracing::warn!("online restart: lost the connection to the new process ({e})");
                        connected = false;
                    }
                    last_status = Some(status);
                }
            }
        }
    }
    tracing::info!(
        "online restart: {moved} client(s) handed over, {refused} refused; no client left, stopping"
    );
    shared.shutdown_now();
    Ok(())
}

/// The clients of this process (console sessions aside), as the new process lists them.
fn staying(clients: &[Arc<crate::client::registry::ClientHandle>]) -> Vec<StayingClient> {
    clients
        .iter()
        .filter(|c| c.db != "pgbouncer")
        .map(|c| StayingClient {
            user: c.user.clone(),
            db: c.db.clone(),
            addr: c.addr.clone(),
            connect_time_us: c
                .connect_time
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_micros() as u64)
                .unwrap_or(0),
            key: c.key,
            note: c.handover().unwrap_or_default(),
        })
        .collect()
}

/// A cancel request the new process forwarded for a client of this one.
fn cancel(shared: &Arc<Shared>, key: (i32, i32)) {
    let clients = shared.clients.clone();
    tokio::spawn(async move { crate::client::cancel::handle(&clients, key).await });
}

/// What the new process sends back on the handover connection.
enum Answer {
    /// `Y` / `N`: whether it took the client just sent.
    Taken(bool),
    /// `C` + the key: a cancel request for a client still here.
    Cancel((i32, i32)),
}

/// Bytes read from the new process and not yet understood.
#[derive(Default)]
struct Inbox {
    buf: Vec<u8>,
}

impl Inbox {
    /// The next answer (cancel-safe: bytes read stay in the buffer).
    async fn next(&mut self, sock: &tokio::net::UnixStream) -> io::Result<Answer> {
        loop {
            match self.buf.first() {
                Some(b'Y' | b'N') => {
                    let taken = self.buf.remove(0) == b'Y';
                    return Ok(Answer::Taken(taken));
                }
                Some(b'C') if self.buf.len() >= 9 => {
                    let k = |i: usize| {
                        i32::from_be_bytes([
                            self.buf[i],
                            self.buf[i + 1],
                            self.buf[i + 2],
                            self.buf[i + 3],
                        ])
                    };
                    let key = (k(1), k(5));
                    self.buf.drain(..9);
                    return Ok(Answer::Cancel(key));
                }
                Some(b'C') | None => {}
                Some(_) => return Err(io::Error::other("unexpected bytes from the new process")),
            }
            sock.readable().await?;
            let mut chunk = [0u8; 256];
            match sock.try_read(&mut chunk) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// In SHOW CLIENTS, why each client that cannot move now stays.
fn annotate_staying(shared: &Shared) {
    let cfg = shared.config.load();
    for c in shared.clients.all() {
        if c.db == "pgbouncer" {
            continue;
        }
        let why = if c.pin().is_some() {
            "stays: pinned to its server"
        } else if cfg.pool_mode_for(&c.db, &cfg.pool_user_for(&c.db, &c.user)) == PoolMode::Session
        {
            "stays: session pooling mode"
        } else {
            "moves when idle"
        };
        c.set_handover(Some(why.to_string()));
    }
}

/// Send one frame (`tag`, length, `body`), with `fd` attached to its first byte.
async fn send_frame(
    sock: &tokio::net::UnixStream,
    tag: u8,
    body: &[u8],
    fd: Option<&OwnedFd>,
) -> io::Result<()> {
    let len = u32::try_from(body.len() + 4).map_err(io::Error::other)?;
    let mut frame = Vec::with_capacity(body.len() + 5);
    frame.push(tag);
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(body);
    let raw: Vec<i32> = fd.iter().map(|f| f.as_raw_fd()).collect();
    let mut sent = 0;
    while sent < frame.len() {
        sock.writable().await?;
        let fds: &[i32] = if sent == 0 { &raw } else { &[] };
        match sock.try_io(tokio::io::Interest::WRITABLE, || {
            fdpass::send_with_fds(sock, &frame[sent..], fds)
        }) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The new process's side.

/// The console connection to the pgcarpool `-R` took the sockets from.
pub struct Predecessor {
    sock: UnixStream,
}

/// A console session over a blocking Unix socket that may carry descriptors.
struct Console {
    sock: UnixStream,
    buf: Vec<u8>,
    fds: VecDeque<OwnedFd>,
}

/// One console row: each column's text, None for NULL.
type Row = Vec<Option<String>>;

/// Most bytes one console message may take here.
const MAX_CONSOLE_MESSAGE: usize = 1 << 20;

impl Console {
    fn send_query(&mut self, sql: &str) -> io::Result<()> {
        let mut m = vec![b'Q'];
        let len = u32::try_from(sql.len() + 5).map_err(io::Error::other)?;
        m.extend_from_slice(&len.to_be_bytes());
        m.extend_from_slice(sql.as_bytes());
        m.push(0);
        self.sock.write_all(&m)
    }

    fn message(&mut self) -> io::Result<(u8, Vec<u8>)> {
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]])
                    as usize;
                if !(4..=MAX_CONSOLE_MESSAGE).contains(&len) {
                    return Err(io::Error::other("bad message length from the console"));
                }
                if self.buf.len() > len {
                    let tag = self.buf[0];
                    let body = self.buf[5..len + 1].to_vec();
                    self.buf.drain(..len + 1);
                    return Ok((tag, body));
                }
            }
            let mut chunk = [0u8; 8192];
            let (n, fds) = fdpass::recv_with_fds(&self.sock, &mut chunk)?;
            self.fds.extend(fds);
            if n == 0 {
                return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Read to ReadyForQuery; the DataRows, or the ErrorResponse's message as the error.
    fn until_ready(&mut self) -> io::Result<(Vec<String>, Vec<Row>)> {
        let mut columns = Vec::new();
        let mut rows = Vec::new();
        let mut error = None;
        loop {
            let (tag, body) = self.message()?;
            match tag {
                b'T' => columns = row_description(&body),
                b'D' => rows.push(data_row(&body)),
                b'E' => error = Some(error_message(&body)),
                b'Z' => break,
                _ => {}
            }
        }
        match error {
            Some(e) => Err(io::Error::other(e)),
            None => Ok((columns, rows)),
        }
    }
}

fn row_description(body: &[u8]) -> Vec<String> {
    let mut r = body.get(2..).unwrap_or_default();
    let mut out = Vec::new();
    while let Some(end) = r.iter().position(|&b| b == 0) {
        out.push(String::from_utf8_lossy(&r[..end]).into_owned());
        r = r.get(end + 1 + 18..).unwrap_or_default();
    }
    out
}

fn data_row(body: &[u8]) -> Vec<Option<String>> {
    let mut r = body.get(2..).unwrap_or_default();
    let mut out = Vec::new();
    while r.len() >= 4 {
        let n = r.get_i32();
        if n < 0 {
            out.push(None);
            continue;
        }
        let n = (n as usize).min(r.len());
        out.push(Some(String::from_utf8_lossy(&r[..n]).into_owned()));
        r = &r[n..];
    }
    out
}

fn error_message(body: &[u8]) -> String {
    body.split(|&b| b == 0)
        .find_map(|f| f.strip_prefix(b"M"))
        .map(|m| String::from_utf8_lossy(m).into_owned())
        .unwrap_or_else(|| "error".into())
}

/// `-R` without SO_REUSEPORT: take the listening sockets of the pgcarpool running on this
/// config's Unix socket. None: no process answers there (start as usual).
pub fn take_listeners(s: &Settings) -> anyhow::Result<Option<(Predecessor, Vec<Bound>)>> {
    if s.unix_socket_dir.is_empty() {
        anyhow::bail!(
            "-R without so_reuseport needs unix_socket_dir: the sockets are taken over the running process's Unix socket"
        );
    }
    let Some(mut c) = login_console(s)? else {
        return Ok(None);
    };
    tracing::info!("-R: logged in to the running process, sending SUSPEND");
    c.send_query("SUSPEND;")?;
    c.until_ready()
        .map_err(|e| anyhow::anyhow!("-R: SUSPEND failed: {e}"))?;
    let taken = (|| -> anyhow::Result<Vec<Bound>> {
        c.send_query("SHOW FDS;")?;
        let (columns, rows) = c.until_ready()?;
        let col = |name: &str| columns.iter().position(|c| c == name);
        let task = col("task").ok_or_else(|| anyhow::anyhow!("SHOW FDS has no task column"))?;
        let mut out = Vec::new();
        for row in rows {
            if row.get(task).and_then(|t| t.as_deref()) != Some("pooler") {
                continue;
            }
            let fd = c.fds.pop_front().ok_or_else(|| {
                anyhow::anyhow!("SHOW FDS sent a pooler row without its descriptor")
            })?;
            out.push(listener_from(fd)?);
        }
        if out.is_empty() {
            anyhow::bail!("the running process passed no listening socket");
        }
        Ok(out)
    })();
    match taken {
        Ok(listeners) => {
            for l in &listeners {
                tracing::info!("-R: took over {l}");
            }
            c.sock.set_read_timeout(None)?;
            Ok(Some((Predecessor { sock: c.sock }, listeners)))
        }
        Err(e) => {
            let _ = c.send_query("RESUME;");
            let _ = c.until_ready();
            Err(anyhow::anyhow!("-R: taking the sockets failed: {e}"))
        }
    }
}

/// `-R` with SO_REUSEPORT: the running process's console, logged in before this process
/// binds (its Unix socket is about to be renamed over), to ask it for its clients once this
/// one listens. None: no Unix socket or nobody answers there (it is sent SIGTERM instead).
pub fn console_for_clients(s: &Settings) -> Option<Predecessor> {
    if s.unix_socket_dir.is_empty() {
        return None;
    }
    match login_console(s) {
        Ok(Some(c)) => {
            let _ = c.sock.set_read_timeout(None);
            Some(Predecessor { sock: c.sock })
        }
        Ok(None) => None,
        Err(e) => {
            tracing::warn!("{e}: its clients will not move");
            None
        }
    }
}

/// Log in to the console of the pgcarpool running on this config's Unix socket as user
/// `pgbouncer`. None: nobody answers there.
fn login_console(s: &Settings) -> anyhow::Result<Option<Console>> {
    let path = PathBuf::from(format!("{}/.s.PGSQL.{}", s.unix_socket_dir, s.listen_port));
    let sock = match UnixStream::connect(&path) {
        Ok(s) => s,
        Err(e) => {
            tracing::info!("-R: no running process answers on {} ({e})", path.display());
            return Ok(None);
        }
    };
    sock.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut c = Console {
        sock,
        buf: Vec::new(),
        fds: VecDeque::new(),
    };
    // StartupMessage: protocol 3.0, user and database pgbouncer.
    let mut body = 196608u32.to_be_bytes().to_vec();
    for (k, v) in [("user", "pgbouncer"), ("database", "pgbouncer")] {
        body.extend_from_slice(k.as_bytes());
        body.push(0);
        body.extend_from_slice(v.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut m = u32::try_from(body.len() + 4)?.to_be_bytes().to_vec();
    m.extend_from_slice(&body);
    c.sock.write_all(&m)?;
    c.until_ready()
        .map_err(|e| anyhow::anyhow!("-R: login to the running process's console failed: {e}"))?;
    Ok(Some(c))
}

/// A listening socket received from the old process.
fn listener_from(fd: OwnedFd) -> anyhow::Result<Bound> {
    let sock = socket2::Socket::from(fd);
    if !sock.is_listener()? {
        anyhow::bail!("a descriptor passed is not a listening socket");
    }
    sock.set_nonblocking(true)?;
    sock.set_cloexec(true)?;
    let local = sock.local_addr()?;
    if local.is_unix() {
        let path = local.as_pathname().map(std::path::Path::to_path_buf);
        let file = match path {
            Some(p) => {
                let ino = std::fs::metadata(&p)?.ino();
                Some(SocketFile::new(p, ino))
            }
            None => None,
        };
        Ok(Bound::Unix(OwnedFd::from(sock).into(), file))
    } else {
        Ok(Bound::Tcp(sock.into()))
    }
}

impl Predecessor {
    /// Once this process accepts on the sockets: ask the old one for its clients
    /// (HANDOVER) and run each it sends, until it closes the connection (it has exited).
    pub async fn take_clients(self, shared: Arc<Shared>) {
        if let Err(e) = self.receive(&shared).await {
            tracing::warn!("online restart: handover ended: {e}");
        }
    }

    async fn receive(self, shared: &Arc<Shared>) -> io::Result<()> {
        let mut sock = self.sock;
        let sql = "HANDOVER;";
        let mut m = vec![b'Q'];
        m.extend_from_slice(
            &u32::try_from(sql.len() + 5)
                .map_err(io::Error::other)?
                .to_be_bytes(),
        );
        m.extend_from_slice(sql.as_bytes());
        m.push(0);
        sock.write_all(&m)?;
        sock.set_nonblocking(true)?;
        let mut sock = tokio::net::UnixStream::from_std(sock)?;
        let (cancel_tx, mut cancel_rx) = mpsc::unbounded_channel::<(i32, i32)>();
        *shared
            .restart
            .cancels
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(cancel_tx);
        let result = Self::frames(shared, &mut sock, &mut cancel_rx).await;
        // The old process is gone: nobody stays with it.
        shared
            .restart
            .staying
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        *shared
            .restart
            .cancels
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
        result
    }

    async fn frames(
        shared: &Arc<Shared>,
        sock: &mut tokio::net::UnixStream,
        cancels: &mut mpsc::UnboundedReceiver<(i32, i32)>,
    ) -> io::Result<()> {
        let mut buf: Vec<u8> = Vec::new();
        let mut fds: VecDeque<OwnedFd> = VecDeque::new();
        let mut ready = false;
        let mut moved = 0u64;
        loop {
            // Whole messages first.
            while buf.len() >= 5 {
                let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
                if !(4..=session::MAX_LEN + 4).contains(&len) {
                    return Err(io::Error::other("bad frame from the old process"));
                }
                if buf.len() <= len {
                    break;
                }
                let tag = buf[0];
                let body: Vec<u8> = buf[5..len + 1].to_vec();
                buf.drain(..len + 1);
                match tag {
                    b'E' if !ready => {
                        return Err(io::Error::other(format!(
                            "HANDOVER refused: {}",
                            error_message(&body)
                        )));
                    }
                    b'Z' if !ready => {
                        ready = true;
                        tracing::info!("online restart: taking the old process's idle clients");
                    }
                    b'M' if ready => {
                        let fd = fds.pop_front().ok_or_else(|| {
                            io::Error::other("a client frame came without its socket")
                        })?;
                        let taken = match adopt(shared, &body, fd) {
                            Ok(()) => {
                                moved += 1;
                                true
                            }
                            Err(why) => {
                                tracing::warn!(
                                    "online restart: a client stays with the old process: {why}"
                                );
                                false
                            }
                        };
                        let answer = [if taken { b'Y' } else { b'N' }];
                        tokio::io::AsyncWriteExt::write_all(sock, &answer).await?;
                    }
                    b'S' if ready => match session::decode_staying(&body) {
                        Ok(list) => {
                            *shared
                                .restart
                                .staying
                                .lock()
                                .unwrap_or_else(|e| e.into_inner()) = list;
                        }
                        Err(e) => tracing::warn!(
                            "online restart: bad client list from the old process: {e}"
                        ),
                    },
                    _ => {}
                }
            }
            tokio::select! {
                r = sock.readable() => r?,
                Some(key) = cancels.recv() => {
                    let mut m = vec![b'C'];
                    m.extend_from_slice(&key.0.to_be_bytes());
                    m.extend_from_slice(&key.1.to_be_bytes());
                    tokio::io::AsyncWriteExt::write_all(sock, &m).await?;
                    continue;
                }
            }
            let mut chunk = vec![0u8; 64 * 1024];
            match sock.try_io(tokio::io::Interest::READABLE, || {
                fdpass::recv_with_fds(&*sock, &mut chunk)
            }) {
                Ok((0, _)) => break,
                Ok((n, got)) => {
                    fds.extend(got);
                    buf.extend_from_slice(&chunk[..n]);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        tracing::info!("online restart: the old process is done ({moved} client(s) taken over)");
        Ok(())
    }
}

/// Run a client the old process sent: its socket and session. Err: refused (it stays).
fn adopt(shared: &Arc<Shared>, data: &[u8], fd: OwnedFd) -> Result<(), String> {
    let m = MovedSession::decode(data).map_err(|e| e.to_string())?;
    let cfg = shared.config.load_full();
    let entry = cfg
        .database(&m.db)
        .ok_or_else(|| format!("no database {} in this config", m.db))?;
    let server_user = entry.user.clone().unwrap_or_else(|| m.user.clone());
    let learned = m
        .scram_keys
        .map(|(client_key, server_key)| Credential::ScramKeys {
            client_key,
            server_key,
        });
    let pool = shared.pools.get_or_create(&m.db, &server_user, || {
        crate::app::pool_settings(
            &cfg,
            &entry,
            &m.user,
            crate::client::credential_for(&cfg, &entry, &server_user, learned.clone()),
            shared,
        )
    });
    if let Some(c) = learned
        && entry.user.is_none()
    {
        pool.set_credential_if_missing(c);
    }
    let to_params = |list: &[(String, String)]| {
        let mut p = Params::default();
        for (k, v) in list {
            p.set(k, v);
        }
        p
    };
    let mut session = crate::client::session::VirtualSession {
        params: pool.share_session_params(to_params(&m.params)),
        startup: pool.share_startup_params(to_params(&m.startup)),
        ..Default::default()
    };
    for (name, rest) in m.statements {
        let stmt = shared
            .statements
            .intern(rest)
            .map_err(|e| format!("cannot keep its prepared statements: {e}"))?;
        session.statements.insert(name, stmt);
    }
    if let Some(u) = &m.unnamed {
        session.parsed_unnamed(u);
    }
    session.backend_pid = m.key.0;
    let id = shared.client_opened();
    let connect_time = UNIX_EPOCH + Duration::from_micros(m.connect_time_us);
    let kill = shared.stop_clients.child_token();
    let Some(reg) = shared.clients.register_moved(
        id,
        m.key,
        m.addr.clone(),
        m.user.clone(),
        m.db.clone(),
        kill,
        connect_time.min(SystemTime::now()),
    ) else {
        shared.client_closed(crate::workers::current());
        return Err("its cancel key is taken here".into());
    };
    reg.handle.set_handover(Some("moved in".into()));
    reg.handle
        .set_state(crate::client::registry::ClientState::Idle);
    let counted = shared.client_counts.enter(&m.db, &m.user);
    let detached = match m.transport {
        Transport::Tcp => crate::net::stream::Detached::Tcp(std::net::TcpStream::from(fd)),
        Transport::Unix => crate::net::stream::Detached::Unix(UnixStream::from(fd)),
    };
    let pending = m.pending_input;
    let s2 = shared.clone();
    let me = crate::workers::current();
    let w = shared.workers.get().map_or(me, |ws| ws.place(me));
    let run = async move {
        let stream = match detached.attach() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("could not take a moved client's socket: {e}");
                s2.client_closed(w);
                return;
            }
        };
        let mut conn = Conn::new(stream);
        conn.rbuf.extend_from_slice(&pending);
        let client = Client {
            shared: s2.clone(),
            conn,
            pool,
            session,
            reg,
            counted,
            stays: None,
        };
        crate::client::serve(client, Instant::now()).await;
        s2.client_closed(w);
    };
    match shared.workers.get() {
        Some(ws) if w != me => drop(ws.handle(w).spawn(shared.tracker.track_future(run))),
        _ => {
            shared.tracker.spawn(run);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_rows_are_read_with_nulls() {
        // Two columns: "1", NULL.
        let mut body = vec![0, 2];
        body.extend_from_slice(&1i32.to_be_bytes());
        body.push(b'1');
        body.extend_from_slice(&(-1i32).to_be_bytes());
        assert_eq!(data_row(&body), vec![Some("1".to_string()), None]);
        // A truncated row does not panic.
        assert_eq!(data_row(&body[..6]), vec![Some(String::new())]);
    }

    #[tokio::test]
    async fn a_watch_sees_every_change_whether_waited_for_or_not() {
        let r = Restart::default();
        let mut w = r.watch();
        assert_eq!(w.current(), Phase::Running);
        r.suspend();
        assert_eq!(w.current(), Phase::Suspended);
        r.resume();
        w.changed().await;
        assert_eq!(w.current(), Phase::Running);
        r.suspend();
        assert_eq!(w.current(), Phase::Suspended);
    }

    #[test]
    fn suspend_and_resume_move_the_phase_and_handover_ends_them() {
        let r = Restart::default();
        assert!(r.suspend());
        assert_eq!(r.phase(), Phase::Suspended);
        r.resume();
        assert_eq!(r.phase(), Phase::Running);
        r.phase.send_replace(Phase::HandingOver);
        assert!(!r.suspend());
        r.resume();
        assert_eq!(r.phase(), Phase::HandingOver);
    }
}
