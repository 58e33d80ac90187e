//! systemd, as PgBouncer 1.18+: `Type=notify` readiness (READY=1 once listening,
//! RELOADING=1 + MONOTONIC_USEC then READY=1 around a reload, STOPPING=1 when a shutdown
//! begins, STATUS= lines) and socket activation (`LISTEN_FDS`, in `net::listen`). Without
//! `NOTIFY_SOCKET` in the environment every call here does nothing.
//!
//! A notification never waits: the socket's queue is short (10 datagrams on Linux), and a
//! manager that does not read it (hung, or gone with `NOTIFY_SOCKET` left behind) would
//! otherwise stop the thread that sends, which also runs signals and clients. When the
//! queue is full the notification is dropped, with a warning.
use std::fmt::Write as _;
use std::os::unix::net::UnixDatagram;

use sd_notify::NotifyState;

fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = notify(states) {
        tracing::warn!("could not notify the service manager: {e}");
    }
}

/// `sd_notify::notify` without blocking: the same message (one `KEY=value` line per
/// state), sent on a non-blocking socket.
fn notify(states: &[NotifyState<'_>]) -> std::io::Result<()> {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(());
    };
    let mut msg = String::new();
    for s in states {
        let _ = writeln!(msg, "{s}");
    }
    let sock = UnixDatagram::unbound()?;
    sock.set_nonblocking(true)?;
    sock.connect(path)?;
    match sock.send(msg.as_bytes()) {
        Ok(n) if n == msg.len() => Ok(()),
        Ok(_) => Err(std::io::Error::new(
            std::io::ErrorKind::WriteZero,
            "incomplete write",
        )),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Err(std::io::Error::new(
            e.kind(),
            format!(
                "its socket is full, dropped: {}",
                msg.trim_end().replace('\n', " ")
            ),
        )),
        Err(e) => Err(e),
    }
}

/// Listening: the service is up. `status` names where (for `systemctl status`, and for
/// tests that start pgcarpool on port 0); MAINPID is this process (the daemon after `-d`).
pub fn ready(status: &str) {
    send(&[
        NotifyState::Ready,
        NotifyState::MainPid(std::process::id()),
        NotifyState::Status(status),
    ]);
}

/// A reload begins (also right for `Type=notify-reload`, which needs the timestamp).
pub fn reloading() {
    let mut states = vec![
        NotifyState::Reloading,
        NotifyState::Status("reloading the configuration"),
    ];
    if let Ok(now) = NotifyState::monotonic_usec_now() {
        states.push(now);
    }
    send(&states);
}

/// A shutdown begins.
pub fn stopping(status: &str) {
    send(&[NotifyState::Stopping, NotifyState::Status(status)]);
}

/// A status line for `systemctl status`.
pub fn status(status: &str) {
    send(&[NotifyState::Status(status)]);
}
