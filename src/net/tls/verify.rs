//! Certificate checks for rustls: PgBouncer's sslmodes towards servers, client
//! certificates, and OpenSSL's leniency where webpki is stricter (X.509 v1 certificates,
//! a host name only in the common name), plus the certificate we present.
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

use super::{SslMode, TlsError, err, load_certs};

/// How a server's certificate is checked: not at all below verify-ca (PgBouncer's
/// semantics; the handshake's signatures still are), the chain (verify-ca), the chain and
/// the name (verify-full). webpki does the checking; certificates it refuses but OpenSSL
/// (PgBouncer, libpq) takes are checked by [`verify_legacy`]: X.509 v1, and a name only in
/// the common name.
#[derive(Debug)]
pub(super) struct ServerVerifier {
    pub(super) mode: SslMode,
    pub(super) webpki: Option<Arc<rustls::client::WebPkiServerVerifier>>,
    pub(super) roots: Vec<CertificateDer<'static>>,
    pub(super) algs: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl rustls::client::danger::ServerCertVerifier for ServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        use rustls::CertificateError as E;
        use rustls::client::danger::ServerCertVerified;
        let Some(webpki) = self
            .webpki
            .as_ref()
            .filter(|_| self.mode >= SslMode::VerifyCa)
        else {
            return Ok(ServerCertVerified::assertion());
        };
        let name = (self.mode == SslMode::VerifyFull).then(|| server_name.to_str().into_owned());
        match webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Ok(v) => Ok(v),
            Err(rustls::Error::InvalidCertificate(
                E::NotValidForName | E::NotValidForNameContext { .. },
            )) if name.is_none() => Ok(ServerCertVerified::assertion()),
            Err(e) if needs_legacy(end_entity, &e) => {
                verify_legacy(end_entity, &self.roots, name.as_deref(), now).map_err(|_| e)?;
                Ok(ServerCertVerified::assertion())
            }
            Err(e) => Err(e),
        }
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        verify_signature(message, cert, dss, &self.algs, false)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        verify_signature(message, cert, dss, &self.algs, true)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algs.supported_schemes()
    }
}

/// Client certificates: webpki, with [`verify_legacy`] for X.509 v1 certificates.
#[derive(Debug)]
pub(super) struct ClientVerifier {
    pub(super) webpki: Arc<dyn rustls::server::danger::ClientCertVerifier>,
    pub(super) roots: Vec<CertificateDer<'static>>,
    pub(super) algs: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl rustls::server::danger::ClientCertVerifier for ClientVerifier {
    fn offer_client_auth(&self) -> bool {
        self.webpki.offer_client_auth()
    }
    fn client_auth_mandatory(&self) -> bool {
        self.webpki.client_auth_mandatory()
    }
    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.webpki.root_hint_subjects()
    }
    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        match self
            .webpki
            .verify_client_cert(end_entity, intermediates, now)
        {
            Err(e) if needs_legacy(end_entity, &e) => {
                verify_legacy(end_entity, &self.roots, None, now).map_err(|_| e)?;
                Ok(rustls::server::danger::ClientCertVerified::assertion())
            }
            r => r,
        }
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        verify_signature(message, cert, dss, &self.algs, false)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        verify_signature(message, cert, dss, &self.algs, true)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algs.supported_schemes()
    }
}

fn parse_cert(der: &[u8]) -> Option<x509_parser::certificate::X509Certificate<'_>> {
    use x509_parser::prelude::FromDer;
    x509_parser::certificate::X509Certificate::from_der(der)
        .ok()
        .map(|(_, c)| c)
}

/// webpki refused `cert` for a reason OpenSSL does not have: an X.509 v1 certificate, or
/// a name check on a certificate that names its host only in the common name.
fn needs_legacy(cert: &[u8], e: &rustls::Error) -> bool {
    use rustls::CertificateError as E;
    let Some(c) = parse_cert(cert) else {
        return false;
    };
    let no_san = c.subject_alternative_name().ok().flatten().is_none();
    c.version() == x509_parser::x509::X509Version::V1
        || (no_san
            && matches!(
                e,
                rustls::Error::InvalidCertificate(
                    E::NotValidForName | E::NotValidForNameContext { .. }
                )
            ))
}

/// OpenSSL's checks, for the certificates of [`needs_legacy`]: issued and signed directly
/// by a certificate of the CA file, valid now, and (`name`) issued to that host: its DNS
/// names or IP addresses, else its common name (as libpq checks it).
fn verify_legacy(
    cert: &[u8],
    roots: &[CertificateDer<'static>],
    name: Option<&str>,
    now: UnixTime,
) -> Result<(), ()> {
    use x509_parser::extensions::GeneralName;
    let c = parse_cert(cert).ok_or(())?;
    let now =
        x509_parser::time::ASN1Time::from_timestamp(i64::try_from(now.as_secs()).map_err(|_| ())?)
            .map_err(|_| ())?;
    if !c.validity().is_valid_at(now) {
        return Err(());
    }
    let signed = roots.iter().filter_map(|r| parse_cert(r)).any(|r| {
        r.subject() == c.issuer()
            && r.validity().is_valid_at(now)
            && c.verify_signature(Some(r.public_key())).is_ok()
    });
    if !signed {
        return Err(());
    }
    let Some(name) = name else { return Ok(()) };
    let ip: Option<std::net::IpAddr> = name.parse().ok();
    let sans: Vec<GeneralName<'_>> = c
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|s| s.value.general_names.clone())
        .unwrap_or_default();
    let matches_dns = |pattern: &str| match pattern.strip_prefix("*.") {
        Some(rest) => name
            .split_once('.')
            .is_some_and(|(first, tail)| !first.is_empty() && tail.eq_ignore_ascii_case(rest)),
        None => pattern.eq_ignore_ascii_case(name),
    };
    let listed: Vec<&GeneralName<'_>> = sans
        .iter()
        .filter(|n| matches!(n, GeneralName::DNSName(_) | GeneralName::IPAddress(_)))
        .collect();
    let ok = if listed.is_empty() {
        c.subject()
            .iter_common_name()
            .filter_map(|cn| cn.as_str().ok())
            .any(|cn| ip.map_or(matches_dns(cn), |ip| cn == ip.to_string()))
    } else {
        listed.iter().any(|n| match (n, ip) {
            (GeneralName::DNSName(d), None) => matches_dns(d),
            (GeneralName::IPAddress(b), Some(std::net::IpAddr::V4(v4))) => *b == v4.octets(),
            (GeneralName::IPAddress(b), Some(std::net::IpAddr::V6(v6))) => *b == v6.octets(),
            _ => false,
        })
    };
    if ok { Ok(()) } else { Err(()) }
}

/// A handshake signature made with `cert`'s key. webpki reads the key of the certificates
/// it takes; for an X.509 v1 certificate the key is read here and each algorithm rustls
/// maps the scheme to is tried.
fn verify_signature(
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &rustls::DigitallySignedStruct,
    algs: &rustls::crypto::WebPkiSupportedAlgorithms,
    tls13: bool,
) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
    let r = if tls13 {
        rustls::crypto::verify_tls13_signature(message, cert, dss, algs)
    } else {
        rustls::crypto::verify_tls12_signature(message, cert, dss, algs)
    };
    use rustls::SignatureScheme as S;
    // TLS 1.3 allows neither PKCS#1 v1.5 nor SHA-1 signatures.
    let tls13_scheme = matches!(
        dss.scheme,
        S::ECDSA_NISTP256_SHA256
            | S::ECDSA_NISTP384_SHA384
            | S::ECDSA_NISTP521_SHA512
            | S::RSA_PSS_SHA256
            | S::RSA_PSS_SHA384
            | S::RSA_PSS_SHA512
            | S::ED25519
            | S::ED448
    );
    if r.is_ok() || (tls13 && !tls13_scheme) {
        return r;
    }
    let Some(c) = parse_cert(cert).filter(|c| c.version() == x509_parser::x509::X509Version::V1)
    else {
        return r;
    };
    let key = &c.public_key().subject_public_key.data;
    let valid = algs
        .mapping
        .iter()
        .filter(|(scheme, _)| *scheme == dss.scheme)
        .flat_map(|(_, candidates)| candidates.iter())
        .any(|alg| alg.verify_signature(key, message, dss.signature()).is_ok());
    if valid {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    } else {
        r
    }
}

/// Our certificate and key, served whatever the client asks (rustls's own single-cert
/// setup refuses X.509 v1 certificates, which OpenSSL serves).
#[derive(Debug)]
pub(super) struct OneCert(pub(super) Arc<rustls::sign::CertifiedKey>);

impl rustls::server::ResolvesServerCert for OneCert {
    fn resolve(
        &self,
        _: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.clone())
    }
}

impl rustls::client::ResolvesClientCert for OneCert {
    fn resolve(
        &self,
        _: &[&[u8]],
        _: &[rustls::SignatureScheme],
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.clone())
    }
    fn has_certs(&self) -> bool {
        true
    }
}

/// Certificate chain and key from PEM files, as rustls signs with them.
pub(super) fn certified_key(
    provider: &CryptoProvider,
    cert_file: &str,
    key_file: &str,
    pfx: &str,
) -> Result<Arc<rustls::sign::CertifiedKey>, TlsError> {
    let certs = load_certs(cert_file, &format!("{pfx}_cert_file"))?;
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|e| err(format!("invalid {pfx}_key_file: {key_file}: {e}")))?;
    let key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| err(format!("invalid {pfx}_key_file: {key_file}: {e}")))?;
    Ok(Arc::new(rustls::sign::CertifiedKey::new(certs, key)))
}
