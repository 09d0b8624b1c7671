//! Activation functions, applied in place after a layer and differentiated from its output.

use crate::vocab::Activation;

/// ReLU as TensorFlow computes it: a NaN passes through. `v.max(0.0)` would turn it into 0,
/// so a NaN that a diverged layer produced would vanish before the loss, and training would go
/// on with a finite loss and broken weights. (The select vectorizes to a compare and a masked
/// move; `max` needed a NaN fix-up besides.)
#[inline(always)]
pub fn relu(v: f32) -> f32 {
    if v < 0.0 { 0.0 } else { v }
}

/// Applies `act` to `y` in place; rows of `row_len` values matter for softmax.
pub fn forward(act: Activation, y: &mut [f32], row_len: usize) {
    // One small closure per function: a closure holding the whole match was too big to be
    // inlined under the vector target features, and ran as scalar SSE code.
    use super::simd::vectorized;
    match act {
        Activation::Linear => {}
        Activation::Relu => vectorized(|| y.iter_mut().for_each(|v| *v = relu(*v))),
        Activation::Sigmoid => vectorized(|| y.iter_mut().for_each(|v| *v = sigmoid(*v))),
        Activation::Tanh => vectorized(|| y.iter_mut().for_each(|v| *v = v.tanh())),
        Activation::Softmax => vectorized(|| y.chunks_exact_mut(row_len).for_each(softmax_row)),
    }
}

/// `dz = dy ⊙ act'(·)`, computed from the activation's output `y` (every supported function's
/// derivative is a function of its output, so the pre-activation need not be kept).
pub fn backward(act: Activation, y: &[f32], dy: &[f32], dz: &mut [f32], row_len: usize) {
    use super::simd::vectorized;
    let len = dz.len();
    let (y, dy) = (&y[..len], &dy[..len]);
    match act {
        Activation::Linear => dz.copy_from_slice(dy),
        Activation::Relu => vectorized(|| each(y, dy, dz, |y, dy| if y > 0.0 { dy } else { 0.0 })),
        Activation::Sigmoid => vectorized(|| each(y, dy, dz, |y, dy| dy * y * (1.0 - y))),
        Activation::Tanh => vectorized(|| each(y, dy, dz, |y, dy| dy * (1.0 - y * y))),
        Activation::Softmax => vectorized(|| {
            for ((y, dy), dz) in y.chunks_exact(row_len).zip(dy.chunks_exact(row_len)).zip(dz.chunks_exact_mut(row_len))
            {
                let dot: f32 = y.iter().zip(dy).map(|(a, b)| a * b).sum();
                for ((y, dy), dz) in y.iter().zip(dy).zip(dz.iter_mut()) {
                    *dz = y * (dy - dot);
                }
            }
        }),
    }
}

/// ReLU's derivative applied to `d` in place, from the ReLU's output `y`: the same select as
/// [`backward`] (`d` where `y > 0`, else 0), so the same bits.
pub fn relu_mask(y: &[f32], d: &mut [f32]) {
    super::simd::vectorized(|| d.iter_mut().zip(y).for_each(|(d, y)| *d = if *y > 0.0 { *d } else { 0.0 }));
}

/// `dz[i] = f(y[i], dy[i])`.
#[inline(always)]
fn each(y: &[f32], dy: &[f32], dz: &mut [f32], f: impl Fn(f32, f32) -> f32) {
    dz.iter_mut().zip(y.iter().zip(dy)).for_each(|(dz, (y, dy))| *dz = f(*y, *dy));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A NaN from a diverged layer reaches the loss, where the step loop stops the run at once;
    /// zeroed, it would have let training go on with broken weights behind a finite loss.
    #[test]
    fn relu_passes_nan_on_and_clamps_the_rest() {
        let mut y = [f32::NAN, -1.0, 0.0, 2.5, f32::INFINITY, f32::NEG_INFINITY];
        let row = y.len();
        forward(Activation::Relu, &mut y, row);
        assert!(y[0].is_nan());
        assert_eq!(y[1..], [0.0, 0.0, 2.5, f32::INFINITY, 0.0]);
    }
}
