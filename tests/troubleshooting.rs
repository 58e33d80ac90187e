//! The Troubleshooting chapter (docs/troubleshooting.md) covers every message pgcarpool
//! emits: this test reads src/ with `syn`, collects the message texts, and fails naming
//! each one the chapter lacks (file, line, and the exact text to add).
//!
//! A message is, in code outside `#[cfg(test)]`:
//! - the text of a `tracing` event at level `info`, `warn` or `error` (debug and trace are
//!   for developers);
//! - an `#[error("…")]` text of a `thiserror` enum;
//! - the argument after a SQLSTATE literal (`"08P01"`, `"53400"`…) in any call: what a
//!   client reads in an ErrorResponse or NoticeResponse;
//! - the text of `Err(…)`, `anyhow!`, `bail!`, `.context(…)`/`.with_context(…)`: errors of
//!   the configuration and of startup;
//! - a reason given to `kill_with`, `close_because`, `close_idle` or `refuse`, or held by
//!   a function whose name ends in `reason` (`close_reason`): the `closing because: …` of
//!   the log;
//! - the text given to a function whose name ends in `err` (`entry_err`), to `map_err` or
//!   `ok_or_else`, or to a field `msg`, `message` or `reason`.
//!
//! A text is a string literal or the template of a `format!` (also behind `.into()`,
//! `.to_string()`, `String::from`, `&`, a closure). Placeholders (`{e}`, `{:?}`) become `…`
//! and the chapter must contain the result verbatim (in a code span; `\|` counts as `|`).
//! Texts with fewer than four letters outside placeholders (`{0}`, `{message}`), and lone
//! words without `_` (a key named in an error), say nothing by themselves and are skipped.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use syn::visit::{self, Visit};
use syn::{Attribute, Expr, Lit};

/// Message text (placeholders as `…`) → where it is emitted (first place found).
type Messages = BTreeMap<String, String>;

const LEVELS: &[&str] = &["info", "warn", "error"];
const REASON_FNS: &[&str] = &["kill_with", "close_because", "close_idle", "refuse"];
const ERROR_FNS: &[&str] = &["Err", "context", "with_context", "map_err", "ok_or_else"];
const ERROR_MACROS: &[&str] = &["anyhow", "bail"];

struct Finder<'a> {
    file: &'a str,
    found: &'a mut Messages,
    /// Inside a function that names a reason (`close_reason`, `kill_reason`…): every
    /// string literal it holds is one.
    in_reason_fn: bool,
}

impl Finder<'_> {
    fn add(&mut self, template: &str, line: usize) {
        let text = normalise(template);
        // `{0}` says nothing by itself, nor does a lone word (`"port"`, a key named in an
        // error); a setting's name (`query_wait_timeout`) is a message.
        let one_word = !text.contains(' ') && !text.contains('_');
        if one_word || text.chars().filter(|c| c.is_alphabetic()).count() < 4 {
            return;
        }
        self.found
            .entry(text)
            .or_insert_with(|| format!("{}:{line}", self.file));
    }

    /// The message an argument carries, if it is a literal or a `format!` of one.
    fn message_arg(&mut self, e: &Expr) {
        if let Some((text, line)) = literal_of(e) {
            self.add(&text, line);
        }
    }
}

fn is_test_cfg(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<proc_macro2::TokenStream>()
                .is_ok_and(|t| t.to_string().split_whitespace().any(|w| w == "test"))
    })
}

/// A string literal, or the template of `format!(…)`, through `.into()`, `&`, closures…
fn literal_of(e: &Expr) -> Option<(String, usize)> {
    match e {
        Expr::Lit(l) => match &l.lit {
            Lit::Str(s) => Some((s.value(), s.span().start().line)),
            _ => None,
        },
        Expr::Macro(m) if m.mac.path.is_ident("format") => first_literal(&m.mac.tokens),
        Expr::MethodCall(m)
            if ["into", "to_string", "to_owned", "into_boxed_str"]
                .contains(&m.method.to_string().as_str()) =>
        {
            literal_of(&m.receiver)
        }
        Expr::Call(c) if c.args.len() == 1 && path_tail(&c.func).is_some_and(|f| f == "from") => {
            literal_of(&c.args[0])
        }
        Expr::Reference(r) => literal_of(&r.expr),
        Expr::Paren(p) => literal_of(&p.expr),
        Expr::Group(g) => literal_of(&g.expr),
        Expr::Closure(c) => literal_of(&c.body),
        _ => None,
    }
}

/// The first string literal at the top level of a macro's tokens that is not a field's
/// value (`name = "x"`): a tracing event's message, a `format!`'s template.
fn first_literal(tokens: &proc_macro2::TokenStream) -> Option<(String, usize)> {
    let mut after_eq = false;
    for t in tokens.clone() {
        match t {
            proc_macro2::TokenTree::Literal(l) if !after_eq => {
                if let Ok(Lit::Str(s)) = syn::parse_str::<Lit>(&l.to_string()) {
                    return Some((s.value(), l.span().start().line));
                }
            }
            proc_macro2::TokenTree::Punct(p) if p.as_char() == '=' => after_eq = true,
            proc_macro2::TokenTree::Punct(p) if p.as_char() == ',' => after_eq = false,
            _ => {}
        }
    }
    None
}

fn path_tail(e: &Expr) -> Option<String> {
    match e {
        Expr::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
        _ => None,
    }
}

fn is_sqlstate(e: &Expr) -> bool {
    matches!(e, Expr::Lit(l) if matches!(&l.lit, Lit::Str(s) if {
        let v = s.value();
        v.len() == 5
            && v.bytes().all(|b| b.is_ascii_digit() || b.is_ascii_uppercase())
            && v.as_bytes()[0].is_ascii_digit()
    }))
}

impl Finder<'_> {
    fn call_args<'e>(&mut self, name: Option<String>, args: impl Iterator<Item = &'e Expr>) {
        let args: Vec<&Expr> = args.collect();
        let name = name.unwrap_or_default();
        if REASON_FNS.contains(&name.as_str())
            || ERROR_FNS.contains(&name.as_str())
            || name.ends_with("err")
        {
            for a in &args {
                self.message_arg(a);
            }
        }
        for w in args.windows(2) {
            if is_sqlstate(w[0]) {
                self.message_arg(w[1]);
            }
        }
    }
}

impl<'ast> Visit<'ast> for Finder<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test_cfg(&m.attrs) {
            visit::visit_item_mod(self, m);
        }
    }
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !is_test_cfg(&f.attrs) {
            let was = self.in_reason_fn;
            self.in_reason_fn = f.sig.ident.to_string().ends_with("reason");
            visit::visit_item_fn(self, f);
            self.in_reason_fn = was;
        }
    }
    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test_cfg(&f.attrs) {
            let was = self.in_reason_fn;
            self.in_reason_fn = f.sig.ident.to_string().ends_with("reason");
            visit::visit_impl_item_fn(self, f);
            self.in_reason_fn = was;
        }
    }
    fn visit_expr_lit(&mut self, l: &'ast syn::ExprLit) {
        if self.in_reason_fn
            && let Lit::Str(s) = &l.lit
        {
            self.add(&s.value(), s.span().start().line);
        }
    }
    fn visit_field_value(&mut self, f: &'ast syn::FieldValue) {
        if let syn::Member::Named(n) = &f.member
            && ["msg", "message", "reason"].contains(&n.to_string().as_str())
        {
            self.message_arg(&f.expr);
        }
        visit::visit_field_value(self, f);
    }
    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if !is_test_cfg(&i.attrs) {
            visit::visit_item_impl(self, i);
        }
    }
    fn visit_attribute(&mut self, a: &'ast Attribute) {
        if a.path().is_ident("error")
            && let Ok(s) = a.parse_args::<syn::LitStr>()
        {
            self.add(&s.value(), s.span().start().line);
        }
    }
    fn visit_expr_call(&mut self, c: &'ast syn::ExprCall) {
        self.call_args(path_tail(&c.func), c.args.iter());
        visit::visit_expr_call(self, c);
    }
    fn visit_expr_method_call(&mut self, m: &'ast syn::ExprMethodCall) {
        self.call_args(Some(m.method.to_string()), m.args.iter());
        visit::visit_expr_method_call(self, m);
    }
    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        let name = m.path.segments.last().map(|s| s.ident.to_string());
        let name = name.as_deref().unwrap_or("");
        if LEVELS.contains(&name) || ERROR_MACROS.contains(&name) {
            if let Some((text, line)) = first_literal(&m.tokens) {
                self.add(&text, line);
            }
        } else if let Ok(args) =
            m.parse_body_with(syn::punctuated::Punctuated::<Expr, syn::Token![,]>::parse_terminated)
        {
            // Calls inside other macros (`matches!`, `vec!`, `format!` arguments…).
            for a in &args {
                self.visit_expr(a);
            }
        }
        visit::visit_macro(self, m);
    }
}

/// `{…}` placeholders as `…`, `{{`/`}}` as braces, whitespace runs as one space.
fn normalise(template: &str) -> String {
    let mut out = String::new();
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                out.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                out.push('}');
            }
            '{' => {
                for c in chars.by_ref() {
                    if c == '}' {
                        break;
                    }
                }
                out.push('…');
            }
            _ => out.push(c),
        }
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every message of src/ (test modules in their own files, `tests.rs`, are skipped: the
/// parent declares them `#[cfg(test)] mod tests;`).
fn messages() -> Messages {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    files.sort();
    let mut found = Messages::new();
    for path in files {
        if path
            .file_name()
            .is_some_and(|n| n == "tests.rs" || n == "fuzz.rs")
        {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let file = path.strip_prefix(root).unwrap().display().to_string();
        Finder {
            file: &file,
            found: &mut found,
            in_reason_fn: false,
        }
        .visit_file(&ast);
    }
    found
}

#[test]
fn the_troubleshooting_chapter_covers_every_message() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(root.join("docs/troubleshooting.md"))
        .unwrap()
        .replace("\\|", "|");
    let page = page.split_whitespace().collect::<Vec<_>>().join(" ");
    let found = messages();
    let missing: Vec<String> = found
        .iter()
        .filter(|(text, _)| !page.contains(text.as_str()))
        .map(|(text, at)| format!("  {at}: `{text}`"))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/troubleshooting.md lacks {} of the {} messages pgcarpool emits. Add a row for \
         each (the text exactly as below, placeholders as …; its cause; the fix) to the \
         chapter's table for its area:\n{}",
        missing.len(),
        found.len(),
        missing.join("\n")
    );
}

#[test]
fn messages_are_found_in_each_form() {
    let found = messages();
    for want in [
        // tracing at warn, with fields before the message.
        "no more connections allowed (max_client_conn)",
        // #[error] of a thiserror enum.
        "server login has been failing, cached error: … (server_login_retry)",
        // after a SQLSTATE, through format!.
        "too many session settings: client_max_settings is …",
        // a reason a client is let go for.
        "admin forced disconnect",
        // a reason held by a function that names one.
        "server DNS lookup failed",
        // a field `msg` of an error value.
        "cannot read auth_file: …",
    ] {
        assert!(found.contains_key(want), "{want:?} not found");
    }
    assert!(!found.keys().any(|k| k.contains('{')), "placeholders left");
}
