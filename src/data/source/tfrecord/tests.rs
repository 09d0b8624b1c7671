//! TFRecord files written here (framing by [`write_record`], `Example`s by the prost types),
//! read back plain and gzip, shuffled and resumed; and every refusal with its byte offset.

use super::proto::{self, feature::Kind};
use super::*;
use crate::data::formats::bench::raw_image_example;
use crate::data::pipeline::Batch;
use prost::Message;
use std::path::Path;

fn example(features: Vec<(&str, Kind)>) -> Vec<u8> {
    let feature = features.into_iter().map(|(k, kind)| (k.to_string(), proto::Feature { kind: Some(kind) })).collect();
    proto::Example { features: Some(proto::Features { feature }) }.encode_to_vec()
}

fn int64(v: i64) -> Kind {
    Kind::Int64List(proto::Int64List { value: vec![v] })
}

fn bytes(b: Vec<u8>) -> Kind {
    Kind::BytesList(proto::BytesList { value: vec![Bytes::from(b)] })
}

fn file(dir: &Path, name: &str, payloads: &[Vec<u8>]) -> PathBuf {
    let mut out = vec![];
    for p in payloads {
        write_record(&mut out, p).unwrap();
    }
    let path = dir.join(name);
    std::fs::write(&path, out).unwrap();
    path
}

fn raw_spec(shape: Vec<usize>) -> ExampleSpec {
    ExampleSpec {
        image_key: "image".into(),
        image: ImageEncoding::Raw { shape },
        label_key: "label".into(),
        classes: None,
    }
}

/// `n` examples whose 2×2 image is `[i, i+1, i+2, i+3]` and label `i`.
fn numbered(n: usize, from: usize) -> Vec<Vec<u8>> {
    (from..from + n).map(|i| raw_image_example((i..i + 4).map(|v| v as u8).collect(), i as i64)).collect()
}

fn labels(stream: &mut ExampleStream) -> Vec<u32> {
    let mut out = vec![0.0; stream.example_len()];
    std::iter::from_fn(|| stream.next_into(&mut out).unwrap()).collect()
}

#[test]
fn framing_round_trips_and_the_scan_finds_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let payloads = vec![b"a".to_vec(), vec![], vec![7; 300_000]];
    let path = file(dir.path(), "r.tfrecord", &payloads);
    let mut reader = RecordFile::open(&path, Compression::None).unwrap();
    let mut buf = vec![];
    let mut offsets = vec![];
    while let Some(at) = reader.read_into(&mut buf).unwrap() {
        assert_eq!(buf, payloads[offsets.len()]);
        offsets.push(at);
    }
    assert_eq!(offsets, [0, 17, 33]);
    assert_eq!(scan(&path, Compression::None).unwrap(), offsets);
    assert_eq!(Compression::detect(&path).unwrap(), Compression::None);
    let gz = dir.path().join("r.tfrecord.gz");
    std::fs::write(&gz, crate::data::source::idx::gzip(&std::fs::read(&path).unwrap())).unwrap();
    assert_eq!(Compression::detect(&gz).unwrap(), Compression::Gzip);
    assert_eq!(scan(&gz, Compression::Gzip).unwrap(), offsets);
}

#[test]
fn examples_stream_across_files_plain_and_gzip() {
    let dir = tempfile::tempdir().unwrap();
    let a = file(dir.path(), "a", &numbered(3, 0));
    let b = file(dir.path(), "b", &numbered(2, 3));
    let b_gz = dir.path().join("b.gz");
    std::fs::write(&b_gz, crate::data::source::idx::gzip(&std::fs::read(&b).unwrap())).unwrap();
    let mut stream = ExampleStream::new(vec![a.clone(), b], Compression::None, raw_spec(vec![2, 2, 1]), Order::Files);
    assert_eq!((stream.shape(), stream.dtype()), (&[2, 2, 1][..], Dtype::U8));
    let mut image = [0.0; 4];
    assert_eq!(stream.next_into(&mut image).unwrap(), Some(0));
    assert_eq!(image, [0.0, 1.0, 2.0, 3.0]);
    assert_eq!(labels(&mut stream), [1, 2, 3, 4]);
    let mut gz = ExampleStream::new(vec![b_gz], Compression::Gzip, raw_spec(vec![4]), Order::Files);
    assert_eq!(gz.next_into(&mut image).unwrap(), Some(3));
    assert_eq!(image, [3.0, 4.0, 5.0, 6.0]);
}

#[test]
fn float_lists_and_encoded_images_decode() {
    let dir = tempfile::tempdir().unwrap();
    let floats =
        example(vec![("x", Kind::FloatList(proto::FloatList { value: vec![0.5, -1.0, 2.0] })), ("y", int64(4))]);
    let path = file(dir.path(), "f", &[floats]);
    let spec = ExampleSpec {
        image_key: "x".into(),
        image: ImageEncoding::Floats { shape: vec![3] },
        label_key: "y".into(),
        classes: Some(5),
    };
    let mut stream = ExampleStream::new(vec![path], Compression::None, spec.clone(), Order::Files);
    let mut out = [0.0; 3];
    assert_eq!((stream.next_into(&mut out).unwrap(), out), (Some(4), [0.5, -1.0, 2.0]));
    // A NaN stored in a float list is refused where it lies, not trained on.
    let nan =
        example(vec![("x", Kind::FloatList(proto::FloatList { value: vec![0.5, f32::NAN, 2.0] })), ("y", int64(4))]);
    let path = file(dir.path(), "nan", &[nan]);
    let err = first_error(&path, spec).to_string();
    assert!(
        err.ends_with("at byte 0: feature `x`: value 1 of the example is NaN, not a finite number; drop the example or fill the value in"),
        "{err}"
    );

    let gray = image::GrayImage::from_raw(2, 1, vec![0, 100]).unwrap();
    let mut png = std::io::Cursor::new(vec![]);
    gray.write_to(&mut png, image::ImageFormat::Png).unwrap();
    let path = file(dir.path(), "p", &[example(vec![("image/encoded", bytes(png.into_inner())), ("label", int64(1))])]);
    let n = |v| NonZeroUsize::new(v).unwrap();
    let spec = ExampleSpec {
        image_key: "image/encoded".into(),
        image: ImageEncoding::Encoded { height: n(1), width: n(4), color_mode: ColorMode::Grayscale },
        label_key: "label".into(),
        classes: None,
    };
    let mut stream = ExampleStream::new(vec![path], Compression::None, spec, Order::Files);
    let mut out = [0.0; 4];
    assert_eq!((stream.next_into(&mut out).unwrap(), out), (Some(1), [0.0, 25.0, 75.0, 100.0]));
}

#[test]
fn shuffling_is_the_buffer_order_and_skipping_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let a = file(dir.path(), "a", &numbered(40, 0));
    let b = file(dir.path(), "b", &numbered(25, 40));
    let files = vec![a, b];
    let order = Order::Shuffled { buffer_size: NonZeroUsize::new(16).unwrap(), seed: 5, epoch: 1 };
    let open = |order| ExampleStream::new(files.clone(), Compression::None, raw_spec(vec![4]), order);
    let shuffled = labels(&mut open(order));
    let mut buffer = ShuffleBuffer::new(NonZeroUsize::new(16).unwrap(), 5, 1);
    let mut input = 0..65u32;
    let expected: Vec<u32> =
        std::iter::from_fn(|| buffer.next_from(|| Ok::<_, DataError>(input.next())).unwrap()).collect();
    assert_eq!(shuffled, expected);
    assert_ne!(shuffled, (0..65).collect::<Vec<_>>());
    for order in [order, Order::Files] {
        let all = labels(&mut open(order));
        for k in [0, 1, 39, 40, 64, 65] {
            let mut resumed = open(order);
            assert_eq!(resumed.skip(k as u64).unwrap(), k as u64);
            assert_eq!(labels(&mut resumed), all[k..], "{order:?} skip {k}");
        }
        assert_eq!(open(order).skip(100).unwrap(), 65);
    }
}

fn first_error(path: &Path, spec: ExampleSpec) -> DataError {
    let mut stream = ExampleStream::new(vec![path.to_path_buf()], Compression::None, spec.clone(), Order::Files);
    let mut out = vec![0.0; spec.shape().iter().product()];
    loop {
        match stream.next_into(&mut out) {
            Ok(Some(_)) => {}
            Ok(None) => panic!("no error in {}", path.display()),
            Err(e) => return e,
        }
    }
}

#[test]
fn corrupt_records_name_the_file_and_the_byte_offset() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read(file(dir.path(), "good", &numbered(3, 0))).unwrap();
    let record = good.len() / 3;
    let spec = raw_spec(vec![4]);
    let write = |name: &str, bytes: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    };
    let mut bad_len = good.clone();
    bad_len[record] ^= 1;
    let path = write("len", &bad_len);
    let err = first_error(&path, spec.clone());
    assert!(matches!(err, DataError::BadCrc { part: "length", offset, .. } if offset == record as u64), "{err}");
    assert!(
        err.to_string()
            .starts_with(&format!("{}: the record at byte {record} fails its length checksum", path.display()))
    );
    let mut bad_data = good.clone();
    bad_data[2 * record + 20] ^= 0x40;
    let err = first_error(&write("data", &bad_data), spec.clone());
    assert!(matches!(err, DataError::BadCrc { part: "data", offset, .. } if offset == 2 * record as u64), "{err}");
    let path = write("short", &good[..2 * record + 30]);
    assert_eq!(
        first_error(&path, spec.clone()).to_string(),
        format!(
            "{} at byte {}: truncated: the file ends inside a {}-byte record",
            path.display(),
            2 * record,
            record - 16
        )
    );
    let path = write("head", &good[..record + 5]);
    assert!(
        first_error(&path, spec.clone())
            .to_string()
            .contains("truncated: the file ends 5 bytes into a 12-byte record header")
    );
    let scan_err = scan(&write("scan", &good[..2 * record + 30]), Compression::None).unwrap_err().to_string();
    assert!(scan_err.contains(&format!("at byte {}: truncated", 2 * record)), "{scan_err}");
}

#[test]
fn examples_that_do_not_fit_the_spec_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let err = |payload: Vec<u8>, spec: ExampleSpec| {
        let path = file(dir.path(), "e", &[numbered(1, 0).remove(0), payload]);
        first_error(&path, spec).to_string().replace(&path.display().to_string(), "e")
    };
    let at = numbered(1, 0)[0].len() + 16;
    assert_eq!(
        err(example(vec![("img", bytes(vec![0; 4])), ("label", int64(0))]), raw_spec(vec![4])),
        format!("e at byte {at}: no feature named `image` (did you mean `img`?); it has: img, label")
    );
    assert_eq!(
        err(example(vec![("image", bytes(vec![0; 5])), ("label", int64(0))]), raw_spec(vec![4])),
        format!(
            "e at byte {at}: feature `image` holds 5 bytes; the shape [4] needs 4: write every example in that \
             shape, or set data.tfrecord.shape to the examples' own"
        )
    );
    assert_eq!(
        err(example(vec![("image", int64(3)), ("label", int64(0))]), raw_spec(vec![4])),
        format!("e at byte {at}: feature `image` must be one bytes value, found 1 int64s")
    );
    assert_eq!(
        err(example(vec![("image", bytes(vec![0; 4])), ("label", int64(-2))]), raw_spec(vec![4])),
        format!("e at byte {at}: label -2 is not a class index, which must be a whole number from 0")
    );
    let ten = ExampleSpec { classes: Some(3), ..raw_spec(vec![4]) };
    assert!(err(example(vec![("image", bytes(vec![0; 4])), ("label", int64(3))]), ten).ends_with("must be in 0..3"));
    assert!(err(vec![0xff; 7], raw_spec(vec![4])).starts_with(&format!("e at byte {at}: not a tf.train.Example: ")));
    let png = ExampleSpec {
        image: ImageEncoding::Encoded {
            height: NonZeroUsize::MIN,
            width: NonZeroUsize::MIN,
            color_mode: ColorMode::Rgb,
        },
        ..raw_spec(vec![])
    };
    let broken = err(example(vec![("image", bytes(vec![0x89, b'P', b'N', b'G'])), ("label", int64(0))]), png);
    // The first record, raw bytes, is no PNG either.
    assert!(broken.starts_with("e at byte 0: feature `image`: cannot decode the image: "), "{broken}");
}

#[test]
fn reads_by_index_in_file_order_across_files_and_backwards() {
    let dir = tempfile::tempdir().unwrap();
    for (f, range) in [(0, 0..3), (1, 3..7)] {
        let mut bytes = vec![];
        for i in range {
            write_record(&mut bytes, &raw_image_example(vec![i as u8 * 10; 2], i)).unwrap();
        }
        std::fs::write(dir.path().join(format!("p{f}.tfrecord")), bytes).unwrap();
    }
    let config: TfRecordConfig =
        toml::from_str("train = [\"p*.tfrecord\"]\nshape = [2]\nclasses = 7\nshuffle_buffer = 0").unwrap();
    let source = TfRecordSource { dir: dir.path().to_path_buf(), config };
    let data = source.load().unwrap();
    assert_eq!((data.train.len(), data.train.records().map(|r| r.unit_lens())), (7, Some(&[3, 4][..])));
    let b = data.train.read(2..5).unwrap();
    assert_eq!(
        (b.y, b.x),
        (vec![2, 3, 4], vec![20. / 255., 20. / 255., 30. / 255., 30. / 255., 40. / 255., 40. / 255.])
    );
    assert_eq!(data.train.read(0..1).unwrap().y, [0], "a read behind the last one starts again");
    assert_eq!(source.facts().unwrap().train_files, 2);

    // Taken whole and decoded in parallel, the same values and labels as one by one; past
    // the end, nothing more is taken.
    let records = data.train.records().unwrap();
    let (one, mut all) = (data.train.read(0..7).unwrap(), Batch::default());
    let (mut reader, mut taken) = (records.open_units(&[0, 1], Order::Files), 0);
    while reader.take().unwrap() {
        taken += 1;
    }
    assert_eq!(taken, 7);
    reader.decode(&mut all).unwrap();
    assert_eq!((all.x, all.y), (one.x, one.y));
}
