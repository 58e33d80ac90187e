//! Differential testing, the runner: the same client scripts (`diffgen`) run concurrently,
//! each client on its own connection, once straight against PostgreSQL and once through
//! pgcarpool in transaction mode over a small pool; every message each client receives is
//! recorded (`wire::record`) and compared per client. A difference is reduced to a short
//! script (`shrink`) and printed as a test to paste (`as_rust_test`).
//!
//! Each run gets a fresh database copied from a template holding the shared read-only table
//! `shared`, and a fresh pgcarpool: both sides start from the same state, and the run
//! through pgcarpool is not affected by an earlier one.
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::diffgen::ClientScript;
use super::wire::{StepEnd, Wire};
use super::{TempPostgres, TestPooler};

/// Every message one client received: `[0]` its login, `[k + 1]` its step `k`; a step that
/// ended with the connection closed or no reply ends with `<closed>` or `<timeout>`, and
/// is the client's last.
pub type Record = Vec<Vec<String>>;

/// How a pair of runs is made.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// pgcarpool's `default_pool_size` (servers per database and user).
    pub pool_size: usize,
    /// Issue 19 bug 1 (a COPY streamed without waiting keeps its server): when true, a
    /// client sends COPY data only after the server's CopyInResponse, as libpq does; when
    /// false, it streams the COPY query, data and CopyDone at once, as pgx does.
    pub copy_waits_for_copy_in_response: bool,
    /// How long a client waits for any one message before recording `<timeout>`.
    pub reply_limit: Duration,
    /// pgcarpool's `deferred_begin`.
    pub deferred_begin: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            pool_size: 2,
            copy_waits_for_copy_in_response: true,
            reply_limit: Duration::from_secs(30),
            deferred_begin: true,
        }
    }
}

/// The first message a client received differently.
#[derive(Debug, Clone)]
pub struct Difference {
    pub client: usize,
    /// None: in the login; Some(k): in step k.
    pub step: Option<usize>,
    /// Index of the first differing message within that login or step.
    pub index: usize,
    pub want: Vec<String>,
    pub got: Vec<String>,
}

/// A PostgreSQL to run pairs against, with the template database.
pub struct DiffEnv {
    pub pg: TempPostgres,
    admin: tokio_postgres::Client,
    next_db: AtomicUsize,
}

const TEMPLATE_SQL: &str = "\
CREATE TABLE shared (id int PRIMARY KEY, name text NOT NULL);
INSERT INTO shared SELECT g, 'name' || g FROM generate_series(1, 20) g;";

impl DiffEnv {
    pub async fn start() -> DiffEnv {
        let pg = TempPostgres::start_with(&[("max_connections", "200")]);
        let admin = pg.connect("postgres", "postgres").await;
        admin
            .batch_execute("CREATE DATABASE diff_template")
            .await
            .expect("create diff_template");
        let tpl = pg.connect("postgres", "diff_template").await;
        tpl.batch_execute(TEMPLATE_SQL)
            .await
            .expect("fill template");
        drop(tpl);
        DiffEnv {
            pg,
            admin,
            next_db: AtomicUsize::new(0),
        }
    }

    async fn fresh_db(&self) -> String {
        let name = format!("diff_{}", self.next_db.fetch_add(1, Ordering::Relaxed));
        // The template's last connection may still be leaving; retry while it is in use.
        for _ in 0..100 {
            let sql = format!("CREATE DATABASE {name} TEMPLATE diff_template");
            match self.admin.batch_execute(&sql).await {
                Ok(()) => return name,
                Err(e) if super::sqlstate(&e) == Some("55006") => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                Err(e) => panic!("{sql}: {e}"),
            }
        }
        panic!("diff_template stays in use");
    }

    async fn drop_db(&self, name: &str) {
        let sql = format!("DROP DATABASE {name} WITH (FORCE)");
        if let Err(e) = self.admin.batch_execute(&sql).await {
            // PostgreSQL itself can crash on a generated session (PostgreSQL 15.18 on
            // long-run seed 230144's direct run): that is its bug, not a difference.
            let log = self.pg.log();
            let crash = log.lines().find(|l| l.contains("terminated by signal"));
            match crash {
                Some(line) => panic!("PostgreSQL crashed, not pgcarpool: {line}"),
                None => panic!("drop database: {e}"),
            }
        }
    }

    /// Run `scripts` straight against PostgreSQL and through a fresh pgcarpool, at the
    /// same time (each in a database of its own): (PostgreSQL's records, pgcarpool's).
    pub async fn run_pair(
        &self,
        scripts: &[ClientScript],
        opts: &RunOptions,
    ) -> (Vec<Record>, Vec<Record>) {
        let direct_db = self.fresh_db().await;
        let pooled_db = self.fresh_db().await;
        let pooler = TestPooler::builder(&self.pg)
            .settings(&[
                ("pool_mode", "transaction"),
                ("auth_type", "trust"),
                ("default_pool_size", &opts.pool_size.to_string()),
                ("max_client_conn", "200"),
                // The notice PgBouncer (and pgcarpool) sends a client that waited 5 s for
                // a server is the pool's, not the session's: a loaded machine's long waits
                // (long-run seeds 12120, 12126) are not differences.
                ("query_wait_notify", "0"),
                (
                    "deferred_begin",
                    if opts.deferred_begin { "1" } else { "0" },
                ),
            ])
            .start()
            .await;
        let (want, got) = tokio::join!(
            run_clients(self.pg.port(), &direct_db, scripts, opts),
            run_clients(pooler.port(), &pooled_db, scripts, opts)
        );
        pooler.shutdown().await;
        self.drop_db(&direct_db).await;
        self.drop_db(&pooled_db).await;
        (want, got)
    }

    /// Run a pair; true when some client got the same first differing message pair as
    /// `like` (what a reduction must keep).
    pub async fn differs_like(
        &self,
        scripts: &[ClientScript],
        opts: &RunOptions,
        like: &Difference,
    ) -> bool {
        let (want, got) = self.run_pair(scripts, opts).await;
        all_differences(&want, &got)
            .iter()
            .any(|d| d.signature() == like.signature())
    }

    /// Run a pair and return its first difference, if any.
    pub async fn differs(&self, scripts: &[ClientScript], opts: &RunOptions) -> Option<Difference> {
        let (want, got) = self.run_pair(scripts, opts).await;
        first_difference(&want, &got)
    }
}

/// Run every client at once on `port`/`db`; their records in client order.
pub async fn run_clients(
    port: u16,
    db: &str,
    scripts: &[ClientScript],
    opts: &RunOptions,
) -> Vec<Record> {
    let tasks: Vec<_> = scripts
        .iter()
        .map(|s| tokio::spawn(run_client(port, db.to_string(), s.clone(), opts.clone())))
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("client task"));
    }
    out
}

async fn run_client(port: u16, db: String, script: ClientScript, opts: RunOptions) -> Record {
    let limit = opts.reply_limit;
    let (mut wire, login) =
        match Wire::connect_recorded(port, "postgres", &db, &script.startup, limit).await {
            Ok(ok) => ok,
            Err(mut seen) => {
                seen.push("<login failed>".into());
                return vec![seen];
            }
        };
    let mut record = vec![login];
    for step in &script.steps {
        // `{pid}`: the pid the client's BackendKeyData gave (PostgreSQL's own, or
        // pgcarpool's for the client).
        let step = step.replace("{pid}", &wire.pid.to_string());
        let (mut seen, end) = wire
            .record_step(&step, opts.copy_waits_for_copy_in_response, limit)
            .await;
        match end {
            StepEnd::Done => record.push(seen),
            StepEnd::Closed | StepEnd::Timeout => {
                seen.push(format!("<{}>", format!("{end:?}").to_lowercase()));
                record.push(seen);
                return record;
            }
        }
    }
    wire.terminate().await;
    record
}

impl Difference {
    /// The first differing pair of messages (PostgreSQL's, pgcarpool's).
    pub fn signature(&self) -> (Option<&String>, Option<&String>) {
        (self.want.get(self.index), self.got.get(self.index))
    }
}

/// The first message some client received differently (clients in order).
pub fn first_difference(want: &[Record], got: &[Record]) -> Option<Difference> {
    all_differences(want, got).into_iter().next()
}

/// Each client's first difference.
pub fn all_differences(want: &[Record], got: &[Record]) -> Vec<Difference> {
    let mut out = Vec::new();
    for (client, (w, g)) in want.iter().zip(got).enumerate() {
        for k in 0..w.len().max(g.len()) {
            let empty = Vec::new();
            let (ws, gs) = (w.get(k).unwrap_or(&empty), g.get(k).unwrap_or(&empty));
            if ws != gs || w.get(k).is_some() != g.get(k).is_some() {
                let index = ws.iter().zip(gs).take_while(|(a, b)| a == b).count();
                out.push(Difference {
                    client,
                    step: k.checked_sub(1),
                    index,
                    want: ws.clone(),
                    got: gs.clone(),
                });
                break;
            }
        }
    }
    out
}

/// The difference for a person: which client and step, the step's lines, and the
/// messages around the first differing one on both sides.
pub fn describe(d: &Difference, scripts: &[ClientScript]) -> String {
    let mut s = String::new();
    let script = &scripts[d.client];
    match d.step {
        None => {
            let _ = writeln!(
                s,
                "client {} differs in its login {:?}",
                d.client, script.startup
            );
        }
        Some(k) => {
            let _ = writeln!(s, "client {} differs in step {k}:", d.client);
            for l in script.steps[k].lines() {
                let _ = writeln!(s, "    {l}");
            }
        }
    }
    let from = d.index.saturating_sub(3);
    for (side, msgs) in [("PostgreSQL", &d.want), ("pgcarpool", &d.got)] {
        let _ = writeln!(
            s,
            "--- {side} (message {from} on; `>` marks the first difference)"
        );
        for (i, m) in msgs.iter().enumerate().skip(from).take(8) {
            let mark = if i == d.index { '>' } else { ' ' };
            let _ = writeln!(s, "  {mark} {m}");
        }
        if msgs.len() <= d.index {
            let _ = writeln!(s, "  > (nothing: {} messages in all)", msgs.len());
        }
    }
    s
}

/// Delta debugging: drop clients, then steps of each client, then startup parameters,
/// keeping each removal after which a pair of runs still gives some client the same first
/// differing pair of messages as `like`; stops when `budget` is spent. Returns the reduced scripts and the number of pairs run.
pub async fn shrink(
    env: &DiffEnv,
    scripts: &[ClientScript],
    like: &Difference,
    opts: &RunOptions,
    budget: Duration,
) -> (Vec<ClientScript>, usize) {
    let first = like.client;
    let deadline = Instant::now() + budget;
    let mut runs = 0;
    let mut cur = scripts.to_vec();
    // The differing client alone, else drop the others in halves, quarters, …
    let alone = vec![cur[first].clone()];
    runs += 1;
    if env.differs_like(&alone, opts, like).await {
        cur = alone;
    } else {
        cur = ddmin(cur, deadline, &mut runs, |c| {
            Box::pin(async move { env.differs_like(&c, opts, like).await.then_some(c) })
        })
        .await;
    }
    for c in 0..cur.len() {
        let steps = cur[c].steps.clone();
        let base = cur.clone();
        let reduced = ddmin(steps, deadline, &mut runs, |steps| {
            let mut trial = base.clone();
            trial[c].steps = steps;
            Box::pin(async move {
                let hit = env.differs_like(&trial, opts, like).await;
                hit.then(|| trial[c].steps.clone())
            })
        })
        .await;
        cur[c].steps = reduced;
        if !cur[c].startup.is_empty() && Instant::now() < deadline {
            let mut trial = cur.clone();
            trial[c].startup.clear();
            runs += 1;
            if env.differs_like(&trial, opts, like).await {
                cur = trial;
            }
        }
    }
    (cur, runs)
}

type Trial<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = Option<Vec<T>>> + 'a>>;

/// Remove chunks of `items` (halves, then quarters, … single items) while `still_fails`
/// returns Some for what is left; stops at `deadline`.
async fn ddmin<'a, T: Clone>(
    mut items: Vec<T>,
    deadline: Instant,
    runs: &mut usize,
    mut still_fails: impl FnMut(Vec<T>) -> Trial<'a, T>,
) -> Vec<T> {
    let mut chunk = items.len().div_ceil(2).max(1);
    loop {
        let mut at = 0;
        while at < items.len() {
            if Instant::now() >= deadline || items.len() <= 1 {
                return items;
            }
            let mut trial = items.clone();
            trial.drain(at..(at + chunk).min(items.len()));
            *runs += 1;
            match still_fails(trial).await {
                Some(smaller) => items = smaller,
                None => at += chunk,
            }
        }
        if chunk == 1 {
            return items;
        }
        chunk = chunk.div_ceil(2);
    }
}

/// The scripts as a regular test to paste into tests/differential.rs.
pub fn as_rust_test(name: &str, scripts: &[ClientScript], opts: &RunOptions) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "#[tokio::test(flavor = \"multi_thread\", worker_threads = 2)]"
    );
    let _ = writeln!(s, "async fn {name}() {{");
    let _ = writeln!(s, "    let scripts = [");
    for c in scripts {
        let startup: Vec<String> = c
            .startup
            .iter()
            .map(|(k, v)| format!("({k:?}, {v:?})"))
            .collect();
        let _ = writeln!(s, "        ClientScript::new(");
        let _ = writeln!(s, "            &[{}],", startup.join(", "));
        let _ = writeln!(s, "            &[");
        for step in &c.steps {
            let _ = writeln!(s, "                {step:?},");
        }
        let _ = writeln!(s, "            ],");
        let _ = writeln!(s, "        ),");
    }
    let _ = writeln!(s, "    ];");
    let _ = writeln!(
        s,
        "    assert_same(&scripts, &RunOptions {{ pool_size: {}, copy_waits_for_copy_in_response: {}, ..RunOptions::default() }}).await;",
        opts.pool_size, opts.copy_waits_for_copy_in_response
    );
    let _ = writeln!(s, "}}");
    s
}

/// For regression tests: the scripts give every client the same messages both ways.
pub async fn assert_same(scripts: &[ClientScript], opts: &RunOptions) {
    let env = DiffEnv::start().await;
    if let Some(d) = env.differs(scripts, opts).await {
        panic!("{}", describe(&d, scripts));
    }
}
