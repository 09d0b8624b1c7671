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
            shuffle_buffer: 1024,
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
            shuffle_buffer: 1024,
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

/// `n` rows as a CSV table (`a`, `b`, label `y`) and as the same objects in JSONL, the label
/// made by `label` from the row's index.
fn same_rows(dir: &Path, name: &str, n: usize, label: impl Fn(usize) -> String) {
    let mut csv = String::from("a,b,y\n");
    let mut jsonl = String::new();
    for i in 0..n {
        let (a, b, y) = (i as f32 * 0.5, (i * 7 % 13) as f32 - 6.0, label(i));
        csv += &format!("{a},{b},{y}\n");
        let y = match y.parse::<f64>() {
            Ok(_) => y.clone(),
            Err(_) => format!("{y:?}"),
        };
        // A blank line now and then, which neither the count nor the skip may see.
        jsonl += &format!("{{\"b\": {b}, \"y\": {y}, \"a\": {a}}}\n{}", if i % 5 == 2 { "\n" } else { "" });
    }
    write(dir, &format!("{name}.csv"), &csv);
    write(dir, &format!("{name}.jsonl"), &jsonl);
}

fn csv_source(dir: &Path, train: &str, test: Option<&str>) -> crate::data::CsvSource {
    crate::data::CsvSource {
        dir: dir.to_path_buf(),
        config: crate::data::source::CsvConfig {
            train: format!("{train}.csv"),
            test: test.map(|t| format!("{t}.csv")),
            label: "y".into(),
            features: Some(vec!["a".into(), "b".into()]),
            labels: None,
        },
    }
}

/// Every batch of an epoch's first `steps` global batches (all of it at 1 worker).
fn batches(
    data: &Dataset,
    shuffle: crate::data::Shuffle,
    seed: u64,
    steps: usize,
) -> Vec<(Vec<f32>, Vec<u32>, Vec<f32>)> {
    use crate::data::{Cursor, Pipeline, PipelineOptions, Shard};
    let options = PipelineOptions {
        seed,
        shuffle,
        global_batch: NonZeroUsize::new(7).unwrap(),
        drop_remainder: false,
        prefetch: 1,
        shard: Shard::WHOLE,
    };
    let mut pipeline =
        Pipeline::new(std::sync::Arc::new(data.clone()), &options, Cursor { epoch: 3, offset: 0 }).unwrap();
    (0..steps).map(|_| pipeline.next_batch().map(|b| (b.x, b.y, b.targets)).unwrap()).collect()
}

#[test]
fn a_streamed_table_reads_and_shuffles_as_the_same_rows_held_in_memory() {
    use crate::data::Shuffle;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let names = ["dog", "ant", "cat"];
    same_rows(d, "names", 200, |i| names[i * 5 % 3].to_string());
    same_rows(d, "names_val", 30, |i| names[i % 2].to_string());
    same_rows(d, "numbered", 200, |i| (i * 3 % 5).to_string());
    same_rows(d, "numbered_val", 30, |i| (i % 4 + 1).to_string());
    same_rows(d, "targets", 200, |i| format!("{}", i as f32 / 8.0));
    for (train, test) in [("names", Some("names_val")), ("numbered", Some("numbered_val")), ("targets", None)] {
        let held = csv_source(d, train, test).load().unwrap();
        let mut jsonl = table_source(
            d,
            &format!("{train}.jsonl"),
            test.map(|t| format!("{t}.jsonl")).as_deref(),
            Some(&["a", "b"]),
        );
        let streamed = jsonl.load().unwrap();
        assert_eq!((streamed.labels, &streamed.classes), (held.labels, &held.classes), "{train}");
        assert_eq!(streamed.train.bytes_held(), 0, "{train}");
        assert_eq!(streamed.train.read(0..200).unwrap(), held.train.read(0..200).unwrap(), "{train}");
        if let (Some(s), Some(h)) = (&streamed.test, &held.test) {
            assert_eq!(s.read(0..30).unwrap(), h.read(0..30).unwrap(), "{train}");
        }
        assert_eq!(jsonl.facts().unwrap(), streamed.facts(1), "{train}");
        // The held table through `data.shuffle_buffer` gives the batches the stream gives
        // through `data.jsonl.shuffle_buffer`; unshuffled, both are file order.
        for shuffle in [Shuffle::Off, Shuffle::Buffer(NonZeroUsize::new(16).unwrap())] {
            jsonl.config.shuffle_buffer = match shuffle {
                Shuffle::Buffer(n) => n.get(),
                _ => 0,
            };
            assert_eq!(jsonl.stream_shuffle(), Some(shuffle));
            assert_eq!(batches(&streamed, shuffle, 11, 29), batches(&held, shuffle, 11, 29), "{train} {shuffle:?}");
        }
    }
}

#[test]
fn a_streamed_table_resumes_at_any_row_and_holds_no_more_than_its_buffer() {
    use crate::data::examples::StreamReader as _;
    use crate::data::source::tfrecord::Order;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let rows = |from: usize, to: usize| -> String {
        (from..to).map(|i| format!("{{\"x\": [{i}, {}], \"y\": {}}}\n", i * 2, i % 3)).collect()
    };
    write(d, "a.jsonl", &rows(0, 9));
    gzip(d, "b.jsonl.gz", &(String::from("\n  \n") + &rows(9, 10)));
    write(d, "empty.jsonl", "\n");
    zstd(d, "c.jsonl.zst", &rows(10, 23));
    let mut source = table_source(d, "a.jsonl", None, None);
    source.config.train = ["a.jsonl", "b.jsonl.gz", "empty.jsonl", "c.jsonl.zst"].map(String::from).to_vec();
    assert_eq!(source.facts().unwrap().train_files, 3, "the files that hold rows");
    let data = source.load().unwrap();
    let records = data.train.records().unwrap();
    assert_eq!(records.unit_lens(), [9, 1, 13]);
    for units in [&[0, 1, 2][..], &[2, 0]] {
        let n = crate::data::source::columnar::split::assert_skips_resume_an_unbroken_pass(records, units, 2);
        assert_eq!(n, units.iter().map(|&u| records.unit_lens()[u]).sum::<usize>());
    }

    // 20,000 rows through a buffer of 64: the pass holds 64 rows at most, whatever the file.
    write(d, "big.jsonl", &rows(0, 20_000));
    let config = table_source(d, "big.jsonl", None, None).config.table.unwrap();
    let scan = table::scan(&[d.join("big.jsonl")], &[], &config).unwrap();
    let stream = stream::JsonlTableSplit::new(scan.train, "y");
    let order = Order::Shuffled { buffer_size: NonZeroUsize::new(64).unwrap(), seed: 1, epoch: 0 };
    let mut pass = stream.reader(&[0], order);
    let (mut taken, mut most) = (0, 0);
    while pass.take().unwrap() {
        taken += 1;
        most = most.max(pass.buffered());
        if taken % 100 == 0 {
            let mut batch = crate::data::Batch::default();
            pass.decode(&mut batch).unwrap();
        }
    }
    assert_eq!((taken, most), (20_000, 64));
}

#[test]
fn label_errors_and_warnings_are_the_held_tables() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(d, "mixed.jsonl", "{\"a\": 1, \"y\": 3}\n\n{\"a\": 2, \"y\": \"cat\"}\n");
    let err = error(&table_source(d, "mixed.jsonl", None, None));
    assert!(
        err.ends_with(
            "mixed.jsonl:3:1 (byte 18): label field `y`: \"cat\" is text but the column also holds numbers (\"3\" on \
             row 1); fix the cell, or set the label kind to classes to read every value as a class name"
        ),
        "{err}"
    );
    let mut regression = table_source(d, "mixed.jsonl", None, None);
    regression.config.table.as_mut().unwrap().labels = Some(CsvLabels::Regression);
    let err = error(&regression);
    assert!(err.ends_with("mixed.jsonl:3:1 (byte 18): label field `y`: \"cat\" is not a number"), "{err}");
    // Read as classes, the numbers are names too.
    let mut classes = table_source(d, "mixed.jsonl", None, None);
    classes.config.table.as_mut().unwrap().labels = Some(CsvLabels::Classes);
    let data = classes.load().unwrap();
    assert_eq!(data.classes.unwrap().names(), ["3", "cat"]);
    assert_eq!(data.train.read(0..2).unwrap().y, [0, 1]);

    write(d, "t.jsonl", "{\"a\": 1, \"y\": \"cat\"}\n{\"a\": 2, \"y\": \"ant\"}\n");
    write(d, "v.jsonl", "{\"a\": 1, \"y\": \"bee\"}\n{\"a\": 2, \"y\": \"cat\"}\n");
    let err = error(&table_source(d, "t.jsonl", Some("v.jsonl"), None));
    assert!(err.contains("holds `bee` that the training table") && err.contains("(its classes: ant, cat)"), "{err}");
    // Numbered classes: the test split's are the training split's numbers.
    write(d, "n.jsonl", "{\"a\": 1, \"y\": 4}\n{\"a\": 2, \"y\": 0}\n");
    write(d, "nv.jsonl", "{\"a\": 1, \"y\": 2}\n{\"a\": 2, \"y\": 4}\n");
    let data = table_source(d, "n.jsonl", Some("nv.jsonl"), None).load().unwrap();
    assert_eq!(data.labels, LabelKind::Class { classes: 5 });
    assert_eq!(data.test.unwrap().read(0..2).unwrap().y, [2, 4]);
    write(d, "nv.jsonl", "{\"a\": 1, \"y\": 5}\n");
    let err = error(&table_source(d, "n.jsonl", Some("nv.jsonl"), None));
    assert!(err.contains("holds `5` that the training table"), "{err}");

    write(d, "one.jsonl", "{\"a\": 1, \"y\": \"cat\"}\n{\"a\": 2, \"y\": \"cat\"}\n");
    let warnings = table_source(d, "one.jsonl", None, None).facts().unwrap().warnings;
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].message.contains("is `cat`"), "{warnings:?}");
    write(d, "empty.jsonl", "\n\n");
    let err = error(&table_source(d, "empty.jsonl", None, None));
    assert!(err.contains("empty.jsonl: no JSON objects"), "{err}");
}
