//! The control plane: a small gRPC service every task of a job runs, giving the job its shape
//! and its safety. Every task checks in with the chief and the job starts only when all have
//! ([`ControlPlane::rendezvous`]); tasks meet at named barriers; the chief hears every task's
//! heartbeat and turns a death or a hang into an error that names the task, at every task,
//! within the failure timeout. The chief sends commands ([`Command`]) and collects metrics.
//!
//! The vocabulary is TensorFlow's `TF_CONFIG`: tasks are `chief:0`, `worker:N`, `ps:N` and
//! `evaluator:0`; without a chief, `worker:0` is the chief. Ranks follow [`TaskId`]'s order:
//! the chief first, then workers, parameter servers and the evaluator, each by index.
//!
//! The trainer is synchronous, so [`ControlPlane`] is a blocking facade over a tokio runtime
//! on its own thread. Requests carry the job's token ([`JobToken`]).

mod auth;
pub mod certs;
mod client;
mod coordinator;
mod error;
mod health;
pub mod job;
pub mod kubernetes;
pub mod launch;
mod plane;
mod rejoin;
pub mod resolve;
mod service;
mod slurm;
mod stragglers;
mod task_output;
mod tf_config;
pub mod tls;
mod wire;

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

pub use auth::{JobToken, new_job_token, resolve_token};
pub use error::{Blame, ClusterError, Failure};
pub use health::Health;
pub use plane::ControlPlane;
pub use resolve::{Address, Cluster, Resolution, Source};
pub use stragglers::{StepTimes, Straggler};

/// A task's role, in rank order: the chief comes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    Chief,
    Worker,
    Ps,
    Evaluator,
}

impl Role {
    /// The role's name in `TF_CONFIG`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Chief => "chief",
            Role::Worker => "worker",
            Role::Ps => "ps",
            Role::Evaluator => "evaluator",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One task of the job, displayed and parsed as `worker:1`. Orders by rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskId {
    pub role: Role,
    pub index: u32,
}

impl TaskId {
    pub const fn new(role: Role, index: u32) -> TaskId {
        TaskId { role, index }
    }

    /// `TF_CONFIG`'s rule: `chief:0` when the cluster has a chief, else `worker:0`.
    pub fn chief_of<'a>(tasks: impl IntoIterator<Item = &'a TaskId>) -> Option<TaskId> {
        tasks.into_iter().min().copied()
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.role, self.index)
    }
}

impl serde::Serialize for TaskId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A string that is not `role:index`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a task id: write role:index with role chief, worker, ps or evaluator (e.g. worker:1)")]
pub struct ParseTaskIdError(pub String);

impl FromStr for TaskId {
    type Err = ParseTaskIdError;

    fn from_str(s: &str) -> Result<TaskId, ParseTaskIdError> {
        let bad = || ParseTaskIdError(s.to_owned());
        let (role, index) = s.split_once(':').ok_or_else(bad)?;
        let role = match role {
            "chief" => Role::Chief,
            "worker" => Role::Worker,
            "ps" => Role::Ps,
            "evaluator" => Role::Evaluator,
            _ => return Err(bad()),
        };
        // `parse` alone would accept `+1`; one spelling per task keeps ids comparable as text.
        if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let index = index.parse().map_err(|_| bad())?;
        Ok(TaskId { role, index })
    }
}

/// What the control plane needs to know about the job and this process. The cluster resolver
/// builds it; the control plane reads no environment.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// This process's task.
    pub task: TaskId,
    /// Every task's `host:port`. This process binds exactly its own entry.
    pub roster: BTreeMap<TaskId, String>,
    /// The chief (see [`TaskId::chief_of`]); checked against the roster.
    pub chief: TaskId,
    pub token: JobToken,
    /// Every task must run the same spec and trainrun version; the chief refuses others.
    /// The hash covers only what changes the results (`summary.json`'s `spec_sha256`).
    pub spec_hash: String,
    /// A short hash per key path of that spec, so a refusal names the keys that differ.
    pub spec_keys: BTreeMap<String, String>,
    pub version: String,
    pub timeouts: Timeouts,
    /// Opaque to the control plane, handed to every task at rendezvous: e.g. this task's
    /// data-plane address or shared-memory path.
    pub payload: Vec<u8>,
    /// Mutual TLS for the control plane; `None` is plain HTTP/2.
    pub tls: Option<std::sync::Arc<tls::TlsMaterial>>,
    /// Roles whose death does not fail the job once it has started, and whose restarted
    /// process may check in again (workers under `parameter_server`).
    pub expendable: Vec<Role>,
}

/// How long the control plane waits before it fails the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// The chief waits this long from its start for every task to check in; a task keeps
    /// trying to reach the chief this long from its `rendezvous` call.
    pub startup: Duration,
    /// A task silent this long, or a barrier incomplete this long, fails the job.
    pub failure: Duration,
    /// How often a task pings the chief; several pings must fit in `failure`.
    pub heartbeat: Duration,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts {
            startup: Duration::from_secs(60),
            failure: Duration::from_secs(10),
            heartbeat: Duration::from_millis(250),
        }
    }
}

/// A task as the rendezvous found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub task: TaskId,
    pub rank: usize,
    pub address: String,
    pub host: String,
    pub pid: u32,
    pub payload: Vec<u8>,
}

/// Every task of the job, in rank order; every task receives the same roster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Roster {
    pub members: Vec<Member>,
}

impl Roster {
    pub fn get(&self, task: TaskId) -> Option<&Member> {
        self.members.iter().find(|m| m.task == task)
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }
}

/// An order from the chief to every task, delivered in the order sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Stop training; also sent by the control plane itself when the chief finishes.
    Stop { reason: String },
    /// Write a checkpoint at this step.
    Save { step: u64 },
}

/// A small record a task sent the chief, e.g. one epoch's metrics as JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricRecord {
    pub task: TaskId,
    pub json: String,
}

/// Seconds as people write them in messages: `60 s`, `1.5 s`, `200 ms`.
pub(crate) fn human(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// `worker:2, worker:3`.
pub(crate) fn list(tasks: &[TaskId]) -> String {
    let names: Vec<String> = tasks.iter().map(TaskId::to_string).collect();
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_ids_round_trip_and_order_by_rank() {
        let ids: Vec<TaskId> =
            ["evaluator:0", "worker:10", "ps:0", "worker:2", "chief:0"].iter().map(|s| s.parse().unwrap()).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        let shown: Vec<String> = sorted.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["chief:0", "worker:2", "worker:10", "ps:0", "evaluator:0"]);
        assert_eq!(TaskId::chief_of(&ids), Some(TaskId::new(Role::Chief, 0)));
    }

    #[test]
    fn bad_task_ids_are_refused() {
        for bad in ["worker", "worker:", "worker:+1", "boss:0", ":1", "worker:1:2", "worker:-1"] {
            assert!(bad.parse::<TaskId>().is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(human(Duration::from_secs(60)), "60 s");
        assert_eq!(human(Duration::from_millis(1500)), "1.5 s");
        assert_eq!(human(Duration::from_millis(200)), "200 ms");
    }
}
