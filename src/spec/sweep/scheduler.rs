//! `[sweep.scheduler]`: stopping bad trials early. Every scheduler trains its trials rung by
//! rung; the synchronous ones let all trials of a rung finish before anything is decided, so
//! decisions depend only on the trials' results and the same sweep decides the same every
//! time. A trial pauses at a rung by its own backup and a promoted one resumes from it, so it ends
//! bit-identical to a trial never paused. Rungs count epochs or optimizer steps (`unit`).
//!
//! - `successive_halving`: the synchronous form of ASHA (Li et al., "A System for Massively
//!   Parallel Hyperparameter Tuning", 2020): every trial trains `grace`; the best
//!   1/`reduction_factor` go on to `grace × reduction_factor`, and so on up to `max`.
//! - `asha`: asynchronous successive halving (Li et al. 2020, Ray Tune's `ASHAScheduler`), the
//!   same rungs without waiting for a rung to fill: a free slot starts the next trial while
//!   any is left, then promotes a trial that is in the best 1/`reduction_factor` of its rung's
//!   results so far, from the lowest rung up (`crate::sweep::asha` says why in that order).
//!   Its decisions depend on timing, so each is recorded with the values it saw and can be
//!   replayed (`trainrun sweep --replay`).
//! - `hyperband` (Li et al., "Hyperband", JMLR 2018): the trials split into brackets of
//!   successive halving that start at different rungs ([`super::hyperband`]).
//! - `median_stopping` (Golovin et al., "Google Vizier", 2017): at each rung after `grace`, a
//!   trial whose best result so far is worse than the median of the other trials' running
//!   averages stops.

use super::hyperband;
use crate::spec::Diagnostic;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::num::NonZeroU64;

/// `[sweep.scheduler]`: how trials are stopped early, chosen by `kind`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum SchedulerSpec {
    /// Synchronous successive halving: all trials of a rung finish before the best go on.
    SuccessiveHalving(HalvingSpec),
    /// Asynchronous successive halving (ASHA): once every trial has started, a free slot
    /// promotes a trial in the best 1/`reduction_factor` of its rung's results so far, from the
    /// lowest rung up; slots never wait for a rung to fill.
    Asha(HalvingSpec),
    /// Hyperband: brackets of successive halving, the first starting at `grace` with the most
    /// trials, the last training its few trials `max` straight away.
    Hyperband(HalvingSpec),
    /// The median stopping rule: at each rung from `grace` on, a trial stops when its best
    /// result so far is worse than the median of the other trials' running averages there.
    MedianStopping {
        /// What every trial trains before the first decision, in `unit`s. Example: `grace = 1`.
        grace: NonZeroU64,
        /// Rungs after `grace`: every `interval` `unit`s up to `max`. Default: `grace`.
        /// Example: `interval = 2`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        interval: Option<NonZeroU64>,
        /// Other trials a rung needs before it stops anyone. Default: `3`.
        /// Example: `min_samples = 2`.
        #[serde(default = "three_samples")]
        min_samples: NonZeroU64,
        /// The last rung, in `unit`s. Default: `train.epochs` (needed with `unit = "steps"`).
        /// Example: `max = 9`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max: Option<NonZeroU64>,
        /// What `grace`, `interval` and `max` count. Default: `epochs`. Example: `unit = "steps"`.
        #[serde(default, skip_serializing_if = "RungUnit::is_epochs")]
        unit: RungUnit,
    },
}

/// The parameters of successive halving and of Hyperband.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HalvingSpec {
    /// The first rung, in `unit`s: what every trial trains before the first decision (under
    /// Hyperband, the first bracket's). Example: `grace = 1`.
    pub grace: NonZeroU64,
    /// Each rung keeps the best 1/`reduction_factor` of its trials (at least one) and trains
    /// them `reduction_factor` times as long. Default: `3`. Example: `reduction_factor = 2`.
    #[serde(default = "three")]
    #[schemars(range(min = 2))]
    pub reduction_factor: u64,
    /// The last rung, in `unit`s. Default: `train.epochs` (needed with `unit = "steps"`).
    /// Example: `max = 9`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<NonZeroU64>,
    /// What `grace` and `max` count. Default: `epochs`. Example: `unit = "steps"`.
    #[serde(default, skip_serializing_if = "RungUnit::is_epochs")]
    pub unit: RungUnit,
}

/// `sweep.scheduler.unit`: what a scheduler's rungs count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RungUnit {
    /// Epochs (`train.epochs`).
    #[default]
    Epochs,
    /// Optimizer steps: a trial pauses at a rung's step, in the middle of an epoch too
    /// (`train.stop_at_step`), and its whole run is `max` steps, which must be a whole number
    /// of each trial's epochs (`train.steps_per_epoch`). Trials of different batch sizes then
    /// compare after the same number of updates.
    Steps,
}

impl RungUnit {
    /// The default, left out of the serialized spec so hashes stay as before the key.
    pub fn is_epochs(&self) -> bool {
        *self == RungUnit::Epochs
    }

    /// `epochs` or `steps`.
    pub fn as_str(self) -> &'static str {
        match self {
            RungUnit::Epochs => "epochs",
            RungUnit::Steps => "steps",
        }
    }
}

fn three() -> u64 {
    3
}

fn three_samples() -> NonZeroU64 {
    NonZeroU64::MIN.saturating_add(2)
}

/// How a scheduler decides at the end of a rung.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// The best 1/`reduction_factor` go on (successive halving and Hyperband's brackets).
    Halving {
        /// η.
        reduction_factor: u64,
    },
    /// A trial whose best is worse than the median of the others' running averages stops.
    Median {
        /// Other trials needed before anyone stops.
        min_samples: u64,
    },
}

impl Rule {
    /// Trials a halving rung of `n` keeps (at least one), or all of them under the median rule.
    pub fn keep(&self, n: usize) -> usize {
        match self {
            Rule::Halving { reduction_factor } => {
                (n / usize::try_from(*reduction_factor).unwrap_or(usize::MAX)).max(1).min(n)
            }
            Rule::Median { .. } => n,
        }
    }
}

/// Trials trained together rung by rung: all of a sweep's under successive halving and median
/// stopping, one bracket's under Hyperband.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RungGroup {
    /// Hyperband's bracket (`s`, its count of halvings); `None` for the other schedulers.
    pub bracket: Option<u32>,
    /// Its trials, 1-based.
    pub trials: Vec<usize>,
    /// Its rungs, in the scheduler's unit; the last is what a trial trains in full.
    pub rungs: Vec<u64>,
}

/// A scheduler resolved for a sweep: its unit, decision rule and groups.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepSchedule {
    /// The spec section.
    pub spec: SchedulerSpec,
    /// What the rungs count.
    pub unit: RungUnit,
    /// How each rung decides.
    pub rule: Rule,
    /// Trials trained together, in the order they run.
    pub groups: Vec<RungGroup>,
    /// The last rung of every group, in `unit`s.
    pub max: u64,
}

impl SchedulerSpec {
    /// The schedule of `trials` trials of `epochs` epochs (`train.epochs`), or every problem.
    pub fn schedule(&self, epochs: u64, trials: usize) -> Result<SweepSchedule, Vec<Diagnostic>> {
        let (grace, max, unit) = match self {
            SchedulerSpec::SuccessiveHalving(HalvingSpec { grace, max, unit, .. })
            | SchedulerSpec::Asha(HalvingSpec { grace, max, unit, .. })
            | SchedulerSpec::Hyperband(HalvingSpec { grace, max, unit, .. })
            | SchedulerSpec::MedianStopping { grace, max, unit, .. } => (grace.get(), *max, *unit),
        };
        let mut problems = Vec::new();
        let max = match (max, unit) {
            (Some(m), _) => m.get(),
            (None, RungUnit::Epochs) => epochs,
            (None, RungUnit::Steps) => {
                problems.push(
                    Diagnostic::error(
                        "sweep.scheduler.max",
                        "unit = \"steps\" needs max, the steps of the last rung (train.epochs counts epochs)",
                    )
                    .help("add e.g. `max = 1000` to [sweep.scheduler], a whole number of each trial's epochs"),
                );
                grace
            }
        };
        if let SchedulerSpec::SuccessiveHalving(HalvingSpec { reduction_factor, .. })
        | SchedulerSpec::Asha(HalvingSpec { reduction_factor, .. })
        | SchedulerSpec::Hyperband(HalvingSpec { reduction_factor, .. }) = self
            && *reduction_factor < 2
        {
            problems.push(
                Diagnostic::error(
                    "sweep.scheduler.reduction_factor",
                    format!("reduction_factor = {reduction_factor} never stops a trial"),
                )
                .help("use 2 or more; 3 is the default (each rung keeps the best third)"),
            );
        }
        if grace > max {
            let u = unit.as_str();
            let default = match unit {
                RungUnit::Epochs => " (default: train.epochs)",
                RungUnit::Steps => "",
            };
            problems.push(
                Diagnostic::error(
                    "sweep.scheduler.grace",
                    format!("grace = {grace} {u} is more than max = {max} {u}, the most a trial trains"),
                )
                .help(format!("lower grace to at most {max}, or raise max{default}")),
            );
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        let all = || (1..=trials).collect::<Vec<usize>>();
        let (rule, groups) = match self {
            SchedulerSpec::SuccessiveHalving(HalvingSpec { reduction_factor, .. })
            | SchedulerSpec::Asha(HalvingSpec { reduction_factor, .. }) => (
                Rule::Halving { reduction_factor: *reduction_factor },
                vec![RungGroup { bracket: None, trials: all(), rungs: halving_rungs(grace, *reduction_factor, max) }],
            ),
            SchedulerSpec::Hyperband(HalvingSpec { reduction_factor, .. }) => (
                Rule::Halving { reduction_factor: *reduction_factor },
                hyperband::brackets(grace, *reduction_factor, max, trials),
            ),
            SchedulerSpec::MedianStopping { interval, min_samples, .. } => {
                let step = interval.map_or(grace, NonZeroU64::get);
                let mut rungs: Vec<u64> =
                    (0..).map(|k| grace.saturating_add(step.saturating_mul(k))).take_while(|r| *r < max).collect();
                rungs.push(max);
                (
                    Rule::Median { min_samples: min_samples.get() },
                    vec![RungGroup { bracket: None, trials: all(), rungs }],
                )
            }
        };
        Ok(SweepSchedule { spec: self.clone(), unit, rule, groups, max })
    }
}

impl SchedulerSpec {
    /// Whether its decisions wait for nothing (and so depend on timing, and are replayed).
    pub fn asynchronous(&self) -> bool {
        match self {
            SchedulerSpec::Asha(_) => true,
            SchedulerSpec::SuccessiveHalving(_)
            | SchedulerSpec::Hyperband(_)
            | SchedulerSpec::MedianStopping { .. } => false,
        }
    }
}

/// `grace`, `grace × η`, `grace × η²`, … below `max`, then `max`.
pub(super) fn halving_rungs(grace: u64, eta: u64, max: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut r = grace;
    while r < max {
        out.push(r);
        r = r.saturating_mul(eta);
    }
    out.push(max);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nz(n: u64) -> NonZeroU64 {
        NonZeroU64::new(n).unwrap_or(NonZeroU64::MIN)
    }

    fn halving(grace: u64, eta: u64, max: Option<u64>) -> SchedulerSpec {
        SchedulerSpec::SuccessiveHalving(HalvingSpec {
            grace: nz(grace),
            reduction_factor: eta,
            max: max.map(nz),
            unit: RungUnit::Epochs,
        })
    }

    fn rungs(s: &SchedulerSpec, epochs: u64) -> Option<Vec<u64>> {
        s.schedule(epochs, 3).ok().map(|s| s.groups[0].rungs.clone())
    }

    #[test]
    fn rungs_grow_by_the_reduction_factor_up_to_max() {
        assert_eq!(rungs(&halving(1, 3, None), 9), Some(vec![1, 3, 9]));
        assert_eq!(rungs(&halving(1, 3, Some(5)), 9), Some(vec![1, 3, 5]));
        assert_eq!(rungs(&halving(2, 2, None), 2), Some(vec![2]));
        assert_eq!(Rule::Halving { reduction_factor: 3 }.keep(27), 9);
        assert_eq!(Rule::Halving { reduction_factor: 3 }.keep(2), 1);
        assert_eq!(Rule::Median { min_samples: 3 }.keep(5), 5);
    }

    #[test]
    fn median_stopping_decides_every_interval_from_grace_to_max() {
        let m = |interval: Option<u64>, max: u64| SchedulerSpec::MedianStopping {
            grace: nz(2),
            interval: interval.map(nz),
            min_samples: nz(3),
            max: Some(nz(max)),
            unit: RungUnit::Steps,
        };
        assert_eq!(rungs(&m(None, 7), 1), Some(vec![2, 4, 6, 7]));
        assert_eq!(rungs(&m(Some(3), 8), 1), Some(vec![2, 5, 8]));
        assert_eq!(
            m(None, 7).schedule(1, 3).map(|s| (s.unit, s.rule)).ok(),
            Some((RungUnit::Steps, Rule::Median { min_samples: 3 }))
        );
    }

    #[test]
    fn grace_above_max_a_factor_below_2_and_steps_without_max_are_named_with_their_fix() {
        let e = halving(4, 3, None)
            .schedule(3, 3)
            .err()
            .map(|d| (d[0].key.clone(), d[0].message.clone(), d[0].help.clone()));
        assert_eq!(
            e,
            Some((
                "sweep.scheduler.grace".into(),
                "grace = 4 epochs is more than max = 3 epochs, the most a trial trains".into(),
                Some("lower grace to at most 3, or raise max (default: train.epochs)".into())
            ))
        );
        assert!(halving(1, 1, None).schedule(3, 3).is_err_and(|d| d[0].key == "sweep.scheduler.reduction_factor"));
        let steps = SchedulerSpec::Hyperband(HalvingSpec {
            grace: nz(10),
            reduction_factor: 3,
            max: None,
            unit: RungUnit::Steps,
        });
        let keys = steps.schedule(3, 3).err().map(|d| d.into_iter().map(|d| d.key).collect::<Vec<_>>());
        assert_eq!(keys, Some(vec!["sweep.scheduler.max".to_string()]));
    }
}
