//! The status page on the metrics listener: `/` is a static page (`status.html`: inline CSS
//! and script, no external asset) whose script polls `/status.json`, the console's own
//! tables (SHOW POOLS, CARPOOL, HOSTS, EVENTS, STATE) as JSON: each fact keeps one owner,
//! the function in `show.rs` that makes its SHOW view.
use std::fmt::Write as _;
use std::time::SystemTime;

use super::command::View;
use super::show;
use super::table::{Cell, Table};
use crate::shared::Shared;

/// The page: HTML with its CSS and script inline.
pub const PAGE: &str = include_str!("status.html");

/// What the page's browser may load: nothing but the page's own inline parts and
/// `/status.json` from where the page came from.
pub const PAGE_POLICY: &str = "default-src 'none'; script-src 'unsafe-inline'; \
     style-src 'unsafe-inline'; connect-src 'self'; img-src data:; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// The views in `/status.json`, by the name SHOW takes.
const VIEWS: [(&str, View); 5] = [
    ("pools", View::Pools),
    ("carpool", View::Carpool),
    ("hosts", View::Hosts),
    ("events", View::Events),
    ("state", View::State),
];

/// `{"version": …, "time": …, "views": {"pools": {"columns": […], "rows": [[…]]}, …}}`.
pub fn json(shared: &Shared) -> String {
    let mut out = String::from("{\"version\":");
    string(&mut out, &crate::cli::version_line());
    out.push_str(",\"time\":");
    string(&mut out, &show::fmt_time(SystemTime::now()));
    out.push_str(",\"views\":{");
    for (i, (name, view)) in VIEWS.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        string(&mut out, name);
        out.push(':');
        if let Some(t) = show::table(shared, view) {
            table(&mut out, &t);
        } else {
            out.push_str("null");
        }
    }
    out.push_str("}}");
    out
}

/// A table as `{"columns": [names], "rows": [[cells]]}`.
fn table(out: &mut String, t: &Table) {
    out.push_str("{\"columns\":[");
    for (i, (name, _)) in t.columns.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        string(out, name);
    }
    out.push_str("],\"rows\":[");
    for (i, row) in t.rows.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push('[');
        for (j, cell) in row.iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            match cell {
                Cell::Null => out.push_str("null"),
                Cell::Int(n) => {
                    let _ = write!(out, "{n}");
                }
                Cell::Text(s) => string(out, s),
            }
        }
        out.push(']');
    }
    out.push_str("]}");
}

/// A JSON string (RFC 8259): quotes, backslashes and control characters escaped; `<` too,
/// so no text can close a script element if the JSON is ever inlined.
fn string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 || c == '<' || c == '\u{2028}' || c == '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::table::ColType;

    #[test]
    fn strings_are_escaped() {
        let mut out = String::new();
        string(&mut out, "a\"b\\c\nd\u{1}</script>é");
        assert_eq!(out, r#""a\"b\\c\nd\u0001\u003c/script>é""#);
    }

    #[test]
    fn a_table_is_columns_and_rows() {
        let mut t = Table::new(&[("name", ColType::Text), ("n", ColType::Int)]);
        t.push(vec!["x".into(), 7i64.into()]);
        t.push(vec![Cell::Null, (-1i64).into()]);
        let mut out = String::new();
        table(&mut out, &t);
        assert_eq!(
            out,
            r#"{"columns":["name","n"],"rows":[["x",7],[null,-1]]}"#
        );
    }

    #[test]
    fn the_json_holds_every_view_the_page_reads() {
        let dir = std::env::temp_dir();
        let ini = "[databases]\napp = host=127.0.0.1 port=5999\n[pgbouncer]\nlisten_port = 0\n";
        let cfg = crate::config::Config::from_str(ini, "pgbouncer.ini", &dir).expect("config");
        let j = json(&Shared::new(cfg));
        for (name, _) in VIEWS {
            assert!(
                j.contains(&format!("\"{name}\":{{\"columns\":[")),
                "{name}: {j}"
            );
        }
        assert!(
            j.contains("\"cl_waiting\"") && j.contains("\"query_p99_us\""),
            "{j}"
        );
        assert!(j.starts_with("{\"version\":\"") && j.ends_with("}}"), "{j}");
    }
}
