//! tiktoken's byte-level BPE encodings, through `tiktoken-rs`, which bundles the rank files in
//! the crate, so nothing is downloaded: `gpt2` (the same ranks, pattern and `<|endoftext|>` as
//! `r50k_base`), `r50k_base`, `cl100k_base` and `o200k_base`.
//!
//! Text is encoded as tiktoken's `encode_ordinary`: a special token's text inside a document
//! is ordinary text, so a corpus cannot forge an end of text; only the end-of-text that the
//! source puts between documents is encoded as the special token (`encode_special`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tiktoken_rs::CoreBPE;

/// A tiktoken encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// GPT-2's encoding (`r50k_base`'s ranks): 50,257 tokens.
    Gpt2,
    /// GPT-3's `r50k_base`: 50,257 tokens.
    R50kBase,
    /// GPT-3.5/4's `cl100k_base`: 100,277 token ids.
    Cl100kBase,
    /// GPT-4o's `o200k_base`: 200,019 token ids.
    O200kBase,
}

impl Encoding {
    /// The encoder, built once per process from the bundled ranks.
    fn bpe(self) -> &'static CoreBPE {
        match self {
            Encoding::Gpt2 | Encoding::R50kBase => tiktoken_rs::r50k_base_singleton(),
            Encoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
            Encoding::O200kBase => tiktoken_rs::o200k_base_singleton(),
        }
    }

    /// Token ids: one past the largest id, special tokens included (tiktoken's `n_vocab`).
    pub fn size(self) -> u32 {
        match self {
            Encoding::Gpt2 | Encoding::R50kBase => 50_257,
            Encoding::Cl100kBase => 100_277,
            Encoding::O200kBase => 200_019,
        }
    }

    /// The end-of-text special token's text.
    pub fn end_of_text(self) -> &'static str {
        tiktoken_rs::ENDOFTEXT
    }

    /// The ids of `text`, special tokens' texts read as ordinary text.
    pub fn encode(self, text: &str) -> Vec<u32> {
        self.bpe().encode_ordinary(text)
    }

    /// The ids of `text` with its special tokens' texts read as the special tokens.
    pub fn encode_special(self, text: &str) -> Vec<u32> {
        self.bpe().encode_with_special_tokens(text)
    }

    /// The bytes of token `id` (empty for an id the encoding lacks); a token may hold part of a
    /// UTF-8 character.
    pub fn bytes(self, id: u32) -> Vec<u8> {
        self.bpe().decode_bytes(&[id]).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_one_past_the_largest_id() {
        for e in [Encoding::Gpt2, Encoding::R50kBase, Encoding::Cl100kBase, Encoding::O200kBase] {
            assert!(!e.bytes(e.size() - 1).is_empty(), "{e:?}");
            assert!(e.bytes(e.size()).is_empty(), "{e:?}");
        }
    }

    #[test]
    fn the_end_of_text_is_special_only_when_asked() {
        let e = Encoding::Gpt2;
        assert_eq!(e.encode_special("<|endoftext|>"), [50256]);
        assert!(e.encode("<|endoftext|>").len() > 1);
        assert_eq!(e.encode("Hello world"), [15496, 995]);
    }
}
