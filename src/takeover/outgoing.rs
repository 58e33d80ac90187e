//! The old process's side of an online restart: SHOW FDS, which clients may move, and
//! HANDOVER (each idle client's session and socket sent to the new process).
use super::*;
use crate::shared::restart::ForwardedCancel;

/// Move an idle client to the new process. Ok: it runs there now (this task ends without a
/// word to the client); Err: it stays here (the reason).
pub async fn hand_over(c: &mut Client) -> Result<(), String> {
    let outbox = c.shared.restart().outbox().ok_or("no handover under way")?;
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
        // `stays_because` keeps them here.
        Stream::TlsIn(_) | Stream::TlsOut(_) | Stream::Gone => {
            return Err("TLS clients stay with the old process".into());
        }
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
        user: h.user.to_string(),
        db: h.db.to_string(),
        addr: h.addr.to_string(),
        connect_time_us: h
            .connect_time()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0),
        key: h.key,
        key_rest: h.key_rest(),
        params: pairs(&c.session.params),
        startup: pairs(&c.session.startup),
        statements: c
            .session
            .statements
            .iter()
            .map(|(name, s)| (name.clone(), s.parse_rest.clone()))
            .collect(),
        unnamed: c.session.ext.unnamed.clone(),
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
    if !shared.restart().open_outbox(tx) {
        return Err(io::Error::other("a handover is under way already"));
    }
    tracing::info!("online restart: the new process listens; handing over idle clients");
    crate::service::stopping("handing clients over to the new process");
    annotate_staying(shared);
    shared.restart().start_handing_over();
    // Closes the TCP listeners (without accepting what is queued: see client::accept::accept_loop).
    shared.stop_accepting().cancel();
    shared.restart().keep_sockets(Vec::new());
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
                let clients = shared.clients().all();
                let consoles = clients.iter().filter(|c| &*c.db == "pgbouncer").count();
                if shared.client_conns() <= consoles {
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
        .filter(|c| &*c.db != "pgbouncer")
        .map(|c| StayingClient {
            user: c.user.to_string(),
            db: c.db.to_string(),
            addr: c.addr.to_string(),
            connect_time_us: c
                .connect_time()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_micros() as u64)
                .unwrap_or(0),
            key: c.key,
            note: c.handover().unwrap_or_default(),
        })
        .collect()
}

/// A cancel request the new process forwarded for a client of this one.
fn cancel(shared: &Arc<Shared>, (key, rest): ForwardedCancel) {
    let shared = shared.clone();
    tokio::spawn(async move {
        crate::client::cancel::handle(&shared, (key, &rest), (0, "takeover")).await
    });
}

/// What the new process sends back on the handover connection.
enum Answer {
    /// `Y` / `N`: whether it took the client just sent.
    Taken(bool),
    /// `C` + the key: a cancel request for a client still here; `L` + the key + a u16
    /// length + the rest of a long (protocol 3.2) secret.
    Cancel(ForwardedCancel),
}

/// A whole `C` or `L` message at the front of `buf`, taken out of it (None: not all there
/// yet).
fn forwarded_cancel(buf: &mut Vec<u8>) -> io::Result<Option<ForwardedCancel>> {
    let long = buf.first() == Some(&b'L');
    let head = if long { 11 } else { 9 };
    if buf.len() < head {
        return Ok(None);
    }
    let k = |i: usize| i32::from_be_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
    let key = (k(1), k(5));
    let rest_len = if long {
        usize::from(u16::from_be_bytes([buf[9], buf[10]]))
    } else {
        0
    };
    if rest_len > crate::proto::startup::MAX_CANCEL_SECRET {
        return Err(io::Error::other(
            "cancel secret too long from the new process",
        ));
    }
    if buf.len() < head + rest_len {
        return Ok(None);
    }
    let rest = buf[head..head + rest_len].to_vec();
    buf.drain(..head + rest_len);
    Ok(Some((key, rest)))
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
                Some(b'C' | b'L') => {
                    if let Some(cancel) = forwarded_cancel(&mut self.buf)? {
                        return Ok(Answer::Cancel(cancel));
                    }
                }
                None => {}
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
    let cfg = shared.config();
    for c in shared.clients().all() {
        if &*c.db == "pgbouncer" {
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
