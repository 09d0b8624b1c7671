//! A sweep searched by TPE ([`crate::spec::sweep::tpe`]): its random startup trials run first
//! (`--parallel` at a time), then one trial at a time, each drawn from the results of every
//! trial before it with a generator seeded by the sweep seed and the trial's number. A draw
//! depends only on those results, so the same sweep draws the same trials, and a sweep run
//! again finds each drawn trial complete in its folder and skips it.

use super::Sweep;
use super::child::{self, TrialProcess};
use super::driver::{ValidTrial, job, on_event, trial_record, validate_each, write};
use super::results::{self, SweepRecord};
use crate::engine::init::rng;
use crate::exit::RunError;
use crate::prepare::Invocation;
use crate::spec::sweep::TpeSearch;
use crate::spec::sweep::tpe::{Observation, suggest};
use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::AtomicBool;

/// Separates TPE's draws from the sweep seed's other uses.
pub(super) const TPE_DOMAIN: u64 = 0x5357_5054; // "SWPT"

/// Where the trials run.
pub(super) struct At<'a> {
    /// The binary.
    pub exe: &'a Path,
    /// Trials at once (the startup trials only).
    pub parallel: usize,
    /// Set once the sweep is asked to stop.
    pub stop: &'static AtomicBool,
    /// `sweep.json`, rewritten as each trial is drawn.
    pub record_path: &'a Path,
}

/// Runs the startup trials of `sweep` (validated as `checked`), then draws and runs the rest.
pub(super) fn run(
    inv: &Invocation,
    sweep: &mut Sweep,
    search: &TpeSearch,
    at: &At,
    record: &mut SweepRecord,
    mut checked: Vec<ValidTrial>,
    failures: &mut BTreeMap<usize, u8>,
) -> Result<(), RunError> {
    let pending = |sweep: &Sweep, checked: &[ValidTrial], from: usize| -> Vec<TrialProcess> {
        (from..sweep.trials.len())
            .filter(|i| results::completed(&sweep.trial_dir(&sweep.trials[*i]), &checked[*i].sha256).is_none())
            .map(|i| job(inv, sweep, &sweep.trials[i], &checked[i], at.exe, at.parallel, &[]))
            .collect()
    };
    let jobs = pending(sweep, &checked, 0);
    child::run_all(jobs, at.parallel, at.stop, |e| on_event(inv, sweep, &checked, record, failures, e));
    for index in search.startup + 1..=search.trials {
        if crate::signals::received().is_some() {
            break;
        }
        let values = suggest(
            &search.parameters,
            &history(sweep, &checked),
            search.settings,
            &mut rng(&[sweep.seed, TPE_DOMAIN, index as u64]),
        );
        let Some(drawn) = sweep.drawn(index, values.into_iter().collect()) else {
            break;
        };
        sweep.trials.push(drawn);
        checked = validate_each(inv, sweep, &|_| Vec::new(), false)?;
        let drawn = &sweep.trials[index - 1];
        record.trials.push(trial_record(drawn, &checked[index - 1]));
        write(at.record_path, record)?;
        if !inv.quiet {
            println!("[{index}/{}] {}: drawn by TPE: {}", search.trials, drawn.name, drawn.describe());
        }
        let jobs = pending(sweep, &checked, index - 1);
        if jobs.is_empty() && !inv.quiet {
            println!("[{index}/{}] {}: complete, skipped", search.trials, drawn.name);
        }
        // One at a time: the next draw needs this trial's result.
        child::run_all(jobs, 1, at.stop, |e| on_event(inv, sweep, &checked, record, failures, e));
    }
    Ok(())
}

/// Every finished trial's values and metric, as a loss (negated when higher is better).
fn history(sweep: &Sweep, checked: &[ValidTrial]) -> Vec<Observation> {
    let metric = sweep.metric.as_str();
    let sign = if sweep.higher_is_better { -1.0 } else { 1.0 };
    sweep
        .trials
        .iter()
        .zip(checked)
        .filter_map(|(t, c)| {
            let summary = results::completed(&sweep.trial_dir(t), &c.sha256)?;
            let value = results::value_in(&summary, c.evaluates, metric).and_then(Json::as_f64)?;
            let values = t.values.iter().map(|a| (a.key.clone(), a.value.clone())).collect();
            Some(Observation { values, loss: sign * value, stopped_at: None })
        })
        .collect()
}
