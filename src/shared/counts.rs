//! Client connections per database and per user (console connections included, on the
//! database `pgbouncer`), for `max_db_client_connections` and `max_user_client_connections`
//! and SHOW DATABASES / SHOW USERS `current_client_connections`. Counted as PgBouncer
//! does: a client counts from its login, and one over a limit is refused.
use crate::lock::Locked;
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Clients by name (a `Cell`: a name already there is counted in one lookup).
type Counts = Mutex<HashMap<Arc<str>, Cell<usize>>>;

#[derive(Default)]
pub struct ClientCounts {
    by_db: Counts,
    by_user: Counts,
}

/// One client counted in its database and user until dropped. The names are the counts'
/// own, shared by every client of the same database or user (the client registry keeps
/// them too: `ClientHandle`).
pub struct Counted {
    counts: Arc<ClientCounts>,
    db: Arc<str>,
    user: Arc<str>,
}

/// A client just counted, and the counts with it in them (for the limits checked at
/// login; not kept by the client).
pub struct Admitted {
    pub counted: Counted,
    pub db_count: usize,
    pub user_count: usize,
}

/// Count one more under `key`: the count, and the map's own copy of the name.
fn up(m: &Counts, key: &str) -> (usize, Arc<str>) {
    let mut g = m.locked();
    if let Some((k, n)) = g.get_key_value(key) {
        n.set(n.get() + 1);
        return (n.get(), k.clone());
    }
    let k: Arc<str> = key.into();
    g.insert(k.clone(), Cell::new(1));
    (1, k)
}

fn down(m: &Counts, key: &str) {
    let mut g = m.locked();
    if let Some(n) = g.get(key) {
        n.set(n.get().saturating_sub(1));
        if n.get() == 0 {
            g.remove(key);
        }
    }
}

impl ClientCounts {
    /// Count a client of database `db` logged in as `user`.
    pub fn enter(self: &Arc<Self>, db: &str, user: &str) -> Admitted {
        let (db_count, db) = up(&self.by_db, db);
        let (user_count, user) = up(&self.by_user, user);
        Admitted {
            db_count,
            user_count,
            counted: Counted {
                counts: self.clone(),
                db,
                user,
            },
        }
    }

    /// Clients of database `db` now.
    pub fn db(&self, db: &str) -> usize {
        self.by_db.locked().get(db).map_or(0, Cell::get)
    }

    /// Clients logged in as `user` now.
    pub fn user(&self, user: &str) -> usize {
        self.by_user.locked().get(user).map_or(0, Cell::get)
    }
}

impl Counted {
    /// The (user, database) names, shared.
    pub fn names(&self) -> (Arc<str>, Arc<str>) {
        (self.user.clone(), self.db.clone())
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
        drop(a.counted);
        assert_eq!(counts.db("app"), 1);
        assert_eq!(counts.user("alice"), 1);
        drop((b.counted, c.counted));
        assert_eq!(counts.db("app"), 0);
        assert_eq!(counts.user("bob"), 0);
        assert!(counts.by_db.locked().is_empty(), "no entry left behind");
    }

    #[test]
    fn clients_of_one_database_and_user_share_one_copy_of_the_names() {
        let counts = Arc::new(ClientCounts::default());
        let a = counts.enter("app", "alice");
        let b = counts.enter("app", "alice");
        let c = counts.enter("other", "bob");
        let (au, ad) = a.counted.names();
        let (bu, bd) = b.counted.names();
        assert!(Arc::ptr_eq(&au, &bu) && Arc::ptr_eq(&ad, &bd));
        assert_eq!(
            (&*c.counted.names().0, &*c.counted.names().1),
            ("bob", "other")
        );
        // The last client of a name gone, a new one counts from 1 again.
        drop((a, b, au, ad, bu, bd));
        let d = counts.enter("app", "alice");
        assert_eq!((d.db_count, d.user_count), (1, 1));
    }
}
