//! TensorFlow's `TF_CONFIG`, read exactly as TensorFlow reads it, so Kubernetes templates and
//! launch scripts written for TensorFlow start trainrun unchanged.

use super::resolve::{Address, Cluster, Source};
use super::{Role, TaskId};
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Debug, Deserialize)]
struct TfConfig {
    #[serde(default)]
    cluster: BTreeMap<String, Vec<String>>,
    task: Option<TfTask>,
    // TensorFlow also accepts `environment` and `rpc_layer`; they mean nothing here.
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
    index: u32,
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

/// The cluster and (when given) this task, from `TF_CONFIG`'s JSON text.
pub fn parse(text: &str) -> Result<(Cluster, Option<TaskId>), String> {
    let config: TfConfig = serde_json::from_str(text).map_err(|e| {
        format!(
            "TF_CONFIG is not TensorFlow's JSON ({e}); expected e.g. \
             {{\"cluster\": {{\"worker\": [\"host1:2222\", \"host2:2222\"]}}, \"task\": {{\"type\": \"worker\", \"index\": 0}}}}"
        )
    })?;
    let mut tasks = BTreeMap::new();
    for (name, addresses) in &config.cluster {
        let role = role(name)?;
        for (i, address) in addresses.iter().enumerate() {
            tasks.insert(TaskId::new(role, i as u32), Address::At(address.clone()));
        }
    }
    if tasks.is_empty() {
        return Err("TF_CONFIG has an empty `cluster`: list the tasks' addresses by role".into());
    }
    let task = config.task.map(|t| role(&t.kind).map(|r| TaskId::new(r, t.index))).transpose()?;
    Ok((Cluster { source: Source::TfConfig, tasks }, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_tensorflow_tf_config() {
        let text = r#"{"cluster": {"chief": ["c:1"], "worker": ["w0:1", "w1:1"], "evaluator": ["e:1"]},
                      "task": {"type": "worker", "index": 1}, "environment": "cloud"}"#;
        let (cluster, task) = parse(text).unwrap();
        assert_eq!(task, Some(TaskId::new(Role::Worker, 1)));
        assert_eq!(cluster.tasks.len(), 4);
        assert_eq!(cluster.tasks.get(&TaskId::new(Role::Worker, 1)), Some(&Address::At("w1:1".into())));
    }

    #[test]
    fn bad_tf_config_says_what_is_expected() {
        assert!(parse("{").unwrap_err().contains("TF_CONFIG is not TensorFlow's JSON"));
        assert!(parse(r#"{"cluster": {"master": ["a:1"]}}"#).unwrap_err().contains("call it `chief`"));
        assert!(parse(r#"{"cluster": {}}"#).unwrap_err().contains("empty"));
    }
}
