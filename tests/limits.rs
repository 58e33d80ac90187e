//! Pool limits against a real PostgreSQL: pool sizes, reserve pool, min_pool_size,
//! max_client_conn, max_db_connections, max_user_connections, query_wait_timeout and the
//! per-database / per-user overrides.
mod harness;
mod pool_support;

use std::time::{Duration, Instant};

use harness::{Observer, TempPostgres, TestPooler, transaction_pooler, wait_for};
use pool_support::{assert_still_waiting, backend_pid, error_text, scalar};
use tokio::task::JoinHandle;

/// How long a waiting client is watched to be sure it waits.
const WAIT_WINDOW: Duration = Duration::from_millis(400);
/// Bound on anything that should happen promptly (janitor runs every 250 ms).
const PROMPTLY: Duration = Duration::from_secs(5);
/// For what a background task does on its own schedule (the janitor), on a loaded machine.
const SLOWLY: Duration = Duration::from_secs(30);

/// A client that has begun a transaction and so holds a server.
async fn holder(p: &TestPooler, user: &str, db: &str) -> tokio_postgres::Client {
    let c = p.connect(user, db).await;
    c.batch_execute("begin; select 1").await.expect("begin");
    c
}

/// Run `select 1` on an already connected client in a task.
fn spawn_select(c: tokio_postgres::Client) -> JoinHandle<Result<String, String>> {
    tokio::spawn(async move { scalar(&c, "select 1").await })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_pool_size_caps_backends_and_waiters_succeed_later() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("default_pool_size", "2")
        .start()
        .await;
    let obs = Observer::new(&pg).await;
    let h1 = holder(&p, "md5user", "testdb").await;
    let h2 = holder(&p, "md5user", "testdb").await;
    let mut waiters = Vec::new();
    for _ in 0..3 {
        waiters.push(spawn_select(p.connect("md5user", "testdb").await));
    }
    for w in &waiters {
        assert_still_waiting("a client beyond default_pool_size", w, WAIT_WINDOW).await;
    }
    assert_eq!(obs.backends("md5user").await, 2);
    h1.batch_execute("commit").await.unwrap();
    h2.batch_execute("commit").await.unwrap();
    for w in waiters {
        assert_eq!(w.await.unwrap(), Ok("1".to_string()));
    }
    assert_eq!(
        obs.backends("md5user").await,
        2,
        "waiters reused the pool's servers"
    );
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserve_pool_opens_one_extra_server_after_reserve_pool_timeout() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("default_pool_size", "1")
        .setting("reserve_pool_size", "1")
        .setting("reserve_pool_timeout", "0.5")
        .start()
        .await;
    let obs = Observer::new(&pg).await;
    let h = holder(&p, "md5user", "testdb").await;
    let (c1, c2) = (
        p.connect("md5user", "testdb").await,
        p.connect("md5user", "testdb").await,
    );
    let started = Instant::now();
    let waiters = [spawn_select(c1), spawn_select(c2)];
    for w in waiters {
        let r = tokio::time::timeout(PROMPTLY, w)
            .await
            .expect("waiter served by the reserve pool");
        assert_eq!(r.unwrap(), Ok("1".to_string()));
    }
    assert!(
        started.elapsed() >= Duration::from_millis(450),
        "reserve server opened before reserve_pool_timeout: {:?}",
        started.elapsed()
    );
    assert_eq!(
        obs.backends("md5user").await,
        2,
        "pool_size + reserve_pool_size servers"
    );
    // The holder kept its server all along.
    h.batch_execute("select 1; commit").await.unwrap();
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_pool_size_is_filled_by_the_janitor_without_clients() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("default_pool_size", "5")
        .setting("min_pool_size", "3")
        .start()
        .await;
    let obs = Observer::new(&pg).await;
    // The pool exists once a client has used it.
    let c = p.connect("md5user", "testdb").await;
    c.batch_execute("select 1").await.unwrap();
    drop(c);
    // A backend shows in pg_stat_activity before its login is through (state null), and
    // the janitor opens them one after another: wait for the state itself.
    wait_for("min_pool_size servers open and idle", SLOWLY, || async {
        obs.backends("md5user").await == 3 && obs.backends_in_state("md5user", "idle").await == 3
    })
    .await;
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_client_conn_refuses_the_extra_client_with_53300() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("max_client_conn", "2")
        .start()
        .await;
    let c1 = p.connect("md5user", "testdb").await;
    let c2 = p.connect("md5user", "testdb").await;
    let err = harness::try_connect(&p.dsn("md5user", "testdb"))
        .await
        .expect_err("third client accepted");
    assert_eq!(harness::sqlstate(&err), Some("53300"), "{err:?}");
    // A client that asks for SSL first (libpq's sslmode=prefer) is told 'N', then gets
    // the error for its startup packet (an error in place of 'N' reads as a failed SSL
    // exchange to libpq, without the reason).
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", p.port()))
            .await
            .unwrap();
        s.write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f])
            .await
            .unwrap();
        let mut n = [0u8; 1];
        s.read_exact(&mut n).await.unwrap();
        assert_eq!(&n, b"N");
        s.write_all(&harness::wire::startup_message(&[
            ("user", "md5user"),
            ("database", "testdb"),
        ]))
        .await
        .unwrap();
        let mut reply = Vec::new();
        tokio::time::timeout(PROMPTLY, s.read_to_end(&mut reply))
            .await
            .expect("not closed after the refusal")
            .unwrap();
        let msgs = harness::wire::split_messages(&reply);
        assert_eq!(msgs.len(), 1, "{msgs:?}");
        assert_eq!(msgs[0].0, b'E');
        let (code, message) = harness::wire::error_fields(&msgs[0].1);
        assert_eq!(
            (code.as_str(), message.as_str()),
            ("53300", "no more connections allowed (max_client_conn)")
        );
    }
    for c in [&c1, &c2] {
        assert_eq!(scalar(c, "select 1").await.as_deref(), Ok("1"));
    }
    // A slot freed is a slot usable again.
    drop(c1);
    let dsn = p.dsn("md5user", "testdb");
    wait_for("a client connects after one left", PROMPTLY, || async {
        harness::try_connect(&dsn).await.is_ok()
    })
    .await;
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_db_connections_is_shared_by_the_users_of_a_database() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("default_pool_size", "5")
        .setting("max_db_connections", "1")
        .start()
        .await;
    let obs = Observer::new(&pg).await;
    let h = holder(&p, "md5user", "testdb").await;
    // trustuser's pool logs in a server for its parameters at login only when it can:
    // the md5user transaction holds the one connection testdb may have.
    let other = tokio::spawn({
        let dsn = p.dsn("trustuser", "testdb");
        async move {
            let c = harness::try_connect(&dsn)
                .await
                .map_err(|e| error_text(&e))?;
            scalar(&c, "select current_user").await
        }
    });
    assert_still_waiting("the second user's client", &other, WAIT_WINDOW).await;
    assert_eq!(obs.backends_in_db("testdb").await, 1);
    h.batch_execute("commit").await.unwrap();
    let r = tokio::time::timeout(PROMPTLY, other)
        .await
        .expect("second user served after the first released");
    assert_eq!(r.unwrap().as_deref(), Ok("trustuser"));
    assert_eq!(
        obs.backends_in_db("testdb").await,
        1,
        "the idle server of the other pool was closed"
    );
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_user_connections_is_shared_by_the_pools_of_a_user() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("default_pool_size", "5")
        .user_entry("md5user", "max_user_connections=1")
        .start()
        .await;
    let obs = Observer::new(&pg).await;
    let h = holder(&p, "md5user", "testdb").await;
    let other = tokio::spawn({
        let dsn = p.dsn("md5user", "postgres");
        async move {
            let c = harness::try_connect(&dsn)
                .await
                .map_err(|e| error_text(&e))?;
            scalar(&c, "select current_database()").await
        }
    });
    assert_still_waiting("the user's client of another database", &other, WAIT_WINDOW).await;
    assert_eq!(obs.backends("md5user").await, 1);
    h.batch_execute("commit").await.unwrap();
    let r = tokio::time::timeout(PROMPTLY, other)
        .await
        .expect("other database served after the first released");
    assert_eq!(r.unwrap().as_deref(), Ok("postgres"));
    assert_eq!(obs.backends("md5user").await, 1);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_wait_timeout_fails_the_waiter_and_the_holder_keeps_its_server() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("default_pool_size", "1")
        .setting("query_wait_timeout", "1")
        .start()
        .await;
    let h = holder(&p, "md5user", "testdb").await;
    let pid = backend_pid(&h).await;
    let waiter = p.connect("md5user", "testdb").await;
    let started = Instant::now();
    let err = tokio::time::timeout(PROMPTLY, scalar(&waiter, "select 1"))
        .await
        .expect("query_wait_timeout fired")
        .expect_err("waiter got a server");
    assert!(err.contains("query_wait_timeout"), "{err}");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(backend_pid(&h).await, pid, "holder still on its server");
    h.batch_execute("commit").await.unwrap();
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_query_wait_timeout_overrides_the_global_one() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("default_pool_size", "1")
        .user_entry("md5user", "query_wait_timeout=1")
        .start()
        .await;
    let h = holder(&p, "md5user", "testdb").await;
    let waiter = p.connect("md5user", "testdb").await;
    let err = tokio::time::timeout(PROMPTLY, scalar(&waiter, "select 1"))
        .await
        .expect("the user's query_wait_timeout fired")
        .expect_err("waiter got a server");
    assert!(err.contains("query_wait_timeout"), "{err}");
    h.batch_execute("commit").await.unwrap();
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_pool_size_overrides_default_pool_size() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("default_pool_size", "5")
        .database("testdb", &format!("{} pool_size=1", pg.db_entry("testdb")))
        .start()
        .await;
    let obs = Observer::new(&pg).await;
    let h = holder(&p, "md5user", "testdb").await;
    let w = spawn_select(p.connect("md5user", "testdb").await);
    assert_still_waiting("a client beyond the database's pool_size", &w, WAIT_WINDOW).await;
    assert_eq!(obs.backends("md5user").await, 1);
    h.batch_execute("commit").await.unwrap();
    assert_eq!(w.await.unwrap(), Ok("1".to_string()));
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_pool_size_overrides_database_pool_size() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("default_pool_size", "5")
        .database("testdb", &format!("{} pool_size=3", pg.db_entry("testdb")))
        .user_entry("md5user", "pool_size=1")
        .start()
        .await;
    let obs = Observer::new(&pg).await;
    let h = holder(&p, "md5user", "testdb").await;
    let w = spawn_select(p.connect("md5user", "testdb").await);
    assert_still_waiting("a client beyond the user's pool_size", &w, WAIT_WINDOW).await;
    assert_eq!(obs.backends("md5user").await, 1);
    // Another user of the same database still gets the database's pool_size.
    let t1 = holder(&p, "trustuser", "testdb").await;
    let t2 = holder(&p, "trustuser", "testdb").await;
    assert_eq!(obs.backends("trustuser").await, 2);
    h.batch_execute("commit").await.unwrap();
    assert_eq!(w.await.unwrap(), Ok("1".to_string()));
    for t in [t1, t2] {
        t.batch_execute("commit").await.unwrap();
    }
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_pool_mode_overrides_global_pool_mode() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("default_pool_size", "5")
        .user_entry("md5user", "pool_mode=session")
        .start()
        .await;
    // Session mode: two connected clients never share a server.
    let (a, b) = (
        p.connect("md5user", "testdb").await,
        p.connect("md5user", "testdb").await,
    );
    let (pa, pb) = (backend_pid(&a).await, backend_pid(&b).await);
    assert_ne!(pa, pb, "session-mode clients share a server");
    assert_eq!(
        backend_pid(&a).await,
        pa,
        "session-mode client moved servers"
    );
    // Transaction mode (global) for another user: idle clients share one server.
    let (x, y) = (
        p.connect("trustuser", "testdb").await,
        p.connect("trustuser", "testdb").await,
    );
    assert_eq!(
        backend_pid(&x).await,
        backend_pid(&y).await,
        "transaction-mode clients did not share"
    );
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_to_a_larger_pool_size_serves_waiters_at_once() {
    let pg = TempPostgres::start();
    let mut p = transaction_pooler(&pg)
        .setting("default_pool_size", "1")
        .start()
        .await;
    let h = holder(&p, "md5user", "testdb").await;
    let w = spawn_select(p.connect("md5user", "testdb").await);
    assert_still_waiting("a client beyond default_pool_size", &w, WAIT_WINDOW).await;
    p.reload_with(|c| c.setting("default_pool_size", "2")).await;
    let r = tokio::time::timeout(PROMPTLY, w)
        .await
        .expect("waiter served after the reload");
    assert_eq!(r.unwrap().as_deref(), Ok("1"));
    // The holder kept its server all along.
    h.batch_execute("select 1; commit").await.unwrap();
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_to_a_smaller_pool_size_closes_idle_servers_beyond_it() {
    let pg = TempPostgres::start();
    let mut p = transaction_pooler(&pg)
        .setting("default_pool_size", "3")
        .start()
        .await;
    let obs = Observer::new(&pg).await;
    let mut holders = Vec::new();
    for _ in 0..3 {
        holders.push(holder(&p, "md5user", "testdb").await);
    }
    for h in &holders {
        h.batch_execute("commit").await.unwrap();
    }
    assert_eq!(obs.backends_in_state("md5user", "idle").await, 3);
    p.reload_with(|c| c.setting("default_pool_size", "1")).await;
    wait_for(
        "idle servers beyond the new pool size closed",
        PROMPTLY,
        || async { obs.backends("md5user").await == 1 },
    )
    .await;
    assert_eq!(scalar(&holders[0], "select 1").await.as_deref(), Ok("1"));
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_client_that_disconnects_gives_back_its_client_slot() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("default_pool_size", "1")
        .setting("max_client_conn", "2")
        .start()
        .await;
    let h = holder(&p, "md5user", "testdb").await;
    let (c, connection) =
        tokio_postgres::connect(&p.dsn("md5user", "testdb"), tokio_postgres::NoTls)
            .await
            .unwrap();
    let socket = tokio::spawn(connection);
    let query = tokio::spawn(async move { scalar(&c, "select 1").await });
    assert_still_waiting("a client beyond default_pool_size", &query, WAIT_WINDOW).await;
    // The waiting client's socket closes (an application timeout, a killed process).
    socket.abort();
    let dsn = p.dsn("md5user", "testdb");
    wait_for(
        "a new client accepted while the holder still holds",
        PROMPTLY,
        || async { harness::try_connect(&dsn).await.is_ok() },
    )
    .await;
    h.batch_execute("select 1; commit").await.unwrap();
    p.shutdown().await;
}

/// SHOW DATABASES' or SHOW USERS' current_client_connections for `name`.
async fn current_clients(admin: &tokio_postgres::Client, view: &str, name: &str) -> u64 {
    harness::console_value(admin, view, &[("name", name)], "current_client_connections")
        .await
        .unwrap_or_else(|| panic!("no row {name} in SHOW {view}"))
        .parse()
        .unwrap()
}

/// The refusal a client gets, as text ("SQLSTATE message").
async fn refusal(p: &TestPooler, user: &str, db: &str) -> String {
    harness::login_outcome(&p.dsn(user, db)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_db_client_connections_refuses_the_client_over_the_limit() {
    let pg = TempPostgres::start();
    // Global 3, testdb's own 2 (the entry wins), postgres under the global one.
    let p = TestPooler::builder(&pg)
        .setting("max_db_client_connections", "3")
        .database(
            "testdb",
            &format!("{} max_db_client_connections=2", pg.db_entry("testdb")),
        )
        .database("postgres", &pg.db_entry("postgres"))
        .start()
        .await;
    let admin = p.connect("postgres", "pgbouncer").await;
    let first = p.connect("md5user", "testdb").await;
    let second = p.connect("scramuser", "testdb").await;
    assert_eq!(current_clients(&admin, "DATABASES", "testdb").await, 2);
    assert_eq!(
        refusal(&p, "md5user", "testdb").await,
        "08P01 client connections exceeded (max_db_client_connections)"
    );
    assert_eq!(current_clients(&admin, "DATABASES", "testdb").await, 2);
    // Other databases have their own count.
    let others: Vec<_> = [
        p.connect("md5user", "postgres").await,
        p.connect("md5user", "postgres").await,
        p.connect("md5user", "postgres").await,
    ]
    .into();
    assert_eq!(
        refusal(&p, "md5user", "postgres").await,
        "08P01 client connections exceeded (max_db_client_connections)"
    );
    // A client that leaves makes room.
    drop(first);
    wait_for("testdb's count to drop", PROMPTLY, || async {
        current_clients(&admin, "DATABASES", "testdb").await == 1
    })
    .await;
    let third = p.connect("md5user", "testdb").await;
    scalar(&third, "select 1").await.unwrap();
    scalar(&second, "select 1").await.unwrap();
    // The console counts its own connections; admin users are never refused there.
    let console_before = current_clients(&admin, "DATABASES", "pgbouncer").await;
    assert_eq!(console_before, 1);
    let more_admins = [
        p.connect("postgres", "pgbouncer").await,
        p.connect("postgres", "pgbouncer").await,
        p.connect("postgres", "pgbouncer").await,
    ];
    assert_eq!(current_clients(&admin, "DATABASES", "pgbouncer").await, 4);
    drop((others, more_admins));
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_user_client_connections_refuses_the_client_over_the_limit() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("max_user_client_connections", "2")
        .user_entry("scramuser", "max_user_client_connections=1")
        .start()
        .await;
    let admin = p.connect("postgres", "pgbouncer").await;
    let s1 = p.connect("scramuser", "testdb").await;
    assert_eq!(current_clients(&admin, "USERS", "scramuser").await, 1);
    assert_eq!(
        refusal(&p, "scramuser", "postgres").await,
        "08P01 client connections exceeded (max_user_client_connections)"
    );
    let m1 = p.connect("md5user", "testdb").await;
    let m2 = p.connect("md5user", "postgres").await;
    assert_eq!(current_clients(&admin, "USERS", "md5user").await, 2);
    assert_eq!(
        refusal(&p, "md5user", "testdb").await,
        "08P01 client connections exceeded (max_user_client_connections)"
    );
    drop(s1);
    wait_for("scramuser's count to drop", PROMPTLY, || async {
        current_clients(&admin, "USERS", "scramuser").await == 0
    })
    .await;
    let s2 = p.connect("scramuser", "testdb").await;
    scalar(&s2, "select 1").await.unwrap();
    drop((m1, m2));
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_user_database_fills_min_pool_size_before_any_client() {
    let pg = TempPostgres::start();
    let obs = Observer::new(&pg).await;
    let p = transaction_pooler(&pg)
        .database(
            "forced",
            &format!("{} user=md5user min_pool_size=2", pg.db_entry("testdb")),
        )
        .database(
            "plain",
            &format!("{} min_pool_size=2", pg.db_entry("testdb")),
        )
        .start()
        .await;
    // No client has connected: the forced user's pool exists and is filled (PgBouncer
    // does the same); a database without a forced user has no pool until a client comes.
    wait_for("2 servers for the forced user", PROMPTLY, || async {
        obs.backends("md5user").await == 2
    })
    .await;
    assert_eq!(obs.backends("scramuser").await, 0);
    assert_eq!(obs.backends_in_db("testdb").await, 2);
    p.shutdown().await;
}

/// `min_pool_size` above the user's `max_user_connections` (or the database's
/// `max_db_connections`): the pool opens up to the limit and no further, logs each server
/// in PgBouncer's words (`new connection to server (from <local addr>)`), and closes none
/// to make room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_pool_size_stops_at_the_user_and_database_limits() {
    let pg = TempPostgres::start();
    for (user_limit, db_limit) in [("2", "0"), ("0", "2")] {
        let spec = transaction_pooler(&pg)
            .setting("default_pool_size", "5")
            .setting("min_pool_size", "5")
            .setting("max_db_connections", db_limit)
            .user_entry("md5user", &format!("max_user_connections={user_limit}"));
        let p = harness::process::PoolerProcess::start(spec).await;
        let obs = Observer::new(&pg).await;
        let c = p.connect("md5user").await;
        c.batch_execute("select 1").await.unwrap();
        wait_for("two servers open", PROMPTLY, || async {
            obs.backends("md5user").await == 2
        })
        .await;
        // A few janitor rounds: no third server, none closed and reopened.
        c.batch_execute("select pg_sleep(1)").await.unwrap();
        assert_eq!(obs.backends("md5user").await, 2);
        let log = p.log();
        let opened = log
            .matches("new connection to server (from 127.0.0.1:")
            .count();
        assert_eq!(opened, 2, "{log}");
        assert!(!log.contains("evicted"), "{log}");
        drop(c);
        drop(p);
        wait_for("the servers closed", PROMPTLY, || async {
            obs.backends("md5user").await == 0
        })
        .await;
    }
}
