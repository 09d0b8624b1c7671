//! What the readers of random-access formats share: [`RandomAccess`] (the number of
//! examples, one example's shape and source [`Dtype`], all [`Labels`], small, so held in
//! memory, and `read(i, out)`, which converts example `i` to `f32` without rescaling: a `u8`
//! pixel stays `0.0..=255.0`; scaling is a preprocessing step), the [`Classes`] of string
//! labels, and the checks every reader makes. The readers live with their sources:
//! `source/npy`, `source/csv.rs`, `source/image_folder`, `source/cifar`; TFRecord files are
//! streamed instead (`source/tfrecord`).
//!
//! Every malformed file is a [`DataError`] naming the file and the place: line and column,
//! record index or byte offset.
//!
//! [`bench`] measures the two throughput targets (PNG folder decoding, TFRecord streaming) on
//! data it generates.

pub mod bench;
pub(crate) mod dtype;

use super::error::DataError;
pub use dtype::Dtype;
use std::path::Path;

/// Why stored float features cannot be trained on: the first value that is NaN or infinite
/// (after conversion to `f32`), by its place in the example. A NaN in the data would
/// otherwise surface steps later as diverged weights, blamed on the learning rate.
pub fn non_finite(values: &[f32]) -> Option<String> {
    let (j, v) = values.iter().enumerate().find(|(_, v)| !v.is_finite())?;
    Some(format!("value {j} of the example is {v}, not a finite number; drop the example or fill the value in"))
}

/// Why `label` is no class index: negative, fractional, or `classes` or more.
pub fn not_a_class(label: f64, classes: Option<u32>) -> String {
    match classes {
        Some(n) => format!("label {label} is not a class index, which must be in 0..{n}"),
        None => format!("label {label} is not a class index, which must be a whole number from 0"),
    }
}

/// The names of a dataset's classes; class `i` is `names()[i]`. Written by the run as
/// `classes.json` so predictions can be mapped back.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(transparent)]
pub struct Classes {
    names: Vec<String>,
}

impl Classes {
    /// Classes with these names, in index order.
    pub fn from_names(names: Vec<String>) -> Self {
        Self { names }
    }

    /// `count` classes named by their index (`"0"`, `"1"`, …), for integer labels.
    pub fn numbered(count: u32) -> Self {
        Self { names: (0..count).map(|i| i.to_string()).collect() }
    }

    /// Number of classes.
    pub fn len(&self) -> u32 {
        self.names.len() as u32
    }

    /// True when there are no classes.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The names, in index order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The index of the class named `name`.
    pub fn index_of(&self, name: &str) -> Option<u32> {
        self.names.iter().position(|n| n == name).map(|i| i as u32)
    }
}

/// The labels of every example of a random-access dataset.
#[derive(Debug, Clone, PartialEq)]
pub enum Labels {
    /// Classification: one class index per example, each below `classes.len()`.
    Classes { index: Vec<u32>, classes: Classes },
    /// Regression: `width` float targets per example, row-major.
    Targets { values: Vec<f32>, width: usize },
}

impl Labels {
    /// Number of examples labelled.
    pub fn len(&self) -> usize {
        match self {
            Labels::Classes { index, .. } => index.len(),
            Labels::Targets { values, width } => values.len() / (*width).max(1),
        }
    }

    /// True when no example is labelled.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The class of example `i` (`None` for regression labels or out of range).
    pub fn class(&self, i: usize) -> Option<u32> {
        match self {
            Labels::Classes { index, .. } => index.get(i).copied(),
            Labels::Targets { .. } => None,
        }
    }

    /// The targets of example `i` (`None` for class labels or out of range).
    pub fn targets(&self, i: usize) -> Option<&[f32]> {
        match self {
            Labels::Classes { .. } => None,
            Labels::Targets { values, width } => values.get(i * width..(i + 1) * width),
        }
    }

    /// The name of the one class every example has, when there is exactly one: a classifier
    /// that has nothing to learn.
    pub fn single_class(&self) -> Option<&str> {
        let Labels::Classes { index, classes } = self else { return None };
        let first = *index.first()?;
        let name = classes.names().get(first as usize).map(String::as_str);
        index.iter().all(|&i| i == first).then_some(name).flatten()
    }

    /// The classes, for classification labels.
    pub fn classes(&self) -> Option<&Classes> {
        match self {
            Labels::Classes { classes, .. } => Some(classes),
            Labels::Targets { .. } => None,
        }
    }
}

/// A dataset whose examples can be read in any order.
pub trait RandomAccess: Send + Sync {
    /// Number of examples.
    fn len(&self) -> usize;

    /// The shape of one example's features (for images: height, width, channels).
    fn shape(&self) -> &[usize];

    /// The element type of the features as stored in the file.
    fn dtype(&self) -> Dtype;

    /// Every example's label.
    fn labels(&self) -> &Labels;

    /// Writes example `i`'s features into `out`, once [`RandomAccess::read`] has checked that
    /// `i` is in range and `out` holds one example: call `read`, not this.
    fn read_at(&self, i: usize, out: &mut [f32]) -> Result<(), DataError>;

    /// Writes example `i`'s features, converted to `f32` but not rescaled, into `out`, which
    /// must hold exactly [`RandomAccess::example_len`] values.
    fn read(&self, i: usize, out: &mut [f32]) -> Result<(), DataError> {
        check_index(i, self.len())?;
        check_buffer(self.example_len(), out.len())?;
        self.read_at(i, out)
    }

    /// True when there are no examples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Values in one example: the product of [`RandomAccess::shape`].
    fn example_len(&self) -> usize {
        self.shape().iter().product()
    }

    /// Reads `indices` into consecutive slots of `out` (`indices.len() × example_len()`
    /// values). Readers whose examples are costly to decode do this in parallel.
    fn read_many(&self, indices: &[usize], out: &mut [f32]) -> Result<(), DataError> {
        let len = self.example_len();
        check_buffer(indices.len() * len, out.len())?;
        indices.iter().zip(out.chunks_exact_mut(len.max(1))).try_for_each(|(&i, slot)| self.read(i, slot))
    }
}

/// The error for an I/O failure on `path`.
pub(crate) fn io_error(path: &Path) -> impl Fn(std::io::Error) -> DataError + '_ {
    move |source| DataError::Read { path: path.to_path_buf(), source }
}

/// Checks `index < examples`.
pub(crate) fn check_index(index: usize, examples: usize) -> Result<(), DataError> {
    if index < examples { Ok(()) } else { Err(DataError::ExampleOutOfRange { index, examples }) }
}

/// Checks an output buffer's length.
pub(crate) fn check_buffer(expected: usize, found: usize) -> Result<(), DataError> {
    if expected == found { Ok(()) } else { Err(DataError::BufferLength { expected, found }) }
}

/// Sorted, de-duplicated names and, for each of `values`, the index of its name: how string
/// labels become classes (as Keras sorts class folder names).
pub(crate) fn classes_from_names<S: AsRef<str>>(values: &[S]) -> (Vec<u32>, Classes) {
    let mut names: Vec<String> = values.iter().map(|v| v.as_ref().to_string()).collect();
    names.sort_unstable();
    names.dedup();
    let index = values
        .iter()
        // Every value is in `names`, so the search always succeeds.
        .map(|v| names.binary_search_by(|n| n.as_str().cmp(v.as_ref())).unwrap_or_default() as u32)
        .collect();
    (index, Classes { names })
}

/// Example `i` of `data` (test helper).
#[cfg(test)]
pub(crate) fn read_one(data: &dyn RandomAccess, i: usize) -> Vec<f32> {
    let mut out = vec![0.0; data.example_len()];
    data.read(i, &mut out).unwrap();
    out
}

/// Every example of `data`, in order (test helper).
#[cfg(test)]
pub(crate) fn read_all(data: &dyn RandomAccess) -> Vec<f32> {
    let indices: Vec<usize> = (0..data.len()).collect();
    let mut out = vec![0.0; indices.len() * data.example_len()];
    data.read_many(&indices, &mut out).unwrap();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_labels_become_sorted_classes() {
        let (index, classes) = classes_from_names(&["dog", "cat", "dog", "bird"]);
        assert_eq!(classes.names(), ["bird", "cat", "dog"]);
        assert_eq!(index, [2, 1, 2, 0]);
        assert_eq!(classes.index_of("cat"), Some(1));
        assert_eq!(serde_json::to_string(&classes).unwrap(), r#"["bird","cat","dog"]"#);
    }

    #[test]
    fn labels_answer_by_kind() {
        let targets = Labels::Targets { values: vec![1.0, 2.0, 3.0, 4.0], width: 2 };
        assert_eq!(targets.len(), 2);
        assert_eq!(targets.targets(1), Some(&[3.0, 4.0][..]));
        assert_eq!(targets.class(0), None);
        let classes = Labels::Classes { index: vec![0, 2], classes: Classes::numbered(3) };
        assert_eq!(classes.class(1), Some(2));
        assert_eq!(classes.targets(0), None);
        assert_eq!(classes.classes().map(Classes::names), Some(&["0".to_string(), "1".into(), "2".into()][..]));
    }
}
