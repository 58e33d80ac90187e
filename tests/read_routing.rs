//! Reads that scale out and are never stale: a primary and two streaming standbys behind
//! one `host=p,s1,s2 … read_routing=on` entry, pgcarpool in transaction mode. Reads go to
//! the standbys (counted by the standbys' own statistics), writes to the primary; a read
//! a standby refuses (25006, a writing function) runs again on the primary unseen. An
//! application loop (write, then read it back and read a counter that only grows) sees
//! no stale read while a standby lags by seconds; the same loop reading through a
//! prefer-standby alias (no LSN tracking) does.
mod harness;

use std::time::Duration;

use harness::{TempPostgres, TestPooler, try_connect, wait_for};

/// Bound on one statement or connection of a test client.
const HUNG: Duration = Duration::from_secs(60);

struct Cluster {
    primary: TempPostgres,
    standbys: [TempPostgres; 2],
}

impl Cluster {
    fn all(&self) -> [&TempPostgres; 3] {
        [&self.primary, &self.standbys[0], &self.standbys[1]]
    }
}

/// A primary with tables `t` (written) and `r` (only read: its scans are counted), a
/// function that writes, and two streaming standbys of it.
fn cluster() -> Cluster {
    let primary = TempPostgres::start();
    primary.psql_in(
        "testdb",
        "CREATE TABLE t (id bigserial PRIMARY KEY, v int); \
         CREATE TABLE r (v int); INSERT INTO r VALUES (1); \
         CREATE FUNCTION bump() RETURNS bigint LANGUAGE sql \
         AS $$ INSERT INTO t (v) VALUES (-1) RETURNING id $$; \
         CREATE TABLE counter (n bigint); INSERT INTO counter VALUES (0); \
         GRANT ALL ON t, t_id_seq, r, counter TO PUBLIC",
    );
    let standbys = [primary.start_standby(), primary.start_standby()];
    Cluster { primary, standbys }
}

fn entry(c: &Cluster, options: &str) -> String {
    let ports: Vec<String> = c.all().iter().map(|p| p.port().to_string()).collect();
    format!(
        "host=127.0.0.1,127.0.0.1,127.0.0.1 port={} dbname=testdb {options}",
        ports.join(",")
    )
}

async fn pooler(c: &Cluster) -> TestPooler {
    harness::transaction_pooler(&c.primary)
        .database("app", &entry(c, "read_routing=on"))
        .database("ro", &entry(c, "target_session_attrs=prefer-standby"))
        .setting("default_pool_size", "10")
        .setting("server_role_check_interval", "0.2")
        .setting("query_wait_timeout", "60")
        .start()
        .await
}

async fn connect(dsn: &str) -> tokio_postgres::Client {
    tokio::time::timeout(HUNG, try_connect(dsn))
        .await
        .expect("connect hung")
        .unwrap_or_else(|e| panic!("connect {dsn}: {e}"))
}

/// The port of the PostgreSQL server a read ran on (simple protocol: the function is
/// not one pgcarpool knows, which an extended-protocol read may not call).
async fn port_of(c: &tokio_postgres::Client) -> u16 {
    let rows = c.simple_query("SELECT inet_server_port()").await.unwrap();
    match &rows[1] {
        tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).unwrap().parse().unwrap(),
        _ => panic!("no row"),
    }
}

/// A column of SHOW HOSTS for alias `app` and the host on `port`.
async fn host_value(admin: &tokio_postgres::Client, port: u16, col: &str) -> u64 {
    let host = format!("127.0.0.1:{port}");
    harness::console_value(admin, "HOSTS", &[("database", "app"), ("host", &host)], col)
        .await
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("SHOW HOSTS has {col} for {host}"))
}

/// How many times table `r` was scanned on `pg`, by its own statistics.
fn scans(pg: &TempPostgres) -> u64 {
    pg.psql_in(
        "testdb",
        "SELECT coalesce(seq_scan, 0) FROM pg_stat_user_tables WHERE relname = 'r'",
    )
    .parse()
    .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_run_on_the_standbys_and_writes_on_the_primary() {
    let c = cluster();
    let pooler = pooler(&c).await;
    let standby_ports = [c.standbys[0].port(), c.standbys[1].port()];
    let app = connect(&pooler.dsn("postgres", "app")).await;
    wait_for("the standbys known", HUNG, || async {
        standby_ports.contains(&port_of(&app).await)
    })
    .await;
    let before: Vec<u64> = c.all().iter().map(|pg| scans(pg)).collect();
    // Reads in both protocols, from several clients.
    const CLIENTS: usize = 4;
    const READS: usize = 50;
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let dsn = pooler.dsn("postgres", "app");
        tasks.push(tokio::spawn(async move {
            let c = connect(&dsn).await;
            for k in 0..READS {
                if k % 2 == 0 {
                    c.query_one("SELECT count(*) FROM r", &[]).await.unwrap();
                } else {
                    c.simple_query("SELECT count(*) FROM r").await.unwrap();
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let total = (CLIENTS * READS) as u64;
    let mut grown = Vec::new();
    wait_for("every scan counted by its host", HUNG, || {
        grown = c
            .all()
            .iter()
            .zip(&before)
            .map(|(pg, b)| scans(pg) - b)
            .collect();
        let sum: u64 = grown.iter().sum();
        async move { sum >= total }
    })
    .await;
    let on_standbys = grown[1] + grown[2];
    assert!(
        on_standbys * 100 >= total * 80,
        "reads on the standbys: {on_standbys} of {total} (primary, s1, s2: {grown:?})"
    );
    // pgcarpool counts them too (SHOW HOSTS: reads per host).
    let admin = pooler.connect("postgres", "pgbouncer").await;
    let mut counted = 0;
    for port in standby_ports {
        counted += host_value(&admin, port, "reads").await;
    }
    assert!(counted >= on_standbys, "SHOW HOSTS reads: {counted}");
    // Writes on the primary, in both protocols, whatever came before.
    app.execute("INSERT INTO t (v) VALUES (1)", &[])
        .await
        .unwrap();
    app.simple_query("INSERT INTO t (v) VALUES (2)")
        .await
        .unwrap();
    let row = app
        .query_one(
            "INSERT INTO t (v) VALUES (3) RETURNING inet_server_port()",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i32>(0) as u16, c.primary.port());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writing_function_in_a_read_runs_on_the_primary_unseen() {
    let c = cluster();
    let pooler = pooler(&c).await;
    let standby_ports = [c.standbys[0].port(), c.standbys[1].port()];
    let app = connect(&pooler.dsn("postgres", "app")).await;
    wait_for("the standbys known", HUNG, || async {
        standby_ports.contains(&port_of(&app).await)
    })
    .await;
    // Simple protocol: judged a read (an unknown function), refused by the standby,
    // run again on the primary.
    for _ in 0..5 {
        let rows = app.simple_query("SELECT bump()").await.unwrap();
        assert!(matches!(
            &rows[1],
            tokio_postgres::SimpleQueryMessage::Row(r) if r.get(0).is_some()
        ));
    }
    // Extended protocol: an unknown function is no read; the primary runs it.
    let id: i64 = app.query_one("SELECT bump()", &[]).await.unwrap().get(0);
    assert!(id > 0);
    let admin = pooler.connect("postgres", "pgbouncer").await;
    // The first went to a standby (the client had seen nothing newer); after its write
    // the client's reads go where it is replayed.
    let replays = host_value(&admin, c.primary.port(), "read_replays").await;
    assert!(replays >= 1, "SHOW HOSTS read_replays: {replays}");
    assert_eq!(
        c.primary
            .psql_in("testdb", "SELECT count(*) FROM t WHERE v = -1"),
        "6"
    );
    // A read-only block stays one: its write is refused by PostgreSQL's own rule.
    let e = app
        .simple_query("BEGIN READ ONLY; SELECT 1; INSERT INTO t (v) VALUES (9)")
        .await
        .unwrap_err();
    assert_eq!(harness::sqlstate(&e), Some("25006"));
    app.simple_query("ROLLBACK").await.unwrap();
    // A write pipelined behind a read on a standby waits for the read, then goes to
    // the primary.
    let slow = app.simple_query("SELECT pg_sleep(0.3), count(*) FROM r");
    let write = app.simple_query("INSERT INTO t (v) VALUES (7)");
    let (a, b) = tokio::join!(slow, write);
    a.unwrap();
    b.unwrap();
}

/// Clients of the application loop.
const APP_CLIENTS: usize = 16;
/// Rounds of each.
const ROUNDS: usize = 25;

/// The application loop of one client: write a row and bump the counter (committed, on
/// `write`), then in the next transactions on `read` read the row back and the counter.
/// Returns the stale reads: the row missing, or the counter below what the client wrote
/// or read before.
async fn app_loop(write: String, read: String) -> usize {
    let w = connect(&write).await;
    let r = if read == write {
        None
    } else {
        Some(connect(&read).await)
    };
    let rd = r.as_ref().unwrap_or(&w);
    let mut stale = 0;
    let mut last = 0i64;
    for k in 0..ROUNDS {
        let id: i64 = w
            .query_one("INSERT INTO t (v) VALUES ($1) RETURNING id", &[&(k as i32)])
            .await
            .unwrap()
            .get(0);
        let n: i64 = w
            .query_one("UPDATE counter SET n = n + 1 RETURNING n", &[])
            .await
            .unwrap()
            .get(0);
        last = last.max(n);
        let found: i64 = rd
            .query_one("SELECT count(*) FROM t WHERE id = $1", &[&id])
            .await
            .unwrap()
            .get(0);
        if found != 1 {
            stale += 1;
        }
        let now: i64 = rd
            .query_one("SELECT n FROM counter", &[])
            .await
            .unwrap()
            .get(0);
        if now < last {
            stale += 1;
        }
        last = last.max(now);
    }
    stale
}

/// The loop with `APP_CLIENTS` clients: the stale reads of them all.
async fn app_loops(write: &str, read: &str) -> usize {
    let tasks: Vec<_> = (0..APP_CLIENTS)
        .map(|_| tokio::spawn(app_loop(write.to_string(), read.to_string())))
        .collect();
    let mut stale = 0;
    for t in tasks {
        stale += t.await.unwrap();
    }
    stale
}

/// Standby 0 applies WAL `delay` late (`recovery_min_apply_delay`): a row written on the
/// primary is on standby 1 and not yet on standby 0.
async fn make_lag(c: &Cluster, delay: &str) {
    let s0 = &c.standbys[0];
    s0.psql(&format!(
        "ALTER SYSTEM SET recovery_min_apply_delay = '{delay}'"
    ));
    s0.psql("SELECT pg_reload_conf()");
    let probe = |pg: &TempPostgres| pg.psql_in("testdb", "SELECT count(*) FROM t WHERE v = -7");
    wait_for("standby 0 lags", HUNG, || {
        c.primary.psql_in("testdb", "INSERT INTO t (v) VALUES (-7)");
        let behind = probe(&c.standbys[1]) != probe(&c.standbys[0]);
        let caught = wait_caught(&c.standbys[1], &c.primary);
        async move { caught && behind }
    })
    .await;
}

/// Has `standby` replayed all `primary` has (as rows of `t`)? Waits a bounded while.
fn wait_caught(standby: &TempPostgres, primary: &TempPostgres) -> bool {
    let want = primary.psql_in("testdb", "SELECT count(*) FROM t");
    let deadline = std::time::Instant::now() + HUNG;
    while std::time::Instant::now() < deadline {
        if standby.psql_in("testdb", "SELECT count(*) FROM t") == want {
            return true;
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_stale_read_while_a_standby_lags_and_the_standby_alias_has_some() {
    let c = cluster();
    let pooler = pooler(&c).await;
    let standby_ports = [c.standbys[0].port(), c.standbys[1].port()];
    let app = pooler.dsn("postgres", "app");
    let ro = pooler.dsn("postgres", "ro");
    let probe = connect(&app).await;
    wait_for("the standbys known", HUNG, || async {
        standby_ports.contains(&port_of(&probe).await)
    })
    .await;
    make_lag(&c, "3s").await;
    let baseline = app_loops(&app, &ro).await;
    let routed = app_loops(&app, &app).await;
    println!("stale reads: {routed} through read_routing, {baseline} through prefer-standby");
    assert!(
        baseline > 0,
        "the loop through the standby alias reads stale data"
    );
    assert_eq!(routed, 0, "no stale read through read_routing");
}

/// What read-your-writes costs a write transaction: one client, one INSERT per
/// transaction, through the read routing alias with and without `read_your_writes` and
/// through a plain read-write alias. A measurement, not a check
/// (`cargo test --test read_routing -- --ignored --nocapture cost`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a check"]
async fn cost_of_lsn_tracking_per_write_transaction() {
    let c = cluster();
    let pooler = harness::transaction_pooler(&c.primary)
        .database("app", &entry(&c, "read_routing=on"))
        .database("loose", &entry(&c, "read_routing=on read_your_writes=off"))
        .database("plain", &entry(&c, "target_session_attrs=read-write"))
        .setting("default_pool_size", "4")
        .start()
        .await;
    const N: usize = 3000;
    for round in 0..2 {
        for db in ["plain", "loose", "app"] {
            let cl = connect(&pooler.dsn("postgres", db)).await;
            for _ in 0..200 {
                cl.simple_query("INSERT INTO t (v) VALUES (0)")
                    .await
                    .unwrap();
            }
            let t = std::time::Instant::now();
            for _ in 0..N {
                cl.simple_query("INSERT INTO t (v) VALUES (0)")
                    .await
                    .unwrap();
            }
            let us = t.elapsed().as_micros() as usize / N;
            println!("round {round} {db}: {us} us per write transaction");
        }
    }
}
