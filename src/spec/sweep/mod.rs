//! `[sweep]`: a research sweep over key paths of the rest of the spec. `trainrun sweep SPEC`
//! runs each trial as an ordinary run; plain `trainrun SPEC` refuses a spec with a sweep.

mod expand;
mod hyperband;
mod scheduler;
pub mod tpe;

pub use expand::{Trial, expand, trial, value_text};
pub use scheduler::{HalvingSpec, Rule, RungGroup, RungUnit, SchedulerSpec, SweepSchedule};
pub use tpe::TpeSpec;

use super::Assignment;
use super::train::Mode;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::path::PathBuf;

/// `[sweep]`: the trials of a sweep and how to rank them.
///
/// Trials are every combination of the `grid` values (a cartesian product) crossed with each
/// of the `random` samples, followed by the explicit `trials`. Keys are `--set` key paths, in
/// quotes because they contain dots: `"optimizer.learning_rate" = [0.1, 0.01]`. Each trial
/// runs in its own folder under `run.out_dir` with a seed derived from the sweep seed and its
/// values (unless it sets `run.seed` itself).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SweepSpec {
    /// The result trials are ranked by (a column of `results.csv`). Default: `val_loss`, of
    /// the validation split each trial holds out; the test metrics stay columns of
    /// `results.csv`. Example: `metric = "val_accuracy"`.
    #[serde(default)]
    pub metric: SweepMetric,
    /// Whether a higher or a lower `metric` is better. Default: `auto` (`max` for accuracies,
    /// `min` for losses). Example: `mode = "max"`.
    #[serde(default)]
    pub mode: Mode,
    /// Seed of the random samples and of every trial's seed. Default: `run.seed`.
    /// Example: `seed = 7`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Values to try for each key path; every combination is a trial.
    /// Example: `grid = { "optimizer.learning_rate" = [0.1, 0.01], "batch.global" = [32, 64] }`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub grid: BTreeMap<String, GridValues>,
    /// `[sweep.random]`: trials sampled at random, seeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub random: Option<RandomSpec>,
    /// `[[sweep.trials]]`: explicit trials, each a table of key paths and values.
    /// Example: `trials = [{ "optimizer.learning_rate" = 0.2, "batch.global" = 128 }]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trials: Vec<BTreeMap<String, Json>>,
    /// `[sweep.scheduler]`: stop bad trials early (`successive_halving`, `asha`, `hyperband`,
    /// `median_stopping`). Example:
    /// `scheduler = { kind = "successive_halving", grace = 1, reduction_factor = 3 }`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler: Option<SchedulerSpec>,
    /// `[sweep.tpe]`: draw the `[sweep.random]` parameters by TPE, each trial from the results
    /// of those before it. Example: `tpe = { n_startup_trials = 5 }`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpe: Option<TpeSpec>,
    /// Under a `[sweep.scheduler]`, at most this many trials paused at a rung stay resident: a
    /// process kept in memory that trains on when promoted, instead of a new process resuming
    /// from the backup (the same bits either way). Beyond it, or beyond a quarter of the
    /// machine's memory, the least promising exit and resume from their backup when promoted.
    /// `0`: every trial exits at its rung. Default: as many as that memory holds.
    /// Example: `resident_trials = 9`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resident_trials: Option<u32>,
}

/// The values one grid key takes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct GridValues(
    /// At least one value. Example: `[0.1, 0.01]`.
    #[schemars(length(min = 1))]
    pub Vec<Json>,
);

/// `[sweep.random]`: `samples` draws from the distribution of each key path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RandomSpec {
    /// Random trials to draw (each crossed with every grid point). Example: `samples = 8`.
    pub samples: NonZeroU32,
    /// The distribution of each key path. Example:
    /// `parameters = { "optimizer.learning_rate" = { kind = "log_uniform", low = 1e-4, high = 0.1 } }`.
    pub parameters: BTreeMap<String, SweepDistribution>,
}

/// How a random key path is drawn. Real values are rounded to 4 significant digits, so they
/// read well in tables and folder names and can be typed back in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
// Named `Distribution` in the schema and in serde's error texts, as before the rename.
#[serde(rename = "Distribution", tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum SweepDistribution {
    /// Uniform between `low` and `high`.
    Uniform {
        /// Lowest value. Example: `low = 0.0`.
        low: f64,
        /// Highest value. Example: `high = 0.9`.
        high: f64,
    },
    /// Uniform in the logarithm between `low` and `high`, both positive (learning rates).
    LogUniform {
        /// Lowest value, above 0. Example: `low = 1e-4`.
        #[schemars(extend("exclusiveMinimum" = 0.0))]
        low: f64,
        /// Highest value, above 0. Example: `high = 0.1`.
        #[schemars(extend("exclusiveMinimum" = 0.0))]
        high: f64,
    },
    /// A whole number from `low` to `high`, both included.
    IntUniform {
        /// Lowest value. Example: `low = 1`.
        low: i64,
        /// Highest value. Example: `high = 5`.
        high: i64,
    },
    /// One of `values`, each equally likely.
    Choice {
        /// The values. Example: `values = [32, 64, 128]`.
        #[schemars(length(min = 1))]
        values: Vec<Json>,
    },
}

/// `sweep.metric`: a result of every trial (a column of `results.csv`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SweepMetric {
    /// Loss on the validation split a trial holds out (`data.preprocessing.validation_split`,
    /// or a source's validation files) at the end of training.
    #[default]
    ValLoss,
    /// Accuracy on the validation split at the end of training.
    ValAccuracy,
    /// Accuracy on the test split at the end of training (`trainrun check` warns: selecting
    /// on it picks hyperparameters on the data meant to judge them).
    TestAccuracy,
    /// Loss on the test split at the end of training (warned as `test_accuracy` is).
    TestLoss,
    /// Training accuracy of the last epoch.
    TrainAccuracy,
    /// Mean training loss of the last epoch.
    TrainLoss,
}

/// Every `sweep.metric`, in the order they are listed to users.
pub const SWEEP_METRICS: [SweepMetric; 6] = [
    SweepMetric::ValLoss,
    SweepMetric::ValAccuracy,
    SweepMetric::TestAccuracy,
    SweepMetric::TestLoss,
    SweepMetric::TrainAccuracy,
    SweepMetric::TrainLoss,
];

impl SweepMetric {
    /// The column name: `val_loss`.
    pub fn as_str(self) -> &'static str {
        match self {
            SweepMetric::ValLoss => "val_loss",
            SweepMetric::ValAccuracy => "val_accuracy",
            SweepMetric::TestAccuracy => "test_accuracy",
            SweepMetric::TestLoss => "test_loss",
            SweepMetric::TrainAccuracy => "train_accuracy",
            SweepMetric::TrainLoss => "train_loss",
        }
    }

    /// Whether it is an accuracy (else a loss).
    pub fn is_accuracy(self) -> bool {
        match self {
            SweepMetric::ValAccuracy | SweepMetric::TestAccuracy | SweepMetric::TrainAccuracy => true,
            SweepMetric::ValLoss | SweepMetric::TestLoss | SweepMetric::TrainLoss => false,
        }
    }

    /// Whether it measures the test split.
    pub fn is_test(self) -> bool {
        match self {
            SweepMetric::TestAccuracy | SweepMetric::TestLoss => true,
            SweepMetric::ValLoss | SweepMetric::ValAccuracy | SweepMetric::TrainAccuracy | SweepMetric::TrainLoss => {
                false
            }
        }
    }

    /// Whether higher is better under `mode`.
    pub fn higher_is_better(self, mode: Mode) -> bool {
        match mode {
            Mode::Max => true,
            Mode::Min => false,
            Mode::Auto => self.is_accuracy(),
        }
    }
}

/// A sweep as its spec describes it.
#[derive(Debug, Clone)]
pub struct Sweep {
    /// The base spec's `run.name`.
    pub name: String,
    /// The sweep folder: the base spec's `run.out_dir`.
    pub dir: PathBuf,
    /// What trials are ranked by.
    pub metric: SweepMetric,
    /// Whether a higher metric is better.
    pub higher_is_better: bool,
    /// The sweep seed.
    pub seed: u64,
    /// The trials.
    pub trials: Vec<Trial>,
    /// The scheduler resolved for the trials: its unit, rule, groups and their rungs.
    pub scheduler: Option<SweepSchedule>,
    /// TPE's search, when the sweep draws by it: `trials` holds its random startup trials.
    pub tpe: Option<TpeSearch>,
    /// `resident_trials`: the most paused trials kept resident, `None` as memory allows.
    pub resident_trials: Option<usize>,
}

/// A sweep's TPE search: what it draws and how many trials in all.
#[derive(Debug, Clone)]
pub struct TpeSearch {
    /// The parameters it draws (`sweep.random.parameters`).
    pub parameters: BTreeMap<String, SweepDistribution>,
    /// Trials in all (`sweep.random.samples`).
    pub trials: usize,
    /// The first trials, drawn at random.
    pub startup: usize,
    /// The estimator's tuning.
    pub settings: tpe::TpeSettings,
}

impl Sweep {
    /// The sweep of a loaded spec (`None` without `[sweep]`), or the problems of its section.
    pub fn new(loaded: &super::Loaded) -> Result<Option<Sweep>, Vec<super::Diagnostic>> {
        let Some(section) = &loaded.spec.sweep else {
            return Ok(None);
        };
        let run = &loaded.spec.run;
        let name = run.name.clone().unwrap_or_else(|| "sweep".to_string());
        let seed = section.seed.unwrap_or(run.seed);
        let problems = tpe::check(section);
        if !problems.is_empty() {
            return Err(problems);
        }
        let search = match (&section.tpe, &section.random) {
            (Some(t), Some(random)) => Some(TpeSearch {
                parameters: random.parameters.clone(),
                trials: random.samples.get() as usize,
                startup: (t.n_startup_trials.get() as usize).min(random.samples.get() as usize),
                settings: tpe::TpeSettings {
                    gamma: t.gamma,
                    n_candidates: t.n_candidates.get() as usize,
                    multivariate: t.multivariate,
                },
            }),
            (Some(_), None) | (None, _) => None,
        };
        let trials = expand(section, seed).map(|mut all| {
            all.truncate(search.as_ref().map_or(all.len(), |s| s.startup));
            all
        });
        let count = trials.as_ref().map_or(0, Vec::len);
        let scheduler = section.scheduler.as_ref().map(|s| s.schedule(loaded.spec.train.epochs.get(), count));
        // Every problem at once: the scheduler's, then the trials'.
        let (trials, scheduler) = match (trials, scheduler.transpose()) {
            (Ok(trials), Ok(scheduler)) => (trials, scheduler),
            (trials, scheduler) => {
                return Err(scheduler.err().into_iter().flatten().chain(trials.err().into_iter().flatten()).collect());
            }
        };
        Ok(Some(Sweep {
            scheduler,
            dir: run.out_dir.clone().unwrap_or_else(|| PathBuf::from("runs").join(&name)),
            name,
            metric: section.metric,
            higher_is_better: section.metric.higher_is_better(section.mode),
            seed,
            trials,
            tpe: search,
            resident_trials: section.resident_trials.map(|n| n as usize),
        }))
    }

    /// Trial `index` drawn by TPE with `values` (`None` when the sweep draws no such trial).
    pub fn drawn(&self, index: usize, values: Vec<(String, Json)>) -> Option<Trial> {
        self.tpe.as_ref().filter(|s| index > s.startup && index <= s.trials)?;
        let assignments = values
            .into_iter()
            .map(|(key, value)| {
                let source = format!("sweep.random.parameters.{}", expand::quote(&key));
                Assignment { key, value, source }
            })
            .collect();
        Some(trial(index, assignments, self.seed))
    }

    /// A trial's folder.
    pub fn trial_dir(&self, trial: &Trial) -> PathBuf {
        self.dir.join(&trial.name)
    }

    /// What a trial sets on top of the spec: its values, then its folder, name and seed.
    pub fn assignments(&self, trial: &Trial) -> Vec<Assignment> {
        let own = |key: &str, value: serde_json::Value| Assignment {
            key: key.to_string(),
            value,
            source: "sweep".to_string(),
        };
        let mut all = trial.values.clone();
        all.push(own("run.out_dir", self.trial_dir(trial).display().to_string().into()));
        all.push(own("run.name", format!("{}/{}", self.name, trial.name).into()));
        if !trial.values.iter().any(|a| a.key.trim() == "run.seed") {
            all.push(own("run.seed", trial.seed.into()));
        }
        all
    }
}
