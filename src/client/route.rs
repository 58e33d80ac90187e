//! Read routing: where a client's transaction goes — the entry's pool (the primary) or a
//! standby's sub-pool (`pool::reads`) — from what its request does and, with
//! read_your_writes, from what the client has seen: a WAL position (LSN) no standby it
//! reads from may be behind.
//!
//! What the client has seen grows two ways. After a transaction on the primary, the
//! primary's WAL insert position is read on the same server before it goes back
//! (`pg_current_wal_insert_lsn()`: at or past the transaction's commit record). After a read on a
//! standby, what it saw is at most that standby's replay position at the read's end: the
//! client stays on that standby (whose replay only moves forward) until a position of it
//! asked after the read is known, which then becomes the client's.
use std::sync::Arc;
use std::time::Instant;

use super::Client;
use crate::pool::Pool;
use crate::pool::reads::RoutingStats;
use crate::proto::{self, frontend};
use crate::server::Server;

/// What a client has seen of the database, as WAL positions.
#[derive(Debug, Default, Clone, Copy)]
pub struct Seen {
    /// Everything the client wrote or read is at or before this position.
    pub lsn: u64,
    /// It read on host `.0` until `.1`: what it saw is at or before that host's position
    /// then, known once the host is asked after `.1`.
    pub read_on: Option<(usize, Instant)>,
}

/// Where a transaction goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The primary: not a read (false), or a read no standby can serve (true).
    Primary(bool),
    /// A standby known to have replayed what the client has seen.
    Standby(usize),
    /// A standby usable but not known to be fresh enough: ask it first.
    Ask(usize),
}

/// SQL: a standby's replayed WAL position, as bytes.
const REPLAY_LSN: &str = "SELECT pg_wal_lsn_diff(pg_last_wal_replay_lsn(), '0/0')::bigint";
/// SQL: a primary's WAL insert position, as bytes: at or past the end of every commit
/// record so far, written or not (with `synchronous_commit = off` the written position may
/// be short of the last commit). At the start of a page it points past the page header,
/// where no record ends: the page's start then, which a standby's replay reaches.
const WRITTEN_LSN: &str = "SELECT l - CASE WHEN l % current_setting('wal_block_size')::bigint \
    = 24 THEN 24 ELSE 0 END \
    FROM (SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint AS l) p";

/// Where the client's next transaction goes (its request is in its buffer). Only reads
/// of a client that holds nothing (no pin, no LISTEN) may go to a standby.
pub fn choose(c: &mut Client) -> Route {
    if c.session.pin.is_some() || c.listening.is_listening() || !request_reads(c) {
        return Route::Primary(false);
    }
    let settings = c.pool.settings();
    let hosts = &settings.target.hosts;
    let n = hosts.addrs.len();
    let turn = c.pool.read_turn();
    let ring = (0..n).map(|k| (turn + k) % n);
    if !settings.read_your_writes {
        return ring
            .clone()
            .find(|&i| hosts.standby_ok(i))
            .map_or(Route::Primary(true), Route::Standby);
    }
    let seen = seen(c);
    if let Some((h, t)) = seen.read_on {
        let (lsn, at) = hosts.lsn(h);
        if at.is_some_and(|a| a >= t) {
            seen.lsn = seen.lsn.max(lsn);
            seen.read_on = None;
        }
    }
    // Still bound to the standby it read on: that one, or the primary.
    let only = seen.read_on.map(|(h, _)| h);
    let usable: Vec<usize> = ring
        .filter(|&i| only.is_none_or(|h| h == i) && hosts.standby_ok(i))
        .collect();
    let seen = seen.lsn;
    if let Some(&i) = usable.iter().find(|&&i| hosts.lsn(i).0 >= seen) {
        return Route::Standby(i);
    }
    usable
        .first()
        .map_or(Route::Primary(true), |&i| Route::Ask(i))
}

/// Does the client's request only read: its first message is whole, and every whole
/// Query, Parse and Bind in its buffer only reads (`sql::reads::is_read`; simple queries
/// may call functions: a standby's refusal of them is run again on the primary)?
fn request_reads(c: &Client) -> bool {
    let buf = &c.conn.rbuf;
    let mut at = 0;
    let mut unnamed: Option<&[u8]> = None;
    let mut judged = false;
    while let Ok(Some(h)) = proto::header(&buf[at..], proto::MAX_MESSAGE_LEN) {
        if buf.len() - at < h.total {
            break;
        }
        let body = &buf[at + 5..at + h.total];
        let mut r = proto::Reader::new(body, "message");
        let reads = match h.tag {
            frontend::QUERY => crate::sql::reads::is_read(body, true),
            frontend::PARSE => match r.cstr_bytes() {
                Ok(name) => {
                    let text = &body[name.len() + 1..];
                    if name.is_empty() {
                        unnamed = Some(text);
                    }
                    crate::sql::reads::is_read(text, false)
                }
                Err(_) => false,
            },
            frontend::BIND => match (r.cstr_bytes(), r.cstr_bytes()) {
                (Ok(_), Ok(b"")) => unnamed
                    .or(c.session.ext.unnamed.as_deref())
                    .is_some_and(|t| crate::sql::reads::is_read(t, false)),
                (Ok(_), Ok(name)) => c
                    .session
                    .statements
                    .get(name)
                    .is_some_and(|s| crate::sql::reads::is_read(&s.parse_rest, false)),
                _ => false,
            },
            frontend::DESCRIBE | frontend::EXECUTE | frontend::SYNC | frontend::FLUSH => true,
            _ => false,
        };
        if !reads {
            return false;
        }
        judged |= matches!(h.tag, frontend::QUERY | frontend::PARSE | frontend::BIND);
        at += h.total;
    }
    judged
}

/// Ask a standby's server how far it replayed; recorded for its host. None: it failed
/// (the server is marked broken).
pub async fn ask_replayed(server: &mut Server, pool: &Pool) -> Option<u64> {
    let asked = Instant::now();
    let lsn = own_lsn(server, REPLAY_LSN).await?;
    if let Some(i) = server.host() {
        pool.settings().target.hosts.note_lsn(i, lsn, asked);
    }
    Some(lsn)
}

/// After a transaction on the primary: its written position is now the client's (and
/// known for its host). Not read (the server failed): the client is bound to learn the
/// primary's position from a later check before it reads on a standby.
pub async fn after_primary(c: &mut Client, server: &mut Server) {
    let asked = Instant::now();
    let hosts = c.pool.settings().target.hosts.clone();
    match own_lsn(server, WRITTEN_LSN).await {
        Some(lsn) => {
            let seen = seen(c);
            seen.lsn = seen.lsn.max(lsn);
            seen.read_on = None;
            if let Some(i) = server.host() {
                hosts.note_lsn(i, lsn, asked);
            }
        }
        None => after_loss(c, server.host()),
    }
}

/// A transaction on host `host` ended without the position it left being learned (a read
/// on a standby; a primary's server lost): what the client saw is at most that host's
/// position now.
pub fn after_loss(c: &mut Client, host: Option<usize>) {
    if let Some(i) = host {
        seen(c).read_on = Some((i, Instant::now()));
    }
}

/// What the client has seen (nothing, before its first routed transaction).
pub fn seen(c: &mut Client) -> &mut Seen {
    c.seen.get_or_insert_with(Box::default)
}

/// One position from pgcarpool's own query on a server; None (the server marked broken)
/// when it fails.
async fn own_lsn(server: &mut Server, sql: &str) -> Option<u64> {
    let sets = crate::server::query::query_sets(server, sql).await;
    let lsn = sets
        .ok()
        .and_then(|s| s.first()?.first()?.first()?.as_deref()?.parse::<u64>().ok());
    if lsn.is_none() {
        server.mark_broken();
    }
    lsn
}

/// Count a transaction judged a read: on host `standby`, or on the primary.
pub fn count_read(pool: &Arc<Pool>, standby: Option<usize>) {
    match standby {
        Some(i) => pool.routing.read_on(i),
        None => RoutingStats::add(&pool.routing.reads_on_primary),
    }
}
