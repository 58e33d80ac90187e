//! The users `auth_query` found ("dynamic" users, PgBouncer's word for them): each secret is
//! kept for `auth_query_cache_ttl`, per (database, user), so a burst of logins asks
//! PostgreSQL once.
//!
//! Only users that were found are kept (a user created in PostgreSQL a moment ago is asked
//! for at its first login). A failed login forgets its user at once, so a changed password
//! or an expired `VALID UNTIL` is seen on the very next try; otherwise a dropped user, or
//! one no longer allowed to log in, is refused once its entry is older than the TTL. A
//! reload forgets everything (auth_query, auth_user or auth_dbname may have changed).
//! Bounded: past [`MAX_ENTRIES`] the expired entries go, then the oldest.
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::Secret;
use crate::lock::Locked;

/// Most (database, user) entries kept.
pub const MAX_ENTRIES: usize = 10_000;

/// What auth_query said about a user: its secret, or None when the query returned NULL
/// (no password, or `rolvaliduntil` passed): no password matches then.
pub type Found = Option<Secret>;

#[derive(Default)]
pub struct DynamicUsers {
    entries: Mutex<HashMap<(String, String), (Found, Instant)>>,
}

impl std::fmt::Debug for DynamicUsers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Names only, never a secret.
        f.debug_struct("DynamicUsers")
            .field("entries", &self.len())
            .finish()
    }
}

impl DynamicUsers {
    /// The secret found for `user` in `db` less than `ttl` before `now`.
    pub fn get(&self, db: &str, user: &str, ttl: Duration, now: Instant) -> Option<Found> {
        let key = (db.to_string(), user.to_string());
        let mut map = self.entries.locked();
        match map.get(&key) {
            Some((found, at)) if now.saturating_duration_since(*at) < ttl => Some(found.clone()),
            Some(_) => {
                map.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Remember what auth_query found for `user` in `db` at `now` (nothing when `ttl` is 0).
    pub fn insert(&self, db: &str, user: &str, found: Found, ttl: Duration, now: Instant) {
        if ttl.is_zero() {
            return;
        }
        let mut map = self.entries.locked();
        if map.len() >= MAX_ENTRIES {
            map.retain(|_, (_, at)| now.saturating_duration_since(*at) < ttl);
        }
        if map.len() >= MAX_ENTRIES
            && let Some(oldest) = map
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
        map.insert((db.to_string(), user.to_string()), (found, now));
    }

    /// Forget `user` in `db` (its login failed: ask again next time).
    pub fn forget(&self, db: &str, user: &str) {
        self.entries
            .locked()
            .remove(&(db.to_string(), user.to_string()));
    }

    /// Forget everyone (reload).
    pub fn clear(&self) {
        self.entries.locked().clear();
    }

    pub fn len(&self) -> usize {
        self.entries.locked().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(5);

    fn pw(p: &str) -> Found {
        Some(Secret::Plain(p.into()))
    }

    #[test]
    fn an_entry_lives_for_the_ttl_per_database_and_user() {
        let users = DynamicUsers::default();
        let t0 = Instant::now();
        users.insert("db", "alice", pw("a"), TTL, t0);
        assert_eq!(users.get("db", "alice", TTL, t0), Some(pw("a")));
        assert_eq!(
            users.get("db", "alice", TTL, t0 + TTL - Duration::from_millis(1)),
            Some(pw("a"))
        );
        assert_eq!(users.get("other", "alice", TTL, t0), None);
        assert_eq!(users.get("db", "bob", TTL, t0), None);
        // Expired: gone, and removed.
        assert_eq!(users.get("db", "alice", TTL, t0 + TTL), None);
        assert!(users.is_empty());
    }

    #[test]
    fn a_null_password_is_remembered_as_such() {
        let users = DynamicUsers::default();
        let t0 = Instant::now();
        users.insert("db", "expired", None, TTL, t0);
        assert_eq!(users.get("db", "expired", TTL, t0), Some(None));
    }

    #[test]
    fn forget_clear_and_a_zero_ttl() {
        let users = DynamicUsers::default();
        let t0 = Instant::now();
        users.insert("db", "alice", pw("a"), TTL, t0);
        users.insert("db", "bob", pw("b"), TTL, t0);
        users.forget("db", "alice");
        assert_eq!(users.get("db", "alice", TTL, t0), None);
        assert_eq!(users.get("db", "bob", TTL, t0), Some(pw("b")));
        users.clear();
        assert!(users.is_empty());
        users.insert("db", "alice", pw("a"), Duration::ZERO, t0);
        assert!(users.is_empty(), "ttl 0 keeps nothing");
    }

    #[test]
    fn the_map_is_bounded_and_keeps_the_newest() {
        let users = DynamicUsers::default();
        let t0 = Instant::now();
        for i in 0..MAX_ENTRIES + 10 {
            let at = t0 + Duration::from_micros(i as u64);
            users.insert("db", &format!("u{i}"), None, TTL, at);
        }
        assert_eq!(users.len(), MAX_ENTRIES);
        let last = format!("u{}", MAX_ENTRIES + 9);
        assert_eq!(users.get("db", &last, TTL, t0), Some(None));
        assert_eq!(users.get("db", "u0", TTL, t0), None, "the oldest went");
    }

    #[test]
    fn debug_shows_no_secret() {
        let users = DynamicUsers::default();
        users.insert("db", "alice", pw("hunter2"), TTL, Instant::now());
        assert_eq!(format!("{users:?}"), "DynamicUsers { entries: 1 }");
    }
}
