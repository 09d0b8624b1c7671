//! `predict --input FILE…`: the files to predict instead of the spec's test split, each read by
//! the spec's own source (`DataSource::read_input`: a CSV table, a `.npy` array, an IDX file of
//! images, a folder of PNGs, a `save_to_disk` folder), one after the other as one split: file
//! 1's rows, then file 2's. Each row keeps its origin ([`RowOrigins`]): the output's `file` and
//! `row` columns beside the global `id`.
//!
//! Everything wrong with the files is said at once before anything is read: every missing
//! file; then every file whose examples are not the shape the model reads, with both shapes.

use crate::data::examples::Examples;
use crate::data::{AnySource, Batch, DataError, Split};
use crate::exit::RunError;
use std::path::PathBuf;

/// Where each row of the inputs came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowOrigins {
    /// Each file as the user named it.
    names: Vec<String>,
    /// The global index one past each file's last row.
    ends: Vec<usize>,
}

impl RowOrigins {
    /// The file and the row in it (from 0) of global row `id`.
    pub fn of(&self, id: usize) -> (&str, usize) {
        let file = self.ends.partition_point(|&end| end <= id).min(self.ends.len().saturating_sub(1));
        let start = if file == 0 { 0 } else { self.ends[file - 1] };
        (self.names.get(file).map_or("", String::as_str), id - start)
    }
}

/// Reads `files` with `source`, each checked against the `shape` of the model's examples.
pub fn read(source: &AnySource, files: &[PathBuf], shape: &[usize]) -> Result<(Split, RowOrigins), RunError> {
    // A folder is an input too (of images, or a `save_to_disk` Dataset); its source says
    // whether it reads one.
    let missing: Vec<String> = files.iter().filter(|f| !f.exists()).map(|f| f.display().to_string()).collect();
    if !missing.is_empty() {
        return Err(RunError::Usage(format!(
            "--input: {} {} (paths are relative to the current directory, not data.dir); check the {}",
            missing.join(", "),
            if missing.len() == 1 { "is not a file" } else { "are not files" },
            if missing.len() == 1 { "name" } else { "names" }
        )));
    }
    let splits: Vec<Split> = files.iter().map(|f| source.read_input(f)).collect::<Result<_, DataError>>()?;
    let wrong: Vec<String> = files
        .iter()
        .zip(&splits)
        .filter(|(_, s)| s.shape() != shape)
        .map(|(f, s)| format!("{} holds examples of shape {:?}", f.display(), s.shape()))
        .collect();
    if !wrong.is_empty() {
        return Err(RunError::Usage(format!(
            "--input: {}, but the model reads examples of shape {shape:?} (those of the spec's training data); \
             write each file's examples in that shape (NumPy: `x.reshape(-1, {})`)",
            wrong.join("; "),
            shape.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")
        )));
    }
    let mut ends = Vec::with_capacity(splits.len());
    let mut total = 0;
    for s in &splits {
        total += s.len();
        ends.push(total);
    }
    let origins = RowOrigins { names: files.iter().map(|f| f.display().to_string()).collect(), ends: ends.clone() };
    Ok((Split::of(Concatenated { shape: shape.to_vec(), splits, ends }), origins))
}

/// Splits of one shape, one after the other.
#[derive(Debug)]
struct Concatenated {
    shape: Vec<usize>,
    splits: Vec<Split>,
    ends: Vec<usize>,
}

impl Examples for Concatenated {
    fn len(&self) -> usize {
        self.ends.last().copied().unwrap_or(0)
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn append(&self, i: usize, batch: &mut Batch) -> Result<(), DataError> {
        let file = self.ends.partition_point(|&end| end <= i);
        let split = self.splits.get(file).ok_or(DataError::ExampleOutOfRange { index: i, examples: self.len() })?;
        let start = if file == 0 { 0 } else { self.ends[file - 1] };
        split.append_many(&[i - start], batch)
    }

    fn bytes_held(&self) -> usize {
        self.splits.iter().map(Split::bytes_held).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_numbered_within_their_file() {
        let o = RowOrigins { names: vec!["a.csv".into(), "b.csv".into()], ends: vec![2, 5] };
        let got: Vec<(&str, usize)> = (0..5).map(|i| o.of(i)).collect();
        assert_eq!(got, [("a.csv", 0), ("a.csv", 1), ("b.csv", 0), ("b.csv", 1), ("b.csv", 2)]);
    }
}
