//! `run.json`: everything needed to reproduce a run besides the resolved spec next to it (the
//! command, overrides, seeds, trainrun version, git state of the spec's folder, cluster
//! topology, host), and how it ended. Written when training starts (`status = "running"`)
//! and again when it ends.

use crate::provenance::{Git, Host, rfc3339};
use serde::Serialize;
use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Instant, SystemTime};

/// How the run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Still training (or killed without a chance to say otherwise).
    Running,
    /// Training finished.
    Completed,
    /// Training failed; `exit_code` and `error` say how.
    Failed,
    /// Stopped by SIGTERM after a backup (exit code 6); the same command resumes it.
    Preempted,
    /// Stopped by Ctrl-C (exit code 130), after a backup unless Ctrl-C came twice.
    Interrupted,
}

/// `run.json`.
#[derive(Debug, Clone, Serialize)]
pub struct RunRecord {
    /// trainrun version.
    pub trainrun_version: &'static str,
    /// How the run stands.
    pub status: RunStatus,
    /// The process exit code, once ended (docs/reliability.md, "Exit codes").
    pub exit_code: Option<u8>,
    /// The error, when it failed.
    pub error: Option<String>,
    /// When the process started (RFC 3339, UTC).
    pub started_at: String,
    /// When it ended.
    pub ended_at: Option<String>,
    /// Launch to end, seconds.
    pub wall_s: Option<f64>,
    /// The command line.
    pub command: Vec<String>,
    /// The working directory (relative paths in the spec are relative to it).
    pub cwd: Option<String>,
    /// Where the spec came from.
    pub spec: SpecSource,
    /// The run seed (every other seed derives from it), and the sweep's for a trial.
    pub seeds: Seeds,
    /// The sweep trial this run is, if it is one.
    pub sweep: Option<TrialOrigin>,
    /// The git state of the folder the spec file is in.
    pub git: Git,
    /// The job: strategy, replicas and tasks.
    pub cluster: Topology,
    /// The machine.
    pub host: Host,
    /// The per-channel statistics `data.preprocessing.normalize = "adapt"` computed from the
    /// training split.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub normalization: Option<crate::data::Normalization>,
}

/// The spec file, its `extends` chain and the overrides on top.
#[derive(Debug, Clone, Serialize)]
pub struct SpecSource {
    /// The spec file as given.
    pub path: String,
    /// Every file read: the spec, then what it extends.
    pub files: Vec<String>,
    /// `--set` overrides, in order.
    pub sets: Vec<String>,
    /// `TRAINRUN_<SECTION>__<KEY>` overrides, as `NAME=VALUE`.
    pub env_overrides: Vec<String>,
    /// Hash of the resolved spec without `run.out_dir` and `run.threads`.
    pub sha256: String,
}

/// Seeds.
#[derive(Debug, Clone, Serialize)]
pub struct Seeds {
    /// `run.seed`.
    pub run: u64,
    /// The sweep's seed, for a trial.
    pub sweep: Option<u64>,
}

/// Which trial of which sweep a run is.
#[derive(Debug, Clone, Serialize)]
pub struct TrialOrigin {
    /// 1-based trial number.
    pub trial: usize,
    /// The trial's folder name.
    pub name: String,
    /// The values the trial sets, by key path.
    pub values: BTreeMap<String, Json>,
}

/// The job's shape.
#[derive(Debug, Clone, Serialize)]
pub struct Topology {
    /// The strategy.
    pub strategy: crate::plan::StrategyKind,
    /// Where the cluster definition came from.
    pub source: crate::cluster::Source,
    /// Every task and its address (`local` for a local task not started yet).
    pub tasks: BTreeMap<String, String>,
    /// This process's task.
    pub task: Option<String>,
    /// Worker processes.
    pub num_workers: usize,
    /// Replicas whose gradients are summed each step.
    pub num_replicas_in_sync: usize,
    /// Compute threads per task.
    pub threads: usize,
}

impl RunRecord {
    /// Marks the run ended with `status` and `exit_code`; `error` says why when it did not
    /// complete.
    pub fn finish(&mut self, launched: Instant, status: RunStatus, exit_code: u8, error: Option<String>) {
        self.ended_at = Some(rfc3339(SystemTime::now()));
        self.wall_s = Some(launched.elapsed().as_secs_f64());
        self.status = status;
        self.exit_code = Some(exit_code);
        self.error = error;
    }
}

/// Marks the `run.json` in `dir` failed when it still says `running`: the launcher's word
/// for a chief task that was killed before it could write it.
pub fn mark_failed(dir: &Path, code: u8, error: &str) {
    mark(dir, &["running"], RunStatus::Failed, code, error);
}

/// Marks the `run.json` in `dir` interrupted: the launcher got Ctrl-C, and its chief either
/// stopped on the SIGTERM passed on (`preempted`) or was killed by a second Ctrl-C (`running`).
pub fn mark_interrupted(dir: &Path, error: &str) {
    mark(dir, &["running", "preempted"], RunStatus::Interrupted, 130, error);
}

/// Marks the `run.json` in `dir` stopped by `stop` while it still says `running`: the stop
/// watchdog's word for a run whose step was abandoned (`crate::signals`).
pub fn mark_stopped(dir: &Path, stop: crate::signals::Stop, error: &str) {
    let status = match stop {
        crate::signals::Stop::Terminated => RunStatus::Preempted,
        crate::signals::Stop::Interrupted => RunStatus::Interrupted,
    };
    mark(dir, &["running"], status, stop.exit_code(), error);
}

/// Marks the `run.json` in `dir` failed when it still says `running` and this process wrote
/// it: the panic hook's word (`crate::crash`, exit code 70). The hook is set before the record
/// is first written, so a panic in between cannot leave it `running`; a stale record of an
/// earlier process in the folder is not this panic's to mark.
pub fn mark_panicked(dir: &Path, code: u8, error: &str) {
    let ours = |record: &Json| record["host"]["pid"] == std::process::id();
    mark_when(dir, &["running"], ours, RunStatus::Failed, code, error);
}

/// Rewrites the status of the `run.json` in `dir` when it is one of `from`.
fn mark(dir: &Path, from: &[&str], status: RunStatus, code: u8, error: &str) {
    mark_when(dir, from, |_| true, status, code, error);
}

/// [`mark`], only for a record `also` accepts.
fn mark_when(dir: &Path, from: &[&str], also: impl Fn(&Json) -> bool, status: RunStatus, code: u8, error: &str) {
    let path = dir.join("run.json");
    let Ok(text) = std::fs::read_to_string(&path) else { return };
    let Ok(mut record) = serde_json::from_str::<Json>(&text) else { return };
    if !from.iter().any(|f| record["status"] == *f) || !also(&record) {
        return;
    }
    record["status"] = serde_json::to_value(status).unwrap_or(Json::Null);
    record["exit_code"] = code.into();
    record["error"] = error.into();
    record["ended_at"] = rfc3339(SystemTime::now()).into();
    // Best effort: the launcher is already reporting the failure itself.
    let _ = super::run_dir::write_json(&path, &record);
}
