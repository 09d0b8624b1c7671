//! The Tree-structured Parzen Estimator (Bergstra et al., "Algorithms for Hyper-Parameter
//! Optimization", NeurIPS 2011; Optuna's `TPESampler` with its default independent
//! sampling), purely: the finished trials split into the best `gamma` fraction and the rest;
//! each parameter gets one Parzen estimator over each part (`l` over the best, `g` over the
//! rest, each with a prior spanning the whole range); `n_candidates` values are drawn from `l`
//! and the one with the highest `l(x) / g(x)` is suggested. Real parameters are estimated in
//! their own space (`log_uniform` in the logarithm, `int_uniform` over `[low - ½, high + ½]`)
//! by truncated Gaussians whose widths are the gaps to their neighbours (Hyperopt's adaptive
//! Parzen estimator); `choice` by the counts of each value plus one. Everything is drawn from
//! a generator seeded by the caller, so a suggestion depends only on the seed and the results.
//! Under a scheduler the trials it stopped count too, as Optuna's TPE counts pruned trials
//! (`_split_trials`): the good part takes the trials trained to the end first, by loss, then
//! the stopped ones, the furthest trained first, each by its value where it stopped.
//!
//! `multivariate = true` (the default, as Optuna 5's `TPESampler`; Falkner et al., "BOHB",
//! ICML 2018) estimates the parameters jointly instead: every kernel is one trial, with a
//! component per parameter, and a candidate takes all its values from one kernel, so values
//! that worked together (a high learning rate with low momentum, a low one with a large batch)
//! are drawn together. Its kernels follow Optuna's `_ParzenEstimator`: one per trial plus a
//! prior over the whole space, equally weighted; each width the larger gap to the neighbouring
//! trials (at either end, the gap to the one next to it), clipped to at least the span over
//! `min(100, 2 + trials)`; a choice's kernel puts the trial's value's weight 1 on top of a
//! prior weight shared by all values.

use super::expand::{quote, real};
use super::{SweepDistribution, SweepSpec};
use crate::spec::Diagnostic;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::num::NonZeroU32;

/// `[sweep.tpe]`: draw the `[sweep.random]` parameters by TPE instead of at random. The sweep
/// runs `sweep.random.samples` trials: the first `n_startup_trials` are the random samples,
/// each later one is drawn from the results of all trials before it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TpeSpec {
    /// Random trials before TPE takes over. Default: `10`. Example: `n_startup_trials = 5`.
    #[serde(default = "ten")]
    pub n_startup_trials: NonZeroU32,
    /// The fraction of finished trials that counts as good, between 0 and 1 (rounded up, at
    /// most 25 trials). Default: `0.1`, Optuna's `default_gamma` (`min(ceil(0.1 n), 25)`).
    /// Example: `gamma = 0.2`.
    #[serde(default = "tenth")]
    pub gamma: f64,
    /// Values drawn from the good trials' estimator per parameter, of which the one most
    /// likelier among the good than among the others wins. Default: `24`.
    /// Example: `n_candidates = 48`.
    #[serde(default = "twenty_four")]
    pub n_candidates: NonZeroU32,
    /// Estimate the parameters jointly (each candidate drawn whole from one good trial's
    /// kernel, scored by the joint densities), as Optuna 5 does by default; `false` estimates
    /// each parameter on its own (Optuna's independent TPE, Hyperopt's). Default: `true`.
    /// Example: `multivariate = false`.
    #[serde(default = "yes")]
    pub multivariate: bool,
}

fn yes() -> bool {
    true
}

fn ten() -> NonZeroU32 {
    NonZeroU32::MIN.saturating_add(9)
}

fn tenth() -> f64 {
    0.1
}

fn twenty_four() -> NonZeroU32 {
    NonZeroU32::MIN.saturating_add(23)
}

/// The problems of `[sweep.tpe]` in `sweep`: what it draws from and what it cannot go with.
pub fn check(sweep: &SweepSpec) -> Vec<Diagnostic> {
    let Some(tpe) = &sweep.tpe else {
        return Vec::new();
    };
    let mut problems = Vec::new();
    if sweep.random.is_none() {
        problems.push(
            Diagnostic::error("sweep.tpe", "[sweep.tpe] draws the [sweep.random] parameters, and the sweep has none")
                .help("add [sweep.random] with `samples` (the trials to run) and `parameters` (what TPE searches)"),
        );
    }
    if let Some(key) = sweep.grid.keys().next() {
        problems.push(
            Diagnostic::error(
                format!("sweep.grid.{}", quote(key)),
                format!(
                    "TPE draws each trial from the results before it and cannot search a grid: sweep.grid sets `{key}`"
                ),
            )
            .help(format!(
                "move `{key}` to [sweep.random.parameters] as `{{ kind = \"choice\", values = [...] }}`, or drop \
                 [sweep.tpe] to run the grid"
            )),
        );
    }
    if !sweep.trials.is_empty() {
        problems.push(
            Diagnostic::error(
                "sweep.trials",
                "[[sweep.trials]] cannot go with [sweep.tpe], whose trials come one by one",
            )
            .help("run the listed trials in a sweep of their own"),
        );
    }
    if sweep.scheduler.as_ref().is_some_and(|s| !s.asynchronous()) {
        problems.push(
            Diagnostic::error(
                "sweep.scheduler",
                "[sweep.tpe] draws each trial from the results before it, and this scheduler is synchronous: it needs \
                 every trial of a rung up front",
            )
            .help("use kind = \"asha\", which starts each trial when a slot is free, or drop one of the two"),
        );
    }
    if !(tpe.gamma > 0.0 && tpe.gamma < 1.0) {
        problems.push(
            Diagnostic::error("sweep.tpe.gamma", format!("gamma = {} is not a fraction between 0 and 1", tpe.gamma))
                .help("use e.g. 0.1 (the default: the best tenth of the trials count as good)"),
        );
    }
    problems
}

/// `[sweep.tpe]`'s tuning of the estimator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TpeSettings {
    /// The fraction of finished trials that counts as good.
    pub gamma: f64,
    /// Values drawn from the good trials' estimator, of which the best ratio wins.
    pub n_candidates: usize,
    /// Estimate the parameters jointly rather than each on its own.
    pub multivariate: bool,
}

/// One finished trial: its values by key and its loss (lower is better).
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// The value of each parameter.
    pub values: BTreeMap<String, Json>,
    /// The metric, negated when higher is better: at the end of training, or where a scheduler
    /// stopped the trial.
    pub loss: f64,
    /// `None` for a trial trained to the end; for one a scheduler stopped, the rung (in its
    /// unit) of `loss`.
    pub stopped_at: Option<u64>,
}

/// The order in which observations count as good, as Optuna's TPE splits them: trials trained
/// to the end first, by loss, then stopped ones, the furthest trained first and by loss among
/// those stopped at the same rung.
fn better(a: &Observation, b: &Observation) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    match (a.stopped_at, b.stopped_at) {
        (None, None) => a.loss.total_cmp(&b.loss),
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (Some(x), Some(y)) => y.cmp(&x).then(a.loss.total_cmp(&b.loss)),
    }
}

/// The next trial's values of `params`, given the finished trials `history`, drawn with `rng`.
pub fn suggest(
    params: &BTreeMap<String, SweepDistribution>,
    history: &[Observation],
    settings: TpeSettings,
    rng: &mut ChaCha8Rng,
) -> BTreeMap<String, Json> {
    let mut order: Vec<&Observation> = history.iter().filter(|o| o.loss.is_finite()).collect();
    order.sort_by(|a, b| better(a, b));
    let (below, above) = order.split_at(n_below(settings.gamma, order.len()));
    if settings.multivariate {
        return joint::suggest(params, below, above, settings, rng);
    }
    let mut out = BTreeMap::new();
    for (key, dist) in params {
        let of =
            |part: &[&Observation]| -> Vec<Json> { part.iter().filter_map(|o| o.values.get(key).cloned()).collect() };
        let (below, above) = (of(below), of(above));
        let mut estimate = |low: f64, high: f64, to: fn(f64) -> f64| {
            let xs = |v: &[Json]| -> Vec<f64> { v.iter().filter_map(Json::as_f64).map(to).collect() };
            numeric(&Parzen::new(&xs(&below), low, high), &Parzen::new(&xs(&above), low, high), settings, rng)
        };
        let value = match dist {
            SweepDistribution::Uniform { low, high } => real(estimate(*low, *high, |x| x).clamp(*low, *high)),
            SweepDistribution::LogUniform { low, high } => {
                real(estimate(low.ln(), high.ln(), f64::ln).exp().clamp(*low, *high))
            }
            SweepDistribution::IntUniform { low, high } => {
                let x = estimate(*low as f64 - 0.5, *high as f64 + 0.5, |x| x);
                Json::from((x.round() as i64).clamp(*low, *high))
            }
            SweepDistribution::Choice { values } => categorical(values, &below, &above, settings, rng),
        };
        out.insert(key.clone(), value);
    }
    out
}

/// How many of `n` finished trials count as good: `gamma` of them rounded up, at least one and
/// at most [`MAX_BELOW`] (Optuna's `default_gamma` is this with `gamma = 0.1`).
fn n_below(gamma: f64, n: usize) -> usize {
    ((gamma * n as f64).ceil() as usize).min(MAX_BELOW).clamp(usize::from(n > 0), n)
}

/// The most trials the good part takes, as Optuna's `default_gamma`: past it, the good
/// estimator would widen to mediocre trials as a sweep grows.
const MAX_BELOW: usize = 25;

/// A uniform number in [0, 1) from 53 random bits, the same on every platform.
pub(super) fn unit(rng: &mut ChaCha8Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// A mixture of Gaussians truncated to `[low, high]`, equally weighted.
struct Parzen {
    mus: Vec<f64>,
    sigmas: Vec<f64>,
    low: f64,
    high: f64,
}

impl Parzen {
    /// Over `xs` and a prior centred on the interval as wide as it.
    fn new(xs: &[f64], low: f64, high: f64) -> Parzen {
        let span = (high - low).max(f64::MIN_POSITIVE);
        // (centre, is the prior), sorted by centre.
        let mut centres: Vec<(f64, bool)> = xs.iter().map(|x| (*x, false)).collect();
        centres.push(((low + high) / 2.0, true));
        centres.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mus: Vec<f64> = centres.iter().map(|c| c.0).collect();
        let narrowest = span / (100.0f64).min(1.0 + xs.len() as f64);
        let sigmas = (0..mus.len())
            .map(|i| {
                if centres[i].1 {
                    return span;
                }
                let left = if i == 0 { mus[i] - low } else { mus[i] - mus[i - 1] };
                let right = if i + 1 == mus.len() { high - mus[i] } else { mus[i + 1] - mus[i] };
                left.max(right).clamp(narrowest, span)
            })
            .collect();
        Parzen { mus, sigmas, low, high }
    }

    fn sample(&self, rng: &mut ChaCha8Rng) -> f64 {
        let k = ((unit(rng) * self.mus.len() as f64) as usize).min(self.mus.len() - 1);
        for _ in 0..100 {
            // Box-Muller.
            let (u1, u2) = (unit(rng).max(f64::MIN_POSITIVE), unit(rng));
            let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            let x = self.mus[k] + self.sigmas[k] * z;
            if (self.low..=self.high).contains(&x) {
                return x;
            }
        }
        self.mus[k].clamp(self.low, self.high)
    }

    fn log_density(&self, x: f64) -> f64 {
        let n = self.mus.len() as f64;
        let total: f64 = self
            .mus
            .iter()
            .zip(&self.sigmas)
            .map(|(mu, s)| {
                let mass = phi((self.high - mu) / s) - phi((self.low - mu) / s);
                let z = (x - mu) / s;
                (-0.5 * z * z).exp() / (s * (2.0 * std::f64::consts::PI).sqrt() * mass.max(1e-12))
            })
            .sum();
        (total / n).max(f64::MIN_POSITIVE).ln()
    }
}

/// The standard normal's cumulative distribution.
pub(super) fn phi(z: f64) -> f64 {
    0.5 * (1.0 + erf(z / std::f64::consts::SQRT_2))
}

/// The error function (Abramowitz and Stegun 7.1.26, to 1.5e-7).
fn erf(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let poly =
        t * (0.254_829_592 + t * (-0.284_496_736 + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let y = 1.0 - poly * (-x * x).exp();
    if x < 0.0 { -y } else { y }
}

/// The candidate from `l` with the highest `l(x) / g(x)`, in the estimators' space.
fn numeric(l: &Parzen, g: &Parzen, s: TpeSettings, rng: &mut ChaCha8Rng) -> f64 {
    let mut best = (f64::NEG_INFINITY, (l.low + l.high) / 2.0);
    for _ in 0..s.n_candidates.max(1) {
        let x = l.sample(rng);
        let score = l.log_density(x) - g.log_density(x);
        if score > best.0 {
            best = (score, x);
        }
    }
    best.1
}

/// The candidate value with the highest ratio of its share among the good trials to its share
/// among the others (each count plus one).
fn categorical(values: &[Json], below: &[Json], above: &[Json], s: TpeSettings, rng: &mut ChaCha8Rng) -> Json {
    let weights = |part: &[Json]| -> Vec<f64> {
        values.iter().map(|v| 1.0 + part.iter().filter(|p| *p == v).count() as f64).collect()
    };
    let (l, g) = (weights(below), weights(above));
    let (sum_l, sum_g): (f64, f64) = (l.iter().sum(), g.iter().sum());
    let mut best = (f64::NEG_INFINITY, 0);
    for _ in 0..s.n_candidates.max(1) {
        let mut u = unit(rng) * sum_l;
        let mut k = values.len() - 1;
        for (i, w) in l.iter().enumerate() {
            if u < *w {
                k = i;
                break;
            }
            u -= w;
        }
        let score = (l[k] / sum_l).ln() - (g[k] / sum_g).ln();
        if score > best.0 {
            best = (score, k);
        }
    }
    values.get(best.1).cloned().unwrap_or(Json::Null)
}

#[path = "tpe_joint.rs"]
mod joint;

#[cfg(test)]
#[path = "tpe_tests.rs"]
mod tests;
