//! Which cluster this job is and which task this process is. Like TensorFlow, a `TF_CONFIG`
//! that is set defines the cluster (overriding the spec's `[cluster]`); else a Kubernetes
//! Indexed Job that `trainrun manifest` wrote does; else `srun`'s Slurm variables; else the
//! spec. The task comes from `--task`, `TRAINRUN_TASK`, `TF_CONFIG`, the Job's completion
//! index or Slurm. Pure: the environment comes in as an argument.

use super::{Role, TaskId, kubernetes, slurm, tf_config};
use crate::spec::{ClusterSpec, Diagnostic, Tasks};
use serde::Serialize;
use std::collections::BTreeMap;

/// Where the cluster definition came from (`trainrun check` shows it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// No cluster: one process.
    Single,
    /// The spec's `[cluster]`.
    Spec,
    /// The `TF_CONFIG` environment variable.
    TfConfig,
    /// Slurm's variables under `srun`.
    Slurm,
    /// A Kubernetes Indexed Job: `JOB_COMPLETION_INDEX` and the pods' stable host names.
    Kubernetes,
}

impl Source {
    /// How `trainrun check` names it.
    pub fn describe(self) -> &'static str {
        match self {
            Source::Single => "no cluster",
            Source::Spec => "[cluster] in the spec",
            Source::TfConfig => "TF_CONFIG (overrides [cluster])",
            Source::Slurm => "Slurm (srun)",
            Source::Kubernetes => "a Kubernetes Indexed Job (JOB_COMPLETION_INDEX, pod host names)",
        }
    }
}

/// A task's address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", untagged)]
pub enum Address {
    /// On this host, on a free port the local launcher picks.
    Local,
    /// `host:port`.
    At(String),
}

impl Address {
    /// Whether the address is on this machine.
    pub fn is_local(&self) -> bool {
        match self {
            Address::Local => true,
            Address::At(a) => {
                let host = a.rsplit_once(':').map_or(a.as_str(), |(h, _)| h);
                matches!(host, "localhost" | "127.0.0.1" | "[::1]" | "::1")
            }
        }
    }
}

/// Every task of the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    /// Where this definition came from.
    pub source: Source,
    /// Tasks and their addresses, in rank order.
    pub tasks: BTreeMap<TaskId, Address>,
}

impl Cluster {
    /// One process, no cluster.
    pub fn single() -> Self {
        Cluster { source: Source::Single, tasks: BTreeMap::new() }
    }

    /// Tasks of `role`.
    pub fn count(&self, role: Role) -> usize {
        self.tasks.keys().filter(|t| t.role == role).count()
    }

    /// The chief: `chief:0`, or `worker:0` without one.
    pub fn chief(&self) -> Option<TaskId> {
        TaskId::chief_of(self.tasks.keys().filter(|t| matches!(t.role, Role::Chief | Role::Worker)))
    }

    /// Whether every task runs on this machine.
    pub fn is_local(&self) -> bool {
        self.tasks.values().all(Address::is_local)
    }
}

/// The cluster and this process's task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    /// The whole job.
    pub cluster: Cluster,
    /// This process's task; `None` when this process is the launcher of a local cluster (or
    /// there is no cluster).
    pub task: Option<TaskId>,
}

/// The spec's roles in rank order, each with its tasks.
pub(crate) fn roles(spec: &ClusterSpec) -> [(Role, &Option<Tasks>); 4] {
    [(Role::Chief, &spec.chief), (Role::Worker, &spec.worker), (Role::Ps, &spec.ps), (Role::Evaluator, &spec.evaluator)]
}

fn spec_cluster(spec: &ClusterSpec) -> Cluster {
    let mut tasks = BTreeMap::new();
    for (role, list) in roles(spec) {
        match list {
            None => {}
            Some(Tasks::Count(n)) => (0..n.get()).for_each(|i| {
                tasks.insert(TaskId::new(role, i), Address::Local);
            }),
            Some(Tasks::Addresses(a)) => a.iter().enumerate().for_each(|(i, addr)| {
                tasks.insert(TaskId::new(role, i as u32), Address::At(addr.clone()));
            }),
        }
    }
    Cluster { source: if tasks.is_empty() { Source::Single } else { Source::Spec }, tasks }
}

/// Resolves the cluster for a spec whose strategy spans processes (`multi_process`) from
/// `[cluster]`, the environment `env` and the `--task` flag. `port` is the control-plane port
/// of a Kubernetes Indexed Job's pods (`deploy.port`).
pub fn resolve(
    spec: &ClusterSpec,
    port: u16,
    multi_process: bool,
    env: &[(String, String)],
    task_flag: Option<&str>,
) -> Result<Resolution, Diagnostic> {
    let var = |k: &str| env.iter().find(|(key, v)| key == k && !v.trim().is_empty()).map(|(_, v)| v.clone());
    let parse_task = |text: &str, from: &str| {
        text.trim().parse::<TaskId>().map_err(|e| Diagnostic::error("cluster", format!("{from}: {e}")))
    };
    let named = match (task_flag, var("TRAINRUN_TASK")) {
        (Some(t), _) => Some(parse_task(t, "--task")?),
        (None, Some(t)) => Some(parse_task(&t, "TRAINRUN_TASK")?),
        (None, None) => None,
    };

    let indexed_job = if multi_process { kubernetes::resolve(spec, port, &var) } else { Ok(None) };
    let (cluster, task) = if let Some(text) = var("TF_CONFIG") {
        let (cluster, task) = tf_config::parse(&text).map_err(|m| Diagnostic::error("cluster", m))?;
        (cluster, named.or(task))
    } else if let Some((cluster, task)) = indexed_job.map_err(|m| Diagnostic::error("cluster", m))? {
        (cluster, named.or(Some(task)))
    } else if let Some((cluster, task)) =
        if multi_process { slurm::resolve(&var).map_err(|m| Diagnostic::error("cluster", m))? } else { None }
    {
        (cluster, named.or(Some(task)))
    } else {
        (spec_cluster(spec), named)
    };

    if let Some(flag) = task_flag
        && !multi_process
    {
        return Err(Diagnostic::error(
            "strategy.kind",
            format!("--task {} names a task of a cluster, but this spec's strategy runs in one process", flag.trim()),
        )
        .help("remove --task, or set strategy.kind = \"multi_worker_mirrored\" with a [cluster] of its tasks"));
    }
    check_addresses(&cluster)?;
    for role in [Role::Chief, Role::Evaluator] {
        let n = cluster.count(role);
        if n > 1 {
            return Err(Diagnostic::error(
                "cluster",
                format!("the cluster ({}) has {n} {role} tasks; at most one is allowed", cluster.source.describe()),
            )
            .help(format!("keep one {role}")));
        }
    }
    // TF_CONFIG's evaluator is split off the training cluster and runs on its own.
    let lone_evaluator = cluster.source == Source::TfConfig && task.is_some_and(|t| t.role == Role::Evaluator);
    if let Some(t) = task
        && !cluster.tasks.contains_key(&t)
        && cluster.source != Source::Single
        && !lone_evaluator
    {
        let have: Vec<String> = cluster.tasks.keys().map(ToString::to_string).collect();
        return Err(Diagnostic::error(
            "cluster",
            format!("this task is {t}, but the cluster ({}) has only {}", cluster.source.describe(), have.join(", ")),
        )
        .help("start each process with a task of the cluster"));
    }
    if task.is_none() && cluster.tasks.len() > 1 && !cluster.is_local() {
        return Err(Diagnostic::error(
            "cluster",
            format!(
                "the cluster ({}) spans other hosts, so this process must be told which task it is",
                cluster.source.describe()
            ),
        )
        .help("pass --task worker:N (or set TRAINRUN_TASK, or TF_CONFIG's \"task\") on every host"));
    }
    Ok(Resolution { cluster, task })
}

/// Where a task's address is written: `cluster.worker[1]` in the spec, or TF_CONFIG.
fn key_of(cluster: &Cluster, task: TaskId) -> String {
    match cluster.source {
        Source::Spec => format!("cluster.{}[{}]", task.role.as_str(), task.index),
        Source::Single | Source::TfConfig | Source::Slurm | Source::Kubernetes => "cluster".to_string(),
    }
}

/// Every listed address must be `host:port` with a port other tasks can dial (not 0, which
/// asks the OS for any free port), and no two tasks may share one.
fn check_addresses(cluster: &Cluster) -> Result<(), Diagnostic> {
    let from = cluster.source.describe();
    let mut seen: BTreeMap<String, TaskId> = BTreeMap::new();
    for (task, address) in &cluster.tasks {
        let Address::At(address) = address else { continue };
        let port = address.rsplit_once(':').map(|(_, p)| p.parse::<u16>());
        match port {
            Some(Ok(0)) => {
                return Err(Diagnostic::error(
                    key_of(cluster, *task),
                    format!("{task}'s address `{address}` (from {from}) has port 0, which no other task could dial"),
                )
                .help("give every task a fixed port, e.g. `host:2222`, or a count of local tasks (`worker = 2`) to let trainrun pick free ports"));
            }
            Some(Ok(_)) => {}
            Some(Err(_)) | None => {
                return Err(Diagnostic::error(
                    key_of(cluster, *task),
                    format!(
                        "{task}'s address `{address}` (from {from}) is not `host:port` with a port from 1 to 65535"
                    ),
                )
                .help("write addresses as `host:port`, e.g. `10.0.0.1:2222`"));
            }
        }
        let normalized = address.to_ascii_lowercase();
        if let Some(first) = seen.get(&normalized) {
            return Err(Diagnostic::error(
                key_of(cluster, *task),
                format!("{first} and {task} both have the address `{address}` (from {from}); each task needs its own"),
            )
            .help("give each task its own host:port"));
        }
        seen.insert(normalized, *task);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroU32;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn workers(n: u32) -> ClusterSpec {
        ClusterSpec { worker: NonZeroU32::new(n).map(Tasks::Count), ..ClusterSpec::default() }
    }

    #[test]
    fn a_count_of_local_workers_and_no_task_means_launch_them() {
        let r = resolve(&workers(2), 2222, true, &[], None).unwrap();
        assert_eq!((r.cluster.source, r.task, r.cluster.tasks.len()), (Source::Spec, None, 2));
        assert!(r.cluster.is_local());
        assert_eq!(r.cluster.chief(), Some(TaskId::new(Role::Worker, 0)));
    }

    #[test]
    fn tf_config_overrides_the_spec_and_names_the_task() {
        let tf = r#"{"cluster": {"worker": ["a:1", "b:1", "c:1"]}, "task": {"type": "worker", "index": 2}}"#;
        let r = resolve(&workers(2), 2222, true, &env(&[("TF_CONFIG", tf)]), None).unwrap();
        assert_eq!((r.cluster.source, r.cluster.tasks.len()), (Source::TfConfig, 3));
        assert_eq!(r.task, Some(TaskId::new(Role::Worker, 2)));
        // --task wins over TF_CONFIG's task, TRAINRUN_TASK over nothing.
        let r = resolve(&workers(2), 2222, true, &env(&[("TF_CONFIG", tf)]), Some("worker:1")).unwrap();
        assert_eq!(r.task, Some(TaskId::new(Role::Worker, 1)));
        let r = resolve(&workers(2), 2222, true, &env(&[("TRAINRUN_TASK", "worker:1")]), None).unwrap();
        assert_eq!(r.task, Some(TaskId::new(Role::Worker, 1)));
    }

    #[test]
    fn role_rules_are_errors() {
        let tf = r#"{"cluster": {"chief": ["a:1", "b:1"], "worker": ["c:1"]}, "task": {"type": "worker", "index": 0}}"#;
        let e = resolve(&workers(1), 2222, true, &env(&[("TF_CONFIG", tf)]), None).unwrap_err();
        assert!(e.message.contains("2 chief tasks"), "{}", e.message);
        let e = resolve(&workers(2), 2222, true, &[], Some("worker:5")).unwrap_err();
        assert!(e.message.contains("this task is worker:5"), "{}", e.message);
        let e = resolve(&workers(2), 2222, true, &[], Some("boss:1")).unwrap_err();
        assert!(e.message.contains("--task"), "{}", e.message);
    }

    #[test]
    fn addresses_must_be_distinct_dialable_ports() {
        let spec = |a: &[&str]| ClusterSpec {
            worker: Some(Tasks::Addresses(a.iter().map(|s| s.to_string()).collect())),
            ..ClusterSpec::default()
        };
        let e = resolve(&spec(&["h1:2222", "H1:2222"]), 2222, true, &[], Some("worker:0")).unwrap_err();
        assert_eq!(e.key, "cluster.worker[1]");
        assert!(e.message.contains("worker:0 and worker:1 both have the address `H1:2222`"), "{}", e.message);
        let e = resolve(&spec(&["h1:2222", "h2:0"]), 2222, true, &[], Some("worker:0")).unwrap_err();
        assert!(e.message.contains("port 0"), "{}", e.message);
        let tf = r#"{"cluster": {"worker": ["a:1", "a:1"]}, "task": {"type": "worker", "index": 0}}"#;
        let e = resolve(&workers(2), 2222, true, &env(&[("TF_CONFIG", tf)]), None).unwrap_err();
        assert!(e.message.contains("from TF_CONFIG"), "{}", e.message);
        let tf = r#"{"cluster": {"worker": ["a:1", "b"]}, "task": {"type": "worker", "index": 0}}"#;
        let e = resolve(&workers(2), 2222, true, &env(&[("TF_CONFIG", tf)]), None).unwrap_err();
        assert!(e.message.contains("is not `host:port`"), "{}", e.message);
        assert!(resolve(&spec(&["h1:2222", "h2:2222"]), 2222, true, &[], Some("worker:1")).is_ok());
    }

    #[test]
    fn a_task_flag_needs_a_multi_process_strategy() {
        let e = resolve(&ClusterSpec::default(), 2222, false, &[], Some("worker:1")).unwrap_err();
        assert_eq!(e.key, "strategy.kind");
        assert!(e.message.contains("--task worker:1"), "{}", e.message);
        assert!(resolve(&ClusterSpec::default(), 2222, false, &[], None).is_ok());
    }

    #[test]
    fn remote_clusters_need_a_task() {
        let spec = ClusterSpec {
            worker: Some(Tasks::Addresses(vec!["10.0.0.1:2222".into(), "10.0.0.2:2222".into()])),
            ..ClusterSpec::default()
        };
        let e = resolve(&spec, 2222, true, &[], None).unwrap_err();
        assert!(e.help.unwrap_or_default().contains("--task worker:N"));
    }

    #[test]
    fn a_tf_config_evaluator_runs_outside_the_training_cluster() {
        let tf = r#"{"cluster": {"chief": ["c:1"], "worker": ["w:1"], "evaluator": ["e:1"]},
                     "task": {"type": "evaluator", "index": "0"}, "environment": "cloud"}"#;
        let r = resolve(&workers(1), 2222, true, &env(&[("TF_CONFIG", tf)]), None).unwrap();
        assert_eq!(r.task, Some(TaskId::new(Role::Evaluator, 0)));
        assert_eq!(r.cluster.tasks.len(), 2);
    }

    #[test]
    fn an_indexed_job_pod_finds_its_task_from_its_index() {
        let e =
            env(&[("JOB_COMPLETION_INDEX", "1"), ("HOSTNAME", "mnist-1"), (kubernetes::SERVICE_VAR, "mnist-tasks")]);
        let r = resolve(&workers(2), 2222, true, &e, None).unwrap();
        assert_eq!((r.cluster.source, r.task), (Source::Kubernetes, Some(TaskId::new(Role::Worker, 1))));
        assert_eq!(
            r.cluster.tasks.get(&TaskId::new(Role::Worker, 0)),
            Some(&Address::At("mnist-0.mnist-tasks:2222".into()))
        );
        // A one-process strategy ignores the Job.
        assert_eq!(resolve(&workers(2), 2222, false, &e, None).unwrap().cluster.source, Source::Spec);
    }

    #[test]
    fn slurm_only_for_multi_process_strategies() {
        let e = env(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_STEP_NODELIST", "n1"),
            ("SLURM_STEP_TASKS_PER_NODE", "2"),
        ]);
        let r = resolve(&ClusterSpec::default(), 2222, true, &e, None).unwrap();
        assert_eq!((r.cluster.source, r.task), (Source::Slurm, Some(TaskId::new(Role::Worker, 1))));
        let r = resolve(&ClusterSpec::default(), 2222, false, &e, None).unwrap();
        assert_eq!(r.cluster.source, Source::Single);
    }
}
