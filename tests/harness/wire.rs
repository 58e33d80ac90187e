//! A raw frontend for oracle tests: sends exactly the messages a script names (simple Query
//! or Parse/Bind/Describe/Execute/Close/Sync, SQL text inside Parse included) and turns what
//! comes back into a transcript of lines. The same script runs straight against PostgreSQL
//! and through pgcarpool; the transcripts must be equal (`oracle`).
//!
//! Script lines (one message each; `|` separates fields):
//!
//! | line                 | message                                             |
//! |----------------------|-----------------------------------------------------|
//! | `Q sql`              | Query                                               |
//! | `P name|sql`         | Parse (no parameter types given)                    |
//! | `B portal|stmt|a,b`  | Bind with text parameters (`\N` is NULL; `{1,2}` one) |
//! | `D S name`, `D P name` | Describe statement / portal                       |
//! | `E portal`           | Execute (no row limit)                              |
//! | `C S name`, `C P name` | Close                                             |
//! | `S`                  | Sync                                                |
//! | `H`                  | Flush                                               |
//! | `E portal|n`         | Execute with a row limit of `n`                     |
//! | `d text`             | CopyData (`text` with `\t`, `\n` escapes: tab, newline) |
//! | `c`                  | CopyDone                                            |
//! | `f message`          | CopyFail                                            |
//!
//! A step is several lines sent at once; the reply is read up to one ReadyForQuery per
//! `Q` and `S` line. Transcript lines: `ParseComplete`, `BindComplete`, `CloseComplete`,
//! `NoData`, `Columns a,b`, `Row x|y`, `Complete TAG`, `Error CODE message`, `Empty`,
//! `Suspended`, `Ready S`, `Params n`, `Notify channel payload`. ParameterStatus and
//! notices are left out (WARNINGs are kept apart, in `Wire::warnings`).
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub struct Wire {
    s: TcpStream,
    buf: Vec<u8>,
    out: Vec<u8>,
    /// The process id in BackendKeyData.
    pub pid: i32,
    /// The process ids of the NotificationResponses seen, in order.
    pub notify_pids: Vec<i32>,
    /// The WARNINGs seen (NoticeResponse), as `Warning CODE message`, in order.
    pub warnings: Vec<String>,
}

/// A StartupMessage (protocol 3.0) with `params` (e.g. `[("user", u), ("database", d)]`).
pub fn startup_message(params: &[(&str, &str)]) -> Vec<u8> {
    startup_message_minor(0, params)
}

/// A StartupMessage for protocol 3.`minor` (3.2 and later: newer than PostgreSQL 15 speaks).
pub fn startup_message_minor(minor: u16, params: &[(&str, &str)]) -> Vec<u8> {
    let mut body = (PROTOCOL_3_0 + i32::from(minor)).to_be_bytes().to_vec();
    for (k, v) in params {
        cstr(&mut body, k);
        cstr(&mut body, v);
    }
    body.push(0);
    let mut out = i32::try_from(body.len() + 4)
        .expect("startup packet length")
        .to_be_bytes()
        .to_vec();
    out.extend_from_slice(&body);
    out
}

/// Protocol version 3.0 as a StartupMessage carries it (196608).
pub const PROTOCOL_3_0: i32 = 3 << 16;

/// One frontend message: `tag`, length, `body`.
pub fn message(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    msg(&mut out, tag, body);
    out
}

/// Split backend bytes into whole messages (tag, body); a trailing partial message is
/// left out.
pub fn split_messages(mut bytes: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    while bytes.len() >= 5 {
        let len = i32::from_be_bytes(bytes[1..5].try_into().unwrap());
        let Some(end) = usize::try_from(len).ok().and_then(|l| l.checked_add(1)) else {
            break;
        };
        if len < 4 || bytes.len() < end {
            break;
        }
        out.push((bytes[0], bytes[5..end].to_vec()));
        bytes = &bytes[end..];
    }
    out
}

/// The SQLSTATE and message of an ErrorResponse body.
pub fn error_fields(body: &[u8]) -> (String, String) {
    let f = fields(body);
    let get = |k: u8| {
        f.iter()
            .find(|(c, _)| *c == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    (get(b'C'), get(b'M'))
}

fn msg(out: &mut Vec<u8>, tag: u8, body: &[u8]) {
    out.push(tag);
    out.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
    out.extend_from_slice(body);
}

fn cstr(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(s.as_bytes());
    b.push(0);
}

impl Wire {
    /// Log in as `user` (the server or pooler must trust it) to `db` on 127.0.0.1:`port`.
    pub async fn connect(port: u16, user: &str, db: &str) -> Wire {
        Self::connect_with(port, user, db, &[]).await.0
    }

    /// Log in with more startup parameters; also returns the ParameterStatus values.
    pub async fn connect_with(
        port: u16,
        user: &str,
        db: &str,
        params: &[(&str, &str)],
    ) -> (Wire, std::collections::HashMap<String, String>) {
        let s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let mut w = Wire {
            s,
            buf: Vec::new(),
            out: Vec::new(),
            pid: 0,
            notify_pids: Vec::new(),
            warnings: Vec::new(),
        };
        let mut reported = std::collections::HashMap::new();
        let all: Vec<(&str, &str)> = [("user", user), ("database", db)]
            .into_iter()
            .chain(params.iter().copied())
            .collect();
        w.out.extend_from_slice(&startup_message(&all));
        w.flush().await;
        loop {
            let (tag, body) = w.next().await;
            match tag {
                b'R' if body[..4] == [0, 0, 0, 0] => {}
                b'R' => panic!("wire client: only trust auth is supported"),
                b'E' => panic!("login failed: {}", String::from_utf8_lossy(&body)),
                b'S' => {
                    let (k, rest) = cstrs(&body);
                    reported.insert(k, cstrs(rest).0);
                }
                b'K' => w.pid = i32::from_be_bytes(body[..4].try_into().unwrap()),
                b'Z' => return (w, reported),
                _ => {}
            }
        }
    }

    /// Send `bytes` as they are (whole protocol messages, e.g. made by `message`).
    pub async fn send(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
        self.flush().await;
    }

    /// Every message, as (tag, body), up to and including the `n`th ReadyForQuery; panics
    /// after 20 s without a message.
    pub async fn until_ready(&mut self, mut n: usize) -> Vec<(u8, Vec<u8>)> {
        let mut out = Vec::new();
        while n > 0 {
            let (tag, body) = self.next().await;
            if tag == b'Z' {
                n -= 1;
            }
            out.push((tag, body));
        }
        out
    }

    /// Bytes come and not read as messages yet, without waiting for any: what the other
    /// end has written so far.
    pub fn bytes_waiting(&mut self) -> usize {
        let mut chunk = [0u8; 8192];
        while let Ok(n) = self.s.try_read(&mut chunk) {
            if n == 0 {
                break;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
        self.buf.len()
    }

    async fn flush(&mut self) {
        self.s.write_all(&self.out).await.unwrap();
        self.out.clear();
    }

    /// The next whole message (tag, body); panics after 20 s without one, or when the
    /// connection closes.
    async fn next(&mut self) -> (u8, Vec<u8>) {
        self.read_message()
            .await
            .expect("wire client: connection closed")
    }

    /// Every message until the connection closes (the last words of a client let go).
    pub async fn until_closed(&mut self) -> Vec<(u8, Vec<u8>)> {
        let mut out = Vec::new();
        while let Some(m) = self.read_message().await {
            out.push(m);
        }
        out
    }

    /// The next whole message; None when the connection closed. Panics after 20 s.
    async fn read_message(&mut self) -> Option<(u8, Vec<u8>)> {
        loop {
            if self.buf.len() >= 5 {
                let len = i32::from_be_bytes(self.buf[1..5].try_into().unwrap()) as usize;
                if self.buf.len() > len {
                    let body = self.buf[5..1 + len].to_vec();
                    let tag = self.buf[0];
                    self.buf.drain(..1 + len);
                    return Some((tag, body));
                }
            }
            let mut chunk = [0u8; 8192];
            let n = tokio::time::timeout(Duration::from_secs(20), self.s.read(&mut chunk))
                .await
                .expect("wire client: no reply within 20 s")
                .unwrap_or(0);
            if n == 0 {
                return None;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Queue one script line.
    pub fn line(&mut self, line: &str) -> usize {
        let (kind, rest) = line.split_once(' ').unwrap_or((line, ""));
        let f: Vec<&str> = rest.splitn(3, '|').collect();
        let mut b = Vec::new();
        match kind {
            "Q" => {
                cstr(&mut b, rest);
                msg(&mut self.out, b'Q', &b);
                return 1;
            }
            "P" => {
                // The SQL is the rest of the line, `|` included (`||` is SQL's concatenation).
                let (name, sql) = rest.split_once('|').unwrap_or((rest, ""));
                cstr(&mut b, name);
                cstr(&mut b, sql);
                b.extend_from_slice(&0i16.to_be_bytes());
                msg(&mut self.out, b'P', &b);
            }
            "B" => {
                cstr(&mut b, f[0]);
                cstr(&mut b, f.get(1).copied().unwrap_or(""));
                let params: Vec<&str> = match f.get(2) {
                    Some(p) if !p.is_empty() => split_params(p),
                    _ => Vec::new(),
                };
                b.extend_from_slice(&0i16.to_be_bytes());
                b.extend_from_slice(&(params.len() as i16).to_be_bytes());
                for p in &params {
                    if *p == "\\N" {
                        b.extend_from_slice(&(-1i32).to_be_bytes());
                    } else {
                        b.extend_from_slice(&(p.len() as i32).to_be_bytes());
                        b.extend_from_slice(p.as_bytes());
                    }
                }
                b.extend_from_slice(&0i16.to_be_bytes());
                msg(&mut self.out, b'B', &b);
            }
            "D" | "C" => {
                let (k, name) = rest.split_once(' ').unwrap_or((rest, ""));
                b.push(k.as_bytes()[0]);
                cstr(&mut b, name);
                msg(&mut self.out, kind.as_bytes()[0], &b);
            }
            "E" => {
                let (portal, limit) = rest.split_once('|').unwrap_or((rest, "0"));
                cstr(&mut b, portal);
                let limit: i32 = limit.parse().expect("E portal|n: n is a number");
                b.extend_from_slice(&limit.to_be_bytes());
                msg(&mut self.out, b'E', &b);
            }
            "d" => {
                let data = rest.replace("\\t", "\t").replace("\\n", "\n");
                msg(&mut self.out, b'd', data.as_bytes());
            }
            "c" => msg(&mut self.out, b'c', &[]),
            "f" => {
                cstr(&mut b, rest);
                msg(&mut self.out, b'f', &b);
            }
            "S" => {
                msg(&mut self.out, b'S', &[]);
                return 1;
            }
            "H" => msg(&mut self.out, b'H', &[]),
            other => panic!("unknown script line kind {other:?}"),
        }
        0
    }

    /// Send a step (lines separated by newlines) and return its transcript.
    pub async fn step(&mut self, step: &str) -> Vec<String> {
        self.try_step(step)
            .await
            .unwrap_or_else(|seen| panic!("wire client: connection closed after {seen:?}"))
    }

    /// As `step`; Err holds what came before the connection closed.
    pub async fn try_step(&mut self, step: &str) -> Result<Vec<String>, Vec<String>> {
        let mut ready = 0;
        for l in step.lines().map(str::trim).filter(|l| !l.is_empty()) {
            ready += self.line(l);
        }
        self.flush().await;
        let mut out = Vec::new();
        while ready > 0 {
            let Some((tag, body)) = self.read_message().await else {
                return Err(out);
            };
            if tag == b'A' {
                self.notify_pids
                    .push(i32::from_be_bytes(body[..4].try_into().unwrap()));
            }
            if tag == b'N' {
                let f = fields(&body);
                let get = |k: u8| f.iter().find(|(c, _)| *c == k).map(|(_, v)| v.clone());
                if get(b'V').or_else(|| get(b'S')).as_deref() == Some("WARNING") {
                    let (code, m) = (get(b'C').unwrap_or_default(), get(b'M').unwrap_or_default());
                    self.warnings.push(format!("Warning {code} {m}"));
                }
            }
            if let Some(l) = describe(tag, &body) {
                out.push(l);
            }
            if tag == b'Z' {
                ready -= 1;
            }
        }
        Ok(out)
    }
}

/// A Bind line's parameters: split at commas outside braces (`{1,2}` is one array value).
fn split_params(p: &str) -> Vec<&str> {
    let (mut out, mut depth, mut from) = (Vec::new(), 0i32, 0);
    for (i, c) in p.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&p[from..i]);
                from = i + 1;
            }
            _ => {}
        }
    }
    out.push(&p[from..]);
    out
}

fn fields(body: &[u8]) -> Vec<(u8, String)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < body.len() && body[at] != 0 {
        let k = body[at];
        let end = body[at + 1..].iter().position(|&c| c == 0).unwrap() + at + 1;
        out.push((k, String::from_utf8_lossy(&body[at + 1..end]).into_owned()));
        at = end + 1;
    }
    out
}

fn cstrs(mut b: &[u8]) -> (String, &[u8]) {
    let end = b.iter().position(|&c| c == 0).unwrap();
    let s = String::from_utf8_lossy(&b[..end]).into_owned();
    b = &b[end + 1..];
    (s, b)
}

/// One transcript line for a backend message (None: not part of transcripts).
fn describe(tag: u8, body: &[u8]) -> Option<String> {
    Some(match tag {
        b'1' => "ParseComplete".into(),
        b'2' => "BindComplete".into(),
        b'3' => "CloseComplete".into(),
        b'n' => "NoData".into(),
        b'I' => "Empty".into(),
        b's' => "Suspended".into(),
        b'Z' => format!("Ready {}", body[0] as char),
        b'C' => format!("Complete {}", cstrs(body).0),
        b't' => {
            let oids: Vec<String> = body[2..].chunks(4).map(|c| oid_text(be_u32(c))).collect();
            format!(
                "Params {} {}",
                i16::from_be_bytes([body[0], body[1]]),
                oids.join(",")
            )
        }
        b'A' => {
            let (channel, rest) = cstrs(&body[4..]);
            format!("Notify {channel} {}", cstrs(rest).0)
        }
        b'E' => {
            let f = fields(body);
            let get = |k: u8| {
                f.iter()
                    .find(|(c, _)| *c == k)
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default()
            };
            format!("Error {} {}", get(b'C'), get(b'M'))
        }
        b'T' => {
            let n = i16::from_be_bytes([body[0], body[1]]);
            let mut rest = &body[2..];
            let mut names = Vec::new();
            for _ in 0..n {
                let (name, r) = cstrs(rest);
                names.push(name);
                rest = &r[18..];
            }
            format!("Columns {}", names.join(","))
        }
        b'D' => {
            let n = i16::from_be_bytes([body[0], body[1]]);
            let mut at = 2;
            let mut vals = Vec::new();
            for _ in 0..n {
                let len = i32::from_be_bytes(body[at..at + 4].try_into().unwrap());
                at += 4;
                if len < 0 {
                    vals.push("NULL".to_string());
                } else {
                    let len = len as usize;
                    vals.push(String::from_utf8_lossy(&body[at..at + len]).into_owned());
                    at += len;
                }
            }
            format!("Row {}", vals.join("|"))
        }
        _ => return None,
    })
}

/// Run each client's steps in lockstep (step k of every client before step k+1 of any),
/// once against `direct_port` and once against `pooler_port`, and return both sets of
/// transcripts: `[client][step]` lines.
///
/// A step that starts with `X ` is SQL another application runs straight on PostgreSQL
/// (`direct_port`), out of pgcarpool's sight; its transcript is empty.
pub async fn transcripts(
    port: u16,
    direct_port: u16,
    user: &str,
    db: &str,
    scripts: &[Vec<String>],
) -> Vec<Vec<Vec<String>>> {
    let mut conns = Vec::new();
    for _ in scripts {
        conns.push(Wire::connect(port, user, db).await);
    }
    let mut outside = Wire::connect(direct_port, user, db).await;
    let mut out = vec![Vec::new(); scripts.len()];
    let steps = scripts.iter().map(Vec::len).max().unwrap_or(0);
    for k in 0..steps {
        for (i, s) in scripts.iter().enumerate() {
            if let Some(step) = s.get(k) {
                if let Some(sql) = step.strip_prefix("X ") {
                    let t = outside.step(&format!("Q {sql}")).await;
                    assert!(!t.iter().any(|l| l.starts_with("Error")), "{sql}: {t:?}");
                    out[i].push(Vec::new());
                } else {
                    let t = conns[i].step(step).await;
                    out[i].push(t);
                }
            }
        }
    }
    out
}

/// Same transcripts straight from PostgreSQL and through pgcarpool, or a panic that shows
/// the first difference. Returns the transcripts (for further checks).
pub async fn oracle(
    direct_port: u16,
    pooler_port: u16,
    user: &str,
    db: &str,
    scripts: &[Vec<String>],
) -> Vec<Vec<Vec<String>>> {
    let want = transcripts(direct_port, direct_port, user, db, scripts).await;
    let got = transcripts(pooler_port, direct_port, user, db, scripts).await;
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        for (k, (ws, gs)) in w.iter().zip(g).enumerate() {
            assert_eq!(
                ws, gs,
                "client {i} step {k} differs\n--- step\n{}\n--- PostgreSQL (left) vs pgcarpool (right)",
                scripts[i][k]
            );
        }
    }
    got
}

/// How a recorded step ended (`Wire::record_step`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepEnd {
    /// Every ReadyForQuery the step asked for came.
    Done,
    /// The connection closed first.
    Closed,
    /// Nothing came for the time limit.
    Timeout,
}

/// The first OID a user object gets (`FirstNormalObjectId`): OIDs at or above it come from a
/// cluster-wide counter, so they depend on how concurrent clients' DDL interleaved.
const FIRST_NORMAL_OID: u32 = 16384;

fn be_u32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap())
}

fn oid_text(oid: u32) -> String {
    if oid >= FIRST_NORMAL_OID {
        "user-oid".into()
    } else {
        oid.to_string()
    }
}

/// Every byte of a backend message as one line, normalised only where a run against
/// PostgreSQL and one through pgcarpool may rightly differ: BackendKeyData (process id and
/// secret), a NotificationResponse's process id (`self` when it is the one the client was
/// given, else `other`), OIDs of user objects in RowDescription and ParameterDescription,
/// and the source file, line and routine fields (F, L, R) of errors and notices: the errors
/// pgcarpool decides itself (names of statements it keeps for the client) have none.
pub fn record(tag: u8, body: &[u8], own_pid: i32) -> String {
    let t = tag as char;
    match tag {
        b'K' => "K <pid> <secret>".into(),
        b'A' if body.len() >= 4 => {
            let pid = i32::from_be_bytes(body[..4].try_into().unwrap());
            let who = if pid == own_pid { "self" } else { "other" };
            let (channel, rest) = cstrs(&body[4..]);
            format!("A pid={who} {channel:?} {:?}", cstrs(rest).0)
        }
        b'E' | b'N' => {
            let f: Vec<String> = fields(body)
                .into_iter()
                .filter(|(k, _)| !matches!(k, b'F' | b'L' | b'R'))
                .map(|(k, v)| format!("{}={v:?}", k as char))
                .collect();
            format!("{t} {}", f.join(" "))
        }
        b'S' => {
            let (k, rest) = cstrs(body);
            format!("S {k}={:?}", cstrs(rest).0)
        }
        b'T' => format!("T {}", row_description(body)),
        b't' => {
            let oids: Vec<String> = body[2..].chunks(4).map(|c| oid_text(be_u32(c))).collect();
            format!("t {}", oids.join(","))
        }
        b'D' | b'C' | b'Z' => describe(tag, body).unwrap_or_default(),
        b'd' => format!("d {:?}", String::from_utf8_lossy(body)),
        _ => {
            let hex: String = body.iter().map(|b| format!("{b:02x}")).collect();
            format!("{t} {hex}")
        }
    }
}

/// A RowDescription's columns: name, table OID, column number, type OID, size, modifier,
/// format.
fn row_description(body: &[u8]) -> String {
    let n = i16::from_be_bytes([body[0], body[1]]);
    let mut rest = &body[2..];
    let mut cols = Vec::new();
    for _ in 0..n {
        let (name, r) = cstrs(rest);
        let attnum = i16::from_be_bytes([r[4], r[5]]);
        let size = i16::from_be_bytes([r[10], r[11]]);
        let typmod = i32::from_be_bytes(r[12..16].try_into().unwrap());
        let format = i16::from_be_bytes([r[16], r[17]]);
        cols.push(format!(
            "{name:?}:{}:{attnum}:{}:{size}:{typmod}:{format}",
            oid_text(be_u32(r)),
            oid_text(be_u32(&r[6..]))
        ));
        rest = &r[18..];
    }
    cols.join(" ")
}

impl Wire {
    /// Log in like `connect_with`, recording every message of the login (`record`); Err
    /// holds what came before the connection closed or `limit` passed without a message.
    pub async fn connect_recorded(
        port: u16,
        user: &str,
        db: &str,
        params: &[(String, String)],
        limit: Duration,
    ) -> Result<(Wire, Vec<String>), Vec<String>> {
        let s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let mut w = Wire {
            s,
            buf: Vec::new(),
            out: Vec::new(),
            pid: 0,
            notify_pids: Vec::new(),
            warnings: Vec::new(),
        };
        let all: Vec<(&str, &str)> = [("user", user), ("database", db)]
            .into_iter()
            .chain(params.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .collect();
        w.out.extend_from_slice(&startup_message(&all));
        w.flush().await;
        let mut seen = Vec::new();
        loop {
            let Ok(Some((tag, body))) = w.read_within(limit).await else {
                return Err(seen);
            };
            if tag == b'K' {
                w.pid = i32::from_be_bytes(body[..4].try_into().unwrap());
            }
            seen.push(record(tag, &body, w.pid));
            match tag {
                b'Z' => return Ok((w, seen)),
                b'E' => return Err(seen),
                _ => {}
            }
        }
    }

    /// The next whole message; Ok(None) when the connection closed, Err when `limit`
    /// passed without one.
    async fn read_within(
        &mut self,
        limit: Duration,
    ) -> Result<Option<(u8, Vec<u8>)>, tokio::time::error::Elapsed> {
        loop {
            if self.buf.len() >= 5 {
                let len = i32::from_be_bytes(self.buf[1..5].try_into().unwrap()) as usize;
                if self.buf.len() > len {
                    let body = self.buf[5..1 + len].to_vec();
                    let tag = self.buf[0];
                    self.buf.drain(..1 + len);
                    return Ok(Some((tag, body)));
                }
            }
            let mut chunk = [0u8; 8192];
            let n = tokio::time::timeout(limit, self.s.read(&mut chunk))
                .await?
                .unwrap_or(0);
            if n == 0 {
                return Ok(None);
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Send a step and record every message until each `Q` and `S` line had its
    /// ReadyForQuery. With `copy_wait`, the `d`/`c`/`f` lines after a `Q` are held until
    /// the server answered with CopyInResponse (and dropped when it answered
    /// ReadyForQuery instead: the COPY failed), as libpq sends them; without it, the
    /// whole step is streamed at once.
    pub async fn record_step(
        &mut self,
        step: &str,
        copy_wait: bool,
        limit: Duration,
    ) -> (Vec<String>, StepEnd) {
        let mut ready = 0;
        let mut out = Vec::new();
        // None: not in a group of copy lines; Some(send): whether to send the group.
        let mut copy_group: Option<bool> = None;
        for l in step.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let kind = l.split(' ').next().unwrap_or("");
            if !copy_wait || !matches!(kind, "d" | "c" | "f") {
                copy_group = None;
                ready += self.line(l);
                continue;
            }
            let send = match copy_group {
                Some(send) => send,
                None => {
                    self.flush_quietly().await;
                    let mut started = false;
                    while ready > 0 && !started {
                        match self.read_within(limit).await {
                            Ok(Some((tag, body))) => {
                                out.push(record(tag, &body, self.pid));
                                ready -= usize::from(tag == b'Z');
                                started = tag == b'G';
                            }
                            Ok(None) => return (out, StepEnd::Closed),
                            Err(_) => return (out, StepEnd::Timeout),
                        }
                    }
                    copy_group = Some(started);
                    started
                }
            };
            if send {
                self.line(l);
            }
        }
        self.flush_quietly().await;
        while ready > 0 {
            match self.read_within(limit).await {
                Ok(Some((tag, body))) => {
                    out.push(record(tag, &body, self.pid));
                    ready -= usize::from(tag == b'Z');
                }
                Ok(None) => return (out, StepEnd::Closed),
                Err(_) => return (out, StepEnd::Timeout),
            }
        }
        (out, StepEnd::Done)
    }

    /// Send what is queued; a failed write (the peer closed) is left for the next read
    /// to find, so that what the peer sent before closing is still read.
    async fn flush_quietly(&mut self) {
        let _ = self.s.write_all(&self.out).await;
        self.out.clear();
    }

    /// Send Terminate and close the connection.
    pub async fn terminate(mut self) {
        self.out.extend_from_slice(&message(b'X', &[]));
        self.flush_quietly().await;
    }
}
