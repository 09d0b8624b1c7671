//! A language-model spec small enough to train in a test: a per-position 1x1 convolution over
//! the token ids (`block` positions, `classes` outputs each), five steps of SGD.

use std::path::{Path, PathBuf};

/// Writes `dir/spec.toml` for the data section `data` (its `[data]` table's keys after `dir`),
/// training into `dir/run`, and returns its path.
pub fn spec(dir: &Path, name: &str, data: &str, block: usize, classes: usize) -> PathBuf {
    let text = format!(
        r#"
[run]
name = "{name}"
seed = 3
out_dir = "{out}"

[data]
dir = "{data_dir}"
{data}

[batch]
global = 4

[optimizer]
kind = "sgd"
learning_rate = 0.01

[model]
[[model.layers]]
type = "reshape"
target_shape = [{block}, 1, 1]

[[model.layers]]
type = "conv2d"
filters = {classes}
kernel_size = 1

[[model.layers]]
type = "reshape"
target_shape = [{block}, {classes}]

[train]
epochs = 1
steps_per_epoch = 5
validation_steps = 2
from_logits = true
"#,
        out = dir.join("run").display(),
        data_dir = dir.display(),
    );
    let path = dir.join("spec.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Writes `train.txt` and `val.txt` into `dir`: two slices of Macbeth (20,000 and 10,000 bytes;
/// a slice keeps a test quick).
pub fn macbeth(dir: &Path) {
    let plays = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/shakespeare");
    let val = std::fs::read_to_string(plays.join("val.txt")).unwrap();
    std::fs::write(dir.join("train.txt"), &val[..20_000]).unwrap();
    std::fs::write(dir.join("val.txt"), &val[20_000..30_000]).unwrap();
}

/// The data section of a `text` source over [`macbeth`]'s files, tokenized by `tokenization`
/// (a TOML value).
pub fn text_data(tokenization: &str, block: usize) -> String {
    format!(
        "dataset = \"text\"\n\n[data.text]\ntrain = [\"train.txt\"]\nvalidation = [\"val.txt\"]\n\
         tokenization = {tokenization}\nblock_size = {block}"
    )
}
