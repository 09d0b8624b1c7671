//! The chief's run folder as the edge sees it: `run.json` when training starts (how to
//! reproduce the run) and when it ends (how it ended), around the folder `train` writes; and,
//! when the run is tracked, its MLflow run, which ends with the folder's files and status.

use crate::cluster::{Address, TaskId};
use crate::data::Normalization;
use crate::exit::RunError;
use crate::prepare::{Invocation, Prepared};
use crate::provenance::{Git, Host, rfc3339};
use crate::tracking::{RunEnd, Tracker, TrackingStart, TrackingTarget};
use crate::train::run_dir::{RecordError, RunDir, RunDirOptions};
use crate::train::run_json::{RunRecord, RunStatus, Seeds, SpecSource, Topology};

/// The chief's run folder and its `run.json`.
pub struct RunFolder {
    dir: RunDir,
    record: RunRecord,
    tracker: Option<Tracker>,
}

impl RunFolder {
    /// Creates (or, resuming after `resumed_step`, reopens) the run folder and writes `run.json`.
    /// `normalization` is what `normalize = "adapt"` computed, if it did; `command` is the
    /// command line that started this run (a resident trial's later rung, the one that would).
    /// `git` is the spec folder's git state when this process has read it already (a resident
    /// trial's later rung: four `git` commands, up to 50 ms in a large work tree, at every
    /// promotion otherwise); `None` asks git.
    pub fn start(
        inv: &Invocation,
        p: &Prepared,
        resumed_step: Option<u64>,
        normalization: Option<Normalization>,
        command: &[String],
        git: Option<Git>,
    ) -> Result<RunFolder, RunError> {
        let resolved = toml::to_string_pretty(&p.loaded.spec).map_err(|e| RunError::Failure(e.to_string()))?;
        let options = RunDirOptions {
            resolved_spec: resolved,
            spec_sha256: p.plan.hashes.results.clone(),
            log_every_steps: p.loaded.spec.run.log_every_steps.get(),
            launched: inv.launched,
            metrics: p.plan.train.metrics.clone(),
            accuracy: p.plan.train.accuracy,
        };
        let out = &p.plan.out_dir;
        let mut dir = match resumed_step {
            None => RunDir::create(out, options),
            Some(step) => RunDir::resume(out, options, step),
        }
        .map_err(|e| out_dir_error(p, e))?;
        let record = RunRecord { normalization, command: command.to_vec(), ..run_record(inv, p, git) };
        dir.record(&record).map_err(|e| RunError::Train(e.into()))?;
        let tracker = track(inv, p, &record, resumed_step.is_some());
        if let Some(t) = &tracker {
            dir.also_to(t.lines());
        }
        Ok(RunFolder { dir, record, tracker })
    }

    /// The git state `run.json` records, for a later rung of this process.
    pub fn git(&self) -> Git {
        self.record.git.clone()
    }

    /// The folder, for the training loop.
    pub fn dir(&mut self) -> &mut RunDir {
        &mut self.dir
    }

    /// Records how the run ended: `failure` is its exit code and message, `None` when it
    /// completed or was preempted (paused, not failed: the next launch resumes it).
    pub fn finish(mut self, inv: &Invocation, result: Result<(), &RunError>) -> Result<(), RunError> {
        let (status, code, error) = match result {
            Ok(()) => (RunStatus::Completed, 0, None),
            Err(e @ RunError::Preempted(_)) => (RunStatus::Preempted, e.exit(), Some(e.to_string())),
            Err(e @ RunError::Interrupted(_)) => (RunStatus::Interrupted, e.exit(), Some(e.to_string())),
            Err(e) => (RunStatus::Failed, e.exit(), Some(e.to_string())),
        };
        self.record.finish(inv.launched, status, code, error);
        let recorded = self.dir.record(&self.record).map_err(|e| RunError::Train(e.into()));
        if let Some(tracker) = self.tracker.take() {
            let end = match status {
                RunStatus::Completed => RunEnd::Finished,
                RunStatus::Preempted | RunStatus::Interrupted => RunEnd::Killed,
                RunStatus::Failed | RunStatus::Running => RunEnd::Failed,
            };
            let dir = self.dir.path().to_path_buf();
            let drawn: crate::tracking::LateArtifacts = Box::new(move || report(&dir));
            tracker.end(end, &artifacts(self.dir.path()), Some(drawn));
        }
        recorded
    }
}

/// Starts logging the run to MLflow when `[run.tracking]` or `MLFLOW_TRACKING_URI` names a
/// server; a trial of a sweep logs into the sweep's experiment, as a child of its run.
fn track(inv: &Invocation, p: &Prepared, record: &RunRecord, resumed: bool) -> Option<Tracker> {
    let target = TrackingTarget::resolve(p.loaded.spec.run.tracking.as_ref(), &inv.env, &p.plan.name)?;
    let mut tags = vec![
        ("trainrun.version".to_string(), env!("CARGO_PKG_VERSION").to_string()),
        ("trainrun.spec_sha256".to_string(), p.plan.hashes.results.clone()),
        ("trainrun.out_dir".to_string(), p.plan.out_dir.display().to_string()),
        ("mlflow.source.name".to_string(), inv.spec.display().to_string()),
    ];
    if let Some(commit) = &record.git.commit {
        tags.push(("mlflow.source.git.commit".to_string(), commit.clone()));
    }
    let name = p.plan.out_dir.file_name().map_or_else(|| p.plan.name.clone(), |n| n.to_string_lossy().into_owned());
    Some(Tracker::start(TrackingStart {
        target,
        run_name: name,
        spec: serde_json::to_value(&p.loaded.spec).unwrap_or_default(),
        tags,
        folder: &p.plan.out_dir,
        resumed,
    }))
}

/// The files a tracked run uploads when it ends: its weights, summary and spec.
fn artifacts(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    ["model.safetensors", "summary.json", "spec.toml", "run.json", "metrics.jsonl"]
        .iter()
        .map(|f| dir.join(f))
        .collect()
}

/// A tracked run's report, drawn as it ends while its other files upload; a report that cannot
/// be drawn only leaves its plots out.
fn report(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    if !dir.join("metrics.jsonl").is_file() {
        return Vec::new();
    }
    crate::report::write(dir).unwrap_or_default()
}

/// The run folder cannot be made: say which key chose it and where that came from.
fn out_dir_error(p: &Prepared, e: RecordError) -> RunError {
    if e.path != p.plan.out_dir || crate::checkpoint::is_no_space(&e.source) {
        return RunError::Train(e.into());
    }
    super::lock::refused(p, &crate::spec::io_reason(&e.source), Some("create"))
}

/// `run.json` as training starts.
fn run_record(inv: &Invocation, p: &Prepared, git: Option<Git>) -> RunRecord {
    let folder = inv.spec.parent().unwrap_or(std::path::Path::new("."));
    let mut env_overrides: Vec<String> = inv
        .env
        .iter()
        .filter(|(k, _)| k.to_ascii_uppercase().starts_with("TRAINRUN_") && k.contains("__"))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    env_overrides.sort();
    let c = &p.plan.cluster;
    let tasks = c
        .tasks
        .iter()
        .map(|(t, a)| {
            let address = match a {
                Address::Local => "local".to_string(),
                Address::At(a) => a.clone(),
            };
            (t.to_string(), address)
        })
        .collect();
    RunRecord {
        trainrun_version: env!("CARGO_PKG_VERSION"),
        status: RunStatus::Running,
        exit_code: None,
        error: None,
        started_at: {
            let now = std::time::SystemTime::now();
            rfc3339(now.checked_sub(inv.launched.elapsed()).unwrap_or(now))
        },
        ended_at: None,
        wall_s: None,
        command: std::env::args().collect(),
        cwd: std::env::current_dir().ok().map(|d| d.display().to_string()),
        spec: SpecSource {
            path: inv.spec.display().to_string(),
            files: p.loaded.files.iter().map(|f| f.display().to_string()).collect(),
            sets: inv.sets.clone(),
            env_overrides,
            sha256: p.plan.hashes.results.clone(),
        },
        seeds: Seeds { run: p.plan.seed, sweep: p.trial.as_ref().map(|t| t.sweep_seed) },
        sweep: p.trial.as_ref().map(|t| t.origin.clone()),
        git: git.unwrap_or_else(|| Git::of(folder)),
        cluster: Topology {
            strategy: p.plan.strategy.kind(),
            source: c.source,
            tasks,
            task: c.task.map(|t: TaskId| t.to_string()),
            num_workers: p.plan.strategy.num_workers,
            num_replicas_in_sync: p.plan.strategy.num_replicas_in_sync,
            threads: p.plan.threads,
        },
        host: Host::here(),
        normalization: None,
    }
}
