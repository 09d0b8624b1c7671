//! Token streams cut into windows of `block_size + 1` tokens: the [`Examples`] behind the
//! `text` and `tokens` sources. Example `i` is a window's first `block_size` tokens as the
//! features (token ids as `f32`, exact below 2²⁴) and its last `block_size` as the labels, the
//! next token at every position.
//!
//! Training windows start at every token (stride 1), so the pipeline's shuffle makes each
//! data-epoch visit every window once in a random order that is a pure function of the seed and
//! the cursor, computed per position by a seeded bijection rather than listed (a list would
//! cost 8 bytes per token): batches are random windows, deterministic from the seed and step, sharded like any
//! other examples and resumed exactly. Validation windows do not overlap (stride `block_size`),
//! so evaluation predicts almost every token once. Windows never straddle two files.

use super::error::DataError;
use super::examples::{Examples, WholeShuffle};
use super::pipeline::Batch;
use memmap2::Mmap;

/// The tokens of one file.
#[derive(Debug)]
pub enum Tokens {
    /// Decoded text.
    Owned(Vec<u32>),
    /// A memory-mapped file of little-endian `u16`.
    U16(Mmap),
    /// A memory-mapped file of little-endian `u32`.
    U32(Mmap),
}

impl Tokens {
    /// Number of tokens.
    pub fn len(&self) -> usize {
        match self {
            Tokens::Owned(t) => t.len(),
            Tokens::U16(m) => m.len() / 2,
            Tokens::U32(m) => m.len() / 4,
        }
    }

    /// True when there are no tokens.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Token `i` (below [`Tokens::len`]).
    pub fn get(&self, i: usize) -> u32 {
        match self {
            Tokens::Owned(t) => t[i],
            Tokens::U16(m) => u32::from(u16::from_le_bytes([m[2 * i], m[2 * i + 1]])),
            Tokens::U32(m) => u32::from_le_bytes([m[4 * i], m[4 * i + 1], m[4 * i + 2], m[4 * i + 3]]),
        }
    }

    /// Heap bytes held (a mapped file counts nothing).
    fn bytes_held(&self) -> usize {
        match self {
            Tokens::Owned(t) => t.len() * 4,
            Tokens::U16(_) | Tokens::U32(_) => 0,
        }
    }
}

/// Windows over one or more token streams.
#[derive(Debug)]
pub struct Windows {
    files: Vec<Tokens>,
    /// `starts[f]` is the index of file `f`'s first window; the last entry is the total.
    starts: Vec<usize>,
    block: usize,
    stride: usize,
    shape: [usize; 1],
}

impl Windows {
    /// Windows of `block + 1` tokens every `stride` tokens over each of `files` (a file shorter
    /// than one window gives none).
    pub fn new(files: Vec<Tokens>, block: usize, stride: usize) -> Self {
        let mut starts = vec![0];
        for f in &files {
            let windows = count(f.len(), block, stride);
            starts.push(starts.last().copied().unwrap_or(0) + windows);
        }
        Self { files, starts, block, stride: stride.max(1), shape: [block] }
    }
}

/// Windows of `block + 1` tokens every `stride` tokens in `tokens` tokens.
pub fn count(tokens: usize, block: usize, stride: usize) -> usize {
    match tokens.checked_sub(block + 1) {
        Some(spare) => spare / stride.max(1) + 1,
        None => 0,
    }
}

/// Which split of a language model's files a [`require_windows`] check is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowSplit {
    /// `data.<source>.train`.
    Train,
    /// `data.<source>.validation`.
    Validation,
}

/// `Ok` when the files of `split` of the `source` (`text`, `tokens`), each given with its
/// token count, hold one window of `block + 1` tokens at least (a split without files has
/// nothing to check); else the error naming every file, its count and the block size.
/// Without it a short training text said only "no examples", and a short validation text
/// evaluated nothing, silently.
pub fn require_windows(
    source: &'static str,
    split: WindowSplit,
    files: &[(&std::path::Path, usize)],
    block: usize,
) -> Result<(), DataError> {
    if files.is_empty() || files.iter().any(|&(_, tokens)| count(tokens, block, 1) > 0) {
        return Ok(());
    }
    let files = files.iter().map(|&(path, tokens)| (path.to_path_buf(), tokens)).collect();
    Err(DataError::TooFewTokens { dataset: source, split, files, block })
}

impl Examples for Windows {
    fn len(&self) -> usize {
        self.starts.last().copied().unwrap_or(0)
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn append(&self, i: usize, batch: &mut Batch) -> Result<(), DataError> {
        // The file whose windows include `i`: the last start at or before it.
        let file = self.starts.partition_point(|&s| s <= i).saturating_sub(1);
        let Some(tokens) = self.files.get(file) else { return Ok(()) };
        let start = (i - self.starts[file]) * self.stride;
        batch.x.extend((start..start + self.block).map(|p| tokens.get(p) as f32));
        batch.y.extend((start + 1..=start + self.block).map(|p| tokens.get(p)));
        Ok(())
    }

    fn bytes_held(&self) -> usize {
        self.files.iter().map(Tokens::bytes_held).sum()
    }

    fn rows_per_example(&self) -> usize {
        self.block
    }

    /// One window per token: a listed order would outweigh the tokens.
    fn whole_shuffle(&self) -> WholeShuffle {
        WholeShuffle::Bijection
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Split;

    #[test]
    fn windows_never_straddle_files_and_labels_are_the_next_tokens() {
        let a = Tokens::Owned((0..6).collect());
        let b = Tokens::Owned((100..104).collect());
        let tiny = Tokens::Owned(vec![7, 8]);
        let split = Split::of(Windows::new(vec![a, tiny, b], 2, 1));
        // 6 tokens give 4 windows of 3, 2 tokens none, 4 tokens 2.
        assert_eq!(split.len(), 6);
        assert_eq!(split.rows_per_example(), 2);
        let batch = split.read(0..6).unwrap();
        assert_eq!(batch.x, [0., 1., 1., 2., 2., 3., 3., 4., 100., 101., 101., 102.]);
        assert_eq!(batch.y, [1, 2, 2, 3, 3, 4, 4, 5, 101, 102, 102, 103]);
        assert_eq!(batch.global_rows(), 12);
    }

    #[test]
    fn a_stride_of_the_block_gives_disjoint_windows() {
        let split = Split::of(Windows::new(vec![Tokens::Owned((0..10).collect())], 3, 3));
        // Windows of 4 tokens start at 0, 3 and 6 (6 + 4 = 10 tokens).
        assert_eq!(split.len(), 3);
        assert_eq!(split.read(2..3).unwrap().x, [6., 7., 8.]);
        assert_eq!(split.read(2..3).unwrap().y, [7, 8, 9]);
        assert_eq!(count(10, 3, 3), 3);
        assert_eq!(count(3, 3, 1), 0);
    }

    #[test]
    fn a_split_shorter_than_one_window_names_its_files_and_the_block() {
        let (a, b) = (std::path::Path::new("a.txt"), std::path::Path::new("b.txt"));
        assert!(require_windows("text", WindowSplit::Validation, &[], 8).is_ok());
        assert!(require_windows("text", WindowSplit::Validation, &[(a, 3), (b, 9)], 8).is_ok());
        let err = require_windows("text", WindowSplit::Validation, &[(a, 3), (b, 8)], 8).unwrap_err().to_string();
        assert_eq!(
            err,
            "a.txt holds 3 tokens, b.txt 8: the validation files need one window of data.text.block_size + 1 \
             = 9 tokens at least, so nothing would be evaluated; give data.text.validation more text, \
             lower data.text.block_size to 7 or less, or drop data.text.validation"
        );
        let err = require_windows("tokens", WindowSplit::Train, &[(a, 0)], 8).unwrap_err().to_string();
        assert_eq!(
            err,
            "a.txt holds 0 tokens: the training files need one window of data.tokens.block_size + 1 = 9 \
             tokens at least, so there is nothing to train on; give data.tokens.train more tokens"
        );
    }
}
