//! The wire form of a client session moving to the new process in an online restart: who
//! the client is (user, database, address, connect time, cancel key), its virtual session
//! (settings, startup parameters, prepared statements, the unnamed statement) and the bytes
//! it sent that were read and not yet acted on. Versioned: a process that does not know
//! the version refuses the session, which then stays with the old process.
//!
//! Layout: `PGCSESS\0`, u32 version, then the fields in the order of `MovedSession`, each
//! string or byte run as a u32 length and its bytes, each list as a u32 count and its items
//! (all integers big-endian). Version 2 adds the rest of a long cancel secret (protocol
//! 3.2) after the key; a session without one is still written as version 1, which every
//! pgcarpool since the format began reads.
use bytes::Bytes;

use crate::peers::key::KeyRest;

const MAGIC: &[u8; 8] = b"PGCSESS\0";
/// The newest layout, read along with the older ones; bumped whenever the layout changes.
pub const VERSION: u32 = 2;
/// The layout of the list of clients staying with the old process.
const STAY_VERSION: u32 = 1;
/// Most bytes one session may take (statements included); more is refused.
pub const MAX_LEN: usize = 64 * 1024 * 1024;

/// How the client is connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Tcp = 1,
    Unix = 2,
}

/// One client's session, as it moves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovedSession {
    pub transport: Transport,
    pub user: String,
    pub db: String,
    /// As SHOW CLIENTS shows it ("ip:port" or "unix").
    pub addr: String,
    /// Microseconds since the Unix epoch.
    pub connect_time_us: u64,
    /// The BackendKeyData the client was given (its cancel requests name it).
    pub key: (i32, i32),
    /// The rest of a protocol 3.2 client's secret, after `key`'s 4 bytes.
    pub key_rest: Option<KeyRest>,
    /// The session's settings.
    pub params: Vec<(String, String)>,
    /// The startup packet's parameters (what RESET ALL returns to, with the defaults).
    pub startup: Vec<(String, String)>,
    /// Named prepared statements: client name, Parse body after the name.
    pub statements: Vec<(Bytes, Bytes)>,
    /// The unnamed statement's Parse body after the name, if the client has one.
    pub unnamed: Option<Bytes>,
    /// SCRAM keys learned at the client's login, when the server login needs them.
    pub scram_keys: Option<([u8; 32], [u8; 32])>,
    /// Bytes read from the client and not acted on yet (the start of its next message).
    pub pending_input: Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("not a pgcarpool session")]
    Magic,
    #[error("session format version {0} is not known to this pgcarpool (it knows {VERSION})")]
    Version(u32),
    #[error("session data ends early")]
    Short,
    #[error("session data too long")]
    TooLong,
    #[error("invalid session data: {0}")]
    Invalid(&'static str),
}

impl MovedSession {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(256);
        w.extend_from_slice(MAGIC);
        let version: u32 = if self.key_rest.is_some() { 2 } else { 1 };
        w.extend_from_slice(&version.to_be_bytes());
        w.push(self.transport as u8);
        put_bytes(&mut w, self.user.as_bytes());
        put_bytes(&mut w, self.db.as_bytes());
        put_bytes(&mut w, self.addr.as_bytes());
        w.extend_from_slice(&self.connect_time_us.to_be_bytes());
        w.extend_from_slice(&self.key.0.to_be_bytes());
        w.extend_from_slice(&self.key.1.to_be_bytes());
        if let Some(rest) = &self.key_rest {
            w.extend_from_slice(rest);
        }
        for list in [&self.params, &self.startup] {
            put_count(&mut w, list.len());
            for (k, v) in list {
                put_bytes(&mut w, k.as_bytes());
                put_bytes(&mut w, v.as_bytes());
            }
        }
        put_count(&mut w, self.statements.len());
        for (name, rest) in &self.statements {
            put_bytes(&mut w, name);
            put_bytes(&mut w, rest);
        }
        match &self.unnamed {
            Some(u) => {
                w.push(1);
                put_bytes(&mut w, u);
            }
            None => w.push(0),
        }
        match &self.scram_keys {
            Some((c, s)) => {
                w.push(1);
                w.extend_from_slice(c);
                w.extend_from_slice(s);
            }
            None => w.push(0),
        }
        put_bytes(&mut w, &self.pending_input);
        w
    }

    pub fn decode(data: &[u8]) -> Result<MovedSession, DecodeError> {
        if data.len() > MAX_LEN {
            return Err(DecodeError::TooLong);
        }
        let mut r = Reader { data, at: 0 };
        if r.take(MAGIC.len())? != MAGIC {
            return Err(DecodeError::Magic);
        }
        let version = r.u32()?;
        if !(1..=VERSION).contains(&version) {
            return Err(DecodeError::Version(version));
        }
        let transport = match r.u8()? {
            1 => Transport::Tcp,
            2 => Transport::Unix,
            _ => return Err(DecodeError::Invalid("transport")),
        };
        let user = r.string()?;
        let db = r.string()?;
        let addr = r.string()?;
        let connect_time_us = u64::from_be_bytes(r.array()?);
        let key = (r.u32()? as i32, r.u32()? as i32);
        let key_rest = if version >= 2 { Some(r.array()?) } else { None };
        let params = r.pairs()?;
        let startup = r.pairs()?;
        let n = r.count()?;
        let mut statements = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            let name = Bytes::copy_from_slice(r.bytes()?);
            let rest = Bytes::copy_from_slice(r.bytes()?);
            statements.push((name, rest));
        }
        let unnamed = match r.u8()? {
            0 => None,
            1 => Some(Bytes::copy_from_slice(r.bytes()?)),
            _ => return Err(DecodeError::Invalid("unnamed statement flag")),
        };
        let scram_keys = match r.u8()? {
            0 => None,
            1 => Some((r.array()?, r.array()?)),
            _ => return Err(DecodeError::Invalid("SCRAM keys flag")),
        };
        let pending_input = Bytes::copy_from_slice(r.bytes()?);
        if r.at != data.len() {
            return Err(DecodeError::Invalid("trailing bytes"));
        }
        Ok(MovedSession {
            transport,
            user,
            db,
            addr,
            connect_time_us,
            key,
            key_rest,
            params,
            startup,
            statements,
            unnamed,
            scram_keys,
            pending_input,
        })
    }
}

pub use crate::shared::restart::StayingClient;

/// The clients still with the old process: `PGCSTAY\0`, u32 version, u32 count, then each
/// client's fields in order.
pub fn encode_staying(list: &[StayingClient]) -> Vec<u8> {
    let mut w = Vec::with_capacity(64 * list.len() + 16);
    w.extend_from_slice(STAY_MAGIC);
    w.extend_from_slice(&STAY_VERSION.to_be_bytes());
    put_count(&mut w, list.len());
    for c in list {
        put_bytes(&mut w, c.user.as_bytes());
        put_bytes(&mut w, c.db.as_bytes());
        put_bytes(&mut w, c.addr.as_bytes());
        w.extend_from_slice(&c.connect_time_us.to_be_bytes());
        w.extend_from_slice(&c.key.0.to_be_bytes());
        w.extend_from_slice(&c.key.1.to_be_bytes());
        put_bytes(&mut w, c.note.as_bytes());
    }
    w
}

pub fn decode_staying(data: &[u8]) -> Result<Vec<StayingClient>, DecodeError> {
    if data.len() > MAX_LEN {
        return Err(DecodeError::TooLong);
    }
    let mut r = Reader { data, at: 0 };
    if r.take(STAY_MAGIC.len())? != STAY_MAGIC {
        return Err(DecodeError::Magic);
    }
    let version = r.u32()?;
    if version != STAY_VERSION {
        return Err(DecodeError::Version(version));
    }
    let n = r.count()?;
    let mut out = Vec::with_capacity(n.min(1024));
    for _ in 0..n {
        out.push(StayingClient {
            user: r.string()?,
            db: r.string()?,
            addr: r.string()?,
            connect_time_us: u64::from_be_bytes(r.array()?),
            key: (r.u32()? as i32, r.u32()? as i32),
            note: r.string()?,
        });
    }
    if r.at != data.len() {
        return Err(DecodeError::Invalid("trailing bytes"));
    }
    Ok(out)
}

const STAY_MAGIC: &[u8; 8] = b"PGCSTAY\0";

fn put_count(w: &mut Vec<u8>, n: usize) {
    w.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes());
}

fn put_bytes(w: &mut Vec<u8>, b: &[u8]) {
    put_count(w, b.len());
    w.extend_from_slice(b);
}

struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.at.checked_add(n).ok_or(DecodeError::Short)?;
        let s = self.data.get(self.at..end).ok_or(DecodeError::Short)?;
        self.at = end;
        Ok(s)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array()?))
    }
    /// A length or count: never more than the bytes left (each item takes at least one).
    fn count(&mut self) -> Result<usize, DecodeError> {
        let n = usize::try_from(self.u32()?).map_err(|_| DecodeError::TooLong)?;
        if n > self.data.len() - self.at {
            return Err(DecodeError::Short);
        }
        Ok(n)
    }
    fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.count()?;
        self.take(n)
    }
    fn string(&mut self) -> Result<String, DecodeError> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| DecodeError::Invalid("UTF-8"))
    }
    fn pairs(&mut self) -> Result<Vec<(String, String)>, DecodeError> {
        let n = self.count()?;
        let mut v = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            v.push((self.string()?, self.string()?));
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> MovedSession {
        MovedSession {
            transport: Transport::Tcp,
            user: "app".into(),
            db: "shop".into(),
            addr: "127.0.0.1:51234".into(),
            connect_time_us: 1_790_000_000_123_456,
            key: (12345, -987654),
            key_rest: None,
            params: vec![
                ("search_path".into(), "a, \"b c\"".into()),
                ("application_name".into(), "ünïcode".into()),
            ],
            startup: vec![("client_encoding".into(), "UTF8".into())],
            statements: vec![
                (
                    Bytes::from_static(b"s1"),
                    Bytes::from_static(b"select $1\0\0\x01\0\0\0\x17"),
                ),
                (Bytes::from_static(b""), Bytes::new()),
            ],
            unnamed: Some(Bytes::from_static(b"select 2\0\0\0")),
            scram_keys: Some(([7; 32], [9; 32])),
            pending_input: Bytes::from_static(b"Q\0\0"),
        }
    }

    #[test]
    fn a_session_comes_back_as_it_went() {
        let s = sample();
        assert_eq!(MovedSession::decode(&s.encode()).unwrap(), s);
        let bare = MovedSession {
            transport: Transport::Unix,
            params: vec![],
            startup: vec![],
            statements: vec![],
            unnamed: None,
            scram_keys: None,
            pending_input: Bytes::new(),
            ..s
        };
        assert_eq!(MovedSession::decode(&bare.encode()).unwrap(), bare);
    }

    #[test]
    fn a_long_cancel_key_moves_along_in_version_2_and_a_short_one_in_version_1() {
        let short = sample().encode();
        assert_eq!(short[8..12], 1u32.to_be_bytes());
        let long = MovedSession {
            key_rest: Some([0xa5; crate::peers::key::KEY_REST_LEN]),
            ..sample()
        };
        let b = long.encode();
        assert_eq!(b[8..12], 2u32.to_be_bytes());
        assert_eq!(b.len(), short.len() + crate::peers::key::KEY_REST_LEN);
        assert_eq!(MovedSession::decode(&b).unwrap(), long);
        for cut in 0..b.len() {
            assert!(MovedSession::decode(&b[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn another_version_is_refused() {
        let mut b = sample().encode();
        b[8..12].copy_from_slice(&3u32.to_be_bytes());
        assert_eq!(MovedSession::decode(&b), Err(DecodeError::Version(3)));
        b[0] = b'X';
        assert_eq!(MovedSession::decode(&b), Err(DecodeError::Magic));
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let b = sample().encode();
        for cut in 0..b.len() {
            assert!(MovedSession::decode(&b[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = b.clone();
        long.push(0);
        assert!(MovedSession::decode(&long).is_err());
    }

    #[test]
    fn the_staying_list_comes_back_as_it_went() {
        let list = vec![
            StayingClient {
                user: "app".into(),
                db: "shop".into(),
                addr: "unix".into(),
                connect_time_us: 5,
                key: (1, -2),
                note: "pinned to its server".into(),
            },
            StayingClient {
                user: String::new(),
                db: "d".into(),
                addr: "127.0.0.1:5".into(),
                connect_time_us: u64::MAX,
                key: (i32::MAX, i32::MIN),
                note: String::new(),
            },
        ];
        let b = encode_staying(&list);
        assert_eq!(decode_staying(&b).unwrap(), list);
        assert_eq!(decode_staying(&encode_staying(&[])).unwrap(), vec![]);
        for cut in 0..b.len() {
            assert!(decode_staying(&b[..cut]).is_err(), "cut at {cut}");
        }
        assert_eq!(
            MovedSession::decode(&b),
            Err(DecodeError::Magic),
            "a list is not a session"
        );
    }

    #[test]
    fn huge_lengths_are_refused_without_allocating() {
        let mut b = sample().encode();
        // The user name's length claims 4 GiB.
        b[13..17].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(MovedSession::decode(&b), Err(DecodeError::Short));
    }
}
