//! systemd, as PgBouncer 1.18+: `Type=notify` readiness (READY=1 once listening,
//! RELOADING=1 + MONOTONIC_USEC then READY=1 around a reload, STOPPING=1 when a shutdown
//! begins, STATUS= lines) and socket activation (`LISTEN_FDS`, in `net::listen`). Without
//! `NOTIFY_SOCKET` in the environment every call here does nothing.
use sd_notify::NotifyState;

fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!("could not notify the service manager: {e}");
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
