//! Network faults between pgcarpool and PostgreSQL (issue 24): a userspace proxy
//! (`harness::faultproxy`) between the pooler and PostgreSQL holds every byte (a server
//! that was up and whose packets are now dropped, or one that accepts TCP and never
//! answers) or adds latency. Database `faulty` goes through the proxy, `direct` straight to
//! PostgreSQL. The affected clients get clear errors from the timeouts configured
//! (query_timeout, server_connect_timeout, query_wait_timeout, server_check_query), the
//! other pool keeps serving, and once the network is back nothing is left stuck.
//! (PgBouncer's own root-only tests, which drop packets with iptables, run in the peer
//! suite with `--sudo`: test_server_connect_timeout_drop_traffic, test_server_check_delay,
//! test_cancel_wait_timeout.)
mod harness;

use std::time::Duration;

use harness::faultproxy::FaultProxy;
use harness::{TempPostgres, TestPooler, error_text, pool_count, scalar_within, wait_for};

/// Bound on anything that must end by itself (the timeouts configured are 1–3 s).
const ENDS: Duration = Duration::from_secs(20);

async fn pooler(pg: &TempPostgres, proxy: &FaultProxy, extra: &[(&str, &str)]) -> TestPooler {
    TestPooler::builder(pg)
        .setting("pool_mode", "transaction")
        .database(
            "faulty",
            &format!("host=127.0.0.1 port={} dbname=testdb", proxy.port()),
        )
        .database("direct", &pg.db_entry("testdb"))
        .settings(extra)
        .start()
        .await
}

/// `select n` as a simple query (no prepared statement: tokio-postgres closes those
/// later, in the background, and a FATAL would then go to that close, not to the query):
/// n, or the error's text (a hang fails the test).
async fn select(c: &tokio_postgres::Client, n: i32) -> Result<i32, String> {
    let v = scalar_within(c, &format!("select {n}"), ENDS).await?;
    Ok(v.parse().expect("a number"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packets_dropped_during_a_query_end_it_at_query_timeout_and_other_pools_keep_serving() {
    let pg = TempPostgres::start();
    let proxy = FaultProxy::start(pg.port()).await;
    let p = pooler(&pg, &proxy, &[("query_timeout", "2")]).await;
    let admin = p.connect("postgres", "pgbouncer").await;
    let faulty = p.connect("md5user", "faulty").await;
    let direct = p.connect("md5user", "direct").await;
    assert_eq!(select(&faulty, 1).await, Ok(1));
    // The query's answer is never seen: packets are dropped while it runs.
    let running = tokio::spawn(async move {
        let r = tokio::time::timeout(ENDS, faulty.simple_query("select pg_sleep(0.3)")).await;
        r.expect("a query to a dropped server hung").map(|_| ())
    });
    proxy.blackhole();
    // The other pool keeps serving meanwhile.
    for n in 0..5 {
        assert_eq!(select(&direct, n).await, Ok(n));
    }
    let e = running
        .await
        .unwrap()
        .expect_err("a query answered through a blackhole");
    assert_eq!(error_text(&e), "08P01 query timeout");
    // The server is closed, not kept active or put back.
    wait_for("the dropped server is let go", ENDS, || async {
        pool_count(&admin, "faulty", "sv_active").await == 0
            && pool_count(&admin, "faulty", "sv_idle").await == 0
    })
    .await;
    proxy.restore();
    let again = p.connect("md5user", "faulty").await;
    assert_eq!(select(&again, 7).await, Ok(7));
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_accepts_and_never_answers_ends_the_wait_at_query_wait_timeout() {
    let pg = TempPostgres::start();
    let proxy = FaultProxy::start(pg.port()).await;
    let p = pooler(
        &pg,
        &proxy,
        &[("server_connect_timeout", "1"), ("query_wait_timeout", "3")],
    )
    .await;
    let admin = p.connect("postgres", "pgbouncer").await;
    // Logged in while the server answered (the pool knows its parameters), then the
    // server stops answering: new server logins are accepted and never answered.
    let faulty = p.connect("md5user", "faulty").await;
    assert_eq!(select(&faulty, 1).await, Ok(1));
    admin.simple_query("RECONNECT faulty").await.unwrap();
    wait_for("the idle server is closed", ENDS, || async {
        pool_count(&admin, "faulty", "sv_idle").await == 0
    })
    .await;
    proxy.blackhole();
    let direct = p.connect("md5user", "direct").await;
    let waiting = tokio::spawn(async move { select(&faulty, 2).await });
    // Logins to the silent server time out (server_connect_timeout) and are retried; the
    // other pool serves meanwhile.
    wait_for(
        "a server login attempt through the blackhole",
        ENDS,
        || async { proxy.open() > 0 },
    )
    .await;
    // SHOW POOLS tells the server being opened from the active ones.
    wait_for("the login counted in sv_login", ENDS, || async {
        pool_count(&admin, "faulty", "sv_login").await == 1
            && pool_count(&admin, "faulty", "sv_active").await == 0
    })
    .await;
    assert_eq!(select(&direct, 3).await, Ok(3));
    assert_eq!(
        waiting.await.unwrap(),
        Err("08P01 query_wait_timeout".into())
    );
    proxy.restore();
    let again = p.connect("md5user", "faulty").await;
    assert_eq!(select(&again, 4).await, Ok(4));
    // No server is left half logged in.
    wait_for("no server stuck logging in", ENDS, || async {
        pool_count(&admin, "faulty", "sv_login").await == 0
    })
    .await;
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_server_behind_dropped_packets_fails_its_check_and_the_client_is_served_later() {
    let pg = TempPostgres::start();
    let proxy = FaultProxy::start(pg.port()).await;
    let p = pooler(
        &pg,
        &proxy,
        &[
            ("server_check_delay", "0"),
            ("server_check_query", "select 1"),
            ("server_connect_timeout", "1"),
            ("query_wait_timeout", "15"),
        ],
    )
    .await;
    let faulty = p.connect("md5user", "faulty").await;
    let pid = |c: tokio_postgres::Client| async move {
        let pid = scalar_within(&c, "select \"pg_backend_pid\"()", ENDS).await?;
        Ok::<_, String>((c, pid))
    };
    let (faulty, first) = pid(faulty).await.unwrap();
    assert_eq!(proxy.open(), 1, "one server");
    proxy.blackhole();
    // The idle server's check query gets no answer within server_connect_timeout: it is
    // closed, and a new login is tried (and waits for the network).
    let waiting = tokio::spawn(pid(faulty));
    wait_for(
        "a new server login after the failed check",
        ENDS,
        || async { proxy.open() >= 2 },
    )
    .await;
    proxy.restore();
    let (_, second) = waiting
        .await
        .unwrap()
        .expect("served once the network is back");
    assert_ne!(first, second, "the server that failed its check was used");
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn added_latency_slows_but_every_row_is_right() {
    let pg = TempPostgres::start();
    let proxy = FaultProxy::start(pg.port()).await;
    // 100 ms each way: 200 ms more per round trip.
    proxy.delay(Duration::from_millis(100));
    let p = pooler(&pg, &proxy, &[("default_pool_size", "2")]).await;
    let mut tasks = Vec::new();
    for c in 0..4 {
        let client = p.connect("md5user", "faulty").await;
        tasks.push(tokio::spawn(async move {
            for n in 0..3 {
                let want = c * 10 + n;
                assert_eq!(select(&client, want).await, Ok(want));
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    p.shutdown().await;
}
