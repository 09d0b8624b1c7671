//! A sweep under synchronous successive halving ([`SchedulerSpec`]): rung by rung, the trials
//! still in train to the rung's epochs (a promoted trial resumes from the backup it kept at
//! the rung before), then the best 1/`reduction_factor` by the sweep's metric go on and the
//! others are stopped. Each rung's summary is kept as `rung-<epochs>.json` in the trial's
//! folder and a stopped trial is marked by `stopped_early.json`, so a sweep driver that dies
//! resumes where it was: finished rungs are read back, never trained again. Every decision
//! and the values it saw go to `decisions.jsonl`; they depend only on the results, so the
//! same sweep decides the same every time.

use super::driver::{Rungs, ValidTrial, job, on_event, validate};
use super::results::{self, STOPPED_EARLY, SweepRecord};
use super::{Sweep, child};
use crate::exit::RunError;
use crate::prepare::Invocation;
use serde_json::{Value as Json, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Runs the rungs of `sweep`; `checked` are its trials at the last rung (their full spec).
pub(super) fn run(
    inv: &Invocation,
    sweep: &Sweep,
    rungs: &Rungs,
    checked: &[ValidTrial],
    record: &SweepRecord,
    failures: &mut BTreeMap<usize, u8>,
) -> Result<(), RunError> {
    let each = every_rung(inv, sweep, rungs, checked)?;
    let metric = sweep.metric.as_str();
    let mut alive: Vec<usize> = (1..=sweep.trials.len()).collect();
    let mut decisions = String::new();
    for (k, (&epochs, rung)) in rungs.epochs.iter().zip(&each).enumerate() {
        let last = k + 1 == rungs.epochs.len();
        let todo: Vec<usize> =
            alive.iter().copied().filter(|i| at_rung(sweep, *i, epochs, &rung[*i - 1], last).is_none()).collect();
        if !inv.quiet {
            println!(
                "rung {} of {}: {} epochs, {} trials, {} to train",
                k + 1,
                rungs.epochs.len(),
                epochs,
                alive.len(),
                todo.len()
            );
        }
        let sets = sweep.rung_sets(Some(epochs));
        let jobs = todo
            .iter()
            .map(|i| job(inv, sweep, &sweep.trials[*i - 1], &rung[*i - 1], rungs.exe, rungs.parallel, &sets))
            .collect();
        child::run_all(jobs, rungs.parallel, rungs.stop, |event| on_event(inv, sweep, rung, record, failures, event));
        if crate::signals::received().is_some() || last {
            break;
        }
        let mut seen: Vec<(usize, f64)> = Vec::new();
        for &i in &alive {
            let value = at_rung(sweep, i, epochs, &rung[i - 1], false)
                .and_then(|s| results::value_in(&s, rung[i - 1].evaluates, metric).and_then(Json::as_f64));
            if let Some(v) = value {
                seen.push((i, v));
            }
        }
        seen.sort_by(|a, b| {
            let order = if sweep.higher_is_better { b.1.total_cmp(&a.1) } else { a.1.total_cmp(&b.1) };
            order.then(a.0.cmp(&b.0))
        });
        let keep = rungs.scheduler.keep(alive.len()).min(seen.len());
        let mut promoted: Vec<usize> = seen[..keep].iter().map(|(i, _)| *i).collect();
        promoted.sort_unstable();
        let stopped: Vec<usize> = seen[keep..].iter().map(|(i, _)| *i).collect();
        for &i in &promoted {
            let _ = std::fs::remove_file(dir(sweep, i).join(STOPPED_EARLY));
        }
        for &i in &stopped {
            mark_stopped(sweep, i, k + 1, epochs, &rung[i - 1])?;
        }
        let line = json!({
            "rung": k + 1,
            "epochs": epochs,
            "metric": metric,
            "seen": seen.iter().map(|(i, v)| json!({ "trial": i, "value": v })).collect::<Vec<_>>(),
            "promoted": promoted,
            "stopped": stopped,
        });
        decisions.push_str(&line.to_string());
        decisions.push('\n');
        if !inv.quiet {
            println!(
                "rung {}: {} of {} go on to the next rung: trials {:?}",
                k + 1,
                promoted.len(),
                alive.len(),
                promoted
            );
        }
        alive = promoted;
    }
    let path = sweep.dir.join("decisions.jsonl");
    std::fs::write(&path, decisions).map_err(|e| RunError::Failure(format!("cannot write {}: {e}", path.display())))
}

/// Every trial validated at every rung but the last (which is `checked`): the hashes tell a
/// rung that is done, and a rung must change nothing but the epochs a trial trains.
fn every_rung(
    inv: &Invocation,
    sweep: &Sweep,
    rungs: &Rungs,
    checked: &[ValidTrial],
) -> Result<Vec<Vec<ValidTrial>>, RunError> {
    if let Some(t) = checked.iter().position(|c| !c.keeps_backup) {
        return Err(RunError::Usage(format!(
            "trial {} ({}) keeps no backup, and successive halving pauses a trial at a rung by its backup: add \
             `[[callbacks]]` with `kind = \"backup_and_restore\"` and `delete_checkpoint = false` to the spec",
            t + 1,
            sweep.trials[t].name
        )));
    }
    let mut each = Vec::with_capacity(rungs.epochs.len());
    for &epochs in &rungs.epochs[..rungs.epochs.len() - 1] {
        let rung = validate(inv, sweep, &sweep.rung_sets(Some(epochs)), false)?;
        if let Some(t) = rung.iter().zip(checked).position(|(r, c)| r.learning_rate != c.learning_rate) {
            return Err(RunError::Usage(format!(
                "trial {} ({}) has a learning rate that depends on train.epochs, so a trial paused at a rung of \
                 {epochs} epochs would not continue as one trained without pause: give its schedule fixed steps \
                 (e.g. optimizer.schedule.decay_steps) or sweep without a scheduler",
                t + 1,
                sweep.trials[t].name
            )));
        }
        each.push(rung);
    }
    each.push(validate(inv, sweep, &sweep.rung_sets(None), false)?);
    Ok(each)
}

fn dir(sweep: &Sweep, index: usize) -> PathBuf {
    sweep.trial_dir(&sweep.trials[index - 1])
}

fn rung_file(dir: &Path, epochs: u64) -> PathBuf {
    dir.join(format!("rung-{epochs}.json"))
}

/// Trial `index`'s summary at the rung of `epochs` if it finished it: its kept rung file,
/// else its `summary.json` of that rung (kept now); the last rung's is `summary.json`.
fn at_rung(sweep: &Sweep, index: usize, epochs: u64, rung: &ValidTrial, last: bool) -> Option<Json> {
    let dir = dir(sweep, index);
    if last {
        return results::completed(&dir, &rung.sha256);
    }
    if let Some(kept) = results::summary_of(&rung_file(&dir, epochs), &rung.sha256) {
        return Some(kept);
    }
    let summary = results::completed(&dir, &rung.sha256)?;
    let _ = crate::train::run_dir::write_json(&rung_file(&dir, epochs), &summary);
    Some(summary)
}

fn mark_stopped(sweep: &Sweep, index: usize, rung: usize, epochs: u64, at: &ValidTrial) -> Result<(), RunError> {
    let summary = at_rung(sweep, index, epochs, at, false).unwrap_or(Json::Null);
    let path = dir(sweep, index).join(STOPPED_EARLY);
    let marker = json!({ "rung": rung, "epochs": epochs, "summary": summary });
    crate::train::run_dir::write_json(&path, &marker).map_err(|e| RunError::Failure(e.to_string()))
}
