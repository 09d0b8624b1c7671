//! Step-time measurement of the GPT layers (ignored by default): forward + backward of
//! nanoGPT's CPU "baby" Shakespeare model (4 layers, 4 heads, width 128, block 64, batch 12)
//! on random inputs, in a rayon pool of the measured thread count. Run with
//! `cargo test --release --lib engine::layers::bench -- --ignored --nocapture --test-threads 1`;
//! `tests/bench/torch_gpt_blocks.py` times the same stacks in PyTorch eager.

use super::{BlockConfig, Embedding, GeluForm, LayerNorm, LmHead, PositionEmbedding, TransformerBlock};
use crate::engine::{Layer, Pass, Sequential, Shape, init};
use rand::RngExt;
use std::time::{Duration, Instant};

const BATCH: usize = 12;
const SEQ: usize = 64;
const DIM: usize = 128;
const HEADS: usize = 4;
const LAYERS: usize = 4;
const VOCAB: usize = 65;

fn blocks() -> Vec<Box<dyn Layer>> {
    let cfg = BlockConfig {
        seq_len: SEQ,
        dim: DIM,
        heads: HEADS,
        hidden: 4 * DIM,
        dropout: 0.0,
        epsilon: 1e-5,
        gelu: GeluForm::Exact,
        layers: LAYERS,
    };
    (0..LAYERS)
        .map(|i| match TransformerBlock::new(cfg, i as u64) {
            Some(b) => Box::new(b) as Box<dyn Layer>,
            None => panic!("block config refused"),
        })
        .collect()
}

/// The whole model: token and position embeddings, the blocks, a final norm, the tied head.
fn gpt() -> Vec<Box<dyn Layer>> {
    let Some(pos) = PositionEmbedding::new(SEQ, SEQ, DIM) else { panic!("position embedding refused") };
    let mut layers: Vec<Box<dyn Layer>> = vec![Box::new(Embedding::new(VOCAB, DIM, SEQ)), Box::new(pos)];
    layers.extend(blocks());
    layers.push(Box::new(LayerNorm::new(Shape(vec![SEQ, DIM]), 1e-5)));
    layers.push(Box::new(LmHead::tied(SEQ, DIM, VOCAB, "embedding/embeddings")));
    layers
}

/// CPU time this process has used, all threads together.
fn cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime only writes the struct it is given.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime failed");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Median wall-clock forward, backward and whole-step times, and the median CPU time of a
/// step (all threads), over `steps` steps after 3 warm-up steps. On a shared machine the CPU
/// time is the steadier figure: it does not count the time other processes hold the cores.
fn time(layers: Vec<Box<dyn Layer>>, input: Shape, ids: bool, threads: usize, steps: usize) -> [Duration; 4] {
    let Ok(mut model) = Sequential::try_new(input.clone(), layers) else { panic!("model refused") };
    let mut r = init::rng(&[5]);
    let x: Vec<f32> = (0..BATCH * input.numel())
        .map(|_| if ids { r.random_range(0..VOCAB) as f32 } else { r.random_range(-1.0..1.0) })
        .collect();
    let (params, mut state) = model.init(1);
    let mut grads = vec![0.0; params.len()];
    let dy: Vec<f32> = (0..BATCH * model.output_shape().numel()).map(|_| r.random_range(-1.0..1.0)).collect();
    let Ok(pool) = rayon::ThreadPoolBuilder::new().num_threads(threads).build() else { panic!("no thread pool") };
    let mut times: Vec<[Duration; 4]> = pool.install(|| {
        (0..steps + 3)
            .map(|step| {
                let pass = Pass { training: true, seed: step as u64, accumulate: false, threads };
                let (c0, t0) = (cpu_time(), Instant::now());
                model.forward(pass, &params, &mut state, &x, BATCH);
                let t1 = Instant::now();
                model.output_and_grad(BATCH).1.copy_from_slice(&dy);
                let t2 = Instant::now();
                model.backward(pass, &params, &mut grads, &x, BATCH);
                let (t3, c1) = (Instant::now(), cpu_time());
                [t1 - t0, t3 - t2, t3 - t0, c1 - c0]
            })
            .skip(3)
            .collect()
    });
    let mut med = [Duration::ZERO; 4];
    for (k, m) in med.iter_mut().enumerate() {
        times.sort_by_key(|t| t[k]);
        *m = times[times.len() / 2][k];
    }
    med
}

fn report(name: &str, layers: Vec<Box<dyn Layer>>, input: Shape, ids: bool, threads: usize) {
    let [f, b, step, cpu] = time(layers, input, ids, threads, 30);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let tokens = (BATCH * SEQ) as f64;
    eprintln!(
        "{name} threads {threads}: fwd+bwd {:7.2} ms (fwd {:6.2}, bwd {:6.2}) → {:7.0} tokens/s; CPU {:7.2} ms/step → {:7.0} tokens/CPU-s",
        ms(step),
        ms(f),
        ms(b),
        tokens / step.as_secs_f64(),
        ms(cpu),
        tokens / cpu.as_secs_f64()
    );
}

#[test]
#[ignore = "timing; run on an idle machine"]
fn gpt_blocks_step_time() {
    let threads = std::env::var("BENCH_THREADS").ok().and_then(|t| t.parse().ok()).unwrap_or(2);
    report("4 blocks", blocks(), Shape(vec![SEQ, DIM]), false, threads);
    report("gpt (tied head)", gpt(), Shape(vec![SEQ]), true, threads);
}
