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

/// Why an MLflow tracking URI is no server trainrun can log to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotAServer {
    /// A host without its scheme (`localhost:5000`): the fix is `http://` in front.
    NoScheme,
    /// A store MLflow's own clients write directly (`./mlruns`, `file:`, `sqlite:`,
    /// `databricks`) or nothing usable: trainrun talks to a server's REST API only.
    Store,
}

/// Whether `uri` is an `http://` or `https://` address of a server, and if not, why.
/// `server_address("file:./mlruns")` is `Err(NotAServer::Store)`,
/// `server_address("localhost:5000")` is `Err(NotAServer::NoScheme)`.
pub fn server_address(uri: &str) -> Result<(), NotAServer> {
    let trimmed = uri.trim();
    let lower = trimmed.to_ascii_lowercase();
    let server = ["http://", "https://"].iter().find_map(|s| lower.strip_prefix(s));
    if server.is_some_and(|rest| !rest.trim_start_matches('/').is_empty()) {
        return Ok(());
    }
    // `host`, `host:port`, `host:port/prefix`; a colon not followed by a port is a store's
    // scheme (`file:./mlruns`, `sqlite:mlflow.db`).
    let port_or_nothing = trimmed.split_once(':').is_none_or(|(_, rest)| {
        let port = rest.split('/').next().unwrap_or_default();
        !port.is_empty() && port.chars().all(|c| c.is_ascii_digit())
    });
    let host_like = !trimmed.is_empty()
        && !trimmed.contains("://")
        && !trimmed.starts_with(['/', '.', '~'])
        && lower != "databricks"
        && port_or_nothing
        && trimmed.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '/' | '_'));
    Err(if host_like { NotAServer::NoScheme } else { NotAServer::Store })
}
