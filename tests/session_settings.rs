//! A session with many settings in transaction mode: each client sees its own settings on
//! whatever server it lands, others never do, RESET/RESET ALL/DISCARD ALL work as in
//! PostgreSQL, and a server is sent only what differs (counted in PostgreSQL's log).
mod harness;

use harness::{TempPostgres, TestPooler};
use tokio_postgres::{Client, SimpleQueryMessage};

/// Settings each client of these tests holds.
const N: usize = 300;

async fn pooler(pg: &TempPostgres, round_robin: bool) -> TestPooler {
    TestPooler::builder(pg)
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "2")
        .setting("server_round_robin", if round_robin { "1" } else { "0" })
        .start()
        .await
}

/// Make the pool open both its servers: one held in a transaction while another client
/// runs a query.
async fn open_two_servers(p: &TestPooler) {
    let (x, y) = (
        p.connect("md5user", "testdb").await,
        p.connect("md5user", "testdb").await,
    );
    x.batch_execute("BEGIN").await.unwrap();
    assert_eq!(rows(&y, "select 1").await, ["1"]);
    x.batch_execute("COMMIT").await.unwrap();
}

/// `SET my.s{i} = 'v{i}'` for each i in `from..=to`, as one query.
fn sets(from: usize, to: usize) -> String {
    (from..=to)
        .map(|i| format!("SET my.s{i} = 'v{i}'; "))
        .collect()
}

/// The first column of each row of a simple query.
async fn rows(c: &Client, sql: &str) -> Vec<String> {
    let msgs = c.simple_query(sql).await.expect(sql);
    msgs.iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap_or("NULL").to_string()),
            _ => None,
        })
        .collect()
}

/// How many of my.s1..my.sN this session has with a value.
const HELD: &str = "select count(*) from generate_series(1, 300) i \
    where coalesce(current_setting('my.s' || i, true), '') <> ''";

/// All of my.s1..my.sN, joined.
const VALUES: &str = "select string_agg(coalesce(current_setting('my.s' || i, true), '-'), ',' \
    order by i) from generate_series(1, 300) i";

/// Settings of `my.` that pgcarpool applied (set_config) and reset (RESET) in PostgreSQL's
/// log after byte `from`.
fn sent(pg: &TempPostgres, from: usize) -> (usize, usize) {
    let log = pg.log();
    let new = log.get(from..).unwrap_or_default();
    (
        new.matches("set_config('my.").count(),
        new.matches("RESET \"my\".").count(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_settings_follow_their_client_and_reset_as_in_postgresql() {
    let pg = TempPostgres::start();
    // Round robin: each transaction of a client runs on the other server.
    let p = pooler(&pg, true).await;
    open_two_servers(&p).await;
    let direct = pg.connect("md5user", "testdb").await;
    let pooled = p.connect("md5user", "testdb").await;
    let other = p.connect("md5user", "testdb").await;
    let script = [
        sets(1, N),
        VALUES.into(),
        VALUES.into(),
        HELD.into(),
        "RESET my.s1".into(),
        VALUES.into(),
        VALUES.into(),
        "SET my.s2 = 'changed'".into(),
        VALUES.into(),
        VALUES.into(),
        "RESET ALL".into(),
        HELD.into(),
        HELD.into(),
        sets(1, N),
        HELD.into(),
        "DISCARD ALL".into(),
        HELD.into(),
        HELD.into(),
    ];
    for (step, sql) in script.iter().enumerate() {
        let want = rows(&direct, sql).await;
        assert_eq!(rows(&pooled, sql).await, want, "step {step}");
        // Another client, on either server, never sees them.
        for _ in 0..2 {
            assert_eq!(rows(&other, HELD).await, ["0"], "after step {step}");
        }
    }
    assert_eq!(rows(&direct, HELD).await, ["0"]);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_settings_that_differ_are_sent_to_a_server() {
    let pg = TempPostgres::start_with(&[("log_statement", "all")]);
    let p = pooler(&pg, true).await;
    open_two_servers(&p).await;
    let c = p.connect("md5user", "testdb").await;
    c.batch_execute(&sets(1, N)).await.unwrap();
    // The other server gets them all: it never held any.
    let mark = pg.log().len();
    let pid_b = rows(&c, "select \"pg_backend_pid\"()").await;
    assert_eq!(sent(&pg, mark), (N, 0));
    // One more and one changed, on the first server: the second gets those two only.
    let mark = pg.log().len();
    let pid_a = rows(
        &c,
        "SET my.s301 = 'new'; SET my.s7 = 'changed'; select \"pg_backend_pid\"()",
    )
    .await;
    assert_ne!(
        pid_a, pid_b,
        "the transactions alternate between the servers"
    );
    let got = rows(
        &c,
        "select current_setting('my.s301') || current_setting('my.s7') || \"pg_backend_pid\"()",
    )
    .await;
    assert_eq!(got, [format!("newchanged{}", pid_b[0])]);
    assert_eq!(sent(&pg, mark), (2, 0));
    // Back and forth with nothing new: nothing sent.
    let mark = pg.log().len();
    for _ in 0..6 {
        assert_eq!(
            rows(&c, "select current_setting('my.s300')").await,
            ["v300"]
        );
    }
    assert_eq!(sent(&pg, mark), (0, 0));
    // One reset: one statement for it on the other server.
    let mark = pg.log().len();
    c.batch_execute("RESET my.s300").await.unwrap();
    let got = rows(&c, "select coalesce(current_setting('my.s300', true), '')").await;
    assert_eq!(got, [""]);
    let (applied, reset) = sent(&pg, mark);
    assert_eq!(applied + reset, 1);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bystander_and_a_client_with_many_settings_keep_their_servers() {
    let pg = TempPostgres::start_with(&[("log_statement", "all")]);
    let p = pooler(&pg, false).await;
    let heavy = p.connect("md5user", "testdb").await;
    let bystander = p.connect("md5user", "testdb").await;
    // Two servers: the bystander's first query opens the second while the other is held.
    heavy.batch_execute("BEGIN").await.unwrap();
    assert_eq!(rows(&bystander, "select 1").await, ["1"]);
    heavy.batch_execute(&sets(1, N)).await.unwrap();
    heavy.batch_execute("COMMIT").await.unwrap();
    let mark = pg.log().len();
    for _ in 0..20 {
        let got = rows(&heavy, "select current_setting('my.s7')").await;
        assert_eq!(got, ["v7"]);
        let got = rows(
            &bystander,
            "select coalesce(current_setting('my.s7', true), 'none')",
        )
        .await;
        assert_eq!(got, ["none"]);
    }
    // Taking turns, each found the server it left: nothing applied, nothing reset.
    assert_eq!(sent(&pg, mark), (0, 0));
    p.shutdown().await;
}
