//! Soak: mixed clients through the pgcarpool binary for `SOAK_MINUTES` (default 2) while
//! faults are injected on a schedule; every client checks every row it gets. Run by
//! `scripts/soak [--minutes N]` (ignored in a plain `cargo test`).
//!
//! Clients (each reconnects after an error, which is counted by kind):
//! - tokio-postgres, extended protocol, transaction mode: rows of its own inserted and
//!   read back in a transaction, a parameterised select checked value by value;
//! - tokio-postgres, simple protocol, transaction mode, with a session setting of its own
//!   (`SET soak.client`) that every transaction checks (a leak between clients shows);
//! - tokio-postgres pinned (a temp table, transaction mode): its row count checked;
//! - tokio-postgres in a session-mode database, extended protocol;
//! - psql (simple protocol) over TLS and not, checking its one row;
//! - pgbench `-S` in simple and extended (prepared) protocol, over TLS and not;
//! - the real drivers of tests/clients (pgjdbc, asyncpg, psycopg, node-postgres, pgx),
//!   each running its checked program (2 workers, 25 iterations) run after run in
//!   transaction mode; a failed run's FAIL lines are errors when the faults explain them
//!   (SQLSTATE class 08, 57P01–57P03, 40001, 53300, a lost, closed, reset or refused
//!   connection, a timeout), else wrong rows.
//!
//! Faults, in turn, one every tenth of the run: `-R` online restart (once, first), clients
//! killed mid-transaction (tasks aborted with a transaction open, psql SIGKILLed in one),
//! SIGHUP reload with a changed pool size, PostgreSQL restarted, the network cut (every
//! PostgreSQL process stopped with SIGSTOP for 3 s, then SIGCONT). `SOAK_FAULTS` (e.g.
//! `kill,cut`) injects only some kinds, to find which one leaves something behind.
//!
//! At the end (clients gone, servers past `server_idle_timeout`): RSS within
//! [`RSS_BOUND`] of the first process's at start, open descriptors within [`FD_BOUND`],
//! no server connection left, zero wrong rows, no panic in either process's log. The
//! figures are printed as a Markdown table (docs/testing.md keeps one run's).
mod harness;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use harness::process::{PoolerProcess, ProcessDir, give_to_pooler, signal_if_alive};
use harness::{
    TempPostgres, TestPooler, clients_dir, dsn_for, install_clients, pg_bin, try_connect,
};

/// How much more resident memory the pooler may use at the end than at its start.
const RSS_BOUND_KB: u64 = 64 * 1024;
/// How many more descriptors it may hold at the end than at its start.
const FD_BOUND: u64 = 16;
/// Clients of each tokio-postgres kind.
const PER_KIND: usize = 4;

/// What the run counted.
#[derive(Default)]
struct Tally {
    transactions: AtomicU64,
    wrong_rows: AtomicU64,
    errors: Mutex<BTreeMap<String, u64>>,
    faults: Mutex<BTreeMap<&'static str, u64>>,
    wrong: Mutex<Vec<String>>,
    /// Queries of the real drivers' runs that passed, by driver.
    drivers: Mutex<BTreeMap<&'static str, u64>>,
    /// The first FAIL lines of driver runs that the faults explain (printed at the end).
    driver_errors: Mutex<Vec<String>>,
}

impl Tally {
    fn ok(&self) {
        self.transactions.fetch_add(1, Ordering::Relaxed);
    }
    fn error(&self, kind: String) {
        *self.errors.lock().unwrap().entry(kind).or_default() += 1;
    }
    fn wrong(&self, what: String) {
        self.wrong_rows.fetch_add(1, Ordering::Relaxed);
        let mut w = self.wrong.lock().unwrap();
        if w.len() < 20 {
            w.push(what);
        }
    }
    fn fault(&self, kind: &'static str) {
        *self.faults.lock().unwrap().entry(kind).or_default() += 1;
    }
}

/// An error's kind: its SQLSTATE, else what broke.
fn kind(e: &tokio_postgres::Error) -> String {
    match e.code() {
        Some(c) => format!("sqlstate {}", c.code()),
        None if e.is_closed() => "connection closed".into(),
        None => "i/o or protocol".into(),
    }
}

/// The resident memory (kB) and open descriptors of process `pid`.
fn rss_fds(pid: i32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count() as u64)
        .unwrap_or(0);
    (rss, fds)
}

/// One sample of what is watched.
#[derive(Clone, Copy, Default, Debug)]
struct Sample {
    rss_kb: u64,
    fds: u64,
    servers: i64,
}

struct Ctx {
    port: std::sync::atomic::AtomicU16,
    pid: std::sync::atomic::AtomicI32,
    tally: Tally,
    stop: AtomicBool,
    /// Tasks of pinned and session clients, which may be killed mid-transaction, and
    /// their databases.
    killable: Mutex<Vec<(tokio::task::AbortHandle, &'static str)>>,
}

impl Ctx {
    fn port(&self) -> u16 {
        self.port.load(Ordering::Relaxed)
    }
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// Run a command off the async threads; its output.
async fn run(cmd: &mut std::process::Command) -> std::process::Output {
    let mut cmd = std::mem::replace(cmd, std::process::Command::new("true"));
    tokio::task::spawn_blocking(move || cmd.output().expect("run a client program"))
        .await
        .expect("client program task")
}

/// Connect as md5user to `db` (retrying while faults last), or None once stopped.
async fn connect(ctx: &Ctx, db: &str) -> Option<tokio_postgres::Client> {
    while !ctx.stopped() {
        match try_connect(&dsn_for(ctx.port(), "md5user", db)).await {
            Ok(c) => return Some(c),
            Err(e) => {
                ctx.tally.error(format!("connect: {}", kind(&e)));
                // Pacing the retry of a load client after an error (no synchronisation).
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    None
}

/// Extended protocol, transaction mode: insert rows of its own in a transaction, read
/// them back, and a parameterised select checked value by value.
async fn extended_client(ctx: Arc<Ctx>, id: i32) {
    let mut seq = 0i64;
    while let Some(c) = connect(&ctx, "testdb").await {
        loop {
            if ctx.stopped() {
                return;
            }
            seq += 1;
            match extended_round(&c, id, seq).await {
                Ok(None) => ctx.tally.ok(),
                Ok(Some(wrong)) => ctx.tally.wrong(wrong),
                Err(e) => {
                    ctx.tally.error(kind(&e));
                    break;
                }
            }
        }
    }
}

async fn extended_round(
    c: &tokio_postgres::Client,
    id: i32,
    seq: i64,
) -> Result<Option<String>, tokio_postgres::Error> {
    let rows = c
        .query(
            "select i, i * $1::bigint from generate_series(1, 20) i",
            &[&seq],
        )
        .await?;
    for (n, r) in rows.iter().enumerate() {
        let (i, v): (i32, i64) = (r.get(0), r.get(1));
        if i as usize != n + 1 || v != i64::from(i) * seq {
            return Ok(Some(format!(
                "extended {id}: row {n} = ({i}, {v}), seq {seq}"
            )));
        }
    }
    c.batch_execute("begin").await?;
    c.execute(
        "insert into soak_rows (client, seq, val) values ($1, $2, $3)",
        &[&id, &seq, &format!("c{id}-s{seq}")],
    )
    .await?;
    let got: String = c
        .query_one(
            "select val from soak_rows where client = $1 and seq = $2",
            &[&id, &seq],
        )
        .await?
        .get(0);
    c.batch_execute("commit").await?;
    if got != format!("c{id}-s{seq}") {
        return Ok(Some(format!("extended {id}: read back {got:?}, seq {seq}")));
    }
    Ok(None)
}

/// Simple protocol, transaction mode, with a session setting of its own checked in every
/// transaction.
async fn simple_client(ctx: Arc<Ctx>, id: i32) {
    let mut seq = 0i64;
    while let Some(c) = connect(&ctx, "testdb").await {
        if let Err(e) = c.batch_execute(&format!("SET soak.client = '{id}'")).await {
            ctx.tally.error(kind(&e));
            continue;
        }
        loop {
            if ctx.stopped() {
                return;
            }
            seq += 1;
            let sql = format!(
                "select current_setting('soak.client'), sum(i) from generate_series(1, {seq} % 100 + 1) i"
            );
            match c.simple_query(&sql).await {
                Ok(msgs) => {
                    let n = seq % 100 + 1;
                    let want = (id.to_string(), (n * (n + 1) / 2).to_string());
                    let got = msgs.iter().find_map(|m| match m {
                        tokio_postgres::SimpleQueryMessage::Row(r) => Some((
                            r.get(0).unwrap_or("").to_string(),
                            r.get(1).unwrap_or("").to_string(),
                        )),
                        _ => None,
                    });
                    if got.as_ref() == Some(&want) {
                        ctx.tally.ok();
                    } else {
                        ctx.tally
                            .wrong(format!("simple {id}: got {got:?}, want {want:?}"));
                    }
                }
                Err(e) => {
                    ctx.tally.error(kind(&e));
                    break;
                }
            }
        }
    }
}

/// Pinned (a temp table, transaction mode) or in the session-mode database: a table of
/// its own whose row count it knows. Its task may be aborted mid-transaction.
async fn pinned_client(ctx: Arc<Ctx>, id: i32, db: &'static str) {
    while let Some(c) = connect(&ctx, db).await {
        if let Err(e) = c
            .batch_execute("create temp table mine (n int); insert into mine values (0)")
            .await
        {
            ctx.tally.error(kind(&e));
            continue;
        }
        let mut count = 0i64;
        loop {
            if ctx.stopped() {
                return;
            }
            let r = async {
                c.batch_execute("begin; insert into mine values (1)")
                    .await?;
                let n: i64 = c.query_one("select count(*) from mine", &[]).await?.get(0);
                c.batch_execute("commit").await?;
                Ok::<_, tokio_postgres::Error>(n)
            }
            .await;
            match r {
                Ok(n) if n == count + 2 => {
                    count += 1;
                    ctx.tally.ok();
                }
                Ok(n) => {
                    ctx.tally
                        .wrong(format!("pinned {id} ({db}): {n} rows, want {}", count + 2));
                    break;
                }
                Err(e) => {
                    ctx.tally.error(kind(&e));
                    break;
                }
            }
        }
    }
}

/// psql: one query checked, over TLS (`sslmode=require`) or not; one in four is killed
/// mid-transaction when the schedule says so.
async fn psql_client(ctx: Arc<Ctx>, tls: bool, db: &'static str) {
    while !ctx.stopped() {
        let dsn = format!(
            "{} sslmode={}",
            dsn_for(ctx.port(), "md5user", db),
            if tls { "require" } else { "disable" }
        );
        let out = run(std::process::Command::new(pg_bin("psql")).args([
            &dsn,
            "-Atc",
            "select sum(i) from generate_series(1, 1000) i",
        ]))
        .await;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if out.status.success() && stdout.trim() == "500500" {
            ctx.tally.ok();
        } else if out.status.success() {
            ctx.tally.wrong(format!("psql: {stdout:?}"));
        } else {
            let err = String::from_utf8_lossy(&out.stderr);
            let first = err.lines().next().unwrap_or("").to_string();
            let first = first.split(':').take(3).collect::<Vec<_>>().join(":");
            ctx.tally.error(format!("psql: {first}"));
            // Pacing the retry of a load client after an error (no synchronisation).
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// pgbench -S for 5 s at a time, simple or prepared, TLS or not.
async fn pgbench_client(ctx: Arc<Ctx>, mode: &'static str, tls: bool) {
    while !ctx.stopped() {
        let dsn = format!(
            "{} sslmode={}",
            dsn_for(ctx.port(), "md5user", "testdb"),
            if tls { "require" } else { "disable" }
        );
        let out = run(std::process::Command::new(pg_bin("pgbench"))
            .args(["-n", "-S", "-T", "5", "-c", "2", "-M", mode, &dsn]))
        .await;
        let text = String::from_utf8_lossy(&out.stdout);
        let done = text
            .lines()
            .find_map(|l| l.strip_prefix("number of transactions actually processed: "))
            .and_then(|v| v.split('/').next()?.trim().parse::<u64>().ok())
            .unwrap_or(0);
        ctx.tally.transactions.fetch_add(done, Ordering::Relaxed);
        if !out.status.success() {
            ctx.tally.error(format!("pgbench -M {mode}: aborted"));
            // Pacing the retry of a load client after an error (no synchronisation).
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The real-driver programs of tests/clients that run as soak clients.
const DRIVERS: [&str; 5] = ["pgjdbc", "asyncpg", "psycopg", "node-postgres", "pgx"];
/// Workers (connections) and iterations of one run of a driver program: some seconds.
const DRIVER_WORKERS: &str = "2";
const DRIVER_ITERATIONS: &str = "25";
/// A driver run that lasts longer than this is killed (and counted as a timeout).
const DRIVER_RUN_LIMIT_S: &str = "120";

/// SQLSTATEs the injected faults cause: a lost or refused connection (class 08), an
/// administrator or crash shutdown or a server starting up (57P01–57P03), a transaction
/// ended by the lost server (40001), too many connections while servers come back (53300).
fn fault_sqlstate(code: &str) -> bool {
    code.starts_with("08") || ["57P01", "57P02", "57P03", "40001", "53300"].contains(&code)
}

/// Messages of the drivers for a lost, closed, reset or refused connection or a timeout.
const FAULT_WORDS: [&str; 22] = [
    "connection closed",
    "connection is closed",
    "connection has been closed",
    "connection was closed",
    "connection is lost",
    "connection lost",
    "connection reset",
    "connection refused",
    "connection terminated",
    "connection attempt failed",
    "closed the connection",
    "connect call failed",
    "failed to connect",
    "conn closed",
    "terminating connection",
    "the database system is",
    "i/o error",
    "unexpected eof",
    "broken pipe",
    "econnreset",
    "timed out",
    "timeout",
];

/// A failed driver run's FAIL line (or output) classified: `Some(kind)` when the injected
/// faults explain it (an error of that kind), `None` when it is a wrong result.
fn driver_fault(line: &str) -> Option<String> {
    let lower = line.to_ascii_lowercase();
    // `SQLSTATE 08006`, `(SQLSTATE 57P01)`, `expected SQLSTATE 22012, got 08006 (…)`.
    for tag in ["sqlstate ", "got "] {
        for (i, _) in lower.match_indices(tag) {
            let rest = &lower[i + tag.len()..];
            let code: String = rest
                .chars()
                .take_while(char::is_ascii_alphanumeric)
                .collect();
            let code = code.to_ascii_uppercase();
            if code.len() == 5 && fault_sqlstate(&code) {
                return Some(format!("sqlstate {code}"));
            }
        }
    }
    // asyncpg's own state machine after a connection error: a query started while it
    // still consumes the failed one ("cannot switch to state 12; another operation (2) is
    // in progress"), seen against PostgreSQL alone in failovers (MagicStack/asyncpg#1069,
    // #784); once in a soak run, beside the other worker's 08007 of the same PostgreSQL
    // restart. Counted as a fault's error of its own kind, not a wrong row.
    if lower.contains("internalclienterror") && lower.contains("another operation") {
        return Some("asyncpg: internal state after a lost connection".into());
    }
    FAULT_WORDS
        .iter()
        .find(|w| lower.contains(*w))
        .map(|w| w.to_string())
}

/// One run of `driver` through the transaction-mode database: `Ok(queries)` when every
/// result was right, else `Err` with the FAIL lines (or the whole output).
async fn driver_run(ctx: &Ctx, driver: &str) -> Result<u64, (Option<i32>, Vec<String>)> {
    let port = ctx.port().to_string();
    let password = harness::password_of("md5user").expect("test role");
    let out = run(std::process::Command::new("timeout").args([
        "-s",
        "KILL",
        DRIVER_RUN_LIMIT_S,
        "bash",
        &clients_dir().join("run").to_string_lossy(),
        driver,
        "127.0.0.1",
        &port,
        "md5user",
        password,
        "testdb",
        DRIVER_WORKERS,
        DRIVER_ITERATIONS,
    ]))
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let queries = stdout.lines().find_map(|l| {
        l.strip_prefix("ok ")?
            .strip_suffix(" queries")?
            .parse()
            .ok()
    });
    match queries {
        Some(n) if out.status.success() => Ok(n),
        _ => {
            let fails: Vec<String> = stdout
                .lines()
                .filter(|l| l.starts_with("FAIL"))
                .map(String::from)
                .collect();
            if fails.is_empty() {
                let all = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
                Err((out.status.code(), vec![all]))
            } else {
                Err((out.status.code(), fails))
            }
        }
    }
}

/// A real driver (tests/clients) run after run through the transaction-mode database:
/// its queries are counted; a failed run's FAIL lines are errors of their kind when the
/// faults explain them, else wrong rows.
async fn driver_client(ctx: Arc<Ctx>, driver: &'static str) {
    while !ctx.stopped() {
        match driver_run(&ctx, driver).await {
            Ok(n) => {
                ctx.tally.transactions.fetch_add(n, Ordering::Relaxed);
                *ctx.tally.drivers.lock().unwrap().entry(driver).or_default() += n;
            }
            Err((status, fails)) => {
                for line in fails {
                    match driver_fault(&line) {
                        Some(kind) => {
                            ctx.tally.error(format!("{driver}: {kind}"));
                            let mut seen = ctx.tally.driver_errors.lock().unwrap();
                            if seen.len() < 20 {
                                seen.push(format!("{driver}: {line}"));
                            }
                        }
                        None if status == Some(137) || status == Some(124) => ctx
                            .tally
                            .error(format!("{driver}: killed after {DRIVER_RUN_LIMIT_S} s")),
                        None => ctx.tally.wrong(format!("{driver}: {line}")),
                    }
                }
                // Pacing the retry of a load client after an error (no synchronisation).
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// The PostgreSQL processes of `pg` (postmaster first).
fn pg_pids(pg: &TempPostgres) -> Vec<i32> {
    let pidfile = std::fs::read_to_string(pg.data_dir().join("postmaster.pid")).unwrap_or_default();
    let Some(master) = pidfile
        .lines()
        .next()
        .and_then(|l| l.trim().parse::<i32>().ok())
    else {
        return Vec::new();
    };
    let mut pids = vec![master];
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        // pid (comm) state ppid …: comm may hold spaces, so split after the last ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok());
        if ppid == Some(master) {
            pids.push(pid);
        }
    }
    pids
}

/// Kill clients mid-transaction: abort two tokio clients' tasks (they spend their time in
/// transactions) and SIGKILL a psql inside one.
async fn kill_clients(ctx: &Arc<Ctx>, pg_port: u16) {
    let killed: Vec<_> = ctx.killable.lock().unwrap().drain(..2).collect();
    respawn(ctx, killed, 100);
    let dsn = dsn_for(ctx.port(), "md5user", "testdb");
    let mut psql = std::process::Command::new(pg_bin("psql"))
        .args([&dsn, "-c", "begin; select 'soak-kill', pg_sleep(30)"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn psql");
    let running = harness::eventually(Duration::from_secs(10), || async {
        let sql = "select count(*) from pg_stat_activity where query like '%soak-kill%' \
                   and pid <> pg_backend_pid()";
        pg_count(pg_port, sql).await.unwrap_or(0) > 0
    })
    .await;
    let _ = psql.kill();
    let _ = tokio::task::spawn_blocking(move || psql.wait()).await;
    if !running {
        ctx.tally.error("fault: psql never got a server".into());
    }
}

/// Abort the tasks of `killed` clients and start new ones in their place (ids from `base`).
fn respawn(ctx: &Arc<Ctx>, killed: Vec<(tokio::task::AbortHandle, &'static str)>, base: i32) {
    for (i, (h, db)) in killed.into_iter().enumerate() {
        h.abort();
        spawn_killable(ctx, base + i as i32, db);
    }
}

/// A pinned client in `db` whose task may be killed.
fn spawn_killable(ctx: &Arc<Ctx>, id: i32, db: &'static str) {
    let h = tokio::spawn(pinned_client(ctx.clone(), id, db));
    ctx.killable.lock().unwrap().push((h.abort_handle(), db));
}

/// The network cut for 3 s: every PostgreSQL process stopped, then continued.
async fn cut_network(pg: &TempPostgres) {
    let pids = pg_pids(pg);
    for &p in pids.iter().rev() {
        signal_if_alive(p, libc::SIGSTOP);
    }
    // The cut itself (the scenario), not a synchronisation.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for &p in &pids {
        signal_if_alive(p, libc::SIGCONT);
    }
}

/// SIGHUP with the pool size changed (8 ↔ 6).
fn reload(p: &mut PoolerProcess, round: usize) {
    let size = if round.is_multiple_of(2) { "6" } else { "8" };
    p.dir.rewrite(|b| b.setting("default_pool_size", size));
    p.signal(libc::SIGHUP);
}

/// `-R`: a new process takes the sockets and the idle clients over; pinned clients are
/// killed so that the old process can go.
async fn take_over(ctx: &Arc<Ctx>, old: PoolerProcess) -> PoolerProcess {
    let mut old = old;
    let new = old.start_successor(&["-R"]).await;
    ctx.pid.store(new.pid(), Ordering::Relaxed);
    let killed: Vec<_> = ctx.killable.lock().unwrap().drain(..).collect();
    respawn(ctx, killed, 200);
    if old.exited_within(Duration::from_secs(30)).await.is_none() {
        ctx.tally
            .error("fault: the old process did not exit after -R".into());
    }
    let log = old.log();
    if log.contains("panicked") {
        ctx.tally
            .wrong(format!("panic in the old process's log:\n{log}"));
    }
    new
}

/// One number PostgreSQL answers on a connection of its own (None while it is down).
async fn pg_count(pg_port: u16, sql: &str) -> Option<i64> {
    let c = try_connect(&dsn_for(pg_port, "postgres", "postgres"))
        .await
        .ok()?;
    c.query_one(sql, &[]).await.ok()?.try_get(0).ok()
}

/// A sample of the pooler and of the servers PostgreSQL has for md5user (-1: down).
async fn sample(ctx: &Ctx, pg_port: u16) -> Sample {
    let (rss_kb, fds) = rss_fds(ctx.pid.load(Ordering::Relaxed));
    let sql = "select count(*) from pg_stat_activity where usename = 'md5user'";
    Sample {
        rss_kb,
        fds,
        servers: pg_count(pg_port, sql).await.unwrap_or(-1),
    }
}

/// The run's length: `SOAK_MINUTES` (fractions allowed), 2 by default.
fn run_length() -> Duration {
    let minutes: f64 = std::env::var("SOAK_MINUTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2.0);
    Duration::from_secs_f64(minutes * 60.0)
}

/// The pooler's config: transaction mode, `sess` a session-mode database, client TLS
/// allowed with a self-signed certificate, servers closed 2 s after their last use.
fn pooler_dir(pg: &TempPostgres, certs: &std::path::Path) -> ProcessDir {
    let key = certs.join("server.key");
    let crt = certs.join("server.crt");
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    std::fs::write(&crt, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    give_to_pooler(certs);
    let spec = TestPooler::builder(pg)
        .database("*", &format!("host=127.0.0.1 port={}", pg.port()))
        .database(
            "sess",
            &format!("{} pool_mode=session", pg.db_entry("testdb")),
        )
        .settings(&[
            ("pool_mode", "transaction"),
            ("default_pool_size", "8"),
            ("max_client_conn", "300"),
            ("server_idle_timeout", "2"),
            ("query_wait_timeout", "30"),
            ("client_tls_sslmode", "allow"),
            ("client_tls_key_file", &key.to_string_lossy()),
            ("client_tls_cert_file", &crt.to_string_lossy()),
            ("so_reuseport", "0"),
        ]);
    let mut dir = ProcessDir::with_pidfile(spec);
    let sockdir = dir.path().to_string_lossy().into_owned();
    dir.rewrite(|b| b.setting("unix_socket_dir", &sockdir));
    dir
}

/// Start every client; the pinned ones' tasks are kept to be killed.
fn start_clients(ctx: &Arc<Ctx>) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    for i in 0..PER_KIND as i32 {
        tasks.push(tokio::spawn(extended_client(ctx.clone(), i)));
        tasks.push(tokio::spawn(simple_client(ctx.clone(), i)));
        spawn_killable(ctx, 1000 + i, "testdb");
        spawn_killable(ctx, 2000 + i, "sess");
    }
    tasks.push(tokio::spawn(psql_client(ctx.clone(), true, "testdb")));
    tasks.push(tokio::spawn(psql_client(ctx.clone(), false, "sess")));
    tasks.push(tokio::spawn(pgbench_client(ctx.clone(), "simple", true)));
    tasks.push(tokio::spawn(pgbench_client(ctx.clone(), "prepared", false)));
    for driver in DRIVERS {
        tasks.push(tokio::spawn(driver_client(ctx.clone(), driver)));
    }
    tasks
}

/// The tables the clients use, made straight in PostgreSQL.
fn prepare_database(pg: &TempPostgres) {
    pg.psql_in(
        "testdb",
        "grant create on schema public to md5user; \
         create table soak_rows (client int, seq bigint, val text, primary key (client, seq)); \
         grant all on soak_rows to md5user",
    );
    let out = std::process::Command::new(pg_bin("pgbench"))
        .args(["-i", "-s", "1", "-q", &pg.dsn("md5user", "testdb")])
        .output()
        .expect("run pgbench -i");
    assert!(out.status.success(), "{}", harness::output_text(&out));
}

/// Peak of each watched figure, sampled every second until `stop`.
fn start_sampler(
    ctx: Arc<Ctx>,
    pg_port: u16,
    peak: Arc<Mutex<Sample>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while !ctx.stopped() {
            let s = sample(&ctx, pg_port).await;
            {
                let mut p = peak.lock().unwrap();
                p.rss_kb = p.rss_kb.max(s.rss_kb);
                p.fds = p.fds.max(s.fds);
                p.servers = p.servers.max(s.servers);
            }
            // The sampling period (no synchronisation).
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
}

/// The kinds of fault, in the order they take turns (-R only once, first).
const FAULTS: [&str; 5] = ["takeover", "kill", "reload", "restart", "cut"];

/// The faults of this run: `SOAK_FAULTS` (a comma-separated selection of [`FAULTS`], to
/// look at one kind at a time), all of them by default.
fn faults_chosen() -> Vec<&'static str> {
    let Ok(v) = std::env::var("SOAK_FAULTS") else {
        return FAULTS.to_vec();
    };
    let chosen: Vec<_> = FAULTS
        .into_iter()
        .filter(|f| v.split(',').any(|w| w.trim() == *f))
        .collect();
    assert!(
        !chosen.is_empty(),
        "SOAK_FAULTS={v}: choose among {FAULTS:?}"
    );
    chosen
}

/// The faults, in turn, one every `every`, until `end`: -R first (once), then kills,
/// reloads, PostgreSQL restarts and network cuts (those [`faults_chosen`]).
async fn inject_faults(
    ctx: &Arc<Ctx>,
    pg: &TempPostgres,
    mut pooler: PoolerProcess,
    every: Duration,
    end: Instant,
) -> PoolerProcess {
    let mut turns = faults_chosen();
    let mut next = Instant::now() + every;
    let (mut round, mut reloads) = (0usize, 0usize);
    while next < end {
        // The fault schedule: one fault every `every` (no synchronisation).
        tokio::time::sleep_until(next.into()).await;
        next += every;
        let fault = turns[round % turns.len()];
        round += 1;
        match fault {
            "takeover" => {
                pooler = take_over(ctx, pooler).await;
                ctx.tally.fault("-R online restart");
                turns.retain(|f| *f != "takeover");
                if turns.is_empty() {
                    break;
                }
                round = 0;
            }
            "kill" => {
                kill_clients(ctx, pg.port()).await;
                ctx.tally.fault("clients killed mid-transaction");
            }
            "reload" => {
                reload(&mut pooler, reloads);
                reloads += 1;
                ctx.tally.fault("SIGHUP reload");
            }
            "restart" => {
                tokio::task::block_in_place(|| pg.restart());
                ctx.tally.fault("PostgreSQL restarted");
            }
            _ => {
                cut_network(pg).await;
                ctx.tally.fault("network cut 3 s (SIGSTOP)");
            }
        }
    }
    pooler
}

/// What the pooler's console says of its servers, clients and pools (for a failed end).
async fn console_dump(pooler: &PoolerProcess) -> String {
    let Ok(c) = try_connect(&dsn_for(pooler.port(), "postgres", "pgbouncer")).await else {
        return "(console unreachable)".into();
    };
    let mut out = String::new();
    for view in ["SERVERS", "CLIENTS", "POOLS"] {
        out += &format!("SHOW {view}:\n");
        for m in c
            .simple_query(&format!("SHOW {view}"))
            .await
            .unwrap_or_default()
        {
            if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
                let cols: Vec<_> = (0..r.len()).map(|i| r.get(i).unwrap_or("")).collect();
                out += &format!("  {}\n", cols.join("|"));
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "long: run by scripts/soak"]
async fn soak() {
    let length = run_length();
    install_clients();
    let pg = TempPostgres::start();
    prepare_database(&pg);
    let certs = tempfile::tempdir().unwrap();
    let pooler = PoolerProcess::start_in(pooler_dir(&pg, certs.path()), &[]).await;
    let ctx = Arc::new(Ctx {
        port: pooler.port().into(),
        pid: pooler.pid().into(),
        tally: Tally::default(),
        stop: AtomicBool::new(false),
        killable: Mutex::new(Vec::new()),
    });
    let start = sample(&ctx, pg.port()).await;
    let peak = Arc::new(Mutex::new(start));
    let sampler = start_sampler(ctx.clone(), pg.port(), peak.clone());
    let began = Instant::now();
    let tasks = start_clients(&ctx);
    let every = (length / 10).min(Duration::from_secs(60));
    let pooler = inject_faults(&ctx, &pg, pooler, every, began + length).await;
    // The run length (the scenario), not a synchronisation.
    tokio::time::sleep_until((began + length).into()).await;
    ctx.stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(30), t).await;
    }
    for (h, _) in ctx.killable.lock().unwrap().drain(..) {
        h.abort();
    }
    let _ = sampler.await;
    let settled = harness::eventually(Duration::from_secs(60), || async {
        sample(&ctx, pg.port()).await.servers == 0
    })
    .await;
    let end = sample(&ctx, pg.port()).await;
    let peak = *peak.lock().unwrap();
    report(&ctx.tally, length, start, peak, end);
    if !settled || end.fds > start.fds + FD_BOUND {
        println!("{}", console_dump(&pooler).await);
        let fds = std::fs::read_dir(format!("/proc/{}/fd", pooler.pid()))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .map(|t| t.to_string_lossy().into_owned())
            .collect::<Vec<_>>();
        println!("descriptors: {fds:?}");
    }
    let log = pooler.log();
    assert!(!log.contains("panicked"), "panic in the log:\n{log}");
    assert_eq!(
        ctx.tally.wrong_rows.load(Ordering::Relaxed),
        0,
        "wrong rows: {:?}",
        ctx.tally.wrong.lock().unwrap()
    );
    assert!(settled, "server connections left: {end:?}");
    assert!(
        end.rss_kb <= start.rss_kb + RSS_BOUND_KB,
        "RSS: {start:?} -> {end:?}"
    );
    assert!(
        end.fds <= start.fds + FD_BOUND,
        "descriptors: {start:?} -> {end:?}"
    );
    assert!(ctx.tally.transactions.load(Ordering::Relaxed) > 0);
}

/// The figures, as a Markdown table for docs/testing.md.
fn report(t: &Tally, length: Duration, start: Sample, peak: Sample, end: Sample) {
    let mut out = format!(
        "\n### Soak run: {:.1} minutes\n\n| figure | value |\n|---|---|\n",
        length.as_secs_f64() / 60.0
    );
    let tx = t.transactions.load(Ordering::Relaxed);
    out += &format!("| transactions (checked) | {tx} |\n");
    out += &format!(
        "| wrong rows | {} |\n",
        t.wrong_rows.load(Ordering::Relaxed)
    );
    for (k, n) in t.drivers.lock().unwrap().iter() {
        out += &format!("| queries of {k} (in runs that passed) | {n} |\n");
    }
    for (k, n) in t.faults.lock().unwrap().iter() {
        out += &format!("| fault: {k} | {n} |\n");
    }
    for (k, n) in t.errors.lock().unwrap().iter() {
        out += &format!("| client error: {k} | {n} |\n");
    }
    for (name, s) in [("start", start), ("peak", peak), ("end", end)] {
        out += &format!(
            "| RSS / fds / servers at {name} | {} MiB / {} / {} |\n",
            s.rss_kb / 1024,
            s.fds,
            s.servers
        );
    }
    println!("{out}");
    for line in t.driver_errors.lock().unwrap().iter() {
        println!("driver error (a fault's): {line}");
    }
}

/// The classification of real drivers' FAIL lines (their formats in tests/clients).
#[test]
fn driver_failures_are_classified() {
    let faults = [
        (
            "FAIL: worker 1 iteration 4: unexpected error (SQLSTATE 08006): An I/O error occurred while sending to the backend.",
            "sqlstate 08006",
        ),
        (
            "FAIL: worker 0 iteration 9: unexpected AdminShutdownError (SQLSTATE 57P01): terminating connection due to administrator command",
            "sqlstate 57P01",
        ),
        (
            "FAIL: worker 0 iteration 2 division by zero: expected SQLSTATE 22012, got 08P01 (server conn crashed?)",
            "sqlstate 08P01",
        ),
        (
            "FAIL: worker 1 iteration 3: unexpected error: Connection terminated unexpectedly",
            "connection terminated",
        ),
        (
            "FAIL: worker 0: connect: failed to connect to `user=md5user database=testdb`: 127.0.0.1:5 (127.0.0.1): dial error: dial tcp 127.0.0.1:5: connect: connection refused",
            "connection refused",
        ),
        (
            "FAIL: worker 0 iteration 7 plus 3: unexpected EOF",
            "unexpected eof",
        ),
        (
            "FAIL: worker 1 iteration 0: unexpected OperationalError (SQLSTATE None): consuming input failed: server closed the connection unexpectedly",
            "closed the connection",
        ),
    ];
    for (line, kind) in faults {
        assert_eq!(driver_fault(line).as_deref(), Some(kind), "{line}");
    }
    let wrong = [
        "FAIL: worker 0 iteration 4 plus 2: got 7, want 6",
        "FAIL: worker 1 iteration 2 division by zero: expected SQLSTATE 22012, got success",
        "FAIL: worker 0 iteration 3 count: row count 400012, want 4",
        "FAIL: worker 0 iteration 3 plus 1: got 400012, want 4",
        "FAIL: worker 1 iteration 5: unexpected error (SQLSTATE 26000): prepared statement \"S_3\" does not exist",
    ];
    for line in wrong {
        assert_eq!(driver_fault(line), None, "{line}");
    }
}
