//! A transaction whose server was lost under it (a switchover, a restart, a terminated
//! backend) in transaction pooling mode: the client keeps its connection and its virtual
//! session. It is told once (40001, or 08007 when a commit was under way), then pgcarpool
//! plays PostgreSQL's failed transaction block itself (ReadyForQuery 'E', 25P02 to
//! statements, errors skipped to Sync) until the client ends the block (ROLLBACK, or COMMIT
//! answered `ROLLBACK`). Its next transaction runs on whatever server the pool gives.
use bytes::Bytes;

use super::classify::{self, BlockExit};
use super::transaction::Local;
use super::{Client, ClientError};
use crate::proto::{self, backend, frontend};

/// What the client is told when the transaction certainly did not commit: it is safe to
/// run again (the code retry loops of pgjdbc, Spring, pgx and psycopg users retry).
pub const ROLLED_BACK: &str = "40001";
/// What it is told when a commit may have happened before the server was lost.
pub const UNKNOWN: &str = "08007";
/// PostgreSQL's words for a statement in a failed block.
const IN_FAILED_BLOCK: &str =
    "current transaction is aborted, commands ignored until end of transaction block";
/// Most portals of the failed block remembered (only those that end it are).
const MAX_PORTALS: usize = 16;

/// What the relay saw of the client's transaction when the server was lost.
#[derive(Debug, Clone, Default)]
pub struct Loss {
    /// Replies were owed (a Query or an extended-protocol round was sent).
    pub in_flight: bool,
    /// One ReadyForQuery was owed (a Query or a Sync was sent); else the round has no Sync
    /// yet and the client's messages up to it are skipped.
    pub ready_owed: bool,
    /// The status of the last ReadyForQuery: b'I', b'T' or b'E'.
    pub status: u8,
    /// What was in flight: may begin a block, may commit (`classify::transaction_control`).
    pub begins: bool,
    pub commits: bool,
    /// The server said FATAL (shutdown, terminated) before answering: what it was running
    /// was rolled back. Without it (connection lost, host fenced) a statement outside a
    /// block may have committed.
    pub fatal: bool,
}

/// The failed block pgcarpool plays for the client.
#[derive(Debug, Default)]
pub struct Aborted {
    /// The error for the client's next statement when it has not been told yet (its server
    /// was lost while it was idle in its transaction); None: 25P02.
    untold: Option<(&'static str, String)>,
    /// An error was given in this extended-protocol round: messages are skipped to Sync.
    skipping: bool,
    /// The block is over: the next Sync says 'I', and the client is served again.
    ended: bool,
    /// Portals bound to a statement that ends the block.
    portals: Vec<(Bytes, BlockExit)>,
}

/// Tell the client what it is owed now, and return the block it is left in, if any.
pub fn begin(c: &mut Client, loss: &Loss, why: &str) -> Option<Aborted> {
    let in_block = loss.status != b'I' || loss.begins;
    if !loss.in_flight {
        return match loss.status {
            b'I' => None,
            // Already failed (its own error): PostgreSQL's block goes on.
            b'E' => Some(Aborted::default()),
            _ => Some(Aborted {
                untold: Some((ROLLED_BACK, rolled_back(why))),
                ..Default::default()
            }),
        };
    }
    let committing = loss.commits || (loss.status == b'I' && !loss.begins && !loss.fatal);
    let (code, msg, after) = if committing {
        let msg = format!(
            "transaction resolution unknown: its server was lost ({why}) while it may have been committing"
        );
        (UNKNOWN, msg, b'I')
    } else {
        (
            ROLLED_BACK,
            rolled_back(why),
            if in_block { b'E' } else { b'I' },
        )
    };
    c.conn
        .queue_with(|b| backend::error_response(b, "ERROR", code, &msg));
    let mut a = Aborted {
        ended: after == b'I',
        ..Default::default()
    };
    if loss.ready_owed {
        c.conn.queue_with(|b| backend::ready_for_query(b, after));
    } else {
        a.skipping = true;
    }
    (a.skipping || !a.ended).then_some(a)
}

fn rolled_back(why: &str) -> String {
    format!(
        "could not serialize access: the transaction's server was lost ({why}); it was rolled back and may be run again"
    )
}

/// Answer the client's buffered messages as PostgreSQL does in a failed block. Returns
/// what was done and whether the block is over (the messages left then need a server).
pub(super) fn answer(c: &mut Client, a: &mut Aborted) -> Result<(Local, bool), ClientError> {
    let mut answered = false;
    // A message PostgreSQL refuses on its header ends the client, in a failed block too.
    while let Some(h) = frontend::header(&c.conn.rbuf)? {
        if h.total > proto::MAX_MESSAGE_LEN {
            return Err(proto::ProtoError::TooLong(h.total).into());
        }
        if c.conn.rbuf.len() < h.total || h.tag == frontend::TERMINATE {
            break;
        }
        if a.ended && !a.skipping && !matches!(h.tag, frontend::SYNC | frontend::FLUSH) {
            // Rolled back within the round: what follows runs on a server.
            return Ok((Local::NeedServer, true));
        }
        let msg = c.conn.rbuf.split_to(h.total).freeze();
        answered = true;
        let body = msg.slice(5..);
        match h.tag {
            frontend::SYNC => {
                a.skipping = false;
                let status = if a.ended { b'I' } else { b'E' };
                c.conn.queue_with(|b| backend::ready_for_query(b, status));
                if a.ended {
                    return Ok((Local::Answered, true));
                }
            }
            frontend::FLUSH => {}
            _ if a.skipping => {}
            frontend::QUERY => {
                if query(c, a, &body)? {
                    return Ok((Local::NeedServer, true));
                }
                if a.ended {
                    return Ok((Local::Answered, true));
                }
            }
            frontend::PARSE => parse(c, a, body)?,
            frontend::BIND => bind(c, a, &body)?,
            frontend::DESCRIBE => describe(c, a, &body)?,
            frontend::EXECUTE => execute(c, a, &body)?,
            frontend::CLOSE => close(c, a, &body)?,
            frontend::FUNCTION_CALL => {
                fail(c, a);
                c.conn.queue_with(|b| backend::ready_for_query(b, b'E'));
            }
            // CopyData, CopyDone, CopyFail out of a COPY: ignored, as by PostgreSQL.
            _ => {}
        }
    }
    Ok((
        if answered {
            Local::Answered
        } else {
            Local::Incomplete
        },
        false,
    ))
}

/// The error of a statement in the block: the one not told yet, else 25P02. In the
/// extended protocol, what follows is skipped to Sync.
fn fail(c: &mut Client, a: &mut Aborted) {
    let (code, msg) = a
        .untold
        .take()
        .unwrap_or(("25P02", IN_FAILED_BLOCK.to_string()));
    c.conn
        .queue_with(|b| backend::error_response(b, "ERROR", code, &msg));
}

/// A simple Query. True: it ends the block and holds more statements, which a server runs
/// (the message is put back).
fn query(c: &mut Client, a: &mut Aborted, body: &Bytes) -> Result<bool, ClientError> {
    let sql = frontend::parse_query(body)?;
    c.session.drop_unnamed();
    let stmts = classify::split(sql);
    let first = stmts.first().map(|&(x, y)| &sql[x..y]).unwrap_or(b"");
    let exit = classify::block_exit(first);
    if stmts.len() > 1 && exit == Some(BlockExit::Rollback)
        || (exit == Some(BlockExit::Commit) && a.untold.is_none() && stmts.len() > 1)
    {
        // Back in the buffer: the server answers the ROLLBACK or COMMIT with a warning
        // that no transaction is in progress, then runs the rest.
        let mut again = bytes::BytesMut::with_capacity(body.len() + 5 + c.conn.rbuf.len());
        again.extend_from_slice(&[frontend::QUERY]);
        again.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
        again.extend_from_slice(body);
        again.extend_from_slice(&c.conn.rbuf);
        c.conn.rbuf = again;
        a.ended = true;
        return Ok(true);
    }
    match exit {
        Some(BlockExit::Rollback) => {
            c.conn
                .queue_with(|b| backend::command_complete(b, "ROLLBACK"));
            a.ended = true;
        }
        Some(BlockExit::Commit) if a.untold.is_none() => {
            c.conn
                .queue_with(|b| backend::command_complete(b, "ROLLBACK"));
            a.ended = true;
        }
        // A COMMIT of a transaction that was lost: an error, then out of the block.
        Some(BlockExit::Commit) => {
            fail(c, a);
            a.ended = true;
        }
        None if stmts.is_empty() => c.conn.queue_with(backend::empty_query_response),
        None => fail(c, a),
    }
    let status = if a.ended { b'I' } else { b'E' };
    c.conn.queue_with(|b| backend::ready_for_query(b, status));
    Ok(false)
}

/// The text of a Parse body after the statement name.
fn text_of(rest: &[u8]) -> &[u8] {
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    &rest[..end]
}

fn parse(c: &mut Client, a: &mut Aborted, body: Bytes) -> Result<(), ClientError> {
    let name = proto::Reader::new(&body, "Parse").cstr_bytes()?;
    let name_len = name.len();
    let rest = body.slice(name_len + 1..);
    if name_len == 0 {
        c.session.drop_unnamed();
    }
    if classify::block_exit(text_of(&rest)).is_none() {
        fail(c, a);
        a.skipping = true;
        return Ok(());
    }
    if name_len == 0 {
        c.session.parsed_unnamed(&rest);
    } else {
        let name = body.slice(..name_len);
        if c.session.statements.contains_key(&name) {
            let msg = format!(
                "prepared statement \"{}\" already exists",
                String::from_utf8_lossy(&name)
            );
            c.conn
                .queue_with(|b| backend::error_response(b, "ERROR", "42P05", &msg));
            a.skipping = true;
            return Ok(());
        }
        let max = c.shared.config().settings.client_max_statements;
        if c.session.statements.len() >= max {
            return Err(ClientError::fatal(
                "53400",
                format!("too many prepared statements: client_max_statements is {max}"),
            ));
        }
        let scope = c.session.statement_scope(&rest);
        let stmt = c.shared.statements().intern(&scope, &rest).map_err(|e| {
            ClientError::fatal(
                "53400",
                format!("cannot keep another prepared statement: {e}"),
            )
        })?;
        c.session.statements.insert(name.clone(), stmt);
        let generation = c.shared.statements().changes_seen();
        c.session.parsed_name(name, generation);
    }
    c.conn.queue_with(backend::parse_complete);
    Ok(())
}

/// How the statement named `name` (empty: the unnamed one) ends the block, if it does.
fn statement_exit(c: &Client, name: &[u8]) -> Option<BlockExit> {
    if name.is_empty() {
        return c
            .session
            .ext
            .unnamed
            .as_deref()
            .and_then(|r| classify::block_exit(text_of(r)));
    }
    let s = c.session.statements.get(name)?;
    classify::block_exit(text_of(&s.parse_rest))
}

fn bind(c: &mut Client, a: &mut Aborted, body: &Bytes) -> Result<(), ClientError> {
    let mut r = proto::Reader::new(body, "Bind");
    let portal = r.cstr_bytes()?;
    let stmt = r.cstr_bytes()?;
    match statement_exit(c, stmt) {
        Some(kind) => {
            let portal = body.slice_ref(portal);
            a.portals.retain(|(p, _)| *p != portal);
            if a.portals.len() < MAX_PORTALS {
                a.portals.push((portal, kind));
            }
            c.conn.queue_with(|b| b.extend_from_slice(b"2\0\0\0\x04"));
        }
        None => {
            fail(c, a);
            a.skipping = true;
        }
    }
    Ok(())
}

fn portal_exit(a: &Aborted, name: &[u8]) -> Option<BlockExit> {
    a.portals
        .iter()
        .find(|(p, _)| p.as_ref() == name)
        .map(|(_, k)| *k)
}

fn describe(c: &mut Client, a: &mut Aborted, body: &Bytes) -> Result<(), ClientError> {
    let mut r = proto::Reader::new(body, "Describe");
    let kind = r.u8()?;
    let name = r.cstr_bytes()?;
    let exit = if kind == b'S' {
        statement_exit(c, name)
    } else {
        portal_exit(a, name)
    };
    if exit.is_none() {
        fail(c, a);
        a.skipping = true;
        return Ok(());
    }
    c.conn.queue_with(|b| {
        if kind == b'S' {
            // ParameterDescription: no parameters.
            b.extend_from_slice(b"t\0\0\0\x06\0\0");
        }
        b.extend_from_slice(b"n\0\0\0\x04");
    });
    Ok(())
}

fn execute(c: &mut Client, a: &mut Aborted, body: &Bytes) -> Result<(), ClientError> {
    let portal = proto::Reader::new(body, "Execute").cstr_bytes()?;
    match portal_exit(a, portal) {
        Some(BlockExit::Commit) if a.untold.is_some() => {
            fail(c, a);
            a.skipping = true;
        }
        Some(_) => {
            c.conn
                .queue_with(|b| backend::command_complete(b, "ROLLBACK"));
        }
        None => {
            fail(c, a);
            a.skipping = true;
            return Ok(());
        }
    }
    a.ended = true;
    a.portals.clear();
    Ok(())
}

fn close(c: &mut Client, a: &mut Aborted, body: &Bytes) -> Result<(), ClientError> {
    let mut r = proto::Reader::new(body, "Close");
    let kind = r.u8()?;
    let name = r.cstr_bytes()?;
    if kind == b'S' {
        if name.is_empty() {
            c.session.drop_unnamed();
        } else {
            c.session.statements.remove(name);
        }
    } else {
        a.portals.retain(|(p, _)| p.as_ref() != name);
    }
    c.conn.queue_with(backend::close_complete);
    Ok(())
}
