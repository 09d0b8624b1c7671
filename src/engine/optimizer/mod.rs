//! Optimizers over the flat parameter arena; their state lives in flat buffers of the same
//! length, so it checkpoints as plainly as the weights.

mod adam;
mod clip;
mod sgd;

pub use adam::Adam;
pub use clip::{clip_by_global_norm, global_norm};
pub use sgd::Sgd;

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
        match self {
            Optimizer::Sgd(o) => o.step(params, grads, lr),
            Optimizer::Adam(o) => o.step(params, grads, lr),
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

/// Runs `f(offset, …)` over aligned chunks of the parameter, gradient and up to two state
/// buffers; `offset` is the chunk's first index in the arena.
fn for_chunks(
    params: &mut [f32],
    grads: &[f32],
    a: &mut [f32],
    b: &mut [f32],
    f: impl Fn(usize, &mut [f32], &[f32], &mut [f32], &mut [f32]) + Sync,
) {
    // Empty state buffers stand for "no state": give each chunk an empty slice.
    let chunks = params.len().div_ceil(CHUNK);
    let (a, b) = (split(a, chunks), split(b, chunks));
    params
        .par_chunks_mut(CHUNK)
        .zip(grads.par_chunks(CHUNK))
        .zip(a.into_par_iter().zip(b))
        .enumerate()
        .for_each(|(i, ((p, g), (a, b)))| f(i * CHUNK, p, g, a, b));
}
