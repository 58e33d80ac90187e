//! Signals, as PgBouncer 1.23+: HUP→RELOAD, TERM→SHUTDOWN WAIT_FOR_CLIENTS (second TERM:
//! immediate), INT→SHUTDOWN WAIT_FOR_SERVERS, QUIT→immediate, USR1/USR2→PAUSE/RESUME.
//! The same `Shared` functions serve the admin console.
use std::path::PathBuf;
use std::sync::Arc;

use tokio::signal::unix::{SignalKind, signal};

use crate::app::Shared;
use crate::config;

/// Handle signals until the pooler has shut down.
pub async fn run(shared: Arc<Shared>, config_path: PathBuf) -> std::io::Result<()> {
    let mut hup = signal(SignalKind::hangup())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut quit = signal(SignalKind::quit())?;
    let mut usr1 = signal(SignalKind::user_defined1())?;
    let mut usr2 = signal(SignalKind::user_defined2())?;
    let mut shutting_down: Option<tokio::task::JoinHandle<()>> = None;
    loop {
        tokio::select! {
            _ = hup.recv() => match config::load(&config_path) {
                Ok(c) => {
                    let _ = shared.reload(c);
                }
                Err(e) => tracing::error!("reload failed, keeping the old configuration: {e}"),
            },
            _ = term.recv() => {
                if shutting_down.is_some() {
                    tracing::info!("second SIGTERM: shutting down now");
                    shared.shutdown_now();
                } else {
                    tracing::info!("SIGTERM: shutting down once all clients have left");
                    let s = shared.clone();
                    shutting_down = Some(tokio::spawn(async move { s.shutdown_wait_for_clients().await }));
                }
            }
            _ = int.recv() => {
                tracing::info!("SIGINT: shutting down once all servers are released");
                let s = shared.clone();
                shutting_down = Some(tokio::spawn(async move { s.shutdown_wait_for_servers().await }));
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
                tracing::info!("SIGUSR2: resuming");
                shared.resume_all();
            }
            _ = shared.tracker.wait() => return Ok(()),
        }
    }
}
