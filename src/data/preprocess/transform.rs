//! One example's transforms: values (rescale, then per-channel normalization) in place, and
//! geometry (zero padding, a crop window, a horizontal flip) from an HWC image into the
//! output. The random draws come from a hash of (seed, data-epoch, example index) rather
//! than a stream, so any example of any epoch is drawn without replaying the others.

use super::{Crop, Normalization};

/// Separates the augmentation's use of the run seed from its other uses.
const AUGMENT_DOMAIN: u64 = 0x4155_474d_454e_5431; // "AUGMENT1"

/// What is done to every example, resolved once.
#[derive(Debug)]
pub(super) struct Steps {
    scale: Option<f32>,
    /// Per channel: the mean and the standard deviation.
    normalize: Option<(Vec<f32>, Vec<f32>)>,
    /// The window and padding; a flip without a crop is the whole image, unpadded.
    pub(super) window: Option<Crop>,
    flip: bool,
}

/// Where one example's window lies in its padded image, and whether it is mirrored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Draw {
    pub top: usize,
    pub left: usize,
    pub flip: bool,
}

impl Steps {
    pub(super) fn new(scale: Option<f32>, normalize: Option<&Normalization>, crop: Option<Crop>, flip: bool) -> Self {
        Self { scale, normalize: normalize.map(|n| (n.mean.clone(), n.std.clone())), window: crop, flip }
    }

    /// The window over an image of `height` × `width` (the whole image when only flipping).
    pub(super) fn window_for(&self, height: usize, width: usize) -> Option<Crop> {
        self.window.or(if self.flip { Some(Crop { padding: 0, height, width }) } else { None })
    }

    /// Whether [`Steps::values`] changes anything.
    pub(super) fn changes_values(&self) -> bool {
        self.scale.is_some() || self.normalize.is_some()
    }

    /// Rescales and normalizes one example's values in place (channels are the last axis).
    pub(super) fn values(&self, x: &mut [f32]) {
        if let Some(s) = self.scale {
            x.iter_mut().for_each(|v| *v *= s);
        }
        if let Some((mean, std)) = &self.normalize {
            for pixel in x.chunks_exact_mut(mean.len()) {
                for ((v, m), s) in pixel.iter_mut().zip(mean).zip(std) {
                    *v = (*v - m) / s;
                }
            }
        }
    }

    /// The training draw of example `index` in data-epoch `epoch`: a uniform window position
    /// and, when flipping, a fair coin.
    pub(super) fn random(&self, window: Crop, image: [usize; 2], seed: u64, epoch: u64, index: usize) -> Draw {
        let [rows, cols] = slack(window, image);
        let k = mix(mix(mix(seed ^ AUGMENT_DOMAIN) ^ epoch) ^ index as u64);
        let (a, b, c) = (k, mix(k), mix(mix(k)));
        // Modulo bias is below 2^-56 for any image size: immaterial.
        Draw { top: (a % rows as u64) as usize, left: (b % cols as u64) as usize, flip: self.flip && c & 1 == 1 }
    }
}

/// The evaluation draw: the centre window, unflipped (Keras' random layers at inference).
pub(super) fn centre(window: Crop, image: [usize; 2]) -> Draw {
    let [rows, cols] = slack(window, image);
    Draw { top: (rows - 1) / 2, left: (cols - 1) / 2, flip: false }
}

/// Window positions along each axis: `padded - window + 1` (at least 1: the planner refuses
/// windows larger than the padded image).
fn slack(window: Crop, [height, width]: [usize; 2]) -> [usize; 2] {
    let p = 2 * window.padding;
    [(height + p + 1).saturating_sub(window.height).max(1), (width + p + 1).saturating_sub(window.width).max(1)]
}

/// SplitMix64's finalizer: a bijective hash whose outputs pass BigCrush, written out so the
/// draws (which checkpoints depend on) cannot change with a crate release.
fn mix(z: u64) -> u64 {
    let mut z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Writes `window` of the zero-padded HWC image `src` (`shape`) at `draw` into `dst`
/// (`window.height × window.width × channels`), mirrored when the draw says so. Each row is
/// one contiguous copy of the columns that fall on the image (pixel by pixel when mirrored)
/// and zeros around it: a per-pixel bounds check cost half of decoding a 32×32 PNG.
pub(super) fn place(src: &[f32], shape: [usize; 3], window: Crop, draw: Draw, dst: &mut [f32]) {
    let [height, width, channels] = shape;
    let (p, wide) = (window.padding, window.width);
    let row_len = wide * channels;
    // Window columns `first..last` read image columns `left + x - p`, which exist.
    let first = p.saturating_sub(draw.left).min(wide);
    let last = (p + width).saturating_sub(draw.left).min(wide);
    for (y, out) in dst.chunks_exact_mut(row_len).take(window.height).enumerate() {
        let row = (draw.top + y).checked_sub(p).filter(|&r| r < height);
        let Some(r) = row.filter(|_| first < last) else {
            out.fill(0.0);
            continue;
        };
        let from = (r * width + draw.left + first - p) * channels;
        let segment = &src[from..from + (last - first) * channels];
        if draw.flip {
            // Window column x lands on output column `wide - 1 - x`.
            out[..(wide - last) * channels].fill(0.0);
            out[(wide - first) * channels..].fill(0.0);
            for (k, pixel) in segment.chunks_exact(channels).enumerate() {
                let to = (wide - 1 - first - k) * channels;
                out[to..to + channels].copy_from_slice(pixel);
            }
        } else {
            out[..first * channels].fill(0.0);
            out[first * channels..last * channels].copy_from_slice(segment);
            out[last * channels..].fill(0.0);
        }
    }
}
