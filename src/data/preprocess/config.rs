//! `[data.preprocessing]`: the spec's table of Keras preprocessing layers (`Rescaling`,
//! `Normalization`, `RandomCrop`, `RandomFlip`) and Keras' `validation_split`. The planner
//! checks it against the data and resolves it into a [`Preprocessing`](super::Preprocessing).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `[data.preprocessing]`: what happens to each example between the source and the model,
/// in this order: rescale, normalize, then (training only) random crop and random flip.
/// Example:
/// ```toml
/// [data.preprocessing]
/// normalize = { mean = [0.4914, 0.4822, 0.4465], std = [0.2470, 0.2435, 0.2616] }
/// random_crop = { padding = 4 }
/// random_flip = "horizontal"
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PreprocessingConfig {
    /// Keras `Rescaling(scale)`: every raw value is multiplied by this. Raw values are bytes
    /// (`0..=255`) for image sources (`mnist`, `fashion_mnist`, `idx`, `synthetic`,
    /// `image_folder`, `cifar10`, `cifar100`) and the numbers in the file for `csv`.
    /// Default: `1/255` for image sources (pixels in `[0, 1]`), `1` for `csv`.
    /// Example: `rescale = 0.0078125` (pixels in `[0, 2]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rescale: Option<f32>,

    /// Keras `Normalization`: each value becomes `(x - mean) / std` per channel (the last
    /// axis: an image's colour channels, a table's columns), after `rescale`. Either the
    /// statistics, one per channel, or `"adapt"`: computed once from the training split at
    /// the start of the run (Keras' `adapt`) and recorded in `run.json`. Default: none.
    /// Example: `normalize = { mean = [0.1307], std = [0.3081] }`, or `normalize = "adapt"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub normalize: Option<NormalizeConfig>,

    /// Keras `RandomCrop` after zero padding, for training images: `padding` zeros are
    /// added on every side, then a random `height` × `width` window is kept. Evaluation
    /// takes the centre window. Deterministic from the run seed, the data-epoch and the
    /// example's index, so a resumed run sees the same crops. Default: none.
    /// Example: `random_crop = { padding = 4 }` (CIFAR's standard augmentation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub random_crop: Option<RandomCropConfig>,

    /// Keras `RandomFlip(mode)`: training images are mirrored with probability 1/2,
    /// deterministically from the run seed, the data-epoch and the example's index.
    /// Evaluation never flips. Default: none. Example: `random_flip = "horizontal"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub random_flip: Option<FlipMode>,

    /// Keras' `validation_split`: this fraction of the training split, taken from its end
    /// before shuffling, becomes the test split, for datasets without one. Between 0 and 1.
    /// Default: none. Example: `validation_split = 0.2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation_split: Option<f64>,
}

/// `data.preprocessing.normalize`: given statistics, or computed from the training split.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum NormalizeConfig {
    /// `"adapt"`: the mean and standard deviation of each channel over the training split.
    Adapt(AdaptWord),
    /// The mean and standard deviation of each channel.
    Given {
        /// One mean per channel. Example: `mean = [0.4914, 0.4822, 0.4465]`.
        mean: Vec<f32>,
        /// One standard deviation per channel, each above 0. Example: `std = [0.247, 0.243, 0.261]`.
        std: Vec<f32>,
    },
}

/// The word `"adapt"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AdaptWord {
    /// Compute the statistics from the training split (Keras `Normalization.adapt`).
    Adapt,
}

/// `data.preprocessing.random_crop`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RandomCropConfig {
    /// Zeros added on each side before cropping. Default: `0`. Example: `padding = 4`.
    #[serde(default)]
    pub padding: usize,
    /// Height of the crop. Default: the image's height. Example: `height = 28`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub height: Option<usize>,
    /// Width of the crop. Default: the image's width. Example: `width = 28`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub width: Option<usize>,
}

/// `data.preprocessing.random_flip`: Keras `RandomFlip`'s mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FlipMode {
    /// Mirror left and right.
    Horizontal,
}
