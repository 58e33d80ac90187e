//! A real load balancer in front: HAProxy (the Debian package) on 127.0.0.1 balancing TCP
//! connections over three pgcarpool processes on 127.0.0.2-4 that are peered by one
//! `[peers]` section (no DNS). pgbench runs through it, cancel requests sent through it land
//! on whichever instance HAProxy picks and still end the right query, an instance killed
//! under load is marked down by HAProxy's health check while its clients reconnect and
//! carry on.
//!
//! Skipped, saying why, only when HAProxy is not installed and `apt-get install -y haproxy`
//! fails (`scripts/test` installs it).
mod harness;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use harness::process::PoolerProcess;
use harness::{
    Observer, TempPostgres, TestPooler, TestPoolerBuilder, dsn_for, free_port, wait_for,
};

const IPS: [&str; 3] = ["127.0.0.2", "127.0.0.3", "127.0.0.4"];

/// The haproxy binary; installed with apt-get when missing. None (and why) when it cannot be.
fn haproxy_binary() -> Result<PathBuf, String> {
    let find = || {
        [
            "/usr/sbin/haproxy",
            "/usr/bin/haproxy",
            "/usr/local/sbin/haproxy",
        ]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
    };
    if let Some(p) = find() {
        return Ok(p);
    }
    let out = Command::new("apt-get")
        .args(["install", "-y", "--no-install-recommends", "haproxy"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .output();
    find().ok_or_else(|| match out {
        Ok(o) => format!(
            "haproxy is not installed and `apt-get install -y haproxy` failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => format!("haproxy is not installed and apt-get cannot run: {e}"),
    })
}

/// HAProxy running in the foreground on its config; killed on drop.
struct Haproxy {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Haproxy {
    fn start(bin: &Path, backend_port: u16) -> Haproxy {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let servers: String = IPS
            .iter()
            .enumerate()
            .map(|(i, ip)| {
                format!(
                    "    server p{} {ip}:{backend_port} check inter 300 fall 2 rise 2\n",
                    i + 1
                )
            })
            .collect();
        // pgsql-check: a StartupMessage for user postgres; pgcarpool answers with an
        // authentication request, which HAProxy takes as "up".
        let cfg = format!(
            "global\n    maxconn 2000\n    stats socket {sock} level admin\n\
             defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 120s\n    \
             timeout server 120s\n    retries 3\n    option redispatch\n\
             listen pgcarpool\n    bind 127.0.0.1:{port}\n    balance roundrobin\n    \
             option pgsql-check user postgres\n{servers}",
            sock = dir.path().join("stats.sock").display(),
        );
        std::fs::write(dir.path().join("haproxy.cfg"), &cfg).unwrap();
        let log = std::fs::File::create(dir.path().join("haproxy.log")).unwrap();
        let child = Command::new(bin)
            .arg("-db")
            .arg("-f")
            .arg(dir.path().join("haproxy.cfg"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start haproxy");
        Haproxy { child, port, dir }
    }

    /// Server name → status (UP, DOWN, …) from the stats socket.
    fn statuses(&self) -> Vec<(String, String)> {
        let Ok(mut s) = UnixStream::connect(self.dir.path().join("stats.sock")) else {
            return Vec::new();
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        if s.write_all(b"show stat\n").is_err() {
            return Vec::new();
        }
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        let mut lines = text.lines();
        let Some(head) = lines.next() else {
            return Vec::new();
        };
        let cols: Vec<&str> = head.trim_start_matches("# ").split(',').collect();
        let (Some(sv), Some(st)) = (
            cols.iter().position(|c| *c == "svname"),
            cols.iter().position(|c| *c == "status"),
        ) else {
            return Vec::new();
        };
        lines
            .map(|l| l.split(',').collect::<Vec<_>>())
            .filter(|f| f.len() > st && f[sv].starts_with('p'))
            .map(|f| (f[sv].to_string(), f[st].to_string()))
            .collect()
    }

    fn status(&self, server: &str) -> String {
        self.statuses()
            .into_iter()
            .find(|(s, _)| s == server)
            .map(|(_, st)| st)
            .unwrap_or_default()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("haproxy.log")).unwrap_or_default()
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- haproxy's log ---\n{}", self.log());
        }
    }
}

/// Three peered pgcarpool processes on one port and HAProxy in front of them.
struct Fleet {
    pg: TempPostgres,
    poolers: Vec<Option<PoolerProcess>>,
    port: u16,
    haproxy: Haproxy,
}

fn instance_spec(pg: &TempPostgres, i: usize, port: u16, peered: bool) -> TestPoolerBuilder {
    let mut b = TestPooler::builder(pg)
        .setting("listen_addr", IPS[i])
        .setting("listen_port", &port.to_string())
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "10")
        .setting("max_client_conn", "500")
        .setting("log_connections", "0")
        .setting("log_disconnections", "0");
    if peered {
        // The same [peers] section in every config; only peer_id and listen_addr differ.
        b = b.setting("peer_id", &(i + 1).to_string());
        for (j, ip) in IPS.iter().enumerate() {
            b = b.peer(j as u16 + 1, &format!("host={ip} port={port}"));
        }
    }
    b
}

impl Fleet {
    /// None (the reason printed) when HAProxy cannot be had.
    async fn start(peered: bool) -> Option<Fleet> {
        let bin = match haproxy_binary() {
            Ok(b) => b,
            Err(why) => {
                eprintln!("SKIPPED: {why}");
                return None;
            }
        };
        let pg = TempPostgres::start();
        let port = free_port();
        let mut poolers = Vec::new();
        for i in 0..IPS.len() {
            let p = PoolerProcess::start(instance_spec(&pg, i, port, peered)).await;
            poolers.push(Some(p));
        }
        let haproxy = Haproxy::start(&bin, port);
        let f = Fleet {
            pg,
            poolers,
            port,
            haproxy,
        };
        wait_for(
            "HAProxy sees three servers up",
            Duration::from_secs(10),
            || async {
                let st = f.haproxy.statuses();
                st.len() == 3 && st.iter().all(|(_, s)| s == "UP")
            },
        )
        .await;
        Some(f)
    }

    fn dsn(&self, user: &str) -> String {
        dsn_for(self.haproxy.port, user, "testdb")
    }

    /// The console of instance `i`, straight (not through HAProxy).
    async fn console(&self, i: usize) -> tokio_postgres::Client {
        harness::try_connect(&format!(
            "host={} port={} user=postgres password=postgres dbname=pgbouncer",
            IPS[i], self.port
        ))
        .await
        .unwrap()
    }

    /// Transactions instance `i` has served (SHOW STATS, all databases).
    async fn xacts(&self, i: usize) -> u64 {
        let c = self.console(i).await;
        c.simple_query("SHOW STATS")
            .await
            .unwrap()
            .iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r
                    .get("total_xact_count")
                    .and_then(|v| v.parse::<u64>().ok()),
                _ => None,
            })
            .sum()
    }
}

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbench_runs_through_haproxy_on_every_instance() {
    let Some(f) = Fleet::start(true).await else {
        return;
    };
    let init = harness::run_pgbench(&["-i", "-q", "-s", "1", &f.pg.dsn("md5user", "testdb")]);
    assert!(init.status.success(), "pgbench -i: {}", text(&init));
    let dsn = f.dsn("md5user");
    let out = tokio::task::spawn_blocking(move || {
        harness::run_pgbench(&[
            "-c", "60", "-j", "2", "-T", "5", "-M", "prepared", "-n", &dsn,
        ])
    })
    .await
    .unwrap();
    let t = text(&out);
    assert!(out.status.success(), "pgbench through HAProxy failed:\n{t}");
    let done = harness::pgbench_number(&out, "number of transactions actually processed: ");
    assert!(done.unwrap_or(0) > 100, "too few transactions:\n{t}");
    assert_eq!(
        harness::pgbench_number(&out, "number of failed transactions: "),
        Some(0),
        "{t}"
    );
    // The fleet's limit on PostgreSQL: instances × pool size (3 × 10), whatever the
    // number of clients (60).
    let obs = Observer::new(&f.pg).await;
    let servers = obs.backends("md5user").await;
    eprintln!(
        "pgbench -c 60 -M prepared through HAProxy over 3 instances: {done:?} transactions \
         in 5 s, {servers} server connections"
    );
    assert!(
        (3..=30).contains(&servers),
        "{servers} server connections for 3 instances of pool size 10"
    );
    // HAProxy spread the clients: every instance served transactions.
    for (i, ip) in IPS.iter().enumerate() {
        assert!(f.xacts(i).await > 0, "instance {ip} served nothing");
    }
}

/// Cancel `n` queries (each on its own connection through HAProxy) through HAProxy; every
/// one must end with 57014 within 5 s. Returns how many did.
async fn cancel_through(f: &Fleet, n: usize) -> usize {
    let mut clients = Vec::new();
    for _ in 0..n {
        clients.push(harness::try_connect(&f.dsn("md5user")).await.unwrap());
    }
    let obs = Observer::new(&f.pg).await;
    let mut ended = 0;
    for c in clients {
        // The last cancelled backend may still show as active for a moment: a cancel sent
        // before this query reaches its server would have nothing to end.
        obs.wait_running("md5user", "pg_sleep(30)", 0).await;
        let token = c.cancel_token();
        let task = tokio::spawn(async move { c.simple_query("SELECT pg_sleep(30)").await });
        obs.wait_running("md5user", "pg_sleep(30)", 1).await;
        token
            .cancel_query(tokio_postgres::NoTls)
            .await
            .expect("send cancel through HAProxy");
        let Ok(r) = tokio::time::timeout(Duration::from_secs(5), task).await else {
            panic!("query {ended} still runs 5 s after its cancel was sent through HAProxy");
        };
        let err = r.unwrap().expect_err("the cancelled query succeeded");
        assert_eq!(harness::sqlstate(&err), Some("57014"), "{err:?}");
        ended += 1;
    }
    ended
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cancel_sent_through_haproxy_lands() {
    let Some(f) = Fleet::start(true).await else {
        return;
    };
    // 10 connections, then a cancel connection each: round robin sends the cancels for the
    // queries on instance k to instance k+1, so every one must be forwarded by a peer.
    let n = 10;
    assert_eq!(cancel_through(&f, n).await, n, "cancels lost");
    // psql: Ctrl-C (SIGINT) makes it send a cancel request on a new connection, which
    // HAProxy gives the next instance.
    for round in 0..3 {
        Observer::new(&f.pg)
            .await
            .wait_running("md5user", "pg_sleep(30)", 0)
            .await;
        let mut psql = Command::new(harness::pg_bin("psql"))
            .args([&f.dsn("md5user"), "-X", "-c", "SELECT pg_sleep(30)"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let obs = Observer::new(&f.pg).await;
        obs.wait_running("md5user", "pg_sleep(30)", 1).await;
        harness::process::send_signal(psql.id() as i32, libc::SIGINT);
        let exited = harness::process::exit_within(&mut psql, Duration::from_secs(5)).await;
        let Some(status) = exited else {
            let _ = psql.kill();
            panic!("psql round {round}: its query still runs 5 s after Ctrl-C");
        };
        let mut err = String::new();
        psql.stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(!status.success(), "psql round {round} succeeded: {err}");
        assert!(
            err.contains("canceling statement due to user request"),
            "psql round {round}: {err}"
        );
    }
    // pgjdbc: Statement.cancel() through HAProxy (when the Java client is built).
    if let Some(out) = jdbc_cancel(&f) {
        assert!(out.status.success(), "pgjdbc cancels: {}", text(&out));
        assert!(text(&out).contains("ok 6 cancels"), "{}", text(&out));
    } else {
        eprintln!("pgjdbc part not run: tests/clients/java is not built (tests/clients/install)");
    }
}

/// Run the pgjdbc cancel client (tests/clients/java, class JdbcCancel) through HAProxy.
fn jdbc_cancel(f: &Fleet) -> Option<std::process::Output> {
    let jar =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/java/target/pgjdbc-client.jar");
    if !jar.exists() || Command::new("java").arg("-version").output().is_err() {
        return None;
    }
    let out = Command::new("timeout")
        .arg("120")
        .arg("java")
        .arg("-cp")
        .arg(&jar)
        .arg("pgcarpool.JdbcCancel")
        .args([
            "127.0.0.1",
            &f.haproxy.port.to_string(),
            "md5user",
            "md5pass",
            "testdb",
            "6",
        ])
        .output()
        .unwrap();
    if text(&out).contains("Could not find or load main class pgcarpool.JdbcCancel") {
        return None;
    }
    Some(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_carry_on_when_an_instance_dies_under_load() {
    let Some(mut f) = Fleet::start(true).await else {
        return;
    };
    let stop = Arc::new(AtomicBool::new(false));
    let killed_at = Arc::new(std::sync::Mutex::new(None::<Instant>));
    // Workers that committed a transaction, and that committed one after the kill.
    let (committed, served_after) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let dsn = f.dsn("md5user");
    let mut workers = Vec::new();
    for w in 0..12 {
        let (stop, dsn, killed_at) = (stop.clone(), dsn.clone(), killed_at.clone());
        let (committed, served_after) = (committed.clone(), served_after.clone());
        workers.push(tokio::spawn(async move {
            let (mut before_kill, mut after_kill) = (0u64, 0u64);
            let mut reconnects = 0u64;
            let mut errors = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let c = match harness::try_connect(&dsn).await {
                    Ok(c) => c,
                    Err(e) => {
                        errors.push(format!("connect: {e}"));
                        // Pacing a retry of the load (no synchronisation).
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                reconnects += 1;
                while !stop.load(Ordering::Relaxed) {
                    let r = c
                        .simple_query(&format!("BEGIN; SELECT {w}, pg_sleep(0.01); COMMIT"))
                        .await;
                    match r {
                        Ok(_) if killed_at.lock().unwrap().is_some() => {
                            after_kill += 1;
                            if after_kill == 1 {
                                served_after.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Ok(_) => {
                            before_kill += 1;
                            if before_kill == 1 {
                                committed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Err(e) => {
                            errors.push(format!("query: {e}"));
                            break;
                        }
                    }
                }
            }
            (after_kill, reconnects, errors)
        }));
    }
    // Every worker has its connection (round robin: a third of them on p2) and commits.
    wait_for("every worker commits", Duration::from_secs(20), || async {
        committed.load(Ordering::Relaxed) == 12
    })
    .await;
    let victim = f.poolers[1].take().unwrap();
    victim.signal(libc::SIGKILL);
    *killed_at.lock().unwrap() = Some(Instant::now());
    drop(victim);
    // HAProxy's health check takes it out of rotation.
    wait_for("HAProxy marks p2 down", Duration::from_secs(5), || async {
        f.haproxy.status("p2").starts_with("DOWN")
    })
    .await;
    wait_for(
        "every worker commits after the kill",
        Duration::from_secs(20),
        || async { served_after.load(Ordering::Relaxed) == 12 },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let mut lost_clients = 0;
    for (w, t) in workers.into_iter().enumerate() {
        let (after, reconnects, errors) = tokio::time::timeout(Duration::from_secs(20), t)
            .await
            .expect("a worker hangs")
            .unwrap();
        assert!(
            after > 0,
            "worker {w} did nothing after the kill: {errors:?}"
        );
        // A worker on the killed instance loses its connection once and reconnects.
        assert!(errors.len() <= 2, "worker {w}: {errors:?}");
        if reconnects > 1 {
            lost_clients += 1;
        }
    }
    eprintln!("instance killed under 12 looping clients: {lost_clients} reconnected");
    // Round robin put about a third of the 12 workers on the killed instance.
    assert!(
        lost_clients >= 2,
        "only {lost_clients} workers were on the killed instance"
    );
    // The instance comes back on the same address: HAProxy's check sees it up again.
    let again = instance_spec(&f.pg, 1, f.port, true);
    f.poolers[1] = Some(PoolerProcess::start(again).await);
    wait_for(
        "HAProxy marks p2 up again",
        Duration::from_secs(5),
        || async { f.haproxy.status("p2") == "UP" },
    )
    .await;
}
