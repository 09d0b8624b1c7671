//! `trainrun tokenize` for the columnar text sources: the plays' paragraphs as a text column of a
//! Parquet file pyarrow wrote (two row groups) and of a folder `datasets` saved (two shards),
//! tokenized by the checked-in `tokenizer.json` into the token cache, whose ids are exactly
//! Python `tokenizers`' (`encode_batch(paragraphs, add_special_tokens=False)`, each document
//! followed by `<|endoftext|>`); a second `tokenize` reuses the file, a run trains from it,
//! `--text` prints ids without reading the corpus, and a table section is refused.
//!
//! Streamed documents go to the cache under `char` and `byte` too: a character model's cache
//! holds the ids of the sorted vocabulary, and the run trains from it.
//!
//! A test that cannot import `tokenizers`, `pyarrow` or `datasets` says so loudly and skips.

mod common;

use common::{assert_exit, run, tempdir, text, with_python};
use std::path::{Path, PathBuf};

const BLOCK: usize = 16;

/// The checked-in tokenizer of `specs/shakespeare_bpe.toml`.
fn checked_in() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("specs/tokenizers/shakespeare_bpe.json")
}

/// Writes the training plays' paragraphs as `train.parquet` (row groups of 2,000) and as a
/// `datasets` folder `saved` (2 shards), and `reference.bin`: Python `tokenizers`' ids of them
/// under `sys.argv[3]`, each followed by `<|endoftext|>`'s, little-endian `u32`.
const CORPUS: &str = r#"
import os, sys
import pyarrow as pa, pyarrow.parquet as pq
import datasets
from tokenizers import Tokenizer
d, plays, tokenizer = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(os.path.join(plays, "train.txt"), encoding="utf-8").read()
paragraphs = [p for p in text.split("\n\n") if p.strip()]
pq.write_table(pa.table({"text": paragraphs}), os.path.join(d, "train.parquet"), row_group_size=2000)
datasets.Dataset.from_dict({"text": paragraphs}).save_to_disk(os.path.join(d, "saved"), num_shards=2)
t = Tokenizer.from_file(tokenizer)
eot = t.token_to_id("<|endoftext|>")
ids = []
for e in t.encode_batch(paragraphs, add_special_tokens=False):
    ids.extend(e.ids)
    ids.append(eot)
import array
a = array.array("I", ids)
assert a.itemsize == 4 and sys.byteorder == "little"
open(os.path.join(d, "reference.bin"), "wb").write(a.tobytes())
"#;

fn corpus(dir: &Path) -> bool {
    let plays = common::sources::plays();
    let script = format!(
        "import sys; sys.argv += [{:?}, {:?}]\n{CORPUS}",
        plays.display().to_string(),
        checked_in().display().to_string()
    );
    ["pyarrow", "datasets"].iter().all(|m| with_python(m, "", dir)) && with_python("tokenizers", &script, dir)
}

/// The spec of `source` (`parquet` reading `train.parquet`, `hf_datasets` reading `saved`) with
/// `tokenization` (a TOML value) and `classes` outputs.
fn spec(dir: &Path, source: &str, tokenization: &str, classes: usize) -> PathBuf {
    let text = format!("text = {{ tokenization = {tokenization}, block_size = {BLOCK} }}");
    let data = match source {
        "parquet" => format!("dataset = \"parquet\"\n\n[data.parquet]\ntrain = [\"train.parquet\"]\n{text}"),
        _ => format!("dataset = \"hf_datasets\"\n\n[data.hf_datasets]\n{text}"),
    };
    let spec = common::lm::spec(dir, source, &data, BLOCK, classes);
    if source == "hf_datasets" {
        let written = std::fs::read_to_string(&spec).unwrap();
        let folder = |d: &Path| format!("\ndir = \"{}\"\n", d.display());
        std::fs::write(&spec, written.replacen(&folder(dir), &folder(&dir.join("saved")), 1)).unwrap();
    }
    spec
}

fn tokenize(spec: &Path) -> serde_json::Value {
    let out = run(&["tokenize", spec.to_str().unwrap(), "--json"]);
    assert_exit(&out, 0);
    serde_json::from_str(&text(&out).0).unwrap_or_else(|e| panic!("{e}: {}", text(&out).0))
}

/// The ids of every cache file `report` names, file after file.
fn cached_ids(report: &serde_json::Value) -> Vec<u8> {
    let files = report["files"].as_array().unwrap();
    let mut ids = vec![];
    for f in files {
        let bytes = std::fs::read(f["cache_file"].as_str().unwrap()).unwrap();
        // Both vocabularies here fit u16, so the cache stores two bytes an id (its header says
        // so after the version); widened to the reference's u32 to compare.
        assert_eq!(bytes[12..16], 2u32.to_le_bytes(), "bytes per id");
        let wide = bytes[64..].chunks(2).flat_map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])).to_le_bytes());
        ids.extend(wide);
    }
    ids
}

#[test]
fn a_columnar_text_corpus_is_cached_with_the_python_tokenizers_ids() {
    let dir = tempdir();
    if !corpus(dir.path()) {
        return;
    }
    let reference = std::fs::read(dir.path().join("reference.bin")).unwrap();
    let tokenization = format!("{{ tokenizer_json = {:?} }}", checked_in().display().to_string());
    for source in ["parquet", "hf_datasets"] {
        let spec = spec(dir.path(), source, &tokenization, 1024);
        let built = tokenize(&spec);
        let files = built["files"].as_array().unwrap();
        assert!(files.iter().all(|f| f["cache"] == "built"), "{source}: {built}");
        assert_eq!(built["tokens"].as_u64().unwrap() as usize * 4, reference.len(), "{source}: {built}");
        // A `datasets` folder of 2 shards is 2 files, each its own stream: together the ids.
        assert!(cached_ids(&built) == reference, "{source}: the cached ids differ from Python tokenizers'");
        let again = tokenize(&spec);
        assert!(again["files"].as_array().unwrap().iter().all(|f| f["cache"] == "reused"), "{source}: {again}");

        let shown = run(&["tokenize", spec.to_str().unwrap(), "--text", "ROMEO:", "--json"]);
        assert_exit(&shown, 0);
        assert!(text(&shown).0.contains("\"vocab_size\":1024"), "{}", text(&shown).0);
        let trained = run(&[spec.to_str().unwrap(), "--quiet"]);
        assert_exit(&trained, 0);
        std::fs::remove_dir_all(dir.path().join("run")).unwrap();
    }
}

#[test]
fn streamed_character_documents_are_cached_and_a_table_is_refused() {
    let dir = tempdir();
    if !corpus(dir.path()) {
        return;
    }
    let plays = std::fs::read_to_string(common::sources::plays().join("train.txt")).unwrap();
    let paragraphs: Vec<&str> = plays.split("\n\n").filter(|p| !p.trim().is_empty()).collect();
    let vocabulary: std::collections::BTreeSet<char> =
        paragraphs.iter().flat_map(|p| p.chars()).chain(['\n']).collect();
    let vocabulary: Vec<char> = vocabulary.into_iter().collect();
    let spec = spec(dir.path(), "parquet", "\"char\"", vocabulary.len());
    let built = tokenize(&spec);
    assert_eq!(built["files"][0]["cache"], "built", "{built}");
    let mut want = vec![];
    for p in &paragraphs {
        let ids = p.chars().chain(['\n']).map(|c| vocabulary.binary_search(&c).unwrap() as u32);
        ids.for_each(|id| want.extend_from_slice(&id.to_le_bytes()));
    }
    assert!(cached_ids(&built) == want, "the cached ids are not the characters' in the sorted vocabulary");
    let trained = run(&[spec.to_str().unwrap(), "--quiet"]);
    assert_exit(&trained, 0);

    let table = "dataset = \"parquet\"\n\n[data.parquet]\ntrain = [\"train.parquet\"]\n\
                 table = { label = \"text\", features = [\"text\"] }";
    let refused = run(&["tokenize", common::lm::spec(dir.path(), "t", table, BLOCK, 2).to_str().unwrap()]);
    assert_exit(&refused, 4);
    assert!(
        text(&refused).1.contains("reads data.parquet.table (numbers and a label), not text"),
        "{}",
        text(&refused).1
    );
}
