//! The cluster of a Kubernetes Indexed Job that `trainrun manifest` wrote, without TF_CONFIG.
//! The Job runs one pod per task with `completionMode: Indexed`; the kubelet gives each pod
//! `JOB_COMPLETION_INDEX` and the host name `<job>-<index>`, and with `subdomain` set to the
//! job's headless Service every pod is reachable at `<job>-<index>.<service>` (also before it is
//! ready: the Service publishes not-ready addresses). A pod the Job controller replaces keeps
//! its index, so it is the same task again.
//!
//! Index *i* is the *i*-th task in rank order of the spec's `[cluster]` counts: the chief
//! first, then workers, parameter servers and the evaluator. The manifest sets
//! [`SERVICE_VAR`] to the Service's name; without it, an index alone (any Indexed Job) does not
//! make trainrun a cluster.

use super::TaskId;
use super::resolve::{Address, Cluster, Source};
use crate::spec::{ClusterSpec, Tasks};
use std::collections::BTreeMap;

/// Names the job's headless Service; set by the manifest.
pub const SERVICE_VAR: &str = "TRAINRUN_KUBERNETES_SERVICE";
/// The pod's index in the Indexed Job; set by the Job controller.
pub const INDEX_VAR: &str = "JOB_COMPLETION_INDEX";

/// Every task of the spec's `[cluster]`, in rank order.
pub fn tasks(spec: &ClusterSpec, scheduler: &str) -> Result<Vec<TaskId>, String> {
    let mut tasks = Vec::new();
    for (role, entry) in super::resolve::roles(spec) {
        match entry {
            None => {}
            Some(Tasks::Count(n)) => tasks.extend((0..n.get()).map(|i| TaskId::new(role, i))),
            Some(Tasks::Addresses(_)) => {
                return Err(format!(
                    "cluster.{role} lists addresses, but {scheduler} places the tasks itself: \
                     give a count, e.g. {role} = 2"
                ));
            }
        }
    }
    Ok(tasks)
}

/// The cluster and this pod's task, when this process runs in a pod of such a Job; `None`
/// otherwise. `port` is every task's control-plane port (`deploy.port`).
pub fn resolve(
    spec: &ClusterSpec,
    port: u16,
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<(Cluster, TaskId)>, String> {
    let (Some(service), Some(index)) = (var(SERVICE_VAR), var(INDEX_VAR)) else {
        return Ok(None);
    };
    let index: usize = index.trim().parse().map_err(|_| format!("{INDEX_VAR} = `{index}` is not a number"))?;
    let hostname = var("HOSTNAME").ok_or_else(|| {
        format!("{INDEX_VAR} and {SERVICE_VAR} are set but HOSTNAME is not: run in a pod of the Indexed Job")
    })?;
    let suffix = format!("-{index}");
    let job = hostname.trim().strip_suffix(&suffix).filter(|j| !j.is_empty()).ok_or_else(|| {
        format!(
            "the pod's host name `{hostname}` is not `<job>-{index}`: an Indexed Job's pods are named by their \
             index; run trainrun in a Job with completionMode: Indexed (`trainrun manifest` writes one)"
        )
    })?;
    let all = tasks(spec, "a Kubernetes Indexed Job")?;
    let Some(&task) = all.get(index) else {
        return Err(format!(
            "{INDEX_VAR} = {index}, but the spec's [cluster] has {} tasks: set the Job's completions to {}",
            all.len(),
            all.len()
        ));
    };
    let tasks: BTreeMap<TaskId, Address> =
        all.iter().enumerate().map(|(i, t)| (*t, Address::At(format!("{job}-{i}.{service}:{port}")))).collect();
    Ok(Some((Cluster { source: Source::Kubernetes, tasks }, task)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Role;
    use std::num::NonZeroU32;

    fn spec(chief: u32, worker: u32, evaluator: u32) -> ClusterSpec {
        let count = |n: u32| NonZeroU32::new(n).map(Tasks::Count);
        ClusterSpec {
            chief: count(chief),
            worker: count(worker),
            evaluator: count(evaluator),
            ..ClusterSpec::default()
        }
    }

    fn var<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn indexes_follow_rank_order() {
        let env = [(INDEX_VAR, "3"), ("HOSTNAME", "my-job-3"), (SERVICE_VAR, "my-job")];
        let (cluster, task) = resolve(&spec(1, 2, 1), 2222, &var(&env)).unwrap().unwrap();
        assert_eq!(task, TaskId::new(Role::Evaluator, 0));
        let shown: Vec<String> = cluster.tasks.iter().map(|(t, a)| format!("{t}={a:?}")).collect();
        assert_eq!(
            shown,
            [
                "chief:0=At(\"my-job-0.my-job:2222\")",
                "worker:0=At(\"my-job-1.my-job:2222\")",
                "worker:1=At(\"my-job-2.my-job:2222\")",
                "evaluator:0=At(\"my-job-3.my-job:2222\")",
            ]
        );
    }

    #[test]
    fn outside_such_a_job_nothing_changes() {
        assert!(resolve(&spec(0, 2, 0), 2222, &var(&[(INDEX_VAR, "0")])).unwrap().is_none());
    }

    #[test]
    fn mistakes_are_named() {
        let e = resolve(&spec(0, 2, 0), 2222, &var(&[(INDEX_VAR, "2"), ("HOSTNAME", "j-2"), (SERVICE_VAR, "j")]));
        assert!(e.unwrap_err().contains("has 2 tasks"));
        let e = resolve(&spec(0, 2, 0), 2222, &var(&[(INDEX_VAR, "1"), ("HOSTNAME", "j-0"), (SERVICE_VAR, "j")]));
        assert!(e.unwrap_err().contains("is not `<job>-1`"));
        let listed = ClusterSpec { worker: Some(Tasks::Addresses(vec!["a:1".into()])), ..ClusterSpec::default() };
        assert!(tasks(&listed, "Slurm").unwrap_err().contains("give a count"));
    }
}
