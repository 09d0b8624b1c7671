//! Multivariate TPE ([`super::TpeSettings::multivariate`]): one Parzen estimator over all the
//! parameters at once for the good trials and one for the rest, each a mixture of one kernel
//! per trial and a prior kernel, equally weighted, a kernel being the product of a component
//! per parameter (Optuna 5's `_ParzenEstimator` and `_MixtureOfProductDistribution`). The
//! candidates are drawn whole from the good trials' mixture and the one with the highest
//! `l(x) / g(x)` of the joint densities wins.

use super::super::SweepDistribution;
use super::super::expand::real;
use super::{Observation, TpeSettings, phi, unit};
use rand_chacha::ChaCha8Rng;
use serde_json::Value as Json;
use std::collections::BTreeMap;

/// One parameter's component in every kernel.
enum Components {
    /// Gaussians truncated to `[low, high]`, in the parameter's space (the logarithm for
    /// `log_uniform`, `[low - ½, high + ½]` for `int_uniform`).
    Numeric { mus: Vec<f64>, sigmas: Vec<f64>, low: f64, high: f64 },
    /// Each kernel's probability of every value.
    Choice { probabilities: Vec<Vec<f64>> },
}

/// A candidate in the estimators' space: a number, or a choice's index, per parameter.
type Point = Vec<f64>;

/// The mixture over `part`'s trials: one component list per parameter of `params`, in order.
struct Mixture {
    components: Vec<Components>,
    kernels: usize,
}

/// A numeric parameter's space for the estimator: its ends and the map into it.
type Space = (f64, f64, fn(f64) -> f64);

/// Where a parameter's values live for the estimator: its space and the map into it.
fn space(dist: &SweepDistribution) -> Option<Space> {
    match dist {
        SweepDistribution::Uniform { low, high } => Some((*low, *high, |x| x)),
        SweepDistribution::LogUniform { low, high } => Some((low.ln(), high.ln(), f64::ln)),
        SweepDistribution::IntUniform { low, high } => Some((*low as f64 - 0.5, *high as f64 + 0.5, |x| x)),
        SweepDistribution::Choice { .. } => None,
    }
}

/// `value` of a parameter as a coordinate of [`Point`]; `None` when it is not one the
/// distribution can hold.
fn coordinate(dist: &SweepDistribution, value: &Json) -> Option<f64> {
    match (dist, space(dist)) {
        (SweepDistribution::Choice { values }, _) => values.iter().position(|v| v == value).map(|i| i as f64),
        (_, Some((_, _, to))) => value.as_f64().map(to).filter(|x| x.is_finite()),
        (_, None) => None,
    }
}

impl Mixture {
    /// The estimator over `points` (each a full [`Point`]) of `dists`.
    fn new(dists: &[&SweepDistribution], points: &[Point]) -> Mixture {
        let n = points.len();
        let components = dists
            .iter()
            .enumerate()
            .map(|(p, dist)| match (dist, space(dist)) {
                (SweepDistribution::Choice { values }, _) => {
                    let choices = values.len().max(1);
                    let prior = 1.0 / (n + 1) as f64;
                    let mut rows: Vec<Vec<f64>> = points
                        .iter()
                        .map(|x| {
                            let mut row = vec![prior; choices];
                            if let Some(w) = row.get_mut(x[p] as usize) {
                                *w += 1.0;
                            }
                            row
                        })
                        .collect();
                    rows.push(vec![prior; choices]);
                    for row in &mut rows {
                        let sum: f64 = row.iter().sum();
                        row.iter_mut().for_each(|w| *w /= sum);
                    }
                    Components::Choice { probabilities: rows }
                }
                (_, Some((low, high, _))) => {
                    let xs: Vec<f64> = points.iter().map(|x| x[p]).collect();
                    let (mut mus, mut sigmas) = (xs.clone(), widths(&xs, low, high));
                    mus.push((low + high) / 2.0);
                    sigmas.push(high - low);
                    Components::Numeric { mus, sigmas, low, high }
                }
                (_, None) => Components::Choice { probabilities: vec![vec![1.0]; n + 1] },
            })
            .collect();
        Mixture { components, kernels: n + 1 }
    }

    /// A point drawn from one kernel chosen uniformly.
    fn sample(&self, rng: &mut ChaCha8Rng) -> Point {
        let k = ((unit(rng) * self.kernels as f64) as usize).min(self.kernels - 1);
        self.components
            .iter()
            .map(|c| match c {
                Components::Numeric { mus, sigmas, low, high } => truncated_normal(mus[k], sigmas[k], *low, *high, rng),
                Components::Choice { probabilities } => {
                    let row = &probabilities[k];
                    let mut u = unit(rng);
                    let mut pick = row.len() - 1;
                    for (i, w) in row.iter().enumerate() {
                        if u < *w {
                            pick = i;
                            break;
                        }
                        u -= w;
                    }
                    pick as f64
                }
            })
            .collect()
    }

    /// The logarithm of the mixture's density at `x` (log-sum-exp over the kernels).
    fn log_density(&self, x: &Point) -> f64 {
        let per_kernel: Vec<f64> = (0..self.kernels)
            .map(|k| {
                self.components
                    .iter()
                    .zip(x)
                    .map(|(c, &v)| match c {
                        Components::Numeric { mus, sigmas, low, high } => {
                            let (mu, s) = (mus[k], sigmas[k]);
                            let mass = (phi((high - mu) / s) - phi((low - mu) / s)).max(1e-12);
                            let z = (v - mu) / s;
                            -0.5 * z * z - (s * (2.0 * std::f64::consts::PI).sqrt() * mass).ln()
                        }
                        Components::Choice { probabilities } => {
                            probabilities[k].get(v as usize).copied().unwrap_or(0.0).max(f64::MIN_POSITIVE).ln()
                        }
                    })
                    .sum()
            })
            .collect();
        let top = per_kernel.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if !top.is_finite() {
            return f64::MIN;
        }
        top + (per_kernel.iter().map(|l| (l - top).exp()).sum::<f64>() / self.kernels as f64).ln()
    }
}

/// Each observation's width, in the observations' order: the larger gap to its sorted
/// neighbours (the range's ends count as neighbours, except at either end of the sorted list,
/// where the gap to the one beside it is taken, Optuna's `consider_endpoints = False`),
/// clipped to `[span / min(100, 2 + n), span]`.
fn widths(xs: &[f64], low: f64, high: f64) -> Vec<f64> {
    let span = (high - low).max(f64::MIN_POSITIVE);
    let mut order: Vec<usize> = (0..xs.len()).collect();
    order.sort_by(|a, b| xs[*a].total_cmp(&xs[*b]));
    let sorted: Vec<f64> = std::iter::once(low).chain(order.iter().map(|&i| xs[i])).chain([high]).collect();
    let mut gaps: Vec<f64> =
        (1..sorted.len() - 1).map(|i| (sorted[i] - sorted[i - 1]).max(sorted[i + 1] - sorted[i])).collect();
    if sorted.len() >= 4 {
        let last = gaps.len() - 1;
        gaps[0] = sorted[2] - sorted[1];
        gaps[last] = sorted[sorted.len() - 2] - sorted[sorted.len() - 3];
    }
    let narrowest = span / (100.0f64).min(2.0 + xs.len() as f64);
    let mut out = vec![0.0; xs.len()];
    for (rank, &i) in order.iter().enumerate() {
        out[i] = gaps[rank].clamp(narrowest, span);
    }
    out
}

fn truncated_normal(mu: f64, sigma: f64, low: f64, high: f64, rng: &mut ChaCha8Rng) -> f64 {
    for _ in 0..100 {
        // Box-Muller.
        let (u1, u2) = (unit(rng).max(f64::MIN_POSITIVE), unit(rng));
        let x = mu + sigma * (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        if (low..=high).contains(&x) {
            return x;
        }
    }
    mu.clamp(low, high)
}

/// The next trial's values of `params` from the good trials `below` and the rest `above`.
pub(super) fn suggest(
    params: &BTreeMap<String, SweepDistribution>,
    below: &[&Observation],
    above: &[&Observation],
    settings: TpeSettings,
    rng: &mut ChaCha8Rng,
) -> BTreeMap<String, Json> {
    let dists: Vec<&SweepDistribution> = params.values().collect();
    // A trial that lacks a parameter (or holds a value the range cannot) is left out of both.
    let points = |part: &[&Observation]| -> Vec<Point> {
        part.iter()
            .filter_map(|o| params.iter().map(|(k, d)| o.values.get(k).and_then(|v| coordinate(d, v))).collect())
            .collect()
    };
    let (l, g) = (Mixture::new(&dists, &points(below)), Mixture::new(&dists, &points(above)));
    let mut best: Option<(f64, Point)> = None;
    for _ in 0..settings.n_candidates.max(1) {
        let x = l.sample(rng);
        let score = l.log_density(&x) - g.log_density(&x);
        if best.as_ref().is_none_or(|(b, _)| score > *b) {
            best = Some((score, x));
        }
    }
    let point = best.map(|(_, x)| x).unwrap_or_default();
    params
        .iter()
        .zip(point)
        .map(|((key, dist), x)| {
            let value = match dist {
                SweepDistribution::Uniform { low, high } => real(x.clamp(*low, *high)),
                SweepDistribution::LogUniform { low, high } => real(x.exp().clamp(*low, *high)),
                SweepDistribution::IntUniform { low, high } => Json::from((x.round() as i64).clamp(*low, *high)),
                SweepDistribution::Choice { values } => values.get(x as usize).cloned().unwrap_or(Json::Null),
            };
            (key.clone(), value)
        })
        .collect()
}
