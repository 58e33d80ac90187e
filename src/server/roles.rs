//! The role of each host of a `host=a,b,…` list (primary, standby, down, fenced) and
//! which hosts a pool's `target_session_attrs` may use: libpq's rules, plus timelines
//! against split brain and `max_standby_lag` for reads.
use std::collections::VecDeque;
use std::time::{Instant, SystemTime};

use crate::config::settings::StandbyLag;

/// The switchovers a [`RoleBook`] remembers (SHOW EVENTS, the status page).
pub const RECENT_SWITCHOVERS: usize = 5;

/// A move of the primary from one host to another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Switchover {
    pub at: SystemTime,
    pub from: usize,
    pub to: usize,
}

/// libpq's `target_session_attrs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SessionAttrs {
    /// Any host that accepts a login (today's behaviour, and libpq's default).
    #[default]
    Any,
    /// A session that may write: not in recovery, `default_transaction_read_only` off.
    ReadWrite,
    /// Not in recovery.
    Primary,
    /// A session that cannot write: a standby, or `default_transaction_read_only` on.
    ReadOnly,
    /// In recovery.
    Standby,
    /// A standby when one is usable, else any host (libpq's fallback).
    PreferStandby,
}

impl SessionAttrs {
    pub fn parse(v: Option<&str>) -> SessionAttrs {
        match v {
            Some("read-write") => SessionAttrs::ReadWrite,
            Some("primary") => SessionAttrs::Primary,
            Some("read-only") => SessionAttrs::ReadOnly,
            Some("standby") => SessionAttrs::Standby,
            Some("prefer-standby") => SessionAttrs::PreferStandby,
            _ => SessionAttrs::Any,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SessionAttrs::Any => "any",
            SessionAttrs::ReadWrite => "read-write",
            SessionAttrs::Primary => "primary",
            SessionAttrs::ReadOnly => "read-only",
            SessionAttrs::Standby => "standby",
            SessionAttrs::PreferStandby => "prefer-standby",
        }
    }

    /// Only a primary will do: its servers must never outlive its role.
    pub fn wants_primary(self) -> bool {
        matches!(self, SessionAttrs::ReadWrite | SessionAttrs::Primary)
    }
}

/// What a host was last seen to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HostRole {
    /// Not checked yet, or a server of it reported that it may have changed.
    #[default]
    Unknown,
    Primary,
    Standby,
    /// A login to it failed.
    Down,
}

impl HostRole {
    pub fn name(self) -> &'static str {
        match self {
            HostRole::Unknown => "unknown",
            HostRole::Primary => "primary",
            HostRole::Standby => "standby",
            HostRole::Down => "down",
        }
    }
}

/// What one check of a host found (at a server login or by the role check).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observed {
    /// `pg_is_in_recovery()` / `in_hot_standby`.
    pub standby: bool,
    /// `transaction_read_only` / `default_transaction_read_only`.
    pub read_only: bool,
    /// A primary's current timeline (0: unknown).
    pub timeline: u32,
    /// A standby's WAL received and not replayed, in bytes.
    pub lag_bytes: u64,
    /// While it has WAL left to replay: milliseconds since the primary committed the last
    /// transaction it replayed (0: up to date).
    pub lag_ms: u64,
    /// A standby's WAL replayed, a primary's WAL written, as a byte position (0: unknown).
    pub lsn: u64,
    /// When the question was sent: the position is at least what the host had then.
    pub asked: Option<Instant>,
}

#[derive(Debug, Clone, Default)]
pub struct HostState {
    pub role: HostRole,
    pub read_only: bool,
    pub timeline: u32,
    pub lag_bytes: u64,
    pub lag_ms: u64,
    /// The highest WAL position seen (a standby's replayed, a primary's written) and
    /// when the question that found it was sent (read routing's freshness).
    pub lsn: u64,
    pub lsn_at: Option<Instant>,
    pub checked: Option<Instant>,
    /// Why it is down or unknown.
    pub why: Option<String>,
}

impl HostState {
    /// A WAL position of the host asked at `asked`: kept when it is the highest seen.
    pub fn note_lsn(&mut self, lsn: u64, asked: Instant) {
        if lsn >= self.lsn {
            self.lsn = lsn;
            self.lsn_at = Some(self.lsn_at.map_or(asked, |t| t.max(asked)));
        }
    }
}

/// The roles of a host list's hosts and the choice they lead to.
#[derive(Debug, Clone, Default)]
pub struct RoleBook {
    pub hosts: Vec<HostState>,
    /// The highest timeline any host was seen primary on: a primary on a lower one is a
    /// former primary come back (split brain) and is fenced.
    pub max_timeline: u32,
    /// The host last chosen as primary.
    pub primary: Option<usize>,
    /// Times the primary moved from one host to another.
    pub switchovers: u64,
    /// The last host that was the primary (it stays while none is).
    pub last_primary: Option<usize>,
    /// The last [`RECENT_SWITCHOVERS`] switchovers, oldest first.
    pub recent: VecDeque<Switchover>,
}

/// Why a host's role changed, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrimaryChange {
    pub from: Option<usize>,
    pub to: Option<usize>,
}

impl RoleBook {
    pub fn new(n: usize) -> RoleBook {
        RoleBook {
            hosts: vec![HostState::default(); n],
            ..Default::default()
        }
    }

    /// Host `i` is a primary on the highest timeline seen (not a fenced former primary).
    pub fn is_live_primary(&self, i: usize) -> bool {
        self.hosts.get(i).is_some_and(|h| {
            h.role == HostRole::Primary && (h.timeline == 0 || h.timeline >= self.max_timeline)
        })
    }

    /// Host `i` is a primary on a timeline older than another primary's: fenced.
    pub fn is_fenced(&self, i: usize) -> bool {
        self.hosts.get(i).is_some_and(|h| {
            h.role == HostRole::Primary && h.timeline != 0 && h.timeline < self.max_timeline
        })
    }

    pub fn standby_ok(&self, i: usize, max_lag: StandbyLag) -> bool {
        self.hosts.get(i).is_some_and(|h| {
            h.role == HostRole::Standby
                && match max_lag {
                    StandbyLag::Bytes(0) => true,
                    StandbyLag::Bytes(b) => h.lag_bytes <= b,
                    StandbyLag::Time(t) => u128::from(h.lag_ms) <= t.as_millis(),
                }
        })
    }

    /// Whether a session on host `i` fits `attrs` as far as is known now. Unknown hosts do
    /// not fit (a login checks them first).
    pub fn fits(&self, i: usize, attrs: SessionAttrs, max_lag: StandbyLag) -> bool {
        let Some(h) = self.hosts.get(i) else {
            return false;
        };
        match attrs {
            SessionAttrs::Any => true,
            SessionAttrs::Primary => self.is_live_primary(i),
            SessionAttrs::ReadWrite => self.is_live_primary(i) && !h.read_only,
            SessionAttrs::Standby => self.standby_ok(i, max_lag),
            SessionAttrs::ReadOnly => {
                self.standby_ok(i, max_lag)
                    || (h.role == HostRole::Primary && h.read_only && !self.is_fenced(i))
            }
            SessionAttrs::PreferStandby => {
                self.standby_ok(i, max_lag)
                    || (!self.any_standby_ok(max_lag) && self.is_live_primary(i))
            }
        }
    }

    fn any_standby_ok(&self, max_lag: StandbyLag) -> bool {
        (0..self.hosts.len()).any(|i| self.standby_ok(i, max_lag))
    }

    /// Whether a server of host `i` may serve another transaction: with roles checked, its
    /// host must still fit (a primary demoted, fenced or gone takes no more writes). A
    /// host whose role is unknown keeps its servers only when it was not a primary
    /// before: a write must never reach a host whose role is in doubt.
    pub fn keeps(&self, i: usize, attrs: SessionAttrs, max_lag: StandbyLag) -> bool {
        attrs == SessionAttrs::Any || self.fits(i, attrs, max_lag)
    }

    /// Host `i` is known to be no primary any more: a standby now, fenced, or another host
    /// is the primary. (Only in doubt, a host keeps the transactions under way.)
    pub fn demoted(&self, i: usize) -> bool {
        let Some(h) = self.hosts.get(i) else {
            return true;
        };
        h.role == HostRole::Standby
            || (h.role == HostRole::Primary && h.read_only)
            || self.is_fenced(i)
            || self.primary.is_some_and(|p| p != i)
    }

    /// The order in which to try the hosts for a new server: hosts known to fit first (from
    /// `start`, round the list), then unknown ones, then the rest (they may have changed).
    pub fn order(&self, start: usize, attrs: SessionAttrs, max_lag: StandbyLag) -> Vec<usize> {
        let n = self.hosts.len();
        let ring = (0..n).map(|k| (start + k) % n);
        if attrs == SessionAttrs::Any {
            return ring.collect();
        }
        let rank = |i: usize| {
            if self.fits(i, attrs, max_lag) {
                0
            } else if self.hosts[i].role == HostRole::Unknown {
                1
            } else if self.is_fenced(i) {
                3
            } else {
                2
            }
        };
        let mut v: Vec<usize> = ring.collect();
        v.sort_by_key(|&i| rank(i));
        v
    }

    /// Record a check of host `i`. Returns the change of primary it shows, if any.
    pub fn observe(&mut self, i: usize, o: Observed) -> Option<PrimaryChange> {
        let h = self.hosts.get_mut(i)?;
        h.role = if o.standby {
            HostRole::Standby
        } else {
            HostRole::Primary
        };
        h.read_only = o.read_only;
        h.timeline = if o.standby { 0 } else { o.timeline };
        h.lag_bytes = if o.standby { o.lag_bytes } else { 0 };
        h.lag_ms = if o.standby { o.lag_ms } else { 0 };
        h.checked = Some(Instant::now());
        h.why = None;
        if o.lsn > 0 {
            h.note_lsn(o.lsn, o.asked.unwrap_or_else(Instant::now));
        }
        if !o.standby {
            self.max_timeline = self.max_timeline.max(o.timeline);
        }
        self.choose_primary()
    }

    /// Host `i` is down, or a server of it said it may not be what it was: its role is no
    /// longer known (`down`: a login to it failed).
    pub fn forget(&mut self, i: usize, down: bool, why: &str) -> Option<PrimaryChange> {
        let h = self.hosts.get_mut(i)?;
        h.role = if down {
            HostRole::Down
        } else {
            HostRole::Unknown
        };
        h.checked = Some(Instant::now());
        h.why = Some(why.to_string());
        self.choose_primary()
    }

    /// The live primary now (the one on the highest timeline; the current one on a tie).
    fn choose_primary(&mut self) -> Option<PrimaryChange> {
        let live: Vec<usize> = (0..self.hosts.len())
            .filter(|&i| self.is_live_primary(i))
            .collect();
        let now = match self.primary {
            Some(p) if live.contains(&p) => Some(p),
            _ => live.first().copied(),
        };
        if now == self.primary {
            return None;
        }
        let change = PrimaryChange {
            from: self.primary,
            to: now,
        };
        if let Some(p) = now {
            if let Some(from) = self.last_primary.filter(|&l| l != p) {
                self.switchovers += 1;
                if self.recent.len() == RECENT_SWITCHOVERS {
                    self.recent.pop_front();
                }
                self.recent.push_back(Switchover {
                    at: SystemTime::now(),
                    from,
                    to: p,
                });
            }
            self.last_primary = Some(p);
        }
        self.primary = now;
        Some(change)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(non_snake_case)]
    fn B(n: u64) -> StandbyLag {
        StandbyLag::Bytes(n)
    }

    fn primary(timeline: u32) -> Observed {
        Observed {
            standby: false,
            read_only: false,
            timeline,
            lag_bytes: 0,
            lag_ms: 0,
            lsn: 0,
            asked: None,
        }
    }

    fn standby(lag_bytes: u64) -> Observed {
        Observed {
            standby: true,
            read_only: true,
            timeline: 0,
            lag_bytes,
            lag_ms: lag_bytes / 10,
            lsn: 0,
            asked: None,
        }
    }

    #[test]
    fn read_write_follows_the_primary_through_a_switchover() {
        let rw = SessionAttrs::ReadWrite;
        let mut b = RoleBook::new(2);
        assert_eq!(b.order(0, rw, B(0)), vec![0, 1], "unknown: in list order");
        b.observe(0, primary(1));
        b.observe(1, standby(0));
        assert!(b.fits(0, rw, B(0)) && !b.fits(1, rw, B(0)));
        assert_eq!(b.order(1, rw, B(0)), vec![0, 1]);
        // Planned: the primary shuts down, the standby is promoted.
        let c = b.forget(0, true, "admin shutdown").unwrap();
        assert_eq!((c.from, c.to), (Some(0), None));
        assert!(!b.keeps(0, rw, B(0)), "no write reaches a host in doubt");
        assert!(!b.demoted(0), "in doubt only: transactions under way go on");
        let c = b.observe(1, primary(2)).unwrap();
        assert_eq!((c.from, c.to), (None, Some(1)));
        assert_eq!(b.primary, Some(1));
        assert_eq!(b.switchovers, 1);
        assert!(b.fits(1, rw, B(0)));
        let moves: Vec<_> = b.recent.iter().map(|s| (s.from, s.to)).collect();
        assert_eq!(moves, [(0, 1)], "the switchover is remembered");
    }

    #[test]
    fn only_the_last_switchovers_are_remembered() {
        let mut b = RoleBook::new(2);
        for n in 0..RECENT_SWITCHOVERS + 2 {
            let (up, down) = (n % 2, 1 - n % 2);
            b.observe(down, standby(0));
            b.observe(up, primary(1));
        }
        assert_eq!(b.switchovers as usize, RECENT_SWITCHOVERS + 1);
        assert_eq!(b.recent.len(), RECENT_SWITCHOVERS);
        let last = b.recent.back().unwrap();
        assert_eq!((last.from, last.to), (1, 0));
    }

    #[test]
    fn a_former_primary_back_on_an_older_timeline_is_fenced() {
        let rw = SessionAttrs::ReadWrite;
        let mut b = RoleBook::new(2);
        b.observe(0, primary(1));
        b.observe(1, primary(2));
        assert_eq!(b.primary, Some(1));
        assert_eq!(b.switchovers, 1);
        assert!(b.is_fenced(0) && !b.fits(0, rw, B(0)) && !b.keeps(0, rw, B(0)));
        assert!(b.demoted(0) && !b.demoted(1));
        assert_eq!(b.order(0, rw, B(0)), vec![1, 0]);
        // Even with the new primary down, the fenced one takes no writes.
        b.forget(1, true, "gone");
        assert!(!b.fits(0, rw, B(0)));
        assert_eq!(b.primary, None);
    }

    #[test]
    fn standbys_serve_reads_within_the_lag_bound_and_prefer_standby_falls_back() {
        let mut b = RoleBook::new(2);
        b.observe(0, primary(1));
        b.observe(1, standby(100));
        let ps = SessionAttrs::PreferStandby;
        assert!(b.fits(1, ps, B(1000)) && !b.fits(0, ps, B(1000)));
        assert!(b.fits(1, SessionAttrs::ReadOnly, B(0)), "0: no bound");
        b.observe(1, standby(5000));
        assert!(
            !b.fits(1, ps, B(1000)) && b.fits(0, ps, B(1000)),
            "lagging: the primary"
        );
        assert!(
            !b.fits(1, SessionAttrs::Standby, B(1000)),
            "standby: no fallback"
        );
        assert!(!b.fits(0, SessionAttrs::Standby, B(1000)));
        // A bound in time: 500 ms behind (see `standby`).
        let ms = |n| StandbyLag::Time(std::time::Duration::from_millis(n));
        assert!(b.fits(1, ps, ms(1000)) && !b.fits(0, ps, ms(1000)));
        assert!(!b.fits(1, ps, ms(100)) && b.fits(0, ps, ms(100)));
        assert!(SessionAttrs::Any == SessionAttrs::parse(None));
        assert!(b.keeps(1, SessionAttrs::Any, B(1)));
    }
}
