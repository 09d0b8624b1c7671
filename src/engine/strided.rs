//! Strided matrix views over slices and a bounds-checked `gemm` on them, the engine's one
//! matrix product: a row-major operand is `MatRef::rows`, its transpose `.t()` (no copy), and
//! attention multiplies one head's columns of a `[T, 3·D]` buffer without copying them out.

use super::gemm_split::{self, Cut};
use gemm::Parallelism;
use rayon::prelude::*;
use std::ops::Range;

/// A read-only matrix whose element `(i, j)` sits at `data[i·rs + j·cs]`.
#[derive(Debug, Clone, Copy)]
pub struct MatRef<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl<'a> MatRef<'a> {
    /// A `rows × cols` view of `data` with row stride `rs` and column stride `cs`.
    pub fn new(data: &'a [f32], rows: usize, cols: usize, rs: usize, cs: usize) -> Self {
        Self { data, rows, cols, rs, cs }
    }

    /// A dense row-major `rows × cols` view.
    pub fn rows(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self::new(data, rows, cols, cols, 1)
    }

    /// Rows and columns.
    pub fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// The transpose (no copy).
    pub fn t(self) -> Self {
        Self { rows: self.cols, cols: self.rows, rs: self.cs, cs: self.rs, ..self }
    }

    /// The sub-matrix of `rows × cols` (no copy).
    pub fn block(self, rows: Range<usize>, cols: Range<usize>) -> Self {
        assert!(rows.end <= self.rows && cols.end <= self.cols, "block outside its matrix");
        let start = rows.start * self.rs + cols.start * self.cs;
        let data = self.data.get(start..).unwrap_or_default();
        Self { data, rows: rows.len(), cols: cols.len(), ..self }
    }

    /// Row and column strides.
    pub fn strides(&self) -> (usize, usize) {
        (self.rs, self.cs)
    }

    /// Row `i` as a slice when rows are contiguous (`cs` = 1).
    pub fn contiguous_row(&self, i: usize) -> Option<&'a [f32]> {
        (self.cs == 1 && i < self.rows).then(|| &self.data[i * self.rs..i * self.rs + self.cols])
    }

    /// Column `j` as a slice when columns are contiguous (`rs` = 1).
    pub fn contiguous_col(&self, j: usize) -> Option<&'a [f32]> {
        (self.rs == 1 && j < self.cols).then(|| &self.data[j * self.cs..j * self.cs + self.rows])
    }

    /// Element `(i, j)` (panics outside the slice).
    #[inline(always)]
    pub fn at(&self, i: usize, j: usize) -> f32 {
        self.data[i * self.rs + j * self.cs]
    }

    /// Whether every element the strides reach lies inside `data`.
    fn in_bounds(&self) -> bool {
        reach(self.rows, self.cols, self.rs, self.cs) <= self.data.len()
    }
}

/// A mutable matrix whose distinct elements sit at distinct places (checked), so `gemm` may
/// write it from several threads.
#[derive(Debug)]
pub struct MatMut<'a> {
    data: &'a mut [f32],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl<'a> MatMut<'a> {
    /// A `rows × cols` view of `data` with row stride `rs` and column stride `cs`.
    pub fn new(data: &'a mut [f32], rows: usize, cols: usize, rs: usize, cs: usize) -> Self {
        Self { data, rows, cols, rs, cs }
    }

    /// A dense row-major `rows × cols` view.
    pub fn rows(data: &'a mut [f32], rows: usize, cols: usize) -> Self {
        Self::new(data, rows, cols, cols, 1)
    }

    /// The sub-matrix of `rows × cols`, borrowed (no copy).
    pub fn block(&mut self, rows: Range<usize>, cols: Range<usize>) -> MatMut<'_> {
        assert!(rows.end <= self.rows && cols.end <= self.cols, "block outside its matrix");
        let start = rows.start * self.rs + cols.start * self.cs;
        let data = self.data.get_mut(start..).unwrap_or_default();
        MatMut { data, rows: rows.len(), cols: cols.len(), rs: self.rs, cs: self.cs }
    }

    fn in_bounds(&self) -> bool {
        reach(self.rows, self.cols, self.rs, self.cs) <= self.data.len()
    }

    /// Rows and columns.
    pub fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// The slice and row stride of a view whose rows are contiguous and do not overlap
    /// (`cs` = 1, `rs` ≥ `cols`, inside its slice); `None` for other views.
    pub fn row_major(&mut self) -> Option<(&mut [f32], usize)> {
        (self.cs == 1 && self.rs >= self.cols && self.in_bounds()).then_some((&mut *self.data, self.rs))
    }

    /// Calls `f(i, j, element)` for every element.
    pub fn update(&mut self, mut f: impl FnMut(usize, usize, &mut f32)) {
        assert!(self.in_bounds() && self.is_injective(), "view out of its slice");
        for i in 0..self.rows {
            for j in 0..self.cols {
                f(i, j, &mut self.data[i * self.rs + j * self.cs]);
            }
        }
    }

    /// Rows never overlap columns: one stride steps over the whole extent of the other (an
    /// empty view has no element to overlap).
    fn is_injective(&self) -> bool {
        if self.rows == 0 || self.cols == 0 {
            return true;
        }
        let (r, c) = (self.rows - 1, self.cols - 1);
        (self.cs >= 1 && (r == 0 || self.rs > c * self.cs)) || (self.rs >= 1 && (c == 0 || self.cs > r * self.rs))
    }
}

/// One past the largest index a `rows × cols` view with strides `rs`, `cs` touches.
fn reach(rows: usize, cols: usize, rs: usize, cs: usize) -> usize {
    if rows == 0 || cols == 0 { 0 } else { (rows - 1) * rs + (cols - 1) * cs + 1 }
}

/// `c = (accumulate ? c : 0) + scale · a · b`, on `threads` threads (1: the caller's thread,
/// for use inside its own parallel split). Panics when shapes disagree or a view leaves its
/// slice: callers build the views from their own buffer sizes, so that is a bug.
pub fn gemm(c: MatMut<'_>, a: MatRef<'_>, b: MatRef<'_>, accumulate: bool, scale: f32, threads: usize) {
    gemm_scaled(c, a, b, accumulate.then_some(1.0), scale, threads);
}

/// `c = keep·c + scale · a · b` (`c` overwritten when `keep` is `None`): gemm's own scalings,
/// so an optimizer update can land in its target as the product is written.
pub fn gemm_scaled(c: MatMut<'_>, a: MatRef<'_>, b: MatRef<'_>, keep: Option<f32>, scale: f32, threads: usize) {
    // gemm takes raw pointers: every index it will form is checked here.
    assert!(a.in_bounds() && b.in_bounds() && c.in_bounds() && c.is_injective(), "gemm view out of its slice");
    let (rows, cols, rs, cs) = (c.rows, c.cols, c.rs, c.cs);
    // SAFETY: `c` is checked above and borrowed mutably for the call.
    unsafe { gemm_raw(GemmTarget { ptr: c.data.as_mut_ptr(), rows, cols, rs, cs }, a, b, keep, scale, threads) }
}

/// A destination gemm writes through a raw pointer.
#[derive(Clone, Copy)]
struct GemmTarget {
    ptr: *mut f32,
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

/// # Safety
/// Every element of `c` (`ptr + i·rs + j·cs`) must be valid for writes, distinct, and not
/// aliased by `a`, `b` or any other live reference for the duration of the call.
unsafe fn gemm_raw(c: GemmTarget, a: MatRef<'_>, b: MatRef<'_>, keep: Option<f32>, scale: f32, threads: usize) {
    assert!(
        a.cols == b.rows && c.rows == a.rows && c.cols == b.cols,
        "gemm shapes: {}×{} · {}×{} into {}×{}",
        a.rows,
        a.cols,
        b.rows,
        b.cols,
        c.rows,
        c.cols
    );
    assert!(a.in_bounds() && b.in_bounds(), "gemm view out of its slice");
    let (m, n, k) = (c.rows, c.cols, a.cols);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        for i in 0..m {
            for j in 0..n {
                // SAFETY: (i, j) is an element of `c`, valid for writes by the contract.
                let v = unsafe { &mut *c.ptr.add(i * c.rs + j * c.cs) };
                *v = keep.map_or(0.0, |f| f * *v);
            }
        }
        return;
    }
    tune_packing();
    let Some((axis, ranges)) = gemm_split::blocks(m, n, k, threads) else {
        // Whole: on one thread, or where no cut keeps the bits, with gemm's own threads.
        let parallelism = if threads > 1 { Parallelism::Rayon(threads) } else { Parallelism::None };
        // SAFETY: as this function's.
        return unsafe { gemm_call(&c, a, b, keep, scale, parallelism) };
    };
    let c = SharedTarget(c);
    ranges.into_par_iter().with_max_len(1).for_each(|r| {
        let c = c.target();
        let (target, a, b) = match axis {
            Cut::Rows => {
                // SAFETY: `r` lies inside `c`'s rows, so the offset stays in its allocation.
                let ptr = unsafe { c.ptr.add(r.start * c.rs) };
                (GemmTarget { ptr, rows: r.len(), ..*c }, a.block(r, 0..a.cols), b)
            }
            Cut::Cols => {
                // SAFETY: as above, for `c`'s columns.
                let ptr = unsafe { c.ptr.add(r.start * c.cs) };
                (GemmTarget { ptr, cols: r.len(), ..*c }, a, b.block(0..b.rows, r))
            }
        };
        // SAFETY: each block is a distinct part of `c` (the ranges are disjoint), so no two
        // threads write one element; the rest is this function's contract.
        unsafe { gemm_call(&target, a, b, keep, scale, Parallelism::None) }
    });
}

/// A destination shared by the threads that each write their own block of it.
struct SharedTarget(GemmTarget);

// SAFETY: the threads given a `SharedTarget` write disjoint blocks of it (`gemm_raw`).
unsafe impl Sync for SharedTarget {}

impl SharedTarget {
    /// The whole destination (a method, so closures capture the `Sync` wrapper, not the field).
    fn target(&self) -> &GemmTarget {
        &self.0
    }
}

/// # Safety
/// As [`gemm_raw`]'s, with `a` and `b` checked to lie in their slices and the shapes agreeing.
unsafe fn gemm_call(
    c: &GemmTarget,
    a: MatRef<'_>,
    b: MatRef<'_>,
    keep: Option<f32>,
    scale: f32,
    parallelism: Parallelism,
) {
    let s = |v: usize| v as isize;
    // SAFETY: `a` and `b` are checked by the caller, `c` by the contract; its elements are
    // distinct, so threads never write one place twice.
    unsafe {
        gemm::gemm(
            c.rows,
            c.cols,
            a.cols,
            c.ptr,
            s(c.cs),
            s(c.rs),
            keep.is_some(),
            a.data.as_ptr(),
            s(a.cs),
            s(a.rs),
            b.data.as_ptr(),
            s(b.cs),
            s(b.rs),
            keep.unwrap_or(1.0),
            scale,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// On one thread gemm copies ("packs") a column-major left operand when the product has more
/// than 8 × 6 columns; on several, above 16 × 6. The dense forward's left operand is the
/// kernel, already column-major for gemm, so at batch 64 one thread re-packed all of it
/// (11 MB for the tutorial's first dense layer) every step, as several threads do not. Use the
/// multi-thread rule everywhere. Packing moves values, never changes a sum, so results are
/// the same bits either way.
fn tune_packing() {
    static TUNED: std::sync::Once = std::sync::Once::new();
    TUNED.call_once(|| gemm::set_lhs_packing_threshold_single_thread(gemm::get_lhs_packing_threshold_multi_thread()));
}

/// Column blocks of one row-major matrix that different threads write at once: their
/// memory spans interleave, so they cannot be separate slices, but no element belongs to two
/// blocks (checked when split), and each block lives no longer than the matrix's borrow.
#[derive(Debug)]
pub struct ColumnBlock<'a> {
    ptr: *mut f32,
    rows: usize,
    cols: Range<usize>,
    rs: usize,
    _matrix: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: a block's elements belong to it alone (see `split_cols`), so moving it to another
// thread shares nothing.
unsafe impl Send for ColumnBlock<'_> {}

impl<'a> MatMut<'a> {
    /// Splits a row-major view (`cs` = 1) into the column blocks `ranges`, which must be
    /// increasing and disjoint.
    pub fn split_cols(self, ranges: &[Range<usize>]) -> Vec<ColumnBlock<'a>> {
        assert!(self.cs == 1 && self.rs >= self.cols && self.in_bounds(), "split_cols needs a row-major view");
        assert!(
            ranges.windows(2).all(|w| w[0].end <= w[1].start)
                && ranges.iter().all(|r| r.start <= r.end && r.end <= self.cols),
            "column blocks must be increasing, disjoint and inside the matrix"
        );
        let ptr = self.data.as_mut_ptr();
        ranges
            .iter()
            .map(|r| ColumnBlock {
                ptr,
                rows: self.rows,
                cols: r.clone(),
                rs: self.rs,
                _matrix: std::marker::PhantomData,
            })
            .collect()
    }
}

impl ColumnBlock<'_> {
    /// `c[:, cols] = scale · a · b` on the caller's thread, `cols` counted within this block.
    pub fn gemm(&mut self, cols: Range<usize>, a: MatRef<'_>, b: MatRef<'_>, scale: f32) {
        assert!(cols.start <= cols.end && cols.end <= self.cols.len(), "columns outside their block");
        let first = self.cols.start + cols.start;
        // SAFETY: `first` is inside the matrix (checked by `split_cols` and above), so the
        // offset stays inside its allocation.
        let ptr = unsafe { self.ptr.add(first) };
        let target = GemmTarget { ptr, rows: self.rows, cols: cols.len(), rs: self.rs, cs: 1 };
        // SAFETY: the elements are rows × `cols` of this block, inside the matrix, owned by
        // this block alone, and `a`, `b` are shared borrows of other buffers (the matrix is
        // mutably borrowed for `'a`).
        unsafe { gemm_raw(target, a, b, None, scale, 1) }
    }

    /// Row `i`'s `cols` of this block (counted within it).
    pub fn row_mut(&mut self, i: usize, cols: Range<usize>) -> &mut [f32] {
        assert!(i < self.rows && cols.start <= cols.end && cols.end <= self.cols.len(), "outside the block");
        // SAFETY: row `i`'s `cols` are inside the matrix (checked by `split_cols` and above)
        // and belong to this block alone, which stays borrowed mutably while the slice lives.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(i * self.rs + self.cols.start + cols.start), cols.len()) }
    }

    /// Calls `f(row, values)` with each row's `cols` of this block (counted within it).
    pub fn for_each_row(&mut self, cols: Range<usize>, mut f: impl FnMut(usize, &mut [f32])) {
        assert!(cols.start <= cols.end && cols.end <= self.cols.len(), "columns outside their block");
        let first = self.cols.start + cols.start;
        for i in 0..self.rows {
            // SAFETY: row `i`'s `cols` are inside the matrix (checked by `split_cols` and
            // above) and belong to this block alone, which is borrowed mutably for the call.
            let row = unsafe { std::slice::from_raw_parts_mut(self.ptr.add(i * self.rs + first), cols.len()) };
            f(i, row);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cutting a product among threads (`gemm_split`) gives one thread's bits, at the
    /// regimes' edges (64, 256 outputs, depth 512), for transposed operands, accumulation and
    /// scaling, on 2–4 threads.
    #[test]
    fn products_cut_among_threads_are_one_threads_bits() {
        use rand::RngExt;
        let mut r = crate::engine::init::rng(&[7]);
        let mut next = || r.random_range(-0.5f32..0.5);
        let shapes = [
            (64, 128, 21_632),
            (128, 64, 700),
            (65, 64, 600),
            (64, 65, 513),
            (200, 48, 1100),
            (33, 300, 257),
            (17, 17, 5000),
            (300, 300, 96),
        ];
        for (m, n, k) in shapes {
            let a: Vec<f32> = (0..m * k).map(|_| next()).collect();
            let b: Vec<f32> = (0..k * n).map(|_| next()).collect();
            let start: Vec<f32> = (0..m * n).map(|_| next()).collect();
            for (transposed, keep, scale) in [(false, None, 1.0), (true, Some(0.5), -0.25)] {
                let (a, b) = if transposed {
                    (MatRef::rows(&a, k, m).t(), MatRef::rows(&b, n, k).t())
                } else {
                    (MatRef::rows(&a, m, k), MatRef::rows(&b, k, n))
                };
                let product = |threads| {
                    let mut c = start.clone();
                    gemm_scaled(MatMut::rows(&mut c, m, n), a, b, keep, scale, threads);
                    c
                };
                let one = product(1);
                for threads in 2..=4 {
                    let got = product(threads);
                    let same = one.iter().zip(&got).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(
                        same,
                        "{m}×{k}·{k}×{n} on {threads} threads (transposed {transposed}) differs from one thread"
                    );
                }
            }
        }
    }

    #[test]
    fn strided_views_multiply_like_copies() {
        // a: the 3×2 block at columns 1..3 of a 3×4 buffer; b: the transpose of a 4×2 buffer.
        let buf: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let a = MatRef::new(&buf[1..], 3, 2, 4, 1);
        let bt: Vec<f32> = (0..8).map(|v| (v % 5) as f32 - 2.0).collect();
        let b = MatRef::rows(&bt, 4, 2).t();
        let mut c = vec![1.0; 3 * 4];
        gemm(MatMut::rows(&mut c, 3, 4), a, b, true, 0.5, 2);
        for i in 0..3 {
            for j in 0..4 {
                let dot: f32 = (0..2).map(|p| buf[1 + 4 * i + p] * bt[2 * j + p]).sum();
                assert_eq!(c[4 * i + j], 1.0 + 0.5 * dot);
            }
        }
    }

    #[test]
    fn blocks_multiply_like_their_parents_parts() {
        // c[1..3, 0..2] = a[1..3, :] · b[:, 1..3], the rest of c untouched.
        let a: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let b: Vec<f32> = (0..12).map(|v| (v % 5) as f32).collect();
        let mut c = vec![-1.0; 16];
        let mut cm = MatMut::rows(&mut c, 4, 4);
        let (am, bm) = (MatRef::rows(&a, 4, 3), MatRef::rows(&b, 3, 4));
        gemm(cm.block(1..3, 0..2), am.block(1..3, 0..3), bm.block(0..3, 1..3), false, 1.0, 1);
        for i in 0..4 {
            for j in 0..4 {
                let want = if (1..3).contains(&i) && j < 2 {
                    (0..3).map(|p| a[3 * i + p] * b[4 * p + j + 1]).sum()
                } else {
                    -1.0
                };
                assert_eq!(c[4 * i + j], want, "({i}, {j})");
            }
        }
        // Empty blocks at the far edge are fine.
        assert_eq!(am.block(4..4, 0..3).rows, 0);
    }

    #[test]
    #[should_panic(expected = "out of its slice")]
    fn a_view_past_its_slice_is_refused() {
        let buf = [0.0; 6];
        let mut c = [0.0; 4];
        gemm(MatMut::rows(&mut c, 2, 2), MatRef::new(&buf, 2, 2, 5, 1), MatRef::rows(&buf, 2, 2), false, 1.0, 1);
    }

    #[test]
    #[should_panic(expected = "out of its slice")]
    fn an_overlapping_destination_is_refused() {
        let buf = [1.0; 4];
        let mut c = [0.0; 4];
        gemm(MatMut::new(&mut c, 2, 2, 1, 1), MatRef::rows(&buf, 2, 2), MatRef::rows(&buf, 2, 2), false, 1.0, 1);
    }

    /// The plain product of row-major `a` (`m × k`) and `b` (`k × n`).
    fn naive(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        c
    }

    fn transpose(rows: usize, cols: usize, a: &[f32]) -> Vec<f32> {
        let mut t = vec![0.0; a.len()];
        for r in 0..rows {
            for c in 0..cols {
                t[c * rows + r] = a[r * cols + c];
            }
        }
        t
    }

    /// A row-major operand, stored as it is or transposed (then read through `.t()`).
    fn operand(data: &[f32], rows: usize, cols: usize, transposed: bool) -> MatRef<'_> {
        if transposed { MatRef::rows(data, cols, rows).t() } else { MatRef::rows(data, rows, cols) }
    }

    #[test]
    fn row_major_products_match_naive_in_every_transpose() {
        let (m, n, k) = (7, 5, 9);
        let a: Vec<f32> = (0..m * k).map(|i| (i % 13) as f32 - 6.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 7) as f32 * 0.5).collect();
        let want = naive(m, n, k, &a, &b);
        let (at, bt) = (transpose(m, k, &a), transpose(k, n, &b));
        for (a_t, b_t) in [(false, false), (true, false), (false, true), (true, true)] {
            let mut c = vec![1.0; m * n];
            let aa = operand(if a_t { &at } else { &a }, m, k, a_t);
            let bb = operand(if b_t { &bt } else { &b }, k, n, b_t);
            gemm(MatMut::rows(&mut c, m, n), aa, bb, false, 1.0, 2);
            assert_eq!(c, want, "a_t={a_t} b_t={b_t}");
            gemm(MatMut::rows(&mut c, m, n), aa, bb, true, 1.0, 1);
            let doubled: Vec<f32> = want.iter().map(|v| 2.0 * v).collect();
            assert_eq!(c, doubled);
        }
    }

    /// Results must not depend on how many threads run them, so a spec gives the same weights
    /// on any machine: gemm splits the output, never a sum, across threads.
    #[test]
    fn product_bits_do_not_depend_on_threads() {
        for (m, n, k, a_t, b_t) in
            [(64, 128, 2000, false, false), (2000, 128, 64, true, false), (64, 2000, 128, false, true)]
        {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 37) % 101) as f32 / 101.0 - 0.5).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 53) % 89) as f32 / 89.0 - 0.5).collect();
            let run = |threads: usize| {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                let mut c = vec![0.0f32; m * n];
                let (aa, bb) = (operand(&a, m, k, a_t), operand(&b, k, n, b_t));
                pool.install(|| gemm(MatMut::rows(&mut c, m, n), aa, bb, false, 1.0, threads));
                c
            };
            let one = run(1);
            for t in [2, 3, 4] {
                assert!(run(t) == one, "{m}×{n}×{k} differs between 1 and {t} threads");
            }
        }
    }

    #[test]
    fn empty_products_write_nothing_and_zero_depth_clears() {
        let mut c = vec![3.0; 4];
        gemm(MatMut::rows(&mut c, 4, 0), MatRef::rows(&[1.0; 8], 4, 2), MatRef::rows(&[], 2, 0), false, 1.0, 1);
        assert_eq!(c, [3.0; 4]);
        gemm(MatMut::rows(&mut c, 2, 2), MatRef::rows(&[], 2, 0), MatRef::rows(&[], 0, 2), false, 1.0, 1);
        assert_eq!(c, [0.0; 4]);
    }
}
