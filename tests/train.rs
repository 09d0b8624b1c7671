//! Training end to end on real MNIST, the way a user runs it.

mod common;

use common::{assert_exit, json, run, tempdir};
use std::path::Path;

fn train(spec: &str, out: &Path, extra: &[&str]) -> serde_json::Value {
    let dir = format!("run.out_dir={}", out.display());
    let mut args = vec![spec, "-q", "--set", &dir];
    args.extend_from_slice(extra);
    assert_exit(&run(&args), 0);
    json(&out.join("summary.json"))
}

fn epoch_losses(dir: &Path) -> Vec<f64> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["event"] == "epoch")
        .filter_map(|v| v["loss"].as_f64())
        .collect()
}

#[test]
fn the_tutorial_model_trains_on_real_mnist_and_records_the_run() {
    let tmp = tempdir();
    let s = train("specs/mnist_single.toml", tmp.path(), &[]);
    for key in [
        "train_loss",
        "train_accuracy",
        "test_loss",
        "test_accuracy",
        "steps",
        "examples",
        "wall_s",
        "input_wait_s",
        "steady_examples_per_s",
        "peak_rss_mb",
        "trainrun_version",
    ] {
        assert!(!s[key].is_null(), "summary.json lacks {key}: {s}");
    }
    assert_eq!(s["steps"], 210);
    assert_eq!(s["examples"], 210 * 64);
    // The pipeline prepares batches ahead: the loop waits a small part of the run at most.
    let (wait, wall) = (s["input_wait_s"].as_f64().unwrap_or(f64::NAN), s["wall_s"].as_f64().unwrap_or(0.0));
    assert!((0.0..wall / 2.0).contains(&wait), "input_wait_s {wait} of wall_s {wall}");
    let losses = epoch_losses(tmp.path());
    assert_eq!(losses.len(), 3);
    assert!(losses.windows(2).all(|w| w[1] < w[0]), "loss does not fall: {losses:?}");
    assert!(s["test_accuracy"].as_f64().unwrap_or(0.0) > 0.3, "{s}");
    assert!(tmp.path().join("spec.toml").is_file() && tmp.path().join("model.safetensors").is_file());
}

#[test]
fn the_same_spec_twice_gives_bit_identical_weights() {
    let (a, b, c) = (tempdir(), tempdir(), tempdir());
    let short = ["--set", "train.steps_per_epoch=25", "--set", "train.epochs=2"];
    let sa = train("specs/mnist_single.toml", a.path(), &short);
    let sb = train("specs/mnist_single.toml", b.path(), &short);
    assert_eq!(sa["weights_sha256"], sb["weights_sha256"]);
    let bytes = |d: &Path| std::fs::read(d.join("model.safetensors")).unwrap_or_default();
    assert!(bytes(a.path()) == bytes(b.path()) && !bytes(a.path()).is_empty());
    assert_eq!(sa["test_loss"], sb["test_loss"]);
    // A different seed gives different weights: the check above is not vacuous.
    let mut other = short.to_vec();
    other.extend(["--set", "run.seed=7"]);
    let sc = train("specs/mnist_single.toml", c.path(), &other);
    assert_ne!(sa["weights_sha256"], sc["weights_sha256"]);
}

#[test]
fn the_fast_spec_reaches_98_5_percent() {
    let tmp = tempdir();
    let s = train("specs/mnist_fast.toml", tmp.path(), &[]);
    let acc = s["test_accuracy"].as_f64().unwrap_or(0.0);
    assert!(acc >= 0.985, "test accuracy {acc}: {s}");
}

#[test]
fn stop_at_target_ends_training_early() {
    let tmp = tempdir();
    let s = train(
        "specs/mnist_single.toml",
        tmp.path(),
        &[
            "--set",
            "optimizer.learning_rate=0.05",
            "--set",
            "train.evaluate_every_steps=20",
            "--set",
            "callbacks=[{ kind = \"stop_at_target\", target = 0.8 }]",
        ],
    );
    assert_eq!(s["stopped"], "target_reached", "{s}");
    assert!(s["steps"].as_u64().unwrap_or(999) < 210, "{s}");
    assert!(s["test_accuracy"].as_f64().unwrap_or(0.0) >= 0.8, "{s}");
}

#[test]
fn gradient_accumulation_matches_the_larger_batch() {
    // 2 micro-batches of 32 are one step over the same 64 examples as a batch of 64.
    let (a, b) = (tempdir(), tempdir());
    let short = ["--set", "train.steps_per_epoch=10", "--set", "train.epochs=1"];
    let whole = train("specs/mnist_single.toml", a.path(), &short);
    let mut acc = short.to_vec();
    acc.extend(["--set", "batch.accumulation_steps=2"]);
    let split = train("specs/mnist_single.toml", b.path(), &acc);
    let (x, y) = (whole["test_loss"].as_f64().unwrap_or(0.0), split["test_loss"].as_f64().unwrap_or(1.0));
    assert!((x - y).abs() / x < 1e-4, "{x} vs {y}");
}

#[test]
fn weights_do_not_depend_on_the_thread_count() {
    // Same spec on a 1-core and a 2-core machine: the same weights, bit for bit.
    let (a, b) = (tempdir(), tempdir());
    let short = ["--set", "train.steps_per_epoch=20", "--set", "train.epochs=1"];
    let mut one = short.to_vec();
    one.extend(["--set", "run.threads=1"]);
    let mut two = short.to_vec();
    two.extend(["--set", "run.threads=2"]);
    let s1 = train("specs/mnist_single.toml", a.path(), &one);
    let s2 = train("specs/mnist_single.toml", b.path(), &two);
    assert_eq!(s1["weights_sha256"], s2["weights_sha256"]);
}
