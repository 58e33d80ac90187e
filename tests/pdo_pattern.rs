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
