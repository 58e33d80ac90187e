//! auth_query: the secret of a user missing from auth_file, asked of PostgreSQL (PgBouncer's
//! `auth_user`, `auth_query`, `auth_dbname`, global or per database).
//!
//! The query runs as the auth user (its password from auth_file) over a pooled server of
//! the pool (auth database, auth user), which shows in SHOW POOLS like any pool. The auth
//! database is the database's `auth_dbname`, else the global one, else the client's
//! database. What it finds is kept for `auth_query_cache_ttl` (`auth::dynamic`). The
//! client sees PgBouncer's words when it goes wrong: `no such user`, `bouncer config
//! error` (the details go to the log), `authentication database "x" is disabled`.
use std::sync::Arc;
use std::time::Instant;

use super::ClientError;
use crate::auth::dynamic::Found;
use crate::config::auth_file::MAX_SECRET;
use crate::config::{Config, Secret};
use crate::server::{Credential, ServerError, query};
use crate::shared::Shared;

/// Longest message accepted in the answer to an auth_query (a row holds a name and a secret).
const AUTH_QUERY_MESSAGE_LIMIT: usize = 64 * 1024;

/// What auth_query said about a user.
#[derive(Debug)]
pub enum Lookup {
    /// No auth_user applies to this database (or the database is unknown): not asked.
    NotAsked,
    /// The user exists, with this secret (None: the query returned NULL; nothing matches).
    Found(Found),
}

fn config_error() -> ClientError {
    ClientError::fatal("08P01", "bouncer config error".into())
}

/// Look `user` up for a login to database `db` (the console's name included).
pub async fn lookup(
    shared: &Arc<Shared>,
    cfg: &Config,
    db: &str,
    user: &str,
) -> Result<Lookup, ClientError> {
    let Some(asker) = Asker::for_login(cfg, db, user)? else {
        return Ok(Lookup::NotAsked);
    };
    if shared.admin().is_disabled(&asker.dbname) {
        return Err(ClientError::fatal(
            "08P01",
            format!("authentication database \"{}\" is disabled", asker.dbname),
        ));
    }
    let ttl = cfg.settings.auth_query_cache_ttl;
    if let Some(found) = shared.dynamic_users().get(db, user, ttl, Instant::now()) {
        return Ok(Lookup::Found(found));
    }
    let row = asker.ask(shared, cfg, db, user).await?;
    let found = found_secret(&row, user).map_err(|why| {
        tracing::error!(%user, %db, "auth_query: {why}");
        config_error()
    })?;
    shared
        .dynamic_users()
        .insert(db, user, found.clone(), ttl, Instant::now());
    Ok(Lookup::Found(found))
}

/// Who asks auth_query about a login, where, and with what query: the database entry's
/// `auth_user`, `auth_dbname` and `auth_query`, else the global ones.
struct Asker {
    /// The auth user.
    user: String,
    /// The auth database, and its entry.
    dbname: String,
    entry: crate::config::DatabaseEntry,
    /// The query, `$1` the user looked up.
    sql: String,
}

impl Asker {
    /// None when no auth_user applies to a login to `db` (or `db` is unknown); an error
    /// when the auth database is the console's or is not configured.
    fn for_login(cfg: &Config, db: &str, user: &str) -> Result<Option<Asker>, ClientError> {
        // The console has no [databases] entry: the global settings apply to it.
        let entry = if crate::config::names::is_admin_db(db) {
            None
        } else {
            match cfg.database(db) {
                Some(e) => Some(e),
                // PgBouncer does not ask for a database it does not know.
                None => return Ok(None),
            }
        };
        let s = &cfg.settings;
        let Some(auth_user) = entry
            .as_ref()
            .and_then(|e| e.auth_user.as_deref())
            .or(s.auth_user.as_deref())
        else {
            return Ok(None);
        };
        let auth_dbname = entry
            .as_ref()
            .and_then(|e| e.auth_dbname.as_deref())
            .or(s.auth_dbname.as_deref())
            .unwrap_or(db);
        if crate::config::names::is_admin_db(auth_dbname) {
            tracing::error!(
                %user, %db,
                "cannot use the reserved \"{auth_dbname}\" database as an auth_dbname"
            );
            return Err(config_error());
        }
        let Some(auth_entry) = cfg.database(auth_dbname) else {
            tracing::error!(%user, %db, "authentication database \"{auth_dbname}\" is not configured.");
            return Err(config_error());
        };
        let sql = entry
            .as_ref()
            .and_then(|e| e.auth_query.as_deref())
            .unwrap_or(&s.auth_query);
        Ok(Some(Asker {
            user: auth_user.to_string(),
            dbname: auth_dbname.to_string(),
            entry: auth_entry,
            sql: sql.to_string(),
        }))
    }

    /// Run the query for `user` on a server of the auth user's pool in the auth database:
    /// its one row, or the error the client sees (`no such user` when there is no row).
    async fn ask(
        &self,
        shared: &Arc<Shared>,
        cfg: &Config,
        db: &str,
        user: &str,
    ) -> Result<Vec<Option<String>>, ClientError> {
        let (auth_user, auth_dbname) = (self.user.as_str(), self.dbname.as_str());
        // Its password is auth_file's (or the entry's own when the entry forces that very user).
        let pool = shared.pools().get_or_create(auth_dbname, auth_user, || {
            let cred = if self.entry.user.as_deref() == Some(auth_user) {
                super::credential_for(cfg, &self.entry, auth_user, None)
            } else {
                match cfg.auth.users.get(auth_user) {
                    Some(Secret::Plain(p)) => Credential::Plain(p.clone()),
                    Some(Secret::Md5(h)) => Credential::Md5Hash(h.clone()),
                    _ => Credential::None,
                }
            };
            crate::shared::pool_settings(cfg, &self.entry, auth_user, cred, shared)
        });
        if shared.admin().is_paused(auth_dbname) && !pool.counts().paused {
            pool.pause();
        }
        let deadline =
            crate::config::enabled(pool.settings().query_wait_timeout).map(|d| Instant::now() + d);
        let mut server = pool.checkout(deadline).await.map_err(|e| match e {
            crate::pool::CheckoutError::Server(se) => {
                tracing::warn!(%user, %db, "auth_query: no server for {auth_user} in {auth_dbname}: {se}");
                let (code, msg) = se.client_error();
                ClientError::fatal(super::static_code(&code), msg)
            }
            other => ClientError::fatal("08P01", other.to_string()),
        })?;
        let row = query::first_row(
            &mut server,
            &self.sql,
            &[Some(user)],
            AUTH_QUERY_MESSAGE_LIMIT,
        )
        .await;
        drop(server);
        match row {
            Ok(Some(row)) => Ok(row),
            Ok(None) => {
                tracing::info!(%db, "no such user: {user}");
                Err(ClientError::fatal("08P01", "no such user".into()))
            }
            Err(ServerError::Rejected(e)) => {
                tracing::error!(%user, %db, "error in auth_query: {} {}: {}", e.severity, e.code, e.message);
                Err(config_error())
            }
            Err(e) => {
                tracing::error!(%user, %db, "auth_query failed: {e}");
                Err(config_error())
            }
        }
    }
}

/// The secret in an auth_query row `(name, secret)`: None for a NULL, empty, too long or
/// malformed secret (nothing matches it); an error for a row of another shape.
fn found_secret(row: &[Option<String>], user: &str) -> Result<Found, String> {
    let [name, secret] = row else {
        return Err(format!(
            "expected 2 columns from auth_query, not {}",
            row.len()
        ));
    };
    if name.is_none() {
        return Err("auth_query response contained null user name".into());
    }
    Ok(match secret.as_deref() {
        None | Some("") => None,
        Some(s) if s.len() > MAX_SECRET => {
            tracing::warn!(%user, "auth_query returned a secret longer than {MAX_SECRET} bytes");
            None
        }
        Some(s) => match Secret::parse(s) {
            Ok(secret) => Some(secret),
            Err(why) => {
                tracing::warn!(%user, "auth_query returned an unusable secret: {why}");
                None
            }
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(cells: &[Option<&str>]) -> Vec<Option<String>> {
        cells.iter().map(|c| c.map(str::to_string)).collect()
    }

    #[test]
    fn a_row_gives_the_secret_in_its_second_column() {
        let md5 = "md5ab8b744ff66bee42dc47bae34ca17959";
        assert_eq!(
            found_secret(&row(&[Some("u"), Some(md5)]), "u"),
            Ok(Some(Secret::parse(md5).unwrap()))
        );
        assert_eq!(
            found_secret(&row(&[Some("u"), Some("plain")]), "u"),
            Ok(Some(Secret::Plain("plain".into())))
        );
        let scram = "SCRAM-SHA-256$1:AA==$RukL0Xo3Ql/2F9FsD7mcQ3GATG2fD3PA71qY1JagGDs=:BhKUwyyivFm7Tq2jDJVXSVRbRDgTWyBilZKgg6DDuYU=";
        assert!(matches!(
            found_secret(&row(&[Some("u"), Some(scram)]), "u"),
            Ok(Some(Secret::Scram(v))) if v.iterations == 1 && v.salt == [0]
        ));
    }

    #[test]
    fn null_empty_long_or_malformed_secrets_match_nothing() {
        assert_eq!(found_secret(&row(&[Some("u"), None]), "u"), Ok(None));
        assert_eq!(found_secret(&row(&[Some("u"), Some("")]), "u"), Ok(None));
        let long = "x".repeat(MAX_SECRET + 1);
        assert_eq!(found_secret(&row(&[Some("u"), Some(&long)]), "u"), Ok(None));
        assert_eq!(
            found_secret(&row(&[Some("u"), Some("SCRAM-SHA-256$x")]), "u"),
            Ok(None)
        );
    }

    #[test]
    fn other_shapes_are_config_errors_in_pgbouncers_words() {
        assert_eq!(
            found_secret(&row(&[Some("1")]), "u"),
            Err("expected 2 columns from auth_query, not 1".into())
        );
        assert_eq!(
            found_secret(&row(&[Some("u"), Some("p"), None]), "u"),
            Err("expected 2 columns from auth_query, not 3".into())
        );
        assert_eq!(
            found_secret(&row(&[None, Some("p")]), "u"),
            Err("auth_query response contained null user name".into())
        );
    }
}
