//! The immutable configuration snapshot: `load` parses and validates a whole pgbouncer.ini.
//!
//! Types here are the interface the rest of pgcarpool uses; parsing lives in `ini`,
//! `settings`, `databases` and `auth_file`.
pub mod auth_file;
pub mod databases;
pub mod ini;
pub mod settings;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use auth_file::{AuthFile, Secret};
pub use databases::{DatabaseEntry, UserEntry};
pub use settings::Settings;

/// Pooling mode, as PgBouncer's `pool_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    Session,
    Transaction,
    Statement,
}

/// Client authentication method, as PgBouncer's `auth_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthType {
    Trust,
    Any,
    Plain,
    Md5,
    ScramSha256,
    Cert,
    Hba,
    Pam,
}

/// A config error, always naming where it came from (`file:line: key: message`).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}:{line}: {msg}")]
    At {
        file: String,
        line: usize,
        msg: String,
    },
    #[error("{file}: {msg}")]
    File { file: String, msg: String },
}

/// One complete, validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The main ini file this was loaded from.
    pub path: PathBuf,
    /// The `[pgbouncer]` section.
    pub settings: Settings,
    /// `[databases]` entries by client-visible name, without the `*` fallback.
    pub databases: BTreeMap<String, DatabaseEntry>,
    /// The `*` entry of `[databases]`, if any.
    pub fallback: Option<DatabaseEntry>,
    /// `[users]` entries.
    pub users: BTreeMap<String, UserEntry>,
    /// The parsed `auth_file` (empty when none is set).
    pub auth: AuthFile,
}

impl Config {
    /// Parse and validate `path` (and its `%include`s and `auth_file`).
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let _ = path;
        todo!("config::load")
    }

    /// Parse from ini text (tests); `%include` and `auth_file` resolve relative to `base_dir`.
    pub fn from_str(text: &str, name: &str, base_dir: &Path) -> Result<Config, ConfigError> {
        let _ = (text, name, base_dir);
        todo!("config::from_str")
    }

    /// The database entry a client asking for `dbname` gets: the named entry, or the
    /// fallback `*` entry with its name filled in, or None.
    pub fn database(&self, dbname: &str) -> Option<DatabaseEntry> {
        if let Some(d) = self.databases.get(dbname) {
            return Some(d.clone());
        }
        self.fallback.as_ref().map(|f| {
            let mut d = f.clone();
            d.name = dbname.to_string();
            d
        })
    }
}

/// `Duration::ZERO` means "disabled" for PgBouncer's timeouts.
pub fn enabled(d: Duration) -> Option<Duration> {
    if d.is_zero() { None } else { Some(d) }
}
