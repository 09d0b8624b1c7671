//! Exact resume for the sources that are not MNIST: a run reading a CSV table (shuffled whole),
//! one reading the same rows as gzip JSON Lines
//! and one streaming TFRecord files (through a shuffle buffer smaller than the data) are
//! killed with SIGKILL mid-epoch after a backup, started again with the same command, and end
//! with the weights of an uninterrupted run, bit for bit; and two workers each streaming their
//! own files (the `file` policy) are preempted (SIGTERM to a worker) and resume to the same
//! weights. A TFRecord run whose images are augmented as they stream resumes the same way. A
//! Parquet table pyarrow wrote (row groups of 128 rows) resumes the same ways: killed, through
//! a shuffle buffer, and preempted with two workers each reading their own row groups; so does
//! a table Hugging Face `datasets` saved (8 shards of one record batch each). A language
//! model's windows of the plays' characters, read as documents from JSON Lines, a Parquet text
//! column and a `datasets` text column (each through the token cache), resume killed the same
//! way.

mod common;

use common::{assert_exit, json, tempdir, wait_within};
use std::path::{Path, PathBuf};
use std::time::Duration;
use trainrun::data::formats::bench::raw_image_example;
use trainrun::data::source::tfrecord::write_record;

const LIMIT: Duration = Duration::from_secs(300);
/// Values per example: 8×8 one-channel images, or 64 CSV columns.
const VALUES: usize = 64;
const EXAMPLES: usize = 1024;

/// Example `i`: class `i % 4` brightens a quarter of the values, with deterministic noise.
fn example(i: usize) -> (Vec<u8>, usize) {
    let class = i % 4;
    let values = (0..VALUES).map(|p| (usize::from(p / 16 == class) * 150 + (i * 37 + p * 11) % 100) as u8).collect();
    (values, class)
}

fn write_tfrecords(dir: &Path) {
    for f in 0..4 {
        let mut bytes = vec![];
        for i in f * EXAMPLES / 4..(f + 1) * EXAMPLES / 4 {
            let (values, class) = example(i);
            write_record(&mut bytes, &raw_image_example(values, class as i64)).unwrap();
        }
        std::fs::write(dir.join(format!("train-{f}.tfrecord")), bytes).unwrap();
    }
}

fn write_csv(dir: &Path) {
    let header: Vec<String> = (0..VALUES).map(|p| format!("x{p}")).chain(["kind".to_string()]).collect();
    let mut text = header.join(",") + "\n";
    for i in 0..EXAMPLES {
        let (values, class) = example(i);
        let row: Vec<String> = values.iter().map(|v| format!("{}", f32::from(*v) / 255.0)).collect();
        // String labels: classes are the sorted names.
        text += &format!("{},{}\n", row.join(","), ["ant", "bee", "cat", "dog"][class]);
    }
    std::fs::write(dir.join("train.csv"), text).unwrap();
}

/// A job of 30 epochs × 16 steps with momentum (so optimizer state matters) and backups
/// every 10 steps (mid-epoch), with a model big enough that it runs for seconds.
fn spec(dir: &Path, data: &str) -> PathBuf {
    spec_with(dir, data, "")
}

fn spec_with(dir: &Path, data: &str, strategy: &str) -> PathBuf {
    spec_of(dir, data, strategy, CLASSIFIER, "")
}

/// The table sources' model: big enough that a run takes seconds.
const CLASSIFIER: &str = "[[model.layers]]\ntype = \"flatten\"\n[[model.layers]]\ntype = \"dense\"\nunits = 512\n\
    activation = \"relu\"\n[[model.layers]]\ntype = \"dense\"\nunits = 512\nactivation = \"relu\"\n\
    [[model.layers]]\ntype = \"dense\"\nunits = 4";

/// `spec_with`'s job with `model`'s layers and `train` (more lines of `[train]`).
fn spec_of(dir: &Path, data: &str, strategy: &str, model: &str, train: &str) -> PathBuf {
    let text = format!(
        r#"
[run]
name = "resume"
seed = 5
out_dir = "{out}"
threads = 1

[data]
dir = "{data_dir}"
{data}

{strategy}

[batch]
global = 64

[optimizer]
kind = "sgd"
learning_rate = 0.05
momentum = 0.9

[model]
{model}

[train]
epochs = 30
{train}
loss = "sparse_categorical_crossentropy"
from_logits = true

[[callbacks]]
kind = "backup_and_restore"
save_freq = 10
"#,
        out = dir.join("run").display(),
        data_dir = dir.display(),
    );
    let path = dir.join("spec.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn summary(spec: &Path) -> serde_json::Value {
    json(&spec.with_file_name("run").join("summary.json"))
}

/// Runs `spec` uninterrupted in one folder, and killed after its first backup then started
/// again in another; the two must end with the same weights.
fn killed_and_resumed_ends_bit_identical(write: fn(&Path), data: &str) {
    killed_and_resumed_with(write, &|dir| spec(dir, data));
}

/// As [`killed_and_resumed_ends_bit_identical`], with the spec `spec` writes into a folder.
fn killed_and_resumed_with(write: fn(&Path), spec: &dyn Fn(&Path) -> PathBuf) {
    let (reference, killed) = (tempdir(), tempdir());
    for dir in [&reference, &killed] {
        write(dir.path());
    }
    let reference = spec(reference.path());
    assert_exit(&wait_within(common::spawn(&[reference.to_str().unwrap(), "-q"]), LIMIT).0, 0);
    let expected = summary(&reference);
    assert_eq!(expected["steps"], 480, "{expected}");

    let spec = spec(killed.path());
    let args = [spec.to_str().unwrap(), "-q"];
    let mut child = common::spawn(&args);
    common::wait_for_any_backup(&killed.path().join("run/backup"), LIMIT, &mut child);
    common::signal(child.id(), libc::SIGKILL);
    let (out, _) = wait_within(child, LIMIT);
    assert_eq!(out.status.code(), None, "the run was to be killed, not to finish");
    assert!(!killed.path().join("run/summary.json").exists());

    let resumed = wait_within(common::spawn(&args), LIMIT).0;
    assert_exit(&resumed, 0);
    let s = summary(&spec);
    // Resumed from a backup inside an epoch (16 steps each), not from the start.
    let from = s["resumed_from_step"].as_u64().unwrap_or(0);
    assert!((10..480).contains(&from) && !from.is_multiple_of(16), "{s}");
    for key in ["weights_sha256", "train_loss", "steps", "examples"] {
        assert_eq!(s[key], expected[key], "{key}: {s}");
    }
}

/// The CSV table's rows as gzip-compressed JSON Lines: the values in an array field, the class
/// name in another.
fn write_jsonl(dir: &Path) {
    use std::io::Write as _;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    for i in 0..EXAMPLES {
        let (values, class) = example(i);
        let values: Vec<f32> = values.iter().map(|v| f32::from(*v) / 255.0).collect();
        let kind = ["ant", "bee", "cat", "dog"][class];
        let row = serde_json::json!({ "x": values, "kind": kind });
        writeln!(gz, "{row}").unwrap();
    }
    std::fs::write(dir.join("train.jsonl.gz"), gz.finish().unwrap()).unwrap();
}

#[test]
fn a_jsonl_run_killed_mid_epoch_resumes_bit_identical() {
    killed_and_resumed_ends_bit_identical(
        write_jsonl,
        "dataset = \"jsonl\"\n\n[data.jsonl]\ntrain = [\"train.jsonl.gz\"]\ntable = { label = \"kind\" }",
    );
}

const TFRECORDS: &str = "dataset = \"tfrecord\"\n\n[data.tfrecord]\ntrain = [\"train-*.tfrecord\"]\n\
    shape = [8, 8, 1]\nclasses = 4\nshuffle_buffer = 100";

#[test]
fn a_csv_run_killed_mid_epoch_resumes_bit_identical() {
    killed_and_resumed_ends_bit_identical(
        write_csv,
        "dataset = \"csv\"\n\n[data.csv]\ntrain = \"train.csv\"\nlabel = \"kind\"",
    );
}

#[test]
fn a_tfrecord_run_killed_mid_epoch_resumes_bit_identical() {
    killed_and_resumed_ends_bit_identical(write_tfrecords, TFRECORDS);
}

/// The same, with the images normalized, cropped and flipped as the stream is read.
#[test]
fn an_augmented_tfrecord_run_killed_mid_epoch_resumes_bit_identical() {
    let augmented = format!(
        "{TFRECORDS}\n\n[data.preprocessing]\nnormalize = \"adapt\"\nrandom_crop = {{ padding = 2 }}\nrandom_flip = \"horizontal\""
    );
    let dir = tempdir();
    write_tfrecords(dir.path());
    let check = common::run(&["check", spec(dir.path(), &augmented).to_str().unwrap()]);
    assert_exit(&check, 0);
    let shown = common::text(&check).0;
    assert!(shown.contains("random crop 8×8 of the image padded by 2, random horizontal flip"), "{shown}");
    killed_and_resumed_ends_bit_identical(write_tfrecords, &augmented);
}

#[test]
fn two_workers_reading_their_own_files_preempted_resume_bit_identical() {
    preempted_workers_resume_bit_identical(write_tfrecords, TFRECORDS);
}

/// The rows of [`example`] as one Parquet file of 8 row groups: the values a fixed-size list
/// of `uint8`, the class an `int64`.
const PARQUET_WRITER: &str = r#"
import os, sys
import pyarrow as pa, pyarrow.parquet as pq
rows = [[(p // 16 == i % 4) * 150 + (i * 37 + p * 11) % 100 for p in range(64)] for i in range(1024)]
table = pa.table({"x": pa.array(rows, type=pa.list_(pa.uint8(), 64)), "label": [i % 4 for i in range(1024)]})
pq.write_table(table, os.path.join(sys.argv[1], "train.parquet"), row_group_size=128)
"#;

fn write_parquet(dir: &Path) {
    assert!(common::with_python("pyarrow", PARQUET_WRITER, dir));
}

const PARQUET: &str = "dataset = \"parquet\"\n\n[data.parquet]\ntrain = [\"train.parquet\"]\nshuffle_buffer = 100\n\
    table = { label = \"label\", features = [\"x\"] }\n\n[data.preprocessing]\nrescale = 0.00392156862745098";

/// Whether pyarrow imports; says loudly that the test is skipped when it does not.
fn pyarrow() -> bool {
    common::with_python("pyarrow", "", tempdir().path())
}

#[test]
fn a_parquet_run_killed_mid_epoch_resumes_bit_identical() {
    if pyarrow() {
        killed_and_resumed_ends_bit_identical(write_parquet, PARQUET);
    }
}

#[test]
fn two_workers_reading_their_own_row_groups_preempted_resume_bit_identical() {
    if pyarrow() {
        preempted_workers_resume_bit_identical(write_parquet, PARQUET);
    }
}

/// The rows of [`example`] as a `Dataset` that Hugging Face `datasets` saved in 8 shards (one
/// record batch each): the values a fixed-length `uint8` sequence, the class a `ClassLabel`.
const HF_DATASETS_WRITER: &str = r#"
import os, sys
import datasets
rows = [[(p // 16 == i % 4) * 150 + (i * 37 + p * 11) % 100 for p in range(64)] for i in range(1024)]
features = datasets.Features({
    "x": datasets.Sequence(datasets.Value("uint8"), length=64),
    "label": datasets.ClassLabel(names=["ant", "bee", "cat", "dog"]),
})
data = datasets.Dataset.from_dict({"x": rows, "label": [i % 4 for i in range(1024)]}, features=features)
data.save_to_disk(sys.argv[1], num_shards=8)
"#;

fn write_hf_datasets(dir: &Path) {
    assert!(common::with_python("datasets", HF_DATASETS_WRITER, dir));
}

/// `data.dir` is the folder `save_to_disk` wrote (the spec and the run folder are written beside
/// its files).
const HF_DATASETS: &str = "dataset = \"hf_datasets\"\n\n[data.hf_datasets]\nshuffle_buffer = 100\n\
    table = { label = \"label\", features = [\"x\"] }\n\n[data.preprocessing]\nrescale = 0.00392156862745098";

/// Whether `datasets` imports; says loudly that the test is skipped when it does not.
fn hf_datasets() -> bool {
    common::with_python("datasets", "", tempdir().path())
}

#[test]
fn a_hf_datasets_run_killed_mid_epoch_resumes_bit_identical() {
    if hf_datasets() {
        killed_and_resumed_ends_bit_identical(write_hf_datasets, HF_DATASETS);
    }
}

#[test]
fn two_workers_reading_their_own_record_batches_preempted_resume_bit_identical() {
    if hf_datasets() {
        preempted_workers_resume_bit_identical(write_hf_datasets, HF_DATASETS);
    }
}

/// Two workers under the `file` policy, one asked to stop after a backup, started again:
/// the weights of an uninterrupted run.
fn preempted_workers_resume_bit_identical(write: fn(&Path), data: &str) {
    let strategy = "[strategy]\nkind = \"multi_worker_mirrored\"\n\n[cluster]\nworker = 2";
    let (reference, stopped) = (tempdir(), tempdir());
    for dir in [&reference, &stopped] {
        write(dir.path());
    }
    let reference = spec_with(reference.path(), data, strategy);
    let check = common::run(&["check", reference.to_str().unwrap()]);
    assert!(common::text(&check).0.contains("file policy, 2 shards"), "{}", common::text(&check).0);
    assert_exit(&wait_within(common::spawn(&[reference.to_str().unwrap(), "-q"]), LIMIT).0, 0);
    let expected = summary(&reference);

    let spec = spec_with(stopped.path(), data, strategy);
    let args = [spec.to_str().unwrap(), "-q"];
    let mut launcher = common::spawn(&args);
    let victim = common::launched_task(launcher.id(), ("worker", 1), LIMIT).expect("no worker:1");
    common::wait_for_any_backup(&stopped.path().join("run/backup"), LIMIT, &mut launcher);
    // A worker asked to stop: every worker stops after the same step, the chief backs it up.
    common::signal(victim, libc::SIGTERM);
    assert_exit(&wait_within(launcher, LIMIT).0, 6);

    assert_exit(&wait_within(common::spawn(&args), LIMIT).0, 0);
    let s = summary(&spec);
    // The workers agree on the step to stop after, so it is not chosen here; it is mid-epoch
    // unless it happens to fall on a multiple of 16.
    let from = s["resumed_from_step"].as_u64().unwrap_or(0);
    assert!((10..480).contains(&from), "{s}");
    for key in ["weights_sha256", "train_loss", "steps", "examples"] {
        assert_eq!(s[key], expected[key], "{key}: {s}");
    }
}

/// A language model on windows of the plays' characters: each position's token embedded, through
/// a hidden layer, to logits over the vocabulary; 16 steps an epoch (an epoch of windows would
/// be a million), so the kill lands inside one.
fn text_spec(dir: &Path, data: &str) -> PathBuf {
    let model = "[[model.layers]]\ntype = \"embedding\"\noutput_dim = 64\n\n[[model.layers]]\n\
                 type = \"positionwise_dense\"\nunits = 256\n\n[[model.layers]]\ntype = \"gelu\"\n\n\
                 [[model.layers]]\ntype = \"lm_head\"";
    spec_of(dir, data, "", model, "steps_per_epoch = 16")
}

/// The plays' training paragraphs, one document each, as `sys.argv[2]` names them.
const PLAYS: &str = r#"
import os, sys
here = sys.argv[2]
text = open(os.path.join(here, "train.txt"), encoding="utf-8").read()
paragraphs = [p for p in text.split("\n\n") if p.strip()]
"#;

/// Runs the writer `script` (after [`PLAYS`]) with `module`, or says loudly that it skips.
fn write_documents(dir: &Path, module: &str, script: &str) -> bool {
    let plays = common::sources::plays();
    let script = format!("import sys; sys.argv.append({:?})\n{PLAYS}\n{script}", plays.display().to_string());
    common::with_python(module, &script, dir)
}

/// Windows of 32 characters with a seeded shuffle of every epoch (the bijection), resumed by
/// the cursor; the documents joined by a blank line.
const TEXT: &str = "text = { block_size = 32, end_of_text = \"\\n\\n\" }";

/// The paragraphs as JSON Lines, written by Python's `json`.
fn write_jsonl_documents(dir: &Path) {
    let script = "import json\nwith open(os.path.join(sys.argv[1], 'train.jsonl'), 'w', encoding='utf-8') as f:\n\
                  \x20   f.writelines(json.dumps({'text': p}) + '\\n' for p in paragraphs)";
    assert!(write_documents(dir, "json", script));
}

#[test]
fn a_jsonl_text_run_killed_mid_epoch_resumes_bit_identical() {
    let data = format!("dataset = \"jsonl\"\n\n[data.jsonl]\ntrain = [\"train.jsonl\"]\n{TEXT}");
    killed_and_resumed_with(write_jsonl_documents, &|dir| text_spec(dir, &data));
}

/// The paragraphs as a Parquet text column of row groups of 500, written by pyarrow.
fn write_parquet_documents(dir: &Path) {
    let script = "import pyarrow as pa, pyarrow.parquet as pq\n\
                  pq.write_table(pa.table({'text': paragraphs}), os.path.join(sys.argv[1], 'train.parquet'), \
                  row_group_size=500)";
    assert!(write_documents(dir, "pyarrow", script));
}

#[test]
fn a_parquet_text_run_killed_mid_epoch_resumes_bit_identical() {
    if pyarrow() {
        let data = format!("dataset = \"parquet\"\n\n[data.parquet]\ntrain = [\"train.parquet\"]\n{TEXT}");
        killed_and_resumed_with(write_parquet_documents, &|dir| text_spec(dir, &data));
    }
}

/// The paragraphs as a `Dataset`'s text column that `datasets` saved in 3 shards.
fn write_hf_datasets_documents(dir: &Path) {
    let script = "import datasets\n\
                  datasets.Dataset.from_dict({'text': paragraphs}).save_to_disk(sys.argv[1], num_shards=3)";
    assert!(write_documents(dir, "datasets", script));
}

#[test]
fn a_hf_datasets_text_run_killed_mid_epoch_resumes_bit_identical() {
    if hf_datasets() {
        let data = format!("dataset = \"hf_datasets\"\n\n[data.hf_datasets]\n{TEXT}");
        killed_and_resumed_with(write_hf_datasets_documents, &|dir| text_spec(dir, &data));
    }
}
