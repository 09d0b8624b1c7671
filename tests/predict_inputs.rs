//! `trainrun predict --input FILE…` end to end: files that NumPy, Python's json and pyarrow
//! wrote, read by the spec's own source (a CSV, JSONL or Parquet table with or without its label,
//! `.npy` arrays of bytes, MNIST's IDX images), predict exactly as their concatenation does as the test split: the same
//! probabilities, byte for byte, with `file` and `row` columns naming each row's origin. A file
//! of another shape names both shapes; missing files are all named; a source that reads no
//! input files says which do. The other sources' inputs are in `tests/predict_sources.rs`.

mod common;

use common::predict::{predict, train};
use common::{assert_exit, data_dir, short_mnist_run, tempdir, text, with_python};
use std::path::Path;

/// Lines of a prediction CSV without the header.
fn rows(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap().lines().skip(1).map(str::to_string).collect()
}

#[test]
fn csv_inputs_predict_as_their_concatenation_does_with_file_and_row() {
    let tmp = tempdir();
    let d = tmp.path();
    // a.csv has no label column, b.csv has it first: columns are read by name.
    let wrote = with_python(
        "numpy",
        "import numpy as np, sys, os\n\
         d = sys.argv[1]; r = np.random.default_rng(5)\n\
         def table(name, x, y, label_first=False):\n\
         \x20   with open(os.path.join(d, name), 'w') as f:\n\
         \x20       cols = ['f0', 'f1', 'f2', 'f3']\n\
         \x20       f.write(','.join((['y'] + cols) if label_first else (cols + ['y'] if y is not None else cols)) + '\\n')\n\
         \x20       for i in range(len(x)):\n\
         \x20           v = ['%.6f' % c for c in x[i]]\n\
         \x20           if y is not None: v = ([str(y[i])] + v) if label_first else (v + [str(y[i])])\n\
         \x20           f.write(','.join(v) + '\\n')\n\
         x = r.random((150, 4), dtype=np.float32); y = (x.sum(1) * 3 / 4).astype(int) % 3\n\
         table('train.csv', x, y)\n\
         a = r.random((7, 4), dtype=np.float32); b = r.random((5, 4), dtype=np.float32)\n\
         table('a.csv', a, None); table('b.csv', b, [1] * 5, label_first=True)\n\
         table('all.csv', np.concatenate([a, b]), [0] * 12)\n",
        d,
    );
    if !wrote {
        return;
    }
    let data =
        format!("dataset = \"csv\"\ndir = \"{}\"\n[data.csv]\ntrain = \"train.csv\"\nlabel = \"y\"", d.display());
    let spec = train(d, &data);
    let run_dir = d.join("run");
    let (a, b) = (d.join("a.csv").display().to_string(), d.join("b.csv").display().to_string());
    let all = format!("data.csv.test=\"{}\"", d.join("all.csv").display());
    for ext in ["csv", "npy"] {
        let (whole, parts) = (d.join(format!("whole.{ext}")), d.join(format!("parts.{ext}")));
        assert_exit(&predict(&spec, &run_dir, &whole, &["--set", &all]), 0);
        // Both spellings: several paths after one flag, and the flag repeated.
        let out = match ext {
            "csv" => predict(&spec, &run_dir, &parts, &["--input", &a, &b]),
            _ => predict(&spec, &run_dir, &parts, &["--input", &a, "--input", &b]),
        };
        assert_exit(&out, 0);
        assert!(text(&out).1.contains("predicted 12 examples"), "{}", text(&out).1);
        if ext == "npy" {
            assert!(std::fs::read(&whole).unwrap() == std::fs::read(&parts).unwrap(), "the .npy files differ");
            continue;
        }
        let header = std::fs::read_to_string(&parts).unwrap().lines().next().unwrap().to_string();
        assert!(header.starts_with("id,file,row,class,"), "{header}");
        let (whole, parts) = (rows(&whole), rows(&parts));
        assert_eq!(parts.len(), 12);
        for (i, (w, p)) in whole.iter().zip(&parts).enumerate() {
            let (file, row) = if i < 7 { (&a, i) } else { (&b, i - 7) };
            let (id, rest) = w.split_once(',').unwrap();
            assert_eq!(id, i.to_string());
            assert_eq!(p, &format!("{i},{file},{row},{rest}"), "row {i}");
        }
    }
    // JSON lines name the file and the row too.
    let jsonl = d.join("parts.jsonl");
    assert_exit(&predict(&spec, &run_dir, &jsonl, &["--input", &a, &b]), 0);
    let last: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(&jsonl).unwrap().lines().last().unwrap()).unwrap();
    assert_eq!(
        (last["id"].as_u64(), last["file"].as_str(), last["row"].as_u64()),
        (Some(11), Some(b.as_str()), Some(4))
    );

    // A table without one of the features names it, and the columns it has too many.
    std::fs::write(d.join("bad.csv"), "f0,f1,f3,extra\n1,2,3,4\n").unwrap();
    let bad = d.join("bad.csv").display().to_string();
    let out = predict(&spec, &run_dir, &d.join("bad_out.csv"), &["--input", &bad]);
    assert_exit(&out, 4);
    let stderr = text(&out).1.replace(&d.display().to_string(), "TMP");
    insta::assert_snapshot!(stderr.trim(), @"error: TMP/bad.csv:1:1: its columns are not the model's features: missing `f2`; extra `extra`; the features are read by name (`f0`, `f1`, `f2`, `f3`), the label column `y` may be left out: fix the header, or list the columns to read in data.csv.features");
}

#[test]
fn npy_inputs_predict_byte_for_byte_as_their_concatenation_and_other_shapes_name_both() {
    let tmp = tempdir();
    let d = tmp.path();
    let wrote = with_python(
        "numpy",
        "import numpy as np, sys, os\n\
         d = sys.argv[1]; r = np.random.default_rng(9)\n\
         s = lambda n, a: np.save(os.path.join(d, n), a)\n\
         img = lambda n: r.integers(0, 256, (n, 6, 6, 1), dtype=np.uint8)\n\
         s('x_train.npy', img(64)); s('y_train.npy', r.integers(0, 3, 64))\n\
         a, b = img(9), img(4)\n\
         s('x_a.npy', a); s('x_b.npy', b)\n\
         s('x_test.npy', np.concatenate([a, b])); s('y_test.npy', np.zeros(13, dtype=np.int64))\n\
         s('x_flat.npy', r.integers(0, 256, (5, 36), dtype=np.uint8))\n",
        d,
    );
    if !wrote {
        return;
    }
    let data = format!(
        "dataset = \"npy\"\ndir = \"{}\"\n[data.npy]\ntrain = {{ features = \"x_train.npy\", labels = \"y_train.npy\" }}\n\
         test = {{ features = \"x_test.npy\", labels = \"y_test.npy\" }}",
        d.display()
    );
    let spec = train(d, &data);
    let run_dir = d.join("run");
    let file = |n: &str| d.join(n).display().to_string();
    let (whole, parts) = (d.join("whole.npy"), d.join("parts.npy"));
    assert_exit(&predict(&spec, &run_dir, &whole, &[]), 0);
    assert_exit(&predict(&spec, &run_dir, &parts, &["--input", &file("x_a.npy"), &file("x_b.npy")]), 0);
    assert!(std::fs::read(&whole).unwrap() == std::fs::read(&parts).unwrap(), "the .npy files differ");

    let redact = |out: &std::process::Output| text(out).1.replace(&d.display().to_string(), "TMP");
    let out = predict(&spec, &run_dir, &d.join("flat.npy"), &["--input", &file("x_a.npy"), &file("x_flat.npy")]);
    assert_exit(&out, 2);
    insta::assert_snapshot!(redact(&out).trim(), @"error: --input: TMP/x_flat.npy holds examples of shape [36], but the model reads examples of shape [6, 6, 1] (those of the spec's training data); write each file's examples in that shape (NumPy: `x.reshape(-1, 6, 6, 1)`)");
    assert!(!d.join("flat.npy").exists());

    let out = predict(
        &spec,
        &run_dir,
        &d.join("gone.npy"),
        &["--input", &file("x_a.npy"), &file("nope.npy"), &file("gone.npy")],
    );
    assert_exit(&out, 2);
    insta::assert_snapshot!(redact(&out).trim(), @"error: --input: TMP/nope.npy, TMP/gone.npy are not files (paths are relative to the current directory, not data.dir); check the names");
}

#[test]
fn mnist_idx_images_given_as_input_predict_as_the_test_split() {
    let tmp = tempdir();
    let run_dir = tmp.path().join("run");
    short_mnist_run(&run_dir, 20);
    let spec = Path::new("specs/mnist_single.toml");
    let images = ["t10k-images-idx3-ubyte.gz", "t10k-images-idx3-ubyte"].map(|n| data_dir().join(n));
    let images = images.iter().find(|p| p.exists()).expect("the MNIST test images").display().to_string();
    let (whole, parts) = (tmp.path().join("whole.npy"), tmp.path().join("parts.npy"));
    assert_exit(&predict(spec, &run_dir, &whole, &[]), 0);
    assert_exit(&predict(spec, &run_dir, &parts, &["--input", &images]), 0);
    assert!(std::fs::read(&whole).unwrap() == std::fs::read(&parts).unwrap(), "the .npy files differ");
}

#[test]
fn a_source_that_reads_no_input_files_says_which_do() {
    let tmp = tempdir();
    let run_dir = tmp.path().join("run");
    short_mnist_run(&run_dir, 2);
    let input = tmp.path().join("x.bin");
    std::fs::write(&input, b"x").unwrap();
    let synthetic = "data={ dataset = \"synthetic\", synthetic = { train_examples = 64, test_examples = 64 } }";
    let out = predict(
        Path::new("specs/mnist_single.toml"),
        &run_dir,
        &tmp.path().join("p.csv"),
        &["--set", synthetic, "--input", input.to_str().unwrap()],
    );
    assert_exit(&out, 4);
    let stderr = text(&out).1.replace(&tmp.path().display().to_string(), "TMP");
    insta::assert_snapshot!(stderr.trim(), @r#"error: TMP/x.bin: data.dataset = "synthetic" reads no --input files; predict over its test split instead (drop --input), or train on a source that reads them: csv (a table with the training table's feature columns), npy (a .npy array of features), parquet (a file with the training files' feature columns), jsonl (objects with the training table's feature fields), hf_datasets (a Dataset folder save_to_disk wrote, or one of its .arrow files, with the training split's feature columns), tfrecord (a file of tf.train.Examples holding the image feature), image_folder (PNG or JPEG files, or folders of them), cifar10 and cifar100 (a binary batch file), idx, mnist and fashion_mnist (an IDX file of images)"#);
}

#[test]
fn parquet_inputs_predict_as_their_concatenation_does() {
    let tmp = tempdir();
    let d = tmp.path();
    // pyarrow writes them: a.parquet has no label and its columns in another order, b.parquet
    // has the label first and two row groups.
    let wrote = with_python(
        "pyarrow",
        "import numpy as np, sys, os, pyarrow as pa, pyarrow.parquet as pq\n\
         d = sys.argv[1]; r = np.random.default_rng(6)\n\
         def table(name, x, y, order, **kw):\n\
         \x20   cols = {'f%d' % i: pa.array(x[:, i]) for i in range(x.shape[1])}\n\
         \x20   if y is not None: cols['y'] = pa.array(np.asarray(y, dtype=np.int64))\n\
         \x20   pq.write_table(pa.table({k: cols[k] for k in order if k in cols}), os.path.join(d, name), **kw)\n\
         x = r.random((150, 4), dtype=np.float32); y = (x.sum(1) * 3 / 4).astype(int) % 3\n\
         table('train.parquet', x, y, ['f0', 'f1', 'f2', 'f3', 'y'])\n\
         a = r.random((7, 4), dtype=np.float32); b = r.random((5, 4), dtype=np.float32)\n\
         table('a.parquet', a, None, ['f3', 'f1', 'f0', 'f2'])\n\
         table('b.parquet', b, [1] * 5, ['y', 'f0', 'f1', 'f2', 'f3'], row_group_size=3)\n\
         table('all.parquet', np.concatenate([a, b]), [0] * 12, ['f0', 'f1', 'f2', 'f3', 'y'])\n\
         table('bad.parquet', a[:, :3], None, ['f0', 'f1', 'f2'])\n",
        d,
    );
    if !wrote {
        return;
    }
    let data = format!(
        "dataset = \"parquet\"\ndir = \"{}\"\n[data.parquet]\ntrain = [\"train.parquet\"]\n\
         table = {{ label = \"y\", features = [\"f0\", \"f1\", \"f2\", \"f3\"] }}",
        d.display()
    );
    let spec = train(d, &data);
    let run_dir = d.join("run");
    let (a, b) = (d.join("a.parquet").display().to_string(), d.join("b.parquet").display().to_string());
    let (whole, parts) = (d.join("whole.npy"), d.join("parts.npy"));
    assert_exit(&predict(&spec, &run_dir, &whole, &["--set", "data.parquet.validation=[\"all.parquet\"]"]), 0);
    let out = predict(&spec, &run_dir, &parts, &["--input", &a, &b]);
    assert_exit(&out, 0);
    assert!(text(&out).1.contains("predicted 12 examples"), "{}", text(&out).1);
    assert!(std::fs::read(&whole).unwrap() == std::fs::read(&parts).unwrap(), "the .npy files differ");

    // A file without one of the feature columns names it.
    let bad = d.join("bad.parquet").display().to_string();
    let out = predict(&spec, &run_dir, &d.join("bad_out.npy"), &["--input", &bad]);
    assert_exit(&out, 4);
    let stderr = text(&out).1;
    assert!(stderr.contains("bad.parquet") && stderr.contains("f3"), "{stderr}");
}

#[test]
fn jsonl_inputs_predict_as_their_concatenation_does() {
    let tmp = tempdir();
    let d = tmp.path();
    // Python's json writes them: a number and an array field; a.jsonl has no label and its
    // keys in another order, b.jsonl has the label first.
    let wrote = with_python(
        "numpy",
        "import numpy as np, sys, os, json\n\
         d = sys.argv[1]; r = np.random.default_rng(7)\n\
         def table(name, x, y, label_first=False):\n\
         \x20   with open(os.path.join(d, name), 'w') as f:\n\
         \x20       for i in range(len(x)):\n\
         \x20           o = {'v': [float(c) for c in x[i, 1:]], 'a': float(x[i, 0])}\n\
         \x20           if y is not None: o = dict([('y', int(y[i]))] + list(o.items())) if label_first else {**o, 'y': int(y[i])}\n\
         \x20           f.write(json.dumps(o) + '\\n')\n\
         x = r.random((150, 4), dtype=np.float32); y = (x.sum(1) * 3 / 4).astype(int) % 3\n\
         table('train.jsonl', x, y)\n\
         a = r.random((7, 4), dtype=np.float32); b = r.random((5, 4), dtype=np.float32)\n\
         table('a.jsonl', a, None); table('b.jsonl', b, [1] * 5, label_first=True)\n\
         table('all.jsonl', np.concatenate([a, b]), [0] * 12)\n\
         table('bad.jsonl', a[:, :3], None)\n",
        d,
    );
    if !wrote {
        return;
    }
    let data = format!(
        "dataset = \"jsonl\"\ndir = \"{}\"\n[data.jsonl]\ntrain = [\"train.jsonl\"]\ntable = {{ label = \"y\" }}",
        d.display()
    );
    let spec = train(d, &data);
    let run_dir = d.join("run");
    let (a, b) = (d.join("a.jsonl").display().to_string(), d.join("b.jsonl").display().to_string());
    let (whole, parts) = (d.join("whole.npy"), d.join("parts.npy"));
    assert_exit(&predict(&spec, &run_dir, &whole, &["--set", "data.jsonl.validation=[\"all.jsonl\"]"]), 0);
    let out = predict(&spec, &run_dir, &parts, &["--input", &a, &b]);
    assert_exit(&out, 0);
    assert!(text(&out).1.contains("predicted 12 examples"), "{}", text(&out).1);
    assert!(std::fs::read(&whole).unwrap() == std::fs::read(&parts).unwrap(), "the .npy files differ");

    // An array field of another width names the field, both widths and the training file.
    let bad = d.join("bad.jsonl").display().to_string();
    let out = predict(&spec, &run_dir, &d.join("bad_out.npy"), &["--input", &bad]);
    assert_exit(&out, 4);
    let stderr = text(&out).1;
    assert!(stderr.contains("bad.jsonl") && stderr.contains("`v` holds 2 values, but 3"), "{stderr}");
}
