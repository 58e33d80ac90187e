//! Where each server of a pool is, as PgBouncer's server states, counted per pool. The
//! pool moves a server from one state to another in one function (`Pool::change_state`),
//! which also gives back the database and user limits when a server goes.
//!
//! "used" (an idle server due its server_check_query) is told from the idle list when
//! counted; "closing" is no count: a server that closes leaves the counts at once, with a
//! logged reason, and its Terminate is flushed in the background.

/// A server's state in its pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerState {
    /// Being opened: connecting and logging in.
    Login,
    /// In the idle list.
    Idle,
    /// Linked to a client (or a replication connection's own).
    Active,
    /// Running server_check_query before it is handed out.
    Tested,
    /// Being cleaned after its client: cancels waited for, rolled back, server_reset_query.
    BeingReset,
}

const STATES: usize = 5;

/// A pool's servers counted by state.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ServerCounts([usize; STATES]);

impl ServerCounts {
    pub fn get(&self, s: ServerState) -> usize {
        self.0[s as usize]
    }

    /// Every server of the pool, being opened to being reset.
    pub fn total(&self) -> usize {
        self.0.iter().sum()
    }

    /// Servers out of the idle list: handed out, or on their way in or back.
    pub fn in_use(&self) -> usize {
        self.total() - self.get(ServerState::Idle)
    }

    /// These and `other`'s together (a pool and its read routing sub-pools).
    pub fn add(&mut self, other: &ServerCounts) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a += b;
        }
    }

    /// One server moves from `from` to `to` (None: no server; a place taken or given back).
    pub(super) fn change(&mut self, from: Option<ServerState>, to: Option<ServerState>) {
        if let Some(f) = from {
            let n = &mut self.0[f as usize];
            debug_assert!(*n > 0, "no server is {f:?}");
            *n = n.saturating_sub(1);
        }
        if let Some(t) = to {
            self.0[t as usize] += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ServerState::*;
    use super::*;

    #[test]
    fn a_server_is_counted_in_one_state_at_a_time() {
        let mut c = ServerCounts::default();
        c.change(None, Some(Login));
        assert_eq!((c.get(Login), c.total(), c.in_use()), (1, 1, 1));
        c.change(Some(Login), Some(Active));
        c.change(Some(Active), Some(BeingReset));
        assert_eq!((c.get(Login), c.get(Active), c.get(BeingReset)), (0, 0, 1));
        c.change(Some(BeingReset), Some(Idle));
        assert_eq!((c.get(Idle), c.total(), c.in_use()), (1, 1, 0));
        c.change(Some(Idle), None);
        assert_eq!(c, ServerCounts::default());
    }
}
