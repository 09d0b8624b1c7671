//! Sweeps: `trainrun sweep SPEC` expands the spec's `[sweep]` into trials ([`expand`],
//! pure), validates every trial up front, and runs each as an ordinary run, a child process
//! of this binary, in its own folder under the sweep folder (`run.out_dir`), skipping trials
//! already complete ([`driver`]). It records the sweep in `sweep.json` and ranks the trials in
//! `results.csv`, their timings in `timings.csv` ([`results`]). A cluster's job array runs one trial per index
//! (`--trial I`) into the shared sweep folder and `--collect` ranks what finished ([`array`]). A sweep selects on a validation metric ([`selection`]); with a
//! `[sweep.scheduler]` it trains the trials rung by rung and stops the worst early
//! ([`rungs`], by the rule of [`halving`] or [`median_stopping`]); under `asha` each free slot
//! decides at once and the decisions are recorded for replay ([`asynchronous`], by [`asha`]).
//! Between rungs a paused trial stays resident, waiting to train on in its process
//! ([`resident`], kept by [`child::Residents`]).
//!
//! A child is `trainrun SPEC --set …` told its trial by `TRAINRUN_SWEEP_TRIAL=<n>:<hash>`: it
//! loads the spec as the sweep did, applies trial `n`'s values on top and checks that the
//! result still has the hash the sweep validated.

mod array;
mod asha;
mod asynchronous;
mod child;
pub mod driver;
mod halving;
mod median_stopping;
pub mod resident;
pub mod results;
mod rungs;
pub mod selection;
mod sequential;
mod tracked;

pub use crate::spec::sweep::{Sweep, Trial};
pub use driver::{SweepOptions, SweepPart, run};

use crate::exit::RunError;
use crate::plan::Plan;
use crate::spec::{self, Diagnostic, Loaded, SweepSpec};
use std::path::Path;

pub use crate::prepare::TRIAL_VAR;

/// `trainrun check`'s line about a spec's sweep, or the problems of its `[sweep]` section
/// and of its metric on the base spec's plan (`trainrun sweep --dry-run` also loads and plans
/// every trial). A sweep that selects on the test split is warned about on stderr.
pub fn check_note(loaded: &Loaded, plan: &Plan, section: &SweepSpec) -> Result<String, RunError> {
    let s = match Sweep::new(loaded) {
        Ok(Some(s)) => s,
        Ok(None) => return Ok(format!("  {:<20}  none", "sweep")),
        Err(diags) => return Err(RunError::Spec(spec::render(&diags, &loaded.origins))),
    };
    let evaluates = selection::Evaluated::of(plan, &loaded.spec);
    if let Some(missing) = selection::missing(s.metric, evaluates, &selection::produced(plan, evaluates)) {
        return Err(RunError::Spec(spec::render(&[missing], &loaded.origins)));
    }
    if let Some(warning) = selection::on_test(s.metric) {
        eprint!("{}", spec::render(&[warning], &loaded.origins));
    }
    let order = if s.higher_is_better { "higher is better" } else { "lower is better" };
    let mut ways: Vec<String> = Vec::new();
    if !section.grid.is_empty() {
        ways.push(format!("grid {}", section.grid.keys().cloned().collect::<Vec<_>>().join(" × ")));
    }
    match (&s.tpe, &section.random) {
        (Some(t), _) => ways.push(format!("{} trials drawn by TPE, the first {} at random", t.trials, t.startup)),
        (None, Some(r)) => ways.push(format!("{} random samples", r.samples)),
        (None, None) => {}
    }
    if !section.trials.is_empty() {
        ways.push(format!("{} listed", section.trials.len()));
    }
    if let Some(schedule) = &s.scheduler {
        ways.push(describe(schedule));
    }
    Ok(format!(
        "  {:<20}  {} trials ({}) in {}, ranked by {} ({order}); the plan above is the base spec's: \
         `trainrun sweep --dry-run` lists the trials",
        "sweep",
        s.tpe.as_ref().map_or(s.trials.len(), |t| t.trials),
        ways.join(", "),
        s.dir.display(),
        s.metric.as_str()
    ))
}

/// `successive halving at 1, 3, 9 epochs`, `hyperband in 3 brackets …`.
fn describe(schedule: &crate::spec::sweep::SweepSchedule) -> String {
    use crate::spec::sweep::SchedulerSpec;
    let unit = schedule.unit.as_str();
    let rungs = |g: &crate::spec::sweep::RungGroup| g.rungs.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
    let first = schedule.groups.first().map(rungs).unwrap_or_default();
    match schedule.spec {
        SchedulerSpec::SuccessiveHalving(_) => format!("successive halving at {first} {unit}"),
        SchedulerSpec::Asha(_) => format!("asynchronous successive halving (ASHA) at {first} {unit}"),
        SchedulerSpec::MedianStopping { .. } => format!("median stopping at {first} {unit}"),
        SchedulerSpec::Hyperband(_) => {
            let brackets: Vec<String> =
                schedule.groups.iter().map(|g| format!("{} trials at {}", g.trials.len(), rungs(g))).collect();
            format!("hyperband in {} brackets ({}) {unit}", brackets.len(), brackets.join("; "))
        }
    }
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
