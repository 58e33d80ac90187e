//! The pgcarpool binary as PgBouncer is run: config errors with file:line, SIGHUP reload,
//! the shutdown and pause signals, `-d`, `-V` and `-h`. Each test starts its own child
//! process on a free port and stops it by its PID.
mod harness;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use harness::process::{BIN, PoolerProcess, ProcessDir};
use harness::{
    Observer, TempPostgres, TestPooler, TestPoolerBuilder, cl_waiting, console_value, dsn_for,
    eventually, try_connect, wait_for,
};

/// A pgbouncer.ini that cannot start (written as is), for the tests of refused starts.
fn refused_ini(extra: &str) -> ProcessDir {
    ProcessDir::raw(&format!(
        "[databases]\n* = host=127.0.0.1 port=1\n\n[pgbouncer]\n\
         listen_addr = 127.0.0.1\nlisten_port = 0\nunix_socket_dir =\nauth_type = trust\n{extra}"
    ))
}

type Query =
    tokio::task::JoinHandle<Result<Vec<tokio_postgres::SimpleQueryMessage>, tokio_postgres::Error>>;

/// After SIGUSR1: wait until the console shows testdb paused, then start a query on `c`
/// and wait until SHOW POOLS shows it waiting; returns it, still waiting.
async fn query_held_back(c: &Arc<tokio_postgres::Client>, admin: &tokio_postgres::Client) -> Query {
    wait_for(
        "SHOW DATABASES: testdb paused",
        Duration::from_secs(10),
        || async {
            console_value(admin, "DATABASES", &[("name", "testdb")], "paused")
                .await
                .as_deref()
                == Some("1")
        },
    )
    .await;
    let c2 = c.clone();
    let q = tokio::spawn(async move { c2.simple_query("select 'after pause'").await });
    wait_for(
        "the query waiting in SHOW POOLS",
        Duration::from_secs(10),
        || async { cl_waiting(admin, "testdb", "md5user").await == 1 },
    )
    .await;
    assert!(!q.is_finished(), "a query ran while paused");
    q
}

#[test]
fn bad_config_line_is_reported_with_file_and_line() {
    // Line 9: the fifth line of [pgbouncer].
    let dir = refused_ini("default_pool_size = lots\n");
    let out = dir.run(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted a bad config: {stderr}");
    assert!(
        stderr.contains("pgbouncer.ini:9: default_pool_size"),
        "no file:line in the error: {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_changes_the_pool_size_live() {
    let pg = TempPostgres::start();
    let mut p = PoolerProcess::start(
        TestPooler::builder(&pg)
            .settings(&[("pool_mode", "transaction"), ("default_pool_size", "2")]),
    )
    .await;
    let monitor = Observer::new(&pg).await;
    // Four clients each open a transaction: two get servers, two wait.
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let c = p.connect("md5user").await;
        tasks.push(tokio::spawn(async move {
            c.simple_query("begin; select 1").await.unwrap();
            c
        }));
    }
    let done = |tasks: &Vec<tokio::task::JoinHandle<tokio_postgres::Client>>| {
        tasks.iter().filter(|t| t.is_finished()).count()
    };
    assert!(
        eventually(Duration::from_secs(10), || async {
            monitor.backends("md5user").await == 2 && done(&tasks) == 2
        })
        .await,
        "expected 2 backends and 2 clients in transactions"
    );
    p.dir.rewrite(|_| {
        TestPooler::builder(&pg)
            .settings(&[("pool_mode", "transaction"), ("default_pool_size", "4")])
    });
    p.signal(libc::SIGHUP);
    let grew = eventually(Duration::from_secs(5), || async {
        monitor.backends("md5user").await == 4 && done(&tasks) == 4
    })
    .await;
    assert!(
        grew,
        "after SIGHUP: {} backends, {} clients served",
        monitor.backends("md5user").await,
        done(&tasks)
    );
    // The clients connected before the reload keep working.
    for t in tasks {
        let c = t.await.unwrap();
        c.simple_query("select 2").await.unwrap();
        c.simple_query("commit").await.unwrap();
        c.simple_query("select 3").await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_waits_for_clients_to_leave() {
    let pg = TempPostgres::start();
    let mut p =
        PoolerProcess::start(TestPooler::builder(&pg).settings(&[("pool_mode", "session")])).await;
    let c = p.connect("md5user").await;
    c.simple_query("select 1").await.unwrap();
    p.signal(libc::SIGTERM);
    assert!(p.stops_accepting().await, "still accepting after SIGTERM");
    // Still running and serving the connected client.
    c.simple_query("select 2").await.unwrap();
    assert!(p.running(), "exited with a client connected");
    drop(c);
    let status = p.exited_within(Duration::from_secs(5)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "did not exit cleanly after the last client left: {status:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_waits_for_servers_to_be_released() {
    let pg = TempPostgres::start();
    let mut p =
        PoolerProcess::start(TestPooler::builder(&pg).settings(&[("pool_mode", "transaction")]))
            .await;
    let c = p.connect("md5user").await;
    let idle = p.connect("md5user").await;
    c.simple_query("begin").await.unwrap();
    // A second server, idle in the pool: a new transaction would find it at once.
    idle.simple_query("select 0").await.unwrap();
    p.signal(libc::SIGINT);
    assert!(p.stops_accepting().await, "still accepting after SIGINT");
    // The transaction in progress may finish.
    c.simple_query("select 1").await.unwrap();
    // A client between transactions may not start one: let go, as PgBouncer.
    let e = idle
        .simple_query("select 1")
        .await
        .expect_err("a new transaction during SHUTDOWN WAIT_FOR_SERVERS");
    let db = e.as_db_error().expect("an ErrorResponse");
    assert_eq!(
        (db.code().code(), db.message()),
        ("08P01", "server shutting down")
    );
    assert!(
        harness::eventually(Duration::from_secs(5), || async {
            p.log().contains("closing because: server shutting down")
        })
        .await,
        "{}",
        p.log()
    );
    assert!(p.running(), "exited while a server was in use");
    c.simple_query("commit").await.unwrap();
    // Once the server is released it exits, though the client is still connected.
    let status = p.exited_within(Duration::from_secs(5)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "did not exit after the server was released: {status:?}"
    );
    drop(c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigquit_exits_at_once() {
    let pg = TempPostgres::start();
    let mut p =
        PoolerProcess::start(TestPooler::builder(&pg).settings(&[("pool_mode", "transaction")]))
            .await;
    let c = p.connect("md5user").await;
    c.simple_query("begin").await.unwrap();
    p.signal(libc::SIGQUIT);
    let status = p.exited_within(Duration::from_secs(2)).await;
    assert!(
        status.is_some(),
        "still running 2 s after SIGQUIT with a client in a transaction"
    );
    drop(c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigusr1_pauses_and_sigusr2_resumes() {
    let pg = TempPostgres::start();
    let p =
        PoolerProcess::start(TestPooler::builder(&pg).settings(&[("pool_mode", "transaction")]))
            .await;
    let c = Arc::new(p.connect("md5user").await);
    c.simple_query("select 1").await.unwrap();
    let admin = p.console().await;
    p.signal(libc::SIGUSR1);
    // Once the pause is in force, a new query waits.
    let mut waiting = query_held_back(&c, &admin).await;
    assert!(!waiting.is_finished());
    p.signal(libc::SIGUSR2);
    let resumed = tokio::time::timeout(Duration::from_secs(2), &mut waiting)
        .await
        .expect("the waiting query did not run within 2 s of SIGUSR2")
        .unwrap();
    resumed.expect("query after resume");
    c.simple_query("select 2").await.unwrap();
}

#[test]
fn dash_capital_v_prints_the_version() {
    let out = Command::new(BIN).arg("-V").output().unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(env!("CARGO_PKG_VERSION")),
        "no version in: {stdout}"
    );
}

#[test]
fn dash_h_prints_usage() {
    let out = Command::new(BIN).arg("-h").output().unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("Usage") && stdout.contains("-d") && stdout.contains("-R"),
        "not a usage text: {stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_shrinking_the_pool_closes_servers_beyond_the_new_size() {
    let pg = TempPostgres::start();
    let mut p = PoolerProcess::start(
        TestPooler::builder(&pg)
            .settings(&[("pool_mode", "transaction"), ("default_pool_size", "4")]),
    )
    .await;
    let monitor = Observer::new(&pg).await;
    let mut clients = Vec::new();
    for _ in 0..4 {
        let c = p.connect("md5user").await;
        c.simple_query("begin; select 1").await.unwrap();
        clients.push(c);
    }
    assert_eq!(monitor.backends("md5user").await, 4);
    // Two servers go back idle before the reload, two are still in use.
    clients[0].simple_query("commit").await.unwrap();
    clients[1].simple_query("commit").await.unwrap();
    p.dir.rewrite(|_| {
        TestPooler::builder(&pg)
            .settings(&[("pool_mode", "transaction"), ("default_pool_size", "1")])
    });
    p.signal(libc::SIGHUP);
    clients[2].simple_query("commit").await.unwrap();
    clients[3].simple_query("commit").await.unwrap();
    let shrunk = eventually(Duration::from_secs(5), || async {
        monitor.backends("md5user").await == 1
    })
    .await;
    assert!(
        shrunk,
        "after SIGHUP to a pool of 1: {} backends",
        monitor.backends("md5user").await
    );
    for c in &clients {
        c.simple_query("select 2").await.unwrap();
    }
    assert_eq!(monitor.backends("md5user").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_with_a_bad_config_keeps_the_old_one() {
    let pg = TempPostgres::start();
    let mut p = PoolerProcess::start(
        TestPooler::builder(&pg)
            .settings(&[("pool_mode", "transaction"), ("default_pool_size", "2")]),
    )
    .await;
    let monitor = Observer::new(&pg).await;
    let c = p.connect("md5user").await;
    p.dir.rewrite(|_| {
        TestPooler::builder(&pg)
            .settings(&[("pool_mode", "transaction"), ("default_pool_size", "many")])
    });
    p.signal(libc::SIGHUP);
    let log_path = p.dir.path().join("stderr.log");
    let logged = eventually(Duration::from_secs(5), || async {
        std::fs::read_to_string(&log_path)
            .unwrap_or_default()
            .contains("keeping the old configuration")
    })
    .await;
    assert!(logged, "the failed reload was not logged:\n{}", p.log());
    assert!(p.running());
    // Still the old pool size of 2: three clients in transactions use only two servers.
    let others = [p.connect("md5user").await, p.connect("md5user").await];
    c.simple_query("begin; select 1").await.unwrap();
    others[0].simple_query("begin; select 1").await.unwrap();
    let third = tokio::spawn({
        let dsn = p.dsn("md5user");
        async move {
            let c3 = try_connect(&dsn).await.unwrap();
            c3.simple_query("select 1").await.unwrap();
        }
    });
    // The third waits (SHOW POOLS says so) while two servers serve the other two.
    let admin = try_connect(&dsn_for(p.port(), "postgres", "pgbouncer"))
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(5), || async {
            cl_waiting(&admin, "testdb", "md5user").await == 1
        })
        .await,
        "the third client did not wait: the bad pool size was applied?\n{}",
        p.log()
    );
    assert_eq!(monitor.backends("md5user").await, 2);
    assert!(!third.is_finished());
    c.simple_query("commit").await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), third)
        .await
        .expect("the waiting client was not served")
        .unwrap();
    others[0].simple_query("commit").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_sigterm_exits_at_once() {
    let pg = TempPostgres::start();
    let mut p =
        PoolerProcess::start(TestPooler::builder(&pg).settings(&[("pool_mode", "session")])).await;
    let c = p.connect("md5user").await;
    c.simple_query("select 1").await.unwrap();
    p.signal(libc::SIGTERM);
    assert!(p.stops_accepting().await, "still accepting after SIGTERM");
    c.simple_query("select 2").await.unwrap();
    p.signal(libc::SIGTERM);
    let status = p.exited_within(Duration::from_secs(2)).await;
    assert!(
        status.is_some(),
        "still running 2 s after a second SIGTERM with a client connected"
    );
    drop(c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigusr1_lets_open_transactions_finish() {
    let pg = TempPostgres::start();
    let p =
        PoolerProcess::start(TestPooler::builder(&pg).settings(&[("pool_mode", "transaction")]))
            .await;
    let in_tx = p.connect("md5user").await;
    let other = Arc::new(p.connect("md5user").await);
    in_tx.simple_query("begin; select 1").await.unwrap();
    other.simple_query("select 1").await.unwrap();
    let admin = p.console().await;
    p.signal(libc::SIGUSR1);
    // Wait until the pause holds new work back.
    let mut waiting = query_held_back(&other, &admin).await;
    // The transaction that holds a server goes on and ends.
    in_tx.simple_query("select 2").await.unwrap();
    in_tx.simple_query("commit").await.unwrap();
    assert!(!waiting.is_finished(), "ran while paused");
    p.signal(libc::SIGUSR2);
    tokio::time::timeout(Duration::from_secs(2), &mut waiting)
        .await
        .expect("the waiting query did not run after SIGUSR2")
        .unwrap()
        .unwrap();
}

/// The test config with database `app` pointing at database `target` of `pg`, one server.
fn alias_spec(pg: &TempPostgres, target: &str) -> TestPoolerBuilder {
    TestPooler::builder(pg)
        .settings(&[("pool_mode", "transaction"), ("default_pool_size", "1")])
        .database(
            "app",
            &format!("host=127.0.0.1 port={} dbname={target}", pg.port()),
        )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_retargeting_a_database_retires_servers_in_use() {
    let pg = TempPostgres::start();
    let mut p = PoolerProcess::start(alias_spec(&pg, "testdb")).await;
    let dsn = dsn_for(p.port(), "md5user", "app");
    let holder = try_connect(&dsn).await.unwrap();
    holder.simple_query("begin; select 1").await.unwrap();
    // While the pool's only server is in use, `app` is pointed at another database.
    p.dir.rewrite(|_| alias_spec(&pg, "postgres"));
    p.signal(libc::SIGHUP);
    let log_path = p.dir.path().join("stderr.log");
    let reloaded = eventually(Duration::from_secs(5), || async {
        std::fs::read_to_string(&log_path)
            .unwrap_or_default()
            .contains("configuration reloaded")
    })
    .await;
    assert!(reloaded, "no reload logged:\n{}", p.log());
    holder.simple_query("commit").await.unwrap();
    // Every transaction from now on runs on the new database.
    for _ in 0..3 {
        let c = try_connect(&dsn).await.unwrap();
        let row = c
            .query_one("select current_database()::text", &[])
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>(0), "postgres");
    }
    let row = holder
        .query_one("select current_database()::text", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "postgres");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_rereads_the_auth_file() {
    let pg = TempPostgres::start();
    pg.psql("create role newuser login password 'newpass'");
    let p =
        PoolerProcess::start(TestPooler::builder(&pg).settings(&[("pool_mode", "transaction")]))
            .await;
    let dsn = harness::dsn_with_password(p.port(), "newuser", Some("newpass"), "testdb");
    let refused = try_connect(&dsn)
        .await
        .expect_err("a user missing from auth_file logged in");
    assert_eq!(harness::sqlstate(&refused), Some("28P01"), "{refused:?}");
    let userlist = p.dir.path().join("userlist.txt");
    let mut text = std::fs::read_to_string(&userlist).unwrap();
    text.push_str("\"newuser\" \"newpass\"\n");
    std::fs::write(&userlist, text).unwrap();
    p.signal(libc::SIGHUP);
    let admitted = eventually(Duration::from_secs(5), || async {
        try_connect(&dsn).await.is_ok()
    })
    .await;
    assert!(admitted, "newuser still refused after SIGHUP:\n{}", p.log());
    let c = try_connect(&dsn).await.unwrap();
    let row = c.query_one("select current_user::text", &[]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), "newuser");
}

/// A SCRAM secret replaced in auth_file: after SIGHUP logins are checked against the new
/// one only (what an exchange keeps of a verifier goes with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_with_a_new_scram_secret_checks_logins_against_it() {
    let pg = TempPostgres::start();
    let set = |password: &str| {
        pg.psql(&format!(
            "set password_encryption = 'scram-sha-256'; \
             alter role scramrot password '{password}'; \
             select rolpassword from pg_authid where rolname = 'scramrot'"
        ))
    };
    pg.psql("create role scramrot login");
    let p =
        PoolerProcess::start(TestPooler::builder(&pg).settings(&[("pool_mode", "transaction")]))
            .await;
    let userlist = p.dir.path().join("userlist.txt");
    let original = std::fs::read_to_string(&userlist).unwrap();
    let old_dsn = harness::dsn_with_password(p.port(), "scramrot", Some("before"), "testdb");
    let new_dsn = harness::dsn_with_password(p.port(), "scramrot", Some("after"), "testdb");
    for (password, dsn) in [("before", &old_dsn), ("after", &new_dsn)] {
        let secret = set(password).lines().last().unwrap().to_string();
        std::fs::write(&userlist, format!("{original}\"scramrot\" \"{secret}\"\n")).unwrap();
        p.signal(libc::SIGHUP);
        let admitted = eventually(Duration::from_secs(5), || async {
            try_connect(dsn).await.is_ok()
        })
        .await;
        assert!(admitted, "{dsn} refused:\n{}", p.log());
    }
    let refused = try_connect(&old_dsn)
        .await
        .expect_err("the old password still logs in");
    assert_eq!(harness::sqlstate(&refused), Some("28P01"), "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_after_a_password_change_logs_in_to_new_servers_with_it() {
    let pg = TempPostgres::start();
    pg.psql("create role rotating login password 'before'");
    let p =
        PoolerProcess::start(TestPooler::builder(&pg).settings(&[("pool_mode", "transaction")]))
            .await;
    let userlist = p.dir.path().join("userlist.txt");
    let original = std::fs::read_to_string(&userlist).unwrap();
    std::fs::write(&userlist, format!("{original}\"rotating\" \"before\"\n")).unwrap();
    p.signal(libc::SIGHUP);
    let old_dsn = harness::dsn_with_password(p.port(), "rotating", Some("before"), "testdb");
    assert!(
        eventually(Duration::from_secs(5), || async {
            match try_connect(&old_dsn).await {
                Ok(c) => c.simple_query("select 1").await.is_ok(),
                Err(_) => false,
            }
        })
        .await,
        "rotating never logged in:\n{}",
        p.log()
    );
    // The password changes in PostgreSQL and in auth_file; the pool's server goes away.
    pg.psql("alter role rotating password 'after'");
    std::fs::write(&userlist, format!("{original}\"rotating\" \"after\"\n")).unwrap();
    p.signal(libc::SIGHUP);
    pg.psql("select pg_terminate_backend(pid) from pg_stat_activity where usename = 'rotating'");
    let new_dsn = harness::dsn_with_password(p.port(), "rotating", Some("after"), "testdb");
    let last = std::sync::Mutex::new(String::new());
    let ok = eventually(Duration::from_secs(5), || {
        let new_dsn = new_dsn.clone();
        let last = &last;
        async move {
            match try_connect(&new_dsn).await {
                Ok(c) => match c.simple_query("select 1").await {
                    Ok(_) => true,
                    Err(e) => {
                        *last.lock().unwrap() = format!("query: {e:?}");
                        false
                    }
                },
                Err(e) => {
                    *last.lock().unwrap() = format!("connect: {e:?}");
                    false
                }
            }
        }
    })
    .await;
    assert!(
        ok,
        "new password never worked: {}\n{}",
        last.lock().unwrap(),
        p.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_and_console_share_one_pause() {
    let pg = TempPostgres::start();
    let p =
        PoolerProcess::start(TestPooler::builder(&pg).settings(&[("pool_mode", "transaction")]))
            .await;
    let admin = p.console().await;
    // SIGUSR1 pauses pools that do not exist yet: a first client of `postgres` waits.
    p.signal(libc::SIGUSR1);
    harness::wait_for(
        "SHOW DATABASES to say paused",
        Duration::from_secs(5),
        || async {
            harness::console_value(&admin, "DATABASES", &[("name", "pgbouncer")], "paused")
                .await
                .is_some()
                && paused_all(&admin).await
        },
    )
    .await;
    let late = tokio::spawn({
        let dsn = dsn_for(p.port(), "md5user", "postgres");
        async move {
            let c = try_connect(&dsn).await.unwrap();
            c.simple_query("select 1").await.map(drop)
        }
    });
    // Its pool is made, and opens no server while paused (a window in which nothing
    // may happen: a pool made unpaused opens one at once).
    harness::wait_for("the new pool", Duration::from_secs(5), || async {
        harness::console_value(&admin, "POOLS", &[("database", "postgres")], "user")
            .await
            .is_some()
    })
    .await;
    let obs = harness::Observer::new(&pg).await;
    let window = Duration::from_millis(500);
    harness::assert_stays(
        "no server opened and nobody served while paused",
        window,
        || async { obs.backends_in_db("postgres").await == 0 && !late.is_finished() },
    )
    .await;
    // The console's RESUME ends a SIGUSR1 pause…
    admin.simple_query("RESUME").await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), late)
        .await
        .expect("still waiting after RESUME")
        .unwrap()
        .unwrap();
    // …and SIGUSR2 ends a console PAUSE.
    let c = p.connect("md5user").await;
    admin.simple_query("PAUSE").await.unwrap();
    let q = tokio::spawn(async move { c.simple_query("select 2").await.map(drop) });
    harness::wait_for("the query to wait", Duration::from_secs(5), || async {
        harness::cl_waiting(&admin, "testdb", "md5user").await == 1
    })
    .await;
    p.signal(libc::SIGUSR2);
    tokio::time::timeout(Duration::from_secs(5), q)
        .await
        .expect("still waiting after SIGUSR2")
        .unwrap()
        .unwrap();
}

/// Every database in SHOW DATABASES but the console says paused.
async fn paused_all(admin: &tokio_postgres::Client) -> bool {
    let msgs = admin.simple_query("SHOW DATABASES").await.unwrap();
    msgs.iter().all(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => {
            r.get("name") == Some("pgbouncer") || r.get("paused") == Some("1")
        }
        _ => true,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_a_shutdown_resume_is_refused_sigusr2_ignored_and_a_second_sigint_exits() {
    let pg = TempPostgres::start();
    let mut p =
        PoolerProcess::start(TestPooler::builder(&pg).settings(&[("pool_mode", "session")])).await;
    let admin = p.console().await;
    let c = p.connect("md5user").await;
    c.simple_query("select 1").await.unwrap();
    p.signal(libc::SIGINT);
    assert!(p.stops_accepting().await, "still accepting after SIGINT");
    // RESUME would undo the shutdown's pause: refused with PgBouncer's words.
    let e = admin
        .simple_query("RESUME")
        .await
        .expect_err("RESUME during a shutdown");
    let db = e.as_db_error().expect("an ErrorResponse");
    assert_eq!(
        (db.code().code(), db.message()),
        ("08P01", "pooler is shutting down")
    );
    p.signal(libc::SIGUSR2);
    assert!(
        harness::eventually(Duration::from_secs(5), || async {
            p.log()
                .contains("got SIGUSR2 while shutting down, ignoring")
        })
        .await,
        "{}",
        p.log()
    );
    assert!(p.running(), "SIGUSR2 ended the shutdown");
    // The session client holds its server: SIGINT waits, a second SIGINT exits.
    p.signal(libc::SIGINT);
    let status = p.exited_within(Duration::from_secs(5)).await;
    assert!(status.is_some(), "still running after a second SIGINT");
    assert!(
        p.log()
            .contains("got SIGINT while shutting down, fast exit")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_shutdown_keeps_the_unix_socket_for_the_console() {
    let pg = TempPostgres::start();
    let dir = harness::process::ProcessDir::new(
        TestPooler::builder(&pg).settings(&[("pool_mode", "session"), ("listen_port", "5497")]),
    );
    let sockets = dir.path().to_path_buf();
    let mut dir = dir;
    dir.rewrite(|b| b.setting("unix_socket_dir", &sockets.to_string_lossy()));
    let mut p = PoolerProcess::start_in(dir, &[]).await;
    let over_unix = |user: &str, db: &str| {
        format!(
            "host={} port=5497 user={user} password={} dbname={db}",
            sockets.display(),
            harness::password_of(user).unwrap()
        )
    };
    let c = p.connect("md5user").await;
    c.simple_query("select 1").await.unwrap();
    let admin = p.console().await;
    admin
        .simple_query("SHUTDOWN WAIT_FOR_CLIENTS")
        .await
        .unwrap();
    assert!(p.stops_accepting().await, "TCP still accepting");
    // The Unix socket still takes the console, not new pool clients.
    let console = try_connect(&over_unix("postgres", "pgbouncer"))
        .await
        .expect("the console over the Unix socket during the shutdown");
    console.simple_query("SHOW VERSION").await.unwrap();
    let e = try_connect(&over_unix("md5user", "testdb"))
        .await
        .expect_err("a new pool client during the shutdown");
    assert_eq!(
        e.as_db_error().map(|d| d.message()),
        Some("pooler is shutting down"),
        "{e:?}"
    );
    // The connected client is still served; when every client has left, it exits.
    c.simple_query("select 2").await.unwrap();
    assert!(p.running());
    drop((c, admin, console));
    let status = p.exited_within(Duration::from_secs(10)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{}",
        p.log()
    );
    assert!(
        !sockets.join(".s.PGSQL.5497").exists(),
        "the socket file stayed"
    );
}
