//! Pins never starve a pool: servers kept by pinned clients (temp tables, advisory locks,
//! LISTEN, WITH HOLD cursors, own statement names) do not count against its size, up to
//! pin_pool_size; a client that would pin beyond that is told so and let go.
mod harness;
mod pool_support;

use std::time::Duration;

use harness::{TempPostgres, TestPooler};
use pool_support::{Observer, connect_watched, scalar};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_clients_do_not_take_the_pools_servers() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "2")
        .setting("pin_pool_size", "2")
        .setting("query_wait_timeout", "5")
        .start()
        .await;
    let obs = Observer::new(&pg).await;
    // Two clients pin a server each (more than the pool's size would allow to share).
    let a = p.connect("md5user", "testdb").await;
    let b = p.connect("md5user", "testdb").await;
    a.batch_execute("create temp table ta(x int)").await.unwrap();
    b.batch_execute("select pg_advisory_lock(42)").await.unwrap();
    // Others are served at once, by servers of the pool.
    let c = p.connect("md5user", "testdb").await;
    let d = p.connect("md5user", "testdb").await;
    let started = std::time::Instant::now();
    for n in 0..20 {
        assert_eq!(scalar(&c, &format!("select {n}")).await.unwrap(), n.to_string());
        assert_eq!(scalar(&d, "select 1").await.unwrap(), "1");
    }
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "clients waited for pinned servers: {:?}",
        started.elapsed()
    );
    assert!(obs.backends("md5user").await <= 4, "pool 2 + pin_pool_size 2");
    // A third pin is refused, to that client only.
    let mut e = connect_watched(&p.dsn("md5user", "testdb")).await;
    let _ = e.client.batch_execute("create temp table te(x int)").await;
    let why = e.events.closed_within(Duration::from_secs(5)).await;
    assert!(why.starts_with("53300 too many pinned clients"), "{why}");
    assert_eq!(scalar(&c, "select 2").await.unwrap(), "2");
    // The pinned clients still have what they pinned.
    a.batch_execute("insert into ta values (1)").await.unwrap();
    assert_eq!(scalar(&a, "select count(*) from ta").await.unwrap(), "1");
    // Unpinned: the budget is free again.
    a.batch_execute("drop table ta").await.unwrap();
    let f = p.connect("md5user", "testdb").await;
    f.batch_execute("create temp table tf(x int)").await.unwrap();
    f.batch_execute("insert into tf values (1)").await.unwrap();
    assert_eq!(scalar(&f, "select count(*) from tf").await.unwrap(), "1");
    drop((b, c, d, f));
    p.shutdown().await;
}
