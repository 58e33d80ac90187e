//! The admin console: database `pgbouncer` (or `pgcarpool`), PgBouncer's commands, over the
//! simple Query protocol (psql) and the extended protocol (drivers); the same views for
//! Prometheus in metrics.rs.
pub mod command;
pub mod metrics;
pub mod show;
pub mod status;
pub mod table;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, BytesMut};

use crate::client::ClientError;
use crate::net::Conn;
use crate::proto::{MAX_MESSAGE_LEN, Reader, backend, frontend};
use crate::shared::Shared;
pub use crate::shared::console::{AdminState, Role, role_of};
pub use command::{Command, ShutdownMode, View};
pub use table::Table;

/// An error the console reports (ErrorResponse); the session goes on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminError {
    pub code: &'static str,
    pub message: String,
}

impl AdminError {
    fn new(code: &'static str, message: impl Into<String>) -> Self {
        AdminError {
            code,
            message: message.into(),
        }
    }
}

/// What a command answers.
#[derive(Debug)]
pub enum Reply {
    Table(Table),
    /// A notice (SHOW HELP), then CommandComplete with the tag.
    Notice(String, &'static str),
    /// Notices (none is fine), then CommandComplete with the tag (RELOAD: what changed).
    Notices(Vec<String>, &'static str),
    /// CommandComplete only.
    Done(&'static str),
    Empty,
    /// Answer, then end the session (SHUTDOWN).
    Close(&'static str),
}

/// Serve a console session to its end: KILL_CLIENT and the shutdowns end it as they end
/// any client; an error is reported as a failed login is.
pub async fn serve(console: crate::client::Console) {
    let mut c = console;
    let shared = c.shared.clone();
    let kill = c.kill.clone();
    // Killed first: KILL_CLIENT answers after setting the flag, so a console killed by
    // another must not answer a query that arrives after that answer.
    let result = tokio::select! {
        biased;
        _ = kill.killed() => Ok(()),
        r = run(&shared, &mut c.conn, &c.user, c.role) => r,
    };
    c.end(result).await;
}

/// Serve one console session (after authentication).
pub async fn run(
    shared: &Arc<Shared>,
    conn: &mut Conn,
    user: &str,
    role: Role,
) -> Result<(), ClientError> {
    tracing::debug!(%user, ?role, "admin console login");
    welcome(conn);
    conn.flush().await?;
    let mut session = Session::default();
    let stop = shared.stop_clients().clone();
    // A process that took the listening sockets (SHOW FDS) and went away without HANDOVER
    // leaves this one suspended: it resumes.
    let mut resume = ResumeIfAbandoned {
        shared: shared.clone(),
        armed: std::cell::Cell::new(false),
    };
    loop {
        let h = tokio::select! {
            r = conn.read_message(MAX_MESSAGE_LEN) => match r {
                Ok(h) => h,
                Err(crate::net::conn::ConnError::Closed) => return Ok(()),
                Err(e) => return Err(e.into()),
            },
            _ = stop.cancelled() => return Ok(()),
        };
        let tag = conn.rbuf[0];
        let body = conn.rbuf[5..h.total].to_vec();
        conn.consume(h.total);
        // Online restart: the new process takes the sockets (SHOW FDS) and the clients
        // (HANDOVER) over this connection.
        let may_pass_fds = tag == frontend::QUERY
            && role == Role::Admin
            && user == "pgbouncer"
            && conn.stream.peer_is_same_os_user();
        if may_pass_fds {
            match online_restart(shared, conn, &body, &mut resume).await? {
                Some(true) => return Ok(()),
                Some(false) => continue,
                None => {}
            }
        }
        let mut out = BytesMut::new();
        let close = match tag {
            frontend::TERMINATE => return Ok(()),
            frontend::QUERY => simple_query(shared, role, &body, &mut out).await?,
            frontend::SYNC => {
                session.skipping = false;
                backend::ready_for_query(&mut out, b'I');
                false
            }
            frontend::FLUSH => false,
            frontend::PARSE
            | frontend::BIND
            | frontend::DESCRIBE
            | frontend::EXECUTE
            | frontend::CLOSE => {
                if session.skipping {
                    false
                } else {
                    match session.extended(shared, role, tag, &body, &mut out).await {
                        Ok(close) => close,
                        Err(e) => {
                            backend::error_response(&mut out, "ERROR", e.code, &e.message);
                            session.skipping = true;
                            false
                        }
                    }
                }
            }
            other => {
                return Err(ClientError::fatal(
                    "08P01",
                    format!(
                        "unsupported message type '{}' on the admin console",
                        other as char
                    ),
                ));
            }
        };
        conn.queue(out.freeze());
        conn.flush().await?;
        if close {
            return Ok(());
        }
    }
}

/// SHOW FDS (the listening sockets passed along with the answer) and HANDOVER (the
/// clients sent, then the session ends) asked by the process that takes this one over:
/// `Some(session ends)` when `body` is one of them, `None` when it is any other query.
async fn online_restart(
    shared: &Arc<Shared>,
    conn: &mut Conn,
    body: &[u8],
    resume: &mut ResumeIfAbandoned,
) -> Result<Option<bool>, ClientError> {
    let mut out = BytesMut::new();
    match single_command(body) {
        Some(Command::Show(View::Fds)) => {
            let (table, fds) = show::show_fds(shared, true);
            table.write_all(&mut out);
            backend::ready_for_query(&mut out, b'I');
            conn.flush().await?;
            send_with_fds(conn, &out, &fds).await?;
            resume.armed.set(!fds.is_empty());
            if !fds.is_empty() {
                tracing::info!(
                    "online restart: {} listening socket(s) passed (SHOW FDS)",
                    fds.len()
                );
            }
            Ok(Some(false))
        }
        Some(Command::Handover)
            if shared.restart().phase() != crate::shared::restart::Phase::HandingOver =>
        {
            backend::command_complete(&mut out, "HANDOVER");
            backend::ready_for_query(&mut out, b'I');
            conn.queue(out.freeze());
            conn.flush().await?;
            resume.armed.set(false);
            crate::takeover::serve_handover(shared, conn).await?;
            Ok(Some(true))
        }
        _ => Ok(None),
    }
}

/// Resumes a pooler left suspended by a console session that took its sockets (SHOW FDS)
/// and ended without HANDOVER (the new process failed to start).
struct ResumeIfAbandoned {
    shared: Arc<Shared>,
    armed: std::cell::Cell<bool>,
}

impl Drop for ResumeIfAbandoned {
    fn drop(&mut self) {
        if self.armed.get()
            && self.shared.restart().phase() == crate::shared::restart::Phase::Suspended
        {
            tracing::warn!(
                "online restart: the process that took the sockets left without taking over: resuming"
            );
            self.shared.restart().resume();
        }
    }
}

/// The one command a simple Query holds, if it holds exactly one that parses.
fn single_command(body: &[u8]) -> Option<Command> {
    let sql = frontend::parse_query(body).ok()?;
    let sql = String::from_utf8_lossy(sql);
    match command::split_statements(&sql)[..] {
        [one] => Command::parse(one).ok(),
        _ => None,
    }
}

/// Write `bytes` to the console's Unix socket with `fds` attached to the first byte.
async fn send_with_fds(
    conn: &mut Conn,
    bytes: &[u8],
    fds: &[std::os::fd::OwnedFd],
) -> Result<(), ClientError> {
    use std::os::fd::AsRawFd;
    let crate::net::Stream::Unix(sock) = &conn.stream else {
        return Err(ClientError::fatal(
            "08P01",
            "descriptors need the Unix socket".into(),
        ));
    };
    let raw: Vec<i32> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let mut sent = 0;
    while sent < bytes.len() {
        sock.writable().await?;
        let attach: &[i32] = if sent == 0 { &raw } else { &[] };
        match sock.try_io(tokio::io::Interest::WRITABLE, || {
            crate::net::fdpass::send_with_fds(sock, &bytes[sent..], attach)
        }) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// AuthenticationOk, the parameters clients expect, BackendKeyData, ReadyForQuery.
fn welcome(conn: &mut Conn) {
    conn.queue_with(|b| {
        backend::authentication_ok(b);
        for (k, v) in [
            (
                "server_version",
                format!("{}/bouncer", crate::cli::PGBOUNCER_COMPAT),
            ),
            ("server_encoding", "UTF8".to_string()),
            ("client_encoding", "UTF8".to_string()),
            ("DateStyle", "ISO".to_string()),
            ("TimeZone", "UTC".to_string()),
            ("standard_conforming_strings", "on".to_string()),
            ("integer_datetimes", "on".to_string()),
            ("is_superuser", "off".to_string()),
            ("application_name", String::new()),
        ] {
            backend::parameter_status(b, k, &v);
        }
        backend::backend_key_data(
            b,
            rand::random::<i32>() & 0x7fff_ffff,
            rand::random::<i32>(),
        );
        backend::ready_for_query(b, b'I');
    });
}

/// A simple Query: each `;`-separated command in turn; stop at the first error.
async fn simple_query(
    shared: &Arc<Shared>,
    role: Role,
    body: &[u8],
    out: &mut BytesMut,
) -> Result<bool, ClientError> {
    let sql = frontend::parse_query(body)?;
    let sql = String::from_utf8_lossy(sql);
    let parts = command::split_statements(&sql);
    if parts.is_empty() {
        backend::empty_query_response(out);
    }
    let mut close = false;
    for part in parts {
        match execute(shared, role, part).await {
            Ok(reply) => {
                close |= write_reply(&reply, out, None);
            }
            Err(e) => {
                backend::error_response(out, "ERROR", e.code, &e.message);
                break;
            }
        }
    }
    backend::ready_for_query(out, b'I');
    Ok(close)
}

/// Write a reply; `formats` = Some(..) for Execute (no RowDescription, given formats).
fn write_reply(reply: &Reply, out: &mut BytesMut, formats: Option<&[i16]>) -> bool {
    match reply {
        Reply::Table(t) => match formats {
            None => t.write_all(out),
            Some(f) => {
                let f = table::formats_for(f, t.columns.len());
                t.write_rows(out, &f);
                backend::command_complete(out, "SHOW");
            }
        },
        Reply::Notice(text, tag) => {
            backend::error_fields(out, backend::NOTICE_RESPONSE, "NOTICE", "00000", text);
            backend::command_complete(out, tag);
        }
        Reply::Notices(texts, tag) => {
            for text in texts {
                backend::error_fields(out, backend::NOTICE_RESPONSE, "NOTICE", "00000", text);
            }
            backend::command_complete(out, tag);
        }
        Reply::Done(tag) => backend::command_complete(out, tag),
        Reply::Close(tag) => {
            backend::command_complete(out, tag);
            return true;
        }
        Reply::Empty => backend::empty_query_response(out),
    }
    false
}

/// Parse, check the role, run.
pub async fn execute(shared: &Arc<Shared>, role: Role, sql: &str) -> Result<Reply, AdminError> {
    let cmd = Command::parse(sql).map_err(|e| {
        // PgBouncer answers a bad KILL_CLIENT argument as a protocol violation.
        let code = if e.0 == "invalid client pointer supplied" {
            "08P01"
        } else {
            "42601"
        };
        AdminError::new(code, e.0)
    })?;
    if role == Role::Stats && !cmd.is_read_only() {
        return Err(AdminError::new(
            "42501",
            "admin access needed: stats_users may only run SHOW commands",
        ));
    }
    run_command(shared, cmd).await
}

fn need_db(shared: &Shared, db: &str) -> Result<(), AdminError> {
    // Databases named in [databases], or made from `*` by a client (as PgBouncer: not
    // every name the `*` entry would accept).
    if shared.config().databases.contains_key(db) || shared.pools().all().iter().any(|p| p.db == db)
    {
        Ok(())
    } else {
        // PgBouncer's SQLSTATE and words.
        Err(AdminError::new("08P01", format!("no such database: {db}")))
    }
}

fn pools_of(shared: &Shared, db: Option<&str>) -> Vec<Arc<crate::pool::Pool>> {
    shared
        .pools()
        .all()
        .into_iter()
        .filter(|p| db.is_none_or(|d| p.db == d))
        .collect()
}

async fn run_command(shared: &Arc<Shared>, cmd: Command) -> Result<Reply, AdminError> {
    shared.admin().count_command();
    let tag = cmd.tag();
    match cmd {
        Command::Empty => Ok(Reply::Empty),
        Command::Show(View::Help) => Ok(Reply::Notice(show::help(), "SHOW")),
        Command::Show(v) => Ok(Reply::Table(
            show::table(shared, v).expect("every view but HELP has a table"),
        )),
        Command::Set { key, value } => {
            let mut cfg = (**shared.config()).clone();
            cfg.settings
                .set(&key, &value)
                .map_err(|e| AdminError::new("22023", e))?;
            let _ = shared.reload(cfg);
            Ok(Reply::Done(tag))
        }
        Command::Reload => {
            // PgBouncer's words; the reason is in the log (reload_from_file logs it).
            let changes = shared.reload_from_file().map_err(|_| {
                AdminError::new("F0000", "RELOAD failed, see logs for additional details")
            })?;
            let notices = changes.iter().map(|c| format!("setting {c}")).collect();
            Ok(Reply::Notices(notices, tag))
        }
        Command::Pause(db) => {
            pause(shared, db.as_deref()).await?;
            Ok(Reply::Done(tag))
        }
        Command::Resume(_) if shared.shutting_down() => {
            Err(AdminError::new("08P01", "pooler is shutting down"))
        }
        Command::Resume(None) => {
            shared.restart().resume();
            shared.resume_all();
            Ok(Reply::Done(tag))
        }
        Command::Resume(Some(db)) => {
            shared.admin().set_paused(Some(&db), false);
            for p in pools_of(shared, Some(&db)) {
                p.resume();
            }
            Ok(Reply::Done(tag))
        }
        Command::Reconnect(db) => {
            if let Some(db) = &db {
                need_db(shared, db)?;
            }
            pools_of(shared, db.as_deref())
                .iter()
                .for_each(|p| p.reconnect());
            Ok(Reply::Done(tag))
        }
        Command::WaitClose(db) => {
            let pools = pools_of(shared, db.as_deref());
            wait_until(|| pools.iter().all(|p| p.reconnect_done())).await;
            Ok(Reply::Done(tag))
        }
        Command::Kill(db) => {
            kill(shared, db.as_deref())?;
            Ok(Reply::Done(tag))
        }
        Command::KillClient(id) => {
            let c = shared
                .clients()
                .all()
                .into_iter()
                .find(|c| c.id == id)
                .ok_or_else(|| AdminError::new("08P01", "client not found"))?;
            c.kill_with("admin forced disconnect");
            Ok(Reply::Done(tag))
        }
        Command::Suspend => {
            if shared.restart().suspend() {
                tracing::info!("SUSPEND: not accepting, idle clients not read until RESUME");
                Ok(Reply::Done(tag))
            } else {
                Err(AdminError::new("08P01", "an online restart is under way"))
            }
        }
        Command::Handover => Err(AdminError::new(
            "08P01",
            "HANDOVER is sent by a new pgcarpool started with -R, as user pgbouncer over the Unix socket, after SUSPEND",
        )),
        Command::Shutdown(mode) => Ok(shutdown(shared, mode, tag)),
        Command::Enable(db) => {
            need_db(shared, &db)?;
            shared.admin().set_disabled(&db, false);
            Ok(Reply::Done(tag))
        }
        Command::Disable(db) => {
            need_db(shared, &db)?;
            shared.admin().set_disabled(&db, true);
            Ok(Reply::Done(tag))
        }
    }
}

/// PAUSE [db]: new checkouts wait; returns once no server of those pools is in use.
async fn pause(shared: &Arc<Shared>, db: Option<&str>) -> Result<(), AdminError> {
    match db {
        None => shared.pause_all().await,
        Some(db) => {
            need_db(shared, db)?;
            shared.admin().set_paused(Some(db), true);
            let pools = pools_of(shared, Some(db));
            pools.iter().for_each(|p| p.pause());
            wait_until(|| pools.iter().all(|p| p.in_use_with_reads() == 0)).await;
        }
    }
    Ok(())
}

/// KILL [db]: its clients leave now, its servers close; as PgBouncer, the database stays
/// paused until RESUME.
fn kill(shared: &Arc<Shared>, db: Option<&str>) -> Result<(), AdminError> {
    if let Some(db) = db {
        need_db(shared, db)?;
    }
    shared.admin().set_paused(db, true);
    let pools = pools_of(shared, db);
    pools.iter().for_each(|p| p.pause());
    for c in shared.clients().all() {
        if db.is_none_or(|d| &*c.db == d) {
            c.kill();
        }
    }
    pools.iter().for_each(|p| p.reconnect());
    Ok(())
}

/// SHUTDOWN [WAIT_FOR_SERVERS | WAIT_FOR_CLIENTS], begun after the console's answer.
fn shutdown(shared: &Arc<Shared>, mode: ShutdownMode, tag: &'static str) -> Reply {
    let s = shared.clone();
    tracing::info!(
        "SHUTDOWN{} from the admin console",
        match mode {
            ShutdownMode::Now => "",
            ShutdownMode::WaitForServers => " WAIT_FOR_SERVERS",
            ShutdownMode::WaitForClients => " WAIT_FOR_CLIENTS",
        }
    );
    match mode {
        ShutdownMode::Now => {
            tokio::spawn(async move {
                // Let the console's answer go out first.
                tokio::task::yield_now().await;
                s.shutdown_now();
            });
            Reply::Close(tag)
        }
        ShutdownMode::WaitForServers => {
            tokio::spawn(async move { s.shutdown_wait_for_servers().await });
            Reply::Done(tag)
        }
        ShutdownMode::WaitForClients => {
            tokio::spawn(async move { s.shutdown_wait_for_clients().await });
            Reply::Done(tag)
        }
    }
}

async fn wait_until(mut done: impl FnMut() -> bool) {
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    while !done() {
        tick.tick().await;
    }
}

/// Extended-protocol state of one console session.
#[derive(Default)]
struct Session {
    /// Statement name → SQL.
    statements: HashMap<String, String>,
    /// Portal name → (SQL, result formats).
    portals: HashMap<String, (String, Vec<i16>)>,
    /// After an error: ignore messages until Sync.
    skipping: bool,
}

/// A console message that does not read as its type says.
fn malformed(e: crate::proto::ProtoError) -> AdminError {
    AdminError::new("08P01", e.to_string())
}

impl Session {
    /// One extended-protocol message (Parse, Bind, Describe, Execute, Close), answered
    /// into `out`; true when the session ends after the answer (SHUTDOWN).
    async fn extended(
        &mut self,
        shared: &Arc<Shared>,
        role: Role,
        tag: u8,
        body: &[u8],
        out: &mut BytesMut,
    ) -> Result<bool, AdminError> {
        let mut r = Reader::new(body, "extended query message");
        match tag {
            frontend::PARSE => {
                let name = r.cstr().map_err(malformed)?.to_string();
                let sql = r.cstr().map_err(malformed)?.to_string();
                // Check it parses now, as a server would.
                Command::parse(&sql).map_err(|e| AdminError::new("42601", e.0))?;
                self.statements.insert(name, sql);
                backend::parse_complete(out);
            }
            frontend::BIND => self.bind(&mut r, out)?,
            frontend::DESCRIBE => self.describe(shared, &mut r, out)?,
            frontend::EXECUTE => {
                let name = r.cstr().map_err(malformed)?;
                let (sql, formats) = self.portals.get(name).cloned().ok_or_else(|| {
                    AdminError::new("34000", format!("portal \"{name}\" does not exist"))
                })?;
                let reply = execute(shared, role, &sql).await?;
                return Ok(write_reply(&reply, out, Some(&formats)));
            }
            frontend::CLOSE => {
                let kind = r.u8().map_err(malformed)?;
                let name = r.cstr().map_err(malformed)?;
                if kind == b'S' {
                    self.statements.remove(name);
                } else {
                    self.portals.remove(name);
                }
                backend::close_complete(out);
            }
            _ => unreachable!("extended message tags only"),
        }
        Ok(false)
    }

    /// Bind: a portal for a statement Parse checked; admin commands take no parameters.
    fn bind(&mut self, r: &mut Reader<'_>, out: &mut BytesMut) -> Result<(), AdminError> {
        let portal = r.cstr().map_err(malformed)?.to_string();
        let stmt = r.cstr().map_err(malformed)?;
        let sql = self.statements.get(stmt).cloned().ok_or_else(|| {
            AdminError::new(
                "26000",
                format!("prepared statement \"{stmt}\" does not exist"),
            )
        })?;
        let n = r.i16().map_err(malformed)?;
        for _ in 0..n.max(0) {
            r.i16().map_err(malformed)?;
        }
        let n = r.i16().map_err(malformed)?;
        if n > 0 {
            return Err(AdminError::new(
                "42601",
                "admin commands take no parameters",
            ));
        }
        let n = r.i16().map_err(malformed)?;
        let mut formats = Vec::new();
        for _ in 0..n.max(0) {
            formats.push(r.i16().map_err(malformed)?);
        }
        self.portals.insert(portal, (sql, formats));
        out.put_u8(b'2');
        out.put_i32(4);
        Ok(())
    }

    /// Describe a statement (no parameters) or a portal: the row a SHOW answers with, or
    /// NoData for any other command.
    fn describe(
        &self,
        shared: &Arc<Shared>,
        r: &mut Reader<'_>,
        out: &mut BytesMut,
    ) -> Result<(), AdminError> {
        let kind = r.u8().map_err(malformed)?;
        let name = r.cstr().map_err(malformed)?;
        let (sql, formats) = if kind == b'S' {
            let sql = self.statements.get(name).ok_or_else(|| {
                AdminError::new(
                    "26000",
                    format!("prepared statement \"{name}\" does not exist"),
                )
            })?;
            // ParameterDescription: no parameters.
            out.put_u8(b't');
            out.put_i32(6);
            out.put_i16(0);
            (sql.clone(), Vec::new())
        } else {
            self.portals.get(name).cloned().ok_or_else(|| {
                AdminError::new("34000", format!("portal \"{name}\" does not exist"))
            })?
        };
        match Command::parse(&sql) {
            Ok(Command::Show(v)) if v != View::Help => {
                let t = show::table(shared, v).expect("table view");
                let f = table::formats_for(&formats, t.columns.len());
                t.write_description(out, &f);
            }
            _ => {
                out.put_u8(b'n');
                out.put_i32(4);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn shared() -> Arc<Shared> {
        let cfg = Config::from_str(
            "[databases]\n[pgbouncer]\nlisten_port = 0\n",
            "pgbouncer.ini",
            &std::env::temp_dir(),
        )
        .expect("config");
        Shared::new(cfg)
    }

    #[tokio::test]
    async fn malformed_extended_messages_are_errors_not_panics() {
        let sh = shared();
        let mut s = Session::default();
        let cases: [(u8, &[u8]); 8] = [
            (frontend::PARSE, b""),
            (frontend::PARSE, b"s\0SHOW POOLS"),
            (frontend::BIND, b"\0nosuch\0\0\0\0\0\0\0"),
            (frontend::BIND, b"\0\0\xff\xff"),
            (frontend::DESCRIBE, b"S"),
            (frontend::DESCRIBE, b"Pnosuch\0"),
            (frontend::EXECUTE, b"nosuch\0\0\0\0\0"),
            (frontend::CLOSE, b""),
        ];
        for (tag, body) in cases {
            let mut out = BytesMut::new();
            assert!(
                s.extended(&sh, Role::Admin, tag, body, &mut out)
                    .await
                    .is_err(),
                "{} {body:?}",
                tag as char
            );
        }
    }

    #[tokio::test]
    async fn parse_bind_describe_execute_answer_in_order() {
        let sh = shared();
        let mut s = Session::default();
        let mut out = BytesMut::new();
        s.extended(
            &sh,
            Role::Admin,
            frontend::PARSE,
            b"\0SHOW LISTS\0\0\0",
            &mut out,
        )
        .await
        .unwrap();
        s.extended(
            &sh,
            Role::Admin,
            frontend::BIND,
            b"\0\0\0\0\0\0\0\0",
            &mut out,
        )
        .await
        .unwrap();
        s.extended(&sh, Role::Admin, frontend::DESCRIBE, b"P\0", &mut out)
            .await
            .unwrap();
        s.extended(&sh, Role::Admin, frontend::EXECUTE, b"\0\0\0\0\0", &mut out)
            .await
            .unwrap();
        let mut tags = Vec::new();
        let mut rest = &out[..];
        while rest.len() >= 5 {
            let len = i32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
            tags.push(rest[0]);
            rest = &rest[1 + len..];
        }
        let rows = tags.iter().filter(|t| **t == b'D').count();
        assert_eq!(&tags[..3], b"12T");
        assert_eq!(rows, 14);
        assert_eq!(tags.last(), Some(&b'C'));
        // A stats user may describe but not run a non-SHOW command.
        s.extended(
            &sh,
            Role::Stats,
            frontend::PARSE,
            b"p\0PAUSE\0\0\0",
            &mut out,
        )
        .await
        .unwrap();
        s.extended(
            &sh,
            Role::Stats,
            frontend::BIND,
            b"\0p\0\0\0\0\0\0\0",
            &mut out,
        )
        .await
        .unwrap();
        let e = s
            .extended(&sh, Role::Stats, frontend::EXECUTE, b"\0\0\0\0\0", &mut out)
            .await
            .unwrap_err();
        assert_eq!(e.code, "42501");
    }
}
