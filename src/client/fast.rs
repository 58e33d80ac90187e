//! The fast path: a transaction of one simple Query that leaves the virtual session as it
//! is. One pass: the request looked at once (`takes`: the text the classifier proves
//! plain in one pass, the client's state and settings), a server that fits the session
//! taken (at once when one is idle, else as the full path takes one), the request
//! written, the replies forwarded by their headers alone up to the ReadyForQuery `I`, the
//! server given back. No relay is built, nothing is read back, the server's ledger is not
//! kept (the round leaves it as it found it).
//!
//! Anything it does not expect on the way (a reply other than a row description, a row,
//! a command tag, an empty query or a notice; a ReadyForQuery inside a block; a server
//! that closes or fails; a client that sends more, closes or is killed) hands the
//! transaction over where it stands (`Relay::resume`): the full path goes on from there as
//! if it had sent the Query itself, its first-request replay included. The full path is
//! unchanged; the differential test runs both.
use std::future::poll_fn;
use std::task::{Context, Poll};
use std::time::Instant;

use super::Client;
use super::relay::{RelayCounts, Resumed, ServerSocket};
use crate::config::PoolMode;
use crate::pool::PooledServer;
use crate::proto::{self, backend, frontend};
use crate::shared::restart::{Phase, PhaseWatch};
use crate::sql::facts::{self, query_text};

/// Stop reading the server while this much waits to be written to the client (as the relay).
const HIGH_WATER: usize = 256 * 1024;
/// Largest message either side may send (as the relay: larger ones are its to refuse).
const MAX_FORWARDED: usize = i32::MAX as usize;

/// What became of a request the fast path looked at.
pub(super) enum Fast {
    /// Not taken: nothing was sent, the full path serves it, on this server (taken and
    /// fitted to the session) when there is one.
    Full(Option<PooledServer>),
    /// The client is let go while it waited for a server (as the full path lets it go).
    Failed(super::ClientError),
    /// Served: the transaction is over, its server back in the pool, the reply queued.
    Done,
    /// Handed over mid-way: the full path goes on from here, with this server.
    Resume(PooledServer, Box<Resumed>),
}

/// Whether the client's state and its pool's and config's settings allow the fast path
/// (what the request says is `takes`'s): transaction pooling, nothing held, nothing
/// begun or failed, no listening, no pin, no read routing, no primary fence, no timeout to
/// watch, no restart under way.
fn eligible(c: &Client, phase: &mut PhaseWatch) -> bool {
    if c.begun.is_some()
        || c.session.pin.is_some()
        || c.listening.is_listening()
        || phase.current() != Phase::Running
        || c.shared.transactions_stopped()
    {
        return false;
    }
    let ps = c.pool.settings_now();
    let hosts = &ps.target.hosts;
    if ps.mode != PoolMode::Transaction
        || ps.read_routing
        || (hosts.checks_roles() && hosts.attrs.wants_primary())
        || c.pool.listener.is_running()
    {
        return false;
    }
    let cfg = c.shared.config();
    let s = &cfg.settings;
    if s.disable_pqexec {
        return false;
    }
    let user = &c.reg.handle.user;
    cfg.query_timeout_for(user).is_zero()
        && cfg.idle_transaction_timeout_for(user).is_zero()
        && cfg.transaction_timeout_for(user).is_zero()
}

/// Whether the fast path takes the client's request: its buffer holds exactly one whole
/// simple Query, the client's state and its settings allow it (`eligible`), and the
/// Query goes to a server as it is and leaves the session as it is: one statement that
/// reads or changes data, no setting, statement, transaction control, listening or
/// self-view in it, safe to send again (`facts::is_plain`: the facts the full path finds
/// for it say so). The cheap looks first.
pub(super) fn takes(c: &Client, phase: &mut PhaseWatch) -> bool {
    let buf = &c.conn.rbuf;
    if buf.first() != Some(&frontend::QUERY) {
        return false;
    }
    let Ok(Some(h)) = frontend::header(buf) else {
        return false;
    };
    // Only the common text, found in one pass: any other (a transaction's control, a
    // setting, several statements) is the full path's, which classifies it once.
    h.total == buf.len()
        && facts::is_plain(query_text(&buf[5..h.total]))
        && eligible(c, phase)
        && super::transaction::for_a_server(buf, &c.session)
}

/// Serve the request `takes` took, on a server that fits the session: an idle one that
/// does taken at once, else as the full path takes one (`transaction::fitted_server`:
/// waiting in line, the session's settings applied).
pub(super) async fn transaction(c: &mut Client) -> Fast {
    // The Query's length (`takes` found it whole and alone).
    let total = c.conn.rbuf.len();
    let want = (c.reg.handle.id, c.session.params.version());
    let mut now = c.pool.checkout_now(Some(want));
    let fits = now.as_mut().is_some_and(|s| {
        s.set_last_client(c.reg.handle.id);
        !crate::server::sync::differs(s, &c.session.params)
    });
    let mut server = match now {
        Some(s) if fits => {
            let lane = c.pool.stats.lane(crate::workers::current());
            lane.wait_hist.record(0);
            crate::stats::PoolStats::add(&lane.server_assignment_count, 1);
            s
        }
        other => {
            let (cfg, kill) = (c.shared.config_full(), c.reg.handle.clone());
            match super::transaction::fitted_server(c, &cfg, &kill, None, other).await {
                Ok(s) => s,
                Err(e) => return Fast::Failed(e),
            }
        }
    };
    // (The checkout read the clock: the transaction's start.)
    let assigned_at = crate::stats::clock::recent();
    if c.conn.rbuf.len() != total {
        // The client sent more while it waited: the full path relays it all.
        return Fast::Full(Some(server));
    }
    attach(c, &mut server);
    // A simple Query drops the unnamed statement, the client's and the server's.
    c.session.drop_unnamed();
    server.set_unnamed(0);
    let query = c.conn.rbuf.split().freeze();
    let mut counts = RelayCounts {
        bytes_from_client: query.len() as u64,
        ..Default::default()
    };
    server.conn_mut().queue(query.clone());
    let sent = Instant::now();
    let mut run = Run::default();
    let step = poll_fn(|cx| run.poll(c, &mut server, cx)).await;
    counts.bytes_from_server = run.from_server;
    let lane = c.pool.stats.lane(crate::workers::current());
    if let Step::Resume(socket) = step {
        crate::stats::PoolStats::add(&lane.fast_handovers, 1);
        let r = Box::new(Resumed {
            query,
            sent,
            replied: run.replied,
            started: assigned_at,
            server_partial: run.partial,
            counts,
            server: socket,
        });
        return Fast::Resume(server, r);
    }
    crate::stats::PoolStats::add(&lane.fast_xact_count, 1);
    release(c, server, counts, assigned_at);
    Fast::Done
}

/// The client is linked to its server, as the full path links it (SHOW CLIENTS, cancel
/// requests), and given what the server holds for it (`Relay::new`).
fn attach(c: &mut Client, server: &mut PooledServer) {
    server.mark_served();
    // What the server holds for the client goes first, as when the relay starts.
    if let Some(held) = server.take_notifications(c.session.backend_pid) {
        c.conn.queue(held);
    }
    super::transaction::link(c, server);
}

/// The transaction is over (its ReadyForQuery `I` queued for the client): statistics, and
/// the server back to the pool as the full path gives back a server after a transaction
/// that changed nothing (`transaction::released`).
fn release(c: &Client, mut server: PooledServer, mut counts: RelayCounts, at: Instant) {
    let now = crate::stats::clock::now();
    counts.queries = 1;
    counts.transactions = 1;
    counts.query_time_us = now.saturating_duration_since(at).as_micros() as u64;
    let h = &c.reg.handle;
    h.set_server(None);
    if server.tls().is_some() {
        h.set_server_tls(None);
    }
    super::transaction::add_stats(c, &counts, counts.query_time_us);
    server.reset = c.shared.config().settings.server_reset_query_always;
    // Checked in here (dropped).
}

/// How the fast relay ended.
enum Step {
    /// The ReadyForQuery `I` is queued for the client.
    Done,
    /// Something for the full path (how the server's socket stands).
    Resume(ServerSocket),
}

/// The fast relay's state between wake-ups.
#[derive(Default)]
struct Run {
    /// Bytes of a server message still to stream to the client.
    partial: usize,
    /// Something of the server's reply was forwarded.
    replied: bool,
    /// Bytes read from the server.
    from_server: u64,
}

impl Run {
    /// One pass over both sockets: Ready when the ReadyForQuery came or something is
    /// for the full path.
    fn poll(
        &mut self,
        c: &mut Client,
        server: &mut PooledServer,
        cx: &mut Context<'_>,
    ) -> Poll<Step> {
        loop {
            if server.conn().out_pending()
                && let Poll::Ready(Err(e)) = server.conn_mut().poll_write_out(cx)
            {
                return Poll::Ready(Step::Resume(ServerSocket::Failed(e)));
            }
            if c.conn.out_pending() && matches!(c.conn.poll_write_out(cx), Poll::Ready(Err(_))) {
                return Poll::Ready(Step::Resume(ServerSocket::Open));
            }
            if c.conn.out_len() < HIGH_WATER {
                match server.conn_mut().poll_read_more(cx) {
                    Poll::Ready(Ok(0)) => return Poll::Ready(Step::Resume(ServerSocket::Closed)),
                    Poll::Ready(Err(e)) => {
                        return Poll::Ready(Step::Resume(ServerSocket::Failed(e)));
                    }
                    Poll::Ready(Ok(n)) => {
                        self.from_server += n as u64;
                        match self.scan(c, server) {
                            Scan::More => continue,
                            Scan::Ready => return Poll::Ready(Step::Done),
                            Scan::Other => return Poll::Ready(Step::Resume(ServerSocket::Open)),
                        }
                    }
                    Poll::Pending => {}
                }
            }
            // The client sent more, closed or failed; it is killed: the full path's.
            if c.conn.poll_read_more(cx).is_ready() || c.reg.handle.poll_killed(cx).is_ready() {
                return Poll::Ready(Step::Resume(ServerSocket::Open));
            }
            return Poll::Pending;
        }
    }

    /// Forward what the server sent up to a ReadyForQuery `I` or a reply left to the
    /// full path (`scan`).
    fn scan(&mut self, c: &mut Client, server: &mut PooledServer) -> Scan {
        let (at, end) = scan(&server.conn().rbuf, &mut self.partial);
        if at > 0 {
            self.replied = true;
            let run = server.conn_mut().rbuf.split_to(at).freeze();
            c.conn.queue(run);
        }
        end
    }
}

/// How far the server's replies in `buf` go to the client as they are, by their headers
/// alone (`partial`: bytes of a message still to stream, before and after), and what
/// follows: more to read (More), the ReadyForQuery `I` that ends the transaction, forwarded
/// (Ready), or a reply left to the full path, first after what is forwarded (Other). Rows,
/// their descriptions, command tags, empty queries and notices pass; a ReadyForQuery
/// inside a block, an error, a ParameterStatus, a notification, a COPY, anything else,
/// and a header the relay refuses, do not.
fn scan(buf: &[u8], partial: &mut usize) -> (usize, Scan) {
    let mut at = 0;
    loop {
        if *partial > 0 {
            let n = (*partial).min(buf.len() - at);
            *partial -= n;
            at += n;
            if *partial > 0 {
                return (at, Scan::More);
            }
        }
        let h = match proto::header(&buf[at..], MAX_FORWARDED) {
            Ok(Some(h)) => h,
            Ok(None) => return (at, Scan::More),
            Err(_) => return (at, Scan::Other),
        };
        let avail = buf.len() - at;
        match h.tag {
            backend::ROW_DESCRIPTION
            | backend::DATA_ROW
            | backend::COMMAND_COMPLETE
            | backend::EMPTY_QUERY_RESPONSE
            | backend::NOTICE_RESPONSE => {
                if avail < h.total {
                    *partial = h.total - avail;
                    return (buf.len(), Scan::More);
                }
                at += h.total;
            }
            backend::READY_FOR_QUERY if h.total == 6 && avail < 6 => return (at, Scan::More),
            backend::READY_FOR_QUERY if h.total == 6 && buf[at + 5] == b'I' => {
                return (at + 6, Scan::Ready);
            }
            _ => return (at, Scan::Other),
        }
    }
}

/// What a scan of the server's buffer came to.
#[derive(Debug, PartialEq, Eq)]
enum Scan {
    More,
    Ready,
    Other,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![tag];
        m.extend_from_slice(&(body.len() as i32 + 4).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    fn reply(parts: &[Vec<u8>]) -> Vec<u8> {
        parts.concat()
    }

    /// A whole SELECT's reply goes through to its ReadyForQuery `I`, and no further.
    #[test]
    fn a_whole_reply_goes_to_its_ready_for_query() {
        let r = reply(&[
            msg(
                b'T',
                b"\0\x01?column?\0\0\0\0\0\0\0\0\x17\0\x04\xff\xff\xff\xff\0\0",
            ),
            msg(b'D', b"\0\x01\0\0\0\x011"),
            msg(b'C', b"SELECT 1\0"),
            msg(b'N', b"SNOTICE\0\0"),
            msg(b'Z', b"I"),
        ]);
        let mut partial = 0;
        assert_eq!(scan(&r, &mut partial), (r.len(), Scan::Ready));
        let mut more = r.clone();
        more.extend_from_slice(&msg(b'Z', b"I"));
        assert_eq!(scan(&more, &mut partial), (r.len(), Scan::Ready));
        let empty = reply(&[msg(b'I', b""), msg(b'Z', b"I")]);
        assert_eq!(scan(&empty, &mut partial), (empty.len(), Scan::Ready));
    }

    /// What the virtual session must see stops the scan before it, forwarded up to it:
    /// an error, a ParameterStatus, a notification, a COPY, a ReadyForQuery in a block.
    #[test]
    fn what_the_session_must_see_is_left_to_the_full_path() {
        let row = msg(b'D', b"\0\x01\0\0\0\x011");
        for other in [
            msg(b'E', b"SERROR\0C42P01\0\0"),
            msg(b'S', b"TimeZone\0UTC\0"),
            msg(b'A', b"\0\0\0\x01ch\0\0"),
            msg(b'G', b"\0\0\0"),
            msg(b'H', b"\0\0\0"),
            msg(b'W', b"\0\0\0"),
            msg(b'Z', b"T"),
            msg(b'Z', b"E"),
            msg(b'1', b""),
        ] {
            let r = reply(&[row.clone(), other.clone(), msg(b'Z', b"I")]);
            let mut partial = 0;
            assert_eq!(
                scan(&r, &mut partial),
                (row.len(), Scan::Other),
                "{other:?}"
            );
            assert_eq!(partial, 0);
        }
        // A header PostgreSQL never sends (a length below 4).
        let mut bad = row.clone();
        bad.extend_from_slice(&[b'D', 0, 0, 0, 3]);
        assert_eq!(scan(&bad, &mut 0), (row.len(), Scan::Other));
    }

    /// A row that has not all come streams through as it comes; a header or a
    /// ReadyForQuery not all here waits.
    #[test]
    fn a_partial_row_streams_and_a_partial_header_waits() {
        let row = msg(b'D', &[7u8; 100]);
        let mut partial = 0;
        assert_eq!(scan(&row[..40], &mut partial), (40, Scan::More));
        assert_eq!(partial, row.len() - 40);
        let mut rest = row[40..].to_vec();
        rest.extend_from_slice(&msg(b'Z', b"I")[..3]);
        assert_eq!(scan(&rest, &mut partial), (row.len() - 40, Scan::More));
        assert_eq!(partial, 0);
        let z = msg(b'Z', b"I");
        assert_eq!(scan(&z[..5], &mut partial), (0, Scan::More));
        assert_eq!(scan(&z, &mut partial), (6, Scan::Ready));
    }
}
