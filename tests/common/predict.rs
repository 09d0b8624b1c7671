//! What the `predict --input` tests share: predicting with the binary, and training the small
//! dense classifier whose checkpoint they predict with.

use super::{assert_exit, run};
use std::path::{Path, PathBuf};

/// `trainrun predict SPEC --checkpoint RUN --output OUT ARGS…`.
pub fn predict(spec: &Path, checkpoint: &Path, output: &Path, args: &[&str]) -> std::process::Output {
    let (s, c, o) = (spec.display().to_string(), checkpoint.display().to_string(), output.display().to_string());
    let mut all = vec!["predict", &s, "--checkpoint", &c, "--output", &o];
    all.extend_from_slice(args);
    run(&all)
}

/// A spec over `data` (a TOML `[data]` table's body) in `dir`, one short run of a small dense
/// classifier of 3 classes; returns the spec's path after training it into `dir/run`.
pub fn train(dir: &Path, data: &str) -> PathBuf {
    train_classes(dir, data, 3)
}

/// As [`train`], for `classes` classes.
pub fn train_classes(dir: &Path, data: &str, classes: usize) -> PathBuf {
    let spec = dir.join("spec.toml");
    std::fs::write(
        &spec,
        format!(
            "[run]\nname = \"p\"\nout_dir = \"{}\"\n[data]\n{data}\n[batch]\nglobal = 16\n[optimizer]\nkind = \"sgd\"\n\
             learning_rate = 0.1\n[model]\n[[model.layers]]\ntype = \"flatten\"\n[[model.layers]]\ntype = \"dense\"\n\
             units = 8\nactivation = \"relu\"\n[[model.layers]]\ntype = \"dense\"\nunits = {classes}\n[train]\n\
             epochs = 2\nfrom_logits = true\n",
            dir.join("run").display()
        ),
    )
    .unwrap();
    assert_exit(&run(&[spec.to_str().unwrap(), "-q"]), 0);
    spec
}
