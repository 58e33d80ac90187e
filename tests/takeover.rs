//! Online restart without SO_REUSEPORT, as PgBouncer's `-R`: the new pgcarpool takes the
//! listening sockets from the running one over its Unix socket (SUSPEND, SHOW FDS with the
//! descriptors), then every client idle between transactions moves to it with its whole
//! session (settings, prepared statements, cancel key); pinned clients stay until they
//! unpin or leave. Each test runs the real binary (`harness::process`) against a real
//! PostgreSQL: the first on port 0 with its Unix socket in its own dir, the successor on
//! the port and socket dir the first reported.
mod harness;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use harness::process::{PoolerProcess, ProcessDir, pidfile_pid};
use harness::{
    TempPostgres, TestPooler, TestPoolerBuilder, dsn_for, eventually, output_text, pgbench_number,
    rows, run_pgbench, scalar, try_connect,
};
use tokio_postgres::SimpleQueryMessage;

/// Start the first pgcarpool on `spec` with so_reuseport = 0, a pidfile and its Unix
/// socket in its own dir (shared with the successor).
async fn start_first(spec: TestPoolerBuilder) -> PoolerProcess {
    let mut dir = ProcessDir::with_pidfile(spec.setting("so_reuseport", "0"));
    let sockdir = dir.path().to_string_lossy().into_owned();
    dir.rewrite(|b| b.setting("unix_socket_dir", &sockdir));
    PoolerProcess::start_first(dir).await
}

/// The rows of a console SHOW as column → value maps.
async fn show(port: u16, what: &str) -> Vec<HashMap<String, Option<String>>> {
    let c = try_connect(&dsn_for(port, "postgres", "pgbouncer"))
        .await
        .expect("console");
    rows(&c, what).await
}

fn field<'a>(row: &'a HashMap<String, Option<String>>, name: &str) -> Option<&'a str> {
    row.get(name)?.as_deref()
}

/// The first value of `sql` ("" when it has no row); panics when it fails.
async fn one_text(c: &tokio_postgres::Client, sql: &str) -> String {
    match scalar(c, sql).await {
        Ok(v) => v,
        Err(e) if e.starts_with("no row from") => String::new(),
        Err(e) => panic!("{sql}: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_so_reuseport_the_sockets_and_idle_clients_move_and_the_old_one_exits() {
    let pg = TempPostgres::start();
    let mut old = start_first(TestPooler::builder(&pg).setting("pool_mode", "transaction")).await;
    let pidfile = old.dir.pidfile();
    // A client of the old process with a setting and a prepared statement of its own.
    let before = old.connect("md5user").await;
    before
        .simple_query("SET application_name = 'moved-client'")
        .await
        .unwrap();
    let stmt = before.prepare("select $1::int + 41").await.unwrap();
    let mut new = old.start_successor(&["-R"]).await;
    assert_eq!(
        new.port(),
        old.port(),
        "the new pgcarpool is on another port"
    );
    assert!(
        old.log().contains("listening socket(s) passed"),
        "the old pgcarpool did not pass its sockets:\n{}",
        old.log()
    );
    // Nobody pinned: the old process exits within seconds.
    let status = old.exited_within(Duration::from_secs(5)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "the old pgcarpool did not exit: {status:?}\n--- old\n{}\n--- new\n{}",
        old.log(),
        new.log()
    );
    assert!(new.running(), "the new pgcarpool died:\n{}", new.log());
    assert_eq!(pidfile_pid(&pidfile), new.pid().to_string());
    // The client connected before the switch carries on with its session.
    let row = before
        .query_one(&stmt, &[&1i32])
        .await
        .unwrap_or_else(|e| panic!("the moved client's statement: {e}\n{}", new.log()));
    assert_eq!(row.get::<_, i32>(0), 42);
    assert_eq!(
        one_text(&before, "show application_name").await,
        "moved-client"
    );
    // The new process lists it, as moved in.
    let clients = show(new.port(), "SHOW HANDOVER").await;
    let moved = clients
        .iter()
        .find(|r| field(r, "database") == Some("testdb"))
        .unwrap_or_else(|| panic!("the moved client is not in SHOW HANDOVER: {clients:?}"));
    assert_eq!(field(moved, "handover"), Some("moved in"));
    // New clients, over TCP and the Unix socket, reach the new process.
    new.connect("md5user")
        .await
        .simple_query("select 1")
        .await
        .unwrap();
    let sockdir = old.dir.path().to_string_lossy().into_owned();
    let unix_dsn = format!(
        "host={sockdir} port={} user=md5user password=md5pass dbname=testdb",
        new.port()
    );
    try_connect(&unix_dsn)
        .await
        .unwrap_or_else(|e| panic!("the Unix socket after the switch: {e}\n{}", new.log()))
        .simple_query("select 1")
        .await
        .unwrap();
    let socket = Path::new(&sockdir).join(format!(".s.PGSQL.{}", new.port()));
    assert!(socket.exists(), "the old pgcarpool removed the socket file");
    new.signal(libc::SIGQUIT);
    assert!(new.exited_within(Duration::from_secs(5)).await.is_some());
    assert!(
        !socket.exists(),
        "the last pgcarpool left its socket behind"
    );
    assert!(!pidfile.exists(), "the pidfile outlived the last pgcarpool");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_client_stays_with_the_old_process_until_it_leaves() {
    let pg = TempPostgres::start();
    let mut old = start_first(TestPooler::builder(&pg).setting("pool_mode", "transaction")).await;
    let pinned = old.connect("md5user").await;
    pinned
        .simple_query("create temp table t(x int); insert into t values (7)")
        .await
        .unwrap();
    let idle = old.connect("md5user").await;
    idle.simple_query("select 1").await.unwrap();
    let old_port = old.port();
    let mut new = old.start_successor(&["-R"]).await;
    // The idle one moves; the pinned one stays, and the new process's SHOW HANDOVER says so
    // (the old one listens no more).
    assert!(
        eventually(Duration::from_secs(5), || async {
            show(new.port(), "SHOW HANDOVER").await.iter().any(|r| {
                field(r, "handover") == Some("with the old process: stays: pinned to its server")
            })
        })
        .await,
        "the new process does not list the pinned client: {:?}",
        show(new.port(), "SHOW HANDOVER").await
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            show(new.port(), "SHOW HANDOVER")
                .await
                .iter()
                .any(|r| field(r, "handover") == Some("moved in"))
        })
        .await,
        "the idle client did not move:\n{}",
        new.log()
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            old.log().contains("handing over idle clients")
        })
        .await
    );
    assert!(old.running(), "the old pgcarpool left a pinned client");
    assert_eq!(
        one_text(&pinned, "select x from t").await,
        "7",
        "the pinned client lost its temp table"
    );
    idle.simple_query("select 1").await.unwrap();
    // Its cancel requests reach the new process, which passes them to the old one.
    let cancel = pinned.cancel_token();
    let sleeping = tokio::spawn(async move {
        let r = pinned.simple_query("select pg_sleep(30)").await;
        (pinned, r)
    });
    assert!(
        eventually(Duration::from_secs(5), || async {
            let _ = cancel.cancel_query(tokio_postgres::NoTls).await;
            sleeping.is_finished()
        })
        .await,
        "the pinned client's query was not cancelled through the new process"
    );
    let (pinned, r) = sleeping.await.unwrap();
    let e = r.expect_err("pg_sleep(30) finished");
    assert_eq!(
        e.code(),
        Some(&tokio_postgres::error::SqlState::QUERY_CANCELED),
        "{e}"
    );
    drop(pinned);
    let status = old.exited_within(Duration::from_secs(5)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "the old pgcarpool did not exit once its pinned client left: {status:?}\n{}",
        old.log()
    );
    assert_eq!(old_port, new.port());
    new.signal(libc::SIGQUIT);
    assert!(new.exited_within(Duration::from_secs(5)).await.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspend_holds_new_and_idle_clients_until_resume() {
    let pg = TempPostgres::start();
    let mut p = start_first(TestPooler::builder(&pg).setting("pool_mode", "transaction")).await;
    let dsn = p.dsn("md5user");
    let idle = p.connect("md5user").await;
    let console = p.console().await;
    console.simple_query("SUSPEND").await.unwrap();
    // (Over the same console session: a new one would wait as every new connection does.)
    let suspended = console
        .simple_query("SHOW STATE")
        .await
        .unwrap()
        .into_iter()
        .any(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0) == Some("suspended") && r.get(1) == Some("yes"),
            _ => false,
        });
    assert!(suspended, "SHOW STATE does not say suspended");
    // Neither a new connection nor the idle client's query gets an answer while suspended.
    let connecting = tokio::spawn({
        let dsn = dsn.clone();
        async move { try_connect(&dsn).await.map(|_| ()) }
    });
    let query = tokio::spawn(async move { idle.simple_query("select 1").await.map(|_| ()) });
    // A window the suspend must hold (the scenario), not a synchronisation.
    let window = Duration::from_millis(500);
    let what = "no new client in and no idle client served while suspended";
    harness::assert_stays(what, window, || async {
        !connecting.is_finished() && !query.is_finished()
    })
    .await;
    console.simple_query("RESUME").await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), connecting)
        .await
        .expect("the new client waited past RESUME")
        .unwrap()
        .expect("the new client after RESUME");
    tokio::time::timeout(Duration::from_secs(5), query)
        .await
        .expect("the idle client waited past RESUME")
        .unwrap()
        .expect("the idle client's query after RESUME");
    p.signal(libc::SIGQUIT);
    assert!(p.exited_within(Duration::from_secs(5)).await.is_some());
}

/// pgbench clients (-M prepared) and clients holding settings and statements.
const BENCH_CLIENTS: &str = "100";
const HOLDERS: usize = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_under_pgbench_prepared_moves_every_session() {
    let pg = TempPostgres::start();
    let init = run_pgbench(&["-i", "-q", "-s", "1", &pg.dsn("md5user", "testdb")]);
    assert!(init.status.success(), "pgbench -i: {}", output_text(&init));
    let mut old = start_first(
        TestPooler::builder(&pg)
            .setting("pool_mode", "transaction")
            .setting("max_client_conn", "400")
            .setting("default_pool_size", "10"),
    )
    .await;
    let dsn = old.dsn("md5user");
    let mut holders = Vec::new();
    for i in 0..HOLDERS {
        let c = old.connect("md5user").await;
        c.simple_query(&format!(
            "SET application_name = 'holder{i}'; SET statement_timeout = '{}ms'",
            100_001 + 2 * i
        ))
        .await
        .unwrap();
        let stmt = c
            .prepare(&format!("select $1::int * 1000 + {i}"))
            .await
            .unwrap();
        holders.push((c, stmt));
    }
    let bench_dsn = dsn.clone();
    let bench = tokio::task::spawn_blocking(move || {
        run_pgbench(&[
            "-n",
            "-M",
            "prepared",
            "-S",
            "-T",
            "8",
            "-c",
            BENCH_CLIENTS,
            "-j",
            "2",
            &bench_dsn,
        ])
    });
    // Under load: every pgbench client connected and running.
    assert!(
        eventually(Duration::from_secs(20), || async {
            show(old.port(), "SHOW CLIENTS").await.len() > HOLDERS + 90
        })
        .await,
        "pgbench did not connect:\n{}",
        old.log()
    );
    let mut new = old.start_successor(&["-R"]).await;
    let status = old.exited_within(Duration::from_secs(5)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "the old pgcarpool was not gone within 5 s: {status:?}\n--- old\n{}\n--- new\n{}",
        old.log(),
        new.log()
    );
    // The new process lists every client: the holders and pgbench's.
    let clients = show(new.port(), "SHOW HANDOVER").await;
    let moved = clients
        .iter()
        .filter(|r| field(r, "handover") == Some("moved in"))
        .count();
    assert!(
        moved >= HOLDERS + 100,
        "only {moved} clients moved: {clients:?}"
    );
    for (i, (c, stmt)) in holders.iter().enumerate() {
        let row = c
            .query_one(stmt, &[&7i32])
            .await
            .unwrap_or_else(|e| panic!("holder {i}'s statement: {e}\n{}", new.log()));
        assert_eq!(row.get::<_, i32>(0), 7000 + i as i32);
        assert_eq!(
            one_text(c, "show application_name").await,
            format!("holder{i}")
        );
        assert_eq!(
            one_text(c, "show statement_timeout").await,
            format!("{}ms", 100_001 + 2 * i)
        );
    }
    let out = bench.await.unwrap();
    assert!(out.status.success(), "{}", output_text(&out));
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("aborted"),
        "{}",
        output_text(&out)
    );
    assert_eq!(
        pgbench_number(&out, "number of failed transactions: "),
        Some(0),
        "{}",
        output_text(&out)
    );
    eprintln!(
        "{} transactions, {moved} clients moved",
        pgbench_number(&out, "number of transactions actually processed: ").unwrap_or(0)
    );
    new.signal(libc::SIGQUIT);
    assert!(new.exited_within(Duration::from_secs(5)).await.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_process_that_fails_after_taking_the_sockets_leaves_the_old_one_running() {
    let pg = TempPostgres::start();
    let mut old = start_first(TestPooler::builder(&pg).setting("pool_mode", "transaction")).await;
    let idle = old.connect("md5user").await;
    // The successor takes the sockets, then cannot start its metrics listener.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = taken.local_addr().unwrap().port().to_string();
    let mut dir = old.successor_dir();
    dir.rewrite(|b| {
        b.setting("prometheus_port", &busy)
            .setting("prometheus_addr", "127.0.0.1")
    });
    let out = dir.run(&["-R"]);
    assert!(
        !out.status.success(),
        "the successor started although its metrics port is taken: {}",
        output_text(&out)
    );
    assert!(
        old.log().contains("listening socket(s) passed"),
        "the successor did not take the sockets first:\n{}",
        old.log()
    );
    // The old one resumed: its idle client and new clients are served.
    assert!(old.running(), "the old pgcarpool stopped:\n{}", old.log());
    tokio::time::timeout(Duration::from_secs(5), idle.simple_query("select 1"))
        .await
        .unwrap_or_else(|_| panic!("the old pgcarpool stayed suspended:\n{}", old.log()))
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), old.connect("md5user"))
        .await
        .unwrap_or_else(|_| panic!("the old pgcarpool accepts nothing:\n{}", old.log()))
        .simple_query("select 1")
        .await
        .unwrap();
    drop(taken);
    old.signal(libc::SIGQUIT);
    assert!(old.exited_within(Duration::from_secs(5)).await.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_in_a_transaction_moves_when_it_ends_and_unix_clients_move_too() {
    let pg = TempPostgres::start();
    let mut old = start_first(TestPooler::builder(&pg).setting("pool_mode", "transaction")).await;
    let sockdir = old.dir.path().to_string_lossy().into_owned();
    let unix_dsn = format!(
        "host={sockdir} port={} user=md5user password=md5pass dbname=testdb",
        old.port()
    );
    let over_unix = try_connect(&unix_dsn).await.expect("Unix socket");
    over_unix
        .simple_query("SET application_name = 'over-unix'")
        .await
        .unwrap();
    let in_xact = old.connect("md5user").await;
    in_xact
        .simple_query("create table moved_t(x int)")
        .await
        .unwrap();
    in_xact
        .simple_query("begin; insert into moved_t values (1)")
        .await
        .unwrap();
    let mut new = old.start_successor(&["-R"]).await;
    // The Unix client moves; the one in a transaction waits with the old process.
    assert!(
        eventually(Duration::from_secs(5), || async {
            let rows = show(new.port(), "SHOW HANDOVER").await;
            rows.iter().any(|r| {
                field(r, "addr") == Some("unix") && field(r, "handover") == Some("moved in")
            }) && rows
                .iter()
                .any(|r| field(r, "handover") == Some("with the old process: moves when idle"))
        })
        .await,
        "{:?}\n{}",
        show(new.port(), "SHOW HANDOVER").await,
        old.log()
    );
    assert!(
        old.running(),
        "the old pgcarpool left a client in a transaction"
    );
    in_xact
        .simple_query("insert into moved_t values (2); commit")
        .await
        .unwrap();
    let status = old.exited_within(Duration::from_secs(5)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "the old pgcarpool did not exit once the transaction ended: {status:?}\n{}",
        old.log()
    );
    assert_eq!(one_text(&in_xact, "select sum(x) from moved_t").await, "3");
    assert_eq!(
        one_text(&over_unix, "show application_name").await,
        "over-unix"
    );
    new.signal(libc::SIGQUIT);
    assert!(new.exited_within(Duration::from_secs(5)).await.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_so_reuseport_idle_clients_move_too() {
    let pg = TempPostgres::start();
    let mut dir = ProcessDir::with_pidfile(
        TestPooler::builder(&pg)
            .setting("pool_mode", "transaction")
            .setting("so_reuseport", "1"),
    );
    let sockdir = dir.path().to_string_lossy().into_owned();
    dir.rewrite(|b| b.setting("unix_socket_dir", &sockdir));
    let mut old = PoolerProcess::start_in(dir, &[]).await;
    let before = old.connect("md5user").await;
    before
        .simple_query("SET application_name = 'reuseport-client'")
        .await
        .unwrap();
    let stmt = before.prepare("select $1::int * 2").await.unwrap();
    let mut new = old.start_successor(&["-R"]).await;
    let status = old.exited_within(Duration::from_secs(5)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "the old pgcarpool did not exit: {status:?}\n--- old\n{}\n--- new\n{}",
        old.log(),
        new.log()
    );
    assert!(
        !old.log().contains("SIGTERM"),
        "the old pgcarpool was signalled instead of handing over:\n{}",
        old.log()
    );
    let row = before
        .query_one(&stmt, &[&21i32])
        .await
        .unwrap_or_else(|e| panic!("the moved client's statement: {e}\n{}", new.log()));
    assert_eq!(row.get::<_, i32>(0), 42);
    assert_eq!(
        one_text(&before, "show application_name").await,
        "reuseport-client"
    );
    new.signal(libc::SIGQUIT);
    assert!(new.exited_within(Duration::from_secs(5)).await.is_some());
}

/// Protocol 3.2 clients across `-R`: the one that moves keeps its 32-byte secret in the new
/// process, and the pinned one that stays is cancelled through the new process, which
/// passes the whole secret to the old one; a secret cut to its first 4 bytes cancels
/// neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_cancel_keys_survive_an_online_restart() {
    use harness::raw::{RawClient, send_cancel};
    let pg = TempPostgres::start();
    let old = start_first(
        TestPooler::builder(&pg)
            .setting("pool_mode", "transaction")
            .setting("auth_type", "trust"),
    )
    .await;
    let user = ("md5user", "testdb");
    let mut moving = RawClient::connect(("127.0.0.1", old.port()), 2, user, &[]).await;
    let mut pinned = RawClient::connect(("127.0.0.1", old.port()), 2, user, &[]).await;
    pinned.send_query("create temp table t(x int)").await;
    assert_eq!(pinned.outcome(Duration::from_secs(20)).await, Some(None));
    let new = old.start_successor(&["-R"]).await;
    let handover = |state: &'static str| {
        let port = new.port();
        async move {
            show(port, "SHOW HANDOVER")
                .await
                .iter()
                .any(|r| field(r, "handover") == Some(state))
        }
    };
    assert!(
        eventually(Duration::from_secs(5), || handover("moved in")).await,
        "the idle client did not move:\n{}",
        new.log()
    );
    assert!(
        eventually(Duration::from_secs(5), || handover(
            "with the old process: stays: pinned to its server"
        ))
        .await
    );
    let obs = harness::Observer::new(&pg).await;
    for (what, c) in [("moved", &mut moving), ("pinned", &mut pinned)] {
        assert_eq!(c.secret_len(), 32);
        obs.wait_running("md5user", "pg_sleep(10)", 0).await;
        c.send_query("SELECT pg_sleep(10)").await;
        obs.wait_running("md5user", "pg_sleep(10)", 1).await;
        send_cancel(("127.0.0.1", new.port()), c.key, &[]).await;
        assert_eq!(
            c.outcome(Duration::from_millis(700)).await,
            None,
            "{what}: the first 4 bytes of the secret cancelled"
        );
        send_cancel(("127.0.0.1", new.port()), c.key, &c.rest.clone()).await;
        assert_eq!(
            c.outcome(Duration::from_secs(5)).await,
            Some(Some("57014".into())),
            "{what}: not cancelled through the new process"
        );
    }
    drop((moving, pinned));
}
