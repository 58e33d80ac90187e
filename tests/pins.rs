//! Pins never starve a pool: servers kept by pinned clients (temp tables, advisory locks,
//! LISTEN pgcarpool cannot answer itself, WITH HOLD cursors, own statement names) do not count against its size, up to
//! pin_pool_size; a client that would pin beyond that is told so and let go.
mod harness;
mod pool_support;

use std::time::Duration;

use harness::{Observer, TempPostgres, TestPooler};
use pool_support::{connect_watched, scalar};

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
    a.batch_execute("create temp table ta(x int)")
        .await
        .unwrap();
    b.batch_execute("select pg_advisory_lock(42)")
        .await
        .unwrap();
    // Others are served at once, by servers of the pool.
    let c = p.connect("md5user", "testdb").await;
    let d = p.connect("md5user", "testdb").await;
    let mut more = Vec::new();
    for _ in 0..14 {
        more.push(p.connect("md5user", "testdb").await);
    }
    for n in 0..20 {
        assert_eq!(
            scalar(&c, &format!("select {n}")).await.unwrap(),
            n.to_string()
        );
        assert_eq!(scalar(&d, "select 1").await.unwrap(), "1");
    }
    for (i, m) in more.iter().enumerate() {
        assert_eq!(
            scalar(m, &format!("select {i}")).await.unwrap(),
            i.to_string()
        );
    }
    // (Starved, they would have got query_wait_timeout.)
    assert!(
        obs.backends("md5user").await <= 4,
        "pool 2 + pin_pool_size 2"
    );
    // A third pin is refused, to that client only: the error answers its statement, and
    // the connection ends.
    let mut e = connect_watched(&p.dsn("md5user", "testdb")).await;
    let refused = e
        .client
        .batch_execute("create temp table te(x int)")
        .await
        .expect_err("a pin past pin_pool_size");
    let why = harness::error_text(&refused);
    assert!(why.starts_with("53300 too many pinned clients"), "{why}");
    e.events.closed_within(Duration::from_secs(5)).await;
    assert_eq!(scalar(&c, "select 2").await.unwrap(), "2");
    // The pinned clients still have what they pinned.
    a.batch_execute("insert into ta values (1)").await.unwrap();
    assert_eq!(scalar(&a, "select count(*) from ta").await.unwrap(), "1");
    // Unpinned: the budget is free again.
    a.batch_execute("drop table ta").await.unwrap();
    let f = p.connect("md5user", "testdb").await;
    f.batch_execute("create temp table tf(x int)")
        .await
        .unwrap();
    f.batch_execute("insert into tf values (1)").await.unwrap();
    assert_eq!(scalar(&f, "select count(*) from tf").await.unwrap(), "1");
    drop((b, c, d, f));
    p.shutdown().await;
}

/// A client driven by hand: its notifications are counted as they come.
async fn listener(
    dsn: &str,
) -> (
    tokio_postgres::Client,
    tokio::sync::mpsc::UnboundedReceiver<(i32, String)>,
) {
    use futures_util_free::poll_message;
    let (client, mut conn) = tokio_postgres::connect(dsn, tokio_postgres::NoTls)
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(m) = poll_message(&mut conn).await {
            if let Ok(tokio_postgres::AsyncMessage::Notification(n)) = m {
                let _ = tx.send((n.process_id(), n.payload().to_string()));
            }
        }
    });
    (client, rx)
}

mod futures_util_free {
    use std::future::poll_fn;
    pub async fn poll_message<S, T>(
        c: &mut tokio_postgres::Connection<S, T>,
    ) -> Option<Result<tokio_postgres::AsyncMessage, tokio_postgres::Error>>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        poll_fn(|cx| c.poll_message(cx)).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listening_client_gets_every_notification_once() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "3")
        .start()
        .await;
    let (l, mut got) = listener(&p.dsn("md5user", "testdb")).await;
    l.batch_execute("LISTEN ch").await.unwrap();
    let my_pid: i32 = scalar(&l, "select \"pg_backend_pid\"()")
        .await
        .unwrap()
        .parse()
        .unwrap();
    const SENDERS: usize = 16;
    const EACH: usize = 25;
    let mut tasks = Vec::new();
    for s in 0..SENDERS {
        let c = p.connect("md5user", "testdb").await;
        tasks.push(tokio::spawn(async move {
            for k in 0..EACH {
                c.batch_execute(&format!("select pg_notify('ch', 's{s}-{k}')"))
                    .await
                    .unwrap();
            }
        }));
    }
    // Meanwhile the listener keeps running transactions of its own (each followed by
    // pgcarpool's pin check on its server), and notifies itself.
    for k in 0..100 {
        l.batch_execute(&format!("select pg_notify('ch', 'self-{k}')"))
            .await
            .unwrap();
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut seen = std::collections::HashMap::new();
    let want = SENDERS * EACH + 100;
    while seen.len() < want {
        match tokio::time::timeout(Duration::from_secs(5), got.recv()).await {
            Ok(Some((pid, payload))) => {
                if payload.starts_with("self-") {
                    // The pid the client was given (session_oracle checks it is), not
                    // the server's.
                    assert_ne!(pid, my_pid, "a self-notification carries the server's pid");
                }
                *seen.entry(payload).or_insert(0) += 1;
            }
            _ => break,
        }
    }
    assert_eq!(seen.len(), want, "notifications received");
    assert!(seen.values().all(|n| *n == 1), "each exactly once");
    p.shutdown().await;
}

/// The rows of SHOW PINS: (client id, reasons).
async fn show_pins(admin: &tokio_postgres::Client) -> Vec<String> {
    admin
        .simple_query("SHOW PINS")
        .await
        .unwrap()
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => {
                Some(r.get("reasons").unwrap_or("").to_string())
            }
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_pin_is_made_and_released_as_its_state_comes_and_goes() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "2")
        .start()
        .await;
    let admin = p.connect("postgres", "pgbouncer").await;
    let c = p.connect("md5user", "testdb").await;
    let other = p.connect("md5user", "testdb").await;
    for (reason, make, release) in [
        ("temp table", "create temp table tt(x int)", "drop table tt"),
        (
            "advisory lock",
            "select pg_advisory_lock(7)",
            "select pg_advisory_unlock(7)",
        ),
        // A LISTEN pins nothing: the pool's listener takes its channels (tests/notify.rs).
        (
            "with hold cursor",
            "begin; declare cur cursor with hold for select 1; commit",
            "close cur",
        ),
        (
            "prepared statement",
            "PREPARE a AS select 1; PREPARE b AS select 2",
            "DEALLOCATE a; DEALLOCATE b",
        ),
    ] {
        assert!(show_pins(&admin).await.is_empty(), "before {reason}");
        c.batch_execute(make).await.unwrap();
        let pid = scalar(&c, "select \"pg_backend_pid\"()").await.unwrap();
        // Another client's transactions do not get that server meanwhile.
        for _ in 0..5 {
            assert_ne!(
                scalar(&other, "select \"pg_backend_pid\"()").await.unwrap(),
                pid
            );
        }
        assert_eq!(show_pins(&admin).await, [reason], "after: {make}");
        assert_eq!(
            scalar(&c, "select \"pg_backend_pid\"()").await.unwrap(),
            pid
        );
        c.batch_execute(release).await.unwrap();
        assert!(show_pins(&admin).await.is_empty(), "after: {release}");
    }
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_refused_a_pin_reports_why() {
    use harness::{clients_dir, install_python_clients, output_text};
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "2")
        .setting("pin_pool_size", "1")
        .start()
        .await;
    // Three psycopg clients each take an advisory lock: the first keeps its server, the
    // others are refused, and psycopg reports pgcarpool's FATAL for the statement itself
    // (not, later, "server closed the connection unexpectedly").
    let port = p.port().to_string();
    let out = tokio::task::spawn_blocking(move || {
        install_python_clients();
        std::process::Command::new(clients_dir().join("python/.venv/bin/python"))
            .arg(clients_dir().join("python/pin_refused.py"))
            .args(["127.0.0.1", &port, "md5user", "md5pass", "testdb", "3"])
            .output()
            .expect("run pin_refused.py")
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{}", output_text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let refused = "53300 too many pinned clients: advisory lock would keep a server, \
                   and pin_pool_size (1) servers are kept already";
    let want = vec![
        "ok 0".to_string(),
        format!("error 1 {refused}"),
        format!("error 2 {refused}"),
    ];
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        want,
        "{}",
        output_text(&out)
    );
    p.shutdown().await;
}

/// SHOW CARPOOL `server_logins` of the testdb/md5user pool.
async fn server_logins(admin: &tokio_postgres::Client) -> u64 {
    let rows = admin.simple_query("SHOW CARPOOL").await.unwrap();
    rows.iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r)
                if r.get("database") == Some("testdb") && r.get("user") == Some("md5user") =>
            {
                r.get("server_logins").map(|n| n.parse().unwrap())
            }
            _ => None,
        })
        .expect("the testdb pool's row")
}

/// A server a pin took and gave back is kept for the next pin, not closed as one too many
/// while the pin's replacement stays: 20 clients that take a session advisory lock, run a
/// query and unlock, one after the other, 3 rounds, beside 8 clients keeping a pool of 4
/// busy, cost a few server logins, not one per pin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pins_in_turn_beside_a_busy_pool_reuse_their_servers() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "4")
        .setting("pin_pool_size", "4")
        .start()
        .await;
    let admin = p.connect("postgres", "pgbouncer").await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut busy = Vec::new();
    for _ in 0..8 {
        let c = p.connect("md5user", "testdb").await;
        let stop = stop.clone();
        busy.push(tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                c.batch_execute("select pg_sleep(0.002)").await.unwrap();
            }
        }));
    }
    let obs = Observer::new(&pg).await;
    harness::wait_for("the pool's 4 servers", Duration::from_secs(20), || async {
        obs.backends("md5user").await >= 4
    })
    .await;
    let mut pinning = Vec::new();
    for _ in 0..20 {
        pinning.push(p.connect("md5user", "testdb").await);
    }
    let before = server_logins(&admin).await;
    assert!(before >= 4, "the pool's servers are counted: {before}");
    for round in 0..3 {
        for (i, c) in pinning.iter().enumerate() {
            c.batch_execute(&format!("select pg_advisory_lock({i})"))
                .await
                .unwrap();
            if round == 0 && i == 0 {
                assert_eq!(show_pins(&admin).await, ["advisory lock"]);
            }
            assert_eq!(scalar(c, "select 1").await.unwrap(), "1");
            c.batch_execute(&format!("select pg_advisory_unlock({i})"))
                .await
                .unwrap();
        }
    }
    let logins = server_logins(&admin).await - before;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for b in busy {
        b.await.unwrap();
    }
    assert!(logins <= 8, "60 pins cost {logins} server logins");
    assert!(show_pins(&admin).await.is_empty());
    p.shutdown().await;
}
