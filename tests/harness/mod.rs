//! Integration-test harness: a private PostgreSQL per test (`TempPostgres`) and an
//! in-process pgcarpool on port 0 in front of it (`TestPooler`), or the binary as a child
//! process (`process::PoolerProcess`).
//!
//! Every integration test file uses it as `mod harness;`. Nothing here uses a fixed port,
//! sleeps to synchronise, or kills processes by name: PostgreSQL is started and stopped
//! with `pg_ctl -w` on the data directory the harness owns.
//!
//! Test roles (created in every `TempPostgres`, listed in every `TestPooler`'s userlist):
//!
//! | role        | PostgreSQL auth (host 127.0.0.1) | stored as | password    |
//! |-------------|----------------------------------|-----------|-------------|
//! | `postgres`  | trust (superuser)                | —         | `postgres`  |
//! | `md5user`   | md5                              | md5       | `md5pass`   |
//! | `scramuser` | scram-sha-256                    | SCRAM     | `scrampass` |
//! | `trustuser` | trust                            | —         | `trustpass` |
//!
//! The passwords of trust roles are only what the pooler's userlist holds.
#![allow(dead_code)]

mod client;
pub mod differential;
pub mod diffgen;
pub mod faultproxy;
pub mod netns;
mod observer;
mod pooler;
mod postgres;
pub mod process;
pub mod raw;
pub mod wire;

use std::future::Future;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

#[allow(unused_imports)] // each test file uses a different part
pub use client::{
    clients_dir, error_text, first_value, install_clients, install_python_and_go_clients,
    install_python_clients, login_outcome, psql, psql_command, rows, scalar, scalar_within,
};
#[allow(unused_imports)]
pub use observer::Observer;
#[allow(unused_imports)]
pub use pooler::{TestPooler, TestPoolerBuilder};
#[allow(unused_imports)]
pub use postgres::{TempPostgres, free_port};

/// The test roles and the passwords clients use for them.
pub const TEST_ROLES: [(&str, &str); 4] = [
    ("postgres", "postgres"),
    ("md5user", "md5pass"),
    ("scramuser", "scrampass"),
    ("trustuser", "trustpass"),
];

/// Poll `check` every 10 ms until it is true (true) or `limit` passes (false).
pub async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `eventually`, panicking with `what` when `limit` passes first.
pub async fn wait_for<F, Fut>(what: &str, limit: Duration, check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    assert!(
        eventually(limit, check).await,
        "timed out after {limit:?} waiting for: {what}"
    );
}

/// Poll `probe` every 10 ms until it gives a value, and return it; panics with `what`
/// when `limit` passes first.
pub async fn wait_value<T, F, Fut>(what: &str, limit: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Check every 20 ms, for all of `window`, that `check` holds; panics with `what` the
/// first time it does not. For what must NOT happen while the scenario itself holds
/// something back (a pause, an outage, a suspend): the window is part of the scenario, not
/// a synchronisation; waiting for something that must happen is `wait_for`'s.
pub async fn assert_stays<F, Fut>(what: &str, window: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let end = Instant::now() + window;
    loop {
        assert!(check().await, "{what}: no longer so (window {window:?})");
        if Instant::now() >= end {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A pooler config for `pg` in transaction pooling mode (the other defaults as `builder`).
pub fn transaction_pooler(pg: &TempPostgres) -> TestPoolerBuilder {
    TestPooler::builder(pg).setting("pool_mode", "transaction")
}

/// pgcarpool for `pg` in transaction mode with trust auth, `default_pool_size` = `size`
/// and room for 100 clients: the pooler of the session oracle tests.
pub async fn pool_of(pg: &TempPostgres, size: usize) -> TestPooler {
    transaction_pooler(pg)
        .setting("auth_type", "trust")
        .setting("default_pool_size", &size.to_string())
        .setting("max_client_conn", "100")
        .start()
        .await
}

/// A column of the row of console view `SHOW view` whose columns match all of `keys`
/// (None: no such row).
pub async fn console_value(
    admin: &tokio_postgres::Client,
    view: &str,
    keys: &[(&str, &str)],
    col: &str,
) -> Option<String> {
    let msgs = admin
        .simple_query(&format!("SHOW {view}"))
        .await
        .unwrap_or_else(|e| panic!("SHOW {view}: {e}"));
    msgs.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r)
            if keys.iter().all(|(k, v)| r.get(*k) == Some(*v)) =>
        {
            Some(r.get(col).unwrap_or_default().to_string())
        }
        _ => None,
    })
}

/// SHOW POOLS' `column` of database `db` (user md5user); 0 when there is no such pool.
pub async fn pool_count(admin: &tokio_postgres::Client, db: &str, column: &str) -> i64 {
    console_value(
        admin,
        "POOLS",
        &[("database", db), ("user", "md5user")],
        column,
    )
    .await
    .map_or(0, |v| v.parse().unwrap())
}

/// SHOW POOLS' `cl_waiting` for `user` on `db` through an admin console client (database
/// `pgbouncer`, user `postgres`); 0 when the pool does not exist yet.
pub async fn cl_waiting(admin: &tokio_postgres::Client, db: &str, user: &str) -> i64 {
    console_value(
        admin,
        "POOLS",
        &[("database", db), ("user", user)],
        "cl_waiting",
    )
    .await
    .map_or(0, |v| v.parse().expect("cl_waiting is a number"))
}

/// A command's exit status, stdout and stderr, for assertion messages.
pub fn output_text(out: &Output) -> String {
    format!(
        "status {}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The number after `prefix` on a line of pgbench's report (e.g.
/// `"number of failed transactions: "`), or None.
pub fn pgbench_number(out: &Output, prefix: &str) -> Option<u64> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|rest| rest.split(['/', ' ']).next())
        .and_then(|n| n.parse().ok())
}

/// The password a client uses for a test role, if `user` is one.
pub fn password_of(user: &str) -> Option<&'static str> {
    TEST_ROLES
        .iter()
        .find(|(name, _)| *name == user)
        .map(|(_, password)| *password)
}

/// A libpq `key=value` connection string for 127.0.0.1:`port`, with the test role's
/// password when `user` is a test role.
pub fn dsn_for(port: u16, user: &str, db: &str) -> String {
    dsn_with_password(port, user, password_of(user), db)
}

/// A libpq `key=value` connection string with an explicit password (None: none sent).
pub fn dsn_with_password(port: u16, user: &str, password: Option<&str>, db: &str) -> String {
    dsn_at("127.0.0.1", port, user, password, db)
}

/// A libpq `key=value` connection string for `host`:`port` (None: no password sent).
pub fn dsn_at(host: &str, port: u16, user: &str, password: Option<&str>, db: &str) -> String {
    let mut dsn = format!(
        "host={host} port={port} user={} dbname={}",
        conninfo_quote(user),
        conninfo_quote(db)
    );
    if let Some(password) = password {
        dsn.push_str(" password=");
        dsn.push_str(&conninfo_quote(password));
    }
    dsn
}

/// Quote a value for a libpq connection string.
pub fn conninfo_quote(value: &str) -> String {
    if !value.is_empty()
        && !value
            .chars()
            .any(|c| c.is_whitespace() || c == '\'' || c == '\\')
    {
        return value.to_string();
    }
    let escaped = value.replace('\\', "\\\\").replace('\'', "\\'");
    format!("'{escaped}'")
}

/// Connect with tokio-postgres (no TLS) and spawn the connection task.
pub async fn try_connect(dsn: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(dsn, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        // The error (if any) reaches the client's next call; nothing to do here.
        let _ = connection.await;
    });
    Ok(client)
}

/// The SQLSTATE code of a tokio-postgres error, if the server sent one.
pub fn sqlstate(err: &tokio_postgres::Error) -> Option<&str> {
    err.as_db_error().map(|db| db.code().code())
}

/// The directory of the newest PostgreSQL installation that has `name`
/// (`/usr/lib/postgresql/<version>/bin`), or None.
fn newest_pg_bin_dir_with(name: &str) -> Option<PathBuf> {
    let mut dirs: Vec<(Vec<u32>, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            let version = entry.file_name().to_string_lossy().into_owned();
            let key: Vec<u32> = version
                .split('.')
                .map(|part| part.parse().ok())
                .collect::<Option<_>>()?;
            let bin = entry.path().join("bin");
            bin.join(name).is_file().then_some((key, bin))
        })
        .collect();
    dirs.sort();
    dirs.pop().map(|(_, bin)| bin)
}

/// The setting naming the folder of the PostgreSQL server programs the tests run
/// (`initdb`, `pg_ctl`, `postgres`), e.g. the one `scripts/pg-version 18` prints.
pub const PG_BIN_SETTING: &str = "PGCARPOOL_TEST_PG_BIN";

/// The folder of the server programs: `PGCARPOOL_TEST_PG_BIN`, else the newest
/// `/usr/lib/postgresql/*/bin` with a `postgres`.
pub fn server_bin_dir() -> Option<&'static Path> {
    static SERVER_BIN: OnceLock<Option<PathBuf>> = OnceLock::new();
    SERVER_BIN
        .get_or_init(|| match std::env::var_os(PG_BIN_SETTING) {
            Some(dir) if !dir.is_empty() => {
                let dir = PathBuf::from(dir);
                assert!(
                    dir.join("postgres").is_file(),
                    "{PG_BIN_SETTING}={} has no `postgres`",
                    dir.display()
                );
                Some(dir)
            }
            _ => newest_pg_bin_dir_with("postgres"),
        })
        .as_deref()
}

/// Path of a PostgreSQL program (`postgres`, `initdb`, `pg_ctl`, `psql`, `pgbench`, …):
/// from the server's folder (`server_bin_dir`) when it has it, else from the newest
/// `/usr/lib/postgresql/*/bin` that has it, else from `PATH`. Panics with a hint when it
/// is not installed.
pub fn pg_bin(name: &str) -> PathBuf {
    // Prefer the directory of the server so client and server versions match.
    if let Some(dir) = server_bin_dir()
        && dir.join(name).is_file()
    {
        return dir.join(name);
    }
    if let Some(dir) = newest_pg_bin_dir_with(name) {
        return dir.join(name);
    }
    if let Some(path) = std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
    {
        return path;
    }
    panic!(
        "PostgreSQL program `{name}` not found in /usr/lib/postgresql/*/bin or PATH; \
         `scripts/test` installs PostgreSQL"
    );
}

/// The major version a PostgreSQL program prints with `--version`
/// (`pg_basebackup (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)` → 15), or None.
pub fn program_major(program: &Path) -> Option<u32> {
    let out = Command::new(program).arg("--version").output().ok()?;
    major_of_version_line(&String::from_utf8_lossy(&out.stdout))
}

/// The major version in a `--version` line: the first number after `(PostgreSQL) `.
pub fn major_of_version_line(line: &str) -> Option<u32> {
    let (_, rest) = line.split_once("(PostgreSQL) ")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The major version of the PostgreSQL server the tests run (14, 15, … 18).
pub fn server_major() -> u32 {
    static MAJOR: OnceLock<u32> = OnceLock::new();
    *MAJOR.get_or_init(|| {
        let postgres = pg_bin("postgres");
        program_major(&postgres)
            .unwrap_or_else(|| panic!("{}: no version from --version", postgres.display()))
    })
}

/// A client program that refuses servers newer than itself (`pg_basebackup`,
/// `pg_receivewal`, `pg_recvlogical`, `pg_dump`), of the server's major or newer: Ok with
/// its path, or Err saying why none is (for the test to print that it skipped).
pub fn pg_bin_for_server(name: &str) -> Result<PathBuf, String> {
    let server = server_major();
    let mut found = Vec::new();
    let candidates = server_bin_dir()
        .map(|dir| dir.join(name))
        .into_iter()
        .chain(newest_pg_bin_dir_with(name).map(|dir| dir.join(name)));
    for path in candidates.filter(|path| path.is_file()) {
        match program_major(&path) {
            Some(major) if major >= server => return Ok(path),
            Some(major) => found.push(format!("{} is of {major}", path.display())),
            None => found.push(format!("{} prints no version", path.display())),
        }
    }
    Err(format!(
        "no `{name}` of PostgreSQL {server} or newer (found: {})",
        if found.is_empty() {
            "none".to_string()
        } else {
            found.join(", ")
        }
    ))
}

/// `pg_bin_for_server(name)`, or None after printing that the calling test skipped and why
/// (on the test process's stderr, which the test harness does not capture, so a passing
/// run shows it). With `CI` set it panics instead: CI fetches the client programs of every
/// major it runs (`scripts/pg-version`), so a missing one there is a fault, not a skip.
pub fn pg_bin_for_server_or_skip(name: &str) -> Option<PathBuf> {
    match pg_bin_for_server(name) {
        Ok(path) => Some(path),
        Err(why) if in_ci() => panic!("{why} (CI: scripts/pg-version fetches it)"),
        Err(why) => {
            let test = std::thread::current()
                .name()
                .unwrap_or("a test")
                .to_string();
            let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
            None
        }
    }
}

/// Whether the tests run in CI (`CI` set to anything but empty, `0` or `false`).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false"))
}

/// A folder holding libpq 18 or newer (`libpq.so.5.N`, N ≥ 18), which speaks protocol
/// 3.2: `PGCARPOOL_TEST_LIBPQ_DIR`, else the `lib` folder beside the server's programs (the
/// layout of `scripts/pg-version`). Err says why there is none. A client program of any
/// major run with `LD_LIBRARY_PATH` set to it uses that libpq.
pub fn libpq_with_protocol_3_2() -> Result<PathBuf, String> {
    let dir = match std::env::var_os("PGCARPOOL_TEST_LIBPQ_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => match server_bin_dir().and_then(Path::parent) {
            Some(root) => root.join("lib"),
            None => return Err("no PostgreSQL server folder".into()),
        },
    };
    let newest = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix("libpq.so.5.")?.parse::<u32>().ok()
        })
        .max();
    match newest {
        Some(minor) if minor >= 18 => Ok(dir),
        Some(minor) => Err(format!("{} has libpq.so.5.{minor}, not 18", dir.display())),
        None => Err(format!(
            "no libpq.so.5.* in {} (set PGCARPOOL_TEST_LIBPQ_DIR to the lib folder \
             `scripts/pg-version 18` prints beside its bin)",
            dir.display()
        )),
    }
}

/// Run `pgbench` with `args` (pass a connection string from `dsn()` as the database name)
/// and return its output, whatever its exit status.
pub fn run_pgbench(args: &[&str]) -> Output {
    Command::new(pg_bin("pgbench"))
        .args(args)
        .output()
        .expect("run pgbench")
}

/// Run a command, panicking with its output when it fails.
fn run_checked(cmd: &mut Command, what: &str) -> Output {
    let output = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}"));
    if !output.status.success() {
        panic!(
            "{what} failed ({}): {cmd:?}\n--- stdout\n{}\n--- stderr\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    output
}

/// A file's text ("" when it cannot be read, e.g. a log not written yet).
pub fn read_text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The last `lines` lines of a file (empty when it cannot be read).
fn tail(path: &Path, lines: usize) -> String {
    let text = read_text(path);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// GET /metrics from pgcarpool's metrics listener on `port`: the whole HTTP response.
pub async fn metrics(port: u16) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect to /metrics");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("send GET");
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.expect("read /metrics");
    buf
}
