//! The arithmetic every transport shares: element-wise sums as left folds in a fixed order,
//! `((x0 + x1) + x2) + …`. Same inputs in the same order give the same bits on every rank
//! and in every run, which is what makes the reductions deterministic.
//!
//! The loops are plain slices in fixed-size blocks, which LLVM vectorizes; on this machine
//! they run at memory speed (the data is far larger than L1), so hand-written SIMD would
//! not buy anything measurable.

/// Floats per step of the kernels: eight SSE registers' worth, so the running sum stays in
/// registers while the sources stream through.
const LANES: usize = 32;
type Lane = [f32; LANES];

/// `dst[i] += src[i]`.
pub(crate) fn add_assign_f32(dst: &mut [f32], src: &[f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d += *s;
    }
}

/// `dst[i] += src[i]`.
pub(crate) fn add_assign_f64(dst: &mut [f64], src: &[f64]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d += *s;
    }
}

/// Sums `srcs` element-wise in their order (rank order) and stores the sum to every `dsts`.
/// A destination may be one of the sources: each step reads all sources before writing.
/// With one source this is a copy that, unlike glibc's `memcpy` (non-temporal stores above a
/// few MB on this machine, 2-4x slower here), leaves the data in cache for the peer that reads
/// it next.
///
/// # Safety
/// Every pointer is valid for reads (sources) or writes (destinations) of `len` f32, and for
/// the duration of the call no other thread or process accesses those ranges.
pub(crate) unsafe fn sum_to_all(srcs: &[*const f32], dsts: &[*mut f32], len: usize) {
    let Some((&first, rest)) = srcs.split_first() else {
        return;
    };
    let mut at = 0;
    while at + LANES <= len {
        // SAFETY: at + LANES <= len, per the contract; unaligned reads and writes.
        let mut acc: Lane = unsafe { first.add(at).cast::<Lane>().read_unaligned() };
        for &s in rest {
            // SAFETY: as above.
            let x: Lane = unsafe { s.add(at).cast::<Lane>().read_unaligned() };
            for (a, x) in acc.iter_mut().zip(x) {
                *a += x;
            }
        }
        for &d in dsts {
            // SAFETY: as above.
            unsafe { d.add(at).cast::<Lane>().write_unaligned(acc) };
        }
        at += LANES;
    }
    while at < len {
        // SAFETY: at < len.
        let mut acc = unsafe { *first.add(at) };
        for &s in rest {
            // SAFETY: at < len.
            acc += unsafe { *s.add(at) };
        }
        for &d in dsts {
            // SAFETY: at < len.
            unsafe { *d.add(at) = acc };
        }
        at += 1;
    }
}

/// Copies `len` floats from `src` to `dst` through the cache (see [`sum_to_all`]).
///
/// # Safety
/// As for [`sum_to_all`]; the ranges do not overlap.
pub(crate) unsafe fn copy(src: *const f32, dst: *mut f32, len: usize) {
    // SAFETY: forwarded contract.
    unsafe { sum_to_all(&[src], &[dst], len) }
}

/// The reference every transport is tested against: a plain sequential sum in rank order.
pub fn sequential_sum(inputs: &[Vec<f32>]) -> Vec<f32> {
    let mut out = inputs.first().cloned().unwrap_or_default();
    for x in inputs.iter().skip(1) {
        add_assign_f32(&mut out, x);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sum_to_all_matches_the_sequential_fold_even_in_place() {
        let n = 3 * 2048 + 17;
        let inputs: Vec<Vec<f32>> =
            (0..3).map(|r| (0..n).map(|i| ((i * 7 + r * 13) % 101) as f32 * 0.1 - 3.3).collect()).collect();
        let want = sequential_sum(&inputs);
        let mut bufs = inputs.clone();
        let mut out = vec![0.0f32; n];
        let srcs: Vec<*const f32> = bufs.iter().map(|b| b.as_ptr()).collect();
        let mut dsts: Vec<*mut f32> = bufs.iter_mut().map(|b| b.as_mut_ptr()).collect();
        dsts.push(out.as_mut_ptr());
        // SAFETY: all buffers are n long and owned here; destinations equal sources exactly.
        unsafe { sum_to_all(&srcs, &dsts, n) };
        for b in bufs.iter().chain([&out]) {
            assert!(b.iter().zip(&want).all(|(a, w)| a.to_bits() == w.to_bits()));
        }
    }
}

#[cfg(test)]
mod speed {
    use super::*;
    use std::hint::black_box;
    use std::time::{Duration, Instant};

    fn time(mut f: impl FnMut()) -> Duration {
        f();
        (0..7)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed()
            })
            .min()
            .unwrap()
    }

    /// `cargo test --release --lib collective::reduce::speed -- --ignored --nocapture`
    #[test]
    #[ignore = "a measurement"]
    fn kernel_speed() {
        for n in [2_770_000 / 32, 2_770_000 / 8, 2_770_000 / 2, 2_770_000 * 2] {
            kernels(n);
        }
    }

    fn kernels(n: usize) {
        let a = vec![1.0f32; n];
        let b = vec![2.0f32; n];
        let mut c = vec![1.0f32; n];
        let mut d = vec![1.0f32; n];
        let mut big = vec![1.0f32; 2 * n];
        let src = vec![3.0f32; 2 * n];
        let memcpy = time(|| {
            black_box(&mut big).copy_from_slice(black_box(&src));
        });
        // SAFETY: distinct buffers of 2n.
        let own_copy = time(|| unsafe { copy(black_box(&src).as_ptr(), black_box(&mut big).as_mut_ptr(), 2 * n) });
        let add = time(|| add_assign_f32(black_box(&mut c), black_box(&a)));
        // SAFETY: all four buffers are n long and distinct.
        let sum = time(|| unsafe { sum_to_all(&[a.as_ptr(), b.as_ptr()], &[c.as_mut_ptr(), d.as_mut_ptr()], n) });
        let gbs = |bytes: usize, t: Duration| bytes as f64 / t.as_secs_f64() / 1e9;
        println!(
            "n={n}: copy 2n: memcpy {:.1} GB/s, ours {:.1}; c += a {:.1}; sum of 2 into 2 {:.1} (GB/s of data touched)",
            gbs(16 * n, memcpy),
            gbs(16 * n, own_copy),
            gbs(12 * n, add),
            gbs(16 * n, sum)
        );
    }
}
