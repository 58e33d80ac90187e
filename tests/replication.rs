//! Replication connections through pgcarpool (`replication=true|database`), passed to a
//! server connection of their own as PgBouncer 1.23+ does: pg_basebackup, replication
//! commands over psql, and logical slots with pg_recvlogical. PostgreSQL answers directly
//! and through pgcarpool alike.
mod harness;

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output};
use std::time::{Duration, Instant};

use harness::process::PoolerProcess;
use harness::{
    Observer, TempPostgres, TestPooler, output_text, pg_bin_for_server_or_skip, wait_for,
};

/// A replication connection string for `port` (`replication` = true or database).
fn dsn(port: u16, replication: &str) -> String {
    format!(
        "host=127.0.0.1 port={port} user=postgres password=postgres dbname=testdb \
         replication={replication} application_name=repl_test"
    )
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("run a PostgreSQL client program");
    assert!(out.status.success(), "{}", output_text(&out));
    out
}

fn psql(dsn: &str, sql: &str) -> String {
    harness::psql(dsn, sql).unwrap_or_else(|e| panic!("psql `{sql}`: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_commands_answer_as_postgresql_itself() {
    let pg = TempPostgres::start_with(&[("wal_level", "logical")]);
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .start()
        .await;
    for mode in ["true", "database"] {
        let direct = psql(&dsn(pg.port(), mode), "IDENTIFY_SYSTEM");
        let pooled = psql(&dsn(p.port(), mode), "IDENTIFY_SYSTEM");
        // systemid|timeline|xlogpos|dbname: the same system, timeline and database.
        let head = |s: &str| s.split('|').take(2).collect::<Vec<_>>().join("|");
        assert_eq!(head(&pooled), head(&direct), "replication={mode}");
        assert!(!head(&direct).is_empty());
    }
    // A logical replication connection runs SQL too, with the client's parameters.
    assert_eq!(
        psql(&dsn(p.port(), "database"), "SHOW application_name"),
        "repl_test"
    );
    // Logical slots made and dropped through pgcarpool, seen by PostgreSQL.
    if let Some(recvlogical_bin) = pg_bin_for_server_or_skip("pg_recvlogical") {
        let recvlogical = |args: &[&str]| {
            run(Command::new(&recvlogical_bin)
                .args(["-d", &dsn(p.port(), "database"), "--slot", "carpool_slot"])
                .args(args))
        };
        recvlogical(&["--create-slot", "-P", "test_decoding"]);
        assert_eq!(
            pg.psql("select slot_type from pg_replication_slots where slot_name = 'carpool_slot'")
                .trim(),
            "logical"
        );
        recvlogical(&["--drop-slot"]);
        assert_eq!(
            pg.psql("select count(*) from pg_replication_slots").trim(),
            "0"
        );
    }
    // A normal client of the same database is not disturbed.
    let c = p.connect("postgres", "testdb").await;
    c.simple_query("select 1").await.unwrap();
    p.shutdown().await;
}

/// The connection string pg_basebackup and pg_receivewal get (they add `replication`).
fn backup_dsn(port: u16) -> String {
    format!("host=127.0.0.1 port={port} user=postgres password=postgres")
}

/// Wait up to `limit` for `child` to exit (killed, and the test failed, if it does not).
async fn exit_within(child: &mut Child, what: &str, limit: Duration) -> ExitStatus {
    let status = harness::process::exit_within(child, limit).await;
    status.unwrap_or_else(|| {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{what} had not ended after {limit:?}");
    })
}

/// pg_basebackup through pgcarpool on `port` into `backup`, WAL streamed alongside; it
/// must be done within `limit`. `program` is a pg_basebackup the server accepts.
async fn basebackup(program: &Path, port: u16, backup: &Path, limit: Duration) {
    let mut child = Command::new(program)
        .arg("-d")
        .arg(backup_dsn(port))
        .arg("-D")
        .arg(backup)
        .args(["-X", "stream", "-c", "fast", "--no-sync"])
        .spawn()
        .expect("start pg_basebackup");
    let status = exit_within(&mut child, "pg_basebackup", limit).await;
    assert!(status.success(), "pg_basebackup: {status}");
}

/// The backup in `backup` is of `pg`'s cluster.
fn assert_backup_of(pg: &TempPostgres, backup: &Path) {
    let version = std::fs::read_to_string(backup.join("PG_VERSION")).unwrap();
    assert_eq!(
        version.trim(),
        pg.psql("show server_version_num").trim()[..2].to_string()
    );
    assert!(backup.join("backup_label").exists() || backup.join("backup_manifest").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_basebackup_runs_through_pgcarpool() {
    let Some(program) = pg_bin_for_server_or_skip("pg_basebackup") else {
        return;
    };
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg).start().await;
    let target = tempfile::tempdir().unwrap();
    let backup = target.path().join("backup");
    basebackup(&program, p.port(), &backup, Duration::from_secs(120)).await;
    assert_backup_of(&pg, &backup);
    p.shutdown().await;
}

/// PgBouncer's suite runs with `tcp_socket_buffer = 4096` (to hit EAGAIN often): a backup
/// of some 40 MB streams through such sockets in seconds, as through PgBouncer. (The
/// options were once set after the handshake, and the server then sent into a window the
/// small buffer could not hold: the stream crawled at some 100 kB/s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_basebackup_streams_through_small_socket_buffers() {
    let Some(program) = pg_bin_for_server_or_skip("pg_basebackup") else {
        return;
    };
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("tcp_socket_buffer", "4096")
        .start()
        .await;
    let target = tempfile::tempdir().unwrap();
    let backup = target.path().join("backup");
    basebackup(&program, p.port(), &backup, Duration::from_secs(60)).await;
    assert_backup_of(&pg, &backup);
    p.shutdown().await;
}

/// A finished WAL segment file (24 hex digits, not `.partial`) in `dir`.
fn has_full_segment(dir: &Path) -> bool {
    std::fs::read_dir(dir).unwrap().flatten().any(|e| {
        let name = e.file_name().to_string_lossy().to_string();
        name.len() == 24 && name.chars().all(|c| c.is_ascii_hexdigit())
    })
}

/// pg_receivewal through pgcarpool on `port` into `dir` on slot `carpool_wal` (made
/// here), once PostgreSQL says it is streaming. `program` is a pg_receivewal the server
/// accepts.
async fn receivewal(program: &Path, pg: &TempPostgres, port: u16, dir: &Path) -> Child {
    pg.psql("select pg_create_physical_replication_slot('carpool_wal')");
    let child = Command::new(program)
        .arg("-d")
        .arg(backup_dsn(port))
        .args(["--slot=carpool_wal", "--no-loop", "--no-sync", "-D"])
        .arg(dir)
        .spawn()
        .expect("start pg_receivewal");
    wait_for(
        "pg_receivewal streaming",
        Duration::from_secs(20),
        || async {
            pg.psql("select count(*) from pg_stat_replication where state = 'streaming'")
                .trim()
                == "1"
        },
    )
    .await;
    child
}

/// pg_receivewal through pgcarpool with `tcp_socket_buffer = 4096` (PgBouncer's
/// test_physical_rep_pg_receivewal): a whole 16 MB segment arrives, and on SIGINT it
/// ends its stream and exits 0 at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_receivewal_streams_through_small_socket_buffers() {
    let Some(program) = pg_bin_for_server_or_skip("pg_receivewal") else {
        return;
    };
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("tcp_socket_buffer", "4096")
        .start()
        .await;
    let dir = tempfile::tempdir().unwrap();
    let mut child = receivewal(&program, &pg, p.port(), dir.path()).await;
    // The segment being written is finished and the next begun: all of it is sent.
    pg.psql("create table carpool_wal(x int); insert into carpool_wal values (1)");
    pg.psql("select pg_switch_wal()");
    wait_for(
        "a whole WAL segment received",
        Duration::from_secs(60),
        || async { has_full_segment(dir.path()) },
    )
    .await;
    // SAFETY: signalling our own child, which has not been waited for yet.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let status = exit_within(
        &mut child,
        "pg_receivewal after SIGINT",
        Duration::from_secs(20),
    )
    .await;
    assert!(status.success(), "pg_receivewal: {status}");
    p.shutdown().await;
}

/// SIGQUIT (immediate shutdown) ends a replication connection too: the process exits at
/// once, and pg_receivewal sees its stream end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigquit_ends_a_replication_connection() {
    let Some(program) = pg_bin_for_server_or_skip("pg_receivewal") else {
        return;
    };
    let pg = TempPostgres::start();
    let mut p = PoolerProcess::start(TestPooler::builder(&pg)).await;
    let dir = tempfile::tempdir().unwrap();
    let mut child = receivewal(&program, &pg, p.port(), dir.path()).await;
    p.signal(libc::SIGQUIT);
    let exited = p.exited_within(Duration::from_secs(20)).await;
    assert!(
        exited.is_some(),
        "still running 20 s after SIGQUIT:\n{}",
        p.log()
    );
    exit_within(
        &mut child,
        "pg_receivewal after SIGQUIT",
        Duration::from_secs(20),
    )
    .await;
}

/// Client backends (not walsenders) on database testdb.
async fn testdb_backends(obs: &Observer) -> i64 {
    obs.count("datname = 'testdb'", &[]).await
}

/// As in PgBouncer, a replication connection's server counts against its pool's size: a
/// full pool closes an idle server to make room ("evicted"), and with none idle the next
/// replication client waits for room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_connections_count_against_the_pool_size() {
    let pg = TempPostgres::start_with(&[("wal_level", "logical")]);
    let p = TestPooler::builder(&pg)
        .setting("default_pool_size", "1")
        .start()
        .await;
    let obs = Observer::new(&pg).await;
    // A normal client leaves an idle server in the pool (session mode).
    let c = p.connect("postgres", "testdb").await;
    c.simple_query("select 1").await.unwrap();
    drop(c);
    wait_for("an idle server", Duration::from_secs(5), || async {
        obs.count("datname = 'testdb' and state = 'idle'", &[])
            .await
            == 1
    })
    .await;
    // Two replication clients at once, each for a second: one after the other.
    let started = Instant::now();
    let sleeper =
        |port: u16| std::thread::spawn(move || psql(&dsn(port, "database"), "select pg_sleep(1)"));
    let runs = [sleeper(p.port()), sleeper(p.port())];
    for r in runs {
        r.join().expect("psql thread");
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1900),
        "ran side by side: {took:?}"
    );
    // The idle server made room and was not opened again; no server is left behind.
    assert_eq!(testdb_backends(&obs).await, 0);
    assert_eq!(obs.count("backend_type = 'walsender'", &[]).await, 0);
    p.shutdown().await;
}

/// A replication login the server refuses: the client is told `login failed`, as by
/// PgBouncer, and pgcarpool's log says why (PostgreSQL's words).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_replication_login_says_login_failed() {
    let pg = TempPostgres::start();
    let p = PoolerProcess::start(TestPooler::builder(&pg)).await;
    let out = Command::new(harness::pg_bin("psql"))
        .args(["-X", "-c", "IDENTIFY_SYSTEM", "-d"])
        .arg(format!(
            "host=127.0.0.1 port={} user=md5user password=md5pass dbname=testdb \
             replication=database",
            p.port()
        ))
        .output()
        .unwrap();
    let text = output_text(&out);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("FATAL:  login failed"), "{text}");
    let log = p.log();
    // PostgreSQL 16 and newer word the refusal differently.
    assert!(
        log.contains("must be superuser or replication role")
            || log.contains("permission denied to start WAL sender")
            || log.contains("no pg_hba.conf entry for replication connection"),
        "{log}"
    );
    assert_eq!(
        log.matches("closing because: login failed (age=").count(),
        2,
        "{log}"
    );
    // The pool still serves normal clients.
    let c = p.connect("md5user").await;
    c.simple_query("select 1").await.unwrap();
}
