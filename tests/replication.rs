//! Replication connections through pgcarpool (`replication=true|database`), passed to a
//! server connection of their own as PgBouncer 1.23+ does: pg_basebackup, replication
//! commands over psql, and logical slots with pg_recvlogical. PostgreSQL answers directly
//! and through pgcarpool alike.
mod harness;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use harness::process::PoolerProcess;
use harness::{Observer, TempPostgres, TestPooler, output_text, pg_bin, wait_for};

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
    let out = run(Command::new(pg_bin("psql")).args([
        "-X",
        "-A",
        "-t",
        "-v",
        "ON_ERROR_STOP=1",
        "-d",
        dsn,
        "-c",
        sql,
    ]));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
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
    let recvlogical = |args: &[&str]| {
        run(Command::new(pg_bin("pg_recvlogical"))
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
    // A normal client of the same database is not disturbed.
    let c = p.connect("postgres", "testdb").await;
    c.simple_query("select 1").await.unwrap();
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_basebackup_runs_through_pgcarpool() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg).start().await;
    let target = tempfile::tempdir().unwrap();
    let backup = target.path().join("backup");
    run(Command::new(pg_bin("pg_basebackup"))
        .arg("-d")
        .arg(format!(
            "host=127.0.0.1 port={} user=postgres password=postgres",
            p.port()
        ))
        .arg("-D")
        .arg(&backup)
        .args(["-X", "stream", "-c", "fast", "--no-sync"]));
    let version = std::fs::read_to_string(backup.join("PG_VERSION")).unwrap();
    assert_eq!(
        version.trim(),
        pg.psql("show server_version_num").trim()[..2].to_string()
    );
    assert!(backup.join("backup_label").exists() || backup.join("backup_manifest").exists());
    p.shutdown().await;
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
    let out = Command::new(pg_bin("psql"))
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
    assert!(
        log.contains("must be superuser or replication role")
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
