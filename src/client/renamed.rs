//! What the relay renamed for the server in the rounds still running (a client's statement
//! name sent as its shared server name, a SQL text rewritten around that name), and the
//! server's ErrorResponses mapped back to what the client wrote: the statement name in the
//! message, and the error position (P) in the client's own text.
use bytes::{BufMut, Bytes, BytesMut};

use crate::proto::backend;

/// Most renames kept at once (a client pipelining more without a Sync gets later errors
/// with the server's names).
const MAX_RENAMES: usize = 256;

/// One rename sent to the server.
#[derive(Debug)]
struct Rename {
    /// The round (`Exchange::round`) of the message: its errors come while the server's
    /// `answered` count equals it.
    round: u64,
    /// The numbers of the replies owed for the messages (`Exchange::owed_next`), first and
    /// last, that named `server` as `client` one after the other: of two client names for
    /// one server name in a round, an error names the one of the message that failed.
    seqs: (u64, u64),
    server: Bytes,
    client: Bytes,
    /// A SQL text rewritten as `… "server name" rest`: characters before `rest` in the
    /// server's text and in the client's.
    shift: Option<(u32, u32)>,
}

impl Rename {
    /// Did the message whose reply is owed number `front` name it so?
    fn names(&self, front: u64) -> bool {
        (self.seqs.0..=self.seqs.1).contains(&front)
    }
}

/// The renames of the rounds not yet answered, oldest first.
#[derive(Debug, Default)]
pub struct Renamed {
    renames: Vec<Rename>,
}

impl Renamed {
    /// A message of round `round` (its reply owed number `seq`) names statement `client`
    /// as `server`; rounds before `answered` are over and forgotten.
    pub fn note(&mut self, (round, answered, seq): (u64, u64, u64), server: &Bytes, client: &[u8]) {
        self.push((round, answered, seq), server, client, None);
    }

    /// As `note`, for a SQL text rewritten to name `server`: `client_text[..rest_at]` was
    /// replaced by `server_prefix` (the rest is the same).
    pub fn note_text(
        &mut self,
        rounds: (u64, u64, u64),
        (server, client): (&Bytes, &[u8]),
        client_text: &[u8],
        rest_at: usize,
        server_prefix: &str,
    ) {
        let old = chars(&client_text[..rest_at.min(client_text.len())]);
        let new = chars(server_prefix.as_bytes());
        self.push(rounds, server, client, Some((new, old)));
    }

    fn push(
        &mut self,
        (round, answered, seq): (u64, u64, u64),
        server: &Bytes,
        client: &[u8],
        shift: Option<(u32, u32)>,
    ) {
        self.renames.retain(|r| r.round >= answered);
        let last = self
            .renames
            .iter_mut()
            .rev()
            .find(|r| r.round == round && r.server == *server);
        if let Some(r) = last
            && r.client == client
            && (shift.is_none() || r.shift.is_some())
        {
            // The same name again: one run of messages.
            r.seqs.1 = seq;
            return;
        }
        if self.renames.len() >= MAX_RENAMES {
            return;
        }
        self.renames.push(Rename {
            round,
            seqs: (seq, seq),
            server: server.clone(),
            client: Bytes::copy_from_slice(client),
            shift,
        });
    }

    /// The ErrorResponse `msg` (whole, tag included) that came while the server had
    /// answered `answered` rounds, in reply to the message whose reply was owed number
    /// `front` (a Parse when `parse`), as PostgreSQL would have written it for the client's
    /// own names and text; None when it needs no change (no allocation then).
    pub fn restore(&self, answered: u64, (front, parse): (u64, bool), msg: &[u8]) -> Option<Bytes> {
        if !self.renames.iter().any(|r| r.round == answered) {
            return None;
        }
        let of_round = |r: &&Rename| r.round == answered;
        // A server name the failed message named is that message's client name; else the
        // first one the round gave it.
        let round: Vec<&Rename> = self
            .renames
            .iter()
            .filter(of_round)
            .filter(|r| {
                r.names(front)
                    || !self
                        .renames
                        .iter()
                        .filter(of_round)
                        .any(|o| o.server == r.server && o.names(front))
            })
            .collect();
        // A failed Parse's error is about its own text: shifted only when it is the
        // rewritten one (long-run seed 3149: another Parse after it in the round).
        let shift = round
            .iter()
            .filter(|r| !parse || r.names(front))
            .find_map(|r| r.shift);
        let body = msg.get(5..)?;
        let prefix = super::classify::INTERNAL_PREFIX.as_bytes();
        if shift.is_none() && !body.windows(prefix.len()).any(|w| w == prefix) {
            return None;
        }
        let mut fields = Vec::new();
        let mut changed = false;
        let mut rest = body;
        while let Some((&t, after)) = rest.split_first() {
            if t == 0 {
                break;
            }
            let end = after.iter().position(|&c| c == 0)?;
            let v = &after[..end];
            rest = &after[end + 1..];
            let new = match t {
                b'M' | b'D' | b'H' | b'W' => client_names(v, &round),
                b'P' => shift.and_then(|s| shifted(v, s)),
                _ => None,
            };
            changed |= new.is_some();
            fields.push((t, new.unwrap_or_else(|| v.to_vec())));
        }
        if !changed {
            return None;
        }
        let mut b = BytesMut::with_capacity(msg.len() + 64);
        let len = 4 + fields.iter().map(|(_, v)| v.len() + 2).sum::<usize>() + 1;
        b.put_u8(backend::ERROR_RESPONSE);
        b.put_i32(i32::try_from(len).ok()?);
        for (t, v) in fields {
            b.put_u8(t);
            b.put_slice(&v);
            b.put_u8(0);
        }
        b.put_u8(0);
        Some(b.freeze())
    }
}

/// `text` with every `"server name"` of these renames written `"client name"`; None when
/// it names none of them.
fn client_names(text: &[u8], renames: &[&Rename]) -> Option<Vec<u8>> {
    let prefix = super::classify::INTERNAL_PREFIX.as_bytes();
    if !text.windows(prefix.len()).any(|w| w == prefix) {
        return None;
    }
    let mut out = text.to_vec();
    let mut changed = false;
    for r in renames {
        let quoted = [&b"\""[..], &r.server, b"\""].concat();
        let with = [&b"\""[..], &r.client, b"\""].concat();
        let mut i = 0;
        while let Some(at) = out[i..].windows(quoted.len()).position(|w| w == quoted) {
            let at = i + at;
            out.splice(at..at + quoted.len(), with.iter().copied());
            i = at + with.len();
            changed = true;
        }
    }
    changed.then_some(out)
}

/// A position (P, characters from 1) in the server's text as one in the client's, given
/// the characters before the common rest in each (`new`, `old`).
fn shifted(v: &[u8], (new, old): (u32, u32)) -> Option<Vec<u8>> {
    let p: u32 = std::str::from_utf8(v).ok()?.parse().ok()?;
    let q = if p > new {
        p - new + old
    } else {
        p.min(old).max(1)
    };
    (q != p).then(|| q.to_string().into_bytes())
}

fn chars(b: &[u8]) -> u32 {
    let n = String::from_utf8_lossy(b).chars().count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(fields: &[(u8, &str)]) -> Vec<u8> {
        let mut b = BytesMut::new();
        let len = 4 + fields.iter().map(|(_, v)| v.len() + 2).sum::<usize>() + 1;
        b.put_u8(b'E');
        b.put_i32(len as i32);
        for (t, v) in fields {
            b.put_u8(*t);
            b.put_slice(v.as_bytes());
            b.put_u8(0);
        }
        b.put_u8(0);
        b.to_vec()
    }

    #[test]
    fn a_bind_error_names_the_clients_statement() {
        let mut r = Renamed::default();
        r.note((3, 3, 7), &Bytes::from_static(b"PGCARPOOL_15"), b"s1");
        let msg = error(&[
            (b'C', "08P01"),
            (
                b'M',
                "bind message supplies 2 parameters, but prepared statement \"PGCARPOOL_15\" requires 1",
            ),
        ]);
        let want = error(&[
            (b'C', "08P01"),
            (
                b'M',
                "bind message supplies 2 parameters, but prepared statement \"s1\" requires 1",
            ),
        ]);
        assert_eq!(r.restore(3, (7, false), &msg).unwrap()[..], want[..]);
        // Another round's error is not this rename's.
        assert!(r.restore(4, (7, false), &msg).is_none());
        // A later round forgets round 3.
        r.note((5, 4, 9), &Bytes::from_static(b"PGCARPOOL_2"), b"s2");
        assert!(r.restore(3, (7, false), &msg).is_none());
    }

    #[test]
    fn an_unrelated_error_is_left_alone() {
        let mut r = Renamed::default();
        r.note((0, 0, 0), &Bytes::from_static(b"PGCARPOOL_1"), b"x");
        let msg = error(&[(b'C', "22012"), (b'M', "division by zero")]);
        assert!(r.restore(0, (0, false), &msg).is_none());
        assert!(Renamed::default().restore(0, (0, false), &msg).is_none());
    }

    #[test]
    fn a_position_in_a_rewritten_text_is_the_clients() {
        let mut r = Renamed::default();
        let client = b"PREPARE p1 AS SELECT x FROM t0";
        let server = "PREPARE \"PGCARPOOL_7\" ";
        r.note_text(
            (2, 2, 4),
            (&Bytes::from_static(b"PGCARPOOL_7"), b"p1"),
            client,
            11,
            server,
        );
        // "x" is at 33 in the server's text, 22 in the client's.
        let msg = error(&[(b'C', "42703"), (b'P', "33")]);
        let want = error(&[(b'C', "42703"), (b'P', "22")]);
        assert_eq!(r.restore(2, (4, true), &msg).unwrap()[..], want[..]);
        // An error of a later Parse in the round is about its own text.
        assert!(r.restore(2, (6, true), &msg).is_none());
        // One of an Execute of the rewritten statement is about the rewritten text.
        assert_eq!(r.restore(2, (5, false), &msg).unwrap()[..], want[..]);
    }

    #[test]
    fn two_client_names_of_one_server_statement_are_told_apart() {
        // `B |s2|1,2`, `E`, `B |s1|1`, `E`, `S`: s1 and s2 are the same server statement.
        let mut r = Renamed::default();
        let server = Bytes::from_static(b"PGCARPOOL_3");
        r.note((1, 1, 10), &server, b"s2");
        r.note((1, 1, 12), &server, b"s1");
        // `D S s1` then `B |s1|`: one run of s1.
        r.note((1, 1, 13), &server, b"s1");
        r.note((1, 1, 15), &server, b"s2");
        let msg = error(&[
            (b'C', "08P01"),
            (b'M', "prepared statement \"PGCARPOOL_3\" requires 2"),
        ]);
        let named = |front| {
            let got = r.restore(1, (front, false), &msg).unwrap();
            String::from_utf8_lossy(&got).into_owned()
        };
        assert!(named(12).contains("\"s1\""), "{}", named(12));
        assert!(named(13).contains("\"s1\""), "{}", named(13));
        assert!(named(10).contains("\"s2\""), "{}", named(10));
        assert!(named(15).contains("\"s2\""), "{}", named(15));
        // An error of another message of the round: the first name noted.
        assert!(named(11).contains("\"s2\""), "{}", named(11));
    }
}
