//! Making a server fit a client: apply the client's session parameters at checkout; bring a
//! server back to a clean idle state at checkin (rollback, reset query).
use std::time::Duration;

use super::query::{drain, queue_copy_fail, set_config_sql, simple_query};
use super::{Params, Server, ServerError};
use crate::proto::backend::ErrorFields;
use crate::proto::frontend;

/// Parameters a client can never set (reported by the server for information).
pub fn is_read_only(name: &str) -> bool {
    const RO: [&str; 7] = [
        "server_version",
        "server_encoding",
        "is_superuser",
        "session_authorization",
        "integer_datetimes",
        "in_hot_standby",
        "scram_iterations",
    ];
    RO.iter().any(|r| r.eq_ignore_ascii_case(name))
}

/// Make `server`'s session parameters equal `wanted` with one batched query, and put back
/// to their login values the ones `wanted` does not mention. Nothing to do → no round trip.
/// Returns the server's error if a value was rejected.
pub async fn apply(server: &mut Server, wanted: &Params) -> Result<Option<ErrorFields>, ServerError> {
    let mut changes: Vec<(&str, &str)> = Vec::new();
    for (k, v) in wanted.iter() {
        if server.params.get(k) != Some(v) && !is_read_only(k) {
            changes.push((k, v));
        }
    }
    let mut back: Vec<(String, String)> = Vec::new();
    for (k, v) in server.params.iter() {
        if wanted.get(k).is_none() && !is_read_only(k) {
            let login = server.login_params.get(k).unwrap_or("");
            if login != v {
                back.push((k.to_string(), login.to_string()));
            }
        }
    }
    if changes.is_empty() && back.is_empty() {
        return Ok(None);
    }
    let sql = set_config_sql(changes.iter().copied().chain(back.iter().map(|(k, v)| (k.as_str(), v.as_str()))));
    let err = simple_query(server, &sql).await?;
    if err.is_none() {
        // Values the server does not report: remember what we set.
        for (k, v) in changes.iter().copied().chain(back.iter().map(|(k, v)| (k.as_str(), v.as_str()))) {
            server.params.set(k, v);
        }
    }
    Ok(err)
}

/// Run the reset query (e.g. DISCARD ALL); afterwards the server's parameters are its login ones.
pub async fn reset(server: &mut Server, reset_query: &str) -> Result<(), ServerError> {
    if reset_query.trim().is_empty() {
        return Ok(());
    }
    if let Some(e) = simple_query(server, reset_query).await? {
        return Err(ServerError::Rejected(e));
    }
    server.params = server.login_params.clone();
    Ok(())
}

/// Bring a server a client left in the middle of something back to idle: finish or cancel
/// what runs, roll back an open transaction. Errors (or `limit` passing) mean: close it.
pub async fn cleanup(server: &mut Server, limit: Duration) -> Result<(), ServerError> {
    match tokio::time::timeout(limit, cleanup_inner(server)).await {
        Ok(r) => r,
        Err(_) => Err(ServerError::Timeout),
    }
}

async fn cleanup_inner(server: &mut Server) -> Result<(), ServerError> {
    if server.broken || server.proto.partial > 0 {
        return Err(ServerError::Login("server left with a partly sent message".into()));
    }
    if server.proto.copy_in {
        queue_copy_fail(server);
        server.proto.copy_in = false;
    }
    if server.proto.unsynced {
        server.conn.queue_with(frontend::sync);
        server.proto.unsynced = false;
        server.proto.expected_rfq += 1;
    }
    if server.proto.expected_rfq > 0 {
        // A query may be running: cancel it rather than wait for it.
        let _ = super::connect::send_cancel(&server.addr, server.key).await;
        server.conn.flush().await.map_err(|e| ServerError::Conn(e.into()))?;
        drain(server).await?;
    }
    if server.proto.tx_status != b'I'
        && let Some(e) = simple_query(server, "ROLLBACK").await?
    {
        return Err(ServerError::Rejected(e));
    }
    if server.proto.tx_status != b'I' || !server.conn.rbuf.is_empty() {
        return Err(ServerError::Login("server not idle after cleanup".into()));
    }
    Ok(())
}
