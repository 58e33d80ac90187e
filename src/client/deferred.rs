//! Deferred BEGIN (`deferred_begin`): a client that holds no server and says only `BEGIN`
//! (`sql::begin::Begin`) is answered here, as PostgreSQL answers it (CommandComplete,
//! ReadyForQuery `T`), and holds nothing while it thinks. The BEGIN goes to a server in
//! the same write as the block's first message (`Relay::send_begin`, its replies dropped),
//! so an explicit transaction costs one round trip fewer; a bare COMMIT or ROLLBACK before
//! anything else is answered here too. The client's `Client::begun` holds the BEGIN until
//! then: it does not move between workers or processes, and it is delivered no
//! notification (PostgreSQL delivers none inside a block).
use std::sync::OnceLock;
use std::sync::atomic::Ordering;

use bytes::{Bytes, BytesMut};

use super::Client;
use super::transaction::Local;
use crate::config::PoolMode;
use crate::proto::{self, backend, frontend};
use crate::sql::begin::{Begin, bare_end};

/// A block whose BEGIN pgcarpool answered, counted while it lives
/// (`Shared::deferred_blocks`: SHUTDOWN WAIT_FOR_SERVERS lets it finish).
#[derive(Debug)]
pub struct Begun {
    pub begin: Begin,
}

impl Begun {
    fn new(begin: Begin) -> Begun {
        crate::shared::deferred_blocks().fetch_add(1, Ordering::AcqRel);
        Begun { begin }
    }
}

impl Drop for Begun {
    fn drop(&mut self) {
        crate::shared::deferred_blocks().fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether this client's BEGIN may be answered here: the setting, transaction mode with
/// virtual statements (the server's replies to the BEGIN are dropped by that ledger), no
/// read routing (a standby is chosen by the block's statements) and no listening through
/// the pool's listener (its notifications wait for the client's idle moments).
fn may_defer(c: &Client) -> bool {
    let settings = c.pool.settings();
    c.shared.config().settings.deferred_begin
        && settings.mode == PoolMode::Transaction
        && settings.max_prepared_statements > 0
        && !settings.read_routing
        && !c.listening.is_listening()
}

/// The text of the whole simple Query at the front of the client's buffer, and its length.
fn front_query(buf: &[u8]) -> Option<(&[u8], usize)> {
    if buf.first() != Some(&frontend::QUERY) {
        return None;
    }
    let h = proto::header(buf, proto::MAX_MESSAGE_LEN).ok()??;
    if buf.len() < h.total {
        return None;
    }
    let sql = frontend::parse_query(&buf[5..h.total]).ok()?;
    Some((sql, h.total))
}

/// An idle client's messages at the front, as far as deferred BEGIN answers them: None
/// when it has nothing to do with them (the other answers at the front look); else
/// `Answered` (a BEGIN, or the bare end of the block it began) or `NeedServer` (anything
/// else inside such a block: it goes to a server after the BEGIN).
pub(super) fn answer(c: &mut Client) -> Option<Local> {
    if c.begun.is_some() {
        let Some(tag) = front_query(&c.conn.rbuf).and_then(|(sql, n)| Some((bare_end(sql)?, n)))
        else {
            return Some(Local::NeedServer);
        };
        c.conn.consume(tag.1);
        c.begun = None;
        c.conn.queue(answer_of(tag.0, b'I'));
        return Some(Local::Answered);
    }
    // The text first (most are told apart by their first word's first letters, before
    // the message is framed), the settings after.
    if c.conn.rbuf.first() != Some(&frontend::QUERY)
        || !crate::sql::begin::may_begin(c.conn.rbuf.get(5..).unwrap_or_default())
    {
        return None;
    }
    let (begin, n) =
        front_query(&c.conn.rbuf).and_then(|(sql, n)| Some((Begin::parse(sql)?, n)))?;
    if !may_defer(c) {
        return None;
    }
    c.conn.consume(n);
    // A simple Query drops the unnamed statement, as this one would have on PostgreSQL.
    c.session.drop_unnamed();
    c.begun = Some(Begun::new(begin));
    c.conn.queue(answer_of(begin.tag(), b'T'));
    Some(Local::Answered)
}

/// The answers given here (CommandComplete with the tag, then ReadyForQuery with the
/// status), made once: queued without building or copying anything.
fn answer_of(tag: &str, status: u8) -> Bytes {
    static ANSWERS: OnceLock<[(&str, u8, Bytes); 4]> = OnceLock::new();
    let answers = ANSWERS.get_or_init(|| {
        [
            ("BEGIN", b'T'),
            ("START TRANSACTION", b'T'),
            ("COMMIT", b'I'),
            ("ROLLBACK", b'I'),
        ]
        .map(|(tag, status)| (tag, status, build(tag, status)))
    });
    (answers.iter())
        .find(|(t, s, _)| *t == tag && *s == status)
        .map_or_else(|| build(tag, status), |(.., b)| b.clone())
}

/// CommandComplete with `tag`, then ReadyForQuery with `status`.
fn build(tag: &str, status: u8) -> Bytes {
    let mut b = BytesMut::new();
    backend::command_complete(&mut b, tag);
    backend::ready_for_query(&mut b, status);
    b.freeze()
}
