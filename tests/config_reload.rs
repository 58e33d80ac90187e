//! The pgcarpool binary as PgBouncer is run: config errors with file:line, SIGHUP reload,
//! the shutdown and pause signals, `-d`, `-V` and `-h`. Each test starts its own child
//! process on a free port and stops it by its PID.
mod harness;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::{TEST_ROLES, TempPostgres, dsn_for, free_port, try_connect};

const BIN: &str = env!("CARGO_BIN_EXE_pgcarpool");

/// A pgbouncer.ini for `pg` on 127.0.0.1:`port`, with `extra` lines in [pgbouncer].
fn ini_text(pg: &TempPostgres, port: u16, extra: &[(&str, &str)]) -> String {
    let mut ini = format!(
        "[databases]\n* = host=127.0.0.1 port={}\n\n[pgbouncer]\n\
         listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
         auth_type = md5\nauth_file = userlist.txt\nadmin_users = postgres\n",
        pg.port()
    );
    for (k, v) in extra {
        ini.push_str(&format!("{k} = {v}\n"));
    }
    ini
}

fn write_files(dir: &Path, ini: &str) -> PathBuf {
    let userlist: String = TEST_ROLES
        .iter()
        .map(|(u, p)| format!("\"{u}\" \"{p}\"\n"))
        .collect();
    std::fs::write(dir.join("userlist.txt"), userlist).unwrap();
    let path = dir.join("pgbouncer.ini");
    std::fs::write(&path, ini).unwrap();
    path
}

fn send(pid: i32, sig: libc::c_int) {
    // SAFETY: kill(2) on a PID this test started.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(
        rc,
        0,
        "kill({pid}, {sig}): {}",
        std::io::Error::last_os_error()
    );
}

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

/// pgcarpool running as a child process; killed (SIGKILL, by PID) if the test ends first.
struct Pooler {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
    ini: PathBuf,
}

impl Pooler {
    async fn start(pg: &TempPostgres, extra: &[(&str, &str)]) -> Pooler {
        Pooler::start_with(|port| ini_text(pg, port, extra)).await
    }

    /// Start with the pgbouncer.ini `ini(port)` returns.
    async fn start_with(ini: impl FnOnce(u16) -> String) -> Pooler {
        let dir = tempfile::Builder::new()
            .prefix("pgcarpool-bin-")
            .tempdir()
            .unwrap();
        let port = free_port();
        let ini = write_files(dir.path(), &ini(port));
        let stderr = std::fs::File::create(dir.path().join("stderr.log")).unwrap();
        let child = Command::new(BIN)
            .arg(&ini)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn pgcarpool");
        let mut p = Pooler {
            child,
            port,
            dir,
            ini,
        };
        let up = eventually(Duration::from_secs(10), || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        })
        .await;
        if !up {
            panic!(
                "pgcarpool did not listen on {port} (exit: {:?})\n{}",
                p.child.try_wait(),
                p.log()
            );
        }
        p
    }

    fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap()
    }

    fn signal(&self, sig: libc::c_int) {
        send(self.pid(), sig);
    }

    fn dsn(&self, user: &str) -> String {
        dsn_for(self.port, user, "testdb")
    }

    async fn connect(&self, user: &str) -> tokio_postgres::Client {
        try_connect(&self.dsn(user))
            .await
            .unwrap_or_else(|e| panic!("connect through pgcarpool: {e}\n{}", self.log()))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default()
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Wait (bounded) for the process to exit.
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

    /// Wait until the listener is gone (a signal to shut down has been acted on).
    async fn stops_accepting(&self) -> bool {
        let port = self.port;
        eventually(Duration::from_secs(5), || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_err()
        })
        .await
    }
}

impl Drop for Pooler {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- pgcarpool's stderr ---\n{}", self.log());
        }
    }
}

/// md5user's client backends as PostgreSQL sees them.
async fn backends(monitor: &tokio_postgres::Client) -> i64 {
    monitor
        .query_one(
            "select count(*) from pg_stat_activity where usename = 'md5user' \
             and backend_type = 'client backend'",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

#[test]
fn bad_config_line_is_reported_with_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let ini = "[databases]\n\
               * = host=127.0.0.1 port=5432\n\
               \n\
               [pgbouncer]\n\
               listen_port = 6432\n\
               default_pool_size = lots\n";
    let path = write_files(dir.path(), ini);
    let out = Command::new(BIN).arg(&path).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted a bad config: {stderr}");
    assert!(
        stderr.contains("pgbouncer.ini:6"),
        "no file:line in the error: {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_changes_the_pool_size_live() {
    let pg = TempPostgres::start();
    let p = Pooler::start(
        &pg,
        &[("pool_mode", "transaction"), ("default_pool_size", "2")],
    )
    .await;
    let monitor = pg.connect("postgres", "postgres").await;
    // Four clients each open a transaction: two get servers, two wait.
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let c = p.connect("md5user").await;
        tasks.push(tokio::spawn(async move {
            c.simple_query("begin; select 1").await.unwrap();
            c
        }));
    }
    let done = |tasks: &Vec<tokio::task::JoinHandle<tokio_postgres::Client>>| {
        tasks.iter().filter(|t| t.is_finished()).count()
    };
    assert!(
        eventually(Duration::from_secs(10), || async {
            backends(&monitor).await == 2 && done(&tasks) == 2
        })
        .await,
        "expected 2 backends and 2 clients in transactions"
    );
    std::fs::write(
        &p.ini,
        ini_text(
            &pg,
            p.port,
            &[("pool_mode", "transaction"), ("default_pool_size", "4")],
        ),
    )
    .unwrap();
    p.signal(libc::SIGHUP);
    let grew = eventually(Duration::from_secs(5), || async {
        backends(&monitor).await == 4 && done(&tasks) == 4
    })
    .await;
    assert!(
        grew,
        "after SIGHUP: {} backends, {} clients served",
        backends(&monitor).await,
        done(&tasks)
    );
    // The clients connected before the reload keep working.
    for t in tasks {
        let c = t.await.unwrap();
        c.simple_query("select 2").await.unwrap();
        c.simple_query("commit").await.unwrap();
        c.simple_query("select 3").await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_waits_for_clients_to_leave() {
    let pg = TempPostgres::start();
    let mut p = Pooler::start(&pg, &[("pool_mode", "session")]).await;
    let c = p.connect("md5user").await;
    c.simple_query("select 1").await.unwrap();
    p.signal(libc::SIGTERM);
    assert!(p.stops_accepting().await, "still accepting after SIGTERM");
    // Still running and serving the connected client.
    c.simple_query("select 2").await.unwrap();
    assert!(p.running(), "exited with a client connected");
    drop(c);
    let status = p.exited_within(Duration::from_secs(5)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "did not exit cleanly after the last client left: {status:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_waits_for_servers_to_be_released() {
    let pg = TempPostgres::start();
    let mut p = Pooler::start(&pg, &[("pool_mode", "transaction")]).await;
    let c = p.connect("md5user").await;
    c.simple_query("begin").await.unwrap();
    p.signal(libc::SIGINT);
    assert!(p.stops_accepting().await, "still accepting after SIGINT");
    // The transaction in progress may finish.
    c.simple_query("select 1").await.unwrap();
    assert!(p.running(), "exited while a server was in use");
    c.simple_query("commit").await.unwrap();
    // Once the server is released it exits, though the client is still connected.
    let status = p.exited_within(Duration::from_secs(5)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "did not exit after the server was released: {status:?}"
    );
    drop(c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigquit_exits_at_once() {
    let pg = TempPostgres::start();
    let mut p = Pooler::start(&pg, &[("pool_mode", "transaction")]).await;
    let c = p.connect("md5user").await;
    c.simple_query("begin").await.unwrap();
    p.signal(libc::SIGQUIT);
    let status = p.exited_within(Duration::from_secs(2)).await;
    assert!(
        status.is_some(),
        "still running 2 s after SIGQUIT with a client in a transaction"
    );
    drop(c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigusr1_pauses_and_sigusr2_resumes() {
    let pg = TempPostgres::start();
    let p = Pooler::start(&pg, &[("pool_mode", "transaction")]).await;
    let c = Arc::new(p.connect("md5user").await);
    c.simple_query("select 1").await.unwrap();
    p.signal(libc::SIGUSR1);
    // Once the pause is in force, a new query waits.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut waiting = loop {
        let c2 = c.clone();
        let mut q = tokio::spawn(async move { c2.simple_query("select 'after pause'").await });
        match tokio::time::timeout(Duration::from_millis(300), &mut q).await {
            Ok(r) => r.unwrap().map(drop).unwrap(),
            Err(_) => break q,
        }
        assert!(Instant::now() < deadline, "queries still run after SIGUSR1");
    };
    assert!(!waiting.is_finished());
    p.signal(libc::SIGUSR2);
    let resumed = tokio::time::timeout(Duration::from_secs(2), &mut waiting)
        .await
        .expect("the waiting query did not run within 2 s of SIGUSR2")
        .unwrap();
    resumed.expect("query after resume");
    c.simple_query("select 2").await.unwrap();
}

/// Whether a process with this PID is alive (not gone, not a zombie).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // Field 3 is the state; Z = zombie, X = dead.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Stops a daemon by PID (SIGKILL) if the test ends while it runs.
struct DaemonGuard(Option<i32>);

impl Drop for DaemonGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.0
            && alive(pid)
        {
            // SAFETY: kill(2) on the PID our daemon wrote to its pidfile.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dash_d_daemonizes_and_writes_the_pidfile() {
    let pg = TempPostgres::start();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let pidfile = dir.path().join("pgcarpool.pid");
    let logfile = dir.path().join("pgcarpool.log");
    let ini = write_files(
        dir.path(),
        &ini_text(
            &pg,
            port,
            &[
                ("pidfile", &pidfile.to_string_lossy()),
                ("logfile", &logfile.to_string_lossy()),
            ],
        ),
    );
    let status = Command::new(BIN)
        .arg("-d")
        .arg(&ini)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "pgcarpool -d: {status}");
    let mut guard = DaemonGuard(None);
    let pid_file_text = || std::fs::read_to_string(&pidfile).unwrap_or_default();
    assert!(
        eventually(Duration::from_secs(10), || async {
            pid_file_text().trim().parse::<i32>().is_ok()
        })
        .await,
        "no pidfile; log:\n{}",
        std::fs::read_to_string(&logfile).unwrap_or_default()
    );
    let pid: i32 = pid_file_text().trim().parse().unwrap();
    guard.0 = Some(pid);
    assert!(alive(pid), "the daemon {pid} is not running");
    // The foreground command has exited; the daemon serves.
    let up = eventually(Duration::from_secs(10), || async {
        try_connect(&dsn_for(port, "md5user", "testdb"))
            .await
            .is_ok()
    })
    .await;
    assert!(up, "the daemon does not serve on {port}");
    let c = try_connect(&dsn_for(port, "md5user", "testdb"))
        .await
        .unwrap();
    c.simple_query("select 1").await.unwrap();
    drop(c);
    send(pid, libc::SIGQUIT);
    assert!(
        eventually(Duration::from_secs(5), || async {
            !alive(pid) && !pidfile.exists()
        })
        .await,
        "the daemon did not stop and remove its pidfile"
    );
    guard.0 = None;
}

#[test]
fn dash_capital_v_prints_the_version() {
    let out = Command::new(BIN).arg("-V").output().unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(env!("CARGO_PKG_VERSION")),
        "no version in: {stdout}"
    );
}

#[test]
fn dash_h_prints_usage() {
    let out = Command::new(BIN).arg("-h").output().unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("Usage") && stdout.contains("-d") && stdout.contains("-R"),
        "not a usage text: {stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_shrinking_the_pool_closes_servers_beyond_the_new_size() {
    let pg = TempPostgres::start();
    let p = Pooler::start(
        &pg,
        &[("pool_mode", "transaction"), ("default_pool_size", "4")],
    )
    .await;
    let monitor = pg.connect("postgres", "postgres").await;
    let mut clients = Vec::new();
    for _ in 0..4 {
        let c = p.connect("md5user").await;
        c.simple_query("begin; select 1").await.unwrap();
        clients.push(c);
    }
    assert_eq!(backends(&monitor).await, 4);
    // Two servers go back idle before the reload, two are still in use.
    clients[0].simple_query("commit").await.unwrap();
    clients[1].simple_query("commit").await.unwrap();
    std::fs::write(
        &p.ini,
        ini_text(
            &pg,
            p.port,
            &[("pool_mode", "transaction"), ("default_pool_size", "1")],
        ),
    )
    .unwrap();
    p.signal(libc::SIGHUP);
    clients[2].simple_query("commit").await.unwrap();
    clients[3].simple_query("commit").await.unwrap();
    let shrunk = eventually(Duration::from_secs(5), || async {
        backends(&monitor).await == 1
    })
    .await;
    assert!(
        shrunk,
        "after SIGHUP to a pool of 1: {} backends",
        backends(&monitor).await
    );
    for c in &clients {
        c.simple_query("select 2").await.unwrap();
    }
    assert_eq!(backends(&monitor).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_with_a_bad_config_keeps_the_old_one() {
    let pg = TempPostgres::start();
    let mut p = Pooler::start(
        &pg,
        &[("pool_mode", "transaction"), ("default_pool_size", "2")],
    )
    .await;
    let monitor = pg.connect("postgres", "postgres").await;
    let c = p.connect("md5user").await;
    std::fs::write(
        &p.ini,
        ini_text(
            &pg,
            p.port,
            &[("pool_mode", "transaction"), ("default_pool_size", "many")],
        ),
    )
    .unwrap();
    p.signal(libc::SIGHUP);
    let log_path = p.dir.path().join("stderr.log");
    let logged = eventually(Duration::from_secs(5), || async {
        std::fs::read_to_string(&log_path)
            .unwrap_or_default()
            .contains("keeping the old configuration")
    })
    .await;
    assert!(logged, "the failed reload was not logged:\n{}", p.log());
    assert!(p.running());
    // Still the old pool size of 2: three clients in transactions use only two servers.
    let others = [p.connect("md5user").await, p.connect("md5user").await];
    c.simple_query("begin; select 1").await.unwrap();
    others[0].simple_query("begin; select 1").await.unwrap();
    let third = tokio::spawn({
        let dsn = p.dsn("md5user");
        async move {
            let c3 = try_connect(&dsn).await.unwrap();
            c3.simple_query("select 1").await.unwrap();
        }
    });
    assert_eq!(backends(&monitor).await, 2);
    assert!(!third.is_finished());
    c.simple_query("commit").await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), third)
        .await
        .expect("the waiting client was not served")
        .unwrap();
    others[0].simple_query("commit").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_sigterm_exits_at_once() {
    let pg = TempPostgres::start();
    let mut p = Pooler::start(&pg, &[("pool_mode", "session")]).await;
    let c = p.connect("md5user").await;
    c.simple_query("select 1").await.unwrap();
    p.signal(libc::SIGTERM);
    assert!(p.stops_accepting().await, "still accepting after SIGTERM");
    c.simple_query("select 2").await.unwrap();
    p.signal(libc::SIGTERM);
    let status = p.exited_within(Duration::from_secs(2)).await;
    assert!(
        status.is_some(),
        "still running 2 s after a second SIGTERM with a client connected"
    );
    drop(c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigusr1_lets_open_transactions_finish() {
    let pg = TempPostgres::start();
    let p = Pooler::start(&pg, &[("pool_mode", "transaction")]).await;
    let in_tx = p.connect("md5user").await;
    let other = Arc::new(p.connect("md5user").await);
    in_tx.simple_query("begin; select 1").await.unwrap();
    other.simple_query("select 1").await.unwrap();
    p.signal(libc::SIGUSR1);
    // Wait until the pause holds new work back.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut waiting = loop {
        let c2 = other.clone();
        let mut q = tokio::spawn(async move { c2.simple_query("select 'after pause'").await });
        match tokio::time::timeout(Duration::from_millis(300), &mut q).await {
            Ok(r) => r.unwrap().map(drop).unwrap(),
            Err(_) => break q,
        }
        assert!(Instant::now() < deadline, "queries still run after SIGUSR1");
    };
    // The transaction that holds a server goes on and ends.
    in_tx.simple_query("select 2").await.unwrap();
    in_tx.simple_query("commit").await.unwrap();
    assert!(!waiting.is_finished(), "ran while paused");
    p.signal(libc::SIGUSR2);
    tokio::time::timeout(Duration::from_secs(2), &mut waiting)
        .await
        .expect("the waiting query did not run after SIGUSR2")
        .unwrap()
        .unwrap();
}

/// A pgbouncer.ini whose database `app` points at database `target` of `pg`.
fn alias_ini(pg: &TempPostgres, port: u16, target: &str) -> String {
    format!(
        "[databases]\napp = host=127.0.0.1 port={} dbname={target}\n\n[pgbouncer]\n\
         listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
         auth_type = md5\nauth_file = userlist.txt\npool_mode = transaction\n\
         default_pool_size = 1\n",
        pg.port()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_retargeting_a_database_retires_servers_in_use() {
    let pg = TempPostgres::start();
    let p = Pooler::start_with(|port| alias_ini(&pg, port, "testdb")).await;
    let dsn = dsn_for(p.port, "md5user", "app");
    let holder = try_connect(&dsn).await.unwrap();
    holder.simple_query("begin; select 1").await.unwrap();
    // While the pool's only server is in use, `app` is pointed at another database.
    std::fs::write(&p.ini, alias_ini(&pg, p.port, "postgres")).unwrap();
    p.signal(libc::SIGHUP);
    let log_path = p.dir.path().join("stderr.log");
    let reloaded = eventually(Duration::from_secs(5), || async {
        std::fs::read_to_string(&log_path)
            .unwrap_or_default()
            .contains("configuration reloaded")
    })
    .await;
    assert!(reloaded, "no reload logged:\n{}", p.log());
    holder.simple_query("commit").await.unwrap();
    // Every transaction from now on runs on the new database.
    for _ in 0..3 {
        let c = try_connect(&dsn).await.unwrap();
        let row = c
            .query_one("select current_database()::text", &[])
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>(0), "postgres");
    }
    let row = holder
        .query_one("select current_database()::text", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "postgres");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_rereads_the_auth_file() {
    let pg = TempPostgres::start();
    pg.psql("create role newuser login password 'newpass'");
    let p = Pooler::start(&pg, &[("pool_mode", "transaction")]).await;
    let dsn = harness::dsn_with_password(p.port, "newuser", Some("newpass"), "testdb");
    let refused = try_connect(&dsn)
        .await
        .expect_err("a user missing from auth_file logged in");
    assert_eq!(harness::sqlstate(&refused), Some("28P01"), "{refused:?}");
    let userlist = p.dir.path().join("userlist.txt");
    let mut text = std::fs::read_to_string(&userlist).unwrap();
    text.push_str("\"newuser\" \"newpass\"\n");
    std::fs::write(&userlist, text).unwrap();
    p.signal(libc::SIGHUP);
    let admitted = eventually(Duration::from_secs(5), || async {
        try_connect(&dsn).await.is_ok()
    })
    .await;
    assert!(admitted, "newuser still refused after SIGHUP:\n{}", p.log());
    let c = try_connect(&dsn).await.unwrap();
    let row = c.query_one("select current_user::text", &[]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), "newuser");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_after_a_password_change_logs_in_to_new_servers_with_it() {
    let pg = TempPostgres::start();
    pg.psql("create role rotating login password 'before'");
    let p = Pooler::start(&pg, &[("pool_mode", "transaction")]).await;
    let userlist = p.dir.path().join("userlist.txt");
    let original = std::fs::read_to_string(&userlist).unwrap();
    std::fs::write(&userlist, format!("{original}\"rotating\" \"before\"\n")).unwrap();
    p.signal(libc::SIGHUP);
    let old_dsn = harness::dsn_with_password(p.port, "rotating", Some("before"), "testdb");
    assert!(
        eventually(Duration::from_secs(5), || async {
            match try_connect(&old_dsn).await {
                Ok(c) => c.simple_query("select 1").await.is_ok(),
                Err(_) => false,
            }
        })
        .await,
        "rotating never logged in:\n{}",
        p.log()
    );
    // The password changes in PostgreSQL and in auth_file; the pool's server goes away.
    pg.psql("alter role rotating password 'after'");
    std::fs::write(&userlist, format!("{original}\"rotating\" \"after\"\n")).unwrap();
    p.signal(libc::SIGHUP);
    pg.psql("select pg_terminate_backend(pid) from pg_stat_activity where usename = 'rotating'");
    let new_dsn = harness::dsn_with_password(p.port, "rotating", Some("after"), "testdb");
    let last = std::sync::Mutex::new(String::new());
    let ok = eventually(Duration::from_secs(5), || {
        let new_dsn = new_dsn.clone();
        let last = &last;
        async move {
            match try_connect(&new_dsn).await {
                Ok(c) => match c.simple_query("select 1").await {
                    Ok(_) => true,
                    Err(e) => {
                        *last.lock().unwrap() = format!("query: {e:?}");
                        false
                    }
                },
                Err(e) => {
                    *last.lock().unwrap() = format!("connect: {e:?}");
                    false
                }
            }
        }
    })
    .await;
    assert!(
        ok,
        "new password never worked: {}\n{}",
        last.lock().unwrap(),
        p.log()
    );
}

#[test]
fn dash_d_without_pidfile_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ini = "[databases]\n* = host=127.0.0.1 port=5432\n\n[pgbouncer]\n\
               listen_addr = 127.0.0.1\nlisten_port = 6432\nauth_type = trust\n";
    let path = write_files(dir.path(), ini);
    let out = Command::new(BIN).arg("-d").arg(&path).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "daemonized without a pidfile");
    assert!(stderr.contains("pidfile"), "unclear error: {stderr}");
}
