//! The `jsonl` source on files written here: text and tables, plain, gzip and zstd, and every
//! error located.

use super::*;
use crate::data::examples::LabelKind;
use std::io::Write as _;

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

fn gzip(dir: &Path, name: &str, text: &str) {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(text.as_bytes()).unwrap();
    std::fs::write(dir.join(name), enc.finish().unwrap()).unwrap();
}

fn zstd(dir: &Path, name: &str, text: &str) {
    let bytes = ruzstd::encoding::compress_to_vec(text.as_bytes(), ruzstd::encoding::CompressionLevel::Fastest);
    std::fs::write(dir.join(name), bytes).unwrap();
}

fn text_source(dir: &Path, train: &[&str], validation: &[&str], tokenization: Tokenization) -> JsonlSource {
    JsonlSource {
        dir: dir.to_path_buf(),
        cache: dir.join(".trainrun-tokens"),
        config: JsonlConfig {
            train: train.iter().map(|s| s.to_string()).collect(),
            validation: validation.iter().map(|s| s.to_string()).collect(),
            text: Some(JsonlText {
                field: "text".into(),
                end_of_text: None,
                tokenization,
                vocabulary: VocabularyFrom::Train,
                block_size: NonZeroUsize::new(3).unwrap(),
            }),
            table: None,
        },
    }
}

fn table_source(dir: &Path, train: &str, validation: Option<&str>, features: Option<&[&str]>) -> JsonlSource {
    JsonlSource {
        dir: dir.to_path_buf(),
        cache: dir.join(".trainrun-tokens"),
        config: JsonlConfig {
            train: vec![train.into()],
            validation: validation.into_iter().map(String::from).collect(),
            text: None,
            table: Some(JsonlTable {
                label: "y".into(),
                features: features.map(|f| f.iter().map(|s| s.to_string()).collect()),
                labels: None,
            }),
        },
    }
}

const DOCS: &str = "{\"text\": \"ab\", \"id\": 1}\n\n{\"text\": \"ba\"}\n";

#[test]
fn documents_are_joined_with_the_end_of_text_in_every_compression() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "plain.jsonl", DOCS);
    gzip(dir.path(), "g.jsonl.gz", DOCS);
    zstd(dir.path(), "z.jsonl.zst", DOCS);
    for name in ["plain.jsonl", "g.jsonl.gz", "z.jsonl.zst"] {
        let source = text_source(dir.path(), &[name], &[], Tokenization::Byte);
        let data = source.load().unwrap();
        // "ab\nba\n": 6 tokens, windows of 4 at 0, 1 and 2.
        assert_eq!(data.train.len(), 3, "{name}");
        let all = data.train.read(0..3).unwrap();
        assert_eq!(all.x[..3], [97., 98., 10.], "{name}");
        assert_eq!(all.y[6..], [98, 97, 10], "{name}");
        assert_eq!(source.facts().unwrap(), data.facts(0));
    }
    let char_data = text_source(dir.path(), &["plain.jsonl"], &[], Tokenization::Char).load().unwrap();
    assert_eq!(char_data.labels, LabelKind::Sequence { classes: 3, len: 3 });
}

#[test]
fn a_table_reads_numbers_arrays_and_class_names() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "t.jsonl",
        "{\"a\": 1, \"b\": [2, 3.5], \"y\": \"cat\"}\n{\"b\": [4, 5], \"a\": -1, \"y\": \"ant\"}\n",
    );
    write(dir.path(), "v.jsonl", "{\"a\": 0, \"b\": [0, 0], \"y\": \"cat\"}\n");
    let source = table_source(dir.path(), "t.jsonl", Some("v.jsonl"), None);
    let data = source.load().unwrap();
    assert_eq!(data.labels, LabelKind::Class { classes: 2 });
    assert_eq!(data.classes.as_ref().unwrap().names(), ["ant", "cat"]);
    let batch = data.train.read(0..2).unwrap();
    assert_eq!((batch.x, batch.y), (vec![1., 2., 3.5, -1., 4., 5.], vec![1, 0]));
    assert_eq!(data.test.as_ref().unwrap().read(0..1).unwrap().y, [1]);
    assert_eq!(source.facts().unwrap().example_shape, [3]);
    // Float labels are regression targets.
    write(dir.path(), "r.jsonl", "{\"a\": 1, \"y\": 0.5}\n{\"a\": 2, \"y\": 1}\n");
    let data = table_source(dir.path(), "r.jsonl", None, Some(&["a"])).load().unwrap();
    assert_eq!(data.labels, LabelKind::Target { width: 1 });
    assert_eq!(data.train.read(0..2).unwrap().targets, [0.5, 1.0]);
}

fn error(source: &JsonlSource) -> String {
    source.load().unwrap_err().to_string()
}

#[test]
fn bad_lines_are_named_with_file_line_column_and_byte() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(d, "bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"é\" oops}\n");
    let err = error(&text_source(d, &["bad.jsonl"], &[], Tokenization::Byte));
    assert!(err.ends_with("bad.jsonl:2:15 (byte 30): invalid JSON: expected `,` or `}`"), "{err}");
    write(d, "array.jsonl", "[1, 2]\n");
    let err = error(&text_source(d, &["array.jsonl"], &[], Tokenization::Byte));
    assert!(err.ends_with("array.jsonl:1:1 (byte 0): the line holds an array, not a JSON object; each line of a JSONL file is one object"), "{err}");
    write(d, "field.jsonl", "{\"content\": \"x\", \"id\": 3}\n");
    let err = error(&text_source(d, &["field.jsonl"], &[], Tokenization::Byte));
    assert!(err.ends_with("field.jsonl:1:1 (byte 0): no field named `text`; it has: content, id"), "{err}");
    write(d, "kind.jsonl", "{\"text\": 3}\n");
    let err = error(&text_source(d, &["kind.jsonl"], &[], Tokenization::Byte));
    assert!(err.ends_with("kind.jsonl:1:1 (byte 0): field `text` holds a number; expected a string"), "{err}");
    std::fs::write(d.join("utf8.jsonl"), b"{\"text\": \"abc\"}\n{\"text\": \"a\xffb\"}\n").unwrap();
    let err = error(&text_source(d, &["utf8.jsonl"], &[], Tokenization::Byte));
    assert!(err.ends_with("utf8.jsonl at byte 27: line 2 is not UTF-8 text; JSON Lines files are UTF-8"), "{err}");
    write(d, "t.jsonl", "{\"a\": 1, \"y\": 0}\n{\"a\": \"2\", \"y\": 1}\n");
    let err = error(&table_source(d, "t.jsonl", None, None));
    assert!(
        err.ends_with("t.jsonl:2:1 (byte 17): field `a` holds a string; expected a number or an array of numbers"),
        "{err}"
    );
    write(d, "w.jsonl", "{\"a\": [1], \"y\": 0}\n{\"a\": [1, 2], \"y\": 1}\n");
    let err = error(&table_source(d, "w.jsonl", None, None));
    assert!(err.contains("w.jsonl:2:1 (byte 19): field `a` holds 2 values, but 1 in"), "{err}");
}

#[test]
fn a_truncated_compressed_file_is_an_error_not_a_short_corpus() {
    let dir = tempfile::tempdir().unwrap();
    let long: String = (0..200).map(|i| format!("{{\"text\": \"document {i}\"}}\n")).collect();
    for (name, write) in [("g.gz", gzip as fn(&Path, &str, &str)), ("z.zst", zstd)] {
        write(dir.path(), name, &long);
        let bytes = std::fs::read(dir.path().join(name)).unwrap();
        std::fs::write(dir.path().join(name), &bytes[..bytes.len() / 2]).unwrap();
        let err = error(&text_source(dir.path(), &[name], &[], Tokenization::Byte));
        assert!(err.contains("corrupt"), "{name}: {err}");
    }
}

#[test]
fn text_and_table_together_or_neither_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.jsonl", DOCS);
    let mut source = text_source(dir.path(), &["a.jsonl"], &[], Tokenization::Byte);
    source.config.table = table_source(dir.path(), "a.jsonl", None, None).config.table;
    assert!(error(&source).starts_with("data.jsonl: both data.jsonl.text and data.jsonl.table are set"));
    source.config.table = None;
    source.config.text = None;
    assert!(error(&source).contains("needs `data.jsonl.text (a language model's documents) or data.jsonl.table"));
}
