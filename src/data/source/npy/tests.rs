//! `.npy` and `.npz` files written by hand per NumPy's format document, read back; and every
//! refusal, with the file and place it names.

use super::*;
use crate::data::formats::read_all;
use std::io::Write;
use zip::write::SimpleFileOptions;

/// A `.npy` header as NumPy writes it: padded so the data starts at a multiple of 64.
pub(super) fn npy_header(major: u8, dict: &str) -> Vec<u8> {
    let len_size = if major == 1 { 2 } else { 4 };
    let unpadded = 8 + len_size + dict.len() + 1;
    let total = unpadded.div_ceil(64) * 64;
    let text = format!("{dict}{}\n", " ".repeat(total - unpadded));
    let mut out = b"\x93NUMPY".to_vec();
    out.extend([major, 0]);
    match major {
        1 => out.extend((text.len() as u16).to_le_bytes()),
        _ => out.extend((text.len() as u32).to_le_bytes()),
    }
    out.extend(text.as_bytes());
    out
}

/// A whole version-1.0 `.npy` file.
pub(super) fn npy(descr: &str, shape: &[usize], data: &[u8]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let shape = if dims.len() == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) };
    let mut out = npy_header(1, &format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"));
    out.extend(data);
    out
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn npz(dir: &Path, members: &[(&str, Vec<u8>)], method: zip::CompressionMethod) -> PathBuf {
    let path = dir.join("data.npz");
    let mut zip = zip::ZipWriter::new(File::create(&path).unwrap());
    for (name, bytes) in members {
        zip.start_file(*name, SimpleFileOptions::default().compression_method(method)).unwrap();
        zip.write_all(bytes).unwrap();
    }
    zip.finish().unwrap();
    path
}

#[test]
fn a_pair_reads_u8_images_and_integer_classes() {
    let dir = tempfile::tempdir().unwrap();
    let pixels: Vec<u8> = (0..3 * 2 * 2).map(|v| v as u8 * 20).collect();
    let x = write(dir.path(), "x.npy", &npy("|u1", &[3, 2, 2], &pixels));
    let labels: Vec<u8> = [2i64, 0, 5].iter().flat_map(|v| v.to_le_bytes()).collect();
    let y = write(dir.path(), "y.npy", &npy("<i8", &[3], &labels));
    let data = NpyDataset::open_pair(&x, &y).unwrap();
    assert_eq!((data.len(), data.shape(), data.dtype()), (3, &[2, 2][..], Dtype::U8));
    let mut row = [0.0; 4];
    data.read(1, &mut row).unwrap();
    assert_eq!(row, [80.0, 100.0, 120.0, 140.0]);
    assert_eq!(read_all(&data), pixels.iter().map(|&p| f32::from(p)).collect::<Vec<_>>());
    assert_eq!(data.labels().class(2), Some(5));
    assert_eq!(data.labels().classes().map(Classes::len), Some(6));
    assert!(matches!(data.read(3, &mut row), Err(DataError::ExampleOutOfRange { index: 3, examples: 3 })));
    assert!(matches!(data.read(0, &mut [0.0; 3]), Err(DataError::BufferLength { expected: 4, found: 3 })));
}

#[test]
fn every_dtype_and_big_endian_features_convert() {
    let dir = tempfile::tempdir().unwrap();
    let y = write(dir.path(), "y.npy", &npy("|u1", &[2], &[0, 1]));
    let values = [-3.0f64, 100.0];
    let cases: [(&str, Vec<u8>); 9] = [
        ("|i1", values.iter().flat_map(|&v| (v as i8).to_le_bytes()).collect()),
        ("<i2", values.iter().flat_map(|&v| (v as i16).to_le_bytes()).collect()),
        (">i2", values.iter().flat_map(|&v| (v as i16).to_be_bytes()).collect()),
        ("<i4", values.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect()),
        ("<i8", values.iter().flat_map(|&v| (v as i64).to_le_bytes()).collect()),
        ("<f2", values.iter().flat_map(|&v| half::f16::from_f64(v).to_le_bytes()).collect()),
        ("<f4", values.iter().flat_map(|&v| (v as f32).to_le_bytes()).collect()),
        (">f4", values.iter().flat_map(|&v| (v as f32).to_be_bytes()).collect()),
        ("<f8", values.iter().flat_map(|&v| v.to_le_bytes()).collect()),
    ];
    for (descr, bytes) in cases {
        let x = write(dir.path(), "x.npy", &npy(descr, &[2, 1], &bytes));
        let data = NpyDataset::open_pair(&x, &y).unwrap();
        assert_eq!(read_all(&data), [-3.0, 100.0], "{descr}");
    }
    let unsigned: Vec<u8> = [7u16, 65535].iter().flat_map(|v| v.to_le_bytes()).collect();
    let x = write(dir.path(), "x.npy", &npy("<u2", &[2], &unsigned));
    let data = NpyDataset::open_pair(&x, &y).unwrap();
    assert_eq!((data.shape(), data.example_len()), (&[][..], 1));
    assert_eq!(read_all(&data), [7.0, 65535.0]);
}

#[test]
fn float_labels_are_regression_targets() {
    let dir = tempfile::tempdir().unwrap();
    let x = write(dir.path(), "x.npy", &npy("|u1", &[2, 1], &[1, 2]));
    let targets: Vec<u8> = [0.5f32, 1.5, -2.0, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let y = write(dir.path(), "y.npy", &npy("<f4", &[2, 2], &targets));
    let data = NpyDataset::open_pair(&x, &y).unwrap();
    assert_eq!(data.labels(), &Labels::Targets { values: vec![0.5, 1.5, -2.0, 4.0], width: 2 });
}

#[test]
fn npz_members_stored_and_deflated_read_alike() {
    let dir = tempfile::tempdir().unwrap();
    let pixels: Vec<u8> = (0..40).collect();
    let members = [("x.npy", npy("|u1", &[4, 10], &pixels)), ("y.npy", npy("|u1", &[4], &[3, 1, 0, 2]))];
    for method in [zip::CompressionMethod::Stored, zip::CompressionMethod::Deflated] {
        let path = npz(dir.path(), &members, method);
        for (x, y) in [("x", "y"), ("x.npy", "y.npy")] {
            let data = NpyDataset::open_npz(&path, x, y).unwrap();
            assert_eq!(data.len(), 4);
            assert_eq!(data.features().path(), path.join("x.npy"));
            let mut row = [0.0; 10];
            data.read(3, &mut row).unwrap();
            assert_eq!(row[0], 30.0, "{method:?}");
            assert_eq!(data.labels().class(0), Some(3));
        }
        let err = NpyDataset::open_npz(&path, "images", "y").unwrap_err().to_string();
        assert_eq!(err, format!("{}: no array named `images`; it has: x, y", path.display()));
    }
}

#[test]
fn bad_files_are_refused_with_the_file_and_place() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let y = write(d, "y.npy", &npy("|u1", &[3], &[0, 1, 2]));
    let err = |x: &Path, y: &Path| NpyDataset::open_pair(x, y).unwrap_err().to_string();

    let short = write(d, "short.npy", &npy("<f4", &[3, 2], &[0; 20]));
    assert_eq!(
        err(&short, &y),
        format!(
            "{} at byte 148: truncated: the header describes 152 bytes (6 float32 of shape [3, 2]), the file ends here",
            short.display()
        )
    );
    let long = write(d, "long.npy", &npy("|u1", &[3], &[0; 4]));
    assert_eq!(
        err(&long, &y),
        format!("{}: 132 bytes, but the header describes 131; is it the right file?", long.display())
    );
    let two = write(d, "two.npy", &npy("|u1", &[2, 1], &[0; 2]));
    assert_eq!(
        err(&two, &y),
        format!(
            "{} holds 2 examples but {} holds 3 labels; there must be one label per example",
            two.display(),
            y.display()
        )
    );
    let mut fortran = npy_header(1, "{'descr': '|u1', 'fortran_order': True, 'shape': (3, 2), }");
    fortran.extend([0; 6]);
    let fortran = write(d, "f.npy", &fortran);
    assert!(err(&fortran, &y).contains("a Fortran-ordered (column-major) array of shape [3, 2] is not read"));
    let x = write(d, "x.npy", &npy("|u1", &[3], &[0; 3]));
    let negative: Vec<u8> = [1i32, -1, 0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let bad_labels = write(d, "neg.npy", &npy("<i4", &[3], &negative));
    assert_eq!(
        err(&x, &bad_labels),
        format!(
            "{}, record 1: label -1 is not a class index, which must be a whole number from 0",
            bad_labels.display()
        )
    );
    let wide = write(d, "wide.npy", &npy("|u1", &[3, 2], &[0; 6]));
    assert!(err(&x, &wide).contains("labels of shape [3, 2] are neither class indices"));
    let scalar = write(d, "scalar.npy", &npy_header(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (), }"));
    let mut scalar_bytes = std::fs::read(&scalar).unwrap();
    scalar_bytes.push(7);
    std::fs::write(&scalar, scalar_bytes).unwrap();
    assert!(err(&scalar, &y).contains("a 0-dimensional array holds no examples"));
    let not_zip = write(d, "bad.npz", b"not a zip");
    assert!(NpyDataset::open_npz(&not_zip, "x", "y").unwrap_err().to_string().contains("not a readable zip archive"));
    assert!(matches!(NpyDataset::open_pair(&d.join("missing.npy"), &y), Err(DataError::Read { .. })));
}

#[test]
fn an_array_larger_than_memory_is_mapped_not_read() {
    // 64 GiB, more than the machines running this have; the file is sparse, so the disk only
    // holds the header and the one page written.
    let (rows, row) = (1usize << 16, 1usize << 20);
    let dir = tempfile::tempdir().unwrap();
    let header = npy_header(1, &format!("{{'descr': '|u1', 'fortran_order': False, 'shape': ({rows}, {row}), }}"));
    let x = dir.path().join("huge.npy");
    let mut file = File::create(&x).unwrap();
    file.write_all(&header).unwrap();
    file.set_len((header.len() + rows * row) as u64).unwrap();
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start((header.len() + (rows - 1) * row + 5) as u64)).unwrap();
    file.write_all(&[42]).unwrap();
    drop(file);
    let y = write(dir.path(), "y.npy", &npy("|u1", &[rows], &vec![1; rows]));
    let data = NpyDataset::open_pair(&x, &y).unwrap();
    assert_eq!((data.len(), data.example_len()), (rows, row));
    let mut out = vec![0.0; row];
    data.read(rows - 1, &mut out).unwrap();
    assert_eq!((out[4], out[5]), (0.0, 42.0));
}

/// A NaN or infinity in float features is refused when its example is read, naming the file,
/// the record and the value; in float targets, when the labels load. Either would otherwise
/// show up steps later as diverged weights.
#[test]
fn non_finite_features_and_targets_are_refused_naming_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let features: Vec<u8> =
        [0.5f32, 1.0, f32::NAN, 2.0, 3.0, f32::INFINITY].iter().flat_map(|v| v.to_le_bytes()).collect();
    let x = write(d, "x.npy", &npy("<f4", &[3, 2], &features));
    let classes: Vec<u8> = [0i64, 1, 0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let y = write(d, "y.npy", &npy("<i8", &[3], &classes));
    let data = NpyDataset::open_pair(&x, &y).unwrap();
    let mut row = [0.0; 2];
    data.read(0, &mut row).unwrap();
    let err = |i: usize| data.read(i, &mut [0.0; 2]).unwrap_err().to_string();
    let why = "not a finite number; drop the example or fill the value in";
    assert_eq!(err(1), format!("{}, record 1: value 0 of the example is NaN, {why}", x.display()));
    assert_eq!(err(2), format!("{}, record 2: value 1 of the example is inf, {why}", x.display()));

    let ok = write(d, "ok.npy", &npy("<f4", &[3, 2], &[0; 24]));
    let targets: Vec<u8> = [0.5f64, f64::NAN, 1.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let t = write(d, "t.npy", &npy("<f8", &[3], &targets));
    let Err(e) = NpyDataset::open_pair(&ok, &t) else { panic!("a NaN target loaded") };
    assert_eq!(
        e.to_string(),
        format!("{}, record 1: target NaN is not a finite number; drop the example or fill the value in", t.display())
    );
}
