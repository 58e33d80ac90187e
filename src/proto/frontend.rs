//! Client ("frontend") messages: views of what clients send that pgcarpool inspects, and
//! builders for what pgcarpool sends to servers.
use bytes::{BufMut, BytesMut};

use super::{Header, ProtoError, Reader};

pub const QUERY: u8 = b'Q';
pub const PARSE: u8 = b'P';
pub const BIND: u8 = b'B';
pub const DESCRIBE: u8 = b'D';
pub const EXECUTE: u8 = b'E';
pub const CLOSE: u8 = b'C';
pub const SYNC: u8 = b'S';
pub const FLUSH: u8 = b'H';
pub const TERMINATE: u8 = b'X';
pub const FUNCTION_CALL: u8 = b'F';
pub const COPY_DATA: u8 = b'd';
pub const COPY_DONE: u8 = b'c';
pub const COPY_FAIL: u8 = b'f';
pub const PASSWORD: u8 = b'p';

/// PostgreSQL's bound on the length word of a message that holds no SQL or data
/// (`PQ_SMALL_MESSAGE_LIMIT`).
pub const SMALL_MESSAGE_LIMIT: usize = 10_000;
/// PostgreSQL's bound on the length word of a Query, FunctionCall, Parse, Bind or CopyData
/// (`PQ_LARGE_MESSAGE_LIMIT`: `MaxAllocSize - 1`).
pub const LARGE_MESSAGE_LIMIT: usize = 0x3fff_fffe;

/// The largest length word PostgreSQL reads for a message of type `tag` from a logged-in
/// client, or None: a type it never accepts there (it answers FATAL 08P01 "invalid
/// frontend message type N" on the type byte alone and closes). A length word above the
/// bound or below 4 makes it close the connection.
pub fn max_len(tag: u8) -> Option<usize> {
    match tag {
        QUERY | FUNCTION_CALL | PARSE | BIND | COPY_DATA => Some(LARGE_MESSAGE_LIMIT),
        CLOSE | DESCRIBE | EXECUTE | FLUSH | SYNC | TERMINATE | COPY_DONE | COPY_FAIL => {
            Some(SMALL_MESSAGE_LIMIT)
        }
        _ => None,
    }
}

/// The header of the message a logged-in client sent at the start of `buf`, checked as
/// PostgreSQL checks it before reading the body (`SocketBackend`, `pq_getmessage`): a type
/// it does not accept is an error from its first byte; a length word below 4 or above the
/// type's bound is an error. `Ok(None)`: fewer than 5 bytes of a known type.
/// (Inside COPY FROM STDIN PostgreSQL reads with other rules; this is for outside it.)
#[inline]
pub fn header(buf: &[u8]) -> Result<Option<Header>, ProtoError> {
    let Some(&tag) = buf.first() else {
        return Ok(None);
    };
    let Some(limit) = max_len(tag) else {
        return Err(ProtoError::UnknownType(tag));
    };
    let Some(h) = super::header(buf, limit + 1).map_err(|e| match e {
        // The length word itself, as PostgreSQL reports it.
        ProtoError::TooLong(total) => ProtoError::BadLength(total as i64 - 1),
        e => e,
    })?
    else {
        return Ok(None);
    };
    Ok(Some(h))
}

fn begin(out: &mut BytesMut, tag: u8) -> usize {
    out.put_u8(tag);
    let at = out.len();
    out.put_i32(0);
    at
}

fn finish(out: &mut BytesMut, at: usize) {
    let len = (out.len() - at) as i32;
    out[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

/// A simple Query.
pub fn query(out: &mut BytesMut, sql: &str) {
    query_of(out, &[sql]);
}

/// A Query of the text that is `parts` one after the other.
pub fn query_of(out: &mut BytesMut, parts: &[&str]) {
    let at = begin(out, QUERY);
    for p in parts {
        out.put_slice(p.as_bytes());
    }
    out.put_u8(0);
    finish(out, at);
}

/// Parse, Bind, Execute and Sync of `sql` on the unnamed statement and portal, with text
/// parameters `params` (None: NULL) and text results: one extended-protocol query.
pub fn extended_query(out: &mut BytesMut, sql: &str, params: &[Option<&str>]) {
    let at = begin(out, PARSE);
    out.put_u8(0); // unnamed statement
    out.put_slice(sql.as_bytes());
    out.put_u8(0);
    out.put_i16(0); // parameter types: all inferred
    finish(out, at);
    let at = begin(out, BIND);
    out.put_u8(0); // unnamed portal
    out.put_u8(0); // unnamed statement
    out.put_i16(0); // parameter formats: all text
    out.put_i16(params.len() as i16);
    for p in params {
        match p {
            Some(v) => {
                out.put_i32(v.len() as i32);
                out.put_slice(v.as_bytes());
            }
            None => out.put_i32(-1),
        }
    }
    out.put_i16(0); // result formats: all text
    finish(out, at);
    let at = begin(out, EXECUTE);
    out.put_u8(0); // unnamed portal
    out.put_i32(0); // no row limit
    finish(out, at);
    sync(out);
}

pub fn terminate(out: &mut BytesMut) {
    let at = begin(out, TERMINATE);
    finish(out, at);
}

pub fn sync(out: &mut BytesMut) {
    let at = begin(out, SYNC);
    finish(out, at);
}

/// PasswordMessage with a NUL-terminated password (cleartext or md5 response).
pub fn password(out: &mut BytesMut, pw: &[u8]) {
    let at = begin(out, PASSWORD);
    out.put_slice(pw);
    out.put_u8(0);
    finish(out, at);
}

pub fn sasl_initial_response(out: &mut BytesMut, mechanism: &str, data: &[u8]) {
    let at = begin(out, PASSWORD);
    out.put_slice(mechanism.as_bytes());
    out.put_u8(0);
    out.put_i32(data.len() as i32);
    out.put_slice(data);
    finish(out, at);
}

pub fn sasl_response(out: &mut BytesMut, data: &[u8]) {
    let at = begin(out, PASSWORD);
    out.put_slice(data);
    finish(out, at);
}

/// The password in a PasswordMessage body (without its NUL).
pub fn parse_password(body: &[u8]) -> Result<&[u8], ProtoError> {
    let mut r = Reader::new(body, "PasswordMessage");
    let pw = r.cstr_bytes()?;
    Ok(pw)
}

/// SASLInitialResponse body: mechanism and initial data.
pub fn parse_sasl_initial(body: &[u8]) -> Result<(&str, &[u8]), ProtoError> {
    let mut r = Reader::new(body, "SASLInitialResponse");
    let mech = r.cstr()?;
    let len = r.i32()?;
    let data = if len < 0 {
        &[][..]
    } else {
        r.bytes(usize::try_from(len).map_err(|_| ProtoError::Malformed("SASLInitialResponse"))?)?
    };
    Ok((mech, data))
}

/// The SQL text of a Query body.
pub fn parse_query(body: &[u8]) -> Result<&[u8], ProtoError> {
    Reader::new(body, "Query").cstr_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sasl_initial_roundtrip() {
        let mut b = BytesMut::new();
        sasl_initial_response(&mut b, "SCRAM-SHA-256", b"n,,n=,r=abc");
        assert_eq!(
            parse_sasl_initial(&b[5..]).unwrap(),
            ("SCRAM-SHA-256", &b"n,,n=,r=abc"[..])
        );
        assert!(parse_sasl_initial(b"SCRAM\0\0\0\0\x09abc").is_err());
    }

    #[test]
    fn builders_write_the_documented_bytes() {
        type Build = fn(&mut BytesMut);
        let cases: Vec<(Build, &[u8])> = vec![
            (|b| query(b, "select 1"), b"Q\0\0\0\x0dselect 1\0"),
            (terminate, b"X\0\0\0\x04"),
            (sync, b"S\0\0\0\x04"),
            (|b| password(b, b"pw"), b"p\0\0\0\x07pw\0"),
            (
                |b| sasl_initial_response(b, "M", b"ab"),
                b"p\0\0\0\x0cM\0\0\0\0\x02ab",
            ),
            (|b| sasl_response(b, b"c=biws"), b"p\0\0\0\x0ac=biws"),
            (
                |b| extended_query(b, "q $1", &[Some("ab"), None]),
                b"P\0\0\0\x0c\0q $1\0\0\0\
                  B\0\0\0\x16\0\0\0\0\0\x02\0\0\0\x02ab\xff\xff\xff\xff\0\0\
                  E\0\0\0\x09\0\0\0\0\0\
                  S\0\0\0\x04",
            ),
        ];
        for (build, want) in cases {
            let mut b = BytesMut::from(&b"x"[..]);
            build(&mut b);
            assert_eq!(&b[1..], want, "{:?}", String::from_utf8_lossy(want));
        }
    }

    #[test]
    fn query_parse() {
        let mut b = BytesMut::new();
        query(&mut b, "select 1");
        assert_eq!(parse_query(&b[5..]), Ok(&b"select 1"[..]));
        assert!(parse_query(b"select 1").is_err());
    }

    #[test]
    fn sasl_initial_without_data() {
        // Length -1: no initial response.
        assert_eq!(
            parse_sasl_initial(b"SCRAM-SHA-256\0\xff\xff\xff\xff"),
            Ok(("SCRAM-SHA-256", &b""[..]))
        );
        assert_eq!(parse_sasl_initial(b"M\0\0\0\0\0"), Ok(("M", &b""[..])));
    }

    #[test]
    fn header_accepts_every_type_postgresql_reads() {
        for tag in *b"QFPBCDEHSXdcf" {
            let h = header(&[tag, 0, 0, 0, 4]).unwrap().unwrap();
            assert_eq!((h.tag, h.total), (tag, 5));
            // The type byte alone is not yet a header.
            assert_eq!(header(&[tag]), Ok(None));
        }
        assert_eq!(header(b""), Ok(None));
    }

    #[test]
    fn header_refuses_a_type_postgresql_does_not_read_from_its_first_byte() {
        for tag in [1u8, 0, b'p', b'Z', b'G', b'x', 0xff] {
            assert_eq!(header(&[tag]), Err(ProtoError::UnknownType(tag)));
            assert_eq!(
                header(&[tag, 0, 0, 0, 4]),
                Err(ProtoError::UnknownType(tag))
            );
        }
        assert_eq!(
            ProtoError::UnknownType(1).to_string(),
            "invalid frontend message type 1"
        );
    }

    #[test]
    fn header_bounds_each_type_as_postgresql_does() {
        let with_len = |tag: u8, len: u32| {
            let l = len.to_be_bytes();
            header(&[tag, l[0], l[1], l[2], l[3]])
        };
        // Small messages: at most 10,000 including the length word.
        for tag in *b"CDEHSXcf" {
            assert_eq!(with_len(tag, 10_000).unwrap().unwrap().total, 10_001);
            assert_eq!(with_len(tag, 10_001), Err(ProtoError::BadLength(10_001)));
        }
        // Large ones: up to MaxAllocSize - 1.
        for tag in *b"QFPBd" {
            assert_eq!(
                with_len(tag, 0x3fff_fffe).unwrap().unwrap().total,
                0x3fff_ffff
            );
            assert_eq!(
                with_len(tag, 0x3fff_ffff),
                Err(ProtoError::BadLength(0x3fff_ffff))
            );
            assert_eq!(
                with_len(tag, 0x7fff_ffff),
                Err(ProtoError::BadLength(0x7fff_ffff))
            );
        }
        // Below 4, or negative: never.
        for len in [0u32, 3, 0xffff_ffff, 0x8000_0000] {
            assert_eq!(
                with_len(b'Q', len),
                Err(ProtoError::BadLength(i64::from(len as i32)))
            );
        }
    }

    #[test]
    fn password_parse() {
        let mut b = BytesMut::new();
        password(&mut b, b"secret");
        assert_eq!(parse_password(&b[5..]).unwrap(), b"secret");
        assert!(parse_password(b"nonul").is_err());
    }
}
