//! `auth_file` (PgBouncer's userlist.txt): `"user" "secret"` lines.
//!
//! A line starting with `"` holds a quoted user name and a quoted secret (`""` is a quote
//! inside); anything after them is ignored. Other lines (comments with `;` or `#`, blank
//! lines, anything else) are skipped, as PgBouncer does. Secrets never appear in errors or
//! `Debug` output.
use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;

/// Longest user name accepted (bytes).
pub const MAX_USERNAME: usize = 128;
/// Longest secret accepted (bytes).
pub const MAX_SECRET: usize = 2048;
/// Largest auth_file read (bytes).
pub const MAX_FILE_LEN: usize = 64 << 20;

/// A stored SCRAM-SHA-256 verifier: `SCRAM-SHA-256$<iter>:<salt b64>$<StoredKey b64>:<ServerKey b64>`.
#[derive(Clone, PartialEq, Eq)]
pub struct ScramVerifier {
    pub iterations: u32,
    pub salt: Vec<u8>,
    pub stored_key: [u8; 32],
    pub server_key: [u8; 32],
    /// HMAC keyed with `stored_key` and with `server_key`, made by the first exchange
    /// and shared by the verifier's clones (every login checks a proof with both).
    pub macs: KeyedMacs,
}

/// HMAC-SHA-256 keyed with a verifier's StoredKey and ServerKey, made once (the key's
/// two padded blocks hashed once, not per login). It goes with the keys it was made
/// from: built on first use by [`KeyedMacs::get`], and a clone of the verifier shares it,
/// so a verifier read again (RELOAD, auth_query) starts empty.
#[derive(Clone, Default)]
pub struct KeyedMacs(std::sync::Arc<std::sync::OnceLock<(HmacSha256, HmacSha256)>>);

/// HMAC-SHA-256, the MAC of SCRAM-SHA-256.
pub type HmacSha256 = hmac::Hmac<sha2::Sha256>;

impl KeyedMacs {
    /// The MACs keyed with `stored_key` and `server_key` (those of the verifier holding
    /// this).
    pub fn get(&self, stored_key: &[u8; 32], server_key: &[u8; 32]) -> &(HmacSha256, HmacSha256) {
        self.0.get_or_init(|| {
            let mac = |k: &[u8; 32]| {
                <HmacSha256 as hmac::KeyInit>::new_from_slice(k)
                    .expect("HMAC accepts keys of any length")
            };
            (mac(stored_key), mac(server_key))
        })
    }
}

/// Made from the keys: equal whenever the keys are.
impl PartialEq for KeyedMacs {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for KeyedMacs {}

impl fmt::Debug for ScramVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScramVerifier")
            .field("iterations", &self.iterations)
            .field("salt", &"<redacted>")
            .field("stored_key", &"<redacted>")
            .field("server_key", &"<redacted>")
            .finish()
    }
}

/// A user's secret as stored.
#[derive(Clone, PartialEq, Eq)]
pub enum Secret {
    /// A plain-text password.
    Plain(String),
    /// `md5` + md5(password + user), as hex: stored without the `md5` prefix (32 hex chars).
    Md5(String),
    /// A SCRAM-SHA-256 verifier.
    Scram(ScramVerifier),
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Secret::Plain(_) => f.write_str("Plain(<redacted>)"),
            Secret::Md5(_) => f.write_str("Md5(<redacted>)"),
            Secret::Scram(v) => f.debug_tuple("Scram").field(v).finish(),
        }
    }
}

impl Secret {
    /// Classify a stored secret: `md5` + 32 hex, a SCRAM-SHA-256 verifier, or plain text.
    /// A value that starts like a SCRAM verifier but is malformed is an error (message has no secret).
    pub fn parse(s: &str) -> Result<Secret, String> {
        if let Some(hex) = s.strip_prefix("md5")
            && hex.len() == 32
            && hex.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return Ok(Secret::Md5(hex.to_ascii_lowercase()));
        }
        if let Some(rest) = s.strip_prefix("SCRAM-SHA-256$") {
            return parse_scram(rest).map(Secret::Scram);
        }
        Ok(Secret::Plain(s.to_string()))
    }
}

/// `<iter>:<salt>$<StoredKey>:<ServerKey>` (after the `SCRAM-SHA-256$` prefix).
fn parse_scram(rest: &str) -> Result<ScramVerifier, String> {
    let (iter_salt, keys) = rest
        .split_once('$')
        .ok_or("malformed SCRAM secret: expected <iterations>:<salt>$<storedkey>:<serverkey>")?;
    let (iter, salt) = iter_salt
        .split_once(':')
        .ok_or("malformed SCRAM secret: expected <iterations>:<salt>")?;
    let (stored, server) = keys
        .split_once(':')
        .ok_or("malformed SCRAM secret: expected <storedkey>:<serverkey>")?;
    let iterations: u32 = iter
        .parse()
        .ok()
        .filter(|n| *n > 0)
        .ok_or("malformed SCRAM secret: bad iteration count")?;
    let salt = B64
        .decode(salt)
        .ok()
        .filter(|s| !s.is_empty())
        .ok_or("malformed SCRAM secret: bad salt")?;
    let key = |k: &str, what: &str| -> Result<[u8; 32], String> {
        B64.decode(k)
            .ok()
            .and_then(|v| <[u8; 32]>::try_from(v.as_slice()).ok())
            .ok_or_else(|| format!("malformed SCRAM secret: {what} is not 32 bytes of base64"))
    };
    Ok(ScramVerifier {
        iterations,
        salt,
        stored_key: key(stored, "StoredKey")?,
        server_key: key(server, "ServerKey")?,
        macs: KeyedMacs::default(),
    })
}

/// An auth_file error; never contains a secret.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthFileError {
    #[error("{file}:{line}: {msg}")]
    Line {
        file: String,
        line: usize,
        msg: String,
    },
    #[error("{file}: {msg}")]
    File { file: String, msg: String },
}

/// user name → secret.
#[derive(Clone, Default)]
pub struct AuthFile {
    pub users: HashMap<String, Secret>,
}

impl fmt::Debug for AuthFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<_> = self.users.keys().collect();
        names.sort();
        f.debug_struct("AuthFile").field("users", &names).finish()
    }
}

/// Read one `"..."` field at the start of `s` (with `""` for `"`); returns it and the rest.
fn quoted(s: &str) -> Option<(String, &str)> {
    let s = s.strip_prefix('"')?;
    let mut out = String::new();
    let mut it = s.char_indices();
    while let Some((i, c)) = it.next() {
        if c == '"' {
            if s[i + 1..].starts_with('"') {
                out.push('"');
                it.next();
            } else {
                return Some((out, &s[i + 1..]));
            }
        } else {
            out.push(c);
        }
    }
    None
}

impl AuthFile {
    /// Parse userlist.txt text named `file` (for errors). A later line for the same user wins.
    pub fn parse(text: &str, file: &str) -> Result<AuthFile, AuthFileError> {
        let mut users = HashMap::new();
        for (i, raw) in text.lines().enumerate() {
            let err = |msg: String| AuthFileError::Line {
                file: file.to_string(),
                line: i + 1,
                msg,
            };
            let line = raw.trim_start();
            if !line.starts_with('"') {
                continue; // comments, blank lines and other text are skipped
            }
            let (user, rest) =
                quoted(line).ok_or_else(|| err("unterminated quoted user name".into()))?;
            if user.is_empty() {
                return Err(err("empty user name".into()));
            }
            if user.len() > MAX_USERNAME {
                return Err(err(format!("user name longer than {MAX_USERNAME} bytes")));
            }
            let rest = rest.trim_start();
            if !rest.starts_with('"') {
                return Err(err(format!(
                    "user \"{user}\": expected a quoted secret after the user name"
                )));
            }
            let (secret, _ignored) = quoted(rest)
                .ok_or_else(|| err(format!("user \"{user}\": unterminated quoted secret")))?;
            if secret.len() > MAX_SECRET {
                return Err(err(format!(
                    "user \"{user}\": secret longer than {MAX_SECRET} bytes"
                )));
            }
            let secret =
                Secret::parse(&secret).map_err(|m| err(format!("user \"{user}\": {m}")))?;
            users.insert(user, secret);
        }
        Ok(AuthFile { users })
    }

    /// Read and parse the file at `path`.
    pub fn load(path: &Path) -> Result<AuthFile, AuthFileError> {
        let file = path.display().to_string();
        let text =
            super::ini::read_bounded(path, MAX_FILE_LEN).map_err(|e| AuthFileError::File {
                file: file.clone(),
                msg: format!("cannot read auth_file: {e}"),
            })?;
        AuthFile::parse(&text, &file)
    }

    /// The secret stored for `user`.
    pub fn get(&self, user: &str) -> Option<&Secret> {
        self.users.get(user)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A verifier PostgreSQL produced (salt and keys are test data, not a real password).
    const SCRAM: &str = "SCRAM-SHA-256$4096:c2FsdHNhbHRzYWx0$\
        AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=:\
        ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=";

    #[test]
    fn debug_never_shows_a_secret() {
        assert_eq!(
            format!("{:?}", Secret::Plain("pw".into())),
            "Plain(<redacted>)"
        );
        assert_eq!(
            format!("{:?}", Secret::Md5("0123".into())),
            "Md5(<redacted>)"
        );
        let v = match AuthFile::parse(&format!("\"u\" \"{SCRAM}\""), "f")
            .unwrap()
            .get("u")
        {
            Some(Secret::Scram(v)) => v.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            format!("{:?}", Secret::Scram(v)),
            "Scram(ScramVerifier { iterations: 4096, salt: \"<redacted>\", \
             stored_key: \"<redacted>\", server_key: \"<redacted>\" })"
        );
    }

    #[test]
    fn names_and_secrets_of_exactly_the_limit_are_read() {
        let name = "u".repeat(MAX_USERNAME);
        let secret = "p".repeat(MAX_SECRET);
        let a = AuthFile::parse(&format!("\"{name}\" \"{secret}\""), "f").unwrap();
        assert_eq!(a.get(&name), Some(&Secret::Plain(secret.clone())));
        let e = AuthFile::parse(&format!("\"{name}u\" \"pw\""), "f").unwrap_err();
        assert!(e.to_string().contains("user name longer than"), "{e}");
        let e = AuthFile::parse(&format!("\"u\" \"{secret}p\""), "f").unwrap_err();
        assert!(e.to_string().contains("secret longer than"), "{e}");
    }

    #[test]
    fn all_forms() {
        let text = format!(
            "; comment\n# comment\n\n\"alice\" \"pa ss\"\"word\"\n\
             \"bob\" \"md545F2603610AF569B6155C45067268C6B\" trailing ignored\n\
             \"carol\"   \"{SCRAM}\"\n  \"we\"\"ird\" \"md5short\"\nnot a user line\n\"empty\" \"\"\n"
        );
        let a = AuthFile::parse(&text, "users.txt").unwrap();
        assert_eq!(a.users.len(), 5);
        assert_eq!(a.get("alice"), Some(&Secret::Plain("pa ss\"word".into())));
        assert_eq!(
            a.get("bob"),
            Some(&Secret::Md5("45f2603610af569b6155c45067268c6b".into()))
        );
        let Some(Secret::Scram(v)) = a.get("carol") else {
            panic!("carol is SCRAM")
        };
        assert_eq!(v.iterations, 4096);
        assert_eq!(v.salt, b"saltsaltsalt");
        assert_eq!(v.stored_key[..4], [0, 1, 2, 3]);
        assert_eq!(v.server_key[..4], [32, 33, 34, 35]);
        assert_eq!(a.get("we\"ird"), Some(&Secret::Plain("md5short".into())));
        assert_eq!(a.get("empty"), Some(&Secret::Plain(String::new())));
    }

    #[test]
    fn errors_name_line_and_hide_secrets() {
        let cases = [
            ("\n\"alice", "u.txt:2: unterminated quoted user name"),
            ("\"\" \"x\"", "u.txt:1: empty user name"),
            (
                "\"alice\" topsecret",
                "u.txt:1: user \"alice\": expected a quoted secret after the user name",
            ),
            (
                "\"alice\" \"topsecret",
                "u.txt:1: user \"alice\": unterminated quoted secret",
            ),
            (
                "\"alice\" \"SCRAM-SHA-256$4096:c2FsdA==$topsecret\"",
                "u.txt:1: user \"alice\": malformed SCRAM secret: expected <storedkey>:<serverkey>",
            ),
            (
                "\"alice\" \"SCRAM-SHA-256$0:c2FsdA==$AA==:AA==\"",
                "u.txt:1: user \"alice\": malformed SCRAM secret: bad iteration count",
            ),
            (
                "\"alice\" \"SCRAM-SHA-256$10:c2FsdA==$AA==:AA==\"",
                "u.txt:1: user \"alice\": malformed SCRAM secret: StoredKey is not 32 bytes of base64",
            ),
            (
                "\"alice\" \"SCRAM-SHA-256$10:!!$AA==:AA==\"",
                "u.txt:1: user \"alice\": malformed SCRAM secret: bad salt",
            ),
        ];
        for (text, want) in cases {
            let e = AuthFile::parse(text, "u.txt").unwrap_err().to_string();
            assert_eq!(e, want);
            assert!(!e.contains("topsecret"));
        }
        let long = format!("\"{}\" \"x\"", "u".repeat(MAX_USERNAME + 1));
        assert!(AuthFile::parse(&long, "u.txt").is_err());
        let long = format!("\"u\" \"{}\"", "x".repeat(MAX_SECRET + 1));
        assert!(AuthFile::parse(&long, "u.txt").is_err());
    }

    #[test]
    fn debug_redacts() {
        let a = AuthFile::parse(
            &format!(
                "\"a\" \"hunter2\"\n\"b\" \"{SCRAM}\"\n\"c\" \"md5{}\"",
                "ab".repeat(16)
            ),
            "u",
        )
        .unwrap();
        let d = format!("{a:?} {:?} {:?} {:?}", a.get("a"), a.get("b"), a.get("c"));
        assert!(
            !d.contains("hunter2") && !d.contains("abab") && !d.contains("[0, 1, 2"),
            "{d}"
        );
        assert!(d.contains("\"a\""), "{d}");
    }

    #[test]
    fn load_from_disk() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("userlist.txt");
        std::fs::write(&p, "\"u\" \"p\"\n").unwrap();
        assert_eq!(
            AuthFile::load(&p).unwrap().get("u"),
            Some(&Secret::Plain("p".into()))
        );
        let e = AuthFile::load(&dir.path().join("none.txt"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("none.txt: cannot read auth_file"), "{e}");
    }
}
