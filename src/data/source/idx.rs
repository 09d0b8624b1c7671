//! The `idx` source: IDX files (the MNIST format) named in `[data.files]`, and the reader of
//! the format, which the MNIST presets and the synthetic set share: gzip-compressed or raw,
//! full reads and header-only reads. Classes are one more than the largest label.
//!
//! Layout: two zero bytes, an element-type byte (only `0x08`, unsigned byte, is read), the
//! number of dimensions, one big-endian `u32` per dimension, then the elements row-major.
//! Compression is recognised by the gzip magic bytes, never by the file name.

use super::{DataSource, RawValues, both, require};
use crate::data::error::DataError;
use crate::data::{DataFacts, Dataset, ExampleShape, LabelKind, Split};
use flate2::read::MultiGzDecoder;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

mod inflated;
pub use inflated::{Inflated, read_idx_cached};

/// `[data.files]`: IDX file names, relative to `data.dir`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IdxFiles {
    /// Training images (IDX3, `u8`). Example: `train_images = "train-images-idx3-ubyte.gz"`.
    pub train_images: String,
    /// Training labels (IDX1, `u8`). Example: `train_labels = "train-labels-idx1-ubyte.gz"`.
    pub train_labels: String,
    /// Test images, for evaluation. Example: `test_images = "t10k-images-idx3-ubyte.gz"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_images: Option<String>,
    /// Test labels, for evaluation. Example: `test_labels = "t10k-labels-idx1-ubyte.gz"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_labels: Option<String>,
}

/// `data.dataset = "idx"`: the files of `[data.files]` in `dir`.
#[derive(Debug, Clone, PartialEq)]
pub struct IdxSource {
    pub dir: PathBuf,
    pub files: IdxFiles,
    /// Where gzip files are kept inflated (`TRAINRUN_DATA_CACHE`), if anywhere.
    pub cache: Option<PathBuf>,
}

impl DataSource for IdxSource {
    fn name(&self) -> &'static str {
        "idx"
    }

    fn dir(&self) -> Option<&Path> {
        Some(&self.dir)
    }

    fn missing_files(&self) -> Vec<String> {
        idx_names(&self.files).into_iter().filter(|name| !self.dir.join(name).is_file()).map(str::to_string).collect()
    }

    /// Reads the image headers and the (small) label files, to count classes.
    fn facts(&self) -> Result<DataFacts, DataError> {
        let (dir, files) = (&self.dir, &self.files);
        require(self.name(), dir, self.missing_files())?;
        let (train, train_labels) = idx_dims_and_labels(dir, &files.train_images, &files.train_labels)?;
        let test = test_paths(files)?.map(|(i, l)| idx_dims_and_labels(dir, i, l)).transpose()?;
        let classes = max_label(&train_labels, test.as_ref().map(|t| &t.1));
        Ok(DataFacts {
            train_examples: train_labels.data().len(),
            test_examples: test.as_ref().map_or(0, |t| t.1.data().len()),
            example_shape: train.dims(),
            labels: LabelKind::Class { classes },
            train_files: 1,
            warnings: vec![],
        })
    }

    /// Decodes train and test files on two threads.
    fn load(&self) -> Result<Dataset, DataError> {
        let (dir, files) = (&self.dir, &self.files);
        require(self.name(), dir, self.missing_files())?;
        let test = test_paths(files)?;
        let cache = self.cache.as_deref();
        let (train, test) = both(
            || load_split(&dir.join(&files.train_images), &dir.join(&files.train_labels), cache),
            || test.map(|(i, l)| load_split(&dir.join(i), &dir.join(l), cache)).transpose(),
        );
        let (train, test) = (train?, test?);
        let classes = max_label(&train.1, test.as_ref().map(|t| &t.1));
        Ok(Dataset {
            train: image_split(train),
            test: test.map(image_split),
            labels: LabelKind::Class { classes },
            vocabulary: None,
            classes: None,
        })
    }

    fn read_input(&self, file: &Path) -> Result<Split, DataError> {
        read_images(file)
    }

    fn raw_values(&self) -> RawValues {
        RawValues::Bytes
    }
}

fn idx_names(files: &IdxFiles) -> Vec<&str> {
    [
        Some(files.train_images.as_str()),
        Some(files.train_labels.as_str()),
        files.test_images.as_deref(),
        files.test_labels.as_deref(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

fn test_paths(files: &IdxFiles) -> Result<Option<(&str, &str)>, DataError> {
    match (&files.test_images, &files.test_labels) {
        (Some(i), Some(l)) => Ok(Some((i, l))),
        (None, None) => Ok(None),
        (Some(_), None) | (None, Some(_)) => Err(DataError::MissingSection {
            dataset: "idx",
            section: "both data.files.test_images and data.files.test_labels (or neither)",
            example: "test_images = \"t10k-images-idx3-ubyte.gz\", \
                      test_labels = \"t10k-labels-idx1-ubyte.gz\"",
        }),
    }
}

/// The example shape of an images file's dimensions (`n,h,w` or `n,h,w,c`).
fn image_shape(path: &Path, dims: &[usize]) -> Result<(usize, ExampleShape), DataError> {
    match *dims {
        [n, height, width] => Ok((n, ExampleShape { height, width, channels: 1 })),
        [n, height, width, channels] => Ok((n, ExampleShape { height, width, channels })),
        _ => Err(DataError::BadDims {
            path: path.to_path_buf(),
            dims: dims.to_vec(),
            expected: "images need 3 dimensions (n, height, width) or 4 (n, height, width, channels)".into(),
        }),
    }
}

fn check_label_dims(path: &Path, dims: &[usize]) -> Result<usize, DataError> {
    match *dims {
        [n] => Ok(n),
        _ => Err(DataError::BadDims {
            path: path.to_path_buf(),
            dims: dims.to_vec(),
            expected: "labels need 1 dimension (one label per example)".into(),
        }),
    }
}

/// Images, labels and the shape of one image, as read and checked by [`load_split`].
type ImageArrays = (IdxArray, IdxArray, ExampleShape);

/// The images of the IDX file `path`, without labels: what `predict --input` reads from an
/// `idx` or MNIST source.
pub(super) fn read_images(path: &Path) -> Result<Split, DataError> {
    let images = read_idx(path)?;
    let (_, shape) = image_shape(path, images.dims())?;
    crate::data::Unlabeled::split(path, shape.dims(), crate::data::unlabeled::scale_bytes(images.data()))
}

pub(super) fn image_split((images, labels, shape): ImageArrays) -> Split {
    Split::new(images, labels, shape)
}

/// Reads and checks a split's two files, through the inflated-file cache `cache` if any.
pub(super) fn load_split(
    images_path: &Path,
    labels_path: &Path,
    cache: Option<&Path>,
) -> Result<ImageArrays, DataError> {
    let (images, _) = read_idx_cached(images_path, cache)?;
    let (n, shape) = image_shape(images_path, images.dims())?;
    let (labels, _) = read_idx_cached(labels_path, cache)?;
    let labels_n = check_label_dims(labels_path, labels.dims())?;
    if n != labels_n {
        return Err(DataError::CountMismatch {
            images_path: images_path.to_path_buf(),
            images: n,
            labels_path: labels_path.to_path_buf(),
            labels: labels_n,
        });
    }
    Ok((images, labels, shape))
}

/// Header of the images, whole labels (small), both checked against each other.
fn idx_dims_and_labels(dir: &Path, images: &str, labels: &str) -> Result<(ExampleShape, IdxArray), DataError> {
    let (images_path, labels_path) = (dir.join(images), dir.join(labels));
    let (n, shape) = image_shape(&images_path, &read_idx_dims(&images_path)?)?;
    let labels = read_idx(&labels_path)?;
    let labels_n = check_label_dims(&labels_path, labels.dims())?;
    if n != labels_n {
        return Err(DataError::CountMismatch { images_path, images: n, labels_path, labels: labels_n });
    }
    Ok((shape, labels))
}

/// Classes of an `idx` dataset: one more than the largest label seen.
fn max_label(train: &IdxArray, test: Option<&IdxArray>) -> u32 {
    let max = |a: &IdxArray| a.data().iter().copied().max().unwrap_or(0);
    let m = max(train).max(test.map_or(0, max));
    u32::from(m) + 1
}

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
    let bytes = if is_gzip(&raw) { inflate(&raw, path)? } else { raw };
    parse_idx(bytes, path)
}

/// Whether `raw` starts as a gzip file does.
fn is_gzip(raw: &[u8]) -> bool {
    raw.starts_with(&GZIP_MAGIC)
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
        true => DataError::Gzip { path: path.to_path_buf(), source, downloaded: false },
        false => read_error(path, source),
    })?;
    if head.len() < want {
        return Err(DataError::Truncated {
            path: path.to_path_buf(),
            expected: want as u64,
            found: head.len() as u64,
            downloaded: false,
        });
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
    MultiGzDecoder::new(gz).read_to_end(&mut out).map_err(|source| DataError::Gzip {
        path: path.to_path_buf(),
        source,
        downloaded: false,
    })?;
    Ok(out)
}

/// Checks a decompressed IDX file and wraps it without copying.
pub(crate) fn parse_idx(bytes: Vec<u8>, path: &Path) -> Result<IdxArray, DataError> {
    parse_idx_after(bytes, 0, path)
}

/// [`parse_idx`] of the IDX file that starts at `offset` of `bytes` (after a cache entry's
/// header), also without copying.
fn parse_idx_after(bytes: Vec<u8>, offset: usize, path: &Path) -> Result<IdxArray, DataError> {
    let idx = bytes.get(offset..).unwrap_or_default();
    let (dims, header_len) = parse_header(idx, path)?;
    let expected =
        element_count(&dims).and_then(|n| n.checked_add(header_len as u64)).ok_or_else(|| DataError::BadDims {
            path: path.to_path_buf(),
            dims: dims.clone(),
            expected: "their product is too large for any file".into(),
        })?;
    let found = idx.len() as u64;
    if found < expected {
        return Err(DataError::Truncated { path: path.to_path_buf(), expected, found, downloaded: false });
    }
    if found > expected {
        return Err(DataError::TrailingBytes { path: path.to_path_buf(), expected, found });
    }
    Ok(IdxArray { dims, buf: bytes, start: offset + header_len })
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
        downloaded: false,
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
mod tests;
