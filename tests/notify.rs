//! LISTEN/NOTIFY in transaction mode without pins: one shared listener connection per pool
//! fans notifications out, and every client receives what its own PostgreSQL session would
//! (PostgreSQL is the oracle), bounded per client, and is told when the listener is lost.
mod harness;
mod pool_support;

use std::collections::HashMap;
use std::future::poll_fn;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use harness::wire::Wire;
use harness::{Observer, TempPostgres, TestPooler, wait_for};
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

const CHANNELS: usize = 10;
const CLIENTS: usize = 100;
const WRITERS: usize = 10;
const EACH: usize = 21;

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
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
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
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("auth_type", "trust")
        .setting("default_pool_size", "1")
        .start()
        .await;
    let steps = [
        "Q LISTEN a",
        "P |LISTEN \"B b\"\nB ||\nD P \nE \nS",
        "P |LISTEN c\nB ||\nE \nS",
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
    assert!(
        seen[1][3].contains(&"Row c".to_string()),
        "{:?}",
        seen[1][3]
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
