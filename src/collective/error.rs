//! Errors of the collective data plane. Every variant that is about a peer names its task
//! (`worker:1`), so the message alone says which worker to look at.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The collective an error happened in; part of every message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollectiveOp {
    /// Connecting, handshaking, joining the shared-memory segment.
    Setup,
    /// [`super::Communicator::all_reduce_sum`] or a zero-copy arena all-reduce.
    AllReduce,
    /// [`super::Communicator::all_reduce_sum_f64`].
    AllReduceF64,
    /// [`super::Communicator::broadcast`].
    Broadcast,
    /// [`super::Communicator::barrier`].
    Barrier,
}

impl fmt::Display for CollectiveOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CollectiveOp::Setup => "connection setup",
            CollectiveOp::AllReduce => "all-reduce",
            CollectiveOp::AllReduceF64 => "f64 all-reduce",
            CollectiveOp::Broadcast => "broadcast",
            CollectiveOp::Barrier => "barrier",
        })
    }
}

/// What a rank is doing, as peers compare it before mixing data: kind, length, and an extra
/// word (broadcast root, arena offset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OpDesc {
    pub kind: u64,
    pub len: u64,
    pub aux: u64,
}

pub(crate) const ALL_REDUCE: u64 = 1;
pub(crate) const ARENA: u64 = 2;
pub(crate) const F64: u64 = 3;
pub(crate) const BROADCAST: u64 = 4;
pub(crate) const BARRIER: u64 = 5;

impl OpDesc {
    pub(crate) fn op(&self) -> CollectiveOp {
        match self.kind {
            ALL_REDUCE | ARENA => CollectiveOp::AllReduce,
            F64 => CollectiveOp::AllReduceF64,
            BROADCAST => CollectiveOp::Broadcast,
            _ => CollectiveOp::Barrier,
        }
    }

    pub(crate) fn describe(&self, peers: &super::Peers) -> String {
        let (len, aux) = (self.len, self.aux);
        match self.kind {
            ALL_REDUCE => format!("an all-reduce of {len} f32"),
            ARENA => format!("an arena all-reduce of floats {aux}..{}", aux.saturating_add(len)),
            F64 => format!("an f64 all-reduce of {len} values"),
            BROADCAST => {
                let root = usize::try_from(aux).ok().filter(|&r| r < peers.world());
                format!("a broadcast of {len} f32 from {}", root.map_or("an unknown rank", |r| peers.name(r)))
            }
            BARRIER => "a barrier".to_string(),
            k => format!("an unknown collective (code {k})"),
        }
    }
}

/// A duration the way people read it in an error: `30 s`, `1.5 s`, `250 ms`.
#[derive(Debug, Clone, Copy)]
pub struct Secs(pub Duration);

impl fmt::Display for Secs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if d < Duration::from_secs(1) {
            write!(f, "{} ms", d.as_millis())
        } else if d.subsec_millis() == 0 {
            write!(f, "{} s", d.as_secs())
        } else {
            write!(f, "{:.1} s", d.as_secs_f64())
        }
    }
}

/// Why a collective failed. After any error other than [`CollectiveError::Invalid`] the
/// communicator is unusable (its peers are out of step): later calls return
/// [`CollectiveError::Broken`].
#[derive(Debug, thiserror::Error)]
pub enum CollectiveError {
    /// A peer stayed silent for the whole operation timeout.
    #[error("{peer} did not answer the {op} within {}", Secs(*after))]
    Timeout { peer: String, op: CollectiveOp, after: Duration },
    /// A peer's process no longer exists (shared memory checks peers' pids while waiting).
    #[error("{peer} is gone: its process exited (pid {pid})")]
    PeerExited { peer: String, pid: u32 },
    /// A peer closed or reset its connection.
    #[error("connection to {peer} ({addr}) closed during the {op}")]
    ConnectionClosed { peer: String, addr: SocketAddr, op: CollectiveOp },
    /// A peer hit an error of its own and marked the shared segment as abandoned.
    #[error("{peer} gave up the {op} after an error of its own; its log names the cause")]
    PeerAborted { peer: String, op: CollectiveOp },
    /// The ranks disagree about which collective they are in: a trainer bug (different
    /// sizes, a skipped call), caught before any data was mixed.
    #[error("{peer} is out of step: it started {theirs} while this rank started {ours}")]
    OutOfStep { peer: String, ours: String, theirs: String },
    /// A peer never joined before the connect timeout.
    #[error("{peer} did not join within {}: {detail}", Secs(*after))]
    NotJoined { peer: String, after: Duration, detail: String },
    /// Something that is not a trainrun worker answers at a peer's address.
    #[error(
        "{peer}'s address {addr} is answered by {what}, not by a trainrun worker: check that every task has the same cluster addresses"
    )]
    Stranger { peer: String, addr: SocketAddr, what: String },
    /// A peer answered the handshake with a refusal (wrong job token, world, rank).
    #[error("{peer} ({addr}) refused this rank: {reason}")]
    Refused { peer: String, addr: SocketAddr, reason: String },
    /// Any other I/O failure on a peer's connection.
    #[error("talking to {peer} ({addr}) during the {op}: {source}")]
    Io {
        peer: String,
        addr: SocketAddr,
        op: CollectiveOp,
        #[source]
        source: io::Error,
    },
    /// Creating, opening or checking the shared-memory segment failed.
    #[error("shared-memory segment {}: {detail}", path.display())]
    Segment { path: PathBuf, detail: String },
    /// The caller passed something that cannot work (rank out of range, arena range past its
    /// end); nothing was sent, so the communicator stays usable.
    #[error("{0}")]
    Invalid(String),
    /// An earlier error left the peers out of step.
    #[error("the communicator is unusable after an earlier error: {0}")]
    Broken(String),
}

impl CollectiveError {
    /// Whether this error leaves the communicator usable (nothing reached the peers).
    pub(crate) fn breaks(&self) -> bool {
        !matches!(self, CollectiveError::Invalid(_) | CollectiveError::Broken(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secs_reads_like_a_person_writes() {
        assert_eq!(Secs(Duration::from_secs(30)).to_string(), "30 s");
        assert_eq!(Secs(Duration::from_millis(1500)).to_string(), "1.5 s");
        assert_eq!(Secs(Duration::from_millis(250)).to_string(), "250 ms");
    }

    #[test]
    fn messages_name_the_peer() {
        let e = CollectiveError::Timeout {
            peer: "worker:1".into(),
            op: CollectiveOp::AllReduce,
            after: Duration::from_secs(30),
        };
        assert_eq!(e.to_string(), "worker:1 did not answer the all-reduce within 30 s");
        let e = CollectiveError::PeerExited { peer: "worker:1".into(), pid: 1234 };
        assert_eq!(e.to_string(), "worker:1 is gone: its process exited (pid 1234)");
        let e = CollectiveError::ConnectionClosed {
            peer: "worker:1".into(),
            addr: "10.0.0.2:4001".parse().unwrap(),
            op: CollectiveOp::AllReduce,
        };
        assert_eq!(e.to_string(), "connection to worker:1 (10.0.0.2:4001) closed during the all-reduce");
    }
}
