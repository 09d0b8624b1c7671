//! `flatten` and `reshape`: the same values seen with another shape, so no work at all.

use crate::engine::layer::{Backward, Forward, Layer};
use crate::engine::op::Op;
use crate::engine::shape::Shape;

/// A layer whose output is its input reinterpreted; the model aliases the buffers.
pub struct View {
    kind: &'static str,
    output: Shape,
}

impl View {
    /// Keras `Flatten`: one axis of `numel` values.
    pub fn flatten(input: &Shape) -> Self {
        Self { kind: "flatten", output: Shape(vec![input.numel()]) }
    }

    /// Keras `Reshape`; the caller checks that the value counts agree.
    pub fn reshape(target: Shape) -> Self {
        Self { kind: "reshape", output: target }
    }
}

impl Layer for View {
    fn op(&self) -> Option<Op> {
        Some(Op::View)
    }

    fn kind(&self) -> &'static str {
        self.kind
    }

    fn output_shape(&self) -> &Shape {
        &self.output
    }

    fn is_view(&self) -> bool {
        true
    }

    fn forward(&mut self, cx: Forward<'_>, _: &[f32], _: &mut [f32], y: &mut [f32]) {
        let Forward { x, n, .. } = cx;
        // The model aliases views and never calls this; copying keeps the layer correct alone.
        let len = n * self.output.numel();
        y[..len].copy_from_slice(&x[..len]);
    }

    fn backward(&mut self, cx: Backward<'_>, _: &[f32], _: &mut [f32], dx: Option<&mut [f32]>) {
        let Backward { dy, n, .. } = cx;
        if let Some(dx) = dx {
            let len = n * self.output.numel();
            dx[..len].copy_from_slice(&dy[..len]);
        }
    }
}
