//! Exit codes and the error a command fails with: the contract scripts and schedulers rely on
//! (docs/reliability.md, "Exit codes"). Every lower error maps to exactly one code here.

use crate::cluster::job::JoinError;
use crate::cluster::{Blame, ClusterError, TaskId, launch};
use crate::collective::CollectiveError;
use crate::data::DataError;
use crate::strategy::StrategyError;
use crate::train::TrainError;
use std::process::ExitCode;

/// Documented exit codes (docs/reliability.md, "Exit codes").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    /// Training finished (or the command succeeded).
    Ok = 0,
    /// A runtime failure: an I/O error, a failed step.
    Failure = 1,
    /// The spec or an override is invalid, or the command line is malformed.
    Spec = 2,
    /// The spec is valid but this build or machine cannot run it (e.g. a strategy not built
    /// yet, a GPU device without a GPU build).
    Unsupported = 3,
    /// Dataset files are missing or bad and could not be downloaded.
    Data = 4,
    /// The job failed across processes: a task died, hung, or was refused (wrong spec,
    /// version or token), or the cluster could not start in time.
    Cluster = 5,
    /// Stopped on request (SIGTERM to a task or the launcher): every task stopped after the
    /// same step and the chief saved a backup; running the same command again resumes.
    Preempted = 6,
    /// The disk is full: a checkpoint or the run folder could not be written, and removing the
    /// unfinished save did not free enough space. A restart would fail the same way.
    NoSpace = 7,
    /// A bug in trainrun: it panicked (see [`crate::crash`]).
    Bug = 70,
    /// Stopped by Ctrl-C (SIGINT), as shells report a process interrupted (128 + 2).
    Interrupted = 130,
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> Self {
        ExitCode::from(e as u8)
    }
}

/// Why a command failed; each maps to a documented exit code.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The command line is malformed.
    #[error("error: {0}")]
    Usage(String),
    /// The spec has problems (already rendered with their locations).
    #[error("{0}")]
    Spec(String),
    /// The dataset could not be found, fetched or read.
    #[error("error: {0}")]
    Data(#[from] DataError),
    /// The spec is valid but cannot run here.
    #[error("error: {0}")]
    Unsupported(String),
    /// The job failed across processes (a task died, hung or was refused).
    #[error("error: {0}")]
    Cluster(String),
    /// This task could not join the job: refused, or a peer died or hung during the
    /// rendezvous. Kept typed so that the launcher learns whom it blames.
    #[error("error: {0}")]
    Join(#[from] JoinError),
    /// Training failed.
    #[error("error: {0}")]
    Train(TrainError),
    /// A task of the local cluster failed.
    #[error("error: {0}")]
    Launch(launch::LaunchError),
    /// Anything else at runtime.
    #[error("error: {0}")]
    Failure(String),
    /// Trials of a sweep failed; the sweep exits with the first one's code.
    #[error("error: {message}")]
    TrialFailed {
        /// The first failed trial's exit code.
        code: u8,
        /// Which trials failed.
        message: String,
    },
    /// Stopped on request (SIGTERM) after saving a backup: not an error, a pause.
    #[error("trainrun: {0}")]
    Preempted(String),
    /// Stopped by Ctrl-C (SIGINT), after a backup as on SIGTERM; exit code 130.
    #[error("trainrun: {0}")]
    Interrupted(String),
}

impl RunError {
    /// The task this failure blames, as data for the launcher (see [`launch::blame_line`]).
    pub fn blame(&self) -> Option<Blame> {
        match self {
            RunError::Train(TrainError::Strategy(StrategyError::Cluster(c)))
            | RunError::Join(JoinError::Cluster(c)) => cluster_blame(c),
            RunError::Train(TrainError::Strategy(StrategyError::Collective(c)))
            | RunError::Join(JoinError::Collective(c)) => collective_blame(c),
            _ => None,
        }
    }

    /// The process exit code for this error.
    pub fn exit(&self) -> u8 {
        let code = match self {
            // The launcher passes on the code of the task that failed.
            RunError::Launch(launch::LaunchError::TaskFailed { code, .. }) | RunError::TrialFailed { code, .. } => {
                return *code;
            }
            RunError::Launch(launch::LaunchError::Preempted(_)) | RunError::Preempted(_) => Exit::Preempted,
            RunError::Launch(launch::LaunchError::Interrupted(_)) | RunError::Interrupted(_) => Exit::Interrupted,
            RunError::Launch(_) => Exit::Cluster,
            RunError::Usage(_) | RunError::Spec(_) | RunError::Train(TrainError::Resume(_)) => Exit::Spec,
            RunError::Data(_) | RunError::Train(TrainError::Data(_)) => Exit::Data,
            RunError::Unsupported(_) | RunError::Train(TrainError::Strategy(StrategyError::Unsupported(_))) => {
                Exit::Unsupported
            }
            RunError::Train(TrainError::Checkpoint(crate::checkpoint::CheckpointError::NoSpace { .. })) => {
                Exit::NoSpace
            }
            RunError::Train(TrainError::Record(e)) if crate::checkpoint::is_no_space(&e.source) => Exit::NoSpace,
            RunError::Cluster(_)
            | RunError::Join(_)
            | RunError::Train(TrainError::Strategy(
                StrategyError::Cluster(_)
                | StrategyError::Collective(_)
                | StrategyError::Finished
                | StrategyError::Remote(_),
            )) => Exit::Cluster,
            RunError::Train(_) | RunError::Failure(_) => Exit::Failure,
        };
        code as u8
    }
}

/// Whom a control-plane failure while joining blames: the task the chief found missing,
/// dead or silent, or the chief itself when it never answered. A refusal (wrong spec, token
/// or certificate) blames nobody: every task is up, one is misconfigured.
fn cluster_blame(e: &ClusterError) -> Option<Blame> {
    match e {
        ClusterError::Failed(f) => f.blame(),
        ClusterError::ChiefUnreachable { chief, .. } => Some(Blame::Hung(*chief)),
        _ => None,
    }
}

/// Whom a data-plane failure blames: a peer that stopped answering hangs, one whose
/// connection or process ended died. Peers are named by their task.
fn collective_blame(e: &CollectiveError) -> Option<Blame> {
    let task = |peer: &str| peer.parse::<TaskId>().ok();
    match e {
        CollectiveError::Timeout { peer, .. } | CollectiveError::NotJoined { peer, .. } => task(peer).map(Blame::Hung),
        CollectiveError::PeerExited { peer, .. } | CollectiveError::ConnectionClosed { peer, .. } => {
            task(peer).map(Blame::Died)
        }
        CollectiveError::PeerAborted { .. }
        | CollectiveError::OutOfStep { .. }
        | CollectiveError::Stranger { .. }
        | CollectiveError::Refused { .. }
        | CollectiveError::Io { .. }
        | CollectiveError::Segment { .. }
        | CollectiveError::Invalid(_)
        | CollectiveError::Broken(_) => None,
    }
}

impl From<TrainError> for RunError {
    fn from(e: TrainError) -> Self {
        match e {
            TrainError::Preempted { .. } => RunError::Preempted(e.to_string()),
            e => RunError::Train(e),
        }
    }
}

impl From<crate::builder::BuildFailure> for RunError {
    fn from(e: crate::builder::BuildFailure) -> Self {
        use crate::builder::BuildFailure;
        match e {
            BuildFailure::Model(e) => RunError::Failure(e.to_string()),
            BuildFailure::Strategy(e) => e.into(),
            BuildFailure::Data(e) => RunError::Data(e),
            BuildFailure::Checkpoint(e) => e.into(),
            BuildFailure::Train(e) => e.into(),
        }
    }
}

impl From<crate::checkpoint::CheckpointError> for RunError {
    fn from(e: crate::checkpoint::CheckpointError) -> Self {
        RunError::Train(e.into())
    }
}

impl From<StrategyError> for RunError {
    fn from(e: StrategyError) -> Self {
        match e {
            StrategyError::Unsupported(_) => RunError::Unsupported(e.to_string()),
            StrategyError::Device(_) => RunError::Failure(e.to_string()),
            StrategyError::Input(e) => RunError::Data(*e),
            // Kept typed, as a failed step's is, so that the launcher learns whom it blames.
            StrategyError::Cluster(_)
            | StrategyError::Collective(_)
            | StrategyError::Finished
            | StrategyError::Remote(_) => RunError::Train(TrainError::Strategy(e)),
        }
    }
}
