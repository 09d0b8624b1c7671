//! The `text` source: UTF-8 files for training and validation, tokenized by character (with a
//! sorted vocabulary built from the training text), by byte, or by a tiktoken encoding
//! ([`tiktoken`]) or a Hugging Face `tokenizer.json` ([`tokenizer_json`]), cut into [`Windows`] of
//! `block_size + 1` tokens for a language model.
//!
//! A character of the validation text that the training text lacks is an error naming it and
//! its `file:line:column`, unless `vocabulary = "train_and_validation"` builds the vocabulary
//! from both. The vocabulary is written to the run folder as `vocab.json`, so a sampler can
//! turn ids back into text.

pub mod cache;
mod documents;
mod texts;
mod tiktoken;
mod tokenizer_json;

pub(crate) use documents::{DOCUMENTS_A_BATCH, DocumentReader, EachBatch, TextFile, borrowed};
pub(crate) use texts::{Joining, Tokenizing};
pub use texts::{Texts, TokenizedFile, pieces};
pub use tiktoken::Encoding;
pub use tokenizer_json::{TokenizerDecoder, TokenizerJson};

use super::{DataSource, RawValues, missing_in, require};
use crate::data::error::{DataError, Position};
use crate::data::{DataFacts, Dataset};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};

/// `[data.text]`: UTF-8 text files for a language model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TextConfig {
    /// Training text files, relative to `data.dir` (or absolute). Required.
    /// Example: `train = ["train.txt"]`.
    pub train: Vec<String>,
    /// Validation text files, evaluated as the test split. Default: none (nothing is
    /// evaluated). Example: `validation = ["val.txt"]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub validation: Vec<String>,
    /// How text becomes tokens: `char`, `byte`, a tiktoken encoding (`gpt2`, `r50k_base`,
    /// `cl100k_base`, `o200k_base`) or a Hugging Face `tokenizer.json`
    /// (`{ tokenizer_json = "tokenizer.json" }`). Default: `char`.
    /// Example: `tokenization = "gpt2"`.
    #[serde(default)]
    pub tokenization: Tokenization,
    /// Which text the `char` vocabulary is built from. Default: `train`.
    /// Example: `vocabulary = "train_and_validation"`.
    #[serde(default)]
    pub vocabulary: VocabularyFrom,
    /// Tokens the model sees per example; each example is a window of `block_size + 1` tokens
    /// whose last `block_size` are the labels. Required. Example: `block_size = 64`.
    pub block_size: NonZeroUsize,
}

/// `data.text.tokenization`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Tokenization {
    /// One token per Unicode character, ids in the sorted order of the vocabulary.
    #[default]
    Char,
    /// One token per byte of the UTF-8 text: 256 ids.
    Byte,
    /// tiktoken's GPT-2 encoding (byte-level BPE, 50,257 ids).
    Gpt2,
    /// tiktoken's `r50k_base` (50,257 ids).
    R50kBase,
    /// tiktoken's `cl100k_base` (100,277 ids).
    Cl100kBase,
    /// tiktoken's `o200k_base` (200,019 ids).
    O200kBase,
    /// A Hugging Face `tokenizer.json` (BPE, WordPiece or Unigram), relative to the working
    /// directory as `data.dir` is (the tokenizer belongs to the model, not to the corpus), or
    /// absolute; ids as Python `tokenizers`' `encode(text, add_special_tokens=False)`.
    /// Example: `tokenization = { tokenizer_json = "tokenizer.json" }`.
    TokenizerJson(String),
}

/// `data.text.vocabulary`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum VocabularyFrom {
    /// The training text only: a validation character it lacks is an error.
    #[default]
    Train,
    /// The training and validation texts.
    TrainAndValidation,
}

/// How token ids map back to text: written to the run folder as `vocab.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "tokenization", rename_all = "snake_case")]
pub enum Vocabulary {
    /// Token `i` is `tokens[i]`, one character each, sorted.
    Char { tokens: Vec<String> },
    /// Token `i` is the byte `i`.
    Byte { size: u32 },
    /// A tiktoken encoding's ids.
    Tiktoken { encoding: Encoding, size: u32 },
    /// A `tokenizer.json`'s ids; the whole tokenizer is written, so a sampler needs no file.
    TokenizerJson { size: u32, tokenizer: TokenizerJson },
}

impl Vocabulary {
    /// Number of token ids.
    pub fn len(&self) -> u32 {
        match self {
            Vocabulary::Char { tokens } => tokens.len() as u32,
            Vocabulary::Byte { size } | Vocabulary::Tiktoken { size, .. } | Vocabulary::TokenizerJson { size, .. } => {
                *size
            }
        }
    }

    /// The vocabulary of a `tokenizer.json`.
    pub fn tokenizer_json(tokenizer: TokenizerJson) -> Self {
        Vocabulary::TokenizerJson { size: tokenizer.size(), tokenizer }
    }

    /// The text put after every document when none is configured (`key` names the setting, for
    /// the error): a newline for `char` and `byte`, the end-of-text special token of a tiktoken
    /// encoding or of a `tokenizer.json` that has an obvious one; an error asking for it otherwise.
    fn default_end_of_text(&self, key: &str) -> Result<&'static str, DataError> {
        match self {
            Vocabulary::Char { .. } | Vocabulary::Byte { .. } => Ok(DEFAULT_CHAR_END_OF_TEXT),
            Vocabulary::Tiktoken { encoding, .. } => Ok(encoding.end_of_text()),
            Vocabulary::TokenizerJson { tokenizer, .. } => {
                tokenizer.default_end_of_text().ok_or_else(|| DataError::Unsupported {
                    path: tokenizer.path().to_path_buf(),
                    what: format!(
                        "this tokenizer has no end-of-text special token trainrun knows (<|endoftext|>, \
                         <|end_of_text|>, </s>, <eos>, [SEP]) to put after every document: set {key} to one of its \
                         special tokens ({}) or to a text",
                        tokenizer.special_tokens().join(", ")
                    ),
                })
            }
        }
    }

    /// The vocabulary of a tiktoken encoding.
    pub fn tiktoken(encoding: Encoding) -> Self {
        Vocabulary::Tiktoken { encoding, size: encoding.size() }
    }

    /// True when there are no tokens.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `data.dataset = "text"`: `[data.text]`'s files in `dir`.
#[derive(Debug, Clone, PartialEq)]
pub struct TextSource {
    pub dir: PathBuf,
    pub config: TextConfig,
    /// The token cache's folder.
    pub cache: PathBuf,
}

impl DataSource for TextSource {
    fn name(&self) -> &'static str {
        "text"
    }

    fn dir(&self) -> Option<&Path> {
        Some(&self.dir)
    }

    fn missing_files(&self) -> Vec<String> {
        missing_in(&self.dir, self.config.train.iter().chain(&self.config.validation))
    }

    /// Example counts, shape and vocabulary size: the files are read (text is small next to the
    /// model that trains on it).
    fn facts(&self) -> Result<DataFacts, DataError> {
        Ok(self.texts()?.facts())
    }

    /// Reads, tokenizes and windows the texts.
    fn load(&self) -> Result<Dataset, DataError> {
        self.texts()?.dataset()
    }

    fn raw_values(&self) -> RawValues {
        RawValues::Tokens
    }
}

impl TextSource {
    /// The files, read and checked, with their vocabulary and token streams' lengths (a subword
    /// tokenizer's streams are in the token cache after this).
    pub fn texts(&self) -> Result<Texts, DataError> {
        let (train, validation, how) = self.read()?;
        Texts::new(train, validation, &how)
    }

    /// The vocabulary alone: nothing is tokenized (`char` reads the files for its characters).
    pub fn vocabulary(&self) -> Result<Vocabulary, DataError> {
        let (train, validation, how) = self.read()?;
        how.vocabulary(&train, &validation).map(|(vocabulary, _)| vocabulary)
    }

    /// The training and validation files, read, and how they are tokenized.
    fn read(&self) -> Result<(Vec<TextFile>, Vec<TextFile>, Tokenizing), DataError> {
        require(self.name(), &self.dir, self.missing_files())?;
        let (dir, config) = (&self.dir, &self.config);
        no_training_text(config)?;
        let all = |names: &[String]| names.iter().map(|n| read_text(dir.join(n))).collect::<Result<Vec<_>, _>>();
        let tokenizing = Tokenizing {
            dataset: "text",
            reading: "text".into(),
            cache: self.cache.clone(),
            tokenization: config.tokenization.clone(),
            vocabulary: config.vocabulary,
            block: config.block_size.get(),
            joining: Joining::Whole,
        };
        Ok((all(&config.train)?, all(&config.validation)?, tokenizing))
    }
}

/// A `char` or `byte` source's end of text when none is configured.
const DEFAULT_CHAR_END_OF_TEXT: &str = "\n";

fn read_text(path: PathBuf) -> Result<TextFile, DataError> {
    let bytes = std::fs::read(&path).map_err(|source| DataError::Read { path: path.clone(), source })?;
    match String::from_utf8(bytes) {
        Ok(text) => Ok(TextFile::held(path, vec![text])),
        Err(e) => {
            let at = Position::Byte(e.utf8_error().valid_up_to() as u64);
            Err(DataError::Malformed {
                path,
                at,
                problem: "not UTF-8 text; data.dataset = \"text\" reads UTF-8 files".into(),
            })
        }
    }
}

fn no_training_text(config: &TextConfig) -> Result<(), DataError> {
    if config.train.is_empty() {
        return Err(DataError::MissingSection {
            dataset: "text",
            section: "at least one file in data.text.train",
            example: "[data.text] train = [\"train.txt\"], validation = [\"val.txt\"], block_size = 64",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::examples::{LabelKind, Split};

    fn source(dir: &Path, config: TextConfig) -> TextSource {
        TextSource { dir: dir.to_path_buf(), config, cache: dir.join(cache::FOLDER) }
    }

    fn config(tokenization: Tokenization, vocabulary: VocabularyFrom) -> TextConfig {
        TextConfig {
            train: vec!["train.txt".into()],
            validation: vec!["val.txt".into()],
            tokenization,
            vocabulary,
            block_size: NonZeroUsize::new(3).unwrap(),
        }
    }

    fn write(dir: &Path, train: &str, val: &str) {
        std::fs::write(dir.join("train.txt"), train).unwrap();
        std::fs::write(dir.join("val.txt"), val).unwrap();
    }

    #[test]
    fn char_vocabulary_is_sorted_and_windows_predict_the_next_char() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "baca\nb", "abcab");
        let data = source(dir.path(), config(Tokenization::Char, VocabularyFrom::Train)).load().unwrap();
        let Some(Vocabulary::Char { tokens }) = &data.vocabulary else { panic!("{:?}", data.vocabulary) };
        assert_eq!(tokens, &["\n", "a", "b", "c"]);
        assert_eq!(data.labels, LabelKind::Sequence { classes: 4, len: 3 });
        // 6 tokens: windows of 4 at 0, 1, 2; validation 5 tokens, stride 3: one window.
        assert_eq!((data.train.len(), data.test.as_ref().map(Split::len)), (3, Some(1)));
        let first = data.train.read(0..1).unwrap();
        assert_eq!((first.x, first.y), (vec![2., 1., 3.], vec![1, 3, 1]));
        assert_eq!(
            source(dir.path(), config(Tokenization::Char, VocabularyFrom::Train)).facts().unwrap(),
            data.facts(0)
        );
        assert_eq!(
            serde_json::to_string(data.vocabulary.as_ref().unwrap()).unwrap(),
            r#"{"tokenization":"char","tokens":["\n","a","b","c"]}"#
        );
    }

    #[test]
    fn a_validation_char_missing_from_the_vocabulary_is_named_with_its_place() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "abc abc\n", "abc\nab\u{e9}c");
        let err = source(dir.path(), config(Tokenization::Char, VocabularyFrom::Train)).load().unwrap_err().to_string();
        assert!(
            err.ends_with(
                "val.txt:2:3: the character 'é' (U+00E9) is not in the vocabulary built from the training text; \
             set data.text.vocabulary = \"train_and_validation\" to build it from both"
            ),
            "{err}"
        );
        let data = source(dir.path(), config(Tokenization::Char, VocabularyFrom::TrainAndValidation)).load().unwrap();
        assert_eq!(data.labels, LabelKind::Sequence { classes: 6, len: 3 });
    }

    #[test]
    fn byte_tokens_are_the_utf8_bytes() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "h\u{e9}llo", "hello");
        let data = source(dir.path(), config(Tokenization::Byte, VocabularyFrom::Train)).load().unwrap();
        assert_eq!(data.labels, LabelKind::Sequence { classes: 256, len: 3 });
        assert_eq!(data.train.read(0..1).unwrap().x, [104., 0xc3 as f32, 0xa9 as f32]);
    }

    #[test]
    fn text_that_is_not_utf8_is_located() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("train.txt"), b"abc\xffdef").unwrap();
        std::fs::write(dir.path().join("val.txt"), b"abc").unwrap();
        let err = source(dir.path(), config(Tokenization::Char, VocabularyFrom::Train)).load().unwrap_err().to_string();
        assert!(err.contains("train.txt at byte 3: not UTF-8 text"), "{err}");
    }
}
