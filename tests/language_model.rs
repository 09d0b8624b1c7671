//! A character-level GPT end to end, the way a user runs one: `specs/shakespeare_char.toml`
//! shrunk to a few steps trains below the uniform loss on the Shakespeare corpus, writes
//! `vocab.json`, and `trainrun sample` continues a prompt from its weights, the same text for
//! the same seed; a prompt character outside the vocabulary is refused naming it.

mod common;

use common::{assert_exit, json, run, tempdir, text};
use std::path::Path;

/// Characters in the training plays: the uniform loss is ln 73 = 4.29.
const UNIFORM_LOSS: f64 = 4.290459441148391;

fn shakespeare() -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/shakespeare");
    std::fs::canonicalize(&dir).unwrap_or(dir).display().to_string()
}

/// The checked-in spec, small: one block of width 32, 80 steps.
fn small(out: &Path) -> Vec<String> {
    [
        format!("run.out_dir={}", out.display()),
        format!("data.dir={}", shakespeare()),
        "model.gpt.n_layer=1".into(),
        "model.gpt.n_head=2".into(),
        "model.gpt.n_embd=32".into(),
        "model.gpt.block_size=32".into(),
        "data.text.block_size=32".into(),
        "optimizer.warmup.steps=10".into(),
        "train.steps_per_epoch=80".into(),
        "train.validation_steps=10".into(),
    ]
    .into_iter()
    .flat_map(|s| ["--set".to_string(), s])
    .collect()
}

fn sample(spec_args: &[String], run_dir: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["sample", "specs/shakespeare_char.toml"];
    args.extend(spec_args.iter().map(String::as_str));
    let checkpoint = run_dir.display().to_string();
    args.extend(["--checkpoint", &checkpoint, "--tokens", "40"]);
    args.extend(extra);
    run(&args)
}

#[test]
fn a_small_gpt_learns_and_samples_the_same_text_for_the_same_seed() {
    let dir = tempdir();
    let out = dir.path().join("run");
    let set = small(&out);
    let mut args = vec!["specs/shakespeare_char.toml", "--quiet"];
    args.extend(set.iter().map(String::as_str));
    assert_exit(&run(&args), 0);
    let summary = json(&out.join("summary.json"));
    let loss = summary["test_loss"].as_f64().unwrap_or(f64::NAN);
    assert!(loss < UNIFORM_LOSS - 0.8, "validation loss {loss} after 80 steps");
    let vocab = json(&out.join("vocab.json"));
    assert_eq!(vocab["tokens"].as_array().map(Vec::len), Some(73), "{vocab}");

    let first = sample(&set, &out, &["--prompt", "ROMEO:", "--seed", "7", "--top-k", "10"]);
    assert_exit(&first, 0);
    let again = sample(&set, &out, &["--prompt", "ROMEO:", "--seed", "7", "--top-k", "10"]);
    let other = sample(&set, &out, &["--prompt", "ROMEO:", "--seed", "8", "--top-k", "10"]);
    let (a, b, c) = (text(&first).0, text(&again).0, text(&other).0);
    assert!(a.starts_with("ROMEO:") && a.trim_end_matches('\n').chars().count() == 6 + 40, "{a:?}");
    assert_eq!(a, b, "the same seed gave different text");
    assert_ne!(a, c, "another seed gave the same text");

    let refused = sample(&set, &out, &["--prompt", "ROMEO€"]);
    assert_exit(&refused, 2);
    let stderr = text(&refused).1;
    assert!(stderr.contains("'€' at position 6 is not in the model's vocabulary"), "{stderr}");
}
