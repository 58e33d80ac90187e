//! The admin console (database `pgbouncer`): every command answers, SHOW columns are
//! PgBouncer's documented ones, psql and extended-protocol drivers work, roles, stats, /metrics.
mod harness;

use std::collections::HashMap;
use std::time::Duration;

use harness::{TempPostgres, TestPooler, cl_waiting, pg_bin, rows, sqlstate, wait_for};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_postgres::{Client, SimpleQueryMessage};

async fn console(p: &TestPooler) -> Client {
    p.connect("postgres", "pgbouncer").await
}

fn num(row: &HashMap<String, Option<String>>, col: &str) -> u64 {
    row.get(col)
        .unwrap_or_else(|| panic!("no column {col} in {row:?}"))
        .as_deref()
        .unwrap_or("0")
        .parse()
        .unwrap()
}

/// The column lists of PgBouncer's doc/usage.md (1.24/1.25), in order.
const DOCUMENTED: &[(&str, &[&str])] = &[
    ("CONFIG", &["key", "value", "default", "changeable"]),
    (
        "DATABASES",
        &[
            "name",
            "host",
            "port",
            "database",
            "force_user",
            "pool_size",
            "min_pool_size",
            "reserve_pool_size",
            "server_lifetime",
            "pool_mode",
            "load_balance_hosts",
            "max_connections",
            "current_connections",
            "max_client_connections",
            "current_client_connections",
            "paused",
            "disabled",
        ],
    ),
    (
        "POOLS",
        &[
            "database",
            "user",
            "cl_active",
            "cl_waiting",
            "cl_active_cancel_req",
            "cl_waiting_cancel_req",
            "sv_active",
            "sv_active_cancel",
            "sv_being_canceled",
            "sv_idle",
            "sv_used",
            "sv_tested",
            "sv_login",
            "maxwait",
            "maxwait_us",
            "pool_mode",
            "load_balance_hosts",
        ],
    ),
    (
        "CLIENTS",
        &[
            "type",
            "user",
            "database",
            "replication",
            "state",
            "addr",
            "port",
            "local_addr",
            "local_port",
            "connect_time",
            "request_time",
            "wait",
            "wait_us",
            "close_needed",
            "ptr",
            "link",
            "remote_pid",
            "tls",
            "application_name",
            "prepared_statements",
            "id",
        ],
    ),
    (
        "SERVERS",
        &[
            "type",
            "user",
            "database",
            "replication",
            "state",
            "addr",
            "port",
            "local_addr",
            "local_port",
            "connect_time",
            "request_time",
            "wait",
            "wait_us",
            "close_needed",
            "ptr",
            "link",
            "remote_pid",
            "tls",
            "application_name",
            "prepared_statements",
            "id",
        ],
    ),
    (
        "USERS",
        &[
            "name",
            "pool_size",
            "reserve_pool_size",
            "pool_mode",
            "max_user_connections",
            "current_connections",
            "max_user_client_connections",
            "current_client_connections",
        ],
    ),
    // SHOW STATS as the 1.25.2 binary sends it (src/stats.c; its docs differ).
    (
        "STATS",
        &[
            "database",
            "total_server_assignment_count",
            "total_xact_count",
            "total_query_count",
            "total_received",
            "total_sent",
            "total_xact_time",
            "total_query_time",
            "total_wait_time",
            "total_client_parse_count",
            "total_server_parse_count",
            "total_bind_count",
            "avg_server_assignment_count",
            "avg_xact_count",
            "avg_query_count",
            "avg_recv",
            "avg_sent",
            "avg_xact_time",
            "avg_query_time",
            "avg_wait_time",
            "avg_client_parse_count",
            "avg_server_parse_count",
            "avg_bind_count",
        ],
    ),
    ("LISTS", &["list", "items"]),
    ("PEERS", &["peer_id", "host", "port", "pool_size"]),
    (
        "PEER_POOLS",
        &[
            "peer_id",
            "cl_active_cancel_req",
            "cl_waiting_cancel_req",
            "sv_active_cancel",
            "sv_login",
        ],
    ),
    (
        "FDS",
        &[
            "fd",
            "task",
            "user",
            "database",
            "addr",
            "port",
            "cancel",
            "link",
            "client_encoding",
            "std_strings",
            "datestyle",
            "timezone",
            "password",
            "scram_client_key",
            "scram_server_key",
        ],
    ),
    ("MEM", &["name", "size", "used", "free", "memtotal"]),
    ("DNS_HOSTS", &["hostname", "ttl", "addrs"]),
    ("DNS_ZONES", &["zonename", "serial", "count"]),
    ("VERSION", &["version"]),
];

/// STATS_TOTALS as the 1.25.2 binary sends it (STATS_AVERAGES: the last three with an
/// `avg_` prefix).
const STATS_SUBSET: &[&str] = &[
    "database",
    "server_assignment_count",
    "xact_count",
    "query_count",
    "bytes_received",
    "bytes_sent",
    "xact_time",
    "query_time",
    "wait_time",
    "client_parse_count",
    "server_parse_count",
    "bind_count",
];

/// With server_check_delay = 0 a server back in the pool is due its check before the
/// next client (PgBouncer's "used"): SHOW POOLS counts it in sv_used, not sv_idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_pools_counts_servers_due_their_check_as_used() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .settings(&[
            ("pool_mode", "transaction"),
            ("server_check_delay", "0"),
            ("server_check_query", "select 1"),
        ])
        .start()
        .await;
    let c = console(&p).await;
    let app = p.connect("postgres", "testdb").await;
    app.simple_query("select 1").await.unwrap();
    let pool = |rows: Vec<HashMap<String, Option<String>>>| {
        rows.into_iter()
            .find(|r| r["database"].as_deref() == Some("testdb"))
            .expect("a testdb pool")
    };
    wait_for(
        "the server back in the pool",
        Duration::from_secs(10),
        || async { num(&pool(rows(&c, "SHOW POOLS").await), "sv_active") == 0 },
    )
    .await;
    let row = pool(rows(&c, "SHOW POOLS").await);
    assert_eq!(
        (
            num(&row, "sv_used"),
            num(&row, "sv_idle"),
            num(&row, "sv_login")
        ),
        (1, 0, 0),
        "{row:?}"
    );
    // The next transaction runs the check, and finds the server good.
    app.simple_query("select 2").await.unwrap();
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_columns_match_pgbouncer_docs() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg).start().await;
    let c = console(&p).await;
    let mut expected: Vec<(String, Vec<&str>)> = DOCUMENTED
        .iter()
        .map(|(v, cols)| (v.to_string(), cols.to_vec()))
        .collect();
    expected.push(("STATS_TOTALS".into(), STATS_SUBSET.to_vec()));
    let mut averages = STATS_SUBSET.to_vec();
    averages[9..].copy_from_slice(&[
        "avg_client_parse_count",
        "avg_server_parse_count",
        "avg_bind_count",
    ]);
    expected.push(("STATS_AVERAGES".into(), averages));
    for (view, cols) in expected {
        let stmt = c
            .prepare(&format!("SHOW {view}"))
            .await
            .unwrap_or_else(|e| panic!("SHOW {view}: {e}"));
        let got: Vec<&str> = stmt.columns().iter().map(|c| c.name()).collect();
        assert_eq!(got, cols, "SHOW {view}");
    }
    p.shutdown().await;
}

/// Every SHOW view, PgBouncer's and pgcarpool's own.
const VIEWS: [&str; 28] = [
    "HELP",
    "CONFIG",
    "DATABASES",
    "POOLS",
    "CLIENTS",
    "SERVERS",
    "USERS",
    "STATS",
    "STATS_TOTALS",
    "STATS_AVERAGES",
    "TOTALS",
    "LISTS",
    "MEM",
    "FDS",
    "SOCKETS",
    "ACTIVE_SOCKETS",
    "DNS_HOSTS",
    "DNS_ZONES",
    "VERSION",
    "STATE",
    "PEERS",
    "PEER_POOLS",
    "PREPARED_STATEMENTS",
    "CARPOOL",
    "POOLS_EXT",
    "PINS",
    "WORKERS",
    "EVENTS",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_answers() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .start()
        .await;
    let app = p.connect("postgres", "testdb").await;
    app.simple_query("select 1").await.unwrap();
    let c = console(&p).await;
    for view in VIEWS {
        c.simple_query(&format!("SHOW {view}"))
            .await
            .unwrap_or_else(|e| panic!("SHOW {view}: {e}"));
        c.simple_query(&format!("show {};", view.to_lowercase()))
            .await
            .unwrap_or_else(|e| panic!("show {view}: {e}"));
    }
    for cmd in [
        "SET default_pool_size = 7",
        "RELOAD",
        "PAUSE testdb",
        "RESUME testdb",
        "PAUSE",
        "RESUME",
        "RECONNECT testdb",
        "RECONNECT",
        "WAIT_CLOSE testdb",
        "WAIT_CLOSE",
        "DISABLE testdb",
        "ENABLE testdb",
        "KILL testdb",
        "SUSPEND",
        "RESUME",
    ] {
        c.simple_query(cmd)
            .await
            .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    }
    for (cmd, code) in [
        // Only for a new pgcarpool taking over (-R), over the Unix socket.
        ("HANDOVER", "08P01"),
        ("KILL_CLIENT 999999", "08P01"),
        ("KILL_CLIENT not_a_number", "08P01"),
        ("KILL nosuchdb", "08P01"),
        ("SELECT 1", "42601"),
        ("SHOW NOTHING", "42601"),
        ("SET no_such_setting = 1", "22023"),
        ("SET listen_port = 1", "22023"),
    ] {
        let e = c
            .simple_query(cmd)
            .await
            .err()
            .unwrap_or_else(|| panic!("{cmd} succeeded"));
        assert_eq!(sqlstate(&e), Some(code), "{cmd}: {e}");
    }
    // The session goes on after errors. SHOW VERSION says what `pgcarpool --version` says
    // (PgBouncer's own test checks this; tools read either).
    let version = rows(&c, "SHOW VERSION").await;
    assert_eq!(version.len(), 1);
    let out = std::process::Command::new(harness::process::BIN)
        .arg("--version")
        .output()
        .unwrap();
    let cli = String::from_utf8_lossy(&out.stdout);
    assert_eq!(version[0]["version"].as_deref(), cli.lines().next());
    assert!(cli.starts_with("PgBouncer 1.25.2 (pgcarpool "), "{cli}");
    // SET changes the running config (the RELOAD above went back to the file's value).
    c.simple_query("SET default_pool_size = 7").await.unwrap();
    let config = rows(&c, "SHOW CONFIG").await;
    let pool_size = config
        .iter()
        .find(|r| r["key"].as_deref() == Some("default_pool_size"))
        .unwrap();
    assert_eq!(pool_size["value"].as_deref(), Some("7"));
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql_answers_every_command() {
    let pg = TempPostgres::start();
    // testdb named in [databases]: the commands below name it (a name only `*` would
    // accept is "no such database" until a client uses it, as in PgBouncer).
    let p = TestPooler::builder(&pg)
        .database("testdb", &pg.db_entry("testdb"))
        .start()
        .await;

    let mut args: Vec<String> = [
        "-X",
        "-v",
        "ON_ERROR_STOP=1",
        "-h",
        "127.0.0.1",
        "-p",
        &p.port().to_string(),
        "-U",
        "postgres",
        "-d",
        "pgbouncer",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for v in VIEWS {
        args.push("-c".into());
        args.push(format!("SHOW {v}"));
    }
    for cmd in [
        "SET default_pool_size = 7",
        "RELOAD",
        "PAUSE testdb",
        "RESUME testdb",
        "PAUSE",
        "RESUME",
        "RECONNECT testdb",
        "WAIT_CLOSE testdb",
        "DISABLE testdb",
        "ENABLE testdb",
        "KILL testdb",
        "RESUME testdb",
    ] {
        args.push("-c".into());
        args.push(cmd.into());
    }
    let out = std::process::Command::new(pg_bin("psql"))
        .args(&args)
        .env("PGPASSWORD", "postgres")
        .env("PGCONNECT_TIMEOUT", "10")
        .output()
        .expect("run psql");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "psql failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    for header in [
        "cl_active",
        "maxwait_us",
        "total_xact_count",
        "pool_mode",
        "query_p99_us",
    ] {
        assert!(
            stdout.contains(header),
            "{header} missing from psql output:\n{stdout}"
        );
    }
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extended_protocol_works() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg).start().await;
    let app = p.connect("postgres", "testdb").await;
    app.simple_query("select 1").await.unwrap();
    let c = console(&p).await;
    let rows = c.query("SHOW POOLS", &[]).await.unwrap();
    let row = rows
        .iter()
        .find(|r| r.get::<_, &str>("database") == "testdb")
        .expect("testdb pool");
    assert_eq!(row.get::<_, &str>("user"), "postgres");
    assert_eq!(row.get::<_, i64>("cl_active"), 1);
    // A statement reused, and a command without rows.
    let stmt = c.prepare("SHOW STATS").await.unwrap();
    assert!(!c.query(&stmt, &[]).await.unwrap().is_empty());
    assert!(!c.query(&stmt, &[]).await.unwrap().is_empty());
    assert_eq!(c.execute("RESUME", &[]).await.unwrap(), 0);
    let e = c.query("NOT A COMMAND", &[]).await.expect_err("error");
    assert_eq!(sqlstate(&e), Some("42601"));
    assert_eq!(c.query("SHOW VERSION", &[]).await.unwrap().len(), 1);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_users_may_only_show() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("stats_users", "md5user")
        .start()
        .await;
    let c = p.connect("md5user", "pgbouncer").await;
    c.simple_query("SHOW POOLS").await.unwrap();
    for cmd in [
        "PAUSE",
        "RELOAD",
        "SET default_pool_size = 3",
        "SHUTDOWN",
        "KILL testdb",
    ] {
        let e = c
            .simple_query(cmd)
            .await
            .err()
            .unwrap_or_else(|| panic!("stats user ran {cmd}"));
        assert_eq!(sqlstate(&e), Some("42501"), "{cmd}: {e}");
    }
    // Not a console user at all.
    let e = harness::try_connect(&p.dsn("trustuser", "pgbouncer"))
        .await
        .expect_err("refused");
    assert_eq!(sqlstate(&e), Some("28000"));
    p.shutdown().await;
}

async fn get_metrics(port: u16) -> String {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    let (head, body) = buf.split_once("\r\n\r\n").expect("http response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_string()
}

/// Sum of a metric's samples whose labels contain `label`.
fn metric_sum(body: &str, name: &str, label: &str) -> f64 {
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<f64>().unwrap())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_count_a_known_workload_and_metrics_agree() {
    let pg = TempPostgres::start();
    let (p, mport) = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .start_with_free_port("prometheus_port")
        .await;
    let app = p.connect("postgres", "testdb").await;
    // Bytes the client sends for its queries: a Query message each (tag, length, text, NUL).
    let mut sent = 0;
    for i in 0..10 {
        let sql = format!("select {i}");
        sent += 1 + 4 + sql.len() as u64 + 1;
        app.simple_query(&sql).await.unwrap();
    }
    let c = console(&p).await;
    let stats = rows(&c, "SHOW STATS").await;
    let db = stats
        .iter()
        .find(|r| r["database"].as_deref() == Some("testdb"))
        .expect("testdb stats");
    assert_eq!(num(db, "total_xact_count"), 10);
    assert_eq!(num(db, "total_query_count"), 10);
    assert_eq!(num(db, "total_server_assignment_count"), 10);
    assert_eq!(num(db, "total_received"), sent, "{db:?}");
    assert!(num(db, "total_sent") > 0);
    assert!(num(db, "total_query_time") > 0 && num(db, "total_xact_time") > 0);
    let totals = rows(&c, "SHOW STATS_TOTALS").await;
    let row = |db: &str| {
        totals
            .iter()
            .find(|r| r["database"].as_deref() == Some(db))
            .unwrap_or_else(|| panic!("no {db} row: {totals:?}"))
            .clone()
    };
    assert_eq!(num(&row("testdb"), "xact_count"), 10);
    // The console's commands count on database pgbouncer, as in PgBouncer: SHOW STATS
    // and this SHOW STATS_TOTALS.
    assert_eq!(num(&row("pgbouncer"), "xact_count"), 2);
    assert_eq!(num(&row("pgbouncer"), "query_count"), 2);
    let all = rows(&c, "SHOW TOTALS").await;
    let total = |name: &str| {
        all.iter()
            .find(|r| r["name"].as_deref() == Some(name))
            .map(|r| num(r, "value"))
            .unwrap_or_else(|| panic!("no {name} in SHOW TOTALS: {all:?}"))
    };
    assert_eq!(total("total_xact_count"), 13, "10 + 3 console commands");
    assert_eq!(total("total_server_assignment_count"), 10);
    assert_eq!(total("total_client_bytes"), sent);
    let carpool = rows(&c, "SHOW CARPOOL").await;
    assert_eq!(num(&carpool[0], "xact_count"), 10);
    assert!(num(&carpool[0], "query_p99_us") > 0);

    let body = get_metrics(mport).await;
    // Text format: HELP and TYPE for every family; every sample is `name{labels} value`.
    let mut families = std::collections::BTreeSet::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            assert!(
                body.contains(&format!("# HELP {name} ")),
                "no HELP for {name}"
            );
            families.insert(name.to_string());
        } else if !line.starts_with('#') && !line.is_empty() {
            let (series, value) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("bad line {line}"));
            assert!(
                value.parse::<f64>().is_ok() || value == "+Inf",
                "bad value: {line}"
            );
            let name = series.split('{').next().unwrap();
            assert!(
                name.starts_with("pgcarpool_")
                    && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                "{line}"
            );
            if let Some(labels) = series.strip_prefix(name) {
                assert!(
                    labels.is_empty() || (labels.starts_with('{') && labels.ends_with('}')),
                    "{line}"
                );
            }
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|f| families.contains(*f)))
                .unwrap_or(name);
            assert!(families.contains(family), "sample before its TYPE: {line}");
        }
    }
    assert!(body.contains("pgcarpool_build_info{"), "{body}");
    // Every metric the Grafana dashboard queries exists.
    let dash = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/grafana-dashboard.json"
    ))
    .unwrap();
    for (i, _) in dash.match_indices("pgcarpool_") {
        let name: String = dash[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        assert!(
            body.contains(&format!("\n{name}")),
            "dashboard uses {name}, /metrics has none"
        );
    }
    let l = "database=\"testdb\"";
    assert_eq!(
        metric_sum(&body, "pgcarpool_transactions_total", l) as u64,
        num(db, "total_xact_count")
    );
    assert_eq!(
        metric_sum(&body, "pgcarpool_queries_total", l) as u64,
        num(db, "total_query_count")
    );
    assert_eq!(
        metric_sum(&body, "pgcarpool_received_bytes_total", l) as u64,
        num(db, "total_received")
    );
    assert_eq!(
        metric_sum(&body, "pgcarpool_sent_bytes_total", l) as u64,
        num(db, "total_sent")
    );
    assert_eq!(
        metric_sum(&body, "pgcarpool_transaction_duration_seconds_count", l) as u64,
        10
    );
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_applies_a_new_default_pool_size() {
    let pg = TempPostgres::start();
    let mut p = TestPooler::builder(&pg)
        .setting("default_pool_size", "3")
        .start()
        .await;
    let app = p.connect("postgres", "testdb").await;
    app.simple_query("select 1").await.unwrap();
    let c = console(&p).await;
    let pool_size = |rows: &[HashMap<String, Option<String>>]| {
        let r = rows
            .iter()
            .find(|r| r["name"].as_deref() == Some("testdb"))
            .expect("testdb");
        num(r, "pool_size")
    };
    assert_eq!(pool_size(&rows(&c, "SHOW DATABASES").await), 3);
    p.rewrite_config(|b| b.setting("default_pool_size", "9"));
    c.simple_query("RELOAD").await.unwrap();
    assert_eq!(pool_size(&rows(&c, "SHOW DATABASES").await), 9);
    // A broken file: RELOAD fails and the old config stays.
    std::fs::write(
        p.dir().join("pgbouncer.ini"),
        "[pgbouncer]\nno_such_setting = 1\n",
    )
    .unwrap();
    let e = c
        .simple_query("RELOAD")
        .await
        .expect_err("RELOAD of a broken file");
    let db = e.as_db_error().expect("an ErrorResponse");
    assert_eq!(
        (db.code().code(), db.message()),
        ("F0000", "RELOAD failed, see logs for additional details")
    );
    assert_eq!(pool_size(&rows(&c, "SHOW DATABASES").await), 9);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disable_refuses_new_clients_until_enable() {
    let pg = TempPostgres::start();
    // testdb named in [databases]: SHOW DATABASES has its row from the start.
    let p = TestPooler::builder(&pg)
        .database("testdb", &pg.db_entry("testdb"))
        .start()
        .await;
    let c = console(&p).await;
    let disabled = |dbs: &[HashMap<String, Option<String>>]| {
        let row = dbs
            .iter()
            .find(|r| r["name"].as_deref() == Some("testdb"))
            .unwrap_or_else(|| panic!("no testdb row in SHOW DATABASES: {dbs:?}"));
        num(row, "disabled")
    };
    assert_eq!(disabled(&rows(&c, "SHOW DATABASES").await), 0);
    c.simple_query("DISABLE testdb").await.unwrap();
    assert_eq!(disabled(&rows(&c, "SHOW DATABASES").await), 1);
    let e = harness::try_connect(&p.dsn("postgres", "testdb"))
        .await
        .expect_err("disabled db accepted a client");
    let msg = e
        .as_db_error()
        .map(|d| d.message().to_string())
        .unwrap_or_else(|| e.to_string());
    assert_eq!(msg, "database \"testdb\" is disabled");
    c.simple_query("ENABLE testdb").await.unwrap();
    assert_eq!(disabled(&rows(&c, "SHOW DATABASES").await), 0);
    p.connect("postgres", "testdb")
        .await
        .simple_query("select 1")
        .await
        .unwrap();
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_client_disconnects_that_client() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg).start().await;
    let app = p.connect("postgres", "testdb").await;
    app.simple_query("select 1").await.unwrap();
    let c = console(&p).await;
    let all = rows(&c, "SHOW CLIENTS").await;
    // The application's client and, as in PgBouncer, the console's own connection.
    assert_eq!(all.len(), 2, "{all:?}");
    let console_row: Vec<_> = all
        .iter()
        .filter(|r| r["database"].as_deref() == Some("pgbouncer"))
        .cloned()
        .collect();
    assert_eq!(console_row.len(), 1, "{all:?}");
    assert_eq!(console_row[0]["user"].as_deref(), Some("postgres"));
    let clients: Vec<_> = all
        .into_iter()
        .filter(|r| r["database"].as_deref() == Some("testdb"))
        .collect();
    assert_eq!(clients.len(), 1);
    // Session mode: the client keeps its server, so it shows as active.
    assert_eq!(clients[0]["state"].as_deref(), Some("active"));
    let id = num(&clients[0], "id");
    // Its server is listed as active, linked to it.
    let servers = rows(&c, "SHOW SERVERS").await;
    let active: Vec<_> = servers
        .iter()
        .filter(|r| r["state"].as_deref() == Some("active"))
        .collect();
    assert_eq!(active.len(), 1, "{servers:?}");
    assert_eq!(active[0]["database"].as_deref(), Some("testdb"));
    assert_eq!(active[0]["link"], clients[0]["ptr"]);
    assert!(num(active[0], "remote_pid") > 0);
    // Killed in the middle of a query: the query ends with PgBouncer's words.
    let app = std::sync::Arc::new(app);
    let busy = tokio::spawn({
        let app = app.clone();
        async move { app.simple_query("select pg_sleep(30)").await }
    });
    let obs = harness::Observer::new(&pg).await;
    obs.wait_running("postgres", "pg_sleep(30)", 1).await;
    c.simple_query(&format!("KILL_CLIENT {id}")).await.unwrap();
    let e = tokio::time::timeout(Duration::from_secs(5), busy)
        .await
        .expect("the killed client's query goes on")
        .unwrap()
        .expect_err("the killed client's query succeeded");
    let db = e.as_db_error().expect("an ErrorResponse");
    assert_eq!(
        (db.code().code(), db.message()),
        ("08P01", "admin forced disconnect")
    );
    // KILL_CLIENT ends a console connection too.
    let other = console(&p).await;
    let console_id = num(&console_row[0], "id");
    other
        .simple_query(&format!("KILL_CLIENT {console_id}"))
        .await
        .unwrap();
    assert!(c.simple_query("SHOW VERSION").await.is_err());
    p.shutdown().await;
}

/// SHOW STATS counts named statements as PgBouncer does: the clients' Parses, the Parses
/// pgcarpool sends to servers (once per server holding the text, whichever client asked),
/// and the clients' Binds. SHOW CLIENTS and SERVERS count the statements each holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_stats_counts_parses_and_binds_of_named_statements() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "2")
        .start()
        .await;
    let c1 = p.connect("postgres", "testdb").await;
    let c2 = p.connect("postgres", "testdb").await;
    // Client 1 prepares on the pool's one server and runs it there three times.
    let s1 = c1.prepare("select 1").await.unwrap();
    for _ in 0..3 {
        c1.query(&s1, &[]).await.unwrap();
    }
    // Client 2 holds that server: client 1's next run prepares it on a second server.
    c2.batch_execute("begin; select 2").await.unwrap();
    c1.query(&s1, &[]).await.unwrap();
    // Client 2 prepares the same text: its server holds it already.
    let s2 = c2.prepare("select 1").await.unwrap();
    c2.query(&s2, &[]).await.unwrap();
    c2.batch_execute("commit").await.unwrap();
    let admin = console(&p).await;
    let stats = rows(&admin, "SHOW STATS").await;
    let db = stats
        .iter()
        .find(|r| r["database"].as_deref() == Some("testdb"))
        .expect("a testdb row");
    let counts = [
        num(db, "total_client_parse_count"),
        num(db, "total_server_parse_count"),
        num(db, "total_bind_count"),
    ];
    assert_eq!(counts, [2, 2, 5], "{db:?}");
    // `prepared_statements`: each client's own statements, each server's.
    let clients = rows(&admin, "SHOW CLIENTS").await;
    let per_client: Vec<u64> = clients
        .iter()
        .filter(|r| r["database"].as_deref() == Some("testdb"))
        .map(|r| num(r, "prepared_statements"))
        .collect();
    assert_eq!(per_client, [1, 1], "{clients:?}");
    let servers = rows(&admin, "SHOW SERVERS").await;
    let per_server: Vec<u64> = servers
        .iter()
        .map(|r| num(r, "prepared_statements"))
        .collect();
    assert_eq!(per_server, [1, 1], "{servers:?}");
    drop((s1, s2));
    p.shutdown().await;
}

fn ids(rows: &[HashMap<String, Option<String>>]) -> std::collections::BTreeSet<u64> {
    rows.iter().map(|r| num(r, "id")).collect()
}

/// Clients and servers draw their `id` from one sequence, as PgBouncer's sockets do; SHOW
/// SOCKETS lists both (the console's own connection too) with SHOW CLIENTS' columns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_and_servers_share_one_id_sequence() {
    let pg = TempPostgres::start();
    // Session mode; every server is used once.
    let p = TestPooler::builder(&pg)
        .setting("server_lifetime", "0")
        .start()
        .await;
    let c = console(&p).await;
    let own = rows(&c, "SHOW SOCKETS").await;
    assert_eq!(own.len(), 1, "{own:?}");
    let first = num(&own[0], "id");
    for i in 1..=2u64 {
        let app = p.connect("postgres", "testdb").await;
        app.simple_query("select 1").await.unwrap();
        let sockets = rows(&c, "SHOW SOCKETS").await;
        assert_eq!(
            ids(&sockets),
            [first, first + 2 * i - 1, first + 2 * i].into(),
            "{sockets:?}"
        );
        let server: Vec<_> = sockets
            .iter()
            .filter(|r| r["type"].as_deref() == Some("S"))
            .collect();
        assert_eq!(server.len(), 1, "{sockets:?}");
        assert_eq!(server[0]["state"].as_deref(), Some("active"));
        assert_eq!(num(server[0], "id"), first + 2 * i);
        assert_eq!(ids(&rows(&c, "SHOW SERVERS").await), [first + 2 * i].into());
        assert_eq!(
            ids(&rows(&c, "SHOW CLIENTS").await),
            [first, first + 2 * i - 1].into()
        );
        drop(app);
        wait_for(
            "the client and its server gone",
            Duration::from_secs(5),
            || async { rows(&c, "SHOW SOCKETS").await.len() == 1 },
        )
        .await;
    }
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_waits_and_resume_lets_queries_run() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .start()
        .await;
    let app = p.connect("postgres", "testdb").await;
    app.simple_query("select 1").await.unwrap();
    let c = console(&p).await;
    c.simple_query("PAUSE testdb").await.unwrap();
    let state = rows(&c, "SHOW DATABASES").await;
    assert_eq!(
        num(
            state
                .iter()
                .find(|r| r["name"].as_deref() == Some("testdb"))
                .unwrap(),
            "paused"
        ),
        1
    );
    let q = tokio::spawn(async move { app.simple_query("select 2").await.map(|_| ()) });
    // The query waits: the console sees a waiting client.
    wait_for(
        "a waiting client in SHOW POOLS",
        Duration::from_secs(10),
        || async { cl_waiting(&c, "testdb", "postgres").await == 1 },
    )
    .await;
    assert!(!q.is_finished(), "the query ran while testdb was paused");
    c.simple_query("RESUME testdb").await.unwrap();
    q.await.unwrap().unwrap();
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_answers_and_stops_the_pooler() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg).start().await;
    let c = console(&p).await;
    c.simple_query("SHUTDOWN").await.unwrap();
    // New connections are refused from now on.
    wait_for(
        "new connections refused",
        Duration::from_secs(10),
        || async {
            harness::try_connect(&p.dsn("postgres", "testdb"))
                .await
                .is_err()
        },
    )
    .await;
    p.shutdown().await;
}

/// A shutdown ends every client, idle ones too (KILL flags each client's handle and wakes
/// its task: `Registry::kill_all`), each told why before its connection closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_tells_idle_clients_why_they_are_let_go() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("auth_type", "trust")
        .start()
        .await;
    let mut idle = harness::wire::Wire::connect(p.port(), "postgres", "testdb").await;
    let c = console(&p).await;
    c.simple_query("SHUTDOWN").await.unwrap();
    let words = idle.until_closed().await;
    let told: Vec<_> = words
        .iter()
        .map(|(tag, body)| (*tag as char, harness::wire::error_fields(body)))
        .collect();
    assert_eq!(
        told,
        [('E', ("08P01".to_string(), "database removed".to_string()))]
    );
    p.shutdown().await;
}

/// With `worker_spread_load = 0`, clients are spread over the worker threads; servers
/// follow the clients that use them but mostly stay on their worker (SHOW WORKERS, SHOW
/// CARPOOL server_moves); every answer is right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_are_spread_over_workers() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("workers", "2")
        .setting("worker_spread_load", "0")
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "4")
        .start()
        .await;
    let mut clients = Vec::new();
    for _ in 0..12 {
        clients.push(p.connect("md5user", "testdb").await);
    }
    let c = console(&p).await;
    let workers = rows(&c, "SHOW WORKERS").await;
    assert_eq!(workers.len(), 2, "{workers:?}");
    // 12 clients and the console, connected one after another: a worker takes a client
    // unless it has two more than the other (`Workers::place`), so 13 split 6 and 7.
    let mut placed: Vec<u64> = workers.iter().map(|w| num(w, "clients")).collect();
    placed.sort();
    assert_eq!(placed, [6, 7], "{workers:?}");

    let mut tasks = Vec::new();
    for (i, client) in clients.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            for j in 0..30i64 {
                let want = i as i64 * 1000 + j;
                let row = client.query_one("select $1::int8", &[&want]).await.unwrap();
                assert_eq!(row.get::<_, i64>(0), want);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let carpool = rows(&c, "SHOW CARPOOL").await;
    let pool = carpool
        .iter()
        .find(|r| r["database"].as_deref() == Some("testdb"))
        .expect("testdb pool");
    // tokio-postgres prepares (one round trip) then executes (another) per query.
    assert_eq!(num(pool, "xact_count"), 720);
    // Checkouts prefer a server of their own worker: two clients on different workers,
    // taking turns, each keep finding a server of their own (without the preference each
    // would take the server the other just released, moving it every time).
    let clients_per_worker = |w: &[HashMap<String, Option<String>>]| -> Vec<u64> {
        w.iter().map(|r| num(r, "clients")).collect()
    };
    // The twelve clients above have gone (their tasks ended) once only the console is
    // left: counts taken before that could drop while a new client is placed.
    wait_for(
        "the twelve clients to leave",
        Duration::from_secs(10),
        || async {
            clients_per_worker(&rows(&c, "SHOW WORKERS").await)
                .iter()
                .sum::<u64>()
                == 1
        },
    )
    .await;
    let before = clients_per_worker(&rows(&c, "SHOW WORKERS").await);
    let a = p.connect("md5user", "testdb").await;
    let with_a = clients_per_worker(&rows(&c, "SHOW WORKERS").await);
    let a_worker = (0..2).find(|&w| with_a[w] > before[w]).expect("a's worker");
    // The placement rule puts one of the next three on the other worker.
    let mut others = Vec::new();
    let b = loop {
        let before = clients_per_worker(&rows(&c, "SHOW WORKERS").await);
        let b = p.connect("md5user", "testdb").await;
        let after = clients_per_worker(&rows(&c, "SHOW WORKERS").await);
        if after[1 - a_worker] > before[1 - a_worker] {
            break b;
        }
        others.push(b);
        assert!(others.len() < 3, "no client placed on the other worker");
    };
    let pool_moves = |rows: &[HashMap<String, Option<String>>]| {
        let pool = rows
            .iter()
            .find(|r| r["database"].as_deref() == Some("testdb"))
            .expect("testdb pool");
        num(pool, "server_moves")
    };
    let moves_before = pool_moves(&rows(&c, "SHOW CARPOOL").await);
    for j in 0..50 {
        for client in [&a, &b] {
            let msgs = client.simple_query(&format!("select {j}")).await.unwrap();
            assert!(msgs.iter().any(|m| matches!(m, SimpleQueryMessage::Row(_))));
        }
    }
    let moves = pool_moves(&rows(&c, "SHOW CARPOOL").await) - moves_before;
    // At most one move each, for a first checkout that found only the other's servers.
    assert!(
        moves <= 2,
        "100 alternating checkouts on two workers moved {moves} servers"
    );
    let servers = rows(&c, "SHOW SERVERS").await;
    assert!(servers.len() <= 4, "{servers:?}");
    p.shutdown().await;
}

/// Clients gather on the workers the load needs (one, for a few idle clients, by
/// default) and spread when `worker_spread_load` says so, moving between their
/// transactions with their sessions (prepared statements, settings) intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_move_between_workers_with_their_sessions() {
    let pg = TempPostgres::start();
    let p = TestPooler::builder(&pg)
        .setting("workers", "2")
        .setting("pool_mode", "transaction")
        .setting("max_prepared_statements", "10")
        .setting("default_pool_size", "4")
        .start()
        .await;
    let c = console(&p).await;
    let per_worker = |rows: Vec<HashMap<String, Option<String>>>| -> Vec<u64> {
        rows.iter().map(|r| num(r, "clients")).collect()
    };
    // Idle, the default gathers every client on worker 0 (the console is one of them).
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(p.connect("md5user", "testdb").await);
    }
    assert_eq!(per_worker(rows(&c, "SHOW WORKERS").await), [9, 0]);
    // Each client: a prepared statement and a setting of its own.
    let mut stmts = Vec::new();
    for (i, client) in clients.iter().enumerate() {
        client
            .simple_query(&format!("SET application_name = 'mover{i}'"))
            .await
            .unwrap();
        stmts.push(
            client
                .prepare(&format!("select $1::int8 + {i}"))
                .await
                .unwrap(),
        );
    }
    // Every client's session, after however many moves.
    let check = |round: i64| {
        let clients = &clients;
        let stmts = &stmts;
        async move {
            for (i, (client, stmt)) in clients.iter().zip(stmts).enumerate() {
                let row = client.query_one(stmt, &[&round]).await.unwrap();
                assert_eq!(row.get::<_, i64>(0), round + i as i64);
                let name = client.simple_query("SHOW application_name").await.unwrap();
                let name = name.iter().find_map(|m| match m {
                    SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
                    _ => None,
                });
                assert_eq!(name.as_deref(), Some(format!("mover{i}").as_str()));
            }
        }
    };
    // Spread (clients move to worker 1 after their next transactions), then gather again
    // (worker 1's clients come back; the console, which does not move, may be there).
    let spread = |n: &[u64]| n.iter().all(|&n| n >= 3);
    let gathered = |n: &[u64]| n[0] >= 8;
    let mut round = 0;
    for (load, what, done) in [
        (
            "0",
            "clients to spread over both workers",
            &spread as &dyn Fn(&[u64]) -> bool,
        ),
        ("75", "clients to gather on worker 0", &gathered),
    ] {
        c.simple_query(&format!("SET worker_spread_load = {load}"))
            .await
            .unwrap();
        wait_for(what, Duration::from_secs(20), || {
            round += 1;
            let check = check(round);
            let c = &c;
            async move {
                check.await;
                done(&per_worker(rows(c, "SHOW WORKERS").await))
            }
        })
        .await;
    }
    let workers = rows(&c, "SHOW WORKERS").await;
    assert_eq!(workers[0]["active"].as_deref(), Some("1"), "{workers:?}");
    assert_eq!(workers[1]["active"].as_deref(), Some("0"), "{workers:?}");
    check(round + 1).await;
    p.shutdown().await;
}

/// server_fast_close (session mode): after RECONNECT, a session ends as soon as its server
/// is between transactions ("database configuration changed"), not at the client's exit;
/// a transaction in progress finishes first. Off (the default), sessions carry on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_fast_close_ends_sessions_at_their_next_transaction_boundary() {
    let pg = TempPostgres::start();
    for fast in [true, false] {
        let p = TestPooler::builder(&pg)
            .setting("pool_mode", "session")
            .start()
            .await;
        let idle = p.connect("postgres", "testdb").await;
        idle.simple_query("select 1").await.unwrap();
        let busy = p.connect("postgres", "testdb").await;
        busy.simple_query("begin").await.unwrap();
        let c = console(&p).await;
        if fast {
            // Turned on while the sessions last, as an operator would.
            c.simple_query("SET server_fast_close = 1").await.unwrap();
        }
        c.simple_query("RECONNECT testdb").await.unwrap();
        // The open transaction may finish either way.
        busy.simple_query("select 1").await.unwrap();
        busy.simple_query("commit").await.unwrap();
        for (name, client) in [("idle", &idle), ("busy", &busy)] {
            let r = tokio::time::timeout(Duration::from_secs(10), client.simple_query("select 1"))
                .await
                .unwrap_or_else(|_| panic!("{name}: no answer in 10 s"));
            if fast {
                let e = r.expect_err("a session kept its server after RECONNECT");
                // The ErrorResponse, or the closed socket if it came first.
                if let Some(db) = e.as_db_error() {
                    assert_eq!(db.message(), "database configuration changed", "{name}");
                } else {
                    assert!(e.is_closed(), "{name}: {e:?}");
                }
            } else {
                r.unwrap_or_else(|e| panic!("{name}: session ended without fast close: {e}"));
            }
        }
        p.shutdown().await;
    }
}
