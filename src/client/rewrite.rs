//! The virtual-statement layer of the relay: client statement names are mapped to shared
//! statements, prepared lazily on whichever server runs the client's work, and the replies
//! pgcarpool answers itself are put in order with the server's.
use std::sync::Arc;

use bytes::{BufMut, Bytes};

use std::collections::VecDeque;

use super::classify::{self, Effects};
use super::prepared::{Answer, Pending, Stmt};
use super::relay::Relay;
use super::session::VirtualSession;
use crate::proto::{ProtoError, Reader, backend, frontend};

/// The common extended-protocol messages that need no rewriting: unnamed statements,
/// portals, names the client never prepared. Notes what the server will owe and returns
/// true; false means the message needs `Relay::on_extended`.
pub(super) fn passes_through(
    tag: u8,
    body: &[u8],
    session: &VirtualSession,
    pending: &mut VecDeque<Pending>,
    effects: &mut Effects,
) -> Result<bool, ProtoError> {
    let mut r = Reader::new(body, "extended-protocol message");
    let entry = match tag {
        frontend::PARSE => {
            if !r.cstr_bytes()?.is_empty() {
                return Ok(false);
            }
            let sql = r.cstr_bytes()?;
            if classify::may_matter(sql) {
                effects.merge(classify::classify(sql));
            }
            Pending::Parse {
                swallow: false,
                stmt: None,
            }
        }
        frontend::BIND => {
            r.cstr_bytes()?;
            let name = r.cstr_bytes()?;
            if !name.is_empty() && session.statements.contains_key(name) {
                return Ok(false);
            }
            Pending::Bind
        }
        frontend::DESCRIBE => {
            let kind = r.u8()?;
            let name = r.cstr_bytes()?;
            if kind == b'S' && !name.is_empty() && session.statements.contains_key(name) {
                return Ok(false);
            }
            Pending::Describe
        }
        _ => {
            let kind = r.u8()?;
            let name = r.cstr_bytes()?;
            if kind == b'S' && !name.is_empty() {
                return Ok(false);
            }
            Pending::Close { swallow: false }
        }
    };
    pending.push_back(entry);
    Ok(true)
}

impl Relay<'_> {
    /// A whole simple Query from the client.
    pub(super) fn on_query(&mut self, msg: Bytes) -> Result<(), ProtoError> {
        let sql = Reader::new(&msg[5..], "Query").cstr_bytes()?;
        if !classify::may_matter(sql) {
            self.send_query(msg, None);
            return Ok(());
        }
        let e = classify::classify(sql);
        if e.deallocate_all {
            // The server drops every statement, the ones other clients use included.
            self.session.statements.clear();
            self.server.prepared.clear();
        }
        let named = classify::named_statement(sql);
        let deallocated = e
            .deallocate
            .as_ref()
            .and_then(|name| self.session.statements.remove(name.as_bytes()));
        self.effects.merge(e);
        if let Some(stmt) = deallocated {
            self.server.prepared.remove(stmt.id);
            let sql = format!("DEALLOCATE {}", quoted(&stmt.server_name));
            self.send_query(query_message(&sql), None);
            return Ok(());
        }
        match named {
            Some(classify::Named::Prepare { name, rest }) => {
                let mut key = b"\0PREPARE ".to_vec();
                key.extend_from_slice(rest);
                let stmt = self.registry.intern(Bytes::from(key));
                self.session
                    .statements
                    .insert(Bytes::from(name.into_bytes()), stmt.clone());
                if self.server.prepared.touch(stmt.id) {
                    // Already prepared on this server under its shared name.
                    self.server
                        .pending
                        .push_back(Pending::Answer(Answer::Query("PREPARE")));
                    return Ok(());
                }
                let sql = format!(
                    "PREPARE {} {}",
                    quoted(&stmt.server_name),
                    String::from_utf8_lossy(rest)
                );
                self.server.prepared.insert(stmt.clone());
                self.send_query(query_message(&sql), Some(stmt));
            }
            Some(classify::Named::Execute { name, rest }) => {
                match self.session.statements.get(name.as_bytes()).cloned() {
                    Some(stmt) if is_sql_prepared(&stmt) => {
                        if !self.server.prepared.touch(stmt.id) {
                            let prep = format!(
                                "PREPARE {} {}",
                                quoted(&stmt.server_name),
                                String::from_utf8_lossy(&stmt.parse_rest["\0PREPARE ".len()..])
                            );
                            self.server.conn.queue_with(|b| frontend::query(b, &prep));
                            self.server.proto.expected_rfq += 1;
                            self.server.pending.push_back(Pending::Swallow);
                            self.server.prepared.insert(stmt.clone());
                        }
                        let sql = format!(
                            "EXECUTE {} {}",
                            quoted(&stmt.server_name),
                            String::from_utf8_lossy(rest)
                        );
                        self.send_query(query_message(&sql), None);
                    }
                    _ => self.send_query(msg, None),
                }
            }
            None => self.send_query(msg, None),
        }
        Ok(())
    }

    /// Forward a Query whose ReadyForQuery the client waits for.
    fn send_query(&mut self, msg: Bytes, prepares: Option<Arc<Stmt>>) {
        self.server.conn.queue(msg);
        self.server.proto.expected_rfq += 1;
        self.server.pending.push_back(Pending::Ready(prepares));
    }

    /// A whole Parse, Bind, Describe or Close from the client.
    pub(super) fn on_extended(&mut self, tag: u8, msg: Bytes) -> Result<(), ProtoError> {
        let body = &msg[5..];
        match tag {
            frontend::PARSE => {
                let name = Reader::new(body, "Parse").cstr_bytes()?;
                if name.is_empty() {
                    let sql = Reader::new(&body[1..], "Parse").cstr_bytes()?;
                    if classify::may_matter(sql) {
                        self.effects.merge(classify::classify(sql));
                    }
                    self.server.conn.queue(msg);
                    self.server.pending.push_back(Pending::Parse {
                        swallow: false,
                        stmt: None,
                    });
                    return Ok(());
                }
                let rest = msg.slice(5 + name.len() + 1..);
                let stmt = self.registry.intern(rest);
                if let Some(e) = &stmt.effects {
                    self.effects.merge((**e).clone());
                }
                self.session
                    .statements
                    .insert(Bytes::copy_from_slice(name), stmt.clone());
                if self.server.prepared.touch(stmt.id) {
                    self.server
                        .pending
                        .push_back(Pending::Answer(Answer::ParseComplete));
                } else {
                    self.prepare_on_server(stmt, false);
                }
            }
            frontend::BIND => {
                let mut r = Reader::new(body, "Bind");
                let portal = r.cstr_bytes()?;
                let name = r.cstr_bytes()?;
                match self.lookup(name) {
                    None => self.server.conn.queue(msg),
                    Some(stmt) => {
                        let rest = msg.slice(5 + portal.len() + 1 + name.len() + 1..);
                        let sname = stmt.server_name.clone();
                        let len = 4 + portal.len() + 1 + sname.len() + 1 + rest.len();
                        let len = i32::try_from(len).map_err(|_| ProtoError::TooLong(len))?;
                        self.server.conn.queue_with(|b| {
                            b.put_u8(frontend::BIND);
                            b.put_i32(len);
                            b.put_slice(portal);
                            b.put_u8(0);
                            b.put_slice(&sname);
                            b.put_u8(0);
                        });
                        self.server.conn.queue(rest);
                    }
                }
                self.server.pending.push_back(Pending::Bind);
            }
            frontend::DESCRIBE => {
                let mut r = Reader::new(body, "Describe");
                let kind = r.u8()?;
                let name = r.cstr_bytes()?;
                match (kind, self.lookup(if kind == b'S' { name } else { b"" })) {
                    (b'S', Some(stmt)) => {
                        let sname = stmt.server_name.clone();
                        self.server.conn.queue_with(|b| {
                            b.put_u8(frontend::DESCRIBE);
                            b.put_i32((4 + 1 + sname.len() + 1) as i32);
                            b.put_u8(b'S');
                            b.put_slice(&sname);
                            b.put_u8(0);
                        });
                    }
                    _ => self.server.conn.queue(msg),
                }
                self.server.pending.push_back(Pending::Describe);
            }
            frontend::CLOSE => {
                let mut r = Reader::new(body, "Close");
                let kind = r.u8()?;
                let name = r.cstr_bytes()?;
                if kind == b'S' && !name.is_empty() {
                    // Only the client's name goes: the server keeps the statement for others.
                    self.session.statements.remove(name);
                    self.server
                        .pending
                        .push_back(Pending::Answer(Answer::CloseComplete));
                } else {
                    self.server.conn.queue(msg);
                    self.server
                        .pending
                        .push_back(Pending::Close { swallow: false });
                }
            }
            _ => unreachable!("only extended-protocol messages come here"),
        }
        Ok(())
    }

    /// The statement a client name refers to, prepared on this server (added if missing).
    fn lookup(&mut self, name: &[u8]) -> Option<Arc<Stmt>> {
        if name.is_empty() {
            return None;
        }
        let stmt = self.session.statements.get(name)?.clone();
        if is_sql_prepared(&stmt) {
            // Made by SQL PREPARE: usable from the protocol only where it already exists.
            return self.server.prepared.touch(stmt.id).then_some(stmt);
        }
        if !self.server.prepared.touch(stmt.id) {
            self.prepare_on_server(stmt.clone(), true);
        }
        Some(stmt)
    }

    /// Send a Parse of `stmt` under its server name (closing the least recently used
    /// statement first when the server holds max_prepared_statements).
    fn prepare_on_server(&mut self, stmt: Arc<Stmt>, swallow: bool) {
        if self.server.prepared.len() >= self.max_prepared
            && let Some(old) = self.server.prepared.evict_lru()
        {
            self.server.conn.queue_with(|b| {
                b.put_u8(frontend::CLOSE);
                b.put_i32((4 + 1 + old.server_name.len() + 1) as i32);
                b.put_u8(b'S');
                b.put_slice(&old.server_name);
                b.put_u8(0);
            });
            self.server
                .pending
                .push_back(Pending::Close { swallow: true });
        }
        let len = 4 + stmt.server_name.len() + 1 + stmt.parse_rest.len();
        self.server.conn.queue_with(|b| {
            b.put_u8(frontend::PARSE);
            b.put_i32(len as i32);
            b.put_slice(&stmt.server_name);
            b.put_u8(0);
        });
        self.server.conn.queue(stmt.parse_rest.clone());
        self.server.prepared.insert(stmt.clone());
        self.server.pending.push_back(Pending::Parse {
            swallow,
            stmt: Some(stmt),
        });
    }

    /// Send the client the replies pgcarpool owes it that are next in line. True when one
    /// of them was a ReadyForQuery.
    pub(super) fn answer_front(&mut self) -> bool {
        let mut ready = false;
        while let Some(Pending::Answer(a)) = self.server.pending.front() {
            let a = *a;
            self.server.pending.pop_front();
            let status = self.server.proto.tx_status;
            self.client.queue_with(|b| match a {
                Answer::ParseComplete => backend::parse_complete(b),
                Answer::CloseComplete => backend::close_complete(b),
                Answer::Query(tag) => {
                    backend::command_complete(b, tag);
                    backend::ready_for_query(b, status);
                }
            });
            ready |= matches!(a, Answer::Query(_));
        }
        ready
    }

    /// A server message that may complete the oldest pending response. True: it answers a
    /// message pgcarpool added, so the client must not see it.
    pub(super) fn on_server_completion(&mut self, tag: u8) -> bool {
        let pending = &mut self.server.pending;
        let Some(front) = pending.front() else {
            return false;
        };
        let (done, swallow) = match (tag, front) {
            (backend::PARSE_COMPLETE, Pending::Parse { swallow, stmt }) => {
                if let Some(s) = stmt {
                    s.set_validated();
                }
                (true, *swallow)
            }
            (backend::BIND_COMPLETE, Pending::Bind) => (true, false),
            (backend::CLOSE_COMPLETE, Pending::Close { swallow }) => (true, *swallow),
            (backend::ROW_DESCRIPTION | backend::NO_DATA, Pending::Describe) => (true, false),
            (
                backend::COMMAND_COMPLETE
                | backend::EMPTY_QUERY_RESPONSE
                | backend::PORTAL_SUSPENDED,
                Pending::Execute,
            ) => (true, false),
            (backend::READY_FOR_QUERY, Pending::Ready(_)) => (true, false),
            (backend::ERROR_RESPONSE, Pending::Ready(prepares)) => {
                if let Some(s) = prepares {
                    self.server.prepared.remove(s.id);
                }
                (false, false)
            }
            (backend::ERROR_RESPONSE, _) => {
                // The server skips everything up to the next Sync: those replies never come.
                while let Some(p) = pending.front() {
                    if matches!(p, Pending::Ready(_)) {
                        break;
                    }
                    if let Some(Pending::Parse { stmt: Some(s), .. }) = pending.pop_front() {
                        self.server.prepared.remove(s.id);
                    }
                }
                return false;
            }
            _ => (false, false),
        };
        if done {
            pending.pop_front();
        }
        swallow
    }
}

/// A statement made by SQL PREPARE (its key is the text after the name).
fn is_sql_prepared(stmt: &Stmt) -> bool {
    stmt.parse_rest.starts_with(b"\0PREPARE ")
}

/// An identifier in double quotes.
fn quoted(name: &[u8]) -> String {
    format!("\"{}\"", String::from_utf8_lossy(name).replace('"', "\"\""))
}

fn query_message(sql: &str) -> Bytes {
    let mut b = bytes::BytesMut::with_capacity(sql.len() + 6);
    frontend::query(&mut b, sql);
    b.freeze()
}
