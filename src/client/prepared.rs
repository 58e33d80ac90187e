//! Prepared statements shared across servers: a client's statement name maps to a
//! statement key (query text + parameter types), each key has one server-side name, and each
//! server knows which keys it holds (LRU, bounded by max_prepared_statements).
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::classify::{self, Effects};

/// One distinct statement (query text + parameter types), shared by every client using it.
#[derive(Debug)]
pub struct Stmt {
    pub id: u64,
    /// The name servers know it by (no NUL).
    pub server_name: Bytes,
    /// The Parse body after the statement name: query, NUL, parameter count and types.
    pub parse_rest: Bytes,
    /// What running it does to a session (None: nothing pgcarpool tracks).
    pub effects: Option<Box<Effects>>,
    /// A server accepted its Parse once: a client's Parse of it can be answered without one.
    validated: AtomicBool,
    /// The registry's generation when it was made: a Parse in a later generation gets a
    /// statement of its own (parsed anew on the servers).
    generation: u64,
}

/// How the registry keys a statement made by SQL PREPARE: this, then the text after the
/// statement's name.
pub const SQL_PREPARE_KEY: &[u8] = b"\0PREPARE ";

impl Stmt {
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
}

/// Interns statements by key. Entries no client or server map uses are dropped when the
/// registry grows past its bound.
pub struct StatementRegistry {
    inner: Mutex<RegistryInner>,
    capacity: usize,
    /// Bumped when a schema may have changed: statements of older generations are not
    /// handed to new Parses (a client's Parse behaves as a fresh parse).
    generation: AtomicU64,
}

struct RegistryInner {
    by_key: HashMap<Bytes, Arc<Stmt>>,
    next_id: u64,
}

impl Default for StatementRegistry {
    fn default() -> Self {
        Self::with_capacity(100_000)
    }
}

impl StatementRegistry {
    pub fn with_capacity(capacity: usize) -> Self {
        StatementRegistry {
            inner: Mutex::new(RegistryInner {
                by_key: HashMap::new(),
                next_id: 1,
            }),
            capacity,
            generation: AtomicU64::new(0),
        }
    }

    /// A schema may have changed (DDL seen, DO/CALL run, a server reported a stale plan):
    /// statements interned so far are used only by the clients that already named them.
    pub fn bump_generation(&self) {
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    /// The statement for this Parse body tail (query + types).
    pub fn intern(&self, parse_rest: Bytes) -> Arc<Stmt> {
        let generation = self.generation.load(Ordering::Relaxed);
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = g.by_key.get(&parse_rest)
            && s.generation == generation
        {
            return s.clone();
        }
        if g.by_key.len() >= self.capacity {
            g.by_key.retain(|_, s| Arc::strong_count(s) > 1);
        }
        let id = g.next_id;
        g.next_id += 1;
        let s = Arc::new(Stmt {
            id,
            server_name: Bytes::from(format!("PGCARPOOL_{id}")),
            parse_rest: parse_rest.clone(),
            effects: statement_effects(&parse_rest),
            validated: AtomicBool::new(false),
            generation,
        });
        g.by_key.insert(parse_rest, s.clone());
        s
    }

    /// The statement for this key, if known.
    pub fn lookup(&self, parse_rest: &[u8]) -> Option<Arc<Stmt>> {
        let generation = self.generation.load(Ordering::Relaxed);
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_key
            .get(parse_rest)
            .filter(|s| s.generation == generation)
            .cloned()
    }

    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_key
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
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

/// The statements one server holds, by statement id, with a use tick for LRU eviction.
#[derive(Debug, Default)]
pub struct PreparedSet {
    held: HashMap<u64, (u64, Arc<Stmt>)>,
    tick: u64,
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
        self.held.insert(s.id, (self.tick, s));
    }

    pub fn remove(&mut self, id: u64) {
        self.held.remove(&id);
    }

    /// The least recently used statement, to close when the set is full.
    pub fn evict_lru(&mut self) -> Option<Arc<Stmt>> {
        let id = self
            .held
            .iter()
            .min_by_key(|(_, (t, _))| *t)
            .map(|(id, _)| *id)?;
        self.held.remove(&id).map(|(_, s)| s)
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    pub fn clear(&mut self) {
        self.held.clear();
    }

    pub fn get(&self, id: u64) -> Option<&Arc<Stmt>> {
        self.held.get(&id).map(|(_, s)| s)
    }

    pub fn ids(&self) -> Vec<u64> {
        self.held.keys().copied().collect()
    }
}

/// A response the server owes for a message sent, or one pgcarpool answers itself, in order.
#[derive(Debug)]
pub enum Pending {
    /// ParseComplete; `swallow` for a Parse we added; `stmt` marks a named statement, `None`
    /// the unnamed one.
    Parse {
        swallow: bool,
        stmt: Option<Arc<Stmt>>,
    },
    /// A message pgcarpool refused: a probe sent in its place makes the server fail (so the
    /// server skips to the next Sync, or aborts a transaction block, as PostgreSQL would
    /// have); its error is replaced by this one (SQLSTATE, message).
    Fail(Box<(&'static str, String)>),
    Bind,
    /// Describe: ends with RowDescription or NoData.
    Describe,
    /// Execute: ends with CommandComplete, EmptyQueryResponse or PortalSuspended.
    Execute,
    Close {
        swallow: bool,
    },
    /// Sync, Query or FunctionCall: ends with ReadyForQuery. A query that is a SQL PREPARE
    /// carries its statement and the client's name for it: the name is the client's once
    /// the query succeeded; the server forgets the statement if it fails.
    Ready(Option<Box<(Arc<Stmt>, Bytes)>>),
    /// A query pgcarpool added: every reply up to its ReadyForQuery is dropped.
    Swallow,
    /// Answered by pgcarpool when it reaches the front.
    Answer(Answer),
}

/// Ids of unnamed statements: a client's current unnamed statement is on a server when the
/// server's `unnamed` equals the session's (0: none).
pub fn next_unnamed_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    ParseComplete,
    CloseComplete,
    /// A whole simple query answered here: CommandComplete with this tag, ReadyForQuery.
    Query(&'static str),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intern_shares_one_statement_per_key() {
        let r = StatementRegistry::default();
        let a = r.intern(Bytes::from_static(b"select 1\0\0\0"));
        let b = r.intern(Bytes::from_static(b"select 1\0\0\0"));
        let c = r.intern(Bytes::from_static(b"select 2\0\0\0"));
        assert_eq!(a.id, b.id);
        assert_ne!(a.id, c.id);
        assert_eq!(&a.server_name[..], format!("PGCARPOOL_{}", a.id).as_bytes());
    }

    #[test]
    fn registry_drops_unused_entries_when_full() {
        let r = StatementRegistry::with_capacity(2);
        let kept = r.intern(Bytes::from_static(b"a\0\0\0"));
        drop(r.intern(Bytes::from_static(b"b\0\0\0")));
        let _c = r.intern(Bytes::from_static(b"c\0\0\0"));
        assert_eq!(r.len(), 2);
        assert_eq!(r.intern(Bytes::from_static(b"a\0\0\0")).id, kept.id);
    }

    #[test]
    fn lru_evicts_least_recently_used() {
        let r = StatementRegistry::default();
        let mut set = PreparedSet::default();
        let a = r.intern(Bytes::from_static(b"a\0\0\0"));
        let b = r.intern(Bytes::from_static(b"b\0\0\0"));
        set.insert(a.clone());
        set.insert(b.clone());
        assert!(set.touch(a.id));
        assert_eq!(set.evict_lru().unwrap().id, b.id);
        assert_eq!(set.len(), 1);
    }
}
