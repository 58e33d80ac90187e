//! What a session asks about itself, in a client's SQL text: `pg_backend_pid()` made the
//! client's virtual pid (the one its BackendKeyData gave) at the top level of its queries.
//! Pure text work: the client layer decides when (`classify::Effects::introspects`, a flag
//! of the classification every query already gets) and with what.

/// The names a query asks about its own session with. Any of them in a text sets
/// `Effects::introspects`.
pub const NAMES: [&[u8]; 4] = [
    b"pg_backend_pid",
    b"pg_terminate_backend",
    b"pg_cancel_backend",
    b"pg_prepared_statements",
];

/// Does `rest` start with one of `NAMES` (any case)? Cheap when it does not: two bytes
/// are looked at first.
pub fn named_at(rest: &[u8]) -> bool {
    rest.len() >= 14
        && rest[1] | 0x20 == b'g'
        && rest[2] == b'_'
        && NAMES.iter().any(|n| starts_with_ci(rest, n))
}

/// Does the text name any of `NAMES`?
pub fn mentions(sql: &[u8]) -> bool {
    (0..sql.len()).any(|i| sql[i] | 0x20 == b'p' && named_at(&sql[i..]))
}

/// The statements whose expressions can hold a scalar subquery anywhere a function call
/// can stand (not CALL, EXECUTE, DDL: defaults, views and function bodies keep the
/// server's own pid).
const QUERIES: [&[u8]; 9] = [
    b"select", b"with", b"values", b"table", b"insert", b"update", b"delete", b"explain", b"merge",
];

/// `sql` with every `pg_backend_pid()` at the top level of its queries (outside quotes,
/// comments and dollar quotes; unqualified or `pg_catalog.`) made `(SELECT vpid AS
/// pg_backend_pid)` (a scalar subquery: the column keeps its name and type), but where it
/// is the argument of `pg_terminate_backend` or `pg_cancel_backend` (the server signals
/// itself, as the session's own server). None: nothing to change.
pub fn rewrite(sql: &[u8], vpid: i32) -> Option<Vec<u8>> {
    let mut out: Vec<u8> = Vec::new();
    let mut copied = 0;
    for (a, b) in super::classify::split(sql) {
        let stmt = &sql[a..b];
        let first = super::classify::strip_leading(stmt);
        let word_end = first
            .iter()
            .position(|c| !c.is_ascii_alphabetic())
            .unwrap_or(first.len());
        let query = first.starts_with(b"(")
            || QUERIES
                .iter()
                .any(|k| first[..word_end].eq_ignore_ascii_case(k));
        if !query {
            continue;
        }
        for_each_word(stmt, |i| {
            let Some((start, end)) = backend_pid_call(stmt, i) else {
                return;
            };
            if signal_argument(&stmt[..start]) {
                return;
            }
            out.extend_from_slice(&sql[copied..a + start]);
            out.extend_from_slice(format!("(SELECT {vpid} AS pg_backend_pid)").as_bytes());
            copied = a + end;
        });
    }
    if copied == 0 {
        return None;
    }
    out.extend_from_slice(&sql[copied..]);
    Some(out)
}

/// A call `pg_backend_pid()` (or `pg_catalog.pg_backend_pid ( )`) whose name starts at
/// `i` in `s`: where the call starts (its qualification included) and ends.
fn backend_pid_call(s: &[u8], i: usize) -> Option<(usize, usize)> {
    const NAME: &[u8] = b"pg_backend_pid";
    if !starts_with_ci(&s[i..], NAME) {
        return None;
    }
    let mut j = i + NAME.len();
    if s.get(j).is_some_and(|c| is_ident(*c)) {
        return None;
    }
    j += skip_space(&s[j..]);
    if s.get(j) != Some(&b'(') {
        return None;
    }
    j += 1;
    j += skip_space(&s[j..]);
    if s.get(j) != Some(&b')') {
        return None;
    }
    let start = match s[..i].strip_suffix(b".") {
        None => i,
        Some(before) if ends_with_ci(before, b"pg_catalog") => {
            let at = before.len() - b"pg_catalog".len();
            if at > 0 && is_ident(s[at - 1]) {
                return None;
            }
            at
        }
        // Another schema's function of that name.
        Some(_) => return None,
    };
    Some((start, j + 1))
}

/// Does the text before a call end with `pg_terminate_backend(` or `pg_cancel_backend(`
/// (spaces allowed): the call is the pid it signals?
fn signal_argument(before: &[u8]) -> bool {
    let t = before.trim_ascii_end();
    let Some(t) = t.strip_suffix(b"(") else {
        return false;
    };
    let t = t.trim_ascii_end();
    [&b"pg_terminate_backend"[..], b"pg_cancel_backend"]
        .iter()
        .any(|n| ends_with_ci(t, n) && (t.len() == n.len() || !is_ident(t[t.len() - n.len() - 1])))
}

/// Calls `f` with the position of each word start of `s` that is SQL code: outside
/// string literals, quoted identifiers, comments and dollar quotes.
fn for_each_word(s: &[u8], mut f: impl FnMut(usize)) {
    let n = s.len();
    let mut i = 0;
    while i < n {
        match s[i] {
            q @ (b'\'' | b'"') => {
                i += 1;
                while i < n {
                    if s[i] == q {
                        if s.get(i + 1) == Some(&q) {
                            i += 2;
                            continue;
                        }
                        break;
                    }
                    if q == b'\'' && s[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
            }
            b'-' if s.get(i + 1) == Some(&b'-') => {
                while i < n && s[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if s.get(i + 1) == Some(&b'*') => {
                let mut depth = 0;
                while i < n {
                    if s[i..].starts_with(b"/*") {
                        depth += 1;
                        i += 2;
                    } else if s[i..].starts_with(b"*/") {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
            }
            b'$' if i == 0 || !is_ident(s[i - 1]) => {
                let tag_end = s[i + 1..]
                    .iter()
                    .position(|&c| !(c.is_ascii_alphanumeric() || c == b'_'))
                    .map(|p| i + 1 + p);
                match tag_end {
                    Some(j) if s[j] == b'$' && (j == i + 1 || !s[i + 1].is_ascii_digit()) => {
                        let tag = &s[i..=j];
                        i = j + 1;
                        while i < n && !s[i..].starts_with(tag) {
                            i += 1;
                        }
                        i += tag.len();
                    }
                    _ => i += 1,
                }
            }
            c if is_ident(c) => {
                if i == 0 || !is_ident(s[i - 1]) {
                    f(i);
                }
                i += 1;
            }
            _ => i += 1,
        }
    }
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'$'
}

fn skip_space(s: &[u8]) -> usize {
    s.iter().take_while(|c| c.is_ascii_whitespace()).count()
}

fn starts_with_ci(hay: &[u8], needle: &[u8]) -> bool {
    hay.len() >= needle.len() && hay[..needle.len()].eq_ignore_ascii_case(needle)
}

fn ends_with_ci(hay: &[u8], needle: &[u8]) -> bool {
    hay.len() >= needle.len() && hay[hay.len() - needle.len()..].eq_ignore_ascii_case(needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rw(sql: &str) -> Option<String> {
        rewrite(sql.as_bytes(), 4242).map(|v| String::from_utf8(v).unwrap())
    }

    #[test]
    fn backend_pid_at_the_top_level_is_the_virtual_pid() {
        assert_eq!(
            rw("select pg_backend_pid()").as_deref(),
            Some("select (SELECT 4242 AS pg_backend_pid)")
        );
        assert_eq!(
            rw("SELECT x FROM t WHERE pid = PG_CATALOG.pg_backend_pid ( ); select 1").as_deref(),
            Some("SELECT x FROM t WHERE pid = (SELECT 4242 AS pg_backend_pid); select 1")
        );
        assert_eq!(
            rw("insert into t values (pg_backend_pid()) returning pg_backend_pid()").as_deref(),
            Some(
                "insert into t values ((SELECT 4242 AS pg_backend_pid)) returning (SELECT 4242 AS pg_backend_pid)"
            )
        );
    }

    #[test]
    fn backend_pid_elsewhere_is_left_to_the_server() {
        for sql in [
            "select 'pg_backend_pid()'",
            "select \"pg_backend_pid\"()",
            "select 1 -- pg_backend_pid()",
            "select $$pg_backend_pid()$$",
            "select /* pg_backend_pid() */ 1",
            "select my.pg_backend_pid()",
            "select xpg_backend_pid()",
            "select pg_backend_pidx()",
            "select pg_backend_pid",
            "create table t (a int default pg_backend_pid())",
            "call p(pg_backend_pid())",
            "do $$begin perform pg_backend_pid(); end$$",
            "select pg_terminate_backend(pg_backend_pid())",
            "select pg_catalog.pg_cancel_backend ( pg_catalog.pg_backend_pid())",
        ] {
            assert_eq!(rw(sql), None, "{sql}");
        }
    }

    #[test]
    fn names_are_spotted_cheaply() {
        assert!(named_at(b"pg_backend_pid()"));
        assert!(named_at(b"PG_PREPARED_STATEMENTS"));
        assert!(!named_at(b"pg_temp.t"));
        assert!(!named_at(b"pg_"));
        assert!(mentions(b"select * from Pg_Prepared_Statements"));
        assert!(mentions(b"select pg_cancel_backend(1)"));
        assert!(!mentions(b"select pg_sleep(1)"));
    }
}
