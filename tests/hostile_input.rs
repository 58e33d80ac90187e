//! Bytes no client should send: each gets an error or a closed connection, the pooler does
//! not panic, and other clients are not affected.
mod harness;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use harness::wire::{error_fields, split_messages, startup_message};
use harness::{Observer, TempPostgres, TestPooler};

fn raw(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Read until the pooler closes the connection (EOF, or a reset after it dropped unread
/// input); returns what came. Panics if the connection is still open after the read
/// timeout: a hang is not a close.
fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return out,
            Err(e) => panic!(
                "connection not closed ({e}); got so far: {:?}",
                replies(&out)
            ),
        }
    }
}

/// The messages in `bytes`: `E SQLSTATE message` for an ErrorResponse, else the tag; the
/// bytes must be whole messages.
fn replies(bytes: &[u8]) -> Vec<String> {
    let msgs = split_messages(bytes);
    let whole: usize = msgs.iter().map(|(_, b)| b.len() + 5).sum();
    assert_eq!(whole, bytes.len(), "a partial message in {bytes:?}");
    msgs.iter()
        .map(|(tag, body)| match tag {
            b'E' => {
                let (code, message) = error_fields(body);
                format!("E {code} {message}")
            }
            t => (*t as char).to_string(),
        })
        .collect()
}

/// The replies are one ErrorResponse with SQLSTATE `code`.
fn assert_one_error(what: &str, replies: &[String], code: &str) {
    assert!(
        replies.len() == 1 && replies[0].starts_with(&format!("E {code} ")),
        "{what}: wanted one ErrorResponse {code}, got {replies:?}"
    );
}

/// Read messages up to a ReadyForQuery or the end of the connection (panics on a hang);
/// returns them (`replies`) and whether the connection was closed.
fn read_reply(s: &mut TcpStream) -> (Vec<String>, bool) {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let msgs = split_messages(&out);
        if msgs.iter().any(|(tag, _)| *tag == b'Z') {
            return (replies(&out), false);
        }
        match s.read(&mut buf) {
            Ok(0) => return (replies(&out), true),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return (replies(&out), true);
            }
            Err(e) => panic!("no reply and not closed ({e}); got so far: {out:?}"),
        }
    }
}

/// A logged-in raw connection to 127.0.0.1:`port` as postgres (trusted), positioned after
/// ReadyForQuery.
fn logged_in(port: u16) -> TcpStream {
    let mut s = raw(port);
    s.write_all(&startup_message(&[
        ("user", "postgres"),
        ("database", "testdb"),
    ]))
    .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !seen.windows(6).any(|w| w == b"Z\0\0\0\x05I") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed during login: {seen:?}");
        seen.extend_from_slice(&buf[..n]);
    }
    s
}

async fn still_serves(p: &TestPooler) {
    let c = p.connect("postgres", "testdb").await;
    let r = c.query_one("select 41 + 1", &[]).await.unwrap();
    assert_eq!(r.get::<_, i32>(0), 42);
}

async fn pooler(pg: &TempPostgres) -> TestPooler {
    TestPooler::builder(pg)
        .setting("auth_type", "trust")
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "2")
        .start()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_startup_packets_are_refused() {
    let pg = TempPostgres::start();
    let p = pooler(&pg).await;
    let cases: Vec<Vec<u8>> = vec![
        vec![0, 0, 0, 3],                                      // length below the minimum
        vec![0xff, 0xff, 0xff, 0xff, 0, 3, 0, 0],              // negative length
        vec![0, 1, 0, 0, 0, 3, 0, 0],                          // 65536: over the startup limit
        vec![0, 0, 0, 8, 0, 2, 0, 0],                          // protocol 2.0
        vec![0, 0, 0, 12, 0, 3, 0, 0, b'u', b's', b'e', b'r'], // unterminated parameters
        vec![0, 0, 0, 16, 0x04, 0xd2, 0x16, 0x2e, 0, 0],       // truncated CancelRequest, then EOF
    ];
    for (i, bytes) in cases.iter().enumerate() {
        let mut s = raw(p.port());
        s.write_all(bytes).unwrap();
        let _ = s.shutdown(std::net::Shutdown::Write);
        let got = replies(&read_to_close(&mut s));
        if i == cases.len() - 1 {
            // Nothing is ever answered on a cancel connection.
            assert_eq!(got, Vec::<String>::new(), "truncated CancelRequest");
        } else {
            assert_one_error(&format!("startup packet {bytes:?}"), &got, "08P01");
        }
    }
    // Deterministic garbage.
    let mut x: u32 = 12345;
    for _ in 0..20 {
        let mut bytes = Vec::new();
        for _ in 0..64 {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            bytes.push((x >> 16) as u8);
        }
        let mut s = raw(p.port());
        let _ = s.write_all(&bytes);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let got = replies(&read_to_close(&mut s));
        assert_one_error(&format!("garbage {bytes:?}"), &got, "08P01");
    }
    still_serves(&p).await;
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_messages_after_login_end_only_that_client() {
    let pg = TempPostgres::start();
    let p = pooler(&pg).await;
    let bystander = p.connect("postgres", "testdb").await;
    bystander.batch_execute("BEGIN").await.unwrap();
    // Framing errors: the pooler cannot read on; it says so (08P01) and closes.
    for msg in [
        &b"Q\xff\xff\xff\xff"[..], // negative length
        &b"Q\0\0\0\x02"[..],       // length below 4
        &b"P\x7f\xff\xff\xff"[..], // a Parse of 2 GiB
        &b"C\0\0\0\x05S"[..],      // a Close without a name
    ] {
        let mut s = logged_in(p.port());
        s.write_all(msg).unwrap();
        s.write_all(b"S\0\0\0\x04").unwrap();
        let (got, closed) = read_reply(&mut s);
        assert_one_error(&format!("message {msg:?}"), &got, "08P01");
        assert!(closed, "message {msg:?}: the connection stayed open");
    }
    // The bystander's transaction and the pool are untouched.
    let r = bystander.query_one("select 1", &[]).await.unwrap();
    assert_eq!(r.get::<_, i32>(0), 1);
    bystander.batch_execute("COMMIT").await.unwrap();
    still_serves(&p).await;
    let obs = Observer::new(&pg).await;
    assert_eq!(obs.all_in_state("idle in transaction").await, 0);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_message_content_is_answered_as_postgresql_answers_it() {
    let pg = TempPostgres::start();
    let p = pooler(&pg).await;
    // Whole messages whose content is wrong go to PostgreSQL, which answers them as it
    // does without a pooler (an ERROR, then ReadyForQuery at the Sync; the session goes on).
    for (msg, code) in [
        (&b"P\0\0\0\x08ab\0\0"[..], "08P01"), // a Parse missing its parameter count
        (&b"B\0\0\0\x06\0\0"[..], "26000"),   // a Bind cut short (no unnamed statement)
    ] {
        let mut answers = Vec::new();
        for port in [pg.port(), p.port()] {
            let mut s = logged_in(port);
            s.write_all(msg).unwrap();
            s.write_all(b"S\0\0\0\x04").unwrap();
            let (got, closed) = read_reply(&mut s);
            assert!(
                !closed,
                "message {msg:?} on port {port}: closed after {got:?}"
            );
            assert_eq!(got.len(), 2, "message {msg:?} on port {port}: {got:?}");
            assert!(
                got[0].starts_with(&format!("E {code} ")) && got[1] == "Z",
                "message {msg:?} on port {port}: {got:?}"
            );
            answers.push(got);
        }
        assert_eq!(
            answers[0], answers[1],
            "PostgreSQL (left) vs pgcarpool (right)"
        );
    }
    still_serves(&p).await;
    p.shutdown().await;
}

/// `replies`, with each error's severity: `FATAL 08P01 message`, `ERROR 26000 message`.
fn replies_with_severity(bytes: &[u8]) -> Vec<String> {
    split_messages(bytes)
        .iter()
        .map(|(tag, body)| match tag {
            b'E' => {
                let (code, message) = error_fields(body);
                let severity = body
                    .split(|&b| b == 0)
                    .find_map(|f| f.strip_prefix(b"V").or_else(|| f.strip_prefix(b"S")))
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .unwrap_or_default();
                format!("{severity} {code} {message}")
            }
            t => (*t as char).to_string(),
        })
        .collect()
}

/// Log in to `port`, send `bytes` (then, when the session is to go on, `select 1` in the
/// same write), and read to the ReadyForQuery of the last round or the close: the replies and
/// whether the connection was closed.
fn run_script(port: u16, bytes: &[u8], kept: bool) -> (Vec<String>, bool) {
    let mut s = logged_in(port);
    let mut out = bytes.to_vec();
    if kept {
        out.extend_from_slice(&harness::wire::message(b'Q', b"select 1\0"));
    }
    s.write_all(&out).unwrap();
    // A ReadyForQuery for each Query and Sync sent.
    let rounds = split_messages(&out)
        .iter()
        .filter(|(t, _)| matches!(t, b'Q' | b'S'))
        .count();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        let ready = split_messages(&got)
            .iter()
            .filter(|(t, _)| *t == b'Z')
            .count();
        if kept && ready == rounds {
            break false;
        }
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(e) => panic!("no reply and not closed ({e}); got so far: {got:?}"),
        }
    };
    (replies_with_severity(&got), closed)
}

/// PostgreSQL's "connection authorized" lines so far (log_connections): its logins.
fn logins(pg: &TempPostgres) -> usize {
    pg.log().matches("connection authorized").count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_messages_after_login_are_answered_as_postgresql_answers_them() {
    use harness::wire::message;
    let pg = TempPostgres::start_with(&[("log_connections", "on")]);
    let p = pooler(&pg).await;
    let sync = message(b'S', b"");
    let join = |parts: &[&[u8]]| parts.concat();
    // (what, bytes, the session goes on): each run straight against PostgreSQL and through
    // pgcarpool, with the same replies, and closed or kept alike.
    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        ("unknown type 1", message(1, b""), false),
        ("unknown type 1 with a body", message(1, b"abc\0"), false),
        (
            "PasswordMessage after login",
            message(b'p', b"secret\0"),
            false,
        ),
        ("type 0", message(0, b""), false),
        (
            "a query, then an unknown type",
            join(&[&message(b'Q', b"select 2\0"), &message(b'x', b"")]),
            false,
        ),
        (
            "a block begun, then an unknown type",
            join(&[&message(b'Q', b"begin; select 3\0"), &message(1, b"")]),
            false,
        ),
        (
            "an extended round, then an unknown type",
            join(&[
                &message(b'P', b"\0select 4\0\0\0"),
                &message(b'B', b"\0\0\0\0\0\0\0\0"),
                &message(b'E', b"\0\0\0\0\0"),
                &sync,
                &message(1, b""),
            ]),
            false,
        ),
        (
            "CopyData outside COPY, no Sync",
            message(b'd', b"abcd"),
            true,
        ),
        ("CopyDone outside COPY", message(b'c', b""), true),
        ("CopyFail outside COPY", message(b'f', b"gave up\0"), true),
        (
            "CopyData outside COPY, then Sync",
            join(&[&message(b'd', b"1\t2\n"), &sync]),
            true,
        ),
        (
            "Bind of a statement that does not exist",
            join(&[&message(b'B', b"\0nope\0\0\0\0\0\0\0"), &sync]),
            true,
        ),
        (
            "Execute of a portal that does not exist",
            join(&[&message(b'E', b"nope\0\0\0\0\0"), &sync]),
            true,
        ),
        (
            "Describe of a portal that does not exist",
            join(&[&message(b'D', b"Pnope\0"), &sync]),
            true,
        ),
        (
            "Close of a statement that does not exist",
            join(&[&message(b'C', b"Snope\0"), &sync]),
            true,
        ),
    ];
    // The pool's server, logged in before; no case may cost another login.
    still_serves(&p).await;
    let before = logins(&pg);
    let mut pooled_logins = 0;
    for (what, bytes, kept) in &cases {
        let direct = run_script(pg.port(), bytes, *kept);
        let at = logins(&pg);
        let pooled = run_script(p.port(), bytes, *kept);
        pooled_logins += logins(&pg) - at;
        assert_eq!(
            direct, pooled,
            "{what}: PostgreSQL (left) vs pgcarpool (right)"
        );
        assert_eq!(direct.1, !kept, "{what}: {direct:?}");
    }
    // Only the direct runs logged in (one each); the pool kept its server.
    assert_eq!(
        logins(&pg) - before,
        cases.len(),
        "server logins through pgcarpool: {pooled_logins}"
    );
    still_serves(&p).await;
    let obs = Observer::new(&pg).await;
    assert_eq!(obs.all_in_state("idle in transaction").await, 0);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_length_postgresql_cannot_read_closes_the_client_without_a_server() {
    let pg = TempPostgres::start_with(&[("log_connections", "on")]);
    let p = pooler(&pg).await;
    // Length words PostgreSQL refuses before reading a body: below 4, above 10,000 for a
    // message that holds no SQL or data, above 1 GiB - 2 for the others.
    let cases: [(&[u8], i64); 5] = [
        (b"Q\0\0\0\x03", 3),
        (b"S\0\0\x27\x11", 10_001),
        (b"E\0\x01\0\0\0\0", 65_536),
        (b"H\xff\xff\xff\xfc", -4),
        (b"P\x40\0\0\0", 0x4000_0000),
    ];
    still_serves(&p).await;
    let before = logins(&pg);
    for (bytes, len) in cases {
        // PostgreSQL closes without a word (it logs "invalid message length").
        let direct = run_script(pg.port(), bytes, false);
        assert_eq!(direct, (vec![], true), "{bytes:?} straight to PostgreSQL");
        // pgcarpool closes as well, and says why first.
        let pooled = run_script(p.port(), bytes, false);
        let why = format!("FATAL 08P01 protocol violation: invalid message length {len}");
        assert_eq!(pooled, (vec![why], true), "{bytes:?} through pgcarpool");
    }
    assert_eq!(
        logins(&pg) - before,
        cases.len(),
        "only the direct runs log in"
    );
    still_serves(&p).await;
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fatal_the_client_caused_ends_the_client_as_on_postgresql() {
    let pg = TempPostgres::start();
    let p = pooler(&pg).await;
    // The client's own idle_in_transaction_session_timeout ends its session: PostgreSQL's
    // FATAL 25P03 and the close, not a lost server (40001) and a session that goes on.
    let sql = b"set idle_in_transaction_session_timeout = '100ms'; begin; select 1\0";
    let bytes = harness::wire::message(b'Q', sql);
    let direct = run_script(pg.port(), &bytes, false);
    let pooled = run_script(p.port(), &bytes, false);
    assert!(
        direct.1
            && direct
                .0
                .last()
                .is_some_and(|e| e.starts_with("FATAL 25P03 ")),
        "{direct:?}"
    );
    assert_eq!(direct, pooled, "PostgreSQL (left) vs pgcarpool (right)");
    still_serves(&p).await;
    p.shutdown().await;
}
