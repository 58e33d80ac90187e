//! Operating a running pooler from the admin console under load: PAUSE/RESUME lose no
//! transaction, KILL db touches that database only, RELOAD says what changed.
//!
//! SHOW POOLS (as PgBouncer's) has no pool size column: a RELOAD of default_pool_size shows
//! there as the servers the pool runs (and in SHOW DATABASES' pool_size, tests/admin.rs).
mod harness;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use harness::{
    TempPostgres, TestPooler, output_text, pg_bin, pgbench_number, run_pgbench, try_connect,
};
use tokio_postgres::{Client, SimpleQueryMessage};

/// A column of the row of a console view whose `key` column is `value`.
async fn view_value(c: &Client, view: &str, key: &str, value: &str, col: &str) -> Option<String> {
    harness::console_value(c, view, &[(key, value)], col).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_then_resume_under_pgbench_load_fails_no_transaction() {
    let pg = TempPostgres::start();
    let init = run_pgbench(&["-i", "-q", "-s", "1", &pg.dsn("md5user", "testdb")]);
    assert!(init.status.success(), "pgbench -i: {}", output_text(&init));
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "4")
        .start()
        .await;
    let dsn = p.dsn("md5user", "testdb");
    let bench = tokio::task::spawn_blocking(move || {
        run_pgbench(&["-n", "-T", "6", "-c", "6", "-j", "2", &dsn])
    });
    let console = p.connect("postgres", "pgbouncer").await;
    // Wait (bounded) until the load is running: transactions counted on testdb.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let xacts = view_value(&console, "STATS", "database", "testdb", "total_xact_count").await;
        if xacts.and_then(|x| x.parse::<u64>().ok()).unwrap_or(0) >= 20 {
            break;
        }
        if Instant::now() >= deadline {
            let out = bench.await.unwrap();
            panic!("pgbench made no progress in 10 s: {}", output_text(&out));
        }
        // Not a spin: the pooler's clients share this runtime (worker 0).
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for _ in 0..2 {
        // PAUSE returns once every server is released: transactions in flight finish.
        console.simple_query("PAUSE").await.unwrap();
        let paused = view_value(&console, "DATABASES", "name", "testdb", "paused").await;
        assert_eq!(paused.as_deref(), Some("1"));
        let active = view_value(&console, "POOLS", "database", "testdb", "sv_active").await;
        assert_eq!(active.as_deref(), Some("0"), "a server in use while paused");
        console.simple_query("RESUME").await.unwrap();
    }
    let out = bench.await.unwrap();
    assert!(out.status.success(), "{}", output_text(&out));
    assert_eq!(
        pgbench_number(&out, "number of failed transactions: "),
        Some(0),
        "{}",
        output_text(&out)
    );
    assert!(
        pgbench_number(&out, "number of transactions actually processed: ").unwrap_or(0) > 0,
        "{}",
        output_text(&out)
    );
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_db_disconnects_that_databases_clients_only() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .database("app_a", &pg.db_entry("testdb"))
        .database("app_b", &pg.db_entry("postgres"))
        .start()
        .await;
    let on_a = [
        p.connect("md5user", "app_a").await,
        p.connect("md5user", "app_a").await,
    ];
    let on_b = [
        p.connect("md5user", "app_b").await,
        p.connect("md5user", "app_b").await,
    ];
    // One client of each database sits in a transaction, holding a server.
    on_a[0].simple_query("begin; select 1").await.unwrap();
    on_b[0].simple_query("begin; select 1").await.unwrap();
    on_a[1].simple_query("select 1").await.unwrap();
    on_b[1].simple_query("select 1").await.unwrap();
    let console = p.connect("postgres", "pgbouncer").await;
    console.simple_query("KILL app_a").await.unwrap();
    for (i, c) in on_a.iter().enumerate() {
        assert!(
            c.simple_query("select 2").await.is_err(),
            "client {i} of app_a survived KILL app_a"
        );
    }
    // app_b's clients keep their transaction and their sessions.
    let row = on_b[0]
        .query_one("select current_database()::text", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "postgres");
    on_b[0].simple_query("commit").await.unwrap();
    on_b[1].simple_query("select 2").await.unwrap();
    let fresh = p.connect("md5user", "app_b").await;
    fresh.simple_query("select 3").await.unwrap();
    // As PgBouncer: the killed database stays paused until RESUME.
    let paused = view_value(&console, "DATABASES", "name", "app_a", "paused").await;
    assert_eq!(paused.as_deref(), Some("1"));
    let paused = view_value(&console, "DATABASES", "name", "app_b", "paused").await;
    assert_eq!(paused.as_deref(), Some("0"));
    console.simple_query("RESUME app_a").await.unwrap();
    let again = p.connect("md5user", "app_a").await;
    again.simple_query("select 4").await.unwrap();
    p.shutdown().await;
}

/// psql against the console (off the runtime's threads), with its NOTICE lines (stderr).
async fn console_psql(p: &TestPooler, sql: &str) -> Output {
    let dsn = p.dsn("postgres", "pgbouncer");
    let sql = sql.to_string();
    tokio::task::spawn_blocking(move || {
        Command::new(pg_bin("psql"))
            .args(["-X", "-v", "ON_ERROR_STOP=1", "-d", &dsn, "-c", &sql])
            .output()
            .expect("run psql")
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_on_the_console_notices_each_changed_setting() {
    let pg = TempPostgres::start();
    let mut p = TestPooler::builder(&pg)
        .setting("default_pool_size", "3")
        .start()
        .await;
    p.rewrite_config(|b| {
        b.setting("default_pool_size", "7")
            .setting("listen_port", "1")
    });
    let out = console_psql(&p, "RELOAD").await;
    assert!(out.status.success(), "{}", output_text(&out));
    let notices = String::from_utf8_lossy(&out.stderr);
    assert!(
        notices.contains("NOTICE:  setting default_pool_size: \"3\" -> \"7\""),
        "{notices}"
    );
    // listen_port needs a restart: named as such, and the old value stays in force.
    assert!(
        notices.contains("setting listen_port: \"0\" -> \"1\" (needs a restart"),
        "{notices}"
    );
    assert_eq!(notices.matches("NOTICE").count(), 2, "{notices}");
    let console = p.connect("postgres", "pgbouncer").await;
    let port = view_value(&console, "CONFIG", "key", "listen_port", "value").await;
    assert_eq!(port.as_deref(), Some("0"));
    let size = view_value(&console, "CONFIG", "key", "default_pool_size", "value").await;
    assert_eq!(size.as_deref(), Some("7"));
    assert!(try_connect(&p.dsn("md5user", "testdb")).await.is_ok());
    // The file matches what runs again: RELOAD has nothing to say.
    p.rewrite_config(|b| b.setting("listen_port", "0"));
    let out = console_psql(&p, "RELOAD").await;
    assert!(out.status.success(), "{}", output_text(&out));
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("NOTICE"),
        "{}",
        output_text(&out)
    );
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_of_default_pool_size_shows_in_show_pools() {
    // SHOW POOLS has no pool size column (as PgBouncer's): the new size shows as the servers
    // the pool runs for clients that were waiting.
    let pg = TempPostgres::start();
    let mut p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "2")
        .start()
        .await;
    let mut holders = Vec::new();
    for _ in 0..4 {
        holders.push(p.connect("md5user", "testdb").await);
    }
    // Two get a server and keep it in a transaction; two wait.
    let mut waits = Vec::new();
    for c in holders.into_iter() {
        let c = std::sync::Arc::new(c);
        let c2 = c.clone();
        waits.push((
            c,
            tokio::spawn(async move { c2.batch_execute("BEGIN; SELECT 1").await }),
        ));
    }
    let console = p.connect("postgres", "pgbouncer").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while md5user_pool(&console).await != ("2".to_string(), "2".to_string()) {
        assert!(
            Instant::now() < deadline,
            "pool never reached 2 active / 2 waiting: {:?}",
            md5user_pool(&console).await
        );
        // Not a spin: the pooler's clients share this runtime (worker 0).
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    p.rewrite_config(|b| b.setting("default_pool_size", "4"));
    console.batch_execute("RELOAD").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while md5user_pool(&console).await != ("4".to_string(), "0".to_string()) {
        assert!(
            Instant::now() < deadline,
            "reload did not grow the pool: {:?}",
            md5user_pool(&console).await
        );
        // Not a spin: the pooler's clients share this runtime (worker 0).
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for (c, w) in waits {
        w.await.unwrap().unwrap();
        c.batch_execute("COMMIT").await.unwrap();
    }
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn os_user_of_the_pooler_reaches_the_console_over_the_unix_socket() {
    let pg = TempPostgres::start();
    let dir = tempfile::tempdir().unwrap();
    let sock_dir = dir.path().to_str().unwrap().to_string();
    let p = TestPooler::builder(&pg)
        .setting("unix_socket_dir", &sock_dir)
        .start()
        .await;
    // User `pgbouncer`, no password, same OS user as the (in-process) pooler: admin.
    let dsn = format!(
        "host={sock_dir} port={} user=pgbouncer dbname=pgbouncer",
        p.port()
    );
    let c = try_connect(&dsn)
        .await
        .expect("console over the unix socket");
    let msgs = c.simple_query("SHOW VERSION").await.unwrap();
    assert!(msgs.iter().any(|m| matches!(m, SimpleQueryMessage::Row(_))));
    c.batch_execute("PAUSE").await.unwrap();
    c.batch_execute("RESUME").await.unwrap();
    // Another user without a password over the same socket is not let in.
    let dsn = format!(
        "host={sock_dir} port={} user=md5user dbname=pgbouncer",
        p.port()
    );
    assert_not_admin(&dsn, "md5user").await;
    // Nor is `pgbouncer` over TCP.
    let dsn = format!(
        "host=127.0.0.1 port={} user=pgbouncer dbname=pgbouncer",
        p.port()
    );
    assert_not_admin(&dsn, "pgbouncer").await;
    p.shutdown().await;
}

/// A login to the console at `dsn` is refused: 28000, naming `user`.
async fn assert_not_admin(dsn: &str, user: &str) {
    let e = try_connect(dsn)
        .await
        .expect_err("let into the admin console");
    let db = e
        .as_db_error()
        .unwrap_or_else(|| panic!("not a refusal from the pooler: {e:?}"));
    assert_eq!(
        (db.code().code(), db.message()),
        (
            "28000",
            format!("not allowed to connect to the admin console: {user}").as_str()
        ),
        "{e:?}"
    );
}

/// (sv_active, cl_waiting) of md5user's pool.
async fn md5user_pool(c: &Client) -> (String, String) {
    let active = view_value(c, "POOLS", "user", "md5user", "sv_active").await;
    let waiting = view_value(c, "POOLS", "user", "md5user", "cl_waiting").await;
    (active.unwrap_or_default(), waiting.unwrap_or_default())
}
