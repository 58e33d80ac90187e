//! Listening sockets (TCP via socket2 with SO_REUSEPORT when asked, Unix socket) and the
//! accept loop: one task per client, max_client_conn enforced here.
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use socket2::{Domain, Protocol, SockRef, Socket, TcpKeepalive, Type};
use tokio::net::{TcpListener, UnixListener};

use super::{Conn, Stream};
use crate::app::Shared;
use crate::config::Settings;
use crate::proto::backend;

pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

impl Listener {
    pub fn local_tcp_addr(&self) -> Option<SocketAddr> {
        match self {
            Listener::Tcp(l) => l.local_addr().ok(),
            Listener::Unix(..) => None,
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Bind every listen_addr on listen_port, and the Unix socket in unix_socket_dir.
pub fn bind(s: &Settings) -> std::io::Result<Vec<Listener>> {
    let mut out = Vec::new();
    let mut port = s.listen_port;
    for addr in s.listen_addrs() {
        let addrs: Vec<SocketAddr> = if addr == "*" {
            vec![SocketAddr::from(([0, 0, 0, 0], port))]
        } else {
            (addr.as_str(), port).to_socket_addrs()?.collect()
        };
        for a in addrs {
            let l = bind_tcp(a, s.so_reuseport)?;
            // listen_port = 0 (tests): every address shares the first port picked.
            if port == 0 {
                port = l.local_addr()?.port();
            }
            out.push(Listener::Tcp(l));
        }
    }
    if !s.unix_socket_dir.is_empty() {
        let path = PathBuf::from(format!("{}/.s.PGSQL.{}", s.unix_socket_dir, port));
        if path.exists() && std::os::unix::net::UnixStream::connect(&path).is_err() {
            let _ = std::fs::remove_file(&path); // stale socket from a dead process
        }
        let l = UnixListener::bind(&path)?;
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(
                &path,
                std::fs::Permissions::from_mode(s.unix_socket_mode),
            );
        }
        out.push(Listener::Unix(l, path));
    }
    Ok(out)
}

fn bind_tcp(addr: SocketAddr, reuseport: bool) -> std::io::Result<TcpListener> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    sock.set_reuse_address(true)?;
    if reuseport {
        sock.set_reuse_port(true)?;
    }
    sock.set_nonblocking(true)?;
    sock.bind(&addr.into())?;
    sock.listen(1024)?;
    TcpListener::from_std(sock.into())
}

/// Accept clients until `stop_accepting`; each gets its own task.
pub async fn accept_loop(l: Listener, shared: Arc<Shared>) {
    loop {
        let accepted = tokio::select! {
            _ = shared.stop_accepting.cancelled() => return,
            r = accept(&l) => r,
        };
        let stream = match accepted {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let cfg = shared.config.load();
        if let Stream::Tcp(t) = &stream {
            let _ = t.set_nodelay(true);
            if cfg.settings.tcp_keepalive {
                let _ = SockRef::from(t).set_tcp_keepalive(&TcpKeepalive::new());
            }
        }
        let max = cfg.settings.max_client_conn;
        if max > 0 && shared.client_conns.load(Ordering::Relaxed) >= max {
            shared.tracker.spawn(refuse(
                stream,
                "no more connections allowed (max_client_conn)",
            ));
            continue;
        }
        let id = shared.client_opened();
        let s2 = shared.clone();
        shared.tracker.spawn(async move {
            crate::client::run(s2.clone(), stream, id).await;
            s2.client_closed();
        });
    }
}

async fn accept(l: &Listener) -> std::io::Result<Stream> {
    match l {
        Listener::Tcp(t) => Ok(Stream::Tcp(t.accept().await?.0)),
        Listener::Unix(u, _) => Ok(Stream::Unix(u.accept().await?.0)),
    }
}

async fn refuse(stream: Stream, why: &str) {
    let mut conn = Conn::new(stream);
    // The client sends its startup packet first; answer it with the error.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), conn.fill(8)).await;
    conn.queue_with(|b| backend::error_response(b, "FATAL", "53300", why));
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), conn.flush()).await;
}
