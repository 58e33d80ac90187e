//! Queries through pgcarpool in session, transaction and statement mode, with each auth method.
mod harness;

use harness::{TempPostgres, TestPooler};

async fn pooler(pg: &TempPostgres, mode: &str) -> TestPooler {
    TestPooler::builder(pg)
        .setting("pool_mode", mode)
        .setting("default_pool_size", "2")
        .start()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simple_and_extended_queries_work_in_every_mode() {
    let pg = TempPostgres::start();
    for mode in ["session", "transaction", "statement"] {
        let p = pooler(&pg, mode).await;
        let c = p.connect("postgres", "testdb").await;
        let msgs = c.simple_query("select 1; select 'a'").await.unwrap();
        let rows: Vec<_> = msgs
            .iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
                _ => None,
            })
            .collect();
        assert_eq!(rows, ["1", "a"], "{mode}");
        let row = c.query_one("select $1::int + 1", &[&41i32]).await.unwrap();
        assert_eq!(row.get::<_, i32>(0), 42, "{mode}");
        drop(c);
        p.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_auth_method_logs_in_and_reaches_the_server() {
    let pg = TempPostgres::start();
    for auth_type in ["md5", "scram-sha-256", "plain", "trust"] {
        let p = TestPooler::builder(&pg)
            .setting("auth_type", auth_type)
            .setting("pool_mode", "transaction")
            .start()
            .await;
        for user in ["postgres", "md5user", "scramuser", "trustuser"] {
            if auth_type == "trust" && user == "scramuser" {
                // No password to log in to the server with and no client SCRAM exchange to learn from.
                continue;
            }
            let c = p.connect(user, "testdb").await;
            let row = c.query_one("select current_user::text", &[]).await.unwrap();
            assert_eq!(row.get::<_, String>(0), user, "{auth_type}/{user}");
        }
        p.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_is_refused_with_28p01() {
    let pg = TempPostgres::start();
    for auth_type in ["md5", "scram-sha-256", "plain"] {
        let p = TestPooler::builder(&pg)
            .setting("auth_type", auth_type)
            .start()
            .await;
        let dsn = harness::dsn_with_password(p.port(), "md5user", Some("wrong"), "testdb");
        let Err(err) = harness::try_connect(&dsn).await else {
            panic!("{auth_type}: wrong password accepted")
        };
        assert_eq!(harness::sqlstate(&err), Some("28P01"), "{auth_type}: {err}");
        // Still serving.
        let c = p.connect("md5user", "testdb").await;
        c.simple_query("select 1").await.unwrap();
        p.shutdown().await;
    }
}

/// The address each of `n` clients' servers was reached at (`inet_server_addr()`), each
/// client holding its server in a transaction so that `n` servers are opened.
async fn server_addrs(p: &TestPooler, db: &str, n: usize) -> Vec<String> {
    let mut clients = Vec::new();
    let mut addrs = Vec::new();
    for _ in 0..n {
        let c = p.connect("md5user", db).await;
        c.batch_execute("begin").await.unwrap();
        let row = c
            .query_one("select host(inet_server_addr())", &[])
            .await
            .unwrap();
        addrs.push(row.get::<_, String>(0));
        clients.push(c);
    }
    addrs.sort();
    addrs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_list_is_used_round_robin_or_in_order_with_fallback() {
    // PostgreSQL on two loopback addresses.
    let pg = TempPostgres::start_with(&[("listen_addresses", "127.0.0.1,127.0.0.2")]);
    let entry =
        |hosts: &str, extra: &str| format!("host={hosts} port={} dbname=testdb {extra}", pg.port());
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("server_login_retry", "0.1")
        .database("rr", &entry("127.0.0.1,127.0.0.2", ""))
        .database(
            "first",
            &entry("127.0.0.1,127.0.0.2", "load_balance_hosts=disable"),
        )
        .database(
            "fallback",
            &entry(
                "no-such-host.invalid,127.0.0.2",
                "load_balance_hosts=disable",
            ),
        )
        .database(
            "refused",
            &entry("127.0.0.3,127.0.0.2", "load_balance_hosts=disable"),
        )
        .start()
        .await;
    // round-robin (the default): each new server on the next host.
    assert_eq!(server_addrs(&p, "rr", 2).await, ["127.0.0.1", "127.0.0.2"]);
    // disable: the first host while it works.
    assert_eq!(
        server_addrs(&p, "first", 2).await,
        ["127.0.0.1", "127.0.0.1"]
    );
    // disable with a bad first host (a name that does not resolve, a host where nothing
    // listens): the login moves on to the next host at once, the client sees no error,
    // and later servers go to the working host.
    for db in ["fallback", "refused"] {
        let c = p.connect("md5user", db).await;
        c.simple_query("select 1").await.unwrap();
    }
    assert_eq!(
        server_addrs(&p, "refused", 2).await,
        ["127.0.0.2", "127.0.0.2"]
    );
    assert_eq!(
        server_addrs(&p, "fallback", 2).await,
        ["127.0.0.2", "127.0.0.2"]
    );
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_options_set_the_session_and_anything_else_is_refused() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("ignore_startup_parameters", "extra_float_digits")
        .start()
        .await;
    let connect = |options: &str| {
        let mut cfg = tokio_postgres::Config::new();
        cfg.host("127.0.0.1")
            .port(p.port())
            .user("md5user")
            .password("md5pass")
            .dbname("testdb")
            .options(options);
        async move {
            let (c, conn) = cfg.connect(tokio_postgres::NoTls).await?;
            tokio::spawn(conn);
            Ok::<_, tokio_postgres::Error>(c)
        }
    };
    let show = |c: tokio_postgres::Client, what: &'static str| async move {
        let row = c.query_one(&format!("show {what}"), &[]).await.unwrap();
        row.get::<_, String>(0)
    };
    for options in [
        "-c timezone=Europe/Lisbon  -c    datestyle=German,\\ YMD",
        "-ctimezone=Europe/Lisbon  -cdatestyle=German,\\ YMD",
        "--timezone=Europe/Lisbon  --datestyle=German,\\ YMD",
    ] {
        let c = connect(options).await.unwrap();
        assert_eq!(show(c, "timezone").await, "Europe/Lisbon", "{options}");
        let c = connect(options).await.unwrap();
        assert_eq!(show(c, "datestyle").await, "German, YMD", "{options}");
    }
    // Ignored (ignore_startup_parameters) inside options too: PostgreSQL's default stays.
    let c = connect("-c extra_float_digits=2").await.unwrap();
    assert_eq!(show(c, "extra_float_digits").await, "1");
    // Other server options cannot go through a pool: PgBouncer's refusal.
    for bad in ["-d", "-c", "-c timezone"] {
        let Err(e) = connect(bad).await else {
            panic!("bad options {bad:?} accepted")
        };
        let db = e.as_db_error().expect("an ErrorResponse");
        assert_eq!(
            (db.code().code(), db.message()),
            (
                "08P01",
                "unsupported options startup parameter: only '-c config=val' and '--config=val' are allowed"
            ),
            "{bad}"
        );
    }
    p.shutdown().await;
}
