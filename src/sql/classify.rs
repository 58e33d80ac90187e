//! A cheap classifier of SQL text: splits a query into statements (respecting quotes,
//! comments and dollar quoting) and looks at leading keywords only, to spot what changes the
//! session: SET/RESET, DISCARD, DEALLOCATE, and what may pin a client to its server.

/// What a query does to the session, as far as pgcarpool cares.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Effects {
    /// GUCs that may have changed (read back from the server after the transaction).
    pub gucs: Vec<String>,
    /// set_config with a name we could not read: read back every session-set GUC.
    pub gucs_unknown: bool,
    /// Settings a SET LOCAL changed (`*`: one it could not name): not read back (the
    /// transaction's end undoes them), but statements parsed later in the transaction are
    /// parsed under them (`Relay::statement_scope`).
    pub local_gucs: Vec<String>,
    /// RESET ALL (or DISCARD ALL).
    pub reset_all: bool,
    /// DISCARD ALL.
    pub discard_all: bool,
    /// DEALLOCATE ALL (or DISCARD ALL).
    pub deallocate_all: bool,
    /// DEALLOCATE name, when it is the only statement.
    pub deallocate: Option<String>,
    /// Something that may create or drop a pin (temp table, LISTEN, advisory lock, WITH HOLD).
    pub pin_check: bool,
    /// Schema changes (or code that may make them): statements prepared before are not
    /// used for later Parses (see `prepared::StatementRegistry::bump_generation`).
    pub ddl: bool,
    /// A PREPARE, EXECUTE or DEALLOCATE names a statement with pgcarpool's prefix.
    pub reserved_name: bool,
    /// `DROP DATABASE x` / `ALTER DATABASE x RENAME`: PostgreSQL wants no other session on
    /// database `x`, so the pools' idle servers to it are closed first.
    pub database_alone: Option<String>,
    /// Calls a function that is not a well-known built-in: it may change settings, take
    /// locks or create temp tables out of sight (checked afterwards when
    /// check_function_calls is on).
    pub calls: bool,
    /// The text mentions NOTIFY or pg_notify: the transaction may send notifications (the
    /// pool's shared listener then sees them through before the server goes back, so that
    /// a listening sender gets its own with its own pid).
    pub notify: bool,
    /// The text names what a session asks about itself (`selfview::NAMES`:
    /// pg_backend_pid, pg_terminate_backend, pg_cancel_backend, pg_prepared_statements):
    /// rewritten for the client's virtual session (`selfview::rewrite`), and a FATAL 57P01
    /// of its server is the client's own.
    pub introspects: bool,
    /// The text names `pg_terminate_backend`: a FATAL 57P01 of its server is the client's
    /// own doing (it terminated itself).
    pub terminates: bool,
    /// The text names `pg_terminate_backend` or `pg_cancel_backend`: the server's
    /// WARNINGs may be marks of clients to signal (`signal::marked`).
    pub signals: bool,
    /// A LISTEN: after the transaction the server's channels go to the pool's shared
    /// listener (its ReadyForQuery waits for that).
    pub listen: bool,
}

impl Effects {
    /// `*self == Effects::default()`, field by field (no default value built and dropped
    /// per transaction); the pattern names every field, so a new one must be added here.
    pub fn is_empty(&self) -> bool {
        let Effects {
            gucs,
            gucs_unknown,
            local_gucs,
            reset_all,
            discard_all,
            deallocate_all,
            deallocate,
            pin_check,
            ddl,
            reserved_name,
            database_alone,
            calls,
            notify,
            introspects,
            terminates,
            signals,
            listen,
        } = self;
        gucs.is_empty()
            && local_gucs.is_empty()
            && deallocate.is_none()
            && database_alone.is_none()
            && !(*gucs_unknown
                || *reset_all
                || *discard_all
                || *deallocate_all
                || *pin_check
                || *ddl
                || *reserved_name
                || *calls
                || *notify
                || *introspects
                || *terminates
                || *signals
                || *listen)
    }

    pub fn merge(&mut self, o: Effects) {
        for g in o.gucs {
            if !self.gucs.iter().any(|x| x.eq_ignore_ascii_case(&g)) {
                self.gucs.push(g);
            }
        }
        self.gucs_unknown |= o.gucs_unknown;
        for g in o.local_gucs {
            if !self.local_gucs.contains(&g) {
                self.local_gucs.push(g);
            }
        }
        self.reset_all |= o.reset_all;
        self.discard_all |= o.discard_all;
        self.deallocate_all |= o.deallocate_all;
        self.pin_check |= o.pin_check;
        self.ddl |= o.ddl;
        self.reserved_name |= o.reserved_name;
        self.calls |= o.calls;
        self.notify |= o.notify;
        self.introspects |= o.introspects;
        self.terminates |= o.terminates;
        self.signals |= o.signals;
        self.listen |= o.listen;
        if self.database_alone.is_none() {
            self.database_alone = o.database_alone;
        }
        self.deallocate = None;
    }
}

/// A quick test, without allocating, whether `classify` could find anything: the leading
/// keyword of some statement is one we act on, or the text mentions set_config, advisory
/// locks or pg_temp. False for the plain SELECT/INSERT/UPDATE/DELETE/BEGIN/COMMIT traffic.
pub fn may_matter(sql: &[u8]) -> bool {
    const LEADING: [&[u8]; 14] = [
        b"prepare",
        b"alter",
        b"drop",
        b"do",
        b"call",
        b"execute",
        b"set",
        b"reset",
        b"discard",
        b"deallocate",
        b"listen",
        b"unlisten",
        b"create",
        b"declare",
    ];
    let leading = |s: &[u8]| {
        let first = strip_leading(s);
        let word_end = first
            .iter()
            .position(|c| !c.is_ascii_alphabetic())
            .unwrap_or(first.len());
        let word = &first[..word_end];
        LEADING.iter().any(|k| word.eq_ignore_ascii_case(k))
    };
    // Every statement start is the text start or follows a `;` (a `;` inside a literal only
    // adds a false positive, never hides a statement). One pass over the text.
    if leading(sql) {
        return true;
    }
    let mut in_word = false;
    for (i, &c) in sql.iter().enumerate() {
        // Most bytes of a text start nothing looked for: one lookup each.
        let k = CLASS[usize::from(c)];
        if k & WORD != 0 {
            if !in_word && k & START != 0 && word_matters(&sql[i..]) {
                return true;
            }
            in_word = true;
            continue;
        }
        in_word = false;
        match c {
            b';' if leading(&sql[i + 1..]) => return true,
            b'(' if i > 0 && calls_unknown(&sql[..i]) => return true,
            _ => {}
        }
    }
    false
}

/// `!may_matter(s) && lone_statement(s).is_some()` for `s = first_word + rest`, in one pass
/// over `rest` (`first_word`: a keyword `may_matter` does not look for, followed by a byte
/// that ends a word): the fast path of `facts::Facts::of`.
pub(super) fn plain_rest(s: &[u8], first_word: usize) -> bool {
    // Seen what may quote a `;` (lone_statement then splits the text).
    let mut quoting = false;
    let mut i = first_word;
    while let Some(&c) = s.get(i) {
        let k = CLASS[usize::from(c)];
        i += 1;
        if k & WORD != 0 {
            if k & START != 0 && word_matters(&s[i - 1..]) {
                return false;
            }
            // The rest of the word, in a loop of its own.
            while s.get(i).is_some_and(|&c| CLASS[usize::from(c)] & WORD != 0) {
                i += 1;
            }
            continue;
        }
        if k & LOOK == 0 {
            continue;
        }
        match c {
            b';' => return !quoting && s[i..].iter().all(u8::is_ascii_whitespace),
            b'(' if calls_unknown(&s[..i - 1]) => return false,
            b'\'' | b'"' => quoting = true,
            b'$' => quoting |= !s.get(i).is_some_and(u8::is_ascii_digit),
            b'-' => quoting |= s.get(i) == Some(&b'-'),
            b'/' => quoting |= s.get(i) == Some(&b'*'),
            _ => {}
        }
    }
    true
}

/// A word `may_matter` looks for starts `w`: set_config, advisory, notify, or an
/// identifier starting `pg_` that is pg_temp, a self-view name (`selfview::NAMES`) or names
/// an advisory lock or notify (pg_advisory_lock, pg_try_advisory_xact_lock, pg_notify).
fn word_matters(w: &[u8]) -> bool {
    match w[0] | 0x20 {
        b's' => starts_with_ci(w, b"set_config"),
        b'a' => starts_with_ci(w, b"advisory"),
        b'n' => starts_with_ci(w, b"notify"),
        b'p' if w.len() >= 3 && w[1] | 0x20 == b'g' && w[2] == b'_' => {
            let end = w
                .iter()
                .position(|&c| CLASS[usize::from(c)] & WORD == 0)
                .unwrap_or(w.len());
            let word = &w[..end];
            starts_with_ci(word, b"pg_temp")
                || super::selfview::named_at(word)
                || contains_ci(word, b"advisory")
                || contains_ci(word, b"notify")
        }
        _ => false,
    }
}

/// Byte classes of the one-pass scans: `WORD` bytes make identifiers (and numbers),
/// `START` ones may start a word `may_matter` looks for, `LOOK` ones are looked at by
/// `plain_rest`.
const WORD: u8 = 1;
const START: u8 = 2;
const LOOK: u8 = 4;
static CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        if b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80 {
            t[c] = WORD;
        }
        c += 1;
    }
    let starts = b"sSaApPnN";
    let mut i = 0;
    while i < starts.len() {
        t[starts[i] as usize] |= START;
        i += 1;
    }
    let look = b";('\"$-/";
    let mut i = 0;
    while i < look.len() {
        t[look[i] as usize] |= LOOK;
        i += 1;
    }
    t
};

/// The text's first word (after whitespace and comments) is `word` (ASCII, any case): a
/// check of a few bytes for what only a statement starting so can be.
pub fn starts_with_word(sql: &[u8], word: &[u8]) -> bool {
    let first = strip_leading(sql);
    starts_with_ci(first, word)
        && first
            .get(word.len())
            .is_none_or(|c| !c.is_ascii_alphanumeric() && *c != b'_')
}

/// The well-known built-ins and keywords that may stand before a `(` without making a
/// statement call something unknown (`calls_unknown`).
const KNOWN_CALLS: &[&[u8]] = &[
    b"abs",
    b"age",
    b"all",
    b"and",
    b"any",
    b"array",
    b"array_agg",
    b"array_length",
    b"array_to_string",
    b"as",
    b"avg",
    b"bool_and",
    b"bool_or",
    b"btrim",
    b"by",
    b"cardinality",
    b"case",
    b"cast",
    b"ceil",
    b"char",
    b"character",
    b"check",
    b"coalesce",
    b"concat",
    b"concat_ws",
    b"count",
    b"current_setting",
    b"currval",
    b"date_part",
    b"date_trunc",
    b"decimal",
    b"decode",
    b"default",
    b"dense_rank",
    b"else",
    b"encode",
    b"except",
    b"exists",
    b"extract",
    b"filter",
    b"float",
    b"floor",
    b"format",
    b"from",
    b"gen_random_uuid",
    b"generate_series",
    b"greatest",
    b"group",
    b"grouping",
    b"having",
    b"in",
    b"index",
    b"intersect",
    b"interval",
    b"into",
    b"join",
    b"json_agg",
    b"json_build_array",
    b"json_build_object",
    b"jsonb_agg",
    b"jsonb_build_array",
    b"jsonb_build_object",
    b"jsonb_set",
    b"key",
    b"lag",
    b"lateral",
    b"lead",
    b"least",
    b"left",
    b"length",
    b"like",
    b"limit",
    b"lower",
    b"lpad",
    b"ltrim",
    b"make_interval",
    b"max",
    b"md5",
    b"min",
    b"mod",
    b"nextval",
    b"not",
    b"now",
    b"nullif",
    b"numeric",
    b"on",
    b"or",
    b"order",
    b"over",
    b"overlay",
    b"partition",
    b"pg_backend_pid",
    b"pg_sleep",
    b"position",
    b"power",
    b"primary",
    b"random",
    b"rank",
    b"references",
    b"regexp_replace",
    b"repeat",
    b"replace",
    b"returning",
    b"right",
    b"round",
    b"row",
    b"row_number",
    b"rows",
    b"rpad",
    b"rtrim",
    b"select",
    b"setval",
    b"split_part",
    b"sqrt",
    b"string_agg",
    b"strpos",
    b"substr",
    b"substring",
    b"sum",
    b"then",
    b"time",
    b"timestamp",
    b"timestamptz",
    b"to_char",
    b"to_date",
    b"to_json",
    b"to_jsonb",
    b"to_number",
    b"to_timestamp",
    b"trim",
    b"trunc",
    b"union",
    b"unique",
    b"unnest",
    b"upper",
    b"using",
    b"values",
    b"varchar",
    b"when",
    b"where",
    b"window",
    b"with",
    b"within",
];

/// Is the text before a `(` a call of a function that may change the session out of sight:
/// an identifier (quoted, or not one of the well-known built-ins and keywords in
/// `KNOWN_CALLS`)? Quoting is not tracked: a false positive only costs a check.
fn calls_unknown(before: &[u8]) -> bool {
    let end = before.len();
    if before[end - 1] == b'"' {
        return true;
    }
    let start = before
        .iter()
        .rposition(|c| !(c.is_ascii_alphanumeric() || *c == b'_' || *c == b'$'))
        .map_or(0, |p| p + 1);
    let name = &before[start..end];
    if name.is_empty() || name[0].is_ascii_digit() || name[0] == b'$' {
        return false;
    }
    !KNOWN_CALLS.iter().any(|k| name.eq_ignore_ascii_case(k))
}

/// Classify a query's text (simple Query or Parse). Unknown bytes are treated as "other".
pub fn classify(sql: &[u8]) -> Effects {
    let mut e = Effects::default();
    let stmts = split(sql);
    let single = stmts.len() == 1;
    for (a, b) in stmts {
        statement(&sql[a..b], single, &mut e);
    }
    e.notify = mentions_notify(sql);
    e.introspects = super::selfview::mentions(sql);
    e.terminates = e.introspects && contains_ci(sql, b"pg_terminate_backend");
    e.signals = e.terminates || (e.introspects && contains_ci(sql, b"pg_cancel_backend"));
    e
}

/// The text mentions NOTIFY or pg_notify: running it may send notifications.
pub fn mentions_notify(sql: &[u8]) -> bool {
    contains_ci(sql, b"notify")
}

/// What `SET SESSION CHARACTERISTICS AS TRANSACTION …` sets.
const SESSION_CHARACTERISTICS: [&str; 3] = [
    "default_transaction_read_only",
    "default_transaction_isolation",
    "default_transaction_deferrable",
];

fn statement(s: &[u8], single: bool, e: &mut Effects) {
    let s = strip_leading(s);
    let words = keywords(s, 4);
    let w = |i: usize| words.get(i).map(String::as_str).unwrap_or("");
    match w(0) {
        "SET" => set(s, &words, e),
        "RESET" => reset(s, w(1), e),
        "DISCARD" => match w(1) {
            "ALL" => {
                e.discard_all = true;
                e.reset_all = true;
                e.deallocate_all = true;
                e.pin_check = true;
                e.gucs.push("session_authorization".into());
                e.gucs.push("role".into());
            }
            "TEMP" | "TEMPORARY" => e.pin_check = true,
            _ => {}
        },
        "DEALLOCATE" => {
            let i = if w(1) == "PREPARE" { 2 } else { 1 };
            if w(i) == "ALL" {
                e.deallocate_all = true;
            } else {
                statement_name(s, single, e);
                if single {
                    e.deallocate = nth_token(s, i);
                }
            }
        }
        "PREPARE" if w(1) != "TRANSACTION" => statement_name(s, single, e),
        "EXECUTE" => statement_name(s, single, e),
        "LISTEN" => {
            e.pin_check = true;
            e.listen = true;
        }
        "UNLISTEN" => e.pin_check = true,
        "CREATE"
            if matches!(w(1), "TEMP" | "TEMPORARY") || matches!(w(2), "TEMP" | "TEMPORARY") =>
        {
            e.pin_check = true
        }
        "DROP" | "ALTER" if w(1) == "DATABASE" => {
            let i = if w(2) == "IF" { 4 } else { 2 };
            if w(0) == "DROP" || contains_ci(s, b"rename") {
                e.database_alone = nth_token(s, i);
            }
        }
        "CREATE" | "ALTER" | "DROP" => {
            e.ddl = true;
            // DROP of a temp table or ALTER of one may end a pin; CREATE … TEMP is above.
            e.pin_check |= w(0) != "CREATE";
        }
        // Code pgcarpool cannot read: it may set anything (SET ROLE, set_config, DDL,
        // dynamic PREPARE/DEALLOCATE). Everything is read back afterwards.
        "DO" | "CALL" => {
            e.gucs.push("role".into());
            e.gucs.push("session_authorization".into());
            e.gucs_unknown = true;
            e.pin_check = true;
            e.ddl = true;
        }
        "DECLARE" if contains_ci(s, b"with hold") => e.pin_check = true,
        _ => other(s, e),
    }
}

/// `SET …` (its first `words`, upper case): the settings it changes, for the session or
/// (SET LOCAL) for the transaction.
fn set(s: &[u8], words: &[String], e: &mut Effects) {
    let w = |i: usize| words.get(i).map(String::as_str).unwrap_or("");
    let mut i = 1;
    match w(1) {
        "LOCAL" => {
            let name = match w(2) {
                "ROLE" => Some("role".into()),
                "TIME" => Some("TimeZone".into()),
                "SCHEMA" => Some("search_path".into()),
                "SESSION" => Some("session_authorization".into()),
                "TRANSACTION" => return,
                _ => nth_token(s, 2),
            };
            return e.local_gucs.push(name.unwrap_or_else(|| "*".into()));
        }
        "TRANSACTION" => return,
        "SESSION" if w(2) == "CHARACTERISTICS" => {
            // Read back: the server's own ParameterStatus for them is not taken
            // as the client's (see VirtualSession::observe_parameter).
            for g in SESSION_CHARACTERISTICS {
                e.gucs.push(g.into());
            }
            return;
        }
        "SESSION" if w(2) == "AUTHORIZATION" => {
            // It also ends a SET ROLE (the role becomes `none`): read both back.
            e.gucs.push("session_authorization".into());
            return e.gucs.push("role".into());
        }
        "SESSION" => i = 2,
        _ => {}
    }
    match w(i) {
        "ROLE" => e.gucs.push("role".into()),
        "TIME" => e.gucs.push("TimeZone".into()),
        "NAMES" => e.gucs.push("client_encoding".into()),
        "SCHEMA" => e.gucs.push("search_path".into()),
        "XML" => e.gucs.push("xmloption".into()),
        "" => {}
        _ => match nth_token(s, i) {
            Some(name) => e.gucs.push(name),
            None => e.gucs_unknown = true,
        },
    }
}

/// `RESET …` (`what` is its second keyword): the settings it returns to their defaults.
fn reset(s: &[u8], what: &str, e: &mut Effects) {
    match what {
        // RESET ALL leaves these two as they are (PostgreSQL's GUC_NO_RESET_ALL):
        // read back what they are.
        "ALL" => {
            e.reset_all = true;
            e.gucs.push("session_authorization".into());
            e.gucs.push("role".into());
        }
        "ROLE" => e.gucs.push("role".into()),
        "TIME" => e.gucs.push("TimeZone".into()),
        "SESSION" => {
            e.gucs.push("session_authorization".into());
            e.gucs.push("role".into());
        }
        _ => match nth_token(s, 1) {
            Some(name) => e.gucs.push(name),
            None => e.gucs_unknown = true,
        },
    }
}

/// Any other statement (SELECT, INSERT, …): what the functions it calls may do.
fn other(s: &[u8], e: &mut Effects) {
    if contains_ci(s, b"set_config") {
        match set_config_name(s) {
            Some(n) => e.gucs.push(n),
            None => e.gucs_unknown = true,
        }
    }
    if contains_ci(s, b"advisory") || contains_ci(s, b"pg_temp") {
        e.pin_check = true;
    }
    e.calls |= s
        .iter()
        .enumerate()
        .any(|(i, &c)| c == b'(' && i > 0 && calls_unknown(&s[..i]));
}

/// The prefix of the names servers know shared statements by; clients cannot reach them.
pub const INTERNAL_PREFIX: &str = "PGCARPOOL_";

/// A query that is one statement returning a setting to its default: `RESET name`, or
/// `SET [SESSION | LOCAL] name {TO | =} DEFAULT` (`TIME ZONE` for `timezone`).
#[derive(Debug, PartialEq, Eq)]
pub struct ToDefault {
    /// The setting's name (lower case unless quoted).
    pub name: String,
    /// SET LOCAL.
    pub local: bool,
    /// Written as RESET (its CommandComplete says RESET, not SET).
    pub reset: bool,
}

/// The setting a one-statement query returns to its default, if that is all it does.
pub fn to_default(sql: &[u8]) -> Option<ToDefault> {
    let stmts = split(sql);
    let [(a, b)] = stmts[..] else {
        return None;
    };
    let s = strip_leading(&sql[a..b]);
    let text = std::str::from_utf8(s).ok()?.trim_end();
    let text = text.strip_suffix(';').unwrap_or(text);
    if text.contains("--") || text.contains("/*") {
        return None;
    }
    let toks: Vec<&str> = text
        .split(|c: char| c.is_whitespace() || c == '=')
        .filter(|t| !t.is_empty())
        .collect();
    let up = |i: usize| {
        toks.get(i)
            .map(|t| t.to_ascii_uppercase())
            .unwrap_or_default()
    };
    let name_at = |i: usize, rest: usize| -> Option<String> {
        if up(i) == "TIME" && up(i + 1) == "ZONE" {
            return (toks.len() == i + 2 + rest).then(|| "timezone".to_string());
        }
        (toks.len() == i + 1 + rest).then(|| nth_token(text.as_bytes(), i))?
    };
    match up(0).as_str() {
        "RESET" => {
            if matches!(up(1).as_str(), "ALL" | "SESSION" | "ROLE") {
                return None;
            }
            let name = name_at(1, 0)?;
            Some(ToDefault {
                name,
                local: false,
                reset: true,
            })
        }
        "SET" => {
            let (local, i) = match up(1).as_str() {
                "LOCAL" => (true, 2),
                "SESSION" => (false, 2),
                _ => (false, 1),
            };
            if matches!(
                up(i).as_str(),
                "ROLE" | "TRANSACTION" | "CHARACTERISTICS" | "AUTHORIZATION" | "NAMES" | "SCHEMA"
            ) {
                return None;
            }
            let zone = up(i) == "TIME";
            let value_at = toks.len().checked_sub(1)?;
            let value = up(value_at);
            let to = up(value_at.checked_sub(1)?) == "TO";
            let rest = if to { 2 } else { 1 };
            if !(value == "DEFAULT" || (zone && value == "LOCAL")) {
                return None;
            }
            let name = name_at(i, rest)?;
            Some(ToDefault {
                name,
                local,
                reset: false,
            })
        }
        _ => None,
    }
}

/// A statement name in PREPARE/EXECUTE/DEALLOCATE: one with pgcarpool's prefix is noted, and
/// outside a lone statement (which pgcarpool maps itself) the statement is passed to the
/// server as written: the client may then hold a server-side name of its own (a pin).
fn statement_name(s: &[u8], single: bool, e: &mut Effects) {
    if contains_ci(s, INTERNAL_PREFIX.as_bytes()) {
        e.reserved_name = true;
    }
    if !single {
        e.pin_check = true;
    }
}

/// Does `name` start with pgcarpool's internal prefix (in any case)?
pub fn is_internal_name(name: &[u8]) -> bool {
    name.len() >= INTERNAL_PREFIX.len()
        && name[..INTERNAL_PREFIX.len()].eq_ignore_ascii_case(INTERNAL_PREFIX.as_bytes())
}

/// Is `sql` a statement PostgreSQL accepts in a failed transaction block (ROLLBACK,
/// COMMIT, END, ABORT, ROLLBACK TO, ROLLBACK/COMMIT PREPARED)?
pub fn ends_transaction(sql: &[u8]) -> bool {
    let w = keywords(strip_leading(sql), 1);
    matches!(
        w.first().map(String::as_str),
        Some("ROLLBACK" | "COMMIT" | "END" | "ABORT")
    )
}

/// What a text's transaction-control statements do to the transaction status if they run:
/// the status after them for each status before (`I`, `T`, `E`, in that order), as
/// `server::Exchange::sent_tx_effect` takes it; None for a text with none (allocates
/// only for a text of several statements).
pub fn tx_effect(sql: &[u8]) -> Option<[u8; 3]> {
    if let Some(one) = lone_statement(sql) {
        return statement_tx_effect(one);
    }
    tx_effect_of_split(sql)
}

/// `tx_effect` over every statement `split` finds, composed in order.
pub(super) fn tx_effect_of_split(sql: &[u8]) -> Option<[u8; 3]> {
    let mut all: Option<[u8; 3]> = None;
    for (a, b) in split(sql) {
        if let Some(e) = statement_tx_effect(&sql[a..b]) {
            all = Some(match all {
                None => e,
                Some(before) => before.map(|s| e[tx_index(s)]),
            });
        }
    }
    all
}

/// The position of a transaction status in a `tx_effect` table.
fn tx_index(status: u8) -> usize {
    match status {
        b'I' => 0,
        b'T' => 1,
        _ => 2,
    }
}

/// `tx_effect` of one statement.
pub(super) fn statement_tx_effect(sql: &[u8]) -> Option<[u8; 3]> {
    let (first, mut rest) = next_word(strip_leading(sql))?;
    let is = |w: &[u8], k: &str| w.eq_ignore_ascii_case(k.as_bytes());
    if is(first, "begin") || is(first, "start") {
        // In a failed block: refused (25P02); in a block: a warning.
        return Some(*b"TTE");
    }
    if is(first, "prepare") {
        let second = next_word(rest).map(|w| w.0);
        return second
            .is_some_and(|w| is(w, "transaction"))
            .then_some(*b"III");
    }
    if !["commit", "end", "rollback", "abort"]
        .iter()
        .any(|k| is(first, k))
    {
        return None;
    }
    // COMMIT [WORK | TRANSACTION] [AND [NO] CHAIN], ROLLBACK … TO [SAVEPOINT] name,
    // COMMIT/ROLLBACK PREPARED 'id'.
    let mut prev: &[u8] = b"";
    while let Some((w, r)) = next_word(rest) {
        if is(w, "prepared") {
            return None;
        }
        if is(w, "to") {
            // Outside a block: an error (25P01); a failed block is usable again.
            return Some(*b"ITT");
        }
        if is(w, "chain") {
            return Some(if is(prev, "no") { *b"III" } else { *b"ITT" });
        }
        prev = w;
        rest = r;
    }
    Some(*b"III")
}

/// Does the statement `sql` (a Parse's text, up to a NUL) surely return rows, so that
/// PostgreSQL describes it with a RowDescription: a SELECT without INTO, VALUES, TABLE,
/// SHOW, EXPLAIN? False when unsure (FETCH: NoData where the cursor does not exist yet).
/// Reads the first word (and SELECT's text for INTO); no allocation.
pub fn returns_rows(sql: &[u8]) -> bool {
    let sql = sql.split(|&c| c == 0).next().unwrap_or_default();
    let Some((w, _)) = next_word(sql) else {
        return false;
    };
    let is = |k: &[u8]| w.eq_ignore_ascii_case(k);
    if is(b"SELECT") {
        return !contains_ci(sql, b"into");
    }
    is(b"VALUES") || is(b"TABLE") || is(b"SHOW") || is(b"EXPLAIN")
}

/// May a repeated unnamed Parse of `sql` be served by a statement a server prepared
/// before (plan_once)? One plain SELECT, VALUES, TABLE or WITH without INTO, INSERT,
/// UPDATE or DELETE, in which `may_matter` finds nothing: no utility statement, nothing
/// that changes a session or pins (set_config, advisory locks, pg_temp), no call of a
/// function pgcarpool does not know. A `;` only at the end. No allocation.
pub fn plans_once(sql: &[u8]) -> bool {
    let sql = sql.split(|&c| c == 0).next().unwrap_or_default();
    let Some((w, _)) = next_word(sql) else {
        return false;
    };
    let is = |k: &[u8]| w.eq_ignore_ascii_case(k);
    let plain = if is(b"SELECT") || is(b"WITH") || is(b"VALUES") || is(b"TABLE") {
        !contains_ci(sql, b"into")
    } else {
        is(b"INSERT") || is(b"UPDATE") || is(b"DELETE")
    };
    let one = match sql.iter().position(|&c| c == b';') {
        Some(i) => sql[i + 1..].iter().all(u8::is_ascii_whitespace),
        None => true,
    };
    plain && one && !may_matter(sql)
}

/// The first word of `s` (letters, digits, `_`) after whitespace, comments and
/// punctuation, and what follows it.
fn next_word(s: &[u8]) -> Option<(&[u8], &[u8])> {
    let mut s = strip_leading(s);
    while let Some(&c) = s.first()
        && !(c.is_ascii_alphabetic() || c == b'_')
    {
        if c.is_ascii_digit() || c == b';' || c == b'\'' || c == b'"' || c == b'$' {
            return None;
        }
        s = strip_leading(&s[1..]);
    }
    let end = s
        .iter()
        .position(|c| !(c.is_ascii_alphanumeric() || *c == b'_'))
        .unwrap_or(s.len());
    (end > 0).then(|| (&s[..end], &s[end..]))
}

/// How a statement ends a failed transaction block that pgcarpool plays itself (its
/// server was lost): PostgreSQL's transaction exit statements but ROLLBACK TO (the
/// savepoint went with the server) and the AND CHAIN forms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockExit {
    /// ROLLBACK, ABORT.
    Rollback,
    /// COMMIT, END, PREPARE TRANSACTION: a failed block rolls back all the same (its
    /// CommandComplete says ROLLBACK).
    Commit,
}

/// The one statement `sql` as a way out of a failed block, if it is one.
pub fn block_exit(sql: &[u8]) -> Option<BlockExit> {
    let w = keywords(strip_leading(sql), 5);
    let w: Vec<&str> = w.iter().map(String::as_str).collect();
    let (kind, rest) = match w.as_slice() {
        ["ROLLBACK" | "ABORT", rest @ ..] => (BlockExit::Rollback, rest),
        ["COMMIT" | "END", rest @ ..] => (BlockExit::Commit, rest),
        ["PREPARE", "TRANSACTION", ..] => return Some(BlockExit::Commit),
        _ => return None,
    };
    let rest = match rest {
        ["WORK" | "TRANSACTION", r @ ..] => r,
        r => r,
    };
    matches!(rest, [] | ["AND", "NO", ..]).then_some(kind)
}

/// What a query or a Parse's text does to the transaction around it, as far as a lost
/// server's client must be told: it may begin a block, and it may commit (COMMIT, END,
/// PREPARE TRANSACTION, COMMIT PREPARED, or CALL / DO, which may commit inside). Cheap:
/// leading words only, the text split only when it holds a `;`.
pub fn transaction_control(sql: &[u8]) -> (bool, bool) {
    if let Some(s) = lone_statement(sql) {
        return statement_control(s);
    }
    split(sql).iter().fold((false, false), |(b, c), &(x, y)| {
        let (b2, c2) = statement_control(&sql[x..y]);
        (b || b2, c || c2)
    })
}

/// `transaction_control` of one statement.
pub(super) fn statement_control(s: &[u8]) -> (bool, bool) {
    let word = |s: &'_ [u8]| -> usize {
        s.iter()
            .position(|c| !c.is_ascii_alphabetic())
            .unwrap_or(s.len())
    };
    let s = strip_leading(s);
    let kw = &s[..word(s)];
    let is = |w: &[u8]| kw.eq_ignore_ascii_case(w);
    let next = strip_leading(&s[kw.len()..]);
    let second = &next[..word(next)];
    let begins = is(b"BEGIN") || is(b"START");
    let commits = is(b"COMMIT")
        || is(b"END")
        || is(b"CALL")
        || is(b"DO")
        || (is(b"PREPARE") && second.eq_ignore_ascii_case(b"TRANSACTION"));
    (begins, commits)
}

/// A lone SQL `PREPARE name …` or `EXECUTE name …`.
#[derive(Debug, PartialEq, Eq)]
pub enum Named<'a> {
    Prepare { name: String, rest: &'a [u8] },
    Execute { name: String, rest: &'a [u8] },
}

/// The query as one PREPARE or EXECUTE statement, with its name and the text after it.
pub fn named_statement(sql: &[u8]) -> Option<Named<'_>> {
    let stmts = split(sql);
    let [(a, b)] = stmts.as_slice() else {
        return None;
    };
    let s = strip_leading(&sql[*a..*b]);
    let kw_end = s
        .iter()
        .position(|c| !c.is_ascii_alphabetic())
        .unwrap_or(s.len());
    let kw = &s[..kw_end];
    let after = s[kw_end..].trim_ascii_start();
    let (name, rest) = if let Some(q) = after.strip_prefix(b"\"") {
        let mut name = Vec::new();
        let mut i = 0;
        loop {
            match q.get(i) {
                None => return None,
                Some(b'"') if q.get(i + 1) == Some(&b'"') => {
                    name.push(b'"');
                    i += 2;
                }
                Some(b'"') => break,
                Some(&c) => {
                    name.push(c);
                    i += 1;
                }
            }
        }
        (String::from_utf8(name).ok()?, &q[i + 1..])
    } else {
        let end = after
            .iter()
            .position(|c| !(c.is_ascii_alphanumeric() || *c == b'_' || *c == b'$'))
            .unwrap_or(after.len());
        if end == 0 || after[0].is_ascii_digit() {
            return None;
        }
        (
            String::from_utf8_lossy(&after[..end]).to_ascii_lowercase(),
            &after[end..],
        )
    };
    let rest = rest.trim_ascii();
    if kw.eq_ignore_ascii_case(b"prepare") && !name.eq_ignore_ascii_case("transaction") {
        Some(Named::Prepare { name, rest })
    } else if kw.eq_ignore_ascii_case(b"execute") {
        Some(Named::Execute { name, rest })
    } else {
        None
    }
}

/// The text as one statement, when that needs no `split` (which allocates): no `;`, or
/// one `;` followed only by whitespace (`SELECT …;`, as psql and pgbench send it) in a
/// text with no quotes, comments or dollar quotes that could hide it. None: split it.
pub(super) fn lone_statement(sql: &[u8]) -> Option<&[u8]> {
    let Some(end) = sql.iter().position(|&c| c == b';') else {
        return Some(sql);
    };
    if !sql[end + 1..].iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    let head = &sql[..end];
    let plain = head.iter().enumerate().all(|(i, &c)| match c {
        b'\'' | b'"' => false,
        // `$1` is a parameter; any other `$` may open a dollar quote.
        b'$' => head.get(i + 1).is_some_and(u8::is_ascii_digit),
        b'-' => head.get(i + 1) != Some(&b'-'),
        b'/' => head.get(i + 1) != Some(&b'*'),
        _ => true,
    });
    plain.then_some(head)
}

/// Byte ranges of the statements in `sql`, split on `;` outside quotes and comments.
pub fn split(sql: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    let n = sql.len();
    while i < n {
        if QUOTE_START[usize::from(sql[i])]
            && let Some(end) = skip_quoted(sql, i)
        {
            i = end;
            continue;
        }
        if sql[i] == b';' {
            if has_content(&sql[start..i]) {
                out.push((start, i));
            }
            start = i + 1;
        }
        i += 1;
    }
    if start < n && has_content(&sql[start..n]) {
        out.push((start, n));
    }
    out
}

/// The bytes `skip_quoted` may find something at (a look-up before the call).
pub(crate) static QUOTE_START: [bool; 256] = {
    let mut t = [false; 256];
    t[b'\'' as usize] = true;
    t[b'"' as usize] = true;
    t[b'-' as usize] = true;
    t[b'/' as usize] = true;
    t[b'$' as usize] = true;
    t
};

/// Where what starts at `i` in `s` and is not SQL code ends (the index after it, at most
/// `s.len()`): a string literal (`E''` backslash escapes allowed), a quoted identifier, a
/// `--` comment (to its newline), a nested `/* */` comment or a dollar quote (`$tag$`, not
/// inside an identifier, not `$1`). None: none starts at `i`. The lexer of `split` and of
/// `selfview`'s word walk.
pub fn skip_quoted(s: &[u8], i: usize) -> Option<usize> {
    let n = s.len();
    let mut j = i;
    match s[i] {
        q @ (b'\'' | b'"') => {
            j += 1;
            while j < n {
                if s[j] == q {
                    if s.get(j + 1) == Some(&q) {
                        j += 2;
                        continue;
                    }
                    break;
                }
                if q == b'\'' && s[j] == b'\\' {
                    j += 1;
                }
                j += 1;
            }
            j += 1;
        }
        b'-' if s.get(i + 1) == Some(&b'-') => {
            while j < n && s[j] != b'\n' {
                j += 1;
            }
        }
        b'/' if s.get(i + 1) == Some(&b'*') => j += block_comment_len(&s[i..]),
        b'$' if i == 0 || !is_ident_char(s[i - 1]) => {
            let tag_end = s[i + 1..]
                .iter()
                .position(|&c| !(c.is_ascii_alphanumeric() || c == b'_'))
                .map(|p| i + 1 + p);
            match tag_end {
                Some(t) if s[t] == b'$' && (t == i + 1 || !s[i + 1].is_ascii_digit()) => {
                    let tag = &s[i..=t];
                    j = t + 1;
                    while j < n && !s[j..].starts_with(tag) {
                        j += 1;
                    }
                    j += tag.len();
                }
                _ => return None,
            }
        }
        _ => return None,
    }
    Some(j.min(n))
}

/// A character of an identifier after its first (`$` included).
pub(crate) fn is_ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'$'
}

/// The number of parameters PostgreSQL finds in a statement: the types the Parse gave
/// (`types`, counted from its message) or the highest `$n` in `sql`, whichever is more.
/// None when unsure (a string with a backslash, an unclosed quote or comment).
pub fn parameter_count(sql: &[u8], types: usize) -> Option<usize> {
    let (mut i, n, mut most) = (0, sql.len(), types);
    while i < n {
        match sql[i] {
            q @ (b'\'' | b'"') => {
                i += 1;
                loop {
                    match sql.get(i) {
                        None => return None,
                        Some(b'\\') => return None,
                        Some(&c) if c == q && sql.get(i + 1) == Some(&q) => i += 2,
                        Some(&c) if c == q => break,
                        Some(_) => i += 1,
                    }
                }
                i += 1;
            }
            b'-' if sql.get(i + 1) == Some(&b'-') => {
                while i < n && sql[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if sql.get(i + 1) == Some(&b'*') => {
                let len = block_comment_len(&sql[i..]);
                if !sql[i..i + len].ends_with(b"*/") {
                    return None;
                }
                i += len;
            }
            b'$' if sql.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                let ident =
                    i > 0 && (sql[i - 1].is_ascii_alphanumeric() || b"_$".contains(&sql[i - 1]));
                let end = sql[i + 1..]
                    .iter()
                    .position(|c| !c.is_ascii_digit())
                    .map_or(n, |p| i + 1 + p);
                if !ident {
                    let k: usize = std::str::from_utf8(&sql[i + 1..end]).ok()?.parse().ok()?;
                    most = most.max(k);
                }
                i = end;
            }
            b'$' => {
                // $tag$ ... $tag$, or a `$` inside an identifier.
                let tag_end = sql[i + 1..]
                    .iter()
                    .position(|&c| !(c.is_ascii_alphanumeric() || c == b'_'))
                    .map(|p| i + 1 + p);
                match tag_end {
                    Some(j) if sql[j] == b'$' => {
                        let tag = &sql[i..=j];
                        let close = find(&sql[j + 1..], tag)?;
                        i = j + 1 + close + tag.len();
                    }
                    _ => i += 1,
                }
            }
            _ => i += 1,
        }
    }
    Some(most)
}

/// Whether a simple Query (its body: the text and its NUL) may be sent again to another
/// server after the first was terminated before answering any of it (see
/// `Relay::first_reply`): nothing in it touches the session (`may_matter` is false) and its
/// first statement commits nothing before its reply — a query, a plain data change (the
/// termination rolled it back) or the start of a transaction block. Not CALL or DO (they
/// may commit inside), VACUUM, CREATE INDEX CONCURRENTLY and the like (they commit as
/// they go), COPY (its data is not kept).
pub fn replay_safe(body: &[u8]) -> bool {
    let sql = body.strip_suffix(b"\0").unwrap_or(body);
    !may_matter(sql) && replay_safe_start(sql)
}

/// `replay_safe` but for `may_matter`: the first statement is one that commits nothing
/// before its reply.
pub(super) fn replay_safe_start(sql: &[u8]) -> bool {
    const FIRST: [&[u8]; 11] = [
        b"select", b"values", b"table", b"with", b"insert", b"update", b"delete", b"merge",
        b"begin", b"start", b"show",
    ];
    let mut s = strip_leading(sql);
    while let Some(rest) = s.strip_prefix(b";") {
        s = strip_leading(rest);
    }
    let end = s
        .iter()
        .position(|c| !c.is_ascii_alphabetic())
        .unwrap_or(s.len());
    FIRST.iter().any(|k| s[..end].eq_ignore_ascii_case(k))
}

/// `s` without leading whitespace and comments.
pub(crate) fn strip_leading(mut s: &[u8]) -> &[u8] {
    loop {
        let t = s.trim_ascii_start();
        if t.starts_with(b"--") {
            s = t
                .iter()
                .position(|&c| c == b'\n')
                .map_or(&[][..], |p| &t[p..]);
        } else if t.starts_with(b"/*") {
            s = &t[block_comment_len(t)..];
        } else {
            return t;
        }
    }
}

/// Length of the block comment `s` starts with (`/*`), nested comments included as
/// PostgreSQL reads them; all of `s` when it is not closed.
fn block_comment_len(s: &[u8]) -> usize {
    let mut depth = 0usize;
    let mut i = 0;
    while i < s.len() {
        if s[i..].starts_with(b"/*") {
            depth += 1;
            i += 2;
        } else if s[i..].starts_with(b"*/") {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    s.len()
}

fn has_content(s: &[u8]) -> bool {
    !keywords(s, 1).is_empty()
}

/// The first `max` words of a statement, upper-cased, skipping whitespace and comments.
fn keywords(s: &[u8], max: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() && out.len() < max {
        let c = s[i];
        if c.is_ascii_whitespace() || c == b'(' || c == b')' || c == b',' {
            i += 1;
        } else if s[i..].starts_with(b"--") {
            while i < s.len() && s[i] != b'\n' {
                i += 1;
            }
        } else if s[i..].starts_with(b"/*") {
            i += block_comment_len(&s[i..]);
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let st = i;
            while i < s.len() && (s[i].is_ascii_alphanumeric() || s[i] == b'_') {
                i += 1;
            }
            out.push(String::from_utf8_lossy(&s[st..i]).to_ascii_uppercase());
        } else {
            break;
        }
    }
    out
}

/// The `n`th token (0-based) as a GUC name: a possibly dotted, possibly quoted identifier.
fn nth_token(s: &[u8], n: usize) -> Option<String> {
    let text = std::str::from_utf8(s).ok()?;
    let mut it = text
        .split(|c: char| c.is_whitespace() || c == '=')
        .filter(|t| !t.is_empty());
    let tok = it.nth(n)?;
    let tok = tok.trim_end_matches(';');
    let name: String = tok
        .split('.')
        .map(|p| p.trim_matches('"'))
        .collect::<Vec<_>>()
        .join(".");
    let valid = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == '.');
    valid.then(|| {
        if tok.contains('"') {
            name
        } else {
            name.to_ascii_lowercase()
        }
    })
}

/// `set_config('name', …)`: the name when it is a plain literal.
fn set_config_name(s: &[u8]) -> Option<String> {
    let lower = s.to_ascii_lowercase();
    let at = find(&lower, b"set_config")?;
    let rest = std::str::from_utf8(&s[at + "set_config".len()..]).ok()?;
    let rest = rest
        .trim_start()
        .strip_prefix('(')?
        .trim_start()
        .strip_prefix('\'')?;
    let end = rest.find('\'')?;
    let name = &rest[..end];
    (!name.is_empty()
        && name
            .chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == '.'))
    .then(|| name.to_string())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn starts_with_ci(hay: &[u8], needle: &[u8]) -> bool {
    hay.len() >= needle.len() && hay[..needle.len()].eq_ignore_ascii_case(needle)
}

/// `hay` holds `needle` (ASCII, any case): the first byte's places found with `memchr2`
/// (vectorised), the rest compared there.
pub fn contains_ci(hay: &[u8], needle: &[u8]) -> bool {
    let Some((&first, rest)) = needle.split_first() else {
        return true;
    };
    if hay.len() < needle.len() {
        return false;
    }
    let last_start = hay.len() - needle.len();
    let (lower, upper) = (first.to_ascii_lowercase(), first.to_ascii_uppercase());
    let mut at = 0;
    while let Some(i) = memchr::memchr2(lower, upper, &hay[at..=last_start]) {
        let p = at + i;
        if hay[p + 1..p + needle.len()].eq_ignore_ascii_case(rest) {
            return true;
        }
        at = p + 1;
        if at > last_start {
            break;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `is_empty` is `== Effects::default()`: false when any one field is set.
    #[test]
    fn effects_are_empty_only_as_the_default() {
        assert!(Effects::default().is_empty());
        let one: [fn(&mut Effects); 17] = [
            |e| e.gucs.push("x".into()),
            |e| e.gucs_unknown = true,
            |e| e.local_gucs.push("x".into()),
            |e| e.reset_all = true,
            |e| e.discard_all = true,
            |e| e.deallocate_all = true,
            |e| e.deallocate = Some("x".into()),
            |e| e.pin_check = true,
            |e| e.ddl = true,
            |e| e.reserved_name = true,
            |e| e.database_alone = Some("x".into()),
            |e| e.calls = true,
            |e| e.notify = true,
            |e| e.introspects = true,
            |e| e.terminates = true,
            |e| e.signals = true,
            |e| e.listen = true,
        ];
        for (i, set) in one.iter().enumerate() {
            let mut e = Effects::default();
            set(&mut e);
            assert!(!e.is_empty(), "field {i}");
            assert_eq!(e.is_empty(), e == Effects::default());
        }
    }

    /// `contains_ci` finds what a look at every place finds (seeded texts of a few letters).
    #[test]
    fn contains_ci_is_a_case_blind_search() {
        let naive = |hay: &[u8], needle: &[u8]| {
            hay.windows(needle.len())
                .any(|w| w.eq_ignore_ascii_case(needle))
        };
        let mut next = crate::sql::seeded_picks(0x2545_f491_4f6c_dd1d);
        let letters = b"inTONto ;";
        let (mut hits, mut misses) = (0, 0);
        for _ in 0..50_000 {
            let hay: Vec<u8> = (0..next(12))
                .map(|_| letters[next(letters.len())])
                .collect();
            let needle: &[u8] = [&b"into"[..], b"i", b"nto", b"INTO "][next(4)];
            let want = naive(&hay, needle);
            assert_eq!(contains_ci(&hay, needle), want, "{hay:?} {needle:?}");
            if want { hits += 1 } else { misses += 1 }
        }
        assert!(hits > 1_000 && misses > 1_000, "{hits} {misses}");
    }

    /// `lone_statement`'s shortcut gives what the split gives, for texts it takes and
    /// texts it leaves to the split.
    #[test]
    fn a_lone_statement_is_classified_as_its_split_would() {
        let texts = [
            "SELECT abalance FROM pgbench_accounts WHERE aid = 12345;",
            "SELECT 1 ;  \n",
            "select $1::int8;",
            "COMMIT;",
            "commit and chain;",
            "COMMIT AND NO CHAIN ; ",
            "ROLLBACK TO s1;",
            "begin;",
            "PREPARE TRANSACTION 'x';",
            "prepare transaction;",
            ";",
            "  ;  ",
            "SELECT 'a;';",
            "SELECT 'a;",
            "SELECT \"x;\";",
            "SELECT $$;$$;",
            "SELECT $a$ ; $a$;",
            "SELECT 1 -- c;",
            "SELECT 1 /* ; */;",
            "-- commit;",
            "/* begin; */ commit;",
            "COMMIT; BEGIN;",
            "begin; select 1",
            "END;x",
            "select 1 - -1;",
            "select 4 / 2;",
            "CALL p();",
            "DO $$ begin end $$;",
        ];
        for sql in texts {
            let sql = sql.as_bytes();
            let split_tx = tx_effect_of_split(sql);
            let text = String::from_utf8_lossy(sql);
            if sql.contains(&b';') {
                assert_eq!(tx_effect(sql), split_tx, "tx_effect of {text:?}");
                let (mut b, mut c) = (false, false);
                for (x, y) in split(sql) {
                    let (b2, c2) = transaction_control(&sql[x..y]);
                    (b, c) = (b || b2, c || c2);
                }
                assert_eq!(transaction_control(sql), (b, c), "control of {text:?}");
            }
        }
        assert!(lone_statement(b"SELECT 1;").is_some());
        assert!(lone_statement(b"SELECT '1';").is_none());
    }

    #[test]
    fn databases_that_must_be_alone_are_named() {
        for (sql, db) in [
            ("DROP DATABASE foo", Some("foo")),
            ("drop database if exists \"Foo\" with (force)", Some("Foo")),
            ("ALTER DATABASE foo RENAME TO bar", Some("foo")),
            ("ALTER DATABASE foo SET work_mem = '1MB'", None),
            ("DROP TABLE foo", None),
        ] {
            assert_eq!(
                classify(sql.as_bytes()).database_alone.as_deref(),
                db,
                "{sql}"
            );
        }
    }

    #[test]
    fn calls_of_unknown_functions_are_noticed() {
        for (sql, calls) in [
            ("select count(*), max(a) from t where b in (1, 2)", false),
            (
                "SELECT abalance FROM pgbench_accounts WHERE aid = $1",
                false,
            ),
            (
                "INSERT INTO h (tid, mtime) VALUES (1, CURRENT_TIMESTAMP)",
                false,
            ),
            ("select coalesce(x, now()) from t", false),
            ("select setsp('x')", true),
            ("select app.f(1)", true),
            ("select \"MyFunc\"(1)", true),
            ("update t set a = lower(b) where c = my_fn(d)", true),
        ] {
            assert_eq!(classify(sql.as_bytes()).calls, calls, "{sql}");
            if calls {
                assert!(may_matter(sql.as_bytes()), "{sql}");
            }
        }
        assert!(!may_matter(b"select count(*) from t where a = $1"));
    }

    #[test]
    fn plain_queries_have_no_effects() {
        assert!(classify(b"select * from t where a = 'SET x'").is_empty());
        assert!(classify(b"BEGIN").is_empty());
        assert!(classify(b"update t set a = 1").is_empty());
    }

    #[test]
    fn set_and_reset_name_their_guc() {
        assert_eq!(classify(b"SET search_path = a, b").gucs, ["search_path"]);
        assert_eq!(
            classify(b"set session TimeZone to 'UTC'").gucs,
            ["timezone"]
        );
        assert_eq!(
            classify(b"SET myapp.tenant_id = '7'").gucs,
            ["myapp.tenant_id"]
        );
        assert_eq!(classify(b"SET TIME ZONE 'UTC'").gucs, ["TimeZone"]);
        assert_eq!(
            classify(b"RESET statement_timeout").gucs,
            ["statement_timeout"]
        );
        let local = classify(b"SET LOCAL search_path = a");
        assert!(local.gucs.is_empty());
        assert_eq!(local.local_gucs, ["search_path"]);
        assert_eq!(
            classify(b"SET LOCAL TIME ZONE 'UTC'").local_gucs,
            ["TimeZone"]
        );
        assert!(classify(b"SET LOCAL TRANSACTION READ ONLY").is_empty());
        assert!(classify(b"SET TRANSACTION ISOLATION LEVEL SERIALIZABLE").is_empty());
        assert!(classify(b"RESET ALL").reset_all);
        assert_eq!(classify(b"SET ROLE md5user").gucs, ["role"]);
    }

    #[test]
    fn several_statements_are_all_seen() {
        let e = classify(b"SET a.b = '1;2'; /* ; */ SET c = 3; -- ;\n select 1");
        assert_eq!(e.gucs, ["a.b", "c"]);
        assert_eq!(split(b"select $$;$$; select 2;").len(), 2);
        assert_eq!(split(b"select 'it''s;'; select E'\\';'").len(), 2);
    }

    #[test]
    fn set_config_and_pins() {
        assert_eq!(
            classify(b"SELECT pg_catalog.set_config('search_path', '', false)").gucs,
            ["search_path"]
        );
        assert!(classify(b"select set_config($1, $2, false)").gucs_unknown);
        assert!(classify(b"select pg_advisory_lock(1)").pin_check);
        assert!(classify(b"CREATE TEMP TABLE x (a int)").pin_check);
        assert!(classify(b"create local temporary table x (a int)").pin_check);
        assert!(classify(b"LISTEN ch").pin_check);
        assert!(classify(b"declare c cursor with hold for select 1").pin_check);
    }

    #[test]
    fn discard_and_deallocate() {
        let e = classify(b"DISCARD ALL");
        assert!(e.discard_all && e.reset_all && e.deallocate_all);
        assert!(classify(b"DEALLOCATE ALL").deallocate_all);
        assert_eq!(
            classify(b"DEALLOCATE pdo_stmt_00000001")
                .deallocate
                .as_deref(),
            Some("pdo_stmt_00000001")
        );
        assert_eq!(
            classify(b"deallocate prepare \"S_1\"")
                .deallocate
                .as_deref(),
            Some("S_1")
        );
    }

    #[test]
    fn prepare_and_execute_are_named() {
        assert_eq!(
            named_statement(b"PREPARE foo(int) AS select $1"),
            Some(Named::Prepare {
                name: "foo".into(),
                rest: b"(int) AS select $1"
            })
        );
        assert_eq!(
            named_statement(b"execute \"Foo\"\"x\" (1, 2);"),
            Some(Named::Execute {
                name: "Foo\"x".into(),
                rest: b"(1, 2)"
            })
        );
        assert_eq!(named_statement(b"PREPARE TRANSACTION 'x'"), None);
        assert_eq!(named_statement(b"execute a; execute b"), None);
    }

    #[test]
    fn plain_traffic_is_not_classified() {
        assert!(!may_matter(
            b"select abalance from pgbench_accounts where aid = 1;"
        ));
        assert!(!may_matter(b"BEGIN; UPDATE t SET a = 1; COMMIT;"));
        assert!(may_matter(b"select 1; SET search_path = x"));
        assert!(may_matter(b"  set x = 1"));
    }

    /// Effects with these GUCs, changed by `f`.
    fn fx(gucs: &[&str], f: impl FnOnce(&mut Effects)) -> Effects {
        let mut e = Effects {
            gucs: gucs.iter().map(|g| g.to_string()).collect(),
            ..Effects::default()
        };
        f(&mut e);
        e
    }

    #[test]
    fn parameter_count_is_the_highest_placeholder_or_the_types_given() {
        assert_eq!(parameter_count(b"SELECT 1", 0), Some(0));
        assert_eq!(parameter_count(b"SELECT $1::int * 2", 0), Some(1));
        assert_eq!(parameter_count(b"SELECT $2, $1", 0), Some(2));
        assert_eq!(parameter_count(b"SELECT $1", 3), Some(3));
        assert_eq!(
            parameter_count(b"SELECT '$3', \"$4\", a$5 -- $6\n/* $7 */", 0),
            Some(0)
        );
        assert_eq!(
            parameter_count(b"SELECT $q$ $8 $q$, $$ $9 $$, $10", 0),
            Some(10)
        );
        assert_eq!(parameter_count(b"SELECT 'it''s' || $1", 0), Some(1));
        assert_eq!(parameter_count(b"SELECT E'\\' || $1", 0), None);
        assert_eq!(parameter_count(b"SELECT 'open", 0), None);
    }

    #[test]
    fn each_kind_of_statement_has_exactly_its_effects() {
        let none = Effects::default();
        let cases: Vec<(&str, Effects)> = vec![
            // SET
            (
                "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
                fx(&SESSION_CHARACTERISTICS, |_| {}),
            ),
            (
                "SET SESSION AUTHORIZATION bob",
                fx(&["session_authorization", "role"], |_| {}),
            ),
            ("SET SESSION search_path = x", fx(&["search_path"], |_| {})),
            ("SET NAMES 'UTF8'", fx(&["client_encoding"], |_| {})),
            ("SET SCHEMA 'x'", fx(&["search_path"], |_| {})),
            ("SET XML OPTION document", fx(&["xmloption"], |_| {})),
            ("SET", none.clone()),
            ("SET a-b = 1", fx(&[], |e| e.gucs_unknown = true)),
            // RESET
            (
                "RESET ALL",
                fx(&["session_authorization", "role"], |e| e.reset_all = true),
            ),
            ("RESET ROLE", fx(&["role"], |_| {})),
            ("RESET TIME ZONE", fx(&["TimeZone"], |_| {})),
            (
                "RESET SESSION AUTHORIZATION",
                fx(&["session_authorization", "role"], |_| {}),
            ),
            ("RESET a-b", fx(&[], |e| e.gucs_unknown = true)),
            // DISCARD
            (
                "DISCARD ALL",
                fx(&["session_authorization", "role"], |e| {
                    e.discard_all = true;
                    e.reset_all = true;
                    e.deallocate_all = true;
                    e.pin_check = true;
                }),
            ),
            ("DISCARD TEMP", fx(&[], |e| e.pin_check = true)),
            ("discard temporary", fx(&[], |e| e.pin_check = true)),
            ("DISCARD PLANS", none.clone()),
            // DEALLOCATE, PREPARE, EXECUTE
            (
                "DEALLOCATE PREPARE ALL",
                fx(&[], |e| e.deallocate_all = true),
            ),
            ("DEALLOCATE x; select 1", fx(&[], |e| e.pin_check = true)),
            (
                "DEALLOCATE PGCARPOOL_1",
                fx(&[], |e| {
                    e.reserved_name = true;
                    e.deallocate = Some("pgcarpool_1".into());
                }),
            ),
            ("PREPARE TRANSACTION 'x'", none.clone()),
            ("PREPARE TRANSACTION 'x'; select 1", none.clone()),
            ("PREPARE p AS select 1", none.clone()),
            (
                "PREPARE p AS select 1; select 1",
                fx(&[], |e| e.pin_check = true),
            ),
            (
                "PREPARE pgcarpool_3 AS select 1",
                fx(&[], |e| e.reserved_name = true),
            ),
            ("EXECUTE p", none.clone()),
            ("EXECUTE p; select 1", fx(&[], |e| e.pin_check = true)),
            // Pins and DDL
            (
                "LISTEN ch",
                fx(&[], |e| {
                    e.pin_check = true;
                    e.listen = true;
                }),
            ),
            ("UNLISTEN *", fx(&[], |e| e.pin_check = true)),
            (
                "CREATE GLOBAL TEMPORARY TABLE t (a int)",
                fx(&[], |e| e.pin_check = true),
            ),
            ("CREATE TABLE t (a int)", fx(&[], |e| e.ddl = true)),
            (
                "DROP TABLE t",
                fx(&[], |e| {
                    e.ddl = true;
                    e.pin_check = true;
                }),
            ),
            (
                "ALTER TABLE t ADD b int",
                fx(&[], |e| {
                    e.ddl = true;
                    e.pin_check = true;
                }),
            ),
            (
                "ALTER DATABASE foo RENAME TO bar",
                fx(&[], |e| e.database_alone = Some("foo".into())),
            ),
            (
                "DROP DATABASE IF EXISTS foo",
                fx(&[], |e| e.database_alone = Some("foo".into())),
            ),
            (
                "DO $$ begin end $$",
                fx(&["role", "session_authorization"], |e| {
                    e.gucs_unknown = true;
                    e.pin_check = true;
                    e.ddl = true;
                }),
            ),
            (
                "CALL p()",
                fx(&["role", "session_authorization"], |e| {
                    e.gucs_unknown = true;
                    e.pin_check = true;
                    e.ddl = true;
                }),
            ),
            (
                "DECLARE c CURSOR WITH HOLD FOR select 1",
                fx(&[], |e| e.pin_check = true),
            ),
            ("DECLARE c CURSOR FOR select 1", none.clone()),
            // Anything else: set_config, advisory locks, pg_temp, calls.
            // set_config is not among the well-known functions: also a call.
            (
                "select set_config('a.b', 'x', false)",
                fx(&["a.b"], |e| e.calls = true),
            ),
            (
                "select set_config ('a b', 'x', false)",
                fx(&[], |e| e.gucs_unknown = true),
            ),
            (
                "select set_config ('', 'x', false)",
                fx(&[], |e| e.gucs_unknown = true),
            ),
            ("select * from pg_temp.t", fx(&[], |e| e.pin_check = true)),
            (
                "select pg_try_advisory_lock (1)",
                fx(&[], |e| e.pin_check = true),
            ),
            ("select my_fn(1)", fx(&[], |e| e.calls = true)),
            ("select 1", none.clone()),
            ("(select 1)", none.clone()),
        ];
        for (sql, want) in cases {
            assert_eq!(classify(sql.as_bytes()), want, "{sql}");
        }
    }

    #[test]
    fn may_matter_finds_keywords_inside_the_text() {
        // With a space before `(`, these are not seen as calls: the words themselves count.
        assert!(may_matter(
            b"select pg_catalog.set_config ('a', 'b', false)"
        ));
        assert!(may_matter(b"select pg_advisory_lock (1)"));
        assert!(may_matter(b"select * from pg_temp.t"));
        assert!(!may_matter(b"select * from pg_catalog.pg_class"));
        // A `(` first is not a call.
        assert!(!may_matter(b"(select 1)"));
        assert!(may_matter(b"(select 1); set x = 1"));
    }

    #[test]
    fn a_call_is_an_identifier_before_a_parenthesis() {
        assert!(calls_unknown(b"select f"));
        assert!(calls_unknown(b"select \"F\""));
        assert!(calls_unknown(b"select a$max"), "$ is part of a name");
        assert!(!calls_unknown(b"select max"));
        assert!(!calls_unknown(b"select $1"), "a parameter");
        assert!(!calls_unknown(b"select 1"));
        assert!(!calls_unknown(b"select "));
    }

    /// The statements `split` finds, as text.
    fn parts(sql: &str) -> Vec<&str> {
        split(sql.as_bytes())
            .into_iter()
            .map(|(a, b)| &sql[a..b])
            .collect()
    }

    #[test]
    fn split_skips_semicolons_in_quotes_comments_and_dollar_quotes() {
        assert_eq!(parts("select ';'; select 2"), ["select ';'", " select 2"]);
        assert_eq!(parts("select \";\"; x"), ["select \";\"", " x"]);
        assert_eq!(
            parts("select 'a'';'; select 2"),
            ["select 'a'';'", " select 2"]
        );
        assert_eq!(
            parts("select E'\\';'; select 2"),
            ["select E'\\';'", " select 2"]
        );
        // A backslash is no escape in an identifier.
        assert_eq!(parts("select \"a\\\"; x"), ["select \"a\\\"", " x"]);
        assert_eq!(
            parts("select 1 -- ;\n; select 2"),
            ["select 1 -- ;\n", " select 2"]
        );
        assert_eq!(
            parts("/* /* ; */ ; */ select 1; select 2"),
            ["/* /* ; */ ; */ select 1", " select 2"]
        );
        assert_eq!(
            parts("select $$;$$; select $a$;$$;$a$; x"),
            ["select $$;$$", " select $a$;$$;$a$", " x"]
        );
        // A parameter is not a dollar quote, nor is a tag that starts with a digit, nor a
        // `$` inside an identifier (`a$b$` is one, as PostgreSQL reads it).
        assert_eq!(parts("select $1; select 2"), ["select $1", " select 2"]);
        assert_eq!(parts("select a$b$; select 2"), ["select a$b$", " select 2"]);
        assert_eq!(parts("select $1$; select 2"), ["select $1$", " select 2"]);
        // The closing tag is looked for after the opening one: this string is `a$;`.
        assert_eq!(
            parts("select $a$a$;$a$; select 2"),
            ["select $a$a$;$a$", " select 2"]
        );
        // An empty string literal.
        assert_eq!(parts("select ''; select 2"), ["select ''", " select 2"]);
        // Lone '-', '/' and '$': no comment, no quote.
        assert_eq!(
            parts("select 2-1; select 4/2; select a$b; x"),
            ["select 2-1", " select 4/2", " select a$b", " x"]
        );
        // Empty statements and trailing comments are not statements.
        assert_eq!(parts(";; select 1; -- c"), [" select 1"]);
        assert_eq!(parts("select 1;"), ["select 1"]);
    }

    #[test]
    fn a_nested_comment_before_a_statement_hides_nothing() {
        let sql = b"/* a /* b */ c */ SET search_path = x";
        assert!(may_matter(sql));
        assert_eq!(classify(sql).gucs, ["search_path"]);
        assert_eq!(classify(b"select 1; /* /* */ */ set role r").gucs, ["role"]);
        assert!(ends_transaction(b"/* /* */ */ COMMIT"));
        assert_eq!(block_comment_len(b"/**/x"), 4);
        assert_eq!(block_comment_len(b"/* /* */ x"), 10);
        assert!(classify(b"/* /* */ SET x = 1").is_empty(), "all comment");
    }

    #[test]
    fn returning_a_setting_to_its_default_is_recognised() {
        let d = |name: &str, local, reset| {
            Some(ToDefault {
                name: name.into(),
                local,
                reset,
            })
        };
        assert_eq!(
            to_default(b"RESET statement_timeout"),
            d("statement_timeout", false, true)
        );
        assert_eq!(
            to_default(b" reset Application_Name;"),
            d("application_name", false, true)
        );
        assert_eq!(to_default(b"RESET TIME ZONE"), d("timezone", false, true));
        assert_eq!(
            to_default(b"set search_path to default"),
            d("search_path", false, false)
        );
        assert_eq!(to_default(b"SET x.y=DEFAULT"), d("x.y", false, false));
        assert_eq!(to_default(b"SET SESSION a = DEFAULT"), d("a", false, false));
        assert_eq!(to_default(b"SET LOCAL a TO DEFAULT"), d("a", true, false));
        assert_eq!(
            to_default(b"SET TIME ZONE LOCAL"),
            d("timezone", false, false)
        );
        for no in [
            &b"RESET ALL"[..],
            b"RESET a; select 1",
            b"SET a TO 5",
            b"SET a TO 'default'",
            b"SET ROLE DEFAULT",
            b"SET a TO DEFAULT, b",
            b"RESET a b",
            b"SET SESSION AUTHORIZATION DEFAULT",
            b"RESET /* c */ a",
        ] {
            assert_eq!(to_default(no), None, "{}", String::from_utf8_lossy(no));
        }
    }

    #[test]
    fn transaction_control_effects() {
        let after =
            |sql: &str| tx_effect(sql.as_bytes()).map(|e| String::from_utf8(e.to_vec()).unwrap());
        assert_eq!(after("BEGIN").as_deref(), Some("TTE"));
        assert_eq!(
            after(" /* x */ start transaction read only").as_deref(),
            Some("TTE")
        );
        for end in [
            "COMMIT",
            "end",
            "ROLLBACK WORK",
            "abort",
            "COMMIT AND NO CHAIN",
        ] {
            assert_eq!(after(end).as_deref(), Some("III"), "{end}");
        }
        assert_eq!(after("PREPARE TRANSACTION 'x'").as_deref(), Some("III"));
        assert_eq!(after("ROLLBACK TO SAVEPOINT sp").as_deref(), Some("ITT"));
        assert_eq!(after("rollback transaction to sp").as_deref(), Some("ITT"));
        assert_eq!(after("COMMIT AND CHAIN").as_deref(), Some("ITT"));
        assert_eq!(after("ROLLBACK; BEGIN").as_deref(), Some("TTT"));
        assert_eq!(after("BEGIN; SELECT 1; COMMIT").as_deref(), Some("III"));
        for none in [
            "SELECT 1",
            "PREPARE p AS SELECT 1",
            "COMMIT PREPARED 'x'",
            "SAVEPOINT a",
            "",
            "select 'begin'",
        ] {
            assert_eq!(after(none), None, "{none}");
        }
    }

    #[test]
    fn block_exits_and_transaction_control() {
        use BlockExit::*;
        for (sql, want) in [
            ("ROLLBACK", Some(Rollback)),
            ("abort work", Some(Rollback)),
            ("/* c */ rollback transaction and no chain", Some(Rollback)),
            ("COMMIT", Some(Commit)),
            ("end", Some(Commit)),
            ("PREPARE TRANSACTION 'x'", Some(Commit)),
            ("ROLLBACK TO SAVEPOINT a", None),
            ("ROLLBACK AND CHAIN", None),
            ("COMMIT PREPARED 'x'", None),
            ("ROLLBACK PREPARED 'x'", None),
            ("SELECT 1", None),
        ] {
            assert_eq!(block_exit(sql.as_bytes()), want, "{sql}");
        }
        for (sql, want) in [
            ("INSERT INTO t VALUES (1)", (false, false)),
            ("begin", (true, false)),
            ("START TRANSACTION", (true, false)),
            ("BEGIN; INSERT INTO t VALUES (1); COMMIT", (true, true)),
            ("SELECT CASE WHEN a THEN 1 END FROM t", (false, false)),
            ("SELECT 'x;'; end", (false, true)),
            ("CALL p()", (false, true)),
            ("PREPARE s AS SELECT 1", (false, false)),
            ("-- c\n prepare transaction 'a'", (false, true)),
        ] {
            assert_eq!(transaction_control(sql.as_bytes()), want, "{sql}");
        }
    }

    #[test]
    fn keywords_skip_punctuation_and_comments() {
        assert_eq!(keywords(b"( a ) , b", 4), ["A", "B"]);
        assert_eq!(keywords(b"(a)(b),c", 4), ["A", "B", "C"]);
        assert_eq!(
            keywords(b"set -- x\n /* y */ Time_Zone", 4),
            ["SET", "TIME_ZONE"]
        );
        assert_eq!(keywords(b"a b c", 2), ["A", "B"]);
        assert_eq!(keywords(b"a 1 b", 4), ["A"], "a word starts with a letter");
        assert_eq!(keywords(b"_a b1", 4), ["_A", "B1"]);
        assert_eq!(keywords(b"a 'b' c", 4), ["A"]);
        assert_eq!(keywords(b"a /* open", 4), ["A"]);
        assert_eq!(parts("(select 1); select 2"), ["(select 1)", " select 2"]);
    }

    #[test]
    fn named_statements_need_a_name() {
        assert_eq!(
            named_statement(b"execute a$b(1)"),
            Some(Named::Execute {
                name: "a$b".into(),
                rest: b"(1)"
            })
        );
        assert_eq!(named_statement(b"EXECUTE 1x"), None);
        assert_eq!(named_statement(b"EXECUTE (1)"), None);
        assert_eq!(named_statement(b"EXECUTE \"unterminated"), None);
        assert_eq!(named_statement(b"DEALLOCATE x"), None);
    }

    #[test]
    fn internal_names_have_the_prefix_in_any_case() {
        assert!(is_internal_name(b"PGCARPOOL_1"));
        assert!(is_internal_name(b"pgcarpool_"));
        assert!(!is_internal_name(b"PGCARPOOL"));
        assert!(!is_internal_name(b"pgcarpool1"));
        assert!(!is_internal_name(b"my_statement_1"));
        assert!(!is_internal_name(b""));
    }

    #[test]
    fn statements_that_end_a_transaction() {
        for sql in [
            "ROLLBACK",
            "commit",
            "END",
            "abort",
            "rollback to savepoint a",
            "/* c */ COMMIT PREPARED 'x'",
        ] {
            assert!(ends_transaction(sql.as_bytes()), "{sql}");
        }
        for sql in ["select 1", "BEGIN", "", "savepoint a"] {
            assert!(!ends_transaction(sql.as_bytes()), "{sql}");
        }
    }

    #[test]
    fn effects_merge_keeps_everything_once() {
        let mut a = fx(&["search_path"], |e| {
            e.pin_check = true;
            e.database_alone = Some("a".into());
            e.deallocate = Some("p".into());
        });
        assert!(!a.is_empty());
        a.merge(fx(&["SEARCH_PATH", "role"], |e| {
            e.gucs_unknown = true;
            e.reset_all = true;
            e.discard_all = true;
            e.deallocate_all = true;
            e.ddl = true;
            e.reserved_name = true;
            e.calls = true;
            e.database_alone = Some("b".into());
        }));
        assert_eq!(
            a,
            fx(&["search_path", "role"], |e| {
                e.gucs_unknown = true;
                e.reset_all = true;
                e.discard_all = true;
                e.deallocate_all = true;
                e.pin_check = true;
                e.ddl = true;
                e.reserved_name = true;
                e.calls = true;
                e.database_alone = Some("a".into());
            })
        );
        // Flags already set stay set; a first database_alone is taken.
        let mut b = fx(&[], |e| {
            e.gucs_unknown = true;
            e.reset_all = true;
            e.discard_all = true;
            e.deallocate_all = true;
            e.pin_check = true;
            e.ddl = true;
            e.reserved_name = true;
            e.calls = true;
        });
        let before = b.clone();
        b.merge(Effects::default());
        assert_eq!(b, before);
        b.merge(fx(&[], |e| e.database_alone = Some("c".into())));
        assert_eq!(b.database_alone.as_deref(), Some("c"));
    }

    #[test]
    fn garbage_does_not_panic() {
        for s in [
            &b"$"[..],
            b"$a",
            b"'",
            b"/*",
            b"--",
            b"\xff\xfe",
            b"set",
            b"set_config(",
            b";;;",
        ] {
            let _ = classify(s);
        }
    }

    #[test]
    fn starts_with_word_looks_at_the_first_word_only() {
        for (sql, want) in [
            (&b"DEALLOCATE p1"[..], true),
            (b"  /* c */ deallocate all", true),
            (b"-- c\nDeAllocate\tp", true),
            (b"deallocate", true),
            (b"deallocate;", true),
            (b"deallocated", false),
            (b"deallocate_x", false),
            (b"select 1; deallocate p1", false),
            (b"dealloc", false),
            (b"", false),
        ] {
            assert_eq!(
                starts_with_word(sql, b"deallocate"),
                want,
                "{}",
                String::from_utf8_lossy(sql)
            );
        }
    }

    #[test]
    fn replay_safe_takes_queries_and_plain_changes_only() {
        for ok in [
            &b"select 1\0"[..],
            b"  /* c */ -- x\n;; SELECT pg_sleep(1)\0",
            b"insert into t values (1); select 2\0",
            b"with x as (delete from t returning *) select * from x\0",
            b"BEGIN\0",
            b"start transaction\0",
        ] {
            assert!(replay_safe(ok), "{}", String::from_utf8_lossy(ok));
        }
        for no in [
            &b"call p()\0"[..],
            b"do $$begin commit; end$$\0",
            b"vacuum t\0",
            b"create index concurrently i on t (a)\0",
            b"copy t from stdin\0",
            b"select 1; prepare s as select 1\0",
            b"set work_mem = '1MB'\0",
            b"select set_config('a.b', '1', false)\0",
            b";\0",
            b"\0",
        ] {
            assert!(!replay_safe(no), "{}", String::from_utf8_lossy(no));
        }
    }

    #[test]
    fn plans_once_only_plain_dml() {
        for yes in [
            &b"SELECT abalance FROM pgbench_accounts WHERE aid = $1;\0\0\0"[..],
            b" /* c */ (select $1::int)",
            b"values (1)",
            b"TABLE shared",
            b"insert into t values ($1) returning id",
            b"update t set a = 1",
            b"delete from t where a = $1 ;  ",
            b"with x as (select 1) select * from x",
        ] {
            assert!(plans_once(yes), "{}", String::from_utf8_lossy(yes));
        }
        for no in [
            &b"select 1 into t2\0"[..],
            b"with x as (select 1) insert into t select * from x",
            b"show work_mem",
            b"explain select 1",
            b"select 1; select 2",
            b"set search_path = a",
            b"create table t (a int)",
            b"select set_config('a.b', '1', false)",
            b"select pg_advisory_lock(1)",
            b"select * from pg_temp.t",
            b"select my_function(1)",
            b"begin",
            b"",
        ] {
            assert!(!plans_once(no), "{}", String::from_utf8_lossy(no));
        }
    }

    #[test]
    fn returns_rows_only_when_sure() {
        for yes in [
            &b"SELECT 1\0\0\0"[..],
            b" /* c */ (select $1::int)",
            b"values (1)",
            b"TABLE shared",
            b"show work_mem",
            b"explain select 1",
        ] {
            assert!(returns_rows(yes), "{}", String::from_utf8_lossy(yes));
        }
        for no in [
            &b"select 1 into t2\0"[..],
            b"insert into t values ($1) returning id",
            b"update t set a = 1",
            b"with x as (select 1) insert into t select * from x",
            b"FETCH 2 FROM c1",
            b"SET a = 1",
            b"COPY t TO STDOUT",
            b"",
        ] {
            assert!(!returns_rows(no), "{}", String::from_utf8_lossy(no));
        }
    }
}
