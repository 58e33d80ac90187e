//! Client ("frontend") messages: views of what clients send that pgcarpool inspects, and
//! builders for what pgcarpool sends to servers.
use bytes::{BufMut, BytesMut};

use super::{ProtoError, Reader};

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
    let at = begin(out, QUERY);
    out.put_slice(sql.as_bytes());
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
    fn password_parse() {
        let mut b = BytesMut::new();
        password(&mut b, b"secret");
        assert_eq!(parse_password(&b[5..]).unwrap(), b"secret");
        assert!(parse_password(b"nonul").is_err());
    }
}
