//! Client-side helpers for every test file: an error as "SQLSTATE message", a simple
//! query's first value, how a login ends, psql, and the driver programs of tests/clients.
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use tokio_postgres::{Client, SimpleQueryMessage};

use super::{output_text, pg_bin, try_connect};

/// "SQLSTATE message" of a server error, else `client: ` and the error's text.
pub fn error_text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} {}", db.code().code(), db.message()),
        None => format!("client: {e}"),
    }
}

/// The first column of the first row among a simple query's messages (None: no row, or
/// NULL there).
pub fn first_value(msgs: &[SimpleQueryMessage]) -> Option<String> {
    msgs.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
        _ => None,
    })
}

/// The first column of the first row of `sql`, run as a simple query; the error's
/// `error_text` when it fails. The result is complete only at ReadyForQuery, so in
/// transaction mode the server is back in the pool when this returns.
pub async fn scalar(c: &Client, sql: &str) -> Result<String, String> {
    let msgs = c.simple_query(sql).await.map_err(|e| error_text(&e))?;
    first_value(&msgs).ok_or_else(|| format!("no row from {sql}"))
}

/// The rows of `sql`, run as a simple query (e.g. a console SHOW), as column name → text
/// value; panics when it fails.
pub async fn rows(c: &Client, sql: &str) -> Vec<HashMap<String, Option<String>>> {
    let msgs = c
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    msgs.iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(
                r.columns()
                    .iter()
                    .enumerate()
                    .map(|(i, col)| (col.name().to_string(), r.get(i).map(str::to_string)))
                    .collect(),
            ),
            _ => None,
        })
        .collect()
}

/// `scalar`, panicking when `sql` has no answer within `limit` (a hang is a failure).
pub async fn scalar_within(c: &Client, sql: &str, limit: Duration) -> Result<String, String> {
    tokio::time::timeout(limit, scalar(c, sql))
        .await
        .unwrap_or_else(|_| panic!("`{sql}` hung for {limit:?}"))
}

/// How a login to `dsn` ends: `logged in`, or the `error_text` of its refusal.
pub async fn login_outcome(dsn: &str) -> String {
    match try_connect(dsn).await {
        Ok(_) => "logged in".into(),
        Err(e) => error_text(&e),
    }
}

/// psql with `-X -At -v ON_ERROR_STOP=1`, running `sql` (`-c`) on `dsn`; a connection
/// attempt gives up after 10 s (PGCONNECT_TIMEOUT).
pub fn psql_command(dsn: &str, sql: &str) -> Command {
    let mut cmd = Command::new(pg_bin("psql"));
    cmd.args(["-X", "-At", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-c", sql])
        .env("PGCONNECT_TIMEOUT", "10");
    cmd
}

/// Run `sql` with psql on `dsn`: its output, trimmed, or its stderr when it fails.
pub fn psql(dsn: &str, sql: &str) -> Result<String, String> {
    let out = psql_command(dsn, sql).output().expect("run psql");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// tests/clients: the driver programs (`install` builds them, `run` runs one).
pub fn clients_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

/// Run `tests/clients/install` once per test process (it is idempotent); panics with its
/// output when it fails.
pub fn install_clients() {
    static INSTALL: OnceLock<Result<(), String>> = OnceLock::new();
    install(&INSTALL, &[]);
}

/// `install_clients` for the Python drivers only (asyncpg, psycopg): `install python`.
pub fn install_python_clients() {
    static INSTALL: OnceLock<Result<(), String>> = OnceLock::new();
    install(&INSTALL, &["python"]);
}

/// `install_clients` for psycopg and pgx only: `install python go`.
pub fn install_python_and_go_clients() {
    static INSTALL: OnceLock<Result<(), String>> = OnceLock::new();
    install(&INSTALL, &["python", "go"]);
}

fn install(once: &OnceLock<Result<(), String>>, args: &[&str]) {
    let result = once.get_or_init(|| {
        let output = Command::new("bash")
            .arg(clients_dir().join("install"))
            .args(args)
            .output()
            .map_err(|e| format!("cannot run tests/clients/install: {e}"))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "tests/clients/install failed: {}",
                output_text(&output)
            ))
        }
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
