//! The `image_folder` source: Keras' `image_dataset_from_directory` layout,
//! `<data.dir>/<split>/<class>/*.png|jpg|jpeg`, read by
//! [`formats::image_folder`](super::formats::image_folder). Classes are the class folder
//! names, sorted, written to the run folder as `classes.json`; images are decoded when a batch
//! is read, in parallel, resized to `image_size` and divided by 255. An unreadable image stops
//! the run with exit 4 naming the file.

use super::arrays::{Arrays, classes_of, label_kind};
use super::error::DataError;
use super::examples::Split;
use super::formats::RandomAccess;
use super::formats::image_folder::{ColorMode, ImageFolder, ImageFolderOptions};
use super::{DataFacts, Dataset};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::num::NonZeroUsize;
use std::path::Path;

/// `[data.image_folder]`: the split folders and how images become examples.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ImageFolderConfig {
    /// The training split's folder, relative to `data.dir`, holding one folder per class.
    /// Default: `"train"`. Example: `train = "training"`.
    #[serde(default = "default_train")]
    pub train: String,
    /// The test split's folder, with the same class folders. Default: none (nothing is
    /// evaluated). Example: `test = "test"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test: Option<String>,
    /// `[height, width]` every image is resized to (bilinear), as Keras' `image_size`.
    /// Default: `[256, 256]` (Keras' default). Example: `image_size = [32, 32]`.
    #[serde(default = "default_image_size")]
    pub image_size: [NonZeroUsize; 2],
    /// Channels images are decoded to, as Keras' `color_mode`. Default: `"rgb"`.
    /// Example: `color_mode = "grayscale"`.
    #[serde(default = "default_color_mode")]
    pub color_mode: ColorMode,
    /// Keep decoded images in memory after their first epoch, so later epochs skip decoding
    /// (one byte per value at the files' own size). Default: `false`. Example: `cache = true`.
    #[serde(default)]
    pub cache: bool,
}

fn default_train() -> String {
    "train".into()
}

fn default_image_size() -> [NonZeroUsize; 2] {
    [NonZeroUsize::new(256).unwrap_or(NonZeroUsize::MIN); 2]
}

fn default_color_mode() -> ColorMode {
    ColorMode::Rgb
}

impl Default for ImageFolderConfig {
    /// Every key at its default (`[data.image_folder]` may be left out).
    fn default() -> Self {
        Self {
            train: default_train(),
            test: None,
            image_size: default_image_size(),
            color_mode: default_color_mode(),
            cache: false,
        }
    }
}

impl ImageFolderConfig {
    /// The split folders `data.dir` must hold.
    pub fn folders(&self) -> Vec<String> {
        std::iter::once(&self.train).chain(&self.test).cloned().collect()
    }

    fn options(&self) -> ImageFolderOptions {
        let [height, width] = self.image_size;
        ImageFolderOptions { image_size: (height, width), color_mode: self.color_mode, cache: self.cache }
    }
}

/// Lists both splits (nothing is decoded) and checks that they have the same classes.
fn read(dir: &Path, config: &ImageFolderConfig) -> Result<(ImageFolder, Option<ImageFolder>), DataError> {
    let train = ImageFolder::open(&dir.join(&config.train), config.options())?;
    let test = config.test.as_ref().map(|t| ImageFolder::open(&dir.join(t), config.options())).transpose()?;
    if let Some(test) = &test {
        train.check_same_classes(test)?;
    }
    Ok((train, test))
}

/// Example counts, shape and classes, from listing the folders.
pub fn facts(dir: &Path, config: &ImageFolderConfig) -> Result<DataFacts, DataError> {
    load(dir, config).map(|d| d.facts(1))
}

/// Lists the folders; images are decoded as batches are read.
pub fn load(dir: &Path, config: &ImageFolderConfig) -> Result<Dataset, DataError> {
    let (train, test) = read(dir, config)?;
    let (labels, classes) = (label_kind(train.labels()), classes_of(train.labels()));
    Ok(Dataset {
        train: Split::of(Arrays::new(train, 0)),
        test: test.map(|t| Split::of(Arrays::new(t, 0))),
        labels,
        vocabulary: None,
        classes,
    })
}
