//! What a server owes for what was sent to it, in order, and what becomes of each reply:
//! passed to the client, swallowed (it answers a message pgcarpool added), or replaced (the
//! server refused a probe pgcarpool sent in place of a message it refused itself). Pure
//! bookkeeping: the relay feeds it what it sent and the tags (and SQLSTATEs) that came back.
use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;

use bytes::BufMut;

use super::Server;
use super::prepared::PreparedSet;
use crate::proto::{backend, frontend};
use crate::statements::Stmt;

/// A response the server owes for a message sent, or one pgcarpool answers itself, in order.
#[derive(Debug)]
pub enum Pending {
    /// ParseComplete; `swallow` for a Parse we added; `stmt` marks a named statement, `None`
    /// the unnamed one.
    Parse {
        swallow: bool,
        stmt: Option<Arc<Stmt>>,
    },
    /// ParseComplete for a client's Parse of a named statement (`name`, the client's name).
    /// If the server fails or skips it, PostgreSQL would not have made the name: it goes
    /// again (`Owed::take_undo`).
    NamedParse {
        stmt: Arc<Stmt>,
        name: Bytes,
    },
    /// ParseComplete of pgcarpool's check of a refused Parse's text under a name of its own
    /// (`Server::check_text`, closed at once): swallowed; failed or skipped, nothing the
    /// server holds changes.
    Check,
    /// A Describe pgcarpool added after a Parse (`Server::learn`): its ParameterDescription
    /// (`params`) and NoData or RowDescription are swallowed and kept as the statement's
    /// description (`Owed::learn`).
    Learn {
        what: Learning,
        params: Option<Bytes>,
    },
    /// A client's Parse of a named statement the server already holds: pgcarpool answers
    /// ParseComplete when it reaches the front; skipped, the name goes again.
    Answered(Bytes, Arc<Stmt>),
    /// ParseComplete for a client's Parse of the unnamed statement (`Undo::Unnamed`: the
    /// client's unnamed statement before it). Skipped, the old one comes back; failed, the
    /// client has none (`Lost::Unnamed`).
    UnnamedParse(Undo),
    /// A client's Close of a statement, answered by pgcarpool when it reaches the front;
    /// skipped, the statement comes back (`Undo::Closed`, `Undo::Unnamed`).
    Closed(Undo),
    Bind,
    /// A Bind of a shared statement the relay can send again (see `Verdict::Stale`).
    BindShared,
    /// Describe: ends with RowDescription or NoData.
    Describe,
    /// Execute: ends with CommandComplete, EmptyQueryResponse or PortalSuspended.
    Execute,
    Close {
        swallow: bool,
        /// A Close pgcarpool added to make room: the statement it closes (its id), which
        /// the server still holds if it skips the Close.
        evicted: Option<(u64, std::sync::Weak<Stmt>)>,
    },
    /// Sync, Query or FunctionCall: ends with ReadyForQuery. A query that is a SQL PREPARE
    /// carries its statement and the client's name for it: the name goes again if the
    /// query fails, and the server forgets the statement.
    Ready(Option<Box<(Arc<Stmt>, Bytes)>>),
    /// A query pgcarpool added: every reply up to its ReadyForQuery is dropped.
    Swallow,
    /// As `Swallow`, for the round that prepares this statement before a client's message
    /// that is not its `EXECUTE` query (`Server::prepare_apart`): failed (in a block that
    /// failed before the round, say: 25P02), the server lacks the statement, and a later
    /// use prepares it again.
    Prepare(Arc<Stmt>),
    /// As `Swallow`, for the round that prepares this statement again right before the
    /// client's `EXECUTE` query of it (`Server::prepare_apart`): PostgreSQL analyses a
    /// statement again at an EXECUTE (its plan cache, e.g. after the search_path changed)
    /// and fails the same way, so an error is the client's. The server then lacks the
    /// statement, and the error of the client's EXECUTE that follows is dropped
    /// (`Pending::DropError`): the client keeps its name, as in PostgreSQL.
    Reprepare(Arc<Stmt>),
    /// Every reply up to an ErrorResponse (included) is dropped: the client's query after
    /// a failed `Reprepare`, which fails too; its ReadyForQuery is the client's.
    DropError,
    /// An extended-protocol message pgcarpool added within a client's round: every reply
    /// up to the one with this tag (ParseComplete, BindComplete, CommandComplete,
    /// CloseComplete) is dropped; an error is the client's as any (`skip_to_sync`).
    SwallowTo(u8),
    /// A message pgcarpool refused: a probe sent in its place makes the server fail (so the
    /// server skips to the next Sync, or aborts a transaction block, as PostgreSQL would
    /// have); its error is replaced by this one (SQLSTATE, message).
    Fail(Box<(&'static str, String)>),
    /// Answered by pgcarpool when it reaches the front.
    Answer(Answer),
    /// One statement of the Execute or Query behind: its CommandComplete says RESET to
    /// the client when true (pgcarpool sent the client's RESET as a SET of its startup
    /// value), as the server wrote it when false. An error ends them all.
    Retag(bool),
}

/// The statement a Describe pgcarpool added describes.
#[derive(Debug)]
pub enum Learning {
    /// A shared statement, on its first Parse (`Stmt::set_description`).
    Stmt(Arc<Stmt>),
    /// The client's unnamed statement of this id (`VirtualSession::unnamed_id`).
    Unnamed(u64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    ParseComplete,
    CloseComplete,
    /// A Describe of a statement without a result, from its description: ParameterDescription
    /// with this body, then NoData.
    Described(Bytes),
    /// A whole simple query answered here: CommandComplete with this tag, ReadyForQuery.
    Query(&'static str),
}

/// What to do with one reply.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Pass it to the client.
    Forward,
    /// A CommandComplete the client gets as `RESET` (see `Pending::Retag`).
    Retag,
    /// It answers a message pgcarpool added: the client never sees it.
    Swallow,
    /// The server refused pgcarpool's probe: the client gets this error (SQLSTATE,
    /// message) instead.
    Replace(Box<(&'static str, String)>),
    /// A Bind of a shared statement failed with 0A000 (its plan must not change result
    /// type: the schema changed since a server parsed it). The server skips to the Sync;
    /// the relay may drop this error, prepare the statement anew and send the client's
    /// messages again (`Owed::swallow_to_sync`), or forward it.
    Stale,
}

/// What a reply means for the client's session.
#[derive(Debug, Default)]
pub enum Lost {
    #[default]
    Nothing,
    /// A SQL PREPARE failed: the client's name for the statement goes.
    Name(Box<(Arc<Stmt>, Bytes)>),
    /// The client's Parse of the unnamed statement failed: PostgreSQL dropped the old one.
    Unnamed,
    /// A round that prepared this statement before a client's message (`Pending::Prepare`)
    /// failed: the server lacks it (this reply says why).
    Unprepared(Arc<Stmt>),
}

/// A change to the client's statements made when its message was sent, to be undone if
/// the server fails or skips that message (PostgreSQL would not have made it).
#[derive(Debug)]
pub enum Undo {
    /// A named Parse made this client name, for this statement: it goes. The number of
    /// the Parse's reply (`Owed::front_seq`) tells what was sent after it.
    Name(Bytes, Arc<Stmt>, u64),
    /// A Close dropped this client name: it comes back, unless the name was taken again.
    Closed(Bytes, Arc<Stmt>),
    /// A Parse or Close of the unnamed statement replaced the client's unnamed statement
    /// `was` (its Parse body after the name, and its id; None: it had none) with the one of
    /// id `now` (0: none): `was` comes back, unless the unnamed statement changed again.
    Unnamed { was: Option<(Bytes, u64)>, now: u64 },
}

/// The responses one server owes, oldest first.
#[derive(Debug, Default)]
pub struct Owed {
    queue: VecDeque<Pending>,
    /// Changes to the client's statements whose message the server failed or skipped,
    /// oldest first.
    undo: Vec<Undo>,
    /// Entries pushed since the server connected: the entry pushed next is number
    /// `pushed`, the front one `pushed - queue.len()`.
    pushed: u64,
}

impl Owed {
    pub fn push(&mut self, p: Pending) {
        self.queue.push_back(p);
        self.pushed += 1;
    }

    /// The number of the entry pushed next (`front_seq` once the replies before it came).
    pub fn next_seq(&self) -> u64 {
        self.pushed
    }

    /// The number of the front entry: the message whose reply comes next.
    pub fn front_seq(&self) -> u64 {
        self.pushed - self.queue.len() as u64
    }

    /// Is the front entry a Parse's (an error then is about that Parse's own text)?
    pub fn front_is_parse(&self) -> bool {
        matches!(
            self.queue.front(),
            Some(
                Pending::Parse { .. }
                    | Pending::NamedParse { .. }
                    | Pending::UnnamedParse(_)
                    | Pending::Check
                    | Pending::Answered(..)
            )
        )
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub fn clear(&mut self) {
        self.queue.clear();
    }

    /// The client's Parse just queued (`Server::prepare`, not swallowed) made client name
    /// `name`: owed as a `NamedParse`, so that the name goes if the server fails or skips it.
    pub fn name_last_parse(&mut self, name: Bytes) {
        let learning = matches!(self.queue.back(), Some(Pending::Learn { .. }));
        let at = self.queue.len().wrapping_sub(1 + usize::from(learning));
        if let Some(last) = self.queue.get_mut(at)
            && let Pending::Parse {
                swallow: false,
                stmt: Some(stmt),
            } = last
        {
            *last = Pending::NamedParse {
                stmt: stmt.clone(),
                name,
            };
        }
    }

    /// Is a change to the client's statements (a named or unnamed Parse, a Close, a SQL
    /// PREPARE) still waiting for the server's answer? It is undone if the server fails or
    /// skips its message, so what the client sends after that message's Sync waits for it.
    pub fn undo_pending(&self) -> bool {
        self.queue.iter().any(|p| {
            matches!(
                p,
                Pending::NamedParse { .. }
                    | Pending::Answered(..)
                    | Pending::UnnamedParse(_)
                    | Pending::Closed(_)
                    | Pending::Ready(Some(_))
            )
        })
    }

    /// Changes to the client's statements whose message the server failed or skipped since
    /// the last call (PostgreSQL never made them), oldest first: they are undone newest
    /// first.
    pub fn take_undo(&mut self) -> Vec<Undo> {
        std::mem::take(&mut self.undo)
    }

    /// The next reply pgcarpool gives itself, when it is next in line.
    pub fn pop_answer(&mut self) -> Option<Answer> {
        let a = match self.queue.front() {
            Some(Pending::Answer(a)) => a.clone(),
            Some(Pending::Answered(..)) => Answer::ParseComplete,
            Some(Pending::Closed(_)) => Answer::CloseComplete,
            _ => return None,
        };
        self.queue.pop_front();
        Some(a)
    }

    /// `n` Syncs sent after the front entry turned out to owe nothing (the server read
    /// them while copying in): their ReadyForQuery entries go.
    pub fn void_readies(&mut self, mut n: u32) {
        let mut i = 1;
        while n > 0 && i < self.queue.len() {
            if matches!(self.queue[i], Pending::Ready(None)) {
                self.queue.remove(i);
                n -= 1;
            } else {
                i += 1;
            }
        }
    }

    /// After `Verdict::Stale` was handled by sending the client's messages again: the
    /// ReadyForQuery the failed round still owes is dropped, not passed on.
    pub fn swallow_to_sync(&mut self) {
        if let Some(front @ Pending::Ready(None)) = self.queue.front_mut() {
            *front = Pending::Swallow;
        }
    }

    /// Only Parse, Describe, Close and pgcarpool's own answers are owed: a Bind now starts
    /// the first execution since the last ReadyForQuery.
    pub fn before_first_bind(&self) -> bool {
        self.queue.iter().all(|p| {
            matches!(
                p,
                Pending::Parse { .. }
                    | Pending::Check
                    | Pending::Learn { .. }
                    | Pending::NamedParse { .. }
                    | Pending::Answered(..)
                    | Pending::UnnamedParse(_)
                    | Pending::Closed(_)
                    | Pending::Describe
                    | Pending::Close { .. }
                    | Pending::Answer(_)
            )
        })
    }

    /// Is a reply pgcarpool gives itself next in line?
    pub fn answer_due(&self) -> bool {
        matches!(
            self.queue.front(),
            Some(Pending::Answer(_) | Pending::Answered(..) | Pending::Closed(_))
        )
    }

    /// Is the front a Describe pgcarpool added (`Pending::Learn`)? Its replies are to be
    /// given to `learn` whole.
    pub fn learning(&self) -> bool {
        matches!(self.queue.front(), Some(Pending::Learn { .. }))
    }

    /// A whole reply (`tag`, `body`: ParameterDescription, then NoData or RowDescription)
    /// to the Describe pgcarpool added in front, which the client never sees: a shared
    /// statement's description is kept once it is complete, and the Describe is settled.
    /// The unnamed statement's id and ParameterDescription body when the server described
    /// it as returning no rows (the session keeps it).
    pub fn learn(&mut self, tag: u8, body: &[u8]) -> Option<(u64, Bytes)> {
        let Some(Pending::Learn { what, params }) = self.queue.front_mut() else {
            return None;
        };
        if tag == backend::PARAMETER_DESCRIPTION {
            *params = Some(Bytes::copy_from_slice(body));
            return None;
        }
        let found = match (tag, what, params.take()) {
            (backend::NO_DATA, Learning::Stmt(stmt), Some(p)) => {
                stmt.set_description(Some(p));
                None
            }
            (backend::NO_DATA, Learning::Unnamed(id), Some(p)) => Some((*id, p)),
            (backend::ROW_DESCRIPTION, Learning::Stmt(stmt), _) => {
                stmt.set_description(None);
                None
            }
            _ => None,
        };
        self.queue.pop_front();
        found
    }

    /// The next reply answers an extended-protocol message pgcarpool added
    /// (`Pending::SwallowTo`): it is dropped, so it must be read whole.
    pub fn swallows_next(&self) -> bool {
        matches!(self.queue.front(), Some(Pending::SwallowTo(_)))
    }

    /// A DataRow or RowDescription (`tag`) that changes nothing here and goes to the
    /// client as it is: what `on_reply` would answer (Forward, nothing lost, the queue as
    /// it was), found without it (the relay's fast path for rows).
    pub fn passes(&self, tag: u8) -> bool {
        let row = match tag {
            backend::DATA_ROW => true,
            backend::ROW_DESCRIPTION => false,
            _ => return false,
        };
        match self.queue.front() {
            Some(
                Pending::Swallow
                | Pending::Prepare(_)
                | Pending::Reprepare(_)
                | Pending::DropError
                | Pending::SwallowTo(_)
                | Pending::Learn { .. },
            ) => false,
            // A RowDescription ends a Describe.
            Some(Pending::Describe) => row,
            _ => true,
        }
    }

    /// Is a reply with this tag to a query pgcarpool added (or one whose replies are
    /// dropped), which the client never sees?
    pub fn swallowing(&self, tag: u8) -> bool {
        match self.queue.front() {
            Some(Pending::Swallow | Pending::Prepare(_)) => true,
            Some(Pending::Reprepare(_)) => tag != backend::ERROR_RESPONSE,
            Some(Pending::DropError) => tag != backend::READY_FOR_QUERY,
            _ => false,
        }
    }

    /// A reply with this tag (and, for an ErrorResponse, this SQLSTATE) came. Statements
    /// the server never prepared (it failed or skipped their Parse) leave `prepared`;
    /// `unnamed` (the server's `Server::unnamed`) becomes 0 when the server's unnamed
    /// statement is gone.
    pub fn on_reply(
        &mut self,
        tag: u8,
        code: Option<[u8; 5]>,
        prepared: &mut PreparedSet,
        unnamed: &mut u64,
    ) -> (Verdict, Lost) {
        if let Some(r) = self.on_retag(tag, code, prepared, unnamed) {
            return r;
        }
        if let Some(v) = self.on_reprepare(tag, prepared) {
            return (v, Lost::Nothing);
        }
        let Some(front) = self.queue.front_mut() else {
            return (Verdict::Forward, Lost::Nothing);
        };
        let (done, swallow) = match (tag, front) {
            (
                backend::READY_FOR_QUERY,
                Pending::Swallow | Pending::Prepare(_) | Pending::Reprepare(_),
            ) => (true, true),
            (backend::ERROR_RESPONSE, Pending::DropError) => (true, true),
            (backend::ERROR_RESPONSE, Pending::Prepare(s)) => {
                prepared.remove(s.id);
                return (Verdict::Swallow, Lost::Unprepared(s.clone()));
            }
            (
                _,
                Pending::Swallow | Pending::Prepare(_) | Pending::Reprepare(_) | Pending::DropError,
            ) => (false, true),
            (backend::ERROR_RESPONSE, Pending::Fail(_)) => {
                return (self.probe_failed(code, prepared, unnamed), Lost::Nothing);
            }
            (backend::ERROR_RESPONSE, Pending::BindShared) if code == Some(*b"0A000") => {
                self.skip_to_sync(prepared, unnamed, true);
                return (Verdict::Stale, Lost::Nothing);
            }
            (backend::ERROR_RESPONSE, Pending::Ready(p)) => {
                let lost = match p.take() {
                    Some(p) => {
                        prepared.remove(p.0.id);
                        Lost::Name(p)
                    }
                    None => Lost::Nothing,
                };
                return (Verdict::Forward, lost);
            }
            (backend::ERROR_RESPONSE, _) => {
                let lost = self.skip_to_sync(prepared, unnamed, true);
                return (Verdict::Forward, lost);
            }
            (tag, Pending::SwallowTo(end)) => (tag == *end, true),
            (backend::PARSE_COMPLETE, Pending::Parse { swallow, stmt }) => {
                if let Some(s) = stmt {
                    s.set_validated();
                }
                (true, *swallow)
            }
            (backend::PARSE_COMPLETE, Pending::NamedParse { stmt, .. }) => {
                stmt.set_validated();
                (true, false)
            }
            (backend::PARSE_COMPLETE, Pending::UnnamedParse(_)) => (true, false),
            (backend::PARSE_COMPLETE, Pending::Check) => (true, true),
            (backend::BIND_COMPLETE, Pending::Bind | Pending::BindShared) => (true, false),
            (backend::CLOSE_COMPLETE, Pending::Close { swallow, .. }) => (true, *swallow),
            (backend::ROW_DESCRIPTION | backend::NO_DATA, Pending::Describe) => (true, false),
            (
                backend::COMMAND_COMPLETE
                | backend::EMPTY_QUERY_RESPONSE
                | backend::PORTAL_SUSPENDED,
                Pending::Execute,
            ) => (true, false),
            (backend::READY_FOR_QUERY, Pending::Ready(_)) => (true, false),
            _ => (false, false),
        };
        if done {
            self.queue.pop_front();
        }
        let verdict = if swallow {
            Verdict::Swallow
        } else {
            Verdict::Forward
        };
        (verdict, Lost::Nothing)
    }

    /// A reply that settles a `Pending::Reprepare` in front (its error: the client's, and
    /// the error of the client's query after it is dropped) or a `Pending::DropError` (a
    /// ReadyForQuery: the query did not fail after all): what `on_reply` returns for it.
    fn on_reprepare(&mut self, tag: u8, prepared: &mut PreparedSet) -> Option<Verdict> {
        match (tag, self.queue.front()) {
            (backend::ERROR_RESPONSE, Some(Pending::Reprepare(s))) => {
                prepared.remove(s.id);
                self.queue[0] = Pending::Swallow;
                // (Not counted in `pushed`: the entries behind keep their numbers.)
                self.queue.insert(1, Pending::DropError);
                Some(Verdict::Forward)
            }
            (backend::READY_FOR_QUERY, Some(Pending::DropError)) => {
                self.queue.pop_front();
                None
            }
            _ => None,
        }
    }

    /// The server refused the probe in front (`Pending::Fail`) with
    /// this SQLSTATE: the client gets the probe's error in its place, or the server's 25P02.
    fn probe_failed(
        &mut self,
        code: Option<[u8; 5]>,
        prepared: &mut PreparedSet,
        unnamed: &mut u64,
    ) -> Verdict {
        let Some(Pending::Fail(f)) = self.queue.pop_front() else {
            unreachable!("front is a Fail")
        };
        self.skip_to_sync(prepared, unnamed, false);
        // Refused because the transaction block had already failed (25P02): what
        // PostgreSQL would have said too, except for a name that does not exist (26000),
        // which PostgreSQL looks up before it checks the transaction, and a Bind's wrong
        // parameter count (08P01), checked before it too.
        if code == Some(*b"25P02") && !matches!(f.0, "26000" | "08P01") {
            Verdict::Forward
        } else {
            Verdict::Replace(f)
        }
    }

    /// A reply that ends one statement of a query whose CommandCompletes are retagged
    /// (`Pending::Retag` in front): what `on_reply` returns for it. None: not such a reply.
    fn on_retag(
        &mut self,
        tag: u8,
        code: Option<[u8; 5]>,
        prepared: &mut PreparedSet,
        unnamed: &mut u64,
    ) -> Option<(Verdict, Lost)> {
        let Some(&Pending::Retag(reset)) = self.queue.front() else {
            return None;
        };
        if !matches!(
            tag,
            backend::COMMAND_COMPLETE | backend::ERROR_RESPONSE | backend::EMPTY_QUERY_RESPONSE
        ) {
            return None;
        }
        self.queue.pop_front();
        if tag != backend::ERROR_RESPONSE {
            // A SELECT pgcarpool added after the client's RESET ALL is one too.
            let next = matches!(
                self.queue.front(),
                Some(Pending::Retag(_) | Pending::SwallowTo(_))
            );
            return Some(match (next, reset && tag == backend::COMMAND_COMPLETE) {
                // More statements follow.
                (true, true) => (Verdict::Retag, Lost::Nothing),
                (true, false) => (Verdict::Forward, Lost::Nothing),
                (false, r) => {
                    let (v, lost) = self.on_reply(tag, code, prepared, unnamed);
                    let r = r && v == Verdict::Forward;
                    (if r { Verdict::Retag } else { v }, lost)
                }
            });
        }
        Some(self.on_reply(tag, code, prepared, unnamed))
    }

    /// After an error the server skips everything up to the next Sync: the replies owed
    /// for those messages never come. `failed_front`: the front entry is the message that
    /// failed.
    fn skip_to_sync(
        &mut self,
        prepared: &mut PreparedSet,
        unnamed: &mut u64,
        failed_front: bool,
    ) -> Lost {
        let mut lost = Lost::Nothing;
        let mut first = failed_front;
        while let Some(p) = self.queue.front() {
            if matches!(p, Pending::Ready(_)) {
                break;
            }
            let seq = self.front_seq();
            match self.queue.pop_front() {
                Some(Pending::Parse { stmt: Some(s), .. }) => prepared.unparsed(s.id, seq),
                // Skipped: the server keeps the statement it was to close.
                Some(Pending::Close {
                    evicted: Some((id, s)),
                    ..
                }) => prepared.restore(id, s),
                Some(Pending::NamedParse { stmt, name }) => {
                    prepared.unparsed(stmt.id, seq);
                    self.undo.push(Undo::Name(name, stmt, seq));
                }
                Some(Pending::Answered(name, stmt)) => {
                    self.undo.push(Undo::Name(name, stmt, seq));
                }
                Some(Pending::Closed(u)) => self.undo.push(u),
                Some(Pending::UnnamedParse(u)) => {
                    // The server's unnamed statement: dropped if it failed, unknown here.
                    *unnamed = 0;
                    if first {
                        // PostgreSQL drops the old unnamed statement before it parses.
                        lost = Lost::Unnamed;
                    } else {
                        self.undo.push(u);
                    }
                }
                Some(Pending::Parse {
                    stmt: None,
                    swallow,
                }) => {
                    // A failed Parse of the unnamed statement drops the old one first; a
                    // skipped one leaves the server's unnamed statement unknown.
                    *unnamed = 0;
                    if first && !swallow {
                        lost = Lost::Unnamed;
                    }
                }
                _ => {}
            }
            first = false;
        }
        lost
    }
}

/// What a probe parses, with one parameter of a type left to the server: it fails after
/// parse analysis (42P18, the parameter's type cannot be determined), or with 25P02 inside
/// a failed transaction block, exactly where PostgreSQL would have failed the refused
/// message. A utility statement, so its analysis takes no snapshot, as PostgreSQL's
/// refusals (26000, 08P01, 42P05…) take none: a `SELECT` probe's did, and a later `SET
/// TRANSACTION ISOLATION LEVEL` of the transaction failed as if a query had run (long-run
/// seed 5614).
const PROBE_SQL: &str = "SHOW pgcarpool.refused";

/// What `Server::probe_before_block` parses: a syntax error (42601), in a failed block too.
const PROBE_SYNTAX_SQL: &str = "pgcarpool_refused";

/// What a probe in place of a simple query runs: it fails in execution (26000), or with
/// 25P02 inside a failed transaction block. The statements refused in a query (EXECUTE,
/// PREPARE, DEALLOCATE) fail in execution too, after PostgreSQL made the unnamed portal
/// they run in, which a failed block keeps: a later Execute of it gets 25P02, not 34000.
pub const QUERY_PROBE_SQL: &str = "EXECUTE pgcarpool_refused";

/// The name a client's SQL PREPARE text is checked under (`Server::check_sql_prepare`).
pub const CHECK_NAME: &str = "pgcarpool_check";

impl Server {
    /// A client's message pgcarpool refused with this error (SQLSTATE, message): a probe
    /// that fails on the server takes its place (a Query for a simple query, else a Parse),
    /// so the server skips to the next Sync or aborts the transaction block it is in as
    /// PostgreSQL would have, and the client gets this error where PostgreSQL's would be.
    pub fn probe(&mut self, code: &'static str, message: String, query: bool) {
        if query {
            self.conn
                .queue_with(|b| frontend::query(b, QUERY_PROBE_SQL));
            self.exchange.owe_ready(true);
            self.exchange.unnamed = 0;
            self.exchange
                .owed
                .push(Pending::Fail(Box::new((code, message))));
            self.exchange.owed.push(Pending::Ready(None));
        } else {
            self.probe_parse(PROBE_SQL, 1, code, message);
        }
    }

    /// As `probe` for an extended message, for an error PostgreSQL reports even inside a
    /// failed transaction block (a named Parse of a name the client has, whose text is
    /// ROLLBACK or COMMIT: 42P05): the probe is a syntax error, which the server reports
    /// before it looks at the transaction.
    pub fn probe_before_block(&mut self, code: &'static str, message: String) {
        self.probe_parse(PROBE_SYNTAX_SQL, 0, code, message);
    }

    /// A Parse of `sql` with `params` parameters of unspecified type (0).
    fn probe_parse(&mut self, sql: &str, params: u8, code: &'static str, message: String) {
        const NAME: &[u8] = b"pgcarpool_refused";
        let len = 4 + NAME.len() + 1 + sql.len() + 1 + 2 + 4 * usize::from(params);
        self.conn.queue_with(|b| {
            b.put_u8(frontend::PARSE);
            b.put_i32(len as i32);
            b.put_slice(NAME);
            b.put_u8(0);
            b.put_slice(sql.as_bytes());
            b.put_u8(0);
            b.put_i16(i16::from(params));
            for _ in 0..params {
                b.put_u32(0);
            }
        });
        self.exchange
            .owed
            .push(Pending::Fail(Box::new((code, message))));
    }

    /// Have the server check a text pgcarpool refuses to parse for the client (`sql`, then
    /// `types`: the rest of a Parse body) as PostgreSQL would have checked it: a Parse
    /// under a name of pgcarpool's own (its ParseComplete swallowed) closed at once, so no
    /// statement of the server's changes. It fails with the text's error (42601, 42P01…),
    /// or 25P02 inside a failed transaction block, and the server skips to the next Sync.
    pub fn check_text(&mut self, sql: &[u8], types: &[u8]) {
        const NAME: &[u8] = b"pgcarpool_check";
        let len = 4 + NAME.len() + 1 + sql.len() + 1 + types.len();
        self.conn.queue_with(|b| {
            b.put_u8(frontend::PARSE);
            b.put_i32(len as i32);
            b.put_slice(NAME);
            b.put_u8(0);
            b.put_slice(sql);
            b.put_u8(0);
            b.put_slice(types);
        });
        self.exchange.owed.push(Pending::Check);
        self.conn.queue_with(|b| {
            b.put_u8(frontend::CLOSE);
            b.put_i32((4 + 1 + NAME.len() + 1) as i32);
            b.put_u8(b'S');
            b.put_slice(NAME);
            b.put_u8(0);
        });
        self.exchange.owed.push(Pending::Close {
            swallow: true,
            evicted: None,
        });
    }

    /// A client's SQL PREPARE pgcarpool refuses with this error (SQLSTATE, message: 42P05,
    /// a name the client has), in place of a simple query outside a failed block:
    /// PostgreSQL parses and analyses the text, resolves its parameter types, and only
    /// then looks at the name (`PrepareQuery`, then `StorePreparedStatement`). So the
    /// server runs `text` (`PREPARE "pgcarpool_check" …`, the client's text under a name of
    /// pgcarpool's own: its error, if any, is the client's), deallocates it, then fails a
    /// second `DEALLOCATE` of it in the probe's place; as unnamed Parse, Bind and Execute,
    /// then Sync (one round, the error skips the rest, as the client's query).
    pub fn check_sql_prepare(&mut self, text: &str, code: &'static str, message: String) {
        use crate::proto::backend;
        let dealloc = format!("DEALLOCATE \"{CHECK_NAME}\"");
        let bind_execute = |b: &mut bytes::BytesMut| {
            b.put_u8(frontend::BIND);
            b.put_i32(4 + 1 + 1 + 2 + 2 + 2);
            b.put_slice(&[0; 8]);
            b.put_u8(frontend::EXECUTE);
            b.put_i32(4 + 1 + 4);
            b.put_slice(&[0; 5]);
        };
        self.conn.queue_with(|b| {
            for sql in [text, &dealloc] {
                b.put_u8(frontend::PARSE);
                b.put_i32((4 + 1 + sql.len() + 1 + 2) as i32);
                b.put_u8(0);
                b.put_slice(sql.as_bytes());
                b.put_slice(&[0; 3]);
                bind_execute(b);
            }
            bind_execute(b);
        });
        self.exchange.unnamed = 0;
        for _ in 0..2 {
            for end in [
                backend::PARSE_COMPLETE,
                backend::BIND_COMPLETE,
                backend::COMMAND_COMPLETE,
            ] {
                self.exchange.owed.push(Pending::SwallowTo(end));
            }
        }
        self.exchange
            .owed
            .push(Pending::SwallowTo(backend::BIND_COMPLETE));
        self.exchange
            .owed
            .push(Pending::Fail(Box::new((code, message))));
        self.sync_for_query();
    }

    /// Send a client's SQL PREPARE (`msg`) of `stmt`, which the server then holds, under
    /// client name `name`: the name goes again if the server refuses the text.
    pub fn send_sql_prepare(&mut self, msg: Bytes, stmt: Arc<Stmt>, name: Bytes) {
        self.exchange.prepared.insert(stmt.clone());
        self.send_query(msg, Some(Box::new((stmt, name))));
    }

    /// End with a Sync a round pgcarpool made of a client's simple query (its DISCARD ALL
    /// as Parse, Bind, Execute): the ReadyForQuery is owed as the query's would be.
    pub fn sync_for_query(&mut self) {
        self.conn.queue_with(frontend::sync);
        self.exchange.owe_ready(true);
        self.exchange.owed.push(Pending::Ready(None));
    }

    /// Send a client's simple Query; its ReadyForQuery is owed. `prepares`: it is a SQL
    /// PREPARE of this statement under this client name.
    /// A query pgcarpool adds before the client's messages (`write` puts it in the
    /// server's buffer): every reply up to its ReadyForQuery is dropped. Its number
    /// (`Owed::front_seq` once it is in front).
    pub fn send_added_query(&mut self, write: impl FnOnce(&mut bytes::BytesMut)) -> u64 {
        self.conn.queue_with(write);
        self.exchange.owe_ready(true);
        self.exchange.unnamed = 0;
        let seq = self.exchange.owed.next_seq();
        self.exchange.owed.push(Pending::Swallow);
        seq
    }

    pub fn send_query(&mut self, msg: Bytes, prepares: Option<Box<(Arc<Stmt>, Bytes)>>) {
        self.conn.queue(msg);
        self.exchange.owe_ready(true);
        self.exchange.owed.push(Pending::Ready(prepares));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::statements::StatementRegistry;

    fn reply(o: &mut Owed, p: &mut PreparedSet, tag: u8, code: Option<&[u8; 5]>) -> Verdict {
        let mut unnamed = 7;
        o.on_reply(tag, code.copied(), p, &mut unnamed).0
    }

    /// `passes` says Forward-and-nothing-changes exactly where `on_reply` does, for rows
    /// and row descriptions, whatever is in front.
    #[test]
    fn rows_pass_where_the_reactor_would_change_nothing() {
        let r = StatementRegistry::default();
        let s = r.intern(b"", b"select 1\0\0\0").unwrap();
        let fronts = || {
            vec![
                None,
                Some(Pending::Bind),
                Some(Pending::Describe),
                Some(Pending::Execute),
                Some(Pending::Ready(None)),
                Some(Pending::Swallow),
                Some(Pending::Reprepare(s.clone())),
                Some(Pending::DropError),
                Some(Pending::SwallowTo(backend::COMMAND_COMPLETE)),
                Some(Pending::Learn {
                    what: Learning::Unnamed(1),
                    params: None,
                }),
                Some(Pending::Retag(true)),
                Some(Pending::Answer(Answer::ParseComplete)),
                Some(Pending::Prepare(s.clone())),
            ]
        };
        for tag in [backend::DATA_ROW, backend::ROW_DESCRIPTION] {
            for (i, front) in fronts().into_iter().enumerate() {
                let mut o = Owed::default();
                o.queue.extend(front);
                let len = o.queue.len();
                let passes = o.passes(tag);
                let mut p = PreparedSet::default();
                let mut unnamed = 7;
                let (v, lost) = o.on_reply(tag, None, &mut p, &mut unnamed);
                let unchanged = v == Verdict::Forward
                    && matches!(lost, Lost::Nothing)
                    && o.queue.len() == len
                    && o.undo.is_empty();
                // (A Learn's rows are taken before the reactor: `Relay::learns`.)
                let learn = i == 9;
                assert_eq!(
                    passes,
                    unchanged && !learn,
                    "tag {} front #{i}",
                    tag as char
                );
            }
        }
    }

    #[test]
    fn replies_to_added_messages_are_swallowed_in_order() {
        let r = StatementRegistry::default();
        let s = r.intern(b"", b"select 1\0\0\0").unwrap();
        let mut p = PreparedSet::default();
        let mut o = Owed::default();
        // A Parse pgcarpool added before the client's Bind, Execute, Sync.
        o.push(Pending::Parse {
            swallow: true,
            stmt: Some(s.clone()),
        });
        o.push(Pending::Bind);
        o.push(Pending::Execute);
        o.push(Pending::Ready(None));
        use backend::*;
        assert_eq!(
            reply(&mut o, &mut p, PARSE_COMPLETE, None),
            Verdict::Swallow
        );
        assert!(s.is_validated());
        assert_eq!(reply(&mut o, &mut p, BIND_COMPLETE, None), Verdict::Forward);
        assert_eq!(reply(&mut o, &mut p, DATA_ROW, None), Verdict::Forward);
        assert_eq!(
            reply(&mut o, &mut p, COMMAND_COMPLETE, None),
            Verdict::Forward
        );
        assert_eq!(
            reply(&mut o, &mut p, READY_FOR_QUERY, None),
            Verdict::Forward
        );
        assert!(o.is_empty());
    }

    #[test]
    fn replies_to_added_extended_messages_are_swallowed_up_to_their_tag() {
        let mut p = PreparedSet::default();
        let mut o = Owed::default();
        use backend::*;
        // The client's Execute (of DISCARD ALL), then pgcarpool's Parse, Bind, Execute,
        // Close, then the client's Sync.
        o.push(Pending::Execute);
        for end in [
            PARSE_COMPLETE,
            BIND_COMPLETE,
            COMMAND_COMPLETE,
            CLOSE_COMPLETE,
        ] {
            o.push(Pending::SwallowTo(end));
        }
        o.push(Pending::Ready(None));
        let r = |o: &mut Owed, p: &mut PreparedSet, tag| reply(o, p, tag, None);
        assert_eq!(r(&mut o, &mut p, COMMAND_COMPLETE), Verdict::Forward);
        for tag in [
            PARSE_COMPLETE,
            BIND_COMPLETE,
            DATA_ROW,
            COMMAND_COMPLETE,
            CLOSE_COMPLETE,
        ] {
            assert!(o.swallows_next());
            assert_eq!(r(&mut o, &mut p, tag), Verdict::Swallow);
        }
        assert_eq!(r(&mut o, &mut p, READY_FOR_QUERY), Verdict::Forward);
        assert!(o.is_empty());
        // An error in them is the client's; the rest is skipped to the Sync.
        for end in [PARSE_COMPLETE, BIND_COMPLETE] {
            o.push(Pending::SwallowTo(end));
        }
        o.push(Pending::Ready(None));
        assert_eq!(r(&mut o, &mut p, PARSE_COMPLETE), Verdict::Swallow);
        let e = reply(&mut o, &mut p, ERROR_RESPONSE, Some(b"22023"));
        assert_eq!(e, Verdict::Forward);
        assert_eq!(r(&mut o, &mut p, READY_FOR_QUERY), Verdict::Forward);
        assert!(o.is_empty());
    }

    #[test]
    fn an_error_skips_to_the_sync_and_forgets_statements_never_prepared() {
        let r = StatementRegistry::default();
        let s = r.intern(b"", b"select 1\0\0\0").unwrap();
        let mut p = PreparedSet::default();
        p.insert(s.clone());
        let mut o = Owed::default();
        o.push(Pending::Bind);
        o.push(Pending::Parse {
            swallow: false,
            stmt: Some(s.clone()),
        });
        o.push(Pending::Answer(Answer::CloseComplete));
        o.push(Pending::Ready(None));
        assert_eq!(
            reply(&mut o, &mut p, backend::ERROR_RESPONSE, Some(b"42601")),
            Verdict::Forward
        );
        assert!(!p.touch(s.id), "its Parse was skipped");
        assert!(o.pop_answer().is_none(), "skipped answers are not given");
        assert_eq!(
            reply(&mut o, &mut p, backend::READY_FOR_QUERY, None),
            Verdict::Forward
        );
        assert!(o.is_empty());
    }

    #[test]
    fn a_probe_error_is_replaced_unless_the_block_had_failed() {
        let mut p = PreparedSet::default();
        for (code, replaced) in [(b"42703", true), (b"25P02", false)] {
            let mut o = Owed::default();
            o.push(Pending::Fail(Box::new(("42P05", "exists".into()))));
            o.push(Pending::Execute);
            o.push(Pending::Ready(None));
            let v = reply(&mut o, &mut p, backend::ERROR_RESPONSE, Some(code));
            assert_eq!(
                v,
                if replaced {
                    Verdict::Replace(Box::new(("42P05", "exists".into())))
                } else {
                    Verdict::Forward
                }
            );
            assert_eq!(
                reply(&mut o, &mut p, backend::READY_FOR_QUERY, None),
                Verdict::Forward
            );
            assert!(o.is_empty());
        }
    }

    #[test]
    fn a_failed_unnamed_parse_drops_the_unnamed_statement() {
        let mut p = PreparedSet::default();
        let mut o = Owed::default();
        o.push(Pending::Parse {
            swallow: false,
            stmt: None,
        });
        o.push(Pending::Ready(None));
        let mut unnamed = 9;
        let (v, lost) = o.on_reply(
            backend::ERROR_RESPONSE,
            Some(*b"42703"),
            &mut p,
            &mut unnamed,
        );
        assert_eq!(v, Verdict::Forward);
        assert!(matches!(lost, Lost::Unnamed));
        assert_eq!(unnamed, 0);
    }

    #[test]
    fn a_failed_sql_prepare_gives_its_name_back() {
        let r = StatementRegistry::default();
        let s = r.intern(b"", b"\0PREPARE AS x").unwrap();
        let mut p = PreparedSet::default();
        p.insert(s.clone());
        let mut o = Owed::default();
        o.push(Pending::Ready(Some(Box::new((
            s.clone(),
            Bytes::from_static(b"p"),
        )))));
        let mut unnamed = 0;
        let (v, lost) = o.on_reply(
            backend::ERROR_RESPONSE,
            Some(*b"42601"),
            &mut p,
            &mut unnamed,
        );
        assert_eq!(v, Verdict::Forward);
        assert!(matches!(lost, Lost::Name(n) if &n.1[..] == b"p"));
        assert!(!p.touch(s.id));
        // Its ReadyForQuery still ends the query.
        assert_eq!(
            o.on_reply(backend::READY_FOR_QUERY, None, &mut p, &mut unnamed)
                .0,
            Verdict::Forward
        );
        assert!(o.is_empty());
    }

    #[test]
    fn a_stale_shared_bind_can_be_sent_again() {
        let mut p = PreparedSet::default();
        let mut o = Owed::default();
        o.push(Pending::BindShared);
        o.push(Pending::Execute);
        o.push(Pending::Ready(None));
        assert_eq!(
            reply(&mut o, &mut p, backend::ERROR_RESPONSE, Some(b"0A000")),
            Verdict::Stale
        );
        o.swallow_to_sync();
        assert_eq!(
            reply(&mut o, &mut p, backend::READY_FOR_QUERY, None),
            Verdict::Swallow
        );
        assert!(o.is_empty());
        // Another error of such a Bind is the client's.
        o.push(Pending::BindShared);
        o.push(Pending::Ready(None));
        assert_eq!(
            reply(&mut o, &mut p, backend::ERROR_RESPONSE, Some(b"22012")),
            Verdict::Forward
        );
    }

    #[tokio::test]
    async fn a_probe_for_a_query_is_a_query_whose_error_is_replaced() {
        let (mut server, _peer) = crate::server::test_server();
        server.exchange.unnamed = 3;
        server.probe("42P05", "exists".into(), true);
        let mut want = bytes::BytesMut::new();
        frontend::query(&mut want, "EXECUTE pgcarpool_refused");
        assert_eq!(server.conn.queued(), &want[..]);
        assert_eq!(server.exchange.ready_owed(), 1);
        assert_eq!(
            server.exchange.unnamed, 0,
            "a simple Query drops the unnamed statement"
        );
        let mut p = PreparedSet::default();
        assert_eq!(
            reply(
                &mut server.exchange.owed,
                &mut p,
                backend::ERROR_RESPONSE,
                Some(b"42703")
            ),
            Verdict::Replace(Box::new(("42P05", "exists".into())))
        );
        assert_eq!(
            reply(
                &mut server.exchange.owed,
                &mut p,
                backend::READY_FOR_QUERY,
                None
            ),
            Verdict::Forward
        );
        assert!(server.exchange.owed.is_empty());
    }

    #[tokio::test]
    async fn a_probe_for_an_extended_message_is_a_parse() {
        let (mut server, _peer) = crate::server::test_server();
        server.exchange.unnamed = 3;
        server.probe("26000", "no such statement".into(), false);
        let mut want = vec![b'P'];
        let body = b"pgcarpool_refused\0SHOW pgcarpool.refused\0\0\x01\0\0\0\0";
        want.extend_from_slice(&(4 + body.len() as i32).to_be_bytes());
        want.extend_from_slice(body);
        assert_eq!(server.conn.queued(), want);
        assert_eq!(
            server.exchange.ready_owed(),
            0,
            "the client's Sync comes later"
        );
        assert_eq!(server.exchange.unnamed, 3);
        let mut p = PreparedSet::default();
        assert_eq!(
            reply(
                &mut server.exchange.owed,
                &mut p,
                backend::ERROR_RESPONSE,
                Some(b"42P18")
            ),
            Verdict::Replace(Box::new(("26000", "no such statement".into())))
        );
        assert!(server.exchange.owed.is_empty());
    }

    #[tokio::test]
    async fn send_query_owes_a_ready_for_query() {
        let (mut server, _peer) = crate::server::test_server();
        let mut q = bytes::BytesMut::new();
        frontend::query(&mut q, "select 1");
        let q = q.freeze();
        server.send_query(q.clone(), None);
        server.send_query(q.clone(), None);
        assert_eq!(server.conn.queued(), [&q[..], &q[..]].concat());
        assert_eq!(server.exchange.ready_owed(), 2);
        let mut p = PreparedSet::default();
        assert!(!server.exchange.owed.before_first_bind());
        for _ in 0..2 {
            assert_eq!(
                reply(
                    &mut server.exchange.owed,
                    &mut p,
                    backend::READY_FOR_QUERY,
                    None
                ),
                Verdict::Forward
            );
        }
        assert!(server.exchange.owed.is_empty());
    }

    #[test]
    fn a_select_added_after_a_reset_all_in_a_query_is_dropped() {
        let mut p = PreparedSet::default();
        let mut o = Owed::default();
        // `RESET ALL; SELECT set_config(…); SHOW x`: the SELECT is pgcarpool's.
        o.push(Pending::Retag(false));
        o.push(Pending::SwallowTo(backend::COMMAND_COMPLETE));
        o.push(Pending::Retag(false));
        o.push(Pending::Ready(None));
        use backend::*;
        let got: Vec<Verdict> = [
            COMMAND_COMPLETE,
            ROW_DESCRIPTION,
            DATA_ROW,
            COMMAND_COMPLETE,
            ROW_DESCRIPTION,
            DATA_ROW,
            COMMAND_COMPLETE,
            PARAMETER_STATUS,
            READY_FOR_QUERY,
        ]
        .into_iter()
        .map(|t| reply(&mut o, &mut p, t, None))
        .collect();
        use Verdict::*;
        let want = [
            Forward, Swallow, Swallow, Swallow, Forward, Forward, Forward, Forward, Forward,
        ];
        assert_eq!(got, want);
        assert!(o.is_empty());
    }

    #[test]
    fn statements_sent_as_sets_of_startup_values_say_reset() {
        let mut p = PreparedSet::default();
        let mut o = Owed::default();
        // `RESET a; select 1; RESET b`, the RESETs sent as SETs.
        o.push(Pending::Retag(true));
        o.push(Pending::Retag(false));
        o.push(Pending::Retag(true));
        o.push(Pending::Ready(None));
        use backend::*;
        assert_eq!(
            reply(&mut o, &mut p, PARAMETER_STATUS, None),
            Verdict::Forward
        );
        assert_eq!(
            reply(&mut o, &mut p, COMMAND_COMPLETE, None),
            Verdict::Retag
        );
        assert_eq!(reply(&mut o, &mut p, DATA_ROW, None), Verdict::Forward);
        assert_eq!(
            reply(&mut o, &mut p, COMMAND_COMPLETE, None),
            Verdict::Forward
        );
        assert_eq!(
            reply(&mut o, &mut p, COMMAND_COMPLETE, None),
            Verdict::Retag
        );
        assert_eq!(
            reply(&mut o, &mut p, READY_FOR_QUERY, None),
            Verdict::Forward
        );
        assert!(o.is_empty());
        // An error ends the query: its other statements say nothing.
        o.push(Pending::Retag(true));
        o.push(Pending::Retag(true));
        o.push(Pending::Ready(None));
        assert_eq!(
            reply(&mut o, &mut p, ERROR_RESPONSE, Some(b"25P02")),
            Verdict::Forward
        );
        assert_eq!(
            reply(&mut o, &mut p, READY_FOR_QUERY, None),
            Verdict::Forward
        );
        assert!(o.is_empty());
        // A RESET bound and executed: its Execute ends with the CommandComplete.
        o.push(Pending::Retag(true));
        o.push(Pending::Execute);
        o.push(Pending::Ready(None));
        assert_eq!(
            reply(&mut o, &mut p, COMMAND_COMPLETE, None),
            Verdict::Retag
        );
        assert_eq!(
            reply(&mut o, &mut p, READY_FOR_QUERY, None),
            Verdict::Forward
        );
        assert!(o.is_empty());
    }

    #[test]
    fn a_failed_prepare_before_another_message_is_dropped_and_the_server_lacks_it() {
        use backend::{COMMAND_COMPLETE, ERROR_RESPONSE, READY_FOR_QUERY};
        let r = StatementRegistry::default();
        let s = r.intern(b"", b"select 1\0\0\0").unwrap();
        let mut p = PreparedSet::default();
        let mut o = Owed::default();
        // The round that prepares it (refused: a failed block), then the client's round.
        p.insert(s.clone());
        o.push(Pending::Prepare(s.clone()));
        o.push(Pending::Ready(None));
        assert!(o.swallowing(ERROR_RESPONSE) && o.swallowing(READY_FOR_QUERY));
        let got: Vec<Verdict> = [ERROR_RESPONSE, READY_FOR_QUERY, ERROR_RESPONSE]
            .iter()
            .map(|&t| reply(&mut o, &mut p, t, Some(b"25P02")))
            .collect();
        assert_eq!(got, [Verdict::Swallow, Verdict::Swallow, Verdict::Forward]);
        let ready = reply(&mut o, &mut p, READY_FOR_QUERY, None);
        assert_eq!(ready, Verdict::Forward);
        assert!(!p.holds(s.id), "the server lacks it");
        // Prepared: the server holds it.
        p.insert(s.clone());
        o.push(Pending::Prepare(s.clone()));
        let got: Vec<Verdict> = [COMMAND_COMPLETE, READY_FOR_QUERY]
            .iter()
            .map(|&t| reply(&mut o, &mut p, t, None))
            .collect();
        assert_eq!(got, [Verdict::Swallow, Verdict::Swallow]);
        assert!(p.holds(s.id));
    }

    #[test]
    fn a_failed_prepare_again_is_the_clients_error_and_its_executes_is_dropped() {
        use backend::{
            COMMAND_COMPLETE, DATA_ROW, ERROR_RESPONSE, READY_FOR_QUERY, ROW_DESCRIPTION,
        };
        let r = StatementRegistry::default();
        let s = r.intern(b"", b"select 1\0\0\0").unwrap();
        let mut p = PreparedSet::default();
        let mut o = Owed::default();
        // The round that prepares it again, then the client's EXECUTE query.
        p.insert(s.clone());
        o.push(Pending::Reprepare(s.clone()));
        o.push(Pending::Ready(None));
        let first = o.front_seq();
        assert!(o.swallowing(COMMAND_COMPLETE) && !o.swallowing(ERROR_RESPONSE));
        let got: Vec<Verdict> = [ERROR_RESPONSE, READY_FOR_QUERY, ERROR_RESPONSE]
            .iter()
            .map(|&t| {
                let swallowed = o.swallowing(t);
                let v = reply(&mut o, &mut p, t, Some(b"42P01"));
                assert_eq!(swallowed, v == Verdict::Swallow, "{t}");
                v
            })
            .collect();
        assert_eq!(got, [Verdict::Forward, Verdict::Swallow, Verdict::Swallow]);
        assert!(!p.holds(s.id), "the server lacks it");
        assert!(!o.swallowing(READY_FOR_QUERY));
        assert_eq!(
            o.front_seq(),
            first + 1,
            "the client's Ready keeps its number"
        );
        assert_eq!(
            reply(&mut o, &mut p, READY_FOR_QUERY, None),
            Verdict::Forward
        );
        // Prepared: the client's query is its own.
        p.insert(s.clone());
        o.push(Pending::Reprepare(s.clone()));
        o.push(Pending::Ready(None));
        let got: Vec<Verdict> = [
            COMMAND_COMPLETE,
            READY_FOR_QUERY,
            ROW_DESCRIPTION,
            DATA_ROW,
            COMMAND_COMPLETE,
            READY_FOR_QUERY,
        ]
        .iter()
        .map(|&t| reply(&mut o, &mut p, t, None))
        .collect();
        let swallowed: Vec<bool> = got.iter().map(|v| *v == Verdict::Swallow).collect();
        assert_eq!(swallowed, [true, true, false, false, false, false]);
        assert!(
            got.iter()
                .all(|v| matches!(v, Verdict::Swallow | Verdict::Forward))
        );
        assert!(p.holds(s.id) && o.is_empty());
    }

    #[test]
    fn closes_describes_and_answers_in_line() {
        let mut p = PreparedSet::default();
        let mut o = Owed::default();
        assert!(o.is_empty());
        o.push(Pending::Close {
            swallow: true,
            evicted: None,
        });
        o.push(Pending::Close {
            swallow: false,
            evicted: None,
        });
        o.push(Pending::Describe);
        o.push(Pending::Answer(Answer::ParseComplete));
        o.push(Pending::Describe);
        o.push(Pending::Ready(None));
        assert!(!o.is_empty());
        assert!(!o.answer_due());
        assert!(!o.swallowing(backend::READY_FOR_QUERY));
        assert_eq!(o.pop_answer(), None, "a Close is owed first");
        use backend::*;
        assert_eq!(
            reply(&mut o, &mut p, CLOSE_COMPLETE, None),
            Verdict::Swallow
        );
        assert_eq!(
            reply(&mut o, &mut p, CLOSE_COMPLETE, None),
            Verdict::Forward
        );
        assert!(!o.answer_due());
        assert_eq!(
            reply(&mut o, &mut p, PARAMETER_STATUS, None),
            Verdict::Forward,
            "a message that ends nothing leaves the Describe owed"
        );
        assert!(!o.answer_due());
        assert_eq!(
            reply(&mut o, &mut p, ROW_DESCRIPTION, None),
            Verdict::Forward
        );
        assert!(o.answer_due());
        assert_eq!(o.pop_answer(), Some(Answer::ParseComplete));
        assert!(!o.answer_due());
        assert_eq!(reply(&mut o, &mut p, NO_DATA, None), Verdict::Forward);
        assert_eq!(
            reply(&mut o, &mut p, READY_FOR_QUERY, None),
            Verdict::Forward
        );
        assert!(o.is_empty());
    }

    #[test]
    fn before_first_bind_means_nothing_executes_yet() {
        let mut o = Owed::default();
        assert!(o.before_first_bind());
        o.push(Pending::Parse {
            swallow: false,
            stmt: None,
        });
        o.push(Pending::Describe);
        o.push(Pending::Close {
            swallow: true,
            evicted: None,
        });
        o.push(Pending::Answer(Answer::CloseComplete));
        assert!(o.before_first_bind());
        o.push(Pending::Bind);
        assert!(!o.before_first_bind());
        o.clear();
        assert!(o.is_empty());
        o.push(Pending::Ready(None));
        assert!(!o.before_first_bind());
    }

    #[test]
    fn swallowing_while_an_added_query_is_in_front() {
        let mut p = PreparedSet::default();
        let mut o = Owed::default();
        o.push(Pending::Swallow);
        o.push(Pending::Ready(None));
        assert!(o.swallowing(backend::READY_FOR_QUERY));
        reply(&mut o, &mut p, backend::READY_FOR_QUERY, None);
        assert!(!o.swallowing(backend::READY_FOR_QUERY));
    }

    #[test]
    fn only_the_failed_parse_of_the_unnamed_statement_loses_it() {
        let mut p = PreparedSet::default();
        // A skipped unnamed Parse (after the failed Bind): the server's unnamed statement
        // is unknown, but the client's is not lost.
        let mut o = Owed::default();
        o.push(Pending::Bind);
        o.push(Pending::Parse {
            swallow: false,
            stmt: None,
        });
        o.push(Pending::Ready(None));
        let mut unnamed = 4;
        let (v, lost) = o.on_reply(
            backend::ERROR_RESPONSE,
            Some(*b"22012"),
            &mut p,
            &mut unnamed,
        );
        assert_eq!(v, Verdict::Forward);
        assert!(matches!(lost, Lost::Nothing));
        assert_eq!(unnamed, 0);
        // A failed Parse pgcarpool added (the client's statement, parsed again): not lost
        // for the client either.
        let mut o = Owed::default();
        o.push(Pending::Parse {
            swallow: true,
            stmt: None,
        });
        o.push(Pending::Ready(None));
        let (_, lost) = o.on_reply(
            backend::ERROR_RESPONSE,
            Some(*b"42P01"),
            &mut p,
            &mut unnamed,
        );
        assert!(matches!(lost, Lost::Nothing));
    }

    #[test]
    fn replies_of_an_added_query_are_all_swallowed() {
        let mut p = PreparedSet::default();
        let mut o = Owed::default();
        o.push(Pending::Swallow);
        o.push(Pending::Ready(None));
        for tag in [b'T', b'D', b'C', b'E'] {
            assert_eq!(reply(&mut o, &mut p, tag, Some(b"42000")), Verdict::Swallow);
        }
        assert_eq!(
            reply(&mut o, &mut p, backend::READY_FOR_QUERY, None),
            Verdict::Swallow
        );
        assert_eq!(
            reply(&mut o, &mut p, backend::READY_FOR_QUERY, None),
            Verdict::Forward
        );
    }

    /// The check of a refused Parse's text is a Parse under pgcarpool's own name, closed at
    /// once: passed, both replies are swallowed; failed (25P02, 42601…), the error is the
    /// client's and the server's unnamed statement is still the client's (seed 233).
    #[tokio::test]
    async fn a_text_check_leaves_the_servers_unnamed_statement() {
        let (mut server, _peer) = crate::server::test_server();
        server.exchange.unnamed = 5;
        server.check_text(b"select 1", &[0, 0]);
        let mut want = vec![b'P'];
        let body = b"pgcarpool_check\0select 1\0\0\0";
        want.extend_from_slice(&(4 + body.len() as i32).to_be_bytes());
        want.extend_from_slice(body);
        want.extend_from_slice(&[b'C', 0, 0, 0, 21, b'S']);
        want.extend_from_slice(b"pgcarpool_check\0");
        assert_eq!(server.conn.queued(), want);
        server.exchange.owed.push(Pending::Ready(None));
        let s = &mut server;
        let mut reply = |tag, code| {
            let x = &mut s.exchange;
            x.owed
                .on_reply(tag, code, &mut x.prepared, &mut x.unnamed)
                .0
        };
        assert_eq!(reply(backend::PARSE_COMPLETE, None), Verdict::Swallow);
        assert_eq!(reply(backend::CLOSE_COMPLETE, None), Verdict::Swallow);
        assert_eq!(reply(backend::READY_FOR_QUERY, None), Verdict::Forward);
        server.check_text(b"select 1", &[0, 0]);
        server.exchange.owed.push(Pending::Ready(None));
        let s = &mut server;
        let mut reply = |tag, code| {
            let x = &mut s.exchange;
            x.owed
                .on_reply(tag, code, &mut x.prepared, &mut x.unnamed)
                .0
        };
        assert_eq!(
            reply(backend::ERROR_RESPONSE, Some(*b"25P02")),
            Verdict::Forward
        );
        assert_eq!(reply(backend::READY_FOR_QUERY, None), Verdict::Forward);
        assert!(server.exchange.owed.is_empty());
        assert_eq!(server.exchange.unnamed, 5);
    }

    /// The replies to a Describe pgcarpool added settle it; NoData keeps the
    /// ParameterDescription as the description (of a shared statement, or handed back for
    /// the unnamed one), RowDescription says it returns rows.
    #[test]
    fn a_describe_added_is_swallowed_and_kept() {
        let r = StatementRegistry::default();
        let a = r.intern(b"", b"insert into t values ($1)\0\0\0").unwrap();
        let b = r.intern(b"", b"select $1::int\0\0\0").unwrap();
        let mut o = Owed::default();
        o.push(Pending::Learn {
            what: Learning::Stmt(a.clone()),
            params: None,
        });
        o.push(Pending::Learn {
            what: Learning::Stmt(b.clone()),
            params: None,
        });
        o.push(Pending::Learn {
            what: Learning::Unnamed(7),
            params: None,
        });
        let params = [0, 1, 0, 0, 0, 23];
        let mut seen = Vec::new();
        for tag in [b't', b'n', b't', b'T', b't', b'n'] {
            assert!(o.learning());
            seen.push(o.learn(tag, if tag == b't' { &params } else { &[] }));
        }
        assert!(o.is_empty());
        assert_eq!(a.no_rows_params().map(|b| &b[..]), Some(&params[..]));
        assert!(b.is_described());
        assert_eq!(b.no_rows_params(), None);
        assert_eq!(seen[5], Some((7, Bytes::copy_from_slice(&params))));
        assert!(seen[..5].iter().all(Option::is_none));
    }
}
