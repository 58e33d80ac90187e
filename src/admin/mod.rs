//! The admin console: database `pgbouncer` (or `pgcarpool`), PgBouncer's commands.
use std::sync::Arc;

use crate::app::Shared;
use crate::client::ClientError;
use crate::config::Config;
use crate::net::Conn;

/// What a console user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// admin_users: every command.
    Admin,
    /// stats_users: SHOW only.
    Stats,
}

pub fn is_admin_db(db: &str) -> bool {
    db == "pgbouncer" || db == "pgcarpool"
}

/// The console role of `user`, None = not allowed.
pub fn role_of(cfg: &Config, user: &str) -> Option<Role> {
    if cfg.settings.admin_users.iter().any(|u| u == user) {
        Some(Role::Admin)
    } else if cfg.settings.stats_users.iter().any(|u| u == user) {
        Some(Role::Stats)
    } else {
        None
    }
}

/// Serve one console session (after authentication).
pub async fn run(
    shared: &Arc<Shared>,
    conn: &mut Conn,
    user: &str,
    role: Role,
) -> Result<(), ClientError> {
    let _ = (shared, conn, user, role);
    Err(ClientError::fatal(
        "0A000",
        "the admin console is not implemented yet".into(),
    ))
}
