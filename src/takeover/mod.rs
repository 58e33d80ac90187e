//! Online restart without SO_REUSEPORT, as PgBouncer's `-R`, and sessions that move.
//!
//! The new process (`-R`) logs in to the running one's console over its Unix socket as user
//! `pgbouncer` (same OS user: no password), sends `SUSPEND` (the old one stops accepting
//! and stops reading idle clients), then `SHOW FDS`: the rows name the listening sockets
//! and the descriptors come with them (SCM_RIGHTS). It starts on those sockets, then sends
//! `HANDOVER`: the old process closes its copies of the listeners (without accepting what
//! is queued: that is the new one's now), resumes its clients, and from then on sends every
//! client that is idle between transactions down the same connection: one frame per
//! client, `M` + length + the serialized session (`session.rs`), the client's socket
//! attached; the new process answers `Y` (it runs the client now) or `N` (the client stays).
//! Clients in a transaction move when it ends; pinned clients (temp tables, LISTEN…),
//! session-mode clients and clients the new process refused stay until they leave. The old
//! process exits once no client of its own is left.
mod incoming;
mod outgoing;
pub mod session;

pub use incoming::{Predecessor, console_for_clients, take_listeners};
pub use outgoing::{hand_over, serve_handover};

use std::collections::VecDeque;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Buf, Bytes};
use tokio::sync::{mpsc, oneshot};

use crate::client::transaction::Exit;
use crate::client::{Client, ClientError};
use crate::config::{PoolMode, Settings};
use crate::net::fdpass;
use crate::net::listen::{Bound, SocketFile};
use crate::net::{Conn, Stream};
use crate::server::{Credential, Params};
use crate::shared::Shared;
use crate::shared::registry::client_event;
use crate::shared::restart::Outgoing;
use session::{MovedSession, StayingClient, Transport};

/// Serve a logged-in client (or one that moved in from the process this one took over
/// from) until it leaves, or moves on to the process that takes over from this one or to
/// another worker. False: it moved to another worker, whose task gives its place back.
/// Boxed: the client (its session, socket, registration) is one allocation and not part
/// of the task's future (an async fn's argument would be kept twice, rust-lang/rust#62958).
pub async fn serve(mut client: Box<Client>) -> bool {
    let result = loop {
        // The transaction loop itself, not a wrapper: this is every idle client's task.
        match crate::client::transaction::run(&mut client).await {
            Ok(Exit::Left) => break Ok(()),
            Err(e) => break Err(e),
            Ok(Exit::Move(to)) => {
                move_to(client, to);
                return false;
            }
            // Boxed, as `finish` below: what a client does once in its life is not room
            // that every idle client's task keeps.
            Ok(Exit::Handover) => match Box::pin(hand_over(&mut client)).await {
                Ok(()) => {
                    client_event!(debug, client.reg.handle, "handed over to the new process");
                    return true;
                }
                Err(why) => client.stay(why),
            },
        }
    };
    Box::pin(crate::client::finish(*client, result)).await;
    true
}

/// Go on serving `client` on worker `to`, its socket registered there; the task there
/// gives its place back when it ends.
fn move_to(client: Box<Client>, to: usize) {
    let shared = client.shared.clone();
    let Some(ws) = shared.workers() else { return };
    let s2 = shared.clone();
    let run = async move {
        let mut client = client;
        if let Err(e) = client.conn.stream.rehome() {
            tracing::warn!("could not move a client to worker {to}: {e}");
            let lost = ClientError::fatal("08006", format!("could not move to a worker: {e}"));
            Box::pin(crate::client::finish(*client, Err(lost))).await;
        } else if !Box::pin(serve_boxed(client)).await {
            return;
        }
        s2.client_closed(to);
    };
    drop(ws.handle(to).spawn(shared.tracker().track_future(run)));
}

/// `serve`, boxed and `Send`: a moved client's task on its new worker.
fn serve_boxed(client: Box<Client>) -> std::pin::Pin<Box<dyn Future<Output = bool> + Send>> {
    Box::pin(serve(client))
}
