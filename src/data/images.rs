//! Images held as `u8` (MNIST-format IDX files and the synthetic set) with one `u8` class
//! label each: the [`Examples`] behind the `mnist`, `fashion_mnist`, `idx` and `synthetic`
//! sources. Only the batch being handed out is `f32`.

use super::ExampleShape;
use super::error::DataError;
use super::examples::{Examples, Split};
use super::pipeline::Batch;
use super::source::idx::IdxArray;

/// `u8` images, NHWC, and their labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSplit {
    images: IdxArray,
    labels: IdxArray,
    shape: ExampleShape,
    dims: [usize; 3],
}

impl ImageSplit {
    /// A split from an IDX images array (3-D or 4-D) and labels array (1-D). The caller has
    /// already checked that the counts agree.
    pub(crate) fn new(images: IdxArray, labels: IdxArray, shape: ExampleShape) -> Self {
        Self { images, labels, shape, dims: [shape.height, shape.width, shape.channels] }
    }

    /// All labels.
    pub fn labels(&self) -> &[u8] {
        self.labels.data()
    }

    /// Image `i` (`shape.len()` bytes); empty when `i` is out of range.
    pub fn image(&self, i: usize) -> &[u8] {
        let len = self.shape.len();
        self.images.data().get(i * len..(i + 1) * len).unwrap_or_default()
    }
}

impl Examples for ImageSplit {
    fn len(&self) -> usize {
        self.labels.data().len()
    }

    fn shape(&self) -> &[usize] {
        &self.dims
    }

    fn append(&self, i: usize, batch: &mut Batch) -> Result<(), DataError> {
        // Division, not multiplication by 1/255, so values are exactly `byte / 255` as the
        // contract says; it vectorises all the same.
        batch.x.extend(self.image(i).iter().map(|&b| f32::from(b) / 255.0));
        batch.y.push(self.labels().get(i).map_or(0, |&l| u32::from(l)));
        Ok(())
    }

    fn bytes_held(&self) -> usize {
        self.images.bytes_held() + self.labels.bytes_held()
    }
}

impl Split {
    /// A split of `u8` images with one class label each (see [`ImageSplit::new`]).
    pub(crate) fn new(images: IdxArray, labels: IdxArray, shape: ExampleShape) -> Self {
        Split::of(ImageSplit::new(images, labels, shape))
    }
}
