//! Prometheus `/metrics`: the text exposition format rendered from the same atomics SHOW
//! STATS reads, served by a tiny HTTP/1.1 responder (GET only, one request per connection)
//! on `prometheus_addr:prometheus_port` (port 0 = off), with the status page (`/` and
//! `/status.json`, see `status.rs`).
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::status::{self, PAGE, PAGE_POLICY};
use crate::config::Settings;
use crate::shared::Shared;
use crate::stats::histogram::{BOUNDS_US, HistSnapshot};

/// Largest request head we read.
const MAX_REQUEST: usize = 8 * 1024;

/// Bind the metrics listener if `prometheus_port` is set.
pub async fn bind(s: &Settings) -> std::io::Result<Option<TcpListener>> {
    if s.prometheus_port == 0 {
        return Ok(None);
    }
    let addr = if s.prometheus_addr.is_empty() {
        "127.0.0.1"
    } else {
        s.prometheus_addr.as_str()
    };
    let l = TcpListener::bind((addr, s.prometheus_port)).await?;
    let at = l.local_addr()?;
    tracing::info!("metrics on http://{at}/metrics, status page on http://{at}/");
    Ok(Some(l))
}

/// Accept until the pooler stops.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let (sock, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!("metrics accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shared.stop_background().cancelled() => return,
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(10), respond(sock, &shared)).await;
        });
    }
}

async fn respond(mut sock: TcpStream, shared: &Shared) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = sock.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_REQUEST {
            return write(
                &mut sock,
                "431 Request Header Fields Too Large",
                "text/plain",
                "request too large\n",
            )
            .await;
        }
    }
    let line = buf.split(|&b| b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, ctype, body) = match (method, path) {
        ("GET", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            render(shared),
        ),
        ("GET", "/") => ("200 OK", "text/html; charset=utf-8", PAGE.to_string()),
        ("GET", "/status.json") => ("200 OK", "application/json", status::json(shared)),
        (_, "/metrics" | "/" | "/status.json") => {
            ("405 Method Not Allowed", "text/plain", "GET only\n".into())
        }
        _ => (
            "404 Not Found",
            "text/plain",
            "try /metrics, or / for the status page\n".into(),
        ),
    };
    write(&mut sock, status, ctype, &body).await
}

/// The answer: never cached (every figure is live), never sniffed as another type, and the
/// page held to its own inline parts and `/status.json`.
async fn write(sock: &mut TcpStream, status: &str, ctype: &str, body: &str) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n\
         Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n\
         Content-Security-Policy: {PAGE_POLICY}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    sock.write_all(head.as_bytes()).await?;
    sock.write_all(body.as_bytes()).await?;
    sock.shutdown().await
}

/// Escape a label value.
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn secs(us: u64) -> f64 {
    us as f64 / 1e6
}

fn histogram(out: &mut String, name: &str, labels: &str, h: &HistSnapshot) {
    let mut cum = 0u64;
    for (i, n) in h.buckets.iter().enumerate() {
        cum += n;
        let le = BOUNDS_US
            .get(i)
            .map(|b| format!("{}", secs(*b)))
            .unwrap_or_else(|| "+Inf".into());
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cum}");
    }
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", secs(h.sum_us));
    let _ = writeln!(out, "{name}_count{{{labels}}} {}", h.count);
}

/// The whole exposition.
pub fn render(shared: &Shared) -> String {
    let mut out = String::new();
    header(
        &mut out,
        "pgcarpool_build_info",
        "gauge",
        "pgcarpool build information.",
    );
    let _ = writeln!(
        out,
        "pgcarpool_build_info{{version=\"{}\",pgbouncer_compat=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION"),
        crate::cli::PGBOUNCER_COMPAT
    );
    let pools = shared.pools().all();
    let labels: Vec<String> = pools
        .iter()
        .map(|p| format!("database=\"{}\",user=\"{}\"", esc(&p.db), esc(&p.user)))
        .collect();
    counters(&mut out, &pools, &labels);
    pool_gauges(&mut out, &pools, &labels);
    header(
        &mut out,
        "pgcarpool_clients",
        "gauge",
        "Connected clients (excluding the admin console).",
    );
    let _ = writeln!(out, "pgcarpool_clients {}", shared.clients().len());
    hosts(&mut out, &pools, &labels);
    histograms(&mut out, &pools, &labels);
    out
}

/// The counters of each pool (as SHOW STATS totals).
fn counters(out: &mut String, pools: &[Arc<crate::pool::Pool>], labels: &[String]) {
    let totals: Vec<_> = pools.iter().map(|p| p.stats.totals()).collect();
    type Pick = fn(&crate::stats::Totals) -> f64;
    let counters: [(&str, &str, Pick); 8] = [
        (
            "pgcarpool_transactions_total",
            "Transactions pooled.",
            |t| t.xact_count as f64,
        ),
        ("pgcarpool_queries_total", "Queries pooled.", |t| {
            t.query_count as f64
        }),
        (
            "pgcarpool_server_assignments_total",
            "Times a server was assigned to a client.",
            |t| t.server_assignment_count as f64,
        ),
        (
            "pgcarpool_received_bytes_total",
            "Bytes received from clients.",
            |t| t.bytes_received as f64,
        ),
        (
            "pgcarpool_sent_bytes_total",
            "Bytes sent to clients.",
            |t| t.bytes_sent as f64,
        ),
        (
            "pgcarpool_transaction_time_seconds_total",
            "Time spent in transactions on servers.",
            |t| secs(t.xact_time_us),
        ),
        (
            "pgcarpool_query_time_seconds_total",
            "Time spent running queries on servers.",
            |t| secs(t.query_time_us),
        ),
        (
            "pgcarpool_wait_time_seconds_total",
            "Time clients spent waiting for a server.",
            |t| secs(t.wait_time_us),
        ),
    ];
    for (name, help, pick) in counters {
        header(out, name, "counter", help);
        for (l, t) in labels.iter().zip(&totals) {
            let _ = writeln!(out, "{name}{{{l}}} {}", pick(t));
        }
    }
    let name = "pgcarpool_server_logins_total";
    header(
        out,
        name,
        "counter",
        "Server connections the pool logged in to.",
    );
    for (l, p) in labels.iter().zip(pools) {
        let n = crate::stats::PoolStats::get(&p.stats.server_logins);
        let _ = writeln!(out, "{name}{{{l}}} {n}");
    }
    fast(out, pools, labels);
}

/// What the fast path (one simple Query that leaves the session as it is) served, and
/// what it handed over to the full path.
fn fast(out: &mut String, pools: &[Arc<crate::pool::Pool>], labels: &[String]) {
    let fast: Vec<_> = pools.iter().map(|p| p.stats.fast()).collect();
    for (name, help, second) in [
        (
            "pgcarpool_fast_transactions_total",
            "Transactions served whole by the fast path.",
            false,
        ),
        (
            "pgcarpool_fast_handovers_total",
            "Transactions the fast path began and handed over to the full path.",
            true,
        ),
    ] {
        header(out, name, "counter", help);
        for (l, &(x, h)) in labels.iter().zip(&fast) {
            let _ = writeln!(out, "{name}{{{l}}} {}", if second { h } else { x });
        }
    }
}

/// Each pool's servers by state, waiting clients, longest wait, size and pause.
fn pool_gauges(out: &mut String, pools: &[Arc<crate::pool::Pool>], labels: &[String]) {
    let counts: Vec<_> = pools.iter().map(|p| p.counts()).collect();
    header(
        out,
        "pgcarpool_pool_servers",
        "gauge",
        "Server connections by state.",
    );
    for (l, c) in labels.iter().zip(&counts) {
        use crate::pool::ServerState::*;
        // As SHOW POOLS: active, idle (less used), used, tested (+ being reset), login.
        let tested = c.get(Tested) + c.get(BeingReset);
        for (state, n) in [
            ("active", c.get(Active)),
            ("idle", c.get(Idle).saturating_sub(c.used)),
            ("used", c.used),
            ("tested", tested),
            ("login", c.get(Login)),
        ] {
            let _ = writeln!(out, "pgcarpool_pool_servers{{{l},state=\"{state}\"}} {n}");
        }
    }
    header(
        out,
        "pgcarpool_pool_waiting_clients",
        "gauge",
        "Clients waiting for a server.",
    );
    for (l, c) in labels.iter().zip(&counts) {
        let _ = writeln!(out, "pgcarpool_pool_waiting_clients{{{l}}} {}", c.waiting);
    }
    header(
        out,
        "pgcarpool_pool_max_wait_seconds",
        "gauge",
        "How long the oldest waiting client has waited.",
    );
    for (l, p) in labels.iter().zip(pools) {
        let _ = writeln!(
            out,
            "pgcarpool_pool_max_wait_seconds{{{l}}} {}",
            p.max_wait().as_secs_f64()
        );
    }
    header(out, "pgcarpool_pool_size", "gauge", "Configured pool size.");
    for (l, p) in labels.iter().zip(pools) {
        let _ = writeln!(out, "pgcarpool_pool_size{{{l}}} {}", p.settings().pool_size);
    }
    header(
        out,
        "pgcarpool_pool_paused",
        "gauge",
        "1 if the pool is paused.",
    );
    for (l, c) in labels.iter().zip(&counts) {
        let _ = writeln!(out, "pgcarpool_pool_paused{{{l}}} {}", u8::from(c.paused));
    }
}

/// Each pool's query, transaction and wait durations.
fn histograms(out: &mut String, pools: &[Arc<crate::pool::Pool>], labels: &[String]) {
    type Hist = fn(&crate::stats::Lane) -> &crate::stats::Histogram;
    let hists: [(&str, &str, Hist); 3] = [
        (
            "pgcarpool_query_duration_seconds",
            "Query durations.",
            |s| &s.query_hist,
        ),
        (
            "pgcarpool_transaction_duration_seconds",
            "Transaction durations.",
            |s| &s.xact_hist,
        ),
        (
            "pgcarpool_wait_duration_seconds",
            "Time clients waited for a server.",
            |s| &s.wait_hist,
        ),
    ];
    for (name, help, pick) in hists {
        header(out, name, "histogram", help);
        for (l, p) in labels.iter().zip(pools) {
            histogram(out, name, l, &p.stats.hist(pick));
        }
    }
}

/// The hosts of pools with target_session_attrs (as SHOW HOSTS): role, usable, fenced,
/// replay lag, and the pool's switchovers.
fn hosts(out: &mut String, pools: &[Arc<crate::pool::Pool>], labels: &[String]) {
    let lists: Vec<_> = pools
        .iter()
        .map(|p| p.settings())
        .zip(labels)
        .filter(|(s, _)| s.target.hosts.checks_roles())
        .collect();
    if lists.is_empty() {
        return;
    }
    header(
        out,
        "pgcarpool_switchovers_total",
        "counter",
        "Times the primary of a pool's host list moved to another host.",
    );
    for (s, l) in &lists {
        let n = s.target.hosts.switchovers();
        let _ = writeln!(out, "pgcarpool_switchovers_total{{{l}}} {n}");
    }
    reads(out, pools, labels);
    type Pick = fn(&crate::server::connect::HostView) -> u64;
    let gauges: [(&str, &str, Pick); 4] = [
        (
            "pgcarpool_host_usable",
            "1 if new servers of the pool may go to the host (its role fits).",
            |h| u64::from(h.usable),
        ),
        (
            "pgcarpool_host_fenced",
            "1 if the host is a primary on an older timeline than another (split brain).",
            |h| u64::from(h.fenced),
        ),
        (
            "pgcarpool_host_lag_bytes",
            "WAL a standby received and has not replayed, at the last check.",
            |h| h.state.lag_bytes,
        ),
        (
            "pgcarpool_host_lag_ms",
            "While a standby has WAL to replay: milliseconds since the primary committed the \
             last transaction it replayed, at the last check.",
            |h| h.state.lag_ms,
        ),
    ];
    let views: Vec<_> = lists.iter().map(|(s, _)| s.target.hosts.view()).collect();
    header(
        out,
        "pgcarpool_host_role",
        "gauge",
        "The role a host was last seen in (primary, standby, down, unknown): 1.",
    );
    for ((_, l), v) in lists.iter().zip(&views) {
        for h in v {
            let (host, role) = (esc(&h.addr.to_string()), h.state.role.name());
            let _ = writeln!(
                out,
                "pgcarpool_host_role{{{l},host=\"{host}\",role=\"{role}\"}} 1"
            );
        }
    }
    for (name, help, pick) in gauges {
        header(out, name, "gauge", help);
        for ((_, l), v) in lists.iter().zip(&views) {
            for h in v {
                let host = esc(&h.addr.to_string());
                let _ = writeln!(out, "{name}{{{l},host=\"{host}\"}} {}", pick(h));
            }
        }
    }
}

/// Read routing's counters of the pools that route reads: reads per standby, reads the
/// primary served for freshness, standbys' refusals run again on the primary.
fn reads(out: &mut String, pools: &[Arc<crate::pool::Pool>], labels: &[String]) {
    use crate::pool::reads::RoutingStats;
    let routed: Vec<_> = pools
        .iter()
        .zip(labels)
        .filter(|(p, _)| p.settings().read_routing)
        .collect();
    if routed.is_empty() {
        return;
    }
    header(
        out,
        "pgcarpool_reads_total",
        "counter",
        "Transactions judged reads that ran on a standby, by host.",
    );
    for (p, l) in &routed {
        for (i, a) in p.settings().target.hosts.addrs.iter().enumerate() {
            let host = esc(&a.to_string());
            let n = p.routing.reads_on(i);
            let _ = writeln!(out, "pgcarpool_reads_total{{{l},host=\"{host}\"}} {n}");
        }
    }
    type Pick = fn(&crate::pool::Pool) -> u64;
    let counters: [(&str, &str, Pick); 2] = [
        (
            "pgcarpool_reads_on_primary_total",
            "Transactions judged reads that ran on the primary: no standby had replayed what \
             the client had seen, or none was usable.",
            |p| RoutingStats::get(&p.routing.reads_on_primary),
        ),
        (
            "pgcarpool_read_replays_total",
            "Reads a standby refused as writes (25006) that ran again on the primary.",
            |p| RoutingStats::get(&p.routing.refused_replays),
        ),
    ];
    for (name, help, pick) in counters {
        header(out, name, "counter", help);
        for (p, l) in &routed {
            let _ = writeln!(out, "{name}{{{l}}} {}", pick(p));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_lines_are_cumulative_and_end_with_inf() {
        let h = crate::stats::Histogram::default();
        h.record(50);
        h.record(2_000);
        let mut out = String::new();
        histogram(&mut out, "x", "database=\"d\"", &h.snapshot());
        assert!(
            out.contains("x_bucket{database=\"d\",le=\"0.0001\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("x_bucket{database=\"d\",le=\"+Inf\"} 2\n"),
            "{out}"
        );
        assert!(out.contains("x_count{database=\"d\"} 2\n"), "{out}");
        assert!(out.contains("x_sum{database=\"d\"} 0.00205\n"), "{out}");
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(esc("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
