//! The `.npy` header, per NumPy's format document (`numpy/lib/format.py`, versions 1.0, 2.0 and
//! 3.0): the magic `\x93NUMPY`, a version, the header length (`u16` in 1.0, `u32` after), and a
//! Python dict literal `{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }` padded with
//! spaces and a newline so the data starts aligned. Versions 1.0 and 2.0 encode the literal as
//! Latin-1, 3.0 as UTF-8.
//!
//! The literal is parsed here rather than by a crate: it is a tiny, fully specified grammar, and
//! a parse error must name its byte offset in the file.

use crate::data::error::{DataError, Position};
use crate::data::formats::dtype::{ByteOrder, Dtype};
use std::path::Path;

const MAGIC: &[u8; 6] = b"\x93NUMPY";
/// Deeper nesting than any header NumPy writes; the limit keeps a hostile file from
/// exhausting the stack.
const MAX_DEPTH: usize = 16;

/// What a `.npy` header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub dtype: Dtype,
    pub order: ByteOrder,
    pub fortran_order: bool,
    pub shape: Vec<usize>,
    /// Where the data starts, from the start of the file.
    pub data_offset: usize,
}

/// Parses the header at the start of `bytes` (the whole file, or at least its header).
pub fn parse(bytes: &[u8], path: &Path) -> Result<Header, DataError> {
    let malformed = |at: usize, problem: String| DataError::Malformed {
        path: path.to_path_buf(),
        at: Position::Byte(at as u64),
        problem,
    };
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        let found: String = bytes.iter().take(6).map(|b| format!("{b:02x} ")).collect();
        return Err(malformed(
            0,
            format!("not a .npy file: it must start with 93 4e 55 4d 50 59 (\\x93NUMPY), found {found}"),
        ));
    }
    let (len_at, len_size) = match (bytes[6], bytes[7]) {
        (1, 0) => (8, 2),
        (2, 0) | (3, 0) => (8, 4),
        (major, minor) => {
            return Err(DataError::Unsupported {
                path: path.to_path_buf(),
                what: format!(".npy format version {major}.{minor}; trainrun reads versions 1.0, 2.0 and 3.0"),
            });
        }
    };
    let mut len_bytes = [0u8; 4];
    let len_field = bytes.get(len_at..len_at + len_size).ok_or_else(|| truncated(path, len_at + len_size, bytes))?;
    len_bytes[..len_size].copy_from_slice(len_field);
    let start = len_at + len_size;
    let end = start + u32::from_le_bytes(len_bytes) as usize;
    let raw = bytes.get(start..end).ok_or_else(|| truncated(path, end, bytes))?;
    let text: String = if bytes[6] == 3 {
        std::str::from_utf8(raw)
            .map_err(|e| malformed(start + e.valid_up_to(), "the header is not UTF-8".into()))?
            .into()
    } else {
        raw.iter().map(|&b| char::from(b)).collect()
    };
    let mut parser = Parser { text: &text, pos: 0, start };
    let dict = parser.value(0).map_err(|(at, problem)| malformed(at, problem))?;
    fields(dict, start, path, end)
}

fn truncated(path: &Path, expected: usize, bytes: &[u8]) -> DataError {
    DataError::Malformed {
        path: path.to_path_buf(),
        at: Position::Byte(bytes.len() as u64),
        problem: format!("truncated: the file ends inside its {expected}-byte header"),
    }
}

/// Picks `descr`, `fortran_order` and `shape` out of the parsed literal.
fn fields(dict: Literal, start: usize, path: &Path, data_offset: usize) -> Result<Header, DataError> {
    let malformed = |problem: String| DataError::Malformed {
        path: path.to_path_buf(),
        at: Position::Byte(start as u64),
        problem: format!("header: {problem}"),
    };
    let Literal::Dict(entries) = dict else {
        return Err(malformed("it must be a dict literal".into()));
    };
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    for (key, value) in entries {
        match (key.as_str(), value) {
            ("descr", Literal::Str(d)) => descr = Some(d),
            ("descr", Literal::List(_)) => {
                return Err(DataError::Unsupported {
                    path: path.to_path_buf(),
                    what: "structured arrays (a record dtype) are not read; save one plain array per field".into(),
                });
            }
            ("fortran_order", Literal::Bool(f)) => fortran = Some(f),
            ("shape", Literal::Tuple(dims)) => {
                let dims: Option<Vec<usize>> = dims
                    .into_iter()
                    .map(|d| if let Literal::Int(n) = d { usize::try_from(n).ok() } else { None })
                    .collect();
                shape = Some(dims.ok_or_else(|| malformed("`shape` must be a tuple of non-negative integers".into()))?);
            }
            (key, value) => return Err(malformed(format!("unexpected entry '{key}': {value:?}"))),
        }
    }
    let (Some(descr), Some(fortran_order), Some(shape)) = (descr, fortran, shape) else {
        return Err(malformed("it needs the keys 'descr', 'fortran_order' and 'shape'".into()));
    };
    let (dtype, order) = parse_descr(&descr).ok_or_else(|| DataError::Unsupported {
        path: path.to_path_buf(),
        what: format!("dtype '{descr}' is not read{}", descr_hint(&descr)),
    })?;
    Ok(Header { dtype, order, fortran_order, shape, data_offset })
}

/// `'<f4'` → (`float32`, little-endian). `|` (not applicable) and `=` (native) are little-endian
/// on every machine trainrun runs on.
fn parse_descr(descr: &str) -> Option<(Dtype, ByteOrder)> {
    let mut chars = descr.chars();
    let order = match chars.next()? {
        '<' | '|' | '=' => ByteOrder::Little,
        '>' => ByteOrder::Big,
        _ => return None,
    };
    let kind = chars.next()?;
    let size: usize = chars.as_str().parse().ok()?;
    Some((Dtype::from_numpy(kind, size)?, order))
}

fn descr_hint(descr: &str) -> &'static str {
    if descr.contains('O') {
        " (object arrays hold Python objects, not numbers; save a numeric array)"
    } else {
        "; supported: uint8, int8, uint16, int16, uint32, int32, uint64, int64, float16, float32, float64"
    }
}

/// A Python literal, as far as `.npy` headers use them.
#[derive(Debug, Clone, PartialEq)]
enum Literal {
    Str(String),
    Int(u64),
    Bool(bool),
    None,
    Tuple(Vec<Literal>),
    List(Vec<Literal>),
    Dict(Vec<(String, Literal)>),
}

/// A recursive-descent parser; errors carry the byte offset in the file.
struct Parser<'t> {
    text: &'t str,
    pos: usize,
    /// Offset of `text` in the file.
    start: usize,
}

type ParseResult<T> = Result<T, (usize, String)>;

impl Parser<'_> {
    fn value(&mut self, depth: usize) -> ParseResult<Literal> {
        if depth > MAX_DEPTH {
            return Err(self.error("nested too deeply"));
        }
        self.skip_space();
        let rest = &self.text[self.pos..];
        match rest.chars().next() {
            Some('{') => self.dict(depth),
            Some('(') => self.sequence(')', depth).map(Literal::Tuple),
            Some('[') => self.sequence(']', depth).map(Literal::List),
            Some(q @ ('\'' | '"')) => self.string(q).map(Literal::Str),
            Some(c) if c.is_ascii_digit() => self.int(),
            Some(_) if rest.starts_with("True") => self.word("True", Literal::Bool(true)),
            Some(_) if rest.starts_with("False") => self.word("False", Literal::Bool(false)),
            Some(_) if rest.starts_with("None") => self.word("None", Literal::None),
            Some(c) => Err(self.error(&format!("unexpected {c:?} in the header"))),
            None => Err(self.error("the header ends early")),
        }
    }

    fn dict(&mut self, depth: usize) -> ParseResult<Literal> {
        self.pos += 1;
        let mut entries = vec![];
        loop {
            self.skip_space();
            if self.eat('}') {
                return Ok(Literal::Dict(entries));
            }
            let Literal::Str(key) = self.value(depth + 1)? else {
                return Err(self.error("dict keys must be strings"));
            };
            self.skip_space();
            if !self.eat(':') {
                return Err(self.error("expected ':'"));
            }
            entries.push((key, self.value(depth + 1)?));
            self.after_item('}')?;
        }
    }

    fn sequence(&mut self, close: char, depth: usize) -> ParseResult<Vec<Literal>> {
        self.pos += 1;
        let mut items = vec![];
        loop {
            self.skip_space();
            if self.eat(close) {
                return Ok(items);
            }
            items.push(self.value(depth + 1)?);
            self.after_item(close)?;
        }
    }

    /// After an item: a comma, or the closing bracket (left for the caller to eat).
    fn after_item(&mut self, close: char) -> ParseResult<()> {
        self.skip_space();
        if self.eat(',') || self.text[self.pos..].starts_with(close) {
            Ok(())
        } else {
            Err(self.error(&format!("expected ',' or '{close}'")))
        }
    }

    fn string(&mut self, quote: char) -> ParseResult<String> {
        self.pos += 1;
        let mut out = String::new();
        let mut chars = self.text[self.pos..].char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, escaped)) => out.push(escaped),
                    None => break,
                },
                c if c == quote => {
                    self.pos += i + 1;
                    return Ok(out);
                }
                c => out.push(c),
            }
        }
        Err(self.error("unterminated string"))
    }

    fn int(&mut self) -> ParseResult<Literal> {
        let digits = self.text[self.pos..].bytes().take_while(u8::is_ascii_digit).count();
        let n = self.text[self.pos..self.pos + digits].parse().map_err(|_| self.error("integer too large"))?;
        self.pos += digits;
        // Python 2 wrote longs with an `L` suffix: `(3L, 4L)`.
        self.eat('L');
        Ok(Literal::Int(n))
    }

    fn word(&mut self, word: &str, literal: Literal) -> ParseResult<Literal> {
        self.pos += word.len();
        Ok(literal)
    }

    fn eat(&mut self, c: char) -> bool {
        let found = self.text[self.pos..].starts_with(c);
        if found {
            self.pos += c.len_utf8();
        }
        found
    }

    fn skip_space(&mut self) {
        let rest = &self.text[self.pos..];
        self.pos += rest.len() - rest.trim_start().len();
    }

    fn error(&self, problem: &str) -> (usize, String) {
        // Latin-1 headers map one byte to one char, so this is exact for them; for UTF-8 it
        // is the byte offset too, as `pos` counts bytes of `text`.
        (self.start + self.pos, format!("header: {problem}"))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::npy_header;
    use super::*;

    fn parse_ok(bytes: &[u8]) -> Header {
        parse(bytes, Path::new("x.npy")).unwrap()
    }

    fn parse_err(bytes: &[u8]) -> String {
        parse(bytes, Path::new("x.npy")).unwrap_err().to_string()
    }

    #[test]
    fn reads_all_three_versions() {
        for major in [1, 2, 3] {
            let bytes = npy_header(major, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }");
            let h = parse_ok(&bytes);
            assert_eq!(h.dtype, Dtype::F32);
            assert_eq!(h.order, ByteOrder::Little);
            assert!(!h.fortran_order);
            assert_eq!(h.shape, [3, 4]);
            assert_eq!(h.data_offset, bytes.len());
            assert_eq!(h.data_offset % 64, 0);
        }
    }

    #[test]
    fn reads_scalars_one_dim_python2_longs_and_big_endian() {
        assert_eq!(parse_ok(&npy_header(1, "{'descr': '|u1', 'fortran_order': False, 'shape': ()}")).shape, [0; 0]);
        assert_eq!(parse_ok(&npy_header(1, "{'descr': '<i8', 'fortran_order': False, 'shape': (5,), }")).shape, [5]);
        let h = parse_ok(&npy_header(1, "{'descr': '>f8', 'fortran_order': True, 'shape': (2L, 3L), }"));
        assert_eq!((h.dtype, h.order, h.fortran_order, h.shape), (Dtype::F64, ByteOrder::Big, true, vec![2, 3]));
        let h = parse_ok(&npy_header(3, "{\"descr\": \"<f2\", \"fortran_order\": False, \"shape\": (1, 2)}"));
        assert_eq!(h.dtype, Dtype::F16);
    }

    #[test]
    fn refusals_name_the_problem_and_the_byte() {
        assert_eq!(
            parse_err(b"PK\x03\x04 not npy at all"),
            "x.npy at byte 0: not a .npy file: it must start with 93 4e 55 4d 50 59 (\\x93NUMPY), \
             found 50 4b 03 04 20 6e "
        );
        let mut v4 = npy_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }");
        v4[6] = 4;
        assert_eq!(parse_err(&v4), "x.npy: .npy format version 4.0; trainrun reads versions 1.0, 2.0 and 3.0");
        let object = npy_header(1, "{'descr': '|O', 'fortran_order': False, 'shape': (3,), }");
        assert!(parse_err(&object).contains("dtype '|O' is not read (object arrays hold Python objects"));
        let complex = npy_header(1, "{'descr': '<c8', 'fortran_order': False, 'shape': (3,), }");
        assert!(parse_err(&complex).contains("dtype '<c8' is not read; supported: uint8"));
        let record = npy_header(1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3,), }");
        assert!(parse_err(&record).contains("structured arrays"));
        let broken = npy_header(1, "{'descr': '<f4', 'fortran_order': False 'shape': (3,), }");
        assert_eq!(parse_err(&broken), "x.npy at byte 50: header: expected ',' or '}'");
        let missing = npy_header(1, "{'descr': '<f4', 'shape': (3,), }");
        assert!(parse_err(&missing).contains("needs the keys 'descr', 'fortran_order' and 'shape'"));
        let negative = npy_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-3,), }");
        assert!(parse_err(&negative).contains("unexpected '-'"), "{}", parse_err(&negative));
        let full = npy_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }");
        assert_eq!(parse_err(&full[..30]), "x.npy at byte 30: truncated: the file ends inside its 128-byte header");
        let deep = npy_header(1, &format!("{}{}", "[".repeat(40), "]".repeat(40)));
        assert!(parse_err(&deep).contains("nested too deeply"));
    }
}
