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
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

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

/// The worker runtimes of one pooler.
pub struct Workers {
    handles: Vec<Handle>,
    /// Clients placed on each worker and not yet gone.
    clients: Vec<AtomicUsize>,
    /// Cancelled to end the worker threads (their runtimes drop whatever is left).
    stop: CancellationToken,
}

impl Workers {
    /// Worker 0 is the current runtime; start `n - 1` threads for the others.
    pub fn start(n: usize) -> std::io::Result<Workers> {
        let stop = CancellationToken::new();
        let mut handles = vec![Handle::current()];
        for i in 1..n.max(1) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            handles.push(rt.handle().clone());
            let stop = stop.clone();
            std::thread::Builder::new()
                .name(format!("pgcarpool-w{i}"))
                .spawn(move || {
                    INDEX.with(|x| x.set(i));
                    rt.block_on(stop.cancelled());
                })?;
        }
        let clients = handles.iter().map(|_| AtomicUsize::new(0)).collect();
        Ok(Workers {
            handles,
            clients,
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
    /// `me`, unless another worker has at least two clients fewer (then the least busy).
    pub fn place(&self, me: usize) -> usize {
        let me = me.min(self.clients.len() - 1);
        let load = |w: usize| self.clients[w].load(Ordering::Relaxed);
        let (least, least_load) = (0..self.clients.len())
            .map(|w| (w, load(w)))
            .min_by_key(|&(_, l)| l)
            .unwrap_or((me, 0));
        let w = if load(me) >= least_load + 2 {
            least
        } else {
            me
        };
        self.clients[w].fetch_add(1, Ordering::Relaxed);
        w
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
        let w = Workers::start(2).unwrap();
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
        let w = Workers::start(3).unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        w.handle(2).spawn(async move {
            let _ = tx.send(current());
        });
        assert_eq!(rx.await.unwrap(), 2);
        assert_eq!(current(), 0);
        w.stop();
    }
}
