//! The virtual session: what one client believes its PostgreSQL session holds, whichever
//! server runs its next transaction.
use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use crate::statements::Stmt;
use std::sync::atomic::Ordering;

use super::registry::{ClientHandle, client_event};
use crate::pool::Pool;
use crate::server::Params;
use crate::server::response::Undo;

/// A client's own names (prepared statements): hashed with foldhash, several times faster
/// than the standard SipHash on the short names clients use, seeded per process. A map
/// holds one client's names only, bounded by `client_max_statements`: a client that picks
/// colliding names slows nobody but itself.
pub type NameMap<V> = HashMap<Bytes, V, foldhash::fast::RandomState>;

#[derive(Debug, Clone, Default)]
pub struct VirtualSession {
    /// Session parameters (GUCs) the client set: from its startup packet and, for reported
    /// parameters, from the server's ParameterStatus while it ran the client's queries.
    /// Shared copy-on-write with other clients of the pool that have the same values (most
    /// clients of an application do): an idle client does not keep its own copy.
    pub params: Arc<Params>,
    /// Named prepared statements: client name → statement.
    pub statements: NameMap<Arc<Stmt>>,
    /// The startup packet's parameters: with the servers' defaults, what RESET ALL returns to.
    pub startup: Arc<Params>,
    /// Why the client must keep its server, if it must.
    pub pin: Option<Vec<&'static str>>,
    /// The process id the client was given (BackendKeyData).
    pub backend_pid: i32,
    /// The client's pool (database, user): the start of every `statement_scope`.
    pub pool_scope: Bytes,
    /// The extended protocol's state (the unnamed statement, portals, statements parsed
    /// and not bound): boxed, made on first use and let go when empty again
    /// (`Extended::release_if_empty`): a client of the simple protocol, and every idle
    /// client that left none, keeps 8 bytes of it.
    pub ext: Extended,
}

/// The extended protocol's part of a `VirtualSession`.
#[derive(Debug, Clone, Default)]
pub struct ExtendedState {
    /// The unnamed statement (its Parse body after the name), prepared again on another
    /// server when the client binds it there; None when the client has none.
    pub unnamed: Option<bytes::Bytes>,
    /// What the relay needs of `unnamed`'s text, found once per text (`unnamed_facts`);
    /// emptied whenever `unnamed` changes.
    pub unnamed_text_facts: std::sync::OnceLock<crate::sql::facts::TextFacts>,
    /// Identifies `unnamed` on servers (`Server::unnamed`; 0: none).
    pub unnamed_id: u64,
    /// plan_once: the shared statement that serves the client's unnamed statement
    /// (`Relay::parse_planned_once`, `shared_unnamed`).
    pub unnamed_shared: Option<Box<SharedUnnamed>>,
    /// Statement names parsed and neither described nor bound yet, with the registry's
    /// count of schema changes seen at their Parse: a change pgcarpool did not see before
    /// then is not theirs to see (a stale server copy is prepared anew, see
    /// `Relay::replay_stale`).
    pub unbound: NameMap<u64>,
    /// The unnamed portal runs a RESET pgcarpool sent as a SET of the startup value
    /// (its CommandComplete says RESET).
    pub retag_portal: bool,
    /// The `unnamed_id` of an unnamed statement whose text is `DEALLOCATE ALL` (0: none).
    pub unnamed_deallocates: u64,
    /// The `unnamed_id` of an unnamed statement a server described as returning no rows,
    /// and its ParameterDescription's body: a Describe of it inside a failed transaction
    /// block on a server that does not hold it is answered with them (`Owed::learn`).
    pub unnamed_described: Option<(u64, Bytes)>,
    /// Portals bound to a statement whose text is `DEALLOCATE ALL`: the client's statements
    /// go when one of them is executed, as in PostgreSQL (not at its Parse or Bind).
    pub deallocating_portals: Vec<Bytes>,
    /// The portal last bound to a statement whose text is `DISCARD ALL` or `RESET ALL`
    /// (`rewrite::startup_follows`): its Execute is followed by the client's startup values
    /// (`Relay::startup_after_discard`).
    pub discard_portal: Option<Bytes>,
    /// The portal last bound to a transaction-control statement, and what running it does
    /// to the transaction status (`classify::tx_effect`): noted when it is executed
    /// (`Exchange::sent_tx_effect`).
    pub tx_portal: Option<(Bytes, [u8; 3])>,
    /// The portal last bound to a statement whose text is a LISTEN or UNLISTEN, and that
    /// text: its Execute may be followed by pgcarpool's record of it
    /// (`Relay::listen_after_execute`).
    pub listen_portal: Option<(Bytes, Bytes)>,
    /// The `unnamed_id` of an unnamed statement whose text signals a pid given by a
    /// parameter (`selfview::signal_params`): its Binds are looked at (0: none).
    pub unnamed_signals: u64,
    /// Named statements whose text pgcarpool rewrote for the client's session
    /// (`selfview::rewrite`): the client's name, the statement it stands for now, and the
    /// client's own text (Parse body after the name), rewritten again at each Bind.
    pub own_texts: Vec<(Bytes, u64, Bytes)>,
}

impl ExtendedState {
    fn is_empty(&self) -> bool {
        self.unnamed.is_none()
            && self.unnamed_id == 0
            && self.unnamed_shared.is_none()
            && self.unbound.is_empty()
            && !self.retag_portal
            && self.unnamed_deallocates == 0
            && self.unnamed_described.is_none()
            && self.deallocating_portals.is_empty()
            && self.discard_portal.is_none()
            && self.tx_portal.is_none()
            && self.listen_portal.is_none()
            && self.unnamed_signals == 0
            && self.own_texts.is_empty()
    }
}

/// `ExtendedState`, boxed when there is any: reading an absent one reads an empty one,
/// changing it makes it.
#[derive(Debug, Clone, Default)]
pub struct Extended(Option<Box<ExtendedState>>);

impl Extended {
    /// Whether there is a state (boxed) now.
    pub fn is_made(&self) -> bool {
        self.0.is_some()
    }

    /// Let the state go if it is empty (an idle client's).
    pub fn release_if_empty(&mut self) {
        if self.0.as_deref().is_some_and(ExtendedState::is_empty) {
            self.0 = None;
        }
    }
}

impl std::ops::Deref for Extended {
    type Target = ExtendedState;
    fn deref(&self) -> &ExtendedState {
        static EMPTY: std::sync::LazyLock<ExtendedState> =
            std::sync::LazyLock::new(Default::default);
        self.0.as_deref().unwrap_or(&EMPTY)
    }
}

impl std::ops::DerefMut for Extended {
    fn deref_mut(&mut self) -> &mut ExtendedState {
        self.0.get_or_insert_with(Box::default)
    }
}

/// plan_once: the shared statement that serves the unnamed statement of `id`: while `id`
/// is the client's `unnamed_id`, its Bind and Close go to `stmt`.
#[derive(Debug, Clone)]
pub struct SharedUnnamed {
    pub id: u64,
    pub stmt: Arc<Stmt>,
    /// The session's parameters when `stmt` was found for the client's scope: while the
    /// session still has these (a change copies them, this clone being held), the scope
    /// is the same and the next Parse of the text needs no registry look-up.
    pub params: Arc<Params>,
    /// The client described the statement (`id` is 0 then): its text is parsed on the
    /// server at each Parse from now on, not served by `stmt` (a Describe of it is).
    pub described: bool,
}

/// Most portals kept that run `DEALLOCATE ALL` (a client binding more at once gets the
/// older ones' Executes not followed).
const MAX_DEALLOCATING_PORTALS: usize = 16;

/// Settings that decide what a statement's names refer to when it is parsed: the schemas
/// searched, and the role that `$user` and schema privileges follow (and one that changes
/// what `= NULL` means).
const NAME_SCOPE: [&str; 4] = [
    "search_path",
    "role",
    "session_authorization",
    "transform_null_equals",
];

/// Settings that decide what its literals say, fixed when it is parsed: a date, time or
/// interval written as a string, a backslash in a string.
const LITERAL_SCOPE: [&str; 4] = [
    "DateStyle",
    "IntervalStyle",
    "TimeZone",
    "standard_conforming_strings",
];

impl VirtualSession {
    /// The shared statement for a new client name (`scope` and `rest` as `statement_scope`
    /// and the registry take them), within the client's limit (`max`:
    /// client_max_statements) and the registry's. Beyond them: why, which ends the client
    /// (53400).
    pub fn intern(
        &self,
        registry: &crate::statements::StatementRegistry,
        max: usize,
        (scope, rest): (&[u8], &[u8]),
        depends: Option<Arc<Stmt>>,
    ) -> Result<Arc<Stmt>, String> {
        if self.statements.len() >= max {
            return Err(format!(
                "too many prepared statements: client_max_statements is {max}"
            ));
        }
        registry
            .intern_with(scope, rest, depends)
            .map_err(|e| format!("cannot keep another prepared statement: {e}"))
    }

    /// What a statement's meaning depends on in this session besides its text
    /// (`parse_rest`: a Parse's text, NUL, parameter types, or a SQL PREPARE's key): the pool (database, user, so server), the
    /// settings that resolve its names and, when it has string literals, those that read
    /// them. PostgreSQL keeps a statement as it was parsed (it analyses it again under a
    /// changed search_path, but with the parameter types and result columns of its first
    /// parse): clients share a server statement only when it would mean the same to each.
    /// Whether a statement's scope may change with this setting.
    pub fn scope_depends_on(name: &str) -> bool {
        NAME_SCOPE
            .iter()
            .chain(&LITERAL_SCOPE)
            .any(|n| n.eq_ignore_ascii_case(name))
    }

    pub fn statement_scope(&self, parse_rest: &[u8]) -> Vec<u8> {
        let mut scope = self.pool_scope.to_vec();
        let mut add = |names: &[&str]| {
            for name in names {
                let v = self.params.get(name);
                scope.push(u8::from(v.is_some()));
                let v = v.unwrap_or_default().as_bytes();
                scope.extend_from_slice(&(v.len() as u32).to_be_bytes());
                scope.extend_from_slice(v);
            }
        };
        add(&NAME_SCOPE);
        // (The parameter types after the text are looked at too: at worst a statement is
        // shared less.)
        if has_literal(parse_rest) {
            add(&LITERAL_SCOPE);
        }
        scope
    }

    /// The search_path a statement of this scope (`Stmt::scope`, made by
    /// `statement_scope`) was parsed under: Some(None) when the session had none of its own.
    pub fn scoped_search_path(&self, scope: &[u8]) -> Option<Option<String>> {
        // Parsed after a change of its scope (`statements::unshared_scope`): followed by
        // the session's scope when its search_path was not among the changes.
        let scope = match scope.strip_prefix(crate::statements::UNSHARED) {
            Some(own) => own.get(8..).filter(|s| !s.is_empty())?,
            None => scope,
        };
        // (`NAME_SCOPE` begins with search_path: present, length, value.)
        let rest = scope.get(self.pool_scope.len()..)?;
        let present = *rest.first()? != 0;
        let len = u32::from_be_bytes(rest.get(1..5)?.try_into().ok()?) as usize;
        let value = std::str::from_utf8(rest.get(5..5 + len)?).ok()?;
        Some(present.then(|| value.to_string()))
    }

    /// RESET ALL: the servers' defaults (`server_params`) overlaid with the startup packet's.
    pub fn reset_all(&mut self, server_params: &Params) {
        let mut p = Params::default();
        for (k, v) in server_params.iter() {
            if !crate::server::sync::is_read_only(k) {
                p.set(k, v);
            }
        }
        for (k, v) in self.startup.iter() {
            p.set(k, v);
        }
        self.params = Arc::new(p);
    }

    /// Record the pin reasons found after a transaction (empty: unpinned), keeping the
    /// pool's pinned-client count and the client's SHOW info current. A new pin must have
    /// been granted by `Pool::pin` first; leaving one gives it back.
    pub fn set_pin(&mut self, pool: &Pool, handle: &ClientHandle, reasons: Vec<&'static str>) {
        let was = self.pin.is_some();
        let now = !reasons.is_empty();
        let old: &[&str] = self.pin.as_deref().unwrap_or(&[]);
        for (i, r) in crate::server::sync::PIN_REASONS.iter().enumerate() {
            match (old.contains(r), reasons.contains(r)) {
                (false, true) => pool.stats.pins[i].fetch_add(1, Ordering::Relaxed),
                (true, false) => pool.stats.pins[i].fetch_sub(1, Ordering::Relaxed),
                _ => 0,
            };
        }
        if now && !was {
            pool.stats.pinned_clients.fetch_add(1, Ordering::Relaxed);
            client_event!(info, handle, reasons = ?reasons, "client pinned to its server");
        } else if was && !now {
            pool.stats.pinned_clients.fetch_sub(1, Ordering::Relaxed);
            pool.unpin();
            client_event!(debug, handle, "client unpinned");
        }
        handle.set_pin(now.then(|| reasons.join(", ")));
        self.pin = now.then_some(reasons);
    }

    /// A ParameterStatus from the server while it ran this client's work.
    pub fn observe_parameter(&mut self, name: &str, value: &str) {
        // default_transaction_read_only is also how a server says it is being demoted
        // (a reload of its config): that is the server's, not the client's session; a
        // client's own SET of it is read back after its transaction.
        if !crate::server::sync::is_read_only(name) && !crate::server::sync::is_server_role(name) {
            self.set_param(name, value);
        }
    }

    /// Set one parameter (copying the shared set only when the value changes).
    pub fn set_param(&mut self, name: &str, value: &str) {
        if self.params.get(name) != Some(value) {
            Arc::make_mut(&mut self.params).set(name, value);
        }
    }

    /// A statement name just parsed (not bound yet). Names closed before they were bound
    /// leave the set when it outgrows the statements.
    pub fn parsed_name(&mut self, name: Bytes, generation: u64) {
        self.ext.unbound.insert(name, generation);
        if self.ext.unbound.len() > self.statements.len() + 16 {
            let statements = &self.statements;
            self.ext.unbound.retain(|n, _| statements.contains_key(n));
        }
    }

    /// The client's Parse of the unnamed statement (`rest`: the body after the name).
    pub fn parsed_unnamed(&mut self, rest: &[u8]) -> u64 {
        if self.ext.unnamed.as_deref() != Some(rest) {
            self.ext.unnamed = Some(bytes::Bytes::copy_from_slice(rest));
            self.ext.unnamed_text_facts = Default::default();
        }
        self.ext.unnamed_id = crate::statements::next_unnamed_id();
        self.ext.unnamed_id
    }

    /// A statement name parsed and not bound yet is bound or described now: its Parse's
    /// count of schema changes, if it was one. (Looked at first: a client without
    /// extended-protocol state gets none made for this.)
    pub fn take_unbound(&mut self, name: &[u8]) -> Option<u64> {
        if !self.ext.unbound.contains_key(name) {
            return None;
        }
        self.ext.unbound.remove(name)
    }

    /// A Bind of `portal` to a statement whose transaction control does `tx` (None: it has
    /// none), and whose text is `DEALLOCATE ALL` when `deallocates`. What it changes is
    /// looked at first: a Bind that changes nothing makes no extended-protocol state (the
    /// usual Bind of a named statement, every transaction).
    pub fn bound(&mut self, portal: &[u8], tx: Option<[u8; 3]>, deallocates: bool) {
        match tx {
            Some(e) => self.ext.tx_portal = Some((Bytes::copy_from_slice(portal), e)),
            None => {
                if self.ext.tx_portal.as_ref().is_some_and(|p| p.0 == portal) {
                    self.ext.tx_portal = None;
                }
            }
        }
        if self.ext.discard_portal.as_deref() == Some(portal) {
            self.ext.discard_portal = None;
        }
        if !deallocates && self.ext.deallocating_portals.is_empty() {
            return;
        }
        let portals = &mut self.ext.deallocating_portals;
        portals.retain(|p| p != portal);
        if deallocates && portals.len() < MAX_DEALLOCATING_PORTALS {
            portals.push(Bytes::copy_from_slice(portal));
        }
    }

    /// A Bind of `portal` to a statement whose text (`Some`, its Parse body after the name)
    /// is a LISTEN or UNLISTEN: noted for its Execute (`listen_portal`).
    pub fn bound_listen(&mut self, portal: &[u8], listen: Option<&Bytes>) {
        match listen {
            Some(text) => {
                self.ext.listen_portal = Some((Bytes::copy_from_slice(portal), text.clone()));
            }
            None => {
                if self
                    .ext
                    .listen_portal
                    .as_ref()
                    .is_some_and(|p| p.0 == portal)
                {
                    self.ext.listen_portal = None;
                }
            }
        }
    }

    /// An Execute of `portal` was sent: the LISTEN or UNLISTEN text it runs, if it was
    /// bound to one.
    pub fn executed_listen(&mut self, portal: &[u8]) -> Option<Bytes> {
        self.ext.listen_portal.as_ref().filter(|p| p.0 == portal)?;
        self.ext.listen_portal.take().map(|p| p.1)
    }

    /// An Execute of `portal` was sent: what it does to the transaction status, if its
    /// statement is transaction control.
    pub fn executed(&mut self, portal: &[u8]) -> Option<[u8; 3]> {
        self.ext.tx_portal.as_ref().filter(|p| p.0 == portal)?;
        let e = self.ext.tx_portal.take()?;
        Some(e.1)
    }

    /// The unnamed statement and its id, for `Undo::Unnamed`.
    pub fn unnamed_before(&self) -> Option<(Bytes, u64)> {
        self.ext.unnamed.clone().map(|u| (u, self.ext.unnamed_id))
    }

    /// A change to the statements made when a message was sent is undone: the server
    /// failed or skipped the message (PostgreSQL never made the change).
    pub fn undo(&mut self, u: Undo) {
        match u {
            Undo::Name(name, stmt, _) if name.is_empty() => {
                // A Parse of the unnamed statement served by a shared one failed: as
                // PostgreSQL's, the client has no unnamed statement any more.
                if self.shared_unnamed().is_some_and(|s| Arc::ptr_eq(s, &stmt)) {
                    self.drop_unnamed();
                }
            }
            Undo::Name(name, ..) => {
                self.statements.remove(&name);
            }
            Undo::Closed(name, stmt) => {
                self.statements.entry(name).or_insert(stmt);
            }
            Undo::Unnamed { was, now } if now == self.ext.unnamed_id => match was {
                Some((rest, id)) => {
                    if self.ext.unnamed.as_ref() != Some(&rest) {
                        self.ext.unnamed_text_facts = Default::default();
                    }
                    self.ext.unnamed = Some(rest);
                    self.ext.unnamed_id = id;
                }
                None => self.drop_unnamed(),
            },
            Undo::Unnamed { .. } => {}
        }
    }

    /// The shared statement that serves the client's current unnamed statement
    /// (plan_once), if one does.
    pub fn shared_unnamed(&self) -> Option<&Arc<Stmt>> {
        match &self.ext.unnamed_shared {
            Some(s) if s.id == self.ext.unnamed_id && s.id != 0 => Some(&s.stmt),
            _ => None,
        }
    }

    /// The unnamed statement is gone (a simple Query, Close, a failed Parse).
    pub fn drop_unnamed(&mut self) {
        // Looked at first: a simple Query of a client with no extended-protocol state
        // makes none.
        if self.ext.unnamed.is_some() || self.ext.unnamed_id != 0 {
            self.ext.unnamed = None;
            self.ext.unnamed_text_facts = Default::default();
            self.ext.unnamed_id = 0;
        }
    }

    /// What the relay needs of the unnamed statement's text (None: the client has none),
    /// found once per text: a client that parses the same text each transaction, and
    /// binds it, has it looked at once.
    pub fn unnamed_facts(&self) -> Option<crate::sql::facts::TextFacts> {
        let rest = self.ext.unnamed.as_deref()?;
        Some(*self.ext.unnamed_text_facts.get_or_init(|| {
            let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
            crate::sql::facts::TextFacts::of(&rest[..end])
        }))
    }

    /// What running the unnamed statement again (a Bind of it) does to the session, when
    /// its text may do anything (`classify::may_matter`, found once per text).
    pub fn unnamed_effects(&self) -> Option<crate::sql::classify::Effects> {
        if !self.unnamed_facts()?.may_matter {
            return None;
        }
        let rest = self.ext.unnamed.as_deref()?;
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        Some(crate::sql::classify::classify(&rest[..end]))
    }

    pub fn remove_param(&mut self, name: &str) {
        if self.params.get(name).is_some() {
            Arc::make_mut(&mut self.params).remove(name);
        }
    }
}

/// The start of the statement scopes of a pool's clients: its database and user (so its
/// servers' database, host and login role).
pub fn pool_scope(pool: &Pool) -> Bytes {
    pool.scope.clone()
}

/// Whether a statement's text may hold a string constant: a quote, or a `$` that is not a
/// parameter's (`$tag$…$tag$`).
fn has_literal(sql: &[u8]) -> bool {
    sql.iter()
        .enumerate()
        .any(|(i, &b)| b == b'\'' || (b == b'$' && !sql.get(i + 1).is_some_and(u8::is_ascii_digit)))
}

/// The name PostgreSQL reports for an encoding a client named (it ignores case and
/// punctuation, and knows a few aliases); names it does not know are only upper-cased
/// (PostgreSQL refuses them when the setting is applied).
pub fn canonical_encoding(name: &str) -> String {
    let clean: String = name
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    let canonical = match clean.as_str() {
        "utf8" | "unicode" => "UTF8",
        "sqlascii" => "SQL_ASCII",
        "latin1" | "iso88591" => "LATIN1",
        "latin2" | "iso88592" => "LATIN2",
        "latin9" | "iso885915" => "LATIN9",
        "win1252" | "windows1252" => "WIN1252",
        "win1251" | "windows1251" => "WIN1251",
        "win1250" | "windows1250" => "WIN1250",
        "eucjp" => "EUC_JP",
        "euckr" => "EUC_KR",
        "euccn" => "EUC_CN",
        "sjis" | "shiftjis" | "mskanji" => "SJIS",
        "big5" => "BIG5",
        "gbk" => "GBK",
        "gb18030" => "GB18030",
        "koi8r" | "koi8" => "KOI8R",
        _ => return name.to_ascii_uppercase(),
    };
    canonical.to_string()
}

#[cfg(test)]
mod tests {
    use super::{VirtualSession, canonical_encoding};

    /// The facts of the unnamed statement's text follow its text: found once, found again
    /// for another text, gone with it.
    #[test]
    fn unnamed_facts_follow_the_unnamed_text() {
        let mut s = VirtualSession::default();
        assert_eq!(s.unnamed_facts(), None);
        s.parsed_unnamed(b"select 1\0\0\0");
        let f = s.unnamed_facts().unwrap();
        assert!(
            f.plans_once && f.control == (false, false) && f.tx.is_none(),
            "{f:?}"
        );
        s.parsed_unnamed(b"select 1\0\0\0");
        assert_eq!(s.unnamed_facts(), Some(f));
        s.parsed_unnamed(b"commit\0\0\0");
        let f = s.unnamed_facts().unwrap();
        assert!(!f.plans_once && f.control == (false, true), "{f:?}");
        s.drop_unnamed();
        assert_eq!(s.unnamed_facts(), None);
        s.parsed_unnamed(b"begin\0\0\0");
        let f = s.unnamed_facts().unwrap();
        assert_eq!((f.control, f.tx), ((true, false), Some(*b"TTE")));
    }

    /// What the relay does to the session for a simple Query, and for a Bind and Execute
    /// of a named statement, makes no extended-protocol state: a client of the simple
    /// protocol or of named statements does not allocate and free it every transaction.
    #[test]
    fn rounds_that_change_nothing_make_no_extended_state() {
        let mut s = VirtualSession::default();
        for _ in 0..3 {
            s.drop_unnamed(); // a simple Query
            assert_eq!(s.take_unbound(b"S_1"), None); // a Bind of a named statement
            s.bound(b"", None, false);
            assert_eq!(s.executed(b""), None);
        }
        assert!(!s.ext.is_made());
        // A Parse makes it; once the statement is bound and the unnamed one gone, the idle
        // wait lets it go.
        s.parsed_name(bytes::Bytes::from_static(b"S_1"), 7);
        assert!(s.ext.is_made());
        assert_eq!(s.take_unbound(b"S_1"), Some(7));
        s.ext.release_if_empty();
        assert!(!s.ext.is_made());
        s.parsed_unnamed(b"select 1\0\0\0");
        s.ext.release_if_empty();
        assert!(
            s.ext.is_made(),
            "the unnamed statement is the client's until dropped"
        );
        s.drop_unnamed();
        s.ext.release_if_empty();
        assert!(!s.ext.is_made());
    }
    use crate::server::Params;
    use std::sync::Arc;

    fn session(pool: &str, params: &[(&str, &str)]) -> VirtualSession {
        let mut p = Params::default();
        for (k, v) in params {
            p.set(k, v);
        }
        VirtualSession {
            params: Arc::new(p),
            pool_scope: bytes::Bytes::copy_from_slice(pool.as_bytes()),
            ..Default::default()
        }
    }

    #[test]
    fn a_statement_scope_holds_what_its_meaning_depends_on() {
        let text = b"select * from t where d = $1\0\0\0";
        let dated = b"select date '1/2/2024'\0\0\0";
        let base = session(
            "db\0u\0",
            &[("search_path", "a"), ("DateStyle", "ISO, MDY")],
        );
        let scope = |s: &VirtualSession, t: &[u8]| s.statement_scope(t);
        // Another search_path, role, session user or pool: another scope.
        for other in [
            session(
                "db\0u\0",
                &[("search_path", "b"), ("DateStyle", "ISO, MDY")],
            ),
            session("db\0u\0", &[("DateStyle", "ISO, MDY")]),
            session(
                "db\0u\0",
                &[
                    ("search_path", "a"),
                    ("DateStyle", "ISO, MDY"),
                    ("role", "r"),
                ],
            ),
            session(
                "db\0u\0",
                &[
                    ("search_path", "a"),
                    ("DateStyle", "ISO, MDY"),
                    ("session_authorization", "s"),
                ],
            ),
            session(
                "db2\0u\0",
                &[("search_path", "a"), ("DateStyle", "ISO, MDY")],
            ),
        ] {
            assert_ne!(
                scope(&base, text),
                scope(&other, text),
                "{:?}",
                other.params
            );
        }
        // DateStyle matters to a text with a string literal only.
        let dmy = session(
            "db\0u\0",
            &[("search_path", "a"), ("DateStyle", "ISO, DMY")],
        );
        assert_eq!(scope(&base, text), scope(&dmy, text));
        assert_ne!(scope(&base, dated), scope(&dmy, dated));
        let dollar = b"select $x$1/2/2024$x$::date\0\0\0";
        assert_ne!(scope(&base, dollar), scope(&dmy, dollar));
        // Other settings do not matter.
        let mut other = base.clone();
        other.set_param("application_name", "x");
        assert_eq!(scope(&base, dated), scope(&other, dated));
    }

    #[test]
    fn encodings_are_named_as_postgresql_reports_them() {
        for (given, reported) in [
            ("utf8", "UTF8"),
            ("UTF-8", "UTF8"),
            ("Unicode", "UTF8"),
            ("latin1", "LATIN1"),
            ("ISO-8859-1", "LATIN1"),
            ("sql_ascii", "SQL_ASCII"),
            ("euc_jp", "EUC_JP"),
            ("win1252", "WIN1252"),
        ] {
            assert_eq!(canonical_encoding(given), reported, "{given}");
        }
    }
}
