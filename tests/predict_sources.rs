//! `trainrun predict --input` for the sources whose inputs are folders, Arrow streams, TFRecords
//! or binary batches: a `save_to_disk` Dataset folder and an `.arrow` file Hugging Face
//! `datasets` wrote, TFRecord files of `tf.train.Example`s (our writer, as `tests/data_tfrecord.rs`
//! trains on), PNG and JPEG files and folders Pillow wrote, and CIFAR-10 binary batches. Each
//! predicts, byte for byte, what the same rows predict as the test split; a bad file is named
//! with what is wrong and the fix.

mod common;

use common::predict::{predict, train, train_classes};
use common::{assert_exit, tempdir, text, with_python};
use std::path::Path;
use trainrun::data::formats::bench::raw_image_example;
use trainrun::data::source::tfrecord::write_record;

/// `out`'s stderr with the temporary folder `d` written `TMP`.
fn redacted(out: &std::process::Output, d: &Path) -> String {
    text(out).1.replace(&d.display().to_string(), "TMP").trim().to_string()
}

/// Predicts the test split into `whole.npy` and `inputs` into `parts.npy`; both must hold
/// `rows` rows and the same bytes.
fn assert_inputs_predict_as_the_test_split(spec: &Path, d: &Path, inputs: &[String], rows: usize) {
    let run_dir = d.join("run");
    let (whole, parts) = (d.join("whole.npy"), d.join("parts.npy"));
    assert_exit(&predict(spec, &run_dir, &whole, &[]), 0);
    let mut args = vec!["--input"];
    args.extend(inputs.iter().map(String::as_str));
    let out = predict(spec, &run_dir, &parts, &args);
    assert_exit(&out, 0);
    assert!(text(&out).1.contains(&format!("predicted {rows} examples")), "{}", text(&out).1);
    assert!(std::fs::read(&whole).unwrap() == std::fs::read(&parts).unwrap(), "the .npy files differ");
}

#[test]
fn a_datasets_folder_and_an_arrow_file_predict_as_the_validation_split() {
    let tmp = tempdir();
    let d = tmp.path();
    // `a` has no label column, its columns in another order and two Arrow files; `b` has the
    // label and is given as its one `.arrow` file; `test` is a then b.
    let wrote = with_python(
        "datasets",
        r#"
import os, sys, datasets
d = sys.argv[1]
V = datasets.Value
features = datasets.Features({"pixels": datasets.Sequence(V("uint8"), length=16), "bias": V("float64"),
                              "kind": datasets.ClassLabel(names=["bottom", "top", "side"])})
def rows(n, offset, width=16):
    r = range(offset, offset + n)
    return {"pixels": [[(p // 8 == i % 2) * 170 + (i * 31 + p * 7) % 80 for p in range(width)] for i in r],
            "bias": [0.25 * (i % 3) for i in r], "kind": [i % 3 for i in r]}
a, b = rows(7, 500), rows(5, 900)
test = {k: a[k] + b[k] for k in a}
datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows(96, 0), features=features),
                      "test": datasets.Dataset.from_dict(test, features=features)}).save_to_disk(os.path.join(d, "saved"))
unlabeled = datasets.Features({"bias": V("float64"), "pixels": datasets.Sequence(V("uint8"), length=16)})
datasets.Dataset.from_dict({"bias": a["bias"], "pixels": a["pixels"]}, features=unlabeled).save_to_disk(
    os.path.join(d, "a"), num_shards=2)
datasets.Dataset.from_dict(b, features=features).save_to_disk(os.path.join(d, "b"))
datasets.Dataset.from_dict({"bias": a["bias"]}).save_to_disk(os.path.join(d, "nopixels"))
"#,
        d,
    );
    if !wrote {
        return;
    }
    let data = format!(
        "dataset = \"hf_datasets\"\ndir = \"{}\"\n[data.hf_datasets]\nvalidation = \"test\"\n\
         table = {{ label = \"kind\", features = [\"pixels\", \"bias\"] }}",
        d.join("saved").display()
    );
    let spec = train(d, &data);
    let arrow = std::fs::read_dir(d.join("b")).unwrap().map(|e| e.unwrap().path());
    let arrow: Vec<_> = arrow.filter(|p| p.extension().is_some_and(|e| e == "arrow")).collect();
    assert_eq!(arrow.len(), 1, "{arrow:?}");
    let inputs = [d.join("a").display().to_string(), arrow[0].display().to_string()];
    assert_inputs_predict_as_the_test_split(&spec, d, &inputs, 12);

    // A DatasetDict names its splits' folders; a Dataset without a feature column names it.
    let run_dir = d.join("run");
    let saved = d.join("saved").display().to_string();
    let out = predict(&spec, &run_dir, &d.join("dict.npy"), &["--input", &saved]);
    assert_exit(&out, 4);
    insta::assert_snapshot!(redacted(&out, d), @"error: TMP/saved: a DatasetDict holds several splits (train, test); give one split's folder: TMP/saved/train or TMP/saved/test");
    let nopixels = d.join("nopixels").display().to_string();
    let out = predict(&spec, &run_dir, &d.join("nopixels.npy"), &["--input", &nopixels]);
    assert_exit(&out, 4);
    let stderr = redacted(&out, d);
    assert!(stderr.contains("TMP/nopixels/data-00000-of-00001.arrow") && stderr.contains("pixels"), "{stderr}");
}

/// Example `i`'s 4×4 one-channel image and class (`i % 3`).
fn image(i: usize) -> (Vec<u8>, i64) {
    ((0..16).map(|p| ((p / 8 == i % 2) as usize * 170 + (i * 31 + p * 7) % 80) as u8).collect(), (i % 3) as i64)
}

/// A TFRecord file of examples `examples`, with their labels or (`labelled` false) without.
fn tfrecords(path: &Path, examples: impl Iterator<Item = usize>, labelled: bool) {
    use prost::Message;
    use trainrun::data::source::tfrecord::proto;
    let mut bytes = vec![];
    for i in examples {
        let (pixels, label) = image(i);
        let example = match labelled {
            true => raw_image_example(pixels, label),
            false => {
                let kind = proto::feature::Kind::BytesList(proto::BytesList { value: vec![pixels.into()] });
                let feature = [("image".to_string(), proto::Feature { kind: Some(kind) })].into_iter().collect();
                proto::Example { features: Some(proto::Features { feature }) }.encode_to_vec()
            }
        };
        write_record(&mut bytes, &example).unwrap();
    }
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn tfrecord_files_with_or_without_labels_predict_as_the_test_split() {
    let tmp = tempdir();
    let d = tmp.path();
    tfrecords(&d.join("train.tfrecord"), 0..96, true);
    tfrecords(&d.join("test.tfrecord"), (500..507).chain(900..905), true);
    tfrecords(&d.join("a.tfrecord"), 500..507, false);
    tfrecords(&d.join("b.tfrecord"), 900..905, true);
    let data = format!(
        "dataset = \"tfrecord\"\ndir = \"{}\"\n[data.tfrecord]\ntrain = [\"train.tfrecord\"]\n\
         test = [\"test.tfrecord\"]\nshape = [4, 4, 1]\nclasses = 3\nshuffle_buffer = 0",
        d.display()
    );
    let spec = train(d, &data);
    let inputs = ["a.tfrecord", "b.tfrecord"].map(|f| d.join(f).display().to_string());
    assert_inputs_predict_as_the_test_split(&spec, d, &inputs, 12);

    // A record of another size names the file, the record's offset and both sizes.
    let mut bytes = vec![];
    write_record(&mut bytes, &raw_image_example(vec![7; 9], 0)).unwrap();
    std::fs::write(d.join("small.tfrecord"), bytes).unwrap();
    let small = d.join("small.tfrecord").display().to_string();
    let out = predict(&spec, &d.join("run"), &d.join("small.npy"), &["--input", &small]);
    assert_exit(&out, 4);
    insta::assert_snapshot!(redacted(&out, d), @"error: TMP/small.tfrecord at byte 0: feature `image` holds 9 bytes; the shape [4, 4, 1] needs 16: write every example in that shape, or set data.tfrecord.shape to the examples' own");
}

#[test]
fn png_and_jpeg_files_and_folders_predict_as_the_test_split() {
    let tmp = tempdir();
    let d = tmp.path();
    // Pillow writes them, of several sizes (each is resized to 6×6) and modes.
    let wrote = with_python(
        "PIL",
        r#"
import os, sys
from PIL import Image
d = sys.argv[1]
def image(path, i, size):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    img = Image.new("RGB", size)
    img.putdata([((x * 37 + i * 11) % 256, (y * 53 + i * 5) % 256, (x * y + i) % 256)
                 for y in range(size[1]) for x in range(size[0])])
    (img.convert("L") if i % 4 == 3 else img).save(path)
for split, n in [("train", 24), ("test", 5)]:
    for c, cls in enumerate(["cat", "dog", "eel"]):
        for i in range(n):
            ext = "jpg" if i % 3 == 2 else "png"
            image(os.path.join(d, split, cls, "%02d.%s" % (i, ext)), i * 3 + c, (6 + i % 3, 7 + i % 2))
os.makedirs(os.path.join(d, "empty"))
open(os.path.join(d, "notes.png"), "w").write("not an image")
"#,
        d,
    );
    if !wrote {
        return;
    }
    let data = format!(
        "dataset = \"image_folder\"\ndir = \"{}\"\n[data.image_folder]\ntest = \"test\"\nimage_size = [6, 6]",
        d.display()
    );
    let spec = train(d, &data);
    // `cat` and `dog` as folders, `eel`'s images one by one.
    let mut inputs = ["test/cat", "test/dog"].map(|f| d.join(f).display().to_string()).to_vec();
    let mut eel: Vec<_> = std::fs::read_dir(d.join("test/eel")).unwrap().map(|e| e.unwrap().path()).collect();
    eel.sort();
    inputs.extend(eel.iter().map(|p| p.display().to_string()));
    assert_inputs_predict_as_the_test_split(&spec, d, &inputs, 15);

    // A file that is no image names it; a folder of none says so.
    let run_dir = d.join("run");
    let notes = d.join("notes.png").display().to_string();
    let out = predict(&spec, &run_dir, &d.join("notes.npy"), &["--input", &notes]);
    assert_exit(&out, 4);
    insta::assert_snapshot!(redacted(&out, d), @"error: cannot decode the image TMP/notes.png: The image format could not be determined");
    let empty = d.join("empty").display().to_string();
    let out = predict(&spec, &run_dir, &d.join("empty.npy"), &["--input", &empty]);
    assert_exit(&out, 4);
    insta::assert_snapshot!(redacted(&out, d), @"error: TMP/empty: the folder holds no .png, .jpg or .jpeg image, in it or its subfolders; give image files or a folder that holds them");
}

/// CIFAR-10 records `examples`: a label byte, then 32×32 red, green and blue planes.
fn cifar_records(examples: impl Iterator<Item = usize>) -> Vec<u8> {
    let mut bytes = vec![];
    for i in examples {
        bytes.push((i % 3) as u8);
        bytes.extend((0..3072).map(|p| ((p / 1536 == i % 2) as usize * 170 + (i * 31 + p * 7) % 80) as u8));
    }
    bytes
}

#[test]
fn cifar_binary_batches_predict_as_the_test_split() {
    let tmp = tempdir();
    let d = tmp.path();
    for f in 1..=5 {
        std::fs::write(d.join(format!("data_batch_{f}.bin")), cifar_records(f * 100..f * 100 + 16)).unwrap();
    }
    std::fs::write(d.join("test_batch.bin"), cifar_records((500..507).chain(900..905))).unwrap();
    std::fs::write(d.join("a.bin"), cifar_records(500..507)).unwrap();
    std::fs::write(d.join("b.bin"), cifar_records(900..905)).unwrap();
    let spec = train_classes(d, &format!("dataset = \"cifar10\"\ndir = \"{}\"", d.display()), 10);
    let inputs = ["a.bin", "b.bin"].map(|f| d.join(f).display().to_string());
    assert_inputs_predict_as_the_test_split(&spec, d, &inputs, 12);

    // A file that is not whole records names the bytes left over.
    let mut cut = cifar_records(0..2);
    cut.truncate(3073 + 100);
    std::fs::write(d.join("cut.bin"), cut).unwrap();
    let cut = d.join("cut.bin").display().to_string();
    let out = predict(&spec, &d.join("run"), &d.join("cut.npy"), &["--input", &cut]);
    assert_exit(&out, 4);
    // After the warnings that the training files are not the published ones' size.
    let stderr = redacted(&out, d);
    insta::assert_snapshot!(stderr.lines().last().unwrap_or_default(), @"error: TMP/cut.bin at byte 3073: truncated: 100 bytes are left after 1 whole 3073-byte records; is it a cifar10 file?");
}
