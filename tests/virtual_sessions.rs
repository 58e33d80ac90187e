//! Transaction mode gives every client its own session: prepared statements, settings,
//! DISCARD and pins, across few shared servers.
mod harness;

use std::sync::Arc;

use harness::{TempPostgres, TestPooler};

async fn tx_pooler(pg: &TempPostgres) -> TestPooler {
    TestPooler::builder(pg)
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "4")
        .setting("max_client_conn", "200")
        .start()
        .await
}

fn text(msgs: &[tokio_postgres::SimpleQueryMessage]) -> Vec<String> {
    msgs.iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => {
                Some(r.get(0).unwrap_or("NULL").to_string())
            }
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_statements_with_clashing_names_work_across_servers() {
    let pg = TempPostgres::start();
    let p = tx_pooler(&pg).await;
    let mut tasks = Vec::new();
    for i in 0..16i32 {
        let c = p.connect("md5user", "testdb").await;
        tasks.push(tokio::spawn(async move {
            // tokio-postgres names its statements s0, s1, … per connection: every client uses
            // the same names for different texts.
            let a = c.prepare(&format!("select $1::int + {i}")).await.unwrap();
            let b = c.prepare("select $1::text || 'x'").await.unwrap();
            for n in 0..50i32 {
                let r = c.query_one(&a, &[&n]).await.unwrap();
                assert_eq!(r.get::<_, i32>(0), n + i);
                let r = c.query_one(&b, &[&format!("{i}-{n}")]).await.unwrap();
                assert_eq!(r.get::<_, String>(0), format!("{i}-{n}x"));
                if n % 10 == 0 {
                    // An error reaches this client only, and the statements keep working.
                    let err = c.query_one("select 1/0", &[]).await.unwrap_err();
                    assert_eq!(harness::sqlstate(&err), Some("22012"));
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let backends = harness::Observer::new(&pg).await.backends("md5user").await;
    assert!(
        backends <= 4,
        "{backends} server connections for a pool of 4"
    );
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_survive_in_explicit_transactions_and_pipelines() {
    let pg = TempPostgres::start();
    let p = tx_pooler(&pg).await;
    let c = Arc::new(p.connect("md5user", "testdb").await);
    let s = c.prepare("select $1::int * 2").await.unwrap();
    // Pipelined: tokio-postgres sends these without waiting for each other.
    let futs: Vec<_> = (0..20i32)
        .map(|n| {
            let c = c.clone();
            let s = s.clone();
            async move { c.query_one(&s, &[&n]).await.unwrap().get::<_, i32>(0) }
        })
        .collect();
    let got = futures_join(futs).await;
    assert_eq!(got, (0..20).map(|n| n * 2).collect::<Vec<_>>());
    c.batch_execute("begin").await.unwrap();
    assert_eq!(
        c.query_one(&s, &[&21i32]).await.unwrap().get::<_, i32>(0),
        42
    );
    c.batch_execute("commit").await.unwrap();
    p.shutdown().await;
}

/// Drive every future at once (tokio-postgres then pipelines their queries on one
/// connection); the outputs in order.
async fn futures_join<T, F: std::future::Future<Output = T>>(futs: Vec<F>) -> Vec<T> {
    use std::task::Poll;
    let mut futs: Vec<_> = futs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<T>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, slot) in futs.iter_mut().zip(out.iter_mut()) {
            if slot.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *slot = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter()
        .map(|v| v.expect("every future ran"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_follow_each_client_and_never_leak() {
    let pg = TempPostgres::start();
    let p = tx_pooler(&pg).await;
    let mut tasks = Vec::new();
    for i in 0..16 {
        let c = p.connect("md5user", "testdb").await;
        tasks.push(tokio::spawn(async move {
            c.batch_execute(&format!(
                "SET search_path = s{i}, public; SET TimeZone = 'Etc/GMT-{tz}'; SET application_name = 'app{i}'; \
                 SET statement_timeout = '{ms}ms'; SET myapp.tenant_id = '{i}'",
                tz = i % 12,
                ms = 10_001 + i
            ))
            .await
            .unwrap();
            for _ in 0..30 {
                let r = c
                    .simple_query(
                        "select current_setting('search_path') || '|' || current_setting('TimeZone') || '|' || \
                         current_setting('application_name') || '|' || current_setting('statement_timeout') || '|' || \
                         current_setting('myapp.tenant_id')",
                    )
                    .await
                    .unwrap();
                assert_eq!(
                    text(&r),
                    [format!("s{i}, public|Etc/GMT-{}|app{i}|{}ms|{i}", i % 12, 10_001 + i)]
                );
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // A new client sees the defaults, not what others set.
    let c = p.connect("md5user", "testdb").await;
    let r = c.simple_query("select current_setting('search_path') || '|' || current_setting('statement_timeout') || '|' || coalesce(current_setting('myapp.tenant_id', true), '')").await.unwrap();
    assert_eq!(text(&r), ["\"$user\", public|0|"]);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolled_back_set_is_not_kept_and_set_local_stays_local() {
    let pg = TempPostgres::start();
    let p = tx_pooler(&pg).await;
    let c = p.connect("md5user", "testdb").await;
    c.batch_execute("SET statement_timeout = '5s'")
        .await
        .unwrap();
    c.batch_execute("BEGIN; SET statement_timeout = '7s'; ROLLBACK")
        .await
        .unwrap();
    c.batch_execute("BEGIN; SET LOCAL statement_timeout = '9s'; COMMIT")
        .await
        .unwrap();
    // Make other clients run on every server in between.
    for _ in 0..8 {
        let o = p.connect("md5user", "testdb").await;
        o.batch_execute("select 1").await.unwrap();
    }
    let r = c.simple_query("show statement_timeout").await.unwrap();
    assert_eq!(text(&r), ["5s"]);
    c.batch_execute("BEGIN; SELECT 1; SET statement_timeout = '6s'; COMMIT")
        .await
        .unwrap();
    let r = c.simple_query("show statement_timeout").await.unwrap();
    assert_eq!(text(&r), ["6s"]);
    c.batch_execute("RESET ALL").await.unwrap();
    let r = c.simple_query("show statement_timeout").await.unwrap();
    assert_eq!(text(&r), ["0"]);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discard_all_in_a_loop_leaves_other_clients_alone() {
    let pg = TempPostgres::start();
    let p = tx_pooler(&pg).await;
    let discarder = p.connect("md5user", "testdb").await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let d = tokio::spawn(async move {
        let mut n = 0;
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            discarder
                .batch_execute("SET work_mem = '1MB'")
                .await
                .unwrap();
            discarder.batch_execute("DISCARD ALL").await.unwrap();
            n += 1;
        }
        n
    });
    let mut tasks = Vec::new();
    for i in 0..15i32 {
        let c = p.connect("md5user", "testdb").await;
        tasks.push(tokio::spawn(async move {
            c.batch_execute(&format!("SET myapp.id = '{i}'"))
                .await
                .unwrap();
            let s = c
                .prepare("select $1::int, current_setting('myapp.id')")
                .await
                .unwrap();
            for n in 0..40i32 {
                let r = c.query_one(&s, &[&n]).await.unwrap();
                assert_eq!(
                    (r.get::<_, i32>(0), r.get::<_, String>(1)),
                    (n, i.to_string())
                );
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(d.await.unwrap() > 0);
    p.shutdown().await;
}

/// A SHOW CARPOOL counter of the md5user pool.
async fn pinned_count(admin: &tokio_postgres::Client, column: &str) -> u64 {
    let msgs = admin.simple_query("SHOW CARPOOL").await.unwrap();
    msgs.iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) if r.get("user") == Some("md5user") => {
                r.get(column).map(|v| v.parse().unwrap())
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("no md5user pool in SHOW CARPOOL"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pin_mode_error_refuses_temp_tables_clearly() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "1")
        .setting("pin_mode", "error")
        .start()
        .await;
    let c = p.connect("md5user", "testdb").await;
    // The statement that would pin gets the error itself, and the session ends.
    let err = c
        .batch_execute("CREATE TEMP TABLE t (a int)")
        .await
        .unwrap_err();
    assert_eq!(
        harness::error_text(&err),
        "0A000 temp table cannot be used in transaction pooling mode (pin_mode = error)"
    );
    assert!(c.batch_execute("select 1").await.is_err());
    // The server was reset and serves the next client without the temp table.
    let o = p.connect("md5user", "testdb").await;
    let r = o
        .simple_query("select count(*) from pg_class where relpersistence = 't'")
        .await
        .unwrap();
    assert_eq!(text(&r), ["0"]);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn temp_tables_and_advisory_locks_pin_only_while_they_live() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "2")
        .start()
        .await;
    let c = p.connect("md5user", "testdb").await;
    c.batch_execute("CREATE TEMP TABLE t (a int)")
        .await
        .unwrap();
    let others: Vec<_> =
        futures_join((0..4).map(|_| p.connect("md5user", "testdb")).collect()).await;
    for (i, o) in others.iter().enumerate() {
        o.batch_execute("select pg_sleep(0.01)").await.unwrap();
        c.batch_execute(&format!("INSERT INTO t VALUES ({i})"))
            .await
            .unwrap();
    }
    let r = c.simple_query("select count(*) from t").await.unwrap();
    assert_eq!(text(&r), ["4"]);
    // The pin is visible: per pool with its reason, and per client.
    let admin = p.connect("postgres", "pgbouncer").await;
    let pins = admin.simple_query("SHOW PINS").await.unwrap();
    let rows: Vec<_> = pins
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => {
                Some(r.get("reasons").unwrap_or("").to_string())
            }
            _ => None,
        })
        .collect();
    assert_eq!(rows, ["temp table"]);
    assert_eq!(pinned_count(&admin, "pinned_temp_table").await, 1);
    let pid1 = text(&c.simple_query("select \"pg_backend_pid\"()").await.unwrap());
    c.batch_execute("DROP TABLE t").await.unwrap();
    // Advisory lock: pinned while held.
    c.batch_execute("select pg_advisory_lock(42)")
        .await
        .unwrap();
    for o in &others {
        o.batch_execute("select 1").await.unwrap();
    }
    let pid2 = text(&c.simple_query("select \"pg_backend_pid\"()").await.unwrap());
    assert_eq!(pid1, pid2, "pinned client stays on its server");
    let held = text(
        &c.simple_query(
            "select count(*) from pg_locks where locktype = 'advisory' and pid = pg_backend_pid()",
        )
        .await
        .unwrap(),
    );
    assert_eq!(held, ["1"]);
    c.batch_execute("select pg_advisory_unlock(42)")
        .await
        .unwrap();
    // Unpinned: with both servers busy elsewhere the client still gets one.
    let r = c.simple_query("select 1").await.unwrap();
    assert_eq!(text(&r), ["1"]);
    p.shutdown().await;
}

#[test]
fn pgbench_prepared_mode_runs_without_errors() {
    let pg = TempPostgres::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let p = rt.block_on(tx_pooler(&pg));
    let init = harness::run_pgbench(&["-i", "-s", "1", "-q", &pg.dsn("postgres", "testdb")]);
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    let out = harness::run_pgbench(&[
        "-n",
        "-M",
        "prepared",
        "-T",
        "3",
        "-c",
        "16",
        "-j",
        "2",
        &p.dsn("postgres", "testdb"),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("number of failed transactions: 0 (0.000%)"),
        "{stdout}"
    );
    rt.block_on(p.shutdown());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_prepare_and_execute_with_clashing_names() {
    let pg = TempPostgres::start();
    let p = tx_pooler(&pg).await;
    let mut tasks = Vec::new();
    for i in 0..16i32 {
        let c = p.connect("md5user", "testdb").await;
        tasks.push(tokio::spawn(async move {
            c.batch_execute(&format!("PREPARE q(int) AS SELECT $1 * {i}"))
                .await
                .unwrap();
            for n in 0..30i32 {
                let r = c.simple_query(&format!("EXECUTE q({n})")).await.unwrap();
                assert_eq!(text(&r), [(n * i).to_string()]);
                if n % 10 == 0 {
                    // Also inside an explicit transaction.
                    c.batch_execute("BEGIN").await.unwrap();
                    let r = c.simple_query("EXECUTE q(2)").await.unwrap();
                    assert_eq!(text(&r), [(2 * i).to_string()]);
                    c.batch_execute("COMMIT").await.unwrap();
                }
            }
            c.batch_execute("DEALLOCATE q").await.unwrap();
            let err = c.simple_query("EXECUTE q(1)").await.unwrap_err();
            assert_eq!(harness::sqlstate(&err), Some("26000"), "{err}");
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_dump_and_pg_restore_work_in_transaction_mode() {
    let Some(pg_dump) = harness::pg_bin_for_server_or_skip("pg_dump") else {
        return;
    };
    let pg = TempPostgres::start();
    pg.psql("create database restored");
    pg.psql_in(
        "testdb",
        "create schema app; create table app.items (id int primary key, name text); \
         insert into app.items select g, 'item ' || g from generate_series(1, 100) g; \
         create view app.v as select count(*) from app.items",
    );
    let p = tx_pooler(&pg).await;
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("dump.custom");
    let out = std::process::Command::new(pg_dump)
        .args([
            "-Fc",
            "-f",
            dump.to_str().unwrap(),
            &p.dsn("postgres", "testdb"),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pg_dump: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = std::process::Command::new(harness::pg_bin("pg_restore"))
        .args([
            "--exit-on-error",
            "-d",
            &p.dsn("postgres", "restored"),
            dump.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pg_restore: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        pg.psql_in("restored", "select count(*) from app.items"),
        "100"
    );
    assert_eq!(pg.psql_in("restored", "select * from app.v"), "100");
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_database_is_not_blocked_by_the_pools_idle_servers() {
    let pg = TempPostgres::start();
    let p = tx_pooler(&pg).await;
    let admin = p.connect("postgres", "testdb").await;
    for (db, sql) in [
        ("dropme", "DROP DATABASE dropme"),
        ("renameme", "ALTER DATABASE renameme RENAME TO renamed"),
    ] {
        admin
            .batch_execute(&format!("CREATE DATABASE {db}"))
            .await
            .unwrap();
        // A client of that database leaves an idle server in its pool.
        let c = p.connect("postgres", db).await;
        c.batch_execute("select 1").await.unwrap();
        drop(c);
        // As straight against PostgreSQL: no other session, so no 55006 "being accessed
        // by other users".
        admin
            .batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    }
    p.shutdown().await;
}

/// `max_prepared_statements` lowered on reload: a server holding more statements closes
/// its least recently used ones down to the new size at its next Parse, as PgBouncer does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowered_max_prepared_statements_evicts_down_to_the_new_size() {
    let pg = TempPostgres::start();
    let mut p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "1")
        .setting("max_prepared_statements", "5")
        .start()
        .await;
    let c = p.connect("postgres", "testdb").await;
    // The server's statements (the view's name quoted: not the client's own), counted by
    // a simple query: it makes no statement of its own.
    let held = async |c: &tokio_postgres::Client| -> Vec<String> {
        text(
            &c.simple_query("select count(*) from pg_catalog.\"pg_prepared_statements\"")
                .await
                .unwrap(),
        )
    };
    let mut kept = Vec::new();
    for i in 0..5 {
        kept.push(c.prepare(&format!("select {i}")).await.unwrap());
    }
    assert_eq!(held(&c).await, ["5"]);
    p.reload_with(|b| b.setting("max_prepared_statements", "2"))
        .await;
    assert_eq!(
        held(&c).await,
        ["5"],
        "nothing is closed before the next Parse"
    );
    let s = c.prepare("select 10").await.unwrap();
    assert_eq!(held(&c).await, ["2"]);
    // Every statement still runs (prepared again where needed).
    for (i, stmt) in kept.iter().enumerate() {
        let v: i32 = c.query_one(stmt, &[]).await.unwrap().get(0);
        assert_eq!(v, i as i32);
    }
    let v: i32 = c.query_one(&s, &[]).await.unwrap().get(0);
    assert_eq!(v, 10);
    p.shutdown().await;
}

/// A Parse of a name the client already has: PostgreSQL's `42P05` and the session goes on
/// (PgBouncer closes the connection), with PgBouncer's words in the log for those who grep
/// for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_statement_name_is_refused_and_logged() {
    let pg = TempPostgres::start();
    let p = harness::process::PoolerProcess::start(
        TestPooler::builder(&pg)
            .setting("pool_mode", "transaction")
            .setting("auth_type", "trust"),
    )
    .await;
    let mut w = harness::wire::Wire::connect(p.port(), "postgres", "testdb").await;
    let first = w.step("P test|select 1\nS").await;
    assert!(first.contains(&"ParseComplete".to_string()), "{first:?}");
    let again = w.step("P test|select 1\nS").await;
    assert!(
        again.iter().any(|l| l.starts_with("Error 42P05")),
        "{again:?}"
    );
    let run = w.step("B |test|\nE \nS").await;
    assert!(run.contains(&"Row 1".to_string()), "{run:?}");
    harness::wait_for(
        "the log line",
        std::time::Duration::from_secs(5),
        || async {
            p.log()
                .contains("prepared statement 'test' was already prepared")
        },
    )
    .await;
}
