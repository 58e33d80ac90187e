//! What the relay needs to know of one SQL text (a simple Query's), found once per message:
//! the classifier's cheap answers side by side, so that no caller scans the text again.
use super::classify;

/// The classifier's cheap answers for one text, each as its own function gives it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Facts {
    /// `classify::may_matter`: `classify` could find something (the text is looked at
    /// further).
    pub may_matter: bool,
    /// `classify::tx_effect`.
    pub tx: Option<[u8; 3]>,
    /// `classify::transaction_control`: it may begin a block, it may commit.
    pub control: (bool, bool),
    /// `classify::replay_safe`.
    pub replay_safe: bool,
}

impl Facts {
    /// The facts of `sql` (a text up to its NUL): the text is split only when it holds a
    /// `;` that may part statements, and `may_matter`'s pass is made once.
    pub fn of(sql: &[u8]) -> Facts {
        if plain(sql) {
            return Facts {
                may_matter: false,
                tx: None,
                control: (false, false),
                replay_safe: true,
            };
        }
        Facts::of_each(sql)
    }

    /// `of`, each fact by its own function.
    fn of_each(sql: &[u8]) -> Facts {
        let may_matter = classify::may_matter(sql);
        let (tx, control) = match classify::lone_statement(sql) {
            Some(one) => (
                classify::statement_tx_effect(one),
                classify::statement_control(one),
            ),
            None => (
                classify::tx_effect_of_split(sql),
                classify::transaction_control(sql),
            ),
        };
        Facts {
            may_matter,
            tx,
            control,
            replay_safe: !may_matter && classify::replay_safe_start(sql),
        }
    }
}

/// Whether `sql` is the common text `Facts::of` finds in one pass (`plain`): then its
/// facts are those of a text that may not matter, begins and commits nothing, and may be
/// sent again. False proves nothing (`Facts::of` looks further).
pub fn is_plain(sql: &[u8]) -> bool {
    plain(sql)
}

/// The common text, in one pass: one statement that only reads or changes data (the first
/// words in `PLAIN`: no transaction control, safe to send again), after whitespace only,
/// in which `may_matter` finds nothing, with at most a `;` at its end outside quotes.
#[inline(always)]
fn plain(sql: &[u8]) -> bool {
    /// First words whose statements begin and commit nothing and may be sent again
    /// (`classify::replay_safe_start`), and that `may_matter` does not look for.
    const PLAIN: [&[u8]; 9] = [
        b"select", b"insert", b"update", b"delete", b"with", b"values", b"table", b"merge", b"show",
    ];
    let s = sql.trim_ascii_start();
    let end = s
        .iter()
        .position(|c| !c.is_ascii_alphabetic())
        .unwrap_or(s.len());
    end > 0
        && s.get(end)
            .is_none_or(|&c| !c.is_ascii_alphanumeric() && c != b'_')
        && PLAIN.iter().any(|k| s[..end].eq_ignore_ascii_case(k))
        && classify::plain_rest(s, end)
}

/// What the relay needs of a Parse's text, found once per text (`client::session`'s
/// `unnamed_facts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextFacts {
    /// `classify::transaction_control`.
    pub control: (bool, bool),
    /// `classify::plans_once`.
    pub plans_once: bool,
    /// `classify::tx_effect`.
    pub tx: Option<[u8; 3]>,
    /// `classify::may_matter`.
    pub may_matter: bool,
}

impl TextFacts {
    pub fn of(sql: &[u8]) -> TextFacts {
        TextFacts {
            control: classify::transaction_control(sql),
            plans_once: classify::plans_once(sql),
            tx: classify::tx_effect(sql),
            may_matter: classify::may_matter(sql),
        }
    }
}

/// The SQL text of a Query message's body: up to its first NUL (what PostgreSQL reads).
pub fn query_text(body: &[u8]) -> &[u8] {
    let end = memchr::memchr(0, body).unwrap_or(body.len());
    &body[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each fact is what its own function says, for texts of every kind.
    #[test]
    fn facts_agree_with_the_classifier() {
        let texts: [&[u8]; 14] = [
            b"SELECT abalance FROM pgbench_accounts WHERE aid = 1;",
            b"BEGIN",
            b"begin isolation level serializable;",
            b"COMMIT AND CHAIN",
            b"SET search_path = x",
            b"select 1; commit",
            b"  /* c */ ROLLBACK TO s",
            b"PREPARE TRANSACTION 'x'",
            b"DO $$ begin perform 1; end $$",
            b"select pg_advisory_lock(1)",
            b"call p()",
            b"insert into t values ('a;b'); begin",
            b"",
            b";;select 1",
        ];
        for sql in texts {
            let mut body = sql.to_vec();
            body.push(0);
            let f = Facts::of(sql);
            let want = Facts {
                may_matter: classify::may_matter(sql),
                tx: classify::tx_effect(sql),
                control: classify::transaction_control(sql),
                replay_safe: classify::replay_safe(&body),
            };
            assert_eq!(f, want, "{}", String::from_utf8_lossy(sql));
        }
    }

    /// The one-pass path gives what the functions give, on texts made of the pieces each
    /// of them looks at (a seeded generator: the same texts every run).
    #[test]
    fn the_plain_path_agrees_with_each_function() {
        const PIECES: [&str; 40] = [
            "select",
            "SELECT",
            "insert",
            "with",
            "show",
            "begin",
            "commit",
            "set",
            "do",
            " ",
            "  ",
            "\n",
            ";",
            "(",
            ")",
            "'",
            "\"",
            "$$",
            "$1",
            "$a",
            "--",
            "/*",
            "*/",
            "-",
            "/",
            "count",
            "f",
            "pg_temp",
            "pg_try_advisory_lock",
            "pg_notify",
            "notify",
            "set_config",
            "pg_backend_pid",
            "pg_catalog",
            "advisory",
            "x",
            "a",
            "1",
            ".",
            "é",
        ];
        let mut next = crate::sql::seeded_picks(0x9e37_79b9_7f4a_7c15);
        let mut plain = 0;
        for _ in 0..200_000 {
            let mut text = String::new();
            let first = ["select", "insert", "with", "show", " select", "update"][next(6)];
            text.push_str(first);
            for _ in 0..next(12) {
                text.push_str(PIECES[next(PIECES.len())]);
                if next(2) == 0 {
                    text.push(' ');
                }
            }
            let sql = text.as_bytes();
            if super::plain(sql) {
                plain += 1;
            }
            assert_eq!(Facts::of(sql), Facts::of_each(sql), "{text:?}");
        }
        // Both paths were taken.
        assert!((10_000..190_000).contains(&plain), "{plain}");
    }

    #[test]
    fn query_text_stops_at_the_nul() {
        assert_eq!(query_text(b"select 1\0"), b"select 1");
        assert_eq!(query_text(b"select 1"), b"select 1");
    }
}
