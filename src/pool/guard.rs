//! A checked-out server. Dropping the guard checks the server in: at once when it is clean
//! and idle, else after a cleanup task (cancel, rollback, reset query) or by closing it.
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use super::Pool;
use crate::server::{Server, sync};

pub struct PooledServer {
    server: Option<Server>,
    pool: Arc<Pool>,
    /// Run server_reset_query before the next client gets this server.
    pub reset: bool,
}

impl PooledServer {
    pub(crate) fn new(server: Server, pool: Arc<Pool>) -> Self {
        PooledServer {
            server: Some(server),
            pool,
            reset: false,
        }
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// Close the server instead of reusing it.
    pub fn close(mut self) {
        if let Some(s) = self.server.take() {
            self.pool.close(s);
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
        if s.broken {
            self.pool.close(s);
            return;
        }
        let clean = s.proto.is_idle() && s.conn.rbuf.is_empty() && s.pending.is_empty();
        if clean && !self.reset && s.conn.out_len() == 0 {
            self.pool.checkin(s);
            return;
        }
        let pool = self.pool.clone();
        let reset = self.reset;
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            pool.close(s);
            return;
        };
        handle.spawn(async move {
            let settings = pool.settings();
            let limit = settings.cancel_wait_timeout.max(std::time::Duration::from_secs(1));
            let mut ok = sync::cleanup(&mut s, limit).await.is_ok();
            if ok && reset {
                let r = tokio::time::timeout(limit, sync::reset(&mut s, &settings.server_reset_query)).await;
                ok = matches!(r, Ok(Ok(())));
            }
            if ok {
                pool.checkin(s);
            } else {
                tracing::debug!(db = %pool.db, user = %pool.user, "closing server left in an unknown state");
                pool.close(s);
            }
        });
    }
}
