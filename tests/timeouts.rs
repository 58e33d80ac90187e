//! Server and client timeouts against a real PostgreSQL: server_lifetime,
//! server_idle_timeout, server_connect_timeout, server_login_retry, client_login_timeout,
//! query_timeout, client_idle_timeout, idle_transaction_timeout, transaction_timeout,
//! query_wait_notify.
mod harness;
mod pool_support;

use std::time::{Duration, Instant};

use harness::{Observer, TempPostgres, TestPooler, transaction_pooler, wait_for};
use pool_support::{backend_pid, connect_watched, scalar};
use tokio::io::AsyncReadExt;

/// Bound on anything that should happen about one timeout (1 s) from now.
const PROMPTLY: Duration = Duration::from_secs(5);
/// A timer set to 1 s must not fire much earlier.
const NOT_BEFORE: Duration = Duration::from_millis(900);

/// `select pg_sleep(10)` on `c` ends promptly with query_timeout's error.
async fn ends_with_query_timeout(c: &tokio_postgres::Client) {
    let started = Instant::now();
    let err = scalar(c, "select pg_sleep(10)")
        .await
        .expect_err("pg_sleep(10) finished");
    assert!(
        started.elapsed() < PROMPTLY,
        "query ran {:?}",
        started.elapsed()
    );
    assert!(err.contains("query timeout"), "{err}");
}

/// Wait until no backend of md5user is active or idle in a transaction.
async fn no_busy_backend(obs: &Observer) {
    wait_for("no busy backend left", PROMPTLY, || async {
        obs.backends_in_state("md5user", "active").await == 0
            && obs
                .backends_in_state("md5user", "idle in transaction")
                .await
                == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_lifetime_replaces_an_old_server_when_it_is_released() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("server_lifetime", "1")
        .start()
        .await;
    let obs = Observer::new(&pg).await;
    let c = p.connect("md5user", "testdb").await;
    let first = backend_pid(&c).await;
    let started = Instant::now();
    wait_for("a new server after server_lifetime", PROMPTLY, || async {
        backend_pid(&c).await != first
    })
    .await;
    assert!(
        started.elapsed() >= NOT_BEFORE / 2,
        "server replaced too early: {:?}",
        started.elapsed()
    );
    wait_for("the old server closed", PROMPTLY, || async {
        !obs.pids("md5user").await.contains(&first)
    })
    .await;
    p.shutdown().await;
}

/// `server_lifetime = 0`: a server serves one client's turn, then it is closed (PgBouncer:
/// "used only once").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_lifetime_zero_uses_a_server_once() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("server_lifetime", "0")
        .start()
        .await;
    let obs = Observer::new(&pg).await;
    let c = p.connect("md5user", "testdb").await;
    let first = backend_pid(&c).await;
    let second = backend_pid(&c).await;
    assert_ne!(first, second, "a server was used twice");
    wait_for("the used servers closed", PROMPTLY, || async {
        obs.backends("md5user").await == 0
    })
    .await;
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_lifetime_closes_an_old_idle_server() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("server_lifetime", "1")
        .start()
        .await;
    let obs = Observer::new(&pg).await;
    let c = p.connect("md5user", "testdb").await;
    scalar(&c, "select 1").await.unwrap();
    assert_eq!(obs.backends("md5user").await, 1);
    wait_for("the old idle server closed", PROMPTLY, || async {
        obs.backends("md5user").await == 0
    })
    .await;
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_idle_timeout_closes_idle_servers() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("server_idle_timeout", "1")
        .start()
        .await;
    let obs = Observer::new(&pg).await;
    let c = p.connect("md5user", "testdb").await;
    scalar(&c, "select 1").await.unwrap();
    assert_eq!(obs.backends("md5user").await, 1);
    wait_for("the idle server closed", PROMPTLY, || async {
        obs.backends("md5user").await == 0
    })
    .await;
    // The client is unaffected: its next query gets a new server.
    assert_eq!(scalar(&c, "select 1").await.as_deref(), Ok("1"));
    p.shutdown().await;
}

/// A server that does not answer within server_connect_timeout is retried, as PgBouncer
/// does: the client keeps waiting until query_timeout (which counts the wait) or
/// query_wait_timeout, whichever comes first, and is told which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_server_is_retried_until_query_timeout_or_query_wait_timeout() {
    let pg = TempPostgres::start();
    // Accepts connections (the kernel completes the handshake) and never says a word.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    for (setting, text) in [
        ("query_timeout", "query_timeout"),
        ("query_wait_timeout", "query_wait_timeout"),
    ] {
        let p = transaction_pooler(&pg)
            .database(
                "silent",
                &format!("host=127.0.0.1 port={port} dbname=testdb"),
            )
            .setting("server_connect_timeout", "1")
            .setting(setting, "3")
            .start()
            .await;
        let started = Instant::now();
        let err = tokio::time::timeout(
            Duration::from_secs(10),
            harness::try_connect(&p.dsn("md5user", "silent")),
        )
        .await
        .unwrap_or_else(|_| panic!("{setting}: login still waiting after 10 s"))
        .expect_err("logged in through a silent server");
        let waited = started.elapsed();
        // Past the first server_connect_timeout: the login was retried, not failed.
        assert!(
            waited >= Duration::from_millis(2900),
            "{setting}: gave up before it: {waited:?} ({err:?})"
        );
        let db = err
            .as_db_error()
            .unwrap_or_else(|| panic!("no error from the pooler: {err:?}"));
        assert_eq!((db.code().code(), db.message()), ("08P01", text), "{err:?}");
        p.shutdown().await;
    }
    drop(silent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_login_retry_fails_clients_fast_and_retries_after_the_delay() {
    let pg = TempPostgres::start();
    let entry =
        |password: &str| format!("{} user=md5user password={password}", pg.db_entry("testdb"));
    let mut p = transaction_pooler(&pg)
        .database("testdb", &entry("wrong"))
        .setting("server_login_retry", "2")
        .start()
        .await;
    let dsn = p.dsn("md5user", "testdb");
    let auth_failures = || pg.log().matches("password authentication failed").count();
    let err = harness::try_connect(&dsn)
        .await
        .expect_err("logged in with a wrong server password");
    let failed_at = Instant::now();
    assert_eq!(harness::sqlstate(&err), Some("28P01"), "{err:?}");
    assert_eq!(auth_failures(), 1);
    p.reload_with(|c| c.database("testdb", &entry("md5pass")))
        .await;
    // Within server_login_retry: refused at once, without a new login attempt.
    let err = harness::try_connect(&dsn)
        .await
        .expect_err("pool retried before server_login_retry");
    assert!(
        failed_at.elapsed() < Duration::from_secs(2),
        "fast fail took {:?}",
        failed_at.elapsed()
    );
    let text = err
        .as_db_error()
        .map(|e| e.message().to_string())
        .unwrap_or_default();
    assert!(text.contains("server_login_retry"), "{err:?}");
    assert_eq!(
        auth_failures(),
        1,
        "server login retried before server_login_retry"
    );
    // After it: the fixed password is used.
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let c = tokio::time::timeout(PROMPTLY, async {
        loop {
            tick.tick().await;
            if let Ok(c) = harness::try_connect(&dsn).await {
                return c;
            }
        }
    })
    .await
    .expect("login after server_login_retry");
    assert!(
        failed_at.elapsed() >= Duration::from_millis(1900),
        "{:?}",
        failed_at.elapsed()
    );
    assert_eq!(
        scalar(&c, "select current_user").await.as_deref(),
        Ok("md5user")
    );
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_login_timeout_disconnects_a_silent_client() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("client_login_timeout", "1")
        .start()
        .await;
    let mut raw = tokio::net::TcpStream::connect(p.addr()).await.unwrap();
    let started = Instant::now();
    let mut rest = Vec::new();
    tokio::time::timeout(PROMPTLY, raw.read_to_end(&mut rest))
        .await
        .expect("silent client still connected after client_login_timeout")
        .ok();
    assert!(
        started.elapsed() >= NOT_BEFORE,
        "disconnected early: {:?}",
        started.elapsed()
    );
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_timeout_fails_the_query_and_the_server_is_reused_clean() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("default_pool_size", "1")
        .setting("query_timeout", "1")
        .start()
        .await;
    let obs = Observer::new(&pg).await;
    let c = p.connect("md5user", "testdb").await;
    ends_with_query_timeout(&c).await;
    no_busy_backend(&obs).await;
    let next = p.connect("md5user", "testdb").await;
    assert_eq!(scalar(&next, "select 1").await.as_deref(), Ok("1"));
    assert!(obs.backends("md5user").await <= 1);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_idle_timeout_disconnects_an_idle_client() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("client_idle_timeout", "1")
        .start()
        .await;
    let mut w = connect_watched(&p.dsn("md5user", "testdb")).await;
    scalar(&w.client, "select 1").await.unwrap();
    let started = Instant::now();
    let why = w.events.closed_within(PROMPTLY).await;
    assert!(why.contains("client_idle_timeout"), "{why}");
    assert!(
        started.elapsed() >= NOT_BEFORE,
        "disconnected early: {:?}",
        started.elapsed()
    );
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_transaction_timeout_disconnects_and_rolls_back() {
    let pg = TempPostgres::start();
    pg.psql_in(
        "testdb",
        "create table t (id int primary key); insert into t values (1); grant all on t to public",
    );
    let p = transaction_pooler(&pg)
        .setting("idle_transaction_timeout", "1")
        .start()
        .await;
    let obs = Observer::new(&pg).await;
    let mut w = connect_watched(&p.dsn("md5user", "testdb")).await;
    w.client
        .batch_execute("begin; select * from t where id = 1 for update")
        .await
        .unwrap();
    let why = w.events.closed_within(PROMPTLY).await;
    assert!(why.contains("idle transaction timeout"), "{why}");
    wait_for("the transaction rolled back", PROMPTLY, || async {
        obs.backends_in_state("md5user", "idle in transaction")
            .await
            == 0
    })
    .await;
    // The row lock is gone: another client takes it without waiting.
    let other = p.connect("md5user", "testdb").await;
    other
        .batch_execute("begin; select * from t where id = 1 for update nowait; commit")
        .await
        .unwrap();
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_timeout_ends_a_busy_long_transaction() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("transaction_timeout", "1")
        .start()
        .await;
    let obs = Observer::new(&pg).await;
    let mut w = connect_watched(&p.dsn("md5user", "testdb")).await;
    w.client.batch_execute("begin").await.unwrap();
    let started = Instant::now();
    // Never idle for long inside the transaction: only transaction_timeout applies.
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let query_err = loop {
        if let Err(e) = scalar(&w.client, "select 1").await {
            break e;
        }
        assert!(
            started.elapsed() < PROMPTLY,
            "transaction still open after {:?}",
            started.elapsed()
        );
        tick.tick().await;
    };
    assert!(
        started.elapsed() >= NOT_BEFORE,
        "ended early: {:?}",
        started.elapsed()
    );
    // The FATAL reaches the query in flight if there is one, else the connection.
    let why = w.events.closed_within(PROMPTLY).await;
    assert!(
        query_err.contains("transaction timeout") || why.contains("transaction timeout"),
        "query: {query_err}; connection: {why}"
    );
    wait_for("the transaction rolled back", PROMPTLY, || async {
        obs.backends_in_state("md5user", "idle in transaction")
            .await
            == 0
    })
    .await;
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_wait_notify_tells_a_waiting_client() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("default_pool_size", "1")
        .setting("query_wait_notify", "0.5")
        .start()
        .await;
    let holder = p.connect("md5user", "testdb").await;
    holder.batch_execute("begin; select 1").await.unwrap();
    let mut w = connect_watched(&p.dsn("md5user", "testdb")).await;
    let query = scalar(&w.client, "select 1");
    tokio::pin!(query);
    let notice = tokio::select! {
        n = w.events.notice_within(PROMPTLY) => n,
        r = &mut query => panic!("query finished while the pool was busy: {r:?}"),
    };
    // PgBouncer's words, which tools and tests match.
    assert!(
        notice.contains("No server connection available in postgres backend, client being queued"),
        "{notice}"
    );
    holder.batch_execute("commit").await.unwrap();
    assert_eq!(query.await.as_deref(), Ok("1"));
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_timeout_applies_to_a_query_inside_a_transaction() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("query_timeout", "1")
        .start()
        .await;
    let obs = Observer::new(&pg).await;
    let c = p.connect("md5user", "testdb").await;
    // The server is already held when the slow query is sent.
    c.batch_execute("begin; select 1").await.unwrap();
    ends_with_query_timeout(&c).await;
    no_busy_backend(&obs).await;
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_query_timeout_overrides_the_global_one() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .user_entry("md5user", "query_timeout=1")
        .start()
        .await;
    let c = p.connect("md5user", "testdb").await;
    ends_with_query_timeout(&c).await;
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_idle_timeout_keeps_min_pool_size_servers() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("default_pool_size", "3")
        .setting("min_pool_size", "1")
        .setting("server_idle_timeout", "1")
        .start()
        .await;
    let obs = Observer::new(&pg).await;
    let mut holders = Vec::new();
    for _ in 0..3 {
        let c = p.connect("md5user", "testdb").await;
        c.batch_execute("begin; select 1").await.unwrap();
        holders.push(c);
    }
    let used = obs.pids("md5user").await;
    assert_eq!(used.len(), 3);
    for c in &holders {
        c.batch_execute("commit").await.unwrap();
    }
    wait_for(
        "idle servers beyond min_pool_size closed",
        PROMPTLY,
        || async { obs.backends("md5user").await == 1 },
    )
    .await;
    let kept = obs.pids("md5user").await;
    assert!(
        used.contains(&kept[0]),
        "the min_pool_size server was reopened, not kept: {kept:?} vs {used:?}"
    );
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_timeout_in_session_mode_resets_the_server_for_the_next_client() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "session")
        .setting("default_pool_size", "1")
        .setting("query_timeout", "1")
        .start()
        .await;
    let c = p.connect("md5user", "testdb").await;
    let pid = backend_pid(&c).await;
    // Session state PostgreSQL does not report: only server_reset_query clears it.
    c.batch_execute("set work_mem = '7777kB'").await.unwrap();
    let err = scalar(&c, "select pg_sleep(10)")
        .await
        .expect_err("pg_sleep(10) finished");
    assert!(err.contains("query timeout"), "{err}");
    // The pool's only server is cancelled, reset and handed to the next client (not closed
    // and replaced: that would pass without any reset).
    let next = p.connect("md5user", "testdb").await;
    let next_pid = backend_pid(&next).await;
    assert_eq!(
        next_pid, pid,
        "the timed-out session's server was not reused"
    );
    let work_mem = scalar(&next, "show work_mem").await.unwrap();
    let fresh = pg.connect("md5user", "testdb").await;
    let default = scalar(&fresh, "show work_mem").await.unwrap();
    assert_eq!(
        work_mem, default,
        "the next client inherited the timed-out session's state"
    );
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_login_timeout_disconnects_a_client_that_never_answers_the_password_request() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("client_login_timeout", "1")
        .start()
        .await;
    let mut raw = tokio::net::TcpStream::connect(p.addr()).await.unwrap();
    let startup = harness::wire::startup_message(&[("user", "md5user"), ("database", "testdb")]);
    tokio::io::AsyncWriteExt::write_all(&mut raw, &startup)
        .await
        .unwrap();
    let started = Instant::now();
    let mut rest = Vec::new();
    tokio::time::timeout(PROMPTLY, raw.read_to_end(&mut rest))
        .await
        .expect("client still connected after client_login_timeout")
        .ok();
    assert!(
        started.elapsed() >= NOT_BEFORE,
        "disconnected early: {:?}",
        started.elapsed()
    );
    assert_eq!(
        rest.first(),
        Some(&b'R'),
        "the pooler asked for a password first"
    );
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_transaction_timeout_applies_in_session_mode() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "session")
        .setting("idle_transaction_timeout", "1")
        .start()
        .await;
    let obs = Observer::new(&pg).await;
    let mut w = connect_watched(&p.dsn("md5user", "testdb")).await;
    w.client.batch_execute("begin; select 1").await.unwrap();
    let why = w.events.closed_within(PROMPTLY).await;
    assert!(why.contains("idle transaction timeout"), "{why}");
    wait_for("the transaction rolled back", PROMPTLY, || async {
        obs.backends_in_state("md5user", "idle in transaction")
            .await
            == 0
    })
    .await;
    p.shutdown().await;
}
