//! `auth_ident_file` (PgBouncer's subset of pg_ident.conf): named maps from an OS user name
//! (peer) or a certificate name (cert) to the PostgreSQL users it may log in as.
//!
//! The subset is PgBouncer 1.25's: lines `map-name system-username database-username`,
//! where the database user is a name or `all`; no includes, no regular expressions, no
//! `+group`. Anything else is an error naming file and line, and the whole file is refused.
use std::collections::BTreeMap;
use std::path::Path;

use super::hba::{HbaError, Token, read_file, tokenize};

/// What a system user may log in as.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    All,
    User(String),
}

/// The maps of an ident file, by name; each holds (system user, target) in file order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ident {
    maps: BTreeMap<String, Vec<(String, Target)>>,
}

impl Ident {
    /// Read and parse `path`.
    pub fn load(path: &Path) -> Result<Ident, HbaError> {
        Ident::parse(&read_file(path)?, path)
    }

    /// Parse ident text read from `path` (named in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Ident, HbaError> {
        let mut ident = Ident::default();
        for (i, raw) in text.lines().enumerate() {
            let err = |msg: String| HbaError {
                file: path.display().to_string(),
                line: i + 1,
                msg,
            };
            let tokens = tokenize(raw).map_err(err)?;
            let (map, system, target) = match tokens.as_slice() {
                [] => continue,
                [Token::Word(map), system, target] => (map, system, target),
                _ => {
                    return Err(err(
                        "expected \"map-name system-username database-username\"".into(),
                    ));
                }
            };
            let system = match system {
                Token::Word(w) if w.starts_with('/') => {
                    return Err(err(format!(
                        "regular expressions (\"{w}\") are not supported, as in PgBouncer"
                    )));
                }
                Token::Word(w) | Token::Quoted(w) => w.clone(),
                Token::Comma => return Err(err("unexpected \",\"".into())),
            };
            let target = match target {
                Token::Word(w) if w == "all" => Target::All,
                Token::Word(w) if w.starts_with('+') || w.starts_with('/') || w == "\\1" => {
                    return Err(err(format!(
                        "\"{w}\": only a user name or all is supported, as in PgBouncer"
                    )));
                }
                Token::Word(w) | Token::Quoted(w) => Target::User(w.clone()),
                Token::Comma => return Err(err("unexpected \",\"".into())),
            };
            ident
                .maps
                .entry(map.clone())
                .or_default()
                .push((system, target));
        }
        Ok(ident)
    }

    /// Whether a map of this name exists.
    pub fn has_map(&self, map: &str) -> bool {
        self.maps.contains_key(map)
    }

    /// Whether `map` lets system user `system` (an OS user, or a certificate name) log in as
    /// PostgreSQL user `user`.
    pub fn allows(&self, map: &str, system: &str, user: &str) -> bool {
        self.maps.get(map).is_some_and(|lines| {
            lines.iter().any(|(s, t)| {
                s == system
                    && match t {
                        Target::All => true,
                        Target::User(u) => u == user,
                    }
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Ident, HbaError> {
        Ident::parse(text, Path::new("ident.conf"))
    }

    #[test]
    fn maps_pgbouncer_style_lines() {
        let i = parse(
            "# MAPNAME SYSTEM PG\n\
             test\t\tpgbouncer.acme.org\tsomeuser\n\
             test  pgbouncer.acme.org  anotheruser # two users\n\
             test2 \"bouncer\" all\n\
             test2 pgbouncer.acme.org \"anotheruser\"\n\
             \n",
        )
        .unwrap();
        assert!(i.has_map("test") && i.has_map("test2") && !i.has_map("test3"));
        assert!(i.allows("test", "pgbouncer.acme.org", "someuser"));
        assert!(i.allows("test", "pgbouncer.acme.org", "anotheruser"));
        assert!(!i.allows("test", "pgbouncer.acme.org", "bouncer"));
        assert!(!i.allows("test", "bouncer", "someuser"));
        assert!(i.allows("test2", "bouncer", "anything"));
        assert!(i.allows("test2", "pgbouncer.acme.org", "anotheruser"));
        assert!(!i.allows("test2", "pgbouncer.acme.org", "someuser"));
        assert!(!i.allows("nomap", "bouncer", "bouncer"));
    }

    #[test]
    fn a_quoted_all_is_a_user_named_all() {
        let i = parse("m os \"all\"\n").unwrap();
        assert!(i.allows("m", "os", "all"));
        assert!(!i.allows("m", "os", "alice"));
    }

    #[test]
    fn errors_name_file_and_line() {
        for (text, want) in [
            ("m a\n", "ident.conf:1: expected"),
            ("\nm a b c\n", "ident.conf:2: expected"),
            ("m /^(.*)$ \\1\n", "ident.conf:1: regular expressions"),
            (
                "m os +group\n",
                "ident.conf:1: \"+group\": only a user name",
            ),
            ("\"m\" os pg\n", "ident.conf:1: expected"),
            ("m os, pg\n", "ident.conf:1: expected"),
            ("m \"os pg\n", "ident.conf:1: unterminated"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.starts_with(want), "{text:?}: {e}");
        }
    }
}
