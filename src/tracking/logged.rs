//! What a run logs to MLflow: the resolved spec flattened into params (`optimizer.learning_rate`,
//! `model.layers.1.units`), the lines of `metrics.jsonl` as metrics at their optimizer step,
//! and tags saying where the run came from. MLflow's rules are kept here: keys of letters,
//! digits and `_ - . / space` up to 250 characters, param values up to 500 characters (the
//! limit of MLflow 2's older servers; MLflow 3 takes more).

use super::client::MetricPoint;
use crate::train::metrics_log::{MetricsEvent, MetricsLine};
use serde_json::Value;

/// Longest key MLflow takes.
const MAX_KEY: usize = 250;
/// Longest param value every MLflow server takes.
pub const MAX_PARAM_VALUE: usize = 500;

/// A key MLflow accepts: other characters become `_`, and it is cut at [`MAX_KEY`].
pub fn key(raw: &str) -> String {
    raw.chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/' | ' ') { c } else { '_' })
        .take(MAX_KEY)
        .collect()
}

/// A param value cut to [`MAX_PARAM_VALUE`] characters, ending in `...` when cut.
pub fn param_value(raw: &str) -> String {
    if raw.chars().count() <= MAX_PARAM_VALUE {
        return raw.to_string();
    }
    let kept: String = raw.chars().take(MAX_PARAM_VALUE - 3).collect();
    kept + "..."
}

/// The params of a resolved spec (as JSON): one per leaf, keyed by its path; lists index by
/// position. `run.tracking` is left out: where a run is logged is no parameter of it, and a
/// server address may carry credentials.
pub fn params(spec: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    flatten(spec, &mut String::new(), &mut out);
    out.retain(|(k, _)| !k.starts_with("run.tracking"));
    out
}

fn flatten(value: &Value, path: &mut String, out: &mut Vec<(String, String)>) {
    let len = path.len();
    let mut child = |name: &str, v: &Value, path: &mut String| {
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(name);
        flatten(v, path, out);
        path.truncate(len);
    };
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                child(k, v, path);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for (i, v) in items.iter().enumerate() {
                child(&i.to_string(), v, path);
            }
        }
        Value::String(s) => out.push((key(path), param_value(s))),
        Value::Null => {}
        other => out.push((key(path), param_value(&other.to_string()))),
    }
}

/// The metrics of a `metrics.jsonl` line, at its optimizer step: `step` lines under Keras's
/// names (`loss`, `accuracy`, `learning_rate`, `examples_per_s`, listed metrics), epoch lines
/// as `epoch_*`, and the validation values (`val_*`) of an evaluation once per step.
/// `evaluated_at` is the step of the last validation values logged.
pub fn metrics(line: &MetricsLine, timestamp_ms: u64, evaluated_at: &mut Option<u64>) -> Vec<MetricPoint> {
    let point = |key: String, value: f64| MetricPoint { key, value, timestamp_ms, step: line.step };
    let value = serde_json::to_value(line).unwrap_or(Value::Null);
    let Value::Object(fields) = value else { return Vec::new() };
    let numbers = fields.iter().filter_map(|(k, v)| Some((k.as_str(), v.as_f64()?)));
    let mut out = Vec::new();
    let fresh_evaluation = line.val_loss.is_some() && *evaluated_at != Some(line.step);
    for (name, v) in numbers {
        if matches!(name, "epoch" | "step" | "wall_s") {
            continue;
        }
        let validation = name.starts_with("val_");
        match (line.event, validation) {
            (_, true) if fresh_evaluation => out.push(point(key(name), v)),
            (_, true) => {}
            (MetricsEvent::Step, false) => out.push(point(key(name), v)),
            (MetricsEvent::Epoch, false) => out.push(point(key(&format!("epoch_{name}")), v)),
            // An evaluation line repeats the training values of its epoch so far.
            (MetricsEvent::Evaluation, false) => {}
        }
    }
    if fresh_evaluation {
        *evaluated_at = Some(line.step);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_spec_flattens_to_one_param_per_leaf_within_mlflows_limits() {
        let long = "x".repeat(700);
        let spec = json!({
            "run": { "seed": 7, "tracking": { "mlflow": "http://u:p@h" } },
            "model": { "layers": [{ "units": 32 }, { "kind": "dense" }] },
            "data": { "path": long, "odd key[0]": true },
        });
        let got = params(&spec);
        assert!(got.contains(&("run.seed".into(), "7".into())));
        assert!(got.contains(&("model.layers.0.units".into(), "32".into())));
        assert!(got.contains(&("model.layers.1.kind".into(), "dense".into())));
        assert!(got.contains(&("data.odd key_0_".into(), "true".into())));
        let path = got.iter().find(|(k, _)| k == "data.path").map(|(_, v)| v.clone()).unwrap_or_default();
        assert_eq!(path.chars().count(), MAX_PARAM_VALUE);
        assert!(path.ends_with("..."));
        assert!(got.iter().all(|(k, _)| !k.starts_with("run.tracking")), "credentials stay off the server");
        assert_eq!(key(&"k".repeat(300)).len(), MAX_KEY);
    }
}
