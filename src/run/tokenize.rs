//! `trainrun tokenize SPEC`: builds the token cache of a language model's corpus ahead of a run
//! (a job's tasks then all map it) and reports each file's tokens, where they came from and the
//! throughput; `trainrun tokenize SPEC --text "…" [--json]` prints the ids and pieces of a text
//! under the spec's tokenizer, for debugging a tokenizer. Nothing is trained and the model is
//! not planned: only the spec's data section is read.

use crate::data::source::hf_datasets::HfDatasetsSource;
use crate::data::source::jsonl::JsonlSource;
use crate::data::source::parquet::ParquetSource;
use crate::data::source::text::cache::Cached;
use crate::data::source::text::{TextSource, Texts, pieces};
use crate::data::{DataError, Vocabulary};
use crate::exit::RunError;
use crate::prepare::{Invocation, data_dirs};
use std::time::Instant;

/// A source of text for a language model.
enum Corpus<'a> {
    Text(&'a TextSource),
    Jsonl(&'a JsonlSource),
    Parquet(&'a ParquetSource),
    HfDatasets(&'a HfDatasetsSource),
}

impl Corpus<'_> {
    fn texts(&self) -> Result<Texts, DataError> {
        match self {
            Corpus::Text(s) => s.texts(),
            Corpus::Jsonl(s) => s.documents(),
            Corpus::Parquet(s) => s.documents(),
            Corpus::HfDatasets(s) => s.documents(),
        }
    }

    fn vocabulary(&self) -> Result<Vocabulary, DataError> {
        match self {
            Corpus::Text(s) => s.vocabulary(),
            Corpus::Jsonl(s) => s.vocabulary(),
            Corpus::Parquet(s) => s.vocabulary(),
            Corpus::HfDatasets(s) => s.vocabulary(),
        }
    }
}

/// Builds the cache and reports it, or prints `text`'s ids and pieces.
pub fn tokenize(inv: &Invocation, text: Option<&str>, json: bool) -> Result<(), RunError> {
    let loaded = crate::spec::load(&inv.spec, &inv.env, &inv.sets).map_err(|e| RunError::Spec(e.to_string()))?;
    let source = crate::plan::source(&loaded.spec.data, &data_dirs(&inv.env), loaded.spec.run.seed)?;
    let source: &dyn crate::data::source::DataSource = &*source;
    let corpus = if let Some(s) = source.as_any().downcast_ref::<TextSource>() {
        Corpus::Text(s)
    } else if let Some(s) = source.as_any().downcast_ref::<JsonlSource>() {
        Corpus::Jsonl(s)
    } else if let Some(s) = source.as_any().downcast_ref::<ParquetSource>() {
        Corpus::Parquet(s)
    } else if let Some(s) = source.as_any().downcast_ref::<HfDatasetsSource>() {
        Corpus::HfDatasets(s)
    } else {
        return Err(RunError::Unsupported(format!(
            "tokenize reads a language model's text: data.dataset = \"text\", or \"jsonl\", \"parquet\" or \
             \"hf_datasets\" with a text section (data.jsonl.text, …), not \"{}\"",
            source.name()
        )));
    };
    match text {
        Some(text) => show_pieces(&corpus.vocabulary()?, text, json),
        None => report(&corpus, json),
    }
}

fn show_pieces(vocabulary: &Vocabulary, text: &str, json: bool) -> Result<(), RunError> {
    let pieces = pieces(vocabulary, text)?;
    if json {
        let ids: Vec<u32> = pieces.iter().map(|(id, _)| *id).collect();
        let texts: Vec<&str> = pieces.iter().map(|(_, p)| p.as_str()).collect();
        let out = serde_json::json!({ "ids": ids, "pieces": texts, "vocab_size": vocabulary.len() });
        println!("{out}");
    } else {
        println!("{} tokens (vocabulary of {} ids):", pieces.len(), vocabulary.len());
        for (id, piece) in pieces {
            println!("{id:>8}  {piece:?}");
        }
    }
    Ok(())
}

fn report(corpus: &Corpus<'_>, json: bool) -> Result<(), RunError> {
    let start = Instant::now();
    let texts = corpus.texts()?;
    let seconds = start.elapsed().as_secs_f64();
    let tokens: usize = texts.files().iter().map(|f| f.tokens).sum();
    let rate = tokens as f64 / seconds.max(1e-9);
    if json {
        let files: Vec<serde_json::Value> = texts
            .files()
            .iter()
            .map(|f| {
                let (_, file) = cached(&f.cached);
                let cache = match f.cached {
                    Cached::Reused(_) => "reused",
                    Cached::Built(_) => "built",
                    Cached::InMemory => "in_memory",
                };
                serde_json::json!({
                    "file": f.path, "split": split(f.validation), "tokens": f.tokens, "cache": cache, "cache_file": file,
                })
            })
            .collect();
        let out = serde_json::json!({
            "files": files, "tokens": tokens, "seconds": seconds, "tokens_per_s": rate,
            "vocab_size": texts.vocabulary().len(),
        });
        println!("{out}");
        return Ok(());
    }
    for f in texts.files() {
        let (cache, file) = cached(&f.cached);
        let place = file.map(|p| format!(" {}", p.display())).unwrap_or_default();
        println!("{} ({}): {} tokens, {cache}{place}", f.path.display(), split(f.validation), f.tokens);
    }
    println!(
        "{tokens} tokens (vocabulary of {} ids) in {seconds:.2} s: {:.2} M tokens/s",
        texts.vocabulary().len(),
        rate / 1e6
    );
    Ok(())
}

fn split(validation: bool) -> &'static str {
    if validation { "validation" } else { "train" }
}

/// How a file's ids were had, in words, and the cache file.
fn cached(cached: &Cached) -> (&'static str, Option<&std::path::Path>) {
    match cached {
        Cached::Reused(file) => ("reused from the cache", Some(file)),
        Cached::Built(file) => ("tokenized into the cache", Some(file)),
        Cached::InMemory => ("tokenized in memory (not cached)", None),
    }
}
