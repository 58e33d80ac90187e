//! Logins no one can abuse (issue 11, first part): an unknown user cannot be told from a
//! wrong password (same exchange, same error), a wrong password is reported before an
//! unknown database, a user name cannot forge log lines, and a reload from an empty or
//! half-written file keeps the running configuration.
mod harness;

use std::time::Duration;

use harness::process::PoolerProcess;
use harness::{TempPostgres, TestPooler, dsn_with_password, login_outcome, sqlstate, try_connect};

/// What a login attempt came to: the server's SQLSTATE and message, or a client-side
/// error (e.g. the server asked for a password the client does not have).
async fn outcome(port: u16, user: &str, password: Option<&str>, db: &str) -> String {
    login_outcome(&dsn_with_password(port, user, password, db)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_user_gets_the_same_exchange_as_a_wrong_password() {
    let pg = TempPostgres::start();
    for auth_type in ["scram-sha-256", "md5", "plain"] {
        let p = TestPooler::builder(&pg)
            .setting("auth_type", auth_type)
            .start()
            .await;
        // No password on the client side: a server that asks for one makes the client
        // fail by itself; one that refuses at once sends an error. Both users alike.
        let known = outcome(p.port(), "md5user", None, "testdb").await;
        let unknown = outcome(p.port(), "nobody", None, "testdb").await;
        assert!(known.starts_with("client: "), "{auth_type}: {known}");
        assert_eq!(known, unknown, "{auth_type}: known vs unknown user");
        // A wrong password: the same SQLSTATE and message, but for the name.
        let known = outcome(p.port(), "md5user", Some("wrong"), "testdb").await;
        let unknown = outcome(p.port(), "nobody", Some("wrong"), "testdb").await;
        // PgBouncer's words: a failed SCRAM exchange names no user.
        let expect = |user: &str| match auth_type {
            "scram-sha-256" => "28P01 SASL authentication failed".to_string(),
            _ => format!("28P01 password authentication failed for user \"{user}\""),
        };
        assert_eq!(known, expect("md5user"), "{auth_type}");
        assert_eq!(unknown, expect("nobody"), "{auth_type}");
        p.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_reported_before_an_unknown_database() {
    let pg = TempPostgres::start();
    // Only testdb exists for clients (no `*` fallback).
    let p = TestPooler::builder(&pg)
        .database("testdb", &pg.db_entry("testdb"))
        .start()
        .await;
    let e = try_connect(&dsn_with_password(
        p.port(),
        "md5user",
        Some("wrong"),
        "nodb",
    ))
    .await
    .expect_err("logged in with a wrong password");
    assert_eq!(sqlstate(&e), Some("28P01"), "{e:?}");
    let e = try_connect(&dsn_with_password(
        p.port(),
        "md5user",
        Some("md5pass"),
        "nodb",
    ))
    .await
    .expect_err("logged in to a database that does not exist");
    assert_eq!(sqlstate(&e), Some("3D000"), "{e:?}");
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_name_cannot_forge_a_log_line() {
    let pg = TempPostgres::start();
    let p = PoolerProcess::start(TestPooler::builder(&pg)).await;
    let forged = "x\n2030-01-01T00:00:00Z  INFO FAKELOGLINE admin login ok user=postgres";
    let _ = outcome(p.port(), forged, Some("whatever"), "testdb").await;
    let escaped = "x\\x0a2030-01-01T00:00:00Z  INFO FAKELOGLINE";
    assert!(
        harness::eventually(Duration::from_secs(5), || async {
            p.log().contains(escaped)
        })
        .await,
        "the failed login is not logged with the name escaped:\n{}",
        p.log()
    );
    assert!(
        !p.log().lines().any(|l| l.starts_with("2030-01-01")),
        "a forged line:\n{}",
        p.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_from_an_empty_file_keeps_the_running_config() {
    let pg = TempPostgres::start();
    let p = PoolerProcess::start(TestPooler::builder(&pg)).await;
    for text in ["", "[pgbouncer]\nlisten_port = 6432\n"] {
        p.dir.write_ini(text);
        p.signal(libc::SIGHUP);
        let ready = p
            .ready_again(Duration::from_secs(10))
            .await
            .expect("no READY=1 after SIGHUP");
        assert_eq!(
            harness::process::field(&ready, "STATUS"),
            Some("reload failed, old configuration kept"),
            "{text:?}"
        );
        assert!(
            p.log()
                .contains("defines no databases (empty or half-written?)"),
            "{}",
            p.log()
        );
        // Databases, users and auth_file are still those of the running config.
        let c = p.connect("md5user").await;
        c.simple_query("select 1").await.unwrap();
    }
}

/// Issue 24: a flood of 110 sockets that never finish a login (silent, 4 bytes, or one
/// byte a second) on a pooler with max_client_conn = 100 and client_login_timeout = 10: a
/// real user logs in at once, within its own connect timeout (when unfinished logins hold
/// more than half of max_client_conn, the oldest that sent no startup packet within 250 ms
/// makes room), not after the flood times out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sockets_that_never_log_in_cannot_lock_users_out() {
    use tokio::io::AsyncWriteExt;
    let pg = TempPostgres::start();
    // TCP_DEFER_ACCEPT (tcp_defer_accept, on by default as in PgBouncer) keeps silent
    // sockets in the kernel for a while: off here, so that they all reach the pooler.
    let p = TestPooler::builder(&pg)
        .setting("max_client_conn", "100")
        .setting("client_login_timeout", "10")
        .setting("tcp_defer_accept", "0")
        .start()
        .await;
    let startup = harness::wire::startup_message(&[("user", "md5user"), ("database", "testdb")]);
    let stop = std::sync::Arc::new(tokio::sync::Notify::new());
    let mut flood = Vec::new();
    let mut tricklers = Vec::new();
    for i in 0..110 {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", p.port()))
            .await
            .unwrap();
        match i % 3 {
            0 => flood.push(s),
            1 => {
                s.write_all(&startup[..4]).await.unwrap();
                flood.push(s);
            }
            _ => {
                // One byte a second until stopped (or the pooler closes it).
                let startup = startup.clone();
                let stop = stop.clone();
                tricklers.push(tokio::spawn(async move {
                    for b in startup {
                        if s.write_all(&[b]).await.is_err() {
                            return;
                        }
                        // The trickle's pace (the scenario), not a synchronisation.
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                            _ = stop.notified() => return,
                        }
                    }
                }));
            }
        }
    }
    // The pooler is full of unfinished logins.
    harness::wait_for(
        "the flood fills the pooler",
        Duration::from_secs(10),
        || {
            let (conns, logging_in) = p.client_conns();
            async move { conns >= 100 && logging_in >= 100 }
        },
    )
    .await;
    // The real user comes 0.5 s after the flood; the flood's sockets may be
    // dropped once they have sent nothing for FLOOD_GRACE (that period is the rule itself).
    tokio::time::sleep(pgcarpool::client::logins::FLOOD_GRACE).await;
    // A real user gets in at once, within its own connect timeout (5 s, not the 10 s
    // the flood holds its places for).
    let dsn = format!("{} connect_timeout=5", p.dsn("md5user", "testdb"));
    let c = try_connect(&dsn)
        .await
        .expect("a real login was locked out by sockets that never log in");
    let row = c.query_one("select 6 * 7", &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 42);
    // The oldest silent socket was dropped with max_client_conn's error.
    let mut first = flood.remove(0);
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::io::AsyncReadExt::read_to_end(&mut first, &mut reply),
    )
    .await
    .expect("the oldest socket was not closed");
    assert!(
        String::from_utf8_lossy(&reply).contains("53300"),
        "{:?}",
        String::from_utf8_lossy(&reply)
    );
    stop.notify_waiters();
    drop(flood);
    for t in tricklers {
        t.abort();
    }
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_console_session_outlives_client_login_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("client_login_timeout", "1")
        .start()
        .await;
    let admin = p.connect("postgres", "pgbouncer").await;
    admin.simple_query("SHOW VERSION").await.unwrap();
    // A login begun after the console's and never finished: once client_login_timeout
    // has ended it, that deadline has passed for the console session too.
    let mut late = tokio::net::TcpStream::connect(("127.0.0.1", p.port()))
        .await
        .unwrap();
    let startup = harness::wire::startup_message(&[("user", "md5user"), ("database", "testdb")]);
    late.write_all(&startup[..4]).await.unwrap();
    let mut reply = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(10), late.read_to_end(&mut reply));
    // Ended: closed (with or without an error message first) or reset.
    let _ = ended
        .await
        .expect("client_login_timeout did not end an unfinished login");
    admin
        .simple_query("SHOW VERSION")
        .await
        .expect("the console session was cut at client_login_timeout");
    p.shutdown().await;
}

/// Send a protocol 3.`minor` startup packet with `params` to `port`; the first message
/// back (tag, body).
async fn first_reply(port: u16, minor: u16, params: &[(&str, &str)]) -> (u8, Vec<u8>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(&harness::wire::startup_message_minor(minor, params))
        .await
        .unwrap();
    let mut head = [0u8; 5];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut head))
        .await
        .expect("no reply to the startup packet")
        .unwrap();
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    let mut body = vec![0u8; len - 4];
    s.read_exact(&mut body).await.unwrap();
    (head[0], body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_protocol_gets_negotiate_protocol_version_as_from_postgresql() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg).start().await;
    // pgcarpool speaks 3.2 whatever the server's major, as PostgreSQL 18 does: a newer
    // minor version is compared with servers of 18 and newer only (older ones offer 3.0;
    // tests/protocol_3_2.rs checks pgcarpool's answer on every major).
    let speaks_3_2 = harness::server_major() >= 18;
    for (minor, params) in [
        (3, vec![("user", "md5user"), ("database", "testdb")]),
        (
            0,
            vec![
                ("user", "md5user"),
                ("database", "testdb"),
                ("_pq_.no_such_option", "1"),
            ],
        ),
    ] {
        if minor > 0 && !speaks_3_2 {
            continue;
        }
        let direct = first_reply(pg.port(), minor, &params).await;
        let pooled = first_reply(p.port(), minor, &params).await;
        assert_eq!(direct.0, b'v', "PostgreSQL itself: {direct:?}");
        assert_eq!(pooled, direct, "3.{minor} with {params:?}");
    }
    // 3.0 without options: straight to authentication, as before.
    let plain = first_reply(p.port(), 0, &[("user", "md5user"), ("database", "testdb")]).await;
    assert_eq!(plain.0, b'R');
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_md5_secret_for_a_scram_server_is_reported_as_the_wrong_password_type() {
    let pg = TempPostgres::start();
    // scramuser's only secret is an md5 hash: good for the client's md5 login, useless
    // for PostgreSQL's SCRAM (scramuser is SCRAM in pg_hba).
    let hash = pgcarpool::auth::md5::password_hash("scramuser", "scrampass");
    let p = TestPooler::builder(&pg)
        .auth_file_line(&format!("\"scramuser\" \"md5{hash}\""))
        .start()
        .await;
    let got = outcome(p.port(), "scramuser", Some("scrampass"), "testdb").await;
    assert!(
        got.contains("cannot do SCRAM authentication: wrong password type"),
        "{got}"
    );
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trust_still_wants_the_user_in_auth_file() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("auth_type", "trust")
        .start()
        .await;
    // A user of auth_file gets in without a password; anyone else does not (PgBouncer).
    assert_eq!(
        outcome(p.port(), "md5user", None, "testdb").await,
        "logged in"
    );
    assert_eq!(
        outcome(p.port(), "nosuchuser", None, "testdb").await,
        "28000 \"trust\" authentication failed"
    );
    p.shutdown().await;
    // With auth_user set, a user missing from auth_file is looked up with auth_query
    // (tests/auth_query.rs): one PostgreSQL has gets past trust, another does not.
    let p = TestPooler::builder(&pg)
        .setting("auth_type", "trust")
        .setting("auth_user", "postgres")
        .start()
        .await;
    pg.psql("create role notinfile login");
    // Past the pooler; PostgreSQL then wants a password nobody has (md5 in its pg_hba).
    let got = outcome(p.port(), "notinfile", None, "testdb").await;
    assert!(got.starts_with("08006 server login failed"), "{got}");
    assert_eq!(
        outcome(p.port(), "notinpostgres", None, "testdb").await,
        "08P01 no such user"
    );
    p.shutdown().await;
    // auth_type = any takes any name (and logs in to the server as the pool's user).
    let p = TestPooler::builder(&pg)
        .setting("auth_type", "any")
        .database("testdb", &format!("{} user=md5user", pg.db_entry("testdb")))
        .start()
        .await;
    assert_eq!(
        outcome(p.port(), "nosuchuser", None, "testdb").await,
        "logged in"
    );
    p.shutdown().await;
}
