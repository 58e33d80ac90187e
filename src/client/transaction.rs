//! The transaction loop: wait for a request, get a server, make it fit the virtual session,
//! relay until the pool mode lets the server go, repeat.
use std::future::{Future, poll_fn};
use std::task::Poll;
use std::time::Instant;

use crate::shared::registry::{ClientHandle, client_event};

use super::classify::{self, Effects};
use super::fast::Fast;
use super::registry::ServerLink;
use super::relay::{FirstRequest, Relay, RelayCounts, RelayEvent, RelayTimeouts, Resumed};
use super::{Client, ClientError, ClientState};
use crate::config::{self, PoolMode};
use crate::net::conn::ConnError;
use crate::pool::{CheckoutError, Pool, PooledServer};
use crate::proto::{self, backend, frontend};
use crate::server::sync;
use crate::shared::restart::{Phase, PhaseWatch};
use crate::stats::PoolStats;
use std::sync::Arc;

/// How a client's transaction loop ended without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// It said goodbye.
    Left,
    /// Online restart: it is idle and may move to the new process.
    Handover,
    /// Between transactions, holding nothing: it is to move to worker N (counted there).
    Move(usize),
}

/// Serve requests until the client leaves or may move (Ok) or must be told why it is let
/// go (Err).
pub async fn run(c: &mut Client) -> Result<Exit, ClientError> {
    // What lives across the idle wait is what every idle client's task holds: the phase,
    // a held server, a failed block, the deadline and `park`. Everything else (the config,
    // the handle polled for a kill) is taken inside the boxed futures that use it.
    // Online restart (SUSPEND, HANDOVER), watched for the client's whole life.
    let mut phase = c.shared.restart().watch();
    // A pinned client keeps its server between transactions.
    let mut held: Option<PooledServer> = None;
    // A transaction whose server was lost: the failed block pgcarpool plays (boxed: rare).
    let mut aborted: Option<Box<super::aborted::Aborted>> = None;
    'transactions: loop {
        // A pinned client that also listens through the pool's listener waits here too, to
        // be given its notifications between transactions. What the fast path hands the
        // full path, when it looked at the request: `taken`.
        let taken = if held.is_none() || c.listening.is_listening() {
            // Clients gather on the workers that carry the load (workers.rs).
            // Boxed, and only when this worker sheds clients: its flush is not room every
            // idle client's task keeps.
            if may_move(c, held.is_none() && aborted.is_none())
                && let Some(to) = Box::pin(move_to(c)).await?
            {
                return Ok(Exit::Move(to));
            }
            c.reg.handle.set_state(ClientState::Idle);
            let mut begun = c.begun.is_some();
            let mut deadline = idle_deadline(c);
            let pinned = held.is_some();
            let mut readable = false;
            loop {
                // A request read (below, or brought along by a move) that the fast path
                // takes: served there.
                if !pinned && aborted.is_none() && super::fast::takes(c, &mut phase) {
                    match Box::pin(super::fast::transaction(c)).await {
                        Fast::Done => continue 'transactions,
                        Fast::Full(server) => break Taken::Server(server),
                        Fast::Failed(e) => return Err(e),
                        Fast::Resume(server, r) => break Taken::Resumed(server, r),
                    }
                }
                if !idle_now(c, &mut phase, readable) {
                    // Boxed, as the transaction below: an idle client's task keeps only
                    // `park`.
                    let wait = Box::pin(wait_for_request(
                        c,
                        (deadline, readable),
                        &mut phase,
                        pinned,
                        &mut aborted,
                    ));
                    match wait.await? {
                        Wait::Request => break Taken::Nothing,
                        Wait::Terminate => return Ok(Exit::Left),
                        Wait::Handover => return Ok(Exit::Handover),
                        Wait::Idle => {}
                    }
                }
                if begun != c.begun.is_some() {
                    // In or out of a block pgcarpool began (`deferred`): its timeout from
                    // now.
                    begun = !begun;
                    deadline = idle_deadline(c);
                }
                readable = park(c, deadline, &phase).await?;
                if readable && !pinned && aborted.is_none() {
                    // Readable: the bytes read at once, for the fast path to look at; what
                    // it does not take is `wait_for_request`'s (nothing readable any more:
                    // the bytes are in the buffer).
                    readable = false;
                    match read_now(c) {
                        Poll::Ready(Ok(0)) => return Ok(Exit::Left),
                        Poll::Ready(Err(e)) => return Err(e.into()),
                        // (Pending: parked again, its waker registered by `park`.)
                        Poll::Ready(Ok(_)) | Poll::Pending => {}
                    }
                }
            }
        } else {
            Taken::Nothing
        };
        // Boxed: what a transaction needs (checkout, relay, read-back) is only there while
        // the client has a request, not in every idle client's task. (One box, not one
        // for the wait and the transaction together: the transaction's future would be
        // moved into it again.)
        let after = Box::pin(transaction(c, held.take(), taken)).await?;
        c.reg.handle.set_prepared(c.session.statements.len());
        match after {
            After::Next(keep) => held = keep,
            After::Lost(block) => aborted = block.map(Box::new),
            After::Leave => return Ok(Exit::Left),
        }
    }
}

/// Read what the client's socket has now, without registering for more.
fn read_now(c: &mut Client) -> Poll<std::io::Result<usize>> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    c.conn.poll_read_more(&mut cx)
}

/// Nothing to read or to deliver, what the client is owed written at once (the reply the
/// transaction queued last, the usual case), and no restart under way: `wait_for_request`
/// would say `Wait::Idle` at once, so the client parks without building it. Anything else
/// (a write the socket does not take now, or fails) is left to `wait_for_request`.
fn idle_now(c: &mut Client, phase: &mut PhaseWatch, readable: bool) -> bool {
    if readable
        || !c.conn.rbuf.is_empty()
        || c.listening.inbox().is_some()
        || phase.current() != Phase::Running
    {
        return false;
    }
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    !c.conn.out_pending() || matches!(c.conn.poll_write_out(&mut cx), Poll::Ready(Ok(())))
}

/// Whether a client between transactions may move: its worker sheds clients and it can
/// (`free`: it holds no server and no failed block; it does not listen).
fn may_move(c: &Client, free: bool) -> bool {
    free && c.begun.is_none()
        && !c.listening.is_listening()
        && c.shared
            .workers()
            .is_some_and(|ws| ws.sheds(crate::workers::current()))
}

/// The worker a client that `may_move` is to move to: what it is owed is written first,
/// and nothing of a next request may be read yet.
async fn move_to(c: &mut Client) -> Result<Option<usize>, ClientError> {
    let Some(ws) = c.shared.workers() else {
        return Ok(None);
    };
    c.conn.flush().await?;
    let can = c.conn.rbuf.is_empty() && !c.conn.out_pending();
    Ok(if can {
        ws.wants_move(crate::workers::current())
    } else {
        None
    })
}

/// The idle wait: nothing read, nothing owed to the client. Returns when the client's
/// socket is readable (true), or something was queued for it or the restart phase changed
/// (false: the caller looks again); Err when it is killed or its idle timeout passes.
/// This is what every idle client's task holds, so it holds little: the socket's readiness
/// is polled (its waker lives in the socket's registration), a kill and a restart phase
/// change wake the waker in the client's handle (`ClientHandle::poll_killed`,
/// `Restart::change`), and the timer and the notification wait are boxed and made only
/// when needed.
/// Not an `async fn`: its future is the closure's four fields, without room for the
/// arguments beside them.
fn park<'a>(
    c: &'a mut Client,
    deadline: Option<Instant>,
    phase: &'a PhaseWatch,
) -> impl Future<Output = Result<bool, ClientError>> + 'a {
    // Idle: hold no buffers while waiting, only read once bytes are there, and no empty
    // extended-protocol state.
    c.conn.shrink_all();
    c.session.ext.release_if_empty();
    let mut woken = c
        .listening
        .inbox()
        .map(|inbox| Box::pin(super::notify::woken(Some(inbox))));
    let mut timer = deadline.map(|d| Box::pin(tokio::time::sleep_until(d.into())));
    poll_fn(move |cx| {
        if c.reg.handle.poll_killed(cx).is_ready() {
            return Poll::Ready(Err(killed(c)));
        }
        // After the waker is registered: a change from now on wakes it.
        if phase.moved() {
            return Poll::Ready(Ok(false));
        }
        if let Poll::Ready(r) = c.conn.stream.poll_read_ready(cx) {
            return Poll::Ready(r.map(|()| true).map_err(ClientError::from));
        }
        let woke = woken
            .as_mut()
            .is_some_and(|w| w.as_mut().poll(cx).is_ready());
        if woke {
            return Poll::Ready(Ok(false));
        }
        if timer
            .as_mut()
            .is_some_and(|t| t.as_mut().poll(cx).is_ready())
        {
            return Poll::Ready(Err(idle_timed_out(c)));
        }
        Poll::Pending
    })
}

/// When an idle client is let go: by `client_idle_timeout`, or `idle_transaction_timeout`
/// in a block pgcarpool began for it (`deferred`).
fn idle_deadline(c: &Client) -> Option<Instant> {
    let (cfg, user) = (c.shared.config(), &c.reg.handle.user);
    let timeout = if c.begun.is_some() {
        cfg.idle_transaction_timeout_for(user)
    } else {
        cfg.client_idle_timeout_for(user)
    };
    config::enabled(timeout).map(|d| Instant::now() + d)
}

fn idle_timed_out(c: &Client) -> ClientError {
    let why = if c.begun.is_some() {
        super::relay::TimeoutKind::IdleTransaction.message()
    } else {
        "client_idle_timeout"
    };
    ClientError::fatal("08P01", why.into())
}

/// What the fast path hands the full path for the request it looked at (`fast::Fast`).
enum Taken {
    Nothing,
    /// A server taken for it and fitted to the session, when there is one.
    Server(Option<PooledServer>),
    /// The transaction it began, on this server.
    Resumed(PooledServer, Box<Resumed>),
}

/// What follows a transaction.
enum After {
    /// Wait for the next request, with the server kept (pinned) or not.
    Next(Option<PooledServer>),
    /// The server was lost under the transaction; the client stays, in the failed block
    /// pgcarpool plays for it, if any.
    Lost(Option<super::aborted::Aborted>),
    /// The client said goodbye.
    Leave,
}

/// One transaction (in session mode: the whole session): get a server unless one is held,
/// make it fit the session, relay, then release, keep or close it.
async fn transaction(
    c: &mut Client,
    held: Option<PooledServer>,
    taken: Taken,
) -> Result<After, ClientError> {
    let cfg = &*c.shared.config_full();
    let handle = c.reg.handle.clone();
    let kill = &*handle;
    let fresh = held.is_none();
    let (server, resumed) = server_for(c, cfg, kill, held, taken).await?;
    let pool_settings = c.pool.settings();
    let replays_left = if fresh { replays(&pool_settings) } else { 0 };
    let mode = pool_settings.mode;
    let timeouts = relay_timeouts(cfg, &c.reg.handle.user);
    let Relayed {
        mut server,
        claimed,
        assigned_at,
        withheld_ready,
        event,
        counts,
        effects,
        loss,
    } = relay_replacing(
        c,
        server,
        (cfg, &pool_settings),
        timeouts,
        replays_left,
        kill,
        resumed,
    )
    .await?;
    // The BEGIN pgcarpool answered went with this transaction (`deferred`).
    c.begun = None;
    c.reg.handle.set_server(None);
    if server.tls().is_some() {
        c.reg.handle.set_server_tls(None);
    }
    after_routed(c, &mut server, &event, &pool_settings).await;
    // (The clock as read at the transaction's ReadyForQuery.)
    let held_for = crate::stats::clock::recent().saturating_duration_since(assigned_at);
    add_stats(c, &counts, held_for.as_micros() as u64);
    let reset_always = cfg.settings.server_reset_query_always;
    // Every way out but Release ends the client and its session state (Terminate,
    // timeout, KILL, protocol error). A pinned session never goes back to the pool as it
    // is, nor one that may keep pgcarpool's record of LISTENs in a block (after a Release
    // `notify::after_block` reads and unlistens it).
    server.reset = match event {
        RelayEvent::Release => reset_always,
        _ => mode == PoolMode::Session || reset_always,
    };
    server.discard = c.session.pin.is_some()
        || (!matches!(event, RelayEvent::Release) && !c.listening.take_in_block().is_empty());
    match event {
        RelayEvent::Release => {
            let keep = released(c, &mut server, &effects, claimed, withheld_ready, mode).await?;
            Ok(After::Next(keep.then_some(server)))
        }
        RelayEvent::ClientTerminate | RelayEvent::ClientGone => Ok(After::Leave),
        // PgBouncer's words; the server is closed as it comes back (its pool marked it).
        RelayEvent::ConfigChanged => Err(ClientError::fatal(
            "08P01",
            "database configuration changed".into(),
        )),
        RelayEvent::StatementModeTransaction => Err(ClientError::fatal(
            "08P01",
            "transaction blocks not allowed in statement pooling mode".into(),
        )),
        RelayEvent::ClientProtocol(e) => Err(e.into()),
        RelayEvent::ClientFatal(why) => {
            server.mark_broken();
            Err(ClientError::Told(why))
        }
        // (Taken by the loop above; never here.)
        RelayEvent::TerminatedBeforeReply(_) | RelayEvent::RefusedOnStandby(_) => {
            server.mark_broken();
            Err(ClientError::fatal(
                "57P01",
                "terminating connection due to administrator command".into(),
            ))
        }
        RelayEvent::ServerGone(why) => server_gone(c, &mut server, &why, loss, claimed),
        RelayEvent::Timeout(kind) => {
            tracing::info!(
                server = server.id(),
                db = %c.reg.handle.db,
                user = %c.reg.handle.user,
                "closing because: {}",
                kind.server_reason()
            );
            Err(ClientError::fatal("08P01", kind.message().to_string()))
        }
        RelayEvent::Killed => Err(killed(c)),
        RelayEvent::Limit(why) => Err(ClientError::fatal("53400", why)),
        RelayEvent::PqexecDisallowed => Err(pqexec_disallowed(c)),
    }
}

/// How many times a client's first request on a server just checked out may be sent
/// again. That server may have been terminated while idle, its FATAL still on the way:
/// the request then goes to another one (`Relay::first_reply`). A sweep of
/// pg_terminate_backend can have ended every idle server of the pool, each FATAL not come
/// yet: as many tries as the pool has servers, and one more.
fn replays(s: &crate::pool::PoolSettings) -> usize {
    s.pool_size + s.reserve_pool_size + 1
}

/// The server a transaction runs on: the one the client holds, the one the fast path
/// took for it or began it on (with what it did, `Resumed`), or one taken now and fitted
/// to the session.
async fn server_for(
    c: &mut Client,
    cfg: &config::Config,
    kill: &ClientHandle,
    held: Option<PooledServer>,
    taken: Taken,
) -> Result<(PooledServer, Option<Box<Resumed>>), ClientError> {
    Ok(match (held, taken) {
        (Some(s), _) => {
            // The transaction's start (a checkout reads the clock when it takes a server).
            crate::stats::clock::now();
            (s, None)
        }
        (None, Taken::Resumed(s, r)) => (s, Some(r)),
        (None, Taken::Server(Some(s))) => (s, None),
        (None, Taken::Server(None) | Taken::Nothing) => (routed_server(c, cfg, kill).await?, None),
    })
}

/// The timeouts a relay of `user`'s transaction watches.
fn relay_timeouts(cfg: &config::Config, user: &str) -> RelayTimeouts {
    RelayTimeouts {
        query: config::enabled(cfg.query_timeout_for(user)),
        idle_transaction: config::enabled(cfg.idle_transaction_timeout_for(user)),
        transaction: config::enabled(cfg.transaction_timeout_for(user)),
    }
}

/// After a transaction the pool mode lets go: its settings read back, what it pins, its
/// notifications and the ReadyForQuery kept back delivered. True: the client keeps its
/// server (pinned).
async fn released(
    c: &mut Client,
    server: &mut PooledServer,
    effects: &Effects,
    claimed: bool,
    withheld_ready: Option<(u8, bytes::Bytes)>,
    mode: PoolMode,
) -> Result<bool, ClientError> {
    if let Err(e) = super::notify::after_block(c, server).await {
        server.mark_broken();
        return Err(e);
    }
    if !effects.is_empty() || c.session.pin.is_some() {
        match Box::pin(after_transaction(c, server, effects)).await {
            Ok(Ok(())) => {}
            Ok(Err(refused)) => return Err(refused),
            // The transaction is over and answered; the server went before its
            // settings were read back. Only a precaution was lost (code that might
            // have changed settings out of sight): the client stays. A SET or
            // something that pins it cannot be carried: it goes, as before.
            Err(e)
                if mode != PoolMode::Session
                    && c.session.pin.is_none()
                    && effects.gucs.is_empty()
                    && !effects.gucs_unknown
                    && !effects.pin_check =>
            {
                server.mark_broken();
                client_event!(
                    info,
                    c.reg.handle,
                    server = server.id(),
                    "server lost after the client's transaction, the client stays: {e}"
                );
            }
            Err(e) => {
                server.mark_broken();
                return Err(ClientError::fatal(
                    "08006",
                    format!("server connection lost: {e}"),
                ));
            }
        }
    }
    if let Some(held) = server.take_notifications(c.session.backend_pid) {
        c.conn.queue(held);
    }
    let (notified, discard_all) = (effects.notify, effects.discard_all);
    super::notify::after_transaction(c, server.key().0, claimed, notified, discard_all).await?;
    // What came meanwhile is the client's before the ReadyForQuery kept back (its
    // own notifications come before it, as from PostgreSQL).
    super::notify::deliver(c)?;
    if let Some((status, params)) = withheld_ready {
        // The ParameterStatus messages that came with it after the notifications, as
        // PostgreSQL sends them.
        c.conn.queue(params);
        c.conn.queue_with(|b| backend::ready_for_query(b, status));
    }
    server.discard = c.session.pin.is_some();
    Ok(c.session.pin.is_some())
}

/// The server was lost under the client's transaction (`why`): the client stays in the
/// failed block pgcarpool plays for it when it may (`loss`), else it is told and goes.
fn server_gone(
    c: &mut Client,
    server: &mut PooledServer,
    why: &str,
    loss: Option<super::aborted::Loss>,
    claimed: bool,
) -> Result<After, ClientError> {
    server.mark_broken();
    if let Some(loss) = loss {
        client_event!(
            info,
            c.reg.handle,
            server = server.id(),
            "server lost under the client's transaction, the client stays: {why}"
        );
        if claimed {
            c.pool.listener.unclaim(server.key().0, c.reg.handle.id);
        }
        return Ok(After::Lost(super::aborted::begin(c, &loss, why)));
    }
    Err(ClientError::fatal(
        "08006",
        format!("server connection lost: {why}"),
    ))
}

/// What a transaction's relay ended with.
struct Relayed {
    /// The server it ended on (another one than it began with, when that was replaced).
    server: PooledServer,
    /// The pool's listener was told of the server (`notify::claim`).
    claimed: bool,
    assigned_at: Instant,
    withheld_ready: Option<(u8, bytes::Bytes)>,
    event: RelayEvent,
    counts: RelayCounts,
    effects: Effects,
    /// The server was lost under a client that may stay (`Relay::loss`).
    loss: Option<super::aborted::Loss>,
}

/// Relay the client with `server` until an event. A server just checked out (up to
/// `replays_left` times) that was terminated before it answered any of the client's first
/// request is replaced, and the request sent again (`Relay::first_reply`).
async fn relay_replacing(
    c: &mut Client,
    mut server: PooledServer,
    (cfg, pool_settings): (&config::Config, &crate::pool::PoolSettings),
    timeouts: RelayTimeouts,
    mut replays_left: usize,
    kill: &ClientHandle,
    mut resumed: Option<Box<Resumed>>,
) -> Result<Relayed, ClientError> {
    loop {
        server.mark_served();
        let claimed = super::notify::claim(c, server.key().0);
        link(c, &server);
        let assigned_at = match &resumed {
            Some(r) => r.started,
            None => crate::stats::clock::recent(),
        };
        let standby = !Arc::ptr_eq(server.pool(), &c.pool);
        let start = Start {
            keep_first: replays_left > 0 && !claimed,
            standby,
        };
        let (event, counts, effects, withheld_ready, loss) = relay_once(
            c,
            &mut server,
            (cfg, pool_settings),
            timeouts,
            start,
            kill,
            resumed.take(),
        )
        .await;
        let (first, refused) = match event {
            RelayEvent::TerminatedBeforeReply(first) => (first, false),
            RelayEvent::RefusedOnStandby(first) => (first, true),
            event => {
                return Ok(Relayed {
                    server,
                    claimed,
                    assigned_at,
                    withheld_ready,
                    event,
                    counts,
                    effects,
                    loss,
                });
            }
        };
        replays_left = replays_left.saturating_sub(1);
        if refused {
            crate::pool::reads::RoutingStats::add(&c.pool.routing.refused_replays);
            client_event!(
                debug,
                c.reg.handle,
                server = server.id(),
                "a standby refused the client's first request (25006), \
                 sending it to the primary"
            );
        } else {
            client_event!(
                info,
                c.reg.handle,
                server = server.id(),
                "server terminated before it answered the client's first request, \
                 sending it to another server"
            );
        }
        // A standby's server was replaced by another of the same standby; after a
        // refusal, the primary's.
        let sub = (standby && !refused).then(|| server.pool().clone());
        if refused {
            server.discard();
        } else {
            server.mark_broken();
        }
        // The request first, as the client sent it, then what the client sent after it.
        let rest = std::mem::replace(&mut c.conn.rbuf, first);
        c.conn.rbuf.extend_from_slice(&rest);
        c.reg.handle.set_server(None);
        // Back to the pool (it closes it: broken) before another is asked for: its place
        // may be the one the next server takes.
        drop(server);
        server = fitted_server(c, cfg, kill, sub.as_ref(), None).await?;
    }
}

/// The client is linked to the server it is given (SHOW CLIENTS' server columns, the
/// server its cancel requests go to) and is active.
pub(super) fn link(c: &Client, server: &PooledServer) {
    let h = &c.reg.handle;
    h.set_server(Some(ServerLink {
        id: server.id(),
        addr: server.addr().clone(),
        key: server.key(),
        created: server.created(),
        prepared: server.exchange().prepared_len(),
    }));
    if server.tls().is_some() {
        h.set_server_tls(server.tls().cloned());
    }
    h.set_server_key_rest(server.key_rest().cloned());
    h.set_state(ClientState::Active);
}

/// How a relay starts: keep the client's first request for a replay; the server is a
/// standby's (read routing).
#[derive(Clone, Copy)]
struct Start {
    keep_first: bool,
    standby: bool,
}

/// One relay of the client with `server` until an event: the event, the counts, what the
/// statements did to the session, and the ReadyForQuery kept back. `keep_first`: the
/// server was just checked out, keep the client's first request for a replay.
async fn relay_once(
    c: &mut Client,
    server: &mut PooledServer,
    (cfg, pool_settings): (&config::Config, &crate::pool::PoolSettings),
    timeouts: RelayTimeouts,
    start: Start,
    kill: &ClientHandle,
    resumed: Option<Box<Resumed>>,
) -> (
    RelayEvent,
    RelayCounts,
    Effects,
    Option<(u8, bytes::Bytes)>,
    Option<super::aborted::Loss>,
) {
    let mode = pool_settings.mode;
    let begun = c.begun.as_ref().map(|b| b.begin);
    let mut relay = Relay::new(
        &mut c.conn,
        server,
        &mut c.session,
        mode,
        c.shared.statements(),
        pool_settings.max_prepared_statements,
    );
    relay.max_client_statements = cfg.settings.client_max_statements;
    relay.plan_once = cfg.settings.plan_once;
    relay.clients = Some((c.shared.clients(), &c.reg.handle.user));
    relay.pools = Some(c.shared.pools());
    relay.disable_pqexec = cfg.settings.disable_pqexec;
    relay.hold_ready = c.listening.is_listening();
    relay.listener_channels = c.listening.channels().to_vec();
    if start.keep_first || start.standby {
        relay.first_request = Some(FirstRequest {
            standby: start.standby,
            ..Default::default()
        });
    }
    relay.reads_only = start.standby;
    if mode == PoolMode::Session {
        relay.fast_close = Some((&c.pool, &c.shared));
    } else {
        relay.keep_client = true;
    }
    let hosts = &pool_settings.target.hosts;
    if hosts.checks_roles() && hosts.attrs.wants_primary() && !start.standby {
        relay.fence = Some(hosts);
    }
    if let Some(b) = begun {
        relay.send_begin(b);
    }
    if let Some(r) = resumed {
        relay.resume(*r);
    }
    let event = tokio::select! {
        biased;
        _ = kill.killed() => RelayEvent::Killed,
        ev = relay.run(timeouts) => ev,
    };
    let withheld_ready = relay
        .withheld_ready
        .map(|status| (status, std::mem::take(&mut relay.withheld_params)));
    c.listening
        .note_in_block(std::mem::take(&mut relay.listen_in_block));
    let loss = match event {
        RelayEvent::ServerGone(_) => relay.loss(),
        _ => None,
    };
    (
        event,
        relay.counts,
        std::mem::take(&mut relay.effects),
        withheld_ready,
        loss,
    )
}

/// disable_pqexec: a simple Query closes the client, in PgBouncer's words.
fn pqexec_disallowed(c: &Client) -> ClientError {
    client_event!(error, c.reg.handle, "client used \"Query\" packet type");
    ClientError::fatal("08P01", "PQexec disallowed".into())
}

/// After a transaction whose statements touched the session: read back the settings it
/// changed, follow RESET ALL / DISCARD ALL, and find out whether it now needs its server
/// (temp tables, LISTEN, advisory locks, WITH HOLD cursors).
async fn after_transaction(
    c: &mut Client,
    server: &mut PooledServer,
    effects: &Effects,
) -> Result<Result<(), ClientError>, crate::server::ServerError> {
    if effects.discard_all {
        // The server is back to its login values (DISCARD ALL cannot be rolled back); the
        // client's session to the servers' defaults and its startup values.
        let defaults = c.pool.server_params();
        c.session
            .reset_all(defaults.as_deref().unwrap_or(server.login_params()));
        server.reset_params();
        c.session.statements.clear();
    }
    // Code pgcarpool cannot read (DO, CALL, functions it does not know) may have set or
    // reset anything: every setting the session has is read back. So after a RESET ALL:
    // it returned to the startup values, or a rollback (to a savepoint) undid it.
    let reset_all = effects.reset_all && !effects.discard_all;
    let hidden = reset_all
        || effects.gucs_unknown
        || (effects.calls && c.shared.config().settings.check_function_calls);
    // After a DISCARD ALL too: the client's startup values were set again after it
    // (`Relay::startup_after_discard`).
    let mut names = read_back_names(c, server, effects, effects.reset_all, hidden);
    let dtro = "default_transaction_read_only";
    let own_dtro = c.session.startup.get(dtro).is_none() && c.session.params.get(dtro).is_some();
    if reset_all && own_dtro {
        names.push(dtro.to_string());
    }
    let pins = effects.pin_check || hidden || c.session.pin.is_some();
    // Fitted before the read-back, which makes the same changes to both: still fitted
    // (so a session's next checkout costs the same however many settings it holds).
    let fitted =
        !effects.discard_all && !reset_all && !hidden && server.fitted_to(&c.session.params);
    let (changed, reasons) = sync::read_back(server, &names, hidden, pins).await?;
    for (name, value) in changed {
        server.set_param(&name, value.as_deref());
        match value {
            Some(v) => c.session.set_param(&name, &v),
            None => c.session.remove_param(&name),
        }
    }
    if fitted {
        server.mark_fitted(&c.session.params);
    }
    if reset_all && own_dtro && server.parameters().get(dtro) == server.login_params().get(dtro) {
        // Back to the server's own (`sync::is_server_role`): no longer the client's
        // setting (a rollback may have undone the RESET ALL: then it stays).
        c.session.remove_param(dtro);
    }
    let max_settings = c.shared.config().settings.client_max_settings;
    if c.session.params.len() > max_settings {
        server.discard = true;
        return Ok(Err(ClientError::fatal(
            "53400",
            format!("too many session settings: client_max_settings is {max_settings}"),
        )));
    }
    match reasons {
        Some(reasons) => pin(c, server, reasons).await,
        None => Ok(Ok(())),
    }
}

/// What the server holds after the transaction (`reasons`, from `sync::PIN_REASONS`): its
/// channels go to the pool's listener, the rest pins the client, if it may.
async fn pin(
    c: &mut Client,
    server: &mut PooledServer,
    mut reasons: Vec<&'static str>,
) -> Result<Result<(), ClientError>, crate::server::ServerError> {
    if reasons.contains(&"listen") && c.pool.settings().mode != PoolMode::Session {
        // Its channels go to the pool's listener: LISTEN pins no client.
        reasons.retain(|r| *r != "listen");
        if let Err(e) = super::notify::take_channels(c, server).await? {
            server.discard = true;
            return Ok(Err(e));
        }
    }
    if !reasons.is_empty() && c.session.pin.is_none() && c.pool.settings().pin_error {
        server.discard = true;
        return Ok(Err(ClientError::fatal(
            "0A000",
            format!(
                "{} cannot be used in {} pooling mode (pin_mode = error)",
                reasons.join(", "),
                if c.pool.settings().mode == PoolMode::Statement {
                    "statement"
                } else {
                    "transaction"
                }
            ),
        )));
    }
    if !reasons.is_empty() && c.session.pin.is_none() && !c.pool.pin() {
        // Every server this pool may keep for pinned clients is taken: this client
        // cannot keep one, and others must not wait for it.
        server.discard = true;
        return Ok(Err(ClientError::fatal(
            "53300",
            format!(
                "too many pinned clients: {} would keep a server, and pin_pool_size ({}) servers are kept already",
                reasons.join(", "),
                c.pool.settings().pin_pool_size
            ),
        )));
    }
    c.session.set_pin(&c.pool, &c.reg.handle, reasons);
    Ok(Ok(()))
}

/// The settings to read back after a transaction: the ones it set; after a RESET ALL the
/// startup ones too; when `hidden`, every one the session may have.
fn read_back_names(
    c: &Client,
    server: &PooledServer,
    effects: &Effects,
    reset_all: bool,
    hidden: bool,
) -> Vec<String> {
    let mut names = effects.gucs.clone();
    let add = |names: &mut Vec<String>, k: &str| {
        if !names.iter().any(|g| g.eq_ignore_ascii_case(k)) {
            names.push(k.to_string());
        }
    };
    if reset_all {
        // The client's RESET ALL went back to its startup values (`rewrite::to_startup_value`
        // sent it with them): the server holds them now, not its login values.
        for (k, _) in c.session.startup.iter() {
            add(&mut names, k);
        }
    }
    if hidden {
        for n in ["role", "session_authorization"] {
            add(&mut names, n);
        }
        for (k, v) in server.parameters().iter() {
            if !sync::is_read_only(k)
                && !sync::is_server_role(k)
                && server.login_params().get(k) != Some(v)
            {
                add(&mut names, k);
            }
        }
    }
    names
}

pub(super) fn killed(c: &Client) -> ClientError {
    let reason = c.reg.handle.kill_reason();
    let code = if reason == super::registry::TERMINATED {
        "57P01"
    } else {
        "08P01"
    };
    ClientError::fatal(code, reason.into())
}

/// `held_us`: how long the client had the server (one transaction in transaction mode).
pub(super) fn add_stats(c: &Client, n: &RelayCounts, held_us: u64) {
    let s = c.pool.stats.lane(crate::workers::current());
    PoolStats::add(&s.query_count, n.queries);
    PoolStats::add(&s.xact_count, n.transactions);
    PoolStats::add(&s.bytes_received, n.bytes_from_client);
    PoolStats::add(&s.bytes_sent, n.bytes_from_server);
    PoolStats::add(&s.query_time_us, n.query_time_us);
    PoolStats::add(&s.client_parse_count, n.client_parses);
    PoolStats::add(&s.server_parse_count, n.server_parses);
    PoolStats::add(&s.bind_count, n.binds);
    // Per-query times are not kept: each query of the batch counts at the batch's mean.
    if let Some(mean) = n.query_time_us.checked_div(n.queries) {
        s.query_hist.record_n(mean, n.queries);
    }
    if let Some(per) = held_us.checked_div(n.transactions) {
        PoolStats::add(&s.xact_time_us, held_us);
        s.xact_hist.record_n(per, n.transactions);
    }
}

/// What an idle client did next.
enum Wait {
    /// It sent a request that needs a server.
    Request,
    /// It said Terminate (or closed the connection).
    Terminate,
    /// Online restart: it may move to the new process now.
    Handover,
    /// Nothing to read and nothing owed: `park` until there is.
    Idle,
}

/// Flush what the client is owed and wait for its next request. While the pooler is
/// suspended nothing is read; during a handover a client that may move says so.
async fn wait_for_request(
    c: &mut Client,
    (deadline, mut readable): (Option<Instant>, bool),
    phase: &mut PhaseWatch,
    pinned: bool,
    aborted: &mut Option<Box<super::aborted::Aborted>>,
) -> Result<Wait, ClientError> {
    let handle = c.reg.handle.clone();
    let kill = &*handle;
    loop {
        // Between transactions: what the pool's listener queued for the client is its now.
        super::notify::deliver(c)?;
        if c.conn.out_pending() {
            let inbox = c.listening.inbox();
            tokio::select! {
                biased;
                _ = kill.killed() => return Err(killed(c)),
                r = c.conn.flush() => r?,
                // A client that does not read: its notifications count against its bound.
                _ = super::notify::woken(inbox) => continue,
            }
        }
        if let Some(&tag) = c.conn.rbuf.first() {
            // A message PostgreSQL would refuse on its header ends the client here, before
            // any server is asked for (`RelayEvent::ClientProtocol` when one is held).
            let header = frontend::header(&c.conn.rbuf)?;
            if tag == frontend::TERMINATE {
                return Ok(Wait::Terminate);
            }
            if tag == frontend::QUERY && c.shared.config().settings.disable_pqexec {
                return Err(pqexec_disallowed(c));
            }
            match answer_front(c, header, pinned, aborted, kill).await? {
                Local::Answered => continue,
                Local::NeedServer => return Ok(Wait::Request),
                Local::Incomplete => {}
            }
        }
        let now = phase.current();
        // In a failed block it moves once the block is over.
        if now == Phase::HandingOver && !c.stays && aborted.is_none() && c.begun.is_none() {
            match super::stays_because(c) {
                None => return Ok(Wait::Handover),
                Some(why) => {
                    c.reg.handle.set_handover(Some(format!("stays: {why}")));
                    c.stays = true;
                }
            }
        }
        if now == Phase::Suspended {
            // SUSPEND: the client's bytes wait in the socket until RESUME.
            tokio::select! {
                _ = phase.changed() => continue,
                _ = idle_deadline_at(deadline) => return Err(idle_timed_out(c)),
                _ = kill.killed() => return Err(killed(c)),
            }
        }
        // Parked until the socket was readable: read it now (once), else park again.
        if c.conn.rbuf.is_empty() && !std::mem::take(&mut readable) {
            return Ok(Wait::Idle);
        }
        // Readable after `park` (the usual case): the bytes are read at once, without
        // making the wait below (its waker is registered there when this finds none).
        let read = c
            .conn
            .poll_read_more(&mut std::task::Context::from_waker(std::task::Waker::noop()));
        if let Poll::Ready(r) = read {
            if r? == 0 {
                return Ok(Wait::Terminate);
            }
            continue;
        }
        tokio::select! {
            _ = super::notify::woken(c.listening.inbox()) => continue,
            r = poll_fn(|cx| c.conn.poll_read_more(cx)) => {
                if r? == 0 {
                    return Ok(Wait::Terminate);
                }
            }
            _ = idle_deadline_at(deadline) => return Err(idle_timed_out(c)),
            _ = kill.killed() => return Err(killed(c)),
            _ = phase.changed() => continue,
        }
    }
}

/// What the request at the front of an idle client's buffer (`header`, its first
/// message's) comes to: answered here, incomplete, or one that needs a server.
async fn answer_front(
    c: &mut Client,
    header: Option<proto::Header>,
    pinned: bool,
    aborted: &mut Option<Box<super::aborted::Aborted>>,
    kill: &ClientHandle,
) -> Result<Local, ClientError> {
    Ok(if let Some(local) = ignored_copy_message(c, header) {
        local
    } else if pinned {
        let answered = super::notify::answer(c, kill).await?;
        answered.unwrap_or(Local::NeedServer)
    } else if let Some(block) = aborted {
        let (local, over) = super::aborted::answer(c, block)?;
        if over {
            *aborted = None;
        }
        local
    } else if let Some(local) = super::deferred::answer(c) {
        local
    } else if for_a_server(&c.conn.rbuf, &c.session) {
        Local::NeedServer
    } else {
        match super::notify::answer(c, kill).await? {
            Some(local) => local,
            None => answer_without_server(c)?,
        }
    })
}

/// Most bytes of a CopyData outside COPY held to be ignored without a server (a larger
/// one goes to a server, which ignores it as well).
const MAX_IGNORED_COPY: usize = 64 * 1024;

/// CopyData, CopyDone or CopyFail from a client between transactions, so with no COPY
/// under way (the rest of a COPY that failed while it was sending): PostgreSQL reads and
/// ignores them, and so does pgcarpool, without a server: Answered (dropped, nothing to
/// say) or Incomplete (not all here yet); None: not such a message (or one too large).
fn ignored_copy_message(c: &mut Client, header: Option<proto::Header>) -> Option<Local> {
    let h = header?;
    let copy = matches!(
        h.tag,
        frontend::COPY_DATA | frontend::COPY_DONE | frontend::COPY_FAIL
    );
    if !copy || h.total > MAX_IGNORED_COPY {
        return None;
    }
    if c.conn.rbuf.len() < h.total {
        return Some(Local::Incomplete);
    }
    c.conn.consume(h.total);
    Some(Local::Answered)
}

/// Resolves at `deadline`, never without one. The timer is boxed and made only when there
/// is a deadline: most idle clients have none, and their tasks do not carry its room.
async fn idle_deadline_at(deadline: Option<Instant>) {
    match deadline {
        Some(d) => Box::pin(tokio::time::sleep_until(d.into())).await,
        None => std::future::pending().await,
    }
}

pub(super) enum Local {
    Answered,
    NeedServer,
    Incomplete,
}

/// A whole simple Query, or Parse of the unnamed statement, that nothing answered at the
/// front concerns (`notify::parse`: LISTEN, UNLISTEN, pg_listening_channels; a Query's
/// DEALLOCATE): it goes to a server, the common case found in one look at its first words
/// (`notify::answer` and `answer_without_server` would find the same, `Local::NeedServer`,
/// at more cost). So is a Bind of the unnamed statement, or of a named one whose text is
/// none of `notify`'s (the statement's effects are None).
pub(super) fn for_a_server(buf: &[u8], session: &super::session::VirtualSession) -> bool {
    let Some(&tag) = buf.first() else {
        return false;
    };
    if !matches!(tag, frontend::QUERY | frontend::PARSE | frontend::BIND) {
        return false;
    }
    let Ok(Some(h)) = proto::header(buf, proto::MAX_MESSAGE_LEN) else {
        return false;
    };
    if buf.len() < h.total {
        return false;
    }
    let body = &buf[5..h.total];
    if tag == frontend::BIND {
        let mut r = proto::Reader::new(body, "Bind");
        return r.cstr_bytes().is_ok()
            && r.cstr_bytes().is_ok_and(|name| {
                name.is_empty()
                    || session
                        .statements
                        .get(name)
                        .is_some_and(|s| s.effects.is_none())
            });
    }
    let text = if tag == frontend::QUERY {
        frontend::parse_query(body)
    } else {
        // (A named statement's Parse may be answered here: `answer_without_server`.)
        let mut r = proto::Reader::new(body, "Parse");
        match r.cstr_bytes() {
            Ok([]) => r.cstr_bytes(),
            _ => return false,
        }
    };
    let Ok(sql) = text else {
        return false;
    };
    // Most are told by their first letter: LISTEN, UNLISTEN, DEALLOCATE and a SELECT of
    // pg_listening_channels are what is answered at the front.
    let start = sql
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(sql.len());
    let first = sql.get(start).map_or(0, |c| c | 0x20);
    match first {
        b'l' | b'u' | b'd' => {}
        b's' if selects_no_channels(&sql[start..]) => return true,
        b's' => return super::notify::parse(sql).is_none(),
        c if c.is_ascii_alphabetic() => return true,
        _ => {}
    }
    super::notify::parse(sql).is_none() && !classify::starts_with_word(sql, b"deallocate")
}

/// `s` (from its first word) is a SELECT whose next word is not pg_listening_channels
/// (`notify::parse` would find no statement of its own): `SELECT` and a space, then a
/// letter other than `p`, a digit or an underscore. Anything else (`*`, a comment, `pg_…`,
/// a quote) is left to `notify::parse`.
fn selects_no_channels(s: &[u8]) -> bool {
    s.len() > 7
        && s[..6].eq_ignore_ascii_case(b"select")
        && s[6].is_ascii_whitespace()
        && s[7..]
            .iter()
            .find(|c| !c.is_ascii_whitespace())
            .is_some_and(|&c| (c.is_ascii_alphanumeric() || c == b'_') && c | 0x20 != b'p')
}

/// An idle client whose buffered messages begin with Parse of statements a server already
/// accepted, Close of statements, Sync and Flush needs no server for those: answer them
/// here (libpq's PQprepare, pgbench -M prepared, PDO, tokio-postgres closing a statement).
/// Anything else needs a server.
fn answer_without_server(c: &mut Client) -> Result<Local, ClientError> {
    let settings = c.pool.settings_now();
    if settings.mode == PoolMode::Session || settings.max_prepared_statements == 0 {
        return Ok(Local::NeedServer);
    }
    if let Some(done) = deallocate_without_server(c)? {
        return Ok(done);
    }
    let buf = &c.conn.rbuf;
    let mut at = 0;
    let mut end = None;
    // Names parsed earlier in these messages: a second Parse of one is PostgreSQL's 42P05
    // (long-run seed 11201).
    let mut named: Vec<&[u8]> = Vec::new();
    loop {
        let h = match frontend::header(&buf[at..]) {
            Ok(Some(h)) if h.total <= proto::MAX_MESSAGE_LEN => h,
            Ok(None) => break,
            // Too large to hold (a server streams it), or refused by PostgreSQL on its
            // header (the client is let go once it is at the front): the rounds before it
            // are answered here.
            _ => {
                if end.is_none() {
                    return Ok(Local::NeedServer);
                }
                break;
            }
        };
        if buf.len() - at < h.total {
            break;
        }
        let body = &buf[at + 5..at + h.total];
        let ok = match h.tag {
            frontend::PARSE => {
                let mut r = proto::Reader::new(body, "Parse");
                let name = r.cstr_bytes()?;
                // Text that may name the client's statements (SQL EXECUTE) is mapped by the
                // relay.
                let fresh = !name.is_empty() && !named.contains(&name);
                named.push(name);
                fresh
                    && !classify::may_matter(r.cstr_bytes()?)
                    && !c.session.statements.contains_key(name)
                    && c.shared
                        .statements()
                        .lookup(
                            &c.session.statement_scope(&body[name.len() + 1..]),
                            &body[name.len() + 1..],
                        )
                        .is_some_and(|s| s.is_validated())
            }
            frontend::CLOSE => body.first() == Some(&b'S'),
            frontend::SYNC | frontend::FLUSH => true,
            _ => false,
        };
        if !ok {
            // Rounds answerable at the front are answered (a driver's Close and Sync of a
            // statement it dropped, pipelined with its next query); the rest needs a server.
            if end.is_none() {
                return Ok(Local::NeedServer);
            }
            break;
        }
        at += h.total;
        if matches!(h.tag, frontend::SYNC | frontend::FLUSH) {
            end = Some(at);
        }
    }
    let Some(end) = end else {
        return Ok(Local::Incomplete);
    };
    answer_rounds(c, end)?;
    Ok(Local::Answered)
}

/// Answer the client's first `end` bytes, rounds `answer_without_server` found it may.
fn answer_rounds(c: &mut Client, end: usize) -> Result<(), ClientError> {
    let msgs = c.conn.rbuf.split_to(end).freeze();
    let mut at = 0;
    while at < msgs.len() {
        let h = proto::header(&msgs[at..], proto::MAX_MESSAGE_LEN)?.expect("checked above");
        let body = msgs.slice(at + 5..at + h.total);
        match h.tag {
            frontend::PARSE => {
                let name_len = body.iter().position(|&b| b == 0).expect("checked above");
                let rest = &body[name_len + 1..];
                let scope = c.session.statement_scope(rest);
                let max = c.shared.config().settings.client_max_statements;
                let stmt = c
                    .session
                    .intern(c.shared.statements(), max, (&scope, rest), None)
                    .map_err(|why| ClientError::fatal("53400", why))?;
                c.session.statements.insert(body.slice(..name_len), stmt);
                PoolStats::add(
                    &c.pool
                        .stats
                        .lane(crate::workers::current())
                        .client_parse_count,
                    1,
                );
                let generation = c.shared.statements().changes_seen();
                c.session.parsed_name(body.slice(..name_len), generation);
                c.conn.queue_with(backend::parse_complete);
            }
            frontend::CLOSE => {
                let name = proto::Reader::new(&body[1..], "Close").cstr_bytes()?;
                if name.is_empty() {
                    c.session.drop_unnamed();
                } else {
                    c.session.statements.remove(name);
                }
                c.conn.queue_with(backend::close_complete);
            }
            frontend::SYNC => c.conn.queue_with(|b| backend::ready_for_query(b, b'I')),
            _ => {}
        }
        at += h.total;
    }
    Ok(())
}

/// `DEALLOCATE name` / `DEALLOCATE ALL` alone in a Query from an idle client only changes its
/// virtual session (PHP PDO deallocates by name what it prepared with the protocol).
fn deallocate_without_server(c: &mut Client) -> Result<Option<Local>, ClientError> {
    let buf = &c.conn.rbuf;
    if buf.first() != Some(&frontend::QUERY) {
        return Ok(None);
    }
    let Some(h) = proto::header(buf, proto::MAX_MESSAGE_LEN)? else {
        return Ok(Some(Local::Incomplete));
    };
    if buf.len() < h.total {
        return Ok(Some(Local::Incomplete));
    }
    let sql = proto::frontend::parse_query(&buf[5..h.total])?;
    // A text whose only effects are DEALLOCATEs starts with one (a few bytes to look at,
    // not the whole text: this runs for every query of an idle client).
    if !classify::starts_with_word(sql, b"deallocate") {
        return Ok(None);
    }
    let e = classify::classify(sql);
    let only = |mut x: classify::Effects| {
        x.deallocate = None;
        x.deallocate_all = false;
        x.is_empty()
    };
    if !only(e.clone()) || (e.deallocate.is_none() && !e.deallocate_all) {
        return Ok(None);
    }
    c.conn.consume(h.total);
    // A simple query drops the unnamed statement, as PostgreSQL's does.
    c.session.drop_unnamed();
    if e.deallocate_all {
        c.session.statements.clear();
        c.conn
            .queue_with(|b| backend::command_complete(b, "DEALLOCATE ALL"));
    } else if let Some(name) = e.deallocate {
        if c.session.statements.remove(name.as_bytes()).is_some() {
            c.conn
                .queue_with(|b| backend::command_complete(b, "DEALLOCATE"));
        } else {
            let msg = format!("prepared statement \"{name}\" does not exist");
            c.conn
                .queue_with(|b| backend::error_response(b, "ERROR", "26000", &msg));
        }
    }
    c.conn.queue_with(|b| backend::ready_for_query(b, b'I'));
    Ok(Some(Local::Answered))
}
/// A server for the client's next transaction: with read routing, from the pool its
/// request goes to (`route`). Without it this is one flag.
async fn routed_server(
    c: &mut Client,
    cfg: &config::Config,
    kill: &ClientHandle,
) -> Result<PooledServer, ClientError> {
    if !c.pool.settings_now().read_routing {
        return fitted_server(c, cfg, kill, None, None).await;
    }
    Box::pin(routed(c, cfg, kill)).await
}

/// Read routing: a standby's server when the request only reads and a standby has
/// replayed what the client has seen (asked, when not known), else the primary's.
async fn routed(
    c: &mut Client,
    cfg: &config::Config,
    kill: &ClientHandle,
) -> Result<PooledServer, ClientError> {
    use super::route::{self, Route};
    let (host, ask) = match route::choose(c) {
        Route::Primary(read) => {
            if read {
                route::count_read(&c.pool, None);
            }
            return fitted_server(c, cfg, kill, None, None).await;
        }
        Route::Standby(i) => (i, false),
        Route::Ask(i) => (i, true),
    };
    let sub = c.pool.read_pool(host);
    match fitted_server(c, cfg, kill, Some(&sub), None).await {
        Ok(mut s) => {
            if !ask {
                return Ok(s);
            }
            let fresh = route::ask_replayed(&mut s, &sub).await;
            if fresh.is_some_and(|lsn| lsn >= route::seen(c).lsn) {
                return Ok(s);
            }
        }
        // The standby went (promoted, down) meanwhile: the primary serves.
        Err(e @ ClientError::Fatal { .. }) => {
            tracing::debug!(
                client = c.reg.handle.id,
                "no standby server for a read: {e}"
            );
        }
        Err(e) => return Err(e),
    }
    route::count_read(&c.pool, None);
    fitted_server(c, cfg, kill, None, None).await
}

/// After a routed transaction: a read counted for its standby, and what the client has
/// seen (read_your_writes).
async fn after_routed(
    c: &mut Client,
    server: &mut PooledServer,
    event: &RelayEvent,
    settings: &crate::pool::PoolSettings,
) {
    if settings.read_routing {
        Box::pin(after_read_routed(
            c,
            server,
            event,
            settings.read_your_writes,
        ))
        .await;
    }
}

/// `after_routed` with read routing on.
async fn after_read_routed(
    c: &mut Client,
    server: &mut PooledServer,
    event: &RelayEvent,
    ryw: bool,
) {
    let standby = !Arc::ptr_eq(server.pool(), &c.pool);
    if standby {
        super::route::count_read(&c.pool, server.host());
    }
    if !ryw {
        return;
    }
    if !standby && matches!(event, RelayEvent::Release) {
        super::route::after_primary(c, server).await;
    } else {
        super::route::after_loss(c, server.host());
    }
}

/// Servers tried for one transaction when each dies before the client's first byte.
const SERVER_TRIES: usize = 3;

/// A server for the client's next transaction, its session parameters applied. A server
/// that dies before any byte of the client's was sent to it (terminated while idle, its
/// FATAL on the way) is closed and another taken, a few times: the client never knows.
pub(super) async fn fitted_server(
    c: &mut Client,
    cfg: &config::Config,
    kill: &ClientHandle,
    sub: Option<&Arc<Pool>>,
    mut first: Option<PooledServer>,
) -> Result<PooledServer, ClientError> {
    c.reg.handle.set_state(ClientState::Waiting);
    let mut tries = 0;
    let mut waited_us = 0;
    loop {
        tries += 1;
        let (mut server, waited) = match first.take() {
            Some(s) => (s, 0),
            None => checkout(c, cfg, kill, sub).await?,
        };
        waited_us += waited;
        server.set_last_client(c.reg.handle.id);
        let applied = if sync::differs(&mut server, &c.session.params) {
            Box::pin(sync::apply(&mut server, &c.session.params)).await
        } else {
            Ok(None)
        };
        match applied {
            Ok(None) => {}
            Ok(Some(e)) => {
                return Err(ClientError::fatal(
                    "22023",
                    format!("could not apply session parameters: {}", e.message),
                ));
            }
            Err(e) => {
                server.mark_broken();
                if tries < SERVER_TRIES {
                    client_event!(
                        info,
                        c.reg.handle,
                        server = server.id(),
                        "server died before the transaction began, taking another: {e}"
                    );
                    continue;
                }
                return Err(ClientError::fatal("08006", e.to_string()));
            }
        }
        let lane = c.pool.stats.lane(crate::workers::current());
        PoolStats::add(&lane.wait_time_us, waited_us);
        lane.wait_hist.record(waited_us);
        PoolStats::add(&lane.server_assignment_count, 1);
        return Ok(server);
    }
}

/// Most a waiting client may send ahead before we stop reading it.
const WAIT_READ_LIMIT: usize = 256 * 1024;

/// Get a server for the client, telling it when it has to wait (query_wait_notify), and
/// how long it waited (µs; 0 without a wait, and no clock read).
async fn checkout(
    c: &mut Client,
    cfg: &config::Config,
    kill: &ClientHandle,
    sub: Option<&Arc<Pool>>,
) -> Result<(PooledServer, u64), ClientError> {
    // (A block pgcarpool began is a transaction in progress: it may finish.)
    if c.shared.transactions_stopped() && c.begun.is_none() {
        return Err(shutting_down());
    }
    let want = (c.reg.handle.id, c.session.params.version());
    let now = match sub {
        Some(p) => p.checkout_now(Some(want)),
        None => c.pool.checkout_now(Some(want)),
    };
    if let Some(s) = now {
        return Ok((s, 0));
    }
    // Waiting: boxed, so that a transaction that finds an idle server does not carry the
    // room for it.
    let start = Instant::now();
    let pool = sub.unwrap_or(&c.pool).clone();
    let s = Box::pin(wait_for_server(c, cfg, kill, start, pool)).await?;
    // (The transaction's start, as `clock::recent` gives it.)
    let waited = crate::stats::clock::now().saturating_duration_since(start);
    Ok((s, waited.as_micros() as u64))
}

/// When a client waiting for a server gives up, and what it is told: query_timeout
/// counts the wait too (as PgBouncer's), query_wait_timeout only the wait; the earlier
/// one wins.
pub(crate) fn wait_deadline(
    start: Instant,
    query_wait_timeout: std::time::Duration,
    query_timeout: std::time::Duration,
) -> (Option<Instant>, &'static str) {
    match (
        config::enabled(query_timeout),
        config::enabled(query_wait_timeout),
    ) {
        (Some(q), Some(w)) if q < w => (Some(start + q), "query_timeout"),
        (Some(q), None) => (Some(start + q), "query_timeout"),
        (_, w) => (w.map(|w| start + w), "query_wait_timeout"),
    }
}

/// SHUTDOWN WAIT_FOR_SERVERS: no new transactions (PgBouncer's words).
fn shutting_down() -> ClientError {
    ClientError::fatal("08P01", "server shutting down".into())
}

/// Wait in line for a server, with one timer for both query_wait_notify and
/// query_wait_timeout (resolved per database and user with the pool's settings).
async fn wait_for_server(
    c: &mut Client,
    cfg: &config::Config,
    kill: &ClientHandle,
    start: Instant,
    pool: Arc<Pool>,
) -> Result<PooledServer, ClientError> {
    let (deadline, timeout_text) = wait_deadline(
        start,
        pool.settings().query_wait_timeout,
        cfg.query_timeout_for(&c.reg.handle.user),
    );
    let mut notify_at = config::enabled(cfg.settings.query_wait_notify).map(|d| start + d);
    let draining = c.shared.stop_transactions().clone();
    let mut draining = std::pin::pin!(draining.cancelled_owned());
    let mut fut = std::pin::pin!(pool.checkout(None));
    let next = |notify_at: Option<Instant>| [notify_at, deadline].into_iter().flatten().min();
    let timer = tokio::time::sleep_until(next(notify_at).unwrap_or(start).into());
    tokio::pin!(timer);
    loop {
        tokio::select! {
            _ = draining.as_mut(), if c.begun.is_none() => return Err(shutting_down()),
            r = &mut fut => {
                return r.map_err(|e| match e {
                    CheckoutError::WaitTimeout => ClientError::fatal("08P01", timeout_text.into()),
                    // The server's own refusal (its SQLSTATE and words), as PgBouncer passes it on.
                    CheckoutError::Server(crate::server::ServerError::Rejected(f)) => {
                        ClientError::Fatal { code: super::static_code(&f.code), message: f.message }
                    }
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
            _ = &mut timer, if next(notify_at).is_some() => {
                let now = Instant::now();
                if deadline.is_some_and(|d| now >= d) {
                    return Err(ClientError::fatal("08P01", timeout_text.into()));
                }
                if notify_at.is_some_and(|t| now >= t) {
                    notify_at = None;
                    c.conn.queue_with(|b| backend::error_fields(b, backend::NOTICE_RESPONSE, "NOTICE", "00000",
                        "No server connection available in postgres backend, client being queued"));
                    let _ = c.conn.flush().await;
                }
                if let Some(t) = next(notify_at) {
                    timer.as_mut().reset(t.into());
                }
            }
            // Not inside a transaction block while it waits: its notifications are its now.
            _ = super::notify::woken(c.listening.inbox()) => super::notify::deliver(c)?,
            _ = kill.killed() => return Err(killed(c)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shortcut never passes a text `notify::parse` finds a statement in, and takes
    /// the common SELECTs.
    #[test]
    fn selects_no_channels_leaves_notify_its_texts() {
        let texts: [&[u8]; 12] = [
            b"SELECT abalance FROM pgbench_accounts WHERE aid = 1;",
            b"select 1",
            b"select _x from t",
            b"SELECT pg_listening_channels()",
            b"select  PG_CATALOG.pg_listening_channels();",
            b"select * from pg_listening_channels()",
            b"select/**/pg_listening_channels()",
            b"select\n-- c\npg_listening_channels()",
            b"select \"x\" from t",
            b"selectx 1",
            b"select",
            b"SELECT\tpg_listening_channels ( )",
        ];
        for t in texts {
            if selects_no_channels(t) {
                assert!(
                    super::super::notify::parse(t).is_none(),
                    "{}",
                    String::from_utf8_lossy(t)
                );
            }
        }
        for t in &texts[..3] {
            assert!(selects_no_channels(t), "{}", String::from_utf8_lossy(t));
        }
        for t in &texts[3..8] {
            assert!(
                super::super::notify::parse(t).is_some(),
                "{}",
                String::from_utf8_lossy(t)
            );
        }
    }
}
