//! The `parquet` source on files the crate's own Arrow writer makes (pyarrow's are in
//! `tests/data_parquet.rs`): row groups as shard units, skipping as the pipeline's resume does
//! (the rows after a skip are those of an unbroken pass, shuffled or not), classes by index
//! and by name, text columns, and the errors naming file, column, type and columns present.

use super::*;
use crate::data::examples::LabelKind;
use crate::data::source::columnar::split::assert_skips_resume_an_unbroken_pass;
use arrow_array::builder::{FixedSizeListBuilder, UInt8Builder};
use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use std::sync::Arc;

/// Writes `rows` rows (pixels `[i, 2i]`, label `i % 3`, name `a`/`b`/`c`, text `doc i`) to
/// `path` in row groups of `group` rows.
fn write(path: &Path, from: usize, rows: usize, group: usize) {
    let mut pixels = FixedSizeListBuilder::new(UInt8Builder::new(), 2);
    for i in from..from + rows {
        pixels.values().append_slice(&[i as u8, (2 * i) as u8]);
        pixels.append(true);
    }
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("pixels", Arc::new(pixels.finish())),
        ("label", Arc::new(Int64Array::from_iter_values((from..from + rows).map(|i| (i % 3) as i64)))),
        ("name", Arc::new(StringArray::from_iter_values((from..from + rows).map(|i| ["a", "b", "c"][i % 3])))),
        ("text", Arc::new(StringArray::from_iter_values((from..from + rows).map(|i| format!("doc {i}"))))),
    ];
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    let props = WriterProperties::builder().set_max_row_group_row_count(Some(group)).build();
    let mut writer = ArrowWriter::try_new(std::fs::File::create(path).unwrap(), batch.schema(), Some(props)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
}

fn source(dir: &Path, table: &str) -> ParquetSource {
    let config = toml::from_str(&format!("train = [\"t*.parquet\"]\nvalidation = [\"v.parquet\"]\n{table}")).unwrap();
    ParquetSource { cache: dir.join(".trainrun-tokens"), dir: dir.to_path_buf(), config }
}

fn setup() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("t0.parquet"), 0, 7, 3);
    write(&dir.path().join("t1.parquet"), 7, 5, 3);
    write(&dir.path().join("v.parquet"), 20, 4, 4);
    dir
}

const TABLE: &str = "table = { label = \"label\", features = [\"pixels\"] }";

#[test]
fn row_groups_are_the_units_and_a_skip_resumes_an_unbroken_pass() {
    let dir = setup();
    let source = source(dir.path(), TABLE);
    let facts = source.facts().unwrap();
    assert_eq!((facts.train_examples, facts.test_examples, facts.train_files), (12, 4, 5));
    assert_eq!((facts.example_shape, facts.labels), (vec![2], LabelKind::Class { classes: 3 }));
    let data = source.load().unwrap();
    let records = data.train.records().unwrap();
    assert_eq!(records.unit_lens(), [3, 3, 1, 3, 2]);
    let b = data.train.read(5..8).unwrap();
    assert_eq!((b.x, b.y), (vec![5., 10., 6., 12., 7., 14.], vec![2, 0, 1]));
    assert_eq!(data.train.read(0..1).unwrap().y, [0], "a read behind the last one starts again");
    assert_eq!(assert_skips_resume_an_unbroken_pass(records, &[4, 0, 2, 3], 2), 9);
    let test = data.test.unwrap().read(0..4).unwrap();
    assert_eq!(test.y, [2, 0, 1, 2]);
}

#[test]
fn names_are_classes_sorted_and_floats_are_targets() {
    let dir = setup();
    let named = source(dir.path(), "table = { label = \"name\", features = [\"label\", \"pixels\"], shape = [3, 1] }");
    let data = named.load().unwrap();
    let names = data.classes.as_ref().map(|c| c.names().to_vec());
    assert_eq!(names, Some(vec!["a".to_string(), "b".into(), "c".into()]));
    assert_eq!(data.train.shape(), [3, 1]);
    assert_eq!(data.train.read(4..5).unwrap().x, [1., 4., 8.]);
    let target = source(dir.path(), "table = { label = \"label\", features = [\"pixels\"], labels = \"regression\" }");
    let data = target.load().unwrap();
    assert_eq!(data.labels, LabelKind::Target { width: 1 });
    assert_eq!(data.train.read(1..3).unwrap().targets, [1., 2.]);
}

#[test]
fn a_text_column_is_documents() {
    let dir = setup();
    let opened = Columnar::Parquet.open(&dir.path().join("t1.parquet")).unwrap();
    let file = documents::documents(Columnar::Parquet, &opened, "text").unwrap();
    assert_eq!(file.all().unwrap(), ["doc 7", "doc 8", "doc 9", "doc 10", "doc 11"]);
    let source = source(dir.path(), "text = { column = \"text\", block_size = 4 }");
    let facts = source.facts().unwrap();
    assert_eq!(facts.labels.classes(), Some(15), "d o c space 0-9 newline");
}

/// Documents are read ahead on a second thread: in order across row groups, a bad page's error
/// comes after the documents before it, and a caller that stops stops the reading.
#[test]
fn a_text_column_read_ahead_keeps_order_and_stops_on_an_error() {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.parquet");
    // A row group a row: 40 record batches, many more than are read ahead.
    write(&path, 0, 40, 1);
    let read = || documents::documents(Columnar::Parquet, &Columnar::Parquet.open(&path).unwrap(), "text").unwrap();
    let every: Vec<String> = (0..40).map(|i| format!("doc {i}")).collect();
    assert_eq!(read().all().unwrap(), every);

    // The caller stops at its third batch: its error comes back, and no more batches.
    let mut seen = vec![];
    let stopped = read().each_batch(&mut |batch| {
        seen.extend(batch.iter().map(|d| d.to_string()));
        match seen.len() {
            3 => Err(DataError::BadParquet { problem: "enough".into() }),
            _ => Ok(()),
        }
    });
    assert_eq!((stopped.unwrap_err().to_string(), seen), ("data.parquet: enough".to_string(), every[..3].to_vec()));

    // The text column's page in row group 30 overwritten: the 30 documents before it, then the error.
    let reader = SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap();
    let offset = reader.metadata().row_group(30).column(3).data_page_offset() as usize;
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[offset..offset + 24].fill(0xff);
    std::fs::write(&path, bytes).unwrap();
    let mut seen = vec![];
    let failed = read().each_batch(&mut |batch| {
        seen.extend(batch.iter().map(|d| d.to_string()));
        Ok(())
    });
    let failed = failed.unwrap_err().to_string();
    assert!(failed.contains("t.parquet: not a readable Parquet file"), "{failed}");
    assert_eq!(seen, every[..30]);
}

#[test]
fn errors_name_the_file_the_column_its_type_and_the_columns_there() {
    let dir = setup();
    let err = |table: &str| source(dir.path(), table).facts().unwrap_err().to_string();
    let missing = err("table = { label = \"kind\", features = [\"pixels\"] }");
    assert!(missing.contains("t0.parquet has no column `kind`; its columns: pixels, label, name, text"), "{missing}");
    let wrong = err("table = { label = \"label\", features = [\"text\"] }");
    assert!(wrong.contains("column `text` is Utf8; expected numbers, booleans or lists of numbers"), "{wrong}");
    let wrong = err("text = { column = \"label\", block_size = 4 }");
    assert!(wrong.contains("column `label` is Int64; expected strings (documents)"), "{wrong}");
    let path = dir.path().join("t1.parquet");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 5]).unwrap();
    let truncated = err(TABLE);
    assert!(truncated.contains("t1.parquet: not a readable Parquet file"), "{truncated}");
}
