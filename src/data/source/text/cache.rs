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
use std::io::{Read, Write};
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

/// The ids of `key`'s file: mapped from `dir`'s cache file when it is valid, else `tokenize`d
/// (under the lock) and written there first.
pub fn tokens(
    dir: &Path,
    key: &CacheKey<'_>,
    tokenize: impl FnOnce() -> Result<Vec<u32>, DataError>,
) -> Result<(Tokens, Cached), DataError> {
    let Some(digest) = key.digest() else { return Ok((Tokens::Owned(tokenize()?), Cached::InMemory)) };
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
    let ids = tokenize()?;
    let written = write(&path, &digest, &ids);
    drop(lock);
    match written.ok().and_then(|()| open_valid(&path, &digest)) {
        Some(tokens) => Ok((tokens, Cached::Built(path))),
        None => {
            warn(dir, "the file written could not be read back");
            Ok((Tokens::Owned(ids), Cached::InMemory))
        }
    }
}

fn unwritable(
    dir: &Path,
    e: &std::io::Error,
    tokenize: impl FnOnce() -> Result<Vec<u32>, DataError>,
) -> Result<Vec<u32>, DataError> {
    warn(dir, &e.to_string());
    tokenize()
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
    // SAFETY: cache files are only ever replaced by rename, never written in place, so the
    // mapped inode does not change under the run.
    let map: Mmap = unsafe { MmapOptions::new().offset(HEADER as u64).len(bytes as usize).map(&file) }.ok()?;
    (crc32c::crc32c(&map) == word(24)).then_some(Tokens::U32(map))
}

/// Writes `ids` to a temporary file beside `path` and renames it there.
fn write(path: &Path, digest: &[u8; 32], ids: &[u32]) -> std::io::Result<()> {
    let mut bytes = Vec::with_capacity(HEADER + 4 * ids.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&VERSION.to_le_bytes());
    bytes.extend_from_slice(&[0; 4]);
    bytes.extend_from_slice(&(ids.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&[0; 8]);
    bytes.extend_from_slice(digest);
    ids.iter().for_each(|id| bytes.extend_from_slice(&id.to_le_bytes()));
    let crc = crc32c::crc32c(&bytes[HEADER..]);
    bytes[24..28].copy_from_slice(&crc.to_le_bytes());
    let temporary = path.with_extension(format!("tmp{}", std::process::id()));
    let mut file = File::create(&temporary)?;
    file.write_all(&bytes)?;
    file.sync_all()?;
    std::fs::rename(&temporary, path)
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
        let build = |n: u32| move || Ok((0..n).collect::<Vec<u32>>());
        let (tokens, how) = tokens(&cache, &key(&data, "gpt2"), build(5)).unwrap();
        let Cached::Built(file) = how else { panic!("{how:?}") };
        assert_eq!(ids(&tokens), [0, 1, 2, 3, 4]);
        assert!(matches!(tokens, Tokens::U32(_)), "mapped, not copied");
        let again = super::tokens(&cache, &key(&data, "gpt2"), || panic!("reused, not rebuilt")).unwrap();
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
