//! The `cert` method: a TLS client certificate issued to the user logging in (one of its
//! names: DNS names, else the CommonName), or to a name the rule's ident map maps to it.
//! The names come from [`Stream::client_cert_names`], which only TLS connections answer.
use crate::config::ident::Ident;
use crate::net::Stream;

/// Whether the client's certificate lets it log in as `user`. Err is the reason, in
/// PgBouncer's words, for the log.
pub fn allows(
    stream: &Stream,
    user: &str,
    map: Option<&str>,
    ident: Option<&Ident>,
) -> Result<(), String> {
    if !stream.is_tls() {
        return Err("TLS connection required".into());
    }
    let Some(names) = stream.client_cert_names() else {
        return Err("TLS client certificate required".into());
    };
    let mut why = Err("TLS certificate name mismatch".into());
    for name in &names {
        why = name_allows(name, user, map, ident);
        if why.is_ok() {
            break;
        }
    }
    why
}

/// The check on the certificate's name alone.
pub fn name_allows(
    cert_name: &str,
    user: &str,
    map: Option<&str>,
    ident: Option<&Ident>,
) -> Result<(), String> {
    match map {
        Some(map) if ident.is_some_and(|i| i.allows(map, cert_name, user)) => Ok(()),
        Some(map) => Err(format!("ident map: {map} does not have a match")),
        None if cert_name == user => Ok(()),
        None => Err("TLS certificate name mismatch".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn the_certificate_name_must_be_the_user_or_mapped_to_it() {
        let ident = Ident::parse(
            "test pgbouncer.acme.org someuser\ntest2 bouncer all\n",
            Path::new("i"),
        )
        .unwrap();
        assert!(name_allows("bouncer", "bouncer", None, None).is_ok());
        assert_eq!(
            name_allows("bouncer", "someuser", None, None).unwrap_err(),
            "TLS certificate name mismatch"
        );
        assert!(name_allows("pgbouncer.acme.org", "someuser", Some("test"), Some(&ident)).is_ok());
        assert_eq!(
            name_allows("pgbouncer.acme.org", "bouncer", Some("test"), Some(&ident)).unwrap_err(),
            "ident map: test does not have a match"
        );
        assert!(name_allows("bouncer", "anyone", Some("test2"), Some(&ident)).is_ok());
    }

    #[tokio::test]
    async fn without_tls_there_is_no_certificate() {
        let (a, _b) = tokio::net::UnixStream::pair().unwrap();
        assert_eq!(
            allows(&Stream::Unix(a), "u", None, None).unwrap_err(),
            "TLS connection required"
        );
    }
}
