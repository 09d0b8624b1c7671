//! The cluster as planned: every task with its address, the chief, what this process does in
//! the job, and how long the control plane waits and how often the launcher restarts. The
//! runtime (launcher, control plane, data plane) uses exactly this value; `trainrun check`
//! prints it.

use super::secs;
use crate::cluster::tls::TlsFiles;
use crate::cluster::{Address, Resolution, Role, Source, TaskId};
use crate::spec::{ClusterSpec, Diagnostic};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;

/// What this process does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "task", rename_all = "snake_case")]
pub enum Part {
    /// Everything in this process: no cluster, or a one-process strategy.
    Single,
    /// Starts one process per task of a local cluster and supervises them.
    Launcher,
    /// One task of a multi-process job.
    Task(TaskId),
}

/// How the local launcher restarts a failed job (`[cluster] max_restarts`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Restarts {
    /// Restarts allowed.
    pub max_restarts: u32,
    /// Wait before the first, doubling after.
    #[serde(serialize_with = "secs")]
    pub backoff: Duration,
}

/// The job's tasks, resolved, and this process's part among them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterPlan {
    /// Where the cluster was defined.
    pub source: Source,
    /// Every task with its address, in rank order (the chief first).
    pub tasks: Vec<(TaskId, Address)>,
    /// The chief: `chief:0`, or `worker:0` without one.
    pub chief: Option<TaskId>,
    /// What this process does.
    pub part: Part,
    /// This process's task as resolved (`--task`, TF_CONFIG, Slurm), if named.
    pub task: Option<TaskId>,
    /// How long every task has to check in at start-up.
    #[serde(serialize_with = "secs")]
    pub startup_timeout: Duration,
    /// How long a collective may stall, or a task stay silent, before the job fails.
    #[serde(serialize_with = "secs")]
    pub timeout: Duration,
    /// How the launcher restarts a failed job.
    pub restarts: Restarts,
    /// The file holding the job token on manual clusters.
    pub token_file: Option<PathBuf>,
    /// Mutual TLS on the control plane and the TCP ring (`cluster.tls`).
    #[serde(skip)]
    pub tls: Option<TlsFiles>,
}

impl ClusterPlan {
    /// Tasks of `role`.
    pub fn count(&self, role: Role) -> usize {
        self.tasks.iter().filter(|(t, _)| t.role == role).count()
    }

    /// Whether every task runs on this machine.
    pub fn is_local(&self) -> bool {
        self.tasks.iter().all(|(_, a)| a.is_local())
    }
}

/// The longest wait a spec may ask for: a week. Longer would only hide a hang.
const LONGEST: Duration = Duration::from_secs(7 * 24 * 3600);

/// A duration given in seconds at `key`, at least `shortest`, or a problem at `key`.
pub(super) fn duration(key: &str, seconds: f64, shortest: Duration, diags: &mut Vec<Diagnostic>) -> Duration {
    match Duration::try_from_secs_f64(seconds) {
        Ok(d) if (shortest..=LONGEST).contains(&d) => d,
        _ => {
            diags.push(
                Diagnostic::error(
                    key,
                    format!(
                        "{key} = {seconds} is not a usable wait: it must be a finite number of seconds from {} to {} (a week)",
                        shortest.as_secs_f64(),
                        LONGEST.as_secs()
                    ),
                )
                .help(format!("set {key} to a number of seconds such as 30")),
            );
            shortest.max(Duration::from_secs(1))
        }
    }
}

/// Plans the cluster `resolution` found for a strategy that spans processes (`multi_process`)
/// or not; `timeout_s` is the strategy's failure timeout.
pub fn resolve(
    spec: &ClusterSpec,
    resolution: &Resolution,
    multi_process: bool,
    (timeout_key, timeout_s): (&str, f64),
    diags: &mut Vec<Diagnostic>,
) -> ClusterPlan {
    let cluster = &resolution.cluster;
    let key = |spec_key: &str| match cluster.source {
        Source::TfConfig | Source::Slurm | Source::Kubernetes => "cluster".to_string(),
        Source::Spec | Source::Single => spec_key.to_string(),
    };
    for (task, address) in &cluster.tasks {
        if let Address::At(a) = address
            && !valid_address(a)
        {
            diags.push(
                Diagnostic::error(
                    key("cluster"),
                    format!("{task}'s address `{a}` ({}) is not host:port", cluster.source.describe()),
                )
                .help("write it as host:port, e.g. \"10.0.0.5:2222\""),
            );
        }
    }
    // A task is declared dead after two missed heartbeats: a shorter timeout fails every job
    // of several tasks.
    let shortest = crate::cluster::job::HEARTBEAT * 2;
    if multi_process && cluster.tasks.len() > 1 && timeout_s.is_finite() && timeout_s < shortest.as_secs_f64() {
        diags.push(
            Diagnostic::error(
                timeout_key,
                format!(
                    "{timeout_key} = {timeout_s} is below the {} s a failure timeout needs: tasks send a heartbeat every {} s, and a task is declared gone only after missing two",
                    shortest.as_secs_f64(),
                    crate::cluster::job::HEARTBEAT.as_secs_f64()
                ),
            )
            .help(format!("use {timeout_key} = {} or more (the default is 30)", shortest.as_secs_f64())),
        );
    }
    let part = match (multi_process && cluster.tasks.len() > 1, resolution.task) {
        // TF_CONFIG's evaluator, split off the training cluster, runs on its own.
        (_, Some(task)) if multi_process && task.role == Role::Evaluator => Part::Task(task),
        (false, _) => Part::Single,
        (true, None) => Part::Launcher,
        (true, Some(task)) => Part::Task(task),
    };
    ClusterPlan {
        source: cluster.source,
        tasks: cluster.tasks.iter().map(|(t, a)| (*t, a.clone())).collect(),
        chief: cluster.chief(),
        part,
        task: resolution.task,
        startup_timeout: duration("cluster.startup_timeout_s", spec.startup_timeout_s, Duration::from_millis(1), diags),
        timeout: duration(timeout_key, timeout_s, Duration::from_millis(1), diags),
        restarts: Restarts {
            max_restarts: spec.max_restarts,
            backoff: duration("cluster.restart_backoff_s", spec.restart_backoff_s, Duration::ZERO, diags),
        },
        token_file: spec.token_file.clone(),
        tls: spec.tls.as_ref().map(|t| TlsFiles {
            cert: t.cert_file.clone(),
            key: t.key_file.clone(),
            ca: t.ca_file.clone(),
        }),
    }
}

fn valid_address(addr: &str) -> bool {
    match addr.rsplit_once(':') {
        Some((host, port)) => !host.is_empty() && port.parse::<u16>().is_ok(),
        None => false,
    }
}
