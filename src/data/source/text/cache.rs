//! The token cache: a file's token ids under a subword tokenizer (tiktoken or a
//! `tokenizer.json`), tokenized once and written into `<data.dir>/.trainrun-tokens/` (or
//! `TRAINRUN_TOKEN_CACHE`, [`DataDirs::token_cache`](crate::data::DataDirs::token_cache)), then
//! memory-mapped by every later run, `check` and worker on the host.
//!
//! A cache file is named by a SHA-256 of what its ids depend on ([`CacheKey`]: how the source
//! reads documents, the tokenizer's identity, the end-of-text ids, the width the ids are
//! stored at, and the file's canonical path, size and modification time) and repeats that digest
//! in its header, with the format's version, the width, the token count and a CRC-32C of the
//! ids. A file whose header, version, digest, length or checksum disagrees (truncated,
//! overwritten, from another tokenizer or an older trainrun) is rebuilt, never trusted.
//!
//! Ids are stored as `u16` when the vocabulary fits (`char`, `byte`, GPT-2's 50,257), else as
//! `u32` ([`TokenDtype::holding`]): half the disk, and half the pages a run touches.
//!
//! The ids are written as they are made, batch by batch, and a cache file's checksum is read
//! through a buffer rather than the mapping, so neither building nor checking one holds a
//! corpus's ids in memory: a run maps the file and touches only the windows it reads.
//!
//! Tasks that start at once do not race: a builder holds an exclusive lock on `<name>.lock`
//! while it tokenizes and looks again once it has the lock (another may have built the file
//! meanwhile), and writes into a temporary file that it renames into place, so a reader sees
//! no file or a whole one. A data folder that cannot be written is not an error: the ids are
//! kept in memory and a warning says every run tokenizes again.

use crate::data::TokenDtype;
use crate::data::error::DataError;
use crate::data::windows::Tokens;
use memmap2::{Mmap, MmapOptions};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// The cache folder's name inside the data folder.
pub const FOLDER: &str = ".trainrun-tokens";
const MAGIC: &[u8; 8] = b"TRTOKENS";
/// 2: ids as `u16` or `u32`, the width in the header (1 stored every id as `u32`).
const VERSION: u32 = 2;
/// Magic, version, bytes per id, token count, CRC-32C, reserved, digest: the ids follow.
const HEADER: usize = 8 + 4 + 4 + 8 + 4 + 4 + 32;

/// What a cached file's ids depend on.
pub struct CacheKey<'a> {
    /// How the source reads documents from the file (`text`, or `jsonl` and the field).
    pub reading: &'a str,
    /// The tokenizer: a tiktoken encoding's name, or a `tokenizer.json`'s SHA-256.
    pub tokenizer: &'a str,
    /// The ids put after every document.
    pub end_of_text: &'a [u32],
    /// The width the ids are stored at (from the vocabulary's size).
    pub dtype: TokenDtype,
    /// The file read.
    pub file: &'a Path,
}

impl CacheKey<'_> {
    /// The digest that names the cache file; `None` when the file's metadata cannot be read.
    fn digest(&self) -> Option<[u8; 32]> {
        let meta = std::fs::metadata(self.file).ok()?;
        let modified = meta.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos();
        let path = std::fs::canonicalize(self.file).ok()?;
        let mut h = Sha256::new();
        h.update(format!("trainrun token cache {VERSION}\0{}\0{}\0", self.reading, self.tokenizer));
        self.end_of_text.iter().for_each(|id| h.update(id.to_le_bytes()));
        h.update(format!("\0{:?}\0{}\0{}\0{modified}", self.dtype, path.display(), meta.len()));
        Some(h.finalize().into())
    }
}

/// Where a stream's ids came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cached {
    /// A valid cache file, mapped.
    Reused(PathBuf),
    /// Tokenized now and written to this cache file.
    Built(PathBuf),
    /// Tokenized now and kept in memory (the cache could not be written: said on stderr).
    InMemory,
}

/// Makes a token stream: hands its ids, in order, to the sink it is given.
pub trait Tokenize: Fn(&mut dyn FnMut(&[u32])) -> Result<(), DataError> {}
impl<T: Fn(&mut dyn FnMut(&[u32])) -> Result<(), DataError>> Tokenize for T {}

/// The ids `tokenize` makes, in memory.
pub fn in_memory(tokenize: impl Tokenize) -> Result<Vec<u32>, DataError> {
    let mut ids = vec![];
    tokenize(&mut |more| ids.extend_from_slice(more))?;
    Ok(ids)
}

/// A SHA-256 of `tokens` (a `char` vocabulary, which its ids depend on), in hex.
pub fn digest_of(tokens: &[String]) -> String {
    let mut h = Sha256::new();
    tokens.iter().for_each(|t| h.update(format!("{t}\0")));
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The ids of `key`'s file: mapped from `dir`'s cache file when it is valid, else `tokenize`d
/// (under the lock) and written there first.
pub fn tokens(dir: &Path, key: &CacheKey<'_>, tokenize: impl Tokenize) -> Result<(Tokens, Cached), DataError> {
    let Some(digest) = key.digest() else { return Ok((Tokens::Owned(in_memory(tokenize)?), Cached::InMemory)) };
    let name: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    let path = dir.join(format!("{name}.tokens"));
    if let Some(tokens) = open_valid(&path, &digest, key.dtype) {
        return Ok((tokens, Cached::Reused(path)));
    }
    let lock = std::fs::create_dir_all(dir).and_then(|()| {
        let lock = File::options().create(true).truncate(false).write(true).open(dir.join(format!("{name}.lock")))?;
        lock.lock()?;
        Ok(lock)
    });
    let lock = match lock {
        Ok(lock) => lock,
        Err(e) => return Ok((Tokens::Owned(unwritable(dir, &e, tokenize)?), Cached::InMemory)),
    };
    // Another task may have built it while this one waited for the lock.
    if let Some(tokens) = open_valid(&path, &digest, key.dtype) {
        return Ok((tokens, Cached::Reused(path)));
    }
    let written = write(&path, &digest, key.dtype, &tokenize)?;
    drop(lock);
    // Its checksum was made as it was written: only the header and length are checked again.
    match written.ok().and_then(|()| open_checked(&path, &digest, key.dtype, Recheck::Written)) {
        Some(tokens) => Ok((tokens, Cached::Built(path))),
        None => {
            // The ids were not kept while they were written: made again, in memory.
            warn(dir, "the file could not be written and read back");
            Ok((Tokens::Owned(in_memory(tokenize)?), Cached::InMemory))
        }
    }
}

fn unwritable(dir: &Path, e: &std::io::Error, tokenize: impl Tokenize) -> Result<Vec<u32>, DataError> {
    warn(dir, &e.to_string());
    in_memory(tokenize)
}

fn warn(dir: &Path, why: &str) {
    eprintln!(
        "warning: cannot use the token cache {} ({why}): tokenized in memory, and every run tokenizes again; \
         make the data folder writable",
        dir.display()
    );
}

/// The ids of the cache file at `path` when its header (version and width included), digest,
/// length and checksum hold.
fn open_valid(path: &Path, digest: &[u8; 32], dtype: TokenDtype) -> Option<Tokens> {
    open_checked(path, digest, dtype, Recheck::Read)
}

/// Whether [`open_checked`] reads a cache file's ids for their checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Recheck {
    /// Read and compared with the header's: a file this process did not just write.
    Read,
    /// Not read again: this process computed it while writing the file, under the lock.
    Written,
}

/// [`open_valid`], reading the ids for their checksum only when `checksum` says so.
fn open_checked(path: &Path, digest: &[u8; 32], dtype: TokenDtype, checksum: Recheck) -> Option<Tokens> {
    let mut file = File::open(path).ok()?;
    let mut header = [0u8; HEADER];
    file.read_exact(&mut header).ok()?;
    let word = |at: usize| u32::from_le_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]]);
    let count = u64::from_le_bytes(header[16..24].try_into().ok()?);
    let bytes = count.checked_mul(dtype.bytes() as u64)?;
    let whole = file.metadata().ok()?.len() == HEADER as u64 + bytes;
    let width = word(12) == dtype.bytes() as u32;
    if &header[..8] != MAGIC || word(8) != VERSION || !width || &header[32..] != digest || !whole {
        return None;
    }
    if count == 0 {
        return Some(Tokens::Owned(vec![]));
    }
    if checksum == Recheck::Read {
        // Read, not mapped, for the checksum: a mapping's pages would all stay resident.
        let (mut crc, mut buffer) = (0, vec![0u8; CHECK_BUFFER]);
        loop {
            match file.read(&mut buffer).ok()? {
                0 => break,
                n => crc = crc32c::crc32c_append(crc, &buffer[..n]),
            }
        }
        if crc != word(24) {
            return None;
        }
    }
    // SAFETY: cache files are only ever replaced by rename, never written in place, so the
    // mapped inode does not change under the run.
    let map: Mmap = unsafe { MmapOptions::new().offset(HEADER as u64).len(bytes as usize).map(&file) }.ok()?;
    Some(match dtype {
        TokenDtype::U16 => Tokens::U16(map),
        TokenDtype::U32 => Tokens::U32(map),
    })
}

/// Bytes of a cache file read at a time to check it.
const CHECK_BUFFER: usize = 1 << 20;

/// Bytes of ids handed to the writing thread at a time.
const CHUNK: usize = 1 << 20;

/// Writes the ids `tokenize` makes, as it makes them, at `dtype`'s width, to a temporary file
/// beside `path`, and renames it there. The outer error is `tokenize`'s (bad data); the inner
/// one the file's (an id too wide for `dtype` is one, so it is never cut short).
///
/// A second thread checksums and writes the ids a [`CHUNK`] at a time while the documents are
/// read and tokenized: writing a corpus's ids costs about what reading it does (byte tokens are
/// two bytes a byte of text). With this, 1 MB writes instead of 8 KB ones, no `fsync` and no
/// second read for the checksum, `trainrun tokenize` over a 272 MB Parquet text column (byte
/// tokens) went from 2.4–2.6 s (3.4 s with them) to 1.1–1.2 s, 2026-11-29.
fn write(
    path: &Path,
    digest: &[u8; 32],
    dtype: TokenDtype,
    tokenize: &impl Tokenize,
) -> Result<std::io::Result<()>, DataError> {
    let temporary = path.with_extension(format!("tmp{}", std::process::id()));
    let file = match File::create(&temporary) {
        Ok(file) => file,
        Err(e) => return Ok(Err(e)),
    };
    // Full chunks go to the writer; emptied ones come back to be filled again.
    let (full, to_write) = std::sync::mpsc::sync_channel::<Vec<u8>>(2);
    let (emptied, to_fill) = std::sync::mpsc::channel::<Vec<u8>>();
    let (made, written) = std::thread::scope(|scope| {
        let writer = scope.spawn(move || -> std::io::Result<(File, u32)> {
            let mut file = file;
            file.write_all(&[0; HEADER])?;
            let mut crc = 0u32;
            for mut chunk in to_write {
                crc = crc32c::crc32c_append(crc, &chunk);
                file.write_all(&chunk)?;
                chunk.clear();
                // The filling side may be gone (it stopped on an error): nothing to hand back.
                let _ = emptied.send(chunk);
            }
            Ok((file, crc))
        });
        let (mut count, mut failed, mut chunk) = (0u64, None, Vec::with_capacity(CHUNK));
        let made = tokenize(&mut |ids| {
            if failed.is_some() {
                return;
            }
            if let Err(e) = encode(ids, dtype, &mut chunk) {
                failed = Some(e);
                return;
            }
            count += ids.len() as u64;
            if chunk.len() >= CHUNK {
                let next = to_fill.try_recv().unwrap_or_else(|_| Vec::with_capacity(CHUNK));
                if full.send(std::mem::replace(&mut chunk, next)).is_err() {
                    // The writer stopped on an error, which `join` returns.
                    failed = Some(std::io::Error::other("the token cache's writer stopped"));
                }
            }
        });
        if made.is_ok() && failed.is_none() && !chunk.is_empty() {
            let _ = full.send(chunk);
        }
        drop(full);
        let written = match writer.join() {
            Ok(Ok((file, crc))) => match failed {
                Some(e) => Err(e),
                None => finish(file, digest, dtype, count, crc),
            },
            Ok(Err(e)) => Err(e),
            Err(_) => Err(std::io::Error::other("the token cache's writer panicked")),
        };
        (made, written)
    });
    let finished = match (made, written) {
        (Err(e), _) => {
            let _ = std::fs::remove_file(&temporary);
            return Err(e);
        }
        (Ok(()), written) => written,
    };
    Ok(finished.and_then(|()| std::fs::rename(&temporary, path)).inspect_err(|_| {
        let _ = std::fs::remove_file(&temporary);
    }))
}

/// Appends `ids` to `bytes`, little-endian at `dtype`'s width.
fn encode(ids: &[u32], dtype: TokenDtype, bytes: &mut Vec<u8>) -> std::io::Result<()> {
    let width = dtype.bytes();
    let start = bytes.len();
    bytes.resize(start + ids.len() * width, 0);
    let out = &mut bytes[start..];
    match dtype {
        TokenDtype::U32 => out.chunks_exact_mut(4).zip(ids).for_each(|(o, id)| o.copy_from_slice(&id.to_le_bytes())),
        TokenDtype::U16 => {
            if let Some(id) = ids.iter().find(|&&id| id > u32::from(u16::MAX)) {
                bytes.truncate(start);
                return Err(std::io::Error::other(format!("token id {id} does not fit the cache's u16 ids")));
            }
            out.chunks_exact_mut(2).zip(ids).for_each(|(o, &id)| o.copy_from_slice(&(id as u16).to_le_bytes()));
        }
    }
    Ok(())
}

/// Writes the header over the placeholder at the start of `file`. Not synced: a reader checks
/// every file it did not write against its checksum, so one that a crash left partly on disk is
/// rebuilt rather than trusted, and a run need not wait for the disk.
fn finish(mut file: File, digest: &[u8; 32], dtype: TokenDtype, count: u64, crc: u32) -> std::io::Result<()> {
    let mut header = Vec::with_capacity(HEADER);
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(&VERSION.to_le_bytes());
    header.extend_from_slice(&(dtype.bytes() as u32).to_le_bytes());
    header.extend_from_slice(&count.to_le_bytes());
    header.extend_from_slice(&crc.to_le_bytes());
    header.extend_from_slice(&[0; 4]);
    header.extend_from_slice(digest);
    file.rewind()?;
    file.write_all(&header)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key<'a>(file: &'a Path, tokenizer: &'a str) -> CacheKey<'a> {
        CacheKey { reading: "text", tokenizer, end_of_text: &[7], dtype: TokenDtype::U16, file }
    }

    fn ids(tokens: &Tokens) -> Vec<u32> {
        (0..tokens.len()).map(|i| tokens.get(i)).collect()
    }

    fn build(ids: Vec<u32>) -> impl Tokenize {
        move |sink: &mut dyn FnMut(&[u32])| {
            sink(&ids);
            Ok::<(), DataError>(())
        }
    }

    #[test]
    fn built_once_then_reused_and_a_damaged_or_foreign_file_is_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        let (data, cache) = (dir.path().join("a.txt"), dir.path().join(FOLDER));
        std::fs::write(&data, "abc").unwrap();
        let five = || build((0..5).collect());
        let (tokens, how) = tokens(&cache, &key(&data, "gpt2"), five()).unwrap();
        let Cached::Built(file) = how else { panic!("{how:?}") };
        assert_eq!(ids(&tokens), [0, 1, 2, 3, 4]);
        assert!(matches!(tokens, Tokens::U16(_)), "mapped, not copied");
        let again =
            super::tokens(&cache, &key(&data, "gpt2"), |_: &mut dyn FnMut(&[u32])| panic!("reused, not rebuilt"))
                .unwrap();
        assert_eq!((ids(&again.0), again.1), (vec![0, 1, 2, 3, 4], Cached::Reused(file.clone())));

        // Truncated: rebuilt.
        let whole = std::fs::read(&file).unwrap();
        std::fs::write(&file, &whole[..whole.len() - 2]).unwrap();
        assert_eq!(super::tokens(&cache, &key(&data, "gpt2"), five()).unwrap().1, Cached::Built(file.clone()));
        // A flipped id: the checksum fails, rebuilt.
        let mut flipped = whole.clone();
        flipped[HEADER] ^= 1;
        std::fs::write(&file, &flipped).unwrap();
        assert_eq!(super::tokens(&cache, &key(&data, "gpt2"), five()).unwrap().1, Cached::Built(file.clone()));
        // Another tokenizer's file in its place: the digest differs, rebuilt.
        let (_, other) = super::tokens(&cache, &key(&data, "cl100k_base"), build(vec![0, 1, 2])).unwrap();
        let Cached::Built(other) = other else { panic!("{other:?}") };
        assert_ne!(other, file);
        std::fs::copy(&other, &file).unwrap();
        let (rebuilt, how) = super::tokens(&cache, &key(&data, "gpt2"), five()).unwrap();
        assert_eq!((ids(&rebuilt), how), (vec![0, 1, 2, 3, 4], Cached::Built(file)));

        // The data file changed (its size): a new key.
        std::fs::write(&data, "abcd").unwrap();
        assert!(matches!(super::tokens(&cache, &key(&data, "gpt2"), build(vec![0, 1])).unwrap().1, Cached::Built(_)));
    }

    #[test]
    fn ids_are_stored_two_bytes_wide_when_the_vocabulary_fits_else_four() {
        assert_eq!(
            [256, 50_257, 65_536, 65_537, 100_277].map(TokenDtype::holding),
            [TokenDtype::U16, TokenDtype::U16, TokenDtype::U16, TokenDtype::U32, TokenDtype::U32]
        );
        let dir = tempfile::tempdir().unwrap();
        let (data, cache) = (dir.path().join("a.txt"), dir.path().join(FOLDER));
        std::fs::write(&data, "abc").unwrap();
        let narrow = vec![0, 50_256, 65_535, 7];
        let wide = vec![0, 65_536, 100_276, u32::MAX];
        for (dtype, want) in [(TokenDtype::U16, &narrow), (TokenDtype::U32, &wide)] {
            let key = CacheKey { dtype, ..key(&data, "some tokenizer") };
            let (tokens, how) = tokens(&cache, &key, build(want.clone())).unwrap();
            let Cached::Built(file) = how else { panic!("{how:?}") };
            assert_eq!(std::fs::metadata(&file).unwrap().len(), (HEADER + want.len() * dtype.bytes()) as u64);
            assert_eq!(ids(&tokens), *want);
            let reused = super::tokens(&cache, &key, |_: &mut dyn FnMut(&[u32])| panic!("reused")).unwrap();
            assert_eq!((ids(&reused.0), matches!(reused.1, Cached::Reused(_))), (want.clone(), true));
            match dtype {
                TokenDtype::U16 => assert!(matches!(reused.0, Tokens::U16(_))),
                TokenDtype::U32 => assert!(matches!(reused.0, Tokens::U32(_))),
            }
        }
        // An id too wide for u16 is never cut short: the ids stay in memory, whole.
        let key = CacheKey { reading: "too wide", ..key(&data, "some tokenizer") };
        let (tokens, how) = tokens(&cache, &key, build(wide.clone())).unwrap();
        assert_eq!((ids(&tokens), how), (wide, Cached::InMemory));
    }

    #[test]
    fn a_cache_file_of_another_version_or_width_is_rebuilt_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let (data, cache) = (dir.path().join("a.txt"), dir.path().join(FOLDER));
        std::fs::write(&data, "abc").unwrap();
        let (_, how) = tokens(&cache, &key(&data, "gpt2"), build(vec![1, 2, 3, 4])).unwrap();
        let Cached::Built(file) = how else { panic!("{how:?}") };
        let whole = std::fs::read(&file).unwrap();
        let patched = |at: usize, word: u32| {
            let mut bytes = whole.clone();
            bytes[at..at + 4].copy_from_slice(&word.to_le_bytes());
            bytes
        };
        // Version 1 stored every id as u32, its width field reserved (0).
        let ids32: Vec<u8> = [1u32, 2, 3, 4].iter().flat_map(|id| id.to_le_bytes()).collect();
        let mut version_1 = patched(8, 1)[..HEADER].to_vec();
        version_1[12..16].copy_from_slice(&[0; 4]);
        version_1[24..28].copy_from_slice(&crc32c::crc32c(&ids32).to_le_bytes());
        version_1.extend_from_slice(&ids32);
        let cases = [("a version 1 file", version_1), ("version 1", patched(8, 1)), ("width 4", patched(12, 4))];
        for (what, bytes) in cases {
            std::fs::write(&file, &bytes).unwrap();
            let (tokens, how) = tokens(&cache, &key(&data, "gpt2"), build(vec![1, 2, 3, 4])).unwrap();
            assert_eq!((ids(&tokens), how), (vec![1, 2, 3, 4], Cached::Built(file.clone())), "{what}");
            assert_eq!(std::fs::read(&file).unwrap(), whole, "{what}");
        }
    }
}
