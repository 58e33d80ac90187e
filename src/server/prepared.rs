//! The statements one server holds under pgcarpool's internal names.
use std::collections::HashMap;
use std::sync::{Arc, Weak};

use bytes::Bytes;

use super::Server;
use super::response::{Learning, Pending};
use crate::proto::frontend;
use crate::statements::Stmt;
use bytes::BufMut;

/// A statement a server holds: its id, and the statement while a client names it.
type Held = (u64, Weak<Stmt>);

/// The statements one server holds, by statement id, with a use tick for LRU eviction.
/// It does not keep them alive: a statement no client names any more leaves the registry,
/// and its server copy stays until evicted (a later Parse of the text gets a new id).
#[derive(Debug, Default)]
pub struct PreparedSet {
    held: HashMap<u64, (u64, Weak<Stmt>)>,
    tick: u64,
    /// DEALLOCATE ALL (or DISCARD ALL) sent whose outcome has not come, oldest first: the
    /// round whose ReadyForQuery ends it (`Exchange::answered`), the number of the reply
    /// owed for the message sent after it (`Owed::next_seq`), and the statements the set
    /// dropped when it was sent (held again if it fails).
    deallocs: std::collections::VecDeque<(u64, u64, Vec<Held>)>,
}

impl PreparedSet {
    /// Does the server hold it? Marks it used.
    pub fn touch(&mut self, id: u64) -> bool {
        self.tick += 1;
        match self.held.get_mut(&id) {
            Some(e) => {
                e.0 = self.tick;
                true
            }
            None => false,
        }
    }

    pub fn insert(&mut self, s: Arc<Stmt>) {
        self.tick += 1;
        self.held.insert(s.id, (self.tick, Arc::downgrade(&s)));
    }

    pub fn remove(&mut self, id: u64) {
        self.held.remove(&id);
    }

    /// A statement the set dropped is held after all (the server skipped its Close).
    pub fn restore(&mut self, id: u64, s: Weak<Stmt>) {
        self.tick += 1;
        self.held.entry(id).or_insert((self.tick, s));
    }

    /// Keep only the statements whose id passes `keep`.
    pub fn retain(&mut self, mut keep: impl FnMut(u64) -> bool) {
        self.held.retain(|id, _| keep(*id));
    }

    /// The server name of the least recently used statement, dropped from the set, to close
    /// when the set is full (with its id and the statement).
    pub fn evict_lru(&mut self) -> Option<(Bytes, u64, Weak<Stmt>)> {
        let id = self
            .held
            .iter()
            .min_by_key(|(_, (t, _))| *t)
            .map(|(id, _)| *id)?;
        let (_, s) = self.held.remove(&id)?;
        let name = Bytes::from(format!("{}{id}", crate::sql::classify::INTERNAL_PREFIX));
        Some((name, id, s))
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    pub fn clear(&mut self) {
        self.held.clear();
        self.deallocs.clear();
    }

    /// A DEALLOCATE ALL or DISCARD ALL was sent in this round, before the message whose
    /// reply is number `after`: the statements held go from the set, kept aside until the
    /// server says whether it ran.
    pub fn deallocating(&mut self, round: u64, after: u64) {
        let dropped = self.held.drain().map(|(id, (_, s))| (id, s)).collect();
        self.deallocs.push_back((round, after, dropped));
    }

    /// The Parse of this statement whose reply is number `seq` failed or was skipped: the
    /// server does not hold it, also once a DEALLOCATE ALL sent after that Parse (which
    /// took it aside) turns out not to have run. Kept aside by one sent before the Parse,
    /// it was held before and still is if that one did not run (long-run seed 4072).
    pub fn unparsed(&mut self, id: u64, seq: u64) {
        self.held.remove(&id);
        for (_, after, dropped) in &mut self.deallocs {
            if *after > seq {
                dropped.retain(|(i, _)| *i != id);
            }
        }
    }

    /// Is a DEALLOCATE ALL on its way? The server may still hold any statement: one to
    /// prepare is closed first.
    pub fn dealloc_in_flight(&self) -> bool {
        !self.deallocs.is_empty()
    }

    /// The server reported DEALLOCATE ALL or DISCARD ALL: the oldest one sent ran.
    pub fn deallocated(&mut self) {
        self.deallocs.pop_front();
    }

    /// Rounds up to `answered` are over: a DEALLOCATE ALL of theirs that did not run
    /// (refused, skipped, or only parsed) left the statements it was to drop.
    pub fn rounds_over(&mut self, answered: u64) {
        while let Some((round, ..)) = self.deallocs.front()
            && *round < answered
        {
            let Some((_, _, dropped)) = self.deallocs.pop_front() else {
                break;
            };
            for (id, s) in dropped {
                self.restore(id, s);
            }
        }
    }

    /// The statement with this id, if the server holds it and some client still names it.
    pub fn get(&self, id: u64) -> Option<Arc<Stmt>> {
        self.held.get(&id).and_then(|(_, w)| w.upgrade())
    }

    /// Does the server hold it (whether or not a client still names it)?
    pub fn holds(&self, id: u64) -> bool {
        self.held.contains_key(&id)
    }

    pub fn ids(&self) -> Vec<u64> {
        self.held.keys().copied().collect()
    }
}

impl Server {
    /// Prepare `stmt` under its internal name: a Parse (after a Close of the least recently
    /// used statements when `max` or more are held), its ParseComplete expected, swallowed
    /// or passed on to the client; the first time, a Describe of it too, whose replies are
    /// swallowed and kept (`Pending::Learn`).
    pub fn prepare(&mut self, stmt: Arc<Stmt>, swallow: bool, max: usize) {
        // After a reload to a smaller max_prepared_statements, down to the new size.
        while self.exchange.prepared.len() >= max.max(1)
            && let Some((old, id, s)) = self.exchange.prepared.evict_lru()
        {
            self.queue_close(&old, Some((id, s)));
        }
        if self.exchange.prepared.dealloc_in_flight() {
            self.queue_close(&stmt.server_name.clone(), None);
        }
        self.queue_parse(&stmt);
        self.exchange.prepared.insert(stmt.clone());
        self.exchange.owed.push(Pending::Parse {
            swallow,
            stmt: Some(stmt.clone()),
        });
        if !stmt.is_described() {
            self.learn(&stmt.server_name.clone(), Learning::Stmt(stmt));
        }
    }

    /// Queue a Describe of the statement the server knows as `name` (empty: the unnamed
    /// one), just parsed, whose replies pgcarpool keeps (`Owed::learn`) and swallows: what a
    /// Describe of it inside a failed transaction block is answered with on a server that
    /// does not hold it (`Stmt::no_rows_params`).
    pub fn learn(&mut self, name: &[u8], what: Learning) {
        self.conn.queue_with(|b| {
            b.put_u8(frontend::DESCRIBE);
            b.put_i32((4 + 1 + name.len() + 1) as i32);
            b.put_u8(b'S');
            b.put_slice(name);
            b.put_u8(0);
        });
        self.exchange
            .owed
            .push(Pending::Learn { what, params: None });
    }

    /// Close `stmt`'s server copy (its ReadyForQuery-less CloseComplete swallowed): a later
    /// use prepares it anew.
    pub fn unprepare(&mut self, stmt: &Stmt) {
        if !self.exchange.prepared.touch(stmt.id) {
            return;
        }
        let held = self.prepared_weak(stmt);
        self.exchange.prepared.remove(stmt.id);
        self.queue_close(&stmt.server_name, Some((stmt.id, held)));
    }

    fn prepared_weak(&self, stmt: &Stmt) -> Weak<Stmt> {
        self.exchange
            .prepared
            .get(stmt.id)
            .map(|s| Arc::downgrade(&s))
            .unwrap_or_default()
    }

    fn queue_close(&mut self, name: &[u8], evicted: Option<(u64, Weak<Stmt>)>) {
        self.conn.queue_with(|b| {
            b.put_u8(frontend::CLOSE);
            b.put_i32((4 + 1 + name.len() + 1) as i32);
            b.put_u8(b'S');
            b.put_slice(name);
            b.put_u8(0);
        });
        self.exchange.owed.push(Pending::Close {
            swallow: true,
            evicted,
        });
    }

    /// Prepare `stmt` in a round of its own before a simple query (its replies swallowed):
    /// by SQL PREPARE when a client made it so, else Parse and Sync. `execute`: the query
    /// is the client's `EXECUTE` of it, whose error this round's is (`Pending::Reprepare`);
    /// else an error is dropped too (`Pending::Prepare`). Either way the server lacks the
    /// statement after an error. `around`: queries of their own before and after it (SETs
    /// of the search_path it was made under and of the client's; apart, so that error
    /// positions stay those of its text).
    pub fn prepare_apart(
        &mut self,
        stmt: &Arc<Stmt>,
        execute: bool,
        around: Option<(String, String)>,
    ) {
        let sql = stmt.is_sql_prepared();
        if self.exchange.prepared.dealloc_in_flight() {
            self.queue_close(&stmt.server_name.clone(), None);
        }
        let (before, after) = around.unzip();
        if let Some(before) = before {
            self.send_added_query(|b| frontend::query(b, &before));
        }
        if sql {
            let prep = stmt.sql_prepare_text();
            self.conn.queue_with(|b| frontend::query(b, &prep));
            self.exchange.unnamed = 0;
        } else {
            self.queue_parse(stmt);
            self.conn.queue_with(frontend::sync);
        }
        self.exchange.owe_ready(sql);
        self.exchange.owed.push(if execute {
            Pending::Reprepare(stmt.clone())
        } else {
            Pending::Prepare(stmt.clone())
        });
        self.exchange.prepared.insert(stmt.clone());
        if let Some(after) = after {
            self.send_added_query(|b| frontend::query(b, &after));
        }
    }

    /// Prepare `stmt`, made by a client's SQL PREPARE, within the client's round (in the
    /// middle of a pipeline, where a query of its own cannot go): its PREPARE text parsed
    /// under pgcarpool's statement name `PGCARPOOL_prepare`, bound to the portal of that
    /// name and executed, both closed again; every reply dropped but an error (the client's
    /// unnamed statement and portal stay). Skipped after an error earlier in the round, the
    /// server does not hold it (`Pending::Parse` of `stmt`).
    pub fn prepare_sql_within_round(&mut self, stmt: &Arc<Stmt>) {
        use crate::proto::backend;
        const NAME: &[u8] = b"PGCARPOOL_prepare";
        if self.exchange.prepared.dealloc_in_flight() {
            self.queue_close(&stmt.server_name.clone(), None);
        }
        let text = stmt.sql_prepare_text();
        let msg = |b: &mut bytes::BytesMut, tag: u8, parts: &[&[u8]]| {
            let len = 4 + parts.iter().map(|p| p.len()).sum::<usize>();
            b.put_u8(tag);
            b.put_i32(len as i32);
            parts.iter().for_each(|p| b.put_slice(p));
        };
        self.conn.queue_with(|b| {
            msg(
                b,
                frontend::PARSE,
                &[NAME, b"\0", text.as_bytes(), b"\0\0\0"],
            );
            msg(b, frontend::BIND, &[NAME, b"\0", NAME, b"\0\0\0\0\0\0\0"]);
            msg(b, frontend::EXECUTE, &[NAME, b"\0\0\0\0\0"]);
            msg(b, frontend::CLOSE, &[b"S", NAME, b"\0"]);
            msg(b, frontend::CLOSE, &[b"P", NAME, b"\0"]);
        });
        self.exchange.prepared.insert(stmt.clone());
        self.exchange.owed.push(Pending::Parse {
            swallow: true,
            stmt: Some(stmt.clone()),
        });
        self.exchange
            .owed
            .push(Pending::SwallowTo(backend::BIND_COMPLETE));
        self.exchange
            .owed
            .push(Pending::SwallowTo(backend::COMMAND_COMPLETE));
        self.exchange.note_sent(frontend::EXECUTE, false);
        for _ in 0..2 {
            self.exchange
                .owed
                .push(Pending::SwallowTo(backend::CLOSE_COMPLETE));
        }
    }

    /// Parse a client's unnamed statement (`rest`: the Parse body after the name) here too,
    /// its ParseComplete swallowed; `id` identifies it (`VirtualSession::unnamed_id`).
    pub fn reparse_unnamed(&mut self, rest: Bytes, id: u64) {
        let len = 4 + 1 + rest.len();
        self.conn.queue_with(|b| {
            b.put_u8(frontend::PARSE);
            b.put_i32(len as i32);
            b.put_u8(0);
        });
        self.conn.queue(rest);
        self.exchange.unnamed = id;
        self.exchange.owed.push(Pending::Parse {
            swallow: true,
            stmt: None,
        });
    }

    /// Queue a Parse of `stmt` under its server name.
    fn queue_parse(&mut self, stmt: &Stmt) {
        let len = 4 + stmt.server_name.len() + 1 + stmt.parse_rest.len();
        self.conn.queue_with(|b| {
            b.put_u8(frontend::PARSE);
            b.put_i32(len as i32);
            b.put_slice(&stmt.server_name);
            b.put_u8(0);
        });
        self.conn.queue(stmt.parse_rest.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::statements::StatementRegistry;
    use bytes::BytesMut;

    #[test]
    fn lru_evicts_least_recently_used() {
        let r = StatementRegistry::default();
        let mut set = PreparedSet::default();
        let a = r.intern(b"", b"a\0\0\0").unwrap();
        let b = r.intern(b"", b"b\0\0\0").unwrap();
        set.insert(a.clone());
        set.insert(b.clone());
        assert!(set.touch(a.id));
        assert_eq!(set.evict_lru().unwrap().0, b.server_name);
        assert_eq!(set.len(), 1);
    }

    #[test]
    fn a_parse_that_did_not_run_leaves_the_statements_a_later_deallocate_all_kept_aside() {
        let r = StatementRegistry::default();
        let mut set = PreparedSet::default();
        let a = r.intern(b"", b"a\0\0\0").unwrap();
        let b = r.intern(b"", b"b\0\0\0").unwrap();
        // `a` held before; its Parse again (reply 3) and `b`'s (reply 4), then a DEALLOCATE
        // ALL (before reply 6); all skipped.
        set.insert(a.clone());
        set.insert(b.clone());
        set.deallocating(0, 6);
        set.unparsed(b.id, 4);
        set.rounds_over(1);
        assert!(!set.holds(b.id), "its Parse never ran");
        // A DEALLOCATE ALL sent before the Parse: the statement it kept aside was held
        // before the Parse and still is.
        set.deallocating(1, 7);
        set.unparsed(a.id, 9);
        set.rounds_over(2);
        assert!(set.holds(a.id));
    }

    /// The tags of the replies still owed, as the server would send them: what each gets.
    fn verdicts(server: &mut Server, tags: &[u8]) -> Vec<crate::server::response::Verdict> {
        let mut unnamed = server.exchange.unnamed;
        let mut set = std::mem::take(&mut server.exchange.prepared);
        let v = tags
            .iter()
            .map(|&t| {
                server
                    .exchange
                    .owed
                    .on_reply(t, None, &mut set, &mut unnamed)
                    .0
            })
            .collect();
        server.exchange.prepared = set;
        v
    }

    fn parse_msg(name: &[u8], rest: &[u8]) -> Vec<u8> {
        let mut m = vec![b'P'];
        m.extend_from_slice(&((4 + name.len() + 1 + rest.len()) as i32).to_be_bytes());
        m.extend_from_slice(name);
        m.push(0);
        m.extend_from_slice(rest);
        m
    }

    fn close_msg(name: &[u8]) -> Vec<u8> {
        let mut m = vec![b'C'];
        m.extend_from_slice(&((4 + 1 + name.len() + 1) as i32).to_be_bytes());
        m.push(b'S');
        m.extend_from_slice(name);
        m.push(0);
        m
    }

    #[tokio::test]
    async fn prepare_sends_a_parse_and_closes_the_lru_statement_when_full() {
        use crate::proto::backend::{CLOSE_COMPLETE, PARSE_COMPLETE};
        use crate::server::response::Verdict;
        let r = StatementRegistry::default();
        let a = r.intern(b"", b"select 1\0\0\0").unwrap();
        let b = r.intern(b"", b"select 2\0\0\0").unwrap();
        // Described already: no Describe is added (see the next test).
        a.set_description(None);
        b.set_description(None);
        let (mut server, _peer) = crate::server::test_server();
        server.prepare(a.clone(), true, 1);
        assert_eq!(
            server.conn.queued(),
            parse_msg(&a.server_name, &a.parse_rest)
        );
        assert!(server.exchange.prepared.holds(a.id));
        // Full (1 of 1): `a` is closed first, its CloseComplete swallowed; the client's
        // Parse gets its ParseComplete.
        server.conn.discard_out();
        server.prepare(b.clone(), false, 1);
        let mut want = close_msg(&a.server_name);
        want.extend(parse_msg(&b.server_name, &b.parse_rest));
        assert_eq!(server.conn.queued(), want);
        assert!(!server.exchange.prepared.holds(a.id));
        assert!(server.exchange.prepared.holds(b.id));
        assert_eq!(
            verdicts(
                &mut server,
                &[PARSE_COMPLETE, CLOSE_COMPLETE, PARSE_COMPLETE]
            ),
            [Verdict::Swallow, Verdict::Swallow, Verdict::Forward]
        );
        assert!(server.exchange.owed.is_empty());
        assert!(b.is_validated());
        // Room for two: nothing closed.
        server.conn.discard_out();
        server.prepare(a.clone(), true, 2);
        assert_eq!(
            server.conn.queued(),
            parse_msg(&a.server_name, &a.parse_rest)
        );
        assert_eq!(server.exchange.prepared.len(), 2);
    }

    /// The first Parse of a statement on any server is followed by a Describe of it, whose
    /// replies are kept as its description; once described, it is not described again.
    #[tokio::test]
    async fn the_first_prepare_describes_the_statement() {
        use crate::proto::backend::{NO_DATA, PARAMETER_DESCRIPTION, PARSE_COMPLETE};
        use crate::server::response::Verdict;
        let r = StatementRegistry::default();
        let a = r.intern(b"", b"insert into t values ($1)\0\0\0").unwrap();
        let (mut server, _peer) = crate::server::test_server();
        server.prepare(a.clone(), false, 4);
        let mut want = parse_msg(&a.server_name, &a.parse_rest);
        want.extend([b'D', 0, 0, 0, 4 + 1 + a.server_name.len() as u8 + 1, b'S']);
        want.extend_from_slice(&a.server_name);
        want.push(0);
        assert_eq!(server.conn.queued(), want);
        assert_eq!(verdicts(&mut server, &[PARSE_COMPLETE]), [Verdict::Forward]);
        assert!(server.exchange.owed.learning());
        // Its replies settle it (`Relay::swallow` swallows them).
        server
            .exchange
            .owed
            .learn(PARAMETER_DESCRIPTION, &[0, 1, 0, 0, 0, 23]);
        assert!(server.exchange.owed.learning());
        server.exchange.owed.learn(NO_DATA, &[]);
        assert!(server.exchange.owed.is_empty());
        assert_eq!(
            a.no_rows_params().map(|p| &p[..]),
            Some(&[0, 1, 0, 0, 0, 23][..])
        );
        server.unprepare(&a);
        server.conn.discard_out();
        server.exchange.owed.clear();
        server.prepare(a.clone(), true, 4);
        assert_eq!(
            server.conn.queued(),
            parse_msg(&a.server_name, &a.parse_rest)
        );
    }

    #[tokio::test]
    async fn unprepare_closes_only_a_statement_the_server_holds() {
        use crate::proto::backend::CLOSE_COMPLETE;
        use crate::server::response::Verdict;
        let r = StatementRegistry::default();
        let a = r.intern(b"", b"select 1\0\0\0").unwrap();
        let (mut server, _peer) = crate::server::test_server();
        server.unprepare(&a);
        assert!(server.conn.queued().is_empty());
        assert!(server.exchange.owed.is_empty());
        server.exchange.prepared.insert(a.clone());
        server.unprepare(&a);
        assert_eq!(server.conn.queued(), close_msg(&a.server_name));
        assert!(!server.exchange.prepared.holds(a.id));
        assert_eq!(verdicts(&mut server, &[CLOSE_COMPLETE]), [Verdict::Swallow]);
    }

    #[tokio::test]
    async fn prepare_apart_is_a_round_of_its_own() {
        use crate::proto::backend::{PARSE_COMPLETE, READY_FOR_QUERY};
        use crate::server::response::Verdict;
        let r = StatementRegistry::default();
        let a = r.intern(b"", b"select 1\0\0\0").unwrap();
        let (mut server, _peer) = crate::server::test_server();
        server.exchange.unnamed = 5;
        server.prepare_apart(&a, false, None);
        let mut want = parse_msg(&a.server_name, &a.parse_rest);
        want.extend_from_slice(b"S\0\0\0\x04");
        assert_eq!(server.conn.queued(), want);
        assert_eq!(server.exchange.ready_owed(), 1);
        assert_eq!(
            server.exchange.unnamed, 5,
            "a Parse of a named statement keeps it"
        );
        assert!(server.exchange.prepared.holds(a.id));
        assert_eq!(
            verdicts(&mut server, &[PARSE_COMPLETE, READY_FOR_QUERY]),
            [Verdict::Swallow, Verdict::Swallow]
        );
        assert!(server.exchange.owed.is_empty());

        // A SQL PREPARE statement is prepared by a Query, which drops the unnamed statement.
        let mut key = crate::statements::SQL_PREPARE_KEY.to_vec();
        key.extend_from_slice(b"AS select 2");
        let p = r.intern(b"", &key).unwrap();
        server.conn.discard_out();
        server.prepare_apart(&p, false, None);
        let mut want = BytesMut::new();
        frontend::query(&mut want, &p.sql_prepare_text());
        assert_eq!(server.conn.queued(), &want[..]);
        assert_eq!(server.exchange.ready_owed(), 2);
        assert_eq!(server.exchange.unnamed, 0);
        assert!(server.exchange.prepared.holds(p.id));
    }

    #[tokio::test]
    async fn reparse_unnamed_sends_the_clients_parse_and_swallows_its_reply() {
        use crate::proto::backend::PARSE_COMPLETE;
        use crate::server::response::Verdict;
        let (mut server, _peer) = crate::server::test_server();
        server.reparse_unnamed(Bytes::from_static(b"select 1\0\0\0"), 42);
        assert_eq!(server.conn.queued(), parse_msg(b"", b"select 1\0\0\0"));
        assert_eq!(server.exchange.unnamed, 42);
        assert_eq!(
            verdicts(&mut server, &[PARSE_COMPLETE, PARSE_COMPLETE]),
            [Verdict::Swallow, Verdict::Forward]
        );
    }

    #[test]
    fn eviction_follows_the_order_of_last_use() {
        let r = StatementRegistry::default();
        let mut set = PreparedSet::default();
        let stmts: Vec<_> = (0..4)
            .map(|i| r.intern(b"", format!("s{i}\0\0\0").as_bytes()).unwrap())
            .collect();
        for s in &stmts {
            set.insert(s.clone());
        }
        // Used: 2, 0; then 3 inserted again (a use too). Oldest first: 1, 2, 0, 3.
        assert!(set.touch(stmts[2].id));
        assert!(set.touch(stmts[0].id));
        set.insert(stmts[3].clone());
        for i in [1, 2, 0, 3] {
            assert_eq!(set.evict_lru().unwrap().0, stmts[i].server_name);
        }
        assert!(set.evict_lru().is_none());
    }

    #[test]
    fn a_statement_inserted_later_is_evicted_later() {
        // Ties would be broken by HashMap order, which differs from map to map: every try
        // must evict the older one.
        let r = StatementRegistry::default();
        let a = r.intern(b"", b"a\0\0\0").unwrap();
        let b = r.intern(b"", b"b\0\0\0").unwrap();
        for _ in 0..20 {
            let mut set = PreparedSet::default();
            set.insert(a.clone());
            set.insert(b.clone());
            assert_eq!(set.evict_lru().unwrap().0, a.server_name);
            let mut set = PreparedSet::default();
            set.insert(b.clone());
            assert!(!set.touch(a.id));
            set.insert(a.clone());
            assert_eq!(set.evict_lru().unwrap().0, b.server_name);
        }
    }

    #[test]
    fn the_set_reports_what_it_holds() {
        let r = StatementRegistry::default();
        let mut set = PreparedSet::default();
        assert!(set.is_empty());
        assert_eq!(set.len(), 0);
        let a = r.intern(b"", b"a\0\0\0").unwrap();
        let b = r.intern(b"", b"b\0\0\0").unwrap();
        set.insert(a.clone());
        set.insert(b.clone());
        assert!(!set.is_empty());
        assert_eq!(set.len(), 2);
        assert!(set.holds(a.id));
        assert!(!set.holds(a.id + b.id));
        assert_eq!(set.get(a.id).unwrap().id, a.id);
        let mut ids = set.ids();
        ids.sort();
        assert_eq!(ids, [a.id, b.id]);
        set.remove(a.id);
        assert!(!set.holds(a.id));
        assert!(set.get(a.id).is_none());
        set.clear();
        assert!(set.is_empty());
        assert!(set.ids().is_empty());
    }

    #[test]
    fn the_set_does_not_keep_statements_alive() {
        let r = StatementRegistry::default();
        let mut set = PreparedSet::default();
        let a = r.intern(b"", b"a\0\0\0").unwrap();
        set.insert(a.clone());
        let id = a.id;
        drop(a);
        assert!(set.get(id).is_none());
        assert!(r.is_empty());
        assert!(set.touch(id), "the server still holds it until evicted");
    }
}
