//! Small CIFAR-format files generated here, read back; the preset's download and unpack
//! against a loopback server; and the refusals.

use super::*;
use crate::data::download::tests::serve;
use crate::data::download::{Checksum, Fetcher, RemoteFile};
use crate::data::source::idx::gzip;
use sha2::{Digest, Sha256};
use std::collections::HashMap;

/// A record: label bytes, then the planes R, G, B where pixel p of plane c is `p + 7c + seed`.
fn record(labels: &[u8], seed: u8) -> Vec<u8> {
    let mut out = labels.to_vec();
    for c in 0..3u8 {
        out.extend((0..SIDE * SIDE).map(|p| (p as u8).wrapping_add(7 * c).wrapping_add(seed)));
    }
    out
}

fn write_cifar10(dir: &Path, per_file: usize) {
    for (f, name) in CifarDataset::Cifar10.files(CifarSplit::Train).iter().enumerate() {
        let bytes: Vec<u8> = (0..per_file).flat_map(|i| record(&[(f + i) as u8 % 10], (10 * f + i) as u8)).collect();
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    std::fs::write(dir.join("test_batch.bin"), record(&[9], 200)).unwrap();
}

#[test]
fn cifar10_reads_every_batch_in_order_and_interleaves_the_planes() {
    let dir = tempfile::tempdir().unwrap();
    write_cifar10(dir.path(), 3);
    let train = Cifar::open(dir.path(), CifarDataset::Cifar10, CifarSplit::Train).unwrap();
    assert_eq!((train.len(), train.shape(), train.dtype()), (15, &[32, 32, 3][..], Dtype::U8));
    let mut image = vec![0.0; PIXELS];
    // Example 4 is file 1, record 1: seed 11, label 2.
    train.read(4, &mut image).unwrap();
    assert_eq!(&image[..6], [11.0, 18.0, 25.0, 12.0, 19.0, 26.0]);
    assert_eq!(train.labels().class(4), Some(2));
    assert_eq!(train.labels().classes().unwrap().names()[2], "bird");
    let test = Cifar::open(dir.path(), CifarDataset::Cifar10, CifarSplit::Test).unwrap();
    assert_eq!((test.len(), test.labels().class(0)), (1, Some(9)));
}

#[test]
fn cifar100_reads_the_fine_or_the_coarse_label() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = [record(&[19, 99], 0), record(&[3, 42], 1)].concat();
    std::fs::write(dir.path().join("train.bin"), bytes).unwrap();
    let fine = CifarDataset::Cifar100 { label: Cifar100Label::Fine };
    let coarse = CifarDataset::Cifar100 { label: Cifar100Label::Coarse };
    let data = Cifar::open(dir.path(), fine, CifarSplit::Train).unwrap();
    assert_eq!((data.labels().class(0), data.labels().class(1)), (Some(99), Some(42)));
    assert_eq!(data.labels().classes().unwrap().names()[99], "worm");
    let data = Cifar::open(dir.path(), coarse, CifarSplit::Train).unwrap();
    assert_eq!((data.labels().class(0), data.labels().class(1)), (Some(19), Some(3)));
    assert_eq!(data.labels().classes().map(Classes::len), Some(20));
    let mut image = vec![0.0; PIXELS];
    data.read(1, &mut image).unwrap();
    assert_eq!(&image[..3], [1.0, 8.0, 15.0]);
}

#[test]
fn bad_files_name_the_file_and_the_place() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let err = Cifar::open(d, CifarDataset::Cifar10, CifarSplit::Test).unwrap_err().to_string();
    assert!(err.starts_with(&format!("cifar10: missing in {}: test_batch.bin;", d.display())), "{err}");
    let test = d.join("test_batch.bin");
    let mut bytes = [record(&[1], 0), record(&[2], 0)].concat();
    bytes.truncate(bytes.len() - 100);
    std::fs::write(&test, &bytes).unwrap();
    assert_eq!(
        Cifar::open(d, CifarDataset::Cifar10, CifarSplit::Test).unwrap_err().to_string(),
        format!(
            "{} at byte 3073: truncated: 2973 bytes are left after 1 whole 3073-byte records; is it a cifar10 file?",
            test.display()
        )
    );
    std::fs::write(&test, [record(&[1], 0), record(&[10], 0)].concat()).unwrap();
    assert_eq!(
        Cifar::open(d, CifarDataset::Cifar10, CifarSplit::Test).unwrap_err().to_string(),
        format!("{}, record 1: label 10 is outside the 10 classes of cifar10", test.display())
    );
}

/// A `.tar.gz` holding `files` under `folder/`.
fn archive(folder: &str, files: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(vec![]);
    for (name, bytes) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        builder.append_data(&mut header, format!("{folder}/{name}"), &bytes[..]).unwrap();
    }
    gzip(&builder.into_inner().unwrap())
}

#[test]
fn the_preset_downloads_checks_and_unpacks_the_archive() {
    let dataset = CifarDataset::Cifar100 { label: Cifar100Label::Fine };
    let files = vec![("train.bin".to_string(), record(&[0, 5], 3)), ("test.bin".to_string(), record(&[1, 6], 4))];
    let tgz = archive("cifar-100-binary", &files);
    let sha: String = Sha256::digest(&tgz).iter().map(|b| format!("{b:02x}")).collect();
    let official = CifarPreset::of(dataset);
    assert_eq!(official.archive.name, "cifar-100-binary.tar.gz");
    let preset = CifarPreset {
        archive: RemoteFile { checksum: Checksum::Sha256File(sha), ..official.archive.clone() },
        ..official.clone()
    };
    let addr = serve(HashMap::from([(preset.archive.name.clone(), tgz.clone())]), 1);
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(preset.missing_files(dir.path()), ["train.bin", "test.bin"]);
    let fetcher = Fetcher::with_mirrors(vec![format!("http://{addr}")]);
    let files_dir = preset.fetch_missing(dir.path(), &fetcher).unwrap();
    assert_eq!(files_dir, dir.path().join("cifar-100-binary"));
    assert!(preset.missing_files(dir.path()).is_empty());
    // Only the unpacked folder is left: no archive, no temporary folder.
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["cifar-100-binary"]);
    let test = Cifar::open(&files_dir, dataset, CifarSplit::Test).unwrap();
    assert_eq!(test.labels().class(0), Some(6));
    // Present files are not fetched again (the server would refuse a second request).
    assert_eq!(preset.fetch_missing(dir.path(), &fetcher).unwrap(), files_dir);

    // An archive that fails its checksum is never unpacked.
    let other = tempfile::tempdir().unwrap();
    let addr = serve(HashMap::from([(official.archive.name.clone(), tgz)]), 1);
    let err = official.fetch_missing(other.path(), &Fetcher::with_mirrors(vec![format!("http://{addr}")])).unwrap_err();
    assert!(err.to_string().contains("checksum mismatch: sha256 is "), "{err}");
    assert_eq!(std::fs::read_dir(other.path()).unwrap().count(), 0);
}
