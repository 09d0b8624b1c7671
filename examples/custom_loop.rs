//! A custom training loop written against the trainrun library: load a spec, plan it, build
//! the model and the input pipeline from the plan, and step by hand, printing the loss.
//!
//! ```text
//! TRAINRUN_DATA_DIR=../shared/data/mnist cargo run --release --example custom_loop -- specs/mnist_single.toml
//! ```

use std::num::NonZeroUsize;
use std::sync::Arc;
use trainrun::data::{Cursor, DataDirs, Pipeline, PipelineOptions, Shard};
use trainrun::engine::Pass;
use trainrun::plan::{Facts, Hardware, Plan, PlanError};

fn main() -> anyhow::Result<()> {
    let path = std::env::args().nth(1).unwrap_or_else(|| "specs/mnist_single.toml".into());
    let env: Vec<(String, String)> = std::env::vars().collect();

    // Spec → plan, exactly as `trainrun` does it.
    let loaded = trainrun::spec::load(path.as_ref(), &env, &[]).map_err(|e| anyhow::anyhow!("{e}"))?;
    let source = trainrun::plan::source(&loaded.spec.data, &DataDirs::from_process_env(), loaded.spec.run.seed)?;
    let cluster = trainrun::cluster::Resolution { cluster: trainrun::cluster::Cluster::single(), task: None };
    let memory = trainrun::machine_memory::read(&[])?;
    let facts = Facts {
        data: source.facts()?,
        source,
        cores: 2,
        hardware: Hardware { gpus: 0 },
        cluster,
        memory,
        bf16: trainrun::engine::bf16::Bf16Support::detect(),
    };
    let plan = Plan::new(&loaded.spec, &facts).map_err(|e| match e {
        PlanError::Spec(d) => anyhow::anyhow!("{}", trainrun::spec::render(&d, &loaded.origins)),
        PlanError::TooBig(too_big) => anyhow::anyhow!("{too_big}"),
    })?;

    // The planned model, its initial weights, and the optimizer the plan chose.
    let mut model = plan.model.build()?;
    let (mut params, mut state) = model.init(plan.seed);
    let mut grads = vec![0.0; params.len()];
    let mut optimizer = trainrun::builder::optimizer(&plan.optimizer, model.tensors(), params.len());
    let loss = plan.train.loss_fn();

    // The input pipeline: shuffled, batched, prefetched on a background thread.
    let batch = NonZeroUsize::new(plan.batch.global).unwrap_or(NonZeroUsize::MIN);
    let d = &plan.data;
    let options = PipelineOptions {
        seed: plan.seed,
        shuffle: d.shuffle,
        global_batch: batch,
        drop_remainder: d.drop_remainder,
        prefetch: d.prefetch,
        shard: Shard::WHOLE,
    };
    let mut pipeline = Pipeline::new(Arc::new(d.source.load()?), &options, Cursor::default())?;

    for step in 0..100u64 {
        let b = pipeline.next_batch()?;
        let pass = Pass { training: true, seed: step, accumulate: false, threads: plan.threads };
        model.forward(pass, &params, &mut state, &b.x, b.n);
        let (out, dout) = model.output_and_grad(b.n);
        // The mean over the batch's loss terms: examples, or every position of text windows.
        let stats = loss.evaluate(out, b.truth(), plan.model.classes, 1.0 / b.global_rows() as f32, Some(dout));
        model.backward(pass, &params, &mut grads, &b.x, b.n);
        optimizer.step(&mut params, &grads, plan.learning_rate.at(step) as f32);
        if step % 10 == 0 {
            println!("step {step:3}  loss {:.4}  accuracy {:.3}", stats.loss(), stats.accuracy());
        }
        pipeline.recycle(b);
    }
    Ok(())
}
