//! Bilinear resizing as `tf.image.resize(method="bilinear", antialias=False)` does it, which is
//! what Keras' `image_dataset_from_directory` applies by default: half-pixel centres, each
//! output value a blend of the four nearest source pixels, edges clamped.
//!
//! Written here rather than taken from the `image` crate: its `Triangle` filter widens its
//! kernel when shrinking (it antialiases), so a 64→32 resize averages 4×4 pixels where
//! TensorFlow blends 2×2, and the values differ.

use crate::data::formats::dtype::widen_u8;

/// One output coordinate's two source indices and the weight of the second.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Tap {
    lower: usize,
    upper: usize,
    frac: f32,
}

/// TensorFlow's `compute_interpolation_weights` with half-pixel centres.
fn taps(out_len: usize, in_len: usize) -> Vec<Tap> {
    let scale = in_len as f32 / out_len as f32;
    (0..out_len)
        .map(|o| {
            let x = (o as f32 + 0.5) * scale - 0.5;
            let floor = x.floor();
            Tap { lower: floor.max(0.0) as usize, upper: (x.ceil().max(0.0) as usize).min(in_len - 1), frac: x - floor }
        })
        .collect()
}

/// Resizes `src` (`height × width × channels`, row-major `u8`) into `dst`
/// (`out_height × out_width × channels` values), or converts it when the sizes match.
pub fn bilinear(src: &[u8], (height, width): (usize, usize), channels: usize, dst: &mut [f32], out: (usize, usize)) {
    if (height, width) == out {
        return widen_u8(src, dst);
    }
    let (out_height, out_width) = out;
    let ys = taps(out_height, height);
    let xs = taps(out_width, width);
    let px = |y: usize, x: usize, c: usize| f32::from(src[(y * width + x) * channels + c]);
    let mut i = 0;
    for y in &ys {
        for x in &xs {
            for c in 0..channels {
                let top = px(y.lower, x.lower, c) + (px(y.lower, x.upper, c) - px(y.lower, x.lower, c)) * x.frac;
                let bottom = px(y.upper, x.lower, c) + (px(y.upper, x.upper, c) - px(y.upper, x.lower, c)) * x.frac;
                dst[i] = top + (bottom - top) * y.frac;
                i += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_size_is_a_plain_conversion() {
        let mut out = [0.0; 4];
        bilinear(&[0, 10, 20, 255], (2, 2), 1, &mut out, (2, 2));
        assert_eq!(out, [0.0, 10.0, 20.0, 255.0]);
    }

    #[test]
    fn halving_blends_two_by_two_like_tensorflow() {
        // 4×4 → 2×2: output (0,0) samples source (0.5, 0.5), the mean of the top-left 2×2.
        let src: Vec<u8> = (0..16).map(|v| v * 10).collect();
        let mut out = [0.0; 4];
        bilinear(&src, (4, 4), 1, &mut out, (2, 2));
        assert_eq!(out, [25.0, 45.0, 105.0, 125.0]);
    }

    #[test]
    fn doubling_interpolates_and_clamps_edges() {
        // tf.image.resize([[0, 100]], (1, 4)) = [0, 25, 75, 100] (half-pixel centres).
        let mut out = [0.0; 4];
        bilinear(&[0, 100], (1, 2), 1, &mut out, (1, 4));
        assert_eq!(out, [0.0, 25.0, 75.0, 100.0]);
        // Channels are interpolated independently.
        let mut rgb = [0.0; 6];
        bilinear(&[0, 200, 10, 100, 0, 30], (1, 2), 3, &mut rgb, (1, 2));
        assert_eq!(rgb, [0.0, 200.0, 10.0, 100.0, 0.0, 30.0]);
        let mut wide = [0.0; 3];
        bilinear(&[0, 90], (1, 2), 1, &mut wide, (1, 3));
        assert_eq!(wide, [0.0, 45.0, 90.0]);
    }
}
