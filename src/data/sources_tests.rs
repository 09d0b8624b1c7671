//! Tests of data sources: folder resolution, presets, `idx` files, download into place.

use super::*;
use crate::data::DataDirs;
use crate::data::download::tests::{serve, unreachable};
use crate::data::idx::{encode_idx, gzip};
use sha2::{Digest, Sha256};
use std::collections::HashMap;

fn dirs(data: Option<&str>, xdg: Option<&str>, home: Option<&str>) -> DataDirs {
    DataDirs {
        trainrun_data_dir: data.map(PathBuf::from),
        xdg_cache_home: xdg.map(PathBuf::from),
        home: home.map(PathBuf::from),
    }
}

#[test]
fn data_dir_resolution_order() {
    let all = dirs(Some("/env"), Some("/xdg"), Some("/home/u"));
    let spec = Some(Path::new("/spec"));
    assert_eq!(all.resolve(spec, "mnist"), Some("/spec".into()));
    assert_eq!(all.resolve(None, "mnist"), Some("/env".into()));
    let no_env = dirs(None, Some("/xdg"), Some("/home/u"));
    assert_eq!(no_env.resolve(None, "mnist"), Some("/xdg/trainrun/mnist".into()));
    // A relative XDG_CACHE_HOME is invalid and skipped.
    let relative = dirs(None, Some("cache"), Some("/home/u"));
    let home = Some(PathBuf::from("/home/u/.cache/trainrun/fashion_mnist"));
    assert_eq!(relative.resolve(None, "fashion_mnist"), home);
    assert_eq!(dirs(None, None, None).resolve(None, "mnist"), None);
}

#[test]
fn missing_preset_files_are_all_named_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let source = Source::Preset { preset: Preset::mnist(), dir: dir.path().to_path_buf() };
    let err = source.load().unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "mnist: missing in {}: train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, \
             t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz; put the files there, or set \
             `data.dir` (or TRAINRUN_DATA_DIR) to a folder that has them",
            dir.path().display()
        )
    );
    // Facts need no files: a preset's are published.
    assert_eq!(source.facts().unwrap(), Preset::mnist().facts());
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// A preset shaped like MNIST but tiny (6 train, 2 test, 2×2), and its gzip files.
fn tiny_preset() -> (Preset, HashMap<String, Vec<u8>>) {
    let raw = [
        encode_idx(&[6, 2, 2], &[9; 24]),
        encode_idx(&[6], &[0, 1, 2, 0, 1, 2]),
        encode_idx(&[2, 2, 2], &[4; 8]),
        encode_idx(&[2], &[2, 1]),
    ];
    let names = ["tr-i.gz", "tr-l.gz", "te-i.gz", "te-l.gz"];
    let f =
        |k: usize| RemoteFile { name: names[k].into(), checksum: Checksum::Sha256Decompressed(sha256_hex(&raw[k])) };
    let preset = Preset {
        name: "mnist",
        train_images: f(0),
        train_labels: f(1),
        test_images: f(2),
        test_labels: f(3),
        mirrors: &[],
        train_examples: 6,
        test_examples: 2,
        shape: ExampleShape { height: 2, width: 2, channels: 1 },
        classes: 3,
    };
    let served = names.iter().zip(&raw).map(|(n, r)| (n.to_string(), gzip(r))).collect();
    (preset, served)
}

#[test]
fn preset_downloads_then_loads() {
    let dir = tempfile::tempdir().unwrap();
    let (preset, served) = tiny_preset();
    let addr = serve(served, 4);
    let source = Source::Preset { preset, dir: dir.path().join("sub") };
    let fetcher = Fetcher::with_mirrors(vec![unreachable(), format!("http://{addr}")]);
    assert_eq!(source.fetch_missing(&fetcher).unwrap().len(), 4);
    assert!(source.missing_files().is_empty());
    // Nothing left to fetch: no request is made (the server would refuse a fifth).
    assert_eq!(source.fetch_missing(&fetcher).unwrap(), Vec::<PathBuf>::new());
    let data = source.load().unwrap();
    assert_eq!(data.train.len(), 6);
    assert_eq!(data.test.as_ref().map(Split::len), Some(2));
    assert_eq!(data.facts(1), source.facts().unwrap());
}

#[test]
fn preset_files_of_the_wrong_shape_or_labels_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (preset, mut served) = tiny_preset();
    served.insert("tr-i.gz".into(), gzip(&encode_idx(&[6, 3, 2], &[0; 36])));
    served.insert("te-l".into(), encode_idx(&[2], &[0, 3]));
    served.remove("te-l.gz");
    for (name, bytes) in &served {
        std::fs::write(dir.path().join(name), bytes).unwrap();
    }
    let source = Source::Preset { preset: preset.clone(), dir: dir.path().to_path_buf() };
    let want = "tr-i.gz: the header gives dimensions [6, 3, 2]; mnist needs [6, 2, 2]; \
                delete the file so it is downloaded again";
    assert!(source.facts().unwrap_err().to_string().ends_with(want));
    assert!(source.load().unwrap_err().to_string().ends_with(want));
    served.insert("tr-i.gz".into(), gzip(&encode_idx(&[6, 2, 2], &[0; 24])));
    std::fs::write(dir.path().join("tr-i.gz"), &served["tr-i.gz"]).unwrap();
    // The decompressed test labels are found under their name without `.gz`.
    let err = source.load().unwrap_err().to_string();
    assert!(err.ends_with("te-l: label 3 of example 1 is outside the 3 classes of mnist"), "{err}");
}

fn idx_source(dir: &Path, test: bool) -> Source {
    Source::Idx {
        dir: dir.to_path_buf(),
        files: IdxFiles {
            train_images: "a".into(),
            train_labels: "b".into(),
            test_images: test.then(|| "c".into()),
            test_labels: test.then(|| "d".into()),
        },
    }
}

#[test]
fn idx_files_load_with_classes_from_labels() {
    let dir = tempfile::tempdir().unwrap();
    let w = |name: &str, bytes: Vec<u8>| std::fs::write(dir.path().join(name), bytes).unwrap();
    w("a", gzip(&encode_idx(&[4, 2, 3, 3], &[1; 72])));
    w("b", encode_idx(&[4], &[0, 5, 1, 1]));
    let err = idx_source(dir.path(), true).load().unwrap_err().to_string();
    assert!(err.starts_with("idx: missing in ") && err.contains(": c, d; put"), "{err}");

    w("c", encode_idx(&[1, 2, 3, 3], &[1; 18]));
    w("d", encode_idx(&[1], &[7]));
    let source = idx_source(dir.path(), true);
    let data = source.load().unwrap();
    assert_eq!(data.labels, LabelKind::Class { classes: 8 });
    assert_eq!(data.train.shape(), [2, 3, 3]);
    assert_eq!(source.facts().unwrap(), data.facts(1));
    assert!(idx_source(dir.path(), false).load().unwrap().test.is_none());

    w("d", encode_idx(&[2], &[7, 7]));
    let err = source.load().unwrap_err().to_string();
    assert!(err.contains("/c holds 1 images but "), "{err}");
    assert!(err.ends_with("/d holds 2 labels; they must be the same split"), "{err}");
    w("b", encode_idx(&[2, 2], &[0; 4]));
    let err = idx_source(dir.path(), false).facts().unwrap_err().to_string();
    assert!(
        err.ends_with("b: the header gives dimensions [2, 2]; labels need 1 dimension (one label per example)"),
        "{err}"
    );
}

#[test]
fn idx_needs_its_files_section_and_both_test_files() {
    let mut files = match idx_source(Path::new("/nonexistent"), true) {
        Source::Idx { files, .. } => files,
        _ => unreachable!(),
    };
    files.test_labels = None;
    let err = test_paths(&files).unwrap_err().to_string();
    assert!(err.contains("needs `both data.files.test_images and data.files.test_labels"), "{err}");
}
