//! `sparse`: the products over a ReLU's nonzeros against exact sums, the AVX-512 paths against
//! the portable ones, and a timing to print.

use super::*;

/// A ReLU-like matrix: about one value in `every` nonzero, the rest 0.
fn relu_like(n: usize, inputs: usize, every: usize) -> Vec<f32> {
    (0..n * inputs)
        .map(|i| if (i * 7919) % every == 0 { ((i * 37) % 101) as f32 / 101.0 + 0.01 } else { 0.0 })
        .collect()
}

#[test]
fn forward_matches_the_dense_product() {
    let (n, inputs, units) = (5, 300, 70);
    let x = relu_like(n, inputs, 7);
    let w: Vec<f32> = (0..inputs * units).map(|i| ((i * 29) % 97) as f32 / 97.0 - 0.5).collect();
    let mut y = vec![f32::NAN; n * units];
    forward_rows(&x, inputs, &w, units, &mut y, &mut Nonzeros::default());
    for b in 0..n {
        for u in 0..units {
            let want: f64 = (0..inputs).map(|k| x[b * inputs + k] as f64 * w[k * units + u] as f64).sum();
            assert!((y[b * units + u] as f64 - want).abs() < 1e-4, "({b}, {u})");
        }
    }
}

#[test]
fn columns_gather_each_nonzero_once_in_row_order() {
    let (n, inputs) = (6, 40);
    let x = relu_like(n, inputs, 3);
    let mut cols = Columns::default();
    cols.count(&x, n, inputs, 10..30);
    cols.fill(&x, n, inputs, 10..30, |_, _, _| {});
    let want = x.chunks(inputs).map(|r| r[10..30].iter().filter(|v| **v != 0.0).count()).sum::<usize>();
    assert_eq!(cols.nonzeros, want);
    for c in 0..20 {
        let (rows, vals) = cols.column(c);
        let got: Vec<(u32, f32)> = rows.iter().copied().zip(vals.iter().copied()).collect();
        let want: Vec<(u32, f32)> =
            (0..n).filter(|b| x[b * inputs + 10 + c] != 0.0).map(|b| (b as u32, x[b * inputs + 10 + c])).collect();
        assert_eq!(got, want, "column {c}");
    }
}

/// The AVX-512 dot products are the portable ones' bits, remainders included.
#[test]
fn masked_dx_is_the_same_bits_on_every_path() {
    for units in [128, 70, 133, 5] {
        let (cols, n) = (40, 1);
        let x: Vec<f32> = (0..cols).map(|i| [0.0, 1.5, -2.0, f32::NAN, 0.25][i % 5]).collect();
        let w: Vec<f32> = (0..cols * units).map(|i| ((i * 2654435761usize) % 1000) as f32 / 777.0 - 0.6).collect();
        let dz: Vec<f32> = (0..units * n).map(|i| ((i * 40503) % 997) as f32 / 991.0 - 0.5).collect();
        let (mut got, mut want) = (vec![1.0; cols], vec![1.0; cols]);
        let mut list = Nonzeros::default();
        let (idx, val) = list.of(&x);
        masked_dx_row(&mut got, idx, val, &dz, &w, units);
        want.fill(0.0);
        dots(&mut want, idx, val, &dz, &w, units);
        assert_eq!(
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "units {units}"
        );
        for (c, v) in got.iter().enumerate() {
            let live = x[c] > 0.0;
            let exact: f64 = (0..units).map(|u| dz[u] as f64 * w[c * units + u] as f64).sum();
            assert!(if live { (*v as f64 - exact).abs() < 1e-4 } else { *v == 0.0 }, "units {units}, column {c}");
        }
    }
}

#[test]
fn dot_sums_every_term() {
    let a: Vec<f32> = (0..133).map(|i| i as f32).collect();
    let b = vec![1.0f32; 133];
    assert_eq!(dot(&a, &b), (0..133).sum::<i32>() as f32);
}

/// Prints the time of each sparse product on the tutorial's dense layer (one thread).
/// The fastest of `reps` runs of `f`.
fn best(reps: usize, mut f: impl FnMut()) -> std::time::Duration {
    (0..reps)
        .map(|_| {
            let t = std::time::Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap_or_default()
}

/// Prints the time of each sparse product on the tutorial's dense layer (one thread).
#[test]
#[ignore = "prints timings"]
fn sparse_speed() {
    let (n, inputs, units) = (64usize, 21632usize, 128usize);
    for density in [0.05f64, 0.13, 0.2, 0.3, 0.4, 0.5] {
        let x: Vec<f32> = (0..n * inputs)
            .map(|i| {
                let h = (i as u64).wrapping_mul(0x9E3779B97F4A7C15) >> 40;
                if (h as f64 / (1u64 << 24) as f64) < density { 0.5 } else { 0.0 }
            })
            .collect();
        let w: Vec<f32> = (0..inputs * units).map(|i| (i % 7) as f32 * 0.01).collect();
        let dz: Vec<f32> = (0..n * units).map(|i| (i % 5) as f32 * 0.1).collect();
        let (mut y, mut list, mut cols) = (vec![0.0; n * units], Nonzeros::default(), Columns::default());
        let (mut g, mut dx) = (vec![0.0; inputs * units], vec![0.0; n * inputs]);
        let fwd = best(10, || forward_rows(&x, inputs, &w, units, &mut y, &mut list));
        let blocks = |f: &mut dyn FnMut(std::ops::Range<usize>)| {
            for start in (0..inputs).step_by(256) {
                f(start..(start + 256).min(inputs));
            }
        };
        let gather = best(10, || {
            blocks(&mut |r| {
                cols.count(&x, n, inputs, r.clone());
                cols.fill(&x, n, inputs, r, |_, _, _| {});
            })
        });
        let product = best(10, || {
            blocks(&mut |r| {
                cols.count(&x, n, inputs, r.clone());
                cols.fill(&x, n, inputs, r.clone(), |_, _, _| {});
                cols.product(&mut g[r.start * units..r.end * units], &dz, units, Some(0.9), -0.1);
            })
        });
        let dxt = best(10, || {
            blocks(&mut |r| {
                let w = &w[r.start * units..r.end * units];
                for (b, d) in dx.chunks_exact_mut(inputs).enumerate() {
                    let (idx, val) = list.of(&x[b * inputs + r.start..b * inputs + r.end]);
                    masked_dx_row(&mut d[r.clone()], idx, val, &dz[b * units..][..units], w, units);
                }
            })
        });
        use crate::engine::strided::{MatMut, MatRef, gemm_scaled};
        let gemm_fwd = best(10, || {
            gemm_scaled(
                MatMut::rows(&mut y, n, units),
                MatRef::rows(&x, n, inputs),
                MatRef::rows(&w, inputs, units),
                None,
                1.0,
                1,
            )
        });
        let gemm_product = best(10, || {
            blocks(&mut |r| {
                let xt = MatRef::rows(&x, n, inputs).block(0..n, r.clone()).t();
                let t = MatMut::rows(&mut g[r.start * units..r.end * units], r.len(), units);
                gemm_scaled(t, xt, MatRef::rows(&dz, n, units), Some(0.9), -0.1, 1);
            })
        });
        let gemm_dx = best(10, || {
            gemm_scaled(
                MatMut::rows(&mut dx, n, inputs),
                MatRef::rows(&dz, n, units),
                MatRef::rows(&w, inputs, units).t(),
                None,
                1.0,
                1,
            );
            crate::engine::activation::relu_mask(&x, &mut dx);
        });
        let r = |a: std::time::Duration, b: std::time::Duration| a.as_secs_f64() / b.as_secs_f64();
        eprintln!(
            "density {density}: sparse/gemm forward {:.2} ({fwd:?}), product {:.2} ({product:?}), dx {:.2} ({dxt:?}); gather {gather:?}",
            r(fwd, gemm_fwd),
            r(product, gemm_product),
            r(dxt, gemm_dx)
        );
    }
}

/// Every nonzero (a NaN counts, −0 does not), in order, for any length around the vector width.
#[test]
fn nonzeros_are_every_nonzero_in_order() {
    let mut list = Nonzeros::default();
    for len in 0..70 {
        let x: Vec<f32> = (0..len).map(|i| [0.0, 1.5, -0.0, f32::NAN, 0.0, 0.0, -2.0][(i * 5 + len) % 7]).collect();
        let (idx, val) = list.of(&x);
        let want: Vec<usize> = (0..len).filter(|&i| x[i] != 0.0 || x[i].is_nan()).collect();
        assert_eq!(idx.iter().map(|&i| i as usize).collect::<Vec<_>>(), want, "length {len}");
        assert!(val.iter().zip(&want).all(|(v, &i)| v.to_bits() == x[i].to_bits()), "length {len}");
    }
}

/// `target = keep·target + scale·xᵀ·dz` over a block's columns, empty columns included.
#[test]
fn the_product_takes_keep_and_scale() {
    let (n, inputs, units) = (9, 50, 130);
    let x = relu_like(n, inputs, 4);
    let dz: Vec<f32> = (0..n * units).map(|i| ((i * 31) % 89) as f32 / 89.0 - 0.5).collect();
    let mut cols = Columns::default();
    let block = 5..45;
    cols.count(&x, n, inputs, block.clone());
    cols.fill(&x, n, inputs, block.clone(), |_, _, _| {});
    for keep in [None, Some(0.9)] {
        let mut t = vec![0.25f32; block.len() * units];
        cols.product(&mut t, &dz, units, keep, -0.1);
        for (c, k) in block.clone().enumerate() {
            for u in 0..units {
                let g: f64 = (0..n).map(|b| x[b * inputs + k] as f64 * dz[b * units + u] as f64).sum();
                let want = keep.map_or(0.0, |k| k as f64 * 0.25) - 0.1 * g;
                assert!((t[c * units + u] as f64 - want).abs() < 1e-5, "keep {keep:?}, ({c}, {u})");
            }
        }
    }
}

#[test]
fn pays_for_answers_as_the_whole_count_does() {
    // Nonzeros at the front, at the back, spread, and exactly at each threshold's edge, over
    // lengths below, at and above a check's stretch.
    for len in [0, 1, 999, CHECK_EVERY, 3 * CHECK_EVERY + 17] {
        for nonzeros in [0, len / 5, len / 5 + 1, len / 3, len / 3 + 1, len / 2, len] {
            let front: Vec<f32> = (0..len).map(|i| if i < nonzeros { 1.0 } else { 0.0 }).collect();
            let back: Vec<f32> = front.iter().rev().copied().collect();
            let spread: Vec<f32> = (0..len).map(|i| if (i * nonzeros) % len < nonzeros { 1.0 } else { 0.0 }).collect();
            for x in [&front, &back, &spread] {
                let count = count_nonzeros(x);
                for pays in [forward_pays as fn(usize, usize) -> bool, backward_pays] {
                    assert_eq!(pays_for(x, pays), pays(count, x.len()), "{len} values, {count} nonzero");
                }
            }
        }
    }
}

static CHECKS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn at_most_ten_counted(nonzeros: usize, _: usize) -> bool {
    CHECKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    nonzeros <= 10
}

#[test]
fn pays_for_stops_counting_once_the_answer_is_no() {
    let dense = vec![1.0f32; 20 * CHECK_EVERY];
    assert!(!pays_for(&dense, at_most_ten_counted));
    assert_eq!(CHECKS.load(std::sync::atomic::Ordering::Relaxed), 1, "one stretch decides");
}
