//! Preprocessing declared in the spec (`[data.preprocessing]`), resolved by the planner into a
//! [`Preprocessing`] and applied to a loaded [`Dataset`] by [`Preprocessing::apply`]: Keras'
//! `validation_split` carves the test split from the end of the training split, `rescale` and
//! `normalize` change values, and the training split's random crop and flip run as the
//! pipeline's thread reads each batch, drawn from (run seed, data-epoch, example index) alone,
//! so a resumed run sees the same augmented examples and every worker count the same ones.
//!
//! A dataset without preprocessing is returned untouched: its values stay bit for bit those
//! of the source (MNIST's `byte / 255`).

mod config;
mod transform;
mod wrap;

pub use config::{AdaptWord, FlipMode, NormalizeConfig, PreprocessingConfig, RandomCropConfig};

use super::Dataset;
use super::error::DataError;
use super::examples::Split;
use serde::Serialize;
use std::sync::Arc;
use transform::Steps;
use wrap::{Preprocessed, Subset};

/// Keras `Normalization`'s floor on a standard deviation (`backend.epsilon()`), so a constant
/// channel divides by this rather than by 0.
pub const EPSILON: f32 = 1e-7;

/// Examples read at a time while computing `normalize = "adapt"`.
const ADAPT_CHUNK: usize = 1024;

/// `[data.preprocessing]`, resolved against the data's facts.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Preprocessing {
    /// Multiplier on the values the source gives (image sources already give `byte / 255`);
    /// `None` leaves them as they are.
    pub scale: Option<f32>,
    /// Per-channel normalization after `scale`.
    pub normalize: Option<Normalize>,
    /// The random crop of training images (the centre one for evaluation).
    pub crop: Option<Crop>,
    /// Mirror training images left-right with probability 1/2.
    pub flip: bool,
    /// With `validation_split`: the training examples kept; the rest become the test split.
    pub keep_for_training: Option<usize>,
}

/// Where the normalization's statistics come from.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Normalize {
    /// Given in the spec.
    Given(Normalization),
    /// Computed from the training split when the data is loaded.
    Adapt,
}

/// Per-channel statistics: each value becomes `(x - mean[c]) / std[c]`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Normalization {
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
}

/// A `height` × `width` window of the image padded with `padding` zeros on every side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Crop {
    pub padding: usize,
    pub height: usize,
    pub width: usize,
}

impl Preprocessing {
    /// True when nothing is done to the data.
    pub fn is_identity(&self) -> bool {
        *self == Preprocessing::default()
    }

    /// The steps in order, for `trainrun check`; `None` when there are none.
    pub fn describe(&self) -> Option<String> {
        let mut steps = vec![];
        if let Some(keep) = self.keep_for_training {
            steps.push(format!("validation split after {keep} training examples"));
        }
        if let Some(s) = self.scale {
            steps.push(format!("rescale × {s}"));
        }
        match &self.normalize {
            Some(Normalize::Given(n)) => steps.push(format!("normalize (mean {:?}, std {:?})", n.mean, n.std)),
            Some(Normalize::Adapt) => steps.push("normalize (statistics of the training split)".into()),
            None => {}
        }
        if let Some(c) = self.crop {
            steps.push(format!("random crop {}×{} of the image padded by {}", c.height, c.width, c.padding));
        }
        if self.flip {
            steps.push("random horizontal flip".into());
        }
        (!steps.is_empty()).then(|| steps.join(", "))
    }

    /// `data` preprocessed: the validation split carved, the statistics of
    /// `normalize = "adapt"` computed, and both splits wrapped so reading them transforms
    /// each example (the training split's random draws keyed by `seed`). Also returns the
    /// statistics computed, for `run.json`.
    pub fn apply(&self, data: Dataset, seed: u64) -> Result<(Dataset, Option<Normalization>), DataError> {
        self.apply_with_test(data, None, seed)
    }

    /// [`Preprocessing::apply`] with `inputs` as the test split in place of the source's (and
    /// of a validation split): the files `trainrun predict --input` reads, transformed as the
    /// test split is, with the statistics of the same training examples.
    pub fn apply_to_inputs(&self, data: Dataset, inputs: Split, seed: u64) -> Result<Dataset, DataError> {
        let data = Dataset { test: None, ..data };
        self.apply_with_test(data, Some(inputs), seed).map(|(data, _)| data)
    }

    fn apply_with_test(
        &self,
        data: Dataset,
        inputs: Option<Split>,
        seed: u64,
    ) -> Result<(Dataset, Option<Normalization>), DataError> {
        if self.is_identity() {
            return Ok((Dataset { test: inputs.or(data.test), ..data }, None));
        }
        let Dataset { mut train, mut test, labels, vocabulary, classes } = data;
        if let Some(keep) = self.keep_for_training {
            let len = train.len();
            if keep == 0 || keep >= len || test.is_some() {
                return Err(DataError::BadPreprocessing {
                    problem: format!(
                        "validation_split keeps {keep} of {len} training examples{}; the data changed since it was planned",
                        if test.is_some() { " although the source has a test split" } else { "" }
                    ),
                });
            }
            test = Some(Split::of(Subset::new(train.clone(), keep..len)));
            train = Split::of(Subset::new(train, 0..keep));
        }
        if inputs.is_some() {
            test = inputs;
        }
        let (normalization, computed) = match &self.normalize {
            None => (None, None),
            Some(Normalize::Given(n)) => (Some(n.clone()), None),
            Some(Normalize::Adapt) => {
                let n = adapt(&train, self.scale)?;
                (Some(n.clone()), Some(n))
            }
        };
        let steps = Arc::new(Steps::new(self.scale, normalization.as_ref(), self.crop, self.flip));
        let train = Split::of(Preprocessed::new(train, steps.clone(), Some(seed))?);
        let test = test.map(|t| Preprocessed::new(t, steps, None).map(Split::of)).transpose()?;
        Ok((Dataset { train, test, labels, vocabulary, classes }, computed))
    }
}

/// Keras `Normalization.adapt`: each channel's mean and (population) standard deviation over
/// every value of `train` after `scale`, summed in `f64` in example order so every worker
/// computes the same bits.
fn adapt(train: &Split, scale: Option<f32>) -> Result<Normalization, DataError> {
    let channels = train.shape().last().copied().unwrap_or(1).max(1);
    let mut sum = vec![0f64; channels];
    let mut squares = vec![0f64; channels];
    let mut count = 0u64;
    for start in (0..train.len()).step_by(ADAPT_CHUNK) {
        let batch = train.read(start..start + ADAPT_CHUNK)?;
        for pixel in batch.x.chunks_exact(channels) {
            for (c, &v) in pixel.iter().enumerate() {
                let v = f64::from(scale.map_or(v, |s| v * s));
                sum[c] += v;
                squares[c] += v * v;
            }
            count += 1;
        }
    }
    if count == 0 {
        return Err(DataError::BadPreprocessing {
            problem: "normalize = \"adapt\" has no training examples to compute statistics from".into(),
        });
    }
    let n = count as f64;
    let mean: Vec<f64> = sum.iter().map(|s| s / n).collect();
    let std = squares.iter().zip(&mean).map(|(q, m)| ((q / n - m * m).max(0.0).sqrt() as f32).max(EPSILON)).collect();
    Ok(Normalization { mean: mean.into_iter().map(|m| m as f32).collect(), std })
}

#[cfg(test)]
mod tests;
