//! What a session asks about itself, in a client's SQL text: `pg_backend_pid()` made the
//! client's virtual pid (the one its BackendKeyData gave) at the top level of its queries.
//! Pure text work: the client layer decides when (`classify::Effects::introspects`, a flag
//! of the classification every query already gets) and with what.

use super::classify::is_ident_char as is_ident;

/// The names a query asks about its own session with. Any of them in a text sets
/// `Effects::introspects`.
pub const NAMES: [&[u8]; 6] = [
    b"pg_backend_pid",
    b"pg_terminate_backend",
    b"pg_cancel_backend",
    b"pg_prepared_statements",
    b"pg_stat_activity",
    b"pg_locks",
];

/// Does `rest` start with one of `NAMES` (any case)? Cheap when it does not: two bytes
/// are looked at first.
#[inline]
pub fn named_at(rest: &[u8]) -> bool {
    rest.len() >= 8
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

/// The catalog views a client's query gets its own session's version of, in `Own::views`'
/// order: its prepared statements (`view_query`), and the views with a row per backend
/// keyed by `pid` (`pid_view_query`).
pub const VIEWS: [&str; 3] = ["pg_prepared_statements", "pg_stat_activity", "pg_locks"];

/// `sql` as the client's own session would run it, for the queries among its statements
/// (outside quotes, comments and dollar quotes):
/// - every `pg_backend_pid()` (unqualified or `pg_catalog.`) made `(SELECT vpid AS
///   pg_backend_pid)` (a scalar subquery: the column keeps its name and type), but where it
///   is the argument of `pg_terminate_backend` or `pg_cancel_backend` (the server signals
///   itself, as the session's own server);
/// - with `views[k]` (the body standing for `VIEWS[k]`), a statement that reads that view
///   gets it as a CTE of that name in front (a `pg_catalog.` qualification dropped), which
///   shadows the catalog view for the whole statement (not in EXPLAIN, which shows a plan);
/// - `pg_terminate_backend(N)` / `pg_cancel_backend(N)` with an integer literal `N`: the
///   client's own pid becomes `pg_catalog.pg_backend_pid()` (its server signals itself);
///   another client's pid is given to `own.signal`, and when it signalled that client the
///   call becomes `(SELECT true AS pg_terminate_backend)` (or `pg_cancel_backend`);
/// - such a call with a pid the query computes (`signal::computed_call`) is made a `CASE`
///   that marks the pids of the clients the client may signal (`Own::targets`) for
///   pgcarpool to signal while the query runs (`signal::edits`).
///
/// None: nothing to change.
pub fn rewrite(sql: &[u8], own: &mut Own) -> Option<Vec<u8>> {
    let (vpid, views) = (own.vpid, own.views);
    let mut edits: Vec<(usize, usize, String)> = Vec::new();
    let mut targets: Option<Vec<i32>> = None;
    for (a, b) in super::classify::split(sql) {
        let stmt = &sql[a..b];
        let Some((at, word)) = query_word(stmt) else {
            continue;
        };
        let views = if word.eq_ignore_ascii_case(b"explain") {
            [None; VIEWS.len()]
        } else {
            views
        };
        let before = edits.len();
        let mut reads = [false; VIEWS.len()];
        for_each_word(stmt, |i| {
            if let Some((start, end)) = backend_pid_call(stmt, i)
                && !signal_argument(&stmt[..start])
            {
                let own = format!("(SELECT {vpid} AS pg_backend_pid)");
                edits.push((a + start, a + end, own));
            } else if let Some((start, end, text)) = signal_edit(stmt, i, own) {
                edits.push((a + start, a + end, text));
            } else if let Some(call) = super::signal::computed_call(stmt, i) {
                // Its argument is repeated in the CASE as the session reads it.
                let x = fragment(stmt, call.arg, vpid, &views);
                let rest = fragment(stmt, (call.arg.1, call.close), vpid, &views);
                let targets = targets.get_or_insert_with(|| (own.targets)());
                for (start, end, text) in
                    super::signal::edits(stmt, &call, (&x, &rest), vpid, targets)
                {
                    edits.push((a + start, a + end, text));
                }
            } else if let Some((k, start)) = (0..VIEWS.len())
                .filter(|k| views[*k].is_some())
                .find_map(|k| view_name(stmt, i, VIEWS[k]).map(|start| (k, start)))
            {
                reads[k] = true;
                if start < i {
                    edits.push((a + start, a + i, String::new()));
                }
            }
        });
        let ctes: Vec<String> = (0..VIEWS.len())
            .filter_map(|k| {
                Some(format!(
                    "{} AS ({})",
                    VIEWS[k],
                    views[k].filter(|_| reads[k])?
                ))
            })
            .collect();
        if ctes.is_empty() {
            continue;
        }
        let ctes = ctes.join(", ");
        let cte = if word.eq_ignore_ascii_case(b"with") {
            let mut after = a + at + word.len();
            let rest = &sql[after..b];
            let skip = skip_space(rest);
            if starts_with_ci(&rest[skip..], b"recursive") {
                after += skip + b"recursive".len();
            }
            (after, format!(" {ctes},"))
        } else {
            (a + at, format!("WITH {ctes} "))
        };
        edits.insert(before, (cte.0, cte.0, cte.1));
    }
    if edits.is_empty() {
        return None;
    }
    Some(apply(sql, edits))
}

/// `sql` with `edits` (start, end, replacement; in any order) made, in the order of their
/// starts; one that overlaps an earlier one is left out.
fn apply(sql: &[u8], mut edits: Vec<(usize, usize, String)>) -> Vec<u8> {
    edits.sort_by_key(|e| e.0);
    let mut out = Vec::with_capacity(sql.len() + 64);
    let mut copied = 0;
    for (start, end, text) in edits {
        if start < copied {
            continue;
        }
        out.extend_from_slice(&sql[copied..start]);
        out.extend_from_slice(text.as_bytes());
        copied = end;
    }
    out.extend_from_slice(&sql[copied..]);
    out
}

/// The text of `s` from `from` to `to` as the client's session reads it (`rewrite`): its
/// `pg_backend_pid()` calls the client's pid, the views of `views` unqualified (for their
/// CTE, which the statement gets from its own mention of them).
fn fragment(
    s: &[u8],
    (from, to): (usize, usize),
    vpid: i32,
    views: &[Option<&str>; VIEWS.len()],
) -> String {
    let mut edits = Vec::new();
    for_each_word(&s[..to], |i| {
        if i < from {
            return;
        }
        if let Some((start, end)) = backend_pid_call(&s[..to], i)
            && start >= from
            && !signal_argument(&s[..start])
        {
            edits.push((
                start - from,
                end - from,
                format!("(SELECT {vpid} AS pg_backend_pid)"),
            ));
        } else if let Some(start) = (0..VIEWS.len())
            .filter(|k| views[*k].is_some())
            .find_map(|k| view_name(&s[..to], i, VIEWS[k]))
            && start >= from
            && start < i
        {
            edits.push((start - from, i - from, String::new()));
        }
    });
    String::from_utf8_lossy(&apply(&s[from..to], edits)).into_owned()
}

/// A statement `rewrite` looks into (`QUERIES`): where its first word starts (after
/// comments and spaces), and that word (empty when it starts with `(`).
fn query_word(stmt: &[u8]) -> Option<(usize, &[u8])> {
    let first = super::classify::strip_leading(stmt);
    let at = stmt.len() - first.len();
    let word_end = first
        .iter()
        .position(|c| !c.is_ascii_alphabetic())
        .unwrap_or(first.len());
    let word = &first[..word_end];
    (first.starts_with(b"(") || QUERIES.iter().any(|k| word.eq_ignore_ascii_case(k)))
        .then_some((at, word))
}

/// Which of `VIEWS` a query among the statements of `sql` reads, where `rewrite` puts the
/// client's own in its place.
pub fn reads_views(sql: &[u8]) -> [bool; VIEWS.len()] {
    let mut reads = [false; VIEWS.len()];
    for (a, b) in super::classify::split(sql) {
        let stmt = &sql[a..b];
        match query_word(stmt) {
            Some((_, word)) if !word.eq_ignore_ascii_case(b"explain") => {}
            _ => continue,
        }
        for_each_word(stmt, |i| {
            for (k, name) in VIEWS.iter().enumerate() {
                reads[k] |= view_name(stmt, i, name).is_some();
            }
        });
    }
    reads
}

/// Does a query among the statements of `sql` signal a pid it computes
/// (`signal::computed_call`), which `rewrite` marks for the clients of when it runs?
pub fn computes_signals(sql: &[u8]) -> bool {
    let mut found = false;
    for (a, b) in super::classify::split(sql) {
        let stmt = &sql[a..b];
        if query_word(stmt).is_some() {
            for_each_word(stmt, |i| {
                found |= super::signal::computed_call(stmt, i).is_some();
            });
        }
    }
    found
}

/// The view `name` as a word starting at `i` in `s` (not followed by `(`): where its name
/// starts with a `pg_catalog.` qualification, else `i`. None: not it, or another schema's.
fn view_name(s: &[u8], i: usize, name: &str) -> Option<usize> {
    let name = name.as_bytes();
    if !starts_with_ci(&s[i..], name) || s.get(i + name.len()).is_some_and(|c| is_ident(*c)) {
        return None;
    }
    match s[..i].strip_suffix(b".") {
        None => Some(i),
        Some(before) if ends_with_ci(before, b"pg_catalog") => {
            let at = before.len() - b"pg_catalog".len();
            (at == 0 || !is_ident(s[at - 1])).then_some(at)
        }
        Some(_) => None,
    }
}

/// One of the client's prepared statements, as its `pg_prepared_statements` row shows it.
pub struct Prepared<'a> {
    /// The client's name for it.
    pub name: &'a [u8],
    /// Its text as the client gave it.
    pub statement: &'a [u8],
    /// The name the server holds it by.
    pub server_name: &'a [u8],
    /// Made by SQL PREPARE.
    pub from_sql: bool,
}

/// The query that stands for `pg_prepared_statements` in a client's statement: the
/// client's statements (its names, texts, `from_sql`), each with what the server holding
/// it under its own name says of it (prepare time, parameter and result types, plan
/// counts, whichever of them this PostgreSQL version has), the columns in the catalog
/// view's order (the view's row type is filled in by `jsonb_populate_record`).
pub fn view_query(rows: &[Prepared]) -> String {
    let values: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "({}, {}, {}, {})",
                literal(r.name),
                literal(r.statement),
                literal(r.server_name),
                r.from_sql
            )
        })
        .collect();
    let v = if values.is_empty() {
        "SELECT NULL::text, NULL::text, NULL::text, NULL::bool WHERE false".to_string()
    } else {
        format!("VALUES {}", values.join(", "))
    };
    format!(
        "SELECT r.* FROM ({v}) AS v(name, statement, server_name, from_sql) \
         LEFT JOIN pg_catalog.pg_prepared_statements s ON s.name = v.server_name, \
         LATERAL pg_catalog.jsonb_populate_record(s, pg_catalog.jsonb_build_object(\
         'name', v.name, 'statement', v.statement, 'from_sql', v.from_sql)) AS r"
    )
}

/// The query that stands for `view`, one of the `VIEWS` with a row per backend keyed by
/// `pid`, in the statement `text` of the client given pid `vpid`: the catalog view's rows,
/// with the server running the statement under `vpid` (and, in `pg_stat_activity`, its
/// `query` the client's `text`, not the rewritten one), the servers running other
/// clients' work (`servers`: server pid, client pid, as the statement was rewritten) under
/// their clients' pids, the others (idle servers, other connections) as they are. The
/// columns stay the view's, whichever this PostgreSQL version has (`jsonb_populate_record`
/// keeps the row type).
pub fn pid_view_query(view: &str, vpid: i32, servers: &[(i32, i32)], text: &[u8]) -> String {
    let m = if servers.is_empty() {
        "SELECT NULL::pg_catalog.int4, NULL::pg_catalog.int4 WHERE false".to_string()
    } else {
        let v: Vec<String> = servers.iter().map(|(s, c)| format!("({s}, {c})")).collect();
        format!("VALUES {}", v.join(", "))
    };
    let own = "s.pid = pg_catalog.pg_backend_pid()";
    let query = if view == "pg_stat_activity" {
        // (Where it shows the query: `state` is NULL where the role may not see it.)
        format!(
            ", 'query', CASE WHEN {own} AND s.state = 'active' THEN {} ELSE s.query END",
            literal(text)
        )
    } else {
        String::new()
    };
    format!(
        "SELECT r.* FROM pg_catalog.{view} s LEFT JOIN ({m}) AS m(server, client) \
         ON m.server = s.pid, LATERAL pg_catalog.jsonb_populate_record(s, \
         pg_catalog.jsonb_build_object('pid', CASE WHEN {own} THEN {vpid} \
         ELSE COALESCE(m.client, s.pid) END{query})) AS r"
    )
}

/// `b` as an SQL string literal (an `E''` one: backslashes are doubled).
fn literal(b: &[u8]) -> String {
    let t = String::from_utf8_lossy(b);
    format!("E'{}'", t.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// What `rewrite` is to know and do for the client's session.
pub struct Own<'a> {
    /// The client's pid (its BackendKeyData's).
    pub vpid: i32,
    /// The bodies standing for `VIEWS` (`view_query`, `pid_view_query`), for those the
    /// text reads (`reads_views`).
    pub views: [Option<&'a str>; VIEWS.len()],
    /// A pid the text signals that is not the client's own: true when it is another
    /// client's and pgcarpool signalled it.
    pub signal: &'a mut dyn FnMut(Signal, i32) -> bool,
    /// The pids of the clients the client may signal, for a call whose pid the query
    /// computes (`signal::edits`).
    pub targets: &'a mut dyn FnMut() -> Vec<i32>,
}

/// What `pg_terminate_backend` and `pg_cancel_backend` ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Terminate,
    Cancel,
}

/// A call `pg_terminate_backend(N …)` or `pg_cancel_backend(N …)` whose name starts at `i`
/// in `s`, with an integer literal `N` (a cast after it allowed): the edit that makes it
/// the client's (`rewrite`).
fn signal_edit(s: &[u8], i: usize, own: &mut Own) -> Option<(usize, usize, String)> {
    let (kind, name): (Signal, &[u8]) = if starts_with_ci(&s[i..], b"pg_terminate_backend") {
        (Signal::Terminate, b"pg_terminate_backend")
    } else if starts_with_ci(&s[i..], b"pg_cancel_backend") {
        (Signal::Cancel, b"pg_cancel_backend")
    } else {
        return None;
    };
    let mut j = i + name.len();
    j += skip_space(&s[j..]);
    if s.get(j) != Some(&b'(') {
        return None;
    }
    j += 1;
    j += skip_space(&s[j..]);
    let lit_start = j;
    if s.get(j) == Some(&b'$') {
        return param_signal_edit(s, (i, lit_start), own.vpid, name);
    }
    if s.get(j) == Some(&b'-') {
        j += 1;
    }
    let digits = s[j..].iter().take_while(|c| c.is_ascii_digit()).count();
    if digits == 0 || digits > 10 {
        return None;
    }
    j += digits;
    let lit_end = j;
    let pid: i32 = std::str::from_utf8(&s[lit_start..lit_end])
        .ok()?
        .parse()
        .ok()?;
    if s.get(j).is_some_and(|c| is_ident(*c) || *c == b'.') {
        return None;
    }
    if pid == own.vpid {
        return Some((lit_start, lit_end, "pg_catalog.pg_backend_pid()".into()));
    }
    // The whole call, to its closing parenthesis (a timeout argument and casts in it).
    let mut depth = 1;
    while depth > 0 {
        match s.get(j)? {
            b'(' => depth += 1,
            b')' => depth -= 1,
            b'\'' | b'"' | b'$' | b';' => return None,
            _ => {}
        }
        j += 1;
    }
    let start = match s[..i].strip_suffix(b".") {
        None => i,
        Some(before) if ends_with_ci(before, b"pg_catalog") => before.len() - b"pg_catalog".len(),
        Some(_) => return None,
    };
    if !(own.signal)(kind, pid) {
        return None;
    }
    let column = String::from_utf8_lossy(name);
    Some((start, j, format!("(SELECT true AS {column})")))
}

/// `pg_terminate_backend($n …)` / `pg_cancel_backend($n …)` (name at `i`, `$n` at `arg`):
/// the call made the one `signal_params` finds, whose Bind pgcarpool looks at: the server
/// answers `true` for the client's own pid (which pgcarpool puts in the Bind for another
/// client it signalled; its own pid it makes its server's), else signals the pid given.
fn param_signal_edit(
    s: &[u8],
    (i, arg): (usize, usize),
    vpid: i32,
    name: &[u8],
) -> Option<(usize, usize, String)> {
    let digits = s[arg + 1..]
        .iter()
        .take_while(|c| c.is_ascii_digit())
        .count();
    if digits == 0 {
        return None;
    }
    // The first argument (a cast after it allowed), then the rest of the call.
    let (mut j, mut depth, mut arg_end) = (arg + 1 + digits, 1, None);
    while depth > 0 {
        match s.get(j)? {
            b'(' => depth += 1,
            b')' => depth -= 1,
            b',' if depth == 1 => {
                arg_end.get_or_insert(j);
            }
            b'\'' | b'"' | b'$' | b';' => return None,
            _ => {}
        }
        j += 1;
    }
    let close = j - 1;
    let arg_end = arg_end.unwrap_or(close);
    let start = match s[..i].strip_suffix(b".") {
        None => i,
        Some(before) if ends_with_ci(before, b"pg_catalog") => before.len() - b"pg_catalog".len(),
        Some(_) => return None,
    };
    let (a, rest) = (
        String::from_utf8_lossy(&s[arg..arg_end]),
        String::from_utf8_lossy(&s[arg_end..close]),
    );
    let name = String::from_utf8_lossy(name);
    let case = format!(
        "CASE ({a})::pg_catalog.int4 WHEN {vpid} THEN true \
         ELSE pg_catalog.{name}(({a})::pg_catalog.int4{rest}) END"
    );
    // A whole item of a select list gets the column name by an alias, and is evaluated
    // where PostgreSQL evaluates the call (a server signalling itself sends the row before
    // its FATAL); elsewhere, a scalar subquery keeps the name.
    let text = if list_item(&s[..start], &s[j..]) {
        format!("{case} AS {name}")
    } else {
        format!("(SELECT {case} AS {name})")
    };
    Some((start, j, text))
}

/// Is what stands between `before` and `after` a whole item of a select list without an
/// alias: after `SELECT` or a `,`, before a `,`, the end or a clause that follows the list?
fn list_item(before: &[u8], after: &[u8]) -> bool {
    let b = before.trim_ascii_end();
    let opens = b.ends_with(b",")
        || (ends_with_ci(b, b"select") && (b.len() == 6 || !is_ident(b[b.len() - 7])));
    let a = after.trim_ascii_start();
    let word_end = a.iter().position(|c| !is_ident(*c)).unwrap_or(a.len());
    const FOLLOW: [&[u8]; 10] = [
        b"from",
        b"where",
        b"group",
        b"having",
        b"window",
        b"order",
        b"limit",
        b"offset",
        b"union",
        b"returning",
    ];
    let closes = a.is_empty()
        || a.starts_with(b",")
        || a.starts_with(b";")
        || FOLLOW.iter().any(|k| a[..word_end].eq_ignore_ascii_case(k));
    opens && closes
}

/// The parameters (0-based) a rewritten text signals (`param_signal_edit`), and how.
pub fn signal_params(sql: &[u8], vpid: i32) -> Vec<(usize, Signal)> {
    const HEAD: &[u8] = b"CASE ($";
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(p) = sql[at..].windows(HEAD.len()).position(|w| w == HEAD) {
        let from = at + p + HEAD.len();
        at = from;
        let digits = sql[from..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        let Some(n) = std::str::from_utf8(&sql[from..from + digits])
            .ok()
            .and_then(|d| d.parse::<usize>().ok())
            .filter(|n| *n > 0)
        else {
            continue;
        };
        let tail = &sql[from + digits..];
        let when = format!(" WHEN {vpid} THEN true ELSE pg_catalog.pg_");
        let Some(w) = tail.windows(when.len()).position(|x| x == when.as_bytes()) else {
            continue;
        };
        let kind = &tail[w + when.len()..];
        if kind.starts_with(b"terminate_backend(") {
            out.push((n - 1, Signal::Terminate));
        } else if kind.starts_with(b"cancel_backend(") {
            out.push((n - 1, Signal::Cancel));
        }
    }
    out
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
/// string literals, quoted identifiers, comments and dollar quotes
/// (`classify::skip_quoted`).
fn for_each_word(s: &[u8], mut f: impl FnMut(usize)) {
    let mut i = 0;
    while i < s.len() {
        if super::classify::QUOTE_START[usize::from(s[i])]
            && let Some(end) = super::classify::skip_quoted(s, i)
        {
            i = end;
            continue;
        }
        if is_ident(s[i]) && (i == 0 || !is_ident(s[i - 1])) {
            f(i);
        }
        i += 1;
    }
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

    fn with(sql: &str, vpid: i32, view: Option<&str>) -> Option<String> {
        // 77 is another client's pid.
        let mut signal = |_: Signal, pid: i32| pid == 77;
        let mut views = [None; VIEWS.len()];
        views[0] = view;
        views[1] = view.map(|_| "A");
        let mut targets = || vec![78];
        let mut own = Own {
            vpid,
            views,
            signal: &mut signal,
            targets: &mut targets,
        };
        rewrite(sql.as_bytes(), &mut own).map(|v| String::from_utf8(v).unwrap())
    }

    fn rw(sql: &str) -> Option<String> {
        with(sql, 4242, None)
    }

    fn rv(sql: &str) -> Option<String> {
        with(sql, 1, Some("V"))
    }

    #[test]
    fn a_signal_to_a_virtual_pid_is_the_clients() {
        assert_eq!(
            rw("select pg_terminate_backend(4242)").as_deref(),
            Some("select pg_terminate_backend(pg_catalog.pg_backend_pid())")
        );
        assert_eq!(
            rw("select pg_cancel_backend( 4242::int )").as_deref(),
            Some("select pg_cancel_backend( pg_catalog.pg_backend_pid()::int )")
        );
        assert_eq!(
            rw("select pg_catalog.pg_terminate_backend(77, 1000), 1").as_deref(),
            Some("select (SELECT true AS pg_terminate_backend), 1")
        );
        assert_eq!(
            rw("select pg_cancel_backend(77::int)").as_deref(),
            Some("select (SELECT true AS pg_cancel_backend)")
        );
        let p = rw("select pg_terminate_backend($1::int, 5)").unwrap();
        assert_eq!(
            p,
            "select CASE ($1::int)::pg_catalog.int4 WHEN 4242 THEN true \
             ELSE pg_catalog.pg_terminate_backend(($1::int)::pg_catalog.int4, 5) END AS pg_terminate_backend"
        );
        assert_eq!(
            rw("select 1 + length(pg_terminate_backend($1)::text)").as_deref(),
            Some(
                "select 1 + length((SELECT CASE ($1)::pg_catalog.int4 WHEN 4242 THEN true \
                 ELSE pg_catalog.pg_terminate_backend(($1)::pg_catalog.int4) END AS pg_terminate_backend)::text)"
            )
        );
        assert_eq!(signal_params(p.as_bytes(), 4242), [(0, Signal::Terminate)]);
        let p = rw("select pg_cancel_backend($2), pg_terminate_backend( $1 )").unwrap();
        assert_eq!(
            signal_params(p.as_bytes(), 4242),
            [(1, Signal::Cancel), (0, Signal::Terminate)]
        );
        assert!(signal_params(p.as_bytes(), 4243).is_empty());
        for sql in [
            "select pg_terminate_backend(78)",
            "select pg_terminate_backend(77.5)",
            "select 'pg_terminate_backend(77)'",
        ] {
            assert_eq!(rw(sql), None, "{sql}");
        }
    }

    #[test]
    fn a_computed_pid_is_marked_for_the_clients_and_the_server_asked_else() {
        let got = rv(
            "select pg_terminate_backend(pid) from pg_catalog.pg_stat_activity \
                      where pid <> pg_backend_pid()",
        )
        .unwrap();
        assert!(
            got.starts_with(
                "WITH pg_stat_activity AS (A) select CASE WHEN (pid) = 1 THEN \
                 pg_terminate_backend(pg_catalog.pg_backend_pid()) WHEN (pid) = ANY ('{78}'"
            ),
            "{got}"
        );
        assert!(
            got.ends_with(
                "ELSE pg_terminate_backend(pid) END from pg_stat_activity \
                 where pid <> (SELECT 1 AS pg_backend_pid)"
            ),
            "{got}"
        );
        // The argument is repeated as the session reads it.
        let got = rv(
            "select pg_cancel_backend((select pid from pg_catalog.pg_stat_activity \
                      where pid = pg_backend_pid()))",
        )
        .unwrap();
        let x = "(select pid from pg_stat_activity where pid = (SELECT 1 AS pg_backend_pid))";
        assert!(
            got.starts_with(&format!(
                "WITH pg_stat_activity AS (A) select CASE WHEN ({x}) = 1 THEN"
            )),
            "{got}"
        );
        assert!(
            got.ends_with(&format!("ELSE pg_cancel_backend({x}) END")),
            "{got}"
        );
        assert_eq!(got.matches("AS pg_backend_pid").count(), 5, "{got}");
        assert!(computes_signals(
            b"select 1; select pg_cancel_backend(pid) from t"
        ));
        assert!(!computes_signals(
            b"select pg_cancel_backend(5); select 'pg_cancel_backend(n)'"
        ));
    }

    #[test]
    fn prepared_statements_is_shadowed_by_the_sessions_own() {
        assert_eq!(
            rv("select count(*) from pg_prepared_statements").as_deref(),
            Some("WITH pg_prepared_statements AS (V) select count(*) from pg_prepared_statements")
        );
        assert_eq!(
            rv(" /* c */ WITH recursive x AS (select 1) select * from x, PG_CATALOG.pg_prepared_statements p; select 1")
                .as_deref(),
            Some(
                " /* c */ WITH recursive pg_prepared_statements AS (V), x AS (select 1) select * from x, pg_prepared_statements p; select 1"
            )
        );
        assert_eq!(
            rv("select pg_backend_pid() from pg_prepared_statements").as_deref(),
            Some(
                "WITH pg_prepared_statements AS (V) select (SELECT 1 AS pg_backend_pid) from pg_prepared_statements"
            )
        );
        assert_eq!(
            rv(
                "with t as (select 1) select * from t, pg_stat_activity a, pg_prepared_statements p"
            )
            .as_deref(),
            Some(
                "with pg_prepared_statements AS (V), pg_stat_activity AS (A), t as (select 1) \
                 select * from t, pg_stat_activity a, pg_prepared_statements p"
            )
        );
        assert_eq!(
            rv("select pid from pg_catalog.pg_stat_activity where pid = pg_backend_pid()")
                .as_deref(),
            Some(
                "WITH pg_stat_activity AS (A) select pid from pg_stat_activity \
                 where pid = (SELECT 1 AS pg_backend_pid)"
            )
        );
        assert_eq!(
            reads_views(b"select 1; select * from pg_stat_activity"),
            [false, true, false]
        );
        for sql in [
            "explain select * from pg_prepared_statements",
            "select 'pg_prepared_statements'",
            "select * from other.pg_prepared_statements",
            "create view v as select * from pg_prepared_statements",
            "select * from pg_prepared_statements_x",
        ] {
            assert_eq!(rv(sql), None, "{sql}");
        }
    }

    #[test]
    fn the_view_query_quotes_what_the_client_wrote() {
        let q = view_query(&[Prepared {
            name: b"a'b",
            statement: b"select '\\'",
            server_name: b"PGCARPOOL_1",
            from_sql: false,
        }]);
        assert!(
            q.contains("VALUES (E'a\\'b', E'select \\'\\\\\\'', E'PGCARPOOL_1', false)"),
            "{q}"
        );
        assert!(view_query(&[]).contains("WHERE false"));
        let q = pid_view_query("pg_stat_activity", 7, &[(10, 20), (11, 21)], b"select 'x'");
        assert!(
            q.contains("FROM pg_catalog.pg_stat_activity s LEFT JOIN (VALUES (10, 20), (11, 21))"),
            "{q}"
        );
        assert!(q.contains("THEN 7 ELSE COALESCE(m.client, s.pid) END, 'query', CASE WHEN s.pid = pg_catalog.pg_backend_pid() AND s.state = 'active' THEN E'select \\'x\\'' ELSE s.query END"), "{q}");
        let q = pid_view_query("pg_locks", 7, &[], b"");
        assert!(q.contains("WHERE false") && !q.contains("query"), "{q}");
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
        assert!(mentions(b"select * from pg_locks"));
        assert!(!mentions(b"select pg_sleep(1)"));
    }
}
