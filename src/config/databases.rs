//! `[databases]` and `[users]` entries (libpq-style `key=value` lists).
use super::PoolMode;

/// One `[databases]` entry.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DatabaseEntry {
    /// Name clients use.
    pub name: String,
    /// Server host; None = unix socket in the default location; a value starting with '/' is a socket dir.
    pub host: Option<String>,
    /// Server port (default 5432).
    pub port: u16,
    /// Server database name (default: `name`).
    pub dbname: Option<String>,
    /// Forced server user.
    pub user: Option<String>,
    /// Password for the forced user.
    pub password: Option<String>,
    pub auth_user: Option<String>,
    pub pool_size: Option<usize>,
    pub min_pool_size: Option<usize>,
    pub reserve_pool: Option<usize>,
    pub pool_mode: Option<PoolMode>,
    pub max_db_connections: Option<usize>,
    pub max_db_client_connections: Option<usize>,
    pub connect_query: Option<String>,
    pub client_encoding: Option<String>,
    pub datestyle: Option<String>,
    pub timezone: Option<String>,
    pub application_name: Option<String>,
}

/// One `[users]` entry.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UserEntry {
    pub name: String,
    pub pool_mode: Option<PoolMode>,
    pub pool_size: Option<usize>,
    pub reserve_pool_size: Option<usize>,
    pub max_user_connections: Option<usize>,
    pub max_user_client_connections: Option<usize>,
}
