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
use trainrun::data::source::tfrecord::write_record;
use trainrun::data::{Cursor, DataSource, Pipeline, PipelineOptions, Shard, Shuffle, TfRecordConfig, TfRecordSource};

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
    let train = format!("steps_per_epoch = {steps}\nloss = \"sparse_categorical_crossentropy\"");
    common::sources::spec_training(dir, "tfrecord", data, strategy, CLASSIFIER, &train)
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
fn labels_read(source: &TfRecordSource, shard: Shard, shuffle: Shuffle, batches: usize) -> Vec<Vec<u32>> {
    labels_from(source, shard, shuffle, Cursor::default(), batches).0
}

/// The labels and global batch sizes a pipeline started at `start` reads over `batches`
/// batches.
fn labels_from(
    source: &TfRecordSource,
    shard: Shard,
    shuffle: Shuffle,
    start: Cursor,
    batches: usize,
) -> (Vec<Vec<u32>>, Vec<usize>) {
    let data = Arc::new(source.load().unwrap());
    let options = PipelineOptions {
        seed: 11,
        shuffle,
        global_batch: NonZeroUsize::new(8).unwrap(),
        drop_remainder: false,
        prefetch: 2,
        shard,
    };
    let mut pipeline = Pipeline::new(data, &options, start).unwrap();
    (0..batches).map(|_| pipeline.next_batch().unwrap()).map(|b| (b.y, b.global_n)).unzip()
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
    let source = TfRecordSource { dir: dir.path().to_path_buf(), config };
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
        // Both workers agree on each step's global batch: 8, 8, 8, 8, then 4 + 1.
        let (_, global) = labels_from(&source, Shard::of_files(0, two).unwrap(), shuffle, Cursor::default(), 5);
        assert_eq!(global, [8, 8, 8, 8, 5]);
    }
    // A pipeline started at a cursor mid-epoch reads what the uninterrupted one reads from
    // there on, for the file and the data policy.
    let shuffle = Shuffle::Buffer(NonZeroUsize::new(4).unwrap());
    for shard in [Shard::of_files(1, two).unwrap(), Shard::new(1, two).unwrap(), Shard::WHOLE] {
        let (all, _) = labels_from(&source, shard, shuffle, Cursor::default(), 12);
        for (step, cursor) in [(2, Cursor { epoch: 0, offset: 16 }), (7, Cursor { epoch: 1, offset: 16 })] {
            let (resumed, _) = labels_from(&source, shard, shuffle, cursor, 12 - step);
            assert_eq!(resumed, all[step..], "{shard:?} from {cursor:?}");
        }
    }
}

#[test]
fn png_encoded_images_are_decoded_and_resized() {
    let dir = tempdir();
    let png = |i: usize| {
        // Each image twice the size the spec asks for, so it is resized on the way.
        let (pixels, _) = image(i);
        let big: Vec<u8> =
            (0..4 * SIDE * SIDE).map(|p| pixels[(p / (2 * SIDE) / 2) * SIDE + (p % (2 * SIDE)) / 2]).collect();
        let img = image::GrayImage::from_raw(2 * SIDE as u32, 2 * SIDE as u32, big).unwrap();
        let mut out = std::io::Cursor::new(vec![]);
        img.write_to(&mut out, image::ImageFormat::Png).unwrap();
        out.into_inner()
    };
    for (name, range) in [("train-0.tfrecord", 0..256), ("test.tfrecord", 1000..1064)] {
        let mut bytes = vec![];
        for i in range {
            write_record(&mut bytes, &raw_image_example(png(i), image(i).1)).unwrap();
        }
        std::fs::write(dir.path().join(name), bytes).unwrap();
    }
    let s = train(&spec(dir.path(), &table("encoding = \"png_or_jpeg\""), "", 40));
    assert!(accuracy(&s) > 0.95, "{s}");
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

/// Fails with the output unless `trainrun` (training, or `check` when `check`) exited 4
/// naming every one of `needles`, and checks that no run folder claims a completed run.
fn assert_refused(spec: &Path, needles: &[&str]) {
    let run_dir = spec.with_file_name("run");
    let _ = std::fs::remove_dir_all(&run_dir);
    let out = run(&[spec.to_str().unwrap(), "--quiet", "--set", "run.threads=1"]);
    assert_exit(&out, 4);
    let (_, stderr) = text(&out);
    for needle in needles {
        assert!(stderr.contains(needle), "expected {needle:?} in:\n{stderr}");
    }
    assert!(!run_dir.join("summary.json").exists());
    if run_dir.join("run.json").exists() {
        let record = json(&run_dir.join("run.json"));
        assert_ne!(record["status"], "completed", "{record}");
    }
}

/// Writes examples `0..n` of which example `bad` is `payload` instead.
fn write_with(path: &Path, n: usize, bad: usize, payload: &[u8]) {
    let mut bytes = vec![];
    for i in 0..n {
        let (pixels, label) = image(i);
        let p = if i == bad { payload.to_vec() } else { raw_image_example(pixels, label) };
        write_record(&mut bytes, &p).unwrap();
    }
    std::fs::write(path, bytes).unwrap();
}

/// An `Example` with the given features.
fn example(features: Vec<(&str, trainrun::data::source::tfrecord::proto::feature::Kind)>) -> Vec<u8> {
    use prost::Message;
    use trainrun::data::source::tfrecord::proto;
    let feature = features.into_iter().map(|(k, kind)| (k.to_string(), proto::Feature { kind: Some(kind) }));
    proto::Example { features: Some(proto::Features { feature: feature.collect() }) }.encode_to_vec()
}

#[test]
fn malformed_tfrecords_exit_4_naming_the_file_and_the_byte_offset() {
    use trainrun::data::source::tfrecord::proto::{BytesList, FloatList, Int64List, feature::Kind};
    use trainrun::data::source::tfrecord::{Compression, scan};
    let dir = tempdir();
    write_halves(dir.path(), false);
    let spec = spec(dir.path(), &table(""), "", 40);
    let file = dir.path().join("train-2.tfrecord");
    let good = std::fs::read(&file).unwrap();
    let offsets = scan(&file, Compression::None).unwrap();
    let name = file.display().to_string();
    let at = |record: usize| format!("{name} at byte {}", offsets[record]);

    // Cut inside the last record.
    std::fs::write(&file, &good[..good.len() - 7]).unwrap();
    assert_refused(&spec, &[&at(63), "truncated: the file ends inside"]);

    // The length of record 5 changed, its checksum not.
    let mut bytes = good.clone();
    bytes[offsets[5] as usize] ^= 1;
    std::fs::write(&file, &bytes).unwrap();
    assert_refused(&spec, &[&format!("{name}: the record at byte {} fails its length checksum", offsets[5])]);

    // A payload byte of record 9 changed.
    let mut bytes = good.clone();
    bytes[offsets[9] as usize + 20] ^= 0x40;
    std::fs::write(&file, &bytes).unwrap();
    assert_refused(&spec, &[&format!("{name}: the record at byte {} fails its data checksum", offsets[9])]);

    // Record 9 has no label feature.
    let image_only = example(vec![("image", Kind::BytesList(BytesList { value: vec![vec![0u8; 16].into()] }))]);
    write_with(&file, 64, 9, &image_only);
    let offsets = scan(&file, Compression::None).unwrap();
    let at = |record: usize| format!("{name} at byte {}", offsets[record]);
    assert_refused(&spec, &[&at(9), "no feature named `label`"]);

    // Record 9's label is a float; then its image is a float list.
    let pixels = || Kind::BytesList(BytesList { value: vec![vec![0u8; 16].into()] });
    let float_label = example(vec![("image", pixels()), ("label", Kind::FloatList(FloatList { value: vec![1.0] }))]);
    write_with(&file, 64, 9, &float_label);
    assert_refused(&spec, &[&at(9), "feature `label` must be one int64, found 1 floats"]);
    // Gzip files read as plain ones: the error names the key to set.
    write_halves(dir.path(), true);
    let first = dir.path().join("train-0.tfrecord").display().to_string();
    assert_refused(&spec, &[&format!("{first} is gzip-compressed; set data.tfrecord.compression = \"gzip\"")]);
    write_halves(dir.path(), false);
    write_with(&file, 64, 9, &float_label);
    let float_image = example(vec![
        ("image", Kind::FloatList(FloatList { value: vec![0.5; 16] })),
        ("label", Kind::Int64List(Int64List { value: vec![1] })),
    ]);
    write_with(&file, 64, 9, &float_image);
    assert_refused(&spec, &[&at(9), "feature `image` must be one bytes value, found 16 floats"]);
}

#[test]
fn memory_stays_bounded_by_the_shuffle_buffer_whatever_the_file_size() {
    // 32×32×3 raw images, 3 kB a record: 5,000 records (15 MB) and 40,000 (123 MB), through a
    // buffer of 1,024 records (3 MB). Loading the file whole would add over 100 MB.
    let peak_rss_mb = |records: usize| {
        let dir = tempdir();
        let mut out = std::io::BufWriter::new(std::fs::File::create(dir.path().join("big.tfrecord")).unwrap());
        for i in 0..records {
            let pixels: Vec<u8> = (0..3072).map(|p| (i * 7 + p * 13) as u8).collect();
            write_record(&mut out, &raw_image_example(pixels, (i % 10) as i64)).unwrap();
        }
        out.flush().unwrap();
        drop(out);
        let data = "dataset = \"tfrecord\"\n\n[data.tfrecord]\ntrain = [\"big.tfrecord\"]\nshape = [32, 32, 3]\n\
                    classes = 10\nshuffle_buffer = 1024";
        let spec = spec(dir.path(), data, "", 1);
        let text = std::fs::read_to_string(&spec).unwrap();
        // One pass over every record: the epoch's length comes from the data.
        std::fs::write(&spec, text.replace("steps_per_epoch = 1\n", "").replace("units = 2", "units = 10")).unwrap();
        // Not summary.json's `peak_rss_mb`: getrusage's high-water mark starts at the one of
        // the process that spawned trainrun (this test binary, with its other tests running).
        let mut child =
            common::trainrun().args([spec.to_str().unwrap(), "--quiet", "--set", "run.threads=1"]).spawn().unwrap();
        let status = format!("/proc/{}/status", child.id());
        let mut hwm_kb = 0.0f64;
        while child.try_wait().unwrap().is_none() {
            let text = std::fs::read_to_string(&status).unwrap_or_default();
            let kb = text.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.trim().split(' ').next());
            hwm_kb = hwm_kb.max(kb.and_then(|k| k.parse().ok()).unwrap_or(0.0));
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let s = json(&spec.with_file_name("run").join("summary.json"));
        assert_eq!(s["examples"].as_u64(), Some(records as u64 / 16 * 16), "{s}");
        assert!(hwm_kb > 0.0, "no VmHWM read");
        hwm_kb / 1024.0
    };
    let (small, big) = (peak_rss_mb(5_000), peak_rss_mb(40_000));
    assert!(big - small < 16.0, "peak RSS {small:.1} MB for 15 MB of records, {big:.1} MB for 123 MB");
}
