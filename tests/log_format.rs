//! The log as PgBouncer writes it (`log_format = pgbouncer`, the default): operators' greps,
//! PgBouncer's own test suite and pgbadger read it. Each line is
//! `YYYY-MM-DD HH:MM:SS.mmm ZONE [pid] LEVEL C-0x…: db/user@addr:port message`; the
//! events tools count (login attempt, new connection to server, closing because: …) use
//! PgBouncer's words. The real binary writes a logfile; pgbadger (Debian's package,
//! installed by scripts/test) must find the sessions in it.
mod harness;

use std::process::Command;

use harness::process::{PoolerProcess, ProcessDir};
use harness::{Observer, TempPostgres, TestPooler, dsn_for, output_text, read_text, try_connect};

/// `2026-11-23 03:15:25.123 UTC [4242] LOG ` and the rest of the line, or None.
fn split_header(line: &str) -> Option<(&str, &str)> {
    let b = line.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|s| s.iter().all(u8::is_ascii_digit));
    let shape = digits(0..4)
        && b.get(4) == Some(&b'-')
        && digits(5..7)
        && digits(8..10)
        && b.get(10) == Some(&b' ')
        && digits(11..13)
        && digits(14..16)
        && digits(17..19)
        && b.get(19) == Some(&b'.')
        && digits(20..23)
        && b.get(23) == Some(&b' ');
    if !shape {
        return None;
    }
    // Zone, then [pid], then the level.
    let rest = &line[24..];
    let (_zone, rest) = rest.split_once(' ')?;
    let rest = rest.strip_prefix('[')?;
    let (pid, rest) = rest.split_once("] ")?;
    pid.parse::<u32>().ok()?;
    let (level, msg) = rest.split_once(' ')?;
    ["LOG", "WARNING", "ERROR", "FATAL", "DEBUG", "NOISE"]
        .contains(&level)
        .then_some((level, msg))
}

/// `C-0x…: db/user@addr ` prefix: the kind ('C' or 'S'), db, user, addr and the message.
fn split_object(msg: &str) -> Option<(char, &str, &str, &str, &str)> {
    let kind = msg.chars().next()?;
    let rest = msg.get(1..)?.strip_prefix("-0x")?;
    let (hex, rest) = rest.split_once(": ")?;
    if hex.is_empty() || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let (who, text) = rest.split_once(' ')?;
    let (dbuser, addr) = who.split_once('@')?;
    let (db, user) = dbuser.split_once('/')?;
    Some((kind, db, user, addr, text))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_reads_as_pgbouncers_and_pgbadger_counts_its_connections() {
    let pg = TempPostgres::start();
    let mut dir = ProcessDir::new(TestPooler::builder(&pg));
    let logfile = dir.path().join("pgcarpool.log");
    dir.rewrite(|b| b.setting("logfile", &logfile.to_string_lossy()));
    let p = PoolerProcess::start_in(dir, &[]).await;

    // Three sessions that run a query, and a login to a database that does not exist.
    for _ in 0..3 {
        let c = p.connect("postgres").await;
        c.simple_query("SELECT 1").await.expect("query");
        drop(c);
    }
    let refused = try_connect(&dsn_for(p.port(), "postgres", "nosuchdb")).await;
    assert!(
        refused.is_err(),
        "a login to an unknown database was let in"
    );
    // The disconnect lines are written once the client tasks end.
    harness::wait_for(
        "three 'closing because: client close request' lines",
        std::time::Duration::from_secs(10),
        || async {
            read_text(&logfile)
                .matches("closing because: client close request (age=")
                .count()
                >= 3
        },
    )
    .await;

    let log = read_text(&logfile);
    let mut logins = 0;
    let mut server_connects = 0;
    let mut closes = 0;
    for line in log.lines() {
        let (level, msg) = split_header(line)
            .unwrap_or_else(|| panic!("not a PgBouncer log line: {line:?}\n{log}"));
        let Some((kind, db, user, addr, text)) = split_object(msg) else {
            continue;
        };
        if text.starts_with("login attempt: ") {
            assert_eq!(
                (level, kind, db, user),
                ("LOG", 'C', "testdb", "postgres"),
                "{line}"
            );
            assert!(addr.starts_with("127.0.0.1:"), "{line}");
            assert_eq!(
                text,
                "login attempt: db=testdb user=postgres tls=no replication=no"
            );
            logins += 1;
        } else if text.starts_with("new connection to server (from 127.0.0.1:") {
            assert_eq!((level, kind, user), ("LOG", 'S', "postgres"), "{line}");
            assert_eq!(addr, format!("127.0.0.1:{}", pg.port()), "{line}");
            server_connects += 1;
        } else if text.starts_with("closing because: client close request (age=") {
            assert_eq!((kind, db), ('C', "testdb"), "{line}");
            closes += 1;
        } else if text.starts_with("closing because: database \"nosuchdb\"") {
            // The server that was refused (the server's words, as PgBouncer), then its
            // client, not logged in yet.
            let want = if kind == 'S' { "nosuchdb" } else { "(nodb)" };
            assert_eq!((level, db), ("LOG", want), "{line}");
        }
    }
    assert_eq!(logins, 3, "{log}");
    assert!(server_connects >= 1, "{log}");
    assert_eq!(closes, 3, "{log}");
    // The test config has a `*` entry: the server says the database does not exist.
    assert!(
        log.contains("closing because: database \"nosuchdb\" does not exist (age=0s)"),
        "{log}"
    );

    // pgbadger, told the log is PgBouncer's, counts the three connections to testdb (from
    // the `login attempt` lines, as it does in PgBouncer's log).
    let out_file = p.dir.path().join("pgbadger.txt");
    let out = Command::new("pgbadger")
        .args(["--format", "pgbouncer3", "-x", "text", "--outfile"])
        .arg(&out_file)
        // Its pid file in the test's own directory: pgbadger refuses to start while another
        // run (another test, a concurrent checkout) holds /tmp/pgbadger.pid.
        .arg("--pid-dir")
        .arg(p.dir.path())
        .arg(&logfile)
        .output()
        .expect("run pgbadger (Debian package pgbadger; scripts/test installs it)");
    assert!(
        out.status.success(),
        "pgbadger failed: {}",
        output_text(&out)
    );
    let report = read_text(&out_file);
    let section = report
        .split("- pgBouncer connections per database")
        .nth(1)
        .unwrap_or_else(|| panic!("pgbadger found no pgBouncer connections:\n{report}"));
    let rows: Vec<&str> = section.lines().map(str::trim).collect();
    assert!(
        rows.contains(&"testdb - 3") && rows.contains(&"postgres 3"),
        "pgbadger should count 3 connections of postgres to testdb:\n{report}"
    );
    assert!(
        report.contains("127.0.0.1 - 3"),
        "pgbadger should count 3 connections from 127.0.0.1:\n{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_format_pgcarpool_keeps_the_structured_lines() {
    let pg = TempPostgres::start();
    let p = PoolerProcess::start(TestPooler::builder(&pg).setting("log_format", "pgcarpool")).await;
    let c = p.connect("postgres").await;
    c.simple_query("SELECT 1").await.expect("query");
    let log = p.log();
    let login = log
        .lines()
        .find(|l| l.contains("login attempt: db=testdb"))
        .unwrap_or_else(|| panic!("no login line:\n{log}"));
    // tracing's RFC 3339 time and level, the fields as key=value.
    assert!(split_header(login).is_none(), "{login}");
    assert!(
        login.contains(" INFO ") && login.contains("client="),
        "{login}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_clients_pin_and_loss_lines_name_it() {
    let pg = TempPostgres::start();
    let p =
        PoolerProcess::start(TestPooler::builder(&pg).setting("pool_mode", "transaction")).await;
    // A pin: a session advisory lock keeps the client's server.
    let pinned = p.connect("postgres").await;
    pinned
        .simple_query("select pg_advisory_lock(42)")
        .await
        .expect("lock");
    // A loss: the server under another client's transaction is terminated.
    let lost = p.connect("trustuser").await;
    lost.simple_query("begin; select 1").await.expect("begin");
    let obs = Observer::new(&pg).await;
    assert_eq!(obs.terminate("trustuser").await, 1);
    let e = lost
        .simple_query("select 2")
        .await
        .expect_err("server lost");
    assert_eq!(e.code().map(|c| c.code()), Some("40001"), "{e}");
    let log = p.log();
    let mut seen = Vec::new();
    for line in log.lines() {
        for (what, user) in [
            ("client pinned to its server", "postgres"),
            ("server lost under the client's transaction", "trustuser"),
        ] {
            if !line.contains(what) {
                continue;
            }
            let (_, msg) = split_header(line).unwrap_or_else(|| panic!("{line}"));
            let (kind, db, u, addr, _) = split_object(msg).unwrap_or_else(|| panic!("{line}"));
            assert_eq!((kind, db, u), ('C', "testdb", user), "{line}");
            assert!(addr.starts_with("127.0.0.1:"), "{line}");
            seen.push(what);
        }
    }
    assert_eq!(
        seen,
        [
            "client pinned to its server",
            "server lost under the client's transaction"
        ],
        "{log}"
    );
}
