//! Which SQL texts only read: the judgement read routing sends a transaction to a standby
//! on. Conservative: any doubt is a "no" (the primary serves it), never the other way.

use super::classify::{may_matter, split, strip_leading};

/// Words that, anywhere in a text (quoted or not: a false "no" only costs a standby
/// read), may mean it writes or cannot run on a standby: data changes, row locks
/// (`FOR UPDATE`/`FOR SHARE`), `SELECT … INTO`, sequences, transaction ids, locks,
/// notifications, large objects.
const WRITES: [&[u8]; 20] = [
    b"insert",
    b"update",
    b"delete",
    b"merge",
    b"into",
    b"share",
    b"lock",
    b"nextval",
    b"setval",
    b"txid_current",
    b"pg_current_xact_id",
    b"notify",
    b"pg_notify",
    b"copy",
    b"lo_create",
    b"lo_import",
    b"lo_unlink",
    b"lo_put",
    b"pg_advisory_lock",
    b"pg_advisory_xact_lock",
];

/// Does the text (a simple Query's, or a Parse's; up to a NUL) only read? Every statement
/// is a SELECT, VALUES, TABLE, WITH or SHOW that names nothing in [`WRITES`], or a
/// `BEGIN`/`START TRANSACTION … READ ONLY`, COMMIT, END or ROLLBACK; at least one reads
/// or opens a read-only block.
/// A plain `BEGIN` opens a block whose later statements may write: no. `calls`: calls of
/// functions pgcarpool does not know are allowed (a refusal of theirs can be answered
/// by running the text again on the primary, which only the simple protocol's requests
/// are kept for); otherwise such a call is a "no".
pub fn is_read(sql: &[u8], calls: bool) -> bool {
    let sql = sql.split(|&c| c == 0).next().unwrap_or_default();
    if !calls && may_matter(sql) {
        return false;
    }
    if words(sql).any(|w| WRITES.iter().any(|k| w.eq_ignore_ascii_case(k)))
        || calls && hides_state(sql)
    {
        return false;
    }
    let mut reads = false;
    for (a, b) in split(sql) {
        let stmt = &sql[a..b];
        let Some(first) = words(strip_leading(stmt)).next() else {
            return false;
        };
        let is = |k: &str| first.eq_ignore_ascii_case(k.as_bytes());
        if is("select") || is("values") || is("table") || is("with") || is("show") {
            reads = true;
        } else if is("begin") || is("start") {
            // A block that cannot write: read whatever comes in it.
            if !read_only_block(stmt) {
                return false;
            }
            reads = true;
        } else if is("commit") || is("end") || is("rollback") || is("abort") {
            if words(stmt).any(|w| w.eq_ignore_ascii_case(b"prepared")) {
                return false;
            }
        } else {
            return false;
        }
    }
    reads
}

/// `BEGIN`/`START TRANSACTION` naming READ ONLY (and not READ WRITE).
fn read_only_block(stmt: &[u8]) -> bool {
    let w: Vec<&[u8]> = words(stmt).collect();
    let pair = |a: &[u8], b: &[u8]| {
        w.windows(2)
            .any(|p| p[0].eq_ignore_ascii_case(a) && p[1].eq_ignore_ascii_case(b))
    };
    pair(b"read", b"only") && !pair(b"read", b"write")
}

/// What `may_matter` finds besides statement keywords and calls: settings changed from
/// SQL, advisory locks, temporary objects.
fn hides_state(sql: &[u8]) -> bool {
    words(sql).any(|w| {
        w.eq_ignore_ascii_case(b"set_config")
            || w.len() >= 8 && w[..8].eq_ignore_ascii_case(b"pg_advis")
            || w.eq_ignore_ascii_case(b"pg_temp")
    }) || split(sql).into_iter().any(|(a, b)| {
        let first = words(strip_leading(&sql[a..b])).next().unwrap_or_default();
        [
            "set", "reset", "discard", "listen", "create", "declare", "do", "call",
        ]
        .iter()
        .any(|k| first.eq_ignore_ascii_case(k.as_bytes()))
    })
}

/// The words of a text: runs of letters, digits and `_`.
fn words(s: &[u8]) -> impl Iterator<Item = &[u8]> {
    s.split(|c| !(c.is_ascii_alphanumeric() || *c == b'_'))
        .filter(|w| !w.is_empty())
}

#[cfg(test)]
mod tests {
    use super::is_read;

    #[test]
    fn plain_reads_are_reads() {
        for sql in [
            "SELECT 1",
            "select v from t where id = $1",
            "/* c */ SELECT count(*) FROM t;",
            "WITH x AS (SELECT 1) SELECT * FROM x",
            "VALUES (1)",
            "TABLE t",
            "SHOW TimeZone",
            "BEGIN READ ONLY; SELECT 1; COMMIT",
            "START TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY",
            "SELECT now(), coalesce(max(v), 0) FROM t",
        ] {
            assert!(is_read(sql.as_bytes(), false), "{sql}");
        }
    }

    #[test]
    fn writes_and_doubts_are_not() {
        for sql in [
            "INSERT INTO t VALUES (1)",
            "SELECT * INTO x FROM t",
            "SELECT * FROM t FOR UPDATE",
            "SELECT * FROM t FOR KEY SHARE",
            "WITH x AS (DELETE FROM t RETURNING *) SELECT * FROM x",
            "SELECT nextval('s')",
            "SELECT txid_current()",
            "BEGIN",
            "BEGIN; SELECT 1",
            "BEGIN READ WRITE; SELECT 1",
            "COMMIT",
            "SET x = 1; SELECT 1",
            "SELECT set_config('a.b', '1', false)",
            "SELECT pg_advisory_lock(1)",
            "COMMIT PREPARED 'x'",
            "EXPLAIN SELECT 1",
            "DECLARE c CURSOR FOR SELECT 1",
            "",
            "SELECT 1; UPDATE t SET v = 1",
        ] {
            assert!(!is_read(sql.as_bytes(), true), "{sql}");
        }
    }

    #[test]
    fn unknown_calls_only_where_a_refusal_can_be_replayed() {
        let sql = b"SELECT my_function(1)";
        assert!(is_read(sql, true));
        assert!(!is_read(sql, false));
        assert!(!is_read(b"SELECT f(); SET x = 1", true));
    }
}
