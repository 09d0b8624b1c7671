//! Expanding a `[sweep]` into its trials, purely: each random sample crossed with the grid's
//! cartesian product, then the explicit trials; each with a readable, stable folder name and
//! a seed derived from the sweep seed and the trial's values.

use crate::engine::init::{derive_seed, rng};
use crate::spec::{Assignment, Diagnostic, SweepDistribution, SweepSpec};
use rand::Rng;
use serde_json::Value as Json;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// Separates the sweep's random draws and trial seeds from the run seed's other uses.
const RANDOM_DOMAIN: u64 = 0x5357_5052; // "SWPR"
const SEED_DOMAIN: u64 = 0x5357_5053; // "SWPS"

/// Keys the sweep sets itself for every trial.
const RESERVED: [&str; 2] = ["run.out_dir", "run.name"];

/// Folder names stop growing here (the trial number keeps them unique).
const MAX_NAME: usize = 72;

/// One trial of a sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct Trial {
    /// 1-based position in the sweep.
    pub index: usize,
    /// Its folder's name: `trial-003-batch64-lr0.01`.
    pub name: String,
    /// The values it sets, in key order, each with where the sweep gives it.
    pub values: Vec<Assignment>,
    /// Its run seed: `run.seed` when the trial sets it, else derived from the sweep seed and
    /// the trial's values.
    pub seed: u64,
}

impl Trial {
    /// `batch.global = 64, optimizer.learning_rate = 0.01`.
    pub fn describe(&self) -> String {
        let parts: Vec<String> = self.values.iter().map(|a| format!("{} = {}", a.key, a.value)).collect();
        if parts.is_empty() { "(the base spec)".to_string() } else { parts.join(", ") }
    }
}

/// Every trial of `sweep`, whose seed is `seed` (`sweep.seed`, else `run.seed`), or every
/// problem of the `[sweep]` section (keys are spec paths, for located diagnostics).
pub fn expand(sweep: &SweepSpec, seed: u64) -> Result<Vec<Trial>, Vec<Diagnostic>> {
    let problems = check(sweep);
    if !problems.is_empty() {
        return Err(problems);
    }
    let mut combos: Vec<Vec<Assignment>> = Vec::new();
    if !sweep.grid.is_empty() || sweep.random.is_some() {
        // Samples outermost: drawing more samples appends trials and keeps the numbers (and
        // so the folders) of the earlier ones.
        let points = grid(sweep);
        for sample in samples(sweep, seed) {
            for point in &points {
                let mut values = point.clone();
                values.extend(sample.iter().cloned());
                combos.push(values);
            }
        }
    }
    for (t, trial) in sweep.trials.iter().enumerate() {
        let values = trial
            .iter()
            .map(|(key, value)| Assignment {
                key: key.clone(),
                value: value.clone(),
                source: format!("sweep.trials[{t}].{}", quote(key)),
            })
            .collect();
        combos.push(values);
    }
    Ok(combos.into_iter().enumerate().map(|(i, values)| trial(i + 1, values, seed)).collect())
}

/// Trial `index` of a sweep whose seed is `seed`, setting `values`.
pub fn trial(index: usize, mut values: Vec<Assignment>, seed: u64) -> Trial {
    values.sort_by(|a, b| a.key.cmp(&b.key));
    let seed = trial_seed(seed, &values);
    Trial { index, name: folder_name(index, &values), values, seed }
}

fn check(sweep: &SweepSpec) -> Vec<Diagnostic> {
    let mut problems = Vec::new();
    if sweep.grid.is_empty() && sweep.random.is_none() && sweep.trials.is_empty() {
        problems.push(
            Diagnostic::error("sweep", "the sweep has no trials")
                .help("add `[sweep.grid]` values, `[sweep.random]` parameters or `[[sweep.trials]]`"),
        );
    }
    let mut keyed: Vec<(&String, String)> =
        sweep.grid.keys().map(|k| (k, format!("sweep.grid.{}", quote(k)))).collect();
    if let Some(random) = &sweep.random {
        keyed.extend(random.parameters.keys().map(|k| (k, format!("sweep.random.parameters.{}", quote(k)))));
    }
    for (t, trial) in sweep.trials.iter().enumerate() {
        keyed.extend(trial.keys().map(|k| (k, format!("sweep.trials[{t}].{}", quote(k)))));
    }
    for (key, at) in keyed {
        let normalized: String = key.chars().filter(|c| !c.is_whitespace()).collect();
        if sweep.scheduler.is_some() && normalized == "train.epochs" {
            problems.push(
                Diagnostic::error(at.clone(), format!("a sweep with a scheduler cannot set `{key}`"))
                    .help("the scheduler sets each rung's epochs; sweep.scheduler.max sets the last rung's"),
            );
        }
        if normalized == "train.stop_at_step" {
            problems.push(Diagnostic::error(at.clone(), format!("a sweep cannot set `{key}`")).help(
                "every trial trains to its end; to stop trials early, add [sweep.scheduler] (its rungs pause them)",
            ));
        }
        if RESERVED.contains(&normalized.as_str()) || normalized.starts_with("sweep") || normalized == "extends" {
            problems.push(
                Diagnostic::error(at, format!("a sweep cannot set `{key}`"))
                    .help("the sweep names each trial's folder (`run.out_dir`) and run (`run.name`) itself"),
            );
        }
    }
    if let Some(random) = &sweep.random {
        for (key, dist) in &random.parameters {
            let at = format!("sweep.random.parameters.{}", quote(key));
            if sweep.grid.contains_key(key) {
                problems.push(
                    Diagnostic::error(&at, format!("`{key}` is both in sweep.grid and sweep.random"))
                        .help("sweep each key one way: drop it from one of the two"),
                );
            }
            let bad = match dist {
                SweepDistribution::Uniform { low, high } if low.partial_cmp(high) != Some(std::cmp::Ordering::Less) => {
                    Some(format!("low = {low} ≥ high = {high}"))
                }
                SweepDistribution::LogUniform { low, high } if !(*low > 0.0 && low < high) => {
                    Some(format!("needs 0 < low < high, found low = {low}, high = {high}"))
                }
                SweepDistribution::IntUniform { low, high } if low > high => {
                    Some(format!("low = {low} > high = {high}"))
                }
                _ => None,
            };
            if let Some(why) = bad {
                problems.push(
                    Diagnostic::error(format!("{at}.high"), format!("the distribution of `{key}` is empty: {why}"))
                        .help("give a range with low below high"),
                );
            }
        }
    }
    problems
}

/// The grid's points in order: keys sorted, the last key varying fastest. One empty point
/// when there is no grid, so random samples stand alone.
fn grid(sweep: &SweepSpec) -> Vec<Vec<Assignment>> {
    let mut points: Vec<Vec<Assignment>> = vec![Vec::new()];
    for (key, values) in &sweep.grid {
        let mut next = Vec::with_capacity(points.len() * values.0.len());
        for point in &points {
            for (i, value) in values.0.iter().enumerate() {
                let mut p = point.clone();
                p.push(Assignment {
                    key: key.clone(),
                    value: value.clone(),
                    source: format!("sweep.grid.{}[{i}]", quote(key)),
                });
                next.push(p);
            }
        }
        points = next;
    }
    points
}

/// The random samples, drawn in order (sample by sample, keys sorted) from a generator seeded
/// by the sweep seed. One empty sample when there is no `[sweep.random]`.
fn samples(sweep: &SweepSpec, seed: u64) -> Vec<Vec<Assignment>> {
    let Some(random) = &sweep.random else {
        return vec![Vec::new()];
    };
    let mut g = rng(&[seed, RANDOM_DOMAIN]);
    (0..random.samples.get())
        .map(|_| {
            random
                .parameters
                .iter()
                .map(|(key, dist)| Assignment {
                    key: key.clone(),
                    value: draw(dist, g.next_u64()),
                    source: format!("sweep.random.parameters.{}", quote(key)),
                })
                .collect()
        })
        .collect()
}

/// One value of `dist` from the random word `bits`.
pub(super) fn draw(dist: &SweepDistribution, bits: u64) -> Json {
    // 53 random bits as a float in [0, 1), the same on every platform.
    let u = (bits >> 11) as f64 / (1u64 << 53) as f64;
    match dist {
        SweepDistribution::Uniform { low, high } => real(low + u * (high - low)),
        SweepDistribution::LogUniform { low, high } => real((low.ln() + u * (high.ln() - low.ln())).exp()),
        SweepDistribution::IntUniform { low, high } => {
            let span = (*high as i128 - *low as i128 + 1) as f64;
            let offset = ((u * span) as i128).min(*high as i128 - *low as i128);
            Json::from((*low as i128 + offset) as i64)
        }
        SweepDistribution::Choice { values } => {
            let i = ((u * values.len() as f64) as usize).min(values.len().saturating_sub(1));
            values.get(i).cloned().unwrap_or(Json::Null)
        }
    }
}

/// `x` rounded to 4 significant digits.
pub(super) fn real(x: f64) -> Json {
    let rounded = format!("{x:.3e}").parse::<f64>().unwrap_or(x);
    serde_json::Number::from_f64(rounded).map_or(Json::Null, Json::Number)
}

/// The trial's `run.seed`: its own when it sets one, else a 32-bit seed derived from the sweep
/// seed and its values (32 bits read well in tables and fit every TOML and JSON reader).
fn trial_seed(seed: u64, values: &[Assignment]) -> u64 {
    if let Some(own) = values.iter().find(|a| a.key.trim() == "run.seed").and_then(|a| a.value.as_u64()) {
        return own;
    }
    let mut text = String::new();
    for a in values {
        text.push_str(&format!("{}={}\n", a.key, a.value));
    }
    let digest = Sha256::digest(text.as_bytes());
    let mut word = [0u8; 8];
    word.copy_from_slice(&digest[..8]);
    derive_seed(&[seed, SEED_DOMAIN, u64::from_le_bytes(word)]) & 0xFFFF_FFFF
}

/// `trial-003-batch64-lr0.01`: the number, then each value after a short name for its key.
fn folder_name(index: usize, values: &[Assignment]) -> String {
    let shorts: Vec<String> = values.iter().map(|a| short_key(&a.key)).collect();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for s in &shorts {
        *counts.entry(s.as_str()).or_default() += 1;
    }
    let mut name = format!("trial-{index:03}");
    for (a, short) in values.iter().zip(&shorts) {
        // Two keys with one short name (`model.layers[1].units`, `model.layers[2].units`)
        // spell out their whole paths.
        let key = if counts.get(short.as_str()).copied().unwrap_or(0) > 1 { sanitize(&a.key) } else { short.clone() };
        name.push('-');
        name.push_str(&key);
        name.push_str(&sanitize(&value_text(&a.value)));
    }
    if name.len() > MAX_NAME {
        name.truncate(MAX_NAME);
        name = name.trim_end_matches(['-', '.', '_']).to_string();
    }
    name
}

fn short_key(key: &str) -> String {
    match key.trim() {
        "optimizer.learning_rate" => "lr".to_string(),
        "batch.global" => "batch".to_string(),
        "optimizer.weight_decay" => "wd".to_string(),
        other => {
            let last = other.rsplit('.').next().unwrap_or(other);
            sanitize(last.split('[').next().unwrap_or(last).trim_matches('"'))
        }
    }
}

/// A value as it reads in names and tables: numbers and words bare, the rest as JSON.
pub fn value_text(value: &Json) -> String {
    match value {
        Json::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Keeps characters that are safe in folder names everywhere.
fn sanitize(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '+' | '-') { c } else { '_' })
        .collect()
}

/// A key as it appears in a spec key path: quoted unless bare.
pub(crate) fn quote(key: &str) -> String {
    if !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        key.to_string()
    } else {
        format!("{key:?}")
    }
}

#[cfg(test)]
#[path = "expand_tests.rs"]
mod tests;
