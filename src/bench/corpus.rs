//! `trainrun bench --only corpus`: the language-model corpus targets, each trainrun against its
//! Python peer (`benches/corpus_python.py`, run with `TRAINRUN_BENCH_PYTHON`, default `python3`)
//! on the Shakespeare plays (`../shared/data/shakespeare/train.txt`) cut into documents at
//! every blank line, alternately T P T P T P so both see the same machine, on 2 threads:
//!
//! - tiktoken's GPT-2 encoding against Python `tiktoken`'s `encode_ordinary_batch` (the ranks
//!   handed to Python are the ones bundled in trainrun, written out, so nothing is downloaded);
//! - the checked-in `tokenizer.json` of `specs/shakespeare_bpe.toml` against Python
//!   `tokenizers`' `encode_batch` (its `encode_batch_fast` alongside);
//! - a Parquet text column, read as a training run reads it (the column streamed a record batch
//!   at a time, the documents handed out as borrowed text, UTF-8 checked by the reader), in
//!   process, against a Python process iterating pyarrow's `iter_batches` over the column: both
//!   loops timed alone, the document counts compared. Like with like: neither side tokenizes
//!   (pyarrow's loop does not even make Python strings). `trainrun tokenize` from launch to
//!   exit (`byte` tokens written to the token cache) is printed beside it, for information.
//!   pyarrow writes the file.
//!
//! The tokenizer rows repeat the plays until trainrun's side takes at least [`MIN_SECONDS`], so
//! both sides do (the slower one longer); token counts must agree, or the bench fails. Each
//! row prints its pairs, the median ratio (trainrun's throughput over Python's) and the
//! target; a peer that cannot run prints `no Python figure (why)` and trainrun's figures alone.
//! `--quick` reads the plays once, in 2 pairs, for a smoke test.

use super::median;
use crate::data::{Encoding, ParquetConfig, ParquetSource, ParquetText, Tokenization, TokenizerJson, VocabularyFrom};
use rayon::prelude::*;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The plays, from the repository root.
const PLAYS: &str = "../shared/data/shakespeare/train.txt";

/// The tokenizer of `specs/shakespeare_bpe.toml`.
const TOKENIZER_JSON: &str = "specs/tokenizers/shakespeare_bpe.json";

/// The Python peers.
const SCRIPT: &str = "benches/corpus_python.py";

/// The least time trainrun's side of a tokenizer row takes in the full bench.
const MIN_SECONDS: f64 = 1.0;

/// Copies of the plays in the Parquet file of the full bench (about 276 MB of text: over a
/// second on each side on the reference machine).
const PARQUET_COPIES: usize = 256;

/// Threads on each side.
const THREADS: usize = 2;

/// Prints the three rows.
pub fn run(exe: &Path, python: &str, quick: bool) -> Result<(), String> {
    let pairs = if quick { 2 } else { 3 };
    println!(
        "\n== corpus: tokenizers and a Parquet text column against their Python peers ({SCRIPT}, {python}), \
         {THREADS} threads each, alternating T P; the plays ({PLAYS}) cut at blank lines; CPU: {}",
        super::products::cpu_model()
    );
    let plays = match std::fs::read_to_string(PLAYS) {
        Ok(text) => text,
        Err(e) => {
            println!("corpus SKIPPED: cannot read {PLAYS} ({e}); run the bench from the repository root");
            return Ok(());
        }
    };
    let dir = tempfile::tempdir().map_err(|e| format!("no temporary folder: {e}"))?;
    let pool = rayon::ThreadPoolBuilder::new().num_threads(THREADS).build().map_err(|e| e.to_string())?;
    let bench = Sitting { python, dir: dir.path(), plays: &plays, pool: &pool, pairs, quick };
    bench.tiktoken()?;
    bench.tokenizer_json()?;
    bench.parquet(exe)
}

/// What every row shares.
struct Sitting<'a> {
    python: &'a str,
    dir: &'a Path,
    plays: &'a str,
    pool: &'a rayon::ThreadPool,
    pairs: usize,
    quick: bool,
}

/// The plays repeated, written where the peer reads them.
struct PlaysCopies {
    text: String,
    path: PathBuf,
    copies: usize,
}

impl PlaysCopies {
    /// The documents, cut as the peer cuts them (`str.split("\n\n")`).
    fn documents(&self) -> Vec<&str> {
        self.text.split("\n\n").collect()
    }
}

impl Sitting<'_> {
    /// `copies` of the plays in `name`.
    fn corpus(&self, name: &str, copies: usize) -> Result<PlaysCopies, String> {
        let (text, path) = (self.plays.repeat(copies), self.dir.join(name));
        std::fs::write(&path, &text).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(PlaysCopies { text, path, copies })
    }

    /// A corpus on which `encode` (tokens of one document) takes at least [`MIN_SECONDS`] on
    /// [`THREADS`] threads (the plays once with `quick`).
    fn sized(
        &self,
        name: &str,
        encode: &(dyn Fn(&str) -> Result<usize, String> + Sync),
    ) -> Result<PlaysCopies, String> {
        if self.quick {
            return self.corpus(name, 1);
        }
        let documents: Vec<&str> = self.plays.split("\n\n").collect();
        // Warm (the first pass builds caches), then timed; with a margin for the noise.
        self.encode(&documents, encode)?;
        let (_, seconds) = self.encode(&documents, encode)?;
        self.corpus(name, (MIN_SECONDS * 1.5 / seconds.max(1e-6)).ceil().clamp(1.0, 512.0) as usize)
    }

    /// Tokens of `documents` and the seconds `encode` took over them on [`THREADS`] threads.
    fn encode(
        &self,
        documents: &[&str],
        encode: &(dyn Fn(&str) -> Result<usize, String> + Sync),
    ) -> Result<(usize, f64), String> {
        let start = Instant::now();
        let tokens = self.pool.install(|| documents.par_iter().map(|d| encode(d)).sum::<Result<usize, String>>())?;
        Ok((tokens, start.elapsed().as_secs_f64()))
    }

    /// tiktoken's GPT-2 encoding against `tiktoken.Encoding.encode_ordinary_batch`.
    fn tiktoken(&self) -> Result<(), String> {
        let encode = |d: &str| Ok(Encoding::Gpt2.encode(d).len());
        let corpus = self.sized("tiktoken.txt", &encode)?;
        // The mergeable ranks are the ids below the end-of-text token's, in order.
        let ranks: String =
            (0..Encoding::Gpt2.size() - 1).map(|id| hex(&Encoding::Gpt2.bytes(id)) + "\n").collect::<String>();
        let ranks_file = self.dir.join("gpt2.ranks");
        std::fs::write(&ranks_file, ranks).map_err(|e| format!("{}: {e}", ranks_file.display()))?;
        let args = ["tiktoken", "--corpus", &path(&corpus.path), "--ranks", &path(&ranks_file)];
        self.tokenizer_row(
            &format!("tiktoken gpt2 vs Python tiktoken encode_ordinary_batch, {}", size(&corpus)),
            &corpus,
            &encode,
            &|out| peer_figure(out, &[]),
            (&args, None),
        )
    }

    /// The checked-in `tokenizer.json` against `tokenizers.Tokenizer.encode_batch`.
    fn tokenizer_json(&self) -> Result<(), String> {
        let file = Path::new(TOKENIZER_JSON);
        let tokenizer = TokenizerJson::open(file).map_err(|e| e.to_string())?;
        let encode = |d: &str| tokenizer.encode(file, d).map(|ids| ids.len()).map_err(|e| e.to_string());
        let corpus = self.sized("tokenizer_json.txt", &encode)?;
        let args = ["tokenizers", "--corpus", &path(&corpus.path), "--tokenizer", TOKENIZER_JSON];
        self.tokenizer_row(
            &format!("{TOKENIZER_JSON} vs Python tokenizers encode_batch, {}", size(&corpus)),
            &corpus,
            &encode,
            &|out| peer_figure(out, &["encode_batch"]),
            (&args, Some("encode_batch_fast")),
        )?;
        Ok(())
    }

    /// One tokenizer's pairs: trainrun's `encode` over the documents, then the peer run with
    /// `args` (and the figure of its `also` method beside, where it printed one).
    fn tokenizer_row(
        &self,
        title: &str,
        corpus: &PlaysCopies,
        encode: &(dyn Fn(&str) -> Result<usize, String> + Sync),
        figure: &PeerFigure,
        (args, also): (&[&str], Option<&str>),
    ) -> Result<(), String> {
        println!("\n{title}");
        println!(
            "{:>5} {:>15} {:>11} {:>13} {:>9} {:>7}{}",
            "pair",
            "trainrun tok/s",
            "trainrun s",
            "Python tok/s",
            "Python s",
            "ratio",
            also.map(|a| format!(" {:>16} {:>7}", format!("{a} tok/s"), "ratio")).unwrap_or_default()
        );
        let documents = corpus.documents();
        let (mut ratios, mut skipped) = (Vec::new(), None);
        for pair in 1..=self.pairs {
            let (tokens, seconds) = self.encode(&documents, encode)?;
            let ours = tokens as f64 / seconds;
            let mut line = format!("{pair:>5} {:>15} {seconds:>11.2}", millions(ours));
            match skipped.is_none().then(|| self.peer(args)).transpose() {
                Ok(Some(out)) => {
                    let (theirs_tokens, theirs_seconds) = figure(&out)?;
                    if theirs_tokens != tokens {
                        return Err(format!(
                            "{title}: trainrun made {tokens} tokens and Python {theirs_tokens} from the same \
                             documents; the ids differ (tests/data_tokenizers.rs and tests/data_tokenizer_json.rs \
                             compare them)"
                        ));
                    }
                    let theirs = theirs_tokens as f64 / theirs_seconds;
                    ratios.push(ours / theirs);
                    line += &format!(" {:>13} {theirs_seconds:>9.2} {:>6.2}×", millions(theirs), ours / theirs);
                    if let Some(also) = also.and_then(|a| out.get(a)) {
                        let fast = (also["tokens"].as_f64(), also["seconds"].as_f64());
                        if let (Some(t), Some(s)) = fast {
                            line += &format!(" {:>16} {:>6.2}×", millions(t / s), ours / (t / s));
                        }
                    }
                }
                Ok(None) => line += &format!(" {:>13} {:>9} {:>7}", "-", "-", "-"),
                Err(why) => {
                    println!("no Python figure ({why})");
                    skipped = Some(why);
                    line += &format!(" {:>13} {:>9} {:>7}", "-", "-", "-");
                }
            }
            println!("{line}");
        }
        verdict(ratios, 1.0, skipped);
        Ok(())
    }

    /// A Parquet text column read as a training run reads it (the documents handed out a record
    /// batch at a time), in process, against pyarrow's `iter_batches` over it, only the loops
    /// timed; beside them, `trainrun tokenize` from launch to exit (byte tokens into the token
    /// cache), which reads the column and also tokenizes and writes: not the target's measure.
    fn parquet(&self, exe: &Path) -> Result<(), String> {
        let copies = if self.quick { 1 } else { PARQUET_COPIES };
        let corpus = self.corpus("parquet.txt", copies)?;
        let file = self.dir.join("corpus.parquet");
        let text_mb = corpus.documents().iter().map(|d| d.len()).sum::<usize>() as f64 / 1e6;
        println!(
            "\nParquet text column ({text_mb:.0} MB of documents, the plays × {copies}, pq.write_table's defaults): \
             trainrun reading the column as a run does (in process, the documents handed out as borrowed text) vs \
             pyarrow iter_batches; `tokenize s` is trainrun tokenize launch to exit (byte tokens into the token \
             cache), for information"
        );
        let source = corpus.path.clone();
        drop(corpus);
        let written = self.peer(&["write-parquet", "--corpus", &path(&source), "--out", &path(&file)]);
        std::fs::remove_file(&source).map_err(|e| format!("{}: {e}", source.display()))?;
        let written = match written {
            Ok(w) => w,
            Err(why) => {
                println!("no Python figure ({why})");
                println!("parquet SKIPPED: pyarrow writes the file both sides read");
                return Ok(());
            }
        };
        println!("{} rows in {} row groups", written["rows"], written["row_groups"]);
        let spec = self.dir.join("parquet.toml");
        let text = format!(
            "[data]\ndataset = \"parquet\"\ndir = {dir:?}\n\n[data.parquet]\ntrain = [\"corpus.parquet\"]\n\
             text = {{ column = \"text\", tokenization = \"byte\", block_size = 64 }}\n\n[model]\nzoo = \"gpt\"\n",
            dir = path(self.dir)
        );
        std::fs::write(&spec, text).map_err(|e| format!("{}: {e}", spec.display()))?;
        let reader = ParquetSource {
            cache: self.dir.join("unused-cache"),
            dir: self.dir.to_path_buf(),
            config: ParquetConfig {
                train: vec!["corpus.parquet".into()],
                validation: vec![],
                text: Some(ParquetText {
                    column: "text".into(),
                    end_of_text: None,
                    tokenization: Tokenization::Byte,
                    vocabulary: VocabularyFrom::Train,
                    block_size: NonZeroUsize::MIN,
                }),
                table: None,
                shuffle_buffer: 0,
            },
        };
        println!(
            "{:>5} {:>10} {:>13} {:>11} {:>13} {:>7} {:>11}",
            "pair", "trainrun s", "trainrun MB/s", "pyarrow s", "pyarrow MB/s", "ratio", "tokenize s"
        );
        let mut ratios = Vec::new();
        for pair in 1..=self.pairs {
            let (documents, seconds) = read_documents(&reader)?;
            let mut line = format!("{pair:>5} {seconds:>10.2} {:>13.0}", text_mb / seconds);
            let theirs = self.peer(&["pyarrow", "--parquet", &path(&file)])?;
            if theirs["rows"].as_u64() != Some(documents as u64) {
                return Err(format!(
                    "trainrun read {documents} documents and pyarrow {theirs} from {}",
                    file.display()
                ));
            }
            let theirs = theirs["seconds"].as_f64().ok_or_else(|| format!("{SCRIPT} pyarrow printed {theirs}"))?;
            ratios.push(theirs / seconds);
            let tokenize = self.tokenize(exe, &spec, pair)?;
            line += &format!(" {theirs:>11.2} {:>13.0} {:>6.2}× {tokenize:>11.2}", text_mb / theirs, theirs / seconds);
            println!("{line}");
        }
        verdict(ratios, 0.8, None);
        Ok(())
    }

    /// Seconds from launch to exit of `trainrun tokenize spec` into a fresh cache folder.
    fn tokenize(&self, exe: &Path, spec: &Path, pair: usize) -> Result<f64, String> {
        let cache = self.dir.join(format!("cache-{pair}"));
        let start = Instant::now();
        let out = std::process::Command::new(exe)
            // The bench's own variable would be refused by the spec as an unknown `TRAINRUN_` name.
            .env_remove("TRAINRUN_BENCH_PYTHON")
            .env("TRAINRUN_TOKEN_CACHE", &cache)
            .env("RAYON_NUM_THREADS", THREADS.to_string())
            .args(["tokenize", &path(spec), "--json"])
            .output()
            .map_err(|e| format!("cannot run trainrun tokenize: {e}"))?;
        let seconds = start.elapsed().as_secs_f64();
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|_| {
            format!("trainrun tokenize failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr))
        })?;
        if report["files"][0]["cache"] != "built" {
            return Err(format!("trainrun tokenize did not build the cache: {report}"));
        }
        std::fs::remove_dir_all(&cache).map_err(|e| format!("{}: {e}", cache.display()))?;
        Ok(seconds)
    }

    /// The last line of `benches/corpus_python.py args` as JSON, or why there is none.
    fn peer(&self, args: &[&str]) -> Result<serde_json::Value, String> {
        let out = std::process::Command::new(self.python)
            .arg(SCRIPT)
            .args(args)
            .env("RAYON_NUM_THREADS", THREADS.to_string())
            .output()
            .map_err(|e| format!("cannot run {} {SCRIPT}: {e}", self.python))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let last = text.lines().last().unwrap_or_default();
        if !out.status.success() || !last.starts_with('{') {
            let why =
                if last.is_empty() { String::from_utf8_lossy(&out.stderr).trim().to_string() } else { last.into() };
            return Err(format!(
                "{why}; set TRAINRUN_BENCH_PYTHON to a python with tiktoken, tokenizers and pyarrow, and run from \
                 the repository root"
            ));
        }
        serde_json::from_str(last).map_err(|e| format!("{SCRIPT} {}: {e}: {last}", args[0]))
    }
}

/// The documents of `reader`'s text column and the seconds reading them took.
fn read_documents(reader: &ParquetSource) -> Result<(usize, f64), String> {
    let (start, mut documents, mut bytes) = (Instant::now(), 0, 0);
    reader
        .read_training_documents(&mut |batch| {
            documents += batch.len();
            // Touch the text, as pyarrow's loop touches its arrays' sizes.
            bytes += batch.iter().map(|d| d.len()).sum::<usize>();
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    let seconds = start.elapsed().as_secs_f64();
    if bytes == 0 && documents > 0 {
        return Err("trainrun read empty documents from the Parquet file".into());
    }
    Ok((documents, seconds))
}

/// Reads tokens and seconds from a peer's line.
type PeerFigure = dyn Fn(&serde_json::Value) -> Result<(usize, f64), String>;

/// Tokens and seconds from a peer's line: at `key` when given, else the line itself.
fn peer_figure(out: &serde_json::Value, key: &[&str]) -> Result<(usize, f64), String> {
    let row = key.iter().fold(out, |v, k| &v[k]);
    match (row["tokens"].as_u64(), row["seconds"].as_f64()) {
        (Some(tokens), Some(seconds)) => Ok((tokens as usize, seconds)),
        _ => Err(format!("{SCRIPT} printed no tokens and seconds: {out}")),
    }
}

/// The median ratio against `target`, or why there is none.
fn verdict(ratios: Vec<f64>, target: f64, skipped: Option<String>) {
    if ratios.is_empty() {
        println!("median: not measured ({})", skipped.unwrap_or_else(|| "no pair".into()));
        return;
    }
    let m = median(ratios);
    println!("median ratio {m:.2}× (target ≥ {target:.1}×): {}", if m >= target { "met" } else { "NOT met" });
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

fn millions(per_s: f64) -> String {
    format!("{:.2} M", per_s / 1e6)
}

fn size(corpus: &PlaysCopies) -> String {
    format!("the plays × {} ({:.0} MB)", corpus.copies, corpus.text.len() as f64 / 1e6)
}
