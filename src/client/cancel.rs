//! CancelRequest: forwarded only to the server running that client's query.
use std::sync::Arc;

use super::registry::Registry;
use crate::server::connect::send_cancel;

/// Handle a CancelRequest carrying a client's key. Unknown keys and idle clients: ignored.
pub async fn handle(registry: &Arc<Registry>, key: (i32, i32)) {
    let Some(client) = registry.find(key) else {
        tracing::debug!("cancel request with unknown key ignored");
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
