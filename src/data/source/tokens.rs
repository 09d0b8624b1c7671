//! The `tokens` source: flat files of little-endian `u16` or `u32` token ids, as the common GPT
//! training scripts write them (`np.array(ids, dtype=np.uint16).tofile("train.bin")`),
//! memory-mapped so corpora larger than RAM work, cut into [`Windows`] of `block_size + 1`.
//!
//! Every id is checked against the vocabulary once, at load: an id out of range would
//! otherwise index past the model's output row. The scan reads the file a fixed chunk at a
//! time ([`each_chunk`]) rather than through the mapping, so its pages stay in the page cache
//! and not in the run's resident memory: peak RSS does not grow with the corpus. A file whose
//! length is not a whole number of tokens is an error naming it.

use super::{DataSource, RawValues, missing_in, require};
use crate::data::error::{DataError, Position};
use crate::data::examples::{LabelKind, Split};
use crate::data::windows::{Tokens, WindowSplit, Windows, count, require_windows};
use crate::data::{DataFacts, DataWarning, Dataset};
use memmap2::Mmap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::num::{NonZeroU32, NonZeroUsize};
use std::path::{Path, PathBuf};

/// `[data.tokens]`: token id files for a language model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TokensConfig {
    /// Training token files, relative to `data.dir` (or absolute). Required.
    /// Example: `train = ["train.bin"]`.
    pub train: Vec<String>,
    /// Validation token files, evaluated as the test split. Default: none.
    /// Example: `validation = ["val.bin"]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub validation: Vec<String>,
    /// The stored integer type, little-endian. Default: `u16`. Example: `dtype = "u32"`.
    #[serde(default)]
    pub dtype: TokenDtype,
    /// Token ids (the model's output classes); every id must be below it. Default: the
    /// largest id in the files plus one. Example: `vocab_size = 50304`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab_size: Option<NonZeroU32>,
    /// Tokens the model sees per example; each example is a window of `block_size + 1` tokens
    /// whose last `block_size` are the labels. Required. Example: `block_size = 256`.
    pub block_size: NonZeroUsize,
}

/// `data.tokens.dtype`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TokenDtype {
    /// Two bytes per id (vocabularies up to 65,536, GPT-2's included).
    #[default]
    U16,
    /// Four bytes per id.
    U32,
}

impl TokenDtype {
    /// Bytes per id.
    pub(crate) fn bytes(self) -> usize {
        match self {
            TokenDtype::U16 => 2,
            TokenDtype::U32 => 4,
        }
    }

    /// The narrowest width that holds every id of a vocabulary of `size` ids.
    pub(crate) fn holding(size: u32) -> Self {
        if size <= 1 << 16 { TokenDtype::U16 } else { TokenDtype::U32 }
    }
}

/// `data.dataset = "tokens"`: `[data.tokens]`'s files in `dir`.
#[derive(Debug, Clone, PartialEq)]
pub struct TokensSource {
    pub dir: PathBuf,
    pub config: TokensConfig,
}

impl DataSource for TokensSource {
    fn name(&self) -> &'static str {
        "tokens"
    }

    fn dir(&self) -> Option<&Path> {
        Some(&self.dir)
    }

    fn missing_files(&self) -> Vec<String> {
        missing_in(&self.dir, self.config.train.iter().chain(&self.config.validation))
    }

    /// Example counts, shape and vocabulary (the files are mapped and, without `vocab_size`,
    /// scanned for their largest id).
    fn facts(&self) -> Result<DataFacts, DataError> {
        require(self.name(), &self.dir, self.missing_files())?;
        let (dir, config) = (&self.dir, &self.config);
        let (train, validation, vocab) = mapped(dir, config)?;
        let block = config.block_size.get();
        let windows = |files: &Files, stride| files.iter().map(|(_, t)| count(t.len(), block, stride)).sum();
        Ok(DataFacts {
            train_examples: windows(&train, 1),
            test_examples: windows(&validation, block),
            example_shape: vec![block],
            labels: LabelKind::Sequence { classes: vocab, len: block },
            // Windows are sharded by example: splitting files across workers is not offered.
            train_files: 0,
            warnings: packed_u16(config, &train, vocab).into_iter().collect(),
        })
    }

    /// Maps and checks the files.
    fn load(&self) -> Result<Dataset, DataError> {
        require(self.name(), &self.dir, self.missing_files())?;
        let (dir, config) = (&self.dir, &self.config);
        let (train, validation, vocab) = mapped(dir, config)?;
        let block = config.block_size.get();
        let strip = |files: Files| files.into_iter().map(|(_, t)| t).collect::<Vec<_>>();
        let test = (!validation.is_empty()).then(|| Split::of(Windows::new(strip(validation), block, block)));
        Ok(Dataset {
            train: Split::of(Windows::new(strip(train), block, 1)),
            test,
            labels: LabelKind::Sequence { classes: vocab, len: block },
            vocabulary: None,
            classes: None,
        })
    }

    fn raw_values(&self) -> RawValues {
        RawValues::Tokens
    }
}

fn map(path: &Path, dtype: TokenDtype) -> Result<Tokens, DataError> {
    let io = |source| DataError::Read { path: path.to_path_buf(), source };
    let file = std::fs::File::open(path).map_err(io)?;
    // SAFETY: the file is only read; like every reader of a mapped file, trainrun assumes no
    // other process truncates it during the run (the data files of a run are not rewritten).
    let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
    let whole = mmap.len() / dtype.bytes() * dtype.bytes();
    if whole != mmap.len() {
        return Err(DataError::Malformed {
            path: path.to_path_buf(),
            at: Position::Byte(whole as u64),
            problem: format!(
                "{} bytes is not a whole number of {dtype:?} tokens ({} bytes each); is data.tokens.dtype right?",
                mmap.len(),
                dtype.bytes()
            ),
        });
    }
    Ok(match dtype {
        TokenDtype::U16 => Tokens::U16(mmap),
        TokenDtype::U32 => Tokens::U32(mmap),
    })
}

type Files = Vec<(PathBuf, Tokens)>;

fn map_all(dir: &Path, names: &[String], dtype: TokenDtype) -> Result<Files, DataError> {
    names.iter().map(|n| map(&dir.join(n), dtype).map(|t| (dir.join(n), t))).collect()
}

/// Bytes read at a time by a scan of a token file: what a scan adds to resident memory.
const SCAN_CHUNK_BYTES: usize = 1 << 20;

/// Calls `each` with the ids of the token file `path`, in order, a chunk at a time, and the
/// index of each chunk's first id. The file is read with `read` into one buffer, not through
/// its mapping: touching every mapped page would make the whole file resident in this process
/// (a 10 GB corpus, 10 GB of RSS) where reading leaves it in the shared page cache.
fn each_chunk(
    path: &Path,
    dtype: TokenDtype,
    mut each: impl FnMut(usize, &[u32]) -> Result<(), DataError>,
) -> Result<(), DataError> {
    use std::io::Read as _;
    let io = |source| DataError::Read { path: path.to_path_buf(), source };
    let mut file = std::fs::File::open(path).map_err(io)?;
    let width = dtype.bytes();
    let (mut bytes, mut ids) = (vec![0u8; SCAN_CHUNK_BYTES], Vec::with_capacity(SCAN_CHUNK_BYTES / width));
    let mut first = 0;
    loop {
        let mut filled = 0;
        while filled < bytes.len() {
            match file.read(&mut bytes[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io(e)),
            }
        }
        ids.clear();
        // `map` refused a file that is not a whole number of ids; a tail cut since is dropped.
        let whole = &bytes[..filled / width * width];
        match dtype {
            TokenDtype::U16 => ids.extend(whole.chunks_exact(2).map(|b| u32::from(u16::from_le_bytes([b[0], b[1]])))),
            TokenDtype::U32 => ids.extend(whole.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
        }
        if ids.is_empty() {
            return Ok(());
        }
        each(first, &ids)?;
        first += ids.len();
        if filled < bytes.len() {
            return Ok(());
        }
    }
}

/// The vocabulary size: the configured one, every id checked against it, or the largest id
/// plus one.
fn vocab_size(config: &TokensConfig, files: &[&(PathBuf, Tokens)]) -> Result<u32, DataError> {
    match config.vocab_size {
        None => {
            let mut max = 0;
            for (path, _) in files {
                each_chunk(path, config.dtype, |_, ids| {
                    max = ids.iter().copied().fold(max, u32::max);
                    Ok(())
                })?;
            }
            Ok(max.saturating_add(1))
        }
        Some(size) => {
            for (path, _) in files {
                each_chunk(path, config.dtype, |first, ids| match ids.iter().position(|&id| id >= size.get()) {
                    None => Ok(()),
                    Some(i) => Err(DataError::Malformed {
                        path: path.clone(),
                        at: Position::Byte(((first + i) * config.dtype.bytes()) as u64),
                        problem: format!(
                            "token id {} is not below data.tokens.vocab_size = {size}; raise vocab_size or check dtype",
                            ids[i]
                        ),
                    }),
                })?;
            }
            Ok(size.get())
        }
    }
}

/// A warning when u32 ids look like pairs of u16 ids (a u16 file read with `dtype = "u32"`):
/// a vocabulary larger than the tokens, whose ids' high halves vary as much as their low
/// halves (each high half is the next token). Real u32 ids past 65,535 have few high halves.
/// Not checked with an explicit `vocab_size`, which says the ids are as meant.
fn packed_u16(config: &TokensConfig, train: &Files, vocab: u32) -> Option<DataWarning> {
    let tokens: usize = train.iter().map(|(_, t)| t.len()).sum();
    if config.dtype != TokenDtype::U32 || config.vocab_size.is_some() || vocab <= 65_536 || vocab as usize <= tokens {
        return None;
    }
    let (mut high, mut low) = (vec![false; 65_536], vec![false; 65_536]);
    for (path, _) in train {
        let seen = each_chunk(path, config.dtype, |_, ids| {
            for &id in ids {
                (high[(id >> 16) as usize], low[(id & 0xffff) as usize]) = (true, true);
            }
            Ok(())
        });
        // A file that cannot be read now gives no warning; reading it at load says why.
        seen.ok()?;
    }
    let distinct = |seen: &[bool]| seen.iter().filter(|&&s| s).count();
    let (high, low) = (distinct(&high), distinct(&low));
    (high >= 3 && 2 * high >= low).then(|| DataWarning {
        key: "data.tokens.dtype".into(),
        message: format!(
            "read as u32, the training files make a vocabulary of {vocab} ids for {tokens} tokens, and the ids \
             look like two u16 ids each ({high} distinct high halves, {low} distinct low halves): the output \
             layer gets {vocab} classes"
        ),
        help: "this looks like a u16 file: set data.tokens.dtype = \"u16\" (the default); if the ids are \
               right, set data.tokens.vocab_size"
            .into(),
    })
}

fn no_training_files(config: &TokensConfig) -> Result<(), DataError> {
    if config.train.is_empty() {
        return Err(DataError::MissingSection {
            dataset: "tokens",
            section: "at least one file in data.tokens.train",
            example: "[data.tokens] train = [\"train.bin\"], validation = [\"val.bin\"], block_size = 256",
        });
    }
    Ok(())
}

fn mapped(dir: &Path, config: &TokensConfig) -> Result<(Files, Files, u32), DataError> {
    no_training_files(config)?;
    let train = map_all(dir, &config.train, config.dtype)?;
    let validation = map_all(dir, &config.validation, config.dtype)?;
    let vocab = vocab_size(config, &train.iter().chain(&validation).collect::<Vec<_>>())?;
    for (split, files) in [(WindowSplit::Train, &train), (WindowSplit::Validation, &validation)] {
        let counts: Vec<(&Path, usize)> = files.iter().map(|(p, t)| (p.as_path(), t.len())).collect();
        require_windows("tokens", split, &counts, config.block_size.get())?;
    }
    Ok((train, validation, vocab))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(dir: &Path, config: TokensConfig) -> TokensSource {
        TokensSource { dir: dir.to_path_buf(), config }
    }

    fn config(dtype: TokenDtype, vocab_size: Option<u32>) -> TokensConfig {
        TokensConfig {
            train: vec!["train.bin".into()],
            validation: vec!["val.bin".into()],
            dtype,
            vocab_size: vocab_size.and_then(NonZeroU32::new),
            block_size: NonZeroUsize::new(2).unwrap(),
        }
    }

    #[test]
    fn u16_and_u32_files_read_little_endian() {
        let dir = tempfile::tempdir().unwrap();
        let ids: [u32; 5] = [1, 300, 2, 65_535, 7];
        let u16s: Vec<u8> = ids.iter().flat_map(|&i| (i as u16).to_le_bytes()).collect();
        let u32s: Vec<u8> = ids.iter().flat_map(|&i| (i + 70_000).to_le_bytes()).collect();
        for (dtype, bytes, offset) in [(TokenDtype::U16, &u16s, 0), (TokenDtype::U32, &u32s, 70_000)] {
            std::fs::write(dir.path().join("train.bin"), bytes).unwrap();
            std::fs::write(dir.path().join("val.bin"), &bytes[..3 * dtype.bytes()]).unwrap();
            let data = source(dir.path(), config(dtype, None)).load().unwrap();
            assert_eq!(data.labels, LabelKind::Sequence { classes: 65_536 + offset, len: 2 });
            assert_eq!((data.train.len(), data.test.as_ref().map(Split::len)), (3, Some(1)));
            let b = data.train.read(1..2).unwrap();
            assert_eq!(b.x, [(300 + offset) as f32, (2 + offset) as f32]);
            assert_eq!(b.y, [2 + offset, 65_535 + offset]);
            assert_eq!(data.bytes_held(), 0, "mapped, not copied");
            assert_eq!(source(dir.path(), config(dtype, None)).facts().unwrap(), data.facts(0));
        }
    }

    #[test]
    fn bad_files_are_located() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("train.bin"), [1u8, 0, 9, 0, 3]).unwrap();
        std::fs::write(dir.path().join("val.bin"), [1u8, 0]).unwrap();
        let err = source(dir.path(), config(TokenDtype::U16, None)).load().unwrap_err().to_string();
        assert!(err.contains("train.bin at byte 4: 5 bytes is not a whole number of U16 tokens"), "{err}");
        std::fs::write(dir.path().join("train.bin"), [1u8, 0, 9, 0]).unwrap();
        let err = source(dir.path(), config(TokenDtype::U16, Some(5))).load().unwrap_err().to_string();
        assert!(err.contains("train.bin at byte 2: token id 9 is not below data.tokens.vocab_size = 5"), "{err}");
    }
}
