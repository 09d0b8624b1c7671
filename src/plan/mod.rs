//! The plan: everything a run will do, derived purely from the spec and the facts the caller
//! gathered (dataset sizes, hardware). No I/O and no environment reads happen here, so
//! `trainrun check` and every test can call it freely.

mod batch;
mod lr;
mod render;
mod strategy;

pub use batch::{BatchPlan, Derived};
pub use lr::{LrPlan, Schedule, Warmup};
pub use strategy::{ClusterPlan, Hardware, Reduction, StrategyKind, StrategyPlan};

use crate::data::DataFacts;
use crate::engine::LossFn;
use crate::engine::optimizer::{Adam, Optimizer, Sgd};
use crate::spec::{
    AutoShardPolicy, CallbackSpec, DataSpec, Diagnostic, Loss, Metric, Mode, ModelSpec, Monitor, OptimizerKind,
    Severity, Spec,
};
use serde::Serialize;
use std::path::PathBuf;

/// What the caller knows about the world, passed in so planning stays pure.
#[derive(Debug, Clone, PartialEq)]
pub struct Facts {
    /// The training and test data.
    pub data: DataFacts,
    /// Cores of this machine.
    pub cores: usize,
    /// GPUs and the like.
    pub hardware: Hardware,
    /// The cluster (spec, TF_CONFIG or Slurm) and this process's task.
    pub cluster: crate::cluster::Resolution,
}

/// The resolved optimizer.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OptimizerPlan {
    /// SGD.
    Sgd { momentum: f64, nesterov: bool, weight_decay: f64 },
    /// Adam (`decoupled = false`) or AdamW.
    Adam { beta_1: f64, beta_2: f64, epsilon: f64, weight_decay: f64, decoupled: bool },
}

impl OptimizerPlan {
    /// A fresh optimizer for `len` parameters.
    pub fn build(&self, len: usize) -> Optimizer {
        match *self {
            OptimizerPlan::Sgd { momentum, nesterov, weight_decay } => {
                Optimizer::Sgd(Sgd::new(len, momentum as f32, nesterov, weight_decay as f32))
            }
            OptimizerPlan::Adam { beta_1, beta_2, epsilon, weight_decay, decoupled } => Optimizer::Adam(Adam::new(
                len,
                beta_1 as f32,
                beta_2 as f32,
                epsilon as f32,
                weight_decay as f32,
                decoupled,
            )),
        }
    }
}

/// How the training data is split across workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardPolicy {
    /// One worker: nothing to split.
    None,
    /// Each worker reads its own files.
    File,
    /// Each worker keeps every N-th example of each global batch.
    Data,
    /// Every worker reads everything.
    Off,
}

/// The input pipeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DataPlan {
    /// The `[data]` section as given (source, folder, files).
    pub spec: DataSpec,
    /// Sizes and shapes.
    pub facts: DataFacts,
    /// How workers split the data.
    pub shard: ShardPolicy,
    /// Shards (workers) the data is split into.
    pub num_shards: usize,
}

/// When the test split is evaluated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EvalPlan {
    /// Every this many steps, if set.
    pub every_steps: Option<u64>,
    /// At the end of every epoch.
    pub every_epoch: bool,
    /// Test batches per evaluation (`None`: the whole split).
    pub validation_steps: Option<u64>,
}

/// `model.fit`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrainPlan {
    /// Epochs.
    pub epochs: u64,
    /// Optimizer steps per epoch.
    pub steps_per_epoch: u64,
    /// `epochs × steps_per_epoch`.
    pub total_steps: u64,
    /// The loss.
    pub loss: Loss,
    /// Whether model outputs are logits.
    pub from_logits: bool,
    /// Metrics besides the loss.
    pub metrics: Vec<Metric>,
    /// Evaluation; `None` when there is no test split.
    pub eval: Option<EvalPlan>,
}

impl TrainPlan {
    /// The engine's loss function.
    pub fn loss_fn(&self) -> LossFn {
        LossFn { kind: self.loss, from_logits: self.from_logits }
    }
}

/// How the local launcher restarts a failed job (`[cluster] max_restarts`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Restarts {
    /// Restarts allowed.
    pub max_restarts: u32,
    /// Wait before the first, doubling after.
    pub backoff_s: f64,
}

/// Everything a run will do.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// Run name.
    pub name: String,
    /// Run seed.
    pub seed: u64,
    /// Output folder.
    pub out_dir: PathBuf,
    /// Compute threads per task process.
    pub threads: usize,
    /// Strategy, devices, cluster, reduction.
    pub strategy: StrategyPlan,
    /// Batch sizes.
    pub batch: BatchPlan,
    /// Learning-rate policy.
    pub learning_rate: LrPlan,
    /// Optimizer.
    pub optimizer: OptimizerPlan,
    /// Input pipeline.
    pub data: DataPlan,
    /// The model as specified.
    pub model: ModelSpec,
    /// Trainable parameters of the model.
    pub model_params: usize,
    /// Training loop.
    pub train: TrainPlan,
    /// Callbacks, with `auto` modes resolved.
    pub callbacks: Vec<CallbackSpec>,
    /// How the local launcher restarts a failed job.
    pub restarts: Restarts,
    /// Warnings to show before running.
    #[serde(skip)]
    pub warnings: Vec<Diagnostic>,
}

impl Plan {
    /// Plans `spec` given `facts`; on failure returns every problem found (errors and warnings).
    pub fn new(spec: &Spec, facts: &Facts) -> Result<Plan, Vec<Diagnostic>> {
        let mut diags = Vec::new();
        let strategy = strategy::resolve(&spec.strategy, &facts.cluster, facts.hardware, &mut diags);
        let batch = batch::resolve(&spec.batch, strategy.num_replicas_in_sync, &strategy.replicas_text())
            .map_err(|e| diags.push(e))
            .ok();
        let data = plan_data(&spec.data, &facts.data, &strategy, &mut diags);
        let global = batch.map_or(1, |b| b.global);
        let train = plan_train(spec, &facts.data, global, &mut diags);
        let (default_lr, optimizer) = plan_optimizer(spec, &mut diags);
        let learning_rate =
            lr::resolve(&spec.optimizer, default_lr, global, train.steps_per_epoch, train.total_steps, &mut diags);
        let callbacks = plan_callbacks(&spec.callbacks, train.eval.is_some(), &mut diags);
        let restarts = plan_fault_tolerance(spec, &facts.cluster, train.eval.is_some(), &mut diags);
        let e = facts.data.example_shape;
        let input = crate::engine::Shape(vec![e.height, e.width, e.channels]);
        let model_params = match crate::model::build(&spec.model, &input, facts.data.classes as usize) {
            Ok(model) => model.param_len(),
            Err(model_diags) => {
                diags.extend(model_diags);
                0
            }
        };

        let failed = diags.iter().any(|d| d.severity == Severity::Error);
        match (batch, learning_rate, failed) {
            (Some(batch), Some(learning_rate), false) => {
                let name = spec.run.name.clone().unwrap_or_else(|| "run".to_string());
                // Tasks on this machine share its cores.
                let c = &facts.cluster.cluster;
                let local_tasks = if c.is_local() { c.tasks.len().max(1) } else { 1 };
                Ok(Plan {
                    out_dir: spec.run.out_dir.clone().unwrap_or_else(|| PathBuf::from("runs").join(&name)),
                    name,
                    seed: spec.run.seed,
                    threads: spec.run.threads.map_or((facts.cores / local_tasks).max(1), |t| t.get()),
                    strategy,
                    batch,
                    learning_rate,
                    optimizer,
                    data,
                    model: spec.model.clone(),
                    model_params,
                    train,
                    callbacks,
                    restarts,
                    warnings: diags,
                })
            }
            _ => Err(diags),
        }
    }

    /// Human-readable plan, as `trainrun check` prints it.
    pub fn render(&self) -> String {
        render::text(self)
    }
}

fn plan_data(spec: &DataSpec, facts: &DataFacts, strategy: &StrategyPlan, diags: &mut Vec<Diagnostic>) -> DataPlan {
    let workers = strategy.num_workers;
    let shard = if workers <= 1 {
        ShardPolicy::None
    } else {
        match spec.auto_shard_policy {
            AutoShardPolicy::Auto if facts.train_files >= workers => ShardPolicy::File,
            AutoShardPolicy::Auto | AutoShardPolicy::Data => ShardPolicy::Data,
            AutoShardPolicy::File => {
                if facts.train_files < workers {
                    diags.push(
                        Diagnostic::error(
                            "data.auto_shard_policy",
                            format!(
                                "auto_shard_policy = \"file\" needs at least as many training files as workers: {} file{} for {workers} workers",
                                facts.train_files,
                                if facts.train_files == 1 { "" } else { "s" }
                            ),
                        )
                        .help("use auto_shard_policy = \"data\" (or \"auto\"), or split the training data into more files"),
                    );
                }
                ShardPolicy::File
            }
            AutoShardPolicy::Off => {
                diags.push(
                    Diagnostic::warning("data.auto_shard_policy", format!("auto_shard_policy = \"off\": all {workers} workers read every example, so each epoch sees every example {workers} times"))
                        .help("use \"auto\" or \"data\" unless duplicates are intended"),
                );
                ShardPolicy::Off
            }
        }
    };
    if spec.prefetch == 0 {
        diags.push(
            Diagnostic::warning("data.prefetch", "data.prefetch = 0 prepares batches on the training thread")
                .help("use prefetch = 2"),
        );
    }
    DataPlan {
        spec: spec.clone(),
        facts: facts.clone(),
        shard,
        num_shards: if shard == ShardPolicy::None { 1 } else { workers },
    }
}

fn plan_train(spec: &Spec, facts: &DataFacts, global: usize, diags: &mut Vec<Diagnostic>) -> TrainPlan {
    let t = &spec.train;
    let per_epoch =
        if spec.data.drop_remainder { facts.train_examples / global } else { facts.train_examples.div_ceil(global) };
    if per_epoch == 0 {
        diags.push(
            Diagnostic::error(
                "batch.global",
                format!(
                    "the global batch of {global} is larger than the {} training examples, so the data has no full batch",
                    facts.train_examples
                ),
            )
            .help(format!("use a global batch of at most {}, or data.drop_remainder = false", facts.train_examples)),
        );
    }
    let steps_per_epoch = t.steps_per_epoch.map_or(per_epoch as u64, |s| s.get());
    if (1..t.metrics.len()).any(|i| t.metrics[..i].contains(&t.metrics[i])) {
        diags.push(
            Diagnostic::warning("train.metrics", "train.metrics lists a metric twice").help("list each metric once"),
        );
    }
    let eval = (facts.test_examples > 0).then_some(EvalPlan {
        every_steps: t.evaluate_every_steps.map(|s| s.get()),
        every_epoch: t.evaluate_every_epoch,
        validation_steps: t.validation_steps.map(|s| s.get()),
    });
    if eval.is_none() && t.evaluate_every_steps.is_some() {
        diags.push(
            Diagnostic::warning("train.evaluate_every_steps", "the dataset has no test split, so nothing is evaluated")
                .help("add test files to [data.files]"),
        );
    }
    if !t.from_logits && outputs_logits(&spec.model) && t.loss != Loss::MeanSquaredError {
        diags.push(
            Diagnostic::warning(
                "train.from_logits",
                "the model's last layer outputs logits (no softmax or sigmoid), but train.from_logits = false",
            )
            .help("set train.from_logits = true, or end the model with a softmax activation"),
        );
    }
    TrainPlan {
        epochs: t.epochs.get(),
        steps_per_epoch,
        total_steps: t.epochs.get() * steps_per_epoch,
        loss: t.loss,
        from_logits: t.from_logits,
        metrics: t.metrics.clone(),
        eval,
    }
}

/// Whether the model ends without a squashing activation.
fn outputs_logits(model: &ModelSpec) -> bool {
    use crate::spec::{Activation, LayerSpec};
    if model.zoo.is_some() {
        return true;
    }
    match model.layers.last() {
        Some(
            LayerSpec::Dense { activation, .. }
            | LayerSpec::Conv2d { activation, .. }
            | LayerSpec::Activation { activation },
        ) => !matches!(activation, Activation::Softmax | Activation::Sigmoid),
        _ => false,
    }
}

fn plan_optimizer(spec: &Spec, diags: &mut Vec<Diagnostic>) -> (f64, OptimizerPlan) {
    let o = &spec.optimizer;
    let kind = match o.kind {
        OptimizerKind::Sgd => "sgd",
        OptimizerKind::Adam => "adam",
        OptimizerKind::Adamw => "adamw",
    };
    let mut only = |key: &str, given: bool, for_kind: &str| {
        if given {
            diags.push(
                Diagnostic::error(
                    format!("optimizer.{key}"),
                    format!("optimizer.{key} applies to {for_kind} only, but optimizer.kind = \"{kind}\""),
                )
                .help(format!("remove {key}, or change optimizer.kind")),
            );
        }
    };
    match o.kind {
        OptimizerKind::Sgd => {
            only("beta_1", o.beta_1.is_some(), "adam and adamw");
            only("beta_2", o.beta_2.is_some(), "adam and adamw");
            only("epsilon", o.epsilon.is_some(), "adam and adamw");
            let momentum = o.momentum.unwrap_or(0.0);
            let nesterov = o.nesterov.unwrap_or(false);
            if nesterov && momentum == 0.0 {
                diags.push(
                    Diagnostic::warning(
                        "optimizer.nesterov",
                        "optimizer.nesterov = true has no effect without momentum",
                    )
                    .help("set optimizer.momentum, e.g. 0.9"),
                );
            }
            (0.01, OptimizerPlan::Sgd { momentum, nesterov, weight_decay: o.weight_decay.unwrap_or(0.0) })
        }
        OptimizerKind::Adam | OptimizerKind::Adamw => {
            only("momentum", o.momentum.is_some(), "sgd");
            only("nesterov", o.nesterov.is_some(), "sgd");
            let decoupled = o.kind == OptimizerKind::Adamw;
            (
                0.001,
                OptimizerPlan::Adam {
                    beta_1: o.beta_1.unwrap_or(0.9),
                    beta_2: o.beta_2.unwrap_or(0.999),
                    epsilon: o.epsilon.unwrap_or(1e-7),
                    weight_decay: o.weight_decay.unwrap_or(if decoupled { 0.004 } else { 0.0 }),
                    decoupled,
                },
            )
        }
    }
}

fn plan_callbacks(callbacks: &[CallbackSpec], has_eval: bool, diags: &mut Vec<Diagnostic>) -> Vec<CallbackSpec> {
    let resolve = |monitor: Monitor, mode: Mode| match mode {
        Mode::Auto if matches!(monitor, Monitor::Loss | Monitor::ValLoss) => Mode::Min,
        Mode::Auto => Mode::Max,
        m => m,
    };
    let mut backups = 0;
    let mut out = Vec::with_capacity(callbacks.len());
    for (i, cb) in callbacks.iter().enumerate() {
        let monitor = match cb {
            CallbackSpec::ModelCheckpoint { monitor, save_best_only: true, .. } => Some(*monitor),
            CallbackSpec::EarlyStopping { monitor, .. }
            | CallbackSpec::ReduceLrOnPlateau { monitor, .. }
            | CallbackSpec::StopAtTarget { monitor, .. } => Some(*monitor),
            _ => None,
        };
        if let Some(m) = monitor.filter(|m| matches!(m, Monitor::ValLoss | Monitor::ValAccuracy))
            && !has_eval
        {
            diags.push(
                Diagnostic::error(
                    format!("callbacks[{i}].monitor"),
                    format!("callbacks[{i}] watches {} but the dataset has no test split", monitor_name(m)),
                )
                .help("watch \"loss\" or \"accuracy\", or add a test split"),
            );
        }
        let mut cb = cb.clone();
        match &mut cb {
            CallbackSpec::ModelCheckpoint { monitor, mode, .. }
            | CallbackSpec::EarlyStopping { monitor, mode, .. }
            | CallbackSpec::ReduceLrOnPlateau { monitor, mode, .. } => *mode = resolve(*monitor, *mode),
            CallbackSpec::BackupAndRestore { .. } => backups += 1,
            CallbackSpec::CsvLogger { .. } | CallbackSpec::StopAtTarget { .. } => {}
        }
        out.push(cb);
    }
    if backups > 1 {
        diags.push(
            Diagnostic::error("callbacks", format!("{backups} backup_and_restore callbacks; a run has at most one"))
                .help("keep one"),
        );
    }
    out
}

/// Restarts and the evaluator: what they need from the rest of the spec.
fn plan_fault_tolerance(
    spec: &Spec,
    cluster: &crate::cluster::Resolution,
    has_eval: bool,
    diags: &mut Vec<Diagnostic>,
) -> Restarts {
    let c = &spec.cluster;
    let has = |f: fn(&CallbackSpec) -> bool| spec.callbacks.iter().any(f);
    if cluster.cluster.count(crate::cluster::Role::Evaluator) > 0 {
        if !has(|c| matches!(c, CallbackSpec::ModelCheckpoint { .. })) {
            diags.push(
                Diagnostic::error(
                    "cluster.evaluator",
                    "the evaluator evaluates the checkpoints of a model_checkpoint callback, but the spec has none",
                )
                .help("add [[callbacks]] kind = \"model_checkpoint\" (e.g. save_freq = \"epoch\")"),
            );
        }
        if !has_eval {
            diags.push(
                Diagnostic::error(
                    "cluster.evaluator",
                    "the evaluator evaluates on the test split, but the dataset has none",
                )
                .help("remove the evaluator, or use a dataset with a test split"),
            );
        }
    }
    if c.max_restarts > 0 && !has(|c| matches!(c, CallbackSpec::BackupAndRestore { .. })) {
        diags.push(
            Diagnostic::warning(
                "cluster.max_restarts",
                format!(
                    "cluster.max_restarts = {} without a backup_and_restore callback: each restart trains from step 0",
                    c.max_restarts
                ),
            )
            .help("add [[callbacks]] kind = \"backup_and_restore\" with a save_freq"),
        );
    }
    Restarts { max_restarts: c.max_restarts, backoff_s: c.restart_backoff_s }
}

/// Keras's name of a watched metric.
pub fn monitor_name(m: Monitor) -> &'static str {
    match m {
        Monitor::Loss => "loss",
        Monitor::Accuracy => "accuracy",
        Monitor::ValLoss => "val_loss",
        Monitor::ValAccuracy => "val_accuracy",
    }
}
