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

/// The SQL text of a Query message's body: up to its first NUL (what PostgreSQL reads).
pub fn query_text(body: &[u8]) -> &[u8] {
    let end = body.iter().position(|&b| b == 0).unwrap_or(body.len());
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

    #[test]
    fn query_text_stops_at_the_nul() {
        assert_eq!(query_text(b"select 1\0"), b"select 1");
        assert_eq!(query_text(b"select 1"), b"select 1");
    }
}
