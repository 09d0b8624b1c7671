//! TensorFlow's `TF_CONFIG`, read as TensorFlow and the schedulers that write it do, so
//! Kubernetes templates, Kubeflow's TFJob operator and launch scripts written for TensorFlow
//! start trainrun unchanged: an `"index": "1"` string is a number, Kubeflow's
//! `"environment": "cloud"` means nothing, and an evaluator in the cluster list is not part of
//! the training cluster (TensorFlow splits it off the same way).

use super::resolve::{Address, Cluster, Source};
use super::{Role, TaskId};
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Debug, Deserialize)]
struct TfConfig {
    // Values stay JSON until checked, so a sparse cluster gets its own message.
    #[serde(default)]
    cluster: BTreeMap<String, serde_json::Value>,
    task: Option<TfTask>,
    // TensorFlow also accepts `environment` (Kubeflow writes "cloud") and `rpc_layer`; they
    // mean nothing here.
    #[serde(default, rename = "environment")]
    _environment: Option<serde_json::Value>,
    #[serde(default, rename = "rpc_layer")]
    _rpc_layer: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
struct TfTask {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    index: Index,
}

/// A task index as templates write it: `1` or `"1"`.
#[derive(Debug, Default, Deserialize)]
#[serde(untagged)]
enum Index {
    #[default]
    Missing,
    Number(u32),
    Text(String),
}

impl Index {
    fn value(&self) -> Result<u32, String> {
        match self {
            Index::Missing => Ok(0),
            Index::Number(n) => Ok(*n),
            Index::Text(t) => t
                .trim()
                .parse()
                .map_err(|_| format!("TF_CONFIG's task index \"{t}\" is not a number: write e.g. \"index\": 1")),
        }
    }
}

fn role(name: &str) -> Result<Role, String> {
    match name {
        "chief" => Ok(Role::Chief),
        "worker" => Ok(Role::Worker),
        "ps" => Ok(Role::Ps),
        "evaluator" => Ok(Role::Evaluator),
        "master" => Err("TF_CONFIG uses the role `master`, TensorFlow 1's name for the chief; call it `chief`".into()),
        other => Err(format!("TF_CONFIG names an unknown role `{other}`; roles are chief, worker, ps and evaluator")),
    }
}

fn addresses(name: &str, value: &serde_json::Value) -> Result<Vec<String>, String> {
    use serde_json::Value;
    match value {
        Value::Array(items) => items
            .iter()
            .map(|a| match a {
                Value::String(s) => Ok(s.clone()),
                other => Err(format!("TF_CONFIG's cluster.{name} lists {other}, which is not a \"host:port\" string")),
            })
            .collect(),
        Value::Object(_) => Err(format!(
            "TF_CONFIG's cluster.{name} is a map of index to address: TensorFlow's sparse cluster \
             (Kubeflow's enableDynamicWorker), which trainrun does not support, since every task must \
             know every other; list all addresses, e.g. \"{name}\": [\"host1:2222\", \"host2:2222\"] \
             (turn enableDynamicWorker off)"
        )),
        other => Err(format!("TF_CONFIG's cluster.{name} is {other}; expected a list of \"host:port\" strings")),
    }
}

/// The cluster and (when given) this task, from `TF_CONFIG`'s JSON text. An evaluator listed
/// in the cluster is left out of it: the training tasks neither wait for it nor fail with it,
/// and the evaluator task itself (whose task is then outside the cluster) watches the chief's
/// checkpoints on its own.
pub fn parse(text: &str) -> Result<(Cluster, Option<TaskId>), String> {
    let config: TfConfig = serde_json::from_str(text).map_err(|e| {
        format!(
            "TF_CONFIG is not TensorFlow's JSON ({e}); expected e.g. \
             {{\"cluster\": {{\"worker\": [\"host1:2222\", \"host2:2222\"]}}, \"task\": {{\"type\": \"worker\", \"index\": 0}}}}"
        )
    })?;
    let mut tasks = BTreeMap::new();
    for (name, value) in &config.cluster {
        let role = role(name)?;
        let list = addresses(name, value)?;
        if role == Role::Evaluator {
            continue;
        }
        for (i, address) in list.into_iter().enumerate() {
            tasks.insert(TaskId::new(role, i as u32), Address::At(address));
        }
    }
    if tasks.is_empty() {
        return Err(
            "TF_CONFIG has no training tasks in `cluster`: list the chief's and workers' addresses by role".into()
        );
    }
    let task = match config.task {
        None => None,
        Some(t) => Some(TaskId::new(role(&t.kind)?, t.index.value()?)),
    };
    Ok((Cluster { source: Source::TfConfig, tasks }, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_tensorflow_tf_config() {
        let text = r#"{"cluster": {"chief": ["c:1"], "worker": ["w0:1", "w1:1"]},
                      "task": {"type": "worker", "index": 1}}"#;
        let (cluster, task) = parse(text).unwrap();
        assert_eq!(task, Some(TaskId::new(Role::Worker, 1)));
        assert_eq!(cluster.tasks.len(), 3);
        assert_eq!(cluster.tasks.get(&TaskId::new(Role::Worker, 1)), Some(&Address::At("w1:1".into())));
    }

    /// What Kubeflow's TFJob operator (release 1.9) writes: string-free index, `environment`,
    /// one headless Service per replica, and the evaluator in the cluster list.
    #[test]
    fn reads_what_the_tfjob_operator_writes() {
        let text = r#"{"cluster":{"chief":["mnist-chief-0.ns.svc:2222"],
            "evaluator":["mnist-evaluator-0.ns.svc:2222"],
            "worker":["mnist-worker-0.ns.svc:2222","mnist-worker-1.ns.svc:2222"]},
            "task":{"type":"worker","index":1},"environment":"cloud"}"#;
        let (cluster, task) = parse(text).unwrap();
        assert_eq!(task, Some(TaskId::new(Role::Worker, 1)));
        let names: Vec<String> = cluster.tasks.keys().map(ToString::to_string).collect();
        assert_eq!(names, ["chief:0", "worker:0", "worker:1"], "the evaluator is not a training task");
        let evaluator = text.replace(r#""type":"worker","index":1"#, r#""type":"evaluator","index":0"#);
        let (cluster, task) = parse(&evaluator).unwrap();
        assert_eq!(task, Some(TaskId::new(Role::Evaluator, 0)));
        assert!(!cluster.tasks.contains_key(&TaskId::new(Role::Evaluator, 0)));
    }

    #[test]
    fn string_indexes_are_numbers() {
        let text = r#"{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": "1"}}"#;
        assert_eq!(parse(text).unwrap().1, Some(TaskId::new(Role::Worker, 1)));
        let bad = text.replace(r#""1""#, r#""one""#);
        assert!(parse(&bad).unwrap_err().contains(r#"task index "one" is not a number"#));
    }

    #[test]
    fn bad_tf_config_says_what_is_expected() {
        assert!(parse("{").unwrap_err().contains("TF_CONFIG is not TensorFlow's JSON"));
        assert!(parse(r#"{"cluster": {"master": ["a:1"]}}"#).unwrap_err().contains("call it `chief`"));
        assert!(parse(r#"{"cluster": {}}"#).unwrap_err().contains("no training tasks"));
        let sparse = r#"{"cluster": {"worker": {"1": "b:1"}, "ps": ["p:1"]}, "task": {"type": "worker", "index": 1}}"#;
        let e = parse(sparse).unwrap_err();
        assert!(e.contains("sparse cluster") && e.contains("enableDynamicWorker"), "{e}");
    }
}
