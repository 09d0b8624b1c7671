//! IDX files (the MNIST format), gzip-compressed or raw: full reads and header-only reads.
//!
//! Layout: two zero bytes, an element-type byte (only `0x08`, unsigned byte, is read), the
//! number of dimensions, one big-endian `u32` per dimension, then the elements row-major.
//! Compression is recognised by the gzip magic bytes, never by the file name.

use super::error::DataError;
use flate2::read::MultiGzDecoder;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const TYPE_U8: u8 = 0x08;

/// An IDX array of bytes: its dimensions and its elements, row-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdxArray {
    dims: Vec<usize>,
    // The decompressed file is kept whole and the header skipped by offset: cutting it off
    // would move tens of megabytes for nothing.
    buf: Vec<u8>,
    start: usize,
}

impl IdxArray {
    /// An array from its parts; `data.len()` must be the product of `dims`.
    pub(crate) fn from_parts(dims: Vec<usize>, data: Vec<u8>) -> Self {
        Self { dims, buf: data, start: 0 }
    }

    /// The dimensions from the header, e.g. `[60000, 28, 28]`.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// The elements, row-major.
    pub fn data(&self) -> &[u8] {
        self.buf.get(self.start..).unwrap_or_default()
    }

    /// Heap bytes held.
    pub fn bytes_held(&self) -> usize {
        self.buf.capacity() + self.dims.capacity() * size_of::<usize>()
    }
}

/// Reads a whole IDX file, inflating it first when it is gzip.
pub fn read_idx(path: &Path) -> Result<IdxArray, DataError> {
    let raw = std::fs::read(path).map_err(|source| read_error(path, source))?;
    decode_idx(raw, path)
}

/// Decodes the bytes of the IDX file at `path` (gzip or not), as [`read_idx`] does.
pub fn decode_idx(raw: Vec<u8>, path: &Path) -> Result<IdxArray, DataError> {
    let bytes = if raw.starts_with(&GZIP_MAGIC) { inflate(&raw, path)? } else { raw };
    parse_idx(bytes, path)
}

/// Reads only the dimensions of an IDX file; for gzip, only the first compressed block is
/// inflated, so this costs microseconds whatever the file size.
pub fn read_idx_dims(path: &Path) -> Result<Vec<usize>, DataError> {
    let file = File::open(path).map_err(|source| read_error(path, source))?;
    let mut file = BufReader::new(file);
    let is_gzip = file.fill_buf().map_err(|source| read_error(path, source))?.starts_with(&GZIP_MAGIC);
    let mut reader: Box<dyn Read> = if is_gzip { Box::new(MultiGzDecoder::new(file)) } else { Box::new(file) };
    let mut head = Vec::with_capacity(16);
    read_head(&mut reader, &mut head, 4, path, is_gzip)?;
    let header_len = 4 + 4 * usize::from(head[3]);
    read_head(&mut reader, &mut head, header_len, path, is_gzip)?;
    let (dims, _) = parse_header(&head, path)?;
    Ok(dims)
}

/// Reads on until `head` holds `want` bytes.
fn read_head(
    reader: &mut dyn Read,
    head: &mut Vec<u8>,
    want: usize,
    path: &Path,
    is_gzip: bool,
) -> Result<(), DataError> {
    let need = want.saturating_sub(head.len()) as u64;
    reader.take(need).read_to_end(head).map_err(|source| match is_gzip {
        true => DataError::Gzip { path: path.to_path_buf(), source },
        false => read_error(path, source),
    })?;
    if head.len() < want {
        return Err(DataError::Truncated { path: path.to_path_buf(), expected: want as u64, found: head.len() as u64 });
    }
    Ok(())
}

/// Inflates a gzip file held in memory in one go, into a buffer pre-sized from the trailer.
fn inflate(gz: &[u8], path: &Path) -> Result<Vec<u8>, DataError> {
    let isize = match gz.len().checked_sub(4).and_then(|at| gz.get(at..)) {
        Some(&[a, b, c, d]) => u32::from_le_bytes([a, b, c, d]) as usize,
        _ => 0,
    };
    // ISIZE is the size modulo 2^32 and a corrupt trailer could claim anything; deflate
    // cannot expand more than ~1032:1, so anything above that is only a hint we ignore.
    let hint = isize.min(gz.len().saturating_mul(1032));
    // One spare byte lets `read_to_end` see end-of-stream without growing the buffer. A
    // failed reservation just means growing as we go.
    let mut out = Vec::new();
    let _ = out.try_reserve_exact(hint + 1);
    MultiGzDecoder::new(gz)
        .read_to_end(&mut out)
        .map_err(|source| DataError::Gzip { path: path.to_path_buf(), source })?;
    Ok(out)
}

/// Checks a decompressed IDX file and wraps it without copying.
pub(crate) fn parse_idx(bytes: Vec<u8>, path: &Path) -> Result<IdxArray, DataError> {
    let (dims, header_len) = parse_header(&bytes, path)?;
    let expected =
        element_count(&dims).and_then(|n| n.checked_add(header_len as u64)).ok_or_else(|| DataError::BadDims {
            path: path.to_path_buf(),
            dims: dims.clone(),
            expected: "their product is too large for any file".into(),
        })?;
    let found = bytes.len() as u64;
    if found < expected {
        return Err(DataError::Truncated { path: path.to_path_buf(), expected, found });
    }
    if found > expected {
        return Err(DataError::TrailingBytes { path: path.to_path_buf(), expected, found });
    }
    Ok(IdxArray { dims, buf: bytes, start: header_len })
}

fn element_count(dims: &[usize]) -> Option<u64> {
    dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
}

/// Parses the header at the start of `bytes`: the dimensions and the header's length.
fn parse_header(bytes: &[u8], path: &Path) -> Result<(Vec<usize>, usize), DataError> {
    let truncated = |expected: usize| DataError::Truncated {
        path: path.to_path_buf(),
        expected: expected as u64,
        found: bytes.len() as u64,
    };
    let &[z0, z1, code, rank, ..] = bytes else {
        return Err(truncated(4));
    };
    if [z0, z1] != [0, 0] {
        return Err(DataError::BadMagic { path: path.to_path_buf(), found: [z0, z1] });
    }
    if code != TYPE_U8 {
        return Err(DataError::UnsupportedType { path: path.to_path_buf(), code });
    }
    let header_len = 4 + 4 * usize::from(rank);
    let dim_bytes = bytes.get(4..header_len).ok_or_else(|| truncated(header_len))?;
    let dims = dim_bytes.chunks_exact(4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize).collect();
    Ok((dims, header_len))
}

fn read_error(path: &Path, source: io::Error) -> DataError {
    DataError::Read { path: path.to_path_buf(), source }
}

/// Encodes an IDX file of bytes (used by tests and by synthetic fixtures).
#[cfg(test)]
pub(crate) fn encode_idx(dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut out = vec![0, 0, TYPE_U8, dims.len() as u8];
    for d in dims {
        out.extend_from_slice(&d.to_be_bytes());
    }
    out.extend_from_slice(data);
    out
}

#[cfg(test)]
pub(crate) fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let _ = enc.write_all(bytes);
    enc.finish().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn reads_raw_and_gzip_alike_whatever_the_name() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..2 * 3 * 4).map(|i| i as u8).collect();
        let raw = encode_idx(&[2, 3, 4], &data);
        // Names lie on purpose: detection is by magic bytes.
        let a = write(dir.path(), "raw.gz", &raw);
        let b = write(dir.path(), "packed", &gzip(&raw));
        for path in [a, b] {
            let arr = read_idx(&path).unwrap();
            assert_eq!(arr.dims(), &[2, 3, 4]);
            assert_eq!(arr.data(), &data[..]);
            assert_eq!(read_idx_dims(&path).unwrap(), vec![2, 3, 4]);
        }
    }

    #[test]
    fn four_d_and_one_d_headers() {
        let four = parse_idx(encode_idx(&[1, 2, 2, 3], &[7; 12]), Path::new("x")).unwrap();
        assert_eq!(four.dims(), &[1, 2, 2, 3]);
        let one = parse_idx(encode_idx(&[3], &[1, 2, 3]), Path::new("y")).unwrap();
        assert_eq!(one.data(), &[1, 2, 3]);
    }

    #[test]
    fn malformed_files_are_errors_naming_the_file() {
        let p = Path::new("bad.idx");
        let good = encode_idx(&[2, 2, 2], &[0; 8]);
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![], "bad.idx: truncated: the header describes 4 bytes, the file holds 0"),
            (vec![0, 0, 8, 3, 0, 0], "bad.idx: truncated: the header describes 16 bytes"),
            (good[..good.len() - 1].to_vec(), "bad.idx: truncated: the header describes 24 bytes, the file holds 23"),
            ([&good[..], &[1]].concat(), "bad.idx: 25 bytes, but the header describes 24"),
            (
                [&[1, 0], &good[2..]].concat(),
                "bad.idx: not an IDX file (it must start with the bytes 00 00, found 01 00)",
            ),
            ([&[0, 0, 0x0D], &good[3..]].concat(), "bad.idx: IDX element type 0x0d (float) is not supported"),
        ];
        for (bytes, want) in cases {
            let err = parse_idx(bytes, p).unwrap_err().to_string();
            assert!(err.starts_with(want), "{err:?} should start with {want:?}");
        }
    }

    #[test]
    fn truncated_and_corrupt_gzip_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let raw = encode_idx(&[100, 10, 10], &[3; 10_000]);
        let gz = gzip(&raw);
        let cut = write(dir.path(), "cut.gz", &gz[..gz.len() / 2]);
        let err = read_idx(&cut).unwrap_err().to_string();
        assert!(err.contains("cut.gz: corrupt gzip data"), "{err}");
        let mut flipped = gz.clone();
        let mid = flipped.len() / 2;
        flipped[mid] ^= 0xff;
        let bad = write(dir.path(), "flip.gz", &flipped);
        assert!(read_idx(&bad).is_err());
        let tiny = write(dir.path(), "tiny", &[0, 0]);
        let err = read_idx_dims(&tiny).unwrap_err().to_string();
        assert!(
            err.ends_with(
                "tiny: truncated: the header describes 4 bytes, the file holds 2; delete it and fetch it again"
            ),
            "{err}"
        );
        let header_cut = write(dir.path(), "cut", &gzip(&[0, 0, 8, 3, 0, 0, 0]));
        let err = read_idx_dims(&header_cut).unwrap_err().to_string();
        assert!(
            err.ends_with(
                "cut: truncated: the header describes 16 bytes, the file holds 7; delete it and fetch it again"
            ),
            "{err}"
        );
        let missing = dir.path().join("nope");
        let err = read_idx(&missing).unwrap_err().to_string();
        assert!(err.starts_with("cannot read ") && err.contains("nope"), "{err}");
    }

    #[test]
    fn absurd_dims_are_an_error_not_an_allocation() {
        let bytes = encode_idx(&[u32::MAX, u32::MAX, u32::MAX], &[]);
        let err = parse_idx(bytes, Path::new("huge")).unwrap_err();
        assert!(matches!(err, DataError::BadDims { .. } | DataError::Truncated { .. }));
    }
}
