//! Settings that change what clients see or how long pgcarpool keeps things, each as
//! PgBouncer documents it: disable_pqexec, autodb_idle_timeout, pool_idle_timeout,
//! track_extra_parameters, login_notify_message, scram_iterations, conffile.
mod harness;

use std::time::Duration;

use harness::{TempPostgres, TestPooler, console_value, output_text, pg_bin, sqlstate, wait_for};
use tokio_postgres::error::DbError;

/// Bound on anything the janitor (every 250 ms) should do promptly.
const PROMPTLY: Duration = Duration::from_secs(10);

fn db_error(e: &tokio_postgres::Error) -> &DbError {
    e.as_db_error()
        .unwrap_or_else(|| panic!("not a server error: {e:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disable_pqexec_refuses_simple_queries_and_serves_extended_ones() {
    let pg = TempPostgres::start();
    let p = harness::transaction_pooler(&pg)
        .setting("disable_pqexec", "1")
        .start()
        .await;
    // The extended protocol is served, in and out of a transaction.
    // (Statements kept: dropping one makes tokio-postgres send a Close, whose answer
    // would be pending when the Query is refused.)
    let c = p.connect("md5user", "testdb").await;
    let add = c.prepare("select $1::int + 1").await.unwrap();
    let row = c.query_one(&add, &[&41i32]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 42);
    let begin = c.prepare("begin").await.unwrap();
    c.execute(&begin, &[]).await.unwrap();
    c.query_one(&add, &[&1i32]).await.unwrap();
    // A simple Query inside the transaction (a server is held): PgBouncer's FATAL.
    let e = c.batch_execute("select 1; select 2").await.unwrap_err();
    assert_eq!(db_error(&e).message(), "PQexec disallowed");
    assert_eq!(db_error(&e).severity(), "FATAL");
    assert_eq!(sqlstate(&e), Some("08P01"));
    assert!(c.is_closed() || c.query_one("select 1", &[]).await.is_err());

    // As a client's first message (no server held): psql -c sends a simple Query.
    let out = std::process::Command::new(pg_bin("psql"))
        .args([&p.dsn("md5user", "testdb"), "-c", "select 1"])
        .output()
        .expect("run psql");
    let text = output_text(&out);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("FATAL:  PQexec disallowed"), "{text}");

    // The console is not a database: its simple queries are served.
    let admin = p.connect("postgres", "pgbouncer").await;
    let v = console_value(&admin, "CONFIG", &[("key", "disable_pqexec")], "value").await;
    assert_eq!(v.as_deref(), Some("1"));
    p.shutdown().await;
}

/// Whether SHOW POOLS lists (db, user).
async fn has_pool(admin: &tokio_postgres::Client, db: &str, user: &str) -> bool {
    console_value(
        admin,
        "POOLS",
        &[("database", db), ("user", user)],
        "database",
    )
    .await
    .is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unused_pools_are_freed_after_autodb_and_pool_idle_timeouts() {
    let pg = TempPostgres::start();
    let mut p = TestPooler::builder(&pg)
        .database("*", &format!("host=127.0.0.1 port={}", pg.port()))
        .database("app", &pg.db_entry("testdb"))
        .settings(&[
            ("pool_mode", "transaction"),
            ("server_idle_timeout", "0.2"),
            ("autodb_idle_timeout", "1"),
            ("pool_idle_timeout", "0"),
        ])
        .start()
        .await;
    let admin = p.connect("postgres", "pgbouncer").await;
    for db in ["testdb", "app"] {
        let c = p.connect("md5user", db).await;
        c.query_one("select 1", &[]).await.unwrap();
        assert!(has_pool(&admin, db, "md5user").await, "{db} pool made");
    }
    // Clients gone, servers closed by server_idle_timeout: the auto-database's pool goes
    // after autodb_idle_timeout; the named one stays (pool_idle_timeout = 0).
    wait_for("the auto-database's pool freed", PROMPTLY, || async {
        !has_pool(&admin, "testdb", "md5user").await
    })
    .await;
    assert!(has_pool(&admin, "app", "md5user").await, "named pool kept");

    // A client holding the pool keeps it (it is in use, even with no server).
    p.reload_with(|c| c.setting("pool_idle_timeout", "1")).await;
    let held = p.connect("md5user", "app").await;
    let c = p.connect("md5user", "testdb").await;
    c.query_one("select 1", &[]).await.unwrap();
    drop(c);
    // `held` is idle between transactions: its pool must not be freed under it.
    wait_for("the auto-database's pool freed again", PROMPTLY, || async {
        !has_pool(&admin, "testdb", "md5user").await
    })
    .await;
    assert!(has_pool(&admin, "app", "md5user").await, "held pool kept");
    held.query_one("select 1", &[]).await.unwrap();
    drop(held);
    wait_for(
        "the named pool freed after pool_idle_timeout",
        PROMPTLY,
        || async { !has_pool(&admin, "app", "md5user").await },
    )
    .await;
    // And made again by the next client.
    let c = p.connect("md5user", "app").await;
    c.query_one("select 1", &[]).await.unwrap();
    p.shutdown().await;
}

/// One backend message (tag, body) from a raw socket.
async fn read_msg(s: &mut tokio::net::TcpStream) -> (u8, Vec<u8>) {
    use tokio::io::AsyncReadExt;
    let mut head = [0u8; 5];
    s.read_exact(&mut head).await.unwrap();
    let len = u32::from_be_bytes(head[1..5].try_into().unwrap()) as usize;
    let mut body = vec![0u8; len - 4];
    s.read_exact(&mut body).await.unwrap();
    (head[0], body)
}

/// The iteration count (`i=`) of the server-first-message pgcarpool sends `user` in a
/// SCRAM-SHA-256 login (the login goes no further).
async fn scram_iterations_offered(port: u16, user: &str) -> u32 {
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let startup = harness::wire::startup_message(&[("user", user), ("database", "testdb")]);
    s.write_all(&startup).await.unwrap();
    let (tag, body) = read_msg(&mut s).await;
    assert_eq!(
        (tag, &body[..4]),
        (b'R', &10u32.to_be_bytes()[..]),
        "AuthenticationSASL"
    );
    let first = b"n,,n=,r=abcdefghijklmnopqrstuvwx";
    let mut sasl = b"SCRAM-SHA-256\0".to_vec();
    sasl.extend_from_slice(&(first.len() as u32).to_be_bytes());
    sasl.extend_from_slice(first);
    s.write_all(&harness::wire::message(b'p', &sasl))
        .await
        .unwrap();
    let (tag, body) = read_msg(&mut s).await;
    assert_eq!(
        (tag, &body[..4]),
        (b'R', &11u32.to_be_bytes()[..]),
        "SASLContinue"
    );
    let text = String::from_utf8_lossy(&body[4..]).to_string();
    text.split(',')
        .find_map(|f| f.strip_prefix("i="))
        .and_then(|i| i.parse().ok())
        .unwrap_or_else(|| panic!("server-first-message: {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_iterations_sets_the_iterations_of_secrets_made_from_plain_passwords() {
    let pg = TempPostgres::start();
    let mut p = TestPooler::builder(&pg)
        .settings(&[("auth_type", "scram-sha-256"), ("scram_iterations", "5000")])
        .start()
        .await;
    // trustuser's auth_file secret is plain text: pgcarpool makes its SCRAM secret.
    assert_eq!(scram_iterations_offered(p.port(), "trustuser").await, 5000);
    // A user that does not exist looks the same.
    assert_eq!(
        scram_iterations_offered(p.port(), "nobody_here").await,
        5000
    );
    // And the login works with it.
    let c = p.connect("trustuser", "testdb").await;
    c.query_one("select 1", &[]).await.unwrap();
    // A reload changes the secrets made after it.
    p.reload_with(|c| c.setting("scram_iterations", "4100"))
        .await;
    assert_eq!(scram_iterations_offered(p.port(), "trustuser").await, 4100);
    let c = p.connect("trustuser", "testdb").await;
    c.query_one("select 1", &[]).await.unwrap();
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_notify_message_is_a_notice_at_login() {
    let pg = TempPostgres::start();
    let mut p = harness::transaction_pooler(&pg)
        .setting("login_notify_message", "maintenance at 22:00 UTC")
        .start()
        .await;
    let psql = |dsn: String| {
        let out = std::process::Command::new(pg_bin("psql"))
            .args([&dsn, "-Atc", "select 41 + 1"])
            .output()
            .expect("run psql");
        assert!(out.status.success(), "{}", output_text(&out));
        (
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (rows, notices) = psql(p.dsn("md5user", "testdb"));
    assert_eq!(rows.trim(), "42");
    assert_eq!(notices.trim(), "NOTICE:  maintenance at 22:00 UTC");
    // Off again on reload: no notice.
    p.reload_with(|c| c.setting("login_notify_message", ""))
        .await;
    let (_, notices) = psql(p.dsn("md5user", "testdb"));
    assert_eq!(notices.trim(), "");
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn track_extra_parameters_keeps_each_clients_startup_value_on_a_shared_server() {
    // PgBouncer restores the tracked parameters (IntervalStyle by default, and those
    // listed) on the server a client gets; pgcarpool does it for every parameter, listed
    // or not. Two clients with different values share one server (pool size 1).
    let pg = TempPostgres::start();
    let p = harness::transaction_pooler(&pg)
        .settings(&[
            ("default_pool_size", "1"),
            (
                "track_extra_parameters",
                "IntervalStyle, default_transaction_read_only",
            ),
        ])
        .start()
        .await;
    let dsn = |style: &str, ro: &str| {
        format!(
            "{} options='-c IntervalStyle={style} -c default_transaction_read_only={ro}'",
            p.dsn("md5user", "testdb")
        )
    };
    let a = harness::try_connect(&dsn("iso_8601", "on")).await.unwrap();
    let b = harness::try_connect(&dsn("sql_standard", "off"))
        .await
        .unwrap();
    let show = async |c: &tokio_postgres::Client| {
        let r = c
            .query_one(
                "select current_setting('IntervalStyle'), \
                 current_setting('default_transaction_read_only'), \
                 \"pg_backend_pid\"()",
                &[],
            )
            .await
            .unwrap();
        (
            r.get::<_, String>(0),
            r.get::<_, String>(1),
            r.get::<_, i32>(2),
        )
    };
    for _ in 0..3 {
        let (style_a, ro_a, pid_a) = show(&a).await;
        let (style_b, ro_b, pid_b) = show(&b).await;
        assert_eq!(pid_a, pid_b, "one server for both");
        assert_eq!((style_a.as_str(), ro_a.as_str()), ("iso_8601", "on"));
        assert_eq!((style_b.as_str(), ro_b.as_str()), ("sql_standard", "off"));
    }
    // What PostgreSQL itself says for such a client.
    let direct = harness::try_connect(&format!(
        "{} options='-c IntervalStyle=iso_8601'",
        pg.dsn("md5user", "testdb")
    ))
    .await
    .unwrap();
    let r = direct
        .query_one("select (interval '1 day')::text", &[])
        .await
        .unwrap();
    let through = a
        .query_one("select (interval '1 day')::text", &[])
        .await
        .unwrap();
    assert_eq!(r.get::<_, String>(0), through.get::<_, String>(0));
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conffile_shows_the_file_and_names_the_one_the_next_reload_reads() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg).start().await;
    let admin = p.connect("postgres", "pgbouncer").await;
    let config = async |key: &str| {
        console_value(&admin, "CONFIG", &[("key", key)], "value")
            .await
            .unwrap_or_else(|| panic!("SHOW CONFIG has {key}"))
    };
    let ini = p.dir().join("pgbouncer.ini");
    assert_eq!(config("conffile").await, ini.to_string_lossy());
    // Another file, named by SET conffile: RELOAD reads it.
    let other = p.dir().join("other.ini");
    let text = p
        .config_text()
        .replace("[pgbouncer]\n", "[pgbouncer]\ndefault_pool_size = 7\n");
    std::fs::write(&other, text).unwrap();
    assert_eq!(config("default_pool_size").await, "20");
    admin
        .simple_query(&format!("SET conffile = '{}'", other.display()))
        .await
        .unwrap();
    assert_eq!(config("conffile").await, other.to_string_lossy());
    assert_eq!(
        config("default_pool_size").await,
        "20",
        "not read before RELOAD"
    );
    admin.simple_query("RELOAD").await.unwrap();
    assert_eq!(config("default_pool_size").await, "7");
    assert_eq!(config("conffile").await, other.to_string_lossy());
    p.shutdown().await;
}
