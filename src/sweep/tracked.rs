//! A tracked sweep (`[run.tracking]` or `MLFLOW_TRACKING_URI`) is an MLflow parent run: created
//! before the first trial, handed to the trials as `TRAINRUN_MLFLOW_PARENT` so each logs as
//! its child, and ended with the sweep's status and its `sweep.json`, `results.csv`, `timings.csv` and report.
//! The report is drawn by `trainrun report SWEEP_DIR`, a child process as the trials are
//! (`report` reads sweeps, so a sweep that called it would make the two modules depend on each
//! other), while the other files upload. A trial killed outright (SIGKILL, out of memory, a
//! lost node) cannot end its run; the driver run again and `--collect` end it `KILLED`.

use super::Sweep;
use super::driver::ValidTrial;
use crate::exit::RunError;
use crate::prepare::Invocation;
use crate::provenance::rfc3339;
use crate::tracking::{PARENT_VAR, RUN_FILE, RunEnd, Tracker, TrackingStart, TrackingTarget, end_left_running};
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// The sweep's parent run when it is tracked, and the invocation its trials inherit it from.
pub(super) fn parent(inv: &Invocation, sweep: &Sweep) -> (Option<Tracker>, Invocation) {
    let mut inv = inv.clone();
    let Ok(base) = crate::spec::load(&inv.spec, &inv.env, &inv.sets) else { return (None, inv) };
    let Some(target) = TrackingTarget::resolve(base.spec.run.tracking.as_ref(), &inv.env, &sweep.name) else {
        return (None, inv);
    };
    let mut tags = vec![
        ("trainrun.version".to_string(), env!("CARGO_PKG_VERSION").to_string()),
        ("trainrun.sweep_metric".to_string(), sweep.metric.as_str().to_string()),
        ("mlflow.source.name".to_string(), inv.spec.display().to_string()),
    ];
    let git = crate::provenance::Git::of(inv.spec.parent().unwrap_or(std::path::Path::new(".")));
    if let Some(commit) = git.commit {
        tags.push(("mlflow.source.git.commit".to_string(), commit));
    }
    // The sweep's own run is never a child, even when a trial's variable is in the environment.
    let target = TrackingTarget { parent: None, ..target };
    let mut tracker = Tracker::start(TrackingStart {
        target,
        run_name: sweep.name.clone(),
        spec: serde_json::to_value(&base.spec).unwrap_or_default(),
        tags,
        folder: &sweep.dir,
        resumed: true,
    });
    if let Some(run) = tracker.run() {
        inv.env.retain(|(k, _)| k != PARENT_VAR);
        inv.env.push((PARENT_VAR.to_string(), format!("{}/{}", run.experiment_id, run.run_id)));
    }
    (Some(tracker), inv)
}

/// Ends as `KILLED` the MLflow runs that trials killed outright left `RUNNING`: those named in
/// trial folders without a complete summary whose lock no process holds (a trial still
/// training elsewhere holds its own). `what` names this invocation in the runs' tag. Says
/// which on stdout; an unreachable server is one warning, and the runs stay as they are.
pub(super) fn end_killed_trials(inv: &Invocation, sweep: &Sweep, checked: &[ValidTrial], what: &str) {
    let Ok(base) = crate::spec::load(&inv.spec, &inv.env, &inv.sets) else { return };
    let Some(target) = TrackingTarget::resolve(base.spec.run.tracking.as_ref(), &inv.env, &sweep.name) else {
        return;
    };
    let n = sweep.trials.len();
    for (trial, valid) in sweep.trials.iter().zip(checked) {
        let dir = sweep.trial_dir(trial);
        let gone = dir.join(RUN_FILE).is_file()
            && super::results::completed(&dir, &valid.sha256).is_none()
            && !crate::train::run_dir::in_use(&dir);
        if !gone {
            continue;
        }
        let found_by = format!(
            "{what} found it so at {} (no process holds the trial's folder); the trial's next launch continues it",
            rfc3339(std::time::SystemTime::now())
        );
        match end_left_running(&dir, &target.uri, &found_by) {
            Ok(Some(run)) if !inv.quiet => println!(
                "[{}/{n}] {}: its MLflow run {} was left RUNNING by a launch killed outright; marked KILLED",
                trial.index, trial.name, run.run_id
            ),
            Ok(_) => {}
            Err(e) => {
                eprintln!(
                    "warning: the MLflow server {} did not answer ({e}), so runs that killed trials left RUNNING stay \
                     so; the next launch of such a trial, or `trainrun sweep {} --collect`, ends them KILLED",
                    target.uri,
                    inv.spec.display()
                );
                return;
            }
        }
    }
}

/// Ends the parent run as the sweep ended, with its files and its report, drawn meanwhile by
/// `exe` (this binary).
pub(super) fn end(tracker: Option<Tracker>, sweep: &Sweep, result: &Result<(), RunError>, exe: &Path) {
    let Some(tracker) = tracker else { return };
    let end = match result {
        Ok(()) => RunEnd::Finished,
        Err(RunError::Preempted(_) | RunError::Interrupted(_)) => RunEnd::Killed,
        Err(_) => RunEnd::Failed,
    };
    let files: Vec<PathBuf> = ["sweep.json", "results.csv", "timings.csv"].iter().map(|f| sweep.dir.join(f)).collect();
    let (exe, dir) = (exe.to_path_buf(), sweep.dir.clone());
    tracker.end(end, &files, Some(Box::new(move || report(&exe, &dir))));
}

/// Draws the report of the sweep folder `dir` with `trainrun report` and returns its files:
/// the page and its plots. A report that cannot be drawn (no trial finished) leaves them out.
fn report(exe: &Path, dir: &Path) -> Vec<PathBuf> {
    let drawn = std::process::Command::new(exe)
        .arg("report")
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !drawn.is_ok_and(|s| s.success()) {
        return Vec::new();
    }
    let files = std::fs::read_dir(dir).into_iter().flatten().flatten().map(|e| e.path());
    let drawn = |p: &PathBuf| p.extension().is_some_and(|e| e == "png" || e == "svg" || e == "html");
    let mut files: Vec<PathBuf> = files.filter(drawn).collect();
    files.sort();
    files
}
