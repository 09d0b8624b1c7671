//! The `npy` and `image_folder` sources end to end through the binary: files written here
//! (`.npy` by hand per NumPy's format document, `.npz` with the `zip` crate, PNGs with the
//! `image` crate), a tiny model trained on each under every strategy, and malformed files
//! refused with exit 4 naming the file, with no run folder claiming a completed run.

mod common;

use common::sources::STRATEGIES;
use common::{assert_exit, json, run, tempdir, text, with_python};
use std::io::Write;
use std::path::{Path, PathBuf};

/// A `.npy` file (format 1.0): magic, header length, the header dict padded with spaces to a
/// multiple of 64 bytes and ended by a newline, then the little-endian data.
fn npy(descr: &str, shape: &[usize], data: &[u8]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let shape = if dims.len() == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

/// `n` 4×4 one-channel `u8` images: class 1 is bright in the bottom half, class 0 in the top
/// half, with deterministic noise. Returns the image bytes and the labels.
fn halves(n: usize, offset: usize) -> (Vec<u8>, Vec<i64>) {
    let (mut images, mut labels) = (vec![], vec![]);
    for i in 0..n {
        let class = (i + offset) % 2;
        for p in 0..16 {
            let bright = (p / 8 == class) as usize;
            images.push((bright * 170 + (i * 31 + p * 7 + offset) % 80) as u8);
        }
        labels.push(class as i64);
    }
    (images, labels)
}

fn i64_bytes(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn write_npy_pair(dir: &Path, split: &str, n: usize, offset: usize) {
    let (images, labels) = halves(n, offset);
    std::fs::write(dir.join(format!("x_{split}.npy")), npy("|u1", &[n, 4, 4, 1], &images)).unwrap();
    std::fs::write(dir.join(format!("y_{split}.npy")), npy("<i8", &[n], &i64_bytes(&labels))).unwrap();
}

fn spec(dir: &Path, data: &str, strategy: &str, layers: &str, loss: &str) -> PathBuf {
    let train = format!("steps_per_epoch = 60\nloss = \"{loss}\"");
    common::sources::spec_training(dir, "sources", data, strategy, layers, &train)
}

const CLASSIFIER: &str = "[[model.layers]]\ntype = \"flatten\"\n[[model.layers]]\ntype = \"dense\"\nunits = 2";
const CE: &str = "sparse_categorical_crossentropy";

fn train(spec: &Path) -> serde_json::Value {
    let out = run(&[spec.to_str().unwrap(), "--quiet", "--set", "run.threads=1"]);
    assert_exit(&out, 0);
    json(&spec.with_file_name("run").join("summary.json"))
}

fn accuracy(summary: &serde_json::Value) -> f64 {
    summary["test_accuracy"].as_f64().unwrap_or(f64::NAN)
}

const NPY_TABLE: &str = "dataset = \"npy\"\n\n[data.npy]\n\
    train = { features = \"x_train.npy\", labels = \"y_train.npy\" }\n\
    test = { features = \"x_test.npy\", labels = \"y_test.npy\" }";

#[test]
fn npy_pairs_train_under_every_strategy() {
    for (name, strategy) in STRATEGIES {
        let dir = tempdir();
        write_npy_pair(dir.path(), "train", 256, 0);
        write_npy_pair(dir.path(), "test", 64, 1);
        let s = train(&spec(dir.path(), NPY_TABLE, strategy, CLASSIFIER, CE));
        assert!(accuracy(&s) > 0.95, "{name}: {s}");
        // Class indices from numbers have no names to write.
        assert!(!dir.path().join("run/classes.json").exists());
    }
}

/// A `.npz` written the way `np.savez` does: a zip of stored `.npy` members.
fn write_npz(path: &Path, members: &[(&str, Vec<u8>)]) {
    let mut zip = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    let stored = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, bytes) in members {
        zip.start_file(format!("{name}.npy"), stored).unwrap();
        zip.write_all(bytes).unwrap();
    }
    zip.finish().unwrap();
}

#[test]
fn one_npz_holds_both_splits_and_float_labels_are_regression() {
    let dir = tempdir();
    let (xtr, ytr) = halves(256, 0);
    let (xte, yte) = halves(64, 1);
    write_npz(
        &dir.path().join("halves.npz"),
        &[
            ("x_train", npy("|u1", &[256, 4, 4, 1], &xtr)),
            ("y_train", npy("<i8", &[256], &i64_bytes(&ytr))),
            ("x_test", npy("|u1", &[64, 4, 4, 1], &xte)),
            ("y_test", npy("<i8", &[64], &i64_bytes(&yte))),
        ],
    );
    let table = "dataset = \"npy\"\n\n[data.npy]\nnpz = \"halves.npz\"\n\
        train = { features = \"x_train\", labels = \"y_train\" }\n\
        test = { features = \"x_test.npy\", labels = \"y_test\" }";
    let s = train(&spec(dir.path(), table, "", CLASSIFIER, CE));
    assert!(accuracy(&s) > 0.95, "{s}");

    // f64 features of shape (n, 3), f32 targets y = x0 - 2·x1 + x2 / 2: regression.
    let n = 512;
    let x: Vec<f64> = (0..n * 3).map(|i| ((i * 37) % 101) as f64 / 101.0 - 0.5).collect();
    let y: Vec<f32> = x.chunks(3).map(|r| (r[0] - 2.0 * r[1] + 0.5 * r[2]) as f32).collect();
    let xb: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(dir.path().join("x_train.npy"), npy("<f8", &[n, 3], &xb)).unwrap();
    std::fs::write(dir.path().join("y_train.npy"), npy("<f4", &[n], &f32_bytes(&y))).unwrap();
    std::fs::copy(dir.path().join("x_train.npy"), dir.path().join("x_test.npy")).unwrap();
    std::fs::copy(dir.path().join("y_train.npy"), dir.path().join("y_test.npy")).unwrap();
    let s =
        train(&spec(dir.path(), NPY_TABLE, "", "[[model.layers]]\ntype = \"dense\"\nunits = 1", "mean_squared_error"));
    // The targets spread over about ±1.2 (variance near 0.45); a fitted plane leaves little.
    assert!(s["test_loss"].as_f64().is_some_and(|l| l < 0.02), "{s}");
}

/// Fails with the output unless the run exited 4 naming `needle`, and checks that nothing
/// claims a completed run.
fn assert_refused(spec: &Path, needle: &str) {
    let run_dir = spec.with_file_name("run");
    // A folder left by an earlier run of the same test would prove nothing.
    let _ = std::fs::remove_dir_all(&run_dir);
    let out = run(&[spec.to_str().unwrap(), "--quiet"]);
    assert_exit(&out, 4);
    let (_, stderr) = text(&out);
    assert!(stderr.contains(needle), "expected {needle:?} in:\n{stderr}");
    assert!(!run_dir.join("summary.json").exists());
    if run_dir.join("run.json").exists() {
        let record = json(&run_dir.join("run.json"));
        assert_ne!(record["status"], "completed", "{record}");
    }
}

#[test]
fn malformed_arrays_exit_4_naming_the_file() {
    let dir = tempdir();
    write_npy_pair(dir.path(), "train", 40, 0);
    write_npy_pair(dir.path(), "test", 8, 1);
    let path = spec(dir.path(), NPY_TABLE, "", CLASSIFIER, CE);

    // Fewer labels than examples.
    std::fs::write(dir.path().join("y_test.npy"), npy("<i8", &[7], &i64_bytes(&[0; 7]))).unwrap();
    assert_refused(&path, "y_test.npy");

    // Truncated data.
    let full = npy("<i8", &[8], &i64_bytes(&[0; 8]));
    std::fs::write(dir.path().join("y_test.npy"), &full[..full.len() - 3]).unwrap();
    assert_refused(&path, "y_test.npy");

    // A wrong magic number.
    std::fs::write(dir.path().join("y_test.npy"), b"PK\x03\x04 not an npy file at all").unwrap();
    assert_refused(&path, "y_test.npy");

    // An object array (pickled Python objects).
    write_npy_pair(dir.path(), "test", 8, 1);
    std::fs::write(dir.path().join("x_test.npy"), npy("|O", &[8, 4, 4, 1], &[0; 8 * 16 * 8])).unwrap();
    assert_refused(&path, "x_test.npy");

    // A Fortran-ordered 2-D array.
    let fortran = String::from_utf8(npy("<f4", &[8, 16], &[0; 8 * 16 * 4])).unwrap_or_default();
    let fortran = fortran.replace("'fortran_order': False", "'fortran_order': True ");
    std::fs::write(dir.path().join("x_test.npy"), fortran).unwrap();
    assert_refused(&path, "x_test.npy");
}

/// A `side`×`side` RGB PNG of stripes, horizontal or vertical, with noise.
fn stripes(path: &Path, side: u32, vertical: bool, seed: u32) {
    let image = image::RgbImage::from_fn(side, side, |x, y| {
        let on = if vertical { x % 4 < 2 } else { y % 4 < 2 };
        let noise = ((x * 13 + y * 7 + seed * 29) % 40) as u8;
        let v = if on { 200 + noise / 2 } else { noise };
        image::Rgb([v, v / 2, 255 - v])
    });
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    image.save(path).unwrap();
}

fn write_folder(dir: &Path, split: &str, per_class: u32) {
    for i in 0..per_class {
        stripes(&dir.join(split).join("horizontal").join(format!("h{i:03}.png")), 10, false, i);
        stripes(&dir.join(split).join("vertical").join(format!("v{i:03}.png")), 10, true, i + 1000);
    }
}

const FOLDER_TABLE: &str = "dataset = \"image_folder\"\n\n[data.image_folder]\n\
    test = \"test\"\nimage_size = [8, 8]\ncolor_mode = \"rgb\"";

#[test]
fn image_folders_train_under_every_strategy_with_class_names() {
    for (name, strategy) in STRATEGIES {
        let dir = tempdir();
        write_folder(dir.path(), "train", 64);
        write_folder(dir.path(), "test", 16);
        let table = if name == "default" { format!("{FOLDER_TABLE}\ncache = true") } else { FOLDER_TABLE.into() };
        let s = train(&spec(dir.path(), &table, strategy, CLASSIFIER, CE));
        assert!(accuracy(&s) > 0.95, "{name}: {s}");
        assert_eq!(json(&dir.path().join("run/classes.json")), serde_json::json!(["horizontal", "vertical"]));
    }
}

#[test]
fn a_corrupt_image_or_an_empty_class_exits_4_naming_it() {
    let dir = tempdir();
    write_folder(dir.path(), "train", 8);
    write_folder(dir.path(), "test", 2);
    let path = spec(dir.path(), FOLDER_TABLE, "", CLASSIFIER, CE);

    // Found only when a batch decodes it: the pipeline's error ends the run.
    let bad = dir.path().join("train/vertical/v003.png");
    let bytes = std::fs::read(&bad).unwrap();
    std::fs::write(&bad, &bytes[..bytes.len() / 2]).unwrap();
    assert_refused(&path, "v003.png");

    // In the test split, found by the evaluation.
    std::fs::write(&bad, &bytes).unwrap();
    std::fs::write(dir.path().join("test/horizontal/h001.png"), b"\x89PNG\r\n\x1a\nbroken").unwrap();
    assert_refused(&path, "h001.png");

    write_folder(dir.path(), "test", 2);
    std::fs::create_dir_all(dir.path().join("train/diagonal")).unwrap();
    assert_refused(&path, "diagonal");
}

/// CIFAR-format records (label bytes, then the red, green and blue planes): `n` images, class
/// 0 bright on the left half, class 1 on the right, with noise; `labels` bytes per record,
/// the class in the last one.
fn cifar_records(n: usize, offset: usize, labels: usize) -> Vec<u8> {
    let mut out = vec![];
    for i in 0..n {
        let class = (i + offset) % 2;
        out.extend(std::iter::repeat_n(class as u8, labels));
        for plane in 0..3 {
            for p in 0..1024 {
                let bright = ((p % 32) / 16 == class) as usize;
                out.push((bright * 150 + (i * 13 + p * 5 + plane * 11) % 90) as u8);
            }
        }
    }
    out
}

fn cifar_spec(dir: &Path, dataset: &str, strategy: &str) -> PathBuf {
    let data = format!("dataset = \"{dataset}\"\n\n[data.cifar100]\nlabel_mode = \"coarse\"");
    let data = if dataset == "cifar10" { format!("dataset = \"{dataset}\"") } else { data };
    // Averages over 16×16 windows keep left from right in 12 values; one output per class
    // (CIFAR-100's coarse labels: 20).
    let units = if dataset == "cifar10" { 10 } else { 20 };
    let layers = format!(
        "[[model.layers]]\ntype = \"avg_pool2d\"\npool_size = 16\n[[model.layers]]\ntype = \"flatten\"\n\
         [[model.layers]]\ntype = \"dense\"\nunits = {units}"
    );
    spec(dir, &data, strategy, &layers, CE)
}

#[test]
fn cifar_files_in_the_data_folder_train_and_name_their_classes() {
    for (name, strategy) in [STRATEGIES[0], STRATEGIES[3]] {
        // CIFAR-10 files directly in `data.dir`.
        let dir = tempdir();
        for i in 1..=5 {
            std::fs::write(dir.path().join(format!("data_batch_{i}.bin")), cifar_records(40, i, 1)).unwrap();
        }
        std::fs::write(dir.path().join("test_batch.bin"), cifar_records(40, 0, 1)).unwrap();
        let path = cifar_spec(dir.path(), "cifar10", strategy);
        let out = run(&["check", path.to_str().unwrap()]);
        assert_exit(&out, 0);
        assert!(text(&out).0.contains("200"), "{name}: the training examples counted from the files");
        let s = train(&path);
        assert!(accuracy(&s) > 0.9, "{name}: {s}");
        let classes = json(&dir.path().join("run/classes.json"));
        assert_eq!((classes[0].as_str(), classes[9].as_str()), (Some("airplane"), Some("truck")), "{classes}");
    }

    // CIFAR-100 in the folder its archive unpacks to, labelled by the coarse label.
    let dir = tempdir();
    let files = dir.path().join("cifar-100-binary");
    std::fs::create_dir_all(&files).unwrap();
    std::fs::write(files.join("train.bin"), cifar_records(200, 0, 2)).unwrap();
    std::fs::write(files.join("test.bin"), cifar_records(40, 1, 2)).unwrap();
    let s = train(&cifar_spec(dir.path(), "cifar100", ""));
    assert!(accuracy(&s) > 0.9, "{s}");
    let classes = json(&dir.path().join("run/classes.json"));
    assert_eq!(classes.as_array().map(Vec::len), Some(20), "{classes}");

    // A truncated file names itself and the byte where whole records end.
    let mut bytes = cifar_records(200, 0, 2);
    bytes.truncate(bytes.len() - 100);
    std::fs::write(files.join("train.bin"), bytes).unwrap();
    assert_refused(&cifar_spec(dir.path(), "cifar100", ""), "train.bin");

    // Offline (as every test runs) with nothing there: exit 4 naming the missing files.
    let empty = tempdir();
    assert_refused(&cifar_spec(empty.path(), "cifar10", ""), "data_batch_1.bin");
}

#[test]
fn the_resnet20_spec_checks_cleanly() {
    let out = run(&["check", "specs/cifar10_resnet20.toml"]);
    assert_exit(&out, 0);
    let (stdout, _) = text(&out);
    assert!(stdout.contains("cifar10"), "{stdout}");
}

#[test]
fn an_npz_written_by_numpy_trains_to_the_same_weights_as_the_npy_files() {
    let dir = tempdir();
    write_npy_pair(dir.path(), "train", 256, 0);
    write_npy_pair(dir.path(), "test", 64, 1);
    let by_hand = train(&spec(dir.path(), NPY_TABLE, "", CLASSIFIER, CE));
    // NumPy reads the files written here and writes them back as one compressed archive.
    let script = "import numpy as np, os, sys\nd = sys.argv[1]\n\
        a = {k: np.load(os.path.join(d, k + '.npy')) for k in ['x_train', 'y_train', 'x_test', 'y_test']}\n\
        assert a['x_train'].dtype == np.uint8 and a['x_train'].shape == (256, 4, 4, 1)\n\
        np.savez_compressed(os.path.join(d, 'numpy.npz'), **a)";
    if !with_python("numpy", script, dir.path()) {
        return;
    }
    for f in ["x_train", "y_train", "x_test", "y_test"] {
        std::fs::remove_file(dir.path().join(format!("{f}.npy"))).unwrap();
    }
    std::fs::remove_dir_all(dir.path().join("run")).unwrap();
    let table = NPY_TABLE.replace("[data.npy]", "[data.npy]\nnpz = \"numpy.npz\"").replace(".npy\"", "\"");
    let by_numpy = train(&spec(dir.path(), &table, "", CLASSIFIER, CE));
    assert_eq!(by_numpy["weights_sha256"], by_hand["weights_sha256"]);
    assert_eq!(by_numpy["test_accuracy"], by_hand["test_accuracy"]);
}
