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
