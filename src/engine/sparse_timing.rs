//! How the sparse walk's products time against gemm's on this CPU, for `trainrun bench --only
//! sparse`: the figures a CPU family's row of [`crate::engine::tuning`] is chosen from.
//!
//! The shape is the tutorial's dense layer (64 × 21,632 · 21,632 × 128) on one thread, with
//! `x`'s nonzeros spread evenly, the walk's worst case (a ReLU's zeros cluster, which helps it).

use super::*;
use crate::engine::strided::{MatMut, MatRef, gemm_scaled};
use std::time::{Duration, Instant};

/// The tutorial's dense layer: examples, inputs, units.
const SHAPE: (usize, usize, usize) = (64, 21_632, 128);

/// The walk's time over gemm's at one density.
#[derive(Debug, Clone, Copy)]
pub struct Ratios {
    /// Nonzero share of `x`.
    pub density: f64,
    /// Forward's `x · kernel`.
    pub forward: f64,
    /// The kernel's gradient (gathering the columns included), in blocks of 256 kernel rows.
    pub kernel_gradient: f64,
    /// `dx` through ReLU's derivative.
    pub dx: f64,
    /// The two backward products together (what [`backward_pays`] decides for).
    pub backward: f64,
}

/// A ReLU-like `x` of the shape with about `density` of it nonzero, spread evenly.
fn relu_like(density: f64) -> Vec<f32> {
    let (n, inputs, _) = SHAPE;
    (0..n * inputs)
        .map(|i| {
            let h = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
            if (h as f64 / (1u64 << 24) as f64) < density { 0.5 } else { 0.0 }
        })
        .collect()
}

/// The fastest of `reps` runs of `f`.
fn best(reps: usize, mut f: impl FnMut()) -> Duration {
    (0..reps.max(1))
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap_or_default()
}

/// The ratios at `density`, each time the fastest of `reps`.
pub fn ratios(density: f64, reps: usize) -> Ratios {
    let (n, inputs, units) = SHAPE;
    let x = relu_like(density);
    let w: Vec<f32> = (0..inputs * units).map(|i| (i % 7) as f32 * 0.01).collect();
    let dz: Vec<f32> = (0..n * units).map(|i| (i % 5) as f32 * 0.1).collect();
    let (mut y, mut list, mut cols) = (vec![0.0; n * units], Nonzeros::default(), Columns::default());
    let (mut g, mut dx) = (vec![0.0; inputs * units], vec![0.0; n * inputs]);
    // Backward's blocks of kernel rows, as the dense layer takes them.
    let blocks = |f: &mut dyn FnMut(Range<usize>)| {
        for start in (0..inputs).step_by(256) {
            f(start..(start + 256).min(inputs));
        }
    };
    let forward = best(reps, || forward_rows(&x, inputs, &w, units, &mut y, &mut list));
    let kernel_gradient = best(reps, || {
        blocks(&mut |r| {
            cols.count(&x, n, inputs, r.clone());
            cols.fill(&x, n, inputs, r.clone(), |_, _, _| {});
            cols.product(&mut g[r.start * units..r.end * units], &dz, units, Some(0.9), -0.1);
        })
    });
    let dx_walk = best(reps, || {
        blocks(&mut |r| {
            let w = &w[r.start * units..r.end * units];
            for (b, d) in dx.chunks_exact_mut(inputs).enumerate() {
                let (idx, val) = list.of(&x[b * inputs + r.start..b * inputs + r.end]);
                masked_dx_row(&mut d[r.clone()], idx, val, &dz[b * units..][..units], w, units);
            }
        })
    });
    let gemm_forward = best(reps, || {
        let (y, x, w) = (MatMut::rows(&mut y, n, units), MatRef::rows(&x, n, inputs), MatRef::rows(&w, inputs, units));
        gemm_scaled(y, x, w, None, 1.0, 1);
    });
    let gemm_kernel_gradient = best(reps, || {
        blocks(&mut |r| {
            let xt = MatRef::rows(&x, n, inputs).block(0..n, r.clone()).t();
            let t = MatMut::rows(&mut g[r.start * units..r.end * units], r.len(), units);
            gemm_scaled(t, xt, MatRef::rows(&dz, n, units), Some(0.9), -0.1, 1);
        })
    });
    let gemm_dx = best(reps, || {
        let (d, z, wt) =
            (MatMut::rows(&mut dx, n, inputs), MatRef::rows(&dz, n, units), MatRef::rows(&w, inputs, units).t());
        gemm_scaled(d, z, wt, None, 1.0, 1);
        crate::engine::activation::relu_mask(&x, &mut dx);
    });
    let r = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
    Ratios {
        density,
        forward: r(forward, gemm_forward),
        kernel_gradient: r(kernel_gradient, gemm_kernel_gradient),
        dx: r(dx_walk, gemm_dx),
        backward: r(kernel_gradient + dx_walk, gemm_kernel_gradient + gemm_dx),
    }
}

/// The density at which `ratio` (measured at increasing densities) first reaches 1, by linear
/// interpolation between the two densities around it; `None` where it never does.
pub fn crossover(points: &[(f64, f64)]) -> Option<f64> {
    let first = points.first()?;
    if first.1 >= 1.0 {
        return Some(first.0);
    }
    points.windows(2).find(|p| p[1].1 >= 1.0).map(|p| {
        let ((d0, r0), (d1, r1)) = (p[0], p[1]);
        d0 + (1.0 - r0) * (d1 - d0) / (r1 - r0)
    })
}

/// The forward walk's time (the fastest of `reps`) at `density` with the kernel taken `block`
/// rows at a time.
pub fn forward_time(density: f64, block: usize, reps: usize) -> Duration {
    let (n, inputs, units) = SHAPE;
    let x = relu_like(density);
    let w: Vec<f32> = (0..inputs * units).map(|i| (i % 7) as f32 * 0.01).collect();
    let (mut y, mut list) = (vec![0.0; n * units], Nonzeros::default());
    best(reps, || forward_rows_in(&x, inputs, &w, units, &mut y, &mut list, block))
}
