//! A sweep under a scheduler ([`SweepSchedule`]), synchronously: group by group (all trials, or
//! one Hyperband bracket), rung by rung, the trials still in train to the rung (a promoted
//! trial resumes from the backup it kept at the rung before), then the scheduler's rule
//! ([`halving`], [`median_stopping`]) decides who goes on. Each rung's summary is kept as
//! `rung-<epochs>.json` (`rung-<steps>-steps.json`) in the trial's folder and a stopped trial is
//! marked by `stopped_early.json`, so a sweep driver that dies resumes where it was: finished
//! rungs are read back, never trained again. Every decision and the values it saw go to
//! `decisions.jsonl`; they depend only on the results, so the same sweep decides the same
//! every time.
//!
//! A rung in epochs is a run of that many epochs. A rung in steps is the trial's whole run
//! (`max` steps, as epochs) paused at the rung's step (`train.stop_at_step`), in the middle of
//! an epoch too, so its learning-rate schedule and epochs count the whole run; only `max`
//! must be a whole number of each trial's epochs.

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

/// Trials at the last rung of `schedule` (their full spec), validated; under rungs in steps,
/// `max` is checked to be whole epochs of every trial first. A trial must not pause by itself
/// (`train.stop_at_step`): the scheduler decides where.
pub(super) fn checked(inv: &Invocation, sweep: &Sweep, schedule: &SweepSchedule) -> Result<Vec<ValidTrial>, RunError> {
    let last = match schedule.unit {
        RungUnit::Epochs => validate_each(inv, sweep, &|_| rung_sets(schedule, 1, schedule.max), true)?,
        RungUnit::Steps => {
            let base = validate_each(inv, sweep, &|_| Vec::new(), true)?;
            let steps: Vec<u64> = base.iter().map(|c| c.steps_per_epoch).collect();
            whole_run(sweep, schedule, &steps)?;
            validate_each(inv, sweep, &|t| rung_sets(schedule, steps[t.index - 1], schedule.max), false)?
        }
    };
    if let Some((t, stop)) = last.iter().enumerate().find_map(|(t, c)| c.stop_at_step.map(|s| (t, s))) {
        return Err(RunError::Usage(format!(
            "train.stop_at_step = {stop} in trial {} ({}): a sweep's scheduler pauses its trials itself, at each \
             rung, and trains the last rung to the end\n  help: drop train.stop_at_step from the spec and its --set; \
             sweep.scheduler.grace and max set where trials pause and end",
            t + 1,
            sweep.trials[t].name
        )));
    }
    Ok(last)
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
    let bracket = group.bracket.map(|s| format!("bracket {s}, ")).unwrap_or_default();
    let mut alive = group.trials.clone();
    let mut history: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    for (k, &u) in group.rungs.iter().enumerate() {
        let last = k + 1 == group.rungs.len();
        let at: &[ValidTrial] = if u == schedule.max { checked } else { each.get(&u).map_or(checked, Vec::as_slice) };
        let todo: Vec<usize> = alive
            .iter()
            .copied()
            .filter(|i| at_rung(sweep, *i, (schedule.unit, u), &at[*i - 1], last).is_none())
            .collect();
        if !inv.quiet {
            let (n, len) = (alive.len(), todo.len());
            println!("{bracket}rung {} of {}: {u} {unit}, {n} trials, {len} to train", k + 1, group.rungs.len());
        }
        let jobs = todo
            .iter()
            .map(|i| {
                let trial = &sweep.trials[*i - 1];
                let sets = rung_sets(schedule, checked[*i - 1].steps_per_epoch, u);
                let mut process = job(inv, sweep, trial, &at[*i - 1], rungs.exe, rungs.parallel, &sets);
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
            let value = at_rung(sweep, i, (schedule.unit, u), &at[i - 1], false)
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
            mark_stopped(sweep, i, (k + 1, schedule.unit, u), group.bracket, &at[i - 1])?;
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

/// The `--set`s that train a trial of `steps_per_epoch` to rung `u` of `schedule`: a rung in
/// epochs is a run of `u` epochs; a rung in steps is the whole run (`max` steps, as epochs)
/// paused at step `u`, so that the learning-rate schedule, warmup and epochs count the whole
/// run and a promoted trial goes on as if it never paused.
pub(super) fn rung_sets(schedule: &SweepSchedule, steps_per_epoch: u64, u: u64) -> Vec<String> {
    match schedule.unit {
        RungUnit::Epochs => vec![format!("train.epochs={u}")],
        RungUnit::Steps => {
            let mut sets = vec![format!("train.epochs={}", schedule.max / steps_per_epoch.max(1))];
            if u < schedule.max {
                sets.push(format!("train.stop_at_step={u}"));
            }
            sets
        }
    }
}

/// Refuses a last rung in steps (`max`) that is not a whole number of a trial's epochs,
/// naming every such trial: the last rung is a trial's whole run, whose epochs (and the
/// learning-rate schedule over them) must end at `max`. Rungs below it may fall anywhere.
fn whole_run(sweep: &Sweep, schedule: &SweepSchedule, steps_per_epoch: &[u64]) -> Result<(), RunError> {
    let max = schedule.max;
    let mut problems = Vec::new();
    let mut common = 1u64;
    for (i, trial) in sweep.trials.iter().enumerate() {
        let per = steps_per_epoch[i].max(1);
        common = lcm(common, per);
        if !max.is_multiple_of(per) {
            problems.push(format!("trial {} ({}) trains {per} steps an epoch", trial.index, trial.name));
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    let (below, above) = (max / common * common, max.div_ceil(common).saturating_mul(common));
    let near = if below > 0 { format!("{below} or {above}") } else { above.to_string() };
    Err(RunError::Usage(format!(
        "sweep.scheduler.max = {max} steps is not a whole number of epochs of every trial, and the last rung is a \
         trial's whole run (its epochs and learning-rate schedule end there):\n  {}\n  help: set \
         sweep.scheduler.max to a multiple of every trial's train.steps_per_epoch (e.g. {near}), or \
         train.steps_per_epoch to a divisor of {max}; grace and the rungs below max may fall anywhere in an epoch",
        problems.join("\n  ")
    )))
}

fn lcm(a: u64, b: u64) -> u64 {
    let gcd = |mut x: u64, mut y: u64| {
        while y != 0 {
            (x, y) = (y, x % y);
        }
        x
    };
    (a / gcd(a, b).max(1)).saturating_mul(b)
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
        let sets = |t: &Trial| {
            let c = &checked[t.index - 1];
            rung_sets(schedule, c.steps_per_epoch, if has(t) { u } else { schedule.max })
        };
        let rung = validate_each(inv, sweep, &sets, false)?;
        // Only rungs in epochs change the run's length; a rung in steps pauses the whole run.
        let moved = rung.iter().zip(checked).zip(&sweep.trials).find(|((r, c), _)| r.learning_rate != c.learning_rate);
        if let Some((_, trial)) = moved {
            return Err(RunError::Usage(format!(
                "trial {} ({}) has a learning rate that depends on train.epochs, so a trial paused at a rung of \
                 {u} epochs would not continue as one trained without pause: give its schedule fixed steps \
                 (e.g. optimizer.schedule.decay_steps), count the rungs in steps (sweep.scheduler.unit = \"steps\", \
                 which pause the whole run), or sweep without a scheduler",
                trial.index, trial.name,
            )));
        }
        each.insert(u, rung);
    }
    Ok(each)
}

fn dir(sweep: &Sweep, index: usize) -> PathBuf {
    sweep.trial_dir(&sweep.trials[index - 1])
}

/// The file a trial keeps its summary at rung `u` in: `rung-<epochs>.json`, or
/// `rung-<steps>-steps.json` for rungs in steps.
fn rung_file(dir: &Path, (unit, u): (RungUnit, u64)) -> PathBuf {
    match unit {
        RungUnit::Epochs => dir.join(format!("rung-{u}.json")),
        RungUnit::Steps => dir.join(format!("rung-{u}-steps.json")),
    }
}

/// Trial `index`'s summary at rung `u` (in `unit`s) if it finished it: its kept rung file,
/// else its `summary.json` of that rung (kept now); the last rung's is `summary.json`.
pub(super) fn at_rung(sweep: &Sweep, index: usize, u: (RungUnit, u64), rung: &ValidTrial, last: bool) -> Option<Json> {
    let dir = dir(sweep, index);
    if last {
        return results::completed(&dir, &rung.sha256);
    }
    if let Some(kept) = results::summary_of(&rung_file(&dir, u), &rung.sha256) {
        return Some(kept);
    }
    let summary = results::completed(&dir, &rung.sha256)?;
    let _ = crate::train::run_dir::write_json(&rung_file(&dir, u), &summary);
    Some(summary)
}

/// Writes `stopped_early.json`: the rung (1-based) and where it is in `unit`s
/// (`{"rung": 1, "steps": 30}`), the bracket, and the trial's summary there.
pub(super) fn mark_stopped(
    sweep: &Sweep,
    index: usize,
    (rung, unit, u): (usize, RungUnit, u64),
    bracket: Option<u32>,
    at: &ValidTrial,
) -> Result<(), RunError> {
    let summary = at_rung(sweep, index, (unit, u), at, false).unwrap_or(Json::Null);
    let marker = json!({ "rung": rung, unit.as_str(): u, "bracket": bracket, "summary": summary });
    let path = dir(sweep, index).join(STOPPED_EARLY);
    crate::train::run_dir::write_json(&path, &marker).map_err(|e| RunError::Failure(e.to_string()))
}
