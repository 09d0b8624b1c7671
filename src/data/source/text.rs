//! The `text` source: UTF-8 files for training and validation, tokenized by character (with a
//! sorted vocabulary built from the training text), by byte, or by a tiktoken encoding
//! ([`tiktoken`]), cut into [`Windows`] of `block_size + 1` tokens for a language model.
//!
//! A character of the validation text that the training text lacks is an error naming it and
//! its `file:line:column`, unless `vocabulary = "train_and_validation"` builds the vocabulary
//! from both. The vocabulary is written to the run folder as `vocab.json`, so a sampler can
//! turn ids back into text.

mod tiktoken;

pub use tiktoken::Encoding;

use super::{DataSource, RawValues, missing_in, require};
use crate::data::error::{DataError, Position};
use crate::data::examples::{LabelKind, Split};
use crate::data::windows::{Tokens, WindowSplit, Windows, count, require_windows};
use crate::data::{DataFacts, Dataset};
use rayon::prelude::*;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
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
    /// How text becomes tokens: `char`, `byte`, or a tiktoken encoding (`gpt2`, `r50k_base`,
    /// `cl100k_base`, `o200k_base`). Default: `char`. Example: `tokenization = "gpt2"`.
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
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
}

impl Tokenization {
    /// The text put after every document by default: a newline for `char` and `byte`, the
    /// end-of-text special token for a tiktoken encoding.
    pub fn default_end_of_text(self) -> &'static str {
        match self {
            Tokenization::Char | Tokenization::Byte => "\n",
            Tokenization::Gpt2 | Tokenization::R50kBase | Tokenization::Cl100kBase | Tokenization::O200kBase => {
                tiktoken_rs::ENDOFTEXT
            }
        }
    }
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
}

impl Vocabulary {
    /// Number of token ids.
    pub fn len(&self) -> u32 {
        match self {
            Vocabulary::Char { tokens } => tokens.len() as u32,
            Vocabulary::Byte { size } | Vocabulary::Tiktoken { size, .. } => *size,
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
    /// The files, read and checked, with their vocabulary.
    fn texts(&self) -> Result<Texts, DataError> {
        require(self.name(), &self.dir, self.missing_files())?;
        let (dir, config) = (&self.dir, &self.config);
        no_training_text(config)?;
        let all = |names: &[String]| names.iter().map(|n| read_text(dir.join(n))).collect::<Result<Vec<_>, _>>();
        let tokenizing = Tokenizing {
            dataset: "text",
            tokenization: config.tokenization,
            vocabulary: config.vocabulary,
            block: config.block_size.get(),
            end_of_text: None,
        };
        Texts::new(all(&config.train)?, all(&config.validation)?, &tokenizing)
    }
}

/// How a language model's texts become windows of tokens: what `[data.text]` and
/// `[data.jsonl.text]` share.
pub(super) struct Tokenizing {
    /// The source, as `data.dataset` names it (for errors).
    pub dataset: &'static str,
    pub tokenization: Tokenization,
    pub vocabulary: VocabularyFrom,
    /// Tokens per example.
    pub block: usize,
    /// Text put after every document (`None`: nothing, the file is one document); for a
    /// tiktoken encoding its special tokens are read as such.
    pub end_of_text: Option<String>,
}

/// One file's documents, in order.
pub(super) struct TextFile {
    pub path: PathBuf,
    pub documents: Vec<String>,
}

/// The texts of a language model's files, read and checked, one token stream per file, and the
/// vocabulary.
pub(super) struct Texts {
    train: Vec<TextFile>,
    validation: Vec<TextFile>,
    vocabulary: Vocabulary,
    /// The ids put after every document.
    end_of_text: Vec<u32>,
    block: usize,
}

impl Texts {
    /// The texts of the training and validation files: the vocabulary is built and each split
    /// is checked to hold one window at least.
    pub(super) fn new(train: Vec<TextFile>, validation: Vec<TextFile>, how: &Tokenizing) -> Result<Self, DataError> {
        let end_of_text = how.end_of_text.as_deref().unwrap_or_default();
        let vocabulary = match how.tokenization {
            Tokenization::Byte => Vocabulary::Byte { size: 256 },
            Tokenization::Char => {
                let from_validation = match how.vocabulary {
                    VocabularyFrom::Train => &[][..],
                    VocabularyFrom::TrainAndValidation => &validation[..],
                };
                let documents = train.iter().chain(from_validation).flat_map(|f| &f.documents);
                let chars: BTreeSet<char> = documents.flat_map(|d| d.chars()).chain(end_of_text.chars()).collect();
                Vocabulary::Char { tokens: chars.into_iter().map(String::from).collect() }
            }
            Tokenization::Gpt2 => Vocabulary::tiktoken(Encoding::Gpt2),
            Tokenization::R50kBase => Vocabulary::tiktoken(Encoding::R50kBase),
            Tokenization::Cl100kBase => Vocabulary::tiktoken(Encoding::Cl100kBase),
            Tokenization::O200kBase => Vocabulary::tiktoken(Encoding::O200kBase),
        };
        let end_of_text = match &vocabulary {
            Vocabulary::Tiktoken { encoding, .. } => encoding.encode_special(end_of_text),
            Vocabulary::Char { .. } | Vocabulary::Byte { .. } => {
                encode(Path::new("data.jsonl.text.end_of_text"), end_of_text, &vocabulary)?
            }
        };
        let texts = Self { train, validation, vocabulary, end_of_text, block: how.block };
        for (split, files) in [(WindowSplit::Train, &texts.train), (WindowSplit::Validation, &texts.validation)] {
            let counts: Vec<(&Path, usize)> = files.iter().map(|f| (f.path.as_path(), texts.count(f))).collect();
            require_windows(how.dataset, split, &counts, how.block)?;
        }
        Ok(texts)
    }

    /// The number of tokens of `file`'s stream (a tiktoken encoding encodes it to count).
    fn count(&self, file: &TextFile) -> usize {
        let documents = file.documents.par_iter().map(|d| match &self.vocabulary {
            Vocabulary::Char { .. } => d.chars().count(),
            Vocabulary::Byte { .. } => d.len(),
            Vocabulary::Tiktoken { encoding, .. } => encoding.encode(d).len(),
        });
        documents.map(|n| n + self.end_of_text.len()).sum()
    }

    /// Example counts, shape and vocabulary size.
    pub(super) fn facts(&self) -> DataFacts {
        let block = self.block;
        let windows = |files: &[TextFile], stride| files.iter().map(|f| count(self.count(f), block, stride)).sum();
        DataFacts {
            train_examples: windows(&self.train, 1),
            test_examples: windows(&self.validation, block),
            example_shape: vec![block],
            labels: LabelKind::Sequence { classes: self.vocabulary.len(), len: block },
            // Windows are sharded by example: splitting files across workers is not offered.
            train_files: 0,
            warnings: vec![],
        }
    }

    /// The texts tokenized (documents in parallel) and windowed: training windows at every
    /// token, validation windows side by side.
    pub(super) fn dataset(self) -> Result<Dataset, DataError> {
        let (block, vocabulary) = (self.block, &self.vocabulary);
        let stream = |f: &TextFile| -> Result<Tokens, DataError> {
            let documents: Vec<Vec<u32>> =
                f.documents.par_iter().map(|d| encode(&f.path, d, vocabulary)).collect::<Result<_, _>>()?;
            let mut ids = Vec::with_capacity(documents.iter().map(|d| d.len() + self.end_of_text.len()).sum());
            for document in documents {
                ids.extend(document);
                ids.extend_from_slice(&self.end_of_text);
            }
            Ok(Tokens::Owned(ids))
        };
        let tokens = |files: &[TextFile]| files.iter().map(stream).collect::<Result<Vec<_>, _>>();
        let train = Split::of(Windows::new(tokens(&self.train)?, block, 1));
        let test = match self.validation.is_empty() {
            true => None,
            false => Some(Split::of(Windows::new(tokens(&self.validation)?, block, block))),
        };
        Ok(Dataset {
            train,
            test,
            labels: LabelKind::Sequence { classes: vocabulary.len(), len: block },
            vocabulary: Some(self.vocabulary),
            classes: None,
        })
    }
}

fn read_text(path: PathBuf) -> Result<TextFile, DataError> {
    let bytes = std::fs::read(&path).map_err(|source| DataError::Read { path: path.clone(), source })?;
    match String::from_utf8(bytes) {
        Ok(text) => Ok(TextFile { path, documents: vec![text] }),
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

/// The token ids of `text` (at `path`, for errors).
fn encode(path: &Path, text: &str, vocabulary: &Vocabulary) -> Result<Vec<u32>, DataError> {
    let tokens = match vocabulary {
        Vocabulary::Byte { .. } => return Ok(text.bytes().map(u32::from).collect()),
        Vocabulary::Tiktoken { encoding, .. } => return Ok(encoding.encode(text)),
        Vocabulary::Char { tokens } => tokens,
    };
    let mut ids = Vec::with_capacity(text.len());
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
    Ok(ids)
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

    fn source(dir: &Path, config: TextConfig) -> TextSource {
        TextSource { dir: dir.to_path_buf(), config }
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
