//! Direct 3 × 3 convolution of one-channel images (MNIST's first layer), without im2col.
//!
//! Why: with one input channel a patch row holds nine values, so im2col copied nine values a
//! pixel into a buffer that gemm then multiplied by a 9 × 16 or 9 × 32 kernel, a product too
//! thin for gemm's tiles; in the tutorial step that layer cost 15 % of one thread (im2col alone
//! 4 %), for 1 % of its multiply-adds. Here each output pixel's filters sit in registers
//! (`[f32; F]`, one or two AVX-512 vectors) while the nine taps are read from the image, and
//! backward keeps all nine taps' kernel gradients in registers across a part's pixels.
//!
//! Forward is the same arithmetic in the same order as gemm's (taps in order, fused
//! multiply-adds from zero, then the bias), so outputs are the same bits. Backward's kernel
//! gradient sums each part's pixels in pixel order, where gemm summed in its own blocks: those
//! bits differ by rounding (the golden hashes moved with it); the bias gradient is the same sum
//! in the same order as before.

use crate::engine::kernels::Window;

/// Taps of a 3 × 3 window.
const TAPS: usize = 9;

/// Whether the direct kernels compute this convolution: one channel, 3 × 3, 16 or 32
/// filters (one or two AVX-512 vectors), on a CPU with AVX-512.
pub(super) fn applies(win: &Window, filters: usize) -> bool {
    win.c == 1 && win.kh == 3 && win.kw == 3 && (filters == 16 || filters == 32) && avx512()
}

fn avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}

/// `y = x ⊛ kernel + bias` for `images` consecutive images, then ReLU where `relu` (the same
/// select as [`crate::engine::activation::relu`], applied in registers instead of in a second
/// pass over `y`).
pub(super) fn forward(
    win: &Window,
    kernel: &[f32],
    bias: Option<&[f32]>,
    relu: bool,
    x: &[f32],
    images: usize,
    y: &mut [f32],
) {
    let filters = kernel.len() / TAPS;
    assert!(applies(win, filters) && bias.is_none_or(|b| b.len() >= filters), "direct convolution misapplied");
    assert!(x.len() >= images * win.h * win.w && y.len() >= images * win.positions() * filters);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX-512 is present (`applies`), and the sizes are checked above.
    unsafe {
        if filters == 16 {
            avx512::forward::<1, 8>(win, kernel, bias, relu, x, images, y)
        } else {
            avx512::forward::<2, 4>(win, kernel, bias, relu, x, images, y)
        }
    }
}

/// Adds the kernel and bias gradients of `images` consecutive images to `d_kernel`, `d_bias`,
/// from `dz`, the gradient before the activation.
pub(super) fn backward(win: &Window, x: &[f32], images: usize, dz: &[f32], d_kernel: &mut [f32], d_bias: &mut [f32]) {
    let filters = d_kernel.len() / TAPS;
    assert!(applies(win, filters) && d_bias.len() >= filters, "direct convolution misapplied");
    assert!(x.len() >= images * win.h * win.w && dz.len() >= images * win.positions() * filters);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX-512 is present (`applies`), and the sizes are checked above.
    unsafe {
        if filters == 16 {
            avx512::backward::<1>(win, x, images, dz, d_kernel, d_bias)
        } else {
            avx512::backward::<2>(win, x, images, dz, d_kernel, d_bias)
        }
    }
}

/// The image offsets of the nine taps of output pixel `(oy, ox)` (`None` in the padding).
#[inline(always)]
fn taps(win: &Window, oy: usize, ox: usize) -> [Option<usize>; TAPS] {
    let mut taps = [None; TAPS];
    for (t, tap) in taps.iter_mut().enumerate() {
        if let (Some(iy), Some(ix)) = (win.source_row(oy, t / 3), win.source_col(ox, t % 3)) {
            *tap = Some(iy * win.w + ix);
        }
    }
    taps
}

/// The kernels, `V` vectors of 16 filters per pixel. Written with intrinsics: plain loops over
/// `[f32; F]` compiled to scalar code here.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{TAPS, Window, taps};
    use std::arch::x86_64::*;

    /// # Safety
    /// AVX-512F must be present; `x`, `kernel`, `bias` and `y` must hold what `win`, `images`
    /// and `V` imply.
    ///
    /// Inside the image, `P` output pixels of a row at a time, their taps at fixed offsets:
    /// one pixel's nine taps are a chain of dependent fused multiply-adds per vector, so one
    /// pixel at a time waited on the FMA's latency; `P × V` = 8 independent chains keep both
    /// FMA pipes busy. Pixels whose window leaves the image (padding) go one at a time. Each
    /// pixel's sum is the same either way: its taps in order, from zero, then the bias.
    // The indices name registers across parallel arrays (taps, offsets, kernel, accumulators),
    // as the intrinsics' lanes do; zipped iterators over four arrays read worse.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn forward<const V: usize, const P: usize>(
        win: &Window,
        kernel: &[f32],
        bias: Option<&[f32]>,
        relu: bool,
        x: &[f32],
        images: usize,
        y: &mut [f32],
    ) {
        let f = 16 * V;
        // SAFETY (all loads and stores below): offsets stay inside the slices, whose sizes the
        // caller checked; `taps` only yields offsets inside the image, and a group of `P`
        // pixels takes the fixed offsets only when every one of its taps is inside.
        unsafe {
            let k: [[__m512; V]; TAPS] =
                std::array::from_fn(|t| std::array::from_fn(|v| _mm512_loadu_ps(kernel.as_ptr().add(t * f + 16 * v))));
            let b: Option<[__m512; V]> = bias.map(|b| std::array::from_fn(|v| _mm512_loadu_ps(b.as_ptr().add(16 * v))));
            let zero = _mm512_setzero_ps();
            let finish = |acc: __m512, v: usize| {
                let o = match &b {
                    Some(b) => _mm512_add_ps(acc, b[v]),
                    None => acc,
                };
                // `activation::relu`: 0 where `o < 0` (ordered, so a NaN stays), else `o`.
                if relu { _mm512_mask_mov_ps(o, _mm512_cmp_ps_mask::<_CMP_LT_OQ>(o, zero), zero) } else { o }
            };
            // Tap `t`'s offset from the window's top-left value, and the step between pixels.
            let offsets: [usize; TAPS] = std::array::from_fn(|t| t / 3 * win.w + t % 3);
            let step = win.sw;
            let (image_len, positions) = (win.h * win.w, win.positions());
            for e in 0..images {
                let img = x.as_ptr().add(e * image_len);
                for oy in 0..win.oh {
                    let out = y.as_mut_ptr().add((e * positions + oy * win.ow) * f);
                    // The window's top input row, when its three rows lie inside the image.
                    let top = win.source_row(oy, 0).filter(|_| win.source_row(oy, 2).is_some());
                    let mut ox = 0;
                    while ox < win.ow {
                        // The group's first window's top-left value, when every window of
                        // the group lies inside the image.
                        let inside = ox + P <= win.ow && win.source_col(ox + P - 1, 2).is_some();
                        let first = top.zip(win.source_col(ox, 0)).filter(|_| inside).map(|(iy, ix)| iy * win.w + ix);
                        if let Some(first) = first {
                            let at = img.add(first);
                            let mut acc = [[zero; V]; P];
                            for t in 0..TAPS {
                                for p in 0..P {
                                    let x = _mm512_set1_ps(*at.add(p * step + offsets[t]));
                                    for v in 0..V {
                                        acc[p][v] = _mm512_fmadd_ps(x, k[t][v], acc[p][v]);
                                    }
                                }
                            }
                            for p in 0..P {
                                for v in 0..V {
                                    _mm512_storeu_ps(out.add((ox + p) * f + 16 * v), finish(acc[p][v], v));
                                }
                            }
                            ox += P;
                        } else {
                            let taps = taps(win, oy, ox);
                            let mut acc = [zero; V];
                            for t in 0..TAPS {
                                if let Some(i) = taps[t] {
                                    let x = _mm512_set1_ps(*img.add(i));
                                    for v in 0..V {
                                        acc[v] = _mm512_fmadd_ps(x, k[t][v], acc[v]);
                                    }
                                }
                            }
                            for v in 0..V {
                                _mm512_storeu_ps(out.add(ox * f + 16 * v), finish(acc[v], v));
                            }
                            ox += 1;
                        }
                    }
                }
            }
        }
    }

    /// # Safety
    /// AVX-512F must be present; `x`, `dz`, `d_kernel` and `d_bias` must hold what `win`,
    /// `images` and `V` imply.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn backward<const V: usize>(
        win: &Window,
        x: &[f32],
        images: usize,
        dz: &[f32],
        d_kernel: &mut [f32],
        d_bias: &mut [f32],
    ) {
        let f = 16 * V;
        // SAFETY: as in `forward`.
        unsafe {
            let mut dk: [[__m512; V]; TAPS] = std::array::from_fn(|t| {
                std::array::from_fn(|v| _mm512_loadu_ps(d_kernel.as_ptr().add(t * f + 16 * v)))
            });
            let mut db: [__m512; V] = std::array::from_fn(|v| _mm512_loadu_ps(d_bias.as_ptr().add(16 * v)));
            let (image_len, positions) = (win.h * win.w, win.positions());
            for e in 0..images {
                let img = x.as_ptr().add(e * image_len);
                for oy in 0..win.oh {
                    for ox in 0..win.ow {
                        let taps = taps(win, oy, ox);
                        let at = dz.as_ptr().add((e * positions + oy * win.ow + ox) * f);
                        let d: [__m512; V] = std::array::from_fn(|v| _mm512_loadu_ps(at.add(16 * v)));
                        for v in 0..V {
                            db[v] = _mm512_add_ps(db[v], d[v]);
                        }
                        for t in 0..TAPS {
                            if let Some(i) = taps[t] {
                                let p = _mm512_set1_ps(*img.add(i));
                                for v in 0..V {
                                    dk[t][v] = _mm512_fmadd_ps(p, d[v], dk[t][v]);
                                }
                            }
                        }
                    }
                }
            }
            for t in 0..TAPS {
                for v in 0..V {
                    _mm512_storeu_ps(d_kernel.as_mut_ptr().add(t * f + 16 * v), dk[t][v]);
                }
            }
            for v in 0..V {
                _mm512_storeu_ps(d_bias.as_mut_ptr().add(16 * v), db[v]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::kernels::add_bias;
    use crate::engine::strided::{MatMut, MatRef, gemm};

    fn values(len: usize, seed: usize) -> Vec<f32> {
        (0..len).map(|i| (((i * 37 + seed * 11) % 101) as f32 / 101.0 - 0.5) * 1.7).collect()
    }

    /// Forward is gemm's arithmetic on im2col patches, bit for bit; backward matches gemm's
    /// products within rounding, on `valid` and `same` padding, strides 1 and 2, 16 and 32 filters.
    #[test]
    fn direct_matches_im2col_and_gemm() {
        for (same, stride, filters) in [(false, 1, 32), (true, 1, 16), (true, 2, 32), (false, 2, 16)] {
            let win = Window::new((11, 9, 1), (3, 3), (stride, stride), same).unwrap();
            assert!(applies(&win, filters));
            let images = 3;
            let rows = images * win.positions();
            let x = values(images * 11 * 9, 1);
            let kernel = values(TAPS * filters, 2);
            let bias = values(filters, 3);
            let mut patches = vec![0.0; rows * TAPS];
            win.im2col(&x, images, &mut patches);
            let mut want = vec![0.0; rows * filters];
            let (patches_m, kernel_m) = (MatRef::rows(&patches, rows, TAPS), MatRef::rows(&kernel, TAPS, filters));
            gemm(MatMut::rows(&mut want, rows, filters), patches_m, kernel_m, false, 1.0, 1);
            add_bias(&mut want, &bias);
            let mut got = vec![f32::NAN; rows * filters];
            forward(&win, &kernel, Some(&bias), false, &x, images, &mut got);
            assert!(got == want, "forward, same {same} stride {stride}: not gemm's bits");

            let dz = values(rows * filters, 4);
            let mut want_k = vec![0.0; TAPS * filters];
            let dz_m = MatRef::rows(&dz, rows, filters);
            gemm(MatMut::rows(&mut want_k, TAPS, filters), patches_m.t(), dz_m, false, 1.0, 1);
            let mut want_b = vec![0.5; filters];
            crate::engine::kernels::add_rows(&mut want_b, &dz);
            let (mut got_k, mut got_b) = (vec![0.0; TAPS * filters], vec![0.5; filters]);
            backward(&win, &x, images, &dz, &mut got_k, &mut got_b);
            assert!(got_b == want_b, "bias gradient: the same sum in the same order");
            let worst = got_k.iter().zip(&want_k).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(worst < 1e-4, "kernel gradient off by {worst}");
        }
    }

    /// ReLU in the kernel gives the bits of the separate pass, a NaN kept, on rows whose
    /// width is and is not a multiple of the pixels taken at a time.
    #[test]
    fn relu_in_the_kernel_is_the_separate_pass() {
        for (same, stride, filters) in [(false, 1, 32), (true, 1, 16), (false, 1, 16), (true, 2, 32)] {
            let win = Window::new((13, 11, 1), (3, 3), (stride, stride), same).unwrap();
            let images = 2;
            let mut x = values(images * 13 * 11, 5);
            x[40] = f32::NAN;
            let (kernel, bias) = (values(TAPS * filters, 6), values(filters, 7));
            let len = images * win.positions() * filters;
            let mut want = vec![f32::NAN; len];
            forward(&win, &kernel, Some(&bias), false, &x, images, &mut want);
            crate::engine::activation::forward(crate::vocab::Activation::Relu, &mut want, filters);
            let mut got = vec![0.25; len];
            forward(&win, &kernel, Some(&bias), true, &x, images, &mut got);
            let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "same {same} stride {stride} filters {filters}");
            assert!(got.iter().any(|v| v.is_nan()) && got.iter().any(|v| *v == 0.0) && got.iter().any(|v| *v > 0.0));
        }
    }

    #[test]
    fn applies_to_one_channel_3x3_with_16_or_32_filters_only() {
        let win = |c, k| Window::new((8, 8, c), (k, k), (1, 1), false).unwrap();
        assert!(applies(&win(1, 3), 32) && applies(&win(1, 3), 16));
        assert!(!applies(&win(3, 3), 32) && !applies(&win(1, 5), 32) && !applies(&win(1, 3), 8));
    }
}
