//! Online-restart state every part of the pooler reads: the phase (running, SUSPENDed,
//! handing over), the listening sockets SHOW FDS passes, the outbox of clients on their
//! way to the new process, and (new process) the clients still with the old one.
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::{mpsc, oneshot, watch};

use super::registry::Registry;
use crate::lock::Locked;
use crate::net::listen::Bound;

/// A cancel request the new process passes to the old one: the key and the rest of a
/// long (protocol 3.2) secret.
pub type ForwardedCancel = ((i32, i32), Vec<u8>);

/// Where a pooler is in an online restart (the old process's side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Running,
    /// SUSPEND: nothing is accepted, idle clients are not read.
    Suspended,
    /// HANDOVER: the listeners are the new process's; idle clients move to it.
    HandingOver,
}

/// The online-restart phase as an idle client sees it: one receiver for the client's whole
/// life, read only when it changed (an atomic load per wait, no lock).
pub struct PhaseWatch {
    rx: watch::Receiver<Phase>,
    now: Phase,
}

impl PhaseWatch {
    pub fn current(&mut self) -> Phase {
        if self.rx.has_changed().unwrap_or(false) {
            self.now = *self.rx.borrow_and_update();
        }
        self.now
    }

    /// Whether the phase changed since `current` last looked (without looking).
    pub fn moved(&self) -> bool {
        self.rx.has_changed().unwrap_or(false)
    }

    /// Resolves when the phase changes (never once the sender is gone).
    pub async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        // `changed` marked the value seen: `current` would not see it change.
        self.now = *self.rx.borrow_and_update();
    }
}

/// A client on its way to the new process: its session, its socket, and where to say
/// whether the new process took it.
pub struct Outgoing {
    pub session: Vec<u8>,
    pub fd: OwnedFd,
    pub taken: oneshot::Sender<bool>,
}

/// Online-restart state in `Shared`.
pub struct Restart {
    phase: watch::Sender<Phase>,
    /// Descriptors of the listening sockets, for SHOW FDS.
    sockets: Mutex<Vec<Bound>>,
    /// Set at HANDOVER: the connection to the new process takes clients from here.
    outbox: OnceLock<mpsc::Sender<Outgoing>>,
    /// Set at HANDOVER: the new process has these very listening sockets (SHOW FDS), so
    /// they close here without accepting what is queued; otherwise (SO_REUSEPORT) this
    /// process's own sockets accept their queue first, as on SIGTERM.
    sockets_passed: std::sync::atomic::AtomicBool,
    /// New process: the clients still with the old one (SHOW CLIENTS lists them).
    staying: Mutex<Vec<StayingClient>>,
    /// New process: cancel requests for those clients go to the old one through here.
    cancels: Mutex<Option<mpsc::UnboundedSender<ForwardedCancel>>>,
    /// Woken at each phase change: idle clients wait on their own handle's waker, not on
    /// the phase's channel (`transaction::park`).
    clients: Arc<Registry>,
}

impl Default for Restart {
    fn default() -> Self {
        Restart::new(Arc::default())
    }
}

impl Restart {
    pub fn new(clients: Arc<Registry>) -> Restart {
        Restart {
            clients,
            phase: watch::Sender::new(Phase::Running),
            sockets: Mutex::new(Vec::new()),
            outbox: OnceLock::new(),
            sockets_passed: Default::default(),
            staying: Mutex::new(Vec::new()),
            cancels: Mutex::new(None),
        }
    }

    /// Change the phase with `f`; every client looks again if it changed.
    fn change(&self, f: impl FnOnce(&mut Phase) -> bool) {
        if self.phase.send_if_modified(f) {
            self.clients.wake_all();
        }
    }

    pub fn phase(&self) -> Phase {
        *self.phase.borrow()
    }
    pub fn subscribe(&self) -> watch::Receiver<Phase> {
        self.phase.subscribe()
    }
    pub fn watch(&self) -> PhaseWatch {
        let mut rx = self.phase.subscribe();
        let now = *rx.borrow_and_update();
        PhaseWatch { rx, now }
    }
    /// SUSPEND: false when a handover has begun (nothing to suspend any more).
    pub fn suspend(&self) -> bool {
        self.change(|p| match p {
            Phase::Running => {
                *p = Phase::Suspended;
                true
            }
            _ => false,
        });
        self.phase() == Phase::Suspended
    }
    /// RESUME after SUSPEND.
    pub fn resume(&self) {
        self.change(|p| match p {
            Phase::Suspended => {
                *p = Phase::Running;
                true
            }
            _ => false,
        });
    }
    /// HANDOVER came after SHOW FDS: the listening sockets are the new process's too.
    pub fn sockets_passed(&self) -> bool {
        self.sockets_passed.load(Ordering::Relaxed)
    }

    /// New process: the clients still with the old process.
    pub fn staying(&self) -> Vec<StayingClient> {
        self.staying.locked().clone()
    }

    /// New process: a cancel request for a client still with the old process goes there
    /// (`rest`: the rest of a long secret, which the old process checks). False: no such
    /// client.
    pub fn forward_cancel(&self, key: (i32, i32), rest: &[u8]) -> bool {
        if !self.staying.locked().iter().any(|c| c.key == key) {
            return false;
        }
        let g = self.cancels.locked();
        g.as_ref()
            .is_some_and(|tx| tx.send((key, rest.to_vec())).is_ok())
    }

    /// Keep a descriptor of each listening socket (SHOW FDS passes them).
    pub fn keep_sockets(&self, socks: Vec<Bound>) {
        *self.sockets.locked() = socks;
    }
    /// `tcp_defer_accept` changed on a reload: set it on every TCP listening socket.
    pub fn set_defer_accept(&self, on: bool) {
        let g = self.sockets.locked();
        for b in g.iter() {
            if let Bound::Tcp(l) = b {
                crate::net::sockopt::set_defer_accept(socket2::SockRef::from(l), on);
            }
        }
    }
    /// `tcp_socket_buffer` (at start, and when a reload changes it): set on every TCP
    /// listening socket, for the connections it accepts from then on.
    pub fn set_socket_buffer(&self, size: usize) {
        let g = self.sockets.locked();
        for b in g.iter() {
            if let Bound::Tcp(l) = b {
                crate::net::sockopt::set_listener_buffers(socket2::SockRef::from(l), size);
            }
        }
    }
    /// HANDOVER (old process): open the outbox the connection to the new process takes
    /// clients from. False: a handover is under way already.
    pub fn open_outbox(&self, outbox: mpsc::Sender<Outgoing>) -> bool {
        self.outbox.set(outbox).is_ok()
    }

    /// HANDOVER (old process): mark whether the listening sockets went with SHOW FDS (the
    /// pooler was SUSPENDed), and move to `HandingOver`.
    pub fn start_handing_over(&self) {
        let passed = self.phase() == Phase::Suspended;
        self.sockets_passed.store(passed, Ordering::Relaxed);
        self.change(|p| std::mem::replace(p, Phase::HandingOver) != Phase::HandingOver);
    }

    /// Where a client on its way to the new process goes (None: no handover under way).
    pub fn outbox(&self) -> Option<mpsc::Sender<Outgoing>> {
        self.outbox.get().cloned()
    }

    /// New process: the clients still with the old one, and where their cancel requests
    /// go (None: the old process is gone, nobody stays).
    pub fn set_staying(&self, list: Vec<StayingClient>) {
        *self.staying.locked() = list;
    }
    pub fn set_cancels(&self, tx: Option<mpsc::UnboundedSender<ForwardedCancel>>) {
        *self.cancels.locked() = tx;
    }

    /// The listening sockets: (duplicate descriptor, addr text, port).
    pub fn listening(&self) -> Vec<(OwnedFd, String, Option<u16>)> {
        let g = self.sockets.locked();
        g.iter()
            .filter_map(|b| {
                let (fd, addr, port) = match b {
                    Bound::Tcp(l) => {
                        let a = l.local_addr().ok()?;
                        (
                            OwnedFd::from(l.try_clone().ok()?),
                            a.ip().to_string(),
                            Some(a.port()),
                        )
                    }
                    Bound::Unix(l, _) => {
                        (OwnedFd::from(l.try_clone().ok()?), "unix".to_string(), None)
                    }
                };
                Some((fd, addr, port))
            })
            .collect()
    }
}

/// A client that stays with the old process (pinned, session mode…), as the new process
/// lists it in SHOW CLIENTS and forwards its cancel requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StayingClient {
    pub user: String,
    pub db: String,
    pub addr: String,
    pub connect_time_us: u64,
    pub key: (i32, i32),
    /// Why it stays (or that it moves when its transaction ends).
    pub note: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_watch_sees_every_change_whether_waited_for_or_not() {
        let r = Restart::default();
        let mut w = r.watch();
        assert_eq!(w.current(), Phase::Running);
        r.suspend();
        assert_eq!(w.current(), Phase::Suspended);
        r.resume();
        w.changed().await;
        assert_eq!(w.current(), Phase::Running);
        r.suspend();
        assert_eq!(w.current(), Phase::Suspended);
    }

    #[test]
    fn suspend_and_resume_move_the_phase_and_handover_ends_them() {
        let r = Restart::default();
        assert!(r.suspend());
        assert_eq!(r.phase(), Phase::Suspended);
        r.resume();
        assert_eq!(r.phase(), Phase::Running);
        r.phase.send_replace(Phase::HandingOver);
        assert!(!r.suspend());
        r.resume();
        assert_eq!(r.phase(), Phase::HandingOver);
    }
}
