//! The `hf_datasets` source end to end through the binary, on folders Hugging Face `datasets`
//! wrote with `save_to_disk` (skipped, loudly, when `datasets` does not import): a
//! `DatasetDict` table of fixed-length pixel sequences, a float column and `ClassLabel`
//! classes, saved in 4 shards, trained under every strategy (the multi-worker ones dealing
//! record batches to workers under `auto`); a `ClassLabel`'s names as the run's classes (from
//! a `save_to_disk` folder and a `to_parquet` file); the Shakespeare plays as a text column for a
//! character model; and bad folders refused with exit 4, naming what is missing, the splits
//! there, or the truncated file. Killed-and-resumed runs are in `tests/data_resume.rs`.

mod common;

use common::sources::STRATEGIES;
use common::{assert_exit, json, run, tempdir, text, with_python};
use std::path::{Path, PathBuf};

/// Saves a `DatasetDict` to `<dir>/saved`: `train` (256 rows, 4 shards) and `test` (64 rows),
/// 16 `pixels` (uint8) bright in the top or bottom half, a float `bias`, the class a
/// `ClassLabel` (`bottom`, `top`) in `kind`, and a text column the table does not read.
const TABLES: &str = r#"
import os, sys
import datasets
features = datasets.Features({
    "pixels": datasets.Sequence(datasets.Value("uint8"), length=16),
    "bias": datasets.Value("float64"),
    "kind": datasets.ClassLabel(names=["bottom", "top"]),
    "note": datasets.Value("string"),
})
def split(n, offset):
    rows = range(offset, offset + n)
    return datasets.Dataset.from_dict({
        "pixels": [[(p // 8 == i % 2) * 170 + (i * 31 + p * 7) % 80 for p in range(16)] for i in rows],
        "bias": [0.5] * n,
        "kind": [1 - i % 2 for i in rows],
        "note": ["é 漢字 🙂"] * n,
    }, features=features)
dd = datasets.DatasetDict({"train": split(256, 0), "test": split(64, 1000)})
dd.save_to_disk(os.path.join(sys.argv[1], "saved"), num_shards={"train": 4, "test": 1})
"#;

fn spec(dir: &Path, data: &str, strategy: &str, model: &str) -> PathBuf {
    let spec = common::sources::spec(dir, "hf_datasets", data, strategy, model);
    // The source reads the folder `data.dir` names: the one `save_to_disk` wrote.
    let text = std::fs::read_to_string(&spec).unwrap();
    let folder = |d: &Path| format!("\ndir = \"{}\"\n", d.display());
    assert!(text.contains(&folder(dir)), "{text}");
    std::fs::write(&spec, text.replacen(&folder(dir), &folder(&dir.join("saved")), 1)).unwrap();
    spec
}

const CLASSIFIER: &str = "[[model.layers]]\ntype = \"dense\"\nunits = 2";

const TABLE: &str = "dataset = \"hf_datasets\"\n\n[data.hf_datasets]\nvalidation = \"test\"\nshuffle_buffer = 64\n\
                     table = { label = \"kind\", features = [\"pixels\", \"bias\"] }\n\n\
                     [data.preprocessing]\nrescale = 0.00392156862745098";

#[test]
fn a_table_datasets_saved_trains_under_every_strategy() {
    for (name, strategy) in STRATEGIES {
        let dir = tempdir();
        if !with_python("datasets", TABLES, dir.path()) {
            return;
        }
        let spec = spec(dir.path(), TABLE, strategy, CLASSIFIER);
        let check = run(&["check", spec.to_str().unwrap()]);
        let shown = text(&check).0;
        assert_exit(&check, 0);
        assert!(shown.contains("256"), "{name}: {shown}");
        if name == "multi_worker_mirrored" {
            // 4 record batches (one a shard) for 2 workers: `auto` deals record batches.
            assert!(shown.contains("file policy, 2 shards"), "{shown}");
        }
        let out = run(&[spec.to_str().unwrap(), "--quiet", "--set", "run.threads=1"]);
        assert_exit(&out, 0);
        let s = json(&dir.path().join("run/summary.json"));
        assert!(s["test_accuracy"].as_f64().unwrap_or(0.0) > 0.95, "{name}: {s}");
    }
}

/// `TABLES`' rows with the class a `ClassLabel` whose names are not in sorted order and one of
/// which no row holds (`top`, `bottom`, `unseen`), saved to `<dir>/named` and written by
/// `to_parquet` to `<dir>/named-train.parquet` and `<dir>/named-test.parquet`.
const NAMED: &str = r#"
import os, sys
import datasets
features = datasets.Features({
    "pixels": datasets.Sequence(datasets.Value("uint8"), length=16),
    "kind": datasets.ClassLabel(names=["top", "bottom", "unseen"]),
})
def split(n, offset):
    rows = range(offset, offset + n)
    return datasets.Dataset.from_dict({
        "pixels": [[(p // 8 == i % 2) * 170 + (i * 31 + p * 7) % 80 for p in range(16)] for i in rows],
        "kind": [i % 2 for i in rows],
    }, features=features)
dd = datasets.DatasetDict({"train": split(256, 0), "test": split(64, 1000)})
dd.save_to_disk(os.path.join(sys.argv[1], "named"), num_shards={"train": 2, "test": 1})
for name, ds in dd.items():
    ds.to_parquet(os.path.join(sys.argv[1], f"named-{name}.parquet"))
"#;

/// A `ClassLabel`'s names, from the Arrow schema `datasets` writes (in a `save_to_disk` folder
/// and in a `to_parquet` file), are the run's classes in the dataset's order, the unused one
/// too: `classes.json`, the classes `check` counts, and predict's `name` column.
#[test]
fn class_label_names_are_the_runs_classes() {
    let dir = tempdir();
    if !with_python("datasets", NAMED, dir.path()) {
        return;
    }
    let model = "[[model.layers]]\ntype = \"dense\"\nunits = 3";
    let hf = "dataset = \"hf_datasets\"\n\n[data.hf_datasets]\nvalidation = \"test\"\n\
              table = { label = \"kind\", features = [\"pixels\"] }\n\n\
              [data.preprocessing]\nrescale = 0.00392156862745098";
    let parquet = "dataset = \"parquet\"\n\n[data.parquet]\ntrain = [\"named-train.parquet\"]\n\
                   validation = [\"named-test.parquet\"]\ntable = { label = \"kind\", features = [\"pixels\"] }\n\n\
                   [data.preprocessing]\nrescale = 0.00392156862745098";
    for (source, data) in [("hf_datasets", hf), ("parquet", parquet)] {
        let spec = common::sources::spec(dir.path(), source, data, "", model);
        if source == "hf_datasets" {
            let text = std::fs::read_to_string(&spec).unwrap();
            let folder = |d: &Path| format!("\ndir = \"{}\"\n", d.display());
            std::fs::write(&spec, text.replacen(&folder(dir.path()), &folder(&dir.path().join("named")), 1)).unwrap();
        }
        let check = run(&["check", spec.to_str().unwrap()]);
        assert_exit(&check, 0);
        assert!(text(&check).0.contains("3 classes"), "{source}: {}", text(&check).0);
        let out = run(&[spec.to_str().unwrap(), "--quiet", "--set", "run.threads=1"]);
        assert_exit(&out, 0);
        let run_dir = dir.path().join("run");
        assert_eq!(json(&run_dir.join("classes.json")), serde_json::json!(["top", "bottom", "unseen"]), "{source}");
        let predictions = dir.path().join(format!("{source}.csv"));
        let checkpoint = run_dir.join("model.safetensors").display().to_string();
        let (spec, output) = (spec.to_str().unwrap(), predictions.to_str().unwrap());
        assert_exit(&run(&["predict", spec, "--checkpoint", &checkpoint, "--output", output]), 0);
        let written = std::fs::read_to_string(&predictions).unwrap();
        let mut lines = written.lines();
        assert!(lines.next().unwrap().starts_with("id,class,name,probability"), "{source}: {written}");
        // Test rows alternate `top`, `bottom` (rows from 1000: even first).
        assert!(lines.next().unwrap().starts_with("0,0,top,"), "{source}: {written}");
        assert!(lines.next().unwrap().starts_with("1,1,bottom,"), "{source}: {written}");
        std::fs::remove_dir_all(&run_dir).unwrap();
    }
}

/// The plays' paragraphs as a `text` column of a `DatasetDict` (`train`, `validation`).
const DOCUMENTS: &str = r#"
import os, sys
import datasets
d, here = sys.argv[1], sys.argv[2]
splits = {}
for split in ["train", "val"]:
    text = open(os.path.join(here, split + ".txt"), encoding="utf-8").read()
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    splits["validation" if split == "val" else split] = datasets.Dataset.from_dict({"text": paragraphs})
datasets.DatasetDict(splits).save_to_disk(os.path.join(d, "saved"))
"#;

const BLOCK: usize = 16;

#[test]
fn a_text_column_trains_a_character_model_under_every_strategy() {
    let plays = common::sources::plays();
    let script = format!("import sys; sys.argv.append({:?})\n{DOCUMENTS}", plays.display().to_string());
    let data = format!(
        "dataset = \"hf_datasets\"\n\n[data.hf_datasets]\nvalidation = \"validation\"\n\
         text = {{ block_size = {BLOCK}, end_of_text = \"\\n\\n\", vocabulary = \"train_and_validation\" }}"
    );
    // Written once (importing `datasets` takes seconds), copied for each strategy.
    let written = tempdir();
    if !with_python("datasets", &script, written.path()) {
        return;
    }
    // The multi-process strategies' tasks (workers, a chief) each open the one token cache.
    for (name, strategy) in STRATEGIES {
        let dir = tempdir();
        copy_folder(&written.path().join("saved"), &dir.path().join("saved"));
        eprintln!("strategy {name}");
        common::sources::trains_a_character_model(&spec(dir.path(), &data, strategy, ""), BLOCK);
    }
}

/// Copies the folder `from` (files and folders) to `to`.
fn copy_folder(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_folder(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn bad_folders_exit_4_naming_what_is_wrong() {
    let dir = tempdir();
    if !with_python("datasets", TABLES, dir.path()) {
        return;
    }
    let spec = spec(dir.path(), TABLE, "", CLASSIFIER);
    let args = [spec.to_str().unwrap(), "--quiet", "--set", "data.hf_datasets.shuffle_buffer=0"];
    let failed = |sets: &[&str]| {
        let out = run(&[&args[..], sets].concat());
        assert_exit(&out, 4);
        text(&out).1
    };
    // A split the dict lacks names those it has; a wrong type names the column and its type.
    let split = failed(&["--set", "data.hf_datasets.validation=\"validation\""]);
    assert!(split.contains("has no split `validation`; its splits: train, test"), "{split}");
    let wrong = failed(&["--set", "data.hf_datasets.table.features=[\"note\"]"]);
    assert!(wrong.contains("column `note` is Utf8; expected numbers, booleans or lists of numbers"), "{wrong}");
    // Not a folder `save_to_disk` wrote.
    let elsewhere = format!("data.dir=\"{}\"", dir.path().display());
    let neither = failed(&["--set", &elsewhere]);
    assert!(neither.contains("missing in") && neither.contains("dataset_dict.json or state.json"), "{neither}");

    // A truncated Arrow file, named.
    let path = dir.path().join("saved/train/data-00002-of-00004.arrow");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let truncated = failed(&[]);
    assert!(
        truncated.contains("data-00002-of-00004.arrow: not a readable Arrow stream file: truncated"),
        "{truncated}"
    );
    assert!(!dir.path().join("run/summary.json").exists());
}
