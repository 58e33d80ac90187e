//! Reads that scale out and are never stale: a primary and two streaming standbys behind
//! one `host=p,s1,s2 … read_routing=on` entry, pgcarpool in transaction mode. Reads go to
//! the standbys (counted by the standbys' own statistics), writes to the primary; a read
//! a standby refuses (25006, a writing function) runs again on the primary unseen. An
//! application loop (write, then read it back and read a counter that only grows) sees
//! no stale read while a standby lags by seconds; the same loop reading through a
//! prefer-standby alias (no LSN tracking) does.
mod harness;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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

/// What the application loop saw until it was stopped.
#[derive(Default)]
struct LoopLoad {
    /// Rounds whose reads both ran.
    rounds: usize,
    stale: usize,
    /// The SQLSTATE (or "closed") of each statement that failed.
    failures: Vec<String>,
    /// Each committed INSERT: when its answer came, the port of the server that ran it
    /// (the server's own `inet_server_port()`), the row's id.
    writes: Vec<(std::time::Instant, u16, i64)>,
}

/// Does an error end the connection (as a driver's pool treats it: open a new one)?
fn ends_connection(e: &tokio_postgres::Error) -> bool {
    e.is_closed() || matches!(harness::sqlstate(e), Some(c) if c == "57P01" || c.starts_with("08"))
}

/// One round of the loop on `c`: write a row and bump the counter (each committed), read
/// the row back and the counter in the next transactions. A failed statement ends the
/// round (Err: the connection is gone).
async fn app_round(
    c: &tokio_postgres::Client,
    k: i32,
    last: &mut i64,
    load: &mut LoopLoad,
) -> Result<(), ()> {
    let fail = |load: &mut LoopLoad, e: tokio_postgres::Error| {
        let gone = ends_connection(&e);
        load.failures
            .push(harness::sqlstate(&e).unwrap_or("closed").to_string());
        if gone { Err(()) } else { Ok(()) }
    };
    let row = match c
        .query_one(
            "INSERT INTO t (v) VALUES ($1) RETURNING id, inet_server_port()",
            &[&k],
        )
        .await
    {
        Ok(r) => r,
        Err(e) => return fail(load, e),
    };
    let id: i64 = row.get(0);
    let port = row.get::<_, i32>(1) as u16;
    load.writes.push((std::time::Instant::now(), port, id));
    match c
        .query_one("UPDATE counter SET n = n + 1 RETURNING n", &[])
        .await
    {
        Ok(r) => *last = (*last).max(r.get(0)),
        Err(e) => return fail(load, e),
    }
    let found: i64 = match c
        .query_one("SELECT count(*) FROM t WHERE id = $1", &[&id])
        .await
    {
        Ok(r) => r.get(0),
        Err(e) => return fail(load, e),
    };
    let now: i64 = match c.query_one("SELECT n FROM counter", &[]).await {
        Ok(r) => r.get(0),
        Err(e) => return fail(load, e),
    };
    load.rounds += 1;
    load.stale += usize::from(found != 1) + usize::from(now < *last);
    *last = (*last).max(now);
    Ok(())
}

/// The loop of one client until `stop`; a lost connection is opened again.
async fn app_loop_until(dsn: String, stop: Arc<AtomicBool>, rounds: Arc<AtomicUsize>) -> LoopLoad {
    let mut load = LoopLoad::default();
    let mut last = 0i64;
    let mut client: Option<tokio_postgres::Client> = None;
    let mut k = 0;
    while !stop.load(Ordering::SeqCst) {
        let c = match client.take() {
            Some(c) if !c.is_closed() => c,
            _ => match tokio::time::timeout(HUNG, try_connect(&dsn)).await {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => {
                    load.failures.push(format!("connect: {e}"));
                    continue;
                }
                Err(_) => panic!("a client's connect hung"),
            },
        };
        k += 1;
        let done = load.rounds;
        let round = tokio::time::timeout(HUNG, app_round(&c, k, &mut last, &mut load));
        if round.await.expect("a round hung").is_ok() {
            client = Some(c);
        }
        rounds.fetch_add(load.rounds - done, Ordering::SeqCst);
    }
    load
}

/// Rounds of the loop before the switchover and after it.
const SWITCH_ROUNDS: usize = 300;
/// How long no primary is up in the switchover (clients wait for the promote).
const NO_PRIMARY_FOR: Duration = Duration::from_secs(1);

/// A switchover under the loop, as an operator does it: the primary stopped (fast), the
/// caught-up standby promoted, the lagging standby made to follow it, the former primary
/// started again as a standby of it. The loop goes on throughout: no stale read; only
/// transactions in flight when the primary went fail (40001, or 08007 for a COMMIT under
/// way); every write ran on the primary of its time, never on a standby (no 25006) nor on
/// the demoted primary, which, by its own WAL, has exactly the new primary's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_under_the_loop_keeps_reads_fresh_and_writes_on_the_primary() {
    let c = cluster();
    let pooler = harness::transaction_pooler(&c.primary)
        .database("app", &entry(&c, "read_routing=on"))
        .setting("default_pool_size", "10")
        .setting("server_role_check_interval", "0.2")
        .setting("server_login_retry", "1")
        .setting("query_wait_timeout", "60")
        .start()
        .await;
    let (old, new) = (c.primary.port(), c.standbys[1].port());
    let dsn = pooler.dsn("postgres", "app");
    let probe = connect(&dsn).await;
    let standby_ports = [c.standbys[0].port(), new];
    wait_for("the standbys known", HUNG, || async {
        standby_ports.contains(&port_of(&probe).await)
    })
    .await;
    make_lag(&c, "2s").await;
    let admin = pooler.connect("postgres", "pgbouncer").await;
    let reads_on = |port: u16| host_value(&admin, port, "reads");
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..APP_CLIENTS)
        .map(|_| tokio::spawn(app_loop_until(dsn.clone(), stop.clone(), rounds.clone())))
        .collect();
    let more_rounds = |n: usize| {
        let want = rounds.load(Ordering::SeqCst) + n;
        let rounds = rounds.clone();
        wait_for("the loop going on", HUNG, move || {
            let r = rounds.load(Ordering::SeqCst);
            async move { r >= want }
        })
    };
    let before = reads_on(new).await;
    more_rounds(SWITCH_ROUNDS).await;
    // The standby to be promoted serves reads through the entry: the loop's own (each
    // follows the client's commit, so on a quiet machine the standby rarely has replayed
    // it yet) or a reader's that never wrote.
    wait_for("reads on the standby to be promoted", HUNG, || async {
        reads_on(new).await > before || port_of(&probe).await == new
    })
    .await;
    assert!(reads_on(new).await > before, "reads on the standby");
    c.primary.stop();
    let stopped = std::time::Instant::now();
    // A deliberate outage, not a synchronisation: clients wait for a primary.
    tokio::time::sleep(NO_PRIMARY_FOR).await;
    c.standbys[1].promote();
    c.standbys[0].follow(&c.standbys[1]);
    c.primary.start_again_as_standby_of(&c.standbys[1]);
    // Once the demoted primary is known as a standby, new servers are opened (RECONNECT
    // closes the pool's as they come back): each login must leave it out.
    let old_addr = format!("127.0.0.1:{old}");
    wait_for("the demoted primary seen as a standby", HUNG, || async {
        let key = [("database", "app"), ("host", old_addr.as_str())];
        harness::console_value(&admin, "HOSTS", &key, "role")
            .await
            .as_deref()
            == Some("standby")
    })
    .await;
    admin
        .simple_query("RECONNECT app")
        .await
        .expect("RECONNECT");
    // The loop goes on until the demoted primary has served reads as a standby.
    let before = reads_on(old).await;
    more_rounds(SWITCH_ROUNDS).await;
    wait_for("reads on the demoted primary", HUNG, || async {
        reads_on(old).await > before + 20
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    let mut load = LoopLoad::default();
    for t in tasks {
        let l = t.await.unwrap();
        load.rounds += l.rounds;
        load.stale += l.stale;
        load.failures.extend(l.failures);
        load.writes.extend(l.writes);
    }
    println!(
        "switchover: {} rounds, {} writes, {} stale reads, failures: {:?}",
        load.rounds,
        load.writes.len(),
        load.stale,
        load.failures
    );
    assert_eq!(load.stale, 0, "no stale read across the switchover");
    assert!(
        load.failures.iter().all(|f| f == "40001" || f == "08007"),
        "only transactions in flight at the stop fail, told 40001 or 08007 (no 25006: \
         no write on a standby): {:?}",
        load.failures
    );
    assert!(
        load.failures.len() <= 10,
        "at most the transactions in flight (pool 10) fail: {:?}",
        load.failures
    );
    for &(at, port, id) in &load.writes {
        assert!(
            (port == old && at < stopped) || port == new,
            "write {id} ran on port {port} (primary {old} until the stop, then {new})"
        );
    }
    assert!(
        load.writes.iter().any(|w| w.1 == new),
        "writes on the new primary"
    );
    // From PostgreSQL's side: every committed row is on the new primary, and the demoted
    // primary streams from it with exactly its rows (a write it had taken would have
    // forked its history: it could not follow).
    let ids: Vec<String> = load.writes.iter().map(|w| w.2.to_string()).collect();
    let kept = c.standbys[1].psql_in(
        "testdb",
        &format!(
            "SELECT count(*) FROM t WHERE id = ANY('{{{}}}')",
            ids.join(",")
        ),
    );
    assert_eq!(kept, ids.len().to_string(), "every committed write kept");
    let rows = |pg: &TempPostgres| pg.psql_in("testdb", "SELECT count(*), max(id) FROM t");
    wait_for("the demoted primary caught up", HUNG, || async {
        rows(&c.primary) == rows(&c.standbys[1])
    })
    .await;
    assert_eq!(
        c.primary.psql("SELECT pg_is_in_recovery()"),
        "t",
        "the demoted primary is a standby"
    );
}

/// Rounds of each client of a driver's loop.
const DRIVER_ROUNDS: usize = 25;

/// Run a driver's loop program (`tests/clients`: psycopg's `python/read_loop.py`, pgx's
/// `go/read-loop`) with `APP_CLIENTS` clients writing through `write` and reading through
/// `read`: its stale reads. Blocking.
fn driver_loop(driver: &str, write: &str, read: &str) -> usize {
    harness::install_python_and_go_clients();
    let dir = harness::clients_dir();
    let mut cmd = match driver {
        "psycopg" => {
            let mut c = std::process::Command::new(dir.join("python/.venv/bin/python"));
            c.arg(dir.join("python/read_loop.py"));
            c
        }
        _ => std::process::Command::new(dir.join("go/read-loop")),
    };
    let clients = APP_CLIENTS.to_string();
    let rounds = DRIVER_ROUNDS.to_string();
    let out = cmd
        .args([write, read, &clients, &rounds])
        .output()
        .unwrap_or_else(|e| panic!("run {driver}'s loop: {e}"));
    let text = harness::output_text(&out);
    assert!(out.status.success(), "{driver}'s loop: {text}");
    let want = APP_CLIENTS * DRIVER_ROUNDS;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or("");
    let words: Vec<&str> = line.split(' ').collect();
    match words[..] {
        ["ok", n, "rounds", stale, "stale"] if n == want.to_string() => {
            stale.parse().expect("a count")
        }
        _ => panic!("{driver}'s loop: no `ok {want} rounds <n> stale` line: {text}"),
    }
}

/// The application loop with real drivers (psycopg 3 in autocommit with its prepared
/// statements, pgx v5 with its statement cache and `begin read only`), 16 clients each,
/// standby 0 three seconds behind: no stale read through read_routing, while reading
/// through the prefer-standby alias (no LSN tracking) gives some. (Most routed reads run
/// on the primary: a read right after the client's own commit finds no standby that has
/// replayed it yet; how many ran on the standbys is printed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drivers_loops_read_no_stale_data_and_the_standby_alias_does() {
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
    let admin = pooler.connect("postgres", "pgbouncer").await;
    for driver in ["psycopg", "pgx"] {
        let (a, r) = (app.clone(), ro.clone());
        let baseline = tokio::task::spawn_blocking(move || driver_loop(driver, &a, &r))
            .await
            .unwrap();
        let mut before = 0;
        for port in standby_ports {
            before += host_value(&admin, port, "reads").await;
        }
        let a = app.clone();
        let routed = tokio::task::spawn_blocking(move || driver_loop(driver, &a, &a))
            .await
            .unwrap();
        let mut on_standbys = 0;
        for port in standby_ports {
            on_standbys += host_value(&admin, port, "reads").await;
        }
        on_standbys -= before;
        println!(
            "{driver}: stale reads: {routed} through read_routing ({on_standbys} reads on \
             the standbys), {baseline} through prefer-standby"
        );
        assert!(baseline > 0, "{driver}: the standby alias reads stale data");
        assert_eq!(routed, 0, "{driver}: no stale read through read_routing");
    }
}

/// A sample of /metrics: the value of `name{labels}` (labels as written, in order).
fn sample(body: &str, name: &str, labels: &str) -> u64 {
    let key = format!("{name}{{{labels}}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("/metrics has {key}: {body}"))
}

/// Scans of table `r` on each of the cluster's servers (by their own statistics) once
/// they add up to `total` more than `before`.
async fn scans_grown(c: &Cluster, before: &[u64], total: u64) -> Vec<u64> {
    let mut grown = Vec::new();
    wait_for("every scan counted by its host", HUNG, || {
        grown = c
            .all()
            .iter()
            .zip(before)
            .map(|(pg, b)| scans(pg) - b)
            .collect();
        let sum: u64 = grown.iter().sum();
        async move { sum >= total }
    })
    .await;
    grown
}

/// Read routing's counters of entry `db`: reads per host of the list, reads on the
/// primary for freshness, replays.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Counts {
    reads: Vec<u64>,
    on_primary: u64,
    replays: u64,
}

impl Counts {
    /// From SHOW HOSTS.
    async fn shown(admin: &tokio_postgres::Client, db: &str, ports: &[u16]) -> Counts {
        let mut reads = Vec::new();
        let mut on_primary = 0;
        let mut replays = 0;
        for &p in ports {
            let host = format!("127.0.0.1:{p}");
            let key = [("database", db), ("host", host.as_str())];
            let get = |col| harness::console_value(admin, "HOSTS", &key, col);
            let num = |v: Option<String>| v.and_then(|v| v.parse::<u64>().ok()).unwrap();
            reads.push(num(get("reads").await));
            on_primary = num(get("reads_on_primary").await);
            replays = num(get("read_replays").await);
        }
        Counts {
            reads,
            on_primary,
            replays,
        }
    }

    /// From /metrics.
    fn exported(body: &str, db: &str, ports: &[u16]) -> Counts {
        let l = format!("database=\"{db}\",user=\"postgres\"");
        Counts {
            reads: ports
                .iter()
                .map(|p| {
                    sample(
                        body,
                        "pgcarpool_reads_total",
                        &format!("{l},host=\"127.0.0.1:{p}\""),
                    )
                })
                .collect(),
            on_primary: sample(body, "pgcarpool_reads_on_primary_total", &l),
            replays: sample(body, "pgcarpool_read_replays_total", &l),
        }
    }

    /// What grew since `before`.
    fn since(&self, before: &Counts) -> Counts {
        Counts {
            reads: self
                .reads
                .iter()
                .zip(&before.reads)
                .map(|(a, b)| a - b)
                .collect(),
            on_primary: self.on_primary - before.on_primary,
            replays: self.replays - before.replays,
        }
    }
}

/// Reads by both protocols (simple; Parse/Bind/Execute of an unnamed statement), `n` in all.
async fn reads(c: &tokio_postgres::Client, n: usize) {
    use tokio_postgres::types::Type;
    for k in 0..n {
        if k % 2 == 0 {
            c.simple_query("SELECT count(*) FROM r").await.unwrap();
        } else {
            let zero = (
                &0i32 as &(dyn tokio_postgres::types::ToSql + Sync),
                Type::INT4,
            );
            c.query_typed("SELECT count(*) FROM r WHERE v > $1", &[zero])
                .await
                .unwrap();
        }
    }
}

/// The counters (SHOW HOSTS and /metrics) count a known workload exactly, and where the
/// reads ran agrees with the servers' own statistics:
/// - 30 reads without read_your_writes: each on a standby, each standby's `reads` grown by
///   its own scans of the table;
/// - 5 `SELECT bump()`, each refused by a standby and run again on the primary: 5
///   `read_replays`, no read counted;
/// - with both standbys' replay paused, a write, then 12 reads: each on the primary for
///   freshness (12 `reads_on_primary`, 12 scans on the primary, none on the standbys).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_read_counters_count_a_known_workload_exactly() {
    let c = cluster();
    let (pooler, metrics_port) = harness::transaction_pooler(&c.primary)
        .database("loose", &entry(&c, "read_routing=on read_your_writes=off"))
        .database("app", &entry(&c, "read_routing=on"))
        .setting("default_pool_size", "4")
        .setting("server_role_check_interval", "0.2")
        .start_with_free_port("prometheus_port")
        .await;
    let ports: Vec<u16> = c.all().iter().map(|p| p.port()).collect();
    let admin = pooler.connect("postgres", "pgbouncer").await;
    let loose = connect(&pooler.dsn("postgres", "loose")).await;
    let app = connect(&pooler.dsn("postgres", "app")).await;
    for cl in [&loose, &app] {
        wait_for("the standbys known", HUNG, || async {
            ports[1..].contains(&port_of(cl).await)
        })
        .await;
    }
    let exported = |db: &'static str| {
        let ports = &ports;
        async move { Counts::exported(&harness::metrics(metrics_port).await, db, ports) }
    };
    // Reads on the standbys.
    let before = Counts::shown(&admin, "loose", &ports).await;
    let before_exported = exported("loose").await;
    assert_eq!(before_exported, before, "/metrics and SHOW HOSTS agree");
    let scanned: Vec<u64> = c.all().iter().map(|pg| scans(pg)).collect();
    reads(&loose, 30).await;
    let grown = scans_grown(&c, &scanned, 30).await;
    for _ in 0..5 {
        loose.simple_query("SELECT bump()").await.unwrap();
    }
    let counted = Counts::shown(&admin, "loose", &ports).await.since(&before);
    assert_eq!(grown[0], 0, "no read on the primary: {grown:?}");
    let want = Counts {
        reads: grown,
        on_primary: 0,
        replays: 5,
    };
    assert_eq!(counted, want, "SHOW HOSTS, loose");
    assert_eq!(
        exported("loose").await.since(&before_exported),
        want,
        "/metrics, loose"
    );
    // Reads the primary serves for freshness: the client wrote what no standby replayed.
    for s in &c.standbys {
        s.psql("SELECT pg_wal_replay_pause()");
    }
    app.simple_query("INSERT INTO t (v) VALUES (5)")
        .await
        .unwrap();
    let before = Counts::shown(&admin, "app", &ports).await;
    let before_exported = exported("app").await;
    let scanned: Vec<u64> = c.all().iter().map(|pg| scans(pg)).collect();
    reads(&app, 12).await;
    let grown = scans_grown(&c, &scanned, 12).await;
    assert_eq!(grown, vec![12, 0, 0], "every read on the primary");
    let want = Counts {
        reads: vec![0, 0, 0],
        on_primary: 12,
        replays: 0,
    };
    let counted = Counts::shown(&admin, "app", &ports).await.since(&before);
    assert_eq!(counted, want, "SHOW HOSTS, app");
    assert_eq!(
        exported("app").await.since(&before_exported),
        want,
        "/metrics, app"
    );
    for s in &c.standbys {
        s.psql("SELECT pg_wal_replay_resume()");
    }
}

/// The port a simple-query read ran on (its one row's first column).
async fn read_port(c: &tokio_postgres::Client, sql: &str) -> u16 {
    let rows = c.simple_query(sql).await.unwrap();
    rows.iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0)?.parse().ok(),
            _ => None,
        })
        .expect("a row")
}

/// PAUSE, RESUME and RECONNECT of a read routing entry reach its standbys' servers, as
/// PgBouncer's reach every server of the database: PAUSE returns only once a read running
/// on a standby is done, and a read sent meanwhile waits until RESUME; RECONNECT closes the
/// standbys' servers too (by the standbys' own pg_stat_activity), WAIT_CLOSE waits for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_resume_and_reconnect_reach_the_standbys_servers() {
    let c = cluster();
    let pooler = pooler(&c).await;
    let standby_ports = [c.standbys[0].port(), c.standbys[1].port()];
    let dsn = pooler.dsn("postgres", "app");
    let a = Arc::new(connect(&dsn).await);
    let b = Arc::new(connect(&dsn).await);
    for cl in [&a, &b] {
        wait_for("the standbys known", HUNG, || async {
            standby_ports.contains(&port_of(cl).await)
        })
        .await;
    }
    let admin = pooler.connect("postgres", "pgbouncer").await;
    // A read running on a standby when PAUSE comes.
    let slow = "SELECT inet_server_port(), pg_sleep(1)";
    let a2 = a.clone();
    let running = tokio::spawn(async move { read_port(&a2, slow).await });
    wait_for("the read running on a standby", HUNG, || async {
        c.standbys.iter().any(|s| {
            s.psql("SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(1)'") != "0"
        })
    })
    .await;
    admin.simple_query("PAUSE app").await.expect("PAUSE");
    assert!(
        running.is_finished(),
        "PAUSE returned while a read ran on a standby"
    );
    assert!(standby_ports.contains(&running.await.unwrap()));
    // A read sent while paused waits.
    let b2 = b.clone();
    let waiting = tokio::spawn(async move { read_port(&b2, "SELECT inet_server_port()").await });
    wait_for("the read waiting", HUNG, || async {
        waiting.is_finished() || harness::cl_waiting(&admin, "app", "postgres").await == 1
    })
    .await;
    assert!(!waiting.is_finished(), "a read was served while paused");
    admin.simple_query("RESUME app").await.expect("RESUME");
    let port = tokio::time::timeout(HUNG, waiting)
        .await
        .expect("hung")
        .unwrap();
    assert!(
        standby_ports.contains(&port),
        "served by a standby after RESUME"
    );
    // RECONNECT: the standbys' servers (idle now) are closed; new ones serve.
    let marks: Vec<String> = c.standbys.iter().map(|s| s.psql("SELECT now()")).collect();
    let older = |s: &TempPostgres, t: &str| {
        s.psql(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = 'testdb' \
             AND backend_type = 'client backend' AND backend_start < '{t}'"
        ))
    };
    assert!(
        c.standbys
            .iter()
            .zip(&marks)
            .any(|(s, t)| older(s, t) != "0"),
        "the standbys have servers before RECONNECT"
    );
    admin
        .simple_query("RECONNECT app")
        .await
        .expect("RECONNECT");
    admin
        .simple_query("WAIT_CLOSE app")
        .await
        .expect("WAIT_CLOSE");
    wait_for("the standbys' servers closed", HUNG, || async {
        c.standbys
            .iter()
            .zip(&marks)
            .all(|(s, t)| older(s, t) == "0")
    })
    .await;
    let port = read_port(&b, "SELECT inet_server_port()").await;
    assert!(standby_ports.contains(&port), "a new standby server serves");
}
