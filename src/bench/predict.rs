//! `trainrun bench --only predict`: inference throughput of the tutorial model
//! (`specs/mnist_single.toml`) on the 10,000 MNIST test images, in process and warm, as
//! `trainrun predict` runs it (batches assembled from the split, the model in inference mode,
//! one model copy per thread each predicting whole batches, softmax over each row), held
//! against Keras's `model.predict` (`benches/predict_keras.py`) and PyTorch eager under
//! `torch.inference_mode()` (`benches/predict_torch.py`): the same architecture, batch and 2
//! threads, run alternately T K P T K P T K P so all three see the same machine. Each side
//! times one warm-up pass and keeps its best of [`ROUNDS`] passes.
//!
//! trainrun's dense layer walks the nonzeros of the convolution's ReLU output instead of
//! calling gemm when at most a fifth are nonzero (`engine::sparse`), so its speed depends on
//! the weights, and a trained model is what predict is for: it runs three sets, trained first
//! as a user would (seconds each): the model trained to 98 % with the peers' settings, the
//! tutorial spec's own short run, and the initial weights, each with its density printed. The
//! peers compute dense products, whose speed does not depend on the weights, so they keep
//! their random ones.
//! Batch 32 is `model.predict`'s default; the other is the batch `trainrun predict` picks for
//! this model (`run::predict_batch_size`: 64). A peer whose Python package is missing is skipped,
//! saying so (`TRAINRUN_BENCH_PYTHON` names the interpreter, which needs tensorflow and torch).
//!
//! Then two more models, each against the peers' same model at batch 32 and at the batch
//! `trainrun predict` picks ([`zoo_rows`]): `specs/mnist_fast.toml`'s CNN on the MNIST test
//! images and the zoo's ResNet-20 on random 32×32×3 images (no CIFAR files needed), all with
//! initial weights: their products are dense (no ReLU feeds a dense layer), so speed does not
//! depend on the weights.

use crate::data::{EvalBatches, Shard, Split};
use crate::engine::{Pass, Sequential};
use crate::prepare::{Invocation, prepare};
use crate::run::predict::rounds::{ModelCopy, Rounds, Sharding, copies_alone};
use std::num::NonZeroUsize;
use std::path::Path;
use std::time::Instant;

/// Timed passes over the test split after the warm-up pass, each side; the best counts.
const ROUNDS: usize = 5;

/// Alternating pairs per batch size.
const PAIRS: usize = 3;

/// `model.predict`'s default batch size.
const KERAS_BATCH: usize = 32;

/// The spec whose model and data are measured, and whose own training run gives the
/// "tutorial" weights.
const SPEC: &str = "specs/mnist_single.toml";

/// The same model trained to 98 % test accuracy with the peers' settings: the "to 98 %"
/// weights.
const TO_98: &str = "specs/bench/tta_single.toml";

/// A model with its weights, ready to predict: as `trainrun predict` alone runs it, one copy
/// per thread, each predicting whole batches ([`copies_alone`]).
struct PredictModel {
    copies: Vec<ModelCopy>,
    params: Vec<f32>,
}

impl PredictModel {
    /// `model` with `params` and `state`, copied for the plan's threads.
    fn new(plan: &crate::plan::Plan, model: Sequential, params: Vec<f32>, state: Vec<f32>) -> Result<Self, String> {
        let mut all = vec![ModelCopy { model, state: state.clone() }];
        for _ in 1..copies_alone(plan, &[]) {
            all.push(ModelCopy { model: plan.model.build().map_err(|e| e.to_string())?, state: state.clone() });
        }
        Ok(Self { copies: all, params })
    }
}

/// Prints the table; `quick` leaves out the other models' rows ([`zoo_rows`]).
pub fn run(exe: &Path, python: &str, quick: bool) -> Result<(), String> {
    let plan = plan_of(SPEC)?;
    println!(
        "\n== predict: tutorial model ({SPEC}) on the MNIST test split, examples/s of a warm pass (best of {ROUNDS}), \
         2 threads; CPU: {}; trainrun T, Keras model.predict K (benches/predict_keras.py), PyTorch eager P \
         (benches/predict_torch.py), alternating T K P",
        super::products::cpu_model()
    );
    let dataset = match plan.data.source.load() {
        Ok(d) => d,
        Err(e) => {
            println!("skipped: {e}\n(run from the repository root with TRAINRUN_DATA_DIR set to the MNIST folder)");
            return Ok(());
        }
    };
    let (dataset, _) = plan.data.preprocessing.apply(dataset, plan.seed).map_err(|e| e.to_string())?;
    let test = dataset.test.as_ref().ok_or("the tutorial spec's data has no test split")?;
    let model = plan.model.build().map_err(|e| e.to_string())?;
    let (params, state) = model.init(plan.seed);
    let mut models = vec![
        ("to 98 %", train(exe, &plan, TO_98)?),
        ("tutorial", train(exe, &plan, SPEC)?),
        ("initial", PredictModel::new(&plan, model, params, state)?),
    ];
    let threads = plan.threads;
    let spec_batch = crate::run::predict_batch_size(models[0].1.copies[0].model.activation_len());
    println!(
        "trainrun's weights: \"to 98 %\" trained by {TO_98} (stops at 98 % test accuracy), \"tutorial\" by {SPEC} \
         (3 epochs × 70 steps of SGD 0.001), \"initial\" as initialized; the peers' weights are random"
    );
    for (name, m) in &mut models {
        println!(
            "  {name}: {:.1} % of the dense layer's inputs (the convolution's ReLU output) are nonzero",
            100.0 * density(m, test, threads)
        );
    }
    println!(
        "{:>5} {:>4} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>7} {:>7}",
        "batch", "pair", "T 98 %", "T tutor.", "T init.", "K", "P", "T98/K", "Ttut/K", "T98/P", "Ttut/P"
    );
    let mut keras = PredictPeer { name: "Keras", script: "benches/predict_keras.py", skipped: None };
    let mut torch = PredictPeer { name: "PyTorch", script: "benches/predict_torch.py", skipped: None };
    for batch in [KERAS_BATCH, spec_batch] {
        // Ratios of the two trained models' figures to Keras's and PyTorch's, pair by pair.
        let mut ratios: [Vec<f64>; 4] = Default::default();
        for pair in 1..=PAIRS {
            let mut ours = Vec::new();
            for (_, m) in &mut models {
                ours.push(throughput(m, test, batch, threads)?);
            }
            let k = keras.run(python, PeerModel::Tutorial, batch, threads);
            let p = torch.run(python, PeerModel::Tutorial, batch, threads);
            let mut row = format!(
                "{batch:>5} {pair:>4} {:>9.0} {:>9.0} {:>9.0} {} {}",
                ours[0],
                ours[1],
                ours[2],
                cell(k),
                cell(p)
            );
            for (i, (theirs, t)) in [(k, 0), (k, 1), (p, 0), (p, 1)].into_iter().enumerate() {
                match theirs {
                    Some(v) => {
                        ratios[i].push(ours[t] / v);
                        row += &format!(" {:>6.2}×", ours[t] / v);
                    }
                    None => row += &format!(" {:>7}", "-"),
                }
            }
            println!("{row}");
        }
        let [t98k, ttk, t98p, ttp] = ratios.map(median_text);
        println!(
            "batch {batch}, medians: trainrun/Keras {t98k} (to 98 %), {ttk} (tutorial) (target ≥ 2×); \
             trainrun/PyTorch eager {t98p} (to 98 %), {ttp} (tutorial) (target ≥ 1.5×)"
        );
    }
    if quick {
        println!("(--quick: the rows of mnist_fast and ResNet-20 are left out)");
    } else {
        for (model, spec) in
            [(PeerModel::MnistFast, "specs/mnist_fast.toml"), (PeerModel::Resnet20, "specs/cifar10_resnet20.toml")]
        {
            zoo_rows((model, spec), test, (python, &mut keras, &mut torch), threads)?;
        }
    }
    for p in [&keras, &torch] {
        if let Some(why) = &p.skipped {
            println!("{} SKIPPED: {why}", p.name);
        }
    }
    Ok(())
}

/// The models the peer scripts build (`--model`).
#[derive(Debug, Clone, Copy)]
enum PeerModel {
    /// The tutorial CNN.
    Tutorial,
    /// `specs/mnist_fast.toml`'s CNN.
    MnistFast,
    /// The zoo's ResNet-20.
    Resnet20,
}

impl PeerModel {
    fn name(self) -> &'static str {
        match self {
            PeerModel::Tutorial => "tutorial",
            PeerModel::MnistFast => "mnist_fast",
            PeerModel::Resnet20 => "resnet20",
        }
    }
}

/// Random images ResNet-20 predicts (the peers draw as many): no CIFAR files are needed, and
/// a dense convolution's speed does not depend on the values.
const RANDOM_EXAMPLES: usize = 1024;

/// Rows of `spec`'s model with its initial weights (its products are dense, so their speed does
/// not depend on the weights) against the peers' same model: `mnist_fast` on the MNIST test
/// split `mnist`, ResNet-20 on [`RANDOM_EXAMPLES`] random 32×32×3 images, at batch 32 and at
/// the batch `trainrun predict` picks, alternating T K P.
fn zoo_rows(
    (model, spec): (PeerModel, &str),
    mnist: &Split,
    (python, keras, torch): (&str, &mut PredictPeer, &mut PredictPeer),
    threads: usize,
) -> Result<(), String> {
    let plan = plan_of(spec)?;
    let built = plan.model.build().map_err(|e| e.to_string())?;
    let (params, state) = built.init(plan.seed);
    let mut m = PredictModel::new(&plan, built, params, state)?;
    let random;
    let (inputs, what) = match model {
        PeerModel::Resnet20 => {
            // A fixed linear congruential sequence in [0, 1): only the count matters.
            let mut at = 0u32;
            let values = (0..RANDOM_EXAMPLES * 32 * 32 * 3)
                .map(|_| {
                    at = at.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (at >> 8) as f32 / (1 << 24) as f32
                })
                .collect();
            random = crate::data::Unlabeled::split(Path::new("random"), vec![32, 32, 3], values)
                .map_err(|e| e.to_string())?;
            (&random, format!("{RANDOM_EXAMPLES} random 32×32×3 images"))
        }
        PeerModel::Tutorial | PeerModel::MnistFast => (mnist, "the MNIST test split".to_string()),
    };
    let spec_batch = crate::run::predict_batch_size(m.copies[0].model.activation_len());
    println!(
        "\n{} ({spec}), initial weights (dense products: speed does not depend on them), on {what}, 2 threads",
        model.name()
    );
    println!("{:>5} {:>4} {:>9} {:>9} {:>9} {:>7} {:>7}", "batch", "pair", "T", "K", "P", "T/K", "T/P");
    for batch in [KERAS_BATCH, spec_batch] {
        let mut ratios: [Vec<f64>; 2] = Default::default();
        for pair in 1..=PAIRS {
            let ours = throughput(&mut m, inputs, batch, threads)?;
            let k = keras.run(python, model, batch, threads);
            let p = torch.run(python, model, batch, threads);
            let mut row = format!("{batch:>5} {pair:>4} {ours:>9.0} {} {}", cell(k), cell(p));
            for (i, theirs) in [k, p].into_iter().enumerate() {
                match theirs {
                    Some(v) => {
                        ratios[i].push(ours / v);
                        row += &format!(" {:>6.2}×", ours / v);
                    }
                    None => row += &format!(" {:>7}", "-"),
                }
            }
            println!("{row}");
        }
        let [tk, tp] = ratios.map(median_text);
        println!("{} batch {batch}, medians: trainrun/Keras {tk}, trainrun/PyTorch eager {tp}", model.name());
    }
    Ok(())
}

/// A figure, or a dash for a skipped peer.
fn cell(v: Option<f64>) -> String {
    v.map_or_else(|| format!("{:>9}", "skipped"), |v| format!("{v:>9.0}"))
}

/// The plan of `spec`, as `trainrun SPEC` would make it.
fn plan_of(spec: &str) -> Result<crate::plan::Plan, String> {
    let inv = Invocation {
        spec: spec.into(),
        sets: vec![],
        // The bench's own variable would be refused by the spec as an unknown `TRAINRUN_` name.
        env: std::env::vars().filter(|(k, _)| k != "TRAINRUN_BENCH_PYTHON").collect(),
        quiet: true,
        task: None,
        launched: Instant::now(),
    };
    Ok(prepare(&inv).map_err(|e| e.to_string())?.plan)
}

/// A peer script, and why it was skipped once it was.
struct PredictPeer {
    name: &'static str,
    script: &'static str,
    skipped: Option<String>,
}

impl PredictPeer {
    /// The peer's examples/s at `batch`, or `None` once it was skipped (said once, here).
    fn run(&mut self, python: &str, model: PeerModel, batch: usize, threads: usize) -> Option<f64> {
        if self.skipped.is_some() {
            return None;
        }
        peer(python, self.script, model, batch, threads)
            .map_err(|why| {
                println!("{} SKIPPED: {why}", self.name);
                self.skipped = Some(why);
            })
            .ok()
    }
}

/// The median ratio, or why there is none.
fn median_text(ratios: Vec<f64>) -> String {
    if ratios.is_empty() { "not measured (peer skipped)".into() } else { format!("{:.2}×", super::median(ratios)) }
}

/// The weights `spec` (the tutorial model) trains, run as a user would into a temporary
/// folder.
fn train(exe: &Path, plan: &crate::plan::Plan, spec: &str) -> Result<PredictModel, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("no temporary folder: {e}"))?;
    let out = std::process::Command::new(exe)
        .env_remove("TRAINRUN_BENCH_PYTHON")
        .arg(spec)
        .arg("-q")
        .args(["--set", &format!("run.out_dir={}", dir.path().display())])
        .output()
        .map_err(|e| format!("cannot run {spec}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{spec} failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let file = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    let model = plan.model.build().map_err(|e| e.to_string())?;
    let layout = crate::builder::layout(&model);
    let reader = crate::checkpoint::tensors::Reader::new(&file, &bytes).map_err(|e| e.to_string())?;
    let (mut params, mut state) = (vec![0.0; layout.params], vec![0.0; layout.state]);
    reader.fill("", &layout.tensors, &mut params).map_err(|e| e.to_string())?;
    reader.fill("", &layout.state_tensors, &mut state).map_err(|e| e.to_string())?;
    PredictModel::new(plan, model, params, state)
}

/// One pass over `test` in batches of `batch`, as `trainrun predict` alone runs it (its
/// rounds: one batch per model copy, each on its own thread), with each output row through
/// softmax; returns the examples.
fn pass(m: &mut PredictModel, test: &Split, batch: usize) -> Result<usize, String> {
    let width = m.copies[0].model.output_shape().numel().max(1);
    let sharding = Sharding { copies: m.copies.len(), workers: 1, rank: 0 };
    let rounds = Rounds { split: test, batch, width, params: &m.params, sharding, threads: 1 };
    let mut buffer = vec![0.0; sharding.per_round() * rounds.slot_len()];
    let mut rows = Vec::new();
    let mut examples = 0;
    for r in 0..rounds.count() {
        for (out, n) in rounds.run(r, &mut m.copies, &mut buffer, None).map_err(|e| e.to_string())? {
            rows.clear();
            rows.extend_from_slice(&out[..n * width]);
            rows.chunks_exact_mut(width).for_each(crate::engine::activation::softmax_row);
            examples += n;
        }
    }
    Ok(examples)
}

/// Examples/s of the best of [`ROUNDS`] warm passes on `threads` threads.
fn throughput(m: &mut PredictModel, test: &Split, batch: usize, threads: usize) -> Result<f64, String> {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().map_err(|e| e.to_string())?;
    pool.install(|| {
        pass(m, test, batch)?;
        let mut best = 0.0f64;
        for _ in 0..ROUNDS {
            let t = Instant::now();
            let examples = pass(m, test, batch)?;
            best = best.max(examples as f64 / t.elapsed().as_secs_f64().max(1e-9));
        }
        Ok(best)
    })
}

/// The share of nonzero values the convolution's ReLU passes to the dense layer, over the
/// first batch of the test split.
fn density(m: &mut PredictModel, test: &Split, threads: usize) -> f64 {
    let Some(b) = EvalBatches::new(test, NonZeroUsize::MIN.saturating_add(255), Shard::WHOLE).next() else {
        return 0.0;
    };
    let pass = Pass { training: false, seed: 0, accumulate: false, threads };
    let copy = &mut m.copies[0];
    copy.model.forward(pass, &m.params, &mut copy.state, &b.x, b.n);
    let Some(x) = copy.model.layer_output("conv2d", b.n) else {
        return 0.0;
    };
    crate::engine::sparse::count_nonzeros(x) as f64 / x.len().max(1) as f64
}

/// A peer script's examples/s, or why there is none.
fn peer(python: &str, script: &str, model: PeerModel, batch: usize, threads: usize) -> Result<f64, String> {
    let out = std::process::Command::new(python)
        .arg(script)
        .args(["--batch", &batch.to_string(), "--threads", &threads.to_string(), "--rounds", &ROUNDS.to_string()])
        .args(["--model", model.name(), "--examples", &RANDOM_EXAMPLES.to_string()])
        .output()
        .map_err(|e| format!("cannot run {python} {script}: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().unwrap_or_default();
    if !out.status.success() || !last.starts_with('{') {
        let why = if last.is_empty() { String::from_utf8_lossy(&out.stderr).trim().to_string() } else { last.into() };
        return Err(format!(
            "no figure from {script} ({why}); set TRAINRUN_BENCH_PYTHON to a python with tensorflow and torch, \
             from the repository root"
        ));
    }
    let row: serde_json::Value = serde_json::from_str(last).map_err(|e| format!("{script}: {e}"))?;
    row["examples_per_s"].as_f64().ok_or_else(|| format!("{script} printed no examples/s: {last}"))
}
