//! A client's first packets: TLS (SSLRequest or PostgreSQL 17's direct TLS; GSS refused),
//! CancelRequest, StartupMessage, then authentication against auth_file.
use std::sync::Arc;

use bytes::BytesMut;

use super::ClientError;
use crate::app::Shared;
use crate::auth::{md5, scram};
use crate::config::{AuthType, Secret};
use crate::net::conn::ConnError;
use crate::net::stream::TlsIn;
use crate::net::tls::{Accept, SslMode};
use crate::net::{Conn, Stream};
use crate::proto::{backend, frontend, startup};
use crate::server::Credential;

/// Longest auth message a client may send.
const AUTH_MESSAGE_LIMIT: usize = 8 * 1024;

/// What the first packets asked for.
pub enum Hello {
    Startup(Vec<(String, String)>),
    Cancel((i32, i32)),
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
            startup::StartupPacket::Cancel { pid, secret } => {
                return Ok(Hello::Cancel((pid, secret)));
            }
            startup::StartupPacket::Startup { minor, params } => {
                // As PostgreSQL (3.0 only): a newer minor version or `_pq_.` protocol
                // options get NegotiateProtocolVersion, and the options are not parameters.
                let (options, params): (Vec<_>, Vec<_>) = params
                    .into_iter()
                    .partition(|(k, _)| k.starts_with("_pq_."));
                if minor > 0 || !options.is_empty() {
                    let names: Vec<&str> = options.iter().map(|(k, _)| k.as_str()).collect();
                    conn.queue_with(|b| {
                        backend::negotiate_protocol_version(b, startup::PROTOCOL_3_0, &names)
                    });
                }
                return Ok(Hello::Startup(params));
            }
        }
    }
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

/// auth_type = cert: the client's certificate (verified against client_tls_ca_file in the
/// handshake) must be issued to `user`. PgBouncer's checks and words.
pub fn cert_login(conn: &Conn, user: &str) -> Result<(), ClientError> {
    let fail = || ClientError::fatal("28000", "certificate authentication failed".into());
    if !conn.stream.is_tls() {
        tracing::warn!(%user, "TLS connection required");
        return Err(fail());
    }
    let Some(cert) = conn.stream.tls_peer_cert() else {
        tracing::warn!(%user, "TLS client certificate required");
        return Err(fail());
    };
    tracing::debug!(%user, "TLS cert login: {}", crate::net::tls::cert_subject(cert));
    if !conn.stream.tls_peer_cert_contains_name(user) {
        tracing::warn!(%user, "TLS certificate name mismatch");
        return Err(fail());
    }
    Ok(())
}

/// Authenticate `user` per `auth_type`. Returns what the pool can log in to the server with,
/// if this login taught us something (SCRAM keys).
pub async fn authenticate(
    shared: &Arc<Shared>,
    conn: &mut Conn,
    cfg: &crate::config::Config,
    db: &str,
    user: &str,
) -> Result<Option<Credential>, ClientError> {
    let auth_type = cfg.settings.auth_type;
    let secret = cfg.auth.users.get(user);
    // An auth_user (global or the database's) means PgBouncer would ask auth_query.
    let auth_user_set =
        cfg.settings.auth_user.is_some() || cfg.database(db).is_some_and(|e| e.auth_user.is_some());
    let fail = || {
        ClientError::fatal(
            "28P01",
            format!("password authentication failed for user \"{user}\""),
        )
    };
    // An unknown user (no secret) goes through the same exchange as a known one with a
    // wrong password, and fails only at its end: no user enumeration by reply or timing.
    match auth_type {
        // As PgBouncer: trust still wants the user in auth_file ("any" does not). With an
        // auth_user set PgBouncer would ask auth_query instead, which pgcarpool does not do
        // yet: such users are let in, as before.
        AuthType::Trust if secret.is_none() && !auth_user_set => Err(ClientError::fatal(
            "28000",
            "\"trust\" authentication failed".into(),
        )),
        AuthType::Trust | AuthType::Any => Ok(None),
        AuthType::Plain => {
            conn.queue_with(backend::authentication_cleartext);
            conn.flush().await?;
            let pw = read_password(conn).await?;
            let ok = match secret {
                None => false,
                Some(Secret::Plain(p)) => {
                    subtle::ConstantTimeEq::ct_eq(p.as_bytes(), pw.as_slice()).into()
                }
                Some(Secret::Md5(h)) => {
                    let given = md5::password_hash(user, &String::from_utf8_lossy(&pw));
                    subtle::ConstantTimeEq::ct_eq(given.as_bytes(), h.as_bytes()).into()
                }
                Some(Secret::Scram(v)) => {
                    let given = scram::verifier_from_password(
                        &String::from_utf8_lossy(&pw),
                        &v.salt,
                        v.iterations,
                    );
                    subtle::ConstantTimeEq::ct_eq(&given.stored_key[..], &v.stored_key[..]).into()
                }
            };
            if ok { Ok(None) } else { Err(fail()) }
        }
        AuthType::Md5 if !matches!(secret, Some(Secret::Scram(_))) => {
            let hash = match secret {
                Some(Secret::Plain(p)) => md5::password_hash(user, p),
                Some(Secret::Md5(h)) => h.clone(),
                Some(Secret::Scram(_)) => unreachable!("checked above"),
                // A hash of a random password: no response matches it.
                None => md5::password_hash(user, &format!("{:032x}", rand::random::<u128>())),
            };
            let salt: [u8; 4] = rand::random();
            conn.queue_with(|b| backend::authentication_md5(b, salt));
            conn.flush().await?;
            let pw = read_password(conn).await?;
            if md5::verify_response(&hash, salt, &pw) && secret.is_some() {
                Ok(None)
            } else {
                Err(fail())
            }
        }
        AuthType::Md5 | AuthType::ScramSha256 => {
            let verifier = match secret {
                Some(Secret::Plain(p)) => shared.scram.verifier_for_plain_async(user, p).await,
                Some(Secret::Scram(v)) => v.clone(),
                Some(Secret::Md5(_)) => return Err(fail()),
                None => shared.scram.dummy_verifier(user),
            };
            // A failed SCRAM exchange in PgBouncer's words.
            let sasl_fail = || ClientError::fatal("28P01", "SASL authentication failed".into());
            let learned = scram_exchange(conn, verifier, &sasl_fail).await?;
            if secret.is_none() {
                return Err(sasl_fail());
            }
            Ok(learned)
        }
        AuthType::Cert => {
            cert_login(conn, user)?;
            // As PgBouncer: the user must be known too.
            if secret.is_none() && !auth_user_set {
                return Err(ClientError::fatal(
                    "28000",
                    "certificate authentication failed".into(),
                ));
            }
            Ok(None)
        }
        AuthType::Hba | AuthType::Pam => Err(ClientError::fatal(
            "08P01",
            "auth_type hba and pam are not supported yet by pgcarpool".into(),
        )),
    }
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
