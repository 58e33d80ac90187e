//! A TCP forwarder between pgcarpool and PostgreSQL that can misbehave on demand, for the
//! network-fault tests (this kernel has no netem, and a userspace proxy needs no root):
//! `blackhole` holds every byte in both directions, of the connections open and of new
//! ones it accepts (a server that was up and whose packets are now dropped, or one that
//! accepts TCP and never answers); `restore` lets them flow again (what TCP retransmission
//! delivers once a drop ends); `delay` adds latency to every chunk in each direction.
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
struct State {
    blackhole: AtomicBool,
    delay_ms: AtomicU64,
    open: AtomicUsize,
    changed: tokio::sync::Notify,
}

pub struct FaultProxy {
    port: u16,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Forward 127.0.0.1:<new port> to 127.0.0.1:`target`.
    pub async fn start(target: u16) -> FaultProxy {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State::default());
        let st = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((down, _)) = listener.accept().await {
                let st = st.clone();
                tokio::spawn(async move {
                    st.open.fetch_add(1, Ordering::SeqCst);
                    // A blackholed server does not even get the connection.
                    st.wait_open().await;
                    if let Ok(up) = TcpStream::connect(("127.0.0.1", target)).await {
                        let (dr, dw) = down.into_split();
                        let (ur, uw) = up.into_split();
                        tokio::join!(pump(dr, uw, st.clone()), pump(ur, dw, st.clone()));
                    }
                    st.open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        FaultProxy { port, state, task }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Hold every byte, both ways, from now on (connections are accepted, never answered).
    pub fn blackhole(&self) {
        self.state.blackhole.store(true, Ordering::SeqCst);
    }

    /// Let bytes flow again, those held first.
    pub fn restore(&self) {
        self.state.blackhole.store(false, Ordering::SeqCst);
        self.state.changed.notify_waiters();
    }

    /// Add `d` before every chunk is passed on, in each direction.
    pub fn delay(&self, d: Duration) {
        self.state
            .delay_ms
            .store(d.as_millis() as u64, Ordering::SeqCst);
    }

    /// Connections through the proxy now.
    pub fn open(&self) -> usize {
        self.state.open.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl State {
    async fn wait_open(&self) {
        loop {
            let changed = self.changed.notified();
            if !self.blackhole.load(Ordering::SeqCst) {
                return;
            }
            changed.await;
        }
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    st: Arc<State>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        st.wait_open().await;
        let d = st.delay_ms.load(Ordering::SeqCst);
        if d > 0 {
            tokio::time::sleep(Duration::from_millis(d)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
