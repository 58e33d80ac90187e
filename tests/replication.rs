//! Replication connections through pgcarpool (`replication=true|database`), passed to a
//! server connection of their own as PgBouncer 1.23+ does: pg_basebackup, replication
//! commands over psql, and logical slots with pg_recvlogical. PostgreSQL answers directly
//! and through pgcarpool alike.
mod harness;

use std::process::{Command, Output};

use harness::{TempPostgres, TestPooler, output_text, pg_bin};

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
