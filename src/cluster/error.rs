//! The control plane's errors. [`Failure`] is why a job failed: the chief decides it and every
//! task reports the same words, so whoever reads any task's log learns which task to look at.

use std::path::PathBuf;
use std::time::Duration;

use super::{TaskId, human, list};

/// Why the job cannot go on. Travels from the chief to every task.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    #[error(
        "{task} runs spec {} (trainrun {version}) but the chief {chief} runs spec {} (trainrun {chief_version}){}: start every task with the same spec and trainrun",
        short(spec_hash),
        short(chief_spec_hash),
        differing(keys)
    )]
    SpecMismatch {
        task: TaskId,
        spec_hash: String,
        version: String,
        chief: TaskId,
        chief_spec_hash: String,
        chief_version: String,
        /// The key paths whose values differ (empty when only the version does).
        keys: Vec<String>,
    },
    #[error(
        "{task} checked in, but the chief's cluster has no such task (it has {}): start every task with the same cluster",
        list(known)
    )]
    UnknownTask { task: TaskId, known: Vec<TaskId> },
    #[error("{task} checked in twice, from {first} and from {second}: start one process per task")]
    DuplicateTask { task: TaskId, first: String, second: String },
    #[error("rendezvous timed out after {}: {} never checked in", human(*after), list(missing))]
    RendezvousTimeout { after: Duration, missing: Vec<TaskId> },
    #[error(
        "barrier `{name}` timed out after {}: {} never arrived",
        human(*after),
        list(missing)
    )]
    BarrierTimeout { name: String, after: Duration, missing: Vec<TaskId> },
    #[error("{task} died: {detail}")]
    Died { task: TaskId, detail: String },
    #[error(
        "{task} went silent: no heartbeat for {} (it hangs, or the network to it is down)",
        human(*after)
    )]
    Silent { task: TaskId, after: Duration },
    #[error("{task} failed: {reason}")]
    Aborted { task: TaskId, reason: String },
}

/// The task a task that found the job broken holds responsible, as data: the launcher names
/// it from this, not from the words of the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blame {
    /// It stopped answering: hung, frozen, or cut off.
    Hung(TaskId),
    /// Its process is gone.
    Died(TaskId),
}

impl Failure {
    /// Whom this failure blames, if one task.
    pub fn blame(&self) -> Option<Blame> {
        match self {
            Failure::Died { task, .. } => Some(Blame::Died(*task)),
            Failure::Silent { task, .. } => Some(Blame::Hung(*task)),
            Failure::BarrierTimeout { missing, .. } | Failure::RendezvousTimeout { missing, .. } => {
                missing.first().copied().map(Blame::Hung)
            }
            Failure::SpecMismatch { .. }
            | Failure::UnknownTask { .. }
            | Failure::DuplicateTask { .. }
            | Failure::Aborted { .. } => None,
        }
    }

    /// The task that can hear nothing more of the job: it died, or it hangs.
    pub fn unreachable(&self) -> Option<TaskId> {
        match self {
            Failure::Died { task, .. } | Failure::Silent { task, .. } => Some(*task),
            Failure::SpecMismatch { .. }
            | Failure::UnknownTask { .. }
            | Failure::DuplicateTask { .. }
            | Failure::RendezvousTimeout { .. }
            | Failure::BarrierTimeout { .. }
            | Failure::Aborted { .. } => None,
        }
    }
}

/// `; they differ in optimizer.learning_rate, train.epochs`, at most 8 keys named.
fn differing(keys: &[String]) -> String {
    const SHOWN: usize = 8;
    match keys.len() {
        0 => String::new(),
        n if n <= SHOWN => format!("; they differ in {}", keys.join(", ")),
        n => format!("; they differ in {} and {} more keys", keys[..SHOWN].join(", "), n - SHOWN),
    }
}

/// Long hashes are cut like git cuts commit ids: enough to tell two apart.
fn short(hash: &str) -> String {
    match hash.char_indices().nth(12) {
        Some((end, _)) => format!("{}…", &hash[..end]),
        None => hash.to_owned(),
    }
}

/// Everything the control plane can report.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The job failed; the same [`Failure`] is reported at every task.
    #[error(transparent)]
    Failed(#[from] Failure),
    #[error("cluster config: {0}")]
    Config(String),
    #[error("{task} cannot listen on {address}: {source}")]
    Bind {
        task: TaskId,
        address: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the control plane's runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error(
        "rendezvous timed out after {}: the chief {chief} at {address} never answered (last error: {last_error})",
        human(*after)
    )]
    ChiefUnreachable { chief: TaskId, address: String, after: Duration, last_error: String },
    #[error(
        "the chief {chief} at {address} refused this task's job token: give every task the job's token (TRAINRUN_JOB_TOKEN or cluster.token_file)"
    )]
    Unauthenticated { chief: TaskId, address: String },
    /// Something that is not trainrun answers at the chief's address.
    #[error(
        "the chief {chief}'s address {address} is answered by {what}, not by trainrun: check the cluster's addresses (TF_CONFIG or [cluster]) and that the chief runs there"
    )]
    Stranger { chief: TaskId, address: String, what: String },
    #[error(
        "TLS with the chief {chief} at {address} failed: {reason}; every task needs a certificate from the job's CA (cluster.tls)"
    )]
    Tls { chief: TaskId, address: String, reason: String },
    #[error(transparent)]
    TlsFiles(#[from] super::tls::TlsError),
    /// The chief answered something this task cannot use: a different cluster layout or a
    /// different trainrun build.
    #[error("the chief {chief} at {address} answered: {message}")]
    Protocol { chief: TaskId, address: String, message: String },
    #[error("{call} needs {what}")]
    Usage { call: &'static str, what: &'static str },
    #[error("no job token: set TRAINRUN_JOB_TOKEN or cluster.token_file (`trainrun` makes one for local clusters)")]
    NoToken,
    #[error("cannot read the job token file {path}: {source}")]
    TokenFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the job token file {} is open to other users (permissions {mode:04o}): run `chmod 600 {}`, as ssh requires of a private key",
        path.display(),
        path.display()
    )]
    TokenFileOpen { path: PathBuf, mode: u32 },
    #[error("the job token from {origin} {problem}")]
    BadToken { origin: String, problem: &'static str },
    #[error("cannot draw a random job token: {0}")]
    Random(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Role;

    #[test]
    fn spec_mismatch_names_both_tasks_and_both_hashes() {
        let f = Failure::SpecMismatch {
            task: TaskId::new(Role::Worker, 1),
            spec_hash: "a1b2c3d4e5f60718293a".into(),
            version: "0.1.0".into(),
            chief: TaskId::new(Role::Worker, 0),
            chief_spec_hash: "9f8e".into(),
            chief_version: "0.1.0".into(),
            keys: vec!["optimizer.learning_rate".into(), "train.epochs".into()],
        };
        assert_eq!(
            f.to_string(),
            "worker:1 runs spec a1b2c3d4e5f6… (trainrun 0.1.0) but the chief worker:0 runs spec \
             9f8e (trainrun 0.1.0); they differ in optimizer.learning_rate, train.epochs: start every \
             task with the same spec and trainrun"
        );
    }

    #[test]
    fn timeouts_list_every_missing_task() {
        let f = Failure::RendezvousTimeout {
            after: Duration::from_secs(60),
            missing: vec![TaskId::new(Role::Worker, 2), TaskId::new(Role::Worker, 3)],
        };
        assert_eq!(f.to_string(), "rendezvous timed out after 60 s: worker:2, worker:3 never checked in");
    }
}
