//! Activation functions, applied in place after a layer and differentiated from its output.

use crate::spec::Activation;

/// Applies `act` to `y` in place; rows of `row_len` values matter for softmax.
pub fn forward(act: Activation, y: &mut [f32], row_len: usize) {
    super::simd::vectorized(
        #[inline(always)]
        || forward_rows(act, y, row_len),
    );
}

#[inline(always)]
fn forward_rows(act: Activation, y: &mut [f32], row_len: usize) {
    match act {
        Activation::Linear => {}
        Activation::Relu => y.iter_mut().for_each(|v| *v = v.max(0.0)),
        Activation::Sigmoid => y.iter_mut().for_each(|v| *v = sigmoid(*v)),
        Activation::Tanh => y.iter_mut().for_each(|v| *v = v.tanh()),
        Activation::Softmax => y.chunks_exact_mut(row_len).for_each(softmax_row),
    }
}

/// `dz = dy ⊙ act'(·)`, computed from the activation's output `y` (every supported function's
/// derivative is a function of its output, so the pre-activation need not be kept).
pub fn backward(act: Activation, y: &[f32], dy: &[f32], dz: &mut [f32], row_len: usize) {
    super::simd::vectorized(
        #[inline(always)]
        || backward_rows(act, y, dy, dz, row_len),
    );
}

#[inline(always)]
fn backward_rows(act: Activation, y: &[f32], dy: &[f32], dz: &mut [f32], row_len: usize) {
    let zip = y.iter().zip(dy).zip(dz.iter_mut());
    match act {
        Activation::Linear => dz.copy_from_slice(dy),
        Activation::Relu => zip.for_each(|((y, dy), dz)| *dz = if *y > 0.0 { *dy } else { 0.0 }),
        Activation::Sigmoid => zip.for_each(|((y, dy), dz)| *dz = dy * y * (1.0 - y)),
        Activation::Tanh => zip.for_each(|((y, dy), dz)| *dz = dy * (1.0 - y * y)),
        Activation::Softmax => {
            for ((y, dy), dz) in y.chunks_exact(row_len).zip(dy.chunks_exact(row_len)).zip(dz.chunks_exact_mut(row_len))
            {
                let dot: f32 = y.iter().zip(dy).map(|(a, b)| a * b).sum();
                for ((y, dy), dz) in y.iter().zip(dy).zip(dz.iter_mut()) {
                    *dz = y * (dy - dot);
                }
            }
        }
    }
}

/// A numerically stable logistic function.
pub fn sigmoid(x: f32) -> f32 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// Softmax of one row, shifted by its maximum for stability.
pub fn softmax_row(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    row.iter_mut().for_each(|v| *v /= sum);
}
