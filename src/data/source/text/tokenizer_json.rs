//! A Hugging Face `tokenizer.json` (`tokenization = { tokenizer_json = "tokenizer.json" }`),
//! through Hugging Face's own `tokenizers` crate, so its ids are Python `tokenizers`' ids: BPE,
//! WordPiece or Unigram with the file's normalizer, pre-tokenizer, decoder and added tokens.
//!
//! Documents are encoded as `encode(text, add_special_tokens=False)`: the post-processor's
//! template (BERT's `[CLS] … [SEP]`) is not applied, since documents are joined by the source's
//! end-of-text text instead. An added special token's text inside a document is that token, as
//! in Python (unlike a tiktoken encoding, which reads it as ordinary text).
//!
//! The whole file is kept with the vocabulary and written into the run folder's `vocab.json`,
//! so `trainrun sample` decodes with the very tokenizer the run trained with, even if the file
//! changes later. Its SHA-256 names it in the token cache's keys.

use crate::data::error::DataError;
use serde::{Serialize, Serializer};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokenizers::Tokenizer;

/// The special tokens taken as a tokenizer's end of text when none is configured, in order of
/// preference: GPT-2's, Llama 3's, T5/Llama 2/RoBERTa's, Gemma's, BERT's.
const END_OF_TEXT: [&str; 5] = ["<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "[SEP]"];

/// A loaded `tokenizer.json`.
#[derive(Clone)]
pub struct TokenizerJson {
    /// Where it was read from (for errors).
    path: PathBuf,
    tokenizer: Arc<Tokenizer>,
    /// SHA-256 of the file's bytes, hex.
    sha256: String,
    /// One past the largest id, added tokens included.
    size: u32,
}

impl std::fmt::Debug for TokenizerJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TokenizerJson({}, sha256 {}, {} ids)", self.path.display(), self.sha256, self.size)
    }
}

/// Two tokenizers are the same when their files' bytes are.
impl PartialEq for TokenizerJson {
    fn eq(&self, other: &Self) -> bool {
        self.sha256 == other.sha256
    }
}

impl Eq for TokenizerJson {}

/// Written as the tokenizer's own JSON, so `vocab.json` holds the whole tokenizer.
impl Serialize for TokenizerJson {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.tokenizer.serialize(s)
    }
}

impl TokenizerJson {
    /// Reads and parses the file at `path`; an invalid one is an error naming it and what is wrong.
    pub fn open(path: &Path) -> Result<Self, DataError> {
        let bytes = std::fs::read(path).map_err(|source| DataError::Read { path: path.to_path_buf(), source })?;
        Self::from_bytes(path, &bytes)
    }

    /// Parses `bytes`, the contents of `path` (for errors, and as it is named).
    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Self, DataError> {
        let bad = |what: String| DataError::Unsupported {
            path: path.to_path_buf(),
            what: format!("not a tokenizer.json the Hugging Face `tokenizers` library can read: {what}"),
        };
        let tokenizer = Tokenizer::from_bytes(bytes).map_err(|e| bad(e.to_string()))?;
        let largest = tokenizer.get_vocab(true).into_values().max();
        let size =
            largest.map(|id| id.saturating_add(1)).filter(|&n| n > 0).ok_or_else(|| bad("it has no tokens".into()))?;
        let sha256 = Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect();
        Ok(Self { path: path.to_path_buf(), tokenizer: Arc::new(tokenizer), sha256, size })
    }

    /// Token ids: one past the largest id, added tokens included.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// SHA-256 of the file, hex.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// The file it was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The ids of `text` (`document`, for errors), added tokens' texts read as those tokens.
    pub fn encode(&self, document: &Path, text: &str) -> Result<Vec<u32>, DataError> {
        match self.tokenizer.encode_fast(text, false) {
            Ok(encoding) => Ok(encoding.get_ids().to_vec()),
            Err(e) => Err(DataError::Unsupported {
                path: document.to_path_buf(),
                what: format!("the tokenizer {} cannot encode it: {e}", self.path.display()),
            }),
        }
    }

    /// The special token put after every document when none is configured: the first of
    /// [`END_OF_TEXT`] the tokenizer has as a special token; `None` when it has none of them.
    pub fn default_end_of_text(&self) -> Option<&'static str> {
        let specials: Vec<String> =
            self.tokenizer.get_added_tokens_decoder().into_values().filter(|t| t.special).map(|t| t.content).collect();
        END_OF_TEXT.into_iter().find(|candidate| specials.iter().any(|s| s == candidate))
    }

    /// The special tokens' texts, sorted (for an error that asks for one).
    pub fn special_tokens(&self) -> Vec<String> {
        let mut specials: Vec<String> =
            self.tokenizer.get_added_tokens_decoder().into_values().filter(|t| t.special).map(|t| t.content).collect();
        specials.sort();
        specials
    }

    /// The text of `id` alone (the token's own string, `##`, `Ġ` or `▁` marks and all; empty
    /// for an id the tokenizer lacks): what `trainrun tokenize --text` shows as each piece.
    pub fn piece(&self, id: u32) -> String {
        self.tokenizer.id_to_token(id).unwrap_or_default()
    }

    /// A decoder fed one id at a time (`trainrun sample`): each step gives the text those ids
    /// add, once it is whole (a byte-level token may hold part of a character).
    pub fn decoder(&self) -> TokenizerDecoder<'_> {
        TokenizerDecoder { tokenizer: &self.tokenizer, ids: vec![], shown: 0 }
    }
}

/// Decodes a growing sequence of ids and gives the text each new id adds.
pub struct TokenizerDecoder<'a> {
    tokenizer: &'a Tokenizer,
    ids: Vec<u32>,
    /// Bytes of the decoded text already given.
    shown: usize,
}

impl TokenizerDecoder<'_> {
    /// The text `id` adds (empty while it ends inside a character). The whole sequence is
    /// decoded again, since a token's text depends on its neighbours (`##` pieces, a leading
    /// `▁`), and only what follows the text already given is returned.
    pub fn step(&mut self, id: u32) -> String {
        self.ids.push(id);
        let Ok(text) = self.tokenizer.decode(&self.ids, false) else { return String::new() };
        if text.ends_with('\u{fffd}') || text.len() <= self.shown || !text.is_char_boundary(self.shown) {
            return String::new();
        }
        let added = text[self.shown..].to_string();
        self.shown = text.len();
        added
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A word-level tokenizer small enough to write inline, with an end-of-text token.
    const WORDS: &str = r#"{
      "version": "1.0", "truncation": null, "padding": null,
      "added_tokens": [{"id": 3, "content": "</s>", "single_word": false, "lstrip": false,
                        "rstrip": false, "normalized": false, "special": true}],
      "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
      "decoder": null,
      "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "hello": 1, "world": 2, "</s>": 3},
                "unk_token": "[UNK]"}
    }"#;

    #[test]
    fn ids_size_and_end_of_text_come_from_the_file() {
        let t = TokenizerJson::from_bytes(Path::new("t.json"), WORDS.as_bytes()).unwrap();
        assert_eq!(t.size(), 4);
        assert_eq!(t.encode(Path::new("doc"), "hello world</s>hi").unwrap(), [1, 2, 3, 0]);
        assert_eq!(t.default_end_of_text(), Some("</s>"));
        assert_eq!((t.piece(2), t.piece(9)), ("world".to_string(), String::new()));
        assert_eq!(t.sha256().len(), 64);
    }

    #[test]
    fn an_invalid_file_is_named_with_what_is_wrong() {
        let err =
            TokenizerJson::from_bytes(Path::new("dir/tokenizer.json"), b"{\"model\": 3}").unwrap_err().to_string();
        assert!(
            err.starts_with(
                "dir/tokenizer.json: not a tokenizer.json the Hugging Face `tokenizers` library can read: "
            ),
            "{err}"
        );
    }
}
