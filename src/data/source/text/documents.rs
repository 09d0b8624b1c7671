//! A file's documents ([`TextFile`]): held whole (a `text` file is one document, read once), or
//! streamed from the file a batch at a time each time they are needed ([`DocumentReader`]: a
//! JSONL file's field, a Parquet or Arrow file's string column), so a corpus is never held: its
//! vocabulary, counts and tokens are made batch by batch, and a run whose tokens are in the
//! token cache never reads its documents at all.

use crate::data::error::DataError;
use std::path::PathBuf;

/// Documents handed over at a time by a [`DocumentReader`] (about this many; a columnar file
/// hands over a record batch).
pub(crate) const DOCUMENTS_A_BATCH: usize = 8192;

/// What a [`DocumentReader`] hands each batch of documents to: borrowed text (a columnar
/// file's slices of its Arrow string array), so no document is copied to be read.
pub(crate) type EachBatch<'a> = dyn FnMut(&[&str]) -> Result<(), DataError> + 'a;

/// `documents` as the borrowed text an [`EachBatch`] takes.
pub(crate) fn borrowed(documents: &[String]) -> Vec<&str> {
    documents.iter().map(String::as_str).collect()
}

/// Reads a file's documents, in order, a batch at a time.
pub(crate) trait DocumentReader: Send + Sync {
    /// Calls `each` with every batch of the file's documents, in order; stops at its first error.
    fn each_batch(&self, each: &mut EachBatch<'_>) -> Result<(), DataError>;
}

/// Where a file's documents are.
pub(crate) enum Documents {
    /// In memory, read once (a `text` file: one document).
    Held(Vec<String>),
    /// Read from the file each time they are needed.
    Streamed(Box<dyn DocumentReader>),
}

/// One file's documents, in order.
pub(crate) struct TextFile {
    pub path: PathBuf,
    pub documents: Documents,
}

impl TextFile {
    /// A file whose documents are in memory.
    pub(crate) fn held(path: PathBuf, documents: Vec<String>) -> Self {
        Self { path, documents: Documents::Held(documents) }
    }

    /// A file whose documents `reader` streams.
    pub(crate) fn streamed(path: PathBuf, reader: impl DocumentReader + 'static) -> Self {
        Self { path, documents: Documents::Streamed(Box::new(reader)) }
    }

    /// Calls `each` with the documents, a batch at a time (held ones in one batch).
    pub(crate) fn each_batch(&self, each: &mut EachBatch<'_>) -> Result<(), DataError> {
        match &self.documents {
            Documents::Held(documents) => each(&borrowed(documents)),
            Documents::Streamed(reader) => reader.each_batch(each),
        }
    }

    /// Every document, in order (tests).
    #[cfg(test)]
    pub(crate) fn all(&self) -> Result<Vec<String>, DataError> {
        let mut all = vec![];
        self.each_batch(&mut |batch| {
            all.extend(batch.iter().map(|d| d.to_string()));
            Ok(())
        })?;
        Ok(all)
    }
}
