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

use crate::client::Client;
use crate::config::{PoolMode, Settings};
use crate::net::fdpass;
use crate::net::listen::{Bound, SocketFile};
use crate::net::{Conn, Stream};
use crate::server::{Credential, Params};
use crate::shared::Shared;
use crate::shared::restart::Outgoing;
use session::{MovedSession, StayingClient, Transport};

/// Serve a logged-in client (or one that moved in from the process this one took over
/// from) until it leaves, or moves on to the process that takes over from this one.
/// Boxed: the client (its session, socket, registration) is one allocation and not part
/// of the task's future (an async fn's argument would be kept twice, rust-lang/rust#62958).
pub async fn serve(mut client: Box<Client>) {
    let result = loop {
        match crate::client::serve_here(&mut client).await {
            Some(result) => break result,
            // Boxed, as `finish` below: what a client does once in its life is not room
            // that every idle client's task keeps.
            None => match Box::pin(hand_over(&mut client)).await {
                Ok(()) => {
                    tracing::debug!(
                        client = client.reg.handle.id,
                        "handed over to the new process"
                    );
                    return;
                }
                Err(why) => client.stay(why),
            },
        }
    };
    Box::pin(crate::client::finish(*client, result)).await;
}
