//! The transaction loop: wait for a request, get a server, make it fit the virtual session,
//! relay until the pool mode lets the server go, repeat.
use std::future::poll_fn;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::relay::{Relay, RelayCounts, RelayEvent, RelayTimeouts};
use super::{Client, ClientError, ClientState};
use crate::config::{self, PoolMode};
use crate::net::conn::ConnError;
use crate::pool::{CheckoutError, PooledServer};
use crate::proto::{backend, frontend};
use crate::server::sync;
use crate::stats::PoolStats;

/// Serve requests until the client leaves (Ok) or must be told why it is let go (Err).
pub async fn run(c: &mut Client) -> Result<(), ClientError> {
    let kill = c.reg.handle.kill.clone();
    loop {
        c.reg.handle.set_state(ClientState::Idle);
        let cfg = c.shared.config.load_full();
        let idle_timeout = config::enabled(cfg.client_idle_timeout_for(&c.reg.handle.user));
        if !wait_for_request(c, idle_timeout, &kill).await? {
            return Ok(());
        }
        c.reg.handle.set_state(ClientState::Waiting);
        let waited = Instant::now();
        let mut server = checkout(c, &cfg, &kill).await?;
        PoolStats::add(&c.pool.stats.wait_time_us, waited.elapsed().as_micros() as u64);
        PoolStats::add(&c.pool.stats.server_assignment_count, 1);
        match sync::apply(&mut server, &c.session.params).await {
            Ok(None) => {}
            Ok(Some(e)) => {
                return Err(ClientError::fatal("22023", format!("could not apply session parameters: {}", e.message)));
            }
            Err(e) => {
                server.broken = true;
                return Err(ClientError::fatal("08006", e.to_string()));
            }
        }
        let mode = c.pool.settings().mode;
        let timeouts = RelayTimeouts {
            query: config::enabled(cfg.query_timeout_for(&c.reg.handle.user)),
            idle_transaction: config::enabled(cfg.idle_transaction_timeout_for(&c.reg.handle.user)),
            transaction: config::enabled(cfg.transaction_timeout_for(&c.reg.handle.user)),
        };
        c.reg.handle.set_cancel_target(Some((server.addr.clone(), server.key)));
        c.reg.handle.set_state(ClientState::Active);
        let (event, counts) = {
            let mut relay = Relay::new(&mut c.conn, &mut server, &mut c.session, mode);
            let event = tokio::select! {
                ev = relay.run(timeouts) => ev,
                _ = kill.cancelled() => RelayEvent::Killed,
            };
            (event, relay.counts)
        };
        c.reg.handle.set_cancel_target(None);
        add_stats(c, &counts);
        let reset_always = cfg.settings.server_reset_query_always;
        // Every way out but Release ends the client: its session state goes with it, however
        // it left (Terminate, timeout, KILL, protocol error).
        server.reset = match event {
            RelayEvent::Release => reset_always,
            _ => mode == PoolMode::Session || reset_always,
        };
        match event {
            RelayEvent::Release => drop(server),
            RelayEvent::ClientTerminate | RelayEvent::ClientGone => return Ok(()),
            RelayEvent::StatementModeTransaction => {
                return Err(ClientError::fatal(
                    "08P01",
                    "transaction blocks not allowed in statement pooling mode".into(),
                ));
            }
            RelayEvent::ClientProtocol(e) => return Err(e.into()),
            RelayEvent::ServerGone(why) => {
                server.broken = true;
                return Err(ClientError::fatal("08006", format!("server connection lost: {why}")));
            }
            RelayEvent::Timeout(kind) => {
                return Err(ClientError::fatal("08P01", kind.message().to_string()));
            }
            RelayEvent::Killed => return Err(killed(c)),
        }
    }
}

fn killed(c: &Client) -> ClientError {
    let _ = c;
    ClientError::fatal("08P01", "client killed by the pooler (KILL or shutdown)".into())
}

fn add_stats(c: &Client, n: &RelayCounts) {
    let s = &c.pool.stats;
    PoolStats::add(&s.query_count, n.queries);
    PoolStats::add(&s.xact_count, n.transactions);
    PoolStats::add(&s.bytes_received, n.bytes_from_client);
    PoolStats::add(&s.bytes_sent, n.bytes_from_server);
    PoolStats::add(&s.query_time_us, n.query_time_us);
}

/// Flush what the client is owed and wait for its next request. False: it said Terminate.
async fn wait_for_request(
    c: &mut Client,
    idle_timeout: Option<std::time::Duration>,
    kill: &CancellationToken,
) -> Result<bool, ClientError> {
    let deadline = idle_timeout.map(|d| Instant::now() + d);
    loop {
        if c.conn.out_len() > 0 {
            tokio::select! {
                r = c.conn.flush() => r?,
                _ = kill.cancelled() => return Err(killed(c)),
            }
        }
        if let Some(&tag) = c.conn.rbuf.first() {
            if tag == frontend::TERMINATE {
                return Ok(false);
            }
            return Ok(true);
        }
        c.conn.shrink();
        tokio::select! {
            r = poll_fn(|cx| c.conn.poll_read_more(cx)) => {
                if r? == 0 {
                    return Ok(false);
                }
            }
            _ = sleep_until(deadline) => {
                return Err(ClientError::fatal("08P01", "client_idle_timeout".into()));
            }
            _ = kill.cancelled() => return Err(killed(c)),
        }
    }
}

/// Most a waiting client may send ahead before we stop reading it.
const WAIT_READ_LIMIT: usize = 256 * 1024;

/// Get a server for the client, telling it when it has to wait (query_wait_notify).
async fn checkout(c: &mut Client, cfg: &config::Config, kill: &CancellationToken) -> Result<PooledServer, ClientError> {
    let start = Instant::now();
    // Resolved per database and user with the pool's settings.
    let deadline = config::enabled(c.pool.settings().query_wait_timeout).map(|d| start + d);
    let mut notify_at = config::enabled(cfg.settings.query_wait_notify).map(|d| start + d);
    let pool = c.pool.clone();
    let fut = pool.checkout(deadline);
    tokio::pin!(fut);
    loop {
        tokio::select! {
            r = &mut fut => {
                return r.map_err(|e| match e {
                    CheckoutError::WaitTimeout => ClientError::fatal("08P01", "query_wait_timeout".into()),
                    CheckoutError::Server(se) => {
                        let (_, msg) = se.client_error();
                        ClientError::fatal("08006", format!("could not connect to server: {msg}"))
                    }
                });
            }
            // A client that leaves while waiting gives back its place (and its client slot)
            // at once; what it pipelines meanwhile stays buffered, up to a bound.
            r = poll_fn(|cx| c.conn.poll_read_more(cx)), if c.conn.rbuf.len() < WAIT_READ_LIMIT => {
                if r? == 0 {
                    return Err(ClientError::Conn(ConnError::Closed));
                }
            }
            _ = sleep_until(notify_at) => {
                notify_at = None;
                c.conn.queue_with(|b| backend::error_fields(b, backend::NOTICE_RESPONSE, "NOTICE", "00000",
                    "no server connection available in pool, waiting"));
                let _ = c.conn.flush().await;
            }
            _ = kill.cancelled() => return Err(killed(c)),
        }
    }
}

async fn sleep_until(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}
