//! LISTEN/NOTIFY in transaction mode without pins: one shared listener connection per pool
//! fans notifications out, and every client receives what its own PostgreSQL session would
//! (PostgreSQL is the oracle), bounded per client, and is told when the listener is lost.
mod harness;
mod pool_support;

use std::future::poll_fn;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use harness::wire::Wire;
use harness::{Observer, TempPostgres, TestPooler, transaction_pooler, wait_for};
use pool_support::{connect_watched, scalar};
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, Client, NoTls};

/// A notification as a client saw it: (pid, channel, payload).
type Note = (i32, String, String);

/// Connect and forward the connection's notifications (and its end) to a channel.
async fn listener_client(dsn: &str) -> (Arc<Client>, mpsc::UnboundedReceiver<Option<Note>>) {
    let (client, mut conn) = tokio_postgres::connect(dsn, NoTls).await.unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(m) = poll_fn(|cx| conn.poll_message(cx)).await {
            match m {
                Ok(AsyncMessage::Notification(n)) => {
                    let note = (
                        n.process_id(),
                        n.channel().to_string(),
                        n.payload().to_string(),
                    );
                    let _ = tx.send(Some(note));
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        let _ = tx.send(None);
    });
    (Arc::new(client), rx)
}

const CHANNELS: usize = 20;
const CLIENTS: usize = 200;
const WRITERS: usize = 20;
/// NOTIFY statements per writer and phase: 2 phases × 20 writers × 250 = the 10,000.
const EACH: usize = 250;

/// The channels client `i` listens on (besides `fin`).
fn channels_of(i: usize) -> [String; 2] {
    [
        format!("ch{}", i % CHANNELS),
        format!("ch{}", (i * 3 + 1) % CHANNELS),
    ]
}

/// The whole script against `port` (PostgreSQL itself or pgcarpool): every client's
/// notifications in the order received (the `fin` marker left out).
async fn run_script(dsn: impl Fn() -> String) -> Vec<Vec<Note>> {
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(listener_client(&dsn()).await);
    }
    let mut writers = Vec::new();
    for _ in 0..WRITERS {
        writers.push(Arc::new(tokio_postgres_connect(&dsn()).await));
    }
    // Phase 1: LISTEN in both protocols; some LISTENs in a transaction block rolled back.
    let mut tasks = Vec::new();
    for (i, (c, _)) in clients.iter().enumerate() {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let [a, b] = channels_of(i);
            if i % 5 == 0 {
                c.batch_execute("BEGIN").await.unwrap();
                c.batch_execute(&format!("LISTEN {b}")).await.unwrap();
                c.batch_execute("ROLLBACK").await.unwrap();
            } else if i % 2 == 0 {
                c.query_typed(&format!("LISTEN {b}"), &[]).await.unwrap();
            } else {
                c.batch_execute(&format!("LISTEN {b}")).await.unwrap();
            }
            c.batch_execute(&format!("LISTEN {a}; ")).await.unwrap();
            c.batch_execute("LISTEN fin").await.unwrap();
        }));
    }
    join(tasks).await;
    write_phase(&writers, "one").await;
    // Phase 3: some clients UNLISTEN one channel, some everything (and take fin back).
    let mut tasks = Vec::new();
    for (i, (c, _)) in clients.iter().enumerate() {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let [a, _] = channels_of(i);
            match i % 3 {
                0 => c.batch_execute(&format!("UNLISTEN {a}")).await.unwrap(),
                1 if i % 4 == 1 => {
                    c.query_typed("UNLISTEN *", &[]).await.unwrap();
                    c.batch_execute("LISTEN fin").await.unwrap();
                }
                _ => {}
            }
        }));
    }
    join(tasks).await;
    write_phase(&writers, "two").await;
    writers[0].batch_execute("NOTIFY fin, 'end'").await.unwrap();
    let mut out = Vec::new();
    for (_, mut rx) in clients {
        let mut got = Vec::new();
        loop {
            let note = tokio::time::timeout(Duration::from_secs(60), rx.recv())
                .await
                .expect("no fin within 60 s")
                .flatten()
                .expect("connection ended before fin");
            if note.1 == "fin" {
                break;
            }
            got.push(note);
        }
        out.push(got);
    }
    out
}

async fn tokio_postgres_connect(dsn: &str) -> Client {
    let (c, conn) = tokio_postgres::connect(dsn, NoTls).await.unwrap();
    tokio::spawn(conn);
    c
}

/// One phase of NOTIFYs from every writer at once: some rolled back, some twice in one
/// transaction (folded), some through pg_notify(), some in a transaction block.
async fn write_phase(writers: &[Arc<Client>], phase: &str) {
    let mut tasks = Vec::new();
    for (w, c) in writers.iter().enumerate() {
        let c = c.clone();
        let phase = phase.to_string();
        tasks.push(tokio::spawn(async move {
            for k in 0..EACH {
                let ch = format!("ch{}", (w + k) % CHANNELS);
                let p = format!("w{w}-{phase}-{k}");
                let sql = match k % 6 {
                    0 => format!("BEGIN; NOTIFY {ch}, '{p}'; ROLLBACK"),
                    1 => format!("BEGIN; NOTIFY {ch}, '{p}'; NOTIFY {ch}, '{p}'; COMMIT"),
                    2 => format!("select pg_notify('{ch}', '{p}')"),
                    3 => {
                        c.batch_execute("BEGIN").await.unwrap();
                        c.batch_execute(&format!("NOTIFY {ch}, '{p}'"))
                            .await
                            .unwrap();
                        "COMMIT".to_string()
                    }
                    _ => format!("NOTIFY {ch}, '{p}'"),
                };
                c.batch_execute(&sql).await.unwrap();
            }
        }));
    }
    join(tasks).await;
}

async fn join(tasks: Vec<tokio::task::JoinHandle<()>>) {
    for t in tasks {
        t.await.unwrap();
    }
}

/// Client's notifications from writer `w`, in order (payloads).
fn from_writer(notes: &[Note], w: usize) -> Vec<&str> {
    let prefix = format!("w{w}-");
    notes
        .iter()
        .filter(|n| n.2.starts_with(&prefix))
        .map(|n| n.2.as_str())
        .collect()
}

/// Every two clients see the notifications they both receive in the same order (commit
/// order is one order).
fn assert_one_order(all: &[Vec<Note>]) {
    let sets: Vec<std::collections::HashSet<&str>> = all
        .iter()
        .map(|v| v.iter().map(|n| n.2.as_str()).collect())
        .collect();
    for i in 0..all.len() {
        for j in i + 1..all.len() {
            let a: Vec<&str> = all[i]
                .iter()
                .map(|n| n.2.as_str())
                .filter(|p| sets[j].contains(p))
                .collect();
            let b: Vec<&str> = all[j]
                .iter()
                .map(|n| n.2.as_str())
                .filter(|p| sets[i].contains(p))
                .collect();
            assert_eq!(
                a, b,
                "clients {i} and {j} saw common notifications in another order"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_client_receives_what_its_own_session_would() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("default_pool_size", "2")
        .setting("max_client_conn", "400")
        .start()
        .await;
    let obs = Observer::new(&pg).await;
    let direct = run_script(|| pg.dsn("md5user", "testdb")).await;
    wait_for(
        "the direct run's sessions to end",
        Duration::from_secs(30),
        || async { obs.backends("md5user").await == 0 },
    )
    .await;
    // PostgreSQL's side during the pooled run, sampled.
    let stop = Arc::new(AtomicBool::new(false));
    let most = Arc::new(AtomicI64::new(0));
    let sampler = {
        let (stop, most) = (stop.clone(), most.clone());
        let obs = Observer::new(&pg).await;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                most.fetch_max(obs.backends("md5user").await, Ordering::Relaxed);
            }
        })
    };
    let pooled = run_script(|| p.dsn("md5user", "testdb")).await;
    stop.store(true, Ordering::Relaxed);
    sampler.await.unwrap();
    let total: usize = direct.iter().map(Vec::len).sum();
    assert!(total > 1000, "the script delivers notifications: {total}");
    for (i, (d, g)) in direct.iter().zip(&pooled).enumerate() {
        for w in 0..WRITERS {
            assert_eq!(
                from_writer(d, w),
                from_writer(g, w),
                "client {i}, writer {w}"
            );
        }
        assert_eq!(d.len(), g.len(), "client {i}: nothing else");
    }
    assert_one_order(&pooled);
    // Each writer's notifications carry one pid, its own (not the pool's servers').
    for run in [&direct, &pooled] {
        let mut pids: Vec<std::collections::HashSet<i32>> = vec![Default::default(); WRITERS];
        for n in run.iter().flatten() {
            let w: usize = n.2[1..n.2.find('-').unwrap()].parse().unwrap();
            pids[w].insert(n.0);
        }
        assert!(pids.iter().all(|p| p.len() == 1), "{pids:?}");
        let all: std::collections::HashSet<i32> = pids.iter().flatten().copied().collect();
        assert_eq!(all.len(), WRITERS, "one pid per writer");
    }
    let most = most.load(Ordering::Relaxed);
    assert!(
        most <= 3,
        "pool size 2 + the listener: PostgreSQL saw {most}"
    );
    assert!(most >= 1, "the sampler saw the pool");
    p.shutdown().await;
}

/// The steps of one client, run straight on PostgreSQL and through pgcarpool: the same
/// transcript, and the pooled client's own notifications carry its own pid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_unlisten_and_pg_listening_channels_answer_as_postgresql_in_both_protocols() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("auth_type", "trust")
        .setting("default_pool_size", "1")
        .start()
        .await;
    let steps = [
        "Q LISTEN a",
        "P |LISTEN \"B b\"\nB ||\nD P \nE \nS",
        "P |LISTEN c\nB ||\nE \nS",
        // Prepared by name first, then bound (asyncpg's add_listener).
        "P s1|LISTEN named\nD S s1\nS",
        "B |s1|\nE \nS",
        "B |s1|\nD P \nE \nS",
        // Parse, Describe and Flush, then Bind, Execute and Sync (asyncpg's fetch).
        "P s3|LISTEN flushed\nD S s3\nH",
        "B |s3|\nE \nS",
        "Q select pg_listening_channels()",
        "P |select pg_listening_channels()\nB ||\nD P \nE \nS",
        "P |select * from pg_catalog.pg_listening_channels()\nD S \nB ||\nE \nS",
        "Q NOTIFY a, 'to me'",
        "Q BEGIN",
        "Q select pg_notify('B b', 'in a block')",
        "Q COMMIT",
        "Q UNLISTEN a",
        "Q LISTEN a; ",
        "Q select * from pg_listening_channels()",
        "P |UNLISTEN c\nB ||\nD P \nE \nS",
        "Q UNLISTEN nothing",
        "P s2|UNLISTEN named\nS",
        "B |s2|\nD P \nE \nS",
        "Q select pg_listening_channels()",
        "Q DISCARD ALL",
        "Q select pg_listening_channels()",
        "Q NOTIFY a, 'nobody'",
        "Q LISTEN a",
        "Q UNLISTEN *",
        "Q select pg_listening_channels()",
        "Q LISTEN \"\"",
    ];
    let mut seen = Vec::new();
    for port in [pg.port(), p.port()] {
        let mut w = Wire::connect(port, "postgres", "testdb").await;
        let mut t = Vec::new();
        for s in steps {
            t.push(w.step(s).await);
        }
        assert_eq!(w.notify_pids, vec![w.pid, w.pid], "port {port}: own pid");
        seen.push(t);
    }
    for (k, (d, g)) in seen[0].iter().zip(&seen[1]).enumerate() {
        assert_eq!(d, g, "step {k}: {}", steps[k]);
    }
    let first = steps
        .iter()
        .position(|s| *s == "Q select pg_listening_channels()")
        .unwrap();
    assert!(
        seen[1][first].contains(&"Row named".to_string()),
        "{:?}",
        seen[1][first]
    );
    // No server was kept for the client: the pool's one server serves another client.
    let admin = p.connect("postgres", "pgbouncer").await;
    let pins = admin.simple_query("SHOW PINS").await.unwrap();
    assert!(
        !pins
            .iter()
            .any(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(_))),
        "no pin"
    );
    p.shutdown().await;
}

/// A client whose socket is read only while `reading` says so: its notifications (and how
/// its connection ended) on the channel.
async fn pausable_client(
    dsn: &str,
) -> (
    Client,
    tokio::sync::watch::Sender<bool>,
    mpsc::UnboundedReceiver<Result<Note, String>>,
) {
    let (client, mut conn) = tokio_postgres::connect(dsn, NoTls).await.unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let (reading, mut watch) = tokio::sync::watch::channel(true);
    tokio::spawn(async move {
        loop {
            if !*watch.borrow_and_update() {
                if watch.changed().await.is_err() {
                    return;
                }
                continue;
            }
            tokio::select! {
                m = poll_fn(|cx| conn.poll_message(cx)) => match m {
                    Some(Ok(AsyncMessage::Notification(n))) => {
                        let note = (n.process_id(), n.channel().into(), n.payload().into());
                        let _ = tx.send(Ok(note));
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        let _ = tx.send(Err(pool_support::error_text(&e)));
                        return;
                    }
                    None => {
                        let _ = tx.send(Err(String::new()));
                        return;
                    }
                },
                _ = watch.changed() => {}
            }
        }
    });
    (client, reading, rx)
}

/// Rows of SHOW CLIENTS for `user`.
async fn clients_of(admin: &Client, user: &str) -> usize {
    admin
        .simple_query("SHOW CLIENTS")
        .await
        .unwrap()
        .iter()
        .filter(|m| {
            matches!(m, tokio_postgres::SimpleQueryMessage::Row(r) if r.get("user") == Some(user))
        })
        .count()
}

const CHUNK: usize = 200;
const CHUNKS: usize = 20;
const BIG: usize = CHUNK * CHUNKS;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_past_notify_queue_limit_is_told_and_let_go_others_are_not() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("default_pool_size", "2")
        .setting("notify_queue_limit", "2097152")
        .start()
        .await;
    let dsn = p.dsn("md5user", "testdb");
    let admin = p.connect("postgres", "pgbouncer").await;
    // One reads everything; one stops reading its socket; one waits in a transaction block
    // (nothing is delivered there).
    let (good, mut good_rx) = listener_client(&dsn).await;
    good.batch_execute("LISTEN big").await.unwrap();
    let (slow, reading, mut slow_rx) = pausable_client(&dsn).await;
    slow.batch_execute("LISTEN big").await.unwrap();
    let mut in_block = connect_watched(&dsn).await;
    in_block.client.batch_execute("LISTEN big").await.unwrap();
    in_block.client.batch_execute("BEGIN").await.unwrap();
    reading.send(false).unwrap();
    // 28 MB of notifications, 1.4 MB per transaction, each sent once the reading client
    // has the one before (its backlog stays under the limit).
    let writer = p.connect("md5user", "testdb").await;
    let before = clients_of(&admin, "md5user").await;
    for chunk in 0..CHUNKS {
        writer
            .batch_execute(&format!(
                "select pg_notify('big', lpad(g::text, 7000, 'x')) \
                 from generate_series({}, {}) g",
                chunk * CHUNK + 1,
                (chunk + 1) * CHUNK
            ))
            .await
            .unwrap();
        for n in chunk * CHUNK..(chunk + 1) * CHUNK {
            let note = tokio::time::timeout(Duration::from_secs(60), good_rx.recv())
                .await
                .expect("the reading client gets every notification")
                .flatten()
                .expect("the reading client stays");
            assert_eq!(note.2, format!("{:x>7000}", n + 1));
        }
    }
    // The client that does not read is let go…
    wait_for(
        "the client that does not read to be let go",
        Duration::from_secs(30),
        || async { clients_of(&admin, "md5user").await < before },
    )
    .await;
    reading.send(true).unwrap();
    let mut got = 0;
    let end = loop {
        match tokio::time::timeout(Duration::from_secs(30), slow_rx.recv()).await {
            Ok(Some(Ok(_))) => got += 1,
            Ok(Some(Err(why))) => break why,
            other => panic!("the slow client's connection did not end: {other:?}"),
        }
    };
    assert!(got < BIG, "it was not sent everything: {got}");
    // What it reads last depends on when it reads again: the FATAL if within the 2 s a
    // FATAL is given to be written, else the connection's end in the middle of a message.
    assert!(
        end.starts_with("54000 too many notifications queued")
            || end.starts_with("client: error communicating with the server")
            || end.is_empty(),
        "{end}"
    );
    // …and the one in a transaction block learns why when its transaction ends.
    in_block.client.batch_execute("COMMIT").await.unwrap();
    let why = in_block.events.closed_within(Duration::from_secs(10)).await;
    assert_eq!(
        why,
        "54000 too many notifications queued for this client: notify_queue_limit is 2097152 bytes"
    );
    // The reading client goes on as before.
    writer.batch_execute("NOTIFY big, 'after'").await.unwrap();
    let note = tokio::time::timeout(Duration::from_secs(10), good_rx.recv())
        .await
        .unwrap()
        .flatten()
        .unwrap();
    assert_eq!(note.2, "after");
    assert_eq!(scalar(&good, "select 1").await.unwrap(), "1");
    p.shutdown().await;
}

/// The listener's server connection is terminated: every listening client's connection
/// ends with the server's error, as a session of its own would; the next LISTEN gets a
/// new listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_listener_ends_listening_clients_with_the_servers_error() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("default_pool_size", "2")
        .start()
        .await;
    let obs = Observer::new(&pg).await;
    let mut ends = Vec::new();
    for dsn in [pg.dsn("md5user", "testdb"), p.dsn("md5user", "testdb")] {
        let mut a = connect_watched(&dsn).await;
        a.client.batch_execute("LISTEN lost").await.unwrap();
        let other = tokio_postgres_connect(&dsn).await;
        // The backend that listens: the client's own, or pgcarpool's listener.
        let killed: i64 = obs
            .count(
                "usename = 'md5user' and query like 'LISTEN%' and pg_terminate_backend(pid)",
                &[],
            )
            .await;
        assert_eq!(killed, 1);
        ends.push(a.events.closed_within(Duration::from_secs(10)).await);
        // Clients that did not listen are not affected.
        assert_eq!(scalar(&other, "select 1").await.unwrap(), "1");
        // The terminated backend has left pg_stat_activity before the next round counts.
        wait_for(
            "the terminated LISTEN backend gone",
            Duration::from_secs(10),
            || async {
                obs.count("usename = 'md5user' and query like 'LISTEN%'", &[])
                    .await
                    == 0
            },
        )
        .await;
    }
    assert_eq!(
        ends[0],
        "57P01 terminating connection due to administrator command"
    );
    assert_eq!(ends[1], ends[0]);
    // A new listener for the next client that listens.
    let (c, mut rx) = listener_client(&p.dsn("md5user", "testdb")).await;
    c.batch_execute("LISTEN lost").await.unwrap();
    let writer = p.connect("md5user", "testdb").await;
    writer.batch_execute("NOTIFY lost, 'again'").await.unwrap();
    let note = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap()
        .flatten()
        .unwrap();
    assert_eq!((note.1.as_str(), note.2.as_str()), ("lost", "again"));
    p.shutdown().await;
}

/// Notifications are never delivered inside a transaction block: they wait for its end,
/// straight from PostgreSQL as through pgcarpool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_delivered_inside_a_transaction_block() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("default_pool_size", "2")
        .start()
        .await;
    for dsn in [pg.dsn("md5user", "testdb"), p.dsn("md5user", "testdb")] {
        let (a, mut a_rx) = listener_client(&dsn).await;
        let (b, mut b_rx) = listener_client(&dsn).await;
        a.batch_execute("LISTEN blk").await.unwrap();
        b.batch_execute("LISTEN blk").await.unwrap();
        a.batch_execute("BEGIN").await.unwrap();
        b.batch_execute("NOTIFY blk, 'x'").await.unwrap();
        // b has it (it is out there), a inside its block has not.
        let got = tokio::time::timeout(Duration::from_secs(10), b_rx.recv()).await;
        assert_eq!(got.unwrap().flatten().unwrap().2, "x");
        assert_eq!(scalar(&a, "select 1").await.unwrap(), "1");
        assert!(a_rx.try_recv().is_err(), "{dsn}: delivered inside a block");
        a.batch_execute("COMMIT").await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(10), a_rx.recv()).await;
        assert_eq!(got.unwrap().flatten().unwrap().2, "x", "{dsn}");
    }
    p.shutdown().await;
}

/// Session mode: the client has its own server, which listens itself (as before); no
/// listener connection is opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_session_mode_the_clients_own_server_listens() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "session")
        .setting("default_pool_size", "2")
        .start()
        .await;
    let obs = Observer::new(&pg).await;
    let dsn = p.dsn("md5user", "testdb");
    let (a, mut rx) = listener_client(&dsn).await;
    a.batch_execute("LISTEN sess").await.unwrap();
    let own = scalar(&a, "select \"pg_backend_pid\"()").await.unwrap();
    let listening = obs
        .count("usename = 'md5user' and query like 'LISTEN%'", &[])
        .await;
    assert_eq!(
        listening, 0,
        "no listener: the server ran select \"pg_backend_pid\"() last"
    );
    assert_eq!(
        scalar(&a, "select pg_listening_channels()").await.unwrap(),
        "sess"
    );
    let w = p.connect("md5user", "testdb").await;
    w.batch_execute("NOTIFY sess, 's'").await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap()
        .flatten()
        .unwrap();
    assert_eq!(got.2, "s");
    assert_eq!(obs.backends("md5user").await, 2, "one server per client");
    let _ = own;
    p.shutdown().await;
}

/// LISTEN where pgcarpool does not answer it itself (a DO block, a transaction block that
/// commits, a statement among others) runs on the server; what committed then goes to the
/// pool's listener: no pin, and the notifications come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listen_the_server_ran_goes_to_the_listener_without_a_pin() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("default_pool_size", "2")
        .start()
        .await;
    let admin = p.connect("postgres", "pgbouncer").await;
    let dsn = p.dsn("md5user", "testdb");
    let w = p.connect("md5user", "testdb").await;
    for (i, listen) in [
        "DO $$BEGIN EXECUTE 'LISTEN pinned'; END$$",
        "BEGIN; LISTEN pinned; COMMIT",
        "LISTEN pinned; select 1",
    ]
    .into_iter()
    .enumerate()
    {
        let (c, mut rx) = listener_client(&dsn).await;
        c.batch_execute(listen).await.unwrap();
        let pins = admin.simple_query("SHOW PINS").await.unwrap();
        let reasons: Vec<String> = pins
            .iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get("reasons").map(str::to_string),
                _ => None,
            })
            .collect();
        assert!(reasons.is_empty(), "{listen}: {reasons:?}");
        w.batch_execute(&format!("NOTIFY pinned, '{i}'"))
            .await
            .unwrap();
        let got = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .unwrap()
            .flatten()
            .unwrap();
        assert_eq!(got.2, i.to_string());
        c.batch_execute("UNLISTEN pinned").await.unwrap();
        drop(c);
    }
    p.shutdown().await;
}

/// A notification carries the process id its sender was given (BackendKeyData), straight
/// from PostgreSQL as through pgcarpool, whichever protocol or transaction sent it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_carries_the_pid_its_sender_was_given() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("auth_type", "trust")
        .setting("default_pool_size", "1")
        .start()
        .await;
    for port in [pg.port(), p.port()] {
        let mut a = Wire::connect(port, "postgres", "testdb").await;
        a.step("Q LISTEN pids").await;
        let mut b = Wire::connect(port, "postgres", "testdb").await;
        let mut c = Wire::connect(port, "postgres", "testdb").await;
        b.step("Q NOTIFY pids, 'simple'").await;
        c.step("P |select pg_notify('pids', 'extended')\nB ||\nE \nS")
            .await;
        b.step("Q BEGIN").await;
        b.step("Q NOTIFY pids, 'block'").await;
        b.step("Q COMMIT").await;
        let mut seen = Vec::new();
        // Delivered asynchronously: asked again until all three came (with a deadline).
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            seen.extend(a.step("Q select 1").await);
            if a.notify_pids.len() >= 3 {
                break;
            }
        }
        let notes: Vec<&String> = seen.iter().filter(|l| l.starts_with("Notify")).collect();
        assert_eq!(
            notes,
            [
                "Notify pids simple",
                "Notify pids extended",
                "Notify pids block"
            ],
            "port {port} {:?} pg {}",
            a.notify_pids,
            pg.port()
        );
        assert_eq!(a.notify_pids, vec![b.pid, c.pid, b.pid], "port {port}");
    }
    p.shutdown().await;
}

/// LISTEN where pgcarpool does not answer it itself (in a transaction block, in the
/// extended protocol as drivers send it, among other statements of a query, in a pipeline,
/// with savepoints and errors): the replies are PostgreSQL's, step by step, the channels
/// that committed are listened on, the client is not pinned and the pool keeps its size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listen_in_a_block_or_pipeline_answers_as_postgresql_without_a_pin() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("auth_type", "trust")
        .setting("default_pool_size", "1")
        .start()
        .await;
    let obs = Observer::new(&pg).await;
    let steps = [
        "Q LISTEN fin",
        // psycopg and pgx: Parse, Bind, Describe, Execute, Sync of the unnamed statement.
        "Q BEGIN",
        "P |LISTEN x1\nB ||\nD P \nE \nS",
        // tokio-postgres and JDBC: prepared by name, then bound.
        "P s1|LISTEN x2\nD S s1\nS",
        "B |s1|\nE \nS",
        "Q COMMIT",
        "Q select pg_listening_channels()",
        "Q BEGIN",
        "P |LISTEN r1\nB ||\nE \nS",
        "Q ROLLBACK",
        "Q BEGIN",
        "Q SAVEPOINT sp",
        "P |LISTEN sp1\nB ||\nE \nS",
        "Q ROLLBACK TO SAVEPOINT sp",
        "P |LISTEN sp2\nB ||\nE \nS",
        "Q COMMIT",
        "Q BEGIN; LISTEN m1; LISTEN m2; COMMIT",
        "Q LISTEN m3; select 1",
        "Q BEGIN; LISTEN e1; select 1/0; COMMIT",
        "Q ROLLBACK",
        "Q BEGIN",
        "Q select 1/0",
        "P |LISTEN f1\nB ||\nE \nS",
        "Q ROLLBACK",
        // Pipelines: one implicit transaction up to the Sync (an error takes it back).
        "P |LISTEN p1\nB ||\nE \nP |select 1\nB ||\nE \nS",
        "P |LISTEN p2\nB ||\nE \nP |select 1/0\nB ||\nE \nS",
        "P |LISTEN p3\nB ||\nE \nS\nP |select 2\nB ||\nE \nS",
        // Its own notification, as from its own session.
        "Q BEGIN; LISTEN self1; NOTIFY self1, 'mine'; COMMIT",
        "Q LISTEN x1",
        "Q select pg_listening_channels()",
        // UNLISTEN of channels it listens on, in blocks, as drivers send it.
        "Q BEGIN",
        "P |UNLISTEN x1\nB ||\nD P \nE \nS",
        "Q COMMIT",
        "Q BEGIN",
        "P |UNLISTEN x2\nB ||\nE \nS",
        "Q ROLLBACK",
        "P s9|UNLISTEN m1\nD S s9\nS",
        "Q BEGIN",
        "B |s9|\nE \nS",
        "Q COMMIT",
        "Q BEGIN",
        "P |LISTEN m2\nB ||\nE \nS",
        "Q SAVEPOINT a",
        "P |UNLISTEN m2\nB ||\nE \nS",
        "Q ROLLBACK TO a",
        "Q COMMIT",
        "P |UNLISTEN m3\nB ||\nE \nP |select 3\nB ||\nE \nS",
        "Q select pg_listening_channels()",
        // In queries of several statements.
        "Q BEGIN; UNLISTEN p1; COMMIT",
        "Q UNLISTEN p3; select 4",
        "Q BEGIN; UNLISTEN self1; LISTEN sp2; ROLLBACK",
        "Q UNLISTEN sp2; LISTEN x2; select 1/0",
        "Q select pg_listening_channels()",
        "Q BEGIN",
        "P |UNLISTEN *\nB ||\nE \nS",
        "P |LISTEN fin\nB ||\nE \nS",
        "P |LISTEN z1\nB ||\nE \nS",
        "Q COMMIT",
        "Q select pg_listening_channels()",
    ];
    let mut seen = Vec::new();
    for port in [pg.port(), p.port()] {
        let mut w = Wire::connect(port, "trustuser", "testdb").await;
        let mut t = Vec::new();
        // Notifications come when they come: compared apart, in the order received.
        let mut got = Vec::new();
        for s in steps {
            let (notes, lines) = w
                .step(s)
                .await
                .into_iter()
                .partition(|l| l.starts_with("Notify"));
            got.extend::<Vec<String>>(notes);
            t.push(lines);
        }
        if port == p.port() {
            assert_eq!(
                obs.backends("trustuser").await,
                2,
                "the pool and its listener"
            );
            let admin = p.connect("postgres", "pgbouncer").await;
            let pins = admin.simple_query("SHOW PINS").await.unwrap();
            assert!(
                !pins
                    .iter()
                    .any(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(_))),
                "no pin"
            );
        }
        let mut n = Wire::connect(port, "trustuser", "testdb").await;
        for ch in [
            "x1", "x2", "r1", "sp1", "sp2", "m1", "m2", "m3", "e1", "f1", "p1", "p2", "p3",
            "self1", "z1", "fin",
        ] {
            n.step(&format!("Q NOTIFY {ch}, 'n-{ch}'")).await;
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !got.iter().any(|l: &String| l.starts_with("Notify fin")) {
            assert!(std::time::Instant::now() < deadline, "no fin: {got:?}");
            got.extend(
                w.step("Q select 1")
                    .await
                    .into_iter()
                    .filter(|l| l.starts_with("Notify")),
            );
        }
        t.push(got);
        // Its own notification carries its own pid, the others another.
        let own = w.pid;
        t.push(
            w.notify_pids
                .iter()
                .map(|&p| if p == own { "self" } else { "other" }.to_string())
                .collect(),
        );
        seen.push(t);
    }
    for (k, (d, g)) in seen[0].iter().zip(&seen[1]).enumerate() {
        assert_eq!(
            d,
            g,
            "step {k}: {}",
            steps.get(k).unwrap_or(&"notifications")
        );
    }
    p.shutdown().await;
}

/// Listeners that LISTEN the way drivers do it in a transaction (tokio-postgres's prepared
/// statements, the unnamed statement as psycopg sends it, savepoints, a multi-statement
/// query), then notifications: every client's notifications, in the order received.
async fn run_block_script(dsn: impl Fn() -> String, clients: usize) -> Vec<Vec<Note>> {
    const CHS: usize = 10;
    let mut listeners = Vec::new();
    for _ in 0..clients {
        listeners.push(listener_client(&dsn()).await);
    }
    let mut tasks = Vec::new();
    for (i, (c, _)) in listeners.iter().enumerate() {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let a = format!("ch{}", i % CHS);
            let b = format!("ch{}", (i * 3 + 1) % CHS);
            let (la, lb) = (format!("LISTEN {a}"), format!("LISTEN {b}"));
            match i % 4 {
                0 => {
                    c.batch_execute("BEGIN").await.unwrap();
                    c.execute(&la, &[]).await.unwrap();
                    c.execute(&lb, &[]).await.unwrap();
                    c.batch_execute("COMMIT").await.unwrap();
                }
                1 => {
                    c.batch_execute("BEGIN").await.unwrap();
                    c.query_typed(&la, &[]).await.unwrap();
                    c.batch_execute("ROLLBACK").await.unwrap();
                    c.batch_execute("BEGIN").await.unwrap();
                    c.query_typed(&lb, &[]).await.unwrap();
                    c.batch_execute("COMMIT").await.unwrap();
                }
                2 => {
                    c.batch_execute("BEGIN; SAVEPOINT s").await.unwrap();
                    c.execute(&la, &[]).await.unwrap();
                    c.batch_execute("ROLLBACK TO SAVEPOINT s").await.unwrap();
                    c.execute(&lb, &[]).await.unwrap();
                    c.batch_execute("COMMIT").await.unwrap();
                }
                _ => {
                    let q = format!("BEGIN; {la}; {lb}; COMMIT");
                    c.batch_execute(&q).await.unwrap();
                }
            }
            c.execute("LISTEN fin", &[]).await.unwrap();
        }));
    }
    join(tasks).await;
    let mut tasks = Vec::new();
    for w in 0..4 {
        let c = tokio_postgres_connect(&dsn()).await;
        tasks.push(tokio::spawn(async move {
            for k in 0..40 {
                let ch = format!("ch{}", (w + k) % CHS);
                let sql = match k % 3 {
                    0 => format!("BEGIN; NOTIFY {ch}, 'w{w}-{k}'; COMMIT"),
                    1 => format!("select pg_notify('{ch}', 'w{w}-{k}')"),
                    _ => format!("NOTIFY {ch}, 'w{w}-{k}'"),
                };
                c.batch_execute(&sql).await.unwrap();
            }
        }));
    }
    join(tasks).await;
    tokio_postgres_connect(&dsn())
        .await
        .batch_execute("NOTIFY fin")
        .await
        .unwrap();
    let mut out = Vec::new();
    for (_, mut rx) in listeners {
        let mut got = Vec::new();
        loop {
            let note = tokio::time::timeout(Duration::from_secs(60), rx.recv())
                .await
                .expect("no fin within 60 s")
                .flatten()
                .expect("connection ended before fin");
            if note.1 == "fin" {
                break;
            }
            got.push(note);
        }
        out.push(got);
    }
    out
}

/// Many listeners over a pool of 2, each LISTENing inside a transaction as drivers send it:
/// the notifications PostgreSQL gives each of them directly, and PostgreSQL never sees more
/// than the pool and the shared listener (no pins).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drivers_listening_in_transactions_share_a_pool_of_two() {
    let pg = TempPostgres::start();
    let p = transaction_pooler(&pg)
        .setting("default_pool_size", "2")
        .setting("max_client_conn", "400")
        .start()
        .await;
    let obs = Observer::new(&pg).await;
    let direct = run_block_script(|| pg.dsn("md5user", "testdb"), 120).await;
    wait_for(
        "the direct run's sessions to end",
        Duration::from_secs(30),
        || async { obs.backends("md5user").await == 0 },
    )
    .await;
    let stop = Arc::new(AtomicBool::new(false));
    let most = Arc::new(AtomicI64::new(0));
    let sampler = {
        let (stop, most) = (stop.clone(), most.clone());
        let obs = Observer::new(&pg).await;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                most.fetch_max(obs.backends("md5user").await, Ordering::Relaxed);
            }
        })
    };
    let pooled = run_block_script(|| p.dsn("md5user", "testdb"), 120).await;
    stop.store(true, Ordering::Relaxed);
    sampler.await.unwrap();
    let total: usize = direct.iter().map(Vec::len).sum();
    assert!(total > 500, "the script delivers notifications: {total}");
    // Writers run at once: each writer's notifications in its order, and nothing else.
    for (i, (d, g)) in direct.iter().zip(&pooled).enumerate() {
        for w in 0..4 {
            assert_eq!(
                from_writer(d, w),
                from_writer(g, w),
                "client {i}, writer {w}"
            );
        }
        assert_eq!(d.len(), g.len(), "client {i}: nothing else");
    }
    assert_one_order(&pooled);
    let most = most.load(Ordering::Relaxed);
    assert!(
        most <= 3,
        "pool size 2 + the listener: PostgreSQL saw {most}"
    );
    p.shutdown().await;
}
