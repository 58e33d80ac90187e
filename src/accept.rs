//! The accept policy: each accepted connection becomes a task on this worker or a less
//! busy one, a pool client's (`takeover::serve`) or a console session's (`admin::serve`); max_client_conn (the oldest login makes room, or a short second look,
//! then refusal); SUSPEND and the online restart's handover stop accepting; a listener
//! that stops takes what is queued on it first (closing it would reset those connections).
use std::sync::Arc;

use socket2::SockRef;

use crate::client::Arrival;
use crate::net::listen::Listener;
use crate::net::{Conn, Stream};
use crate::proto::backend;
use crate::shared::Shared;
use crate::shared::restart::Phase;

/// Accept clients until `stop_accepting`, then those already queued; each gets its own task.
pub async fn accept_loop(l: Listener, shared: Arc<Shared>) {
    // A Unix socket stays open through a waiting shutdown (for the console) and closes
    // when everything stops; TCP listeners close as soon as a shutdown begins.
    let stop = match &l {
        Listener::Tcp(_) => shared.stop_accepting().clone(),
        Listener::Unix(..) => shared.stop_clients().clone(),
    };
    // Online restart: SUSPEND stops accepting, HANDOVER gives the socket away.
    let mut phase = shared.restart().subscribe();
    loop {
        let now = *phase.borrow_and_update();
        if now == Phase::HandingOver {
            shared.restart().keep_sockets(Vec::new());
            if shared.restart().sockets_passed() {
                return l.hand_over();
            }
            return drain(l, &shared);
        }
        let accepted = tokio::select! {
            biased;
            _ = phase.changed() => continue,
            _ = stop.cancelled() => {
                // The descriptors kept for SHOW FDS go too: the socket must close (new
                // connections refused), not linger with nobody accepting.
                shared.restart().keep_sockets(Vec::new());
                if shared.restart().phase() == Phase::HandingOver && shared.restart().sockets_passed() {
                    return l.hand_over();
                }
                return drain(l, &shared);
            }
            r = l.accept(), if now == Phase::Running => r,
        };
        let stream = match accepted {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        serve(stream, &shared);
    }
}

/// Take the connections already queued on a listener that stops, and close it: closing it
/// with connections queued would reset them (a client of a pooler shutting down with
/// SIGTERM would see "connection reset" instead of being served).
fn drain(l: Listener, shared: &Arc<Shared>) {
    let mut drained = 0usize;
    loop {
        match l.try_accept() {
            Ok(Some(stream)) => {
                serve(stream, shared);
                drained += 1;
            }
            Ok(None) => break,
            Err(e) => {
                tracing::warn!("accept while closing the listener failed: {e}");
                break;
            }
        }
    }
    if drained > 0 {
        tracing::info!("accepted {drained} queued connection(s) while closing the listener");
    }
}

/// Start serving one accepted connection (or refuse it past max_client_conn).
fn serve(stream: Stream, shared: &Arc<Shared>) {
    let cfg = shared.config();
    if let Stream::Tcp(t) = &stream {
        // The buffer sizes came from the listening socket (set before the handshake).
        crate::net::sockopt::TcpTuning::from_settings(&cfg.settings)
            .without_buffers()
            .apply_or_warn(SockRef::from(t));
    }
    let max = cfg.settings.max_client_conn;
    if max > 0 && shared.client_conns() >= max {
        // Full. Logged-in clients keep their place; the oldest connection still logging in
        // makes room when such connections hold more than their share, or when it has
        // been at it for seconds (so sockets that never log in cannot lock real users
        // out). Its task ends soon: the count may pass max for that moment.
        if !shared
            .pending_logins()
            .drop_oldest(std::time::Instant::now(), max)
        {
            shared
                .tracker()
                .spawn(refuse_unless_room(stream, shared.clone(), max));
            return;
        }
        tracing::debug!("max_client_conn reached: dropped the oldest connection still logging in");
    }
    admit(stream, shared);
}

/// How often, and how far apart, a connection that found the pooler full looks again
/// before it is refused.
const FULL_RECHECKS: u32 = 5;
const FULL_RECHECK: std::time::Duration = std::time::Duration::from_millis(10);

/// The pooler was full when `stream` came. A client that is leaving may not have given its
/// place back yet (it runs on another worker, or its Terminate is read after this accept):
/// look again a few times for a moment, then refuse as PgBouncer does.
async fn refuse_unless_room(stream: Stream, shared: Arc<Shared>, max: usize) {
    for _ in 0..FULL_RECHECKS {
        tokio::time::sleep(FULL_RECHECK).await;
        if shared.client_conns() < max {
            admit(stream, &shared);
            return;
        }
    }
    tracing::warn!(addr = %stream.peer(), "no more connections allowed (max_client_conn)");
    refuse(stream, "no more connections allowed (max_client_conn)").await;
}

/// Serve an accepted connection there is room for, on this worker or a less busy one.
fn admit(stream: Stream, shared: &Arc<Shared>) {
    let id = shared.client_opened();
    let me = crate::workers::current();
    let s2 = shared.clone();
    let Some((ws, w)) = shared
        .workers()
        .map(|ws| (ws, ws.place(me)))
        .filter(|&(_, w)| w != me)
    else {
        shared.tracker().spawn(client_task(s2, stream, id));
        return;
    };
    // Hand the connection to a less busy worker: a first task there registers the socket
    // with that worker's reactor and spawns the client's own task (which then does not
    // carry the hand-off's state for its whole life).
    match stream.detach() {
        Ok(d) => drop(
            ws.handle(w)
                .spawn(shared.tracker().track_future(async move {
                    match d.attach() {
                        Ok(stream) => {
                            let task = client_task(s2.clone(), stream, id);
                            s2.tracker().spawn(task);
                        }
                        Err(e) => {
                            tracing::warn!("could not take a connection on worker {w}: {e}");
                            s2.client_closed(w);
                        }
                    }
                })),
        ),
        Err(e) => {
            tracing::warn!("could not hand a connection to worker {w}: {e}");
            shared.client_closed(w);
        }
    }
}

/// One client's task on this worker, from its first byte to its last. Not an `async fn`:
/// its future keeps the boxed login and what it needs at the end, not room for the
/// arguments too (every idle client's task is this future; a task stays on the worker
/// it was spawned on, which it gives its place back to).
fn client_task(
    shared: Arc<Shared>,
    stream: Stream,
    id: u64,
) -> impl std::future::Future<Output = ()> {
    // Boxed: the login's state is gone once the client is in.
    let arriving = Box::pin(crate::client::arrive(shared.clone(), stream, id));
    async move {
        let ended_here = match arriving.await {
            // False: it moved to another worker, where it is counted now.
            Some(Arrival::Client(client)) => crate::takeover::serve(client).await,
            // Boxed: a console session's state is not part of every client's task.
            Some(Arrival::Console(console)) => {
                Box::pin(crate::admin::serve(*console)).await;
                true
            }
            None => true,
        };
        if ended_here {
            shared.client_closed(crate::workers::current());
        }
    }
}

async fn refuse(stream: Stream, why: &str) {
    let mut conn = Conn::new(stream);
    // Answer the startup packet with the error, after an SSL or GSS request if one comes
    // first (refused with 'N': an error there reads as a failed SSL exchange to libpq).
    let first = crate::client::startup::hello(&mut conn, None);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), first).await;
    conn.queue_with(|b| backend::error_response(b, "FATAL", "53300", why));
    conn.close().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An idle client's task is this future in a tokio task cell (a header and trailer of
    /// ~104 bytes, the whole 128-byte aligned): kept under 280 bytes, the cell is 384
    /// (it was 896 with the kill token's and the restart watch's futures in it).
    #[tokio::test]
    async fn an_idle_clients_task_fits_a_384_byte_cell() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = tokio::net::TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap();
        let cfg = crate::config::Config::from_str(
            "[databases]\n[pgbouncer]\nlisten_port = 0\n",
            "pgbouncer.ini",
            &std::env::temp_dir(),
        )
        .expect("config");
        let task = client_task(Shared::new(cfg), Stream::Tcp(c), 1);
        let size = std::mem::size_of_val(&task);
        assert!(size <= 272, "{size}");
    }
}
