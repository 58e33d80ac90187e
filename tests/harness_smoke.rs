//! The test harness itself: TempPostgres against a real PostgreSQL (the pooler half
//! needs pgcarpool, which other test files exercise).
mod harness;

use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::time::Duration;

use harness::{TempPostgres, TestPooler};

#[tokio::test]
async fn temp_postgres_starts_and_answers_queries() {
    let pg = TempPostgres::start();
    assert_eq!(pg.psql("SELECT 1 + 1"), "2");
    let client = pg.connect("postgres", "postgres").await;
    let row = client.query_one("SELECT 40 + 2", &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 42);
}

#[test]
fn temp_postgres_uses_the_harness_settings() {
    let pg = TempPostgres::start();
    assert_eq!(pg.psql("SHOW max_connections"), "300");
    assert_eq!(pg.psql("SHOW fsync"), "off");
    assert_eq!(pg.psql("SHOW listen_addresses"), "127.0.0.1");
    assert_eq!(pg.psql("SHOW port"), pg.port().to_string());
    let socket_dir = pg.socket_dir().to_string_lossy().into_owned();
    assert_eq!(pg.psql("SHOW unix_socket_directories"), socket_dir);
}

#[test]
fn start_with_overrides_settings() {
    let pg = TempPostgres::start_with(&[("max_connections", "42"), ("application_name", "x y")]);
    assert_eq!(pg.psql("SHOW max_connections"), "42");
}

#[tokio::test]
async fn postgres_logs_in_with_trust() {
    let pg = TempPostgres::start();
    let client = harness::try_connect(&harness::dsn_with_password(
        pg.port(),
        "postgres",
        None,
        "postgres",
    ))
    .await
    .unwrap();
    let row = client
        .query_one(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .await
        .unwrap();
    assert!(row.get::<_, bool>(0));
}

#[tokio::test]
async fn trustuser_logs_in_without_a_password() {
    let pg = TempPostgres::start();
    let dsn = harness::dsn_with_password(pg.port(), "trustuser", None, "testdb");
    let client = harness::try_connect(&dsn).await.unwrap();
    let row = client
        .query_one("SELECT current_user::text", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "trustuser");
}

#[tokio::test]
async fn md5user_logs_in_with_md5() {
    let pg = TempPostgres::start();
    let stored = pg.psql("SELECT rolpassword FROM pg_authid WHERE rolname = 'md5user'");
    assert!(
        stored.starts_with("md5"),
        "md5user's password is stored as {stored}"
    );
    let client = pg.connect("md5user", "testdb").await;
    let row = client
        .query_one("SELECT current_user::text", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "md5user");
}

#[tokio::test]
async fn scramuser_logs_in_with_scram() {
    let pg = TempPostgres::start();
    let stored = pg.psql("SELECT rolpassword FROM pg_authid WHERE rolname = 'scramuser'");
    assert!(
        stored.starts_with("SCRAM-SHA-256$"),
        "scramuser's password is stored as {stored}"
    );
    let client = pg.connect("scramuser", "testdb").await;
    let row = client
        .query_one("SELECT current_user::text", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "scramuser");
}

#[tokio::test]
async fn md5user_with_a_wrong_password_is_refused_with_28p01() {
    let pg = TempPostgres::start();
    let dsn = harness::dsn_with_password(pg.port(), "md5user", Some("wrong"), "testdb");
    let Err(err) = harness::try_connect(&dsn).await else {
        panic!("login must fail");
    };
    assert_eq!(harness::sqlstate(&err), Some("28P01"), "{err}");
}

#[tokio::test]
async fn scramuser_with_a_wrong_password_is_refused_with_28p01() {
    let pg = TempPostgres::start();
    let dsn = harness::dsn_with_password(pg.port(), "scramuser", Some("wrong"), "testdb");
    let Err(err) = harness::try_connect(&dsn).await else {
        panic!("login must fail");
    };
    assert_eq!(harness::sqlstate(&err), Some("28P01"), "{err}");
}

#[tokio::test]
async fn every_test_role_can_create_tables_in_testdb() {
    let pg = TempPostgres::start();
    for (user, _) in harness::TEST_ROLES {
        let client = pg.connect(user, "testdb").await;
        client
            .batch_execute(&format!(
                "CREATE TABLE t_{user} (id int); INSERT INTO t_{user} VALUES (1)"
            ))
            .await
            .unwrap_or_else(|e| panic!("{user}: {e}"));
    }
    assert_eq!(
        pg.psql_in(
            "testdb",
            "SELECT count(*) FROM pg_tables WHERE tablename LIKE 't\\_%'"
        ),
        "4"
    );
}

#[test]
fn two_instances_run_at_once_on_different_ports() {
    let a = TempPostgres::start();
    let b = TempPostgres::start();
    assert_ne!(a.port(), b.port());
    a.psql("CREATE TABLE only_in_a (id int)");
    assert_eq!(
        a.psql("SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'"),
        "1"
    );
    assert_eq!(
        b.psql("SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'"),
        "0"
    );
}

#[test]
fn drop_stops_the_server() {
    let pg = TempPostgres::start();
    let port = pg.port();
    let dir = pg.socket_dir().to_path_buf();
    let addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
    TcpStream::connect(addr).expect("server accepts before drop");
    drop(pg);
    let refused = TcpStream::connect(addr).expect_err("server must be gone after drop");
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    assert!(!dir.exists(), "temp dir {} removed", dir.display());
}

#[test]
fn stop_and_start_again_keep_the_port_and_the_data() {
    let pg = TempPostgres::start();
    pg.psql("CREATE TABLE kept (id int); INSERT INTO kept VALUES (7)");
    let addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, pg.port());
    pg.stop();
    let refused = TcpStream::connect(addr).expect_err("server must be down after stop");
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    pg.start_again();
    assert_eq!(pg.psql("SELECT id FROM kept"), "7");
}

#[tokio::test]
async fn restart_ends_existing_sessions() {
    let pg = TempPostgres::start();
    let client = pg.connect("md5user", "testdb").await;
    client.simple_query("SELECT 1").await.unwrap();
    pg.restart();
    assert!(client.simple_query("SELECT 1").await.is_err());
    let again = pg.connect("md5user", "testdb").await;
    again.simple_query("SELECT 1").await.unwrap();
}

#[test]
fn log_records_server_messages() {
    let pg = TempPostgres::start();
    let _ = pg.psql("DO $$ BEGIN RAISE LOG 'harness-log-marker'; END $$");
    assert!(pg.log().contains("harness-log-marker"), "{}", pg.log());
}

#[test]
fn pgbench_runs_against_temp_postgres() {
    let pg = TempPostgres::start();
    let dsn = pg.dsn("postgres", "testdb");
    let init = harness::run_pgbench(&["-i", "-s", "1", "-q", &dsn]);
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    let run = harness::run_pgbench(&["-S", "-t", "20", "-c", "2", &dsn]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(String::from_utf8_lossy(&run.stdout).contains("tps = "));
}

#[test]
fn pg_bin_finds_postgresql_programs() {
    for name in ["postgres", "initdb", "pg_ctl", "psql", "pgbench"] {
        assert!(harness::pg_bin(name).is_file(), "{name}");
    }
}

#[test]
fn pooler_builder_writes_a_fallback_entry_and_the_test_roles() {
    let pg = TempPostgres::start();
    let builder = TestPooler::builder(&pg).setting("pool_mode", "transaction");
    let ini = builder.ini_text();
    assert!(
        ini.contains(&format!("* = host=127.0.0.1 port={}\n", pg.port())),
        "{ini}"
    );
    assert!(ini.contains("listen_port = 0\n"), "{ini}");
    assert!(ini.contains("unix_socket_dir =\n"), "{ini}");
    assert!(ini.contains("pool_mode = transaction\n"), "{ini}");
    let users = builder.auth_file_text();
    for (user, password) in harness::TEST_ROLES {
        assert!(
            users.contains(&format!("\"{user}\" \"{password}\"\n")),
            "{users}"
        );
    }
}

#[test]
fn pooler_builder_named_databases_replace_the_fallback() {
    let pg = TempPostgres::start();
    let ini = TestPooler::builder(&pg)
        .database("app", &pg.db_entry("testdb"))
        .user_entry("md5user", "pool_mode=session")
        .ini_text();
    assert!(!ini.contains("* = "), "{ini}");
    assert!(
        ini.contains(&format!(
            "app = host=127.0.0.1 port={} dbname=testdb\n",
            pg.port()
        )),
        "{ini}"
    );
    assert!(ini.contains("md5user = pool_mode=session\n"), "{ini}");
}

/// `wait_value` returns the first value its probe gives, after polling on.
#[tokio::test]
async fn wait_value_returns_the_first_value_seen() {
    let mut polls = 0;
    let got = harness::wait_value("the third poll", Duration::from_secs(5), || {
        polls += 1;
        let seen = (polls >= 3).then_some(polls);
        async move { seen }
    })
    .await;
    assert_eq!(got, 3);
}

/// `wait_value` fails the test, naming what it waited for, when the deadline passes.
#[tokio::test]
#[should_panic(expected = "waiting for: a value that never comes")]
async fn wait_value_gives_up_at_its_deadline() {
    let limit = Duration::from_millis(50);
    harness::wait_value("a value that never comes", limit, || async { None::<()> }).await;
}

/// `assert_stays` looks all through its window, not only at its end: a condition false
/// for a moment in the middle fails it.
#[tokio::test]
#[should_panic(expected = "the flag stays up: no longer so")]
async fn assert_stays_sees_a_lapse_inside_the_window() {
    let mut polls = 0;
    harness::assert_stays("the flag stays up", Duration::from_millis(300), || {
        polls += 1;
        let up = polls != 3;
        async move { up }
    })
    .await;
}

/// `assert_stays` passes when the condition holds the whole window, looking more than once.
#[tokio::test]
async fn assert_stays_passes_when_the_condition_holds() {
    let mut polls = 0;
    harness::assert_stays("always", Duration::from_millis(200), || {
        polls += 1;
        async { true }
    })
    .await;
    assert!(polls > 1, "looked {polls} time(s)");
}

#[test]
fn major_versions_are_read_from_version_lines() {
    let major = harness::major_of_version_line;
    assert_eq!(
        major("pg_basebackup (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)\n"),
        Some(15)
    );
    assert_eq!(major("postgres (PostgreSQL) 18.4\n"), Some(18));
    assert_eq!(major("postgres (PostgreSQL) 9.6.24\n"), Some(9));
    assert_eq!(major("garbage"), None);
}

#[test]
fn the_server_major_is_that_of_the_postgres_program() {
    let major = harness::server_major();
    assert!((14..=30).contains(&major), "{major}");
    let postgres = harness::pg_bin("postgres");
    assert_eq!(harness::program_major(&postgres), Some(major));
}

/// The standby `start_standby` makes when no pg_basebackup of the server's major is
/// installed (a low-level backup and a file copy): in recovery, with the primary's rows of
/// before the copy, and streaming what the primary writes after it.
#[tokio::test]
async fn a_standby_made_by_a_file_copy_streams_from_the_primary() {
    let primary = TempPostgres::start();
    primary.psql("CREATE TABLE t (n int); INSERT INTO t VALUES (1)");
    let standby = primary.start_standby_by_copy();
    assert_eq!(standby.psql("SELECT pg_is_in_recovery()"), "t");
    assert_eq!(standby.psql("SELECT count(*) FROM t"), "1");
    primary.psql("INSERT INTO t VALUES (2)");
    harness::wait_for(
        "the standby to replay the row written after the copy",
        Duration::from_secs(30),
        || async { standby.psql("SELECT count(*) FROM t") == "2" },
    )
    .await;
    assert_eq!(
        primary.psql("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'"),
        "1"
    );
}
