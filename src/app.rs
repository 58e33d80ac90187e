//! Composition root: `Shared` state, listeners, janitor, reload and shutdown.
use std::net::SocketAddr;

use crate::config::Config;

/// A running pooler (in-process: tests start one per test on port 0).
pub struct AppHandle {
    /// The bound TCP address of the first listener (port 0 in the config → a free port).
    pub addr: SocketAddr,
}

/// Start a pooler with `config` on the current tokio runtime.
pub async fn start(config: Config) -> std::io::Result<AppHandle> {
    let _ = config;
    todo!()
}

impl AppHandle {
    /// Apply a new config as SIGHUP would (bad config: error, old one stays).
    pub fn reload(&self, config: Config) {
        let _ = config;
        todo!()
    }
    /// Immediate shutdown (SIGQUIT), waiting for tasks to end.
    pub async fn shutdown(self) {}
}
