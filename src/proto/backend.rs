//! Server ("backend") messages: builders for what pgcarpool says to clients, views of what
//! servers say that pgcarpool acts on.
use bytes::{BufMut, BytesMut};

use super::{ProtoError, Reader};

pub const AUTHENTICATION: u8 = b'R';
pub const PARAMETER_STATUS: u8 = b'S';
pub const BACKEND_KEY_DATA: u8 = b'K';
pub const NEGOTIATE_PROTOCOL_VERSION: u8 = b'v';
pub const READY_FOR_QUERY: u8 = b'Z';
pub const ERROR_RESPONSE: u8 = b'E';
pub const NOTICE_RESPONSE: u8 = b'N';
pub const COMMAND_COMPLETE: u8 = b'C';
pub const PARSE_COMPLETE: u8 = b'1';
pub const CLOSE_COMPLETE: u8 = b'3';
pub const BIND_COMPLETE: u8 = b'2';
pub const NO_DATA: u8 = b'n';
pub const PARAMETER_DESCRIPTION: u8 = b't';
pub const PORTAL_SUSPENDED: u8 = b's';
pub const COPY_IN_RESPONSE: u8 = b'G';
pub const COPY_OUT_RESPONSE: u8 = b'H';
pub const COPY_BOTH_RESPONSE: u8 = b'W';
pub const NOTIFICATION_RESPONSE: u8 = b'A';
pub const EMPTY_QUERY_RESPONSE: u8 = b'I';
pub const ROW_DESCRIPTION: u8 = b'T';
pub const DATA_ROW: u8 = b'D';

/// Start a tagged message; finish with `finish`.
#[inline]
fn begin(out: &mut BytesMut, tag: u8) -> usize {
    out.put_u8(tag);
    let at = out.len();
    out.put_i32(0);
    at
}

#[inline]
fn finish(out: &mut BytesMut, at: usize) {
    let len = (out.len() - at) as i32;
    out[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

fn cstr(out: &mut BytesMut, s: &str) {
    out.put_slice(s.as_bytes());
    out.put_u8(0);
}

pub fn authentication_ok(out: &mut BytesMut) {
    let at = begin(out, AUTHENTICATION);
    out.put_i32(0);
    finish(out, at);
}

/// NegotiateProtocolVersion: the newest protocol version spoken here (PostgreSQL sends the
/// whole version word, 3.0 = 196608, where the docs say "minor"), and the `_pq_.` startup
/// options not recognised.
pub fn negotiate_protocol_version(out: &mut BytesMut, newest: i32, unknown: &[&str]) {
    let at = begin(out, b'v');
    out.put_i32(newest);
    out.put_i32(i32::try_from(unknown.len()).unwrap_or(i32::MAX));
    for o in unknown {
        cstr(out, o);
    }
    finish(out, at);
}

pub fn authentication_cleartext(out: &mut BytesMut) {
    let at = begin(out, AUTHENTICATION);
    out.put_i32(3);
    finish(out, at);
}

pub fn authentication_md5(out: &mut BytesMut, salt: [u8; 4]) {
    let at = begin(out, AUTHENTICATION);
    out.put_i32(5);
    out.put_slice(&salt);
    finish(out, at);
}

pub fn authentication_sasl(out: &mut BytesMut, mechanisms: &[&str]) {
    let at = begin(out, AUTHENTICATION);
    out.put_i32(10);
    for m in mechanisms {
        cstr(out, m);
    }
    out.put_u8(0);
    finish(out, at);
}

pub fn authentication_sasl_continue(out: &mut BytesMut, data: &[u8]) {
    let at = begin(out, AUTHENTICATION);
    out.put_i32(11);
    out.put_slice(data);
    finish(out, at);
}

pub fn authentication_sasl_final(out: &mut BytesMut, data: &[u8]) {
    let at = begin(out, AUTHENTICATION);
    out.put_i32(12);
    out.put_slice(data);
    finish(out, at);
}

pub fn parameter_status(out: &mut BytesMut, name: &str, value: &str) {
    let at = begin(out, PARAMETER_STATUS);
    cstr(out, name);
    cstr(out, value);
    finish(out, at);
}

pub fn backend_key_data(out: &mut BytesMut, pid: i32, secret: i32) {
    backend_key_data_long(out, pid, secret, &[]);
}

/// BackendKeyData whose secret is `secret`'s 4 bytes then `rest` (protocol 3.2).
pub fn backend_key_data_long(out: &mut BytesMut, pid: i32, secret: i32, rest: &[u8]) {
    let at = begin(out, BACKEND_KEY_DATA);
    out.put_i32(pid);
    out.put_i32(secret);
    out.put_slice(rest);
    finish(out, at);
}

pub fn ready_for_query(out: &mut BytesMut, status: u8) {
    let at = begin(out, READY_FOR_QUERY);
    out.put_u8(status);
    finish(out, at);
}

pub fn parse_complete(out: &mut BytesMut) {
    let at = begin(out, PARSE_COMPLETE);
    finish(out, at);
}

pub fn close_complete(out: &mut BytesMut) {
    let at = begin(out, CLOSE_COMPLETE);
    finish(out, at);
}

/// ParameterDescription (`params`: its body, the count and the type OIDs), then NoData: a
/// statement without a result described.
pub fn described_without_result(out: &mut BytesMut, params: &[u8]) {
    let at = begin(out, PARAMETER_DESCRIPTION);
    out.put_slice(params);
    finish(out, at);
    let at = begin(out, NO_DATA);
    finish(out, at);
}

pub fn command_complete(out: &mut BytesMut, tag: &str) {
    let at = begin(out, COMMAND_COMPLETE);
    cstr(out, tag);
    finish(out, at);
}

pub fn empty_query_response(out: &mut BytesMut) {
    let at = begin(out, EMPTY_QUERY_RESPONSE);
    finish(out, at);
}

/// An ErrorResponse (or NoticeResponse with `tag = b'N'`) with severity, SQLSTATE and message.
pub fn error_fields(out: &mut BytesMut, tag: u8, severity: &str, code: &str, message: &str) {
    let at = begin(out, tag);
    out.put_u8(b'S');
    cstr(out, severity);
    out.put_u8(b'V');
    cstr(out, severity);
    out.put_u8(b'C');
    cstr(out, code);
    out.put_u8(b'M');
    cstr(out, message);
    out.put_u8(0);
    finish(out, at);
}

/// ErrorResponse.
pub fn error_response(out: &mut BytesMut, severity: &str, code: &str, message: &str) {
    error_fields(out, ERROR_RESPONSE, severity, code, message);
}

/// RowDescription with text columns (admin console).
pub fn row_description(out: &mut BytesMut, columns: &[(&str, u32)]) {
    let at = begin(out, ROW_DESCRIPTION);
    out.put_i16(columns.len() as i16);
    for (name, type_oid) in columns {
        cstr(out, name);
        out.put_i32(0);
        out.put_i16(0);
        out.put_u32(*type_oid);
        out.put_i16(-1);
        out.put_i32(-1);
        out.put_i16(0);
    }
    finish(out, at);
}

/// DataRow of text values (None = NULL).
pub fn data_row<'a>(out: &mut BytesMut, values: impl ExactSizeIterator<Item = Option<&'a str>>) {
    let at = begin(out, DATA_ROW);
    out.put_i16(values.len() as i16);
    for v in values {
        match v {
            None => out.put_i32(-1),
            Some(s) => {
                out.put_i32(s.len() as i32);
                out.put_slice(s.as_bytes());
            }
        }
    }
    finish(out, at);
}

/// An Authentication request from a server.
#[derive(Debug, PartialEq, Eq)]
pub enum AuthRequest<'a> {
    Ok,
    Cleartext,
    Md5([u8; 4]),
    Sasl(Vec<&'a str>),
    SaslContinue(&'a [u8]),
    SaslFinal(&'a [u8]),
    Other(i32),
}

pub fn parse_auth(body: &[u8]) -> Result<AuthRequest<'_>, ProtoError> {
    let mut r = Reader::new(body, "Authentication");
    Ok(match r.i32()? {
        0 => AuthRequest::Ok,
        3 => AuthRequest::Cleartext,
        5 => {
            let s = r.bytes(4)?;
            AuthRequest::Md5([s[0], s[1], s[2], s[3]])
        }
        10 => {
            let mut mechs = Vec::new();
            loop {
                let m = r.cstr()?;
                if m.is_empty() {
                    break;
                }
                mechs.push(m);
            }
            AuthRequest::Sasl(mechs)
        }
        11 => AuthRequest::SaslContinue(r.remaining()),
        12 => AuthRequest::SaslFinal(r.remaining()),
        n => AuthRequest::Other(n),
    })
}

pub fn parse_parameter_status(body: &[u8]) -> Result<(&str, &str), ProtoError> {
    let mut r = Reader::new(body, "ParameterStatus");
    Ok((r.cstr()?, r.cstr()?))
}

pub fn parse_backend_key_data(body: &[u8]) -> Result<(i32, i32), ProtoError> {
    Ok(parse_backend_key_data_long(body)?.0)
}

/// BackendKeyData of any protocol: (pid, the secret's first 4 bytes) and the rest of a
/// protocol 3.2 secret (empty for 4 bytes). A secret over 256 bytes is an error.
pub fn parse_backend_key_data_long(body: &[u8]) -> Result<((i32, i32), &[u8]), ProtoError> {
    let mut r = Reader::new(body, "BackendKeyData");
    let key = (r.i32()?, r.i32()?);
    let rest = r.remaining();
    if rest.len() > super::startup::MAX_CANCEL_SECRET - 4 {
        return Err(ProtoError::Malformed("BackendKeyData"));
    }
    Ok((key, rest))
}

/// The fields of an ErrorResponse/NoticeResponse we report: severity, SQLSTATE, message.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ErrorFields {
    pub severity: String,
    pub code: String,
    pub message: String,
}

/// The SQLSTATE of an ErrorResponse body, without allocating (None: malformed or absent).
pub fn error_code(body: &[u8]) -> Option<[u8; 5]> {
    let mut r = Reader::new(body, "ErrorResponse");
    loop {
        let t = r.u8().ok()?;
        if t == 0 {
            return None;
        }
        let v = r.cstr_bytes().ok()?;
        if t == b'C' {
            return v.try_into().ok();
        }
    }
}

/// One field (`S`, `V`, `C`, `M`, `R`…) of an ErrorResponse or NoticeResponse body,
/// without allocating (None: absent or malformed).
pub fn error_field(body: &[u8], tag: u8) -> Option<&[u8]> {
    let mut r = Reader::new(body, "ErrorResponse");
    loop {
        let t = r.u8().ok()?;
        if t == 0 {
            return None;
        }
        let v = r.cstr_bytes().ok()?;
        if t == tag {
            return Some(v);
        }
    }
}

pub fn parse_error(body: &[u8]) -> Result<ErrorFields, ProtoError> {
    let mut r = Reader::new(body, "ErrorResponse");
    let mut e = ErrorFields::default();
    loop {
        let t = r.u8()?;
        if t == 0 {
            break;
        }
        let v = String::from_utf8_lossy(r.cstr_bytes()?).into_owned();
        match t {
            b'V' => e.severity = v,
            b'S' if e.severity.is_empty() => e.severity = v,
            b'C' => e.code = v,
            b'M' => e.message = v,
            _ => {}
        }
    }
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::header;

    #[test]
    fn error_roundtrip() {
        let mut b = BytesMut::new();
        error_response(&mut b, "FATAL", "28P01", "password authentication failed");
        let h = header(&b, 1000).unwrap().unwrap();
        assert_eq!(h.tag, b'E');
        assert_eq!(h.total, b.len());
        let e = parse_error(&b[5..]).unwrap();
        assert_eq!(e.code, "28P01");
        assert_eq!(error_code(&b[5..]), Some(*b"28P01"));
        assert_eq!(error_code(b"Mno code\0\0"), None);
        assert_eq!(error_code(b"Cxx"), None);
        assert_eq!(e.severity, "FATAL");
    }

    /// Each builder's exact bytes: tag, length, body.
    #[test]
    fn builders_write_the_documented_bytes() {
        type Build = fn(&mut BytesMut);
        let cases: Vec<(Build, &[u8])> = vec![
            (authentication_ok, b"R\0\0\0\x08\0\0\0\0"),
            (authentication_cleartext, b"R\0\0\0\x08\0\0\0\x03"),
            (
                |b| authentication_md5(b, *b"salt"),
                b"R\0\0\0\x0c\0\0\0\x05salt",
            ),
            (
                |b| authentication_sasl_continue(b, b"r=abc"),
                b"R\0\0\0\x0d\0\0\0\x0br=abc",
            ),
            (
                |b| authentication_sasl_final(b, b"v=xyz"),
                b"R\0\0\0\x0d\0\0\0\x0cv=xyz",
            ),
            (
                |b| backend_key_data(b, 7, -2),
                b"K\0\0\0\x0c\0\0\0\x07\xff\xff\xff\xfe",
            ),
            (|b| ready_for_query(b, b'T'), b"Z\0\0\0\x05T"),
            (parse_complete, b"1\0\0\0\x04"),
            (close_complete, b"3\0\0\0\x04"),
            (|b| command_complete(b, "SET"), b"C\0\0\0\x08SET\0"),
            (empty_query_response, b"I\0\0\0\x04"),
            (
                |b| error_fields(b, NOTICE_RESPONSE, "WARNING", "01000", "m"),
                b"N\0\0\0\x21SWARNING\0VWARNING\0C01000\0Mm\0\0",
            ),
        ];
        for (build, want) in cases {
            let mut b = BytesMut::from(&b"x"[..]);
            build(&mut b);
            assert_eq!(&b[1..], want, "{:?}", String::from_utf8_lossy(want));
        }
    }

    #[test]
    fn row_description_and_data_row_bytes() {
        let mut b = BytesMut::new();
        row_description(&mut b, &[("a", 25)]);
        assert_eq!(
            &b[..],
            b"T\0\0\0\x1a\0\x01a\0\0\0\0\0\0\0\0\0\0\x19\xff\xff\xff\xff\xff\xff\0\0"
        );
        let mut b = BytesMut::new();
        data_row(&mut b, [Some("xy"), None].into_iter());
        assert_eq!(&b[..], b"D\0\0\0\x10\0\x02\0\0\0\x02xy\xff\xff\xff\xff");
    }

    #[test]
    fn auth_requests_parse() {
        let parsed = |build: fn(&mut BytesMut)| {
            let mut b = BytesMut::new();
            build(&mut b);
            let h = header(&b, 1000).unwrap().unwrap();
            assert_eq!((h.tag, h.total), (AUTHENTICATION, b.len()));
            format!("{:?}", parse_auth(&b[5..]).unwrap())
        };
        assert_eq!(parsed(authentication_ok), "Ok");
        assert_eq!(parsed(authentication_cleartext), "Cleartext");
        assert_eq!(
            parsed(|b| authentication_md5(b, [1, 2, 3, 4])),
            "Md5([1, 2, 3, 4])"
        );
        assert_eq!(
            parse_auth(b"\0\0\0\x0br=1").unwrap(),
            AuthRequest::SaslContinue(b"r=1")
        );
        assert_eq!(
            parse_auth(b"\0\0\0\x0cv=1").unwrap(),
            AuthRequest::SaslFinal(b"v=1")
        );
        assert_eq!(parse_auth(b"\0\0\0\x07").unwrap(), AuthRequest::Other(7));
        let mut b = BytesMut::new();
        authentication_sasl(&mut b, &["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"]);
        assert_eq!(
            parse_auth(&b[5..]).unwrap(),
            AuthRequest::Sasl(vec!["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"])
        );
    }

    #[test]
    fn backend_key_data_parse() {
        let mut b = BytesMut::new();
        backend_key_data(&mut b, 1234, -5678);
        assert_eq!(parse_backend_key_data(&b[5..]), Ok((1234, -5678)));
        assert!(parse_backend_key_data(&b[5..12]).is_err());
        // Protocol 3.2: a 32-byte secret, and one too long.
        let mut b = BytesMut::new();
        backend_key_data_long(&mut b, 1, 2, &[7; 28]);
        assert_eq!(
            parse_backend_key_data_long(&b[5..]),
            Ok(((1, 2), &[7u8; 28][..]))
        );
        let mut b = BytesMut::new();
        backend_key_data_long(&mut b, 1, 2, &[7; 253]);
        assert!(parse_backend_key_data_long(&b[5..]).is_err());
    }

    #[test]
    fn parse_error_prefers_the_unlocalized_severity() {
        // S (localized) then V (never localized): V wins, in either order.
        let e = parse_error(b"SFEHLER\0VERROR\0C42P01\0Mno\0\0").unwrap();
        assert_eq!(
            e,
            ErrorFields {
                severity: "ERROR".into(),
                code: "42P01".into(),
                message: "no".into()
            }
        );
        let e = parse_error(b"VERROR\0SFEHLER\0Dignored\0\0").unwrap();
        assert_eq!(e.severity, "ERROR");
        // Only S (before PostgreSQL 9.6).
        assert_eq!(parse_error(b"SFATAL\0\0").unwrap().severity, "FATAL");
        assert!(parse_error(b"SFATAL\0").is_err());
        assert!(parse_error(b"SFATAL").is_err());
    }

    #[test]
    fn error_code_skips_other_fields() {
        assert_eq!(error_code(b"SERROR\0C57P01\0Mbye\0\0"), Some(*b"57P01"));
        assert_eq!(error_code(b"SERROR\0C5\0\0"), None);
        assert_eq!(error_code(b""), None);
    }

    #[test]
    fn auth_parse() {
        let mut b = BytesMut::new();
        authentication_sasl(&mut b, &["SCRAM-SHA-256"]);
        assert_eq!(
            parse_auth(&b[5..]).unwrap(),
            AuthRequest::Sasl(vec!["SCRAM-SHA-256"])
        );
        assert!(parse_auth(&[0, 0, 0, 5, 1]).is_err());
    }

    #[test]
    fn parameter_status_parse() {
        let mut b = BytesMut::new();
        parameter_status(&mut b, "TimeZone", "UTC");
        assert_eq!(
            parse_parameter_status(&b[5..]).unwrap(),
            ("TimeZone", "UTC")
        );
        assert!(parse_parameter_status(b"abc").is_err());
    }
}
