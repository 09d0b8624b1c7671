//! What the data-source tests share: the five strategies every source trains under, and the
//! small classifier spec they train (SGD, 60 steps of 16, one thread a task).

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
/// `dir`), under `strategy`, with `model`'s layers.
pub fn spec(dir: &Path, name: &str, data: &str, strategy: &str, model: &str) -> PathBuf {
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
steps_per_epoch = 60
from_logits = true
"#,
        out = dir.join("run").display(),
        data_dir = dir.display(),
    );
    let path = dir.join("spec.toml");
    std::fs::write(&path, text).unwrap();
    path
}
