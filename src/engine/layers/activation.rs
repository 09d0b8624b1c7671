//! `activation`: an activation function as a layer of its own (Keras `Activation`).

use crate::engine::activation;
use crate::engine::kernels::par_rows;
use crate::engine::layer::{Backward, Forward, Layer};
use crate::engine::op::Op;
use crate::engine::shape::Shape;
use crate::vocab::Activation;

/// Applies one activation function; softmax normalizes over the last axis.
pub struct ActivationLayer {
    activation: Activation,
    output: Shape,
}

impl ActivationLayer {
    /// `activation` over inputs of `shape`.
    pub fn new(activation: Activation, shape: Shape) -> Self {
        Self { activation, output: shape }
    }

    fn last_axis(&self) -> usize {
        self.output.0.last().copied().unwrap_or(1)
    }
}

impl Layer for ActivationLayer {
    fn op(&self) -> Option<Op> {
        Some(Op::Activation(self.activation))
    }

    fn kind(&self) -> &'static str {
        "activation"
    }

    fn output_shape(&self) -> &Shape {
        &self.output
    }

    fn forward(&mut self, cx: Forward<'_>, _: &[f32], _: &mut [f32], y: &mut [f32]) {
        let Forward { pass, x, n } = cx;
        let (act, row) = (self.activation, self.last_axis());
        let len = n * self.output.numel();
        y[..len].copy_from_slice(&x[..len]);
        let rows = len / row;
        par_rows(y, rows, row, pass.threads, |_, _, part| activation::forward(act, part, row));
    }

    fn backward(&mut self, cx: Backward<'_>, _: &[f32], _: &mut [f32], dx: Option<&mut [f32]>) {
        let Backward { y, dy, n, .. } = cx;
        if let Some(dx) = dx {
            let len = n * self.output.numel();
            activation::backward(self.activation, &y[..len], &dy[..len], &mut dx[..len], self.last_axis());
        }
    }
}
