//! A client that speaks the protocol by hand, for what drivers do not show: the protocol
//! version it asks for, NegotiateProtocolVersion, the whole BackendKeyData (protocol 3.2's
//! long secrets) and CancelRequests of any key.
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// CancelRequest's code.
const CANCEL_REQUEST_CODE: i32 = 80_877_102;

/// A client logged in (the pooler or server must trust its user).
pub struct RawClient {
    s: TcpStream,
    /// BackendKeyData: the process id and the secret's first 4 bytes.
    pub key: (i32, i32),
    /// The secret's bytes after its first 4 (protocol 3.2; empty for a 4-byte secret).
    pub rest: Vec<u8>,
    /// NegotiateProtocolVersion, if it came: the version and the options not recognised.
    pub negotiated: Option<(i32, Vec<String>)>,
}

impl RawClient {
    /// Log in to `db` as `user` on `ip:port` asking for protocol 3.`minor`, with `extra`
    /// startup parameters (`_pq_.` options among them).
    pub async fn connect(
        (ip, port): (&str, u16),
        minor: u16,
        (user, db): (&str, &str),
        extra: &[(&str, &str)],
    ) -> RawClient {
        let mut s = TcpStream::connect((ip, port)).await.unwrap();
        let params: Vec<(&str, &str)> = [("user", user), ("database", db)]
            .into_iter()
            .chain(extra.iter().copied())
            .collect();
        s.write_all(&super::wire::startup_message_minor(minor, &params))
            .await
            .unwrap();
        let mut c = RawClient {
            s,
            key: (0, 0),
            rest: Vec::new(),
            negotiated: None,
        };
        loop {
            let (tag, body) = c.next().await.expect("login: connection closed");
            match tag {
                b'K' => {
                    c.key = (
                        i32::from_be_bytes(body[..4].try_into().unwrap()),
                        i32::from_be_bytes(body[4..8].try_into().unwrap()),
                    );
                    c.rest = body[8..].to_vec();
                }
                b'v' => c.negotiated = Some(parse_negotiate(&body)),
                b'R' if body[..4] == [0, 0, 0, 0] => {}
                b'R' => panic!("raw client: only trust auth is supported"),
                b'E' => panic!("login failed: {}", String::from_utf8_lossy(&body)),
                b'Z' => return c,
                _ => {}
            }
        }
    }

    /// The secret's length in bytes.
    pub fn secret_len(&self) -> usize {
        4 + self.rest.len()
    }

    async fn next(&mut self) -> Option<(u8, Vec<u8>)> {
        let mut head = [0u8; 5];
        tokio::time::timeout(Duration::from_secs(20), self.s.read_exact(&mut head))
            .await
            .expect("no reply within 20 s")
            .ok()?;
        let len = u32::from_be_bytes(head[1..].try_into().unwrap()) as usize;
        let mut body = vec![0u8; len - 4];
        self.s.read_exact(&mut body).await.ok()?;
        Some((head[0], body))
    }

    /// Send a simple Query.
    pub async fn send_query(&mut self, sql: &str) {
        let mut body = sql.as_bytes().to_vec();
        body.push(0);
        self.s
            .write_all(&super::wire::message(b'Q', &body))
            .await
            .unwrap();
    }

    /// The SQLSTATE the query sent ends with (Some(None): it succeeded); None when it has
    /// not ended within `limit` (it may be read again then).
    pub async fn outcome(&mut self, limit: Duration) -> Option<Option<String>> {
        let deadline = tokio::time::Instant::now() + limit;
        let mut code = None;
        loop {
            // Reading a message is not cancelled halfway: only the wait for its first byte.
            let mut first = [0u8; 1];
            match tokio::time::timeout_at(deadline, self.s.peek(&mut first)).await {
                Err(_) => return None,
                Ok(r) => assert_eq!(r.expect("read"), 1, "connection closed"),
            }
            let (tag, body) = self.next().await.expect("connection closed");
            match tag {
                b'E' => code = Some(super::wire::error_fields(&body).0),
                b'Z' => return Some(code),
                _ => {}
            }
        }
    }
}

/// NegotiateProtocolVersion's body: the version and the option names.
fn parse_negotiate(body: &[u8]) -> (i32, Vec<String>) {
    let version = i32::from_be_bytes(body[..4].try_into().unwrap());
    let n = u32::from_be_bytes(body[4..8].try_into().unwrap()) as usize;
    let names: Vec<String> = body[8..]
        .split(|b| *b == 0)
        .take(n)
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    (version, names)
}

/// Send a CancelRequest for `key` whose secret goes on with `rest` to `ip:port`, and wait
/// until the other end closes the connection (it has handled the request).
pub async fn send_cancel((ip, port): (&str, u16), key: (i32, i32), rest: &[u8]) {
    let mut s = TcpStream::connect((ip, port)).await.unwrap();
    let len = i32::try_from(16 + rest.len()).unwrap();
    let mut m = len.to_be_bytes().to_vec();
    m.extend_from_slice(&CANCEL_REQUEST_CODE.to_be_bytes());
    m.extend_from_slice(&key.0.to_be_bytes());
    m.extend_from_slice(&key.1.to_be_bytes());
    m.extend_from_slice(rest);
    s.write_all(&m).await.unwrap();
    let mut left = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut left))
        .await
        .expect("the cancel connection was not closed")
        .ok();
}
