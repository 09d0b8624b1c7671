//! Optimizers over the flat parameter arena; their state lives in flat buffers of the same
//! length, so it checkpoints as plainly as the weights.

mod adam;
mod clip;
mod fused;
mod sgd;

pub use adam::Adam;
pub use clip::{clip_by_global_norm, global_norm};
use clip::{clip_scale, global_norm_of_sum};
pub use fused::{FusedStep, SliceStep};
pub use sgd::{Sgd, SgdRule};

use rayon::prelude::*;

/// Values each thread updates at a time: big enough to amortize scheduling, small enough
/// to keep two threads busy on the smallest models.
const CHUNK: usize = 1 << 15;

/// An optimizer with its state.
#[derive(Debug, Clone, PartialEq)]
pub enum Optimizer {
    /// SGD with optional (Nesterov) momentum and L2 weight decay.
    Sgd(Sgd),
    /// Adam, or AdamW when its weight decay is decoupled.
    Adam(Adam),
}

impl Optimizer {
    /// Applies one update with learning rate `lr` to `params` from `grads`.
    pub fn step(&mut self, params: &mut [f32], grads: &[f32], lr: f32) {
        self.step_sum(params, &[grads], lr);
    }

    /// Applies one update from the sum of several replicas' gradient buffers, added inside the
    /// update pass (in order, as `reduction_to_one_device` adds them), so that the sum is never
    /// written back and each replica's buffer is read once.
    ///
    /// With a clip norm, every value is scaled by the clip factor of the global norm of the
    /// buffers' sum (taken in the same order, never stored), as it is read: every strategy hands
    /// this the reduced gradient, so every replica clips the same values identically.
    pub fn step_sum(&mut self, params: &mut [f32], grads: &[&[f32]], lr: f32) {
        let scale = self.clip_norm().map_or(1.0, |clip_norm| clip_scale(global_norm_of_sum(grads), clip_norm));
        self.update(params, grads, lr, scale);
    }

    /// The update from the sum of `grads`, each summed value multiplied by `scale` first.
    fn update(&mut self, params: &mut [f32], grads: &[&[f32]], lr: f32, scale: f32) {
        match self {
            Optimizer::Sgd(o) => o.step(params, grads, lr, scale),
            Optimizer::Adam(o) => o.step(params, grads, lr, scale),
        }
    }

    /// The same optimizer clipping each update's gradient to a global norm of `clip_norm`.
    pub fn with_clip_norm(mut self, clip_norm: Option<f32>) -> Self {
        match &mut self {
            Optimizer::Sgd(o) => o.clip_norm = clip_norm,
            Optimizer::Adam(o) => o.clip_norm = clip_norm,
        }
        self
    }

    /// The global norm gradients are clipped to, if any.
    pub fn clip_norm(&self) -> Option<f32> {
        match self {
            Optimizer::Sgd(o) => o.clip_norm,
            Optimizer::Adam(o) => o.clip_norm,
        }
    }

    /// This step's update, for a backward pass that applies it where each gradient is made
    /// (see [`FusedStep`]); `None` when the update needs the whole gradient first (Adam's
    /// moments, Nesterov's look-ahead, clipping by the global norm). Counts the update as applied.
    pub fn fused(&mut self, lr: f32) -> Option<FusedStep<'_>> {
        match self {
            Optimizer::Sgd(o) if !o.nesterov && o.clip_norm.is_none() => {
                o.iterations += 1;
                let rule = o.rule(lr);
                Some(FusedStep::new(rule, o.velocity.as_deref_mut()))
            }
            Optimizer::Sgd(_) | Optimizer::Adam(_) => None,
        }
    }

    /// Named state buffers, for checkpoints (`momentum`; `m`, `v`).
    pub fn state(&self) -> Vec<(&'static str, &[f32])> {
        match self {
            Optimizer::Sgd(o) => o.velocity.iter().map(|v| ("momentum", v.as_slice())).collect(),
            Optimizer::Adam(o) => vec![("m", o.m.as_slice()), ("v", o.v.as_slice())],
        }
    }

    /// Named state buffers, mutable, for restoring a checkpoint.
    pub fn state_mut(&mut self) -> Vec<(&'static str, &mut Vec<f32>)> {
        match self {
            Optimizer::Sgd(o) => o.velocity.iter_mut().map(|v| ("momentum", v)).collect(),
            Optimizer::Adam(o) => vec![("m", &mut o.m), ("v", &mut o.v)],
        }
    }

    /// Updates applied so far.
    pub fn iterations(&self) -> u64 {
        match self {
            Optimizer::Sgd(o) => o.iterations,
            Optimizer::Adam(o) => o.iterations,
        }
    }

    /// Sets the update count (when restoring a checkpoint).
    pub fn set_iterations(&mut self, n: u64) {
        match self {
            Optimizer::Sgd(o) => o.iterations = n,
            Optimizer::Adam(o) => o.iterations = n,
        }
    }
}

fn split(s: &mut [f32], chunks: usize) -> Vec<&mut [f32]> {
    if s.is_empty() { (0..chunks).map(|_| <&mut [f32]>::default()).collect() } else { s.chunks_mut(CHUNK).collect() }
}

/// Values summed at a time when several gradient buffers meet in an update: a stack buffer
/// that stays in L1.
const SUM_BLOCK: usize = 1 << 10;

/// Runs `f(offset, …)` over aligned chunks of the parameter, gradient and up to two state
/// buffers, `offset` being the chunk's first index in the arena; with several gradient
/// buffers, `f` sees their sum (added in buffer order), block by block, and with a `scale`
/// other than 1 (global-norm clipping) the sum times `scale`.
fn for_chunks(
    params: &mut [f32],
    grads: &[&[f32]],
    scale: f32,
    a: &mut [f32],
    b: &mut [f32],
    f: impl Fn(usize, &mut [f32], &[f32], &mut [f32], &mut [f32]) + Sync,
) {
    // Empty state buffers stand for "no state": give each chunk an empty slice.
    let chunks = params.len().div_ceil(CHUNK);
    let (a, b) = (split(a, chunks), split(b, chunks));
    params.par_chunks_mut(CHUNK).zip(a.into_par_iter().zip(b)).enumerate().for_each(|(c, (p, (a, b)))| {
        let at = c * CHUNK;
        match grads {
            [g] if scale == 1.0 => f(at, p, &g[at..at + p.len()], a, b),
            _ => sum_blocks(p, grads, scale, at, a, b, &f),
        }
    });
}

/// `f` over blocks of one chunk (starting at arena index `at`), with the gradient buffers
/// summed into a stack block first and multiplied by `scale` unless it is 1. The update is
/// elementwise, so blocks change no result.
fn sum_blocks(
    p: &mut [f32],
    grads: &[&[f32]],
    scale: f32,
    at: usize,
    a: &mut [f32],
    b: &mut [f32],
    f: &(impl Fn(usize, &mut [f32], &[f32], &mut [f32], &mut [f32]) + Sync),
) {
    let mut sum = [0.0f32; SUM_BLOCK];
    let mut start = 0;
    for p in p.chunks_mut(SUM_BLOCK) {
        let (len, from) = (p.len(), at + start);
        let sum = &mut sum[..len];
        crate::engine::simd::vectorized(|| match grads.split_first() {
            Some((first, rest)) => {
                // The first two buffers meet in one pass (mirrored's two replicas: no copy
                // first), adding in the same order and so to the same bits.
                let first = &first[from..from + len];
                let rest = match rest.split_first() {
                    Some((second, rest)) => {
                        let pairs = first.iter().zip(&second[from..from + len]);
                        sum.iter_mut().zip(pairs).for_each(|(s, (a, b))| *s = a + b);
                        rest
                    }
                    None => {
                        sum.copy_from_slice(first);
                        rest
                    }
                };
                for g in rest {
                    sum.iter_mut().zip(&g[from..from + len]).for_each(|(s, v)| *s += v);
                }
                if scale != 1.0 {
                    sum.iter_mut().for_each(|s| *s *= scale);
                }
            }
            None => sum.fill(0.0),
        });
        f(from, p, sum, block(a, start, len), block(b, start, len));
        start += len;
    }
}

/// `s[start..start + len]`, or `s` itself when it is empty ("no state").
fn block(s: &mut [f32], start: usize, len: usize) -> &mut [f32] {
    if s.is_empty() { s } else { &mut s[start..start + len] }
}
