//! Clients that vanish in the middle of something: their servers are cleaned (cancel,
//! rollback, COPY aborted) before anyone else gets them, or closed; never handed out dirty.
mod harness;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use harness::wire::{message, startup_message};
use harness::{Observer, TempPostgres, TestPooler, eventually, pg_bin, scalar};
use tokio::task::JoinHandle;

/// Connect through `dsn` and keep the connection task's handle: aborting it closes the
/// socket without a Terminate message, as a crashed client would.
async fn connect_abortable(dsn: &str) -> (tokio_postgres::Client, JoinHandle<()>) {
    let (client, connection) = tokio_postgres::connect(dsn, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect {dsn}: {e}"));
    let task = tokio::spawn(async move {
        let _ = connection.await;
    });
    (client, task)
}

/// The error query_timeout gives the client: FATAL 08P01 `query_timeout` (PgBouncer's
/// disconnect code and the setting's name).
fn assert_query_timeout(err: &tokio_postgres::Error) {
    let db = err
        .as_db_error()
        .unwrap_or_else(|| panic!("no error from the pooler: {err:?}"));
    assert_eq!(
        (db.code().code(), db.message()),
        ("08P01", "query timeout"),
        "{err:?}"
    );
}

async fn rows_table(pg: &TempPostgres, rows: u32) {
    pg.psql_in(
        "testdb",
        &format!(
            "create table locked (id int primary key, v int); \
             insert into locked select g, 0 from generate_series(1, {rows}) g; \
             grant all on locked to public"
        ),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_vanishing_inside_transactions_leave_no_locks_behind() {
    let pg = TempPostgres::start();
    rows_table(&pg, 40).await;
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "60")
        .start()
        .await;
    let monitor = pg.connect("postgres", "testdb").await;
    let obs = Observer::new(&pg).await;
    // 40 clients lock distinct rows; 10 more wait for row 1's lock (a query running).
    let mut conns = Vec::new();
    let mut waiting = Vec::new();
    for i in 0..50u32 {
        let (c, task) = connect_abortable(&p.dsn("md5user", "testdb")).await;
        c.simple_query("begin").await.unwrap();
        let id = if i < 40 { i + 1 } else { 1 };
        let sql = format!("select * from locked where id = {id} for update");
        if i < 40 {
            c.simple_query(&sql).await.unwrap();
        } else {
            let c2 = c;
            waiting.push(tokio::spawn(async move {
                let _ = c2.simple_query(&sql).await;
                c2
            }));
            conns.push((None, task));
            continue;
        }
        conns.push((Some(c), task));
    }
    assert!(
        eventually(Duration::from_secs(10), || async {
            obs.count("usename = 'md5user' and wait_event_type = 'Lock'", &[])
                .await
                == 10
                && obs
                    .count(
                        "usename = 'md5user' and state like 'idle in transaction%'",
                        &[],
                    )
                    .await
                    == 40
        })
        .await,
        "the 50 clients did not reach their locks"
    );
    for (_, task) in &conns {
        task.abort();
    }
    let gone = Instant::now();
    let clean = eventually(Duration::from_secs(2), || async {
        obs.count(
            "usename = 'md5user' \
             and (state like 'idle in transaction%' or wait_event_type = 'Lock')",
            &[],
        )
        .await
            == 0
    })
    .await;
    eprintln!("cleaned after {:?}", gone.elapsed());
    assert!(
        clean,
        "backends still in a transaction 2 s after their clients vanished"
    );
    // The locks are free.
    monitor.simple_query("begin").await.unwrap();
    monitor
        .simple_query("select * from locked where id between 1 and 40 for update nowait")
        .await
        .expect("rows still locked");
    monitor.simple_query("rollback").await.unwrap();
    // pgcarpool keeps serving, on clean servers.
    for _ in 0..5 {
        let c = p.connect("md5user", "testdb").await;
        assert!(
            scalar(&c, "select now() = statement_timestamp()")
                .await
                .as_deref()
                == Ok("t"),
            "handed a server inside a transaction"
        );
    }
    for w in waiting {
        w.abort();
    }
    drop(conns);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_killed_mid_query_gets_its_query_cancelled() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "1")
        .start()
        .await;
    let obs = Observer::new(&pg).await;
    let (c, task) = connect_abortable(&p.dsn("md5user", "testdb")).await;
    let sleeper = tokio::spawn(async move {
        let _ = c.simple_query("select pg_sleep(30)").await;
    });
    obs.wait_running("md5user", "pg_sleep(30)", 1).await;
    task.abort();
    let gone = Instant::now();
    assert!(
        eventually(Duration::from_secs(2), || async {
            obs.busy("md5user").await == 0
        })
        .await,
        "the dead client's query still runs 2 s later"
    );
    eprintln!("query cancelled after {:?}", gone.elapsed());
    // The only server of the pool is reused (or replaced) and clean.
    let c2 = p.connect("md5user", "testdb").await;
    let started = Instant::now();
    let row = c2.query_one("select 41 + 1", &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 42);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(scalar(&c2, "select 'fresh'").await.as_deref() == Ok("fresh"));
    sleeper.abort();
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_leaving_mid_copy_from_stdin_leaves_a_clean_server() {
    let pg = TempPostgres::start();
    pg.psql_in(
        "testdb",
        "create table copied (v int); grant all on copied to public",
    );
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "1")
        .start()
        .await;
    let obs = Observer::new(&pg).await;
    // psql waits on its stdin in COPY mode; we write a few rows and then kill it.
    let mut psql = Command::new(pg_bin("psql"))
        .args([
            "-X",
            "-q",
            "-d",
            &p.dsn("md5user", "testdb"),
            "-c",
            "copy copied from stdin",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn psql");
    {
        use std::io::Write;
        let stdin = psql.stdin.as_mut().unwrap();
        stdin.write_all(b"1\n2\n3\n").unwrap();
        stdin.flush().unwrap();
    }
    obs.wait_running("md5user", "copy copied", 1).await;
    psql.kill().expect("kill psql (our child)");
    psql.wait().unwrap();
    assert!(
        eventually(Duration::from_secs(2), || async {
            obs.busy("md5user").await == 0
        })
        .await,
        "the COPY still runs 2 s after its client died"
    );
    let c = p.connect("md5user", "testdb").await;
    let row = c
        .query_one("select count(*) from copied", &[])
        .await
        .unwrap();
    assert_eq!(
        row.get::<_, i64>(0),
        0,
        "rows of an aborted COPY were committed"
    );
    let row = c.query_one("select 7", &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 7);
    p.shutdown().await;
}

/// A raw protocol client logged in through the pooler (auth_type = trust) as trustuser.
async fn raw_login(p: &TestPooler) -> tokio::net::TcpStream {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut sock = tokio::net::TcpStream::connect(p.addr()).await.unwrap();
    sock.write_all(&startup_message(&[
        ("user", "trustuser"),
        ("database", "testdb"),
    ]))
    .await
    .unwrap();
    // Read messages up to the first ReadyForQuery.
    loop {
        let mut header = [0u8; 5];
        sock.read_exact(&mut header).await.unwrap();
        let len = i32::from_be_bytes(header[1..5].try_into().unwrap());
        let mut rest = vec![0u8; usize::try_from(len - 4).unwrap()];
        sock.read_exact(&mut rest).await.unwrap();
        assert_ne!(header[0], b'E', "login refused: {rest:?}");
        if header[0] == b'Z' {
            return sock;
        }
    }
}

async fn trust_pooler(pg: &TempPostgres) -> TestPooler {
    TestPooler::builder(pg)
        .setting("pool_mode", "transaction")
        .setting("auth_type", "trust")
        .setting("default_pool_size", "1")
        .start()
        .await
}

/// After a raw client vanished: no trustuser backend is busy, and the pool still serves.
async fn pool_still_clean(pg: &TempPostgres, p: &TestPooler) {
    let obs = Observer::new(pg).await;
    // Generous: cancelling a 300,000-row query takes a while on a loaded machine.
    let idle = eventually(Duration::from_secs(10), || async {
        obs.busy("trustuser").await == 0
    })
    .await;
    assert!(idle, "a trustuser backend is still busy");
    let c = p.connect("trustuser", "testdb").await;
    assert_eq!(
        scalar(&c, "select now() = statement_timestamp()")
            .await
            .as_deref(),
        Ok("t")
    );
    let row = c.query_one("select 5", &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_leaving_mid_message_does_not_poison_the_pool() {
    use tokio::io::AsyncWriteExt;
    let pg = TempPostgres::start();
    let p = trust_pooler(&pg).await;
    let mut sock = raw_login(&p).await;
    // A Query announcing 1,000 bytes of which only a few arrive.
    let mut partial = vec![b'Q'];
    partial.extend_from_slice(&1004i32.to_be_bytes());
    partial.extend_from_slice(b"select 1");
    sock.write_all(&partial).await.unwrap();
    sock.flush().await.unwrap();
    drop(sock);
    pool_still_clean(&pg, &p).await;
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_leaving_after_parse_without_sync_does_not_poison_the_pool() {
    use tokio::io::AsyncWriteExt;
    let pg = TempPostgres::start();
    let p = trust_pooler(&pg).await;
    let mut sock = raw_login(&p).await;
    // BEGIN through the extended protocol, then a Parse with no Sync, then gone.
    let mut bytes = message(b'Q', b"begin\0");
    bytes.extend(message(b'P', b"\0select pg_sleep(0)\0\0\0"));
    bytes.extend(message(b'H', b""));
    sock.write_all(&bytes).await.unwrap();
    sock.flush().await.unwrap();
    drop(sock);
    pool_still_clean(&pg, &p).await;
    p.shutdown().await;
}

/// Read a raw connection's messages up to one with `tag`; the tags seen.
async fn read_until(sock: &mut tokio::net::TcpStream, tag: u8) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut seen = Vec::new();
    loop {
        let mut header = [0u8; 5];
        sock.read_exact(&mut header).await.unwrap();
        let len = i32::from_be_bytes(header[1..5].try_into().unwrap());
        let mut rest = vec![0u8; usize::try_from(len - 4).unwrap()];
        sock.read_exact(&mut rest).await.unwrap();
        seen.push(header[0]);
        if header[0] == tag {
            return seen;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extended_copy_that_fails_gives_its_server_back_without_virtual_statements() {
    use tokio::io::AsyncWriteExt;
    let pg = TempPostgres::start();
    pg.psql_in(
        "testdb",
        "create table copied (v int); grant all on copied to public",
    );
    // No virtual statements: the relay follows the protocol position alone.
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("auth_type", "trust")
        .setting("default_pool_size", "1")
        .setting("max_prepared_statements", "0")
        .start()
        .await;
    let mut sock = raw_login(&p).await;
    // libpq's COPY through the extended protocol: Parse, Bind, Execute, Sync, then the
    // data, CopyDone and another Sync. The server reads the first Sync while it copies
    // in (it owes no ReadyForQuery for it); a bad row fails the COPY.
    let mut start = message(b'P', b"\0copy copied from stdin\0\0\0");
    start.extend(message(b'B', b"\0\0\0\0\0\0\0\0"));
    start.extend(message(b'E', b"\0\0\0\0\0"));
    start.extend(message(b'S', b""));
    sock.write_all(&start).await.unwrap();
    read_until(&mut sock, b'G').await;
    let mut rest = message(b'd', b"bad\n");
    rest.extend(message(b'c', b""));
    rest.extend(message(b'S', b""));
    sock.write_all(&rest).await.unwrap();
    let seen = read_until(&mut sock, b'Z').await;
    assert!(seen.contains(&b'E'), "the bad row fails the COPY: {seen:?}");
    // The client stays, idle: its server goes back to the pool for the next client.
    let c = p.connect("trustuser", "testdb").await;
    let next = tokio::time::timeout(Duration::from_secs(30), c.query_one("select 5", &[])).await;
    let row = next
        .expect("the pool's one server was kept by the idle client")
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), 5);
    drop(sock);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_state_of_a_vanished_client_does_not_reach_the_next_one() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "session")
        .setting("default_pool_size", "1")
        .start()
        .await;
    let (c, task) = connect_abortable(&p.dsn("md5user", "testdb")).await;
    c.simple_query(
        "set statement_timeout = 12345; create temp table leftover (v int); \
         prepare leftover_stmt as select 1; begin; select 1",
    )
    .await
    .unwrap();
    task.abort();
    // The pool's only server, once cleaned, serves the next client.
    let next = p.connect("md5user", "testdb").await;
    assert_eq!(
        scalar(&next, "show statement_timeout").await.as_deref(),
        Ok("0")
    );
    assert_eq!(
        scalar(
            &next,
            "select count(*) from pg_class where relname = 'leftover' and relpersistence = 't'"
        )
        .await
        .as_deref(),
        Ok("0"),
        "temp table survived"
    );
    assert_eq!(
        scalar(&next, "select count(*) from pg_prepared_statements")
            .await
            .as_deref(),
        Ok("0"),
        "prepared statement survived"
    );
    assert_eq!(
        scalar(&next, "select now() = statement_timestamp()")
            .await
            .as_deref(),
        Ok("t"),
        "still in a transaction"
    );
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_vanishing_while_waiting_for_a_server_do_not_stall_the_pool() {
    use tokio::io::AsyncWriteExt;
    let pg = TempPostgres::start();
    let p = trust_pooler(&pg).await;
    let obs = Observer::new(&pg).await;
    let holder = p.connect("trustuser", "testdb").await;
    holder.simple_query("begin; select 1").await.unwrap();
    // 20 clients send a query, which queues for the only server, and vanish.
    for _ in 0..20 {
        let mut sock = raw_login(&p).await;
        sock.write_all(&message(b'Q', b"select pg_sleep(0.2)\0"))
            .await
            .unwrap();
        sock.flush().await.unwrap();
        drop(sock);
    }
    holder.simple_query("commit").await.unwrap();
    let started = Instant::now();
    let next = p.connect("trustuser", "testdb").await;
    let row = tokio::time::timeout(Duration::from_secs(3), next.query_one("select 3", &[]))
        .await
        .expect("the pool stalled on clients that had left")
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), 3);
    eprintln!("served after {:?}", started.elapsed());
    // Generous: cancelling a 300,000-row query takes a while on a loaded machine.
    let idle = eventually(Duration::from_secs(10), || async {
        obs.busy("trustuser").await == 0
    })
    .await;
    assert!(idle, "a backend is still busy");
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_vanishing_mid_result_stream_does_not_poison_the_pool() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let pg = TempPostgres::start();
    let p = trust_pooler(&pg).await;
    let obs = Observer::new(&pg).await;
    for round in 0..5 {
        let mut sock = raw_login(&p).await;
        // Rows whose bytes look like message headers: a column ending in 'Z' followed by a
        // 5-byte column reads as ReadyForQuery to a parser that lost its place.
        sock.write_all(&message(
            b'Q',
            b"select g, 'tailZ', 'IIIII', repeat('y', 300) from generate_series(1, 300000) g\0",
        ))
        .await
        .unwrap();
        // Read part of the result (a different amount each round), then vanish mid-message.
        let mut got = 0;
        let mut buf = vec![0u8; 7919 * (round + 1)];
        while got < 100_000 * (round + 1) {
            let n = sock.read(&mut buf).await.unwrap();
            assert!(n > 0, "the pooler closed the stream");
            got += n;
        }
        drop(sock);
        let c = p.connect("trustuser", "testdb").await;
        let row = tokio::time::timeout(
            Duration::from_secs(10),
            c.query_one("select 'clean'::text", &[]),
        )
        .await
        .expect("the next client was not served")
        .unwrap_or_else(|e| panic!("round {round}: {e:?}"));
        assert_eq!(row.get::<_, String>(0), "clean", "round {round}");
        assert_eq!(
            scalar(&c, "select now() = statement_timestamp()")
                .await
                .as_deref(),
            Ok("t"),
            "round {round}: inside a transaction"
        );
    }
    // Generous: cancelling a 300,000-row query takes a while on a loaded machine.
    let idle = eventually(Duration::from_secs(10), || async {
        obs.busy("trustuser").await == 0
    })
    .await;
    assert!(idle, "a backend is still busy");
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_terminated_while_idle_is_not_handed_out() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "1")
        .start()
        .await;
    let obs = Observer::new(&pg).await;
    let c = p.connect("md5user", "testdb").await;
    c.simple_query("select 1").await.unwrap();
    assert_eq!(obs.terminate("md5user").await, 1);
    assert!(
        eventually(Duration::from_secs(5), || async {
            obs.backends("md5user").await == 0
        })
        .await,
        "the backend did not go away"
    );
    // The very next query gets a fresh server, not the dead one.
    let row = c.query_one("select 9", &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 9);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_transaction_timeout_rolls_the_server_back() {
    let pg = TempPostgres::start();
    rows_table(&pg, 1).await;
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "1")
        .setting("idle_transaction_timeout", "1")
        .start()
        .await;
    let monitor = pg.connect("postgres", "testdb").await;
    let obs = Observer::new(&pg).await;
    let c = p.connect("md5user", "testdb").await;
    c.simple_query("begin; select * from locked where id = 1 for update")
        .await
        .unwrap();
    let started = Instant::now();
    let released = eventually(Duration::from_secs(5), || async {
        obs.count(
            "usename = 'md5user' and state like 'idle in transaction%'",
            &[],
        )
        .await
            == 0
    })
    .await;
    assert!(released, "still idle in transaction 5 s later");
    eprintln!("rolled back after {:?}", started.elapsed());
    assert!(
        c.simple_query("select 1").await.is_err(),
        "the timed-out client still works"
    );
    monitor.simple_query("begin").await.unwrap();
    monitor
        .simple_query("select * from locked where id = 1 for update nowait")
        .await
        .expect("the row is still locked");
    monitor.simple_query("rollback").await.unwrap();
    let next = p.connect("md5user", "testdb").await;
    assert_eq!(
        scalar(&next, "select now() = statement_timestamp()")
            .await
            .as_deref(),
        Ok("t")
    );
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_timeout_ends_the_query_and_cleans_the_server() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "1")
        .setting("query_timeout", "1")
        .start()
        .await;
    let obs = Observer::new(&pg).await;
    let c = p.connect("md5user", "testdb").await;
    let started = Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(5),
        c.simple_query("select pg_sleep(10)"),
    )
    .await
    .expect("query_timeout did not end the query within 5 s");
    let err = r.expect_err("a 10 s query outlived query_timeout = 1");
    assert_query_timeout(&err);
    eprintln!("query_timeout after {:?}", started.elapsed());
    assert!(
        eventually(Duration::from_secs(2), || async {
            obs.busy("md5user").await == 0
        })
        .await,
        "the query still runs on the server"
    );
    let next = p.connect("md5user", "testdb").await;
    let row = next.query_one("select 11", &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 11);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_timeout_applies_to_later_queries_of_a_session() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "session")
        .setting("default_pool_size", "1")
        .setting("query_timeout", "1")
        .start()
        .await;
    let c = p.connect("md5user", "testdb").await;
    // The session holds its server; this query arrives while the relay runs.
    c.simple_query("select 1").await.unwrap();
    let r = tokio::time::timeout(
        Duration::from_secs(5),
        c.simple_query("select pg_sleep(10)"),
    )
    .await
    .expect("query_timeout did not end the query within 5 s");
    let err = r.expect_err("a 10 s query outlived query_timeout = 1");
    assert_query_timeout(&err);
    let next = p.connect("md5user", "testdb").await;
    let row = next.query_one("select 12", &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 12);
    p.shutdown().await;
}
