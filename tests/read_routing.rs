//! Reads that scale out and are never stale: a primary and two streaming standbys behind
//! one `host=p,s1,s2 … read_routing=on` entry, pgcarpool in transaction mode. Reads go to
//! the standbys (counted by the standbys' own statistics), writes to the primary; a read
//! a standby refuses (25006, a writing function) runs again on the primary unseen.
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
         GRANT ALL ON t, t_id_seq, r TO PUBLIC",
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
