//! `TempPostgres`: a private, throwaway PostgreSQL server on a free 127.0.0.1 port.
//!
//! `initdb` runs once per test process into a template (roles, databases, pg_hba and
//! settings made there); each instance copies the template's data directory, which is
//! much faster than `initdb`. PostgreSQL refuses to run as root: when the tests run as
//! root, every PostgreSQL program runs as the `postgres` OS user via `runuser` and the
//! temp dirs are chowned to it.
use std::fs;
use std::net::TcpListener;
use std::os::unix::fs::chown;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use super::netns::NetNs;
use super::{dsn_at, password_of, pg_bin, pg_bin_for_server, run_checked, tail, try_connect};

mod standby;

/// Settings every instance gets (written into the template's postgresql.conf).
const BASE_CONF: &str = "\
fsync = off
synchronous_commit = off
full_page_writes = off
shared_buffers = '32MB'
max_wal_size = '256MB'
log_line_prefix = '%m [%p] %q%u@%d '
include_if_exists = 'harness.conf'
";

/// pg_hba.conf: one auth method per test role; other roles (made by tests) get md5,
/// which PostgreSQL answers with SCRAM for SCRAM-stored passwords.
const HBA_CONF: &str = "\
local all postgres                 trust
host  all postgres  127.0.0.1/32  trust
host  all trustuser 127.0.0.1/32  trust
host  all md5user   127.0.0.1/32  md5
host  all scramuser 127.0.0.1/32  scram-sha-256
host  all all       127.0.0.1/32  md5
host  replication postgres  127.0.0.1/32  trust
";

/// Roles and databases, run as `postgres` over the template's unix socket.
const SETUP_SQL: &str = "\
\\set ON_ERROR_STOP 1
SET password_encryption = 'md5';
CREATE ROLE md5user LOGIN PASSWORD 'md5pass';
SET password_encryption = 'scram-sha-256';
CREATE ROLE scramuser LOGIN PASSWORD 'scrampass';
CREATE ROLE trustuser LOGIN;
CREATE DATABASE testdb OWNER postgres;
GRANT CONNECT, CREATE, TEMPORARY ON DATABASE postgres TO PUBLIC;
GRANT CONNECT, CREATE, TEMPORARY ON DATABASE testdb TO PUBLIC;
GRANT ALL ON SCHEMA public TO PUBLIC;
\\connect testdb
GRANT ALL ON SCHEMA public TO PUBLIC;
";

/// Port attempts before giving up (a clash happens only when another process takes
/// the port between our probe and PostgreSQL's bind).
const START_ATTEMPTS: u32 = 5;

/// Seconds `pg_ctl -w` may wait for a start or stop.
const PG_CTL_TIMEOUT_SECS: &str = "60";

/// Who runs PostgreSQL programs: ourselves, or the `postgres` OS user when we are root.
#[derive(Debug, Clone, Copy)]
enum RunAs {
    Myself,
    Postgres { uid: u32, gid: u32 },
}

impl RunAs {
    fn detect() -> RunAs {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return RunAs::Myself;
        }
        let id = |flag: &str| -> u32 {
            let out = run_checked(
                Command::new("id").args([flag, "postgres"]),
                "look up the postgres OS user (PostgreSQL refuses to run as root)",
            );
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse()
                .expect("numeric id")
        };
        RunAs::Postgres {
            uid: id("-u"),
            gid: id("-g"),
        }
    }

    /// A command running PostgreSQL program `name` as the right user, in `cwd`
    /// (a directory that user can enter: `runuser` keeps the caller's cwd).
    fn command(self, name: &str, cwd: &Path) -> Command {
        self.command_at(&pg_bin(name), cwd)
    }

    /// `command` for the program at `program`.
    fn command_at(self, program: &Path, cwd: &Path) -> Command {
        let mut cmd = match self {
            RunAs::Myself => Command::new(program),
            RunAs::Postgres { .. } => {
                let mut cmd = Command::new("runuser");
                cmd.args(["-u", "postgres", "--"]).arg(program);
                cmd
            }
        };
        cmd.current_dir(cwd);
        cmd
    }

    /// `cp -a` as the right user.
    fn copy_dir(self, from: &Path, to: &Path, cwd: &Path) {
        let mut cmd = match self {
            RunAs::Myself => Command::new("cp"),
            RunAs::Postgres { .. } => {
                let mut cmd = Command::new("runuser");
                cmd.args(["-u", "postgres", "--", "cp"]);
                cmd
            }
        };
        cmd.arg("-a").arg(from).arg(to).current_dir(cwd);
        run_checked(&mut cmd, "copy the template data directory");
    }

    /// Give a path we created to the user PostgreSQL runs as.
    fn own(self, path: &Path) {
        if let RunAs::Postgres { uid, gid } = self {
            chown(path, Some(uid), Some(gid))
                .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
        }
    }

    /// Write a file PostgreSQL will read (owned by its user).
    fn write(self, path: &Path, text: &str) {
        fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        self.own(path);
    }
}

/// The initdb'd, set-up data directory every instance copies.
struct Template {
    run_as: RunAs,
    root: PathBuf,
    data: PathBuf,
}

static TEMPLATE: OnceLock<Result<Template, String>> = OnceLock::new();

/// The template's directory, set as soon as it exists (even if making it then fails).
static TEMPLATE_ROOT: OnceLock<PathBuf> = OnceLock::new();

/// Remove the template when the test process exits (statics are never dropped).
extern "C" fn remove_template() {
    if let Some(root) = TEMPLATE_ROOT.get() {
        let _ = fs::remove_dir_all(root);
    }
}

fn template() -> &'static Template {
    let result = TEMPLATE.get_or_init(|| {
        std::panic::catch_unwind(make_template).map_err(|panic| {
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".to_string())
        })
    });
    match result {
        Ok(template) => template,
        Err(msg) => panic!("PostgreSQL test template could not be made: {msg}"),
    }
}

fn make_template() -> Template {
    let run_as = RunAs::detect();
    let root = tempfile::Builder::new()
        .prefix("pgcarpool-pgtemplate-")
        .tempdir_in(std::env::temp_dir())
        .expect("make template dir")
        .keep();
    if TEMPLATE_ROOT.set(root.clone()).is_ok() {
        // SAFETY: registering a plain extern "C" fn with no captured state.
        unsafe {
            libc::atexit(remove_template);
        }
    }
    run_as.own(&root);
    let data = root.join("data");
    run_checked(
        run_as.command("initdb", &root).arg("-D").arg(&data).args([
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        ]),
        "initdb",
    );
    let conf_path = data.join("postgresql.conf");
    let mut conf = fs::read_to_string(&conf_path).expect("read postgresql.conf");
    conf.push_str("\n# pgcarpool test harness\n");
    conf.push_str(BASE_CONF);
    run_as.write(&conf_path, &conf);
    run_as.write(&data.join("pg_hba.conf"), HBA_CONF);

    // Set up roles and databases on a server reachable only through a unix socket in
    // the template's own directory: no TCP port is needed.
    run_as.write(
        &data.join("harness.conf"),
        &format!(
            "listen_addresses = ''\nunix_socket_directories = {}\n",
            conf_quote(&root.to_string_lossy())
        ),
    );
    let log = root.join("setup.log");
    let started = run_as
        .command("pg_ctl", &root)
        .arg("-D")
        .arg(&data)
        .arg("-l")
        .arg(&log)
        .args(["-w", "-t", PG_CTL_TIMEOUT_SECS, "start"])
        .output()
        .expect("run pg_ctl start");
    if !started.status.success() {
        panic!(
            "template server did not start: {}\n{}",
            String::from_utf8_lossy(&started.stderr),
            tail(&log, 40)
        );
    }
    let mut psql = Command::new(pg_bin("psql"));
    psql.arg("-X")
        .arg("-q")
        .arg("-h")
        .arg(&root)
        .args(["-U", "postgres", "-d", "postgres"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let setup = pipe_to(&mut psql, SETUP_SQL);
    let stopped = run_as
        .command("pg_ctl", &root)
        .arg("-D")
        .arg(&data)
        .args(["-w", "-t", PG_CTL_TIMEOUT_SECS, "-m", "fast", "stop"])
        .output()
        .expect("run pg_ctl stop");
    if !setup.status.success() {
        panic!(
            "template setup SQL failed: {}\n{}",
            String::from_utf8_lossy(&setup.stderr),
            tail(&log, 40)
        );
    }
    if !stopped.status.success() {
        panic!(
            "template server did not stop: {}",
            String::from_utf8_lossy(&stopped.stderr)
        );
    }
    fs::remove_file(data.join("harness.conf")).expect("remove setup harness.conf");
    Template { run_as, root, data }
}

/// Let the test roles in from `subnet` as from 127.0.0.1 (a copy of each `host` line).
fn allow_subnet(run_as: RunAs, hba: &Path, subnet: &str) {
    let text = fs::read_to_string(hba).expect("read pg_hba.conf");
    let mut out = text.clone();
    for line in text.lines().filter(|l| l.contains("127.0.0.1/32")) {
        out.push_str(&line.replace("127.0.0.1/32", subnet));
        out.push('\n');
    }
    run_as.write(hba, &out);
}

/// Run `cmd` with `input` on its stdin.
fn pipe_to(cmd: &mut Command, input: &str) -> Output {
    use std::io::Write;
    let mut child = cmd.spawn().expect("spawn psql");
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(input.as_bytes())
        .expect("write psql input");
    child.wait_with_output().expect("wait for psql")
}

/// Quote a postgresql.conf value.
fn conf_quote(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "''"))
}

/// A free TCP port on 127.0.0.1 right now (bind port 0, read it, release it).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// A running private PostgreSQL server; stopped (`pg_ctl stop -m immediate`) and
/// removed on drop. PostgreSQL's log is printed to stderr when a test panics.
pub struct TempPostgres {
    run_as: RunAs,
    /// Temp dir: `data/`, `postgres.log` and the unix socket.
    dir: tempfile::TempDir,
    port: u16,
    /// The address it listens on (127.0.0.1, or its address in a network namespace).
    host: String,
    /// The network namespace it runs in, if not the root one (`start_in`).
    netns: Option<String>,
    /// False after `stop()` (until `start_again()`).
    running: AtomicBool,
}

impl TempPostgres {
    /// Start a server with the default settings (max_connections = 300).
    pub fn start() -> TempPostgres {
        TempPostgres::start_with(&[])
    }

    /// Start a server with extra postgresql.conf settings (these win over the defaults,
    /// e.g. `&[("max_connections", "20"), ("log_statement", "all")]`). Values are quoted.
    pub fn start_with(extra_conf: &[(&str, &str)]) -> TempPostgres {
        TempPostgres::start_inner(extra_conf, None)
    }

    /// Start a server inside network namespace `ns`, listening only on its address there
    /// (`ns.ns_addr`), reachable from the root namespace over the namespace's veth; the
    /// test roles authenticate from the veth's subnet as they do from 127.0.0.1.
    pub fn start_in(ns: &NetNs) -> TempPostgres {
        TempPostgres::start_inner(&[], Some(ns))
    }

    fn start_inner(extra_conf: &[(&str, &str)], ns: Option<&NetNs>) -> TempPostgres {
        let template = template();
        let run_as = template.run_as;
        let dir = tempfile::Builder::new()
            .prefix("pgcarpool-pg-")
            .tempdir_in(std::env::temp_dir())
            .expect("make PostgreSQL temp dir");
        run_as.own(dir.path());
        let data = dir.path().join("data");
        run_as.copy_dir(&template.data, &data, dir.path());
        let log = dir.path().join("postgres.log");
        let host = ns.map_or("127.0.0.1".to_string(), |ns| ns.ns_addr.to_string());
        if let Some(ns) = ns {
            allow_subnet(run_as, &data.join("pg_hba.conf"), &ns.subnet());
        }

        let mut last_error = String::new();
        for _ in 0..START_ATTEMPTS {
            let port = free_port();
            let mut conf = format!(
                "port = {port}\nlisten_addresses = '{host}'\nunix_socket_directories = {}\nmax_connections = 300\n",
                conf_quote(&dir.path().to_string_lossy())
            );
            for (key, value) in extra_conf {
                conf.push_str(&format!("{key} = {}\n", conf_quote(value)));
            }
            run_as.write(&data.join("harness.conf"), &conf);
            let log_len_before = fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
            let mut start = run_as.command("pg_ctl", dir.path());
            if let Some(ns) = ns {
                // The postmaster (pg_ctl's child) lives in the namespace.
                let inner = start;
                start = ns.command();
                start.arg(inner.get_program()).args(inner.get_args());
                start.current_dir(dir.path());
            }
            let output = start
                .arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(&log)
                .args(["-w", "-t", PG_CTL_TIMEOUT_SECS, "start"])
                .output()
                .expect("run pg_ctl start");
            if output.status.success() {
                return TempPostgres {
                    run_as,
                    dir,
                    port,
                    host,
                    netns: ns.map(|ns| ns.name().to_string()),
                    running: AtomicBool::new(true),
                };
            }
            let log_text = fs::read(&log).unwrap_or_default();
            let new_log = String::from_utf8_lossy(
                log_text
                    .get(usize::try_from(log_len_before).unwrap_or(0)..)
                    .unwrap_or_default(),
            )
            .into_owned();
            last_error = format!(
                "pg_ctl start on port {port} failed: {}\n--- postgres.log\n{new_log}",
                String::from_utf8_lossy(&output.stderr)
            );
            let port_clash = new_log.contains("could not bind")
                || new_log.contains("could not create any TCP/IP sockets");
            if !port_clash {
                break;
            }
        }
        panic!("{last_error}");
    }

    /// The TCP port (on 127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The unix socket directory (socket `.s.PGSQL.<port>` inside).
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// libpq `key=value` connection string (host=127.0.0.1), with the test role's password.
    pub fn dsn(&self, user: &str, db: &str) -> String {
        dsn_at(&self.host, self.port, user, password_of(user), db)
    }

    /// A `[databases]` entry value pointing at database `db` of this server.
    pub fn db_entry(&self, db: &str) -> String {
        format!("host={} port={} dbname={db}", self.host, self.port)
    }

    /// The address it listens on.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Connect directly (not through a pooler) as a test role; panics on failure.
    pub async fn connect(&self, user: &str, db: &str) -> tokio_postgres::Client {
        try_connect(&self.dsn(user, db))
            .await
            .unwrap_or_else(|e| panic!("connect to PostgreSQL as {user} to {db}: {e}"))
    }

    /// Run SQL with `psql -X -At` as `postgres` in database `postgres`; returns stdout
    /// without the final newline. Panics (with psql's stderr) on error.
    pub fn psql(&self, sql: &str) -> String {
        self.psql_in("postgres", sql)
    }

    /// As `psql`, in database `db`.
    pub fn psql_in(&self, db: &str, sql: &str) -> String {
        let output = run_checked(
            Command::new(pg_bin("psql"))
                .args(["-X", "-At", "-v", "ON_ERROR_STOP=1", "-d"])
                .arg(self.dsn("postgres", db))
                .arg("-c")
                .arg(sql),
            "psql",
        );
        let mut out = String::from_utf8_lossy(&output.stdout).into_owned();
        if out.ends_with('\n') {
            out.pop();
        }
        out
    }

    /// `pg_ctl` on this server's data directory, waiting (`-w`) for the result.
    fn pg_ctl(&self, args: &[&str], what: &str) {
        let mut cmd = self.run_as.command("pg_ctl", self.dir.path());
        if let Some(ns) = &self.netns {
            // A (re)started postmaster lives in the namespace too.
            let inner = cmd;
            cmd = Command::new("ip");
            cmd.args(["netns", "exec", ns])
                .arg(inner.get_program())
                .args(inner.get_args())
                .current_dir(self.dir.path());
        }
        run_checked(
            cmd.arg("-D")
                .arg(self.data_dir())
                .arg("-l")
                .arg(self.dir.path().join("postgres.log"))
                .args(["-w", "-t", PG_CTL_TIMEOUT_SECS])
                .args(args),
            what,
        );
    }

    /// Stop the server (fast shutdown: sessions are ended) and keep its data, e.g. to
    /// test what the pooler does while PostgreSQL is down.
    pub fn stop(&self) {
        self.pg_ctl(&["-m", "fast", "stop"], "stop PostgreSQL");
        self.running.store(false, Ordering::SeqCst);
    }

    /// Start a stopped server again on the same port (panics if the port was taken).
    pub fn start_again(&self) {
        self.pg_ctl(&["start"], "start PostgreSQL again");
        self.running.store(true, Ordering::SeqCst);
    }

    /// Restart the server (fast shutdown: every session is ended) on the same port.
    pub fn restart(&self) {
        self.pg_ctl(&["-m", "fast", "restart"], "restart PostgreSQL");
        self.running.store(true, Ordering::SeqCst);
    }

    /// A streaming standby of this server, started on another free port in a new temp
    /// dir: `pg_basebackup -R -X stream` (as the user PostgreSQL runs as), or, when no
    /// pg_basebackup of the server's major or newer is installed, a low-level backup and a
    /// file copy (`standby::make`). Returns once it accepts connections, in recovery.
    pub fn start_standby(&self) -> TempPostgres {
        let (dir, data) = self.standby_dir();
        let basebackup = match pg_bin_for_server("pg_basebackup") {
            Ok(program) => program,
            Err(why) => {
                eprintln!("standby by a low-level backup and a file copy: {why}");
                standby::make(self, self.run_as, &data);
                return self.start_standby_in(dir);
            }
        };
        let run_as = self.run_as;
        run_checked(
            run_as
                .command_at(&basebackup, dir.path())
                .args([
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &self.port.to_string(),
                    "-U",
                    "postgres",
                ])
                .arg("-D")
                .arg(&data)
                .args(["-R", "-X", "stream", "--no-sync"]),
            "pg_basebackup a standby",
        );
        self.start_standby_in(dir)
    }

    /// A streaming standby made by the low-level backup and a file copy
    /// (`standby::make`) whatever pg_basebackup is installed: what `start_standby` does
    /// without one of the server's major (`tests/harness_smoke.rs` keeps that way tested
    /// where CI has one).
    pub fn start_standby_by_copy(&self) -> TempPostgres {
        let (dir, data) = self.standby_dir();
        standby::make(self, self.run_as, &data);
        self.start_standby_in(dir)
    }

    /// A new temp dir for a standby, owned by the user PostgreSQL runs as, and its `data`.
    fn standby_dir(&self) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::Builder::new()
            .prefix("pgcarpool-pg-standby-")
            .tempdir_in(std::env::temp_dir())
            .expect("make standby temp dir");
        self.run_as.own(dir.path());
        let data = dir.path().join("data");
        (dir, data)
    }

    /// Start the standby whose data directory `dir` holds, on a free port.
    fn start_standby_in(&self, dir: tempfile::TempDir) -> TempPostgres {
        let run_as = self.run_as;
        let data = dir.path().join("data");
        let log = dir.path().join("postgres.log");
        let mut last_error = String::new();
        for _ in 0..START_ATTEMPTS {
            let port = free_port();
            // The primary's harness.conf came along: this one wins (the standby's port).
            let conf = format!(
                "port = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = {}\nmax_connections = 300\nhot_standby = on\n",
                conf_quote(&dir.path().to_string_lossy())
            );
            run_as.write(&data.join("harness.conf"), &conf);
            let output = run_as
                .command("pg_ctl", dir.path())
                .arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(&log)
                .args(["-w", "-t", PG_CTL_TIMEOUT_SECS, "start"])
                .output()
                .expect("run pg_ctl start");
            if output.status.success() {
                return TempPostgres {
                    run_as,
                    dir,
                    port,
                    host: "127.0.0.1".into(),
                    netns: None,
                    running: AtomicBool::new(true),
                };
            }
            last_error = format!(
                "standby start on port {port} failed: {}\n{}",
                String::from_utf8_lossy(&output.stderr),
                tail(&log, 40)
            );
        }
        panic!("{last_error}");
    }

    /// `pg_ctl promote -w`: a standby becomes a primary (on a new timeline).
    pub fn promote(&self) {
        self.pg_ctl(&["promote"], "promote the standby");
    }

    /// `kill -9` of the postmaster (an unplanned failure: its sessions are orphaned and
    /// end as they notice). The server counts as stopped.
    pub fn kill_postmaster(&self) {
        let pid_file = self.data_dir().join("postmaster.pid");
        let text = fs::read_to_string(&pid_file).expect("read postmaster.pid");
        let pid: i32 = text
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .expect("pid in postmaster.pid");
        // SAFETY: kill(2) with a pid read from the server's own pid file.
        let r = unsafe { libc::kill(pid, libc::SIGKILL) };
        assert_eq!(r, 0, "kill -9 {pid}");
        self.running.store(false, Ordering::SeqCst);
    }

    /// Start a stopped primary again with `standby.signal` removed: a former primary
    /// coming back as a primary (split brain).
    pub fn start_again_as_primary(&self) {
        let _ = fs::remove_file(self.data_dir().join("standby.signal"));
        self.start_again();
    }

    /// Start a stopped (cleanly: fast shutdown) former primary again as a streaming standby
    /// of `primary` (a promoted standby of it): a switchover's demotion, without pg_rewind
    /// (the promoted standby had received all its WAL before the shutdown checkpoint).
    pub fn start_again_as_standby_of(&self, primary: &TempPostgres) {
        let data = self.data_dir();
        self.run_as.write(&data.join("standby.signal"), "");
        let conf = data.join("harness.conf");
        let mut text = fs::read_to_string(&conf).expect("read harness.conf");
        text.push_str(&format!(
            "primary_conninfo = 'host=127.0.0.1 port={} user=postgres'\n",
            primary.port()
        ));
        self.run_as.write(&conf, &text);
        self.start_again();
    }

    /// A running standby streams from `primary` from now on (`primary_conninfo` reloaded;
    /// it follows the new timeline).
    pub fn follow(&self, primary: &TempPostgres) {
        self.psql(&format!(
            "ALTER SYSTEM SET primary_conninfo = 'host=127.0.0.1 port={} user=postgres'",
            primary.port()
        ));
        self.psql("SELECT pg_reload_conf()");
    }

    /// PostgreSQL's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }
}

impl Drop for TempPostgres {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- last lines of PostgreSQL's log (port {}) ---\n{}\n--- end of PostgreSQL's log ---",
                self.port,
                tail(&self.dir.path().join("postgres.log"), 60)
            );
        }
        if !self.running.load(Ordering::SeqCst) {
            return;
        }
        let stopped = self
            .run_as
            .command("pg_ctl", self.dir.path())
            .arg("-D")
            .arg(self.data_dir())
            .args(["-w", "-t", PG_CTL_TIMEOUT_SECS, "-m", "immediate", "stop"])
            .stdout(Stdio::null())
            .output();
        match stopped {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!(
                "pg_ctl stop (port {}) failed: {}",
                self.port,
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => eprintln!("pg_ctl stop (port {}): {e}", self.port),
        }
        // The TempDir field removes the directory after this.
    }
}
