//! Decoding one `tf.train.Example` into `f32` features and a class label, by feature name. The
//! image feature may be raw bytes of a known shape (one `u8` per value, row-major), an encoded
//! PNG or JPEG (decoded and resized as image folders are), or a float list of a known shape;
//! the label is an `int64` class index.

use super::proto::{Example, feature::Kind};
use crate::data::error::{DataError, Position, UnknownName};
use crate::data::formats::Dtype;
use crate::data::formats::dtype::widen_u8;
use crate::data::source::image_folder::{ColorMode, decode_bytes, resize};
use prost::Message;
use prost::bytes::Bytes;
use std::num::NonZeroUsize;
use std::path::Path;

/// How the image feature is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageEncoding {
    /// One `bytes` value holding `product(shape)` raw `u8` values, row-major.
    Raw { shape: Vec<usize> },
    /// One `bytes` value holding a PNG or JPEG, decoded to `color_mode` and resized to
    /// `(height, width)`.
    Encoded { height: NonZeroUsize, width: NonZeroUsize, color_mode: ColorMode },
    /// A `float_list` of `product(shape)` values, row-major.
    Floats { shape: Vec<usize> },
}

/// Which features of each `Example` to read, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExampleSpec {
    /// Name of the image feature (e.g. `image` or `image/encoded`).
    pub image_key: String,
    pub image: ImageEncoding,
    /// Name of the `int64` label feature (e.g. `label` or `image/class/label`).
    pub label_key: String,
    /// When set, a label at or above it is an error.
    pub classes: Option<u32>,
}

impl ExampleSpec {
    /// The shape of one example's features.
    pub fn shape(&self) -> Vec<usize> {
        match &self.image {
            ImageEncoding::Raw { shape } | ImageEncoding::Floats { shape } => shape.clone(),
            ImageEncoding::Encoded { height, width, color_mode } => {
                vec![height.get(), width.get(), color_mode.channels()]
            }
        }
    }

    /// The element type of the stored features.
    pub fn dtype(&self) -> Dtype {
        match self.image {
            ImageEncoding::Raw { .. } | ImageEncoding::Encoded { .. } => Dtype::U8,
            ImageEncoding::Floats { .. } => Dtype::F32,
        }
    }

    /// Decodes the record at `offset` of `path`: features into `out` (`product(shape())`
    /// values), and the label.
    pub fn decode(&self, payload: Bytes, out: &mut [f32], path: &Path, offset: u64) -> Result<u32, DataError> {
        let malformed =
            |problem: String| DataError::Malformed { path: path.to_path_buf(), at: Position::Byte(offset), problem };
        let example = Example::decode(payload).map_err(|e| malformed(format!("not a tf.train.Example: {e}")))?;
        let features = example.features.map(|f| f.feature).unwrap_or_default();
        let feature = |key: &str| {
            features.get(key).and_then(|f| f.kind.as_ref()).ok_or_else(|| {
                let mut available: Vec<String> = features.keys().cloned().collect();
                available.sort();
                DataError::UnknownName(Box::new(UnknownName {
                    path: path.to_path_buf(),
                    at: Some(Position::Byte(offset)),
                    what: "feature",
                    name: key.to_string(),
                    available,
                }))
            })
        };
        let label = match feature(&self.label_key)? {
            Kind::Int64List(list) if list.value.len() == 1 => list.value[0],
            other => {
                return Err(malformed(format!(
                    "feature `{}` must be one int64, found {}",
                    self.label_key,
                    describe(other)
                )));
            }
        };
        if !(0..i64::from(self.classes.unwrap_or(u32::MAX))).contains(&label) {
            return Err(malformed(crate::data::formats::not_a_class(label as f64, self.classes)));
        }
        let key = &self.image_key;
        let expected = out.len();
        match (&self.image, feature(key)?) {
            (ImageEncoding::Raw { .. }, Kind::BytesList(list)) if list.value.len() == 1 => {
                let raw = &list.value[0];
                if raw.len() != expected {
                    return Err(malformed(format!(
                        "feature `{key}` holds {} bytes; the shape needs {expected}",
                        raw.len()
                    )));
                }
                widen_u8(raw, out);
            }
            (ImageEncoding::Floats { .. }, Kind::FloatList(list)) => {
                if list.value.len() != expected {
                    return Err(malformed(format!(
                        "feature `{key}` holds {} floats; the shape needs {expected}",
                        list.value.len()
                    )));
                }
                out.copy_from_slice(&list.value);
                if let Some(why) = crate::data::formats::non_finite(out) {
                    return Err(malformed(format!("feature `{key}`: {why}")));
                }
            }
            (ImageEncoding::Encoded { height, width, color_mode }, Kind::BytesList(list)) if list.value.len() == 1 => {
                let image = decode_bytes(&list.value[0], *color_mode)
                    .map_err(|e| malformed(format!("feature `{key}`: cannot decode the image: {e}")))?;
                resize::bilinear(
                    &image.pixels,
                    (image.height, image.width),
                    color_mode.channels(),
                    out,
                    (height.get(), width.get()),
                );
            }
            (ImageEncoding::Raw { .. } | ImageEncoding::Encoded { .. }, other) => {
                return Err(malformed(format!("feature `{key}` must be one bytes value, found {}", describe(other))));
            }
            (ImageEncoding::Floats { .. }, other) => {
                return Err(malformed(format!("feature `{key}` must be a float list, found {}", describe(other))));
            }
        }
        Ok(label as u32)
    }
}

/// What a feature holds, for error messages.
fn describe(kind: &Kind) -> String {
    match kind {
        Kind::BytesList(l) => format!("{} bytes values", l.value.len()),
        Kind::FloatList(l) => format!("{} floats", l.value.len()),
        Kind::Int64List(l) => format!("{} int64s", l.value.len()),
    }
}
