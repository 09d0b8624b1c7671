//! The flat parameter and state arenas' bookkeeping: where each named tensor lies
//! ([`TensorInfo`]), and where backward writes gradients ([`GradSink`]), so a collective can
//! take finished prefixes of the gradient arena while backward continues.

use std::ops::Range;

/// A named tensor inside the parameter or state arena (`dense_1/kernel`).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// `layer_name/weight_name`, Keras's weight path.
    pub name: String,
    /// Shape in Keras's layout.
    pub shape: Vec<usize>,
    /// Offset in the arena, in values.
    pub offset: usize,
}

impl TensorInfo {
    /// Values in the tensor.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the tensor holds no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The tensor's range in its arena.
    pub fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.len()
    }
}

/// Where backward writes parameter gradients: a plain buffer, or the part of the arena a
/// collective has not yet taken away for reduction (`collective::Packs`).
pub trait GradSink {
    /// `grads[range]`, by arena index. Backward asks only for ranges starting at or after the
    /// last [`GradSink::ready`] mark.
    fn slice(&mut self, range: Range<usize>) -> &mut [f32];

    /// `grads[..k]` is final.
    fn ready(&mut self, _k: usize) {}
}

impl GradSink for &mut [f32] {
    fn slice(&mut self, range: Range<usize>) -> &mut [f32] {
        &mut self[range]
    }
}

impl GradSink for Vec<f32> {
    fn slice(&mut self, range: Range<usize>) -> &mut [f32] {
        &mut self[range]
    }
}
