//! LISTEN without a pin: a client's LISTEN, UNLISTEN and `pg_listening_channels()` answered
//! from its virtual session and the pool's shared listener (`pool::listener`), and the
//! notifications it receives delivered between its transactions.
use std::sync::Arc;

use crate::shared::registry::ClientHandle;
use bytes::{BufMut, BytesMut};

use super::transaction::Local;
use super::{Client, ClientError};
use crate::config::PoolMode;
use crate::pool::Pool;
use crate::pool::listener::{Inbox, InboxEnd, Op};
use crate::proto::{self, backend, frontend};

/// What a client has to do with the pool's listener; boxed and made only once it has
/// (most clients never listen: an idle client's task carries one pointer for it).
#[derive(Default)]
pub struct Listening(Option<Box<ListeningState>>);

/// The channels a client listens on through the pool's listener, in the order it listened
/// (`pg_listening_channels()`'s); given up when the client goes.
#[derive(Default)]
pub struct ListeningState {
    inbox: Option<Arc<Inbox>>,
    channels: Vec<String>,
    /// The pool and the client's id, once it asked the pool's listener for something or
    /// claimed a server.
    owner: Option<(Arc<Pool>, u64)>,
    /// It asked the listener to LISTEN at least once.
    asked: bool,
    /// The LISTENs and UNLISTENs of the listener's channels its transaction sent inside a
    /// block (`in_block_query`), in order: which committed is read back from the server
    /// after it.
    in_block: Vec<String>,
}

impl Listening {
    pub fn is_listening(&self) -> bool {
        self.0.as_ref().is_some_and(|s| !s.channels.is_empty())
    }

    /// Where the pool's listener queues the client's notifications (None: it never listened).
    pub fn inbox(&self) -> Option<Arc<Inbox>> {
        self.0.as_ref().and_then(|s| s.inbox.clone())
    }

    pub fn channels(&self) -> &[String] {
        self.0.as_deref().map_or(&[], |s| &s.channels)
    }

    /// These LISTENs or UNLISTENs (`in_block_query`'s operations) went inside a
    /// transaction block.
    pub fn note_in_block(&mut self, ops: Vec<String>) {
        if !ops.is_empty() {
            self.state().in_block = ops;
        }
    }

    /// Which did (since the last call)?
    pub fn take_in_block(&mut self) -> Vec<String> {
        self.0
            .as_mut()
            .map_or_else(Vec::new, |s| std::mem::take(&mut s.in_block))
    }

    fn state(&mut self) -> &mut ListeningState {
        self.0.get_or_insert_with(Box::default)
    }
}

impl Drop for ListeningState {
    fn drop(&mut self) {
        if let Some((pool, id)) = &self.owner {
            pool.listener.forget(*id, self.asked);
        }
    }
}

/// A statement pgcarpool answers for a client that is not pinned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stmt {
    Listen(String),
    /// None: UNLISTEN *.
    Unlisten(Option<String>),
    /// `SELECT pg_listening_channels()` and `SELECT * FROM pg_listening_channels()`.
    Channels,
}

/// PostgreSQL's identifiers are cut at NAMEDATALEN - 1 bytes (with a NOTICE): longer
/// names go to a server.
const MAX_IDENT: usize = 63;

/// The statement `sql` is, if it is one LISTEN, UNLISTEN or pg_listening_channels() call
/// alone (comments, case, quoting and a final `;` as PostgreSQL reads them); None for
/// anything else (which goes to a server as before).
pub fn parse(sql: &[u8]) -> Option<Stmt> {
    let s = crate::sql::classify::strip_leading(sql);
    let (word, rest) = word(s)?;
    let stmt;
    let rest = if word.eq_ignore_ascii_case(b"listen") || word.eq_ignore_ascii_case(b"unlisten") {
        let rest = crate::sql::classify::strip_leading(rest);
        let listen = word.eq_ignore_ascii_case(b"listen");
        if !listen && rest.first() == Some(&b'*') {
            stmt = Stmt::Unlisten(None);
            &rest[1..]
        } else {
            let (name, rest) = ident(rest)?;
            stmt = if listen {
                Stmt::Listen(name)
            } else {
                Stmt::Unlisten(Some(name))
            };
            rest
        }
    } else if word.eq_ignore_ascii_case(b"select") {
        stmt = Stmt::Channels;
        channels_call(crate::sql::classify::strip_leading(rest))?
    } else {
        return None;
    };
    let rest = crate::sql::classify::strip_leading(rest);
    let rest = rest.strip_prefix(b";").unwrap_or(rest);
    crate::sql::classify::strip_leading(rest)
        .is_empty()
        .then_some(stmt)
}

/// A keyword and what follows it.
fn word(s: &[u8]) -> Option<(&[u8], &[u8])> {
    let end = s
        .iter()
        .position(|c| !c.is_ascii_alphabetic())
        .unwrap_or(s.len());
    (end > 0).then(|| s.split_at(end))
}

/// An identifier as PostgreSQL reads it: quoted as written, unquoted folded to lower case.
fn ident(s: &[u8]) -> Option<(String, &[u8])> {
    let (name, rest) = if s.first() == Some(&b'"') {
        let mut name = Vec::new();
        let mut i = 1;
        loop {
            match s.get(i)? {
                b'"' if s.get(i + 1) == Some(&b'"') => {
                    name.push(b'"');
                    i += 2;
                }
                b'"' => break,
                &c => {
                    name.push(c);
                    i += 1;
                }
            }
        }
        (name, &s[i + 1..])
    } else {
        let first = *s.first()?;
        if !(first.is_ascii_alphabetic() || first == b'_' || first >= 0x80) {
            return None;
        }
        let end = s
            .iter()
            .position(|&c| !(c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c >= 0x80))
            .unwrap_or(s.len());
        let word = s[..end].to_ascii_lowercase();
        if NOT_NAMES.iter().any(|k| k.as_bytes() == word.as_slice()) {
            // PostgreSQL refuses these unquoted: its error comes from a server.
            return None;
        }
        (word, &s[end..])
    };
    if name.is_empty() || name.len() > MAX_IDENT || name.contains(&0) {
        return None;
    }
    Some((String::from_utf8(name).ok()?, rest))
}

/// PostgreSQL's reserved and type/function-name keywords: not a name unless quoted.
const NOT_NAMES: &[&str] = &[
    "all",
    "analyse",
    "analyze",
    "and",
    "any",
    "array",
    "as",
    "asc",
    "asymmetric",
    "both",
    "case",
    "cast",
    "check",
    "collate",
    "column",
    "constraint",
    "create",
    "current_catalog",
    "current_date",
    "current_role",
    "current_time",
    "current_timestamp",
    "current_user",
    "default",
    "deferrable",
    "desc",
    "distinct",
    "do",
    "else",
    "end",
    "except",
    "false",
    "fetch",
    "for",
    "foreign",
    "from",
    "grant",
    "group",
    "having",
    "in",
    "initially",
    "intersect",
    "into",
    "lateral",
    "leading",
    "limit",
    "localtime",
    "localtimestamp",
    "not",
    "null",
    "offset",
    "on",
    "only",
    "or",
    "order",
    "placing",
    "primary",
    "references",
    "returning",
    "select",
    "session_user",
    "some",
    "symmetric",
    "table",
    "then",
    "to",
    "trailing",
    "true",
    "union",
    "unique",
    "user",
    "using",
    "variadic",
    "when",
    "where",
    "window",
    "with",
    "authorization",
    "binary",
    "collation",
    "concurrently",
    "cross",
    "current_schema",
    "freeze",
    "full",
    "ilike",
    "inner",
    "is",
    "isnull",
    "join",
    "left",
    "like",
    "natural",
    "notnull",
    "outer",
    "overlaps",
    "right",
    "similar",
    "tablesample",
    "verbose",
];

/// After SELECT: `[* FROM] [pg_catalog.]pg_listening_channels()`; the rest of the text.
fn channels_call(s: &[u8]) -> Option<&[u8]> {
    let s = match s.strip_prefix(b"*") {
        Some(rest) => {
            let (from, rest) = word(crate::sql::classify::strip_leading(rest))?;
            if !from.eq_ignore_ascii_case(b"from") {
                return None;
            }
            crate::sql::classify::strip_leading(rest)
        }
        None => s,
    };
    let s = strip_prefix_ci(s, b"pg_catalog.").unwrap_or(s);
    let s = strip_prefix_ci(s, b"pg_listening_channels")?;
    let s = crate::sql::classify::strip_leading(s).strip_prefix(b"(")?;
    crate::sql::classify::strip_leading(s).strip_prefix(b")")
}

fn strip_prefix_ci<'a>(s: &'a [u8], p: &[u8]) -> Option<&'a [u8]> {
    (s.len() >= p.len() && s[..p.len()].eq_ignore_ascii_case(p)).then(|| &s[p.len()..])
}

/// What an idle client's buffered request is, if pgcarpool answers it itself: the
/// statement, how many bytes of the buffer it takes, and, when it came as Parse, Bind,
/// Describe, Execute and Sync rather than a Query, the messages after the Parse (`B`ind,
/// `E`xecute, Describe `S`tatement or `P`ortal) in order.
struct Request {
    stmt: Stmt,
    len: usize,
    extended: Option<Vec<u8>>,
    /// It began with a Parse (else with a Bind of a statement the client prepared before).
    parsed: bool,
}

/// The client's buffered messages, when they are one statement pgcarpool answers: a
/// Query, or the unnamed Parse (no parameters), then Bind (no parameters), Execute and any
/// Describes of the unnamed statement and portal, then Sync; or a Bind (no parameters) of
/// a statement the client prepared by name (`named`: its Parse body after the name), then
/// Execute and Sync (asyncpg's `add_listener` prepares `LISTEN` through its statement
/// cache).
fn request(
    buf: &[u8],
    named: impl Fn(&[u8]) -> Option<bytes::Bytes>,
) -> Result<Option<Request>, proto::ProtoError> {
    let Some(h) = proto::header(buf, proto::MAX_MESSAGE_LEN)? else {
        return Ok(None);
    };
    if buf.len() < h.total {
        return Ok(None);
    }
    let body = &buf[5..h.total];
    if h.tag == frontend::QUERY {
        let sql = frontend::parse_query(body)?;
        return Ok(parse(sql).map(|stmt| Request {
            stmt,
            len: h.total,
            extended: None,
            parsed: false,
        }));
    }
    let (stmt, mut steps) = match h.tag {
        frontend::PARSE => {
            let mut r = proto::Reader::new(body, "Parse");
            if !r.cstr_bytes()?.is_empty() {
                return Ok(None);
            }
            match statement(r.remaining())? {
                Some(stmt) => (stmt, Vec::new()),
                None => return Ok(None),
            }
        }
        frontend::BIND => {
            let mut r = proto::Reader::new(body, "Bind");
            let portal = r.cstr_bytes()?;
            let name = r.cstr_bytes()?;
            if !portal.is_empty() || name.is_empty() || !bind_without_params(body)? {
                return Ok(None);
            }
            match named(name)
                .map(|rest| statement(&rest))
                .transpose()?
                .flatten()
            {
                Some(stmt) => (stmt, vec![b'B']),
                None => return Ok(None),
            }
        }
        _ => return Ok(None),
    };
    let parsed = h.tag == frontend::PARSE;
    let mut at = h.total;
    loop {
        if steps.len() > 8 {
            return Ok(None);
        }
        let Some(m) = proto::header(&buf[at..], proto::MAX_MESSAGE_LEN)? else {
            return Ok(Some(partial(stmt)));
        };
        if buf.len() - at < m.total {
            return Ok(Some(partial(stmt)));
        }
        let body = &buf[at + 5..at + m.total];
        at += m.total;
        let bound = steps.contains(&b'B');
        let step = match m.tag {
            frontend::SYNC if steps.last() == Some(&b'E') => {
                return Ok(Some(Request {
                    stmt,
                    len: at,
                    extended: Some(steps),
                    parsed,
                }));
            }
            frontend::BIND if !bound && unnamed_bind_without_params(body)? => b'B',
            frontend::DESCRIBE if body.get(1..) == Some(&[0][..]) => match body[0] {
                b'S' if parsed => b'S',
                b'P' if bound => b'P',
                _ => return Ok(None),
            },
            frontend::EXECUTE if bound && body.first() == Some(&0) => b'E',
            _ => return Ok(None),
        };
        steps.push(step);
    }
}

/// A named Parse of a statement we answer, with an optional Describe of it, then Flush or
/// Sync (asyncpg prepares so): the parts of the buffer it takes.
struct Prepare {
    stmt: Stmt,
    /// The statement's name.
    name: std::ops::Range<usize>,
    /// The Parse body after the name.
    rest: std::ops::Range<usize>,
    described: bool,
    sync: bool,
    len: usize,
}

/// The client's buffered messages, when they are a named Parse of a LISTEN, UNLISTEN or
/// pg_listening_channels() call (no parameters), then Describe of it, then Flush or Sync.
fn prepare_request(buf: &[u8]) -> Result<Option<Prepare>, proto::ProtoError> {
    let Some(h) = proto::header(buf, proto::MAX_MESSAGE_LEN)? else {
        return Ok(None);
    };
    if h.tag != frontend::PARSE || buf.len() < h.total {
        return Ok(None);
    }
    let body = &buf[5..h.total];
    let name = proto::Reader::new(body, "Parse").cstr_bytes()?;
    if name.is_empty() {
        return Ok(None);
    }
    let Some(stmt) = statement(&body[name.len() + 1..])? else {
        return Ok(None);
    };
    let mut p = Prepare {
        stmt,
        name: 5..5 + name.len(),
        rest: 5 + name.len() + 1..h.total,
        described: false,
        sync: false,
        len: h.total,
    };
    loop {
        let Some(m) = proto::header(&buf[p.len..], proto::MAX_MESSAGE_LEN)? else {
            return Ok(None);
        };
        if buf.len() - p.len < m.total {
            return Ok(None);
        }
        let body = &buf[p.len + 5..p.len + m.total];
        p.len += m.total;
        match m.tag {
            frontend::DESCRIBE
                if !p.described
                    && body.first() == Some(&b'S')
                    && body.get(1..body.len().saturating_sub(1)) == Some(name) =>
            {
                p.described = true;
            }
            frontend::FLUSH => return Ok(Some(p)),
            frontend::SYNC => {
                p.sync = true;
                return Ok(Some(p));
            }
            _ => return Ok(None),
        }
    }
}

/// Answer a named Parse of a statement we answer: the name goes into the client's virtual
/// session (a later Bind of it is answered here, or prepares it on a server as any other).
fn prepare(c: &mut Client, p: Prepare) -> Local {
    let max = c.shared.config().settings.client_max_statements;
    if c.session.statements.len() >= max {
        return Local::NeedServer;
    }
    let rest = &c.conn.rbuf[p.rest.clone()];
    let scope = c.session.statement_scope(rest);
    let Ok(stmt) = c.shared.statements().intern(&scope, rest) else {
        // The registry is full: the relay gives the client the registry's error.
        return Local::NeedServer;
    };
    let msgs = c.conn.rbuf.split_to(p.len).freeze();
    let name = msgs.slice(p.name.clone());
    c.session.statements.insert(name.clone(), stmt);
    let generation = c.shared.statements().changes_seen();
    c.session.parsed_name(name, generation);
    let mut out = BytesMut::new();
    backend::parse_complete(&mut out);
    if p.described {
        out.put_slice(&[b't', 0, 0, 0, 6, 0, 0]);
        if p.stmt == Stmt::Channels {
            backend::row_description(&mut out, &[("pg_listening_channels", 25)]);
        } else {
            out.put_slice(&[backend::NO_DATA, 0, 0, 0, 4]);
        }
    }
    if p.sync {
        backend::ready_for_query(&mut out, b'I');
    }
    c.conn.queue(out.freeze());
    Local::Answered
}

/// Ours, the rest not all there yet (len 0): wait for it rather than send it to a server.
fn partial(stmt: Stmt) -> Request {
    Request {
        stmt,
        len: 0,
        extended: None,
        parsed: false,
    }
}

/// The statement of a Parse body after the name (query, parameter types), if it is one we
/// answer and declares no parameters.
fn statement(rest: &[u8]) -> Result<Option<Stmt>, proto::ProtoError> {
    let mut r = proto::Reader::new(rest, "Parse");
    let Some(stmt) = parse(r.cstr_bytes()?) else {
        return Ok(None);
    };
    Ok((r.i16()? == 0).then_some(stmt))
}

/// A Bind of the unnamed statement to the unnamed portal, with no parameters.
fn unnamed_bind_without_params(body: &[u8]) -> Result<bool, proto::ProtoError> {
    let mut r = proto::Reader::new(body, "Bind");
    if !r.cstr_bytes()?.is_empty() || !r.cstr_bytes()?.is_empty() {
        return Ok(false);
    }
    bind_without_params(body)
}

/// A Bind with no parameters.
fn bind_without_params(body: &[u8]) -> Result<bool, proto::ProtoError> {
    let mut r = proto::Reader::new(body, "Bind");
    r.cstr_bytes()?;
    r.cstr_bytes()?;
    let formats = r.i16()?;
    for _ in 0..formats.max(0) {
        r.i16()?;
    }
    Ok(r.i16()? == 0)
}

/// An idle client that is not pinned and whose buffered request is a LISTEN, UNLISTEN or
/// pg_listening_channels() call (transaction and statement mode): answered here, through
/// the pool's listener. None: not such a request.
///
/// A pinned client's requests go to its server, but for the channels it listened on
/// through the listener before it was pinned: its LISTEN or UNLISTEN of one of them is
/// answered here too (its server never listened on them), and `UNLISTEN *` gives them up
/// before it goes to its server.
pub(super) async fn answer(
    c: &mut Client,
    kill: &ClientHandle,
) -> Result<Option<Local>, ClientError> {
    let pinned = c.session.pin.is_some();
    if c.pool.settings().mode == PoolMode::Session || (pinned && !c.listening.is_listening()) {
        return Ok(None);
    }
    if !pinned && let Some(p) = prepare_request(&c.conn.rbuf)? {
        return Ok(Some(prepare(c, p)));
    }
    let statements = &c.session.statements;
    // (A statement with no effects is none of ours: most Binds are looked at no further.)
    let named = |name: &[u8]| {
        statements
            .get(name)
            .filter(|s| s.effects.is_some())
            .map(|s| s.parse_rest.clone())
    };
    let Some(req) = request(&c.conn.rbuf, named)? else {
        return Ok(None);
    };
    if req.len == 0 {
        return Ok(Some(Local::Incomplete));
    }
    if pinned {
        match &req.stmt {
            Stmt::Listen(ch) | Stmt::Unlisten(Some(ch)) if c.listening.channels().contains(ch) => {}
            Stmt::Unlisten(None) => {
                let r = tokio::select! {
                    r = ask(c, Op::Unlisten(None)) => r,
                    _ = kill.killed() => return Err(super::transaction::killed(c)),
                };
                r.map_err(|e| ClientError::Fatal {
                    code: lost_code(&e.code),
                    message: e.message,
                })?;
                return Ok(None);
            }
            _ => return Ok(None),
        }
    }
    let msgs = c.conn.rbuf.split_to(req.len).freeze();
    if req.extended.is_none() {
        // A simple Query: PostgreSQL drops the unnamed statement.
        c.session.drop_unnamed();
    }
    if req.parsed {
        // The client's unnamed statement is now this one (a later Bind runs it on a server).
        let body = &msgs[5..];
        c.session.parsed_unnamed(&body[1..]);
    }
    let outcome = match &req.stmt {
        Stmt::Channels => Ok(()),
        Stmt::Listen(ch) if c.listening.channels().contains(ch) => Ok(()),
        Stmt::Unlisten(Some(ch)) if !c.listening.channels().contains(ch) => Ok(()),
        Stmt::Unlisten(None) if !c.listening.is_listening() => Ok(()),
        Stmt::Listen(ch) => {
            let op = Op::Listen(ch.clone());
            tokio::select! {
                r = ask(c, op) => r,
                _ = kill.killed() => return Err(super::transaction::killed(c)),
            }
        }
        Stmt::Unlisten(which) => {
            let op = Op::Unlisten(which.clone());
            tokio::select! {
                r = ask(c, op) => r,
                _ = kill.killed() => return Err(super::transaction::killed(c)),
            }
        }
    };
    deliver(c)?;
    let out = reply(&req, c.listening.channels(), outcome);
    c.conn.queue(out.freeze());
    Ok(Some(Local::Answered))
}

/// The channels on which a transaction block records the LISTENs and UNLISTENs it made of
/// the listener's channels (`in_block_query`), the n-th by listening on `pgcarpool_listen_n`:
/// a LISTEN is a pending action of the transaction as the client's own (no snapshot taken;
/// a rollback, to a savepoint too, takes back what it undoes; `RESET ALL` leaves it, which
/// took back a record kept in a setting: long-run seed 10301), applied at commit and read
/// back and given up after the transaction (`after_block`). What each records is kept by
/// pgcarpool (its operations, in order).
const IN_BLOCK_MARKER: &str = "pgcarpool_listen_";

/// At most this many LISTENs and UNLISTENs a transaction are recorded so; later ones go
/// to the server as written.
pub(super) const MAX_IN_BLOCK: usize = 64;

/// A client's simple Query that is one LISTEN or UNLISTEN, inside a transaction block, of a
/// channel it listens on through the pool's listener (`channels`; UNLISTEN * when it has
/// any), the `n`-th of its transaction (from 1): the query to send in its place, and
/// whether it is a LISTEN. The server runs the statement (its replies, errors and
/// transaction are PostgreSQL's) without listening on the channel (a LISTEN is followed
/// by an UNLISTEN: each notification would come twice, from the server and from the
/// listener), then records the operation by listening on `IN_BLOCK_MARKER`n, whose replies
/// the relay drops. Also the operation (`L<hex>`, `U<hex>`, `*`: `in_block_ops`). None: the
/// query goes as written.
pub(super) fn in_block_query(
    sql: &[u8],
    channels: &[String],
    n: usize,
) -> Option<(String, bool, String)> {
    use crate::pool::listener::quote_ident;
    if n == 0 || n > MAX_IN_BLOCK {
        return None;
    }
    let hex = |ch: &str| ch.bytes().map(|b| format!("{b:02x}")).collect::<String>();
    let (first, op, listen) = match parse(sql)? {
        Stmt::Listen(ch) if channels.contains(&ch) => {
            let q = quote_ident(&ch);
            (
                format!("LISTEN {q}; UNLISTEN {q}"),
                format!("L{}", hex(&ch)),
                true,
            )
        }
        Stmt::Unlisten(Some(ch)) if channels.contains(&ch) => {
            let op = format!("U{}", hex(&ch));
            (format!("UNLISTEN {}", quote_ident(&ch)), op, false)
        }
        Stmt::Unlisten(None) if !channels.is_empty() => ("UNLISTEN *".into(), "*".into(), false),
        _ => return None,
    };
    Some((format!("{first}; LISTEN {IN_BLOCK_MARKER}{n}"), listen, op))
}

/// A client's LISTEN or UNLISTEN (`parse_rest`: its Parse body after the name) just
/// executed in the extended protocol, of a channel it listens on through the pool's
/// listener (`channels`; UNLISTEN * when it has any), the `n`-th of its transaction: what
/// pgcarpool runs after it within the client's round (a LISTEN is undone, so that the
/// server never listens on the listener's channel, then `LISTEN pgcarpool_listen_<n>`
/// records it as `in_block_query`'s), and the operation. None: nothing to add.
pub(super) fn after_execute(
    parse_rest: &[u8],
    channels: &[String],
    n: usize,
) -> Option<(Vec<String>, String)> {
    let sql = parse_rest.split(|&c| c == 0).next()?;
    let (_, _, op) = in_block_query(sql, channels, n)?;
    let mut stmts = Vec::new();
    if let Some(Stmt::Listen(ch)) = parse(sql) {
        stmts.push(format!(
            "UNLISTEN {}",
            crate::pool::listener::quote_ident(&ch)
        ));
    }
    stmts.push(format!("LISTEN {IN_BLOCK_MARKER}{n}"));
    Some((stmts, op))
}

/// The operations recorded by `in_block_query` (`L<hex>`, `U<hex>`, `*`), comma-separated,
/// in order.
fn in_block_ops(recorded: &str) -> Vec<Op> {
    let unhex = |h: &str| {
        let bytes: Option<Vec<u8>> = (0..h.len() / 2)
            .map(|i| u8::from_str_radix(h.get(2 * i..2 * i + 2)?, 16).ok())
            .collect();
        String::from_utf8(bytes?).ok()
    };
    recorded
        .split(',')
        .filter_map(|op| match op.split_at_checked(1)? {
            ("*", _) => Some(Op::Unlisten(None)),
            ("L", h) => unhex(h).map(Op::Listen),
            ("U", h) => unhex(h).map(|ch| Op::Unlisten(Some(ch))),
            _ => None,
        })
        .collect()
}

/// After a transaction in which LISTENs or UNLISTENs of the listener's channels went as
/// `in_block_query`: what its block committed (none if it rolled back) is done through the
/// pool's listener, and the server's records are reset (before the settings are read
/// back: they are none of the client's). Err: the server or the listener failed.
pub(super) async fn after_block(
    c: &mut Client,
    server: &mut crate::server::Server,
) -> Result<(), ClientError> {
    let ops = c.listening.take_in_block();
    if ops.is_empty() {
        return Ok(());
    }
    let mut sql = "select pg_catalog.pg_listening_channels()".to_string();
    for k in 1..=ops.len() {
        sql.push_str(&format!("; unlisten {IN_BLOCK_MARKER}{k}"));
    }
    let sets = crate::server::query::query_sets(server, &sql)
        .await
        .map_err(|e| ClientError::fatal("08006", format!("server connection lost: {e}")))?;
    let mut committed: Vec<usize> = sets
        .into_iter()
        .next()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|row| row.into_iter().next().flatten())
        .filter_map(|ch| ch.strip_prefix(IN_BLOCK_MARKER)?.parse().ok())
        .filter(|&k| (1..=ops.len()).contains(&k))
        .collect();
    committed.sort_unstable();
    let recorded: Vec<&str> = committed.iter().map(|&k| ops[k - 1].as_str()).collect();
    let mut unlistened = false;
    for op in in_block_ops(&recorded.join(",")) {
        unlistened |= matches!(op, Op::Unlisten(_));
        let done = match &op {
            Op::Listen(ch) => c.listening.channels().contains(ch),
            Op::Unlisten(Some(ch)) => !c.listening.channels().contains(ch),
            Op::Unlisten(None) => !c.listening.is_listening(),
            Op::Sync => true,
        };
        if !done {
            ask(c, op).await.map_err(|e| ClientError::Fatal {
                code: lost_code(&e.code),
                message: e.message,
            })?;
        }
    }
    if unlistened && let Some(inbox) = c.listening.inbox() {
        // What came during the transaction is not delivered yet: as PostgreSQL, which
        // reads it after the commit, nothing of a channel given up.
        let channels = c.listening.channels();
        inbox.retain_channels(|ch| channels.iter().any(|c| c.as_bytes() == ch));
    }
    Ok(())
}

/// After a transaction that left its server listening (a LISTEN pgcarpool did not answer
/// itself: in a transaction block, in the extended protocol, among other statements, in
/// code it cannot read): the channels the server listens on now are exactly what
/// PostgreSQL committed (a rollback, to a savepoint too, took its LISTENs back). They go to
/// the pool's listener and the server stops listening, so that the client needs no pin.
/// What the server was sent meanwhile is held for the client (`Server::take_notifications`).
/// Err (outer): the server failed; (inner): the listener did.
pub(super) async fn take_channels(
    c: &mut Client,
    server: &mut crate::server::Server,
) -> Result<Result<(), ClientError>, crate::server::ServerError> {
    let sql = "select pg_catalog.pg_listening_channels(); unlisten *";
    let sets = crate::server::query::query_sets(server, sql).await?;
    let channels = sets.into_iter().next().unwrap_or_default();
    for ch in channels
        .into_iter()
        .filter_map(|r| r.into_iter().next().flatten())
    {
        if c.listening.channels().contains(&ch) {
            continue;
        }
        if let Err(e) = ask(c, Op::Listen(ch)).await {
            return Ok(Err(ClientError::Fatal {
                code: lost_code(&e.code),
                message: e.message,
            }));
        }
    }
    Ok(Ok(()))
}

/// Ask the pool's listener for `op` on behalf of the client and keep its channels.
async fn ask(c: &mut Client, op: Op) -> Result<(), backend::ErrorFields> {
    let limit = c.shared.config().settings.notify_queue_limit;
    let (id, pool) = (c.reg.handle.id, c.pool.clone());
    let state = c.listening.state();
    let inbox = state.inbox.get_or_insert_with(|| Inbox::new(limit)).clone();
    inbox.set_limit(limit);
    state.owner.get_or_insert((pool, id));
    c.listening.state().asked |= matches!(op, Op::Listen(_));
    let pool = c.pool.clone();
    pool.listener
        .ask(|| pool.listener_target(), id, Some(&inbox), op.clone())
        .await?;
    let chans = &mut c.listening.state().channels;
    match op {
        Op::Listen(ch) => chans.push(ch),
        Op::Unlisten(Some(ch)) => chans.retain(|x| *x != ch),
        Op::Unlisten(None) => chans.clear(),
        Op::Sync => {}
    }
    Ok(())
}

/// The replies PostgreSQL would send, in order.
fn reply(
    req: &Request,
    channels: &[String],
    outcome: Result<(), backend::ErrorFields>,
) -> BytesMut {
    let mut out = BytesMut::new();
    let rows = matches!(req.stmt, Stmt::Channels);
    let describe = |out: &mut BytesMut| {
        if rows {
            backend::row_description(out, &[("pg_listening_channels", 25)]);
        } else {
            out.put_slice(&[backend::NO_DATA, 0, 0, 0, 4]);
        }
    };
    match &req.extended {
        None => {
            if rows {
                backend::row_description(&mut out, &[("pg_listening_channels", 25)]);
            }
            execute(&mut out, req, channels, outcome);
        }
        Some(steps) => {
            if req.parsed {
                backend::parse_complete(&mut out);
            }
            let mut outcome = Some(outcome);
            for step in steps {
                match step {
                    b'B' => out.put_slice(&[backend::BIND_COMPLETE, 0, 0, 0, 4]),
                    b'S' => {
                        out.put_slice(&[b't', 0, 0, 0, 6, 0, 0]);
                        describe(&mut out);
                    }
                    b'P' => describe(&mut out),
                    _ => {
                        let o = outcome.take().unwrap_or(Ok(()));
                        execute(&mut out, req, channels, o);
                    }
                }
            }
        }
    }
    backend::ready_for_query(&mut out, b'I');
    out
}

/// What the statement's execution sends: its rows and CommandComplete, or its error.
fn execute(
    out: &mut BytesMut,
    req: &Request,
    channels: &[String],
    outcome: Result<(), backend::ErrorFields>,
) {
    if let Err(e) = outcome {
        return backend::error_response(out, "ERROR", &e.code, &e.message);
    }
    let tag = match &req.stmt {
        Stmt::Listen(_) => "LISTEN".to_string(),
        Stmt::Unlisten(_) => "UNLISTEN".to_string(),
        Stmt::Channels => {
            for ch in channels {
                backend::data_row(out, [Some(ch.as_str())].into_iter());
            }
            format!("SELECT {}", channels.len())
        }
    };
    backend::command_complete(out, &tag);
}

/// Notifications are moved from the inbox to the client's output only while less than this
/// waits to be written: a client that does not read has them counted in its inbox (and
/// bounded by notify_queue_limit), not piling up in its output.
const DELIVER_BELOW: usize = 256 * 1024;

/// Give the client what its inbox holds (it is between transactions); Err: it must go.
pub(super) fn deliver(c: &mut Client) -> Result<(), ClientError> {
    let Some(inbox) = c.listening.inbox() else {
        return Ok(());
    };
    match inbox.take(c.conn.out_len() < DELIVER_BELOW) {
        Ok(None) => Ok(()),
        Ok(Some(b)) => {
            c.conn.queue(b);
            Ok(())
        }
        Err(InboxEnd::Overflow(limit)) => Err(ClientError::fatal(
            "54000",
            format!(
                "too many notifications queued for this client: notify_queue_limit is {limit} bytes"
            ),
        )),
        Err(InboxEnd::Lost(code, message)) => Err(ClientError::Fatal {
            code: lost_code(&code),
            message,
        }),
    }
}

/// The SQLSTATE the listener's server ended with, as a static string.
fn lost_code(code: &str) -> &'static str {
    const KNOWN: [&str; 6] = ["57P01", "57P02", "57P03", "57P04", "08006", "08P01"];
    KNOWN
        .iter()
        .find(|k| **k == code)
        .copied()
        .unwrap_or("08006")
}

/// Resolves when something was queued for the client (never when it listens on nothing).
pub(super) async fn woken(inbox: Option<Arc<Inbox>>) {
    match inbox {
        Some(i) => i.wake.notified().await,
        None => std::future::pending().await,
    }
}

/// A client starts a transaction on the server with this pid while the pool's listener
/// runs: what the server notifies meanwhile carries the pid the client was given, as it
/// would from its own session.
pub(super) fn claim(c: &mut Client, server_pid: i32) -> bool {
    if !c.pool.listener.is_running() {
        return false;
    }
    let id = c.reg.handle.id;
    let pool = c.pool.clone();
    c.listening.state().owner.get_or_insert((pool, id));
    c.pool.listener.claim(server_pid, id, c.session.backend_pid);
    true
}

/// The transaction is over (its server goes back): when it may have notified, the
/// listener first sees its notifications through (they reach every listener with the
/// client's pid, the client itself before its ReadyForQuery); DISCARD ALL gives up every
/// channel. Err: the listener's error.
pub(super) async fn after_transaction(
    c: &mut Client,
    server_pid: i32,
    claimed: bool,
    notified: bool,
    discard_all: bool,
) -> Result<(), ClientError> {
    let mut r = Ok(());
    if claimed {
        if notified {
            let pool = c.pool.clone();
            let id = c.reg.handle.id;
            r = pool
                .listener
                .ask(|| pool.listener_target(), id, None, Op::Sync)
                .await;
        }
        c.pool.listener.unclaim(server_pid, c.reg.handle.id);
    }
    if discard_all && c.listening.is_listening() && r.is_ok() {
        r = ask(c, Op::Unlisten(None)).await;
    }
    r.map_err(|e| ClientError::Fatal {
        code: lost_code(&e.code),
        message: e.message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listens_in_a_block_are_recorded_and_read_back() {
        let chans = ["ch0".to_string(), "A\"b".to_string()];
        let (sql, listen, op) = in_block_query(b"LISTEN ch0", &chans, 1).unwrap();
        assert!(listen);
        assert_eq!(
            sql,
            "LISTEN \"ch0\"; UNLISTEN \"ch0\"; LISTEN pgcarpool_listen_1"
        );
        assert_eq!(op, "L636830");
        let (sql, listen, op) = in_block_query(b"unlisten \"A\"\"b\"", &chans, 2).unwrap();
        assert!(!listen);
        assert_eq!(sql, "UNLISTEN \"A\"\"b\"; LISTEN pgcarpool_listen_2");
        assert_eq!(op, "U412262");
        let (sql, _, op) = in_block_query(b"UNLISTEN *", &chans, 3).unwrap();
        assert_eq!(sql, "UNLISTEN *; LISTEN pgcarpool_listen_3");
        assert_eq!(op, "*");
        assert!(in_block_query(b"LISTEN ch0", &chans, MAX_IN_BLOCK + 1).is_none());
        // Channels the listener does not have for the client go to the server as written.
        assert!(in_block_query(b"LISTEN ch1", &chans, 1).is_none());
        assert!(in_block_query(b"UNLISTEN *", &[], 1).is_none());
        assert!(in_block_query(b"NOTIFY ch0", &chans, 1).is_none());
        assert_eq!(
            in_block_ops("U636830,L412262,*,L636830,"),
            vec![
                Op::Unlisten(Some("ch0".into())),
                Op::Listen("A\"b".into()),
                Op::Unlisten(None),
                Op::Listen("ch0".into()),
            ]
        );
        assert!(in_block_ops("").is_empty());
    }

    #[test]
    fn listen_statements_are_read_as_postgresql_reads_them() {
        let l = |s: &str| Some(Stmt::Listen(s.into()));
        assert_eq!(parse(b"LISTEN ch"), l("ch"));
        assert_eq!(parse(b"  listen Ch_1$ ;  "), l("ch_1$"));
        assert_eq!(
            parse(b"/* c */ LISTEN \"My \"\"Ch\"\"\" -- x\n"),
            l("My \"Ch\"")
        );
        assert_eq!(parse(b"UNLISTEN *"), Some(Stmt::Unlisten(None)));
        assert_eq!(parse(b"LISTEN \"select\""), l("select"));
        assert_eq!(parse(b"LISTEN name"), l("name"));
        assert_eq!(
            parse(b"unlisten \"A\";"),
            Some(Stmt::Unlisten(Some("A".into())))
        );
        assert_eq!(
            parse(b"select pg_listening_channels()"),
            Some(Stmt::Channels)
        );
        assert_eq!(
            parse(b"SELECT * FROM pg_catalog.pg_listening_channels ( );"),
            Some(Stmt::Channels)
        );
        // Anything else goes to a server.
        for s in [
            &b"LISTEN a; SELECT 1"[..],
            b"LISTEN",
            b"LISTEN \"\"",
            b"LISTEN 1a",
            b"LISTEN a b",
            b"LISTEN \"unterminated",
            b"LISTENa",
            b"select pg_listening_channels() order by 1",
            b"select count(*) from pg_listening_channels()",
            b"NOTIFY a",
            b"LISTEN select",
            b"UNLISTEN user",
        ] {
            assert_eq!(parse(s), None, "{}", String::from_utf8_lossy(s));
        }
        let long = format!("LISTEN {}", "x".repeat(64));
        assert_eq!(parse(long.as_bytes()), None);
    }

    fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![tag];
        m.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn an_extended_listen_is_answered_whole_or_not_at_all() {
        let parse_msg = msg(b'P', b"\0LISTEN a\0\0\0");
        let bind = msg(b'B', b"\0\0\0\0\0\0\0\0");
        let describe = msg(b'D', b"P\0");
        let execute = msg(b'E', b"\0\0\0\0\0");
        let sync = msg(b'S', b"");
        let all = [&parse_msg, &bind, &describe, &execute, &sync]
            .map(|m| m.as_slice())
            .concat();
        let r = request(&all, |_| None).unwrap().unwrap();
        assert_eq!((r.len, r.extended), (all.len(), Some(b"BPE".to_vec())));
        let no_describe = [&parse_msg, &bind, &execute, &sync]
            .map(|m| m.as_slice())
            .concat();
        let r = request(&no_describe, |_| None).unwrap().unwrap();
        assert_eq!(
            (r.len, r.extended),
            (no_describe.len(), Some(b"BE".to_vec()))
        );
        // A Describe of the portal before the Bind, an Execute without a Bind: not ours.
        let early = [&parse_msg, &describe, &bind, &execute, &sync]
            .map(|m| m.as_slice())
            .concat();
        assert!(request(&early, |_| None).unwrap().is_none());
        let unbound = [&parse_msg, &execute, &sync].map(|m| m.as_slice()).concat();
        assert!(request(&unbound, |_| None).unwrap().is_none());
        // Not yet whole: wait for the rest; with a parameter: not answered here.
        assert_eq!(
            request(&all[..all.len() - 1], |_| None)
                .unwrap()
                .unwrap()
                .len,
            0
        );
        let with_param = msg(b'B', b"\0\0\0\0\0\x01\xff\xff\xff\xff\0\0");
        let p = [&parse_msg, &with_param, &execute, &sync]
            .map(|m| m.as_slice())
            .concat();
        assert!(request(&p, |_| None).unwrap().is_none());
    }
}
