//! PostgreSQL is the oracle: the same scripts, sent by 16 clients in lockstep straight to
//! PostgreSQL and through pgcarpool in transaction mode over a pool of one server, must give
//! every client the same rows and errors. Both protocols (simple Query, and Parse/Bind/
//! Execute with SQL text inside the Parse), same names in every client, DDL in between.
mod harness;

use harness::wire::{Wire, oracle};
use harness::{TempPostgres, TestPooler, pool_of, transaction_pooler};

fn script(steps: &[String]) -> Vec<String> {
    steps.to_vec()
}

/// Every client's transcript holds `needle` somewhere (guards against scripts that test
/// nothing: both sides failing the same way for another reason).
fn all_contain(t: &[Vec<Vec<String>>], step: usize, needle: &str) {
    for (i, c) in t.iter().enumerate() {
        assert!(
            c[step].iter().any(|l| l.contains(needle)),
            "client {i} step {step}: no {needle:?} in {:?}",
            c[step]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_prepare_execute_deallocate_in_both_protocols() {
    let pg = TempPostgres::start();
    let p = pool_of(&pg, 1).await;
    let scripts: Vec<Vec<String>> = (0..16)
        .map(|i| {
            script(&[
                format!("Q PREPARE p(int) AS select $1 + {i}, 'client-{i}'"),
                "Q EXECUTE p(0)".into(),
                // SQL EXECUTE inside a Parse (what a driver sends for a parameterless query).
                "P |EXECUTE p(1)\nB ||\nD P \nE \nS".into(),
                "Q PREPARE p AS select 1".into(),
                "Q EXECUTE p(2)".into(),
                "P |DEALLOCATE p\nB ||\nE \nS".into(),
                "Q EXECUTE p(0)".into(),
                "P |EXECUTE p(0)\nB ||\nE \nS".into(),
                format!("Q PREPARE p AS select 'again-{i}'"),
                "P |EXECUTE p\nB ||\nE \nS".into(),
                "Q DEALLOCATE p".into(),
                "Q DEALLOCATE p".into(),
            ])
        })
        .collect();
    let t = oracle(pg.port(), p.port(), "postgres", "testdb", &scripts).await;
    for (i, c) in t.iter().enumerate() {
        assert!(c[1].contains(&format!("Row {i}|client-{i}")), "{:?}", c[1]);
        assert!(
            c[2].contains(&format!("Row {}|client-{i}", i + 1)),
            "{:?}",
            c[2]
        );
        assert!(c[9].contains(&format!("Row again-{i}")), "{:?}", c[9]);
    }
    all_contain(&t, 3, "Error 42P05");
    all_contain(&t, 6, "Error 26000");
    all_contain(&t, 7, "Error 26000");
    all_contain(&t, 11, "Error 26000");
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_execute_inside_named_statements() {
    let pg = TempPostgres::start();
    let p = pool_of(&pg, 1).await;
    let scripts: Vec<Vec<String>> = (0..16)
        .map(|i| {
            script(&[
                // asyncpg: prepare(name='foobar'), then fetchval('EXECUTE foobar') through
                // a statement of its own cache.
                format!("P foobar|select {i}\nS"),
                "P s1|EXECUTE foobar\nD S s1\nB |s1|\nE \nS".into(),
                format!("Q PREPARE q AS select 'q{i}'"),
                "P s2|EXECUTE q\nB |s2|\nE \nS".into(),
                "B |s1|\nE \nS".into(),
                "P s3|EXECUTE nosuch\nB |s3|\nE \nS".into(),
            ])
        })
        .collect();
    let t = oracle(pg.port(), p.port(), "postgres", "testdb", &scripts).await;
    for (i, c) in t.iter().enumerate() {
        assert!(c[1].contains(&format!("Row {i}")), "{:?}", c[1]);
        assert!(c[3].contains(&format!("Row q{i}")), "{:?}", c[3]);
        assert!(c[4].contains(&format!("Row {i}")), "{:?}", c[4]);
    }
    all_contain(&t, 5, "Error 26000");
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_and_unknown_names_fail_as_in_postgresql() {
    let pg = TempPostgres::start();
    let p = pool_of(&pg, 1).await;
    let scripts: Vec<Vec<String>> = (0..16)
        .map(|i| {
            script(&[
                format!("P s1|select {i}\nS"),
                "P s1|select 'x'\nS".into(),
                "B |s1|\nE \nS".into(),
                // A failed Parse in a pipeline: the server skips to the Sync.
                "P s1|select 'y'\nB |s1|\nE \nS".into(),
                "B |nosuch|\nE \nS".into(),
                "D S nosuch\nS".into(),
                "C S nosuch\nS".into(),
                "Q DEALLOCATE \"PGCARPOOL_1\"".into(),
                "Q EXECUTE \"PGCARPOOL_1\"".into(),
                "B |PGCARPOOL_1|\nE \nS".into(),
                "D S PGCARPOOL_2\nS".into(),
                format!(
                    "Q BEGIN\nQ PREPARE t2 AS select {i}\nQ PREPARE t2 AS select 2\nQ EXECUTE t2\nQ ROLLBACK"
                ),
                "Q EXECUTE t2".into(),
                "Q BEGIN\nQ select 1/0\nP s1|select 3\nS\nQ ROLLBACK".into(),
                "Q BEGIN\nP s9|select 1\nP s9|select 2\nS\nB |s9|\nE \nS\nQ ROLLBACK".into(),
                "B |s9|\nE \nS".into(),
                // A statement ending a failed transaction block is accepted there (pgjdbc
                // prepares its ROLLBACK by name).
                "P rb0|ROLLBACK\nS".into(),
                "Q BEGIN\nQ select 1/0\nP rb|ROLLBACK\nB |rb|\nE \nS".into(),
            ])
        })
        .collect();
    let t = oracle(pg.port(), p.port(), "postgres", "testdb", &scripts).await;
    for (i, c) in t.iter().enumerate() {
        assert!(c[2].contains(&format!("Row {i}")), "{:?}", c[2]);
        assert!(c[12].contains(&format!("Row {i}")), "{:?}", c[12]);
    }
    all_contain(&t, 1, "Error 42P05");
    all_contain(&t, 3, "Error 42P05");
    all_contain(&t, 4, "Error 26000");
    all_contain(&t, 5, "Error 26000");
    all_contain(&t, 7, "Error 26000");
    all_contain(&t, 8, "Error 26000");
    all_contain(&t, 9, "Error 26000");
    all_contain(&t, 11, "Error 25P02");
    all_contain(&t, 13, "Error 25P02");
    all_contain(&t, 14, "Error 42P05");
    all_contain(&t, 17, "Complete ROLLBACK");
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unnamed_statement_lives_until_postgresql_drops_it() {
    let pg = TempPostgres::start();
    let p = pool_of(&pg, 1).await;
    let scripts: Vec<Vec<String>> = (0..16)
        .map(|i| {
            script(&[
                // pgx's describe-exec: Parse+Describe+Sync, then Bind+Execute+Sync.
                format!("P |select $1::int + {i}\nD S \nS"),
                "B ||5\nE \nS".into(),
                "B ||6\nD P \nE \nS".into(),
                "D S \nS".into(),
                // A simple query drops it.
                format!("Q select {i}"),
                "B ||5\nE \nS".into(),
                // A failed Parse drops it too.
                format!("P |select 'u{i}'\nS"),
                "P |select nosuchcolumn\nS".into(),
                "B ||\nE \nS".into(),
                // So does Close.
                format!("P |select 'v{i}'\nS"),
                "C S \nS".into(),
                "B ||\nE \nS".into(),
                format!("P |select 'w{i}'\nS"),
                "B ||\nE \nS".into(),
            ])
        })
        .collect();
    let t = oracle(pg.port(), p.port(), "postgres", "testdb", &scripts).await;
    for (i, c) in t.iter().enumerate() {
        assert!(c[1].contains(&format!("Row {}", i + 5)), "{:?}", c[1]);
        assert!(c[2].contains(&format!("Row {}", i + 6)), "{:?}", c[2]);
        assert!(c[13].contains(&format!("Row w{i}")), "{:?}", c[13]);
    }
    all_contain(&t, 5, "Error 26000");
    all_contain(&t, 8, "Error 26000");
    all_contain(&t, 11, "Error 26000");
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_parsed_after_ddl_see_the_new_schema() {
    let pg = TempPostgres::start();
    let p = pool_of(&pg, 1).await;
    let one = |i: usize, s: &str| if i == 0 { s.to_string() } else { String::new() };
    let scripts: Vec<Vec<String>> = (0..16)
        .map(|i| {
            script(&[
                one(
                    i,
                    "Q drop table if exists st; create table st(a int); insert into st values (1)",
                ),
                "P s|select * from st\nB |s|\nE \nS".into(),
                "Q PREPARE q AS select * from st".into(),
                one(
                    i,
                    "Q drop table st; create table st(a int, b text); insert into st values (2, 'two')",
                ),
                "P s2|select * from st\nB |s2|\nE \nS".into(),
                "P |select * from st\nB ||\nE \nS".into(),
                "Q PREPARE q2 AS select * from st".into(),
                "Q EXECUTE q2".into(),
                // The case: DEALLOCATE ALL, then the table changes again.
                one(
                    i,
                    "Q DEALLOCATE ALL; drop table st; create table st(a int, b text, c int); insert into st values (3, 'three', 3)",
                ),
                "P s3|select * from st\nB |s3|\nE \nS".into(),
                "Q PREPARE q3 AS select * from st".into(),
                "Q EXECUTE q3".into(),
                // Not compared: statements prepared before a change. PostgreSQL fails
                // them (0A000, cached plan must not change result type); pgcarpool may
                // prepare them anew on a server that lost them (docs/compatibility.md).
            ])
        })
        .collect();
    // The DDL runs through pgcarpool in the pooled run and straight in the direct run:
    // each run creates the table itself.
    let t = oracle(pg.port(), p.port(), "postgres", "testdb", &scripts).await;
    for (i, c) in t.iter().enumerate() {
        for k in [4, 5, 7] {
            assert!(
                c[k].contains(&"Row 2|two".to_string()),
                "client {i}: {:?}",
                c[k]
            );
        }
        for k in [9, 11] {
            assert!(
                c[k].contains(&"Row 3|three|3".to_string()),
                "client {i}: {:?}",
                c[k]
            );
        }
    }
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_changed_by_another_application_heals_on_the_next_parse() {
    let pg = TempPostgres::start();
    let p = pool_of(&pg, 1).await;
    let one = |i: usize, s: &str| if i == 0 { s.to_string() } else { String::new() };
    let scripts: Vec<Vec<String>> = (0..16)
        .map(|i| {
            script(&[
                one(
                    i,
                    "X drop table if exists at; create table at(a int); insert into at values (1)",
                ),
                "P s|select * from at\nB |s|\nE \nS".into(),
                // pgcarpool does not see this.
                one(i, "X alter table at alter column a type text"),
                // Each client's own statement is stale, as in PostgreSQL…
                "B |s|\nE \nS".into(),
                // …and a new Parse of the same text is a fresh parse (asyncpg's retry after
                // InvalidCachedStatementError).
                "P s2|select * from at\nB |s2|\nE \nS".into(),
                "Q PREPARE q AS select a || 'x' from at".into(),
                "Q EXECUTE q".into(),
            ])
        })
        .collect();
    let t = oracle(pg.port(), p.port(), "postgres", "testdb", &scripts).await;
    all_contain(&t, 3, "Error 0A000");
    for c in &t {
        assert!(c[4].contains(&"Row 1".to_string()), "{:?}", c[4]);
        assert!(c[6].contains(&"Row 1x".to_string()), "{:?}", c[6]);
    }
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parse_after_a_schema_change_out_of_sight_is_a_fresh_parse() {
    let pg = TempPostgres::start();
    let p = pool_of(&pg, 1).await;
    let one = |i: usize, s: &str| if i == 0 { s.to_string() } else { String::new() };
    let scripts: Vec<Vec<String>> = (0..16)
        .map(|i| {
            script(&[
                one(
                    i,
                    "X drop table if exists bt; create table bt(a int); insert into bt values (1)",
                ),
                // Client 0 parses and runs the statement: the server holds it.
                one(i, "P s|select * from bt\nB |s|\nE \nS"),
                // Another application changes the table; pgcarpool does not see it.
                one(i, "X alter table bt alter column a type text"),
                // The others parse the same text only now: in PostgreSQL a fresh parse.
                if i == 0 {
                    String::new()
                } else {
                    "P s|select * from bt\nS".into()
                },
                // Client 0's own statement is stale (as in PostgreSQL); the others' are not.
                "B |s|\nE \nS".into(),
                // pgjdbc's and asyncpg's shape: Parse, Bind, Execute in one round.
                format!("P t{i}|select concat(a, '-{i}') from bt\nB |t{i}|\nE \nS"),
                // Described before the change (asyncpg's prepare): stale, as in PostgreSQL,
                // whether the change is seen (DDL through pgcarpool) or not.
                format!("P d{i}|select * from bt\nD S d{i}\nS"),
                one(i, "X alter table bt alter column a type varchar"),
                format!("B |d{i}|\nE \nS"),
                format!("P e{i}|select * from bt\nS"),
                one(i, "Q alter table bt alter column a type int using a::int"),
                format!("B |e{i}|\nE \nS"),
            ])
        })
        .collect();
    let t = oracle(pg.port(), p.port(), "postgres", "testdb", &scripts).await;
    assert!(t[0][4][0].starts_with("Error 0A000"), "{:?}", t[0][4]);
    all_contain(&t, 8, "Error 0A000");
    all_contain(&t, 11, "Error 0A000");
    for (i, c) in t.iter().enumerate().skip(1) {
        assert!(
            c[4].contains(&"Row 1".to_string()),
            "client {i}: {:?}",
            c[4]
        );
        assert!(
            c[5].contains(&format!("Row 1-{i}")),
            "client {i}: {:?}",
            c[5]
        );
    }
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_changed_out_of_sight_stays_with_its_client() {
    let pg = TempPostgres::start();
    let p = pool_of(&pg, 1).await;
    let scripts: Vec<Vec<String>> = (0..16)
        .map(|i| {
            let role = if i % 2 == 1 {
                "DO $$BEGIN EXECUTE 'SET ROLE md5user'; END$$"
            } else {
                "select 1"
            };
            let auth = if i % 4 == 2 {
                "SET SESSION AUTHORIZATION trustuser"
            } else {
                "select 2"
            };
            script(&[
                format!("Q DO $$BEGIN EXECUTE 'SET search_path = s' || '{i}' || ', public'; END$$"),
                "Q show search_path".into(),
                format!(
                    "Q DO $$BEGIN PERFORM set_config('statement_timeout', '{}', false); END$$",
                    (i + 1) * 1000
                ),
                "Q show statement_timeout".into(),
                format!("Q {role}"),
                format!("Q {auth}"),
                "Q select current_user, session_user".into(),
                "P |show search_path\nB ||\nE \nS".into(),
                // RESET ALL leaves the session authorization and role as they are.
                "Q RESET ALL".into(),
                "Q select current_user, session_user".into(),
            ])
        })
        .collect();
    let t = oracle(pg.port(), p.port(), "postgres", "testdb", &scripts).await;
    for (i, c) in t.iter().enumerate() {
        assert!(c[1].contains(&format!("Row s{i}, public")), "{:?}", c[1]);
        assert!(c[3].contains(&format!("Row {}s", i + 1)), "{:?}", c[3]);
    }
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_changed_inside_functions_stay_with_their_client() {
    let pg = TempPostgres::start();
    let p = pool_of(&pg, 1).await;
    let one = |i: usize, s: &str| if i == 0 { s.to_string() } else { String::new() };
    let scripts: Vec<Vec<String>> = (0..16)
        .map(|i| {
            script(&[
                one(
                    i,
                    "Q create or replace function setsp(p text) returns void language plpgsql as \
                     $$begin perform set_config('search_path', p, false); end$$; \
                     create or replace function st(ms text) returns text language sql as \
                     $$select set_config('statement_timeout', ms, false)$$; \
                     create or replace function rs() returns void language plpgsql as \
                     $$begin reset work_mem; end$$",
                ),
                format!("Q select setsp('s{i}, public')"),
                "Q show search_path".into(),
                format!("P |select st('{}')\nB ||\nE \nS", (i + 1) * 1000),
                "P |show statement_timeout\nB ||\nE \nS".into(),
                format!("Q SET work_mem = '{}kB'", 1024 + i),
                "Q show work_mem".into(),
                if i % 2 == 0 {
                    "Q select rs()".into()
                } else {
                    "Q select 1".into()
                },
                "Q show work_mem".into(),
                "Q show search_path".into(),
            ])
        })
        .collect();
    let t = oracle(pg.port(), p.port(), "postgres", "testdb", &scripts).await;
    for (i, c) in t.iter().enumerate() {
        assert!(c[2].contains(&format!("Row s{i}, public")), "{:?}", c[2]);
        assert!(c[4].contains(&format!("Row {}s", i + 1)), "{:?}", c[4]);
        assert!(c[9].contains(&format!("Row s{i}, public")), "{:?}", c[9]);
    }
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_settings_follow_their_client() {
    let pg = TempPostgres::start();
    let p = pool_of(&pg, 1).await;
    let sets: String = (0..2500)
        .map(|n| format!("SET myapp.x_{n} = 'v{n}'; "))
        .collect();
    let mut scripts = vec![script(&[
        format!("Q {sets}"),
        String::new(),
        "Q show myapp.x_2499".into(),
    ])];
    for i in 1..16 {
        scripts.push(script(&[
            format!("Q SET myapp.x_{i} = 'own-{i}'"),
            // A server that had the setting keeps it defined, empty: PostgreSQL cannot
            // undefine a custom setting (docs/compatibility.md).
            format!("Q select current_setting('myapp.x_{i}'), coalesce(current_setting('myapp.x_2000', true), '')"),
            "Q select coalesce(current_setting('myapp.x_7', true), '')".into(),
        ]));
    }
    let t = oracle(pg.port(), p.port(), "postgres", "testdb", &scripts).await;
    assert!(t[0][2].contains(&"Row v2499".to_string()), "{:?}", t[0][2]);
    for (i, c) in t.iter().enumerate().skip(1) {
        assert!(c[1].contains(&format!("Row own-{i}|")), "{:?}", c[1]);
    }
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_encoding_is_reported_canonically() {
    let pg = TempPostgres::start();
    let p = pool_of(&pg, 1).await;
    for port in [pg.port(), p.port()] {
        let (w, reported) =
            Wire::connect_with(port, "postgres", "testdb", &[("client_encoding", "utf-8")]).await;
        assert_eq!(
            reported.get("client_encoding").map(String::as_str),
            Some("UTF8"),
            "port {port}"
        );
        let mut w = w;
        let t = w.step("Q show client_encoding").await;
        assert!(t.contains(&"Row UTF8".to_string()), "{t:?}");
    }
    p.shutdown().await;
}

/// Each login is told its own startup values in its ParameterStatus messages, as
/// PostgreSQL tells them, when logins with other values came between (the pool reuses what
/// it told the last login with the same values).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_login_is_told_its_own_startup_values() {
    let pg = TempPostgres::start();
    let p = pool_of(&pg, 1).await;
    let a: &[(&str, &str)] = &[("application_name", "app-a"), ("TimeZone", "Asia/Tokyo")];
    let b: &[(&str, &str)] = &[("application_name", "app-b"), ("DateStyle", "SQL, DMY")];
    let keys = [
        "application_name",
        "TimeZone",
        "DateStyle",
        "client_encoding",
    ];
    for params in [a, b, a, &[], a, b, b, &[]] {
        let mut told = Vec::new();
        for port in [pg.port(), p.port()] {
            let (_w, reported) = Wire::connect_with(port, "postgres", "testdb", params).await;
            told.push(keys.map(|k| reported.get(k).cloned()));
        }
        assert_eq!(told[0], told[1], "{params:?}");
    }
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_inside_a_parse_pins_and_behaves_as_postgresql() {
    let pg = TempPostgres::start();
    // Every client pins a server of its own; one more serves the rest.
    let p = pool_of(&pg, 17).await;
    let scripts: Vec<Vec<String>> = (0..16)
        .map(|i| {
            script(&[
                format!("P |PREPARE q AS select 'q{i}'\nB ||\nE \nS"),
                "Q EXECUTE q".into(),
                "P |PREPARE q AS select 2\nB ||\nE \nS".into(),
                "P |EXECUTE q\nB ||\nE \nS".into(),
                "Q PREPARE t1 AS select 1; PREPARE t1 AS select 'x'; EXECUTE t1".into(),
                "Q EXECUTE t1".into(),
                "Q DEALLOCATE q".into(),
                "P |DEALLOCATE q\nB ||\nE \nS".into(),
                "Q DEALLOCATE t1; select 'done'".into(),
            ])
        })
        .collect();
    let t = oracle(pg.port(), p.port(), "postgres", "testdb", &scripts).await;
    for (i, c) in t.iter().enumerate() {
        assert!(c[1].contains(&format!("Row q{i}")), "{:?}", c[1]);
        assert!(c[3].contains(&format!("Row q{i}")), "{:?}", c[3]);
    }
    all_contain(&t, 2, "Error 42P05");
    all_contain(&t, 4, "Error 42P05");
    all_contain(&t, 7, "Error 26000");
    // Names pgcarpool owns cannot be taken that way.
    let mut w = Wire::connect(p.port(), "postgres", "testdb").await;
    let got = w
        .step("P |PREPARE \"PGCARPOOL_1\" AS select 1\nB ||\nE \nS")
        .await;
    assert!(got[0].starts_with("Error 42939"), "{got:?}");
    let got = w
        .step("Q DEALLOCATE \"PGCARPOOL_1\"; PREPARE \"PGCARPOOL_1\" AS select 'loot'")
        .await;
    assert!(got[0].starts_with("Error 42939"), "{got:?}");
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internal_statements_replaced_out_of_sight_are_dropped() {
    let pg = TempPostgres::start();
    let p = pool_of(&pg, 1).await;
    // Code pgcarpool cannot read replaces the statement a victim prepared under its
    // internal name (the first statement of the pooler: PGCARPOOL_1).
    let attack = "Q DO $$BEGIN \
        BEGIN EXECUTE 'DEALLOCATE ' || quote_ident('PGCARPOOL' || '_1'); \
        EXCEPTION WHEN OTHERS THEN NULL; END; \
        EXECUTE 'PREPARE ' || quote_ident('PGCARPOOL' || '_1') || ' AS select ''loot'''; END$$";
    // Fifteen victims share that statement; the sixteenth client attacks.
    let mut scripts: Vec<Vec<String>> = (0..15)
        .map(|_| {
            script(&[
                "P v|select 'victim'\nS".into(),
                String::new(),
                "B |v|\nE \nS".into(),
            ])
        })
        .collect();
    scripts.push(script(&[String::new(), attack.into(), String::new()]));
    let t = oracle(pg.port(), p.port(), "postgres", "testdb", &scripts).await;
    for c in &t[..15] {
        assert!(c[2].contains(&"Row victim".to_string()), "{:?}", c[2]);
    }
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_client_leaves_nothing_behind_without_a_reset_query() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("auth_type", "trust")
        .setting("default_pool_size", "1")
        .setting("server_reset_query", "")
        .start()
        .await;
    let mut a = Wire::connect(p.port(), "postgres", "testdb").await;
    let got = a
        .step("Q create temp table tt(a int); insert into tt values (1); PREPARE own AS select 7")
        .await;
    assert!(got.contains(&"Complete INSERT 0 1".to_string()), "{got:?}");
    drop(a);
    let mut b = Wire::connect(p.port(), "postgres", "testdb").await;
    let got = b.step("Q select * from tt").await;
    assert!(got[0].starts_with("Error 42P01"), "{got:?}");
    let got = b
        .step("Q select count(*) from pg_prepared_statements")
        .await;
    assert!(got.contains(&"Row 0".to_string()), "{got:?}");
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_to_oneself_carries_ones_own_pid() {
    let pg = TempPostgres::start();
    let p = pool_of(&pg, 1).await;
    let scripts: Vec<Vec<String>> = (0..16)
        .map(|i| {
            script(&[
                // A channel per client: when others' notifications arrive is timing.
                format!("Q LISTEN ch{i}"),
                format!("Q NOTIFY ch{i}, 'from-{i}'"),
                format!("Q UNLISTEN ch{i}"),
            ])
        })
        .collect();
    // Lockstep with a pool of 1 would wait for the first pinned client; pinned servers do
    // not count against the pool's size.
    let p4 = pool_of(&pg, 1).await;
    let t = oracle(pg.port(), p4.port(), "postgres", "testdb", &scripts).await;
    for (i, c) in t.iter().enumerate() {
        assert!(
            c[1].contains(&format!("Notify ch{i} from-{i}")),
            "{:?}",
            c[1]
        );
    }
    for port in [pg.port(), p.port()] {
        let mut w = Wire::connect(port, "postgres", "testdb").await;
        w.step("Q LISTEN ch2; NOTIFY ch2, 'me'").await;
        assert_eq!(w.notify_pids, vec![w.pid], "port {port}");
    }
    p.shutdown().await;
    p4.shutdown().await;
}

/// `DEALLOCATE ALL` and `DISCARD ALL` end the client's own statements only, as in its own
/// PostgreSQL session: a Bind of one afterwards fails with 26000 and the session goes on
/// (PgBouncer closes the connection there: "prepared statement did not exist"), the other
/// clients keep theirs, and the name can be parsed again (psycopg does so after the error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deallocate_all_and_discard_all_forget_the_clients_own_statements() {
    let pg = TempPostgres::start();
    let p = pool_of(&pg, 1).await;
    let forget = |i: usize| match i % 3 {
        0 => "Q DEALLOCATE ALL",
        1 => "Q DISCARD ALL",
        _ => "Q select 1",
    };
    let scripts: Vec<Vec<String>> = (0..12)
        .map(|i| {
            script(&[
                format!("P s1|select {i}\nS"),
                "B |s1|\nE \nS".into(),
                forget(i).into(),
                "B |s1|\nE \nS".into(),
                format!("P s1|select {}\nS", i + 100),
                "B |s1|\nE \nS".into(),
            ])
        })
        .collect();
    let t = oracle(pg.port(), p.port(), "postgres", "testdb", &scripts).await;
    for (i, c) in t.iter().enumerate() {
        let forgot = i % 3 != 2;
        assert!(c[1].contains(&format!("Row {i}")), "{:?}", c[1]);
        assert_eq!(
            c[3].iter().any(|l| l.starts_with("Error 26000")),
            forgot,
            "client {i}: {:?}",
            c[3]
        );
        let now = if forgot { i + 100 } else { i };
        assert!(c[5].contains(&format!("Row {now}")), "{:?}", c[5]);
    }
    p.shutdown().await;
}

/// pgcarpool over a pool of one server that holds one prepared statement at a time: a
/// client's statement is prepared again each time it is used after another.
async fn pool_of_one_holding_one_statement(pg: &TempPostgres) -> TestPooler {
    transaction_pooler(pg)
        .setting("auth_type", "trust")
        .setting("default_pool_size", "1")
        .setting("max_client_conn", "100")
        .setting("max_prepared_statements", "1")
        .start()
        .await
}

/// Differential seed 80031: an EXECUTE of a client's SQL-prepared statement inside a failed
/// transaction block, on a server that lacks it, fails once (25P02) in both protocols; the
/// statement is not prepared there (the server would refuse it too), and after ROLLBACK it
/// runs. pgcarpool counted it as prepared on that server: EXECUTE then said 26000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execute_in_a_failed_block_leaves_the_statement_to_run_after_rollback() {
    let pg = TempPostgres::start();
    let p = pool_of_one_holding_one_statement(&pg).await;
    let block = |first: &str, second: &str| {
        ["Q BEGIN", "Q SELECT 1/0", first, second, "Q ROLLBACK"].map(String::from)
    };
    let (parse, query) = ("P |EXECUTE p1(5)\nB ||\nE |0\nS", "Q EXECUTE p1(6)");
    let mut steps = vec!["Q PREPARE p1(int) AS SELECT $1 * 10 AS x".to_string()];
    // (s2, s3: each takes the server's one place from p1.)
    steps.push("P s2|SELECT 2\nS".into());
    steps.extend(block(parse, query));
    steps.push("Q EXECUTE p1(4)".into());
    steps.push("P s3|SELECT 3\nS".into());
    steps.extend(block(query, parse));
    steps.push("P |EXECUTE p1(3)\nB ||\nE |0\nS".into());
    let t = oracle(pg.port(), p.port(), "postgres", "testdb", &[steps]).await;
    for k in [4, 5, 11, 12] {
        all_contain(&t, k, "Error 25P02");
        assert_eq!(t[0][k].iter().filter(|l| l.starts_with("Error")).count(), 1);
    }
    assert!(t[0][7].contains(&"Row 40".to_string()), "{:?}", t[0][7]);
    assert!(t[0][14].contains(&"Row 30".to_string()), "{:?}", t[0][14]);
    p.shutdown().await;
}

/// As above with the failed block sent at once (the statement's PREPARE goes before the
/// server has said the block failed, and fails): 16 clients over the one server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelined_execute_in_a_failed_block_leaves_the_statement_to_run_after_rollback() {
    let pg = TempPostgres::start();
    let p = pool_of_one_holding_one_statement(&pg).await;
    let (parse, query) = ("P |EXECUTE p1(5)\nB ||\nE |0\nS", "Q EXECUTE p1(6)");
    let scripts: Vec<Vec<String>> = (0..16)
        .map(|i| {
            let (first, second) = if i % 2 == 0 {
                (parse, query)
            } else {
                (query, parse)
            };
            script(&[
                format!("Q PREPARE p1(int) AS SELECT $1 * 10 + {i} AS x"),
                format!("P s{i}|SELECT {i}\nS"),
                format!("Q BEGIN\nQ SELECT 1/0\n{first}\n{second}\nQ ROLLBACK"),
                "Q EXECUTE p1(4)".into(),
                format!("P t{i}|SELECT {i}\nS"),
                format!("Q BEGIN\nQ SELECT 1/0\n{second}\n{first}\nQ ROLLBACK"),
                "P |EXECUTE p1(3)\nB ||\nE |0\nS".into(),
            ])
        })
        .collect();
    let t = oracle(pg.port(), p.port(), "postgres", "testdb", &scripts).await;
    for (i, c) in t.iter().enumerate() {
        for k in [2, 5] {
            let errors: Vec<_> = c[k].iter().filter(|l| l.starts_with("Error")).collect();
            assert_eq!(errors.len(), 3, "client {i} step {k}: {:?}", c[k]);
        }
        assert!(c[3].contains(&format!("Row {}", 40 + i)), "{:?}", c[3]);
        assert!(c[6].contains(&format!("Row {}", 30 + i)), "{:?}", c[6]);
    }
    all_contain(&t, 2, "Error 25P02");
    p.shutdown().await;
}

/// A client's statements that the server cannot prepare again (their table is gone), read
/// from `pg_prepared_statements` on a server that lacks them: PostgreSQL lists them (it
/// analyses a statement again only when it runs), and an EXECUTE of each fails once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_that_no_longer_prepare_are_listed_and_fail_at_their_execute() {
    let pg = TempPostgres::start();
    let p = pool_of_one_holding_one_statement(&pg).await;
    let steps = [
        "Q CREATE TABLE gone(a int)",
        "Q PREPARE a AS SELECT 1 FROM gone",
        "Q PREPARE b AS SELECT 2 FROM gone",
        "Q DROP TABLE gone",
        "P s|SELECT 9\nS",
        "Q SELECT name FROM pg_prepared_statements ORDER BY name",
        "Q EXECUTE b",
        "Q EXECUTE a",
        "P |SELECT name FROM pg_prepared_statements ORDER BY name\nB ||\nE |0\nS",
        "Q EXECUTE b",
    ]
    .map(String::from);
    let t = oracle(pg.port(), p.port(), "postgres", "testdb", &[steps.to_vec()]).await;
    assert!(t[0][5].starts_with(&["Columns name", "Row a", "Row b"].map(String::from)));
    assert!(
        t[0][8].starts_with(&["ParseComplete", "BindComplete", "Row a", "Row b"].map(String::from))
    );
    for k in [6, 7, 9] {
        assert_eq!(t[0][k].len(), 2, "{:?}", t[0][k]);
        assert!(t[0][k][0].starts_with("Error 42P01"), "{:?}", t[0][k]);
    }
    p.shutdown().await;
}

/// Differential seeds 93193, 96139: a read of `pg_prepared_statements` (in a Parse, in a
/// simple Query) inside a transaction block, on a server that lacks one of the client's
/// statements, after the client changed its search_path: the statement is parsed there
/// under the search_path it was parsed with, listed with its parameter types, and the block
/// goes on (PostgreSQL lists it without analysing it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_of_prepared_statements_in_a_block_parses_them_in_their_own_scope() {
    let pg = TempPostgres::start();
    let p = pool_of_one_holding_one_statement(&pg).await;
    let steps = [
        "Q CREATE TABLE scoped(id int)",
        "P s3|SELECT id FROM scoped WHERE id = $1\nS",
        "P s4|SELECT 4\nS",
        "Q SET search_path = pg_catalog",
        "Q BEGIN",
        "P |SELECT name FROM pg_prepared_statements ORDER BY name\nB ||\nE |0\nS",
        "P s5|SELECT 5\nS",
        "Q SELECT name, array_length(parameter_types, 1) FROM pg_prepared_statements ORDER BY name",
        "Q SELECT 1",
        "Q COMMIT",
        "Q DROP TABLE public.scoped",
    ]
    .map(String::from);
    let t = oracle(pg.port(), p.port(), "postgres", "testdb", &[steps.to_vec()]).await;
    let listed = ["ParseComplete", "BindComplete", "Row s3", "Row s4"].map(String::from);
    assert!(t[0][5].starts_with(&listed), "{:?}", t[0][5]);
    let listed = ["Row s3|1", "Row s4|NULL"].map(String::from);
    assert!(t[0][7][1..].starts_with(&listed), "{:?}", t[0][7]);
    assert!(t[0][8].contains(&"Row 1".to_string()), "{:?}", t[0][8]);
    p.shutdown().await;
}

/// Differential seed 120934: an EXECUTE inside a Parse, in a transaction block whose
/// search_path was changed (by `set_config`, by SET) so that the client's SQL-prepared
/// statement no longer analyses, on a server that lacks the statement. PostgreSQL gives
/// ParseComplete, BindComplete, then 42P01 (analysed again at its use) and the block goes
/// on failed. pgcarpool prepared the statement under the block's search_path, not its
/// own: the PREPARE failed, 25P02 at the sync point (its error dropped), the 42P01 before
/// the BindComplete within a round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execute_in_a_parse_after_a_search_path_change_in_a_block_fails_at_its_execute() {
    let pg = TempPostgres::start();
    let p = pool_of_one_holding_one_statement(&pg).await;
    let evict = |k: usize| format!("P e{k}|SELECT {k}\nS");
    let mut steps = vec![
        "Q CREATE TABLE in_block(id int)".to_string(),
        "Q PREPARE p2 AS SELECT id FROM in_block".into(),
    ];
    let change = [
        "Q SELECT set_config('search_path', 'pg_catalog', false)",
        "Q SET search_path = pg_catalog",
        "Q SET LOCAL search_path = pg_catalog",
    ];
    let execute = [
        "P |EXECUTE p2\nB ||\nE |0\nS",
        "P |SELECT 1\nB ||\nE |0\nP |EXECUTE p2\nB ||\nE |0\nS",
    ];
    let mut checked = Vec::new();
    for (k, c) in change.iter().enumerate() {
        for (j, e) in execute.iter().enumerate() {
            steps.push(evict(k * 2 + j));
            steps.extend(["Q BEGIN", c, e, "Q SELECT 1", "Q ROLLBACK"].map(String::from));
            checked.push(steps.len() - 3);
            steps.push("Q EXECUTE p2".into());
        }
    }
    steps.push("Q DROP TABLE in_block".into());
    let t = oracle(pg.port(), p.port(), "postgres", "testdb", &[steps]).await;
    for k in checked {
        let bound = t[0][k].iter().position(|l| l == "BindComplete");
        let failed = t[0][k].iter().position(|l| l.starts_with("Error 42P01"));
        assert!(bound.is_some() && failed > bound, "{:?}", t[0][k]);
        all_contain(&t, k + 1, "Error 25P02");
        assert!(
            t[0][k + 3].contains(&"Columns id".to_string()),
            "{:?}",
            t[0][k + 3]
        );
    }
    p.shutdown().await;
}

/// A read of `pg_prepared_statements` (in a simple Query, in a Parse) inside a transaction
/// block, on a server that lacks a client's statement that no longer prepares (its table
/// is gone): PostgreSQL lists it and the block goes on. pgcarpool's PREPARE of it failed
/// in the block, which aborted it (25P02 at the next query).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_of_prepared_statements_in_a_block_survives_one_that_no_longer_prepares() {
    let pg = TempPostgres::start();
    let p = pool_of_one_holding_one_statement(&pg).await;
    let steps = [
        "Q CREATE TABLE gone_in_block(a int)",
        "Q PREPARE a AS SELECT a FROM gone_in_block",
        "Q DROP TABLE gone_in_block",
        "P s|SELECT 9\nS",
        "Q BEGIN",
        "Q SELECT name FROM pg_prepared_statements ORDER BY name",
        "Q SELECT 1",
        "P t|SELECT 8\nS",
        "P |SELECT name FROM pg_prepared_statements ORDER BY name\nB ||\nE |0\nS",
        "Q SELECT 2",
        "Q COMMIT",
    ]
    .map(String::from);
    let t = oracle(pg.port(), p.port(), "postgres", "testdb", &[steps.to_vec()]).await;
    assert!(t[0][5].starts_with(&["Columns name", "Row a"].map(String::from)));
    assert!(t[0][6].contains(&"Row 1".to_string()), "{:?}", t[0][6]);
    let listed = ["ParseComplete", "BindComplete", "Row a"].map(String::from);
    assert!(t[0][8].starts_with(&listed), "{:?}", t[0][8]);
    assert!(t[0][9].contains(&"Row 2".to_string()), "{:?}", t[0][9]);
    p.shutdown().await;
}

/// A client's SQL-prepared statement whose table was dropped, executed inside a Parse (in
/// and out of a transaction block) on a server that lacks it: PostgreSQL analyses it again
/// at the Execute and fails there (42P01). pgcarpool's PREPARE of it failed unseen, and the
/// EXECUTE then failed with 26000 (no such statement); the client now gets the PREPARE's
/// error there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execute_in_a_parse_of_a_statement_that_no_longer_prepares_fails_as_its_analysis() {
    let pg = TempPostgres::start();
    let p = pool_of_one_holding_one_statement(&pg).await;
    let steps = [
        "Q CREATE TABLE gone_at_execute(a int)",
        "Q PREPARE a AS SELECT a FROM gone_at_execute",
        "Q DROP TABLE gone_at_execute",
        "P s|SELECT 9\nS",
        "P |EXECUTE a\nB ||\nE |0\nS",
        "Q BEGIN",
        "P |EXECUTE a\nB ||\nE |0\nS",
        "Q ROLLBACK",
    ]
    .map(String::from);
    let t = oracle(pg.port(), p.port(), "postgres", "testdb", &[steps.to_vec()]).await;
    for k in [4, 6] {
        let want = ["ParseComplete", "BindComplete"].map(String::from);
        assert!(t[0][k].starts_with(&want), "{:?}", t[0][k]);
        assert!(t[0][k][2].starts_with("Error 42P01"), "{:?}", t[0][k]);
    }
    p.shutdown().await;
}

/// A read of `pg_prepared_statements` in a Parse, on a server that holds one statement and
/// lacks a client's protocol statement, after the client changed its search_path (in and
/// out of a block): each of the client's statements is prepared there (the one it lacked
/// under the search_path it was parsed with) and listed with its parameter types, as
/// PostgreSQL lists them. Preparing the next made room by closing the one before, which was
/// listed with none (NULL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parse_form_read_of_prepared_statements_lists_the_types_of_each() {
    let pg = TempPostgres::start();
    let p = pool_of_one_holding_one_statement(&pg).await;
    let read =
        "P |SELECT name, parameter_types FROM pg_prepared_statements ORDER BY name\nB ||\nE |0\nS";
    let steps = [
        "Q CREATE TABLE typed(id int)",
        "P s3|SELECT id FROM typed WHERE id = $1\nS",
        "P s4|SELECT 4\nS",
        "Q SET search_path = pg_catalog",
        read,
        "P s5|SELECT 5\nS",
        "Q BEGIN",
        read,
        "Q COMMIT",
        "Q DROP TABLE public.typed",
    ]
    .map(String::from);
    let t = oracle(pg.port(), p.port(), "postgres", "testdb", &[steps.to_vec()]).await;
    for k in [4, 7] {
        assert!(
            t[0][k].contains(&"Row s3|{integer}".to_string()),
            "{:?}",
            t[0][k]
        );
    }
    p.shutdown().await;
}

/// Differential seed 150186: a read of `pg_prepared_statements` in a Parse, on a server
/// that lacks a client's protocol statement parsed in a block after a SET ROLE (a change of
/// its scope, not of its search_path), once the client changed its search_path so that
/// the statement's table is not found. PostgreSQL lists it; pgcarpool parsed it again under
/// the search_path of the day, and the read failed (42P01).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_of_prepared_statements_lists_one_parsed_after_a_set_role() {
    let pg = TempPostgres::start();
    let p = pool_of_one_holding_one_statement(&pg).await;
    let read =
        "SELECT name, array_length(parameter_types, 1) FROM pg_prepared_statements ORDER BY name";
    let steps = [
        "Q CREATE TABLE after_role(id int)".to_string(),
        "Q BEGIN".into(),
        "Q SET ROLE trustuser".into(),
        "P s2|SELECT id FROM after_role WHERE id = $1\nS".into(),
        "Q COMMIT".into(),
        "Q RESET ROLE".into(),
        "P s3|SELECT 3\nS".into(),
        "C S s3\nS".into(),
        "Q SET search_path = pg_catalog".into(),
        format!("P |{read}\nB ||\nD P \nE \nC S \nS"),
        "Q RESET search_path".into(),
        "Q DROP TABLE after_role".into(),
    ];
    let t = oracle(pg.port(), p.port(), "postgres", "testdb", &[steps.to_vec()]).await;
    assert!(t[0][9].contains(&"Row s2|1".to_string()), "{:?}", t[0][9]);
    p.shutdown().await;
}

/// Differential seed 170294: a Bind, in a later transaction, of the unnamed statement
/// `SET bytea_output = escape` (its first run rolled back by an error after it in its
/// pipeline): PostgreSQL sets it for the session. pgcarpool did not read the setting back
/// after a Bind without a Parse, so it fitted its server to the client's old value before
/// the client's next query (after another client's transaction there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_run_again_by_a_bind_of_the_unnamed_statement_stays_with_its_client() {
    let pg = TempPostgres::start();
    let p = pool_of(&pg, 1).await;
    let scripts: Vec<Vec<String>> = (0..4)
        .map(|i| {
            let value = if i % 2 == 0 { "escape" } else { "hex" };
            script(&[
                format!("P |SET bytea_output = {value}\nB ||\nE |0\nP s2|FETCH 2 FROM nosuch\nB |s2|\nE |0\nS"),
                "B ||\nE |0\nS".into(),
                "Q SELECT '\\x01ff'::bytea AS b".into(),
                "Q SELECT '\\x01ff'::bytea AS b".into(),
            ])
        })
        .collect();
    let t = oracle(pg.port(), p.port(), "postgres", "testdb", &scripts).await;
    for (i, c) in t.iter().enumerate() {
        let want = if i % 2 == 0 {
            "Row \\001\\377"
        } else {
            "Row \\x01ff"
        };
        for k in [2, 3] {
            assert!(c[k].contains(&want.to_string()), "client {i}: {:?}", c[k]);
        }
    }
    p.shutdown().await;
}
