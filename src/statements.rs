//! Prepared statements shared across servers: a client's statement name maps to a
//! statement key (the scope it was parsed in, query text + parameter types), and each key
//! has one server-side name (which servers hold which: `server::prepared`).
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;

use crate::lock::Locked;
use crate::sql::classify::{self, Effects};

/// One distinct statement (query text + parameter types, parsed in one scope), shared by
/// every client using it. It lives while a client names it or a server holds it; then its
/// registry entry goes.
#[derive(Debug)]
pub struct Stmt {
    pub id: u64,
    /// The name servers know it by (no NUL).
    pub server_name: Bytes,
    /// The Parse body after the statement name: query, NUL, parameter count and types.
    pub parse_rest: Bytes,
    /// The registry's key: the scope's length (u32), the scope, then `parse_rest` (which is
    /// a slice of it).
    key: Bytes,
    /// What running it does to a session (None: nothing pgcarpool tracks).
    pub effects: Option<Box<Effects>>,
    /// A server accepted its Parse once: a client's Parse of it can be answered without one.
    validated: AtomicBool,
    /// What a server's Describe of it said (`Server::prepare` asks once): `Some(params)`,
    /// it returns no rows (NoData) and `params` is its ParameterDescription's body; `None`,
    /// it returns rows. The same on every server for the same text and scope, and what a
    /// Describe of it inside a failed transaction block is answered with where the server
    /// does not hold it (PostgreSQL describes a statement without a result there; it
    /// cannot be parsed there). At most 4 bytes a parameter.
    description: std::sync::OnceLock<Option<Bytes>>,
    /// What its text does to the transaction, found once (`control`, `tx_effect`).
    text_facts: std::sync::OnceLock<TextFacts>,
    /// The registry's generation when it was made: a Parse in a later generation gets a
    /// statement of its own (parsed anew on the servers).
    generation: u64,
    /// Where its entry is, to remove it when the statement is gone.
    registry: Weak<Mutex<RegistryInner>>,
    /// A statement its text runs (SQL `EXECUTE "PGCARPOOL_n"` mapped from a client's name):
    /// it must be on a server before this one is parsed or bound there.
    pub depends: Option<Arc<Stmt>>,
}

/// What a statement's text does to the transaction (`Stmt::text_facts`).
#[derive(Debug)]
struct TextFacts {
    control: (bool, bool),
    tx: Option<[u8; 3]>,
}

/// How the registry keys a statement made by SQL PREPARE: this, then the text after the
/// statement's name.
pub const SQL_PREPARE_KEY: &[u8] = b"\0PREPARE ";

impl Stmt {
    /// What running it may do to the transaction (`classify::transaction_control` of its
    /// text up to the NUL): found once for every client that binds it.
    pub fn control(&self) -> (bool, bool) {
        self.text_facts().control
    }

    /// `classify::tx_effect` of its text: what each run of it does to the transaction
    /// status, found once.
    pub fn tx_effect(&self) -> Option<[u8; 3]> {
        self.text_facts().tx
    }

    fn text_facts(&self) -> &TextFacts {
        self.text_facts.get_or_init(|| {
            let rest = &self.parse_rest[..];
            let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
            TextFacts {
                control: classify::transaction_control(&rest[..end]),
                tx: classify::tx_effect(&rest[..end]),
            }
        })
    }

    /// Made by SQL PREPARE (prepared on servers by SQL, not by a Parse).
    pub fn is_sql_prepared(&self) -> bool {
        self.parse_rest.starts_with(SQL_PREPARE_KEY)
    }

    /// The query that prepares a SQL PREPARE statement on a server; it is also what the
    /// server's pg_prepared_statements shows as its text.
    pub fn sql_prepare_text(&self) -> String {
        format!(
            "PREPARE \"{}\" {}",
            String::from_utf8_lossy(&self.server_name),
            String::from_utf8_lossy(&self.parse_rest[SQL_PREPARE_KEY.len()..])
        )
    }

    pub fn is_validated(&self) -> bool {
        self.validated.load(Ordering::Relaxed)
    }
    pub fn set_validated(&self) {
        self.validated.store(true, Ordering::Relaxed);
    }

    /// Has a server described it (`Stmt::description`)?
    pub fn is_described(&self) -> bool {
        self.description.get().is_some()
    }
    /// A server described it: `Some(params)`, its ParameterDescription's body and NoData;
    /// `None`, it returns rows. The first description stays.
    pub fn set_description(&self, no_rows_params: Option<Bytes>) {
        let _ = self.description.set(no_rows_params);
    }
    /// The body of its ParameterDescription, when a server described it as returning no
    /// rows.
    pub fn no_rows_params(&self) -> Option<&Bytes> {
        self.description.get()?.as_ref()
    }

    /// What the meaning of its text depended on when it was parsed
    /// (`VirtualSession::statement_scope`).
    pub fn scope(&self) -> &[u8] {
        &self.key[4..self.key.len() - self.parse_rest.len()]
    }

    /// Bytes it keeps (its key, names and bookkeeping), as counted by the registry.
    fn size(&self) -> usize {
        self.key.len() + self.server_name.len() + ENTRY_OVERHEAD
    }
}

/// The registry's key of a text parsed in `scope`: the scope's length, the scope, the text.
fn registry_key(scope: &[u8], parse_rest: &[u8]) -> Bytes {
    let mut k = Vec::with_capacity(4 + scope.len() + parse_rest.len());
    k.extend_from_slice(&(scope.len() as u32).to_be_bytes());
    k.extend_from_slice(scope);
    k.extend_from_slice(parse_rest);
    Bytes::from(k)
}

/// How every unshared scope (`unshared_scope`) starts.
pub const UNSHARED: &[u8] = b"\xffunshared ";

/// A scope no other Parse has: its statement is shared with no one (the client's settings
/// at its Parse are not known, see `Relay::statement_scope`).
pub fn unshared_scope() -> Vec<u8> {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let mut s = UNSHARED.to_vec();
    s.extend_from_slice(&NEXT.fetch_add(1, Ordering::Relaxed).to_be_bytes());
    s
}

/// Bookkeeping per statement beyond its text (the Stmt, its map entry and key).
const ENTRY_OVERHEAD: usize = 160;

impl Drop for Stmt {
    fn drop(&mut self) {
        let Some(inner) = self.registry.upgrade() else {
            return;
        };
        let mut g = inner.locked();
        g.bytes = g.bytes.saturating_sub(self.size());
        // The entry is this statement's unless a newer one of the same text replaced it.
        if g.by_key
            .get(&self.key)
            .is_some_and(|w| w.strong_count() == 0)
        {
            g.by_key.remove(&self.key);
        }
    }
}

/// Why a statement cannot be registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RegistryFull {
    #[error("the statements of all clients take statement_registry_size ({0} bytes)")]
    Bytes(usize),
}

/// Interns statements by key: one shared statement per text and scope, found in O(1). A
/// statement's meaning depends on the session it is parsed in (the search_path and roles
/// that name resolution follows, the settings that read its literals), so clients share
/// one only when they parse it in the same scope. An entry goes
/// as soon as no client names its statement and no server holds it; the bytes of the live
/// statements are bounded (statement_registry_size).
pub struct StatementRegistry {
    inner: Arc<Mutex<RegistryInner>>,
    /// Bumped when a schema may have changed: statements of older generations are not
    /// handed to new Parses (a client's Parse behaves as a fresh parse).
    generation: AtomicU64,
    /// Most bytes the live statements may take (0: no bound).
    max_bytes: AtomicUsize,
    /// See `changes_seen`.
    changes_seen: AtomicU64,
}

#[derive(Debug)]
struct RegistryInner {
    by_key: HashMap<Bytes, Weak<Stmt>>,
    next_id: u64,
    /// Bytes of the live statements (`Stmt::size`).
    bytes: usize,
}

impl Default for StatementRegistry {
    fn default() -> Self {
        Self::with_max_bytes(0)
    }
}

impl StatementRegistry {
    pub fn with_max_bytes(max_bytes: usize) -> Self {
        StatementRegistry {
            inner: Arc::new(Mutex::new(RegistryInner {
                by_key: HashMap::new(),
                next_id: 1,
                bytes: 0,
            })),
            generation: AtomicU64::new(0),
            max_bytes: AtomicUsize::new(max_bytes),
            changes_seen: AtomicU64::new(0),
        }
    }

    /// Set the bound on the bytes of live statements (0: none); on reload.
    pub fn set_max_bytes(&self, max_bytes: usize) {
        self.max_bytes.store(max_bytes, Ordering::Relaxed);
    }

    /// Counts schema changes seen in clients' SQL (DDL, DO, CALL): a statement parsed since
    /// the last one did not see a change pgcarpool knows of.
    pub fn changes_seen(&self) -> u64 {
        self.changes_seen.load(Ordering::Relaxed)
    }

    /// A schema change seen in a client's SQL: statements parsed before it are stale.
    pub fn schema_changed(&self) {
        self.changes_seen.fetch_add(1, Ordering::Relaxed);
        self.bump_generation();
    }

    /// A schema may have changed (DDL seen, DO/CALL run, a server reported a stale plan):
    /// statements interned so far are used only by the clients that already named them.
    pub fn bump_generation(&self) {
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    /// Is `stmt` of the current generation (what a Parse of its text in its scope gets)?
    pub fn is_current(&self, stmt: &Stmt) -> bool {
        stmt.generation == self.generation.load(Ordering::Relaxed)
    }

    /// The statement for this Parse body tail (query + types) parsed in `scope`
    /// (`VirtualSession::statement_scope`).
    pub fn intern(&self, scope: &[u8], parse_rest: &[u8]) -> Result<Arc<Stmt>, RegistryFull> {
        self.intern_with(scope, parse_rest, None)
    }

    /// As `intern`, for a text that runs `depends` (the same text always does).
    pub fn intern_with(
        &self,
        scope: &[u8],
        parse_rest: &[u8],
        depends: Option<Arc<Stmt>>,
    ) -> Result<Arc<Stmt>, RegistryFull> {
        let key = registry_key(scope, parse_rest);
        let generation = self.generation.load(Ordering::Relaxed);
        let max = self.max_bytes.load(Ordering::Relaxed);
        let mut g = self.inner.locked();
        // A statement found dead or of an older generation is dropped after the lock is
        // released (its Drop takes the lock).
        let found = g.by_key.get(&key).and_then(Weak::upgrade);
        if let Some(s) = &found
            && s.generation == generation
        {
            return Ok(s.clone());
        }
        let size = key.len() + 24 + ENTRY_OVERHEAD;
        if max > 0 && g.bytes + size > max {
            drop(g);
            drop(found);
            return Err(RegistryFull::Bytes(max));
        }
        let id = g.next_id;
        g.next_id += 1;
        let s = Arc::new(Stmt {
            id,
            server_name: Bytes::from(format!("{}{id}", classify::INTERNAL_PREFIX)),
            parse_rest: key.slice(key.len() - parse_rest.len()..),
            key: key.clone(),
            effects: statement_effects(parse_rest),
            validated: AtomicBool::new(false),
            description: std::sync::OnceLock::new(),
            text_facts: std::sync::OnceLock::new(),
            generation,
            registry: Arc::downgrade(&self.inner),
            depends,
        });
        g.bytes += s.size();
        g.by_key.insert(key, Arc::downgrade(&s));
        drop(g);
        drop(found);
        Ok(s)
    }

    /// The statement for this text parsed in `scope`, if known.
    pub fn lookup(&self, scope: &[u8], parse_rest: &[u8]) -> Option<Arc<Stmt>> {
        let key = registry_key(scope, parse_rest);
        let generation = self.generation.load(Ordering::Relaxed);
        let g = self.inner.locked();
        let found = g.by_key.get(&key).and_then(Weak::upgrade);
        drop(g);
        found.filter(|s| s.generation == generation)
    }

    /// Live statements.
    pub fn len(&self) -> usize {
        self.inner.locked().by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the live statements take.
    pub fn bytes(&self) -> usize {
        self.inner.locked().bytes
    }
}

fn statement_effects(parse_rest: &[u8]) -> Option<Box<Effects>> {
    let sql = crate::proto::Reader::new(parse_rest, "Parse")
        .cstr_bytes()
        .ok()?;
    if !classify::may_matter(sql) {
        return None;
    }
    let e = classify::classify(sql);
    (!e.is_empty()).then(|| Box::new(e))
}

/// Ids of unnamed statements: a client's current unnamed statement is on a server when the
/// server's `unnamed` equals the session's (0: none).
pub fn next_unnamed_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a statement's text does to the transaction, as the classifier says, for every
    /// client that binds it.
    #[test]
    fn a_statement_knows_what_its_text_does_to_the_transaction() {
        let r = StatementRegistry::default();
        for (text, control, tx) in [
            (&b"select 1\0\0\0"[..], (false, false), None),
            (b"BEGIN\0\0\0", (true, false), Some(*b"TTE")),
            (b"commit\0\0\0", (false, true), Some(*b"III")),
        ] {
            let s = r.intern(b"", text).unwrap();
            assert_eq!((s.control(), s.tx_effect()), (control, tx));
            assert_eq!((s.control(), s.tx_effect()), (control, tx));
        }
    }

    #[test]
    fn intern_shares_one_statement_per_key() {
        let r = StatementRegistry::default();
        let a = r.intern(b"", b"select 1\0\0\0").unwrap();
        let b = r.intern(b"", b"select 1\0\0\0").unwrap();
        let c = r.intern(b"", b"select 2\0\0\0").unwrap();
        assert_eq!(a.id, b.id);
        assert_ne!(a.id, c.id);
        assert_eq!(&a.server_name[..], format!("PGCARPOOL_{}", a.id).as_bytes());
    }

    #[test]
    fn a_text_parsed_in_another_scope_is_another_statement() {
        let r = StatementRegistry::default();
        let a = r.intern(b"path a", b"select * from t\0\0\0").unwrap();
        let b = r.intern(b"path b", b"select * from t\0\0\0").unwrap();
        assert_ne!(a.id, b.id);
        assert_eq!(a.scope(), b"path a");
        assert_eq!(&a.parse_rest[..], b"select * from t\0\0\0");
        assert_eq!(
            r.lookup(b"path b", b"select * from t\0\0\0").unwrap().id,
            b.id
        );
        assert!(r.lookup(b"path c", b"select * from t\0\0\0").is_none());
        // The scope's length is part of the key: no scope runs into the text.
        let c = r.intern(b"path a\0", b"\0select * from t\0\0").unwrap();
        assert_ne!(c.id, a.id);
        // An unshared scope is no other Parse's.
        let u1 = r
            .intern(&unshared_scope(), b"select * from t\0\0\0")
            .unwrap();
        let u2 = r
            .intern(&unshared_scope(), b"select * from t\0\0\0")
            .unwrap();
        assert_ne!(u1.id, u2.id);
        drop((a, b, c, u1, u2));
        assert_eq!((r.len(), r.bytes()), (0, 0));
    }

    #[test]
    fn a_sql_prepare_statement_is_prepared_by_sql_under_its_server_name() {
        let r = StatementRegistry::default();
        let mut key = SQL_PREPARE_KEY.to_vec();
        key.extend_from_slice(b"(int) AS select $1");
        let s = r.intern(b"", &key).unwrap();
        assert!(s.is_sql_prepared());
        assert_eq!(
            s.sql_prepare_text(),
            format!("PREPARE \"PGCARPOOL_{}\" (int) AS select $1", s.id)
        );
        let p = r.intern(b"", b"select 1\0\0\0").unwrap();
        assert!(!p.is_sql_prepared());
    }

    #[test]
    fn a_statement_is_validated_once_a_server_accepted_it() {
        let r = StatementRegistry::default();
        let s = r.intern(b"", b"select 1\0\0\0").unwrap();
        assert!(!s.is_validated());
        s.set_validated();
        assert!(s.is_validated());
    }

    #[test]
    fn bytes_count_text_server_name_and_overhead() {
        let r = StatementRegistry::default();
        let s = r.intern(b"", b"select 1\0\0\0").unwrap();
        let name = format!("PGCARPOOL_{}", s.id);
        // The key: the scope's length (4 bytes), the (empty) scope, the text.
        assert_eq!(r.bytes(), 4 + 11 + name.len() + ENTRY_OVERHEAD);
    }

    #[test]
    fn a_statement_that_just_fits_the_bound_is_registered() {
        let r = StatementRegistry::default();
        let a = r.intern(b"", &[b'a'; 40]).unwrap();
        // A new statement is counted as its key, 24 bytes of name and the overhead
        // until it exists.
        let max = r.bytes() + 4 + 100 + 24 + ENTRY_OVERHEAD;
        r.set_max_bytes(max);
        assert_eq!(
            r.intern(b"", &[b'c'; 101]).unwrap_err(),
            RegistryFull::Bytes(max)
        );
        let b = r.intern(b"", &[b'b'; 100]).unwrap();
        assert_ne!(a.id, b.id);
        // Back to no bound.
        r.set_max_bytes(0);
        assert!(r.intern(b"", &[b'd'; 10_000]).is_ok());
    }

    #[test]
    fn a_schema_change_is_counted_and_starts_a_generation() {
        let r = StatementRegistry::default();
        let old = r.intern(b"", b"a\0\0\0").unwrap();
        assert_eq!(r.changes_seen(), 0);
        r.schema_changed();
        r.schema_changed();
        assert_eq!(r.changes_seen(), 2);
        assert!(r.lookup(b"", b"a\0\0\0").is_none());
        assert_ne!(r.intern(b"", b"a\0\0\0").unwrap().id, old.id);
        // A generation bumped for another reason is not a change seen.
        r.bump_generation();
        assert_eq!(r.changes_seen(), 2);
    }

    #[test]
    fn a_statement_knows_what_it_does_to_a_session() {
        let r = StatementRegistry::default();
        assert!(r.is_empty());
        let set = r.intern(b"", b"SET search_path = a\0\0\0").unwrap();
        assert!(!r.is_empty());
        assert_eq!(set.effects.as_ref().unwrap().gucs, ["search_path"]);
        let select = r.intern(b"", b"select 1\0\0\0").unwrap();
        assert!(select.effects.is_none());
        // DDL, and a DO block that may run DDL.
        let alter = r.intern(b"", b"alter table t add x int\0\0\0").unwrap();
        assert!(alter.effects.as_ref().unwrap().ddl);
        let block = r.intern(b"", b"do $$ $$\0\0\0").unwrap();
        assert!(block.effects.as_ref().unwrap().ddl);
    }

    #[test]
    fn unnamed_statement_ids_are_distinct_and_not_zero() {
        let a = next_unnamed_id();
        let b = next_unnamed_id();
        assert!(a > 0);
        assert!(b > a);
    }

    #[test]
    fn entries_go_with_their_last_user() {
        let r = StatementRegistry::default();
        let kept = r.intern(b"", b"a\0\0\0").unwrap();
        drop(r.intern(b"", b"b\0\0\0").unwrap());
        assert_eq!(r.len(), 1);
        assert_eq!(r.bytes(), kept.size());
        assert_eq!(r.intern(b"", b"a\0\0\0").unwrap().id, kept.id);
        drop(kept);
        assert_eq!((r.len(), r.bytes()), (0, 0));
    }

    #[test]
    fn a_new_generation_gets_a_new_statement_and_keeps_the_old_one_alive() {
        let r = StatementRegistry::default();
        let old = r.intern(b"", b"a\0\0\0").unwrap();
        r.bump_generation();
        assert!(r.lookup(b"", b"a\0\0\0").is_none());
        let new = r.intern(b"", b"a\0\0\0").unwrap();
        assert_ne!(old.id, new.id);
        // The old one going does not take the new one's entry.
        drop(old);
        assert_eq!(r.lookup(b"", b"a\0\0\0").unwrap().id, new.id);
        assert_eq!(r.bytes(), new.size());
    }

    #[test]
    fn the_registry_is_bounded_in_bytes() {
        let r = StatementRegistry::with_max_bytes(1000);
        let a = r.intern(b"", &[b'x'; 500]).unwrap();
        assert_eq!(
            r.intern(b"", &[b'y'; 500]).unwrap_err(),
            RegistryFull::Bytes(1000)
        );
        // A statement already there is shared whatever the bound.
        assert_eq!(r.intern(b"", &[b'x'; 500]).unwrap().id, a.id);
        drop(a);
        assert!(r.intern(b"", &[b'y'; 500]).is_ok());
    }
}
