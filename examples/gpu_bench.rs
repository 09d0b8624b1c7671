//! The GPU figures of issue 5 (the default `cuda` feature): numerics of the GPU engine against the CPU
//! engine (same spec, seed and batch, a few SGD steps; relative difference ≤ 1e-4), then
//! training throughput of the tutorial model (batch 1024) and of ResNet-20 on synthetic
//! CIFAR-shaped data (32×32×3, 10 classes).
//!
//! ```text
//! cargo build --release --example gpu_bench
//! target/release/examples/gpu_bench [GPU_INDEX]
//! ```
//!
//! Exits 3 with the probe's message when the machine cannot run CUDA.

use std::process::ExitCode;
use trainrun::engine::Shape;
use trainrun::engine::cuda::{CudaError, SgdConfig, probe};
use trainrun::gpu_check::{self as check, Case, TOLERANCE};
use trainrun::spec::{ModelSpec, ZooModel};

fn main() -> ExitCode {
    let index = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(0);
    if let Err(e) = probe::training(&[index]) {
        eprintln!("error: {e}");
        return ExitCode::from(3);
    }
    match run(index) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

/// Runs every check and measurement; false when a numerics check fails.
fn run(index: usize) -> Result<bool, CudaError> {
    let zoo = |m| ModelSpec { zoo: Some(m), ..ModelSpec::default() };
    let (mnist, cifar) = (Shape(vec![28, 28, 1]), Shape(vec![32, 32, 3]));
    let sgd = SgdConfig { momentum: 0.9, nesterov: false, weight_decay: 0.0 };
    let mut ok = true;
    for (name, spec, input, batch) in
        [("mnist_cnn", zoo(ZooModel::MnistCnn), &mnist, 64), ("resnet20", zoo(ZooModel::Resnet20), &cifar, 32)]
    {
        let case = Case { index, spec: &spec, input, classes: 10, batch, steps: 3 };
        let c = check::compare_with_cpu(case, sgd, 0.01)?;
        let verdict = if c.max_relative <= TOLERANCE { "ok" } else { "FAILED" };
        ok &= c.max_relative <= TOLERANCE;
        println!(
            "numerics {name:<10} batch {batch:>4}, 3 SGD steps: max relative difference {:.2e} at {} (≤ {TOLERANCE:e}: {verdict})",
            c.max_relative, c.worst
        );
    }
    for (name, spec, input, batch) in [
        ("mnist_cnn", zoo(ZooModel::MnistCnn), &mnist, 1024),
        ("resnet20", zoo(ZooModel::Resnet20), &cifar, 128),
        ("resnet20", zoo(ZooModel::Resnet20), &cifar, 1024),
    ] {
        let t = check::throughput(Case { index, spec: &spec, input, classes: 10, batch, steps: 20 })?;
        println!(
            "throughput {name:<10} batch {batch:>4} on {}: {:.1} ms/step, {:.0} examples/s",
            t.device, t.ms_per_step, t.examples_per_s
        );
    }
    Ok(ok)
}
