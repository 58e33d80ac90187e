//! Online restart: a second pgcarpool started with `-R` takes over the listening sockets of
//! the running one (SO_REUSEPORT plus a reuseport BPF program for TCP, an atomic rename for
//! the Unix socket) and sends it SIGTERM; the old one finishes its clients' work and exits.
//! Clients see no refused or reset connection. Each test runs the real binary
//! (`harness::process`): the first on port 0, its successor on the port the first reported,
//! both naming one pidfile; each is stopped by its PID.
mod harness;

use std::path::Path;
use std::time::{Duration, Instant};

use harness::process::{PoolerProcess, ProcessDir, pidfile_pid};
use harness::{
    TempPostgres, TestPooler, TestPoolerBuilder, dsn_for, eventually, output_text, pgbench_number,
    run_pgbench, try_connect,
};
use tokio_postgres::SimpleQueryMessage;

/// The test config for `pg` with so_reuseport = 1 and `extra` settings in [pgbouncer].
fn reuseport_spec(pg: &TempPostgres, extra: &[(&str, &str)]) -> TestPoolerBuilder {
    TestPooler::builder(pg)
        .setting("so_reuseport", "1")
        .settings(extra)
}

/// Start the first pgcarpool on `spec`, with a pidfile.
async fn start_first(spec: TestPoolerBuilder) -> PoolerProcess {
    PoolerProcess::start_first(ProcessDir::with_pidfile(spec)).await
}

/// Transactions the console at `port` has counted on testdb.
async fn xacts(port: u16) -> u64 {
    let Ok(c) = try_connect(&dsn_for(port, "postgres", "pgbouncer")).await else {
        return 0;
    };
    let Ok(msgs) = c.simple_query("SHOW STATS").await else {
        return 0;
    };
    msgs.iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) if r.get("database") == Some("testdb") => {
                r.get("total_xact_count").and_then(|x| x.parse().ok())
            }
            _ => None,
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_under_pgbench_connect_load_fails_nothing() {
    let pg = TempPostgres::start();
    let init = run_pgbench(&["-i", "-q", "-s", "1", &pg.dsn("md5user", "testdb")]);
    assert!(init.status.success(), "pgbench -i: {}", output_text(&init));
    let mut old = start_first(reuseport_spec(&pg, &[("pool_mode", "transaction")])).await;
    let pidfile = old.dir.pidfile();
    let port = old.port();
    let dsn = old.dsn("md5user");
    // A new connection (and login) per transaction, for 8 s.
    let bench_dsn = dsn.clone();
    let bench = tokio::task::spawn_blocking(move || {
        run_pgbench(&[
            "-n", "-C", "-S", "-T", "8", "-c", "8", "-j", "2", &bench_dsn,
        ])
    });
    assert!(
        eventually(Duration::from_secs(10), || async {
            xacts(port).await >= 500
        })
        .await,
        "no load through the first pgcarpool:\n{}",
        old.log()
    );
    let started = Instant::now();
    let mut new = old.start_successor(&["-R"]).await;
    // The new process takes the port over and sends the old one SIGTERM: it exits once
    // its clients (one transaction each) are gone.
    let status = old.exited_within(Duration::from_secs(10)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "the old pgcarpool did not finish: {status:?}\n--- old\n{}\n--- new\n{}",
        old.log(),
        new.log()
    );
    let switch = started.elapsed();
    assert!(new.running(), "the new pgcarpool died:\n{}", new.log());
    assert_eq!(
        pidfile_pid(&pidfile),
        new.pid().to_string(),
        "the pidfile does not name the new pgcarpool"
    );
    let out = bench.await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}", output_text(&out));
    assert!(!stderr.contains("aborted"), "{}", output_text(&out));
    assert_eq!(
        pgbench_number(&out, "number of failed transactions: "),
        Some(0),
        "{}",
        output_text(&out)
    );
    let total = pgbench_number(&out, "number of transactions actually processed: ").unwrap_or(0);
    // The new one carried the load after the switch.
    let after = xacts(port).await;
    eprintln!(
        "switch in {switch:?}; {total} transactions in all, {after} through the new pgcarpool"
    );
    assert!(after > 0, "nothing went through the new pgcarpool");
    new.signal(libc::SIGQUIT);
    assert!(new.exited_within(Duration::from_secs(5)).await.is_some());
    assert!(!pidfile.exists(), "the pidfile outlived the last pgcarpool");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_replaces_the_unix_socket_and_the_old_one_leaves_it() {
    let pg = TempPostgres::start();
    // The Unix socket lives in the first process's dir; its successor names the same one.
    let mut dir = ProcessDir::with_pidfile(reuseport_spec(&pg, &[("pool_mode", "session")]));
    let sockdir = dir.path().to_string_lossy().into_owned();
    dir.rewrite(|b| b.setting("unix_socket_dir", &sockdir));
    let mut old = PoolerProcess::start_in(dir, &[]).await;
    let pidfile = old.dir.pidfile();
    let port = old.port();
    let socket = Path::new(&sockdir).join(format!(".s.PGSQL.{port}"));
    let unix_dsn =
        format!("host={sockdir} port={port} user=md5user password=md5pass dbname=testdb");
    // A session client of the old process keeps it alive through the switch.
    let held = try_connect(&unix_dsn)
        .await
        .unwrap_or_else(|e| panic!("the first pgcarpool's Unix socket: {e}\n{}", old.log()));
    held.simple_query("select 1").await.unwrap();
    let mut new = old.start_successor(&["-R"]).await;
    assert_eq!(
        pidfile_pid(&pidfile),
        new.pid().to_string(),
        "the pidfile does not name the new pgcarpool"
    );
    try_connect(&unix_dsn)
        .await
        .unwrap_or_else(|e| panic!("the new pgcarpool's Unix socket: {e}\n{}", new.log()))
        .simple_query("select 1")
        .await
        .unwrap();
    // Told to hand its clients over (through its console, reached before the socket was
    // renamed), the old one keeps its session-mode client, which still works.
    assert!(
        eventually(Duration::from_secs(5), || async {
            old.log().contains("handing over idle clients")
        })
        .await,
        "the old pgcarpool was not told to finish:\n{}",
        old.log()
    );
    held.simple_query("select 2").await.unwrap();
    assert!(
        old.running(),
        "the old pgcarpool left with a client connected"
    );
    drop(held);
    let status = old.exited_within(Duration::from_secs(10)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "the old pgcarpool did not exit: {status:?}\n{}",
        old.log()
    );
    // The socket file is the new process's: still there, still served.
    assert!(socket.exists(), "the old pgcarpool removed the new socket");
    let c = try_connect(&unix_dsn)
        .await
        .unwrap_or_else(|e| panic!("Unix socket after the old one left: {e}\n{}", new.log()));
    c.simple_query("select 3").await.unwrap();
    drop(c);
    new.signal(libc::SIGQUIT);
    assert!(new.exited_within(Duration::from_secs(5)).await.is_some());
    assert!(
        !socket.exists(),
        "the last pgcarpool left its socket behind"
    );
}

/// The state letter of a process in /proc (R, S, T = stopped, Z…).
fn proc_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

/// Connections waiting in the listener's backlog when SIGTERM arrives.
const QUEUED: usize = 300;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_serves_the_connections_queued_on_the_listener() {
    let pg = TempPostgres::start();
    let mut old = start_first(reuseport_spec(
        &pg,
        &[
            ("pool_mode", "transaction"),
            ("max_client_conn", "1000"),
            // Room in the backlog for every queued connection (PgBouncer's default is 128),
            // and connections that have sent nothing yet in it too (TCP_DEFER_ACCEPT, on by
            // default as in PgBouncer, would keep them out of the accept queue).
            ("listen_backlog", "1024"),
            ("tcp_defer_accept", "0"),
        ],
    ))
    .await;
    let port = old.port();
    let dsn = old.dsn("md5user");
    // Stopped, it accepts nothing: connections the kernel completes wait in its backlog.
    old.signal(libc::SIGSTOP);
    assert!(
        eventually(Duration::from_secs(5), || async {
            proc_state(old.pid()) == Some('T')
        })
        .await,
        "pgcarpool did not stop"
    );
    let mut queued = Vec::new();
    // More than tokio's cooperative budget (128): accepting them all takes the accept loop
    // more than one turn, so SIGTERM is acted on while some are still queued.
    for _ in 0..QUEUED {
        queued.push(
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .expect("connect to the backlog"),
        );
    }
    // SIGTERM arrives with QUEUED connections waiting; they must be served, not reset.
    old.signal(libc::SIGTERM);
    old.signal(libc::SIGCONT);
    let config: tokio_postgres::Config = dsn.parse().unwrap();
    let mut clients = Vec::new();
    for (i, stream) in queued.into_iter().enumerate() {
        let (client, conn) = config
            .connect_raw(stream, tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("queued connection {i}: {e}\n{}", old.log()));
        tokio::spawn(conn);
        client
            .simple_query("select 1")
            .await
            .unwrap_or_else(|e| panic!("queued client {i}: {e}\n{}", old.log()));
        clients.push(client);
    }
    assert!(old.running(), "exited with clients connected");
    drop(clients);
    let status = old.exited_within(Duration::from_secs(10)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "did not exit after its clients left: {status:?}\n{}",
        old.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_takeover_every_new_connection_goes_to_the_new_process() {
    let pg = TempPostgres::start();
    let mut old = start_first(reuseport_spec(&pg, &[("pool_mode", "transaction")])).await;
    let dsn = old.dsn("md5user");
    // Stopped, the old process would leave any connection the kernel gave it unanswered.
    old.signal(libc::SIGSTOP);
    assert!(
        eventually(Duration::from_secs(5), || async {
            proc_state(old.pid()) == Some('T')
        })
        .await,
        "pgcarpool did not stop"
    );
    let new = old.start_successor(&["-R"]).await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            new.log().contains("asking it to finish")
        })
        .await,
        "the new pgcarpool did not take over:\n{}",
        new.log()
    );
    // SO_REUSEPORT alone would hash about half of these to the stopped process.
    for i in 0..40 {
        let c = tokio::time::timeout(Duration::from_secs(5), try_connect(&dsn))
            .await
            .unwrap_or_else(|_| panic!("connection {i} went to the old process"))
            .unwrap_or_else(|e| panic!("connection {i}: {e}\n{}", new.log()));
        c.simple_query("select 1").await.unwrap();
    }
    old.signal(libc::SIGCONT);
    let status = old.exited_within(Duration::from_secs(10)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "the old pgcarpool did not finish: {status:?}\n{}",
        old.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_logs_each_changed_setting_and_those_needing_a_restart() {
    let pg = TempPostgres::start();
    let mut p = start_first(reuseport_spec(&pg, &[("default_pool_size", "3")])).await;
    let dsn = p.dsn("md5user");
    // listen_port = 0 in force (the harness's); the new value is never bound.
    let other_port = p.port().wrapping_add(1).max(1);
    p.dir.rewrite(|b| {
        b.setting("listen_port", &other_port.to_string())
            .setting("default_pool_size", "8")
    });
    p.signal(libc::SIGHUP);
    assert!(
        eventually(Duration::from_secs(5), || async {
            p.log().contains("configuration reloaded")
        })
        .await,
        "no reload logged:\n{}",
        p.log()
    );
    let log = p.log();
    assert!(
        log.contains("reload: default_pool_size: \"3\" -> \"8\""),
        "{log}"
    );
    assert!(
        log.contains(&format!(
            "reload: listen_port: \"0\" -> \"{other_port}\" (needs a restart: keeping \"0\")"
        )),
        "{log}"
    );
    // Still on the old port.
    try_connect(&dsn)
        .await
        .unwrap()
        .simple_query("select 1")
        .await
        .unwrap();
    p.signal(libc::SIGQUIT);
    assert!(p.exited_within(Duration::from_secs(5)).await.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_takeover_leaves_the_running_one_in_charge() {
    let pg = TempPostgres::start();
    // Without so_reuseport the port cannot be shared: -R cannot bind it.
    let mut old = start_first(reuseport_spec(&pg, &[("so_reuseport", "0")])).await;
    let pidfile = old.dir.pidfile();
    let dsn = old.dsn("md5user");
    let out = old.successor_dir().run(&["-R"]);
    assert!(
        !out.status.success(),
        "-R on a port without SO_REUSEPORT: {}",
        output_text(&out)
    );
    assert!(old.running(), "the running pgcarpool was stopped");
    assert_eq!(
        pidfile_pid(&pidfile),
        old.pid().to_string(),
        "the pidfile no longer names the running pgcarpool"
    );
    try_connect(&dsn)
        .await
        .unwrap()
        .simple_query("select 1")
        .await
        .unwrap();
    old.signal(libc::SIGQUIT);
    assert!(old.exited_within(Duration::from_secs(5)).await.is_some());
}
