//! Connections that have not logged in yet, oldest first. They share `max_client_conn` with
//! everyone, so a flood of sockets that never finish their login (send nothing, or a byte a
//! second) could lock every real user out until `client_login_timeout`. Instead, a new
//! connection that finds the pooler full drops the oldest connection still logging in:
//! when unfinished logins hold more than half of `max_client_conn` ([`SHARE`]; a flood),
//! the oldest that has not sent its startup packet within [`FLOOD_GRACE`]; else only one
//! that has been logging in for longer than [`GRACE`] (a real login takes milliseconds).
//! With no unfinished login to drop, a full pooler refuses newcomers as PgBouncer does.
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a connection may be logging in before it can be dropped to make room.
pub const GRACE: Duration = Duration::from_secs(2);
/// In a flood, how long a connection may take to send its startup packet before it can
/// be dropped to make room (a real client sends it at once, after TLS if it asks for it).
pub const FLOOD_GRACE: Duration = Duration::from_millis(250);
/// Unfinished logins may hold up to `max_client_conn / SHARE` places without being dropped
/// before [`GRACE`]; past that, the oldest makes room for a newcomer at once.
pub const SHARE: usize = 2;

use crate::lock::Locked;
use tokio_util::sync::CancellationToken;

/// The connections still logging in, by client id (ids grow with arrival: first = oldest).
#[derive(Default)]
pub struct PendingLogins {
    waiting: Mutex<BTreeMap<u64, Waiting>>,
}

/// A connection logging in: how to drop it, since when, and whether its startup packet came.
struct Waiting {
    token: CancellationToken,
    since: Instant,
    started: bool,
}

/// One connection's place among those logging in; leaves it when dropped (logged in,
/// refused or gone).
pub struct LoginTicket<'a> {
    logins: &'a PendingLogins,
    id: u64,
    token: CancellationToken,
}

impl PendingLogins {
    /// Client `id` starts logging in.
    pub fn enter(&self, id: u64) -> LoginTicket<'_> {
        let token = CancellationToken::new();
        self.waiting.locked().insert(
            id,
            Waiting {
                token: token.clone(),
                since: Instant::now(),
                started: false,
            },
        );
        LoginTicket {
            logins: self,
            id,
            token,
        }
    }

    /// Client `id` sent its startup packet (it is past the first bytes of its login).
    pub fn started(&self, id: u64) {
        if let Some(w) = self.waiting.locked().get_mut(&id) {
            w.started = true;
        }
    }

    /// The pooler is full (`max` connections): drop a connection still logging in (its
    /// login ends with an error) to make room. When logins in progress hold more than
    /// `max / SHARE` places: the oldest that has not sent its startup packet within
    /// [`FLOOD_GRACE`]; else the oldest if it has been logging in since before
    /// `now - GRACE`. False when none may be dropped.
    pub fn drop_oldest(&self, now: Instant, max: usize) -> bool {
        let mut g = self.waiting.locked();
        let age = |w: &Waiting| now.saturating_duration_since(w.since);
        let flood = g.len() > max / SHARE;
        let victim = g
            .iter()
            .find(|(_, w)| flood && !w.started && age(w) >= FLOOD_GRACE)
            .or_else(|| g.first_key_value().filter(|(_, w)| age(w) >= GRACE))
            .map(|(id, _)| *id);
        match victim.and_then(|id| g.remove(&id)) {
            Some(w) => {
                w.token.cancel();
                true
            }
            None => false,
        }
    }

    /// How many connections are logging in now.
    pub fn len(&self) -> usize {
        self.waiting.locked().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl LoginTicket<'_> {
    /// Resolves when this login was dropped to make room.
    pub async fn dropped(&self) {
        self.token.cancelled().await
    }
}

impl Drop for LoginTicket<'_> {
    fn drop(&mut self) {
        self.logins.waiting.locked().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_login_is_dropped_first_and_a_finished_one_never() {
        let logins = PendingLogins::default();
        let first = logins.enter(1);
        let second = logins.enter(2);
        let third = logins.enter(3);
        drop(second); // logged in
        assert_eq!(logins.len(), 2);
        let now = Instant::now();
        // Two logins in a pooler of 4: within their share, and in their grace period.
        assert!(
            !logins.drop_oldest(now, 4),
            "a login in its grace period was dropped"
        );
        assert!(!first.token.is_cancelled());
        let later = now + GRACE;
        assert!(logins.drop_oldest(later, 4));
        assert!(first.token.is_cancelled());
        assert!(!third.token.is_cancelled());
        assert!(logins.drop_oldest(later, 4));
        assert!(third.token.is_cancelled());
        assert!(!logins.drop_oldest(later, 4), "nothing left to drop");
        drop(first);
        drop(third);
        assert!(logins.is_empty());
    }

    #[test]
    fn in_a_flood_logins_that_sent_nothing_for_a_moment_are_dropped_oldest_first() {
        let logins = PendingLogins::default();
        let all: Vec<_> = (1..=4).map(|id| logins.enter(id)).collect();
        logins.started(1); // a real login, under way
        let now = Instant::now();
        // Four unfinished logins in a pooler of 6: more than half, a flood; but all are
        // fresh (their packets may be on the way).
        assert!(!logins.drop_oldest(now, 6));
        let later = now + FLOOD_GRACE;
        assert!(logins.drop_oldest(later, 6));
        assert!(!all[0].token.is_cancelled(), "a started login was dropped");
        assert!(all[1].token.is_cancelled());
        // Three left of 6: within the share, and in their grace period.
        assert!(!logins.drop_oldest(later, 6));
        assert!(!all[2].token.is_cancelled());
    }
}
