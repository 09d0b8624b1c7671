//! Bad data a user hands trainrun, end to end through the binary (issue 29): each is refused
//! before training (or warned about), naming the file, the values and the fix, with files
//! written by the real tools (NumPy for `.npz`; tests that need it say loudly when it is
//! missing and skip).

mod common;

use common::{assert_exit, json, run, tempdir, text, with_python};
use std::path::{Path, PathBuf};

/// A spec training one dense layer of `units` on the `[data]` table `data`, in `dir`.
fn spec(dir: &Path, data: &str, units: usize, loss: &str) -> PathBuf {
    let text = format!(
        r#"
[run]
name = "hardening"
seed = 5
out_dir = "{out}"

[data]
dir = "{data_dir}"
{data}

[batch]
global = 4

[optimizer]
kind = "sgd"
learning_rate = 0.1

[model]
[[model.layers]]
type = "flatten"
[[model.layers]]
type = "dense"
units = {units}

[train]
epochs = 1
steps_per_epoch = 20
loss = "{loss}"
from_logits = true
"#,
        out = dir.join("run").display(),
        data_dir = dir.display(),
    );
    let path = dir.join("spec.toml");
    std::fs::write(&path, text).unwrap();
    path
}

const CE: &str = "sparse_categorical_crossentropy";

/// `check` then a run of `spec` both exit `code` (the run leaving no summary), and the
/// message holds every one of `needles`; returns it.
fn refused(spec: &Path, code: i32, needles: &[&str]) -> String {
    let path = spec.to_str().unwrap();
    let mut last = String::new();
    for args in [vec!["check", path], vec![path, "--quiet", "--set", "run.threads=1"]] {
        let out = run(&args);
        let stderr = text(&out).1;
        assert_exit(&out, code);
        for needle in needles {
            assert!(stderr.contains(needle), "{args:?}: {needle:?} not in:\n{stderr}");
        }
        last = stderr;
    }
    assert!(!spec.with_file_name("run").join("summary.json").exists());
    last
}

/// Item 5: NumPy archives, stored and deflated, whose member `x` has a CRC-32 other than its
/// bytes' (NumPy's `np.load` refuses both).
#[test]
fn an_npz_member_with_a_bad_crc_is_refused_naming_both_checksums() {
    let dir = tempdir();
    let script = r#"
import numpy as np, os, sys, zipfile, zlib
d = sys.argv[1]
x = (np.arange(64 * 4, dtype=np.float32) % 7).reshape(64, 4)
y = np.arange(64) % 2
for name, save in [("stored.npz", np.savez), ("deflated.npz", np.savez_compressed)]:
    path = os.path.join(d, name)
    save(path, x=x, y=y)
    crc = zipfile.ZipFile(path).getinfo("x.npy").CRC
    data = open(path, "rb").read()
    old, new = crc.to_bytes(4, "little"), (crc ^ 0x10).to_bytes(4, "little")
    assert data.count(old) == 2, "the CRC in the local header and the central directory"
    open(path, "wb").write(data.replace(old, new))
    try:
        np.load(path)["x"]
        raise SystemExit("numpy read the damaged member")
    except zipfile.BadZipFile:
        pass
    print(f"{name} {crc:#010x} {crc ^ 0x10:#010x}")
"#;
    if !with_python("numpy", script, dir.path()) {
        return;
    }
    for npz in ["stored.npz", "deflated.npz"] {
        let data = format!(
            "dataset = \"npy\"\n\n[data.npy]\nnpz = \"{npz}\"\n\
             train = {{ features = \"x\", labels = \"y\" }}"
        );
        let stderr = refused(&spec(dir.path(), &data, 2, CE), 4, &[npz, "member `x.npy`", "CRC-32", "write it again"]);
        let expected = regex_like_hex(&stderr);
        assert_eq!(expected.len(), 2, "the recorded and the computed CRC: {stderr}");
    }
}

/// The `0x…` numbers of a message.
fn regex_like_hex(message: &str) -> Vec<&str> {
    message.split(|c: char| !c.is_ascii_alphanumeric()).filter(|w| w.starts_with("0x") && w.len() == 10).collect()
}

fn csv_data(test: &str) -> String {
    format!("dataset = \"csv\"\n\n[data.csv]\ntrain = \"train.csv\"\n{test}label = \"y\"")
}

/// `rows` rows of `a,b,y` where the class is whether `a > b`.
fn classes_table(rows: usize) -> String {
    let mut csv = String::from("a,b,y\n");
    for i in 0..rows {
        let (a, b) = ((i * 7 % 11) as f32 / 11.0, (i * 5 % 13) as f32 / 13.0);
        csv += &format!("{a},{b},{}\n", if a > b { "big" } else { "small" });
    }
    csv
}

/// `csv` with its columns reordered as `order` (indices into its header).
fn reorder(csv: &str, order: &[usize]) -> String {
    let line = |l: &str| {
        let cells: Vec<&str> = l.split(',').collect();
        order.iter().map(|&i| cells[i]).collect::<Vec<_>>().join(",")
    };
    csv.lines().map(|l| line(l) + "\n").collect()
}

/// Item 4: the test table is read by header name, as explicit `features` are.
#[test]
fn a_csv_test_table_is_matched_by_column_name() {
    let dir = tempdir();
    let table = classes_table(64);
    std::fs::write(dir.path().join("train.csv"), &table).unwrap();
    let path = spec(dir.path(), &csv_data("test = \"test.csv\"\n"), 2, CE);
    let train = |dir: &Path| {
        let out = run(&[path.to_str().unwrap(), "--quiet", "--set", "run.threads=1"]);
        assert_exit(&out, 0);
        let summary = json(&dir.join("run/summary.json"));
        std::fs::remove_dir_all(dir.join("run")).unwrap();
        summary
    };
    std::fs::write(dir.path().join("test.csv"), &table).unwrap();
    let same = train(dir.path());
    // The same table with its columns in another order evaluates the same.
    std::fs::write(dir.path().join("test.csv"), reorder(&table, &[2, 1, 0])).unwrap();
    let reordered = train(dir.path());
    assert_eq!(reordered["test_loss"], same["test_loss"]);
    assert_eq!(reordered["test_accuracy"], same["test_accuracy"]);

    // An extra column and a missing one, named before training.
    let extra: String =
        table.lines().map(|l| format!("{l},{}\n", if l.starts_with('a') { "c" } else { "1" })).collect();
    std::fs::write(dir.path().join("test.csv"), extra).unwrap();
    refused(&path, 4, &["test.csv", "extra `c`", "train.csv", "data.csv.features"]);
    std::fs::write(dir.path().join("test.csv"), reorder(&table, &[0, 2])).unwrap();
    refused(&path, 4, &["test.csv", "missing `b`", "data.csv.features"]);
}

/// Item 18, CSV: every message names the real problem.
#[test]
fn unclear_csv_tables_get_messages_naming_the_problem() {
    let dir = tempdir();
    let table = classes_table(32);
    std::fs::write(dir.path().join("train.csv"), &table).unwrap();
    let with_test = spec(dir.path(), &csv_data("test = \"test.csv\"\n"), 2, CE);

    // A test table with a subset of the classes is fine; one with other labels names them.
    let subset: String = table.lines().filter(|l| !l.ends_with("small")).map(|l| format!("{l}\n")).collect();
    std::fs::write(dir.path().join("test.csv"), &subset).unwrap();
    assert_exit(&run(&["check", with_test.to_str().unwrap()]), 0);
    std::fs::write(dir.path().join("test.csv"), table.replace("small", "tiny")).unwrap();
    let stderr = refused(&with_test, 4, &["test.csv", "`tiny`", "its classes: big, small"]);
    assert!(!stderr.contains("class folders"), "{stderr}");

    // Header only, and empty.
    std::fs::write(dir.path().join("test.csv"), "a,b,y\n").unwrap();
    refused(&with_test, 4, &["test.csv:2:1", "a header (a,b,y) but no rows"]);
    std::fs::write(dir.path().join("test.csv"), "").unwrap();
    refused(&with_test, 4, &["test.csv:1:1", "the file is empty", "header row", "`y`"]);

    // A value beyond f32 is named as such.
    std::fs::write(dir.path().join("test.csv"), table.replacen("\n0,", "\n1e300,", 1)).unwrap();
    refused(&with_test, 4, &["test.csv:2:1", "1e300 is out of the range of a 32-bit float"]);

    // Labels -1, 0, 1 are read as float targets: the loss error names `data.csv.labels`.
    let signs: String = std::iter::once("a,b,y\n".to_string())
        .chain((0..32i32).map(|i| format!("{},{},{}\n", i % 3, i % 5, i % 3 - 1)))
        .collect();
    std::fs::write(dir.path().join("train.csv"), signs).unwrap();
    let path = spec(dir.path(), &csv_data(""), 3, CE);
    refused(&path, 2, &["needs class labels", "data.csv.labels = \"classes\""]);
}

/// Item 14 and item 18 (text and token files shorter than a block): the split, each file's
/// token count, the block size and the keys to change, before anything trains.
#[test]
fn a_text_or_token_split_shorter_than_one_window_is_refused_with_the_counts() {
    let dir = tempdir();
    let text = "to be or not to be, that is the question\n".repeat(20);
    std::fs::write(dir.path().join("train.txt"), &text).unwrap();
    let table = |validation: &str, block: usize| {
        format!(
            "dataset = \"text\"\n\n[data.text]\ntrain = [\"train.txt\"]\nvalidation = [\"{validation}\"]\n\
             block_size = {block}"
        )
    };
    for (content, tokens) in [("to be", "5"), ("", "0")] {
        std::fs::write(dir.path().join("val.txt"), content).unwrap();
        let path = spec(dir.path(), &table("val.txt", 8), 2, CE);
        let needles = [
            &format!("val.txt holds {tokens} tokens") as &str,
            "data.text.block_size + 1 = 9",
            "nothing would be evaluated",
        ];
        let stderr = refused(&path, 4, &needles);
        assert!(stderr.contains("or drop data.text.validation"), "{stderr}");
    }
    // A training text shorter than a block.
    std::fs::write(dir.path().join("val.txt"), &text).unwrap();
    std::fs::write(dir.path().join("short.txt"), "to be").unwrap();
    let data = table("val.txt", 8).replace("train.txt", "short.txt");
    refused(&spec(dir.path(), &data, 2, CE), 4, &["short.txt holds 5 tokens", "nothing to train on", "to 4 or less"]);

    // A token file, as u16 ids.
    let ids: Vec<u8> = (0..6u16).flat_map(|i| i.to_le_bytes()).collect();
    std::fs::write(dir.path().join("train.bin"), ids.repeat(10)).unwrap();
    std::fs::write(dir.path().join("val.bin"), &ids).unwrap();
    let data =
        "dataset = \"tokens\"\n\n[data.tokens]\ntrain = [\"train.bin\"]\nvalidation = [\"val.bin\"]\nblock_size = 8";
    refused(&spec(dir.path(), data, 2, CE), 4, &["val.bin holds 6 tokens", "data.tokens.block_size + 1 = 9"]);
}

/// Item 18, NumPy: empty arrays and 1-D features say what is wrong with the arrays.
#[test]
fn empty_and_one_dimensional_numpy_features_are_named_as_such() {
    let dir = tempdir();
    let script = "import numpy as np, os, sys\nd = sys.argv[1]\n\
        np.save(os.path.join(d, 'empty_x.npy'), np.zeros((0, 4), dtype=np.float32))\n\
        np.save(os.path.join(d, 'empty_y.npy'), np.zeros((0,), dtype=np.int64))\n\
        np.save(os.path.join(d, 'flat_x.npy'), np.arange(16, dtype=np.float32))\n\
        np.save(os.path.join(d, 'flat_y.npy'), np.arange(16) % 2)";
    if !with_python("numpy", script, dir.path()) {
        return;
    }
    let data = |x: &str, y: &str| {
        format!("dataset = \"npy\"\n\n[data.npy]\ntrain = {{ features = \"{x}\", labels = \"{y}\" }}")
    };
    let stderr =
        refused(&spec(dir.path(), &data("empty_x.npy", "empty_y.npy"), 2, CE), 4, &["empty_x.npy", "no examples"]);
    assert!(!stderr.contains("units = 0"), "{stderr}");
    let stderr = refused(
        &spec(dir.path(), &data("flat_x.npy", "flat_y.npy"), 2, CE),
        2,
        &["each example is a single number (features of shape (n,))", "x.reshape(-1, 1)"],
    );
    assert!(!stderr.contains("train a language model"), "{stderr}");
}

/// Item 16: data that trains but means nothing is warned about at `check` and at the run.
#[test]
fn degenerate_data_is_warned_about_at_check_and_run() {
    let dir = tempdir();
    // One class.
    let one: String = classes_table(32).replace("small", "big");
    std::fs::write(dir.path().join("train.csv"), one).unwrap();
    let path = spec(dir.path(), &csv_data(""), 1, CE);
    let warned = |path: &Path, needles: &[&str]| {
        // Not `--quiet`, which silences warnings too.
        for args in [vec!["check", path.to_str().unwrap()], vec![path.to_str().unwrap(), "--set", "run.threads=1"]] {
            let out = run(&args);
            assert_exit(&out, 0);
            let stderr = text(&out).1;
            for needle in needles {
                assert!(stderr.contains(needle), "{args:?}: {needle:?} not in:\n{stderr}");
            }
        }
    };
    warned(&path, &["label = \"y\"", "every training label in", "is `big`"]);

    // u16 ids read as u32: a vocabulary far beyond the tokens.
    let ids: Vec<u8> = (0..4000u32).flat_map(|i| ((i * 7 % 61) as u16).to_le_bytes()).collect();
    std::fs::write(dir.path().join("train.bin"), ids).unwrap();
    let data = "dataset = \"tokens\"\n\n[data.tokens]\ntrain = [\"train.bin\"]\ndtype = \"u32\"\nblock_size = 4";
    let out = run(&["check", spec(dir.path(), data, 2, CE).to_str().unwrap()]);
    let stderr = text(&out).1;
    assert!(stderr.contains("this looks like a u16 file: set data.tokens.dtype = \"u16\""), "{stderr}");

    // A CIFAR file with 100 records, not 10,000.
    let record = [vec![3u8], vec![128u8; 32 * 32 * 3]].concat();
    for i in 1..=5 {
        std::fs::write(dir.path().join(format!("data_batch_{i}.bin")), record.repeat(100)).unwrap();
    }
    std::fs::write(dir.path().join("test_batch.bin"), record.repeat(10_000)).unwrap();
    let out = run(&["check", spec(dir.path(), "dataset = \"cifar10\"", 10, CE).to_str().unwrap()]);
    let stderr = text(&out).1;
    assert!(stderr.contains("data_batch_1.bin holds 100 records; the published cifar10 file holds 10000"), "{stderr}");
    assert!(!stderr.contains("test_batch.bin holds"), "{stderr}");

    // Five parameter servers for one dense layer's two variables.
    std::fs::write(dir.path().join("train.csv"), classes_table(32)).unwrap();
    let ps = spec(dir.path(), &csv_data(""), 2, CE);
    let text_of = std::fs::read_to_string(&ps).unwrap()
        + "\n[strategy]\nkind = \"parameter_server\"\n\n[cluster]\nchief = 1\nworker = 2\nps = 5\n";
    std::fs::write(&ps, text_of).unwrap();
    let out = run(&["check", ps.to_str().unwrap()]);
    let stderr = text(&out).1;
    assert!(stderr.contains("5 parameter servers for 2 variables"), "{stderr}");
    assert!(stderr.contains("ps:2, ps:3, ps:4 hold nothing"), "{stderr}");
    assert!(stderr.contains("cluster.ps = 2"), "{stderr}");
}

/// Item 6: a link back up the tree is refused, naming the link and where it points; a link
/// to a folder elsewhere is followed.
#[test]
fn an_image_folder_link_loop_is_refused_and_other_links_are_followed() {
    let dir = tempdir();
    let script = "import os, sys\nfrom PIL import Image\nd = sys.argv[1]\n\
        for folder, n in [('train/a', 6), ('train/b', 6), ('extra', 3)]:\n\
        \x20   os.makedirs(os.path.join(d, folder))\n\
        \x20   for i in range(n):\n\
        \x20       Image.new('RGB', (8, 8), (40 * i, 0, 0)).save(os.path.join(d, folder, f'{i}.png'))";
    if !with_python("PIL", script, dir.path()) {
        return;
    }
    let data = "dataset = \"image_folder\"\n\n[data.image_folder]\nimage_size = [8, 8]\ncolor_mode = \"rgb\"";
    let path = spec(dir.path(), data, 2, CE);
    // A link to a folder outside the split is followed: 6 + 3 images in class b.
    std::os::unix::fs::symlink(dir.path().join("extra"), dir.path().join("train/b/more")).unwrap();
    let out = run(&["check", path.to_str().unwrap()]);
    assert_exit(&out, 0);
    assert!(text(&out).0.contains("15 train"), "{}", text(&out).0);
    std::os::unix::fs::symlink("..", dir.path().join("train/a/loop")).unwrap();
    refused(&path, 4, &["train/a/loop: a link to", "a folder that holds it, so reading it would loop"]);
}

/// Item 18: a plain file declared gzip is named as such, with the key, and no advice to fetch
/// a user's own file again.
#[test]
fn a_plain_tfrecord_declared_gzip_names_the_compression_key() {
    let dir = tempdir();
    std::fs::write(dir.path().join("train.tfrecord"), vec![7u8; 64]).unwrap();
    let data = "dataset = \"tfrecord\"\n\n[data.tfrecord]\ntrain = [\"train.tfrecord\"]\ncompression = \"gzip\"\n\
                shape = [4]\nclasses = 2";
    let stderr = refused(&spec(dir.path(), data, 2, CE), 4, &["train.tfrecord", "set compression = \"none\""]);
    assert!(!stderr.contains("fetch it again"), "{stderr}");
}
