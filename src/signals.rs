//! Signals, as PgBouncer 1.23+: HUP→RELOAD, TERM→SHUTDOWN WAIT_FOR_CLIENTS (second TERM:
//! immediate), INT→SHUTDOWN WAIT_FOR_SERVERS, QUIT→immediate, USR1/USR2→PAUSE/RESUME.
//! The same `Shared` functions serve the admin console.
use std::sync::Arc;

use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::shared::Shared;

/// The signals pgcarpool handles, caught from the moment this exists (install before
/// telling anyone the pooler is up: an early SIGHUP must reload, not kill).
pub struct Signals {
    hup: Signal,
    term: Signal,
    int: Signal,
    quit: Signal,
    usr1: Signal,
    usr2: Signal,
}

/// Catch the signals (on the current runtime); handle them with [`run`].
pub fn install() -> std::io::Result<Signals> {
    Ok(Signals {
        hup: signal(SignalKind::hangup())?,
        term: signal(SignalKind::terminate())?,
        int: signal(SignalKind::interrupt())?,
        quit: signal(SignalKind::quit())?,
        usr1: signal(SignalKind::user_defined1())?,
        usr2: signal(SignalKind::user_defined2())?,
    })
}

/// Handle signals until the pooler has shut down.
pub async fn run(signals: Signals, shared: Arc<Shared>) -> std::io::Result<()> {
    let Signals {
        mut hup,
        mut term,
        mut int,
        mut quit,
        mut usr1,
        mut usr2,
    } = signals;
    let mut shutting_down: Option<tokio::task::JoinHandle<()>> = None;
    loop {
        tokio::select! {
            _ = hup.recv() => {
                tracing::info!("SIGHUP: reloading the configuration");
                let _ = shared.reload_from_file();
            }
            _ = term.recv() => {
                if shutting_down.is_some() || shared.shutting_down() {
                    tracing::info!("second SIGTERM: shutting down now");
                    shared.shutdown_now();
                } else {
                    tracing::info!("SIGTERM: shutting down once all clients have left");
                    let s = shared.clone();
                    shutting_down = Some(tokio::spawn(async move { s.shutdown_wait_for_clients().await }));
                }
            }
            _ = int.recv() => {
                if shared.shutting_down() {
                    tracing::info!("got SIGINT while shutting down, fast exit");
                    shared.shutdown_now();
                } else {
                    tracing::info!("SIGINT: shutting down once all servers are released");
                    let s = shared.clone();
                    shutting_down = Some(tokio::spawn(async move { s.shutdown_wait_for_servers().await }));
                }
            }
            _ = quit.recv() => {
                tracing::info!("SIGQUIT: shutting down now");
                shared.shutdown_now();
            }
            _ = usr1.recv() => {
                tracing::info!("SIGUSR1: pausing");
                let s = shared.clone();
                tokio::spawn(async move { s.pause_all().await; tracing::info!("paused") });
            }
            _ = usr2.recv() => {
                if shared.shutting_down() {
                    // PgBouncer's words: resuming would undo the shutdown's pause.
                    tracing::info!("got SIGUSR2 while shutting down, ignoring");
                } else {
                    tracing::info!("SIGUSR2: resuming");
                    shared.resume_all();
                }
            }
            _ = shared.tracker().wait() => return Ok(()),
        }
    }
}
