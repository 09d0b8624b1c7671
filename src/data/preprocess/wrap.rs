//! The [`Examples`] that preprocessing puts around a source's splits: [`Subset`], a range of
//! a split (`validation_split`), and [`Preprocessed`], which transforms each example as it is
//! read, in parallel over the batch.

use super::super::error::DataError;
use super::super::examples::{Examples, Split, StreamSplit, WholeShuffle};
use super::super::pipeline::Batch;
use super::Crop;
use super::transform::{Steps, centre, place};
use rayon::prelude::*;
use std::ops::Range;
use std::sync::Arc;

/// Examples `range` of a split, renumbered from 0.
#[derive(Debug)]
pub(super) struct Subset {
    inner: Split,
    range: Range<usize>,
}

impl Subset {
    pub(super) fn new(inner: Split, range: Range<usize>) -> Self {
        Self { inner, range }
    }

    fn map(&self, indices: &[usize]) -> Vec<usize> {
        indices.iter().map(|i| self.range.start + i).collect()
    }
}

impl Examples for Subset {
    fn len(&self) -> usize {
        self.range.len()
    }

    fn shape(&self) -> &[usize] {
        self.inner.shape()
    }

    fn append(&self, i: usize, batch: &mut Batch) -> Result<(), DataError> {
        self.inner.append_many(&[self.range.start + i], batch)
    }

    fn append_many(&self, indices: &[usize], batch: &mut Batch) -> Result<(), DataError> {
        self.inner.append_many(&self.map(indices), batch)
    }

    fn bytes_held(&self) -> usize {
        // Both subsets share the source's memory: the training one counts it.
        if self.range.start == 0 { self.inner.bytes_held() } else { 0 }
    }

    fn rows_per_example(&self) -> usize {
        self.inner.rows_per_example()
    }

    fn whole_shuffle(&self) -> WholeShuffle {
        self.inner.whole_shuffle()
    }
}

/// A split whose examples are transformed as they are read. The training split has a `seed`:
/// its windows and flips are drawn per (epoch, index); without one (evaluation) the window is
/// the centre one and nothing is flipped.
#[derive(Debug)]
pub(super) struct Preprocessed {
    inner: Split,
    steps: Arc<Steps>,
    /// The window and the source's image shape, when the geometry changes.
    geometry: Option<(Crop, [usize; 3])>,
    shape: Vec<usize>,
    seed: Option<u64>,
}

impl Preprocessed {
    pub(super) fn new(inner: Split, steps: Arc<Steps>, seed: Option<u64>) -> Result<Self, DataError> {
        let dims = inner.shape().to_vec();
        let (geometry, shape) = match (dims.as_slice(), &*steps) {
            (&[h, w, c], s) => match s.window_for(h, w) {
                Some(window) => (Some((window, [h, w, c])), vec![window.height, window.width, c]),
                None => (None, dims.clone()),
            },
            (_, s) if s.window_for(0, 0).is_some() => {
                return Err(DataError::BadPreprocessing {
                    problem: format!(
                        "random_crop and random_flip need images (height, width, channels), but examples are shaped {dims:?}"
                    ),
                });
            }
            _ => (None, dims.clone()),
        };
        Ok(Self { inner, steps, geometry, shape, seed })
    }

    /// Reads `indices` and transforms them into `batch`; `epoch` draws the training
    /// augmentation.
    fn read(&self, epoch: Option<u64>, indices: &[usize], batch: &mut Batch) -> Result<(), DataError> {
        let mut raw = Batch::default();
        raw.x.reserve_exact(indices.len() * self.inner.example_len().max(1));
        match epoch {
            Some(e) => self.inner.append_many_in_epoch(e, indices, &mut raw)?,
            None => self.inner.append_many(indices, &mut raw)?,
        }
        batch.y.append(&mut raw.y);
        batch.targets.append(&mut raw.targets);
        self.transform(epoch, indices, raw.x, &mut batch.x);
        Ok(())
    }

    /// Appends the examples `raw` (read at `indices`, or stream positions) to `x`,
    /// transformed; `epoch` draws the training augmentation.
    fn transform(&self, epoch: Option<u64>, indices: &[usize], mut raw: Vec<f32>, x: &mut Vec<f32>) {
        let in_len = self.inner.example_len().max(1);
        // Each parallel pass costs a dispatch and the threads' spinning: skip the empty one.
        if self.steps.changes_values() {
            raw.par_chunks_mut(in_len).for_each(|x| self.steps.values(x));
        }
        let Some((window, image)) = self.geometry else {
            x.append(&mut raw);
            return;
        };
        let out_len: usize = self.shape.iter().product();
        let start = x.len();
        x.resize(start + indices.len() * out_len, 0.0);
        let random = self.seed.zip(epoch);
        x[start..].par_chunks_mut(out_len.max(1)).zip(raw.par_chunks(in_len)).zip(indices).for_each(
            |((dst, src), &i)| {
                let draw = match random {
                    Some((seed, e)) => self.steps.random(window, [image[0], image[1]], seed, e, i),
                    None => centre(window, [image[0], image[1]]),
                };
                place(src, image, window, draw, dst);
            },
        );
    }
}

impl Examples for Preprocessed {
    fn len(&self) -> usize {
        self.inner.len()
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn append(&self, i: usize, batch: &mut Batch) -> Result<(), DataError> {
        self.read(None, &[i], batch)
    }

    fn append_many(&self, indices: &[usize], batch: &mut Batch) -> Result<(), DataError> {
        self.read(None, indices, batch)
    }

    fn append_many_in_epoch(&self, epoch: u64, indices: &[usize], batch: &mut Batch) -> Result<(), DataError> {
        self.read(Some(epoch), indices, batch)
    }

    fn bytes_held(&self) -> usize {
        self.inner.bytes_held()
    }

    fn rows_per_example(&self) -> usize {
        self.inner.rows_per_example()
    }

    fn whole_shuffle(&self) -> WholeShuffle {
        self.inner.whole_shuffle()
    }

    /// The training pipeline streams the source's records and hands each batch here.
    fn records(&self) -> Option<&dyn StreamSplit> {
        self.inner.records()
    }

    fn transform_streamed(&self, epoch: u64, positions: &[usize], batch: &mut Batch) -> Result<(), DataError> {
        let raw = std::mem::take(&mut batch.x);
        self.transform(Some(epoch), positions, raw, &mut batch.x);
        Ok(())
    }
}
