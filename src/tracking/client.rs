//! MLflow's REST API, the calls trainrun makes (`/api/2.0/mlflow/...`): an experiment by name,
//! a run created or reopened, `log-batch`, the run's end, and artifact uploads through the
//! server's artifact proxy (`/api/2.0/mlflow-artifacts/artifacts/...`, which `mlflow server`
//! serves by default since MLflow 2). Plain HTTP with JSON bodies through `ureq`.

use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

/// MLflow's limits on one `log-batch` call.
pub const MAX_METRICS_PER_BATCH: usize = 1000;
/// Params per `log-batch`.
pub const MAX_PARAMS_PER_BATCH: usize = 100;

/// Why a call did not go through.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CallError {
    /// No answer (refused, timed out, cut): worth retrying.
    #[error("{0}")]
    Unreachable(String),
    /// The server answered with an error status. 5xx and 429 are worth retrying; any other
    /// status is the server refusing what was sent, which a retry would not change.
    #[error("HTTP {status}: {message}")]
    Status {
        /// The HTTP status.
        status: u16,
        /// MLflow's `message`, or the body.
        message: String,
    },
}

impl CallError {
    /// Whether the same call may succeed later.
    pub fn retryable(&self) -> bool {
        match self {
            CallError::Unreachable(_) => true,
            CallError::Status { status, .. } => *status >= 500 || *status == 429,
        }
    }
}

/// A run on the server.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunRef {
    /// The server it is on.
    pub tracking_uri: String,
    /// Its experiment.
    pub experiment_id: String,
    /// Its id.
    pub run_id: String,
    /// Where its artifacts go under the artifact proxy (`<experiment>/<run>/artifacts`), when
    /// the server proxies them.
    pub artifact_path: Option<String>,
}

/// What the server has of a run: its status and the last time it heard from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunState {
    /// `RUNNING`, `FINISHED`, `FAILED`, `KILLED` or `SCHEDULED`.
    pub status: String,
    /// The latest timestamp of its metrics, else its start (ms since the Unix epoch).
    pub last_ms: u64,
}

/// One metric value at a step.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricPoint {
    /// Its key.
    pub key: String,
    /// The value.
    pub value: f64,
    /// Milliseconds since the Unix epoch.
    pub timestamp_ms: u64,
    /// Optimizer step.
    pub step: u64,
}

/// A client of one tracking server.
pub struct MlflowClient {
    base: String,
    agent: ureq::Agent,
}

impl MlflowClient {
    /// A client of the server at `uri` (`http://host:port`, maybe with a path prefix).
    pub fn new(uri: &str) -> MlflowClient {
        let config = ureq::Agent::config_builder()
            .timeout_connect(Some(Duration::from_secs(2)))
            .timeout_global(Some(Duration::from_secs(60)))
            .http_status_as_error(false)
            .build();
        MlflowClient { base: uri.trim_end_matches('/').to_string(), agent: ureq::Agent::new_with_config(config) }
    }

    /// The id of the experiment `name`, created when missing.
    pub fn experiment_id(&self, name: &str) -> Result<String, CallError> {
        let url = format!("{}/api/2.0/mlflow/experiments/get-by-name", self.base);
        let found = self.agent.get(&url).query("experiment_name", name).call();
        match answer(found) {
            Ok(v) => return text(&v["experiment"]["experiment_id"]),
            Err(CallError::Status { status: 404, .. }) => {}
            Err(e) => return Err(e),
        }
        match self.post("experiments/create", &json!({ "name": name })) {
            Ok(v) => text(&v["experiment_id"]),
            // Another trial created it between our two calls.
            Err(CallError::Status { status: 400, message }) if message.contains("already exists") => {
                let again = self.agent.get(&url).query("experiment_name", name).call();
                text(&answer(again)?["experiment"]["experiment_id"])
            }
            Err(e) => Err(e),
        }
    }

    /// Creates a run named `name` in `experiment_id` with `tags`, started at `start_ms`.
    pub fn create_run(
        &self,
        experiment_id: &str,
        name: &str,
        start_ms: u64,
        tags: &[(String, String)],
    ) -> Result<RunRef, CallError> {
        let tags: Vec<Value> = tags.iter().map(|(k, v)| json!({ "key": k, "value": v })).collect();
        let body = json!({ "experiment_id": experiment_id, "run_name": name, "start_time": start_ms, "tags": tags });
        let v = self.post("runs/create", &body)?;
        let info = &v["run"]["info"];
        Ok(RunRef {
            tracking_uri: self.base.clone(),
            experiment_id: experiment_id.to_string(),
            run_id: text(&info["run_id"])?,
            artifact_path: info["artifact_uri"].as_str().and_then(proxied_path),
        })
    }

    /// Sets a run's status (`RUNNING`, `FINISHED`, `FAILED`, `KILLED`), with its end time once
    /// it ended.
    pub fn update_run(&self, run_id: &str, status: &str, end_ms: Option<u64>) -> Result<(), CallError> {
        let mut body = json!({ "run_id": run_id, "status": status });
        if let Some(end) = end_ms {
            body["end_time"] = json!(end);
        }
        self.post("runs/update", &body).map(|_| ())
    }

    /// The run `run_id` as the server has it now.
    pub fn run_state(&self, run_id: &str) -> Result<RunState, CallError> {
        let url = format!("{}/api/2.0/mlflow/runs/get", self.base);
        let v = answer(self.agent.get(&url).query("run_id", run_id).call())?;
        let run = &v["run"];
        let started = millis_of(&run["info"]["start_time"]).unwrap_or(0);
        let logged = run["data"]["metrics"].as_array().into_iter().flatten().filter_map(|m| millis_of(&m["timestamp"]));
        Ok(RunState { status: text(&run["info"]["status"])?, last_ms: logged.fold(started, u64::max) })
    }

    /// One `log-batch` call (within MLflow's limits per call, which the caller keeps).
    pub fn log_batch(
        &self,
        run_id: &str,
        metrics: &[MetricPoint],
        params: &[(String, String)],
        tags: &[(String, String)],
    ) -> Result<(), CallError> {
        let pairs = |list: &[(String, String)]| -> Vec<Value> {
            list.iter().map(|(k, v)| json!({ "key": k, "value": v })).collect()
        };
        let metrics: Vec<Value> = metrics
            .iter()
            .map(|m| json!({ "key": m.key, "value": m.value, "timestamp": m.timestamp_ms, "step": m.step }))
            .collect();
        let body = json!({ "run_id": run_id, "metrics": metrics, "params": pairs(params), "tags": pairs(tags) });
        self.post("runs/log-batch", &body).map(|_| ())
    }

    /// Uploads `file` as artifact `name` of the run whose proxied artifact folder is
    /// `artifact_path`.
    pub fn upload(&self, artifact_path: &str, name: &str, file: &Path) -> Result<(), CallError> {
        let url = format!("{}/api/2.0/mlflow-artifacts/artifacts/{artifact_path}/{name}", self.base);
        let body = std::fs::File::open(file).map_err(|e| CallError::Unreachable(format!("{}: {e}", file.display())))?;
        let sent = self.agent.put(&url).header("Content-Type", "application/octet-stream").send(body);
        answer(sent).map(|_| ())
    }

    fn post(&self, endpoint: &str, body: &Value) -> Result<Value, CallError> {
        let url = format!("{}/api/2.0/mlflow/{endpoint}", self.base);
        let sent = self.agent.post(&url).header("Content-Type", "application/json").send(body.to_string());
        answer(sent)
    }
}

/// The JSON of a successful answer, or why there was none.
fn answer(response: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Result<Value, CallError> {
    let mut response = response.map_err(|e| CallError::Unreachable(e.to_string()))?;
    let status = response.status().as_u16();
    let body = response.body_mut().read_to_string().unwrap_or_default();
    if status >= 400 {
        let value: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let message = value["message"].as_str().map_or_else(|| body.chars().take(200).collect(), str::to_string);
        return Err(CallError::Status { status, message });
    }
    Ok(serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// A time in ms of an answer, which MLflow writes as a number or, for 64-bit fields through
/// some proxies, as a string.
fn millis_of(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok()))
}

/// A string field of an answer.
fn text(v: &Value) -> Result<String, CallError> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| CallError::Unreachable(format!("the server's answer lacks a field trainrun needs: {v}")))
}

/// The proxy path of an `mlflow-artifacts:` URI (`mlflow-artifacts:/1/<run>/artifacts` or
/// `mlflow-artifacts://host:port/1/<run>/artifacts`); none for a store the client would have
/// to reach itself (`file:`, `s3:`).
fn proxied_path(uri: &str) -> Option<String> {
    let rest = uri.strip_prefix("mlflow-artifacts:")?;
    let rest = match rest.strip_prefix("//") {
        Some(authority_and_path) => authority_and_path.split_once('/').map_or("", |(_, p)| p),
        None => rest,
    };
    Some(rest.trim_matches('/').to_string()).filter(|p| !p.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn artifact_uris_of_the_proxy_give_their_path() {
        assert_eq!(proxied_path("mlflow-artifacts:/1/abc/artifacts").as_deref(), Some("1/abc/artifacts"));
        assert_eq!(proxied_path("mlflow-artifacts://h:5000/1/abc/artifacts").as_deref(), Some("1/abc/artifacts"));
        assert_eq!(proxied_path("file:///tmp/mlruns/1/abc/artifacts"), None);
        assert_eq!(proxied_path("s3://bucket/1"), None);
    }

    #[test]
    fn only_server_errors_and_refusals_are_retried() {
        assert!(CallError::Unreachable("refused".into()).retryable());
        assert!(CallError::Status { status: 503, message: String::new() }.retryable());
        assert!(CallError::Status { status: 429, message: String::new() }.retryable());
        assert!(!CallError::Status { status: 400, message: String::new() }.retryable());
    }
}
