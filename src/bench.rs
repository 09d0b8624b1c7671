//! `trainrun bench`: training throughput of the tutorial model (forward + backward + SGD
//! update) at batch 64 and 128 on 1 and 2 threads, through the same replica and optimizer
//! code a run uses. Inputs are seeded random images, so no dataset is needed.

use crate::data::Batch;
use crate::engine::init;
use crate::engine::optimizer::{Optimizer, Sgd};
use crate::engine::{LossFn, Shape};
use crate::spec::{Loss, ModelSpec, ZooModel};
use crate::strategy::{Replica, Variables};
use rand::RngExt;
use std::time::Instant;

/// One measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Throughput {
    /// Examples per step.
    pub batch: usize,
    /// Compute threads.
    pub threads: usize,
    /// Median milliseconds per step.
    pub ms_per_step: f64,
    /// Examples per second at the median step time.
    pub examples_per_s: f64,
}

/// Measures one configuration: `steps` timed steps after a warm-up, median step time.
pub fn measure(batch: usize, threads: usize, steps: usize) -> Result<Throughput, String> {
    let spec = ModelSpec { zoo: Some(ZooModel::MnistCnn), layers: Vec::new() };
    let model = crate::model::build(&spec, &Shape(vec![28, 28, 1]), 10).map_err(|d| format!("{d:?}"))?;
    let (params, state) = model.init(42);
    let mut vars = Variables { params, state };
    let mut optimizer = Optimizer::Sgd(Sgd::new(vars.params.len(), 0.9, false, 0.0));
    let loss = LossFn { kind: Loss::SparseCategoricalCrossentropy, from_logits: true };
    let mut replica = Replica::new(model, loss, 10, threads);
    let mut r = init::rng(&[7]);
    let batch_data = Batch {
        x: (0..batch * 784).map(|_| r.random_range(0.0..1.0)).collect(),
        y: (0..batch).map(|_| r.random_range(0..10)).collect(),
        n: batch,
        global_n: batch,
    };
    let mut grads = vec![0.0; vars.params.len()];
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().map_err(|e| e.to_string())?;
    let mut times = pool.install(|| {
        let mut step = |i: u64| {
            let t = Instant::now();
            replica.forward_backward(&mut vars, &mut grads, &batch_data, 1.0 / batch as f32, i, false);
            optimizer.step(&mut vars.params, &grads, 0.01);
            t.elapsed().as_secs_f64()
        };
        (0..5).for_each(|i| {
            step(i);
        });
        (0..steps as u64).map(step).collect::<Vec<f64>>()
    });
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    Ok(Throughput { batch, threads, ms_per_step: median * 1e3, examples_per_s: batch as f64 / median })
}

/// Prints the throughput table.
pub fn run(quick: bool) -> Result<(), String> {
    let steps = if quick { 20 } else { 100 };
    println!("tutorial model (2,770,634 params), forward + backward + SGD update, median of {steps} steps");
    println!("{:>6} {:>8} {:>10} {:>12}", "batch", "threads", "ms/step", "examples/s");
    for batch in [64, 128] {
        for threads in [1, 2] {
            let t = measure(batch, threads, steps)?;
            println!("{:>6} {:>8} {:>10.2} {:>12.0}", t.batch, t.threads, t.ms_per_step, t.examples_per_s);
        }
    }
    Ok(())
}
