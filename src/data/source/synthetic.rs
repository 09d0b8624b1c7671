//! The `synthetic` source: seeded random `u8` images that a model can learn. Each class has a
//! fixed random pattern of bright pixels; every example is its class's pattern plus uniform
//! noise, so accuracy climbs from chance as a model trains, and benchmarks measure real work.
//!
//! Each example is generated from its own stream (a hash of seed, split and index), so the data
//! depends on the seed alone and test examples differ from training ones.

use super::idx::IdxArray;
use super::{DataSource, RawValues};
use crate::data::error::DataError;
use crate::data::{DataFacts, Dataset, ExampleShape, LabelKind, Split};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::num::NonZeroUsize;
use std::path::Path;

/// `[data.synthetic]`: a seeded random dataset for benchmarks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SyntheticConfig {
    /// Training examples. Default: `60000`. Example: `train_examples = 50000`.
    #[serde(default = "default_synthetic_train")]
    pub train_examples: NonZeroUsize,
    /// Test examples. Default: `10000`. Example: `test_examples = 10000`.
    #[serde(default = "default_synthetic_test")]
    pub test_examples: usize,
    /// Shape of one example, height × width or height × width × channels.
    /// Default: `[28, 28]`. Example: `shape = [32, 32, 3]`.
    #[serde(default = "default_synthetic_shape")]
    #[schemars(length(min = 1, max = 3))]
    pub shape: Vec<NonZeroUsize>,
    /// Number of classes. Default: `10`. Example: `classes = 100`.
    #[serde(default = "default_synthetic_classes")]
    #[schemars(range(min = 2, max = 256))]
    pub classes: u32,
}

fn nz(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).unwrap_or(NonZeroUsize::MIN)
}

fn default_synthetic_train() -> NonZeroUsize {
    nz(60_000)
}

fn default_synthetic_test() -> usize {
    10_000
}

fn default_synthetic_shape() -> Vec<NonZeroUsize> {
    vec![nz(28), nz(28)]
}

fn default_synthetic_classes() -> u32 {
    10
}

impl Default for SyntheticConfig {
    fn default() -> Self {
        Self {
            train_examples: default_synthetic_train(),
            test_examples: default_synthetic_test(),
            shape: default_synthetic_shape(),
            classes: default_synthetic_classes(),
        }
    }
}

/// `data.dataset = "synthetic"`: `[data.synthetic]`, generated from the run seed.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticSource {
    pub config: SyntheticConfig,
    pub seed: u64,
}

impl DataSource for SyntheticSource {
    fn name(&self) -> &'static str {
        "synthetic"
    }

    /// Generated in memory: no folder.
    fn dir(&self) -> Option<&Path> {
        None
    }

    fn missing_files(&self) -> Vec<String> {
        vec![]
    }

    /// The facts of a synthetic dataset, straight from the spec.
    fn facts(&self) -> Result<DataFacts, DataError> {
        let spec = &self.config;
        check(spec)?;
        Ok(DataFacts {
            train_examples: spec.train_examples.get(),
            test_examples: spec.test_examples,
            example_shape: shape_of(spec)?.dims(),
            labels: LabelKind::Class { classes: spec.classes },
            train_files: 0,
            warnings: vec![],
        })
    }

    /// Generates the dataset `[data.synthetic]` describes, deterministically from `seed`.
    fn load(&self) -> Result<Dataset, DataError> {
        let (spec, seed) = (&self.config, self.seed);
        check(spec)?;
        let shape = shape_of(spec)?;
        let len = shape.len();
        let classes = spec.classes as usize;
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ DOMAIN);
        // About a quarter of the pixels are bright in each class's pattern.
        let patterns: Vec<u8> = (0..classes * len).map(|_| if rng.next_u32() % 4 == 0 { PATTERN } else { 0 }).collect();
        let make = |n: usize, stream: u64| split(&patterns, shape, classes, n, mix(seed, stream));
        let train = make(spec.train_examples.get(), 0);
        let test = (spec.test_examples > 0).then(|| make(spec.test_examples, 1));
        Ok(Dataset { train, test, labels: LabelKind::Class { classes: spec.classes }, vocabulary: None, classes: None })
    }

    fn raw_values(&self) -> RawValues {
        RawValues::Bytes
    }
}

/// Separates this use of the run seed from its other uses (weights, shuffling).
const DOMAIN: u64 = 0x5359_4e54_4845_5449; // "SYNTHETI"
/// Brightness a class pattern adds to its pixels.
const PATTERN: u8 = 64;
/// Noise is the low seven bits of random bytes (uniform in 0..=127): with the pattern on top a
/// pixel stays at most 191, so eight pixels are summed at once in one `u64` without carries.
const NOISE_MASK: u64 = 0x7f7f_7f7f_7f7f_7f7f;

/// The example shape `[data.synthetic]` describes: `[w]`, `[h, w]` or `[h, w, c]`.
pub fn shape_of(spec: &SyntheticConfig) -> Result<ExampleShape, DataError> {
    let dims: Vec<usize> = spec.shape.iter().map(|d| d.get()).collect();
    let (height, width, channels) = match dims[..] {
        [w] => (1, w, 1),
        [h, w] => (h, w, 1),
        [h, w, c] => (h, w, c),
        _ => {
            return Err(DataError::BadSynthetic {
                problem: format!(
                    "shape = {dims:?} has {} dimensions; give [height, width] or \
                     [height, width, channels], e.g. shape = [28, 28]",
                    dims.len()
                ),
            });
        }
    };
    Ok(ExampleShape { height, width, channels })
}

fn check(spec: &SyntheticConfig) -> Result<(), DataError> {
    if !(2..=256).contains(&spec.classes) {
        return Err(DataError::BadSynthetic {
            problem: format!("classes = {} is out of range; labels are bytes, so use 2 to 256", spec.classes),
        });
    }
    let len = shape_of(spec)?.len();
    let examples = spec.train_examples.get().saturating_add(spec.test_examples);
    if len.checked_mul(examples).is_none_or(|b| b > isize::MAX as usize) {
        return Err(DataError::BadSynthetic {
            problem: format!("{examples} examples of {len} bytes do not fit in memory"),
        });
    }
    Ok(())
}

fn split(patterns: &[u8], shape: ExampleShape, classes: usize, n: usize, base: u64) -> Split {
    let len = shape.len();
    let mut images = vec![0u8; n * len];
    let mut labels = vec![0u8; n];
    for (i, (image, label)) in images.chunks_exact_mut(len.max(1)).zip(labels.iter_mut()).enumerate() {
        let mut stream = SplitMix64(mix(base, i as u64));
        let class = (stream.next() % classes as u64) as usize;
        *label = class as u8;
        let pattern = &patterns[class * len..(class + 1) * len];
        // Eight pixels per random draw and per add keep 60k MNIST-sized images in the tens
        // of milliseconds.
        let mut pixels = image.chunks_exact_mut(8);
        let mut bright = pattern.chunks_exact(8);
        for (p, b) in pixels.by_ref().zip(bright.by_ref()) {
            let b = u64::from_le_bytes(b.try_into().unwrap_or_default());
            p.copy_from_slice(&(b + (stream.next() & NOISE_MASK)).to_le_bytes());
        }
        let noise = stream.next().to_le_bytes();
        for ((p, &b), &r) in pixels.into_remainder().iter_mut().zip(bright.remainder()).zip(&noise) {
            *p = b + (r & 0x7f);
        }
    }
    let dims = vec![n, shape.height, shape.width, shape.channels];
    Split::new(IdxArray::from_parts(dims, images), IdxArray::from_parts(vec![n], labels), shape)
}

/// A well-mixed 64-bit hash of two words (MurmurHash3's finaliser over their combination), so
/// neighbouring examples get unrelated streams.
fn mix(a: u64, b: u64) -> u64 {
    let mut z = (a ^ DOMAIN).wrapping_add(b.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
    z = (z ^ (z >> 33)).wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    z ^ (z >> 33)
}

/// SplitMix64: tiny and fast, ample for noise pixels.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroUsize;

    fn source(config: &SyntheticConfig, seed: u64) -> SyntheticSource {
        SyntheticSource { config: config.clone(), seed }
    }

    fn spec(train: usize, test: usize, shape: &[usize], classes: u32) -> SyntheticConfig {
        SyntheticConfig {
            train_examples: NonZeroUsize::new(train).unwrap(),
            test_examples: test,
            shape: shape.iter().map(|&d| NonZeroUsize::new(d).unwrap()).collect(),
            classes,
        }
    }

    #[test]
    fn same_seed_same_data_other_seed_other_data() {
        let s = spec(100, 20, &[8, 8, 3], 5);
        let a = source(&s, 1).load().unwrap();
        let all = |d: &Dataset| d.train.read(0..d.train.len()).unwrap();
        assert_eq!(all(&a), all(&source(&s, 1).load().unwrap()));
        assert_ne!(all(&a).x, all(&source(&s, 2).load().unwrap()).x);
        assert_eq!(a.train.example_len(), 192);
        assert_eq!(all(&a).x.len(), 100 * 192);
        let test = a.test.as_ref().unwrap();
        assert_eq!(test.len(), 20);
        assert_ne!(test.read(0..1).unwrap().x, a.train.read(0..1).unwrap().x);
        assert!(all(&a).y.iter().all(|&l| l < 5));
    }

    #[test]
    fn nearest_pattern_classifies_well_above_chance() {
        // A class-mean classifier fitted on train must beat chance by far on test: the data is
        // learnable, so accuracy numbers from it mean something.
        let data = source(&spec(2000, 500, &[28, 28], 10), 7).load().unwrap();
        let len = 784;
        let mut means = vec![0f64; 10 * len];
        let mut counts = [0f64; 10];
        let train = data.train.read(0..data.train.len()).unwrap();
        for (&c, image) in train.y.iter().zip(train.x.chunks(len)) {
            let c = c as usize;
            counts[c] += 1.0;
            for (m, &p) in means[c * len..].iter_mut().zip(image) {
                *m += f64::from(p);
            }
        }
        for c in 0..10 {
            means[c * len..(c + 1) * len].iter_mut().for_each(|m| *m /= counts[c]);
        }
        let test = data.test.as_ref().unwrap();
        let batch = test.read(0..test.len()).unwrap();
        let correct = (0..test.len())
            .filter(|&i| {
                let image = &batch.x[i * len..(i + 1) * len];
                let dist = |c: usize| -> f64 {
                    let m = &means[c * len..(c + 1) * len];
                    m.iter().zip(image).map(|(a, &b)| (a - f64::from(b)).powi(2)).sum()
                };
                let best = (0..10).min_by(|&a, &b| dist(a).total_cmp(&dist(b)));
                best == Some(batch.y[i] as usize)
            })
            .count();
        assert!(correct * 10 > test.len() * 9, "{correct} / {}", test.len());
    }

    #[test]
    fn bad_specs_are_errors() {
        let err = source(&spec(10, 0, &[4, 4], 1), 0).load().unwrap_err().to_string();
        assert!(err.contains("classes = 1 is out of range"), "{err}");
        let err = shape_of(&spec(10, 0, &[2, 2, 2, 2], 3)).unwrap_err().to_string();
        assert!(err.contains("has 4 dimensions"), "{err}");
        let err = source(&spec(usize::MAX, 0, &[1 << 20], 3), 0).facts().unwrap_err().to_string();
        assert!(err.contains("do not fit in memory"), "{err}");
        assert!(source(&spec(3, 0, &[5], 256), 0).load().unwrap().test.is_none());
    }
}
