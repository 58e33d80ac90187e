//! A session's view of itself, with PostgreSQL as the oracle: the same scripts straight to
//! PostgreSQL and through pgcarpool in transaction mode (many clients over a pool of 2,
//! both protocols) give every client the same rows and errors, also where a session asks
//! about itself (its pid, its termination) and where that ends it.
//!
//! In a step, `{pid}` is the process id the client's BackendKeyData gave it, `{pid:k}`
//! client k's. A step after which the connection closed reads `Closed` last; the step
//! `wait closed` reads what comes until the connection closes. A step's WARNINGs are
//! its last lines (`Warning CODE message`).
mod harness;

use std::time::Duration;

use harness::wire::Wire;
use harness::{Observer, TempPostgres, pool_of, wait_for};

/// Every client's transcript, step by step, in lockstep; a closed client skips its later
/// steps.
async fn transcripts(port: u16, scripts: &[Vec<String>]) -> Vec<Vec<Vec<String>>> {
    let mut conns = Vec::new();
    for _ in scripts {
        conns.push(Some(Wire::connect(port, "postgres", "testdb").await));
    }
    let pids: Vec<i32> = conns.iter().map(|c| c.as_ref().unwrap().pid).collect();
    let mut out = vec![Vec::new(); scripts.len()];
    let steps = scripts.iter().map(Vec::len).max().unwrap_or(0);
    for k in 0..steps {
        for (i, s) in scripts.iter().enumerate() {
            let (Some(step), Some(w)) = (s.get(k), conns[i].as_mut()) else {
                continue;
            };
            let mut step = step.replace("{pid}", &pids[i].to_string());
            for (j, pid) in pids.iter().enumerate() {
                step = step.replace(&format!("{{pid:{j}}}"), &pid.to_string());
            }
            if step == "wait closed" {
                // Told and let go while idle: what came, up to the close.
                let mut t: Vec<String> = w
                    .until_closed()
                    .await
                    .iter()
                    .map(|(tag, body)| match tag {
                        b'E' => {
                            let (code, message) = harness::wire::error_fields(body);
                            format!("Error {code} {message}")
                        }
                        t => format!("{}", *t as char),
                    })
                    .collect();
                t.push("Closed".into());
                out[i].push(t);
                conns[i] = None;
                continue;
            }
            // The WARNINGs of the step go last.
            match w.try_step(&step).await {
                Ok(mut t) => {
                    t.append(&mut w.warnings);
                    out[i].push(t)
                }
                Err(mut t) => {
                    t.append(&mut w.warnings);
                    t.push("Closed".into());
                    out[i].push(t);
                    conns[i] = None;
                }
            }
        }
    }
    out
}

/// The same transcripts straight and through pgcarpool, or a panic at the first difference.
async fn oracle(direct: u16, pooler: u16, scripts: &[Vec<String>]) -> Vec<Vec<Vec<String>>> {
    let want = transcripts(direct, scripts).await;
    let got = transcripts(pooler, scripts).await;
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        for (k, (ws, gs)) in w.iter().zip(g).enumerate() {
            assert_eq!(
                ws, gs,
                "client {i} step {k} differs\n--- step\n{}\n--- PostgreSQL (left) vs pgcarpool (right)",
                scripts[i][k]
            );
        }
        assert_eq!(w.len(), g.len(), "client {i}: steps run");
    }
    got
}

/// The step in the simple protocol (`Q`) for even clients, Parse/Bind/Describe/Execute for
/// odd ones.
fn either(i: usize, sql: &str) -> String {
    if i.is_multiple_of(2) {
        format!("Q {sql}")
    } else {
        format!("P |{sql}\nB ||\nD P \nE \nS")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_pid_is_the_pid_of_the_backend_key_data() {
    let pg = TempPostgres::start();
    let p = pool_of(&pg, 2).await;
    let scripts: Vec<Vec<String>> = (0..8)
        .map(|i| {
            vec![
                either(i, "select pg_backend_pid() = {pid} as mine"),
                either(i, "select pg_catalog.pg_backend_pid() - {pid}"),
                format!(
                    "Q begin\n{}\nQ commit",
                    either(
                        i,
                        "select count(*) from (values (pg_backend_pid())) v(p) where p = {pid}"
                    )
                ),
                // A named statement of the client's own, used again later.
                "P own|select pg_backend_pid() = {pid}\nS".into(),
                "B |own|\nE \nS".into(),
                // Inside a string it is text.
                either(i, "select 'pg_backend_pid()'"),
            ]
        })
        .collect();
    let t = oracle(pg.port(), p.port(), &scripts).await;
    for c in &t {
        assert!(c[0].contains(&"Row t".to_string()), "{:?}", c[0]);
        assert!(c[1].contains(&"Row 0".to_string()), "{:?}", c[1]);
        assert!(c[2].contains(&"Row 1".to_string()), "{:?}", c[2]);
        assert!(c[4].contains(&"Row t".to_string()), "{:?}", c[4]);
    }
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminating_its_own_backend_ends_the_client_as_postgresql_does() {
    let pg = TempPostgres::start();
    let p = pool_of(&pg, 2).await;
    let scripts: Vec<Vec<String>> = (0..8)
        .map(|i| {
            let own = match i % 4 {
                0 => "select pg_terminate_backend(pg_backend_pid())",
                // By the pid its BackendKeyData gave.
                1 => "select pg_terminate_backend({pid})",
                // Inside a block, with a column after it.
                _ => "select pg_catalog.pg_terminate_backend( pg_backend_pid() ), 2",
            };
            // (Inside a block: begun in the same step, so that no client waits for a
            // server another holds in lockstep.)
            let begin = if i % 4 >= 2 { "Q begin\n" } else { "" };
            let own = if i == 7 {
                // As a parameter.
                "P |select pg_terminate_backend($1)\nB ||{pid}\nD P \nE \nS".to_string()
            } else {
                either(i, own)
            };
            vec![
                "Q select 1".into(),
                format!("{begin}{own}"),
                "Q select 2".into(),
            ]
        })
        .collect();
    let t = oracle(pg.port(), p.port(), &scripts).await;
    for c in &t {
        let last = c.last().unwrap();
        assert!(
            last.iter().any(|l| l.starts_with("Error 57P01")) && last.last().unwrap() == "Closed",
            "{last:?}"
        );
    }
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_statements_lists_the_sessions_own() {
    let pg = TempPostgres::start();
    let p = pool_of(&pg, 2).await;
    let list = "select name, statement, from_sql, parameter_types from pg_prepared_statements order by name";
    let scripts: Vec<Vec<String>> = (0..8)
        .map(|i| {
            vec![
                either(i, "select count(*) from pg_prepared_statements"),
                // The same names in every client, for other texts.
                format!("P s1|select {i}::int + $1\nS"),
                format!("Q PREPARE q1(int) AS select $1 + {i}"),
                format!("P s2|select 'client {i}'\nB |s2|\nE \nS"),
                either(i, list),
                either(i, "select p.name, p.from_sql from pg_catalog.pg_prepared_statements p join (values ('s1')) v(n) on v.n = p.name"),
                "Q DEALLOCATE q1".into(),
                format!("Q begin\n{}\nQ commit", either(i, list)),
                "C S s1\nS".into(),
                either(i, "with x as (select 1) select count(*) from x, pg_prepared_statements"),
                // Its own statement reading the view.
                "P own|select name from pg_prepared_statements order by name\nB |own|\nE \nS".into(),
            ]
        })
        .collect();
    let t = oracle(pg.port(), p.port(), &scripts).await;
    for (i, c) in t.iter().enumerate() {
        assert!(c[0].contains(&"Row 0".to_string()), "{:?}", c[0]);
        assert!(
            c[4].contains(&format!("Row s1|select {i}::int + $1|f|{{integer}}")),
            "{:?}",
            c[4]
        );
        assert!(
            c[4].contains(&format!(
                "Row q1|PREPARE q1(int) AS select $1 + {i}|t|{{integer}}"
            )),
            "{:?}",
            c[4]
        );
        assert!(c[5].contains(&"Row s1|f".to_string()), "{:?}", c[5]);
        assert!(c[9].contains(&"Row 1".to_string()), "{:?}", c[9]);
        assert!(c[10].contains(&"Row own".to_string()), "{:?}", c[10]);
    }
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminating_another_clients_pid_ends_that_client() {
    let pg = TempPostgres::start();
    let p = pool_of(&pg, 2).await;
    // Even clients terminate the next one, by the pid its BackendKeyData gave it.
    let scripts: Vec<Vec<String>> = (0..8)
        .map(|i| {
            if i % 2 == 0 {
                vec![
                    "Q select 1".into(),
                    if i % 4 == 0 {
                        either(
                            i,
                            &format!("select pg_terminate_backend({{pid:{}}})", i + 1),
                        )
                    } else {
                        // The pid as a parameter, as drivers send it.
                        format!(
                            "P |select pg_terminate_backend($1::int)\nB ||{{pid:{}}}\nD P \nE \nS",
                            i + 1
                        )
                    },
                    "Q select 2".into(),
                ]
            } else {
                // (Terminated in this step, by client i - 1, which comes first.)
                vec!["Q select 1".into(), "wait closed".into()]
            }
        })
        .collect();
    let t = oracle(pg.port(), p.port(), &scripts).await;
    for (i, c) in t.iter().enumerate() {
        if i % 2 == 0 {
            assert!(c[1].contains(&"Row t".to_string()), "{:?}", c[1]);
        } else {
            assert!(
                c[1].iter().any(|l| l.starts_with("Error 57P01")),
                "{:?}",
                c[1]
            );
        }
    }
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminating_clients_by_pids_the_query_computes_ends_them() {
    let pg = TempPostgres::start();
    let p = pool_of(&pg, 2).await;
    // Client 0 ends clients 1 to 3 as pgx's tests do, by an array parameter the query
    // unnests (2147483647 names no backend: a WARNING and false); client 4 ends 5 and 6
    // by pids of a subquery (simple protocol, with warnings off); client 7 ends itself by a scalar subquery
    // of its pid, client 8 ends itself among others (client 9, a pid that is no one's).
    // (In a transaction block rolled back after: the signals stay sent.)
    let pgx = "Q begin\nP |select pg_terminate_backend(n) from unnest($1::int[]) n\n\
               B ||{{pid:1},{pid:2},{pid:3},2147483647}\nD P \nE \nS\nQ rollback";
    let scripts: Vec<Vec<String>> = (0..10)
        .map(|i| {
            let kill = match i {
                0 => pgx.to_string(),
                4 => "Q select pg_terminate_backend(p) as gone, p = {pid:5} as first \
                      from (select {pid:5} as p union all select {pid:6}) s"
                    .into(),
                7 => "Q select 1, pg_terminate_backend((select {pid}))".into(),
                8 => "P |select pg_catalog.pg_terminate_backend(v) from (values ({pid:9}), \
                      (2147483647), ({pid})) t(v)\nB ||\nD P \nE \nS"
                    .into(),
                _ => "wait closed".into(),
            };
            if i == 4 {
                // Warnings off: the marks still reach pgcarpool, the setting stays.
                return vec![
                    "Q set client_min_messages = error".into(),
                    kill,
                    "Q show client_min_messages".into(),
                ];
            }
            vec!["Q select 1".into(), kill, "Q select 2".into()]
        })
        .collect();
    let t = oracle(pg.port(), p.port(), &scripts).await;
    assert_eq!(
        t[0][1],
        [
            "Complete BEGIN",
            "Ready T",
            "ParseComplete",
            "BindComplete",
            "Columns pg_terminate_backend",
            "Row t",
            "Row t",
            "Row t",
            "Row f",
            "Complete SELECT 4",
            "Ready T",
            "Complete ROLLBACK",
            "Ready I",
            "Warning 01000 PID 2147483647 is not a PostgreSQL backend process"
        ]
    );
    assert!(t[4][1].contains(&"Row t|t".to_string()), "{:?}", t[4][1]);
    assert!(t[4][1].contains(&"Row t|f".to_string()), "{:?}", t[4][1]);
    for c in [1, 2, 3, 5, 6, 9] {
        assert!(
            t[c][1].iter().any(|l| l.starts_with("Error 57P01")) && t[c].len() == 2,
            "client {c}: {:?}",
            t[c]
        );
    }
    for c in [7, 8] {
        assert!(
            t[c][1].iter().any(|l| l.starts_with("Error 57P01")) && t[c].len() == 2,
            "client {c}: {:?}",
            t[c]
        );
    }
    assert!(t[0][2].contains(&"Row 2".to_string()), "{:?}", t[0][2]);
    assert!(t[4][2].contains(&"Row error".to_string()), "{:?}", t[4][2]);
    p.shutdown().await;
}

/// How a canceller gives the pid: in the text, as a parameter, computed by the query.
#[derive(Clone, Copy, Debug)]
enum PidForm {
    Literal,
    Parameter,
    Computed,
}

/// Client 0 runs `pg_sleep`; client 1 cancels it by the pid client 0 was given: the
/// transcripts of both, straight to PostgreSQL or through `port`.
async fn cancel_by_pid(port: u16, obs: &Observer, form: PidForm) -> (Vec<String>, Vec<String>) {
    let mut sleeper = Wire::connect(port, "postgres", "testdb").await;
    let mut canceller = Wire::connect(port, "postgres", "testdb").await;
    let pid = sleeper.pid;
    let run = tokio::spawn(async move { sleeper.step("Q select 'sleeper', pg_sleep(30)").await });
    wait_for(
        "the sleeper's query runs",
        Duration::from_secs(20),
        || async {
            obs.count("query like '%''sleeper''%' and state = 'active'", &[])
                .await
                == 1
        },
    )
    .await;
    let step = match form {
        // The pid as a parameter, as drivers send it.
        PidForm::Parameter => format!("P |select pg_cancel_backend($1)\nB ||{pid}\nD P \nE \nS"),
        PidForm::Literal => format!("Q select pg_cancel_backend({pid})"),
        PidForm::Computed => format!(
            "P |select pg_cancel_backend(n) from unnest($1::int[]) n\nB ||{{{pid},1}}\nD P \nE \nS"
        ),
    };
    let mut cancelled = canceller.step(&step).await;
    cancelled.append(&mut canceller.warnings);
    (run.await.unwrap(), cancelled)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_another_clients_pid_cancels_its_query() {
    let pg = TempPostgres::start();
    let p = pool_of(&pg, 2).await;
    let obs = Observer::new(&pg).await;
    for form in [PidForm::Literal, PidForm::Parameter, PidForm::Computed] {
        let want = cancel_by_pid(pg.port(), &obs, form).await;
        let got = cancel_by_pid(p.port(), &obs, form).await;
        assert_eq!(want, got, "PostgreSQL (left) vs pgcarpool (right)");
        assert!(
            got.0.iter().any(|l| l.starts_with("Error 57014")),
            "{got:?}"
        );
        assert!(got.1.contains(&"Row t".to_string()), "{got:?}");
    }
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activity_shows_the_clients_own_row_under_its_pid() {
    let pg = TempPostgres::start();
    let p = pool_of(&pg, 2).await;
    let scripts: Vec<Vec<String>> = (0..8)
        .map(|i| {
            vec![
                either(
                    i,
                    "select count(*), bool_and(pid = {pid}), bool_and(state = 'active') \
                     from pg_stat_activity where pid = pg_backend_pid()",
                ),
                // Its query as the client wrote it.
                either(
                    i,
                    "select query, usename, datname, backend_type from pg_catalog.pg_stat_activity where pid = pg_backend_pid()",
                ),
                format!(
                    "Q begin\n{}\nQ commit",
                    either(
                        i,
                        "select count(*) from pg_stat_activity a join pg_locks l using (pid) \
                         where a.pid = pg_backend_pid() and l.locktype = 'virtualxid'"
                    )
                ),
                // A statement of its own, run again after other transactions (on
                // whichever server runs it then).
                "P act|select count(*) from pg_stat_activity where pid = pg_backend_pid()\nS".into(),
                "B |act|\nE \nS".into(),
                "Q select 1".into(),
                "B |act|\nE \nS".into(),
                // Another server's pid is not this session's.
                either(i, "select count(*) from pg_stat_activity where pid = {pid} and pid <> pg_backend_pid()"),
            ]
        })
        .collect();
    let t = oracle(pg.port(), p.port(), &scripts).await;
    for c in &t {
        assert!(c[0].contains(&"Row 1|t|t".to_string()), "{:?}", c[0]);
        assert!(
            c[1].iter()
                .any(|l| l.starts_with("Row select query, usename")),
            "{:?}",
            c[1]
        );
        assert!(c[2].contains(&"Row 1".to_string()), "{:?}", c[2]);
        assert!(c[4].contains(&"Row 1".to_string()), "{:?}", c[4]);
        assert!(c[6].contains(&"Row 1".to_string()), "{:?}", c[6]);
        assert!(c[7].contains(&"Row 0".to_string()), "{:?}", c[7]);
    }
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activity_shows_another_clients_transaction_under_its_pid() {
    let pg = TempPostgres::start();
    let p = pool_of(&pg, 2).await;
    let look = "select state, query from pg_stat_activity where pid = {pid:0}";
    let scripts: Vec<Vec<String>> = vec![
        vec![
            "Q begin".into(),
            "Q select 'zero'".into(),
            "Q select 'zero again'".into(),
            "Q commit".into(),
        ],
        vec![
            "Q select 1".into(),
            format!("Q {look}"),
            format!("P |{look}\nB ||\nE \nS"),
            "Q select 1".into(),
        ],
    ];
    let t = oracle(pg.port(), p.port(), &scripts).await;
    assert!(
        t[1][1].contains(&"Row idle in transaction|select 'zero'".to_string()),
        "{:?}",
        t[1][1]
    );
    assert!(
        t[1][2].contains(&"Row idle in transaction|select 'zero again'".to_string()),
        "{:?}",
        t[1][2]
    );
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_query_of_the_view_sees_the_statements_of_when_it_runs() {
    let pg = TempPostgres::start();
    let p = pool_of(&pg, 2).await;
    let scripts: Vec<Vec<String>> = (0..8)
        .map(|i| {
            vec![
                "P count|select count(*) from pg_prepared_statements where statement = $1\nS"
                    .into(),
                format!("P s{i}|select 42\nS"),
                "B |count|select 42\nE \nS".into(),
                format!("C S s{i}\nS"),
                // Run again after the statement went (pgx's statement cache does this).
                "B |count|select 42\nE \nS".into(),
                "Q select 1".into(),
                "B |count|select count(*) from pg_prepared_statements where statement = $1\nE \nS"
                    .into(),
            ]
        })
        .collect();
    let t = oracle(pg.port(), p.port(), &scripts).await;
    for c in &t {
        assert!(c[2].contains(&"Row 1".to_string()), "{:?}", c[2]);
        assert!(c[4].contains(&"Row 0".to_string()), "{:?}", c[4]);
        assert!(c[6].contains(&"Row 1".to_string()), "{:?}", c[6]);
    }
    p.shutdown().await;
}

/// In a failed block a query that reads `pg_prepared_statements` fails once (25P02), as
/// on PostgreSQL, also on a server that lacks the client's statements: none is prepared
/// first (differential seed 7: the round that prepared it failed too, and the client got
/// two errors).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_view_read_in_a_failed_block_fails_once() {
    let pg = TempPostgres::start();
    let p = harness::transaction_pooler(&pg)
        .setting("auth_type", "trust")
        .setting("default_pool_size", "1")
        .setting("max_prepared_statements", "1")
        .start()
        .await;
    let scripts: Vec<Vec<String>> = vec![
        vec![
            "P s1|select 1\nS".into(),
            "P s3|select 3\nS".into(),
            "Q begin".into(),
            "Q selec".into(),
            "Q select count(*) from pg_prepared_statements".into(),
            "Q rollback".into(),
            "Q select name from pg_prepared_statements order by name".into(),
        ],
        // The one server makes room for this one: it lacks client 0's statements from now
        // on.
        vec!["Q select 0".into(), "P s2|select 2\nS".into()],
    ];
    let t = oracle(pg.port(), p.port(), &scripts).await;
    assert_eq!(
        t[0][4],
        [
            "Error 25P02 current transaction is aborted, commands ignored until end of transaction block",
            "Ready E"
        ]
    );
    assert!(t[0][6].contains(&"Row s3".to_string()), "{:?}", t[0][6]);
    p.shutdown().await;
}
