//! The status page in a real browser: headless Chromium loads `/` from the metrics port of
//! a running pgcarpool (a pinned client, three open transactions, a client waiting, a pool
//! whose logins fail, pgbench on another pool) and what it renders after its script ran
//! matches SHOW POOLS, SHOW CARPOOL, SHOW HOSTS and SHOW EVENTS read over the console.
//! Screenshots (a phone's width and a desktop's) are kept under
//! `target/tmp/status-page/`. Without Chromium the test says it skipped, except with
//! CI=true, where scripts/test has installed it and its absence fails.
mod harness;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use harness::{TempPostgres, TestPooler, free_port, output_text, rows, run_pgbench, wait_for};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type Row = HashMap<String, Option<String>>;

/// Chromium: `PGCARPOOL_CHROMIUM`, else `chromium` or `chromium-browser` on PATH.
fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PGCARPOOL_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|d| ["chromium", "chromium-browser"].map(|n| d.join(n)))
        .find(|p| p.is_file())
}

/// Run headless Chromium on `url` with `args` (a fresh profile, no network but loopback
/// in use, the page's timers run for 4 s of virtual time); its stdout.
async fn browse(browser: &Path, url: &str, args: &[&str]) -> String {
    let profile = tempfile::tempdir().expect("profile dir");
    let mut cmd = std::process::Command::new(browser);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        "--virtual-time-budget=4000",
    ])
    .arg(format!("--user-data-dir={}", profile.path().display()))
    .args(args)
    .arg(url)
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    let child = cmd.spawn().expect("run chromium");
    let pid = i32::try_from(child.id()).expect("pid");
    let waited = tokio::task::spawn_blocking(move || child.wait_with_output());
    let out = match tokio::time::timeout(Duration::from_secs(90), waited).await {
        Ok(out) => out.expect("join").expect("chromium's output"),
        Err(_) => {
            // The browser this test started, by its pid.
            harness::process::signal_if_alive(pid, libc::SIGKILL);
            panic!("chromium did not finish within 90 s");
        }
    };
    assert!(out.status.success(), "chromium: {}", output_text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The cells of table `id` in the rendered DOM: row key (`data-key`) → column (`data-col`)
/// → text. Chromium serialises the attributes in the order the script set them.
fn rendered(dom: &str, id: &str) -> HashMap<String, HashMap<String, String>> {
    let start = dom
        .find(&format!("<table id=\"{id}\""))
        .unwrap_or_else(|| panic!("no table {id} in the page:\n{dom}"));
    let table = &dom[start..start + dom[start..].find("</table>").expect("table end")];
    let mut out = HashMap::new();
    for tr in table.split("<tr").skip(1) {
        let Some(key) = attr(tr, "data-key") else {
            continue;
        };
        let mut cells = HashMap::new();
        for td in tr.split("<td").skip(1) {
            let col = attr(td, "data-col").expect("a cell names its column");
            let text = &td[td.find('>').expect("cell tag end") + 1..];
            let text = &text[..text.find("</td>").expect("cell end")];
            cells.insert(col, unescape(text));
        }
        out.insert(unescape(&key), cells);
    }
    out
}

/// The value of attribute `name` in the tag that `s` starts inside.
fn attr(s: &str, name: &str) -> Option<String> {
    let tag = &s[..s.find('>')?];
    let at = tag.find(&format!("{name}=\""))? + name.len() + 2;
    Some(tag[at..at + tag[at..].find('"')?].to_string())
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&nbsp;", "\u{a0}")
        .replace("&amp;", "&")
}

/// A latency as the page writes it ("850 µs", "1.23 ms", "1.20 s") in µs.
fn micros(text: &str) -> f64 {
    let (n, unit) = text.split_once(' ').unwrap_or_else(|| panic!("{text}"));
    let n: f64 = n.parse().unwrap_or_else(|_| panic!("{text}"));
    n * match unit {
        "µs" => 1.0,
        "ms" => 1e3,
        "s" => 1e6,
        _ => panic!("unit of {text}"),
    }
}

fn cell<'a>(r: &'a Row, col: &str) -> &'a str {
    r.get(col)
        .unwrap_or_else(|| panic!("no column {col} in {r:?}"))
        .as_deref()
        .unwrap_or("")
}

fn find<'a>(rows: &'a [Row], db: &str, user: &str) -> &'a Row {
    rows.iter()
        .find(|r| cell(r, "database") == db && cell(r, "user") == user)
        .unwrap_or_else(|| panic!("no row {db}/{user} in {rows:?}"))
}

/// GET `path` from the metrics port: the head and the body.
async fn get(port: u16, path: &str) -> (String, String) {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    let (head, body) = buf.split_once("\r\n\r\n").expect("http response");
    (head.to_string(), body.to_string())
}

/// The SHOW POOLS columns the page shows as they are.
const POOL_COLUMNS: [&str; 8] = [
    "cl_active",
    "cl_waiting",
    "sv_active",
    "sv_idle",
    "sv_used",
    "sv_tested",
    "sv_login",
    "pool_mode",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_what_the_console_shows() {
    let Some(browser) = chromium() else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true and no chromium: scripts/test installs Debian's chromium"
        );
        eprintln!("skipped: no chromium on PATH (scripts/test installs Debian's chromium)");
        return;
    };
    let pg = TempPostgres::start();
    let gone = free_port();
    let (p, port) = TestPooler::builder(&pg)
        .setting("pool_mode", "transaction")
        .setting("default_pool_size", "3")
        .database(
            "app",
            &format!("{} target_session_attrs=read-write", pg.db_entry("testdb")),
        )
        .database("bench", &pg.db_entry("testdb"))
        .database("gone", &format!("host=127.0.0.1 port={gone} dbname=testdb"))
        .start_with_free_port("prometheus_port")
        .await;
    let console = p.connect("postgres", "pgbouncer").await;

    // A pool whose logins fail: a login error in SHOW EVENTS.
    let refused = harness::try_connect(&p.dsn("md5user", "gone")).await;
    assert!(refused.is_err(), "nothing listens on port {gone}");
    // The pool the page is checked on: one client pinned (a temp table: its server is on
    // top of the pool's size, pin_pool_size), three inside a transaction, so the pool's
    // three servers are taken, and a fifth client waiting.
    let pinned = p.connect("md5user", "app").await;
    pinned
        .simple_query("CREATE TEMP TABLE t (x int)")
        .await
        .unwrap();
    let mut open = Vec::new();
    for _ in 0..3 {
        let c = p.connect("md5user", "app").await;
        c.simple_query("BEGIN; SELECT 1").await.unwrap();
        open.push(c);
    }
    let waiting = p.connect("md5user", "app").await;
    let waits = tokio::spawn(async move { waiting.simple_query("SELECT 1").await.map(|_| ()) });
    wait_for("a client waits in app", Duration::from_secs(10), || async {
        let pools = rows(&console, "SHOW POOLS").await;
        cell(find(&pools, "app", "md5user"), "cl_waiting") == "1"
    })
    .await;

    // A small bounded load on another pool while the browser reads the page.
    let script = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(script.path(), "SELECT 1;\n").unwrap();
    let (dsn, file) = (p.dsn("md5user", "bench"), script.path().to_owned());
    let load = std::thread::spawn(move || {
        let file = file.to_string_lossy().into_owned();
        run_pgbench(&["-n", "-f", &file, "-c", "2", "-j", "1", "-t", "500", &dsn])
    });

    let (head, _) = get(port, "/").await;
    assert!(
        head.contains("Content-Security-Policy: default-src 'none'"),
        "{head}"
    );
    let (_, json) = get(port, "/status.json").await;
    assert!(json.contains("\"cl_waiting\""), "{json}");

    let before = rows(&console, "SHOW POOLS").await;
    let url = format!("http://127.0.0.1:{port}/");
    let dom = browse(&browser, &url, &["--dump-dom"]).await;
    let pools = rows(&console, "SHOW POOLS").await;
    let carpool = rows(&console, "SHOW CARPOOL").await;
    let hosts = rows(&console, "SHOW HOSTS").await;
    let events = rows(&console, "SHOW EVENTS").await;
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page");
    std::fs::create_dir_all(&shots).unwrap();
    for (name, size) in [("phone", "412,2600"), ("desktop", "1280,1000")] {
        let shot = shots.join(format!("status-{name}.png"));
        let _ = std::fs::remove_file(&shot);
        browse(
            &browser,
            &url,
            &[
                &format!("--window-size={size}"),
                &format!("--screenshot={}", shot.display()),
            ],
        )
        .await;
        assert!(shot.is_file(), "no screenshot {}", shot.display());
        eprintln!("status page screenshot: {}", shot.display());
    }
    let bench = load.join().expect("pgbench thread");
    assert!(bench.status.success(), "pgbench: {}", output_text(&bench));

    assert!(
        dom.contains("<div id=\"error\" hidden=\"\">"),
        "the page reached status.json:\n{dom}"
    );
    // Refreshed without reloading: 4 s of the page's time is two polls at least.
    let polls: u32 = attr(&dom[dom.find("<body").expect("body")..], "data-polls")
        .expect("the page counts its polls")
        .parse()
        .unwrap();
    assert!(polls >= 2, "the page polled {polls} time(s)");
    // The held pool stood still while the browser read it, so the page must show exactly
    // what SHOW POOLS shows.
    let (was, now) = (
        find(&before, "app", "md5user"),
        find(&pools, "app", "md5user"),
    );
    if POOL_COLUMNS.iter().any(|c| cell(was, c) != cell(now, c)) {
        let clients = rows(&console, "SHOW CLIENTS").await;
        let done = if waits.is_finished() {
            Some(waits.await)
        } else {
            None
        };
        panic!("app moved: {was:?}\n{now:?}\n{clients:?}\n{done:?}\n{events:?}");
    }
    let page = rendered(&dom, "pools");
    let app = &page["app/md5user"];
    for col in POOL_COLUMNS {
        assert_eq!(app[col], cell(now, col), "the page's {col} of app/md5user");
    }
    assert_eq!(app["cl_waiting"], "1");
    assert_eq!(app["cl_active"], "4");
    let extra = find(&carpool, "app", "md5user");
    assert_eq!(app["pinned_clients"], cell(extra, "pinned_clients"));
    assert_eq!(app["pinned_clients"], "1");
    assert!(page.contains_key("bench/md5user"), "{page:?}");

    // Latency percentiles as SHOW CARPOOL's, to the page's rounding.
    let latency = &rendered(&dom, "latency")["app/md5user"];
    for col in ["query_p50_us", "query_p99_us", "xact_p99_us"] {
        let shown = micros(&latency[col]);
        let want: f64 = cell(extra, col).parse().unwrap();
        assert!(
            (shown - want).abs() <= want * 0.01 + 0.5,
            "{col}: page {} SHOW CARPOOL {want}",
            latency[col]
        );
    }

    // The host of app's list, with the role SHOW HOSTS gives it.
    let host = find(&hosts, "app", "md5user");
    let key = format!("app/md5user/{}", cell(host, "host"));
    let shown = &rendered(&dom, "hosts")[&key];
    assert_eq!(shown["role"], cell(host, "role"));
    assert_eq!(cell(host, "role"), "primary");

    // The failed login, as SHOW EVENTS tells it.
    let error = find(&events, "gone", "md5user");
    assert_eq!(cell(error, "event"), "login error");
    let page_events = rendered(&dom, "events");
    assert!(
        page_events.values().any(|e| e["database"] == "gone"
            && e["event"] == "login error"
            && e["detail"] == cell(error, "detail")),
        "{page_events:?} vs {events:?}"
    );

    // The totals over the pools: app's pinned client is the only one (pgbench pins none).
    assert!(
        dom.contains("data-total=\"pinned_clients\"><b>1</b>"),
        "{dom}"
    );

    drop(open);
    drop(pinned);
    assert!(waits.await.unwrap().is_ok(), "the waiting client is served");
    p.shutdown().await;
}
