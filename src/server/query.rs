//! Running pgcarpool's own queries on a server (outside any client's relay): everything
//! the server answers is consumed here, never forwarded.
use std::fmt::Write as _;

use super::{Server, ServerError};
use crate::proto::backend::{self, ErrorFields};
use crate::proto::frontend;

/// Longest message accepted in answer to our own queries (rows are discarded whole).
const OWN_QUERY_MESSAGE_LIMIT: usize = crate::proto::MAX_MESSAGE_LEN;

/// Run `sql` as a simple query and read until ReadyForQuery. Returns the first error the
/// server reported, if any (the server is still usable then).
pub async fn simple_query(
    server: &mut Server,
    sql: &str,
) -> Result<Option<ErrorFields>, ServerError> {
    send(server, sql).await?;
    read_replies(server, Rows::Drop, OWN_QUERY_MESSAGE_LIMIT).await
}

/// Run `sql` (one or more statements) and collect each statement's rows as text, one set
/// per statement in order. An error is returned as `ServerError::Rejected`.
pub async fn query_sets(
    server: &mut Server,
    sql: &str,
) -> Result<Vec<Vec<Vec<Option<String>>>>, ServerError> {
    send(server, sql).await?;
    let mut sets = vec![Vec::new()];
    match read_replies(server, Rows::Sets(&mut sets), OWN_QUERY_MESSAGE_LIMIT).await? {
        Some(e) => Err(ServerError::Rejected(e)),
        None => {
            sets.pop();
            Ok(sets)
        }
    }
}

/// Run `sql` with text parameters (`$1`…; None: NULL) over the extended protocol and return
/// its first row (later rows are read and dropped). An error is returned as
/// `ServerError::Rejected`; a message longer than `limit` bytes leaves the server broken.
/// Nothing of any client's session is applied first (the auth_query runs this way).
pub async fn first_row(
    server: &mut Server,
    sql: &str,
    params: &[Option<&str>],
    limit: usize,
) -> Result<Option<Vec<Option<String>>>, ServerError> {
    server
        .conn
        .queue_with(|b| frontend::extended_query(b, sql, params));
    // Our Parse replaces the server's unnamed statement.
    server.exchange.unnamed = 0;
    server.exchange.owe_ready(false);
    let sent = server.conn.flush().await;
    if let Err(e) = sent {
        server.broken = true;
        return Err(ServerError::Conn(e.into()));
    }
    let mut first = None;
    match read_replies(server, Rows::First(&mut first), limit).await {
        Ok(None) => Ok(first),
        Ok(Some(e)) => Err(ServerError::Rejected(e)),
        Err(e) => {
            server.broken = true;
            Err(e)
        }
    }
}

async fn send(server: &mut Server, sql: &str) -> Result<(), ServerError> {
    server.conn.queue_with(|b| frontend::query(b, sql));
    // A simple query drops the server's unnamed statement.
    server.exchange.unnamed = 0;
    server.exchange.owe_ready(true);
    server
        .conn
        .flush()
        .await
        .map_err(|e| ServerError::Conn(e.into()))
}

/// Read server messages until every ReadyForQuery owed has arrived, keeping the server's
/// state current. Returns the first error seen.
pub async fn drain(server: &mut Server) -> Result<Option<ErrorFields>, ServerError> {
    read_replies(server, Rows::Drop, OWN_QUERY_MESSAGE_LIMIT).await
}

/// Where the rows of pgcarpool's own queries go.
enum Rows<'a> {
    Drop,
    /// One set per statement: each CommandComplete starts a new set.
    Sets(&'a mut Vec<Vec<Vec<Option<String>>>>),
    /// The first row only.
    First(&'a mut Option<Vec<Option<String>>>),
}

/// The one reader of replies to pgcarpool's own queries: rows go where `rows` says, a
/// FATAL error ends it, other errors are returned after ReadyForQuery.
async fn read_replies(
    server: &mut Server,
    mut rows: Rows<'_>,
    limit: usize,
) -> Result<Option<ErrorFields>, ServerError> {
    let mut first_error = None;
    while server.exchange.ready_owed() > 0 {
        let h = server.conn.read_message(limit).await?;
        let body = &server.conn.rbuf[5..h.total];
        // The server's state follows (Syncs it ignored while copying in are no longer
        // owed, parameters it reports are set).
        server.exchange.receive(h.tag, body, false)?;
        if h.tag == backend::PARAMETER_STATUS {
            let (k, v) = backend::parse_parameter_status(body)?;
            server.params.set(k, v);
        }
        match h.tag {
            backend::DATA_ROW => match &mut rows {
                Rows::Sets(sets) => {
                    if let Some(set) = sets.last_mut() {
                        set.push(parse_data_row(body)?);
                    }
                }
                Rows::First(first) if first.is_none() => **first = Some(parse_data_row(body)?),
                _ => {}
            },
            backend::COMMAND_COMPLETE => {
                if let Rows::Sets(sets) = &mut rows {
                    sets.push(Vec::new());
                }
            }
            backend::ERROR_RESPONSE => {
                let e = backend::parse_error(body)?;
                if e.severity == "FATAL" || e.severity == "PANIC" {
                    server.broken = true;
                    return Err(ServerError::Rejected(e));
                }
                first_error.get_or_insert(e);
            }
            backend::NOTIFICATION_RESPONSE => {
                // The client's (it is LISTENing on this server): kept for it.
                if server.notifications.len() + h.total <= super::MAX_HELD_NOTIFICATIONS {
                    let msg = &server.conn.rbuf[..h.total];
                    server.notifications.extend_from_slice(msg);
                } else {
                    tracing::warn!(server = server.id, "notification dropped: too many held");
                }
            }
            backend::COPY_IN_RESPONSE => {
                // Our own queries never copy in; refuse so the server gets back to idle.
                server
                    .conn
                    .queue_with(|b| copy_fail(b, "pgcarpool: client gone"));
                server
                    .conn
                    .flush()
                    .await
                    .map_err(|e| ServerError::Conn(e.into()))?;
                server.exchange.sent_copy_end();
            }
            _ => {}
        }
        server.conn.consume(h.total);
    }
    Ok(first_error)
}

fn parse_data_row(body: &[u8]) -> Result<Vec<Option<String>>, crate::proto::ProtoError> {
    let mut r = crate::proto::Reader::new(body, "DataRow");
    let n = r.i16()?;
    let mut row = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
    for _ in 0..n {
        let len = r.i32()?;
        match usize::try_from(len) {
            Err(_) => row.push(None),
            Ok(len) => row.push(Some(String::from_utf8_lossy(r.bytes(len)?).into_owned())),
        }
    }
    Ok(row)
}

fn copy_fail(out: &mut bytes::BytesMut, msg: &str) {
    use bytes::BufMut;
    out.put_u8(frontend::COPY_FAIL);
    out.put_i32((4 + msg.len() + 1) as i32);
    out.put_slice(msg.as_bytes());
    out.put_u8(0);
}

/// Queue a CopyFail (used to end a client's COPY FROM STDIN when it goes away).
pub fn queue_copy_fail(server: &mut Server) {
    server
        .conn
        .queue_with(|b| copy_fail(b, "pgcarpool: client gone"));
}

/// Quote a string as an SQL literal (standard_conforming_strings on; E'' when backslashes).
pub fn literal(out: &mut String, s: &str) {
    if s.contains('\\') {
        out.push_str(" E'");
        for c in s.chars() {
            match c {
                '\'' => out.push_str("''"),
                '\\' => out.push_str("\\\\"),
                c => out.push(c),
            }
        }
    } else {
        out.push('\'');
        for c in s.chars() {
            if c == '\'' {
                out.push('\'');
            }
            out.push(c);
        }
    }
    out.push('\'');
}

/// Most columns in one of pgcarpool's own SELECTs (PostgreSQL allows 1,664): longer lists
/// are split into several statements of one query.
pub const COLUMNS_PER_SELECT: usize = 1000;

/// `select pg_catalog.set_config('a', 'x', false), …` for a batch of settings (of any
/// size: one SELECT per `COLUMNS_PER_SELECT`).
pub fn set_config_sql<'a>(items: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let mut sql = String::from("select ");
    for (i, (k, v)) in items.enumerate() {
        if i > 0 && i % COLUMNS_PER_SELECT == 0 {
            sql.push_str("; select ");
        } else if i > 0 {
            sql.push_str(", ");
        }
        sql.push_str("pg_catalog.set_config(");
        literal(&mut sql, k);
        sql.push_str(", ");
        literal(&mut sql, v);
        let _ = write!(sql, ", false)");
    }
    sql
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_are_quoted() {
        let mut s = String::new();
        literal(&mut s, "it's");
        assert_eq!(s, "'it''s'");
        let mut s = String::new();
        literal(&mut s, "a\\b");
        assert_eq!(s, " E'a\\\\b'");
    }

    #[test]
    fn set_config_batch() {
        let sql = set_config_sql([("TimeZone", "UTC"), ("search_path", "a, b")].into_iter());
        assert_eq!(
            sql,
            "select pg_catalog.set_config('TimeZone', 'UTC', false), pg_catalog.set_config('search_path', 'a, b', false)"
        );
        let many: Vec<(String, String)> =
            (0..2500).map(|n| (format!("a.x{n}"), "v".into())).collect();
        let sql = set_config_sql(many.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        assert_eq!(sql.matches("select ").count(), 3);
        assert_eq!(sql.matches("set_config(").count(), 2500);
    }
}
