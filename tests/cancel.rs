//! CancelRequest through pgcarpool: it reaches exactly the server running that client's
//! query; unknown keys are ignored.
mod harness;

use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::{Observer, TempPostgres, TestPooler, eventually};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Send `token`'s CancelRequest and wait until pgcarpool closes the cancel connection: it
/// does so once it has handled the request (forwarded it and PostgreSQL closed its cancel
/// connection, i.e. signalled the backend; or ignored it).
async fn cancel_and_wait(token: &tokio_postgres::CancelToken, p: &TestPooler) {
    let mut sock = tokio::net::TcpStream::connect(p.addr()).await.unwrap();
    token
        .cancel_query_raw(&mut sock, tokio_postgres::NoTls)
        .await
        .expect("send cancel");
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), sock.read_to_end(&mut rest))
        .await
        .expect("the cancel connection was not closed")
        .expect("read the cancel connection");
    assert!(
        rest.is_empty(),
        "a cancel connection was answered: {rest:?}"
    );
}

/// `task` (a query a cancel must not reach) is still running a while after such a cancel
/// was handled: a forwarded cancel ends a pg_sleep within milliseconds.
async fn still_running<T>(what: &str, task: &tokio::task::JoinHandle<T>) {
    let ended = eventually(Duration::from_millis(500), || async { task.is_finished() }).await;
    assert!(
        !ended,
        "{what} ended after a cancel meant for no one running it"
    );
}

/// Cancel the query behind `token` for real and check it ends with 57014 (query_canceled):
/// only a cancel can end a 30 s pg_sleep within the test.
async fn cancel_ends<T: std::fmt::Debug>(
    token: &tokio_postgres::CancelToken,
    task: tokio::task::JoinHandle<Result<T, tokio_postgres::Error>>,
) {
    token
        .cancel_query(tokio_postgres::NoTls)
        .await
        .expect("send cancel");
    let result = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the query still runs 5 s after its cancel")
        .unwrap();
    let err = result.expect_err("the cancelled query succeeded");
    assert_eq!(harness::sqlstate(&err), Some("57014"), "{err:?}");
}

async fn pooler(pg: &TempPostgres) -> TestPooler {
    TestPooler::builder(pg)
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "4")
        .start()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_ends_the_running_query_with_57014() {
    let pg = TempPostgres::start();
    let p = pooler(&pg).await;
    let monitor = Observer::new(&pg).await;
    let c = p.connect("md5user", "testdb").await;
    let token = c.cancel_token();
    let long = tokio::spawn(async move { c.simple_query("select pg_sleep(10)").await });
    monitor.wait_running("md5user", "pg_sleep(10)", 1).await;
    let sent = Instant::now();
    token
        .cancel_query(tokio_postgres::NoTls)
        .await
        .expect("send cancel");
    let result = tokio::time::timeout(Duration::from_secs(2), long)
        .await
        .expect("the query still runs 2 s after the cancel")
        .unwrap();
    eprintln!("cancelled after {:?}", sent.elapsed());
    let err = result.expect_err("the cancelled query succeeded");
    assert_eq!(harness::sqlstate(&err), Some("57014"), "{err:?}");
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_leaves_other_clients_queries_alone() {
    let pg = TempPostgres::start();
    let p = pooler(&pg).await;
    let monitor = Observer::new(&pg).await;
    let victim = p.connect("md5user", "testdb").await;
    let bystander = p.connect("md5user", "testdb").await;
    let token = victim.cancel_token();
    let bystander_token = bystander.cancel_token();
    let long = tokio::spawn(async move { victim.simple_query("select pg_sleep(10)").await });
    let other = tokio::spawn(async move {
        bystander
            .simple_query("select pg_sleep(30), 'bystander'")
            .await
    });
    monitor.wait_running("md5user", "pg_sleep(10)", 1).await;
    monitor.wait_running("md5user", "pg_sleep(30)", 1).await;
    token
        .cancel_query(tokio_postgres::NoTls)
        .await
        .expect("send cancel");
    let cancelled = tokio::time::timeout(Duration::from_secs(2), long)
        .await
        .expect("the cancelled query still runs")
        .unwrap();
    assert_eq!(
        cancelled.err().as_ref().and_then(harness::sqlstate),
        Some("57014")
    );
    still_running("the bystander's query", &other).await;
    cancel_ends(&bystander_token, other).await;
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_with_an_unknown_key_is_ignored() {
    let pg = TempPostgres::start();
    let p = pooler(&pg).await;
    let monitor = Observer::new(&pg).await;
    let c = p.connect("md5user", "testdb").await;
    let token = c.cancel_token();
    let running = tokio::spawn(async move { c.simple_query("select pg_sleep(30), 'kept'").await });
    monitor.wait_running("md5user", "pg_sleep(30)", 1).await;
    // CancelRequest: length 16, code 80877102, a process id and key nobody was given.
    let mut msg = Vec::with_capacity(16);
    msg.extend_from_slice(&16i32.to_be_bytes());
    msg.extend_from_slice(&80877102i32.to_be_bytes());
    msg.extend_from_slice(&0x1234_5678i32.to_be_bytes());
    msg.extend_from_slice(&0x0bad_cafei32.to_be_bytes());
    let mut sock = tokio::net::TcpStream::connect(p.addr()).await.unwrap();
    sock.write_all(&msg).await.unwrap();
    // The pooler closes a cancel connection without answering, once it has handled it.
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), sock.read_to_end(&mut rest))
        .await
        .expect("the cancel connection was not closed");
    assert!(read.is_ok() && rest.is_empty(), "{read:?} {rest:?}");
    still_running("the query", &running).await;
    cancel_ends(&token, running).await;
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_from_an_idle_client_does_not_hit_the_next_user_of_its_server() {
    let pg = TempPostgres::start();
    // One server: the idle client's last server is the one the other client now uses.
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "1")
        .start()
        .await;
    let monitor = Observer::new(&pg).await;
    let idle = p.connect("md5user", "testdb").await;
    idle.simple_query("select 1").await.unwrap();
    let busy = p.connect("md5user", "testdb").await;
    let busy_token = busy.cancel_token();
    let running =
        tokio::spawn(async move { busy.simple_query("select pg_sleep(30), 'busy'").await });
    monitor.wait_running("md5user", "pg_sleep(30)", 1).await;
    cancel_and_wait(&idle.cancel_token(), &p).await;
    still_running("the busy client's query", &running).await;
    cancel_ends(&busy_token, running).await;
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_works_in_session_mode() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "session")
        .setting("default_pool_size", "2")
        .start()
        .await;
    let monitor = Observer::new(&pg).await;
    let c = p.connect("md5user", "testdb").await;
    let token = c.cancel_token();
    let long = tokio::spawn(async move {
        let r = c.simple_query("select pg_sleep(10)").await;
        (r, c)
    });
    monitor.wait_running("md5user", "pg_sleep(10)", 1).await;
    token
        .cancel_query(tokio_postgres::NoTls)
        .await
        .expect("send cancel");
    let (result, c) = tokio::time::timeout(Duration::from_secs(2), long)
        .await
        .expect("the query still runs 2 s after the cancel")
        .unwrap();
    let err = result.expect_err("the cancelled query succeeded");
    assert_eq!(harness::sqlstate(&err), Some("57014"), "{err:?}");
    // The session goes on.
    c.simple_query("select 1").await.unwrap();
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_cancel_never_reaches_the_next_user_of_the_server() {
    let pg = TempPostgres::start();
    // One server shared by a client whose cancels arrive as its queries end, and a bystander.
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "1")
        .start()
        .await;
    let canceller = Arc::new(p.connect("md5user", "testdb").await);
    let bystander = p.connect("md5user", "testdb").await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = {
        let (c, stop) = (canceller.clone(), stop.clone());
        tokio::spawn(async move {
            let token = c.cancel_token();
            let mut sent = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Jitter (not synchronisation): the cancel lands at varying points
                // around the end of the query.
                let jitter = Duration::from_micros(u64::from(sent % 150) * 100);
                let q = c.simple_query("select pg_sleep(0.002)");
                let cancel = async {
                    tokio::time::sleep(jitter).await;
                    token.cancel_query(tokio_postgres::NoTls).await
                };
                let (_, r) = tokio::join!(q, cancel);
                r.expect("send cancel");
                sent += 1;
            }
            sent
        })
    };
    let deadline = Instant::now() + Duration::from_secs(4);
    let mut runs = 0;
    while Instant::now() < deadline {
        let r = bystander.simple_query("select pg_sleep(0.005)").await;
        if let Err(e) = r {
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            panic!("after {runs} runs the bystander's query was cancelled: {e:?}");
        }
        runs += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = churn.await.unwrap();
    eprintln!("{sent} cancels sent; {runs} bystander queries all completed");
    p.shutdown().await;
}

/// After a cancel, the server is cleaned and back in the pool at once: the next client of
/// a pool of one gets it, long before `cancel_wait_timeout` (once a handle SHOW SERVERS
/// kept on the server's address read as a cancel still in flight, and the server stayed
/// "tested" until that timeout; PgBouncer's test_peering failed on it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_server_serves_the_next_client_without_waiting_for_cancel_wait_timeout() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "statement")
        .setting("default_pool_size", "1")
        .setting("cancel_wait_timeout", "120")
        .start()
        .await;
    let monitor = Observer::new(&pg).await;
    let a = Arc::new(p.connect("md5user", "testdb").await);
    let b = p.connect("md5user", "testdb").await;
    for round in 0..3 {
        // The last round's backend may still show as active for a moment.
        monitor.wait_running("md5user", "pg_sleep(30)", 0).await;
        let token = a.cancel_token();
        let sleeper = a.clone();
        let long = tokio::spawn(async move { sleeper.simple_query("select pg_sleep(30)").await });
        monitor.wait_running("md5user", "pg_sleep(30)", 1).await;
        cancel_ends(&token, long).await;
        let next = tokio::time::timeout(Duration::from_secs(20), b.simple_query("select 1"))
            .await
            .unwrap_or_else(|_| {
                panic!("round {round}: the next client still waits for the cancelled server")
            });
        next.expect("select 1");
    }
    p.shutdown().await;
}
