//! The fast path (`client::fast`): a transaction of one plain simple Query on a server that
//! fits the session is served by it; anything it does not expect (an error, a block, a
//! setting, several statements) goes to the full path, or is handed over to it mid-way.
//! Either way the client gets what PostgreSQL gives it: the same script straight to
//! PostgreSQL and through pgcarpool, and the exported counters say which path served what.
mod harness;

use harness::{TempPostgres, transaction_pooler};
use tokio_postgres::SimpleQueryMessage;

/// What a simple Query gives a client: its rows, command tags, or its error's SQLSTATE.
async fn transcript(c: &tokio_postgres::Client, sql: &str) -> Vec<String> {
    match c.simple_query(sql).await {
        Ok(msgs) => msgs
            .iter()
            .map(|m| match m {
                SimpleQueryMessage::Row(r) => {
                    let cells: Vec<&str> =
                        (0..r.len()).map(|i| r.get(i).unwrap_or("NULL")).collect();
                    format!("row {}", cells.join(","))
                }
                SimpleQueryMessage::CommandComplete(n) => format!("complete {n}"),
                SimpleQueryMessage::RowDescription(_) => "description".into(),
                _ => "other".into(),
            })
            .collect(),
        Err(e) => vec![format!(
            "error {}",
            e.code().map(|c| c.code().to_string()).unwrap_or_default()
        )],
    }
}

/// A counter of the `testdb`/`postgres` pool in a `/metrics` text.
fn sample(body: &str, name: &str) -> u64 {
    let key = format!("{name}{{database=\"testdb\",user=\"postgres\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("/metrics has {key}: {body}"))
}

/// pgcarpool in transaction mode over a pool of one server, trust auth, with its metrics
/// listener: the pooler and the listener's port.
async fn pool_of_one(pg: &TempPostgres) -> (harness::TestPooler, u16) {
    transaction_pooler(pg)
        .setting("auth_type", "trust")
        .setting("default_pool_size", "1")
        .start_with_free_port("prometheus_port")
        .await
}

/// Each step of the script: the client, its query, and the path that serves it through
/// pgcarpool: (fast, handed over). Two clients take turns over a pool of one server.
const SCRIPT: [(usize, &str, (u64, u64)); 17] = [
    (0, "select 1", (1, 0)),
    (0, "SELECT 2 AS two;", (1, 0)),
    // An error: begun fast, handed over at the ErrorResponse.
    (0, "select 1/0", (0, 1)),
    (0, "select 3", (1, 0)),
    // A block: the full path's (its BEGIN is not plain; what follows is the relay's).
    (0, "begin", (0, 0)),
    (0, "select 4", (0, 0)),
    (0, "commit", (0, 0)),
    // A setting, read back by the full path; then shown on the server that fits it.
    (0, "set application_name = 'fp'", (0, 0)),
    (0, "show application_name", (1, 0)),
    (0, "select * from no_such_table", (0, 1)),
    (0, "select 1; select 2", (0, 0)),
    (0, "", (0, 0)),
    (0, "select 'a' as t", (1, 0)),
    // A `;` after a quote: not the text found in one pass.
    (0, "select 'a;b' as t", (0, 0)),
    // The server holds client 0's setting: client 1's session does not fit it, it is
    // made to fit (as the full path does) and the Query goes fast; so for client 0 again.
    (1, "show application_name", (1, 0)),
    (1, "select 5", (1, 0)),
    (0, "show application_name", (1, 0)),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_queries_go_fast_and_the_rest_as_postgresql_answers_them() {
    let pg = TempPostgres::start();
    let (p, metrics_port) = pool_of_one(&pg).await;
    let direct = [
        pg.connect("postgres", "testdb").await,
        pg.connect("postgres", "testdb").await,
    ];
    let pooled = [
        p.connect("postgres", "testdb").await,
        p.connect("postgres", "testdb").await,
    ];
    let counts = || async {
        let body = harness::metrics(metrics_port).await;
        (
            sample(&body, "pgcarpool_fast_transactions_total"),
            sample(&body, "pgcarpool_fast_handovers_total"),
        )
    };
    for (client, sql, (fast, handed)) in SCRIPT {
        let before = counts().await;
        let want = transcript(&direct[client], sql).await;
        let got = transcript(&pooled[client], sql).await;
        assert_eq!(got, want, "client {client}: {sql:?}");
        let after = counts().await;
        assert_eq!(
            (after.0 - before.0, after.1 - before.1),
            (fast, handed),
            "client {client}: {sql:?} (fast, handed over)"
        );
    }
    p.shutdown().await;
}

/// A client that waits for the pool's one server (another client holds it in a block) is
/// served by the fast path once it is free, and gets what PostgreSQL gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_query_that_waits_for_a_server_goes_fast() {
    let pg = TempPostgres::start();
    let (p, metrics_port) = pool_of_one(&pg).await;
    let holder = p.connect("postgres", "testdb").await;
    let waiter = p.connect("postgres", "testdb").await;
    let fast = || async {
        sample(
            &harness::metrics(metrics_port).await,
            "pgcarpool_fast_transactions_total",
        )
    };
    holder.simple_query("begin").await.unwrap();
    let before = fast().await;
    let waiting = tokio::spawn(async move { transcript(&waiter, "select 42 as answer").await });
    harness::wait_for(
        "the waiter in line",
        std::time::Duration::from_secs(10),
        || async {
            let body = harness::metrics(metrics_port).await;
            sample(&body, "pgcarpool_pool_waiting_clients") == 1
        },
    )
    .await;
    assert!(!waiting.is_finished(), "served while the server was held");
    holder.simple_query("commit").await.unwrap();
    let got = waiting.await.unwrap();
    assert_eq!(got, ["description", "row 42", "complete 1"]);
    assert_eq!(fast().await - before, 1, "the waiter's query went fast");
    p.shutdown().await;
}

/// The pool's one server terminated while idle (`pg_terminate_backend`, its FATAL on the
/// way or already there): a plain query on it is handed over and sent again on a new
/// server (the first-request replay), never the lost-server 40001. Over and over, as the
/// FATAL races the query.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_terminated_while_idle_is_replaced_under_a_fast_query() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("default_pool_size", "1")
        .start()
        .await;
    let admin = pg.connect("postgres", "testdb").await;
    let client = p.connect("md5user", "testdb").await;
    for round in 0..30 {
        assert_eq!(
            transcript(&client, "select 1").await,
            ["description", "row 1", "complete 1"],
            "round {round}: before"
        );
        admin
            .simple_query(
                "select pg_terminate_backend(pid) from pg_stat_activity \
                 where usename = 'md5user' and pid <> pg_backend_pid()",
            )
            .await
            .unwrap();
        assert_eq!(
            transcript(&client, "select 2").await,
            ["description", "row 2", "complete 1"],
            "round {round}: on the terminated server"
        );
    }
    p.shutdown().await;
}
