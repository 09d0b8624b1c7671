//! The `parquet` source end to end through the binary, on files pyarrow wrote (skipped, loudly,
//! when pyarrow does not import): a table of fixed-size list pixels, a float column and string
//! classes, split into Hub-style shards of several row groups, trained under every strategy
//! (the multi-worker ones dealing row groups to workers under `auto`); the Shakespeare plays
//! as a text column for a character model; every codec pyarrow writes giving the same training
//! bits; and bad files refused with exit 4 naming the file
//! (a truncated footer at once, a corrupt page when the run reaches it, recorded as a failed
//! run); and `examples/mnist_parquet.toml` on the Parquet shards its script writes from MNIST.
//! Killed-and-resumed runs are in `tests/data_resume.rs`.

mod common;

use common::sources::STRATEGIES;
use common::{assert_exit, json, run, tempdir, text, with_python};
use std::path::{Path, PathBuf};

/// Writes `data/train-0000{0,1}-of-00002.parquet` (128 rows each, row groups of 32) and
/// `data/test.parquet` (64 rows) with pyarrow: 16 `pixels` (uint8) bright in the top or bottom
/// half, a float `bias`, the class as a name in `kind`, and a text column the table does not read.
const TABLES: &str = r#"
import os, sys
import pyarrow as pa, pyarrow.parquet as pq
d = os.path.join(sys.argv[1], "data")
os.makedirs(d, exist_ok=True)
def table(n, offset):
    rows = range(offset, offset + n)
    pixels = [[(p // 8 == i % 2) * 170 + (i * 31 + p * 7) % 80 for p in range(16)] for i in rows]
    return pa.table({
        "pixels": pa.array(pixels, type=pa.list_(pa.uint8(), 16)),
        "bias": pa.array([0.5] * n, type=pa.float64()),
        "kind": pa.array([["top", "bottom"][i % 2] for i in rows]),
        "note": pa.array(["é 漢字 🙂"] * n),
    })
for s in range(2):
    pq.write_table(table(128, 128 * s), os.path.join(d, f"train-{s:05d}-of-00002.parquet"), row_group_size=32)
pq.write_table(table(64, 1000), os.path.join(d, "test.parquet"))
"#;

fn spec(dir: &Path, data: &str, strategy: &str, model: &str) -> PathBuf {
    common::sources::spec(dir, "parquet", data, strategy, model)
}

const CLASSIFIER: &str = "[[model.layers]]\ntype = \"dense\"\nunits = 2";

const TABLE: &str = "dataset = \"parquet\"\n\n[data.parquet]\ntrain = [\"data/train-*.parquet\"]\n\
                     validation = [\"data/test.parquet\"]\nshuffle_buffer = 64\n\
                     table = { label = \"kind\", features = [\"pixels\", \"bias\"] }\n\n\
                     [data.preprocessing]\nrescale = 0.00392156862745098";

#[test]
fn a_table_pyarrow_wrote_trains_under_every_strategy() {
    for (name, strategy) in STRATEGIES {
        let dir = tempdir();
        if !with_python("pyarrow", TABLES, dir.path()) {
            return;
        }
        let spec = spec(dir.path(), TABLE, strategy, CLASSIFIER);
        let check = run(&["check", spec.to_str().unwrap()]);
        assert_exit(&check, 0);
        let shown = text(&check).0;
        assert!(shown.contains("256"), "{name}: {shown}");
        if name == "multi_worker_mirrored" {
            // 8 row groups for 2 workers: `auto` deals row groups.
            assert!(shown.contains("file policy, 2 shards"), "{shown}");
        }
        let out = run(&[spec.to_str().unwrap(), "--quiet", "--set", "run.threads=1"]);
        assert_exit(&out, 0);
        let s = json(&dir.path().join("run/summary.json"));
        assert!(s["test_accuracy"].as_f64().unwrap_or(0.0) > 0.95, "{name}: {s}");
        let classes = std::fs::read_to_string(dir.path().join("run/classes.json")).unwrap();
        assert!(classes.contains("\"bottom\"") && classes.contains("\"top\""), "{classes}");
    }
}

/// Rewrites every file `TABLES` wrote with codec `sys.argv[2]` (row groups kept), and checks
/// that pyarrow wrote that codec.
const RECOMPRESS: &str = r#"
import glob, os, sys
import pyarrow.parquet as pq
codec = sys.argv[2]
for path in glob.glob(os.path.join(sys.argv[1], "data", "*.parquet")):
    table = pq.read_table(path)
    pq.write_table(table, path, row_group_size=32, compression=codec)
    written = pq.ParquetFile(path).metadata.row_group(0).column(0).compression
    assert written == {"none": "UNCOMPRESSED"}.get(codec, codec.upper()), (path, written)
"#;

/// Every codec pyarrow writes (its default Snappy, and zstd, gzip, LZ4, Brotli, none) gives
/// the same training bits: the same rows reach the model in the same order.
#[test]
fn every_codec_pyarrow_writes_trains_the_same_bits() {
    let mut weights = vec![];
    for codec in ["snappy", "zstd", "gzip", "lz4", "brotli", "none"] {
        let dir = tempdir();
        let script = format!("import sys; sys.argv.append({codec:?})\n{TABLES}\n{RECOMPRESS}");
        if !with_python("pyarrow", &script, dir.path()) {
            return;
        }
        let spec = spec(dir.path(), TABLE, "", CLASSIFIER);
        let out = run(&[spec.to_str().unwrap(), "--quiet", "--set", "run.threads=1"]);
        assert_exit(&out, 0);
        let trained = common::weights(&dir.path().join("run/model.safetensors"));
        let bits: Vec<(String, Vec<u32>)> =
            trained.into_iter().map(|(name, w)| (name, w.iter().map(|v| v.to_bits()).collect())).collect();
        weights.push((codec, bits));
    }
    let (first, bits) = &weights[0];
    for (codec, other) in &weights[1..] {
        assert!(other == bits, "{codec} trained other weights than {first}");
    }
}

/// The plays' paragraphs as a `text` column, one Parquet file a split (row groups of 500).
const DOCUMENTS: &str = r#"
import os, sys
import pyarrow as pa, pyarrow.parquet as pq
d, here = sys.argv[1], sys.argv[2]
for split in ["train", "val"]:
    text = open(os.path.join(here, split + ".txt"), encoding="utf-8").read()
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    pq.write_table(pa.table({"id": list(range(len(paragraphs))), "text": paragraphs}),
                   os.path.join(d, split + ".parquet"), row_group_size=500)
"#;

const BLOCK: usize = 16;

#[test]
fn a_text_column_trains_a_character_model_under_every_strategy() {
    let data = format!(
        "dataset = \"parquet\"\n\n[data.parquet]\ntrain = [\"train.parquet\"]\nvalidation = [\"val.parquet\"]\n\
         text = {{ block_size = {BLOCK}, end_of_text = \"\\n\\n\", vocabulary = \"train_and_validation\" }}"
    );
    common::sources::trains_a_character_model_under_every_strategy("parquet", "pyarrow", DOCUMENTS, &data, BLOCK);
}

/// Overwrites the first page header of column `pixels` in the second row group of the first
/// training file, so its footer still reads and the run fails only when it reaches that page.
const CORRUPT: &str = r#"
import os, sys
import pyarrow.parquet as pq
path = os.path.join(sys.argv[1], "data", "train-00000-of-00002.parquet")
offset = pq.ParquetFile(path).metadata.row_group(1).column(0).data_page_offset
with open(path, "r+b") as f:
    f.seek(offset)
    f.write(b"\xff" * 24)
"#;

#[test]
fn bad_files_exit_4_naming_the_file_and_no_run_completes() {
    let dir = tempdir();
    if !with_python("pyarrow", TABLES, dir.path()) {
        return;
    }
    let spec = spec(dir.path(), TABLE, "", CLASSIFIER);
    let args = [spec.to_str().unwrap(), "--quiet", "--set", "data.parquet.shuffle_buffer=0"];
    // A wrong type names the column, its type and what was expected; a missing column the
    // columns there.
    let wrong = run(&[&args[..], &["--set", "data.parquet.table.features=[\"note\"]"]].concat());
    assert_exit(&wrong, 4);
    assert!(
        text(&wrong).1.contains("column `note` is Utf8; expected numbers, booleans or lists of numbers"),
        "{}",
        text(&wrong).1
    );
    let missing = run(&[&args[..], &["--set", "data.parquet.table.label=\"class\""]].concat());
    assert_exit(&missing, 4);
    assert!(
        text(&missing).1.contains("has no column `class`; its columns: pixels, bias, kind, note"),
        "{}",
        text(&missing).1
    );

    // A corrupt page, found mid-run.
    assert!(with_python("pyarrow", CORRUPT, dir.path()));
    let out = run(&args);
    assert_exit(&out, 4);
    let stderr = text(&out).1;
    assert!(stderr.contains("train-00000-of-00002.parquet: not a readable Parquet file"), "{stderr}");
    let run_dir = dir.path().join("run");
    assert!(!run_dir.join("summary.json").exists());
    let record = json(&run_dir.join("run.json"));
    assert_ne!(record["status"], "completed", "{record}");

    // A truncated footer, found before the run starts.
    let path = dir.path().join("data/train-00001-of-00002.parquet");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let out = run(&args);
    assert_exit(&out, 4);
    assert!(text(&out).1.contains("train-00001-of-00002.parquet: not a readable Parquet file"), "{}", text(&out).1);
}

#[test]
fn the_example_spec_trains_on_the_shards_its_script_writes() {
    let dir = tempdir();
    if !with_python("pyarrow", "", dir.path()) {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = root.join("examples/mnist_to_parquet.py");
    let out =
        std::process::Command::new("python3").arg(&script).arg(common::data_dir()).arg(dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let spec = root.join("examples/mnist_parquet.toml");
    let data_dir = format!("data.dir=\"{}\"", dir.path().display());
    let out_dir = format!("run.out_dir=\"{}\"", dir.path().join("run").display());
    let mut args = vec![spec.to_str().unwrap(), "--quiet", "--set", &data_dir, "--set", &out_dir];
    let check = run(&["check", spec.to_str().unwrap(), "--set", &data_dir]);
    assert_exit(&check, 0);
    assert!(text(&check).0.contains("60000"), "{}", text(&check).0);
    args.extend([
        "--set",
        "train.epochs=1",
        "--set",
        "train.steps_per_epoch=100",
        "--set",
        "optimizer.learning_rate=0.05",
    ]);
    assert_exit(&run(&args), 0);
    let s = json(&dir.path().join("run/summary.json"));
    assert!(s["test_accuracy"].as_f64().unwrap_or(0.0) > 0.8, "{s}");
}
