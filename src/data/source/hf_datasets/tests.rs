//! The `hf_datasets` source on folders laid out as `save_to_disk` lays them out, their Arrow
//! files written by the crate's own stream writer (the `datasets` package's are in
//! `tests/data_hf_datasets.rs`): record batches as shard units, skipping as the pipeline's
//! resume does, a text column, and the errors naming what is missing, the splits there, and a
//! truncated file.

use super::*;
use crate::data::examples::LabelKind;
use crate::data::source::columnar::split::assert_skips_resume_an_unbroken_pass;
use arrow_array::builder::{FixedSizeListBuilder, UInt8Builder};
use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_ipc::writer::StreamWriter;
use std::sync::Arc;

/// Rows `from..from + rows` (pixels `[i, 2i]`, label `i % 3`, text `doc i`), `per` a batch.
fn write(path: &Path, from: usize, rows: usize, per: usize) {
    let batch = |from: usize, rows: usize| {
        let mut pixels = FixedSizeListBuilder::new(UInt8Builder::new(), 2);
        for i in from..from + rows {
            pixels.values().append_slice(&[i as u8, (2 * i) as u8]);
            pixels.append(true);
        }
        let range = from..from + rows;
        let columns: Vec<(&str, ArrayRef)> = vec![
            ("pixels", Arc::new(pixels.finish())),
            ("label", Arc::new(Int64Array::from_iter_values(range.clone().map(|i| (i % 3) as i64)))),
            ("text", Arc::new(StringArray::from_iter_values(range.map(|i| format!("doc {i}"))))),
        ];
        RecordBatch::try_from_iter(columns).unwrap()
    };
    let first = batch(from, 0);
    let mut writer = StreamWriter::try_new(std::fs::File::create(path).unwrap(), &first.schema()).unwrap();
    for start in (from..from + rows).step_by(per) {
        writer.write(&batch(start, per.min(from + rows - start))).unwrap();
    }
    writer.finish().unwrap();
}

/// A `Dataset` folder at `dir` of files holding `rows[f]` rows each.
fn dataset(dir: &Path, rows: &[usize], per: usize) {
    std::fs::create_dir_all(dir).unwrap();
    let mut from = 0;
    let mut names = vec![];
    for (f, &n) in rows.iter().enumerate() {
        let name = format!("data-{f:05}-of-{:05}.arrow", rows.len());
        write(&dir.join(&name), from, n, per);
        names.push(format!("{{\"filename\": \"{name}\"}}"));
        from += n;
    }
    let state = format!("{{\"_data_files\": [{}], \"_fingerprint\": \"x\"}}", names.join(", "));
    std::fs::write(dir.join("state.json"), state).unwrap();
    std::fs::write(dir.join("dataset_info.json"), "{}").unwrap();
}

/// A `DatasetDict` with `train` (7 + 5 rows, batches of 3) and `test` (4 rows).
fn setup() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    dataset(&dir.path().join("train"), &[7, 5], 3);
    dataset(&dir.path().join("test"), &[4], 4);
    std::fs::write(dir.path().join("dataset_dict.json"), r#"{"splits": ["train", "test"]}"#).unwrap();
    dir
}

fn source(dir: &Path, config: &str) -> HfDatasetsSource {
    let config = toml::from_str(config).unwrap();
    HfDatasetsSource { cache: dir.join(".trainrun-tokens"), dir: dir.to_path_buf(), config }
}

const TABLE: &str = "validation = \"test\"\ntable = { label = \"label\", features = [\"pixels\"] }";

#[test]
fn record_batches_are_the_units_and_a_skip_resumes_an_unbroken_pass() {
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
    assert_eq!(assert_skips_resume_an_unbroken_pass(records, &[4, 0, 2, 3], 2), 9);
    assert_eq!(data.test.unwrap().read(0..4).unwrap().y, [0, 1, 2, 0]);
}

#[test]
fn a_dataset_folder_is_the_training_split_and_a_text_column_is_documents() {
    let dir = tempfile::tempdir().unwrap();
    dataset(dir.path(), &[5], 2);
    let facts = source(dir.path(), "text = { column = \"text\", block_size = 4 }").facts().unwrap();
    assert_eq!(facts.labels.classes(), Some(10), "d o c space 0-4 newline");
    let err = source(dir.path(), &format!("train = \"train\"\n{TABLE}")).facts().unwrap_err().to_string();
    assert!(err.contains("is one Dataset (state.json), not a DatasetDict"), "{err}");
}

#[test]
fn errors_name_what_is_missing_the_splits_there_and_a_truncated_file() {
    let dir = setup();
    let err = |config: &str| source(dir.path(), config).facts().unwrap_err().to_string();
    let unknown = err("validation = \"validation\"\ntext = { block_size = 4 }");
    assert!(unknown.contains("has no split `validation`; its splits: train, test"), "{unknown}");
    let wrong = err("text = { column = \"label\", block_size = 4 }");
    assert!(wrong.contains("data.hf_datasets: "), "{wrong}");
    assert!(wrong.contains("column `label` is Int64; expected strings (documents)"), "{wrong}");

    std::fs::remove_file(dir.path().join("test/data-00000-of-00001.arrow")).unwrap();
    let missing = err(TABLE);
    assert!(missing.contains("missing in") && missing.contains("test/data-00000-of-00001.arrow"), "{missing}");

    let path = dir.path().join("train/data-00001-of-00002.arrow");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 20]).unwrap();
    let truncated = err("table = { label = \"label\", features = [\"pixels\"] }");
    assert!(
        truncated.contains("data-00001-of-00002.arrow: not a readable Arrow stream file: truncated"),
        "{truncated}"
    );

    let empty = tempfile::tempdir().unwrap();
    let neither = source(empty.path(), TABLE).facts().unwrap_err().to_string();
    assert!(neither.contains("dataset_dict.json or state.json"), "{neither}");
}
