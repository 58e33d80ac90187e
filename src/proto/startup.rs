//! Untagged startup-phase packets: StartupMessage, SSLRequest, GSSENCRequest, CancelRequest.
use bytes::{BufMut, BytesMut};

use super::{ProtoError, Reader};

/// PostgreSQL's own limit on a startup packet.
pub const MAX_STARTUP_LEN: usize = 10_000;

pub const PROTOCOL_3_0: i32 = 196_608;
/// The newest minor version of protocol 3 spoken here: 3.2 (PostgreSQL 18), whose cancel
/// keys may be longer than 4 bytes.
pub const NEWEST_MINOR: u16 = 2;
/// Longest secret of a cancel key in protocol 3.2.
pub const MAX_CANCEL_SECRET: usize = 256;
const CANCEL_REQUEST_CODE: i32 = 80_877_102;
const SSL_REQUEST_CODE: i32 = 80_877_103;
/// An SSLRequest packet, as sent to a server.
pub const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
const GSSENC_REQUEST_CODE: i32 = 80_877_104;

/// The first packet a client sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartupPacket {
    /// Protocol 3.x startup with its parameters (user, database, options, GUCs…), in order.
    Startup {
        minor: u16,
        params: Vec<(String, String)>,
    },
    SslRequest,
    GssEncRequest,
    /// A CancelRequest: the process id, the secret's first 4 bytes, and the rest of a
    /// protocol 3.2 secret (empty for a 4-byte one).
    Cancel {
        pid: i32,
        secret: i32,
        rest: Vec<u8>,
    },
}

/// Parse one startup packet from the front of `buf`: `Ok(None)` while incomplete, else the
/// packet and how many bytes it took.
pub fn parse(buf: &[u8]) -> Result<Option<(StartupPacket, usize)>, ProtoError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = i32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if len < 8 {
        return Err(ProtoError::BadLength(len.into()));
    }
    let len = len as usize;
    if len > MAX_STARTUP_LEN {
        return Err(ProtoError::TooLong(len));
    }
    if buf.len() < len {
        return Ok(None);
    }
    let mut r = Reader::new(&buf[4..len], "startup");
    let code = r.i32()?;
    let packet = match code {
        SSL_REQUEST_CODE if len == 8 => StartupPacket::SslRequest,
        GSSENC_REQUEST_CODE if len == 8 => StartupPacket::GssEncRequest,
        CANCEL_REQUEST_CODE if (16..=12 + MAX_CANCEL_SECRET).contains(&len) => {
            let pid = r.i32()?;
            let secret = r.i32()?;
            let rest = r.remaining().to_vec();
            StartupPacket::Cancel { pid, secret, rest }
        }
        SSL_REQUEST_CODE | GSSENC_REQUEST_CODE | CANCEL_REQUEST_CODE => {
            return Err(ProtoError::Malformed("startup"));
        }
        _ => {
            let major = (code >> 16) as u16;
            let minor = (code & 0xffff) as u16;
            if major != 3 {
                return Err(ProtoError::UnsupportedVersion(major, minor));
            }
            let mut params = Vec::new();
            loop {
                let key = r.cstr()?;
                if key.is_empty() {
                    break;
                }
                let value = r.cstr()?;
                params.push((key.to_string(), value.to_string()));
            }
            if !r.is_empty() {
                return Err(ProtoError::Malformed("startup"));
            }
            StartupPacket::Startup { minor, params }
        }
    };
    Ok(Some((packet, len)))
}

/// Build a protocol 3.0 StartupMessage.
pub fn startup_message(out: &mut BytesMut, params: &[(&str, &str)]) {
    startup_message_minor(out, 0, params);
}

/// Build a protocol 3.`minor` StartupMessage.
pub fn startup_message_minor(out: &mut BytesMut, minor: u16, params: &[(&str, &str)]) {
    let start = out.len();
    out.put_i32(0);
    out.put_i32(PROTOCOL_3_0 + i32::from(minor));
    for (k, v) in params {
        out.put_slice(k.as_bytes());
        out.put_u8(0);
        out.put_slice(v.as_bytes());
        out.put_u8(0);
    }
    out.put_u8(0);
    let len = (out.len() - start) as i32;
    out[start..start + 4].copy_from_slice(&len.to_be_bytes());
}

/// Build a CancelRequest with a 4-byte secret.
pub fn cancel_request(out: &mut BytesMut, pid: i32, secret: i32) {
    cancel_request_long(out, pid, secret, &[]);
}

/// Build a CancelRequest whose secret is `secret`'s 4 bytes then `rest` (protocol 3.2;
/// the caller keeps the whole within MAX_CANCEL_SECRET).
pub fn cancel_request_long(out: &mut BytesMut, pid: i32, secret: i32, rest: &[u8]) {
    let len = i32::try_from(16 + rest.len()).unwrap_or(i32::MAX);
    out.put_i32(len);
    out.put_i32(CANCEL_REQUEST_CODE);
    out.put_i32(pid);
    out.put_i32(secret);
    out.put_slice(rest);
}

/// Parse libpq's `options` startup parameter into `-c name=value` / `--name=value` pairs.
/// Anything else in it is an error (we cannot pass arbitrary server options through a pool).
pub fn parse_options(options: &str) -> Result<Vec<(String, String)>, String> {
    // Split on unescaped whitespace; backslash escapes the next char.
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut chars = options.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            c if c.is_whitespace() => {
                if !cur.is_empty() {
                    words.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        words.push(cur);
    }
    let mut out = Vec::new();
    let mut it = words.into_iter();
    while let Some(w) = it.next() {
        let setting = if w == "-c" {
            it.next()
                .ok_or_else(|| "missing setting after -c".to_string())?
        } else if let Some(s) = w.strip_prefix("-c") {
            s.to_string()
        } else if let Some(s) = w.strip_prefix("--") {
            s.to_string()
        } else {
            return Err(format!("unsupported option in options: {w}"));
        };
        let (k, v) = setting
            .split_once('=')
            .ok_or_else(|| format!("option {setting} has no value"))?;
        out.push((k.replace('-', "_"), v.to_string()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_startup_message() {
        let mut b = BytesMut::new();
        startup_message(&mut b, &[("user", "bob"), ("database", "db")]);
        let (p, n) = parse(&b).unwrap().unwrap();
        assert_eq!(n, b.len());
        assert_eq!(
            p,
            StartupPacket::Startup {
                minor: 0,
                params: vec![
                    ("user".into(), "bob".into()),
                    ("database".into(), "db".into())
                ]
            }
        );
        assert_eq!(parse(&b[..b.len() - 1]).unwrap(), None);
    }

    #[test]
    fn startup_message_after_other_bytes() {
        let mut b = BytesMut::from(&b"xyz"[..]);
        startup_message(&mut b, &[("user", "u")]);
        assert_eq!(&b[3..], b"\0\0\0\x10\0\x03\0\0user\0u\0\0");
    }

    #[test]
    fn parses_cancel_and_ssl() {
        let mut b = BytesMut::new();
        cancel_request(&mut b, 7, -9);
        assert_eq!(
            parse(&b).unwrap().unwrap().0,
            StartupPacket::Cancel {
                pid: 7,
                secret: -9,
                rest: Vec::new()
            }
        );
        let ssl = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
        assert_eq!(parse(&ssl).unwrap().unwrap().0, StartupPacket::SslRequest);
    }

    #[test]
    fn parses_gssenc_request_and_consumes_only_the_packet() {
        let mut b = vec![0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x30];
        b.extend_from_slice(b"next");
        assert_eq!(parse(&b).unwrap(), Some((StartupPacket::GssEncRequest, 8)));
    }

    #[test]
    fn special_codes_with_the_wrong_length_are_malformed() {
        // SSLRequest, GSSENCRequest padded to 12 bytes; a CancelRequest of 12 bytes.
        for code in [[0x04, 0xd2, 0x16, 0x2f], [0x04, 0xd2, 0x16, 0x30]] {
            let mut b = vec![0, 0, 0, 12];
            b.extend_from_slice(&code);
            b.extend_from_slice(&[0; 4]);
            assert_eq!(parse(&b), Err(ProtoError::Malformed("startup")));
        }
        let b = [0, 0, 0, 12, 0x04, 0xd2, 0x16, 0x2e, 0, 0, 0, 1];
        assert_eq!(parse(&b), Err(ProtoError::Malformed("startup")));
        // A CancelRequest whose secret is longer than 256 bytes.
        let mut b = BytesMut::new();
        cancel_request_long(&mut b, 1, 2, &[3; MAX_CANCEL_SECRET - 3]);
        assert_eq!(parse(&b), Err(ProtoError::Malformed("startup")));
    }

    #[test]
    fn parses_cancel_requests_with_long_keys() {
        // Protocol 3.2: a secret of 5 to 256 bytes.
        for rest in [vec![9u8], vec![7; 28], vec![1; MAX_CANCEL_SECRET - 4]] {
            let mut b = BytesMut::new();
            cancel_request_long(&mut b, 7, -9, &rest);
            assert_eq!(b.len(), 16 + rest.len());
            assert_eq!(
                parse(&b).unwrap().unwrap(),
                (
                    StartupPacket::Cancel {
                        pid: 7,
                        secret: -9,
                        rest: rest.clone()
                    },
                    b.len()
                )
            );
        }
    }

    #[test]
    fn startup_limits() {
        // Length 7 (below the 8 of the smallest packet) and 10,001.
        assert_eq!(parse(&[0, 0, 0, 7, 0, 0, 0]), Err(ProtoError::BadLength(7)));
        assert_eq!(parse(&[0, 0, 0x27, 0x11]), Err(ProtoError::TooLong(10_001)));
        // Exactly 10,000 is read (once complete).
        assert_eq!(parse(&[0, 0, 0x27, 0x10]), Ok(None));
        // Fewer than 4 bytes: incomplete.
        assert_eq!(parse(&[0, 0, 0]), Ok(None));
    }

    #[test]
    fn startup_minor_version_and_trailing_bytes() {
        // Protocol 3.2 is read with its minor version.
        let b = [0, 0, 0, 9, 0, 3, 0, 2, 0];
        assert_eq!(
            parse(&b).unwrap(),
            Some((
                StartupPacket::Startup {
                    minor: 2,
                    params: vec![]
                },
                9
            ))
        );
        // Protocol 4.0 is not.
        assert_eq!(
            parse(&[0, 0, 0, 9, 0, 4, 0, 0, 0]),
            Err(ProtoError::UnsupportedVersion(4, 0))
        );
        // Bytes after the terminating NUL.
        assert_eq!(
            parse(&[0, 0, 0, 10, 0, 3, 0, 0, 0, 0]),
            Err(ProtoError::Malformed("startup"))
        );
    }

    #[test]
    fn options_errors() {
        assert_eq!(
            parse_options("-c"),
            Err("missing setting after -c".to_string())
        );
        assert_eq!(
            parse_options("--x"),
            Err("option x has no value".to_string())
        );
        assert_eq!(
            parse_options("  -c  a=1   "),
            Ok(vec![("a".into(), "1".into())])
        );
        assert_eq!(parse_options(""), Ok(vec![]));
        // A trailing backslash escapes nothing.
        assert_eq!(parse_options("-ca=1\\"), Ok(vec![("a".into(), "1".into())]));
    }

    #[test]
    fn rejects_bad_packets() {
        assert!(parse(&[0, 0, 0, 3]).is_err());
        assert!(parse(&[0, 1, 0, 0]).is_err()); // 65536 > limit
        assert!(parse(&[0, 0, 0, 8, 0, 2, 0, 0]).is_err()); // protocol 2
        // unterminated parameter list
        assert!(parse(&[0, 0, 0, 10, 0, 3, 0, 0, b'u', 0]).is_err());
    }

    #[test]
    fn options_parse() {
        assert_eq!(
            parse_options("-c search_path=a,b --statement-timeout=5s -csome.x=1").unwrap(),
            vec![
                ("search_path".into(), "a,b".into()),
                ("statement_timeout".into(), "5s".into()),
                ("some.x".into(), "1".into())
            ]
        );
        assert_eq!(
            parse_options(r"-c x=a\ b").unwrap(),
            vec![("x".into(), "a b".into())]
        );
        assert!(parse_options("-F").is_err());
    }
}
