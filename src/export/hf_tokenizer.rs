//! The tokenizer files of an exported GPT-2 folder, so `AutoTokenizer.from_pretrained(dir)`
//! encodes text to the ids the run trained on, beside the weights `GPT2LMHeadModel` loads:
//!
//! - tiktoken's GPT-2 encoding (`gpt2`, `r50k_base`: the same ranks) as `GPT2Tokenizer.
//!   save_pretrained` writes it: `vocab.json` (each token's bytes spelled with GPT-2's
//!   printable stand-ins for bytes), `merges.txt`, `tokenizer_config.json` and
//!   `special_tokens_map.json`. tiktoken keeps only ranks; the merges are recovered as
//!   `transformers` recovers them (`convert_tiktoken_to_fast`): a token of rank `r` is the
//!   merge of the two parts that byte-pair encoding with the ranks below `r` leaves of it.
//! - a Hugging Face `tokenizer.json` as it is, with a `tokenizer_config.json` naming
//!   `PreTrainedTokenizerFast`.
//!
//! `char` and `byte` vocabularies and tiktoken's other encodings have no such files; the export
//! says why (`Unwritten`).

use crate::data::{Encoding, Vocabulary};
use std::collections::HashMap;

/// The end-of-text token of GPT-2, its only special token.
const END_OF_TEXT: &str = "<|endoftext|>";

/// The tokenizer files for a run's vocabulary, or why there are none.
pub enum TokenizerFiles {
    /// Name and contents of each file.
    Written(Vec<(&'static str, Vec<u8>)>),
    /// Why no tokenizer is written (said with the export).
    Unwritten(String),
}

/// Why the tokenizer files could not be made.
#[derive(Debug, thiserror::Error)]
pub enum HfTokenizerError {
    /// A token of the encoding is not the merge of two others (the bundled ranks are not a BPE).
    #[error("token {rank} of tiktoken's {encoding} is not the merge of two tokens of lower rank")]
    NotAMerge { encoding: String, rank: u32 },
    /// A file could not be encoded.
    #[error("cannot encode {file}: {why}")]
    Encode { file: &'static str, why: String },
}

/// The files for `vocabulary`, for a model of `n_positions` positions.
pub fn files(vocabulary: &Vocabulary, n_positions: usize) -> Result<TokenizerFiles, HfTokenizerError> {
    match vocabulary {
        Vocabulary::Tiktoken { encoding: encoding @ (Encoding::Gpt2 | Encoding::R50kBase), .. } => {
            gpt2(*encoding, n_positions).map(TokenizerFiles::Written)
        }
        Vocabulary::Tiktoken { encoding: encoding @ (Encoding::Cl100kBase | Encoding::O200kBase), .. } => {
            let name = name(*encoding);
            Ok(TokenizerFiles::Unwritten(format!(
                "tiktoken's {name} is not GPT-2's tokenizer, which is what a GPT-2 folder holds; encode text for \
                 the model with tiktoken's {name}"
            )))
        }
        Vocabulary::TokenizerJson { tokenizer, .. } => {
            let json = serde_json::to_vec(tokenizer).map_err(|e| encode_error("tokenizer.json", e))?;
            let mut config = serde_json::json!({
                "tokenizer_class": "PreTrainedTokenizerFast",
                "model_max_length": n_positions,
            });
            if let Some(end) = tokenizer.default_end_of_text() {
                config["eos_token"] = end.into();
            }
            Ok(TokenizerFiles::Written(vec![
                ("tokenizer.json", json),
                ("tokenizer_config.json", pretty("tokenizer_config.json", &config)?),
            ]))
        }
        Vocabulary::Char { .. } | Vocabulary::Byte { .. } => Ok(TokenizerFiles::Unwritten(
            "a char or byte vocabulary has no transformers tokenizer; the run's vocab.json maps its ids".into(),
        )),
    }
}

/// `GPT2Tokenizer`'s files for tiktoken's GPT-2 ranks.
fn gpt2(encoding: Encoding, n_positions: usize) -> Result<Vec<(&'static str, Vec<u8>)>, HfTokenizerError> {
    let ordinary = encoding.size() - 1;
    let tokens: Vec<Vec<u8>> = (0..ordinary).map(|id| encoding.bytes(id)).collect();
    let ranks: HashMap<&[u8], u32> = tokens.iter().zip(0..).map(|(t, r)| (t.as_slice(), r)).collect();
    let chars = byte_chars();
    let spell = |bytes: &[u8]| bytes.iter().map(|&b| chars[usize::from(b)]).collect::<String>();
    let mut vocab = serde_json::Map::new();
    let mut merges = String::from("#version: 0.2\n");
    for (token, rank) in tokens.iter().zip(0..) {
        vocab.insert(spell(token), rank.into());
        if token.len() > 1 {
            let [left, right] = merge_of(token, rank, &ranks)
                .ok_or_else(|| HfTokenizerError::NotAMerge { encoding: name(encoding), rank })?;
            merges += &format!("{} {}\n", spell(left), spell(right));
        }
    }
    vocab.insert(END_OF_TEXT.into(), ordinary.into());
    let special = serde_json::json!({ "bos_token": END_OF_TEXT, "eos_token": END_OF_TEXT, "unk_token": END_OF_TEXT });
    let mut config = special.clone();
    config["tokenizer_class"] = "GPT2Tokenizer".into();
    config["model_max_length"] = n_positions.into();
    config["add_prefix_space"] = false.into();
    let vocab = serde_json::to_vec(&vocab).map_err(|e| encode_error("vocab.json", e))?;
    Ok(vec![
        ("vocab.json", vocab),
        ("merges.txt", merges.into_bytes()),
        ("tokenizer_config.json", pretty("tokenizer_config.json", &config)?),
        ("special_tokens_map.json", pretty("special_tokens_map.json", &special)?),
    ])
}

/// The two parts byte-pair encoding leaves of `token` when only merges of rank below `rank`
/// may apply (always the lowest-ranked adjacent pair first, as tiktoken encodes); `None` when
/// that is not two parts.
fn merge_of<'t>(token: &'t [u8], rank: u32, ranks: &HashMap<&[u8], u32>) -> Option<[&'t [u8]; 2]> {
    // Part boundaries: part i is token[bounds[i]..bounds[i + 1]].
    let mut bounds: Vec<usize> = (0..=token.len()).collect();
    loop {
        let lowest = (0..bounds.len().saturating_sub(2))
            .filter_map(|i| ranks.get(&token[bounds[i]..bounds[i + 2]]).map(|&r| (r, i)))
            .filter(|&(r, _)| r < rank)
            .min();
        match lowest {
            Some((_, i)) => {
                bounds.remove(i + 1);
            }
            None => break,
        }
    }
    match bounds.as_slice() {
        &[0, middle, end] => Some([&token[..middle], &token[middle..end]]),
        _ => None,
    }
}

/// GPT-2's printable stand-in for each byte (`bytes_to_unicode` in OpenAI's `encoder.py` and in
/// `transformers`): printable Latin-1 bytes stand for themselves, the others, in order, for
/// U+0100 onwards.
fn byte_chars() -> [char; 256] {
    let printable = |b: u32| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    let mut next = 0x100;
    let mut table = ['\0'; 256];
    for (b, slot) in (0u32..).zip(table.iter_mut()) {
        let code = if printable(b) {
            b
        } else {
            next += 1;
            next - 1
        };
        *slot = char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER);
    }
    table
}

/// The encoding's name as a spec spells it (`cl100k_base`).
fn name(encoding: Encoding) -> String {
    serde_json::to_value(encoding).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

fn pretty(file: &'static str, value: &serde_json::Value) -> Result<Vec<u8>, HfTokenizerError> {
    serde_json::to_vec_pretty(value).map_err(|e| encode_error(file, e))
}

fn encode_error(file: &'static str, e: serde_json::Error) -> HfTokenizerError {
    HfTokenizerError::Encode { file, why: e.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_spelled_as_gpt2_spells_them() {
        let chars = byte_chars();
        assert_eq!(chars[usize::from(b' ')], 'Ġ');
        assert_eq!(chars[usize::from(b'\n')], 'Ċ');
        assert_eq!(chars[usize::from(b'A')], 'A');
        assert_eq!(chars[0], '\u{100}');
        let distinct: std::collections::HashSet<char> = chars.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
    }

    #[test]
    fn gpt2_files_hold_every_token_and_the_first_merges() {
        let files = gpt2(Encoding::Gpt2, 1024).unwrap();
        let names: Vec<&str> = files.iter().map(|f| f.0).collect();
        assert_eq!(names, ["vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"]);
        let vocab: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&files[0].1).unwrap();
        assert_eq!(vocab.len(), 50_257);
        assert_eq!(vocab["Ġthe"], 262);
        assert_eq!(vocab[END_OF_TEXT], 50_256);
        let merges = std::str::from_utf8(&files[1].1).unwrap();
        // GPT-2's published merges.txt begins so; 50,000 merges, one per token past the bytes.
        assert!(merges.starts_with("#version: 0.2\nĠ t\nĠ a\nh e\ni n\nr e\no n\n"), "{}", &merges[..60]);
        assert_eq!(merges.lines().count(), 1 + 50_000);
    }
}
