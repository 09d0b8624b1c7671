//! Transports: how bytes move from one rank to another. [`PointToPoint`] is what every
//! transport offers the algorithms (`super::algorithm`): one exchange at a time, in which a
//! rank sends byte ranges of its buffer to one rank while it receives ranges from another,
//! each received segment copied or summed into place as it lands and, where the schedule says
//! so, sent on at once. Send-only and receive-only are exchanges with one side empty. One
//! trait call per exchange; the transport moves the segments.
//!
//! One file per transport, each naming itself with a [`TransportKind`]:
//! - `shared_memory.rs`: ranks of one host, through a per-rank outbox in the shared segment;
//! - `tcp.rs`: ranks anywhere, one TCP connection per (sender, receiver) pair that the
//!   algorithm's [`Wiring`] lists (the handshake that refuses strangers is `handshake.rs`,
//!   the nonblocking loop that runs an exchange over two connections `stream.rs`);
//! - `tls.rs`: those connections under mutual TLS (`record.rs` seals the records);
//! - `routed.rs`: ranks on several hosts, each exchange over shared memory when both its
//!   peers share this rank's host, over TCP (or TLS) when neither does, or over TCP
//!   throughout for a flat algorithm ([`HostRoute`]).
//!
//! Every exchange opens with the operation's descriptor and sequence number on each side that
//! moves anything, which the receiver checks, so ranks out of step are caught before any data
//! is mixed.

mod handshake;
mod record;
pub(crate) mod routed;
pub mod shared_memory;
mod stream;
pub mod tcp;
pub mod tls;

use super::Peers;
use super::error::{CollectiveError, OpDesc};
use super::reduce::{add_assign_f32, add_assign_f64};
use std::ops::Range;

/// Which transport carries gradients between workers, as the plan decided it; the names are
/// what `summary.json` and `trainrun check` say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TransportKind {
    /// A shared-memory segment: every worker on one host.
    SharedMemory,
    /// TCP connections: workers anywhere.
    Tcp,
    /// TCP connections under mutual TLS (`cluster.tls`).
    TcpTls,
    /// Shared memory among each host's workers, TCP across hosts (`routed.rs`).
    SharedMemoryAndTcp,
    /// Shared memory among each host's workers, TCP under mutual TLS across hosts.
    SharedMemoryAndTcpTls,
}

impl TransportKind {
    /// The name `summary.json` and `trainrun check` use.
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::SharedMemory => "shared_memory",
            TransportKind::Tcp => "tcp",
            TransportKind::TcpTls => "tcp_tls",
            TransportKind::SharedMemoryAndTcp => "shared_memory_and_tcp",
            TransportKind::SharedMemoryAndTcpTls => "shared_memory_and_tcp_tls",
        }
    }

    /// What it is, for `trainrun check`.
    pub fn describe(self) -> &'static str {
        match self {
            TransportKind::SharedMemory => "shared memory (every worker on this host)",
            TransportKind::Tcp => "TCP",
            TransportKind::TcpTls => "TCP under mutual TLS (cluster.tls)",
            TransportKind::SharedMemoryAndTcp => "shared memory inside each host, TCP across hosts",
            TransportKind::SharedMemoryAndTcpTls => {
                "shared memory inside each host, TCP under mutual TLS across hosts (cluster.tls)"
            }
        }
    }

    /// Whether it routes each exchange by host: shared memory inside, TCP across.
    pub fn routed(self) -> bool {
        match self {
            TransportKind::SharedMemoryAndTcp | TransportKind::SharedMemoryAndTcpTls => true,
            TransportKind::SharedMemory | TransportKind::Tcp | TransportKind::TcpTls => false,
        }
    }
}

/// What happens to a received segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Combine {
    /// Overwrite the destination (all-gather, broadcast).
    Copy,
    /// Add into the destination as f32.
    SumF32,
    /// Add into the destination as f64.
    SumF64,
}

impl Combine {
    /// Bytes per element it sums (4 for a copy, which moves whole f32 segments).
    pub(crate) fn element_bytes(self) -> usize {
        match self {
            Combine::Copy | Combine::SumF32 => 4,
            Combine::SumF64 => 8,
        }
    }
}

/// One segment to receive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RecvItem {
    /// Byte range of the buffer.
    pub range: Range<usize>,
    pub combine: Combine,
    /// Whether to send it on once it is in place.
    pub forward: bool,
}

/// One rank's part of one exchange: the byte ranges it sends first, then every forwarded
/// receipt, and the segments it receives, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Transfers {
    pub sends: Vec<Range<usize>>,
    pub recvs: Vec<RecvItem>,
}

impl Transfers {
    /// The most bytes one summed segment holds (what a transport stages a receipt in).
    pub(crate) fn biggest_sum(&self) -> usize {
        self.recvs.iter().filter(|i| i.combine != Combine::Copy).map(|i| i.range.len()).max().unwrap_or(0)
    }

    /// Everything sent: the sends, then the forwarded receipts.
    pub(crate) fn total_sends(&self) -> usize {
        self.sends.len() + self.recvs.iter().filter(|i| i.forward).count()
    }
}

/// Which link the routed transport (`routed.rs`) gives an exchange between ranks of one host;
/// the other transports have one link and ignore it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HostRoute {
    /// Shared memory when both peers are on this host, the network when neither is: for
    /// algorithms that never mix the two in one exchange (`hierarchical`).
    ByHost,
    /// The network for every exchange, also between ranks of one host: for flat algorithms,
    /// whose exchanges send inside a host while receiving from another (the ring at a host
    /// boundary), so that both ends of every pair agree on the link.
    Network,
}

/// One exchange: this rank sends to `to` (by global rank) what `schedule` says while it
/// receives from `from`. A side that is `None` moves nothing, not even the opening header.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Exchange<'a> {
    pub to: Option<usize>,
    pub from: Option<usize>,
    pub schedule: &'a Transfers,
    /// The link between ranks of one host, where the transport has two.
    pub route: HostRoute,
    /// The collective it belongs to, and its number on this communicator, which both ends
    /// check before mixing data.
    pub desc: OpDesc,
    pub seq: u64,
}

/// The ranks this rank ever sends to and receives from, by global rank, as an algorithm lists
/// them: transports with connections connect exactly these.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Wiring {
    pub sends_to: Vec<usize>,
    pub receives_from: Vec<usize>,
}

impl Wiring {
    /// Every connection of either, each once (an algorithm made of several, or a choice
    /// among several that one transport carries).
    pub(crate) fn union(mut self, other: Wiring) -> Wiring {
        for r in other.sends_to {
            if !self.sends_to.contains(&r) {
                self.sends_to.push(r);
            }
        }
        for r in other.receives_from {
            if !self.receives_from.contains(&r) {
                self.receives_from.push(r);
            }
        }
        self
    }
}

/// Point-to-point transfers between ranks: what every transport offers an algorithm.
pub(crate) trait PointToPoint: Send {
    /// This rank and every rank's task name.
    fn peers(&self) -> &Peers;
    /// Which transport this is.
    fn kind(&self) -> TransportKind;
    /// The segment size it moves best, in bytes (schedules cut their ranges to it).
    fn segment_bytes(&self) -> usize;
    /// Runs one exchange over `data` until every send is out and every receipt applied.
    fn exchange(&mut self, x: Exchange<'_>, data: &mut [u8]) -> Result<(), CollectiveError>;
    /// Gives up after an error that left the peers out of step, telling them now rather than
    /// at their timeout.
    fn abandon(&mut self);
    /// Whether handing gradients over pack by pack while backward continues pays: where the
    /// transfer itself is slow (TCP).
    fn overlaps_backward(&self) -> bool;
}

pub(crate) fn internal(what: &str) -> CollectiveError {
    CollectiveError::Invalid(format!("internal error in the data plane: {what}"))
}

/// Applies a received segment `src` to its place `dst`.
pub(crate) fn combine(dst: &mut [u8], src: &[u8], how: Combine) -> Result<(), CollectiveError> {
    match how {
        Combine::Copy => dst.copy_from_slice(src),
        Combine::SumF32 => add_assign_f32(
            bytemuck::try_cast_slice_mut(dst).map_err(|_| internal("misaligned f32 segment"))?,
            bytemuck::try_cast_slice(src).map_err(|_| internal("misaligned f32 staging"))?,
        ),
        Combine::SumF64 => add_assign_f64(
            bytemuck::try_cast_slice_mut(dst).map_err(|_| internal("misaligned f64 segment"))?,
            bytemuck::try_cast_slice(src).map_err(|_| internal("misaligned f64 staging"))?,
        ),
    }
    Ok(())
}

/// The out-of-step error when `from`'s opening of an exchange differs from this rank's.
pub(crate) fn out_of_step(
    peers: &Peers,
    from: usize,
    (ours, seq): (&OpDesc, u64),
    (theirs, their_seq): (&OpDesc, u64),
) -> CollectiveError {
    CollectiveError::OutOfStep {
        peer: peers.name(from).to_string(),
        ours: format!("collective #{seq} ({})", ours.describe(peers)),
        theirs: format!("collective #{their_seq} ({})", theirs.describe(peers)),
    }
}
