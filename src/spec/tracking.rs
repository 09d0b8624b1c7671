//! `[run.tracking]`: where the chief logs the run besides its folder — an MLflow tracking
//! server, as `MLFLOW_TRACKING_URI` would name it. Tracking never changes results, so the
//! spec's hashes leave it out.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `[run.tracking]`: the MLflow server and experiment a run is logged to.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TrackingSpec {
    /// The MLflow tracking server's address (`http://` or `https://`); the chief logs the
    /// resolved spec as params, the metrics of `metrics.jsonl` per step, tags and the run's
    /// files through its REST API. An unreachable server is a warning, never a failed run.
    /// Default: the `MLFLOW_TRACKING_URI` environment variable; none: no tracking.
    /// Example: `mlflow = "http://127.0.0.1:5000"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlflow: Option<String>,

    /// The MLflow experiment, created when missing. Default: `MLFLOW_EXPERIMENT_NAME`, else
    /// the run's name (a sweep's name for a sweep and its trials). Example:
    /// `experiment = "mnist"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experiment: Option<String>,
}
