//! The virtual-statement layer of the relay: client statement names are mapped to shared
//! statements, prepared lazily on whichever server runs the client's work, and the replies
//! pgcarpool answers itself are put in order with the server's.
use std::sync::Arc;

use bytes::{BufMut, Bytes};

use super::classify::{self, Effects};
use super::prepared::{SQL_PREPARE_KEY, Stmt};
use super::relay::Relay;
use super::session::VirtualSession;
use crate::proto::{ProtoError, Reader, backend, frontend};
use crate::server::Server;
use crate::server::response::{Answer, CHECK_NAME, Learning, Lost, Pending, Undo, Verdict};
use crate::sql::facts::Facts;
use crate::sql::selfview;

/// The common extended-protocol messages that need no rewriting: the unnamed statement
/// where this server holds the client's own, portals. Notes what the server will owe and
/// returns true; false means the message needs `Relay::on_extended`.
pub(super) fn passes_through(
    tag: u8,
    body: &[u8],
    session: &mut VirtualSession,
    server: &mut Server,
    effects: &mut Effects,
) -> Result<bool, ProtoError> {
    let mut r = Reader::new(body, "extended-protocol message");
    let unnamed_here =
        session.ext.unnamed_id != 0 && server.exchange().unnamed() == session.ext.unnamed_id;
    let entry = match tag {
        frontend::PARSE => {
            if !r.cstr_bytes()?.is_empty() {
                return Ok(false);
            }
            if session.ext.unnamed.as_deref() == Some(&body[1..]) {
                // Parsed just before: perhaps served by a shared statement
                // (`Relay::parse_planned_once`).
                return Ok(false);
            }
            let sql = r.cstr_bytes()?;
            if !classify::returns_rows(sql) {
                // Described too (`Relay::parse_unnamed`).
                return Ok(false);
            }
            if classify::may_matter(sql) {
                if classify::named_statement(sql).is_some()
                    || to_startup_value(session, sql).is_some()
                {
                    return Ok(false);
                }
                let e = classify::classify(sql);
                if e.reserved_name
                    || e.deallocate.is_some()
                    || e.deallocate_all
                    || e.ddl
                    || e.introspects
                {
                    return Ok(false);
                }
                effects.merge(e);
            }
            let was = session.unnamed_before();
            let now = session.parsed_unnamed(&body[1..]);
            server.set_unnamed(now);
            Pending::UnnamedParse(Undo::Unnamed { was, now })
        }
        frontend::BIND => {
            let portal = r.cstr_bytes()?;
            if !r.cstr_bytes()?.is_empty()
                || !unnamed_here
                || session.ext.unnamed_signals == session.ext.unnamed_id
                || !session.ext.deallocating_portals.is_empty()
                || (session.ext.unnamed_id != 0
                    && session.ext.unnamed_deallocates == session.ext.unnamed_id)
            {
                return Ok(false);
            }
            if portal.is_empty() {
                session.ext.retag_portal = session
                    .ext
                    .unnamed
                    .as_deref()
                    .is_some_and(|u| u.starts_with(RESET_MARK));
            }
            bound_unnamed(session, portal, false, effects);
            let listen = session.ext.unnamed.clone().filter(|u| listens(u));
            session.bound_listen(portal, listen.as_ref());
            if session
                .ext
                .unnamed
                .as_deref()
                .is_some_and(|u| startup_follows(session, u))
            {
                session.ext.discard_portal = Some(Bytes::copy_from_slice(portal));
            }
            Pending::Bind
        }
        frontend::DESCRIBE => {
            let kind = r.u8()?;
            let name = r.cstr_bytes()?;
            if kind == b'S' && (!name.is_empty() || !unnamed_here) {
                return Ok(false);
            }
            Pending::Describe
        }
        _ => {
            if r.u8()? == b'S' {
                return Ok(false);
            }
            Pending::Close {
                swallow: false,
                evicted: None,
            }
        }
    };
    server.expect(entry);
    Ok(true)
}

impl Relay<'_> {
    /// A whole simple Query from the client.
    /// `facts`: its text's (`Facts::of`), when found already.
    pub(super) fn on_query(&mut self, msg: Bytes, facts: Option<Facts>) -> Result<(), ProtoError> {
        // A simple query drops the unnamed statement, the client's and the server's.
        self.session.drop_unnamed();
        self.server.set_unnamed(0);
        let sql = Reader::new(&msg[5..], "Query").cstr_bytes()?;
        let facts = facts.unwrap_or_else(|| Facts::of(sql));
        let tx = facts.tx;
        if self.listen_in_block(sql) {
            return Ok(());
        }
        if !facts.may_matter {
            self.send_client_query(msg, tx);
            return Ok(());
        }
        let mut e = classify::classify(sql);
        refused_in_block(&mut e, self.server.status_sent());
        self.note_effects(&e);
        // The client's own pid where it asks for it (`selfview::rewrite`).
        let own = e
            .introspects
            .then(|| self.own_session(sql, true, None))
            .flatten();
        let discards = e.discard_all && classify::split(sql).len() == 1;
        if let Some(sql) = self.startup_values_query(sql) {
            // Back to the values the client's startup packet gave, as PostgreSQL's would be.
            self.effects.merge(e);
            self.send_client_query(query_message(&sql), tx);
            return Ok(());
        }
        let named = classify::named_statement(sql);
        let dealloc = e.deallocate.clone();
        if self.server.status_sent() == b'E' && (named.is_some() || dealloc.is_some()) {
            // Refused by the server (25P02) as PostgreSQL refuses it: the names stay as
            // they are. PostgreSQL parses the query first: the server checks the client's
            // text (a syntax error is 42601), then the probe fails.
            self.server.check_text(sql, b"\0\0");
            self.server.probe("25P02", String::new(), false);
            self.server.sync_for_query();
            return Ok(());
        }
        if e.reserved_name && named.is_none() && dealloc.is_none() {
            self.effects.merge(e);
            let msg = format!(
                "prepared statement names beginning with \"{}\" are reserved by pgcarpool",
                classify::INTERNAL_PREFIX
            );
            self.server.probe("42939", msg, true);
            return Ok(());
        }
        if e.deallocate_all && self.server.status_sent() != b'E' {
            // The client's names go, and the server's statements unless it refuses it
            // (a failed transaction block refuses it at once).
            self.session.statements.clear();
            self.server.deallocating();
        }
        self.effects.merge(e);
        if let Some(name) = dealloc {
            match self.session.statements.remove(name.as_bytes()) {
                // Only the client's name goes: the server keeps the statement for others.
                Some(_) => self.answer(Answer::Query("DEALLOCATE")),
                None => {
                    self.unknown_statement(&name, msg, true);
                }
            }
            return Ok(());
        }
        match named {
            Some(classify::Named::Prepare { name, rest }) => self.sql_prepare(sql, name, rest),
            Some(classify::Named::Execute { name, rest }) => {
                match self.session.statements.get(name.as_bytes()).cloned() {
                    Some(stmt) => {
                        self.ensure_for_query(&stmt, name.as_bytes());
                        let sql = self.execute_text(&stmt, name.as_bytes(), sql, rest);
                        self.server.send_query(query_message(&sql), None);
                    }
                    None => {
                        self.unknown_statement(&name, msg, true);
                    }
                }
            }
            None if discards && self.discard_all_to_startup(sql) => {}
            None if self.prepare_in_many(sql) => {}
            None if self.listen_in_many(sql, tx) => {}
            None => {
                let msg = own.map_or(msg, |sql| query_bytes(&sql));
                self.send_client_query(msg, tx)
            }
        }
        Ok(())
    }

    /// A client's LISTEN or UNLISTEN query inside a transaction block that goes as
    /// `notify::in_block_query`: sent so (its CommandComplete is the client's, the rest
    /// pgcarpool's), true; else false, nothing sent.
    fn listen_in_block(&mut self, sql: &[u8]) -> bool {
        if self.server.status_sent() != b'T' {
            return false;
        }
        let n = self.listen_in_block.len() + 1;
        let Some((text, listen, op)) =
            super::notify::in_block_query(sql, &self.listener_channels, n)
        else {
            return false;
        };
        self.listen_in_block.push(op);
        self.server.expect(Pending::Retag(false));
        for _ in 0..1 + usize::from(listen) {
            self.server
                .expect(Pending::SwallowTo(backend::COMMAND_COMPLETE));
        }
        self.server.send_query(query_message(&text), None);
        true
    }

    /// A query of several statements with a LISTEN or UNLISTEN of a channel the pool's
    /// listener has for the client (`UNLISTEN *`: when it has any): each such statement
    /// goes as `notify::in_block_query` makes it (its CommandComplete is the client's, the
    /// rest pgcarpool's, dropped), the others as written; what committed is done by the
    /// listener after the transaction (`notify::after_block`). False, nothing sent: none.
    fn listen_in_many(&mut self, sql: &[u8], tx: Option<[u8; 3]>) -> bool {
        if self.listener_channels.is_empty() {
            return false;
        }
        let stmts = classify::split(sql);
        let mut text = Vec::with_capacity(sql.len() + 64);
        // Per statement up to the last one rewritten: the statements pgcarpool added.
        let mut added = Vec::new();
        let mut ops = Vec::new();
        let mut copied = 0;
        for &(a, b) in &stmts {
            let n = self.listen_in_block.len() + ops.len() + 1;
            let Some((q, listen, op)) =
                super::notify::in_block_query(&sql[a..b], &self.listener_channels, n)
            else {
                added.push(0);
                continue;
            };
            text.extend_from_slice(&sql[copied..a]);
            text.extend_from_slice(q.as_bytes());
            copied = b;
            added.push(1 + usize::from(listen));
            ops.push(op);
        }
        if ops.is_empty() || stmts.len() < 2 {
            return false;
        }
        text.extend_from_slice(&sql[copied..]);
        let Ok(len) = i32::try_from(4 + text.len() + 1) else {
            return false;
        };
        let last = added.iter().rposition(|&k| k > 0).unwrap_or(0);
        for &k in &added[..=last] {
            self.server.expect(Pending::Retag(false));
            for _ in 0..k {
                self.server
                    .expect(Pending::SwallowTo(backend::COMMAND_COMPLETE));
            }
        }
        self.listen_in_block.extend(ops);
        if let Some(e) = tx {
            self.server.sent_tx_effect(e);
        }
        let mut b = bytes::BytesMut::with_capacity(text.len() + 6);
        b.put_u8(frontend::QUERY);
        b.put_i32(len);
        b.put_slice(&text);
        b.put_u8(0);
        self.server.send_query(b.freeze(), None);
        true
    }

    /// A client's `PREPARE name rest` query (`sql`): the name goes into its session, the
    /// statement is prepared on this server under its shared name unless it holds it.
    fn sql_prepare(&mut self, sql: &[u8], name: String, rest: &[u8]) {
        if self.session.statements.contains_key(name.as_bytes()) {
            // PostgreSQL parses and analyses the text before it looks at the name
            // (long-run seed 5351): the server checks it under pgcarpool's own name,
            // its errors given back in the client's text.
            let prefix = format!("PREPARE {} ", quoted(CHECK_NAME.as_bytes()));
            let text = format!("{prefix}{}", String::from_utf8_lossy(rest));
            let x = self.server.exchange();
            let rounds = (self.server.round(), x.answered(), x.owed_next());
            let check = Bytes::from_static(CHECK_NAME.as_bytes());
            let names = (&check, name.as_bytes());
            self.renamed
                .note_text(rounds, names, sql, rest_at(sql, rest), &prefix);
            let m = format!("prepared statement \"{name}\" already exists");
            self.server.check_sql_prepare(&text, "42P05", m);
            return;
        }
        let mut key = SQL_PREPARE_KEY.to_vec();
        key.extend_from_slice(rest);
        let scope = self.statement_scope(&key);
        let Some(stmt) = self.intern(&scope, &key, None) else {
            return;
        };
        let name = Bytes::from(name.into_bytes());
        self.session.statements.insert(name.clone(), stmt.clone());
        if self.server.touch(stmt.id) {
            // Already prepared on this server under its shared name.
            self.answer(Answer::Query("PREPARE"));
            return;
        }
        let text = stmt.sql_prepare_text();
        let prefix = format!("PREPARE {} ", quoted(&stmt.server_name));
        self.note_rewrite(&stmt, &name, sql, rest_at(sql, rest), &prefix);
        // The client's name goes again if the server refuses the text.
        self.server
            .send_sql_prepare(query_message(&text), stmt, name);
    }

    /// A query of several statements with a `PREPARE` of a name the client has (outside a
    /// failed block): PostgreSQL runs the statements before it, checks its text, then
    /// fails with 42P05 (the statements after it never run). The server gets the query
    /// with that PREPARE under pgcarpool's name, deallocated at once, then the probe that
    /// fails in its place, then the rest of the client's text (a syntax error there still
    /// fails the whole query; its position is then off by what was put in). False,
    /// nothing sent: the query has no such PREPARE, or a statement before it may drop
    /// names.
    fn prepare_in_many(&mut self, sql: &[u8]) -> bool {
        let stmts = classify::split(sql);
        if stmts.len() < 2 || self.server.status_sent() == b'E' {
            return false;
        }
        let found =
            stmts.iter().enumerate().find_map(|(i, &(a, b))| {
                match classify::named_statement(&sql[a..b]) {
                    Some(classify::Named::Prepare { name, rest })
                        if self.session.statements.contains_key(name.as_bytes()) =>
                    {
                        Some((i, a, name, rest))
                    }
                    _ => None,
                }
            });
        let Some((before, a, name, rest)) = found else {
            return false;
        };
        // A statement before it that may drop the name (`DEALLOCATE p1; PREPARE p1 …`):
        // the query goes as written, as before.
        let drops = |&(x, y): &(usize, usize)| {
            let w = sql[x..y].trim_ascii_start();
            ["deallocate", "discard", "do", "call"].iter().any(|k| {
                w.len() > k.len()
                    && w[..k.len()].eq_ignore_ascii_case(k.as_bytes())
                    && !w[k.len()].is_ascii_alphanumeric()
            })
        };
        if stmts[..before].iter().any(drops) {
            return false;
        }
        let r = rest_at(sql, rest);
        let head = String::from_utf8_lossy(&sql[..a]);
        let prefix = format!("{head}PREPARE {} ", quoted(CHECK_NAME.as_bytes()));
        let text = format!(
            "{prefix}{}; DEALLOCATE {}; {}{}",
            String::from_utf8_lossy(rest),
            quoted(CHECK_NAME.as_bytes()),
            crate::server::response::QUERY_PROBE_SQL,
            String::from_utf8_lossy(&sql[r + rest.len()..]),
        );
        let x = self.server.exchange();
        let rounds = (self.server.round(), x.answered(), x.owed_next());
        let check = Bytes::from_static(CHECK_NAME.as_bytes());
        self.renamed
            .note_text(rounds, (&check, name.as_bytes()), sql, r, &prefix);
        if let Some(e) = classify::tx_effect(&sql[..a]) {
            self.server.sent_tx_effect(e);
        }
        for _ in 0..before {
            self.server.expect(Pending::Retag(false));
        }
        for _ in 0..2 {
            self.server
                .expect(Pending::SwallowTo(backend::COMMAND_COMPLETE));
        }
        let m = format!("prepared statement \"{name}\" already exists");
        self.server.expect(Pending::Fail(Box::new(("42P05", m))));
        self.server.send_query(query_message(&text), None);
        true
    }

    /// A client's `DISCARD ALL` query (alone, outside a transaction block), from a client
    /// whose startup packet gave settings: PostgreSQL's returns them to the startup values,
    /// a server's to its login values. It goes as Parse, Bind and Execute, followed in the
    /// same round by pgcarpool's statement setting the startup values again
    /// (`startup_after_discard`), then Sync: the server reports at the one ReadyForQuery
    /// the settings whose value changed, as PostgreSQL would. (A query cannot carry both:
    /// DISCARD ALL refuses to run in a multi-statement query or a DO block.) False, nothing
    /// sent: the startup packet gave no setting.
    fn discard_all_to_startup(&mut self, sql: &[u8]) -> bool {
        if startup_settings(self.session).is_empty() {
            return false;
        }
        let mut b = bytes::BytesMut::new();
        message(&mut b, frontend::PARSE, &[b"\0", sql, b"\0\0\0"]);
        message(&mut b, frontend::BIND, &[b"\0\0\0\0\0\0\0\0"]);
        message(&mut b, frontend::EXECUTE, &[b"\0\0\0\0\0"]);
        self.server.conn_mut().queue(b.freeze());
        self.server
            .expect(Pending::SwallowTo(backend::PARSE_COMPLETE));
        self.server
            .expect(Pending::SwallowTo(backend::BIND_COMPLETE));
        self.server.expect(Pending::Execute);
        self.startup_after_discard(false);
        self.server.sync_for_query();
        true
    }

    /// Right after the Execute of a client's `DISCARD ALL` or `RESET ALL` (in a round that
    /// goes on): the settings of the client's startup packet set again
    /// (`startup_statements`, each as pgcarpool's statement and portal `PGCARPOOL_startup`,
    /// closed again; every reply dropped but an error). If the DISCARD
    /// ALL fails, the server skips them with the rest of the round. `execute`: note the
    /// Execute (the client's round is extended protocol).
    pub(super) fn startup_after_discard(&mut self, execute: bool) {
        let sets = startup_statements(self.session);
        for sql in &sets {
            self.statement_within_round(sql);
        }
        if execute && !sets.is_empty() {
            self.server.note_sent(frontend::EXECUTE, false);
        }
    }

    /// Run pgcarpool's statement `sql` (a SET, a LISTEN) within the client's round: parsed, bound,
    /// executed and closed under its own name, every reply dropped but an error (skipped
    /// after an earlier one, as the client's messages around it).
    pub(super) fn statement_within_round(&mut self, sql: &str) {
        const NAME: &[u8] = b"PGCARPOOL_startup\0";
        let mut b = bytes::BytesMut::new();
        message(&mut b, frontend::PARSE, &[NAME, sql.as_bytes(), b"\0\0\0"]);
        message(&mut b, frontend::BIND, &[NAME, NAME, b"\0\0\0\0\0\0"]);
        message(&mut b, frontend::EXECUTE, &[NAME, b"\0\0\0\0"]);
        message(&mut b, frontend::CLOSE, &[b"P", NAME]);
        message(&mut b, frontend::CLOSE, &[b"S", NAME]);
        for end in [
            backend::PARSE_COMPLETE,
            backend::BIND_COMPLETE,
            backend::COMMAND_COMPLETE,
            backend::CLOSE_COMPLETE,
            backend::CLOSE_COMPLETE,
        ] {
            self.server.expect(Pending::SwallowTo(end));
        }
        self.server.conn_mut().queue(b.freeze());
    }

    /// Send a client's query as written (or with RESETs made SETs); `tx`: what its
    /// transaction-control statements do to the status (`classify::tx_effect`): messages
    /// sent after it are judged by the status it leaves.
    fn send_client_query(&mut self, msg: Bytes, tx: Option<[u8; 3]>) {
        if let Some(e) = tx {
            self.server.sent_tx_effect(e);
        }
        self.server.send_query(msg, None);
    }

    /// A query whose statements return to their defaults settings the client's startup
    /// packet gave, with those statements made SETs of the startup values (see
    /// `to_startup_value`) and what their CommandCompletes say noted; None when it has
    /// none.
    fn startup_values_query(&mut self, sql: &[u8]) -> Option<String> {
        if self.session.startup.is_empty() {
            return None;
        }
        let stmts = classify::split(sql);
        // Each statement as sent, whether it was a RESET, and how many statements
        // pgcarpool added after it.
        let made: Vec<Option<(String, bool, usize)>> = stmts
            .iter()
            .map(|&(a, b)| {
                let one = &sql[a..b];
                reset_all_to_startup(self.session, one)
                    .map(|(text, added)| (text, false, added))
                    .or_else(|| to_startup_value(self.session, one).map(|(t, r)| (t, r, 0)))
            })
            .collect();
        if made.iter().all(Option::is_none) {
            return None;
        }
        let mut out = String::new();
        for (&(a, b), m) in stmts.iter().zip(&made) {
            if !out.is_empty() {
                out.push(';');
            }
            match m {
                Some((set, _, _)) => out.push_str(set),
                None => out.push_str(&String::from_utf8_lossy(&sql[a..b])),
            }
            let reset = m.as_ref().is_some_and(|m| m.1);
            self.server.expect(Pending::Retag(reset));
            for _ in 0..m.as_ref().map_or(0, |m| m.2) {
                // The statements setting the startup values after the client's RESET ALL.
                self.server
                    .expect(Pending::SwallowTo(backend::COMMAND_COMPLETE));
            }
        }
        Some(out)
    }

    /// The client named a statement it has not prepared (in EXECUTE, DEALLOCATE, Bind or
    /// Describe). A pinned client may hold server-side names of its own (SQL PREPARE sent
    /// inside a Parse or a multi-statement query): the server decides. Otherwise pgcarpool
    /// answers as PostgreSQL would, without the name ever reaching a shared server.
    /// True when it was refused.
    fn unknown_statement(&mut self, name: &str, msg: Bytes, query: bool) -> bool {
        let internal = classify::is_internal_name(name.as_bytes());
        if self.session.pin.is_some() && !internal {
            if query {
                self.server.send_query(msg, None);
            } else {
                self.server.conn_mut().queue(msg);
            }
            return false;
        }
        self.server.probe(
            "26000",
            format!("prepared statement \"{name}\" does not exist"),
            query,
        );
        true
    }

    /// The scope a statement the client parses now is parsed in
    /// (`VirtualSession::statement_scope`). Its session's settings are known as of the
    /// last transaction: when the client's statements since may have changed one that
    /// matters (a SET search_path in the same pipeline or block), the statement is its own
    /// and parsed on the server as PostgreSQL would parse it.
    fn statement_scope(&self, rest: &[u8]) -> Vec<u8> {
        if self.scope_changed() {
            let mut scope = super::prepared::unshared_scope();
            if !self.search_path_changed() {
                // Its search_path is known all the same (`VirtualSession::scoped_search_path`).
                scope.extend(self.session.statement_scope(rest));
            }
            scope
        } else {
            self.session.statement_scope(rest)
        }
    }

    /// May the client's statements in this transaction have changed a setting of its scope
    /// (`VirtualSession::scope_depends_on`), so that the session's settings, known as of the
    /// last transaction, are not the server's?
    fn scope_changed(&self) -> bool {
        let e = &self.effects;
        e.gucs_unknown
            || e.reset_all
            || e.discard_all
            || e.gucs.iter().any(|g| VirtualSession::scope_depends_on(g))
            || (e.local_gucs.iter()).any(|g| g == "*" || VirtualSession::scope_depends_on(g))
    }

    /// As `scope_changed`, for the search_path alone.
    fn search_path_changed(&self) -> bool {
        let e = &self.effects;
        let path = |g: &String| g == "*" || g.eq_ignore_ascii_case("search_path");
        e.gucs_unknown
            || e.reset_all
            || e.discard_all
            || e.gucs.iter().any(path)
            || e.local_gucs.iter().any(path)
    }

    /// The shared statement for a new client name, within the client's and the registry's
    /// limits; None (and the relay ends the client with `limit`'s error) beyond them.
    fn intern(
        &mut self,
        scope: &[u8],
        rest: &[u8],
        depends: Option<Arc<Stmt>>,
    ) -> Option<Arc<Stmt>> {
        let interned = self.session.intern(
            self.registry,
            self.max_client_statements,
            (scope, rest),
            depends,
        );
        interned.map_err(|why| self.limit = Some(why)).ok()
    }

    /// Note what the client's statements do to the shared statement registry and the pools.
    fn note_effects(&mut self, e: &Effects) {
        if let (Some(db), Some(pools)) = (&e.database_alone, self.pools) {
            // PostgreSQL waits up to 5 s for the database's other sessions to go: the
            // pools' idle servers to it go now (servers in use stay, as sessions would).
            for pool in pools.all() {
                if pool.settings().target.dbname == *db {
                    pool.close_idle("database dropped or renamed by a client");
                }
            }
        }
        if e.ddl {
            // Statements parsed before may now describe other columns or types: later
            // Parses of the same text are parsed anew.
            self.registry.schema_changed();
        }
    }

    /// Make the client's statement `client` usable by its `EXECUTE` query on this server:
    /// prepared again there if it lacks it, in a round of its own whose error is the
    /// client's (long-run seed 4004: PostgreSQL analyses the statement again at the
    /// EXECUTE, under the current search_path, and fails the same way), in the client's
    /// own text (a SQL PREPARE's text is taken as `PREPARE name …`: its position is off
    /// when the client wrote more before the text after the name).
    fn ensure_for_query(&mut self, stmt: &Arc<Stmt>, client: &[u8]) {
        if self.server.touch(stmt.id) {
            return;
        }
        self.counts.server_parses += 1;
        if stmt.is_sql_prepared() {
            // (`PREPARE p(int) AS …`, `PREPARE p AS …`: spaced as most write it.)
            let types = stmt.parse_rest.get(SQL_PREPARE_KEY.len()) == Some(&b'(');
            let space = if types { "" } else { " " };
            let text = format!("PREPARE {}{space}", identifier(client));
            let prefix = format!("PREPARE {} ", quoted(&stmt.server_name));
            self.note_rewrite(stmt, client, text.as_bytes(), text.len(), &prefix);
        } else {
            self.note_rename(stmt, client);
        }
        self.server.prepare_apart(stmt, true, None);
    }

    /// The message about to be sent names the client's statement `client` by its server
    /// name: the server's errors about it name `client` again.
    fn note_rename(&mut self, stmt: &Stmt, client: &[u8]) {
        let x = self.server.exchange();
        let rounds = (self.server.round(), x.answered(), x.owed_next());
        self.renamed.note(rounds, &stmt.server_name, client);
    }

    /// As `note_rename`, for the client's SQL `text` about to be sent as `prefix` followed
    /// by `text[rest_at..]`: error positions are given back in the client's text.
    fn note_rewrite(
        &mut self,
        stmt: &Stmt,
        client: &[u8],
        text: &[u8],
        rest_at: usize,
        prefix: &str,
    ) {
        let x = self.server.exchange();
        let rounds = (self.server.round(), x.answered(), x.owed_next());
        let names = (&stmt.server_name, client);
        self.renamed.note_text(rounds, names, text, rest_at, prefix);
    }

    /// A client's `EXECUTE name rest` (`sql`) as sent to the server: `EXECUTE` and the
    /// statement's server name, then the client's text after its name as written (spaces
    /// included), so that an error position shifts by the names' difference alone. That is
    /// the shift of its PREPARE text too (`PREPARE name AS …`), where PostgreSQL places an
    /// error of the statement analysed again at this EXECUTE (long-run seed 14000: a
    /// search_path change on a server holding it; off by one with a space added).
    fn execute_text(&mut self, stmt: &Stmt, name: &[u8], sql: &[u8], rest: &[u8]) -> String {
        let at = rest_at(sql, rest).min(sql.len());
        let spaces = sql[..at]
            .iter()
            .rev()
            .take_while(|c| c.is_ascii_whitespace());
        let name_end = at - spaces.count();
        let prefix = format!("EXECUTE {}", quoted(&stmt.server_name));
        self.note_rewrite(stmt, name, sql, name_end, &prefix);
        format!("{prefix}{}", String::from_utf8_lossy(&sql[name_end..]))
    }

    fn answer(&mut self, a: Answer) {
        self.server.expect(Pending::Answer(a));
    }

    /// The client executes `portal`: when it runs `DEALLOCATE ALL`, the client's statements
    /// go now (the server's with it, unless a failed block refuses it), as PostgreSQL's
    /// would at this Execute.
    pub(super) fn executing(&mut self, portal: &[u8]) {
        if !self
            .session
            .ext
            .deallocating_portals
            .iter()
            .any(|p| p == portal)
            || self.server.status_sent() == b'E'
        {
            return;
        }
        let round = self.server.round();
        let after = self.server.exchange().owed_next();
        let dropped = std::mem::take(&mut self.session.statements);
        // Kept aside until the server says it ran (`dealloc_ran`): a failed or skipped
        // Execute leaves them.
        self.session_deallocs.push((round, after, dropped));
        self.server.deallocating();
    }

    /// The server ran a DEALLOCATE ALL (or DISCARD ALL) of the round it is answering.
    pub(super) fn dealloc_ran(&mut self) {
        let answered = self.server.exchange().answered();
        if let Some(i) = self.session_deallocs.iter().position(|d| d.0 == answered) {
            self.session_deallocs.remove(i);
        }
    }

    /// Rounds before the server's `answered` are over: the client's statements that a
    /// DEALLOCATE ALL of theirs was to drop, and did not, are the client's again (but for
    /// names made since).
    pub(super) fn deallocs_over(&mut self) {
        let answered = self.server.exchange().answered();
        while self
            .session_deallocs
            .first()
            .is_some_and(|d| d.0 < answered)
        {
            let (_, _, kept) = self.session_deallocs.remove(0);
            for (name, stmt) in kept {
                self.session.statements.entry(name).or_insert(stmt);
            }
        }
    }

    /// A Bind (`body`) of a client's statement this server does not hold (empty name: the
    /// unnamed one): PostgreSQL checks the Bind's parameter counts first, where the
    /// statement must be prepared here first, which may fail (25P02 inside a failed
    /// transaction block; 42P01 when the client's search_path changed since it was
    /// parsed: long-run seeds 3056, 3062, 3220). Its 08P01 message when they are wrong.
    fn bind_count_error(&mut self, body: &[u8]) -> Option<String> {
        let mut r = Reader::new(body, "Bind");
        let (_portal, name) = (r.cstr_bytes().ok()?, r.cstr_bytes().ok()?);
        let rest = if name.is_empty() {
            let id = self.session.ext.unnamed_id;
            if id == 0 || self.server.exchange().unnamed() == id {
                return None;
            }
            if self
                .session
                .shared_unnamed()
                .is_some_and(|s| self.server.holds(s.id))
            {
                // plan_once: the server checks them (its error given the client's name).
                return None;
            }
            self.session.ext.unnamed.clone()?
        } else {
            let stmt = self.session.statements.get(name)?;
            if self.server.holds(stmt.id) || stmt.is_sql_prepared() {
                return None;
            }
            stmt.parse_rest.clone()
        };
        let formats = usize::try_from(r.i16().ok()?).ok()?;
        r.bytes(formats * 2).ok()?;
        let params = usize::try_from(r.i16().ok()?).ok()?;
        let mut p = Reader::new(&rest, "Parse");
        let sql = p.cstr_bytes().ok()?;
        let types = usize::try_from(p.i16().ok()?).ok()?;
        let wanted = classify::parameter_count(sql, types)?;
        let name = String::from_utf8_lossy(name);
        if formats > 1 && formats != params {
            Some(format!(
                "bind message has {formats} parameter formats but {params} parameters"
            ))
        } else if params != wanted {
            Some(format!(
                "bind message supplies {params} parameters, but prepared statement \"{name}\" requires {wanted}"
            ))
        } else {
            None
        }
    }

    /// A Describe of client statement `name` (empty: the unnamed one) that this server does
    /// not hold: PostgreSQL describes a statement without a result from what its Parse
    /// found (ParameterDescription, NoData), without analysing it again, also inside a
    /// failed transaction block, where it could not be parsed here (25P02; one with a
    /// result is refused there, as the Parse is), and after a search_path change under
    /// which its text no longer parses (long-run seed 13520). The ParameterDescription's
    /// body, when a server described it so (`Stmt::no_rows_params`,
    /// `VirtualSession::unnamed_described`). The unnamed statement only in a failed block.
    fn described_from_parse(&self, name: &[u8]) -> Option<Bytes> {
        if self.server.status_sent() != b'E' && name.is_empty() {
            return None;
        }
        if let Some(stmt) = self.session.shared_unnamed().filter(|_| name.is_empty()) {
            if self.server.holds(stmt.id) {
                return None;
            }
            return stmt.no_rows_params().cloned();
        }
        if name.is_empty() {
            let id = self.session.ext.unnamed_id;
            return match &self.session.ext.unnamed_described {
                Some((d, params))
                    if *d == id && id != 0 && self.server.exchange().unnamed() != id =>
                {
                    Some(params.clone())
                }
                _ => None,
            };
        }
        let stmt = self.session.statements.get(name)?;
        if self.server.holds(stmt.id) || stmt.is_sql_prepared() {
            return None;
        }
        stmt.no_rows_params().cloned()
    }

    /// A whole Parse, Bind, Describe or Close from the client.
    pub(super) fn on_extended(&mut self, tag: u8, msg: Bytes) -> Result<(), ProtoError> {
        match tag {
            frontend::PARSE => self.on_parse(msg),
            frontend::BIND => self.on_bind(msg),
            frontend::DESCRIBE => self.on_describe(msg),
            frontend::CLOSE => self.on_close(msg),
            _ => unreachable!("only extended-protocol messages come here"),
        }
    }

    /// A whole Parse from the client that needs more than passing through.
    fn on_parse(&mut self, msg: Bytes) -> Result<(), ProtoError> {
        let body = &msg[5..];
        let name = Reader::new(body, "Parse").cstr_bytes()?;
        if name.is_empty() {
            return self.parse_unnamed(msg);
        }
        if self.server.status_sent() == b'E' && !classify::ends_transaction(&body[name.len() + 1..])
        {
            self.refused_parse(&body[name.len() + 1..])?;
            return Ok(());
        }
        if self.session.statements.contains_key(name) {
            // PgBouncer's words in the log (it closes the connection there); the
            // client gets PostgreSQL's error and its session goes on, as directly.
            tracing::info!(
                "prepared statement '{}' was already prepared",
                String::from_utf8_lossy(name)
            );
            let m = format!(
                "prepared statement \"{}\" already exists",
                String::from_utf8_lossy(name)
            );
            // PostgreSQL parses and analyses the text before it looks at the name:
            // the server reports an error in the text first, else the probe fails.
            // Here inside a failed block only for ROLLBACK or COMMIT, which
            // PostgreSQL parses there: 42P05, not 25P02.
            self.refused_parse(&body[name.len() + 1..])?;
            self.server.probe_before_block("42P05", m);
            return Ok(());
        }
        let (rest, depends) = self.map_execute(msg.slice(5 + name.len() + 1..))?;
        let rest = startup_value_rest(self.session, rest)?;
        let scope = self.statement_scope(&rest);
        let Some(mut stmt) = self.intern(&scope, &rest, depends.clone()) else {
            return Ok(());
        };
        let mut own_text = None;
        if stmt.effects.as_ref().is_some_and(|e| e.introspects)
            && let Some(own) = self.own_view_rest(name, &rest)?
        {
            // A statement of the client's own: its text asks about its session.
            let Some(own) = self.intern(&scope, &own, depends) else {
                return Ok(());
            };
            // Read views are read again at each Bind (`refresh_own_text`), and the
            // clients a computed pid may name are those of then.
            let sql = rest.split(|&c| c == 0).next().unwrap_or_default();
            if selfview::reads_views(sql).contains(&true) || selfview::computes_signals(sql) {
                own_text = Some((own.id, rest.clone()));
            }
            stmt = own;
        }
        if let Some(e) = &stmt.effects {
            self.note_effects(e);
            self.effects.merge((**e).clone());
        }
        self.counts.client_parses += 1;
        let name = Bytes::copy_from_slice(name);
        self.session.statements.insert(name.clone(), stmt.clone());
        if own_text.is_some() || !self.session.ext.own_texts.is_empty() {
            self.note_own_text(&name, own_text);
        }
        self.session
            .parsed_name(name.clone(), self.registry.changes_seen());
        if self.server.touch(stmt.id) {
            self.server.expect(Pending::Answered(name, stmt));
        } else {
            self.prepare_on_server(stmt, false);
            self.server.name_last_parse(name);
        }
        Ok(())
    }

    /// The client's statement `name` now stands for the statement `own` (its id, and the
    /// client's text) rewritten for its session, or (None) for its text as it came: kept
    /// in `own_texts`, whose entries of names the client no longer holds so go.
    fn note_own_text(&mut self, name: &Bytes, own: Option<(u64, Bytes)>) {
        let statements = &self.session.statements;
        let mut kept = std::mem::take(&mut self.session.ext.own_texts);
        kept.retain(|(n, id, _)| n != name && statements.get(n).is_some_and(|s| s.id == *id));
        if let Some((id, text)) = own {
            kept.push((name.clone(), id, text));
        }
        self.session.ext.own_texts = kept;
    }

    /// Before a Bind of the client's statement `name`: when its text was rewritten for
    /// the client's session (`own_texts`), it is rewritten again now, as PostgreSQL reads
    /// the session's views when the statement runs (the statements it holds now, the
    /// servers running clients' work now); a different text makes it a statement of its
    /// own, prepared on the server by the Bind's `lookup`. Beyond a limit
    /// (client_max_statements, the registry's), the one it has stays.
    fn refresh_own_text(&mut self, name: &[u8]) -> Result<(), ProtoError> {
        let Some(stmt) = self.session.statements.get(name).cloned() else {
            return Ok(());
        };
        let Some(i) = (self.session.ext.own_texts.iter())
            .position(|(n, id, _)| n[..] == *name && *id == stmt.id)
        else {
            return Ok(());
        };
        let rest = self.session.ext.own_texts[i].2.clone();
        let Some(own) = self.own_view_rest(name, &rest)? else {
            return Ok(());
        };
        if own == stmt.parse_rest {
            return Ok(());
        }
        let scope = self.statement_scope(&rest);
        let fresh = self.session.intern(
            self.registry,
            usize::MAX,
            (&scope, &own),
            stmt.depends.clone(),
        );
        if let Ok(fresh) = fresh {
            self.session.ext.own_texts[i].1 = fresh.id;
            let key = self.session.ext.own_texts[i].0.clone();
            self.session.statements.insert(key, fresh);
        }
        Ok(())
    }

    /// A whole Bind from the client that needs more than passing through.
    fn on_bind(&mut self, msg: Bytes) -> Result<(), ProtoError> {
        let body = &msg[5..];
        let mut r = Reader::new(body, "Bind");
        let portal = r.cstr_bytes()?;
        let name = r.cstr_bytes()?;
        if let Some(m) = self.bind_count_error(body) {
            self.server.probe("08P01", m, false);
            return Ok(());
        }
        let shared = if name.is_empty() {
            self.shared_unnamed()
        } else {
            None
        };
        if name.is_empty() && shared.is_none() {
            if !self.unnamed_here() {
                self.server.probe("26000", NO_UNNAMED.into(), false);
                return Ok(());
            }
            let msg = self.bind_unnamed(portal, &msg)?;
            self.server.conn_mut().queue(msg);
        } else {
            if shared.is_none() && !self.session.ext.own_texts.is_empty() {
                self.refresh_own_text(name)?;
            }
            match shared.or_else(|| self.lookup(name)) {
                None => {
                    let name = String::from_utf8_lossy(name).into_owned();
                    if !self.unknown_statement(&name, msg.clone(), false) {
                        self.server.expect(Pending::Bind);
                    }
                    return Ok(());
                }
                Some(stmt) => {
                    self.counts.binds += 1;
                    let own = if stmt.effects.as_ref().is_some_and(|e| e.introspects) {
                        Some(self.own_bind(&msg, &stmt.parse_rest)?)
                    } else {
                        None
                    };
                    let msg = own.as_ref().unwrap_or(&msg);
                    // Written only when it changes: the usual Bind of a named statement
                    // makes no extended-protocol state (`session::Extended`).
                    let retag = stmt.parse_rest.starts_with(RESET_MARK);
                    if portal.is_empty() && self.session.ext.retag_portal != retag {
                        self.session.ext.retag_portal = retag;
                    }
                    // What running it does to the session, every time it runs.
                    let deallocates = stmt.effects.as_ref().is_some_and(|e| e.deallocate_all);
                    let tx = stmt.tx_effect();
                    self.session.bound(portal, tx, deallocates);
                    let listen = stmt.effects.is_some() && listens(&stmt.parse_rest);
                    self.session
                        .bound_listen(portal, listen.then_some(&stmt.parse_rest));
                    if stmt.effects.as_ref().is_some_and(|e| {
                        e.discard_all || (e.reset_all && !startup_settings(self.session).is_empty())
                    }) {
                        self.session.ext.discard_portal = Some(Bytes::copy_from_slice(portal));
                    }
                    if let Some(e) = &stmt.effects {
                        self.effects.merge((**e).clone());
                    }
                    let rest = msg.slice(5 + portal.len() + 1 + name.len() + 1..);
                    self.note_rename(&stmt, name);
                    let sname = stmt.server_name.clone();
                    let len = 4 + portal.len() + 1 + sname.len() + 1 + rest.len();
                    let len = i32::try_from(len).map_err(|_| ProtoError::TooLong(len))?;
                    self.server.conn_mut().queue_with(|b| {
                        b.put_u8(frontend::BIND);
                        b.put_i32(len);
                        b.put_slice(portal);
                        b.put_u8(0);
                        b.put_slice(&sname);
                        b.put_u8(0);
                    });
                    self.server.conn_mut().queue(rest);
                    if self.start_replay(name, &stmt, msg) {
                        self.server.expect(Pending::BindShared);
                        return Ok(());
                    }
                }
            }
        }
        self.server.expect(Pending::Bind);
        Ok(())
    }

    /// A Bind (`msg`) of the client's own unnamed statement, held on this server: what
    /// running it does is noted in the session; it goes as it came, or with a pid it
    /// signals made the server's own (`own_bind`).
    fn bind_unnamed(&mut self, portal: &[u8], msg: &Bytes) -> Result<Bytes, ProtoError> {
        let s = &mut *self.session;
        let deallocates = s.ext.unnamed_id != 0 && s.ext.unnamed_deallocates == s.ext.unnamed_id;
        bound_unnamed(s, portal, deallocates, &mut self.effects);
        let listen = s.ext.unnamed.clone().filter(|u| listens(u));
        s.bound_listen(portal, listen.as_ref());
        if s.ext
            .unnamed
            .as_deref()
            .is_some_and(|u| startup_follows(s, u))
        {
            s.ext.discard_portal = Some(Bytes::copy_from_slice(portal));
        }
        if s.ext.unnamed_signals == s.ext.unnamed_id {
            let sql = s.ext.unnamed.clone().unwrap_or_default();
            self.own_bind(msg, &sql)
        } else {
            Ok(msg.clone())
        }
    }

    /// A Bind (`msg`) of a statement whose text (`parse_rest`: text, NUL, types) signals
    /// pids given by parameters (`selfview::signal_params`), as PostgreSQL would signal
    /// them: the client's own pid is made its server's (which signals itself); another
    /// client's pid this client may signal (`signal_client`) is signalled here and made
    /// the client's own, which the statement answers `true`. Other values go as they are.
    fn own_bind(&mut self, msg: &Bytes, parse_rest: &[u8]) -> Result<Bytes, ProtoError> {
        let sql = parse_rest.split(|&c| c == 0).next().unwrap_or_default();
        let vpid = self.session.backend_pid;
        let signals = selfview::signal_params(sql, vpid);
        if signals.is_empty() {
            return Ok(msg.clone());
        }
        let body = &msg[5..];
        let mut r = Reader::new(body, "Bind");
        r.cstr_bytes()?;
        r.cstr_bytes()?;
        let nformats = usize::try_from(r.i16()?).map_err(|_| ProtoError::Malformed("Bind"))?;
        let formats: Vec<i16> = (0..nformats).map(|_| r.i16()).collect::<Result<_, _>>()?;
        let nparams = usize::try_from(r.i16()?).map_err(|_| ProtoError::Malformed("Bind"))?;
        let head = body.len() - r.remaining().len();
        let mut values: Vec<Option<&[u8]>> = Vec::with_capacity(nparams);
        for _ in 0..nparams {
            let len = r.i32()?;
            values.push(match usize::try_from(len) {
                Ok(n) => Some(r.bytes(n)?),
                Err(_) => None,
            });
        }
        let tail = r.remaining();
        let mut changed: Vec<Option<Vec<u8>>> = vec![None; nparams];
        for (i, kind) in signals {
            let Some(Some(v)) = values.get(i) else {
                continue;
            };
            let binary = match formats.len() {
                0 => false,
                1 => formats[0] == 1,
                _ => formats.get(i) == Some(&1),
            };
            let Some(pid) = param_int(v, binary) else {
                continue;
            };
            let to = if pid == i64::from(vpid) {
                self.server.key().0
            } else if self
                .clients
                .is_some_and(|c| i32::try_from(pid).is_ok_and(|pid| signal_client(c, kind, pid)))
            {
                vpid
            } else {
                continue;
            };
            changed[i] = param_bytes(to, v.len(), binary);
        }
        let mut b = bytes::BytesMut::with_capacity(msg.len() + 16);
        b.put_u8(frontend::BIND);
        b.put_i32(0);
        b.put_slice(&body[..head]);
        for (v, c) in values.iter().zip(&changed) {
            match (c, v) {
                (Some(c), _) => {
                    b.put_i32(c.len() as i32);
                    b.put_slice(c);
                }
                (None, Some(v)) => {
                    b.put_i32(v.len() as i32);
                    b.put_slice(v);
                }
                (None, None) => b.put_i32(-1),
            }
        }
        b.put_slice(tail);
        let len = i32::try_from(b.len() - 1).map_err(|_| ProtoError::TooLong(b.len()))?;
        b[1..5].copy_from_slice(&len.to_be_bytes());
        Ok(b.freeze())
    }

    /// A whole Describe from the client that needs more than passing through.
    fn on_describe(&mut self, msg: Bytes) -> Result<(), ProtoError> {
        let body = &msg[5..];
        let mut r = Reader::new(body, "Describe");
        let kind = r.u8()?;
        let name = r.cstr_bytes()?;
        if kind == b'S'
            && let Some(params) = self.described_from_parse(name)
        {
            self.session.take_unbound(name);
            self.answer(Answer::Described(params));
            return Ok(());
        }
        let mut shared = None;
        if kind == b'S' && name.is_empty() {
            if self.server.status_sent() == b'E' {
                // (PostgreSQL refuses a statement with a result there before it looks at
                // its plan, and describes one without from its parameters.)
                shared = self.shared_unnamed();
            } else {
                // plan_once: the client is told the statement's columns, which a server's
                // copy prepared before a schema change pgcarpool did not see would give
                // stale (0A000 where a fresh Parse describes the new ones): described, and
                // run, as its own unnamed statement, parsed anew on the server. Its next
                // Parses too (`Relay::parse_planned_once`).
                let ext = &mut *self.session.ext;
                if let Some(s) = &mut ext.unnamed_shared {
                    s.described |= s.id == ext.unnamed_id;
                    s.id = 0;
                }
            }
        }
        if kind == b'S' && name.is_empty() && shared.is_none() && !self.unnamed_here() {
            self.server.probe("26000", NO_UNNAMED.into(), false);
            return Ok(());
        }
        if kind == b'S' {
            self.session.take_unbound(name);
        }
        let stmt = shared.or_else(|| self.lookup(if kind == b'S' { name } else { b"" }));
        match (kind, stmt) {
            (b'S', Some(stmt)) => {
                self.note_rename(&stmt, name);
                let sname = stmt.server_name.clone();
                self.server.conn_mut().queue_with(|b| {
                    b.put_u8(frontend::DESCRIBE);
                    b.put_i32((4 + 1 + sname.len() + 1) as i32);
                    b.put_u8(b'S');
                    b.put_slice(&sname);
                    b.put_u8(0);
                });
            }
            (b'S', None) if !name.is_empty() => {
                let name = String::from_utf8_lossy(name).into_owned();
                if !self.unknown_statement(&name, msg.clone(), false) {
                    self.server.expect(Pending::Describe);
                }
                return Ok(());
            }
            _ => self.server.conn_mut().queue(msg),
        }
        self.server.expect(Pending::Describe);
        Ok(())
    }

    /// A whole Close from the client that needs more than passing through.
    fn on_close(&mut self, msg: Bytes) -> Result<(), ProtoError> {
        let body = &msg[5..];
        let mut r = Reader::new(body, "Close");
        let kind = r.u8()?;
        let name = r.cstr_bytes()?;
        if kind == b'S' {
            // Only the client's name goes: the server keeps the statement for
            // others. Closing a name that does not exist is no error. Skipped (an
            // error earlier in the pipeline), it comes back.
            let undo = if name.is_empty() {
                let was = self.session.unnamed_before();
                self.session.drop_unnamed();
                was.map(|was| Undo::Unnamed {
                    was: Some(was),
                    now: 0,
                })
            } else {
                let stmt = self.session.statements.remove(name);
                stmt.map(|s| Undo::Closed(Bytes::copy_from_slice(name), s))
            };
            match undo {
                Some(u) => self.server.expect(Pending::Closed(u)),
                None => self.answer(Answer::CloseComplete),
            }
        } else {
            self.server.conn_mut().queue(msg);
            self.server.expect(Pending::Close {
                swallow: false,
                evicted: None,
            });
        }
        Ok(())
    }

    /// A Parse of the unnamed statement whose text needs a look: SQL PREPARE, EXECUTE or
    /// DEALLOCATE inside a Parse. EXECUTE and DEALLOCATE of the client's own statements
    /// are mapped to their server names; PREPARE, and names pgcarpool does not know, go to
    /// the server as written and the client is checked for a pin afterwards. A text that
    /// may return no rows is described too (`Server::learn`): a Describe of it in a failed
    /// block on another server is answered from that (`described_from_parse`).
    fn parse_unnamed(&mut self, msg: Bytes) -> Result<(), ProtoError> {
        if self.parse_planned_once(&msg)? {
            return Ok(());
        }
        let body = &msg[5..];
        let mut r = Reader::new(&body[1..], "Parse");
        let sql = r.cstr_bytes()?;
        let types_at = 5 + 1 + sql.len() + 1;
        let mut out = msg.clone();
        let (mut deallocates, mut signals) = (false, false);
        if let Some((set, reset)) = to_startup_value(self.session, sql) {
            self.effects.merge(classify::classify(sql));
            let set = if reset {
                format!("{}{set}", String::from_utf8_lossy(RESET_MARK))
            } else {
                set
            };
            out = parse_message(set.as_bytes(), &msg[types_at..]);
        } else if classify::may_matter(sql) {
            let mut e = classify::classify(sql);
            self.note_effects(&e);
            let named = classify::named_statement(sql);
            let mapped = match &named {
                Some(classify::Named::Execute { name, rest }) => self
                    .session
                    .statements
                    .get(name.as_bytes())
                    .cloned()
                    .map(|stmt| {
                        self.ensure_for_parse(&stmt);
                        self.execute_text(&stmt, name.as_bytes(), sql, rest)
                    }),
                _ => None,
            };
            let mapped = mapped.or_else(|| {
                let name = e.deallocate.as_ref()?;
                let stmt = self.session.statements.remove(name.as_bytes())?;
                // The client's name goes now (its DEALLOCATE normally runs next); the
                // server drops the shared statement.
                self.ensure_for_parse(&stmt);
                self.server.forget(stmt.id);
                self.note_rename(&stmt, name.as_bytes());
                Some(format!("DEALLOCATE {}", quoted(&stmt.server_name)))
            });
            match mapped {
                Some(sql) => {
                    out = parse_message(sql.as_bytes(), &msg[types_at..]);
                }
                None if e.reserved_name => {
                    self.effects.merge(e);
                    let m = format!(
                        "prepared statement names beginning with \"{}\" are reserved by pgcarpool",
                        classify::INTERNAL_PREFIX
                    );
                    self.server.probe("42939", m, false);
                    return Ok(());
                }
                None => {
                    if let Some(classify::Named::Prepare { name, .. }) = &named
                        && self.session.statements.contains_key(name.as_bytes())
                    {
                        let m = format!("prepared statement \"{name}\" already exists");
                        self.server.probe("42P05", m, false);
                        return Ok(());
                    }
                    // A server-side name of the client's own may come or go.
                    e.pin_check |= named.is_some() || e.deallocate.is_some();
                    if e.introspects
                        && named.is_none()
                        && let Some(own) = self.own_session(sql, false, None)
                    {
                        signals =
                            !selfview::signal_params(&own, self.session.backend_pid).is_empty();
                        out = parse_message(&own, &msg[types_at..]);
                    }
                }
            }
            deallocates = e.deallocate_all;
            self.effects.merge(e);
        }
        let was = self.session.unnamed_before();
        let now = self.session.parsed_unnamed(&out[6..]);
        self.server.set_unnamed(now);
        if signals {
            // Its Binds are looked at (`Relay::own_bind`).
            self.session.ext.unnamed_signals = now;
        }
        if deallocates {
            // The client's statements go when it is executed (`Relay::executing`).
            self.session.ext.unnamed_deallocates = self.session.ext.unnamed_id;
        }
        let learn = learns_unnamed(&out[6..]);
        self.server.conn_mut().queue(out);
        self.server
            .expect(Pending::UnnamedParse(Undo::Unnamed { was, now }));
        if learn {
            self.server.learn(b"", Learning::Unnamed(now));
        }
        Ok(())
    }

    /// The body after the name (`rest`: text, NUL, types) of a Parse of statement `name`,
    /// with the text rewritten for the client's session (`selfview::rewrite`); None:
    /// nothing to rewrite.
    fn own_view_rest(&mut self, name: &[u8], rest: &[u8]) -> Result<Option<Bytes>, ProtoError> {
        let sql = Reader::new(rest, "Parse").cstr_bytes()?;
        let Some(own) = self.own_session(sql, false, Some(name)) else {
            return Ok(None);
        };
        let mut b = bytes::BytesMut::with_capacity(own.len() + rest.len() - sql.len());
        b.put_slice(&own);
        b.put_slice(&rest[sql.len()..]);
        Ok(Some(b.freeze()))
    }

    /// A client's SQL text (`query`: a simple Query's, else a Parse's) that asks about its
    /// own session, rewritten so that the server answers for the client's virtual session
    /// (`selfview::rewrite`). Where it reads `pg_prepared_statements`, the client's
    /// statements are first made sure of on this server (so that the server says what their
    /// parameter and result types are) and listed under the client's names. None: nothing
    /// to rewrite. `parsing`: the name of the statement this text is parsed as, which
    /// PostgreSQL lists too when it runs (as of its Parse: pgcarpool lists the statements
    /// the client had then, and this one without what the server would say of it).
    fn own_session(&mut self, sql: &[u8], query: bool, parsing: Option<&[u8]>) -> Option<Vec<u8>> {
        let reads = selfview::reads_views(sql);
        let view = reads[0].then(|| {
            let mut stmts: Vec<(Bytes, Arc<Stmt>)> = (self.session.statements.iter())
                .filter(|(n, _)| parsing != Some(&n[..]))
                .map(|(n, s)| (n.clone(), s.clone()))
                .collect();
            stmts.sort_by_key(|(_, s)| s.id);
            self.ensure_for_view(&stmts, query);
            let own_texts = &self.session.ext.own_texts;
            let mut texts: Vec<Vec<u8>> = (stmts.iter())
                .map(|(name, s)| {
                    // The client's own text of one rewritten for its session.
                    let rest = (own_texts.iter())
                        .find(|(n, id, _)| n == name && *id == s.id)
                        .map_or(&s.parse_rest, |(_, _, text)| text);
                    (name, rest)
                })
                .map(|(name, rest)| match rest.strip_prefix(SQL_PREPARE_KEY) {
                    // (As most write it: `PREPARE p(int) AS …`, `PREPARE p AS …`.)
                    Some(rest) if rest.starts_with(b"(") => [b"PREPARE ", &name[..], rest].concat(),
                    Some(rest) => [b"PREPARE ", &name[..], b" ", rest].concat(),
                    None => rest.split(|&c| c == 0).next().unwrap_or_default().to_vec(),
                })
                .collect();
            texts.push(sql.to_vec());
            let mut rows: Vec<selfview::Prepared> = (stmts.iter().zip(&texts))
                .map(|((name, s), text)| selfview::Prepared {
                    name,
                    statement: text,
                    server_name: &s.server_name,
                    from_sql: s.is_sql_prepared(),
                })
                .collect();
            if let Some(name) = parsing {
                rows.push(selfview::Prepared {
                    name,
                    statement: &texts[texts.len() - 1],
                    server_name: b"",
                    from_sql: false,
                });
            }
            selfview::view_query(&rows)
        });
        let clients = self.clients;
        // The servers running clients' work, each under its client's pid (the rows of the
        // per-backend views), when the text reads one of them.
        let pid_views: Vec<Option<String>> = (1..selfview::VIEWS.len())
            .map(|k| {
                reads[k].then(|| {
                    let vpid = self.session.backend_pid;
                    let servers = clients
                        .map_or_else(Vec::new, |(c, _)| c.server_pids(self.server.addr(), vpid));
                    selfview::pid_view_query(selfview::VIEWS[k], vpid, &servers, sql)
                })
            })
            .collect();
        let mut views = [None; selfview::VIEWS.len()];
        views[0] = view.as_deref();
        for (k, v) in pid_views.iter().enumerate() {
            views[k + 1] = v.as_deref();
        }
        let mut signal = |kind, pid| clients.is_some_and(|c| signal_client(c, kind, pid));
        let vpid = self.session.backend_pid;
        // Those a query may signal as PostgreSQL would let it (`signal_client`).
        let mut targets = || clients.map_or_else(Vec::new, |(c, user)| c.pids_of(user, vpid));
        let mut own = selfview::Own {
            vpid,
            views,
            signal: &mut signal,
            targets: &mut targets,
        };
        selfview::rewrite(sql, &mut own)
    }

    /// A named Parse pgcarpool refuses (inside a failed transaction block, or of a name the
    /// client has): the server checks the client's own text as PostgreSQL would first (a
    /// syntax error, 42601, an unknown table…, else 25P02 in a failed block;
    /// `Server::check_text`: the server's unnamed statement stays). `rest`: the Parse body
    /// after the name.
    fn refused_parse(&mut self, rest: &[u8]) -> Result<(), ProtoError> {
        let sql = Reader::new(rest, "Parse").cstr_bytes()?;
        self.server.check_text(sql, &rest[sql.len() + 1..]);
        Ok(())
    }

    /// A named Parse whose text is SQL `EXECUTE name …` of one of the client's statements
    /// (asyncpg sends SQL through named statements): the text runs that statement's server
    /// name instead, and the statement comes along wherever this one is prepared. `rest`:
    /// the Parse body after the name.
    fn map_execute(&mut self, rest: Bytes) -> Result<(Bytes, Option<Arc<Stmt>>), ProtoError> {
        let sql = Reader::new(&rest, "Parse").cstr_bytes()?;
        if !classify::may_matter(sql) {
            return Ok((rest, None));
        }
        let Some(classify::Named::Execute { name, rest: args }) = classify::named_statement(sql)
        else {
            return Ok((rest, None));
        };
        let Some(target) = self.session.statements.get(name.as_bytes()).cloned() else {
            return Ok((rest, None));
        };
        let text = format!(
            "EXECUTE {} {}",
            quoted(&target.server_name),
            String::from_utf8_lossy(args)
        );
        let types = &rest[sql.len() + 1..];
        let mut b = bytes::BytesMut::with_capacity(text.len() + 1 + types.len());
        b.put_slice(text.as_bytes());
        b.put_u8(0);
        b.put_slice(types);
        Ok((b.freeze(), Some(target)))
    }

    /// Make a statement usable by an EXECUTE/DEALLOCATE inside a Parse on this server.
    fn ensure_for_parse(&mut self, stmt: &Arc<Stmt>) {
        if self.server.touch(stmt.id) {
            return;
        }
        if stmt.is_sql_prepared() {
            // Made by SQL PREPARE: prepared by SQL, in a query of its own at a Sync
            // boundary, else within the round (long-run seed 1033). A failed block would
            // refuse it as it refuses the client's Parse (25P02, the one error the client
            // gets): not sent there, the statement is prepared after the block ended
            // (differential seed 80031).
            if self.server.status_sent() == b'E' {
                return;
            }
            self.counts.server_parses += 1;
            // Under the search_path of its PREPARE, as PostgreSQL holds it: analysed again
            // at its use when the client's differs (long-run seed 90038), also after a
            // change in this block (differential seed 120934).
            if self.at_sync_point {
                let around = self.parse_scope_sets(stmt, true);
                self.server.prepare_apart(stmt, false, around.map(joined));
            } else {
                let (before, after) = self.parse_scope_sets(stmt, false).unzip();
                before
                    .iter()
                    .flatten()
                    .for_each(|q| self.statement_within_round(q));
                self.server.prepare_sql_within_round(stmt);
                after
                    .iter()
                    .flatten()
                    .for_each(|q| self.statement_within_round(q));
            }
        } else {
            self.prepare_on_server(stmt.clone(), true);
        }
    }

    /// Make the client's statements `stmts` usable on this server by a read of
    /// `pg_prepared_statements` in a simple Query (`query`) or a Parse, so that the server
    /// says what their types are. PostgreSQL lists a statement it could not analyse again
    /// (its table dropped, say) and the read succeeds: before a Query, in a round of its
    /// own whose error is dropped, and the server then lacks it (`Pending::Prepare`); the
    /// client's EXECUTE of it fails as in PostgreSQL. Before a Parse as for its EXECUTE.
    /// Either way under the search_path it was parsed with (long-run seeds 93193, 96139).
    fn ensure_for_view(&mut self, stmts: &[(Bytes, Arc<Stmt>)], query: bool) {
        // In a failed block the query fails (25P02) whatever it reads, and so would a
        // round that prepares a statement: none is sent (differential seed 7).
        if self.server.status_sent() == b'E' {
            return;
        }
        // Prepared beside max_prepared_statements (as a Query's rounds are), so that the
        // server holds all of them when the read runs: one of them made room for the next
        // would be listed without what the server says of it. The next Parse on this
        // server closes down to the limit again.
        let max = std::mem::replace(&mut self.max_prepared, usize::MAX);
        for (_, stmt) in stmts {
            // In a Parse within a round, as for its EXECUTE; else in rounds of their own,
            // whose errors are dropped (one parsed after a change of its scope, whose
            // search_path is not known, may fail to parse again: listed without types,
            // not an error; differential seed 150186).
            if !query && !self.at_sync_point {
                self.ensure_for_parse(stmt);
            } else if !self.server.touch(stmt.id) {
                self.counts.server_parses += 1;
                let around = self.parse_scope_sets(stmt, true);
                self.server.prepare_apart(stmt, false, around.map(joined));
            }
        }
        self.max_prepared = max;
    }

    /// plan_once: a client's Parse of the unnamed statement with the text of its previous
    /// one is served by a shared statement (`VirtualSession::unnamed_shared`), which the
    /// server plans once, where that cannot change what the client sees: a plain
    /// SELECT/INSERT/UPDATE/DELETE (`classify::plans_once`) of an unpinned client, parsed
    /// in the client's known scope, first in a round outside a transaction block (a stale
    /// plan's 0A000 at the Bind is then sent again on a fresh statement,
    /// `Relay::replay_stale`). Answered here when the server holds it, else prepared under
    /// its server name (the client gets that ParseComplete or error). True when served.
    fn parse_planned_once(&mut self, msg: &Bytes) -> Result<bool, ProtoError> {
        let rest = &msg[6..];
        if !self.plan_once
            || msg[5] != 0
            || self.session.ext.unnamed.as_deref() != Some(rest)
            || self.session.pin.is_some()
            || !self.at_sync_point
            || self.server.tx_status() != b'I'
            || self.server.status_sent() != b'I'
            || !self.server.exchange().before_first_bind()
        {
            return Ok(false);
        }
        // (`rest` is the client's unnamed statement: its text was looked at once.)
        if !self.session.unnamed_facts().is_some_and(|f| f.plans_once) {
            return Ok(false);
        }
        if (self.session.ext.unnamed_shared.as_ref())
            .is_some_and(|s| s.described && s.stmt.parse_rest[..] == *rest)
        {
            // Described each time (pgx): a Parse of its own either way.
            return Ok(false);
        }
        // The statement of the client's previous unnamed Parse while nothing changed its
        // scope or the registry's generation, else the registry's.
        let kept = self.session.ext.unnamed_shared.as_ref().filter(|s| {
            s.stmt.parse_rest[..] == *rest
                && Arc::ptr_eq(&s.params, &self.session.params)
                && self.effects.is_empty()
                && self.registry.is_current(&s.stmt)
        });
        let stmt = match kept {
            Some(s) => s.stmt.clone(),
            None => {
                let scope = self.statement_scope(rest);
                if scope.starts_with(super::prepared::UNSHARED) {
                    return Ok(false);
                }
                // Within the registry's bound, else parsed as ever.
                let Ok(stmt) = self.registry.intern(&scope, rest) else {
                    return Ok(false);
                };
                stmt
            }
        };
        let now = self.session.parsed_unnamed(rest);
        match &mut self.session.ext.unnamed_shared {
            Some(s)
                if Arc::ptr_eq(&s.stmt, &stmt) && Arc::ptr_eq(&s.params, &self.session.params) =>
            {
                s.id = now;
            }
            slot => {
                *slot = Some(Box::new(super::session::SharedUnnamed {
                    id: now,
                    stmt: stmt.clone(),
                    params: self.session.params.clone(),
                    described: false,
                }));
            }
        }
        self.session
            .parsed_name(Bytes::new(), self.registry.changes_seen());
        if self.server.touch(stmt.id) {
            self.server.expect(Pending::Answered(Bytes::new(), stmt));
        } else {
            self.prepare_on_server(stmt, false);
            // Failed, the client has no unnamed statement (`VirtualSession::undo`).
            self.server.name_last_parse(Bytes::new());
        }
        Ok(true)
    }

    /// The shared statement serving the client's unnamed statement (plan_once), prepared
    /// on this server (added if missing).
    fn shared_unnamed(&mut self) -> Option<Arc<Stmt>> {
        let stmt = self.session.shared_unnamed()?.clone();
        if !self.server.touch(stmt.id) {
            self.prepare_on_server(stmt.clone(), true);
        }
        Some(stmt)
    }

    /// Does this server hold the client's current unnamed statement? If the client has
    /// one that another server holds, it is parsed here first (its replies swallowed).
    fn unnamed_here(&mut self) -> bool {
        let id = self.session.ext.unnamed_id;
        if id != 0 && self.server.exchange().unnamed() == id {
            return true;
        }
        let Some(rest) = self.session.ext.unnamed.clone() else {
            return false;
        };
        if let Some(dep) = self.unnamed_dependency(&rest) {
            // `EXECUTE "PGCARPOOL_n"(…)` runs a statement this server may lack (long-run
            // seed 3005).
            self.ensure_for_parse(&dep);
        }
        self.server.reparse_unnamed(rest, id);
        true
    }

    /// The client's statement that its unnamed statement (`rest`, as sent: SQL `EXECUTE`
    /// mapped to the server name) executes, if any.
    fn unnamed_dependency(&self, rest: &[u8]) -> Option<Arc<Stmt>> {
        let sql = rest.split(|&c| c == 0).next()?;
        let Some(classify::Named::Execute { name, .. }) = classify::named_statement(sql) else {
            return None;
        };
        if !classify::is_internal_name(name.as_bytes()) {
            return None;
        }
        let name = name.as_bytes();
        self.session
            .statements
            .values()
            .find(|s| s.server_name.eq_ignore_ascii_case(name))
            .cloned()
    }

    /// The statement a client name refers to, prepared on this server (added if missing).
    fn lookup(&mut self, name: &[u8]) -> Option<Arc<Stmt>> {
        if name.is_empty() {
            return None;
        }
        let stmt = self.session.statements.get(name)?.clone();
        if stmt.is_sql_prepared() {
            // Made by SQL PREPARE: usable from the protocol only where it already exists.
            return self.server.touch(stmt.id).then_some(stmt);
        }
        if !self.server.touch(stmt.id) {
            self.prepare_on_server(stmt.clone(), true);
        } else if let Some(dep) = &stmt.depends {
            self.ensure_for_parse(dep);
        }
        Some(stmt)
    }

    /// Send a Parse of `stmt` under its server name (closing the least recently used
    /// statement first when the server holds max_prepared_statements).
    fn prepare_on_server(&mut self, stmt: Arc<Stmt>, swallow: bool) {
        if let Some(dep) = &stmt.depends {
            self.ensure_for_parse(dep);
        }
        self.counts.server_parses += 1;
        let back = if swallow {
            self.under_parse_scope(&stmt)
        } else {
            None
        };
        self.server.prepare(stmt, swallow, self.max_prepared);
        for sql in back.iter().flatten() {
            self.statement_within_round(sql);
        }
    }

    /// `stmt` parsed again here for a Bind or a Describe of it. PostgreSQL keeps a
    /// statement as it was parsed and analyses it again under a changed search_path only
    /// when it is used: after a Bind's parameters are read, after a Describe's
    /// ParameterDescription (long-run seeds 15299, 16182). So when the client's search_path
    /// changed since its Parse, this Parse goes under the one it was parsed with (a SET
    /// before it, within the round; the server's copy then means what it means to the
    /// other clients of its scope too), and the server analyses it again at its use as
    /// PostgreSQL does. The SET putting the client's back, to follow the Parse.
    fn under_parse_scope(&mut self, stmt: &Stmt) -> Option<Vec<String>> {
        let (before, after) = self.parse_scope_sets(stmt, false)?;
        before.iter().for_each(|q| self.statement_within_round(q));
        Some(after)
    }

    /// The statements that put the server's search_path to the one `stmt` was parsed
    /// under before it is prepared, and back after (none in a failed block, or when they
    /// are the same). In a transaction block whose statements may have changed the
    /// client's (the session's is known as of the last transaction), or when `protect`
    /// (a failed PREPARE must not abort the block: PostgreSQL has the statement and the
    /// block goes on): within a savepoint of pgcarpool's, by SET LOCAL, rolled back after.
    /// The server's setting is then the client's again, and its block as it was; the
    /// statement stays (a rollback does not undo a PREPARE or a Parse).
    fn parse_scope_sets(&self, stmt: &Stmt, protect: bool) -> Option<(Vec<String>, Vec<String>)> {
        let status = self.server.status_sent();
        if status == b'E' {
            return None;
        }
        let then = self.session.scoped_search_path(stmt.scope());
        let now = self.session.params.get("search_path").map(str::to_string);
        let set = |v: &Option<String>, local: bool| match v {
            Some(v) => set_statement("search_path", v, local),
            None if local => Some("SET LOCAL search_path TO DEFAULT".to_string()),
            None => Some("SET search_path TO DEFAULT".to_string()),
        };
        let changed = self.scope_changed();
        if status == b'T' && (protect || changed) {
            let mut before = vec![format!("SAVEPOINT {SCOPE_SAVEPOINT}")];
            if let Some(then) = &then
                && (changed || *then != now)
            {
                before.extend(set(then, true));
            }
            let after = [
                format!("ROLLBACK TO SAVEPOINT {SCOPE_SAVEPOINT}"),
                format!("RELEASE SAVEPOINT {SCOPE_SAVEPOINT}"),
            ];
            return Some((before, after.to_vec()));
        }
        let then = then?;
        if then == now {
            return None;
        }
        Some((vec![set(&then, false)?], vec![set(&now, false)?]))
    }

    /// A Bind of a shared statement that starts a round outside a transaction block: keep
    /// the round's messages, to send them again on a fresh statement if a schema change
    /// made the server's copy stale (another application's DDL, which pgcarpool cannot
    /// see). True when kept.
    fn start_replay(&mut self, name: &[u8], stmt: &Arc<Stmt>, msg: &Bytes) -> bool {
        // Only a client that parsed after the registry's last change, and was not told the
        // stale copy's columns (Describe), may have its round sent again.
        let seen = self.registry.changes_seen();
        let first_bind = self.session.take_unbound(name) == Some(seen);
        if !first_bind
            || self.server.tx_status() != b'I'
            || self.replay.is_some()
            || !self.server.exchange().before_first_bind()
            || stmt.is_sql_prepared()
        {
            return false;
        }
        self.replay = Some(super::relay::Replay {
            name: Bytes::copy_from_slice(name),
            stmt: stmt.clone(),
            msgs: bytes::BytesMut::from(&msg[..]),
            complete: false,
            replayed: false,
        });
        true
    }

    /// The shared statement of the kept round was stale: if the whole round is kept, the
    /// client's name gets a statement parsed anew and the round goes again (the failed
    /// round's error and ReadyForQuery are dropped). False: the client gets the error.
    pub(super) fn replay_stale(&mut self) -> bool {
        self.registry.bump_generation();
        if self.server.exchange().partial() > 0 {
            return false;
        }
        let Some(r) = self.replay.take_if(|r| r.complete && !r.replayed) else {
            return false;
        };
        if r.name.is_empty()
            && !(self.session.shared_unnamed()).is_some_and(|s| Arc::ptr_eq(s, &r.stmt))
        {
            // The client's unnamed statement is another one by now.
            return false;
        }
        let (scope, rest) = (r.stmt.scope().to_vec(), r.stmt.parse_rest.clone());
        let fresh = if r.name.is_empty() {
            // (The unnamed statement counts against no client limit.)
            self.registry.intern(&scope, &rest).ok()
        } else {
            self.intern(&scope, &rest, r.stmt.depends.clone())
        };
        let Some(fresh) = fresh else {
            return false;
        };
        self.server.swallow_to_sync();
        // The stale copy goes (after the failed round's Sync): whoever binds it here next
        // gets it parsed anew.
        self.server.unprepare(&r.stmt);
        if r.name.is_empty() {
            if let Some(s) = &mut self.session.ext.unnamed_shared {
                s.stmt = fresh;
            }
        } else {
            self.session.statements.insert(r.name.clone(), fresh);
        }
        let mut again = r.msgs;
        again.extend_from_slice(&self.client.rbuf);
        self.client.rbuf = again;
        self.replay = Some(super::relay::Replay {
            msgs: bytes::BytesMut::new(),
            complete: true,
            replayed: true,
            ..r
        });
        self.rescan_client = true;
        true
    }

    /// Send the client the replies pgcarpool owes it that are next in line. True when one
    /// of them was a ReadyForQuery.
    pub(super) fn answer_front(&mut self) -> bool {
        let mut ready = false;
        while let Some(a) = self.server.pop_answer() {
            let status = self.server.tx_status();
            ready |= matches!(a, Answer::Query(_));
            self.client.queue_with(|b| match a {
                Answer::ParseComplete => backend::parse_complete(b),
                Answer::CloseComplete => backend::close_complete(b),
                Answer::Described(params) => backend::described_without_result(b, &params),
                Answer::Query(tag) => {
                    backend::command_complete(b, tag);
                    backend::ready_for_query(b, status);
                }
            });
        }
        ready
    }

    /// A reply came (its header `h`, at `at` in the server's buffer): the server settles
    /// what it owed (`server::exchange`), the client's session follows, and the verdict
    /// says what becomes of the reply.
    /// A client's `EXECUTE` of a SQL-prepared statement the server lacks, since its
    /// PREPARE in the round before failed (`Lost::Unprepared`): PostgreSQL analyses the
    /// statement again at its EXECUTE and fails as that PREPARE did (its table dropped,
    /// say), where pgcarpool's server says it has no such statement (26000). That error,
    /// as the PREPARE's, for this ErrorResponse (`code`, whole `msg`); None for another.
    pub(super) fn analysis_error(&self, code: Option<[u8; 5]>, msg: &[u8]) -> Option<Bytes> {
        let (name, error) = self.unprepared.as_ref()?;
        let quoted = [&b"\""[..], name, b"\""].concat();
        (code == Some(*b"26000") && msg.windows(quoted.len()).any(|w| w == quoted))
            .then(|| error.clone())
    }

    pub(super) fn on_reply(
        &mut self,
        h: crate::proto::Header,
        at: usize,
    ) -> Result<Verdict, ProtoError> {
        let reply = self.server.receive(h, at, self.virt)?;
        if reply.deallocated {
            self.dealloc_ran();
        }
        for u in reply.undo.into_iter().rev() {
            match u {
                Undo::Name(name, stmt, seq)
                    if !name.is_empty() && !self.session.statements.contains_key(&name) =>
                {
                    // Made before a DEALLOCATE ALL whose fate is not known yet: it leaves
                    // the statements kept aside (undone newest first, a name made again
                    // after the DEALLOCATE ALL goes from the client's statements first).
                    // Only the statement this Parse made, from the DEALLOCATE ALLs executed
                    // after it: the name's statement from before the Parse stays (long-run
                    // seeds 2026, 2042), also when it is the same (the same text in the same
                    // scope, long-run seed 5496).
                    for (_, after, kept) in &mut self.session_deallocs {
                        if *after > seq && kept.get(&name).is_some_and(|k| Arc::ptr_eq(k, &stmt)) {
                            kept.remove(&name);
                        }
                    }
                }
                u => self.session.undo(u),
            }
        }
        match reply.lost {
            Lost::Nothing => {}
            Lost::Unnamed => self.session.drop_unnamed(),
            Lost::Unprepared(stmt) if stmt.is_sql_prepared() => {
                // (Not in a failed block: the client's EXECUTE fails there as it does.)
                let msg = &self.server.conn().rbuf[at..at + h.total];
                let code = msg.get(5..).and_then(backend::error_code);
                self.unprepared = (code != Some(*b"25P02"))
                    .then(|| (stmt.server_name.clone(), Bytes::copy_from_slice(msg)));
            }
            Lost::Unprepared(_) => {}
            Lost::Name(p) => {
                let (stmt, name) = &*p;
                if self
                    .session
                    .statements
                    .get(name)
                    .is_some_and(|s| Arc::ptr_eq(s, stmt))
                {
                    self.session.statements.remove(name);
                }
            }
        }
        Ok(reply.verdict)
    }
}

const NO_UNNAMED: &str = "unnamed prepared statement does not exist";

/// An integer parameter's value: text, or binary of 2, 4 or 8 bytes.
/// The savepoint within which a statement is prepared in a transaction block
/// (`Relay::parse_scope_sets`).
const SCOPE_SAVEPOINT: &str = "pgcarpool_scope";

/// Statements sent as one query.
fn joined((before, after): (Vec<String>, Vec<String>)) -> (String, String) {
    (before.join("; "), after.join("; "))
}

/// A Bind of the client's unnamed statement to `portal`: noted in the session, and what
/// running the statement does to the session in the transaction's `effects` (a SET is read
/// back after it, as after its Parse; differential seed 170294).
fn bound_unnamed(s: &mut VirtualSession, portal: &[u8], deallocates: bool, effects: &mut Effects) {
    let tx = s.unnamed_facts().and_then(|f| f.tx);
    s.bound(portal, tx, deallocates);
    if let Some(e) = s.unnamed_effects() {
        effects.merge(e);
    }
}

fn param_int(v: &[u8], binary: bool) -> Option<i64> {
    if !binary {
        return std::str::from_utf8(v).ok()?.trim().parse().ok();
    }
    Some(match v.len() {
        2 => i64::from(i16::from_be_bytes(v.try_into().ok()?)),
        4 => i64::from(i32::from_be_bytes(v.try_into().ok()?)),
        8 => i64::from_be_bytes(v.try_into().ok()?),
        _ => return None,
    })
}

/// `pid` as a parameter value of the form and width of the one it replaces (None: it does
/// not fit).
fn param_bytes(pid: i32, width: usize, binary: bool) -> Option<Vec<u8>> {
    if !binary {
        return Some(pid.to_string().into_bytes());
    }
    match width {
        2 => i16::try_from(pid).ok().map(|p| p.to_be_bytes().to_vec()),
        4 => Some(pid.to_be_bytes().to_vec()),
        8 => Some(i64::from(pid).to_be_bytes().to_vec()),
        _ => None,
    }
}

/// A client's query signals the client of this process given pid `pid` (`clients`: all,
/// and the caller's user), as PostgreSQL signals a session: allowed to the same user
/// (PostgreSQL also allows members of the target's role and of `pg_signal_backend`, which
/// pgcarpool cannot tell: the query then goes to the server, where the pid is no backend).
/// Terminated, the target is told `FATAL 57P01` and goes (a transaction it was running is
/// rolled back with its server); cancelled, its running query is (as a cancel request
/// would). True when it was signalled.
pub(super) fn signal_client(
    (clients, user): (&super::registry::Registry, &str),
    kind: selfview::Signal,
    pid: i32,
) -> bool {
    let Some(target) = clients.find_pid(pid) else {
        return false;
    };
    if *target.user != *user {
        return false;
    }
    match kind {
        selfview::Signal::Terminate => target.kill_with(super::registry::TERMINATED),
        selfview::Signal::Cancel => {
            if let Some((addr, key, rest)) = target.cancel_target() {
                tokio::spawn(async move {
                    let rest = rest.as_deref().unwrap_or_default();
                    if let Err(e) = crate::server::connect::send_cancel(&addr, key, rest).await {
                        tracing::warn!("could not forward cancel request to {addr}: {e}");
                    }
                });
            }
        }
    }
    true
}

/// Is a statement's text (its Parse body after the name) one LISTEN or UNLISTEN?
fn listens(parse_rest: &[u8]) -> bool {
    let sql = parse_rest.split(|&c| c == 0).next().unwrap_or_default();
    matches!(
        super::notify::parse(sql),
        Some(super::notify::Stmt::Listen(_) | super::notify::Stmt::Unlisten(_))
    )
}

/// Starts the text of a statement pgcarpool made of a client's RESET (see
/// `to_startup_value`): its CommandComplete is given to the client as RESET.
pub(super) const RESET_MARK: &[u8] = b"/* pgcarpool: RESET */ ";

/// A one-statement query returning to its default a setting the client's startup packet
/// gave: the SET of that value PostgreSQL's RESET would have returned to (the servers'
/// defaults are their own), and whether it was written as RESET.
pub(super) fn to_startup_value(session: &VirtualSession, sql: &[u8]) -> Option<(String, bool)> {
    let d = classify::to_default(sql)?;
    let value = session.startup.get(&d.name)?;
    Some((set_statement(&d.name, value, d.local)?, d.reset))
}

/// `SET name TO value` of a setting as the startup packet gave it (`local`: SET LOCAL).
/// None: a value that SET cannot carry as written here.
fn set_statement(name: &str, value: &str, local: bool) -> Option<String> {
    let list = matches!(
        name,
        "search_path"
            | "temp_tablespaces"
            | "session_preload_libraries"
            | "local_preload_libraries"
            | "shared_preload_libraries"
    );
    let literal = if list {
        // A list of identifiers, as written: only when it is nothing else, and written as
        // PostgreSQL shows a list SET (`a, b`), which SHOW then gives as the startup value.
        let plain = |c: char| c.is_alphanumeric() || "_$,. \"".contains(c);
        let canonical: Vec<&str> = value.split(',').map(str::trim).collect();
        if value.trim().is_empty() || !value.chars().all(plain) || canonical.join(", ") != value {
            return None;
        }
        value.to_string()
    } else if value.contains('\\') {
        return None;
    } else {
        format!("'{}'", value.replace('\'', "''"))
    };
    let name: Vec<String> = name.split('.').map(|p| quoted(p.as_bytes())).collect();
    let local = if local { "LOCAL " } else { "" };
    Some(format!("SET {local}{} TO {literal}", name.join(".")))
}

/// The statements that set the client's startup settings (`startup_settings`) again: a
/// SET of each (no snapshot taken: a `SET TRANSACTION` may still follow in the block),
/// or, when a value cannot be written so, one `SELECT pg_catalog.set_config(…)` of all.
fn startup_statements(session: &VirtualSession) -> Vec<String> {
    let settings = startup_settings(session);
    if settings.is_empty() {
        return Vec::new();
    }
    let sets: Option<Vec<String>> = settings
        .iter()
        .map(|(k, v)| set_statement(k, v, false))
        .collect();
    sets.unwrap_or_else(|| {
        let lit = |x: &str| format!("E'{}'", x.replace('\\', "\\\\").replace('\'', "\\'"));
        let calls: Vec<String> = settings
            .iter()
            .map(|(k, v)| format!("pg_catalog.set_config({}, {}, false)", lit(k), lit(v)))
            .collect();
        vec![format!("SELECT {}", calls.join(", "))]
    })
}

/// `RESET ALL` in a simple Query, from a client whose startup packet gave settings:
/// PostgreSQL's returns them to the startup values, a server's to its own login values.
/// It goes as written, followed in the same query by the statements setting the startup
/// values again (`startup_statements`), whose replies are dropped: the server reports
/// (ParameterStatus, at its ReadyForQuery) just the settings whose value changed, with the
/// startup values, as PostgreSQL does. (Not a DO block: that needs PL/pgSQL, which a
/// database may have dropped, and compiled in a fresh backend it can outlast a short
/// statement_timeout that RESET ALL would not.) In a Parse it goes as written and
/// pgcarpool's statements follow its Execute (`Relay::startup_after_discard`). The text
/// sent, and how many statements pgcarpool added; None: not such a statement.
fn reset_all_to_startup(session: &VirtualSession, sql: &[u8]) -> Option<(String, usize)> {
    if session.startup.is_empty() || !classify::may_matter(sql) || classify::split(sql).len() != 1 {
        return None;
    }
    let e = classify::classify(sql);
    if !e.reset_all || e.discard_all {
        return None;
    }
    let added = startup_statements(session);
    if added.is_empty() {
        return None;
    }
    let reset = String::from_utf8_lossy(sql);
    // A new line first: the client's text may end in a `--` comment.
    Some((format!("{reset}\n;{}", added.join(";")), added.len()))
}

/// A Parse body after the name (the SQL, then parameter types) whose text is `RESET ALL`
/// (or `DISCARD ALL`), from a client whose startup packet gave settings: its Execute is
/// followed by the startup values (`Relay::startup_after_discard`).
fn startup_follows(session: &VirtualSession, parse_rest: &[u8]) -> bool {
    let sql = parse_rest.split(|&c| c == 0).next().unwrap_or_default();
    // Cheap first: this runs for every Bind of the unnamed statement.
    let first = classify::strip_leading(sql);
    let word = |w: &[u8]| {
        first
            .get(..w.len())
            .is_some_and(|f| f.eq_ignore_ascii_case(w))
    };
    if session.startup.is_empty() || !(word(b"reset") || word(b"discard")) {
        return false;
    }
    let e = classify::classify(sql);
    classify::split(sql).len() == 1
        && (e.reset_all || e.discard_all)
        && !startup_settings(session).is_empty()
}

/// The settings of the client's startup packet that `DISCARD ALL` (as RESET ALL) returns
/// to: all but `role` and `session_authorization` (GUC_NO_RESET_ALL).
fn startup_settings(session: &VirtualSession) -> Vec<(String, String)> {
    session
        .startup
        .iter()
        .filter(|(k, _)| {
            !k.eq_ignore_ascii_case("role") && !k.eq_ignore_ascii_case("session_authorization")
        })
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// One frontend message: `tag`, its length, then `parts`.
fn message(b: &mut bytes::BytesMut, tag: u8, parts: &[&[u8]]) {
    let len: usize = 4 + parts.iter().map(|p| p.len()).sum::<usize>();
    b.put_u8(tag);
    b.put_i32(len as i32);
    for p in parts {
        b.put_slice(p);
    }
}

/// A named Parse's text and types (`rest`) with `to_startup_value` applied.
fn startup_value_rest(session: &VirtualSession, rest: Bytes) -> Result<Bytes, ProtoError> {
    let sql = Reader::new(&rest, "Parse").cstr_bytes()?;
    let Some((set, reset)) = to_startup_value(session, sql) else {
        return Ok(rest);
    };
    let mut b = bytes::BytesMut::new();
    if reset {
        b.put_slice(RESET_MARK);
    }
    b.put_slice(set.as_bytes());
    b.put_slice(&rest[sql.len()..]);
    Ok(b.freeze())
}

/// A Parse of the unnamed statement with this text and the parameter types `types` (the
/// original message's bytes after its text).
fn parse_message(sql: &[u8], types: &[u8]) -> Bytes {
    let mut b = bytes::BytesMut::with_capacity(6 + sql.len() + 1 + types.len());
    b.put_u8(frontend::PARSE);
    b.put_i32((4 + 1 + sql.len() + 1 + types.len()) as i32);
    b.put_u8(0);
    b.put_slice(sql);
    b.put_u8(0);
    b.put_slice(types);
    b.freeze()
}

/// Where `rest`, a part of `sql`, starts in it.
fn rest_at(sql: &[u8], rest: &[u8]) -> usize {
    (rest.as_ptr() as usize).saturating_sub(sql.as_ptr() as usize)
}

/// A statement name as written in SQL: bare when it reads so (lower case), else quoted.
fn identifier(name: &[u8]) -> String {
    let bare = name
        .first()
        .is_some_and(|c| c.is_ascii_lowercase() || *c == b'_')
        && name
            .iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'_' | b'$'));
    if bare {
        String::from_utf8_lossy(name).into_owned()
    } else {
        quoted(name)
    }
}

/// An identifier in double quotes.
fn quoted(name: &[u8]) -> String {
    format!("\"{}\"", String::from_utf8_lossy(name).replace('"', "\"\""))
}

/// A Query message of SQL text that may not be UTF-8 (the client's, rewritten).
fn query_bytes(sql: &[u8]) -> Bytes {
    let mut b = bytes::BytesMut::with_capacity(sql.len() + 6);
    b.put_u8(frontend::QUERY);
    b.put_i32((4 + sql.len() + 1) as i32);
    b.put_slice(sql);
    b.put_u8(0);
    b.freeze()
}

fn query_message(sql: &str) -> Bytes {
    let mut b = bytes::BytesMut::with_capacity(sql.len() + 6);
    frontend::query(&mut b, sql);
    b.freeze()
}

/// A simple query's session-wide effects that its server will refuse, dropped before they
/// are applied: inside a failed transaction block (`tx_status` `E`) every such statement
/// fails with 25P02, and inside any transaction block `DISCARD ALL` fails with 25001
/// (PostgreSQL's `PreventInTransactionBlock`), leaving statements and settings as they were.
fn refused_in_block(e: &mut Effects, tx_status: u8) {
    let refused = match tx_status {
        b'E' => e.discard_all || e.reset_all || e.deallocate_all,
        b'T' => e.discard_all,
        _ => false,
    };
    if refused {
        e.discard_all = false;
        e.reset_all = false;
        e.deallocate_all = false;
    }
}

/// Is a client's unnamed statement of this Parse body (text, NUL, types) described by
/// pgcarpool (`Server::learn`)? A text that may return no rows, but not an EXECUTE: a
/// Describe of that analyses the statement it runs again where the client's search_path
/// changed, and its error would come before the client's Bind, where PostgreSQL's comes at
/// the client's Describe or Execute (long-run seed 90038).
fn learns_unnamed(rest: &[u8]) -> bool {
    let text = rest.split(|&c| c == 0).next().unwrap_or_default();
    !classify::returns_rows(rest)
        && !matches!(
            classify::named_statement(text),
            Some(classify::Named::Execute { .. })
        )
}
