//! The plan: everything a run will do, derived purely from the spec and the facts the caller
//! gathered (the data source and its sizes, cores, the cluster). No I/O and no environment
//! reads happen here, so `trainrun check` and every test can call it freely.
//!
//! The plan is resolved and typed: no `auto` is left, every default is filled in, and no
//! spec section travels on. Each part of the runtime takes its own slice: [`ClusterPlan`],
//! [`StrategyPlan`] (with the [`CollectivePlan`]), [`DataPlan`], [`ModelPlan`], [`TrainPlan`],
//! [`CallbacksPlan`]. What `trainrun check` prints is what the runtime does.

mod batch;
mod callbacks;
mod cluster;
mod data;
mod lr;
mod memory;
mod optimizer;
mod parameter_server;
mod precision;
mod preprocessing;
mod render;
mod strategy;
pub mod topology;
mod train;

pub use batch::{BatchPlan, Derived};
pub use callbacks::{CallbackKind, CallbackPlan, CallbacksPlan, SaveEvery, Watch};
pub use cluster::{ClusterPlan, Part, Restarts};
pub use data::{DataPlan, ShardPolicy, source};
pub use lr::{LrPlan, Scaling, Schedule, Warmup};
pub use memory::{ADDRESS_SPACE, MachineMemory, MemoryEstimate, MemorySource, TooBig, parse_size};
pub use optimizer::{DecayPlan, OptimizerPlan};
pub use parameter_server::{ParameterServerPlan, VariablePlacement, VariableShard, num_shards, split_rows};
pub use precision::PrecisionPlan;
pub use strategy::{
    CollectivePlan, CrossDevice, CrossDevicePlan, Distribution, Hardware, Replicas, StrategyKind, StrategyPlan,
};
pub use train::{EvalPlan, TrainPlan};

use crate::cluster::Resolution;
use crate::data::{AnySource, DataFacts};
use crate::engine::Shape;
use crate::model::ModelPlan;
use crate::spec::{Diagnostic, Severity, Spec, StrategySpec};
use serde::{Serialize, Serializer};
use std::path::PathBuf;
use std::time::Duration;

/// What the caller knows about the world, passed in so planning stays pure.
#[derive(Debug, Clone, PartialEq)]
pub struct Facts {
    /// Where the examples come from (`plan::source` resolved it).
    pub source: AnySource,
    /// The training and test data's sizes and shapes.
    pub data: DataFacts,
    /// Cores of this machine.
    pub cores: usize,
    /// The bf16 instructions of this machine's CPU.
    pub bf16: crate::engine::bf16::Bf16Support,
    /// GPUs and the like.
    pub hardware: Hardware,
    /// The cluster (spec, TF_CONFIG or Slurm) and this process's task.
    pub cluster: Resolution,
    /// The memory this machine gives the job: a model whose estimate exceeds it is not
    /// planned further.
    pub memory: MachineMemory,
}

/// Why a spec did not plan.
#[derive(Debug, Clone, PartialEq)]
pub enum PlanError {
    /// Problems of the spec (errors and warnings).
    Spec(Vec<Diagnostic>),
    /// A valid spec whose model this machine cannot hold (exit 3).
    TooBig(Box<TooBig>),
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
    /// The cluster and this process's part in it.
    pub cluster: ClusterPlan,
    /// Strategy, devices, reduction.
    pub strategy: StrategyPlan,
    /// Batch sizes.
    pub batch: BatchPlan,
    /// Learning-rate policy.
    pub learning_rate: LrPlan,
    /// Optimizer.
    pub optimizer: OptimizerPlan,
    /// Input pipeline.
    pub data: DataPlan,
    /// The model.
    pub model: ModelPlan,
    /// The dtype policy and the path its products take here.
    #[serde(skip_serializing_if = "PrecisionPlan::is_float32")]
    pub precision: PrecisionPlan,
    /// Training loop.
    pub train: TrainPlan,
    /// Callbacks.
    pub callbacks: CallbacksPlan,
    /// The memory one task needs at its peak, estimated before anything is allocated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryEstimate>,
    /// Hashes of the spec that tell runs and backups apart.
    pub hashes: SpecHashes,
    /// Warnings to show before running.
    #[serde(skip)]
    pub warnings: Vec<Diagnostic>,
}

/// Hashes of the resolved spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SpecHashes {
    /// What determines the results: the spec without where it writes and how many threads
    /// compute ([`Spec::results_sha256`]); `summary.json` records it and tasks of a job must
    /// agree on it.
    pub results: String,
    /// One short hash per key path of what `results` covers, so tasks whose results hashes
    /// differ can say in which keys.
    pub results_keys: std::collections::BTreeMap<String, String>,
    /// What a backup may resume under: the spec without the cluster, the strategy, the batch
    /// split (the global batch is checked on its own) and output settings.
    pub training: String,
    /// One short hash per key path of what `training` covers, so a resume can say which keys
    /// changed since the backup (and refuse those that make it another run's).
    pub training_keys: std::collections::BTreeMap<String, String>,
}

impl SpecHashes {
    /// The hashes of `spec`.
    pub fn of(spec: &Spec) -> Self {
        let mut s = spec.clone();
        s.cluster = Default::default();
        s.strategy = Default::default();
        s.batch = Default::default();
        s.run.name = None;
        s.run.out_dir = None;
        s.run.threads = None;
        s.run.tracking = None;
        s.extends = None;
        s.deploy = None;
        Self {
            results: spec.results_sha256(),
            results_keys: spec.results_keys(),
            training: crate::spec::sha256_json(&s),
            training_keys: s.results_keys(),
        }
    }
}

/// Durations as seconds in `trainrun check --json`.
pub(crate) fn secs<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl Plan {
    /// Plans `spec` given `facts`; on failure returns every problem found (errors and
    /// warnings), or, for a valid spec, that the model needs more memory than `facts.memory`:
    /// that is found from arithmetic on the spec, before the model's layers are expanded.
    pub fn new(spec: &Spec, facts: &Facts) -> Result<Plan, PlanError> {
        let mut diags = Vec::new();
        // The failure timeout, and the key that set it (errors name the key the user wrote).
        let timeout_s = match &spec.strategy {
            StrategySpec::MultiWorkerMirrored { communication, .. } => {
                ("strategy.communication.timeout_s", communication.timeout_s)
            }
            StrategySpec::ParameterServer { timeout_s, .. } => ("strategy.timeout_s", *timeout_s),
            StrategySpec::Default
            | StrategySpec::OneDevice { .. }
            | StrategySpec::Mirrored { .. }
            | StrategySpec::CentralStorage { .. } => {
                ("strategy.communication.timeout_s", crate::spec::CommunicationOptions::default().timeout_s)
            }
        };
        let multi_process = StrategyKind::of(&spec.strategy).multi_process();
        let cluster = cluster::resolve(&spec.cluster, &facts.cluster, multi_process, timeout_s, &mut diags);
        let replicas = strategy::replicas(&spec.strategy, &cluster, facts.hardware, &mut diags);
        let batch = batch::resolve(&spec.batch, replicas.num_replicas_in_sync, &replicas.replicas_text())
            .map_err(|e| diags.push(e))
            .ok();
        let kind = StrategyKind::of(&spec.strategy);
        let data = data::resolve(&spec.data, &facts.source, &facts.data, kind, &replicas, &mut diags);
        let global = batch.map_or(1, |b| b.global);
        // The model sees the data after preprocessing (a crop's shape, validation_split's sizes).
        let input = Shape(data.facts.example_shape.clone());
        let mut optimizer_diags = Vec::new();
        let (default_lr, optimizer) = optimizer::resolve(spec, &mut optimizer_diags);
        // Tasks on this machine share its cores and its memory.
        let local_tasks = if cluster.is_local() { cluster.tasks.len().max(1) } else { 1 };
        let memory = crate::model::size(&spec.model, &input, data.facts.labels).map(|size| {
            let per_replica = batch.map_or(1, |b| b.per_replica);
            let estimate =
                memory::estimate(&size, &optimizer, per_replica, replicas.devices.len(), &data.facts, local_tasks);
            (size, estimate)
        });
        // A model too big to hold is not expanded (a GPT's layer list alone can exceed the
        // machine); the rest is planned, so that the spec's own errors come first.
        let too_big = memory.as_ref().filter(|(_, e)| e.needed > facts.memory.bytes).map(|(size, estimate)| {
            Box::new(TooBig {
                estimate: estimate.clone(),
                machine: facts.memory,
                shrink: size.shrink.clone(),
                batch_key: format!("batch.per_replica (now {})", estimate.per_replica),
            })
        });
        let memory = memory.map(|(_, estimate)| estimate);
        let precision = precision::resolve(spec, facts.bf16, &mut diags);
        let model = match too_big {
            Some(_) => None,
            None => crate::model::describe_for(&spec.model, &input, data.facts.labels)
                .map_err(|model_diags| diags.extend(model_diags))
                .ok()
                .map(|model| ModelPlan { products: precision.products, ..model }),
        };
        if let Some(model) = &model {
            precision::check_model(&precision, model, &mut diags);
        }
        let train = train::resolve(spec, model.as_ref(), &data.facts, global, &mut diags);
        let parameter_server = parameter_server::resolve(
            spec,
            cluster.count(crate::cluster::Role::Ps),
            model.as_ref(),
            facts.cores,
            &mut diags,
        );
        let strategy = strategy::resolve(&spec.strategy, replicas, &cluster, parameter_server, &mut diags);
        diags.extend(optimizer_diags);
        let learning_rate =
            lr::resolve(&spec.optimizer, default_lr, global, train.steps_per_epoch, train.total_steps, &mut diags);
        let name = spec.run.name.clone().unwrap_or_else(|| "run".to_string());
        let out_dir = spec.run.out_dir.clone().unwrap_or_else(|| PathBuf::from("runs").join(&name));
        let callbacks = callbacks::resolve(&spec.callbacks, &out_dir, train.eval.is_some(), &mut diags);
        fault_tolerance(&cluster, &callbacks, train.eval.is_some(), &mut diags);
        if let Some(t) = spec.run.threads.map(|t| t.get()).filter(|&t| t > facts.cores) {
            diags.push(
                Diagnostic::warning(
                    "run.threads",
                    format!(
                        "run.threads = {t} is more than the {} cores of this machine: the threads take turns, and each step waits for the slowest",
                        facts.cores
                    ),
                )
                .help(format!("use run.threads = {} or fewer, or leave it out (one per core, shared by local tasks)", facts.cores)),
            );
        }

        let failed = diags.iter().any(|d| d.severity == Severity::Error);
        if let (Some(too_big), false) = (too_big, failed) {
            return Err(PlanError::TooBig(too_big));
        }
        match (batch, learning_rate, model, strategy, failed) {
            (Some(batch), Some(learning_rate), Some(model), Some(strategy), false) => Ok(Plan {
                out_dir,
                name,
                seed: spec.run.seed,
                threads: spec.run.threads.map_or((facts.cores / local_tasks).max(1), |t| t.get()),
                cluster,
                strategy,
                batch,
                learning_rate,
                optimizer,
                data,
                model,
                precision,
                train,
                callbacks,
                memory,
                hashes: SpecHashes::of(spec),
                warnings: diags,
            }),
            _ => Err(PlanError::Spec(diags)),
        }
    }

    /// Human-readable plan, as `trainrun check` prints it.
    pub fn render(&self) -> String {
        render::text(self)
    }
}

/// Restarts and the evaluator: what they need from the rest of the plan.
fn fault_tolerance(cluster: &ClusterPlan, callbacks: &CallbacksPlan, has_eval: bool, diags: &mut Vec<Diagnostic>) {
    if cluster.count(crate::cluster::Role::Evaluator) > 0 {
        if callbacks.model_dirs().next().is_none() {
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
    let restarts = cluster.restarts.max_restarts;
    if restarts > 0 && callbacks.backup_dir().is_none() {
        diags.push(
            Diagnostic::warning(
                "cluster.max_restarts",
                format!(
                    "cluster.max_restarts = {restarts} without a backup_and_restore callback: each restart trains from step 0"
                ),
            )
            .help("add [[callbacks]] kind = \"backup_and_restore\" with a save_freq"),
        );
    }
}
