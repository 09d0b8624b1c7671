//! `trainrun sample SPEC --checkpoint PATH`: generates text from a trained language model.
//!
//! The model reads a fixed window of `block_size` tokens, so the context is the last
//! `block_size` tokens, left-aligned and padded after its end: attention is causal, so the
//! padding never reaches the position whose logits are read. Draws come from a ChaCha stream
//! seeded by `--seed` alone, so the same checkpoint, prompt and seed give the same text.
//!
//! Tokens decode with the vocabulary the run wrote (`vocab.json` beside the checkpoint),
//! checked against the model, never one rebuilt from the spec's data as it is today. The text
//! streams out as it is generated, and a stop (SIGTERM, Ctrl-C) ends it after the token at
//! hand, the text so far already printed.

use super::{load_data, pool};
use crate::data::{TokenizerDecoder, Vocabulary};
use crate::engine::{Pass, init};
use crate::exit::RunError;
use crate::prepare::{Invocation, prepare};
use rand::RngExt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

/// The most tokens one call generates: far beyond any context a model here reads, and a
/// bound on a typo's cost (`--tokens 1000000000` ran for hours without a word).
pub const MAX_TOKENS: usize = 1 << 20;

/// What to generate.
#[derive(Debug, Clone)]
pub struct SampleOptions {
    /// Text the generated tokens continue.
    pub prompt: String,
    /// Tokens to generate.
    pub tokens: usize,
    /// Divides the logits: below 1 sharpens, above 1 flattens.
    pub temperature: f32,
    /// Draw only among the `k` likeliest tokens.
    pub top_k: Option<usize>,
    /// Seed of the draws.
    pub seed: u64,
}

/// Prints the prompt and `tokens` generated tokens.
pub fn sample(inv: &Invocation, checkpoint: &Path, o: &SampleOptions) -> Result<(), RunError> {
    if !(o.temperature.is_finite() && o.temperature > 0.0) {
        return Err(RunError::Usage(format!(
            "--temperature {} must be a positive number (1 samples the model as trained; 0.8 is more conservative)",
            o.temperature
        )));
    }
    if o.top_k == Some(0) {
        return Err(RunError::Usage("--top-k 0 leaves no token to draw: use 1 or more, or leave it out".into()));
    }
    if o.tokens > MAX_TOKENS {
        return Err(RunError::Usage(format!(
            "--tokens {} is more than one call generates ({MAX_TOKENS}): ask for fewer, e.g. --tokens 1000",
            o.tokens
        )));
    }
    let stop = crate::signals::stop_requested();
    let p = prepare(inv)?;
    let plan = &p.plan;
    let Some(&[block, vocab]) = plan.model.per_position().then_some(plan.model.output.0.as_slice()) else {
        return Err(RunError::Unsupported(format!(
            "sample needs a language model (an output per position); this spec's model outputs {}",
            plan.model.output
        )));
    };
    let vocabulary = match run_vocabulary(checkpoint)? {
        Some((file, v)) if v.len() as usize != vocab => {
            return Err(RunError::Usage(format!(
                "{} holds {} tokens, but the model predicts {vocab}: the checkpoint was not trained with this \
                 vocabulary; give the run's own checkpoint, or sample with the spec the run trained",
                file.display(),
                v.len()
            )));
        }
        Some((_, v)) => v,
        None => {
            let v = load_data(inv, plan)?.vocabulary.ok_or_else(|| {
                RunError::Unsupported("sample needs a `text` data source: its vocabulary maps tokens to text".into())
            })?;
            eprintln!(
                "warning: no vocab.json beside {}: decoding with the vocabulary of the spec's data as it is now",
                checkpoint.display()
            );
            v
        }
    };
    let mut model = plan.model.build().map_err(|e| RunError::Failure(e.to_string()))?;
    let layout = crate::builder::layout(&model);
    let (params, mut state) = weights(checkpoint, &layout)?;
    let mut context = encode(&vocabulary, &o.prompt)?;
    let mut detokenize = Detokenize::new(&vocabulary, &context);
    let mut rng = init::rng(&[o.seed]);
    let pass = Pass { training: false, seed: 0, accumulate: false, threads: plan.threads };
    let mut x = vec![0.0f32; block];
    let pool = pool(plan.threads)?;
    let mut out = std::io::stdout().lock();
    let written = |e: std::io::Error| RunError::Failure(format!("cannot write the sample: {e}"));
    write!(out, "{}", o.prompt).and_then(|()| out.flush()).map_err(written)?;
    for n in 0..o.tokens {
        if stop.load(Ordering::Relaxed) {
            writeln!(out).map_err(written)?;
            return Err(super::interrupted(RunError::Preempted(format!(
                "preempted: sample stopped after {n} of {} tokens; the text so far is above",
                o.tokens
            ))));
        }
        let window = &context[context.len().saturating_sub(block)..];
        x.fill(0.0);
        x.iter_mut().zip(window).for_each(|(x, t)| *x = *t as f32);
        let last = window.len().max(1) - 1;
        let logits = pool.install(|| model.forward(pass, &params, &mut state, &x, 1));
        let token = draw(&logits[last * vocab..(last + 1) * vocab], o, rng.random::<f64>());
        context.push(token as u32);
        write!(out, "{}", detokenize.next(token)).and_then(|()| out.flush()).map_err(written)?;
    }
    writeln!(out).map_err(written)?;
    Ok(())
}

/// The vocabulary the run wrote beside `checkpoint` (a checkpoint folder, a run folder or a
/// weights file): `vocab.json` in it or in a folder above (a run's checkpoints sit in its
/// folder), read and checked; `None` when there is none.
pub(super) fn run_vocabulary(checkpoint: &Path) -> Result<Option<(PathBuf, Vocabulary)>, RunError> {
    let Some(file) = checkpoint.ancestors().take(4).map(|d| d.join("vocab.json")).find(|f| f.is_file()) else {
        return Ok(None);
    };
    let bad = |why: String| {
        RunError::Usage(format!(
            "{} is not a vocabulary trainrun wrote: {why}; it belongs beside the run's checkpoints as the run wrote it",
            file.display()
        ))
    };
    let text = std::fs::read_to_string(&file).map_err(|e| bad(e.to_string()))?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let vocabulary = match json["tokenization"].as_str() {
        Some("byte") => match json["size"].as_u64() {
            Some(256) => Vocabulary::Byte { size: 256 },
            other => return Err(bad(format!("a byte vocabulary has 256 tokens, not {other:?}"))),
        },
        Some("char") => {
            let tokens: Vec<String> = json["tokens"]
                .as_array()
                .ok_or_else(|| bad("a char vocabulary lists its `tokens`".into()))?
                .iter()
                .map(|t| t.as_str().map(str::to_owned).ok_or_else(|| bad(format!("token {t} is not a string"))))
                .collect::<Result<_, _>>()?;
            if let Some(t) = tokens.iter().find(|t| t.chars().count() != 1) {
                return Err(bad(format!("token {t:?} is not one character")));
            }
            if let Some(w) = tokens.windows(2).find(|w| w[0] >= w[1]) {
                return Err(bad(format!("tokens {:?} and {:?} are not in order (or repeat)", w[0], w[1])));
            }
            Vocabulary::Char { tokens }
        }
        Some("tiktoken") => Vocabulary::tiktoken(
            serde_json::from_value(json["encoding"].clone()).map_err(|e| bad(format!("`encoding`: {e}")))?,
        ),
        Some("tokenizer_json") => {
            let tokenizer = serde_json::to_vec(&json["tokenizer"]).map_err(|e| bad(e.to_string()))?;
            let tokenizer =
                crate::data::TokenizerJson::from_bytes(&file, &tokenizer).map_err(|e| bad(e.to_string()))?;
            Vocabulary::tokenizer_json(tokenizer)
        }
        other => {
            return Err(bad(format!(
                "`tokenization` is {other:?}, not \"char\", \"byte\", \"tiktoken\" or \"tokenizer_json\""
            )));
        }
    };
    Ok(Some((file, vocabulary)))
}

/// The weights of a checkpoint folder, or of a run folder's (or a file's) `model.safetensors`.
pub(super) fn weights(path: &Path, layout: &crate::checkpoint::Layout) -> Result<(Vec<f32>, Vec<f32>), RunError> {
    let file = if path.is_dir() { path.join("model.safetensors") } else { path.to_path_buf() };
    if path.join("manifest.json").exists() {
        let loaded = crate::checkpoint::store::load(path, layout)?;
        return Ok((loaded.params, loaded.state));
    }
    let bytes = std::fs::read(&file).map_err(|e| {
        RunError::Failure(format!(
            "cannot read {} ({e}): give --checkpoint a checkpoint folder, a run folder or a model.safetensors",
            file.display()
        ))
    })?;
    let reader = crate::checkpoint::tensors::Reader::new(&file, &bytes)?;
    let (mut params, mut state) = (vec![0.0; layout.params], vec![0.0; layout.state]);
    reader.fill("", &layout.tensors, &mut params)?;
    reader.fill("", &layout.state_tensors, &mut state)?;
    Ok((params, state))
}

/// Token ids of `text`; a character outside the vocabulary is an error naming it.
fn encode(vocabulary: &Vocabulary, text: &str) -> Result<Vec<u32>, RunError> {
    match vocabulary {
        Vocabulary::Byte { .. } => Ok(text.bytes().map(u32::from).collect()),
        Vocabulary::Tiktoken { encoding, .. } => Ok(encoding.encode(text)),
        Vocabulary::TokenizerJson { tokenizer, .. } => {
            tokenizer.encode(Path::new("--prompt"), text).map_err(|e| RunError::Usage(e.to_string()))
        }
        Vocabulary::Char { tokens } => text
            .chars()
            .enumerate()
            .map(|(i, c)| {
                let s = c.to_string();
                tokens.binary_search(&s).map(|id| id as u32).map_err(|_| {
                    RunError::Usage(format!(
                        "--prompt: the character {c:?} at position {} is not in the model's vocabulary of {} characters (vocab.json)",
                        i + 1,
                        tokens.len()
                    ))
                })
            })
            .collect(),
    }
}

/// Turns generated ids into text as they come.
enum Detokenize<'a> {
    /// One token at a time, from the vocabulary's table.
    Each(&'a Vocabulary),
    /// A `tokenizer.json`'s decoder, which reads each token with those before it (a `##` or
    /// `▁` piece's text depends on its neighbours).
    Stream(TokenizerDecoder<'a>),
}

impl<'a> Detokenize<'a> {
    /// A detokenizer for what follows the ids of the prompt.
    fn new(vocabulary: &'a Vocabulary, prompt: &[u32]) -> Self {
        match vocabulary {
            Vocabulary::Char { .. } | Vocabulary::Byte { .. } | Vocabulary::Tiktoken { .. } => Self::Each(vocabulary),
            Vocabulary::TokenizerJson { tokenizer, .. } => {
                let mut decoder = tokenizer.decoder();
                // The prompt is printed as given: its text is only context for what follows.
                prompt.iter().for_each(|&id| drop(decoder.step(id)));
                Self::Stream(decoder)
            }
        }
    }

    /// The text token `id` adds.
    fn next(&mut self, id: usize) -> String {
        match self {
            Detokenize::Each(Vocabulary::Char { tokens }) => tokens.get(id).cloned().unwrap_or_default(),
            // A byte may be part of a UTF-8 sequence: shown lossily, one token at a time.
            Detokenize::Each(Vocabulary::Byte { .. }) => String::from_utf8_lossy(&[id as u8]).into_owned(),
            Detokenize::Each(Vocabulary::Tiktoken { encoding, .. }) => {
                String::from_utf8_lossy(&encoding.bytes(id as u32)).into_owned()
            }
            Detokenize::Each(Vocabulary::TokenizerJson { tokenizer, .. }) => tokenizer.decoder().step(id as u32),
            Detokenize::Stream(decoder) => decoder.step(id as u32),
        }
    }
}

/// A token drawn from `softmax(logits / temperature)` restricted to the `top_k` likeliest,
/// with `u` uniform in [0, 1). Ties keep the lower id, so the order is fixed.
fn draw(logits: &[f32], o: &SampleOptions, u: f64) -> usize {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    order.truncate(o.top_k.unwrap_or(order.len()).max(1));
    let top = f64::from(logits[order[0]]);
    let weights: Vec<f64> =
        order.iter().map(|&i| ((f64::from(logits[i]) - top) / f64::from(o.temperature)).exp()).collect();
    let mut target = u * weights.iter().sum::<f64>();
    for (&i, w) in order.iter().zip(&weights) {
        if target < *w {
            return i;
        }
        target -= w;
    }
    order[order.len() - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(temperature: f32, top_k: Option<usize>) -> SampleOptions {
        SampleOptions { prompt: String::new(), tokens: 1, temperature, top_k, seed: 0 }
    }

    #[test]
    fn draws_follow_the_softmax_and_top_k() {
        let logits = [0.0f32, 2.0_f32.ln(), 0.0, 1.0_f32.ln()];
        // Weights 1, 2, 1, 1 of 5, in order of likelihood: id 1, then 0, 2, 3 (ties by id).
        assert_eq!(draw(&logits, &opts(1.0, None), 0.0), 1);
        assert_eq!(draw(&logits, &opts(1.0, None), 0.39), 1);
        assert_eq!(draw(&logits, &opts(1.0, None), 0.41), 0);
        assert_eq!(draw(&logits, &opts(1.0, None), 0.99), 3);
        // Top 1 is greedy whatever the draw.
        assert_eq!(draw(&logits, &opts(1.0, Some(1)), 0.99), 1);
        // Top 2 keeps ids 1 and 0: 2/3 and 1/3.
        assert_eq!(draw(&logits, &opts(1.0, Some(2)), 0.7), 0);
        // A low temperature is nearly greedy.
        assert_eq!(draw(&logits, &opts(0.01, None), 0.99), 1);
    }

    #[test]
    fn prompts_encode_and_unknown_characters_are_named() {
        let v = Vocabulary::Char { tokens: vec!["\n".into(), " ".into(), "a".into(), "b".into()] };
        assert_eq!(encode(&v, "ab a").ok(), Some(vec![2, 3, 1, 2]));
        let e = encode(&v, "abz").unwrap_err().to_string();
        assert!(e.contains("'z' at position 3") && e.contains("vocabulary of 4 characters"), "{e}");
        assert_eq!(Detokenize::new(&v, &[]).next(3), "b");
        assert_eq!(encode(&Vocabulary::Byte { size: 256 }, "A").ok(), Some(vec![65]));
    }
}
