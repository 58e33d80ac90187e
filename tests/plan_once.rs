//! plan_once (issue 21 item 3): a client's repeated unnamed Parse of a plain statement is
//! served by a statement the server prepared once. PostgreSQL is the oracle: the same
//! scripts, run in lockstep straight against PostgreSQL and through pgcarpool over a pool
//! of one or two servers, must give every client the same messages, byte for byte (error
//! positions included); and the server must hold the statement, prepared once.
mod harness;

use std::time::Duration;

use harness::wire::{StepEnd, Wire};
use harness::{TempPostgres, TestPooler, scalar};

const LIMIT: Duration = Duration::from_secs(30);

async fn pool(pg: &TempPostgres, size: usize, plan_once: bool) -> TestPooler {
    TestPooler::builder(pg)
        .setting("pool_mode", "transaction")
        .setting("auth_type", "trust")
        .setting("default_pool_size", &size.to_string())
        .setting("max_client_conn", "100")
        .setting("plan_once", if plan_once { "1" } else { "0" })
        .start()
        .await
}

/// Each client's steps in lockstep (step k of every client before step k+1 of any) on
/// `port`, every message recorded whole (`wire::record`): `[client][step]` lines. A step
/// that starts with `X ` is SQL another application runs straight on PostgreSQL
/// (`direct`), out of pgcarpool's sight; its transcript is empty.
async fn lockstep(port: u16, direct: u16, scripts: &[Vec<&str>]) -> Vec<Vec<Vec<String>>> {
    let mut conns = Vec::new();
    for _ in scripts {
        let (w, _) = Wire::connect_recorded(port, "postgres", "testdb", &[], LIMIT)
            .await
            .expect("login");
        conns.push(w);
    }
    let mut outside = Wire::connect(direct, "postgres", "testdb").await;
    let mut out = vec![Vec::new(); scripts.len()];
    let steps = scripts.iter().map(Vec::len).max().unwrap_or(0);
    for k in 0..steps {
        for (i, s) in scripts.iter().enumerate() {
            let Some(step) = s.get(k) else { continue };
            if let Some(sql) = step.strip_prefix("X ") {
                let t = outside.step(&format!("Q {sql}")).await;
                assert!(!t.iter().any(|l| l.starts_with("Error")), "{sql}: {t:?}");
                out[i].push(Vec::new());
            } else {
                let (t, end) = conns[i].record_step(step, true, LIMIT).await;
                assert_eq!(end, StepEnd::Done, "client {i} step {k}: {t:?}");
                out[i].push(t);
            }
        }
    }
    out
}

/// The scripts straight against PostgreSQL, then through `pooler`: every message the
/// same. pgcarpool's transcripts.
async fn oracle(
    pg: &TempPostgres,
    pooler: &TestPooler,
    scripts: &[Vec<&str>],
) -> Vec<Vec<Vec<String>>> {
    let want = lockstep(pg.port(), pg.port(), scripts).await;
    let got = lockstep(pooler.port(), pg.port(), scripts).await;
    assert_same(&want, &got, scripts);
    got
}

/// Every client's every step the same, or a panic that shows the first difference.
fn assert_same(want: &[Vec<Vec<String>>], got: &[Vec<Vec<String>>], scripts: &[Vec<&str>]) {
    assert_eq!(want.len(), got.len());
    for (i, (w, g)) in want.iter().zip(got).enumerate() {
        assert_eq!(w.len(), g.len(), "client {i}");
        for (k, (ws, gs)) in w.iter().zip(g).enumerate() {
            assert_eq!(
                ws, gs,
                "client {i} step {k} differs\n--- step\n{}\n--- PostgreSQL (left) vs pgcarpool (right)",
                scripts[i][k]
            );
        }
    }
}

/// pgbench -M extended's round: unnamed Parse, Bind, Describe portal, Execute, Sync.
fn round(sql: &str, params: &str) -> String {
    format!("P |{sql}\nB ||{params}\nD P \nE \nS")
}

fn has(t: &[Vec<Vec<String>>], client: usize, step: usize, needle: &str) {
    assert!(
        t[client][step].iter().any(|l| l.contains(needle)),
        "client {client} step {step} lacks {needle:?}: {:?}",
        t[client][step]
    );
}

/// The shortcut is taken: after a text's second unnamed Parse the one server holds it as a
/// prepared statement, run through it every time since (PostgreSQL's own count of its
/// plans), and the client saw what PostgreSQL gives. With plan_once = 0 nothing is
/// prepared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_unnamed_parse_is_served_by_a_statement_prepared_once() {
    let pg = TempPostgres::start();
    const SQL: &str = "SELECT $1::int + 1 AS plan_once_probe";
    let count = format!(
        "SELECT count(*) || ' ' || coalesce(sum(generic_plans + custom_plans), 0) \
         FROM pg_catalog.\"pg_prepared_statements\" WHERE statement = '{SQL}'"
    );
    let r = round(SQL, "41");
    for (on, want) in [(true, "1 4"), (false, "0 0")] {
        let p = pool(&pg, 1, on).await;
        let t = oracle(&pg, &p, &[vec![&r, &r, &r, &r, &r]]).await;
        has(&t, 0, 4, "Row 42");
        // The one server runs the client's rounds and this query.
        let c = p.connect("postgres", "testdb").await;
        assert_eq!(scalar(&c, &count).await.unwrap(), want, "plan_once = {on}");
        drop(c);
        p.shutdown().await;
    }
}

/// Schema changes between two uses of a text: DDL through pgcarpool (a new generation:
/// the text is prepared anew), DDL out of its sight that changes the result type (the
/// server's copy reports 0A000 at the Bind: the round runs again on a fresh statement), a
/// Describe of the statement after such a change, the table dropped (the Parse fails with
/// PostgreSQL's error and position; a Bind of the unnamed statement then is 26000).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_changes_between_uses_give_what_a_fresh_parse_gives() {
    let pg = TempPostgres::start();
    let sel = round("SELECT * FROM po", "");
    let described = "P |SELECT * FROM po\nD S \nB ||\nD P \nE \nS".to_string();
    let a = vec![
        "Q CREATE TABLE po (a int); INSERT INTO po VALUES (1)",
        &sel,
        &sel,
        &sel,
        &sel,
        &sel,
        &sel,
        &described,
        &described,
        &sel,
        &sel,
        "B ||\nE \nS",
        "Q DROP TABLE IF EXISTS po",
    ];
    let b = vec![
        "Q SELECT 1",
        "Q SELECT 2",
        "Q SELECT 3",
        "Q ALTER TABLE po ADD COLUMN b int DEFAULT 2",
        "Q SELECT 4",
        "X ALTER TABLE po ADD COLUMN c int DEFAULT 3",
        "Q SELECT 5",
        "X ALTER TABLE po ADD COLUMN d int DEFAULT 4",
        "Q SELECT 6",
        "Q DROP TABLE po",
        "Q SELECT 7",
    ];
    for size in [1, 2] {
        let p = pool(&pg, size, true).await;
        let t = oracle(&pg, &p, &[a.clone(), b.clone()]).await;
        // The script tests what it means to.
        has(&t, 0, 3, "Row 1");
        has(&t, 0, 4, "Row 1|2");
        has(&t, 0, 6, "Row 1|2|3");
        has(&t, 0, 8, "Row 1|2|3|4");
        has(&t, 0, 9, "Row 1|2|3|4");
        has(&t, 0, 10, "C=\"42P01\"");
        has(&t, 0, 10, "P=\"15\"");
        has(&t, 0, 11, "C=\"26000\"");
        p.shutdown().await;
    }
}

/// Another client's DEALLOCATE ALL and DISCARD ALL on the one server drop its copy: the
/// next use prepares it again; the client's own DEALLOCATE ALL leaves its unnamed
/// statement (PostgreSQL's drops only named ones); a simple query and a Close drop it
/// (26000 at the next Bind); a failed block refuses it as PostgreSQL does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deallocate_discard_close_and_failed_blocks_as_in_postgresql() {
    let pg = TempPostgres::start();
    let sel = round("SELECT $1::int * 2 AS x", "21");
    let ins = round("INSERT INTO pd VALUES ($1)", "5");
    let a = vec![
        "Q CREATE TABLE pd (v int)",
        &sel,
        &sel,
        &sel,
        "B ||7\nE \nS",
        &sel,
        "P d|DEALLOCATE ALL\nB |d|\nE \nS",
        "B ||8\nE \nS",
        &sel,
        &sel,
        "C S \nB ||9\nE \nS",
        &sel,
        &sel,
        "Q SELECT 1",
        "B ||10\nE \nS",
        &ins,
        &ins,
        &ins,
        // (A simple query would drop the unnamed statement.)
        "P b|BEGIN\nB |b|\nE \nS",
        "P z|SELECT 1/0\nB |z|\nE \nS",
        "D S \nB ||6\nE \nS",
        "P |INSERT INTO pd VALUES ($1)\nS",
        "Q ROLLBACK",
        &ins,
        &sel,
        &sel,
        "B |b|\nE \nS",
        "B ||11\nE \nS",
        "Q COMMIT",
        "Q SELECT count(*), sum(v) FROM pd",
        "Q DROP TABLE pd",
    ];
    let b = vec![
        "Q SELECT 1",
        "Q SELECT 2",
        "Q SELECT 3",
        "Q DEALLOCATE ALL",
        "Q SELECT 4",
        "Q DISCARD ALL",
    ];
    for size in [1, 2] {
        let p = pool(&pg, size, true).await;
        let t = oracle(&pg, &p, &[a.clone(), b.clone()]).await;
        has(&t, 0, 4, "Row 14");
        has(&t, 0, 7, "Row 16");
        has(&t, 0, 10, "C=\"26000\"");
        has(&t, 0, 14, "C=\"26000\"");
        has(&t, 0, 20, "t 23");
        has(&t, 0, 20, "C=\"25P02\"");
        has(&t, 0, 27, "Row 22");
        has(&t, 0, 29, "Row 4|20");
        p.shutdown().await;
    }
}

/// The same text means another table after a search_path change, in this client and in
/// another one on the same server; a failing Parse of a repeated text (a column one schema
/// lacks) gives PostgreSQL's error with its position; parameter count errors name the
/// unnamed statement as PostgreSQL does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_path_and_errors_as_in_postgresql() {
    let pg = TempPostgres::start();
    let setup = pg.connect("postgres", "testdb").await;
    setup
        .batch_execute(
            "CREATE SCHEMA s1; CREATE SCHEMA s2; \
             CREATE TABLE s1.t (a int, only1 int); INSERT INTO s1.t VALUES (1, 10); \
             CREATE TABLE s2.t (a text, b text); INSERT INTO s2.t VALUES ('two', 'b');",
        )
        .await
        .unwrap();
    let star = round("SELECT * FROM t", "");
    let only1 = round("SELECT only1 FROM t WHERE a IS NOT NULL", "");
    // The search_path changes by named statements: a simple query would drop the
    // unnamed statement.
    let a = vec![
        "P p1|SET search_path = s1\nB |p1|\nE \nS",
        "P p2|SET search_path = s2\nS",
        &star,
        &star,
        "B |p2|\nE \nS",
        &star,
        &star,
        &only1,
        "B |p1|\nE \nS",
        &only1,
        &only1,
        "B |p2|\nE \nS",
        &only1,
        "B ||\nE \nS",
        "B |p1|\nE \nS",
        &star,
        &star,
        "B ||1\nE \nS",
        "Q RESET search_path",
        &star,
    ];
    let b = vec![
        "P q2|SET search_path = s2\nB |q2|\nE \nS",
        "P q1|SET search_path = s1\nS",
        &star,
        &star,
        "B |q1|\nE \nS",
        &star,
        &star,
    ];
    for size in [1, 2] {
        let p = pool(&pg, size, true).await;
        let t = oracle(&pg, &p, &[a.clone(), b.clone()]).await;
        has(&t, 0, 3, "Row 1|10");
        has(&t, 0, 5, "Row two|b");
        has(&t, 0, 6, "Row two|b");
        has(&t, 0, 7, "C=\"42703\"");
        has(&t, 0, 10, "Row 10");
        has(&t, 0, 12, "C=\"42703\"");
        has(&t, 0, 12, "P=\"8\"");
        has(&t, 0, 13, "C=\"26000\"");
        has(&t, 0, 17, "prepared statement \\\"\\\" requires 0");
        has(&t, 0, 19, "C=\"42P01\"");
        has(&t, 1, 3, "Row two|b");
        has(&t, 1, 5, "Row 1|10");
        p.shutdown().await;
    }
}

/// Many clients over a pool of one or two, all running the same texts (and each its own),
/// with another client's DDL in between: every client gets what PostgreSQL gives, and the
/// statement counts pg_stat_statements keeps are PostgreSQL's (the same normalised query,
/// one call per execution).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clients_and_pg_stat_statements_as_in_postgresql() {
    let pg = TempPostgres::start_with(&[("shared_preload_libraries", "pg_stat_statements")]);
    let setup = pg.connect("postgres", "testdb").await;
    setup
        .batch_execute(
            "CREATE EXTENSION pg_stat_statements; \
             CREATE TABLE pm (id int PRIMARY KEY, v text); \
             INSERT INTO pm SELECT g, 'v' || g FROM generate_series(1, 10) g;",
        )
        .await
        .unwrap();
    let point = |id: usize| round("SELECT v FROM pm WHERE id = $1", &id.to_string());
    let rebind = |p: &str| format!("B ||{p}\nD P \nE \nS");
    let mut base: Vec<Vec<String>> = Vec::new();
    for c in 0..6 {
        let own = round(&format!("SELECT $1::int + {c} AS own"), "1");
        base.push(vec![
            point(1 + c),
            point(2 + c),
            own.clone(),
            own,
            rebind("5"),
            point(3 + c),
            point(4 + c),
            rebind(&(5 + c).to_string()),
        ]);
    }
    base.push(
        [
            "Q SELECT 1",
            "Q SELECT 2",
            "Q ALTER TABLE pm ADD COLUMN w int",
            "Q SELECT 3",
            "Q ALTER TABLE pm DROP COLUMN w",
        ]
        .map(String::from)
        .to_vec(),
    );
    let stats = "SELECT string_agg(query || ' ' || calls, ', ' ORDER BY query) \
                 FROM pg_stat_statements WHERE query LIKE 'SELECT v FROM pm%' \
                 OR query LIKE 'SELECT $1::int + %'";
    let mut counts = Vec::new();
    for size in [1, 2] {
        let mut scripts = base.clone();
        if size == 2 {
            // A client that keeps one server in a transaction now and then: the others'
            // rounds (and their Binds of the unnamed statement) move between servers.
            let holder = ["Q BEGIN", "Q SELECT 1", "Q COMMIT", "Q SELECT 2", "Q BEGIN"];
            let mut holder: Vec<String> = holder.map(String::from).to_vec();
            holder.extend(["Q SELECT 3".into(), "Q SELECT 4".into(), "Q COMMIT".into()]);
            scripts.insert(0, holder);
        }
        let scripts: Vec<Vec<&str>> = scripts
            .iter()
            .map(|s| s.iter().map(String::as_str).collect())
            .collect();
        setup
            .batch_execute("SELECT pg_stat_statements_reset()")
            .await
            .unwrap();
        let direct = lockstep(pg.port(), pg.port(), &scripts).await;
        let want = scalar(&setup, stats).await.unwrap();
        setup
            .batch_execute("SELECT pg_stat_statements_reset()")
            .await
            .unwrap();
        let p = pool(&pg, size, true).await;
        let got = lockstep(p.port(), pg.port(), &scripts).await;
        assert_same(&direct, &got, &scripts);
        assert_eq!(scalar(&setup, stats).await.unwrap(), want, "pool of {size}");
        counts.push(want);
        p.shutdown().await;
    }
    // The script tests what it means to: each client's own text ran three times, the
    // point select five times.
    for c in &counts {
        assert!(c.contains("SELECT v FROM pm WHERE id = $1 30"), "{c}");
        assert!(c.contains("SELECT $1::int + $2 AS own 18"), "{c}");
    }
}

/// A client that describes its unnamed statement at each Parse (pgx's way: Parse, Describe
/// statement, Sync; then Bind, Execute, Sync) gets PostgreSQL's answers from a fresh parse
/// each time: its text is prepared under an internal name at its first repeat (before its
/// Describe comes), never run through it, and not served by it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_describes_each_parse_is_left_alone() {
    let pg = TempPostgres::start();
    const SQL: &str = "SELECT $1::int * 3 AS described_probe";
    let count = format!(
        "SELECT count(*) || ' ' || coalesce(sum(generic_plans + custom_plans), 0) \
         FROM pg_catalog.\"pg_prepared_statements\" WHERE statement = '{SQL}'"
    );
    let parse = format!("P |{SQL}\nD S \nS");
    let bind = "B ||14\nD P \nE \nS";
    let p = pool(&pg, 1, true).await;
    let steps = [&parse[..], bind, &parse, bind, &parse, bind, &parse, bind];
    let t = oracle(&pg, &p, &[steps.to_vec()]).await;
    has(&t, 0, 6, "t 23");
    has(&t, 0, 7, "Row 42");
    let c = p.connect("postgres", "testdb").await;
    assert_eq!(scalar(&c, &count).await.unwrap(), "1 0");
    drop(c);
    p.shutdown().await;
}

/// A skipped Parse's ParseComplete waits for the server's reply, to be written with it
/// (one write and one wake-up of the client, not two): while the server's statement waits
/// for a lock, the client has been sent nothing; then it gets every message in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skipped_parses_answer_is_written_with_the_servers_reply() {
    let pg = TempPostgres::start();
    let direct = pg.connect("postgres", "testdb").await;
    direct
        .batch_execute("CREATE TABLE held_answer (x int); INSERT INTO held_answer VALUES (7)")
        .await
        .unwrap();
    let p = pool(&pg, 1, true).await;
    let mut w = Wire::connect(p.port(), "postgres", "testdb").await;
    const SQL: &str = "SELECT x FROM held_answer";
    let parse = harness::wire::message(
        b'P',
        &[b"\0".as_slice(), SQL.as_bytes(), b"\0\0\0"].concat(),
    );
    let bind = harness::wire::message(b'B', b"\0\0\0\0\0\0\0\0");
    let round = [
        parse,
        bind,
        harness::wire::message(b'E', b"\0\0\0\0\0"),
        harness::wire::message(b'S', b""),
    ]
    .concat();
    // Twice: the second Parse is the first one served by the prepared statement.
    for _ in 0..2 {
        w.send(&round).await;
        let tags: Vec<u8> = w.until_ready(1).await.iter().map(|(t, _)| *t).collect();
        assert_eq!(tags, b"12DCZ");
    }
    let mut locker = pg.connect("postgres", "testdb").await;
    let tx = locker.transaction().await.unwrap();
    tx.batch_execute("LOCK TABLE held_answer IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    w.send(&round).await;
    harness::wait_for("the round to wait for the lock", LIMIT, || async {
        let n = scalar(
            &direct,
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
             AND query LIKE '%held_answer%'",
        )
        .await
        .unwrap();
        n == "1"
    })
    .await;
    // Before the change the ParseComplete was written before the Bind reached the server.
    assert_eq!(w.bytes_waiting(), 0, "nothing before the server's reply");
    tx.rollback().await.unwrap();
    let tags: Vec<u8> = w.until_ready(1).await.iter().map(|(t, _)| *t).collect();
    assert_eq!(tags, b"12DCZ");
    w.terminate().await;
    p.shutdown().await;
}
