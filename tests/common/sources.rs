//! What the data-source tests share: the five strategies every source trains under, the
//! small classifier spec they train (SGD, 60 steps of 16, one thread a task), and the
//! character model the text sources train on the Shakespeare plays.

use std::path::{Path, PathBuf};

/// Each strategy's spec sections, by name.
pub const STRATEGIES: [(&str, &str); 5] = [
    ("default", ""),
    ("mirrored", "[strategy]\nkind = \"mirrored\"\ndevices = [\"cpu:0\", \"cpu:1\"]"),
    ("central_storage", "[strategy]\nkind = \"central_storage\"\ndevices = [\"cpu:0\", \"cpu:1\"]"),
    ("multi_worker_mirrored", "[strategy]\nkind = \"multi_worker_mirrored\"\n\n[cluster]\nworker = 2"),
    ("parameter_server", "[strategy]\nkind = \"parameter_server\"\n\n[cluster]\nchief = 1\nworker = 2\nps = 1"),
];

/// Writes `dir/spec.toml`: run `name` into `dir/run` on the `data` sections (data files under
/// `dir`), under `strategy`, with `model`'s layers, 60 steps.
pub fn spec(dir: &Path, name: &str, data: &str, strategy: &str, model: &str) -> PathBuf {
    spec_training(dir, name, data, strategy, model, "steps_per_epoch = 60")
}

/// As [`spec`], with `train` (lines of `[train]`: the steps, a loss) instead of 60 steps.
pub fn spec_training(dir: &Path, name: &str, data: &str, strategy: &str, model: &str, train: &str) -> PathBuf {
    let text = format!(
        r#"
[run]
name = "{name}"
seed = 3
out_dir = "{out}"

[data]
dir = "{data_dir}"
{data}

{strategy}

[batch]
global = 16

[optimizer]
kind = "sgd"
learning_rate = 0.2

[model]
{model}

[train]
epochs = 1
{train}
from_logits = true
"#,
        out = dir.join("run").display(),
        data_dir = dir.display(),
    );
    let path = dir.join("spec.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The Shakespeare plays' folder (`train.txt`, `val.txt`).
pub fn plays() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/shakespeare")
}

/// The character model of the text sources' tests: each position's token through an embedding
/// of 16 and a dense layer to the `vocab` classes, so each position predicts the next character
/// from the one it reads (a bigram model). Trained at [`CHARACTER_MODEL_LEARNING_RATE`] for 60
/// steps of 16 windows it ends at a test loss of 3.02 to 3.05 nats over seeds 1 to 8 (the
/// plays' unigram entropy is 3.32, the uniform guess ln 73 = 4.29).
pub fn character_model(vocab: usize) -> String {
    format!(
        "[[model.layers]]\ntype = \"embedding\"\noutput_dim = 16\n\n[[model.layers]]\n\
         type = \"positionwise_dense\"\nunits = {vocab}"
    )
}

/// SGD's learning rate for [`character_model`].
pub const CHARACTER_MODEL_LEARNING_RATE: &str = "optimizer.learning_rate=2.0";

/// The entropy, in nats, of the characters of the plays' training text: the loss of a model
/// that knows only how often each character comes. A model below it has learnt from the
/// characters it reads, which is sturdier evidence of training than a bar set between the
/// uniform guess and it (the raw-id model once checked against 4.0 ended between 3.5 and 4.8
/// depending on the seed).
pub fn unigram_entropy() -> f64 {
    let text = std::fs::read_to_string(plays().join("train.txt")).unwrap();
    let mut counts = std::collections::BTreeMap::<char, f64>::new();
    for c in text.chars() {
        *counts.entry(c).or_default() += 1.0;
    }
    let n: f64 = counts.values().sum();
    -counts.values().map(|k| k / n * (k / n).ln()).sum::<f64>()
}

/// Checks `spec` (a text source over the plays' paragraphs, windows of `block` tokens, the
/// vocabulary from both splits): `check` shows one class per character of the plays at each
/// position, and the [`character_model`] trains to a test loss below the plays' unigram entropy.
pub fn trains_a_character_model(spec: &Path, block: usize) {
    let read = |split: &str| std::fs::read_to_string(plays().join(format!("{split}.txt"))).unwrap();
    let vocab = (read("train") + &read("val")).chars().collect::<std::collections::BTreeSet<_>>().len();
    let text = std::fs::read_to_string(spec).unwrap();
    std::fs::write(spec, text.replacen("[model]\n", &format!("[model]\n{}\n", character_model(vocab)), 1)).unwrap();
    let check = super::run(&["check", spec.to_str().unwrap()]);
    let (shown, errors) = super::text(&check);
    super::assert_exit(&check, 0);
    assert!(shown.contains(&format!("{vocab} classes at each of {block} positions")), "{shown}{errors}");
    let out = super::run(&[
        spec.to_str().unwrap(),
        "--quiet",
        "--set",
        "run.threads=1",
        "--set",
        CHARACTER_MODEL_LEARNING_RATE,
    ]);
    super::assert_exit(&out, 0);
    let s = super::json(&spec.with_file_name("run").join("summary.json"));
    let unigram = unigram_entropy();
    assert!(s["test_loss"].as_f64().unwrap_or(9.0) < unigram, "unigram entropy {unigram:.3}: {s}");
}

/// Trains the [`character_model`] on the plays' paragraphs under each of the [`STRATEGIES`]
/// ([`trains_a_character_model`]): `script` (Python, `module` importable, the plays' folder its
/// second argument) writes the files into a fresh data folder for each strategy, which `data`
/// (the `[data]` sections, windows of `block` tokens) reads, in a run called `name`. Skipped, loudly, when `module`
/// does not import. The multi-process strategies' tasks (workers, a chief) each open the one
/// token cache.
pub fn trains_a_character_model_under_every_strategy(name: &str, module: &str, script: &str, data: &str, block: usize) {
    let script = format!("import sys; sys.argv.append({:?})\n{script}", plays().display().to_string());
    for (strategy_name, strategy) in STRATEGIES {
        let dir = super::tempdir();
        if !super::with_python(module, &script, dir.path()) {
            return;
        }
        eprintln!("strategy {strategy_name}");
        trains_a_character_model(&spec(dir.path(), name, data, strategy, ""), block);
    }
}
