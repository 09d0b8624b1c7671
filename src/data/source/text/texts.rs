//! How a language model's texts become windows of tokens, what the `text`, `jsonl`, `parquet`
//! and `hf_datasets` sources share: the vocabulary, the end of text put after every document,
//! one token stream per file and the windows. A subword tokenizer's streams, and every stream
//! of streamed documents, go through the token [`cache`](super::cache): made batch by batch
//! into a file that is then memory-mapped, so neither the documents nor their tokens are held.

use super::cache::{self, CacheKey, Cached};
use super::documents::{Documents, TextFile};
use super::{DEFAULT_CHAR_END_OF_TEXT, Encoding, Tokenization, TokenizerJson, Vocabulary, VocabularyFrom};
use crate::data::error::{DataError, Position};
use crate::data::examples::{LabelKind, Split};
use crate::data::windows::{Tokens, WindowSplit, Windows, count, require_windows};
use crate::data::{DataFacts, Dataset, TokenDtype};
use rayon::prelude::*;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// How a language model's texts become windows of tokens: what `[data.text]` and
/// `[data.jsonl.text]` share.
pub(crate) struct Tokenizing {
    /// The source, as `data.dataset` names it (for errors).
    pub dataset: &'static str,
    /// How the source reads documents from a file (`text`, or `jsonl` and the field): part of
    /// the token cache's key.
    pub reading: String,
    /// The token cache's folder.
    pub cache: PathBuf,
    pub tokenization: Tokenization,
    pub vocabulary: VocabularyFrom,
    /// Tokens per example.
    pub block: usize,
    pub joining: Joining,
}

/// What is put after every document.
pub(crate) enum Joining {
    /// Nothing: a file is one document (`text`).
    Whole,
    /// The configured text, or the tokenization's own end of text when `None` (`jsonl`); a
    /// tokenizer's special tokens in it are read as such. `key` names the setting, for errors.
    Documents { end_of_text: Option<String>, key: &'static str },
}

/// A file's tokens, as `trainrun tokenize` reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizedFile {
    pub path: PathBuf,
    /// A validation file (else a training one).
    pub validation: bool,
    pub tokens: usize,
    /// Where the ids came from; a `text` file's `char` and `byte` ids are not cached (`InMemory`).
    pub cached: Cached,
}

/// The texts of a language model's files, read and checked, one token stream per file, and the
/// vocabulary.
pub struct Texts {
    train: Vec<TextFile>,
    validation: Vec<TextFile>,
    vocabulary: Vocabulary,
    /// The ids put after every document.
    end_of_text: Vec<u32>,
    block: usize,
    reading: String,
    /// The token cache's folder.
    cache: PathBuf,
    /// Each file's tokens, counted (and cached) while checking the splits.
    files: Vec<TokenizedFile>,
}

impl Tokenizing {
    /// The vocabulary of the files (only `char` reads them) and the ids put after every document.
    pub(crate) fn vocabulary(
        &self,
        train: &[TextFile],
        validation: &[TextFile],
    ) -> Result<(Vocabulary, Vec<u32>), DataError> {
        // Known before the vocabulary only when configured: `char` needs its characters.
        let given = match &self.joining {
            Joining::Whole => Some(""),
            Joining::Documents { end_of_text, .. } => end_of_text.as_deref(),
        };
        let vocabulary = match &self.tokenization {
            Tokenization::Byte => Vocabulary::Byte { size: 256 },
            Tokenization::Char => {
                let from_validation = match self.vocabulary {
                    VocabularyFrom::Train => &[][..],
                    VocabularyFrom::TrainAndValidation => validation,
                };
                let end_of_text = given.unwrap_or(DEFAULT_CHAR_END_OF_TEXT);
                let mut chars: BTreeSet<char> = end_of_text.chars().collect();
                for file in train.iter().chain(from_validation) {
                    file.each_batch(&mut |documents| {
                        documents.iter().for_each(|d| chars.extend(d.chars()));
                        Ok(())
                    })?;
                }
                Vocabulary::Char { tokens: chars.into_iter().map(String::from).collect() }
            }
            Tokenization::Gpt2 => Vocabulary::tiktoken(Encoding::Gpt2),
            Tokenization::R50kBase => Vocabulary::tiktoken(Encoding::R50kBase),
            Tokenization::Cl100kBase => Vocabulary::tiktoken(Encoding::Cl100kBase),
            Tokenization::O200kBase => Vocabulary::tiktoken(Encoding::O200kBase),
            Tokenization::TokenizerJson(file) => Vocabulary::tokenizer_json(TokenizerJson::open(Path::new(file))?),
        };
        let end_of_text = match (given, &self.joining) {
            (Some(text), _) => text,
            (None, Joining::Documents { key, .. }) => vocabulary.default_end_of_text(key)?,
            (None, Joining::Whole) => "",
        };
        let end_of_text = match &vocabulary {
            Vocabulary::Tiktoken { encoding, .. } => encoding.encode_special(end_of_text),
            Vocabulary::Char { .. } | Vocabulary::Byte { .. } | Vocabulary::TokenizerJson { .. } => {
                encode(Path::new("data.jsonl.text.end_of_text"), end_of_text, &vocabulary)?
            }
        };
        Ok((vocabulary, end_of_text))
    }
}

impl Texts {
    /// The texts of the training and validation files: the vocabulary is built and each split
    /// is checked to hold one window at least (a subword tokenizer's streams are tokenized, or
    /// found in the token cache, to count them).
    pub(crate) fn new(train: Vec<TextFile>, validation: Vec<TextFile>, how: &Tokenizing) -> Result<Self, DataError> {
        let (vocabulary, end_of_text) = how.vocabulary(&train, &validation)?;
        let cache = how.cache.clone();
        let (block, reading) = (how.block, how.reading.clone());
        let mut texts = Self { train, validation, vocabulary, end_of_text, block, reading, cache, files: vec![] };
        for (split, validation) in [(WindowSplit::Train, false), (WindowSplit::Validation, true)] {
            let files = if validation { &texts.validation } else { &texts.train };
            let mut counted = vec![];
            for file in files {
                let (tokens, cached) = texts.count(file)?;
                counted.push(TokenizedFile { path: file.path.clone(), validation, tokens, cached });
            }
            let counts: Vec<(&Path, usize)> = counted.iter().map(|f| (f.path.as_path(), f.tokens)).collect();
            require_windows(how.dataset, split, &counts, how.block)?;
            texts.files.extend(counted);
        }
        Ok(texts)
    }

    /// The vocabulary.
    pub fn vocabulary(&self) -> &Vocabulary {
        &self.vocabulary
    }

    /// Each file's tokens and where they came from.
    pub fn files(&self) -> &[TokenizedFile] {
        &self.files
    }

    /// The number of tokens of `file`'s stream: held `char` and `byte` documents count their
    /// characters or bytes; any other stream is made (or found in the cache) to count it.
    fn count(&self, file: &TextFile) -> Result<(usize, Cached), DataError> {
        let end_of_text = self.end_of_text.len();
        let held = |documents: &[String], per: fn(&String) -> usize| {
            (documents.par_iter().map(|d| per(d) + end_of_text).sum::<usize>(), Cached::InMemory)
        };
        match (&self.vocabulary, &file.documents) {
            (Vocabulary::Char { .. }, Documents::Held(d)) => Ok(held(d, |d| d.chars().count())),
            (Vocabulary::Byte { .. }, Documents::Held(d)) => Ok(held(d, String::len)),
            (Vocabulary::Char { .. } | Vocabulary::Byte { .. }, Documents::Streamed(_))
            | (Vocabulary::Tiktoken { .. } | Vocabulary::TokenizerJson { .. }, _) => {
                self.stream(file).map(|(tokens, cached)| (tokens.len(), cached))
            }
        }
    }

    /// `file`'s token stream: its documents encoded in parallel a batch at a time, each followed
    /// by the end of text; held `char` and `byte` documents in memory, any other stream through
    /// the token cache (streamed documents' ids are never held whole).
    fn stream(&self, file: &TextFile) -> Result<(Tokens, Cached), DataError> {
        let tokenize = |sink: &mut dyn FnMut(&[u32])| {
            file.each_batch(&mut |documents| {
                // A task's documents' ids, each followed by the end of text, in one vector: the
                // same ids in the same order as document by document, without a vector and two
                // calls to the sink for each (most documents are a paragraph).
                let encoded: Vec<Vec<u32>> = documents
                    .par_chunks(DOCUMENTS_A_TASK)
                    .map(|chunk| {
                        let mut ids = Vec::new();
                        for document in chunk {
                            encode_into(&file.path, document, &self.vocabulary, &mut ids)?;
                            ids.extend_from_slice(&self.end_of_text);
                        }
                        Ok(ids)
                    })
                    .collect::<Result<_, DataError>>()?;
                encoded.iter().for_each(|ids| sink(ids));
                Ok(())
            })
        };
        let tokenizer = match (&self.vocabulary, &file.documents) {
            (Vocabulary::Char { .. } | Vocabulary::Byte { .. }, Documents::Held(_)) => {
                return Ok((Tokens::Owned(cache::in_memory(tokenize)?), Cached::InMemory));
            }
            (Vocabulary::Char { tokens }, Documents::Streamed(_)) => format!("char {}", cache::digest_of(tokens)),
            (Vocabulary::Byte { .. }, Documents::Streamed(_)) => "byte".into(),
            (Vocabulary::Tiktoken { encoding, .. }, _) => format!("tiktoken {encoding:?}"),
            (Vocabulary::TokenizerJson { tokenizer, .. }, _) => format!("tokenizer.json {}", tokenizer.sha256()),
        };
        let key = CacheKey {
            reading: &self.reading,
            tokenizer: &tokenizer,
            end_of_text: &self.end_of_text,
            dtype: TokenDtype::holding(self.vocabulary.len()),
            file: &file.path,
        };
        cache::tokens(&self.cache, &key, tokenize)
    }

    /// Example counts, shape and vocabulary size.
    pub(crate) fn facts(&self) -> DataFacts {
        let block = self.block;
        let windows = |validation: bool, stride| {
            self.files.iter().filter(|f| f.validation == validation).map(|f| count(f.tokens, block, stride)).sum()
        };
        DataFacts {
            train_examples: windows(false, 1),
            test_examples: windows(true, block),
            example_shape: vec![block],
            labels: LabelKind::Sequence { classes: self.vocabulary.len(), len: block },
            // Windows are sharded by example: splitting files across workers is not offered.
            train_files: 0,
            warnings: vec![],
        }
    }

    /// The texts tokenized (documents in parallel) and windowed: training windows at every
    /// token, validation windows side by side.
    pub(crate) fn dataset(self) -> Result<Dataset, DataError> {
        let block = self.block;
        let tokens =
            |files: &[TextFile]| files.iter().map(|f| self.stream(f).map(|(t, _)| t)).collect::<Result<Vec<_>, _>>();
        let train = Split::of(Windows::new(tokens(&self.train)?, block, 1));
        let test = match self.validation.is_empty() {
            true => None,
            false => Some(Split::of(Windows::new(tokens(&self.validation)?, block, block))),
        };
        Ok(Dataset {
            train,
            test,
            labels: LabelKind::Sequence { classes: self.vocabulary.len(), len: block },
            vocabulary: Some(self.vocabulary),
            classes: None,
        })
    }
}

/// The ids of `text` under `vocabulary`, each with its piece of text (`trainrun tokenize
/// --text`): a character, a byte, a tiktoken token's bytes (lossy where they hold part of a
/// character), or a `tokenizer.json` token as the tokenizer writes it (`Ġ`, `##`, `▁` and all).
pub fn pieces(vocabulary: &Vocabulary, text: &str) -> Result<Vec<(u32, String)>, DataError> {
    let ids = encode(Path::new("--text"), text, vocabulary)?;
    let piece = |id: u32| match vocabulary {
        Vocabulary::Char { tokens } => tokens.get(id as usize).cloned().unwrap_or_default(),
        Vocabulary::Byte { .. } => String::from_utf8_lossy(&[id as u8]).into_owned(),
        Vocabulary::Tiktoken { encoding, .. } => String::from_utf8_lossy(&encoding.bytes(id)).into_owned(),
        Vocabulary::TokenizerJson { tokenizer, .. } => tokenizer.piece(id),
    };
    Ok(ids.into_iter().map(|id| (id, piece(id))).collect())
}

/// Documents tokenized by one task: enough to outweigh handing out the task, few enough that a
/// batch of [`DOCUMENTS_A_BATCH`](super::DOCUMENTS_A_BATCH) keeps every thread busy.
const DOCUMENTS_A_TASK: usize = 64;

/// The token ids of `text` (at `path`, for errors).
fn encode(path: &Path, text: &str, vocabulary: &Vocabulary) -> Result<Vec<u32>, DataError> {
    let mut ids = Vec::new();
    encode_into(path, text, vocabulary, &mut ids)?;
    Ok(ids)
}

/// Appends the token ids of `text` (at `path`, for errors) to `ids`.
fn encode_into(path: &Path, text: &str, vocabulary: &Vocabulary, ids: &mut Vec<u32>) -> Result<(), DataError> {
    match vocabulary {
        Vocabulary::Byte { .. } => ids.extend(text.bytes().map(u32::from)),
        Vocabulary::Tiktoken { encoding, .. } => ids.extend(encoding.encode(text)),
        Vocabulary::TokenizerJson { tokenizer, .. } => ids.extend(tokenizer.encode(path, text)?),
        Vocabulary::Char { tokens } => encode_chars(path, text, tokens, ids)?,
    }
    Ok(())
}

/// Appends the ids of `text`'s characters in the sorted character vocabulary `tokens` to `ids`;
/// a character outside it is an error naming its line and column.
fn encode_chars(path: &Path, text: &str, tokens: &[String], ids: &mut Vec<u32>) -> Result<(), DataError> {
    ids.reserve(text.len());
    let (mut line, mut column) = (1u64, 0usize);
    let mut buf = [0u8; 4];
    for c in text.chars() {
        column += 1;
        let key: &str = c.encode_utf8(&mut buf);
        match tokens.binary_search_by(|t| t.as_str().cmp(key)) {
            Ok(id) => ids.push(id as u32),
            Err(_) => {
                return Err(DataError::Malformed {
                    path: path.to_path_buf(),
                    at: Position::Line { line, column },
                    problem: format!(
                        "the character {c:?} (U+{:04X}) is not in the vocabulary built from the training text; \
                         set data.text.vocabulary = \"train_and_validation\" to build it from both",
                        u32::from(c)
                    ),
                });
            }
        }
        if c == '\n' {
            (line, column) = (line + 1, 0);
        }
    }
    Ok(())
}
