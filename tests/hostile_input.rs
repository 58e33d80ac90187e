//! Bytes no client should send: each gets an error or a closed connection, the pooler does
//! not panic, and other clients are not affected.
mod harness;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use harness::{TempPostgres, TestPooler};

fn raw(p: &TestPooler) -> TcpStream {
    let s = TcpStream::connect(p.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Read until EOF (or a reset), bounded by the read timeout; returns what came.
fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
}

fn startup(user: &str, db: &str) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&196_608i32.to_be_bytes());
    for (k, v) in [("user", user), ("database", db)] {
        body.extend_from_slice(k.as_bytes());
        body.push(0);
        body.extend_from_slice(v.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut out = ((body.len() + 4) as i32).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

/// A logged-in raw connection (auth_type = trust), positioned after ReadyForQuery.
fn logged_in(p: &TestPooler) -> TcpStream {
    let mut s = raw(p);
    s.write_all(&startup("postgres", "testdb")).unwrap();
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
    for bytes in cases {
        let mut s = raw(&p);
        s.write_all(&bytes).unwrap();
        let _ = s.shutdown(std::net::Shutdown::Write);
        let _ = read_to_close(&mut s);
    }
    // Deterministic garbage.
    let mut x: u32 = 12345;
    for _ in 0..20 {
        let mut bytes = Vec::new();
        for _ in 0..64 {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            bytes.push((x >> 16) as u8);
        }
        let mut s = raw(&p);
        let _ = s.write_all(&bytes);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let _ = read_to_close(&mut s);
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
    for msg in [
        &b"Q\xff\xff\xff\xff"[..], // negative length
        &b"Q\0\0\0\x02"[..],       // length below 4
        &b"P\x7f\xff\xff\xff"[..], // a Parse of 2 GiB
        &b"P\0\0\0\x08ab\0\0"[..], // a Parse missing its parameter count
        &b"B\0\0\0\x06\0\0"[..],   // a Bind cut short
        &b"C\0\0\0\x05S"[..],      // a Close without a name
    ] {
        let mut s = logged_in(&p);
        s.write_all(msg).unwrap();
        s.write_all(b"S\0\0\0\x04").unwrap();
        let _ = s.shutdown(std::net::Shutdown::Write);
        let _ = read_to_close(&mut s);
    }
    // The bystander's transaction and the pool are untouched.
    let r = bystander.query_one("select 1", &[]).await.unwrap();
    assert_eq!(r.get::<_, i32>(0), 1);
    bystander.batch_execute("COMMIT").await.unwrap();
    still_serves(&p).await;
    let idle_in_tx =
        pg.psql("select count(*) from pg_stat_activity where state = 'idle in transaction'");
    assert_eq!(idle_in_tx, "0");
    p.shutdown().await;
}
