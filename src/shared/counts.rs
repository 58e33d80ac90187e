//! Client connections per database and per user (console connections included, on the
//! database `pgbouncer`), for `max_db_client_connections` and `max_user_client_connections`
//! and SHOW DATABASES / SHOW USERS `current_client_connections`. Counted as PgBouncer
//! does: a client counts from its login, and one over a limit is refused.
use crate::lock::Locked;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[derive(Default)]
pub struct ClientCounts {
    by_db: Mutex<HashMap<String, usize>>,
    by_user: Mutex<HashMap<String, usize>>,
}

/// One client counted in its database and user until dropped.
pub struct Counted {
    counts: Arc<ClientCounts>,
    db: String,
    user: String,
    /// The counts with this client in them.
    pub db_count: usize,
    pub user_count: usize,
}

fn up(m: &Mutex<HashMap<String, usize>>, key: &str) -> usize {
    let mut g = m.locked();
    let n = g.entry(key.to_string()).or_insert(0);
    *n += 1;
    *n
}

fn down(m: &Mutex<HashMap<String, usize>>, key: &str) {
    let mut g = m.locked();
    if let Some(n) = g.get_mut(key) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            g.remove(key);
        }
    }
}

impl ClientCounts {
    /// Count a client of database `db` logged in as `user`.
    pub fn enter(self: &Arc<Self>, db: &str, user: &str) -> Counted {
        Counted {
            db_count: up(&self.by_db, db),
            user_count: up(&self.by_user, user),
            counts: self.clone(),
            db: db.to_string(),
            user: user.to_string(),
        }
    }

    /// Clients of database `db` now.
    pub fn db(&self, db: &str) -> usize {
        self.by_db.locked().get(db).copied().unwrap_or(0)
    }

    /// Clients logged in as `user` now.
    pub fn user(&self, user: &str) -> usize {
        self.by_user.locked().get(user).copied().unwrap_or(0)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        down(&self.counts.by_db, &self.db);
        down(&self.counts.by_user, &self.user);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_are_counted_per_database_and_user_while_they_live() {
        let counts = Arc::new(ClientCounts::default());
        let a = counts.enter("app", "alice");
        let b = counts.enter("app", "bob");
        let c = counts.enter("other", "alice");
        assert_eq!((a.db_count, a.user_count), (1, 1));
        assert_eq!((b.db_count, b.user_count), (2, 1));
        assert_eq!((c.db_count, c.user_count), (1, 2));
        assert_eq!(counts.db("app"), 2);
        assert_eq!(counts.user("alice"), 2);
        drop(a);
        assert_eq!(counts.db("app"), 1);
        assert_eq!(counts.user("alice"), 1);
        drop((b, c));
        assert_eq!(counts.db("app"), 0);
        assert_eq!(counts.user("bob"), 0);
        assert!(counts.by_db.locked().is_empty(), "no entry left behind");
    }
}
