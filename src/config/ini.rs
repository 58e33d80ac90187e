//! pgbouncer.ini syntax: sections, `key = value`, `;`/`#` comments at line start, `%include`.
//!
//! Pure: files are read through a caller-supplied function, so tests run on text.
//! A value is the rest of the line after `=`, trimmed (PgBouncer does not unquote it);
//! a key is a bare word (`[A-Za-z0-9_.*-]`) or a double-quoted name with `""` for `"`.
use std::io;
use std::path::{Component, Path, PathBuf};

/// Deepest `%include` nesting accepted.
pub const MAX_INCLUDE_DEPTH: usize = 10;
/// Largest ini file read (bytes).
pub const MAX_FILE_LEN: usize = 8 << 20;

/// One `key = value` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// The file it came from (as named by the includer, or the top-level name).
    pub file: String,
    /// 1-based line number.
    pub line: usize,
    /// The section it is in, lower case.
    pub section: String,
    /// The key; lower case in `[pgbouncer]`, as written (unquoted) elsewhere.
    pub key: String,
    /// The value, trimmed.
    pub value: String,
}

/// A `[section]` header line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SectionHeader {
    pub file: String,
    pub line: usize,
    /// Lower case.
    pub name: String,
}

/// A parsed ini file with its includes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ini {
    /// Every `key = value` line, in file order (includes expanded in place).
    pub items: Vec<Item>,
    /// Every section header, in file order.
    pub sections: Vec<SectionHeader>,
}

/// An ini syntax or include error.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IniError {
    #[error("{file}:{line}: {msg}")]
    Syntax {
        file: String,
        line: usize,
        msg: String,
    },
    #[error("{file}: {msg}")]
    File { file: String, msg: String },
}

/// Reads a file's text (the real file system, or a map in tests).
pub type ReadFn<'a> = dyn FnMut(&Path) -> io::Result<String> + 'a;

/// Read a file from disk, bounded by [`MAX_FILE_LEN`].
pub fn read_bounded(path: &Path, max: usize) -> io::Result<String> {
    use std::io::Read;
    let f = std::fs::File::open(path)?;
    let mut buf = Vec::new();
    f.take(max as u64 + 1).read_to_end(&mut buf)?;
    if buf.len() > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("file larger than {max} bytes"),
        ));
    }
    String::from_utf8(buf).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8"))
}

/// Parse the file at `path` and its includes from disk.
pub fn parse_file(path: &Path) -> Result<Ini, IniError> {
    let name = path.display().to_string();
    let text = read_bounded(path, MAX_FILE_LEN).map_err(|e| IniError::File {
        file: name.clone(),
        msg: format!("cannot read: {e}"),
    })?;
    let base = path.parent().unwrap_or(Path::new("."));
    parse_str(&text, &name, base, &mut |p| read_bounded(p, MAX_FILE_LEN))
}

/// Parse `text` (named `name`); `%include` paths resolve against `base_dir` and are read with `read`.
pub fn parse_str(
    text: &str,
    name: &str,
    base_dir: &Path,
    read: &mut ReadFn<'_>,
) -> Result<Ini, IniError> {
    let mut p = Parser {
        read,
        ini: Ini::default(),
        section: None,
        stack: vec![normalize(
            &base_dir.join(Path::new(name).file_name().unwrap_or(name.as_ref())),
        )],
    };
    p.text(text, name, base_dir)?;
    Ok(p.ini)
}

struct Parser<'r, 'a> {
    read: &'r mut ReadFn<'a>,
    ini: Ini,
    /// The current section carries into and out of included files, as in PgBouncer.
    section: Option<String>,
    /// Files being read, outermost first (for loop detection).
    stack: Vec<PathBuf>,
}

impl Parser<'_, '_> {
    fn text(&mut self, text: &str, name: &str, base_dir: &Path) -> Result<(), IniError> {
        let err = |line: usize, msg: String| IniError::Syntax {
            file: name.to_string(),
            line,
            msg,
        };
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        for (i, raw) in text.lines().enumerate() {
            let line_no = i + 1;
            let line = raw.trim();
            if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
                continue;
            }
            if let Some(rest) = line.strip_prefix('%') {
                let (directive, arg) = rest
                    .split_once(|c: char| c.is_ascii_whitespace())
                    .unwrap_or((rest, ""));
                if directive != "include" {
                    return Err(err(line_no, format!("unknown directive %{directive}")));
                }
                let arg = arg.trim();
                if arg.is_empty() {
                    return Err(err(line_no, "%include needs a file name".into()));
                }
                self.include(arg, base_dir, name, line_no)?;
                continue;
            }
            if let Some(rest) = line.strip_prefix('[') {
                let sect = rest
                    .strip_suffix(']')
                    .ok_or_else(|| err(line_no, "section header without closing ]".into()))?
                    .trim();
                if sect.is_empty() {
                    return Err(err(line_no, "empty section name".into()));
                }
                self.section = Some(sect.to_ascii_lowercase());
                self.ini.sections.push(SectionHeader {
                    file: name.to_string(),
                    line: line_no,
                    name: sect.to_ascii_lowercase(),
                });
                continue;
            }
            let (key, value) = split_key_value(line).map_err(|m| err(line_no, m))?;
            let Some(section) = self.section.clone() else {
                return Err(err(
                    line_no,
                    format!("{key}: setting outside of any section"),
                ));
            };
            let key = if section == "pgbouncer" {
                key.to_ascii_lowercase()
            } else {
                key
            };
            self.ini.items.push(Item {
                file: name.to_string(),
                line: line_no,
                section,
                key,
                value: value.to_string(),
            });
        }
        Ok(())
    }

    fn include(
        &mut self,
        arg: &str,
        base_dir: &Path,
        from: &str,
        line: usize,
    ) -> Result<(), IniError> {
        let err = |msg: String| IniError::Syntax {
            file: from.to_string(),
            line,
            msg,
        };
        if self.stack.len() > MAX_INCLUDE_DEPTH {
            return Err(err(format!(
                "%include {arg}: nested deeper than {MAX_INCLUDE_DEPTH} levels"
            )));
        }
        let path = normalize(&base_dir.join(arg));
        if self.stack.contains(&path) {
            return Err(err(format!("%include {arg}: include loop")));
        }
        let text =
            (self.read)(&path).map_err(|e| err(format!("%include {arg}: cannot read: {e}")))?;
        if text.len() > MAX_FILE_LEN {
            return Err(err(format!(
                "%include {arg}: file larger than {MAX_FILE_LEN} bytes"
            )));
        }
        let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        let name = path.display().to_string();
        self.stack.push(path);
        let r = self.text(&text, &name, &dir);
        self.stack.pop();
        r
    }
}

/// Lexical normalization (`.` and `..` removed) so the same file is recognised in loops.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            c => out.push(c.as_os_str()),
        }
    }
    out
}

/// `key = value`: a bare key (`[A-Za-z0-9_.*-]+`) or a `"quoted"` key with `""` escapes.
fn split_key_value(line: &str) -> Result<(String, &str), String> {
    let (key, rest) = if let Some(q) = line.strip_prefix('"') {
        let mut key = String::new();
        let mut chars = q.char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            if c == '"' {
                if q[i + 1..].starts_with('"') {
                    key.push('"');
                    chars.next();
                } else {
                    end = Some(i + 1);
                    break;
                }
            } else {
                key.push(c);
            }
        }
        let end = end.ok_or_else(|| "unterminated quoted name".to_string())?;
        (key, &q[end..])
    } else {
        let end = line
            .find(|c: char| !(c.is_ascii_alphanumeric() || "_.-*".contains(c)))
            .unwrap_or(line.len());
        (line[..end].to_string(), &line[end..])
    };
    if key.is_empty() {
        return Err("expected key = value".into());
    }
    let value = rest
        .trim_start()
        .strip_prefix('=')
        .ok_or_else(|| format!("{key}: expected '=' after the key"))?;
    Ok((key, value.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse_with(text: &str, files: &[(&str, &str)]) -> Result<Vec<Item>, IniError> {
        let files: HashMap<PathBuf, String> = files
            .iter()
            .map(|(p, t)| (PathBuf::from(p), t.to_string()))
            .collect();
        parse_str(text, "main.ini", Path::new("/etc/pgb"), &mut |p: &Path| {
            files
                .get(p)
                .cloned()
                .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such file"))
        })
        .map(|ini| ini.items)
    }

    fn kv(items: &[Item]) -> Vec<(String, String, String, usize)> {
        items
            .iter()
            .map(|i| (i.section.clone(), i.key.clone(), i.value.clone(), i.line))
            .collect()
    }

    #[test]
    fn sections_keys_comments() {
        let text = "; comment\n# also\n\n[PgBouncer]\nListen_Port = 6433\n  pool_mode=transaction  \n\
                    admin_users = a ; not a comment\n[databases]\nFooDb = host=x  # kept\n\"my \"\"db\"\"\" = host=y\n* =\n";
        let items = parse_with(text, &[]).unwrap();
        let s = |a: &str| a.to_string();
        assert_eq!(
            kv(&items),
            vec![
                (s("pgbouncer"), s("listen_port"), s("6433"), 5),
                (s("pgbouncer"), s("pool_mode"), s("transaction"), 6),
                (s("pgbouncer"), s("admin_users"), s("a ; not a comment"), 7),
                (s("databases"), s("FooDb"), s("host=x  # kept"), 9),
                (s("databases"), s("my \"db\""), s("host=y"), 10),
                (s("databases"), s("*"), s(""), 11),
            ]
        );
        assert_eq!(items[0].file, "main.ini");
    }

    #[test]
    fn bom_and_crlf() {
        let items = parse_with("\u{feff}[pgbouncer]\r\nlisten_port = 1\r\n", &[]).unwrap();
        assert_eq!(
            kv(&items),
            vec![("pgbouncer".into(), "listen_port".into(), "1".into(), 2)]
        );
    }

    #[test]
    fn syntax_errors_name_file_and_line() {
        let cases = [
            (
                "[pgbouncer\n",
                "main.ini:1: section header without closing ]",
            ),
            ("[]\n", "main.ini:1: empty section name"),
            (
                "listen_port = 1\n",
                "main.ini:1: listen_port: setting outside of any section",
            ),
            (
                "[pgbouncer]\n\nlisten_port 1\n",
                "main.ini:3: listen_port: expected '=' after the key",
            ),
            ("[pgbouncer]\n= 1\n", "main.ini:2: expected key = value"),
            (
                "[databases]\n\"abc = x\n",
                "main.ini:2: unterminated quoted name",
            ),
            ("%define x\n", "main.ini:1: unknown directive %define"),
            ("%include\n", "main.ini:1: %include needs a file name"),
        ];
        for (text, want) in cases {
            assert_eq!(
                parse_with(text, &[]).unwrap_err().to_string(),
                want,
                "{text:?}"
            );
        }
    }

    #[test]
    fn include_relative_to_including_file() {
        let items = parse_with(
            "[pgbouncer]\n%include conf.d/a.ini\nlisten_port = 1\n",
            &[
                (
                    "/etc/pgb/conf.d/a.ini",
                    "pool_mode = session\n%include ../b.ini\n",
                ),
                ("/etc/pgb/b.ini", "[databases]\nx = host=h\n"),
            ],
        )
        .unwrap();
        let s = |a: &str| a.to_string();
        assert_eq!(
            kv(&items),
            vec![
                (s("pgbouncer"), s("pool_mode"), s("session"), 1),
                (s("databases"), s("x"), s("host=h"), 2),
                // The section set in an included file carries on, as in PgBouncer.
                (s("databases"), s("listen_port"), s("1"), 3),
            ]
        );
        assert_eq!(items[0].file, "/etc/pgb/conf.d/a.ini");
        assert_eq!(items[1].file, "/etc/pgb/b.ini");
    }

    #[test]
    fn include_errors() {
        let e = parse_with("%include missing.ini\n", &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("main.ini:1: %include missing.ini: cannot read:"),
            "{e}"
        );
        let e = parse_with(
            "%include a.ini\n",
            &[("/etc/pgb/a.ini", "\n%include ./main.ini\n")],
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "/etc/pgb/a.ini:2: %include ./main.ini: include loop"
        );
        let e = parse_with(
            "%include self.ini\n",
            &[("/etc/pgb/self.ini", "%include self.ini\n")],
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "/etc/pgb/self.ini:1: %include self.ini: include loop"
        );
    }

    #[test]
    fn include_depth_is_bounded() {
        let files: Vec<(String, String)> = (0..20)
            .map(|i| {
                (
                    format!("/etc/pgb/{i}.ini"),
                    format!("%include {}.ini\n", i + 1),
                )
            })
            .collect();
        let refs: Vec<(&str, &str)> = files
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        let e = parse_with("%include 0.ini\n", &refs)
            .unwrap_err()
            .to_string();
        assert!(e.contains("nested deeper than 10 levels"), "{e}");
    }

    /// `main.ini` including 0.ini, which includes 1.ini, … `n - 1`.ini, which sets a key.
    fn include_chain(n: usize) -> Result<Vec<Item>, IniError> {
        let files: Vec<(String, String)> = (0..n)
            .map(|i| {
                let text = if i + 1 == n {
                    "[pgbouncer]\nlisten_port = 7000\n".to_string()
                } else {
                    format!("%include {}.ini\n", i + 1)
                };
                (format!("/etc/pgb/{i}.ini"), text)
            })
            .collect();
        let refs: Vec<(&str, &str)> = files
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        parse_with("%include 0.ini\n", &refs)
    }

    #[test]
    fn includes_nested_exactly_to_the_limit_are_read() {
        let items = include_chain(MAX_INCLUDE_DEPTH).unwrap();
        assert_eq!(items[0].value, "7000");
        let e = include_chain(MAX_INCLUDE_DEPTH + 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("nested deeper than 10 levels"), "{e}");
    }

    #[test]
    fn an_included_file_of_exactly_the_limit_is_read() {
        let mut big = "[pgbouncer]\nlisten_port = 7000\n".to_string();
        big.push_str(&" ".repeat(MAX_FILE_LEN - big.len()));
        let items = parse_with("%include big.ini\n", &[("/etc/pgb/big.ini", &big)]).unwrap();
        assert_eq!(items[0].value, "7000");
        big.push(' ');
        let e = parse_with("%include big.ini\n", &[("/etc/pgb/big.ini", &big)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("file larger than"), "{e}");
    }

    #[test]
    fn read_bounded_reads_exactly_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, "abcd").unwrap();
        assert_eq!(read_bounded(&p, 4).unwrap(), "abcd");
        assert_eq!(read_bounded(&p, 5).unwrap(), "abcd");
        let e = read_bounded(&p, 3).unwrap_err();
        assert_eq!(e.to_string(), "file larger than 3 bytes");
    }

    #[test]
    fn include_from_disk() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("main.ini"),
            "[pgbouncer]\n%include inc.ini\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("inc.ini"), "listen_port = 7000\n").unwrap();
        let ini = parse_file(&dir.path().join("main.ini")).unwrap();
        assert_eq!(ini.sections.len(), 1);
        let items = ini.items;
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].value, "7000");
        let e = parse_file(&dir.path().join("nope.ini"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("nope.ini: cannot read"), "{e}");
    }
}
