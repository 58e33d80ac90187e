//! A checked-out server. Dropping the guard checks the server in: at once when it is clean
//! and idle, else after a cleanup task (cancel, rollback, reset query) or by closing it.
//! And room for a server of a client's own ([`Slot`]), given back when dropped.
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use super::Pool;
use super::state::ServerState::{Active, BeingReset};
use crate::server::{Server, sync};

pub struct PooledServer {
    server: Option<Box<Server>>,
    pool: Arc<Pool>,
    /// Run server_reset_query before the next client gets this server.
    pub reset: bool,
    /// The server holds session state a client left behind (it was pinned): reset it with
    /// server_reset_query, or DISCARD ALL when that is empty.
    pub discard: bool,
}

impl PooledServer {
    pub(crate) fn new(server: Box<Server>, pool: Arc<Pool>) -> Self {
        PooledServer {
            server: Some(server),
            pool,
            reset: false,
            discard: false,
        }
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// Close the server instead of reusing it.
    pub fn close(mut self) {
        if let Some(s) = self.server.take() {
            self.pool.close(s, Active);
        }
    }
}

impl Deref for PooledServer {
    type Target = Server;
    fn deref(&self) -> &Server {
        self.server.as_ref().expect("server present until drop")
    }
}

impl DerefMut for PooledServer {
    fn deref_mut(&mut self) -> &mut Server {
        self.server.as_mut().expect("server present until drop")
    }
}

impl Drop for PooledServer {
    fn drop(&mut self) {
        let Some(mut s) = self.server.take() else {
            return;
        };
        if s.is_broken() {
            self.pool.close(s, Active);
            return;
        }
        let clean = s.is_clean();
        let cancel_in_flight = cancels_in_flight(&s);
        if clean && !self.reset && !self.discard && s.conn().out_len() == 0 && !cancel_in_flight {
            self.pool.checkin(s, Active);
            return;
        }
        let pool = self.pool.clone();
        let reset = self.reset || self.discard;
        let discard = self.discard;
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            pool.close(s, Active);
            return;
        };
        pool.set_state(&s, Active, BeingReset);
        handle.spawn(async move {
            let settings = pool.settings();
            let limit = settings.cancel_wait_timeout.max(std::time::Duration::from_secs(1));
            // A cancel request sent for the last client must not reach the next one.
            let mut ok = !cancel_in_flight || wait_for_cancels(&s, limit).await;
            ok = ok && sync::cleanup(&mut s, limit).await.is_ok();
            if ok && reset {
                let query = match settings.server_reset_query.trim() {
                    "" if discard => "DISCARD ALL",
                    q => q,
                };
                let r = tokio::time::timeout(limit, sync::reset(&mut s, query)).await;
                ok = matches!(r, Ok(Ok(())));
            }
            if ok {
                pool.checkin(s, BeingReset);
            } else {
                tracing::debug!(db = %pool.db, user = %pool.user, "closing server left in an unknown state");
                pool.close(s, BeingReset);
            }
        });
    }
}

/// Whether a cancel request for this server is still being forwarded: each one holds a
/// clone of the server's `addr` (taken from the client's cancel target) until PostgreSQL
/// has closed the cancel connection, i.e. has signalled the backend.
fn cancels_in_flight(s: &Server) -> bool {
    Arc::strong_count(s.addr()) > 1
}

/// Wait (bounded by `limit`) until no cancel request for `s` is in flight.
async fn wait_for_cancels(s: &Server, limit: std::time::Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while cancels_in_flight(s) {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    true
}

/// Room in a pool for a server that is not pooled (a replication connection's own):
/// counted in the pool's size and its database and user limits until dropped.
pub struct Slot {
    pool: Arc<Pool>,
}

impl Slot {
    pub(crate) fn new(pool: Arc<Pool>) -> Self {
        Slot { pool }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.pool.release_slot(Active);
    }
}
