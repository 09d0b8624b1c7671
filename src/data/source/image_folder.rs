//! The `image_folder` source: Keras' `image_dataset_from_directory` layout,
//! `<data.dir>/<split>/<class>/…/*.png|jpg|jpeg`. Classes are the class folder names, sorted,
//! written to the run folder as `classes.json`; images are decoded when a batch is read, in
//! parallel, resized to `image_size` and divided by 255. An unreadable image stops the run
//! with exit 4 naming the file.
//!
//! The folders are read here too ([`ImageFolder`]). As in Keras, classes are the class folder names,
//! sorted; images are found in each class folder and its subfolders (sorted by folder, then
//! by name; extensions in any case; other files ignored), class by class; each image is
//! decoded to grayscale or RGB and resized to `image_size` with bilinear interpolation
//! (see [`resize`]). Folders starting with `.` are not classes.
//!
//! Differences from Keras: an empty class folder is an error (Keras trains silently without
//! the class); grayscale conversion of colour images uses the `image` crate's Rec. 709 weights
//! (TensorFlow's decoders use Rec. 601; a few levels apart); and JPEGs are decoded by
//! zune-jpeg, not libjpeg-turbo, whose rounding and 4:2:0 chroma upsampling differ by a few
//! levels on photographs (up to ~20 at sharp colour edges, measured against Pillow).
//!
//! Images are decoded when read, in parallel over rayon in [`RandomAccess::read_many`]; with
//! `cache`, each decoded image (before resizing, one byte per value) is kept for later epochs.

pub(crate) mod resize;
#[cfg(test)]
mod tests;

use super::{DataSource, RawValues, require};
use crate::data::arrays::{Arrays, classes_of, label_kind};
use crate::data::error::DataError;
use crate::data::examples::Split;
use crate::data::formats::{Classes, Dtype, Labels, RandomAccess, check_buffer, io_error};
use crate::data::{DataFacts, Dataset};
use rayon::prelude::*;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::io::Cursor;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

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

/// `data.dataset = "image_folder"`: `[data.image_folder]`'s split folders in `dir`.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageFolderSource {
    pub dir: PathBuf,
    pub config: ImageFolderConfig,
}

impl DataSource for ImageFolderSource {
    fn name(&self) -> &'static str {
        "image_folder"
    }

    fn dir(&self) -> Option<&Path> {
        Some(&self.dir)
    }

    /// The split folders that are not there, each ending in `/`.
    fn missing_files(&self) -> Vec<String> {
        self.config.folders().into_iter().filter(|f| !self.dir.join(f).is_dir()).map(|f| format!("{f}/")).collect()
    }

    /// Example counts, shape and classes, from listing the folders.
    fn facts(&self) -> Result<DataFacts, DataError> {
        self.load().map(|d| d.facts(1))
    }

    /// Lists the folders; images are decoded as batches are read.
    fn load(&self) -> Result<Dataset, DataError> {
        require(self.name(), &self.dir, self.missing_files())?;
        let (dir, config) = (&self.dir, &self.config);
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

    /// A PNG or JPEG file, or a folder of them (found and ordered as a class folder's are),
    /// decoded to `color_mode`, resized to `image_size` and divided by 255 as the test split's
    /// images are.
    fn read_input(&self, file: &Path) -> Result<Split, DataError> {
        let images = if file.is_dir() { images_in(file)? } else { vec![file.to_path_buf()] };
        if images.is_empty() {
            return Err(DataError::Unsupported {
                path: file.to_path_buf(),
                what: "the folder holds no .png, .jpg or .jpeg image, in it or its subfolders; give image files or \
                       a folder that holds them"
                    .into(),
            });
        }
        let options = self.config.options();
        let [height, width] = self.config.image_size.map(NonZeroUsize::get);
        let shape = [height, width, options.color_mode.channels()];
        let len = shape.iter().product();
        let mut values = vec![0.0; images.len() * len];
        values.par_chunks_mut(len).zip(images.par_iter()).try_for_each(|(out, path)| {
            let image = decode(path, options.color_mode)?;
            resize::bilinear(&image.pixels, (image.height, image.width), shape[2], out, (height, width));
            // Division, not multiplication by 1/255, as the test split's reader.
            out.iter_mut().for_each(|v| *v /= 255.0);
            Ok::<_, DataError>(())
        })?;
        crate::data::Unlabeled::split(file, shape.to_vec(), values)
    }

    fn raw_values(&self) -> RawValues {
        RawValues::Bytes
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

/// The channels images are decoded to (Keras' `color_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ColorMode {
    /// One channel (colour images are converted).
    Grayscale,
    /// Three channels, red, green, blue (grayscale images are repeated).
    Rgb,
}

impl ColorMode {
    /// Channels per pixel.
    pub fn channels(self) -> usize {
        match self {
            ColorMode::Grayscale => 1,
            ColorMode::Rgb => 3,
        }
    }
}

/// How images are turned into examples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageFolderOptions {
    /// Every image is resized to `(height, width)` (Keras' `image_size`).
    pub image_size: (NonZeroUsize, NonZeroUsize),
    pub color_mode: ColorMode,
    /// Keep decoded images in memory after their first read.
    pub cache: bool,
}

/// A decoded image at its own size, after colour conversion.
#[derive(Debug)]
pub(crate) struct Decoded {
    pub(crate) height: usize,
    pub(crate) width: usize,
    /// `height × width × channels` bytes, row-major.
    pub(crate) pixels: Vec<u8>,
}

/// One split of an image folder, as a [`RandomAccess`] dataset.
#[derive(Debug)]
pub struct ImageFolder {
    dir: PathBuf,
    files: Vec<PathBuf>,
    classes: Classes,
    labels: Labels,
    shape: [usize; 3],
    options: ImageFolderOptions,
    cache: Option<Vec<OnceLock<Decoded>>>,
}

const EXTENSIONS: [&str; 3] = ["png", "jpg", "jpeg"];

impl ImageFolder {
    /// Lists `split_dir` (e.g. `data/train`): one folder per class.
    pub fn open(split_dir: &Path, options: ImageFolderOptions) -> Result<Self, DataError> {
        let class_dirs = subfolders(split_dir)?;
        if class_dirs.is_empty() {
            return Err(DataError::NoClasses { dir: split_dir.to_path_buf() });
        }
        let mut files = vec![];
        let mut index = vec![];
        let mut names = vec![];
        for (class, dir) in class_dirs.iter().enumerate() {
            let images = images_in(dir)?;
            if images.is_empty() {
                return Err(DataError::EmptyClass { dir: dir.clone() });
            }
            index.extend(std::iter::repeat_n(class as u32, images.len()));
            files.extend(images);
            names.push(dir.file_name().unwrap_or_default().to_string_lossy().into_owned());
        }
        let (height, width) = options.image_size;
        let cache = options.cache.then(|| (0..files.len()).map(|_| OnceLock::new()).collect());
        let classes = Classes::from_names(names);
        Ok(Self {
            dir: split_dir.to_path_buf(),
            files,
            labels: Labels::Classes { index, classes: classes.clone() },
            classes,
            shape: [height.get(), width.get(), options.color_mode.channels()],
            options,
            cache,
        })
    }

    /// The image files, in example order.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// The classes (the class folder names, sorted).
    pub fn classes(&self) -> &Classes {
        &self.classes
    }

    /// Checks that `other` (another split) has exactly the same class folders, so a class
    /// index means the same class in both.
    pub fn check_same_classes(&self, other: &ImageFolder) -> Result<(), DataError> {
        let (a, b) = (self.classes().names(), other.classes().names());
        if a == b {
            return Ok(());
        }
        let only =
            |x: &[String], y: &[String]| x.iter().filter(|n| !y.contains(n)).cloned().collect::<Vec<_>>().join(", ");
        Err(DataError::ClassesDiffer {
            first: self.dir.clone(),
            second: other.dir.clone(),
            difference: format!("only in the first: [{}], only in the second: [{}]", only(a, b), only(b, a)),
        })
    }

    /// Decodes image `i`, or takes it from the cache.
    fn with_decoded<T>(&self, i: usize, f: impl FnOnce(&Decoded) -> T) -> Result<T, DataError> {
        match self.cache.as_ref().and_then(|c| c.get(i)) {
            Some(slot) => match slot.get() {
                Some(decoded) => Ok(f(decoded)),
                None => {
                    let decoded = decode(&self.files[i], self.options.color_mode)?;
                    // A racing reader may have filled the slot first; both decoded the same file.
                    Ok(f(slot.get_or_init(|| decoded)))
                }
            },
            None => decode(&self.files[i], self.options.color_mode).map(|d| f(&d)),
        }
    }
}

impl RandomAccess for ImageFolder {
    fn len(&self) -> usize {
        self.files.len()
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn dtype(&self) -> Dtype {
        Dtype::U8
    }

    fn labels(&self) -> &Labels {
        &self.labels
    }

    fn read_at(&self, i: usize, out: &mut [f32]) -> Result<(), DataError> {
        let [height, width, channels] = self.shape;
        self.with_decoded(i, |d| resize::bilinear(&d.pixels, (d.height, d.width), channels, out, (height, width)))
    }

    fn read_many(&self, indices: &[usize], out: &mut [f32]) -> Result<(), DataError> {
        let len = self.example_len();
        check_buffer(indices.len() * len, out.len())?;
        out.par_chunks_mut(len).zip(indices.par_iter()).try_for_each(|(slot, &i)| self.read(i, slot))
    }
}

/// Decodes one file to `mode`'s channels.
fn decode(path: &Path, mode: ColorMode) -> Result<Decoded, DataError> {
    let bytes = std::fs::read(path).map_err(io_error(path))?;
    decode_bytes(&bytes, mode).map_err(|e| DataError::Image { path: path.to_path_buf(), source: Box::new(e) })
}

/// Decodes a PNG or JPEG held in memory (the format is told by its content, not a file
/// name) to `mode`'s channels.
pub(crate) fn decode_bytes(bytes: &[u8], mode: ColorMode) -> Result<Decoded, image::ImageError> {
    let image = image::ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(image::ImageError::IoError)?
        .decode()?;
    let (width, height) = (image.width() as usize, image.height() as usize);
    let pixels = match mode {
        ColorMode::Grayscale => image.into_luma8().into_raw(),
        ColorMode::Rgb => image.into_rgb8().into_raw(),
    };
    Ok(Decoded { height, width, pixels })
}

/// The class folders of a split, sorted by name; hidden folders are skipped.
fn subfolders(dir: &Path) -> Result<Vec<PathBuf>, DataError> {
    let mut out: Vec<PathBuf> = entries(dir)?
        .into_iter()
        .filter(|(path, is_dir)| *is_dir && !path.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')))
        .map(|(path, _)| path)
        .collect();
    out.sort();
    Ok(out)
}

/// The images under a class folder, as Keras orders them: by folder, then by file name.
/// Links to folders are followed, as Keras does, but never into a folder the walk already
/// reached: `a/loop -> ..` once walked the whole split again under class `a` until paths grew
/// too long, labelling every class's images `a`. Folders are compared by canonical path.
fn images_in(dir: &Path) -> Result<Vec<PathBuf>, DataError> {
    let mut found = vec![];
    let root = std::fs::canonicalize(dir).map_err(io_error(dir))?;
    let mut seen = std::collections::HashSet::from([root.clone()]);
    let mut pending = vec![(dir.to_path_buf(), root)];
    while let Some((folder, real_folder)) = pending.pop() {
        for (path, is_dir) in entries(&folder)? {
            if is_dir {
                let real = std::fs::canonicalize(&path).map_err(io_error(&path))?;
                let ancestor = real_folder.starts_with(&real);
                if ancestor || !seen.insert(real.clone()) {
                    return Err(DataError::FolderLoop { link: path, target: real, ancestor });
                }
                pending.push((path, real));
            } else if is_image(&path) {
                found.push(path);
            }
        }
    }
    found.sort_by(|a, b| order_key(a).cmp(&order_key(b)));
    Ok(found)
}

/// Keras' order: by folder as a string, then by file name.
fn order_key(path: &Path) -> (Option<&std::ffi::OsStr>, Option<&std::ffi::OsStr>) {
    (path.parent().map(Path::as_os_str), path.file_name())
}

fn is_image(path: &Path) -> bool {
    let ext = path.extension().map(|e| e.to_string_lossy().to_ascii_lowercase());
    ext.is_some_and(|e| EXTENSIONS.contains(&e.as_str()))
}

/// `(path, is_dir)` of each entry of `dir`; symbolic links are followed, as Keras does.
fn entries(dir: &Path) -> Result<Vec<(PathBuf, bool)>, DataError> {
    std::fs::read_dir(dir)
        .map_err(io_error(dir))?
        .map(|entry| {
            let path = entry.map_err(io_error(dir))?.path();
            Ok((path.clone(), path.is_dir()))
        })
        .collect()
}
