//! The sources read by a [`RandomAccess`] reader (`npy`, `image_folder`, `cifar10`,
//! `cifar100`) as [`Examples`]: features converted to `f32`, labels as classes or float
//! targets, and the decoding of a batch's examples done by the reader's `read_many` (in
//! parallel for image folders, on the pipeline's thread pool).
//!
//! `u8` features are divided by 255, as MNIST's are, so images land in `[0, 1]` whatever
//! file they come from; other dtypes are passed on unscaled.

use super::error::DataError;
use super::examples::{Examples, LabelKind};
use super::formats::{Classes, Dtype, Labels, RandomAccess};
use super::pipeline::Batch;
use std::fmt;

/// A [`RandomAccess`] split as [`Examples`].
pub(crate) struct Arrays<R> {
    data: R,
    /// Heap bytes the reader holds (its arrays in memory; nothing for a memory map).
    held: usize,
}

impl<R: RandomAccess> Arrays<R> {
    /// `data`, which holds `held` heap bytes besides its labels.
    pub(crate) fn new(data: R, held: usize) -> Self {
        Self { data, held }
    }
}

impl<R> fmt::Debug for Arrays<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Arrays").field("held", &self.held).finish_non_exhaustive()
    }
}

/// The label kind of `labels`.
pub(crate) fn label_kind(labels: &Labels) -> LabelKind {
    match labels {
        Labels::Classes { classes, .. } => LabelKind::Class { classes: classes.len() },
        Labels::Targets { width, .. } => LabelKind::Target { width: *width },
    }
}

/// The classes of `labels`, when they are classes.
pub(crate) fn classes_of(labels: &Labels) -> Option<Classes> {
    labels.classes().cloned()
}

impl<R: RandomAccess> Arrays<R> {
    /// Scales the `u8` values just written and appends the labels of `indices`.
    fn finish(&self, from: usize, indices: &[usize], batch: &mut Batch) {
        if self.data.dtype() == Dtype::U8 {
            // Division, not multiplication by 1/255, so the values are bit-identical to MNIST's.
            batch.x[from..].iter_mut().for_each(|v| *v /= 255.0);
        }
        match self.data.labels() {
            Labels::Classes { index, .. } => {
                batch.y.extend(indices.iter().map(|&i| index.get(i).copied().unwrap_or(0)))
            }
            labels @ Labels::Targets { .. } => {
                for &i in indices {
                    batch.targets.extend_from_slice(labels.targets(i).unwrap_or_default());
                }
            }
        }
    }
}

impl<R: RandomAccess + 'static> Examples for Arrays<R> {
    fn len(&self) -> usize {
        self.data.len()
    }

    fn shape(&self) -> &[usize] {
        self.data.shape()
    }

    fn append(&self, i: usize, batch: &mut Batch) -> Result<(), DataError> {
        self.append_many(&[i], batch)
    }

    fn append_many(&self, indices: &[usize], batch: &mut Batch) -> Result<(), DataError> {
        let from = batch.x.len();
        batch.x.resize(from + indices.len() * self.data.example_len(), 0.0);
        self.data.read_many(indices, &mut batch.x[from..])?;
        self.finish(from, indices, batch);
        Ok(())
    }

    fn bytes_held(&self) -> usize {
        let labels = match self.data.labels() {
            Labels::Classes { index, .. } => index.len() * 4,
            Labels::Targets { values, .. } => values.len() * 4,
        };
        self.held + labels
    }
}
