//! The `jsonl` source end to end through the binary, on files Python's `json`, `gzip` and
//! `zstandard` wrote: a table trained under every strategy, the same weights from plain, gzip
//! and zstd copies of one file, the Shakespeare plays as documents for a character model, and a
//! malformed line refused with exit 4 naming file, line, column and byte, with no run claiming
//! to have completed. (Killed-and-resumed runs are in `tests/data_resume.rs`.)

mod common;

use common::sources::STRATEGIES;
use common::{assert_exit, json, run, tempdir, text, with_python};
use std::path::{Path, PathBuf};

/// Writes `train.jsonl` (256 rows) and `test.jsonl` (64) with Python's `json`, plus gzip and
/// (when `zstandard` imports) zstd copies of the training file: 16 `pixels` bright in the top
/// or bottom half, the class as a name in `kind`, and a field the table does not read.
const TABLES: &str = r#"
import gzip, json, os, sys
d = sys.argv[1]
def rows(n, offset):
    for i in range(n):
        c = (i + offset) % 2
        pixels = [((p // 8 == c) * 170 + (i * 31 + p * 7 + offset) % 80) / 255 for p in range(16)]
        yield json.dumps({"id": i, "pixels": pixels, "kind": ["top", "bottom"][c], "note": "é 漢字 🙂"}, ensure_ascii=False)
train = "\n".join(rows(256, 0)) + "\n"
with open(os.path.join(d, "train.jsonl"), "w", encoding="utf-8") as f:
    f.write(train)
with open(os.path.join(d, "test.jsonl"), "w", encoding="utf-8") as f:
    f.write("\n".join(rows(64, 1)) + "\n")
with gzip.open(os.path.join(d, "train.jsonl.gz"), "wt", encoding="utf-8") as f:
    f.write(train)
try:
    import zstandard
    with open(os.path.join(d, "train.jsonl.zst"), "wb") as f:
        f.write(zstandard.ZstdCompressor().compress(train.encode("utf-8")))
except ImportError:
    print("no zstandard")
"#;

fn spec(dir: &Path, data: &str, strategy: &str, model: &str) -> PathBuf {
    common::sources::spec(dir, "jsonl", data, strategy, model)
}

const CLASSIFIER: &str = "[[model.layers]]\ntype = \"dense\"\nunits = 2";

fn table(train: &str) -> String {
    format!(
        "dataset = \"jsonl\"\n\n[data.jsonl]\ntrain = [\"{train}\"]\nvalidation = [\"test.jsonl\"]\n\
         table = {{ label = \"kind\", features = [\"pixels\"] }}"
    )
}

fn train(spec: &Path) -> serde_json::Value {
    train_with(spec, "optimizer.learning_rate=0.2")
}

fn train_with(spec: &Path, set: &str) -> serde_json::Value {
    let out = run(&[spec.to_str().unwrap(), "--quiet", "--set", "run.threads=1", "--set", set]);
    assert_exit(&out, 0);
    json(&spec.with_file_name("run").join("summary.json"))
}

#[test]
fn a_table_python_wrote_trains_under_every_strategy() {
    for (name, strategy) in STRATEGIES {
        let dir = tempdir();
        if !with_python("json", TABLES, dir.path()) {
            return;
        }
        let s = train(&spec(dir.path(), &table("train.jsonl"), strategy, CLASSIFIER));
        assert!(s["test_accuracy"].as_f64().unwrap_or(0.0) > 0.95, "{name}: {s}");
        let classes = std::fs::read_to_string(dir.path().join("run/classes.json")).unwrap();
        assert!(classes.contains("\"bottom\"") && classes.contains("\"top\""), "{classes}");
    }
}

#[test]
fn plain_gzip_and_zstd_copies_train_to_the_same_weights() {
    let dir = tempdir();
    if !with_python("json", TABLES, dir.path()) {
        return;
    }
    let mut names = vec!["train.jsonl", "train.jsonl.gz"];
    if dir.path().join("train.jsonl.zst").exists() {
        names.push("train.jsonl.zst");
    } else {
        eprintln!(
            "\n*** skipped: python3 cannot import zstandard (python3 -m pip install zstandard): zstd not cross-checked ***\n"
        );
    }
    let weights: Vec<serde_json::Value> = names
        .iter()
        .map(|name| train(&spec(dir.path(), &table(name), "", CLASSIFIER))["weights_sha256"].clone())
        .collect();
    assert!(weights.iter().all(|w| w == &weights[0] && w.is_string()), "{names:?}: {weights:?}");
}

/// The plays, one document per paragraph, by Python's `json`: gzip-compressed
/// (`{train,val}.jsonl.gz`) and plain (`train.jsonl`).
const DOCUMENTS: &str = r#"
import gzip, json, os, sys
d, here = sys.argv[1], sys.argv[2]
for split in ["train", "val"]:
    text = open(os.path.join(here, split + ".txt"), encoding="utf-8").read()
    lines = [json.dumps({"text": p}) + "\n" for p in text.split("\n\n") if p.strip()]
    with gzip.open(os.path.join(d, split + ".jsonl.gz"), "wt", encoding="utf-8") as f:
        f.writelines(lines)
    if split == "train":
        with open(os.path.join(d, "train.jsonl"), "w", encoding="utf-8") as f:
            f.writelines(lines)
"#;

const BLOCK: usize = 16;

#[test]
fn documents_train_a_character_model_and_write_its_vocabulary() {
    let dir = tempdir();
    let plays = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/shakespeare");
    // The plays' folder follows the data folder as the script's second argument.
    let script = format!("import sys; sys.argv.append({:?})\n{DOCUMENTS}", plays.display().to_string());
    if !with_python("json", &script, dir.path()) {
        return;
    }
    let data = format!(
        "dataset = \"jsonl\"\n\n[data.jsonl]\ntrain = [\"train.jsonl.gz\"]\nvalidation = [\"val.jsonl.gz\"]\n\
         text = {{ block_size = {BLOCK}, end_of_text = \"\\n\\n\", vocabulary = \"train_and_validation\" }}"
    );
    // Paragraphs joined again by "\n\n" hold the characters of the plays.
    let read = |split: &str| std::fs::read_to_string(plays.join(format!("{split}.txt"))).unwrap();
    let vocab = (read("train") + &read("val")).chars().collect::<std::collections::BTreeSet<_>>().len();
    let spec = spec(dir.path(), &data, "", &common::sources::character_model(vocab));
    let check = run(&["check", spec.to_str().unwrap()]);
    let (shown, errors) = text(&check);
    assert_exit(&check, 0);
    assert!(shown.contains(&format!("{vocab} classes at each of {BLOCK} positions")), "{shown}{errors}");
    let s = train_with(&spec, common::sources::CHARACTER_MODEL_LEARNING_RATE);
    // The model predicts from the character it reads: below the plays' unigram entropy (3.32
    // nats), where knowing only how often each character comes would end.
    let unigram = common::sources::unigram_entropy();
    assert!(s["test_loss"].as_f64().unwrap_or(9.0) < unigram, "unigram entropy {unigram:.3}: {s}");
    let written = json(&dir.path().join("run/vocab.json"));
    assert_eq!(written["tokenization"], "char");
    assert_eq!(written["tokens"].as_array().map(Vec::len), Some(vocab));
}

/// Documents as a text field, plain training and gzip validation files, under every strategy.
#[test]
fn a_text_field_trains_a_character_model_under_every_strategy() {
    let data = format!(
        "dataset = \"jsonl\"\n\n[data.jsonl]\ntrain = [\"train.jsonl\"]\nvalidation = [\"val.jsonl.gz\"]\n\
         text = {{ block_size = {BLOCK}, end_of_text = \"\\n\\n\", vocabulary = \"train_and_validation\" }}"
    );
    common::sources::trains_a_character_model_under_every_strategy("jsonl", "json", DOCUMENTS, &data, BLOCK);
}

#[test]
fn a_malformed_line_exits_4_naming_file_line_column_and_byte() {
    let dir = tempdir();
    let good = "{\"pixels\": [0.5, 0.5], \"kind\": \"top\"}\n";
    std::fs::write(dir.path().join("test.jsonl"), good).unwrap();
    std::fs::write(dir.path().join("train.jsonl"), format!("{good}{good}{{\"pixels\": [0.5, 0.5] \"kind\": 1}}\n"))
        .unwrap();
    let spec = spec(dir.path(), &table("train.jsonl"), "", CLASSIFIER);
    let out = run(&[spec.to_str().unwrap(), "--quiet"]);
    assert_exit(&out, 4);
    let (_, stderr) = text(&out);
    assert!(stderr.contains("train.jsonl:3:23 (byte 98): invalid JSON: expected `,` or `}`"), "{stderr}");
    let run_dir = dir.path().join("run");
    assert!(!run_dir.join("summary.json").exists());
    if run_dir.join("run.json").exists() {
        let record = json(&run_dir.join("run.json"));
        assert_ne!(record["status"], "completed", "{record}");
    }
}

/// Peak resident memory of a run over one epoch of a JSONL table of `rows` rows of 256 small
/// whole numbers (512 bytes of JSON a row, 1 KB as floats).
fn peak_rss_mb_on_a_table(rows: usize) -> f64 {
    use std::io::Write as _;
    let dir = tempdir();
    let mut out = std::io::BufWriter::new(std::fs::File::create(dir.path().join("big.jsonl")).unwrap());
    for i in 0..rows {
        let x: Vec<String> = (0..256).map(|p| ((i * 7 + p * 3) % 10).to_string()).collect();
        writeln!(out, "{{\"x\":[{}],\"y\":{}}}", x.join(","), i % 2).unwrap();
    }
    out.flush().unwrap();
    drop(out);
    let data = "dataset = \"jsonl\"\n\n[data.jsonl]\ntrain = [\"big.jsonl\"]\ntable = { label = \"y\" }";
    let spec = spec(dir.path(), data, "", CLASSIFIER);
    let text = std::fs::read_to_string(&spec).unwrap();
    // One epoch, every row read once.
    std::fs::write(&spec, text.replace("steps_per_epoch = 60\n", "").replace("global = 16", "global = 1024")).unwrap();
    let s = train(&spec);
    assert_eq!(s["examples"].as_u64(), Some(rows as u64 / 1024 * 1024), "{s}");
    s["peak_rss_mb"].as_f64().unwrap_or(0.0)
}

#[test]
fn a_table_streams_in_bounded_memory_whatever_its_size() {
    // 2 MB and 20 MB of JSON: held whole, the larger table's rows would add 36 MB as floats;
    // streamed, both hold the shuffle buffer's 1,024 rows.
    let (small, big) = (peak_rss_mb_on_a_table(4_000), peak_rss_mb_on_a_table(40_000));
    assert!(small > 0.0 && big - small < 12.0, "peak RSS {small:.1} MB for 4,000 rows, {big:.1} MB for 40,000");
}

#[test]
fn two_workers_read_one_file_each_and_every_row_once_an_epoch() {
    let dir = tempdir();
    for (f, rows) in [(0, 300), (1, 340)] {
        let text: String = (0..rows)
            .map(|i| format!("{{\"x\": [{}, {}], \"y\": \"{}\"}}\n", i % 2, (i % 5) as f32 / 10.0, ["a", "b"][i % 2]))
            .collect();
        std::fs::write(dir.path().join(format!("p{f}.jsonl")), text).unwrap();
    }
    let data = "dataset = \"jsonl\"\n\n[data.jsonl]\ntrain = [\"p0.jsonl\", \"p1.jsonl\"]\ntable = { label = \"y\" }\n\
                shuffle_buffer = 64";
    let spec = common::sources::spec_training(
        dir.path(),
        "jsonl",
        data,
        "[strategy]\nkind = \"multi_worker_mirrored\"\n\n[cluster]\nworker = 2",
        CLASSIFIER,
        "",
    );
    let check = run(&["check", spec.to_str().unwrap()]);
    let (shown, errors) = text(&check);
    assert_exit(&check, 0);
    assert!(shown.contains("shuffle buffer of 64") && shown.contains("file policy, 2 shards"), "{shown}{errors}");
    let s = train(&spec);
    // One epoch of 40 global batches of 16 (the total count's), each worker streaming its file.
    assert_eq!((s["steps"].as_u64(), s["examples"].as_u64()), (Some(40), Some(640)), "{s}");
}
