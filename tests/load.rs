//! Load through pgcarpool with real clients: psql, pgbench and 1,000 tokio-postgres clients.
mod harness;

use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use harness::{
    Observer, TempPostgres, TestPooler, output_text, pgbench_number, psql_command, run_pgbench,
};

/// pgbench's report lines (`number of failed transactions` is PostgreSQL 15+).
const FAILED: &str = "number of failed transactions: ";
const PROCESSED: &str = "number of transactions actually processed: ";

async fn pooler(pg: &TempPostgres, mode: &str, pool_size: &str) -> TestPooler {
    TestPooler::builder(pg)
        .setting("pool_mode", mode)
        .setting("default_pool_size", pool_size)
        .setting("max_client_conn", "2000")
        .start()
        .await
}

/// `pgbench -i` directly against PostgreSQL, as md5user (who may create tables in testdb).
fn pgbench_init(pg: &TempPostgres) {
    let out = run_pgbench(&["-i", "-q", "-s", "1", &pg.dsn("md5user", "testdb")]);
    assert!(out.status.success(), "pgbench -i: {}", output_text(&out));
}

fn last_line(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout.lines().last().unwrap_or("").to_string()
}

/// psql through the pooler; returns its output.
fn psql(dsn: &str, sql: &str) -> Output {
    psql_command(dsn, sql).output().expect("run psql")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbench_select_only_runs_in_every_mode() {
    let pg = TempPostgres::start();
    pgbench_init(&pg);
    for mode in ["session", "transaction", "statement"] {
        let p = pooler(&pg, mode, "4").await;
        let dsn = p.dsn("md5user", "testdb");
        let out = tokio::task::spawn_blocking(move || {
            run_pgbench(&["-n", "-S", "-T", "2", "-c", "4", "-j", "2", &dsn])
        })
        .await
        .unwrap();
        assert!(out.status.success(), "{mode}: {}", output_text(&out));
        assert_eq!(
            pgbench_number(&out, FAILED),
            Some(0),
            "{mode}: {}",
            output_text(&out)
        );
        assert!(
            pgbench_number(&out, PROCESSED).unwrap_or(0) > 0,
            "{mode}: {}",
            output_text(&out)
        );
        eprintln!(
            "{mode}: pgbench -S processed {:?} transactions",
            pgbench_number(&out, PROCESSED)
        );
        p.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql_runs_statements_and_transactions_in_session_and_transaction_mode() {
    let pg = TempPostgres::start();
    pg.psql_in(
        "testdb",
        "create table psql_t (v int); grant all on psql_t to public",
    );
    for mode in ["session", "transaction"] {
        let p = pooler(&pg, mode, "2").await;
        let dsn = p.dsn("md5user", "testdb");
        let out = psql(&dsn, "select 1");
        assert!(out.status.success(), "{mode}: {}", output_text(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1", "{mode}");
        let out = psql(
            &dsn,
            "begin; insert into psql_t values (1); insert into psql_t values (2); commit; select sum(v) from psql_t",
        );
        assert!(out.status.success(), "{mode}: {}", output_text(&out));
        // psql -c sends it as one Query; the last line is the last result.
        assert_eq!(last_line(&out), "3", "{mode}");
        let out = psql(
            &dsn,
            "begin; insert into psql_t values (100); rollback; select count(*) from psql_t",
        );
        assert!(out.status.success(), "{mode}: {}", output_text(&out));
        assert_eq!(last_line(&out), "2", "{mode}");
        pg.psql_in("testdb", "truncate psql_t");
        p.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_mode_refuses_an_explicit_transaction_block() {
    let pg = TempPostgres::start();
    let p = pooler(&pg, "statement", "2").await;
    let c = p.connect("md5user", "testdb").await;
    c.simple_query("select 1").await.unwrap();
    // BEGIN itself fails with the reason, not a later query with "connection closed".
    let err = c
        .simple_query("begin")
        .await
        .expect_err("a transaction block was allowed");
    let db = err
        .as_db_error()
        .unwrap_or_else(|| panic!("no error message: {err:?}"));
    assert!(
        db.message()
            .contains("transaction blocks not allowed in statement pooling mode"),
        "unexpected error: {err:?}"
    );
    assert!(
        c.simple_query("select 1").await.is_err(),
        "client still open"
    );
    // The server went back clean and the pooler keeps serving.
    let c2 = p.connect("md5user", "testdb").await;
    let row = c2.query_one("select 1::int", &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 1);
    let idle_in_tx = Observer::new(&pg)
        .await
        .count(
            "usename = 'md5user' and state like 'idle in transaction%'",
            &[],
        )
        .await;
    assert_eq!(idle_in_tx, 0);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpcb_with_50_clients_never_exceeds_a_pool_of_5() {
    let pg = TempPostgres::start();
    pgbench_init(&pg);
    let p = pooler(&pg, "transaction", "5").await;
    // The sampler is a direct connection as postgres: not one of the pool's backends.
    let monitor = Observer::new(&pg).await;
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        tokio::spawn(async move {
            let (mut max, mut samples) = (0i64, 0u64);
            while !done.load(Ordering::Relaxed) {
                max = max.max(monitor.backends("md5user").await);
                samples += 1;
            }
            (max, samples)
        })
    };
    let dsn = p.dsn("md5user", "testdb");
    let out = tokio::task::spawn_blocking(move || {
        run_pgbench(&["-n", "-T", "10", "-c", "50", "-j", "2", &dsn])
    })
    .await
    .unwrap();
    done.store(true, Ordering::Relaxed);
    let (max, samples) = sampler.await.unwrap();
    eprintln!(
        "TPC-B -c 50 over a pool of 5: {:?} transactions, {samples} samples, at most {max} backends",
        pgbench_number(&out, PROCESSED)
    );
    assert!(out.status.success(), "{}", output_text(&out));
    assert_eq!(
        pgbench_number(&out, FAILED),
        Some(0),
        "{}",
        output_text(&out)
    );
    assert!(
        pgbench_number(&out, PROCESSED).unwrap_or(0) > 0,
        "{}",
        output_text(&out)
    );
    assert!(samples > 10, "only {samples} samples of pg_stat_activity");
    assert!(max >= 1, "the sampler never saw the pool's backends");
    assert!(max <= 5, "PostgreSQL saw {max} backends for a pool of 5");
    p.shutdown().await;
}

/// Let this process open a few thousand sockets (both ends of 1,000 connections).
fn raise_nofile(want: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        if lim.rlim_cur < want {
            lim.rlim_cur = want.min(lim.rlim_max);
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_clients_share_a_pool_of_10() {
    const CLIENTS: usize = 1000;
    raise_nofile(8192);
    let pg = TempPostgres::start();
    pg.psql_in(
        "testdb",
        "create table many (id int); grant all on many to public",
    );
    let p = pooler(&pg, "transaction", "10").await;
    let dsn = p.dsn("md5user", "testdb");
    let started = Instant::now();
    // Every client connects first; none starts its transaction before all are connected.
    let connected = Arc::new(tokio::sync::Barrier::new(CLIENTS));
    let committed = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::with_capacity(CLIENTS);
    for i in 0..CLIENTS {
        let (dsn, connected, committed) = (dsn.clone(), connected.clone(), committed.clone());
        tasks.push(tokio::spawn(async move {
            let connect = harness::try_connect(&dsn).await;
            connected.wait().await;
            let mut c = connect.map_err(|e| format!("client {i}: connect: {e}"))?;
            let tx = c
                .transaction()
                .await
                .map_err(|e| format!("client {i}: begin: {e}"))?;
            let id = i32::try_from(i).unwrap();
            tx.execute("insert into many values ($1)", &[&id])
                .await
                .map_err(|e| format!("client {i}: insert: {e}"))?;
            tx.commit()
                .await
                .map_err(|e| format!("client {i}: commit: {e}"))?;
            committed.fetch_add(1, Ordering::Relaxed);
            Ok::<_, String>(c)
        }));
    }
    let mut errors = Vec::new();
    let mut clients = Vec::new();
    for t in tasks {
        match tokio::time::timeout(Duration::from_secs(60), t).await {
            Ok(Ok(Ok(c))) => clients.push(c),
            Ok(Ok(Err(e))) => errors.push(e),
            Ok(Err(e)) => errors.push(format!("task: {e}")),
            Err(_) => errors.push("a client did not finish within 60 s".into()),
        }
    }
    eprintln!(
        "{} of {CLIENTS} clients committed in {:?}",
        committed.load(Ordering::Relaxed),
        started.elapsed()
    );
    assert!(
        errors.is_empty(),
        "{} clients failed, e.g. {:?}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );
    assert_eq!(
        pg.psql_in("testdb", "select count(distinct id) from many"),
        "1000"
    );
    let backends = Observer::new(&pg).await.backends("md5user").await;
    assert!(backends <= 10, "{backends} backends for a pool of 10");
    drop(clients);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbench_with_prepared_statements_runs_in_transaction_mode() {
    let pg = TempPostgres::start();
    pgbench_init(&pg);
    // More clients than servers: statements prepared on one server are used on another.
    let p = pooler(&pg, "transaction", "3").await;
    for protocol in ["extended", "prepared"] {
        let dsn = p.dsn("md5user", "testdb");
        let out = tokio::task::spawn_blocking(move || {
            run_pgbench(&["-n", "-M", protocol, "-T", "3", "-c", "8", "-j", "2", &dsn])
        })
        .await
        .unwrap();
        eprintln!(
            "-M {protocol}: {:?} transactions",
            pgbench_number(&out, PROCESSED)
        );
        assert!(out.status.success(), "-M {protocol}: {}", output_text(&out));
        assert_eq!(
            pgbench_number(&out, FAILED),
            Some(0),
            "{}",
            output_text(&out)
        );
        assert!(
            pgbench_number(&out, PROCESSED).unwrap_or(0) > 0,
            "{}",
            output_text(&out)
        );
    }
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbench_connecting_per_transaction_runs_in_session_mode() {
    let pg = TempPostgres::start();
    pgbench_init(&pg);
    let p = pooler(&pg, "session", "4").await;
    let dsn = p.dsn("md5user", "testdb");
    let out = tokio::task::spawn_blocking(move || {
        run_pgbench(&["-n", "-C", "-S", "-T", "3", "-c", "8", "-j", "2", &dsn])
    })
    .await
    .unwrap();
    eprintln!(
        "-C -S: {:?} transactions (a login each)",
        pgbench_number(&out, PROCESSED)
    );
    assert!(out.status.success(), "{}", output_text(&out));
    assert_eq!(
        pgbench_number(&out, FAILED),
        Some(0),
        "{}",
        output_text(&out)
    );
    assert!(
        pgbench_number(&out, PROCESSED).unwrap_or(0) > 0,
        "{}",
        output_text(&out)
    );
    let backends = Observer::new(&pg).await.backends("md5user").await;
    assert!(backends <= 4, "{backends} backends");
    p.shutdown().await;
}
