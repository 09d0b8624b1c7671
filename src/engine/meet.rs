//! Replicas in one process meeting inside backward (`mirrored`, `central_storage`).
//!
//! One replica updates its big dense kernel inside the product that computes its gradient, so
//! that gradient (11 MB in the tutorial model) is never stored. Replicas that each stored their
//! own and then summed them in the optimizer pass moved three times that through memory, more
//! than the L3 holds. Instead they meet at the layer with the biggest kernel
//! ([`crate::engine::Sequential::meet`]): the kernel is cut into fixed blocks of rows, dealt to
//! the threads, and each block takes every replica's `dx` columns (with the weights forward
//! used), every replica's gradient product into a block of scratch, and then its update from
//! their sum, while it is still in cache. The sum is added in replica order and updated with
//! the optimizer's own arithmetic, as the optimizer pass over stored gradients did, so the
//! weights are the same bits.

use super::activation::relu_mask;
use super::bf16::{self, ProductPath};
use super::kernels::{partition, split_rows};
use super::optimizer::SliceStep;
use super::sparse::{self, Columns};
use super::strided::{ColumnBlock, MatMut, MatRef};
use rayon::prelude::*;
use std::ops::Range;

thread_local! {
    /// Each thread's block of `dx` columns for a bf16 product ([`RowBlock::dx`]).
    static DX_BLOCK: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Kernel rows per block: with 128 units a block of the kernel, its velocity and each
/// replica's gradient product are 128 KiB each, in L2 beside the block's columns of `x`.
pub const BLOCK_ROWS: usize = 256;

/// What one replica brings to the meeting layer: its forward input, the gradient before the
/// activation, and where its input gradient goes.
#[derive(Debug)]
pub struct Meeting<'a> {
    /// The layer's input, `n × inputs`.
    pub x: &'a [f32],
    /// The gradient before the activation, `n × units`.
    pub dz: &'a [f32],
    /// The input gradient, `n × inputs`; `None` for a model's first layer.
    pub dx: Option<&'a mut [f32]>,
    /// `x` is a ReLU's output, and `dx` goes through its derivative here (the layer below
    /// then takes it as it is).
    pub mask: bool,
    /// Examples.
    pub n: usize,
    /// The kernel's rows.
    pub inputs: usize,
    /// The kernel's columns.
    pub units: usize,
    /// How the layer's dense products run (the precision policy).
    pub products: ProductPath,
}

/// `dx = dz · kernelᵀ` for every replica and the kernel's update from the sum of their
/// `xᵀ · dz`, block of rows by block, the blocks dealt to `parts` threads in contiguous runs.
/// `scratch` holds the blocks' products between calls. The blocks are fixed, so the bits do
/// not depend on `parts`.
pub fn update_kernel(
    kernel: &mut [f32],
    update: &mut SliceStep<'_>,
    meetings: &mut [Meeting<'_>],
    parts: usize,
    scratch: &mut Vec<f32>,
) {
    let Some(first) = meetings.first() else { return };
    let (inputs, units, products) = (first.inputs, first.units, first.products);
    assert!(
        meetings.iter().all(|m| (m.inputs, m.units, m.products) == (inputs, units, products))
            && kernel.len() == inputs * units,
        "replicas met at layers of different shapes"
    );
    let runs = runs(inputs, parts);
    let block_len = BLOCK_ROWS * units;
    let per_run = meetings.len() * block_len;
    scratch.resize(runs.len() * per_run, 0.0);
    let replicas: Vec<(&[f32], &[f32], usize, bool)> = meetings.iter().map(|m| (m.x, m.dz, m.n, m.mask)).collect();
    // Each run's columns of every replica's `dx`.
    let mut dxs: Vec<Vec<Option<ColumnBlock<'_>>>> = runs.iter().map(|_| Vec::new()).collect();
    for m in meetings.iter_mut() {
        match m.dx.as_deref_mut() {
            Some(dx) => {
                for (run, cols) in MatMut::rows(dx, m.n, inputs).split_cols(&runs).into_iter().enumerate() {
                    dxs[run].push(Some(cols));
                }
            }
            None => dxs.iter_mut().for_each(|d| d.push(None)),
        }
    }
    let kernels = split_rows(kernel, &runs, units);
    let steps = update.split(&runs.iter().map(|r| r.start * units..r.end * units).collect::<Vec<_>>());
    let work = kernels.into_par_iter().zip(steps).zip(dxs).zip(scratch.par_chunks_mut(per_run)).zip(&runs);
    work.for_each(|((((w, mut step), mut dxs), sums), run)| {
        let mut columns = Columns::default();
        for start in run.clone().step_by(BLOCK_ROWS) {
            let rows = start..(start + BLOCK_ROWS).min(run.end);
            let local = rows.start - run.start..rows.end - run.start;
            let w = &mut w[local.start * units..local.end * units];
            let len = rows.len() * units;
            for ((sum, dx), &(x, dz, n, mask)) in sums.chunks_mut(block_len).zip(&mut dxs).zip(&replicas) {
                let block =
                    RowBlock { x, dz, n, inputs, units, rows: rows.clone(), local: local.clone(), mask, products };
                let sparse = block.dx(&mut columns, dx.as_mut(), w);
                block.product(&columns, sparse, &mut sum[..len], None, 1.0);
            }
            let grads: Vec<&[f32]> = sums.chunks(block_len).map(|s| &s[..len]).collect();
            step.sub(local.start * units..local.end * units).apply_sum(w, &grads);
        }
    });
}

/// The kernel's rows cut into fixed blocks of [`BLOCK_ROWS`] and dealt to `parts` threads in
/// contiguous runs, so that every product has the same shape on any number of threads.
pub fn runs(inputs: usize, parts: usize) -> Vec<Range<usize>> {
    partition(inputs.div_ceil(BLOCK_ROWS), parts)
        .into_iter()
        .map(|b| (b.start * BLOCK_ROWS).min(inputs)..(b.end * BLOCK_ROWS).min(inputs))
        .collect()
}

/// One replica's products for one block of kernel rows: its input `x` (`n × inputs`), the
/// gradient `dz` (`n × units`), the block's kernel `rows` (`local` within the thread's run),
/// and whether `x` is a ReLU's output whose derivative `dx` goes through here.
#[derive(Debug)]
pub struct RowBlock<'a> {
    pub x: &'a [f32],
    pub dz: &'a [f32],
    pub n: usize,
    pub inputs: usize,
    pub units: usize,
    pub rows: Range<usize>,
    pub local: Range<usize>,
    pub mask: bool,
    pub products: ProductPath,
}

impl RowBlock<'_> {
    /// Writes the block's columns of `dx`, if any, with the block's kernel rows `w`, and
    /// returns whether the block walks the nonzeros of its columns of `x`
    /// ([`sparse::backward_pays`]; only where ReLU's derivative or no `dx` lets the zeros go),
    /// which `columns` then holds for [`RowBlock::product`]. Otherwise gemm, and the mask after.
    pub fn dx(&self, columns: &mut Columns, dx: Option<&mut ColumnBlock<'_>>, w: &[f32]) -> bool {
        let (x, dz, n, inputs, units, rows) = (self.x, self.dz, self.n, self.inputs, self.units, &self.rows);
        let mut dx = dx;
        if (self.mask || dx.is_none())
            && sparse::backward_pays(columns.count(x, n, inputs, rows.clone()), n * rows.len())
        {
            columns.fill(x, n, inputs, rows.clone(), |b, idx, val| {
                if let Some(dx) = dx.as_mut() {
                    let d = dx.row_mut(b, self.local.clone());
                    sparse::masked_dx_row(d, idx, val, &dz[b * units..][..units], w, units);
                }
            });
            return true;
        }
        if let Some(dx) = dx {
            let (dz, w) = (MatRef::rows(dz, n, units), MatRef::rows(w, rows.len(), units).t());
            match self.products {
                ProductPath::Float32 => dx.gemm(self.local.clone(), dz, w, 1.0),
                // The bf16 kernels store whole rows, not a block's columns of `dx`'s: into a
                // dense block first, then copied (n × 256 values, from cache).
                path => DX_BLOCK.with_borrow_mut(|block| {
                    let cols = rows.len();
                    block.resize(n * cols, 0.0);
                    bf16::gemm(path, MatMut::rows(block, n, cols), dz, w, false, 1.0, 1);
                    dx.for_each_row(self.local.clone(), |i, d| d.copy_from_slice(&block[i * cols..][..cols]));
                }),
            }
            if self.mask {
                dx.for_each_row(self.local.clone(), |i, d| relu_mask(&x[i * inputs + rows.start..][..d.len()], d));
            }
        }
        false
    }

    /// `target = keep·target + scale·g` with the block's `g = xᵀ · dz`, over the nonzeros
    /// `columns` holds when [`RowBlock::dx`] chose the walk (`sparse`), else with gemm.
    pub fn product(&self, columns: &Columns, sparse: bool, target: &mut [f32], keep: Option<f32>, scale: f32) {
        let (n, units) = (self.n, self.units);
        if sparse {
            columns.product(target, self.dz, units, keep, scale);
            return;
        }
        let xt = MatRef::rows(self.x, n, self.inputs).block(0..n, self.rows.clone()).t();
        let target = MatMut::rows(target, self.rows.len(), units);
        bf16::product(self.products, target, xt, MatRef::rows(self.dz, n, units), keep, scale, 1);
    }
}
