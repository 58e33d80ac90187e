//! The `peer` method (hba files): the OS user at the other end of a Unix socket
//! (SO_PEERCRED, then the password database) must be the user logging in, or be mapped to
//! it by the rule's ident map.
use crate::config::ident::Ident;
use crate::net::Stream;

/// The OS user name of a Unix-socket peer; None for TCP, or a uid with no name.
pub async fn os_user(stream: &Stream) -> Option<String> {
    let uid = stream.peer_uid()?;
    // getpwuid_r may ask NSS (LDAP, sssd…): off the reactor.
    tokio::task::spawn_blocking(move || os_user_name(uid))
        .await
        .ok()
        .flatten()
}

/// The name of OS user `uid` (getpwuid_r).
pub fn os_user_name(uid: u32) -> Option<String> {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map(|u| u.name)
}

/// Whether OS user `os_user` may log in as `user`: the same name, or, with `map`, a line
/// of that ident map. Err is the reason, in PgBouncer's words, for the log.
pub fn allows(
    os_user: Option<&str>,
    user: &str,
    map: Option<&str>,
    ident: Option<&Ident>,
) -> Result<(), String> {
    let Some(os_user) = os_user else {
        return Err("peer authentication needs a Unix socket with a known OS user".into());
    };
    match map {
        Some(map) if ident.is_some_and(|i| i.allows(map, os_user, user)) => Ok(()),
        Some(map) => Err(format!("ident map {map} cannot be matched")),
        None if os_user == user => Ok(()),
        None => Err(format!(
            "peer authentication failed: OS user \"{os_user}\" is not \"{user}\""
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn the_os_user_must_be_the_user_or_mapped_to_it() {
        assert!(allows(Some("alice"), "alice", None, None).is_ok());
        let e = allows(Some("alice"), "bob", None, None).unwrap_err();
        assert_eq!(
            e,
            "peer authentication failed: OS user \"alice\" is not \"bob\""
        );
        assert!(allows(None, "alice", None, None).is_err());
        let ident = Ident::parse("m alice bob\nall alice all\n", Path::new("i")).unwrap();
        assert!(allows(Some("alice"), "bob", Some("m"), Some(&ident)).is_ok());
        // With a map the OS user's own name is not enough (as PgBouncer).
        assert_eq!(
            allows(Some("alice"), "alice", Some("m"), Some(&ident)).unwrap_err(),
            "ident map m cannot be matched"
        );
        assert!(allows(Some("alice"), "anyone", Some("all"), Some(&ident)).is_ok());
        assert!(allows(Some("carol"), "anyone", Some("all"), Some(&ident)).is_err());
    }

    #[test]
    fn uid_zero_is_root() {
        assert_eq!(os_user_name(0).as_deref(), Some("root"));
    }

    #[tokio::test]
    async fn the_os_user_of_a_unix_socket_peer() {
        let (a, _b) = tokio::net::UnixStream::pair().unwrap();
        let me = os_user_name(nix::unistd::geteuid().as_raw());
        assert!(me.is_some());
        assert_eq!(os_user(&Stream::Unix(a)).await, me);
    }
}
