//! Signals to pids a query computes (`select pg_terminate_backend(n) from unnest($1) n`):
//! the text that lets the server tell pgcarpool, while the query runs, which of its
//! clients the query named, and the reading of what the server told.
//!
//! The server cannot signal a client: a client's pid is pgcarpool's (its BackendKeyData's),
//! no backend has it. So each such call becomes a `CASE` that, row by row, gives the call
//! the client's own pid as its server's (`pg_backend_pid()`: the server signals itself, as
//! PostgreSQL's backend would, row then FATAL), *marks* a pid of the clients the caller
//! may signal (listed in the text when it is rewritten), and otherwise makes the call as
//! written. A mark is `pg_cancel_backend` of a negative number, which no backend has:
//! the server answers `false` and says so at once in a WARNING of `pg_signal_backend`
//! (`PID -n is not a PostgreSQL backend process`), which pgcarpool reads while relaying
//! (`marked`), signals that client and drops; the `CASE` answers `true`. So the signal
//! happens while the query runs and stays whatever the transaction does next, as
//! PostgreSQL's; nothing is asked of the server afterwards. Marks carry the kind in the
//! number: pgcarpool's pids are even (`peers::key::make`), `-pid` terminates, `-pid - 1`
//! cancels. The WARNING needs `client_min_messages` at `warning` or below: where the
//! client set `error`, the mark sets `warning` for itself and puts `error` back (both
//! transaction-local). The server's log keeps a line for each mark.

use super::classify::{is_ident_char as is_ident, skip_quoted};
use super::selfview::Signal;

/// Words that keep a call as it is: the argument is evaluated more than once by the
/// `CASE`, so not a set-returning, window or volatile expression (`select` lifts the ban on
/// the first two: inside a subquery they make one value), nor another signal call.
const EXPANDS: [&[u8]; 14] = [
    b"over",
    b"unnest",
    b"generate_series",
    b"generate_subscripts",
    b"regexp_matches",
    b"regexp_split_to_table",
    b"string_to_table",
    b"json_array_elements",
    b"jsonb_array_elements",
    b"json_array_elements_text",
    b"jsonb_array_elements_text",
    b"json_each",
    b"jsonb_each",
    b"json_object_keys",
];
const VOLATILE: [&[u8]; 4] = [
    b"random",
    b"nextval",
    b"pg_terminate_backend",
    b"pg_cancel_backend",
];

/// A call whose pid the query computes: where its name starts (a `pg_catalog.` before it
/// included), where the name ends, its first argument (start, end) and its closing
/// parenthesis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    pub kind: Signal,
    pub start: usize,
    pub name_end: usize,
    pub arg: (usize, usize),
    pub close: usize,
}

/// The call `pg_terminate_backend(X …)` / `pg_cancel_backend(X)` whose name starts at `i`
/// in the statement `s`, where `X` is computed (not an integer literal, a `$n` parameter,
/// a string literal or `pg_backend_pid()`, which `selfview` handles, and nothing
/// `EXPANDS`/`VOLATILE` name). None: not such a call.
pub fn computed_call(s: &[u8], i: usize) -> Option<Call> {
    let (kind, name): (Signal, &[u8]) = if starts_with_ci(&s[i..], b"pg_terminate_backend") {
        (Signal::Terminate, b"pg_terminate_backend")
    } else if starts_with_ci(&s[i..], b"pg_cancel_backend") {
        (Signal::Cancel, b"pg_cancel_backend")
    } else {
        return None;
    };
    let name_end = i + name.len();
    let start = match s[..i].strip_suffix(b".") {
        None => i,
        Some(before) if ends_with_ci(before, b"pg_catalog") => {
            let at = before.len() - b"pg_catalog".len();
            if at > 0 && is_ident(s[at - 1]) {
                return None;
            }
            at
        }
        Some(_) => return None,
    };
    let mut j = name_end + skip_space(&s[name_end..]);
    if s.get(j) != Some(&b'(') {
        return None;
    }
    j += 1;
    let (arg_end, close) = arguments(s, j)?;
    let arg = (j + skip_space(&s[j..arg_end]), arg_end);
    let x = s[arg.0..arg.1].trim_ascii_end();
    let rest = &s[arg_end..close];
    let literal = match x {
        [] | [b'\'', ..] => true,
        [c, ..] if c.is_ascii_digit() => true,
        [b'-' | b'+' | b'$', c, ..] if c.is_ascii_digit() => true,
        _ => false,
    };
    let own_pid = {
        let t: Vec<u8> = x
            .iter()
            .filter(|c| !c.is_ascii_whitespace())
            .copied()
            .collect();
        t.eq_ignore_ascii_case(b"pg_backend_pid()")
            || t.eq_ignore_ascii_case(b"pg_catalog.pg_backend_pid()")
    };
    let subquery = has_word(x, &[b"select"]);
    let refused = literal
        || own_pid
        || has_word(x, &VOLATILE)
        || (!subquery && has_word(x, &EXPANDS))
        || contains(x, b"=>")
        || (kind == Signal::Cancel && !rest.is_empty())
        || (arg_end < close && arguments(s, arg_end + 1).is_some_and(|(e, _)| e < close));
    (!refused).then_some(Call {
        kind,
        start,
        name_end,
        arg,
        close,
    })
}

/// The arguments from `from` (after the opening parenthesis): the end of the first (a
/// comma at the top level, else the closing parenthesis) and the closing parenthesis.
fn arguments(s: &[u8], from: usize) -> Option<(usize, usize)> {
    let (mut j, mut depth, mut first) = (from, 1, None);
    while j < s.len() {
        if super::classify::QUOTE_START[usize::from(s[j])]
            && let Some(end) = skip_quoted(s, j)
        {
            j = end;
            continue;
        }
        match s[j] {
            b'(' | b'[' => depth += 1,
            b')' | b']' => {
                depth -= 1;
                if depth == 0 {
                    return Some((first.unwrap_or(j), j));
                }
            }
            b',' if depth == 1 => {
                first.get_or_insert(j);
            }
            b';' => return None,
            _ => {}
        }
        j += 1;
    }
    None
}

/// The two edits (inserts before and after the call) that make `call` of statement `s`
/// the client's: `x` is its first argument and `rest` what follows it up to the closing
/// parenthesis, as the client's session reads them (`selfview` rewrote them), `vpid` the
/// client's pid, `targets` the pids of the clients it may signal.
pub fn edits(
    s: &[u8],
    call: &Call,
    (x, rest): (&str, &str),
    vpid: i32,
    targets: &[i32],
) -> [(usize, usize, String); 2] {
    let name = String::from_utf8_lossy(&s[call.start..call.name_end]);
    let mut case =
        format!("CASE WHEN ({x}) = {vpid} THEN {name}(pg_catalog.pg_backend_pid(){rest}) ");
    let targets: Vec<i32> = targets.iter().copied().filter(|p| markable(*p)).collect();
    if !targets.is_empty() {
        let list: Vec<String> = targets.iter().map(i32::to_string).collect();
        let k = u8::from(call.kind == Signal::Cancel);
        let m = format!("pg_catalog.pg_cancel_backend((-({x}) - {k})::pg_catalog.int4)");
        case.push_str(&format!(
            "WHEN ({x}) = ANY ('{{{}}}'::pg_catalog.int4[]) THEN \
             CASE WHEN pg_catalog.current_setting('client_min_messages') <> 'error' \
             THEN NOT {m} \
             WHEN pg_catalog.set_config('client_min_messages', 'warning', true) IS NULL \
             THEN NULL WHEN {m} THEN NULL \
             ELSE pg_catalog.set_config('client_min_messages', 'error', true) IS NOT NULL END ",
            list.join(",")
        ));
    }
    case.push_str("ELSE ");
    [
        (call.start, call.start, case),
        (call.close + 1, call.close + 1, " END".into()),
    ]
}

/// Can pid `p` be marked: a pid pgcarpool gives (positive and even)?
pub fn markable(p: i32) -> bool {
    p > 0 && p % 2 == 0
}

/// A NoticeResponse's routine (`R`), severity (`V`, else `S`) and message (`M`) that are a
/// mark's (`edits`): the signal and the pid it names.
pub fn marked(routine: &[u8], severity: &[u8], message: &[u8]) -> Option<(Signal, i32)> {
    if routine != b"pg_signal_backend" || severity != b"WARNING" {
        return None;
    }
    let at = (0..message.len())
        .find(|&i| message[i] == b'-' && message.get(i + 1).is_some_and(u8::is_ascii_digit))?;
    let digits = message[at + 1..]
        .iter()
        .take_while(|c| c.is_ascii_digit())
        .count();
    let n: i32 = std::str::from_utf8(&message[at + 1..at + 1 + digits])
        .ok()?
        .parse()
        .ok()?;
    let kind = if n % 2 == 0 {
        Signal::Terminate
    } else {
        Signal::Cancel
    };
    let pid = n - n % 2;
    markable(pid).then_some((kind, pid))
}

/// Does `s` hold one of `words` as a word of SQL code (outside quotes and comments)?
fn has_word(s: &[u8], words: &[&[u8]]) -> bool {
    let mut i = 0;
    while i < s.len() {
        if super::classify::QUOTE_START[usize::from(s[i])]
            && let Some(end) = skip_quoted(s, i)
        {
            i = end;
            continue;
        }
        if is_ident(s[i]) && (i == 0 || !is_ident(s[i - 1])) {
            let end = i + s[i..].iter().take_while(|c| is_ident(**c)).count();
            if words.iter().any(|w| s[i..end].eq_ignore_ascii_case(w)) {
                return true;
            }
            i = end;
            continue;
        }
        i += 1;
    }
    false
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn skip_space(s: &[u8]) -> usize {
    s.iter().take_while(|c| c.is_ascii_whitespace()).count()
}

fn starts_with_ci(hay: &[u8], needle: &[u8]) -> bool {
    hay.len() >= needle.len()
        && hay[..needle.len()].eq_ignore_ascii_case(needle)
        && !hay.get(needle.len()).is_some_and(|c| is_ident(*c))
}

fn ends_with_ci(hay: &[u8], needle: &[u8]) -> bool {
    hay.len() >= needle.len() && hay[hay.len() - needle.len()..].eq_ignore_ascii_case(needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(sql: &str) -> Option<Call> {
        let i = sql.find("pg_").unwrap_or(0);
        let i = if sql[i..].starts_with("pg_catalog.") {
            i + "pg_catalog.".len()
        } else {
            i
        };
        computed_call(sql.as_bytes(), i)
    }

    #[test]
    fn a_computed_pid_is_found_with_its_arguments() {
        let sql = "select pg_terminate_backend(n) from unnest($1::int[]) n";
        let c = call(sql).unwrap();
        assert_eq!(c.kind, Signal::Terminate);
        assert_eq!(&sql[c.start..c.name_end], "pg_terminate_backend");
        assert_eq!(&sql[c.arg.0..c.arg.1], "n");
        assert_eq!(&sql[c.close..=c.close], ")");
        let sql =
            "select PG_CATALOG.pg_terminate_backend( (select max(pid) from t where a = ',)'), 10 )";
        let c = call(sql).unwrap();
        assert_eq!(c.start, "select ".len());
        assert_eq!(
            &sql[c.arg.0..c.arg.1],
            "(select max(pid) from t where a = ',)')"
        );
        assert_eq!(c.close, sql.len() - 1);
        let sql = "select pg_cancel_backend(a[1] + 0)";
        assert_eq!(call(sql).unwrap().kind, Signal::Cancel);
        // Inside a subquery a set-returning function makes one value.
        assert!(call("select pg_cancel_backend((select unnest(a) limit 1))").is_some());
    }

    #[test]
    fn literals_parameters_and_what_the_case_cannot_repeat_are_left() {
        for sql in [
            "select pg_terminate_backend(77)",
            "select pg_terminate_backend(-77)",
            "select pg_terminate_backend($1::int)",
            "select pg_terminate_backend('77')",
            "select pg_terminate_backend(pg_backend_pid())",
            "select pg_terminate_backend(pg_catalog.pg_backend_pid ( ))",
            "select pg_terminate_backend(unnest(a))",
            "select pg_terminate_backend(lag(pid) over ())",
            "select pg_terminate_backend((random() * 10)::int)",
            "select pg_terminate_backend(pid => n)",
            "select pg_cancel_backend(n, 5)",
            "select pg_terminate_backend(n, 5, 6)",
            "select pg_terminate_backend()",
            "select pg_terminate_backend",
            "select pg_terminate_backend(n",
            "select other.pg_terminate_backend(n)",
            "select pg_terminate_backendx(n)",
        ] {
            assert_eq!(call(sql), None, "{sql}");
        }
    }

    #[test]
    fn the_edits_mark_the_clients_pids_and_keep_the_call() {
        let sql = b"select pg_terminate_backend(n, 10) from t";
        let c = computed_call(sql, 7).unwrap();
        let [a, b] = edits(sql, &c, ("n", ", 10"), 42, &[8, 9, -2, 10]);
        assert_eq!((a.0, a.1), (7, 7));
        assert_eq!((b.0, b.1), (34, 34));
        assert_eq!(b.2, " END");
        assert!(
            a.2.starts_with(
                "CASE WHEN (n) = 42 THEN pg_terminate_backend(pg_catalog.pg_backend_pid(), 10) \
                 WHEN (n) = ANY ('{8,10}'::pg_catalog.int4[]) THEN CASE WHEN "
            ),
            "{}",
            a.2
        );
        assert!(a.2.contains("NOT pg_catalog.pg_cancel_backend((-(n) - 0)::pg_catalog.int4)"));
        assert!(a.2.ends_with("IS NOT NULL END ELSE "), "{}", a.2);
        let sql = b"select pg_catalog.pg_cancel_backend(n)";
        let c = computed_call(sql, 18).unwrap();
        let [a, _] = edits(sql, &c, ("n", ""), 42, &[]);
        assert_eq!(
            a.2,
            "CASE WHEN (n) = 42 THEN pg_catalog.pg_cancel_backend(pg_catalog.pg_backend_pid()) ELSE "
        );
        let [a, _] = edits(sql, &c, ("n", ""), 42, &[44]);
        assert!(a.2.contains("pg_cancel_backend((-(n) - 1)::pg_catalog.int4)"));
    }

    #[test]
    fn a_mark_names_the_client_and_the_signal() {
        let w = |m: &str| marked(b"pg_signal_backend", b"WARNING", m.as_bytes());
        assert_eq!(
            w("PID -1234 is not a PostgreSQL backend process"),
            Some((Signal::Terminate, 1234))
        );
        assert_eq!(
            w("PID -1235 ist kein PostgreSQL-Serverprozess"),
            Some((Signal::Cancel, 1234))
        );
        assert_eq!(w("PID 1234 is not a PostgreSQL backend process"), None);
        assert_eq!(w("PID -1 is not a PostgreSQL backend process"), None);
        assert_eq!(w("PID -99999999999 is not"), None);
        assert_eq!(marked(b"exec_stmt_raise", b"WARNING", b"PID -1234"), None);
        assert_eq!(marked(b"pg_signal_backend", b"NOTICE", b"PID -1234"), None);
    }
}
