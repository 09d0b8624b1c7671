//! The examples of one file given to `trainrun predict --input`: features only, as the
//! source's test split would read them (`u8` images divided by 255, numbers as written), in
//! file order. A prediction needs no label, so none is read even when the file holds one.

use super::error::{DataError, Position};
use super::examples::{Examples, Split};
use super::pipeline::Batch;
use std::path::Path;

/// Examples of one shape, held in memory as `f32`.
#[derive(Debug)]
pub struct Unlabeled {
    shape: Vec<usize>,
    values: Vec<f32>,
}

impl Unlabeled {
    /// The examples `values` holds, `shape` each, read from `path` (which errors name). An
    /// example of no values, a file of none, or a value that is not finite is refused.
    pub fn split(path: &Path, shape: Vec<usize>, values: Vec<f32>) -> Result<Split, DataError> {
        let malformed = |at, problem| DataError::Malformed { path: path.to_path_buf(), at, problem };
        let len: usize = shape.iter().product();
        if len == 0 || values.is_empty() || !values.len().is_multiple_of(len) {
            let problem = format!(
                "{} values do not make whole examples of shape {shape:?}; give at least one example of that shape",
                values.len()
            );
            return Err(malformed(Position::File, problem));
        }
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            let problem = format!(
                "example {} holds {} at value {}: a prediction needs finite inputs; fill the value in or drop the example",
                i / len,
                values[i],
                i % len
            );
            return Err(malformed(Position::Record(i / len), problem));
        }
        Ok(Split::of(Self { shape, values }))
    }
}

impl Examples for Unlabeled {
    fn len(&self) -> usize {
        self.values.len() / self.shape.iter().product::<usize>().max(1)
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn append(&self, i: usize, batch: &mut Batch) -> Result<(), DataError> {
        let len: usize = self.shape.iter().product();
        let row = self
            .values
            .get(i * len..(i + 1) * len)
            .ok_or(DataError::ExampleOutOfRange { index: i, examples: self.len() })?;
        batch.x.extend_from_slice(row);
        Ok(())
    }

    fn bytes_held(&self) -> usize {
        self.values.capacity() * 4
    }
}

/// The `u8` values of images as every source scales them: divided by 255 (division, not
/// multiplication by 1/255, so the values are bit-identical to the training split's).
pub fn scale_bytes(bytes: &[u8]) -> Vec<f32> {
    bytes.iter().map(|&b| f32::from(b) / 255.0).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_come_out_in_order_without_labels() {
        let split = Unlabeled::split(Path::new("x.npy"), vec![2], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        assert_eq!(split.len(), 3);
        let b = split.read(1..3).unwrap();
        assert_eq!((b.x, b.y.len(), b.targets.len()), (vec![3.0, 4.0, 5.0, 6.0], 0, 0));
    }

    #[test]
    fn partial_examples_and_non_finite_values_are_refused_naming_the_file() {
        let e = Unlabeled::split(Path::new("x.npy"), vec![2], vec![1.0, 2.0, 3.0]).unwrap_err().to_string();
        assert!(e.contains("x.npy") && e.contains("3 values") && e.contains("[2]"), "{e}");
        let e = Unlabeled::split(Path::new("x.npy"), vec![2], vec![1.0, f32::NAN]).unwrap_err().to_string();
        assert!(e.contains("x.npy") && e.contains("NaN"), "{e}");
    }
}
