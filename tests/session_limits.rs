//! Every client's share of pgcarpool's memory is bounded: statement names and settings per
//! client, and the bytes of all statements. Going past a limit ends that client only, with
//! a clear error; what it held is freed for others.
mod harness;
mod pool_support;

use std::time::Duration;

use harness::wire::Wire;
use harness::{TempPostgres, TestPooler};
use pool_support::{connect_watched, error_text, scalar};

async fn pooler(pg: &TempPostgres, key: &str, value: &str) -> TestPooler {
    TestPooler::builder(pg)
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "2")
        .setting(key, value)
        .start()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_past_client_max_statements_is_let_go_alone() {
    let pg = TempPostgres::start();
    let p = pooler(&pg, "client_max_statements", "5").await;
    let other = p.connect("md5user", "testdb").await;
    let mut c = connect_watched(&p.dsn("md5user", "testdb")).await;
    let mut kept = Vec::new();
    for n in 0..5 {
        kept.push(c.client.prepare(&format!("select {n}")).await.unwrap());
    }
    let err = c.client.prepare("select 5").await.unwrap_err();
    assert_eq!(
        error_text(&err),
        "53400 too many prepared statements: client_max_statements is 5"
    );
    c.events.closed_within(Duration::from_secs(5)).await;
    assert_eq!(scalar(&other, "select 42").await.unwrap(), "42");
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_are_bounded_in_bytes_and_freed_when_their_client_leaves() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("auth_type", "trust")
        .setting("statement_registry_size", "40000")
        .start()
        .await;
    let parse = |n: usize| format!("P s{n}|select {n} /* {} */\nS", "x".repeat(9000));
    let mut c = Wire::connect(p.port(), "postgres", "testdb").await;
    for n in 0..4 {
        assert_eq!(c.step(&parse(n)).await, ["ParseComplete", "Ready I"]);
    }
    // A fifth would take the statements of all clients past 40,000 bytes: that client is
    // told so and let go.
    let err = c.try_step(&parse(4)).await.unwrap_err();
    assert_eq!(
        err,
        [
            "Error 53400 cannot keep another prepared statement: the statements of all clients take statement_registry_size (40000 bytes)"
        ]
    );
    // Its statements went with it: another client has the room again.
    let mut d = Wire::connect(p.port(), "postgres", "testdb").await;
    for n in 10..14 {
        assert_eq!(d.step(&parse(n)).await, ["ParseComplete", "Ready I"]);
        let got = d.step(&format!("B |s{n}|\nE \nS")).await;
        assert!(got.contains(&format!("Row {n}")), "{got:?}");
    }
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_past_client_max_settings_is_let_go_alone() {
    let pg = TempPostgres::start();
    let p = pooler(&pg, "client_max_settings", "60").await;
    let other = p.connect("md5user", "testdb").await;
    let mut c = connect_watched(&p.dsn("md5user", "testdb")).await;
    let sets: String = (0..80)
        .map(|n| format!("SET myapp.s{n} = '{n}'; "))
        .collect();
    let _ = c.client.batch_execute(&sets).await;
    let why = c.events.closed_within(Duration::from_secs(5)).await;
    assert_eq!(
        why,
        "53400 too many session settings: client_max_settings is 60"
    );
    assert_eq!(scalar(&other, "select 42").await.unwrap(), "42");
    p.shutdown().await;
}

/// What a raw client read until the connection ended: the bytes, and the error that ended
/// the reading (None: a clean end of stream).
async fn read_to_end(s: &mut tokio::net::TcpStream) -> (Vec<u8>, Option<std::io::Error>) {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        match tokio::time::timeout(Duration::from_secs(20), s.read(&mut chunk)).await {
            Err(_) => panic!("the connection was not closed within 20 s"),
            Ok(Ok(0)) => return (got, None),
            Ok(Ok(n)) => got.extend_from_slice(&chunk[..n]),
            Ok(Err(e)) => return (got, Some(e)),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_let_go_with_pipelined_messages_in_flight_gets_its_error_not_a_reset() {
    use harness::wire::{error_fields, message, split_messages, startup_message};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("auth_type", "trust")
        .setting("statement_registry_size", "40000")
        .start()
        .await;
    let parse = |name: &str, sql: &str| {
        let mut b = name.as_bytes().to_vec();
        b.push(0);
        b.extend_from_slice(sql.as_bytes());
        b.extend_from_slice(&[0, 0, 0]);
        message(b'P', &b)
    };
    for round in 0..5 {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", p.port()))
            .await
            .unwrap();
        s.write_all(&startup_message(&[
            ("user", "postgres"),
            ("database", "testdb"),
        ]))
        .await
        .unwrap();
        let mut hello = Vec::new();
        while !split_messages(&hello).iter().any(|(t, _)| *t == b'Z') {
            let mut chunk = [0u8; 4096];
            let n = s.read(&mut chunk).await.unwrap();
            assert!(n > 0, "closed during login");
            hello.extend_from_slice(&chunk[..n]);
        }
        // Five 9,000-byte statements: the fifth takes the registry past 40,000 bytes and
        // the client is let go while the rest of its pipeline (~500 KB) is still coming.
        let mut out = Vec::new();
        for n in 0..5 {
            out.extend(parse(
                &format!("s{n}"),
                &format!("select {n} /* {} */", "x".repeat(9000)),
            ));
        }
        out.extend(message(b'S', &[]));
        for _ in 0..10_000 {
            out.extend(parse("", "select 1"));
            out.extend(message(b'S', &[]));
        }
        // Written whole before anything is read, as a pipelining client does; a write the
        // pooler no longer reads fails, and that is fine.
        let _ = s.write_all(&out).await;
        let (got, err) = read_to_end(&mut s).await;
        let errors: Vec<(String, String)> = split_messages(&got)
            .into_iter()
            .filter(|(t, _)| *t == b'E')
            .map(|(_, b)| error_fields(&b))
            .collect();
        assert_eq!(
            errors,
            [(
                "53400".to_string(),
                "cannot keep another prepared statement: the statements of all clients take \
                 statement_registry_size (40000 bytes)"
                    .to_string()
            )],
            "round {round}: the client did not get its error (read ended with {err:?})"
        );
        assert!(
            err.is_none(),
            "round {round}: the connection was reset, not closed: {err:?}"
        );
    }
    p.shutdown().await;
}
