//! Throughput of the two readers with targets, on data generated here: a folder of 32×32 PNGs
//! decoded and converted to `f32` (target: 20,000 images/s on two threads), and an
//! uncompressed TFRecord file streamed and decoded (target: 200 MB/s). Meant for
//! `trainrun bench` and the ignored tests in `tests/data_formats.rs`.
//!
//! The images are uniform noise, the worst case for PNG (nothing compresses, so inflating is
//! as slow as it gets); the files are read warm from the page cache, as they are from the
//! second epoch on.

use super::{RandomAccess, io_error};
use crate::data::error::DataError;
use crate::data::source::image_folder::{ColorMode, ImageFolder, ImageFolderOptions};
use crate::data::source::tfrecord::{
    Compression, ExampleSpec, ExampleStream, ImageEncoding, Order, proto, write_record,
};
use prost::Message;
use prost::bytes::Bytes;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
use rayon::prelude::*;
use std::collections::HashMap;
use std::io::{BufWriter, Write};
use std::num::NonZeroUsize;
use std::path::Path;
use std::time::Instant;

const SIDE: u32 = 32;
const CLASSES: usize = 10;
/// Examples per `read_many` call: a typical global batch.
const BATCH: usize = 256;

/// What a run read and how long it took.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Throughput {
    pub items: usize,
    pub bytes: u64,
    pub seconds: f64,
}

impl Throughput {
    /// Items (images, records) per second.
    pub fn items_per_second(&self) -> f64 {
        self.items as f64 / self.seconds
    }

    /// Megabytes (10^6 bytes) of input per second.
    pub fn megabytes_per_second(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.seconds
    }
}

impl std::fmt::Display for Throughput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} items, {:.1} MB in {:.3} s: {:.0} items/s, {:.0} MB/s",
            self.items,
            self.bytes as f64 / 1e6,
            self.seconds,
            self.items_per_second(),
            self.megabytes_per_second()
        )
    }
}

/// Noise pixels for image `i`.
fn noise(seed: u64, i: usize, len: usize) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(i as u64);
    let mut pixels = vec![0u8; len];
    rng.fill_bytes(&mut pixels);
    pixels
}

/// Writes `images` random 32×32 RGB PNGs into `split_dir/class_k/`, ten classes.
pub fn write_png_folder(split_dir: &Path, images: usize, seed: u64) -> Result<(), DataError> {
    for class in 0..CLASSES {
        let dir = split_dir.join(format!("class_{class}"));
        std::fs::create_dir_all(&dir).map_err(io_error(&dir))?;
    }
    (0..images).into_par_iter().try_for_each(|i| {
        let path = split_dir.join(format!("class_{}", i % CLASSES)).join(format!("{i:06}.png"));
        let image = image::RgbImage::from_raw(SIDE, SIDE, noise(seed, i, (SIDE * SIDE * 3) as usize));
        let image = image.ok_or_else(|| io_error(&path)(std::io::Error::other("pixel count")))?;
        image.save(&path).map_err(|e| DataError::Image { path: path.clone(), source: Box::new(e) })
    })
}

/// Reads every image of an image folder split (32×32 RGB) into `f32`, a batch at a time, on
/// `threads` threads. The folder listing is not timed.
pub fn bench_png_folder(split_dir: &Path, threads: usize) -> Result<Throughput, DataError> {
    let side = NonZeroUsize::new(SIDE as usize).unwrap_or(NonZeroUsize::MIN);
    let options = ImageFolderOptions { image_size: (side, side), color_mode: ColorMode::Rgb, cache: false };
    let folder = ImageFolder::open(split_dir, options)?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| DataError::Thread { source: std::io::Error::other(e) })?;
    let indices: Vec<usize> = (0..folder.len()).collect();
    let mut batch = vec![0f32; BATCH * folder.example_len()];
    let start = Instant::now();
    pool.install(|| {
        indices
            .chunks(BATCH)
            .try_for_each(|chunk| folder.read_many(chunk, &mut batch[..chunk.len() * folder.example_len()]))
    })?;
    let seconds = start.elapsed().as_secs_f64();
    let bytes = folder.files().iter().map(|f| std::fs::metadata(f).map_or(0, |m| m.len())).sum();
    Ok(Throughput { items: folder.len(), bytes, seconds })
}

/// An `Example` with a raw `u8` image under `image` and an `int64` under `label`.
pub fn raw_image_example(image: Vec<u8>, label: i64) -> Vec<u8> {
    use proto::feature::Kind;
    let feature = |kind| proto::Feature { kind: Some(kind) };
    let features = HashMap::from([
        ("image".to_string(), feature(Kind::BytesList(proto::BytesList { value: vec![Bytes::from(image)] }))),
        ("label".to_string(), feature(Kind::Int64List(proto::Int64List { value: vec![label] }))),
    ]);
    proto::Example { features: Some(proto::Features { feature: features }) }.encode_to_vec()
}

/// Writes `records` examples of random 32×32×3 raw images to an uncompressed TFRecord file;
/// returns its size in bytes.
pub fn write_tfrecord(path: &Path, records: usize, seed: u64) -> Result<u64, DataError> {
    let file = std::fs::File::create(path).map_err(io_error(path))?;
    let mut out = BufWriter::new(file);
    for i in 0..records {
        let payload = raw_image_example(noise(seed, i, (SIDE * SIDE * 3) as usize), (i % CLASSES) as i64);
        write_record(&mut out, &payload).map_err(io_error(path))?;
    }
    out.flush().map_err(io_error(path))?;
    Ok(std::fs::metadata(path).map_err(io_error(path))?.len())
}

/// Streams a file written by [`write_tfrecord`]: checks both CRCs of every record, decodes
/// each `Example` and converts its image to `f32`.
pub fn bench_tfrecord(path: &Path) -> Result<Throughput, DataError> {
    let bytes = std::fs::metadata(path).map_err(io_error(path))?.len();
    let spec = ExampleSpec {
        image_key: "image".into(),
        image: ImageEncoding::Raw { shape: vec![SIDE as usize, SIDE as usize, 3] },
        label_key: "label".into(),
        classes: Some(CLASSES as u32),
    };
    let mut stream = ExampleStream::new(vec![path.to_path_buf()], Compression::None, spec, Order::Files);
    let mut image = vec![0f32; stream.example_len()];
    let start = Instant::now();
    let mut items = 0;
    while stream.next_into(&mut image)?.is_some() {
        items += 1;
    }
    Ok(Throughput { items, bytes, seconds: start.elapsed().as_secs_f64() })
}
