//! Protocol 3.2 (PostgreSQL 18) toward clients: a client asking for 3.2 gets it, with a
//! 32-byte cancel secret its CancelRequest must carry whole; a client of 3.0 keeps 4 bytes;
//! newer minor versions and `_pq_.` options get NegotiateProtocolVersion as from
//! PostgreSQL. With libpq 18 (`harness::libpq_with_protocol_3_2`), psql requiring 3.2
//! connects and its cancel ends a pg_sleep.
mod harness;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use harness::raw::{RawClient, send_cancel};
use harness::{Observer, TempPostgres, TestPooler};

const LOCAL: &str = "127.0.0.1";
const USER: (&str, &str) = ("md5user", "testdb");
/// Protocol 3.0 and 3.2 as StartupMessage and NegotiateProtocolVersion carry them.
const V3_0: i32 = 3 << 16;
const V3_2: i32 = (3 << 16) + 2;
/// A generous bound for a cancel to end a query (the goal is well under a second; the
/// machine is shared).
const CANCEL_LIMIT: Duration = Duration::from_secs(5);

async fn trust_pooler(pg: &TempPostgres) -> TestPooler {
    TestPooler::builder(pg)
        .setting("pool_mode", "transaction")
        .setting("auth_type", "trust")
        .start()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_asking_for_3_2_gets_a_32_byte_secret_and_one_of_3_0_gets_4() {
    let pg = TempPostgres::start();
    let p = trust_pooler(&pg).await;
    let long = RawClient::connect((LOCAL, p.port()), 2, USER, &[]).await;
    assert_eq!(long.negotiated, None, "3.2 is spoken: nothing to negotiate");
    assert_eq!(long.secret_len(), 32);
    let short = RawClient::connect((LOCAL, p.port()), 0, USER, &[]).await;
    assert_eq!(short.negotiated, None);
    assert_eq!(short.secret_len(), 4);
    // 3.1 (never sent by libpq) is served as PostgreSQL 18 serves it: 4 bytes.
    let one = RawClient::connect((LOCAL, p.port()), 1, USER, &[]).await;
    assert_eq!((one.secret_len(), one.negotiated), (4, None));
    // Keys differ from client to client.
    let other = RawClient::connect((LOCAL, p.port()), 2, USER, &[]).await;
    assert_ne!(other.rest, long.rest);
    p.shutdown().await;
}

/// NegotiateProtocolVersion's version and option names.
type Negotiated = Option<(i32, Vec<String>)>;
/// A startup packet's minor version and `_pq_.` options, and the negotiation it gets.
type Case<'a> = (u16, &'a [(&'a str, &'a str)], Negotiated);

/// What NegotiateProtocolVersion says to a StartupMessage of 3.`minor` with `options`
/// (None: it was not sent), from `port`.
async fn negotiation(
    port: u16,
    minor: u16,
    options: &[(&str, &str)],
) -> Option<(i32, Vec<String>)> {
    // trustuser: PostgreSQL trusts it too.
    RawClient::connect((LOCAL, port), minor, ("trustuser", "testdb"), options)
        .await
        .negotiated
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newer_minor_versions_and_unknown_options_are_negotiated_down() {
    let pg = TempPostgres::start();
    let p = trust_pooler(&pg).await;
    let cases: [Case; 5] = [
        (3, &[], Some((V3_2, vec![]))),
        (0xffff, &[], Some((V3_2, vec![]))),
        (
            0,
            &[("_pq_.fancy", "on")],
            Some((V3_0, vec!["_pq_.fancy".into()])),
        ),
        (
            2,
            &[("_pq_.a", "1"), ("_pq_.b", "2")],
            Some((V3_2, vec!["_pq_.a".into(), "_pq_.b".into()])),
        ),
        (5, &[("_pq_.x", "")], Some((V3_2, vec!["_pq_.x".into()]))),
    ];
    for (minor, options, want) in &cases {
        assert_eq!(
            &negotiation(p.port(), *minor, options).await,
            want,
            "3.{minor} with {options:?}"
        );
    }
    // PostgreSQL 18 and newer say the same (older servers offer 3.0).
    if harness::server_major() >= 18 {
        for (minor, options, want) in &cases {
            let straight = negotiation(pg.port(), *minor, options).await;
            assert_eq!(&straight, want, "PostgreSQL: 3.{minor} with {options:?}");
        }
    }
    p.shutdown().await;
}

/// Start `SELECT pg_sleep(10)` on `c` and wait until PostgreSQL runs it.
async fn sleep_on(pg: &TempPostgres, c: &mut RawClient) {
    let obs = Observer::new(pg).await;
    obs.wait_running("md5user", "pg_sleep(10)", 0).await;
    c.send_query("SELECT pg_sleep(10)").await;
    obs.wait_running("md5user", "pg_sleep(10)", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_key_cancels_only_when_whole() {
    let pg = TempPostgres::start();
    let p = trust_pooler(&pg).await;
    let mut c = RawClient::connect((LOCAL, p.port()), 2, USER, &[]).await;
    sleep_on(&pg, &mut c).await;
    // The first 8 bytes alone, the secret with its last byte changed, or cut short: no
    // cancel (each request is handled once its connection closes).
    let mut wrong = c.rest.clone();
    *wrong.last_mut().unwrap() ^= 1;
    send_cancel((LOCAL, p.port()), c.key, &[]).await;
    send_cancel((LOCAL, p.port()), c.key, &wrong).await;
    send_cancel((LOCAL, p.port()), c.key, &c.rest[..27]).await;
    assert_eq!(
        c.outcome(Duration::from_secs(1)).await,
        None,
        "the query ended after cancel requests with wrong secrets"
    );
    let started = Instant::now();
    send_cancel((LOCAL, p.port()), c.key, &c.rest.clone()).await;
    let got = c.outcome(CANCEL_LIMIT).await;
    eprintln!("cancelled in {:?}", started.elapsed());
    assert_eq!(got, Some(Some("57014".into())));
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_key_of_a_3_0_client_still_cancels() {
    let pg = TempPostgres::start();
    let p = trust_pooler(&pg).await;
    let mut c = RawClient::connect((LOCAL, p.port()), 0, USER, &[]).await;
    sleep_on(&pg, &mut c).await;
    // A long secret for a client given a short one is not its key.
    send_cancel((LOCAL, p.port()), c.key, &[0; 28]).await;
    assert_eq!(c.outcome(Duration::from_secs(1)).await, None);
    send_cancel((LOCAL, p.port()), c.key, &[]).await;
    assert_eq!(c.outcome(CANCEL_LIMIT).await, Some(Some("57014".into())));
    p.shutdown().await;
}

/// psql with libpq 18, requiring protocol 3.2, through pgcarpool: it connects, and its
/// cancel (SIGINT, as Ctrl-C) ends a pg_sleep(10).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql_with_libpq_18_requiring_3_2_connects_and_cancels() {
    let libpq = match harness::libpq_with_protocol_3_2() {
        Ok(dir) => dir,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let pg = TempPostgres::start();
    let p = trust_pooler(&pg).await;
    let dsn = format!(
        "host={LOCAL} port={} user=md5user dbname=testdb min_protocol_version=3.2",
        p.port()
    );
    let psql = |sql: &str| {
        let mut cmd = Command::new(harness::pg_bin("psql"));
        cmd.env("LD_LIBRARY_PATH", &libpq)
            .args(["-X", "-At", "-d", &dsn, "-c", sql]);
        cmd
    };
    let out = psql("select 1").output().unwrap();
    assert!(out.status.success(), "{}", harness::output_text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1");
    let mut child = psql("select pg_sleep(10)")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    Observer::new(&pg)
        .await
        .wait_running("md5user", "pg_sleep(10)", 1)
        .await;
    let started = Instant::now();
    // SAFETY: signalling our own child, not waited for yet.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let status = harness::process::exit_within(&mut child, CANCEL_LIMIT).await;
    let Some(status) = status else {
        let _ = child.kill();
        panic!("psql's pg_sleep(10) was not cancelled within {CANCEL_LIMIT:?}");
    };
    eprintln!("cancelled in {:?}", started.elapsed());
    let out = child.wait_with_output().unwrap();
    let text = format!("{status} {}", String::from_utf8_lossy(&out.stderr));
    assert!(
        text.contains("canceling statement due to user request"),
        "{text}"
    );
    p.shutdown().await;
}
