//! A task's input pipeline, started on first use. Synchronous strategies read each step's
//! micro-batches from it; under `parameter_server` the workers read their own data, so the
//! chief never starts one (no producer thread, no prefetched batches), and its cursor stays
//! where the run began.

use crate::data::{Batch, Cursor, DataError, Dataset, Pipeline, PipelineOptions};
use std::sync::Arc;

/// The training split as this task reads it.
pub struct Input {
    dataset: Arc<Dataset>,
    options: PipelineOptions,
    /// Where reading starts (a resumed backup's position, else the start).
    start: Cursor,
    pipeline: Option<Pipeline>,
}

impl Input {
    /// Reads `dataset` as `options` say, from `start`, once the first batch is asked for.
    pub fn new(dataset: Arc<Dataset>, options: PipelineOptions, start: Cursor) -> Self {
        Self { dataset, options, start, pipeline: None }
    }

    /// The next global batch of this task's shard.
    pub fn next_batch(&mut self) -> Result<Batch, DataError> {
        let pipeline = match &mut self.pipeline {
            Some(p) => p,
            None => self.pipeline.insert(Pipeline::new(Arc::clone(&self.dataset), &self.options, self.start)?),
        };
        pipeline.next_batch()
    }

    /// Gives a batch's buffers back for reuse.
    pub fn recycle(&mut self, batch: Batch) {
        if let Some(p) = &self.pipeline {
            p.recycle(batch);
        }
    }

    /// Where the next batch comes from: what a backup records to resume exactly.
    pub fn cursor(&self) -> Cursor {
        self.pipeline.as_ref().map_or(self.start, Pipeline::cursor)
    }
}
