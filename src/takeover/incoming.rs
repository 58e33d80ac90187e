//! The new process's side of an online restart (`-R`): the old process's console (login,
//! SUSPEND, SHOW FDS with the descriptors), then HANDOVER: each client it sends is run here.
use super::*;
use crate::pool::Pool;

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
        let (cancel_tx, mut cancel_rx) =
            mpsc::unbounded_channel::<crate::shared::restart::ForwardedCancel>();
        shared.restart().set_cancels(Some(cancel_tx));
        let result = Self::frames(shared, &mut sock, &mut cancel_rx).await;
        // The old process is gone: nobody stays with it.
        shared.restart().set_staying(Vec::new());
        shared.restart().set_cancels(None);
        result
    }

    async fn frames(
        shared: &Arc<Shared>,
        sock: &mut tokio::net::UnixStream,
        cancels: &mut mpsc::UnboundedReceiver<crate::shared::restart::ForwardedCancel>,
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
                            shared.restart().set_staying(list);
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
                Some((key, rest)) = cancels.recv() => {
                    let mut m = vec![if rest.is_empty() { b'C' } else { b'L' }];
                    m.extend_from_slice(&key.0.to_be_bytes());
                    m.extend_from_slice(&key.1.to_be_bytes());
                    if !rest.is_empty() {
                        let len = u16::try_from(rest.len()).unwrap_or(u16::MAX);
                        m.extend_from_slice(&len.to_be_bytes());
                        m.extend_from_slice(&rest[..usize::from(len)]);
                    }
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
    let pool = moved_pool(shared, &m)?;
    let session = moved_session(shared, &pool, &m)?;
    let id = shared.client_opened();
    let connect_time = UNIX_EPOCH + Duration::from_micros(m.connect_time_us);
    let counted = shared.client_counts().enter(&m.db, &m.user).counted;
    let Some(reg) = shared.clients().register_moved(
        id,
        (m.key, m.key_rest),
        m.addr.clone(),
        counted.names(),
        shared.stop_clients(),
        connect_time.min(SystemTime::now()),
    ) else {
        shared.client_closed(crate::workers::current());
        return Err("its cancel key is taken here".into());
    };
    reg.handle.set_handover(Some("moved in".into()));
    reg.handle
        .set_state(crate::client::registry::ClientState::Idle);
    let detached = match m.transport {
        Transport::Tcp => crate::net::stream::Detached::Tcp(std::net::TcpStream::from(fd)),
        Transport::Unix => crate::net::stream::Detached::Unix(UnixStream::from(fd)),
    };
    let pending = m.pending_input;
    let s2 = shared.clone();
    let me = crate::workers::current();
    let w = shared.workers().map_or(me, |ws| ws.place(me));
    // Boxed: the task keeps a pointer, not room for a session beside the client's own.
    let parts = Box::new((pool, session, reg, counted, pending));
    let run = async move {
        let stream = match detached.attach() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("could not take a moved client's socket: {e}");
                s2.client_closed(w);
                return;
            }
        };
        let (pool, session, reg, counted, pending) = *parts;
        let mut conn = Conn::new(stream);
        conn.rbuf.extend_from_slice(&pending);
        let client = Client::new(s2.clone(), conn, pool, session, reg, counted);
        if super::serve(Box::new(client)).await {
            s2.client_closed(w);
        }
    };
    match shared.workers() {
        Some(ws) if w != me => drop(ws.handle(w).spawn(shared.tracker().track_future(run))),
        _ => {
            shared.tracker().spawn(run);
        }
    }
    Ok(())
}

/// The pool a moved client's transactions run on (its database, with the server login
/// of this config), taking the SCRAM keys its login learned when the pool needs them.
fn moved_pool(shared: &Arc<Shared>, m: &MovedSession) -> Result<Arc<Pool>, String> {
    let cfg = shared.config_full();
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
    let pool = shared.pools().get_or_create(&m.db, &server_user, || {
        crate::shared::pool_settings(
            &cfg,
            &entry,
            &m.user,
            crate::shared::credential_for(&cfg, &entry, &server_user, learned.clone()),
            shared,
        )
    });
    if let Some(c) = learned
        && entry.user.is_none()
    {
        pool.set_credential_if_missing(c);
    }
    Ok(pool)
}

/// A moved client's virtual session rebuilt on `pool`: its settings, startup parameters,
/// prepared statements (interned in this process's registry) and the pid its cancel key
/// names.
fn moved_session(
    shared: &Arc<Shared>,
    pool: &Arc<Pool>,
    m: &MovedSession,
) -> Result<crate::client::session::VirtualSession, String> {
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
        pool_scope: crate::client::session::pool_scope(pool),
        ..Default::default()
    };
    for (name, rest) in &m.statements {
        // The scope of the statement's Parse did not come along: it is taken as the
        // session's now (most clients keep their search_path).
        let scope = session.statement_scope(rest);
        let stmt = shared
            .statements()
            .intern(&scope, rest)
            .map_err(|e| format!("cannot keep its prepared statements: {e}"))?;
        session.statements.insert(name.clone(), stmt);
    }
    if let Some(u) = &m.unnamed {
        session.parsed_unnamed(u);
    }
    session.backend_pid = m.key.0;
    Ok(session)
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
}
