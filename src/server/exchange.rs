//! The server's half of the relay: one ledger of what a server owes for what was sent to it
//! (ReadyForQuery messages, the end of a COPY, each reply while virtual statements are on)
//! and of what it holds (prepared statements, the unnamed statement, the transaction
//! status). Pure bookkeeping over message tags and bodies, no I/O: the relay notes what it
//! sends (`note_sent`, `expect`) and hands over what comes back (`receive`), which says
//! what becomes of each reply (`Reply`).
use bytes::Bytes;

use super::prepared::PreparedSet;
use super::response::{Answer, Lost, Owed, Pending, Undo, Verdict};
use crate::proto::{ProtoError, backend, frontend};

/// The server's half of the relay: its protocol position (what is still owed for what was
/// sent), the replies owed in order (`Owed`, while a relay with virtual statements runs),
/// the statements it holds and whose unnamed statement it has. Written by what is sent
/// (`note_sent`, `expect`…) and by what comes back (`receive`); everything else asks.
#[derive(Debug, Default)]
pub struct Exchange {
    /// ReadyForQuery messages still to come (one per Query, Sync and FunctionCall sent,
    /// but for a Sync the server reads while it copies in, which it ignores).
    expected_rfq: u32,
    /// Extended-protocol messages sent since the last Sync.
    unsynced: bool,
    /// Bytes of a client message still to be forwarded (a message was sent in part).
    partial: usize,
    /// In COPY FROM STDIN as the server's replies tell: CopyInResponse came, and the
    /// CommandComplete or ErrorResponse that ends the copy has not (the client may have
    /// sent its CopyDone already: it may stream a whole COPY without waiting).
    copy_in: bool,
    /// Transaction status from the last ReadyForQuery: b'I', b'T' or b'E'.
    tx_status: u8,
    /// Messages owing a ReadyForQuery answered (or found to owe none) since login: the
    /// next message sent that owes one is number `answered + expected_rfq`.
    answered: u64,
    /// The messages sent that start a COPY, end one or owe a ReadyForQuery, oldest first,
    /// while the server has not finished with them: where a COPY starts and ends in what
    /// was sent (the Syncs between are ignored by the server).
    marks: std::collections::VecDeque<Mark>,
    /// Transaction-control statements sent whose round is not answered yet, oldest first:
    /// the round and what they do to the status (`sent_tx_effect`).
    tx_sent: std::collections::VecDeque<(u64, [u8; 3])>,
    /// Responses owed, in order, while a relay with virtual statements runs.
    pub(super) owed: Owed,
    /// Prepared statements this server holds (transaction/statement mode).
    pub(super) prepared: PreparedSet,
    /// Whose unnamed statement the server holds (`VirtualSession::unnamed_id`; 0: none or
    /// unknown). A simple Query drops it.
    pub(super) unnamed: u64,
}

/// At most this many transaction-control statements in flight are followed
/// (`Exchange::status_sent`); beyond, a client's messages are judged by fewer of them.
const MAX_TX_SENT: usize = 64;

/// A message sent, as far as COPY FROM STDIN and ReadyForQuery are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    /// A simple Query: owes a ReadyForQuery, may copy.
    Query,
    /// An Execute: may copy.
    Execute,
    /// Sync or FunctionCall: owes a ReadyForQuery.
    Sync,
    /// CopyDone or CopyFail.
    CopyEnd,
}

/// What became of one reply (`Exchange::receive`).
#[derive(Debug)]
pub struct Reply {
    /// What to do with it.
    pub verdict: Verdict,
    /// What it means for the client's session.
    pub lost: Lost,
    /// Changes to the client's statements whose message the server failed or skipped
    /// (PostgreSQL never made them), oldest first: they are undone newest first.
    pub undo: Vec<Undo>,
    /// It reports a DEALLOCATE ALL or DISCARD ALL the server ran (its statements are gone).
    pub deallocated: bool,
}

impl Exchange {
    /// A server just logged in: nothing owed, idle.
    pub fn new() -> Self {
        Exchange {
            tx_status: b'I',
            ..Default::default()
        }
    }

    /// Transaction status from the last ReadyForQuery: b'I', b'T' or b'E'.
    pub fn tx_status(&self) -> u8 {
        self.tx_status
    }

    /// ReadyForQuery messages still to come.
    pub fn ready_owed(&self) -> u32 {
        self.expected_rfq
    }

    /// Extended-protocol messages were sent since the last Sync.
    pub fn unsynced(&self) -> bool {
        self.unsynced
    }

    /// Bytes of a message still to be sent (one was sent in part).
    pub fn partial(&self) -> usize {
        self.partial
    }

    /// In COPY FROM STDIN, as the server's replies tell.
    pub fn copy_in(&self) -> bool {
        self.copy_in
    }

    /// Messages owing a ReadyForQuery answered (or found to owe none) since login.
    pub fn answered(&self) -> u64 {
        self.answered
    }

    /// Nothing owed at all, replies pgcarpool gives itself included (the transaction
    /// status aside from `is_idle`): what "this server may go" is decided by.
    pub fn owes_nothing(&self) -> bool {
        self.is_idle() && self.ledger_empty()
    }

    /// A round whose Sync (or query) was sent may still undo a change to the client's
    /// statements (`Owed::undo_pending`) or not make the change to the transaction status
    /// its messages were sent to make (`status_sent` supposes they all run): what the
    /// client sends next is judged once its answer came. `dealloc`: a DEALLOCATE ALL's
    /// outcome is awaited too. Not while in COPY FROM STDIN, where the client's data must
    /// flow.
    pub fn awaits_undo(&self, dealloc: bool) -> bool {
        !self.unsynced
            && self.expected_rfq > 0
            && !self.copy_in
            && (dealloc || !self.tx_sent.is_empty() || self.owed.undo_pending())
    }

    /// No reply is owed in the ledger (`Owed`), whatever the protocol position says.
    pub fn ledger_empty(&self) -> bool {
        self.owed.is_empty()
    }

    /// Does the server hold this statement (whether or not a client still names it)?
    pub fn holds(&self, id: u64) -> bool {
        self.prepared.holds(id)
    }

    /// How many statements the server holds.
    pub fn prepared_len(&self) -> usize {
        self.prepared.len()
    }

    /// Whose unnamed statement the server holds (0: none or unknown).
    pub fn unnamed(&self) -> u64 {
        self.unnamed
    }

    /// Is a reply pgcarpool gives itself next in line?
    pub fn answer_due(&self) -> bool {
        self.owed.answer_due()
    }

    /// Is a reply with this tag to a query pgcarpool added (`Owed::swallowing`)?
    pub fn swallowing(&self, tag: u8) -> bool {
        self.owed.swallowing(tag)
    }

    /// Only Parse, Describe, Close and pgcarpool's own answers are owed.
    pub fn before_first_bind(&self) -> bool {
        self.owed.before_first_bind()
    }

    /// Nothing owed, not in a transaction: safe to hand to another client.
    pub fn is_idle(&self) -> bool {
        self.is_idle_but_status() && self.tx_status == b'I'
    }

    /// Nothing owed (the transaction status aside).
    pub fn is_idle_but_status(&self) -> bool {
        self.expected_rfq == 0 && !self.unsynced && self.partial == 0 && !self.copy_in
    }

    /// The round (number of the message owing a ReadyForQuery) a message sent now is part
    /// of: a Query's own, or the next Sync's.
    pub fn round(&self) -> u64 {
        self.answered + u64::from(self.expected_rfq)
    }

    /// A message that owes a ReadyForQuery was sent: a simple Query (`query`), or a Sync
    /// or FunctionCall.
    pub fn owe_ready(&mut self, query: bool) {
        self.expected_rfq += 1;
        self.marks
            .push_back(if query { Mark::Query } else { Mark::Sync });
    }

    /// A Query or an Execute whose statements do this to the transaction status was sent
    /// (the status after them for `I`, `T` and `E` before, as `client::classify::tx_effect`
    /// gives it): before a Query's own `owe_ready`.
    pub fn sent_tx_effect(&mut self, effect: [u8; 3]) {
        if self.tx_sent.len() < MAX_TX_SENT {
            let round = self.round();
            self.tx_sent.push_back((round, effect));
        }
    }

    /// The transaction status the server will be in once it has run everything sent, if
    /// none of it fails: what a client's next message is judged by (the messages of a
    /// pipeline take effect in order, before their ReadyForQuery says so).
    pub fn status_sent(&self) -> u8 {
        let index = |s| match s {
            b'I' => 0,
            b'T' => 1,
            _ => 2,
        };
        self.tx_sent
            .iter()
            .fold(self.tx_status, |s, (_, e)| e[index(s)])
    }

    /// A BEGIN was sent that cannot fail (`client::deferred`: one an error of which ends
    /// the client): the status it makes is the server's at once, so that what the client
    /// sends after it is not held back for its answer (`awaits_undo`).
    pub fn sent_sure_begin(&mut self) {
        debug_assert!(self.tx_sent.is_empty());
        if self.tx_status == b'I' {
            self.tx_status = b'T';
        }
    }

    /// An Execute was sent.
    pub fn sent_execute(&mut self) {
        self.marks.push_back(Mark::Execute);
    }

    /// A CopyDone or CopyFail was sent.
    pub fn sent_copy_end(&mut self) {
        // With nothing sent that could start a COPY, the server ignores it.
        if self.copy_in
            || self
                .marks
                .iter()
                .any(|m| matches!(m, Mark::Query | Mark::Execute))
        {
            self.marks.push_back(Mark::CopyEnd);
        }
    }

    /// A ReadyForQuery came with this transaction status: the oldest message owing one
    /// is answered, and everything sent before it is done with.
    fn on_ready(&mut self, status: u8) {
        self.tx_status = status;
        self.expected_rfq = self.expected_rfq.saturating_sub(1);
        self.answered += 1;
        let answered = self.answered;
        self.tx_sent.retain(|&(round, _)| round >= answered);
        if self.expected_rfq == 0 {
            // Nothing more owed: the status is the server's own.
            self.tx_sent.clear();
        }
        // The server never reports ReadyForQuery while it copies in.
        self.copy_in = false;
        while let Some(m) = self.marks.pop_front() {
            if matches!(m, Mark::Query | Mark::Sync) {
                break;
            }
        }
        self.prepared.rounds_over(self.answered);
    }

    /// Another reply came (its tag), the protocol position follows it: returns how many Syncs sent turn out to owe nothing
    /// (the server read them while copying in), which the caller's own ledger drops too.
    fn on_reply(&mut self, tag: u8) -> u32 {
        use crate::proto::backend;
        match tag {
            backend::COPY_IN_RESPONSE => {
                self.drop_stale_copy_ends();
                self.copy_in = true;
                0
            }
            backend::COMMAND_COMPLETE
            | backend::EMPTY_QUERY_RESPONSE
            | backend::PORTAL_SUSPENDED
            | backend::ERROR_RESPONSE => {
                let error = tag == backend::ERROR_RESPONSE;
                let voided = if std::mem::take(&mut self.copy_in) {
                    self.end_copy()
                } else {
                    0
                };
                self.drop_stale_copy_ends();
                if self.marks.front() == Some(&Mark::Execute) {
                    self.marks.pop_front();
                    if error {
                        // The server skips to the next Sync: no later Execute runs.
                        while let Some(Mark::Execute | Mark::CopyEnd) = self.marks.front() {
                            self.marks.pop_front();
                        }
                    }
                }
                voided
            }
            _ => 0,
        }
    }

    /// The COPY the first mark started is over: the Syncs sent after it up to the
    /// client's CopyDone or CopyFail (all sent so far if none came yet) were read by the
    /// server while copying in, and ignored. An Execute's copy left with no Sync sent
    /// after it: the server still wants one.
    fn end_copy(&mut self) -> u32 {
        let mut voided = 0;
        let mut i = 1;
        while i < self.marks.len() {
            match self.marks[i] {
                Mark::CopyEnd => {
                    self.marks.remove(i);
                    break;
                }
                Mark::Sync => {
                    self.marks.remove(i);
                    voided += 1;
                }
                // Sent inside the COPY (the server refuses it, then skips to a Sync): the
                // Syncs after it are counted as read while copying too, a guess.
                Mark::Query | Mark::Execute => i += 1,
            }
        }
        self.expected_rfq = self.expected_rfq.saturating_sub(voided);
        self.answered += u64::from(voided);
        if self.marks.front() == Some(&Mark::Execute)
            && !self
                .marks
                .iter()
                .any(|m| matches!(m, Mark::Query | Mark::Sync))
        {
            self.unsynced = true;
        }
        voided
    }

    /// A CopyDone or CopyFail sent before every message that could still start a COPY
    /// reached a server that was not copying: it ignored it.
    fn drop_stale_copy_ends(&mut self) {
        while self.marks.front() == Some(&Mark::CopyEnd) {
            self.marks.pop_front();
        }
    }
}

impl Exchange {
    /// A client's message with this tag was sent as written (all of it, or its first
    /// bytes: `sent_partly` follows). `ledger`: the replies owed are kept (`Owed`) too.
    pub fn note_sent(&mut self, tag: u8, ledger: bool) {
        match tag {
            frontend::QUERY | frontend::SYNC | frontend::FUNCTION_CALL => {
                self.owe_ready(tag == frontend::QUERY);
                self.unsynced = false;
                if ledger {
                    self.owed.push(Pending::Ready(None));
                }
            }
            frontend::EXECUTE => {
                self.unsynced = true;
                self.sent_execute();
                if ledger {
                    self.owed.push(Pending::Execute);
                }
            }
            frontend::COPY_DONE | frontend::COPY_FAIL => self.sent_copy_end(),
            frontend::COPY_DATA | frontend::FLUSH => {}
            _ => self.unsynced = true,
        }
    }

    /// The message just noted was sent in part: `rest` bytes of it are still to come.
    pub fn sent_partly(&mut self, rest: usize) {
        self.partial = rest;
    }

    /// Of a message sent in part, up to `avail` more bytes go: how many belong to it.
    pub fn send_rest(&mut self, avail: usize) -> usize {
        let n = self.partial.min(avail);
        self.partial -= n;
        n
    }

    /// A simple Query comes next, whatever is sent for it: no Sync is owed any more.
    pub fn note_query(&mut self) {
        self.unsynced = false;
    }

    /// A Sync is sent to end what was sent since the last one (pgcarpool's own, when a
    /// server is cleaned up).
    pub fn note_sync(&mut self) {
        self.unsynced = false;
        self.owe_ready(false);
    }

    /// A reply is owed for a message sent (or pgcarpool answers it in line).
    pub fn expect(&mut self, p: Pending) {
        self.owed.push(p);
    }

    /// Forget the replies owed (a relay with virtual statements starts, or the server is
    /// cleaned up): true when some were.
    pub fn forget_owed(&mut self) -> bool {
        let some = !self.owed.is_empty();
        self.owed.clear();
        some
    }

    /// The client's Parse just queued made client name `name` (`Owed::name_last_parse`).
    pub fn name_last_parse(&mut self, name: Bytes) {
        self.owed.name_last_parse(name);
    }

    /// The number of the reply owed for the next message sent (`Owed::next_seq`): an error
    /// that comes while `owed_front` equals it is that message's.
    pub fn owed_next(&self) -> u64 {
        self.owed.next_seq()
    }

    /// The number of the reply owed next (`Owed::front_seq`), and whether it is a Parse's.
    pub fn owed_front(&self) -> (u64, bool) {
        (self.owed.front_seq(), self.owed.front_is_parse())
    }

    /// The next reply pgcarpool gives itself, when it is next in line.
    pub fn pop_answer(&mut self) -> Option<Answer> {
        self.owed.pop_answer()
    }

    /// After `Verdict::Stale` was handled: the failed round's ReadyForQuery is dropped.
    pub fn swallow_to_sync(&mut self) {
        self.owed.swallow_to_sync();
    }

    /// Is the front a Describe pgcarpool added (`Pending::Learn`)? Its replies go to
    /// `Server::learned` whole.
    pub fn learning(&self) -> bool {
        self.owed.learning()
    }

    /// Does the next reply answer an extended-protocol message pgcarpool added
    /// (`Pending::SwallowTo`)? It is dropped, so it must be read whole.
    pub fn swallows_next(&self) -> bool {
        self.owed.swallows_next()
    }

    /// A DataRow or RowDescription that changes nothing here (`Owed::passes`).
    pub fn passes(&self, tag: u8) -> bool {
        self.owed.passes(tag)
    }

    /// The server now holds the client's unnamed statement of this id (0: none, unknown).
    pub fn set_unnamed(&mut self, id: u64) {
        self.unnamed = id;
    }

    /// Does the server hold it? Marks it used (the least recently used goes first).
    pub fn touch(&mut self, id: u64) -> bool {
        self.prepared.touch(id)
    }

    /// The server will hold this statement (its Parse or SQL PREPARE is being sent).
    pub fn hold(&mut self, stmt: std::sync::Arc<crate::statements::Stmt>) {
        self.prepared.insert(stmt);
    }

    /// The server drops this statement (a DEALLOCATE of it is being sent).
    pub fn forget(&mut self, id: u64) {
        self.prepared.remove(id);
    }

    /// A DEALLOCATE ALL or DISCARD ALL is sent in the current round: the statements held
    /// go, until the server says whether it ran.
    pub fn deallocating(&mut self) {
        let round = self.round();
        self.prepared.deallocating(round, self.owed.next_seq());
    }

    /// A reply came: `tag`, and its body when whole (needed for ReadyForQuery, and with
    /// `ledger` for ErrorResponse and CommandComplete; else may be empty). The protocol
    /// position follows it and, with `ledger` (virtual statements on), what was owed for
    /// it is settled: the verdict says what becomes of it.
    pub fn receive(&mut self, tag: u8, body: &[u8], ledger: bool) -> Result<Reply, ProtoError> {
        let mut reply = Reply {
            verdict: Verdict::Forward,
            lost: Lost::Nothing,
            undo: Vec::new(),
            deallocated: false,
        };
        let mut code = None;
        if tag == backend::READY_FOR_QUERY {
            let status = *body.first().ok_or(ProtoError::Malformed("ReadyForQuery"))?;
            self.on_ready(status);
        } else {
            if ledger
                && tag == backend::COMMAND_COMPLETE
                && (body == b"DEALLOCATE ALL\0" || body == b"DISCARD ALL\0")
            {
                self.prepared.deallocated();
                reply.deallocated = true;
            }
            let voided = self.on_reply(tag);
            if voided > 0 && ledger {
                self.owed.void_readies(voided);
            }
            if tag == backend::ERROR_RESPONSE {
                code = backend::error_code(body);
            }
        }
        if ledger {
            let (verdict, lost) =
                self.owed
                    .on_reply(tag, code, &mut self.prepared, &mut self.unnamed);
            reply.verdict = verdict;
            reply.lost = lost;
            reply.undo = self.owed.take_undo();
        }
        Ok(reply)
    }
}

/// What the rest of pgcarpool asks a server, and the only ways it changes what the server
/// owes: what is sent (`note_sent`, `expect` and the senders of `server::response` and
/// `server::prepared`) and what comes back (`receive`).
impl super::Server {
    /// What it owes and holds.
    pub fn exchange(&self) -> &Exchange {
        &self.exchange
    }

    /// Nothing owed, nothing unread, not in a transaction: it may serve another client as
    /// it is.
    pub fn is_clean(&self) -> bool {
        self.exchange.owes_nothing() && self.conn.rbuf.is_empty()
    }

    /// Transaction status from the last ReadyForQuery.
    pub fn tx_status(&self) -> u8 {
        self.exchange.tx_status
    }

    /// The transaction status once everything sent has run (`Exchange::status_sent`).
    pub fn status_sent(&self) -> u8 {
        self.exchange.status_sent()
    }

    /// The round a message sent now is part of (`Exchange::round`).
    pub fn round(&self) -> u64 {
        self.exchange.round()
    }

    /// Does the server hold this statement?
    pub fn holds(&self, id: u64) -> bool {
        self.exchange.holds(id)
    }

    /// See `Exchange::note_sent`.
    pub fn note_sent(&mut self, tag: u8, ledger: bool) {
        self.exchange.note_sent(tag, ledger);
    }

    /// See `Exchange::sent_partly`.
    pub fn sent_partly(&mut self, rest: usize) {
        self.exchange.sent_partly(rest);
    }

    /// See `Exchange::send_rest`.
    pub fn send_rest(&mut self, avail: usize) -> usize {
        self.exchange.send_rest(avail)
    }

    /// See `Exchange::note_query`.
    pub fn note_query(&mut self) {
        self.exchange.note_query();
    }

    /// See `Exchange::sent_tx_effect`.
    pub fn sent_tx_effect(&mut self, effect: [u8; 3]) {
        self.exchange.sent_tx_effect(effect);
    }

    /// See `Exchange::sent_sure_begin`.
    pub fn sent_sure_begin(&mut self) {
        self.exchange.sent_sure_begin();
    }

    /// See `Exchange::expect`.
    pub fn expect(&mut self, p: Pending) {
        self.exchange.expect(p);
    }

    /// See `Exchange::forget_owed`.
    pub fn forget_owed(&mut self) -> bool {
        self.exchange.forget_owed()
    }

    /// See `Exchange::name_last_parse`.
    pub fn name_last_parse(&mut self, name: Bytes) {
        self.exchange.name_last_parse(name);
    }

    /// See `Exchange::pop_answer`.
    pub fn pop_answer(&mut self) -> Option<Answer> {
        self.exchange.pop_answer()
    }

    /// See `Exchange::swallow_to_sync`.
    pub fn swallow_to_sync(&mut self) {
        self.exchange.swallow_to_sync();
    }

    /// See `Exchange::set_unnamed`.
    pub fn set_unnamed(&mut self, id: u64) {
        self.exchange.set_unnamed(id);
    }

    /// See `Exchange::touch`.
    pub fn touch(&mut self, id: u64) -> bool {
        self.exchange.touch(id)
    }

    /// See `Exchange::forget`.
    pub fn forget(&mut self, id: u64) {
        self.exchange.forget(id);
    }

    /// See `Exchange::deallocating`.
    pub fn deallocating(&mut self) {
        self.exchange.deallocating();
    }

    /// A whole reply (header `h`, at `at` in the read buffer) to the Describe pgcarpool
    /// added in front (`Exchange::learning`), which the client never sees: see
    /// `Owed::learn`. The unnamed statement's id and ParameterDescription body when the
    /// server described it as returning no rows.
    pub fn learned(&mut self, h: crate::proto::Header, at: usize) -> Option<(u64, Bytes)> {
        let body = self.conn.rbuf.get(at + 5..at + h.total).unwrap_or_default();
        self.exchange.owed.learn(h.tag, body)
    }

    /// A reply came: the message with header `h` at `at` in the read buffer (whole or
    /// not, see `Exchange::receive`). A whole ParameterStatus also sets the parameter.
    pub fn receive(
        &mut self,
        h: crate::proto::Header,
        at: usize,
        ledger: bool,
    ) -> Result<Reply, ProtoError> {
        let body = self.conn.rbuf.get(at + 5..at + h.total).unwrap_or_default();
        if h.tag == backend::PARAMETER_STATUS && !body.is_empty() {
            let (k, v) = backend::parse_parameter_status(body)?;
            self.params.set(k, v);
        }
        self.exchange.receive(h.tag, body, ledger)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::proto::backend::{
        COMMAND_COMPLETE, COPY_IN_RESPONSE, ERROR_RESPONSE as ERROR, READY_FOR_QUERY,
    };

    fn idle() -> Exchange {
        Exchange::new()
    }

    /// Feed server replies; returns the Syncs voided.
    fn replies(p: &mut Exchange, tags: &[u8]) -> u32 {
        let mut voided = 0;
        for &t in tags {
            if t == READY_FOR_QUERY {
                p.on_ready(b'I');
            } else {
                voided += p.on_reply(t);
            }
        }
        voided
    }

    #[test]
    fn a_copy_streamed_before_its_copy_in_response_ends_idle() {
        let mut p = idle();
        p.owe_ready(true);
        p.sent_copy_end();
        assert!(!p.is_idle());
        assert_eq!(replies(&mut p, &[COPY_IN_RESPONSE]), 0);
        assert!(p.copy_in);
        replies(&mut p, &[COMMAND_COMPLETE, READY_FOR_QUERY]);
        assert!(p.is_idle(), "{p:?}");
        assert!(p.marks.is_empty());
    }

    #[test]
    fn syncs_read_while_copying_in_owe_nothing() {
        // libpq: Execute, Sync, CopyData…, CopyDone, Sync; one ReadyForQuery comes.
        let mut p = idle();
        p.sent_execute();
        p.owe_ready(false);
        p.sent_copy_end();
        p.owe_ready(false);
        assert_eq!(p.expected_rfq, 2);
        assert_eq!(replies(&mut p, &[COPY_IN_RESPONSE, COMMAND_COMPLETE]), 1);
        assert_eq!(p.expected_rfq, 1);
        replies(&mut p, &[READY_FOR_QUERY]);
        assert!(p.is_idle(), "{p:?}");
        // The copy fails before the client's end: the Sync it read is void, the server
        // skips to the next Sync, which the client has not sent yet.
        p.sent_execute();
        p.owe_ready(false);
        assert_eq!(replies(&mut p, &[COPY_IN_RESPONSE, ERROR]), 1);
        assert!(p.unsynced && p.expected_rfq == 0);
        p.sent_copy_end();
        p.owe_ready(false);
        p.unsynced = false;
        replies(&mut p, &[READY_FOR_QUERY]);
        assert!(p.is_idle(), "{p:?}");
        assert!(p.marks.is_empty());
    }

    #[test]
    fn copy_ends_a_server_ignored_do_not_end_a_later_copy() {
        // A COPY that failed before it started, its CopyDone sent after it anyway.
        let mut p = idle();
        p.owe_ready(true);
        replies(&mut p, &[ERROR, READY_FOR_QUERY]);
        p.sent_copy_end();
        assert!(p.marks.is_empty(), "nothing can copy: ignored");
        p.owe_ready(true);
        p.sent_copy_end();
        p.sent_execute();
        p.owe_ready(false);
        p.sent_copy_end();
        p.owe_ready(false);
        // The query fails before copying: the CopyDone after it is ignored too.
        replies(&mut p, &[ERROR, READY_FOR_QUERY]);
        assert_eq!(replies(&mut p, &[COPY_IN_RESPONSE, COMMAND_COMPLETE]), 1);
        replies(&mut p, &[READY_FOR_QUERY]);
        assert!(p.is_idle(), "{p:?}");
    }

    // The exchange on byte slices: what a client sends, what a server answers.

    /// A message: tag, length, body.
    fn m(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut v = vec![tag];
        v.extend_from_slice(&(4 + body.len() as i32).to_be_bytes());
        v.extend_from_slice(body);
        v
    }

    fn q(sql: &str) -> Vec<u8> {
        m(frontend::QUERY, &[sql.as_bytes(), b"\0"].concat())
    }

    fn z(status: u8) -> Vec<u8> {
        m(READY_FOR_QUERY, &[status])
    }

    fn cc(tag: &str) -> Vec<u8> {
        m(COMMAND_COMPLETE, &[tag.as_bytes(), b"\0"].concat())
    }

    fn err(code: &str) -> Vec<u8> {
        m(
            ERROR,
            &[b"SERROR\0C", code.as_bytes(), b"\0Mno\0\0"].concat(),
        )
    }

    /// The client's messages in `bytes`, noted as sent (a last one cut short: sent in part).
    fn send(x: &mut Exchange, bytes: &[u8], ledger: bool) {
        let mut at = 0;
        while let Some(h) = crate::proto::header(&bytes[at..], usize::MAX).unwrap() {
            x.note_sent(h.tag, ledger);
            if bytes.len() - at < h.total {
                x.sent_partly(h.total - (bytes.len() - at));
                return;
            }
            at += h.total;
        }
    }

    /// The server's replies in `bytes`: each one's verdict.
    fn recv(x: &mut Exchange, bytes: &[u8], ledger: bool) -> Vec<Verdict> {
        let mut at = 0;
        let mut out = Vec::new();
        while let Some(h) = crate::proto::header(&bytes[at..], usize::MAX).unwrap() {
            let body = &bytes[at + 5..at + h.total];
            out.push(x.receive(h.tag, body, ledger).unwrap().verdict);
            at += h.total;
        }
        out
    }

    fn cat(parts: &[Vec<u8>]) -> Vec<u8> {
        parts.concat()
    }

    fn parse(name: &str, sql: &str) -> Vec<u8> {
        m(
            frontend::PARSE,
            &[name.as_bytes(), b"\0", sql.as_bytes(), b"\0\0\0"].concat(),
        )
    }

    fn bind(stmt: &str) -> Vec<u8> {
        m(
            frontend::BIND,
            &[b"\0", stmt.as_bytes(), b"\0\0\0\0\0\0\0"].concat(),
        )
    }

    fn execute() -> Vec<u8> {
        m(frontend::EXECUTE, b"\0\0\0\0\0")
    }

    fn sync() -> Vec<u8> {
        m(frontend::SYNC, b"")
    }

    #[test]
    fn a_simple_query_owes_its_ready_for_query_and_follows_the_status() {
        let mut x = Exchange::new();
        assert!(x.is_idle() && x.owes_nothing());
        send(&mut x, &q("begin"), false);
        assert!(!x.is_idle() && !x.is_idle_but_status());
        assert_eq!((x.ready_owed(), x.round(), x.answered()), (1, 1, 0));
        recv(&mut x, &cat(&[cc("BEGIN"), z(b'T')]), false);
        assert!(!x.is_idle(), "inside a transaction block");
        assert!(x.is_idle_but_status());
        assert_eq!((x.tx_status(), x.answered(), x.round()), (b'T', 1, 1));
        send(&mut x, &q("select 1/0"), false);
        recv(&mut x, &cat(&[err("22012"), z(b'E')]), false);
        assert_eq!(x.tx_status(), b'E');
        send(&mut x, &q("rollback"), false);
        recv(&mut x, &cat(&[cc("ROLLBACK"), z(b'I')]), false);
        assert!(x.is_idle() && x.owes_nothing());
        assert_eq!((x.answered(), x.round()), (3, 3));
    }

    #[test]
    fn an_extended_pipeline_is_owed_until_its_last_sync_is_answered() {
        let mut x = Exchange::new();
        let round = cat(&[parse("", "select 1"), bind(""), execute()]);
        send(&mut x, &round, false);
        assert!(x.unsynced() && !x.is_idle() && x.ready_owed() == 0);
        send(&mut x, &cat(&[sync(), round.clone(), sync()]), false);
        assert!(!x.unsynced());
        assert_eq!(x.ready_owed(), 2);
        let answer = cat(&[
            m(backend::PARSE_COMPLETE, b""),
            m(backend::BIND_COMPLETE, b""),
            m(backend::DATA_ROW, b"\0\x01\0\0\0\x011"),
            cc("SELECT 1"),
            z(b'I'),
        ]);
        recv(&mut x, &answer, false);
        assert_eq!(x.ready_owed(), 1);
        assert!(!x.is_idle());
        recv(&mut x, &answer, false);
        assert!(x.is_idle(), "{x:?}");
        // A Flush owes nothing.
        send(&mut x, &m(frontend::FLUSH, b""), false);
        assert!(x.is_idle());
    }

    #[test]
    fn the_ledger_follows_each_reply_of_a_pipeline_and_an_error_skips_to_the_sync() {
        let mut x = Exchange::new();
        let round = |x: &mut Exchange| {
            x.expect(Pending::Parse {
                swallow: false,
                stmt: None,
            });
            x.expect(Pending::Bind);
            send(x, &cat(&[execute(), sync()]), true);
        };
        round(&mut x);
        round(&mut x);
        assert!(!x.owes_nothing());
        assert_eq!(x.ready_owed(), 2);
        // The first round's Bind fails: its Execute is skipped, its Sync answered.
        let v = recv(
            &mut x,
            &cat(&[m(backend::PARSE_COMPLETE, b""), err("08P01"), z(b'I')]),
            true,
        );
        assert_eq!(v, [Verdict::Forward, Verdict::Forward, Verdict::Forward]);
        assert_eq!(x.ready_owed(), 1);
        // The second runs to its end.
        let v = recv(
            &mut x,
            &cat(&[
                m(backend::PARSE_COMPLETE, b""),
                m(backend::BIND_COMPLETE, b""),
                cc("SELECT 0"),
                z(b'I'),
            ]),
            true,
        );
        assert_eq!(
            v,
            [
                Verdict::Forward,
                Verdict::Forward,
                Verdict::Forward,
                Verdict::Forward
            ]
        );
        assert!(x.owes_nothing(), "{x:?}");
    }

    #[test]
    fn replies_to_what_pgcarpool_added_are_swallowed() {
        let mut x = Exchange::new();
        x.expect(Pending::Swallow);
        x.owe_ready(false);
        assert!(x.swallowing(backend::PARSE_COMPLETE));
        let v = recv(
            &mut x,
            &cat(&[m(backend::PARSE_COMPLETE, b""), z(b'I')]),
            true,
        );
        assert_eq!(v, [Verdict::Swallow, Verdict::Swallow]);
        assert!(!x.swallowing(backend::PARSE_COMPLETE) && x.owes_nothing());
        // Without the ledger every reply is the client's.
        x.expect(Pending::Swallow);
        send(&mut x, &q("select 1"), false);
        assert_eq!(recv(&mut x, &z(b'I'), false), [Verdict::Forward]);
        assert!(
            x.is_idle() && !x.owes_nothing(),
            "the ledger was not followed"
        );
        assert!(x.forget_owed());
        assert!(!x.forget_owed());
        assert!(x.owes_nothing());
    }

    #[test]
    fn a_copy_in_of_a_query_ends_with_its_command_complete() {
        let mut x = Exchange::new();
        let copy = cat(&[
            q("copy t from stdin"),
            m(frontend::COPY_DATA, b"1\n"),
            m(frontend::COPY_DONE, b""),
        ]);
        send(&mut x, &copy, true);
        recv(&mut x, &m(backend::COPY_IN_RESPONSE, b"\0\0\x01\0\0"), true);
        assert!(x.copy_in() && !x.is_idle());
        recv(&mut x, &cc("COPY 1"), true);
        assert!(!x.copy_in());
        recv(&mut x, &z(b'I'), true);
        assert!(x.owes_nothing(), "{x:?}");
        // A COPY that fails: the server's error ends it, the client's CopyFail after it
        // is ignored.
        send(&mut x, &q("copy t from stdin"), true);
        recv(&mut x, &m(backend::COPY_IN_RESPONSE, b"\0\0\x01\0\0"), true);
        recv(&mut x, &err("22P02"), true);
        assert!(!x.copy_in());
        send(&mut x, &m(frontend::COPY_FAIL, b"no\0"), true);
        recv(&mut x, &z(b'I'), true);
        assert!(x.owes_nothing(), "{x:?}");
    }

    #[test]
    fn syncs_an_extended_copy_in_swallowed_are_no_longer_owed() {
        // libpq: Parse, Bind, Execute, Sync, CopyData, CopyDone, Sync: one ReadyForQuery.
        let mut x = Exchange::new();
        x.expect(Pending::Bind);
        let msgs = cat(&[
            execute(),
            sync(),
            m(frontend::COPY_DATA, b"1\n"),
            m(frontend::COPY_DONE, b""),
            sync(),
        ]);
        send(&mut x, &msgs, true);
        assert_eq!(x.ready_owed(), 2);
        recv(
            &mut x,
            &cat(&[
                m(backend::BIND_COMPLETE, b""),
                m(backend::COPY_IN_RESPONSE, b"\0\0\x01\0\0"),
                cc("COPY 1"),
            ]),
            true,
        );
        assert_eq!(x.ready_owed(), 1, "the first Sync was read while copying");
        assert_eq!(x.answered(), 1, "it owes nothing: as good as answered");
        assert_eq!(recv(&mut x, &z(b'I'), true), [Verdict::Forward]);
        assert!(x.owes_nothing(), "{x:?}");
    }

    #[test]
    fn a_copy_out_is_forwarded_and_owes_nothing_more() {
        let mut x = Exchange::new();
        send(&mut x, &q("copy t to stdout"), true);
        let h = m(backend::COPY_OUT_RESPONSE, b"\0\0\x01\0\0");
        assert_eq!(recv(&mut x, &h, true), [Verdict::Forward]);
        assert!(!x.copy_in(), "copying out, not in");
        let out = cat(&[
            m(frontend::COPY_DATA, b"1\n"),
            m(frontend::COPY_DONE, b""),
            cc("COPY 1"),
            z(b'I'),
        ]);
        let v = recv(&mut x, &out, true);
        assert!(v.iter().all(|v| *v == Verdict::Forward), "{v:?}");
        assert!(x.owes_nothing() && !x.copy_in());
    }

    #[test]
    fn a_message_sent_in_parts_is_owed_until_its_last_byte() {
        let mut x = Exchange::new();
        let query = q("select 'a long text'");
        send(&mut x, &query[..9], false);
        assert_eq!(x.partial(), query.len() - 9);
        assert!(!x.is_idle_but_status());
        assert_eq!(x.send_rest(4), 4);
        assert_eq!(x.partial(), query.len() - 13);
        assert_eq!(
            x.send_rest(1000),
            query.len() - 13,
            "no more than the message"
        );
        assert_eq!((x.partial(), x.send_rest(5)), (0, 0));
        recv(&mut x, &cat(&[cc("SELECT 1"), z(b'I')]), false);
        assert!(x.is_idle());
    }

    #[test]
    fn an_unexpected_or_malformed_reply_does_not_upset_the_count() {
        let mut x = Exchange::new();
        // Nothing owed: a stray ReadyForQuery or notice leaves nothing owed.
        assert_eq!(recv(&mut x, &z(b'I'), true), [Verdict::Forward]);
        assert_eq!(
            recv(&mut x, &m(backend::NOTICE_RESPONSE, b"\0"), true),
            [Verdict::Forward]
        );
        assert!(x.owes_nothing());
        assert_eq!(x.ready_owed(), 0);
        // A ReadyForQuery without its status is refused.
        send(&mut x, &q("select 1"), true);
        assert!(matches!(
            x.receive(READY_FOR_QUERY, b"", true),
            Err(ProtoError::Malformed(_))
        ));
        assert_eq!(x.ready_owed(), 1, "still owed");
    }

    #[test]
    fn a_deallocate_all_the_server_ran_is_reported_with_the_ledger_only() {
        let r = crate::statements::StatementRegistry::default();
        let s = r.intern(b"", b"select 1\0\0\0").unwrap();
        let mut x = Exchange::new();
        x.hold(s.clone());
        assert!(x.holds(s.id) && x.prepared_len() == 1);
        // (Noted before the query that sends it: its round.)
        x.deallocating();
        send(&mut x, &q("deallocate all"), true);
        assert!(!x.holds(s.id));
        let reply = x.receive(COMMAND_COMPLETE, b"SELECT 1\0", true).unwrap();
        assert!(!reply.deallocated);
        let reply = x
            .receive(COMMAND_COMPLETE, b"DEALLOCATE ALL\0", true)
            .unwrap();
        assert!(reply.deallocated);
        recv(&mut x, &z(b'I'), true);
        assert!(!x.holds(s.id), "it ran");
        // One that did not run (an error): the statements are held again after its round.
        x.hold(s.clone());
        x.deallocating();
        send(&mut x, &q("deallocate all"), true);
        recv(&mut x, &err("25P02"), true);
        assert!(!x.holds(s.id));
        recv(&mut x, &z(b'E'), true);
        assert!(x.holds(s.id));
        assert!(x.touch(s.id));
        x.forget(s.id);
        assert!(!x.holds(s.id) && !x.touch(s.id));
        assert_eq!(x.prepared_len(), 0);
        // Without the ledger, no CommandComplete is looked into.
        let reply = x
            .receive(COMMAND_COMPLETE, b"DISCARD ALL\0", false)
            .unwrap();
        assert!(!reply.deallocated);
    }

    #[test]
    fn messages_are_judged_by_the_status_the_ones_sent_before_leave() {
        let mut x = Exchange::new();
        // BEGIN (I->T), then a statement that fails the block.
        x.sent_tx_effect([b'T', b'T', b'E']);
        send(&mut x, &q("begin"), false);
        assert_eq!((x.tx_status(), x.status_sent()), (b'I', b'T'));
        x.sent_tx_effect([b'I', b'I', b'I']);
        send(&mut x, &q("commit"), false);
        assert_eq!(x.status_sent(), b'I');
        recv(&mut x, &cat(&[cc("BEGIN"), z(b'T')]), false);
        assert_eq!((x.tx_status(), x.status_sent()), (b'T', b'I'));
        recv(&mut x, &cat(&[cc("COMMIT"), z(b'I')]), false);
        assert_eq!(x.status_sent(), b'I');
    }

    #[test]
    fn an_execute_is_owed_its_end_and_a_copy_it_starts_ends_with_it() {
        let mut x = Exchange::new();
        x.expect(Pending::Bind);
        send(&mut x, &execute(), true);
        recv(&mut x, &m(backend::BIND_COMPLETE, b""), true);
        assert!(!x.ledger_empty(), "the Execute's end is owed");
        recv(&mut x, &cc("SELECT 0"), true);
        assert!(x.ledger_empty());
        // Two Executes in a round, the second a COPY: the first one's end is not the
        // second's, whose copy swallows the Sync sent after it.
        let msgs = cat(&[
            execute(),
            execute(),
            sync(),
            m(frontend::COPY_DATA, b"1\n"),
            m(frontend::COPY_DONE, b""),
            sync(),
        ]);
        send(&mut x, &msgs, false);
        recv(&mut x, &cc("SELECT 0"), false);
        recv(
            &mut x,
            &m(backend::COPY_IN_RESPONSE, b"\0\0\x01\0\0"),
            false,
        );
        recv(&mut x, &cc("COPY 1"), false);
        assert_eq!(x.ready_owed(), 1);
        recv(&mut x, &z(b'I'), false);
        assert!(x.is_idle(), "{x:?}");
    }

    #[test]
    fn a_copy_end_the_server_ignored_does_not_hide_a_later_copy_start() {
        let mut x = Exchange::new();
        // A query that could copy, a CopyDone after it (it did not copy: ignored).
        send(
            &mut x,
            &cat(&[q("select 1"), m(frontend::COPY_DONE, b"")]),
            false,
        );
        recv(&mut x, &cat(&[cc("SELECT 1"), z(b'I')]), false);
        // An Execute's COPY that fails before the client ends it: the Sync sent with it
        // was read while copying, the server still wants one.
        send(&mut x, &cat(&[execute(), sync()]), false);
        recv(
            &mut x,
            &m(backend::COPY_IN_RESPONSE, b"\0\0\x01\0\0"),
            false,
        );
        recv(&mut x, &err("22P02"), false);
        assert!(x.unsynced() && x.ready_owed() == 0, "{x:?}");
    }

    #[test]
    fn pgcarpool_s_own_sync_and_a_query_end_an_extended_run() {
        let mut x = Exchange::new();
        send(&mut x, &parse("", "select 1"), false);
        assert!(x.unsynced());
        x.note_sync();
        assert!(!x.unsynced());
        assert_eq!(x.ready_owed(), 1);
        send(&mut x, &parse("", "select 1"), false);
        x.note_query();
        assert!(!x.unsynced());
    }

    #[test]
    fn without_the_ledger_the_replies_owed_are_left_alone() {
        let mut x = Exchange::new();
        x.expect(Pending::Ready(None));
        x.expect(Pending::Ready(None));
        let msgs = cat(&[
            execute(),
            sync(),
            m(frontend::COPY_DATA, b"1\n"),
            m(frontend::COPY_DONE, b""),
            sync(),
        ]);
        send(&mut x, &msgs, false);
        recv(
            &mut x,
            &m(backend::COPY_IN_RESPONSE, b"\0\0\x01\0\0"),
            false,
        );
        recv(&mut x, &cc("COPY 1"), false);
        assert_eq!(x.ready_owed(), 1);
        recv(&mut x, &z(b'I'), true);
        assert!(
            !x.ledger_empty(),
            "the Sync read while copying was not the ledger's"
        );
    }

    #[test]
    fn each_status_goes_through_its_own_column_of_an_effect() {
        for (status, want) in [(b'I', b'a'), (b'T', b'b'), (b'E', b'c')] {
            let mut x = Exchange::new();
            send(&mut x, &q("x"), false);
            recv(&mut x, &z(status), false);
            x.sent_tx_effect(*b"abc");
            assert_eq!(x.status_sent(), want, "from {}", status as char);
        }
    }

    #[test]
    fn at_most_so_many_transaction_statements_in_flight_are_followed() {
        let mut x = Exchange::new();
        for _ in 0..MAX_TX_SENT {
            x.sent_tx_effect(*b"TTT");
            send(&mut x, &q("begin"), false);
        }
        // One more (a ROLLBACK) is not followed: messages are judged by fewer.
        x.sent_tx_effect(*b"III");
        send(&mut x, &q("rollback"), false);
        assert_eq!(x.status_sent(), b'T');
    }

    #[test]
    fn the_unnamed_statement_and_answers_in_line() {
        let mut x = Exchange::new();
        assert_eq!(x.unnamed(), 0);
        x.set_unnamed(5);
        assert_eq!(x.unnamed(), 5);
        x.expect(Pending::Answer(Answer::ParseComplete));
        assert!(x.answer_due() && x.before_first_bind());
        assert_eq!(x.pop_answer(), Some(Answer::ParseComplete));
        assert!(!x.answer_due());
        x.expect(Pending::BindShared);
        x.expect(Pending::Ready(None));
        assert!(!x.before_first_bind());
        assert_eq!(
            x.receive(ERROR, &err("0A000")[5..], true).unwrap().verdict,
            Verdict::Stale
        );
        x.swallow_to_sync();
        assert_eq!(recv(&mut x, &z(b'I'), true), [Verdict::Swallow]);
        // A client's Parse of a name: undone when it fails.
        let r = crate::statements::StatementRegistry::default();
        let s = r.intern(b"", b"select 1\0\0\0").unwrap();
        x.expect(Pending::Parse {
            swallow: false,
            stmt: Some(s),
        });
        x.name_last_parse(Bytes::from_static(b"a"));
        x.expect(Pending::Ready(None));
        x.owe_ready(false);
        let reply = x.receive(ERROR, &err("42601")[5..], true).unwrap();
        assert!(matches!(&reply.undo[..], [Undo::Name(n, _, _)] if &n[..] == b"a"));
        recv(&mut x, &z(b'I'), true);
        assert!(x.owes_nothing());
    }
}
