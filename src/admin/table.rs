//! A result table (column names and types, rows of cells) and its wire form:
//! RowDescription, DataRow and CommandComplete, in text or binary format per column.
use bytes::{BufMut, BytesMut};

/// PostgreSQL type OIDs the console uses.
pub const TEXT_OID: u32 = 25;
pub const INT8_OID: u32 = 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColType {
    Text,
    Int,
}

impl ColType {
    fn oid(self) -> u32 {
        match self {
            ColType::Text => TEXT_OID,
            ColType::Int => INT8_OID,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cell {
    Null,
    Text(String),
    Int(i64),
}

impl From<&str> for Cell {
    fn from(s: &str) -> Self {
        Cell::Text(s.to_string())
    }
}
impl From<String> for Cell {
    fn from(s: String) -> Self {
        Cell::Text(s)
    }
}
impl From<i64> for Cell {
    fn from(n: i64) -> Self {
        Cell::Int(n)
    }
}
impl From<u64> for Cell {
    fn from(n: u64) -> Self {
        Cell::Int(i64::try_from(n).unwrap_or(i64::MAX))
    }
}
impl From<usize> for Cell {
    fn from(n: usize) -> Self {
        Cell::Int(i64::try_from(n).unwrap_or(i64::MAX))
    }
}
impl From<u16> for Cell {
    fn from(n: u16) -> Self {
        Cell::Int(n.into())
    }
}
impl From<bool> for Cell {
    fn from(b: bool) -> Self {
        Cell::Int(b.into())
    }
}
impl<T: Into<Cell>> From<Option<T>> for Cell {
    fn from(v: Option<T>) -> Self {
        v.map(Into::into).unwrap_or(Cell::Null)
    }
}

impl Cell {
    /// The text form (None = NULL).
    pub fn text(&self) -> Option<String> {
        match self {
            Cell::Null => None,
            Cell::Text(s) => Some(s.clone()),
            Cell::Int(n) => Some(n.to_string()),
        }
    }
}

/// The result of a SHOW: columns, rows, and the CommandComplete tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub columns: Vec<(&'static str, ColType)>,
    pub rows: Vec<Vec<Cell>>,
}

/// Text (0) or binary (1) for each column, from Bind's result-format codes.
pub fn formats_for(codes: &[i16], n: usize) -> Vec<i16> {
    match codes.len() {
        0 => vec![0; n],
        1 => vec![codes[0]; n],
        _ => (0..n).map(|i| codes.get(i).copied().unwrap_or(0)).collect(),
    }
}

impl Table {
    pub fn new(columns: &[(&'static str, ColType)]) -> Table {
        Table {
            columns: columns.to_vec(),
            rows: Vec::new(),
        }
    }

    /// A table of text columns.
    pub fn text(names: &[&'static str]) -> Table {
        Table {
            columns: names.iter().map(|n| (*n, ColType::Text)).collect(),
            rows: Vec::new(),
        }
    }

    /// Append a row; it must have one cell per column.
    pub fn push(&mut self, row: Vec<Cell>) {
        debug_assert_eq!(
            row.len(),
            self.columns.len(),
            "row width of {:?}",
            self.column_names()
        );
        self.rows.push(row);
    }

    pub fn column_names(&self) -> Vec<&'static str> {
        self.columns.iter().map(|c| c.0).collect()
    }

    /// Index of a column by name.
    pub fn col(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.0 == name)
    }

    /// RowDescription with the given per-column formats.
    pub fn write_description(&self, out: &mut BytesMut, formats: &[i16]) {
        let at = begin(out, b'T');
        out.put_i16(i16::try_from(self.columns.len()).unwrap_or(i16::MAX));
        for (i, (name, ty)) in self.columns.iter().enumerate() {
            out.put_slice(name.as_bytes());
            out.put_u8(0);
            out.put_i32(0);
            out.put_i16(0);
            out.put_u32(ty.oid());
            out.put_i16(if *ty == ColType::Int { 8 } else { -1 });
            out.put_i32(-1);
            out.put_i16(formats.get(i).copied().unwrap_or(0));
        }
        finish(out, at);
    }

    /// One DataRow per row, each cell in its column's format.
    pub fn write_rows(&self, out: &mut BytesMut, formats: &[i16]) {
        for row in &self.rows {
            let at = begin(out, b'D');
            out.put_i16(i16::try_from(row.len()).unwrap_or(i16::MAX));
            for (i, cell) in row.iter().enumerate() {
                let binary = formats.get(i).copied().unwrap_or(0) == 1;
                match cell {
                    Cell::Null => out.put_i32(-1),
                    Cell::Int(n) if binary => {
                        out.put_i32(8);
                        out.put_i64(*n);
                    }
                    other => {
                        let s = other.text().unwrap_or_default();
                        out.put_i32(i32::try_from(s.len()).unwrap_or(i32::MAX));
                        out.put_slice(s.as_bytes());
                    }
                }
            }
            finish(out, at);
        }
    }

    /// The whole simple-Query answer: RowDescription, DataRows, CommandComplete "SHOW".
    pub fn write_all(&self, out: &mut BytesMut) {
        let formats = vec![0; self.columns.len()];
        self.write_description(out, &formats);
        self.write_rows(out, &formats);
        crate::proto::backend::command_complete(out, "SHOW");
    }
}

fn begin(out: &mut BytesMut, tag: u8) -> usize {
    out.put_u8(tag);
    let at = out.len();
    out.put_i32(0);
    at
}

fn finish(out: &mut BytesMut, at: usize) {
    let len = i32::try_from(out.len() - at).unwrap_or(i32::MAX);
    out[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_binary_rows() {
        let mut t = Table::new(&[("name", ColType::Text), ("n", ColType::Int)]);
        t.push(vec!["a".into(), 7i64.into()]);
        t.push(vec![Cell::Null, Cell::Null]);
        let mut out = BytesMut::new();
        t.write_all(&mut out);
        assert_eq!(out[0], b'T');
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("name\0"));
        assert!(text.contains("SHOW\0"));
        let mut bin = BytesMut::new();
        t.write_rows(&mut bin, &[0, 1]);
        // D, len, count 2, len 1 "a", len 8 + 8 bytes
        assert_eq!(&bin[7..12], &[0, 0, 0, 1, b'a']);
        assert_eq!(&bin[12..16], &[0, 0, 0, 8]);
        assert_eq!(&bin[16..24], &7i64.to_be_bytes());
    }

    #[test]
    fn result_formats_expand() {
        assert_eq!(formats_for(&[], 3), [0, 0, 0]);
        assert_eq!(formats_for(&[1], 2), [1, 1]);
        assert_eq!(formats_for(&[0, 1], 2), [0, 1]);
    }
}
