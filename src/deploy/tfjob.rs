//! A Kubeflow TFJob for the training operator, the only maintained operator that sets
//! TF_CONFIG itself: one replica spec per role of the spec's `[cluster]` (Chief, Worker, PS,
//! Evaluator), each pod's container named `tensorflow` with its port named `tfjob-port`, as the
//! operator requires to find them. The operator lists the evaluator in every TF_CONFIG;
//! trainrun leaves it out of the training cluster, and the evaluator watches the chief's
//! checkpoints on the shared run volume until the chief's `run.json` says training ended.
//!
//! Pods restart in place on failure (`OnFailure`), keeping their Service names; `backoffLimit`
//! counts those restarts. `cleanPodPolicy: None` lets the evaluator finish the last checkpoint
//! after the chief is done.

use super::kubernetes::{container, metadata, pod_spec, shared_objects};
use super::{DeployJob, ManifestError, yaml};
use crate::cluster::Role;
use serde_json::{Map, Value, json};

fn replica_type(role: Role) -> &'static str {
    match role {
        Role::Chief => "Chief",
        Role::Worker => "Worker",
        Role::Ps => "PS",
        Role::Evaluator => "Evaluator",
    }
}

pub(super) fn render(job: &DeployJob) -> Result<String, ManifestError> {
    let mut docs = shared_objects(job);
    let mut replicas = Map::new();
    for role in [Role::Chief, Role::Worker, Role::Ps, Role::Evaluator] {
        let count = job.tasks.iter().filter(|t| t.role == role).count();
        if count == 0 {
            continue;
        }
        let pod = pod_spec(job, container(job, "tensorflow", "tfjob-port", Vec::new()));
        replicas.insert(
            replica_type(role).to_owned(),
            json!({
                "replicas": count,
                "restartPolicy": "OnFailure",
                "template": { "metadata": { "labels": metadata(job, &job.name)["labels"] }, "spec": pod },
            }),
        );
    }
    docs.push(json!({
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": metadata(job, &job.name),
        "spec": {
            "runPolicy": {
                "backoffLimit": job.spec.cluster.max_restarts as usize * job.tasks.len(),
                "cleanPodPolicy": "None",
            },
            "tfReplicaSpecs": Value::Object(replicas),
        },
    }));
    yaml(&docs)
}
