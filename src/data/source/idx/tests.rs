//! Tests of the `idx` source and the IDX reader: `[data.files]`, classes from labels, raw and
//! gzip files, headers.

use super::*;

fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn reads_raw_and_gzip_alike_whatever_the_name() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..2 * 3 * 4).map(|i| i as u8).collect();
    let raw = encode_idx(&[2, 3, 4], &data);
    // Names lie on purpose: detection is by magic bytes.
    let a = write(dir.path(), "raw.gz", &raw);
    let b = write(dir.path(), "packed", &gzip(&raw));
    for path in [a, b] {
        let arr = read_idx(&path).unwrap();
        assert_eq!(arr.dims(), &[2, 3, 4]);
        assert_eq!(arr.data(), &data[..]);
        assert_eq!(read_idx_dims(&path).unwrap(), vec![2, 3, 4]);
    }
}

#[test]
fn four_d_and_one_d_headers() {
    let four = parse_idx(encode_idx(&[1, 2, 2, 3], &[7; 12]), Path::new("x")).unwrap();
    assert_eq!(four.dims(), &[1, 2, 2, 3]);
    let one = parse_idx(encode_idx(&[3], &[1, 2, 3]), Path::new("y")).unwrap();
    assert_eq!(one.data(), &[1, 2, 3]);
}

#[test]
fn malformed_files_are_errors_naming_the_file() {
    let p = Path::new("bad.idx");
    let good = encode_idx(&[2, 2, 2], &[0; 8]);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (vec![], "bad.idx: truncated: the header describes 4 bytes, the file holds 0"),
        (vec![0, 0, 8, 3, 0, 0], "bad.idx: truncated: the header describes 16 bytes"),
        (good[..good.len() - 1].to_vec(), "bad.idx: truncated: the header describes 24 bytes, the file holds 23"),
        ([&good[..], &[1]].concat(), "bad.idx: 25 bytes, but the header describes 24"),
        ([&[1, 0], &good[2..]].concat(), "bad.idx: not an IDX file (it must start with the bytes 00 00, found 01 00)"),
        ([&[0, 0, 0x0D], &good[3..]].concat(), "bad.idx: IDX element type 0x0d (float) is not supported"),
    ];
    for (bytes, want) in cases {
        let err = parse_idx(bytes, p).unwrap_err().to_string();
        assert!(err.starts_with(want), "{err:?} should start with {want:?}");
    }
}

#[test]
fn truncated_and_corrupt_gzip_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let raw = encode_idx(&[100, 10, 10], &[3; 10_000]);
    let gz = gzip(&raw);
    let cut = write(dir.path(), "cut.gz", &gz[..gz.len() / 2]);
    let err = read_idx(&cut).unwrap_err().to_string();
    assert!(err.contains("cut.gz: corrupt gzip data"), "{err}");
    let mut flipped = gz.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0xff;
    let bad = write(dir.path(), "flip.gz", &flipped);
    assert!(read_idx(&bad).is_err());
    let tiny = write(dir.path(), "tiny", &[0, 0]);
    let err = read_idx_dims(&tiny).unwrap_err().to_string();
    assert!(
        err.ends_with("tiny: truncated: the header describes 4 bytes, the file holds 2; the file was cut short or damaged: copy or write it again from where it was made"),
        "{err}"
    );
    let header_cut = write(dir.path(), "cut", &gzip(&[0, 0, 8, 3, 0, 0, 0]));
    let err = read_idx_dims(&header_cut).unwrap_err().to_string();
    assert!(
        err.ends_with(
            "cut: truncated: the header describes 16 bytes, the file holds 7; the file was cut short or damaged: \
             copy or write it again from where it was made"
        ),
        "{err}"
    );
    let missing = dir.path().join("nope");
    let err = read_idx(&missing).unwrap_err().to_string();
    assert!(err.starts_with("cannot read ") && err.contains("nope"), "{err}");
}

#[test]
fn absurd_dims_are_an_error_not_an_allocation() {
    let bytes = encode_idx(&[u32::MAX, u32::MAX, u32::MAX], &[]);
    let err = parse_idx(bytes, Path::new("huge")).unwrap_err();
    assert!(matches!(err, DataError::BadDims { .. } | DataError::Truncated { .. }));
}

fn idx_source(dir: &Path, test: bool) -> IdxSource {
    IdxSource {
        dir: dir.to_path_buf(),
        files: IdxFiles {
            train_images: "a".into(),
            train_labels: "b".into(),
            test_images: test.then(|| "c".into()),
            test_labels: test.then(|| "d".into()),
        },
        cache: None,
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
    let mut files = idx_source(Path::new("/nonexistent"), true).files;
    files.test_labels = None;
    let err = test_paths(&files).unwrap_err().to_string();
    assert!(err.contains("needs `both data.files.test_images and data.files.test_labels"), "{err}");
}
