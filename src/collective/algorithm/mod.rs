//! All-reduce algorithms, one file each, named as [`Algorithm`] names them:
//! - `ring.rs`: the pipelined ring, over any point-to-point transport;
//! - `direct.rs`: every rank sums its share straight from every rank's buffer, over shared
//!   memory only;
//! - `halving_doubling.rs`: Rabenseifner's reduce-scatter by recursive halving and all-gather
//!   by recursive doubling, over any point-to-point transport;
//! - `hierarchical.rs`: `halving_doubling` inside each host, among one leader per host, then
//!   back inside each host.
//!
//! An algorithm over point-to-point transfers implements [`PointToPointAlgorithm`]: which
//! ranks it talks to ([`Wiring`], so connection-based transports connect exactly those) and,
//! for each collective, the exchanges it runs through [`Exchanges`]. It works in the numbering
//! of a [`Group`]: all ranks, or a subgroup (one host's ranks, the hosts' leaders) that
//! [`Exchanges::among`] runs a step on, so a hierarchical algorithm is the flat ones applied
//! to subgroups. [`Scheduled`] is the communicator that runs any of them over any transport.
//!
//! Adding an algorithm: its file here, a variant of [`Algorithm`] with its arms in this
//! file's `impl Algorithm` (name, description, transports it refuses), and its arm in
//! [`Algorithm::point_to_point`].

mod direct;
mod halving_doubling;
mod hierarchical;
mod ring;

pub use direct::{ArenaReducer, ShmCommunicator};
pub use hierarchical::HierarchicalPart;

use super::choice::SizeChoice;
use super::error::{ALL_REDUCE, BARRIER, BROADCAST, CollectiveError, F64, OpDesc};
use super::transport::{Combine, Exchange, HostRoute, PointToPoint, Transfers, TransportKind, Wiring};
use super::{Communicator, Peers};
use std::ops::Range;

/// The all-reduce algorithm between workers, as the plan decided it; the names are what
/// `trainrun check` prints and each algorithm's file is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// Every rank sums its share of the data straight from every rank's buffer, in rank order
    /// (`direct.rs`): shared memory only.
    Direct,
    /// The pipelined ring, reduce-scatter then all-gather (`ring.rs`): any transport.
    Ring,
    /// Reduce-scatter by recursive halving, all-gather by recursive doubling
    /// (`halving_doubling.rs`): any transport.
    HalvingDoubling,
    /// Inside each host, among the hosts' leaders, back inside each host
    /// (`hierarchical.rs`): any transport, shared memory inside hosts where it routes by host.
    Hierarchical,
}

impl Algorithm {
    /// Every algorithm, for tables and tests that cover them all.
    pub const ALL: [Algorithm; 4] =
        [Algorithm::Direct, Algorithm::Ring, Algorithm::HalvingDoubling, Algorithm::Hierarchical];

    /// Its name, which is its file's.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Direct => "direct",
            Algorithm::Ring => "ring",
            Algorithm::HalvingDoubling => "halving_doubling",
            Algorithm::Hierarchical => "hierarchical",
        }
    }

    /// The algorithm with this name.
    pub fn from_name(name: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.name() == name)
    }

    /// What it does, for `trainrun check`.
    pub fn describe(self) -> &'static str {
        match self {
            Algorithm::Direct => {
                "direct: every worker sums its share straight from every worker's buffer, in worker order"
            }
            Algorithm::Ring => "ring: reduce-scatter, then all-gather",
            Algorithm::HalvingDoubling => {
                "halving_doubling: reduce-scatter by recursive halving, then all-gather by recursive doubling"
            }
            Algorithm::Hierarchical => {
                "hierarchical: halving_doubling inside each host, then among one leader per host, then back inside each host"
            }
        }
    }

    /// Why it cannot run over `transport`, or `None` when it can.
    pub fn refuses(self, transport: TransportKind) -> Option<&'static str> {
        match (self, transport) {
            (Algorithm::Direct, TransportKind::Tcp | TransportKind::TcpTls) => {
                Some("it reads every worker's memory, so it needs every worker on one host with shared memory")
            }
            (Algorithm::Direct, TransportKind::SharedMemoryAndTcp | TransportKind::SharedMemoryAndTcpTls) => {
                Some("it reads every worker's memory, so it needs every worker on one host")
            }
            // Over shared memory and TCP the flat algorithms take TCP throughout (`HostRoute`).
            (Algorithm::Direct, TransportKind::SharedMemory) | (Algorithm::Ring | Algorithm::HalvingDoubling, _) => {
                None
            }
            (Algorithm::Hierarchical, _) => None,
        }
    }

    /// The fastest algorithm over `transport` as measured here (`trainrun bench --only
    /// collective`): `implementation = "auto"`.
    pub fn fastest_over(transport: TransportKind) -> Algorithm {
        match transport {
            TransportKind::SharedMemory => Algorithm::Direct,
            TransportKind::Tcp | TransportKind::TcpTls => Algorithm::Ring,
            TransportKind::SharedMemoryAndTcp | TransportKind::SharedMemoryAndTcpTls => Algorithm::Hierarchical,
        }
    }

    /// Whether its sums over `world` ranks are the plain rank-order sums bit for bit (else a
    /// fixed reordering of them, the same bits every run).
    pub fn sums_in_rank_order(self, world: usize) -> bool {
        match self {
            Algorithm::Direct => true,
            // Two ranks: one addition, which commutes.
            Algorithm::Ring | Algorithm::HalvingDoubling | Algorithm::Hierarchical => world <= 2,
        }
    }

    /// The point-to-point algorithm among `peers` (whose hosts `hierarchical` groups by), or
    /// `None` for one that is not (`direct`).
    pub(crate) fn point_to_point(self, peers: &Peers) -> Option<Box<dyn PointToPointAlgorithm>> {
        match self {
            Algorithm::Direct => None,
            Algorithm::Ring => Some(Box::new(ring::Ring)),
            Algorithm::HalvingDoubling => Some(Box::new(halving_doubling::HalvingDoubling)),
            Algorithm::Hierarchical => Some(Box::new(hierarchical::Hierarchical { hosts: peers.hosts().to_vec() })),
        }
    }
}

/// The ranks an algorithm runs among, numbered 0..size: every rank, or a subgroup of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Group {
    /// Global ranks, by group rank.
    members: Vec<usize>,
    /// This rank's place among them.
    me: usize,
}

impl Group {
    /// Every rank of `peers`.
    pub(crate) fn all(peers: &Peers) -> Group {
        Group { members: (0..peers.world()).collect(), me: peers.rank() }
    }

    /// The subgroup of this group's ranks `ranks` (group ranks, in the subgroup's order), or
    /// `None` when this rank is not among them.
    pub(crate) fn subgroup(&self, ranks: &[usize]) -> Option<Group> {
        let members: Option<Vec<usize>> = ranks.iter().map(|&r| self.members.get(r).copied()).collect();
        let me = ranks.iter().position(|&r| r == self.me)?;
        Some(Group { members: members?, me })
    }

    /// This rank, in the group's numbering.
    pub(crate) fn rank(&self) -> usize {
        self.me
    }

    /// Ranks in the group.
    pub(crate) fn size(&self) -> usize {
        self.members.len()
    }

    /// The global rank of group rank `r`.
    pub(crate) fn global(&self, r: usize) -> usize {
        self.members[r.min(self.members.len() - 1)]
    }
}

/// One collective as an algorithm runs it: exchanges over the transport among a group.
pub(crate) struct Exchanges<'a> {
    transport: &'a mut dyn PointToPoint,
    group: &'a Group,
    desc: OpDesc,
    seq: u64,
    /// The running algorithm's link between ranks of one host ([`PointToPointAlgorithm::route`]).
    route: HostRoute,
}

impl Exchanges<'_> {
    /// The ranks this step runs among.
    pub(crate) fn group(&self) -> &Group {
        self.group
    }

    /// Elements of `esize` bytes per segment the transport moves best.
    pub(crate) fn segment_elems(&self, esize: usize) -> usize {
        (self.transport.segment_bytes() / esize).max(1)
    }

    /// Sends to group rank `to` what `schedule` says while receiving from group rank `from`
    /// ([`PointToPoint::exchange`]); `None` on a side that moves nothing.
    pub(crate) fn exchange(
        &mut self,
        to: Option<usize>,
        from: Option<usize>,
        schedule: &Transfers,
        data: &mut [u8],
    ) -> Result<(), CollectiveError> {
        let x = Exchange {
            to: to.map(|r| self.group.global(r)),
            from: from.map(|r| self.group.global(r)),
            schedule,
            route: self.route,
            desc: self.desc,
            seq: self.seq,
        };
        self.transport.exchange(x, data)
    }

    /// The same collective among `group` only (a subgroup made with [`Group::subgroup`]).
    pub(crate) fn among<'b>(&'b mut self, group: &'b Group) -> Exchanges<'b> {
        Exchanges { transport: &mut *self.transport, group, desc: self.desc, seq: self.seq, route: self.route }
    }
}

/// One exchange of a precomputed schedule: send to group rank `to` and receive from group
/// rank `from` what `transfers` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Round {
    pub to: Option<usize>,
    pub from: Option<usize>,
    pub transfers: Transfers,
}

/// Runs `steps` in order.
pub(crate) fn run_steps(x: &mut Exchanges<'_>, steps: &[Round], data: &mut [u8]) -> Result<(), CollectiveError> {
    steps.iter().try_for_each(|s| x.exchange(s.to, s.from, &s.transfers, data))
}

/// Byte ranges of the segments of an element range, `seg` elements of `esize` bytes each.
pub(crate) fn segments(r: Range<usize>, seg: usize, esize: usize) -> impl Iterator<Item = Range<usize>> {
    let seg = seg.max(1);
    (r.start..r.end).step_by(seg).map(move |s| s * esize..(s + seg).min(r.end) * esize)
}

/// An all-reduce algorithm over point-to-point transfers; one file each.
pub(crate) trait PointToPointAlgorithm: Send {
    /// The ranks this rank of `group` sends to and receives from, by global rank, each once.
    fn wiring(&self, group: &Group) -> Wiring;
    /// The link its exchanges between ranks of one host take where there are two (the routed
    /// transport): by host when no exchange mixes the two, else the network throughout.
    fn route(&self) -> HostRoute;
    /// Replaces `data` (elements that `sum` adds) with their element-wise sum over the group,
    /// the same bits on every rank.
    fn all_reduce(&self, x: &mut Exchanges<'_>, data: &mut [u8], sum: Combine) -> Result<(), CollectiveError>;
    /// Copies group rank `root`'s `data` (f32) into every rank's.
    fn broadcast(&self, x: &mut Exchanges<'_>, data: &mut [u8], root: usize) -> Result<(), CollectiveError>;
    /// Returns once every rank of the group has called it.
    fn barrier(&self, x: &mut Exchanges<'_>) -> Result<(), CollectiveError>;
}

/// The algorithms a choice per size runs, each with its steps.
type Candidates = Vec<(Algorithm, Box<dyn PointToPointAlgorithm>)>;

/// The communicator that runs a point-to-point algorithm over a transport.
pub struct Scheduled {
    algorithm: Box<dyn PointToPointAlgorithm>,
    /// `implementation = "auto"` per size: the algorithms each all-reduce chooses among, and
    /// how it chooses. Broadcasts and barriers keep `algorithm`.
    by_size: Option<(SizeChoice, Candidates)>,
    transport: Box<dyn PointToPoint>,
    group: Group,
    /// Collectives run so far; both ends of every exchange check it.
    seq: u64,
    broken: Option<String>,
}

impl Scheduled {
    /// `algorithm` over `transport`, whose connections `algorithm.wiring` listed.
    pub(crate) fn new(algorithm: Box<dyn PointToPointAlgorithm>, transport: Box<dyn PointToPoint>) -> Scheduled {
        let group = Group::all(transport.peers());
        Scheduled { algorithm, by_size: None, transport, group, seq: 0, broken: None }
    }

    /// From now on each all-reduce runs the algorithm `choice` picks for its size, one of its
    /// candidates (whose connections the transport must have: [`Wiring::union`]). Every rank
    /// must set the same choice at the same point.
    pub(crate) fn choose_by_size(&mut self, choice: SizeChoice) {
        let peers = self.transport.peers().clone();
        let steps = choice.candidates.iter().filter_map(|&a| Some((a, a.point_to_point(&peers)?))).collect();
        self.by_size = Some((choice, steps));
    }

    /// The choice per size, once [`Scheduled::choose_by_size`] set one.
    pub fn size_choice(&self) -> Option<&SizeChoice> {
        self.by_size.as_ref().map(|(c, _)| c)
    }

    /// Runs one collective; an error that leaves the peers out of step breaks the
    /// communicator and tells them.
    fn run(
        &mut self,
        kind: u64,
        (len, aux): (u64, u64),
        f: impl FnOnce(&dyn PointToPointAlgorithm, &mut Exchanges<'_>) -> Result<(), CollectiveError>,
    ) -> Result<(), CollectiveError> {
        self.run_with(None, kind, (len, aux), f)
    }

    /// An all-reduce of `bytes`: with the algorithm the choice per size picks, if there is one.
    fn run_all_reduce(
        &mut self,
        bytes: usize,
        kind: u64,
        len: u64,
        f: impl FnOnce(&dyn PointToPointAlgorithm, &mut Exchanges<'_>) -> Result<(), CollectiveError>,
    ) -> Result<(), CollectiveError> {
        let pick = self.by_size.as_ref().map(|(c, _)| c.pick(bytes));
        self.run_with(pick, kind, (len, 0), f)
    }

    /// `part` of `hierarchical` alone among this communicator's hosts (the start-up probe's
    /// timing of one kind of link). Every rank calls it at the same point, leaders or not.
    pub(crate) fn all_reduce_part(&mut self, part: HierarchicalPart, data: &mut [f32]) -> Result<(), CollectiveError> {
        if data.is_empty() {
            return Ok(());
        }
        let steps = hierarchical::Hierarchical { hosts: self.transport.peers().hosts().to_vec() };
        self.run_steps(&steps, ALL_REDUCE, (data.len() as u64, 0), |x| {
            steps.all_reduce_part(x, bytemuck::cast_slice_mut(data), Combine::SumF32, part)
        })
    }

    /// Starts one collective: an error if the communicator is broken, false when there is
    /// nobody to exchange with (one rank), else its sequence number advanced.
    fn begin(&mut self) -> Result<bool, CollectiveError> {
        if let Some(why) = &self.broken {
            return Err(CollectiveError::Broken(why.clone()));
        }
        if self.group.size() == 1 {
            return Ok(false);
        }
        self.seq += 1;
        Ok(true)
    }

    /// Runs one collective with `pick` (one of the choice per size's candidates), or
    /// `algorithm`.
    fn run_with(
        &mut self,
        pick: Option<Algorithm>,
        kind: u64,
        (len, aux): (u64, u64),
        f: impl FnOnce(&dyn PointToPointAlgorithm, &mut Exchanges<'_>) -> Result<(), CollectiveError>,
    ) -> Result<(), CollectiveError> {
        if !self.begin()? {
            return Ok(());
        }
        let desc = OpDesc { kind, len, aux };
        let chosen = self.by_size.as_ref().and_then(|(_, all)| all.iter().find(|(a, _)| Some(*a) == pick));
        let steps = chosen.map_or(&self.algorithm, |(_, s)| s);
        let route = steps.route();
        let mut x = Exchanges { transport: &mut *self.transport, group: &self.group, desc, seq: self.seq, route };
        let r = f(&**steps, &mut x);
        self.keep(r)
    }

    /// Runs one collective with `steps`, which this communicator does not hold.
    fn run_steps(
        &mut self,
        steps: &dyn PointToPointAlgorithm,
        kind: u64,
        (len, aux): (u64, u64),
        f: impl FnOnce(&mut Exchanges<'_>) -> Result<(), CollectiveError>,
    ) -> Result<(), CollectiveError> {
        if !self.begin()? {
            return Ok(());
        }
        let desc = OpDesc { kind, len, aux };
        let route = steps.route();
        let mut x = Exchanges { transport: &mut *self.transport, group: &self.group, desc, seq: self.seq, route };
        let r = f(&mut x);
        self.keep(r)
    }

    /// `r`, after breaking the communicator (and telling the peers) if its error leaves them
    /// out of step.
    fn keep(&mut self, r: Result<(), CollectiveError>) -> Result<(), CollectiveError> {
        if let Err(e) = &r
            && e.breaks()
        {
            self.broken = Some(e.to_string());
            self.transport.abandon();
        }
        r
    }
}

impl Communicator for Scheduled {
    fn rank(&self) -> usize {
        self.transport.peers().rank()
    }

    fn world(&self) -> usize {
        self.transport.peers().world()
    }

    fn all_reduce_sum(&mut self, data: &mut [f32]) -> Result<(), CollectiveError> {
        if data.is_empty() {
            return Ok(());
        }
        self.run_all_reduce(data.len() * 4, ALL_REDUCE, data.len() as u64, |a, x| {
            a.all_reduce(x, bytemuck::cast_slice_mut(data), Combine::SumF32)
        })
    }

    fn all_reduce_sum_f64(&mut self, data: &mut [f64]) -> Result<(), CollectiveError> {
        if data.is_empty() {
            return Ok(());
        }
        self.run_all_reduce(data.len() * 8, F64, data.len() as u64, |a, x| {
            a.all_reduce(x, bytemuck::cast_slice_mut(data), Combine::SumF64)
        })
    }

    fn broadcast(&mut self, data: &mut [f32], root: usize) -> Result<(), CollectiveError> {
        self.transport.peers().check_root(root)?;
        if data.is_empty() {
            return Ok(());
        }
        self.run(BROADCAST, (data.len() as u64, root as u64), |a, x| {
            a.broadcast(x, bytemuck::cast_slice_mut(data), root)
        })
    }

    fn barrier(&mut self) -> Result<(), CollectiveError> {
        self.run(BARRIER, (0, 0), |a, x| a.barrier(x))
    }

    fn transport(&self) -> TransportKind {
        self.transport.kind()
    }

    fn overlaps_backward(&self) -> bool {
        self.transport.overlaps_backward()
    }
}

#[cfg(test)]
mod schedule_tests;
#[cfg(test)]
mod tests;
