//! Tracking: the chief also logs its run to an MLflow server (`[run.tracking] mlflow`, or
//! `MLFLOW_TRACKING_URI`) — the resolved spec as params, the lines of `metrics.jsonl` as
//! metrics per step, tags (spec hash, git commit, trainrun version), and at the end its files
//! as artifacts and its status (`FINISHED`, `FAILED`, or `KILLED` when stopped by a signal).
//! A sweep is a parent run, each trial a child run (`mlflow.parentRunId`). A run whose process
//! was killed outright, and so never ended, is ended `KILLED` by what next finds its folder
//! free ([`abandoned`]).
//!
//! The run folder stays the record: tracking never fails or slows training. Calls go out from
//! a thread of their own ([`delivery`]), which also creates the run on the server while
//! training starts; they are retried with backoff and buffered (bounded) while the server is
//! away; an unreachable server is one warning at the start, and what never arrived is one
//! summary at the end. At the end the run's files go up several at once ([`uploads`]) while
//! its report is drawn, and a server that stops answering is waited for a few seconds at most.

mod abandoned;
mod client;
mod delivery;
mod logged;
mod uploads;

pub use abandoned::{KILLED_TAG, PREVIOUS_TAG, end_left_running};
pub use client::{CallError, RunRef};
pub use delivery::Undelivered;
pub use logged::{MAX_PARAM_VALUE, key, param_value, params};

use crate::spec::{Diagnostic, NotAServer, TrackingSpec};
use crate::train::metrics_log::{LineSink, MetricsLine};
use client::MlflowClient;
use delivery::{Delivery, Message, Opening, Previous};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::SystemTime;

/// The environment variable MLflow's own clients read for the server.
pub const URI_VAR: &str = "MLFLOW_TRACKING_URI";
/// The environment variable MLflow's own clients read for the experiment.
pub const EXPERIMENT_VAR: &str = "MLFLOW_EXPERIMENT_NAME";
/// Set by a sweep for its trials: `<experiment id>/<parent run id>`.
pub const PARENT_VAR: &str = "TRAINRUN_MLFLOW_PARENT";
/// The file in a run (or sweep) folder naming its MLflow run, so a resumed launch logs into the
/// same run.
pub const RUN_FILE: &str = "mlflow.json";

/// TrackedLines the delivery thread may be behind by before new ones are dropped (and counted).
const QUEUE: usize = 4096;

/// Where a run is tracked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackingTarget {
    /// The server.
    pub uri: String,
    /// The experiment's name.
    pub experiment: String,
    /// The parent run (a sweep's) and its experiment, for a trial.
    pub parent: Option<(String, String)>,
}

impl TrackingTarget {
    /// The target of a run: `[run.tracking]`, else MLflow's environment variables; none when
    /// neither names a server. `name` is the experiment when nothing else names one.
    pub fn resolve(spec: Option<&TrackingSpec>, env: &[(String, String)], name: &str) -> Option<TrackingTarget> {
        let var =
            |k: &str| env.iter().find(|(key, v)| key == k && !v.trim().is_empty()).map(|(_, v)| v.trim().to_string());
        let uri = spec.and_then(|t| t.mlflow.clone()).or_else(|| var(URI_VAR))?;
        let experiment =
            spec.and_then(|t| t.experiment.clone()).or_else(|| var(EXPERIMENT_VAR)).unwrap_or_else(|| name.to_string());
        let parent = var(PARENT_VAR).and_then(|v| v.split_once('/').map(|(e, r)| (e.to_string(), r.to_string())));
        Some(TrackingTarget { uri, experiment, parent })
    }
}

/// The problem with [`URI_VAR`] in `env` when it is what names the server (the spec sets no
/// `[run.tracking] mlflow`, which comes first) and names no server: a store that MLflow's own
/// clients write directly (`file:`, `sqlite:`, `databricks`, a folder) or a host without its
/// scheme. Refused as the spec key is, naming the variable: trainrun logs through a server's
/// REST API, so such a run would only warn, on every launch, that the server is unreachable.
pub fn env_uri_problem(spec: Option<&TrackingSpec>, env: &[(String, String)]) -> Option<Diagnostic> {
    if spec.is_some_and(|t| t.mlflow.is_some()) {
        return None;
    }
    let (_, uri) = env.iter().find(|(k, v)| k == URI_VAR && !v.trim().is_empty())?;
    let help = match crate::spec::server_address(uri).err()? {
        NotAServer::NoScheme => format!("name the server with its scheme: `{URI_VAR}=http://{}`", uri.trim()),
        NotAServer::Store => format!(
            "set it to the address of an MLflow server, e.g. `{URI_VAR}=http://127.0.0.1:5000` (serve that store \
             with `mlflow server --backend-store-uri STORE`), or leave it out for this command (`env -u {URI_VAR} \
             trainrun …`) to train untracked; `[run.tracking] mlflow` in the spec, when set, is used instead"
        ),
    };
    let message = format!(
        "the environment variable {URI_VAR} = {uri:?} is not an http:// or https:// address of an MLflow server \
         (trainrun logs through a tracking server's REST API)"
    );
    Some(Diagnostic::error("", message).help(help))
}

/// How a tracked run ended, in MLflow's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    /// It ran to its end.
    Finished,
    /// It failed.
    Failed,
    /// A signal stopped it (SIGTERM, Ctrl-C): paused, resumable.
    Killed,
}

impl RunEnd {
    fn as_str(self) -> &'static str {
        match self {
            RunEnd::Finished => "FINISHED",
            RunEnd::Failed => "FAILED",
            RunEnd::Killed => "KILLED",
        }
    }
}

/// What a tracked run starts with.
pub struct TrackingStart<'a> {
    /// Where.
    pub target: TrackingTarget,
    /// The run's name.
    pub run_name: String,
    /// The resolved spec, as JSON (its params).
    pub spec: serde_json::Value,
    /// Tags besides the parent's.
    pub tags: Vec<(String, String)>,
    /// The folder whose [`RUN_FILE`] names the run.
    pub folder: &'a Path,
    /// Whether this launch continues the folder's run (a resumed run, a sweep run again).
    pub resumed: bool,
}

/// Files drawn for a run as it ends (its report), uploaded once drawn.
pub type LateArtifacts = Box<dyn FnOnce() -> Vec<PathBuf> + Send>;

/// A run being logged to MLflow.
pub struct Tracker {
    uri: String,
    tx: SyncSender<Message>,
    worker: JoinHandle<Undelivered>,
    /// The delivery thread's first attempt at the run, until [`Tracker::run`] waits for it.
    opening: Option<Receiver<Option<RunRef>>>,
    run: Option<RunRef>,
    /// Metric values the queue could not take.
    dropped: Arc<AtomicUsize>,
}

impl Tracker {
    /// Starts the delivery thread, which opens the run on the server while the run goes on
    /// (training never waits for the server). An unreachable server is a warning then, and the
    /// thread keeps trying.
    pub fn start(s: TrackingStart<'_>) -> Tracker {
        let TrackingStart { target, run_name, spec, mut tags, folder, resumed } = s;
        let run_file = folder.join(RUN_FILE);
        // This launch owns the folder (a run holds its lock), so an earlier launch's run still
        // `RUNNING` on the server was left so by a process that is gone.
        let previous = remembered(&run_file, &target.uri).map(|run| Previous {
            run,
            resume: resumed,
            found_by: found_by(folder, resumed, SystemTime::now()),
        });
        if let Some((_, run_id)) = &target.parent {
            tags.push(("mlflow.parentRunId".to_string(), run_id.clone()));
        }
        let opening = Opening {
            experiment: target.experiment.clone(),
            run_name,
            start_ms: millis(SystemTime::now()),
            tags,
            params: params(&spec),
            experiment_id: target.parent.as_ref().map(|(e, _)| e.clone()),
            previous,
            run_file,
        };
        let mut delivery = Delivery::new(MlflowClient::new(&target.uri), opening);
        let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE);
        let (opened_tx, opened) = std::sync::mpsc::sync_channel(1);
        let uri = target.uri.clone();
        let worker = std::thread::spawn(move || {
            let run = match delivery.open() {
                Ok(run) => Some(run),
                Err(e) => {
                    eprintln!(
                        "warning: the MLflow server {uri} is unreachable ({e}); training goes on, what it logs is \
                         kept and retried, and the end says what was not delivered"
                    );
                    None
                }
            };
            // Nobody may be waiting for it: only a sweep does.
            let _ = opened_tx.send(run);
            delivery.serve(rx)
        });
        Tracker { uri: target.uri, tx, worker, opening: Some(opened), run: None, dropped: Arc::default() }
    }

    /// The run on the server, once the first attempt to create it ended (at most a
    /// connection's timeout): none when that attempt failed. A sweep waits for its run here,
    /// since its trials log as the run's children.
    pub fn run(&mut self) -> Option<&RunRef> {
        if let Some(opened) = self.opening.take() {
            self.run = opened.recv().ok().flatten();
        }
        self.run.as_ref()
    }

    /// Where the run folder's metric lines go, besides `metrics.jsonl`.
    pub fn lines(&self) -> Box<dyn LineSink> {
        Box::new(TrackedLines { tx: self.tx.clone(), evaluated_at: None, dropped: Arc::clone(&self.dropped) })
    }

    /// Ends the run: uploads `artifacts` (those that exist, named by file name) and the files
    /// `later` draws meanwhile, sets its status, waits for the delivery thread (a few seconds
    /// at most when the server stops answering), and says on stderr what did not arrive.
    pub fn end(self, end: RunEnd, artifacts: &[PathBuf], later: Option<LateArtifacts>) -> Undelivered {
        let artifacts = uploads::named(artifacts);
        // Drawn while the files at hand go up.
        let drawing = later.map(std::thread::spawn);
        let message = Message::End { artifacts, drawing, status: end.as_str(), end_ms: millis(SystemTime::now()) };
        let Tracker { uri, tx, worker, dropped, .. } = self;
        // The thread may have stopped already (its queue was closed): the summary says so.
        let _ = tx.send(message);
        drop(tx);
        let mut undelivered = worker.join().unwrap_or_else(|_| Undelivered {
            last_error: Some("the delivery thread panicked".to_string()),
            status: Some(end.as_str()),
            ..Undelivered::default()
        });
        undelivered.metrics += dropped.load(Ordering::Relaxed);
        if !undelivered.is_empty() {
            eprintln!("warning: {}", summary(&uri, &undelivered));
        }
        undelivered
    }
}

/// The end's line about what the server did not get.
pub fn summary(uri: &str, u: &Undelivered) -> String {
    let mut parts = Vec::new();
    if u.no_run {
        parts.push("the run itself".to_string());
    }
    if u.params > 0 {
        parts.push(format!("{} params", u.params));
    }
    if u.metrics > 0 {
        parts.push(format!("{} metric values", u.metrics));
    }
    if !u.artifacts.is_empty() {
        parts.push(format!("{} artifacts ({})", u.artifacts.len(), u.artifacts.join(", ")));
    }
    if let Some(status) = u.status {
        parts.push(format!("its end ({status})"));
    }
    let why = u.last_error.as_deref().map_or(String::new(), |e| format!(" (last problem: {e})"));
    format!("the MLflow server {uri} did not receive {}{why}; the run folder holds all of it", parts.join(", "))
}

/// What a launch in `folder` says on the earlier launch's run it found left `RUNNING`.
fn found_by(folder: &Path, resumed: bool, now: SystemTime) -> String {
    let at = format!("a later launch in {} found it so at {}", folder.display(), crate::provenance::rfc3339(now));
    if resumed {
        format!("{at} and continues it: the run is RUNNING again and logs on from where that launch resumed")
    } else {
        format!(
            "{at} and started over (no backup to resume from), logging to a new run whose tag {PREVIOUS_TAG} names \
             this one"
        )
    }
}

/// The run `path` names, when it is on the server `uri`.
fn remembered(path: &Path, uri: &str) -> Option<RunRef> {
    let text = std::fs::read_to_string(path).ok()?;
    let run: RunRef = serde_json::from_str(&text).ok()?;
    (run.tracking_uri == uri.trim_end_matches('/')).then_some(run)
}

/// Writes which run a folder is logged to; a folder that cannot take it only loses the
/// resumed launch's link to the same run.
fn remember(path: &Path, run: &RunRef) {
    if let Ok(text) = serde_json::to_string_pretty(run) {
        let _ = std::fs::write(path, text + "\n");
    }
}

fn millis(t: SystemTime) -> u64 {
    (crate::provenance::unix_seconds(t) * 1000.0) as u64
}

/// The metric lines of a run on their way to the delivery thread.
struct TrackedLines {
    tx: SyncSender<Message>,
    evaluated_at: Option<u64>,
    dropped: Arc<AtomicUsize>,
}

impl LineSink for TrackedLines {
    fn line(&mut self, line: &MetricsLine) {
        let points = logged::metrics(line, millis(SystemTime::now()), &mut self.evaluated_at);
        if points.is_empty() {
            return;
        }
        match self.tx.try_send(Message::Metrics(points)) {
            Ok(()) => {}
            // The server is far behind (or the thread is gone): the folder keeps the line.
            Err(TrySendError::Full(Message::Metrics(p)) | TrySendError::Disconnected(Message::Metrics(p))) => {
                self.dropped.fetch_add(p.len(), Ordering::Relaxed);
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn the_spec_names_the_server_before_the_environment() {
        let spec = TrackingSpec { mlflow: Some("http://a:1".into()), experiment: None };
        let e = env(&[(URI_VAR, "http://b:2"), (EXPERIMENT_VAR, "exp")]);
        let t = TrackingTarget::resolve(Some(&spec), &e, "run");
        assert_eq!(t.map(|t| (t.uri, t.experiment)), Some(("http://a:1".into(), "exp".into())));
        let t = TrackingTarget::resolve(None, &env(&[(URI_VAR, "http://b:2")]), "run");
        assert_eq!(t.map(|t| (t.uri, t.experiment)), Some(("http://b:2".into(), "run".into())));
        assert_eq!(TrackingTarget::resolve(None, &env(&[(URI_VAR, " ")]), "run"), None);
        let t = TrackingTarget::resolve(None, &env(&[(URI_VAR, "http://b:2"), (PARENT_VAR, "3/abc")]), "run");
        assert_eq!(t.and_then(|t| t.parent), Some(("3".into(), "abc".into())));
    }

    #[test]
    fn a_tracking_uri_in_the_environment_must_be_a_server_unless_the_spec_names_one() {
        let problem = |uri: &str| env_uri_problem(None, &env(&[(URI_VAR, uri)]));
        assert_eq!(problem("http://127.0.0.1:5000"), None);
        assert_eq!(problem(" "), None, "empty: no tracking");
        let d = problem("file:./mlruns").expect("a store is refused");
        assert_eq!(
            d.message,
            "the environment variable MLFLOW_TRACKING_URI = \"file:./mlruns\" is not an http:// or https:// address \
             of an MLflow server (trainrun logs through a tracking server's REST API)"
        );
        for store in ["sqlite:///mlflow.db", "databricks", "./mlruns", "/tmp/mlruns"] {
            let help = problem(store).and_then(|d| d.help).unwrap_or_default();
            assert!(help.contains("MLFLOW_TRACKING_URI=http://127.0.0.1:5000") && help.contains("env -u"), "{store}");
        }
        let help = problem("localhost:5000").and_then(|d| d.help).unwrap_or_default();
        assert_eq!(help, "name the server with its scheme: `MLFLOW_TRACKING_URI=http://localhost:5000`");
        let spec = TrackingSpec { mlflow: Some("http://a:1".into()), experiment: None };
        assert_eq!(env_uri_problem(Some(&spec), &env(&[(URI_VAR, "file:./mlruns")])), None, "the spec comes first");
    }

    #[test]
    fn the_summary_names_everything_not_delivered() {
        let u = Undelivered {
            metrics: 12,
            params: 0,
            artifacts: vec!["summary.json".into()],
            status: Some("FINISHED"),
            no_run: false,
            last_error: Some("connection refused".into()),
        };
        assert_eq!(
            summary("http://h:1", &u),
            "the MLflow server http://h:1 did not receive 12 metric values, 1 artifacts (summary.json), its end \
             (FINISHED) (last problem: connection refused); the run folder holds all of it"
        );
    }
}
