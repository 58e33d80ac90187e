//! pgcarpool as a service, as PgBouncer runs: `-d` checks everything before it forks
//! (pidfile, listening sockets) and fails on the terminal with a non-zero exit; systemd
//! `Type=notify` readiness and socket activation; the logfile reopened on reload (log
//! rotation); syslog; stderr and logfile both; `-v`; never as root. Each test runs the
//! real binary (tests/harness/process.rs) in a temp dir of its own.
mod harness;

use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use harness::process::{
    BIN, PoolerProcess, ProcessDir, alive, field, give_to_pooler, pidfile_pid, pooler_os_user,
    port_in_status, send_signal, wait_ready,
};
use harness::{TempPostgres, TestPooler, dsn_for, eventually, output_text, read_text, try_connect};

fn dir_path(p: &PoolerProcess) -> std::path::PathBuf {
    p.dir.path().to_path_buf()
}

fn pid_in(pidfile: &Path) -> Option<i32> {
    pidfile_pid(pidfile).parse().ok()
}

/// A daemon started by a test: SIGKILLed by PID if the test ends while it runs.
struct Daemon(i32);

impl Drop for Daemon {
    fn drop(&mut self) {
        if alive(self.0) {
            send_signal(self.0, libc::SIGKILL);
        }
    }
}

/// Run `pgcarpool -d` on `dir` and wait for the daemon's READY=1; the daemon's PID (from
/// MAINPID, checked against the pidfile) and port.
async fn start_daemon(dir: &ProcessDir) -> (Daemon, u16) {
    let notify = dir.notify_socket();
    let mut cmd = dir.command(&["-d"]);
    cmd.env("NOTIFY_SOCKET", dir.path().join("notify.sock"));
    let out = cmd.output().expect("run pgcarpool -d");
    assert!(out.status.success(), "pgcarpool -d: {}", output_text(&out));
    let ready = wait_ready(&notify, Duration::from_secs(20))
        .await
        .expect("the daemon never reported READY=1");
    let pid: i32 = field(&ready, "MAINPID")
        .and_then(|p| p.parse().ok())
        .expect("MAINPID in READY");
    let port = port_in_status(field(&ready, "STATUS").unwrap_or_default()).expect("a port");
    (Daemon(pid), port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dash_d_daemonizes_and_writes_the_pidfile() {
    let pg = TempPostgres::start();
    let dir = ProcessDir::new(TestPooler::builder(&pg));
    let pidfile = dir.path().join("pgcarpool.pid");
    let logfile = dir.path().join("pgcarpool.log");
    let mut dir = dir;
    dir.rewrite(|b| {
        b.setting("pidfile", &pidfile.to_string_lossy())
            .setting("logfile", &logfile.to_string_lossy())
    });
    let (daemon, port) = start_daemon(&dir).await;
    assert_eq!(
        pid_in(&pidfile),
        Some(daemon.0),
        "the pidfile names the daemon"
    );
    let c = try_connect(&dsn_for(port, "md5user", "testdb"))
        .await
        .unwrap();
    let row = c.query_one("select 41 + 1", &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 42);
    drop(c);
    send_signal(daemon.0, libc::SIGQUIT);
    assert!(
        eventually(Duration::from_secs(5), || async {
            !alive(daemon.0) && !pidfile.exists()
        })
        .await,
        "the daemon did not stop and remove its pidfile"
    );
    assert!(
        read_text(&logfile).contains("process up"),
        "the daemon's log: {}",
        read_text(&logfile)
    );
}

#[test]
fn dash_d_without_pidfile_is_refused() {
    let dir = ProcessDir::raw(
        "[databases]\n* = host=127.0.0.1 port=1\n\n[pgbouncer]\n\
         listen_addr = 127.0.0.1\nlisten_port = 0\nunix_socket_dir =\nauth_type = trust\n",
    );
    let out = dir.run(&["-d"]);
    assert!(!out.status.success(), "daemonized without a pidfile");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("-d needs a pidfile"),
        "unclear error: {}",
        output_text(&out)
    );
}

#[test]
fn dash_d_with_an_unwritable_pidfile_fails_before_forking() {
    let dir = ProcessDir::raw(
        "[databases]\n* = host=127.0.0.1 port=1\n\n[pgbouncer]\n\
         listen_addr = 127.0.0.1\nlisten_port = 0\nunix_socket_dir =\nauth_type = trust\n\
         pidfile = /nonexistent-dir/pgcarpool.pid\n",
    );
    let out = dir.run(&["-d"]);
    assert!(
        !out.status.success(),
        "exit 0 with a pidfile it cannot write: {}",
        output_text(&out)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("could not create pidfile /nonexistent-dir/pgcarpool.pid"),
        "the error does not name the pidfile: {}",
        output_text(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_instance_is_refused_and_the_first_keeps_its_pidfile() {
    let pg = TempPostgres::start();
    let mut dir = ProcessDir::new(TestPooler::builder(&pg));
    let pidfile = dir.path().join("pgcarpool.pid");
    let logfile = dir.path().join("pgcarpool.log");
    dir.rewrite(|b| {
        b.setting("pidfile", &pidfile.to_string_lossy())
            .setting("logfile", &logfile.to_string_lossy())
    });
    let (first, port) = start_daemon(&dir).await;
    // The same config again, in the background and in the foreground.
    for args in [&["-d"][..], &[][..]] {
        let out = dir.run(args);
        assert!(
            !out.status.success(),
            "a second instance ({args:?}) started: {}",
            output_text(&out)
        );
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("exists, another instance running?"),
            "unclear error: {}",
            output_text(&out)
        );
        assert_eq!(
            pid_in(&pidfile),
            Some(first.0),
            "the second instance touched the first one's pidfile"
        );
    }
    assert!(
        read_text(&logfile).contains("another instance running"),
        "the refusal is not in the logfile:\n{}",
        read_text(&logfile)
    );
    let c = try_connect(&dsn_for(port, "md5user", "testdb"))
        .await
        .expect("the first instance still serves");
    c.simple_query("select 1").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_pidfile_is_replaced() {
    let pg = TempPostgres::start();
    // The PID of a process that has exited.
    let mut gone = Command::new("true").spawn().unwrap();
    let dead_pid = gone.id();
    gone.wait().unwrap();
    let mut dir = ProcessDir::new(TestPooler::builder(&pg));
    let pidfile = dir.path().join("pgcarpool.pid");
    dir.rewrite(|b| b.setting("pidfile", &pidfile.to_string_lossy()));
    std::fs::write(&pidfile, format!("{dead_pid}\n")).unwrap();
    give_to_pooler(&pidfile);
    let p = PoolerProcess::start_in(dir, &[]).await;
    assert_eq!(pid_in(&pidfile), Some(p.pid()));
    assert!(
        p.log()
            .contains(&format!("stale pidfile {}", pidfile.display())),
        "{}",
        p.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dash_d_needs_no_logfile() {
    let pg = TempPostgres::start();
    let mut dir = ProcessDir::new(TestPooler::builder(&pg));
    let pidfile = dir.path().join("pgcarpool.pid");
    dir.rewrite(|b| b.setting("pidfile", &pidfile.to_string_lossy()));
    let (daemon, port) = start_daemon(&dir).await;
    let c = try_connect(&dsn_for(port, "md5user", "testdb"))
        .await
        .unwrap();
    c.simple_query("select 1").await.unwrap();
    send_signal(daemon.0, libc::SIGTERM);
    drop(c);
    assert!(
        eventually(Duration::from_secs(5), || async { !alive(daemon.0) }).await,
        "the daemon did not stop on SIGTERM"
    );
}

#[test]
fn a_port_in_use_is_named_in_the_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let dir = ProcessDir::raw(&format!(
        "[databases]\n* = host=127.0.0.1 port=1\n\n[pgbouncer]\n\
         listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\nauth_type = trust\n"
    ));
    let out = dir.run(&[]);
    assert!(!out.status.success(), "started on a taken port");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!(
            "could not listen on 127.0.0.1:{port}: Address already in use"
        )),
        "the error does not name the address: {}",
        output_text(&out)
    );
}

#[test]
fn a_config_error_is_one_line_even_with_rust_backtrace_set() {
    let dir = ProcessDir::raw("[pgbouncer]\nlisten_port = lots\n");
    let mut cmd = dir.command(&[]);
    let out = cmd.env("RUST_BACKTRACE", "1").output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.lines().count(),
        1,
        "not one line: {}",
        output_text(&out)
    );
    assert!(stderr.contains("pgbouncer.ini:2: listen_port"), "{stderr}");
}

#[test]
fn root_is_refused_without_dash_u() {
    let dir = ProcessDir::raw(
        "[databases]\n* = host=127.0.0.1 port=1\n\n[pgbouncer]\n\
         listen_addr = 127.0.0.1\nlisten_port = 0\nunix_socket_dir =\nauth_type = trust\n",
    );
    // Without -u, as whoever runs the tests.
    let mut cmd = Command::new(BIN);
    cmd.arg(dir.ini());
    if pooler_os_user().is_some() {
        let out = cmd.output().unwrap();
        assert!(!out.status.success(), "ran as root: {}", output_text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("should not run as root"),
            "{}",
            output_text(&out)
        );
    } else {
        // Not root: it starts (and is stopped at once).
        let mut child = cmd.stderr(std::process::Stdio::piped()).spawn().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let mut first = [0u8; 64];
        let n = std::io::Read::read(&mut stderr, &mut first).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            !String::from_utf8_lossy(&first[..n]).contains("root"),
            "refused a non-root user"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemd_hears_ready_reloading_and_stopping() {
    let pg = TempPostgres::start();
    let mut p = PoolerProcess::start(TestPooler::builder(&pg)).await;
    // READY=1 came once listening: a client gets in at once.
    let c = p.connect("md5user").await;
    c.simple_query("select 1").await.unwrap();
    for (config_ok, status) in [
        (true, "configuration reloaded"),
        (false, "reload failed, old configuration kept"),
    ] {
        if !config_ok {
            p.dir.write_ini("[pgbouncer]\nlisten_port = lots\n");
        }
        p.signal(libc::SIGHUP);
        let reloading = p
            .notification(Duration::from_secs(10))
            .await
            .expect("nothing after SIGHUP");
        assert_eq!(field(&reloading, "RELOADING"), Some("1"), "{reloading:?}");
        let usec: u64 = field(&reloading, "MONOTONIC_USEC")
            .expect("MONOTONIC_USEC with RELOADING=1 (Type=notify-reload needs it)")
            .parse()
            .unwrap();
        assert!(usec > 0);
        let ready = p
            .ready_again(Duration::from_secs(10))
            .await
            .expect("no READY=1 after the reload");
        assert_eq!(field(&ready, "STATUS"), Some(status));
    }
    p.signal(libc::SIGTERM);
    let stopping = p
        .notification(Duration::from_secs(10))
        .await
        .expect("nothing after SIGTERM");
    assert_eq!(field(&stopping, "STOPPING"), Some("1"), "{stopping:?}");
    drop(c);
    assert!(p.exited_within(Duration::from_secs(10)).await.is_some());
}

/// Open descriptors of process `pid`.
fn fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// A notify socket nobody reads (a hung service manager, or a `NOTIFY_SOCKET` left by one
/// that is gone) fills up: a Unix datagram socket queues 10 datagrams on Linux, and every
/// reload sends two. pgcarpool goes on serving and closing idle servers. (The send once
/// blocked: the thread that runs signals and a share of the clients stood still, and a
/// 30-minute soak ended with 8 servers and 31 descriptors left behind.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notify_socket_nobody_reads_stops_nothing() {
    let pg = TempPostgres::start();
    let p = PoolerProcess::start(
        TestPooler::builder(&pg).settings(&[("workers", "1"), ("server_idle_timeout", "1")]),
    )
    .await;
    let obs = harness::Observer::new(&pg).await;
    let at_start = fds(p.pid());
    // READY=1 was read at start; nothing is read from now on.
    for i in 1..=12 {
        p.signal(libc::SIGHUP);
        let done = eventually(Duration::from_secs(10), || async {
            p.log().matches("configuration reloaded").count() >= i
        })
        .await;
        assert!(done, "reload {i} never finished:\n{}", p.log());
    }
    let c = tokio::time::timeout(Duration::from_secs(10), p.connect("md5user"))
        .await
        .expect("no login after the notify socket filled up");
    c.simple_query("select 1").await.unwrap();
    drop(c);
    let gone = eventually(Duration::from_secs(20), || async {
        obs.backends("md5user").await == 0
    })
    .await;
    assert!(gone, "a server outlived server_idle_timeout");
    let settled = eventually(Duration::from_secs(10), || async {
        fds(p.pid()) <= at_start
    })
    .await;
    assert!(
        settled,
        "descriptors: {at_start} at start, {} now",
        fds(p.pid())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_activation_serves_on_the_passed_sockets_only() {
    let pg = TempPostgres::start();
    let dir = ProcessDir::new(TestPooler::builder(&pg));
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp_port = tcp.local_addr().unwrap().port();
    let sock_dir = dir.path().join("sockets");
    std::fs::create_dir(&sock_dir).unwrap();
    let unix = std::os::unix::net::UnixListener::bind(sock_dir.join(".s.PGSQL.5499")).unwrap();
    give_to_pooler(&sock_dir);
    let (tcp_fd, unix_fd) = (tcp.as_raw_fd(), unix.as_raw_fd());
    // systemd's protocol: the sockets at descriptors 3 and up, LISTEN_FDS, and LISTEN_PID
    // naming the process itself (set by a shell that then becomes pgcarpool).
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("LISTEN_PID=$$ LISTEN_FDS=2 exec \"$0\" \"$@\"")
        .arg(BIN)
        .args(harness::process::user_args())
        .arg(dir.ini())
        .current_dir(dir.path());
    // SAFETY: only dup2(2), async-signal-safe, between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(tcp_fd, 3) < 0 || libc::dup2(unix_fd, 4) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let p = PoolerProcess::start_command(dir, cmd).await;
    drop((tcp, unix));
    assert_eq!(p.port(), tcp_port, "not listening on the passed TCP socket");
    assert!(
        p.log()
            .contains("2 socket(s) passed by the service manager"),
        "{}",
        p.log()
    );
    let c = try_connect(&dsn_for(tcp_port, "md5user", "testdb"))
        .await
        .unwrap();
    c.simple_query("select 1").await.unwrap();
    let over_unix = format!(
        "host={} port=5499 user=md5user password=md5pass dbname=testdb",
        sock_dir.display()
    );
    let u = try_connect(&over_unix)
        .await
        .expect("connect over the passed Unix socket");
    let row = u.query_one("select 'unix'::text", &[]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), "unix");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_logfile_is_reopened_on_sighup_and_a_new_one_used_after_reload() {
    let pg = TempPostgres::start();
    let dir = ProcessDir::new(TestPooler::builder(&pg));
    let log = dir.path().join("pgcarpool.log");
    let rotated = dir.path().join("pgcarpool.log.1");
    let other = dir.path().join("other.log");
    let mut dir = dir;
    dir.rewrite(|b| b.setting("logfile", &log.to_string_lossy()));
    let mut p = PoolerProcess::start_in(dir, &[]).await;
    assert!(read_text(&log).contains("process up"));
    // logrotate: move the file away, then SIGHUP.
    std::fs::rename(&log, &rotated).unwrap();
    p.signal(libc::SIGHUP);
    p.ready_again(Duration::from_secs(10))
        .await
        .expect("no READY=1 after SIGHUP");
    let c = try_connect(&dsn_for(p.port(), "md5user", "testdb"))
        .await
        .unwrap();
    c.simple_query("select 1").await.unwrap();
    assert!(
        eventually(Duration::from_secs(5), || async {
            read_text(&log).contains("login")
        })
        .await,
        "no new logfile after SIGHUP; new: {:?}\nrotated:\n{}",
        read_text(&log),
        read_text(&rotated)
    );
    assert!(
        !read_text(&rotated).contains("login"),
        "still writing to the rotated file:\n{}",
        read_text(&rotated)
    );
    // Rotated again while the config file is broken: the reload fails, the file is
    // reopened all the same (PgBouncer does too).
    let rotated2 = dir_path(&p).join("pgcarpool.log.2");
    std::fs::rename(&log, &rotated2).unwrap();
    p.dir.write_ini("[pgbouncer]\nlisten_port = lots\n");
    p.signal(libc::SIGHUP);
    p.ready_again(Duration::from_secs(10))
        .await
        .expect("no READY=1 after SIGHUP");
    let c3 = try_connect(&dsn_for(p.port(), "md5user", "testdb"))
        .await
        .unwrap();
    c3.simple_query("select 1").await.unwrap();
    assert!(
        eventually(Duration::from_secs(5), || async {
            read_text(&log).contains("login")
        })
        .await,
        "not reopened after a failed reload:\n{}",
        read_text(&rotated2)
    );
    // A changed logfile applies on RELOAD from the console.
    p.dir
        .rewrite(|b| b.setting("logfile", &other.to_string_lossy()));
    let admin = try_connect(&dsn_for(p.port(), "postgres", "pgbouncer"))
        .await
        .unwrap();
    admin.simple_query("RELOAD").await.unwrap();
    let c2 = try_connect(&dsn_for(p.port(), "md5user", "testdb"))
        .await
        .unwrap();
    c2.simple_query("select 1").await.unwrap();
    assert!(
        eventually(Duration::from_secs(5), || async {
            read_text(&other).contains("login")
        })
        .await,
        "the new logfile is not used:\n{}",
        read_text(&log)
    );
    assert!(
        read_text(&log).contains(&format!(
            "reload: logfile: {:?} -> {:?}",
            log.display().to_string(),
            other.display().to_string()
        )),
        "{}",
        read_text(&log)
    );
    assert!(p.running());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn syslog_lines_carry_ident_facility_and_severity() {
    let pg = TempPostgres::start();
    let dir = ProcessDir::new(
        TestPooler::builder(&pg)
            .setting("syslog", "1")
            .setting("syslog_ident", "carpooltest")
            .setting("syslog_facility", "local3"),
    );
    let path = dir.path().join("syslog.sock");
    let syslog = tokio::net::UnixDatagram::bind(&path).unwrap();
    give_to_pooler(&path);
    let mut cmd = dir.command(&[]);
    cmd.env("PGCARPOOL_SYSLOG_SOCKET", &path);
    let p = PoolerProcess::start_command(dir, cmd).await;
    let mut lines = Vec::new();
    let mut buf = vec![0u8; 8192];
    while let Ok(Ok(n)) =
        tokio::time::timeout(Duration::from_millis(500), syslog.recv(&mut buf)).await
    {
        lines.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    // local3 (19) * 8 + info (6) = 158.
    let want = format!("<158>carpooltest[{}]: process up", p.pid());
    assert!(
        lines.iter().any(|l| l.starts_with(&want)),
        "no {want:?} in {lines:#?}"
    );
    // Lines on stderr still come, with timestamps; syslog's have none.
    assert!(p.log().contains("process up"));
    assert!(
        lines
            .iter()
            .all(|l| !l.contains("] LOG ") && !l.contains("Z  INFO")),
        "{lines:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stderr_and_logfile_both_unless_quiet() {
    let pg = TempPostgres::start();
    for quiet in [false, true] {
        let dir = ProcessDir::new(TestPooler::builder(&pg));
        let log = dir.path().join("pgcarpool.log");
        let mut dir = dir;
        dir.rewrite(|b| b.setting("logfile", &log.to_string_lossy()));
        let args: &[&str] = if quiet { &["-q"] } else { &[] };
        let p = PoolerProcess::start_in(dir, args).await;
        assert!(
            read_text(&log).contains("process up"),
            "logfile: {}",
            read_text(&log)
        );
        assert_eq!(
            p.log().contains("process up"),
            !quiet,
            "stderr with quiet = {quiet}: {}",
            p.log()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dash_v_logs_each_connection() {
    let pg = TempPostgres::start();
    for verbose in [false, true] {
        let args: &[&str] = if verbose { &["-v"] } else { &[] };
        let p = PoolerProcess::start_with_args(
            TestPooler::builder(&pg).settings(&[("pool_mode", "transaction")]),
            args,
        )
        .await;
        let c = p.connect("md5user").await;
        c.simple_query("select 1").await.unwrap();
        // (`new connection to server` is logged at LOG level, as PgBouncer: log_connections.)
        let detail = ["new client connection"];
        let seen = eventually(Duration::from_secs(5), || async {
            detail.iter().all(|d| p.log().contains(d))
        })
        .await;
        assert_eq!(seen, verbose, "-v = {verbose}:\n{}", p.log());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unix_socket_only_config_logs_the_socket_path() {
    let pg = TempPostgres::start();
    let dir = ProcessDir::new(TestPooler::builder(&pg));
    let sockets = dir.path().to_path_buf();
    let mut dir = dir;
    dir.rewrite(|b| {
        b.setting("listen_addr", "")
            .setting("listen_port", "5498")
            .setting("unix_socket_dir", &sockets.to_string_lossy())
    });
    let p = PoolerProcess::start_in(dir, &[]).await;
    let path = format!("unix:{}/.s.PGSQL.5498", sockets.display());
    assert!(
        p.log().contains(&format!("listening on {path}")),
        "{}",
        p.log()
    );
    assert!(!p.log().contains("127.0.0.1"), "{}", p.log());
    let c = try_connect(&format!(
        "host={} port=5498 user=md5user password=md5pass dbname=testdb",
        sockets.display()
    ))
    .await
    .unwrap();
    c.simple_query("select 1").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_shutdown_is_logged() {
    let pg = TempPostgres::start();
    let mut p = PoolerProcess::start(TestPooler::builder(&pg)).await;
    let admin = try_connect(&dsn_for(p.port(), "postgres", "pgbouncer"))
        .await
        .unwrap();
    let _ = admin.simple_query("SHUTDOWN").await;
    assert!(
        p.exited_within(Duration::from_secs(10)).await.is_some(),
        "still running after SHUTDOWN"
    );
    assert!(
        p.log().contains("SHUTDOWN from the admin console"),
        "{}",
        p.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_are_logged_in_pgbouncers_words() {
    let pg = TempPostgres::start();
    let p = PoolerProcess::start(TestPooler::builder(&pg).settings(&[
        ("pool_mode", "transaction"),
        ("query_timeout", "0.5"),
        ("idle_transaction_timeout", "0.5"),
    ]))
    .await;
    let c = p.connect("md5user").await;
    let e = c
        .simple_query("select pg_sleep(30)")
        .await
        .expect_err("query_timeout did not fire");
    assert_eq!(harness::sqlstate(&e), Some("08P01"), "{e:?}");
    let c = p.connect("md5user").await;
    c.simple_query("begin").await.unwrap();
    // Login failures: the pooler's own and the server's, as PgBouncer logs them.
    let _ = try_connect(&harness::dsn_with_password(
        p.port(),
        "md5user",
        Some("wrong"),
        "testdb",
    ))
    .await;
    let _ = try_connect(&dsn_for(p.port(), "md5user", "nosuchdb")).await;
    let words = [
        "closing because: query timeout",
        "closing because: idle transaction timeout",
        "closing because: password authentication failed for user \"md5user\" (age=",
        "server login failed: FATAL database \"nosuchdb\" does not exist",
        "closing because: database \"nosuchdb\" does not exist",
        "registered new auto-database: nosuchdb",
    ];
    assert!(
        eventually(Duration::from_secs(10), || async {
            words.iter().all(|w| p.log().contains(w))
        })
        .await,
        "{}",
        p.log()
    );
}
