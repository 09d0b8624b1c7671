//! The `csv` source end to end: regression on float labels (with `mean_squared_error`,
//! `mean_absolute_error` and `huber`) under every strategy, and class names that become sorted
//! classes written to `classes.json`.

mod common;

use common::{assert_exit, json, run, tempdir, text};
use std::path::Path;

/// `y = 2·a - b + 0.5` on a grid, written as a CSV table with the label column in the middle.
fn write_regression(dir: &Path, name: &str, rows: usize, offset: usize) {
    let mut csv = String::from("a,y,b\n");
    for i in 0..rows {
        let a = ((i + offset) % 17) as f32 / 17.0 - 0.5;
        let b = ((i + offset) * 7 % 13) as f32 / 13.0 - 0.5;
        csv += &format!("{a},{},{b}\n", 2.0 * a - b + 0.5);
    }
    std::fs::write(dir.join(name), csv).unwrap();
}

fn spec(dir: &Path, data: &str, strategy: &str, units: usize, loss: &str) -> std::path::PathBuf {
    let text = format!(
        r#"
[run]
name = "csv"
seed = 5
out_dir = "{out}"

[data]
dataset = "csv"
dir = "{data}"

[data.csv]
{data_table}

{strategy}

[batch]
global = 32

[optimizer]
kind = "sgd"
learning_rate = 0.1

[model]
[[model.layers]]
type = "dense"
units = {units}

[train]
epochs = 1
steps_per_epoch = 150
loss = "{loss}"
from_logits = true
"#,
        out = dir.join("run").display(),
        data = dir.display(),
        data_table = data,
    );
    let path = dir.join("spec.toml");
    std::fs::write(&path, text).unwrap();
    path
}

const STRATEGIES: [(&str, &str); 4] = [
    ("default", ""),
    ("mirrored", "[strategy]\nkind = \"mirrored\"\ndevices = [\"cpu:0\", \"cpu:1\"]"),
    ("central_storage", "[strategy]\nkind = \"central_storage\"\ndevices = [\"cpu:0\", \"cpu:1\"]"),
    ("multi_worker_mirrored", "[strategy]\nkind = \"multi_worker_mirrored\"\n\n[cluster]\nworker = 2"),
];

#[test]
fn regression_on_float_labels_under_every_strategy_and_loss() {
    let table = "train = \"train.csv\"\ntest = \"test.csv\"\nlabel = \"y\"";
    for (name, strategy) in STRATEGIES {
        // MAE is in the targets' units, the others in squares (halved for Huber).
        for (loss, most) in [("mean_squared_error", 0.05), ("mean_absolute_error", 0.15), ("huber", 0.05)] {
            let dir = tempdir();
            write_regression(dir.path(), "train.csv", 512, 0);
            write_regression(dir.path(), "test.csv", 64, 1000);
            let path = spec(dir.path(), table, strategy, 1, loss);
            let out = run(&[path.to_str().unwrap(), "--quiet", "--set", "run.threads=1"]);
            assert_exit(&out, 0);
            let s = json(&dir.path().join("run/summary.json"));
            let test = s["test_loss"].as_f64().unwrap_or(f64::NAN);
            // The targets spread over about ±1.5 (a constant guess leaves an MAE near 0.6); a
            // fitted line leaves little.
            assert!(test < most, "{name} {loss}: test loss {test}");
            assert!(!dir.path().join("run/classes.json").exists());
        }
    }
}

#[test]
fn class_names_become_sorted_classes_in_classes_json() {
    let dir = tempdir();
    let mut csv = String::from("x,species\n");
    for i in 0..200 {
        let x = i as f32 / 200.0;
        csv += &format!("{x},{}\n", if x < 0.5 { "setosa" } else { "\"Iris, virginica\"" });
    }
    std::fs::write(dir.path().join("train.csv"), &csv).unwrap();
    std::fs::write(dir.path().join("test.csv"), &csv).unwrap();
    let table = "train = \"train.csv\"\ntest = \"test.csv\"\nlabel = \"species\"";
    let path = spec(dir.path(), table, "", 2, "sparse_categorical_crossentropy");
    let out = run(&[path.to_str().unwrap(), "--quiet", "--set", "run.threads=1"]);
    assert_exit(&out, 0);
    assert_eq!(json(&dir.path().join("run/classes.json")), serde_json::json!(["Iris, virginica", "setosa"]));
    let s = json(&dir.path().join("run/summary.json"));
    assert!(s["test_accuracy"].as_f64().is_some_and(|a| a > 0.9), "{s}");

    // Float labels with a loss that needs classes are refused at planning, naming the key.
    write_regression(dir.path(), "train.csv", 64, 0);
    write_regression(dir.path(), "test.csv", 64, 0);
    let table = "train = \"train.csv\"\ntest = \"test.csv\"\nlabel = \"y\"";
    let path = spec(dir.path(), table, "", 1, "sparse_categorical_crossentropy");
    let out = run(&["check", path.to_str().unwrap()]);
    assert_exit(&out, 2);
    let (_, stderr) = text(&out);
    assert!(stderr.contains("train.loss = \"sparse_categorical_crossentropy\" needs class labels"), "{stderr}");
}

#[test]
fn a_bad_cell_exits_4_naming_file_line_and_column() {
    let dir = tempdir();
    write_regression(dir.path(), "train.csv", 40, 0);
    let mut csv = std::fs::read_to_string(dir.path().join("train.csv")).unwrap();
    csv += "0.1,0.2,zero\n";
    std::fs::write(dir.path().join("train.csv"), csv).unwrap();
    let path = spec(dir.path(), "train = \"train.csv\"\nlabel = \"y\"", "", 1, "mean_squared_error");
    let out = run(&[path.to_str().unwrap(), "--quiet"]);
    assert_exit(&out, 4);
    let (_, stderr) = text(&out);
    assert!(stderr.contains("train.csv:42:3"), "{stderr}");
    assert!(!dir.path().join("run/summary.json").exists());
}
