//! The `text` and `tokens` sources end to end, the way a user runs them: a character model on
//! the Shakespeare corpus under every strategy (parameter_server aside), `vocab.json` in the run
//! folder, per-position losses averaged over the global batch's positions (two workers give what
//! one process gives), a located error for a validation character outside the vocabulary, and
//! token files as `np.ndarray.tofile` writes them.
//!
//! The model is the smallest one that outputs logits at every position from today's layers: the
//! token id as a 1×1 "image" per position, a 1×1 convolution to the vocabulary. It can learn the
//! character frequencies (about 3.3 nats) from ln 73 = 4.29 at the start, which is what the tests
//! check; a real language model needs the transformer layers.

mod common;

use common::{assert_exit, json, run, tempdir, text};
use std::path::{Path, PathBuf};

const BLOCK: usize = 16;
/// Characters in the training plays.
const VOCAB: usize = 73;

fn shakespeare() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/shakespeare");
    std::fs::canonicalize(&dir).unwrap_or(dir)
}

/// A spec training the per-position model on `[data]` (given as TOML lines) for 100 steps.
fn spec(dir: &Path, data: &str, strategy: &str, vocab: usize) -> PathBuf {
    let text = format!(
        r#"
[run]
name = "text"
seed = 3
out_dir = "{out}"

{data}

{strategy}

[batch]
global = 32

[optimizer]
kind = "sgd"
learning_rate = 0.01

[model]
[[model.layers]]
type = "reshape"
target_shape = [{BLOCK}, 1, 1]

[[model.layers]]
type = "conv2d"
filters = {vocab}
kernel_size = 1

[train]
epochs = 1
steps_per_epoch = 100
validation_steps = 8
from_logits = true
"#,
        out = dir.join("run").display()
    );
    let path = dir.join("spec.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn text_data(dir: &Path) -> String {
    format!(
        r#"[data]
dataset = "text"
dir = "{}"

[data.text]
train = ["train.txt"]
validation = ["val.txt"]
block_size = {BLOCK}"#,
        dir.display()
    )
}

/// Trains and returns `summary.json`.
fn train(spec: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![spec.to_str().unwrap(), "--quiet", "--set", "run.threads=1"];
    args.extend(extra);
    let out = run(&args);
    assert_exit(&out, 0);
    json(&spec.parent().unwrap().join("run/summary.json"))
}

const STRATEGIES: [(&str, &str); 4] = [
    ("default", ""),
    ("mirrored", "[strategy]\nkind = \"mirrored\"\ndevices = [\"cpu:0\", \"cpu:1\"]"),
    ("central_storage", "[strategy]\nkind = \"central_storage\"\ndevices = [\"cpu:0\", \"cpu:1\"]"),
    ("multi_worker_mirrored", "[strategy]\nkind = \"multi_worker_mirrored\"\n\n[cluster]\nworker = 2"),
];

#[test]
fn a_char_model_trains_on_shakespeare_under_every_strategy() {
    let mut early = vec![];
    for (name, strategy) in STRATEGIES {
        let dir = tempdir();
        let spec = spec(dir.path(), &text_data(&shakespeare()), strategy, VOCAB);
        let s = train(&spec, &[]);
        let loss = s["test_loss"].as_f64().unwrap_or(f64::NAN);
        // Far below ln 73 = 4.29: the per-position labels and loss reach the model.
        assert!(loss < 3.9, "{name}: test loss {loss}");
        let vocab = json(&dir.path().join("run/vocab.json"));
        assert_eq!(vocab["tokenization"], "char", "{name}");
        let tokens = vocab["tokens"].as_array().unwrap();
        assert_eq!(tokens.len(), VOCAB, "{name}");
        assert_eq!((tokens[0].as_str(), tokens[1].as_str()), (Some("\n"), Some(" ")), "{name}: sorted");
        // Five steps, before this unstable little model amplifies summation-order rounding.
        let s = train(&spec, &["--set", "train.steps_per_epoch=5"]);
        early.push((name, s["train_loss"].as_f64().unwrap_or(f64::NAN), s["test_loss"].as_f64().unwrap_or(f64::NAN)));
    }
    // The loss is the mean over every position of the global batch, wherever the positions are
    // computed: replicas and workers give what one process gives (up to summation order). A
    // mean per replica or per worker would double the step of the two-way runs.
    let (_, train, test) = early[0];
    for (name, t, v) in &early[1..] {
        assert!(
            (t - train).abs() < 1e-6 * train && (v - test).abs() < 1e-6 * test,
            "{name}: {t}, {v} vs {train}, {test}"
        );
    }
}

#[test]
fn a_validation_char_outside_the_vocabulary_exits_4_naming_it() {
    let dir = tempdir();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("train.txt"), "to be or not to be, that is the question\n".repeat(4)).unwrap();
    std::fs::write(data.join("val.txt"), "to be\nor not tQ be\n".repeat(4)).unwrap();
    let out = run(&[spec(dir.path(), &text_data(&data), "", 15).to_str().unwrap(), "--quiet"]);
    assert_exit(&out, 4);
    let (_, stderr) = text(&out);
    assert!(stderr.contains("val.txt:2:9: the character 'Q' (U+0051) is not in the vocabulary"), "{stderr}");
    assert!(!dir.path().join("run/summary.json").exists());
}

/// Writes `ids` as `np.array(ids, dtype=np.uint16).tofile(path)` does: with numpy itself when it
/// is installed, else by hand (little-endian, no header).
fn write_u16(path: &Path, ids: &[u16]) {
    let list: Vec<String> = ids.iter().map(u16::to_string).collect();
    let script = format!("import numpy as np; np.array([{}], dtype=np.uint16).tofile({:?})", list.join(","), path);
    let numpy = std::process::Command::new("python3").args(["-c", &script]).status().is_ok_and(|s| s.success());
    if !numpy {
        eprintln!("skipped: numpy is not installed; the token file is written by hand instead");
        let bytes: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
        std::fs::write(path, bytes).unwrap();
    }
}

#[test]
fn token_files_train_and_check_their_ids() {
    let dir = tempdir();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    // The plays as ids of their sorted bytes (small ids suit the tiny model): a real corpus, 20k
    // tokens.
    let text: Vec<u8> = std::fs::read(shakespeare().join("train.txt")).unwrap().into_iter().take(20_000).collect();
    let mut bytes = text.clone();
    bytes.sort_unstable();
    bytes.dedup();
    let ids: Vec<u16> = text.iter().map(|b| bytes.binary_search(b).unwrap() as u16).collect();
    write_u16(&data.join("train.bin"), &ids);
    write_u16(&data.join("val.bin"), &ids[..2_000]);
    let tokens = format!(
        "[data]\ndataset = \"tokens\"\ndir = \"{}\"\n\n[data.tokens]\ntrain = [\"train.bin\"]\nvalidation = [\"val.bin\"]\nvocab_size = 128\nblock_size = {BLOCK}",
        data.display()
    );
    let path = spec(dir.path(), &tokens, "", 128);
    let out = run(&["check", path.to_str().unwrap()]);
    assert_exit(&out, 0);
    let (stdout, _) = common::text(&out);
    let windows = 20_000 - BLOCK;
    assert!(
        stdout.contains(&format!(
            "tokens: {windows} train / 124 test examples of 16, 128 classes at each of 16 positions"
        )),
        "{stdout}"
    );
    let s = train(&path, &[]);
    assert!(s["test_loss"].as_f64().is_some_and(|l| l < 128f64.ln() - 0.5), "{s}");

    // An id past vocab_size is located by its byte offset.
    let mut bad = ids.clone();
    bad[5] = 300;
    write_u16(&data.join("train.bin"), &bad);
    let out = run(&[path.to_str().unwrap(), "--quiet"]);
    assert_exit(&out, 4);
    let (_, stderr) = common::text(&out);
    assert!(
        stderr.contains("train.bin at byte 10: token id 300 is not below data.tokens.vocab_size = 128"),
        "{stderr}"
    );
}

/// Peak resident memory of a short run on a token file of `tokens` u16 ids without
/// `vocab_size` (the largest id, 59, only in the file's last megabyte), and the classes it
/// found.
fn peak_rss_mb_on_tokens(tokens: usize) -> (f64, u64) {
    use std::io::Write as _;
    let dir = tempdir();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let chunk: Vec<u8> = (0..1 << 19).flat_map(|i: usize| ((i * 7919 % 50) as u16).to_le_bytes()).collect();
    let mut out = std::io::BufWriter::new(std::fs::File::create(data.join("train.bin")).unwrap());
    for _ in 0..tokens / (1 << 19) - 1 {
        out.write_all(&chunk).unwrap();
    }
    let last: Vec<u8> = (0..1 << 19).flat_map(|i: usize| ((i * 7919 % 60) as u16).to_le_bytes()).collect();
    out.write_all(&last).unwrap();
    out.flush().unwrap();
    drop(out);
    std::fs::write(data.join("val.bin"), &chunk[..4096]).unwrap();
    let tokens = format!(
        "[data]\ndataset = \"tokens\"\ndir = \"{}\"\n\n[data.tokens]\ntrain = [\"train.bin\"]\nvalidation = [\"val.bin\"]\nblock_size = {BLOCK}",
        data.display()
    );
    let path = spec(dir.path(), &tokens, "", 60);
    // Windows in file order: a shuffled window maps its part of the file (with the large folios
    // the page cache may hold, up to 2 MB a fault), which is not the scan this measures.
    let s = train(
        &path,
        &["--set", "train.steps_per_epoch=2", "--set", "train.validation_steps=1", "--set", "data.shuffle_buffer=0"],
    );
    let check = run(&["check", path.to_str().unwrap(), "--json"]);
    assert_exit(&check, 0);
    let plan: serde_json::Value = serde_json::from_slice(&check.stdout).unwrap();
    let classes = plan["data"]["facts"]["labels"]["classes"].as_u64().unwrap_or(0);
    (s["peak_rss_mb"].as_f64().unwrap_or(0.0), classes)
}

#[test]
fn finding_a_token_files_vocabulary_keeps_memory_bounded() {
    // 2 MB and 192 MB of ids: scanning the mapping for the largest id made the whole file
    // resident (192 MB more); a scan read a chunk at a time adds a megabyte.
    let (small, small_classes) = peak_rss_mb_on_tokens(1 << 20);
    let (big, big_classes) = peak_rss_mb_on_tokens(96 << 20);
    assert_eq!((small_classes, big_classes), (60, 60), "the last megabyte's id 59 was found");
    assert!(small > 0.0 && big - small < 32.0, "peak RSS {small:.1} MB on 2 MB of ids, {big:.1} MB on 192 MB");
}
