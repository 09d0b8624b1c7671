//! The `tfrecord` source: TFRecord files of `tf.train.Example`s, read by
//! [`formats::tfrecord`](super::formats::tfrecord) as streams, never loaded whole. Only the
//! records' framing is read up front (a pass that seeks over each payload, or inflates it for
//! gzip) to count the examples of every file; the training pipeline then streams each
//! data-epoch through a shuffle buffer of `data.tfrecord.shuffle_buffer` records
//! ([`RecordSplit::open`]), and a resumed run replays the epoch's stream up to its cursor,
//! skipping without decoding. Evaluation reads the test files in order.
//!
//! `u8` images (raw bytes, PNG, JPEG) are divided by 255 as every other image source's are;
//! float lists are passed on unscaled.

use super::error::DataError;
use super::examples::{Examples, LabelKind, Split};
use super::formats::tfrecord::{Compression, Encoded, ExampleSpec, ExampleStream, ImageEncoding, Order, scan};
use super::formats::{Dtype, image_folder::ColorMode};
use super::pipeline::Batch;
use super::{DataFacts, Dataset};
use rayon::prelude::*;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::num::{NonZeroU32, NonZeroUsize};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// `[data.tfrecord]`: TFRecord files of `tf.train.Example`s and the features to read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TfRecordConfig {
    /// Training files, relative to `data.dir` (or absolute); each entry is a file name or a
    /// glob pattern (`*`, `?`, `[…]`) whose matches are taken in sorted order. Files are read
    /// in this order. Required. Example: `train = ["train-*.tfrecord"]`.
    pub train: Vec<String>,
    /// Test files, as `train`. Default: none (nothing is evaluated).
    /// Example: `test = ["test.tfrecord"]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub test: Vec<String>,
    /// Name of the image (features) feature of each `Example`. Default: `"image"`.
    /// Example: `image = "image/encoded"`.
    #[serde(default = "default_image")]
    pub image: String,
    /// Name of the label feature: one `int64` class index. Default: `"label"`.
    /// Example: `label = "image/class/label"`.
    #[serde(default = "default_label")]
    pub label: String,
    /// How the image feature is stored. Default: `"raw"`. Example: `encoding = "png_or_jpeg"`.
    #[serde(default)]
    pub encoding: TfRecordEncoding,
    /// The shape of one example's features, row-major: `[height, width, channels]` for
    /// images. For `encoding = "png_or_jpeg"` images are decoded and resized to it, and its
    /// channels (1 or 3) pick grayscale or RGB. Required. Example: `shape = [28, 28, 1]`.
    pub shape: Vec<usize>,
    /// Number of classes: every label must be in `0..classes`. Required (counting them would
    /// mean decoding every record before training). Example: `classes = 10`.
    pub classes: NonZeroU32,
    /// How the files are compressed, as `tf.data.TFRecordDataset`'s `compression_type`.
    /// Default: `"none"`. Example: `compression = "gzip"`.
    #[serde(default)]
    pub compression: TfRecordCompression,
    /// Records held by the shuffle buffer (`tf.data.Dataset.shuffle(buffer_size)`), reshuffled
    /// every epoch from the run seed; `0` reads the files in order. This, not
    /// `data.shuffle_buffer`, shuffles a stream: memory holds at most this many records plus
    /// the prefetched batches. Default: `1024`. Example: `shuffle_buffer = 10000`.
    #[serde(default = "default_shuffle_buffer")]
    pub shuffle_buffer: usize,
}

/// `data.tfrecord.encoding`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TfRecordEncoding {
    /// One `bytes` value of `product(shape)` raw `u8` values, row-major.
    #[default]
    Raw,
    /// One `bytes` value holding a PNG or JPEG image.
    PngOrJpeg,
    /// A `float_list` of `product(shape)` values, row-major.
    Float,
}

/// `data.tfrecord.compression`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TfRecordCompression {
    /// Plain TFRecord files.
    #[default]
    None,
    /// GZIP-compressed files (`compression_type="GZIP"`).
    Gzip,
}

fn default_image() -> String {
    "image".into()
}

fn default_label() -> String {
    "label".into()
}

fn default_shuffle_buffer() -> usize {
    1024
}

impl TfRecordConfig {
    /// How each record is decoded, checked against the shape.
    pub fn example_spec(&self) -> Result<ExampleSpec, DataError> {
        let bad = |problem: String| Err(DataError::BadTfRecord { problem });
        if self.shape.is_empty() || self.shape.contains(&0) {
            return bad(format!(
                "shape = {:?} must list one or more dimensions, none 0; example: shape = [28, 28, 1]",
                self.shape
            ));
        }
        let image = match self.encoding {
            TfRecordEncoding::Raw => ImageEncoding::Raw { shape: self.shape.clone() },
            TfRecordEncoding::Float => ImageEncoding::Floats { shape: self.shape.clone() },
            TfRecordEncoding::PngOrJpeg => {
                let color_mode = match self.shape.as_slice() {
                    [_, _, 1] => ColorMode::Grayscale,
                    [_, _, 3] => ColorMode::Rgb,
                    _ => {
                        return bad(format!(
                            "shape = {:?}: encoding = \"png_or_jpeg\" needs [height, width, channels] with 1 \
                             (grayscale) or 3 (rgb) channels; example: shape = [32, 32, 3]",
                            self.shape
                        ));
                    }
                };
                let dim = |d: usize| NonZeroUsize::new(d).unwrap_or(NonZeroUsize::MIN);
                ImageEncoding::Encoded { height: dim(self.shape[0]), width: dim(self.shape[1]), color_mode }
            }
        };
        Ok(ExampleSpec {
            image_key: self.image.clone(),
            image,
            label_key: self.label.clone(),
            classes: Some(self.classes.get()),
        })
    }

    fn compression(&self) -> Compression {
        match self.compression {
            TfRecordCompression::None => Compression::None,
            TfRecordCompression::Gzip => Compression::Gzip,
        }
    }

    /// The shuffle buffer, `None` when off.
    pub fn shuffle(&self) -> Option<NonZeroUsize> {
        NonZeroUsize::new(self.shuffle_buffer)
    }

    /// The training files, in order: names as given, globs expanded.
    pub fn train_files(&self, dir: &Path) -> Result<Vec<PathBuf>, DataError> {
        expand(dir, &self.train)
    }

    /// The test files, in order.
    pub fn test_files(&self, dir: &Path) -> Result<Vec<PathBuf>, DataError> {
        expand(dir, &self.test)
    }

    /// Plain names (not patterns) that are not files in `dir`.
    pub fn missing_files(&self, dir: &Path) -> Vec<String> {
        self.train.iter().chain(&self.test).filter(|n| !is_pattern(n) && !dir.join(n).is_file()).cloned().collect()
    }
}

fn is_pattern(name: &str) -> bool {
    name.contains(['*', '?', '['])
}

/// `names` under `dir`: each a file, or a glob pattern matching one or more files.
fn expand(dir: &Path, names: &[String]) -> Result<Vec<PathBuf>, DataError> {
    let mut files = vec![];
    for name in names {
        if !is_pattern(name) {
            files.push(dir.join(name));
            continue;
        }
        let pattern = dir.join(name);
        let bad = |problem: String| DataError::BadTfRecord { problem };
        let pattern_text = pattern.to_str().ok_or_else(|| bad(format!("{} is not UTF-8", pattern.display())))?;
        let matches = glob::glob(pattern_text).map_err(|e| bad(format!("`{name}` is not a glob pattern: {e}")))?;
        let mut found: Vec<PathBuf> = matches.filter_map(Result::ok).filter(|p| p.is_file()).collect();
        if found.is_empty() {
            return Err(bad(format!("`{name}` matches no file in {}; check data.dir and the pattern", dir.display())));
        }
        found.sort();
        files.extend(found);
    }
    Ok(files)
}

/// Records in each file (a framing pass: every length CRC checked, payloads skipped). A plain
/// file that fails at once but starts as gzip does is named as such, with the key to set.
fn count(files: &[PathBuf], compression: Compression) -> Result<Vec<usize>, DataError> {
    files
        .iter()
        .map(|f| {
            scan(f, compression).map(|offsets| offsets.len()).map_err(|e| match (compression, &e) {
                (Compression::None, DataError::BadCrc { offset: 0, .. })
                    if Compression::detect(f).is_ok_and(|c| c == Compression::Gzip) =>
                {
                    DataError::BadTfRecord {
                        problem: format!(
                            "{} is gzip-compressed; set data.tfrecord.compression = \"gzip\"",
                            f.display()
                        ),
                    }
                }
                _ => e,
            })
        })
        .collect()
}

/// One split's files as a stream of examples.
pub struct RecordSplit {
    files: Vec<PathBuf>,
    /// Records in each file.
    lens: Vec<usize>,
    compression: Compression,
    spec: ExampleSpec,
    shape: Vec<usize>,
    total: usize,
    /// The in-order stream random access reads from, and the index of its next example.
    sequential: Mutex<Option<(usize, ExampleStream)>>,
}

impl fmt::Debug for RecordSplit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordSplit").field("files", &self.files).field("lens", &self.lens).finish_non_exhaustive()
    }
}

impl RecordSplit {
    fn new(files: Vec<PathBuf>, compression: Compression, spec: ExampleSpec) -> Result<Self, DataError> {
        let lens = count(&files, compression)?;
        let shape = spec.shape();
        let total = lens.iter().sum();
        Ok(Self { files, lens, compression, spec, shape, total, sequential: Mutex::new(None) })
    }

    /// Records in each file, in order.
    pub fn file_lens(&self) -> &[usize] {
        &self.lens
    }

    /// The examples of files `files` (indices, in this order), in `order`.
    pub fn open(&self, files: &[usize], order: Order) -> RecordReader {
        let paths = files.iter().filter_map(|&f| self.files.get(f).cloned()).collect();
        RecordReader {
            stream: ExampleStream::new(paths, self.compression, self.spec.clone(), order),
            scale: self.spec.dtype() == Dtype::U8,
        }
    }

    /// The error for a stream that ends before the count its files had when the run started.
    pub fn ended_early(&self) -> DataError {
        DataError::StreamEnded { files: self.files.clone(), expected: self.total }
    }

    fn all(&self) -> Vec<usize> {
        (0..self.files.len()).collect()
    }
}

/// Examples streamed from a [`RecordSplit`], appended to batches.
pub struct RecordReader {
    stream: ExampleStream,
    /// Divide by 255 (`u8` images).
    scale: bool,
}

impl RecordReader {
    /// Appends the next example to `batch`; `false` once the stream has ended.
    pub fn append(&mut self, batch: &mut Batch) -> Result<bool, DataError> {
        let from = batch.x.len();
        batch.x.resize(from + self.stream.example_len(), 0.0);
        match self.stream.next_into(&mut batch.x[from..])? {
            Some(label) => {
                if self.scale {
                    // Division, not multiplication by 1/255, as every other u8 source.
                    batch.x[from..].iter_mut().for_each(|v| *v /= 255.0);
                }
                batch.y.push(label);
                Ok(true)
            }
            None => {
                batch.x.truncate(from);
                Ok(false)
            }
        }
    }

    /// Reads the next example into `pending` without decoding it; `false` once the stream
    /// has ended.
    pub fn take_encoded(&mut self, pending: &mut Vec<Encoded>) -> Result<bool, DataError> {
        let next = self.stream.next_encoded()?;
        let more = next.is_some();
        pending.extend(next);
        Ok(more)
    }

    /// Decodes `pending` into `batch` in order, the examples in parallel: PNG or JPEG images
    /// take tens of microseconds each, too much for the pipeline's one thread to keep a
    /// small model fed. The values are those [`RecordReader::append`] gives.
    pub fn decode_into(&self, pending: Vec<Encoded>, batch: &mut Batch) -> Result<(), DataError> {
        let (len, decoder, scale) = (self.stream.example_len(), self.stream.decoder(), self.scale);
        let from = batch.x.len();
        batch.x.resize(from + pending.len() * len, 0.0);
        let labels: Vec<Result<u32, DataError>> = batch.x[from..]
            .par_chunks_mut(len.max(1))
            .zip(pending)
            .map(|(out, encoded)| {
                let label = decoder.decode(encoded, out)?;
                if scale {
                    // Division, not multiplication by 1/255, as every other u8 source.
                    out.iter_mut().for_each(|v| *v /= 255.0);
                }
                Ok(label)
            })
            .collect();
        for label in labels {
            batch.y.push(label?);
        }
        Ok(())
    }

    /// Skips the next `k` examples without decoding them; returns how many were skipped.
    pub fn skip(&mut self, k: usize) -> Result<usize, DataError> {
        self.stream.skip(k as u64).map(|n| n as usize)
    }
}

impl Examples for RecordSplit {
    fn len(&self) -> usize {
        self.total
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Reads in file order: forward from the last example read (skipping, not decoding, the
    /// ones in between), from the start again when `i` is behind it.
    fn append(&self, i: usize, batch: &mut Batch) -> Result<(), DataError> {
        let mut state = self.sequential.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (next, reader) = match state.take() {
            Some((next, reader)) if next <= i => (next, reader),
            _ => (0, self.open(&self.all(), Order::Files).stream),
        };
        let mut reader = RecordReader { stream: reader, scale: self.spec.dtype() == Dtype::U8 };
        if reader.skip(i - next)? < i - next || !reader.append(batch)? {
            return Err(self.ended_early());
        }
        *state = Some((i + 1, reader.stream));
        Ok(())
    }

    /// Records are read as batches are made: nothing is held but the reader's buffers.
    fn bytes_held(&self) -> usize {
        0
    }

    fn records(&self) -> Option<&RecordSplit> {
        Some(self)
    }
}

/// Both splits' files, counted.
fn read(dir: &Path, config: &TfRecordConfig) -> Result<(RecordSplit, Option<RecordSplit>), DataError> {
    let spec = config.example_spec()?;
    let train = RecordSplit::new(config.train_files(dir)?, config.compression(), spec.clone())?;
    let test_files = config.test_files(dir)?;
    let test =
        if test_files.is_empty() { None } else { Some(RecordSplit::new(test_files, config.compression(), spec)?) };
    Ok((train, test))
}

/// Example counts (a framing pass over every file), shape, classes and the training files.
pub fn facts(dir: &Path, config: &TfRecordConfig) -> Result<DataFacts, DataError> {
    let (train, test) = read(dir, config)?;
    let files = train.files.len();
    Ok(dataset(train, test, config).facts(files))
}

/// Counts the records of every file; examples are read as batches are made.
pub fn load(dir: &Path, config: &TfRecordConfig) -> Result<Dataset, DataError> {
    let (train, test) = read(dir, config)?;
    Ok(dataset(train, test, config))
}

fn dataset(train: RecordSplit, test: Option<RecordSplit>, config: &TfRecordConfig) -> Dataset {
    Dataset {
        train: Split::of(train),
        test: test.map(Split::of),
        labels: LabelKind::Class { classes: config.classes.get() },
        vocabulary: None,
        classes: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::formats::bench::raw_image_example;
    use crate::data::formats::tfrecord::write_record;

    #[test]
    fn reads_by_index_in_file_order_across_files_and_backwards() {
        let dir = tempfile::tempdir().unwrap();
        for (f, range) in [(0, 0..3), (1, 3..7)] {
            let mut bytes = vec![];
            for i in range {
                write_record(&mut bytes, &raw_image_example(vec![i as u8 * 10; 2], i)).unwrap();
            }
            std::fs::write(dir.path().join(format!("p{f}.tfrecord")), bytes).unwrap();
        }
        let config: TfRecordConfig =
            toml::from_str("train = [\"p*.tfrecord\"]\nshape = [2]\nclasses = 7\nshuffle_buffer = 0").unwrap();
        let data = load(dir.path(), &config).unwrap();
        assert_eq!((data.train.len(), data.train.records().map(RecordSplit::file_lens)), (7, Some(&[3, 4][..])));
        let b = data.train.read(2..5).unwrap();
        assert_eq!(
            (b.y, b.x),
            (vec![2, 3, 4], vec![20. / 255., 20. / 255., 30. / 255., 30. / 255., 40. / 255., 40. / 255.])
        );
        assert_eq!(data.train.read(0..1).unwrap().y, [0], "a read behind the last one starts again");
        assert_eq!(facts(dir.path(), &config).unwrap().train_files, 2);

        // Taken whole and decoded in parallel, the same values and labels as one by one; past
        // the end, nothing more is taken.
        let records = data.train.records().unwrap();
        let (mut one, mut all) = (Batch::default(), Batch::default());
        let mut reader = records.open(&[0, 1], Order::Files);
        while reader.append(&mut one).unwrap() {}
        let (mut reader, mut pending) = (records.open(&[0, 1], Order::Files), vec![]);
        while reader.take_encoded(&mut pending).unwrap() {}
        assert_eq!(pending.len(), 7);
        reader.decode_into(pending, &mut all).unwrap();
        assert_eq!((all.x, all.y), (one.x, one.y));
    }
}
