//! Pure PostgreSQL wire format (protocol 3.0): no sockets here.
//!
//! Decoders take bytes and return `Ok(None)` when the input is incomplete.
pub mod backend;
pub mod frontend;
pub mod startup;

/// Largest message we hold whole in a buffer (messages we only forward may be larger:
/// they are streamed).
pub const MAX_MESSAGE_LEN: usize = 64 * 1024 * 1024;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtoError {
    #[error("invalid message length {0}")]
    BadLength(i64),
    #[error("message too long ({0} bytes)")]
    TooLong(usize),
    #[error("malformed {0} message")]
    Malformed(&'static str),
    #[error("unsupported protocol version {0}.{1}")]
    UnsupportedVersion(u16, u16),
    /// A client message of a type no client may send after login (PostgreSQL's words, the
    /// type in decimal).
    #[error("invalid frontend message type {0}")]
    UnknownType(u8),
}

/// Header of a regular (tagged) message: its tag and its total size including the tag byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub tag: u8,
    /// 1 (tag) + the length field's value.
    pub total: usize,
}

impl Header {
    /// Size of the body (after tag and length).
    pub fn body_len(&self) -> usize {
        self.total - 5
    }
}

/// Read a message header from the start of `buf`: `Ok(None)` if fewer than 5 bytes.
/// A length below 4 is an error; so is one above `limit`.
#[inline]
pub fn header(buf: &[u8], limit: usize) -> Result<Option<Header>, ProtoError> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let len = i32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]);
    if len < 4 {
        return Err(ProtoError::BadLength(len.into()));
    }
    let total = 1 + len as usize;
    if total > limit {
        return Err(ProtoError::TooLong(total));
    }
    Ok(Some(Header { tag: buf[0], total }))
}

/// A cursor over a message body for reading fields, bounds-checked.
pub struct Reader<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8], what: &'static str) -> Self {
        Reader { buf, what }
    }
    fn err(&self) -> ProtoError {
        ProtoError::Malformed(self.what)
    }
    pub fn remaining(&self) -> &'a [u8] {
        self.buf
    }
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
    pub fn u8(&mut self) -> Result<u8, ProtoError> {
        let (&b, rest) = self.buf.split_first().ok_or_else(|| self.err())?;
        self.buf = rest;
        Ok(b)
    }
    pub fn i16(&mut self) -> Result<i16, ProtoError> {
        let b = self.bytes(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }
    pub fn i32(&mut self) -> Result<i32, ProtoError> {
        let b = self.bytes(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        if self.buf.len() < n {
            return Err(self.err());
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Ok(a)
    }
    /// A NUL-terminated string (without the NUL), as bytes.
    pub fn cstr_bytes(&mut self) -> Result<&'a [u8], ProtoError> {
        let pos = memchr::memchr(0, self.buf).ok_or_else(|| self.err())?;
        let s = &self.buf[..pos];
        self.buf = &self.buf[pos + 1..];
        Ok(s)
    }
    /// A NUL-terminated UTF-8 string.
    pub fn cstr(&mut self) -> Result<&'a str, ProtoError> {
        let b = self.cstr_bytes()?;
        std::str::from_utf8(b).map_err(|_| self.err())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_needs_five_bytes() {
        assert_eq!(header(b"Q\0\0\0", 100), Ok(None));
    }

    #[test]
    fn header_rejects_short_length() {
        assert_eq!(header(b"Q\0\0\0\x03", 100), Err(ProtoError::BadLength(3)));
        assert_eq!(
            header(b"Q\xff\xff\xff\xff", 100),
            Err(ProtoError::BadLength(-1))
        );
    }

    #[test]
    fn header_rejects_over_limit() {
        assert_eq!(header(b"Q\0\0\x01\0", 100), Err(ProtoError::TooLong(257)));
    }

    #[test]
    fn header_reads_total() {
        assert_eq!(
            header(b"Z\0\0\0\x05I", 100),
            Ok(Some(Header {
                tag: b'Z',
                total: 6
            }))
        );
    }

    #[test]
    fn header_of_an_empty_body_is_complete() {
        // A 5-byte message (Sync, Flush…) has its whole header and nothing more.
        let h = header(b"S\0\0\0\x04", 100).unwrap().unwrap();
        assert_eq!(
            h,
            Header {
                tag: b'S',
                total: 5
            }
        );
        assert_eq!(h.body_len(), 0);
    }

    #[test]
    fn body_len_excludes_tag_and_length() {
        let h = header(b"Q\0\0\0\x0bselect\0", 100).unwrap().unwrap();
        assert_eq!(h.total, 12);
        assert_eq!(h.body_len(), 7);
    }

    #[test]
    fn header_accepts_a_message_of_exactly_the_limit() {
        // total = 1 + 99 = 100.
        assert_eq!(
            header(b"Q\0\0\0\x63", 100),
            Ok(Some(Header {
                tag: b'Q',
                total: 100
            }))
        );
    }

    #[test]
    fn max_message_len_is_64_mib() {
        // A length field of 64 MiB - 1 makes a message of exactly 64 MiB: accepted; one
        // byte more is refused.
        let at_limit = (64 * 1024 * 1024 - 1_i32).to_be_bytes();
        let buf = [b'D', at_limit[0], at_limit[1], at_limit[2], at_limit[3]];
        assert_eq!(
            header(&buf, MAX_MESSAGE_LEN).unwrap().unwrap().total,
            64 * 1024 * 1024
        );
        let over = (64 * 1024 * 1024_i32).to_be_bytes();
        let buf = [b'D', over[0], over[1], over[2], over[3]];
        assert_eq!(
            header(&buf, MAX_MESSAGE_LEN),
            Err(ProtoError::TooLong(64 * 1024 * 1024 + 1))
        );
    }

    #[test]
    fn reader_reads_fields_in_order() {
        let mut r = Reader::new(b"\xff\xfe\0\0\x01\x02name\0tail", "test");
        assert!(!r.is_empty());
        assert_eq!(r.i16(), Ok(-2));
        assert_eq!(r.i32(), Ok(0x0102));
        assert_eq!(r.cstr(), Ok("name"));
        assert_eq!(r.remaining(), b"tail");
        assert_eq!(r.bytes(4), Ok(&b"tail"[..]));
        assert!(r.is_empty());
        assert_eq!(r.remaining(), b"");
        assert_eq!(r.u8(), Err(ProtoError::Malformed("test")));
    }

    #[test]
    fn reader_is_bounded() {
        let mut r = Reader::new(b"ab", "test");
        assert!(r.i32().is_err());
        assert!(r.cstr().is_err());
        assert_eq!(r.u8(), Ok(b'a'));
    }
}
