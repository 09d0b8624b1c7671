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

/// The forward walk's block is a matter of speed only: every block size gives the same bits.
#[test]
fn the_forward_block_does_not_change_the_sums() {
    let (n, inputs, units) = (6, 1000, 128);
    let x = relu_like(n, inputs, 5);
    let w: Vec<f32> = (0..inputs * units).map(|i| ((i * 29) % 97) as f32 / 97.0 - 0.5).collect();
    let bits = |block| {
        let mut y = vec![f32::NAN; n * units];
        forward_rows_in(&x, inputs, &w, units, &mut y, &mut Nonzeros::default(), block);
        y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    };
    let want = bits(inputs);
    for block in [1, 16, 100, 256, 999] {
        assert_eq!(bits(block), want, "block {block}");
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
fn the_crossover_is_where_the_ratio_reaches_one() {
    use super::timing::crossover;
    assert_eq!(crossover(&[]), None);
    assert_eq!(crossover(&[(0.1, 0.5), (0.2, 0.9)]), None);
    assert_eq!(crossover(&[(0.1, 1.2)]), Some(0.1));
    let at = crossover(&[(0.1, 0.5), (0.2, 0.8), (0.3, 1.2)]).unwrap_or_default();
    assert!((at - 0.25).abs() < 1e-12, "{at}");
}

#[test]
fn pays_for_answers_as_the_whole_count_does() {
    // Nonzeros at the front, at the back, spread, and exactly at each CPU family's thresholds'
    // edges (`engine::tuning`), over lengths below, at and above a check's stretch.
    for len in [0, 1, 999, CHECK_EVERY, 3 * CHECK_EVERY + 17] {
        for nonzeros in
            [0, len / 6, len / 6 + 1, len / 5, len / 5 + 1, len / 4, len / 4 + 1, len / 3, len / 3 + 1, len / 2, len]
        {
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
