//! Thread per core: `workers` threads, each running its own single-threaded tokio runtime
//! (its own epoll instance and timers), so a client's task, its sockets and the server it
//! uses are driven by one thread with no cross-thread wake-ups on the hot path.
//!
//! Worker 0 is the runtime that started the pooler (the main thread in the binary, the test's
//! runtime in tests); workers 1.. are threads started here. Every worker accepts on the same
//! listening sockets; a connection accepted by a worker that has clearly more clients than
//! another is handed to the least busy one (see [`Workers::place`]). Servers are shared by
//! all workers through the pools: a server last driven by another worker is re-registered
//! with the current worker's runtime at checkout (`Conn::rehome`), and checkouts prefer
//! servers of their own worker, so that is rare.
//!
//! Clients gather on the fewest workers that carry the load (see [`next_active`]): the
//! first `active` workers take clients, one more when one of them is busier than
//! `worker_spread_load` percent of a core, one fewer when the load fits on fewer with room
//! to spare. Every other worker, and an active one with clearly more clients than another,
//! sheds clients between their transactions (`Workers::wants_move`; the client's socket is
//! re-registered on its new worker as a server's is). On a machine where PostgreSQL and the
//! clients share the cores, a second worker costs a fifth more CPU per transaction (more
//! sleeps and wake-ups, servers moved between threads) and buys nothing until the first
//! is busy: docs/performance.md.
use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

thread_local! {
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

/// The worker running on this thread (0 for the runtime that started the pooler).
pub fn current() -> usize {
    INDEX.with(Cell::get)
}

/// How many workers the `workers` setting asks for (0: one per CPU).
pub fn count(setting: usize) -> usize {
    match setting {
        0 => std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        n => n,
    }
}

/// How often the load of the workers is looked at ([`Workers::look`]).
pub const LOAD_PERIOD: Duration = Duration::from_millis(250);

/// The workers' CPU clocks at the last look.
pub struct LoadSeen {
    cpu: Vec<Option<Duration>>,
    at: Instant,
}

/// How many workers take clients next (`active` now), from how busy each worker was (its
/// thread's CPU time over the last period, per mille of a core): all of them when
/// `spread_at` is 0; one more when an active one was busier than `spread_at`; one fewer when
/// the active ones' load would fit on one fewer at under 80 % of `spread_at` each.
pub fn next_active(busy: &[u32], active: usize, spread_at: u32) -> usize {
    let n = busy.len().max(1);
    let active = active.clamp(1, n);
    if spread_at == 0 {
        return n;
    }
    let on = &busy[..active.min(busy.len())];
    if active < n && on.iter().any(|&b| b > spread_at) {
        return active + 1;
    }
    let total: u64 = on.iter().map(|&b| u64::from(b)).sum();
    if active > 1 && total * 10 < u64::from(spread_at) * 8 * (active as u64 - 1) {
        return active - 1;
    }
    active
}

/// The worker runtimes of one pooler.
pub struct Workers {
    handles: Vec<Handle>,
    /// Clients placed on each worker and not yet gone.
    clients: Vec<AtomicUsize>,
    /// Clients each worker is to give to others between their transactions.
    shed: Vec<AtomicUsize>,
    /// Workers 0..active take clients.
    active: AtomicUsize,
    /// Each worker's thread's CPU clock (set by the thread itself).
    clocks: Vec<OnceLock<libc::clockid_t>>,
    /// How busy each worker was over the last period (per mille of a core; SHOW WORKERS).
    busy: Vec<AtomicU32>,
    /// Cancelled to end the worker threads (their runtimes drop whatever is left).
    stop: CancellationToken,
}

/// This thread's CPU clock.
fn own_clock() -> Option<libc::clockid_t> {
    let mut id: libc::clockid_t = 0;
    // SAFETY: pthread_self is this thread; `id` is a valid place for the answer.
    (unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut id) } == 0).then_some(id)
}

/// CPU time of the thread whose clock is `id` (None once the thread is gone).
fn cpu_time(id: libc::clockid_t) -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid place for the answer.
    (unsafe { libc::clock_gettime(id, &mut ts) } == 0)
        .then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

impl Workers {
    /// Worker 0 is the current runtime; start `n - 1` threads for the others. Clients go to
    /// worker 0 only until the load says otherwise, unless `spread_at` is 0 (all take them).
    pub fn start(n: usize, spread_at: u32) -> std::io::Result<Workers> {
        let stop = CancellationToken::new();
        let mut handles = vec![Handle::current()];
        let clocks: Vec<OnceLock<libc::clockid_t>> =
            (0..n.max(1)).map(|_| OnceLock::new()).collect();
        if let Some(id) = own_clock() {
            let _ = clocks[0].set(id);
        }
        for (i, clock) in clocks.iter().enumerate().skip(1) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            handles.push(rt.handle().clone());
            let stop = stop.clone();
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::Builder::new()
                .name(format!("pgcarpool-w{i}"))
                .spawn(move || {
                    INDEX.with(|x| x.set(i));
                    let _ = tx.send(own_clock());
                    rt.block_on(stop.cancelled());
                })?;
            if let Ok(Some(id)) = rx.recv() {
                let _ = clock.set(id);
            }
        }
        let n = handles.len();
        let counters = || (0..n).map(|_| AtomicUsize::new(0)).collect();
        Ok(Workers {
            handles,
            clients: counters(),
            shed: counters(),
            active: AtomicUsize::new(if spread_at == 0 { n } else { 1 }),
            clocks,
            busy: (0..n).map(|_| AtomicU32::new(0)).collect(),
            stop,
        })
    }

    pub fn len(&self) -> usize {
        self.handles.len()
    }

    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }

    pub fn handle(&self, w: usize) -> &Handle {
        &self.handles[w]
    }

    /// Where a client accepted by worker `me` runs, counted there until [`Workers::left`]:
    /// `me` if it takes clients and has fewer than two clients more than the least busy
    /// worker that does, else that one.
    pub fn place(&self, me: usize) -> usize {
        let me = me.min(self.clients.len() - 1);
        let active = self
            .active
            .load(Ordering::Relaxed)
            .clamp(1, self.clients.len());
        let load = |w: usize| self.clients[w].load(Ordering::Relaxed);
        let (least, least_load) = (0..active)
            .map(|w| (w, load(w)))
            .min_by_key(|&(_, l)| l)
            .unwrap_or((me, 0));
        let w = if me < active && load(me) < least_load + 2 {
            me
        } else {
            least
        };
        self.clients[w].fetch_add(1, Ordering::Relaxed);
        w
    }

    /// Worker `me` is to shed clients (one atomic load).
    #[inline]
    pub fn sheds(&self, me: usize) -> bool {
        self.shed
            .get(me)
            .is_some_and(|q| q.load(Ordering::Relaxed) > 0)
    }

    /// Between two transactions of a client of worker `me`: the worker it is to move to
    /// (counted there from now on), if `me` is to shed clients (see [`Workers::look`]).
    /// One atomic load when not.
    pub fn wants_move(&self, me: usize) -> Option<usize> {
        let shed = self.shed.get(me)?;
        if shed.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let load = |w: usize| self.clients[w].load(Ordering::Relaxed);
        let active = self
            .active
            .load(Ordering::Relaxed)
            .clamp(1, self.clients.len());
        let to = (0..active).filter(|&w| w != me).min_by_key(|&w| load(w))?;
        if me < active && load(to) + 2 > load(me) {
            return None;
        }
        shed.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |q| q.checked_sub(1))
            .ok()?;
        self.clients[me].fetch_sub(1, Ordering::Relaxed);
        self.clients[to].fetch_add(1, Ordering::Relaxed);
        Some(to)
    }

    /// One look at the workers' load, every [`LOAD_PERIOD`] (the first only starts the
    /// clocks): how busy each worker was since the last, and so which take clients and
    /// which shed them. `spread_at`: `worker_spread_load` in per mille of a core.
    pub fn look(&self, seen: &mut Option<LoadSeen>, spread_at: u32) {
        let now = |w: usize| self.clocks[w].get().and_then(|&id| cpu_time(id));
        let cpu: Vec<Option<Duration>> = (0..self.len()).map(now).collect();
        let Some(last) = seen.replace(LoadSeen {
            cpu: cpu.clone(),
            at: Instant::now(),
        }) else {
            return;
        };
        let wall = last.at.elapsed().as_nanos().max(1);
        for (w, (t, l)) in cpu.iter().zip(&last.cpu).enumerate() {
            let used = match (t, l) {
                (Some(t), Some(l)) => t.saturating_sub(*l).as_nanos(),
                _ => 0,
            };
            let busy = (used * 1000 / wall).min(1000) as u32;
            // Smoothed: half this period, half the ones before.
            let before = self.busy[w].load(Ordering::Relaxed);
            self.busy[w].store((before + busy) / 2, Ordering::Relaxed);
        }
        self.rebalance(spread_at);
    }

    /// The workers were stopped.
    pub fn stopped(&self) -> bool {
        self.stop.is_cancelled()
    }

    /// Which workers take clients, from their load; how many clients each is to shed: all
    /// of them if it takes none, half its lead on the least busy if that is two or more.
    fn rebalance(&self, spread_at: u32) {
        let busy: Vec<u32> = self
            .busy
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let active = next_active(&busy, self.active.load(Ordering::Relaxed), spread_at);
        self.active.store(active, Ordering::Relaxed);
        let counts = self.clients();
        let least = counts[..active].iter().copied().min().unwrap_or(0);
        for (w, &n) in counts.iter().enumerate() {
            let shed = match n {
                n if w >= active => n,
                n if n >= least + 2 => (n - least) / 2,
                _ => 0,
            };
            self.shed[w].store(shed, Ordering::Relaxed);
        }
    }

    /// Workers 0..active take clients.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// How busy each worker was over the last periods (per mille of a core).
    pub fn busy(&self) -> Vec<u32> {
        self.busy
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect()
    }

    /// A client placed on `w` is gone.
    pub fn left(&self, w: usize) {
        self.clients[w].fetch_sub(1, Ordering::Relaxed);
    }

    /// Clients per worker (SHOW CARPOOL).
    pub fn clients(&self) -> Vec<usize> {
        self.clients
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }

    /// End the worker threads (after shutdown; their remaining tasks are dropped).
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn places_on_the_accepting_worker_until_it_is_clearly_busier() {
        let w = Workers::start(2, 0).unwrap();
        assert_eq!(w.len(), 2);
        assert_eq!(w.place(0), 0); // 1, 0
        assert_eq!(w.place(0), 0); // 2, 0
        assert_eq!(w.place(0), 1); // 2, 1
        assert_eq!(w.place(1), 1); // 2, 2
        w.left(0);
        w.left(0); // 0, 2
        assert_eq!(w.place(1), 0); // 1, 2
        assert_eq!(w.clients(), vec![1, 2]);
        w.stop();
    }

    #[tokio::test]
    async fn worker_threads_know_their_index() {
        let w = Workers::start(3, 0).unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        w.handle(2).spawn(async move {
            let _ = tx.send(current());
        });
        assert_eq!(rx.await.unwrap(), 2);
        assert_eq!(current(), 0);
        w.stop();
    }

    #[test]
    fn the_active_workers_follow_the_load() {
        // (busy per worker in per mille, active now, spread_at) -> active next
        let cases: &[(&[u32], usize, u32, usize)] = &[
            (&[0, 0], 2, 0, 2),       // 0: always all
            (&[0, 0], 1, 0, 2),       //
            (&[100, 0], 1, 750, 1),   // one worker at 10 %: stays one
            (&[749, 0], 1, 750, 1),   // at the line: stays
            (&[751, 0], 1, 750, 2),   // busier than the line: one more
            (&[900, 900], 2, 750, 2), // all busy, no more workers: stays
            (&[280, 300], 2, 750, 1), // 58 % fits on one at under 80 % of the line
            (&[350, 300], 2, 750, 2), // 65 % does not
            (&[800, 10, 0], 2, 750, 3),
            (&[200, 200, 200], 3, 750, 2),
            (&[500, 500, 500], 3, 750, 3),
            (&[0], 1, 750, 1),
        ];
        for &(busy, active, spread_at, want) in cases {
            assert_eq!(
                next_active(busy, active, spread_at),
                want,
                "{busy:?}, {active} active, spread at {spread_at}"
            );
        }
    }

    #[tokio::test]
    async fn inactive_workers_shed_every_client_and_busy_ones_half_their_lead() {
        let w = Workers::start(3, 750).unwrap();
        assert_eq!(w.active(), 1);
        // Placed while only worker 0 takes clients: all there, whoever accepted them.
        for me in [0, 1, 2, 1, 0, 2] {
            assert_eq!(w.place(me), 0);
        }
        assert_eq!(w.wants_move(0), None, "nothing to shed before a look");
        // Worker 0 is busy: a third of its clients... half its lead goes to worker 1.
        w.busy[0].store(900, Ordering::Relaxed);
        w.rebalance(750);
        assert_eq!(w.active(), 2);
        let moved: Vec<_> = (0..6).filter_map(|_| w.wants_move(0)).collect();
        assert_eq!(moved, [1, 1, 1], "half of a lead of 6");
        assert_eq!(w.clients(), [3, 3, 0]);
        // Idle again: worker 1 takes no clients and sheds them all back.
        w.busy[0].store(100, Ordering::Relaxed);
        w.rebalance(750);
        assert_eq!(w.active(), 1);
        assert_eq!(w.wants_move(0), None);
        let moved: Vec<_> = (0..5).filter_map(|_| w.wants_move(1)).collect();
        assert_eq!(moved, [0, 0, 0]);
        assert_eq!(w.clients(), [6, 0, 0]);
        // spread_at 0: every worker takes clients, and worker 0 gives a half of its lead.
        w.rebalance(0);
        assert_eq!(w.active(), 3);
        let moved: Vec<_> = (0..6).filter_map(|_| w.wants_move(0)).collect();
        assert_eq!(moved, [1, 2, 1], "to the least busy each time");
        assert_eq!(w.clients(), [3, 2, 1]);
        assert_eq!(w.place(2), 2);
        w.stop();
    }
}
