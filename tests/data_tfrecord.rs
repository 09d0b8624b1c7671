//! The `tfrecord` source end to end through the binary: TFRecord files written here (our
//! writer, plain and gzip) and by the PyPI `tfrecord` package when python3 can import it,
//! trained under every strategy; `file` sharding (each worker its own files, every record
//! once per epoch); and malformed files refused with exit 4 naming the file and the byte
//! offset, with no run folder claiming a completed run.

mod common;

use common::{assert_exit, json, run, tempdir, text};
use flate2::Compression as Level;
use flate2::write::GzEncoder;
use std::io::Write;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use trainrun::data::formats::bench::raw_image_example;
use trainrun::data::formats::tfrecord::write_record;
use trainrun::data::{Cursor, Pipeline, PipelineOptions, Shard, Shuffle, Source, TfRecordConfig};

/// Side of the square one-channel images.
const SIDE: usize = 4;

/// Example `i`'s image: class `i % 2` is bright in the bottom half, else the top half, with
/// deterministic noise.
fn image(i: usize) -> (Vec<u8>, i64) {
    let class = i % 2;
    let pixels = (0..SIDE * SIDE)
        .map(|p| {
            let bright = usize::from(p / (SIDE * SIDE / 2) == class);
            (bright * 170 + (i * 31 + p * 7) % 80) as u8
        })
        .collect();
    (pixels, class as i64)
}

/// Writes examples `examples` (their label is `label(i)`) as one TFRecord file.
fn write(path: &Path, examples: std::ops::Range<usize>, gzip: bool, label: impl Fn(usize) -> i64) {
    let mut bytes = vec![];
    for i in examples {
        write_record(&mut bytes, &raw_image_example(image(i).0, label(i))).unwrap();
    }
    if gzip {
        let mut gz = GzEncoder::new(vec![], Level::default());
        gz.write_all(&bytes).unwrap();
        bytes = gz.finish().unwrap();
    }
    std::fs::write(path, bytes).unwrap();
}

/// Four training files of 64 examples and one test file of 64, classes `i % 2`.
fn write_halves(dir: &Path, gzip: bool) {
    for f in 0..4 {
        write(&dir.join(format!("train-{f}.tfrecord")), f * 64..(f + 1) * 64, gzip, |i| image(i).1);
    }
    write(&dir.join("test.tfrecord"), 1000..1064, gzip, |i| image(i).1);
}

fn table(extra: &str) -> String {
    format!(
        "dataset = \"tfrecord\"\n\n[data.tfrecord]\ntrain = [\"train-*.tfrecord\"]\ntest = [\"test.tfrecord\"]\n\
         shape = [{SIDE}, {SIDE}, 1]\nclasses = 2\nshuffle_buffer = 50\n{extra}"
    )
}

const CLASSIFIER: &str = "[[model.layers]]\ntype = \"flatten\"\n[[model.layers]]\ntype = \"dense\"\nunits = 2";

fn spec(dir: &Path, data: &str, strategy: &str, steps: u32) -> PathBuf {
    let text = format!(
        r#"
[run]
name = "tfrecord"
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
{CLASSIFIER}

[train]
epochs = 1
steps_per_epoch = {steps}
loss = "sparse_categorical_crossentropy"
from_logits = true
"#,
        out = dir.join("run").display(),
        data_dir = dir.display(),
    );
    let path = dir.join("spec.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn train(spec: &Path) -> serde_json::Value {
    let out = run(&[spec.to_str().unwrap(), "--quiet", "--set", "run.threads=1"]);
    assert_exit(&out, 0);
    json(&spec.with_file_name("run").join("summary.json"))
}

fn accuracy(summary: &serde_json::Value) -> f64 {
    summary["test_accuracy"].as_f64().unwrap_or(f64::NAN)
}

const STRATEGIES: [(&str, &str); 4] = [
    ("default", ""),
    ("mirrored", "[strategy]\nkind = \"mirrored\"\ndevices = [\"cpu:0\", \"cpu:1\"]"),
    ("multi_worker_mirrored", "[strategy]\nkind = \"multi_worker_mirrored\"\n\n[cluster]\nworker = 2"),
    ("parameter_server", "[strategy]\nkind = \"parameter_server\"\n\n[cluster]\nchief = 1\nworker = 2\nps = 1"),
];

#[test]
fn tfrecords_train_under_every_strategy_plain_and_gzip() {
    for (name, strategy) in STRATEGIES {
        for gzip in [false, true] {
            let dir = tempdir();
            write_halves(dir.path(), gzip);
            let compression = if gzip { "compression = \"gzip\"" } else { "" };
            let s = train(&spec(dir.path(), &table(compression), strategy, 40));
            assert!(accuracy(&s) > 0.95, "{name}, gzip {gzip}: {s}");
        }
    }
}

#[test]
fn check_shows_the_file_policy_auto_picks_for_tfrecords() {
    let dir = tempdir();
    write_halves(dir.path(), false);
    let mwm = STRATEGIES[2].1;
    let out = run(&["check", spec(dir.path(), &table(""), mwm, 40).to_str().unwrap()]);
    assert_exit(&out, 0);
    let stdout = text(&out).0;
    assert!(stdout.contains("file policy, 2 shards"), "{stdout}");
    // Three files for four workers: `auto` falls back to splitting examples.
    std::fs::remove_file(dir.path().join("train-3.tfrecord")).unwrap();
    let four = mwm.replace("worker = 2", "worker = 4");
    let out = run(&["check", spec(dir.path(), &table(""), &four, 40).to_str().unwrap()]);
    assert_exit(&out, 0);
    assert!(!text(&out).0.contains("file policy"), "{}", text(&out).0);
}

/// The labels one pipeline reads over `batches` batches.
fn labels_read(source: &Source, shard: Shard, shuffle: Shuffle, batches: usize) -> Vec<Vec<u32>> {
    let data = Arc::new(source.load().unwrap());
    let options = PipelineOptions {
        seed: 11,
        shuffle,
        global_batch: NonZeroUsize::new(8).unwrap(),
        drop_remainder: false,
        prefetch: 2,
        shard,
    };
    let mut pipeline = Pipeline::new(data, &options, Cursor::default()).unwrap();
    (0..batches).map(|_| pipeline.next_batch().unwrap().y).collect()
}

#[test]
fn two_workers_over_four_files_read_disjoint_files_and_every_record_once_per_epoch() {
    let dir = tempdir();
    // Example i's label is i itself: files 0 and 2 hold 0..10 and 20..30, files 1 and 3 hold
    // 10..20 and 30..37 (a short one).
    let bounds = [0, 10, 20, 30, 37];
    for f in 0..4 {
        write(&dir.path().join(format!("part-{f}.tfrecord")), bounds[f]..bounds[f + 1], false, |i| i as i64);
    }
    let config: TfRecordConfig = toml::from_str(&format!(
        "train = [\"part-*.tfrecord\"]\nshape = [{SIDE}, {SIDE}, 1]\nclasses = 100\nshuffle_buffer = 4"
    ))
    .unwrap();
    let source = Source::TfRecord { dir: dir.path().to_path_buf(), config };
    let two = NonZeroUsize::new(2).unwrap();
    for shuffle in [Shuffle::Off, Shuffle::Buffer(NonZeroUsize::new(4).unwrap())] {
        // Worker 0 has 20 records, worker 1 has 17; each takes 4 of a global batch of 8, so an
        // epoch is 5 steps and worker 1's last batch holds 1 example.
        let workers: Vec<Vec<Vec<u32>>> =
            (0..2).map(|w| labels_read(&source, Shard::of_files(w, two).unwrap(), shuffle, 10)).collect();
        for epoch in 0..2 {
            let read = |w: usize| -> Vec<u32> { workers[w][epoch * 5..(epoch + 1) * 5].concat() };
            let (mut zero, mut one) = (read(0), read(1));
            assert_eq!(workers[1][epoch * 5 + 4].len(), 1, "{shuffle:?}");
            zero.sort_unstable();
            one.sort_unstable();
            let files = |a: std::ops::Range<u32>, b: std::ops::Range<u32>| a.chain(b).collect::<Vec<u32>>();
            assert_eq!(zero, files(0..10, 20..30), "{shuffle:?} epoch {epoch}");
            assert_eq!(one, files(10..20, 30..37), "{shuffle:?} epoch {epoch}");
        }
        if shuffle != Shuffle::Off {
            assert_ne!(workers[0][0..5], workers[0][5..10], "each epoch is reshuffled");
        }
    }
}

/// The PyPI `tfrecord` package's writer, the features named as TensorFlow's image datasets
/// name them: train and test files, the images raw bytes and the labels int64.
const TFRECORD_WRITE: &str = r#"
import os, sys
from tfrecord import TFRecordWriter
d = sys.argv[1]
side = int(sys.argv[2])
def image(i):
    c = i % 2
    return bytes((170 * (p // (side * side // 2) == c) + (i * 31 + p * 7) % 80) for p in range(side * side)), c
for name, r in [("py-train.tfrecord", range(0, 256)), ("py-test.tfrecord", range(1000, 1064))]:
    w = TFRecordWriter(os.path.join(d, name))
    for i in r:
        pixels, c = image(i)
        w.write({"image/encoded": (pixels, "byte"), "image/class/label": (c, "int")})
    w.close()
"#;

#[test]
fn tfrecords_written_by_the_tfrecord_package_train() {
    let dir = tempdir();
    let d = dir.path();
    let importable = std::process::Command::new("python3")
        .args(["-c", "import tfrecord"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !importable {
        let why = "skipped: python3 cannot import tfrecord (python3 -m pip install tfrecord); not cross-checked";
        println!("{why}");
        let _ = writeln!(std::io::stderr(), "\n*** {why} ***\n");
        return;
    }
    let out = std::process::Command::new("python3")
        .args(["-c", TFRECORD_WRITE, d.to_str().unwrap(), &SIDE.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let data = format!(
        "dataset = \"tfrecord\"\n\n[data.tfrecord]\ntrain = [\"py-train.tfrecord\"]\ntest = [\"py-test.tfrecord\"]\n\
         image = \"image/encoded\"\nlabel = \"image/class/label\"\nshape = [{SIDE}, {SIDE}, 1]\nclasses = 2"
    );
    let s = train(&spec(d, &data, "", 40));
    assert!(accuracy(&s) > 0.95, "{s}");
}

#[test]
fn a_whole_shuffle_is_refused_for_a_stream() {
    let dir = tempdir();
    write_halves(dir.path(), false);
    let data = table("").replace("dataset = \"tfrecord\"", "dataset = \"tfrecord\"\nshuffle_buffer = 100");
    let out = run(&["check", spec(dir.path(), &data, "", 40).to_str().unwrap()]);
    assert_exit(&out, 2);
    let stderr = text(&out).1;
    assert!(stderr.contains("data.tfrecord.shuffle_buffer = 100"), "{stderr}");
}
