//! How [`strided::gemm`](super::strided::gemm) shares one product among threads: it cuts the
//! destination into one block of rows or of columns per thread and runs gemm on one thread in
//! each, instead of handing gemm its own `Parallelism::Rayon`.
//!
//! gemm's own parallelism forks and joins all threads once per depth chunk of at most 512 (and
//! packs each chunk's right operand in parallel first), so the tutorial's dense layer
//! (64 × 21,632 · 21,632 × 128) joins 43 times per product. Measured on 2 cores (Xeon,
//! AVX-512, one-thread gemm 140 GFLOP/s): gemm's two threads gave 113 GFLOP/s, slower than
//! one, and two blocks of rows 218; at 32 rows 76 against 177, at 128 rows 154 against 250.
//!
//! Blocks keep the bits. gemm sums each element over `k` in chunks whose size depends only on
//! `k` and on which of its size regimes the whole product falls in ([`regime`]): the element's
//! row or column never changes its order. So a cut is taken only where every block falls in the
//! whole product's regime, and then each element is the same sum in the same order as
//! unsplit, whatever the thread count (tested against one thread, bit for bit).

use std::ops::Range;

/// Below this many multiply-adds a product stays on one thread: waking another costs more
/// than it saves (about 8 µs of one core's work; gemm's own threshold is 590,000 per chunk).
const MIN_WORK: usize = 1 << 20;

/// Block edges fall on multiples of this many rows or columns (one AVX-512 register of f32),
/// so no block but the last ends in a partial micro-tile.
const ALIGN: usize = 16;

/// Which way a product is cut among threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Blocks of the destination's (and the left operand's) rows.
    Rows,
    /// Blocks of the destination's (and the right operand's) columns.
    Cols,
}

/// gemm 0.19's size regimes, each summing `k` its own way (`gemm_basic_generic`): dot-product
/// kernels for at most 16 × 16 outputs, vector kernels for `k` ≤ 2 or one row or column,
/// chunks of `min(k, 512)` when both sides are at most 64, and cache-sized chunks otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Regime {
    Special,
    Small,
    Large,
}

fn regime(m: usize, n: usize, k: usize) -> Regime {
    if k <= 2 || m <= 1 || n <= 1 || m * n <= 256 {
        Regime::Special
    } else if m <= 64 && n <= 64 {
        Regime::Small
    } else {
        Regime::Large
    }
}

/// The blocks an `m × n` product over depth `k` is cut into for `threads` threads, or `None`
/// when it runs whole: one thread, too little work, or no cut that keeps the bits.
pub fn blocks(m: usize, n: usize, k: usize, threads: usize) -> Option<(Cut, Vec<Range<usize>>)> {
    if threads < 2 || m.saturating_mul(n).saturating_mul(k) < MIN_WORK {
        return None;
    }
    let whole = regime(m, n, k);
    if whole == Regime::Special {
        return None;
    }
    // The longer side first: its blocks are the larger and the shorter side's operand is
    // shared whole.
    let order = if m >= n { [Cut::Rows, Cut::Cols] } else { [Cut::Cols, Cut::Rows] };
    order.into_iter().find_map(|axis| {
        let len = if axis == Cut::Rows { m } else { n };
        let ranges = even(len, threads);
        let keeps = ranges.iter().all(|r| {
            let (bm, bn) = if axis == Cut::Rows { (r.len(), n) } else { (m, r.len()) };
            regime(bm, bn, k) == whole
        });
        (ranges.len() >= 2 && keeps).then_some((axis, ranges))
    })
}

/// `0..len` in at most `parts` blocks of equal length rounded up to [`ALIGN`].
fn even(len: usize, parts: usize) -> Vec<Range<usize>> {
    let size = len.div_ceil(parts).next_multiple_of(ALIGN).max(ALIGN);
    (0..len).step_by(size).map(|start| start..(start + size).min(len)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tutorials_dense_layer_is_cut_into_row_blocks_that_stay_large() {
        // 64 × 128: cutting the 128 columns would make two 64 × 64 blocks, which gemm sums in
        // other chunks; cutting the rows keeps 128 columns.
        assert_eq!(blocks(64, 128, 21_632, 2), Some((Cut::Rows, vec![0..32, 32..64])));
        assert_eq!(blocks(128, 64, 21_632, 2), Some((Cut::Cols, vec![0..32, 32..64])));
        assert_eq!(blocks(256, 512, 384, 2), Some((Cut::Cols, vec![0..256, 256..512])));
    }

    #[test]
    fn small_work_one_thread_and_special_shapes_run_whole() {
        assert_eq!(blocks(64, 128, 21_632, 1), None);
        assert_eq!(blocks(8, 8, 64, 2), None);
        assert_eq!(blocks(1, 100_000, 64, 2), None, "a vector product");
        assert_eq!(blocks(4096, 4096, 2, 2), None, "k ≤ 2");
        // 16 × 65: both cuts leave a block of at most 16 × 64, another regime.
        assert_eq!(blocks(16, 65, 1 << 20, 2), None);
    }

    #[test]
    fn blocks_cover_the_side_once_and_fall_on_register_edges() {
        for (len, parts) in [(17, 2), (64, 2), (100, 3), (1000, 4), (33, 8)] {
            let r = even(len, parts);
            assert_eq!(r.first().map(|r| r.start), Some(0));
            assert_eq!(r.last().map(|r| r.end), Some(len));
            assert!(r.windows(2).all(|w| w[0].end == w[1].start && w[0].end % ALIGN == 0));
            assert!(r.len() <= parts);
        }
    }
}
