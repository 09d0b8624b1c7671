//! The regression metrics `mae` and `rmse` end to end on a CSV regression: in `summary.json`,
//! in every line of `metrics.jsonl` (with `val_` on evaluations), in TensorBoard, under
//! default and multi_worker_mirrored; consistent with the loss they mirror (`rmse²` is the
//! mean squared error, `mae` the mean absolute error); refused on class labels.

mod common;

use common::{assert_exit, json, run, tempdir, text};
use std::path::{Path, PathBuf};

/// `y = 2·a - b + 0.5` on a grid, written as a CSV table.
fn write_regression(dir: &Path, name: &str, rows: usize, offset: usize) {
    let mut csv = String::from("a,y,b\n");
    for i in 0..rows {
        let a = ((i + offset) % 17) as f32 / 17.0 - 0.5;
        let b = ((i + offset) * 7 % 13) as f32 / 13.0 - 0.5;
        csv += &format!("{a},{},{b}\n", 2.0 * a - b + 0.5);
    }
    std::fs::write(dir.join(name), csv).unwrap();
}

fn spec(dir: &Path, strategy: &str, loss: &str, metrics: &str) -> PathBuf {
    let text = format!(
        r#"
[run]
name = "regression"
seed = 5
out_dir = "{out}"
log_every_steps = 10

[data]
dataset = "csv"
dir = "{data}"

[data.csv]
train = "train.csv"
test = "test.csv"
label = "y"

{strategy}

[batch]
global = 32

[optimizer]
kind = "sgd"
learning_rate = 0.1

[model]
[[model.layers]]
type = "dense"
units = 1

[train]
epochs = 2
steps_per_epoch = 40
loss = "{loss}"
metrics = {metrics}
"#,
        out = dir.join("run").display(),
        data = dir.display(),
    );
    let path = dir.join("spec.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn contains(dir: &Path, needle: &str) -> bool {
    std::fs::read_dir(dir).unwrap().flatten().any(|f| {
        let bytes = std::fs::read(f.path()).unwrap_or_default();
        bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
    })
}

#[test]
fn mae_and_rmse_are_written_everywhere_and_agree_with_the_losses() {
    let multi = "[strategy]\nkind = \"multi_worker_mirrored\"\n\n[cluster]\nworker = 2";
    for strategy in ["", multi] {
        for (loss, mirrored) in [("mean_squared_error", "rmse"), ("mean_absolute_error", "mae")] {
            let dir = tempdir();
            write_regression(dir.path(), "train.csv", 512, 0);
            write_regression(dir.path(), "test.csv", 64, 1000);
            let path = spec(dir.path(), strategy, loss, "[\"mae\", \"rmse\"]");
            let out = run(&[path.to_str().unwrap(), "--quiet", "--set", "run.threads=1"]);
            assert_exit(&out, 0);
            let run_dir = dir.path().join("run");
            let s = json(&run_dir.join("summary.json"));
            let get = |k: &str| s[k].as_f64().unwrap_or_else(|| panic!("{k} missing: {s}"));
            for split in ["train", "test"] {
                let (mae, rmse) = (get(&format!("{split}_mae")), get(&format!("{split}_rmse")));
                assert!(mae > 0.0 && mae <= rmse && rmse < 0.2, "{strategy} {loss} {split}: {s}");
            }
            // The metric the loss mirrors is the test loss, up to float summation.
            let (test_loss, m) = (get("test_loss"), get(&format!("test_{mirrored}")));
            let expected = if mirrored == "rmse" { test_loss.sqrt() } else { test_loss };
            assert!((m - expected).abs() <= 1e-5 * expected.max(1e-3), "{loss}: {m} vs {expected}: {s}");

            let metrics = lines(&run_dir.join("metrics.jsonl"));
            assert!(metrics.iter().all(|l| l["mae"].is_f64() && l["rmse"].is_f64()), "{metrics:?}");
            let evaluated: Vec<_> = metrics.iter().filter(|l| l["val_loss"].is_f64()).collect();
            assert!(!evaluated.is_empty() && evaluated.iter().all(|l| l["val_mae"].is_f64() && l["val_rmse"].is_f64()));
            assert!(metrics.iter().filter(|l| !l["val_loss"].is_f64()).all(|l| l.get("val_mae").is_none()));
            assert!(contains(&run_dir.join("tensorboard/train"), "epoch_mae"));
            assert!(contains(&run_dir.join("tensorboard/train"), "batch_rmse"));
            assert!(contains(&run_dir.join("tensorboard/validation"), "evaluation_mae_vs_iterations"));
            // A regression has no accuracy: none is recorded (it used to write `accuracy: 0.0`).
            for key in ["train_accuracy", "test_accuracy"] {
                assert!(s.get(key).is_none_or(|v| v.is_null()), "{key} in {s}");
            }
            assert!(metrics.iter().all(|l| l.get("accuracy").is_none() && l.get("val_accuracy").is_none()));
            assert!(!contains(&run_dir.join("tensorboard/train"), "accuracy"));
            assert!(!contains(&run_dir.join("tensorboard/validation"), "accuracy"));
            assert!(contains(&run_dir.join("tensorboard/validation"), "evaluation_loss_vs_iterations"));
        }
    }
}

/// `accuracy` counts class predictions: listing it for float targets is refused, as `mae`
/// is for classes, and the progress lines of a regression show none.
#[test]
fn accuracy_is_refused_on_float_targets_and_never_shown_for_them() {
    let dir = tempdir();
    write_regression(dir.path(), "train.csv", 64, 0);
    write_regression(dir.path(), "test.csv", 32, 0);
    let path = spec(dir.path(), "", "mean_squared_error", "[\"accuracy\", \"mae\"]");
    for command in [vec!["check", path.to_str().unwrap()], vec![path.to_str().unwrap(), "--quiet"]] {
        let out = run(&command);
        assert_exit(&out, 2);
        let stderr = text(&out).1;
        assert!(
            stderr.contains("train.metrics = \"accuracy\" counts class predictions")
                && stderr.contains("float targets")
                && stderr.contains("use \"mae\" or \"rmse\""),
            "{stderr}"
        );
    }
    let path = spec(dir.path(), "", "mean_squared_error", "[\"mae\"]");
    let out = run(&[path.to_str().unwrap(), "--set", "run.threads=1"]);
    assert_exit(&out, 0);
    let (stdout, stderr) = text(&out);
    assert!(!stdout.contains("accuracy") && !stderr.contains("accuracy"), "{stdout}\n{stderr}");
    assert!(stdout.contains("val_loss") || stderr.contains("val_loss"), "{stdout}\n{stderr}");
}

#[test]
fn the_metrics_are_absent_unless_listed_and_refused_on_class_labels() {
    let dir = tempdir();
    write_regression(dir.path(), "train.csv", 64, 0);
    write_regression(dir.path(), "test.csv", 32, 0);
    let path = spec(dir.path(), "", "mean_squared_error", "[]");
    assert_exit(&run(&[path.to_str().unwrap(), "--quiet", "--set", "run.threads=1"]), 0);
    let s = json(&dir.path().join("run/summary.json"));
    assert!(s.get("test_mae").is_none() && s.get("train_rmse").is_none(), "{s}");

    let classes = "a,y,b\n0.1,cat,0.2\n0.3,dog,0.1\n0.2,cat,0.5\n0.9,dog,0.4\n";
    for name in ["train.csv", "test.csv"] {
        std::fs::write(dir.path().join(name), classes).unwrap();
    }
    let path = spec(dir.path(), "", "sparse_categorical_crossentropy", "[\"accuracy\", \"rmse\"]");
    let out = run(&[
        "check",
        path.to_str().unwrap(),
        "--set",
        "batch.global=2",
        "--set",
        "model.layers=[{ type = \"dense\", units = 2 }]",
    ]);
    assert_exit(&out, 2);
    let stderr = text(&out).1;
    assert!(
        stderr.contains(
            "train.metrics = \"rmse\" measures errors against float targets, but the dataset has class labels"
        ),
        "{stderr}"
    );
}
