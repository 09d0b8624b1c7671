//! A real `trainrun` job in a [`NamespaceHosts`]: N worker tasks, each started in its host with
//! TensorFlow's `TF_CONFIG` naming every task by its host's address, training a small MLP
//! (784 → 32 relu → 10) on synthetic images with one thread a task, so the two cores of this
//! machine carry the communication. What it reports comes from the tasks' own records: the
//! chief's `summary.json` (`first_step_s`: its launch to the first step, which no task reaches
//! before every task has checked in and the data plane is connected) and its
//! `metrics.jsonl`, one line a step, whose times give the step-time percentiles.

use super::hosts::{NamespaceHosts, address};
use super::procs::{Procs, ProcsError, Start};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// Where the tasks run: `hosts` hosts, task `i` on host `i / per_host`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskLayout {
    pub tasks: usize,
    pub hosts: usize,
}

impl TaskLayout {
    /// `tasks` on up to 8 hosts, at least two (so the network carries something) and, where
    /// the count allows, at least two tasks a host (so hosts are hosts): 2 = 2 × 1,
    /// 4 = 2 × 2, 8 = 4 × 2, 16 = 8 × 2, 32 = 8 × 4, 64 = 8 × 8.
    pub fn for_tasks(tasks: usize) -> TaskLayout {
        TaskLayout { tasks, hosts: (tasks / 2).clamp(2, 8).min(tasks.max(1)) }
    }

    /// Tasks on the fullest host.
    pub fn per_host(&self) -> usize {
        self.tasks.div_ceil(self.hosts)
    }

    /// The host of task `i`.
    pub fn host_of(&self, i: usize) -> usize {
        i / self.per_host()
    }
}

/// What each job trains.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainSettings {
    pub steps: u64,
    pub per_replica_batch: usize,
    /// `strategy.communication.implementation`.
    pub implementation: String,
    /// Killed past this.
    pub deadline: Duration,
}

/// What one job measured.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainResult {
    /// The chief's launch to its first step, seconds.
    pub rendezvous_s: f64,
    /// Per-step wall time, milliseconds, in step order (from the second step on).
    pub step_ms: Vec<f64>,
    /// The transport the job chose, from the chief's summary.
    pub transport: String,
    pub steps: u64,
    /// The trained weights' hash, from the chief's summary.
    pub weights_sha256: String,
    /// Under `implementation = "auto"`, the chief's line on the cost model and the algorithm
    /// each pack size takes (`all-reduce cost model …`), from its log.
    pub all_reduce_choice: Option<String>,
}

impl TrainResult {
    pub fn step_median_ms(&self) -> f64 {
        percentile(&self.step_ms, 0.5)
    }
    pub fn step_p90_ms(&self) -> f64 {
        percentile(&self.step_ms, 0.9)
    }
    pub fn step_p99_ms(&self) -> f64 {
        percentile(&self.step_ms, 0.99)
    }
}

/// The `q` quantile (nearest rank) of `v`; NaN for none.
pub fn percentile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n => s[((q * n as f64).ceil() as usize).clamp(1, n) - 1],
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ScaleJobError {
    #[error(transparent)]
    Procs(#[from] ProcsError),
    #[error("the chief's record {file}: {why}")]
    Record { file: String, why: String },
}

/// The job's spec: the MLP, synthetic data sized for `steps`, a metrics line every step.
fn spec(p: TaskLayout, s: &TrainSettings, out: &Path) -> String {
    let global = p.tasks * s.per_replica_batch;
    format!(
        r#"batch = {{ per_replica = {batch} }}
optimizer = {{ kind = "sgd", learning_rate = 0.05 }}
model = {{ layers = [{{ type = "flatten" }}, {{ type = "dense", units = 32, activation = "relu" }}, {{ type = "dense", units = 10 }}] }}
train = {{ epochs = 1, steps_per_epoch = {steps}, loss = "sparse_categorical_crossentropy", from_logits = true }}
[run]
name = "scale"
seed = 5
threads = 1
log_every_steps = 1
out_dir = "{out}"
[data]
dataset = "synthetic"
synthetic = {{ train_examples = {train}, test_examples = {test} }}
[strategy]
kind = "multi_worker_mirrored"
communication = {{ implementation = "{implementation}" }}
"#,
        out = out.display(),
        train = global * s.steps as usize,
        test = (p.tasks * 4).max(64),
        implementation = s.implementation,
        batch = s.per_replica_batch,
        steps = s.steps,
    )
}

/// Task `i`'s `host:port`: each host's tasks on consecutive ports.
fn task_address(p: TaskLayout, i: usize) -> String {
    format!("{}:{}", address(p.host_of(i)), 7100 + i % p.per_host())
}

/// Trains the job to completion in `cluster` and reads the chief's records.
pub fn train(
    exe: &Path,
    cluster: &NamespaceHosts,
    p: TaskLayout,
    s: &TrainSettings,
    stop: &AtomicBool,
) -> Result<TrainResult, ScaleJobError> {
    // A folder of its own for each job, the cluster's later jobs of the same kind too.
    let dir = (1..)
        .map(|k| cluster.work().join(format!("train-{}-{}-{k}", p.tasks, s.implementation)))
        .find(|d| !d.exists())
        .unwrap_or_else(|| cluster.work().join("train"));
    std::fs::create_dir_all(&dir).map_err(ProcsError::from)?;
    let spec_path = dir.join("scale.toml");
    std::fs::write(&spec_path, spec(p, s, &dir.join("run"))).map_err(ProcsError::from)?;
    let workers: Vec<String> = (0..p.tasks).map(|i| format!("\"{}\"", task_address(p, i))).collect();
    let workers = workers.join(",");
    let token = format!("scale-harness-{}-0123456789abcdef", cluster.tag);
    // The chief keeps `auto`'s measured cost model under `$XDG_CACHE_HOME/trainrun`: a folder
    // of this job's, so that every job measures afresh (a bench's `auto` rendezvous is a first
    // run's) and nothing lands in the user's own cache; the cluster's folder goes with it.
    let cache = dir.join("cache");
    let mut procs = Procs::default();
    // The chief first: its launch is where the rendezvous time starts.
    for i in 0..p.tasks {
        let tf_config = format!(r#"{{"cluster":{{"worker":[{workers}]}},"task":{{"type":"worker","index":{i}}}}}"#);
        procs.start(
            cluster,
            Start {
                name: format!("worker:{i}"),
                host: p.host_of(i),
                program: exe,
                args: vec![spec_path.display().to_string(), "--quiet".into()],
                env: vec![
                    ("TF_CONFIG".into(), tf_config),
                    ("TRAINRUN_JOB_TOKEN".into(), token.clone()),
                    ("XDG_CACHE_HOME".into(), cache.display().to_string()),
                ],
            },
        )?;
    }
    procs.wait(s.deadline, stop)?;
    let choice = procs.log(0).and_then(|log| {
        log.lines().find_map(|l| {
            l.strip_prefix("trainrun: ").filter(|l| l.starts_with("all-reduce cost model")).map(str::to_owned)
        })
    });
    Ok(TrainResult { all_reduce_choice: choice, ..read_records(&dir.join("run"))? })
}

/// The rendezvous and step times from the chief's run folder.
fn read_records(run: &Path) -> Result<TrainResult, ScaleJobError> {
    let read = |file: &str| {
        std::fs::read_to_string(run.join(file))
            .map_err(|e| ScaleJobError::Record { file: file.into(), why: e.to_string() })
    };
    let summary: serde_json::Value = serde_json::from_str(&read("summary.json")?)
        .map_err(|e| ScaleJobError::Record { file: "summary.json".into(), why: e.to_string() })?;
    let number = |key: &str| {
        summary[key]
            .as_f64()
            .ok_or_else(|| ScaleJobError::Record { file: "summary.json".into(), why: format!("no {key}") })
    };
    let rendezvous_s = number("first_step_s")?;
    let steps = number("steps")? as u64;
    let text = |key: &str| summary[key].as_str().unwrap_or("unknown").to_string();
    let (transport, weights_sha256) = (text("transport"), text("weights_sha256"));
    let walls: Vec<f64> = read("metrics.jsonl")?
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["event"] == "step")
        .filter_map(|v| v["wall_s"].as_f64())
        .collect();
    let step_ms = walls.windows(2).map(|w| (w[1] - w[0]) * 1e3).collect();
    Ok(TrainResult { rendezvous_s, step_ms, transport, steps, weights_sha256, all_reduce_choice: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements_are_hosts_of_equal_size() {
        let shapes: Vec<(usize, usize)> =
            [2, 4, 8, 16, 32, 64].map(TaskLayout::for_tasks).iter().map(|p| (p.hosts, p.per_host())).collect();
        assert_eq!(shapes, [(2, 1), (2, 2), (4, 2), (8, 2), (8, 4), (8, 8)]);
        let p = TaskLayout::for_tasks(4);
        assert_eq!((0..4).map(|i| p.host_of(i)).collect::<Vec<_>>(), [0, 0, 1, 1]);
        assert_eq!(task_address(p, 3), "10.213.0.2:7101");
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!((percentile(&v, 0.5), percentile(&v, 0.9)), (5.0, 9.0));
        assert!(percentile(&[], 0.5).is_nan());
    }
}
