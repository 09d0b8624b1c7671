//! Spec files: reading one, following its `extends` chain, and turning TOML into the values
//! figment merges.

use super::origins::{LayerKind, Origins, SpecLayer};
use super::render::{Finding, Place};
use figment::value::{Dict, Num, Tag, Value};
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Component, Path, PathBuf};
use toml::de::{DeTable, DeValue};

/// One file of the chain, as read.
#[derive(Debug, Clone)]
pub(crate) struct SpecFile {
    /// The path as shown to the user: as given for the top file, joined onto the extending
    /// file's folder for bases.
    pub path: PathBuf,
    /// The text of the file.
    pub source: String,
}

impl SpecFile {
    /// The layer of this file for [`Origins`].
    pub fn layer(&self) -> SpecLayer {
        SpecLayer { name: self.path.display().to_string(), kind: LayerKind::File { source: self.source.clone() } }
    }
}

/// Why the chain could not be read: the files read so far (top first) and what went wrong in
/// them, located by index into those files.
#[derive(Debug)]
pub(crate) struct ChainError {
    pub files: Vec<SpecFile>,
    pub problems: Vec<(usize, Option<Range<usize>>, Finding)>,
}

impl ChainError {
    /// The problems as findings placed in an [`Origins`] holding the files read, lowest first.
    pub fn into_findings(self) -> (Origins, Vec<Finding>) {
        let count = self.files.len();
        let origins = Origins::unmerged(self.files.iter().rev().map(SpecFile::layer).collect());
        let findings = self
            .problems
            .into_iter()
            .map(|(file, span, mut finding)| {
                finding.place = Place::Layer { layer: count - 1 - file, span };
                finding
            })
            .collect();
        (origins, findings)
    }
}

/// The top file failed to open: nothing to point at but the path.
#[derive(Debug)]
pub(crate) struct Unreadable {
    pub path: PathBuf,
    pub error: std::io::Error,
}

/// The largest spec file read: far beyond any real spec, and small enough that pointing
/// trainrun at the wrong file (a dataset, `/dev/zero`) fails at once instead of filling memory.
pub(crate) const MAX_SPEC_BYTES: u64 = 16 << 20;

/// Reads one spec file, refusing anything but a regular file of at most [`MAX_SPEC_BYTES`]
/// before reading it (a device or a pipe could be read forever).
pub(crate) fn read_spec(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    use std::os::unix::fs::FileTypeExt;
    let meta = std::fs::metadata(path)?;
    let kind = meta.file_type();
    let what = if kind.is_dir() {
        Some("a folder")
    } else if kind.is_char_device() || kind.is_block_device() {
        Some("a device")
    } else if kind.is_fifo() {
        Some("a pipe")
    } else if kind.is_socket() {
        Some("a socket")
    } else {
        None
    };
    if let Some(what) = what {
        return Err(std::io::Error::other(format!("it is {what}, not a spec file; name a TOML file")));
    }
    let too_large = |size: u64| {
        std::io::Error::other(format!(
            "it has {:.1} MiB, but a spec has at most {} MiB; is it the right file?",
            size as f64 / f64::from(1 << 20),
            MAX_SPEC_BYTES >> 20
        ))
    };
    if meta.len() > MAX_SPEC_BYTES {
        return Err(too_large(meta.len()));
    }
    let mut text = String::new();
    std::fs::File::open(path)?.take(MAX_SPEC_BYTES + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_SPEC_BYTES {
        return Err(too_large(text.len() as u64));
    }
    Ok(text)
}

/// Reads `top` and every file it extends, top first.
pub(crate) fn read_chain(top: &Path) -> Result<Result<Vec<SpecFile>, ChainError>, Unreadable> {
    let source = read_spec(top).map_err(|error| Unreadable { path: top.to_path_buf(), error })?;
    let mut files = vec![SpecFile { path: top.to_path_buf(), source }];
    // Canonical paths find a cycle even when two spellings name one file.
    let mut seen = vec![canonical(top)];
    loop {
        let index = files.len() - 1;
        let current = &files[index];
        let (table, errors) = DeTable::parse_recoverable(&current.source);
        if !errors.is_empty() {
            let problems = errors.iter().map(|e| (index, e.span(), syntax_finding(e, &current.source))).collect();
            return Ok(Err(ChainError { files, problems }));
        }
        let Some((_, extends)) = table.get_ref().get_key_value("extends") else {
            return Ok(Ok(files));
        };
        let span = Some(extends.span());
        let Some(name) = extends.get_ref().as_str() else {
            let finding = Finding::new(
                "extends",
                format!("`extends` must be a path string, found {}", extends.get_ref().type_str()),
            )
            .label("not a path")
            .help("write `extends = \"base.toml\"`, relative to this file");
            return Ok(Err(ChainError { files, problems: vec![(index, span, finding)] }));
        };
        let folder = current.path.parent().unwrap_or(Path::new(""));
        let next = normalize(&folder.join(name));
        let next_canonical = canonical(&next);
        if seen.contains(&next_canonical) {
            let chain: Vec<String> =
                files.iter().map(|f| f.path.display().to_string()).chain([next.display().to_string()]).collect();
            let finding = Finding::new("extends", format!("`extends` forms a cycle: {}", chain.join(" → ")))
                .label("extended again here")
                .help("remove one `extends` so that the chain ends in a file without one");
            return Ok(Err(ChainError { files, problems: vec![(index, span, finding)] }));
        }
        match read_spec(&next) {
            Ok(source) => {
                files.push(SpecFile { path: next, source });
                seen.push(next_canonical);
            }
            Err(error) => {
                let finding =
                    Finding::new("extends", format!("cannot read `{}`: {}", next.display(), io_reason(&error)))
                        .label("extended here")
                        .help(format!("`extends` is relative to the folder of `{}`", current.path.display()));
                return Ok(Err(ChainError { files, problems: vec![(index, span, finding)] }));
            }
        }
    }
}

/// A toml parse error as a finding: toml's description as the message, what it expected
/// under the caret, and a fix for the common slips.
fn syntax_finding(error: &toml::de::Error, source: &str) -> Finding {
    let message = error.message().trim().replace('\n', " ");
    let (what, expected) = message.split_once(", expected ").unwrap_or((message.as_str(), ""));
    let text = error.span().and_then(|s| source.get(s)).unwrap_or_default().trim();
    let label = match expected {
        "" | "nothing" => what.to_string(),
        expected => format!("expected {expected}"),
    };
    let finding = Finding::new("", format!("invalid TOML: {what}")).label(label);
    match what {
        "duplicate key" => Finding::new("", format!("invalid TOML: duplicate key `{text}`"))
            .label("defined a second time here")
            .help("a key or table can be written once; remove or merge the repeated one"),
        "string values must be quoted" if text.is_empty() => {
            finding.label("missing value").help("write a value after `=`")
        }
        "string values must be quoted" => finding.label("not quoted").help(format!("quote it: `\"{text}\"`")),
        _ => finding,
    }
}

/// The OS error text without the `(os error N)` suffix, which means nothing to a user.
pub fn io_reason(error: &std::io::Error) -> String {
    let text = error.to_string();
    match text.find(" (os error") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}

fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| normalize(path))
}

/// Removes `.` and `folder/..` without touching the file system, so shown paths stay as
/// short as the user wrote them.
pub(crate) fn normalize(path: &Path) -> PathBuf {
    let mut out: Vec<Component> = Vec::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir if matches!(out.last(), Some(Component::Normal(_))) => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out.iter().collect()
}

/// The values of a parsed TOML document, for figment.
pub(crate) fn table_to_dict(table: &DeTable<'_>) -> Dict {
    table.iter().map(|(k, v)| (k.get_ref().to_string(), to_value(v.get_ref()))).collect::<BTreeMap<_, _>>()
}

/// One TOML value as a figment value. figment's own `toml` feature would pull a second toml
/// crate, so the conversion lives here.
pub(crate) fn to_value(value: &DeValue<'_>) -> Value {
    match value {
        DeValue::String(s) => Value::from(s.to_string()),
        DeValue::Integer(i) => integer(i.as_str(), i.radix()),
        DeValue::Float(f) => match f.as_str().parse::<f64>() {
            Ok(x) => Value::Num(Tag::Default, Num::F64(x)),
            Err(_) => Value::from(f.to_string()),
        },
        DeValue::Boolean(b) => Value::from(*b),
        DeValue::Datetime(d) => Value::from(d.to_string()),
        DeValue::Array(items) => Value::Array(Tag::Default, items.iter().map(|v| to_value(v.get_ref())).collect()),
        DeValue::Table(t) => Value::Dict(Tag::Default, table_to_dict(t)),
    }
}

/// A TOML integer as a figment number. TOML's own range is `i64`; larger literals stay
/// numbers (up to 128 bits) so validation can say "must be at most …" about them rather than
/// calling them strings.
fn integer(digits: &str, radix: u32) -> Value {
    let num = match (i64::from_str_radix(digits, radix), u64::from_str_radix(digits, radix)) {
        (Ok(n), _) => Num::I64(n),
        (Err(_), Ok(n)) => Num::U64(n),
        (Err(_), Err(_)) => match (i128::from_str_radix(digits, radix), u128::from_str_radix(digits, radix)) {
            (Ok(n), _) => Num::I128(n),
            (Err(_), Ok(n)) => Num::U128(n),
            // Beyond 128 bits: saturate, keeping the sign; every bound rejects it.
            (Err(_), Err(_)) if digits.trim_start().starts_with('-') => Num::I128(i128::MIN),
            (Err(_), Err(_)) => Num::U128(u128::MAX),
        },
    };
    Value::Num(Tag::Default, num)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_lexically() {
        assert_eq!(normalize(Path::new("specs/sub/../base.toml")), PathBuf::from("specs/base.toml"));
        assert_eq!(normalize(Path::new("./a/./b.toml")), PathBuf::from("a/b.toml"));
        assert_eq!(normalize(Path::new("../x/../y.toml")), PathBuf::from("../y.toml"));
    }

    #[test]
    fn converts_toml_values() {
        let doc = "a = 0x10\nb = 1.5\nc = [1, \"x\"]\nd = { e = true }";
        let Ok(table) = DeTable::parse(doc) else { panic!("test document parses") };
        let dict = table_to_dict(table.get_ref());
        assert_eq!(dict["a"].to_i128(), Some(16));
        assert_eq!(dict["b"].to_f64(), Some(1.5));
        assert_eq!(dict["c"].as_array().map(|a| a.len()), Some(2));
        assert_eq!(dict["d"].find_ref("e").and_then(Value::to_bool), Some(true));
    }

    #[test]
    fn only_regular_files_of_sane_size_are_read() {
        let reason = |path: &str| read_spec(Path::new(path)).map(|_| String::new()).unwrap_or_else(|e| e.to_string());
        assert_eq!(reason("/dev/zero"), "it is a device, not a spec file; name a TOML file");
        assert!(reason("/tmp").starts_with("it is a folder"));
        let Ok(dir) = tempfile::tempdir() else { panic!("no temporary folder") };
        let big = dir.path().join("big.toml");
        let Ok(file) = std::fs::File::create(&big) else { panic!("cannot create") };
        if file.set_len(MAX_SPEC_BYTES + 1).is_err() {
            panic!("cannot grow the file")
        }
        let text = reason(&big.display().to_string());
        assert!(text.contains("16 MiB"), "{text}");
    }

    #[test]
    fn integers_too_large_for_toml_stay_numbers() {
        let doc = "a = 99999999999999999999\nb = -170141183460469231731687303715884105728\nc = 18446744073709551615";
        let Ok(table) = DeTable::parse(doc) else { panic!("test document parses") };
        let dict = table_to_dict(table.get_ref());
        assert_eq!(dict["a"].to_i128(), Some(99_999_999_999_999_999_999));
        assert_eq!(dict["b"].to_i128(), Some(i128::MIN));
        assert_eq!(dict["c"].to_u128(), Some(u64::MAX.into()));
    }
}
