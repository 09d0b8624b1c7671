//! Hugging Face `tokenizer.json` files in the `text` and `jsonl` sources: ids equal to Python's
//! `tokenizers` package (`encode_batch(docs, add_special_tokens=False)`) for a GPT-2-style
//! byte-level BPE, a BERT-style WordPiece and a SentencePiece-style Unigram tokenizer, each
//! trained here by Python on a slice of the plays, on a corpus of emoji, CJK, runs of whitespace,
//! special tokens' texts, characters none of them saw and U+FFFD; the checked-in Shakespeare
//! spec checks with its tokenizer's vocabulary, trains, writes the tokenizer into `vocab.json`,
//! and `trainrun sample` decodes with it; a `jsonl` corpus gets the tokenizer's own end of text
//! (or an error asking for one); an invalid file is named with what is wrong.
//!
//! A test that cannot import `tokenizers` (`python3 -m pip install tokenizers`) says so loudly
//! and skips its cross-check. The throughput pair is ignored by default:
//! `cargo test --release --test data_tokenizer_json -- --ignored --nocapture`.

mod common;

use common::{assert_exit, json, run, tempdir, text, with_python};
use std::path::{Path, PathBuf};
use trainrun::data::TokenizerJson;

/// The checked-in tokenizer of `specs/shakespeare_bpe.toml`.
const SHAKESPEARE_BPE: &str = "specs/tokenizers/shakespeare_bpe.json";

/// The test corpus: one case a line of the JSON array.
fn corpus() -> Vec<String> {
    [
        "Hello, world! It's a test; we'll see: they're \"quoted\".",
        "emoji 🙂👍🏽🇫🇷 and a family 👨‍👩‍👧",
        "漢字かなカナ 한국어 中文，标点。",
        "runs   of    spaces\t\ttabs\n\n\nnewlines   \n  ",
        "<|endoftext|> is special here, and so are [SEP] and </s>: mid<|endoftext|>word",
        "numbers 1234567 3.14159 -42 1e10 ١٢٣",
        "x".repeat(300).as_str(),
        "",
        "Ünïcödé çombining: e\u{301} a\u{308} and zero-width\u{200b}joiner, replacement \u{fffd} and \u{0}nul",
        "ROMEO: But soft, what light through yonder window breaks?",
    ]
    .into_iter()
    .map(String::from)
    .collect()
}

/// Trains the three tokenizers into the folder (`bpe.json`, `wordpiece.json`, `unigram.json`)
/// on `plays.txt` and writes `reference.json`: `{name: [[ids of case 0], …]}` for the cases in
/// `cases.json`.
const REFERENCE: &str = r#"
import json, os, sys
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
d = sys.argv[1]
plays = [os.path.join(d, "plays.txt")]
bpe = Tokenizer(models.BPE())
bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
bpe.decoder = decoders.ByteLevel()
bpe.train(plays, trainers.BpeTrainer(vocab_size=600, special_tokens=["<|endoftext|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
wordpiece = Tokenizer(models.WordPiece(unk_token="[UNK]"))
wordpiece.normalizer = normalizers.BertNormalizer(lowercase=True)
wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
wordpiece.decoder = decoders.WordPiece()
wordpiece.train(plays, trainers.WordPieceTrainer(vocab_size=500,
    special_tokens=["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"], show_progress=False))
wordpiece.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
    special_tokens=[("[CLS]", wordpiece.token_to_id("[CLS]")), ("[SEP]", wordpiece.token_to_id("[SEP]"))])
unigram = Tokenizer(models.Unigram())
unigram.normalizer = normalizers.NFKC()
unigram.pre_tokenizer = pre_tokenizers.Metaspace()
unigram.decoder = decoders.Metaspace()
unigram.train(plays, trainers.UnigramTrainer(vocab_size=400, special_tokens=["<unk>", "</s>"],
    unk_token="<unk>", show_progress=False))
cases = json.load(open(os.path.join(d, "cases.json"), encoding="utf-8"))
out = {}
for name, t in [("bpe", bpe), ("wordpiece", wordpiece), ("unigram", unigram)]:
    t.save(os.path.join(d, name + ".json"))
    out[name] = [e.ids for e in t.encode_batch(cases, add_special_tokens=False)] + [[len(t.get_vocab())]]
with open(os.path.join(d, "reference.json"), "w") as f:
    json.dump(out, f)
"#;

/// The first 200 kB of the training plays, in `dir/plays.txt`.
fn plays(dir: &Path) {
    let plays = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/shakespeare/train.txt");
    let text = std::fs::read_to_string(plays).unwrap();
    std::fs::write(dir.join("plays.txt"), &text[..200_000]).unwrap();
}

#[test]
fn ids_equal_python_tokenizers_for_bpe_wordpiece_and_unigram() {
    let dir = tempdir();
    plays(dir.path());
    let cases = corpus();
    std::fs::write(dir.path().join("cases.json"), serde_json::to_string(&cases).unwrap()).unwrap();
    if !with_python("tokenizers", REFERENCE, dir.path()) {
        return;
    }
    let reference = json(&dir.path().join("reference.json"));
    for name in ["bpe", "wordpiece", "unigram"] {
        let tokenizer = TokenizerJson::open(&dir.path().join(format!("{name}.json"))).unwrap();
        let mut ours: Vec<Vec<u32>> = cases.iter().map(|c| tokenizer.encode(Path::new("case"), c).unwrap()).collect();
        ours.push(vec![tokenizer.size()]);
        let theirs: Vec<Vec<u32>> = serde_json::from_value(reference[name].clone()).unwrap();
        assert_eq!(ours.len(), theirs.len(), "{name}");
        for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            assert_eq!(a, b, "{name}, case {i}: {:?}", cases.get(i));
        }
    }
}

const BLOCK: usize = 16;

/// A spec of a tiny per-position model over `classes` ids, with `data` as its data section.
fn spec(dir: &Path, data: &str, classes: usize) -> PathBuf {
    common::lm::spec(dir, "tokenizer_json", data, BLOCK, classes)
}

fn checked_in() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(SHAKESPEARE_BPE)
}

#[test]
fn the_shakespeare_tokenizer_checks_trains_and_samples() {
    let dir = tempdir();
    common::lm::macbeth(dir.path());
    let data =
        common::lm::text_data(&format!("{{ tokenizer_json = {:?} }}", checked_in().display().to_string()), BLOCK);
    let spec = spec(dir.path(), &data, 1024);
    let check = run(&["check", spec.to_str().unwrap()]);
    let (shown, errors) = text(&check);
    assert_exit(&check, 0);
    assert!(shown.contains(&format!("1024 classes at each of {BLOCK} positions")), "{shown}{errors}");
    let trained = run(&[spec.to_str().unwrap(), "--quiet"]);
    assert_exit(&trained, 0);
    let run_dir = dir.path().join("run");
    let vocab = json(&run_dir.join("vocab.json"));
    assert_eq!((&vocab["tokenization"], &vocab["size"]), (&"tokenizer_json".into(), &1024.into()));
    assert_eq!(vocab["tokenizer"]["model"]["type"], "BPE", "the whole tokenizer is kept");
    let args = ["sample", spec.to_str().unwrap(), "--checkpoint", run_dir.to_str().unwrap()];
    let sampled = run(&[&args[..], &["--tokens", "8", "--prompt", "ROMEO: 🙂", "--seed", "1"]].concat());
    assert_exit(&sampled, 0);
    let (out, errors) = text(&sampled);
    assert!(out.starts_with("ROMEO: 🙂") && out.len() > "ROMEO: 🙂\n".len(), "{out}{errors}");
}

#[test]
fn jsonl_documents_end_with_the_tokenizers_own_end_of_text_or_ask_for_one() {
    let dir = tempdir();
    let docs = "{\"text\": \"Hello world\"}\n{\"text\": \"the end\"}\n";
    std::fs::write(dir.path().join("train.jsonl"), docs.repeat(8)).unwrap();
    let tokenizer = TokenizerJson::open(&checked_in()).unwrap();
    let data = |file: &Path, extra: &str| {
        format!(
            "dataset = \"jsonl\"\n\n[data.jsonl]\ntrain = [\"train.jsonl\"]\n\
             text = {{ tokenization = {{ tokenizer_json = {:?} }}, block_size = {BLOCK}{extra} }}",
            file.display().to_string()
        )
    };
    let check = run(&["check", spec(dir.path(), &data(&checked_in(), ""), 1024).to_str().unwrap()]);
    assert_exit(&check, 0);
    let per_copy: usize =
        ["Hello world", "the end"].iter().map(|d| tokenizer.encode(Path::new("d"), d).unwrap().len() + 1).sum();
    assert!(text(&check).0.contains(&format!("{} train", 8 * per_copy - BLOCK)), "{}", text(&check).0);

    // Without a known special token: the error names the file and asks for end_of_text.
    let mut bare = json(&checked_in());
    bare["added_tokens"] = serde_json::json!([]);
    let bare_path = dir.path().join("bare.json");
    std::fs::write(&bare_path, serde_json::to_string(&bare).unwrap()).unwrap();
    let check = run(&["check", spec(dir.path(), &data(&bare_path, ""), 1024).to_str().unwrap()]);
    let (out, errors) = text(&check);
    assert!(
        errors.contains("bare.json: this tokenizer has no end-of-text special token")
            && errors.contains("set data.jsonl.text.end_of_text"),
        "{out}{errors}"
    );
    let check = run(&["check", spec(dir.path(), &data(&bare_path, ", end_of_text = \"\\n\""), 1024).to_str().unwrap()]);
    assert_exit(&check, 0);
}

#[test]
fn an_invalid_tokenizer_json_is_named_with_what_is_wrong() {
    let dir = tempdir();
    std::fs::write(dir.path().join("train.txt"), "some text ".repeat(50)).unwrap();
    let whole = std::fs::read(checked_in()).unwrap();
    for (name, contents, wrong) in [
        ("truncated.json", &whole[..5000], "EOF while parsing"),
        ("model.json", br#"{"model": {"type": "Transformer"}}"#.as_slice(), "did not match any variant"),
    ] {
        std::fs::write(dir.path().join(name), contents).unwrap();
        let path = dir.path().join(name).display().to_string();
        let data = format!(
            "dataset = \"text\"\n\n[data.text]\ntrain = [\"train.txt\"]\n\
             tokenization = {{ tokenizer_json = {path:?} }}\nblock_size = {BLOCK}"
        );
        let check = run(&["check", spec(dir.path(), &data, 1024).to_str().unwrap()]);
        let (out, errors) = text(&check);
        assert_exit(&check, 4);
        let want = format!("{path}: not a tokenizer.json the Hugging Face `tokenizers` library can read: ");
        assert!(errors.contains(&want) && errors.contains(wrong), "{name}:\n{out}{errors}");
    }
    // Text that is not UTF-8 is located, whatever the tokenizer.
    std::fs::write(dir.path().join("train.txt"), b"some text \xff\xfe more").unwrap();
    let data =
        common::lm::text_data(&format!("{{ tokenizer_json = {:?} }}", checked_in().display().to_string()), BLOCK)
            .replace("validation = [\"val.txt\"]\n", "");
    let check = run(&["check", spec(dir.path(), &data, 1024).to_str().unwrap()]);
    assert_exit(&check, 4);
    assert!(text(&check).1.contains("train.txt at byte 10: not UTF-8 text"), "{}", text(&check).1);
}

/// `trainrun tokenize --json` on `spec`, started now (its output read by [`report`]).
fn tokenize(spec: &Path) -> std::process::Child {
    tokenize_into(spec, None)
}

/// [`tokenize`], with `TRAINRUN_TOKEN_CACHE` set to `cache`.
fn tokenize_into(spec: &Path, cache: Option<&Path>) -> std::process::Child {
    let mut command = common::trainrun();
    if let Some(cache) = cache {
        command.env("TRAINRUN_TOKEN_CACHE", cache);
    }
    command
        .args(["tokenize", spec.to_str().unwrap(), "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

fn report(child: std::process::Child) -> serde_json::Value {
    let out = child.wait_with_output().unwrap();
    assert_exit(&out, 0);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out).0))
}

#[test]
fn two_tasks_build_the_token_cache_once_and_a_damaged_one_is_rebuilt() {
    let dir = tempdir();
    let plays =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/shakespeare/train.txt"))
            .unwrap();
    let lines: String = plays.split("\n\n").map(|p| serde_json::json!({ "text": p }).to_string() + "\n").collect();
    std::fs::write(dir.path().join("train.jsonl"), lines).unwrap();
    let data = format!(
        "dataset = \"jsonl\"\n\n[data.jsonl]\ntrain = [\"train.jsonl\"]\n\
         text = {{ tokenization = {{ tokenizer_json = {:?} }}, block_size = {BLOCK} }}",
        checked_in().display().to_string()
    );
    let spec = spec(dir.path(), &data, 1024);
    let (a, b) = (tokenize(&spec), tokenize(&spec));
    let (a, b) = (report(a), report(b));
    let how = |r: &serde_json::Value| r["files"][0]["cache"].as_str().unwrap().to_string();
    let mut hows = [how(&a), how(&b)];
    hows.sort();
    assert_eq!(hows, ["built", "reused"], "one task builds, the other waits and maps it:\n{a}\n{b}");
    assert_eq!(a["tokens"], b["tokens"]);
    assert_eq!(a["vocab_size"], 1024);
    let file = PathBuf::from(a["files"][0]["cache_file"].as_str().unwrap());
    assert_eq!(file.parent().unwrap(), dir.path().join(".trainrun-tokens"));

    // The ids are the tokenizer's, each document followed by <|endoftext|>.
    let tokenizer = TokenizerJson::open(&checked_in()).unwrap();
    let first = plays.split("\n\n").next().unwrap();
    let mut want = tokenizer.encode(Path::new("d"), first).unwrap();
    want.push(tokenizer.encode(Path::new("eot"), "<|endoftext|>").unwrap()[0]);
    let cached = std::fs::read(&file).unwrap();
    // 1,024 ids fit u16: two bytes an id.
    let ids: Vec<u32> =
        cached[64..64 + 2 * want.len()].chunks(2).map(|c| u32::from(u16::from_le_bytes([c[0], c[1]]))).collect();
    assert_eq!(ids, want);

    // Truncated: rebuilt, to the same length.
    std::fs::write(&file, &cached[..cached.len() - 6]).unwrap();
    let again = report(tokenize(&spec));
    assert_eq!((how(&again), &again["tokens"]), ("built".to_string(), &a["tokens"]));
    assert_eq!(std::fs::read(&file).unwrap(), cached);
    assert_eq!(how(&report(tokenize(&spec))), "reused");

    // A run trains from the cache.
    let trained = run(&[spec.to_str().unwrap(), "--quiet"]);
    assert_exit(&trained, 0);

    // TRAINRUN_TOKEN_CACHE moves the cache (for a read-only data folder).
    let elsewhere = dir.path().join("elsewhere");
    let moved = report(tokenize_into(&spec, Some(&elsewhere)));
    assert_eq!((how(&moved), &moved["tokens"]), ("built".to_string(), &a["tokens"]));
    let moved_file = PathBuf::from(moved["files"][0]["cache_file"].as_str().unwrap());
    assert_eq!(moved_file.parent().unwrap(), elsewhere);
}

#[test]
fn tokenize_text_prints_ids_and_pieces_and_refuses_a_source_without_text() {
    let dir = tempdir();
    std::fs::write(dir.path().join("train.txt"), "never read").unwrap();
    let data = format!(
        "dataset = \"text\"\n\n[data.text]\ntrain = [\"train.txt\"]\n\
         tokenization = {{ tokenizer_json = {:?} }}\nblock_size = {BLOCK}",
        checked_in().display().to_string()
    );
    let spec = spec(dir.path(), &data, 1024);
    let out = run(&["tokenize", spec.to_str().unwrap(), "--text", "ROMEO: wherefore 🙂", "--json"]);
    assert_exit(&out, 0);
    let shown: serde_json::Value = serde_json::from_str(&text(&out).0).unwrap();
    let tokenizer = TokenizerJson::open(&checked_in()).unwrap();
    let ids = tokenizer.encode(Path::new("t"), "ROMEO: wherefore 🙂").unwrap();
    assert_eq!(shown["ids"], serde_json::json!(ids));
    let pieces: Vec<String> = ids.iter().map(|&id| tokenizer.piece(id)).collect();
    assert_eq!(shown["pieces"], serde_json::json!(pieces));
    assert!(pieces.contains(&"Ġwhere".to_string()) || pieces.iter().any(|p| p.starts_with('Ġ')), "{pieces:?}");
    assert!(!dir.path().join(".trainrun-tokens").exists(), "--text reads no corpus");
    let plain = run(&["tokenize", spec.to_str().unwrap(), "--text", "ROMEO"]);
    assert_exit(&plain, 0);
    assert!(text(&plain).0.starts_with(&format!("{} tokens (vocabulary of 1024 ids):", ids_of(&tokenizer, "ROMEO"))));

    let refused = run(&["tokenize", "specs/mnist_single.toml"]);
    assert_ne!(refused.status.code(), Some(0));
    assert!(text(&refused).1.contains("tokenize reads a language model's text"), "{}", text(&refused).1);
}

fn ids_of(tokenizer: &TokenizerJson, text: &str) -> usize {
    tokenizer.encode(Path::new("t"), text).unwrap().len()
}

/// Tokens per second of this crate's encoding (2 rayon threads over documents) against Python
/// `tokenizers`' `encode_batch` (2 threads: `RAYON_NUM_THREADS=2`) on the training plays, one
/// paragraph a document, with the checked-in tokenizer. Prints each pair and its ratio.
#[test]
#[ignore]
fn throughput_against_python_tokenizers() {
    use rayon::prelude::*;
    let plays = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/shakespeare/train.txt");
    let text = std::fs::read_to_string(&plays).unwrap();
    let documents: Vec<&str> = text.split("\n\n").collect();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    let tokenizer = TokenizerJson::open(&checked_in()).unwrap();
    let encode = |d: &&str| tokenizer.encode(Path::new("plays"), d).unwrap().len();
    let dir = tempdir();
    let script =
        SPEED.replace("PLAYS", &plays.display().to_string()).replace("TOKENIZER", &checked_in().display().to_string());
    for round in 0..3 {
        let start = std::time::Instant::now();
        let ours: usize = pool.install(|| documents.par_iter().map(encode).sum());
        let ours_s = start.elapsed().as_secs_f64();
        let out = std::process::Command::new("python3")
            .args(["-c", &script, dir.path().to_str().unwrap()])
            .env("RAYON_NUM_THREADS", "2")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let theirs: Vec<(String, usize, f64)> = serde_json::from_slice(&out.stdout).unwrap();
        for (how, tokens, seconds) in theirs {
            assert_eq!(tokens, ours);
            println!(
                "round {round}: tokenizer.json, 2 threads: trainrun {:.2} M tokens/s, Python tokenizers {how} {:.2} M tokens/s: {:.2}x",
                ours as f64 / ours_s / 1e6,
                tokens as f64 / seconds / 1e6,
                seconds / ours_s
            );
        }
    }
}

const SPEED: &str = r#"
import json, time
from tokenizers import Tokenizer
t = Tokenizer.from_file("TOKENIZER")
docs = open("PLAYS", encoding="utf-8").read().split("\n\n")
t.encode_batch(docs[:10], add_special_tokens=False)
out = []
for how in ["encode_batch", "encode_batch_fast"]:
    start = time.perf_counter()
    n = sum(len(e.ids) for e in getattr(t, how)(docs, add_special_tokens=False))
    out.append((how, n, time.perf_counter() - start))
print(json.dumps(out))
"#;
