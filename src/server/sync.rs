//! Making a server fit a client: apply the client's session parameters at checkout; bring a
//! server back to a clean idle state at checkin (rollback, reset query).
use std::time::Duration;

use super::query::{COLUMNS_PER_SELECT, drain, queue_copy_fail, set_config_sql, simple_query};
use super::{Params, Server, ServerError};
use crate::proto::backend::ErrorFields;
use crate::proto::frontend;

/// Parameters a client can never set (reported by the server for information).
/// `session_authorization` is not one: a superuser can change it, and it follows the client
/// like any setting.
pub fn is_read_only(name: &str) -> bool {
    const RO: [&str; 6] = [
        "server_version",
        "server_encoding",
        "is_superuser",
        "integer_datetimes",
        "in_hot_standby",
        "scram_iterations",
    ];
    RO.iter().any(|r| r.eq_ignore_ascii_case(name))
}

/// A setting of the transaction, not of the session: `SET TRANSACTION` and `BEGIN …` give
/// it the source `session` until the transaction ends, so a read-back inside a block sees
/// it, but it is never a session's to keep, and PostgreSQL 16 and newer refuse to RESET
/// it (GUC_NO_RESET: "parameter … cannot be reset").
pub fn is_transaction_scoped(name: &str) -> bool {
    const TX: [&str; 3] = [
        "transaction_isolation",
        "transaction_read_only",
        "transaction_deferrable",
    ];
    TX.iter().any(|t| t.eq_ignore_ascii_case(name))
}

/// A setting the server's own config may change under a session, and that says what the
/// server is (a primary being demoted turns it on): a value the server reports for it is
/// not taken as the client's unless the client's own statement set it (read back then).
pub fn is_server_role(name: &str) -> bool {
    name.eq_ignore_ascii_case("default_transaction_read_only")
}

/// Whether `apply` has anything to do (checked without allocating, on every checkout).
/// A server found to need nothing for these very lists (their versions) is not compared
/// again: a client's transaction costs the same however many settings its session holds.
pub fn differs(server: &mut Server, wanted: &Params) -> bool {
    if server.fitted_to(wanted) {
        return false;
    }
    let differs = compare(server, wanted);
    if !differs {
        server.mark_fitted(wanted);
    }
    differs
}

fn compare(server: &Server, wanted: &Params) -> bool {
    if same_in_order(&server.params, &server.login_params, wanted) {
        return false;
    }
    wanted
        .iter()
        .any(|(k, v)| server.params.get(k) != Some(v) && !is_read_only(k))
        || server.params.iter().any(|(k, v)| {
            wanted.get(k).is_none() && !is_read_only(k) && server.login_params.get(k) != Some(v)
        })
}

/// The usual case, proven in one pass without case folding: `wanted` is `server` in the
/// same order, less read-only entries (then `differs` is false; a false here proves nothing).
fn same_in_order(server: &Params, login: &Params, wanted: &Params) -> bool {
    // A server-role setting is not in sessions: skipped while it is what login said.
    let skip = |k: &str, v: &str| is_read_only(k) || (is_server_role(k) && login.get(k) == Some(v));
    let mut s = server.iter();
    'wanted: for (k, v) in wanted.iter() {
        for (sk, sv) in s.by_ref() {
            if sk == k {
                if sv == v {
                    continue 'wanted;
                }
                return false;
            }
            if !skip(sk, sv) {
                return false;
            }
        }
        return false;
    }
    s.all(|(sk, sv)| skip(sk, sv))
}

/// Make `server`'s session parameters equal `wanted` with one batched query, and put back
/// to their login values the ones `wanted` does not mention. Nothing to do → no round trip.
/// Returns the server's error if a value was rejected.
pub async fn apply(
    server: &mut Server,
    wanted: &Params,
) -> Result<Option<ErrorFields>, ServerError> {
    let mut changes: Vec<(&str, &str)> = Vec::new();
    for (k, v) in wanted.iter() {
        if server.params.get(k) != Some(v) && !is_read_only(k) {
            changes.push((k, v));
        }
    }
    // Settings the client does not have: back to the login value, or RESET when that is unknown.
    let mut back: Vec<(String, String)> = Vec::new();
    let mut reset: Vec<String> = Vec::new();
    for (k, v) in server.params.iter() {
        if wanted.get(k).is_none()
            && is_server_role(k)
            && server.login_params.get(k).is_some_and(|login| login != v)
        {
            // Set by another client, or by the server's config since login: RESET gives
            // the server's config value (as the client's own session would have), never
            // the value of login time over a server's newer one.
            reset.push(k.to_string());
            continue;
        }
        if wanted.get(k).is_none() && !is_read_only(k) && !is_server_role(k) {
            match server.login_params.get(k) {
                Some(login) if login != v => back.push((k.to_string(), login.to_string())),
                Some(_) => {}
                None => reset.push(k.to_string()),
            }
        }
    }
    if changes.is_empty() && back.is_empty() && reset.is_empty() {
        server.mark_fitted(wanted);
        return Ok(None);
    }
    // SET SESSION AUTHORIZATION decides which roles may be set: it goes first, role last.
    let mut sets: Vec<(&str, &str)> = changes
        .iter()
        .copied()
        .chain(back.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .collect();
    sets.sort_by_key(|(k, _)| {
        if k.eq_ignore_ascii_case("session_authorization") {
            0
        } else if k.eq_ignore_ascii_case("role") {
            2
        } else {
            1
        }
    });
    let sets = sets.into_iter();
    let mut sql = if changes.is_empty() && back.is_empty() {
        String::new()
    } else {
        set_config_sql(sets)
    };
    for name in &reset {
        if !sql.is_empty() {
            sql.push_str("; ");
        }
        sql.push_str("RESET ");
        for (i, part) in name.split('.').enumerate() {
            if i > 0 {
                sql.push('.');
            }
            sql.push('"');
            sql.push_str(&part.replace('"', "\"\""));
            sql.push('"');
        }
    }
    let err = simple_query(server, &sql).await?;
    if err.is_none() {
        // Values the server does not report: remember what we set.
        for (k, v) in changes
            .iter()
            .copied()
            .chain(back.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        {
            server.params.set(k, v);
        }
        server.params.remove_all(&reset);
    }
    Ok(err)
}

/// What a transaction left on its server, read back in one round trip: the current values
/// of the named settings (None: no such setting any more), with `all_session` also of every
/// setting the session itself set (pg_settings.source = 'session'), and with `pins` why the
/// server cannot be shared now (`pin_reasons`).
pub async fn read_back(
    server: &mut Server,
    names: &[String],
    all_session: bool,
    pins: bool,
) -> Result<(Vec<(String, Option<String>)>, Option<Vec<&'static str>>), ServerError> {
    let mut sql = String::new();
    // One row per SELECT of at most COLUMNS_PER_SELECT columns, in order.
    for (i, n) in names.iter().enumerate() {
        if i % COLUMNS_PER_SELECT == 0 {
            if i > 0 {
                sql.push_str("; ");
            }
            sql.push_str("select ");
        } else {
            sql.push_str(", ");
        }
        sql.push_str("pg_catalog.current_setting(");
        super::query::literal(&mut sql, n);
        sql.push_str(", true)");
    }
    let statements_of_names = names.len().div_ceil(COLUMNS_PER_SELECT);
    let add = |sql: &mut String, stmt: &str| {
        if !sql.is_empty() {
            sql.push_str("; ");
        }
        sql.push_str(stmt);
    };
    if all_session {
        add(&mut sql, SESSION_SET_SQL);
    }
    if pins {
        add(&mut sql, PIN_SQL);
    }
    if sql.is_empty() {
        return Ok((Vec::new(), None));
    }
    let mut sets = super::query::query_sets(server, &sql).await?.into_iter();
    let mut out = Vec::new();
    let values = sets.by_ref().take(statements_of_names).flatten().flatten();
    out.extend(names.iter().cloned().zip(values));
    if all_session {
        for mut r in sets.next().unwrap_or_default() {
            if let (Some(v), Some(Some(n))) = (r.pop(), r.into_iter().next()) {
                out.push((n, v));
            }
        }
    }
    out.retain(|(name, _)| !is_transaction_scoped(name));
    let reasons = if pins {
        let counts = sets.next().unwrap_or_default();
        let statements = sets.next().unwrap_or_default();
        Some(pin_result(server, counts, statements).await?)
    } else {
        None
    };
    Ok((out, reasons))
}

/// Every setting the session itself set, with its value.
const SESSION_SET_SQL: &str = "select name, pg_catalog.current_setting(name) from pg_catalog.pg_settings where source = 'session'";

/// The reasons a client can be pinned to its server, in the order of `PoolStats::pins`.
/// "prepared statement": the client holds a server-side statement under a name of its own
/// (SQL PREPARE sent inside a Parse or a multi-statement query).
pub const PIN_REASONS: [&str; 5] = [
    "temp table",
    "advisory lock",
    "listen",
    "with hold cursor",
    "prepared statement",
];

/// Why a server's session cannot be shared (one count per reason), then the statements
/// under pgcarpool's internal names.
const PIN_SQL: &str = "select \
    (select count(*) from pg_catalog.pg_class where relpersistence = 't' and relnamespace = pg_catalog.pg_my_temp_schema()), \
    (select count(*) from pg_catalog.pg_locks where locktype = 'advisory' and pid = pg_catalog.pg_backend_pid()), \
    (select count(*) from pg_catalog.pg_listening_channels()), \
    (select count(*) from pg_catalog.pg_cursors where is_holdable), \
    (select count(*) from pg_catalog.pg_prepared_statements where name not like 'PGCARPOOL\\_%'); \
    select name, from_sql::text, case when from_sql then statement end \
    from pg_catalog.pg_prepared_statements where name like 'PGCARPOOL\\_%'";

/// The pin reasons from PIN_SQL's counts; also checks that the statements pgcarpool keeps on
/// the server under its internal names are the ones it prepared (code it cannot read, such
/// as a DO block, could have replaced or dropped them): the others are deallocated and
/// forgotten.
async fn pin_result(
    server: &mut Server,
    counts: Vec<Vec<Option<String>>>,
    statements: Vec<Vec<Option<String>>>,
) -> Result<Vec<&'static str>, ServerError> {
    let row = counts.into_iter().next().unwrap_or_default();
    let reasons = PIN_REASONS
        .iter()
        .zip(row)
        .filter(|(_, n)| n.as_deref().is_some_and(|n| n != "0"))
        .map(|(r, _)| *r)
        .collect();
    let mut seen = std::collections::HashSet::new();
    let mut foreign = Vec::new();
    for r in statements {
        let [Some(name), Some(from_sql), text] = <[Option<String>; 3]>::try_from(r)
            .map_err(|_| ServerError::Login("bad pg_prepared_statements row".into()))?
        else {
            continue;
        };
        let held = name
            .strip_prefix(crate::sql::classify::INTERNAL_PREFIX)
            .and_then(|id| id.parse::<u64>().ok())
            .filter(|id| server.exchange.prepared.holds(*id));
        // A held statement no client names any more cannot be checked, nor reached: it stays
        // until evicted. A live one must be what pgcarpool prepared.
        let ours = held.filter(|id| {
            server.exchange.prepared.get(*id).is_none_or(|s| {
                (from_sql == "true") == s.is_sql_prepared()
                    && (!s.is_sql_prepared() || text.as_deref() == Some(&s.sql_prepare_text()))
            })
        });
        match ours {
            Some(id) => {
                seen.insert(id);
            }
            None => foreign.push(name),
        }
    }
    for id in server.exchange.prepared.ids() {
        if !seen.contains(&id) {
            server.exchange.prepared.remove(id);
        }
    }
    if !foreign.is_empty() {
        tracing::warn!(
            server = server.id,
            count = foreign.len(),
            "statements under pgcarpool's internal names that pgcarpool did not prepare: deallocated"
        );
        let mut sql = String::new();
        for name in &foreign {
            sql.push_str("DEALLOCATE \"");
            sql.push_str(&name.replace('"', "\"\""));
            sql.push_str("\"; ");
        }
        if let Some(e) = simple_query(server, &sql).await? {
            return Err(ServerError::Rejected(e));
        }
    }
    Ok(reasons)
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
    server.exchange.prepared.clear();
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
    // Statements whose Parse outcome we did not see: the set is no longer known.
    let uncertain = server.exchange.forget_owed();
    if server.broken || server.exchange.partial() > 0 {
        return Err(ServerError::Login(
            "server left with a partly sent message".into(),
        ));
    }
    if server.exchange.copy_in() {
        // (If the client's CopyDone went already, the server ignores this.)
        queue_copy_fail(server);
        server.exchange.sent_copy_end();
    }
    if server.exchange.unsynced() {
        server.conn.queue_with(frontend::sync);
        server.exchange.note_sync();
    }
    if server.exchange.ready_owed() > 0 {
        // A query may be running: cancel it rather than wait for it.
        let _ = super::connect::send_cancel(&server.addr, server.key).await;
        server
            .conn
            .flush()
            .await
            .map_err(|e| ServerError::Conn(e.into()))?;
        drain(server).await?;
    }
    if server.exchange.unsynced() {
        // The COPY of an Execute failed after the Sync sent with it (which the server
        // ignored while copying in): it skips to another.
        server.conn.queue_with(frontend::sync);
        server.exchange.note_sync();
        server
            .conn
            .flush()
            .await
            .map_err(|e| ServerError::Conn(e.into()))?;
        drain(server).await?;
    }
    if server.exchange.tx_status() != b'I'
        && let Some(e) = simple_query(server, "ROLLBACK").await?
    {
        return Err(ServerError::Rejected(e));
    }
    if uncertain {
        if let Some(e) = simple_query(server, "DEALLOCATE ALL").await? {
            return Err(ServerError::Rejected(e));
        }
        server.exchange.prepared.clear();
    }
    if !server.is_clean() {
        return Err(ServerError::Login("server not idle after cleanup".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(items: &[(&str, &str)]) -> Params {
        let mut p = Params::default();
        for (k, v) in items {
            p.set(k, v);
        }
        p
    }

    #[test]
    fn same_in_order_proves_only_equal_lists() {
        let server = params(&[
            ("application_name", "a"),
            ("server_version", "15"),
            ("TimeZone", "UTC"),
            ("is_superuser", "on"),
        ]);
        let same = params(&[("application_name", "a"), ("TimeZone", "UTC")]);
        assert!(same_in_order(&server, &Params::default(), &same));
        // default_transaction_read_only is the server's: skipped while it is its login
        // value, not once it changed (another client's SET, a reload of the config).
        let login = params(&[("default_transaction_read_only", "off")]);
        let mut with_role = server.clone();
        with_role.set("default_transaction_read_only", "off");
        assert!(same_in_order(&with_role, &login, &same));
        with_role.set("default_transaction_read_only", "on");
        assert!(!same_in_order(&with_role, &login, &same));
        // A value differs, a setting is missing or extra, or another order: not proven.
        assert!(!same_in_order(
            &server,
            &Params::default(),
            &params(&[("application_name", "b"), ("TimeZone", "UTC")])
        ));
        assert!(!same_in_order(
            &server,
            &Params::default(),
            &params(&[("application_name", "a")])
        ));
        assert!(!same_in_order(
            &server,
            &Params::default(),
            &params(&[
                ("application_name", "a"),
                ("TimeZone", "UTC"),
                ("search_path", "x")
            ])
        ));
        assert!(!same_in_order(
            &server,
            &Params::default(),
            &params(&[("TimeZone", "UTC"), ("application_name", "a")])
        ));
    }
}
