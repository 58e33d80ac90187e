//! Replication connections (`replication=true|database`: pg_basebackup, pg_receivewal,
//! pg_recvlogical, logical replication subscribers), as PgBouncer 1.23+ passes them: after
//! pgcarpool's own authentication, a server connection of their own is logged in with the
//! client's startup parameters (replication included) and the two sockets are joined
//! byte for byte until either side closes. Nothing of it is pooled or parsed: the
//! replication protocol (CopyBoth, WAL streams) goes through untouched.
use tokio::io::AsyncWriteExt;

use crate::net::Conn;
use crate::proto::backend;
use crate::server::Server;

/// Welcome the client with the server's parameters and key, then join the two sockets.
pub async fn run(client: &mut Conn, mut server: Box<Server>) -> std::io::Result<()> {
    client.queue_with(|b| {
        backend::authentication_ok(b);
        for (k, v) in server.login_params().iter() {
            backend::parameter_status(b, k, v);
        }
        // The server's own key: a cancel request reaches PostgreSQL's walsender through
        // pgcarpool only if it is sent to the server (replication clients rarely cancel).
        backend::backend_key_data(b, server.key().0, server.key().1);
        backend::ready_for_query(b, b'I');
    });
    client.flush().await?;
    // What either side sent beyond what was read so far goes first.
    if !client.rbuf.is_empty() {
        let early = client.rbuf.split();
        server.conn_mut().stream.write_all(&early).await?;
    }
    if !server.conn().rbuf.is_empty() {
        let early = server.conn_mut().rbuf.split();
        client.stream.write_all(&early).await?;
    }
    let (up, down) =
        tokio::io::copy_bidirectional(&mut client.stream, &mut server.conn_mut().stream).await?;
    tracing::debug!(
        server = server.id(),
        "replication connection closed ({up} bytes up, {down} down)"
    );
    Ok(())
}
