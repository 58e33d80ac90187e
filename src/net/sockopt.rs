//! TCP socket options from the settings, applied as PgBouncer's `tune_socket` does: on
//! every accepted client socket and every server socket (keepalive and its timers,
//! `TCP_USER_TIMEOUT`, `SO_SNDBUF`/`SO_RCVBUF`, `TCP_NODELAY`), and `TCP_DEFER_ACCEPT`
//! on TCP listeners. Unix sockets get none of them.
//!
//! The buffer sizes are set before the handshake, never after: a connection's receive
//! window (and its window scale) is chosen from the receive buffer it has during the
//! handshake, and a window once offered is not taken back. A buffer shrunk afterwards
//! leaves the peer sending more than fits; the kernel drops it and the peer retransmits,
//! so a stream crawls (a `pg_basebackup` through `tcp_socket_buffer = 4096` at some
//! 100 kB/s). So a server socket gets every option before `connect`, and a client socket
//! inherits its buffers from the listening socket ([`set_listener_buffers`]).
use std::os::fd::AsRawFd;
use std::time::Duration;

use socket2::{SockRef, TcpKeepalive};

use crate::config::Settings;

/// The TCP options of `[pgbouncer]` (`tcp_keepalive`, `tcp_keepidle`, `tcp_keepintvl`,
/// `tcp_keepcnt`, `tcp_user_timeout`, `tcp_socket_buffer`). Zero means "the system's
/// default", as in PgBouncer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpTuning {
    pub keepalive: bool,
    pub keepidle: Duration,
    pub keepintvl: Duration,
    pub keepcnt: u32,
    pub user_timeout: Duration,
    pub socket_buffer: usize,
}

impl Default for TcpTuning {
    /// PgBouncer's defaults: keepalive on with the system's timers, nothing else.
    fn default() -> Self {
        TcpTuning {
            keepalive: true,
            keepidle: Duration::ZERO,
            keepintvl: Duration::ZERO,
            keepcnt: 0,
            user_timeout: Duration::ZERO,
            socket_buffer: 0,
        }
    }
}

impl TcpTuning {
    pub fn from_settings(s: &Settings) -> TcpTuning {
        TcpTuning {
            keepalive: s.tcp_keepalive,
            keepidle: s.tcp_keepidle,
            keepintvl: s.tcp_keepintvl,
            keepcnt: s.tcp_keepcnt,
            user_timeout: s.tcp_user_timeout,
            socket_buffer: s.tcp_socket_buffer,
        }
    }

    /// The same options but the buffer sizes: for an accepted socket, whose buffers come
    /// from its listening socket (see the module's text).
    pub fn without_buffers(self) -> TcpTuning {
        TcpTuning {
            socket_buffer: 0,
            ..self
        }
    }

    /// Set the options on a TCP socket (to be connected: see the module's text for the
    /// buffers). The first failure is returned (the caller logs it as PgBouncer does,
    /// `setsockopt/…(fd) failed: …`, and goes on).
    pub fn apply(&self, sock: SockRef<'_>) -> Result<(), TuneError> {
        let at = |what: &'static str| move |e| TuneError { what, error: e };
        if self.keepalive {
            let mut k = TcpKeepalive::new();
            if !self.keepidle.is_zero() {
                k = k.with_time(self.keepidle);
            }
            if !self.keepintvl.is_zero() {
                k = k.with_interval(self.keepintvl);
            }
            if self.keepcnt > 0 {
                k = k.with_retries(self.keepcnt);
            }
            sock.set_tcp_keepalive(&k)
                .map_err(at("socket_set_keepalive"))?;
        } else {
            sock.set_keepalive(false)
                .map_err(at("socket_set_keepalive"))?;
        }
        if !self.user_timeout.is_zero() {
            sock.set_tcp_user_timeout(Some(self.user_timeout))
                .map_err(at("setsockopt/TCP_USER_TIMEOUT"))?;
        }
        if self.socket_buffer > 0 {
            sock.set_send_buffer_size(self.socket_buffer)
                .map_err(at("setsockopt/SO_SNDBUF"))?;
            sock.set_recv_buffer_size(self.socket_buffer)
                .map_err(at("setsockopt/SO_RCVBUF"))?;
        }
        sock.set_tcp_nodelay(true)
            .map_err(at("setsockopt/TCP_NODELAY"))?;
        Ok(())
    }

    /// [`TcpTuning::apply`], a failure logged as a warning (PgBouncer's words).
    pub fn apply_or_warn(&self, sock: SockRef<'_>) {
        let fd = sock.as_raw_fd();
        if let Err(e) = self.apply(sock) {
            tracing::warn!("{}({fd}) failed: {}", e.what, e.error);
        }
    }
}

/// `tcp_socket_buffer` on a TCP listening socket (when not 0): the sockets it accepts
/// inherit `SO_SNDBUF`/`SO_RCVBUF`, and the handshake offers a window that fits them.
pub fn set_listener_buffers(sock: SockRef<'_>, size: usize) {
    if size == 0 {
        return;
    }
    let fd = sock.as_raw_fd();
    if let Err(e) = sock.set_send_buffer_size(size) {
        tracing::warn!("setsockopt/SO_SNDBUF({fd}) failed: {e}");
    }
    if let Err(e) = sock.set_recv_buffer_size(size) {
        tracing::warn!("setsockopt/SO_RCVBUF({fd}) failed: {e}");
    }
}

/// Which option could not be set, and why.
#[derive(Debug)]
pub struct TuneError {
    pub what: &'static str,
    pub error: std::io::Error,
}

/// `tcp_defer_accept` on a TCP listening socket: `TCP_DEFER_ACCEPT` set to 1 s when on
/// (the kernel then wakes `accept` only once the client has sent data, or after its SYN-ACK
/// retries), 0 when off, as PgBouncer's `tune_accept`.
pub fn set_defer_accept(sock: SockRef<'_>, on: bool) {
    let val: libc::c_int = on.into();
    // SAFETY: a valid descriptor borrowed for the call, an int option of the right size.
    let res = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&val as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if res < 0 {
        let act = if on { "install" } else { "uninstall" };
        tracing::warn!(
            "tune_accept: {act} TCP_DEFER_ACCEPT: {}",
            std::io::Error::last_os_error()
        );
    }
}
