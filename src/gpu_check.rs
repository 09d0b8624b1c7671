//! The checks the GPU engine is held to, callable from tests and the `gpu_bench` example:
//! numerics against the CPU engine (same spec, seed and batch, a few SGD steps) and training
//! throughput on synthetic data.

use crate::data::Batch;
use crate::engine::cuda::{CudaError, GpuReplica, SgdConfig, kernels, probe};
use crate::engine::optimizer::{Optimizer, Sgd};
use crate::engine::{LossFn, Sequential, Shape, init};
use crate::spec::ModelSpec;
use crate::strategy::{Replica, Variables};
use crate::vocab::LossKind;
use rand::RngExt;
use std::time::Instant;

/// The relative difference the GPU must stay within after a few steps.
pub const TOLERANCE: f64 = 1e-4;

/// What a CPU-vs-GPU comparison found.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    /// Largest per-tensor relative difference of the parameters and moving statistics:
    /// `max |gpu − cpu| / max |cpu|` over each tensor (absolute when the tensor is all zero).
    pub max_relative: f64,
    /// The tensor where it occurs.
    pub worst: String,
    /// Mean loss of each step, CPU and GPU.
    pub losses: Vec<(f64, f64)>,
}

/// The model `spec` builds for `input` and `classes`, or why it does not.
fn build(spec: &ModelSpec, input: &Shape, classes: usize) -> Result<Sequential, CudaError> {
    crate::model::build_spec(spec, input, classes)
        .map_err(|d| CudaError::Unsupported(format!("the model does not build: {d:?}")))
}

/// `n` seeded examples of `input` in `[0, 1)` with labels below `classes`.
pub fn synthetic_batch(input: &Shape, classes: usize, n: usize, seed: u64) -> Batch {
    let mut r = init::rng(&[seed, 0x5EED]);
    Batch {
        x: (0..n * input.numel()).map(|_| r.random_range(0.0..1.0)).collect(),
        y: (0..n).map(|_| r.random_range(0..classes as u32)).collect(),
        n,
        global_n: n,
        ..Batch::default()
    }
}

/// What a check trains: `spec`'s model for `input` and `classes` on `gpu:index`, `batch`
/// examples a step, for `steps` steps.
#[derive(Debug, Clone, Copy)]
pub struct Case<'a> {
    pub index: usize,
    pub spec: &'a ModelSpec,
    pub input: &'a Shape,
    pub classes: usize,
    pub batch: usize,
    pub steps: usize,
}

/// Opens `gpu:index` and places the GPU twin of `layout` on it, after probing everything it
/// needs.
fn gpu_replica(index: usize, layout: &Sequential, classes: usize, momentum: bool) -> Result<GpuReplica, CudaError> {
    probe::training(&[index])?;
    let ptx = kernels::compile()?.to_src();
    GpuReplica::new(index, &ptx, layout, classes, momentum)
}

/// Trains the case's model its steps of SGD (`sgd` at `lr`) on one seeded batch on the CPU
/// and on its GPU from the same initial weights, and compares the results.
pub fn compare_with_cpu(case: Case<'_>, sgd: SgdConfig, lr: f32) -> Result<Comparison, CudaError> {
    let Case { index, spec, input, classes, batch, steps } = case;
    let seed = 42;
    let layout = build(spec, input, classes)?;
    let mut gpu = gpu_replica(index, &layout, classes, sgd.momentum > 0.0)?;
    let (params, state) = layout.init(seed);
    gpu.arena().upload_params(gpu.gpu(), &params)?;
    gpu.arena().upload_state(gpu.gpu(), &state)?;
    let mut vars = Variables { params, state };
    let loss = LossFn { kind: LossKind::SparseCategoricalCrossentropy, from_logits: true };
    let mut cpu = Replica::new(build(spec, input, classes)?, loss, classes, 2);
    let mut optimizer = Optimizer::Sgd(Sgd::new(vars.params.len(), sgd.momentum, sgd.nesterov, sgd.weight_decay));
    let data = synthetic_batch(input, classes, batch, seed);
    let scale = 1.0 / batch as f32;
    let mut grads = vec![0.0; vars.params.len()];
    let mut losses = Vec::with_capacity(steps);
    for step in 0..steps {
        let c = cpu.forward_backward(&mut vars, &mut grads, &data, scale, step as u64, false);
        optimizer.step(&mut vars.params, &grads, lr);
        let g = gpu.train_step(&data.x, &data.y, data.n, scale, false)?;
        gpu.sgd(lr, sgd)?;
        losses.push((c.loss(), g.loss()));
    }
    let (mut params, mut state) = (vec![0.0; vars.params.len()], vec![0.0; vars.state.len()]);
    gpu.arena().download_params(gpu.gpu(), &mut params)?;
    gpu.arena().download_state(gpu.gpu(), &mut state)?;
    let (mut max_relative, mut worst) = (0.0, String::new());
    let tensors = layout.tensors().iter().map(|t| (t, &vars.params, &params));
    let states = layout.state_tensors().iter().map(|t| (t, &vars.state, &state));
    for (t, cpu, gpu) in tensors.chain(states) {
        let (c, g) = (&cpu[t.range()], &gpu[t.range()]);
        let scale = c.iter().fold(0.0f64, |m, v| m.max(f64::from(v.abs())));
        let diff = c.iter().zip(g).fold(0.0f64, |m, (a, b)| m.max(f64::from((a - b).abs())));
        let rel = if scale > 0.0 { diff / scale } else { diff };
        // NaN on either side must fail the check, not hide behind `max`.
        if rel > max_relative || rel.is_nan() {
            max_relative = if rel.is_nan() { f64::INFINITY } else { rel };
            worst.clone_from(&t.name);
        }
    }
    Ok(Comparison { max_relative, worst, losses })
}

/// One throughput measurement on a GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuThroughput {
    /// The device's name.
    pub device: String,
    /// Examples per step.
    pub batch: usize,
    /// Median milliseconds per step (upload, forward, backward, SGD).
    pub ms_per_step: f64,
    /// Examples per second at the median step time.
    pub examples_per_s: f64,
}

/// Trains the case's model on its GPU on seeded random data (SGD, momentum 0.9) and times its
/// steps after a warm-up; each step uploads its batch, as a run does.
pub fn throughput(case: Case<'_>) -> Result<GpuThroughput, CudaError> {
    let Case { index, spec, input, classes, batch, steps } = case;
    let layout = build(spec, input, classes)?;
    let mut gpu = gpu_replica(index, &layout, classes, true)?;
    let (params, state) = layout.init(7);
    gpu.arena().upload_params(gpu.gpu(), &params)?;
    gpu.arena().upload_state(gpu.gpu(), &state)?;
    let data = synthetic_batch(input, classes, batch, 7);
    let cfg = SgdConfig { momentum: 0.9, nesterov: false, weight_decay: 0.0 };
    let mut step = || -> Result<f64, CudaError> {
        let t = Instant::now();
        gpu.train_step(&data.x, &data.y, data.n, 1.0 / batch as f32, false)?;
        gpu.sgd(0.01, cfg)?;
        gpu.gpu().sync()?;
        Ok(t.elapsed().as_secs_f64())
    };
    for _ in 0..5 {
        step()?;
    }
    let mut times = (0..steps.max(1)).map(|_| step()).collect::<Result<Vec<f64>, CudaError>>()?;
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    Ok(GpuThroughput {
        device: gpu.gpu().name()?,
        batch,
        ms_per_step: median * 1e3,
        examples_per_s: batch as f64 / median,
    })
}
