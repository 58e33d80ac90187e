//! Failed server logins of one pool: when the next login may be tried, and whether clients
//! wait for it or get the error at once (server_login_retry).
//!
//! Two kinds of failure. The server saying it is unavailable (starting up, shutting down,
//! not listening) passes by itself in a moment: the login is tried again after 50 ms,
//! doubling per failure up to [`UNAVAILABLE_RETRY_MAX`], and clients wait for it (as
//! PgBouncer keeps them waiting through refused connects). Any other failure (wrong password, no such
//! database, a timeout) is cached for server_login_retry, as PgBouncer does: clients
//! arriving at a pool with no server get the error at once. Once logins have failed for
//! server_login_retry, unavailable is treated the same way: clients stop waiting for a
//! server that stays away.
use std::collections::VecDeque;
use std::time::{Duration, Instant, SystemTime};

/// The first retry after the server said it is unavailable.
pub const UNAVAILABLE_RETRY_FIRST: Duration = Duration::from_millis(50);

/// The longest retry delay while the server is unavailable (doubling stops here): clients
/// are served within this of PostgreSQL accepting connections again, at the cost of two
/// refused connections (or "starting up" replies) a second per pool with clients waiting.
pub const UNAVAILABLE_RETRY_MAX: Duration = Duration::from_millis(500);

/// What a failed login says about the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoginFailure {
    /// The server is starting up, shutting down or not listening (SQLSTATE 57P01/57P02/
    /// 57P03, a refused or reset connection): it may accept the next login shortly.
    Unavailable,
    /// Anything else: the next login would most likely fail the same way.
    Rejected,
    /// target_session_attrs: hosts answer, none has the wanted role (a switchover under
    /// way, a standby being promoted). Retried as `Unavailable`, and clients wait for it up
    /// to query_wait_timeout whatever server_login_retry says: a new primary is coming.
    NoRole,
}

/// The failed logins of one pool since its last successful one.
#[derive(Debug, Default)]
pub struct LoginBackoff {
    failing: Option<Failing>,
}

#[derive(Debug)]
struct Failing {
    /// The first failure since the last success.
    since: Instant,
    /// The last failure.
    last: Instant,
    /// The last failure counted for the doubling (of a login started after the one before).
    counted: Instant,
    kind: LoginFailure,
    /// Unavailable failures in a row (the retry delay doubles with each).
    unavailable: u32,
    /// No login before this.
    retry_at: Instant,
    /// A login started after the last failure is under way: no other until it ends.
    probing: bool,
}

impl LoginBackoff {
    /// A login started at `started` failed at `now`. Logins that were under way together
    /// count as one failure for the doubling.
    pub fn failed(
        &mut self,
        kind: LoginFailure,
        started: Instant,
        now: Instant,
        server_login_retry: Duration,
    ) {
        let since = self.failing.as_ref().map_or(now, |f| f.since);
        // Started before the last counted failure: not the retry that failure allowed.
        let concurrent = self.failing.as_ref().is_some_and(|f| started < f.counted);
        let unavailable = match (kind, &self.failing) {
            (LoginFailure::Unavailable | LoginFailure::NoRole, Some(f)) if concurrent => {
                f.unavailable.max(1)
            }
            (LoginFailure::Unavailable | LoginFailure::NoRole, Some(f)) => {
                f.unavailable.saturating_add(1)
            }
            (LoginFailure::Unavailable | LoginFailure::NoRole, None) => 1,
            (LoginFailure::Rejected, _) => 0,
        };
        let probing = concurrent && self.failing.as_ref().is_some_and(|f| f.probing);
        let counted = match &self.failing {
            Some(f) if concurrent => f.counted,
            _ => now,
        };
        let delay = match kind {
            LoginFailure::Unavailable | LoginFailure::NoRole => {
                unavailable_delay(unavailable).min(server_login_retry)
            }
            LoginFailure::Rejected => server_login_retry,
        };
        self.failing = Some(Failing {
            since,
            last: now,
            counted,
            kind,
            unavailable,
            retry_at: now + delay,
            probing,
        });
    }

    /// A login succeeded: no more waiting.
    pub fn succeeded(&mut self) {
        self.failing = None;
    }

    /// A login started while failing ended without a result (its client left).
    pub fn abandoned(&mut self) {
        if let Some(f) = &mut self.failing {
            f.probing = false;
        }
    }

    pub fn is_failing(&self) -> bool {
        self.failing.is_some()
    }

    /// The first failure since the last successful login.
    pub fn failing_since(&self) -> Option<Instant> {
        self.failing.as_ref().map(|f| f.since)
    }

    /// When the next login may start, while logins fail.
    pub fn retry_at(&self) -> Option<Instant> {
        self.failing.as_ref().map(|f| f.retry_at)
    }

    /// Whether a login may start at `now`: not failing, or the retry time has come and no
    /// other retry is under way.
    pub fn may_try(&self, now: Instant) -> bool {
        self.failing
            .as_ref()
            .is_none_or(|f| !f.probing && now >= f.retry_at)
    }

    /// A login starts (after `may_try`): while failing, it is the one retry under way.
    pub fn started(&mut self) {
        if let Some(f) = &mut self.failing {
            f.probing = true;
        }
    }

    /// Clients stop waiting for the server: logins have failed for server_login_retry (it
    /// is not coming back soon: a wrong port, say, or a server that stays down).
    fn settled(&self, f: &Failing, server_login_retry: Duration) -> bool {
        f.kind != LoginFailure::NoRole
            && f.last.saturating_duration_since(f.since) >= server_login_retry
    }

    /// Clients arriving at a pool with no server get the last error at once (PgBouncer's
    /// fast fail): within server_login_retry of a rejected login, or until the next retry
    /// once logins have failed for server_login_retry. While the server is unavailable
    /// (restarting, or starting along with pgcarpool), they wait for it instead.
    pub fn fails_fast(&self, now: Instant, server_login_retry: Duration) -> bool {
        self.failing.as_ref().is_some_and(|f| {
            now < f.retry_at
                && (f.kind == LoginFailure::Rejected || self.settled(f, server_login_retry))
        })
    }

    /// Clients waiting at a pool with no server give up with the last error: logins have
    /// failed for server_login_retry.
    pub fn fails_waiters(&self, server_login_retry: Duration) -> bool {
        self.failing
            .as_ref()
            .is_some_and(|f| self.settled(f, server_login_retry))
    }
}

/// The retry delay after `n` unavailable failures in a row (n ≥ 1): 50 ms, doubling, at
/// most UNAVAILABLE_RETRY_MAX.
fn unavailable_delay(n: u32) -> Duration {
    let doublings = n.saturating_sub(1).min(16);
    UNAVAILABLE_RETRY_FIRST
        .saturating_mul(1 << doublings)
        .min(UNAVAILABLE_RETRY_MAX)
}

/// The login errors a pool remembers after it recovers (SHOW EVENTS, the status page).
pub const RECENT_ERRORS: usize = 5;

/// A pool's last distinct login errors, oldest first; a repeat of the newest one counts
/// there instead of taking a place.
#[derive(Debug, Default)]
pub struct RecentErrors {
    list: VecDeque<RecentError>,
}

/// One login error and its repeats in a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecentError {
    pub first: SystemTime,
    pub last: SystemTime,
    pub count: u64,
    pub text: String,
}

impl RecentErrors {
    pub fn record(&mut self, text: &str, now: SystemTime) {
        if let Some(e) = self.list.back_mut().filter(|e| e.text == text) {
            e.last = now;
            e.count += 1;
            return;
        }
        if self.list.len() == RECENT_ERRORS {
            self.list.pop_front();
        }
        self.list.push_back(RecentError {
            first: now,
            last: now,
            count: 1,
            text: text.to_string(),
        });
    }

    pub fn list(&self) -> Vec<RecentError> {
        self.list.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RETRY: Duration = Duration::from_secs(15);

    /// The state of a pool whose server accepted a login before.
    fn was_up() -> LoginBackoff {
        let mut b = LoginBackoff::default();
        b.succeeded();
        b
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// The delays of `n` unavailable failures in a row, each at its retry time.
    fn schedule(n: usize, retry: Duration) -> Vec<Duration> {
        let mut b = LoginBackoff::default();
        let mut now = Instant::now();
        let mut delays = Vec::new();
        for _ in 0..n {
            assert!(b.may_try(now));
            b.started();
            b.failed(LoginFailure::Unavailable, now, now, retry);
            let at = b.retry_at().unwrap();
            delays.push(at - now);
            now = at;
        }
        delays
    }

    #[test]
    fn unavailable_retries_after_50_ms_doubling_up_to_half_a_second() {
        assert_eq!(
            schedule(7, RETRY),
            [ms(50), ms(100), ms(200), ms(400), ms(500), ms(500), ms(500)]
        );
    }

    #[test]
    fn unavailable_retries_no_later_than_server_login_retry() {
        assert_eq!(schedule(4, ms(120)), [ms(50), ms(100), ms(120), ms(120)]);
        assert_eq!(schedule(2, Duration::ZERO), [ms(0), ms(0)]);
    }

    #[test]
    fn a_rejected_login_waits_server_login_retry_and_fails_clients_fast() {
        let t = Instant::now();
        let mut b = LoginBackoff::default();
        b.failed(LoginFailure::Rejected, t, t, RETRY);
        assert_eq!(b.retry_at(), Some(t + RETRY));
        assert!(!b.may_try(t + RETRY - ms(1)));
        assert!(b.fails_fast(t + RETRY - ms(1), RETRY));
        // After server_login_retry, a client may try (and waiters keep waiting for it).
        assert!(b.may_try(t + RETRY));
        assert!(!b.fails_fast(t + RETRY, RETRY));
        assert!(!b.fails_waiters(RETRY));
    }

    #[test]
    fn while_briefly_unavailable_clients_wait_instead_of_failing() {
        let t = Instant::now();
        let mut b = was_up();
        b.failed(LoginFailure::Unavailable, t, t, RETRY);
        b.failed(LoginFailure::Unavailable, t + ms(50), t + ms(50), RETRY);
        assert!(!b.fails_fast(t + ms(60), RETRY));
        assert!(!b.fails_waiters(RETRY));
    }

    #[test]
    fn after_server_login_retry_of_unavailable_clients_get_the_error() {
        let t = Instant::now();
        let mut b = was_up();
        b.failed(LoginFailure::Unavailable, t, t, RETRY);
        b.failed(LoginFailure::Unavailable, t + RETRY, t + RETRY, RETRY);
        let retry_at = b.retry_at().unwrap();
        assert!(b.fails_fast(retry_at - ms(1), RETRY));
        assert!(b.fails_waiters(RETRY));
        // The server is still tried at the short interval.
        assert!(retry_at - (t + RETRY) <= UNAVAILABLE_RETRY_MAX);
        assert!(!b.fails_fast(retry_at, RETRY));
    }

    #[test]
    fn a_server_that_never_accepted_a_login_is_waited_for_until_server_login_retry() {
        let t = Instant::now();
        let mut b = LoginBackoff::default();
        b.failed(LoginFailure::Unavailable, t, t, RETRY);
        // PostgreSQL may be starting along with pgcarpool: clients wait, retries are quick.
        assert!(!b.fails_waiters(RETRY));
        assert!(!b.fails_fast(t + ms(10), RETRY));
        assert_eq!(b.retry_at(), Some(t + ms(50)));
        // Still refused after server_login_retry (a wrong port): the error, at once.
        let late = t + RETRY;
        b.failed(LoginFailure::Unavailable, late, late, RETRY);
        assert!(b.fails_waiters(RETRY));
        assert!(b.fails_fast(late + ms(1), RETRY));
    }

    #[test]
    fn one_retry_at_a_time_and_a_success_clears_everything() {
        let t = Instant::now();
        let mut b = LoginBackoff::default();
        assert!(b.may_try(t));
        b.started(); // not failing: no limit
        assert!(b.may_try(t));
        b.failed(LoginFailure::Unavailable, t, t, RETRY);
        let at = b.retry_at().unwrap();
        assert!(!b.may_try(at - ms(1)));
        assert!(b.may_try(at));
        b.started();
        assert!(
            !b.may_try(at + ms(1)),
            "a second retry while one is under way"
        );
        b.abandoned();
        assert!(b.may_try(at + ms(1)));
        b.started();
        b.failed(LoginFailure::Unavailable, at + ms(5), at + ms(5), RETRY);
        assert_eq!(b.retry_at(), Some(at + ms(5) + ms(100)));
        b.succeeded();
        assert!(!b.is_failing());
        assert!(b.may_try(at));
        // The next failure starts the schedule over.
        b.failed(LoginFailure::Unavailable, at, at, RETRY);
        assert_eq!(b.retry_at(), Some(at + ms(50)));
    }

    #[test]
    fn logins_failing_together_count_once() {
        let t = Instant::now();
        let mut b = LoginBackoff::default();
        // Three logins under way when the server went down.
        b.failed(LoginFailure::Unavailable, t, t + ms(1), RETRY);
        b.failed(LoginFailure::Unavailable, t, t + ms(2), RETRY);
        b.failed(LoginFailure::Unavailable, t, t + ms(3), RETRY);
        assert_eq!(b.retry_at(), Some(t + ms(3) + ms(50)));
        // The retry, and one more login that was under way meanwhile.
        let at = b.retry_at().unwrap();
        assert!(b.may_try(at));
        b.started();
        b.failed(LoginFailure::Unavailable, t, at + ms(1), RETRY);
        assert!(!b.may_try(at + ms(2)), "the retry is still under way");
        b.failed(LoginFailure::Unavailable, at, at + ms(4), RETRY);
        assert_eq!(b.retry_at(), Some(at + ms(4) + ms(100)));
    }

    #[test]
    fn waiting_for_a_primary_never_settles() {
        let retry = Duration::from_secs(1);
        let t0 = Instant::now();
        let mut b = LoginBackoff::default();
        for i in 0..40 {
            let at = t0 + Duration::from_millis(100 * i);
            b.failed(LoginFailure::NoRole, at, at, retry);
        }
        assert!(
            !b.fails_waiters(retry),
            "4 s without a primary: clients still wait"
        );
        assert!(!b.fails_fast(t0 + Duration::from_secs(4), retry));
        assert_eq!(
            b.retry_at().unwrap() - (t0 + Duration::from_millis(3900)),
            UNAVAILABLE_RETRY_MAX
        );
    }

    #[test]
    fn a_rejected_login_resets_the_doubling() {
        let t = Instant::now();
        let mut b = LoginBackoff::default();
        b.failed(LoginFailure::Unavailable, t, t, RETRY);
        b.failed(LoginFailure::Unavailable, t, t, RETRY);
        b.failed(LoginFailure::Rejected, t, t, RETRY);
        b.failed(LoginFailure::Unavailable, t, t, RETRY);
        assert_eq!(b.retry_at(), Some(t + ms(50)));
    }

    #[test]
    fn recent_errors_count_repeats_and_keep_the_last_few() {
        let mut r = RecentErrors::default();
        let t = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        r.record("refused", t(1));
        r.record("refused", t(2));
        r.record("bad password", t(3));
        let l = r.list();
        assert_eq!(l.len(), 2);
        assert_eq!((l[0].count, l[0].first, l[0].last), (2, t(1), t(2)));
        assert_eq!(l[1].text, "bad password");
        for n in 0..RECENT_ERRORS as u64 {
            r.record(&format!("e{n}"), t(10 + n));
        }
        let l = r.list();
        assert_eq!(l.len(), RECENT_ERRORS);
        assert_eq!(l[0].text, "e0");
    }
}
