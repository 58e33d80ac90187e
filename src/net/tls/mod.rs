//! TLS on both sides with rustls (ring): the `client_tls_*` settings become an acceptor,
//! the `server_tls_*` settings a connector; rebuilt on reload only when a setting or a file
//! they name changed. Also what SHOW and logs print of a session (PgBouncer's
//! `TLSv1.3/TLS_AES_256_GCM_SHA384/ECDH=X25519`), the `tls-server-end-point` channel
//! binding hash (RFC 5929) and the names of a peer certificate (auth_type = cert).
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::crypto::ring as provider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{CommonState, ProtocolVersion, RootCertStore, SupportedCipherSuite};
use sha2::Digest;

use crate::config::settings::Settings;

mod verify;
use verify::{ClientVerifier, OneCert, ServerVerifier, certified_key};

/// ALPN protocol of PostgreSQL's direct TLS (PostgreSQL 17, `sslnegotiation=direct`).
pub const ALPN_POSTGRESQL: &[u8] = b"postgresql";
/// CA bundle used to verify servers when `server_tls_ca_file` is not set (as OpenSSL's default).
const SYSTEM_CA_FILE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// `client_tls_sslmode` / `server_tls_sslmode`, in PgBouncer's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub fn parse(s: &str) -> SslMode {
        match s.trim().to_ascii_lowercase().as_str() {
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => SslMode::Disable,
        }
    }
}

/// TLS towards clients (pgcarpool is the TLS server).
pub struct Accept {
    pub mode: SslMode,
    pub acceptor: tokio_rustls::TlsAcceptor,
    /// `tls-server-end-point` data for our certificate (None: its signature hash is
    /// unknown, e.g. Ed25519; SCRAM-SHA-256-PLUS is then not offered).
    pub end_point: Option<Arc<[u8]>>,
}

/// TLS towards servers (pgcarpool is the TLS client).
pub struct Connect {
    pub mode: SslMode,
    pub connector: tokio_rustls::TlsConnector,
    /// Digest of every server_tls_* setting and the files they name: servers are
    /// reconnected when it changes.
    pub fingerprint: [u8; 32],
}

impl std::fmt::Debug for Connect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connect").field("mode", &self.mode).finish()
    }
}

/// The TLS configurations in force.
#[derive(Default)]
pub struct Tls {
    pub accept: Option<Arc<Accept>>,
    pub connect: Option<Arc<Connect>>,
    accept_fingerprint: Option<[u8; 32]>,
}

/// A TLS setting or file that cannot be used (the old configuration stays in force).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(pub String);

fn err(s: impl Into<String>) -> TlsError {
    TlsError(s.into())
}

fn get(s: &Settings, name: &str) -> String {
    s.other_value(name).unwrap_or_default()
}

/// Digest of the named settings and of the files named by the `*_file` ones.
fn fingerprint(s: &Settings, names: &[&str]) -> [u8; 32] {
    let mut h = sha2::Sha256::new();
    for n in names {
        let v = get(s, n);
        h.update(n.as_bytes());
        h.update([0]);
        h.update(v.as_bytes());
        h.update([0]);
        if n.ends_with("_file") && !v.is_empty() {
            h.update(std::fs::read(&v).unwrap_or_default());
        }
        h.update([0]);
    }
    h.finalize().into()
}

const CLIENT_SETTINGS: &[&str] = &[
    "client_tls_sslmode",
    "client_tls_key_file",
    "client_tls_cert_file",
    "client_tls_ca_file",
    "client_tls_protocols",
    "client_tls_ciphers",
    "client_tls13_ciphers",
    "client_tls_ecdhcurve",
    "client_tls_dheparams",
];
const SERVER_SETTINGS: &[&str] = &[
    "server_tls_sslmode",
    "server_tls_key_file",
    "server_tls_cert_file",
    "server_tls_ca_file",
    "server_tls_protocols",
    "server_tls_ciphers",
    "server_tls13_ciphers",
];

impl Tls {
    /// Build from the settings. `old`: the configurations in force; a side whose settings
    /// and files did not change is kept as it is (same connector: servers stay).
    pub fn build(s: &Settings, old: Option<&Tls>) -> Result<Tls, TlsError> {
        let client_mode = SslMode::parse(&get(s, "client_tls_sslmode"));
        if s.auth_type == crate::config::AuthType::Cert {
            // PgBouncer's checks and words.
            if client_mode != SslMode::VerifyFull {
                return Err(err(
                    "auth_type=cert requires client_tls_sslmode=SSLMODE_VERIFY_FULL",
                ));
            }
            if get(s, "client_tls_ca_file").is_empty() {
                return Err(err("auth_type=cert requires client_tls_ca_file"));
            }
        }
        let accept_fp = fingerprint(s, CLIENT_SETTINGS);
        let accept = match old {
            Some(o) if o.accept_fingerprint == Some(accept_fp) => o.accept.clone(),
            _ if client_mode == SslMode::Disable => None,
            _ => Some(Arc::new(build_accept(s, client_mode)?)),
        };
        let server_mode = SslMode::parse(&get(s, "server_tls_sslmode"));
        let connect_fp = fingerprint(s, SERVER_SETTINGS);
        let connect = match old.and_then(|o| o.connect.as_ref()) {
            Some(c) if c.fingerprint == connect_fp => Some(c.clone()),
            _ if server_mode == SslMode::Disable => None,
            _ => Some(Arc::new(build_connect(s, server_mode, connect_fp)?)),
        };
        Ok(Tls {
            accept,
            connect,
            accept_fingerprint: Some(accept_fp),
        })
    }
}

fn build_accept(s: &Settings, mode: SslMode) -> Result<Accept, TlsError> {
    let (key_file, cert_file, ca_file) = (
        get(s, "client_tls_key_file"),
        get(s, "client_tls_cert_file"),
        get(s, "client_tls_ca_file"),
    );
    if key_file.is_empty() || cert_file.is_empty() {
        return Err(err(
            "To allow TLS connections from clients, client_tls_key_file and client_tls_cert_file must be set.",
        ));
    }
    if mode > SslMode::VerifyCa && ca_file.is_empty() {
        return Err(err("client_tls_sslmode requires client_tls_ca_file"));
    }
    let provider = Arc::new(crypto_provider(s, "client_tls")?);
    let versions = protocol_versions(&get(s, "client_tls_protocols"), "client_tls")?;
    let key = certified_key(&provider, &cert_file, &key_file, "client_tls")?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| err(format!("invalid client_tls_protocols: {e}")))?;
    let verifier: Arc<dyn rustls::server::danger::ClientCertVerifier> = if ca_file.is_empty() {
        rustls::server::WebPkiClientVerifier::no_client_auth()
    } else {
        let roots = load_certs(&ca_file, "client_tls_ca_file")?;
        let store = Arc::new(load_roots(&ca_file, "client_tls_ca_file")?);
        let b =
            rustls::server::WebPkiClientVerifier::builder_with_provider(store, provider.clone());
        // allow/prefer/require: a certificate is not asked for (one given is checked).
        let b = if mode >= SslMode::VerifyCa {
            b
        } else {
            b.allow_unauthenticated()
        };
        let webpki = b
            .build()
            .map_err(|e| err(format!("invalid client_tls_ca_file: {ca_file}: {e}")))?;
        Arc::new(ClientVerifier {
            webpki,
            roots,
            algs: provider.signature_verification_algorithms,
        })
    };
    let end_point = key
        .cert
        .first()
        .and_then(|c| end_point_hash(c))
        .map(Arc::from);
    let mut config = builder
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(OneCert(key)));
    config.alpn_protocols = vec![ALPN_POSTGRESQL.to_vec()];
    match get(s, "client_tls_dheparams").to_ascii_lowercase().as_str() {
        "auto" | "none" | "" => {}
        other => tracing::warn!(
            "client_tls_dheparams = {other}: rustls has no finite-field DHE, ignored"
        ),
    }
    Ok(Accept {
        mode,
        acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        end_point,
    })
}

fn build_connect(s: &Settings, mode: SslMode, fingerprint: [u8; 32]) -> Result<Connect, TlsError> {
    let provider = Arc::new(crypto_provider(s, "server_tls")?);
    let versions = protocol_versions(&get(s, "server_tls_protocols"), "server_tls")?;
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| err(format!("invalid server_tls_protocols: {e}")))?;
    let ca_file = get(s, "server_tls_ca_file");
    let (webpki, roots) = if mode >= SslMode::VerifyCa {
        let path = if ca_file.is_empty() {
            SYSTEM_CA_FILE
        } else {
            &ca_file
        };
        let roots = load_certs(path, "server_tls_ca_file")?;
        let store = Arc::new(load_roots(path, "server_tls_ca_file")?);
        let webpki =
            rustls::client::WebPkiServerVerifier::builder_with_provider(store, provider.clone())
                .build()
                .map_err(|e| err(format!("invalid server_tls_ca_file: {ca_file}: {e}")))?;
        (Some(webpki), roots)
    } else {
        (None, Vec::new())
    };
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(ServerVerifier {
            mode,
            webpki,
            roots,
            algs: provider.signature_verification_algorithms,
        }));
    let (key_file, cert_file) = (
        get(s, "server_tls_key_file"),
        get(s, "server_tls_cert_file"),
    );
    let config = if !key_file.is_empty() && !cert_file.is_empty() {
        let key = certified_key(&provider, &cert_file, &key_file, "server_tls")?;
        builder.with_client_cert_resolver(Arc::new(OneCert(key)))
    } else {
        builder.with_no_client_auth()
    };
    Ok(Connect {
        mode,
        connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
        fingerprint,
    })
}

fn load_certs(path: &str, what: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| err(format!("invalid {what}: {path}: {e}")))?;
    if certs.is_empty() {
        return Err(err(format!("invalid {what}: {path}: no certificate")));
    }
    Ok(certs)
}

fn load_roots(path: &str, what: &str) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in load_certs(path, what)? {
        roots
            .add(c)
            .map_err(|e| err(format!("invalid {what}: {path}: {e}")))?;
    }
    Ok(roots)
}

/// `*_tls_protocols`: `all`, `secure`, `legacy`, `tlsv1.0`…`tlsv1.3` (comma or colon
/// separated). rustls speaks TLS 1.2 and 1.3 only: older versions are logged and left out.
fn protocol_versions(
    v: &str,
    pfx: &str,
) -> Result<Vec<&'static rustls::SupportedProtocolVersion>, TlsError> {
    let (mut v12, mut v13, mut old) = (false, false, false);
    for p in v
        .split([',', ':', ' '])
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        match p.to_ascii_lowercase().as_str() {
            "all" | "legacy" => (v12, v13, old) = (true, true, true),
            "secure" | "default" => (v12, v13) = (true, true),
            "tlsv1.0" | "tlsv1.1" | "tlsv1" => old = true,
            "tlsv1.2" => v12 = true,
            "tlsv1.3" => v13 = true,
            _ => return Err(err(format!("invalid {pfx}_protocols: {v}"))),
        }
    }
    if old && !v12 && !v13 {
        tracing::warn!("{pfx}_protocols = {v}: rustls does not speak TLS 1.0/1.1; TLS 1.2 is used");
        v12 = true;
    } else if old && !(v12 && v13) {
        tracing::info!("{pfx}_protocols = {v}: rustls does not speak TLS 1.0/1.1");
    }
    let mut out = Vec::new();
    if v13 || (!v12 && !old) {
        out.push(&rustls::version::TLS13);
    }
    if v12 || (!v13 && !old) {
        out.push(&rustls::version::TLS12);
    }
    Ok(out)
}

/// OpenSSL's names of the suites rustls (ring) has, TLS 1.3 ones by their IANA names.
fn openssl_name(s: SupportedCipherSuite) -> &'static str {
    use rustls::CipherSuite as C;
    match s.suite() {
        C::TLS13_AES_128_GCM_SHA256 => "TLS_AES_128_GCM_SHA256",
        C::TLS13_AES_256_GCM_SHA384 => "TLS_AES_256_GCM_SHA384",
        C::TLS13_CHACHA20_POLY1305_SHA256 => "TLS_CHACHA20_POLY1305_SHA256",
        C::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 => "ECDHE-ECDSA-AES128-GCM-SHA256",
        C::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384 => "ECDHE-ECDSA-AES256-GCM-SHA384",
        C::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256 => "ECDHE-ECDSA-CHACHA20-POLY1305",
        C::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => "ECDHE-RSA-AES128-GCM-SHA256",
        C::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 => "ECDHE-RSA-AES256-GCM-SHA384",
        C::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256 => "ECDHE-RSA-CHACHA20-POLY1305",
        _ => "-",
    }
}

/// The ring provider narrowed by `*_tls_ciphers`, `*_tls13_ciphers` and (clients)
/// `client_tls_ecdhcurve`.
fn crypto_provider(s: &Settings, pfx: &str) -> Result<CryptoProvider, TlsError> {
    let mut p = provider::default_provider();
    let (tls12, tls13): (Vec<_>, Vec<_>) = p
        .cipher_suites
        .iter()
        .copied()
        .partition(|c| c.version() == &rustls::version::TLS12);
    // TLS 1.2 and older: OpenSSL cipher strings. Names rustls has are honoured; keywords
    // (HIGH, !aNULL…) cannot be, and leave rustls's choice (all strong suites).
    let ciphers = get(s, &format!("{pfx}_ciphers"));
    let mut chosen12 = Vec::new();
    let mut keywords = Vec::new();
    for t in ciphers
        .split([':', ',', ' '])
        .map(str::trim)
        .filter(|t| !t.is_empty())
    {
        match tls12
            .iter()
            .find(|c| openssl_name(**c).eq_ignore_ascii_case(t))
        {
            Some(c) => chosen12.push(*c),
            None => keywords.push(t),
        }
    }
    let shortcut = |t: &str| {
        matches!(
            t.to_ascii_lowercase().as_str(),
            "default" | "secure" | "fast" | "normal" | "all"
        )
    };
    if chosen12.is_empty() {
        chosen12 = tls12.clone();
        if !keywords.iter().all(|t| shortcut(t)) {
            tracing::warn!(
                "{pfx}_ciphers = {ciphers}: rustls cannot honour OpenSSL cipher strings; its own strong suites are used"
            );
        }
    } else if !keywords.is_empty() {
        tracing::warn!(
            "{pfx}_ciphers: {} not known to rustls, ignored",
            keywords.join(":")
        );
    }
    // TLS 1.3: IANA names, PgBouncer's list; unknown names are an error (PgBouncer's words).
    let ciphers13 = get(s, &format!("{pfx}13_ciphers"));
    let chosen13 = if ciphers13.trim().is_empty() {
        tls13.clone()
    } else {
        let mut out = Vec::new();
        for t in ciphers13
            .split([':', ',', ' '])
            .map(str::trim)
            .filter(|t| !t.is_empty())
        {
            match tls13.iter().find(|c| openssl_name(**c) == t) {
                Some(c) => out.push(*c),
                None if matches!(t, "TLS_AES_128_CCM_8_SHA256" | "TLS_AES_128_CCM_SHA256") => {
                    tracing::warn!("{pfx}13_ciphers: rustls has no {t}, ignored");
                }
                None => {
                    return Err(err(format!(
                        "failed to set the TLSv1.3 cipher suites: {pfx}13_ciphers = {ciphers13}"
                    )));
                }
            }
        }
        if out.is_empty() {
            return Err(err(format!(
                "failed to set the TLSv1.3 cipher suites: {pfx}13_ciphers = {ciphers13}"
            )));
        }
        out
    };
    p.cipher_suites = chosen13.into_iter().chain(chosen12).collect();
    if pfx == "client_tls" {
        let curve = get(s, "client_tls_ecdhcurve");
        let mut groups = Vec::new();
        for t in curve
            .split([':', ','])
            .map(str::trim)
            .filter(|t| !t.is_empty())
        {
            match t.to_ascii_lowercase().as_str() {
                "auto" | "none" => {}
                "prime256v1" | "secp256r1" | "p-256" => groups.push(provider::kx_group::SECP256R1),
                "secp384r1" | "p-384" => groups.push(provider::kx_group::SECP384R1),
                "x25519" => groups.push(provider::kx_group::X25519),
                other => {
                    tracing::warn!("client_tls_ecdhcurve: rustls has no curve {other}, ignored")
                }
            }
        }
        if !groups.is_empty() {
            p.kx_groups = groups;
        }
    }
    Ok(p)
}

/// The server name to check a server's certificate against (verify-full).
pub fn server_name(host: &str) -> Result<ServerName<'static>, TlsError> {
    ServerName::try_from(host.to_string()).map_err(|e| err(format!("bad host name {host}: {e}")))
}

/// PgBouncer's description of a session: `TLSv1.3/TLS_AES_256_GCM_SHA384/ECDH=X25519`.
pub fn describe(c: &CommonState) -> String {
    let proto = match c.protocol_version() {
        Some(ProtocolVersion::TLSv1_3) => "TLSv1.3",
        Some(ProtocolVersion::TLSv1_2) => "TLSv1.2",
        _ => "-",
    };
    let suite = c.negotiated_cipher_suite().map_or("-", openssl_name);
    let group = c
        .negotiated_key_exchange_group()
        .map(|g| match g.name() {
            rustls::NamedGroup::X25519 => "X25519",
            rustls::NamedGroup::secp256r1 => "prime256v1",
            rustls::NamedGroup::secp384r1 => "secp384r1",
            _ => "?",
        })
        .map(|g| format!("/ECDH={g}"))
        .unwrap_or_default();
    format!("{proto}/{suite}{group}")
}

/// RFC 5929 `tls-server-end-point`: the certificate's hash with its signature's hash
/// function, SHA-256 for MD5 and SHA-1. None when that hash is unknown (e.g. Ed25519).
pub fn end_point_hash(cert: &[u8]) -> Option<Vec<u8>> {
    use x509_parser::prelude::FromDer;
    let (_, c) = x509_parser::certificate::X509Certificate::from_der(cert).ok()?;
    let oid = c.signature_algorithm.algorithm.to_id_string();
    let hash = match oid.as_str() {
        // md5/sha1/sha256 with RSA, RSASSA-PSS (SHA-256 assumed), ECDSA with SHA-1/SHA-256.
        "1.2.840.113549.1.1.4"
        | "1.2.840.113549.1.1.5"
        | "1.2.840.113549.1.1.11"
        | "1.2.840.113549.1.1.10"
        | "1.2.840.10045.4.1"
        | "1.2.840.10045.4.3.2" => 256,
        "1.2.840.113549.1.1.12" | "1.2.840.10045.4.3.3" => 384,
        "1.2.840.113549.1.1.13" | "1.2.840.10045.4.3.4" => 512,
        _ => return None,
    };
    Some(match hash {
        256 => sha2::Sha256::digest(cert).to_vec(),
        384 => sha2::Sha384::digest(cert).to_vec(),
        _ => sha2::Sha512::digest(cert).to_vec(),
    })
}

/// The names a certificate is issued to, as libtls checks a name: its DNS subject
/// alternative names if it has any, else its subject's common names.
pub fn cert_names(cert: &[u8]) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    use x509_parser::prelude::FromDer;
    let Ok((_, c)) = x509_parser::certificate::X509Certificate::from_der(cert) else {
        return Vec::new();
    };
    let sans: Vec<String> = c
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::DNSName(d) => Some(d.to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    if !sans.is_empty() {
        return sans;
    }
    c.subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok().map(str::to_string))
        .collect()
}

/// A certificate's subject, for logs.
pub fn cert_subject(cert: &[u8]) -> String {
    use x509_parser::prelude::FromDer;
    x509_parser::certificate::X509Certificate::from_der(cert)
        .map(|(_, c)| c.subject().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocols_parse_as_pgbouncer_names_them() {
        let v = |s| protocol_versions(s, "client_tls").unwrap().len();
        assert_eq!(v("secure"), 2);
        assert_eq!(v("all"), 2);
        assert_eq!(v("tlsv1.3"), 1);
        assert_eq!(v("tlsv1.0"), 1, "falls back to TLS 1.2");
        assert!(protocol_versions("sslv3", "client_tls").is_err());
    }

    #[test]
    fn sslmodes_are_ordered() {
        assert!(SslMode::parse("verify-full") > SslMode::Require);
        assert!(SslMode::parse("require") > SslMode::Prefer);
        assert_eq!(SslMode::parse("disable"), SslMode::Disable);
    }

    #[test]
    fn end_point_hash_follows_the_signature_hash() {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
        let cert = rcgen::CertificateParams::new(vec!["x".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let h = end_point_hash(cert.der()).unwrap();
        assert_eq!(h, sha2::Sha384::digest(cert.der()).to_vec());
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let cert = rcgen::CertificateParams::new(vec!["x".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        assert_eq!(
            end_point_hash(cert.der()).unwrap(),
            sha2::Sha256::digest(cert.der()).to_vec()
        );
        assert_eq!(cert_names(cert.der()), vec!["x".to_string()]);
    }
}
