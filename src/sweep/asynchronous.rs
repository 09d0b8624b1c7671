//! A sweep under `kind = "asha"`: every free slot asks [`Ladder`] for a job at once (promote a
//! trial a rung up, or start the next trial) instead of waiting for a rung to fill. Each
//! decision goes to `decisions.jsonl` as it is made, with the values it saw. A sweep follows a
//! record first: `--replay FILE` makes exactly the decisions of another sweep's record (the
//! same trials trained to the same rungs give the same results, whatever the timing), and a
//! sweep driver that died follows its own `decisions.jsonl` back to where it was, finding
//! every finished rung in the trials' folders; then it decides live. A replay checks that
//! every value a recorded decision saw is the value it got.
//!
//! With `[sweep.tpe]`, each trial after the random startup ones is drawn by TPE when a slot
//! starts it, from every trial not training then: those trained to the end and those paused
//! or stopped at a rung, with their value there (as Optuna's TPE counts pruned trials). The
//! drawn values are part of the start's record, so a replay starts the same trials; with
//! `--parallel 1` nothing trains while a trial is drawn, so the same sweep draws the same.

use super::Sweep;
use super::asha::{AshaJob, Ladder};
use super::child::{self, Dispatch, Residents, TrialEvent, TrialProcess};
use super::driver::{Rungs, ValidTrial, job, on_event, trial_record, write};
use super::results::{self, SweepRecord};
use super::rungs::{at_rung, every_rung, mark_stopped, rung_sets};
use super::sequential::TPE_DOMAIN;
use crate::engine::init::rng;
use crate::exit::RunError;
use crate::prepare::Invocation;
use crate::spec::sweep::tpe::{Observation, suggest};
use crate::spec::sweep::{Rule, SweepSchedule};
use serde_json::Value as Json;
use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::path::Path;

/// Runs `sweep` under ASHA, following the record at `replay` (else the sweep folder's own
/// `decisions.jsonl`, when a driver before this one left it) before deciding live; trials
/// drawn by TPE join `sweep` and `record` (rewritten at `record_path`) as they start.
pub(super) fn run(
    inv: &Invocation,
    sweep: &mut Sweep,
    rungs: &Rungs,
    checked: Vec<ValidTrial>,
    record: &mut SweepRecord,
    record_path: &Path,
    failures: &mut BTreeMap<usize, u8>,
) -> Result<(), RunError> {
    let schedule = rungs.schedule;
    let (Rule::Halving { reduction_factor }, Some(group)) = (schedule.rule, schedule.groups.first()) else {
        return Err(RunError::Failure("an asha sweep has one group of halving rungs".into()));
    };
    let at = validated(inv, sweep, schedule, checked)?;
    let path = sweep.dir.join("decisions.jsonl");
    let follow = read_record(rungs.replay.unwrap_or(&path), rungs.replay.is_some())?;
    let file =
        std::fs::File::create(&path).map_err(|e| RunError::Failure(format!("cannot write {}: {e}", path.display())))?;
    let trials = sweep.tpe.as_ref().map_or(sweep.trials.len(), |s| s.trials);
    let ladder = Ladder::new(group.rungs.clone(), reduction_factor, sweep.higher_is_better, trials);
    // TPE draws each trial from the results so far: it needs results above the first rung.
    let ladder = if sweep.tpe.is_some() { ladder.promoting_first() } else { ladder };
    let mut state = Asha {
        inv,
        sweep,
        rungs,
        at,
        record,
        record_path,
        failures,
        ladder,
        follow: follow.iter().collect(),
        running: BTreeMap::new(),
        file,
        error: None,
    };
    let mut residents = Residents::of(state.sweep, &inv.env);
    child::run_resident(rungs.parallel, rungs.stop, &mut state, &mut residents);
    drop(residents);
    if let Some(e) = state.error {
        return Err(e);
    }
    if !state.follow.is_empty() && crate::signals::received().is_none() {
        let why = format!("{} decisions were not made", state.follow.len());
        return Err(diverged(rungs.replay.unwrap_or(&path), &why));
    }
    check_seen(&state.ladder, &follow).map_err(|why| diverged(rungs.replay.unwrap_or(&path), &why))?;
    if crate::signals::received().is_some() {
        return Ok(());
    }
    for (trial, rung) in state.ladder.stopped() {
        let valid = &state.at[rung][trial - 1];
        mark_stopped(state.sweep, trial, (rung + 1, schedule.unit, group.rungs[rung]), None, valid)?;
    }
    Ok(())
}

/// The trials validated at each rung of `schedule`'s one group (`checked`: at the last).
fn validated(
    inv: &Invocation,
    sweep: &Sweep,
    schedule: &SweepSchedule,
    checked: Vec<ValidTrial>,
) -> Result<Vec<Vec<ValidTrial>>, RunError> {
    let mut each = every_rung(inv, sweep, schedule, &checked)?;
    let rungs = schedule.groups.first().map_or(&[][..], |g| g.rungs.as_slice());
    let mut at = Vec::with_capacity(rungs.len());
    for u in &rungs[..rungs.len().saturating_sub(1)] {
        at.push(each.remove(u).ok_or_else(|| RunError::Failure(format!("the rung at {u} was not validated")))?);
    }
    at.push(checked);
    Ok(at)
}

/// What an asynchronous sweep keeps while its slots run.
struct Asha<'a> {
    inv: &'a Invocation,
    sweep: &'a mut Sweep,
    rungs: &'a Rungs<'a>,
    /// The trials validated at each rung.
    at: Vec<Vec<ValidTrial>>,
    record: &'a mut SweepRecord,
    record_path: &'a Path,
    failures: &'a mut BTreeMap<usize, u8>,
    ladder: Ladder,
    /// Recorded decisions not made yet, made before any live one.
    follow: VecDeque<&'a Json>,
    /// The rung each running trial trains to.
    running: BTreeMap<usize, usize>,
    /// `decisions.jsonl`, a line per decision as it is made.
    file: std::fs::File,
    /// What stopped the sweep from deciding on.
    error: Option<RunError>,
}

impl Asha<'_> {
    /// The next decision: the next recorded one (once its trial is not training), else a live
    /// one; with the line `decisions.jsonl` gets.
    fn decide(&mut self) -> Result<Option<(AshaJob, Json)>, RunError> {
        let Some(recorded) = self.follow.front() else {
            return Ok(self.ladder.decide());
        };
        let waits = recorded
            .get("trial")
            .and_then(Json::as_u64)
            .is_some_and(|t| usize::try_from(t).is_ok_and(|t| self.running.contains_key(&t)));
        if waits {
            return Ok(None);
        }
        let job = self.ladder.apply(recorded).map_err(|why| diverged(self.followed(), &why))?;
        let line = (*recorded).clone();
        self.follow.pop_front();
        Ok(Some((job, line)))
    }

    /// Trial `index`, the next to start, drawn by TPE (or with the values its `recorded`
    /// start drew), validated at every rung and added to the sweep and its record.
    fn draw(&mut self, index: usize, recorded: Option<&Json>) -> Result<Json, RunError> {
        let Some(search) = self.sweep.tpe.clone() else {
            return Err(RunError::Failure(format!("trial {index} is not one of the sweep's")));
        };
        let values: Vec<(String, Json)> = match recorded.and_then(Json::as_object) {
            Some(values) => values.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            None => {
                let mut g = rng(&[self.sweep.seed, TPE_DOMAIN, index as u64]);
                suggest(&search.parameters, &self.history(), search.settings, &mut g).into_iter().collect()
            }
        };
        let drawn = self
            .sweep
            .drawn(index, values)
            .ok_or_else(|| RunError::Failure(format!("trial {index} is beyond the sweep's {}", search.trials)))?;
        let record = Json::Object(drawn.values.iter().map(|a| (a.key.clone(), a.value.clone())).collect());
        self.sweep.trials.push(drawn);
        let checked = super::rungs::checked(self.inv, self.sweep, self.rungs.schedule)?;
        self.at = validated(self.inv, self.sweep, self.rungs.schedule, checked)?;
        let (trial, last) = (&self.sweep.trials[index - 1], self.at.len() - 1);
        self.record.trials.push(trial_record(trial, &self.at[last][index - 1]));
        write(self.record_path, self.record)?;
        Ok(record)
    }

    /// What TPE draws from: every trial not training now with its value at the highest rung
    /// it reached, as a loss, `stopped_at` that rung when it is not the last.
    fn history(&self) -> Vec<Observation> {
        let sign = if self.sweep.higher_is_better { -1.0 } else { 1.0 };
        let last = self.ladder.rungs().len().saturating_sub(1);
        let trials = self.sweep.trials.iter().filter(|t| !self.running.contains_key(&t.index));
        trials
            .filter_map(|t| {
                let (rung, value) = (0..=last).rev().find_map(|r| self.ladder.value(t.index, r).map(|v| (r, v)))?;
                let values = t.values.iter().map(|a| (a.key.clone(), a.value.clone())).collect();
                let stopped_at = (rung < last).then(|| self.ladder.rungs()[rung]);
                Some(Observation { values, loss: sign * value, stopped_at })
            })
            .collect()
    }

    fn followed(&self) -> &Path {
        self.rungs.replay.unwrap_or(Path::new("decisions.jsonl"))
    }

    /// Trial `trial`'s metric at rung `rung` when it finished the rung.
    fn value(&self, trial: usize, rung: usize) -> Option<f64> {
        let u = self.ladder.rungs()[rung];
        let last = rung + 1 == self.ladder.rungs().len();
        let valid = &self.at[rung][trial - 1];
        let summary = at_rung(self.sweep, trial, (self.rungs.schedule.unit, u), valid, last)?;
        results::value_in(&summary, valid.evaluates, self.sweep.metric.as_str()).and_then(Json::as_f64)
    }

    /// Says what was decided.
    fn show(&self, job: AshaJob, line: &Json) {
        if self.inv.quiet {
            return;
        }
        let n = self.sweep.tpe.as_ref().map_or(self.sweep.trials.len(), |s| s.trials);
        let unit = self.rungs.schedule.unit.as_str();
        let trial = &self.sweep.trials[job.trial - 1];
        let name = &trial.name;
        let u = self.ladder.rungs()[job.rung];
        let why = match line.get("top").and_then(Json::as_u64) {
            Some(top) => {
                let of = line.get("seen").and_then(Json::as_array).map_or(0, Vec::len);
                format!("promoted to rung {} ({u} {unit}): in the best {top} of {of} at its rung", job.rung + 1)
            }
            None if line.get("values").is_some() => {
                format!("starts at rung 1 ({u} {unit}), drawn by TPE: {}", trial.describe())
            }
            None => format!("starts at rung 1 ({u} {unit})"),
        };
        println!("[{}/{n}] {name}: {why}", job.trial);
    }
}

impl Dispatch for Asha<'_> {
    fn next(&mut self) -> Option<TrialProcess> {
        loop {
            if self.error.is_some() {
                return None;
            }
            let (next, mut line) = match self.decide() {
                Ok(Some(decided)) => decided,
                Ok(None) => return None,
                Err(e) => {
                    self.error = Some(e);
                    return None;
                }
            };
            if next.trial > self.sweep.trials.len() {
                match self.draw(next.trial, line.get("values")) {
                    Ok(values) => {
                        if let Some(map) = line.as_object_mut() {
                            map.insert("values".into(), values);
                        }
                    }
                    Err(e) => {
                        self.error = Some(e);
                        return None;
                    }
                }
            }
            if let Some(map) = line.as_object_mut() {
                map.insert("unit".into(), self.rungs.schedule.unit.as_str().into());
                map.insert("metric".into(), self.sweep.metric.as_str().into());
            }
            if let Err(e) = writeln!(self.file, "{line}") {
                self.error = Some(RunError::Failure(format!("cannot write decisions.jsonl: {e}")));
                return None;
            }
            self.show(next, &line);
            // A rung a driver before this one finished is read back, not trained again.
            if let Some(v) = self.value(next.trial, next.rung) {
                self.ladder.report(next.trial, next.rung, v);
                continue;
            }
            self.running.insert(next.trial, next.rung);
            let (valid, trial) = (&self.at[next.rung][next.trial - 1], &self.sweep.trials[next.trial - 1]);
            let sets = rung_sets(self.rungs.schedule, valid.steps_per_epoch, self.ladder.rungs()[next.rung]);
            let mut process = job(self.inv, &*self.sweep, trial, valid, self.rungs.exe, self.rungs.parallel, &sets);
            // A trial below the last rung may go on: it waits resident for that.
            process.stays = (next.rung + 1 < self.ladder.rungs().len()).then_some(valid.evaluates);
            return Some(process);
        }
    }

    fn event(&mut self, event: TrialEvent) {
        let index = match &event {
            TrialEvent::Started(i) | TrialEvent::Ended { index: i, .. } => *i,
        };
        let Some(&rung) = self.running.get(&index) else {
            return;
        };
        let ended = matches!(event, TrialEvent::Ended { .. });
        on_event(self.inv, &*self.sweep, &self.at[rung], &*self.record, &mut *self.failures, event);
        if ended {
            self.running.remove(&index);
            if let Some(v) = self.value(index, rung) {
                self.ladder.report(index, rung, v);
            }
        }
    }
}

/// Refuses `--replay` for a sweep that decides the same every time, or not at all.
pub(super) fn replayable(sweep: &Sweep, replay: Option<&Path>) -> Result<(), RunError> {
    let Some(path) = replay else {
        return Ok(());
    };
    let kind = match &sweep.scheduler {
        Some(s) if s.spec.asynchronous() => return Ok(()),
        Some(_) => "its scheduler is synchronous and decides the same every time".to_string(),
        None => "it has no [sweep.scheduler]".to_string(),
    };
    Err(RunError::Usage(format!(
        "--replay {} replays the decisions of an asynchronous sweep (kind = \"asha\"), and {kind}: run the sweep \
         without --replay",
        path.display()
    )))
}

/// The decisions recorded at `path`: none when it is the sweep's own and absent; every line
/// must be a decision of an asha sweep.
fn read_record(path: &Path, asked: bool) -> Result<Vec<Json>, RunError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !asked => return Ok(Vec::new()),
        Err(e) => return Err(RunError::Usage(format!("cannot read the record to replay, {}: {e}", path.display()))),
    };
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        match serde_json::from_str::<Json>(line) {
            Ok(d) if d.get("decision").is_some() => out.push(d),
            Ok(_) | Err(_) => {
                return Err(RunError::Usage(format!(
                    "{} line {}: not a decision of an asha sweep (`{line}`); replay the decisions.jsonl of a sweep \
                     with kind = \"asha\", or give this sweep a run.out_dir of its own",
                    path.display(),
                    n + 1
                )));
            }
        }
    }
    Ok(out)
}

/// Every value a recorded promotion saw must be the value this sweep got there.
fn check_seen(ladder: &Ladder, record: &[Json]) -> Result<(), String> {
    for d in record.iter().filter(|d| d.get("decision").and_then(Json::as_str) == Some("promote")) {
        let rung = d.get("rung").and_then(Json::as_u64).unwrap_or(2).saturating_sub(2) as usize;
        for seen in d.get("seen").and_then(Json::as_array).into_iter().flatten() {
            let trial = seen.get("trial").and_then(Json::as_u64).unwrap_or(0) as usize;
            let recorded = seen.get("value").and_then(Json::as_f64);
            let got = ladder.value(trial, rung);
            if got.is_some() && got != recorded {
                return Err(format!(
                    "trial {trial} has {} at rung {}, and the record saw {}",
                    got.map_or("-".into(), |v| v.to_string()),
                    rung + 1,
                    recorded.map_or("-".into(), |v| v.to_string())
                ));
            }
        }
    }
    Ok(())
}

/// A replay that cannot make the recorded decisions.
fn diverged(path: &Path, why: &str) -> RunError {
    RunError::Usage(format!(
        "the sweep cannot follow the decisions recorded in {}: {why}\n  help: replay a record of this same spec \
         (the same trials, rungs and reduction_factor), or give the sweep a run.out_dir of its own",
        path.display()
    ))
}
