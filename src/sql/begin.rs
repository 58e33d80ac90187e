//! The transaction starts pgcarpool may answer itself (`deferred_begin`): a query that is
//! only `BEGIN` or `START TRANSACTION`, with modes that cannot fail on any server, and the
//! bare `COMMIT`/`ROLLBACK` that ends such a block before anything ran in it. Pure text
//! work on one query's bytes; anything else (a comment, a mode given twice, `SERIALIZABLE`
//! or `READ WRITE`, which a hot standby refuses at the BEGIN) is not recognised, and goes
//! to a server as it is.

/// A recognised `BEGIN`: what the client gets as its CommandComplete, and what a server
/// gets when the block's first statement comes (`Begin::query`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Begin {
    /// Said as `START TRANSACTION` (its CommandComplete tag) rather than `BEGIN`.
    start: bool,
    isolation: Option<Isolation>,
    read_only: bool,
    /// `DEFERRABLE` (true) or `NOT DEFERRABLE` (false).
    deferrable: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Isolation {
    ReadUncommitted,
    ReadCommitted,
    RepeatableRead,
}

/// Most words a recognised query has (`START TRANSACTION ISOLATION LEVEL REPEATABLE READ,
/// READ ONLY, NOT DEFERRABLE`: 12 and two commas).
const MAX_WORDS: usize = 16;

/// The words of a query of letters, whitespace and commas (a comma is a word), with at
/// most a `;` (then only whitespace) at its end, and how many; None for anything else or
/// more than `MAX_WORDS`. No allocation: it looks at every query of an idle client.
fn words(sql: &[u8]) -> Option<([&[u8]; MAX_WORDS], usize)> {
    let end = sql
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    let body = sql[..end].strip_suffix(b";").unwrap_or(&sql[..end]);
    let mut out: [&[u8]; MAX_WORDS] = [&[]; MAX_WORDS];
    let mut n = 0;
    let mut i = 0;
    while i < body.len() {
        let c = body[i];
        let len = if c.is_ascii_whitespace() {
            i += 1;
            continue;
        } else if c == b',' {
            1
        } else if c.is_ascii_alphabetic() {
            let len = body[i..]
                .iter()
                .position(|c| !c.is_ascii_alphabetic())
                .unwrap_or(body.len() - i);
            // A letter run followed by a digit, `_` or `$` is some other identifier.
            if body
                .get(i + len)
                .is_some_and(|c| c.is_ascii_digit() || *c == b'_' || *c == b'$')
            {
                return None;
            }
            len
        } else {
            return None;
        };
        *out.get_mut(n)? = &body[i..i + len];
        n += 1;
        i += len;
    }
    Some((out, n))
}

/// The first byte of `sql` after whitespace, in lower case (0: none).
fn first_letter(sql: &[u8]) -> u8 {
    sql.iter()
        .find(|c| !c.is_ascii_whitespace())
        .map_or(0, |c| c.to_ascii_lowercase())
}

/// Whether `sql`'s first word, after whitespace, starts with `begin` or `start` (in any
/// case): the one look most queries (a SELECT among them) take. `sql` may run on past the
/// query (a message's bytes after its header).
pub fn may_begin(sql: &[u8]) -> bool {
    let at = sql.iter().position(|c| !c.is_ascii_whitespace());
    let head = at.and_then(|at| sql.get(at..at + 5));
    head.is_some_and(|h| h.eq_ignore_ascii_case(b"begin") || h.eq_ignore_ascii_case(b"start"))
}

fn is(w: Option<&&[u8]>, word: &str) -> bool {
    w.is_some_and(|w| w.eq_ignore_ascii_case(word.as_bytes()))
}

impl Begin {
    /// `sql`, a whole query, as a transaction start pgcarpool may answer itself.
    pub fn parse(sql: &[u8]) -> Option<Begin> {
        if !may_begin(sql) {
            return None;
        }
        let (w, n) = words(sql)?;
        let w = &w[..n];
        let mut at = 1;
        let start = if is(w.first(), "begin") {
            if is(w.get(1), "work") || is(w.get(1), "transaction") {
                at = 2;
            }
            false
        } else if is(w.first(), "start") && is(w.get(1), "transaction") {
            at = 2;
            true
        } else {
            return None;
        };
        let mut b = Begin {
            start,
            isolation: None,
            read_only: false,
            deferrable: None,
        };
        let mut modes = 0;
        while at < w.len() {
            if modes > 0 && is(w.get(at), ",") {
                at += 1;
            }
            at = b.mode(w, at)?;
            modes += 1;
        }
        Some(b)
    }

    /// One transaction mode at `w[at]`: the index after it, or None (not one, one given
    /// before, or one that can fail).
    fn mode(&mut self, w: &[&[u8]], at: usize) -> Option<usize> {
        let word = |k: usize, s: &str| is(w.get(at + k), s);
        if word(0, "isolation") && word(1, "level") && self.isolation.is_none() {
            let (level, n) = if word(2, "read") && word(3, "committed") {
                (Isolation::ReadCommitted, 4)
            } else if word(2, "read") && word(3, "uncommitted") {
                (Isolation::ReadUncommitted, 4)
            } else if word(2, "repeatable") && word(3, "read") {
                (Isolation::RepeatableRead, 4)
            } else {
                // SERIALIZABLE fails on a hot standby, at the BEGIN.
                return None;
            };
            self.isolation = Some(level);
            return Some(at + n);
        }
        if word(0, "read") && word(1, "only") && !self.read_only {
            self.read_only = true;
            return Some(at + 2);
        }
        if word(0, "deferrable") && self.deferrable.is_none() {
            self.deferrable = Some(true);
            return Some(at + 1);
        }
        if word(0, "not") && word(1, "deferrable") && self.deferrable.is_none() {
            self.deferrable = Some(false);
            return Some(at + 2);
        }
        None
    }

    /// The CommandComplete tag PostgreSQL answers it with.
    pub fn tag(&self) -> &'static str {
        if self.start {
            "START TRANSACTION"
        } else {
            "BEGIN"
        }
    }

    /// The text a server is sent for it: the same block, in PostgreSQL's own words.
    pub fn sql(&self) -> [&'static str; 4] {
        [
            "BEGIN",
            match self.isolation {
                None => "",
                Some(Isolation::ReadUncommitted) => " ISOLATION LEVEL READ UNCOMMITTED",
                Some(Isolation::ReadCommitted) => " ISOLATION LEVEL READ COMMITTED",
                Some(Isolation::RepeatableRead) => " ISOLATION LEVEL REPEATABLE READ",
            },
            if self.read_only { " READ ONLY" } else { "" },
            match self.deferrable {
                None => "",
                Some(true) => " DEFERRABLE",
                Some(false) => " NOT DEFERRABLE",
            },
        ]
    }
}

/// `sql`, a whole query, as a bare end of a block (`COMMIT`, `END`, `ROLLBACK`, `ABORT`,
/// with `WORK` or `TRANSACTION`): its CommandComplete tag. None for anything else (`AND
/// CHAIN`, `PREPARED`, `TO SAVEPOINT`…).
pub fn bare_end(sql: &[u8]) -> Option<&'static str> {
    if !matches!(first_letter(sql), b'c' | b'e' | b'r' | b'a') {
        return None;
    }
    let (w, n) = words(sql)?;
    let w = &w[..n];
    let tag = if is(w.first(), "commit") || is(w.first(), "end") {
        "COMMIT"
    } else if is(w.first(), "rollback") || is(w.first(), "abort") {
        "ROLLBACK"
    } else {
        return None;
    };
    match w.len() {
        1 => Some(tag),
        2 if is(w.get(1), "work") || is(w.get(1), "transaction") => Some(tag),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(b: Begin) -> String {
        b.sql().concat()
    }

    #[test]
    fn bare_begins_and_their_modes_are_recognised() {
        let cases: [(&str, &str, &str); 9] = [
            ("BEGIN", "BEGIN", "BEGIN"),
            ("begin;", "BEGIN", "BEGIN"),
            ("  Begin Work ;  \n", "BEGIN", "BEGIN"),
            ("begin transaction", "BEGIN", "BEGIN"),
            ("START TRANSACTION", "START TRANSACTION", "BEGIN"),
            (
                "begin isolation level repeatable read, read only",
                "BEGIN",
                "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
            ),
            (
                "start transaction read only not deferrable",
                "START TRANSACTION",
                "BEGIN READ ONLY NOT DEFERRABLE",
            ),
            (
                "BEGIN ISOLATION LEVEL READ UNCOMMITTED",
                "BEGIN",
                "BEGIN ISOLATION LEVEL READ UNCOMMITTED",
            ),
            (
                "begin deferrable , isolation level read committed",
                "BEGIN",
                "BEGIN ISOLATION LEVEL READ COMMITTED DEFERRABLE",
            ),
        ];
        for (sql, tag, sent) in cases {
            let b = Begin::parse(sql.as_bytes()).unwrap_or_else(|| panic!("{sql}"));
            assert_eq!((b.tag(), text(b).as_str()), (tag, sent), "{sql}");
        }
    }

    #[test]
    fn anything_else_goes_to_a_server() {
        for sql in [
            "",
            "BEGIN; SELECT 1",
            "BEGIN -- why",
            "/* x */ BEGIN",
            "begin isolation level serializable",
            "begin read write",
            "begin read only read only",
            "begin isolation level read committed isolation level read committed",
            "begin, read only",
            "begin read only,",
            "begin read only,, deferrable",
            "begin isolation level",
            "begin isolation level bogus",
            "start",
            "start work",
            "begin work transaction",
            "begin1",
            "begin_x",
            "beginning",
            "BEGIN;;",
            "commit",
            "begin deferrable deferrable",
            "begin not deferrable deferrable",
        ] {
            assert_eq!(Begin::parse(sql.as_bytes()), None, "{sql}");
        }
        // More words than any recognised BEGIN has.
        let long = format!("begin{}", " , read only".repeat(9));
        assert_eq!(Begin::parse(long.as_bytes()), None, "{long}");
    }

    #[test]
    fn bare_ends() {
        for (sql, tag) in [
            ("COMMIT", Some("COMMIT")),
            ("end;", Some("COMMIT")),
            ("commit work", Some("COMMIT")),
            ("END TRANSACTION ;", Some("COMMIT")),
            ("rollback", Some("ROLLBACK")),
            ("abort work", Some("ROLLBACK")),
            ("commit and chain", None),
            ("commit and no chain", None),
            ("rollback to savepoint a", None),
            ("commit prepared 'x'", None),
            ("commit; select 1", None),
            ("-- c\ncommit", None),
            ("begin", None),
        ] {
            assert_eq!(bare_end(sql.as_bytes()), tag, "{sql}");
        }
    }
}
