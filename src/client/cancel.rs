//! CancelRequest: forwarded only to the server running that client's query, or to the
//! peer instance that owns the key.
use std::sync::Arc;

use crate::peers::key;
use crate::server::connect::send_cancel;
use crate::shared::Shared;
use crate::shared::registry::client_event;

/// Handle a CancelRequest carrying a client's key. Unknown keys and idle clients: ignored.
///
/// A key of one of our clients is served here whatever peer id it names (the id may have
/// changed on RELOAD, or two instances may share one). Otherwise, with peering on, a key
/// naming another peer goes to that peer with one hop of its TTL spent (none left: dropped).
/// `from` is the connection that carried the request (its id and address, for the log).
/// `rest`: the secret's bytes after `k`'s 4 (protocol 3.2), which must be the client's
/// (none for a client of protocol 3.0); a key that is not wholly a client's is unknown.
pub async fn handle(shared: &Arc<Shared>, (k, rest): ((i32, i32), &[u8]), from: (u64, &str)) {
    let own = shared.peers().own_id();
    let client = shared.clients().find(k).or_else(|| {
        // Our keys are handed out with a full TTL; a forwarded one has spent some.
        (own > 0)
            .then(|| shared.clients().find(key::as_issued(k)))
            .flatten()
    });
    if client.as_ref().is_some_and(|c| !c.is_key_rest(rest)) {
        tracing::debug!("cancel request with a wrong secret ignored");
        return;
    }
    let Some(client) = client else {
        let target = key::peer_id(k);
        // Our own id: another DNS member may share it (a collision) and own the key.
        let twin = target == own && shared.peers().has_twins(own);
        if own == 0 || target == 0 || (target == own && !twin) {
            tracing::debug!("cancel request with unknown key ignored");
            return;
        }
        let Some(spent) = key::spend_hop(k) else {
            tracing::debug!("failed to forward cancel request because its TTL was exhausted");
            return;
        };
        let wait = shared.config().settings.cancel_wait_timeout;
        shared.peers().forward(target, (spent, rest), wait).await;
        return;
    };
    let Some((addr, server_key)) = client.cancel_target() else {
        client_event!(debug, client, "cancel request for an idle client ignored");
        return;
    };
    let started = std::time::Instant::now();
    let send = send_cancel(&addr, server_key);
    let sent = match crate::config::enabled(shared.config().settings.cancel_wait_timeout) {
        Some(limit) => tokio::time::timeout(limit, send).await,
        None => Ok(send.await),
    };
    match sent {
        Ok(Ok(())) => {}
        Ok(Err(e)) => client_event!(
            warn,
            client,
            "could not forward cancel request to {addr}: {e}"
        ),
        // The server is unreachable: the cancel is given up and its connection closed
        // (PgBouncer's words), rather than kept until the network answers.
        Err(_) => {
            if crate::logging::disconnections() {
                let age = started.elapsed().as_secs();
                tracing::info!(client = from.0, addr = %from.1,
                    "closing because: cancel_wait_timeout (age={age}s)");
            }
            client_event!(
                warn,
                client,
                "cancel request to {addr} not sent within cancel_wait_timeout"
            );
        }
    }
}
