//! A sweep under a scheduler ([`SweepSchedule`]), synchronously: group by group (all trials, or
//! one Hyperband bracket), rung by rung, the trials still in train to the rung (a promoted
//! trial resumes from the backup it kept at the rung before), then the scheduler's rule
//! ([`halving`], [`median_stopping`]) decides who goes on. Each rung's summary is kept as
//! `rung-<epochs>.json` in the trial's folder and a stopped trial is marked by
//! `stopped_early.json`, so a sweep driver that dies resumes where it was: finished rungs are
//! read back, never trained again. Every decision and the values it saw go to
//! `decisions.jsonl`; they depend only on the results, so the same sweep decides the same
//! every time.
//!
//! Rungs in steps become each trial's epochs (`steps ÷ train.steps_per_epoch`): a trial
//! pauses at an epoch's end, where its backup and summary are written, so a rung that is not
//! a whole number of a trial's epochs is refused before anything runs.

use super::child::{self, Residents};
use super::driver::{Rungs, ValidTrial, job, on_event, validate_each};
use super::results::{self, STOPPED_EARLY, SweepRecord};
use super::{Sweep, Trial, halving, median_stopping};
use crate::exit::RunError;
use crate::prepare::Invocation;
use crate::spec::sweep::{Rule, RungGroup, RungUnit, SweepSchedule};
use serde_json::{Value as Json, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What a rule decided at a rung.
pub(super) struct Decision {
    /// Trials that go on, in order.
    pub promoted: Vec<usize>,
    /// Trials stopped here.
    pub stopped: Vec<usize>,
    /// The values it saw, one object per trial, as `decisions.jsonl` records them.
    pub seen: Vec<Json>,
}

/// Trials at the last rung of `schedule` (their full spec), validated; rungs in steps are
/// checked to be whole epochs of every trial first.
pub(super) fn checked(inv: &Invocation, sweep: &Sweep, schedule: &SweepSchedule) -> Result<Vec<ValidTrial>, RunError> {
    match schedule.unit {
        RungUnit::Epochs => validate_each(inv, sweep, &|_| epochs_set(schedule.max), true),
        RungUnit::Steps => {
            let base = validate_each(inv, sweep, &|_| Vec::new(), true)?;
            let steps: Vec<u64> = base.iter().map(|c| c.steps_per_epoch).collect();
            whole_epochs(sweep, schedule, &steps)?;
            validate_each(inv, sweep, &|t| epochs_set(schedule.max / steps[t.index - 1]), false)
        }
    }
}

/// Runs the groups of `rungs.schedule`; `checked` are the trials at the last rung.
pub(super) fn run(
    inv: &Invocation,
    sweep: &Sweep,
    rungs: &Rungs,
    checked: &[ValidTrial],
    record: &SweepRecord,
    failures: &mut BTreeMap<usize, u8>,
) -> Result<(), RunError> {
    let each = every_rung(inv, sweep, rungs.schedule, checked)?;
    let sweeping = Sweeping { inv, sweep, rungs, checked, each: &each, record };
    let mut decisions = String::new();
    let mut residents = Residents::of(sweep, &inv.env);
    for group in &rungs.schedule.groups {
        if run_group(&sweeping, group, failures, &mut residents, &mut decisions)? {
            break;
        }
    }
    drop(residents);
    let path = sweep.dir.join("decisions.jsonl");
    std::fs::write(&path, decisions).map_err(|e| RunError::Failure(format!("cannot write {}: {e}", path.display())))
}

/// What every group of a scheduled sweep trains with.
struct Sweeping<'a> {
    inv: &'a Invocation,
    sweep: &'a Sweep,
    rungs: &'a Rungs<'a>,
    /// The trials at the last rung.
    checked: &'a [ValidTrial],
    /// The trials at each rung below the last.
    each: &'a BTreeMap<u64, Vec<ValidTrial>>,
    record: &'a SweepRecord,
}

/// Trains `group` rung by rung, adding its decisions to `decisions`; `true` when the sweep
/// was asked to stop.
fn run_group(
    s: &Sweeping,
    group: &RungGroup,
    failures: &mut BTreeMap<usize, u8>,
    residents: &mut Residents,
    decisions: &mut String,
) -> Result<bool, RunError> {
    let Sweeping { inv, sweep, rungs, checked, each, record } = *s;
    let schedule = rungs.schedule;
    let unit = schedule.unit.as_str();
    let metric = sweep.metric.as_str();
    let epochs = |i: usize, u: u64| epochs_at(schedule.unit, checked[i - 1].steps_per_epoch, u);
    let bracket = group.bracket.map(|s| format!("bracket {s}, ")).unwrap_or_default();
    let mut alive = group.trials.clone();
    let mut history: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    for (k, &u) in group.rungs.iter().enumerate() {
        let last = k + 1 == group.rungs.len();
        let at: &[ValidTrial] = if u == schedule.max { checked } else { each.get(&u).map_or(checked, Vec::as_slice) };
        let todo: Vec<usize> =
            alive.iter().copied().filter(|i| at_rung(sweep, *i, epochs(*i, u), &at[*i - 1], last).is_none()).collect();
        if !inv.quiet {
            let (n, len) = (alive.len(), todo.len());
            println!("{bracket}rung {} of {}: {u} {unit}, {n} trials, {len} to train", k + 1, group.rungs.len());
        }
        let jobs = todo
            .iter()
            .map(|i| {
                let trial = &sweep.trials[*i - 1];
                let mut process =
                    job(inv, sweep, trial, &at[*i - 1], rungs.exe, rungs.parallel, &epochs_set(epochs(*i, u)));
                // Below the last rung a trial may go on: it waits resident for that.
                process.stays = (!last).then_some(at[*i - 1].evaluates);
                process
            })
            .collect();
        let on = |event| on_event(inv, sweep, at, record, failures, event);
        child::run_all_resident(jobs, rungs.parallel, rungs.stop, residents, on);
        if crate::signals::received().is_some() {
            return Ok(true);
        }
        if last {
            break;
        }
        let mut seen: Vec<(usize, f64)> = Vec::new();
        for &i in &alive {
            let value = at_rung(sweep, i, epochs(i, u), &at[i - 1], false)
                .and_then(|s| results::value_in(&s, at[i - 1].evaluates, metric).and_then(Json::as_f64));
            if let Some(v) = value {
                seen.push((i, v));
                history.entry(i).or_default().push(v);
            }
        }
        let decision = match schedule.rule {
            Rule::Halving { .. } => halving::decide(&seen, schedule.rule.keep(alive.len()), sweep.higher_is_better),
            Rule::Median { min_samples } => {
                median_stopping::decide(&seen, &history, min_samples, sweep.higher_is_better)
            }
        };
        for &i in &decision.promoted {
            let _ = std::fs::remove_file(dir(sweep, i).join(STOPPED_EARLY));
        }
        for &i in &decision.stopped {
            residents.release(i);
            let marker = json!({ "rung": k + 1, "epochs": epochs(i, u), unit: u, "bracket": group.bracket });
            mark_stopped(sweep, i, marker, &at[i - 1])?;
        }
        let mut line = json!({ "rung": k + 1, unit: u, "metric": metric });
        if let (Some(s), Some(map)) = (group.bracket, line.as_object_mut()) {
            map.insert("bracket".into(), s.into());
        }
        if let Some(map) = line.as_object_mut() {
            map.insert("seen".into(), decision.seen.into());
            map.insert("promoted".into(), json!(decision.promoted));
            map.insert("stopped".into(), json!(decision.stopped));
        }
        decisions.push_str(&line.to_string());
        decisions.push('\n');
        if !inv.quiet {
            let (n, promoted) = (alive.len(), &decision.promoted);
            println!("{bracket}rung {}: {} of {n} go on to the next rung: trials {promoted:?}", k + 1, promoted.len());
        }
        alive = decision.promoted;
    }
    Ok(false)
}

/// The epochs that train a trial of `steps_per_epoch` to rung `u`.
pub(super) fn epochs_at(unit: RungUnit, steps_per_epoch: u64, u: u64) -> u64 {
    match unit {
        RungUnit::Epochs => u,
        RungUnit::Steps => u / steps_per_epoch.max(1),
    }
}

pub(super) fn epochs_set(epochs: u64) -> Vec<String> {
    vec![format!("train.epochs={epochs}")]
}

/// Refuses rungs in steps that are not whole epochs of a trial, naming every such trial.
fn whole_epochs(sweep: &Sweep, schedule: &SweepSchedule, steps_per_epoch: &[u64]) -> Result<(), RunError> {
    let mut problems = Vec::new();
    for group in &schedule.groups {
        for &i in &group.trials {
            let per = steps_per_epoch[i - 1].max(1);
            let bad: Vec<String> = group.rungs.iter().filter(|u| *u % per != 0).map(u64::to_string).collect();
            if !bad.is_empty() {
                let trial: &Trial = &sweep.trials[i - 1];
                problems.push(format!(
                    "trial {i} ({}) trains {per} steps an epoch and pauses at an epoch's end, but its rungs at {} \
                     steps are not whole epochs",
                    trial.name,
                    bad.join(", ")
                ));
            }
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    let rungs: Vec<String> = schedule.groups.iter().map(|g| format!("{:?}", g.rungs)).collect();
    Err(RunError::Usage(format!(
        "sweep.scheduler: unit = \"steps\" with rungs {} steps:\n  {}\n  help: make sweep.scheduler.grace and max \
         (and interval) multiples of every trial's train.steps_per_epoch, or set train.steps_per_epoch to a common \
         divisor of the rungs; or use unit = \"epochs\"",
        rungs.join(", "),
        problems.join("\n  ")
    )))
}

/// Every trial validated at every rung below the last (the last is `checked`), keyed by the
/// rung: the hashes tell a rung that is done, and a rung must change nothing but the epochs a
/// trial trains. A trial whose group has no such rung is validated as at the last.
pub(super) fn every_rung(
    inv: &Invocation,
    sweep: &Sweep,
    schedule: &SweepSchedule,
    checked: &[ValidTrial],
) -> Result<BTreeMap<u64, Vec<ValidTrial>>, RunError> {
    if let Some(t) = checked.iter().position(|c| !c.keeps_backup) {
        return Err(RunError::Usage(format!(
            "trial {} ({}) keeps no backup, and a scheduler pauses a trial at a rung by its backup: add \
             `[[callbacks]]` with `kind = \"backup_and_restore\"` and `delete_checkpoint = false` to the spec",
            t + 1,
            sweep.trials[t].name
        )));
    }
    let mut group_of = vec![0; sweep.trials.len()];
    for (g, group) in schedule.groups.iter().enumerate() {
        for &i in &group.trials {
            group_of[i - 1] = g;
        }
    }
    let below: std::collections::BTreeSet<u64> =
        schedule.groups.iter().flat_map(|g| g.rungs.iter().copied()).filter(|u| *u != schedule.max).collect();
    let mut each = BTreeMap::new();
    for u in below {
        let has = |t: &Trial| schedule.groups[group_of[t.index - 1]].rungs.contains(&u);
        let epochs = |t: &Trial| {
            let c = &checked[t.index - 1];
            epochs_at(schedule.unit, c.steps_per_epoch, if has(t) { u } else { schedule.max })
        };
        let rung = validate_each(inv, sweep, &|t| epochs_set(epochs(t)), false)?;
        let moved = rung.iter().zip(checked).zip(&sweep.trials).find(|((r, c), _)| r.learning_rate != c.learning_rate);
        if let Some((_, trial)) = moved {
            return Err(RunError::Usage(format!(
                "trial {} ({}) has a learning rate that depends on train.epochs, so a trial paused at a rung of \
                 {} epochs would not continue as one trained without pause: give its schedule fixed steps \
                 (e.g. optimizer.schedule.decay_steps) or sweep without a scheduler",
                trial.index,
                trial.name,
                epochs(trial)
            )));
        }
        each.insert(u, rung);
    }
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
pub(super) fn at_rung(sweep: &Sweep, index: usize, epochs: u64, rung: &ValidTrial, last: bool) -> Option<Json> {
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

/// Writes `stopped_early.json`: `marker` (the rung, its epochs and steps, the bracket) and the
/// trial's summary there.
pub(super) fn mark_stopped(sweep: &Sweep, index: usize, mut marker: Json, at: &ValidTrial) -> Result<(), RunError> {
    let epochs = marker.get("epochs").and_then(Json::as_u64).unwrap_or(0);
    let summary = at_rung(sweep, index, epochs, at, false).unwrap_or(Json::Null);
    if let Some(map) = marker.as_object_mut() {
        map.insert("summary".into(), summary);
    }
    let path = dir(sweep, index).join(STOPPED_EARLY);
    crate::train::run_dir::write_json(&path, &marker).map_err(|e| RunError::Failure(e.to_string()))
}
