//! The routed transport: ranks on several hosts ([`Peers::hosts`]). The ranks of this rank's
//! host share a shared-memory segment (`shared_memory.rs`, numbered among themselves); the
//! other hosts are reached over TCP (`tcp.rs`, under TLS when configured), connected only
//! where the algorithm's [`Wiring`] crosses hosts.
//!
//! Each exchange goes over one link, which the algorithm's [`HostRoute`] decides:
//! - `ByHost` (`hierarchical`): shared memory when the ranks it sends to and receives from are
//!   on this host, TCP when neither is. An exchange that would send inside the host while
//!   receiving from another is refused rather than split over two loops.
//! - `Network` (the flat algorithms, which `implementation = "auto"` may pick per pack size):
//!   TCP for every exchange, to ranks of this host too, so the ring's exchange at a host
//!   boundary (inside to one side, across to the other) runs as over plain TCP and both ends
//!   of every pair take the same link.
//!
//! TCP connects what crosses hosts in the `ByHost` algorithms' wiring and everything in the
//! `Network` algorithms' wiring.

use super::super::error::CollectiveError;
use super::super::{CollectiveTimeouts, Peers};
use super::shared_memory::{SharedMemory, ShmOptions};
use super::tcp::{TcpOptions, TcpTransport};
use super::{Exchange, HostRoute, PointToPoint, TransportKind, Wiring, internal};

/// Shared memory inside the host, TCP across; see the module docs.
pub(crate) struct Routed {
    /// Every rank, in the job's numbering.
    peers: Peers,
    /// The global ranks on this host, by their rank in the segment.
    local: Vec<usize>,
    /// The host's segment; `None` when this rank is alone on its host.
    shm: Option<SharedMemory>,
    tcp: TcpTransport,
}

impl Routed {
    /// Joins this host's segment and connects over TCP the links of `by_host` that cross
    /// hosts and every link of `network` (the wirings of the algorithms of each route).
    pub(crate) fn connect(
        peers: Peers,
        shm: ShmOptions,
        tcp: TcpOptions,
        (by_host, network): (&Wiring, &Wiring),
        timeouts: CollectiveTimeouts,
    ) -> Result<Routed, CollectiveError> {
        let hosts = peers.hosts();
        let mine = hosts[peers.rank()];
        let local: Vec<usize> = (0..peers.world()).filter(|&r| hosts[r] == mine).collect();
        let shm = match local.iter().position(|&r| r == peers.rank()) {
            Some(me) if local.len() > 1 => {
                let names = local.iter().map(|&r| peers.name(r).to_string()).collect();
                // Point-to-point transfers go through the outboxes, never the arena.
                let opts = ShmOptions { arena_bytes: 0, ..shm };
                Some(SharedMemory::join(Peers::new(me, names)?, &opts, timeouts)?)
            }
            Some(_) | None => None,
        };
        let remote = |rs: &[usize]| rs.iter().copied().filter(|r| !local.contains(r)).collect();
        let across = Wiring { sends_to: remote(&by_host.sends_to), receives_from: remote(&by_host.receives_from) };
        let tcp = TcpTransport::connect(peers.clone(), tcp, &across.union(network.clone()), timeouts)?;
        Ok(Routed { peers, local, shm, tcp })
    }

    /// This host's segment rank of global rank `r`, when it is on this host.
    fn on_host(&self, r: usize) -> Option<usize> {
        self.local.iter().position(|&l| l == r)
    }
}

impl PointToPoint for Routed {
    fn peers(&self) -> &Peers {
        &self.peers
    }

    fn kind(&self) -> TransportKind {
        match self.tcp.kind() {
            TransportKind::TcpTls => TransportKind::SharedMemoryAndTcpTls,
            TransportKind::Tcp
            | TransportKind::SharedMemory
            | TransportKind::SharedMemoryAndTcp
            | TransportKind::SharedMemoryAndTcpTls => TransportKind::SharedMemoryAndTcp,
        }
    }

    fn segment_bytes(&self) -> usize {
        let shm = self.shm.as_ref().map_or(usize::MAX, PointToPoint::segment_bytes);
        self.tcp.segment_bytes().min(shm)
    }

    fn exchange(&mut self, x: Exchange<'_>, data: &mut [u8]) -> Result<(), CollectiveError> {
        match x.route {
            HostRoute::Network => return self.tcp.exchange(x, data),
            HostRoute::ByHost => {}
        }
        let (to, from) = (x.to.map(|r| self.on_host(r)), x.from.map(|r| self.on_host(r)));
        match (to, from) {
            (None | Some(None), None | Some(None)) => self.tcp.exchange(x, data),
            (None | Some(Some(_)), None | Some(Some(_))) => {
                let shm = self.shm.as_mut().ok_or_else(|| internal("an exchange inside a host of one rank"))?;
                shm.exchange(Exchange { to: to.flatten(), from: from.flatten(), ..x }, data)
            }
            (Some(Some(_)), Some(None)) | (Some(None), Some(Some(_))) => Err(internal(
                "an exchange that sends inside this host while receiving from another (or the reverse); the routed transport runs each exchange over one link",
            )),
        }
    }

    fn abandon(&mut self) {
        if let Some(shm) = &mut self.shm {
            shm.abandon();
        }
        self.tcp.abandon();
    }

    fn overlaps_backward(&self) -> bool {
        true
    }
}
