//! tiktoken's encodings in the `text` and `jsonl` sources: ids equal to Python's `tiktoken`
//! package on a corpus of emoji, CJK, runs of whitespace, contractions and a special token's
//! text (read as ordinary text, as `encode_ordinary` does), for every encoding; a character
//! model's spec switched to `tokenization = "gpt2"` checks with GPT-2's 50,257 ids, trains,
//! writes a `vocab.json` naming the encoding, and `trainrun sample` decodes with it.
//!
//! PyPI's `tiktoken` downloads its rank files at first use; the reference here loads the same
//! files from the `tiktoken-rs` crate's source (`assets/`) instead, with the patterns and special
//! tokens of `tiktoken_ext.openai_public`, so it runs offline. A test that cannot import
//! `tiktoken` (`python3 -m pip install tiktoken`) or find the crate's source says so and skips.
//!
//! The throughput pair is ignored by default:
//! `cargo test --release --test data_tokenizers -- --ignored --nocapture`.

mod common;

use common::{assert_exit, json, run, tempdir, text};
use std::path::{Path, PathBuf};
use trainrun::data::Encoding;

const ENCODINGS: [(Encoding, &str); 4] = [
    (Encoding::Gpt2, "gpt2"),
    (Encoding::R50kBase, "r50k_base"),
    (Encoding::Cl100kBase, "cl100k_base"),
    (Encoding::O200kBase, "o200k_base"),
];

/// The test corpus: one case a line of the JSON array.
fn corpus() -> Vec<String> {
    [
        "Hello, world! It's a test; we'll see: they're \"quoted\".",
        "emoji 🙂👍🏽🇫🇷 and a family 👨‍👩‍👧",
        "漢字かなカナ 한국어 中文，标点。",
        "runs   of    spaces\t\ttabs\n\n\nnewlines   \n  ",
        "<|endoftext|> is plain text here, and so is <|fim_prefix|>",
        "numbers 1234567 3.14159 -42 1e10 ١٢٣",
        "x".repeat(300).as_str(),
        "",
        "Ünïcödé çombining: e\u{301} a\u{308} and zero-width\u{200b}joiner",
    ]
    .into_iter()
    .map(String::from)
    .collect()
}

/// The `tiktoken-rs` crate's `assets/` folder in the cargo registry, or `None`.
fn assets() -> Option<PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))?;
    let registry = std::fs::read_dir(home.join("registry/src")).ok()?;
    registry
        .flatten()
        .filter_map(|index| std::fs::read_dir(index.path()).ok())
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("tiktoken-rs-")))
        .map(|p| p.join("assets"))
        .find(|a| a.join("r50k_base.tiktoken").is_file() && a.join("vocab.bpe").is_file())
}

/// Prints `{encoding: [[ids of case 0], …]}` for the corpus in `cases.json`, from Python's
/// `tiktoken` with its rank files read from the crate's assets (the second argument).
const REFERENCE: &str = r#"
import json, os, sys
import tiktoken, tiktoken.load as load
from tiktoken_ext import openai_public as op
d, assets = sys.argv[1], sys.argv[2]
local = lambda url: os.path.join(assets, url.rsplit("/", 1)[-1])
op.load_tiktoken_bpe = lambda url, expected_hash=None: load.load_tiktoken_bpe(local(url))
op.data_gym_to_mergeable_bpe_ranks = lambda vocab_bpe_file, encoder_json_file, **hashes: \
    load.data_gym_to_mergeable_bpe_ranks(local(vocab_bpe_file), local(encoder_json_file))
cases = json.load(open(os.path.join(d, "cases.json"), encoding="utf-8"))
out = {}
for name in ["gpt2", "r50k_base", "cl100k_base", "o200k_base"]:
    enc = tiktoken.Encoding(**getattr(op, name)())
    out[name] = [enc.encode_ordinary(c) for c in cases] + [[enc.n_vocab], enc.encode("<|endoftext|>", allowed_special="all")]
print(json.dumps(out))
"#;

#[test]
fn ids_equal_python_tiktoken_for_every_encoding() {
    let Some(assets) = assets() else {
        skipped("the tiktoken-rs crate's source (assets/) is not in the cargo registry");
        return;
    };
    let dir = tempdir();
    let cases = corpus();
    std::fs::write(dir.path().join("cases.json"), serde_json::to_string(&cases).unwrap()).unwrap();
    let script = format!("import sys; sys.argv.append({:?})\n{REFERENCE}", assets.display().to_string());
    let Some(out) = python_out("tiktoken", &script, dir.path()) else { return };
    let reference: serde_json::Value = serde_json::from_str(&out).unwrap();
    for (encoding, name) in ENCODINGS {
        let mut ours: Vec<Vec<u32>> = cases.iter().map(|c| encoding.encode(c)).collect();
        ours.push(vec![encoding.size()]);
        ours.push(encoding.encode_special(encoding.end_of_text()));
        let theirs: Vec<Vec<u32>> = serde_json::from_value(reference[name].clone()).unwrap();
        for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            assert_eq!(a, b, "{name}, case {i}: {:?}", cases.get(i));
        }
        assert_eq!(ours.len(), theirs.len());
    }
}

/// Says loudly, on stdout and stderr, that a test skips its cross-check and why.
fn skipped(why: &str) {
    println!("skipped: {why}; not cross-checked");
    eprintln!("\n*** skipped: {why}; not cross-checked ***\n");
}

/// `python3 -c script dir`'s stdout, or `None` (said loudly) when `module` does not import.
fn python_out(module: &str, script: &str, dir: &Path) -> Option<String> {
    let probe = std::process::Command::new("python3").args(["-c", &format!("import {module}")]).output();
    if !probe.is_ok_and(|o| o.status.success()) {
        skipped(&format!("python3 cannot import {module} (python3 -m pip install {module})"));
        return None;
    }
    let out = std::process::Command::new("python3").args(["-c", script, dir.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "python failed:\n{}", String::from_utf8_lossy(&out.stderr));
    Some(String::from_utf8(out.stdout).unwrap())
}

const BLOCK: usize = 16;
const GPT2_IDS: usize = 50_257;

fn spec(dir: &Path, data: &str) -> PathBuf {
    common::lm::spec(dir, "tiktoken", data, BLOCK, GPT2_IDS)
}

#[test]
fn a_gpt2_text_source_checks_trains_and_samples_with_its_encoding() {
    let dir = tempdir();
    common::lm::macbeth(dir.path());
    let data = common::lm::text_data("\"gpt2\"", BLOCK);
    let spec = spec(dir.path(), &data);
    let check = run(&["check", spec.to_str().unwrap()]);
    let (shown, errors) = text(&check);
    assert_exit(&check, 0);
    assert!(shown.contains(&format!("{GPT2_IDS} classes at each of {BLOCK} positions")), "{shown}{errors}");
    let trained = run(&[spec.to_str().unwrap(), "--quiet"]);
    assert_exit(&trained, 0);
    let run_dir = dir.path().join("run");
    let vocab = json(&run_dir.join("vocab.json"));
    assert_eq!(vocab, serde_json::json!({"tokenization": "tiktoken", "encoding": "gpt2", "size": GPT2_IDS}));
    let args = ["sample", spec.to_str().unwrap(), "--checkpoint", run_dir.to_str().unwrap()];
    let sampled = run(&[&args[..], &["--tokens", "5", "--prompt", "ROMEO: 🙂", "--seed", "1"]].concat());
    assert_exit(&sampled, 0);
    assert!(text(&sampled).0.starts_with("ROMEO: 🙂"), "{}", text(&sampled).0);
}

#[test]
fn jsonl_documents_end_with_the_end_of_text_token() {
    let dir = tempdir();
    let docs = "{\"text\": \"Hello world\"}\n{\"text\": \"<|endoftext|>\"}\n";
    std::fs::write(dir.path().join("train.jsonl"), docs.repeat(4)).unwrap();
    let data = format!(
        "dataset = \"jsonl\"\n\n[data.jsonl]\ntrain = [\"train.jsonl\"]\n\
         text = {{ tokenization = \"gpt2\", block_size = {BLOCK} }}"
    );
    let spec = spec(dir.path(), &data);
    let check = run(&["check", spec.to_str().unwrap()]);
    assert_exit(&check, 0);
    // Per copy: Hello, world, <eot>, then the special token's text as 6 ordinary ids, <eot>.
    let ids: usize = 4 * (2 + 1 + Encoding::Gpt2.encode("<|endoftext|>").len() + 1);
    assert!(text(&check).0.contains(&format!("{} train", ids - BLOCK)), "{}", text(&check).0);
}

/// Tokens per second of this encoder (2 rayon threads over documents) against Python
/// `tiktoken`'s `encode_ordinary_batch` (2 threads) on the plays, one paragraph a document, for
/// the GPT-2 encoding. Prints the pair and the ratio.
#[test]
#[ignore]
fn throughput_against_python_tiktoken() {
    use rayon::prelude::*;
    let Some(assets) = assets() else {
        skipped("the tiktoken-rs crate's source (assets/) is not in the cargo registry");
        return;
    };
    let plays = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/shakespeare/train.txt");
    let text = std::fs::read_to_string(&plays).unwrap();
    let documents: Vec<&str> = text.split("\n\n").collect();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    let encoding = Encoding::Gpt2;
    encoding.encode("warm up");
    let mut ours = vec![];
    for _ in 0..3 {
        let start = std::time::Instant::now();
        let tokens: usize = pool.install(|| documents.par_iter().map(|d| encoding.encode(d).len()).sum());
        ours.push((tokens, start.elapsed().as_secs_f64()));
    }
    let script = format!("import sys; sys.argv.append({:?})\n{REFERENCE_SPEED}", assets.display().to_string());
    let dir = tempdir();
    let Some(out) = python_out("tiktoken", &script.replace("PLAYS", &plays.display().to_string()), dir.path()) else {
        return;
    };
    let theirs: Vec<(usize, f64)> = serde_json::from_str(&out).unwrap();
    for ((nt, ns), (pt, ps)) in ours.iter().zip(&theirs) {
        assert_eq!(nt, pt);
        println!(
            "gpt2, 2 threads: trainrun {:.2} M tokens/s, tiktoken {:.2} M tokens/s: {:.2}x",
            *nt as f64 / ns / 1e6,
            *pt as f64 / ps / 1e6,
            ps / ns
        );
    }
}

const REFERENCE_SPEED: &str = r#"
import json, os, sys, time
import tiktoken, tiktoken.load as load
from tiktoken_ext import openai_public as op
assets = sys.argv[2]
local = lambda url: os.path.join(assets, url.rsplit("/", 1)[-1])
op.data_gym_to_mergeable_bpe_ranks = lambda vocab_bpe_file, encoder_json_file, **hashes: \
    load.data_gym_to_mergeable_bpe_ranks(local(vocab_bpe_file), local(encoder_json_file))
enc = tiktoken.Encoding(**op.gpt2())
docs = open("PLAYS", encoding="utf-8").read().split("\n\n")
enc.encode_ordinary("warm up")
out = []
for _ in range(3):
    start = time.perf_counter()
    n = sum(len(ids) for ids in enc.encode_ordinary_batch(docs, num_threads=2))
    out.append((n, time.perf_counter() - start))
print(json.dumps(out))
"#;
