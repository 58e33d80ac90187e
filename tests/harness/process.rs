//! `PoolerProcess`: the pgcarpool binary as a child process, run as PgBouncer is run
//! (config file argument, signals, `-d`, pidfile). The config comes from a
//! `TestPoolerBuilder` (port 0, as in-process poolers); the harness learns the port and
//! that pgcarpool is up from its systemd readiness message (READY=1 with the listening
//! addresses in STATUS=, on a `NOTIFY_SOCKET` of the test's own), not by probing a port.
//!
//! As root (CI), pgcarpool refuses to run without `-u`: the harness passes `-u postgres`
//! and gives the temp dir to that user.
use std::os::unix::fs::chown;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use super::{TestPoolerBuilder, dsn_for, eventually, read_text, try_connect};

/// The PID a pidfile names ("" when there is none).
pub fn pidfile_pid(pidfile: &Path) -> String {
    read_text(pidfile).trim().to_string()
}

/// The pgcarpool binary cargo built for this test run.
pub const BIN: &str = env!("CARGO_BIN_EXE_pgcarpool");

/// How long a start may take before the test fails (a debug build on a busy machine).
const START_LIMIT: Duration = Duration::from_secs(20);

/// The uid and gid pgcarpool runs as when the tests run as root (PgBouncer's rule: never
/// as root), None otherwise.
pub fn pooler_os_user() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let id = |flag: &str| -> u32 {
        let out = Command::new("id").args([flag, "postgres"]).output();
        let out = out.expect("run id(1) to look up the postgres OS user");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("numeric id")
    };
    Some((id("-u"), id("-g")))
}

/// The arguments that make pgcarpool run as the right user (`-u postgres` as root).
pub fn user_args() -> Vec<String> {
    match pooler_os_user() {
        Some(_) => vec!["-u".into(), "postgres".into()],
        None => Vec::new(),
    }
}

/// Give `path` (and, for a directory, what is in it) to the user pgcarpool runs as.
pub fn give_to_pooler(path: &Path) {
    let Some((uid, gid)) = pooler_os_user() else {
        return;
    };
    chown(path, Some(uid), Some(gid)).unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
    if path.is_dir() {
        for entry in std::fs::read_dir(path).expect("read dir") {
            give_to_pooler(&entry.expect("dir entry").path());
        }
    }
}

/// Send `sig` to `pid` unless it has exited meanwhile (ESRCH: a PostgreSQL backend whose
/// client left between listing and signalling); panics on any other failure.
pub fn signal_if_alive(pid: i32, sig: libc::c_int) {
    // SAFETY: kill(2) on a PID of a process this test started (or one of its children).
    let rc = unsafe { libc::kill(pid, sig) };
    let err = std::io::Error::last_os_error();
    assert!(
        rc == 0 || err.raw_os_error() == Some(libc::ESRCH),
        "kill({pid}, {sig}): {err}"
    );
}

/// Send `sig` to `pid`; panics if it cannot be sent.
pub fn send_signal(pid: i32, sig: libc::c_int) {
    // SAFETY: kill(2) on a PID this test started.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(
        rc,
        0,
        "kill({pid}, {sig}): {}",
        std::io::Error::last_os_error()
    );
}

/// A process with this PID exists.
pub fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// Wait (bounded: None after `limit`) for a child process to exit; its status.
pub async fn exit_within(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A temp dir for a pgcarpool child, with its config written in it.
pub struct ProcessDir {
    dir: tempfile::TempDir,
    /// None for a dir made with `raw`.
    spec: Option<TestPoolerBuilder>,
}

impl ProcessDir {
    /// Write `spec`'s pgbouncer.ini and userlist.txt into a new temp dir.
    pub fn new(spec: TestPoolerBuilder) -> ProcessDir {
        let d = ProcessDir {
            dir: temp_dir(),
            spec: Some(spec),
        };
        d.write();
        d
    }

    /// As `new`, with `pidfile` set to this dir's `pgcarpool.pid` (`pidfile()`): an absolute
    /// path, so a successor started from `spec()` in a dir of its own shares it (`-R`).
    pub fn with_pidfile(spec: TestPoolerBuilder) -> ProcessDir {
        let mut d = ProcessDir::new(spec);
        let pidfile = d.pidfile().to_string_lossy().into_owned();
        d.rewrite(|b| b.setting("pidfile", &pidfile));
        d
    }

    /// `pgcarpool.pid` in this dir (the pidfile when made by `with_pidfile`).
    pub fn pidfile(&self) -> PathBuf {
        self.path().join("pgcarpool.pid")
    }

    /// The config this dir was written from.
    pub fn spec(&self) -> TestPoolerBuilder {
        self.spec.clone().expect("a config made by a builder")
    }

    /// A temp dir whose pgbouncer.ini is `ini` as it is (and an empty userlist.txt).
    pub fn raw(ini: &str) -> ProcessDir {
        let d = ProcessDir {
            dir: temp_dir(),
            spec: None,
        };
        std::fs::write(d.path().join("userlist.txt"), "").expect("write userlist.txt");
        d.write_ini(ini);
        d
    }

    fn write(&self) {
        let spec = self.spec.as_ref().expect("a config made by a builder");
        std::fs::write(self.ini(), spec.ini_text()).expect("write pgbouncer.ini");
        std::fs::write(self.path().join("userlist.txt"), spec.auth_file_text())
            .expect("write userlist.txt");
        give_to_pooler(self.path());
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn ini(&self) -> PathBuf {
        self.path().join("pgbouncer.ini")
    }

    /// Change the config and rewrite the files (no reload: send SIGHUP or RELOAD).
    pub fn rewrite(&mut self, change: impl FnOnce(TestPoolerBuilder) -> TestPoolerBuilder) {
        let spec = self.spec.take().expect("a config made by a builder");
        self.spec = Some(change(spec));
        self.write();
    }

    /// Write `text` as pgbouncer.ini as it is.
    pub fn write_ini(&self, text: &str) {
        std::fs::write(self.ini(), text).expect("write pgbouncer.ini");
        give_to_pooler(self.path());
    }

    /// Run pgcarpool with `args` then the ini path, to its exit (for starts that must
    /// fail, or `-d`, whose first process exits at once). Bounded: killed after 20 s.
    pub fn run(&self, args: &[&str]) -> Output {
        let mut cmd = self.command(args);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let child = cmd.spawn().expect("spawn pgcarpool");
        let pid = child.id();
        let killer = std::thread::spawn(move || {
            std::thread::sleep(START_LIMIT);
            // The test is failing anyway; make sure it does not hang.
            // SAFETY: kill(2) on the child's PID (if it is gone, nothing happens).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        });
        let out = child.wait_with_output().expect("wait for pgcarpool");
        drop(killer);
        out
    }

    /// The command line for pgcarpool on this dir's config, with `args` before it (and
    /// `-u postgres` as root unless `args` has `-u`).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        if !args.contains(&"-u") {
            cmd.args(user_args());
        }
        cmd.args(args).arg(self.ini()).current_dir(self.path());
        cmd.stdin(Stdio::null());
        cmd
    }

    /// A `NOTIFY_SOCKET` in this dir that pgcarpool (as its user) can send to.
    pub fn notify_socket(&self) -> tokio::net::UnixDatagram {
        let path = self.path().join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let sock = tokio::net::UnixDatagram::bind(&path).expect("bind notify socket");
        give_to_pooler(&path);
        sock
    }
}

fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("pgcarpool-bin-")
        .tempdir()
        .expect("make temp dir")
}

/// Read sd_notify messages until one has `READY=1`; its fields (MAINPID, STATUS…).
pub async fn wait_ready(
    notify: &tokio::net::UnixDatagram,
    limit: Duration,
) -> Option<Vec<(String, String)>> {
    let deadline = Instant::now() + limit;
    loop {
        let fields =
            next_notification(notify, deadline.saturating_duration_since(Instant::now())).await?;
        if fields.iter().any(|(k, v)| k == "READY" && v == "1") {
            return Some(fields);
        }
    }
}

/// The next sd_notify message, as key=value pairs, or None after `limit`.
pub async fn next_notification(
    notify: &tokio::net::UnixDatagram,
    limit: Duration,
) -> Option<Vec<(String, String)>> {
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(limit, notify.recv(&mut buf))
        .await
        .ok()?
        .expect("read notify socket");
    Some(
        String::from_utf8_lossy(&buf[..n])
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

/// The value of `key` in a notification.
pub fn field<'a>(fields: &'a [(String, String)], key: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// The TCP port in a readiness STATUS ("listening on 127.0.0.1:43211, unix:/tmp/…").
pub fn port_in_status(status: &str) -> Option<u16> {
    status
        .trim_start_matches("listening on ")
        .split(", ")
        .filter(|a| !a.starts_with("unix:"))
        .find_map(|a| a.rsplit_once(':')?.1.parse().ok())
}

/// pgcarpool running as a child process in the foreground; killed (SIGKILL) if the test
/// ends first, its stderr printed if the test panics.
pub struct PoolerProcess {
    child: Child,
    port: u16,
    pub dir: ProcessDir,
    notify: tokio::net::UnixDatagram,
}

impl PoolerProcess {
    /// Start pgcarpool on `spec` and wait until it is up (READY=1).
    pub async fn start(spec: TestPoolerBuilder) -> PoolerProcess {
        PoolerProcess::start_with_args(spec, &[]).await
    }

    /// The same, with extra command-line arguments (e.g. `-v`).
    pub async fn start_with_args(spec: TestPoolerBuilder, args: &[&str]) -> PoolerProcess {
        PoolerProcess::start_in(ProcessDir::new(spec), args).await
    }

    /// Start the first pgcarpool of an online restart on `dir` (made with a pidfile), and
    /// check the pidfile names it.
    pub async fn start_first(dir: ProcessDir) -> PoolerProcess {
        let pidfile = dir.pidfile();
        let p = PoolerProcess::start_in(dir, &[]).await;
        assert_eq!(
            pidfile_pid(&pidfile),
            p.pid().to_string(),
            "the pidfile does not name the running pgcarpool"
        );
        p
    }

    /// Start pgcarpool on the config in `dir`.
    pub async fn start_in(dir: ProcessDir, args: &[&str]) -> PoolerProcess {
        let cmd = dir.command(args);
        PoolerProcess::start_command(dir, cmd).await
    }

    /// Start pgcarpool with the command `cmd` (from `dir.command`, changed by the test:
    /// environment, descriptors) and wait until it is up.
    pub async fn start_command(dir: ProcessDir, mut cmd: Command) -> PoolerProcess {
        let notify = dir.notify_socket();
        let stderr = std::fs::File::create(dir.path().join("stderr.log")).expect("stderr.log");
        let child = cmd
            .env("NOTIFY_SOCKET", dir.path().join("notify.sock"))
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn pgcarpool");
        let mut p = PoolerProcess {
            child,
            port: 0,
            dir,
            notify,
        };
        let Some(ready) = wait_ready(&p.notify, START_LIMIT).await else {
            panic!(
                "pgcarpool did not report READY=1 (exit: {:?})\n{}",
                p.child.try_wait(),
                p.log()
            );
        };
        // 0 for a pooler listening on a Unix socket only.
        p.port = port_in_status(field(&ready, "STATUS").unwrap_or_default()).unwrap_or(0);
        p
    }

    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("pid fits i32")
    }

    /// A new dir with this process's config and its TCP port as `listen_port`, for a second
    /// pgcarpool on the same port (online restart, `-R`, with so_reuseport = 1). Paths in
    /// the config stay as they are: an absolute pidfile or unix_socket_dir is shared.
    pub fn successor_dir(&self) -> ProcessDir {
        ProcessDir::new(
            self.dir
                .spec()
                .setting("listen_port", &self.port.to_string()),
        )
    }

    /// Start pgcarpool with `args` (e.g. `-R`) in `successor_dir()` and wait until it is up.
    pub async fn start_successor(&self, args: &[&str]) -> PoolerProcess {
        PoolerProcess::start_in(self.successor_dir(), args).await
    }

    /// The TCP port it listens on (0: none).
    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn signal(&self, sig: libc::c_int) {
        send_signal(self.pid(), sig);
    }

    /// The next sd_notify message pgcarpool sends (None after `limit`).
    pub async fn notification(&self, limit: Duration) -> Option<Vec<(String, String)>> {
        next_notification(&self.notify, limit).await
    }

    /// Read sd_notify messages until READY=1 (after a reload).
    pub async fn ready_again(&self, limit: Duration) -> Option<Vec<(String, String)>> {
        wait_ready(&self.notify, limit).await
    }

    /// A libpq connection string to database `testdb` through this pooler.
    pub fn dsn(&self, user: &str) -> String {
        dsn_for(self.port, user, "testdb")
    }

    pub async fn connect(&self, user: &str) -> tokio_postgres::Client {
        try_connect(&self.dsn(user))
            .await
            .unwrap_or_else(|e| panic!("connect through pgcarpool: {e}\n{}", self.log()))
    }

    /// The admin console (database `pgbouncer`) as `postgres`.
    pub async fn console(&self) -> tokio_postgres::Client {
        try_connect(&dsn_for(self.port, "postgres", "pgbouncer"))
            .await
            .unwrap_or_else(|e| panic!("connect to the admin console: {e}\n{}", self.log()))
    }

    /// What pgcarpool wrote to stderr so far.
    pub fn log(&self) -> String {
        read_text(&self.dir.path().join("stderr.log"))
    }

    pub fn running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// Wait (bounded) for the process to exit.
    pub async fn exited_within(&mut self, limit: Duration) -> Option<ExitStatus> {
        exit_within(&mut self.child, limit).await
    }

    /// Wait (bounded) until the listener is gone (a shutdown has begun).
    pub async fn stops_accepting(&self) -> bool {
        let port = self.port;
        eventually(Duration::from_secs(5), || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_err()
        })
        .await
    }
}

impl Drop for PoolerProcess {
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
