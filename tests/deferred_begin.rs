//! deferred_begin: a bare BEGIN of an idle client is answered by pgcarpool and goes to a
//! server with the block's first statement. PostgreSQL is the oracle: the same scripts,
//! straight to PostgreSQL and through pgcarpool (many clients over a pool of two, the
//! setting on and off), give every client the same messages, byte for byte. A client that
//! said BEGIN holds no server until its first statement; its idle block is still timed by
//! `idle_transaction_timeout`.
mod harness;
mod pool_support;

use std::collections::HashMap;
use std::time::Duration;

use harness::wire::Wire;
use harness::{TempPostgres, TestPooler, rows, scalar_within};
use pool_support::connect_watched;

const LIMIT: Duration = Duration::from_secs(30);

async fn pool(pg: &TempPostgres, size: usize, deferred: bool) -> TestPooler {
    TestPooler::builder(pg)
        .setting("pool_mode", "transaction")
        .setting("auth_type", "trust")
        .setting("default_pool_size", &size.to_string())
        .setting("max_client_conn", "100")
        .setting("deferred_begin", if deferred { "1" } else { "0" })
        .start()
        .await
}

/// One client's script on its own table `t{i}`: blocks begun every way pgcarpool answers
/// (and some it does not), ended before and after statements, with errors, savepoints,
/// SET LOCAL, the extended protocol, and the unnamed statement a BEGIN drops.
fn script(i: usize) -> Vec<String> {
    let t = format!("t{i}");
    [
        format!("Q CREATE TABLE {t} (id int PRIMARY KEY, v text)"),
        "Q BEGIN".into(),
        format!("Q INSERT INTO {t} VALUES (1, 'a')"),
        "Q COMMIT".into(),
        // Ended before anything ran: answered too.
        "Q START TRANSACTION".into(),
        "Q COMMIT".into(),
        "Q begin work;".into(),
        "Q rollback".into(),
        "Q BEGIN READ ONLY".into(),
        "Q END TRANSACTION".into(),
        "Q Begin Transaction".into(),
        "Q abort".into(),
        // Modes the server applies when the first statement comes.
        "Q begin isolation level repeatable read, read only".into(),
        "Q SHOW transaction_isolation".into(),
        "Q SHOW transaction_read_only".into(),
        format!("Q INSERT INTO {t} VALUES (2, 'b')"),
        "Q SELECT 1".into(),
        "Q COMMIT".into(),
        "Q start transaction isolation level read uncommitted not deferrable".into(),
        "Q SHOW transaction_isolation".into(),
        "Q SHOW transaction_deferrable".into(),
        "Q ROLLBACK".into(),
        // Not answered by pgcarpool: to the server as it is.
        "Q BEGIN ISOLATION LEVEL SERIALIZABLE".into(),
        "Q SHOW transaction_isolation".into(),
        "Q COMMIT".into(),
        "Q BEGIN ISOLATION LEVEL bogus".into(),
        "Q begin read only read write".into(),
        "Q ROLLBACK".into(),
        // A BEGIN in the block: PostgreSQL warns (notices are not in transcripts) and
        // goes on.
        "Q BEGIN".into(),
        "Q BEGIN".into(),
        format!("Q SELECT count(*) FROM {t}"),
        "Q END".into(),
        // The first statement fails: the block is failed, as on PostgreSQL.
        "Q BEGIN".into(),
        "Q SELEC 1".into(),
        "Q SELECT 1".into(),
        "Q COMMIT".into(),
        "Q BEGIN".into(),
        format!("Q INSERT INTO {t} VALUES (1, 'dup')"),
        "Q ROLLBACK".into(),
        // Statements that refuse a block.
        "Q BEGIN".into(),
        "Q VACUUM".into(),
        "Q ROLLBACK".into(),
        "Q BEGIN".into(),
        "Q COMMIT PREPARED 'nothing'".into(),
        "Q ROLLBACK".into(),
        // Savepoints, SET LOCAL, several statements in one query.
        "Q BEGIN".into(),
        "Q SAVEPOINT a".into(),
        "Q SELECT 1/0".into(),
        "Q ROLLBACK TO a".into(),
        format!("Q UPDATE {t} SET v = 'c' WHERE id = 1"),
        "Q COMMIT".into(),
        "Q BEGIN".into(),
        "Q SET LOCAL work_mem = '1MB'".into(),
        "Q SHOW work_mem".into(),
        "Q COMMIT".into(),
        "Q SHOW work_mem".into(),
        "Q BEGIN".into(),
        format!("Q SELECT v FROM {t} ORDER BY id; SELECT 2"),
        "Q COMMIT AND CHAIN".into(),
        "Q SHOW transaction_isolation".into(),
        "Q COMMIT".into(),
        // The extended protocol in a block begun by a query.
        "P s|SELECT $1::int + 1\nS".into(),
        "Q BEGIN".into(),
        "B |s|41\nE \nS".into(),
        format!("P |SELECT v FROM {t} WHERE id = $1\nB ||1\nD P \nE \nS"),
        "S".into(),
        "Q COMMIT".into(),
        // A simple query drops the unnamed statement: BEGIN too.
        "P |SELECT 7\nS".into(),
        "Q BEGIN".into(),
        "B ||\nE \nS".into(),
        "Q ROLLBACK".into(),
        format!("Q SELECT id, v FROM {t} ORDER BY id"),
        format!("Q DROP TABLE {t}"),
    ]
    .into()
}

/// Each client's script on `port`, the clients at once (their tables are their own):
/// `[client][step]` transcripts.
async fn run(port: u16, clients: usize) -> Vec<Vec<Vec<String>>> {
    let tasks: Vec<_> = (0..clients)
        .map(|i| {
            tokio::spawn(async move {
                let mut w = Wire::connect(port, "postgres", "testdb").await;
                let mut out = Vec::new();
                for step in script(i) {
                    out.push(
                        tokio::time::timeout(LIMIT, w.step(&step))
                            .await
                            .unwrap_or_else(|_| panic!("client {i}: no answer to {step}")),
                    );
                }
                out
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("client task"));
    }
    out
}

fn assert_same(want: &[Vec<Vec<String>>], got: &[Vec<Vec<String>>], how: &str) {
    for (i, (w, g)) in want.iter().zip(got).enumerate() {
        let s = script(i);
        for (k, (ws, gs)) in w.iter().zip(g).enumerate() {
            assert_eq!(
                ws, gs,
                "{how}: client {i} step {k} differs\n--- step\n{}\n--- PostgreSQL (left) vs pgcarpool (right)",
                s[k]
            );
        }
        assert_eq!(w.len(), g.len(), "{how}: client {i}");
    }
}

/// PostgreSQL as the oracle, eight clients over a pool of two, with the setting on and
/// off: the same messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_begun_by_pgcarpool_answer_as_postgresql_does() {
    let pg = TempPostgres::start();
    const CLIENTS: usize = 8;
    let want = run(pg.port(), CLIENTS).await;
    // The answers that matter are there at all.
    assert_eq!(want[0][1], ["Complete BEGIN", "Ready T"]);
    assert_eq!(want[0][4], ["Complete START TRANSACTION", "Ready T"]);
    for on in [true, false] {
        let p = pool(&pg, 2, on).await;
        let got = run(p.port(), CLIENTS).await;
        assert_same(&want, &got, &format!("deferred_begin = {on}"));
        p.shutdown().await;
    }
}

fn testdb(rows: Vec<HashMap<String, Option<String>>>) -> HashMap<String, Option<String>> {
    rows.into_iter()
        .find(|r| r["database"].as_deref() == Some("testdb"))
        .expect("a testdb pool")
}

fn num(row: &HashMap<String, Option<String>>, col: &str) -> u64 {
    row[col].as_deref().unwrap_or("0").parse().unwrap()
}

/// A client that said BEGIN holds no server: over a pool of one, another client's query
/// runs meanwhile, and the block goes on once it has its first statement. With the
/// setting off the BEGIN takes the server (SHOW POOLS).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_said_begin_holds_no_server() {
    let pg = TempPostgres::start();
    for on in [true, false] {
        let p = pool(&pg, 1, on).await;
        let console = p.connect("postgres", "pgbouncer").await;
        let mut a = Wire::connect(p.port(), "postgres", "testdb").await;
        assert_eq!(a.step("Q BEGIN").await, ["Complete BEGIN", "Ready T"]);
        let pools = testdb(rows(&console, "SHOW POOLS").await);
        assert_eq!(num(&pools, "sv_active"), u64::from(!on), "{on}: {pools:?}");
        if on {
            let b = p.connect("postgres", "testdb").await;
            assert_eq!(
                scalar_within(&b, "SELECT 42", LIMIT).await.unwrap(),
                "42",
                "the other client's query"
            );
        }
        assert_eq!(
            a.step("Q SELECT 1").await,
            ["Columns ?column?", "Row 1", "Complete SELECT 1", "Ready T"]
        );
        let pools = testdb(rows(&console, "SHOW POOLS").await);
        assert_eq!(num(&pools, "sv_active"), 1, "{on}: {pools:?}");
        assert_eq!(a.step("Q COMMIT").await, ["Complete COMMIT", "Ready I"]);
        p.shutdown().await;
    }
}

/// A block pgcarpool began is a transaction to the client: idle in it for longer than
/// `idle_transaction_timeout`, it is let go with PgBouncer's words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_block_begun_by_pgcarpool_times_out() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("idle_transaction_timeout", "1")
        .setting("client_idle_timeout", "0")
        .setting("deferred_begin", "1")
        .start()
        .await;
    let mut w = connect_watched(&p.dsn("md5user", "testdb")).await;
    w.client.batch_execute("begin").await.unwrap();
    let why = w.events.closed_within(Duration::from_secs(10)).await;
    assert!(why.contains("idle transaction timeout"), "{why}");
    p.shutdown().await;
}

/// SIGINT (SHUTDOWN WAIT_FOR_SERVERS) lets a transaction in progress finish: also a block
/// whose BEGIN pgcarpool answered, which holds no server yet. A client between
/// transactions is let go, as PgBouncer; the pooler exits once the block is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_lets_a_block_begun_by_pgcarpool_finish() {
    use harness::process::PoolerProcess;
    let pg = TempPostgres::start();
    let mut p = PoolerProcess::start(
        TestPooler::builder(&pg).settings(&[("pool_mode", "transaction"), ("deferred_begin", "1")]),
    )
    .await;
    let c = p.connect("md5user").await;
    let idle = p.connect("md5user").await;
    c.simple_query("begin").await.unwrap();
    idle.simple_query("select 0").await.unwrap();
    p.signal(libc::SIGINT);
    assert!(p.stops_accepting().await, "still accepting after SIGINT");
    let e = idle
        .simple_query("select 1")
        .await
        .expect_err("a new transaction during SHUTDOWN WAIT_FOR_SERVERS");
    assert_eq!(
        e.as_db_error().map(|d| d.message()),
        Some("server shutting down")
    );
    assert!(p.running(), "exited while a block was in progress");
    // The block's first statement gets a server, and its commit ends it.
    c.simple_query("select 1").await.unwrap();
    c.simple_query("commit").await.unwrap();
    let status = p.exited_within(Duration::from_secs(5)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "did not exit after the block ended: {status:?}"
    );
}
