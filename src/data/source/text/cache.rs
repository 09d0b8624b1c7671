//! The token cache: a file's token ids under a subword tokenizer (tiktoken or a
//! `tokenizer.json`), tokenized once and written into `<data.dir>/.trainrun-tokens/` (or
//! `TRAINRUN_TOKEN_CACHE`, [`DataDirs::token_cache`](crate::data::DataDirs::token_cache)), then
//! memory-mapped by every later run, `check` and worker on the host.
//!
//! A cache file is named by a SHA-256 of what its ids depend on ([`CacheKey`]: how the source
//! reads documents, the tokenizer's identity, the end-of-text ids, and the file's canonical
//! path, size and modification time) and repeats that digest in its header, with the token count
//! and a CRC-32C of the ids. A file whose header, digest, length or checksum disagrees (truncated,
//! overwritten, from another tokenizer) is rebuilt, never trusted.
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

use crate::data::error::DataError;
use crate::data::windows::Tokens;
use memmap2::{Mmap, MmapOptions};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{BufWriter, Read, Seek, Write};
use std::path::{Path, PathBuf};

/// The cache folder's name inside the data folder.
pub const FOLDER: &str = ".trainrun-tokens";
const MAGIC: &[u8; 8] = b"TRTOKENS";
const VERSION: u32 = 1;
/// Magic, version, reserved, token count, CRC-32C, reserved, digest: the ids follow.
const HEADER: usize = 8 + 4 + 4 + 8 + 4 + 4 + 32;

/// What a cached file's ids depend on.
pub struct CacheKey<'a> {
    /// How the source reads documents from the file (`text`, or `jsonl` and the field).
    pub reading: &'a str,
    /// The tokenizer: a tiktoken encoding's name, or a `tokenizer.json`'s SHA-256.
    pub tokenizer: &'a str,
    /// The ids put after every document.
    pub end_of_text: &'a [u32],
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
        h.update(format!("\0{}\0{}\0{modified}", path.display(), meta.len()));
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
    if let Some(tokens) = open_valid(&path, &digest) {
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
    if let Some(tokens) = open_valid(&path, &digest) {
        return Ok((tokens, Cached::Reused(path)));
    }
    let written = write(&path, &digest, &tokenize)?;
    drop(lock);
    match written.ok().and_then(|()| open_valid(&path, &digest)) {
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

/// The ids of the cache file at `path` when its header, digest, length and checksum hold.
fn open_valid(path: &Path, digest: &[u8; 32]) -> Option<Tokens> {
    let mut file = File::open(path).ok()?;
    let mut header = [0u8; HEADER];
    file.read_exact(&mut header).ok()?;
    let word = |at: usize| u32::from_le_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]]);
    let count = u64::from_le_bytes(header[16..24].try_into().ok()?);
    let bytes = count.checked_mul(4)?;
    let whole = file.metadata().ok()?.len() == HEADER as u64 + bytes;
    if &header[..8] != MAGIC || word(8) != VERSION || &header[32..] != digest || !whole {
        return None;
    }
    if count == 0 {
        return Some(Tokens::Owned(vec![]));
    }
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
    // SAFETY: cache files are only ever replaced by rename, never written in place, so the
    // mapped inode does not change under the run.
    let map: Mmap = unsafe { MmapOptions::new().offset(HEADER as u64).len(bytes as usize).map(&file) }.ok()?;
    Some(Tokens::U32(map))
}

/// Bytes of a cache file read at a time to check it.
const CHECK_BUFFER: usize = 1 << 20;

/// Writes the ids `tokenize` makes, as it makes them, to a temporary file beside `path`, and
/// renames it there. The outer error is `tokenize`'s (bad data); the inner one the file's.
fn write(path: &Path, digest: &[u8; 32], tokenize: &impl Tokenize) -> Result<std::io::Result<()>, DataError> {
    let temporary = path.with_extension(format!("tmp{}", std::process::id()));
    let mut file = match File::create(&temporary) {
        Ok(file) => BufWriter::new(file),
        Err(e) => return Ok(Err(e)),
    };
    let (mut count, mut crc, mut failed) = (0u64, 0u32, file.write_all(&[0; HEADER]).err());
    let mut bytes = vec![];
    let made = tokenize(&mut |ids| {
        if failed.is_some() {
            return;
        }
        bytes.clear();
        ids.iter().for_each(|id| bytes.extend_from_slice(&id.to_le_bytes()));
        (count, crc) = (count + ids.len() as u64, crc32c::crc32c_append(crc, &bytes));
        failed = file.write_all(&bytes).err();
    });
    let finished = match (made, failed) {
        (Err(e), _) => {
            let _ = std::fs::remove_file(&temporary);
            return Err(e);
        }
        (Ok(()), Some(e)) => Err(e),
        (Ok(()), None) => finish(file, digest, count, crc),
    };
    Ok(finished.and_then(|()| std::fs::rename(&temporary, path)).inspect_err(|_| {
        let _ = std::fs::remove_file(&temporary);
    }))
}

/// Writes the header over the placeholder at the start of `file` and syncs it.
fn finish(file: BufWriter<File>, digest: &[u8; 32], count: u64, crc: u32) -> std::io::Result<()> {
    let mut file = file.into_inner().map_err(std::io::IntoInnerError::into_error)?;
    let mut header = Vec::with_capacity(HEADER);
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(&VERSION.to_le_bytes());
    header.extend_from_slice(&[0; 4]);
    header.extend_from_slice(&count.to_le_bytes());
    header.extend_from_slice(&crc.to_le_bytes());
    header.extend_from_slice(&[0; 4]);
    header.extend_from_slice(digest);
    file.rewind()?;
    file.write_all(&header)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key<'a>(file: &'a Path, tokenizer: &'a str) -> CacheKey<'a> {
        CacheKey { reading: "text", tokenizer, end_of_text: &[7], file }
    }

    fn ids(tokens: &Tokens) -> Vec<u32> {
        (0..tokens.len()).map(|i| tokens.get(i)).collect()
    }

    #[test]
    fn built_once_then_reused_and_a_damaged_or_foreign_file_is_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        let (data, cache) = (dir.path().join("a.txt"), dir.path().join(FOLDER));
        std::fs::write(&data, "abc").unwrap();
        let build = |n: u32| {
            move |sink: &mut dyn FnMut(&[u32])| {
                sink(&(0..n).collect::<Vec<u32>>());
                Ok(())
            }
        };
        let (tokens, how) = tokens(&cache, &key(&data, "gpt2"), build(5)).unwrap();
        let Cached::Built(file) = how else { panic!("{how:?}") };
        assert_eq!(ids(&tokens), [0, 1, 2, 3, 4]);
        assert!(matches!(tokens, Tokens::U32(_)), "mapped, not copied");
        let again =
            super::tokens(&cache, &key(&data, "gpt2"), |_: &mut dyn FnMut(&[u32])| panic!("reused, not rebuilt"))
                .unwrap();
        assert_eq!((ids(&again.0), again.1), (vec![0, 1, 2, 3, 4], Cached::Reused(file.clone())));

        // Truncated: rebuilt.
        let whole = std::fs::read(&file).unwrap();
        std::fs::write(&file, &whole[..whole.len() - 4]).unwrap();
        assert_eq!(super::tokens(&cache, &key(&data, "gpt2"), build(5)).unwrap().1, Cached::Built(file.clone()));
        // A flipped id: the checksum fails, rebuilt.
        let mut flipped = whole.clone();
        flipped[HEADER] ^= 1;
        std::fs::write(&file, &flipped).unwrap();
        assert_eq!(super::tokens(&cache, &key(&data, "gpt2"), build(5)).unwrap().1, Cached::Built(file.clone()));
        // Another tokenizer's file in its place: the digest differs, rebuilt.
        let (_, other) = super::tokens(&cache, &key(&data, "cl100k_base"), build(3)).unwrap();
        let Cached::Built(other) = other else { panic!("{other:?}") };
        assert_ne!(other, file);
        std::fs::copy(&other, &file).unwrap();
        let (rebuilt, how) = super::tokens(&cache, &key(&data, "gpt2"), build(5)).unwrap();
        assert_eq!((ids(&rebuilt), how), (vec![0, 1, 2, 3, 4], Cached::Built(file)));

        // The data file changed (its size): a new key.
        std::fs::write(&data, "abcd").unwrap();
        assert!(matches!(super::tokens(&cache, &key(&data, "gpt2"), build(2)).unwrap().1, Cached::Built(_)));
    }
}
