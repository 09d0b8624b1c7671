//! Delivering to the server from a thread of its own, so training never waits on the network:
//! what the run logs is queued (bounded), sent in `log-batch` calls of MLflow's sizes, and
//! retried with backoff while the server is unreachable or busy. When the run ends, its files
//! go up several at once while the files drawn for it (the report) are drawn on a thread of
//! their own, and what is still pending gets a last short chance; [`Undelivered`] says what
//! did not make it.

use super::abandoned::{self, PREVIOUS_TAG};
use super::client::{CallError, MAX_METRICS_PER_BATCH, MAX_PARAMS_PER_BATCH, MetricPoint, MlflowClient, RunRef};
use super::uploads::{self, ArtifactFile};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Metric values held while the server cannot take them; beyond this the oldest are dropped
/// (and counted), so a long run against a dead server keeps bounded memory.
pub const MAX_PENDING_METRICS: usize = 100_000;
/// Metric values are sent at least this often while training.
const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// The first wait after a failed call; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long the end of a run waits for a server that does not answer.
pub const LAST_CHANCE: Duration = Duration::from_secs(5);

/// What the run hands the delivery thread.
pub enum Message {
    /// Metric values.
    Metrics(Vec<MetricPoint>),
    /// The run ended: its files to upload (artifact name, file), the thread drawing more, its
    /// MLflow status and end time.
    End { artifacts: Vec<ArtifactFile>, drawing: Option<JoinHandle<Vec<PathBuf>>>, status: &'static str, end_ms: u64 },
}

/// How to open the run on the server.
pub struct Opening {
    /// The experiment's name (ignored when `parent` names the experiment).
    pub experiment: String,
    /// The run's name.
    pub run_name: String,
    /// When it started, ms since the epoch.
    pub start_ms: u64,
    /// Tags set at creation (the parent's id among them).
    pub tags: Vec<(String, String)>,
    /// Params, logged once the run exists.
    pub params: Vec<(String, String)>,
    /// An experiment id to use instead of looking `experiment` up (a sweep's trials).
    pub experiment_id: Option<String>,
    /// The run an earlier launch in the same folder logged to, on this server.
    pub previous: Option<Previous>,
    /// Where the created run's reference is written ([`super::RUN_FILE`]).
    pub run_file: PathBuf,
}

/// The run an earlier launch in the folder logged to: ended as `KILLED` first when that launch
/// left it `RUNNING` (its process is gone: this one holds the folder), then continued (`resume`:
/// set `RUNNING` again, logged on into) or named by the new run's [`PREVIOUS_TAG`].
pub struct Previous {
    /// The run.
    pub run: RunRef,
    /// Whether this launch continues it (a resumed run, a sweep run again).
    pub resume: bool,
    /// What found it, for its [`abandoned::KILLED_TAG`].
    pub found_by: String,
}

/// What did not reach the server, for the end's summary.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Undelivered {
    /// Metric values (dropped from a full queue or never sent).
    pub metrics: usize,
    /// Params.
    pub params: usize,
    /// Artifact names.
    pub artifacts: Vec<String>,
    /// The end status, if the server never heard it.
    pub status: Option<&'static str>,
    /// Whether the run was never created on the server.
    pub no_run: bool,
    /// The last problem seen.
    pub last_error: Option<String>,
}

impl Undelivered {
    /// Whether everything arrived.
    pub fn is_empty(&self) -> bool {
        self.metrics == 0 && self.params == 0 && self.artifacts.is_empty() && self.status.is_none() && !self.no_run
    }
}

/// The delivery thread's state.
pub struct Delivery {
    client: MlflowClient,
    opening: Opening,
    run: Option<RunRef>,
    /// `run` is an earlier launch's, not yet set back to `RUNNING`.
    reopening: bool,
    /// The earlier launch's run, until it is known not to be left `RUNNING`, and what found it.
    previous: Option<(String, String)>,
    /// The end status arrived.
    ended: bool,
    /// Params still to send.
    meta: VecDeque<(String, String)>,
    metrics: VecDeque<MetricPoint>,
    dropped: usize,
    artifacts: VecDeque<ArtifactFile>,
    /// The files being drawn, uploaded after `artifacts`.
    drawing: Option<JoinHandle<Vec<PathBuf>>>,
    end: Option<(&'static str, u64)>,
    last_error: Option<CallError>,
    /// Problems the server refused (not retried), counted into the summary.
    refused: Undelivered,
}

impl Delivery {
    /// The state before anything was sent.
    pub fn new(client: MlflowClient, mut opening: Opening) -> Delivery {
        let previous = opening.previous.take();
        let run = previous.as_ref().filter(|p| p.resume).map(|p| p.run.clone());
        if let Some(p) = previous.as_ref().filter(|p| !p.resume) {
            opening.tags.push((PREVIOUS_TAG.to_string(), p.run.run_id.clone()));
        }
        let mut meta: VecDeque<(String, String)> = std::mem::take(&mut opening.params).into();
        if run.is_some() {
            // A reopened run has its params and tags from its first launch (and a rung's longer
            // `train.epochs` would be refused as a changed param).
            meta.clear();
        }
        Delivery {
            client,
            opening,
            reopening: run.is_some(),
            run,
            previous: previous.map(|p| (p.run.run_id, p.found_by)),
            ended: false,
            meta,
            metrics: VecDeque::new(),
            dropped: 0,
            artifacts: VecDeque::new(),
            drawing: None,
            end: None,
            last_error: None,
            refused: Undelivered::default(),
        }
    }

    /// Ends the earlier launch's run as `KILLED` if it was left `RUNNING`, then creates (or
    /// reopens) the run on the server, once. Returns the run.
    pub fn open(&mut self) -> Result<RunRef, CallError> {
        if let Some((run_id, found_by)) = &self.previous {
            match abandoned::end_if_running(&self.client, run_id, found_by) {
                Ok(_) => {}
                Err(e) if e.retryable() => return Err(e),
                // Refused (the run was deleted, say): there is nothing left to end.
                Err(_) => {}
            }
            self.previous = None;
        }
        if let Some(run) = &self.run {
            if self.reopening {
                self.client.update_run(&run.run_id, "RUNNING", None)?;
                self.reopening = false;
            }
            return Ok(run.clone());
        }
        let o = &self.opening;
        let experiment_id = match &o.experiment_id {
            Some(id) => id.clone(),
            None => self.client.experiment_id(&o.experiment)?,
        };
        let run = self.client.create_run(&experiment_id, &o.run_name, o.start_ms, &o.tags)?;
        super::remember(&o.run_file, &run);
        self.run = Some(run.clone());
        Ok(run)
    }

    /// Runs until the run's end is delivered, or for [`LAST_CHANCE`] after it when the
    /// server does not answer; returns what did not arrive.
    pub fn serve(mut self, rx: Receiver<Message>) -> Undelivered {
        let mut backoff = FIRST_BACKOFF;
        let mut next_try = Instant::now();
        let mut last_flush = Instant::now();
        let mut deadline: Option<Instant> = None;
        loop {
            let now = Instant::now();
            let wait = next_try.saturating_duration_since(now).max(Duration::from_millis(if deadline.is_some() {
                0
            } else {
                50
            }));
            match rx.recv_timeout(wait.min(FLUSH_EVERY)) {
                Ok(message) => {
                    self.absorb(message);
                    while let Ok(more) = rx.try_recv() {
                        self.absorb(more);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                // The run dropped its tracker without ending (a panic): nothing more comes.
                Err(RecvTimeoutError::Disconnected) if self.end.is_none() => {
                    deadline.get_or_insert_with(|| Instant::now() + LAST_CHANCE);
                }
                Err(RecvTimeoutError::Disconnected) => {}
            }
            if self.end.is_some() && deadline.is_none() {
                deadline = Some(Instant::now() + LAST_CHANCE);
            }
            let ending = deadline.is_some();
            let due = ending || self.metrics.len() >= MAX_METRICS_PER_BATCH || last_flush.elapsed() >= FLUSH_EVERY;
            if due && Instant::now() >= next_try {
                last_flush = Instant::now();
                match self.deliver() {
                    Ok(()) => backoff = FIRST_BACKOFF,
                    Err(e) => {
                        self.last_error = Some(e);
                        next_try = Instant::now() + backoff;
                        backoff = (backoff * 2).min(if ending { Duration::from_secs(1) } else { MAX_BACKOFF });
                    }
                }
            }
            let delivered = self.ended && self.pending() == 0;
            if delivered || deadline.is_some_and(|d| Instant::now() >= d) {
                return self.undelivered();
            }
        }
    }

    fn absorb(&mut self, message: Message) {
        match message {
            Message::Metrics(points) => {
                self.metrics.extend(points);
                while self.metrics.len() > MAX_PENDING_METRICS {
                    self.metrics.pop_front();
                    self.dropped += 1;
                }
            }
            Message::End { artifacts, drawing, status, end_ms } => {
                self.artifacts.extend(artifacts);
                self.drawing = drawing;
                self.end = Some((status, end_ms));
            }
        }
    }

    fn pending(&self) -> usize {
        self.meta.len()
            + self.metrics.len()
            + self.artifacts.len()
            + usize::from(self.drawing.is_some())
            + usize::from(self.end.is_some())
    }

    /// Sends what is pending, in order: the run, params and tags, metrics, and at the end the
    /// artifacts and the status. What arrives leaves the queue at once, so a failure part way
    /// loses nothing sent before it and repeats nothing after.
    fn deliver(&mut self) -> Result<(), CallError> {
        let run = self.open()?;
        while !self.meta.is_empty() {
            let chunk: Vec<(String, String)> = self.meta.drain(..self.meta.len().min(MAX_PARAMS_PER_BATCH)).collect();
            if let Err(e) = self.client.log_batch(&run.run_id, &[], &chunk, &[]) {
                if !e.retryable() {
                    self.refused.params += chunk.len();
                    self.refused.last_error = Some(e.to_string());
                    continue;
                }
                for m in chunk.into_iter().rev() {
                    self.meta.push_front(m);
                }
                return Err(e);
            }
        }
        while !self.metrics.is_empty() {
            let n = self.metrics.len().min(MAX_METRICS_PER_BATCH);
            let chunk: Vec<MetricPoint> = self.metrics.range(..n).cloned().collect();
            match self.client.log_batch(&run.run_id, &chunk, &[], &[]) {
                Ok(()) => {}
                Err(e) if !e.retryable() => {
                    self.refused.metrics += n;
                    self.refused.last_error = Some(e.to_string());
                }
                Err(e) => return Err(e),
            }
            self.metrics.drain(..n);
        }
        let Some((status, end_ms)) = self.end else { return Ok(()) };
        self.upload(&run)?;
        if let Some(drawing) = self.drawing.take() {
            // A report that cannot be drawn only leaves its files out.
            self.artifacts.extend(uploads::named(&drawing.join().unwrap_or_default()));
            self.upload(&run)?;
        }
        self.client.update_run(&run.run_id, status, Some(end_ms))?;
        self.end = None;
        self.ended = true;
        Ok(())
    }

    /// Uploads the pending files, several at once; those the server could not take yet stay
    /// pending.
    fn upload(&mut self, run: &RunRef) -> Result<(), CallError> {
        if self.artifacts.is_empty() {
            return Ok(());
        }
        let Some(path) = &run.artifact_path else {
            self.refused.artifacts.extend(self.artifacts.drain(..).map(|(n, _)| n));
            self.refused.last_error =
                Some("the server does not proxy artifacts (start it with `--serve-artifacts`)".to_string());
            return Ok(());
        };
        let outcome = uploads::upload_all(&self.client, path, self.artifacts.drain(..).collect());
        for (name, e) in outcome.refused {
            self.refused.artifacts.push(name);
            self.refused.last_error = Some(e.to_string());
        }
        self.artifacts.extend(outcome.retry);
        match outcome.last_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn undelivered(mut self) -> Undelivered {
        if let Some(drawing) = self.drawing.take() {
            self.artifacts.extend(uploads::named(&drawing.join().unwrap_or_default()));
        }
        let mut u = self.refused;
        u.metrics += self.metrics.len() + self.dropped;
        u.params += self.meta.len();
        u.artifacts.extend(self.artifacts.into_iter().map(|(n, _)| n));
        u.status = self.end.map(|(s, _)| s);
        u.no_run = self.run.is_none();
        if let Some(e) = self.last_error {
            u.last_error = Some(e.to_string());
        }
        u
    }
}
