//! Decoding one `tf.train.Example` into `f32` features and a class label, by feature name. The
//! image feature may be raw bytes of a known shape (one `u8` per value, row-major), an encoded
//! PNG or JPEG (decoded and resized as image folders are), or a float list of a known shape;
//! the label is an `int64` class index.

use super::proto::{Example, Feature, feature::Kind};
use crate::data::error::{DataError, Position, UnknownName};
use crate::data::formats::Dtype;
use crate::data::formats::dtype::widen_u8;
use crate::data::source::image_folder::{ColorMode, decode_bytes, resize};
use prost::Message;
use prost::bytes::Bytes;
use std::collections::HashMap;
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
        let record = ParsedExample::parse(payload, path, offset)?;
        let label = match record.feature(&self.label_key)? {
            Kind::Int64List(list) if list.value.len() == 1 => list.value[0],
            other => {
                return Err(record.malformed(format!(
                    "feature `{}` must be one int64, found {}",
                    self.label_key,
                    describe(other)
                )));
            }
        };
        if !(0..i64::from(self.classes.unwrap_or(u32::MAX))).contains(&label) {
            return Err(record.malformed(crate::data::formats::not_a_class(label as f64, self.classes)));
        }
        self.features_into(&record, out)?;
        Ok(label as u32)
    }

    /// Decodes the features of the record at `offset` of `path` into `out`, with or without a
    /// label (for `predict --input`, which needs none).
    pub fn decode_features(&self, payload: Bytes, out: &mut [f32], path: &Path, offset: u64) -> Result<(), DataError> {
        self.features_into(&ParsedExample::parse(payload, path, offset)?, out)
    }

    fn features_into(&self, record: &ParsedExample<'_>, out: &mut [f32]) -> Result<(), DataError> {
        let key = &self.image_key;
        let expected = out.len();
        match (&self.image, record.feature(key)?) {
            (ImageEncoding::Raw { shape }, Kind::BytesList(list)) if list.value.len() == 1 => {
                let raw = &list.value[0];
                if raw.len() != expected {
                    return Err(record.malformed(format!(
                        "feature `{key}` holds {} bytes; the shape {shape:?} needs {expected}: {SHAPE_FIX}",
                        raw.len()
                    )));
                }
                widen_u8(raw, out);
            }
            (ImageEncoding::Floats { shape }, Kind::FloatList(list)) => {
                if list.value.len() != expected {
                    return Err(record.malformed(format!(
                        "feature `{key}` holds {} floats; the shape {shape:?} needs {expected}: {SHAPE_FIX}",
                        list.value.len()
                    )));
                }
                out.copy_from_slice(&list.value);
                if let Some(why) = crate::data::formats::non_finite(out) {
                    return Err(record.malformed(format!("feature `{key}`: {why}")));
                }
            }
            (ImageEncoding::Encoded { height, width, color_mode }, Kind::BytesList(list)) if list.value.len() == 1 => {
                let image = decode_bytes(&list.value[0], *color_mode)
                    .map_err(|e| record.malformed(format!("feature `{key}`: cannot decode the image: {e}")))?;
                resize::bilinear(
                    &image.pixels,
                    (image.height, image.width),
                    color_mode.channels(),
                    out,
                    (height.get(), width.get()),
                );
            }
            (ImageEncoding::Raw { .. } | ImageEncoding::Encoded { .. }, other) => {
                return Err(
                    record.malformed(format!("feature `{key}` must be one bytes value, found {}", describe(other)))
                );
            }
            (ImageEncoding::Floats { .. }, other) => {
                return Err(
                    record.malformed(format!("feature `{key}` must be a float list, found {}", describe(other)))
                );
            }
        }
        Ok(())
    }
}

/// What to do about a feature of another size than `data.tfrecord.shape`'s.
const SHAPE_FIX: &str = "write every example in that shape, or set data.tfrecord.shape to the examples' own";

/// One record's features, and where it is (which every error names).
struct ParsedExample<'a> {
    features: HashMap<String, Feature>,
    path: &'a Path,
    offset: u64,
}

impl<'a> ParsedExample<'a> {
    fn parse(payload: Bytes, path: &'a Path, offset: u64) -> Result<Self, DataError> {
        let record = ParsedExample { features: HashMap::new(), path, offset };
        let example = Example::decode(payload).map_err(|e| record.malformed(format!("not a tf.train.Example: {e}")))?;
        Ok(ParsedExample { features: example.features.map(|f| f.feature).unwrap_or_default(), ..record })
    }

    fn malformed(&self, problem: String) -> DataError {
        DataError::Malformed { path: self.path.to_path_buf(), at: Position::Byte(self.offset), problem }
    }

    /// Feature `key`'s values; a missing one names the features there.
    fn feature(&self, key: &str) -> Result<&Kind, DataError> {
        self.features.get(key).and_then(|f| f.kind.as_ref()).ok_or_else(|| {
            let mut available: Vec<String> = self.features.keys().cloned().collect();
            available.sort();
            DataError::UnknownName(Box::new(UnknownName {
                path: self.path.to_path_buf(),
                at: Some(Position::Byte(self.offset)),
                what: "feature",
                name: key.to_string(),
                available,
            }))
        })
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
