//! `mirrored` and `central_storage` end to end: several replicas in one process agree with one
//! replica on the same global batch, are deterministic, and say what they chose.

mod common;

use common::{assert_exit, json, run, tempdir, text, weights};
use std::path::Path;

fn train(dir: &Path, sets: &[&str]) -> serde_json::Value {
    let out = format!("run.out_dir={}", dir.display());
    let mut args = vec![
        "specs/mnist_single.toml",
        "-q",
        "--set",
        &out,
        "--set",
        "train.epochs=1",
        "--set",
        "train.steps_per_epoch=40",
    ];
    for s in sets {
        args.extend(["--set", s]);
    }
    assert_exit(&run(&args), 0);
    json(&dir.join("summary.json"))
}

fn difference(a: &Path, b: &Path) -> f64 {
    common::relative_difference(&weights(&a.join("model.safetensors")), &weights(&b.join("model.safetensors")))
}

#[test]
fn replicas_in_one_process_match_one_replica_on_the_same_global_batch() {
    let one = tempdir();
    train(one.path(), &["batch.global=96"]);
    for (strategy, replicas) in [
        ("{ kind = \"mirrored\", devices = 2 }", 2),
        (
            "{ kind = \"mirrored\", devices = [\"cpu:0\", \"cpu:1\", \"cpu:2\"], cross_device_ops = \"hierarchical_copy\" }",
            3,
        ),
        ("{ kind = \"central_storage\", devices = 3 }", 3),
    ] {
        let dir = tempdir();
        let s = train(dir.path(), &[&format!("strategy={strategy}"), "batch.global=96"]);
        assert_eq!(s["num_replicas_in_sync"], replicas, "{strategy}");
        let d = difference(dir.path(), one.path());
        assert!(d <= 1e-5, "{strategy}: relative difference {d}");
    }
}

#[test]
fn mirrored_runs_are_bit_identical() {
    let (a, b) = (tempdir(), tempdir());
    let sets =
        ["strategy={ kind = \"mirrored\", devices = 2 }", "batch.per_replica=32", "optimizer.learning_rate=0.05"];
    assert_eq!(train(a.path(), &sets)["weights_sha256"], train(b.path(), &sets)["weights_sha256"]);
}

#[test]
fn check_says_which_reduction_auto_picked() {
    let out = run(&["check", "specs/mnist_single.toml", "--set", "strategy={ kind = \"mirrored\", devices = 2 }"]);
    assert_exit(&out, 0);
    let (stdout, _) = text(&out);
    assert!(stdout.contains("reduction_to_one_device (auto: CPU devices)"), "{stdout}");
}

#[test]
fn clipping_acts_on_the_reduced_gradient_so_replicas_match_one_process() {
    let clipped =
        ["optimizer.kind=adamw", "optimizer.learning_rate=0.001", "batch.global=96", "optimizer.clip_norm=0.05"];
    let one = tempdir();
    train(one.path(), &clipped);
    let unclipped = tempdir();
    train(unclipped.path(), &clipped[..3]);
    let moved = difference(unclipped.path(), one.path());
    assert!(moved > 1e-3, "a 0.05 clip should change training, relative difference {moved}");
    for strategy in [
        "{ kind = \"mirrored\", devices = 2 }",
        "{ kind = \"mirrored\", devices = 3, cross_device_ops = \"reduction_to_one_device\" }",
    ] {
        let dir = tempdir();
        let sets: Vec<String> = clipped.iter().map(|s| s.to_string()).chain([format!("strategy={strategy}")]).collect();
        let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
        train(dir.path(), &sets);
        let d = difference(dir.path(), one.path());
        assert!(d <= 1e-5, "{strategy}: relative difference {d}");
    }
}
