//! A client's first packets: TLS (SSLRequest or PostgreSQL 17's direct TLS; GSS refused),
//! CancelRequest, StartupMessage, then authentication against auth_file or what
//! auth_query finds.
use std::sync::Arc;

use bytes::BytesMut;
use sha2::Digest as _;

use super::ClientError;
use crate::auth::{md5, scram};
use crate::config::{AuthType, Secret};
use crate::net::conn::ConnError;
use crate::net::stream::TlsIn;
use crate::net::tls::{Accept, SslMode};
use crate::net::{Conn, Stream};
use crate::proto::{backend, frontend, startup};
use crate::server::Credential;
use crate::shared::Shared;

/// Longest auth message a client may send.
const AUTH_MESSAGE_LIMIT: usize = 8 * 1024;

/// What the first packets asked for.
pub enum Hello {
    /// A StartupMessage's parameters and the protocol minor version agreed (0 or 2).
    Startup(Vec<(String, String)>, u16),
    /// A CancelRequest's key and the rest of a long (protocol 3.2) secret.
    Cancel((i32, i32), Vec<u8>),
}

/// Read packets until a StartupMessage or a CancelRequest. With `tls` (client_tls_sslmode
/// not disable), TCP clients may start TLS; under require or stricter they must.
pub async fn hello(conn: &mut Conn, tls: Option<&Accept>) -> Result<Hello, ClientError> {
    // As PgBouncer: never TLS over a Unix socket.
    let tls = tls.filter(|_| matches!(conn.stream, Stream::Tcp(_)));
    if let Some(t) = tls
        && let Stream::Tcp(s) = &conn.stream
    {
        // PostgreSQL 17's direct TLS: a TLS handshake record (0x16) instead of a packet
        // length (which would be a startup packet hundreds of megabytes long).
        let mut first = [0u8; 1];
        if s.peek(&mut first).await? == 1 && first[0] == TLS_HANDSHAKE {
            accept_tls(conn, t, true).await?;
        }
    }
    loop {
        conn.fill(4).await?;
        let packet = loop {
            match startup::parse(&conn.rbuf)? {
                Some((p, n)) => {
                    conn.consume(n);
                    break p;
                }
                None => {
                    let need = conn.rbuf.len() + 1;
                    conn.fill(need).await?;
                }
            }
        };
        match packet {
            startup::StartupPacket::SslRequest if conn.stream.is_tls() => {
                return Err(ClientError::fatal("08P01", "SSL req inside SSL".into()));
            }
            startup::StartupPacket::SslRequest if tls.is_some() => {
                // Bytes after the request came before the handshake: unencrypted, and
                // perhaps injected (CVE-2021-23214).
                if !conn.rbuf.is_empty() {
                    return Err(ClientError::fatal(
                        "08P01",
                        "received unencrypted data after SSL request".into(),
                    ));
                }
                conn.queue(bytes::Bytes::from_static(b"S"));
                conn.flush().await?;
                accept_tls(conn, tls.expect("checked"), false).await?;
            }
            startup::StartupPacket::SslRequest | startup::StartupPacket::GssEncRequest => {
                conn.queue(bytes::Bytes::from_static(b"N"));
                conn.flush().await?;
            }
            startup::StartupPacket::Startup { .. }
                if tls.is_some_and(|t| t.mode >= SslMode::Require) && !conn.stream.is_tls() =>
            {
                // PgBouncer's words.
                return Err(ClientError::fatal("08P01", "SSL required".into()));
            }
            startup::StartupPacket::Cancel { pid, secret, rest } => {
                return Ok(Hello::Cancel((pid, secret), rest));
            }
            startup::StartupPacket::Startup { minor, params } => {
                let (minor, params) = negotiate(conn, minor, params);
                return Ok(Hello::Startup(params, minor));
            }
        }
    }
}

/// The protocol version a client gets, as PostgreSQL 18 decides it: the minor version it
/// asked for, at most 3.2 (3.1 is never sent by libpq and is served as 3.0 is). A newer
/// minor version or `_pq_.` protocol options (none is known here) get
/// NegotiateProtocolVersion naming the version agreed and the options; the options are
/// not parameters.
fn negotiate(
    conn: &mut Conn,
    minor: u16,
    params: Vec<(String, String)>,
) -> (u16, Vec<(String, String)>) {
    if minor <= startup::NEWEST_MINOR && !params.iter().any(|(k, _)| k.starts_with("_pq_.")) {
        let minor = if minor >= startup::NEWEST_MINOR {
            minor
        } else {
            0
        };
        return (minor, params);
    }
    let (options, params): (Vec<_>, Vec<_>) = params
        .into_iter()
        .partition(|(k, _)| k.starts_with("_pq_."));
    let agreed = minor.min(startup::NEWEST_MINOR);
    if minor > startup::NEWEST_MINOR || !options.is_empty() {
        let names: Vec<&str> = options.iter().map(|(k, _)| k.as_str()).collect();
        let version = startup::PROTOCOL_3_0 + i32::from(agreed);
        conn.queue_with(|b| backend::negotiate_protocol_version(b, version, &names));
    }
    let minor = if agreed >= startup::NEWEST_MINOR {
        agreed
    } else {
        0
    };
    (minor, params)
}

/// First byte of a TLS handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

/// The TLS handshake with a client, on the TCP socket of `conn`. `direct`: PostgreSQL 17's
/// direct TLS, which must negotiate ALPN `postgresql` (as PostgreSQL requires).
async fn accept_tls(conn: &mut Conn, tls: &Accept, direct: bool) -> Result<(), ClientError> {
    let Stream::Tcp(tcp) = std::mem::replace(&mut conn.stream, Stream::Gone) else {
        return Err(ClientError::fatal(
            "08P01",
            "TLS over a non-TCP socket".into(),
        ));
    };
    let stream = tls.acceptor.accept(tcp).await.map_err(|e| {
        tracing::debug!("TLS handshake with a client failed: {e}");
        ClientError::Conn(ConnError::Io(e))
    })?;
    let alpn_ok = stream.get_ref().1.alpn_protocol() == Some(crate::net::tls::ALPN_POSTGRESQL);
    conn.stream = Stream::TlsIn(Box::new(TlsIn {
        tls: stream,
        end_point: tls.end_point.clone(),
    }));
    if direct && !alpn_ok {
        // PostgreSQL's words.
        return Err(ClientError::fatal(
            "08P01",
            "received direct SSL connection request without ALPN protocol negotiation extension"
                .into(),
        ));
    }
    Ok(())
}

/// Authenticate `user` per `auth_type`. Its secret is auth_file's, else what auth_query
/// finds (when an auth_user applies to `db`). Returns what the pool can log in to the
/// server with, if this login taught us something (SCRAM keys from the client's proof; the
/// secret of a user auth_query found).
pub async fn authenticate(
    shared: &Arc<Shared>,
    conn: &mut Conn,
    cfg: &crate::config::Config,
    db: &str,
    user: &str,
    replication: bool,
) -> Result<Option<Credential>, ClientError> {
    // With auth_type = hba the first auth_hba_file rule this login meets picks the method.
    let (auth_type, map, peer) = match cfg.settings.auth_type {
        AuthType::Hba => match hba_method(cfg, conn, replication, db, user)? {
            HbaChoice::Type(t, map) => (t, map, false),
            HbaChoice::Peer(map) => (AuthType::Hba, map, true),
        },
        t => (t, None, false),
    };
    // auth_file first, as PgBouncer; `known`: the user exists (its secret may be NULL).
    let (known, secret, dynamic) = match cfg.auth.users.get(user) {
        Some(s) => (true, Some(s.clone()), false),
        None if auth_type == AuthType::Any => (false, None, false),
        None => match super::auth_query::lookup(shared, cfg, db, user).await? {
            super::auth_query::Lookup::NotAsked => (false, None, false),
            super::auth_query::Lookup::Found(s) => (true, s, true),
        },
    };
    let result = if peer {
        peer_login(conn, cfg, db, user, map, known).await
    } else {
        check(
            shared,
            conn,
            cfg,
            db,
            auth_type,
            map,
            user,
            known,
            secret.as_ref(),
        )
        .await
    };
    if result.is_err() && dynamic {
        // The password may have changed since: ask PostgreSQL again next time.
        shared.dynamic_users().forget(db, user);
    }
    result
}

/// What a server login can use from a secret as it is (md5 hash, plain password); a
/// SCRAM verifier gives nothing by itself.
fn secret_credential(secret: Option<&Secret>) -> Option<Credential> {
    match secret? {
        Secret::Plain(p) => Some(Credential::Plain(p.clone())),
        Secret::Md5(h) => Some(Credential::Md5Hash(h.clone())),
        Secret::Scram(_) => None,
    }
}

/// The exchange of `auth_type` (an hba rule's method, with its ident `map`) for a user
/// that is `known` or not, against its `secret`.
#[allow(clippy::too_many_arguments)]
async fn check(
    shared: &Arc<Shared>,
    conn: &mut Conn,
    cfg: &crate::config::Config,
    db: &str,
    auth_type: AuthType,
    map: Option<&str>,
    user: &str,
    known: bool,
    secret: Option<&Secret>,
) -> Result<Option<Credential>, ClientError> {
    // An unknown user (no secret) goes through the same exchange as a known one with a
    // wrong password, and fails only at its end: no user enumeration by reply or timing.
    match auth_type {
        // As PgBouncer: trust still wants the user in auth_file, or found by auth_query
        // ("any" does not).
        AuthType::Trust if !known => Err(ClientError::fatal(
            "28000",
            "\"trust\" authentication failed".into(),
        )),
        AuthType::Trust => Ok(secret_credential(secret)),
        AuthType::Any => Ok(None),
        AuthType::Plain => plain_login(shared, conn, user, secret).await,
        AuthType::Md5 => md5_login(shared, conn, user, secret).await,
        AuthType::ScramSha256 => scram_login(shared, conn, user, secret).await,
        AuthType::Cert => cert_login(conn, cfg, db, user, map, known),
        // Resolved to a rule's method by `authenticate`.
        AuthType::Hba => Err(ClientError::fatal(
            "28000",
            "no authentication method is found".into(),
        )),
    }
}

/// A password login that failed, in PostgreSQL's words.
fn password_failed(user: &str) -> ClientError {
    ClientError::fatal(
        "28P01",
        format!("password authentication failed for user \"{user}\""),
    )
}

/// The `plain` method: the password in clear, compared with the secret of whatever kind.
async fn plain_login(
    shared: &Arc<Shared>,
    conn: &mut Conn,
    user: &str,
    secret: Option<&Secret>,
) -> Result<Option<Credential>, ClientError> {
    let fail = || password_failed(user);
    conn.queue_with(backend::authentication_cleartext);
    conn.flush().await?;
    let pw = read_password(conn).await?;
    match secret {
        None => Err(fail()),
        Some(Secret::Plain(p)) => {
            if subtle::ConstantTimeEq::ct_eq(p.as_bytes(), pw.as_slice()).into() {
                Ok(secret_credential(secret))
            } else {
                Err(fail())
            }
        }
        Some(Secret::Md5(h)) => {
            let given = md5::password_hash(user, &String::from_utf8_lossy(&pw));
            if subtle::ConstantTimeEq::ct_eq(given.as_bytes(), h.as_bytes()).into() {
                Ok(secret_credential(secret))
            } else {
                Err(fail())
            }
        }
        Some(Secret::Scram(v)) => {
            // The keys of this verifier (PBKDF2 off the reactor, memoised): they
            // also log in to a server holding the same verifier.
            let pw = String::from_utf8_lossy(&pw);
            let (client_key, server_key) = shared
                .scram()
                .client_keys_async(&pw, &v.salt, v.iterations)
                .await;
            let stored_key: [u8; 32] = sha2::Sha256::digest(client_key).into();
            let ok: bool = subtle::ConstantTimeEq::ct_eq(&stored_key[..], &v.stored_key[..]).into();
            if ok && server_key == v.server_key {
                Ok(Some(Credential::ScramKeys {
                    client_key,
                    server_key,
                }))
            } else {
                Err(fail())
            }
        }
    }
}

/// The `md5` method against a plain password or an md5 hash; against a SCRAM verifier,
/// SCRAM (as PgBouncer: the md5 exchange cannot check one).
async fn md5_login(
    shared: &Arc<Shared>,
    conn: &mut Conn,
    user: &str,
    secret: Option<&Secret>,
) -> Result<Option<Credential>, ClientError> {
    let hash = match secret {
        Some(Secret::Plain(p)) => md5::password_hash(user, p),
        Some(Secret::Md5(h)) => h.clone(),
        Some(Secret::Scram(_)) => return scram_login(shared, conn, user, secret).await,
        // A hash of a random password: no response matches it.
        None => md5::password_hash(user, &format!("{:032x}", rand::random::<u128>())),
    };
    let salt: [u8; 4] = rand::random();
    conn.queue_with(|b| backend::authentication_md5(b, salt));
    conn.flush().await?;
    let pw = read_password(conn).await?;
    if md5::verify_response(&hash, salt, &pw) && secret.is_some() {
        Ok(secret_credential(secret))
    } else {
        Err(password_failed(user))
    }
}

/// SCRAM-SHA-256 (`scram-sha-256`, or `md5` with a SCRAM secret) against a plain
/// password or a SCRAM verifier.
async fn scram_login(
    shared: &Arc<Shared>,
    conn: &mut Conn,
    user: &str,
    secret: Option<&Secret>,
) -> Result<Option<Credential>, ClientError> {
    let verifier = match secret {
        Some(Secret::Plain(p)) => shared.scram().verifier_for_plain_async(user, p).await,
        Some(Secret::Scram(v)) => v.clone(),
        Some(Secret::Md5(_)) => return Err(password_failed(user)),
        None => shared.scram().dummy_verifier(user),
    };
    // A failed SCRAM exchange in PgBouncer's words.
    let sasl_fail = || ClientError::fatal("28P01", "SASL authentication failed".into());
    let learned = scram_exchange(conn, verifier, &sasl_fail).await?;
    if secret.is_none() {
        return Err(sasl_fail());
    }
    match secret {
        // The verifier was made here: the password itself logs in to the server.
        Some(Secret::Plain(_)) => Ok(secret_credential(secret)),
        _ => Ok(learned),
    }
}

/// The `peer` method: the OS user of the Unix socket is `user`, or mapped to it by `map`;
/// and `known` (as PgBouncer, a user it does not know cannot log in this way either).
async fn peer_login(
    conn: &Conn,
    cfg: &crate::config::Config,
    db: &str,
    user: &str,
    map: Option<&str>,
    known: bool,
) -> Result<Option<Credential>, ClientError> {
    let os_user = crate::auth::peer::os_user(&conn.stream).await;
    let checked = crate::auth::peer::allows(os_user.as_deref(), user, map, cfg.ident.as_deref());
    refuse_unless(conn, db, user, checked, known, "unix socket login rejected")
}

/// The `cert` method: the client certificate's name is `user`, or mapped to it by `map`;
/// and `known`.
fn cert_login(
    conn: &Conn,
    cfg: &crate::config::Config,
    db: &str,
    user: &str,
    map: Option<&str>,
    known: bool,
) -> Result<Option<Credential>, ClientError> {
    let checked = crate::auth::cert::allows(&conn.stream, user, map, cfg.ident.as_deref());
    refuse_unless(
        conn,
        db,
        user,
        checked,
        known,
        "certificate authentication failed",
    )
}

/// Logged in if `checked` passed for a `known` user; else the reason is logged and the
/// client told `message` (28000, PgBouncer's words), the same whatever the reason.
fn refuse_unless(
    conn: &Conn,
    db: &str,
    user: &str,
    checked: Result<(), String>,
    known: bool,
    message: &str,
) -> Result<Option<Credential>, ClientError> {
    match checked {
        Ok(()) if known => Ok(None),
        result => {
            let why = result
                .err()
                .unwrap_or_else(|| format!("no such user: {user}"));
            tracing::warn!(%db, %user, addr = %conn.stream.peer(), "{why}");
            Err(ClientError::fatal("28000", message.into()))
        }
    }
}

/// What an auth_hba_file rule asks of a login.
enum HbaChoice<'a> {
    /// Go on as this auth_type would (trust, md5, plain, scram-sha-256, cert), with the
    /// rule's ident map.
    Type(AuthType, Option<&'a str>),
    /// The `peer` check, with the rule's ident map.
    Peer(Option<&'a str>),
}

/// The method of the first auth_hba_file rule this login meets; `reject` and no rule at all
/// refuse it (PgBouncer's words, PostgreSQL's SQLSTATE).
fn hba_method<'a>(
    cfg: &'a crate::config::Config,
    conn: &Conn,
    replication: bool,
    db: &str,
    user: &str,
) -> Result<HbaChoice<'a>, ClientError> {
    use crate::config::hba::{Method, Origin};
    let origin = match conn.stream.peer_ip() {
        Some(addr) => Origin::Tcp {
            addr,
            tls: conn.stream.is_tls(),
        },
        None => Origin::Unix,
    };
    let rule = cfg
        .hba
        .as_deref()
        .and_then(|hba| hba.lookup(origin, replication, db, user));
    let Some(rule) = rule else {
        tracing::info!(%db, %user, addr = %conn.stream.peer(), "no auth_hba_file line matches");
        return Err(ClientError::fatal(
            "28000",
            "no authentication method is found".into(),
        ));
    };
    tracing::debug!(%db, %user, "auth_hba_file line {} is matched", rule.line);
    let map = rule.map.as_deref();
    Ok(match rule.method {
        Method::Trust => HbaChoice::Type(AuthType::Trust, map),
        Method::Md5 => HbaChoice::Type(AuthType::Md5, map),
        Method::Password => HbaChoice::Type(AuthType::Plain, map),
        Method::ScramSha256 => HbaChoice::Type(AuthType::ScramSha256, map),
        Method::Cert => HbaChoice::Type(AuthType::Cert, map),
        Method::Peer => HbaChoice::Peer(map),
        Method::Reject => {
            return Err(ClientError::fatal("28000", "login rejected".into()));
        }
    })
}

async fn scram_exchange(
    conn: &mut Conn,
    verifier: crate::config::auth_file::ScramVerifier,
    fail: &impl Fn() -> ClientError,
) -> Result<Option<Credential>, ClientError> {
    // Over TLS, SCRAM-SHA-256-PLUS is offered too (bound to our certificate).
    let mut server =
        scram::ScramServer::new(verifier).with_channel_binding(conn.stream.tls_end_point());
    let mechanisms = server.mechanisms();
    conn.queue_with(|b| backend::authentication_sasl(b, mechanisms));
    conn.flush().await?;
    let h = expect_password_message(conn).await?;
    let (mech, data) = frontend::parse_sasl_initial(&conn.rbuf[5..h.total])?;
    if server.select(mech).is_err() {
        return Err(ClientError::fatal(
            "28000",
            format!("unsupported SASL mechanism {mech}"),
        ));
    }
    let server_first = server.client_first(data).map_err(|_| fail())?;
    conn.consume(h.total);
    let mut out = BytesMut::new();
    backend::authentication_sasl_continue(&mut out, &server_first);
    conn.queue(out.freeze());
    conn.flush().await?;
    let h = expect_password_message(conn).await?;
    let server_final = server
        .client_final(&conn.rbuf[5..h.total])
        .map_err(|_| fail())?;
    conn.consume(h.total);
    conn.queue_with(|b| backend::authentication_sasl_final(b, &server_final));
    let cred = match server.client_credential() {
        Some(scram::ClientCredential::Keys {
            client_key,
            server_key,
        }) => Some(Credential::ScramKeys {
            client_key,
            server_key,
        }),
        _ => None,
    };
    Ok(cred)
}

async fn expect_password_message(conn: &mut Conn) -> Result<crate::proto::Header, ClientError> {
    let h = conn.read_message(AUTH_MESSAGE_LIMIT).await?;
    if h.tag != frontend::PASSWORD {
        return Err(ClientError::fatal(
            "08P01",
            "expected a password message".into(),
        ));
    }
    Ok(h)
}

async fn read_password(conn: &mut Conn) -> Result<Vec<u8>, ClientError> {
    let h = expect_password_message(conn).await?;
    let pw = frontend::parse_password(&conn.rbuf[5..h.total])?.to_vec();
    conn.consume(h.total);
    Ok(pw)
}
