//! CancelRequest: forwarded only to the server running that client's query, or to the
//! peer instance that owns the key.
use std::sync::Arc;

use crate::app::Shared;
use crate::peers::key;
use crate::server::connect::send_cancel;

/// Handle a CancelRequest carrying a client's key. Unknown keys and idle clients: ignored.
///
/// A key of one of our clients is served here whatever peer id it names (the id may have
/// changed on RELOAD, or two instances may share one). Otherwise, with peering on, a key
/// naming another peer goes to that peer with one hop of its TTL spent (none left: dropped).
pub async fn handle(shared: &Arc<Shared>, k: (i32, i32)) {
    let own = shared.peers.own_id();
    let client = shared.clients.find(k).or_else(|| {
        // Our keys are handed out with a full TTL; a forwarded one has spent some.
        (own > 0)
            .then(|| shared.clients.find(key::as_issued(k)))
            .flatten()
    });
    let Some(client) = client else {
        let target = key::peer_id(k);
        // Our own id: another DNS member may share it (a collision) and own the key.
        let twin = target == own && shared.peers.has_twins(own);
        if own == 0 || target == 0 || (target == own && !twin) {
            tracing::debug!("cancel request with unknown key ignored");
            return;
        }
        let Some(spent) = key::spend_hop(k) else {
            tracing::debug!("failed to forward cancel request because its TTL was exhausted");
            return;
        };
        let wait = shared.config.load().settings.cancel_wait_timeout;
        shared.peers.forward(target, spent, wait).await;
        return;
    };
    let Some((addr, server_key)) = client.cancel_target() else {
        tracing::debug!(
            client = client.id,
            "cancel request for an idle client ignored"
        );
        return;
    };
    if let Err(e) = send_cancel(&addr, server_key).await {
        tracing::warn!(
            client = client.id,
            "could not forward cancel request to {addr}: {e}"
        );
    }
}
