//! `auth_hba_file` (PgBouncer's subset of pg_hba.conf): rules parsed from text, and the rule
//! a login meets. The ident maps its `map=` options name are in `config::ident`.
//!
//! The subset is PgBouncer 1.25's (doc/config.md, "HBA file format"): record types `local`,
//! `host`, `hostssl`, `hostnossl`; database field `all`, `sameuser`, `replication`, names
//! and `@file`; user field `all`, names and `@file`; address `all`, IPv4 or IPv6 with a
//! `/bits` or a separate mask; methods `trust`, `reject`, `md5`, `password`,
//! `scram-sha-256`, `cert`, `peer`; the one option `map=`. A line outside the subset is an
//! error naming its file and line, and the whole file is refused (PostgreSQL's rule; PgBouncer
//! skips such a line, which can turn a misspelt `reject` into an open door).
use std::collections::HashSet;
use std::net::{IpAddr, Ipv6Addr};
use std::path::{Path, PathBuf};

use super::ident::Ident;

/// Largest hba file (or `@file`) read, in bytes.
pub const MAX_FILE_LEN: u64 = 1024 * 1024;
/// How deep `@file`s may include `@file`s (PostgreSQL's limit).
const MAX_INCLUDE_DEPTH: usize = 10;

/// An error in an hba or ident file: where, and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {msg}")]
pub struct HbaError {
    pub file: String,
    /// 1-based; 0 when the file as a whole is at fault (cannot be read).
    pub line: usize,
    pub msg: String,
}

/// How a rule's connection type is met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnType {
    /// Unix socket.
    Local,
    /// TCP, with or without TLS.
    Host,
    /// TCP with TLS.
    HostSsl,
    /// TCP without TLS.
    HostNoSsl,
}

/// The authentication method of a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Trust,
    Reject,
    Md5,
    /// `password`: the clear-text exchange (auth_type `plain`).
    Password,
    ScramSha256,
    Cert,
    Peer,
}

impl Method {
    /// The keyword in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Trust => "trust",
            Method::Reject => "reject",
            Method::Md5 => "md5",
            Method::Password => "password",
            Method::ScramSha256 => "scram-sha-256",
            Method::Cert => "cert",
            Method::Peer => "peer",
        }
    }
}

/// A database or user field.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Names {
    all: bool,
    /// Database field: the database named as the user.
    sameuser: bool,
    /// Database field: physical replication connections.
    replication: bool,
    names: HashSet<String>,
}

impl Names {
    fn matches(&self, name: &str, user: &str) -> bool {
        self.all || (self.sameuser && name == user) || self.names.contains(name)
    }
}

/// A rule's address: everything, or a network (address and mask of one family).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Address {
    All,
    V4 { base: u32, mask: u32 },
    V6 { base: u128, mask: u128 },
}

impl Address {
    fn matches(&self, ip: IpAddr) -> bool {
        match (*self, canonical(ip)) {
            (Address::All, _) => true,
            (Address::V4 { base, mask }, IpAddr::V4(a)) => u32::from(a) & mask == base,
            (Address::V6 { base, mask }, IpAddr::V6(a)) => u128::from(a) & mask == base,
            _ => false,
        }
    }
}

/// An IPv4 client seen through an IPv6 socket (`::ffff:a.b.c.d`) as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// One line of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The line it was read from (1-based), for logs.
    pub line: usize,
    pub conn_type: ConnType,
    databases: Names,
    users: Names,
    /// None for `local` rules.
    address: Option<Address>,
    pub method: Method,
    /// The ident map of `map=`, checked to exist when the file was loaded.
    pub map: Option<String>,
}

/// Where a login comes from, as far as hba rules care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A Unix socket.
    Unix,
    /// TCP from this address, over TLS or not.
    Tcp { addr: IpAddr, tls: bool },
}

/// A parsed hba file: rules in file order, and warnings worth logging once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hba {
    pub path: PathBuf,
    pub rules: Vec<Rule>,
    /// Lines accepted with a doubt (an address with bits outside its mask), in the file's words.
    pub warnings: Vec<String>,
}

impl Hba {
    /// Read and parse `path`; `map=` options must name a map of `ident`.
    pub fn load(path: &Path, ident: Option<&Ident>) -> Result<Hba, HbaError> {
        let text = read_file(path)?;
        Hba::parse(&text, path, ident, &mut |p: &Path| read_file(p))
    }

    /// Parse hba text read from `path` (`@file`s are read with `read`, relative to the
    /// directory of the file naming them).
    pub fn parse(
        text: &str,
        path: &Path,
        ident: Option<&Ident>,
        read: &mut dyn FnMut(&Path) -> Result<String, HbaError>,
    ) -> Result<Hba, HbaError> {
        let mut hba = Hba {
            path: path.to_path_buf(),
            ..Hba::default()
        };
        let file = path.display().to_string();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let err = |msg: String| HbaError {
                file: file.clone(),
                line,
                msg,
            };
            let tokens = tokenize(raw).map_err(err)?;
            if tokens.is_empty() {
                continue;
            }
            let mut ctx = LineParser {
                tokens: &tokens,
                pos: 0,
                path,
                read,
            };
            let rule = ctx
                .rule(line, ident, &mut hba.warnings, &file)
                .map_err(err)?;
            hba.rules.push(rule);
        }
        Ok(hba)
    }

    /// The first rule a login of `user` to `database` from `origin` meets, if any. A
    /// physical replication connection (`replication=true`) meets only rules whose database
    /// field says `replication`.
    pub fn lookup(
        &self,
        origin: Origin,
        replication: bool,
        database: &str,
        user: &str,
    ) -> Option<&Rule> {
        self.rules.iter().find(|r| {
            let place = match (origin, r.conn_type) {
                (Origin::Unix, ConnType::Local) => true,
                (Origin::Unix, _) | (Origin::Tcp { .. }, ConnType::Local) => false,
                (Origin::Tcp { tls: false, .. }, ConnType::HostSsl) => false,
                (Origin::Tcp { tls: true, .. }, ConnType::HostNoSsl) => false,
                (Origin::Tcp { addr, .. }, _) => r.address.is_some_and(|a| a.matches(addr)),
            };
            let db = if replication {
                r.databases.replication
            } else {
                r.databases.matches(database, user)
            };
            place && db && (r.users.all || r.users.names.contains(user))
        })
    }
}

/// Read a file of at most [`MAX_FILE_LEN`] bytes as text.
pub fn read_file(path: &Path) -> Result<String, HbaError> {
    let err = |msg: String| HbaError {
        file: path.display().to_string(),
        line: 0,
        msg,
    };
    let f = std::fs::File::open(path).map_err(|e| err(format!("cannot read: {e}")))?;
    let mut text = String::new();
    use std::io::Read;
    f.take(MAX_FILE_LEN + 1)
        .read_to_string(&mut text)
        .map_err(|e| err(format!("cannot read: {e}")))?;
    if text.len() as u64 > MAX_FILE_LEN {
        return Err(err(format!("larger than {MAX_FILE_LEN} bytes")));
    }
    Ok(text)
}

/// A token of an hba or ident line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Token {
    /// Unquoted text: keywords are only recognised unquoted.
    Word(String),
    /// `"quoted"` text (`""` inside is one `"`).
    Quoted(String),
    Comma,
}

/// Split a line into tokens; `#` outside quotes starts a comment.
pub(super) fn tokenize(line: &str) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let mut chars = line.char_indices().peekable();
    while let Some(&(start, c)) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if c == '#' {
            break;
        } else if c == ',' {
            chars.next();
            out.push(Token::Comma);
        } else if c == '"' {
            chars.next();
            let mut s = String::new();
            loop {
                match chars.next() {
                    None => return Err("unterminated quoted string".into()),
                    Some((_, '"')) => {
                        if chars.peek().is_some_and(|&(_, c)| c == '"') {
                            chars.next();
                            s.push('"');
                        } else {
                            break;
                        }
                    }
                    Some((_, c)) => s.push(c),
                }
            }
            out.push(Token::Quoted(s));
        } else {
            let mut end = line.len();
            while let Some(&(i, c)) = chars.peek() {
                if c.is_whitespace() || c == ',' || c == '#' || c == '"' {
                    end = i;
                    break;
                }
                chars.next();
            }
            out.push(Token::Word(line[start..end].to_string()));
        }
    }
    Ok(out)
}

struct LineParser<'a, 'r> {
    tokens: &'a [Token],
    pos: usize,
    /// The file the line is in (`@file`s are relative to its directory).
    path: &'a Path,
    read: &'r mut dyn FnMut(&Path) -> Result<String, HbaError>,
}

impl LineParser<'_, '_> {
    fn next(&mut self) -> Option<&Token> {
        let t = self.tokens.get(self.pos);
        self.pos += 1;
        t
    }

    fn word(&mut self, what: &str) -> Result<String, String> {
        match self.next() {
            Some(Token::Word(w)) => Ok(w.clone()),
            Some(t) => Err(format!("expected {what}, found {}", show(t))),
            None => Err(format!("missing {what}")),
        }
    }

    fn rule(
        &mut self,
        line: usize,
        ident: Option<&Ident>,
        warnings: &mut Vec<String>,
        file: &str,
    ) -> Result<Rule, String> {
        let conn_type = match self.word("a record type")?.as_str() {
            "local" => ConnType::Local,
            "host" => ConnType::Host,
            "hostssl" => ConnType::HostSsl,
            "hostnossl" => ConnType::HostNoSsl,
            t @ ("hostgssenc" | "hostnogssenc") => {
                return Err(format!("record type \"{t}\" is not supported"));
            }
            t => return Err(format!("unknown record type \"{t}\"")),
        };
        let databases = self.names(Field::Database)?;
        let users = self.names(Field::User)?;
        let address = match conn_type {
            ConnType::Local => None,
            _ => Some(self.address(line, warnings, file)?),
        };
        let method = match self.word("an authentication method")?.as_str() {
            "trust" => Method::Trust,
            "reject" => Method::Reject,
            "md5" => Method::Md5,
            "password" => Method::Password,
            "scram-sha-256" => Method::ScramSha256,
            "cert" => Method::Cert,
            "peer" => Method::Peer,
            m @ ("ldap" | "pam" | "any" | "ident" | "gss" | "sspi" | "radius") => {
                return Err(format!(
                    "authentication method \"{m}\" is not supported by pgcarpool"
                ));
            }
            m => return Err(format!("unknown authentication method \"{m}\"")),
        };
        let mut map = None;
        while let Some(t) = self.next() {
            let Token::Word(opt) = t else {
                return Err(format!("unexpected {}", show(t)));
            };
            match opt.strip_prefix("map=") {
                Some(name) if map.is_none() && !name.is_empty() => {
                    if !ident.is_some_and(|i| i.has_map(name)) {
                        return Err(format!(
                            "ident map \"{name}\" is not found in auth_ident_file"
                        ));
                    }
                    map = Some(name.to_string());
                }
                _ => {
                    return Err(format!(
                        "unsupported option \"{opt}\" (only map= is supported)"
                    ));
                }
            }
        }
        Ok(Rule {
            line,
            conn_type,
            databases,
            users,
            address,
            method,
            map,
        })
    }

    /// A comma-separated list of names and keywords.
    fn names(&mut self, field: Field) -> Result<Names, String> {
        let mut names = Names::default();
        loop {
            match self.next().cloned() {
                None => return Err(format!("missing {}", field.what())),
                Some(Token::Comma) => return Err(format!("empty name in {}", field.what())),
                Some(Token::Quoted(n)) => {
                    names.names.insert(n);
                }
                Some(Token::Word(w)) => {
                    add_word(&mut names, &w, field, self.path, &mut *self.read, 0)?
                }
            }
            if self.tokens.get(self.pos) == Some(&Token::Comma) {
                self.pos += 1;
            } else {
                return Ok(names);
            }
        }
    }

    fn address(
        &mut self,
        line: usize,
        warnings: &mut Vec<String>,
        file: &str,
    ) -> Result<Address, String> {
        let w = self.word("an address")?;
        if w == "all" {
            return Ok(Address::All);
        }
        if matches!(w.as_str(), "samehost" | "samenet") {
            return Err(format!("address \"{w}\" is not supported"));
        }
        let (addr, bits) = match w.split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (w.as_str(), None),
        };
        let ip: IpAddr = addr
            .parse()
            .map_err(|_| format!("invalid address \"{addr}\" (host names are not supported)"))?;
        let width = if ip.is_ipv4() { 32 } else { 128 };
        let mask: u128 = match bits {
            Some(b) => {
                let n: u32 = b
                    .parse()
                    .ok()
                    .filter(|n| *n <= width)
                    .ok_or_else(|| format!("invalid mask length \"{b}\""))?;
                prefix_mask(n, width)
            }
            None => {
                let m = self.word("a mask (or address/bits)")?;
                match (ip, m.parse::<IpAddr>()) {
                    (IpAddr::V4(_), Ok(IpAddr::V4(m))) => u128::from(u32::from(m)),
                    (IpAddr::V6(_), Ok(IpAddr::V6(m))) => u128::from(m),
                    _ => return Err(format!("invalid mask \"{m}\"")),
                }
            }
        };
        let a = match ip {
            IpAddr::V4(v4) => {
                let (base, mask) = (u32::from(v4), mask as u32);
                if base & !mask != 0 {
                    warnings.push(format!(
                        "{file}:{line}: address {v4} has bits outside its mask: no client matches it"
                    ));
                }
                Address::V4 { base, mask }
            }
            IpAddr::V6(v6) => {
                let base = u128::from(v6);
                if base & !mask != 0 {
                    warnings.push(format!(
                        "{file}:{line}: address {} has bits outside its mask: no client matches it",
                        Ipv6Addr::from(base)
                    ));
                }
                Address::V6 { base, mask }
            }
        };
        Ok(a)
    }
}

/// A mask of `bits` leading ones in a `width`-bit address (low bits of the u128).
fn prefix_mask(bits: u32, width: u32) -> u128 {
    let full: u128 = if width == 128 {
        u128::MAX
    } else {
        (1u128 << width) - 1
    };
    if bits == 0 {
        0
    } else {
        full & !((1u128 << (width - bits)) - 1)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Database,
    User,
}

impl Field {
    fn what(self) -> &'static str {
        match self {
            Field::Database => "database field",
            Field::User => "user field",
        }
    }
}

/// Add an unquoted word of a name field: a keyword, an `@file`, or a name.
fn add_word(
    names: &mut Names,
    w: &str,
    field: Field,
    path: &Path,
    read: &mut dyn FnMut(&Path) -> Result<String, HbaError>,
    depth: usize,
) -> Result<(), String> {
    match (field, w) {
        (_, "all") => names.all = true,
        (Field::Database, "sameuser") => names.sameuser = true,
        (Field::Database, "replication") => names.replication = true,
        (Field::Database, k @ ("samerole" | "samegroup")) => {
            return Err(format!("\"{k}\" is not supported"));
        }
        (_, w) if w.starts_with('+') => {
            return Err(format!(
                "group names (\"{w}\") are not supported, as in PgBouncer"
            ));
        }
        (_, w) if w.starts_with('@') => {
            if depth >= MAX_INCLUDE_DEPTH {
                return Err(format!("{w}: @files nested too deep"));
            }
            let included = match path.parent() {
                Some(dir) => dir.join(&w[1..]),
                None => PathBuf::from(&w[1..]),
            };
            let text = read(&included).map_err(|e| format!("{w}: {e}"))?;
            for (i, line) in text.lines().enumerate() {
                let at = |m: String| format!("{w}: {}:{}: {m}", included.display(), i + 1);
                for t in tokenize(line).map_err(at)? {
                    match t {
                        Token::Comma => {}
                        Token::Quoted(n) => {
                            names.names.insert(n);
                        }
                        Token::Word(w2) => {
                            add_word(names, &w2, field, &included, read, depth + 1).map_err(at)?
                        }
                    }
                }
            }
        }
        (_, name) => {
            names.names.insert(name.to_string());
        }
    }
    Ok(())
}

fn show(t: &Token) -> String {
    match t {
        Token::Word(w) => format!("\"{w}\""),
        Token::Quoted(q) => format!("\"{q}\" (quoted)"),
        Token::Comma => "\",\"".into(),
    }
}

#[cfg(test)]
mod tests;
