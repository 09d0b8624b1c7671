//! `trainrun sweep SPEC`: validate every trial up front (every problem at once, exit 2), list
//! them (`--dry-run`), or run the trials not complete yet and rank them all.

use super::child::{self, TrialEvent, TrialProcess};
use super::results::{self, Row, Status, SweepRecord, TrialRecord};
use super::selection::{self, Evaluated};
use super::{Sweep, TRIAL_VAR, Trial};
use crate::exit::RunError;
use crate::prepare::{Invocation, Unplanned};
use crate::provenance::{Git, Host, rfc3339};
use crate::signals::Stop;
use crate::spec::{self, LoadError, render_each};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::SystemTime;

/// `trainrun sweep`'s options.
#[derive(Debug, Clone)]
pub struct SweepOptions {
    /// Trials run at once (at most the cores of the machine).
    pub parallel: usize,
    /// Only list the trials.
    pub dry_run: bool,
    /// Which part of the sweep this invocation does.
    pub part: SweepPart,
    /// `--replay FILE`: make the decisions an asynchronous sweep recorded there.
    pub replay: Option<std::path::PathBuf>,
}

/// What `trainrun sweep` does with the trials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepPart {
    /// Runs every trial not complete yet, then ranks them (the driver).
    Every,
    /// `--trial I`: runs the trial of job-array index I alone ([`super::array`]).
    Trial(usize),
    /// `--collect`: ranks what the trials' folders hold, running none.
    Collect,
}

/// A trial that validated.
pub(super) struct ValidTrial {
    /// Hash of its resolved spec.
    pub(super) sha256: String,
    /// Optimizer steps in each of its epochs (a scheduler's `max` in steps becomes epochs).
    pub(super) steps_per_epoch: u64,
    /// Where it pauses (`train.stop_at_step`), which only a scheduler's rung may set.
    pub(super) stop_at_step: Option<u64>,
    /// Threads its plan gives each task, and whether the spec chose them.
    threads: usize,
    threads_set: bool,
    /// The split it evaluates.
    pub(super) evaluates: Evaluated,
    /// Its learning rate over the steps, which must not depend on a rung's epochs.
    pub(super) learning_rate: crate::plan::LrPlan,
    /// Whether it keeps a backup after training (`backup_and_restore` with
    /// `delete_checkpoint = false`), which a scheduler pauses it by.
    pub(super) keeps_backup: bool,
}

/// Shows a trial starting or ending, and rewrites the results after each end, so an
/// interrupted sweep leaves them too.
pub(super) fn on_event(
    inv: &Invocation,
    sweep: &Sweep,
    checked: &[ValidTrial],
    record: &SweepRecord,
    failures: &mut BTreeMap<usize, u8>,
    event: TrialEvent,
) {
    let n = sweep.trials.len();
    match event {
        TrialEvent::Started(i) => {
            if !inv.quiet {
                let name = &sweep.trials[i - 1].name;
                println!("[{i}/{n}] {name}: running (log: {})", sweep.dir.join(name).join("train.log").display());
            }
        }
        TrialEvent::Ended { index, code, took, error } => {
            let trial = &sweep.trials[index - 1];
            let dir = sweep.trial_dir(trial);
            let complete = code == 0 && results::completed(&dir, &checked[index - 1].sha256).is_some();
            // The trial heard the sweep's SIGTERM, or a terminal's Ctrl-C itself.
            let stop_codes = [Stop::Terminated, Stop::Interrupted].map(Stop::exit_code);
            if let Some(stop) = crate::signals::received().filter(|_| !complete && stop_codes.contains(&code)) {
                // Stopped as asked, not failed: it stays pending, and the same command runs it.
                println!("[{index}/{n}] {}: stopped by {} after {:.1} s", trial.name, stop.name(), took.as_secs_f64());
                let _ = write_results(&sweep.dir, &ranked(sweep, record, failures));
                return;
            }
            if !complete {
                failures.insert(index, if code == 0 { 1 } else { code });
            }
            if !inv.quiet || !complete {
                let what = match results::completed(&dir, &checked[index - 1].sha256) {
                    Some(s) if complete => {
                        let m = results::value_in(&s, checked[index - 1].evaluates, sweep.metric.as_str())
                            .and_then(|v| v.as_f64());
                        format!(
                            "done in {:.1} s, {} {}",
                            took.as_secs_f64(),
                            sweep.metric.as_str(),
                            m.map_or("-".into(), |m| format!("{m:.4}"))
                        )
                    }
                    _ => format!(
                        "FAILED (exit {code}) after {:.1} s{}",
                        took.as_secs_f64(),
                        tail(&dir, error.as_deref())
                    ),
                };
                println!("[{index}/{n}] {}: {what}", trial.name);
            }
            // Results so far, so an interrupted sweep leaves them too.
            let rows = ranked(sweep, record, failures);
            let _ = write_results(&sweep.dir, &rows);
        }
    }
}

/// The sweep of `inv`'s spec, which must have a `[sweep]`.
pub(super) fn load(inv: &Invocation) -> Result<Sweep, RunError> {
    let base = spec::load(&inv.spec, &inv.env, &inv.sets).map_err(|e| RunError::Spec(e.to_string()))?;
    match Sweep::new(&base) {
        Ok(Some(sweep)) => Ok(sweep),
        Ok(None) => Err(RunError::Usage(format!(
            "{} has no [sweep] section; add one (docs/sweeps.md) or train it with `trainrun {}`",
            inv.spec.display(),
            inv.spec.display()
        ))),
        Err(diags) => Err(RunError::Spec(spec::render(&diags, &base.origins))),
    }
}

/// Runs the sweep of `inv.spec`.
pub fn run(inv: &Invocation, opts: &SweepOptions) -> Result<(), RunError> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if opts.parallel > cores {
        return Err(RunError::Usage(format!(
            "--parallel {} is more than the {cores} cores of this machine; use --parallel {cores} or less",
            opts.parallel
        )));
    }
    let mut sweep = load(inv)?;
    super::asynchronous::replayable(&sweep, opts.replay.as_deref())?;
    match opts.part {
        SweepPart::Every => {}
        SweepPart::Trial(index) => return super::array::trial(inv, &sweep, index),
        SweepPart::Collect => return super::array::collect(inv, &sweep),
    }
    let checked = match &sweep.scheduler {
        Some(schedule) => super::rungs::checked(inv, &sweep, schedule)?,
        None => validate_each(inv, &sweep, &|_| Vec::new(), true)?,
    };
    let done: Vec<bool> = sweep
        .trials
        .iter()
        .zip(&checked)
        .map(|(t, c)| results::completed(&sweep.trial_dir(t), &c.sha256).is_some())
        .collect();
    if opts.dry_run {
        print!("{}", dry_run(&sweep, &checked, &done));
        return Ok(());
    }

    let mut record = sweep_record(inv, &sweep, &checked, opts.parallel);
    let record_path = sweep.dir.join("sweep.json");
    std::fs::create_dir_all(&sweep.dir)
        .map_err(|e| RunError::Failure(format!("cannot create {}: {e}", sweep.dir.display())))?;
    write(&record_path, &record)?;
    let missing = done.iter().filter(|d| !**d).count();
    if !inv.quiet {
        println!(
            "sweep {}: {} trials in {}, {} to run ({} complete), {} at a time",
            sweep.name,
            sweep.trials.len(),
            sweep.dir.display(),
            missing,
            sweep.trials.len() - missing,
            opts.parallel
        );
        for (t, _) in sweep.trials.iter().zip(&done).filter(|(_, d)| **d) {
            println!("[{}/{}] {}: complete, skipped", t.index, sweep.trials.len(), t.name);
        }
    }

    super::tracked::end_killed_trials(inv, &sweep, &checked, "the sweep driver, run again,");
    let exe =
        std::env::current_exe().map_err(|e| RunError::Failure(format!("cannot find the trainrun binary: {e}")))?;
    let mut failures: BTreeMap<usize, u8> = BTreeMap::new();
    let stop = crate::signals::supervise();
    // A tracked sweep is a parent run, which its trials learn of through the environment.
    let (tracker, inv) = super::tracked::parent(inv, &sweep);
    let inv = &inv;
    let result = (|| {
        if let Some(schedule) = sweep.scheduler.clone() {
            let replay = opts.replay.as_deref();
            let rungs = Rungs { schedule: &schedule, exe: &exe, parallel: opts.parallel, stop, replay };
            match schedule.spec.asynchronous() {
                true => super::asynchronous::run(
                    inv,
                    &mut sweep,
                    &rungs,
                    checked,
                    &mut record,
                    &record_path,
                    &mut failures,
                )?,
                false => super::rungs::run(inv, &sweep, &rungs, &checked, &record, &mut failures)?,
            }
            return finish(inv, &sweep, record, &record_path, &failures);
        }
        if let Some(search) = sweep.tpe.clone() {
            let at = super::sequential::At { exe: &exe, parallel: opts.parallel, stop, record_path: &record_path };
            super::sequential::run(inv, &mut sweep, &search, &at, &mut record, checked, &mut failures)?;
            return finish(inv, &sweep, record, &record_path, &failures);
        }
        every(inv, &sweep, &checked, &done, (&exe, opts.parallel, stop), &record, &mut failures)?;
        finish(inv, &sweep, record, &record_path, &failures)
    })();
    super::tracked::end(tracker, &sweep, &result, &exe);
    result
}

/// Runs the trials of a grid, random or listed sweep not complete yet.
fn every(
    inv: &Invocation,
    sweep: &Sweep,
    checked: &[ValidTrial],
    done: &[bool],
    (exe, parallel, stop): (&Path, usize, &std::sync::atomic::AtomicBool),
    record: &SweepRecord,
    failures: &mut BTreeMap<usize, u8>,
) -> Result<(), RunError> {
    let jobs: Vec<TrialProcess> = sweep
        .trials
        .iter()
        .zip(checked)
        .zip(done)
        .filter(|(_, d)| !**d)
        .map(|((t, c), _)| job(inv, sweep, t, c, exe, parallel, &[]))
        .collect();
    child::run_all(jobs, parallel, stop, |event| on_event(inv, sweep, checked, record, failures, event));
    Ok(())
}

/// How a scheduled sweep runs its rungs.
pub(super) struct Rungs<'a> {
    /// The scheduler, resolved for the trials.
    pub schedule: &'a crate::spec::sweep::SweepSchedule,
    /// The binary.
    pub exe: &'a Path,
    /// Trials at once.
    pub parallel: usize,
    /// Set once the sweep is asked to stop.
    pub stop: &'static std::sync::atomic::AtomicBool,
    /// `--replay FILE`: the decisions an asynchronous sweep makes first.
    pub replay: Option<&'a Path>,
}

/// Records the end of this invocation, ranks the trials and says how the sweep ended.
fn finish(
    inv: &Invocation,
    sweep: &Sweep,
    mut record: SweepRecord,
    record_path: &Path,
    failures: &BTreeMap<usize, u8>,
) -> Result<(), RunError> {
    let n = sweep.trials.len();
    record.ended_at = Some(rfc3339(SystemTime::now()));
    record.stopped_by = crate::signals::received().map(|s| s.name().to_string());
    write(record_path, &record)?;
    let rows = ranked(sweep, &record, failures);
    write_results(&sweep.dir, &rows)?;
    if let Some(stop) = crate::signals::received() {
        let complete = rows.iter().filter(|r| r.status == Status::Ok).count();
        let why = format!(
            "sweep stopped by {}: {complete} of {n} trials complete; run the same command again to run the rest",
            stop.name()
        );
        return Err(match stop {
            Stop::Terminated => RunError::Preempted(why),
            Stop::Interrupted => RunError::Interrupted(why),
        });
    }
    if !inv.quiet {
        let order = if sweep.higher_is_better { "higher is better" } else { "lower is better" };
        println!("\nranked by {} ({order}):", sweep.metric.as_str());
        print!("{}", results::table(&rows, sweep.metric.as_str()));
        println!("wrote {} and timings.csv", sweep.dir.join("results.csv").display());
    }
    // The first failed trial's code, as the launcher does for tasks.
    match rows
        .iter()
        .filter_map(|r| if let Status::Failed(c) = r.status { Some((r.trial.index, c)) } else { None })
        .min()
    {
        Some((index, code)) => Err(RunError::TrialFailed {
            code,
            message: format!(
                "{} of {n} trials failed; the first, trial {index} ({}), with exit code {code}",
                failures.len().max(1),
                sweep.trials[index - 1].name
            ),
        }),
        None => Ok(()),
    }
}

pub(super) fn ranked(sweep: &Sweep, record: &SweepRecord, failures: &BTreeMap<usize, u8>) -> Vec<Row> {
    results::rank(results::rows(&sweep.dir, record, failures), sweep.metric.as_str(), sweep.higher_is_better)
}

/// The last lines of a failed trial's log, indented, or why it did not start.
pub(super) fn tail(dir: &Path, error: Option<&str>) -> String {
    if let Some(e) = error {
        return format!(": {e}");
    }
    let log = std::fs::read_to_string(dir.join("train.log")).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    let last: Vec<String> = lines[lines.len().saturating_sub(8)..].iter().map(|l| format!("    {l}")).collect();
    format!("; the end of {}:\n{}", dir.join("train.log").display(), last.join("\n"))
}

/// Loads and plans every trial, reporting every problem of every trial at once; problems
/// that several trials share are shown once.
/// Each trial is loaded with its `rung_sets` after the invocation's `--set`s (a rung's
/// epochs, or where it pauses); `show` prints the warnings.
pub(super) fn validate_each(
    inv: &Invocation,
    sweep: &Sweep,
    rung_sets: &dyn Fn(&Trial) -> Vec<String>,
    show: bool,
) -> Result<Vec<ValidTrial>, RunError> {
    let mut problems: Vec<(String, Vec<usize>)> = Vec::new();
    let mut warnings: Vec<(String, Vec<usize>)> = Vec::new();
    let add = |list: &mut Vec<(String, Vec<usize>)>, parts: Vec<String>, trial: usize| {
        for part in parts {
            match list.iter_mut().find(|(p, _)| *p == part) {
                Some((_, trials)) => trials.push(trial),
                None => list.push((part, vec![trial])),
            }
        }
    };
    let mut checked = Vec::with_capacity(sweep.trials.len());
    for trial in &sweep.trials {
        let sets: Vec<String> = inv.sets.iter().cloned().chain(rung_sets(trial)).collect();
        let loaded = match spec::load_trial(&inv.spec, &inv.env, &sets, &sweep.assignments(trial)) {
            Ok(loaded) => loaded,
            Err(LoadError::Invalid { parts, .. }) => {
                add(&mut problems, parts, trial.index);
                continue;
            }
            Err(e @ LoadError::Read { .. }) => return Err(in_trial(sweep, trial, RunError::Spec(e.to_string()))),
        };
        match crate::prepare::plan_to_train(&loaded, inv) {
            Ok(plan) => {
                add(&mut warnings, render_each(&plan.warnings, &loaded.origins), trial.index);
                let evaluates = Evaluated::of(&plan, &loaded.spec);
                let produced = selection::produced(&plan, evaluates);
                let selection = selection::missing(sweep.metric, evaluates, &produced);
                add(&mut problems, render_each(selection.as_slice(), &loaded.origins), trial.index);
                let on_test = selection::on_test(sweep.metric);
                add(&mut warnings, render_each(on_test.as_slice(), &loaded.origins), trial.index);
                checked.push(ValidTrial {
                    sha256: loaded.spec.results_sha256(),
                    steps_per_epoch: plan.train.steps_per_epoch,
                    stop_at_step: plan.train.stop_at_step,
                    threads: plan.threads,
                    threads_set: loaded.spec.run.threads.is_some(),
                    evaluates,
                    learning_rate: plan.learning_rate.clone(),
                    keeps_backup: loaded.spec.callbacks.iter().any(|c| {
                        matches!(c, crate::spec::CallbackSpec::BackupAndRestore { delete_checkpoint: false, .. })
                    }),
                });
            }
            Err(Unplanned::Spec(diags)) => add(&mut problems, render_each(&diags, &loaded.origins), trial.index),
            Err(Unplanned::Run(e)) => return Err(in_trial(sweep, trial, e)),
            Err(Unplanned::TooBig(too_big)) => {
                return Err(in_trial(sweep, trial, RunError::Unsupported(too_big.to_string())));
            }
        }
    }
    if !warnings.is_empty() && !inv.quiet && show {
        eprint!("{}", merged(&warnings, sweep));
    }
    if problems.is_empty() {
        return Ok(checked);
    }
    let count = problems.len();
    let plural = if count == 1 { "problem" } else { "problems" };
    Err(RunError::Spec(format!(
        "{}error: {count} {plural} in {} (its {} trials checked)\n",
        merged(&problems, sweep),
        inv.spec.display(),
        sweep.trials.len()
    )))
}

/// `e`, which stopped the sweep while checking `trial` (a file of its own that cannot be
/// read), with the trial it came from: its number, the values it sets and its folder. The
/// exit code stays `e`'s.
fn in_trial(sweep: &Sweep, trial: &Trial, e: RunError) -> RunError {
    let text = e.to_string();
    let text = text.strip_prefix("error: ").unwrap_or(&text);
    RunError::TrialFailed {
        code: e.exit(),
        message: format!(
            "trial {} of {} ({}) cannot run, so no trial was run: {text}\n  trial {}: {}; its folder: {}\n  \
             help: fix what it names, or change the value in [sweep] that gives it",
            trial.index,
            sweep.trials.len(),
            trial.name,
            trial.index,
            trial.describe(),
            sweep.trial_dir(trial).display()
        ),
    }
}

/// Rendered problems, each once, with the trials it is in when not all of them.
fn merged(list: &[(String, Vec<usize>)], sweep: &Sweep) -> String {
    let mut out = String::new();
    for (part, trials) in list {
        out.push_str(part);
        let n = sweep.trials.len();
        // Under the diagnostic's own `= help:` line.
        let indent = part.lines().rev().find_map(|l| l.find("= ").filter(|i| l[..*i].trim().is_empty())).unwrap_or(2);
        let pad = " ".repeat(indent);
        match trials.as_slice() {
            [one] if n > 1 => {
                out.push_str(&format!("\n{pad}= note: in trial {one} of {n} ({})", sweep.trials[one - 1].name));
            }
            some if some.len() < n => {
                let list: Vec<String> = some.iter().map(usize::to_string).collect();
                out.push_str(&format!("\n{pad}= note: in trials {} of {n}", list.join(", ")));
            }
            _ => {}
        }
        out.push_str("\n\n");
    }
    out
}

/// The variable naming the inflated-file cache ([`crate::data::DataDirs::data_cache`]).
const DATA_CACHE_VAR: &str = "TRAINRUN_DATA_CACHE";
/// The folder of a sweep that its trials' inflated-file cache is in.
pub const DATA_CACHE_FOLDER: &str = ".data-cache";

/// The child process that runs `trial`.
pub(super) fn job(
    inv: &Invocation,
    sweep: &Sweep,
    trial: &Trial,
    checked: &ValidTrial,
    exe: &Path,
    parallel: usize,
    rung_sets: &[String],
) -> TrialProcess {
    let mut sets: Vec<String> = inv.sets.iter().chain(rung_sets).cloned().collect();
    // Trials side by side share the cores, unless the spec says otherwise; threads do not
    // change results, so the spec's hash leaves them out.
    if parallel > 1 && !checked.threads_set {
        sets.push(format!("run.threads={}", (checked.threads / parallel).max(1)));
    }
    let mut args = vec![inv.spec.display().to_string()];
    for s in &sets {
        args.extend(["--set".to_string(), s.clone()]);
    }
    let mut env = vec![(TRIAL_VAR.to_string(), format!("{}:{}", trial.index, checked.sha256))];
    // A tracked sweep's run, which the trial logs under ([`super::tracked`]).
    env.extend(inv.env.iter().filter(|(k, _)| k == crate::tracking::PARENT_VAR).cloned());
    // Every launch of every trial reads the same data files: MNIST's gzip files are inflated
    // once into the sweep's folder and read from there after (a data cache the user set wins).
    if !inv.env.iter().any(|(k, v)| k == DATA_CACHE_VAR && !v.is_empty()) {
        env.push((DATA_CACHE_VAR.to_string(), sweep.dir.join(DATA_CACHE_FOLDER).display().to_string()));
    }
    TrialProcess {
        index: trial.index,
        dir: sweep.trial_dir(trial),
        exe: exe.to_path_buf(),
        args,
        sets,
        env,
        stays: None,
    }
}

fn dry_run(sweep: &Sweep, checked: &[ValidTrial], done: &[bool]) -> String {
    let order = if sweep.higher_is_better { "higher is better" } else { "lower is better" };
    let mut out = format!(
        "sweep {}: {} trials in {}, ranked by {} ({order}), sweep seed {}\n",
        sweep.name,
        sweep.trials.len(),
        sweep.dir.display(),
        sweep.metric.as_str(),
        sweep.seed
    );
    let width = sweep.trials.iter().map(|t| t.name.len()).max().unwrap_or(5);
    out.push_str(&format!("{:<5}  {:<width$}  {:<10}  {:<8}  values\n", "trial", "folder", "seed", "status"));
    for ((t, _), d) in sweep.trials.iter().zip(checked).zip(done) {
        let status = if *d { "complete" } else { "to run" };
        out.push_str(&format!("{:<5}  {:<width$}  {:<10}  {status:<8}  {}\n", t.index, t.name, t.seed, t.describe()));
    }
    out
}

pub(super) fn sweep_record(inv: &Invocation, sweep: &Sweep, checked: &[ValidTrial], parallel: usize) -> SweepRecord {
    SweepRecord {
        trainrun_version: env!("CARGO_PKG_VERSION").to_string(),
        name: sweep.name.clone(),
        spec: inv.spec.display().to_string(),
        sets: inv.sets.clone(),
        metric: sweep.metric.as_str().to_string(),
        higher_is_better: sweep.higher_is_better,
        seed: sweep.seed,
        parallel,
        started_at: rfc3339(SystemTime::now()),
        ended_at: None,
        stopped_by: None,
        command: std::env::args().collect(),
        git: Some(Git::of(inv.spec.parent().unwrap_or(Path::new(".")))),
        host: Some(Host::here()),
        trials: sweep.trials.iter().zip(checked).map(|(t, c)| trial_record(t, c)).collect(),
    }
}

/// `sweep.json`'s record of a trial.
pub(super) fn trial_record(t: &Trial, c: &ValidTrial) -> TrialRecord {
    TrialRecord {
        index: t.index,
        name: t.name.clone(),
        seed: t.seed,
        values: t.values.iter().map(|a| (a.key.clone(), a.value.clone())).collect(),
        spec_sha256: c.sha256.clone(),
        evaluates: c.evaluates,
    }
}

pub(super) fn write(path: &Path, record: &SweepRecord) -> Result<(), RunError> {
    crate::train::run_dir::write_json(path, record).map_err(|e| RunError::Failure(e.to_string()))
}

/// Writes `results.csv` and, beside it, `timings.csv` (each whole, renamed into place).
pub(super) fn write_results(dir: &Path, rows: &[Row]) -> Result<(), RunError> {
    for (name, text) in [("results.csv", results::csv(rows)), ("timings.csv", results::timings_csv(rows))] {
        let path = dir.join(name);
        let tmp = dir.join(format!("{name}.tmp"));
        std::fs::write(&tmp, text)
            .and_then(|_| std::fs::rename(&tmp, &path))
            .map_err(|e| RunError::Failure(format!("cannot write {}: {e}", path.display())))?;
    }
    Ok(())
}
