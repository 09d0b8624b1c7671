//! The TensorBoard event files a run writes, read back with TensorBoard's own reader (the
//! `tensorboard` Python package, which `.ci/run` installs). Without it the test says so loudly
//! and skips.

mod common;

use common::{assert_exit, run, tempdir};
use serde_json::Value;
use std::io::Write as _;
use std::path::Path;
use std::process::Command;

/// Reads every scalar under `logdir/{train,validation}` with TensorBoard's EventAccumulator:
/// `{"train": {"batch_loss": [[step, value], …]}, "validation": {…}}`.
const READER: &str = r#"
import json, sys
from tensorboard.backend.event_processing import event_accumulator
out = {}
for sub in ("train", "validation"):
    ea = event_accumulator.EventAccumulator(sys.argv[1] + "/" + sub, size_guidance={"scalars": 0})
    ea.Reload()
    out[sub] = {t: [[e.step, e.value] for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}
print(json.dumps(out))
"#;

fn tensorboard_available() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import tensorboard.backend.event_processing.event_accumulator"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        // Straight to stderr: the test harness hides what `eprintln!` prints in passing tests.
        let _ = writeln!(
            std::io::stderr(),
            "\n*** SKIPPED: TensorBoard's reader is not installed (python3 -m pip install tensorboard); \
             the event files were not checked ***\n"
        );
    }
    ok
}

fn metrics(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn points(v: &Value) -> Vec<(u64, f64)> {
    v.as_array().map(|a| a.iter().filter_map(|p| Some((p[0].as_u64()?, p[1].as_f64()?))).collect()).unwrap_or_default()
}

fn close(a: &[(u64, f64)], b: &[(u64, f64)]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.0 == y.0 && (x.1 - y.1).abs() <= 1e-5 * y.1.abs().max(1.0))
}

#[test]
fn tensorboard_reads_the_scalars_of_a_run() {
    if !tensorboard_available() {
        return;
    }
    let dir = tempdir();
    let o = format!("run.out_dir={}", dir.path().display());
    let args = [
        "specs/mnist_single.toml",
        "-q",
        "--set",
        &o,
        "--set",
        "train.epochs=2",
        "--set",
        "train.steps_per_epoch=20",
        "--set",
        "train.evaluate_every_steps=10",
        "--set",
        "train.evaluate_every_epoch=true",
        "--set",
        "train.validation_steps=2",
        "--set",
        "run.log_every_steps=5",
    ];
    assert_exit(&run(&args), 0);
    let out = Command::new("python3")
        .args(["-c", READER, &dir.path().join("tensorboard").display().to_string()])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let read: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}"));
    let (train, validation) = (&read["train"], &read["validation"]);
    let mut tags: Vec<&str> = train.as_object().map(|o| o.keys().map(String::as_str).collect()).unwrap_or_default();
    tags.sort_unstable();
    assert_eq!(
        tags,
        [
            "batch_accuracy",
            "batch_examples_per_s",
            "batch_learning_rate",
            "batch_loss",
            "epoch_accuracy",
            "epoch_examples_per_s",
            "epoch_learning_rate",
            "epoch_loss"
        ]
    );

    // The same numbers as metrics.jsonl, at the same steps.
    let lines = metrics(dir.path());
    let from = |event: &str, key: &str, x: &str| -> Vec<(u64, f64)> {
        lines.iter().filter(|l| l["event"] == event).filter_map(|l| Some((l[x].as_u64()?, l[key].as_f64()?))).collect()
    };
    let batch_loss = points(&train["batch_loss"]);
    assert_eq!(batch_loss.iter().map(|p| p.0).collect::<Vec<_>>(), [5, 10, 15, 20, 25, 30, 35, 40]);
    assert!(close(&batch_loss, &from("step", "loss", "step")), "{batch_loss:?}");
    assert!(close(&points(&train["batch_learning_rate"]), &from("step", "learning_rate", "step")));
    assert!(close(&points(&train["epoch_loss"]), &from("epoch", "loss", "epoch")));
    assert!(close(&points(&train["epoch_accuracy"]), &from("epoch", "accuracy", "epoch")));
    assert!(points(&train["batch_examples_per_s"]).iter().all(|p| p.1 > 0.0));

    let val_epoch = points(&validation["epoch_loss"]);
    assert!(close(&val_epoch, &from("epoch", "val_loss", "epoch")), "{val_epoch:?}");
    let val_steps = points(&validation["evaluation_accuracy_vs_iterations"]);
    assert_eq!(val_steps.iter().map(|p| p.0).collect::<Vec<_>>(), [10, 20, 30, 40], "one point per evaluation");
    let mut evaluated: Vec<(u64, f64)> = from("evaluation", "val_accuracy", "step");
    evaluated.extend(from("epoch", "val_accuracy", "step"));
    evaluated.sort_by_key(|p| p.0);
    evaluated.dedup_by_key(|p| p.0);
    assert!(close(&val_steps, &evaluated), "{val_steps:?} vs {evaluated:?}");
}
