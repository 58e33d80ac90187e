//! PHP PDO's pattern in transaction mode: a protocol-level Parse under a name, then SQL
//! `DEALLOCATE name`. Its own test binary: tokio-postgres names statements s0, s1, … from a
//! process-wide counter, so the first statement prepared here is `s0`.
mod harness;

use harness::{TempPostgres, TestPooler};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deallocate_by_name_after_protocol_parse_works() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "2")
        .start()
        .await;
    let c = p.connect("md5user", "testdb").await;
    let s = c.prepare("select 1").await.unwrap();
    assert_eq!(c.query_one(&s, &[]).await.unwrap().get::<_, i32>(0), 1);
    c.batch_execute("DEALLOCATE s0").await.unwrap();
    let err = c.batch_execute("DEALLOCATE s0").await.unwrap_err();
    assert_eq!(harness::sqlstate(&err), Some("26000"));
    // Inside a transaction (server attached) too.
    let s = c.prepare("select 2").await.unwrap();
    c.batch_execute("BEGIN").await.unwrap();
    assert_eq!(c.query_one(&s, &[]).await.unwrap().get::<_, i32>(0), 2);
    c.batch_execute("DEALLOCATE s1").await.unwrap();
    c.batch_execute("COMMIT").await.unwrap();
    let err = c.batch_execute("DEALLOCATE s1").await.unwrap_err();
    assert_eq!(harness::sqlstate(&err), Some("26000"));
    p.shutdown().await;
}

/// An idle client's `DEALLOCATE name` of a statement it parsed with the protocol (any
/// case, after a comment) is answered without a server: with the pool's only server held
/// by another client's transaction it still completes, where a query that needs a server
/// waits out query_wait_timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_clients_deallocate_needs_no_server() {
    use harness::wire::{Wire, message};
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("auth_type", "trust")
        .setting("default_pool_size", "1")
        .setting("query_wait_timeout", "2")
        .start()
        .await;
    let mut w = Wire::connect(p.port(), "postgres", "testdb").await;
    w.send(&[message(b'P', b"pdo_a\0select 1\0\0\0"), message(b'S', b"")].concat())
        .await;
    let tags: Vec<u8> = w.until_ready(1).await.iter().map(|(t, _)| *t).collect();
    assert_eq!(tags, b"1Z");
    let holder = p.connect("postgres", "testdb").await;
    holder.batch_execute("BEGIN; SELECT 1").await.unwrap();
    w.send(&message(b'Q', b"/* PDO */ deallocate pdo_a\0"))
        .await;
    let tags: Vec<u8> = w.until_ready(1).await.iter().map(|(t, _)| *t).collect();
    assert_eq!(tags, b"CZ", "answered without the held server");
    // The pool's server is held: a query that needs one waits, then fails.
    let other = p.connect("postgres", "testdb").await;
    let err = other.batch_execute("SELECT 1").await.unwrap_err();
    assert_eq!(harness::sqlstate(&err), Some("08P01"), "{err}");
    holder.batch_execute("COMMIT").await.unwrap();
    w.terminate().await;
    p.shutdown().await;
}
