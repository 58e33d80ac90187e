//! Online restart: a second pgcarpool started with `-R` takes over the listening sockets of
//! the running one (SO_REUSEPORT plus a reuseport BPF program for TCP, an atomic rename for
//! the Unix socket) and sends it SIGTERM; the old one finishes its clients' work and exits.
//! Clients see no refused or reset connection. Each test runs the real binary on a free port
//! and stops what it started by PID.
mod harness;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use harness::{TEST_ROLES, TempPostgres, dsn_for, free_port, run_pgbench, try_connect};
use tokio_postgres::SimpleQueryMessage;

const BIN: &str = env!("CARGO_BIN_EXE_pgcarpool");

/// Poll `check` every 20 ms until it is true or `limit` passes.
async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// pgbouncer.ini and userlist.txt in `dir` for `pg` on 127.0.0.1:`port`, with
/// so_reuseport = 1 and a pidfile, plus `extra` lines in [pgbouncer].
fn write_config(dir: &Path, pg: &TempPostgres, port: u16, extra: &[(&str, &str)]) -> PathBuf {
    let mut ini = format!(
        "[databases]\n* = host=127.0.0.1 port={}\n\n[pgbouncer]\n\
         listen_addr = 127.0.0.1\nlisten_port = {port}\n\
         auth_type = md5\nauth_file = userlist.txt\nadmin_users = postgres\n\
         so_reuseport = 1\npidfile = {}\n",
        pg.port(),
        dir.join("pgcarpool.pid").display()
    );
    if !extra.iter().any(|(k, _)| *k == "unix_socket_dir") {
        ini.push_str("unix_socket_dir =\n");
    }
    for (k, v) in extra {
        ini.push_str(&format!("{k} = {v}\n"));
    }
    let userlist: String = TEST_ROLES
        .iter()
        .map(|(u, p)| format!("\"{u}\" \"{p}\"\n"))
        .collect();
    std::fs::write(dir.join("userlist.txt"), userlist).unwrap();
    let path = dir.join("pgbouncer.ini");
    std::fs::write(&path, ini).unwrap();
    path
}

/// One pgcarpool process; SIGKILLed by PID if the test ends while it runs.
struct Proc {
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn spawn(ini: &Path, args: &[&str], log_name: &str) -> Proc {
        let log = ini.with_file_name(log_name);
        let stderr = std::fs::File::create(&log).unwrap();
        // As root: -u postgres, with the files given to that user.
        harness::process::give_to_pooler(ini.parent().expect("config dir"));
        let child = Command::new(BIN)
            .args(harness::process::user_args())
            .args(args)
            .arg(ini)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn pgcarpool");
        Proc { child, log }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn exited_within(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    fn signal(&self, sig: libc::c_int) {
        let pid = i32::try_from(self.pid()).unwrap();
        // SAFETY: kill(2) on a PID this test started.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- pgcarpool {} ---\n{}", self.child.id(), self.log());
        }
    }
}

/// Wait until the pidfile names `pid` and `dsn` accepts a login.
async fn wait_serving(pidfile: &Path, pid: u32, dsn: &str) -> bool {
    eventually(Duration::from_secs(10), || async {
        std::fs::read_to_string(pidfile).unwrap_or_default().trim() == pid.to_string()
            && try_connect(dsn).await.is_ok()
    })
    .await
}

fn text(out: &Output) -> String {
    format!(
        "status {}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn pgbench_number(out: &Output, prefix: &str) -> Option<u64> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|rest| rest.split(['/', ' ']).next())
        .and_then(|n| n.parse().ok())
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
    assert!(init.status.success(), "pgbench -i: {}", text(&init));
    let dir = tempfile::Builder::new()
        .prefix("pgcarpool-restart-")
        .tempdir()
        .unwrap();
    let port = free_port();
    let ini = write_config(dir.path(), &pg, port, &[("pool_mode", "transaction")]);
    let pidfile = dir.path().join("pgcarpool.pid");
    let dsn = dsn_for(port, "md5user", "testdb");
    let mut old = Proc::spawn(&ini, &[], "old.log");
    assert!(
        wait_serving(&pidfile, old.pid(), &dsn).await,
        "the first pgcarpool does not serve:\n{}",
        old.log()
    );
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
    let mut new = Proc::spawn(&ini, &["-R"], "new.log");
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
        std::fs::read_to_string(&pidfile).unwrap().trim(),
        new.pid().to_string(),
        "the pidfile does not name the new pgcarpool"
    );
    let out = bench.await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!stderr.contains("aborted"), "{}", text(&out));
    assert_eq!(
        pgbench_number(&out, "number of failed transactions: "),
        Some(0),
        "{}",
        text(&out)
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
    let dir = tempfile::Builder::new()
        .prefix("pgcarpool-restart-")
        .tempdir()
        .unwrap();
    let port = free_port();
    let sockdir = dir.path().to_string_lossy().into_owned();
    let ini = write_config(
        dir.path(),
        &pg,
        port,
        &[("pool_mode", "session"), ("unix_socket_dir", &sockdir)],
    );
    let pidfile = dir.path().join("pgcarpool.pid");
    let socket = dir.path().join(format!(".s.PGSQL.{port}"));
    let unix_dsn =
        format!("host={sockdir} port={port} user=md5user password=md5pass dbname=testdb");
    let mut old = Proc::spawn(&ini, &[], "old.log");
    assert!(
        wait_serving(&pidfile, old.pid(), &unix_dsn).await,
        "the first pgcarpool does not serve on its Unix socket:\n{}",
        old.log()
    );
    // A session client of the old process keeps it alive through the switch.
    let held = try_connect(&unix_dsn).await.unwrap();
    held.simple_query("select 1").await.unwrap();
    let mut new = Proc::spawn(&ini, &["-R"], "new.log");
    assert!(
        wait_serving(&pidfile, new.pid(), &unix_dsn).await,
        "the new pgcarpool does not serve on the Unix socket:\n--- old\n{}\n--- new\n{}",
        old.log(),
        new.log()
    );
    // Told to finish, the old one waits for its client, which still works.
    assert!(
        eventually(Duration::from_secs(5), || async {
            old.log().contains("SIGTERM")
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
fn proc_state(pid: u32) -> Option<char> {
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
    let dir = tempfile::Builder::new()
        .prefix("pgcarpool-restart-")
        .tempdir()
        .unwrap();
    let port = free_port();
    let ini = write_config(
        dir.path(),
        &pg,
        port,
        &[("pool_mode", "transaction"), ("max_client_conn", "1000")],
    );
    let pidfile = dir.path().join("pgcarpool.pid");
    let dsn = dsn_for(port, "md5user", "testdb");
    let mut old = Proc::spawn(&ini, &[], "old.log");
    assert!(
        wait_serving(&pidfile, old.pid(), &dsn).await,
        "pgcarpool does not serve:\n{}",
        old.log()
    );
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
    let dir = tempfile::Builder::new()
        .prefix("pgcarpool-restart-")
        .tempdir()
        .unwrap();
    let port = free_port();
    let ini = write_config(dir.path(), &pg, port, &[("pool_mode", "transaction")]);
    let pidfile = dir.path().join("pgcarpool.pid");
    let dsn = dsn_for(port, "md5user", "testdb");
    let mut old = Proc::spawn(&ini, &[], "old.log");
    assert!(
        wait_serving(&pidfile, old.pid(), &dsn).await,
        "the first pgcarpool does not serve:\n{}",
        old.log()
    );
    // Stopped, the old process would leave any connection the kernel gave it unanswered.
    old.signal(libc::SIGSTOP);
    assert!(
        eventually(Duration::from_secs(5), || async {
            proc_state(old.pid()) == Some('T')
        })
        .await,
        "pgcarpool did not stop"
    );
    let new = Proc::spawn(&ini, &["-R"], "new.log");
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
    let dir = tempfile::Builder::new()
        .prefix("pgcarpool-restart-")
        .tempdir()
        .unwrap();
    let port = free_port();
    let ini = write_config(dir.path(), &pg, port, &[("default_pool_size", "3")]);
    let pidfile = dir.path().join("pgcarpool.pid");
    let dsn = dsn_for(port, "md5user", "testdb");
    let p = Proc::spawn(&ini, &[], "pgcarpool.log");
    assert!(
        wait_serving(&pidfile, p.pid(), &dsn).await,
        "pgcarpool does not serve:\n{}",
        p.log()
    );
    let other_port = free_port();
    write_config(dir.path(), &pg, other_port, &[("default_pool_size", "8")]);
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
            "reload: listen_port: \"{port}\" -> \"{other_port}\" (needs a restart: keeping \"{port}\")"
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_takeover_leaves_the_running_one_in_charge() {
    let pg = TempPostgres::start();
    let dir = tempfile::Builder::new()
        .prefix("pgcarpool-restart-")
        .tempdir()
        .unwrap();
    let port = free_port();
    // Without so_reuseport the port cannot be shared: -R cannot bind it.
    let ini = write_config(dir.path(), &pg, port, &[("so_reuseport", "0")]);
    let pidfile = dir.path().join("pgcarpool.pid");
    let dsn = dsn_for(port, "md5user", "testdb");
    let mut old = Proc::spawn(&ini, &[], "old.log");
    assert!(
        wait_serving(&pidfile, old.pid(), &dsn).await,
        "the first pgcarpool does not serve:\n{}",
        old.log()
    );
    let mut new = Proc::spawn(&ini, &["-R"], "new.log");
    let status = new.exited_within(Duration::from_secs(10)).await;
    assert!(
        status.is_some_and(|s| !s.success()),
        "-R on a port without SO_REUSEPORT: {status:?}\n{}",
        new.log()
    );
    assert!(old.running(), "the running pgcarpool was stopped");
    assert_eq!(
        std::fs::read_to_string(&pidfile).unwrap_or_default().trim(),
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
