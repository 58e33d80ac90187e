//! Real drivers through pgcarpool (issue 3, first acceptance point): pgjdbc, asyncpg,
//! psycopg 3, node-postgres and pgx v5, each a small program under tests/clients/ that
//! opens one connection per worker and runs a checked mix of prepared statements (named,
//! cached by the driver), explicit transactions and expected errors, printing
//! `ok <n> queries` only when every result was right.
//!
//! `tests/clients/install` (run once per test process) installs the drivers and builds
//! the programs; `tests/clients/run` runs one. Every driver runs:
//! - through pgcarpool in transaction mode with default_pool_size = 4 and 16 workers,
//!   so every client's transactions and named statements interleave across the four
//!   server connections;
//! - through pgcarpool in session mode;
//! - directly against PostgreSQL (the programs themselves are right).
mod harness;

use std::process::{Command, Output};

use harness::{TempPostgres, TestPooler, clients_dir, install_clients, output_text, password_of};

/// Concurrent clients (one connection each) per program.
const WORKERS: u32 = 16;
/// Iterations of the query mix per worker (about 80 queries per 10 iterations).
const ITERATIONS: u32 = 150;
/// The role the programs log in as (md5 at PostgreSQL and at pgcarpool).
const USER: &str = "md5user";
const DB: &str = "testdb";

fn describe(what: &str, output: &Output) -> String {
    format!("{what}: {}", output_text(output))
}

/// Run one driver program against 127.0.0.1:`port` (blocking; call from spawn_blocking)
/// and check that it exited 0 with its summary line.
fn run_driver(driver: &str, port: u16, via: &str) {
    install_clients();
    let password = password_of(USER).expect("test role");
    let output = Command::new("bash")
        .arg(clients_dir().join("run"))
        .args([driver, "127.0.0.1", &port.to_string(), USER, password, DB])
        .args([WORKERS.to_string(), ITERATIONS.to_string()])
        .output()
        .unwrap_or_else(|e| panic!("cannot run tests/clients/run {driver}: {e}"));
    let what = format!("{driver} with {WORKERS} workers x {ITERATIONS} iterations {via}");
    assert!(output.status.success(), "{}", describe(&what, &output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let summary = stdout.lines().last().unwrap_or("");
    let queries: Option<u64> = summary
        .strip_prefix("ok ")
        .and_then(|rest| rest.strip_suffix(" queries"))
        .and_then(|n| n.parse().ok());
    assert!(
        queries.is_some_and(|n| n >= u64::from(WORKERS * ITERATIONS)),
        "{}",
        describe(&format!("{what}: no `ok <n> queries` summary"), &output)
    );
}

/// Run `driver` through a pgcarpool in `pool_mode` with `default_pool_size`.
async fn through_pooler(driver: &'static str, pool_mode: &str, pool_size: &str) {
    let pg = TempPostgres::start();
    let pooler = TestPooler::builder(&pg)
        .setting("pool_mode", pool_mode)
        .setting("default_pool_size", pool_size)
        .start()
        .await;
    let port = pooler.port();
    let via = format!("through pgcarpool ({pool_mode} mode, default_pool_size={pool_size})");
    let result = tokio::task::spawn_blocking(move || run_driver(driver, port, &via)).await;
    pooler.shutdown().await;
    if let Err(e) = result {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// Transaction mode, 4 server connections for 16 clients.
async fn transaction_mode(driver: &'static str) {
    through_pooler(driver, "transaction", "4").await;
}

/// Session mode: each client keeps one server connection, so the pool fits all workers.
async fn session_mode(driver: &'static str) {
    through_pooler(driver, "session", &WORKERS.to_string()).await;
}

/// Directly against PostgreSQL: the program itself is right.
fn direct(driver: &str) {
    let pg = TempPostgres::start();
    run_driver(driver, pg.port(), "directly against PostgreSQL");
}

macro_rules! driver_tests {
    ($($module:ident => $driver:literal),* $(,)?) => {$(
        mod $module {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn transaction_mode_pool_4_with_16_clients() {
                super::transaction_mode($driver).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn session_mode() {
                super::session_mode($driver).await;
            }

            #[test]
            fn directly_against_postgres() {
                super::direct($driver);
            }
        }
    )*};
}

driver_tests! {
    pgjdbc => "pgjdbc",
    asyncpg => "asyncpg",
    psycopg => "psycopg",
    node_postgres => "node-postgres",
    pgx => "pgx",
}
