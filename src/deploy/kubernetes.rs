//! Plain Kubernetes: a ConfigMap with the resolved spec, a headless Service, and an Indexed
//! Job of one pod per task (completions = parallelism = tasks), whose pods find their task
//! from `JOB_COMPLETION_INDEX` and reach each other at `<job>-<i>.<service>`
//! ([`crate::cluster::kubernetes`]). With them: the token Secret (unless `deploy.token_secret`
//! names one) and the claim for the run folder (unless `deploy.volume` names one).
//!
//! Failures: exit codes 2, 3 and 4 (spec, unsupported, data) fail the Job at once; preemption
//! (exit 6, or a disruption such as a node drain) is not counted against `backoffLimit`; any
//! other failure recreates the pod with its index, and the job resumes from the chief's backup.
//! Because every task of a job stops when one dies, one restart costs a failure per task:
//! `backoffLimit` is `cluster.max_restarts` × tasks.
//!
//! A sweep spec becomes an Indexed Job of one index per trial instead ([`render_sweep`]):
//! `completions` = trials, `parallelism` = `--parallel`, each pod running `trainrun sweep SPEC
//! --trial $(JOB_COMPLETION_INDEX)` into the shared run volume; a multi-worker trial starts its
//! workers inside its pod, so no Service is needed.

use super::{BINARY, DeployJob, ManifestError, RUNS_DIR, SPEC_DIR, TLS_DIR, TrialArray, cpu, yaml};
use crate::spec::VolumeSpec;
use serde_json::{Value, json};

/// The container's name; `podFailurePolicy` rules name it.
const CONTAINER: &str = "trainrun";

pub(super) fn render(job: &DeployJob) -> Result<String, ManifestError> {
    let mut docs = shared_objects(job);
    docs.push(service(job));
    docs.push(indexed_job(job));
    yaml(&docs)
}

/// The Secret, claim and ConfigMap both Kubernetes targets need.
pub(super) fn shared_objects(job: &DeployJob) -> Vec<Value> {
    let mut docs = Vec::new();
    if job.deploy.token_secret.is_none() {
        docs.push(json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": metadata(job, &format!("{}-token", job.name)),
            "type": "Opaque",
            "stringData": { "token": job.token },
        }));
    }
    if let VolumeSpec::New { size, storage_class, access_mode } = &job.deploy.volume {
        let mut spec = json!({
            "accessModes": [access_mode.kubernetes()],
            "resources": { "requests": { "storage": size } },
        });
        if let Some(class) = storage_class {
            spec["storageClassName"] = json!(class);
        }
        docs.push(json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": metadata(job, &format!("{}-runs", job.name)),
            "spec": spec,
        }));
    }
    docs.push(json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(job, &format!("{}-spec", job.name)),
        "data": { "spec.toml": job.spec_toml },
    }));
    docs
}

fn labels(job: &DeployJob) -> Value {
    json!({ "app.kubernetes.io/name": "trainrun", "app.kubernetes.io/instance": job.name })
}

pub(super) fn metadata(job: &DeployJob, name: &str) -> Value {
    let mut m = json!({ "name": name, "labels": labels(job) });
    if let Some(ns) = &job.namespace {
        m["namespace"] = json!(ns);
    }
    m
}

/// The task container: `name` and the port's name are the operator's when it has rules.
pub(super) fn container(job: &DeployJob, name: &str, port_name: &str, extra_env: Vec<Value>) -> Value {
    let secret = job.deploy.token_secret.clone().unwrap_or_else(|| format!("{}-token", job.name));
    let mut env = vec![
        json!({ "name": "TRAINRUN_JOB_TOKEN", "valueFrom": { "secretKeyRef": { "name": secret, "key": "token" } } }),
        // Datasets download once onto the run volume, and survive a pod's replacement.
        json!({ "name": "XDG_CACHE_HOME", "value": format!("{RUNS_DIR}/cache") }),
    ];
    env.extend(extra_env);
    let mut mounts = vec![
        json!({ "name": "spec", "mountPath": SPEC_DIR, "readOnly": true }),
        json!({ "name": "runs", "mountPath": RUNS_DIR }),
    ];
    if job.spec.cluster.tls.is_some() {
        mounts.push(json!({ "name": "tls", "mountPath": TLS_DIR, "readOnly": true }));
    }
    let mut c = json!({
        "name": name,
        "image": job.image,
        "command": [BINARY],
        "args": [format!("{SPEC_DIR}/spec.toml")],
        "env": env,
        "ports": [{ "name": port_name, "containerPort": job.deploy.port }],
        "volumeMounts": mounts,
    });
    let mut requests = serde_json::Map::new();
    if let Some(cpu) = cpu(job) {
        requests.insert("cpu".into(), json!(cpu));
    }
    if let Some(memory) = &job.deploy.memory {
        requests.insert("memory".into(), json!(memory));
    }
    if !requests.is_empty() {
        c["resources"] = json!({ "requests": requests });
    }
    c
}

pub(super) fn volumes(job: &DeployJob) -> Value {
    let claim = match &job.deploy.volume {
        VolumeSpec::Claim { name } => name.clone(),
        VolumeSpec::New { .. } => format!("{}-runs", job.name),
    };
    let mut v = vec![
        json!({ "name": "spec", "configMap": { "name": format!("{}-spec", job.name) } }),
        json!({ "name": "runs", "persistentVolumeClaim": { "claimName": claim } }),
    ];
    if job.spec.cluster.tls.is_some() {
        let secret = job.deploy.tls_secret.clone().unwrap_or_else(|| format!("{}-tls", job.name));
        v.push(json!({ "name": "tls", "secret": { "secretName": secret } }));
    }
    json!(v)
}

/// The pod spec every task shares.
pub(super) fn pod_spec(job: &DeployJob, container: Value) -> Value {
    let mut spec = json!({
        "terminationGracePeriodSeconds": job.grace_s,
        "containers": [container],
        "volumes": volumes(job),
    });
    if !job.deploy.node_selector.is_empty() {
        spec["nodeSelector"] = json!(job.deploy.node_selector);
    }
    spec
}

fn service(job: &DeployJob) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(job, &job.name),
        "spec": {
            "clusterIP": "None",
            // Tasks meet before any is ready: their names must resolve from the start.
            "publishNotReadyAddresses": true,
            "selector": labels(job),
            "ports": [{ "name": "control", "port": job.deploy.port, "targetPort": job.deploy.port }],
        },
    })
}

/// The objects of a sweep: its trials as one Indexed Job.
pub(super) fn render_sweep(job: &DeployJob, array: TrialArray) -> Result<String, ManifestError> {
    let mut docs = shared_objects(job);
    // The index the Job controller gives each pod, defined here so `$(…)` in args expands.
    let index = json!({
        "name": crate::cluster::kubernetes::INDEX_VAR,
        "valueFrom": { "fieldRef": { "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']" } },
    });
    let mut c = container(job, CONTAINER, "control", vec![index]);
    let spec = format!("{SPEC_DIR}/spec.toml");
    let trial = format!("$({})", crate::cluster::kubernetes::INDEX_VAR);
    c["args"] = json!(["sweep", spec, "--trial", trial]);
    if let Some(c) = c.as_object_mut() {
        // A trial's workers talk inside its pod.
        c.remove("ports");
    }
    let mut pod = pod_spec(job, c);
    pod["restartPolicy"] = json!("Never");
    docs.push(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(job, &job.name),
        "spec": {
            "completionMode": "Indexed",
            "completions": array.trials,
            "parallelism": array.parallel,
            "backoffLimit": job.spec.cluster.max_restarts as usize * array.trials,
            "podFailurePolicy": { "rules": failure_rules(&[2]) },
            "template": { "metadata": { "labels": labels(job) }, "spec": pod },
        },
    }));
    yaml(&docs)
}

/// What a failed pod means: exit codes `fatal` fail the Job at once; a preemption after a clean
/// backup (exit 6, or a disruption such as a node drain) does not count against `backoffLimit`.
fn failure_rules(fatal: &[u8]) -> Value {
    let on_exit = |action: &str, codes: &[u8]| {
        // Kubernetes 1.25 requires `onPodConditions` in every rule; empty means unused.
        json!({
            "action": action,
            "onExitCodes": { "containerName": CONTAINER, "operator": "In", "values": codes },
            "onPodConditions": [],
        })
    };
    json!([
        on_exit("FailJob", fatal),
        on_exit("Ignore", &[6]),
        json!({ "action": "Ignore", "onPodConditions": [{ "type": "DisruptionTarget", "status": "True" }] }),
    ])
}

fn indexed_job(job: &DeployJob) -> Value {
    let tasks = job.tasks.len();
    let env = vec![json!({ "name": crate::cluster::kubernetes::SERVICE_VAR, "value": job.name })];
    let mut pod = pod_spec(job, container(job, CONTAINER, "control", env));
    pod["subdomain"] = json!(job.name);
    pod["restartPolicy"] = json!("Never");
    json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(job, &job.name),
        "spec": {
            "completionMode": "Indexed",
            "completions": tasks,
            "parallelism": tasks,
            "backoffLimit": job.spec.cluster.max_restarts as usize * tasks,
            // Spec, unsupported and data errors: another try fails alike.
            "podFailurePolicy": { "rules": failure_rules(&[2, 3, 4]) },
            "template": { "metadata": { "labels": labels(job) }, "spec": pod },
        },
    })
}
