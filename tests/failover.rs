//! Sessions that survive a switchover (issue 22): a primary and a streaming standby
//! (`pg_basebackup -R`) behind one `host=a,b port=p,q target_session_attrs=read-write`
//! entry, pgcarpool in transaction mode (pool 10). Planned (fast stop, then promote) and
//! unplanned (`kill -9` of the postmaster, then promote) switchovers under a write load:
//! only transactions in flight may fail, the first write lands on the new primary soon
//! after the promote, and 50 idle clients holding prepared statements and settings go on
//! on the new primary without an error. A former primary started again as a primary gets
//! no client transaction (split brain), and a prefer-standby alias reads from the standby
//! unless it lags past `max_standby_lag`. Both protocols: each idle client uses a named
//! prepared statement (extended) and simple queries.
mod harness;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use harness::{TempPostgres, TestPooler, console_value, try_connect, wait_for};

/// Pool size of the write alias: at most this many transactions are in flight.
const POOL: usize = 10;
/// Writers of the load (more than the pool: some wait in line).
const WRITERS: usize = 20;
/// Idle clients holding a session.
const IDLE: usize = 50;
/// A generous bound on the first write served by the new primary (the goal is 1 s; it is
/// measured and printed, not asserted tightly: the machine is shared).
const FIRST_WRITE_LIMIT: Duration = Duration::from_secs(20);
/// Bound on one statement or connection of a test client.
const HUNG: Duration = Duration::from_secs(60);

struct Cluster {
    primary: TempPostgres,
    standby: TempPostgres,
}

/// A primary with table `t`, and a streaming standby of it.
fn cluster() -> Cluster {
    let primary = TempPostgres::start();
    primary.psql_in(
        "testdb",
        "CREATE TABLE t (id bigserial PRIMARY KEY, v int); GRANT ALL ON t, t_id_seq TO PUBLIC",
    );
    // A COMMIT that takes its time: a deferred trigger sleeps in it.
    primary.psql_in(
        "testdb",
        "CREATE TABLE d (v int); GRANT ALL ON d TO PUBLIC; \
         CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql \
         AS $$ BEGIN PERFORM pg_sleep(600); RETURN NULL; END $$; \
         CREATE CONSTRAINT TRIGGER slow AFTER INSERT ON d DEFERRABLE INITIALLY DEFERRED \
         FOR EACH ROW EXECUTE FUNCTION slow()",
    );
    let standby = primary.start_standby();
    Cluster { primary, standby }
}

fn entry(c: &Cluster, attrs: &str) -> String {
    format!(
        "host=127.0.0.1,127.0.0.1 port={},{} dbname=testdb target_session_attrs={attrs}",
        c.primary.port(),
        c.standby.port()
    )
}

async fn pooler(c: &Cluster) -> TestPooler {
    builder(c).start().await
}

fn builder(c: &Cluster) -> harness::TestPoolerBuilder {
    harness::transaction_pooler(&c.primary)
        .database("app", &entry(c, "read-write"))
        .database("ro", &entry(c, "prefer-standby"))
        .database(
            "sess",
            &format!("{} pool_mode=session", entry(c, "read-write")),
        )
        .setting("default_pool_size", &POOL.to_string())
        .setting("server_role_check_interval", "0.2")
        .setting("max_standby_lag", "65536")
        // Shorter than the outage: clients wait for a new primary anyway (target_session_attrs),
        // up to query_wait_timeout.
        .setting("server_login_retry", "1")
        .setting("query_wait_timeout", "60")
}

async fn connect(dsn: &str) -> tokio_postgres::Client {
    tokio::time::timeout(HUNG, try_connect(dsn))
        .await
        .expect("connect hung")
        .unwrap_or_else(|e| panic!("connect {dsn}: {e}"))
}

/// The port of the PostgreSQL server a query ran on.
async fn port_of(c: &tokio_postgres::Client) -> Result<u16, tokio_postgres::Error> {
    let row = c.query_one("SELECT inet_server_port()", &[]).await?;
    Ok(row.get::<_, i32>(0) as u16)
}

/// What the write load saw.
#[derive(Default)]
struct Load {
    failures: Vec<String>,
    /// Each committed write: when, and on which server port.
    commits: Vec<(Instant, u16)>,
}

/// A writer until `stop`: one INSERT per transaction (a prepared statement), reporting
/// the port it committed on; a closed connection is opened again.
async fn writer(dsn: String, stop: Arc<AtomicBool>, hang_is_failure: bool) -> Load {
    let mut load = Load::default();
    let mut client: Option<tokio_postgres::Client> = None;
    while !stop.load(Ordering::SeqCst) {
        let c = match client.take() {
            Some(c) if !c.is_closed() => c,
            _ => match tokio::time::timeout(HUNG, try_connect(&dsn)).await {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => {
                    load.failures.push(format!("connect: {e}"));
                    continue;
                }
                Err(_) => panic!("a writer's connect hung"),
            },
        };
        let limit = if hang_is_failure { HANG_FAILS } else { HUNG };
        let r = tokio::time::timeout(
            limit,
            c.query_one(
                "INSERT INTO t (v) VALUES (1) RETURNING inet_server_port()",
                &[],
            ),
        )
        .await;
        let Ok(r) = r else {
            assert!(hang_is_failure, "a writer's transaction hung");
            load.failures.push(format!("no answer within {limit:?}"));
            continue;
        };
        match r {
            Ok(row) => load
                .commits
                .push((Instant::now(), row.get::<_, i32>(0) as u16)),
            Err(e) => {
                load.failures.push(match e.as_db_error() {
                    Some(db) => format!("{} {}", db.code().code(), db.message()),
                    None => format!("{e}"),
                });
                // As a driver's pool does (HikariCP, psycopg_pool): a connection-level
                // error (57P01, class 08, closed) ends the connection; a new one is opened
                // rather than a query sent on one that is going.
                let code = e.as_db_error().map(|d| d.code().code().to_string());
                if e.is_closed()
                    || matches!(code.as_deref(), Some(c) if c == "57P01" || c.starts_with("08"))
                {
                    continue;
                }
            }
        }
        client = Some(c);
    }
    load
}

struct Running {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Load>>,
}

fn start_writers(dsn: &str, n: usize) -> Running {
    start_writers_with(dsn, n, false)
}

/// `hang_is_failure`: a transaction unanswered for HANG_FAILS is a failure (the pooler
/// compared), not a test failure.
fn start_writers_with(dsn: &str, n: usize, hang_is_failure: bool) -> Running {
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = (0..n)
        .map(|_| tokio::spawn(writer(dsn.to_string(), stop.clone(), hang_is_failure)))
        .collect();
    Running { stop, tasks }
}

impl Running {
    async fn finish(self) -> Load {
        self.stop.store(true, Ordering::SeqCst);
        let mut all = Load::default();
        for t in self.tasks {
            let l = t.await.expect("writer task");
            all.failures.extend(l.failures);
            all.commits.extend(l.commits);
        }
        all
    }
}

/// An idle client holding a setting and a named prepared statement.
struct Idle {
    client: tokio_postgres::Client,
    stmt: tokio_postgres::Statement,
    name: String,
}

async fn idle_clients(dsn: &str, primary: u16) -> Vec<Idle> {
    let mut v = Vec::new();
    for i in 0..IDLE {
        let client = connect(dsn).await;
        let name = format!("idle{i}");
        client
            .simple_query(&format!("SET application_name = '{name}'"))
            .await
            .expect("SET");
        let stmt = client
            .prepare("SELECT inet_server_port(), current_setting('application_name'), $1::int")
            .await
            .expect("prepare");
        let row = client.query_one(&stmt, &[&(i as i32)]).await.expect("run");
        assert_eq!(
            row.get::<_, i32>(0) as u16,
            primary,
            "before: on the primary"
        );
        v.push(Idle { client, stmt, name });
    }
    v
}

/// Every idle client's next statements run on `new_primary` with its session intact:
/// its prepared statement (extended protocol), its setting (simple protocol).
async fn idle_clients_go_on(idle: &[Idle], new_primary: u16) {
    for (i, c) in idle.iter().enumerate() {
        let row = tokio::time::timeout(HUNG, c.client.query_one(&c.stmt, &[&(i as i32)]))
            .await
            .expect("hung")
            .unwrap_or_else(|e| panic!("idle client {i} after the switchover: {e}"));
        assert_eq!(row.get::<_, i32>(0) as u16, new_primary, "client {i}");
        assert_eq!(row.get::<_, String>(1), c.name, "client {i}'s setting");
        assert_eq!(row.get::<_, i32>(2), i as i32);
        let msgs = c
            .client
            .simple_query("SHOW application_name")
            .await
            .unwrap_or_else(|e| panic!("idle client {i}, simple query: {e}"));
        let shown = msgs.iter().find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        });
        assert_eq!(shown.as_deref(), Some(c.name.as_str()), "client {i}");
    }
}

/// A client inside a transaction when the old primary goes, with a prepared statement:
/// idle in its transaction (its INSERT sent by a simple query, or by a prepared statement)
/// or waiting for a statement (`pg_sleep`) then.
struct InTransaction {
    client: Arc<tokio_postgres::Client>,
    /// `SELECT inet_server_port(), $1::int`.
    stmt: tokio_postgres::Statement,
    /// Its next statement goes by the extended protocol (else by a simple query).
    extended: bool,
    /// Its statement in flight at the switch is a COMMIT (its outcome is unknown).
    committing: bool,
    /// The statement in flight at the switch.
    sleeping:
        Option<tokio::task::JoinHandle<Result<Vec<tokio_postgres::Row>, tokio_postgres::Error>>>,
}

/// The SQLSTATE of an error (None: not a server's).
fn code_of(e: &tokio_postgres::Error) -> Option<String> {
    e.as_db_error().map(|d| d.code().code().to_string())
}

/// Four clients in a transaction on the primary: idle in it after a simple-query INSERT,
/// idle in it after a prepared INSERT, one whose `pg_sleep` runs when the primary goes,
/// and one whose COMMIT runs then (a deferred trigger sleeps in it).
async fn in_transaction(dsn: &str, primary: &TempPostgres) -> Vec<InTransaction> {
    let mut v = Vec::new();
    for kind in 0..4 {
        let client = Arc::new(connect(dsn).await);
        let stmt = client
            .prepare("SELECT inet_server_port(), $1::int")
            .await
            .expect("prepare");
        client.batch_execute("BEGIN").await.expect("BEGIN");
        let insert = "INSERT INTO t (v) VALUES (2) RETURNING inet_server_port()";
        let mut sleeping = None;
        match kind {
            0 => {
                client
                    .simple_query(insert)
                    .await
                    .expect("a simple-query INSERT");
            }
            1 => {
                let row = client
                    .query_one(insert, &[])
                    .await
                    .expect("a prepared INSERT");
                assert_eq!(row.get::<_, i32>(0) as u16, primary.port());
            }
            2 => {
                let c = client.clone();
                sleeping = Some(tokio::spawn(async move {
                    c.query("SELECT pg_sleep(600)", &[]).await
                }));
            }
            _ => {
                client
                    .simple_query("INSERT INTO d VALUES (1)")
                    .await
                    .expect("an INSERT whose COMMIT sleeps");
                let c = client.clone();
                // Extended: the COMMIT is a prepared statement the virtual session knows.
                sleeping = Some(tokio::spawn(async move { c.query("COMMIT", &[]).await }));
            }
        }
        v.push(InTransaction {
            client,
            stmt,
            extended: kind != 0,
            committing: kind == 3,
            sleeping,
        });
    }
    wait_for(
        "the pg_sleep and the COMMIT running on the primary",
        HUNG,
        || async {
            primary.psql(
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' \
             AND query IN ('SELECT pg_sleep(600)', 'COMMIT')",
            ) == "2"
        },
    )
    .await;
    v
}

/// Each client caught in a transaction got one error and kept its connection: 40001
/// (rolled back, may be retried), then a failed block (a statement gets 25P02, ROLLBACK
/// succeeds, by the extended protocol for the prepared ones); 08007 for the COMMIT under
/// way (it may have committed; the transaction is over). Then its next transaction and its
/// prepared statement run on the new primary.
async fn in_transaction_go_on(clients: Vec<InTransaction>, new: u16) {
    for (i, t) in clients.into_iter().enumerate() {
        let c = t.client.clone();
        let first = match t.sleeping {
            Some(job) => tokio::time::timeout(HUNG, job)
                .await
                .expect("hung")
                .expect("task")
                .map(|_| ()),
            None if t.extended => c.query_one(&t.stmt, &[&1i32]).await.map(|_| ()),
            None => c.simple_query("SELECT 1").await.map(|_| ()),
        };
        let e = first.expect_err("the transaction went with the old primary");
        let want = if t.committing { "08007" } else { "40001" };
        assert_eq!(code_of(&e).as_deref(), Some(want), "client {i}: {e:?}");
        assert!(!c.is_closed(), "client {i} keeps its connection");
        if !t.committing {
            in_failed_block(&c, &t.stmt, t.extended, i).await;
        }
        c.batch_execute("BEGIN")
            .await
            .expect("the next transaction");
        let row = c
            .query_one(&t.stmt, &[&(i as i32)])
            .await
            .unwrap_or_else(|e| panic!("client {i}: its prepared statement: {e:?}"));
        assert_eq!(row.get::<_, i32>(0) as u16, new, "client {i}");
        assert_eq!(row.get::<_, i32>(1), i as i32);
        c.batch_execute("COMMIT").await.expect("COMMIT");
    }
}

/// A client in the failed block pgcarpool plays: a statement gets 25P02, ROLLBACK ends it.
async fn in_failed_block(
    c: &tokio_postgres::Client,
    stmt: &tokio_postgres::Statement,
    extended: bool,
    i: usize,
) {
    let again = if extended {
        c.query_one(stmt, &[&2i32]).await.map(|_| ())
    } else {
        c.simple_query("INSERT INTO t (v) VALUES (3)")
            .await
            .map(|_| ())
    };
    let e = again.expect_err("a failed block");
    assert_eq!(code_of(&e).as_deref(), Some("25P02"), "client {i}: {e:?}");
    if extended {
        c.execute("ROLLBACK", &[]).await
    } else {
        c.simple_query("ROLLBACK").await.map(|_| 0)
    }
    .unwrap_or_else(|e| panic!("client {i}: ROLLBACK: {e:?}"));
}

/// The switchover under load: `fail` takes the old primary away, then the standby is
/// promoted. Checks the load and the idle clients; returns the pooler.
/// How long no primary is up (longer than server_login_retry: clients must wait for the
/// promote all the same). A deliberate outage, not a synchronisation.
const NO_PRIMARY_FOR: Duration = Duration::from_millis(1500);

async fn switchover(c: &Cluster, fail: impl FnOnce(&TempPostgres)) -> (TestPooler, u16) {
    let (pooler, metrics_port) = builder(c).start_with_free_port("prometheus_port").await;
    let dsn = pooler.dsn("postgres", "app");
    let (old, new) = (c.primary.port(), c.standby.port());
    let idle = idle_clients(&dsn, old).await;
    let session = connect(&pooler.dsn("postgres", "sess")).await;
    assert_eq!(port_of(&session).await.unwrap(), old);
    let pinned = connect(&dsn).await;
    pinned
        .simple_query("CREATE TEMP TABLE mine (x int)")
        .await
        .expect("a temp table pins the client");
    assert_eq!(port_of(&pinned).await.unwrap(), old);
    let caught = in_transaction(&dsn, &c.primary).await;
    let load = start_writers(&dsn, WRITERS);
    wait_for("writes on the primary", HUNG, || async {
        let probe = connect(&dsn).await;
        port_of(&probe).await.ok() == Some(old)
    })
    .await;
    fail(&c.primary);
    tokio::time::sleep(NO_PRIMARY_FOR).await;
    c.standby.promote();
    let promoted = Instant::now();
    wait_for("a write on the new primary", FIRST_WRITE_LIMIT, || async {
        let Ok(Ok(probe)) = tokio::time::timeout(HUNG, try_connect(&dsn)).await else {
            return false;
        };
        port_of(&probe).await.ok() == Some(new)
    })
    .await;
    idle_clients_go_on(&idle, new).await;
    in_transaction_go_on(caught, new).await;
    held_servers_end_cleanly(&pooler, vec![(session, "sess"), (pinned, "app")], new).await;
    let load = load.finish().await;
    let first_new = load
        .commits
        .iter()
        .filter(|(_, p)| *p == new)
        .map(|(t, _)| *t)
        .min()
        .expect("writers committed on the new primary");
    eprintln!(
        "switchover: first write on the new primary {:?} after promote returned; {} commits, {} failed: {:?}",
        first_new.saturating_duration_since(promoted),
        load.commits.len(),
        load.failures.len(),
        load.failures
    );
    assert!(
        load.failures.len() <= POOL,
        "at most the transactions in flight (pool {POOL}) may fail:\n{}",
        load.failures.join("\n")
    );
    assert!(
        load.failures
            .iter()
            .all(|f| f.starts_with("40001 ") || f.starts_with("08007 ")),
        "a writer caught in its transaction keeps its connection, told 40001 (rolled back) \
         or 08007 (it may have committed):\n{}",
        load.failures.join("\n")
    );
    assert!(
        load.commits.iter().all(|(t, p)| *p == new || *t < promoted),
        "no write committed on the old primary after the promote"
    );
    (pooler, metrics_port)
}

/// A client that keeps its server (session mode, or pinned by a temp table in transaction
/// mode) loses it with the old primary: one error, then a new connection is served by
/// the new primary.
async fn held_servers_end_cleanly(
    pooler: &TestPooler,
    held: Vec<(tokio_postgres::Client, &str)>,
    new: u16,
) {
    for (client, db) in held {
        let e = tokio::time::timeout(HUNG, port_of(&client))
            .await
            .expect("hung")
            .expect_err("its server went with the old primary");
        let code = e.as_db_error().map(|d| d.code().code().to_string());
        assert!(
            e.is_closed() || matches!(code.as_deref(), Some("57P01" | "08006")),
            "{db}: a connection-level error: {e:?}"
        );
        let again = connect(&pooler.dsn("postgres", db)).await;
        assert_eq!(port_of(&again).await.expect("reconnected"), new, "{db}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_switchover_moves_idle_sessions_to_the_new_primary() {
    let c = cluster();
    let (pooler, metrics_port) = switchover(&c, |old| old.stop()).await;
    let admin = pooler.connect("postgres", "pgbouncer").await;
    let switchovers = console_value(&admin, "HOSTS", &[("database", "app")], "switchovers")
        .await
        .expect("SHOW HOSTS lists app");
    assert_eq!(switchovers, "1");
    let new = format!("127.0.0.1:{}", c.standby.port());
    let primary = console_value(
        &admin,
        "HOSTS",
        &[("database", "app"), ("host", &new)],
        "primary",
    )
    .await;
    assert_eq!(primary.as_deref(), Some("1"));
    // SHOW EVENTS (and the status page with it) tells the switchover.
    let old = format!("127.0.0.1:{}", c.primary.port());
    let moved = format!("primary moved from {old} to {new}");
    let event = console_value(
        &admin,
        "EVENTS",
        &[("database", "app"), ("event", "switchover")],
        "detail",
    )
    .await;
    assert_eq!(event.as_deref(), Some(moved.as_str()));
    let body = harness::metrics(metrics_port).await;
    assert!(
        body.contains("pgcarpool_switchovers_total{database=\"app\",user=\"postgres\"} 1"),
        "{body}"
    );
    assert!(
        body.contains(&format!(
            "pgcarpool_host_role{{database=\"app\",user=\"postgres\",host=\"{new}\",role=\"primary\"}} 1"
        )),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unplanned_failover_moves_idle_sessions_to_the_new_primary() {
    let c = cluster();
    switchover(&c, |old| old.kill_postmaster()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_former_primary_back_as_a_primary_gets_no_transaction() {
    let c = cluster();
    let (pooler, _) = switchover(&c, |old| old.stop()).await;
    let dsn = pooler.dsn("postgres", "app");
    let new = c.standby.port();
    let load = start_writers(&dsn, 4);
    let before = c.standby.psql_in("testdb", "SELECT count(*) FROM t");
    c.primary.start_again_as_primary();
    let old_rows = c.primary.psql_in("testdb", "SELECT count(*) FROM t");
    // New servers are opened now (RECONNECT closes the pool's), round-robin over the
    // list: each login must leave the former primary out.
    let admin = pooler.connect("postgres", "pgbouncer").await;
    admin
        .simple_query("RECONNECT app")
        .await
        .expect("RECONNECT");
    for _ in 0..20 {
        let probe = connect(&dsn).await;
        assert_eq!(port_of(&probe).await.expect("a new client"), new);
    }
    let old_addr = format!("127.0.0.1:{}", c.primary.port());
    wait_for("the former primary fenced", HUNG, || async {
        console_value(
            &admin,
            "HOSTS",
            &[("database", "app"), ("host", &old_addr)],
            "fenced",
        )
        .await
        .as_deref()
            == Some("1")
    })
    .await;
    admin
        .simple_query("RECONNECT app")
        .await
        .expect("RECONNECT");
    for _ in 0..20 {
        let probe = connect(&dsn).await;
        assert_eq!(port_of(&probe).await.expect("a new client"), new);
    }
    let load = load.finish().await;
    assert!(
        load.commits.iter().all(|(_, p)| *p == new),
        "a write reached the former primary"
    );
    assert!(load.failures.is_empty(), "{:?}", load.failures);
    assert_eq!(
        c.primary.psql_in("testdb", "SELECT count(*) FROM t"),
        old_rows,
        "nothing was written on the former primary"
    );
    assert_ne!(
        c.standby.psql_in("testdb", "SELECT count(*) FROM t"),
        before
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefer_standby_alias_reads_from_the_standby_unless_it_lags() {
    let c = cluster();
    let pooler = pooler(&c).await;
    let (primary, standby) = (c.primary.port(), c.standby.port());
    let ro = connect(&pooler.dsn("postgres", "ro")).await;
    let rw = connect(&pooler.dsn("postgres", "app")).await;
    assert_eq!(port_of(&ro).await.unwrap(), standby, "extended protocol");
    let simple = ro.simple_query("SELECT pg_is_in_recovery()").await.unwrap();
    assert!(
        matches!(&simple[1], tokio_postgres::SimpleQueryMessage::Row(r) if r.get(0) == Some("t"))
    );
    assert_eq!(
        port_of(&rw).await.unwrap(),
        primary,
        "writes on the primary"
    );
    // Replay paused, WAL written past the bound: the standby lags, reads go to the primary.
    c.standby.psql("SELECT pg_wal_replay_pause()");
    rw.simple_query("INSERT INTO t (v) SELECT g FROM generate_series(1, 20000) g")
        .await
        .unwrap();
    wait_for(
        "reads on the primary while the standby lags",
        HUNG,
        || async { port_of(&ro).await.ok() == Some(primary) },
    )
    .await;
    c.standby.psql("SELECT pg_wal_replay_resume()");
    wait_for("reads back on the standby", HUNG, || async {
        port_of(&ro).await.ok() == Some(standby)
    })
    .await;
    let simple = ro.simple_query("SELECT pg_is_in_recovery()").await.unwrap();
    assert!(
        matches!(&simple[1], tokio_postgres::SimpleQueryMessage::Row(r) if r.get(0) == Some("t")),
        "simple protocol: on the standby again"
    );
}

/// `max_standby_lag` as a time: with replay paused and one small write (far below any
/// byte bound), the standby's last replayed transaction ages past the bound and reads go
/// to the primary; replay resumed, they come back to the standby.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_time_bound_on_standby_lag_sends_reads_to_the_primary() {
    let c = cluster();
    let pooler = builder(&c).setting("max_standby_lag", "1s").start().await;
    let (primary, standby) = (c.primary.port(), c.standby.port());
    let ro = connect(&pooler.dsn("postgres", "ro")).await;
    let rw = connect(&pooler.dsn("postgres", "app")).await;
    assert_eq!(port_of(&ro).await.unwrap(), standby);
    // A transaction replayed: the one whose age is measured.
    rw.simple_query("INSERT INTO t (v) VALUES (1)")
        .await
        .unwrap();
    wait_for("the standby replayed it", HUNG, || async {
        c.standby.psql_in("testdb", "SELECT count(*) FROM t") == "1"
    })
    .await;
    c.standby.psql("SELECT pg_wal_replay_pause()");
    rw.simple_query("INSERT INTO t (v) VALUES (2)")
        .await
        .unwrap();
    wait_for(
        "reads on the primary while the standby's replay is paused",
        HUNG,
        || async { port_of(&ro).await.ok() == Some(primary) },
    )
    .await;
    let admin = pooler.connect("postgres", "pgbouncer").await;
    let addr = format!("127.0.0.1:{standby}");
    let at = |col: &'static str| {
        let (admin, addr) = (&admin, addr.clone());
        async move {
            console_value(admin, "HOSTS", &[("database", "ro"), ("host", &addr)], col)
                .await
                .and_then(|v| v.parse::<u64>().ok())
                .expect("SHOW HOSTS lists the standby")
        }
    };
    let (ms, bytes) = (at("lag_ms").await, at("lag_bytes").await);
    assert!(
        ms > 1000 && bytes < 65536,
        "left out for its time behind ({ms} ms), not its bytes ({bytes})"
    );
    c.standby.psql("SELECT pg_wal_replay_resume()");
    wait_for("reads back on the standby", HUNG, || async {
        port_of(&ro).await.ok() == Some(standby)
    })
    .await;
}

/// In the comparison: a transaction unanswered this long counts as failed.
const HANG_FAILS: Duration = Duration::from_secs(3);

/// How long the comparison watches PgBouncer after the promote.
const PGBOUNCER_WATCH: Duration = Duration::from_secs(10);

/// The same planned switchover through PgBouncer (docs/scale-out.md's comparison), when
/// `PGBOUNCER_BIN` names a PgBouncer binary: `cargo test --test failover -- --ignored
/// --nocapture pgbouncer`. PgBouncer 1.25.2 has no target_session_attrs nor per-host
/// ports, so its entry names the primary's address, as deployments do. Prints what it saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PGBOUNCER_BIN; a measurement, not a check"]
async fn pgbouncer_comparison() {
    let Some(bin) = std::env::var_os("PGBOUNCER_BIN") else {
        eprintln!("PGBOUNCER_BIN not set: skipped");
        return;
    };
    let c = cluster();
    let dir = tempfile::tempdir().expect("temp dir");
    let port = harness::free_port();
    let ini = format!(
        "[databases]\napp = host=127.0.0.1 port={} dbname=testdb\n[pgbouncer]\n\
         listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
         auth_type = md5\nauth_file = {}/userlist.txt\nadmin_users = postgres\n\
         pool_mode = transaction\ndefault_pool_size = {POOL}\nmax_prepared_statements = 200\n\
         server_login_retry = 1\nquery_wait_timeout = 60\nlogfile = {}/pgbouncer.log\n",
        c.primary.port(),
        dir.path().display(),
        dir.path().display()
    );
    std::fs::write(dir.path().join("pgbouncer.ini"), ini).unwrap();
    std::fs::write(
        dir.path().join("userlist.txt"),
        "\"postgres\" \"postgres\"\n",
    )
    .unwrap();
    harness::process::give_to_pooler(dir.path());
    let mut cmd = std::process::Command::new(bin);
    cmd.args(harness::process::user_args())
        .arg(dir.path().join("pgbouncer.ini"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut child = cmd.spawn().expect("start PgBouncer");
    let dsn = harness::dsn_for(port, "postgres", "app");
    wait_for("PgBouncer up", HUNG, || async {
        try_connect(&dsn).await.is_ok()
    })
    .await;
    let (old, new) = (c.primary.port(), c.standby.port());
    let load = start_writers_with(&dsn, WRITERS, true);
    wait_for("writes on the primary", HUNG, || async {
        let probe = connect(&dsn).await;
        port_of(&probe).await.ok() == Some(old)
    })
    .await;
    c.primary.stop();
    tokio::time::sleep(NO_PRIMARY_FOR).await;
    c.standby.promote();
    let promoted = Instant::now();
    // A measurement window, not a synchronisation: PgBouncer is watched this long.
    tokio::time::sleep(PGBOUNCER_WATCH).await;
    let load = load.finish().await;
    let after: Vec<_> = load
        .commits
        .iter()
        .filter(|(t, _)| *t >= promoted)
        .collect();
    let first_new = after
        .iter()
        .filter(|(_, p)| *p == new)
        .map(|(t, _)| *t)
        .min();
    eprintln!(
        "pgbouncer: {} commits before the promote, {} after ({} on the new primary), {} failed; first write on the new primary: {:?}; failures: {:?}",
        load.commits.len() - after.len(),
        after.len(),
        after.iter().filter(|(_, p)| *p == new).count(),
        load.failures.len(),
        first_new.map(|t| t.saturating_duration_since(promoted)),
        load.failures.iter().take(3).collect::<Vec<_>>()
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// A primary turned read-only (`default_transaction_read_only`, as a demotion begins):
/// writes are not sent to it once that is seen (at most one is refused with 25006, which
/// has the host checked at once); they wait until it takes writes again. With no periodic
/// check (server_role_check_interval = 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_primary_makes_writes_wait_until_it_is_writable() {
    let c = cluster();
    let pooler = builder(&c)
        .setting("server_role_check_interval", "0")
        .start()
        .await;
    let dsn = pooler.dsn("postgres", "app");
    let w = Arc::new(connect(&dsn).await);
    let insert = "INSERT INTO t (v) VALUES (1) RETURNING inet_server_port()";
    w.query_one(insert, &[]).await.expect("a write");
    c.primary
        .psql("ALTER SYSTEM SET default_transaction_read_only = on");
    c.primary.psql("SELECT pg_reload_conf()");
    let admin = pooler.connect("postgres", "pgbouncer").await;
    let primary = format!("127.0.0.1:{}", c.primary.port());
    let mut refused = 0;
    let deadline = Instant::now() + HUNG;
    let waiting = loop {
        assert!(Instant::now() < deadline, "no write ever waited");
        let w2 = w.clone();
        let mut write = tokio::spawn(async move {
            tokio::time::timeout(HUNG, w2.query_one(insert, &[]))
                .await
                .expect("hung")
                .map(|r| r.get::<_, i32>(0) as u16)
        });
        // Waiting for the right reason: the host is known not to take writes (SHOW HOSTS
        // usable = 0) and then the write is still waiting. A client shows as waiting from
        // its checkout to the end of making its server fit (a RESET of the read-only
        // default the server just reported): a write seen waiting before the host is
        // known read-only may still be on its way to the server.
        let waits = harness::eventually(Duration::from_secs(2), || async {
            write.is_finished()
                || (console_value(
                    &admin,
                    "HOSTS",
                    &[("database", "app"), ("host", &primary)],
                    "usable",
                )
                .await
                .as_deref()
                    == Some("0")
                    && harness::cl_waiting(&admin, "app", "postgres").await == 1)
        })
        .await;
        if waits && !write.is_finished() {
            break write;
        }
        match (&mut write).await.unwrap() {
            Ok(_) => {} // the reload not seen yet
            Err(e) => {
                let code = e.as_db_error().map(|d| d.code().code().to_string());
                assert_eq!(code.as_deref(), Some("25006"), "{e}");
                refused += 1;
            }
        }
    };
    assert!(
        refused <= 1,
        "{refused} writes refused: the host was not checked"
    );
    c.primary
        .psql("ALTER SYSTEM RESET default_transaction_read_only");
    c.primary.psql("SELECT pg_reload_conf()");
    let port = waiting.await.unwrap().expect("served once writable again");
    assert_eq!(port, c.primary.port());
}

/// A client's own read-only default (`SET SESSION CHARACTERISTICS`, `SET
/// default_transaction_read_only`) stays its own: kept across servers, never given to
/// another client (the server's value of it is the server's; see the test above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_own_read_only_default_follows_it_and_no_one_else() {
    let pg = TempPostgres::start();
    pg.psql_in("testdb", "CREATE TABLE u (v int); GRANT ALL ON u TO PUBLIC");
    let pooler = harness::transaction_pooler(&pg)
        .setting("default_pool_size", "1")
        .start()
        .await;
    let dsn = pooler.dsn("postgres", "testdb");
    let (a, b, d) = (
        connect(&dsn).await,
        connect(&dsn).await,
        connect(&dsn).await,
    );
    a.simple_query("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
        .await
        .unwrap();
    d.simple_query("SET default_transaction_read_only = on")
        .await
        .unwrap();
    b.simple_query("INSERT INTO u VALUES (1)")
        .await
        .expect("another client writes");
    for (c, who) in [(&a, "characteristics"), (&d, "SET")] {
        let e = c
            .simple_query("INSERT INTO u VALUES (2)")
            .await
            .expect_err(who);
        assert_eq!(
            e.as_db_error().map(|x| x.code().code()),
            Some("25006"),
            "{who}"
        );
    }
    b.simple_query("INSERT INTO u VALUES (3)").await.unwrap();
}
