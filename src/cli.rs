//! The command line, with PgBouncer's flags (also the source of the man page).
use std::path::PathBuf;

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "pgcarpool",
    version,
    disable_version_flag = true,
    about = "PostgreSQL connection pooler (PgBouncer compatible)"
)]
pub struct Cli {
    /// Print the version, as SHOW VERSION gives it: `PgBouncer <compatible version>
    /// (pgcarpool <version>)`, so tools that read PgBouncer's version keep working.
    #[arg(short = 'V', long = "version")]
    pub version: bool,
    /// Run in the background (needs pidfile in the config); everything that can fail is
    /// checked before forking.
    #[arg(short = 'd', long = "daemon")]
    pub daemon: bool,
    /// Online restart: take over the listening sockets of the running pgcarpool (it needs
    /// so_reuseport = 1), then stop it as SIGTERM does (its PID from the pidfile).
    #[arg(short = 'R', long = "reboot")]
    pub reboot: bool,
    /// Log nothing to stderr (the logfile and syslog still get every line).
    #[arg(short = 'q', long = "quiet")]
    pub quiet: bool,
    /// More logging: -v adds each connection (client and server), -vv everything.
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Switch to this OS user at startup (required when started as root).
    #[arg(short = 'u', long = "user")]
    pub user: Option<String>,
    /// The pgbouncer.ini to read.
    #[arg(required_unless_present = "version")]
    pub config: Option<PathBuf>,
}

/// The PgBouncer version whose console (and `--version`) pgcarpool's matches.
pub const PGBOUNCER_COMPAT: &str = "1.25.2";

/// The version line of `--version` and SHOW VERSION.
pub fn version_line() -> String {
    format!(
        "PgBouncer {} (pgcarpool {})",
        PGBOUNCER_COMPAT,
        env!("CARGO_PKG_VERSION")
    )
}
