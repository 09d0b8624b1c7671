//! The collective data plane: all-reduce, broadcast and barrier between the worker processes
//! of a job, fast on one host and correct across hosts.
//!
//! [`Communicator`] is the seam the trainer programs against. A communicator is an
//! [`Algorithm`] (`algorithm/`, one file each) over a transport (`transport/`, one file each,
//! named by [`TransportKind`]), and [`Collective::build`] makes it from the pair with one
//! exhaustive `match`:
//! - [`ShmCommunicator`]: the `direct` algorithm over shared memory, every rank summing its
//!   share straight from every rank's buffer; an 11 MB all-reduce between two processes takes
//!   about 1 ms through `all_reduce_sum` and about 0.25 ms zero-copy through the arena on the
//!   2-core development machine.
//! - [`Scheduled`]: a point-to-point algorithm (the `ring`) over a point-to-point transport:
//!   shared memory, TCP, or TCP under mutual TLS; works across hosts.
//!
//! [`BucketReducer`] ([`bucket`]) overlaps gradient reduction with backward. [`mod@bench`]
//! measures everything with real processes; a binary wires it up with
//! `if let Some(code) = collective::bench::peer_main_from_env() { return code; }` first thing
//! in `main` (peers are copies of the binary), and `trainrun bench` prints
//! `bench::table(&bench::run(&BenchOptions::standard(Launcher::current_exe()?))?)`.
//!
//! Every rank must issue the same collectives in the same order with the same sizes (SPMD);
//! a mismatch is detected and reported as [`CollectiveError::OutOfStep`] rather than mixing
//! data. Sums are deterministic: the same inputs give the same bits on every rank and in
//! every run.

mod algorithm;
pub mod bench;
pub mod bucket;
pub mod choice;
pub mod cost;
mod error;
mod group;
mod liveness;
mod overlap;
mod peer;
pub mod probe;
pub mod reduce;
pub(crate) mod segment;
pub(crate) mod stranger;
mod transport;

pub use algorithm::{Algorithm, ArenaReducer, HierarchicalPart, Scheduled, ShmCommunicator};
pub use bucket::{BucketReducer, Packs};
pub use error::{CollectiveError, CollectiveOp};
pub use group::{GroupError, Launcher, PeerGroup, PeerOutcome, PeerSpec};
pub use transport::TransportKind;
pub use transport::shared_memory::ShmOptions;
pub use transport::tcp::TcpOptions;
pub use transport::tls;
pub(crate) use transport::tls::{LinkStream, secure_link};
pub use transport::tls::{PemError, PemFile, RingTls, TlsPeers};

use sha2::{Digest, Sha256};
use std::time::Duration;

/// What every transport offers. Collective calls block until this rank's part is done; each
/// names the peer that failed it in its error.
pub trait Communicator: Send {
    /// This process's rank, `0..world()`.
    fn rank(&self) -> usize;
    /// The number of ranks (`num_replicas_in_sync` across workers).
    fn world(&self) -> usize;
    /// Replaces `data` with the element-wise sum over all ranks, bit-identical on every rank.
    /// Every rank passes the same length.
    fn all_reduce_sum(&mut self, data: &mut [f32]) -> Result<(), CollectiveError>;
    /// Like [`Communicator::all_reduce_sum`], for a few f64 statistics (loss sum, counts).
    fn all_reduce_sum_f64(&mut self, data: &mut [f64]) -> Result<(), CollectiveError>;
    /// Copies `root`'s `data` into every rank's `data` (initial weights).
    fn broadcast(&mut self, data: &mut [f32], root: usize) -> Result<(), CollectiveError>;
    /// Returns once every rank has called it.
    fn barrier(&mut self) -> Result<(), CollectiveError>;
    /// How gradients travel.
    fn transport(&self) -> TransportKind;
    /// The transport's own gradient buffer, when backward can write into it directly and
    /// [`Communicator::all_reduce_arena`] sums it in place (zero-copy shared memory); `None`
    /// when gradients live in the caller's buffer.
    fn arena(&mut self) -> Option<&mut [f32]> {
        None
    }
    /// Sums the first `len` values of [`Communicator::arena`] over all ranks, in place.
    fn all_reduce_arena(&mut self, len: usize) -> Result<(), CollectiveError> {
        Err(CollectiveError::Invalid(format!(
            "the {} transport has no arena to reduce {len} values in",
            self.transport().name()
        )))
    }
    /// Whether backward should hand gradients over pack by pack while it continues
    /// ([`BucketReducer`]): worth it where the transfer itself is slow (TCP).
    fn overlaps_backward(&self) -> bool {
        false
    }
}

/// Something that can all-reduce one contiguous pack of gradients in place; what
/// [`BucketReducer`] drives from its communication thread.
pub trait PackReduce: Send {
    /// Replaces `pack` with the element-wise sum of the same pack over all ranks.
    fn reduce_pack(&mut self, pack: &mut [f32]) -> Result<(), CollectiveError>;
}

impl<C: Communicator + ?Sized> PackReduce for &mut C {
    fn reduce_pack(&mut self, pack: &mut [f32]) -> Result<(), CollectiveError> {
        self.all_reduce_sum(pack)
    }
}

/// This rank and the task names of all ranks, by rank (`["worker:0", "worker:1"]`); errors
/// name peers by these. Each rank also has a host (an index, equal for ranks that share
/// one), which the `hierarchical` algorithm and the routed transport group by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peers {
    rank: usize,
    names: Vec<String>,
    hosts: Vec<usize>,
}

impl Peers {
    /// Checks that `rank` is one of `names` and that names are unique.
    pub fn new(rank: usize, names: Vec<String>) -> Result<Peers, CollectiveError> {
        if rank >= names.len() {
            return Err(CollectiveError::Invalid(format!(
                "rank {rank} is out of range for {} task names {names:?}",
                names.len()
            )));
        }
        for (i, n) in names.iter().enumerate() {
            if names[..i].contains(n) {
                return Err(CollectiveError::Invalid(format!("task name {n:?} appears twice in {names:?}")));
            }
        }
        Ok(Peers { rank, hosts: vec![0; names.len()], names })
    }

    /// The same ranks on `hosts` (one index per rank, equal for ranks that share a host);
    /// without it every rank is on one host.
    pub fn on_hosts(self, hosts: Vec<usize>) -> Result<Peers, CollectiveError> {
        if hosts.len() != self.names.len() {
            return Err(CollectiveError::Invalid(format!(
                "{} hosts given for {} ranks: every rank needs one",
                hosts.len(),
                self.names.len()
            )));
        }
        Ok(Peers { hosts, ..self })
    }

    /// The host of each rank, by rank.
    pub fn hosts(&self) -> &[usize] {
        &self.hosts
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.names.len()
    }

    /// The task name of `rank` (clamped to the last rank; callers pass ranks below world).
    pub fn name(&self, rank: usize) -> &str {
        &self.names[rank.min(self.names.len() - 1)]
    }

    /// This process's task name.
    pub fn me(&self) -> &str {
        self.name(self.rank)
    }

    fn check_root(&self, root: usize) -> Result<(), CollectiveError> {
        if root < self.world() {
            Ok(())
        } else {
            Err(CollectiveError::Invalid(format!("broadcast root {root} is out of range for {} ranks", self.world())))
        }
    }
}

/// How long to wait for peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollectiveTimeouts {
    /// For every rank to show up at construction.
    pub connect: Duration,
    /// For a peer to make progress inside one collective.
    pub op: Duration,
}

impl Default for CollectiveTimeouts {
    /// 60 s to connect, 30 s per collective.
    fn default() -> CollectiveTimeouts {
        CollectiveTimeouts { connect: Duration::from_secs(60), op: Duration::from_secs(30) }
    }
}

/// The job token's hash that handshakes and segment headers carry, so ranks of different
/// jobs never talk to each other. Every rank of a job hashes the same token.
pub fn job_token_hash(token: &str) -> u64 {
    let d = Sha256::digest(token.as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    u64::from_le_bytes(b)
}

/// Which transport to connect, with its settings.
#[derive(Debug)]
pub enum Transport {
    /// All ranks on this host.
    SharedMemory(ShmOptions),
    /// Ranks anywhere, over TCP (under mutual TLS when [`TcpOptions::tls`] is set). The name is
    /// the one [`Collective::connect`] runs over it, the ring.
    TcpRing(TcpOptions),
    /// Ranks on several hosts ([`Peers::hosts`]): shared memory among each host's ranks (a
    /// segment per host: `shm.path` must differ between hosts), TCP across hosts.
    Routed { shm: ShmOptions, tcp: TcpOptions },
}

/// A connected communicator: an algorithm over a transport.
pub enum Collective {
    /// The `direct` algorithm over shared memory ([`ShmCommunicator`]), with its zero-copy
    /// arena.
    SharedMemory(ShmCommunicator),
    /// A point-to-point algorithm over any transport ([`Scheduled`]).
    Scheduled(Scheduled),
}

impl Collective {
    /// Connects `algorithm` over `transport`: the one place that pairs them. A pair that cannot
    /// run is an error (the plan refuses it before anything starts).
    pub fn build(
        peers: Peers,
        algorithm: Algorithm,
        transport: Transport,
        timeouts: CollectiveTimeouts,
    ) -> Result<Collective, CollectiveError> {
        Collective::build_among(peers, algorithm, &[], transport, timeouts)
    }

    /// Like [`Collective::build`], connected also for every algorithm of `also`, which
    /// [`Collective::choose_by_size`] may switch to.
    pub fn build_among(
        peers: Peers,
        algorithm: Algorithm,
        also: &[Algorithm],
        transport: Transport,
        timeouts: CollectiveTimeouts,
    ) -> Result<Collective, CollectiveError> {
        let refused = |kind: TransportKind| {
            let why = algorithm.refuses(kind).unwrap_or("the pair is not built");
            Err(CollectiveError::Invalid(format!(
                "the {} algorithm cannot run over {}: {why}",
                algorithm.name(),
                kind.name()
            )))
        };
        let also_steps: Vec<_> = also.iter().filter_map(|a| a.point_to_point(&peers)).collect();
        let Some(steps) = algorithm.point_to_point(&peers) else {
            return match transport {
                Transport::SharedMemory(opts) => {
                    ShmCommunicator::join(peers, &opts, timeouts).map(Collective::SharedMemory)
                }
                Transport::TcpRing(_) => refused(TransportKind::Tcp),
                Transport::Routed { .. } => refused(TransportKind::SharedMemoryAndTcp),
            };
        };
        let group = algorithm::Group::all(&peers);
        let all: Vec<_> = std::iter::once(steps.as_ref()).chain(also_steps.iter().map(AsRef::as_ref)).collect();
        // The routed transport connects each algorithm's links for the route it takes.
        let wiring_of = |route: Option<transport::HostRoute>| {
            all.iter()
                .filter(|a| route.is_none_or(|r| a.route() == r))
                .fold(transport::Wiring::default(), |w, a| w.union(a.wiring(&group)))
        };
        let wiring = wiring_of(None);
        let link: Box<dyn transport::PointToPoint> = match transport {
            // Point-to-point transfers go through the outboxes, never the arena.
            Transport::SharedMemory(opts) => Box::new(transport::shared_memory::SharedMemory::join(
                peers,
                &ShmOptions { arena_bytes: 0, ..opts },
                timeouts,
            )?),
            Transport::TcpRing(opts) => {
                Box::new(transport::tcp::TcpTransport::connect(peers, opts, &wiring, timeouts)?)
            }
            Transport::Routed { shm, tcp } => {
                let by_host = wiring_of(Some(transport::HostRoute::ByHost));
                let network = wiring_of(Some(transport::HostRoute::Network));
                Box::new(transport::routed::Routed::connect(peers, shm, tcp, (&by_host, &network), timeouts)?)
            }
        };
        Ok(Collective::Scheduled(Scheduled::new(steps, link)))
    }

    /// Connects the algorithm each transport runs by default: `direct` over shared memory, the
    /// ring over TCP, `hierarchical` over shared memory and TCP.
    pub fn connect(
        peers: Peers,
        transport: Transport,
        timeouts: CollectiveTimeouts,
    ) -> Result<Collective, CollectiveError> {
        let algorithm = match &transport {
            Transport::SharedMemory(_) => Algorithm::Direct,
            Transport::TcpRing(_) => Algorithm::Ring,
            Transport::Routed { .. } => Algorithm::Hierarchical,
        };
        Collective::build(peers, algorithm, transport, timeouts)
    }

    /// From now on each all-reduce takes the algorithm `choice` picks for its size, one of the
    /// algorithms it was connected for ([`Collective::build_among`]). `direct` has no
    /// per-size choice: it is the only algorithm of its communicator.
    pub fn choose_by_size(&mut self, choice: choice::SizeChoice) -> Result<(), CollectiveError> {
        match self {
            Collective::SharedMemory(_) => Err(CollectiveError::Invalid(
                "the direct algorithm over shared memory has no other algorithm to choose per size".into(),
            )),
            Collective::Scheduled(c) => {
                c.choose_by_size(choice);
                Ok(())
            }
        }
    }

    /// `part` of `hierarchical` alone (the start-up probe's timing of one kind of link);
    /// `direct` has no parts.
    pub fn all_reduce_part(&mut self, part: HierarchicalPart, data: &mut [f32]) -> Result<(), CollectiveError> {
        match self {
            Collective::SharedMemory(_) => Err(CollectiveError::Invalid(
                "the direct algorithm over shared memory has no hierarchical part to time".into(),
            )),
            Collective::Scheduled(c) => c.all_reduce_part(part, data),
        }
    }

    /// The communicator as a trait object: the one place that dispatches.
    pub fn as_dyn(&mut self) -> &mut dyn Communicator {
        match self {
            Collective::SharedMemory(c) => c,
            Collective::Scheduled(c) => c,
        }
    }

    fn as_dyn_ref(&self) -> &dyn Communicator {
        match self {
            Collective::SharedMemory(c) => c,
            Collective::Scheduled(c) => c,
        }
    }
}

impl Communicator for Collective {
    fn rank(&self) -> usize {
        self.as_dyn_ref().rank()
    }

    fn world(&self) -> usize {
        self.as_dyn_ref().world()
    }

    fn all_reduce_sum(&mut self, data: &mut [f32]) -> Result<(), CollectiveError> {
        self.as_dyn().all_reduce_sum(data)
    }

    fn all_reduce_sum_f64(&mut self, data: &mut [f64]) -> Result<(), CollectiveError> {
        self.as_dyn().all_reduce_sum_f64(data)
    }

    fn broadcast(&mut self, data: &mut [f32], root: usize) -> Result<(), CollectiveError> {
        self.as_dyn().broadcast(data, root)
    }

    fn barrier(&mut self) -> Result<(), CollectiveError> {
        self.as_dyn().barrier()
    }

    fn transport(&self) -> TransportKind {
        self.as_dyn_ref().transport()
    }

    fn arena(&mut self) -> Option<&mut [f32]> {
        self.as_dyn().arena()
    }

    fn all_reduce_arena(&mut self, len: usize) -> Result<(), CollectiveError> {
        self.as_dyn().all_reduce_arena(len)
    }

    fn overlaps_backward(&self) -> bool {
        self.as_dyn_ref().overlaps_backward()
    }
}
