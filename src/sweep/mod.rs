//! Sweeps: `trainrun sweep SPEC` expands the spec's `[sweep]` into trials ([`expand`],
//! pure), validates every trial up front, and runs each as an ordinary run, a child process
//! of this binary, in its own folder under the sweep folder (`run.out_dir`), skipping trials
//! already complete ([`driver`]). It records the sweep in `sweep.json` and ranks the trials in
//! `results.csv` ([`results`]).
//!
//! A child is `trainrun SPEC --set …` told its trial by `TRAINRUN_SWEEP_TRIAL=<n>:<hash>`: it
//! loads the spec as the sweep did, applies trial `n`'s values on top and checks that the
//! result still has the hash the sweep validated.

mod child;
pub mod driver;
pub mod expand;
pub mod results;

pub use driver::{SweepOptions, run};
pub use expand::{Trial, expand};

use crate::run::{Invocation, RunError};
use crate::spec::{self, Assignment, Diagnostic, Loaded, SweepMetric, SweepSpec};
use crate::train::run_record::TrialOrigin;
use std::path::{Path, PathBuf};

/// The environment variable that makes `trainrun SPEC` run one trial of SPEC's sweep.
pub const TRIAL_VAR: &str = "TRAINRUN_SWEEP_TRIAL";

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
}

impl Sweep {
    /// The sweep of a loaded spec (`None` without `[sweep]`), or the problems of its section.
    pub fn new(loaded: &Loaded) -> Result<Option<Sweep>, Vec<Diagnostic>> {
        let Some(section) = &loaded.spec.sweep else {
            return Ok(None);
        };
        let run = &loaded.spec.run;
        let name = run.name.clone().unwrap_or_else(|| "sweep".to_string());
        let seed = section.seed.unwrap_or(run.seed);
        Ok(Some(Sweep {
            dir: run.out_dir.clone().unwrap_or_else(|| PathBuf::from("runs").join(&name)),
            name,
            metric: section.metric,
            higher_is_better: section.metric.higher_is_better(section.mode),
            seed,
            trials: expand(section, seed)?,
        }))
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

/// The trial a child process is asked to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WantedTrial {
    /// 1-based trial number.
    pub index: usize,
    /// The hash its resolved spec had when the sweep validated it.
    pub sha256: Option<String>,
}

/// `TRAINRUN_SWEEP_TRIAL` (`3` or `3:<hash>`), if set.
pub fn trial_from_env(env: &[(String, String)]) -> Result<Option<WantedTrial>, RunError> {
    let Some((_, value)) = env.iter().find(|(k, v)| k == TRIAL_VAR && !v.is_empty()) else {
        return Ok(None);
    };
    let (index, sha256) = match value.split_once(':') {
        Some((i, h)) => (i, Some(h.to_string())),
        None => (value.as_str(), None),
    };
    match index.trim().parse::<usize>() {
        Ok(index) if index > 0 => Ok(Some(WantedTrial { index, sha256 })),
        _ => Err(RunError::Usage(format!(
            "{TRIAL_VAR}={value} does not name a trial: `trainrun sweep` sets it to a trial number, e.g. 3"
        ))),
    }
}

/// What a trial run records about its sweep.
#[derive(Debug, Clone)]
pub struct TrialRun {
    /// Which trial, with its values.
    pub origin: TrialOrigin,
    /// The sweep seed.
    pub sweep_seed: u64,
}

/// Loads trial `wanted` of the sweep in `base` (loaded from `inv`).
pub fn load_trial(inv: &Invocation, base: &Loaded, wanted: &WantedTrial) -> Result<(Loaded, TrialRun), RunError> {
    let sweep = match Sweep::new(base) {
        Ok(Some(sweep)) => sweep,
        Ok(None) => {
            return Err(RunError::Usage(format!(
                "{TRIAL_VAR} names a sweep trial, but {} has no [sweep] section; unset {TRIAL_VAR}",
                inv.spec.display()
            )));
        }
        Err(diags) => return Err(RunError::Spec(spec::render(&diags, &base.origins))),
    };
    let Some(trial) = sweep.trials.get(wanted.index - 1) else {
        return Err(RunError::Usage(format!(
            "{TRIAL_VAR}={} is past the last of the {} trials of {}",
            wanted.index,
            sweep.trials.len(),
            inv.spec.display()
        )));
    };
    let loaded = spec::load_trial(&inv.spec, &inv.env, &inv.sets, &sweep.assignments(trial))
        .map_err(|e| RunError::Spec(e.to_string()))?;
    if let Some(expected) = &wanted.sha256
        && *expected != loaded.spec.results_sha256()
    {
        return Err(RunError::Usage(format!(
            "trial {} of {} is not the trial the sweep validated: the spec changed since the sweep \
             started; run `trainrun sweep {}` again",
            trial.index,
            inv.spec.display(),
            inv.spec.display()
        )));
    }
    let origin = TrialOrigin {
        trial: trial.index,
        name: trial.name.clone(),
        values: trial.values.iter().map(|a| (a.key.clone(), a.value.clone())).collect(),
    };
    Ok((loaded, TrialRun { origin, sweep_seed: sweep.seed }))
}

/// `trainrun check`'s line about a spec's sweep, or the problems of its `[sweep]` section
/// (`trainrun sweep --dry-run` also loads and plans every trial).
pub fn check_note(loaded: &Loaded, section: &SweepSpec) -> Result<String, RunError> {
    let s = match Sweep::new(loaded) {
        Ok(Some(s)) => s,
        Ok(None) => return Ok(format!("  {:<20}  none", "sweep")),
        Err(diags) => return Err(RunError::Spec(spec::render(&diags, &loaded.origins))),
    };
    let order = if s.higher_is_better { "higher is better" } else { "lower is better" };
    let mut ways: Vec<String> = Vec::new();
    if !section.grid.is_empty() {
        ways.push(format!("grid {}", section.grid.keys().cloned().collect::<Vec<_>>().join(" × ")));
    }
    if let Some(r) = &section.random {
        ways.push(format!("{} random samples", r.samples));
    }
    if !section.trials.is_empty() {
        ways.push(format!("{} listed", section.trials.len()));
    }
    Ok(format!(
        "  {:<20}  {} trials ({}) in {}, ranked by {} ({order}); the plan above is the base spec's: \
         `trainrun sweep --dry-run` lists the trials",
        "sweep",
        s.trials.len(),
        ways.join(", "),
        s.dir.display(),
        s.metric.as_str()
    ))
}

/// The error for `trainrun SPEC` on a spec with a `[sweep]`: which command to use instead.
pub fn not_a_run(path: &Path, loaded: &Loaded) -> RunError {
    let path = path.display();
    let diag = Diagnostic::error(
        "sweep",
        format!("{path} has a [sweep] section: `trainrun SPEC` trains one run, `trainrun sweep SPEC` the trials"),
    )
    .help(format!(
        "run `trainrun sweep {path}` (`--dry-run` lists the trials); to train the base spec alone, \
         move it to a file of its own that the sweep spec `extends`"
    ));
    RunError::Spec(spec::render(&[diag], &loaded.origins))
}
