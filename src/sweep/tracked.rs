//! A tracked sweep (`[run.tracking]` or `MLFLOW_TRACKING_URI`) is an MLflow parent run: created
//! before the first trial, handed to the trials as `TRAINRUN_MLFLOW_PARENT` so each logs as
//! its child, and ended with the sweep's status and its `sweep.json`, `results.csv` and report.
//! (The report is not drawn here: `report` reads sweeps, and a sweep that drew reports would
//! make the two modules depend on each other.)

use super::Sweep;
use crate::exit::RunError;
use crate::prepare::Invocation;
use crate::tracking::{PARENT_VAR, RunEnd, Tracker, TrackingStart, TrackingTarget};

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
    let tracker = Tracker::start(TrackingStart {
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

/// Ends the parent run as the sweep ended, with its files (and a report `trainrun report`
/// drew there).
pub(super) fn end(tracker: Option<Tracker>, sweep: &Sweep, result: &Result<(), RunError>) {
    let Some(tracker) = tracker else { return };
    let end = match result {
        Ok(()) => RunEnd::Finished,
        Err(RunError::Preempted(_) | RunError::Interrupted(_)) => RunEnd::Killed,
        Err(_) => RunEnd::Failed,
    };
    let mut files: Vec<std::path::PathBuf> =
        ["sweep.json", "results.csv", "report.html"].iter().map(|f| sweep.dir.join(f)).collect();
    let plots = std::fs::read_dir(&sweep.dir).into_iter().flatten().flatten().map(|e| e.path());
    files.extend(plots.filter(|p| p.extension().is_some_and(|e| e == "png" || e == "svg")));
    tracker.end(end, &files);
}
