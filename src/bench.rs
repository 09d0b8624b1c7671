//! `trainrun bench`: the figures the targets are stated in, measured the way a user would see
//! them: training throughput of the tutorial model (forward + backward + SGD update, through
//! the same replica and optimizer code a run uses, on seeded random images) at batch 64 and
//! 128 on 1 and 2 threads; all-reduce time and bus bandwidth between real processes; and the
//! checked-in jobs end to end (throughput, launch to exit, memory, time to 98%), which need
//! the MNIST files. Where a peer applies it is measured alongside, from `benches/`: JAX's
//! jitted step (throughput pairs) and TensorFlow's time to 98%, each skipped with a reason when
//! its Python package is missing (`TRAINRUN_BENCH_PYTHON` names the interpreter). The GPT of
//! `specs/shakespeare_char.toml` is held against PyTorch eager (`gpt.rs`), the tokenizers and
//! Parquet text reading against `tiktoken`, `tokenizers` and pyarrow (`corpus.rs`); what a worker's
//! `kill -9` costs under `parameter_server` is `kill.rs`; the times to 98 % are `tta.rs`.

pub mod augment;
mod corpus;
mod gpt;
mod kill;
mod precision;
mod predict;
mod products;
pub mod scale;
mod sparse;
mod tls;
mod tta;

use crate::data::Batch;
use crate::engine::init;
use crate::engine::optimizer::{Optimizer, Sgd};
use crate::engine::{LossFn, Shape};
use crate::spec::{LossKind, ModelSpec, ZooModel};
use crate::strategy::{BatchView, Replica, Variables};
use rand::RngExt;
use std::path::Path;
use std::time::Instant;

/// One table of the bench, for `trainrun bench --only`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchPart {
    /// The tutorial model's step at batch 64 and 128 on 1 and 2 threads.
    Engine,
    /// trainrun against JAX's jitted step, alternating.
    Peers,
    /// Mirrored 2 replicas × 1 thread against one replica × 2 threads, alternating.
    Mirrored,
    /// All-reduce between worker processes: every algorithm over every transport it runs on.
    Collective,
    /// Time to 98 % in one process (float32 and mixed_bfloat16) and `mnist_fast` to 98.5 %, with
    /// TensorFlow's time to 98 % alongside (needs the MNIST files).
    Tta,
    /// Time to 98 % under `parameter_server` against `multi_worker_mirrored`, seed by seed.
    ParameterServer,
    /// Mutual TLS against plain TCP on the two-worker tutorial job, alternating (needs the
    /// MNIST files).
    Tls,
    /// N = 2, 4 and 8 worker tasks on hosts made of network namespaces: rendezvous, step time
    /// and all-reduce per algorithm, with PyTorch DDP over gloo alongside (needs root).
    Scale,
    /// The same up to N = 64 (8 hosts × 8 tasks).
    ScaleFull,
    /// GFLOP/s of each matrix-product path (fp32, bf16) at the GPT's product shapes.
    Products,
    /// The GPT under mixed_bfloat16 against its float32 and PyTorch's fp32 and bf16 autocast, at
    /// the Shakespeare size and nanoGPT's, in turn (needs a Python with torch).
    Precision,
    /// The dense layer's walk over a ReLU's nonzeros against gemm, density by density, beside
    /// the thresholds this CPU family's row uses.
    Sparse,
    /// Inference throughput of the tutorial model on the MNIST test split against Keras's
    /// `model.predict` and PyTorch eager, alternating (needs the MNIST files).
    Predict,
    /// tiktoken's GPT-2 encoding, a `tokenizer.json` and a Parquet text column against Python
    /// `tiktoken`, `tokenizers` and pyarrow, alternating.
    Corpus,
}

/// One measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepThroughput {
    /// Examples per step.
    pub batch: usize,
    /// Compute threads.
    pub threads: usize,
    /// Median milliseconds per step.
    pub ms_per_step: f64,
    /// Examples per second at the median step time.
    pub examples_per_s: f64,
}

/// Measures one configuration: `steps` timed steps after a warm-up, median step time; the
/// update is plain SGD (the tutorial's) or SGD with momentum 0.9.
pub fn measure(batch: usize, threads: usize, momentum: bool, steps: usize) -> Result<StepThroughput, String> {
    let spec = ModelSpec { zoo: Some(ZooModel::MnistCnn), ..ModelSpec::default() };
    let model = crate::model::build_spec(&spec, &Shape(vec![28, 28, 1]), 10).map_err(|d| format!("{d:?}"))?;
    let (params, state) = model.init(42);
    let mut vars = Variables { params, state };
    let mut optimizer = Optimizer::Sgd(Sgd::new(vars.params.len(), if momentum { 0.9 } else { 0.0 }, false, 0.0));
    let loss = LossFn { kind: LossKind::SparseCategoricalCrossentropy, from_logits: true };
    let mut replica = Replica::new(model, loss, 10, threads);
    let mut r = init::rng(&[7]);
    let batch_data = Batch {
        x: (0..batch * 784).map(|_| r.random_range(0.0..1.0)).collect(),
        y: (0..batch).map(|_| r.random_range(0..10)).collect(),
        n: batch,
        global_n: batch,
        ..Batch::default()
    };
    let mut grads = vec![0.0; vars.params.len()];
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().map_err(|e| e.to_string())?;
    let mut times = pool.install(|| {
        let mut step = |i: u64| {
            let t = Instant::now();
            // As a run with one replica steps: backward applies the update as it goes.
            let view = BatchView::of(&batch_data);
            replica.forward_loss(&vars.params, &mut vars.state, view, 1.0 / batch as f32, i);
            replica.backward_update(&mut vars.params, &mut optimizer, 0.01, &mut grads);
            t.elapsed().as_secs_f64()
        };
        (0..5).for_each(|i| {
            step(i);
        });
        (0..steps as u64).map(step).collect::<Vec<f64>>()
    });
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    Ok(StepThroughput { batch, threads, ms_per_step: median * 1e3, examples_per_s: batch as f64 / median })
}

/// trainrun against JAX's jitted step (`benches/jax_tutorial.py`), the strongest CPU peer, at
/// batch 64 on 2 threads, alternately A B A B A B so that both see the same machine; each pair's
/// ratio and the median ratio are printed. Skipped, saying why, without Python or JAX.
fn peers(steps: usize) -> Result<(), String> {
    println!("\n== peer: JAX (whole step under jax.jit), tutorial model, batch 64, 2 threads, alternating A B A B A B");
    let python = std::env::var("TRAINRUN_BENCH_PYTHON").unwrap_or_else(|_| "python3".into());
    println!("{:>16} {:>6} {:>14} {:>12} {:>8}", "update", "pair", "trainrun ex/s", "jax ex/s", "ratio");
    for momentum in [false, true] {
        let update = if momentum { "sgd momentum 0.9" } else { "sgd" };
        let mut ratios = Vec::new();
        for pair in 1..=3 {
            let ours = measure(64, 2, momentum, steps)?.examples_per_s;
            let theirs = match jax(&python, 64, 2, momentum, steps) {
                Ok(v) => v,
                Err(why) => {
                    println!("skipped: {why}");
                    return Ok(());
                }
            };
            ratios.push(ours / theirs);
            println!("{update:>16} {pair:>6} {ours:>14.0} {theirs:>12.0} {:>7.2}×", ours / theirs);
        }
        ratios.sort_by(f64::total_cmp);
        println!("{update:>16} median ratio {:.2}× (target ≥ 1.5×)", ratios[ratios.len() / 2]);
    }
    Ok(())
}

/// JAX's steady examples/s for the tutorial model, from `benches/jax_tutorial.py` run with
/// `python`.
fn jax(python: &str, batch: usize, threads: usize, momentum: bool, steps: usize) -> Result<f64, String> {
    let mut cmd = std::process::Command::new(python);
    cmd.arg("benches/jax_tutorial.py").args(["--batch", &batch.to_string(), "--threads", &threads.to_string()]);
    cmd.args(["--steps", &steps.to_string()]);
    if momentum {
        cmd.arg("--momentum");
    }
    let out = cmd.output().map_err(|e| format!("cannot run {python} benches/jax_tutorial.py: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().unwrap_or_default();
    if !out.status.success() || last.starts_with("skipped") || !last.starts_with('[') {
        let why = if last.is_empty() { String::from_utf8_lossy(&out.stderr).into_owned() } else { last.to_string() };
        return Err(format!(
            "no JAX figure ({}); install jax[cpu] and set TRAINRUN_BENCH_PYTHON to its python, from the repository root",
            why.trim()
        ));
    }
    let rows: serde_json::Value = serde_json::from_str(last).map_err(|e| format!("jax_tutorial.py: {e}"))?;
    rows[0]["examples_per_s"].as_f64().ok_or_else(|| format!("jax_tutorial.py printed no examples/s: {last}"))
}

/// What one end-to-end job measured.
struct JobMeasure {
    wall_s: f64,
    summary: serde_json::Value,
}

/// Runs `trainrun spec` as a user would and reads its summary.
fn job(exe: &Path, spec: &str, sets: &[&str]) -> Result<JobMeasure, String> {
    job_with(exe, spec, sets, |_| Ok(()))
}

/// Runs `trainrun spec` as [`job`] does, calling `during` with the launcher's pid while it
/// runs (to disturb it: `kill.rs`).
fn job_with(
    exe: &Path,
    spec: &str,
    sets: &[&str],
    during: impl FnOnce(u32) -> Result<(), String>,
) -> Result<JobMeasure, String> {
    let dir =
        std::env::temp_dir().join(format!("trainrun-bench-{}-{}", std::process::id(), spec.replace(['/', '.'], "_")));
    let started = Instant::now();
    // The bench's own variable would be refused by the job as an unknown `TRAINRUN_` name.
    let child = std::process::Command::new(exe)
        .env_remove("TRAINRUN_BENCH_PYTHON")
        .arg(spec)
        .arg("-q")
        .args(["--set", &format!("run.out_dir={}", dir.display())])
        .args(sets.iter().flat_map(|s| ["--set", s]))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {spec}: {e}"))?;
    let disturbed = during(child.id());
    let out = child.wait_with_output().map_err(|e| format!("{spec}: {e}"))?;
    let wall_s = started.elapsed().as_secs_f64();
    disturbed?;
    if !out.status.success() {
        return Err(format!("{spec} failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let text = std::fs::read_to_string(dir.join("summary.json")).map_err(|e| format!("{spec}: {e}"))?;
    let _ = std::fs::remove_dir_all(&dir);
    let summary = serde_json::from_str(&text).map_err(|e| format!("{spec}: {e}"))?;
    Ok(JobMeasure { wall_s, summary })
}

/// The input readers' throughput on data written to a temporary folder: a folder of 32×32
/// PNGs decoded to `f32` on two threads, and an uncompressed TFRecord file streamed with both
/// checksums (a tenth of each with `quick`).
fn input(quick: bool) -> Result<(), String> {
    use crate::data::formats::bench::{bench_png_folder, bench_tfrecord, write_png_folder, write_tfrecord};
    let scale = if quick { 10 } else { 1 };
    let dir = tempfile::tempdir().map_err(|e| format!("no temporary folder: {e}"))?;
    let (split, records) = (dir.path().join("train"), dir.path().join("bench.tfrecord"));
    write_png_folder(&split, 50_000 / scale, 1).map_err(|e| e.to_string())?;
    write_tfrecord(&records, 40_000 / scale, 1).map_err(|e| e.to_string())?;
    let png = bench_png_folder(&split, 2).map_err(|e| e.to_string())?;
    let tfrecord = bench_tfrecord(&records).map_err(|e| e.to_string())?;
    println!("\n== input: readers on generated files (with crop and flip: the next table)");
    println!(
        "png folder: {} 32×32 RGB images decoded to f32 on 2 threads: {:.0} images/s (target ≥ 20,000)",
        png.items,
        png.items_per_second()
    );
    println!(
        "tfrecord: {} raw 32×32×3 examples, {:.0} MB uncompressed, streamed and checked: {:.0} MB/s (target ≥ 200)",
        tfrecord.items,
        tfrecord.bytes as f64 / 1e6,
        tfrecord.megabytes_per_second()
    );
    Ok(())
}

fn f(v: &serde_json::Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or(0.0)
}

/// Prints every table, or only the one `only` names; end-to-end jobs run when the MNIST files
/// can be found.
pub fn run(quick: bool, only: Option<BenchPart>) -> Result<(), String> {
    let steps = if quick { 20 } else { 100 };
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the trainrun binary: {e}"))?;
    let python = std::env::var("TRAINRUN_BENCH_PYTHON").unwrap_or_else(|_| "python3".into());
    println!("{}", machine());
    match only {
        Some(BenchPart::Engine) => return engine(steps),
        Some(BenchPart::Peers) => return peers(steps),
        Some(BenchPart::Mirrored) => return mirrored(&exe),
        Some(BenchPart::Collective) => return collective(),
        Some(BenchPart::Tta) => return tta::one_process(&exe, &python),
        Some(BenchPart::ParameterServer) => return tta::parameter_server(&exe),
        Some(BenchPart::Tls) => return tls::run(&exe, if quick { 2 } else { 8 }),
        Some(BenchPart::Scale) => return scale::run(&exe, &python, false),
        Some(BenchPart::ScaleFull) => return scale::run(&exe, &python, true),
        Some(BenchPart::Products) => return products::run(if quick { 5 } else { 21 }),
        Some(BenchPart::Precision) => return precision::run(&exe, &python, quick),
        Some(BenchPart::Sparse) => return sparse::run(if quick { 3 } else { 10 }),
        Some(BenchPart::Predict) => return predict::run(&exe, &python, quick),
        Some(BenchPart::Corpus) => return corpus::run(&exe, &python, quick),
        None => {}
    }
    engine(steps)?;
    products::run(if quick { 5 } else { 21 })?;
    sparse::run(if quick { 3 } else { 10 })?;
    peers(steps)?;

    collective()?;

    // Before the MNIST jobs, which end the bench early without the MNIST files.
    gpt::run(&exe, &python, quick)?;
    if !quick {
        precision::run(&exe, &python, false)?;
    }
    corpus::run(&exe, &python, quick)?;
    if !jobs(&exe, quick)? {
        return Ok(());
    }
    input(quick)?;
    augment::run(quick)?;
    if quick {
        return Ok(());
    }
    predict::run(&exe, &python, false)?;
    tta::one_process(&exe, &python)?;
    tta::parameter_server(&exe)?;
    tls::run(&exe, 8)
}

/// The line every table is read beside: the CPU (thresholds and product paths were measured per
/// CPU, and the same code ran up to 3× apart on two hosts of one machine kind), its threads and
/// the path each precision's products take here.
fn machine() -> String {
    let bf16 = crate::engine::bf16::Bf16Support::detect();
    let mixed = match bf16.mixed_path() {
        Some(path) => format!("{} for layers {} wide or more, fp32 below", path.name(), path.pays_from()),
        None => format!("fp32 ({})", bf16.why_fp32()),
    };
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    format!(
        "== machine: {} ({threads} hardware threads; bf16: {}); products: float32 on gemm, mixed_bfloat16 on {mixed}\n   {}",
        products::cpu_model(),
        bf16.name(),
        crate::engine::tuning::Tuning::here().describe()
    )
}

/// The all-reduce table: every algorithm over every transport it runs on, 2 and 4 processes.
fn collective() -> Result<(), String> {
    use crate::collective::bench::{BenchOptions, run, table};
    println!("\n== all-reduce between processes on this host (busbw = size × 2(N−1)/N ÷ time, as nccl-tests)");
    let launcher = crate::collective::Launcher::current_exe().map_err(|e| e.to_string())?;
    let rows = run(&BenchOptions::standard(launcher.clone())).map_err(|e| e.to_string())?;
    print!("{}", table(&rows));
    println!("\n== all-reduce algorithms for many ranks: 1 KB (latency) and 1 MB over TCP, 2-rank \"hosts\"");
    let rows = run(&BenchOptions::scaling(launcher)).map_err(|e| e.to_string())?;
    print!("{}", table(&rows));
    Ok(())
}

/// The tutorial model's step on seeded random images, every batch, thread count and update.
fn engine(steps: usize) -> Result<(), String> {
    println!("== engine: tutorial model (2,770,634 params), forward + backward + update, median of {steps} steps");
    println!("{:>6} {:>8} {:>16} {:>10} {:>12}", "batch", "threads", "update", "ms/step", "examples/s");
    for momentum in [false, true] {
        for batch in [64, 128] {
            for threads in [1, 2] {
                let t = measure(batch, threads, momentum, steps)?;
                let update = if momentum { "sgd momentum 0.9" } else { "sgd" };
                println!(
                    "{:>6} {:>8} {:>16} {:>10.2} {:>12.0}",
                    t.batch, t.threads, update, t.ms_per_step, t.examples_per_s
                );
            }
        }
    }
    Ok(())
}

/// The checked-in jobs end to end; false (having said why) when the MNIST files are missing.
fn jobs(exe: &Path, quick: bool) -> Result<bool, String> {
    println!("\n== jobs end to end on MNIST (wall = launch to exit)");
    let single = match job(exe, "specs/mnist_single.toml", &[]) {
        Ok(j) => j,
        Err(e) => {
            println!("skipped: {e}\n(run from the repository root with TRAINRUN_DATA_DIR set to the MNIST folder)");
            return Ok(false);
        }
    };
    let single128 = job(exe, "specs/mnist_single.toml", &["batch.global=128"])?;
    let multi = job(exe, "specs/mnist_multiworker.toml", &[])?;
    let mirrored =
        job(exe, "specs/mnist_single.toml", &["strategy={ kind = \"mirrored\", devices = 2 }", "batch.global=128"])?;
    let ps = job(exe, "specs/mnist_parameter_server.toml", &[])?;
    println!("{:<44} {:>12} {:>8} {:>10} {:>9}", "job", "examples/s", "wall s", "peak MB", "test acc");
    for (name, j) in [
        ("tutorial, 1 process × 2 threads, batch 64", &single),
        ("tutorial, 1 process × 2 threads, batch 128", &single128),
        ("tutorial, 2 workers × 1 thread, 64 each", &multi),
        ("tutorial, mirrored 2 replicas × 1 thread", &mirrored),
        ("tutorial, 2 workers + 1 ps (async), 64 each", &ps),
    ] {
        let s = &j.summary;
        println!(
            "{name:<44} {:>12.0} {:>8.2} {:>10.0} {:>9.4}",
            f(s, "steady_examples_per_s"),
            j.wall_s,
            f(s, "peak_rss_mb"),
            f(s, "test_accuracy")
        );
    }
    let m = f(&multi.summary, "steady_examples_per_s");
    println!(
        "scaling: 2 workers reach {:.2}× the single process at batch 64 and {:.2}× at batch 128 (the same global batch)",
        m / f(&single.summary, "steady_examples_per_s").max(1.0),
        m / f(&single128.summary, "steady_examples_per_s").max(1.0)
    );
    println!(
        "mirrored: 2 replicas × 1 thread reach {:.2}× one replica with 2 threads at the same global batch (128)",
        f(&mirrored.summary, "steady_examples_per_s") / f(&single128.summary, "steady_examples_per_s").max(1.0)
    );
    println!(
        "parameter servers: 2 workers + 1 ps reach {:.2}× multi_worker_mirrored's 2 workers (target ≥ 0.8×)",
        f(&ps.summary, "steady_examples_per_s") / m.max(1.0)
    );
    kill::run(exe, if quick { 300 } else { 1000 })?;
    println!("launch to first step: {:.2} s (single process)", f(&single.summary, "first_step_s"));
    let (wait, training) =
        (f(&single.summary, "input_wait_s"), f(&single.summary, "wall_s") - f(&single.summary, "first_step_s"));
    println!(
        "input wait: {wait:.3} s of {training:.2} s from the first step to exit, {:.2} % (target ≤ 1 % of step time; single process)",
        100.0 * wait / training.max(1e-9)
    );
    Ok(true)
}

/// `mnist_single.toml` at global batch 128 for 300 steps, one replica × 2 threads (A) and
/// mirrored 2 replicas × 1 thread (B), alternately A B A B A B; each pair's ratio B/A of steady
/// examples/s and the median.
fn mirrored(exe: &Path) -> Result<(), String> {
    println!("\n== mirrored 2 replicas × 1 thread ÷ 1 replica × 2 threads, tutorial, global batch 128, 300 steps");
    println!("{:>6} {:>14} {:>14} {:>8}", "pair", "1 × 2 ex/s", "2 × 1 ex/s", "ratio");
    let common = ["batch.global=128", "train.steps_per_epoch=100"];
    let two = [&common[..], &["strategy={ kind = \"mirrored\", devices = 2 }"]].concat();
    let mut ratios = Vec::new();
    for pair in 1..=3 {
        let a = f(&job(exe, "specs/mnist_single.toml", &common)?.summary, "steady_examples_per_s");
        let b = f(&job(exe, "specs/mnist_single.toml", &two)?.summary, "steady_examples_per_s");
        ratios.push(b / a.max(1.0));
        println!("{pair:>6} {a:>14.0} {b:>14.0} {:>7.2}×", b / a.max(1.0));
    }
    ratios.sort_by(f64::total_cmp);
    println!("mirrored median ratio {:.2}× (target ≥ 0.95×)", ratios[1]);
    Ok(())
}

/// The median of `v`: the mean of the middle two for an even count, NaN for none.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}
